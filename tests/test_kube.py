"""Tests for enricher.kube: KubernetesSource with the real kubernetes client against the
protocol-faithful API-server stand-in in devkit/kubeapi.py (no cluster here). Its pure parsers
are tested in tests/test_podparse.py."""

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

from devkit.kubeapi import KubeApiStandIn, make_api_client
from enricher import kube
from enricher.kube import KubeConfigError, KubernetesSource, load_api_client
from enricher.podparse import parse_mps_daemon_pods
from enricher.simnode.api import container_id, make_pod, pod_uid

NODE = "node-a"
CID_A = container_id("a")
CID_B = container_id("b")
CID_C = container_id("c")
STATIC_HASH = "5f3c2a7e9b1d4c6a8e0f2b4d6a8c0e1f"
OPERATOR_LABELS = {"app": "nvidia-device-plugin-mps-control-daemon"}


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


def names(cache: KubernetesSource) -> set[str]:
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


CacheFactory = Callable[..., KubernetesSource]


@pytest.fixture
def make_cache(client: kubernetes.client.ApiClient) -> Iterator[CacheFactory]:
    caches: list[KubernetesSource] = []

    def factory(start: bool = True, **kwargs: Any) -> KubernetesSource:
        opts: dict[str, Any] = {
            "watch_timeout_seconds": 30,
            "request_timeout_seconds": 2.0,
            "backoff_max_seconds": 0.2,
        }
        opts.update(kwargs)
        cache = KubernetesSource(client, NODE, **opts)
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
    """KubernetesSource builds its requests with the client's ApiClient, not CoreV1Api (whose module
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
        cache = KubernetesSource(client, NODE, request_timeout_seconds=2.0, backoff_max_seconds=0.2)
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
        KubernetesSource(client, "")


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
