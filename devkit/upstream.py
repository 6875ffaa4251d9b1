"""dcgm-exporter stand-ins: an aiohttp server on loopback that plays the upstream's failures
(:class:`Upstream`), servers that each answer with a test's own handler (:class:`HandlerServers`),
and a threaded text server for a process outside the caller's event loop (:class:`TextServer`:
a container, Prometheus, the enricher started as a command, the fleet's targets)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from enricher.fieldtable import table

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _bomb() -> bytes:
    cached: bytes | None = getattr(_bomb, "cached", None)
    if cached is None:
        # 64 MiB of zeros in about 64 KiB: the size limit applies after decompression.
        cached = gzip.compress(b"0" * (64 << 20), compresslevel=9)
        _bomb.cached = cached  # type: ignore[attr-defined]
    return cached


class Upstream:
    """dcgm-exporter over loopback: serves ``body`` (a text, or a function called on each
    request), or plays one failure at a time (:meth:`set`: refused, stalled, http-500, cut,
    garbage, too-large, gzip-bomb, html), until :meth:`clear`.

    ``max_bytes`` sizes the "too-large" answer: twice that much padding."""

    def __init__(self, body: str | Callable[[], str], *, max_bytes: int = 256 * 1024) -> None:
        self.body = body
        self.max_bytes = max_bytes
        self.mode = "ok"
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def set(self, mode: str) -> None:
        self._release = asyncio.Event()
        if mode == "refused":
            await self.stop()
        self.mode = mode

    async def clear(self) -> None:
        self._release.set()
        if self._runner is None:
            await self.start()  # the same port again
        self.mode = "ok"

    def text(self) -> str:
        return self.body() if callable(self.body) else self.body

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        text = self.text()
        mode = self.mode
        if mode == "http-500":
            return web.Response(status=500, text="internal error\n")
        if mode == "html":
            return web.Response(text="<html>login</html>", content_type="text/html")
        if mode == "too-large":
            pad = "# padding " + "x" * 100 + "\n"
            return web.Response(text=text + pad * (2 * self.max_bytes // len(pad)))
        if mode == "gzip-bomb":
            return web.Response(
                body=_bomb(), content_type="text/plain", headers={"Content-Encoding": "gzip"}
            )
        if mode == "garbage":
            util = table().names("gpu_util")[-1].encode()  # a field as 4.8 names it
            junk = bytes(range(256)) * 3 + b"\n{{{\n" + util + b"{UUID= 1\n...\n"
            return web.Response(body=junk + text.encode(), content_type="text/plain")
        if mode in ("stalled", "cut"):
            body = text.encode()
            resp = web.StreamResponse(
                headers={"Content-Type": "text/plain", "Content-Length": str(len(body))}
            )
            await resp.prepare(request)
            await resp.write(body[: len(body) // 2])  # ends in the middle of a line
            if mode == "cut":
                assert request.transport is not None
                request.transport.close()
                return resp
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._release.wait(), 30)
            return resp
        return web.Response(text=text, content_type="text/plain")


class TextServer:
    """An HTTP server on 127.0.0.1 in a thread, for a process outside the test's event loop
    (a container, Prometheus, the enricher started as a command): ``GET`` answers
    ``body(path)`` as Prometheus text. ``port`` is where it listens."""

    def __init__(self, body: Callable[[str], bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                data = body(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(ConnectionError):
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port: int = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HandlerServers:
    """aiohttp servers on loopback, each answering GET ``path`` with the handler it was started
    with (an upstream that misbehaves a test's own way): calling it starts one and returns its
    URL; :meth:`close` stops them all."""

    def __init__(self, path: str = "/metrics") -> None:
        self.path = path
        self.servers: list[TestServer] = []

    async def __call__(self, handler: Handler) -> str:
        app = web.Application()
        app.router.add_get(self.path, handler)
        server = TestServer(app)
        await server.start_server()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.port}{self.path}"

    async def close(self) -> None:
        for s in self.servers:
            await s.close()
