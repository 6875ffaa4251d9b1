"""The end-to-end part: GET /metrics through the real enricher app next to a plain
pass-through proxy and the upstream itself, one scraper and three concurrent scrapers, in
each upstream rhythm (``run_e2e``); ``scrape`` is every part's timed GET."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace
from typing import Any

import aiohttp

from .children import Child, start
from .modes import COLLECT_INTERVAL, ENRICHERS, RHYTHMS, Mode, ms, pct


async def scrape(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[float, float | None]:
    """(seconds the request took, age in seconds of the upstream collection it carried);
    ``headers`` default to IDENTITY."""
    from .servers import collection_time

    t0 = time.perf_counter()
    # Identity, as the proxy and the upstream serve it: the latency of serving the same bytes
    # (gzip's cost and savings are the cost part's).
    async with session.get(url, headers=IDENTITY if headers is None else headers) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    took = time.perf_counter() - t0
    made = collection_time(body)
    return took, None if made is None else time.time() - made


Samples = dict[str, list[tuple[float, float | None]]]
IDENTITY = {"Accept-Encoding": "identity"}
GZIP = {"Accept-Encoding": "gzip"}


async def _sequential(urls: dict[str, str], n: int) -> Samples:
    got: Samples = {k: [] for k in urls}
    async with aiohttp.ClientSession() as session:
        for url in urls.values():  # warm up: connections, caches, the template
            for _ in range(10):
                await scrape(session, url)
        for _ in range(n):
            for name, url in urls.items():  # round robin: drift hits every target alike
                got[name].append(await scrape(session, url))
    return got


async def _concurrent(url: str, scrapers: int, n: int) -> list[tuple[float, float | None]]:
    got: list[tuple[float, float | None]] = []

    async def scraper() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                got.append(await scrape(session, url))

    await asyncio.gather(*(scraper() for _ in range(scrapers)))
    return got


def _latency(samples: list[tuple[float, float | None]]) -> dict[str, float]:
    times = [t for t, _ in samples]
    out = {"p50_ms": ms(statistics.median(times)), "p99_ms": ms(pct(times, 0.99))}
    ages = [a for _, a in samples if a is not None]
    if ages:
        out["age_p50_s"] = round(statistics.median(ages), 4)
        out["age_max_s"] = round(max(ages), 4)
    return out


def bench_e2e(mode: Mode, urls: dict[str, str]) -> dict[str, Any]:
    """Latency of each target over the same requests: one scraper (round robin over the
    targets, so drift on the machine hits all alike), then three at once, target by target.
    Also how old the upstream values each target served were (from the collection stamp)."""
    seq = asyncio.run(_sequential(urls, mode.e2e_requests))
    conc = {
        name: asyncio.run(_concurrent(url, 3, mode.e2e_concurrent)) for name, url in urls.items()
    }
    out: dict[str, Any] = {"requests": mode.e2e_requests, "sequential": {}, "concurrent3": {}}
    for name in urls:
        out["sequential"][name] = _latency(seq[name])
        out["concurrent3"][name] = _latency(conc[name])
    for kind in ("sequential", "concurrent3"):
        rows = out[kind]
        for q in ("p50_ms", "p99_ms"):
            for name in ENRICHERS:
                if name in rows:
                    rows[f"{name}_vs_proxy_{q[:3]}"] = round(rows[name][q] / rows["proxy"][q], 3)
    return out


def run_e2e(mode: Mode, upstream: Child, spec: Any) -> dict[str, Any]:
    """Start the proxy and the enrichers against ``upstream``; measure them in each upstream
    rhythm (see RHYTHMS). The shipped enricher follows the upstream (polls on its own), so it
    runs only in the rhythm where that means something (a collection every so many seconds)."""
    from . import servers

    def client(name: str) -> str:
        return f"{upstream.url}?client={name}"

    from enricher.config import Config

    specs = {
        "enricher": replace(spec, upstream_url=client("enricher")),
        "enricher_background": replace(
            spec,
            upstream_url=client("enricher_background"),
            collect_interval=COLLECT_INTERVAL,
            follow_step=0.0,
        ),
        "enricher_per_scrape": replace(
            spec, upstream_url=client("enricher_per_scrape"), follow_step=0.0
        ),
    }
    children = {"proxy": start(servers.run_proxy, client("proxy"))}
    out: dict[str, Any] = {
        "collect_interval_s": COLLECT_INTERVAL,
        "follow_step_s": Config().upstream_follow_step,
    }
    try:
        for name in ("enricher_background", "enricher_per_scrape"):
            children[name] = start(servers.run_enricher, specs[name])
        for rhythm, value in RHYTHMS:
            if upstream.ask((rhythm, value)) != value:
                raise RuntimeError("the upstream did not switch its collection rhythm")
            if rhythm == "period":
                children["enricher"] = start(servers.run_enricher, specs["enricher"])
                time.sleep(mode.follow_learn * value)  # let it learn the rhythm
            enrichers = [n for n in ENRICHERS if n in children]
            for name in enrichers:
                children[name].conn.send("clear-timings")
            urls = {"upstream": client("direct")}
            urls.update({k: c.url for k, c in children.items()})
            row = bench_e2e(mode, urls)
            for name in enrichers:
                row[f"{name}_rewrites"] = children[name].ask("stats")
                row[f"{name}_inside_ms"] = children[name].ask("timings")
            out[f"{rhythm}_{value:g}"] = row
    finally:
        for child in children.values():
            child.stop()
    return out
