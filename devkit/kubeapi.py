"""A small kube-apiserver stand-in that speaks the pod list/watch protocol over real HTTP.

The real ``kubernetes`` client talks to it exactly as it would to a cluster: plain HTTP/1.1,
JSON lists carrying ``metadata.resourceVersion``, and watches as chunked streams of
newline-delimited watch events. What it models, and why each part matters to a reflector:

* every change bumps one global resourceVersion (like etcd's revision), also for pods that a
  field selector hides, so a client only learns about those versions through BOOKMARK events;
* a watch replays the event log after the requested resourceVersion; one older than the
  compacted log gets HTTP 200 and an ``ERROR`` event holding a 410 ``Expired`` Status, then
  the stream ends, as the real server does;
* a watch with no resourceVersion (or "0") starts with synthetic ADDED events for the current
  state;
* with a field selector, an update that makes a pod match is sent as ADDED and one that makes
  it stop matching as DELETED;
* the stream ends cleanly after ``timeoutSeconds``;
* ResourceSlices (``/apis/resource.k8s.io/<version>/resourceslices``) are listed, filtered
  by ``spec.nodeName``/``spec.driver`` field selectors as the real server does, and only at
  the versions a test says are served (404 at the others); they are never watched.

Test controls are plain thread-safe methods. The server runs in a background thread
(``ThreadingHTTPServer``, one thread per connection) so that tests can use it from sync code
and the client's own threads.
"""

from __future__ import annotations

import contextlib
import copy
import json
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes.client

__all__ = [
    "ApiRequest",
    "KubeApiStandIn",
    "make_api_client",
]

# The real server picks a random watch duration when the client sends none; a fixed one keeps
# tests reproducible.
DEFAULT_WATCH_SECONDS = 30
MAX_WATCH_SECONDS = 600
# Bounds on what the stand-in keeps, so a long demo cannot grow it without limit.
HISTORY_LIMIT = 10_000
REQUEST_LOG_LIMIT = 10_000


@dataclass(frozen=True)
class ApiRequest:
    """One request the stand-in answered, for assertions on what the client asked."""

    kind: str  # "list" | "watch" | "other"
    path: str
    query: Mapping[str, str]
    at: float  # time.monotonic() when it arrived
    authorization: str | None = None  # the Authorization header, as sent


@dataclass
class _Event:
    seq: int
    rv: int
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | RAW
    obj: dict[str, Any] | None  # the object after the change (for DELETED: its last state)
    old: dict[str, Any] | None  # the object before the change, for selector transitions
    raw: bytes = b""  # RAW: a line sent as is, to test clients against a broken server


@dataclass
class _Selector:
    """An equality/inequality selector on pod fields or labels (the forms kubectl sends)."""

    fields: list[tuple[str, str, bool]] = field(default_factory=list)  # (path, value, equal)
    labels: list[tuple[str, str, bool]] = field(default_factory=list)

    def matches(self, pod: Mapping[str, Any] | None) -> bool:
        if pod is None:
            return False
        for path, value, equal in self.fields:
            if (_field_value(pod, path) == value) != equal:
                return False
        labels = pod.get("metadata", {}).get("labels") or {}
        return all((labels.get(key) == value) == equal for key, value, equal in self.labels)


_SUPPORTED_FIELDS = ("spec.nodeName", "metadata.name", "metadata.namespace", "status.phase")
# The field selectors kube-apiserver accepts on ResourceSlices (besides metadata.name).
_SLICE_FIELDS = ("spec.nodeName", "spec.driver", "metadata.name")
_SLICE_PREFIX = "/apis/resource.k8s.io/"


def _field_value(pod: Mapping[str, Any], path: str) -> str:
    node: Any = pod
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, str) else ""


def _parse_terms(text: str, *, allowed: Sequence[str] | None) -> list[tuple[str, str, bool]]:
    terms: list[tuple[str, str, bool]] = []
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            continue
        if "!=" in token:
            key, value = token.split("!=", 1)
            equal = False
        elif "==" in token:
            key, value = token.split("==", 1)
            equal = True
        elif "=" in token:
            key, value = token.split("=", 1)
            equal = True
        else:
            raise ValueError(f"unsupported selector term {token!r}")
        key = key.strip()
        if allowed is not None and key not in allowed:
            raise ValueError(f'field label not supported: "{key}"')
        terms.append((key, value.strip(), equal))
    return terms


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Aborted(Exception):
    """The stream must end abruptly (drop_watches, set_down, stop)."""


class KubeApiStandIn:
    """An HTTP server on 127.0.0.1 that answers pod list and watch like kube-apiserver.

    Use as a context manager or call :meth:`stop`. Every control method is thread-safe.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._cond = threading.Condition()
        self._pods: dict[str, dict[str, Any]] = {}
        self._slices: list[dict[str, Any]] = []
        self._slice_versions: tuple[str, ...] = ()
        self._events: list[_Event] = []
        self._next_seq = 0
        self._rv = 1
        # Watches from a resourceVersion below this one cannot be served any more.
        self._compacted_rv = 1
        self._drop_gen = 0
        self._down = False
        self._down_reset = False
        self._refuse: tuple[int, str] | None = None
        self._delay = 0.0
        self._stopping = threading.Event()
        self._log: list[ApiRequest] = []
        self._open_watches = 0
        self._connections: set[socket.socket] = set()
        self.list_requests = 0
        self.watch_requests = 0
        self.expired_total = 0  # 410 Expired answers sent

        standin = self

        class Handler(_Handler):
            api = standin

        self._server = ThreadingHTTPServer((host, port), Handler)
        # Handler threads are joined on stop (block_on_close), after their sockets are shut.
        self._server.daemon_threads = False
        self._server.block_on_close = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="kubeapi-standin",
            daemon=True,
        )
        self._thread.start()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> KubeApiStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close every connection, stop the server and join all of its threads."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._cond:
            self._drop_gen += 1
            self._cond.notify_all()
        self._server.shutdown()
        with self._cond:
            conns = list(self._connections)
        for conn in conns:
            _shutdown(conn)
        self._server.server_close()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ controls

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion, as the string the API uses."""
        with self._cond:
            return str(self._rv)

    @property
    def open_watches(self) -> int:
        """How many watch streams are being served right now."""
        with self._cond:
            return self._open_watches

    def requests(self, kind: str | None = None) -> list[ApiRequest]:
        """The request log (oldest first), optionally only one kind ("list" or "watch")."""
        with self._cond:
            return [r for r in self._log if kind is None or r.kind == kind]

    def pods(self) -> list[dict[str, Any]]:
        """Deep copies of the stored pods."""
        with self._cond:
            return [copy.deepcopy(p) for p in self._pods.values()]

    def add_pod(self, obj: Mapping[str, Any]) -> str:
        """Create a pod; returns its new resourceVersion."""
        with self._cond:
            uid = _uid_of(obj)
            if uid in self._pods:
                raise ValueError(f"pod {uid} exists")
            return self._record("ADDED", obj, None)

    def update_pod(self, obj: Mapping[str, Any]) -> str:
        """Replace a pod (matched by metadata.uid); returns its new resourceVersion."""
        with self._cond:
            uid = _uid_of(obj)
            old = self._pods.get(uid)
            if old is None:
                raise KeyError(uid)
            return self._record("MODIFIED", obj, old)

    def delete_pod(self, uid: str) -> str:
        """Delete a pod; the DELETED event carries its last state at a new resourceVersion."""
        with self._cond:
            old = self._pods.get(uid)
            if old is None:
                raise KeyError(uid)
            return self._record("DELETED", old, old)

    def set_resource_slices(
        self, items: Iterable[Mapping[str, Any]], versions: Sequence[str] = ("v1",)
    ) -> None:
        """Serve these ResourceSlices, at these resource.k8s.io versions only."""
        with self._cond:
            self._slices = [copy.deepcopy(dict(i)) for i in items]
            self._slice_versions = tuple(versions)
            self._rv += 1

    def send_bookmark(self) -> str:
        """Send a BOOKMARK with the current resourceVersion to every watch that allows them."""
        with self._cond:
            self._append(_Event(self._next_seq, self._rv, "BOOKMARK", None, None))
            self._cond.notify_all()
            return str(self._rv)

    def send_raw(self, line: bytes) -> None:
        """Send ``line`` verbatim as one watch event to every open watch (a broken server)."""
        with self._cond:
            self._append(_Event(self._next_seq, self._rv, "RAW", None, None, raw=line))
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget the event history: a watch from any older resourceVersion gets 410 Expired."""
        with self._cond:
            self._compacted_rv = self._rv
            self._events.clear()

    def drop_watches(self) -> None:
        """Abruptly reset every open watch connection (no terminating chunk, TCP RST)."""
        with self._cond:
            self._drop_gen += 1
            self._cond.notify_all()

    def set_down(self, down: bool, *, reset: bool = False) -> None:
        """While down, answer every request with 500 (or, with reset, close the connection).

        Going down also drops the open watches, as a restarting API server does.
        """
        with self._cond:
            self._down = down
            self._down_reset = reset
            if down:
                self._drop_gen += 1
                self._cond.notify_all()

    def set_refusal(self, code: int | None, reason: str = "Forbidden") -> None:
        """Answer every request with this error status (403 for RBAC that does not allow the
        request, 401 for a bad token) until called with None."""
        with self._cond:
            self._refuse = None if code is None else (code, reason)

    def set_delay(self, seconds: float) -> None:
        """Wait this long before answering each request (a slow or overloaded API server)."""
        with self._cond:
            self._delay = max(0.0, seconds)

    def wait_for_watch(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until at least ``count`` watches are open; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._open_watches < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    # ------------------------------------------------------------------ storage (lock held)

    def _record(self, kind: str, obj: Mapping[str, Any], old: dict[str, Any] | None) -> str:
        self._rv += 1
        new = copy.deepcopy(dict(obj))
        new.setdefault("kind", "Pod")
        new.setdefault("apiVersion", "v1")
        new.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        uid = _uid_of(new)
        if kind == "DELETED":
            del self._pods[uid]
        else:
            self._pods[uid] = new
        self._append(_Event(self._next_seq, self._rv, kind, new, old))
        self._cond.notify_all()
        return str(self._rv)

    def _append(self, event: _Event) -> None:
        self._next_seq += 1
        self._events.append(event)
        if len(self._events) > HISTORY_LIMIT:
            dropped = self._events.pop(0)
            self._compacted_rv = max(self._compacted_rv, dropped.rv)

    def _log_request(
        self, kind: str, path: str, query: Mapping[str, str], authorization: str | None = None
    ) -> None:
        with self._cond:
            if kind == "list":
                self.list_requests += 1
            elif kind == "watch":
                self.watch_requests += 1
            self._log.append(ApiRequest(kind, path, dict(query), time.monotonic(), authorization))
            del self._log[:-REQUEST_LOG_LIMIT]


def _uid_of(obj: Mapping[str, Any]) -> str:
    uid = obj.get("metadata", {}).get("uid")
    if not isinstance(uid, str) or not uid:
        raise ValueError("pod needs metadata.uid")
    return uid


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    api: KubeApiStandIn
    protocol_version = "HTTP/1.1"
    # Bounds how long an idle keep-alive connection holds a handler thread.
    timeout = 30

    def setup(self) -> None:
        super().setup()
        with self.api._cond:
            self.api._connections.add(self.connection)

    def finish(self) -> None:
        with self.api._cond:
            self.api._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # pytest would show this on every failure; the request log is enough

    # ------------------------------------------------------------------ dispatch

    def do_GET(self) -> None:
        api = self.api
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        is_watch = query.get("watch", "").lower() in ("true", "1")
        namespace = ""
        path = parts.path.rstrip("/")
        if path == "/api/v1/pods":
            kind = "watch" if is_watch else "list"
        elif path.startswith("/api/v1/namespaces/") and path.endswith("/pods"):
            namespace = path[len("/api/v1/namespaces/") : -len("/pods")]
            kind = "watch" if is_watch and "/" not in namespace else "list"
            if "/" in namespace:
                kind = "other"
        elif path.startswith(_SLICE_PREFIX) and path.endswith("/resourceslices"):
            kind = "slices"
        else:
            kind = "other"
        api._log_request(kind, parts.path, query, self.headers.get("Authorization"))

        with api._cond:
            delay, down, reset = api._delay, api._down, api._down_reset
            refuse = api._refuse
        if delay and api._stopping.wait(delay):
            return self._reset()
        if down:
            if reset:
                return self._reset()
            return self._send_json(500, _status(500, "InternalError", "stand-in is down"))
        if refuse is not None:
            code, reason = refuse
            return self._send_json(
                code, _status(code, reason, f'pods is {reason.lower()}: User "u"')
            )
        if kind == "other":
            return self._send_json(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
        if kind == "slices":
            return self._list_slices(path[len(_SLICE_PREFIX) : -len("/resourceslices")], query)
        try:
            selector = _Selector(
                fields=_parse_terms(query.get("fieldSelector", ""), allowed=_SUPPORTED_FIELDS),
                labels=_parse_terms(query.get("labelSelector", ""), allowed=None),
            )
        except ValueError as exc:
            return self._send_json(400, _status(400, "BadRequest", str(exc)))
        if namespace:
            selector.fields.append(("metadata.namespace", namespace, True))
        if kind == "list":
            return self._list(selector)
        return self._watch(selector, query)

    def _list_slices(self, version: str, query: Mapping[str, str]) -> None:
        api = self.api
        with api._cond:
            served, items, rv = api._slice_versions, list(api._slices), api._rv
        if version not in served:
            return self._send_json(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
        try:
            fields = _parse_terms(query.get("fieldSelector", ""), allowed=_SLICE_FIELDS)
        except ValueError as exc:
            return self._send_json(400, _status(400, "BadRequest", str(exc)))
        selector = _Selector(fields=fields)
        body = {
            "kind": "ResourceSliceList",
            "apiVersion": f"resource.k8s.io/{version}",
            "metadata": {"resourceVersion": str(rv)},
            "items": [i for i in items if selector.matches(i)],
        }
        self._send_bytes(200, json.dumps(body).encode())

    def _list(self, selector: _Selector) -> None:
        with self.api._cond:
            items = [p for p in self.api._pods.values() if selector.matches(p)]
            body = {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.api._rv)},
                "items": items,
            }
            data = json.dumps(body).encode()
        self._send_bytes(200, data)

    def _watch(self, selector: _Selector, query: Mapping[str, str]) -> None:
        api = self.api
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        try:
            seconds = int(query.get("timeoutSeconds", DEFAULT_WATCH_SECONDS))
        except ValueError:
            return self._send_json(400, _status(400, "BadRequest", "invalid timeoutSeconds"))
        seconds = min(max(seconds, 0), MAX_WATCH_SECONDS)
        deadline = time.monotonic() + seconds
        rv_text = query.get("resourceVersion", "")
        initial: list[dict[str, Any]] = []
        with api._cond:
            if rv_text in ("", "0"):
                since = api._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(p)}
                    for p in api._pods.values()
                    if selector.matches(p)
                ]
            else:
                try:
                    since = int(rv_text)
                except ValueError:
                    return self._send_json(
                        400, _status(400, "BadRequest", f"invalid resourceVersion {rv_text!r}")
                    )
            expired = since < api._compacted_rv
            if expired:
                api.expired_total += 1
            cursor = next((e.seq for e in api._events if e.rv > since), api._next_seq)
            gen = api._drop_gen
            api._open_watches += 1
            api._cond.notify_all()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache, private")
            self.end_headers()
            if expired:
                message = f"too old resource version: {since} ({api._compacted_rv})"
                self._chunk({"type": "ERROR", "object": _status(410, "Expired", message)})
                return self._end_chunks()
            for event in initial:
                self._chunk(event)
            while True:
                out, cursor, done = self._next_batch(selector, cursor, gen, deadline, bookmarks)
                for item in out:
                    self._chunk(item)
                if done:
                    return self._end_chunks()
        except _Aborted:
            self._reset()
        except OSError:
            self.close_connection = True
        finally:
            with api._cond:
                api._open_watches -= 1
                api._cond.notify_all()

    def _next_batch(
        self, selector: _Selector, cursor: int, gen: int, deadline: float, bookmarks: bool
    ) -> tuple[list[dict[str, Any] | bytes], int, bool]:
        """Wait for events after ``cursor``; returns (events to send, new cursor, stream ends)."""
        api = self.api
        with api._cond:
            while True:
                if api._drop_gen != gen or api._stopping.is_set():
                    raise _Aborted
                first = api._events[0].seq if api._events else api._next_seq
                if cursor < first:
                    # The history this watcher still needed was compacted under it: the real
                    # server ends such a watch with 410 too.
                    api.expired_total += 1
                    error = _status(410, "Expired", "watch history compacted")
                    return [{"type": "ERROR", "object": error}], cursor, True
                pending = api._events[cursor - first :]
                if pending:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], cursor, True
                if self._client_gone():
                    raise _Aborted
                # Wake now and then to notice a client that went away, as the real server's
                # request context does.
                api._cond.wait(min(left, 0.1))
            out: list[dict[str, Any] | bytes] = []
            for ev in pending:
                item = ev.raw if ev.type == "RAW" else _translate(ev, selector, bookmarks)
                if item:
                    out.append(item)
            return out, pending[-1].seq + 1, False

    # ------------------------------------------------------------------ wire helpers

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _chunk(self, event: Mapping[str, Any] | bytes) -> None:
        data = (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_json(self, code: int, body: Mapping[str, Any]) -> None:
        self._send_bytes(code, json.dumps(body).encode())

    def _send_bytes(self, code: int, data: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _reset(self) -> None:
        """Close the connection with a TCP RST, as a crashed server or a cut network does."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass


def _translate(event: _Event, selector: _Selector, bookmarks: bool) -> dict[str, Any] | None:
    """What one watcher sees of a stored event, given its selector."""
    if event.type == "BOOKMARK":
        if not bookmarks:
            return None
        meta = {"resourceVersion": str(event.rv)}
        return {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": meta}}
    now = event.type != "DELETED" and selector.matches(event.obj)
    before = event.old is not None and selector.matches(event.old)
    if event.type == "DELETED":
        kind = "DELETED" if before else None
    elif now and before:
        kind = "MODIFIED"
    elif now:
        kind = "ADDED"
    elif before:
        kind = "DELETED"  # it no longer matches: the real server sends its new state as deleted
    else:
        kind = None
    if kind is None:
        return None
    return {"type": kind, "object": copy.deepcopy(event.obj)}


# ---------------------------------------------------------------------- client and pod helpers


def resource_slice(
    devices: Sequence[Any],
    *,
    node: str,
    driver: str = "gpu.nvidia.com",
    pool: str | None = None,
    generation: int = 1,
    version: str = "v1",
) -> dict[str, Any]:
    """One ResourceSlice of ``devices`` as given (hostile ones too) in ``version``'s envelope:
    the one pool (named after the node unless ``pool``) and its ``generation``. The shape a DRA
    driver publishes for a simulated node is enricher.simnode.api.resource_slices'."""
    pool = node if pool is None else pool
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{pool}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


def make_api_client(url: str) -> kubernetes.client.ApiClient:
    """A real ``ApiClient`` pointed at ``url`` with no auth and no urllib3 retries.

    Retries are off for the same reason ``enricher.kube.load_api_client`` turns them off: the
    pod cache retries with its own backoff, and one request must fail within its timeout.
    """
    cfg = kubernetes.client.Configuration(host=url)
    cfg.retries = 0
    return kubernetes.client.ApiClient(cfg)
