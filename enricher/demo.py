"""``dcgm-enricher demo``: the real pipeline on a SIMULATED node, for a newcomer with no GPU.

This module is the demo node's story (its GPUs, MIG devices, pods and processes, and what
dcgm-exporter's own mapping says of them), its simulated dcgm-exporter and the commands that
start it; the simulation itself is enricher.simnode, and says so: the GPUs (a stand-in for
NVML), the /proc tree (written to a temporary directory), the node's pods (a fixed list
instead of a watch), the kubelet's PodResources API (a real gRPC server on a temporary unix
socket, answering with the simulated allocations, DRA devices among them) and the DRA
driver's ResourceSlices (a fixed list body). The dcgm-exporter is an HTTP server on loopback.
What runs on top is the real thing: the upstream fetch over HTTP, the PodResources client, the
procfs reader and cgroup parser, attribution, the rewrite and the HTTP server.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from .app import make_app, serve
from .commands import wait_for_signal
from .config import Config
from .model import DeviceTaint, DraDevice, GpuDevice, MigDevice, ProcessKind
from .pipeline import Scraper
from .podparse import parse_mps_daemon_pods, parse_pod
from .podresources import PodResourcesSource
from .procfs import ProcfsSource
from .resourceslices import ResourceSlicesSource
from .simnode.api import (
    DRA_DRIVER,
    StaticPods,
    pod_object,
    resource_slices,
    static_slice_lister,
)
from .simnode.dialects import (
    NEWEST,
    PER_PROCESS_FIELDS,
    VIRTUAL_COPIES,
    VIRTUAL_SHARES,
    Row,
    dialect,
    dialect_for,
    render,
)
from .simnode.fakeproc import write_proc_tree
from .simnode.gpus import MIG_PROCESS_LOAD, SimulatedGpus, collected_at, wave
from .simnode.kubelet import SimulatedKubelet, allocations, list_response
from .simnode.node import SimNode, SimPod, SimProc

NODE = "demo-gpu-node-1"
# The simulated dcgm-exporter's host label holds its pod's name, as dcgm-exporter writes it
# where the manifest sets no NODE_NAME; the enricher's node label names the node.
EXPORTER_POD = "dcgm-exporter-demo"


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
    MigDevice(GPUS[2].uuid, 2, 14, 0, "MIG-7e8f905a-6b7c-8d1e-e5f6-07182a3b4c5d", "1g.10gb"),
)
# Where each instance sits on GPU 2 (placement starts, in memory slices): the four fill it.
MIG_PLACEMENTS = ((MIGS[0].uuid, 4), (MIGS[1].uuid, 0), (MIGS[2].uuid, 2), (MIGS[3].uuid, 3))
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
    # The plugin Helm chart's pod labels: --mps.daemon-pod-selector's default admits it.
    labels=(
        ("app.kubernetes.io/name", "nvidia-device-plugin"),
        ("app.kubernetes.io/instance", "nvdp"),
    ),
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
DRA_WHISPER = SimPod(
    "research",
    "dra-whisper-0",
    "6a7b8c9d-0e1f-4a2b-9c3d-4e5f6a7b8c9d",
    "whisper",
    _cid(0x7D),
    ("StatefulSet", "dra-whisper"),
    None,
    labels=(("team", "speech"),),
    # A MIG device NVIDIA's DRA driver publishes: gpu-<minor>-mig-<profile ID>-<start>-<size>.
    claims=(
        DraDevice("dra-whisper-0-mig-4fj2q", "research", DRA_DRIVER, NODE, "gpu-2-mig-19-3-1"),
    ),
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
    DRA_WHISPER,
)

PROCS = (
    SimProc(4101, "python", 0, None, 31_000, 0.82, TRAIN),
    SimProc(4102, "pt_data_worker", 0, None, 1_200, 0.05, TRAIN),
    SimProc(5201, "python3", 1, None, 20_500, 0.45, VLLM),
    SimProc(5301, "tritonserver", 1, None, 12_000, 0.30, TRITON),
    SimProc(6101, "python", 2, 1, 30_000, 0.0, BERT),  # MIG: NVML has no per-process SM data
    SimProc(6201, "python", 2, 13, 4_000, 0.0, EVAL),
    SimProc(7001, "python3", 2, 5, 9_000, 0.0, None),  # a host process (systemd service)
    # Alice ran cells for the demo's first two minutes, then left her notebook open, holding
    # its memory: gpu_container_last_active_timestamp_seconds stops, GpuHeldIdle follows.
    SimProc(8101, "python", 3, None, 6_000, 0.15, JUPYTER, ProcessKind.COMPUTE, busy_for=120.0),
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
    # GPU 2's fourth MIG instance: given to dra-whisper-0 through a DRA ResourceClaim.
    SimProc(6301, "python", 2, 14, 5_000, 0.0, DRA_WHISPER),
)
# What dcgm-exporter's own PodResources mapping says: it sees only pods that requested a GPU,
# and on the time-sliced GPU it names just one of the two pods.
UPSTREAM_PODS: dict[tuple[int, int | None], SimPod] = {
    (0, None): TRAIN,
    (1, None): VLLM,
    (2, 1): BERT,
    (7, None): DRA_TRAIN,  # with the dra_* labels of its claim, as dcgm-exporter writes them
    (2, 14): DRA_WHISPER,  # and a MIG device's dra_mig_profile and dra_mig_device_uuid
}
DEMO = SimNode(NODE, GPUS, MIGS, PROCS, PODS, mig_placements=MIG_PLACEMENTS)
# The SIMULATED DRA driver's health report: it lost track of GPU 7's health events, which
# dra-train-0 runs on (gpu_device_taint, GpuDeviceTainted).
TAINTS = {GPUS[7].uuid: (DeviceTaint("gpu.nvidia.com/unmonitored", "", "NoSchedule"),)}


# --------------------------------------------------------------------------- fake dcgm-exporter

# The fields of the simulated exporter's counters file, and whether a MIG GPU reports each per
# GPU instance (memory and profiling) or for the whole GPU. Which of them a release writes, in
# which order and with which HELP text: enricher.simnode.dialects.
_PER_INSTANCE = frozenset(
    {
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    }
)


# What the SIMULATED driver holds that no process NVML lists has (MiB), as DCGM 3.x reports
# it: its reservation on each whole GPU (FB_RESERVED; none inside a MIG instance), and on
# GPU 5, allocated to a pod that leaves it idle, memory no listed process holds (what an
# exited process's context left behind until the driver frees it).
DRIVER_RESERVED_MIB = 512
UNLISTED_MIB = {(5, None): 1536}


def device_usage(
    gpus: SimulatedGpus, t: float
) -> tuple[dict[tuple[int, int | None], float], dict[tuple[int, int | None], float]]:
    """The SIMULATED devices' used memory (MiB) and load (0..1) at ``t``, per (GPU, GPU
    instance) and per whole GPU (GPU, None): each process counted once on its instance and
    once on its GPU (on a GPU without MIG the two are one key). FB_USED is its processes'
    memory and what the simulated driver holds outside them (``UNLISTED_MIB``)."""
    used: dict[tuple[int, int | None], float] = {}
    busy: dict[tuple[int, int | None], float] = {}
    for p in PROCS:
        util = gpus.proc_util(p, t)
        for key in {(p.gpu, p.gi), (p.gpu, None)}:
            used[key] = used.get(key, 0.0) + (gpus.proc_memory(p, t) or 0) / 2**20
            busy[key] = busy.get(key, 0.0) + (MIG_PROCESS_LOAD if util is None else util)
    for key, mib in UNLISTED_MIB.items():
        used[key] = used.get(key, 0.0) + mib
    return used, busy


def _device_labels(gpu: GpuDevice, mig: MigDevice | None) -> tuple[tuple[str, str], ...]:
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", f"00000000:{0x17 + gpu.index * 0x10:02X}:00.0"),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", gpu.name),
    ]
    if mig is not None:
        labels += [("GPU_I_PROFILE", mig.profile), ("GPU_I_ID", str(mig.gi_id))]
    return tuple(labels)


def _pod_attributes(pod: SimPod, mig: MigDevice | None, dra: bool) -> list[tuple[str, str]]:
    attributes = [("container", pod.container), ("namespace", pod.namespace), ("pod", pod.name)]
    for c in pod.claims if dra else ():
        attributes += [
            ("dra_claim_name", c.claim_name),
            ("dra_claim_namespace", c.claim_namespace),
            ("dra_driver_name", c.driver),
            ("dra_pool_name", c.pool),
            ("dra_device_name", c.device),
        ]
        if mig is not None:
            attributes += [("dra_mig_profile", mig.profile), ("dra_mig_device_uuid", mig.uuid)]
    return attributes


def sharing_pods() -> dict[tuple[int, int | None], list[tuple[SimPod, str]]]:
    """What dcgm-exporter's PodResources mapping for --kubernetes-virtual-gpus holds: per
    device (GPU, GPU instance), each pod the kubelet gives it to, with the replica number the
    device ID ends in (``vgpu``; empty for a whole device), in the kubelet's order."""
    out: dict[tuple[int, int | None], list[tuple[SimPod, str]]] = {}
    by_uuid = {g.uuid: (g.index, None) for g in GPUS} | {
        m.uuid: (m.gpu_index, m.gi_id) for m in MIGS
    }
    for pod in PODS:
        for device in pod.devices:
            uuid, _, replica = device.partition("::")
            key = by_uuid.get(uuid)
            if key is not None:
                out.setdefault(key, []).append((pod, replica))
    return out


def _pod_share(
    gpus: SimulatedGpus, t: float, name: str, pod: SimPod, key: tuple[int, int | None]
) -> int:
    """The value 4.8.2 on writes for ``pod`` on device ``key``: its processes' FB_USED (each
    one's bytes in whole MiB, process_metrics.go@691c927:88-100) or SM utilization (NVML's
    per-process %, none on a MIG instance), summed per pod (buildPodValueMap, formatted %d)."""
    total = 0
    for p in PROCS:
        if p.pod is not pod or (p.gpu, p.gi) != key:
            continue
        if name == "DCGM_FI_DEV_FB_USED":
            total += (gpus.proc_memory(p, t) or 0) // 2**20
        else:
            util = gpus.proc_util(p, t)
            total += 0 if util is None else round(100 * util)
    return total


def render_upstream(
    gpus: SimulatedGpus,
    t: float,
    version: str = NEWEST,
    virtual_gpus: bool = False,
) -> str:
    """The SIMULATED dcgm-exporter's /metrics at ``t``, in the dialect of dcgm-exporter
    ``version`` (enricher.simnode.dialects), in Kubernetes mode, with or without
    ``--kubernetes-virtual-gpus``."""
    dia = dialect_for(version, virtual_gpus)
    used, busy = device_usage(gpus, t)
    sharing = sharing_pods() if virtual_gpus else {}
    rows: list[Row] = []
    for name, _typ, _help in dia.counters:
        for gpu in GPUS:
            instances: list[MigDevice | None] = (
                [m for m in MIGS if m.gpu_index == gpu.index]
                if gpu.mig_enabled and name in _PER_INSTANCE
                else [None]
            )
            for mig in instances:
                gi = mig.gi_id if mig else None
                key = (gpu.index, gi)
                device = _device_labels(gpu, mig)
                value = _field_value(name, gpus, t, gpu, mig, used, busy)
                xid: list[tuple[str, str]] = []
                if name == "DCGM_FI_DEV_XID_ERRORS" and dia.xid_attributes:
                    xid = [("err_code", str(value)), ("err_msg", "No Error")]
                pod = UPSTREAM_PODS.get(key)
                if pod is not None and pod.claims and not dia.dra:
                    pod = None  # a ResourceClaim's device: this release cannot see its pod
                on_device = sharing.get(key, []) if pod is None or not pod.claims else []
                if on_device:
                    if dia.virtual == VIRTUAL_SHARES and name in PER_PROCESS_FIELDS:
                        rows.append(Row(name, device, tuple(xid), value))
                        rows.extend(
                            Row(
                                name,
                                device,
                                (
                                    *_pod_attributes(p, mig, False),
                                    ("pod_uid", p.uid),
                                    *((("vgpu", replica),) if replica else ()),
                                ),
                                _pod_share(gpus, t, name, p, key),
                            )
                            for p, replica in on_device
                        )
                    else:
                        rows.extend(
                            Row(
                                name,
                                device,
                                (
                                    *xid,
                                    *_pod_attributes(p, mig, False),
                                    *((("vgpu", replica),) if replica else ()),
                                ),
                                value,
                            )
                            for p, replica in on_device
                        )
                    continue
                if virtual_gpus and dia.virtual == VIRTUAL_COPIES and pod is None:
                    continue  # 4.2.0: a device no pod holds loses its series
                attributes = list(xid)
                if pod is not None:
                    attributes += _pod_attributes(pod, mig, dia.dra)
                elif dia.empty_pod_labels:
                    attributes += [("container", ""), ("namespace", ""), ("pod", "")]
                rows.append(Row(name, device, tuple(attributes), value))
    return render(dia, EXPORTER_POD, rows)


def _field_value(
    name: str,
    gpus: SimulatedGpus,
    t: float,
    gpu: GpuDevice,
    mig: MigDevice | None,
    used: dict[tuple[int, int | None], float],
    busy: dict[tuple[int, int | None], float],
) -> int | float:
    gi = mig.gi_id if mig else None
    total = (
        40_960
        if mig and mig.profile == "3g.40gb"
        else (20_480 if mig and mig.profile == "2g.20gb" else (10_240 if mig else 81_920))
    )
    # Whole MiB, as DCGM writes them: rounded up, so the processes never list more than
    # FB_USED says the device holds.
    mem = math.ceil(used.get((gpu.index, gi), 0.0))
    reserved = 0 if mig else DRIVER_RESERVED_MIB
    load = min(1.0, busy.get((gpu.index, gi), 0.0))
    values: dict[str, int | float] = {
        "DCGM_FI_DEV_SM_CLOCK": 1410 if load else 210,
        "DCGM_FI_DEV_MEM_CLOCK": 1593,
        "DCGM_FI_DEV_GPU_TEMP": round(34 + 40 * load * wave(t, 300, gpu.index)),
        "DCGM_FI_DEV_POWER_USAGE": round(gpus.power_watts(gpu.index, t), 3),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(gpus.energy_millijoules(gpu.index, t)),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": round(100 * load),
        "DCGM_FI_DEV_MEM_COPY_UTIL": round(40 * load),
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": max(0, total - mem - reserved),
        "DCGM_FI_DEV_FB_USED": mem,
        "DCGM_FI_DEV_FB_RESERVED": reserved,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(load, 6),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        # One GPU has had a few correctable errors, as aging HBM does.
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2 if gpu.index == 3 else 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
    }
    return values[name]


# Like dcgm-exporter, the simulated one collects on an interval and serves the same body
# in between (dcgm-exporter's default is 30 s; shorter here so the demo moves).
UPSTREAM_COLLECT_INTERVAL = 5.0


def make_upstream_app(
    gpus: SimulatedGpus,
    collect_interval: float = UPSTREAM_COLLECT_INTERVAL,
    version: str = NEWEST,
    virtual_gpus: bool = False,
) -> web.Application:
    dialect_for(version, virtual_gpus)  # an unknown release or mode fails here, at start

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            text=render_upstream(
                gpus, collected_at(gpus.clock(), collect_interval), version, virtual_gpus
            ),
            content_type="text/plain",
            charset="utf-8",
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def demo_gpus(clock: Callable[[], float] = time.time) -> SimulatedGpus:
    """The demo node's SIMULATED NVML: memory and utilization step with its dcgm-exporter's
    collections."""
    return SimulatedGpus(DEMO, clock, step=UPSTREAM_COLLECT_INTERVAL)


def demo_pods(config: Config) -> StaticPods:
    """The demo node's SIMULATED pods, as the pod watch would parse them under ``config``."""
    return StaticPods(
        [
            parse_pod(
                pod_object(p, NODE),
                config.kube_pod_labels,
                config.kube_pod_annotations,
                parse_mps_daemon_pods(
                    config.mps_daemon_pod_selector, config.mps_daemon_pod_namespace
                ),
            )
            for p in PODS
        ]
    )


async def start_demo(
    config: Config,
    proc_root: Path,
    socket_path: Path,
    clock: Callable[[], float] = time.time,
    *,
    exporter_version: str = NEWEST,
    virtual_gpus: bool = False,
) -> tuple[Scraper, list[web.AppRunner], SimulatedKubelet]:
    """Start the simulated dcgm-exporter and kubelet, and the enricher in front of them.
    ``clock``: the simulated node's time (tests freeze it); ``exporter_version`` and
    ``virtual_gpus``: the dialect the simulated dcgm-exporter speaks (ValueError if unknown)."""
    gpus = demo_gpus(clock)
    upstream_app = make_upstream_app(gpus, version=exporter_version, virtual_gpus=virtual_gpus)
    write_proc_tree(proc_root, DEMO, clock())
    response = list_response(allocations(PODS))
    kubelet = SimulatedKubelet(str(socket_path), lambda _context: response)
    kubelet.start()
    upstream = await serve(upstream_app, "127.0.0.1:0")
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
        nvml=gpus,
        procfs=ProcfsSource(str(proc_root)),
        kubernetes=pods,
        podresources=podresources,
        resourceslices=ResourceSlicesSource(
            static_slice_lister(resource_slices(DEMO, taints=TAINTS)), NODE
        ),
    )
    try:
        runner = await serve(
            make_app(scraper),
            config.listen_address,
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


async def run_demo(
    config: Config, exporter_version: str = NEWEST, virtual_gpus: bool = False
) -> int:
    """``dcgm-enricher demo``: serve until interrupted."""
    with tempfile.TemporaryDirectory(prefix="dcgm-enricher-demo-") as tmp:
        proc_root = Path(tmp) / "proc"
        socket_path = Path(tmp) / "pod-resources" / "kubelet.sock"
        socket_path.parent.mkdir()
        try:
            _scraper, runners, kubelet = await start_demo(
                config,
                proc_root,
                socket_path,
                exporter_version=exporter_version,
                virtual_gpus=virtual_gpus,
            )
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
            "time-sliced between two inference pods, one in MIG mode with pods on three\n"
            "instances (one given through a DRA ResourceClaim) and a host process, one used\n"
            "by a Jupyter pod that never requested a GPU and goes idle two minutes in, one\n"
            "shared through MPS by two pods, one allocated to a pod that leaves it idle, one\n"
            "held by a finished job that keeps its memory at zero utilization, one given to a\n"
            "pod through a DRA ResourceClaim).\n"
            "The GPUs, the dcgm-exporter, the kubelet's PodResources API, the ResourceSlices,\n"
            "/proc and the pods are simulated; the enricher is the real one. The simulated\n"
            f"dcgm-exporter speaks {dialect(exporter_version).version}'s dialect"
            f"{' with --kubernetes-virtual-gpus' if virtual_gpus else ''}.\n"
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
