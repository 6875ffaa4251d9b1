"""Attribution, pure: who owns each GPU process, and what each device series names.

No I/O, no event loop, no globals. ``attribute`` decides who owns each GPU process (``pod_of``
reads a cgroup's pod evidence, the ``resolve`` command too), ``resolve_allocations`` puts the
kubelet's allocations on devices, ``device_taints`` the DRA driver's taints, ``plan_devices``
decides what each device series names, and ``nvml_identities`` gives NVML's devices
dcgm-exporter's labels where the upstream has none.
What the enricher writes of it is in ``families``.

On a host without Kubernetes, a process in a container is attributed to its Docker container
(``docker_lookup_ids`` says what to ask the Docker source, ``attribute`` picks the answer):
its series then carry ``container`` = the container's name, and ``namespace``/``pod`` empty.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .cgroups import container_chain
from .labels import SHARED, DeviceKey, Owner, RewritePlan
from .model import (
    CgroupRef,
    DeviceAllocation,
    DeviceIdKind,
    DeviceTaint,
    DockerContainer,
    DraDevice,
    GpuProcess,
    GpuSnapshot,
    MigInfo,
    PodIndex,
    PodInfo,
    ProcError,
    ProcInfo,
    parse_device_id,
)
from .promclient import RUNTIME_PREFIXES

# Why a GPU process was not attributed to a pod: the `reason` label of
# gpu_unattributed_memory_used_bytes. ProcError values are reasons too.
REASON_HOST = "host_process"
REASON_NOT_IN_POD = "container_not_in_pod"
REASON_UNKNOWN_CGROUP = "unknown_cgroup"
REASON_POD_NOT_FOUND = "pod_not_found"
REASON_CONFLICT = "cgroup_pod_mismatch"
# Docker mode: Docker says no container of the cgroup's chain exists (any more).
REASON_CONTAINER_NOT_FOUND = "container_not_found"
# The MPS control daemon and server: infrastructure that holds GPU memory for its clients, not
# a workload. It never names a device's pod nor counts as a pod's usage. A process's name is
# its own choice, so the name counts only on the host or in a pod the MPS flags admit
# (PodInfo.mps_daemon): anywhere else such a process is its pod's, like any other.
REASON_MPS_SERVER = "mps_server"
# /proc/<pid>/comm keeps 15 characters: nvidia-cuda-mps-control and nvidia-cuda-mps-server
# both read "nvidia-cuda-mps".
MPS_DAEMON_COMM_PREFIX = "nvidia-cuda-mps"

# The families the enricher writes, prometheus_client's process_* and python_* among them: an
# upstream family of such a name is dropped, so no family is written twice.
_RESERVED_PREFIXES = (*RewritePlan().reserved_prefixes, *RUNTIME_PREFIXES)


@dataclass(frozen=True, slots=True)
class Attribution:
    """One GPU process and who owns it: a pod, or (Docker mode) a Docker container, whose name
    is then ``container``; neither means unattributed, with ``reason``."""

    process: GpuProcess
    info: ProcInfo | None
    pod: PodInfo | None
    container: str
    reason: str
    docker: DockerContainer | None = None

    @property
    def attributed(self) -> bool:
        return self.pod is not None or self.docker is not None

    @property
    def device_key(self) -> DeviceKey:
        gi = self.process.gi_id
        return (self.process.gpu_uuid, "" if gi is None else str(gi))

    @property
    def comm(self) -> str:
        return self.info.comm if self.info is not None else ""


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device (or replica of a shared one) the kubelet gave a container, on a device key."""

    key: DeviceKey
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    dra: DraDevice | None = None  # a DRA device: its claim, driver, pool and device names
    # A DRA MIG device: what its ResourceSlice says of it (its MIG UUID and profile).
    dra_mig: MigInfo | None = None


def is_mps_daemon(comm: str) -> bool:
    """Whether a process name is the MPS control daemon's or server's. The name alone proves
    nothing (any process can take it): ``attribute`` also asks where the process runs."""
    return comm.startswith(MPS_DAEMON_COMM_PREFIX)


def mps_daemon_at(info: ProcInfo, owner: tuple[PodInfo | None, str, str] | None) -> bool:
    """Whether ``info`` is the MPS control daemon or server: named so (``is_mps_daemon``) and
    running where one can, on the host (a cgroup of no container) or in a pod marked
    ``mps_daemon``. ``owner`` is what ``pod_of`` said of its cgroup. ``attribute`` and the
    ``resolve`` command both ask here."""
    if not is_mps_daemon(info.comm) or info.cgroup is None:
        return False
    if owner is None:
        return info.cgroup.container_id is None
    return owner[0] is not None and owner[0].mps_daemon


def docker_lookup_ids(procs: Mapping[int, ProcInfo | ProcError]) -> list[str]:
    """The container IDs to ask Docker about: every ID in the cgroup path of each process that
    is in a container outside any pod (a nested container's outer ones too), in order."""
    ids: dict[str, None] = {}
    for info in procs.values():
        if isinstance(info, ProcError) or info.cgroup is None:
            continue
        cg = info.cgroup
        if cg.container_id is None or cg.pod_uid is not None:
            continue
        for cid in cgroup_containers(cg):
            ids[cid] = None
    return list(ids)


def cgroup_containers(cg: CgroupRef) -> tuple[str, ...]:
    """Every container ID a cgroup names, outermost first; its ``container_id`` is last."""
    chain = container_chain(cg.path)
    if cg.container_id is None or chain[-1:] == (cg.container_id,):
        return chain
    return (*(c for c in chain if c != cg.container_id), cg.container_id)


def choose_docker(
    chain: Sequence[str], answers: Mapping[str, DockerContainer | None]
) -> DockerContainer | None:
    """Which Docker container a cgroup's chain of container IDs (outermost first) is.

    The innermost one Docker knows; else the innermost one it could not be asked about, by
    short ID; None when Docker says none of them exists. A nested container (Docker in
    Docker) belongs to a daemon inside its outer container, which is what the host's Docker
    knows: that outer container is named. An ID missing from ``answers`` was not asked.
    """
    found = [answers.get(cid, DockerContainer.from_id(cid)) for cid in chain]
    for c in reversed(found):
        if c is not None and c.resolved:
            return c
    for c in reversed(found):
        if c is not None:
            return c
    return None


def pod_of(cg: CgroupRef, pods: PodIndex) -> tuple[PodInfo | None, str, str] | None:
    """Which pod and container a cgroup names: (pod, container, "") or, when it names a pod
    that cannot be told, (None, "", reason); None when it names no pod at all (a host process,
    or a container outside any pod).

    The container ID is the strongest evidence; the pod UID alone still names the pod (with an
    empty container) when the container has not reached the pod status yet. When the two
    disagree, nobody is named: a wrong pod label is worse than none. ``attribute`` and the
    ``resolve`` command both ask here, so they cannot disagree.
    """
    if cg.container_id is not None:
        hit = pods.by_container.get(cg.container_id)
        if hit is not None:
            pod, container = hit
            if cg.pod_uid is not None and cg.pod_uid not in (pod.uid, pod.mirror_of):
                return None, "", REASON_CONFLICT
            return pod, container, ""
    if cg.pod_uid is not None:
        by_uid = pods.by_uid.get(cg.pod_uid)
        return (by_uid, "", "") if by_uid is not None else (None, "", REASON_POD_NOT_FOUND)
    return None


def attribute(
    snapshot: GpuSnapshot,
    procs: Mapping[int, ProcInfo | ProcError],
    pods: PodIndex,
    docker: Mapping[str, DockerContainer | None] | None = None,
) -> list[Attribution]:
    """Map each GPU process to its pod and container (``pod_of``), or to the reason it has
    none.

    A process named as the MPS daemon is ``mps_server`` only where one can run
    (``mps_daemon_at``); in any other pod or container it is attributed like any other.

    ``docker`` (Docker mode) holds the Docker source's answers by container ID: a process in a
    container that is in no pod is then attributed to the container ``choose_docker`` picks,
    or is ``container_not_found``. Without it such a process is ``container_not_in_pod``.
    """
    out: list[Attribution] = []
    for proc in snapshot.processes:
        info = procs.get(proc.pid, ProcError.EXITED)
        if isinstance(info, ProcError):
            out.append(Attribution(proc, None, None, "", info.value))
            continue
        cg = info.cgroup
        if cg is None:
            out.append(Attribution(proc, info, None, "", REASON_UNKNOWN_CGROUP))
            continue
        owner = pod_of(cg, pods)
        if mps_daemon_at(info, owner):
            out.append(Attribution(proc, info, None, "", REASON_MPS_SERVER))
        elif owner is not None:
            out.append(Attribution(proc, info, *owner))
        elif cg.container_id is None:
            out.append(Attribution(proc, info, None, "", REASON_HOST))
        elif docker is None:
            out.append(Attribution(proc, info, None, "", REASON_NOT_IN_POD))
        else:
            found = choose_docker(cgroup_containers(cg), docker)
            if found is None:
                out.append(Attribution(proc, info, None, "", REASON_CONTAINER_NOT_FOUND))
            else:
                out.append(Attribution(proc, info, None, found.name, "", found))
    return out


def resolve_allocations(
    allocations: Iterable[DeviceAllocation],
    snapshot: GpuSnapshot,
    dra_uuids: Mapping[tuple[str, str, str], str] | None = None,
    dra_migs: Mapping[tuple[str, str, str], MigInfo] | None = None,
) -> tuple[list[AllocatedDevice], list[DeviceAllocation]]:
    """Put each allocated device on its device key; also return those that fit no device.

    ``GPU-<uuid>`` (and its replicas) names its GPU even when NVML is down; ``MIG-<uuid>`` is
    looked up in NVML's MIG devices; GPU indices (GKE's ``nvidia0``, the plugin's index
    strategy) in NVML's GPUs. A DRA device is the UUID its driver's ResourceSlice gives it
    (``dra_uuids``, by driver, pool and device name), read the same way; without one it is
    unmapped. A DRA MIG device (``MIG-<uuid>``) is its MIG instance (``GPU_I_ID``) through
    NVML's MIG devices, and only where its slice's ``parentUUID`` (``dra_migs``), when given,
    is the GPU NVML puts that MIG device on; it keeps its slice's MIG attributes
    (``AllocatedDevice.dra_mig``). An ID that names nothing NVML reported stays unmapped:
    guessing would risk naming the wrong pod.
    """
    by_index = {d.index: d.uuid for d in snapshot.devices}
    migs = {m.uuid: m for m in snapshot.migs}
    instances = {(m.gpu_uuid, m.gi_id) for m in snapshot.migs}
    slices = dra_uuids or {}
    slice_migs = dra_migs or {}
    mapped: list[AllocatedDevice] = []
    unmapped: list[DeviceAllocation] = []
    for alloc in allocations:
        dra_mig: MigInfo | None = None
        if alloc.dra is not None:
            ref = parse_device_id(slices.get(alloc.dra.slice_key, ""))
            if ref is not None and ref.kind not in (DeviceIdKind.GPU_UUID, DeviceIdKind.MIG_UUID):
                ref = None
            if ref is not None and ref.kind is DeviceIdKind.MIG_UUID:
                dra_mig = slice_migs.get(alloc.dra.slice_key) or MigInfo(ref.uuid)
        else:
            ref = parse_device_id(alloc.device_id)
        key: DeviceKey | None = None
        if ref is None:
            pass
        elif ref.kind is DeviceIdKind.GPU_UUID:
            key = (ref.uuid, "")
        elif ref.kind is DeviceIdKind.MIG_UUID:
            mig = migs.get(ref.uuid)
            key = (mig.gpu_uuid, str(mig.gi_id)) if mig is not None else None
            parent = dra_mig.parent_uuid if dra_mig is not None else ""
            if mig is not None and parent and parent != mig.gpu_uuid:
                key = None  # the slice puts it on another GPU than NVML does: trust neither
        elif ref.kind is DeviceIdKind.MIG_LEGACY:
            key = (ref.uuid, str(ref.gi))
        elif ref.index is not None and ref.index in by_index:
            uuid = by_index[ref.index]
            if ref.kind is DeviceIdKind.GPU_INDEX:
                key = (uuid, "")
            elif ref.gi is not None and (uuid, ref.gi) in instances:
                key = (uuid, str(ref.gi))
        if key is None:
            unmapped.append(alloc)
        else:
            mapped.append(
                AllocatedDevice(
                    key,
                    alloc.namespace,
                    alloc.pod,
                    alloc.container,
                    alloc.resource,
                    alloc.device_id,
                    alloc.dra,
                    dra_mig,
                )
            )
    return mapped, unmapped


def dra_slice_keys(allocations: Iterable[DeviceAllocation]) -> list[tuple[str, str, str]]:
    """The (driver, pool, device) of each DRA device among ``allocations``, once each, in
    order: what to look up in the ResourceSlices."""
    return list(dict.fromkeys(a.dra.slice_key for a in allocations if a.dra is not None))


def device_taints(
    taints: Mapping[tuple[str, str, str], Sequence[DeviceTaint]],
    uuids: Mapping[tuple[str, str, str], str],
    snapshot: GpuSnapshot,
) -> dict[DeviceKey, tuple[DeviceTaint, ...]]:
    """The taints of each device key, from the DRA devices' taints and UUIDs (by driver,
    pool and device name, as the ResourceSlices give them), found as allocations are: a GPU
    UUID names its GPU even when NVML is down; a MIG UUID names its instance (``GPU_I_ID``)
    only through NVML's MIG devices, and is left out otherwise. Two DRA devices of one device
    key (two drivers describing one GPU) give it the taints of both, once each; each device's
    taints are sorted by key, value and effect."""
    migs = {m.uuid: (m.gpu_uuid, str(m.gi_id)) for m in snapshot.migs}
    out: dict[DeviceKey, set[DeviceTaint]] = {}
    for slice_key, given in taints.items():
        ref = parse_device_id(uuids.get(slice_key, ""))
        key: DeviceKey | None = None
        if ref is None:
            pass
        elif ref.kind is DeviceIdKind.GPU_UUID and ref.replica is None:
            key = (ref.uuid, "")
        elif ref.kind is DeviceIdKind.MIG_UUID and ref.replica is None:
            key = migs.get(ref.uuid)
        if key is not None and given:
            out.setdefault(key, set()).update(given)
    return {
        key: tuple(sorted(found, key=lambda t: (t.key, t.value, t.effect)))
        for key, found in sorted(out.items())
    }


def _owner_of(
    who_set: set[tuple[str, str, str] | None],
    seen_uids: Mapping[tuple[str, str], str],
    index_uids: Mapping[tuple[str, str], str],
) -> Owner:
    if None in who_set:
        return SHARED
    pods = {(ns, pod) for ns, pod, _ in who_set}  # type: ignore[misc]
    if len(pods) != 1:
        return SHARED
    ns, pod = next(iter(pods))
    containers = {c for _, _, c in who_set}  # type: ignore[misc]
    uid = seen_uids.get((ns, pod))
    if uid is None:
        uid = index_uids.get((ns, pod), "")
    return Owner(ns, pod, containers.pop() if len(containers) == 1 else "", uid)


def attributed_to(a: Attribution) -> tuple[str, str, str] | None:
    """(namespace, pod, container) of an attributed process (a Docker container's: empty
    namespace and pod); None when it is unattributed."""
    if a.pod is not None:
        return (a.pod.namespace, a.pod.name, a.container)
    if a.docker is not None:
        return ("", "", a.container)
    return None


def plan_devices(
    attributions: Iterable[Attribution],
    allocated: Iterable[AllocatedDevice] = (),
    pods: PodIndex | None = None,
    upstream_pod_labels: frozenset[str] = frozenset(),
    node: str = "",
) -> RewritePlan:
    """Decide what the device series of each busy or allocated device name; every series
    also gets the ``node`` label (``node``: its value; empty, none).

    Process evidence first. One pod owns every process on a device: that pod (and its
    container when there is one); one Docker container: that container's name, with empty
    namespace and pod. Anything else (several pods, or any process we could not
    attribute): the pod labels are cleared, because a device value cannot be split; the split
    lives in gpu_container_*. MPS daemons are not workloads and are left out.

    A device with no (workload) process is named after its allocation, when the kubelet gave it
    to containers of one pod; shared between pods (time-slicing or MPS replicas), it is cleared.
    A device that is neither busy nor allocated keeps the upstream's labels.

    A MIG instance's processes, or allocations, count for the instance and the whole GPU.

    Every other label about a pod follows that decision (the label policy, ``labels.relabel``): the
    owner's UID from ``pods`` for ``pod_uid``, and the label names of each pod the upstream
    may name, so that a series moved away from a pod drops what dcgm-exporter copied from it.
    """
    # The UIDs of the pods seen running here, over the index's (worked out once per index:
    # nothing here walks every pod of the node, so idle pods cost a collection nothing).
    seen_uids: dict[tuple[str, str], str] = {}
    owners_seen: dict[DeviceKey, set[tuple[str, str, str] | None]] = defaultdict(set)
    for a in attributions:
        if a.reason == REASON_MPS_SERVER:
            continue
        who = attributed_to(a)
        owners_seen[a.device_key].add(who)
        if a.process.gi_id is not None:
            owners_seen[(a.process.gpu_uuid, "")].add(who)
        if a.pod is not None:
            seen_uids[(a.pod.namespace, a.pod.name)] = a.pod.uid
    allocated_to: dict[DeviceKey, set[tuple[str, str, str] | None]] = defaultdict(set)
    for d in allocated:
        who = (d.namespace, d.pod, d.container)
        allocated_to[d.key].add(who)
        if d.key[1]:
            allocated_to[(d.key[0], "")].add(who)
    index_uids = pods.uid_by_name if pods is not None else {}
    owners = {
        key: _owner_of(who_set, seen_uids, index_uids) for key, who_set in owners_seen.items()
    }
    for key, who_set in allocated_to.items():
        if key not in owners:
            owners[key] = _owner_of(who_set, seen_uids, index_uids)
    return RewritePlan(
        owners=owners,
        pod_labels=pods.label_names_by_name if pods is not None else {},
        upstream_pod_labels=upstream_pod_labels,
        reserved_prefixes=_RESERVED_PREFIXES,
        node=node,
    )


def nvml_identities(
    snapshot: GpuSnapshot, node_name: str
) -> dict[DeviceKey, tuple[tuple[str, str], ...]]:
    """Device labels in dcgm-exporter's current scheme (4.8.3 on: ``hostname``, no longer
    ``Hostname``), from NVML, for devices the upstream did not show in this collection
    (upstream down, or a device it does not export)."""
    out: dict[DeviceKey, tuple[tuple[str, str], ...]] = {}
    host = (("hostname", node_name),) if node_name else ()
    for dev in snapshot.devices:
        out[(dev.uuid, "")] = (
            ("gpu", str(dev.index)),
            ("UUID", dev.uuid),
            ("device", f"nvidia{dev.index}"),
            ("modelName", dev.name),
            *host,
        )
    names = {d.uuid: d.name for d in snapshot.devices}
    for mig in snapshot.migs:
        out[(mig.gpu_uuid, str(mig.gi_id))] = (
            ("gpu", str(mig.gpu_index)),
            ("UUID", mig.gpu_uuid),
            ("device", f"nvidia{mig.gpu_index}"),
            ("modelName", names.get(mig.gpu_uuid, "")),
            ("GPU_I_PROFILE", mig.profile),
            ("GPU_I_ID", str(mig.gi_id)),
            *host,
        )
    return out
