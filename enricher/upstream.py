"""The upstream source: dcgm-exporter's /metrics over HTTP, bounded in time and size."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from .httpread import read_body
from .sources import ReadResult

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_ACCEPTED_TYPES = ("text/plain", "")


class UpstreamError(Exception):
    """The upstream could not be read; ``reason`` is short and stable (for logs and tests)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def discovery_target(selector: str, namespace: str, node: str) -> str:
    """What --upstream.discover-pod looks for, in words (pure): for the logs."""
    return f"pod labelled {selector} in namespace {namespace} on node {node or '(none given)'}"


def url_for_pod_ip(url: str, pod_ip: str) -> str:
    """Replace the host of ``url`` by ``pod_ip``, keeping scheme, port and path (pure)."""
    parts = urlsplit(url)
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def decode_body(body: bytes) -> str:
    """Exposition is UTF-8. Undecodable bytes become lone surrogates (``surrogateescape``),
    which the rewrite treats as invalid: their lines are dropped and counted, never served
    with a replacement character in place of what the upstream sent."""
    return body.decode("utf-8", errors="surrogateescape")


async def fetch_upstream(
    session: aiohttp.ClientSession, url: str, *, timeout: float, max_bytes: int
) -> str:
    """GET ``url`` and return the body as text.

    The time limit covers the whole exchange; the size limit applies to the decompressed body,
    so a gzip bomb stops at ``max_bytes``. Raises UpstreamError on any failure.
    """
    try:
        async with session.get(
            url,
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"},
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as resp:
            if resp.status != 200:
                raise UpstreamError("http_status", str(resp.status))
            ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if ctype not in _ACCEPTED_TYPES:
                raise UpstreamError("content_type", ctype)
            if resp.content_length is not None and "Content-Encoding" not in resp.headers:
                # The size is known before the body comes (and the body cannot outgrow it):
                # read it at once, as a plain proxy would.
                if resp.content_length > max_bytes:
                    raise UpstreamError("too_large", f"over {max_bytes} bytes")
                return decode_body(await resp.read())
            body = await read_body(resp.content, max_bytes)
            if body is None:
                raise UpstreamError("too_large", f"over {max_bytes} bytes")
            return decode_body(body)
    except UpstreamError:
        raise
    except asyncio.TimeoutError as exc:
        raise UpstreamError("timeout", f"no complete answer within {timeout}s") from exc
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamError("bad_body", str(exc)) from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise UpstreamError("connect", str(exc) or type(exc).__name__) from exc


class UpstreamSource:
    """The upstream as a Source: one GET of ``url()`` per read (None: no upstream found yet,
    a failure), over one connection pool."""

    name = "upstream"
    enabled = True

    def __init__(
        self,
        url: Callable[[], str | None],
        *,
        timeout: float,
        max_bytes: int,
        missing: str = "no matching dcgm-exporter pod on this node",
    ) -> None:
        self.url = url
        # Why ``url()`` is None, for the log: what discovery looked for, and where.
        self.missing = missing
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.errors_total = 0
        self.requests_total = 0
        self._session: aiohttp.ClientSession | None = None

    async def read(self) -> ReadResult[str | None]:
        """The body, or None and why not (logged by the caller's episode log)."""
        url = self.url()
        try:
            if url is None:
                raise UpstreamError("no_upstream_pod", self.missing)
            self.requests_total += 1
            text = await fetch_upstream(
                self._session_get(), url, timeout=self.timeout, max_bytes=self.max_bytes
            )
        except UpstreamError as exc:
            self.errors_total += 1
            return ReadResult(None, False, f"{url}: {exc}" if url is not None else str(exc))
        return ReadResult(text)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=True,
                connector=aiohttp.TCPConnector(limit=4),
            )
        return self._session
