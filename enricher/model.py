"""Immutable snapshots that the data sources produce and the pure enrichment step consumes.

Every source module (``nvml``, ``procfs``, ``kube``, ``podresources``, ``docker``) returns these
types; nothing here does I/O. The few pure helpers here belong to a type: how a device plugin's
device ID reads (``parse_device_id``), a Docker container's short ID.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

# --------------------------------------------------------------------------- NVML


class ProcessKind(str, Enum):
    """Which NVML list a process came from."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS = "mps"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as NVML sees it."""

    index: int
    uuid: str  # "GPU-..."
    name: str  # model name, e.g. "NVIDIA A100-SXM4-80GB"
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a GPU instance + compute instance) of a MIG-enabled GPU."""

    gpu_uuid: str
    gpu_index: int
    gi_id: int  # GPU instance id: dcgm-exporter's GPU_I_ID label
    ci_id: int  # compute instance id
    uuid: str  # "MIG-..."
    profile: str  # e.g. "1g.10gb"; "" when NVML's name does not say


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process on one GPU or MIG instance, deduplicated per (device, pid)."""

    gpu_uuid: str
    gpu_index: int
    gi_id: int | None  # MIG GPU instance id, None on a full GPU
    pid: int
    used_memory_bytes: int | None  # None when NVML cannot tell (e.g. WDDM, not privileged)
    sm_util_ratio: float | None  # 0..1 since the previous sample; None where NVML has no data
    kinds: frozenset[ProcessKind] = frozenset({ProcessKind.COMPUTE})


@dataclass(frozen=True, slots=True)
class PowerReading:
    """One GPU's power draw and its own energy counter, from NVML or from dcgm-exporter.

    Both are of the whole GPU (NVML answers neither for a MIG device); None where the source
    has no reading (a board without a power sensor, a field the upstream does not collect).
    """

    gpu_uuid: str
    power_watts: float | None
    energy_millijoules: float | None  # total since the driver was loaded


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """What NVML said on one scrape."""

    devices: tuple[GpuDevice, ...] = ()
    migs: tuple[MigDevice, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    power: tuple[PowerReading, ...] = ()  # one per GPU that answered either reading
    driver_version: str = ""
    taken_at: float = 0.0  # wall clock (time.time()) when the process lists were read
    # Per-device problems on this read (a GPU lost, a call failing): the snapshot still holds
    # every device that answered; a non-empty tuple makes the nvml source report an error.
    errors: tuple[str, ...] = ()


# --------------------------------------------------------------------------- procfs


class Runtime(str, Enum):
    CONTAINERD = "containerd"
    CRIO = "cri-o"
    DOCKER = "docker"
    UNKNOWN = ""


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """What a process's cgroup path says about its container.

    ``pod_uid`` is normalised to the API form (dashes, lowercase); a static pod's
    32-hex config hash is kept as is. ``container_id`` is the bare 64-hex id.
    A host process has neither.
    """

    pod_uid: str | None
    container_id: str | None
    runtime: Runtime
    path: str  # the cgroup path the answer came from


class ProcError(str, Enum):
    """Why a PID could not be read. The value is the ``reason`` label users see."""

    EXITED = "process_exited"  # vanished before or while reading
    REUSED = "pid_reused"  # the PID now belongs to a process newer than NVML's listing
    UNREADABLE = "proc_unreadable"  # permission denied or malformed files


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    start_time_ticks: int  # field 22 of /proc/<pid>/stat
    start_time: float  # wall clock seconds (btime + ticks / CLK_TCK)
    comm: str
    cgroup: CgroupRef | None  # None: the cgroup file had no line we understand


# --------------------------------------------------------------------------- Kubernetes


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a pod that the enricher uses. Built by ``podparse.parse_pod``."""

    uid: str
    namespace: str
    name: str
    node: str = ""
    workload_kind: str = ""
    workload_name: str = ""
    gpu_requested: bool = False
    # Only the keys named by --kube.pod-labels / --kube.pod-annotations, sanitised later.
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Bare container id (no "containerd://" prefix) -> container name, from all status lists.
    containers: Mapping[str, str] = field(default_factory=dict)
    mirror_of: str = ""  # a mirror pod's kubernetes.io/config.mirror: the static pod's cgroup UID
    # Every label key of the pod as dcgm-exporter's --kubernetes-enable-pod-labels names it on
    # its series (each character outside [a-zA-Z0-9_] replaced by "_"), so that a series
    # re-attributed away from this pod can drop them.
    label_names: frozenset[str] = frozenset()
    pod_ip: str = ""
    ready: bool = False
    # Whether this pod may run the MPS control daemon and server (--mps.daemon-pod-namespace and
    # --mps.daemon-pod-selector): only then does a process named nvidia-cuda-mps-* in it count
    # as the daemon rather than as the pod's own workload.
    mps_daemon: bool = False


@dataclass(frozen=True, slots=True)
class PodIndex:
    """An immutable view of the node's pods, swapped whole when the watch changes it.

    What a collection asks of all the pods (each pod's UID and label names by namespace and
    name, how many pods there are) is worked out once per index, at the first collection that
    asks, so that a collection's cost does not grow with the pods the node merely runs, and a
    burst of watch events between two collections pays for it once (bench: growth part,
    docs/performance.md)."""

    by_uid: Mapping[str, PodInfo] = field(default_factory=dict)  # includes mirror_of keys
    by_container: Mapping[str, tuple[PodInfo, str]] = field(default_factory=dict)
    _by_name: _ByName | None = field(init=False, default=None, repr=False, compare=False)

    @property
    def uid_by_name(self) -> Mapping[tuple[str, str], str]:
        """(namespace, name) -> UID: the first pod of that name in ``by_uid``'s order."""
        return self._names().uids

    @property
    def label_names_by_name(self) -> Mapping[tuple[str, str], frozenset[str]]:
        """(namespace, name) -> the pod's label names (``PodInfo.label_names``), for the pods
        that have any. The same object for every call on this index, so the rewrite plans
        made from it compare equal by identity, without walking it."""
        return self._names().label_names

    @property
    def pods(self) -> int:
        """How many distinct pods (by UID) the index holds."""
        return self._names().pods

    def _names(self) -> _ByName:
        names = self._by_name
        if names is None:
            uids: dict[tuple[str, str], str] = {}
            labels: dict[tuple[str, str], frozenset[str]] = {}
            for info in self.by_uid.values():
                key = (info.namespace, info.name)
                uids.setdefault(key, info.uid)
                if info.label_names:
                    labels[key] = info.label_names
            distinct = len({p.uid for p in self.by_uid.values()})
            # Two threads that get here at once work out the same values; either is kept.
            names = _ByName(MappingProxyType(uids), MappingProxyType(labels), distinct)
            object.__setattr__(self, "_by_name", names)
        return names


@dataclass(frozen=True, slots=True)
class _ByName:
    uids: Mapping[tuple[str, str], str]
    label_names: Mapping[tuple[str, str], frozenset[str]]
    pods: int


# --------------------------------------------------------------------------- kubelet devices

MAX_ID_LENGTH = 256
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_ID = re.compile(rf"(GPU-{_UUID})")
_MIG_ID = re.compile(rf"(MIG-{_UUID})")
_MIG_LEGACY_ID = re.compile(rf"MIG-(GPU-{_UUID})/(\d{{1,4}})/(\d{{1,4}})")
_GKE_ID = re.compile(r"nvidia(\d{1,4})(?:/gi(\d{1,4}))?")
_INDEX_ID = re.compile(r"\d{1,4}")
# Replicas of a shared GPU: the NVIDIA plugin appends ::<n>, GKE /vgpu<n>.
_NVIDIA_REPLICA = re.compile(r"(.+)::(\d{1,6})")
_GKE_REPLICA = re.compile(r"(.+)/vgpu(\d{1,6})")


class DeviceIdKind(str, Enum):
    """The device plugin naming scheme a device ID follows."""

    GPU_UUID = "gpu_uuid"  # GPU-<uuid>: NVIDIA plugin, deviceIDStrategy uuid (the default)
    MIG_UUID = "mig_uuid"  # MIG-<uuid>: a MIG device, resolved to (GPU, GPU_I_ID) through NVML
    MIG_LEGACY = "mig_legacy"  # MIG-GPU-<uuid>/<gi>/<ci>: drivers before R470
    GPU_INDEX = "gpu_index"  # nvidia<N> (GKE) or <N> (NVIDIA plugin, deviceIDStrategy index)
    GKE_MIG = "gke_mig"  # nvidia<N>/gi<G>: a GKE GPU partition


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """What a device ID names. ``uuid`` is the GPU's or the MIG device's UUID, as NVML writes it."""

    kind: DeviceIdKind
    uuid: str = ""
    index: int | None = None  # GPU index (GPU_INDEX, GKE_MIG)
    gi: int | None = None  # GPU instance id (MIG_LEGACY, GKE_MIG)
    replica: int | None = None  # which replica of a shared GPU, None when not shared


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of a ResourceClaim (Dynamic Resource Allocation), as the kubelet names it.

    ``driver``, ``pool`` and ``device`` together identify the device: they are the names in the
    driver's ResourceSlices. The claim is the pod's (``claim_namespace`` is the pod's namespace).
    """

    claim_name: str
    claim_namespace: str
    driver: str
    pool: str
    device: str

    @property
    def slice_key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One taint on a DRA device (its driver's ResourceSlice): ``key`` (a label name such as
    ``gpu.nvidia.com/xid``), ``value`` ("" when none), ``effect`` as written (``None``,
    ``NoSchedule``, ``NoExecute``, or a newer one)."""

    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class MigInfo:
    """What a DRA driver's ResourceSlice says of a MIG device: its ``uuid`` (``MIG-...``), its
    GPU's ``parentUUID`` (``GPU-...``; "" when missing or not a GPU UUID) and its ``profile``
    (``1g.10gb``; "" when missing)."""

    uuid: str
    parent_uuid: str = ""
    profile: str = ""


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One GPU device the kubelet allocated to one container: a device plugin's device ID, or
    (``dra`` set) a DRA device, whose ``resource`` is its driver's name and ``device_id`` its
    device name."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    dra: DraDevice | None = None


def parse_device_id(device_id: str) -> DeviceRef | None:
    """What a device plugin's device ID names, or None for an ID we do not understand."""
    text = device_id.strip()
    if not text or len(text) > MAX_ID_LENGTH:
        return None
    replica: int | None = None
    for pattern in (_NVIDIA_REPLICA, _GKE_REPLICA):
        m = pattern.fullmatch(text)
        if m is not None:
            text, replica = m.group(1), int(m.group(2))
            break
    if m := _GPU_ID.fullmatch(text):
        return DeviceRef(DeviceIdKind.GPU_UUID, uuid=m.group(1), replica=replica)
    if m := _MIG_LEGACY_ID.fullmatch(text):
        return DeviceRef(
            DeviceIdKind.MIG_LEGACY, uuid=m.group(1), gi=int(m.group(2)), replica=replica
        )
    if m := _MIG_ID.fullmatch(text):
        return DeviceRef(DeviceIdKind.MIG_UUID, uuid=m.group(1), replica=replica)
    if m := _GKE_ID.fullmatch(text):
        index = int(m.group(1))
        if m.group(2) is None:
            return DeviceRef(DeviceIdKind.GPU_INDEX, index=index, replica=replica)
        return DeviceRef(DeviceIdKind.GKE_MIG, index=index, gi=int(m.group(2)), replica=replica)
    if _INDEX_ID.fullmatch(text):
        return DeviceRef(DeviceIdKind.GPU_INDEX, index=int(text), replica=replica)
    return None


# --------------------------------------------------------------------------- Docker

SHORT_ID_CHARS = 12


def short_id(container_id: str) -> str:
    """The 12-character form ``docker ps`` shows."""
    return container_id[:SHORT_ID_CHARS]


@dataclass(frozen=True, slots=True)
class DockerContainer:
    """One Docker container as the enricher reports it.

    ``resolved`` is False when only the cgroup was read (cgroup-only mode, or the API did not
    answer for a container never seen before): then ``name`` is the short ID and the other
    fields are empty.
    """

    id: str  # 64 lowercase hex, as in the cgroup path
    name: str  # without Docker's leading "/"
    image: str = ""  # the reference the container was created from (Config.Image)
    compose_project: str = ""
    compose_service: str = ""
    resolved: bool = True

    @property
    def short_id(self) -> str:
        return short_id(self.id)

    @classmethod
    def from_id(cls, container_id: str) -> DockerContainer:
        """What the cgroup alone says: the container named by its short ID."""
        return cls(id=container_id, name=short_id(container_id), resolved=False)


# --------------------------------------------------------------------------- health


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """One source's state on one scrape, rendered as dcgm_enricher_source_* series."""

    name: str  # upstream | nvml | procfs | kubernetes
    up: bool
    duration_seconds: float
    errors_total: int
    enabled: bool = True
