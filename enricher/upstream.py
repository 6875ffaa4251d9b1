"""The upstream source: dcgm-exporter's /metrics over HTTP, bounded in time and size."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import aiohttp

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_ACCEPTED_TYPES = ("text/plain", "")


class UpstreamError(Exception):
    """The upstream could not be read; ``reason`` is short and stable (for logs and tests)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


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
            chunks: list[bytes] = []
            size = 0
            while True:
                chunk = await resp.content.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise UpstreamError("too_large", f"over {max_bytes} bytes")
                chunks.append(chunk)
            return decode_body(b"".join(chunks))
    except UpstreamError:
        raise
    except asyncio.TimeoutError as exc:
        raise UpstreamError("timeout", f"no complete answer within {timeout}s") from exc
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamError("bad_body", str(exc)) from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise UpstreamError("connect", str(exc) or type(exc).__name__) from exc
