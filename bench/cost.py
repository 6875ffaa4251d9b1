"""The cost part: the shipped app and a pass-through proxy as separate processes at the same
time, the same gzip scrapes on an upstream collecting every 2 s: CPU seconds of each,
upstream requests per collection, bytes on the wire (``bench_cost``)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp

from .children import Child, start
from .modes import COST_PERIOD, COST_SCRAPE_EVERY, COST_SCRAPERS, Mode


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (its threads included, living or gone), from /proc/<pid>/stat:
    in clock ticks (10 ms)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu_ns(pid: int) -> dict[int, int]:
    """Each living thread of ``pid``: the nanoseconds it ran, from /proc/<pid>/task/*/schedstat
    (the scheduler's own count, not rounded to ticks)."""
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return out


def _cpu_between(
    before: tuple[float, dict[int, int]], after: tuple[float, dict[int, int]]
) -> tuple[float, str]:
    """CPU seconds between two readings (``_cpu_seconds``, ``_thread_cpu_ns``) and how they
    were counted: the threads' nanoseconds when the same threads ran from start to end, else
    the ticks (a thread that ended took its nanoseconds with it; the ticks keep them)."""
    if before[1].keys() == after[1].keys():
        return sum(after[1][t] - before[1][t] for t in after[1]) / 1e9, "schedstat"
    return after[0] - before[0], "ticks"


def _cpu_reading(pid: int) -> tuple[float, dict[int, int]]:
    return _cpu_seconds(pid), _thread_cpu_ns(pid)


async def _cost_scrapes(
    urls: dict[str, str], window: float, on_start: Callable[[], None]
) -> dict[str, dict[str, Any]]:
    """COST_SCRAPERS scrapers per target, each asking every COST_SCRAPE_EVERY seconds with
    Prometheus's Accept-Encoding: gzip, for ``window`` seconds, all at the same time (so the
    machine's noise hits every target alike). Bytes as they came over the wire."""
    import gzip

    from .servers import collection_time

    out: dict[str, dict[str, Any]] = {
        name: {"scrapes": 0, "wire_bytes": 0, "body_bytes": 0, "gzip": 0, "ages": []}
        for name in urls
    }
    headers = {"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        deadline = [0.0]

        async def scraper(name: str, url: str, offset: float) -> None:
            await asyncio.sleep(offset)
            row = out[name]
            while time.monotonic() < deadline[0]:
                t0 = time.monotonic()
                async with session.get(url, headers=headers) as resp:
                    data = await resp.read()
                    zipped = resp.headers.get("Content-Encoding") == "gzip"
                body = gzip.decompress(data) if zipped else data
                made = collection_time(body)
                row["scrapes"] += 1
                row["wire_bytes"] += len(data)
                row["body_bytes"] += len(body)
                row["gzip"] += zipped
                if made is not None:
                    row["ages"].append(time.time() - made)
                await asyncio.sleep(max(0.0, COST_SCRAPE_EVERY - (time.monotonic() - t0)))

        on_start()
        deadline[0] = time.monotonic() + window
        # The scrapers of both targets interleaved over the second.
        step = COST_SCRAPE_EVERY / (COST_SCRAPERS * len(urls))
        tasks = [
            scraper(name, url, step * (i * len(urls) + j))
            for i in range(COST_SCRAPERS)
            for j, (name, url) in enumerate(urls.items())
        ]
        await asyncio.gather(*tasks)
    return out


def bench_cost(mode: Mode, spec: Any, *, breakdown: bool = False) -> dict[str, Any]:
    """What the enricher costs the node, next to a plain pass-through proxy serving the same
    scrapes: CPU seconds of each process, requests to the upstream per collection, bytes on
    the wire. The shipped app (its defaults, as ``dcgm-enricher serve`` runs it) and the
    proxy run as separate processes at the same time against one upstream that collects every
    COST_PERIOD seconds; after ``mode.cost_learn`` seconds (the enricher learns the rhythm),
    a steady window of ``mode.cost_window`` seconds is measured. ``breakdown``: the enricher
    counts where its CPU goes (bench.breakdown), a run whose CPU figures are not the verdict's."""
    from . import servers

    upstream = start(servers.run_upstream, "mig56")
    children: dict[str, Child] = {}
    try:
        if upstream.ask(("period", COST_PERIOD)) != COST_PERIOD:
            raise RuntimeError("the upstream did not switch its collection rhythm")
        children["proxy"] = start(servers.run_proxy, f"{upstream.url}?client=proxy")
        children["enricher"] = start(
            servers.run_enricher,
            replace(spec, upstream_url=f"{upstream.url}?client=enricher", breakdown=breakdown),
        )
        urls = {name: child.url for name, child in children.items()}
        # Learning, with the scrapes going on (as on a node).
        asyncio.run(_cost_scrapes(urls, mode.cost_learn, lambda: None))
        before: dict[str, Any] = {}

        def mark() -> None:
            if breakdown:  # count from the window's start
                children["enricher"].conn.send("clear-timings")
            before["cpu"] = {n: _cpu_reading(c.proc.pid) for n, c in children.items()}
            before["requests"] = upstream.ask(("requests", 0)) or {}
            before["t"] = time.time()

        rows = asyncio.run(_cost_scrapes(urls, mode.cost_window, mark))
        cpu = {
            n: _cpu_between(before["cpu"][n], _cpu_reading(c.proc.pid)) for n, c in children.items()
        }
        requests = upstream.ask(("requests", 0)) or {}
        elapsed = time.time() - before["t"]

        async def identity_size() -> int:
            async with aiohttp.ClientSession(auto_decompress=False) as session:
                url = children["enricher"].url
                async with session.get(url, headers={"Accept-Encoding": "identity"}) as resp:
                    return len(await resp.read())

        where = children["enricher"].ask("breakdown") if breakdown else None
        identity = asyncio.run(identity_size())
    finally:
        for child in children.values():
            child.stop()
        upstream.stop()
    collections = elapsed / COST_PERIOD
    out: dict[str, Any] = {
        "period_s": COST_PERIOD,
        "window_s": round(elapsed, 1),
        "learn_s": mode.cost_learn,
        "collections": round(collections, 1),
        "identity_body_bytes": identity,
    }
    for name, row in rows.items():
        ages = row.pop("ages")
        requested = requests.get(name, 0) - before["requests"].get(name, 0)
        out[name] = {
            **row,
            "cpu_s": round(cpu[name][0], 4),
            "cpu_counted_by": cpu[name][1],
            "cpu_ms_per_scrape": round(cpu[name][0] * 1000 / max(1, row["scrapes"]), 3),
            "cpu_ms_per_collection": round(cpu[name][0] * 1000 / collections, 3),
            "upstream_requests": requested,
            "upstream_requests_per_collection": round(requested / collections, 2),
            "wire_bytes_per_scrape": row["wire_bytes"] // max(1, row["scrapes"]),
            "age_max_s": round(max(ages), 4) if ages else None,
        }
    if where is not None:
        out["breakdown_ms_per_collection"] = {
            table: {k: round(v / collections, 3) for k, v in rows.items()}
            for table, rows in where.items()
        }
    enricher, proxy = out["enricher"], out["proxy"]
    out["cpu_ratio"] = round(enricher["cpu_s"] / max(proxy["cpu_s"], 1e-9), 3)
    out["gzip_fraction"] = round(enricher["wire_bytes_per_scrape"] / identity, 4)
    return out
