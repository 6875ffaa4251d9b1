"""A simulated fleet on a real Prometheus 3.5 (``python -m bench --only fleet``): what the
recording rules, the alerts and the dashboard cost on one Prometheus holding many GPU nodes.

**Bodies.** No series is written by hand: each node kind's ``/metrics`` is rendered by the real
enricher's rewrite on a simulated node, a few times (one body per collection, values moving):

- ``demo``: the demo's node (``enricher.demo.start_demo``: 8 GPUs with a training job,
  time-slicing, MIG with a host process, a Jupyter pod that never asked, MPS, an idle
  allocation, a finished job holding memory, a DRA claim), scraped through its ``Scraper``
  with the simulated clock moved one collection each time;
- ``node8``: the benchmark's busy whole-GPU node (:class:`bench.node.BenchNode` on payload shape
  ``node8``: 8 GPUs with the profiling counters, 110 pods, 64 GPU processes), read by the real
  ``Scraper`` against the payload's upstream (as ``bench/growth.py`` reads its nodes).

**Many nodes from a few bodies.** Node ``i`` of the fleet takes kind ``KINDS[i % 4]`` (three
``demo`` nodes for one ``node8``) and gets its own identity by substitution in the rendered
text: its node name for dcgm-exporter's host label (``Hostname`` or ``hostname``), the demo's
node name and the bench's (the enricher's ``node``), GPU and MIG UUIDs with the node's number
in their first four hex digits, and a pod suffix (on
``pod`` and ``pod_uid`` values) that names the node and the pod generation. Pods churn: every
node replaces all its pods once an hour (its generation changes at a point of the hour of its
own, so the fleet churns evenly), about the 10 GPU pods an hour per node docs/performance.md
budgets for. Values at sample ``j`` are those of rendered body ``j mod K``; counters
(``# TYPE ... counter``) grow by their mean step per body instead, so that rates see no resets.
Each series carries what Prometheus would add scraping it with ``honor_labels``: ``job``,
``instance``, ``cluster`` (two clusters, alternating nodes), and ``node`` where the body has none.

**Data.** One hour at a 30 s interval before the run (``promtool tsdb
create-blocks-from openmetrics`` of Prometheus 3.5, into the data folder), the shipped
recording rules evaluated over that hour (``promtool tsdb create-blocks-from rules`` against a
Prometheus on those blocks, into the same folder: the panels that read records have the hour
the raw series have), then Prometheus 3.5 starts on that folder with the shipped rules
(evaluation every 30 s) and scrapes the same nodes, served by this process at their current
generation, every 30 s for a few scrapes: history
from blocks (an hour of it in minutes), ingest, the head and the rule evaluations from a live
Prometheus. Why not only live scraping: an hour of data would take an hour; why not only
blocks: a Prometheus that scrapes nothing has no ingest and an empty head.

**Measured** (HTTP API): ingest (``prometheus_tsdb_head_samples_appended_total`` over the live
window, head series from ``/api/v1/status/tsdb``, RSS and its peak from ``/proc``), each rule
group's ``evaluationTime`` (the largest seen over the live window), every dashboard query
(variables on All) over the dashboard's default range (``now-6h``) at a 30 s step (the scrape
interval: Grafana's step at that range on a wide panel, raised to the data source's scrape
interval) as Grafana asks (range queries for time series, instant ones for stats and tables),
the whole dashboard's load (every query at once, six at a time, as a browser's connections to
Grafana allow), and each alert expression as an instant query. Each figure is also a ratio to
the baseline ``sum`` of the gpu_util field over the same range (instant for instant queries;
the field under every name it has had, as every panel reads a field: ``BASELINE``)
measured in the same run, interleaved with the queries. The panel queries and alerts a fix
replaced are measured beside the shipped ones in the same run (``BEFORE``, ``ALERTS_BEFORE``)
and checked to answer the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit import dashboard, fieldquery, prometheus
from devkit.dashboard import RULES
from devkit.prometheus import Server
from devkit.upstream import TextServer

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS3_DIR = ROOT / ".cache" / "prometheus-3"

INTERVAL = 30  # seconds: scrape, evaluation and sample interval
HISTORY_S = 3600  # the blocks' span
CHURN_S = 3600  # every node replaces its pods once per CHURN_S
KINDS = ("demo", "demo", "node8", "demo")
CLUSTERS = ("east", "west")
# The simplest query over a device field, as the dashboards read one: every name it has had,
# each summed, then scaled to the SI unit (devkit/fieldquery.aggregate: on a 4.8 fleet it
# costs what sum(<the 4.8 name>) does; sum(<name> / 100) costs several times that).
BASELINE = fieldquery.aggregate("gpu_util", "sum", "")
DASHBOARD_RANGE_S = 6 * 3600  # the dashboard's default time range: now-6h
STEP_S = INTERVAL
# Grafana's built-ins at that range and step: $__rate_interval = max(4 x scrape interval,
# step + scrape interval).
BUILTINS = {"__range": "6h", "__rate_interval": "2m", "__interval": "30s"}
BROWSER_CONNECTIONS = 6
FLOOR_SLACK = 1.5  # a panel within 1.5x its floor (FLOORS) costs what its answer costs
BOARD_RATIO = 5  # a dashboard opened with its defaults: within 5x the range baseline
MAX_SERIES = 500  # and no panel of it returning more series


@dataclass(frozen=True)
class FleetMode:
    nodes: int
    variants: int  # bodies rendered per kind
    reps: int  # repetitions of each query
    live_scrapes: int  # scrapes of the live window


FLEET_QUICK = FleetMode(nodes=8, variants=3, reps=2, live_scrapes=1)


def fleet_mode(nodes: int, quick: bool, reps: int = 7) -> FleetMode:
    if quick:
        return FLEET_QUICK
    return FleetMode(nodes=nodes, variants=4, reps=reps, live_scrapes=3)


# --------------------------------------------------------------------------- the bodies


@dataclass
class Body:
    """One node kind's rendered bodies, as series (name and label block) and K values each."""

    kind: str
    series: list[str] = field(default_factory=list)  # `name{labels}` as the enricher wrote it
    values: list[list[float]] = field(default_factory=list)  # per series, one per variant
    counter: list[bool] = field(default_factory=list)


def parse_bodies(kind: str, texts: list[str]) -> Body:
    """The series of ``texts`` (bodies of one node, consecutive collections) and their values;
    a series missing from a later body keeps its first value."""
    counters: set[str] = set()
    rows: dict[str, list[float]] = {}
    for k, text in enumerate(texts):
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind_ = line.split(" ", 3)
                if kind_ == "counter":
                    counters.update((name, name + "_total"))
                continue
            if not line or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            row = rows.setdefault(head, [])
            row.extend([float(value)] * (k + 1 - len(row)))
    body = Body(kind)
    for head, row in rows.items():
        row.extend([row[-1]] * (len(texts) - len(row)))
        body.series.append(head)
        body.values.append(row)
        body.counter.append(head.split("{", 1)[0] in counters)
    return body


async def _demo_texts(work: Path, variants: int) -> list[str]:
    from enricher import demo
    from enricher.config import Config

    now = [1_800_000_000.0]
    socket_path = work / "demo-kubelet" / "kubelet.sock"
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    scraper, runners, kubelet = await demo.start_demo(
        Config(listen_address="127.0.0.1:0", upstream_follow_step=0.0),
        work / "demo-proc",
        socket_path,
        clock=lambda: now[0],
    )
    texts = []
    try:
        for k in range(variants):
            now[0] = 1_800_000_000.0 + INTERVAL * k
            texts.append((await scraper.scrape()).body.decode())
    finally:
        for runner in runners:
            await runner.cleanup()
        kubelet.stop()
        await scraper.close()
    return texts


def _node8_texts(work: Path, variants: int) -> list[str]:
    from devkit.nvmlfake import build_fake_nvml

    from . import payloads
    from .children import start
    from .growth import Point
    from .node import BenchNode
    from .servers import run_upstream, use_fake_nvml

    shape = payloads.SHAPES["node8"]
    nvml_lib = build_fake_nvml(work / "fakenvml")
    sim = BenchNode(work / "node8", shape)
    sim.write()
    use_fake_nvml(str(sim.nvml_state))
    upstream = start(run_upstream, shape)
    try:
        point = Point(sim, upstream.url, nvml_lib)

        async def scrape_all() -> list[str]:
            scraper = point.scraper()
            try:
                return [(await scraper.scrape()).body.decode() for _ in range(variants)]
            finally:
                await scraper.close()

        return asyncio.run(scrape_all())
    finally:
        upstream.stop()


def render_bodies(work: Path, variants: int) -> dict[str, Body]:
    """Each kind's bodies, from the real enricher on its simulated node."""
    return {
        "demo": parse_bodies("demo", asyncio.run(_demo_texts(work, variants))),
        "node8": parse_bodies("node8", _node8_texts(work, variants)),
    }


# --------------------------------------------------------------------------- many nodes

_UUID_RE = re.compile(r"((?:GPU|MIG)-)[0-9a-f]{4}")
_POD_RE = re.compile(r'\b(pod|pod_uid)="([^"]+)"')
_NODE_NAMES = (
    "demo-gpu-node-1",
    "dcgm-exporter-demo",
    "gpu-node-bench",
    "nvidia-dcgm-exporter-x7k2p",
)


def node_name(i: int) -> str:
    return f"gpu-node-{i:04d}"


def target_labels(i: int) -> dict[str, str]:
    return {
        "cluster": CLUSTERS[i % len(CLUSTERS)],
        "instance": f"{node_name(i)}:9400",
        "job": "dcgm-enricher",
    }


class Fleet:
    """The fleet's nodes: node ``i``'s series at its pod generation, ready to print."""

    def __init__(self, bodies: dict[str, Body], nodes: int) -> None:
        self.bodies = bodies
        self.nodes = nodes
        self._cache: dict[tuple[int, int], list[str]] = {}

    def kind(self, i: int) -> Body:
        return self.bodies[KINDS[i % len(KINDS)]]

    def generation(self, i: int, t: float) -> int:
        offset = (i * CHURN_S) // max(self.nodes, 1)
        return int((t + offset) // CHURN_S)

    def heads(self, i: int, generation: int, *, with_target: bool) -> list[str]:
        """Node ``i``'s series (name and labels) at pod ``generation``."""
        key = (i, generation if with_target else -1 - generation)
        if key in self._cache:
            return self._cache[key]
        name = node_name(i)
        suffix = f"-n{i}g{generation}"
        extra = target_labels(i)
        out = []
        for head in self.kind(i).series:
            for old in _NODE_NAMES:
                head = head.replace(f'"{old}"', f'"{name}"')
            head = _UUID_RE.sub(lambda m: f"{m.group(1)}{i:04x}", head)
            head = _POD_RE.sub(lambda m: f'{m.group(1)}="{m.group(2)}{suffix}"', head)
            if with_target:
                labels = dict(extra)
                if ',node="' not in head and '{node="' not in head:
                    labels["node"] = name
                block = ",".join(f'{k}="{v}"' for k, v in labels.items())
                if head.endswith("}"):
                    head = head[:-1] + ("," if not head.endswith("{}") else "") + block + "}"
                else:
                    head = head + "{" + block + "}"
            out.append(head)
        if len(self._cache) > 4 * self.nodes:
            self._cache.clear()
        self._cache[key] = out
        return out

    def values(self, i: int, j: int) -> list[float]:
        """Node ``i``'s values at sample ``j`` (0 at the start of the history)."""
        body = self.kind(i)
        out = []
        for row, counter in zip(body.values, body.counter, strict=True):
            if counter:
                step = max((row[-1] - row[0]) / max(len(row) - 1, 1), 0.0)
                out.append(row[0] + step * j)
            else:
                out.append(row[j % len(row)])
        return out

    def write_openmetrics(self, path: Path, start: int, end: int) -> int:
        """Samples from ``start`` to ``end`` (excluded) every INTERVAL, as OpenMetrics; the
        number of samples written."""
        n = 0
        with path.open("w") as out:
            for t in range(start, end, INTERVAL):
                j = (t - start) // INTERVAL
                chunk: list[str] = []
                for i in range(self.nodes):
                    heads = self.heads(i, self.generation(i, t), with_target=True)
                    stamp = f" {t}\n"
                    chunk.extend(
                        f"{h} {_fmt(v)}{stamp}"
                        for h, v in zip(heads, self.values(i, j), strict=True)
                    )
                    chunk.append(f"up{{{_labels(i)}}} 1{stamp}")
                n += len(chunk)
                out.write("".join(chunk))
            out.write("# EOF\n")
        return n

    def body(self, i: int, t: float, j: int) -> bytes:
        """Node ``i``'s /metrics at ``t`` (sample ``j``), as Prometheus scrapes it."""
        heads = self.heads(i, self.generation(i, t), with_target=False)
        return "".join(
            f"{h} {_fmt(v)}\n" for h, v in zip(heads, self.values(i, j), strict=True)
        ).encode()


def _labels(i: int) -> str:
    return ",".join(f'{k}="{v}"' for k, v in {**target_labels(i), "node": node_name(i)}.items())


def _fmt(v: float) -> str:
    return (
        repr(v)
        if v == v and v not in (float("inf"), float("-inf"))
        else {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(v)]
    )


# --------------------------------------------------------------------------- Prometheus


def prometheus_bin(name: str) -> str:
    root = Path(os.environ.get("ENRICHER_PROMETHEUS3_DIR") or PROMETHEUS3_DIR)
    path = root / "usr" / "bin" / name
    if not path.is_file():
        raise SystemExit(f"Prometheus 3.5 is missing ({path}): .ci/prometheus3 unpacks it")
    return str(path)


def serve_fleet(fleet: Fleet, start: int) -> TextServer:
    """The fleet's /metrics, one path per node (``/node/<i>``), from a thread of this process."""

    def body(path: str) -> bytes:
        i = int(path.rsplit("/", 1)[1])
        now = time.time()
        return fleet.body(i, now, int(now - start) // INTERVAL)

    return TextServer(body)


def prometheus_config(nodes: int, port: int) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": f"{INTERVAL}s",
            "scrape_timeout": "10s",
            "evaluation_interval": f"{INTERVAL}s",
        },
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "dcgm-enricher",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        "labels": {
                            "__metrics_path__": f"/node/{i}",
                            "instance": target_labels(i)["instance"],
                            "cluster": target_labels(i)["cluster"],
                            "node": node_name(i),
                        },
                    }
                    for i in range(nodes)
                ],
            }
        ],
    }


@dataclass(frozen=True)
class Prom(Server):
    """The fleet's Prometheus: its API, what a query costs, its memory and its own metrics."""

    def get(self, path: str, timeout: float = 120, **params: str) -> Any:
        return self.api(path, timeout=timeout, **params)

    def timed(self, promql: str, instant: bool, end: float) -> tuple[float, int]:
        """Seconds the query took (as the client sees it) and the series it returned."""
        t0 = time.perf_counter()
        if instant:
            data = self.get("query", query=promql, time=str(end))
        else:
            data = self.get(
                "query_range",
                query=promql,
                start=str(end - DASHBOARD_RANGE_S),
                end=str(end),
                step=str(STEP_S),
            )
        return time.perf_counter() - t0, len(data["result"])

    def rss_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        kib = {
            k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.*)$", status, re.M)
        }
        return round(kib["VmRSS"] / 1024, 1), round(kib["VmHWM"] / 1024, 1)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextlib.contextmanager
def run_prometheus(config: dict[str, Any], data: Path) -> Iterator[Prom]:
    """Prometheus 3.5 running ``config`` on the TSDB in ``data`` (its config and log beside)."""
    with prometheus.serve(
        prometheus_bin("prometheus"),
        config,
        data.parent,
        storage=data,
        flags=["--storage.tsdb.retention.time=30d"],
        ready_seconds=120,
        stop_seconds=30,
    ) as server:
        yield Prom(server.url, server.log, server.pid)


def backfill_records(data: Path, start: int, end: int) -> int:
    """The shipped recording rules evaluated over the history (``promtool tsdb
    create-blocks-from rules`` against a Prometheus 3.5 on the blocks, which scrapes and
    evaluates nothing), their blocks moved into ``data``: the records the panels read have the
    hour the raw series have. A record that reads another record gets nothing (promtool
    evaluates every rule against the blocks as they were), as in any backfill; the dashboard's
    records read raw series only. The blocks written."""
    out = data.parent / "backfill"
    with run_prometheus({"global": {"scrape_interval": f"{INTERVAL}s"}}, data) as prom:
        subprocess.run(
            [
                prometheus_bin("promtool"),
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--start={start}",
                f"--end={end}",
                f"--url={prom.url}",
                f"--eval-interval={INTERVAL}s",
                f"--output-dir={out}",
                str(RULES),
            ],
            check=True,
            capture_output=True,
        )
    blocks = [b for b in out.iterdir() if (b / "meta.json").is_file()]
    for block in blocks:
        block.rename(data / block.name)
    return len(blocks)


# --------------------------------------------------------------------------- what is asked


@dataclass(frozen=True)
class Query:
    id: str
    expr: str
    instant: bool


# Panel queries as they were before the fixes this benchmark led to (grafana/generate.py before
# the dashboard's records, the rule group dcgm-enricher.dashboard), measured in the same run as
# the shipped ones (rows "<id> (before)") and checked to answer the same.
_DEV_FILTER = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'
_DEVICE = "cluster, node, gpu, GPU_I_ID"
_PODS_PER_DEVICE = (
    f"count by ({_DEVICE}) (count by ({_DEVICE}, ${{label_prefix}}namespace, "
    f"${{label_prefix}}pod) (gpu_container_memory_used_bytes{{{_DEV_FILTER}}}))"
)
_POD_FILTER = (
    'cluster=~"$cluster", node=~"$node", gpu=~"$gpu", '
    '${label_prefix}namespace=~"$namespace", ${label_prefix}pod=~"$pod"'
)
_OWNERS = (
    "max by (cluster, ${label_prefix}namespace, ${label_prefix}pod, workload_kind, "
    "workload_name, annotation_hub_jupyter_org_username) (gpu_pod_info{"
    'cluster=~"$cluster", workload_name=~"$workload", '
    'annotation_hub_jupyter_org_username=~"$user"%s})'
)


def _joined(metric: str, extra: str = "") -> str:
    """``metric`` per container joined to its pod's owners at every step (the old MEM, UTIL)."""
    return (
        f"{metric}{{{_POD_FILTER}}} * on (cluster, ${{label_prefix}}namespace, "
        "${label_prefix}pod) group_left (workload_kind, workload_name, "
        f"annotation_hub_jupyter_org_username) {_OWNERS % extra}"
    )


_MEM = _joined("gpu_container_memory_used_bytes")
_LAST_ACTIVE = (
    "max by (cluster, node, ${label_prefix}namespace, ${label_prefix}pod, "
    "${label_prefix}container) "
    f"(gpu_container_last_active_timestamp_seconds{{{_POD_FILTER}}}) * 1000"
)
_UTIL = _joined("gpu_container_utilization_ratio")
_FB_USED = fieldquery.read("fb_used", *_DEV_FILTER.split(", "))
_FB_FREE = fieldquery.read("fb_free", *_DEV_FILTER.split(", "))
_BY_POD = "cluster, ${label_prefix}namespace, ${label_prefix}pod"
# The panels by pod and Top pods left this list when the namespace dashboard took their top 20
# (topk): their answer is no longer the old form's. Their records' gain stays in
# docs/performance.md, and their floors (FLOORS) are the uncapped answers.
BEFORE = {
    "cluster/By namespace/GPU memory by namespace/A": (
        f"sum by (cluster, ${{label_prefix}}namespace) ({_MEM})"
    ),
    "namespace/Pods/GPU memory by workload/A": (
        f"sum by (cluster, ${{label_prefix}}namespace, workload_kind, workload_name) ({_MEM})"
    ),
    "namespace/Pods/GPU memory by user/A": "sum by (cluster, annotation_hub_jupyter_org_username) ("
    + _joined("gpu_container_memory_used_bytes", ', annotation_hub_jupyter_org_username!=""')
    + ")",
    "cluster/By namespace/SM utilization by namespace/A": (
        f"sum by (cluster, ${{label_prefix}}namespace) ({_UTIL})"
    ),
    # The peak of each pod's memory per device over the range, its owners met once.
    # Before the per-device records of the dcgm-enricher.dashboard group: the pods (or
    # containers) of every device counted at every step, the memory ratio from three reads.
    "node/Sharing: MIG, MPS, time-slicing/Pods per shared device/A": f"{_PODS_PER_DEVICE} > 1",
    "node/Sharing: MIG, MPS, time-slicing/Memory split on shared devices/A": (
        f"sum by ({_DEVICE}, ${{label_prefix}}namespace, ${{label_prefix}}pod) "
        f"(gpu_container_memory_used_bytes{{{_DEV_FILTER}}}) and on ({_DEVICE}) "
        f"({_PODS_PER_DEVICE} > 1)"
    ),
    "node/Sharing: MIG, MPS, time-slicing/SM split on shared devices/A": (
        f"sum by ({_DEVICE}, ${{label_prefix}}namespace, ${{label_prefix}}pod) "
        f"(gpu_container_utilization_ratio{{{_DEV_FILTER}}}) and on ({_DEVICE}) "
        f"({_PODS_PER_DEVICE} > 1)"
    ),
    "cluster/By namespace/Allocated and in use, by namespace/B": (
        f"sum by (cluster, ${{label_prefix}}namespace) (count by ({_DEVICE}, "
        f"${{label_prefix}}namespace) (gpu_container_memory_used_bytes{{{_POD_FILTER}}}) "
        f"/ on ({_DEVICE}) group_left () count by ({_DEVICE}) "
        f"(gpu_container_memory_used_bytes{{{_DEV_FILTER}}}))"
    ),
    "node/Sharing: MIG, MPS, time-slicing/Watts by pod on shared GPUs/A": (
        "sum by (cluster, node, gpu, ${label_prefix}namespace, ${label_prefix}pod) "
        f"(gpu_container_power_watts{{{_POD_FILTER}}}) and on (cluster, node, gpu) "
        "(count by (cluster, node, gpu) (count by (cluster, node, gpu, "
        "${label_prefix}namespace, ${label_prefix}pod) "
        f"(gpu_container_power_watts{{{_DEV_FILTER}}})) > 1)"
    ),
    "node/Devices/Device memory used/A": (
        f"max by ({_DEVICE}) ({_FB_USED} / ({_FB_USED} + {_FB_FREE}))"
    ),
    # Before its record: every container's last-active time read twice, joined at each query.
    "pod/Containers on devices/Idle since/A": (
        f"({_LAST_ACTIVE} * on (cluster, ${{label_prefix}}namespace, ${{label_prefix}}pod) "
        "group_left (workload_kind, workload_name, annotation_hub_jupyter_org_username) "
        f"{_OWNERS % ''}) or on (cluster, node, ${{label_prefix}}namespace, "
        "${label_prefix}pod, ${label_prefix}container) "
        f"({_LAST_ACTIVE} unless on (cluster, ${{label_prefix}}namespace, ${{label_prefix}}pod) "
        "gpu_pod_info)"
    ),
    "cluster/Devices/Pods on GPUs/A": f"count by (cluster) (count by ({_BY_POD}) ({_MEM}))",
}
# A panel whose legend names another label now (the records' `user`): compared by value.
_RENAMED = {"annotation_hub_jupyter_org_username": "user"}
# Alert expressions as they were (the mixin's defaults), measured beside the shipped ones.
_DAY = "gpu_container_memory_used_bytes[1d]"
ALERTS_BEFORE = {
    # The day of every container's memory read three times; now twice (one clamp_min).
    "GpuPodMemoryGrowing": (
        f"(gpu_container_memory_used_bytes > avg_over_time({_DAY}) + 3 * "
        f"stddev_over_time({_DAY})) and (gpu_container_memory_used_bytes - "
        f"avg_over_time({_DAY}) > 1073741824)"
    ),
}


# What a panel left over 10x the baseline cannot go under: the family it reads, grouped into
# its answer's series with no filter, join or condition (rows "<id> (floor)"). Where the panel
# costs about its floor, its cost is its answer (one series per pod, per container, per device
# and reason), which no record or rewrite removes without losing what the panel shows.
FLOORS = {
    "namespace/Pods/GPU memory by pod/A": (
        "sum by (cluster, namespace, pod) "
        "(namespace_pod_device:gpu_container_memory_used_bytes:sum)"
    ),
    "namespace/Pods/SM utilization by pod/A": (
        "sum by (cluster, namespace, pod) "
        "(namespace_pod_device:gpu_container_utilization_ratio:sum)"
    ),
    "node/Sharing: MIG, MPS, time-slicing/Watts by pod on shared GPUs/A": (
        "sum by (cluster, node, gpu, namespace, pod) (gpu_container_power_watts)"
    ),
    "node/Devices/Unattributed GPU memory by reason/A": (
        "sum by (cluster, node, gpu, GPU_I_ID, reason) (gpu_unattributed_memory_used_bytes)"
    ),
    "pod/Containers on devices/Idle since/A": (
        "max by (cluster, node, namespace, pod, container) "
        "(gpu_container_last_active_timestamp_seconds)"
    ),
    # The peak over the range: the 6 h of every pod's record read once.
    "namespace/Pods/Top pods by GPU memory/B": (
        "max_over_time(namespace_pod_device:gpu_container_memory_used_bytes:sum[6h])"
    ),
    # The hour of every container's utilization read once (its `max_over_time`).
    "namespace/Allocated and used/Memory held while idle/A": (
        "max by (cluster, node, gpu, GPU_I_ID, UUID, namespace, pod, container) "
        "(max_over_time(gpu_container_utilization_ratio[1h]))"
    ),
    # The containers per device and namespace, from the one family it reads per step.
    "cluster/By namespace/Allocated and in use, by namespace/B": (
        "count by (cluster, node, gpu, GPU_I_ID, namespace) (gpu_container_memory_used_bytes)"
    ),
    # Three families read once each, into its answer (a count per cluster; or a row per
    # container on a device for the table).
    "namespace/Allocated and used/Allocated but idle/A": (
        "max by (cluster, node, gpu, GPU_I_ID, UUID, namespace, pod, container) "
        '({__name__=~"gpu_container_allocated|gpu_container_utilization_ratio|'
        'gpu_container_memory_used_bytes"})'
    ),
    "cluster/Devices/Allocated but idle/A": (
        'count by (cluster) ({__name__=~"gpu_container_allocated|'
        'gpu_container_utilization_ratio|gpu_container_memory_used_bytes"})'
    ),
    "namespace/Chargeback/Energy per workload and user, last day/A": (
        "sum by (cluster, namespace, pod) (increase(gpu_container_energy_joules_total[1d]))"
    ),
}


def floors_by_panel(floors: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The measured floor rows, by the id of the panel each is the floor of."""
    return {r["id"].removesuffix(" (floor)"): r for r in floors}


def floor_queries() -> list[Query]:
    shipped = {q.id: q for q in dashboard_queries()}
    return [Query(f"{id_} (floor)", expr, shipped[id_].instant) for id_, expr in FLOORS.items()]


# The variables the one dashboard had and the family has not (a dashboard without one reads
# what it on All would): the old forms name them.
_GONE = {"gpu": ".*", "workload": ".*", "user": ".*"}


def before_queries() -> list[Query]:
    """The queries of BEFORE, as the shipped ones of the same ids are asked."""
    shipped = {q.id: q for q in dashboard_queries()}
    return [
        Query(f"{id_} (before)", _interpolate(expr, **_GONE), shipped[id_].instant)
        for id_, expr in BEFORE.items()
    ]


def on_nodes(q: Query, nodes: str) -> Query:
    """``q`` (variables on All) with every selector kept to the ``nodes`` (a regex): each
    selector of the dashboards and of BEFORE carries the cluster's matcher."""
    return Query(
        q.id, q.expr.replace('cluster=~".*"', f'cluster=~".*", node=~"{nodes}"'), q.instant
    )


def _interpolate(text: str, **chosen: str) -> str:
    """Grafana's substitution at the fleet's range: every variable on All but those ``chosen``."""
    return dashboard.interpolate(text, builtins=BUILTINS, **chosen)


def dashboard_queries(**chosen: str) -> list[Query]:
    """Every panel query of the shipped dashboard, variables on All (but those ``chosen``), as
    Grafana asks it."""
    return [Query(q.id, _interpolate(q.expr, **chosen), q.instant) for q in dashboard.queries()]


def alert_queries() -> list[Query]:
    return [Query(r["alert"], r["expr"], True) for r in dashboard.alert_rules()]


def alerts_before() -> list[Query]:
    return [Query(f"{name} (before)", expr, True) for name, expr in ALERTS_BEFORE.items()]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_queries(
    prom: Prom, queries: list[Query], reps: int, end: float
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Each query ``reps`` times, each repetition right after one of the baseline (range and
    instant), so both see the same machine; p50/p99 in ms and the ratios of the p50s."""
    base: dict[bool, list[float]] = {False: [], True: []}
    times: dict[str, list[float]] = {q.id: [] for q in queries}
    series: dict[str, int] = {}
    for q in queries:  # once to warm the caches, untimed
        prom.timed(q.expr, q.instant, end)
    for _ in range(reps):
        for q in queries:
            base[q.instant].append(prom.timed(BASELINE, q.instant, end)[0])
            took, n = prom.timed(q.expr, q.instant, end)
            times[q.id].append(took)
            series[q.id] = n
    baseline = {
        ("instant" if k else "range"): {
            "p50_ms": round(statistics.median(v) * 1000, 2),
            "p99_ms": round(_p(v, 0.99) * 1000, 2),
        }
        for k, v in base.items()
        if v
    }
    rows = []
    for q in queries:
        b = baseline["instant" if q.instant else "range"]["p50_ms"]
        p50 = statistics.median(times[q.id]) * 1000
        rows.append(
            {
                "id": q.id,
                "kind": "instant" if q.instant else "range",
                "p50_ms": round(p50, 2),
                "p99_ms": round(_p(times[q.id], 0.99) * 1000, 2),
                "ratio": round(p50 / b, 2) if b else None,
                "series": series[q.id],
                "expr": q.expr,
            }
        )
    return rows, baseline


def _answer(prom: Prom, q: Query, at: float) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    """What ``q`` answers at ``at`` (an instant query): each series' labels (a renamed one by
    its new name) and value. Not the metric name: a panel's legend names its series by their
    labels, and a comparison of a record (``device:gpu_pods:count > 1``) keeps the record's
    name where the expression it replaced had none."""
    result = prom.get("query", query=q.expr, time=str(at))["result"]
    return sorted(
        (
            tuple(
                sorted((_RENAMED.get(k, k), v) for k, v in s["metric"].items() if k != "__name__")
            ),
            s["value"][1],
        )
        for s in result
    )


def evaluation_before(prom: Prom, t: float) -> float:
    """When the dashboard's records were last evaluated at ``t`` (backfilled or live)."""
    result = prom.get(
        "query",
        query="max(timestamp(namespace_pod_device:gpu_container_memory_used_bytes:sum))",
        time=str(t),
    )["result"]
    return float(result[0]["value"][1]) if result else t


def _same(a: list[tuple[Any, str]], b: list[tuple[Any, str]]) -> bool:
    """The same series, with values equal but for the order of float additions."""
    return [k for k, _ in a] == [k for k, _ in b] and all(
        abs(float(x) - float(y)) <= 1e-9 * max(abs(float(x)), 1.0)
        for (_, x), (_, y) in zip(a, b, strict=True)
    )


def dashboard_load(prom: Prom, queries: list[Query], end: float, reps: int) -> dict[str, float]:
    """Every query of the dashboard at once, BROWSER_CONNECTIONS at a time: wall ms (median of
    ``reps``), against the range baseline measured the same way just before each."""
    loads, bases = [], []
    with ThreadPoolExecutor(BROWSER_CONNECTIONS) as pool:
        for _ in range(reps):
            t0 = time.perf_counter()
            prom.timed(BASELINE, False, end)
            bases.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            list(pool.map(lambda q: prom.timed(q.expr, q.instant, end), queries))
            loads.append(time.perf_counter() - t0)
    load, base = statistics.median(loads) * 1000, statistics.median(bases) * 1000
    return {
        "wall_ms": round(load, 1),
        "baseline_ms": round(base, 2),
        "ratio": round(load / base, 1),
    }


def board_defaults(prom: Prom, board: str, end: float) -> dict[str, str]:
    """The values Grafana gives dashboard ``board``'s variables when it opens with none in its
    URL: All where the variable offers it, else the first of its label values over the
    dashboard's range (sorted, as its ``sort: 1`` asks), each narrowed by those before it."""
    chosen: dict[str, str] = {}
    for name, var in dashboard.variables(board).items():
        if var["type"] != "query" or var.get("includeAll"):
            continue
        found = re.fullmatch(r"label_values\((.+), (\S+)\)", var["definition"])
        assert found, var["definition"]
        selector, label = (_interpolate(g, **chosen) for g in found.groups())
        values = prom.get(
            f"label/{label}/values",
            **{"match[]": selector, "start": str(end - DASHBOARD_RANGE_S), "end": str(end)},
        )
        chosen[name] = sorted(values)[0] if values else ""
    return chosen


def open_boards(prom: Prom, end: float, reps: int) -> list[dict[str, Any]]:
    """Each dashboard of the family opened with its default variables: every query at once,
    as a browser asks them (``dashboard_load``, against the range baseline), and the series
    each panel returns (all its queries together)."""
    out = []
    for board in dashboard.BOARDS:
        chosen = board_defaults(prom, board, end)
        shipped = dashboard.board_queries(board)
        queries = [Query(q.id, _interpolate(q.expr, **chosen), q.instant) for q in shipped]
        series: dict[str, int] = {}
        for q, s in zip(queries, shipped, strict=True):
            title = f"{s.row}/{s.panel}"
            series[title] = series.get(title, 0) + prom.timed(q.expr, q.instant, end)[1]
        out.append(
            {
                "board": board,
                "variables": chosen,
                "queries": len(queries),
                **dashboard_load(prom, queries, end, reps),
                "max_series": max(series.values()),
                "series": series,
            }
        )
    return out


# --------------------------------------------------------------------------- the run


def bench_fleet(quick: bool, work: Path, nodes: int = 100, reps: int = 7) -> dict[str, Any]:
    """Build the fleet's hour of blocks, start Prometheus 3.5 on them, scrape the fleet live
    for a few intervals, and measure (each query ``reps`` times)."""
    mode = fleet_mode(nodes, quick, reps)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    bodies = render_bodies(work / "bodies", mode.variants)
    fleet = Fleet(bodies, mode.nodes)
    timings["render_s"] = time.perf_counter() - t0

    end = int(time.time()) // INTERVAL * INTERVAL
    start = end - (HISTORY_S if not quick else 600)
    t0 = time.perf_counter()
    om = work / "fleet.om"
    samples = fleet.write_openmetrics(om, start, end)
    om_bytes = om.stat().st_size
    timings["openmetrics_s"] = time.perf_counter() - t0
    data = work / "prometheus" / "data"
    data.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run(
        [
            prometheus_bin("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(om),
            str(data),
        ],
        check=True,
        capture_output=True,
    )
    timings["blocks_s"] = time.perf_counter() - t0
    om.unlink()
    t0 = time.perf_counter()
    record_blocks = backfill_records(data, start, end)
    timings["records_backfill_s"] = time.perf_counter() - t0

    targets = serve_fleet(fleet, start)
    out: dict[str, Any] = {
        "nodes": mode.nodes,
        "reps": mode.reps,
        "kinds": {
            k: sum(1 for i in range(mode.nodes) if KINDS[i % len(KINDS)] == k) for k in bodies
        },
        "series_per_node": {k: len(b.series) for k, b in bodies.items()},
        "history_s": end - start,
        "history_samples": samples,
        "openmetrics_mib": round(om_bytes / (1 << 20), 1),
        "record_blocks": record_blocks,
    }
    try:
        with run_prometheus(prometheus_config(mode.nodes, targets.port), data) as prom:
            groups_seen: dict[str, float] = {}
            appended0 = prom.metric("prometheus_tsdb_head_samples_appended_total")
            live0 = time.monotonic()
            window = mode.live_scrapes * INTERVAL + 5
            while time.monotonic() - live0 < window:
                time.sleep(5)
                for g in prom.get("rules")["groups"]:
                    groups_seen[g["name"]] = max(
                        groups_seen.get(g["name"], 0.0), g["evaluationTime"]
                    )
            appended = prom.metric("prometheus_tsdb_head_samples_appended_total") - appended0
            live_s = time.monotonic() - live0
            tsdb = prom.get("status/tsdb")
            rss_after_ingest = prom.rss_mib()
            groups = prom.get("rules")["groups"]
            out["ingest"] = {
                "window_s": round(live_s, 1),
                "samples_appended": int(appended),
                "samples_per_s": round(appended / live_s, 1),
                "head_series": tsdb["headStats"]["numSeries"],
                "rss_mib": rss_after_ingest[0],
            }
            out["rule_groups"] = [
                {
                    "name": g["name"],
                    "rules": len(g["rules"]),
                    "interval_s": g["interval"],
                    "evaluation_ms": round(
                        groups_seen.get(g["name"], g["evaluationTime"]) * 1000, 2
                    ),
                    "share_of_interval": round(
                        groups_seen.get(g["name"], g["evaluationTime"]) / g["interval"], 5
                    ),
                    "last_error": next(
                        (r.get("lastError") for r in g["rules"] if r.get("lastError")), None
                    ),
                }
                for g in groups
            ]
            now = time.time()
            before = before_queries()
            rows, baseline = measure_queries(
                prom, dashboard_queries() + before + floor_queries(), mode.reps, now
            )
            out["baseline"] = baseline
            out["panels"] = [r for r in rows if not r["id"].endswith((" (before)", " (floor)"))]
            out["before"] = [r for r in rows if r["id"].endswith(" (before)")]
            out["floors"] = [r for r in rows if r["id"].endswith(" (floor)")]
            # Compared inside the history, at an evaluation of the records' group (a group
            # evaluates at an offset into each interval, backfilled as live: a record holds
            # what the join gave then, and lags the raw series in between), on the nodes
            # whose pods did not change in the quarter hour before (the $node variable): the
            # history has no stale markers, so an ended pod's series lingers for a lookback
            # (5 min) and its record for one more.
            at = evaluation_before(prom, end - 10 * INTERVAL)
            quiet = [
                node_name(i)
                for i in range(mode.nodes)
                if fleet.generation(i, at) == fleet.generation(i, at - 900)
            ]
            out["same_answer_nodes"] = len(quiet)
            node = "|".join(quiet)
            shipped = {q.id: on_nodes(q, node) for q in dashboard_queries()}
            for r, q in zip(out["before"], before_queries(), strict=True):
                after = shipped[q.id.removesuffix(" (before)")]
                r["same_answer"] = _same(
                    _answer(prom, on_nodes(q, node), at), _answer(prom, after, at)
                )
            out["dashboard_load"] = dashboard_load(prom, dashboard_queries(), now, mode.reps)
            out["boards"] = open_boards(prom, now, mode.reps)
            alerts, alert_base = measure_queries(
                prom, alert_queries() + alerts_before(), mode.reps, now
            )
            out["alerts"] = [r for r in alerts if not r["id"].endswith(" (before)")]
            out["alerts_before"] = [r for r in alerts if r["id"].endswith(" (before)")]
            shipped_alerts = {q.id: q for q in alert_queries()}
            for r, q in zip(out["alerts_before"], alerts_before(), strict=True):
                after = shipped_alerts[q.id.removesuffix(" (before)")]
                r["same_answer"] = _same(_answer(prom, q, now), _answer(prom, after, now))
            out["alert_baseline"] = alert_base
            out["rss_mib_end"], out["rss_mib_peak"] = prom.rss_mib()
    finally:
        targets.close()
    out["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    floors = floors_by_panel(out["floors"])
    over = [r for r in out["panels"] if r["ratio"] and r["ratio"] > 10]
    out["targets"] = {
        "panels_over_10x": [r["id"] for r in over],
        # Over 10x and over 1.5x its floor (or with none): a cost that is not its answer's.
        "panels_over_10x_above_floor": [
            r["id"]
            for r in over
            if r["id"] not in floors or r["p50_ms"] > FLOOR_SLACK * floors[r["id"]]["p50_ms"]
        ],
        "max_panel_ratio": max(r["ratio"] or 0 for r in out["panels"]),
        # Each dashboard opened with its default variables: within BOARD_RATIO of the range
        # baseline, and no panel over MAX_SERIES series.
        "boards_over_ratio": [b["board"] for b in out["boards"] if b["ratio"] > BOARD_RATIO],
        "panels_over_max_series": [
            f"{b['board']}/{title}"
            for b in out["boards"]
            for title, n in b["series"].items()
            if n > MAX_SERIES
        ],
        "max_group_share": max(g["share_of_interval"] for g in out["rule_groups"]),
    }
    return out


def render_fleet(fleet: dict[str, Any]) -> list[str]:
    ing = fleet["ingest"]
    b = fleet["baseline"]
    kinds = ", ".join(f"{n} {k}" for k, n in fleet["kinds"].items())
    lines = [
        f"Fleet on Prometheus 3.5: {fleet['nodes']} nodes ({kinds}; "
        f"series per node {fleet['series_per_node']}), {fleet['history_s'] // 60} min of blocks "
        f"({fleet['history_samples']:,} samples, {fleet['openmetrics_mib']} MiB of OpenMetrics) "
        f"then {ing['window_s']:.0f} s live",
        f"ingest: {ing['samples_per_s']:,.0f} samples/s, head series {ing['head_series']:,}, "
        f"RSS {ing['rss_mib']} MiB after ingest, {fleet['rss_mib_end']} MiB after the queries "
        f"(peak {fleet['rss_mib_peak']})",
        f"baseline {BASELINE}: range (6h, step 30s) p50 {b['range']['p50_ms']} ms, "
        f"p99 {b['range']['p99_ms']}; instant p50 {b.get('instant', {}).get('p50_ms')} ms",
        "rule groups (largest evaluation seen; share of the 30 s interval):",
    ]
    for g in fleet["rule_groups"]:
        lines.append(
            f"  {g['name']:32} {g['rules']:>3} rules {g['evaluation_ms']:>9.2f} ms "
            f"{g['share_of_interval']:>8.2%}"
            + (f"  ERROR {g['last_error']}" if g["last_error"] else "")
        )
    lines.append(
        f"{'dashboard query (variables on All)':64} {'kind':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'x base':>7} {'series':>7}"
    )
    for r in sorted(fleet["panels"], key=lambda r: -(r["ratio"] or 0)):
        lines.append(
            f"{r['id'][:64]:64} {r['kind']:>7} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['ratio'] or 0:>7.2f} {r['series']:>7}"
        )
    after = {r["id"]: r for r in fleet["panels"]}
    lines.append(
        f"{'the same panels before the records (p50 ms, x base)':64} {'before':>17} "
        f"{'after':>17} {'same answer':>12} (on {fleet.get('same_answer_nodes')} quiet nodes)"
    )
    for r in fleet.get("before", []):
        a = after[r["id"].removesuffix(" (before)")]
        lines.append(
            f"{r['id'].removesuffix(' (before)')[:64]:64} {r['p50_ms']:>8.1f} "
            f"{r['ratio'] or 0:>7.2f}x {a['p50_ms']:>8.1f} {a['ratio'] or 0:>7.2f}x "
            f"{r['same_answer']!s:>12}"
        )
    lines.append(
        f"{'panels over 10x and their floor (p50 ms, x base)':64} {'panel':>17} "
        f"{'floor':>17} {'/ floor':>8}"
    )
    floors = floors_by_panel(fleet.get("floors", []))
    for r in sorted(fleet["panels"], key=lambda r: -(r["ratio"] or 0)):
        if not (r["ratio"] and r["ratio"] > 10):
            continue
        f = floors.get(r["id"])
        lines.append(
            f"{r['id'][:64]:64} {r['p50_ms']:>8.1f} {r['ratio']:>7.2f}x "
            + (
                f"{f['p50_ms']:>8.1f} {f['ratio'] or 0:>7.2f}x {r['p50_ms'] / f['p50_ms']:>8.2f}"
                if f and f["p50_ms"]
                else f"{'no floor':>17}"
            )
        )
    d = fleet["dashboard_load"]
    lines.append(
        f"whole dashboard ({len(fleet['panels'])} queries, {BROWSER_CONNECTIONS} at a time): "
        f"{d['wall_ms']:.0f} ms, {d['ratio']}x the range baseline"
    )
    lines.append(
        f"{'alert expression (instant)':40} {'p50 ms':>8} {'p99 ms':>8} {'x base':>7} {'series':>7}"
    )
    for r in sorted(fleet["alerts"], key=lambda r: -(r["ratio"] or 0)):
        lines.append(
            f"{r['id'][:40]:40} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['ratio'] or 0:>7.2f} {r['series']:>7}"
        )
    for r in fleet.get("alerts_before", []):
        a = {x["id"]: x for x in fleet["alerts"]}[r["id"].removesuffix(" (before)")]
        lines.append(
            f"{r['id'][:40]:40} {r['p50_ms']:>8.1f} {r['ratio'] or 0:>7.2f}x, now "
            f"{a['p50_ms']:.1f} ms {a['ratio'] or 0:.2f}x, same answer: {r['same_answer']}"
        )
    lines.append(
        f"{'each dashboard with its default variables':42} {'queries':>7} {'ms':>7} "
        f"{'x base':>7} {'max series':>10}  (panel)"
    )
    for b in fleet.get("boards", []):
        widest = max(b["series"], key=lambda t: b["series"][t])
        lines.append(
            f"{b['board'] + ' ' + str(b['variables']):42.42} {b['queries']:>7} "
            f"{b['wall_ms']:>7.0f} {b['ratio']:>7.1f} {b['max_series']:>10}  ({widest})"
        )
    t = fleet["targets"]
    lines.append(
        f"targets: panel queries over 10x the baseline: {len(t['panels_over_10x'])} "
        f"(max {t['max_panel_ratio']}x), of them over {FLOOR_SLACK}x their floor: "
        f"{len(t['panels_over_10x_above_floor'])}; largest rule group "
        f"{t['max_group_share']:.2%} of its interval; dashboards over {BOARD_RATIO}x: "
        f"{t['boards_over_ratio'] or 'none'}; panels over {MAX_SERIES} series: "
        f"{t['panels_over_max_series'] or 'none'}"
    )
    return lines
