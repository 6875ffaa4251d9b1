"""The kubelet PodResources source: parsing, device IDs, and a real gRPC server on a unix socket.

Real parts: the generated protobuf and gRPC modules, grpcio's client and server, a unix socket
in a temporary directory. Only the kubelet itself is simulated (no cluster here): the server is
the demo's SimulatedKubelet, answering with what each test sets.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from enricher.attribution import (
    REASON_MPS_SERVER,
    AllocatedDevice,
    Attribution,
    attribute,
    plan_devices,
    resolve_allocations,
)
from enricher.cli import parse_config
from enricher.families import RenderOptions, render_families
from enricher.labels import SHARED, Owner
from enricher.model import (
    CgroupRef,
    DeviceAllocation,
    DeviceIdKind,
    DeviceRef,
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    MigDevice,
    PodIndex,
    PodInfo,
    ProcInfo,
    Runtime,
    parse_device_id,
)
from enricher.podresources import (
    PodResourcesSource,
    check_socket,
    is_gpu_resource,
    parse_list_response,
)
from enricher.proto import api_pb2
from enricher.simnode.kubelet import SimulatedKubelet, list_response
from enricher.sourcetable import make_podresources_source

from .harness import short_dir

G0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
G1 = "GPU-1b1b1b1b-1111-4111-8111-111111111111"
G2 = "GPU-2c2c2c2c-2222-4222-8222-222222222222"
M21 = "MIG-21212121-2121-4121-8121-212121212121"
M22 = "MIG-22222222-2222-4222-8222-222222222222"
M_UNKNOWN = "MIG-99999999-9999-4999-8999-999999999999"

SNAPSHOT = GpuSnapshot(
    devices=(
        GpuDevice(0, G0, "NVIDIA A100-SXM4-80GB"),
        GpuDevice(1, G1, "NVIDIA A100-SXM4-80GB"),
        GpuDevice(2, G2, "NVIDIA A100-SXM4-80GB", mig_enabled=True),
    ),
    migs=(
        MigDevice(G2, 2, 1, 0, M21, "3g.40gb"),
        MigDevice(G2, 2, 2, 0, M22, "2g.20gb"),
    ),
)


def alloc(
    device_id: str, pod: str = "p", resource: str = "nvidia.com/gpu", container: str = "c"
) -> DeviceAllocation:
    return DeviceAllocation("ns", pod, container, resource, device_id)


# --------------------------------------------------------------------------- device IDs


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param(G0, DeviceRef(DeviceIdKind.GPU_UUID, uuid=G0), id="gpu-uuid"),
        pytest.param(
            f"{G0}::3", DeviceRef(DeviceIdKind.GPU_UUID, uuid=G0, replica=3), id="gpu-replica"
        ),
        pytest.param(M21, DeviceRef(DeviceIdKind.MIG_UUID, uuid=M21), id="mig-uuid"),
        pytest.param(
            f"{M21}::1", DeviceRef(DeviceIdKind.MIG_UUID, uuid=M21, replica=1), id="mig-replica"
        ),
        pytest.param(
            f"MIG-{G2}/5/0", DeviceRef(DeviceIdKind.MIG_LEGACY, uuid=G2, gi=5), id="mig-pre-r470"
        ),
        pytest.param("nvidia3", DeviceRef(DeviceIdKind.GPU_INDEX, index=3), id="gke-gpu"),
        pytest.param(
            "nvidia0/vgpu2", DeviceRef(DeviceIdKind.GPU_INDEX, index=0, replica=2), id="gke-shared"
        ),
        pytest.param(
            "nvidia1/gi3", DeviceRef(DeviceIdKind.GKE_MIG, index=1, gi=3), id="gke-partition"
        ),
        pytest.param(
            "nvidia1/gi3/vgpu0",
            DeviceRef(DeviceIdKind.GKE_MIG, index=1, gi=3, replica=0),
            id="gke-partition-shared",
        ),
        pytest.param("2", DeviceRef(DeviceIdKind.GPU_INDEX, index=2), id="index-strategy"),
        pytest.param(
            "2::1", DeviceRef(DeviceIdKind.GPU_INDEX, index=2, replica=1), id="index-replica"
        ),
        pytest.param(f"  {G0}\n", DeviceRef(DeviceIdKind.GPU_UUID, uuid=G0), id="whitespace"),
        pytest.param("", None, id="empty"),
        pytest.param("GPU-not-a-uuid", None, id="gpu-bad-uuid"),
        pytest.param(G0[4:], None, id="bare-uuid"),
        pytest.param("0:1", None, id="mig-index-strategy"),  # MIG slot index: not in NVML's view
        pytest.param(f"{G0}::", None, id="replica-without-number"),
        pytest.param(f"{G0}::x", None, id="replica-not-a-number"),
        pytest.param("fpga-0", None, id="other-vendor"),
        pytest.param("nvidia0/gi", None, id="gke-partition-cut"),
        pytest.param(G0 + "0" * 300, None, id="oversized"),
    ],
)
def test_parse_device_id(device_id: str, expected: DeviceRef | None) -> None:
    assert parse_device_id(device_id) == expected


@pytest.mark.parametrize(
    ("name", "extra", "expected"),
    [
        pytest.param("nvidia.com/gpu", (), True, id="gpu"),
        pytest.param("nvidia.com/gpu.shared", (), True, id="renamed-shared"),
        pytest.param("nvidia.com/mig-1g.10gb", (), True, id="mig"),
        pytest.param("nvidia.com/mig-3g.40gb.shared", (), True, id="mig-shared"),
        pytest.param("acme.com/gpu-small", (), False, id="custom-not-listed"),
        pytest.param("acme.com/gpu-small", ("acme.com/gpu-small",), True, id="custom-listed"),
        pytest.param("example.com/fpga", (), False, id="other-device"),
        pytest.param("nvidia.com/gpumem", (), False, id="not-a-prefix-match"),
    ],
)
def test_is_gpu_resource(name: str, extra: tuple[str, ...], expected: bool) -> None:
    assert is_gpu_resource(name, extra) is expected


# --------------------------------------------------------------------------- the wire format


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        pytest.param("ListPodResourcesResponse", "pod_resources", 1, id="response"),
        pytest.param("PodResources", "name", 1, id="pod-name"),
        pytest.param("PodResources", "namespace", 2, id="pod-namespace"),
        pytest.param("PodResources", "containers", 3, id="pod-containers"),
        pytest.param("ContainerResources", "name", 1, id="container-name"),
        pytest.param("ContainerResources", "devices", 2, id="container-devices"),
        pytest.param("ContainerResources", "cpu_ids", 3, id="container-cpus"),
        pytest.param("ContainerResources", "memory", 4, id="container-memory"),
        pytest.param("ContainerDevices", "resource_name", 1, id="devices-resource"),
        pytest.param("ContainerDevices", "device_ids", 2, id="devices-ids"),
        pytest.param("ContainerDevices", "topology", 3, id="devices-topology"),
        pytest.param("TopologyInfo", "nodes", 1, id="topology-nodes"),
        pytest.param("NUMANode", "ID", 1, id="numa-id"),
        # Dynamic Resource Allocation (the DRA devices of a container)
        pytest.param("ContainerResources", "dynamic_resources", 5, id="container-dra"),
        pytest.param("DynamicResource", "claim_name", 2, id="claim-name"),
        pytest.param("DynamicResource", "claim_namespace", 3, id="claim-namespace"),
        pytest.param("DynamicResource", "claim_resources", 4, id="claim-resources"),
        pytest.param("ClaimResource", "cdi_devices", 1, id="cdi-devices"),
        pytest.param("ClaimResource", "driver_name", 2, id="driver"),
        pytest.param("ClaimResource", "pool_name", 3, id="pool"),
        pytest.param("ClaimResource", "device_name", 4, id="device"),
        pytest.param("CDIDevice", "name", 1, id="cdi-name"),
    ],
)
def test_proto_matches_the_kubelet_api(message: str, field: str, number: int) -> None:
    """The kubelet's field numbers (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto)."""
    descriptor = getattr(api_pb2, message).DESCRIPTOR
    assert descriptor.full_name == f"v1.{message}"
    assert descriptor.fields_by_name[field].number == number


def test_service_wire_name() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List"]


def _pod(ns: str, name: str, *containers: api_pb2.ContainerResources) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=ns, name=name, containers=list(containers))


def _ctr(name: str, *devices: tuple[str, list[str]]) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=name,
        devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices],
    )


def _bytes(*pods: api_pb2.PodResources) -> bytes:
    return api_pb2.ListPodResourcesResponse(pod_resources=list(pods)).SerializeToString()


def _with_dra_field(container: api_pb2.ContainerResources) -> api_pb2.ContainerResources:
    """The container plus field 5 (dynamic_resources), which our .proto does not declare."""
    raw = container.SerializeToString() + b"\x2a\x05\x12\x03gpu"
    return api_pb2.ContainerResources.FromString(raw)


@pytest.mark.parametrize(
    ("data", "extra", "limit", "expected", "skipped"),
    [
        pytest.param(
            _bytes(_pod("ml", "train", _ctr("t", ("nvidia.com/gpu", [G0, G1])))),
            (),
            100,
            [alloc(G0, "train", container="t"), alloc(G1, "train", container="t")],
            0,
            id="exclusive-gpus",
        ),
        pytest.param(
            _bytes(
                _pod("ml", "a", _ctr("c", ("nvidia.com/mig-3g.40gb", [M21]))),
                _pod("ml", "b", _ctr("c", ("nvidia.com/mig-2g.20gb", [M22]))),
            ),
            (),
            100,
            [
                alloc(M21, "a", "nvidia.com/mig-3g.40gb"),
                alloc(M22, "b", "nvidia.com/mig-2g.20gb"),
            ],
            0,
            id="mig",
        ),
        pytest.param(
            _bytes(
                _pod("ml", "a", _ctr("c", ("nvidia.com/gpu", [f"{G1}::0"]))),
                _pod("ml", "b", _ctr("c", ("nvidia.com/gpu", [f"{G1}::1", f"{G1}::2"]))),
            ),
            (),
            100,
            [alloc(f"{G1}::0", "a"), alloc(f"{G1}::1", "b"), alloc(f"{G1}::2", "b")],
            0,
            id="time-slicing-replicas",
        ),
        pytest.param(
            _bytes(
                _pod(
                    "ml",
                    "a",
                    _ctr(
                        "c",
                        ("nvidia.com/gpu.shared", [f"{G1}::0"]),
                        ("acme.com/gpu", ["nvidia0"]),
                        ("example.com/fpga", ["fpga-0"]),
                    ),
                )
            ),
            ("acme.com/gpu",),
            100,
            [
                alloc(f"{G1}::0", "a", "nvidia.com/gpu.shared"),
                alloc("nvidia0", "a", "acme.com/gpu"),
            ],
            0,
            id="renamed-and-extra-resources",
        ),
        pytest.param(
            _bytes(_pod("ml", "a", _ctr("c", ("acme.com/gpu", ["nvidia0"])))),
            (),
            100,
            [],
            0,
            id="unlisted-resource-ignored",
        ),
        pytest.param(
            _bytes(
                _pod("", "nameless-ns", _ctr("c", ("nvidia.com/gpu", [G0]))),
                _pod("ml", "", _ctr("c", ("nvidia.com/gpu", [G1]))),
                _pod("ml", "ok", _ctr("c", ("nvidia.com/gpu", ["", "x" * 300, G2]))),
                _pod("ml", "cpu-only", api_pb2.ContainerResources(name="c", cpu_ids=[1, 2])),
            ),
            (),
            100,
            [alloc(G2, "ok")],
            4,
            id="malformed-entries-skipped",
        ),
        pytest.param(
            _bytes(_pod("ml", "a", _ctr("c", ("nvidia.com/gpu", [G0, G1, G2])))),
            (),
            2,
            [alloc(G0, "a"), alloc(G1, "a")],
            1,
            id="bounded",
        ),
        pytest.param(
            _bytes(_pod("ml", "a", _with_dra_field(_ctr("c", ("nvidia.com/gpu", [G0]))))),
            (),
            100,
            [alloc(G0, "a")],
            0,
            id="unknown-dra-field-skipped",
        ),
        pytest.param(b"", (), 100, [], 0, id="empty-answer"),
    ],
)
def test_parse_list_response(
    data: bytes,
    extra: tuple[str, ...],
    limit: int,
    expected: list[DeviceAllocation],
    skipped: int,
) -> None:
    # alloc() writes namespace "ns"; these responses use "ml".
    want = [DeviceAllocation("ml", a.pod, a.container, a.resource, a.device_id) for a in expected]
    assert parse_list_response(data, extra, limit) == (tuple(want), skipped)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xff\xff\xff", id="garbage"),
        pytest.param(b"\x0a\x10\x0a", id="truncated"),
        pytest.param(b"\x0a\x03\x0a\x81\x01", id="length-past-end"),
    ],
)
def test_parse_list_response_rejects_malformed(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a ListPodResourcesResponse"):
        parse_list_response(data)


@given(st.binary(max_size=512))
def test_parse_list_response_never_crashes(data: bytes) -> None:
    try:
        allocations, skipped = parse_list_response(data, limit=50)
    except ValueError:
        return
    assert len(allocations) <= 50 and skipped >= 0
    assert all(a.namespace and a.pod for a in allocations)


# --------------------------------------------------------------------------- the socket


def test_check_socket(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    assert check_socket(str(path)) == "absent"
    assert check_socket(str(tmp_path / "file" / "kubelet.sock")) == "absent"
    (tmp_path / "file").write_text("x")
    assert check_socket(str(tmp_path / "file" / "kubelet.sock")) == "absent"
    assert "not a unix socket" in (check_socket(str(tmp_path / "file")) or "")
    assert "not a unix socket" in (check_socket(str(tmp_path)) or "")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert check_socket(str(path)) is None


# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    ("allocation", "key"),
    [
        pytest.param(alloc(G0), (G0, ""), id="gpu"),
        pytest.param(alloc(f"{G1}::7"), (G1, ""), id="gpu-replica"),
        pytest.param(alloc(M22, resource="nvidia.com/mig-2g.20gb"), (G2, "2"), id="mig-via-nvml"),
        pytest.param(alloc(f"{M21}::1"), (G2, "1"), id="mig-replica"),
        pytest.param(alloc(f"MIG-{G2}/1/0"), (G2, "1"), id="mig-pre-r470"),
        pytest.param(alloc("nvidia1"), (G1, ""), id="gke-index"),
        pytest.param(alloc("nvidia1/vgpu3"), (G1, ""), id="gke-replica"),
        pytest.param(alloc("nvidia2/gi2"), (G2, "2"), id="gke-partition"),
        pytest.param(alloc("0"), (G0, ""), id="index-strategy"),
        pytest.param(alloc(M_UNKNOWN), None, id="mig-unknown-to-nvml"),
        pytest.param(alloc("nvidia9"), None, id="index-past-gpus"),
        pytest.param(alloc("nvidia2/gi9"), None, id="partition-unknown-to-nvml"),
        pytest.param(alloc("nvidia0/gi1"), None, id="partition-on-non-mig-gpu"),
        pytest.param(alloc("fpga-0"), None, id="unknown-scheme"),
    ],
)
def test_resolve_allocations(allocation: DeviceAllocation, key: tuple[str, str] | None) -> None:
    mapped, unmapped = resolve_allocations([allocation], SNAPSHOT)
    if key is None:
        assert (mapped, unmapped) == ([], [allocation])
    else:
        a = allocation
        assert mapped == [
            AllocatedDevice(key, a.namespace, a.pod, a.container, a.resource, a.device_id)
        ]
        assert unmapped == []


def test_resolve_without_nvml_keeps_only_self_describing_ids() -> None:
    """NVML down: a GPU UUID still names its GPU; MIG UUIDs and indices cannot be placed."""
    mapped, unmapped = resolve_allocations([alloc(G0), alloc(M21), alloc("nvidia0")], GpuSnapshot())
    assert [m.key for m in mapped] == [(G0, "")]
    assert [u.device_id for u in unmapped] == [M21, "nvidia0"]


# --------------------------------------------------------------------------- device owners


def pod(name: str, ns: str = "ml") -> PodInfo:
    return PodInfo(uid=f"uid-{ns}-{name}", namespace=ns, name=name)


def proc_on(gpu: str, pid: int, gi: int | None = None) -> GpuProcess:
    return GpuProcess(gpu, 0, gi, pid, 1 << 30, 0.5)


def on_pod(gpu: str, pid: int, who: PodInfo, container: str = "c", gi: int | None = None) -> Any:
    return Attribution(proc_on(gpu, pid, gi), None, who, container, "")


def unattributed(gpu: str, pid: int, reason: str, gi: int | None = None) -> Attribution:
    return Attribution(proc_on(gpu, pid, gi), None, None, "", reason)


def held(key: tuple[str, str], who: str, container: str = "c") -> AllocatedDevice:
    return AllocatedDevice(key, "ml", who, container, "nvidia.com/gpu", key[0])


@pytest.mark.parametrize(
    ("attributions", "allocated", "owners"),
    [
        pytest.param(
            [], [held((G0, ""), "idle")], {(G0, ""): Owner("ml", "idle", "c")}, id="allocated-idle"
        ),
        pytest.param(
            [on_pod(G0, 1, pod("busy"))],
            [held((G0, ""), "idle")],
            {(G0, ""): Owner("ml", "busy", "c", "uid-ml-busy")},  # the pod's UID for pod_uid
            id="process-evidence-first",
        ),
        pytest.param(
            [],
            [held((G1, ""), "a"), held((G1, ""), "b")],
            {(G1, ""): SHARED},
            id="replicas-of-two-pods",
        ),
        pytest.param(
            [],
            [held((G1, ""), "a", "c1"), held((G1, ""), "a", "c2")],
            {(G1, ""): Owner("ml", "a", "")},
            id="two-containers-one-pod",
        ),
        pytest.param(
            [],
            [held((G1, ""), "a"), held((G1, ""), "a")],
            {(G1, ""): Owner("ml", "a", "c")},
            id="two-replicas-one-container",
        ),
        pytest.param(
            [on_pod(G2, 1, pod("bert"), gi=1)],
            [held((G2, "1"), "bert"), held((G2, "2"), "eval")],
            {
                (G2, "1"): Owner("ml", "bert", "c", "uid-ml-bert"),
                (G2, "2"): Owner("ml", "eval", "c"),
                (G2, ""): Owner("ml", "bert", "c", "uid-ml-bert"),
            },
            id="mig-instances",
        ),
        pytest.param(
            [],
            [held((G2, "1"), "bert"), held((G2, "2"), "eval")],
            {
                (G2, "1"): Owner("ml", "bert", "c"),
                (G2, "2"): Owner("ml", "eval", "c"),
                (G2, ""): SHARED,
            },
            id="mig-idle-instances-share-the-gpu",
        ),
        pytest.param(
            [
                unattributed(G1, 9, REASON_MPS_SERVER),
                on_pod(G1, 10, pod("a")),
                on_pod(G1, 11, pod("b")),
            ],
            [],
            {(G1, ""): SHARED},
            id="mps-two-clients",
        ),
        pytest.param(
            [unattributed(G1, 9, REASON_MPS_SERVER), on_pod(G1, 10, pod("a"))],
            [],
            {(G1, ""): Owner("ml", "a", "c", "uid-ml-a")},
            id="mps-server-does-not-share",
        ),
        pytest.param(
            [unattributed(G1, 9, REASON_MPS_SERVER)],
            [held((G1, ""), "a")],
            {(G1, ""): Owner("ml", "a", "c")},
            id="mps-server-alone-is-no-process",
        ),
        pytest.param(
            [unattributed(G1, 9, REASON_MPS_SERVER)], [], {}, id="mps-server-alone-unallocated"
        ),
        pytest.param(
            [unattributed(G0, 9, "host_process")],
            [held((G0, ""), "idle")],
            {(G0, ""): SHARED},
            id="unknown-process-beats-allocation",
        ),
    ],
)
def test_plan_devices_with_allocations(
    attributions: list[Attribution],
    allocated: list[AllocatedDevice],
    owners: dict[tuple[str, str], Owner],
) -> None:
    assert dict(plan_devices(attributions, allocated).owners) == owners


def test_mps_daemons_are_not_workloads() -> None:
    """The MPS server runs in the device plugin's pod (one the MPS flags admit); there it is
    classified, not attributed. The same names in a pod the flags do not admit are that pod's."""
    cid, other_cid = "ab" * 32, "cd" * 32
    daemon_pod = PodInfo(
        uid="u-mps", namespace="nvidia", name="mps-control-daemon", mps_daemon=True
    )
    tenant_pod = PodInfo(uid="u-ten", namespace="ml", name="tenant")
    index = PodIndex(
        by_uid={"u-mps": daemon_pod, "u-ten": tenant_pod},
        by_container={cid: (daemon_pod, "mps"), other_cid: (tenant_pod, "c")},
    )
    cgroup = CgroupRef("u-mps", cid, Runtime.CONTAINERD, "/kubepods/x")
    tenant = CgroupRef("u-ten", other_cid, Runtime.CONTAINERD, "/kubepods/y")
    snapshot = GpuSnapshot(processes=tuple(proc_on(G0, pid) for pid in (1, 2, 3, 4, 5)))
    procs = {
        1: ProcInfo(1, 1, 1.0, "nvidia-cuda-mps", cgroup),  # /proc comm: 15 characters
        2: ProcInfo(2, 1, 1.0, "nvidia-cuda-mps-server", cgroup),
        3: ProcInfo(3, 1, 1.0, "python", cgroup),
        4: ProcInfo(4, 1, 1.0, "nvidia-cuda-mps", tenant),
        5: ProcInfo(5, 1, 1.0, "nvidia-cuda-mps-server", tenant),
    }
    got = [
        (a.process.pid, a.pod.name if a.pod else None, a.reason)
        for a in attribute(snapshot, procs, index)
    ]
    assert got == [
        (1, None, REASON_MPS_SERVER),
        (2, None, REASON_MPS_SERVER),
        (3, "mps-control-daemon", ""),
        (4, "tenant", ""),
        (5, "tenant", ""),
    ]


def test_render_allocated_counts_replicas() -> None:
    identities = {(G1, ""): (("gpu", "1"), ("UUID", G1))}
    allocated = [
        AllocatedDevice((G1, ""), "ml", "a", "c", "nvidia.com/gpu", f"{G1}::0"),
        AllocatedDevice((G1, ""), "ml", "a", "c", "nvidia.com/gpu", f"{G1}::4"),
        AllocatedDevice((G2, "2"), "ml", "b", "c", "nvidia.com/mig-2g.20gb", M22),
    ]
    text = render_families([], identities, RenderOptions(), allocated)
    lines = [ln for ln in text.splitlines() if ln.startswith("gpu_container_allocated{")]
    assert lines == [
        f'gpu_container_allocated{{UUID="{G1}",container="c",gpu="1",namespace="ml",pod="a",'
        'resource="nvidia.com/gpu"} 2.0',
        f'gpu_container_allocated{{GPU_I_ID="2",UUID="{G2}",container="c",namespace="ml",pod="b",'
        'resource="nvidia.com/mig-2g.20gb"} 1.0',
    ]


# --------------------------------------------------------------------------- a real gRPC server


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with short_dir("pr-") as directory:
        yield directory / "kubelet.sock"


@pytest.fixture
def kubelet(socket_path: Path) -> Iterator[Callable[[Callable[[Any], Any]], SimulatedKubelet]]:
    started: list[SimulatedKubelet] = []

    def start(respond: Callable[[Any], Any]) -> SimulatedKubelet:
        server = SimulatedKubelet(str(socket_path), respond)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace=None)


@pytest.fixture
def source(socket_path: Path) -> Iterator[PodResourcesSource]:
    src = PodResourcesSource(str(socket_path), timeout=2.0, extra_resources=("acme.com/gpu",))
    yield src
    src.close()


NODE_ALLOCATIONS = [
    DeviceAllocation("ml", "train-0", "trainer", "nvidia.com/gpu", G0),
    DeviceAllocation("inference", "chat-a", "server", "nvidia.com/gpu.shared", f"{G1}::0"),
    DeviceAllocation("inference", "chat-b", "server", "nvidia.com/gpu.shared", f"{G1}::1"),
    DeviceAllocation("research", "bert-0", "trainer", "nvidia.com/mig-3g.40gb", M21),
    DeviceAllocation("research", "eval-0", "eval", "acme.com/gpu", "nvidia2/gi2"),
]


def test_fetch_over_the_socket(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], source: PodResourcesSource
) -> None:
    """Exclusive GPUs, time-slicing replicas under the renamed resource, MIG, an extra
    resource name, and a non-GPU device the source must leave out."""
    entries = [*NODE_ALLOCATIONS, DeviceAllocation("ml", "fpga", "f", "example.com/fpga", "f0")]
    response = list_response(entries)
    server = kubelet(lambda _ctx: response)
    result = source.fetch()
    assert (result.enabled, result.ok, result.error) == (True, True, "")
    assert sorted(result.allocations, key=str) == sorted(NODE_ALLOCATIONS, key=str)
    assert server.calls == 1
    mapped, unmapped = resolve_allocations(result.allocations, SNAPSHOT)
    assert unmapped == []
    assert {(m.pod, m.key) for m in mapped} == {
        ("train-0", (G0, "")),
        ("chat-a", (G1, "")),
        ("chat-b", (G1, "")),
        ("bert-0", (G2, "1")),
        ("eval-0", (G2, "2")),
    }


def test_no_socket_path_is_disabled() -> None:
    src = PodResourcesSource("")
    result = src.fetch()
    assert (result.enabled, result.ok, result.error) == (False, False, "")
    assert src.errors_total == 0 and src.calls_total == 0


def test_socket_missing_is_down_not_disabled(tmp_path: Path) -> None:
    """A configured socket that is not there: the source was asked for, so it is failing."""
    path = tmp_path / "no-kubelet.sock"
    src = PodResourcesSource(str(path))
    result = src.fetch()
    assert (result.enabled, result.ok) == (True, False)
    assert result.error.startswith(f"absent: no socket at {path}")
    assert "--no-kubelet.enabled" in result.error
    assert src.errors_total == 1 and src.calls_total == 0


def test_socket_without_kubelet_is_an_error(socket_path: Path, source: PodResourcesSource) -> None:
    """A socket file left behind by a dead kubelet: enabled, and failing."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(socket_path))  # bound, never listening: connections are refused
        result = source.fetch()
    assert (result.enabled, result.ok) == (True, False)
    assert result.error.startswith("unavailable:")
    assert source.errors_total == 1


def test_path_that_is_not_a_socket_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    result = PodResourcesSource(str(path)).fetch()
    assert (result.enabled, result.ok) == (True, False)
    assert "not a unix socket" in result.error


def test_slow_kubelet_times_out_then_recovers(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], socket_path: Path
) -> None:
    release = threading.Event()
    response = list_response(NODE_ALLOCATIONS)

    def respond(_ctx: Any) -> Any:
        release.wait(10)  # held until the test lets go, long past the client's deadline
        return response

    server = kubelet(respond)
    src = PodResourcesSource(str(socket_path), timeout=0.2)
    try:
        slow = src.fetch()
        assert (slow.enabled, slow.ok) == (True, False)
        assert slow.error.startswith("timeout:")
        release.set()
        fast = src.fetch()
        assert fast.ok, fast.error
        assert len(fast.allocations) == 4  # acme.com/gpu is not configured on this source
        assert src.errors_total == 1
        assert server.calls == 2
    finally:
        release.set()
        src.close()


def test_erroring_kubelet_then_recovers(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], source: PodResourcesSource
) -> None:
    failing = [True]
    response = list_response(NODE_ALLOCATIONS)

    def respond(ctx: Any) -> Any:
        if failing[0]:
            ctx.abort(grpc.StatusCode.INTERNAL, "podresources: internal error")
        return response

    kubelet(respond)
    first = source.fetch()
    assert (first.enabled, first.ok) == (True, False)
    assert first.error == "internal: List failed: podresources: internal error"
    failing[0] = False
    second = source.fetch()
    assert second.ok and len(second.allocations) == len(NODE_ALLOCATIONS)
    assert source.errors_total == 1


def test_kubelet_restart_is_followed(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], source: PodResourcesSource
) -> None:
    response = list_response(NODE_ALLOCATIONS[:1])
    first = kubelet(lambda _ctx: response)
    assert source.fetch().ok
    # Restarted between two scrapes: the connection we held is gone, the new kubelet answers.
    first.stop(grace=None)
    second = kubelet(lambda _ctx: response)
    back = source.fetch()
    assert back.ok, back.error
    # Down during a scrape: its socket is removed, so the source is down (not disabled), and it
    # never serves the allocations it saw before.
    second.stop(grace=None)
    down = source.fetch()
    assert (down.enabled, down.ok, down.allocations) == (True, False, ())
    assert down.error.startswith("absent:")
    kubelet(lambda _ctx: response)
    again = source.fetch()
    assert again.ok, again.error
    assert [a.pod for a in again.allocations] == ["train-0"]
    assert source.errors_total == 1


def test_never_two_calls_at_once(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], source: PodResourcesSource
) -> None:
    entered = threading.Event()
    release = threading.Event()
    response = list_response(NODE_ALLOCATIONS)

    def respond(_ctx: Any) -> Any:
        entered.set()
        release.wait(10)
        return response

    server = kubelet(respond)
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(source.fetch()))
    first.start()
    try:
        assert entered.wait(10), "the kubelet never saw the first call"
        second = source.fetch()  # while the first is still in flight
        assert (second.ok, second.error.split(":")[0]) == (False, "busy")
    finally:
        release.set()
        first.join(10)
    assert results and results[0].ok
    assert (server.calls, server.max_concurrent) == (1, 1)


def test_oversized_answer_is_refused(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], socket_path: Path
) -> None:
    many = [alloc(f"{G0}::{i}", f"pod-{i}") for i in range(200)]
    response = list_response(many)
    kubelet(lambda _ctx: response)
    src = PodResourcesSource(str(socket_path), max_message_bytes=4096)
    try:
        result = src.fetch()
    finally:
        src.close()
    assert (result.enabled, result.ok) == (True, False)
    assert result.error.startswith("resource_exhausted:")


def test_allocations_are_bounded(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet], socket_path: Path
) -> None:
    response = list_response([alloc(f"{G0}::{i}", f"pod-{i}") for i in range(30)])
    kubelet(lambda _ctx: response)
    src = PodResourcesSource(str(socket_path), max_allocations=10)
    try:
        result = src.fetch()
    finally:
        src.close()
    assert result.ok and len(result.allocations) == 10 and result.skipped == 20


def test_socket_path_is_not_cwd_relative(
    kubelet: Callable[[Callable[[Any], Any]], SimulatedKubelet],
    socket_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relative --kubelet.pod-resources-socket works from the directory it names."""
    response = list_response(NODE_ALLOCATIONS[:1])
    kubelet(lambda _ctx: response)
    monkeypatch.chdir(socket_path.parent)
    src = PodResourcesSource(os.path.basename(socket_path))
    try:
        assert src.fetch().ok
    finally:
        src.close()


# --------------------------------------------------------------------------- flags


def test_kubelet_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    _, cfg, _ = parse_config(["--kube.node-name", "gpu-1"])
    assert cfg.kubelet_pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert cfg.kubelet_enabled is None and cfg.kubelet_active
    assert (cfg.kubelet_timeout, cfg.kubelet_gpu_resources) == (2.0, ())
    src = make_podresources_source(cfg)
    assert src is not None and src.timeout == 2.0
    monkeypatch.setenv("ENRICHER_KUBELET_GPU_RESOURCES", "acme.com/gpu, ,example.com/vgpu")
    monkeypatch.setenv("ENRICHER_KUBELET_TIMEOUT", "0.5")
    _, cfg, _ = parse_config(["--kubelet.pod-resources-socket", "/run/k.sock"])
    assert cfg.kubelet_pod_resources_socket == "/run/k.sock"
    assert cfg.kubelet_gpu_resources == ("acme.com/gpu", "example.com/vgpu")
    assert cfg.kubelet_timeout == 0.5
    src = make_podresources_source(cfg)
    assert src is not None and src.extra_resources == ("acme.com/gpu", "example.com/vgpu")


def test_empty_socket_flag_switches_the_source_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENRICHER_KUBELET_POD_RESOURCES_SOCKET", "")
    _, cfg, _ = parse_config([])
    assert cfg.kubelet_pod_resources_socket == ""
    assert make_podresources_source(cfg) is None


@pytest.mark.parametrize(
    ("argv", "env", "active"),
    [
        pytest.param(["--kube.node-name", "n"], {}, True, id="kubernetes"),
        pytest.param([], {}, False, id="docker-host"),
        pytest.param(["--kube.node-name", "n", "--no-kubelet.enabled"], {}, False, id="off"),
        pytest.param(
            ["--kube.node-name", "n"], {"ENRICHER_KUBELET_ENABLED": "false"}, False, id="off-env"
        ),
        pytest.param(["--kubelet.enabled"], {}, True, id="on-without-kubernetes"),
        pytest.param(["--kubelet.pod-resources-socket", "/run/k.sock"], {}, True, id="socket"),
        pytest.param(
            ["--kubelet.pod-resources-socket", "/run/k.sock", "--no-kubelet.enabled"],
            {},
            False,
            id="socket-but-off",
        ),
        pytest.param(
            ["--kube.node-name", "n", "--kubelet.pod-resources-socket="], {}, False, id="empty"
        ),
    ],
)
def test_switching_the_source_off_takes_a_flag(
    argv: list[str], env: dict[str, str], active: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On by default with Kubernetes (or when a socket is named), whether or not the socket is
    there; off only when asked."""
    monkeypatch.delenv("NODE_NAME", raising=False)
    for name, val in env.items():
        monkeypatch.setenv(name, val)
    _, cfg, _ = parse_config(argv)
    assert cfg.kubelet_active is active
    assert (make_podresources_source(cfg) is not None) is active


def test_enabled_without_a_socket_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(["--kubelet.enabled", "--kubelet.pod-resources-socket="])
    assert info.value.code == 2
    assert "--kubelet.enabled needs" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_kubelet_timeout_must_be_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(["--kubelet.timeout", value])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err
