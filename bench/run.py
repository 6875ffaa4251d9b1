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
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import payloads
from .attribution import bench_attribution
from .children import start
from .cost import bench_cost
from .e2e import run_e2e
from .loop import bench_loop
from .memory import bench_memory, start_kubelet
from .modes import FULL, LONG, QUICK
from .node import NODE, BenchNode
from .report import Check, evaluate, render_breakdown, render_loop, render_table
from .rewrite import bench_rewrite

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "latest.json"


def _write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: bench\n  cluster:\n    server: {url}\n"
        "users:\n- name: bench\n  user: {}\n"
        "contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\n"
        "current-context: bench\n"
    )


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
