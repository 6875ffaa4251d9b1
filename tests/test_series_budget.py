"""The series budget per node (docs/performance.md#series-per-node), held by the real enricher.

Every node here is SIMULATED (no GPU or cluster exists here): the benchmark's nodes (bench.node:
payload shapes of 8 GPUs and of 8 GPUs x 7 MIG instances, 110 pods, 64 GPU processes) under
real pynvml over the fake libnvidia-ml, a /proc tree, the real kubernetes client against the
API-server stand-in and a served dcgm-exporter body; and the demo node. A change that adds a
series per container, per pod, per device or per process beyond the documented budget, or
that leaves the series of a pod that is gone, fails here.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import payloads
from bench.node import NODE, BenchNode
from devkit.nvmlfake import FakeNvml
from enricher import demo
from enricher.config import Config
from enricher.promclient import RUNTIME_PREFIXES
from enricher.simnode.api import pod_object

from .frozendemo import T0
from .harness import MakeStack

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE = ROOT / "docs" / "performance.md"
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Budget:
    unit: str
    each: int
    families: tuple[str, ...]


def documented_budget() -> dict[str, Budget]:
    """The table under "Series per node" in docs/performance.md: unit | series each |
    families (in backquotes; a trailing * is a prefix)."""
    text = PERFORMANCE.read_text()
    section = text.split("## Series per node", 1)[1].split("\n## ", 1)[0]
    table = section.split("| unit | series each | families |", 1)[1].split("\n\n", 1)[0]
    out = {}
    for row in table.strip().splitlines()[1:]:
        unit, each, families = (c.strip() for c in row.strip().strip("|").split("|"))
        out[unit] = Budget(unit, int(each), tuple(re.findall(r"`([^`]+)`", families)))
    return out


def documented_counts() -> dict[str, list[int]]:
    """The table of counts per node under the budget: the node's name (its first word, or
    "demo" for the demo's row) and the first number of each column."""
    section = PERFORMANCE.read_text().split("## Series per node", 1)[1].split("\n## ", 1)[0]
    table = section.split("| node |", 1)[1].split("\n\n", 1)[0]
    out = {}
    for row in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name = "demo" if cells[0].startswith("the demo") else cells[0].split(":")[0]
        out[name] = [int(re.match(r"[\d,]+", c)[0].replace(",", "")) for c in cells[1:]]
    return out


def documented_churn() -> dict[str, int]:
    """The series created when 11 of the 110 pods are replaced, as the churn paragraph says."""
    text = PERFORMANCE.read_text().replace("\n", " ")
    m = re.search(r"(\d+) series created on `node8`, (\d+) on `mig56`", text)
    assert m, "the churn paragraph of docs/performance.md"
    return {"node8": int(m[1]), "mig56": int(m[2])}


def series(text: str) -> list[tuple[str, Labels]]:
    return [
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]


def of(budget: Budget, name: str) -> bool:
    return any(name.startswith(f[:-1]) if f.endswith("*") else name == f for f in budget.families)


def device_of(labels: Labels) -> tuple[str, str]:
    d = dict(labels)
    return d["UUID"], d.get("GPU_I_ID", "")


@dataclass
class Count:
    """One scrape's series by the budget's units."""

    upstream: int
    container_device: dict[tuple[str, str, str, str, str], Counter[str]]
    pods: int
    device_reason: Counter[tuple[str, str, str, str]]
    taints: Counter[tuple[str, str, str, str, str]]
    processes: int
    own: int
    unbudgeted: list[str]


def count(text: str, budget: dict[str, Budget]) -> Count:
    c = Count(0, defaultdict(Counter), 0, Counter(), Counter(), 0, 0, [])
    for name, labels in series(text):
        d = dict(labels)
        if name.startswith("DCGM_FI_"):
            c.upstream += 1
        elif of(budget["container on a device"], name):
            key = (d["namespace"], d["pod"], d["container"], *device_of(labels))
            c.container_device[key][name] += 1
        elif of(budget["pod with a GPU process"], name):
            c.pods += 1
        elif of(budget["device and reason"], name):
            c.device_reason[(name, *device_of(labels), d["reason"])] += 1
        elif of(budget["taint on a device (DRA)"], name):
            c.taints[(*device_of(labels), d["key"], d["value"], d["effect"])] += 1
        elif of(budget["GPU process (--collector.process)"], name):
            c.processes += 1
        elif of(budget["node (the enricher's own)"], name) or name.startswith(RUNTIME_PREFIXES):
            c.own += 1
        else:
            c.unbudgeted.append(name)
    return c


def check(c: Count, budget: dict[str, Budget], upstream_series: int) -> None:
    assert not c.unbudgeted, f"series no row of the budget covers: {sorted(set(c.unbudgeted))}"
    assert c.upstream == upstream_series, "the rewrite added or dropped a device series"
    per_pair = budget["container on a device"].each
    for key, names in c.container_device.items():
        assert max(names.values()) == 1, f"two series of one family for {key}: {names}"
        assert sum(names.values()) <= per_pair, (key, names)
    assert max(c.device_reason.values(), default=1) <= budget["device and reason"].each
    assert max(c.taints.values(), default=1) <= budget["taint on a device (DRA)"].each
    assert c.own <= budget["node (the enricher's own)"].each, c.own


OWN_PREFIXES = ("dcgm_enricher_", *RUNTIME_PREFIXES)


def workload_series(text: str) -> set[tuple[str, Labels]]:
    """The series that name workloads: neither the upstream's device series nor our own."""
    return {s for s in series(text) if not s[0].startswith(("DCGM_FI_", *OWN_PREFIXES))}


def test_the_budget_table_names_every_unit() -> None:
    assert set(documented_budget()) == {
        "device series from dcgm-exporter",
        "container on a device",
        "pod with a GPU process",
        "device and reason",
        "taint on a device (DRA)",
        "GPU process (--collector.process)",
        "node (the enricher's own)",
    }


def _pods_with_processes(sim: BenchNode) -> set[str]:
    return {p.pod.name for p in sim.processes if p.pod is not None}


@pytest.mark.parametrize("shape", ["node8", "mig56"])
@pytest.mark.parametrize("per_process", [False, True], ids=["default", "collector.process"])
async def test_bench_nodes_stay_in_the_budget_and_churn_leaves_nothing_behind(
    tmp_path: Path, full_stack: MakeStack, fake_nvml: FakeNvml, shape: str, per_process: bool
) -> None:
    """On the benchmark's nodes (110 pods, 64 GPU processes): every series is in a row of the
    budget and within it, per container and device, per pod, per process and per node. Then a
    tenth of the pods are replaced (new pods, the PIDs reused): the new pods' series come, the
    old pods' go (the series count is back where it was), and the series created are at most
    the budget of the new pods."""
    budget = documented_budget()
    sim = BenchNode(tmp_path, payloads.SHAPES[shape])
    text = payloads.generate(shape)
    stack = await full_stack(
        upstream=text,
        nvml=sim.nvml(),
        proc=lambda _root: sim.write(),
        node=NODE,
        pods=sim.pod_objects(),
        collector_process=per_process,
    )
    before_text = await stack.scrape()
    before = count(before_text, budget)
    check(before, budget, payloads.series_count(text))
    truth_pairs = {(p.pod.name, p.gpu, p.gi) for p in sim.processes if p.pod is not None}
    assert len(before.container_device) == len(truth_pairs)
    assert before.pods == len(_pods_with_processes(sim))
    assert before.processes == (len(sim.processes) if per_process else 0)
    stated = documented_counts()[shape]
    measured = [
        before.upstream,
        sum(sum(n.values()) for n in before.container_device.values()),
        before.pods,
        sum(before.device_reason.values()),
        len(sim.processes),
        before.own,
    ]
    if per_process:
        assert before.processes == stated[4]
    else:
        assert measured == stated, "docs/performance.md's table of counts"

    removed, added = sim.churn(11)
    fake_nvml.write(sim.nvml())
    assert stack.api is not None
    for uid in removed:
        stack.api.delete_pod(uid)
    for pod in added:
        stack.api.add_pod(pod_object(pod, NODE))
    new_pods = {p.name for p in added} & _pods_with_processes(sim)
    assert new_pods
    after_text = ""
    for _ in range(100):
        after_text = await stack.scrape()
        if all(f'pod="{name}"' in after_text for name in new_pods):
            break
        await asyncio.sleep(0.1)
    after = count(after_text, budget)
    check(after, budget, payloads.series_count(text))
    old, new = workload_series(before_text), workload_series(after_text)
    assert len(new) == len(old), "series of pods that are gone were left behind"
    created = new - old
    pairs_after = {(p.pod.name, p.gpu, p.gi) for p in sim.processes if p.pod is not None}
    pairs = sum(1 for (pod, _, _) in pairs_after if pod in new_pods)
    per_process_series = (
        sum(1 for p in sim.processes if p.pod is not None and p.pod.name in new_pods)
        if per_process
        else 0
    )
    limit = pairs * budget["container on a device"].each + len(new_pods) + per_process_series
    assert len(created) <= limit, (len(created), limit)
    if not per_process:
        assert len(created) == documented_churn()[shape], "docs/performance.md's churn figures"
    # Every created series names one of the new pods (none of the upstream's or our own).
    assert all(dict(labels).get("pod") in new_pods for _, labels in created)


async def test_the_demo_stays_in_the_budget(tmp_path: Path) -> None:
    """The demo's node (time-slicing, MIG, MPS, allocations, DRA, a host process, a Jupyter pod
    that never asked): every series in a row of the budget and within it."""
    budget = documented_budget()
    socket_path = tmp_path / "pod-resources" / "kubelet.sock"
    socket_path.parent.mkdir()
    _scraper, runners, kubelet = await demo.start_demo(
        Config(listen_address="127.0.0.1:0"), tmp_path / "proc", socket_path, clock=lambda: T0
    )
    try:
        port = runners[0].addresses[0][1]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as r,
        ):
            text = await r.text()
    finally:
        for runner in runners:
            await runner.cleanup()
        kubelet.stop()
    collected = demo.collected_at(T0, demo.UPSTREAM_COLLECT_INTERVAL)
    upstream = demo.render_upstream(demo.demo_gpus(lambda: T0), collected)
    c = count(text, budget)
    check(c, budget, payloads.series_count(upstream))
    measured = [
        c.upstream,
        sum(sum(n.values()) for n in c.container_device.values()),
        c.pods,
        sum(c.device_reason.values()),
        c.processes,
        c.own,
    ]
    assert measured == documented_counts()["demo"], "docs/performance.md's table of counts"
    workloads = {
        (p.pod.namespace, p.pod.name)
        for p in demo.PROCS
        if p.pod is not None and p.pod is not demo.MPS_DAEMON
    }
    assert c.pods == len(workloads)
