"""The families the enricher writes of an attribution, pure: per container, per process,
unattributed, allocated, pod info, Docker container info and the DRA driver's device taints.
The enricher's own health is ``selfmetrics``'.

No I/O: ``render_families`` takes the attribution (``attribution``) and returns exposition
text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .attribution import (
    AllocatedDevice,
    Attribution,
    attributed_to,
)
from .labels import DeviceKey
from .model import (
    DeviceTaint,
    DockerContainer,
    DraDevice,
    MigInfo,
    PodInfo,
)
from .promclient import LabelSets, MetricWriter
from .textformat import MAX_LABEL_VALUE_LENGTH

_LABEL_SANITIZE_RE = re.compile(r"[^a-zA-Z0-9_]")
NO_POD = (("namespace", ""), ("pod", ""), ("container", ""))


def device_labels(
    identities: Mapping[DeviceKey, tuple[tuple[str, str], ...]], key: DeviceKey
) -> tuple[tuple[str, str], ...]:
    """The device labels our families write for ``key``: the upstream's (``identities``), else
    ``UUID`` and, for a MIG instance, ``GPU_I_ID``."""
    return identities.get(key) or (("UUID", key[0]),) + ((("GPU_I_ID", key[1]),) if key[1] else ())


def sanitize_label_name(name: str) -> str:
    """Kube-state-metrics' rule: every character outside [a-zA-Z0-9_] becomes ``_``."""
    return _LABEL_SANITIZE_RE.sub("_", name)


MEM = "gpu_container_memory_used_bytes"
UTIL = "gpu_container_utilization_ratio"
PROC_MEM = "gpu_process_memory_used_bytes"
UNATTR = "gpu_unattributed_memory_used_bytes"
POD_INFO = "gpu_pod_info"
ALLOCATED = "gpu_container_allocated"
# dcgm-exporter's labels for a device given through DRA, in its order; on
# gpu_container_allocated they join with the upstream's series of the same claim.
DRA_LABELS = (
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
)


# And for a MIG device given through DRA, as dcgm-exporter writes them: the slice's
# ``profile`` and ``uuid`` (the MIG device's) attributes.
DRA_MIG_LABELS = ("dra_mig_profile", "dra_mig_device_uuid")


def _dra_values(dra: DraDevice, mig: MigInfo | None) -> tuple[str, ...]:
    names = (dra.claim_name, dra.claim_namespace, dra.driver, dra.pool, dra.device)
    return names if mig is None else (*names, mig.profile, mig.uuid)


CONTAINER_INFO = "gpu_container_info"
DEVICE_TAINT = "gpu_device_taint"


@dataclass(frozen=True, slots=True)
class RenderOptions:
    node_name: str = ""
    label_keys: Sequence[str] = ()
    annotation_keys: Sequence[str] = ()
    process_series: bool = False
    # Docker mode: gpu_container_info is written (its HELP and TYPE even with no container).
    docker: bool = False
    # The ResourceSlice source is on: gpu_device_taint is written (its HELP and TYPE even
    # with no taint).
    device_taints: bool = False


def render_families(
    attributions: Sequence[Attribution],
    identities: Mapping[DeviceKey, tuple[tuple[str, str], ...]],
    options: RenderOptions,
    allocated: Sequence[AllocatedDevice] = (),
    label_sets: LabelSets | None = None,
    taints: Mapping[DeviceKey, Sequence[DeviceTaint]] | None = None,
    memory: Mapping[tuple[DeviceKey, str], float] | None = None,
) -> str:
    """Render the per-container, per-process, unattributed, allocation and pod-info families,
    in Docker mode gpu_container_info, and with ``options.device_taints`` (or any taint)
    gpu_device_taint of ``taints`` (by device key: ``attribution.device_taints``).
    ``memory``: the bytes of each device that no listed process holds, by (device key,
    reason) (``memory.memory_parts``), written as unattributed memory beside the processes'.
    ``label_sets``: the caller's label memo (MetricWriter.render)."""
    w = MetricWriter()
    w.family(MEM, "GPU memory used by a container's processes on a GPU or MIG instance (NVML).")
    w.family(
        UTIL,
        "Share of SM time a container's processes used on a GPU since the previous NVML read "
        "(by default the previous dcgm-exporter collection), 0 to 1 (NVML process "
        "utilization; absent where NVML has no data, e.g. MIG).",
    )
    w.family(
        ALLOCATED,
        "GPUs and MIG instances the kubelet allocated to a container (PodResources API): 1 per "
        "device, or the number of replicas a container holds of a shared GPU.",
    )
    if options.process_series:
        w.family(PROC_MEM, "GPU memory used by one process (NVML), with its pod if known.")
    w.family(
        UNATTR,
        "GPU memory no container holds, by reason: processes of no known pod, the driver's "
        "reservation, memory no listed process holds.",
    )
    w.family(
        POD_INFO,
        "Pods with a process on a GPU of this node, for group_left joins; always 1.",
    )

    mem: dict[tuple[DeviceKey, str, str, str], int] = defaultdict(int)
    mem_known: set[tuple[DeviceKey, str, str, str]] = set()
    util: dict[tuple[DeviceKey, str, str, str], float] = defaultdict(float)
    unattr: dict[tuple[DeviceKey, str], float] = defaultdict(int)
    pods: dict[str, PodInfo] = {}
    containers: dict[str, DockerContainer] = {}

    def ident(key: DeviceKey) -> tuple[tuple[str, str], ...]:
        return device_labels(identities, key)

    for a in attributions:
        key = a.device_key
        p = a.process
        who = attributed_to(a)
        if who is None:
            unattr[(key, a.reason)] += p.used_memory_bytes or 0
        else:
            if a.pod is not None:
                pods[a.pod.uid] = a.pod
            elif a.docker is not None:
                containers[a.docker.id] = a.docker
            # Keyed by the values as they will be written (cut to the label length bound), so
            # two names that only differ past the cut add up instead of repeating a series.
            ns, pod, container = (v[:MAX_LABEL_VALUE_LENGTH] for v in who)
            ck = (key, ns, pod, container)
            if p.used_memory_bytes is not None:
                mem[ck] += p.used_memory_bytes
                mem_known.add(ck)
            if p.sm_util_ratio is not None:
                util[ck] += p.sm_util_ratio
        if options.process_series and p.used_memory_bytes is not None:
            ns, pod = (a.pod.namespace, a.pod.name) if a.pod else ("", "")
            w.sample(
                PROC_MEM,
                (
                    *ident(key),
                    ("namespace", ns),
                    ("pod", pod),
                    ("container", a.container),
                    ("pid", str(p.pid)),
                    ("process_name", a.comm),
                ),
                p.used_memory_bytes,
            )

    for ck in sorted(mem_known):
        key, ns, pod, container = ck
        labels = (*ident(key), ("namespace", ns), ("pod", pod), ("container", container))
        w.sample(MEM, labels, mem[ck])
    for ck in sorted(util):
        key, ns, pod, container = ck
        labels = (*ident(key), ("namespace", ns), ("pod", pod), ("container", container))
        w.sample(UTIL, labels, min(1.0, max(0.0, util[ck])))
    for part, value in (memory or {}).items():
        unattr[part] += value
    for key, reason in sorted(unattr):
        # Empty pod labels, present: with honor_labels Prometheus would otherwise attach the
        # enricher's own pod to memory that belongs to no pod.
        w.sample(UNATTR, (*ident(key), *NO_POD, ("reason", reason)), unattr[(key, reason)])

    label_names = _unique_sanitized("label_", options.label_keys)
    annotation_names = _unique_sanitized("annotation_", options.annotation_keys)
    for info in sorted(pods.values(), key=lambda p: (p.namespace, p.name, p.uid)):
        info_labels = [
            ("namespace", info.namespace),
            ("pod", info.name),
            ("pod_uid", info.uid),
            ("node", info.node or options.node_name),
            ("workload_kind", info.workload_kind),
            ("workload_name", info.workload_name),
            ("gpu_requested", "true" if info.gpu_requested else "false"),
            ("container", ""),  # blocks the scrape target's container label (honor_labels)
        ]
        info_labels += [(n, info.labels.get(k, "")) for k, n in label_names]
        info_labels += [(n, info.annotations.get(k, "")) for k, n in annotation_names]
        w.sample(POD_INFO, info_labels, 1)

    held: dict[tuple[DeviceKey, str, str, str, str, tuple[str, ...]], int] = defaultdict(int)
    for d in allocated:
        dra = () if d.dra is None else _dra_values(d.dra, d.dra_mig)
        held[(d.key, d.namespace, d.pod, d.container, d.resource, dra)] += 1
    for hk in sorted(held):
        key, ns, pod, container, resource, dra = hk
        labels = (
            *ident(key),
            ("namespace", ns),
            ("pod", pod),
            ("container", container),
            ("resource", resource),
            *zip((*DRA_LABELS, *DRA_MIG_LABELS), dra, strict=False),
        )
        w.sample(ALLOCATED, labels, held[hk])
    text = w.render(label_sets)
    if options.docker or containers:
        text += render_container_info(containers.values(), label_sets)
    if options.device_taints or taints:
        text += render_device_taints(taints or {}, identities, label_sets)
    return text


def render_device_taints(
    taints: Mapping[DeviceKey, Sequence[DeviceTaint]],
    identities: Mapping[DeviceKey, tuple[tuple[str, str], ...]],
    label_sets: LabelSets | None = None,
) -> str:
    """``gpu_device_taint{<device>, key, value, effect} 1`` per taint the DRA driver put on a
    GPU or MIG device (its ResourceSlice), with the device labels of the other device-keyed
    families. ``namespace``, ``pod`` and ``container`` are written empty, as on
    gpu_unattributed_memory_used_bytes: a taint is the device's, and with ``honor_labels:
    true`` no target label may land on it."""
    w = MetricWriter()
    w.family(
        DEVICE_TAINT,
        "Taints the DRA driver put on a GPU or MIG device of this node (its ResourceSlice), "
        "such as gpu.nvidia.com/xid: its health report; always 1.",
    )
    for key in sorted(taints):
        for taint in sorted(set(taints[key]), key=lambda t: (t.key, t.value, t.effect)):
            labels = (
                *device_labels(identities, key),
                *NO_POD,
                ("key", taint.key),
                ("value", taint.value),
                ("effect", taint.effect),
            )
            w.sample(DEVICE_TAINT, labels, 1)
    return w.render(label_sets)


def render_container_info(
    containers: Iterable[DockerContainer], label_sets: LabelSets | None = None
) -> str:
    """``gpu_container_info{container, container_id, image, compose_project, compose_service} 1``
    per container, for ``group_left`` joins; one series per container ID.

    ``namespace`` and ``pod`` are written empty, like on every other series, so that with
    ``honor_labels: true`` no target label lands on them.
    """
    by_id = {c.id: c for c in containers}
    w = MetricWriter()
    w.family(
        CONTAINER_INFO,
        "Docker containers with a process on a GPU of this host, for group_left joins; always 1.",
    )
    for c in sorted(by_id.values(), key=lambda c: (c.name, c.id)):
        w.sample(
            CONTAINER_INFO,
            (
                ("namespace", ""),
                ("pod", ""),
                ("container", c.name),
                ("container_id", c.id),
                ("image", c.image),
                ("compose_project", c.compose_project),
                ("compose_service", c.compose_service),
            ),
            1,
        )
    return w.render(label_sets)


def _unique_sanitized(prefix: str, keys: Sequence[str]) -> list[tuple[str, str]]:
    """(key, label name) pairs; a key whose sanitized name collides with an earlier one is
    skipped (the first wins), so a series never carries the same label twice."""
    out: list[tuple[str, str]] = []
    taken: set[str] = set()
    for key in keys:
        name = prefix + sanitize_label_name(key)
        if name in taken:
            continue
        taken.add(name)
        out.append((key, name))
    return out
