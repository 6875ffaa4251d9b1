"""Tests for enricher.podparse: the pure parsers of pod objects, pod lists, selectors and the
MPS daemon pods, table-driven."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enricher.model import PodInfo
from enricher.podparse import (
    MpsDaemonPods,
    build_index,
    derive_workload,
    parse_mps_daemon_pods,
    parse_pod,
    parse_pod_list,
    parse_selector,
    strip_container_id,
)
from enricher.simnode.api import container_id, make_pod

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


@given(st.lists(_json, max_size=4))
def test_parse_pod_survives_any_owner_references(refs: list[Any]) -> None:
    """ownerReferences of any shape (the workload is derived from them): a reference that is
    not a mapping is skipped, the pod is still the pod. test_parse_pod_survives_any_subtree
    reaches this list only now and then; this property goes there every time."""
    pod = make_pod("h", uid="u-h", containers=[("main", CID_A, "containerd")])
    pod["metadata"]["ownerReferences"] = refs
    got = parse_pod(pod)
    assert (got.uid, got.name) == ("u-h", "h")


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
