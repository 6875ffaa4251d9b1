"""The event-loop part: /healthz latency while the enricher rewrites a body near
--upstream.max-bytes, against /healthz of the same process when idle (``bench_loop``)."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace
from typing import Any

import aiohttp

from . import payloads
from .children import start
from .modes import Mode, ms, pct

HEALTHZ_EVERY = 0.005  # seconds between two /healthz requests (one at a time)


async def _healthz_while(base: str, scrapes: int) -> dict[str, Any]:
    """/healthz asked back to back (every HEALTHZ_EVERY) while nothing else runs, then while
    one client scrapes /metrics ``scrapes`` times in a row."""
    idle: list[float] = []
    busy: list[float] = []
    scrape_times: list[float] = []
    stop = asyncio.Event()

    async def ping(session: aiohttp.ClientSession, into: list[float]) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with session.get(base + "/healthz") as resp:
                await resp.read()
            into.append(time.perf_counter() - t0)
            await asyncio.sleep(HEALTHZ_EVERY)

    async with aiohttp.ClientSession() as health, aiohttp.ClientSession() as scraper:
        for _ in range(2):  # warm up: the first rewrite (parse caches, template)
            async with scraper.get(base + "/metrics") as resp:
                size = len(await resp.read())
        pinger = asyncio.create_task(ping(health, idle))
        await asyncio.sleep(1.0)
        stop.set()
        await pinger
        stop.clear()
        pinger = asyncio.create_task(ping(health, busy))
        for _ in range(scrapes):
            t0 = time.perf_counter()
            async with scraper.get(base + "/metrics") as resp:
                await resp.read()
            scrape_times.append(time.perf_counter() - t0)
        stop.set()
        await pinger

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "n": len(values),
            "p50_ms": ms(statistics.median(values)),
            "p99_ms": ms(pct(values, 0.99)),
            "max_ms": ms(max(values)),
        }

    return {
        "body_mib": round(size / 2**20, 2),
        "idle": stats(idle),
        "busy": stats(busy),
        "scrape_p50_ms": ms(statistics.median(scrape_times)),
    }


def bench_loop(mode: Mode, spec: Any) -> dict[str, Any]:
    """/healthz latency of an enricher rewriting a body near --upstream.max-bytes on every
    scrape (--upstream.follow-step=0): bodies that differ in values only (the template path),
    then bodies that differ in labels too (line by line, the slow path). Each as shipped
    (large rewrites in the rewrite worker) and with every rewrite on the event loop (the
    design before it), one after the other in this run."""
    from . import servers

    out: dict[str, Any] = {"healthz_every_ms": HEALTHZ_EVERY * 1000, "shape": mode.loop_shape}
    for kind, relabel in (("values", False), ("labels", True)):
        shape = payloads.MAX32 if mode.loop_shape == "max32" else payloads.SHAPES[mode.loop_shape]
        upstream = start(servers.run_upstream, shape, 2, relabel)
        try:
            for design, on_loop in (("worker", False), ("on_loop", True)):
                enricher = start(
                    servers.run_enricher,
                    replace(
                        spec,
                        upstream_url=upstream.url,
                        follow_step=0.0,
                        kube=False,
                        rewrite_on_loop=on_loop,
                    ),
                )
                try:
                    base = enricher.url.removesuffix("/metrics")
                    row = asyncio.run(_healthz_while(base, mode.loop_scrapes))
                    row["rewrites"] = enricher.ask("stats")
                    row["inside_ms"] = enricher.ask("timings")
                    out[f"{kind}_{design}"] = row
                finally:
                    enricher.stop()
        finally:
            upstream.stop()
    for kind in ("values", "labels"):
        out[f"{kind}_max_ratio"] = round(
            out[f"{kind}_worker"]["busy"]["max_ms"] / out[f"{kind}_on_loop"]["busy"]["max_ms"], 3
        )
    return out
