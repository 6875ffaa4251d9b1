"""``dcgm-enricher demo``: the real pipeline on a SIMULATED node, for a newcomer with no GPU.

Everything simulated is in this module and says so: the GPUs (a stand-in for NVML), the
dcgm-exporter it serves (an HTTP server on loopback), the /proc tree (written to a temporary
directory) and the node's pods (a fixed list instead of a watch). What runs on top is the real
thing: the upstream fetch over HTTP, the procfs reader and cgroup parser, attribution, the
rewrite and the HTTP server.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from . import fakeproc
from .app import Scraper, make_app, serve
from .config import Config
from .exposition import FamilyWriter
from .kube import build_index, parse_pod
from .model import GpuDevice, GpuProcess, GpuSnapshot, MigDevice, PodIndex, PodInfo, ProcessKind
from .procfs import ProcReader

GIB = 2**30
NODE = "demo-gpu-node-1"
EXPORTER_POD = "dcgm-exporter-demo"


@dataclass(frozen=True)
class SimPod:
    namespace: str
    name: str
    uid: str
    container: str
    container_id: str
    owner: tuple[str, str] | None
    gpu_request: str | None  # resource name requested, None when the pod asked for no GPU
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    cgroup_style: str = "systemd"  # systemd | cgroupfs | crio


@dataclass(frozen=True)
class SimProc:
    pid: int
    comm: str
    gpu: int
    gi: int | None
    base_mib: int  # memory swings around this
    util: float  # mean SM utilization 0..1
    pod: SimPod | None  # None: a host process
    kind: ProcessKind = ProcessKind.COMPUTE


def _cid(n: int) -> str:
    return f"{n:02x}" * 32


TRAIN = SimPod(
    "ml-team",
    "train-llama-4kq9z",
    "3f1c2b4a-6d7e-4f80-9a1b-2c3d4e5f6a70",
    "trainer",
    _cid(0xA1),
    ("Job", "train-llama"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
)
VLLM = SimPod(
    "inference",
    "vllm-7d9f8c6b5-k2x4p",
    "5b6c7d8e-9f01-4a2b-8c3d-4e5f60718293",
    "vllm",
    _cid(0xB2),
    ("ReplicaSet", "vllm-7d9f8c6b5"),
    "nvidia.com/gpu",
    labels=(("pod-template-hash", "7d9f8c6b5"), ("team", "serving")),
)
TRITON = SimPod(
    "inference",
    "triton-5c6d7f8b9-p8m2n",
    "6c7d8e9f-0a1b-4c2d-9e3f-405162738495",
    "triton",
    _cid(0xC3),
    ("ReplicaSet", "triton-5c6d7f8b9"),
    "nvidia.com/gpu",
    labels=(("pod-template-hash", "5c6d7f8b9"), ("team", "serving")),
    cgroup_style="crio",
)
BERT = SimPod(
    "research",
    "bert-finetune-0",
    "7d8e9f0a-1b2c-4d3e-8f40-516273849506",
    "trainer",
    _cid(0xD4),
    ("StatefulSet", "bert-finetune"),
    "nvidia.com/mig-3g.40gb",
    labels=(("team", "nlp"),),
    cgroup_style="cgroupfs",
)
JUPYTER = SimPod(
    "jupyterhub",
    "jupyter-alice",
    "8e9f0a1b-2c3d-4e4f-9051-627384950617",
    "notebook",
    _cid(0xE5),
    None,
    None,
    labels=(
        ("hub.jupyter.org/username", "alice-40example-2ecom"),
        ("component", "singleuser-server"),
    ),
    annotations=(("hub.jupyter.org/username", "alice@example.com"),),
)
PODS = (TRAIN, VLLM, TRITON, BERT, JUPYTER)

GPUS = (
    GpuDevice(0, "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(1, "GPU-1e2f3a4b-5c6d-7e8f-90a1-b2c3d4e5f607", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(
        2, "GPU-2f3a4b5c-6d7e-8f90-a1b2-c3d4e5f60718", "NVIDIA A100-SXM4-80GB", mig_enabled=True
    ),
    GpuDevice(3, "GPU-3a4b5c6d-7e8f-90a1-b2c3-d4e5f6071829", "NVIDIA A100-SXM4-80GB"),
)
MIGS = (
    MigDevice(GPUS[2].uuid, 2, 1, 0, "MIG-4b5c6d7e-8f90-5a1b-b2c3-d4e5f607182a", "3g.40gb"),
    MigDevice(GPUS[2].uuid, 2, 5, 0, "MIG-5c6d7e8f-905a-6b1c-c3d4-e5f607182a3b", "2g.20gb"),
    MigDevice(GPUS[2].uuid, 2, 13, 0, "MIG-6d7e8f90-5a6b-7c1d-d4e5-f607182a3b4c", "1g.10gb"),
)
PROCS = (
    SimProc(4101, "python", 0, None, 31_000, 0.82, TRAIN),
    SimProc(4102, "pt_data_worker", 0, None, 1_200, 0.05, TRAIN),
    SimProc(5201, "python3", 1, None, 20_500, 0.45, VLLM),
    SimProc(5301, "tritonserver", 1, None, 12_000, 0.30, TRITON),
    SimProc(6101, "python", 2, 1, 30_000, 0.0, BERT),  # MIG: NVML has no per-process SM data
    SimProc(7001, "python3", 2, 5, 9_000, 0.0, None),  # a host process (systemd service)
    SimProc(8101, "python", 3, None, 6_000, 0.15, JUPYTER, ProcessKind.COMPUTE),
)
# What dcgm-exporter's own PodResources mapping says: it sees only pods that requested a GPU,
# and on the time-sliced GPU it names just one of the two pods.
UPSTREAM_PODS: dict[tuple[int, int | None], SimPod] = {
    (0, None): TRAIN,
    (1, None): VLLM,
    (2, 1): BERT,
}


def _wave(t: float, period: float, phase: float) -> float:
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period) + phase)


class SimulatedGpus:
    """SIMULATED stand-in for NVML: the demo's GPUs with memory and utilization that move."""

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self.errors_total = 0

    def proc_memory(self, proc: SimProc, t: float) -> int:
        return int((proc.base_mib * (0.9 + 0.2 * _wave(t, 120, proc.pid))) * 2**20)

    def proc_util(self, proc: SimProc, t: float) -> float | None:
        if proc.gi is not None:
            return None
        return round(min(1.0, proc.util * (0.7 + 0.6 * _wave(t, 45, proc.pid))), 3)

    def fetch(self) -> GpuSnapshot:
        t = self._clock()
        procs = tuple(
            GpuProcess(
                GPUS[p.gpu].uuid,
                p.gpu,
                p.gi,
                p.pid,
                self.proc_memory(p, t),
                self.proc_util(p, t),
                frozenset({p.kind}),
            )
            for p in PROCS
        )
        return GpuSnapshot(GPUS, MIGS, procs, driver_version="550.90.07 (simulated)", taken_at=t)


def write_proc_tree(root: Path, now: float) -> None:
    """Write the SIMULATED /proc tree: one directory per demo process with stat and cgroup."""
    fakeproc.write_proc_stat(root, int(now) - 86_400)
    for i, proc in enumerate(PROCS):
        pod = proc.pod
        if pod is None:
            cgroup = fakeproc.cgroup_host("/system.slice/gpu-benchmark.service")
        elif pod.cgroup_style == "cgroupfs":
            cgroup = fakeproc.cgroup_v1_cgroupfs(pod.uid, pod.container_id, qos="guaranteed")
        elif pod.cgroup_style == "crio":
            cgroup = fakeproc.cgroup_v2_systemd(pod.uid, pod.container_id, runtime="cri-o")
        else:
            cgroup = fakeproc.cgroup_v2_systemd(pod.uid, pod.container_id)
        fakeproc.write_process(
            root, proc.pid, comm=proc.comm, cgroup=cgroup, start_ticks=100_000 + i * 1000
        )


def pod_object(pod: SimPod) -> dict[str, Any]:
    """The SIMULATED pod as the API server would return it."""
    meta: dict[str, Any] = {
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid,
        "labels": dict(pod.labels),
        "annotations": dict(pod.annotations),
    }
    if pod.owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": pod.owner[0],
                "name": pod.owner[1],
                "controller": True,
                "uid": "x",
            }
        ]
    resources = {"limits": {pod.gpu_request: "1"}} if pod.gpu_request else {}
    runtime = "cri-o" if pod.cgroup_style == "crio" else "containerd"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": NODE, "containers": [{"name": pod.container, "resources": resources}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": pod.container,
                    "ready": True,
                    "containerID": f"{runtime}://{pod.container_id}",
                }
            ],
        },
    }


class StaticPods:
    """SIMULATED stand-in for the pod watch: the demo node's fixed pods."""

    def __init__(self, pods: Sequence[PodInfo]) -> None:
        self._index = build_index(pods)
        self.up = True
        self.errors_total = 0
        self.last_sync = time.time()

    def index(self) -> PodIndex:
        return self._index

    def upstream_pods(self) -> list[PodInfo]:
        return []


# --------------------------------------------------------------------------- fake dcgm-exporter

_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", False),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", False),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", False),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", False),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        False,
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", False),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", False),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", False),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", False),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", True),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", True),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        True,
    ),
)


def render_upstream(gpus: SimulatedGpus, t: float) -> str:
    """The SIMULATED dcgm-exporter's /metrics: its label names and order, moving values."""
    used: dict[tuple[int, int | None], float] = {}
    busy: dict[tuple[int, int | None], float] = {}
    for p in PROCS:
        for key in ((p.gpu, p.gi), (p.gpu, None)):
            used[key] = used.get(key, 0.0) + gpus.proc_memory(p, t) / 2**20
            busy[key] = busy.get(key, 0.0) + (gpus.proc_util(p, t) or p.util or 0.3)
    w = FamilyWriter()
    for name, typ, help_text, per_instance in _FIELDS:
        w.family(name, help_text, typ)
        for gpu in GPUS:
            instances: list[MigDevice | None] = (
                [m for m in MIGS if m.gpu_index == gpu.index]
                if gpu.mig_enabled and per_instance
                else [None]
            )
            for mig in instances:
                gi = mig.gi_id if mig else None
                labels = [
                    ("gpu", str(gpu.index)),
                    ("UUID", gpu.uuid),
                    ("pci_bus_id", f"00000000:{0x17 + gpu.index * 0x10:02X}:00.0"),
                    ("device", f"nvidia{gpu.index}"),
                    ("modelName", gpu.name),
                ]
                if mig is not None:
                    labels += [("GPU_I_PROFILE", mig.profile), ("GPU_I_ID", str(gi))]
                labels.append(("Hostname", EXPORTER_POD))
                pod = UPSTREAM_PODS.get((gpu.index, gi))
                if pod is not None:
                    labels += [
                        ("container", pod.container),
                        ("namespace", pod.namespace),
                        ("pod", pod.name),
                    ]
                total = (
                    40_960
                    if mig and mig.profile == "3g.40gb"
                    else (
                        20_480 if mig and mig.profile == "2g.20gb" else (10_240 if mig else 81_920)
                    )
                )
                mem = round(used.get((gpu.index, gi), 0.0))
                load = min(1.0, busy.get((gpu.index, gi), 0.0))
                value = {
                    "DCGM_FI_DEV_SM_CLOCK": 1410 if load else 210,
                    "DCGM_FI_DEV_MEM_CLOCK": 1593,
                    "DCGM_FI_DEV_GPU_TEMP": round(34 + 40 * load * _wave(t, 300, gpu.index)),
                    "DCGM_FI_DEV_POWER_USAGE": round(60 + 300 * load, 3),
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(t * 1000 * (60 + 300 * load)),
                    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
                    "DCGM_FI_DEV_GPU_UTIL": round(100 * load),
                    "DCGM_FI_DEV_MEM_COPY_UTIL": round(40 * load),
                    "DCGM_FI_DEV_XID_ERRORS": 0,
                    "DCGM_FI_DEV_FB_FREE": max(0, total - mem),
                    "DCGM_FI_DEV_FB_USED": mem,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(load, 6),
                }[name]
                w.sample(name, labels, value)
    return w.render()


def make_upstream_app(gpus: SimulatedGpus) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            text=render_upstream(gpus, time.time()), content_type="text/plain", charset="utf-8"
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def start_demo(config: Config, proc_root: Path) -> tuple[Scraper, list[web.AppRunner]]:
    """Start the simulated dcgm-exporter and the enricher in front of it."""
    gpus = SimulatedGpus()
    write_proc_tree(proc_root, time.time())
    upstream = await serve(make_upstream_app(gpus), "127.0.0.1:0", max_header_bytes=8190)
    port = upstream.addresses[0][1]
    pods = StaticPods(
        [
            parse_pod(pod_object(p), config.kube_pod_labels, config.kube_pod_annotations)
            for p in PODS
        ]
    )
    demo_config = replace(
        config,
        upstream_url=f"http://127.0.0.1:{port}/metrics",
        upstream_discover_pod=False,
        procfs=str(proc_root),
        kube_node_name=NODE,
        simulated=True,
    )
    scraper = Scraper(demo_config, gpu=gpus, procs=ProcReader(str(proc_root)), pods=pods)
    runner = await serve(
        make_app(scraper), config.listen_address, max_header_bytes=config.max_request_header_bytes
    )
    return scraper, [runner, upstream]


async def run_demo(config: Config) -> int:
    """``dcgm-enricher demo``: serve until interrupted."""
    from .cli import wait_for_signal

    with tempfile.TemporaryDirectory(prefix="dcgm-enricher-demo-proc-") as tmp:
        try:
            _scraper, runners = await start_demo(config, Path(tmp))
        except OSError as exc:
            print(
                f"dcgm-enricher demo: cannot listen on {config.listen_address}: {exc}",
                file=sys.stderr,
            )
            return 2
        host_port = config.listen_address
        url = f"http://{'localhost' + host_port if host_port.startswith(':') else host_port}"
        print(
            "dcgm-enricher demo: a SIMULATED GPU node (4 A100s: one training job, one GPU\n"
            "time-sliced between two inference pods, one in MIG mode with a pod and a host\n"
            "process, one used by a Jupyter pod that never requested a GPU). The GPUs, the\n"
            "dcgm-exporter, /proc and the pods are simulated; the enricher is the real one.\n"
            f"\n  enriched metrics:  {url}/metrics\n"
            f"  who is on the GPUs: {url}/\n"
            f"\n  try: curl -s {url}/metrics | grep -E '^gpu_(container|pod|unattr)'\n"
            "\nCtrl-C to stop.",
            flush=True,
        )
        try:
            await wait_for_signal()
        finally:
            for runner in runners:
                await runner.cleanup()
    return 0
