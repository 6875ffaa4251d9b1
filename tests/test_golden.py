"""Golden tests: the whole pipeline through the real aiohttp app, compared byte for byte.

Real parts: dcgm-exporter-shaped text served over HTTP by aiohttp, pynvml against the fake
libnvidia-ml built from C (no GPU on this machine), a /proc tree on disk read by the real
ProcfsSource, and the real kubernetes client watching pods on the API-server stand-in (no
cluster here). ``pytest --update-golden`` rewrites tests/golden/*.out.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.nvmlfake import default_mig_uuid, nvml_state_of
from enricher.commands import resolve
from enricher.config import Config
from enricher.model import GpuDevice, MigDevice, ProcessKind
from enricher.simnode import fakeproc
from enricher.simnode.api import make_pod, pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode, SimPod, SimProc

from .conftest import as_prometheus_client_writes, assert_valid_exposition
from .harness import (
    MakeStack,
    Stack,
    assert_memory_adds_up,
    check_golden,
    cid,
    process_reasons,
    series,
)

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"
NODE = "gpu-node-a"
U = [
    "GPU-0a0a0a0a-0000-4000-8000-000000000000",
    "GPU-1b1b1b1b-1111-4111-8111-111111111111",
    "GPU-2c2c2c2c-2222-4222-8222-222222222222",
    "GPU-3d3d3d3d-3333-4333-8333-333333333333",
]
STATIC_HASH = "6f1d8c2e9a7b4c3d2e1f0a9b8c7d6e5f"


# This node is not the demo's (enricher.demo): its golden files pin its own corner cases.
GPU = "nvidia.com/gpu"
JUPYTER = SimPod(
    "jupyterhub",
    "jupyter-alice",
    "11111111-aaaa-4aaa-8aaa-000000000001",
    "notebook",
    cid(0x1),
    None,
    None,
    annotations=(("hub.jupyter.org/username", 'alice "the admin"@example.com'),),
    labels=(
        ("hub.jupyter.org/username", "alice-20-22the-20admin-22-40example-2ecom"),
        ("team", "data"),
    ),
)
VLLM = SimPod(
    "inference",
    "vllm-6b7c9d-abcde",
    "22222222-bbbb-4bbb-8bbb-000000000002",
    "vllm",
    cid(0x2),
    ("ReplicaSet", "vllm-6b7c9d"),
    GPU,
    labels=(("pod-template-hash", "6b7c9d"),),
    cgroup_style="crio",
)
TRITON = SimPod(
    "inference",
    "triton-0",
    "33333333-cccc-4ccc-8ccc-000000000003",
    "triton",
    cid(0x3),
    ("StatefulSet", "triton"),
    GPU,
    cgroup_style="cgroupfs",
)
BERT = SimPod(
    "research",
    "bert-0",
    "44444444-dddd-4ddd-8ddd-000000000004",
    "trainer",
    cid(0x4),
    ("Job", "bert-finetune"),
    GPU,
    qos="guaranteed",
)
STATIC = SimPod(
    "kube-system",
    f"gpu-probe-{NODE}",
    "55555555-eeee-4eee-8eee-000000000005",
    "probe",
    cid(0x5),
    None,
    GPU,
    mirror_of=STATIC_HASH,
    cgroup_style="cgroupfs",
    qos="besteffort",
)
PODS = [JUPYTER, VLLM, TRITON, BERT, STATIC]


GONE = SimPod(
    "ml", "deleted-0", "99999999-ffff-4fff-8fff-000000000009", "c", cid(0x9), None, GPU
)  # deleted since: the API server no longer holds it
GIB_MIB = 1024
GOLDEN_NODE = SimNode(
    NODE,
    tuple(
        GpuDevice(i, uuid, "NVIDIA A100-SXM4-80GB", mig_enabled=i == 2) for i, uuid in enumerate(U)
    ),
    tuple(
        MigDevice(U[2], 2, gi, 0, default_mig_uuid(2, gi, 0), profile)
        for gi, profile in ((1, "3g.40gb"), (2, "2g.20gb"), (3, "1g.10gb"))
    ),
    (
        SimProc(1001, "python", 0, None, 6 * GIB_MIB, 0.0, JUPYTER, samples=((100, 40), (200, 60))),
        SimProc(
            1002,
            "python",
            0,
            None,
            1 * GIB_MIB,
            0.0,
            JUPYTER,
            also=(ProcessKind.GRAPHICS,),
            samples=((150, 10),),
        ),
        SimProc(2001, "python3", 1, None, 20 * GIB_MIB, 0.0, VLLM, samples=((100, 70),)),
        SimProc(2002, "tritonserver", 1, None, 12 * GIB_MIB, 0.0, TRITON, samples=((100, 20),)),
        SimProc(2003, "python", 1, None, 2 * GIB_MIB, 0.0, GONE),
        SimProc(2004, "python", 1, None, 3 * GIB_MIB, 0.0, None, exited=True),
        SimProc(3001, "python", 2, 1, 30 * GIB_MIB, 0.0, BERT),
        SimProc(
            3002,
            "gpu-burn",
            2,
            2,
            9 * GIB_MIB,
            0.0,
            None,
            host_cgroup="/system.slice/gpu-burn.service",
        ),
        SimProc(3003, "probe", 2, 3, None, 0.0, STATIC),
    ),
    tuple(PODS),
    first_ticks=1000,
    ticks_apart=1,
)
BOOT = 1_700_000_000


def write_proc(root: Path) -> None:
    write_proc_tree(root, GOLDEN_NODE, BOOT + 86_400)


def pod_objects() -> list[dict[str, Any]]:
    """The node's pods as the API server holds them, and one pod of another node."""
    return [pod_object(p, NODE) for p in PODS] + [
        make_pod("elsewhere", "default", node="gpu-node-b")
    ]


@pytest.fixture
def node_factory(full_stack: MakeStack) -> Callable[..., Awaitable[Stack]]:
    """This node on the full stack, with ``upstream_text`` served (None: the exporter is
    down) and ``config`` on top of the per-scrape config."""

    def make(upstream_text: str | None, **config: Any) -> Awaitable[Stack]:
        return full_stack(
            upstream=upstream_text,
            nvml=nvml_state_of(GOLDEN_NODE),
            proc=write_proc,
            node=NODE,
            pods=pod_objects(),
            kube={"annotation_keys": ["hub.jupyter.org/username"], "label_keys": ["team"]},
            kube_pod_labels=("team",),
            upstream_timeout=2.0,
            **config,
        )

    return make


async def scrape(node: Stack) -> str:
    resp = await node.client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return await resp.text()


async def test_node_golden(node_factory: Any, update_golden: bool, promtools: list[str]) -> None:
    node = await node_factory((FIXTURES / "node.prom").read_text())
    text = await scrape(node)
    check_golden("node", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)


@pytest.mark.parametrize(
    "spelling",
    [
        pytest.param("Hostname", id="4.8.2-Hostname"),
        pytest.param("hostname", id="4.8.4-hostname"),
        pytest.param("", id="no-host-label"),
    ],
)
async def test_every_series_names_the_node(node_factory: Any, spelling: str) -> None:
    """Every series served (dcgm-exporter's, the enricher's families, its self-metrics and its
    process families) carries ``node``, this node's Kubernetes name, whatever dcgm-exporter
    calls its own label and whatever it holds there (here the exporter pod's name, as NVIDIA's
    chart without NODE_NAME writes it); the upstream's own label stays as it came."""
    upstream = (FIXTURES / "node.prom").read_text()
    if spelling != "Hostname":
        host = ',Hostname="dcgm-exporter-7xk2p"'
        upstream = upstream.replace(host, f',{spelling}="dcgm-exporter-7xk2p"' if spelling else "")
    node = await node_factory(upstream)
    assert node.scraper.config.node == NODE
    families = list(text_string_to_metric_families(await scrape(node)))
    names = {f.name for f in families}
    assert {"DCGM_FI_DEV_GPU_TEMP", "gpu_container_memory_used_bytes"} <= names
    assert {"dcgm_enricher_scrapes", "process_resident_memory_bytes"} <= names
    for family in families:
        for sample in family.samples:
            assert sample.labels.get("node") == NODE, sample
            if spelling and sample.name.startswith("DCGM_FI_"):
                assert sample.labels[spelling] == "dcgm-exporter-7xk2p", sample


# dcgm-exporter 4.8.4's --enable-exporter-metrics adds Go's client_golang families about the
# exporter process itself (go_*, process_*, promhttp_*).
EXPORTER_METRICS = """# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 5.1e+07
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
# HELP promhttp_metric_handler_requests_total Total number of scrapes by HTTP status code.
# TYPE promhttp_metric_handler_requests_total counter
promhttp_metric_handler_requests_total{code="200"} 7
"""


async def test_the_exporters_own_metrics_never_collide_with_the_enrichers(
    node_factory: Any,
) -> None:
    """go_* and promhttp_* pass through (with the node); the exporter's process_* are dropped,
    since the enricher serves its own process_* under those names (two families of one name
    would make the scrape fail): the process_* served are the enricher's own."""
    upstream = (FIXTURES / "node.prom").read_text() + EXPORTER_METRICS
    node = await node_factory(upstream)
    text = await scrape(node)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in families["go_goroutines"].samples] == [42]
    assert [
        (s.labels["code"], s.value) for s in families["promhttp_metric_handler_requests"].samples
    ] == [("200", 7)]
    (rss,) = families["process_resident_memory_bytes"].samples
    assert rss.value != 5.1e7  # the enricher's own, not the exporter's
    assert text.count("# TYPE process_resident_memory_bytes ") == 1


async def test_node_golden_in_the_default_following_mode(
    node_factory: Any, update_golden: bool
) -> None:
    """Following the upstream (the default) serves the same bytes as a scrape that reads
    everything itself."""
    node = await node_factory(
        (FIXTURES / "node.prom").read_text(),
        upstream_follow_step=Config().upstream_follow_step,
    )
    assert node.scraper.config.upstream_follow_step > 0
    check_golden("node", await scrape(node), update=False)  # waits for the first poll
    prepared = await scrape(node)  # served from what the follower prepared
    counter = f'\ndcgm_enricher_scrapes_total{{node="{NODE}"}} '
    assert counter + "2.0\n" in prepared
    check_golden("node", prepared.replace(counter + "2.0\n", counter + "1.0\n"), update=False)


# The self-metrics that move with every scrape; the others are written once per collection.
PER_SCRAPE_FAMILIES = (
    "dcgm_enricher_upstream_requests_total",
    "dcgm_enricher_upstream_collections_total",
    "dcgm_enricher_scrapes_total",
    "dcgm_enricher_shared_scrapes_total",
    "dcgm_enricher_node_page_requests_total",
    "dcgm_enricher_scrape_duration_seconds",
    "dcgm_enricher_kubernetes_last_sync_timestamp_seconds",
    "dcgm_enricher_response_bytes_total",
)


def _own_text(text: str) -> str:
    """The dcgm_enricher_* lines of a body (with their HELP and TYPE), as text."""
    return "".join(line + "\n" for line in text.split("\n") if "dcgm_enricher_" in line)


def _own(text: str) -> tuple[list[str], list[str]]:
    """The dcgm_enricher_* lines of a body: (written per collection, written per scrape)."""
    own = [line for line in text.split("\n") if "dcgm_enricher_" in line]
    moving = [line for line in own if any(name in line for name in PER_SCRAPE_FAMILIES)]
    return [line for line in own if line not in moving], moving


async def test_self_metrics_of_a_collection_are_written_once_and_stay_current(
    node_factory: Any,
) -> None:
    """Following the upstream, a collection's self-metrics are written once and served to
    each of its scrapes; the per-scrape counters are current on every scrape; a new collection
    writes them again, with the process's own figures. Each body's own families are what
    prometheus_client writes for them."""
    upstream = (FIXTURES / "node.prom").read_text()
    node = await node_factory(upstream, upstream_follow_step=Config().upstream_follow_step)
    runtime_reads = []
    render = node.scraper.self_metrics.runtime.render

    def counted() -> bytes:
        runtime_reads.append(1)
        return render()

    node.scraper.self_metrics.runtime.render = counted  # type: ignore[method-assign]
    bodies = [await scrape(node) for _ in range(3)]
    fixed = [_own(body)[0] for body in bodies]
    assert fixed[0] == fixed[1] == fixed[2] and fixed[0]
    counts = [series(body, "dcgm_enricher_scrapes_total")[0]["__value__"] for body in bodies]
    assert counts == ["1.0", "2.0", "3.0"]
    # The process's own figures are read with the collection's (docs/metrics.md).
    runtime = [
        [ln for ln in b.split("\n") if ln.startswith(("process_", "python_"))] for b in bodies
    ]
    assert runtime[0] == runtime[1] == runtime[2] and runtime[0]
    # Read with the collection (again only if a poll came between the scrapes), not per scrape.
    assert 1 <= len(runtime_reads) < len(bodies)
    assert _own(as_prometheus_client_writes(_own_text(bodies[-1]))) == _own(bodies[-1])

    def samples(body: str) -> str:
        return series(body, "dcgm_enricher_upstream_samples")[0]["__value__"]

    assert node.upstream is not None
    node.upstream.body = upstream + 'DCGM_FI_DEV_GPU_TEMP{gpu="99",UUID="GPU-new"} 30\n'
    before = samples(bodies[-1])
    for _ in range(100):  # the follower sees the new collection within its rhythm
        body = await scrape(node)
        if samples(body) != before:
            break
        await asyncio.sleep(0.05)
    assert float(samples(body)) == float(before) + 1
    assert _own(as_prometheus_client_writes(_own_text(body))) == _own(body)


async def test_node_attribution(node_factory: Any) -> None:
    """The golden file's meaning, asserted: who is named where, and why not elsewhere."""
    node = await node_factory((FIXTURES / "node.prom").read_text())
    text = await scrape(node)
    util = {s["UUID"] + s.get("GPU_I_ID", ""): s for s in series(text, "DCGM_FI_DEV_GPU_UTIL")}
    # GPU 0: only the Jupyter pod's processes, though it never requested a GPU.
    assert (util[U[0]]["namespace"], util[U[0]]["pod"], util[U[0]]["container"]) == (
        "jupyterhub",
        "jupyter-alice",
        "notebook",
    )
    # GPU 1: shared by two pods plus unknown processes: nobody is named on the device series,
    # even though dcgm-exporter's own mapping named vllm.
    assert (util[U[1]]["pod"], util[U[1]]["namespace"]) == ("", "")
    # GPU 3: no process: the upstream's allocation mapping stays.
    assert util[U[3]]["pod"] == "reserved-0"
    fb = {s["UUID"] + "/" + s.get("GPU_I_ID", ""): s for s in series(text, "DCGM_FI_DEV_FB_USED")}
    assert fb[f"{U[2]}/1"]["pod"] == "bert-0"
    assert fb[f"{U[2]}/2"]["pod"] == ""  # the host process's instance
    assert fb[f"{U[2]}/3"]["pod"] == f"gpu-probe-{NODE}"  # static pod via its mirror
    mem = {
        (s["UUID"], s.get("GPU_I_ID", ""), s["pod"]): float(s["__value__"])
        for s in series(text, "gpu_container_memory_used_bytes")
    }
    gib = float(1 << 30)
    assert mem[(U[0], "", "jupyter-alice")] == 7 * gib  # 1002's graphics entry deduplicated
    assert mem[(U[1], "", "vllm-6b7c9d-abcde")] == 20 * gib
    assert mem[(U[1], "", "triton-0")] == 12 * gib
    assert mem[(U[2], "1", "bert-0")] == 30 * gib
    assert (U[2], "3", f"gpu-probe-{NODE}") not in mem  # NVML could not say: no series
    utils = {
        (s["UUID"], s["pod"]): float(s["__value__"])
        for s in series(text, "gpu_container_utilization_ratio")
    }
    assert utils[(U[0], "jupyter-alice")] == pytest.approx(0.5 + 0.1)
    assert utils[(U[1], "vllm-6b7c9d-abcde")] == pytest.approx(0.7)
    assert all(u != U[2] for u, _ in utils)  # MIG: NVML has no per-process data
    unattr = {
        (s["UUID"], s.get("GPU_I_ID", ""), s["reason"]): float(s["__value__"])
        for s in process_reasons(text)
    }
    assert unattr == {
        (U[1], "", "pod_not_found"): 2 * gib,
        (U[1], "", "process_exited"): 3 * gib,
        (U[2], "2", "host_process"): 9 * gib,
    }
    # The memory no listed process holds makes each device's memory add up (this fixture's
    # FB_USED is below its processes' memory on most devices: not_in_process_list is 0
    # there); on the probe's instance, whose process NVML gives no figure for, it is all.
    assert_memory_adds_up(text)
    rest = {
        (s["UUID"], s.get("GPU_I_ID", "")): float(s["__value__"])
        for s in series(text, "gpu_unattributed_memory_used_bytes")
        if s["reason"] == "not_in_process_list"
    }
    probe = float(fb[f"{U[2]}/3"]["__value__"]) * (1 << 20)
    assert rest[(U[2], "3")] == probe > 0
    info = {s["pod"]: s for s in series(text, "gpu_pod_info")}
    assert set(info) == {
        "jupyter-alice",
        "vllm-6b7c9d-abcde",
        "triton-0",
        "bert-0",
        f"gpu-probe-{NODE}",
    }
    assert info["jupyter-alice"]["gpu_requested"] == "false"
    assert info["jupyter-alice"]["annotation_hub_jupyter_org_username"] == (
        'alice "the admin"@example.com'
    )
    assert info["jupyter-alice"]["label_team"] == "data"
    assert (
        info["vllm-6b7c9d-abcde"]["workload_kind"],
        info["vllm-6b7c9d-abcde"]["workload_name"],
    ) == ("Deployment", "vllm")
    assert info["bert-0"]["workload_kind"] == "Job"
    ups = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}
    assert ups == {"upstream": "1.0", "nvml": "1.0", "procfs": "1.0", "kubernetes": "1.0"}
    procs = {s["state"]: s["__value__"] for s in series(text, "dcgm_enricher_gpu_processes")}
    assert procs == {"attributed": "6.0", "unattributed": "3.0"}


async def test_old_namespace_golden(
    node_factory: Any, update_golden: bool, promtools: list[str]
) -> None:
    node = await node_factory((FIXTURES / "node-old-namespace.prom").read_text())
    text = await scrape(node)
    check_golden("node-old-namespace", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    rows = {s["uuid"]: s for s in series(text, "dcgm_gpu_util")}
    assert rows[U[0]]["pod_name"] == "jupyter-alice"
    assert rows[U[0]]["pod_namespace"] == "jupyterhub"
    assert rows[U[0]]["pod"] == ""  # present and empty: blocks Prometheus's target label
    # Our families copy the upstream's identity labels, in its scheme.
    mem = series(text, "gpu_container_memory_used_bytes")
    assert {"uuid", "hostname"} <= set(mem[0])


async def test_upstream_down_still_serves(
    node_factory: Any, update_golden: bool, promtools: list[str]
) -> None:
    node = await node_factory(None)
    text = await scrape(node)
    check_golden("upstream-down", text, update_golden)
    ups = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}
    assert ups["upstream"] == "0.0"
    assert ups["nvml"] == "1.0"
    # Device labels fall back to NVML's view, in the exporter's current scheme.
    mem = series(text, "gpu_container_memory_used_bytes")
    # NVML's device labels in dcgm-exporter's current scheme (hostname, 4.8.3 on), and the
    # enricher's node label.
    assert mem and all(
        m["hostname"] == m["node"] == NODE and m["UUID"].startswith("GPU-") for m in mem
    )
    for promtool in promtools:
        assert_valid_exposition(promtool, text)


async def test_node_page_is_not_counted_as_a_scrape(node_factory: Any) -> None:
    node = await node_factory((FIXTURES / "node.prom").read_text())
    for _ in range(3):  # the first reads the node itself (no scrape yet), the others reuse it
        resp = await node.client.get("/")
        assert resp.status == 200
        assert "<html" in (await resp.text()).lower()
    text = await scrape(node)
    here = {"node": NODE}
    assert series(text, "dcgm_enricher_scrapes_total") == [here | {"__value__": "1.0"}]
    assert series(text, "dcgm_enricher_shared_scrapes_total") == [here | {"__value__": "0.0"}]
    assert series(text, "dcgm_enricher_node_page_requests_total") == [here | {"__value__": "3.0"}]


async def test_process_collector(node_factory: Any) -> None:
    node = await node_factory((FIXTURES / "node.prom").read_text(), collector_process=True)
    text = await scrape(node)
    rows = {s["pid"]: s for s in series(text, "gpu_process_memory_used_bytes")}
    assert rows["2001"]["pod"] == "vllm-6b7c9d-abcde"
    assert rows["2001"]["process_name"] == "python3"
    assert rows["3002"]["pod"] == ""
    assert "3003" not in rows  # memory not available


async def test_identity_survives_upstream_outage(node_factory: Any) -> None:
    """Once seen, the upstream's device labels stay on our families while it is down, so
    the series do not change identity during a short outage."""
    node = await node_factory((FIXTURES / "node.prom").read_text())
    first = series(await scrape(node), "gpu_container_memory_used_bytes")
    assert node.upstream is not None
    await node.upstream.stop()
    second_text = await scrape(node)
    assert {s["source"]: s["__value__"] for s in series(second_text, "dcgm_enricher_source_up")}[
        "upstream"
    ] == "0.0"
    assert series(second_text, "gpu_container_memory_used_bytes") == first


# dcgm-exporter's options that write more about the pod it names. Each is applied to the node's
# upstream as dcgm-exporter would: on the series of the pods it (sometimes wrongly) named.
_NAMED = {
    "vllm-6b7c9d-abcde": (VLLM.uid, {"pod_template_hash": "6b7c9d"}),  # known to the watch
    "reserved-0": ("00000000-dead-4bad-8bad-000000000000", {"team": "a"}),  # unknown to it
    "bert-0": (BERT.uid, {}),
}
_OPTIONS = {
    # --kubernetes-enable-pod-uid
    "pod-uid": lambda uid, labels: f'pod_uid="{uid}"',
    # --kubernetes-enable-pod-labels: the named pod's label keys, sanitised
    "pod-labels": lambda uid, labels: ",".join(f'{k}="{v}"' for k, v in labels.items()),
    # DRA: the claim of the named pod's allocation, and the device's own dra_* labels
    "dra": lambda uid, labels: (
        'dra_claim_name="claim-x",dra_claim_namespace="ml",'
        'dra_driver_name="gpu.nvidia.com",dra_pool_name="gpu-node-a",dra_device_name="gpu-0"'
    ),
}


_GHOST = 'container="old",namespace="ml",pod="ghost-0",team="b",app_kubernetes_io_name="ghost"'


def _with_option(text: str, option: str) -> str:
    if option == "pod-labels":
        # GPU 0 named after a pod the watch never knew (deleted since): only the names given
        # with --upstream.pod-labels (team) can be told apart from the device's labels.
        text = text.replace(
            'UUID="GPU-0a0a0a0a-0000-4000-8000-000000000000",pci_bus_id="00000000:10:00.0",'
            'device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dcgm-exporter-7xk2p",'
            'container="",namespace="",pod=""',
            'UUID="GPU-0a0a0a0a-0000-4000-8000-000000000000",pci_bus_id="00000000:10:00.0",'
            'device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dcgm-exporter-7xk2p",'
            + _GHOST,
        )
    out = []
    for line in text.splitlines():
        for pod, (uid, labels) in _NAMED.items():
            extra = _OPTIONS[option](uid, labels)
            if f'pod="{pod}"' in line and extra:
                line = line.replace(f'pod="{pod}"', f'pod="{pod}",{extra}')
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("option", list(_OPTIONS))
async def test_pod_identity_golden(
    node_factory: Any, update_golden: bool, promtools: list[str], option: str
) -> None:
    """Finding 2 of issue 12: every label about a pod follows the enricher's decision."""
    upstream = _with_option((FIXTURES / "node.prom").read_text(), option)
    node = await node_factory(upstream, upstream_pod_labels=("team",))
    text = await scrape(node)
    check_golden(f"pod-identity-{option}", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    for s in series(text, "DCGM_FI_DEV_FB_USED"):
        # Whatever the option, no series keeps a label of a pod it no longer names.
        if s.get("pod") != "vllm-6b7c9d-abcde":
            assert "pod_template_hash" not in s, s
        if s.get("pod") != "reserved-0":
            assert "team" not in s, s
            assert s.get("pod_uid", "") != _NAMED["reserved-0"][0], s
        if s.get("pod") == "bert-0":
            assert s.get("pod_uid", BERT.uid) == BERT.uid, s
        if s["UUID"].startswith("GPU-0a0a") and option == "pod-labels":
            assert s["pod"] == "jupyter-alice"
            assert "team" not in s  # named by --upstream.pod-labels
            assert s["app_kubernetes_io_name"] == "ghost"  # not named: cannot be told apart
        if "dra_driver_name" in s:
            assert s["dra_device_name"] == "gpu-0"  # the device's own: kept
            if s["pod"] not in _NAMED:
                assert "dra_claim_name" not in s, s


# A process in VLLM's container whose cgroup names TRITON's pod UID: the two pieces of
# evidence disagree, so neither /metrics nor resolve may name a pod for it.
MISMATCHED = SimProc(
    4001,
    "python",
    3,
    None,
    1 * GIB_MIB,
    0.0,
    VLLM,
    cgroup=fakeproc.cgroup_v2_systemd(TRITON.uid, VLLM.container_id),
)
MISMATCH_NODE = replace(GOLDEN_NODE, procs=(*GOLDEN_NODE.procs, MISMATCHED))


async def test_resolve_agrees_with_metrics_on_every_pid(full_stack: MakeStack) -> None:
    """`dcgm-enricher resolve` names the pod and container that /metrics names for every PID
    of the golden node (plus one whose cgroup and container disagree), through the same pod
    watch: it used to look a pod up by container ID, then by pod UID, and named a pod where
    /metrics said cgroup_pod_mismatch."""
    node = await full_stack(
        upstream=(FIXTURES / "node.prom").read_text(),
        nvml=nvml_state_of(MISMATCH_NODE),
        proc=lambda root: write_proc_tree(root, MISMATCH_NODE, BOOT + 86_400),
        node=NODE,
        pods=pod_objects(),
        collector_process=True,
    )
    text = await scrape(node)
    served = {
        int(s["pid"]): (s["namespace"], s["pod"], s["container"])
        for s in series(text, "gpu_process_memory_used_bytes")
    }
    assert 4001 in served and len(served) >= 8
    reasons = {(s["UUID"], s["reason"]) for s in series(text, "gpu_unattributed_memory_used_bytes")}
    assert (U[3], "cgroup_pod_mismatch") in reasons
    assert node.cache is not None
    out = io.StringIO()
    cfg = replace(node.config, procfs=str(node.proc_root))
    resolve(cfg, sorted(served), out, pods=node.cache)
    said = {rec["pid"]: rec for rec in map(json.loads, out.getvalue().splitlines())}
    for pid, owner in served.items():
        rec = said[pid]
        assert (rec.get("namespace", ""), rec.get("pod", ""), rec.get("container") or "") == (
            owner
        ), rec
    assert said[4001]["reason"] == "cgroup_pod_mismatch"
