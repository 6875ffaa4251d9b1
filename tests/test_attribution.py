"""The rules of ``attribution.attribute()``, one row each: which GPU process is named after which
pod (or Docker container), and the reason when none is named."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from enricher.attribution import AllocatedDevice, attribute, plan_devices
from enricher.labels import Owner
from enricher.model import (
    CgroupRef,
    DockerContainer,
    GpuProcess,
    GpuSnapshot,
    PodInfo,
    ProcError,
    ProcInfo,
    Runtime,
)
from enricher.podparse import build_index

GPU = "GPU-00000000-0000-0000-0000-000000000001"
UID_A = "aaaaaaaa-1111-4222-8333-444444444444"
UID_B = "bbbbbbbb-1111-4222-8333-444444444444"
UID_GONE = "dddddddd-1111-4222-8333-444444444444"
UID_MPS = "cccccccc-1111-4222-8333-444444444444"
CID_MPS = "9" * 64
STATIC_HASH = "0123456789abcdef0123456789abcdef"
CID_A, CID_B, CID_STATIC, CID_NEW, CID_DOCKER = ("a" * 64, "b" * 64, "c" * 64, "e" * 64, "f" * 64)

PODS = build_index(
    [
        PodInfo(uid=UID_A, namespace="ml", name="train-a", containers={CID_A: "trainer"}),
        PodInfo(uid=UID_B, namespace="ml", name="serve-b", containers={CID_B: "server"}),
        PodInfo(
            uid=UID_MPS,
            namespace="nvidia-device-plugin",
            name="nvidia-device-plugin-mps-control-daemon-5wq8k",
            containers={CID_MPS: "mps-control-daemon"},
            mps_daemon=True,  # what podparse.parse_pod sets for a pod the MPS flags admit
        ),
        PodInfo(
            uid="mmmmmmmm-1111-4222-8333-444444444444",
            namespace="kube-system",
            name="static-node1",
            containers={CID_STATIC: "agent"},
            mirror_of=STATIC_HASH,
        ),
    ]
)
DOCKER = {CID_DOCKER: DockerContainer(CID_DOCKER, "jupyter")}


def cg(uid: str | None, cid: str | None) -> CgroupRef:
    path = "/kubepods/" + "/".join(p for p in (uid and f"pod{uid}", cid) if p)
    if uid is None and cid is not None:
        path = f"/docker/{cid}"
    return CgroupRef(uid, cid, Runtime.CONTAINERD if cid else Runtime.UNKNOWN, path)


def info(pid: int, cgroup: CgroupRef | None, comm: str = "python") -> ProcInfo:
    return ProcInfo(pid=pid, start_time_ticks=100, start_time=1.0, comm=comm, cgroup=cgroup)


@dataclass(frozen=True)
class Proc:
    """One GPU process as NVML listed it and what procfs said (None: not read at all)."""

    pid: int
    read: ProcInfo | ProcError | None
    gi: int | None = None


@dataclass(frozen=True)
class Want:
    pod: str | None  # the pod's name; None: no pod
    container: str
    reason: str
    device: tuple[str, str] = (GPU, "")


ROWS = [
    pytest.param(
        [Proc(1, info(1, cg(UID_A, CID_A)))],
        None,
        [Want("train-a", "trainer", "")],
        id="container-id-names-pod-and-container",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, CID_A)))],
        None,
        [Want("train-a", "trainer", "")],
        id="container-id-alone-is-enough",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_A, CID_NEW)))],
        None,
        [Want("train-a", "", "")],
        id="container-unknown-pod-uid-names-pod-only",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_B, CID_A)))],
        None,
        [Want(None, "", "cgroup_pod_mismatch")],
        id="uid-and-container-disagree-name-nobody",
    ),
    pytest.param(
        [Proc(1, info(1, cg(STATIC_HASH, CID_STATIC)))],
        None,
        [Want("static-node1", "agent", "")],
        id="static-pod-hash-matches-its-mirror-pod",
    ),
    pytest.param(
        [Proc(1, info(1, cg(STATIC_HASH, CID_NEW)))],
        None,
        [Want("static-node1", "", "")],
        id="static-pod-found-by-hash-alone",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_GONE, CID_NEW)))],
        None,
        [Want(None, "", "pod_not_found")],
        id="pod-not-found",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, None)))],
        None,
        [Want(None, "", "host_process")],
        id="host-process",
    ),
    pytest.param(
        [Proc(1, info(1, None))],
        None,
        [Want(None, "", "unknown_cgroup")],
        id="cgroup-not-understood",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, CID_DOCKER)))],
        None,
        [Want(None, "", "container_not_in_pod")],
        id="container-outside-pods-without-docker",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, CID_DOCKER)))],
        DOCKER,
        [Want(None, "jupyter", "")],
        id="docker-mode-names-the-container",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, CID_NEW)))],
        {**DOCKER, CID_NEW: None},
        [Want(None, "", "container_not_found")],
        id="docker-mode-container-gone",
    ),
    # The process name is the process's own choice (#30): it makes an MPS daemon only where
    # one can be, on the host or in a pod the MPS flags admit.
    pytest.param(
        [Proc(1, info(1, cg(UID_A, CID_A), comm="nvidia-cuda-mps"))],
        None,
        [Want("train-a", "trainer", "")],
        id="mps-name-in-a-tenant-pod-is-the-pods",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_MPS, CID_MPS), comm="nvidia-cuda-mps"))],
        None,
        [Want(None, "", "mps_server")],
        id="mps-daemon-in-the-daemon-pod",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_MPS, CID_MPS), comm="python"))],
        None,
        [Want("nvidia-device-plugin-mps-control-daemon-5wq8k", "mps-control-daemon", "")],
        id="other-process-in-the-daemon-pod-is-the-pods",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, None), comm="nvidia-cuda-mps"))],
        None,
        [Want(None, "", "mps_server")],
        id="mps-daemon-on-the-host",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_GONE, CID_NEW), comm="nvidia-cuda-mps"))],
        None,
        [Want(None, "", "pod_not_found")],
        id="mps-name-in-an-unknown-pod-is-not-a-daemon",
    ),
    pytest.param(
        [Proc(1, info(1, cg(None, CID_DOCKER), comm="nvidia-cuda-mps"))],
        DOCKER,
        [Want(None, "jupyter", "")],
        id="mps-name-in-a-docker-container-is-the-containers",
    ),
    pytest.param(
        [Proc(1, info(1, None, comm="nvidia-cuda-mps"))],
        None,
        [Want(None, "", "unknown_cgroup")],
        id="mps-name-with-an-unread-cgroup-is-not-a-daemon",
    ),
    pytest.param(
        [Proc(1, ProcError.REUSED)],
        None,
        [Want(None, "", "pid_reused")],
        id="pid-reused",
    ),
    pytest.param(
        [Proc(1, ProcError.EXITED)],
        None,
        [Want(None, "", "process_exited")],
        id="process-exited",
    ),
    pytest.param(
        [Proc(1, ProcError.UNREADABLE)],
        None,
        [Want(None, "", "proc_unreadable")],
        id="proc-unreadable",
    ),
    pytest.param(
        [Proc(1, None)],
        None,
        [Want(None, "", "process_exited")],
        id="not-read-counts-as-exited",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_A, CID_A))), Proc(2, info(2, cg(UID_B, CID_B)))],
        None,
        [Want("train-a", "trainer", ""), Want("serve-b", "server", "")],
        id="several-containers-on-one-device-each-named",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_A, CID_A))), Proc(2, info(2, cg(None, None)))],
        None,
        [Want("train-a", "trainer", ""), Want(None, "", "host_process")],
        id="shared-with-a-host-process-each-on-its-own",
    ),
    pytest.param(
        [Proc(1, info(1, cg(UID_A, CID_A)), gi=1), Proc(2, info(2, cg(UID_B, CID_B)), gi=2)],
        None,
        [Want("train-a", "trainer", "", (GPU, "1")), Want("serve-b", "server", "", (GPU, "2"))],
        id="mig-instances-keyed-by-gpu-instance",
    ),
]


@pytest.mark.parametrize(("procs", "docker", "want"), ROWS)
def test_attribute_rules(
    procs: list[Proc],
    docker: dict[str, DockerContainer | None] | None,
    want: list[Want],
) -> None:
    snapshot = GpuSnapshot(
        processes=tuple(
            GpuProcess(
                gpu_uuid=GPU,
                gpu_index=0,
                gi_id=p.gi,
                pid=p.pid,
                used_memory_bytes=1 << 30,
                sm_util_ratio=None,
            )
            for p in procs
        )
    )
    reads = {p.pid: p.read for p in procs if p.read is not None}
    got = attribute(snapshot, reads, PODS, docker)
    assert [
        Want(a.pod.name if a.pod else None, a.container, a.reason, a.device_key) for a in got
    ] == want
    for a, w in zip(got, want, strict=True):
        # Attributed exactly when a pod or a Docker container is named, never with a reason.
        assert a.attributed == (w.reason == "")
        assert (a.docker is not None) == (docker is not None and w.container != "")


def test_the_index_answers_by_pod_name_once_per_index() -> None:
    """What a collection asks of every pod (its UID and label names by namespace and name, how
    many pods there are) comes from the index, worked out once: the rewrite plans of one index
    share its label names (equal by identity), and an allocated device that runs nothing still
    gets its pod's UID. A collection's cost stays flat in the pods the node merely runs
    (bench: the growth part)."""
    labelled = PodInfo(
        uid=UID_GONE, namespace="ml", name="idle-c", label_names=frozenset({"app", "team"})
    )
    index = build_index([*PODS.by_uid.values(), labelled])
    assert len(index.by_uid) == 6 and index.pods == 5  # the mirror's hash is one more key
    assert index.uid_by_name[("kube-system", "static-node1")].startswith("mmmmmmmm")
    assert index.uid_by_name[("ml", "idle-c")] == UID_GONE
    assert dict(index.label_names_by_name) == {("ml", "idle-c"): labelled.label_names}

    allocated = [AllocatedDevice((GPU, ""), "ml", "idle-c", "main", "nvidia.com/gpu", GPU)]
    one, two = plan_devices([], allocated, index), plan_devices([], allocated, index)
    assert one.owners[(GPU, "")] == Owner("ml", "idle-c", "main", UID_GONE)
    assert one.pod_labels is two.pod_labels is index.label_names_by_name
    assert one == two
    assert plan_devices([], allocated).owners[(GPU, "")].uid == ""  # no index, no UID
