"""A SIMULATED dcgm-exporter: the /metrics a release writes for a simulated node's GPUs.

The rows come from the simulated NVML (:mod:`.gpus`: memory, load, power and energy at a
moment), so that the exporter and NVML report the same node; how each release writes them is
:mod:`.dialects`. What dcgm-exporter's own pod mapping says of the node, its host label and what
its driver holds outside every process are the story's (:class:`ExporterStory`; the demo's is
enricher.demo's). The HTTP server is an aiohttp app on loopback, collecting on an interval as
dcgm-exporter does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from ..model import GpuDevice, MigDevice
from .dialects import (
    NEWEST,
    PER_PROCESS_FIELDS,
    VIRTUAL_COPIES,
    VIRTUAL_SHARES,
    Row,
    dialect_for,
    render,
)
from .gpus import MIG_PROCESS_LOAD, SimulatedGpus, wave
from .node import SimNode, SimPod

Device = tuple[int, int | None]  # (GPU index, GPU instance ID or None for the whole GPU)


@dataclass(frozen=True)
class ExporterStory:
    """What a SIMULATED dcgm-exporter says of its node beyond the GPUs: its host label
    (``Hostname``/``hostname``: the node's name where NODE_NAME is set, as NVIDIA's chart and
    the GPU Operator set it, else its pod's), the pod its own PodResources mapping names on
    each device, and the memory (MiB) its driver holds on a device that no listed process
    holds."""

    host: str
    upstream_pods: Mapping[Device, SimPod]
    unlisted_mib: Mapping[Device, float] = field(default_factory=dict)


# The fields of the simulated exporter's counters file, and whether a MIG GPU reports each per
# GPU instance (memory and profiling) or for the whole GPU. Which of them a release writes, in
# which order and with which HELP text: enricher.simnode.dialects.
# Fields are the table's keys (enricher/dcgm_fields.json); values are computed in SI (bytes,
# ratio, joules, watts, hertz) and written in each release's unit by the dialect.
_PER_INSTANCE = frozenset({"fb_capacity", "fb_free", "fb_used", "fb_reserved", "gr_engine_active"})
MIB = 2**20
MHZ = 1_000_000


# What the SIMULATED driver reserves on each whole GPU (MiB, FB_RESERVED; none inside a MIG
# instance), as DCGM 3.x reports it.
DRIVER_RESERVED_MIB = 512


def device_usage(
    gpus: SimulatedGpus, t: float, unlisted_mib: Mapping[Device, float]
) -> tuple[dict[Device, float], dict[Device, float]]:
    """The SIMULATED devices' used memory (MiB) and load (0..1) at ``t``, per (GPU, GPU
    instance) and per whole GPU (GPU, None): each process counted once on its instance and
    once on its GPU (on a GPU without MIG the two are one key). FB_USED is its processes'
    memory and what the simulated driver holds outside them (``unlisted_mib``)."""
    used: dict[Device, float] = {}
    busy: dict[Device, float] = {}
    for p in gpus.node.procs:
        util = gpus.proc_util(p, t)
        for key in {(p.gpu, p.gi), (p.gpu, None)}:
            used[key] = used.get(key, 0.0) + (gpus.proc_memory(p, t) or 0) / 2**20
            busy[key] = busy.get(key, 0.0) + (MIG_PROCESS_LOAD if util is None else util)
    for key, mib in unlisted_mib.items():
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


def sharing_pods(node: SimNode) -> dict[Device, list[tuple[SimPod, str]]]:
    """What dcgm-exporter's PodResources mapping for --kubernetes-virtual-gpus holds: per
    device (GPU, GPU instance), each pod the kubelet gives it to, with the replica number the
    device ID ends in (``vgpu``; empty for a whole device), in the kubelet's order."""
    out: dict[Device, list[tuple[SimPod, str]]] = {}
    by_uuid = {g.uuid: (g.index, None) for g in node.gpus} | {
        m.uuid: (m.gpu_index, m.gi_id) for m in node.migs
    }
    for pod in node.pods:
        for device in pod.devices:
            uuid, _, replica = device.partition("::")
            key = by_uuid.get(uuid)
            if key is not None:
                out.setdefault(key, []).append((pod, replica))
    return out


def _pod_share(gpus: SimulatedGpus, t: float, field: str, pod: SimPod, key: Device) -> float:
    """The value 4.8.2 on writes for ``pod`` on device ``key`` (SI): its processes' used
    framebuffer (each one's bytes in whole MiB, process_metrics.go@691c927:88-100) or SM
    utilization (NVML's per-process whole %, none on a MIG instance), summed per pod
    (buildPodValueMap, formatted %d in 4.8's MiB and percent)."""
    mib = 0
    percent = 0
    for p in gpus.node.procs:
        if p.pod is not pod or (p.gpu, p.gi) != key:
            continue
        if field == "fb_used":
            mib += (gpus.proc_memory(p, t) or 0) // MIB
        else:
            util = gpus.proc_util(p, t)
            percent += 0 if util is None else round(100 * util)
    return mib * MIB if field == "fb_used" else percent / 100


def render_exporter(
    gpus: SimulatedGpus,
    t: float,
    story: ExporterStory,
    version: str = NEWEST,
    virtual_gpus: bool = False,
) -> str:
    """The SIMULATED dcgm-exporter's /metrics at ``t`` on ``gpus``' node, in the dialect of
    dcgm-exporter ``version`` (enricher.simnode.dialects), in Kubernetes mode, with or without
    ``--kubernetes-virtual-gpus``."""
    dia = dialect_for(version, virtual_gpus)
    node = gpus.node
    used, busy = device_usage(gpus, t, story.unlisted_mib)
    sharing = sharing_pods(node) if virtual_gpus else {}
    rows: list[Row] = []
    for name, _typ, _help in dia.counters:  # name: the table's field key
        for gpu in node.gpus:
            instances: list[MigDevice | None] = (
                [m for m in node.migs if m.gpu_index == gpu.index]
                if gpu.mig_enabled and name in _PER_INSTANCE
                else [None]
            )
            for mig in instances:
                gi = mig.gi_id if mig else None
                key = (gpu.index, gi)
                device = _device_labels(gpu, mig)
                value = _field_value(name, gpus, t, gpu, mig, used, busy)
                xid: list[tuple[str, str]] = []
                if name == "xid" and dia.xid_attributes:
                    xid = [("err_code", str(value)), ("err_msg", "No Error")]
                pod = story.upstream_pods.get(key)
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
    return render(dia, story.host, rows, node.driver)


def _field_value(
    name: str,
    gpus: SimulatedGpus,
    t: float,
    gpu: GpuDevice,
    mig: MigDevice | None,
    used: dict[Device, float],
    busy: dict[Device, float],
) -> int | float:
    """``name``'s value on the device at ``t``, in the field's SI unit."""
    gi = mig.gi_id if mig else None
    total = (
        40_960
        if mig and mig.profile == "3g.40gb"
        else (20_480 if mig and mig.profile == "2g.20gb" else (10_240 if mig else 81_920))
    )
    # Memory in whole MiB, as DCGM's MiB fields write it: rounded up, so the processes never
    # list more than the device's used framebuffer. The byte fields of 4.9.0 on carry the same
    # whole MiB times 2**20 (a simplification: DCGM 4.7 may write bytes the MiB fields round
    # away; one node, whichever release writes it).
    mem = math.ceil(used.get((gpu.index, gi), 0.0))
    reserved = 0 if mig else DRIVER_RESERVED_MIB
    load = min(1.0, busy.get((gpu.index, gi), 0.0))
    values: dict[str, int | float] = {
        "sm_clock": (1410 if load else 210) * MHZ,
        "mem_clock": 1593 * MHZ,
        "gpu_temp": round(34 + 40 * load * wave(t, 300, gpu.index)),
        "power": round(gpus.power_watts(gpu.index, t), 3),
        # NVML counts whole mJ.
        "energy": int(gpus.energy_millijoules(gpu.index, t)) / 1000,
        "pcie_replay": 0,
        # NVML's utilization is in whole percent.
        "gpu_util": round(100 * load) / 100,
        "mem_copy_util": round(40 * load) / 100,
        "xid": 0,
        "fb_capacity": total * MIB,
        "fb_free": max(0, total - mem - reserved) * MIB,
        "fb_used": mem * MIB,
        "fb_reserved": reserved * MIB,
        "gr_engine_active": round(load, 6),
        "uncorrectable_remapped_rows": 0,
        # One GPU has had a few correctable errors, as aging HBM does.
        "correctable_remapped_rows": 2 if gpu.index == 3 else 0,
        "row_remap_failure": 0,
        # Bytes per second on the GPU's PCIe link: a trickle when idle, more under load.
        "pcie_tx_rate": 4_000_000 + round(900_000_000 * load),
        "pcie_rx_rate": 2_000_000 + round(1_600_000_000 * load),
    }
    return values[name]


def make_exporter_app(body: Callable[[], str]) -> web.Application:
    """The SIMULATED dcgm-exporter's HTTP app: /metrics answers ``body()`` (the caller's
    collection, which holds still between collections as dcgm-exporter's does)."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=body(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
