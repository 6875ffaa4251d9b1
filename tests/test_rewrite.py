"""The upstream rewrite, checked against prometheus_client's parser as the oracle."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from enricher.labels import SHARED, Owner, RewritePlan, device_key, relabel
from enricher.rewrite import _COMMON_VALUES_RE, _FAST_VALUES_RE, Rewriter, RewriteResult
from enricher.textformat import (
    escape_label_value,
    format_value,
    parse_label_block,
    render_labels,
    unescape_label_value,
    valid_value,
)

from .conftest import shared_dcgm_fixtures
from .exposition import FamilyWriter, float_text

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"

Sample = tuple[str, tuple[tuple[str, str], ...], float | str]
GUARDS = (("container", ""), ("namespace", ""), ("pod", ""))


def with_guards(items: list[Sample]) -> list[Sample]:
    """What the rewrite adds to every upstream series: empty pod labels where there were none."""
    out = []
    for name, labels, value in items:
        d = dict(GUARDS) | dict(labels)
        out.append((name, tuple(sorted(d.items())), value))
    return out


def samples(text: str) -> list[Sample]:
    """All samples as the oracle parses them (NaN made comparable)."""
    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            v: float | str = "NaN" if math.isnan(s.value) else s.value
            out.append((s.name, tuple(sorted(s.labels.items())), v))
    return out


def rewrite(text: str, owners: Mapping[tuple[str, str], Owner] | None = None) -> str:
    return Rewriter().rewrite(text, RewritePlan(owners=dict(owners or {}))).text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param('a="1",b="2"', [("a", "1"), ("b", "2")], id="plain"),
        pytest.param('a="1", b="2"', [("a", "1"), ("b", "2")], id="space-after-comma"),
        pytest.param('a="1",b="2",', [("a", "1"), ("b", "2")], id="trailing-comma"),
        pytest.param('a="x\\"y}"', [("a", 'x\\"y}')], id="escaped-quote-and-brace"),
        pytest.param('a="\\\\"', [("a", "\\\\")], id="escaped-backslash"),
        pytest.param("", [], id="empty"),
        pytest.param('a="1",a="2"', None, id="duplicate-name"),
        pytest.param('1a="x"', None, id="bad-name"),
        pytest.param('a="unterminated', None, id="unterminated"),
        pytest.param('a="1"b="2"', None, id="missing-comma"),
        pytest.param("a=1", None, id="unquoted"),
        pytest.param('__=""', None, id="reserved-name"),
        pytest.param('a="1",__name__="x"', None, id="reserved-dunder-name"),
        pytest.param('_a="1"', [("_a", "1")], id="one-underscore-is-fine"),
    ],
)
def test_parse_label_block(raw: str, expected: list[tuple[str, str]] | None) -> None:
    assert parse_label_block(raw) == expected


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        pytest.param("plain", "plain", id="plain"),
        pytest.param('a"b', 'a\\"b', id="quote"),
        pytest.param("a\\b", "a\\\\b", id="backslash"),
        pytest.param("a\nb", "a\\nb", id="newline"),
        pytest.param("x" * 2000, "x" * 1024, id="bounded-length"),
    ],
)
def test_escape_label_value(value: str, escaped: str) -> None:
    assert escape_label_value(value) == escaped
    if len(value) <= 1024:
        assert unescape_label_value(escaped) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(3.0, "3", id="integral"),
        pytest.param(0.5, "0.5", id="fraction"),
        pytest.param(float("nan"), "NaN", id="nan"),
        pytest.param(float("inf"), "+Inf", id="inf"),
        pytest.param(float("-inf"), "-Inf", id="neg-inf"),
        pytest.param(1e20, "1e+20", id="huge"),
    ],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text


DEVICE_TEXT = (
    "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID_A}",device="nvidia0",Hostname="h",'
    'container="",namespace="",pod=""} 100\n'
    f'DCGM_FI_DEV_FB_USED{{gpu="1",UUID="{UUID_B}",device="nvidia1",Hostname="h",'
    'container="old",namespace="old",pod="old"} 200\n'
)


def test_owner_replaces_pod_labels_in_place() -> None:
    out = rewrite(DEVICE_TEXT, {(UUID_A, ""): Owner("ml", "train-0", "trainer")})
    got = {dict(lbl)["UUID"]: dict(lbl) for _, lbl, _ in samples(out)}
    assert got[UUID_A]["pod"] == "train-0"
    assert got[UUID_A]["namespace"] == "ml"
    assert got[UUID_A]["container"] == "trainer"
    # A device without processes keeps what the upstream's PodResources mapping said.
    assert got[UUID_B]["pod"] == "old"
    # Label order is kept: pod labels stay where the upstream had them.
    assert 'Hostname="h",container="trainer",namespace="ml",pod="train-0"}' in out


def test_shared_device_clears_pod_labels() -> None:
    out = rewrite(DEVICE_TEXT, {(UUID_B, ""): SHARED})
    got = {dict(lbl)["UUID"]: dict(lbl) for _, lbl, _ in samples(out)}
    assert (got[UUID_B]["namespace"], got[UUID_B]["pod"], got[UUID_B]["container"]) == ("", "", "")


def test_labels_added_when_upstream_has_none() -> None:
    text = f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{UUID_A}"}} 5\n'
    out = rewrite(text, {(UUID_A, ""): Owner("ns", "p", "c")})
    assert (
        out == f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{UUID_A}",'
        'container="c",namespace="ns",pod="p"} 5\n'
    )


def test_old_naming_scheme() -> None:
    text = (
        f'dcgm_gpu_utilization{{gpu="0",uuid="{UUID_A}",container_name="",pod_name="",'
        f'pod_namespace=""}} 5\n'
    )
    out = rewrite(text, {(UUID_A, ""): Owner("ns", "p", "c")})
    labels = dict(samples(out)[0][1])
    assert labels["pod_name"] == "p"
    assert labels["pod_namespace"] == "ns"
    assert labels["container_name"] == "c"
    # The current names are present too, empty: they keep Prometheus (honor_labels: true)
    # from attaching the enricher's own pod to the series.
    assert (labels["pod"], labels["namespace"], labels["container"]) == ("", "", "")


def test_mig_instance_keyed_by_gpu_instance_id() -> None:
    text = (
        f'F{{gpu="0",UUID="{UUID_A}",GPU_I_PROFILE="1g.10gb",GPU_I_ID="1"}} 1\n'
        f'F{{gpu="0",UUID="{UUID_A}",GPU_I_PROFILE="1g.10gb",GPU_I_ID="2"}} 2\n'
    )
    out = rewrite(text, {(UUID_A, "2"): Owner("ns", "p", "c")})
    by_gi = {dict(lbl)["GPU_I_ID"]: dict(lbl) for _, lbl, _ in samples(out)}
    assert by_gi["1"]["pod"] == ""
    assert by_gi["2"]["pod"] == "p"


def test_vgpu_copies_are_kept_intact() -> None:
    text = (
        f'F{{UUID="{UUID_A}",pod="a",namespace="n",container="c",vgpu="1"}} 5\n'
        f'F{{UUID="{UUID_A}",pod="b",namespace="n",container="c",vgpu="2"}} 5\n'
    )
    out = rewrite(text, {(UUID_A, ""): SHARED})
    assert {dict(lbl)["pod"] for _, lbl, _ in samples(out)} == {"a", "b"}


# Every upstream series leaves with the enricher's node label, whatever dcgm-exporter called
# its own (Hostname to 4.8.2, hostname from 4.8.3, NVIDIA's commit d5e5f51) and whatever that
# held (the exporter pod's name, localhost); the upstream's own label is kept as it was.
@pytest.mark.parametrize(
    "host",
    [
        pytest.param('Hostname="node-a",', id="4.8.2-Hostname"),
        pytest.param('hostname="node-a",', id="4.8.4-hostname"),
        pytest.param('Hostname="nvidia-dcgm-exporter-7xk2p",', id="exporter-pod-name"),
        pytest.param('hostname="localhost",', id="localhost"),
        pytest.param("", id="none"),
        pytest.param('node="stale",', id="an-upstream-node-label-is-replaced"),
    ],
)
@pytest.mark.parametrize("owned", [True, False], ids=["owned-device", "other-series"])
def test_every_series_leaves_with_the_node(host: str, owned: bool) -> None:
    text = (
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{UUID_A}",{host}'
        'pod="",namespace="",container=""} 5\n'
        f'DCGM_FI_DEV_COUNT{{{host}x="1"}} 2\n'
        "dcgm_exporter_build_info 1\n"
    )
    owners = {(UUID_A, ""): Owner("ml", "train-0", "trainer")} if owned else {}
    out = Rewriter().rewrite(text, RewritePlan(owners=owners, node="node-a")).text
    got = samples(out)
    assert len(got) == 3
    upstream = dict(p.split("=") for p in host.rstrip(",").replace('"', "").split(",") if p)
    # A line written without labels gets the guards and the node, as written exposition.
    assert '\ndcgm_exporter_build_info{container="",namespace="",pod="",node="node-a"} 1\n' in out
    for sample_name, labels, _ in got:
        labels_d = dict(labels)
        assert labels_d["node"] == "node-a"
        if sample_name == "dcgm_exporter_build_info":
            continue  # written without labels
        if sample_name == "DCGM_FI_DEV_GPU_UTIL":  # only the node's value was replaced
            assert (labels_d["gpu"], labels_d["UUID"]) == ("0", UUID_A)
        for name, value in upstream.items():
            if name != "node":
                assert labels_d[name] == value  # dcgm-exporter's own label, kept


@pytest.mark.parametrize(
    "owner", [Owner("ml", "train-0", "trainer"), SHARED], ids=["owned", "shared"]
)
def test_hpc_job_passes_through(owner: Owner) -> None:
    """dcgm-exporter's HPC job label (--hpc-job-mapping-dir; on MIG instances since #602)
    describes the job the scheduler put on the device, not the pod: it stays, whoever the
    enricher names, on device series and on vGPU copies alike."""
    text = (
        f'F{{gpu="0",UUID="{UUID_A}",hpc_job="4242",pod="old",namespace="n",container="c"}} 1\n'
        f'F{{UUID="{UUID_A}",hpc_job="4242",pod="a",namespace="n",container="c",vgpu="1"}} 1\n'
    )
    out = Rewriter().rewrite(text, RewritePlan(owners={(UUID_A, ""): owner})).text
    assert [dict(labels)["hpc_job"] for _, labels, _ in samples(out)] == ["4242", "4242"]


def test_no_node_label_without_a_node_name() -> None:
    text = f'F{{UUID="{UUID_A}",Hostname="h"}} 1\n'
    out = Rewriter().rewrite(text, RewritePlan()).text
    assert "node=" not in out


# A device shared by pods a and b, as dcgm-exporter 4.8.2 on writes it with
# --kubernetes-virtual-gpus: the device's FB_USED, then each pod's share; FB_FREE per pod only.
_VGPU_DEV = (
    f'gpu="0",UUID="{UUID_A}",pci_bus_id="00000000:17:00.0",device="nvidia0",'
    'modelName="A100",hostname="n"'
)
_VGPU_A = 'container="main",namespace="team",pod="a",pod_uid="uid-a"'
_VGPU_B = 'container="main",namespace="team",pod="b",pod_uid="uid-b"'
VGPU_TEXT = (
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    f"DCGM_FI_DEV_FB_USED{{{_VGPU_DEV}}} 31288\n"
    f"DCGM_FI_DEV_FB_USED{{{_VGPU_DEV},{_VGPU_A}}} 22528\n"
    f"DCGM_FI_DEV_FB_USED{{{_VGPU_DEV},{_VGPU_B}}} 7680\n"
    "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
    f"DCGM_FI_DEV_FB_FREE{{{_VGPU_DEV},{_VGPU_A}}} 49120\n"
    f"DCGM_FI_DEV_FB_FREE{{{_VGPU_DEV},{_VGPU_B}}} 49120\n"
)


def test_virtual_gpu_copies_of_a_shared_device_leave_as_one_device_series() -> None:
    """dcgm-exporter 4.8.2 on, --kubernetes-virtual-gpus (internal/pkg/transformation/
    kubernetes.go, Process): FB_USED keeps the device series (no pod label, written first) and
    adds each sharing pod's share with pod_uid; FB_FREE is copied once per pod with the device's
    value and has no device series. On a device the enricher finds shared, each family leaves
    as one series with the pod labels cleared and the device's value: the shares are never
    served as the device (nor beside it, to be summed with it)."""
    text = VGPU_TEXT
    result = Rewriter().rewrite(text, RewritePlan(owners={(UUID_A, ""): SHARED}, node="n"))
    got = samples(result.text)
    assert [(name, value) for name, _, value in got] == [
        ("DCGM_FI_DEV_FB_USED", 31288.0),
        ("DCGM_FI_DEV_FB_FREE", 49120.0),
    ]
    for _, labels, _ in got:
        labels_d = dict(labels)
        assert (labels_d["pod"], labels_d["namespace"], labels_d["container"]) == ("", "", "")
        assert labels_d.get("pod_uid", "") == ""
    assert result.dropped_duplicates == 3


def test_virtual_gpu_copy_of_a_device_with_one_owner_is_not_served_beside_it() -> None:
    """The same 4.8.2-on body, on a device the enricher gives to one pod (pod b holds no
    process, so a is the owner): the device series takes a's labels, and so do both copies once
    relabelled, a's with its pod_uid. Served beside the device series, a's share would be a
    second series of pod a, and `sum by (pod)` would count the pod twice: the device series
    stays, with the device's value, and the copies leave as its repeats."""
    text = VGPU_TEXT
    owner = Owner("team", "a", "main", uid="uid-a")
    for templates in (False, True):
        rewriter = Rewriter(templates=templates)
        for _ in range(2):  # the template serves the second
            result = rewriter.rewrite(text, RewritePlan(owners={(UUID_A, ""): owner}, node="n"))
            got = samples(result.text)
            assert [(name, value) for name, _, value in got] == [
                ("DCGM_FI_DEV_FB_USED", 31288.0),
                ("DCGM_FI_DEV_FB_FREE", 49120.0),
            ]
            assert [dict(labels)["pod"] for _, labels, _ in got] == ["a", "a"]
            assert result.dropped_duplicates == 3


@pytest.mark.parametrize(
    ("owner", "want"),
    [
        pytest.param(Owner("", "", "lab-train-1"), ["lab-train-1"], id="one-container"),
        pytest.param(SHARED, [""], id="shared"),
        # No process on the GPU: the enricher has no answer and the upstream's stands.
        pytest.param(None, ["", "lab-train-1", "notebook"], id="idle"),
    ],
)
def test_container_runtime_copies_on_a_docker_host(owner: Owner | None, want: list[str]) -> None:
    """dcgm-exporter 4.8.3 on, on a Docker host with its container runtime socket
    (internal/pkg/transformation/container.go, containerMapper.Process, at 7ad5832): each series
    is kept and a copy follows for each container the runtime assigns the GPU to (its
    DeviceRequests or NVIDIA_VISIBLE_DEVICES, `all` included), with container="<name>". Where
    the enricher attributes the GPU, the copies name its container (or none, shared) once
    relabelled and leave as repeats of the device series: one series, the enricher's answer."""
    dev = f'gpu="0",UUID="{UUID_A}",device="nvidia0",modelName="A100",hostname="lab-box"'
    text = (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        f"DCGM_FI_DEV_FB_USED{{{dev}}} 11264\n"
        f'DCGM_FI_DEV_FB_USED{{{dev},container="lab-train-1"}} 11264\n'
        f'DCGM_FI_DEV_FB_USED{{{dev},container="notebook"}} 11264\n'
    )
    owners = {} if owner is None else {(UUID_A, ""): owner}
    got = samples(Rewriter().rewrite(text, RewritePlan(owners=owners, node="lab-box")).text)
    assert [dict(labels)["container"] for _, labels, _ in got] == want
    assert {value for _, _, value in got} == {11264.0}


def test_hostile_pod_names_are_escaped() -> None:
    evil = 'x"}\n y\\'
    out = rewrite(DEVICE_TEXT, {(UUID_A, ""): Owner(evil, evil, evil)})
    got = {dict(lbl)["UUID"]: dict(lbl) for _, lbl, _ in samples(out)}
    assert got[UUID_A]["pod"] == evil


def test_invalid_lines_are_dropped_and_counted() -> None:
    text = (
        "# HELP good Fine.\n# TYPE good gauge\n"
        "good 1\n"
        "...\n"
        'bad{a="1" 2\n'
        'bad2{a="1"} notanumber\n'
        'bad3{a="\\q",a="2"} 1\n'
        "good_too 1_000\n"
        "# random comment\n"
    )
    r = Rewriter().rewrite(text, RewritePlan())
    assert samples(r.text) == [("good", GUARDS, 1.0)]
    assert r.invalid_lines == 5


def test_interleaved_families_are_regrouped() -> None:
    text = (
        '# HELP a First.\n# TYPE a gauge\na{x="1"} 1\n'
        "# HELP b Second.\n# TYPE b counter\nb 2\n"
        '# HELP a First again.\n# TYPE a gauge\na{x="2"} 3\n'
    )
    out = rewrite(text)
    assert out.count("# HELP a ") == 1
    assert sorted(samples(out)) == sorted(
        with_guards(samples(text.replace("# HELP a First again.\n# TYPE a gauge\n", "")))
    )


def test_duplicate_series_after_rewrite_are_dropped() -> None:
    text = f'F{{UUID="{UUID_A}",pod="x"}} 1\nF{{UUID="{UUID_A}",pod="y"}} 2\n'
    r = Rewriter().rewrite(text, RewritePlan(owners={(UUID_A, ""): Owner("n", "p", "c")}))
    assert len(samples(r.text)) == 1
    assert r.dropped_duplicates == 1


def test_reserved_family_names_are_dropped() -> None:
    text = "# TYPE gpu_pod_info gauge\ngpu_pod_info 1\ndcgm_enricher_build_info 1\nok 1\n"
    r = Rewriter().rewrite(text, RewritePlan())
    assert [s[0] for s in samples(r.text)] == ["ok"]
    assert r.dropped_reserved == 3


def test_identities_are_collected_per_device() -> None:
    r = Rewriter().rewrite(DEVICE_TEXT, RewritePlan())
    assert r.identities[(UUID_A, "")] == (
        ("gpu", "0"),
        ("UUID", UUID_A),
        ("device", "nvidia0"),
        ("Hostname", "h"),
    )


def test_plan_change_invalidates_block_cache() -> None:
    rw = Rewriter()
    one = rw.rewrite(DEVICE_TEXT, RewritePlan(owners={(UUID_A, ""): Owner("n", "p1", "c")})).text
    two = rw.rewrite(DEVICE_TEXT, RewritePlan(owners={(UUID_A, ""): Owner("n", "p2", "c")})).text
    assert 'pod="p1"' in one
    assert 'pod="p2"' in two
    assert 'pod="p1"' not in two


def test_family_writer_renders_help_type_and_samples() -> None:
    w = FamilyWriter()
    w.family("x_bytes", "Help with \\ and\nnewline.")
    w.sample("x_bytes", [("a", 'q"')], 2)
    assert w.render() == (
        '# HELP x_bytes Help with \\\\ and\\nnewline.\n# TYPE x_bytes gauge\nx_bytes{a="q\\""} 2\n'
    )


@pytest.mark.parametrize("path", shared_dcgm_fixtures(), ids=lambda p: p.name)
def test_real_captures_pass_through(path: object) -> None:
    """Every real dcgm-exporter capture: valid samples kept, output valid."""
    from pathlib import Path

    assert isinstance(path, Path)
    text = path.read_text()
    r = Rewriter().rewrite(text, RewritePlan())
    out = samples(r.text)  # the oracle accepts the output
    try:
        expected = samples(text)
    except ValueError:
        # Not valid exposition as captured (the README sample with "..." lines): the valid
        # lines survive and the rest is counted.
        assert r.invalid_lines > 0
        assert out
        return
    assert sorted(out, key=repr) == sorted(with_guards(expected), key=repr)


@pytest.mark.parametrize("path", shared_dcgm_fixtures(), ids=lambda p: p.name)
def test_real_captures_carry_the_node_and_keep_their_host_label(path: object) -> None:
    """Every real dcgm-exporter capture (old releases with Hostname, a 4.8.3-or-later one with
    hostname, from NVIDIA's PR 736): every valid sample leaves with the node label, and the
    upstream's own host label keeps its value."""
    from pathlib import Path

    assert isinstance(path, Path)
    text = path.read_text()
    try:
        expected = samples(text)
    except ValueError:
        pytest.skip("not valid exposition as captured (test_real_captures_pass_through)")
    out = samples(Rewriter().rewrite(text, RewritePlan(node="gpu-node-x")).text)
    assert len(out) == len(expected) > 0
    for _, labels, _ in out:
        assert dict(labels)["node"] == "gpu-node-x"
    hosts = {
        (n, v) for _, labels, _ in expected for n, v in labels if n in ("Hostname", "hostname")
    }
    assert hosts <= {(n, v) for _, labels, _ in out for n, v in labels}


# --------------------------------------------------------------------------- property test

label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not n.startswith("__")
)
metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True).filter(
    lambda n: not n.startswith(("gpu_", "dcgm_enricher_"))
)
# Valid label values: any text but lone surrogates (not text; undecodable bytes are the
# hostile tests' junk).
_TEXT_CHARS = st.characters(exclude_categories=("Cs",))
label_values = st.text(_TEXT_CHARS, max_size=30)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53).map(float),
)


def _esc(v: str) -> str:
    # The generator's own escaping, written independently of the code under test.
    out = []
    for ch in v:
        out.append({"\\": "\\\\", '"': '\\"', "\n": "\\n"}.get(ch, ch))
    return "".join(out)


@st.composite
def expositions(draw: st.DrawFn) -> tuple[str, dict[tuple[str, str], Owner]]:
    uuids = [UUID_A, UUID_B, 'GPU-"odd\\uuid\n']
    n_fam = draw(st.integers(1, 4))
    names = draw(st.lists(metric_names, min_size=n_fam, max_size=n_fam, unique=True))
    lines: list[str] = []
    for name in names:
        if draw(st.booleans()):
            help_text = (
                draw(st.text(_TEXT_CHARS, max_size=20)).replace("\n", " ").replace("\\", "/")
            )
            lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {draw(st.sampled_from(['gauge', 'counter', 'untyped']))}")
        seen: set[frozenset[tuple[str, str]]] = set()
        for _ in range(draw(st.integers(0, 4))):
            extra = draw(st.dictionaries(label_names, label_values, max_size=3))
            labels = {
                k: v
                for k, v in extra.items()
                if k not in ("UUID", "GPU_I_ID", "pod", "namespace", "container", "vgpu")
            }
            if draw(st.booleans()):
                labels["UUID"] = draw(st.sampled_from(uuids))
                if draw(st.booleans()):
                    labels["GPU_I_ID"] = draw(st.sampled_from(["1", "2"]))
                if draw(st.booleans()):
                    labels.update(pod=draw(label_values), namespace="", container="")
            key = frozenset(labels.items())
            if key in seen:
                continue
            seen.add(key)
            block = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
            ts = f" {draw(st.integers(0, 2**40))}" if draw(st.booleans()) else ""
            lines.append(
                f"{name}{{{block}}} {float_text(draw(values))}{ts}"
                if block
                else f"{name} {float_text(draw(values))}{ts}"
            )
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), "# a comment line")
    owners = {}
    for u in uuids:
        for gi in ("", "1", "2"):
            choice = draw(st.sampled_from(["none", "owner", "shared"]))
            if choice == "owner":
                owners[(u, gi)] = Owner(draw(label_values), draw(label_values), draw(label_values))
            elif choice == "shared":
                owners[(u, gi)] = SHARED
    return "\n".join(lines) + "\n", owners


def _expected(text: str, owners: Mapping[tuple[str, str], Owner]) -> list[Sample]:
    """The input's samples with the plan applied; a series the rewrite makes equal to an
    earlier one is expected once (the first), since exposition may not repeat a series."""
    out: list[Sample] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()  # series identities
    for name, labels, value in samples(text):
        d = dict(labels)
        owner = owners.get((d["UUID"], d.get("GPU_I_ID", ""))) if "UUID" in d else None
        for guard in ("pod", "namespace", "container"):
            d.setdefault(guard, "")
        if owner is not None and "vgpu" not in d:
            d.update(
                namespace=owner.namespace[:1024],
                pod=owner.pod[:1024],
                container=owner.container[:1024],
            )
        key = (name, tuple(sorted(d.items())))
        # Prometheus's notion of one series: empty labels count as absent.
        # On an owned device a pod's copy with pod_uid repeats the device's series.
        ignored = "pod_uid" if owner is not None and "vgpu" not in d else ""
        identity = (name, tuple(kv for kv in key[1] if kv[1] and kv[0] != ignored))
        if identity not in seen:
            seen.add(identity)
            out.append((*key, value))
    return out


@given(expositions())
def test_rewrite_matches_oracle(case: tuple[str, dict[tuple[str, str], Owner]]) -> None:
    """Same samples and values as the input, plus exactly the intended pod labels."""
    text, owners = case
    out = rewrite(text, owners)
    assert sorted(samples(out), key=repr) == sorted(_expected(text, owners), key=repr)


@given(st.text(max_size=300))
def test_rewrite_never_emits_invalid_output(junk: str) -> None:
    out = rewrite(junk, {(UUID_A, ""): Owner("n", "p", "c")})
    samples(out)  # parses


# --------------------------------------------------------------------------- the fast path
#
# The rewriter serves a text that differs from the previous one only in its values from a
# template, and a repeated text from its last result. The line-by-line path
# (Rewriter(templates=False)) is the reference: whatever the history of a rewriter, its answer
# to a text must be byte for byte the reference's, and that must match the oracle.


def reference(text: str, owners: Mapping[tuple[str, str], Owner]) -> RewriteResult:
    return Rewriter(templates=False).rewrite(text, RewritePlan(owners=dict(owners)))


def same(got: RewriteResult, want: RewriteResult) -> None:
    assert got.text == want.text
    assert got.identities == want.identities
    assert (got.samples, got.invalid_lines, got.dropped_duplicates, got.dropped_reserved) == (
        want.samples,
        want.invalid_lines,
        want.dropped_duplicates,
        want.dropped_reserved,
    )


FAST_OK = [
    "0",
    "17",
    "-3",
    "+4",
    "0.000000",
    "1.",
    ".5",
    "-.5",
    "1e+20",
    "2.5E-3",
    "NaN",
    "Inf",
    "+Inf",
    "-Inf",
    "5 1712000000000",
]
# Valid for the line-by-line path, but not copied by the fast path (the text falls back).
SLOW_ONLY = ["nan", "+inf", "1e5 ", " 1", "Infinity", "5\t1", "1" * 250, "1e100"]
# Dropped by both paths, and rejected by the oracle as well.
INVALID = ["", "abc", "1_000", "1.2.3", "1e", "--1", "0x10", "} 5", '5"']
# Dropped by both paths (a timestamp is an integer, and there is one), though the oracle,
# more lenient than Prometheus, reads them.
INVALID_TIMESTAMPS = ["5 1.5", "5 1 2"]
# Read by prometheus_client (and Python's float()), rejected by Prometheus: Unicode digits,
# out-of-range numbers, signed or out-of-range timestamps.
PYTHON_ONLY = ["\u0661", "1e400", "-1e400", "1\u00a02", "5 -1", "5 +1", "5 9223372036854775808"]
REJECTED_VALUES = frozenset(INVALID + INVALID_TIMESTAMPS + PYTHON_ONLY)


@pytest.mark.parametrize("value", FAST_OK, ids=repr)
def test_fast_values_are_what_the_line_path_copies(value: str) -> None:
    assert _FAST_VALUES_RE.fullmatch(value + "\n") is not None
    # What the line-by-line path does with it: accept, and copy unchanged.
    assert valid_value(" " + value) == value


@pytest.mark.parametrize("value", SLOW_ONLY + INVALID + INVALID_TIMESTAMPS + PYTHON_ONLY, ids=repr)
def test_other_values_take_the_line_path(value: str) -> None:
    assert _FAST_VALUES_RE.fullmatch(value + "\n") is None
    assert _COMMON_VALUES_RE.fullmatch(value + "\n") is None


@given(st.text(alphabet="0123456789.-+eE \n", max_size=12) | st.sampled_from(FAST_OK))
def test_common_value_grammar_is_part_of_the_full_one(value: str) -> None:
    """The quick check may only accept what the full grammar accepts."""
    text = value + "\n"
    if _COMMON_VALUES_RE.fullmatch(text) is not None:
        assert _FAST_VALUES_RE.fullmatch(text) is not None
    if _FAST_VALUES_RE.fullmatch(text) is not None:
        for one in value.split("\n"):
            assert valid_value(" " + one) == one


def _dcgm(values: tuple[str, str, str], help_text: str = "GPU utilization (in %).") -> str:
    a, b, c = values
    return (
        f"# HELP DCGM_FI_DEV_GPU_UTIL {help_text}\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{UUID_A}",Hostname="h"}} {a}\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{UUID_B}",Hostname="h",'
        f'container="c",namespace="n",pod="p"}} {b}\n'
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID_A}",Hostname="h"}} {c}\n'
    )


OWNED = {(UUID_A, ""): Owner("ml", "train-0", "trainer")}


@pytest.mark.parametrize(
    ("first", "second", "served"),
    [
        pytest.param(_dcgm(("1", "2", "3")), _dcgm(("10", "0.5", "NaN")), "template", id="values"),
        pytest.param(_dcgm(("1", "2", "3")), _dcgm(("1", "2", "3")), "repeat", id="same-text"),
        pytest.param(
            _dcgm(("1", "2", "3")), _dcgm(("1", "2", "3 1712000000")), "template", id="timestamp"
        ),
        pytest.param(
            _dcgm(("1", "2", "3")),
            _dcgm(("1", "2", "3")).replace('gpu="1"', 'gpu="7"'),
            "line",
            id="label-changed",
        ),
        pytest.param(_dcgm(("1", "2", "3")), _dcgm(("1", "x", "3")), "line", id="value-invalid"),
        pytest.param(_dcgm(("1", "2", "3")), _dcgm(("1", "nan", "3")), "line", id="value-slow"),
        pytest.param(
            _dcgm(("1", "2", "3")), _dcgm(("1", "2", "3")) + "up 1\n", "line", id="line-added"
        ),
        pytest.param(
            _dcgm(("1", "2", "3")) + "up 1\n",
            _dcgm(("4", "5", "6")) + "up 0\n",
            "line",
            id="unlabelled-value-changed",
        ),
        pytest.param(
            _dcgm(("1", "2", "3")) + "up 1\n",
            _dcgm(("4", "5", "6")) + "up 1\n",
            "template",
            id="unlabelled-value-kept",
        ),
        pytest.param(
            _dcgm(("1", "2", "3"), help_text="Odd} 5"),
            _dcgm(("4", "5", "6"), help_text="Odd} 6"),
            "line",
            id="slot-in-help",
        ),
        pytest.param(
            _dcgm(("1", "2", "3")).replace('Hostname="h"', 'Hostname="} 1"'),
            _dcgm(("4", "5", "6")).replace('Hostname="h"', 'Hostname="} 1"'),
            "line",
            id="slot-in-label",
        ),
        pytest.param(
            _dcgm(("1", "2", "3")) + f'DCGM_FI_DEV_GPU_UTIL{{gpu="9",UUID="{UUID_A}"}} 4\n',
            _dcgm(("5", "6", "7")) + f'DCGM_FI_DEV_GPU_UTIL{{gpu="9",UUID="{UUID_A}"}} 8\n',
            "template",
            id="interleaved-family",
        ),
        pytest.param(
            _dcgm(("1", "2", "3")) + f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID_A}"}} 4\n'
            f'DCGM_FI_DEV_FB_USED{{UUID="{UUID_A}",gpu="0",Hostname="h"}} 4\n',
            _dcgm(("5", "6", "7")) + f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID_A}"}} 8\n'
            f'DCGM_FI_DEV_FB_USED{{UUID="{UUID_A}",gpu="0",Hostname="h"}} 8\n',
            "line",
            id="duplicate-series",
        ),
    ],
)
def test_second_scrape(first: str, second: str, served: str) -> None:
    """Which path serves the second of two scrapes, and that its answer is the reference's."""
    rw = Rewriter()
    plan = RewritePlan(owners=dict(OWNED))
    same(rw.rewrite(first, plan), reference(first, OWNED))
    got = rw.rewrite(second, RewritePlan(owners=dict(OWNED)))  # an equal, new plan
    same(got, reference(second, OWNED))
    assert_valid_by_oracle(got.text, second, OWNED)
    paths = {
        "template": (rw.fast_rewrites, rw.repeated_rewrites, rw.slow_rewrites) == (1, 0, 1),
        "repeat": (rw.fast_rewrites, rw.repeated_rewrites, rw.slow_rewrites) == (0, 1, 1),
        "line": (rw.fast_rewrites, rw.repeated_rewrites, rw.slow_rewrites) == (0, 0, 2),
    }
    assert paths[served], (rw.fast_rewrites, rw.repeated_rewrites, rw.slow_rewrites)
    assert got.fast == (served != "line")


def _rejected_by_prometheus(text: str) -> bool:
    """Whether a sample line of ``text`` (as these generators write them: head, one space,
    value) has a value that Prometheus rejects though prometheus_client reads it. The tables
    are checked against promtool and a real Prometheus in test_prometheus_grammar.py."""
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        tail = line[line.rindex("}") + 1 :] if "{" in line else " " + line.partition(" ")[2]
        if tail[1:] in REJECTED_VALUES:
            return True
    return False


def assert_valid_by_oracle(out: str, text: str, owners: Mapping[tuple[str, str], Owner]) -> None:
    """The oracle's view: same samples and values as ``text``, plus the intended labels."""
    try:
        if _rejected_by_prometheus(text):
            raise ValueError("a value Prometheus rejects")
        want = _expected(text, owners)
    except ValueError:
        samples(out)  # the input is not valid exposition; the output still must be
        return
    assert sorted(samples(out), key=repr) == sorted(want, key=repr)


def test_plan_change_is_never_served_from_the_template() -> None:
    rw = Rewriter()
    rw.rewrite(_dcgm(("1", "2", "3")), RewritePlan(owners=dict(OWNED)))
    other = {(UUID_A, ""): Owner("ml", "train-1", "trainer")}
    got = rw.rewrite(_dcgm(("4", "5", "6")), RewritePlan(owners=dict(other)))
    same(got, reference(_dcgm(("4", "5", "6")), other))
    assert 'pod="train-1"' in got.text
    assert rw.slow_rewrites == 2


def test_results_do_not_share_state() -> None:
    """A caller that changes a result cannot change what the next scrape gets."""
    rw = Rewriter()
    plan = RewritePlan(owners=dict(OWNED))
    first = rw.rewrite(_dcgm(("1", "2", "3")), plan)
    first.identities.clear()
    second = rw.rewrite(_dcgm(("1", "2", "3")), plan)
    third = rw.rewrite(_dcgm(("4", "5", "6")), plan)
    assert second.identities and third.identities
    assert second.identities == reference(_dcgm(("1", "2", "3")), OWNED).identities


def test_template_backs_off_when_texts_never_repeat_their_shape() -> None:
    """An upstream whose shape changes on every scrape: templates stop being built, and
    every answer is still the reference's."""
    rw = Rewriter()
    plan = RewritePlan(owners=dict(OWNED))
    for i in range(40):
        text = _dcgm(("1", "2", "3")).replace('Hostname="h"', f'Hostname="h{i}"')
        same(rw.rewrite(text, plan), reference(text, OWNED))
    assert rw.slow_rewrites == 40
    assert rw.templates_built < 10


def test_caches_follow_the_payload_not_the_uptime() -> None:
    """Pods come and go on the upstream's labels: the caches keep only what the last text
    used, so a long-running rewriter does not grow."""
    rw = Rewriter()
    plan = RewritePlan(owners=dict(OWNED))
    for epoch in range(2_000):
        text = _dcgm(("1", "2", "3")).replace('pod="p"', f'pod="p-{epoch}"')
        rw.rewrite(text, plan)
    blocks, parsed = len(rw._blocks), len(rw._parsed)  # white box: what the caches hold
    # The distinct label blocks of the last text, though 2,001 were seen: a bound of a fixed
    # size would fill with departed pods' blocks and show as growth under churn.
    assert (blocks, parsed) == (2, 2)


# Consecutive collections: one structure, several sets of values, sometimes mutated.

# Mostly what exporters write; one value in eight is odd (slow-path only, or invalid).
_VALUE_TEXT = st.integers(0, 7).flatmap(
    lambda n: (
        values.map(float_text)
        if n
        else st.sampled_from(FAST_OK + SLOW_ONLY + INVALID[1:] + PYTHON_ONLY)
    )
)


@st.composite
def collections(
    draw: st.DrawFn,
) -> tuple[list[str], list[dict[tuple[str, str], Owner]], bool]:
    """Up to four scrapes of one upstream: the same lines with new values each time, now and
    then a line added, dropped or relabelled, a plan change. Also says whether every scrape
    after the first is one the fast path must serve (clean values, same shape, same plan)."""
    text, owners = draw(expositions())
    # Split each sample line into its head and value (the generator writes "head value[ ts]").
    lines = text.rstrip("\n").split("\n")
    heads: list[str | None] = []
    for line in lines:
        if line.startswith("#"):
            heads.append(None)
        elif "{" in line:
            heads.append(line[: line.rindex("}") + 1])
        elif draw(st.booleans()):
            heads.append(line.split(" ", 1)[0] + '{job="x"}')  # most exporters label all
        else:
            heads.append(line.split(" ", 1)[0])
    texts: list[str] = []
    plans = [owners]
    clean = "}" not in "".join(h[: h.rindex("}")] for h in heads if h and "{" in h) and all(
        "{" in h for h in heads if h is not None
    )
    clean = clean and not any("}" in line for line in lines if line.startswith("#"))
    for scrape in range(draw(st.integers(2, 4))):
        out = []
        for line, head in zip(lines, heads, strict=True):
            if head is None:
                out.append(line)
                continue
            value = draw(_VALUE_TEXT)
            clean = clean and _FAST_VALUES_RE.fullmatch(value + "\n") is not None
            out.append(f"{head} {value}")
        if scrape and draw(st.integers(0, 5)) == 0:
            clean = False
            what = draw(st.sampled_from(["add", "drop", "relabel", "plan"]))
            if what == "add":
                # At the end: the oracle reads a sample that interleaves a counter family
                # differently from the same sample regrouped (test_interleaved_... covers that).
                out.append('late_family{a="1"} 1')
            elif what == "drop" and out:
                out.pop(draw(st.integers(0, len(out) - 1)))
            elif what == "relabel":
                out = [line.replace('="', '="x', 1) for line in out]
            else:
                plans.append({k: Owner("other", "pod-2", "c") for k in owners})
        texts.append("\n".join(out) + "\n")
        if len(plans) < len(texts):
            plans.append(plans[-1])
    return texts, plans, clean


# Up to four rewrites and oracle parses per example: capped so that CI's profile stays quick.
@settings(max_examples=min(settings.default.max_examples, 500))
@given(collections())
def test_fast_path_matches_line_path_and_oracle(
    case: tuple[list[str], list[dict[tuple[str, str], Owner]], bool],
) -> None:
    """Whatever came before, each scrape's rewrite is byte for byte the reference's, and the
    oracle sees the input's samples and values plus exactly the intended pod labels. Texts
    that differ only in fast-path values are served without the line-by-line pass."""
    texts, plans, clean = case
    rw = Rewriter()
    results = []
    for text, owners in zip(texts, plans, strict=True):
        got = rw.rewrite(text, RewritePlan(owners=dict(owners)))
        same(got, reference(text, owners))
        assert_valid_by_oracle(got.text, text, owners)
        results.append(got)
    first = results[0]
    expect_fast = clean and first.invalid_lines == first.dropped_duplicates == 0
    event(f"expect fast path: {expect_fast}; served fast: {sum(r.fast for r in results[1:])}")
    if expect_fast and first.dropped_reserved == 0:
        assert all(r.fast for r in results[1:]), [r.fast for r in results]


@pytest.mark.parametrize("value", FAST_OK + SLOW_ONLY, ids=repr)
def test_valid_values_are_kept(value: str) -> None:
    assert valid_value(" " + value) is not None


@pytest.mark.parametrize("value", INVALID + INVALID_TIMESTAMPS + PYTHON_ONLY, ids=repr)
def test_values_prometheus_rejects_are_dropped(value: str) -> None:
    """Finding 1: what Python reads and Prometheus does not never passes through."""
    assert valid_value(" " + value) is None
    result = Rewriter().rewrite(f'x{{a="1"}} {value}\nok 1\n', RewritePlan())
    assert result.text == 'ok{container="",namespace="",pod=""} 1\n'
    assert result.invalid_lines == 1


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('x{a="\\q"} 1', id="unknown-escape"),
        pytest.param('x{a="\\u0041"} 1', id="unicode-escape"),
        pytest.param('x{a="b\\"} 1', id="escaped-closing-quote"),
        pytest.param('x{a="\udcff"} 1', id="undecodable-byte"),
        pytest.param('x{a\u00a0="b"} 1', id="nbsp-in-block"),
        pytest.param('x\u00a0{a="b"} 1', id="nbsp-after-name"),
        pytest.param('x{a="b"}\u00a01', id="nbsp-before-value"),
        pytest.param('x{a="b"} 1\u20032', id="em-space-in-value"),
        pytest.param('x{a="b"} 1\r', id="carriage-return"),
        pytest.param("x\u00a01", id="nbsp-separator"),
        pytest.param("# HELP x bad \\q escape", id="help-unknown-escape"),
        pytest.param("# HELP x \udcff", id="help-undecodable"),
        pytest.param("# TYPE x gauge\u00a0", id="type-nbsp"),
        pytest.param("# TYPE x Gauge", id="type-case"),
    ],
)
def test_lines_prometheus_rejects_are_dropped_not_changed(line: str) -> None:
    """Findings 1 and 4: such a line is dropped and counted, never rewritten into another."""
    result = Rewriter().rewrite(line + '\nx{a="ok"} 2\n', RewritePlan())
    assert result.text == 'x{a="ok",container="",namespace="",pod=""} 2\n'
    assert result.invalid_lines == 1


@pytest.mark.parametrize(
    ("line", "out"),
    [
        pytest.param("x\t1", 'x{container="",namespace="",pod=""} 1', id="tab-separator"),
        pytest.param(" \tx 1", 'x{container="",namespace="",pod=""} 1', id="leading-blanks"),
        pytest.param(
            'x {a="b"} 1', 'x{a="b",container="",namespace="",pod=""} 1', id="blank-brace"
        ),
        pytest.param(
            'x{ a = "b" , } 1 \t',
            'x{a="b",container="",namespace="",pod=""} 1',
            id="blanks-in-block",
        ),
        pytest.param('x{a="b"}1', 'x{a="b",container="",namespace="",pod=""} 1', id="no-blank"),
        pytest.param("x 1\t\t5", 'x{container="",namespace="",pod=""} 1 5', id="tab-timestamp"),
    ],
)
def test_blanks_are_separators(line: str, out: str) -> None:
    """Spaces and tabs separate tokens anywhere the format allows them; only they do."""
    result = Rewriter().rewrite(line + "\n", RewritePlan())
    assert result.text == out + "\n"
    assert result.invalid_lines == 0


def test_cut_values_and_dedupe_agree() -> None:
    """Finding 3: two series equal once cut at 1024 characters leave as one."""
    a, b = "v" * 1024 + "a", "v" * 1024 + "b"
    result = Rewriter().rewrite(f'x{{l="{a}"}} 1\nx{{l="{b}"}} 2\n', RewritePlan())
    assert result.text.count("\n") == 1
    assert result.dropped_duplicates == 1
    samples(result.text)


def test_unwritable_characters_in_our_values() -> None:
    """Lone surrogates (a hostile annotation) are not UTF-8: U+FFFD instead; NUL is kept."""
    assert escape_label_value("a\x00b\ud800") == "a\x00b\ufffd"
    assert render_labels([("x", "\udfff")]).encode("utf-8") == '{x="\ufffd"}'.encode()
    assert unescape_label_value('a\\\\b\\"c\\nd') == 'a\\b"c\nd'


def _watched_lines(text: str, names: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """The reference for RewriteResult.watched: each name's sample lines, split the plain way,
    each cut after its last brace (a carriage return at its end dropped)."""
    lines = text.split("\n")
    out = []
    for name in names:
        for line in lines:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ", "\t"):
                line = line.rstrip("\r")
                cut = line.rfind("}") + 1
                out.append((name, line[:cut], line[cut:]))
    return tuple(out)


@settings(max_examples=min(settings.default.max_examples, 300))
@given(collections(), st.data())
def test_watched_lines_are_the_inputs_on_every_path(
    case: tuple[list[str], list[dict[tuple[str, str], Owner]], bool], data: st.DataObject
) -> None:
    """What a result hands over of the watched families (the power split reads them instead of
    the whole body) is exactly the input's lines of those names, whether the line-by-line
    path, the template or the repeated-text cache answered; a name that is only a prefix of
    another, or absent, selects nothing of the other."""
    texts, plans, _clean = case
    names = sorted({line.split("{", 1)[0].split(" ", 1)[0] for line in texts[0].split("\n")})
    names = [n for n in names if n and not n.startswith("#")]
    watch = tuple(data.draw(st.lists(st.sampled_from(names), unique=True))) if names else ()
    watch += (*tuple(n[:-1] for n in names[:1] if len(n) > 1), "absent_family")
    rw = Rewriter(watch=watch)
    paths = set()
    for text, owners in zip([*texts, texts[-1]], [*plans, plans[-1]], strict=True):
        got = rw.rewrite(text, RewritePlan(owners=dict(owners)))
        assert got.watched == _watched_lines(text, watch)
        paths.add(got.fast)
    event(f"paths: {sorted(paths)}")


# Found by `make mutate` (docs/development.md): the label policy's corners, case by case.
_DEV = (("gpu", "0"), ("UUID", UUID_A))
_OWNER = Owner("ns", "a", "c", uid="uid-a")


@pytest.mark.parametrize(
    ("pairs", "owner", "pod_labels", "expected"),
    [
        pytest.param(
            (
                *_DEV,
                ("namespace", "ns"),
                ("pod", "a"),
                ("container", "c"),
                ("team", "x"),
                ("dra_claim_name", "cl"),
                ("dra_claim_namespace", "ns"),
            ),
            _OWNER,
            {("ns", "a"): frozenset({"team"})},
            {"pod": "a", "team": "x", "dra_claim_name": "cl", "dra_claim_namespace": "ns"},
            id="the-same-pod-keeps-what-the-upstream-copied-from-it",
        ),
        pytest.param(
            (*_DEV, ("dra_claim_name", "cl"), ("dra_claim_namespace", "ns")),
            _OWNER,
            {},
            {"pod": "a", "namespace": "ns", "container": "c", "dra_claim_name": "cl"},
            id="a-series-naming-no-pod-loses-nothing",
        ),
        pytest.param(
            (*_DEV, ("pod_name", "old"), ("pod_namespace", "ons"), ("pod", "x")),
            _OWNER,
            {},
            {"pod": "a", "namespace": "ns", "container": "c", "pod_name": "old"},
            id="both-schemes-present-the-current-one-is-written",
        ),
        pytest.param(
            (*_DEV, ("namespace", "ns"), ("pod", "x"), ("pod_uid", "uid-x")),
            SHARED,
            {},
            {"pod": "", "namespace": "", "pod_uid": ""},
            id="a-shared-device-loses-the-named-pods-uid",
        ),
        pytest.param(
            (*_DEV, ("namespace", "ns"), ("pod", "a"), ("pod_uid", "uid-from-upstream")),
            Owner("ns", "a", "c"),
            {},
            {"pod": "a", "pod_uid": "uid-from-upstream"},
            id="the-same-pod-with-no-uid-known-keeps-the-upstreams",
        ),
        pytest.param(
            (*_DEV, ("namespace", "ns"), ("pod", "a"), ("pod_uid", "uid-from-upstream")),
            _OWNER,
            {},
            {"pod": "a", "pod_uid": "uid-a"},
            id="the-same-pod-takes-the-watchs-uid",
        ),
        # dcgm-exporter 4.8.4 writes pod_uid on the DRA path too (its #718, #738): it follows
        # the enricher's decision there as everywhere, with the claim's labels.
        pytest.param(
            (
                *_DEV,
                ("container", "c"),
                ("namespace", "ns"),
                ("pod", "x"),
                ("pod_uid", "uid-x"),
                ("dra_claim_name", "x-gpu"),
                ("dra_claim_namespace", "ns"),
                ("dra_driver_name", "gpu.nvidia.com"),
                ("dra_pool_name", "node-a"),
                ("dra_device_name", "gpu-0"),
            ),
            _OWNER,
            {},
            {
                "pod": "a",
                "pod_uid": "uid-a",
                "dra_claim_name": None,
                "dra_claim_namespace": None,
                "dra_driver_name": "gpu.nvidia.com",
                "dra_pool_name": "node-a",
                "dra_device_name": "gpu-0",
            },
            id="dra-series-moved-to-another-pod-takes-its-uid-and-drops-the-claim",
        ),
    ],
)
def test_relabel_corners(
    pairs: tuple[tuple[str, str], ...],
    owner: Owner,
    pod_labels: dict[tuple[str, str], frozenset[str]],
    expected: dict[str, str | None],
) -> None:
    plan = RewritePlan(owners={(UUID_A, ""): owner}, pod_labels=pod_labels)
    out = dict(relabel(pairs, device_key(pairs), plan))
    assert {name: out.get(name) for name in expected} == expected


def test_a_shape_is_shared_only_by_texts_that_differ_in_values() -> None:
    """RewriteResult.shape: the readers keep what a body's families said while the template
    serves (the same lines but for the values); a text with other lines gets another."""
    rw = Rewriter()
    a = '# TYPE m gauge\nm{UUID="GPU-1"} 1\n'
    first = rw.rewrite(a, RewritePlan())
    assert first.shape != 0 and not first.fast  # line by line, and a template built from it
    again = rw.rewrite(a.replace(" 1\n", " 2\n"), RewritePlan())
    assert again.fast and again.shape == first.shape
    repeated = rw.rewrite(a.replace(" 1\n", " 2\n"), RewritePlan())
    assert repeated.shape == first.shape
    other = rw.rewrite(a + "# TYPE n gauge\nn 3\n", RewritePlan())
    assert not other.fast and other.shape not in (0, first.shape)
    assert Rewriter(templates=False).rewrite(a, RewritePlan()).shape == 0
