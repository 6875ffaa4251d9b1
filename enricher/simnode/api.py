"""What the API server holds for a SIMULATED node: its pods (the one builder of pod objects
the demo, the tests and the benchmark share), the DRA driver's ResourceSlices, and a static
stand-in for the pod watch."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..model import DeviceTaint, PodIndex, PodInfo
from ..podparse import build_index
from ..sources import ReadResult
from .node import SimNode, SimPod

# NVIDIA's DRA driver (gpu.nvidia.com) publishes one pool per node, named after the node, and
# names a full GPU gpu-<minor number>; the ResourceSlice's uuid attribute says which GPU it is.
DRA_DRIVER = "gpu.nvidia.com"

# The GPU-instance profiles of an 80 GB A100 or H100 (the simulated GPUs): NVML's profile ID
# (the ID nvidia-smi mig -lgip lists), the placement's size in memory slices and the starts
# it allows.
MIG_PROFILES: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "1g.10gb": (19, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.20gb": (15, 2, (0, 2, 4, 6)),
    "2g.20gb": (14, 2, (0, 2, 4)),
    "3g.40gb": (9, 4, (0, 4)),
    "4g.40gb": (5, 4, (0,)),
    "7g.80gb": (0, 8, (0,)),
}


def container_id(seed: str) -> str:
    """A realistic 64-hex container id, stable for a given seed."""
    return hashlib.sha256(seed.encode()).hexdigest()


def pod_uid(namespace: str, name: str) -> str:
    """A stable RFC 4122 UID for a pod name, so that tests are reproducible."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{namespace}/{name}"))


ContainerSpec = tuple[str, str, str]  # (name, bare id or "" while waiting, runtime scheme)


def make_pod(
    name: str,
    namespace: str = "default",
    uid: str | None = None,
    node: str = "node-a",
    *,
    containers: Iterable[ContainerSpec] | None = None,
    init_containers: Iterable[ContainerSpec] = (),
    ephemeral_containers: Iterable[ContainerSpec] = (),
    owner: tuple[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gpu_request: bool | int = False,
    gpu_resource: str = "nvidia.com/gpu",
    gpu_limits_only: bool = False,
    ready: bool = True,
    phase: str = "Running",
    pod_ip: str = "10.244.1.17",
    mirror_of: str = "",
    claims: Sequence[str] = (),
) -> dict[str, Any]:
    """A pod as the API server returns it (camelCase JSON), with realistic status.

    ``containers`` are (name, bare id, runtime) where runtime is the containerID scheme
    ("containerd", "cri-o", "docker"); an empty id is a container still waiting to start.
    ``gpu_request`` puts ``gpu_resource`` into the first container's limits (and requests,
    unless ``gpu_limits_only``). ``mirror_of`` makes it a static pod's mirror: the mirror
    annotations and a Node owner, as the kubelet creates them. ``claims`` are ResourceClaims
    (by name) the pod holds and its first container uses, as a DRA pod names them.
    """
    if containers is None:
        containers = [("main", container_id(f"{namespace}/{name}/main"), "containerd")]
    containers = list(containers)
    uid = uid or pod_uid(namespace, name)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": "2024-05-01T10:00:00Z",
        "labels": dict(labels or {}),
    }
    notes = dict(annotations or {})
    if mirror_of:
        notes.setdefault("kubernetes.io/config.mirror", mirror_of)
        notes.setdefault("kubernetes.io/config.hash", mirror_of)
        notes.setdefault("kubernetes.io/config.source", "file")
        owner = owner or ("Node", node)
    if notes:
        meta["annotations"] = notes
    if owner is not None:
        kind, owner_name = owner
        api_version = {
            "ReplicaSet": "apps/v1",
            "StatefulSet": "apps/v1",
            "DaemonSet": "apps/v1",
            "Job": "batch/v1",
            "Node": "v1",
        }.get(kind, "example.com/v1")
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": owner_name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}/{owner_name}")),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]

    def spec_of(specs: Sequence[ContainerSpec], gpu: bool) -> list[dict[str, Any]]:
        out = []
        for i, (cname, _cid, _rt) in enumerate(specs):
            item: dict[str, Any] = {"name": cname, "image": f"registry.example/{cname}:1.0"}
            if gpu and i == 0:
                count = str(int(gpu_request))
                item["resources"] = {"limits": {gpu_resource: count}}
                if not gpu_limits_only:
                    item["resources"]["requests"] = {gpu_resource: count}
            if claims and i == 0:
                item.setdefault("resources", {})["claims"] = [{"name": n} for n in claims]
            out.append(item)
        return out

    def status_of(specs: Sequence[ContainerSpec], done: bool) -> list[dict[str, Any]]:
        out = []
        for cname, cid, runtime in specs:
            item: dict[str, Any] = {
                "name": cname,
                "image": f"registry.example/{cname}:1.0",
                "imageID": f"registry.example/{cname}@sha256:{container_id(cname)}",
                "restartCount": 0,
                "ready": bool(cid) and ready and not done,
                "started": bool(cid) and not done,
            }
            if cid:
                item["containerID"] = f"{runtime}://{cid}"
                if done:
                    item["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
                else:
                    item["state"] = {"running": {"startedAt": "2024-05-01T10:00:05Z"}}
            else:
                item["state"] = {"waiting": {"reason": "ContainerCreating"}}
            out.append(item)
        return out

    inits = list(init_containers)
    ephemerals = list(ephemeral_containers)
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": spec_of(containers, bool(gpu_request)),
        "restartPolicy": "Always",
    }
    if claims:
        spec["resourceClaims"] = [{"name": n, "resourceClaimName": n} for n in claims]
    if inits:
        spec["initContainers"] = spec_of(inits, False)
    if ephemerals:
        spec["ephemeralContainers"] = [
            {"name": c[0], "image": f"registry.example/{c[0]}:1.0"} for c in ephemerals
        ]
    cond = "True" if ready else "False"
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": "192.168.10.4",
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}] if pod_ip else [],
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": cond},
            {"type": "ContainersReady", "status": cond},
            {"type": "PodScheduled", "status": "True"},
        ],
        "containerStatuses": status_of(containers, False),
    }
    if inits:
        status["initContainerStatuses"] = status_of(inits, True)
    if ephemerals:
        status["ephemeralContainerStatuses"] = status_of(ephemerals, False)
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


def pod_object(pod: SimPod, node: str) -> dict[str, Any]:
    """``pod`` as the API server returns it, scheduled on ``node``."""
    return make_pod(
        pod.name,
        pod.namespace,
        pod.uid,
        node,
        containers=[(pod.container, pod.container_id, pod.runtime)],
        owner=pod.owner,
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        gpu_request=pod.gpu_request is not None,
        gpu_resource=pod.gpu_request or "nvidia.com/gpu",
        mirror_of=pod.mirror_of,
        claims=sorted({c.claim_name for c in pod.claims}),
    )


def resource_slices(
    node: SimNode,
    driver: str = DRA_DRIVER,
    *,
    taints: Mapping[str, Sequence[DeviceTaint]] | None = None,
    api_version: str = "v1",
) -> dict[str, Any]:
    """The SIMULATED DRA driver's ResourceSliceList for ``node`` (resource.k8s.io/v1), in
    the shape NVIDIA's driver publishes: one pool named after the node, a device per GPU
    (``gpu-<minor>``; the simulated minor number is the index) and per MIG device (see
    mig_device_name), each with its ``uuid`` attribute, a MIG device also with
    ``parentUUID`` and ``profile``.

    ``taints`` puts taints on devices, by the GPU's or MIG device's UUID, as the driver's
    health monitor does (``timeAdded`` is set, as the API server sets it). ``api_version``
    gives the shape that version serves: v1beta1 wraps each device's fields in ``basic``."""
    if api_version not in ("v1", "v1beta2", "v1beta1"):
        raise ValueError(f"resource.k8s.io/{api_version} serves no ResourceSlices")
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
    names = mig_device_names(node)
    devices += [
        {
            "name": names[m.uuid],
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": m.uuid},
                "parentUUID": {"string": m.gpu_uuid},
                "profile": {"string": m.profile},
            },
        }
        for m in node.migs
    ]
    for device in devices:
        given = (taints or {}).get(device["attributes"]["uuid"]["string"], ())
        if given:
            device["taints"] = [_taint_object(t) for t in given]
    if api_version == "v1beta1":
        devices = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in devices
        ]
    group_version = f"resource.k8s.io/{api_version}"
    return {
        "apiVersion": group_version,
        "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "1"},
        "items": [
            {
                "apiVersion": group_version,
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


def mig_device_names(node: SimNode) -> dict[str, str]:
    """The name NVIDIA's DRA driver gives each of ``node``'s MIG devices, by MIG UUID:
    ``gpu-<minor>-mig-<profile ID>-<placement start>-<placement size>`` (the simulated minor
    number is the index), each placed where ``node.mig_placements`` says or else in the first
    free placement its profile allows."""
    given = dict(node.mig_placements)
    used: dict[int, set[int]] = {}
    names: dict[str, str] = {}
    for m in node.migs:
        if m.profile not in MIG_PROFILES:
            raise ValueError(f"no simulated GPU-instance profile {m.profile!r}")
        profile_id, size, starts = MIG_PROFILES[m.profile]
        taken = used.setdefault(m.gpu_index, set())
        free = [s for s in starts if not taken & set(range(s, s + size))]
        start = given.get(m.uuid, free[0] if free else -1)
        if start not in free:
            raise ValueError(f"{m.uuid} ({m.profile}) has no free placement at {start}")
        taken.update(range(start, start + size))
        names[m.uuid] = f"gpu-{m.gpu_index}-mig-{profile_id}-{start}-{size}"
    return names


def _taint_object(taint: DeviceTaint) -> dict[str, Any]:
    """A device taint as the API server returns it: ``value`` only when there is one."""
    out: dict[str, Any] = {"key": taint.key}
    if taint.value:
        out["value"] = taint.value
    out["effect"] = taint.effect
    out["timeAdded"] = "2024-05-01T10:00:00Z"
    return out


def static_slice_lister(body: Mapping[str, Any]) -> Callable[[str, str, float], bytes]:
    """SIMULATED stand-in for the API server's ResourceSlice list: ``body`` for
    resource.k8s.io/v1, whatever node is asked."""
    data = json.dumps(body).encode()

    def list_slices(_version: str, _node: str, _timeout: float) -> bytes:
        return data

    return list_slices


class StaticPods:
    """SIMULATED stand-in for the pod watch: a node's fixed pods."""

    name = "kubernetes"
    enabled = True

    def __init__(self, pods: Sequence[PodInfo]) -> None:
        self._index = build_index(pods)
        self.up = True
        self.errors_total = 0
        self.last_sync = time.time()

    def index(self) -> PodIndex:
        return self._index

    def read(self) -> ReadResult[PodIndex]:
        return ReadResult(self._index, self.up)

    def upstream_pods(self) -> list[PodInfo]:
        return []

    def close(self) -> None:
        pass
