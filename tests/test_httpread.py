"""httpread.read_body, the bounded body read of the upstream and Docker sources, against a real
aiohttp server: the bound is exact however the body is framed, and a body without end stops
at it."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from devkit.upstream import Handler, HandlerServers
from enricher.httpread import CHUNK_BYTES, read_body

LIMIT = 3 * CHUNK_BYTES + 17  # not a whole number of chunks


@pytest.fixture
async def serve() -> AsyncIterator[HandlerServers]:
    servers = HandlerServers("/")
    yield servers
    await servers.close()


async def _read(url: str, max_bytes: int = LIMIT) -> bytes | None:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await read_body(resp.content, max_bytes)


@pytest.mark.parametrize("framing", ["content-length", "chunked", "gzip"])
@pytest.mark.parametrize(
    ("size", "read"),
    [
        pytest.param(0, True, id="empty"),
        pytest.param(LIMIT, True, id="at-the-bound"),
        pytest.param(LIMIT + 1, False, id="one-byte-over"),
        pytest.param(10 * LIMIT, False, id="far-over"),
    ],
)
async def test_the_bound_is_exact_however_the_body_is_framed(
    serve: Callable[[Handler], Awaitable[str]], framing: str, size: int, read: bool
) -> None:
    body = bytes(i % 251 for i in range(size))

    async def h(request: web.Request) -> web.StreamResponse:
        if framing == "content-length":
            return web.Response(body=body)
        if framing == "gzip":
            return web.Response(body=gzip.compress(body), headers={"Content-Encoding": "gzip"})
        resp = web.StreamResponse()
        await resp.prepare(request)
        for at in range(0, len(body), 10_000):
            await resp.write(body[at : at + 10_000])
        await resp.write_eof()
        return resp

    assert await _read(await serve(h)) == (body if read else None)


async def test_a_body_without_end_stops_at_the_bound(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    """The server writes for as long as anyone reads; the read gives up past the bound."""
    written = 0

    async def h(request: web.Request) -> web.StreamResponse:
        nonlocal written
        resp = web.StreamResponse()
        await resp.prepare(request)
        with pytest.raises((ConnectionError, asyncio.CancelledError)):
            while True:
                await resp.write(b"x" * 4096)
                written += 4096
        return resp

    assert await asyncio.wait_for(_read(await serve(h)), 10) is None
    assert written > LIMIT
