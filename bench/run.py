"""The scrape-path benchmark: ``python -m bench [--quick] [--out FILE]`` (``make bench``).

Everything runs in one process tree on one machine in one run, and every target is a ratio
against an anchor measured in the same run, so a slow or noisy machine cannot fake a win:

* rewrite: per payload, the enricher's rewrite against the *limit* (split into lines and join
  again) and the *naive* round trip (prometheus_client's parser, then its renderer);
* end to end: GET /metrics through the real enricher app (aiohttp on loopback, fake NVML,
  a /proc tree, the real pod watch against the API-server stand-in) next to a plain aiohttp
  pass-through proxy and the upstream itself, one scraper and three concurrent scrapers;
* attribution: NVML (the fake libnvidia-ml) + procfs + pod lookup for 64 GPU processes;
* growth: the node side's CPU time and memory per collection on simulated nodes of 1 to 16
  GPUs, 10 to 1,000 GPU processes and 100 to 10,000 pods, and the growth order of each
  (bench/growth.py);
* memory: the enricher process's RSS (every source on: the pod watch and a gRPC kubelet)
  after start, after 1,000 and 10,000 scrapes while pods churn (a tenth of 110 pods replaced
  every 100 scrapes, their PIDs reused);
* event loop: /healthz latency while the enricher rewrites a 31 MiB upstream body (new
  values, and new labels), against /healthz of the same process when idle;
* cost: the shipped app and a pass-through proxy as separate processes at the same time, the
  same gzip scrapes (two scrapers each, one a second) on an upstream collecting every 2 s:
  CPU seconds of each, upstream requests per collection, bytes on the wire.

``--long`` runs the memory part to 30,000 scrapes (the RSS drift from scrape 3,000).
``--breakdown`` runs the cost part once more with the enricher counting where its CPU goes
(bench/breakdown.py); that run's figures give no verdict.

It prints a table and writes the figures as JSON (default bench/results/latest.json).
``--quick`` runs every part briefly: CI runs it to check the benchmark still works, and
asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from . import payloads
from .children import Child, start
from .growth import exponent
from .node import NODE, BenchNode

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "latest.json"

# The targets of issue 3; each is checked against figures from this run only.
TARGET_NAIVE_SPEEDUP = 30.0  # rewrite of mig56 at least this many times faster than naive
TARGET_LIMIT_RATIO = 4.0  # ... and at most this many limit passes
TARGET_E2E_RATIO = 1.25  # enricher p50 / pass-through proxy p50 on mig56
TARGET_ATTRIBUTION_MS = 2.0  # 64 processes on 8 GPUs
TARGET_RSS_MIB = 64.0
TARGET_RSS_GROWTH = 0.05  # from scrape 1,000 to 10,000
TARGET_SCALING_EXPONENT = 1.1  # cost ~ series**k over gpu1..stress; 1 is linear
# The targets of issue 16 (what the enricher costs a node), from the same run.
TARGET_CPU_RATIO = 1.5  # enricher CPU seconds / pass-through proxy's, same scrapes
TARGET_UPSTREAM_PER_COLLECTION = 2.5  # upstream requests per collection, steady state
TARGET_GZIP_FRACTION = 1 / 8  # gzip body / identity body, mig56
TARGET_ATTRIBUTION_FLOOR_RATIO = 4.0  # attribution p50 / bare stat reads p50, node8
TARGET_RSS_OVER_FLOOR_MIB = 16.0  # steady RSS, every source on, over the import floor
TARGET_RSS_DRIFT_MIB = 2.0  # RSS at the last memory checkpoint minus the first
COST_PERIOD = 2.0  # the upstream collects every this many seconds in the cost part
COST_SCRAPERS = 2  # per target, each asking every COST_SCRAPE_EVERY seconds
COST_SCRAPE_EVERY = 1.0
# enricher_background reads the node side (NVML, procfs, kubelet) every this many seconds,
# as dcgm-exporter collects by default, and the upstream on every scrape.
COLLECT_INTERVAL = 30.0
# When the upstream has new values. ("every", 1): on every fetch, the worst case (every
# scrape is rewritten). ("every", 4): on every 4th fetch of each client, as an HA pair
# scraping every 15 s sees a dcgm-exporter that collects every 30 s (its default): the body
# repeats between collections. ("period", s): every s seconds of wall time, whoever asks: a
# real exporter's rhythm, sped up, the one where following the upstream can be measured.
RHYTHMS: tuple[tuple[str, float], ...] = (("every", 1), ("every", 4), ("period", 2.0))
# enricher: the app as shipped (its defaults: dcgm-exporter followed, fetched right after each
# of its collections, the node side read with it; scrapes served from what is ready).
# enricher_background: --upstream.follow-step=0 --collect.interval=30 (the upstream fetched and
# rewritten on every scrape, the node side in the background). enricher_per_scrape:
# --upstream.follow-step=0 (everything read on every scrape). The targets apply to the first.
ENRICHERS = ("enricher", "enricher_background", "enricher_per_scrape")
# "One scrape" in the freshness check: what an enricher may add to the age of the values
# beyond the follower's step (a poll and a rewrite, or a slow scrape).
FRESHNESS_SLACK = 0.05


@dataclass(frozen=True)
class Mode:
    rewrite_reps: int
    naive_reps: int
    e2e_requests: int
    e2e_concurrent: int  # requests per scraper, 3 scrapers
    attribution_reps: int
    memory_checkpoints: tuple[int, int]
    churn_every: int
    churn_pods: int
    follow_learn: float  # upstream periods the follower gets to learn the rhythm
    loop_scrapes: int  # scrapes of the large body per kind, /healthz asked meanwhile
    loop_shape: str  # the large body: max32 (31 MiB) in a full run
    cost_learn: float  # seconds the cost part lets the enricher learn the rhythm
    cost_window: float  # the steady window the cost part measures (seconds)


FULL = Mode(
    rewrite_reps=60,
    naive_reps=5,
    e2e_requests=600,  # p99 is the 6th slowest: a few stray slow requests do not decide it
    e2e_concurrent=100,
    attribution_reps=200,
    memory_checkpoints=(1_000, 10_000),
    churn_every=100,
    churn_pods=11,
    follow_learn=6.0,
    loop_scrapes=12,
    loop_shape="max32",
    cost_learn=20.0,
    cost_window=60.0,
)
QUICK = Mode(
    rewrite_reps=5,
    naive_reps=1,  # and none for stress
    e2e_requests=20,
    e2e_concurrent=10,
    attribution_reps=10,
    memory_checkpoints=(50, 150),
    churn_every=25,
    churn_pods=11,
    follow_learn=0.5,
    loop_scrapes=2,
    loop_shape="stress",  # 6 MiB: still over the inline limit, and quick to generate
    cost_learn=12.0,
    cost_window=8.0,
)
# --long: the memory run to 30,000 scrapes (the no-growth target's own checkpoints).
LONG = replace(FULL, memory_checkpoints=(3_000, 30_000))


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 4)


def _pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), nearest rank: an observed value, never an interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --------------------------------------------------------------------------- rewrite


def _naive_round_trip(text: str, owners: dict[tuple[str, str], tuple[str, str, str]]) -> str:
    """What a Python developer would write: parse with prometheus_client, set the pod labels,
    render with prometheus_client."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import Collector, CollectorRegistry
    from prometheus_client.samples import Sample

    families = list(text_string_to_metric_families(text))
    for fam in families:
        new = []
        for s in fam.samples:
            labels = dict(s.labels)
            owner = owners.get((labels.get("UUID", ""), labels.get("GPU_I_ID", "")))
            ns, pod, container = owner if owner is not None else ("", "", "")
            if owner is not None or "pod" not in labels:
                labels.update(namespace=ns, pod=pod, container=container)
            new.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
        fam.samples = new

    class Families(Collector):
        def collect(self) -> Any:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return generate_latest(registry).decode()


def _limit_pass(text: str) -> str:
    """The least any line rewrite costs: split into lines and join them again."""
    return "\n".join(text.split("\n"))


def _time_once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_rewrite(mode: Mode) -> dict[str, Any]:
    from enricher.labels import Owner, RewritePlan
    from enricher.rewrite import Rewriter

    out: dict[str, Any] = {}
    for name, shape in payloads.SHAPES.items():
        texts = [payloads.generate(shape, v) for v in range(4)]
        devs = payloads.devices(shape)
        # A busy node: a third of the devices run one pod's processes, a sixth are shared.
        owners = {}
        for i, d in enumerate(devs):
            key = (d.uuid, "" if d.gi_id is None else str(d.gi_id))
            if i % 3 == 0:
                owners[key] = Owner("ml", f"train-{i}", "trainer")
            elif i % 6 == 1:
                owners[key] = Owner("", "", "")
        plan = RewritePlan(owners=owners)
        naive_owners = {k: (o.namespace, o.pod, o.container) for k, o in owners.items()}
        series = payloads.series_count(texts[0])

        fast = Rewriter()
        first = _time_once(partial(fast.rewrite, texts[0], plan))  # line by line + template
        slow = Rewriter(templates=False)
        slow.rewrite(texts[0], plan)
        reps = mode.rewrite_reps if series < 10_000 else max(3, mode.rewrite_reps // 6)
        limit_t: list[float] = []
        fast_t: list[float] = []
        slow_t: list[float] = []
        gc.collect()
        for r in range(reps):  # interleaved, so drift on the machine hits all alike
            text = texts[(r + 1) % len(texts)]
            limit_t.append(_time_once(partial(_limit_pass, text)))
            fast_t.append(_time_once(partial(fast.rewrite, text, plan)))
            slow_t.append(_time_once(partial(slow.rewrite, text, plan)))
        if fast.slow_rewrites != 1:
            raise AssertionError(f"{name}: the template missed ({fast.slow_rewrites - 1} times)")
        if fast.rewrite(texts[1], plan).text != slow.rewrite(texts[1], plan).text:
            raise AssertionError(f"{name}: fast and line-by-line rewrites differ")
        # The naive round trip of stress takes seconds: once in a full run, never in --quick.
        naive_reps = mode.naive_reps if series < 10_000 else min(1, mode.naive_reps - 1)
        naive_t = [
            _time_once(partial(_naive_round_trip, texts[r % len(texts)], naive_owners))
            for r in range(naive_reps)
        ]
        limit = statistics.median(limit_t)
        fast_med = statistics.median(fast_t)
        out[name] = {
            "series": series,
            "bytes": len(texts[0].encode()),
            "limit_ms": _ms(limit),
            "rewrite_ms": _ms(fast_med),
            "line_by_line_ms": _ms(statistics.median(slow_t)),
            "first_scrape_ms": _ms(first),
            "naive_ms": _ms(statistics.median(naive_t)) if naive_t else None,
            "rewrite_per_series_ns": round(fast_med / series * 1e9, 1),
            "limit_ratio": round(fast_med / limit, 2),
            "naive_speedup": round(statistics.median(naive_t) / fast_med, 1) if naive_t else None,
            "line_by_line_limit_ratio": round(statistics.median(slow_t) / limit, 2),
        }
        del texts
        gc.collect()
    big, mid = out["stress"], out["mig56"]
    return {
        "payloads": out,
        # Least-squares slope of log(cost) over log(series): 1 is linear. The limit pass's own
        # exponent shows what the machine's caches do to any pass over a bigger text.
        "scaling_exponent": exponent(out, "rewrite_ms"),
        "limit_scaling_exponent": exponent(out, "limit_ms"),
        "stress_vs_mig56_per_series": round(
            big["rewrite_per_series_ns"] / mid["rewrite_per_series_ns"], 2
        ),
    }


# --------------------------------------------------------------------------- attribution


def bench_attribution(mode: Mode, work: Path, nvml_lib: Path) -> dict[str, Any]:
    from enricher.attribution import attribute, plan_devices
    from enricher.nvml import NvmlSource
    from enricher.podparse import build_index, parse_pod
    from enricher.procfs import ProcfsSource

    from .servers import use_fake_nvml

    out: dict[str, Any] = {}
    for shape_name in ("node8", "mig56"):
        sim = BenchNode(work / f"attr-{shape_name}", payloads.SHAPES[shape_name])
        sim.write()
        use_fake_nvml(str(sim.nvml_state))
        index = build_index(parse_pod(p) for p in sim.pod_objects())
        source = NvmlSource(library_path=str(nvml_lib))
        reader = ProcfsSource(str(sim.proc_root))

        parts: dict[str, list[float]] = {"nvml": [], "procfs": [], "lookup": []}

        def once(
            src: NvmlSource = source,
            rd: ProcfsSource = reader,
            ix: Any = index,
            parts: dict[str, list[float]] = parts,
        ) -> int:
            t0 = time.perf_counter()
            snap = src.fetch()
            t1 = time.perf_counter()
            procs = rd.read_many(sorted({p.pid for p in snap.processes}), snap.taken_at)
            t2 = time.perf_counter()
            attributions = attribute(snap, procs, ix)
            plan_devices(attributions)
            t3 = time.perf_counter()
            for name, took in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                parts[name].append(took)
            return sum(1 for a in attributions if a.pod is not None)

        attributed = once()  # first read: init, cgroup parse
        for part in parts.values():
            part.clear()
        times = [_time_once(once) for _ in range(mode.attribution_reps)]
        source.close()
        # The floor under procfs: one open/read/close of each stat file, nothing else.
        stat_files = [str(sim.proc_root / str(p.pid) / "stat") for p in sim.processes]
        floor = [_time_once(partial(_read_all, stat_files)) for _ in range(mode.attribution_reps)]
        # The floor under NVML (node8: no MIG): the library calls one read makes, bare. Shown,
        # not a target.
        nvml_floor = (
            _bare_nvml_floor(str(nvml_lib), mode.attribution_reps) if not sim.shape.migs else []
        )
        out[shape_name] = {
            "gpus": sim.shape.gpus,
            "devices": len(payloads.devices(sim.shape)),
            "processes": len(sim.processes),
            "attributed": attributed,
            "p50_ms": _ms(statistics.median(times)),
            "p99_ms": _ms(_pct(times, 0.99)),
            **{f"{name}_p50_ms": _ms(statistics.median(v)) for name, v in parts.items()},
            "stat_reads_floor_p50_ms": _ms(statistics.median(floor)),
            "nvml_calls_floor_p50_ms": _ms(statistics.median(nvml_floor)) if nvml_floor else None,
        }
    return out


def _bare_nvml_floor(library: str, reps: int) -> list[float]:
    """Timings of the driver calls one NVML read of a node without MIG makes (the count; per
    GPU the MIG mode, the three process lists, the utilization samples, power and energy),
    each through its ctypes function pointer into buffers made beforehand: what reading NVML
    costs from Python before any of the enricher's own work."""
    import ctypes

    import pynvml

    pynvml.nvmlInit()  # the library the source loaded (library_path): pynvml keeps it
    try:
        fn = pynvml._nvmlGetFunctionPointer
        count = fn("nvmlDeviceGetCount_v2")
        mig_mode = fn("nvmlDeviceGetMigMode")
        lists = [
            fn(f"nvmlDeviceGet{kind}RunningProcesses_v3")
            for kind in ("Compute", "Graphics", "MPSCompute")
        ]
        util = fn("nvmlDeviceGetProcessUtilization")
        power = fn("nvmlDeviceGetPowerUsage")
        energy = fn("nvmlDeviceGetTotalEnergyConsumption")
        n = ctypes.c_uint()
        count(ctypes.byref(n))
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n.value)]
        rows = (ctypes.c_ubyte * 4096)()
        size, current, pending = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        milliwatts, millijoules = ctypes.c_uint(), ctypes.c_ulonglong()
        since = ctypes.c_ulonglong()

        def calls() -> None:
            count(ctypes.byref(n))
            for handle in handles:
                mig_mode(handle, ctypes.byref(current), ctypes.byref(pending))
                for list_fn in lists:
                    size.value = 32
                    list_fn(handle, ctypes.byref(size), rows)
                size.value = 32
                util(handle, rows, ctypes.byref(size), since)
                power(handle, ctypes.byref(milliwatts))
                energy(handle, ctypes.byref(millijoules))

        return [_time_once(calls) for _ in range(reps)]
    finally:
        pynvml.nvmlShutdown()


def _read_all(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 4096)
        finally:
            os.close(fd)


def parse_smaps(text: str) -> dict[str, int]:
    """RSS in KiB by what is mapped, from ``/proc/<pid>/smaps``: a file by its base name (a
    library's touched pages), ``[heap]``, ``[stack]`` and the like as the kernel names them,
    and ``[anon]`` for anonymous mappings (pymalloc's arenas, large allocations, thread
    arenas and stacks)."""
    out: dict[str, int] = {}
    name = "[anon]"
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":"):  # a mapping: range, perms, offset, dev, inode, path
            path = line.split(None, 5)[5].strip() if len(fields) > 5 else ""
            name = path.rsplit("/", 1)[-1] if path and not path.startswith("[") else path
            name = name or "[anon]"
        elif fields[0] == "Rss:":
            out[name] = out.get(name, 0) + int(fields[1])
    return out


def rss_by_mapping(pid: int) -> dict[str, int]:
    """:func:`parse_smaps` of a running process."""
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        return parse_smaps(f.read())


def rss_over_floor(
    floor: dict[str, int], start: dict[str, int], end: dict[str, int], top: int = 6
) -> list[dict[str, Any]]:
    """The mappings that hold most of the enricher's RSS over the floor's at the end (MiB;
    the rest summed in one row), with their RSS at the floor, at start and at the end."""
    names = set(floor) | set(start) | set(end)

    def mib(kib: int) -> float:
        return round(kib / 1024.0, 2)

    ranked = sorted(names, key=lambda n: -(end.get(n, 0) - floor.get(n, 0)))
    rows = [
        {
            "mapping": n,
            "floor": mib(floor.get(n, 0)),
            "start": mib(start.get(n, 0)),
            "end": mib(end.get(n, 0)),
            "over_floor": mib(end.get(n, 0) - floor.get(n, 0)),
        }
        for n in ranked[:top]
    ]
    rest = ranked[top:]
    rows.append(
        {
            "mapping": "the rest",
            **{
                k: mib(sum(table.get(n, 0) for n in rest))
                for k, table in (("floor", floor), ("start", start), ("end", end))
            },
            "over_floor": mib(sum(end.get(n, 0) - floor.get(n, 0) for n in rest)),
        }
    )
    return rows


def start_kubelet(sim: BenchNode, socket_path: Path) -> Any:
    """The kubelet's PodResources API on a unix socket (a real gRPC server in this process):
    each List answers the devices the node's pods hold now (after churn too)."""
    from devkit.nvmlfake import default_mig_uuid
    from enricher.model import DeviceAllocation
    from enricher.simnode.kubelet import SimulatedKubelet, list_response

    def respond(_context: Any) -> Any:
        return list_response(
            DeviceAllocation(
                p.pod.namespace,
                p.pod.name,
                p.pod.container,
                "nvidia.com/gpu" if p.gi is None else "nvidia.com/mig-1g.10gb",
                payloads.gpu_uuid(p.gpu) if p.gi is None else default_mig_uuid(p.gpu, p.gi, 0),
            )
            for p in sim.processes
            if p.pod is not None
        )

    kubelet = SimulatedKubelet(str(socket_path), respond)
    kubelet.start()
    return kubelet


def _write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: bench\n  cluster:\n    server: {url}\n"
        "users:\n- name: bench\n  user: {}\n"
        "contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\n"
        "current-context: bench\n"
    )


# --------------------------------------------------------------------------- end to end


async def _get(
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
                await _get(session, url)
        for _ in range(n):
            for name, url in urls.items():  # round robin: drift hits every target alike
                got[name].append(await _get(session, url))
    return got


async def _concurrent(url: str, scrapers: int, n: int) -> list[tuple[float, float | None]]:
    got: list[tuple[float, float | None]] = []

    async def scraper() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                got.append(await _get(session, url))

    await asyncio.gather(*(scraper() for _ in range(scrapers)))
    return got


def _latency(samples: list[tuple[float, float | None]]) -> dict[str, float]:
    times = [t for t, _ in samples]
    out = {"p50_ms": _ms(statistics.median(times)), "p99_ms": _ms(_pct(times, 0.99))}
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


# --------------------------------------------------------------------------- cost


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


# --------------------------------------------------------------------------- event loop

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
            "p50_ms": _ms(statistics.median(values)),
            "p99_ms": _ms(_pct(values, 0.99)),
            "max_ms": _ms(max(values)),
        }

    return {
        "body_mib": round(size / 2**20, 2),
        "idle": stats(idle),
        "busy": stats(busy),
        "scrape_p50_ms": _ms(statistics.median(scrape_times)),
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


# --------------------------------------------------------------------------- memory


def _rss_without_kube(mode: Mode, start_enricher: Callable[[], Child]) -> float:
    """RSS after scrapes of an enricher without the pod watch: what the kubernetes client
    costs is the difference."""
    enricher = start_enricher()
    try:

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                for _ in range(mode.memory_checkpoints[0]):
                    await _get(session, enricher.url)

        asyncio.run(run())
        return round(enricher.rss_mib(), 1)
    finally:
        enricher.stop()


def import_floors(mappings: dict[str, dict[str, int]] | None = None) -> dict[str, float]:
    """RSS of processes that import what the enricher imports and do nothing else: the part of
    its RSS that is Python, aiohttp, pynvml, the kubernetes client (and, on a node with the
    kubelet source, gRPC) rather than the enricher's own data."""
    from . import servers

    out: dict[str, float] = {}
    for name, kube, kubelet in (
        ("imports", True, False),
        ("imports_without_kubernetes", False, False),
        ("imports_with_kubelet_grpc", True, True),
    ):
        child = start(servers.run_import_floor, kube, kubelet)
        try:
            time.sleep(0.3)
            out[name] = round(child.rss_mib(), 1)
            if mappings is not None:
                mappings[name] = rss_by_mapping(child.proc.pid)
        finally:
            child.stop()
    return out


def bench_memory(
    mode: Mode,
    sim: BenchNode,
    kube: Any,
    upstream: Child,
    start_enricher: Callable[[], Child],
    start_without_kube: Callable[[], Child],
) -> dict[str, Any]:
    from enricher.simnode.api import pod_object

    upstream.ask(("every", 1))  # new values on every scrape: the rewrite runs every time
    floor_maps: dict[str, dict[str, int]] = {}
    floors = import_floors(floor_maps)
    without_kube = _rss_without_kube(mode, start_without_kube)
    enricher = start_enricher()
    try:
        time.sleep(0.5)
        rss: dict[str, float] = {"start": enricher.rss_mib()}
        start_maps = rss_by_mapping(enricher.proc.pid)
        modules = enricher.ask("modules") or []
        foreign = sorted(set(modules) & {"pytest", "_pytest", "hypothesis", "tests", "bench"})
        first, last = mode.memory_checkpoints
        mid = (first + last) // 2  # shows whether growth levels off or goes on

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                for n in range(1, last + 1):
                    await _get(session, enricher.url, GZIP)  # as Prometheus asks
                    if n in (first, mid, last):
                        rss[str(n)] = enricher.rss_mib()
                    if n % mode.churn_every == 0 and n < last:
                        removed, added = sim.churn(mode.churn_pods)
                        for uid in removed:
                            kube.delete_pod(uid)
                        for pod in added:
                            kube.add_pod(pod_object(pod, NODE))
                        if upstream.ask(("epoch", sim.generation)) != sim.generation:
                            raise RuntimeError("the upstream did not switch epochs")

        t0 = time.perf_counter()
        asyncio.run(run())
        elapsed = time.perf_counter() - t0
        growth = (rss[str(last)] - rss[str(first)]) / rss[str(first)]
        end_maps = rss_by_mapping(enricher.proc.pid)
        return {
            "scrapes": last,
            "churns": last // mode.churn_every - (1 if last % mode.churn_every == 0 else 0),
            "pods": sim.n_pods,
            "rss_mib": {k: round(v, 1) for k, v in rss.items()},
            "peak_rss_mib": round(enricher.hwm_mib(), 1),
            "growth": round(growth, 4),
            "seconds": round(elapsed, 1),
            # Benchmark code in the enricher's process (only bench.servers' glue belongs there).
            "foreign_modules": foreign,
            "rss_without_kube_mib": without_kube,
            "floor_rss_mib": floors,
            # Where the RSS over the floor with gRPC is, by mapping, at start and at the end.
            "rss_over_floor_by_mapping": rss_over_floor(
                floor_maps["imports_with_kubelet_grpc"], start_maps, end_maps
            ),
        }
    finally:
        enricher.stop()


# --------------------------------------------------------------------------- report


@dataclass
class Check:
    name: str
    target: str
    measured: str
    ok: bool


@dataclass
class Report:
    results: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)


def evaluate(results: dict[str, Any], mode: Mode) -> list[Check]:
    checks: list[Check] = []
    mig = results["rewrite"]["payloads"]["mig56"]
    checks.append(
        Check(
            "rewrite mig56 vs naive",
            f">= {TARGET_NAIVE_SPEEDUP:g}x faster",
            f"{mig['naive_speedup']}x",
            mig["naive_speedup"] >= TARGET_NAIVE_SPEEDUP,
        )
    )
    checks.append(
        Check(
            "rewrite mig56 vs limit",
            f"<= {TARGET_LIMIT_RATIO:g} limit passes",
            f"{mig['limit_ratio']}",
            mig["limit_ratio"] <= TARGET_LIMIT_RATIO,
        )
    )
    for rhythm, value in RHYTHMS:
        e2e = results["e2e"][f"{rhythm}_{value:g}"]
        seq, conc = e2e["sequential"], e2e["concurrent3"]
        for name in ENRICHERS[:1]:  # the others are shown, not targets
            if name not in seq:
                continue
            ratios = [
                seq[f"{name}_vs_proxy_p50"],
                seq[f"{name}_vs_proxy_p99"],
                conc[f"{name}_vs_proxy_p50"],
                conc[f"{name}_vs_proxy_p99"],
            ]
            checks.append(
                Check(
                    f"e2e {name} / proxy, {_rhythm(rhythm, value)} (p50, p99; 3 scrapers)",
                    f"each <= {TARGET_E2E_RATIO:g}",
                    ", ".join(f"{r:.2f}" for r in ratios),
                    all(r <= TARGET_E2E_RATIO for r in ratios),
                )
            )
            if rhythm == "period":
                extra = seq[name]["age_max_s"] - seq["proxy"]["age_max_s"]
                allowed = results["e2e"]["follow_step_s"] + FRESHNESS_SLACK
                checks.append(
                    Check(
                        f"freshness {name}: oldest values served, beyond the proxy's",
                        f"<= {allowed * 1000:g} ms (step + one scrape)",
                        f"{extra * 1000:.0f} ms",
                        extra <= allowed,
                    )
                )
    attr = results["attribution"]["node8"]
    checks.append(
        Check(
            "attribution 64 procs / 8 GPUs",
            f"< {TARGET_ATTRIBUTION_MS:g} ms",
            f"{attr['p50_ms']} ms",
            attr["p50_ms"] < TARGET_ATTRIBUTION_MS,
        )
    )
    mem = results["memory"]
    first, last = (str(c) for c in mode.memory_checkpoints)
    peak = max(mem["rss_mib"].values())
    checks.append(Check("RSS", f"< {TARGET_RSS_MIB:g} MiB", f"{peak} MiB", peak < TARGET_RSS_MIB))
    checks.append(
        Check(
            f"RSS growth {first} -> {last}",
            f"< {TARGET_RSS_GROWTH:.0%}",
            f"{mem['growth']:.2%}",
            mem["growth"] < TARGET_RSS_GROWTH,
        )
    )
    ratio = attr["p50_ms"] / attr["stat_reads_floor_p50_ms"]
    checks.append(
        Check(
            "attribution 64 procs / 8 GPUs vs bare /proc reads",
            f"<= {TARGET_ATTRIBUTION_FLOOR_RATIO:g}x the stat reads (new)",
            f"{ratio:.2f}x ({attr['p50_ms']} / {attr['stat_reads_floor_p50_ms']} ms)",
            ratio <= TARGET_ATTRIBUTION_FLOOR_RATIO,
        )
    )
    floor = mem["floor_rss_mib"]["imports_with_kubelet_grpc"]
    steady = mem["rss_mib"][last]
    checks.append(
        Check(
            "RSS over the import floor, every source on",
            f"<= floor {floor} + {TARGET_RSS_OVER_FLOOR_MIB:g} MiB (new)",
            f"+{steady - floor:.1f} MiB ({steady} MiB)",
            steady - floor <= TARGET_RSS_OVER_FLOOR_MIB,
        )
    )
    drift = mem["rss_mib"][last] - mem["rss_mib"][first]
    checks.append(
        Check(
            f"RSS drift {first} -> {last}",
            f"<= {TARGET_RSS_DRIFT_MIB:g} MiB (new)",
            f"{drift:+.1f} MiB",
            drift <= TARGET_RSS_DRIFT_MIB,
        )
    )
    cost = results["cost"]
    checks.append(
        Check(
            "CPU enricher / proxy, same scrapes",
            f"<= {TARGET_CPU_RATIO:g}x (new)",
            f"{cost['cpu_ratio']:.2f}x ({cost['enricher']['cpu_s']} / {cost['proxy']['cpu_s']} s)",
            cost["cpu_ratio"] <= TARGET_CPU_RATIO,
        )
    )
    per = cost["enricher"]["upstream_requests_per_collection"]
    checks.append(
        Check(
            "upstream requests per collection, steady",
            f"<= {TARGET_UPSTREAM_PER_COLLECTION:g} (new; was 7)",
            f"{per}",
            per <= TARGET_UPSTREAM_PER_COLLECTION,
        )
    )
    fraction = cost["gzip_fraction"]
    checks.append(
        Check(
            "bytes on the wire, gzip / identity body, mig56",
            f"<= 1/{1 / TARGET_GZIP_FRACTION:g} (new)",
            f"1/{1 / fraction:.1f} ({cost['enricher']['wire_bytes_per_scrape']} of "
            f"{cost['identity_body_bytes']} bytes)",
            fraction <= TARGET_GZIP_FRACTION and cost["enricher"]["gzip"] > 0,
        )
    )
    k = results["rewrite"]["scaling_exponent"]
    checks.append(
        Check(
            "rewrite cost ~ series^k",
            f"k <= {TARGET_SCALING_EXPONENT:g}",
            f"k = {k}",
            k <= TARGET_SCALING_EXPONENT,
        )
    )
    return checks


def _rhythm(rhythm: str, value: float) -> str:
    if rhythm == "period":
        return f"new values every {value:g} s"
    n = int(value)
    return "new values on every fetch" if n == 1 else f"new values on every {n}th fetch"


def mode_first(results: dict[str, Any]) -> int:
    return {"quick": QUICK, "long": LONG}.get(results["mode"], FULL).memory_checkpoints[0]


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def render_table(results: dict[str, Any], checks: list[Check]) -> str:
    lines: list[str] = []
    rw = results["rewrite"]["payloads"]
    lines.append("Rewrite (median ms; values change on every call)")
    lines.append(
        f"{'payload':8} {'series':>7} {'KiB':>6} {'limit':>8} {'rewrite':>8} {'xlimit':>7} "
        f"{'line-by-line':>12} {'1st scrape':>10} {'naive':>9} {'xnaive':>7} {'ns/series':>9}"
    )
    for name, r in rw.items():
        lines.append(
            f"{name:8} {r['series']:>7} {r['bytes'] // 1024:>6} {r['limit_ms']:>8.3f} "
            f"{r['rewrite_ms']:>8.3f} {r['limit_ratio']:>7.2f} {r['line_by_line_ms']:>12.3f} "
            f"{r['first_scrape_ms']:>10.3f} {_num(r['naive_ms'], 9, 1)} "
            f"{_num(r['naive_speedup'], 7, 1)} "
            f"{r['rewrite_per_series_ns']:>9.1f}"
        )
    lines.append(
        f"scaling exponent (cost ~ series^k, gpu1..stress): k = "
        f"{results['rewrite']['scaling_exponent']} (limit pass: "
        f"{results['rewrite']['limit_scaling_exponent']})"
    )
    for rhythm, value in RHYTHMS:
        e2e = results["e2e"][f"{rhythm}_{value:g}"]
        lines.append("")
        lines.append(
            f"End to end, GET /metrics of mig56, {_rhythm(rhythm, value)} "
            f"(ms; {e2e['requests']} requests each)"
        )
        lines.append(
            f"{'target':18} {'p50':>7} {'p99':>7} {'3x p50':>7} {'3x p99':>7} "
            f"{'age p50':>8} {'age max':>8}  inside: fetch rewrite scrape"
        )
        seq, conc = e2e["sequential"], e2e["concurrent3"]
        for name in ("upstream", "proxy", *ENRICHERS):
            if name not in seq:
                continue
            s_, c_ = seq[name], conc[name]
            inside = e2e.get(f"{name}_inside_ms") or {}
            detail = " ".join(f"{inside.get(k, 0):>6.3f}" for k in ("fetch", "rewrite", "scrape"))
            lines.append(
                f"{name:18} {s_['p50_ms']:>7.2f} {s_['p99_ms']:>7.2f} {c_['p50_ms']:>7.2f} "
                f"{c_['p99_ms']:>7.2f} {s_.get('age_p50_s', 0):>8.3f} "
                f"{s_.get('age_max_s', 0):>8.3f}" + (f"  {detail}" if inside else "")
            )
        for name in ENRICHERS:
            if name not in seq:
                continue
            lines.append(
                f"{name + ' / proxy':18} {seq[f'{name}_vs_proxy_p50']:>7.2f} "
                f"{seq[f'{name}_vs_proxy_p99']:>7.2f} {conc[f'{name}_vs_proxy_p50']:>7.2f} "
                f"{conc[f'{name}_vs_proxy_p99']:>7.2f}"
            )
    lines.append(
        "enricher: the app as shipped: dcgm-exporter fetched right after each of its "
        f"collections (step {results['e2e']['follow_step_s'] * 1000:g} ms), the node side "
        "(NVML, procfs, kubelet) read with it, scrapes served from what is ready; it follows "
        "a collection rhythm, so it runs in the last table only. enricher_background: "
        "--upstream.follow-step=0 --collect.interval="
        f"{results['e2e']['collect_interval_s']:g} (upstream on every scrape, node side in the "
        "background). enricher_per_scrape: --upstream.follow-step=0 (everything on every "
        "scrape). age: of the upstream values served (s). inside: medians in the enricher's "
        "process."
    )
    lines.append("")
    lines.append("Attribution (NVML fake + procfs + pod lookup, ms)")
    for name, a in results["attribution"].items():
        bare = a.get("nvml_calls_floor_p50_ms") if name == "node8" else None
        nvml_floor = "" if bare is None else f" (its driver calls bare: {bare:.3f})"
        lines.append(
            f"{name:8} {a['processes']} processes on {a['devices']} devices of {a['gpus']} GPUs: "
            f"p50 {a['p50_ms']:.3f}, p99 {a['p99_ms']:.3f} ({a['attributed']} attributed); "
            f"p50 of NVML {a['nvml_p50_ms']:.3f}{nvml_floor}, procfs {a['procfs_p50_ms']:.3f} "
            f"(bare reads of the stat files: {a['stat_reads_floor_p50_ms']:.3f}), "
            f"lookup {a['lookup_p50_ms']:.3f}"
        )
    mem = results["memory"]
    lines.append("")
    lines.append(
        f"Memory (enricher RSS MiB, mig56, {mem['pods']} pods, {mem['churns']} churns, "
        f"{mem['seconds']} s)"
    )
    lines.append(
        "  "
        + ", ".join(f"after {k}: {v}" for k, v in mem["rss_mib"].items())
        + f"; peak {mem['peak_rss_mib']}; growth {mem['growth']:.2%}"
    )
    lines.append(
        f"  without the pod watch (no kubernetes client): {mem['rss_without_kube_mib']} after "
        f"{mode_first(results)} scrapes"
    )
    floor = mem["floor_rss_mib"]
    lines.append(
        f"  floor, a process importing what the enricher imports and nothing more: "
        f"{floor['imports']} (without the kubernetes client {floor['imports_without_kubernetes']}"
        f"; with the kubelet source's gRPC, as on a node: {floor['imports_with_kubelet_grpc']})"
    )
    lines.append(
        f"  where the RSS over the floor with gRPC is (MiB; at start, after {mem['scrapes']} "
        "scrapes):"
    )
    for row in mem["rss_over_floor_by_mapping"]:
        lines.append(
            f"    {row['mapping'][:40]:40} floor {row['floor']:7.2f}  start {row['start']:7.2f}"
            f"  end {row['end']:7.2f}  over {row['over_floor']:+7.2f}"
        )
    if "growth" in results:
        from .growth import render_growth

        lines.append("")
        lines.extend(render_growth(results["growth"]))
    if "loop" in results:
        lines.append("")
        lines.extend(render_loop(results["loop"]))
    if "cost" in results:
        lines.append("")
        lines.extend(render_cost(results["cost"]))
    lines.append("")
    lines.append("Targets")
    for c in checks:
        lines.append(f"  [{'ok' if c.ok else 'MISS'}] {c.name}: {c.measured} (target {c.target})")
    return "\n".join(lines)


def render_cost(cost: dict[str, Any]) -> list[str]:
    lines = [
        f"Cost to the node (mig56, upstream collecting every {cost['period_s']:g} s, "
        f"{COST_SCRAPERS} scrapers each asking every {COST_SCRAPE_EVERY:g} s with gzip; "
        f"{cost['window_s']} s steady window after {cost['learn_s']:g} s)",
        f"{'target':10} {'scrapes':>7} {'CPU s':>7} {'ms/scrape':>9} {'upstream':>8} "
        f"{'/collection':>11} {'bytes/scrape':>12} {'gzip':>5} {'age max':>8}",
    ]
    for name in ("proxy", "enricher"):
        r = cost[name]
        age = "-" if r["age_max_s"] is None else f"{r['age_max_s']:.3f}"
        lines.append(
            f"{name:10} {r['scrapes']:>7} {r['cpu_s']:>7.3f} {r['cpu_ms_per_scrape']:>9.3f} "
            f"{r['upstream_requests']:>8} {r['upstream_requests_per_collection']:>11.2f} "
            f"{r['wire_bytes_per_scrape']:>12} {r['gzip']:>5} {age:>8}"
        )
    lines.append(
        f"enricher / proxy CPU: {cost['cpu_ratio']:.2f}; gzip body / identity body "
        f"({cost['identity_body_bytes']} bytes): {cost['gzip_fraction']:.4f}"
    )
    return lines


def render_breakdown(where: dict[str, Any]) -> list[str]:
    """The instrumented cost run: milliseconds of CPU per collection, by event-loop callback
    (these add up to the loop's time), by function (inside those, or in worker threads) and
    in the garbage collector (inside both)."""
    lines = [
        "Where the enricher's CPU goes (ms per collection, instrumented run; "
        f"{where['enricher_cpu_ms_per_collection']:.3f} in all, every thread)"
    ]
    for table, title in (
        ("loop", "event loop, by callback"),
        ("functions", "by function (inside the above, or in threads)"),
        ("gc", "garbage collector"),
    ):
        lines.append(f"  {title}")
        for name, ms in list(where[table].items())[:12]:
            lines.append(f"    {ms:>8.3f}  {name}")
        if not where[table]:
            lines.append("    (none in the window)")
    return lines


def render_loop(loop: dict[str, Any]) -> list[str]:
    lines = [
        f"Event loop: GET /healthz (ms; one every {loop['healthz_every_ms']:g} ms) while "
        f"/metrics ({loop['values_worker']['body_mib']} MiB served, upstream body "
        f"{loop['shape']}) is scraped back to back"
    ]
    lines.append(
        f"{'bodies differ in, rewrite':26} {'n':>5} {'p50':>7} {'p99':>7} {'max':>7}  "
        f"{'idle p50':>8} {'idle max':>8}  scrape p50  rewrite p50"
    )
    for kind in ("values", "labels"):
        for design in ("worker", "on_loop"):
            row = loop[f"{kind}_{design}"]
            busy, idle = row["busy"], row["idle"]
            lines.append(
                f"{kind + ', ' + design:26} {busy['n']:>5} {busy['p50_ms']:>7.2f} "
                f"{busy['p99_ms']:>7.2f} {busy['max_ms']:>7.1f}  {idle['p50_ms']:>8.2f} "
                f"{idle['max_ms']:>8.1f}  {row['scrape_p50_ms']:>10.1f}  "
                f"{row['inside_ms'].get('rewrite', 0):>11.1f}"
            )
    lines.append(
        f"/healthz max, worker / on the loop: values {loop['values_max_ratio']}, labels "
        f"{loop['labels_max_ratio']}. worker: as shipped (bodies over "
        "enricher.pipeline.REWRITE_INLINE_MAX_CHARS rewritten in a thread); on_loop: every rewrite "
        "on the event loop, the design before."
    )
    return lines


# --------------------------------------------------------------------------- main


ALL_PARTS = ("rewrite", "attribution", "growth", "e2e", "memory", "loop", "cost")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="run every part briefly (smoke test)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    parser.add_argument(
        "--only",
        choices=(*ALL_PARTS, "fleet"),
        action="append",
        help="run only these parts (repeatable); targets are checked on the full run; "
        "fleet (a simulated fleet on Prometheus 3.5, bench/fleet.py) runs only when named",
    )
    parser.add_argument(
        "--fleet-nodes",
        type=int,
        default=100,
        help="nodes of the simulated fleet (--only fleet; --quick: 8)",
    )
    parser.add_argument(
        "--fleet-reps",
        type=int,
        default=7,
        help="times each query of the fleet is measured (--only fleet; --quick: 2)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="run the cost part once more with the enricher counting where its CPU goes",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help="the full run with the memory part to 30,000 scrapes (RSS drift 3,000 -> 30,000)",
    )
    args = parser.parse_args(argv)
    if args.quick and args.long:
        parser.error("--quick and --long exclude each other")
    if shutil.which("gcc") is None:
        parser.error("gcc is needed to build the fake libnvidia-ml (make system-deps)")
    mode = QUICK if args.quick else LONG if args.long else FULL
    parts = set(args.only or ALL_PARTS)

    from devkit.kubeapi import KubeApiStandIn
    from devkit.nvmlfake import build_fake_nvml

    from . import servers

    started = time.perf_counter()
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "long" if args.long else "full",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="enricher-bench-") as tmp:
        work = Path(tmp)
        nvml_lib = build_fake_nvml(work / "fakenvml")
        if "rewrite" in parts:
            print("rewrite ...", file=sys.stderr, flush=True)
            results["rewrite"] = bench_rewrite(mode)
        if "attribution" in parts:
            print("attribution ...", file=sys.stderr, flush=True)
            results["attribution"] = bench_attribution(mode, work, nvml_lib)
        if "growth" in parts:
            from .growth import bench_growth

            print("growth ...", file=sys.stderr, flush=True)
            results["growth"] = bench_growth(args.quick, work, nvml_lib)
        if "fleet" in parts:
            from .fleet import bench_fleet

            print("fleet ...", file=sys.stderr, flush=True)
            results["fleet"] = bench_fleet(
                args.quick, work / "fleet", args.fleet_nodes, args.fleet_reps
            )
        if parts & {"e2e", "memory", "loop", "cost"}:
            sim = BenchNode(work / "node", payloads.SHAPES["mig56"])
            sim.write()
            with KubeApiStandIn() as kube:
                for obj in sim.pod_objects():
                    kube.add_pod(obj)
                kubeconfig = work / "kubeconfig"
                _write_kubeconfig(kubeconfig, kube.url)
                upstream = start(servers.run_upstream, "mig56")
                spec = servers.EnricherSpec(
                    upstream_url=upstream.url,
                    procfs=str(sim.proc_root),
                    nvml_library=str(nvml_lib),
                    nvml_state=str(sim.nvml_state),
                    kubeconfig=str(kubeconfig),
                    node_name=NODE,
                )
                try:
                    if "e2e" in parts:
                        print("end to end ...", file=sys.stderr, flush=True)
                        results["e2e"] = run_e2e(mode, upstream, spec)
                    if "memory" in parts:
                        print("memory ...", file=sys.stderr, flush=True)
                        # Every source on: the pod watch and the kubelet's PodResources (gRPC).
                        kubelet = start_kubelet(sim, work / "kubelet.sock")
                        try:
                            every = replace(
                                spec, kubelet_socket=str(work / "kubelet.sock"), timings=False
                            )
                            results["memory"] = bench_memory(
                                mode,
                                sim,
                                kube,
                                upstream,
                                lambda: start(servers.run_enricher, every),
                                lambda: start(
                                    servers.run_enricher, replace(spec, kube=False, timings=False)
                                ),
                            )
                            results["memory"]["kubelet_calls"] = kubelet.calls
                        finally:
                            kubelet.stop(grace=None)
                    if "loop" in parts:
                        print("event loop ...", file=sys.stderr, flush=True)
                        results["loop"] = bench_loop(mode, spec)
                    if "cost" in parts:
                        print("cost ...", file=sys.stderr, flush=True)
                        results["cost"] = bench_cost(mode, spec)
                        if args.breakdown:
                            print("cost, instrumented ...", file=sys.stderr, flush=True)
                            counted = bench_cost(mode, spec, breakdown=True)
                            results["cost_breakdown"] = {
                                "enricher_cpu_ms_per_collection": counted["enricher"][
                                    "cpu_ms_per_collection"
                                ],
                                **counted["breakdown_ms_per_collection"],
                            }
                finally:
                    upstream.stop()
    results["seconds"] = round(time.perf_counter() - started, 1)
    checks: list[Check] = []
    if parts == set(ALL_PARTS):
        checks = evaluate(results, mode)
        results["targets"] = [c.__dict__ for c in checks]
        print(render_table(results, checks))
    else:
        print(json.dumps(results, indent=2))
        if "loop" in results:
            print("\n" + "\n".join(render_loop(results["loop"])))
        if "growth" in results:
            from .growth import render_growth

            print("\n" + "\n".join(render_growth(results["growth"])))
        if "fleet" in results:
            from .fleet import render_fleet

            print("\n" + "\n".join(render_fleet(results["fleet"])))
    if "cost_breakdown" in results:
        print("\n" + "\n".join(render_breakdown(results["cost_breakdown"])))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten: {args.out} ({results['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
