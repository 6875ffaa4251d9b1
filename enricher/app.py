"""The HTTP side: the aiohttp app (``/metrics``, ``/healthz``, the node page at ``/``), its
handlers and the listen address. The pipeline behind it is ``enricher.pipeline``."""

from __future__ import annotations

import ssl
import time

from aiohttp import web

from .compress import GzipBodies, accepts_gzip
from .landing import render_landing
from .pipeline import Scraper

LANDING_MAX_AGE_SECONDS = 15.0
# Request lines and header fields longer than this are refused (aiohttp's own default).
MAX_REQUEST_HEADER_BYTES = 8190
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def parse_listen_address(addr: str) -> tuple[str | None, int]:
    """``:9401`` -> (None, 9401); ``127.0.0.1:9401``; ``[::1]:9401``; port 0 picks a free one.

    Raises ValueError.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"invalid listen address {addr!r}: want [host]:port")
    host = host.strip("[]")
    return (host or None), int(port)


def make_app(scraper: Scraper) -> web.Application:
    """The aiohttp application: /metrics, /healthz and the landing page. The gzip of each
    collection body is made here, once per body (compress.GzipBodies), and the bytes sent are
    counted here."""
    app = web.Application(client_max_size=1024)
    gzip = GzipBodies(scraper.assembler.worker)
    scraper.on_new_body.append(gzip.prepare)
    counters = scraper.counters

    async def metrics(request: web.Request) -> web.Response:
        result = await scraper.scrape()
        # The body depends on Accept-Encoding: caches must keep the two apart.
        headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            headers["Content-Encoding"] = "gzip"
            body = await gzip.finish(result)
            counters.response_bytes["gzip"] += len(body)
        else:
            body = result.body
            counters.response_bytes["identity"] += len(body)
        return web.Response(body=body, headers=headers)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def landing(_request: web.Request) -> web.Response:
        # Someone looking at the page behind a port-forward may have no Prometheus scraping
        # this node: refresh a view older than the page's own refresh period.
        counters.node_page_requests += 1
        last = scraper.last
        if last is None or time.time() - last.finished_at > LANDING_MAX_AGE_SECONDS:
            await scraper.scrape(counted=False)
        return web.Response(
            text=render_landing(scraper.last, scraper.config), content_type="text/html"
        )

    async def on_startup(_app: web.Application) -> None:
        scraper.start()

    async def on_cleanup(_app: web.Application) -> None:
        await scraper.close()

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", landing)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def serve(
    app: web.Application,
    listen_address: str,
    *,
    max_header_bytes: int = MAX_REQUEST_HEADER_BYTES,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Start serving ``app``; returns the runner (call ``runner.cleanup()`` to stop)."""
    host, port = parse_listen_address(listen_address)
    runner = web.AppRunner(
        app,
        access_log=None,
        max_line_size=max_header_bytes,
        max_field_size=max_header_bytes,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host=host, port=port, ssl_context=ssl_context)
    await site.start()
    return runner
