"""Allocation awareness through the real app: who was given each GPU, who uses it, the waste.

One node has every situation the PodResources source is for: an allocated GPU with no process,
a GPU time-sliced between two pods (renamed resource nvidia.com/gpu.shared), an MPS GPU (the
server and two clients), a MIG GPU with pods on two instances (one idle), a Jupyter pod using a
GPU it never requested, and a finished job that holds its memory at zero utilization.

Real parts: the aiohttp app, dcgm-exporter-shaped text over HTTP (it has no pod mapping of its
own here), pynvml against the fake libnvidia-ml built from C (no GPU here), a /proc tree on
disk, the kubernetes client watching the API-server stand-in (no cluster here), a real gRPC
server on a unix socket speaking the kubelet's PodResources API (no kubelet here), and
Prometheus's own PromQL engine (promtool test rules) for the waste queries.
``pytest --update-golden`` rewrites tests/golden/allocation.out.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from devkit.nvmlfake import FakeNvmlState
from devkit.promtool import held_series, run_rule_tests, selector
from enricher.config import Config
from enricher.model import DeviceAllocation
from enricher.simnode import fakeproc
from enricher.simnode.api import pod_object
from enricher.simnode.kubelet import allocations as pod_allocations
from enricher.simnode.kubelet import list_response
from enricher.simnode.node import SimPod

from .conftest import assert_valid_exposition
from .harness import (
    MakeStack,
    Stack,
    assert_memory_adds_up,
    check_golden,
    cid,
    process_reasons,
    series,
)

FIXTURE = Path(__file__).parent / "fixtures" / "upstream" / "allocation.prom"
NODE = "gpu-node-c"
MODEL = "NVIDIA H100 80GB HBM3"
U = [
    "GPU-a0a0a0a0-0000-4000-8000-0000000000a0",  # allocated, no process
    "GPU-a1a1a1a1-1111-4111-8111-1111111111a1",  # time-sliced between two pods
    "GPU-a2a2a2a2-2222-4222-8222-2222222222a2",  # MPS: server and two clients
    "GPU-a3a3a3a3-3333-4333-8333-3333333333a3",  # MIG: pods on two instances
    "GPU-a4a4a4a4-4444-4444-8444-4444444444a4",  # a Jupyter pod that never requested it
    "GPU-a5a5a5a5-5555-4555-8555-5555555555a5",  # allocated, memory held at zero utilization
]
MIG_1 = "MIG-b3b3b3b3-0001-4001-8001-0000000000b1"  # GPU 3, GPU_I_ID 1 (3g.40gb)
MIG_2 = "MIG-b3b3b3b3-0002-4002-8002-0000000000b2"  # GPU 3, GPU_I_ID 2 (2g.20gb)
GIB = 1 << 30


# This node is not the demo's (enricher.demo): allocation.out pins its own corner cases.
TRAIN_QUEUED = SimPod(
    "ml",
    "train-queued-0",
    "a0000000-0000-4000-8000-000000000001",
    "trainer",
    cid(0xA1),
    ("Job", "train-queued"),
    "nvidia.com/gpu",
    devices=(U[0],),
)
CHAT_A = SimPod(
    "inference",
    "chat-7c9d8b6f5-abcde",
    "a0000000-0000-4000-8000-000000000002",
    "server",
    cid(0xA2),
    ("ReplicaSet", "chat-7c9d8b6f5"),
    "nvidia.com/gpu.shared",
    devices=(f"{U[1]}::0",),
)
CHAT_B = SimPod(
    "inference",
    "chat-7c9d8b6f5-fghij",
    "a0000000-0000-4000-8000-000000000003",
    "server",
    cid(0xA3),
    ("ReplicaSet", "chat-7c9d8b6f5"),
    "nvidia.com/gpu.shared",
    devices=(f"{U[1]}::3",),
)
MPS_DAEMON = SimPod(
    "nvidia-device-plugin",
    "nvidia-device-plugin-mps-control-daemon-x7k2p",
    "a0000000-0000-4000-8000-000000000004",
    "mps-control-daemon",
    cid(0xA4),
    ("DaemonSet", "nvidia-device-plugin-mps-control-daemon"),
    None,
    # The plugin Helm chart's pod labels: --mps.daemon-pod-selector's default admits it.
    labels=(
        ("app.kubernetes.io/name", "nvidia-device-plugin"),
        ("app.kubernetes.io/instance", "nvdp"),
    ),
)
EMBED_A = SimPod(
    "search",
    "embed-a-0",
    "a0000000-0000-4000-8000-000000000005",
    "embedder",
    cid(0xA5),
    ("StatefulSet", "embed-a"),
    "nvidia.com/gpu",
    devices=(f"{U[2]}::0",),
)
EMBED_B = SimPod(
    "search",
    "embed-b-0",
    "a0000000-0000-4000-8000-000000000006",
    "embedder",
    cid(0xA6),
    ("StatefulSet", "embed-b"),
    "nvidia.com/gpu",
    devices=(f"{U[2]}::1",),
)
BERT = SimPod(
    "research",
    "bert-0",
    "a0000000-0000-4000-8000-000000000007",
    "trainer",
    cid(0xA7),
    ("StatefulSet", "bert"),
    "nvidia.com/mig-3g.40gb",
    devices=(MIG_1,),
)
EVAL = SimPod(
    "research",
    "eval-0",
    "a0000000-0000-4000-8000-000000000008",
    "eval",
    cid(0xA8),
    ("StatefulSet", "eval"),
    "nvidia.com/mig-2g.20gb",
    devices=(MIG_2,),
)
JUPYTER = SimPod(
    "jupyterhub",
    "jupyter-bob",
    "a0000000-0000-4000-8000-000000000009",
    "notebook",
    cid(0xA9),
    None,
    None,
    annotations=(("hub.jupyter.org/username", "bob"),),
)
FINISHED = SimPod(
    "ml",
    "finetune-done-0",
    "a0000000-0000-4000-8000-00000000000a",
    "trainer",
    cid(0xAA),
    ("Job", "finetune-done"),
    "nvidia.com/gpu",
    devices=(U[5],),
)
PODS = [TRAIN_QUEUED, CHAT_A, CHAT_B, MPS_DAEMON, EMBED_A, EMBED_B, BERT, EVAL, JUPYTER, FINISHED]

# What the kubelet says besides the pods above: a MIG device NVML does not know (a stale
# allocation) and a device that is not a GPU.
OTHER_ALLOCATIONS = [
    DeviceAllocation(
        "ml",
        "ghost-0",
        "main",
        "nvidia.com/mig-1g.10gb",
        "MIG-dead0000-0000-4000-8000-000000000000",
    ),
    DeviceAllocation("ml", "fpga-job-0", "main", "example.com/fpga", "fpga-0"),
]


def allocations() -> list[DeviceAllocation]:
    return pod_allocations(PODS) + OTHER_ALLOCATIONS


def write_proc(root: Path) -> None:
    procs = [
        (1101, "python", CHAT_A),
        (1201, "python", CHAT_B),
        (1301, "nvidia-cuda-mps-server", MPS_DAEMON),
        (1401, "python", EMBED_A),
        (1402, "python", EMBED_B),
        (1501, "python", BERT),
        (1601, "python", JUPYTER),
        (1701, "python", FINISHED),
    ]
    fakeproc.write_proc_stat(root, 1_700_000_000)
    for i, (pid, comm, p) in enumerate(procs):
        cgroup = fakeproc.cgroup_v2_systemd(p.uid, p.container_id)
        fakeproc.write_process(root, pid, comm=comm, cgroup=cgroup, start_ticks=1000 + i)


def nvml_state() -> FakeNvmlState:
    s = FakeNvmlState(driver="550.90.07")
    for i, uuid in enumerate(U):
        s.gpu(uuid=uuid, name=MODEL, mig=(i == 3))
    s.mig(3, gi=1, profile="3g.40gb", uuid=MIG_1).mig(3, gi=2, profile="2g.20gb", uuid=MIG_2)
    s.process(1101, gpu=1, memory=8 * GIB).process(1201, gpu=1, memory=6 * GIB)
    # MPS: the server in the compute list, its clients in the MPS list.
    s.process(1301, gpu=2, memory=GIB // 2)
    s.process(1401, gpu=2, memory=3 * GIB, kind="mps")
    s.process(1402, gpu=2, memory=2 * GIB, kind="mps")
    s.process(1501, gpu=3, gi=1, ci=0, memory=30 * GIB)
    s.process(1601, gpu=4, memory=5 * GIB)
    s.process(1701, gpu=5, memory=20 * GIB)
    s.util(1101, 100, 35, gpu=1).util(1201, 100, 10, gpu=1)
    s.util(1401, 100, 25, gpu=2).util(1402, 100, 15, gpu=2)
    s.util(1601, 100, 20, gpu=4)
    s.util(1701, 100, 0, gpu=5).util(1701, 200, 0, gpu=5)
    s.fail("nvmlDeviceGetProcessUtilization", 3, gpu=3)  # NOT_SUPPORTED, as on MIG
    return s


def pod_objects() -> list[dict[str, Any]]:
    return [pod_object(p, NODE) for p in PODS]


@pytest.fixture
def node_factory(full_stack: MakeStack) -> Callable[..., Awaitable[Stack]]:
    def make(respond: Callable[[Any], Any] | None = None, **config: Any) -> Awaitable[Stack]:
        """A node whose kubelet answers with ``respond`` (default: the allocations above);
        ``kubelet=False``: no kubelet socket at all."""
        with_kubelet = config.pop("kubelet", True)
        response = list_response(allocations())
        return full_stack(
            upstream=FIXTURE.read_text(),
            nvml=nvml_state(),
            proc=write_proc,
            node=NODE,
            pods=pod_objects(),
            kube={"annotation_keys": ["hub.jupyter.org/username"]},
            podresources=True,
            kubelet=(respond or (lambda _ctx: response)) if with_kubelet else None,
            base=Config(),  # the default (following) mode, unlike the other golden files
            **config,
        )

    return make


async def scrape(node: Stack) -> str:
    return await node.scrape()


def by_device(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["UUID"], r.get("GPU_I_ID", "")): r for r in rows}


def who(row: dict[str, str]) -> tuple[str, str, str]:
    return (row["namespace"], row["pod"], row["container"])


# --------------------------------------------------------------------------- golden


async def test_allocation_golden(
    node_factory: Any, update_golden: bool, promtools: list[str]
) -> None:
    node = await node_factory()
    text = await scrape(node)
    check_golden("allocation", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)


async def test_device_series_name_the_allocated_or_working_pod(node_factory: Any) -> None:
    """The golden file's meaning: what each device series names, and why."""
    text = await scrape(await node_factory())
    temp = by_device(series(text, "DCGM_FI_DEV_GPU_TEMP"))
    fb = by_device(series(text, "DCGM_FI_DEV_FB_USED"))
    # GPU 0: no process at all, and the upstream has no mapping: the kubelet's allocation.
    assert who(temp[(U[0], "")]) == ("ml", "train-queued-0", "trainer")
    # GPU 1: time-sliced, both pods run: a device value cannot be split.
    assert who(temp[(U[1], "")]) == ("", "", "")
    # GPU 2: MPS with two clients; the MPS server is not a third party, nor does it count.
    assert who(temp[(U[2], "")]) == ("", "", "")
    # GPU 3 (MIG): the busy instance by its process, the idle one by its allocation.
    assert who(fb[(U[3], "1")]) == ("research", "bert-0", "trainer")
    assert who(fb[(U[3], "2")]) == ("research", "eval-0", "eval")
    assert who(temp[(U[3], "")]) == ("research", "bert-0", "trainer")  # process evidence first
    # GPU 4: the Jupyter pod's process, though nobody allocated it the GPU.
    assert who(temp[(U[4], "")]) == ("jupyterhub", "jupyter-bob", "notebook")
    # GPU 5: its process (holding memory, idle) and its allocation agree.
    assert who(temp[(U[5], "")]) == ("ml", "finetune-done-0", "trainer")


async def test_allocation_and_usage_families(node_factory: Any) -> None:
    text = await scrape(await node_factory())
    allocated = {
        (r["UUID"], r.get("GPU_I_ID", ""), r["pod"], r["resource"]): r
        for r in series(text, "gpu_container_allocated")
    }
    assert set(allocated) == {
        (U[0], "", "train-queued-0", "nvidia.com/gpu"),
        (U[1], "", CHAT_A.name, "nvidia.com/gpu.shared"),
        (U[1], "", CHAT_B.name, "nvidia.com/gpu.shared"),
        (U[2], "", "embed-a-0", "nvidia.com/gpu"),
        (U[2], "", "embed-b-0", "nvidia.com/gpu"),
        (U[3], "1", "bert-0", "nvidia.com/mig-3g.40gb"),
        (U[3], "2", "eval-0", "nvidia.com/mig-2g.20gb"),
        (U[5], "", "finetune-done-0", "nvidia.com/gpu"),
    }
    assert all(r["__value__"] == "1.0" for r in allocated.values())
    # Device labels copied from the upstream, as on every gpu_container_* series.
    mig = allocated[(U[3], "2", "eval-0", "nvidia.com/mig-2g.20gb")]
    assert (mig["GPU_I_PROFILE"], mig["Hostname"], mig["modelName"]) == (
        "2g.20gb",
        "dcgm-exporter-q8w4n",
        MODEL,
    )
    # Every sharing container has its own usage, MPS clients included; the server has none.
    mem = {
        (r["UUID"], r["pod"]): float(r["__value__"])
        for r in series(text, "gpu_container_memory_used_bytes")
    }
    assert mem[(U[1], CHAT_A.name)] == 8 * GIB and mem[(U[1], CHAT_B.name)] == 6 * GIB
    assert mem[(U[2], "embed-a-0")] == 3 * GIB and mem[(U[2], "embed-b-0")] == 2 * GIB
    assert not any(pod == MPS_DAEMON.name for _, pod in mem)
    util = {
        (r["UUID"], r["pod"]): float(r["__value__"])
        for r in series(text, "gpu_container_utilization_ratio")
    }
    assert util[(U[2], "embed-a-0")] == pytest.approx(0.25)
    assert util[(U[5], "finetune-done-0")] == 0.0
    unattr = {(r["UUID"], r["reason"]): float(r["__value__"]) for r in process_reasons(text)}
    assert unattr == {(U[2], "mps_server"): GIB / 2}
    assert_memory_adds_up(text)
    info = {r["pod"]: r for r in series(text, "gpu_pod_info")}
    assert MPS_DAEMON.name not in info
    assert info["jupyter-bob"]["gpu_requested"] == "false"
    self_metrics = {
        name: [r["__value__"] for r in series(text, name)]
        for name in (
            "dcgm_enricher_podresources_allocated_devices",
            "dcgm_enricher_podresources_unmapped_devices",
        )
    }
    assert self_metrics == {
        "dcgm_enricher_podresources_allocated_devices": ["8.0"],
        "dcgm_enricher_podresources_unmapped_devices": ["1.0"],  # the stale MIG device
    }
    up = {r["source"]: r["__value__"] for r in series(text, "dcgm_enricher_source_up")}
    assert up["podresources"] == "1.0"


# --------------------------------------------------------------------------- failure modes


async def test_kubelet_error_degrades_to_process_evidence(node_factory: Any) -> None:
    def respond(ctx: Any) -> Any:
        ctx.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")

    node = await node_factory(respond)
    text = await scrape(node)
    up = {r["source"]: r["__value__"] for r in series(text, "dcgm_enricher_source_up")}
    assert up["podresources"] == "0.0"
    errors = {
        r["source"]: r["__value__"] for r in series(text, "dcgm_enricher_source_errors_total")
    }
    assert errors["podresources"] == "1.0"
    assert series(text, "gpu_container_allocated") == []
    temp = by_device(series(text, "DCGM_FI_DEV_GPU_TEMP"))
    # No allocation known: the idle GPU keeps the upstream's labels (none, here)...
    assert who(temp[(U[0], "")]) == ("", "", "")
    # ... and process evidence works as before.
    assert who(temp[(U[4], "")]) == ("jupyterhub", "jupyter-bob", "notebook")


async def test_missing_kubelet_socket_is_down_not_disabled(node_factory: Any) -> None:
    node = await node_factory(kubelet=False)
    text = await scrape(node)
    enabled = {r["source"]: r["__value__"] for r in series(text, "dcgm_enricher_source_enabled")}
    up = {r["source"]: r["__value__"] for r in series(text, "dcgm_enricher_source_up")}
    assert (enabled["podresources"], up["podresources"]) == ("1.0", "0.0")
    assert series(text, "gpu_container_allocated") == []


async def test_kubelet_switched_off_is_disabled(node_factory: Any) -> None:
    node = await node_factory(kubelet=False, kubelet_enabled=False)
    assert node.scraper.node.given("podresources") is None
    text = await scrape(node)
    enabled = {r["source"]: r["__value__"] for r in series(text, "dcgm_enricher_source_enabled")}
    up = {r["source"] for r in series(text, "dcgm_enricher_source_up")}
    assert enabled["podresources"] == "0.0" and "podresources" not in up


async def test_concurrent_scrapes_share_one_kubelet_call(node_factory: Any) -> None:
    entered = threading.Event()
    release = threading.Event()
    response = list_response(allocations())

    def respond(_ctx: Any) -> Any:
        entered.set()
        release.wait(10)
        return response

    node = await node_factory(respond, kubelet_timeout=10.0)
    scrapes = [asyncio.create_task(scrape(node)) for _ in range(3)]
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        # Hold the kubelet until the other two scrapes have joined the one in flight.
        for _ in range(1000):
            if node.scraper.counters.shared_scrapes == 2:
                break
            await asyncio.sleep(0.01)
    finally:
        release.set()
    bodies = await asyncio.gather(*scrapes)
    assert node.kubelet is not None
    assert (node.kubelet.calls, node.kubelet.max_concurrent) == (1, 1)
    assert node.scraper.counters.shared_scrapes == 2
    assert len(set(bodies)) == 1
    assert len(series(bodies[0], "gpu_container_allocated")) == 8


# --------------------------------------------------------------------------- waste, in PromQL

# The queries the dashboard and alerts use (docs/metrics.md, "Shared GPUs and waste"), run here
# by Prometheus's engine over the series this node exports, held for an hour.
ALLOCATED_NO_PROCESS = """
group by (namespace, pod, container, resource, UUID, GPU_I_ID) (
  gpu_container_allocated
  unless on (namespace, pod, UUID, GPU_I_ID) gpu_container_memory_used_bytes
)"""
ALLOCATED_ZERO_UTILIZATION = """
group by (namespace, pod, container, resource, UUID, GPU_I_ID) (
  gpu_container_allocated
  and on (namespace, pod, UUID, GPU_I_ID)
  (max_over_time(gpu_container_utilization_ratio[1h]) == 0)
)"""
USED_WITHOUT_REQUEST = """
sum by (namespace, pod, UUID, GPU_I_ID) (gpu_container_memory_used_bytes)
  and on (namespace, pod) gpu_pod_info{gpu_requested="false"}
  unless on (namespace, pod) gpu_container_allocated"""
MEMORY_HELD_WHILE_IDLE = """
sum by (namespace, pod, container, UUID, GPU_I_ID) (
  gpu_container_memory_used_bytes
  and on (namespace, pod, container, UUID, GPU_I_ID)
  (max_over_time(gpu_container_utilization_ratio[30m]) == 0)
)"""


def promtool_waste_test(text: str, tmp_path: Path, promtool: str) -> str:
    """Run the waste queries over ``text`` held for 60 minutes; returns promtool's output."""
    series = held_series(text, 60, ("gpu_",))

    def sample(labels: dict[str, str], value: float) -> dict[str, Any]:
        return {"labels": selector("", labels), "value": value}

    tests = [
        (
            ALLOCATED_NO_PROCESS,
            [
                sample(
                    {
                        "namespace": "ml",
                        "pod": "train-queued-0",
                        "container": "trainer",
                        "resource": "nvidia.com/gpu",
                        "UUID": U[0],
                    },
                    1,
                ),
                sample(
                    {
                        "namespace": "research",
                        "pod": "eval-0",
                        "container": "eval",
                        "resource": "nvidia.com/mig-2g.20gb",
                        "UUID": U[3],
                        "GPU_I_ID": "2",
                    },
                    1,
                ),
            ],
        ),
        (
            ALLOCATED_ZERO_UTILIZATION,
            [
                sample(
                    {
                        "namespace": "ml",
                        "pod": "finetune-done-0",
                        "container": "trainer",
                        "resource": "nvidia.com/gpu",
                        "UUID": U[5],
                    },
                    1,
                )
            ],
        ),
        (
            USED_WITHOUT_REQUEST,
            [sample({"namespace": "jupyterhub", "pod": "jupyter-bob", "UUID": U[4]}, 5 * GIB)],
        ),
        (
            MEMORY_HELD_WHILE_IDLE,
            [
                sample(
                    {
                        "namespace": "ml",
                        "pod": "finetune-done-0",
                        "container": "trainer",
                        "UUID": U[5],
                    },
                    20 * GIB,
                )
            ],
        ),
    ]
    checks = [
        {"expr": expr.strip(), "eval_time": "60m", "exp_samples": samples}
        for expr, samples in tests
    ]
    res = run_rule_tests(promtool, tmp_path / "waste-test.yml", series, checks, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


async def test_waste_is_derivable_in_promql(
    node_factory: Any, tmp_path: Path, promtools: list[str]
) -> None:
    text = await scrape(await node_factory())
    for i, promtool in enumerate(promtools):
        (tmp := tmp_path / f"prom{i}").mkdir()
        assert "SUCCESS" in promtool_waste_test(text, tmp, promtool)


async def test_waste_queries_fail_on_the_wrong_answer(
    node_factory: Any, tmp_path: Path, promtools: list[str]
) -> None:
    """The check above can fail: with no allocations known, the expected idle pods vanish."""

    def respond(ctx: Any) -> Any:
        ctx.abort(grpc.StatusCode.INTERNAL, "down")

    text = await scrape(await node_factory(respond))
    for i, promtool in enumerate(promtools):
        (tmp := tmp_path / f"prom{i}").mkdir()
        with pytest.raises(AssertionError, match="FAILED"):
            promtool_waste_test(text, tmp, promtool)
