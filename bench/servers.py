"""The benchmark's server processes: upstream, pass-through proxy and the real enricher.

Each runs in its own process (spawned, so nothing is inherited but what is passed), serves
on a free loopback port, sends ``("ready", port)`` on its pipe and runs until it reads
``"stop"``. The upstream also takes ``("epoch", n)``: it switches to the payload of pod
epoch ``n`` (pod labels follow pod churn) and answers ``("epoch", n)`` once it serves it;
``("every", k)``: from then on each client (``?client=NAME``) gets a new collection (new
values) on every ``k``-th of its requests, as a dcgm-exporter serves the same body between
two collections; ``("period", s)``: a new collection every ``s`` seconds of wall time, for
every client. Both are answered with the message. Every body ends with
``bench_collection_timestamp_seconds``, the wall time its collection was made, so a client
can tell how old the values it got are.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
from aiohttp import web

from . import payloads

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Values differ on every request: the upstream cycles through this many collections, more
# than any cache in the enricher could hold, so no scrape is served from a cached body.
VARIANTS = 16


async def _until_stopped(conn: Connection, on_message: Any = None) -> None:
    """Wait for "stop" on ``conn``; hand any other message to ``on_message``."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def readable() -> None:
        while conn.poll():
            try:
                msg = conn.recv()
            except EOFError:
                stopped.set()
                return
            if msg == "stop":
                stopped.set()
            elif on_message is not None:
                on_message(msg)

    loop.add_reader(conn.fileno(), readable)
    try:
        await stopped.wait()
    finally:
        loop.remove_reader(conn.fileno())


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, int(port)


# --------------------------------------------------------------------------- upstream


def run_upstream(
    conn: Connection, shape: str | payloads.Shape, variants: int = VARIANTS, relabel: bool = False
) -> None:
    """A dcgm-exporter stand-in: pre-rendered bodies, a different collection per request
    (cycling through ``variants``; with ``relabel`` each also in a pod epoch of its own, so
    consecutive bodies differ in labels too and every rewrite goes line by line)."""
    asyncio.run(_upstream(conn, shape, variants, relabel))


STAMP = "bench_collection_timestamp_seconds"
_STAMP_HEAD = (
    f"# HELP {STAMP} When the upstream made this collection (Unix time; benchmark only).\n"
    f"# TYPE {STAMP} gauge\n"
)


def stamp_line(when: float) -> bytes:
    return f'{_STAMP_HEAD}{STAMP}{{Hostname="{payloads.HOSTNAME}"}} {when:.3f}\n'.encode()


def collection_time(body: bytes) -> float | None:
    """The ``bench_collection_timestamp_seconds`` value of a served body."""
    at = body.rfind(STAMP.encode() + b"{")
    if at < 0:
        return None
    start = body.index(b"} ", at) + 2
    return float(body[start : body.index(b"\n", start)])


async def _upstream(
    conn: Connection, shape: str | payloads.Shape, variants: int, relabel: bool
) -> None:
    bodies = [payloads.generate(shape, v, v if relabel else 0).encode() for v in range(variants)]
    # client -> (requests so far, variant, collection time) in "every" mode
    clients: dict[str, tuple[int, int, float]] = {}
    rhythm: list[Any] = ["every", 1]
    requests: dict[str, int] = {}  # client -> requests served, for ("requests", 0)

    async def metrics(request: web.Request) -> web.Response:
        who = request.query.get("client", "")
        requests[who] = requests.get(who, 0) + 1
        if rhythm[0] == "period":
            index = int(time.time() / rhythm[1])
            variant, made = index % len(bodies), index * rhythm[1]
        else:
            client = request.query.get("client", "")
            n, variant, made = clients.get(client, (0, -1, 0.0))
            if n % rhythm[1] == 0:
                variant, made = (variant + 1) % len(bodies), time.time()
            clients[client] = (n + 1, variant, made)
        body = bodies[variant] + stamp_line(made)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def on_message(msg: Any) -> None:
        if isinstance(msg, tuple) and msg[0] == "epoch":
            epoch = int(msg[1])
            bodies[:] = [payloads.generate(shape, v, epoch).encode() for v in range(variants)]
            conn.send(("epoch", epoch))
        elif isinstance(msg, tuple) and msg[0] == "requests":
            conn.send(("requests", dict(requests)))
        elif isinstance(msg, tuple) and msg[0] in ("every", "period"):
            rhythm[:] = [msg[0], max(1, int(msg[1])) if msg[0] == "every" else float(msg[1])]
            clients.clear()
            conn.send(msg)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner, port = await _serve(app)
    conn.send(("ready", port))
    await _until_stopped(conn, on_message)
    await runner.cleanup()


# --------------------------------------------------------------------------- proxy


def run_proxy(conn: Connection, upstream_url: str) -> None:
    """A plain aiohttp pass-through proxy: fetch the upstream body, return it unchanged."""
    asyncio.run(_proxy(conn, upstream_url))


async def _proxy(conn: Connection, upstream_url: str) -> None:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4))

    async def metrics(_request: web.Request) -> web.Response:
        async with session.get(upstream_url) as resp:
            body = await resp.read()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner, port = await _serve(app)
    conn.send(("ready", port))
    await _until_stopped(conn)
    await runner.cleanup()
    await session.close()


# --------------------------------------------------------------------------- enricher


@dataclass(frozen=True)
class EnricherSpec:
    upstream_url: str
    procfs: str
    nvml_library: str
    nvml_state: str
    kubeconfig: str
    node_name: str
    # --collect.interval and --upstream.follow-step; None: the enricher's defaults (the
    # upstream followed, the node side read with each of its collections).
    collect_interval: float | None = None
    follow_step: float | None = None
    kube: bool = True  # False: no pod watch (and no kubernetes client in the process)
    # The kubelet's PodResources socket ("": the source off, as on a machine without one).
    kubelet_socket: str = ""
    # True: every rewrite on the event loop, as before the rewrite worker (for comparison).
    rewrite_on_loop: bool = False
    # True: count where the process's CPU goes (bench.breakdown; an instrumented run).
    breakdown: bool = False
    # False: no timings of the fetch, the rewrite and the scrape in the process (the memory
    # part: their bounded lists, filling over its first 4,096 scrapes, would count as growth).
    timings: bool = True


# Installed by the test extras only, and imported by libraries the enricher uses when present
# (kubernetes.dynamic imports kubernetes_validate, ~3 MiB with jsonschema): hidden from the
# enricher's process, which should hold what an installed enricher holds (the image has none
# of these).
TEST_ONLY_MODULES = ("kubernetes_validate", "jsonschema")


def use_fake_nvml(state_path: str) -> None:
    """Point the fake libnvidia-ml at a state file, re-read only when the file changed: real
    NVML parses no text, so what the benchmark times is the enricher's work
    (devkit/fakenvml/fake_nvml.c)."""
    os.environ["FAKE_NVML_STATE"] = state_path
    os.environ["FAKE_NVML_RELOAD"] = "changed"


def _hide_test_only_modules() -> None:
    for name in TEST_ONLY_MODULES:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError


def run_import_floor(conn: Connection, kube: bool, kubelet: bool) -> None:
    """The floor under the enricher's RSS: a process that imports what ``serve`` imports (the
    pod watch's kubernetes client with ``kube``, the kubelet source's gRPC stubs with
    ``kubelet``), and builds, reads and serves nothing."""
    _hide_test_only_modules()
    modules = ["enricher.app", "enricher.commands", "enricher.nvml", "enricher.procfs"]
    if kube:
        modules.append("enricher.kube")
    if kubelet:
        modules += ["grpc", "enricher.proto.api_pb2_grpc"]
    for name in modules:
        importlib.import_module(name)
    if kube:
        import kubernetes.client

        kubernetes.client.ApiClient(kubernetes.client.Configuration()).close()  # type: ignore[no-untyped-call]
    conn.send(("ready", 0))
    while conn.recv() != "stop":
        pass


def run_enricher(conn: Connection, spec: EnricherSpec) -> None:
    """The real enricher, wired as ``dcgm-enricher serve`` wires it (commands.run_server)."""
    _hide_test_only_modules()
    logging.basicConfig(level=logging.WARNING)
    use_fake_nvml(spec.nvml_state)
    asyncio.run(_enricher(conn, spec))


class _Timings:
    """Where a scrape's time goes, measured inside the enricher's process: the upstream fetch,
    the rewrite and the whole scrape (the rest of the request is aiohttp's serving)."""

    # The newest this many of each: the memory run scrapes 10,000 times without reading them,
    # and benchmark lists growing inside the enricher's process would count as its growth.
    KEEP = 4096

    def __init__(self) -> None:
        self.fetch: deque[float] = deque(maxlen=self.KEEP)
        self.rewrite: deque[float] = deque(maxlen=self.KEEP)
        self.scrape: deque[float] = deque(maxlen=self.KEEP)

    def install(self, app_module: Any, scraper: Any) -> None:
        import enricher.upstream as upstream_module  # UpstreamSource.read calls it from there

        timings = self
        fetch = upstream_module.fetch_upstream
        rewrite = scraper.assembler.rewriter.rewrite
        scrape = scraper.scrape

        async def timed_fetch(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fetch(*args, **kwargs)
            finally:
                timings.fetch.append(time.perf_counter() - t0)

        def timed_rewrite(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return rewrite(*args)
            finally:
                timings.rewrite.append(time.perf_counter() - t0)

        async def timed_scrape() -> Any:
            t0 = time.perf_counter()
            try:
                return await scrape()
            finally:
                timings.scrape.append(time.perf_counter() - t0)

        upstream_module.fetch_upstream = timed_fetch  # type: ignore[assignment]
        scraper.assembler.rewriter.rewrite = timed_rewrite
        scraper.scrape = timed_scrape

    def medians_ms(self) -> dict[str, float]:
        out = {}
        for name in ("fetch", "rewrite", "scrape"):
            values = sorted(getattr(self, name))
            if values:
                out[name] = round(values[len(values) // 2] * 1000.0, 4)
        return out

    def clear(self) -> None:
        self.fetch.clear()
        self.rewrite.clear()
        self.scrape.clear()


async def _enricher(conn: Connection, spec: EnricherSpec) -> None:
    import enricher.pipeline as pipeline_module
    from enricher.app import make_app, serve
    from enricher.config import Config
    from enricher.pipeline import Scraper
    from enricher.procfs import ProcfsSource
    from enricher.sourcetable import (
        make_nvml_source,
        make_podresources_source,
        start_kubernetes_source,
    )

    settings: dict[str, Any] = {
        "listen_address": "127.0.0.1:0",
        "upstream_url": spec.upstream_url,
        "procfs": spec.procfs,
        "nvml_library": spec.nvml_library,
        "kube_node_name": spec.node_name,
        "kube_kubeconfig": spec.kubeconfig,
        "kube_enabled": spec.kube,
    }
    fields = Config.__dataclass_fields__
    if "kubelet_pod_resources_socket" in fields:
        settings["kubelet_pod_resources_socket"] = spec.kubelet_socket
    if spec.collect_interval is not None:
        settings["collect_interval"] = spec.collect_interval
    if spec.follow_step is not None:
        settings["upstream_follow_step"] = spec.follow_step
    config = replace(Config(), **settings)
    if spec.rewrite_on_loop:
        pipeline_module.REWRITE_INLINE_MAX_CHARS = sys.maxsize  # type: ignore[misc]
    pods = start_kubernetes_source(config)
    if spec.kube and (pods is None or not pods.synced.wait(30)):
        raise RuntimeError("the pod watch did not sync with the API stand-in")
    gpu = make_nvml_source(config)
    scraper = Scraper(
        config,
        nvml=gpu,
        procfs=ProcfsSource(config.procfs),
        kubernetes=pods,
        podresources=make_podresources_source(config),
    )
    cpu: Any = None
    if spec.breakdown:  # before the timings, which keep the rewrite's bound method
        from .breakdown import CpuBreakdown

        cpu = CpuBreakdown()
        cpu.install()
    timings = _Timings()
    if spec.timings:
        timings.install(pipeline_module, scraper)
    runner = await serve(make_app(scraper), config.listen_address)
    port = int(runner.addresses[0][1])
    conn.send(("ready", port))

    def on_message(msg: Any) -> None:
        if msg == "modules":  # what this process loaded beyond the enricher's own needs
            loaded = {m.split(".")[0] for m, mod in sys.modules.items() if mod is not None}
            conn.send(("modules", sorted(loaded)))
        elif msg == "timings":
            conn.send(("timings", timings.medians_ms()))
        elif msg == "clear-timings":
            timings.clear()
            if cpu is not None:
                cpu.clear()
        elif msg == "breakdown":
            conn.send(("breakdown", cpu.report() if cpu is not None else None))
        elif msg == "stats":
            rw = scraper.assembler.rewriter
            conn.send(
                (
                    "stats",
                    {
                        "template": rw.fast_rewrites,
                        "repeated": rw.repeated_rewrites,
                        "line_by_line": rw.slow_rewrites,
                    },
                )
            )

    try:
        await _until_stopped(conn, on_message)
    finally:
        await runner.cleanup()
        if pods is not None:
            pods.stop()
        if gpu is not None:
            gpu.close()
