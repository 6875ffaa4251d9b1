"""Every dcgm-exporter release the enricher supports, as a test: the demo's SIMULATED exporter
speaks each release's dialect (enricher.simnode.dialects: 3.3.1, 4.2.0, 4.8.2, 4.8.4, 4.9.0,
4.10.0, in Kubernetes mode, and with --kubernetes-virtual-gpus where the release has it; names
and units from the field table, enricher/dcgm_fields.json), and the real
enricher in front of it must serve the same truths on every one: valid exposition, the node
label on every series and the exporter's own host label kept, memory that adds up to the
device's own FB_USED + FB_RESERVED, power that sums to the device's draw, and a golden file
per dialect. In virtual-GPU mode, the exporter's per-pod shares and the enricher's per-container
series agree. One real Prometheus scrapes all of them at once (a cluster label per dialect)
with the shipped rules, and every dashboard query answers for each.

What is simulated, and why: the GPUs, the kubelet, the pods and /proc (no GPU or cluster
here); each dialect is written from NVIDIA's code at that release, cited in dialects.py.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.dashboard import RULES, interpolate, queries, records, variables
from devkit.prometheus import EVERY_SECOND
from enricher import demo
from enricher.fieldtable import release_key, table
from enricher.memory import MIB
from enricher.simnode.dialects import DIALECTS, NEWEST, VIRTUAL_NONE, dialect

from .conftest import SHARED_DCGM, assert_valid_exposition
from .frozendemo import T0, FrozenDemo
from .harness import assert_memory_adds_up, check_golden, memory_gaps
from .promreleases import releases, require, serve
from .test_dashboard import QUERY_NEEDS

COMBOS = [(v, False) for v in DIALECTS] + [
    (v, True) for v, d in DIALECTS.items() if d.virtual != VIRTUAL_NONE
]


def combo_id(version: str, virtual: bool) -> str:
    return f"{version}-virtual" if virtual else version


IDS = [combo_id(*c) for c in COMBOS]
# The releases that renamed the fields (4.9.0 on), and 4.8.4, the last of the old names.
RENAMED = [v for v, d in DIALECTS.items() if d.naming != table().namings[0]]
OLD_NAMES = "4.8.4"


def field_name(field: str, version: str) -> str:
    """``field``'s name (a table key) in release ``version``'s naming."""
    found = table().name(field, dialect(version).naming)
    assert found is not None, (field, version)
    return found


def upstream(version: str, virtual: bool) -> str:
    """The simulated exporter's body at the frozen demo's instant."""
    t = demo.collected_at(T0, demo.UPSTREAM_COLLECT_INTERVAL)
    return demo.render_upstream(demo.demo_gpus(lambda: T0), t, version, virtual)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FrozenDemo]]:
    """The demo's enricher over each dialect's exporter, all at the same stopped instant."""
    running: dict[str, FrozenDemo] = {}
    try:
        for version, virtual in COMBOS:
            name = combo_id(version, virtual)
            running[name] = FrozenDemo(
                tmp_path_factory.mktemp(f"demo-{name}"),
                exporter_version=version,
                virtual_gpus=virtual,
            )
        yield running
    finally:
        for frozen in running.values():
            frozen.close()


@pytest.fixture(scope="module")
def served(demos: dict[str, FrozenDemo]) -> dict[str, str]:
    out = {}
    for name, frozen in demos.items():
        with urllib.request.urlopen(f"http://127.0.0.1:{frozen.port}/metrics", timeout=10) as r:
            out[name] = r.read().decode()
    return out


# --------------------------------------------------------------------------- the dialects


def test_versions_tags_and_aliases_name_the_same_dialect() -> None:
    assert dialect("4.6.1-4.8.4") is dialect("4.8.4") is DIALECTS["4.8.4"]
    assert NEWEST == max(DIALECTS, key=release_key) == "4.10.0"
    assert dialect("3.3") is dialect("3.3.3-3.3.1")
    assert dialect("4.2").version == "4.2.0"
    assert dialect("4.9") is dialect("4.9.0") and dialect("4.9.0").tag == "4.9.0"
    assert dialect("4.10") is dialect("4.10.0") and dialect("4.10.0").tag == "4.10.0"
    assert RENAMED == ["4.9.0", "4.10.0"]
    assert [dialect(v).naming for v in RENAMED] == ["4.9", "4.10"]
    with pytest.raises(
        ValueError, match=re.escape("known: 3.3.1, 4.2.0, 4.8.2, 4.8.4, 4.9.0, 4.10.0")
    ):
        dialect("4.11.0")
    with pytest.raises(ValueError, match="no --kubernetes-virtual-gpus"):
        upstream("3.3.1", True)


@pytest.mark.parametrize(("version", "virtual"), COMBOS, ids=IDS)
def test_each_dialect_is_what_its_release_writes(version: str, virtual: bool) -> None:
    """The traits of each release's body that the enricher, rules or dashboard depend on."""
    body = upstream(version, virtual)
    families = [f.name for f in text_string_to_metric_families(body)]  # parses
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", body, re.M))
    dia = dialect(version)
    renamed = version in RENAMED
    # Every family is the table's name of a field in the release's naming.
    for family in families:
        entry = table().lookup(family)
        assert entry is not None and dia.naming in table().namings_of(family), family
    gpu0 = next(
        line for line in body.splitlines() if line.startswith(field_name("sm_clock", version))
    )
    names = re.findall(r'([A-Za-z_]+)="', gpu0)
    power = re.search(rf"^{field_name('power', version)}\{{[^}}]*\}} (\S+)$", body, re.M)
    assert power is not None
    host = "hostname" if version in ("4.8.4", *RENAMED) else "Hostname"
    assert host == table().label("host", version)
    device = ["gpu", "UUID", "pci_bus_id", "device", "modelName", host]
    if version == "3.3.1":
        device.remove("pci_bus_id")  # from 3.5.0
    if renamed:
        # The driver-version label, which NVIDIA's chart writes from 4.9.0 on.
        device.append(table().label("driver_version", version))
        assert all(
            labels[device[-1]] == demo.DEMO.driver
            for f in text_string_to_metric_families(body)
            for labels in (s.labels for s in f.samples)
        )
    else:
        assert not any(n in body for n in table().label_names("driver_version"))
    assert names[: len(device)] == device
    assert names[len(device) :] == sorted(names[len(device) :])  # attributes, Go's map order
    fb_used = field_name("fb_used", version)
    if version == "3.3.1":
        assert helps[fb_used] == "Frame buffer memory used (in MB)."
        assert 'container="",namespace="",pod=""}' in body  # on GPUs without a pod
        assert families.index(field_name("gpu_temp", version)) < families.index(
            field_name("xid", version)
        )
    else:
        unit = "bytes" if renamed else "MiB"
        assert helps[fb_used] == f"Framebuffer memory used (in {unit})."
        assert 'err_code="0",err_msg="No Error"' in body
        assert 'pod=""' not in body
    has = {f for f in table().fields if table().name(f, dia.naming) in families}
    assert ("fb_reserved" in has) == (version in ("4.8.2", "4.8.4", *RENAMED))
    assert ("gr_engine_active" in has) == (version != "3.3.1")
    # 4.9.0 on: FB_CAPACITY_BYTES by default; the PCIe rates the simulation draws from 4.9.0.
    assert ("fb_capacity" in has) == renamed
    assert ("pcie_tx_rate" in has) == ("pcie_rx_rate" in has) == renamed
    if version in ("4.8.4", *RENAMED):
        assert families == sorted(families)
        assert re.fullmatch(r"\d+(\.\d{1,3})?", power[1])
    else:
        assert re.fullmatch(r"\d+\.\d{6}", power[1])  # Go's %f
    # The dra_* labels come with --kubernetes-enable-dra (4.4.0 on).
    assert ('dra_claim_name="dra-train-0-gpu-x7k2p"' in body) == (
        version in ("4.8.2", "4.8.4", *RENAMED)
    )
    shares = [
        labels
        for labels, _ in samples(body, fb_used)
        if "pod_uid" in labels and "dra_claim_name" not in labels
    ]
    copies = [
        labels for labels, _ in samples(body, field_name("fb_free", version)) if labels.get("pod")
    ]
    if not virtual:
        assert not shares
    elif version == "4.2.0":
        # One copy per pod and nothing for the devices no pod holds (GPU 3, and GPU 7, whose
        # ResourceClaim 4.2.0 cannot see).
        assert not shares
        assert {labels["gpu"] for labels, _ in samples(body, field_name("gpu_temp", version))} == {
            "0",
            "1",
            "4",
            "5",
            "6",
        }
    else:
        assert {s["pod"] for s in shares} == {
            p.name for p in demo.PODS if p.devices and p is not demo.JUPYTER
        }
        assert {(c["gpu"], c["pod"], c.get("vgpu")) for c in copies} >= {
            ("1", demo.VLLM.name, "0"),
            ("1", demo.TRITON.name, "3"),
        }


def _by_series(body: str, version: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Each series of ``body`` by (field, its labels but the host and driver-version ones)."""
    skip = {table().label("host", version), *table().label_names("driver_version")}
    out = {}
    for f in text_string_to_metric_families(body):
        entry = table().lookup(f.name)
        assert entry is not None, f.name
        for sample in f.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k not in skip)
            out[(entry.field, labels)] = sample.value
    return out


@pytest.mark.parametrize("virtual", [False, True], ids=["", "virtual"])
@pytest.mark.parametrize("version", RENAMED)
def test_the_renamed_releases_write_the_same_node_in_their_units(
    version: str, virtual: bool
) -> None:
    """4.9.0 and 4.10.0 write the node 4.8.4 writes at the same instant, series for series,
    each value in the unit of their naming (the table's): memory in bytes (4.8's MiB x 2**20),
    utilization as a ratio (percent / 100), energy in J (mJ / 1000), clocks in Hz (MHz x
    10**6); INT64 fields as integers, DOUBLE ones in Go's shortest form."""
    old, new = upstream(OLD_NAMES, virtual), upstream(version, virtual)
    before, after = _by_series(old, OLD_NAMES), _by_series(new, version)
    # The same series but for what 4.9.0 added (FB_CAPACITY_BYTES, and the PCIe rates the
    # simulation draws from 4.9.0).
    added = {"fb_capacity", "pcie_tx_rate", "pcie_rx_rate"}
    assert set(before) == {key for key in after if key[0] not in added}
    assert {key[0] for key in after} >= added
    naming = dialect(version).naming
    for (field, labels), value in before.items():
        old_entry = table().field(field).by_naming["4.8"]
        new_entry = table().field(field).by_naming[naming]
        got = after[(field, labels)]
        assert got == value * old_entry.scale / new_entry.scale or math.isclose(
            got, value * old_entry.scale / new_entry.scale, rel_tol=1e-12
        ), (field, dict(labels), value, got)
    for field, old_unit, new_unit, factor in (
        ("fb_used", "MiB", "bytes", MIB),
        ("fb_free", "MiB", "bytes", MIB),
        ("fb_reserved", "MiB", "bytes", MIB),
        ("gpu_util", "percent", "ratio", 0.01),
        ("energy", "mJ", "J", 0.001),
        ("sm_clock", "MHz", "Hz", 10**6),
    ):
        assert table().field(field).by_naming["4.8"].unit == old_unit
        assert table().field(field).by_naming[naming].unit == new_unit
        pairs = [(v, after[key]) for key, v in before.items() if key[0] == field]
        assert pairs, field
        for was, now in pairs:
            if field in ("gpu_util", "energy"):
                assert now == was / round(1 / factor), (field, was, now)  # exactly
            else:
                assert now == was * factor, (field, was, now)
    # Memory adds up per device in bytes: used + reserved + free is the device's capacity
    # (where the three are written with the same labels: not on a pod's copy of a shared
    # device, which --kubernetes-virtual-gpus gives the used memory's share instead).
    capacity = {labels: v for (field, labels), v in after.items() if field == "fb_capacity"}
    parts = ("fb_used", "fb_reserved", "fb_free")
    whole = [labels for labels in capacity if all((f, labels) in after for f in parts)]
    assert len(whole) >= (4 if virtual else 8)
    for labels in whole:
        assert sum(after[(f, labels)] for f in parts) == capacity[labels], dict(labels)
    # Integers for INT64 fields, Go's shortest floats for DOUBLE ones.
    for line in new.splitlines():
        if line.startswith("#"):
            continue
        family, text = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
        entry = table().lookup(family)
        assert entry is not None
        if entry.unit in ("bytes", "Hz", "count", "code", "state", "celsius", "bytes/s"):
            assert re.fullmatch(r"\d+", text), line
        else:
            assert re.fullmatch(r"\d+|\d+\.\d*[1-9]", text), line


def test_the_two_renamed_releases_differ_only_in_the_pcie_rates_names() -> None:
    """4.10.0 renames the PCIe and NVLink rates and nothing the simulation draws else."""
    for virtual in (False, True):
        nine, ten = upstream("4.9.0", virtual), upstream("4.10.0", virtual)
        for f in ("pcie_tx_rate", "pcie_rx_rate"):
            assert field_name(f, "4.9.0") != field_name(f, "4.10.0")
            nine = nine.replace(field_name(f, "4.9.0") + " ", field_name(f, "4.10.0") + " ")
            nine = nine.replace(field_name(f, "4.9.0") + "{", field_name(f, "4.10.0") + "{")
        assert sorted(nine.splitlines()) == sorted(ten.splitlines())


def test_every_dialects_body_passes_promtool(promtools: list[str]) -> None:
    """promtool (each Prometheus release the tests run) parses every release's body; its lint
    remarks (camelCase labels, counters without _total) are the exporter's own names."""
    for version, virtual in COMBOS:
        body = upstream(version, virtual)
        for promtool in promtools:
            assert_valid_exposition(promtool, body)


def test_the_4_8_4_dialect_matches_a_real_body_of_its_line() -> None:
    """4.8.4's inferred traits against a real body written by a build newer than 4.8.2."""
    capture = SHARED_DCGM / "pr-736-mixed-models-mig-lowercase-hostname.prom"
    if not capture.exists():
        pytest.skip("../shared is absent")
    real = capture.read_text()
    ours = upstream("4.8.4", False)
    real_helps = dict(re.findall(r"^# HELP (\S+) (.*)$", real, re.M))
    our_helps = dict(re.findall(r"^# HELP (\S+) (.*)$", ours, re.M))
    shared = set(real_helps) & set(our_helps)
    assert "DCGM_FI_DEV_FB_FREE" in shared  # the capture in ../shared is an excerpt
    assert {n: real_helps[n] for n in shared} == {n: our_helps[n] for n in shared}
    real_families = [f.name for f in text_string_to_metric_families(real)]
    assert real_families == sorted(real_families)
    real_line = re.search(r'^DCGM_FI_DEV_FB_FREE\{gpu="1",([^}]*)\}', real, re.M)
    our_line = re.search(r'^DCGM_FI_DEV_FB_FREE\{gpu="1",([^}]*)\}', ours, re.M)
    assert real_line is not None and our_line is not None
    real_names = re.findall(r'([A-Za-z_]+)="', real_line[1])
    our_names = re.findall(r'([A-Za-z_]+)="', our_line[1])
    assert real_names[:5] == our_names[:5]  # UUID, pci_bus_id, device, modelName, hostname


# --------------------------------------------------------------------------- the enricher


@pytest.mark.parametrize("name", IDS)
def test_the_enricher_serves_the_same_truths_on_every_release(
    served: dict[str, str], name: str, update_golden: bool
) -> None:
    text = served[name]
    version = name.removesuffix("-virtual")
    host = table().label("host", version)
    all_samples = [
        (f.name, dict(s.labels)) for f in text_string_to_metric_families(text) for s in f.samples
    ]
    assert all_samples
    assert all(labels.get("node") == demo.NODE for _, labels in all_samples)
    dcgm = [labels for fam, labels in all_samples if fam.startswith("DCGM_FI_")]
    assert dcgm and all(labels[host] == demo.EXPORTER_HOST for labels in dcgm)
    assert memory_gaps(text)  # the enricher's series and the exporter's memory fields
    assert_memory_adds_up(text)
    # Power: the containers' watts and the unattributed watts sum to the device's draw.
    draw = {labels["gpu"]: v for labels, v in samples(text, field_name("power", version))}
    parts: dict[str, float] = defaultdict(float)
    for family in ("gpu_container_power_watts", "gpu_unattributed_power_watts"):
        for labels, v in samples(text, family):
            parts[labels["gpu"]] += v
    assert draw and set(draw) <= set(parts)
    assert all(abs(parts[gpu] - watts) < 1e-6 for gpu, watts in draw.items()), (draw, parts)
    # The attribution does not depend on the release: the training job's container is on GPU 0.
    trainer = [
        labels
        for labels, _ in samples(text, "gpu_container_memory_used_bytes")
        if labels["pod"] == demo.TRAIN.name
    ]
    assert [t["gpu"] for t in trainer] == ["0"]
    # The golden holds the workload series (the upstream's and the enricher's), not its own
    # self-metrics, which tests/golden/node.out and the other goldens keep.
    workload = "".join(
        line + "\n"
        for line in text.splitlines()
        if re.match(r"(# (HELP|TYPE) )?(DCGM_|gpu_)", line)
    )
    check_golden(f"demo-{name}", workload, update_golden)


@pytest.mark.parametrize("version", [v for v, d in DIALECTS.items() if d.virtual == "shares"])
def test_the_exporters_per_pod_shares_agree_with_the_containers(
    served: dict[str, str], version: str
) -> None:
    """4.8.2 on, --kubernetes-virtual-gpus: each pod's FB_USED share (its processes' memory,
    whole MiB each) and GPU_UTIL share (their SM %) is what the enricher's per-container series
    say of the same pod on the same device, in the same collection, within the exporter's
    rounding (a MiB, or half a percent, per process); from 4.9.0 in bytes and as a ratio."""
    body = upstream(version, True)
    text = served[combo_id(version, True)]
    procs: dict[tuple[str, str, str], int] = defaultdict(int)
    for p in demo.PROCS:
        if p.pod is not None:
            procs[(str(p.gpu), "" if p.gi is None else str(p.gi), p.pod.name)] += 1
    checked = 0
    for key_, family, si_slack in (
        ("fb_used", "gpu_container_memory_used_bytes", float(MIB)),
        ("gpu_util", "gpu_container_utilization_ratio", 0.005),
    ):
        entry = table().field(key_).by_naming[dialect(version).naming]
        field, scale, slack = entry.name, 1 / entry.scale, si_slack / entry.scale
        ours: dict[tuple[str, str, str], float] = defaultdict(float)
        for labels, v in samples(text, family):
            ours[(labels["gpu"], labels.get("GPU_I_ID", ""), labels["pod"])] += v * scale
        for labels, share in samples(body, field):
            if "pod_uid" not in labels:
                continue
            key = (labels["gpu"], labels.get("GPU_I_ID", ""), labels["pod"])
            n = procs.get(key, 0)
            if n == 0:
                assert share == 0 and ours.get(key, 0.0) == 0.0, key
                continue
            if key_ == "gpu_util" and key[1]:
                continue  # NVML has no per-process SM data on a MIG instance
            assert share - 1e-9 <= ours[key] + slack * n and ours[key] <= share + slack * n, (
                field,
                key,
                share,
                ours[key],
            )
            checked += 1
    assert checked >= 10


# --------------------------------------------------------------------------- one Prometheus

# Panels whose answer is not each release's to give: here, a rate of the enricher's upstream
# collections, which the stopped clock stops (tests/test_dashboard.py runs it on the live demo).
FROZEN = {
    "enricher/dcgm-enricher/Upstream requests per collection/A",
    "enricher/dcgm-enricher/Upstream requests per collection/B",
}
# Panels that read what some releases do not write: none so far (each panel that reads a field
# some release lacks also reads what stands for it).
NOT_IN: dict[str, set[str]] = {}


@pytest.fixture(scope="module")
def prometheus(
    demos: dict[str, FrozenDemo], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One Prometheus scraping every dialect's demo, each under its own cluster label, with the
    shipped rules. The newest release only: what varies here is dcgm-exporter's release;
    Prometheus 2.42 and 3.5 run every query and rule over the default demo in
    test_dashboard.py."""
    prom_release = require(releases()[-1])
    tmp = tmp_path_factory.mktemp(f"versions-{prom_release.id}")
    jobs = [
        {
            **frozen.scrape_job(),
            "job_name": f"dcgm-enricher-{name}",
        }
        for name, frozen in demos.items()
    ]
    for job, name in zip(jobs, demos, strict=True):
        job["relabel_configs"] = [
            *job["relabel_configs"],
            {"target_label": "job", "replacement": "dcgm-enricher"},
            {"target_label": "cluster", "replacement": name},
        ]
    config = {
        "global": EVERY_SECOND,
        "scrape_configs": jobs,
        "rule_files": [str(RULES)],
    }
    with serve(prom_release, config, tmp) as server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            up = _query(server.url, 'count_over_time(up{job="dcgm-enricher"}[1m]) >= 3')
            if len(up) == len(demos):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape every demo:\n" + server.log_tail())
        yield server.url


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
            return list(json.load(r)["data"]["result"])
    except OSError:
        return []


def _clusters(url: str, expr: str, want: set[str]) -> set[str]:
    """The clusters ``expr`` answers for, once it answers for all of ``want`` or after 20 s;
    ``{"*"}`` for an answer that aggregates the clusters away."""
    deadline = time.monotonic() + 20
    got: set[str] = set()
    while time.monotonic() < deadline:
        result = _query(url, expr)
        got = {s["metric"].get("cluster", "*") for s in result}
        if got >= want or got == {"*"}:
            break
        time.sleep(0.5)
    return got


@pytest.mark.parametrize(
    "query",
    [q for q in queries() if q.id not in QUERY_NEEDS and q.id not in FROZEN],
    ids=lambda q: q.id,
)
def test_every_dashboard_query_answers_for_every_release(prometheus: str, query: Any) -> None:
    want = set(IDS) - NOT_IN.get(query.id, set())
    got = _clusters(prometheus, interpolate(query.expr, ""), want)
    assert got == {"*"} or got >= want, f"{query.id}: no answer for {sorted(want - got)}"


@pytest.mark.parametrize("record", records())
def test_every_record_keeps_every_release(prometheus: str, record: str) -> None:
    got = _clusters(prometheus, record, set(IDS))
    assert got >= set(IDS), f"{record}: no series for {sorted(set(IDS) - got)}"


def test_the_node_variable_lists_the_node_on_every_release(prometheus: str) -> None:
    """The dashboard's Node variable, per cluster (one per release and mode), lists the node."""
    query = variables()["node"]["query"]["query"]
    found = re.fullmatch(r"label_values\((.*), node\)", interpolate(query, ""))
    assert found is not None, query
    got = _query(prometheus, f"count by (cluster, node) ({found[1]})")
    assert {(s["metric"].get("cluster"), s["metric"].get("node")) for s in got} == {
        (name, demo.NODE) for name in IDS
    }


def test_every_record_that_keeps_the_node_keeps_it_on_every_release(prometheus: str) -> None:
    kept = 0
    for record in records():
        result = _query(prometheus, record)
        if any("node" in s["metric"] for s in result):
            kept += 1
            assert all(s["metric"].get("node") == demo.NODE for s in result), record
    assert kept >= 8


def test_no_alert_describes_a_blank_node_on_any_release(prometheus: str) -> None:
    """Every alert the demo's situations set off (pending or firing) names the node, on every
    release and mode."""
    deadline = time.monotonic() + 20
    alerts: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        alerts = [s["metric"] for s in _query(prometheus, "ALERTS")]
        if {a.get("cluster") for a in alerts} >= set(IDS):
            break
        time.sleep(0.5)
    assert {a.get("cluster") for a in alerts} >= set(IDS)
    assert all(a.get("node") == demo.NODE for a in alerts), [
        a for a in alerts if a.get("node") != demo.NODE
    ]


# --------------------------------------------------------------------------- the same numbers

# Each renamed release against 4.8.4 in the same mode: the same demo at the same instant, so
# every query, record and alert must say the same of each.
RENAMED_PAIRS = [
    (combo_id(v, virtual), combo_id("4.8.4", virtual))
    for v, virtual in COMBOS
    if table().naming_of_release(v) != "4.8"
]
# Labels that name the release, not the workload: the cluster label of this Prometheus and
# the driver-version label (renamed in 4.9.0, and written by the simulated 4.9.0 on).
RELEASE_LABELS = frozenset({"cluster", *table().label_names("driver_version")})


def _by_cluster(result: list[dict[str, Any]]) -> dict[str, dict[frozenset[Any], float]]:
    out: dict[str, dict[frozenset[Any], float]] = defaultdict(dict)
    for s in result:
        labels = s["metric"]
        key = frozenset((k, v) for k, v in labels.items() if k not in RELEASE_LABELS)
        out[labels.get("cluster", "*")][key] = float(s["value"][1])
    return out


def _same(a: float, b: float) -> bool:
    """Equal within the exporters' rounding: 4.8 writes whole percent where 4.9 writes a
    ratio (0.005 apart at most), and whole MiB."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=0.01, abs_tol=0.006)


def _assert_same_answers(url: str, expr: str, what: str, values: bool = True) -> None:
    # Every demo was scraped three times before the fixture yielded: a few seconds more for a
    # record's first evaluations, not the 20 s a query that answers for none is given above.
    deadline = time.monotonic() + 5
    while True:
        got = _by_cluster(_query(url, expr))
        if all(new in got and old in got for new, old in RENAMED_PAIRS) or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(0.5)
    if set(got) <= {"*"}:
        return  # aggregated over the clusters: nothing to compare release by release
    for new, old in RENAMED_PAIRS:
        assert (new in got) == (old in got), f"{what}: answers for only one of {new}, {old}"
        if old not in got:
            continue
        assert set(got[new]) == set(got[old]), f"{what}: other series on {new} than on {old}"
        differ = {
            tuple(sorted(k)): (got[old][k], got[new][k])
            for k in got[old]
            if values and not _same(got[old][k], got[new][k])
        }
        assert not differ, f"{what}: {new} differs from {old} (4.8.4, new): {differ}"


# The GPU / Enricher dashboard's queries read the enricher's own process (its CPU, its scrapes,
# its sources' timings): each demo's, which no release of the exporter decides.
OWN_PROCESS = "enricher/"


@pytest.mark.parametrize(
    "query",
    [
        q
        for q in queries()
        if q.id not in QUERY_NEEDS and q.id not in FROZEN and not q.id.startswith(OWN_PROCESS)
    ],
    ids=lambda q: q.id,
)
def test_every_dashboard_query_gives_the_same_numbers_on_the_renamed_releases(
    prometheus: str, query: Any
) -> None:
    """A GPU holding 40 GiB shows 40 GiB and one at 97 % shows 97 % on either naming: each
    query answers for 4.9.0 and 4.10.0 with the series and values it gives for 4.8.4."""
    # A range function (increase over a day, ...) counts the scrapes each demo has had, which
    # differ by when it started: such a query must give the same series, its values may not.
    expr = interpolate(query.expr, "")
    _assert_same_answers(prometheus, expr, query.id, values=re.search(r"\[[^\]]+\]", expr) is None)


@pytest.mark.parametrize("record", records())
def test_every_record_gives_the_same_numbers_on_the_renamed_releases(
    prometheus: str, record: str
) -> None:
    _assert_same_answers(prometheus, record, record)


def test_the_alerts_fire_alike_on_the_renamed_releases(prometheus: str) -> None:
    """The same alerts, pending or firing, for the same devices and pods on each naming."""
    _assert_same_answers(prometheus, "ALERTS", "ALERTS")
