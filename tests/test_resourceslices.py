"""What the node's ResourceSlices say beyond the UUID: device taints (the DRA driver's health
report) and MIG attributes, in each served API version's shape, and when the source lists to
keep taints current.

Real parts: the real ``kubernetes`` client against the API stand-in devkit/kubeapi.py, and the
simulated driver's slices from enricher.simnode.api.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devkit.kubeapi import KubeApiStandIn, make_api_client, resource_slice
from enricher.model import DeviceTaint, MigInfo
from enricher.resourceslices import (
    MAX_TAINTS,
    NotServedError,
    ResourceSliceError,
    ResourceSlicesSource,
    SliceIndex,
    api_client_lister,
    parse_slice_list,
    parse_taint,
)
from enricher.simnode.api import resource_slices

from .conftest import examples

G0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
G1 = "GPU-1b1b1b1b-1111-4111-8111-111111111111"
G2 = "GPU-2c2c2c2c-2222-4222-8222-222222222222"
M21 = "MIG-21212121-2121-4121-8121-212121212121"
DRIVER = "gpu.nvidia.com"
NODE = "node-a"
K0 = (DRIVER, NODE, "gpu-0")
K1 = (DRIVER, NODE, "gpu-1")
KM = (DRIVER, NODE, "gpu-2-mig-1g12gb-19-0")
VERSIONS = ("v1", "v1beta2", "v1beta1")

# What NVIDIA's driver writes (cmd/gpu-kubelet-plugin/device_health.go): the XID as value,
# no value for the other two; the API server adds timeAdded.
XID = {
    "key": "gpu.nvidia.com/xid",
    "value": "43",
    "effect": "None",
    "timeAdded": "2025-07-22T02:24:46Z",
}
LOST = {
    "key": "gpu.nvidia.com/gpu-lost",
    "effect": "NoSchedule",
    "timeAdded": "2025-07-22T02:25:00Z",
}
UNMONITORED = {"key": "gpu.nvidia.com/unmonitored", "effect": "None"}
T_XID = DeviceTaint("gpu.nvidia.com/xid", "43", "None")
T_LOST = DeviceTaint("gpu.nvidia.com/gpu-lost", "", "NoSchedule")
T_UNMONITORED = DeviceTaint("gpu.nvidia.com/unmonitored", "", "None")


def device(
    name: str,
    uuid: str,
    *,
    taints: Any = None,
    version: str = "v1",
    attrs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A slice's device entry in ``version``'s shape: v1beta1 puts its fields under
    ``basic``. ``attrs`` are string attributes besides ``uuid``."""
    strings = {"uuid": uuid, **(attrs or {})}
    fields: dict[str, Any] = {"attributes": {k: {"string": v} for k, v in strings.items()}}
    if taints is not None:
        fields["taints"] = taints
    return {"name": name, "basic": fields} if version == "v1beta1" else {"name": name, **fields}


def body(*devices: Any, generation: int = 1, version: str = "v1") -> bytes:
    return json.dumps(
        {
            "kind": "ResourceSliceList",
            "items": [slice_obj(*devices, generation=generation, version=version)],
        }
    ).encode()


def slice_obj(
    *devices: Any, generation: int = 1, version: str = "v1", node: str = NODE
) -> dict[str, Any]:
    return resource_slice(devices, node=node, driver=DRIVER, generation=generation, version=version)


# --------------------------------------------------------------------------- taints


@pytest.mark.parametrize("version", VERSIONS)
def test_taints_in_each_served_shape(version: str) -> None:
    data = body(
        device("gpu-0", G0, taints=[XID, LOST], version=version),
        device("gpu-1", G1, version=version),
        device("gpu-2-mig-1g12gb-19-0", M21, taints=[UNMONITORED], version=version),
        version=version,
    )
    index = parse_slice_list(data)
    assert index.uuids == {K0: G0, K1: G1, KM: M21}
    assert index.taints == {K0: (T_XID, T_LOST), KM: (T_UNMONITORED,)}
    assert index.skipped == 0


LONG_PREFIX = "a" * 254


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        pytest.param(XID, T_XID, id="driver-xid"),
        pytest.param(LOST, T_LOST, id="no-value"),
        pytest.param({**LOST, "value": None}, T_LOST, id="null-value"),
        pytest.param({**LOST, "value": ""}, T_LOST, id="empty-value"),
        pytest.param(
            {"key": "xid", "effect": "NoExecute"},
            DeviceTaint("xid", "", "NoExecute"),
            id="unprefixed-key",
        ),
        pytest.param(
            {"key": "example.com/degraded", "effect": "Degraded"},
            DeviceTaint("example.com/degraded", "", "Degraded"),
            id="unknown-effect-kept-as-written",
        ),
        pytest.param(
            {"key": "k", "value": "v" * 63, "effect": "None"},
            DeviceTaint("k", "v" * 63, "None"),
            id="longest-value",
        ),
        pytest.param({"value": "43", "effect": "None"}, None, id="no-key"),
        pytest.param({**XID, "key": ""}, None, id="empty-key"),
        pytest.param({**XID, "key": 7}, None, id="key-not-a-string"),
        pytest.param({**XID, "key": "gpu.nvidia.com/"}, None, id="key-without-name"),
        pytest.param({**XID, "key": "/xid"}, None, id="key-with-empty-prefix"),
        pytest.param({**XID, "key": "GPU.nvidia.com/xid"}, None, id="key-prefix-not-a-dns-name"),
        pytest.param({**XID, "key": "gpu nvidia"}, None, id="key-with-space"),
        pytest.param({**XID, "key": f"{LONG_PREFIX}/xid"}, None, id="key-prefix-too-long"),
        pytest.param({**XID, "key": "x" * 64}, None, id="key-name-too-long"),
        pytest.param({**XID, "value": "v" * 64}, None, id="value-too-long"),
        pytest.param({**XID, "value": "4 3"}, None, id="value-not-a-label-value"),
        pytest.param({**XID, "value": "a\nb"}, None, id="value-with-newline"),
        pytest.param({**XID, "value": 43}, None, id="value-not-a-string"),
        pytest.param({"key": "gpu.nvidia.com/xid", "value": "43"}, None, id="no-effect"),
        pytest.param({**XID, "effect": ""}, None, id="empty-effect"),
        pytest.param({**XID, "effect": 1}, None, id="effect-not-a-string"),
        pytest.param({**XID, "effect": "No Schedule"}, None, id="effect-with-space"),
        pytest.param({**XID, "effect": "E" * 64}, None, id="effect-too-long"),
        pytest.param("gpu.nvidia.com/xid", None, id="not-an-object"),
        pytest.param(None, None, id="null"),
    ],
)
def test_parse_taint(item: Any, expected: DeviceTaint | None) -> None:
    assert parse_taint(item) == expected


def _distinct(n: int) -> list[dict[str, Any]]:
    return [{"key": f"example.com/t{i}", "effect": "None"} for i in range(n)]


@pytest.mark.parametrize(
    ("data", "taints", "uuids", "skipped"),
    [
        pytest.param(body(device("gpu-0", G0, taints=[])), {}, {K0: G0}, 0, id="empty-list"),
        pytest.param(
            body(device("gpu-0", G0, taints={"key": "x"})), {}, {K0: G0}, 1, id="taints-not-a-list"
        ),
        pytest.param(
            body(device("gpu-0", G0, taints=[XID, {"key": ""}, "x", None, LOST])),
            {K0: (T_XID, T_LOST)},
            {K0: G0},
            3,
            id="malformed-entries-skipped",
        ),
        pytest.param(
            body(device("gpu-0", G0, taints=_distinct(MAX_TAINTS + 4))),
            {K0: tuple(DeviceTaint(f"example.com/t{i}", "", "None") for i in range(MAX_TAINTS))},
            {K0: G0},
            4,
            id="too-many-taints",
        ),
        pytest.param(
            body(
                device("gpu-0", G0, taints=[XID, XID, dict(XID, timeAdded="2026-01-01T00:00:00Z")])
            ),
            {K0: (T_XID,)},
            {K0: G0},
            0,
            id="repeats-kept-once",
        ),
        pytest.param(
            body(device("gpu-0", G0, taints=[XID, {**XID, "value": "79"}])),
            {K0: (T_XID, DeviceTaint("gpu.nvidia.com/xid", "79", "None"))},
            {K0: G0},
            0,
            id="same-key-two-values",
        ),
        pytest.param(
            body(device("gpu-0", "not-a-uuid", taints=[LOST])), {}, {}, 1, id="device-without-uuid"
        ),
        pytest.param(
            body(device("gpu-0", G0, taints=[LOST]), device("gpu-0", G1, taints=[XID])),
            {},
            {},
            1,
            id="ambiguous-device-dropped-with-its-taints",
        ),
        pytest.param(
            json.dumps(
                {
                    "items": [
                        slice_obj(device("gpu-0", G0, taints=[LOST])),
                        slice_obj(device("gpu-0", G0, taints=[XID, LOST])),
                    ]
                }
            ),
            {K0: (T_LOST, T_XID)},
            {K0: G0},
            0,
            id="one-device-in-two-slices-has-both-taints",
        ),
        pytest.param(
            json.dumps(
                {
                    "items": [
                        slice_obj(device("gpu-0", G0, taints=[LOST]), generation=1),
                        slice_obj(device("gpu-0", G0), generation=2),
                    ]
                }
            ),
            {},
            {K0: G0},
            0,
            id="older-generation-taints-ignored",
        ),
        pytest.param(
            body(
                {
                    "name": "gpu-0",
                    "basic": {"attributes": {"uuid": {"string": G0}}},
                    "taints": [LOST],
                }
            ),
            {K0: (T_LOST,)},
            {K0: G0},
            0,
            id="mixed-shape-read-either-way",
        ),
    ],
)
def test_slice_taints(
    data: bytes | str, taints: dict[Any, Any], uuids: dict[Any, str], skipped: int
) -> None:
    index = parse_slice_list(data)
    assert (index.taints, index.uuids, index.skipped) == (taints, uuids, skipped)


_TEXT = st.sampled_from(
    ["", "x", "gpu.nvidia.com/xid", "None", "NoSchedule", "4 3", "a" * 70]
) | st.text(max_size=12)
_VALUE = st.none() | st.integers() | st.booleans() | _TEXT | st.lists(_TEXT, max_size=2)


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["key", "value", "effect", "timeAdded", "x"]), _VALUE)
        | _VALUE,
        max_size=24,
    )
)
def test_taint_lists_never_crash_and_stay_bounded(entries: list[Any]) -> None:
    index = parse_slice_list(body(device("gpu-0", G0, taints=entries)))
    kept = index.taints.get(K0, ())
    assert index.uuids == {K0: G0} and len(kept) <= MAX_TAINTS and len(set(kept)) == len(kept)
    assert len(kept) + index.skipped <= len(entries)
    assert all(parse_taint({"key": t.key, "value": t.value, "effect": t.effect}) == t for t in kept)


# --------------------------------------------------------------------------- MIG attributes


@pytest.mark.parametrize(
    ("dev", "expected"),
    [
        pytest.param(
            device(
                "gpu-2-mig-1g12gb-19-0",
                M21,
                attrs={"type": "mig", "parentUUID": G2, "profile": "1g.12gb"},
            ),
            MigInfo(M21, G2, "1g.12gb"),
            id="driver-attributes",
        ),
        pytest.param(
            device(
                "gpu-2-mig-1g12gb-19-0",
                M21,
                version="v1beta1",
                attrs={"parentUUID": G2, "profile": "1g.12gb"},
            ),
            MigInfo(M21, G2, "1g.12gb"),
            id="v1beta1-basic",
        ),
        pytest.param(
            device(
                "gpu-2-mig-1g12gb-19-0",
                M21,
                attrs={"gpu.nvidia.com/parentUUID": G2, "gpu.nvidia.com/profile": "1g.12gb+me"},
            ),
            MigInfo(M21, G2, "1g.12gb+me"),
            id="qualified-attributes",
        ),
        pytest.param(device("gpu-2-mig-1g12gb-19-0", M21), MigInfo(M21), id="no-mig-attributes"),
        pytest.param(
            device("gpu-2-mig-1g12gb-19-0", M21, attrs={"parentUUID": M21, "profile": "p" * 65}),
            MigInfo(M21),
            id="parent-not-a-gpu-profile-too-long",
        ),
        pytest.param(
            device(
                "gpu-2-mig-1g12gb-19-0", M21, attrs={"parentUUID": f"{G2}::1", "profile": "1g.12gb"}
            ),
            MigInfo(M21, "", "1g.12gb"),
            id="parent-replica-id",
        ),
        pytest.param(
            device("gpu-0", G0, attrs={"type": "gpu", "parentUUID": G2, "profile": "x"}),
            None,
            id="full-gpu-is-no-mig",
        ),
    ],
)
def test_mig_attributes(dev: dict[str, Any], expected: MigInfo | None) -> None:
    version = "v1beta1" if "basic" in dev else "v1"
    index = parse_slice_list(body(dev, version=version))
    (key,) = index.uuids
    assert index.mig.get(key) == expected


def test_simulated_slices_in_every_version() -> None:
    """The simulated driver's slices carry taints and MIG attributes in each version's shape,
    and without taints they are what they always were."""
    from enricher.demo import DEMO

    plain = resource_slices(DEMO)
    assert '"taints"' not in json.dumps(plain) and plain["apiVersion"] == "resource.k8s.io/v1"
    gpu, mig = DEMO.gpus[0], DEMO.migs[0]
    given = {gpu.uuid: (T_XID, T_LOST), mig.uuid: (T_UNMONITORED,)}
    expected_uuids = parse_slice_list(json.dumps(plain)).uuids
    for version in VERSIONS:
        served = resource_slices(DEMO, taints=given, api_version=version)
        index = parse_slice_list(json.dumps(served))
        by_uuid = {index.uuids[k]: v for k, v in index.taints.items()}
        assert index.uuids == expected_uuids and index.skipped == 0, version
        assert by_uuid == given, version
        assert {m.uuid: (m.parent_uuid, m.profile) for m in index.mig.values()} == {
            m.uuid: (m.gpu_uuid, m.profile) for m in DEMO.migs
        }
    with pytest.raises(ValueError):
        resource_slices(DEMO, api_version="v1alpha3")


def test_slice_index_stays_positional() -> None:
    """Callers build and read SliceIndex as before; the new fields default to empty."""
    index = SliceIndex({K0: G0}, 5.0, "v1", 2)
    assert (index.uuids, index.listed_at, index.api_version, index.skipped) == (
        {K0: G0},
        5.0,
        "v1",
        2,
    )
    assert index.taints == {} and index.mig == {}


# --------------------------------------------------------------------------- when to list


class Lister:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls = 0
        self.fail: Exception | None = None

    def __call__(self, version: str, node: str, timeout: float) -> bytes:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.data


NO_DRA: tuple[Any, ...] = ()
KNOWN = (K0,)
UNKNOWN = (K1,)

# (seconds since the previous step, the DRA devices the kubelet reports, lists so far)
Steps = list[tuple[float, tuple[Any, ...], int]]


@pytest.mark.parametrize(
    ("watch_health", "steps"),
    [
        pytest.param(
            False, [(0, NO_DRA, 0), (61, NO_DRA, 0), (1000, NO_DRA, 0)], id="off-no-dra-never-lists"
        ),
        pytest.param(
            False,
            [(0, KNOWN, 1), (61, KNOWN, 1), (240, KNOWN, 2)],
            id="off-known-device-waits-for-max-age",
        ),
        pytest.param(
            True,
            [(0, NO_DRA, 1), (1, NO_DRA, 1), (59, NO_DRA, 1), (2, NO_DRA, 2)],
            id="on-lists-without-dra",
        ),
        pytest.param(
            True,
            [(0, KNOWN, 1), (61, KNOWN, 2), (61, NO_DRA, 3)],
            id="on-known-device-every-interval",
        ),
        pytest.param(
            True,
            [(0, NO_DRA, 1), (5, UNKNOWN, 1), (6, UNKNOWN, 2), (11, UNKNOWN, 3)],
            id="on-unknown-device-still-bounded-by-min-interval",
        ),
    ],
)
def test_when_the_source_lists(watch_health: bool, steps: Steps) -> None:
    now = [100.0]
    lister = Lister(body(device("gpu-0", G0, taints=[LOST])))
    src = ResourceSlicesSource(
        lister,
        NODE,
        min_interval=10,
        max_age=300,
        watch_health=watch_health,
        health_interval=60,
        clock=lambda: now[0],
    )
    for i, (dt, wanted, calls) in enumerate(steps):
        now[0] += dt
        reading = src.read(wanted)
        assert reading.ok and lister.calls == calls, f"step {i}"
        if calls:
            assert reading.value.taints == {K0: (T_LOST,)}


def test_health_watch_failure_keeps_the_last_taints() -> None:
    now = [100.0]
    lister = Lister(body(device("gpu-0", G0, taints=[LOST])))
    src = ResourceSlicesSource(lister, NODE, watch_health=True, clock=lambda: now[0])
    assert src.read().value.taints == {K0: (T_LOST,)}
    lister.fail = ResourceSliceError("HTTP 503: unavailable")
    now[0] += 61
    failed = src.read()
    assert not failed.ok and "503" in failed.error and failed.value.taints == {K0: (T_LOST,)}
    assert failed.value.listed_at == 100.0
    now[0] += 1
    src.read()
    assert lister.calls == 2  # within min_interval: the failure is not retried
    lister.fail, lister.data = None, body(device("gpu-0", G0))
    now[0] += 10
    healed = src.read()
    assert healed.ok and healed.value.taints == {} and lister.calls == 3


def test_no_served_version_is_a_failure_only_for_a_dra_device() -> None:
    """Health watching on a cluster that serves no ResourceSlices (no DRA): an empty index,
    up, every health interval; with a DRA device to map, the 404s are a failure."""
    now = [100.0]
    calls: list[str] = []

    def lister(version: str, _node: str, _timeout: float) -> bytes:
        calls.append(version)
        raise NotServedError(f"resource.k8s.io/{version} resourceslices: 404")

    src = ResourceSlicesSource(lister, NODE, watch_health=True, clock=lambda: now[0])
    quiet = src.read()
    assert quiet.ok and quiet.value.taints == {} and quiet.value.listed_at == 100.0
    assert calls == list(VERSIONS) and src.errors_total == 0
    now[0] += 61
    assert src.read().ok and calls == list(VERSIONS) * 2
    now[0] += 61
    wanted = src.read([K0])
    assert not wanted.ok and "404" in wanted.error and src.errors_total == 1


# --------------------------------------------------------------------------- real client


@pytest.fixture
def api() -> Iterator[KubeApiStandIn]:
    with KubeApiStandIn() as server:
        yield server


@pytest.mark.parametrize("version", VERSIONS)
def test_real_client_sees_taints_come_and_go(api: KubeApiStandIn, version: str) -> None:
    """The stand-in serves the simulated driver's slices only at ``version``, first with a
    tainted GPU and MIG device beside untainted ones, then healed; health watching sees both
    without any DRA allocation on the node."""
    from enricher.demo import DEMO

    gpu, mig = DEMO.gpus[0], DEMO.migs[0]
    given = {gpu.uuid: (T_XID, T_LOST), mig.uuid: (T_UNMONITORED,)}
    tainted = resource_slices(DEMO, taints=given, api_version=version)
    api.set_resource_slices(tainted["items"], versions=[version])
    now = [1000.0]
    src = ResourceSlicesSource(
        api_client_lister(make_api_client(api.url)),
        DEMO.name,
        watch_health=True,
        clock=lambda: now[0],
    )

    first = src.read()
    assert first.ok, first.error
    assert first.value.api_version == version
    assert {first.value.uuids[k]: v for k, v in first.value.taints.items()} == given
    untainted = set(first.value.uuids.values()) - set(given)
    assert untainted and len(first.value.uuids) == len(given) + len(untainted)
    assert first.value.mig[
        next(k for k, u in first.value.uuids.items() if u == mig.uuid)
    ] == MigInfo(mig.uuid, mig.gpu_uuid, mig.profile)

    api.set_resource_slices(resource_slices(DEMO, api_version=version)["items"], versions=[version])
    now[0] += 30
    assert src.read().value.taints == first.value.taints  # within health_interval: cached
    now[0] += 31
    healed = src.read()
    assert healed.ok and healed.value.taints == {} and healed.value.uuids == first.value.uuids
    paths = [r.path for r in api.requests("slices")]
    assert paths[-1] == f"/apis/resource.k8s.io/{version}/resourceslices"
    assert len([p for p in paths if p.split("/")[3] == version]) == 2
