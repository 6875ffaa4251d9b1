"""``python -m tools.load``: many concurrent scrapers against the enricher, on loopback.

The enricher runs in its own process (so its memory is its own), started as
``python -m tools.load --serve-enricher URL``, with the demo's SIMULATED GPUs, /proc tree and
pods behind the real pipeline. This process runs a dcgm-exporter stand-in that takes
``--upstream-delay`` seconds per answer (a slow exporter) and counts its requests, and
``--scrapers`` clients that scrape /metrics back to back for ``--duration`` seconds.

Reported: scrapes, errors (non-200, a failed request, or a body that is not a whole
exposition), degraded answers (200 but the upstream reported down), p50/p99/max latency, the
upstream requests (single-flight: concurrent scrapes share one upstream fetch), and the
enricher's RSS before and after the load and its peak. ``--quick`` runs about five seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
READY = "ENRICHER-LISTENING"


@dataclass(frozen=True)
class LoadConfig:
    scrapers: int = 50
    duration: float = 60.0
    upstream_delay: float = 0.2
    upstream_timeout: float = 5.0
    # The stand-in collects like dcgm-exporter: new values every that many seconds, the same
    # body in between.
    upstream_interval: float = 1.0
    # The enricher's --upstream.follow-step; None: its default (following), 0: fetch per scrape.
    follow_step: float | None = None


@dataclass
class LoadResult:
    scrapers: int
    duration_s: float
    upstream_delay_s: float
    scrapes: int
    errors: int
    degraded: int
    upstream_requests: int
    shared_scrapes: int
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    scrapes_per_second: float
    rss_before_mib: float
    rss_after_mib: float
    rss_peak_mib: float
    enricher_cpu_s: float
    first_error: str = ""


# --------------------------------------------------------------------------- the enricher


async def _serve_enricher(
    upstream_url: str, upstream_timeout: float, follow_step: float | None
) -> None:
    """The child process: the real app on the demo's simulated node; prints its port."""
    from dataclasses import replace

    from enricher.app import make_app, serve
    from enricher.config import Config
    from enricher.demo import DEMO, NODE, demo_pods
    from enricher.pipeline import Scraper
    from enricher.procfs import ProcfsSource
    from enricher.simnode.fakeproc import write_proc_tree
    from enricher.simnode.gpus import SimulatedGpus

    with tempfile.TemporaryDirectory(prefix="load-proc-") as tmp:
        write_proc_tree(Path(tmp), DEMO, time.time())
        config = replace(
            Config(),
            upstream_url=upstream_url,
            upstream_timeout=upstream_timeout,
            procfs=tmp,
            kube_node_name=NODE,
        )
        if follow_step is not None:
            config = replace(config, upstream_follow_step=follow_step)
        pods = demo_pods(config)
        scraper = Scraper(
            config, nvml=SimulatedGpus(DEMO), procfs=ProcfsSource(tmp), kubernetes=pods
        )
        runner = await serve(make_app(scraper), "127.0.0.1:0")
        print(READY, runner.addresses[0][1], flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in KiB from /proc/<pid>/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)


# --------------------------------------------------------------------------- the load


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def _self_metric(text: str, name: str) -> float:
    """The value of the enricher's own sample ``name`` (it carries the node label)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return math.nan


async def run_load(cfg: LoadConfig) -> LoadResult:
    """Start the slow upstream and the enricher, drive the scrapers, collect the figures."""
    from aiohttp import web

    from enricher.demo import DEMO, render_upstream
    from enricher.simnode.gpus import SimulatedGpus, collected_at

    gpus = SimulatedGpus(DEMO)
    upstream_requests = 0

    async def metrics(_request: web.Request) -> web.Response:
        nonlocal upstream_requests
        upstream_requests += 1
        await asyncio.sleep(cfg.upstream_delay)
        collected = collected_at(time.time(), cfg.upstream_interval)
        return web.Response(text=render_upstream(gpus, collected), content_type="text/plain")

    upstream_app = web.Application()
    upstream_app.router.add_get("/metrics", metrics)
    upstream = web.AppRunner(upstream_app, access_log=None)
    await upstream.setup()
    await web.TCPSite(upstream, "127.0.0.1", 0).start()
    upstream_url = f"http://127.0.0.1:{upstream.addresses[0][1]}/metrics"

    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.load",
        "--serve-enricher",
        upstream_url,
        "--upstream-timeout",
        str(cfg.upstream_timeout),
        *(() if cfg.follow_step is None else ("--follow-step", str(cfg.follow_step))),
        cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if not line.startswith(READY.encode()):
            raise RuntimeError(f"the enricher did not start: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[1])}/metrics"
        return await _drive(cfg, url, child.pid, lambda: upstream_requests)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), 10)
        except asyncio.TimeoutError:
            child.kill()
            await child.wait()
        await upstream.cleanup()


async def _drive(
    cfg: LoadConfig, url: str, pid: int, upstream_count: Callable[[], int]
) -> LoadResult:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=cfg.scrapers)
    timeout = aiohttp.ClientTimeout(total=cfg.upstream_timeout + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.get(url) as resp:  # warm-up: imports, caches, first NVML read
            await resp.read()
        rss_before = _proc_status(pid)["VmRSS"]
        cpu_before = _cpu_seconds(pid)
        requests_before = upstream_count()
        latencies: list[float] = []
        errors = degraded = 0
        first_error = ""
        started = time.monotonic()
        deadline = started + cfg.duration

        async def scraper() -> None:
            nonlocal errors, degraded, first_error
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                try:
                    async with session.get(url) as resp:
                        body = await resp.text()
                        status = resp.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    errors += 1
                    first_error = first_error or repr(exc)
                    continue
                latencies.append(time.monotonic() - t0)
                if (
                    status != 200
                    or not body.endswith("\n")
                    or "dcgm_enricher_build_info{" not in body
                ):
                    errors += 1
                    first_error = first_error or f"HTTP {status}, {len(body)} bytes"
                elif 'dcgm_enricher_source_up{source="upstream"} 0' in body:
                    degraded += 1

        await asyncio.gather(*(scraper() for _ in range(cfg.scrapers)))
        elapsed = time.monotonic() - started
        async with session.get(url) as resp:
            final = await resp.text()
    status = _proc_status(pid)
    latencies.sort()
    scrapes = len(latencies) + errors
    return LoadResult(
        scrapers=cfg.scrapers,
        duration_s=round(elapsed, 2),
        upstream_delay_s=cfg.upstream_delay,
        scrapes=scrapes,
        errors=errors,
        degraded=degraded,
        upstream_requests=upstream_count() - requests_before,
        shared_scrapes=int(_self_metric(final, "dcgm_enricher_shared_scrapes_total")),
        latency_p50_ms=round(_percentile(latencies, 0.50) * 1000, 1),
        latency_p99_ms=round(_percentile(latencies, 0.99) * 1000, 1),
        latency_max_ms=round((latencies[-1] if latencies else math.nan) * 1000, 1),
        scrapes_per_second=round(scrapes / elapsed, 1),
        rss_before_mib=round(rss_before / 1024, 1),
        rss_after_mib=round(status["VmRSS"] / 1024, 1),
        rss_peak_mib=round(status["VmHWM"] / 1024, 1),
        enricher_cpu_s=round(_cpu_seconds(pid) - cpu_before, 2),
        first_error=first_error,
    )


# --------------------------------------------------------------------------- CLI


def format_result(r: LoadResult, command: str) -> str:
    rows = [
        ("command", command),
        ("scrapers x duration", f"{r.scrapers} x {r.duration_s:g} s"),
        ("upstream delay", f"{r.upstream_delay_s * 1000:g} ms per answer"),
        ("scrapes (per second)", f"{r.scrapes} ({r.scrapes_per_second:g}/s)"),
        ("errors", str(r.errors) + (f" (first: {r.first_error})" if r.first_error else "")),
        ("degraded (upstream down)", str(r.degraded)),
        ("upstream requests", f"{r.upstream_requests} (shared scrapes: {r.shared_scrapes})"),
        (
            "latency p50 / p99 / max",
            f"{r.latency_p50_ms} / {r.latency_p99_ms} / {r.latency_max_ms} ms",
        ),
        (
            "enricher RSS before / after / peak",
            f"{r.rss_before_mib} / {r.rss_after_mib} / {r.rss_peak_mib} MiB",
        ),
        ("enricher CPU", f"{r.enricher_cpu_s} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.load", description=__doc__.split("\n")[0])
    p.add_argument("--scrapers", type=int, default=LoadConfig.scrapers)
    p.add_argument("--duration", type=float, default=LoadConfig.duration, help="seconds")
    p.add_argument("--upstream-delay", type=float, default=LoadConfig.upstream_delay)
    p.add_argument("--upstream-timeout", type=float, default=LoadConfig.upstream_timeout)
    p.add_argument(
        "--upstream-interval", type=float, default=LoadConfig.upstream_interval, help="seconds"
    )
    p.add_argument(
        "--follow-step",
        type=float,
        default=None,
        help="the enricher's --upstream.follow-step (default: its own default; 0: per scrape)",
    )
    p.add_argument("--quick", action="store_true", help="about five seconds")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--serve-enricher", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_enricher:
        asyncio.run(_serve_enricher(args.serve_enricher, args.upstream_timeout, args.follow_step))
        return 0
    cfg = LoadConfig(
        scrapers=args.scrapers,
        duration=5.0 if args.quick else args.duration,
        upstream_delay=args.upstream_delay,
        upstream_timeout=args.upstream_timeout,
        upstream_interval=args.upstream_interval,
        follow_step=args.follow_step,
    )
    result = asyncio.run(run_load(cfg))
    command = "python -m tools.load" + (" --quick" if args.quick else "")
    print(format_result(result, command))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0 if result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
