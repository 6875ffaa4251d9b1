"""How the node side grows (``python -m bench --only growth``): the enricher's CPU time and
memory per collection on simulated nodes of 1, 8 and 16 GPUs, 10, 100 and 1,000 GPU processes
and 100, 1,000 and 10,000 pods in the watch, one axis at a time from a base of 8 GPUs, 100
processes and 100 pods.

Each point is a :class:`bench.node.BenchNode` (fake NVML state, a /proc tree, pods as API
objects) read by the real pipeline in this process: ``enricher.pipeline.Scraper`` reading
everything on every scrape (``--upstream.follow-step=0``, so one scrape is one collection),
pynvml on the fake libnvidia-ml, ``ProcfsSource`` on the /proc tree, the pods parsed by
``parse_pod`` into the index (``StaticPods``, what the watch publishes), and an upstream in a
process of its own (``bench.servers.run_upstream``: new values on every request, so every
collection goes through the rewrite) whose CPU is not counted. A collection is one scrape
plus the gzip of its body, as a scraper asking for gzip gets it.

Per point: CPU seconds of this process per collection (``time.process_time``: every thread,
the NVML and procfs workers too; the median of the repetitions), the wall time, and memory
from ``tracemalloc`` in a second pass (tracing slows everything, so it is never timed): what
the sources and the Scraper hold after a few collections (the pod index included) and the
peak one more collection allocates beyond that. For the pods axis also the cost of one
``build_index`` over the node's pods: what the pod watch pays on each event it applies.

The growth order of each axis is the least-squares slope of log(cost) over log(size) (1:
linear; ``exponent``, as for the rewrite), and the slope of the last step alone,
which a term worse than linear shows first.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import payloads
from .node import NODE, BenchNode

# The base node and the sizes of each axis (the others stay at the base's).
BASE = {"gpus": 8, "procs": 100, "pods": 100}
AXES: dict[str, tuple[int, ...]] = {
    "gpus": (1, 8, 16),
    "procs": (10, 100, 1_000),
    "pods": (100, 1_000, 10_000),
}
# --quick (tests/test_bench.py): the same code on small nodes, in seconds.
QUICK_BASE = {"gpus": 2, "procs": 8, "pods": 8}
QUICK_AXES: dict[str, tuple[int, ...]] = {"gpus": (1, 2), "procs": (4, 8), "pods": (8, 32)}
AXIS_TITLES = {"gpus": "GPUs", "procs": "GPU processes", "pods": "pods in the watch"}


@dataclass(frozen=True)
class GrowthMode:
    base: dict[str, int]
    axes: dict[str, tuple[int, ...]]
    reps: int  # timed collections per point
    warmup: int  # collections before timing (first reads: NVML init, cgroup parse, template)
    index_reps: int  # build_index repetitions per point


FULL_GROWTH = GrowthMode(BASE, AXES, reps=100, warmup=5, index_reps=7)
QUICK_GROWTH = GrowthMode(QUICK_BASE, QUICK_AXES, reps=3, warmup=2, index_reps=1)


def shape_of(gpus: int) -> payloads.Shape:
    """Full GPUs with the profiling counters (node8's kind of node), half of them allocated."""
    return payloads.Shape(f"grow{gpus}", gpus=gpus, migs=0, profiling=True)


def points(mode: GrowthMode) -> list[tuple[int, int, int]]:
    """Every (gpus, procs, pods) the axes name, each once (the base is on all three)."""
    out: list[tuple[int, int, int]] = []
    for axis, sizes in mode.axes.items():
        for size in sizes:
            point = {**mode.base, axis: size}
            key = (point["gpus"], point["procs"], point["pods"])
            if key not in out:
                out.append(key)
    return out


def _mib(n: int) -> float:
    return round(n / (1 << 20), 3)


def exponent(rows: dict[str, Any], key: str, size: str = "series") -> float:
    """The least-squares slope of log(``key``) over log(``size``) across ``rows``."""
    xs = [math.log(r[size]) for r in rows.values()]
    ys = [math.log(r[key]) for r in rows.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return round(num / sum((x - mx) ** 2 for x in xs), 3)


class Point:
    """One simulated node and what reads it: sources, the Scraper, its upstream URL."""

    def __init__(self, sim: BenchNode, url: str, nvml_lib: Path) -> None:
        self.sim = sim
        self.url = url
        self.nvml_lib = nvml_lib
        self.objects = sim.pod_objects()

    def scraper(self) -> Any:
        from enricher.config import Config
        from enricher.nvml import NvmlSource
        from enricher.pipeline import Scraper
        from enricher.podparse import parse_pod
        from enricher.procfs import ProcfsSource
        from enricher.simnode.api import StaticPods

        config = Config(
            upstream_follow_step=0.0,
            upstream_url=self.url,
            kube_node_name=NODE,
            kubelet_pod_resources_socket="",
        )
        return Scraper(
            config,
            nvml=NvmlSource(library_path=str(self.nvml_lib)),
            procfs=ProcfsSource(str(self.sim.proc_root)),
            kubernetes=StaticPods([parse_pod(o) for o in self.objects]),
        )


def _gzip_for(scraper: Any) -> Any:
    """The gzip of each collection body, as the HTTP side makes it (enricher.app)."""
    from enricher.compress import GzipBodies

    return GzipBodies(scraper.assembler.worker)


async def _collect(scraper: Any, gzip: Any) -> int:
    result = await scraper.scrape()
    return len(await gzip.finish(result))


async def _timed(point: Point, mode: GrowthMode) -> dict[str, Any]:
    scraper = point.scraper()
    gzip = _gzip_for(scraper)
    try:
        for _ in range(mode.warmup):
            await _collect(scraper, gzip)
        cpu: list[float] = []
        wall: list[float] = []
        gc.collect()
        for _ in range(mode.reps):
            c0, w0 = time.process_time(), time.perf_counter()
            await _collect(scraper, gzip)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        last = scraper.last
        attributed = sum(1 for a in last.attributions if a.pod is not None)
        processes = len(last.attributions)
        body = last.shared.size
    finally:
        await scraper.close()
    return {
        "cpu_ms": round(statistics.median(cpu) * 1000, 3),
        "wall_ms": round(statistics.median(wall) * 1000, 3),
        "processes_seen": processes,
        "attributed": attributed,
        "head_bytes": body,
    }


async def _traced(point: Point, mode: GrowthMode) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        scraper = point.scraper()
        gzip = _gzip_for(scraper)
        try:
            for _ in range(max(2, mode.warmup)):
                await _collect(scraper, gzip)
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            await _collect(scraper, gzip)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            await scraper.close()
    finally:
        tracemalloc.stop()
    return {"held_mib": _mib(held - before), "peak_mib": _mib(peak - held)}


def _index_ms(point: Point, reps: int) -> float:
    from enricher.podparse import build_index, parse_pod

    pods = [parse_pod(o) for o in point.objects]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        build_index(pods)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 3)


def _slopes(rows: list[dict[str, Any]], axis: str, key: str) -> dict[str, float | None]:
    if len(rows) < 2 or any(r[key] <= 0 for r in rows):
        return {"k": None, "last_step": None}
    by_size = {str(r[axis]): {"series": r[axis], key: r[key]} for r in rows}
    a, b = rows[-2], rows[-1]
    last = math.log(b[key] / a[key]) / math.log(b[axis] / a[axis])
    return {"k": exponent(by_size, key), "last_step": round(last, 3)}


def bench_growth(quick: bool, work: Path, nvml_lib: Path) -> dict[str, Any]:
    """Every point of the axes, measured; then each axis's rows and growth orders."""
    from .children import start
    from .servers import run_upstream, use_fake_nvml

    mode = QUICK_GROWTH if quick else FULL_GROWTH
    upstreams: dict[int, Any] = {}
    measured: dict[tuple[int, int, int], dict[str, Any]] = {}
    try:
        for gpus, procs, pods in points(mode):
            if gpus not in upstreams:
                upstreams[gpus] = start(run_upstream, shape_of(gpus))
            sim = BenchNode(
                work / f"growth-{gpus}-{procs}-{pods}",
                shape_of(gpus),
                n_pods=pods,
                n_procs=procs,
            )
            sim.write()
            use_fake_nvml(str(sim.nvml_state))
            point = Point(sim, upstreams[gpus].url, nvml_lib)
            row: dict[str, Any] = {"gpus": gpus, "procs": procs, "pods": pods}
            row.update(asyncio.run(_timed(point, mode)))
            row.update(asyncio.run(_traced(point, mode)))
            row["index_build_ms"] = _index_ms(point, mode.index_reps)
            measured[(gpus, procs, pods)] = row
    finally:
        for child in upstreams.values():
            child.stop()
    out: dict[str, Any] = {"base": mode.base, "axes": {}}
    for axis, sizes in mode.axes.items():
        rows = [measured[_key(mode.base, axis, size)] for size in sizes]
        keys = ["cpu_ms", "held_mib", "peak_mib"] + (["index_build_ms"] if axis == "pods" else [])
        out["axes"][axis] = {
            "rows": rows,
            "slopes": {key: _slopes(rows, axis, key) for key in keys},
        }
    return out


def _key(base: dict[str, int], axis: str, size: int) -> tuple[int, int, int]:
    point = {**base, axis: size}
    return (point["gpus"], point["procs"], point["pods"])


def render_growth(growth: dict[str, Any]) -> list[str]:
    base = growth["base"]
    lines = [
        "Node side growth: per collection (one scrape reading everything, and its gzip), "
        f"from a base of {base['gpus']} GPUs, {base['procs']} GPU processes, "
        f"{base['pods']} pods",
        f"{'axis':18} {'size':>6} {'CPU ms':>8} {'wall ms':>8} {'held MiB':>9} "
        f"{'peak MiB':>9} {'index ms':>9}",
    ]
    for axis, data in growth["axes"].items():
        for row in data["rows"]:
            lines.append(
                f"{AXIS_TITLES[axis]:18} {row[axis]:>6} {row['cpu_ms']:>8.2f} "
                f"{row['wall_ms']:>8.2f} {row['held_mib']:>9.2f} {row['peak_mib']:>9.2f} "
                f"{row['index_build_ms']:>9.3f}"
            )
    lines.append("growth order (least-squares slope of log cost over log size; the last step's):")
    for axis, data in growth["axes"].items():
        parts = []
        for key, s in data["slopes"].items():
            if s["k"] is None:
                parts.append(f"{key} -")
            else:
                parts.append(f"{key} {s['k']:.2f} ({s['last_step']:.2f})")
        lines.append(f"  {AXIS_TITLES[axis]:18} " + ", ".join(parts))
    return lines
