"""The upstream fetch against real HTTP servers misbehaving in the ways exporters do, and the
scrape pipeline's answers while it does."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from devkit.upstream import Handler, HandlerServers
from enricher.app import make_app
from enricher.pipeline import Scraper
from enricher.upstream import UpstreamError, fetch_upstream, url_for_pod_ip
from tests.scraping import PER_SCRAPE, NoProcs

GOOD = '# HELP up_like A gauge.\n# TYPE up_like gauge\nup_like{UUID="GPU-1"} 1\n'


@pytest.fixture
async def serve() -> AsyncIterator[HandlerServers]:
    servers = HandlerServers()
    yield servers
    await servers.close()


async def _fetch(url: str, **kw: Any) -> str:
    async with aiohttp.ClientSession() as session:
        return await fetch_upstream(
            session, url, timeout=kw.get("timeout", 2.0), max_bytes=kw.get("max_bytes", 1 << 20)
        )


async def test_plain_and_gzip(serve: Callable[[Handler], Awaitable[str]]) -> None:
    seen: list[str] = []

    async def h(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(
            body=gzip.compress(GOOD.encode()),
            content_type="text/plain",
            headers={"Content-Encoding": "gzip"},
        )

    assert await _fetch(await serve(h)) == GOOD
    assert "gzip" in seen[0]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        pytest.param("status500", "http_status", id="http-500"),
        pytest.param("html", "content_type", id="wrong-content-type"),
        pytest.param("slow", "timeout", id="stalled-past-timeout"),
        pytest.param("big", "too_large", id="over-size-limit"),
        pytest.param("bomb", "too_large", id="gzip-bomb"),
        pytest.param("cut", "bad_body", id="body-cut-mid-line"),
        pytest.param("redirect", "http_status", id="redirect-not-followed"),
    ],
)
async def test_upstream_faults(
    serve: Callable[[Handler], Awaitable[str]], name: str, reason: str
) -> None:
    # 64 MiB of zeros in about 64 KiB: the size limit applies after decompression.
    bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9) if name == "bomb" else b""

    async def h(request: web.Request) -> web.StreamResponse:
        if name == "status500":
            return web.Response(status=500, text="oops")
        if name == "html":
            return web.Response(text="<html>", content_type="text/html")
        if name == "slow":
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            await resp.write(b"up_like 1\n")
            await asyncio.sleep(5)
            return resp
        if name == "big":
            return web.Response(text="x 1\n" * 100_000, content_type="text/plain")
        if name == "bomb":
            return web.Response(
                body=bomb,
                content_type="text/plain",
                headers={"Content-Encoding": "gzip"},
            )
        if name == "cut":
            resp = web.StreamResponse(
                headers={"Content-Type": "text/plain", "Content-Length": "1000"}
            )
            await resp.prepare(request)
            await resp.write(b'up_like{UUID="GPU-1"')
            assert request.transport is not None
            request.transport.close()
            return resp
        raise web.HTTPFound("/elsewhere")

    with pytest.raises(UpstreamError) as info:
        await _fetch(await serve(h), timeout=0.5, max_bytes=64 * 1024)
    assert info.value.reason == reason


@pytest.mark.parametrize("framing", ["content-length", "chunked", "gzip"])
@pytest.mark.parametrize("extra", [0, 1], ids=["at-limit", "one-over"])
async def test_size_limit_is_exact_however_the_body_is_framed(
    serve: Callable[[Handler], Awaitable[str]], framing: str, extra: int
) -> None:
    """A body of a known length is read at once (checked against the limit before it comes),
    one of unknown length chunk by chunk; gzip's is counted after decompression. Either way a
    body of exactly ``max_bytes`` passes and one byte more is too large."""
    limit = 64 * 1024
    body = (b"x 1\n" * limit)[: limit + extra]

    async def h(request: web.Request) -> web.StreamResponse:
        if framing == "content-length":
            return web.Response(body=body, content_type="text/plain")
        if framing == "gzip":
            return web.Response(
                body=gzip.compress(body),
                content_type="text/plain",
                headers={"Content-Encoding": "gzip"},
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        for at in range(0, len(body), 10_000):
            await resp.write(body[at : at + 10_000])
        await resp.write_eof()
        return resp

    url = await serve(h)
    if extra:
        with pytest.raises(UpstreamError) as info:
            await _fetch(url, max_bytes=limit)
        assert info.value.reason == "too_large"
    else:
        assert await _fetch(url, max_bytes=limit) == body.decode()


async def test_connection_refused() -> None:
    with pytest.raises(UpstreamError) as info:
        await _fetch("http://127.0.0.1:9/metrics")
    assert info.value.reason == "connect"


@pytest.mark.parametrize(
    ("url", "ip", "want"),
    [
        pytest.param(
            "http://127.0.0.1:9400/metrics", "10.1.2.3", "http://10.1.2.3:9400/metrics", id="v4"
        ),
        pytest.param(
            "http://localhost:9400/metrics", "fd00::1", "http://[fd00::1]:9400/metrics", id="v6"
        ),
        pytest.param(
            "https://x/metrics?a=b", "10.0.0.1", "https://10.0.0.1/metrics?a=b", id="no-port"
        ),
    ],
)
def test_url_for_pod_ip(url: str, ip: str, want: str) -> None:
    assert url_for_pod_ip(url, ip) == want


# --------------------------------------------------------------------------- pipeline


async def _client(url: str) -> TestClient[Any, Any]:
    cfg = replace(PER_SCRAPE, upstream_url=url, upstream_timeout=1.0)
    client = TestClient(
        TestServer(make_app(Scraper(cfg, nvml=None, procfs=NoProcs(), kubernetes=None)))
    )
    await client.start_server()
    return client


def _value(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise KeyError(name)


async def test_concurrent_scrapes_share_one_upstream_fetch(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    """An HA Prometheus pair plus a curl: three scrapes, one upstream request."""
    release = asyncio.Event()
    hits = 0

    async def h(_request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        await release.wait()
        return web.Response(text=GOOD, content_type="text/plain")

    client = await _client(await serve(h))
    try:
        scrapes = [asyncio.create_task(client.get("/metrics")) for _ in range(3)]
        while hits == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        release.set()
        bodies = [await (await s).text() for s in scrapes]
        assert hits == 1
        assert all("up_like" in b for b in bodies)
        text = await (await client.get("/metrics")).text()
        assert hits == 2
        assert _value(text, "dcgm_enricher_shared_scrapes_total") == 2
        assert _value(text, "dcgm_enricher_upstream_requests_total") == 2
    finally:
        await client.close()


async def test_upstream_failure_then_recovery(serve: Callable[[Handler], Awaitable[str]]) -> None:
    broken = True

    async def h(_request: web.Request) -> web.Response:
        if broken:
            return web.Response(status=503)
        return web.Response(text=GOOD, content_type="text/plain")

    client = await _client(await serve(h))
    try:
        resp = await client.get("/metrics")
        assert resp.status == 200
        text = await resp.text()
        assert _value(text, "dcgm_enricher_source_up", source="upstream") == 0
        assert _value(text, "dcgm_enricher_source_errors_total", source="upstream") == 1
        assert _value(text, "dcgm_enricher_source_enabled", source="nvml") == 0
        broken = False
        text = await (await client.get("/metrics")).text()
        assert _value(text, "dcgm_enricher_source_up", source="upstream") == 1
        assert _value(text, "up_like", UUID="GPU-1") == 1
    finally:
        await client.close()


async def test_garbage_upstream_gives_valid_output(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    junk = bytes(range(256)) * 4 + b"\nok_metric 1\n{{{\n# TYPE x nonsense\n"

    async def h(_request: web.Request) -> web.Response:
        return web.Response(body=junk, content_type="text/plain")

    client = await _client(await serve(h))
    try:
        text = await (await client.get("/metrics")).text()
        assert _value(text, "ok_metric") == 1
        assert _value(text, "dcgm_enricher_upstream_invalid_lines") >= 2
    finally:
        await client.close()


async def test_healthz_and_landing() -> None:
    client = await _client("http://127.0.0.1:9/metrics")
    try:
        assert (await (await client.get("/healthz")).text()) == "ok\n"
        page = await (await client.get("/")).text()
        assert "/metrics" in page
        # With nobody scraping, opening the page runs a scrape itself (upstream down here).
        assert "no scrape yet" not in page
        metrics = await (await client.get("/metrics")).text()
        # The page's own read is not a scrape of /metrics: it has its own counter.
        assert _value(metrics, "dcgm_enricher_scrapes_total") == 1
        assert _value(metrics, "dcgm_enricher_node_page_requests_total") == 1
    finally:
        await client.close()


async def test_oversized_request_header_is_refused() -> None:
    from enricher.app import serve as start

    scraper = Scraper(PER_SCRAPE, nvml=None, procfs=NoProcs(), kubernetes=None)
    runner = await start(make_app(scraper), "127.0.0.1:0", max_header_bytes=1024)
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(
                f"http://127.0.0.1:{port}/healthz", headers={"X-Big": "a" * 4096}
            ) as resp:
                assert resp.status in (400, 431)
            async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()


async def test_bytes_sent_are_counted_by_encoding(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    """dcgm_enricher_response_bytes_total: the bytes of each /metrics body as sent, gzip or
    identity by what the scraper accepts, counted on the scrape after it."""

    async def h(_request: web.Request) -> web.Response:
        return web.Response(text=GOOD, content_type="text/plain")

    client = await _client(await serve(h))
    try:
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        first = await plain.read()
        zipped = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert zipped.headers["Content-Encoding"] == "gzip"
        second = await zipped.read()
        text = gzip.decompress(second).decode()
        assert _value(text, "dcgm_enricher_response_bytes_total", encoding="identity") == len(first)
        assert _value(text, "dcgm_enricher_response_bytes_total", encoding="gzip") == 0
        third = await (await client.get("/metrics", headers={"Accept-Encoding": "identity"})).text()
        assert _value(third, "dcgm_enricher_response_bytes_total", encoding="identity") == len(
            first
        )
        assert _value(third, "dcgm_enricher_response_bytes_total", encoding="gzip") == len(second)
    finally:
        await client.close()
