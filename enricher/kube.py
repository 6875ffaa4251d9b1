"""Kubernetes source: the pods of this node, kept current by one list and a resumed watch.

The I/O: :class:`KubernetesSource` runs the real ``kubernetes`` client in one daemon thread and
publishes an immutable :class:`~enricher.model.PodIndex`; what it reads is parsed by the pure
:mod:`enricher.podparse` (pod objects, pod lists, the index, selectors, workloads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import urllib3

from .episodes import EpisodeLog
from .model import PodIndex, PodInfo
from .podparse import (
    DEFAULT_MPS_DAEMON_PODS,
    MpsDaemonPods,
    build_index,
    labels_match,
    object_key,
    parse_pod,
    parse_pod_list,
)
from .sources import ReadResult

__all__ = ["KubeConfigError", "KubernetesSource", "load_api_client"]

log = logging.getLogger(__name__)

MAX_LIST_BYTES = 64 << 20  # a node's pod list is far smaller; more means something is wrong
MAX_PODS = 5000  # kubelet's maxPods is 110 by default; this only stops a runaway selector
_MIN_WATCH_INTERVAL = 1.0  # seconds between watch starts, so a server that ends streams at
# once cannot make us spin
_BACKOFF_BASE = 0.5


# --------------------------------------------------------------------------- client config


class KubeConfigError(RuntimeError):
    """Neither in-cluster credentials nor a usable kubeconfig were found."""


def load_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """An ``ApiClient`` from ``kubeconfig``, else in-cluster config, else the default kubeconfig.

    In-cluster config is used when ``KUBERNETES_SERVICE_HOST`` is set and no kubeconfig is
    given; otherwise ``kubeconfig``, ``$KUBECONFIG`` (":"-separated paths allowed) or
    ``~/.kube/config``. urllib3's own retries are turned off: :class:`KubernetesSource` retries with
    backoff, and a request must fail within its timeout, not several times that.
    Raises :class:`KubeConfigError` with the reason when no configuration can be loaded.
    """
    cfg = kubernetes.client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg
            )
        else:
            path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            candidates = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
            if not any(os.path.isfile(p) for p in candidates):
                raise KubeConfigError(
                    f"no kubeconfig at {path!r} and KUBERNETES_SERVICE_HOST is not set "
                    "(not running in a pod); pass --kube.kubeconfig or set KUBECONFIG"
                )
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=cfg, persist_config=False
            )
    except KubeConfigError:
        raise
    except Exception as exc:  # the loaders raise ConfigException, OSError, YAML errors...
        raise KubeConfigError(f"cannot load Kubernetes client config: {exc}") from exc
    cfg.retries = 0
    return kubernetes.client.ApiClient(cfg)


# --------------------------------------------------------------------------- I/O


class _Malformed(Exception):
    """The server sent something we cannot apply; only a fresh list is trustworthy."""


class _RawWatch(kubernetes.watch.Watch):
    # With no return type, Watch yields the event dicts without building V1Pod models: we
    # parse the camelCase JSON ourselves, and model building would raise on objects that its
    # client-side validation dislikes. ERROR events still come with "raw_object", which the
    # 410 handling in Watch.stream needs (deserialize=False would drop it).
    def get_return_type(self, func: Callable[..., Any]) -> None:
        return None


# The query parameters of a pod list/watch, by the snake_case names Watch.stream passes.
_QUERY_NAMES = {
    "field_selector": "fieldSelector",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}
MAX_ERROR_BYTES = 64 * 1024  # of an error answer's body, kept for the log

_CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class KubernetesSource:
    """This node's pods, from a list and a watch that resumes, in one daemon thread.

    Readers call :meth:`index` / :meth:`upstream_pods` from any thread: both return objects
    that are never changed after publication. While the API server fails, the last good
    index stays in place and ``up`` is False.

    Error handling: a 410 Gone (ERROR event or ApiException) relists; a dropped stream resumes
    from the last resourceVersion; anything else backs off exponentially (with jitter, capped
    at ``backoff_max_seconds``). Only the first retry after a healthy period is immediate.
    The ``api_client`` should have urllib3 retries off (as :func:`load_api_client` does) so
    that a request fails within ``request_timeout_seconds``.
    """

    name = "kubernetes"
    enabled = True

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        node_name: str,
        *,
        label_keys: Sequence[str] = (),
        annotation_keys: Sequence[str] = (),
        upstream_selector: Mapping[str, str] | None = None,
        upstream_namespace: str | None = None,
        mps_daemon_pods: MpsDaemonPods | None = DEFAULT_MPS_DAEMON_PODS,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 30.0,
        backoff_max_seconds: float = 30.0,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required: the cache is scoped to one node")
        self._api = api_client
        self._node = node_name
        self._label_keys = tuple(label_keys)
        self._annotation_keys = tuple(annotation_keys)
        self._selector = dict(upstream_selector) if upstream_selector is not None else None
        # Only pods of this namespace may become the upstream: a tenant who can run a pod with
        # the exporter's labels on a GPU node must not be able to feed the enricher.
        self._upstream_namespace = upstream_namespace or None
        self._mps_daemon_pods = mps_daemon_pods
        self._watch_timeout = max(1, int(watch_timeout_seconds))
        self._request_timeout = max(0.001, float(request_timeout_seconds))
        self._backoff_max = max(0.0, float(backoff_max_seconds))

        self.up = False
        self.errors_total = 0
        self.last_sync = 0.0
        self.synced = threading.Event()

        self._index = PodIndex()
        self._upstream: tuple[PodInfo, ...] = ()
        self._pods: dict[str, tuple[PodInfo, bool]] = {}  # uid -> (pod, matches upstream)
        self._rv: str | None = None
        self._failures = 0  # in a row; 0 after any success
        self._log = EpisodeLog(f"kubernetes pod watch on node {node_name}", log)
        self._over_cap_logged = False

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: _RawWatch | None = None
        self._resp: Any = None  # the open watch response, so stop() can cut it
        self._resp_lock = threading.Lock()
        self._connected = False  # the current watch request got its 200

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        """Start the list+watch thread; a no-op while it runs."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="enricher-kubernetes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread: an open watch is cut at once; a list in flight ends by its timeout.

        The join is bounded (at most 5 s); the thread is a daemon, so one still stuck in a
        slow list cannot hold up process exit.
        """
        self._stop.set()
        with self._resp_lock:
            if self._watch is not None:
                self._watch.stop()  # type: ignore[no-untyped-call]
            _shutdown(self._resp)
        thread = self._thread
        if thread is not None:
            thread.join(timeout=min(self._request_timeout + 1.0, 5.0))
            if thread.is_alive():
                log.warning("kubernetes watch thread did not stop in time")

    @property
    def api_client(self) -> kubernetes.client.ApiClient:
        """The client the watch uses (thread-safe: urllib3's pool), for other readers of the
        same API server, so the configuration is loaded once."""
        return self._api

    def index(self) -> PodIndex:
        """The current index: the last good one while the API server is unreachable."""
        return self._index

    def read(self) -> ReadResult[PodIndex]:
        """The Source read (in memory): the index, ok while the watch is up (the watch thread
        logs its own episodes)."""
        return ReadResult(self._index, self.up)

    def close(self) -> None:
        """:meth:`stop`."""
        self.stop()

    def upstream_pods(self) -> list[PodInfo]:
        """Pods on this node matching ``upstream_selector``: ready ones first, then by name.

        Empty when no selector was given; an empty selector matches every pod.
        """
        return list(self._upstream)

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        consistent = False  # after 410 the relist must not come from a possibly stale cache
        last_watch = 0.0
        while not self._stop.is_set():
            self._connected = False
            immediate = False
            try:
                if self._rv is None:
                    self._list(consistent)
                    consistent = False
                wait = last_watch + _MIN_WATCH_INTERVAL - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    break
                last_watch = time.monotonic()
                self._watch_once()
                continue
            except kubernetes.client.ApiException as exc:
                if self._stop.is_set():
                    break
                if exc.status == 410:
                    # Watch.stream turns a 410 ERROR event into this exception as well.
                    self._rv, consistent, immediate = None, True, True
                    self._fail(f"410 Gone, relisting: {exc.reason}", down=False)
                else:
                    self._fail(f"API error {exc.status}: {exc.reason}")
            except _CONNECTION_ERRORS as exc:
                if self._stop.is_set():
                    break
                # A stream that was healthy and then broke is worth one immediate resume.
                immediate = self._connected and self._failures == 0
                self._fail(f"connection error: {exc!r}", down=not immediate)
            except _Malformed as exc:
                if self._stop.is_set():
                    break
                self._rv, consistent = None, True
                self._fail(f"malformed response, relisting: {exc}")
            except Exception as exc:  # never let the thread die: keep serving the last index
                if self._stop.is_set():
                    break
                self._rv, consistent = None, True
                self._fail(f"unexpected error, relisting: {exc!r}")
            self._failures += 1
            if (not immediate or self._failures > 1) and self._stop.wait(self._backoff()):
                break
        self.up = False

    def _backoff(self) -> float:
        step = min(self._backoff_max, _BACKOFF_BASE * 2.0 ** min(self._failures - 1, 16))
        # Jitter spreads the relists of a whole DaemonSet after an API server restart.
        return step * random.uniform(0.5, 1.0)

    def _fail(self, message: str, *, down: bool = True) -> None:
        self.errors_total += 1
        if down:
            self.up = False
        self._log.fail(message)

    def _healthy(self) -> None:
        self._log.ok()
        self._failures = 0
        self.up = True
        self.last_sync = time.time()

    def _list(self, consistent: bool) -> None:
        kwargs: dict[str, Any] = {}
        if not consistent:
            # "0" is served from the API server's watch cache, which is what lets a
            # DaemonSet on thousands of nodes (re)start without a quorum read each.
            kwargs["resource_version"] = "0"
        # _preload_content=False: the raw response, read with a size cap and parsed as JSON by
        # parse_pod_list instead of being turned into models.
        resp: Any = self._request_pods(
            field_selector=f"spec.nodeName={self._node}",
            _request_timeout=self._request_timeout,
            **kwargs,
        )
        try:
            data = resp.read(MAX_LIST_BYTES + 1)
        except BaseException:
            resp.close()
            raise
        if len(data) > MAX_LIST_BYTES:
            resp.close()  # unread bytes left: the connection must not go back to the pool
            raise _Malformed(f"pod list over {MAX_LIST_BYTES} bytes")
        resp.release_conn()
        try:
            rv, items = parse_pod_list(data)
        except ValueError as exc:
            raise _Malformed(str(exc)) from None
        pods: dict[str, tuple[PodInfo, bool]] = {}
        for item in items:
            self._upsert(pods, item)
        self._pods = pods
        self._rv = rv
        self._publish()
        self._healthy()
        self.synced.set()

    def _request_pods(self, *, _request_timeout: Any, **params: Any) -> Any:
        """GET /api/v1/pods with ``params`` (snake_case names, as the generated API takes
        them); the raw urllib3 response, unread. Non-2xx answers raise ``ApiException``.

        The request is built by the client's ``ApiClient`` (host, TLS, bearer token with its
        refresh hook) like ``CoreV1Api.list_pod_for_all_namespaces`` builds it; that class is
        not used because importing its 63,000-line module costs the process about 21 MiB.
        """
        query = [(_QUERY_NAMES[name], value) for name, value in params.items() if value is not None]
        method, url, headers, body, post = self._api.param_serialize(
            method="GET",
            resource_path="/api/v1/pods",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self._api.call_api(
            method, url, headers, body, post, _request_timeout=_request_timeout
        )
        if not 200 <= resp.status <= 299:
            try:
                detail = resp.response.read(MAX_ERROR_BYTES)
            finally:
                resp.response.close()
            exc = kubernetes.client.ApiException(status=resp.status, reason=resp.reason)
            exc.body = detail.decode("utf-8", "replace")
            raise exc
        return resp.response

    def _open_watch(self, **kwargs: Any) -> Any:
        """The watch request for Watch.stream; notes the response so stop() can cut it."""
        kwargs.pop("_preload_content", None)  # Watch.stream asks for the raw response anyway
        resp: Any = self._request_pods(**kwargs)
        with self._resp_lock:
            self._resp = resp
            stopping = self._stop.is_set()
        if stopping:
            resp.close()
            raise urllib3.exceptions.HTTPError("stopping")
        # Non-2xx answers raised ApiException above: the server accepted the watch.
        self._connected = True
        self.up = True
        return resp

    def _watch_once(self) -> None:
        """One watch request from ``self._rv`` until the server ends it."""
        watch = _RawWatch()  # type: ignore[no-untyped-call]
        with self._resp_lock:
            self._watch = watch
        try:
            stream = watch.stream(  # type: ignore[no-untyped-call]
                self._open_watch,
                field_selector=f"spec.nodeName={self._node}",
                resource_version=self._rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                # A healthy stream is never silent longer than the whole watch; a dead TCP
                # connection must not hang the thread forever.
                _request_timeout=(
                    self._request_timeout,
                    self._watch_timeout + self._request_timeout,
                ),
            )
            for event in stream:
                if self._stop.is_set():
                    return
                self._apply(event)
        finally:
            with self._resp_lock:
                self._watch = None
                self._resp = None
        if not self._stop.is_set():
            # The server ended the watch on its timeout: a normal, healthy end.
            self._log.ok()
            self._failures = 0
            self.up = True

    def _apply(self, event: Any) -> None:
        if not isinstance(event, Mapping):
            raise _Malformed("watch event is not a JSON object")
        kind = event.get("type")
        obj = event.get("raw_object")
        if not isinstance(obj, Mapping):
            raise _Malformed(f"{kind} event without an object")
        uid, rv = object_key(obj)
        if kind == "BOOKMARK":
            if rv:
                self._rv = rv
            self._healthy()
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.debug("ignoring watch event type %r", kind)
            return
        if not uid or not rv:
            raise _Malformed(f"{kind} event without metadata.uid or resourceVersion")
        if kind == "DELETED":
            self._pods.pop(uid, None)
        else:
            self._upsert(self._pods, obj)
        self._rv = rv
        self._publish()
        self._healthy()

    def _upsert(self, pods: dict[str, tuple[PodInfo, bool]], obj: Mapping[str, Any]) -> None:
        pod = parse_pod(obj, self._label_keys, self._annotation_keys, self._mps_daemon_pods)
        if not pod.uid:
            log.debug("skipping a pod without metadata.uid")
            return
        if pod.node != self._node:
            # The field selector should make this impossible; a pod of another node must never
            # be attributed here.
            pods.pop(pod.uid, None)
            return
        if pod.uid not in pods and len(pods) >= MAX_PODS:
            if not self._over_cap_logged:
                log.warning("more than %d pods on node %s; ignoring the rest", MAX_PODS, self._node)
                self._over_cap_logged = True
            return
        matches = (
            self._selector is not None
            and labels_match(obj, self._selector)
            and (self._upstream_namespace is None or pod.namespace == self._upstream_namespace)
        )
        pods[pod.uid] = (pod, matches)

    def _publish(self) -> None:
        entries = list(self._pods.values())
        upstream = sorted(
            (pod for pod, matches in entries if matches),
            key=lambda p: (not p.ready, p.namespace, p.name),
        )
        # Two plain reference swaps: a reader sees the old or the new object, never a mix
        # inside one.
        self._index = build_index(pod for pod, _ in entries)
        self._upstream = tuple(upstream)


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading ``resp`` (shutting the socket down, not closing it)."""
    if resp is None:
        return
    with contextlib.suppress(Exception):  # urllib3 < 2.3 has no shutdown()
        resp.shutdown()
