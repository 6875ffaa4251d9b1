"""The Grafana dashboards, and the dashboards and rules against a real Prometheus.

Static checks read the family of dashboards (grafana/*.json). The end-to-end checks start the
demo node (`dcgm-enricher demo`: the real enricher over a simulated GPU node, since there is no
GPU here) and two real Prometheus servers scraping it every second, once per release (Debian
12's 2.42, the 3.5 LTS: tests/promreleases.py): one with honor_labels: true, the rules loaded
and target labels added the way the Prometheus Operator adds them, one with honor_labels: false
(the rules loaded too, for the panels that read the dashboard's records). Every panel query of
the five dashboards (each once: devkit.dashboard.queries()), with the variables set to
match-all, runs through Prometheus's HTTP API in both label modes and must return series; every
recording rule must produce data; the alerts that the demo's situations call for must be
pending or firing, and no other.

Checks that need something the demo does not serve yet are expected failures, decided from
the demo's own /metrics: they turn into ordinary checks as soon as the demo has what they need.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit import fieldquery
from devkit.dashboard import (
    BOARDS,
    RULES,
    Query,
    alerts,
    dashboard,
    interpolate,
    queries,
    records,
    variables,
)
from devkit.http import get
from devkit.ports import free_port
from devkit.processes import Commands
from devkit.prometheus import EVERY_SECOND
from devkit.tools import load_script
from enricher import demo as demo_module
from enricher.config import Config
from enricher.fieldtable import table

from .promreleases import PromRelease, serve

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
CONFIGMAP = ROOT / "manifests" / "monitoring" / "grafana-dashboard.yaml"
PROVIDER = ROOT / "grafana" / "provisioning" / "dashboards.yaml"
DS = {"type": "prometheus", "uid": "${datasource}"}
BUILTIN_DS = {"type": "grafana", "uid": "-- Grafana --"}
ENRICHER_POD = "dcgm-enricher-e2e-x7k2p"
ENRICHER_NAMESPACE = "gpu-monitoring"
ENRICHER_CONTAINER = "dcgm-enricher"
# Label prefix per label mode (the dashboard's label_prefix variable).
MODES = {"honor_labels": "", "exported": "exported_"}
GIB = 2**30


@pytest.mark.parametrize(
    ("text", "prefix", "expected"),
    [
        pytest.param('x{a=~"$node"}', "", 'x{a=~".*"}', id="all-value"),
        pytest.param("by (${label_prefix}pod)", "exported_", "by (exported_pod)", id="prefix"),
        pytest.param("by (${label_prefix}pod)", "", "by (pod)", id="no-prefix"),
        pytest.param("rate(x[$__rate_interval])", "", "rate(x[15s])", id="builtin"),
        pytest.param("{{${label_prefix}pod}}", "exported_", "{{exported_pod}}", id="legend"),
    ],
)
def test_interpolate(text: str, prefix: str, expected: str) -> None:
    assert interpolate(text, prefix) == expected


# --------------------------------------------------------------------------- static checks


# Each dashboard: its uid and title (the mixin's _config defaults) and its variables.
BOARD_META = {
    "cluster": ("dcgm-enricher-gpu", "GPU / Cluster", ["cluster"]),
    "namespace": ("dcgm-enricher-namespace", "GPU / Namespace (Pods)", ["cluster", "namespace"]),
    "pod": ("dcgm-enricher-pod", "GPU / Pod", ["cluster", "namespace", "pod"]),
    "node": ("dcgm-enricher-node", "GPU / Node", ["cluster", "node"]),
    "enricher": ("dcgm-enricher-self", "GPU / Enricher", ["cluster"]),
}


def test_uid_title_variables_and_schema() -> None:
    assert list(BOARD_META) == list(BOARDS)
    for board, (uid, title, scope) in BOARD_META.items():
        d = dashboard(board)
        assert (d["uid"], d["title"]) == (uid, title), board
        assert d["schemaVersion"] >= 39
        assert "id" not in d, "a provisioned dashboard must not carry a database id"
        assert d["links"] == [], "the chart adds the runbook's link to an empty list"
        v = variables(board)
        assert list(v) == ["datasource", "label_prefix", *scope], board
        assert v["label_prefix"]["type"] == "textbox" and v["label_prefix"]["query"] == ""
        for name in scope:
            var = v[name]
            assert var["type"] == "query" and var["datasource"] == DS, name
            assert var["definition"] == var["query"]["query"], name
            # The widest scope offers All; a narrower one is one value (the first by default):
            # its full list at the narrower dashboard, never every value at once.
            every = name == "cluster"
            assert var["includeAll"] is var["multi"] is every, (board, name)
            assert var.get("allValue") == (".*" if every else None), (board, name)


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", value
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("board", list(BOARDS))
def test_no_hard_coded_datasource(board: str) -> None:
    found = [(p, v) for p, v in _walk(dashboard(board)) if p.endswith(".datasource")]
    assert found
    bad = [(p, v) for p, v in found if v not in (DS, BUILTIN_DS)]
    assert bad == []
    for panel in dashboard(board)["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == DS, panel["title"]
            assert all(t["datasource"] == DS for t in panel["targets"]), panel["title"]
    ds = variables(board)["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"


# Each panel of the one dashboard the family replaced, (its row, its title): its home.
HOMES = {
    "cluster": [
        ("Overview", "GPUs"),
        ("Overview", "GPUs in use"),
        ("Overview", "Pods on GPUs"),
        ("Overview", "GPU memory used"),
        ("Overview", "Memory unattributed"),
        ("Overview", "Allocated but idle"),
        ("Memory", "GPU memory by namespace"),
        ("Utilization", "SM utilization by namespace"),
        ("Waste", "Allocated and in use, by namespace"),
        ("Power and energy", "Power by namespace"),
        ("Power and energy", "kWh per namespace per day"),
    ],
    "namespace": [
        ("Memory", "GPU memory by pod"),
        ("Memory", "GPU memory by workload"),
        ("Memory", "GPU memory by user"),
        ("Utilization", "SM utilization by pod"),
        ("Top pods", "Top pods by GPU memory"),
        ("Waste", "Allocated but idle"),
        ("Waste", "Memory held while idle"),
        ("Waste", "Used without request"),
        ("Waste", "Idle since"),
        ("Power and energy", "Energy per workload and user, last day"),
    ],
    "pod": [],
    "node": [
        ("Memory", "Unattributed GPU memory by reason"),
        ("Shared GPUs", "Pods per shared device"),
        ("Shared GPUs", "Memory split on shared devices"),
        ("Shared GPUs", "SM split on shared devices"),
        ("Power and energy", "Watts by pod on shared GPUs"),
        *[
            ("Device health", t)
            for t in (
                "Temperature",
                "Power",
                "Device memory used",
                "GPU utilization",
                "Last XID",
                "Remapped memory rows",
                "Fabric health",
                "PCIe replays",
                "Clocks",
                "DRA device taints",
            )
        ],
    ],
    "enricher": [
        ("dcgm-enricher", t)
        for t in (
            "Sources up (worst node)",
            "Enrichers reporting",
            "Pod watch age",
            "Upstream lines dropped",
            "Sources per enricher",
            "Source duration (slowest enricher)",
            "Source errors",
            "GPU processes",
            "Enricher CPU (millicores)",
            "Enricher memory (RSS)",
            "Upstream requests per collection",
            "Scrapes, upstream requests and collections",
            "Bytes sent to scrapers",
        )
    ],
}
TODAYS_PANELS = 49


def test_every_panel_of_the_replaced_dashboard_has_a_home() -> None:
    """Each of the 49 panels of the one dashboard the family replaced is in its home
    dashboard (docs/dashboard.md's table says which), with its own title."""
    homes = [(board, *panel) for board, panels in HOMES.items() for panel in panels]
    assert len(homes) == len({h[1:] for h in homes}) == TODAYS_PANELS
    for board, _, title in homes:
        titles = {p["title"] for p in dashboard(board)["panels"]}
        assert title in titles, (board, title)
    doc = (ROOT / "docs" / "dashboard.md").read_text()
    for board, row, title in homes:
        assert f"| {row} | {title} | {BOARD_META[board][1]} |" in doc, (board, title)


def test_top_tables_are_topk_with_the_full_list_a_click_away() -> None:
    """The widest dashboard's "Top" tables ask topk, and each row links to the narrower
    dashboard that lists everything; every data link of the family names a dashboard of it,
    and keeps the data source, the label prefix, the cluster and the time range."""
    uids = {meta[0] for meta in BOARD_META.values()}
    top = [p for p in dashboard("cluster")["panels"] if p["title"].startswith("Top ")]
    assert len(top) == 2
    for panel in top:
        assert panel["targets"][0]["expr"].startswith("topk by (cluster) (10, "), panel
        links = [
            link
            for o in panel["fieldConfig"]["overrides"]
            for p in o["properties"]
            if p["id"] == "links"
            for link in p["value"]
        ]
        assert links and all("/d/dcgm-enricher-namespace/" in x["url"] for x in links)
    found = 0
    for board in BOARDS:
        for path, value in _walk(dashboard(board)):
            if path.endswith(".url") and "/d/" in value:
                found += 1
                assert value.split("/")[2] in uids, value
                for part in ("${datasource:queryparam}", "${label_prefix:queryparam}"):
                    assert part in value, value
                assert "${cluster:queryparam}" in value and "${__url_time_range}" in value
    assert found >= 10


@pytest.mark.parametrize("board", list(BOARDS))
def test_layout_ids_and_descriptions(board: str) -> None:
    panels = dashboard(board)["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & area, f"{p['title']} overlaps another panel"
        cells |= area
        if p["type"] != "row":
            assert len(p["description"]) > 20, p["title"]


def test_queries_name_pod_labels_through_the_prefix() -> None:
    """Every pod label a query or legend names goes through ${label_prefix}, so the one
    switch serves Prometheus setups with and without honor_labels."""
    bare = re.compile(r"(?<![\w}$])(namespace|pod|container)\b(?!\s*\()")
    for q in queries():
        assert not bare.findall(q.expr), f"{q.id}: {q.expr}"
        assert not bare.findall(q.legend), f"{q.id}: {q.legend}"
    for name in ("namespace", "pod"):
        assert not bare.findall(variables()[name]["definition"]), name


def test_generated_files_are_up_to_date() -> None:
    """The mixin's dashboards are what grafana/generate.py builds; the shipped dashboards and
    their ConfigMap are the mixin's build of them (tests/test_mixin.py builds them apart)."""
    # grafana-foundation-sdk needs Python 3.11: the generator runs in the highest Python only.
    generate = load_script(ROOT / "grafana" / "generate.py", "grafana_generate")
    assert generate.main(["--check"]) == 0, "run python grafana/generate.py"
    built = generate.render_dashboards()
    assert list(built) == list(BOARDS.values())
    for name, text in built.items():
        assert (ROOT / "grafana" / name).read_text() == text, "run python grafana/generate.py"
    assert CONFIGMAP.read_text() == generate.render_configmap(built)


def test_configmap_for_the_grafana_sidecar() -> None:
    cm = yaml.safe_load(CONFIGMAP.read_text())
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert list(cm["data"]) == list(BOARDS.values())
    for board, name in BOARDS.items():
        assert json.loads(cm["data"][name]) == dashboard(board)
    # kubectl apply keeps the whole object, as JSON, in an annotation: all of a ConfigMap's
    # annotations are limited to 256 KiB. Keep a tenth of it free.
    applied = json.dumps(cm, separators=(",", ":"))
    assert len(applied) < 256 * 1024 * 0.9, len(applied)


def test_file_provider_example() -> None:
    doc = yaml.safe_load(PROVIDER.read_text())
    assert doc["apiVersion"] == 1
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")


# --------------------------------------------------------------------------- the live stack

# What the demo must serve for a check to apply, and why it is an expected failure until then.
NEEDS = {
    "allocation": "the demo serves no gpu_container_allocated yet: it comes with the kubelet "
    "PodResources source and the demo's allocated GPUs (issue 4)",
    "remapped-rows": "the demo's simulated dcgm-exporter does not serve the remapped-row "
    "fields (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, "
    "DCGM_FI_DEV_ROW_REMAP_FAILURE) yet",
    "idle-holder": "the demo has no container that holds GPU memory at zero utilization "
    "(issue 4's 'held memory while idle') yet",
    "fabric-health": "the demo's A100s have no NVLink fabric health to report (NVML has it "
    "from Hopper on, and dcgm-exporter collects it only where enabled): GpuFabricUnhealthy's "
    "promtool case and the two-cluster run in test_clusters.py read the field",
}
QUERY_NEEDS = {
    "cluster/Devices/GPUs allocated/A": "allocation",
    "cluster/Devices/Allocated but idle/A": "allocation",
    "cluster/Devices/Held while idle/A": "idle-holder",
    "cluster/By namespace/Allocated and in use, by namespace/A": "allocation",
    "cluster/Health/Nodes with remapped rows/A": "remapped-rows",
    "namespace/Allocated and used/Allocated but idle/A": "allocation",
    "namespace/Allocated and used/Memory held while idle/A": "idle-holder",
    "namespace/Chargeback/GPU-hours, last day/A": "allocation",
    "pod/Containers on devices/Allocation/A": "allocation",
    "pod/Its devices' health/Remapped rows of its GPUs/A": "remapped-rows",
    "pod/Its devices' health/Remapped rows of its GPUs/B": "remapped-rows",
    "node/Health and taints/Remapped memory rows/A": "remapped-rows",
    "node/Health and taints/Remapped memory rows/B": "remapped-rows",
    "node/Health and taints/Remapped memory rows/C": "remapped-rows",
    "node/Health and taints/Fabric health/A": "fabric-health",
}
RECORD_NEEDS = {
    "namespace:gpu_container_allocated:sum": "allocation",
    "namespace:gpu_allocated_hours:increase1h": "allocation",
}
# The alerts the demo node's situations call for.
EXPECTED_ALERTS = {
    "GpuUsedWithoutRequest": None,  # jupyter-alice requested no GPU
    "GpuMemoryUnattributed": None,  # a host process on a MIG instance
    "GpuAllocatedIdle": "allocation",  # an allocated GPU with no process
    "GpuMemoryHeldWhileIdle": "idle-holder",
    "GpuDeviceTainted": None,  # the DRA driver's taint on dra-train-0's GPU 7
}
# Labels a legend may name that some series legitimately lack (Grafana prints nothing).
OPTIONAL_LEGEND_LABELS = {"GPU_I_ID", "cluster"}
DEADLINE_SECONDS = 60


def _prometheus_config(target: str, honor: bool, itself: str) -> dict[str, Any]:
    """Prometheus scraping the demo (``target``) as the manifests do, and ``itself``, another
    target with process_* series (as every real Prometheus has many)."""
    relabel = [
        # What the Prometheus Operator gives every target: the scraped pod's own labels.
        {"target_label": "pod", "replacement": ENRICHER_POD},
        {"target_label": "namespace", "replacement": ENRICHER_NAMESPACE},
        {"target_label": "container", "replacement": ENRICHER_CONTAINER},
        {"target_label": "node", "replacement": "demo-gpu-node-1"},
    ]
    config: dict[str, Any] = {
        "global": EVERY_SECOND,
        "scrape_configs": [
            {
                "job_name": "dcgm-enricher",
                "honor_labels": honor,
                "static_configs": [{"targets": [target]}],
                "relabel_configs": relabel,
            },
            {"job_name": "prometheus", "static_configs": [{"targets": [itself]}]},
        ],
    }
    # The rules in both modes: the panels that read the dashboard's records
    # (namespace_pod_device:*) must show data with honor_labels: false too. The alerts and
    # the other records are checked on the honor_labels server only.
    config["rule_files"] = [str(RULES)]
    if honor:
        relabel.append({"target_label": "cluster", "replacement": "e2e"})
    return config


def _needs_met(metrics_text: str) -> set[str]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    met = set()
    if samples.get("gpu_container_allocated"):
        met.add("allocation")

    def written(field: str) -> bool:
        """Whether the body has ``field`` under any of its names (whatever release the
        demo's exporter speaks); prometheus_client names a counter's samples <name>_total."""
        names = table().names(field)
        return any(samples.get(name) or samples.get(name + "_total") for name in names)

    remap = ("uncorrectable_remapped_rows", "correctable_remapped_rows", "row_remap_failure")
    if all(written(field) for field in remap):
        met.add("remapped-rows")
    if written("fabric_health"):
        met.add("fabric-health")
    memory = {
        tuple(sorted(lbl.items())): v
        for lbl, v in samples.get("gpu_container_memory_used_bytes", [])
    }
    for lbl, util in samples.get("gpu_container_utilization_ratio", []):
        if util < 0.01 and memory.get(tuple(sorted(lbl.items())), 0) > GIB:
            met.add("idle-holder")
    return met


_C = 'namespace="ml",pod="p",container="c",UUID="GPU-0"'


@pytest.mark.parametrize(
    ("text", "met"),
    [
        pytest.param("", set(), id="nothing"),
        pytest.param(f"gpu_container_allocated{{{_C}}} 1\n", {"allocation"}, id="allocation"),
        pytest.param(
            'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu="0"} 0\n'
            'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu="0"} 0\n'
            'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0"} 0\n',
            {"remapped-rows"},
            id="remapped-rows",
        ),
        pytest.param(
            'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0"} 0\n', set(), id="one-remap-field-only"
        ),
        pytest.param(
            f"gpu_container_memory_used_bytes{{{_C}}} 2e9\n"
            f"gpu_container_utilization_ratio{{{_C}}} 0\n",
            {"idle-holder"},
            id="idle-holder",
        ),
        pytest.param(
            f"gpu_container_memory_used_bytes{{{_C}}} 2e9\n"
            f"gpu_container_utilization_ratio{{{_C}}} 0.5\n",
            set(),
            id="busy-holder",
        ),
        pytest.param(
            f"gpu_container_memory_used_bytes{{{_C}}} 1e8\n"
            f"gpu_container_utilization_ratio{{{_C}}} 0\n",
            set(),
            id="idle-small",
        ),
    ],
)
def test_needs_met(text: str, met: set[str]) -> None:
    assert _needs_met(text) == met


@dataclass
class Stack:
    prometheus: dict[str, str]  # label mode -> base URL
    needs_met: set[str]
    deadline: float

    def query(self, mode: str, promql: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus[mode]}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            body = json.loads(get(url))
        except urllib.error.HTTPError as exc:
            pytest.fail(f"Prometheus rejected the query ({exc.code}): {exc.read()!r}\n{promql}")
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def poll(self, mode: str, promql: str) -> list[dict[str, Any]]:
        """The query's result once it has series, or its last (empty) result at the deadline."""
        while True:
            result = self.query(mode, promql)
            if result or time.monotonic() > self.deadline:
                return result
            time.sleep(0.5)

    def series(self, mode: str, selector: str) -> list[dict[str, str]]:
        url = f"{self.prometheus[mode]}/api/v1/series?" + urllib.parse.urlencode(
            {"match[]": selector, "start": str(time.time() - 300)}
        )
        result: list[dict[str, str]] = json.loads(get(url))["data"]
        return result

    def require(self, need: str | None) -> None:
        if need is not None and need not in self.needs_met:
            pytest.xfail(NEEDS[need])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prom_release: PromRelease) -> Iterator[Stack]:
    """The demo and two servers of one Prometheus release (the whole module runs per release)."""
    tmp = tmp_path_factory.mktemp(f"e2e-{prom_release.id}")
    with Commands(tmp) as commands, contextlib.ExitStack() as servers:
        demo_port = free_port()
        commands.start(
            "demo",
            [
                sys.executable,
                "-m",
                "enricher",
                "demo",
                "--web.listen-address",
                f"127.0.0.1:{demo_port}",
            ],
        )
        metrics = ""
        wait_until = time.monotonic() + 30
        while not metrics and time.monotonic() < wait_until:
            try:
                metrics = get(f"http://127.0.0.1:{demo_port}/metrics").decode()
            except OSError:
                time.sleep(0.2)
        assert metrics, "the demo did not serve /metrics:\n" + commands.tail("demo")
        proms = {}
        for mode, prefix in MODES.items():
            port = free_port()
            config = _prometheus_config(
                f"127.0.0.1:{demo_port}", honor=prefix == "", itself=f"127.0.0.1:{port}"
            )
            proms[mode] = servers.enter_context(serve(prom_release, config, tmp / mode, port=port))
        urls = {mode: prom.url for mode, prom in proms.items()}
        built = Stack(urls, _needs_met(metrics), time.monotonic() + DEADLINE_SECONDS)
        for mode in MODES:
            # Two scrapes in: rates have two points and every rule has run.
            up = built.poll(mode, 'count_over_time(up{job="dcgm-enricher"}[1m]) >= 3')
            assert up, f"Prometheus ({mode}) did not scrape the demo:\n" + proms[mode].log_tail()
        yield built


def _legend_labels(legend: str, prefix: str) -> set[str]:
    if legend == "__auto":
        return set()
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", interpolate(legend, prefix)))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("query", queries(), ids=lambda q: q.id)
def test_panel_query_returns_series(stack: Stack, query: Query, mode: str) -> None:
    stack.require(QUERY_NEEDS.get(query.id))
    prefix = MODES[mode]
    result = stack.poll(mode, interpolate(query.expr, prefix))
    assert result, f"no series for {query.id} ({mode}):\n{interpolate(query.expr, prefix)}"
    required = _legend_labels(query.legend, prefix) - OPTIONAL_LEGEND_LABELS
    for series in result:
        missing = {name for name in required if not series["metric"].get(name)}
        assert not missing, f"{query.id}: legend names {missing}, absent from {series['metric']}"


def readme_install_checks() -> list[Any]:
    """The queries README.md gives to check an install, each after its comment: one that ends
    in ``: none.`` returns nothing, ``: one`` one series, any other at least one."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^## Check the install\n.*?^```promql\n(.*?)^```", text, re.M | re.S)
    assert block is not None, "README has no PromQL block under 'Check the install'"
    lines = block[1].splitlines()
    assert len(lines) % 2 == 0 and all(c.startswith("# ") for c in lines[::2]), lines
    return [
        pytest.param(
            comment[2:], expr, id=f"{i}-" + re.findall(r"\b(?:DCGM|dcgm|gpu)_\w+", expr)[0]
        )
        for i, (comment, expr) in enumerate(zip(lines[::2], lines[1::2], strict=True))
    ]


@pytest.mark.parametrize(("comment", "expr"), readme_install_checks())
def test_readme_install_check(stack: Stack, comment: str, expr: str) -> None:
    """What README.md says each check returns on a healthy install: the demo node scraped with
    honor_labels, as the manifests scrape it."""
    if comment.endswith(": none."):
        stack.poll("honor_labels", "count(gpu_container_memory_used_bytes)")  # data is in
        assert stack.query("honor_labels", expr) == [], comment
    elif ": one " in comment or comment.endswith(": one."):
        assert len(stack.poll("honor_labels", expr)) == 1, comment
    else:
        assert stack.poll("honor_labels", expr), comment


def test_every_need_is_used() -> None:
    used = set(QUERY_NEEDS.values()) | set(RECORD_NEEDS.values())
    used |= {n for n in EXPECTED_ALERTS.values() if n}
    assert used == set(NEEDS)
    ids = {q.id for q in queries()}
    assert set(QUERY_NEEDS) <= ids, set(QUERY_NEEDS) - ids


def _variable_cases() -> list[Any]:
    cases = []
    for name, var in variables().items():
        if var["type"] != "query":
            continue
        for mode in MODES:
            marks = ()
            if name == "cluster" and mode == "exported":
                continue  # only the honor_labels server adds a cluster label
            cases.append(pytest.param(name, mode, id=f"{name}-{mode}", marks=marks))
    return cases


@pytest.mark.parametrize(("name", "mode"), _variable_cases())
def test_variable_has_values(stack: Stack, name: str, mode: str) -> None:
    m = re.fullmatch(r"label_values\((.+), (\S+)\)", variables()[name]["definition"])
    assert m, variables()[name]["definition"]
    selector = interpolate(m.group(1), MODES[mode])
    label = interpolate(m.group(2), MODES[mode])
    values = {s[label] for s in stack.series(mode, selector) if s.get(label)}
    assert values, f"variable {name} ({mode}) has no values: {selector}, {label}"


@pytest.mark.parametrize("record", records())
def test_recording_rule_produces_data(stack: Stack, record: str) -> None:
    stack.require(RECORD_NEEDS.get(record))
    assert stack.poll("honor_labels", record), f"{record} has no data"


@pytest.mark.parametrize("alert", list(EXPECTED_ALERTS))
def test_demo_situation_raises_its_alert(stack: Stack, alert: str) -> None:
    stack.require(EXPECTED_ALERTS[alert])
    active = stack.poll(
        "honor_labels", f'ALERTS{{alertname="{alert}", alertstate=~"pending|firing"}}'
    )
    assert active, f"{alert} is neither pending nor firing on the demo node"


def test_no_other_alert_is_active(stack: Stack) -> None:
    assert set(EXPECTED_ALERTS) <= set(alerts())
    # Give every rule a few evaluations first.
    stack.poll("honor_labels", 'ALERTS{alertname="GpuUsedWithoutRequest"}')
    time.sleep(3)
    active = {
        s["metric"]["alertname"]
        for s in stack.query("honor_labels", 'ALERTS{alertstate=~"pending|firing"}')
    }
    assert active - set(EXPECTED_ALERTS) == set()


def test_no_gpu_series_names_the_enricher_pod(stack: Stack) -> None:
    """honor_labels: true with the operator's target labels: every GPU series keeps the
    workload's pod labels (or none); only the enricher's own series name the enricher."""
    own = stack.poll("honor_labels", f'dcgm_enricher_build_info{{pod="{ENRICHER_POD}"}}')
    assert own, "the target labels did not reach the enricher's own series"
    gpu = f'__name__=~"{table().prefix}.*|gpu_.*"'
    for label, value in (
        ("pod", ENRICHER_POD),
        ("namespace", ENRICHER_NAMESPACE),
        ("container", ENRICHER_CONTAINER),
    ):
        named = stack.query("honor_labels", f'count by (__name__) ({{{gpu}, {label}="{value}"}})')
        assert named == [], f"GPU series carry {label}={value}: {named}"
    assert stack.query("honor_labels", f'count({{{gpu}, exported_pod!=""}})') == []


def test_honor_labels_false_renames_the_pod_labels(stack: Stack) -> None:
    """The other mode really is the other mode: the workload's pod is in exported_pod."""
    renamed = stack.poll("exported", 'gpu_container_memory_used_bytes{exported_pod!=""}')
    assert renamed
    assert all(s["metric"]["pod"] == ENRICHER_POD for s in renamed)


def test_power_split_adds_up_on_every_gpu_the_demo_simulates(stack: Stack) -> None:
    """In the real Prometheus scraping the demo: on each of its GPUs, the containers' watts
    plus the unattributed watts are the GPU's power field of the same scrape (one query, one
    evaluation time), and the containers' energy counters are there."""
    power = fieldquery.read("power")
    gpus = stack.poll("honor_labels", f"count by (gpu) ({power})")
    assert len(gpus) == 8
    parts = '{__name__=~"gpu_container_power_watts|gpu_unattributed_power_watts"}'
    gap = stack.query(
        "honor_labels",
        f"abs(max by (gpu) ({power}) - sum by (gpu) ({parts}))",
    )
    assert {s["metric"]["gpu"] for s in gap} == {s["metric"]["gpu"] for s in gpus}
    assert all(float(s["value"][1]) < 1e-6 for s in gap), gap
    assert stack.poll("honor_labels", "gpu_container_energy_joules_total")


def test_memory_adds_up_on_every_device_the_demo_simulates(stack: Stack) -> None:
    """In the real Prometheus scraping the demo: on each GPU and MIG instance, the containers'
    memory plus every unattributed reason (the driver's reservation and what no listed
    process holds among them) is the device's used + reserved framebuffer (in bytes, whatever
    naming the exporter writes) of the same scrape."""
    used, reserved = fieldquery.read("fb_used"), fieldquery.read("fb_reserved")
    devices = stack.poll("honor_labels", f"count by (UUID, GPU_I_ID) ({used})")
    assert len(devices) >= 10  # 7 whole GPUs and GPU 2's MIG instances
    parts = '{__name__=~"gpu_container_memory_used_bytes|gpu_unattributed_memory_used_bytes"}'
    gap = stack.query(
        "honor_labels",
        f"abs(max by (UUID, GPU_I_ID) ({used} + {reserved}) - sum by (UUID, GPU_I_ID) ({parts}))",
    )
    assert len(gap) == len(devices)
    assert all(float(s["value"][1]) < 1 for s in gap), gap
    reserved = stack.query(
        "honor_labels", 'gpu_unattributed_memory_used_bytes{reason="driver_reserved"} > 0'
    )
    assert len(reserved) == 7  # each whole GPU; none inside a MIG instance


def test_dra_allocation_joins_the_upstreams_series(stack: Stack) -> None:
    """The demo's DRA pods in a real Prometheus: each gpu_container_allocated carries the driver
    as `resource` and dcgm-exporter's five dra_* labels (and, for the MIG device dra-whisper-0's
    claim gives it, dra_mig_profile and dra_mig_device_uuid), and joins the upstream's series of
    the same claim on them; the GPU's, and the MIG instance's, device series name the pod the
    claim gave it to."""
    given = stack.poll("honor_labels", 'gpu_container_allocated{resource="gpu.nvidia.com"}')
    by_pod = {s["metric"]["pod"]: s["metric"] for s in given}
    assert sorted(by_pod) == ["dra-train-0", "dra-whisper-0"]
    gpu, mig = by_pod["dra-train-0"], by_pod["dra-whisper-0"]
    assert (gpu["namespace"], gpu["gpu"], gpu.get("GPU_I_ID")) == ("ml-team", "7", None)
    assert (mig["namespace"], mig["gpu"], mig["GPU_I_ID"]) == ("research", "2", "14")
    for labels in (gpu, mig):
        assert labels["dra_driver_name"] == "gpu.nvidia.com"
        assert labels["dra_claim_namespace"] == labels["namespace"]
        for name in ("dra_claim_name", "dra_pool_name", "dra_device_name"):
            assert labels[name], name
    assert not any(name.startswith("dra_mig_") for name in gpu)
    assert mig["dra_device_name"] == "gpu-2-mig-19-3-1"
    assert mig["dra_mig_profile"] == mig["GPU_I_PROFILE"] == "1g.10gb"
    assert mig["dra_mig_device_uuid"].startswith("MIG-")
    on = (
        "UUID, dra_claim_name, dra_claim_namespace, dra_driver_name, dra_pool_name, dra_device_name"
    )
    joined = stack.query(
        "honor_labels",
        f"{fieldquery.read('gpu_util')} * on ({on}) group_left () "
        'gpu_container_allocated{resource="gpu.nvidia.com"}',
    )
    assert [s["metric"]["pod"] for s in joined] == ["dra-train-0"]
    # A MIG device's claim joins its instance's series (GPU_I_ID), with its dra_mig_* labels.
    joined = stack.query(
        "honor_labels",
        f"{fieldquery.read('fb_used')} * on ({on}, GPU_I_ID, dra_mig_profile, dra_mig_device_uuid) "
        'group_left () gpu_container_allocated{resource="gpu.nvidia.com", GPU_I_ID!=""}',
    )
    assert [(s["metric"]["pod"], s["metric"]["GPU_I_ID"]) for s in joined] == [
        ("dra-whisper-0", "14")
    ]
    # The instance's own series name the pod its claim gave it to, and only that instance's.
    named = stack.query("honor_labels", fieldquery.read("gr_engine_active", 'pod="dra-whisper-0"'))
    assert [(s["metric"]["gpu"], s["metric"]["GPU_I_ID"]) for s in named] == [("2", "14")]
    assert named[0]["metric"]["dra_mig_device_uuid"] == mig["dra_mig_device_uuid"]


@pytest.mark.parametrize("mode", list(MODES))
def test_cost_panels_show_the_enrichers_own_process(stack: Stack, mode: str) -> None:
    """The panels of the enricher's own cost read the demo enricher's process_* series only,
    not those of the other target (Prometheus itself, whose RSS is many times the demo's),
    and the upstream's load per collection from the enricher's two counters."""
    prefix = MODES[mode]
    everyone = stack.poll(mode, "count(process_resident_memory_bytes)")
    assert everyone and float(everyone[0]["value"][1]) == 2, everyone
    panels = {q.panel: q for q in queries() if q.ref == "A"}
    for title, metric in (
        ("Enricher CPU (millicores)", "process_cpu_seconds_total"),
        ("Enricher memory (RSS)", "process_resident_memory_bytes"),
    ):
        # The largest enricher's (per cluster): max over its process_* joined to
        # dcgm_enricher_build_info.
        found = re.fullmatch(r"max by \(cluster\) \((.*)\)(?: \* 1000)?", panels[title].expr)
        assert found, (title, panels[title].expr)
        inner = found.group(1)
        assert metric in inner and "group_left () dcgm_enricher_build_info" in inner, title
        own = stack.poll(mode, interpolate(inner, prefix))
        assert [s["metric"]["job"] for s in own] == ["dcgm-enricher"], (title, own)
    # The demo's dcgm-exporter stand-in collects every 5 s; a poll finds each collection, so
    # the ratio is at least 1, and below what a poll on every follow step would send.
    ratio = stack.poll(mode, interpolate(panels["Upstream requests per collection"].expr, prefix))
    assert ratio, "no upstream requests per collection"
    value = float(ratio[0]["value"][1])
    follow_step = Config().upstream_follow_step
    assert 1.0 <= value < demo_module.UPSTREAM_COLLECT_INTERVAL / follow_step, value
    # Prometheus asks for gzip: the bytes panel shows gzip bodies going out.
    sent = stack.poll(mode, interpolate(panels["Bytes sent to scrapers"].expr + " > 0", prefix))
    assert {s["metric"]["encoding"] for s in sent} >= {"gzip"}, sent
