"""Tests for enricher.kube: pure parsers table-driven, PodCache with the real kubernetes client
against the protocol-faithful API-server stand-in in tests/kubeapi.py (no cluster here)."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from hypothesis import given
from hypothesis import strategies as st

from enricher import kube
from enricher.kube import (
    KubeConfigError,
    MpsDaemonPods,
    PodCache,
    build_index,
    derive_workload,
    load_api_client,
    parse_mps_daemon_pods,
    parse_pod,
    parse_pod_list,
    parse_selector,
    strip_container_id,
)
from enricher.model import PodInfo
from enricher.simnode.api import container_id, make_pod, pod_uid
from tests.kubeapi import KubeApiStandIn, make_api_client

NODE = "node-a"
CID_A = container_id("a")
CID_B = container_id("b")
CID_C = container_id("c")
STATIC_HASH = "5f3c2a7e9b1d4c6a8e0f2b4d6a8c0e1f"


# --------------------------------------------------------------------------- strip_container_id


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param(f"containerd://{CID_A}", CID_A, id="containerd"),
        pytest.param(f"cri-o://{CID_A}", CID_A, id="cri-o"),
        pytest.param(f"docker://{CID_A}", CID_A, id="docker"),
        pytest.param(f"some-runtime://{CID_A}", CID_A, id="any-scheme"),
        pytest.param(CID_A, CID_A, id="bare"),
        pytest.param(f"containerd://{CID_A.upper()}", CID_A, id="uppercase-hex"),
        pytest.param(f" containerd://{CID_A}\n", CID_A, id="whitespace"),
        pytest.param("containerd://", "", id="scheme-only"),
        pytest.param("", "", id="empty"),
        pytest.param(None, "", id="not-a-string"),
    ],
)
def test_strip_container_id(raw: Any, want: str) -> None:
    assert strip_container_id(raw) == want


# --------------------------------------------------------------------------- derive_workload


def _owned(*owners: Any, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p-0",
            "labels": labels or {},
            "ownerReferences": list(owners),
            **meta,
        }
    }


def _ref(kind: str, name: str, controller: bool | None = True) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "name": name, "uid": "x"}
    if controller is not None:
        ref["controller"] = controller
    return ref


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        pytest.param(
            _owned(
                _ref("ReplicaSet", "web-7d4b9c8f6d"), labels={"pod-template-hash": "7d4b9c8f6d"}
            ),
            ("Deployment", "web"),
            id="deployment-via-pod-template-hash",
        ),
        pytest.param(
            _owned(
                _ref("ReplicaSet", "api-gw-v2-58c9d4b7f"), labels={"pod-template-hash": "58c9d4b7f"}
            ),
            ("Deployment", "api-gw-v2"),
            id="deployment-name-with-dashes",
        ),
        pytest.param(
            _owned(_ref("ReplicaSet", "hand-made")), ("ReplicaSet", "hand-made"), id="bare-rs"
        ),
        pytest.param(
            _owned(_ref("ReplicaSet", "web-abc"), labels={"pod-template-hash": "xyz"}),
            ("ReplicaSet", "web-abc"),
            id="rs-hash-does-not-match-name",
        ),
        pytest.param(
            _owned(_ref("ReplicaSet", "-abc"), labels={"pod-template-hash": "abc"}),
            ("ReplicaSet", "-abc"),
            id="rs-name-is-only-the-suffix",
        ),
        pytest.param(
            _owned(_ref("Job", "nightly-28571234")), ("Job", "nightly-28571234"), id="job"
        ),
        pytest.param(_owned(_ref("StatefulSet", "db")), ("StatefulSet", "db"), id="statefulset"),
        pytest.param(_owned(_ref("DaemonSet", "dcgm")), ("DaemonSet", "dcgm"), id="daemonset"),
        pytest.param(_owned(_ref("Notebook", "alice")), ("Notebook", "alice"), id="crd-owner"),
        pytest.param(_owned(), ("Pod", "p-0"), id="no-owner"),
        pytest.param(
            _owned(_ref("Node", NODE), annotations={"kubernetes.io/config.mirror": STATIC_HASH}),
            ("StaticPod", "p-0"),
            id="mirror-pod-node-owner",
        ),
        pytest.param(
            _owned(annotations={"kubernetes.io/config.mirror": STATIC_HASH}),
            ("StaticPod", "p-0"),
            id="mirror-annotation-without-owner",
        ),
        pytest.param(
            _owned(_ref("Foo", "a", controller=False), _ref("StatefulSet", "b")),
            ("StatefulSet", "b"),
            id="controller-owner-wins",
        ),
        pytest.param(
            _owned(_ref("Foo", "a", controller=None), _ref("Bar", "b", controller=None)),
            ("Foo", "a"),
            id="no-controller-first-owner",
        ),
        pytest.param(
            _owned("junk", 7, {"kind": "Job"}, {"name": "x"}, _ref("Job", "j")),
            ("Job", "j"),
            id="malformed-owners-skipped",
        ),
        pytest.param(
            {"metadata": {"name": "p", "ownerReferences": "nope"}},
            ("Pod", "p"),
            id="owners-not-a-list",
        ),
        pytest.param(
            _owned(_ref("ReplicaSet", "web-1"), labels={"pod-template-hash": 1}),  # type: ignore[dict-item]
            ("ReplicaSet", "web-1"),
            id="hash-label-not-a-string",
        ),
        pytest.param({"metadata": []}, ("Pod", ""), id="metadata-not-a-dict"),
        pytest.param({}, ("Pod", ""), id="empty-object"),
        pytest.param([], ("Pod", ""), id="not-a-mapping"),
    ],
)
def test_derive_workload(obj: Any, want: tuple[str, str]) -> None:
    assert derive_workload(obj) == want


# --------------------------------------------------------------------------- parse_pod


def _gpu_pod(resources: dict[str, Any], where: str = "containers") -> dict[str, Any]:
    pod = make_pod("g", containers=[("main", CID_A, "containerd")])
    if where == "containers":
        pod["spec"]["containers"][0]["resources"] = resources
    else:
        pod["spec"][where] = [{"name": "x", "resources": resources}]
    return pod


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        pytest.param(
            make_pod(
                "web-7d4b9c8f6d-x2x9z",
                "ml",
                "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                NODE,
                containers=[("trainer", CID_A, "containerd"), ("sidecar", CID_B, "containerd")],
                owner=("ReplicaSet", "web-7d4b9c8f6d"),
                labels={"pod-template-hash": "7d4b9c8f6d", "team": "vision", "other": "x"},
                annotations={"owner": "alice", "huge": "x"},
                gpu_request=1,
                pod_ip="10.1.2.3",
            ),
            PodInfo(
                uid="0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                namespace="ml",
                name="web-7d4b9c8f6d-x2x9z",
                node=NODE,
                workload_kind="Deployment",
                workload_name="web",
                gpu_requested=True,
                labels={"team": "vision"},
                # Every label key, as dcgm-exporter names it on its series.
                label_names=frozenset({"pod_template_hash", "team", "other"}),
                annotations={"owner": "alice"},
                containers={CID_A: "trainer", CID_B: "sidecar"},
                pod_ip="10.1.2.3",
                ready=True,
            ),
            id="deployment-pod",
        ),
        pytest.param(
            make_pod(
                "kube-scheduler-node-a",
                "kube-system",
                "7c0c7e5e-1111-4222-8333-944455556666",
                NODE,
                containers=[("kube-scheduler", CID_A, "cri-o")],
                mirror_of=STATIC_HASH.upper(),
                pod_ip="",
                ready=False,
            ),
            PodInfo(
                uid="7c0c7e5e-1111-4222-8333-944455556666",
                namespace="kube-system",
                name="kube-scheduler-node-a",
                node=NODE,
                workload_kind="StaticPod",
                workload_name="kube-scheduler-node-a",
                containers={CID_A: "kube-scheduler"},
                mirror_of=STATIC_HASH,
            ),
            id="mirror-pod-cri-o",
        ),
        pytest.param(
            make_pod(
                "j",
                uid="u-1",
                containers=[("main", CID_A, "docker"), ("waiting", "", "docker")],
                init_containers=[("setup", CID_B, "docker")],
                ephemeral_containers=[("debugger", CID_C, "docker")],
                owner=("Job", "j"),
            ),
            PodInfo(
                uid="u-1",
                namespace="default",
                name="j",
                node=NODE,
                workload_kind="Job",
                workload_name="j",
                containers={CID_A: "main", CID_B: "setup", CID_C: "debugger"},
                pod_ip="10.244.1.17",
                ready=True,
            ),
            id="init-ephemeral-docker-and-waiting",
        ),
    ],
)
def test_parse_pod(obj: dict[str, Any], want: PodInfo) -> None:
    got = parse_pod(obj, label_keys=("team", "absent"), annotation_keys=("owner",))
    assert got == want


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        pytest.param(_gpu_pod({"limits": {"nvidia.com/gpu": "1"}}), True, id="limits-only"),
        pytest.param(_gpu_pod({"requests": {"nvidia.com/gpu": 2}}), True, id="requests-int"),
        pytest.param(
            _gpu_pod({"limits": {"nvidia.com/mig-1g.10gb": "1"}}), True, id="mig-resource"
        ),
        pytest.param(
            _gpu_pod({"limits": {"nvidia.com/gpu": "1"}}, "initContainers"), True, id="init"
        ),
        pytest.param(
            _gpu_pod({"limits": {"nvidia.com/gpu": "1"}}, "ephemeralContainers"),
            True,
            id="ephemeral",
        ),
        pytest.param(_gpu_pod({"limits": {"nvidia.com/gpu": "0"}}), False, id="zero-string"),
        pytest.param(_gpu_pod({"limits": {"nvidia.com/gpu": 0}}), False, id="zero-int"),
        pytest.param(_gpu_pod({"limits": {"nvidia.com/gpu": "0.0"}}), False, id="zero-decimal"),
        pytest.param(_gpu_pod({"limits": {"amd.com/gpu": "1"}}), False, id="other-vendor"),
        pytest.param(_gpu_pod({"limits": {"cpu": "4", "memory": "1Gi"}}), False, id="cpu-only"),
        pytest.param(_gpu_pod({"limits": ["nvidia.com/gpu"]}), False, id="limits-not-a-map"),
        pytest.param(_gpu_pod("junk"), False, id="resources-not-a-map"),  # type: ignore[arg-type]
    ],
)
def test_parse_pod_gpu_requested(obj: dict[str, Any], want: bool) -> None:
    assert parse_pod(obj).gpu_requested is want


def _mangle(path: str, value: Any) -> dict[str, Any]:
    pod = make_pod("m", uid="u-m", containers=[("main", CID_A, "containerd")])
    node: Any = pod
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value
    return pod


@pytest.mark.parametrize(
    ("obj", "check"),
    [
        pytest.param({}, lambda p: p.uid == "" and p.containers == {}, id="empty"),
        pytest.param(None, lambda p: p.uid == "", id="none"),
        pytest.param("pod", lambda p: p.uid == "", id="string"),
        pytest.param(_mangle("metadata", []), lambda p: p.uid == "" and p.name == "", id="meta"),
        pytest.param(_mangle("metadata.uid", 42), lambda p: p.uid == "", id="uid-int"),
        pytest.param(_mangle("spec", None), lambda p: p.node == "" and p.uid == "u-m", id="spec"),
        pytest.param(_mangle("status", "x"), lambda p: p.containers == {} and not p.ready, id="st"),
        pytest.param(
            _mangle("status.containerStatuses", {"a": 1}), lambda p: p.containers == {}, id="cs-map"
        ),
        pytest.param(
            _mangle("status.containerStatuses.0", "junk"), lambda p: p.containers == {}, id="cs-str"
        ),
        pytest.param(
            _mangle("status.containerStatuses.0.containerID", 5),
            lambda p: p.containers == {},
            id="cid-int",
        ),
        pytest.param(
            _mangle("status.containerStatuses.0.name", None),
            lambda p: p.containers == {},
            id="container-without-name",
        ),
        pytest.param(
            _mangle("status.conditions", [None, {"type": "Ready"}, {"status": "True"}]),
            lambda p: not p.ready,
            id="conditions-garbage",
        ),
        pytest.param(
            _mangle("metadata.labels", {"team": 5}),
            lambda p: p.labels == {},
            id="label-value-int",
        ),
        pytest.param(
            _mangle("metadata.labels", {"team": "v" * 5000}),
            lambda p: p.labels == {"team": "v" * 1024},
            id="label-value-truncated",
        ),
        pytest.param(
            _mangle("metadata.annotations", {"kubernetes.io/config.mirror": "x" * 200}),
            lambda p: p.mirror_of == "",
            id="mirror-too-long",
        ),
        pytest.param(
            _mangle("metadata.annotations", {"kubernetes.io/config.mirror": ["x"]}),
            lambda p: p.mirror_of == "",
            id="mirror-not-a-string",
        ),
        pytest.param(
            _mangle("spec.containers", [None, 3, {"resources": None}]),
            lambda p: not p.gpu_requested,
            id="containers-garbage",
        ),
        pytest.param(_mangle("status.podIP", ["10.0.0.1"]), lambda p: p.pod_ip == "", id="ip-list"),
    ],
)
def test_parse_pod_malformed(obj: Any, check: Callable[[PodInfo], bool]) -> None:
    pod = parse_pod(obj, label_keys=("team",), annotation_keys=("kubernetes.io/config.mirror",))
    assert check(pod), pod


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "status",
                    "uid",
                    "name",
                    "labels",
                    "containerStatuses",
                    "containerID",
                    "ownerReferences",
                    "kind",
                    "controller",
                    "resources",
                    "limits",
                    "conditions",
                    "type",
                    "annotations",
                    "containers",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@given(_json)
def test_parse_pod_never_raises(obj: Any) -> None:
    pod = parse_pod(obj, label_keys=("x",), annotation_keys=("x",))
    assert isinstance(pod.uid, str) and isinstance(pod.name, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in pod.containers.items())
    build_index([pod])  # and the index accepts whatever came out


@given(st.sampled_from(["metadata", "spec", "status"]), _json)
def test_parse_pod_survives_any_subtree(section: str, junk: Any) -> None:
    pod = make_pod("h", uid="u-h", containers=[("main", CID_A, "containerd")])
    pod[section] = junk
    got = parse_pod(pod)
    # A subtree that is not metadata cannot change who the pod is.
    assert got.uid == ("u-h" if section != "metadata" else got.uid)


# --------------------------------------------------------------------------- parse_selector


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("app=dcgm-exporter", {"app": "dcgm-exporter"}, id="one"),
        pytest.param("a=b,c=d", {"a": "b", "c": "d"}, id="two"),
        pytest.param(" a = b , c==d ", {"a": "b", "c": "d"}, id="spaces-and-double-equals"),
        pytest.param(
            "app.kubernetes.io/name=dcgm-exporter",
            {"app.kubernetes.io/name": "dcgm-exporter"},
            id="prefixed-key",
        ),
        pytest.param("tier=", {"tier": ""}, id="empty-value"),
        pytest.param("a=b,a=b", {"a": "b"}, id="same-twice"),
        pytest.param("", {}, id="empty"),
        pytest.param("   ", {}, id="blank"),
    ],
)
def test_parse_selector(text: str, want: dict[str, str]) -> None:
    assert parse_selector(text) == want


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a!=b", id="inequality"),
        pytest.param("env in (prod,dev)", id="set-based"),
        pytest.param("!a", id="not-exists"),
        pytest.param("a", id="exists"),
        pytest.param("=b", id="no-key"),
        pytest.param("a=b,,c=d", id="empty-term"),
        pytest.param("a=b,", id="trailing-comma"),
        pytest.param("a=b=c", id="two-equals"),
        pytest.param("a=b,a=c", id="conflict"),
        pytest.param("-a=b", id="key-starts-with-dash"),
        pytest.param("a=-b", id="value-starts-with-dash"),
        pytest.param("a b=c", id="space-in-key"),
        pytest.param("k" * 64 + "=v", id="name-too-long"),
        pytest.param("k=" + "v" * 64, id="value-too-long"),
        pytest.param("Upper.Case/k=v", id="prefix-not-dns"),
        pytest.param("a/b/c=d", id="two-slashes"),
    ],
)
def test_parse_selector_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_selector(text)


# --------------------------------------------------------------------------- MPS daemon pods

OPERATOR_LABELS = {"app": "nvidia-device-plugin-mps-control-daemon"}
CHART_LABELS = {
    "app.kubernetes.io/name": "nvidia-device-plugin",
    "app.kubernetes.io/instance": "nvdp",
}


@pytest.mark.parametrize(
    ("namespace", "labels", "want"),
    [
        pytest.param("gpu-operator", OPERATOR_LABELS, True, id="gpu-operator-daemonset"),
        pytest.param("nvidia-device-plugin", CHART_LABELS, True, id="plugin-helm-chart"),
        pytest.param("ml", OPERATOR_LABELS, False, id="daemon-labels-in-a-tenant-namespace"),
        pytest.param("gpu-operator", {"app": "nvidia-dcgm-exporter"}, False, id="other-labels"),
        pytest.param("gpu-operator", {}, False, id="no-labels"),
    ],
)
def test_default_mps_daemon_pods(namespace: str, labels: dict[str, str], want: bool) -> None:
    """The flags' defaults admit NVIDIA's MPS control daemon as the GPU Operator and the
    device plugin's Helm chart deploy it, and only in their namespaces."""
    obj = make_pod("mps-control-daemon-x", namespace, node=NODE, labels=labels)
    assert parse_pod(obj).mps_daemon is want
    assert parse_pod(obj, mps_daemon_pods=None).mps_daemon is False  # None admits no pod


def test_parse_mps_daemon_pods() -> None:
    got = parse_mps_daemon_pods("a=b,c=d; e==f", ["ns-1", "ns-2"])
    assert got == MpsDaemonPods(frozenset({"ns-1", "ns-2"}), ({"a": "b", "c": "d"}, {"e": "f"}))
    both = make_pod("p", "ns-1", labels={"a": "b", "c": "d"})
    assert got.admits(both)
    assert not got.admits(make_pod("p", "ns-1", labels={"a": "b"}))  # terms are ANDed
    assert got.admits(make_pod("p", "ns-2", labels={"e": "f"}))  # alternatives are ORed
    assert not got.admits(make_pod("p", "ns-3", labels={"e": "f"}))
    nobody = parse_mps_daemon_pods("", ["ns-1"])
    assert not nobody.admits(both)  # no selector: only the host runs the daemon
    assert not parse_mps_daemon_pods("a=b", []).admits(both)
    assert not got.admits({"metadata": {"namespace": ["ns-1"], "labels": "a=b"}})


@pytest.mark.parametrize(
    ("selectors", "namespaces"),
    [
        pytest.param("a=b;", ["ns"], id="empty-alternative"),
        pytest.param("a=b;;c=d", ["ns"], id="empty-middle-alternative"),
        pytest.param("a!=b", ["ns"], id="not-equality"),
        pytest.param("a=b", ["Not_A_Namespace"], id="bad-namespace"),
        pytest.param("a=b", ["$(POD_NAMESPACE)"], id="unexpanded-variable"),
    ],
)
def test_parse_mps_daemon_pods_rejects(selectors: str, namespaces: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_mps_daemon_pods(selectors, namespaces)


# --------------------------------------------------------------------------- parse_pod_list


@pytest.mark.parametrize(
    ("data", "want_rv", "want_names"),
    [
        pytest.param(
            json.dumps(
                {
                    "kind": "PodList",
                    "metadata": {"resourceVersion": "42"},
                    "items": [make_pod("a"), make_pod("b")],
                }
            ).encode(),
            "42",
            ["a", "b"],
            id="two-pods",
        ),
        pytest.param(b'{"metadata":{"resourceVersion":"7"},"items":null}', "7", [], id="null"),
        pytest.param('{"metadata":{"resourceVersion":"7"}}', "7", [], id="str-no-items"),
    ],
)
def test_parse_pod_list(data: bytes | str, want_rv: str, want_names: list[str]) -> None:
    rv, items = parse_pod_list(data)
    assert rv == want_rv
    assert [i["metadata"]["name"] for i in items] == want_names


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"<html>", id="not-json"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b"[]", id="array"),
        pytest.param(b'{"items":[]}', id="no-resource-version"),
        pytest.param(b'{"metadata":{"resourceVersion":5},"items":[]}', id="rv-int"),
        pytest.param(
            b'{"kind":"Status","metadata":{"resourceVersion":"1"},"code":500}', id="status"
        ),
        pytest.param(b'{"metadata":{"resourceVersion":"1"},"items":{}}', id="items-map"),
        pytest.param(b'{"metadata":{"resourceVersion":"1"},"items":[1]}', id="item-int"),
    ],
)
def test_parse_pod_list_rejects(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_pod_list(data)


# --------------------------------------------------------------------------- build_index


def _info(uid: str, containers: dict[str, str] | None = None, mirror_of: str = "") -> PodInfo:
    return PodInfo(
        uid=uid, namespace="ns", name=uid, containers=containers or {}, mirror_of=mirror_of
    )


def test_build_index_maps_uids_mirrors_and_containers() -> None:
    a = _info("uid-a", {CID_A: "main", CID_B: "side"})
    m = _info("uid-m", {CID_C: "sched"}, mirror_of=STATIC_HASH)
    index = build_index([a, m])
    assert index.by_uid == {"uid-a": a, "uid-m": m, STATIC_HASH: m}
    assert index.by_container == {CID_A: (a, "main"), CID_B: (a, "side"), CID_C: (m, "sched")}


@pytest.mark.parametrize(
    ("pods", "want_uids", "want_containers"),
    [
        pytest.param(
            [_info("a", {CID_A: "x"}), _info("b", {CID_A: "y", CID_B: "z"})],
            {"a", "b"},
            {CID_B},
            id="container-id-in-two-pods-dropped",
        ),
        pytest.param(
            [_info("a"), _info("b", mirror_of="a")],
            {"a", "b"},
            set(),
            id="mirror-hash-never-shadows-a-real-uid",
        ),
        pytest.param(
            [_info("a", mirror_of="h"), _info("b", mirror_of="h")],
            {"a", "b"},
            set(),
            id="mirror-hash-in-two-pods-dropped",
        ),
        pytest.param([_info(""), _info("a")], {"a"}, set(), id="empty-uid-skipped"),
        pytest.param(
            [_info("a", {CID_A: "x"}), _info("a", {CID_B: "y"})],
            set(),
            set(),
            id="same-uid-twice-dropped",
        ),
    ],
)
def test_build_index_ambiguity(
    pods: list[PodInfo], want_uids: set[str], want_containers: set[str]
) -> None:
    index = build_index(pods)
    assert set(index.by_uid) == want_uids
    assert set(index.by_container) == want_containers


def test_build_index_same_pod_object_twice_is_not_ambiguous() -> None:
    a = _info("a", {CID_A: "x"})
    assert build_index([a, a]).by_container == {CID_A: (a, "x")}


# --------------------------------------------------------------------------- integration
# The kubernetes client is real; only the API server is a stand-in, because there is no
# cluster on this machine.

WAIT = 8.0


def wait_until(pred: Callable[[], object], timeout: float = WAIT) -> None:
    """Poll ``pred`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)


def names(cache: PodCache) -> set[str]:
    return {p.name for p in cache.index().by_uid.values()}


@pytest.fixture
def api() -> Iterator[KubeApiStandIn]:
    before = set(threading.enumerate())
    standin = KubeApiStandIn()
    yield standin
    standin.stop()
    # Every thread a test started (cache, server, handlers) must be gone.
    wait_until(lambda: not (set(threading.enumerate()) - before), timeout=5)


@pytest.fixture
def client(api: KubeApiStandIn) -> Iterator[kubernetes.client.ApiClient]:
    c = make_api_client(api.url)
    yield c
    c.close()


CacheFactory = Callable[..., PodCache]


@pytest.fixture
def make_cache(client: kubernetes.client.ApiClient) -> Iterator[CacheFactory]:
    caches: list[PodCache] = []

    def factory(start: bool = True, **kwargs: Any) -> PodCache:
        opts: dict[str, Any] = {
            "watch_timeout_seconds": 30,
            "request_timeout_seconds": 2.0,
            "backoff_max_seconds": 0.2,
        }
        opts.update(kwargs)
        cache = PodCache(client, NODE, **opts)
        caches.append(cache)
        if start:
            cache.start()
        return cache

    yield factory
    for cache in caches:
        cache.stop()
        assert cache._thread is None or not cache._thread.is_alive()


def test_initial_list(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    api.add_pod(make_pod("a", containers=[("main", CID_A, "containerd")]))
    api.add_pod(make_pod("b", containers=[("main", CID_B, "cri-o")]))
    api.add_pod(make_pod("elsewhere", node="node-b", containers=[("main", CID_C, "containerd")]))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert cache.up and cache.errors_total == 0 and cache.last_sync > 0
    assert names(cache) == {"a", "b"}
    assert cache.index().by_container[CID_B][1] == "main"
    assert CID_C not in cache.index().by_container
    (first,) = api.requests("list")
    assert first.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert first.query["resourceVersion"] == "0"  # served from the API server's cache
    wait_until(lambda: api.open_watches == 1)
    (watch,) = api.requests("watch")
    assert watch.query["resourceVersion"] == api.resource_version
    assert watch.query["allowWatchBookmarks"] == "true"


def test_watch_added_modified_deleted(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    cache = make_cache(label_keys=("team",))
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    pod = make_pod("w", labels={"team": "a"}, containers=[("main", CID_A, "containerd")])
    api.add_pod(pod)
    wait_until(lambda: names(cache) == {"w"})
    before = cache.index()

    pod["metadata"]["labels"]["team"] = "b"
    api.update_pod(pod)
    wait_until(lambda: cache.index().by_uid[pod_uid("default", "w")].labels == {"team": "b"})
    assert before.by_uid[pod_uid("default", "w")].labels == {"team": "a"}  # old index untouched

    api.delete_pod(pod_uid("default", "w"))
    wait_until(lambda: not cache.index().by_uid)
    assert cache.index().by_container == {}
    assert api.list_requests == 1 and cache.errors_total == 0


def test_pod_bound_to_node_arrives_as_added(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    pending = make_pod("pending", node="")
    api.add_pod(pending)
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    assert names(cache) == set()
    pending["spec"]["nodeName"] = NODE
    api.update_pod(pending)  # the scheduler's binding: the field selector now matches
    wait_until(lambda: names(cache) == {"pending"})


def test_container_restart_replaces_container_id(
    api: KubeApiStandIn, make_cache: CacheFactory
) -> None:
    pod = make_pod("r", containers=[("main", CID_A, "containerd")])
    api.add_pod(pod)
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    status = pod["status"]["containerStatuses"][0]
    status["lastState"] = {"terminated": {"containerID": f"containerd://{CID_A}", "exitCode": 1}}
    status["containerID"] = f"containerd://{CID_B}"
    status["restartCount"] = 1
    api.update_pod(pod)
    wait_until(lambda: CID_B in cache.index().by_container)
    index = cache.index()
    assert CID_A not in index.by_container
    assert index.by_container[CID_B][0].uid == pod_uid("default", "r")
    assert set(index.by_uid) == {pod_uid("default", "r")}


def test_mirror_pod_indexed_by_static_hash(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    api.add_pod(make_pod("etcd-node-a", "kube-system", mirror_of=STATIC_HASH))
    wait_until(lambda: STATIC_HASH in cache.index().by_uid)
    pod = cache.index().by_uid[STATIC_HASH]
    assert pod.name == "etcd-node-a" and pod.workload_kind == "StaticPod"
    assert cache.index().by_uid[pod.uid] is pod


def test_bookmark_then_drop_resumes_from_bookmark(
    api: KubeApiStandIn, make_cache: CacheFactory
) -> None:
    api.add_pod(make_pod("a"))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    listed_rv = api.requests("watch")[0].query["resourceVersion"]
    # Pods on other nodes move the global resourceVersion without reaching this watch.
    api.add_pod(make_pod("x1", node="node-b"))
    api.add_pod(make_pod("x2", node="node-b"))
    synced_at = cache.last_sync
    bookmark_rv = api.send_bookmark()
    assert int(bookmark_rv) > int(listed_rv)
    wait_until(lambda: cache.last_sync > synced_at)

    api.drop_watches()
    wait_until(lambda: api.watch_requests == 2 and api.open_watches == 1)
    assert api.requests("watch")[-1].query["resourceVersion"] == bookmark_rv
    assert api.list_requests == 1  # resumed, not relisted
    assert cache.errors_total == 1 and cache.up
    api.add_pod(make_pod("after-drop"))
    wait_until(lambda: names(cache) == {"a", "after-drop"})


def test_server_timeout_resumes_without_errors(
    api: KubeApiStandIn, make_cache: CacheFactory
) -> None:
    cache = make_cache(watch_timeout_seconds=1)
    assert cache.synced.wait(WAIT)
    api.add_pod(make_pod("a"))
    wait_until(lambda: api.watch_requests >= 3)
    watches = api.requests("watch")
    assert watches[0].query["timeoutSeconds"] == "1"
    assert {w.query["resourceVersion"] for w in watches[1:]} == {api.resource_version}
    assert api.list_requests == 1 and cache.errors_total == 0 and cache.up
    assert names(cache) == {"a"}


def test_gone_after_compaction_relists(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    keep = make_pod("keep")
    api.add_pod(keep)
    api.add_pod(make_pod("gone"))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    api.set_down(True)
    wait_until(lambda: not cache.up)
    # While the client is away, history moves on and is compacted.
    api.delete_pod(pod_uid("default", "gone"))
    keep["metadata"]["labels"] = {"v": "2"}
    api.update_pod(keep)
    api.add_pod(make_pod("new", containers=[("main", CID_C, "containerd")]))
    api.compact()
    errors = cache.errors_total
    api.set_down(False)
    wait_until(lambda: names(cache) == {"keep", "new"} and cache.up)
    assert api.expired_total == 1
    assert cache.errors_total > errors  # the 410 is counted
    relist = api.requests("list")[-1]
    assert "resourceVersion" not in relist.query  # a consistent read, not the cache
    assert cache.index().by_container[CID_C][0].name == "new"
    wait_until(lambda: api.open_watches == 1)
    assert api.requests("watch")[-1].query["resourceVersion"] == api.resource_version


@pytest.mark.parametrize("reset", [pytest.param(False, id="500"), pytest.param(True, id="reset")])
def test_api_down_at_start_then_recovers(
    api: KubeApiStandIn, make_cache: CacheFactory, reset: bool
) -> None:
    api.add_pod(make_pod("a"))
    api.set_down(True, reset=reset)
    cache = make_cache()
    wait_until(lambda: cache.errors_total >= 3)
    assert not cache.up and not cache.synced.is_set()
    assert cache.index().by_uid == {} and cache.last_sync == 0
    api.set_down(False)
    assert cache.synced.wait(WAIT)
    wait_until(lambda: cache.up)
    assert names(cache) == {"a"}


def test_api_down_later_keeps_last_index(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    api.add_pod(make_pod("a"))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    index, synced_at = cache.index(), cache.last_sync
    api.set_down(True)
    wait_until(lambda: not cache.up and cache.errors_total >= 2)
    assert cache.index() is index and names(cache) == {"a"}
    assert cache.last_sync == synced_at
    api.set_down(False)
    wait_until(lambda: cache.up and api.open_watches == 1)
    api.add_pod(make_pod("b"))
    wait_until(lambda: names(cache) == {"a", "b"})


def test_slow_api_counts_as_error(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    api.add_pod(make_pod("a"))
    api.set_delay(3.0)
    cache = make_cache(request_timeout_seconds=0.3)
    wait_until(lambda: cache.errors_total >= 2)
    assert not cache.up and not cache.synced.is_set()
    api.set_delay(0)
    assert cache.synced.wait(WAIT)
    assert names(cache) == {"a"} and cache.up


def test_malformed_watch_events_relist(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    api.add_pod(make_pod("a"))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    for n, line in enumerate([b"not json", b'{"type":"ADDED"}', b"[1,2]"], start=1):
        wait_until(lambda n=n: api.watch_requests == n and api.open_watches == 1)
        api.send_raw(line)
        wait_until(lambda n=n: api.list_requests == n + 1)
    api.add_pod(make_pod("b"))
    wait_until(lambda: names(cache) == {"a", "b"})
    assert cache.errors_total == 3


def test_upstream_pods_by_selector(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    sel = {"app": "dcgm-exporter"}
    not_ready = make_pod("dcgm-exporter-aaaa", "gpu", labels=sel, ready=False, pod_ip="10.0.0.1")
    api.add_pod(not_ready)
    api.add_pod(make_pod("dcgm-exporter-zzzz", "gpu", labels=sel, pod_ip="10.0.0.2"))
    api.add_pod(make_pod("other", "gpu", labels={"app": "other"}))
    api.add_pod(make_pod("dcgm-exporter-far", "gpu", node="node-b", labels=sel))
    cache = make_cache(upstream_selector=sel)
    assert cache.synced.wait(WAIT)
    got = cache.upstream_pods()
    assert [(p.name, p.ready) for p in got] == [
        ("dcgm-exporter-zzzz", True),
        ("dcgm-exporter-aaaa", False),
    ]
    assert cache.index().by_uid[got[0].uid].labels == {}  # selector keys are not kept as labels
    assert api.wait_for_watch()
    api.delete_pod(pod_uid("gpu", "dcgm-exporter-zzzz"))
    wait_until(lambda: [p.name for p in cache.upstream_pods()] == ["dcgm-exporter-aaaa"])


def test_watch_marks_the_mps_daemon_pods(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    """The watch applies its MPS daemon rule to listed and watched pods alike."""
    api.add_pod(make_pod("mps-a", "gpu-operator", labels=OPERATOR_LABELS))
    api.add_pod(make_pod("mps-lookalike", "ml", labels=OPERATOR_LABELS))
    cache = make_cache(
        mps_daemon_pods=parse_mps_daemon_pods(
            "app=nvidia-device-plugin-mps-control-daemon", ["gpu-operator"]
        )
    )
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    api.add_pod(make_pod("mps-b", "gpu-operator", labels=OPERATOR_LABELS))

    def marked() -> dict[str, bool]:
        return {p.name: p.mps_daemon for p in cache.index().by_uid.values()}

    wait_until(lambda: len(marked()) == 3)
    assert marked() == {"mps-a": True, "mps-lookalike": False, "mps-b": True}


def test_upstream_pods_without_selector_is_empty(
    api: KubeApiStandIn, make_cache: CacheFactory
) -> None:
    api.add_pod(make_pod("a"))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert cache.upstream_pods() == []
    everything = make_cache(upstream_selector={})
    assert everything.synced.wait(WAIT)
    assert [p.name for p in everything.upstream_pods()] == ["a"]


def test_stop_is_prompt_during_a_long_watch(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    cache = make_cache(watch_timeout_seconds=300)
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    started = time.monotonic()
    cache.stop()
    assert time.monotonic() - started < 1.0
    assert cache._thread is not None and not cache._thread.is_alive()
    assert not cache.up
    wait_until(lambda: api.open_watches == 0)


def test_stop_is_bounded_during_a_slow_list(api: KubeApiStandIn, make_cache: CacheFactory) -> None:
    api.set_delay(5.0)
    cache = make_cache(request_timeout_seconds=0.5)
    wait_until(lambda: api.list_requests >= 1)
    started = time.monotonic()
    cache.stop()
    assert time.monotonic() - started < 2.0
    assert cache._thread is not None and not cache._thread.is_alive()


def test_first_failure_warns_repeats_debug(
    api: KubeApiStandIn, make_cache: CacheFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="enricher.kube")
    api.set_down(True)
    cache = make_cache()
    wait_until(lambda: cache.errors_total >= 3)
    api.set_down(False)
    assert cache.synced.wait(WAIT)
    levels = [r.levelno for r in caplog.records if r.name == "enricher.kube"]
    assert levels[0] == logging.WARNING
    assert levels.count(logging.WARNING) == 1
    assert levels.count(logging.DEBUG) >= 2
    assert levels[-1] == logging.INFO  # recovered


def test_pod_count_is_capped(
    api: KubeApiStandIn, make_cache: CacheFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "MAX_PODS", 2)  # 5000 real pods would make a slow test
    for name in ("a", "b", "c"):
        api.add_pod(make_pod(name))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert names(cache) == {"a", "b"}  # list order; the third is left out, not guessed
    assert api.wait_for_watch()
    api.add_pod(make_pod("d"))
    api.delete_pod(pod_uid("default", "a"))
    api.add_pod(make_pod("e"))
    wait_until(lambda: names(cache) == {"b", "e"})


def test_oversized_list_is_an_error_and_keeps_the_index(
    api: KubeApiStandIn, make_cache: CacheFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.add_pod(make_pod("a"))
    cache = make_cache()
    assert cache.synced.wait(WAIT)
    assert api.wait_for_watch()
    monkeypatch.setattr(kube, "MAX_LIST_BYTES", 64)  # a real list that large is too slow here
    # Force a relist: take the API away and compact its history, then bring it back.
    api.set_down(True)
    wait_until(lambda: not cache.up)
    api.add_pod(make_pod("b"))
    api.compact()
    lists = api.list_requests
    api.set_down(False)
    wait_until(lambda: api.list_requests >= lists + 2)
    assert not cache.up and names(cache) == {"a"}
    monkeypatch.setattr(kube, "MAX_LIST_BYTES", 1 << 20)
    wait_until(lambda: names(cache) == {"a", "b"} and cache.up)


def test_requests_are_the_clients_own(
    api: KubeApiStandIn, no_cluster_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """PodCache builds its requests with the client's ApiClient, not CoreV1Api (whose module
    costs ~21 MiB): the list must be the request CoreV1Api sends, with the kubeconfig's
    bearer token on the list and on every watch."""
    caplog.set_level(logging.DEBUG, logger="enricher")
    api.add_pod(make_pod("a"))
    path = _kubeconfig(no_cluster_env / "config", api.url)
    with load_api_client(str(path)) as client:
        kubernetes.client.CoreV1Api(client).list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={NODE}", resource_version="0", _request_timeout=5
        )
        reference = api.requests("list")[-1]
        cache = PodCache(client, NODE, request_timeout_seconds=2.0, backoff_max_seconds=0.2)
        cache.start()
        try:
            assert cache.synced.wait(WAIT) and api.wait_for_watch()
            listed, watched = api.requests("list")[-1], api.requests("watch")[-1]
            assert (listed.path, listed.query) == (reference.path, reference.query)
            assert reference.authorization == listed.authorization == "Bearer t"
            assert watched.authorization == "Bearer t"
            assert watched.query["allowWatchBookmarks"] == "true"
            assert watched.query["fieldSelector"] == f"spec.nodeName={NODE}"
            assert watched.query["resourceVersion"] == api.resource_version

            # RBAC that does not allow the watch: an API error, counted and logged, the
            # last index kept; recovery once the role is fixed.
            api.set_refusal(403)
            api.drop_watches()
            wait_until(lambda: not cache.up and cache.errors_total >= 2)
            assert names(cache) == {"a"}
            assert "API error 403: Forbidden" in caplog.text
            api.set_refusal(None)
            wait_until(lambda: cache.up and api.open_watches == 1)
        finally:
            cache.stop()


def test_requires_node_name(client: kubernetes.client.ApiClient) -> None:
    with pytest.raises(ValueError):
        PodCache(client, "")


# --------------------------------------------------------------------------- load_api_client


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(  # JSON is YAML: no YAML writer needed
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def no_cluster_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("via", ["argument", "env", "home"])
def test_load_api_client_from_kubeconfig(
    api: KubeApiStandIn,
    no_cluster_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    via: str,
) -> None:
    api.add_pod(make_pod("a"))
    (no_cluster_env / ".kube").mkdir()
    path = _kubeconfig(no_cluster_env / ".kube" / "config", api.url)
    if via == "env":
        monkeypatch.setenv("KUBECONFIG", f"{no_cluster_env}/missing:{path}")
    with load_api_client(str(path) if via == "argument" else None) as client:
        assert client.configuration.host == api.url
        pods = kubernetes.client.CoreV1Api(client).list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={NODE}", _request_timeout=5
        )
        assert [p.metadata.name for p in pods.items] == ["a"]
        assert api.requests("list")[-1].path == "/api/v1/pods"


def test_load_api_client_nothing_configured(no_cluster_env: Path) -> None:
    with pytest.raises(KubeConfigError, match="no kubeconfig"):
        load_api_client()
    with pytest.raises(KubeConfigError, match="no kubeconfig"):
        load_api_client(str(no_cluster_env / "nope.yaml"))


def test_load_api_client_bad_kubeconfig(no_cluster_env: Path) -> None:
    bad = no_cluster_env / "bad.yaml"
    bad.write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match="cannot load"):
        load_api_client(str(bad))


@pytest.mark.skipif(
    Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists(),
    reason="running in a pod: in-cluster config would load",
)
def test_load_api_client_in_cluster_without_service_account(
    no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    # A kubeconfig in $HOME must not be picked up instead: in a pod, in-cluster comes first.
    (no_cluster_env / ".kube").mkdir()
    _kubeconfig(no_cluster_env / ".kube" / "config", "http://127.0.0.1:1")
    with pytest.raises(KubeConfigError, match="cannot load"):
        load_api_client()


def test_stand_in_pod_helper_round_trips_through_the_client_models(
    api: KubeApiStandIn, client: kubernetes.client.ApiClient
) -> None:
    """make_pod's JSON must deserialize into the client's V1Pod like a real server's would."""
    pod = make_pod(
        "deep",
        containers=[("main", CID_A, "containerd")],
        init_containers=[("init", CID_B, "containerd")],
        ephemeral_containers=[("dbg", CID_C, "containerd")],
        owner=("ReplicaSet", "deep-5d8f"),
        gpu_request=1,
    )
    api.add_pod(copy.deepcopy(pod))
    got = kubernetes.client.CoreV1Api(client).list_pod_for_all_namespaces(_request_timeout=5)
    (model,) = got.items
    assert model.metadata.uid == pod["metadata"]["uid"]
    assert model.status.init_container_statuses[0].container_id == f"containerd://{CID_B}"
    assert model.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert got.metadata.resource_version == api.resource_version
