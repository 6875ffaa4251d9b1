"""Many clusters in one store: no rule, alert or dashboard query mixes them.

Users of Thanos, Mimir or VictoriaMetrics send every cluster's series to one store, each
cluster's with its own `cluster` label (an external label of the Prometheus or agent that
ships them). There, a rule or panel that aggregates without `cluster`, or joins on labels that
leave it out, adds one cluster's GPUs to another's or fails on the duplicate match.

Two checks:
- **The expressions, read.** Every recording rule, alert and dashboard query is parsed
  (promql-parser, a PromQL parser) and walked: each aggregation must keep `cluster` (by it, or
  without leaving it out), each join of two vectors must match on it, and the result must
  carry it. What cannot keep it (absent() has no labels) is listed with the reason.
- **The distributed path, run.** Two clusters (the demo's node twice, its clock stopped, so
  that every server sees the same values), each scraped by its own Prometheus 3.5 with the
  rules and by a Prometheus 3.5 in agent mode that remote-writes with `cluster` set to a
  receiver (a Prometheus with `--web.enable-remote-write-receiver`: the protocol Thanos Receive
  and Mimir ingest) that runs the rules too. On the receiver, every recording rule, alert
  expression and dashboard query, for each cluster, gives what that cluster's own Prometheus
  gives: the same series (label sets, less `cluster`) and, where the expression reads no range
  of history (which the servers started at different moments), the same values. Beside the
  demo's node each cluster has sick ones (hot, full, XID errors, a GPU off the bus, enrichers
  down), so that every alert but the one listed in QUIET answers on every server: two empty
  answers would agree whatever the expression does with the cluster.

Only the GPU nodes are SIMULATED (no GPU or cluster exists here); the demo's enricher, the
Prometheus servers and the protocol between them are real.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.dashboard import interpolate, queries
from devkit.prometheus import EVERY_SECOND
from devkit.upstream import TextServer
from enricher.demo import EXPORTER_HOST, NODE
from enricher.fieldtable import table
from enricher.simnode.dialects import NEWEST

from .frozendemo import FrozenDemo
from .promreleases import PromRelease, Server, releases, require, serve

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
CLUSTER = "cluster"
CLUSTERS = ("east", "west")
DEADLINE_SECONDS = 90

# What cannot keep the cluster label, and why (docs/install.md#thanos-mimir-or-victoriametrics).
CLUSTERLESS = {
    "GpuEnricherAbsent": "absent() answers with no labels: on a store of many clusters it "
    "fires only when no cluster has an enricher, so run it in each cluster's own Prometheus",
}


# --------------------------------------------------------------------------- the expressions

_SCALAR = "scalar"  # a number: no labels, matches every series
_CONSTANT = "constant"  # one label-less series (vector(1)): joins with `on ()` are per series


def cluster_problems(expr: str) -> list[str]:
    """Where ``expr`` mixes clusters or loses the cluster label (empty: it keeps them apart)."""
    import promql_parser as pp  # a test extra

    problems: list[str] = []

    def aggregation_keeps(modifier: Any) -> bool:
        if modifier is None:
            return False
        if modifier.type == pp.AggModifierType.By:
            return CLUSTER in modifier.labels
        return CLUSTER not in modifier.labels

    def walk(e: Any) -> bool | str:
        kind = type(e).__name__
        if kind in ("VectorSelector", "MatrixSelector"):
            return True
        if kind in ("NumberLiteral", "StringLiteral"):
            return _SCALAR
        if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
            return walk(e.expr)
        if kind == "Call":
            name = e.func.name
            args = [walk(a) for a in e.args]
            if name in ("absent", "absent_over_time"):
                problems.append(f"{name}() keeps no label")
                return False
            if name == "vector":
                return _CONSTANT
            if name in ("label_replace", "label_join") and e.args[1].prettify() == f'"{CLUSTER}"':
                problems.append(f"{name}() writes the cluster label")
            vectors = [a for a in args if a is not _SCALAR]
            return vectors[0] if vectors else _SCALAR
        if kind == "AggregateExpr":
            inner = walk(e.expr)
            if inner is _CONSTANT:
                return _CONSTANT
            if not aggregation_keeps(e.modifier):
                problems.append(f"{e.op} {e.modifier or ''} aggregates across clusters")
                return False
            return inner
        if kind == "BinaryExpr":
            left, right = walk(e.lhs), walk(e.rhs)
            if left in (_SCALAR, _CONSTANT):
                return right
            if right in (_SCALAR, _CONSTANT):
                return left
            modifier = e.modifier
            matching = modifier.matching if modifier is not None else None
            on = matching is not None and matching.type == pp.LabelModifierType.Include
            if on and CLUSTER not in matching.labels:
                problems.append(f"{e.op} on ({', '.join(matching.labels)}) matches across clusters")
            if matching is not None and not on and CLUSTER in matching.labels:
                problems.append(f"{e.op} ignoring (cluster) matches across clusters")
            op = str(e.op)
            card = modifier.card if modifier is not None else None
            if op in ("and", "unless") or card == pp.VectorMatchCardinality.ManyToOne:
                return left
            if card == pp.VectorMatchCardinality.OneToMany:
                return right
            if op == "or":
                return left is True and right is True
            if on:  # one-to-one on (...): the result has only the matching labels
                return CLUSTER in matching.labels
            return left is True and right is True
        raise AssertionError(f"an expression node the check does not know: {kind}")

    if walk(pp.parse(expr)) is False and not problems:
        problems.append("the result has no cluster label")
    return problems


@pytest.mark.parametrize(
    ("expr", "mixes"),
    [
        ("sum by (cluster, pod) (x)", False),
        ("sum without (pod) (x)", False),
        ("sum(x)", True),
        ("sum by (pod) (x)", True),
        ("sum without (cluster) (x)", True),
        ("topk(3, x)", True),
        ("x * on (cluster, pod) group_left (a) y", False),
        ("x * on (pod) group_left (a) y", True),
        ("x and ignoring (cluster) y", True),
        ("x / on () group_left () count_over_time(vector(1)[1h:15s])", False),
        ("absent(up == 1)", True),
        ('label_replace(x, "cluster", "a", "b", "c")', True),
        ("rate(x[5m]) > 0.5", False),
        ("count(count by (cluster, gpu) (x))", True),
        ("max by (cluster) (time() - x)", False),
    ],
)
def test_the_check_sees_what_mixes_clusters(expr: str, mixes: bool) -> None:
    assert bool(cluster_problems(expr)) == mixes, cluster_problems(expr)


def rules() -> list[tuple[str, str, str]]:
    """(record or alert, name, expr) of every rule shipped."""
    out = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            kind = "record" if "record" in rule else "alert"
            out.append((kind, rule[kind], rule["expr"]))
    return out


def panel_queries() -> list[tuple[str, str]]:
    """(panel/ref, query) of every dashboard query, with the variables on All and the labels
    as honor_labels keeps them."""
    return [(q.id, interpolate(q.expr, "")) for q in queries()]


@pytest.mark.parametrize(("kind", "name", "expr"), rules(), ids=[r[1] for r in rules()])
def test_every_rule_keeps_the_clusters_apart(kind: str, name: str, expr: str) -> None:
    problems = cluster_problems(expr)
    if name in CLUSTERLESS:
        assert problems, f"{name} is listed as unable to keep the cluster label, and keeps it"
        return
    assert not problems, f"{kind} {name}: {problems}\n{expr}"


@pytest.mark.parametrize(("ref", "expr"), panel_queries(), ids=[q[0] for q in panel_queries()])
def test_every_dashboard_query_keeps_the_clusters_apart(ref: str, expr: str) -> None:
    """With the cluster variable on All (several clusters selected), each panel still shows
    each cluster's figures apart."""
    assert not cluster_problems(expr), f"{ref}: {cluster_problems(expr)}\n{expr}"


# --------------------------------------------------------------------------- the path, run


# The demo's node is sound hardware with waste on it: few alerts answer there. Beside it each
# cluster has SIMULATED sick nodes, their enricher's /metrics served by the test, so that the
# other alerts answer too and their comparison compares answers, not two empty sets. Node 2:
# GPU 0 hot, nearly full, a critical XID and a failed row remap; GPU 1 stops reporting, and
# GPU 2 gets a non-critical XID, an uncorrectable error's remapped row and a burst of PCIe
# replays, while the servers watch; a notebook that has held GPU 2 idle since 2023. Node 3:
# an enricher that lost every source, near its memory limit. Node 4: an enricher that does not
# answer. The values differ between the clusters, so one cluster's answer given for another's
# fails the comparison. The fleet is in the middle of a dcgm-exporter upgrade: the demo's
# exporter writes 4.10.0's field names and units and its hostname (the node's name, from
# NODE_NAME), node 2's writes 4.8.2's names and Hostname (its pod's name: no NODE_NAME); the
# enricher's node label names the node on both, and the rules read both namings.
_DEMO_TEMP = table().name("gpu_temp", table().naming_of_release(NEWEST))
DEMO_GPUS = f'{_DEMO_TEMP}{{hostname="{EXPORTER_HOST}",node="{NODE}"}}'
SICK_HOST = "dcgm-exporter-node-2"  # node 2's dcgm-exporter pod: its series' Hostname
SICK_NODE = "gpu-node-2"
SOURCES = ("upstream", "nvml", "kubernetes", "procfs", "podresources", "resourceslices", "docker")
_HEALTHY = {
    "GPU_TEMP": 45,
    "XID_ERRORS": 0,
    "FB_USED": 1024,
    "FB_FREE": 80384,
    "ROW_REMAP_FAILURE": 0,
    "UNCORRECTABLE_REMAPPED_ROWS": 0,
    "PCIE_REPLAY_COUNTER": 0,
    # Opt-in (a custom counters file): NVML's fabric health summary, 1 healthy.
    "FABRIC_HEALTH_SUMMARY": 1,
}
_COUNTERS = ("UNCORRECTABLE_REMAPPED_ROWS", "PCIE_REPLAY_COUNTER")
# On every server, for each cluster: node 2 seen before its faults come on (then they come
# on), and after (then the comparisons start).
SICK_BEFORE = f'DCGM_FI_DEV_XID_ERRORS{{node="{SICK_NODE}",gpu="2"}} == 0'
SICK_AFTER = (
    f'DCGM_FI_DEV_XID_ERRORS{{node="{SICK_NODE}",gpu="2"}} > 0',
    'dcgm_enricher_source_up{instance="gpu-node-3:9400"} == 0',
    'up{instance="gpu-node-4:9400"} == 0',
)
SICK_GONE = f'DCGM_FI_DEV_GPU_TEMP{{node="{SICK_NODE}",gpu="1"}}'


def sick_gpus(cluster: str, turned: bool) -> dict[str, dict[str, int]]:
    """Node 2's GPUs and their fields, before or after its faults come on (``turned``)."""
    east = cluster == CLUSTERS[0]
    faults: dict[str, dict[str, int]] = {
        "0": {
            "GPU_TEMP": 91 if east else 88,
            "XID_ERRORS": 79 if east else 48,
            "FB_USED": 79360,
            "FB_FREE": 2048,
            "ROW_REMAP_FAILURE": 1,
            "FABRIC_HEALTH_SUMMARY": 2 if east else 3,  # unhealthy, limited capacity
        },
        "2": {
            "XID_ERRORS": 43 if east else 31,
            "UNCORRECTABLE_REMAPPED_ROWS": 1,
            "PCIE_REPLAY_COUNTER": 900 if east else 600,
        }
        if turned
        else {},
    }
    if not turned:
        faults["1"] = {}  # reports until it falls off the bus (its gauges: see below)
    return {gpu: _HEALTHY | faults[gpu] for gpu in sorted(faults)}


def render_sick_node(path: str, turned: bool) -> bytes:
    """/<cluster>/2: node 2's enricher's /metrics; /<cluster>/3: node 3's."""
    _, cluster, node = path.split("/")
    east = cluster == CLUSTERS[0]
    if node == "3":
        here = 'node="gpu-node-3"'  # the enricher's node label, on every series it serves
        lines = ["# TYPE dcgm_enricher_source_up gauge"]
        lines += [f'dcgm_enricher_source_up{{source="{s}",{here}}} 0' for s in SOURCES]
        lines += [
            "# TYPE process_resident_memory_bytes gauge",
            f"process_resident_memory_bytes{{{here}}} {1.9e9 if east else 1.85e9:.0f}",
            "# TYPE dcgm_enricher_memory_limit_bytes gauge",
            f"dcgm_enricher_memory_limit_bytes{{{here}}} 2000000000",
            # The last body its dcgm-exporter wrote lacked a field (a newer release's rename).
            "# TYPE dcgm_enricher_upstream_field_missing gauge",
            f'dcgm_enricher_upstream_field_missing{{field="fb_used",{here}}} {int(east)}',
            f'dcgm_enricher_upstream_field_missing{{field="gpu_util",{here}}} {int(not east)}',
        ]
        return ("\n".join(lines) + "\n").encode()
    gpus = sick_gpus(cluster, turned)
    lines = []
    for field in _HEALTHY:
        name = f"DCGM_FI_DEV_{field}"
        counter = field in _COUNTERS
        lines.append(f"# TYPE {name} {'counter' if counter else 'gauge'}")
        # GPU 1 writes no counter: a rate over the last seconds of a series that stopped
        # answers where a server took two samples of it and not where it took one.
        lines += [
            f'{name}{{gpu="{gpu}",UUID="GPU-0000000{gpu}-2222-4000-8000-00000000000{gpu}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="{SICK_HOST}",'
            f'container="",namespace="",pod="",node="{SICK_NODE}"}} {values[field]}'
            for gpu, values in gpus.items()
            if not (counter and gpu == "1")
        ]
    who = 'namespace="jupyterhub",pod="jupyter-bob"'
    lines += [
        "# TYPE gpu_container_last_active_timestamp_seconds gauge",
        f'gpu_container_last_active_timestamp_seconds{{Hostname="{SICK_HOST}",gpu="2",'
        f'UUID="GPU-00000002-2222-4000-8000-000000000002",{who},container="notebook",'
        f'node="{SICK_NODE}"}} '
        f"{1.7e9 if east else 1.75e9:.0f}",
        "# TYPE gpu_pod_info gauge",
        f'gpu_pod_info{{{who},annotation_hub_jupyter_org_username="bob@example.com",'
        f'gpu_requested="true",node="{SICK_NODE}",workload_kind="Pod",'
        'workload_name="jupyter-bob"} 1',
    ]
    return ("\n".join(lines) + "\n").encode()


class SickNodes:
    """The sick nodes' enrichers: 2 and 3 served from a thread, 4 a port that refuses.
    ``turned``: node 2's faults that come on while the servers watch have come on."""

    def __init__(self) -> None:
        self.turned = False
        self.http = TextServer(lambda path: render_sick_node(path, self.turned))
        self.dead = socket.socket()
        self.dead.bind(("127.0.0.1", 0))  # bound, never listening: every connection refused

    def scrape_job(self, demo: FrozenDemo, cluster: str) -> dict[str, Any]:
        """The demo's job with the sick nodes' enrichers beside it, each with its own labels."""
        job = demo.scrape_job()
        live = f"127.0.0.1:{self.http.port}"
        dead = f"127.0.0.1:{self.dead.getsockname()[1]}"
        for n, address in (("2", live), ("3", live), ("4", dead)):
            instance = f"gpu-node-{n}:9400"
            job["static_configs"].append(
                {
                    "targets": [address],
                    "labels": {"instance": instance, "__metrics_path__": f"/{cluster}/{n}"},
                }
            )
            job["relabel_configs"] += [
                {
                    "source_labels": ["instance"],
                    "regex": instance,
                    "target_label": label,
                    "replacement": value,
                }
                for label, value in (("node", f"gpu-node-{n}"), ("pod", f"dcgm-enricher-n{n}"))
            ]
        return job

    def close(self) -> None:
        self.http.close()
        self.dead.close()


# What sets off each alert the run compares: on every server, for each cluster, its expression
# answers, so that the comparison compares answers (the test fails where one answers nothing).
ACTIVE = {
    "GpuAllocatedIdle": "the demo: finetune-mistral-0 and llama-eval-7xq2m leave their GPUs idle",
    "GpuMemoryHeldWhileIdle": "the demo: llama-eval-7xq2m holds memory on an idle GPU",
    "GpuHeldIdle": "node 2: jupyter-bob last used GPU 2 in 2023",
    "GpuUsedWithoutRequest": "the demo: jupyter-alice uses GPU 3 without requesting one",
    "GpuMemoryNearlyFull": "node 2: GPU 0's framebuffer is 97% used",
    "GpuXidCriticalError": "node 2: GPU 0's last XID is critical",
    "GpuXidError": "node 2: GPU 2 gets a non-critical XID while the servers watch",
    "GpuTemperatureHigh": "node 2: GPU 0 is at 91 C (east) or 88 C (west)",
    "GpuRowRemapFailure": "node 2: GPU 0 failed a row remap",
    "GpuFabricUnhealthy": "node 2: GPU 0's NVLink fabric is unhealthy (east) or limited (west)",
    "GpuUncorrectableRemappedRows": "node 2: GPU 2 remaps a row after an uncorrectable error",
    "GpuPcieReplaysHigh": "node 2: a burst of PCIe replays on GPU 2",
    "GpuNotReporting": "node 2: GPU 1 stops reporting while GPUs 0 and 2 report",
    "GpuDeviceTainted": "the demo: GPU 7, in use, has a DRA device taint",
    "GpuMemoryUnattributed": "the demo: a host process on GPU 2's MIG instance 5",
    "GpuEnricherDown": "node 4: its enricher does not answer",
    "GpuEnricherMemoryNearLimit": "node 3: its enricher over 90% of its memory limit",
    "GpuEnricherUpstreamFieldMissing": (
        "node 3: its exporter's last body lacked fb_used (east) or gpu_util (west)"
    ),
    **{
        f"GpuEnricher{name}Down": "node 3: its enricher lost every source"
        for name in (
            "Upstream",
            "Nvml",
            "Kubernetes",
            "Procfs",
            "PodResources",
            "ResourceSlices",
            "Docker",
        )
    },
}
# Alerts the run compares that no data here can set off, and why.
QUIET = {
    "GpuPodMemoryGrowing": "compares a container's memory with its last day: the servers hold "
    "seconds, where a jump stands out for one sample at most",
}


@dataclass
class Fleet:
    receiver: Server
    own: dict[str, Server]  # cluster -> that cluster's own Prometheus
    at: float = 0.0  # the one evaluation time every comparison uses

    def per_cluster(self, expr: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """The receiver's answer at ``at``, split by cluster (less the label)."""
        out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {c: {} for c in CLUSTERS}
        for sample in self.receiver.api("query", query=expr, time=str(self.at))["result"]:
            labels = dict(sample["metric"])
            cluster = labels.pop(CLUSTER, None)
            assert cluster in CLUSTERS, f"a series of no cluster: {sample['metric']}\n{expr}"
            out[cluster][tuple(sorted(labels.items()))] = float(sample["value"][1])
        return out

    def own_answer(self, cluster: str, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        result = self.own[cluster].api("query", query=expr, time=str(self.at))["result"]
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in result}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    release: PromRelease = require(releases()[1])  # agent mode as Prometheus 3.5 has it
    tmp = tmp_path_factory.mktemp("clusters")
    demos = {c: FrozenDemo(tmp / f"demo-{c}") for c in CLUSTERS}
    sick = SickNodes()
    with_rules = {"global": EVERY_SECOND, "rule_files": [str(RULES)]}
    try:
        with serve(
            release, with_rules, tmp / "receiver", flags=["--web.enable-remote-write-receiver"]
        ) as receiver:
            own: dict[str, Server] = {}
            with contextlib.ExitStack() as stack:
                for c, demo in demos.items():
                    own[c] = stack.enter_context(
                        serve(
                            release,
                            {**with_rules, "scrape_configs": [sick.scrape_job(demo, c)]},
                            tmp / f"own-{c}",
                        )
                    )
                    agent = {
                        "global": {**EVERY_SECOND, "external_labels": {CLUSTER: c}},
                        "scrape_configs": [sick.scrape_job(demo, c)],
                        "remote_write": [
                            {
                                "url": f"{receiver.url}/api/v1/write",
                                "queue_config": {"batch_send_deadline": "1s"},
                            }
                        ],
                    }
                    stack.enter_context(serve(release, agent, tmp / f"agent-{c}", agent=True))
                built = Fleet(receiver, own)
                # Every comparison at the instant _wait_for_rules found both sides agree on:
                # a later one can catch the receiver a remote-write batch behind.
                _wait_for_rules(built, receiver, sick)
                yield built
    finally:
        sick.close()
        for demo in demos.values():
            demo.close()


def _answers(fleet: Fleet, expr: str) -> list[int]:
    """How many series ``expr`` answers, for each cluster on its own Prometheus and on the
    receiver."""
    return [
        n
        for c in CLUSTERS
        for n in (len(fleet.own_answer(c, expr)), len(fleet.per_cluster(expr)[c]))
    ]


def _wait_for_rules(fleet: Fleet, receiver: Server, sick: SickNodes) -> None:
    """Until every recording rule has the same series on the receiver, for each cluster, as
    on that cluster's own Prometheus (remote write and the rules have caught up), and every
    server has seen node 2 before its faults came on and after."""
    records = [name for kind, name, _ in rules() if kind == "record"]
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        if not sick.turned:  # as soon as every server holds a sample from before
            fleet.at = time.time()
            sick.turned = all(_answers(fleet, SICK_BEFORE))
        fleet.at = time.time() - 3
        behind = [
            (name, c)
            for name in records
            for c in CLUSTERS
            if set(fleet.own_answer(c, name)) != set(fleet.per_cluster(name)[c])
        ]
        settled = all(
            fleet.own_answer(c, f'count_over_time(up{{node="{NODE}"}}[1m]) >= 3')
            and len(fleet.per_cluster(DEMO_GPUS)[c]) == 8
            for c in CLUSTERS
        )
        ready = (
            settled
            and not behind
            and sick.turned
            and all(all(_answers(fleet, expr)) for expr in SICK_AFTER)
            and not any(_answers(fleet, SICK_GONE))
        )
        if ready:
            return
        assert time.monotonic() < deadline, (
            f"not on the receiver: {behind}; the demo settled: {settled}; node 2's faults on: "
            f"{sick.turned}\n{receiver.log_tail()}"
        )
        time.sleep(1)


def _values_differ_by_design(expr: str) -> bool:
    """Whether the servers may hold different values for ``expr``: it reads a range of samples
    (how many depends on how long each server has held data: they started moments apart), or
    the enricher's own timings and process figures, which change with every scrape (each
    server scraped at its own instants); the GPU series of the stopped demo do not."""
    return "[" in expr or "_duration_seconds" in expr or "process_" in expr


def _compare(
    fleet: Fleet, name: str, expr: str, own_expr: str | None = None, definition: str = ""
) -> None:
    """``definition``: what a record's name stands for, which decides whether its values may
    differ by design (a record of a range, such as the chargeback's subqueries)."""
    receiver = fleet.per_cluster(expr)
    for cluster in CLUSTERS:
        own = fleet.own_answer(cluster, own_expr or expr)
        got = receiver[cluster]
        assert set(got) == set(own), f"{name} on the receiver, {cluster}:\n{expr}"
        if not _values_differ_by_design(definition or expr):
            for labels, value in own.items():
                assert got[labels] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, labels)


@pytest.mark.one_python
def test_the_receiver_holds_both_clusters(fleet: Fleet) -> None:
    gpus = fleet.per_cluster(DEMO_GPUS)
    assert all(len(gpus[c]) == 8 for c in CLUSTERS), gpus


@pytest.mark.one_python
@pytest.mark.parametrize(
    ("record", "expr"),
    [pytest.param(name, expr, id=name) for kind, name, expr in rules() if kind == "record"],
)
def test_each_recording_rule_per_cluster_equals_the_clusters_own(
    fleet: Fleet, record: str, expr: str
) -> None:
    _compare(fleet, record, record, definition=expr)


@pytest.mark.one_python
@pytest.mark.parametrize(
    ("alert", "expr"),
    [(name, expr) for kind, name, expr in rules() if kind == "alert" and name not in CLUSTERLESS],
    ids=str,
)
def test_each_alert_per_cluster_equals_the_clusters_own(
    fleet: Fleet, alert: str, expr: str
) -> None:
    answers = _answers(fleet, expr)  # per cluster: its own Prometheus, the receiver
    if alert in QUIET:
        assert not any(answers), f"{alert} answers {answers}: move it from QUIET to ACTIVE"
    else:
        assert all(answers), f"{alert} answers {answers}: the comparison would be of empty sets"
    _compare(fleet, alert, expr)


@pytest.mark.parametrize("where", ["own", "receiver"])
def test_no_alert_describes_a_blank_node(fleet: Fleet, where: str) -> None:
    """Every alert that fires or waits on a node's GPUs or enricher names the node, on both
    dcgm-exporter releases of the fleet (hostname on the demo's nodes, Hostname on node 2),
    on each cluster's own Prometheus and on the receiver; only the alerts about a scrape
    target (up) have none to give."""
    seen = set()
    for c in CLUSTERS:
        answer = fleet.own_answer(c, "ALERTS") if where == "own" else fleet.per_cluster("ALERTS")[c]
        for labels in answer:
            alert = dict(labels)
            if alert["alertname"] in ("GpuEnricherDown", "GpuEnricherAbsent"):
                continue
            assert alert.get("node"), alert
            seen.add((alert["alertname"], alert["node"]))
    assert {node for _, node in seen} >= {SICK_NODE, "gpu-node-3"}, seen


def test_each_alert_compared_is_set_off_or_says_why_not() -> None:
    compared = {name for kind, name, _ in rules() if kind == "alert"} - set(CLUSTERLESS)
    assert set(ACTIVE) | set(QUIET) == compared
    assert not set(ACTIVE) & set(QUIET)


@pytest.mark.one_python
@pytest.mark.parametrize(("ref", "expr"), panel_queries(), ids=[q[0] for q in panel_queries()])
def test_each_dashboard_query_per_cluster_equals_the_clusters_own(
    fleet: Fleet, ref: str, expr: str
) -> None:
    """The query with the cluster variable on All, per cluster on the receiver, against the
    cluster's own Prometheus (whose series carry no cluster label: the variable matches the
    empty value there)."""
    _compare(fleet, ref, expr)
