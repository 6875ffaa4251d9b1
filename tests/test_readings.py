"""Tests for enricher.readings and enricher.fieldtable: each body read once into SI readings
whatever release named its fields, the naming it speaks recognised from the body, unknown
fields counted, needed fields missing under every known name reported.

Bodies are hand-written in each release's names (the table's rows, and what NVIDIA's release
notes say: docs/compatibility.md); the same readings must come out of each.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from enricher.fieldtable import parse_table, release_key, table
from enricher.memory import device_memory
from enricher.power import upstream_power
from enricher.readings import (
    NAMING_MIXED,
    NAMING_NONE,
    Contract,
    family_names,
    read_body,
    recognise,
)

U0 = "GPU-00000000-0000-4000-8000-000000000000"
U1 = "GPU-11111111-1111-4111-8111-111111111111"
MIB = 2**20


def body(naming: str, *, used_mib: int = 40960, util_pct: int = 97, extra: str = "") -> str:
    """One A100 and one MIG instance, written as a release of ``naming`` writes them: memory
    in MiB (4.8) or bytes (4.9+), utilization in percent or a ratio, energy in mJ or J."""
    t = table()
    old = naming == "4.8"
    dev = f'gpu="0",UUID="{U0}",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="A100"'
    mig = (
        f'gpu="1",UUID="{U1}",device="nvidia1",modelName="A100",'
        'GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"'
    )
    values = {
        "fb_used": (used_mib, used_mib * MIB),
        "fb_free": (1000, 1000 * MIB),
        "fb_reserved": (512, 512 * MIB),
        "gpu_util": (util_pct, util_pct / 100),
        "gpu_temp": (61, 61),
        "power": (312.5, 312.5),
        "energy": (123456789, 123456.789),
        "gr_engine_active": (0.25, 0.25),
    }
    out = []
    for field, (v48, v49) in values.items():
        name = t.name(field, naming)
        assert name is not None
        out.append(f"# HELP {name} {t.field(field).meaning}.")
        out.append(f"# TYPE {name} {t.field(field).type}")
        v = v48 if old else v49
        out.append(f"{name}{{{dev}}} {v}")
        if field in ("fb_used", "gr_engine_active", "power"):
            out.append(f"{name}{{{mig}}} {v}")
    return "\n".join(out) + "\n" + extra


@pytest.mark.parametrize("naming", ["4.8", "4.9", "4.10"])
def test_every_naming_gives_the_same_readings_in_si(naming: str) -> None:
    r = read_body(body(naming))
    assert r.devices[(U0, "")] == pytest.approx(
        {
            "fb_used": 40960 * MIB,
            "fb_free": 1000 * MIB,
            "fb_reserved": 512 * MIB,
            "power": 312.5,
            "energy": 123456.789,
            "gr_engine_active": 0.25,
        }
    )
    assert r.devices[(U1, "7")] == pytest.approx(
        {"fb_used": 40960 * MIB, "gr_engine_active": 0.25, "power": 312.5}
    )
    memory = device_memory(r)
    assert memory[(U0, "")].in_use == (40960 + 512) * MIB
    assert memory[(U0, "")].total == (40960 + 512 + 1000) * MIB
    power = upstream_power(r)
    # The MIG GPU's device field written only per instance: the first copy stands for it.
    assert dict(power.power_watts) == {U0: 312.5, U1: 312.5}
    assert dict(power.energy_joules) == pytest.approx({U0: 123456.789})
    assert dict(power.activity) == {(U0, ""): 0.25, (U1, "7"): 0.25}


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param(["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"], "4.8", id="4.8"),
        pytest.param(
            ["DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES"], "4.9", id="4.9-pcie"
        ),
        pytest.param(["DCGM_FI_DEV_FB_USED_BYTES"], "4.9", id="4.9-or-later-oldest-that-fits"),
        pytest.param(
            ["DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"],
            "4.10",
            id="4.10",
        ),
        pytest.param(
            ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL_RATIO"], NAMING_MIXED, id="mixed"
        ),
        pytest.param(["node_load1", "DCGM_FI_DEV_NOT_A_FIELD"], NAMING_NONE, id="none"),
        pytest.param(
            ["DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", "DCGM_FI_DEV_GPU_UTIL"], "4.8", id="unrenamed"
        ),
    ],
)
def test_the_naming_a_body_speaks(names: list[str], expected: str) -> None:
    assert recognise(names).naming == expected


def test_unknown_fields_are_counted_and_pass_through() -> None:
    extra = (
        "# TYPE DCGM_FI_DEV_SOMETHING_NEW gauge\n"
        f'DCGM_FI_DEV_SOMETHING_NEW{{gpu="0",UUID="{U0}"}} 3\n'
        "# TYPE go_goroutines gauge\ngo_goroutines 7\n"
    )
    r = read_body(body("4.10", extra=extra))
    assert r.contract == Contract("4.9", known=8, unknown=1, missing=())
    assert "DCGM_FI_DEV_SOMETHING_NEW" not in {n for v in r.devices.values() for n in v}


def test_a_needed_field_under_no_known_name_is_reported() -> None:
    """A future release renames FB_USED again: the body has no name the table knows for it,
    and the contract says so (what the warning, the self-metric and the node page report)."""
    text = body("4.10").replace("DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FRAMEBUFFER_USED_BYTES")
    r = read_body(text)
    assert r.contract.missing == ("fb_used",)
    assert r.contract.unknown == 1
    assert device_memory(r) == {}  # no memory split on a guess


def test_an_empty_body_says_nothing_is_there() -> None:
    assert read_body("").contract == Contract(NAMING_NONE, 0, 0, table().needed())


def test_virtual_gpu_copies_never_read_over_the_devices_own_series() -> None:
    """4.8.2 on, --kubernetes-virtual-gpus: FB_USED keeps the device series and adds each
    pod's share; FB_FREE is copied per pod with the device's value (no device series)."""
    for naming, scale in (("4.8", 1), ("4.10", MIB)):
        used, free = table().name("fb_used", naming), table().name("fb_free", naming)
        text = (
            f'{used}{{UUID="{U0}",pod="a",namespace="n",vgpu="0"}} {100 * scale}\n'
            f'{used}{{UUID="{U0}"}} {300 * scale}\n'
            f'{used}{{UUID="{U0}",pod="b",namespace="n",vgpu="1"}} {200 * scale}\n'
            f'{free}{{UUID="{U0}",pod="a",namespace="n",vgpu="0"}} {700 * scale}\n'
            f'{free}{{UUID="{U0}",pod="b",namespace="n",vgpu="1"}} {700 * scale}\n'
        )
        mem = device_memory(read_body(text))[(U0, "")]
        assert (mem.used, mem.free) == (300 * MIB, 700 * MIB), naming


def test_ratios_never_read_above_one() -> None:
    name = table().name("gr_engine_active", "4.10")
    r = read_body(f'{name}{{UUID="{U0}"}} 1.5\n')
    assert r.devices[(U0, "")]["gr_engine_active"] == 1.0


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param("# TYPE a gauge\n# HELP b x\n# TYPE b counter\nb 1\n", ["a", "b"], id="order"),
        pytest.param("", [], id="empty"),
        pytest.param("# TYPE a gauge", ["a"], id="no-newline"),
        pytest.param("x 1\n# TYPE b\tcounter\n# TYPE  \n# TYPE c", ["b", "c"], id="tab-blank"),
        pytest.param("## TYPE z gauge\n# TYPEX y\nq # TYPE w gauge\n", [], id="not-type-lines"),
    ],
)
def test_family_names_are_the_type_lines(text: str, names: list[str]) -> None:
    assert family_names(text) == names


def test_family_names_are_bounded() -> None:
    from enricher.readings import MAX_FAMILIES

    assert len(family_names("# TYPE a gauge\n" * (MAX_FAMILIES + 5))) == MAX_FAMILIES


# --------------------------------------------------------------------------- the table


def test_the_table_is_consistent() -> None:
    """Every row has a name in every naming from its first one, one SI unit, a known type;
    no name means two fields; the namings run in release order."""
    t = table()
    firsts = [release_key(t.naming_first[n]) for n in t.namings]
    assert firsts == sorted(firsts)
    owners: dict[str, str] = {}
    for f in t.fields.values():
        assert f.type in ("gauge", "counter"), f.field
        assert f.by_naming, f.field
        assert f.meaning
        for fn in f.by_naming.values():
            assert fn.name.startswith(t.prefix)
            assert owners.setdefault(fn.name, f.field) == f.field, fn.name
    assert set(t.needed()) <= set(t.fields)
    raw = json.loads(resources.files("enricher").joinpath("dcgm_fields.json").read_text())
    assert [r["field"] for r in raw["fields"]] == list(t.fields)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        pytest.param({"fields": [{"field": "x"}]}, "not a valid field table", id="no-names"),
        pytest.param(
            {"fields": [{"field": "x", "type": "gauge", "meaning": "m", "names": {"9.9": {}}}]},
            "unknown naming",
            id="unknown-naming",
        ),
        pytest.param(
            {
                "fields": [
                    {
                        "field": "x",
                        "type": "gauge",
                        "meaning": "m",
                        "names": {
                            "4.8": {"name": "DCGM_FI_X", "unit": "MiB"},
                            "4.9": {"name": "DCGM_FI_X_RATIO", "unit": "ratio"},
                        },
                    }
                ]
            },
            "different units",
            id="unit-kinds-differ",
        ),
    ],
)
def test_a_broken_table_is_a_clear_error(bad: dict[str, object], message: str) -> None:
    raw = json.loads(resources.files("enricher").joinpath("dcgm_fields.json").read_text())
    raw.update(bad)
    with pytest.raises(ValueError, match=message):
        parse_table(json.dumps(raw))


@pytest.mark.parametrize(
    ("release", "naming", "host", "driver"),
    [
        ("3.3.1", "4.8", "Hostname", "DCGM_FI_DRIVER_VERSION"),
        ("4.5.3-4.8.2", "4.8", "Hostname", "DCGM_FI_DRIVER_VERSION"),
        ("4.8.4", "4.8", "hostname", "DCGM_FI_DRIVER_VERSION"),
        ("4.9.0", "4.9", "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
        ("4.10.0", "4.10", "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
        ("4.11.2", "4.10", "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
    ],
)
def test_each_release_maps_to_its_naming_and_labels(
    release: str, naming: str, host: str, driver: str
) -> None:
    t = table()
    assert t.naming_of_release(release) == naming
    assert t.label("host", release) == host
    assert t.label("driver_version", release) == driver


def test_a_release_that_is_no_version_is_refused() -> None:
    with pytest.raises(ValueError, match="not a dcgm-exporter release"):
        release_key("latest")
