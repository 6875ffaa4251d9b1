"""The naming bridge (enricher.bridge, --bridge.naming): a rewritten upstream body served in one
naming of the field table, values converted exactly, HELP and TYPE right, no series twice,
everything else untouched. Prometheus's own parser (promtool) and prometheus_client's judge
every output.

Names come from the table (``T.name(field, naming)``), so that its corrections move these
tests with it; the values are written here by hand, as each release writes them.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from enricher import demo
from enricher.bridge import Bridge, convert_value, naming_of_setting
from enricher.fieldtable import parse_table, table
from enricher.labels import RewritePlan
from enricher.rewrite import Rewriter
from enricher.textformat import valid_float

from .frozendemo import T0
from .harness import MakeStack
from .promcheck import check_metrics_batch

T = table()
DRIVER_48, DRIVER_49 = T.label_names("driver_version")[:2]
GPU0 = 'gpu="0",UUID="GPU-0a0a0a0a-0000-4000-8000-000000000000",device="nvidia0"'
GPU1 = 'gpu="1",UUID="GPU-1b1b1b1b-1111-4111-8111-111111111111",device="nvidia1"'


def rewritten(body: str) -> str:
    """``body`` as the bridge gets it: through the rewrite (no pods known)."""
    return Rewriter(templates=False).rewrite(body, RewritePlan()).text


def bridged(body: str, naming: str, fields: Any = None) -> str:
    return Bridge(naming, fields).apply(rewritten(body))


def family(name: str, typ: str, *lines: str, help_text: str = "as the exporter writes it") -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n" + "".join(f"{x}\n" for x in lines)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``text`` as prometheus_client reads it (guards and empty labels left
    out, as Prometheus drops them)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # prometheus_client reads a counter's samples as NAME_total; the names here are
            # upper case, so the family's name is the one written.
            name = fam.name if s.name == fam.name + "_total" else s.name
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if v))
            assert (name, labels) not in out, f"series served twice: {name}{labels}"
            out[(name, labels)] = float(s.value)
    return out


def only(text: str, name: str) -> list[float]:
    return [v for (n, _), v in samples(text).items() if n == name]


# ------------------------------------------------------------------------- values, by unit

# (field, the value as the source naming writes it, as the target naming writes it)
NEW_TO_48 = [
    pytest.param("fb_used", "42949672960", 40960, id="bytes-to-MiB"),
    pytest.param("fb_free", "1048575", 1048575 / 1048576, id="bytes-to-MiB-fraction"),
    pytest.param("gpu_util", "0.97", 97, id="ratio-to-percent"),
    pytest.param("gpu_util", "0.970000", 97, id="ratio-to-percent-go-%f"),
    pytest.param("mem_copy_util", "0.07", 7, id="ratio-to-percent-not-7.000000000000001"),
    pytest.param("enc_util", "0.333333", 33.3333, id="ratio-to-percent-fraction"),
    pytest.param("energy", "123456.789", 123456789, id="J-to-mJ"),
    pytest.param("energy", "4547404604142", 4547404604142000, id="J-to-mJ-big"),
    pytest.param("sm_clock", "1410000000", 1410, id="Hz-to-MHz"),
    pytest.param("mem_clock", "1215500000", 1215.5, id="Hz-to-MHz-fraction"),
    pytest.param("nvlink_bandwidth", "2500000", 2.5, id="bytes/s-to-MB/s"),
    pytest.param("power", "250.5", 250.5, id="W-rename-only"),
    pytest.param("gpu_temp", "45", 45, id="celsius-rename-only"),
    pytest.param("xid", "79", 79, id="code-rename-only"),
    pytest.param("pcie_tx_rate", "123456789", 123456789, id="bytes/s-rename-only"),
]
OLD_TO_49 = [
    pytest.param("fb_used", "40960", 42949672960, id="MiB-to-bytes"),
    pytest.param("fb_reserved", "0.5", 524288, id="MiB-to-bytes-fraction"),
    pytest.param("gpu_util", "97", 0.97, id="percent-to-ratio"),
    pytest.param("dec_util", "7", 0.07, id="percent-to-ratio-small"),
    pytest.param("energy", "123456789", 123456.789, id="mJ-to-J"),
    pytest.param("energy", "4547404604142", 4547404604.142, id="mJ-to-J-big"),
    pytest.param("sm_clock", "1410", 1410000000, id="MHz-to-Hz"),
    pytest.param("nvlink_bandwidth", "2.5", 2500000, id="MB/s-to-bytes/s"),
    pytest.param("power", "250.5", 250.5, id="W-rename-only"),
    pytest.param("correctable_remapped_rows", "3", 3, id="count-rename-only"),
]


def one_sample(field: str, naming: str, value: str) -> str:
    name = T.name(field, naming)
    assert name is not None
    return family(name, T.field(field).type, f"{name}{{{GPU0}}} {value}")


@pytest.mark.parametrize(("field", "written", "expected"), NEW_TO_48)
def test_a_410_body_served_in_48_names_and_units(field: str, written: str, expected: float) -> None:
    out = bridged(one_sample(field, "4.10", written), "4.8")
    assert only(out, T.name(field, "4.8") or "") == [expected]
    assert {name for name, _ in samples(out)} == {T.name(field, "4.8")}


@pytest.mark.parametrize(("field", "written", "expected"), OLD_TO_49)
def test_a_48_body_served_in_49_names_and_units(field: str, written: str, expected: float) -> None:
    out = bridged(one_sample(field, "4.8", written), "4.9")
    assert only(out, T.name(field, "4.9") or "") == [expected]


@pytest.mark.parametrize("source", T.namings)
@pytest.mark.parametrize("target", T.namings)
def test_every_field_between_every_two_namings(source: str, target: str) -> None:
    """Each field the source naming has comes out under the target's name (or its own where the
    target has none), in the target's unit, and back again to the same value."""
    fields = [f for f in T.fields if T.name(f, source) is not None]
    body = "".join(one_sample(f, source, "2") for f in fields)
    out = bridged(body, target)
    back = bridged(out, source)
    got = {n: v for (n, _), v in samples(out).items()}
    for f in fields:
        src, tgt = T.field(f).by_naming[source], T.field(f).by_naming.get(target)
        if tgt is None:
            assert got[src.name] == 2
            continue
        assert got[tgt.name] == pytest.approx(2 * src.scale / tgt.scale, rel=1e-15), f
    assert samples(back) == samples(rewritten(body))


@pytest.mark.parametrize(
    ("token", "num", "den", "expected"),
    [
        pytest.param("40960", 1048576, 1, "42949672960", id="int-times"),
        pytest.param("97", 1, 100, "0.97", id="int-over-shortest"),
        pytest.param("100", 1, 100, "1", id="int-over-exact"),
        pytest.param("-3", 1000, 1, "-3000", id="negative"),
        pytest.param("+5", 1000, 1, "5000", id="plus-sign"),
        pytest.param("0.07", 100, 1, "7", id="float-times-exact"),
        pytest.param("1.5e3", 1, 1000, "1.5", id="exponent"),
        pytest.param("-0.0", 100, 1, "0", id="minus-zero"),
        pytest.param("NaN", 100, 1, "NaN", id="nan"),
        pytest.param("nan", 1, 100, "NaN", id="nan-lower"),
        pytest.param("+Inf", 1, 100, "+Inf", id="inf"),
        pytest.param("-inf", 100, 1, "-Inf", id="minus-inf"),
        pytest.param("Infinity", 100, 1, "+Inf", id="infinity"),
        pytest.param("1e308", 1048576, 1, "+Inf", id="beyond-float64"),
        pytest.param("9" * 30, 1, 1, "1e+30", id="beyond-int64-as-float"),
        pytest.param("12345678901234567", 1, 1000, "12345678901234.566", id="long-int"),
    ],
)
def test_convert_value(token: str, num: int, den: int, expected: str) -> None:
    assert convert_value(token, num, den) == expected


def special_values() -> str:
    name = T.name("fb_used", "4.10")
    return family(
        name or "",
        "gauge",
        f"{name}{{{GPU0}}} 1048576 1700000000000",
        f"{name}{{{GPU1}}} NaN 1700000000001",
        f'{name}{{gpu="2"}} +Inf',
        f'{name}{{gpu="3"}} -Inf 5',
    )


FACTORS = sorted(
    {
        (float(Fraction(repr(a.scale)) / Fraction(repr(b.scale))), a.scale, b.scale)
        for field in T.fields.values()
        for a in field.by_naming.values()
        for b in field.by_naming.values()
    }
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.integers(-(10**20), 10**20).map(str),
        st.decimals(allow_nan=False, allow_infinity=False, places=6).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
    ),
    st.sampled_from(FACTORS),
)
def test_a_converted_value_reads_as_the_nearest_float_of_the_exact_product(
    token: str, factor: tuple[float, float, float]
) -> None:
    """Whatever decimal the exporter writes, Prometheus reads the float64 nearest the exact
    product (Fraction's), never one off by a rounding of the way there."""
    exact = Fraction(repr(factor[1])) / Fraction(repr(factor[2]))
    if not valid_float(token):
        return
    out = convert_value(token, exact.numerator, exact.denominator)
    assert valid_float(out), out
    want = Fraction(token) * exact
    try:
        nearest = float(want)
    except OverflowError:
        nearest = math.inf if want > 0 else -math.inf
    assert float(out) == nearest, (token, factor, out)


def test_values_keep_their_timestamps_nan_and_infinities() -> None:
    out = bridged(special_values(), "4.8")
    lines = [x for x in out.splitlines() if not x.startswith("#")]
    assert [x.rsplit("} ", 1)[1] for x in lines] == [
        "1 1700000000000",
        "NaN 1700000000001",
        "+Inf",
        "-Inf 5",
    ]


def test_a_series_without_labels() -> None:
    """Without a node name the rewrite writes a series that had no labels as it came."""
    name = T.name("gpu_util", "4.10")
    out = Bridge("4.8").apply(f'# TYPE {name} gauge\n{name} 0.5 17\n{name}{{a="b"}} 1\n')
    assert out.splitlines()[-2:] == [
        f"{T.name('gpu_util', '4.8')} 50 17",
        f'{T.name("gpu_util", "4.8")}{{a="b"}} 100',
    ]


# ------------------------------------------------------------------------- HELP and TYPE


def help_of(field: str, naming: str) -> str:
    """The HELP text the bridge writes: the table's for that name, else its meaning and unit."""
    fn = T.field(field).by_naming[naming]
    return fn.help or f"{T.field(field).meaning} (in {fn.unit})."


def test_help_and_type_come_from_the_table() -> None:
    out = bridged(one_sample("fb_used", "4.10", "1") + one_sample("energy", "4.10", "1"), "4.8")
    assert f"# HELP {T.name('fb_used', '4.8')} {help_of('fb_used', '4.8')}\n" in out
    assert f"# TYPE {T.name('fb_used', '4.8')} gauge\n" in out
    assert f"# HELP {T.name('energy', '4.8')} {help_of('energy', '4.8')}\n" in out
    assert f"# TYPE {T.name('energy', '4.8')} counter\n" in out
    assert "as the exporter writes it" not in out
    # Without a text in the table: the field's meaning and the name's unit.
    bare = parse_table(json.dumps(_without_help()))
    out = Bridge("4.8", bare).apply(rewritten(one_sample("fb_used", "4.10", "1")))
    assert f"# HELP {T.name('fb_used', '4.8')} {T.field('fb_used').meaning} (in MiB).\n" in out


def _without_help() -> dict[str, Any]:
    from importlib import resources

    raw = json.loads(resources.files("enricher").joinpath("dcgm_fields.json").read_text())
    for row in raw["fields"]:
        for entry in row["names"].values():
            entry.pop("help", None)
    return dict(raw)


def test_a_help_text_in_the_table_wins() -> None:
    data = {
        "prefix": "X_",
        "namings": [{"naming": "a", "first": "1.0.0"}, {"naming": "b", "first": "2.0.0"}],
        "units": {"MiB": ["bytes", 1048576], "bytes": ["bytes", 1]},
        "labels": [{"label": "driver_version", "names": [{"since": "1.0.0", "name": "drv"}]}],
        "fields": [
            {
                "field": "mem",
                "type": "gauge",
                "meaning": "Memory",
                "names": {
                    "a": {"name": "X_MEM", "unit": "MiB", "help": 'Memory "used" \\ now'},
                    "b": {"name": "X_MEM_BYTES", "unit": "bytes"},
                },
            }
        ],
    }
    fields = parse_table(json.dumps(data))
    out = Bridge("a", fields).apply('X_MEM_BYTES{gpu="0"} 2097152\n')
    assert out == '# HELP X_MEM Memory "used" \\\\ now\n# TYPE X_MEM gauge\nX_MEM{gpu="0"} 2\n'
    assert Bridge("b", fields).apply(out).startswith("# HELP X_MEM_BYTES Memory (in bytes).\n")


def test_a_family_without_samples_keeps_its_header_under_the_new_name() -> None:
    name, new = T.name("fb_used", "4.10"), T.name("fb_used", "4.8")
    out = Bridge("4.8").apply(f"# HELP {name} x\n# TYPE {name} gauge\nother 1\n")
    assert out.splitlines() == [
        f"# HELP {new} {help_of('fb_used', '4.8')}",
        f"# TYPE {new} gauge",
        "other 1",
    ]


# ------------------------------------------------------------------------- one series once


@pytest.mark.parametrize(
    ("target", "kept", "value"),
    [
        pytest.param("4.8", "4.8", 40960, id="to-4.8-keeps-the-4.8-family"),
        pytest.param("4.10", "4.10", 42949672960, id="to-4.10-keeps-the-4.10-family"),
    ],
)
def test_a_field_under_both_names_is_served_once(target: str, kept: str, value: int) -> None:
    """A custom collector CSV with both names: one family of the field comes out, the one
    already in the target naming."""
    new, old = one_sample("fb_used", "4.10", "42949672960"), one_sample("fb_used", "4.8", "40960")
    for body in (new + old, old + new):
        out = bridged(body, target)
        names = [n for (n, _) in samples(out)]
        assert names == [T.name("fb_used", kept)]
        assert only(out, T.name("fb_used", kept) or "") == [value]
        assert out.count("# TYPE ") == 1


def test_with_neither_name_in_the_target_the_first_is_served() -> None:
    data = {
        "prefix": "X_",
        "namings": [
            {"naming": "a", "first": "1.0.0"},
            {"naming": "b", "first": "2.0.0"},
            {"naming": "c", "first": "3.0.0"},
        ],
        "units": {"n": ["n", 1]},
        "labels": [{"label": "driver_version", "names": [{"since": "1.0.0", "name": "drv"}]}],
        "fields": [
            {
                "field": "f",
                "type": "gauge",
                "meaning": "F",
                "names": {k: {"name": f"X_{k.upper()}", "unit": "n"} for k in "abc"},
            }
        ],
    }
    fields = parse_table(json.dumps(data))
    out = Bridge("a", fields).apply("X_C 3\nX_B 2\n")
    assert [x for x in out.splitlines() if not x.startswith("#")] == ["X_A 3"]


def test_the_driver_label_takes_the_target_name() -> None:
    name = T.name("gpu_temp", "4.8")
    body = family(
        name or "",
        "gauge",
        f'{name}{{{GPU0},{DRIVER_48}="550.90.07",Hostname="h"}} 40',
        f'{name}{{{GPU1},{DRIVER_48}="550.90.07",Hostname="h"}} 41',
    )
    out = bridged(body, "4.10")
    assert f'{DRIVER_49}="550.90.07"' in out and f"{DRIVER_48}=" not in out
    back = bridged(out, "4.8")
    assert samples(back) == samples(rewritten(body))


BOTH_DRIVER_LABELS = (
    f'other{{gpu="0",{DRIVER_48}="1",{DRIVER_49}="2"}} 1\n'
    f'other{{gpu="0",{DRIVER_49}="2"}} 2\n'
    f'other{{gpu="1",{DRIVER_48}="1"}} 3\n'
)


def test_a_series_with_both_driver_labels_keeps_the_targets_and_is_served_once() -> None:
    out = bridged(BOTH_DRIVER_LABELS, "4.9")
    got = samples(out)
    assert got == {
        ("other", tuple(sorted({"gpu": "0", DRIVER_49: "2"}.items()))): 1.0,
        ("other", tuple(sorted({"gpu": "1", DRIVER_49: "1"}.items()))): 3.0,
    }


# ------------------------------------------------------------------------- untouched


def unknown_families() -> str:
    return (
        family("DCGM_FI_DEV_PSTATE", "gauge", f"DCGM_FI_DEV_PSTATE{{{GPU0}}} 0")
        + family(
            "gpu_container_memory_used_bytes", "gauge", 'gpu_container_memory_used_bytes{pod="p"} 5'
        )
        + family(
            "req_seconds",
            "histogram",
            'req_seconds_bucket{le="1"} 1',
            'req_seconds_bucket{le="+Inf"} 2',
            "req_seconds_sum 3",
            "req_seconds_count 2",
        )
        + 'no_help_family{a="b"} 7\n'
    )


def test_what_the_table_does_not_know_passes_through_byte_for_byte() -> None:
    text = rewritten(unknown_families())
    assert Bridge("4.8").apply(text) == text
    assert Bridge("4.10").apply(text) == text


def test_a_body_already_in_the_target_naming_is_the_same_text() -> None:
    text = rewritten(one_sample("fb_used", "4.8", "40960") + one_sample("gpu_util", "4.8", "97"))
    assert Bridge("4.8").apply(text) == text


def test_only_the_moved_families_change_and_in_place() -> None:
    fb = one_sample("fb_used", "4.10", "2097152")
    body = family("a_first", "gauge", "a_first 1") + fb + family("z_last", "counter", "z_last 2")
    out = bridged(body, "4.8")
    assert out.startswith(rewritten(family("a_first", "gauge", "a_first 1")))
    assert out.endswith(rewritten(family("z_last", "counter", "z_last 2")))
    assert only(out, T.name("fb_used", "4.8") or "") == [2]


ESCAPED = [
    pytest.param('a\\"b', id="escaped-quote"),
    pytest.param("a\\\\", id="trailing-backslash"),
    pytest.param("line\\nbreak", id="escaped-newline"),
    pytest.param("x} 5", id="brace-space-digit"),
    pytest.param(f"a,{DRIVER_49}=", id="ends-like-a-driver-label"),
    pytest.param(f"{{{DRIVER_49}=", id="brace-and-driver-label"),
    pytest.param(f'\\",{DRIVER_49}=\\"x', id="quoted-driver-label"),
]


def escaped_values(value: str) -> str:
    name = T.name("gpu_util", "4.10")
    return family(
        name or "",
        "gauge",
        f'{name}{{gpu="0",note="{value}",{DRIVER_49}="550"}} 0.5',
        f'{name}{{gpu="1",{DRIVER_49}="550",note="{value}"}} 0.25',
    )


@pytest.mark.parametrize("value", ESCAPED)
def test_escaped_label_values_are_untouched(value: str) -> None:
    body = escaped_values(value)
    note = next(s.labels["note"] for f in text_string_to_metric_families(body) for s in f.samples)
    got = samples(bridged(body, "4.8"))
    assert sorted(got.values()) == [25.0, 50.0]
    for name, labels in got:
        assert name == T.name("gpu_util", "4.8")
        assert dict(labels)["note"] == note
        assert dict(labels)[DRIVER_48] == "550"
        assert DRIVER_49 not in dict(labels)


def test_off_and_every_naming_of_the_setting() -> None:
    assert naming_of_setting("off") is None
    assert naming_of_setting("4.8") == "4.8"
    assert naming_of_setting("4.10") == "4.10"
    assert naming_of_setting("4.8.4") == "4.8"
    assert naming_of_setting("4.6.1-4.8.4") == "4.8"
    assert naming_of_setting("4.10.0") == "4.10"
    for bad in ("4.7", "latest", "4", "v4.8"):
        with pytest.raises(ValueError, match="not a naming"):
            naming_of_setting(bad)


def test_the_cli_validates_the_setting(
    parser: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from enricher.cli import parse_config

    assert parse_config([])[1].bridge_naming is None
    assert parse_config(["--bridge.naming=4.8"])[1].bridge_naming == "4.8"
    monkeypatch.setenv("ENRICHER_BRIDGE_NAMING", "4.10.0")
    assert parse_config([])[1].bridge_naming == "4.10"
    monkeypatch.setenv("ENRICHER_BRIDGE_NAMING", "4.7")
    with pytest.raises(SystemExit):
        parse_config([])
    assert "--bridge.naming: '4.7' is not a naming: off, 4.8, 4.9, 4.10" in capsys.readouterr().err


# ------------------------------------------------------------------------- the oracle


def corpus() -> list[str]:
    """What the tests above serve, every body in every naming."""
    bodies = [
        one_sample(field, naming, written)
        for params, naming in ((NEW_TO_48, "4.10"), (OLD_TO_49, "4.8"))
        for field, written, _ in (p.values for p in params)
    ]
    bodies += [escaped_values(str(p.values[0])) for p in ESCAPED]
    bodies += [special_values(), unknown_families(), BOTH_DRIVER_LABELS]
    bodies += [one_sample("fb_used", "4.10", "42949672960") + one_sample("fb_used", "4.8", "40960")]
    bodies += [
        "".join(one_sample(f, naming, "2") for f in T.fields if T.name(f, naming) is not None)
        for naming in T.namings
    ]
    return [bridged(body, naming) for body in bodies for naming in T.namings]


def test_every_output_parses_in_promtool(promtools: list[str]) -> None:
    """Everything the tests above serve, judged by Prometheus's own parser (one run each)."""
    outputs = corpus()
    for out in outputs:
        samples(out)  # and by prometheus_client's, with no series twice
    for promtool in promtools:
        rejected = check_metrics_batch(promtool, outputs)
        assert rejected is None, rejected


# ------------------------------------------------------------------------- through the app

NODE = "gpu-node-a"
# One node's readings, as each release writes them: 4.8 whole MiB and whole percent, 4.10
# bytes and 0..1 ratios (the same GPUs, the same moment).
READINGS: list[dict[str, tuple[str, str]]] = [
    {
        "fb_used": ("40960", str(40960 * 1048576 + 123)),
        "fb_free": ("40000", str(40000 * 1048576)),
        "fb_reserved": ("595", str(595 * 1048576)),
        "gpu_util": ("97", "0.973"),
        "mem_copy_util": ("12", "0.12"),
        "energy": ("123456789", "123456.789"),
        "power": ("250.125", "250.125"),
        "gpu_temp": ("45", "45"),
        "sm_clock": ("1410", "1410000000"),
        "xid": ("0", "0"),
        "gr_engine_active": ("0.912345", "0.912345"),
        "pcie_tx_rate": ("1000", "1000"),
    },
    {
        "fb_used": ("0", "0"),
        "fb_free": ("81000", str(81000 * 1048576)),
        "fb_reserved": ("595", str(595 * 1048576)),
        "gpu_util": ("0", "0"),
        "mem_copy_util": ("0", "0"),
        "energy": ("5000", "5"),
        "power": ("60.5", "60.5"),
        "gpu_temp": ("30", "30"),
        "sm_clock": ("210", "210000000"),
        "xid": ("79", "79"),
        "gr_engine_active": ("0", "0"),
        "pcie_tx_rate": ("0", "0"),
    },
]


def exporter_body(naming: str) -> str:
    """What dcgm-exporter of ``naming`` writes for READINGS (4.8.4: ``hostname``)."""
    column = 0 if naming == "4.8" else 1
    driver = DRIVER_48 if naming == "4.8" else DRIVER_49
    out = []
    for field in READINGS[0]:
        name = T.name(field, naming) or ""
        lines = [
            f'{name}{{{gpu},hostname="dcgm-x",{driver}="580.65.06"}} {readings[field][column]}'
            for gpu, readings in zip((GPU0, GPU1), READINGS, strict=True)
        ]
        out.append(family(name, T.field(field).type, *lines))
    out.append(family("DCGM_FI_DEV_PSTATE", "gauge", f"DCGM_FI_DEV_PSTATE{{{GPU0}}} 0"))
    return "".join(out)


def upstream_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in samples(text).items() if T.is_upstream_field(k[0])}


async def test_a_410_body_bridged_to_48_is_the_48_body_of_the_same_readings(
    full_stack: MakeStack, promtools: list[str]
) -> None:
    """Through the real app: the 4.10 body behind --bridge.naming=4.8 serves the families,
    labels and values (within 4.8's whole MiB and whole percent) of the 4.8.4 body."""
    from .scraping import NoProcs

    old = await full_stack(
        upstream=exporter_body("4.8"), gpu=None, procs=NoProcs(), node=NODE, pods=[]
    )
    new = await full_stack(
        upstream=exporter_body("4.10"),
        gpu=None,
        procs=NoProcs(),
        node=NODE,
        pods=[],
        bridge_naming="4.8",
    )
    plain = await full_stack(
        upstream=exporter_body("4.10"), gpu=None, procs=NoProcs(), node=NODE, pods=[]
    )
    want, got = upstream_samples(await old.scrape()), upstream_samples(await new.scrape())
    assert got.keys() == want.keys()
    assert all(dict(labels)["node"] == NODE for (_, labels) in got)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1), key
        if key[0] in (T.name("fb_used", "4.8"), T.name("gpu_util", "4.8")):
            assert math.floor(got[key]) == value, key  # the exporter's rounding, nothing else
    text = await new.scrape()
    for promtool in promtools:
        assert check_metrics_batch(promtool, [text]) is None
    # Off (the default): every name as it came.
    served = await plain.scrape()
    assert T.name("fb_used", "4.10") in served and f"{T.name('fb_used', '4.8')}{{" not in served


@pytest.mark.parametrize("virtual", [False, True], ids=["kubernetes", "virtual-gpus"])
def test_the_simulated_410_body_bridged_is_the_484_body_of_the_same_readings(
    virtual: bool,
) -> None:
    """The demo's exporter at one instant, as 4.10.0 writes it and as 4.8.4 does (the same
    GPUs, processes and pods): through the bridge at 4.8, every family and series of the 4.8.4
    body, with its values within the exporter's rounding (whole MiB and whole percent; 4.8.4
    writes power in its shortest form). What 4.8.4 does not write (the driver label, the fields
    it never collected: FB capacity, the PCIe rates) is the only difference."""
    t = demo.collected_at(T0, demo.UPSTREAM_COLLECT_INTERVAL)
    gpus = demo.demo_gpus(lambda: T0)
    old = samples(rewritten(demo.render_upstream(gpus, t, "4.8.4", virtual)))
    new = samples(bridged(demo.render_upstream(gpus, t, "4.10.0", virtual), "4.8"))
    never_in_48 = {T.name(f, "4.10") for f in T.fields if T.name(f, "4.8") is None} | {
        T.name(f, "4.8") for f in ("pcie_tx_rate", "pcie_rx_rate")
    }
    new = {
        (name, tuple((k, v) for k, v in labels if k not in (DRIVER_48, DRIVER_49))): v
        for (name, labels), v in new.items()
        if name not in never_in_48
    }
    assert set(new) == set(old)
    differ = {
        k: (old[k], new[k])
        for k in old
        if not math.isclose(old[k], new[k], rel_tol=1e-6, abs_tol=1.0)
    }
    assert not differ, differ
