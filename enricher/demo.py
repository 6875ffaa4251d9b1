"""``dcgm-enricher demo``: the real pipeline on a SIMULATED node, for a newcomer with no GPU.

Everything simulated is in this module and says so: the GPUs (a stand-in for NVML), the
dcgm-exporter it serves (an HTTP server on loopback), the /proc tree (written to a temporary
directory), the node's pods (a fixed list instead of a watch) and the kubelet's PodResources
API (a real gRPC server on a temporary unix socket, answering with the simulated allocations,
DRA devices among them) and the DRA driver's ResourceSlices (a fixed list body).
What runs on top is the real thing: the upstream fetch over HTTP, the PodResources client, the
procfs reader and cgroup parser, attribution, the rewrite and the HTTP server.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from . import fakeproc
from .app import Scraper, make_app, serve
from .commands import wait_for_signal
from .config import Config
from .kube import build_index, parse_pod
from .model import (
    DeviceAllocation,
    DraDevice,
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    MigDevice,
    PodIndex,
    PodInfo,
    PowerReading,
    ProcessKind,
)
from .podresources import PodResourcesSource, load_grpc
from .procfs import ProcReader
from .resourceslices import ResourceSliceSource
from .sources import Reading
from .textformat import FamilyWriter

NODE = "demo-gpu-node-1"
EXPORTER_POD = "dcgm-exporter-demo"


@dataclass(frozen=True)
class SimPod:
    """A pod of a simulated node: the demo's, and the nodes the tests and the bench build."""

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
    # Device IDs the (simulated) device plugin allocated to the container, as the kubelet
    # reports them: GPU-<uuid>, GPU-<uuid>::<replica>, MIG-<uuid>.
    devices: tuple[str, ...] = ()
    # A static pod's config hash: the API server holds its mirror, under this hash, and the
    # kubelet names the pod's cgroup after it.
    mirror_of: str = ""
    qos: str = "burstable"  # guaranteed | burstable | besteffort: the cgroup path says which
    # Devices the (simulated) DRA driver allocated to the container through ResourceClaims.
    claims: tuple[DraDevice, ...] = ()


@dataclass(frozen=True)
class SimProc:
    """A GPU process of a simulated node: what NVML lists and what /proc holds for it."""

    pid: int
    comm: str
    gpu: int
    gi: int | None
    base_mib: int | None  # memory swings around this; None: NVML cannot tell
    util: float  # mean SM utilization 0..1
    pod: SimPod | None  # None: a host process
    kind: ProcessKind = ProcessKind.COMPUTE
    also: tuple[ProcessKind, ...] = ()  # further NVML lists naming it (a graphics context)
    # NVML's utilization samples (timestamp, SM percent) for the fake NVML; () derives one
    # sample from ``util``.
    samples: tuple[tuple[int, int], ...] = ()
    exited: bool = False  # NVML still lists it, /proc no longer has it
    host_cgroup: str = "/system.slice/gpu-benchmark.service"  # a host process's cgroup
    cgroup: str | None = None  # the cgroup file as written, where it is not its pod's
    start_ticks: int | None = None  # when it started; None: after the process before it


@dataclass(frozen=True)
class SimNode:
    """A simulated node: its GPUs and MIG devices, its GPU processes, and the pods the API
    server holds for it (a process's pod may be missing from them: deleted since)."""

    name: str
    gpus: tuple[GpuDevice, ...]
    migs: tuple[MigDevice, ...]
    procs: tuple[SimProc, ...]
    pods: tuple[SimPod, ...]
    driver: str = "550.90.07"
    first_ticks: int = 100_000  # the first process's start time, in clock ticks after boot
    ticks_apart: int = 1000


def _cid(n: int) -> str:
    return f"{n:02x}" * 32


GPUS = (
    GpuDevice(0, "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(1, "GPU-1e2f3a4b-5c6d-7e8f-90a1-b2c3d4e5f607", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(
        2, "GPU-2f3a4b5c-6d7e-8f90-a1b2-c3d4e5f60718", "NVIDIA A100-SXM4-80GB", mig_enabled=True
    ),
    GpuDevice(3, "GPU-3a4b5c6d-7e8f-90a1-b2c3-d4e5f6071829", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(4, "GPU-4c5d6e7f-8091-a2b3-c4d5-e6f70819203a", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(5, "GPU-5d6e7f80-91a2-b3c4-d5e6-f708192a3b4c", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(6, "GPU-6e7f8091-a2b3-c4d5-e6f7-08192a3b4c5d", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(7, "GPU-7f8091a2-b3c4-d5e6-f708-192a3b4c5d6e", "NVIDIA A100-SXM4-80GB"),
)
MIGS = (
    MigDevice(GPUS[2].uuid, 2, 1, 0, "MIG-4b5c6d7e-8f90-5a1b-b2c3-d4e5f607182a", "3g.40gb"),
    MigDevice(GPUS[2].uuid, 2, 5, 0, "MIG-5c6d7e8f-905a-6b1c-c3d4-e5f607182a3b", "2g.20gb"),
    MigDevice(GPUS[2].uuid, 2, 13, 0, "MIG-6d7e8f90-5a6b-7c1d-d4e5-f607182a3b4c", "1g.10gb"),
)
TRAIN = SimPod(
    "ml-team",
    "train-llama-4kq9z",
    "3f1c2b4a-6d7e-4f80-9a1b-2c3d4e5f6a70",
    "trainer",
    _cid(0xA1),
    ("Job", "train-llama"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
    devices=(GPUS[0].uuid,),
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
    devices=(f"{GPUS[1].uuid}::0",),  # a replica of the time-sliced GPU
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
    devices=(f"{GPUS[1].uuid}::3",),
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
    devices=(MIGS[0].uuid,),
    qos="guaranteed",  # a MIG device is allocated by its own UUID
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
EVAL = SimPod(
    "research",
    "eval-harness-0",
    "9f0a1b2c-3d4e-4f5a-8b6c-7d8e9f0a1b2c",
    "eval",
    _cid(0xF6),
    ("StatefulSet", "eval-harness"),
    "nvidia.com/mig-1g.10gb",
    labels=(("team", "nlp"),),
    devices=(MIGS[2].uuid,),
)
MPS_DAEMON = SimPod(
    "nvidia-device-plugin",
    "nvidia-device-plugin-mps-control-daemon-5wq8k",
    "0a1b2c3d-4e5f-4a6b-9c7d-8e9f0a1b2c3d",
    "mps-control-daemon",
    _cid(0x17),
    ("DaemonSet", "nvidia-device-plugin-mps-control-daemon"),
    None,
)
EMBED_A = SimPod(
    "search",
    "embedder-6f7d8c9b4-q7w2e",
    "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e",
    "embedder",
    _cid(0x28),
    ("ReplicaSet", "embedder-6f7d8c9b4"),
    "nvidia.com/gpu.shared",  # MPS replicas under the renamed resource
    labels=(("pod-template-hash", "6f7d8c9b4"), ("team", "search")),
    devices=(f"{GPUS[4].uuid}::0",),
)
EMBED_B = replace(
    EMBED_A,
    name="embedder-6f7d8c9b4-m3x9z",
    uid="2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f",
    container_id=_cid(0x39),
    devices=(f"{GPUS[4].uuid}::1",),
)
FINETUNE = SimPod(
    "ml-team",
    "finetune-mistral-0",
    "3d4e5f6a-7b8c-4d9e-8f0a-1b2c3d4e5f6a",
    "trainer",
    _cid(0x4A),
    ("Job", "finetune-mistral"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
    devices=(GPUS[5].uuid,),
)
LLAMA_EVAL = SimPod(
    "ml-team",
    "llama-eval-7xq2m",
    "4e5f6a7b-8c9d-4e0f-9a1b-2c3d4e5f6a7b",
    "eval",
    _cid(0x5B),
    ("Job", "llama-eval"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
    devices=(GPUS[6].uuid,),
)
# NVIDIA's DRA driver (gpu.nvidia.com) publishes one pool per node, named after the node, and
# names a full GPU gpu-<minor number>; the ResourceSlice's uuid attribute says which GPU it is.
DRA_DRIVER = "gpu.nvidia.com"
DRA_TRAIN = SimPod(
    "ml-team",
    "dra-train-0",
    "5f6a7b8c-9d0e-4f1a-8b2c-3d4e5f6a7b8c",
    "trainer",
    _cid(0x6C),
    ("Job", "dra-train"),
    None,  # a DRA pod names a ResourceClaim, not an nvidia.com/* resource
    labels=(("team", "llm"),),
    claims=(DraDevice("dra-train-0-gpu-x7k2p", "ml-team", DRA_DRIVER, NODE, "gpu-7"),),
)
PODS = (
    TRAIN,
    VLLM,
    TRITON,
    BERT,
    EVAL,
    JUPYTER,
    MPS_DAEMON,
    EMBED_A,
    EMBED_B,
    FINETUNE,
    LLAMA_EVAL,
    DRA_TRAIN,
)

PROCS = (
    SimProc(4101, "python", 0, None, 31_000, 0.82, TRAIN),
    SimProc(4102, "pt_data_worker", 0, None, 1_200, 0.05, TRAIN),
    SimProc(5201, "python3", 1, None, 20_500, 0.45, VLLM),
    SimProc(5301, "tritonserver", 1, None, 12_000, 0.30, TRITON),
    SimProc(6101, "python", 2, 1, 30_000, 0.0, BERT),  # MIG: NVML has no per-process SM data
    SimProc(6201, "python", 2, 13, 4_000, 0.0, EVAL),
    SimProc(7001, "python3", 2, 5, 9_000, 0.0, None),  # a host process (systemd service)
    SimProc(8101, "python", 3, None, 6_000, 0.15, JUPYTER, ProcessKind.COMPUTE),
    # MPS: the server holds memory for its clients; the clients come from NVML's MPS list.
    SimProc(9001, "nvidia-cuda-mps-server", 4, None, 500, 0.0, MPS_DAEMON),
    SimProc(9101, "python", 4, None, 7_000, 0.25, EMBED_A, ProcessKind.MPS),
    SimProc(9102, "python", 4, None, 7_000, 0.20, EMBED_B, ProcessKind.MPS),
    # GPU 5: allocated to finetune-mistral-0, which has no process on it (idle).
    # GPU 6: an evaluation job that finished its work but kept its CUDA context: memory held
    # at zero utilization.
    SimProc(4201, "python", 6, None, 18_000, 0.0, LLAMA_EVAL),
    # GPU 7: given to dra-train-0 through a DRA ResourceClaim (NVIDIA's DRA driver).
    SimProc(4301, "python", 7, None, 22_000, 0.64, DRA_TRAIN),
)
# What dcgm-exporter's own PodResources mapping says: it sees only pods that requested a GPU,
# and on the time-sliced GPU it names just one of the two pods.
UPSTREAM_PODS: dict[tuple[int, int | None], SimPod] = {
    (0, None): TRAIN,
    (1, None): VLLM,
    (2, 1): BERT,
    (7, None): DRA_TRAIN,  # with the dra_* labels of its claim, as dcgm-exporter writes them
}
DEMO = SimNode(NODE, GPUS, MIGS, PROCS, PODS)


def _wave(t: float, period: float, phase: float) -> float:
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period) + phase)


# SIMULATED power: each GPU draws 60 W idle plus up to 300 W with its mean load, swinging
# slowly. The form has a closed integral, so the simulated energy counter is exactly the
# energy the simulated power draws (as a real GPU's counter is), whatever times are asked.
IDLE_WATTS = 60.0
LOAD_WATTS = 300.0
POWER_PERIOD_SECONDS = 300.0


# A MIG instance's processes show no per-process utilization in NVML; the simulated engine
# activity of each counts this much.
MIG_PROCESS_LOAD = 0.3


def _mean_load(gpu: int) -> float:
    return min(
        1.0, sum((p.util if p.gi is None else MIG_PROCESS_LOAD) for p in PROCS if p.gpu == gpu)
    )


def gpu_power_watts(gpu: int, t: float) -> float:
    """The SIMULATED draw of GPU ``gpu`` at ``t``, in watts."""
    load = _mean_load(gpu)
    return IDLE_WATTS + LOAD_WATTS * load * (0.7 + 0.6 * _wave(t, POWER_PERIOD_SECONDS, gpu))


def gpu_energy_millijoules(gpu: int, t: float) -> float:
    """The SIMULATED energy counter of GPU ``gpu`` at ``t``: the integral of
    ``gpu_power_watts`` from 0 to ``t``, in millijoules."""
    load = _mean_load(gpu)
    omega = 2 * math.pi / POWER_PERIOD_SECONDS
    # The integral of _wave: 0.5 t - 0.5 cos(omega t + phase) / omega, from 0.
    wave = 0.5 * t - 0.5 * (math.cos(omega * t + gpu) - math.cos(gpu)) / omega
    joules = IDLE_WATTS * t + LOAD_WATTS * load * (0.7 * t + 0.6 * wave)
    return joules * 1000.0


class SimulatedGpus:
    """SIMULATED stand-in for NVML: the demo's GPUs with memory and utilization that move."""

    name = "nvml"
    enabled = True

    def __init__(self, clock: Callable[[], float] = time.time, step: float = 0.0) -> None:
        """``step``: memory and utilization move once per ``step`` seconds (the simulated
        dcgm-exporter's collection interval, so that both report the same moment), or
        continuously with 0. Power and energy always follow ``clock``."""
        self.clock = clock
        self.step = step
        self.errors_total = 0

    def proc_memory(self, proc: SimProc, t: float) -> int | None:
        if proc.base_mib is None:
            return None
        return int((proc.base_mib * (0.9 + 0.2 * _wave(t, 120, proc.pid))) * 2**20)

    def proc_util(self, proc: SimProc, t: float) -> float | None:
        if proc.gi is not None:
            return None
        return round(min(1.0, proc.util * (0.7 + 0.6 * _wave(t, 45, proc.pid))), 3)

    def fetch(self) -> GpuSnapshot:
        t = self.clock()
        state = collected_at(t, self.step)
        procs = tuple(
            GpuProcess(
                GPUS[p.gpu].uuid,
                p.gpu,
                p.gi,
                p.pid,
                self.proc_memory(p, state),
                self.proc_util(p, state),
                frozenset({p.kind, *p.also}),
            )
            for p in PROCS
        )
        power = tuple(
            PowerReading(g.uuid, gpu_power_watts(g.index, t), gpu_energy_millijoules(g.index, t))
            for g in GPUS
        )
        return GpuSnapshot(
            GPUS,
            MIGS,
            procs,
            power=power,
            driver_version=f"{DEMO.driver} (simulated)",
            taken_at=t,
        )

    def read(self) -> Reading[GpuSnapshot]:
        return Reading(self.fetch())

    def close(self) -> None:
        pass


def proc_cgroup(proc: SimProc) -> str:
    """The cgroup file of ``proc``: its pod's, in the pod's layout, or its host unit's."""
    if proc.cgroup is not None:
        return proc.cgroup
    pod = proc.pod
    if pod is None:
        return fakeproc.cgroup_host(proc.host_cgroup)
    uid = pod.mirror_of or pod.uid
    if pod.cgroup_style == "cgroupfs":
        return fakeproc.cgroup_v1_cgroupfs(uid, pod.container_id, qos=pod.qos)
    runtime = "cri-o" if pod.cgroup_style == "crio" else "containerd"
    return fakeproc.cgroup_v2_systemd(uid, pod.container_id, qos=pod.qos, runtime=runtime)


def write_proc_tree(root: Path, node: SimNode, now: float) -> None:
    """Write ``node``'s SIMULATED /proc tree (booted a day before ``now``): one directory
    per live process with stat, comm and cgroup, started one after the other."""
    fakeproc.write_proc_stat(root, int(now) - 86_400)
    live = [p for p in node.procs if not p.exited]
    for i, proc in enumerate(live):
        ticks = proc.start_ticks
        if ticks is None:
            ticks = node.first_ticks + i * node.ticks_apart
        fakeproc.write_process(
            root, proc.pid, comm=proc.comm, cgroup=proc_cgroup(proc), start_ticks=ticks
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
    if pod.mirror_of:
        meta["annotations"] |= {
            "kubernetes.io/config.mirror": pod.mirror_of,
            "kubernetes.io/config.hash": pod.mirror_of,
            "kubernetes.io/config.source": "file",
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
    resources: dict[str, Any] = {"limits": {pod.gpu_request: "1"}} if pod.gpu_request else {}
    spec: dict[str, Any] = {"nodeName": NODE}
    if pod.claims:
        names = sorted({c.claim_name for c in pod.claims})
        resources["claims"] = [{"name": n} for n in names]
        spec["resourceClaims"] = [{"name": n, "resourceClaimName": n} for n in names]
    spec["containers"] = [{"name": pod.container, "resources": resources}]
    runtime = "cri-o" if pod.cgroup_style == "crio" else "containerd"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
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


def allocations(pods: Iterable[SimPod] = PODS) -> list[DeviceAllocation]:
    """The SIMULATED kubelet's allocations: every pod's device IDs and DRA devices (the
    demo's by default)."""
    pods = tuple(pods)
    return [
        DeviceAllocation(p.namespace, p.name, p.container, p.gpu_request or "", device)
        for p in pods
        for device in p.devices
    ] + [
        DeviceAllocation(p.namespace, p.name, p.container, c.driver, c.device, c)
        for p in pods
        for c in p.claims
    ]


def list_response(entries: Iterable[DeviceAllocation]) -> Any:
    """A PodResources ``ListPodResourcesResponse`` holding ``entries``, grouped as the kubelet
    groups them (per pod, per container, per resource)."""
    from .proto import api_pb2

    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    claims: dict[tuple[str, str, str], dict[tuple[str, str], list[DraDevice]]] = {}
    for e in entries:
        by_resource = pods.setdefault((e.namespace, e.pod), {}).setdefault(e.container, {})
        if e.dra is None:
            by_resource.setdefault(e.resource, []).append(e.device_id)
        else:
            claim = (e.dra.claim_name, e.dra.claim_namespace)
            claims.setdefault((e.namespace, e.pod, e.container), {}).setdefault(claim, [])
            claims[(e.namespace, e.pod, e.container)][claim].append(e.dra)

    def dynamic(ns: str, name: str, container: str) -> list[Any]:
        return [
            api_pb2.DynamicResource(
                claim_name=claim_name,
                claim_namespace=claim_ns,
                claim_resources=[
                    api_pb2.ClaimResource(
                        cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{d.driver}/device={d.device}")],
                        driver_name=d.driver,
                        pool_name=d.pool,
                        device_name=d.device,
                    )
                    for d in devices
                ],
            )
            for (claim_name, claim_ns), devices in claims.get((ns, name, container), {}).items()
        ]

    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                namespace=ns,
                name=name,
                containers=[
                    api_pb2.ContainerResources(
                        name=container,
                        devices=[
                            api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                            for r, ids in resources.items()
                        ],
                        dynamic_resources=dynamic(ns, name, container),
                    )
                    for container, resources in containers.items()
                ],
            )
            for (ns, name), containers in pods.items()
        ]
    )


class SimulatedKubelet:
    """A real gRPC server on a unix socket speaking the kubelet's PodResources v1 API, with
    SIMULATED answers: ``respond(context)`` makes each List reply (it may also sleep, or end
    the call with ``context.abort``). Counts calls, and the most that ran at once."""

    def __init__(self, socket_path: str, respond: Callable[[Any], Any]) -> None:
        self.socket_path = socket_path
        self.respond = respond
        self.calls = 0
        self.max_concurrent = 0
        self._running = 0
        self._count_lock = threading.Lock()
        self._server: Any = None

    # Named as the gRPC method it serves.
    def List(self, _request: Any, context: Any) -> Any:
        with self._count_lock:
            self.calls += 1
            self._running += 1
            self.max_concurrent = max(self.max_concurrent, self._running)
        try:
            return self.respond(context)
        finally:
            with self._count_lock:
                self._running -= 1

    def start(self) -> None:
        from .proto import api_pb2_grpc

        grpc = load_grpc()

        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-kubelet"))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)  # type: ignore[no-untyped-call,unused-ignore]
        if not server.add_insecure_port("unix://" + os.path.abspath(self.socket_path)):
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server

    def stop(self, grace: float | None = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None


def resource_slices(node: SimNode = DEMO, driver: str = DRA_DRIVER) -> dict[str, Any]:
    """The SIMULATED DRA driver's ResourceSliceList for ``node`` (resource.k8s.io/v1), in
    the shape NVIDIA's driver publishes: one pool named after the node, a device per GPU
    (``gpu-<minor>``; the simulated minor number is the index) and per MIG device (in the
    driver's ``gpu-<minor>-mig-...`` form, with simulated numbers), each with its ``uuid``
    attribute."""
    devices: list[dict[str, Any]] = [
        {
            "name": f"gpu-{g.index}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": g.uuid},
                "productName": {"string": g.name},
            },
        }
        for g in node.gpus
        if not g.mig_enabled
    ]
    devices += [
        {
            "name": f"gpu-{m.gpu_index}-mig-{m.gi_id}-{m.ci_id}",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": m.uuid},
                "parentUUID": {"string": m.gpu_uuid},
                "profile": {"string": m.profile},
            },
        }
        for m in node.migs
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "1"},
        "items": [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node.name}-{driver}-x1"},
                "spec": {
                    "driver": driver,
                    "nodeName": node.name,
                    "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        ],
    }


def static_slice_lister(body: Mapping[str, Any]) -> Callable[[str, str, float], bytes]:
    """SIMULATED stand-in for the API server's ResourceSlice list: ``body`` for
    resource.k8s.io/v1, whatever node is asked."""
    data = json.dumps(body).encode()

    def list_slices(_version: str, _node: str, _timeout: float) -> bytes:
        return data

    return list_slices


class StaticPods:
    """SIMULATED stand-in for the pod watch: the demo node's fixed pods."""

    name = "kubernetes"
    enabled = True

    def __init__(self, pods: Sequence[PodInfo]) -> None:
        self._index = build_index(pods)
        self.up = True
        self.errors_total = 0
        self.last_sync = time.time()

    def index(self) -> PodIndex:
        return self._index

    def read(self) -> Reading[PodIndex]:
        return Reading(self._index, self.up)

    def upstream_pods(self) -> list[PodInfo]:
        return []

    def close(self) -> None:
        pass


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
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Rows remapped after uncorrectable memory errors.",
        False,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Rows remapped after correctable memory errors.",
        False,
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether a row remapping has failed.", False),
)


def device_usage(
    gpus: SimulatedGpus, t: float
) -> tuple[dict[tuple[int, int | None], float], dict[tuple[int, int | None], float]]:
    """The SIMULATED devices' used memory (MiB) and load (0..1) at ``t``, per (GPU, GPU
    instance) and per whole GPU (GPU, None): each process counted once on its instance and
    once on its GPU (on a GPU without MIG the two are one key). The simulated driver holds no
    memory of its own that FB_USED counts: a device's used memory is its processes'."""
    used: dict[tuple[int, int | None], float] = {}
    busy: dict[tuple[int, int | None], float] = {}
    for p in PROCS:
        util = gpus.proc_util(p, t)
        for key in {(p.gpu, p.gi), (p.gpu, None)}:
            used[key] = used.get(key, 0.0) + (gpus.proc_memory(p, t) or 0) / 2**20
            busy[key] = busy.get(key, 0.0) + (MIG_PROCESS_LOAD if util is None else util)
    return used, busy


def render_upstream(gpus: SimulatedGpus, t: float) -> str:
    """The SIMULATED dcgm-exporter's /metrics: its label names and order, moving values."""
    used, busy = device_usage(gpus, t)
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
                    for c in pod.claims:
                        labels += [
                            ("dra_claim_name", c.claim_name),
                            ("dra_claim_namespace", c.claim_namespace),
                            ("dra_driver_name", c.driver),
                            ("dra_pool_name", c.pool),
                            ("dra_device_name", c.device),
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
                    "DCGM_FI_DEV_POWER_USAGE": round(gpu_power_watts(gpu.index, t), 3),
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(
                        gpu_energy_millijoules(gpu.index, t)
                    ),
                    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
                    "DCGM_FI_DEV_GPU_UTIL": round(100 * load),
                    "DCGM_FI_DEV_MEM_COPY_UTIL": round(40 * load),
                    "DCGM_FI_DEV_XID_ERRORS": 0,
                    "DCGM_FI_DEV_FB_FREE": max(0, total - mem),
                    "DCGM_FI_DEV_FB_USED": mem,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(load, 6),
                    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
                    # One GPU has had a few correctable errors, as aging HBM does.
                    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2 if gpu.index == 3 else 0,
                    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
                }[name]
                w.sample(name, labels, value)
    return w.render()


# Like dcgm-exporter, the simulated one collects on an interval and serves the same body
# in between (dcgm-exporter's default is 30 s; shorter here so the demo moves).
UPSTREAM_COLLECT_INTERVAL = 5.0


def collected_at(now: float, interval: float) -> float:
    """When the collection serving ``now`` was made: the start of its interval (``now``
    itself with no interval, for a stand-in that changes on every request)."""
    return now - now % interval if interval > 0 else now


def make_upstream_app(
    gpus: SimulatedGpus, collect_interval: float = UPSTREAM_COLLECT_INTERVAL
) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            text=render_upstream(gpus, collected_at(gpus.clock(), collect_interval)),
            content_type="text/plain",
            charset="utf-8",
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def demo_gpus(clock: Callable[[], float] = time.time) -> SimulatedGpus:
    """The demo node's SIMULATED NVML: memory and utilization step with its dcgm-exporter's
    collections."""
    return SimulatedGpus(clock, step=UPSTREAM_COLLECT_INTERVAL)


def demo_pods(config: Config) -> StaticPods:
    """The demo node's SIMULATED pods, as the pod watch would parse them under ``config``."""
    return StaticPods(
        [
            parse_pod(pod_object(p), config.kube_pod_labels, config.kube_pod_annotations)
            for p in PODS
        ]
    )


async def start_demo(
    config: Config, proc_root: Path, socket_path: Path, clock: Callable[[], float] = time.time
) -> tuple[Scraper, list[web.AppRunner], SimulatedKubelet]:
    """Start the simulated dcgm-exporter and kubelet, and the enricher in front of them.
    ``clock``: the simulated node's time (tests freeze it)."""
    gpus = demo_gpus(clock)
    write_proc_tree(proc_root, DEMO, clock())
    response = list_response(allocations())
    kubelet = SimulatedKubelet(str(socket_path), lambda _context: response)
    kubelet.start()
    upstream = await serve(make_upstream_app(gpus), "127.0.0.1:0", max_header_bytes=8190)
    port = upstream.addresses[0][1]
    pods = demo_pods(config)
    demo_config = replace(
        config,
        upstream_url=f"http://127.0.0.1:{port}/metrics",
        upstream_discover_pod=False,
        procfs=str(proc_root),
        kube_node_name=NODE,
        kubelet_pod_resources_socket=str(socket_path),
        simulated=True,
    )
    podresources = PodResourcesSource(
        str(socket_path),
        timeout=demo_config.kubelet_timeout,
        extra_resources=demo_config.kubelet_gpu_resources,
        extra_drivers=demo_config.kubelet_dra_drivers,
    )
    scraper = Scraper(
        demo_config,
        gpu=gpus,
        procs=ProcReader(str(proc_root)),
        pods=pods,
        podresources=podresources,
        resource_slices=ResourceSliceSource(static_slice_lister(resource_slices()), NODE),
    )
    try:
        runner = await serve(
            make_app(scraper),
            config.listen_address,
            max_header_bytes=config.max_request_header_bytes,
        )
    except OSError:
        await scraper.close()  # its upstream client session, before the error is shown
        await upstream.cleanup()
        kubelet.stop()
        raise
    return scraper, [runner, upstream], kubelet


# PIDs for the printed resolve command: a training job's, a Jupyter notebook's and a host
# process's on a MIG instance.
RESOLVE_EXAMPLE_PIDS = (4101, 8101, 7001)


def ps_command(proc_root: Path) -> str:
    """The ``ps`` command line that looks at the demo whose /proc tree is ``proc_root``."""
    return f"dcgm-enricher ps --demo --path.procfs {proc_root}"


def resolve_command(proc_root: Path) -> str:
    """The ``resolve`` command line for a few of the demo's PIDs (see ps_command)."""
    pids = " ".join(str(pid) for pid in RESOLVE_EXAMPLE_PIDS)
    return f"dcgm-enricher resolve --demo --path.procfs {proc_root} {pids}"


async def run_demo(config: Config) -> int:
    """``dcgm-enricher demo``: serve until interrupted."""
    with tempfile.TemporaryDirectory(prefix="dcgm-enricher-demo-") as tmp:
        proc_root = Path(tmp) / "proc"
        socket_path = Path(tmp) / "pod-resources" / "kubelet.sock"
        socket_path.parent.mkdir()
        try:
            _scraper, runners, kubelet = await start_demo(config, proc_root, socket_path)
        except OSError as exc:
            print(
                f"dcgm-enricher demo: cannot listen on {config.listen_address}: {exc}",
                file=sys.stderr,
            )
            return 2
        host_port = config.listen_address
        url = f"http://{'localhost' + host_port if host_port.startswith(':') else host_port}"
        print(
            "dcgm-enricher demo: a SIMULATED GPU node (8 A100s: one training job, one GPU\n"
            "time-sliced between two inference pods, one in MIG mode with pods on two\n"
            "instances and a host process, one used by a Jupyter pod that never requested a\n"
            "GPU, one shared through MPS by two pods, one allocated to a pod that leaves it\n"
            "idle, one held by a finished job that keeps its memory at zero utilization, one\n"
            "given to a pod through a DRA ResourceClaim). The GPUs, the dcgm-exporter, the\n"
            "kubelet's PodResources API, the ResourceSlices, /proc and the pods are simulated;\n"
            "the enricher is the real one.\n"
            f"\n  enriched metrics:  {url}/metrics\n"
            f"  who is on the GPUs: {url}/\n"
            f"\n  try: curl -s {url}/metrics | grep -E '^gpu_(container|pod|unattr)'\n"
            f"       {ps_command(proc_root)}\n"
            f"       {resolve_command(proc_root)}\n"
            "\nCtrl-C to stop.",
            flush=True,
        )
        try:
            await wait_for_signal()
        finally:
            for runner in runners:
                await runner.cleanup()
            kubelet.stop()
    return 0
