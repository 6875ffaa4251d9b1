"""GPUs given through Dynamic Resource Allocation: the kubelet's dynamic_resources, the node's
ResourceSlices, and what the enricher writes for them.

Real parts: the generated protobuf and gRPC modules over a unix socket (the demo's
SimulatedKubelet stands in for the kubelet), the real ``kubernetes`` client against the API
stand-in devkit/kubeapi.py for ResourceSlices, and the real Scraper end to end. No cluster and
no GPU exist here: those two are simulated.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from devkit.kubeapi import KubeApiStandIn, make_api_client, resource_slice
from enricher.attribution import dra_slice_keys, resolve_allocations
from enricher.families import ALLOCATED, RenderOptions, render_families
from enricher.model import (
    DeviceAllocation,
    DraDevice,
    GpuDevice,
    GpuSnapshot,
    MigDevice,
    MigInfo,
)
from enricher.podresources import PodResourcesSource, parse_list_response
from enricher.proto import api_pb2
from enricher.resourceslices import (
    NotServedError,
    ResourceSliceError,
    ResourceSlicesSource,
    api_client_lister,
    parse_slice_list,
)
from enricher.simnode.api import mig_device_names, resource_slices, static_slice_lister
from enricher.simnode.kubelet import SimulatedKubelet, allocations, list_response
from enricher.simnode.node import SimNode

from .conftest import examples
from .harness import short_dir

G0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
G1 = "GPU-1b1b1b1b-1111-4111-8111-111111111111"
G2 = "GPU-2c2c2c2c-2222-4222-8222-222222222222"
M21 = "MIG-21212121-2121-4121-8121-212121212121"
M_GONE = "MIG-99999999-9999-4999-8999-999999999999"
DRIVER = "gpu.nvidia.com"
NODE = "node-a"
SNAPSHOT = GpuSnapshot(
    devices=(
        GpuDevice(0, G0, "NVIDIA A100-SXM4-80GB"),
        GpuDevice(1, G1, "NVIDIA A100-SXM4-80GB"),
        GpuDevice(2, G2, "NVIDIA A100-SXM4-80GB", mig_enabled=True),
    ),
    migs=(MigDevice(G2, 2, 1, 0, M21, "3g.40gb"),),
)


def dra(device: str, claim: str = "c0", driver: str = DRIVER, pool: str = NODE) -> DraDevice:
    return DraDevice(claim, "ml", driver, pool, device)


def alloc(device: str, pod: str = "train-0", **kw: str) -> DeviceAllocation:
    d = dra(device, **kw)
    return DeviceAllocation("ml", pod, "trainer", d.driver, device, d)


def slice_obj(
    devices: list[Any],
    *,
    driver: str = DRIVER,
    pool: str = NODE,
    node: str = NODE,
    generation: int = 1,
) -> dict[str, Any]:
    return resource_slice(devices, node=node, driver=driver, pool=pool, generation=generation)


def dev(name: str, uuid: Any, attr: str = "uuid", basic: bool = False) -> dict[str, Any]:
    attrs = {attr: {"string": uuid}, "type": {"string": "gpu"}}
    return (
        {"name": name, "basic": {"attributes": attrs}}
        if basic
        else {"name": name, **{"attributes": attrs}}
    )


def body(*items: Any) -> bytes:
    return json.dumps({"kind": "ResourceSliceList", "items": list(items)}).encode()


# --------------------------------------------------------------------------- the wire format


def test_removed_class_name_stays_reserved() -> None:
    """Field 1 of DynamicResource (class_name, removed in Kubernetes 1.31) is never reused."""
    descriptor = api_pb2.DynamicResource.DESCRIPTOR
    assert 1 not in descriptor.fields_by_number


def _response(*claims: api_pb2.DynamicResource, ns: str = "ml", pod: str = "p") -> bytes:
    container = api_pb2.ContainerResources(name="c", dynamic_resources=list(claims))
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[api_pb2.PodResources(namespace=ns, name=pod, containers=[container])]
    )
    return bytes(response.SerializeToString())


def _claim(name: str, *devices: tuple[str, str, str], ns: str = "ml") -> api_pb2.DynamicResource:
    return api_pb2.DynamicResource(
        claim_name=name,
        claim_namespace=ns,
        claim_resources=[
            api_pb2.ClaimResource(driver_name=d, pool_name=p, device_name=n) for d, p, n in devices
        ],
    )


def _dra_alloc(device: str, claim: str = "k", driver: str = DRIVER, ns: str = "ml") -> Any:
    return DeviceAllocation(
        ns, "p", "c", driver, device, DraDevice(claim, ns, driver, NODE, device)
    )


@pytest.mark.parametrize(
    ("data", "drivers", "expected", "skipped"),
    [
        pytest.param(
            _response(_claim("k", (DRIVER, NODE, "gpu-0"), (DRIVER, NODE, "gpu-1"))),
            (),
            [_dra_alloc("gpu-0"), _dra_alloc("gpu-1")],
            0,
            id="two-devices-one-claim",
        ),
        pytest.param(
            _response(_claim("nic", ("sriov.example.com", NODE, "eth-0"))),
            (),
            [],
            0,
            id="other-driver-ignored",
        ),
        pytest.param(
            _response(_claim("acc", ("acme.com/gpu", NODE, "a0"))),
            ("acme.com/gpu",),
            [_dra_alloc("a0", "acc", "acme.com/gpu")],
            0,
            id="extra-driver",
        ),
        pytest.param(
            _response(_claim("k", ("", NODE, "gpu-0"))), (), [], 0, id="empty-driver-not-a-gpu"
        ),
        pytest.param(
            _response(_claim("k", (DRIVER, "", "gpu-0"), (DRIVER, NODE, ""))),
            (),
            [],
            2,
            id="empty-pool-or-device-skipped",
        ),
        pytest.param(
            _response(_claim("", (DRIVER, NODE, "gpu-0"))), (), [], 1, id="nameless-claim"
        ),
        pytest.param(
            _response(_claim("k", (DRIVER, NODE, "g" * 257))), (), [], 1, id="oversized-device"
        ),
        pytest.param(
            _response(_claim("k", (DRIVER, NODE, "gpu-0")), pod=""),
            (),
            [],
            1,
            id="nameless-pod",
        ),
        pytest.param(
            _response(_claim("k", (DRIVER, NODE, "gpu-0"), ns="")),
            (),
            [_dra_alloc("gpu-0")],
            0,
            id="claim-namespace-is-the-pods",
        ),
        pytest.param(_response(_claim("k")), (), [], 0, id="claim-without-devices"),
    ],
)
def test_parse_dynamic_resources(
    data: bytes, drivers: tuple[str, ...], expected: list[DeviceAllocation], skipped: int
) -> None:
    assert parse_list_response(data, extra_drivers=drivers) == (tuple(expected), skipped)


def test_huge_claim_lists_are_bounded() -> None:
    devices = [(DRIVER, NODE, f"gpu-{i}") for i in range(5000)]
    allocations, skipped = parse_list_response(_response(_claim("k", *devices)), limit=100)
    assert (len(allocations), skipped) == (100, 4900)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([DRIVER, "", "x.io"]), st.text(max_size=8), st.text(max_size=8)),
        max_size=20,
    ),
    st.text(max_size=300),
)
def test_parse_dynamic_resources_never_crashes(
    devices: list[tuple[str, str, str]], claim: str
) -> None:
    allocations, skipped = parse_list_response(_response(_claim(claim, *devices)), limit=10)
    assert len(allocations) <= 10
    assert len(allocations) + skipped <= len([d for d in devices if d[0] == DRIVER])
    for a in allocations:
        assert a.dra is not None and a.dra.device and a.dra.pool and a.resource == DRIVER


# --------------------------------------------------------------------------- ResourceSlices


@pytest.mark.parametrize(
    ("data", "expected", "skipped"),
    [
        pytest.param(
            body(slice_obj([dev("gpu-0", G0), dev("gpu-2-mig-9-0-4", M21)])),
            {(DRIVER, NODE, "gpu-0"): G0, (DRIVER, NODE, "gpu-2-mig-9-0-4"): M21},
            0,
            id="v1",
        ),
        pytest.param(
            body(slice_obj([dev("gpu-0", G0, basic=True)])),
            {(DRIVER, NODE, "gpu-0"): G0},
            0,
            id="v1beta1-basic",
        ),
        pytest.param(
            body(slice_obj([dev("gpu-0", G0, attr=f"{DRIVER}/uuid")])),
            {(DRIVER, NODE, "gpu-0"): G0},
            0,
            id="qualified-attribute",
        ),
        pytest.param(
            body(slice_obj([dev("gpu-0", "not-a-uuid"), dev("gpu-1", 7), dev("gpu-2", "")])),
            {},
            3,
            id="no-usable-uuid",
        ),
        pytest.param(
            body(slice_obj([dev("gpu-0", f"{G0}::1"), dev("gpu-1", f" {G1}")])),
            {},
            2,
            id="replica-or-padded-uuid",
        ),
        pytest.param(
            body(
                slice_obj([dev("gpu-0", G1)], generation=1),
                slice_obj([dev("gpu-0", G0)], generation=2),
            ),
            {(DRIVER, NODE, "gpu-0"): G0},
            0,
            id="newest-generation-wins",
        ),
        pytest.param(
            body(slice_obj([dev("gpu-0", G0), dev("gpu-0", G1)])),
            {},
            1,
            id="ambiguous-device-dropped",
        ),
        pytest.param(
            body(slice_obj([dev("gpu-0", G0)], driver=""), {"spec": "x"}, 5),
            {},
            0,
            id="malformed-slices-ignored",
        ),
        pytest.param(
            body(slice_obj([dev("", G0), "x", {"name": "gpu-9"}])), {}, 3, id="malformed-devices"
        ),
    ],
)
def test_parse_slice_list(data: bytes, expected: dict[Any, str], skipped: int) -> None:
    index = parse_slice_list(data)
    assert (index.uuids, index.skipped) == (expected, skipped)


@pytest.mark.parametrize("data", [b"", b"[]", b'{"items": 3}', b"{", b"null"])
def test_parse_slice_list_rejects_what_is_no_list(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_slice_list(data)


def test_parse_slice_list_is_bounded() -> None:
    devices = [dev(f"gpu-{i}", G0) for i in range(300)]
    index = parse_slice_list(body(slice_obj(devices)), limit=50)
    assert (len(index.uuids), index.skipped) == (50, 250)


@settings(max_examples=examples(80), deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=30,
    )
)
def test_parse_slice_list_never_crashes(doc: Any) -> None:
    for candidate in (doc, {"items": [doc]}, {"items": [{"spec": doc}]}):
        with contextlib.suppress(ValueError):
            parse_slice_list(json.dumps(candidate))


def test_demo_slices_describe_every_device() -> None:
    """The simulated driver's slices give each simulated GPU and MIG device its UUID."""
    from enricher.demo import DEMO

    index = parse_slice_list(json.dumps(resource_slices(DEMO)))

    assert index.skipped == 0 and index.taints == {}
    assert sorted(index.uuids.values()) == sorted(
        [g.uuid for g in DEMO.gpus if not g.mig_enabled] + [m.uuid for m in DEMO.migs]
    )


# --------------------------------------------------------------------------- mapping


SLICE_UUIDS = {
    (DRIVER, NODE, "gpu-0"): G0,
    (DRIVER, NODE, "gpu-2-mig-9-0-4"): M21,
    (DRIVER, NODE, "gpu-stale-mig"): M_GONE,
}


@pytest.mark.parametrize(
    ("allocation", "key"),
    [
        pytest.param(alloc("gpu-0"), (G0, ""), id="gpu"),
        pytest.param(alloc("gpu-2-mig-9-0-4"), (G2, "1"), id="mig-through-nvml"),
        pytest.param(alloc("gpu-stale-mig"), None, id="mig-nvml-does-not-know"),
        pytest.param(alloc("gpu-1"), None, id="no-slice-for-it"),
        pytest.param(alloc("gpu-0", pool="other-node"), None, id="other-pool"),
        pytest.param(alloc("gpu-0", driver="x.io"), None, id="other-driver"),
    ],
)
def test_resolve_dra_allocations(allocation: DeviceAllocation, key: tuple[str, str] | None) -> None:
    mapped, unmapped = resolve_allocations([allocation], SNAPSHOT, SLICE_UUIDS)
    if key is None:
        assert (mapped, unmapped) == ([], [allocation])
    else:
        assert [m.key for m in mapped] == [key] and unmapped == []
        assert mapped[0].dra == allocation.dra


MIG_KEY = (DRIVER, NODE, "gpu-2-mig-9-0-4")


@pytest.mark.parametrize(
    ("migs", "key", "dra_mig"),
    [
        pytest.param(
            {MIG_KEY: MigInfo(M21, G2, "3g.40gb")},
            (G2, "1"),
            MigInfo(M21, G2, "3g.40gb"),
            id="parent-agrees",
        ),
        pytest.param({MIG_KEY: MigInfo(M21, G0, "3g.40gb")}, None, None, id="parent-disagrees"),
        pytest.param(
            {MIG_KEY: MigInfo(M21, "", "")}, (G2, "1"), MigInfo(M21, "", ""), id="no-parent"
        ),
        pytest.param({}, (G2, "1"), MigInfo(M21), id="no-mig-attributes"),
    ],
)
def test_dra_mig_devices_map_to_their_instance(
    migs: dict[tuple[str, str, str], MigInfo],
    key: tuple[str, str] | None,
    dra_mig: MigInfo | None,
) -> None:
    """A DRA MIG device is its MIG instance (GPU_I_ID) through NVML, where the slice's
    parentUUID agrees; it keeps the slice's MIG attributes for gpu_container_allocated."""
    allocation = alloc("gpu-2-mig-9-0-4")
    mapped, unmapped = resolve_allocations([allocation], SNAPSHOT, SLICE_UUIDS, migs)
    if key is None:
        assert (mapped, unmapped) == ([], [allocation])
    else:
        assert [(m.key, m.dra_mig) for m in mapped] == [(key, dra_mig)] and unmapped == []


def test_gpu_container_allocated_carries_the_dra_mig_labels() -> None:
    """As dcgm-exporter writes them for a MIG device given through DRA: dra_mig_profile (the
    slice's profile) and dra_mig_device_uuid (its uuid); a full GPU has neither."""
    mapped, _ = resolve_allocations(
        [alloc("gpu-0"), alloc("gpu-2-mig-9-0-4", pod="mig-0")],
        SNAPSHOT,
        SLICE_UUIDS,
        {MIG_KEY: MigInfo(M21, G2, "3g.40gb")},
    )
    text = render_families([], {}, RenderOptions(), mapped)
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == ALLOCATED]
    by_pod = {s.labels["pod"]: s.labels for s in family.samples}
    assert by_pod["mig-0"]["dra_mig_profile"] == "3g.40gb"
    assert by_pod["mig-0"]["dra_mig_device_uuid"] == M21
    assert (by_pod["mig-0"]["UUID"], by_pod["mig-0"]["GPU_I_ID"]) == (G2, "1")
    assert by_pod["mig-0"]["dra_device_name"] == "gpu-2-mig-9-0-4"
    assert not any(name.startswith("dra_mig_") for name in by_pod["train-0"])


def test_device_name_alone_never_maps() -> None:
    """Without a ResourceSlice, a name that looks like NVIDIA's gpu-<minor> is not taken for
    NVML's GPU of that index: the minor number is not the index, and names are the driver's."""
    mapped, unmapped = resolve_allocations([alloc("gpu-0"), alloc("0")], SNAPSHOT, {})
    assert mapped == [] and len(unmapped) == 2


def test_gpu_container_allocated_carries_the_claim() -> None:
    mapped, _ = resolve_allocations(
        [alloc("gpu-0"), DeviceAllocation("ml", "old", "c", "nvidia.com/gpu", G1)],
        SNAPSHOT,
        SLICE_UUIDS,
    )
    text = render_families([], {}, RenderOptions(), mapped)
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == ALLOCATED]
    labels = [s.labels for s in family.samples]
    assert {
        "UUID": G0,
        "namespace": "ml",
        "pod": "train-0",
        "container": "trainer",
        "resource": DRIVER,
        "dra_claim_name": "c0",
        "dra_claim_namespace": "ml",
        "dra_driver_name": DRIVER,
        "dra_pool_name": NODE,
        "dra_device_name": "gpu-0",
    } in labels
    plain = next(x for x in labels if x["pod"] == "old")
    assert not any(name.startswith("dra_") for name in plain)


# --------------------------------------------------------------------------- the source


class CountingLister:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[str] = []
        self.fail: Exception | None = None

    def __call__(self, version: str, node: str, timeout: float) -> bytes:
        self.calls.append(version)
        if self.fail is not None:
            raise self.fail
        return self.data


def test_source_lists_only_when_a_dra_device_needs_it() -> None:
    now = [100.0]
    lister = CountingLister(body(slice_obj([dev("gpu-0", G0)])))
    src = ResourceSlicesSource(lister, NODE, min_interval=10, max_age=300, clock=lambda: now[0])
    assert src.read([]).value.uuids == {} and lister.calls == []  # no DRA: no API call
    first = src.read([(DRIVER, NODE, "gpu-0")])
    assert first.ok and first.value.uuids == {(DRIVER, NODE, "gpu-0"): G0}
    assert lister.calls == ["v1"]
    src.read([(DRIVER, NODE, "gpu-0")])
    assert lister.calls == ["v1"]  # known: from the cache
    src.read([(DRIVER, NODE, "gpu-9")])
    assert lister.calls == ["v1"]  # unknown, but listed under min_interval ago
    now[0] += 11
    src.read([(DRIVER, NODE, "gpu-9")])
    assert lister.calls == ["v1", "v1"]  # unknown: listed again
    now[0] += 301
    src.read([(DRIVER, NODE, "gpu-0")])
    assert lister.calls == ["v1", "v1", "v1"]  # known but older than max_age


def test_source_failure_keeps_the_last_index() -> None:
    now = [0.0]
    lister = CountingLister(body(slice_obj([dev("gpu-0", G0)])))
    src = ResourceSlicesSource(lister, NODE, min_interval=1, clock=lambda: now[0])
    assert src.read([(DRIVER, NODE, "gpu-0")]).ok
    lister.fail = ResourceSliceError("HTTP 403: forbidden")
    now[0] += 2
    failed = src.read([(DRIVER, NODE, "gpu-1")])
    assert not failed.ok and "403" in failed.error
    assert failed.value.uuids == {(DRIVER, NODE, "gpu-0"): G0}
    assert src.errors_total == 1
    lister.fail, lister.data = None, b"not json"
    now[0] += 2
    bad = src.read([(DRIVER, NODE, "gpu-1")])
    assert not bad.ok and "JSON" in bad.error and src.errors_total == 2


def test_source_falls_back_to_older_api_versions() -> None:
    calls: list[str] = []

    def lister(version: str, node: str, timeout: float) -> bytes:
        calls.append(version)
        if version != "v1beta1":
            raise NotServedError(f"{version}: 404")
        return body(slice_obj([dev("gpu-0", G0, basic=True)]))

    src = ResourceSlicesSource(lister, NODE, min_interval=0)
    reading = src.read([(DRIVER, NODE, "gpu-0")])
    assert reading.ok and reading.value.api_version == "v1beta1"
    assert calls == ["v1", "v1beta2", "v1beta1"]
    src.read([(DRIVER, NODE, "gpu-1")])
    assert calls[3:] == ["v1beta1"]  # the version that answered is remembered


def test_node_name_is_required() -> None:
    with pytest.raises(ValueError):
        ResourceSlicesSource(CountingLister(b""), "")


# --------------------------------------------------------------------------- real client


@pytest.fixture
def api() -> Iterator[KubeApiStandIn]:
    with KubeApiStandIn() as server:
        yield server


def test_real_client_lists_only_this_nodes_slices(api: KubeApiStandIn) -> None:
    api.set_resource_slices(
        [
            slice_obj([dev("gpu-0", G0)]),
            slice_obj([dev("gpu-0", G1)], node="node-b", pool="node-b"),
        ]
    )
    src = ResourceSlicesSource(api_client_lister(make_api_client(api.url)), NODE)
    reading = src.read([(DRIVER, NODE, "gpu-0")])
    assert reading.ok, reading.error
    assert reading.value.uuids == {(DRIVER, NODE, "gpu-0"): G0}
    (request,) = api.requests("slices")
    assert request.path == "/apis/resource.k8s.io/v1/resourceslices"
    assert request.query == {"fieldSelector": f"spec.nodeName={NODE}"}


def test_real_client_on_an_older_cluster(api: KubeApiStandIn) -> None:
    api.set_resource_slices([slice_obj([dev("gpu-0", G0, basic=True)])], versions=["v1beta1"])
    src = ResourceSlicesSource(api_client_lister(make_api_client(api.url)), NODE)
    reading = src.read([(DRIVER, NODE, "gpu-0")])
    assert reading.ok and reading.value.api_version == "v1beta1"
    assert [r.path.split("/")[3] for r in api.requests("slices")] == ["v1", "v1beta2", "v1beta1"]


def test_real_client_without_permission(api: KubeApiStandIn) -> None:
    api.set_resource_slices([slice_obj([dev("gpu-0", G0)])])
    api.set_refusal(403)
    src = ResourceSlicesSource(api_client_lister(make_api_client(api.url)), NODE)
    reading = src.read([(DRIVER, NODE, "gpu-0")])
    assert not reading.ok and "403" in reading.error and reading.value.uuids == {}


def test_real_client_when_no_version_serves_slices(api: KubeApiStandIn) -> None:
    src = ResourceSlicesSource(api_client_lister(make_api_client(api.url)), NODE)
    reading = src.read([(DRIVER, NODE, "gpu-0")])
    assert not reading.ok and "404" in reading.error


# --------------------------------------------------------------------------- over the socket


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with short_dir("dra-") as directory:
        yield directory / "kubelet.sock"


@pytest.fixture
def kubelet(socket_path: Path) -> Iterator[Callable[[Any], SimulatedKubelet]]:
    started: list[SimulatedKubelet] = []

    def start(response: Any) -> SimulatedKubelet:
        server = SimulatedKubelet(str(socket_path), lambda _ctx: response)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace=None)


def test_dra_devices_over_the_socket(
    kubelet: Callable[[Any], SimulatedKubelet], socket_path: Path, api: KubeApiStandIn
) -> None:
    """The kubelet serves dynamic_resources over gRPC; the real client lists the slices;
    what maps is allocated, what does not is unmapped, and the NIC is not a GPU at all."""
    entries = [
        DeviceAllocation("ml", "train-0", "trainer", "nvidia.com/gpu", G1),
        alloc("gpu-0"),
        alloc("gpu-2-mig-9-0-4", pod="mig-0"),
        alloc("gpu-7", pod="lost-0"),  # no slice describes it
        DeviceAllocation(
            "ml", "net-0", "c", "sriov.example.com", "eth0", dra("eth0", "nic", "sriov.example.com")
        ),
    ]
    kubelet(list_response(entries))
    api.set_resource_slices([slice_obj([dev("gpu-0", G0), dev("gpu-2-mig-9-0-4", M21)])])
    pr = PodResourcesSource(str(socket_path), timeout=2.0)
    slices = ResourceSlicesSource(api_client_lister(make_api_client(api.url)), NODE)
    try:
        listed = pr.fetch()
        assert listed.ok, listed.error
        assert sorted(a.pod for a in listed.allocations) == [
            "lost-0",
            "mig-0",
            "train-0",
            "train-0",
        ]
        index = slices.read(dra_slice_keys(listed.allocations)).value
        mapped, unmapped = resolve_allocations(listed.allocations, SNAPSHOT, index.uuids)
    finally:
        pr.close()
    assert sorted((m.pod, m.key, m.resource) for m in mapped) == [
        ("mig-0", (G2, "1"), DRIVER),
        ("train-0", (G0, ""), DRIVER),
        ("train-0", (G1, ""), "nvidia.com/gpu"),
    ]
    assert [u.pod for u in unmapped] == ["lost-0"]


def test_demo_node_maps_its_dra_pods() -> None:
    """The demo's DRA pods, through the demo's kubelet answer and simulated slices: a full GPU,
    and a MIG device (its instance, with the slice's MIG attributes)."""
    from enricher.demo import DEMO, DRA_TRAIN, DRA_WHISPER, PODS

    response = list_response(allocations(PODS))
    listed, skipped = parse_list_response(response.SerializeToString())
    src = ResourceSlicesSource(static_slice_lister(resource_slices(DEMO)), DEMO.name)
    index = src.read(dra_slice_keys(listed)).value
    snapshot = GpuSnapshot(devices=DEMO.gpus, migs=DEMO.migs)
    mapped, unmapped = resolve_allocations(listed, snapshot, index.uuids, index.mig)
    assert skipped == 0 and unmapped == []
    by_pod = {m.pod: m for m in mapped if m.dra is not None}
    assert sorted(by_pod) == sorted([DRA_TRAIN.name, DRA_WHISPER.name])
    assert by_pod[DRA_TRAIN.name].key == (DEMO.gpus[7].uuid, "")
    assert by_pod[DRA_TRAIN.name].dra_mig is None
    (mig,) = [m for m in DEMO.migs if m.gi_id == 14]
    assert by_pod[DRA_WHISPER.name].key == (mig.gpu_uuid, "14")
    assert by_pod[DRA_WHISPER.name].dra_mig == MigInfo(mig.uuid, mig.gpu_uuid, mig.profile)


def test_simulated_mig_devices_are_named_as_nvidias_driver_names_them() -> None:
    """gpu-<minor>-mig-<profile ID>-<placement start>-<placement size>: each MIG device where
    the node places it, or else in the first free placement its profile allows; one that fits
    nowhere is refused."""
    gpu = GpuDevice(2, G2, "NVIDIA A100-SXM4-80GB", mig_enabled=True)
    migs = (
        MigDevice(G2, 2, 1, 0, "MIG-00000000-0000-4000-8000-0000000000a1", "3g.40gb"),
        MigDevice(G2, 2, 5, 0, "MIG-00000000-0000-4000-8000-0000000000a5", "2g.20gb"),
        MigDevice(G2, 2, 13, 0, "MIG-00000000-0000-4000-8000-0000000000ad", "1g.10gb"),
        MigDevice(G2, 2, 14, 0, "MIG-00000000-0000-4000-8000-0000000000ae", "1g.10gb"),
    )
    node = SimNode("node-a", (gpu,), migs[:3], (), ())
    assert list(mig_device_names(node).values()) == [
        "gpu-2-mig-9-0-4",  # 3g.40gb: the first four memory slices
        "gpu-2-mig-14-4-2",
        "gpu-2-mig-19-6-1",
    ]
    placed = replace(node, migs=migs, mig_placements=((migs[0].uuid, 4), (migs[1].uuid, 0)))
    assert list(mig_device_names(placed).values()) == [
        "gpu-2-mig-9-4-4",
        "gpu-2-mig-14-0-2",
        "gpu-2-mig-19-2-1",
        "gpu-2-mig-19-3-1",
    ]
    with pytest.raises(ValueError):
        mig_device_names(replace(node, migs=migs))  # a 1g.10gb never starts at slice 7
    with pytest.raises(ValueError):
        mig_device_names(replace(node, mig_placements=((migs[1].uuid, 2),)))  # inside the 3g
