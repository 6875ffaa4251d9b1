"""The Docker source: which Docker container a cgroup's container ID is, for GPU hosts without
Kubernetes.

``parse_*`` are pure; what they return (``model.DockerContainer``) and its family
(``families.render_container_info``) live with the pure core. ``DockerSource`` asks the Docker
Engine API on its unix socket (``GET /_ping`` and ``GET /containers/<id>/json`` only: it never
changes anything) and keeps the answers in a bounded cache keyed by container ID.

Without a socket (``host=""``, or no socket file at the configured path) the source runs in
cgroup-only mode: every container is named by its short ID, which the cgroup path alone gives.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from .episodes import EpisodeLog
from .httpread import read_body
from .model import DockerContainer, short_id
from .sources import ReadResult

__all__ = [
    "DEFAULT_HOST",
    "DockerError",
    "DockerSource",
    "parse_api_version",
    "parse_docker_host",
    "parse_error_message",
    "parse_inspect",
]

log = logging.getLogger(__name__)

DEFAULT_HOST = "unix:///var/run/docker.sock"
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
# Docker names, image references and label values are far shorter; anything longer is cut
# rather than trusted (textformat cuts label values at 1024 again).
MAX_VALUE_CHARS = 512
# Request paths without a version prefix: only for a daemon that names no version in /_ping.
_UNVERSIONED = ""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_API_VERSION = re.compile(r"1\.([0-9]{1,3})")
# Docker's 400 answer to a version outside its range: "client version 1.41 is too old.
# Minimum supported API version is 1.44, ..." / "... is too new. Maximum supported ...".
_VERSION_REFUSED = re.compile(r"client version \S+ is too (old|new)", re.IGNORECASE)
_NO_SUCH_CONTAINER = re.compile(r"no such container", re.IGNORECASE)
# Host header for requests over the socket: Docker ignores it, HTTP requires one.
_BASE_URL = "http://docker"


# --------------------------------------------------------------------------- pure parts


class DockerError(Exception):
    """A Docker API exchange failed; ``reason`` is short and stable (for logs and tests)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _clean(value: Any) -> str:
    """A string field from the API: non-strings become "", long ones are cut, and characters
    that cannot be written as UTF-8 (lone surrogates from JSON escapes) become "?"."""
    if not isinstance(value, str):
        return ""
    text: str = value[:MAX_VALUE_CHARS]
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def parse_inspect(obj: Any) -> DockerContainer:
    """The container from a decoded ``GET /containers/<id>/json`` answer.

    ``Id`` must be a full 64-hex ID; everything else is optional and checked: a missing
    ``Name`` gives the short ID, a missing ``Config.Image`` the image ID. Raises ``ValueError``
    when the document is not a container.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"inspect: a JSON object was expected, got {type(obj).__name__}")
    cid = obj.get("Id")
    if not isinstance(cid, str) or not _HEX64.fullmatch(cid):
        raise ValueError(f"inspect: Id is not a 64-hex container ID: {str(cid)[:80]!r}")
    name = _clean(obj.get("Name"))
    name = name[1:] if name.startswith("/") else name
    config = obj.get("Config")
    config = config if isinstance(config, Mapping) else {}
    labels = config.get("Labels")
    labels = labels if isinstance(labels, Mapping) else {}
    return DockerContainer(
        id=cid,
        name=name or short_id(cid),
        image=_clean(config.get("Image")) or _clean(obj.get("Image")),
        compose_project=_clean(labels.get(COMPOSE_PROJECT)),
        compose_service=_clean(labels.get(COMPOSE_SERVICE)),
    )


def parse_inspect_body(body: bytes, expected_id: str) -> DockerContainer:
    """``parse_inspect`` on a raw answer body, which must be about ``expected_id``.

    Raises ``ValueError`` on anything but a JSON container document with that very ID: a
    daemon (or a stand-in on the socket) naming another container must not rename ours.
    """
    try:
        obj = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"inspect: not JSON: {str(exc)[:120]}") from exc
    container = parse_inspect(obj)
    if container.id != expected_id:
        raise ValueError(f"inspect: asked for {short_id(expected_id)}, got {container.short_id}")
    return container


def parse_error_message(body: bytes) -> str:
    """The ``message`` of Docker's JSON error body (``{"message": "..."}``), else the start of
    the body as text."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return text[:200].strip()
    if isinstance(obj, Mapping) and isinstance(obj.get("message"), str):
        return str(obj["message"])[:200]
    return text[:200].strip()


def parse_api_version(header: str | None) -> str | None:
    """The ``Api-Version`` header of ``/_ping`` (``"1.47"``) if well-formed, else None."""
    if header is None:
        return None
    header = header.strip()
    return header if _API_VERSION.fullmatch(header) else None


def parse_docker_host(host: str) -> str | None:
    """The socket path of a ``--docker.host`` value; None for "" (cgroup-only mode).

    Only ``unix://`` with an absolute path is accepted: the enricher speaks to the local daemon
    and never over TCP. Raises ``ValueError`` with a message fit for the command line.
    """
    if host == "":
        return None
    scheme, sep, path = host.partition("://")
    if not sep or scheme != "unix":
        raise ValueError(
            f"--docker.host {host!r}: only unix:///path/to/docker.sock is supported "
            '(or "" for cgroup-only mode)'
        )
    # sun_path holds 108 bytes with the terminating NUL.
    if not path.startswith("/") or "\x00" in path or len(path.encode("utf-8", "replace")) > 107:
        raise ValueError(f"--docker.host {host!r}: the socket path must be absolute and short")
    return path


def _choose_version(offered: str | None) -> str:
    """The API version to put in request paths: the daemon's own newest one.

    Docker serves every version between its minimum and its newest, and the minimum moves up
    (Docker 29 refuses anything below 1.44), so a fixed version breaks on some daemon; the
    fields read here (Id, Name, Config.Image, Config.Labels) have not changed in any version.
    A daemon that names no version gets unversioned paths, which it serves at its default.
    """
    return offered if offered is not None else _UNVERSIONED


# --------------------------------------------------------------------------- I/O


@dataclass(slots=True)
class _Entry:
    container: DockerContainer | None  # None: Docker said there is no such container
    fetched_at: float


class DockerSource:
    """Container name, image and compose labels by container ID, from the Docker Engine API.

    ``lookup`` answers from the cache; an ID it has not seen (or whose entry is older than its
    TTL) is fetched then, at most one request in flight per ID and ``max_concurrency`` in all.
    A container Docker does not know (404) is remembered as gone for ``vanished_ttl`` seconds,
    one found for ``found_ttl`` (so a rename shows up); entries are dropped at twice their TTL
    and the cache never holds more than ``cache_size`` IDs. While the API fails, a container
    seen before keeps its last answer and a new one is named by its short ID; so while the
    socket is missing (a daemon restarting), until the last answer is twice its TTL old.

    Health: ``up`` is whether the last exchange with the daemon worked (a ``/_ping`` is sent
    when nothing else was asked for ``health_interval`` seconds); ``enabled`` is False in
    cgroup-only mode. Not thread-safe: use it from one event loop.
    """

    name = "docker"

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        timeout: float = 2.0,
        *,
        max_bytes: int = 1 << 20,
        max_concurrency: int = 4,
        max_ids: int = 512,
        cache_size: int = 4096,
        found_ttl: float = 300.0,
        vanished_ttl: float = 60.0,
        health_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``timeout``: seconds for one request; a ``lookup`` waits at most twice that (the
        version check and the inspect). Raises ``ValueError`` for a ``host`` that is not
        ``unix:///...`` or ""."""
        if timeout <= 0 or max_bytes <= 0 or max_concurrency <= 0 or max_ids <= 0:
            raise ValueError("timeout, max_bytes, max_concurrency and max_ids must be positive")
        if cache_size < 0:
            raise ValueError(f"cache_size must not be negative, got {cache_size}")
        self.host = host
        self.socket_path = parse_docker_host(host)
        self.timeout = float(timeout)
        self.max_bytes = max_bytes
        self.max_ids = max_ids
        self.cache_size = cache_size
        self.found_ttl = found_ttl
        self.vanished_ttl = vanished_ttl
        self.health_interval = health_interval
        self._clock = clock

        self.up = False
        self.errors_total = 0
        self.requests_total = 0
        self.api_version: str | None = None  # None until negotiated; "" for unversioned paths
        self.enabled = self.socket_path is not None

        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[_Entry | None]] = {}
        self._negotiation: asyncio.Task[None] | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None
        self._last_contact = -float("inf")
        self._log = EpisodeLog("docker", log)

    # ------------------------------------------------------------------ public

    async def lookup(self, container_ids: Iterable[str]) -> dict[str, DockerContainer | None]:
        """Who each container ID is: a ``DockerContainer`` (``resolved`` False when only the
        short ID is known), or None when Docker says there is no such container (or the ID is
        not a 64-hex container ID at all). Never raises for API trouble."""
        ids = list(dict.fromkeys(container_ids))
        out: dict[str, DockerContainer | None] = {}
        wanted: list[str] = []
        for cid in ids:
            if not isinstance(cid, str) or not _HEX64.fullmatch(cid):
                out[cid] = None
            elif len(wanted) < self.max_ids:
                wanted.append(cid)
            else:
                out[cid] = DockerContainer.from_id(cid)
        now = self._clock()
        if not self._check_socket():
            # cgroup-only mode, or a socket gone while the daemon restarts: answers seen before
            # hold until they age out (twice their TTL), the rest are short IDs.
            self._sweep(now, keep=set())
            for cid in wanted:
                entry = self._cache.get(cid)
                out[cid] = entry.container if entry is not None else DockerContainer.from_id(cid)
            return out

        self._sweep(now, keep=set(wanted))
        fetches: dict[str, asyncio.Task[_Entry | None]] = {}
        for cid in wanted:
            entry = self._cache.get(cid)
            if entry is not None:
                self._cache.move_to_end(cid)
                if now - entry.fetched_at < self._ttl(entry):
                    continue
            task = self._inflight.get(cid)
            if task is None:
                task = asyncio.create_task(self._fetch(cid), name=f"docker-inspect-{cid[:12]}")
                self._inflight[cid] = task
                task.add_done_callback(functools.partial(self._landed, cid))
            fetches[cid] = task
        waiting: list[asyncio.Task[Any]] = list(fetches.values())
        if not waiting and now - self._last_contact >= self.health_interval:
            waiting.append(asyncio.create_task(self._ping_task()))
        if waiting:
            # Each request is bounded by `timeout`; stragglers finish in the background and
            # fill the cache for the next scrape.
            await asyncio.wait(waiting, timeout=2 * self.timeout)

        for cid in wanted:
            task = fetches.get(cid)
            if task is not None and task.done() and not task.cancelled():
                fetched = task.result()
                if fetched is not None:
                    out[cid] = fetched.container
                    continue
            # Not asked, failed or still running: the last answer, else the short ID.
            entry = self._cache.get(cid)
            out[cid] = entry.container if entry is not None else DockerContainer.from_id(cid)
        return out

    async def read(
        self, container_ids: Iterable[str]
    ) -> ReadResult[dict[str, DockerContainer | None]]:
        """The Source read: :meth:`lookup`, ok while the daemon answers (episodes are logged
        here, per exchange). Asked even with no ID, so the health stays current."""
        answers = await self.lookup(container_ids)
        return ReadResult(answers, self.up)

    async def ping(self) -> bool:
        """``GET /_ping`` (and agree on the API version); updates ``up``. Never raises."""
        if not self._check_socket():
            return False
        await self._ping_task()
        return self.up

    async def close(self) -> None:
        """Cancel requests in flight and close the connection pool."""
        tasks = [*self._inflight.values()]
        if self._negotiation is not None:
            tasks.append(self._negotiation)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()
        self._negotiation = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ internals

    def _check_socket(self) -> bool:
        """Whether there is a socket to talk to. A configured path with no socket is a source
        that is down (containers are named by short ID meanwhile); only ``--docker.host=""``
        switches the source off (cgroup-only mode)."""
        if self.socket_path is None:
            self.enabled = False
            return False
        self.enabled = True
        if os.path.exists(self.socket_path):
            return True
        self.up = False
        self.errors_total += 1
        self._log.fail(
            f"no socket at {self.socket_path}: containers are named by short ID until it "
            'appears (--docker.host="" switches the Docker source off)'
        )
        return False

    def _landed(self, cid: str, task: asyncio.Task[_Entry | None]) -> None:
        if self._inflight.get(cid) is task:
            del self._inflight[cid]

    def _ttl(self, entry: _Entry) -> float:
        return self.found_ttl if entry.container is not None else self.vanished_ttl

    def _sweep(self, now: float, keep: set[str]) -> None:
        stale = [
            cid
            for cid, entry in self._cache.items()
            if cid not in keep and now - entry.fetched_at >= 2 * self._ttl(entry)
        ]
        for cid in stale:
            del self._cache[cid]

    def _store(self, cid: str, container: DockerContainer | None) -> _Entry:
        entry = _Entry(container, self._clock())
        if self.cache_size > 0:
            self._cache[cid] = entry
            self._cache.move_to_end(cid)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return entry

    def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            assert self.socket_path is not None
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_path, limit=self._max_concurrency),
                auto_decompress=True,
            )
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._max_concurrency)
        return self._session

    def _failed(self, exc: DockerError) -> None:
        self.errors_total += 1
        self.up = False
        self._log.fail(f"{self.host}: {exc}")

    def _worked(self) -> None:
        self.up = True
        self._last_contact = self._clock()
        self._log.ok()

    async def _get(self, path: str) -> tuple[int, Mapping[str, str], bytes]:
        """One bounded GET over the socket: (status, headers, body)."""
        session = self._session_get()
        assert self._semaphore is not None
        async with self._semaphore:
            self.requests_total += 1
            try:
                async with session.get(
                    _BASE_URL + path,
                    headers={"Accept": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                    allow_redirects=False,
                ) as resp:
                    body = await read_body(resp.content, self.max_bytes)
                    if body is None:
                        raise DockerError("too_large", f"{path}: over {self.max_bytes} bytes")
                    return resp.status, resp.headers, body
            except DockerError:
                raise
            except asyncio.TimeoutError as exc:
                raise DockerError("timeout", f"{path}: no answer within {self.timeout}s") from exc
            except aiohttp.ClientPayloadError as exc:
                raise DockerError("bad_body", f"{path}: {exc}") from exc
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                raise DockerError("connect", f"{path}: {exc or type(exc).__name__}") from exc

    async def _ping_task(self) -> None:
        try:
            await self._negotiate(force=True)
        except DockerError as exc:
            self._failed(exc)

    async def _negotiate(self, *, force: bool = False) -> str:
        """The version prefix for request paths, asking ``/_ping`` once (shared by callers)."""
        if self.api_version is not None and not force:
            return self.api_version
        if self._negotiation is None or self._negotiation.done():
            self._negotiation = asyncio.create_task(self._ask_version())
        await asyncio.shield(self._negotiation)
        if self.api_version is None:
            raise DockerError("negotiate", "no API version agreed")
        return self.api_version

    async def _ask_version(self) -> None:
        # /_ping is unversioned by design: it is how clients learn the daemon's version.
        status, headers, body = await self._get("/_ping")
        if status != 200:
            raise DockerError("http_status", f"/_ping: {status} {parse_error_message(body)}")
        self.api_version = _choose_version(parse_api_version(headers.get("Api-Version")))
        self._worked()

    async def _fetch(self, cid: str) -> _Entry | None:
        """Inspect one container and store the answer; None on failure (counted, not raised)."""
        try:
            version = await self._negotiate()
            prefix = f"/v{version}" if version else ""
            status, _headers, body = await self._get(f"{prefix}/containers/{cid}/json")
            if status == 200:
                try:
                    container = parse_inspect_body(body, cid)
                except ValueError as exc:
                    raise DockerError("bad_body", str(exc)) from exc
                self._worked()
                return self._store(cid, container)
            message = parse_error_message(body)
            if status == 404 and _NO_SUCH_CONTAINER.search(message):
                self._worked()
                return self._store(cid, None)
            if status == 400 and _VERSION_REFUSED.search(message):
                # The daemon was upgraded (or downgraded) under us: agree again next time.
                self.api_version = None
            raise DockerError("http_status", f"inspect {short_id(cid)}: {status} {message}")
        except DockerError as exc:
            self._failed(exc)
            return None
