"""The memory part: the enricher's RSS (every source on: the pod watch and a gRPC kubelet)
after start and after thousands of scrapes while pods churn, against the floor of its
imports, by mapping (``bench_memory``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from . import payloads
from .children import Child, start
from .e2e import GZIP, scrape
from .modes import Mode
from .node import NODE, BenchNode


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


def _rss_without_kube(mode: Mode, start_enricher: Callable[[], Child]) -> float:
    """RSS after scrapes of an enricher without the pod watch: what the kubernetes client
    costs is the difference."""
    enricher = start_enricher()
    try:

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                for _ in range(mode.memory_checkpoints[0]):
                    await scrape(session, enricher.url)

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
                    await scrape(session, enricher.url, GZIP)  # as Prometheus asks
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
