"""Generate the family of dashboards of the mixin (mixin/dashboards/*.json), then build the mixin
and write what it makes with the default _config: grafana/*.json and their ConfigMap for the
Grafana sidecar (manifests/monitoring/grafana-dashboard.yaml, one key per dashboard).

The dashboards are written as code (grafana/boards/: one module per dashboard, and what they
share) so that every panel's query is built from the same filters and the tests can run each of
them against a real Prometheus; grafana-foundation-sdk's builders (Python 3.11 or newer) write
Grafana's JSON model and lay the panels out (docs/dashboard.md says what it cannot express:
those parts stay plain JSON here). Their queries name the mixin's _config as %(name)s (the
dcgm-exporter series selector, the cluster label, the idle thresholds, the dashboards' uids);
mixin/dashboards/dashboards.libsonnet fills them in, with each dashboard's uid, title and
refresh, so a user's _config override reaches every query and link.

    python grafana/generate.py          # rewrite the files
    python grafana/generate.py --check  # exit 1 if any is out of date (what the tests check)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

# The checkout's devkit and enricher (the field table), and grafana/boards beside this script.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from boards import BOARDS
from boards.common import (
    DS_JSON,
    NS,
    NS_FILTER,
    POD,
    SCHEMA_VERSION,
    Board,
    scoped,
    sel,
)

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
TEMPLATES = ROOT / "mixin" / "dashboards"
CONFIGMAP = ROOT / "manifests" / "monitoring" / "grafana-dashboard.yaml"
CLUSTER_FILTER = '%(clusterLabel)s=~"$cluster"'
# What the Cluster and Node pickers list the values of: every enricher of every release writes
# it, one series per node, with the node label and whatever the scrape adds (the cluster),
# whichever dcgm-exporter release runs beside it and whatever that calls its fields. A node
# whose exporter is down is still listed (its enricher says so on the Enricher dashboard).
PICKER_SERIES = "dcgm_enricher_build_info"

# --------------------------------------------------------------------------- rendering


def _query_variable(
    name: str, label: str, definition: str, description: str, *, every: bool = True
) -> dict[str, Any]:
    """A variable from a label's values: ``every`` (the widest scope's cluster) offers All and
    several values, otherwise it is the one value that scopes the dashboard, its first one by
    default as Grafana picks it."""
    variable: dict[str, Any] = {
        "type": "query",
        "name": name,
        "label": label,
        "description": description,
        "datasource": DS_JSON,
        "definition": definition,
        "query": {"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "multi": every,
        "includeAll": every,
    }
    if every:
        # Matches series that lack the label too (no cluster label, a device with no pod).
        variable["allValue"] = ".*"
        variable["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    else:
        variable["current"] = {}
    return variable | {"options": [], "hide": 0}


def _variable(name: str) -> dict[str, Any]:
    """The variable ``name``, as every dashboard that has it has it."""
    if name == "datasource":
        return {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "regex": "",
            "current": {},
            "options": [],
            "hide": 0,
        }
    if name == "label_prefix":
        return {
            "type": "textbox",
            "name": "label_prefix",
            "label": "Pod label prefix",
            "description": "Leave empty when Prometheus scrapes the enricher with "
            "honor_labels: true (every manifest of dcgm-enricher does). Type exported_ when it "
            "scrapes with honor_labels: false and stored the pod labels as exported_namespace, "
            "exported_pod and exported_container.",
            "query": "",
            "current": {"selected": False, "text": "", "value": ""},
            "options": [{"selected": True, "text": "", "value": ""}],
            "hide": 0,
        }
    if name == "cluster":
        return _query_variable(
            "cluster",
            "Cluster",
            f"label_values({sel(PICKER_SERIES)}, %(clusterLabel)s)",
            "Where the series carry a cluster label (external labels, Thanos, Mimir).",
        )
    if name == "node":
        return _query_variable(
            "node",
            "Node",
            f"label_values({sel(PICKER_SERIES, CLUSTER_FILTER)}, %(nodeLabel)s)",
            "The node's name, from the enricher's node label (the Kubernetes node, or the host).",
            every=False,
        )
    if name == "namespace":
        return _query_variable(
            "namespace",
            "Namespace",
            f"label_values({sel('gpu_container_memory_used_bytes', CLUSTER_FILTER)}, {NS})",
            "Namespaces with a process on a GPU.",
            every=False,
        )
    assert name == "pod", name
    return _query_variable(
        "pod",
        "Pod",
        f"label_values({sel('gpu_container_memory_used_bytes', CLUSTER_FILTER, NS_FILTER)}, {POD})",
        "The namespace's pods with a process on a GPU.",
        every=False,
    )


def _dashboard_defaults(board: Board) -> dict[str, str]:
    """The uid, title and refresh of mixin/config.libsonnet's _config: defined there once."""
    c = "mixin._config"
    text = _mixin_build().evaluate(
        f"{{uid: {c}.{board.key}DashboardUid, title: {c}.{board.key}DashboardTitle,"
        f" refresh: {c}.dashboardRefresh}}"
    )
    loaded: dict[str, str] = json.loads(text)
    return loaded


_VARIABLE_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
BUILTINS = {"__all", "__range", "__rate_interval", "__interval", "__url_time_range"}


def build(board: Board) -> dict[str, Any]:
    """The dashboard ``board`` as the mixin's template: its queries name _config as %(name)s
    and drop the matchers of the variables it does not have."""
    defaults = _dashboard_defaults(board)
    builder = (
        dashboard.Dashboard(defaults["title"])
        .uid(defaults["uid"])
        .description(board.description)
        .tags(["gpu", "dcgm", "kubernetes", "dcgm-enricher"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .time("now-6h", "now")
        .refresh(defaults["refresh"])
        .timezone("")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        # A runbook link needs the URL where docs/runbook.md is published for the users: the
        # chart adds it from prometheusRule.runbookUrl (docs/alerts.md). The family's links
        # are the tables' cells (boards/common.drill).
        .links([])
    )
    for row in board.rows():
        builder.with_row(dashboard.Row(row.title))
        for panel in row.panels:
            builder.with_panel(panel)
    model = builder.build()
    model.schema_version = SCHEMA_VERSION
    for pid, panel in enumerate(model.panels or [], 1):
        panel.id_val = pid
    out: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(model))
    for panel in out["panels"]:
        for target in panel.get("targets", []):
            target["expr"] = scoped(target["expr"], board.variables)
    # Not in the SDK's types: a query variable's `definition` (what Grafana's Prometheus
    # variable editor shows) and a Prometheus annotation's step, title and text formats.
    out["templating"] = {"list": [_variable(name) for name in board.variables]}
    out["annotations"] = {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            {
                "datasource": DS_JSON,
                "enable": True,
                "iconColor": "red",
                "name": "GPU alerts",
                # The cluster's alerts only, where one Prometheus (Thanos, Mimir) holds many.
                "expr": 'ALERTS{alertname=~"Gpu.*", alertstate="firing", '
                '%(clusterLabel)s=~"$cluster"}',
                "step": "60s",
                "titleFormat": "{{alertname}}",
                "textFormat": "{{%(nodeLabel)s}} {{gpu}} {{namespace}}/{{pod}}",
                "useValueForTime": False,
            },
        ]
    }
    unknown = (
        {m.group(1) or m.group(2) for m in _VARIABLE_REF.finditer(json.dumps(out))}
        - set(board.variables)
        - BUILTINS
    )
    assert not unknown, f"{board.file} names variables it does not have: {unknown}"
    return out


def render_template(board: Board) -> str:
    """The mixin's dashboard ``board``, its queries naming _config as %(name)s."""
    return json.dumps(build(board), indent=2, ensure_ascii=False) + "\n"


def _mixin_build() -> Any:
    """mixin/build.py, loaded once a process, so that every caller shares its cached builds."""
    if "mixin_build" not in sys.modules:
        spec = importlib.util.spec_from_file_location("mixin_build", ROOT / "mixin" / "build.py")
        assert spec is not None and spec.loader is not None
        sys.modules["mixin_build"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["mixin_build"])
    return sys.modules["mixin_build"]


def render_dashboards(config: str | None = None) -> dict[str, str]:
    """Each dashboard the mixin builds (from the templates on disk), by file name, with the
    default _config, or with ``config`` (a jsonnet object) merged into it."""
    built: dict[str, str] = _mixin_build().dashboards(config)
    return {board.file: built[board.file] for board in BOARDS}


def render_configmap(dashboards: dict[str, str]) -> str:
    """A ConfigMap that the Grafana sidecar (label grafana_dashboard: "1") loads: one key per
    dashboard."""
    data = ""
    for name, text in dashboards.items():
        body = "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())
        data += f"  {name}: |\n" + body
    return (
        "# GENERATED by grafana/generate.py (the mixin's dashboards, default _config): do not\n"
        "# edit.\n"
        "# The Grafana sidecar of kube-prometheus-stack (grafana.sidecar.dashboards.enabled)\n"
        '# loads every ConfigMap labelled grafana_dashboard: "1"; it must watch this namespace\n'
        "# (sidecar.dashboards.searchNamespace: ALL, or the namespace of this ConfigMap).\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: dcgm-enricher-dashboard\n"
        "  labels:\n"
        '    grafana_dashboard: "1"\n'
        "  annotations:\n"
        "    # Folder, where the sidecar is configured with folderAnnotation: grafana_folder.\n"
        "    grafana_folder: GPU\n"
        "data:\n" + data
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args(argv)
    templates = {TEMPLATES / board.file: render_template(board) for board in BOARDS}
    if args.check:
        outputs = dict(templates)
        if all(p.exists() and p.read_text("utf-8") == t for p, t in templates.items()):
            built = render_dashboards()
            outputs |= {GRAFANA / name: text for name, text in built.items()}
            outputs[CONFIGMAP] = render_configmap(built)
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text("utf-8") != text]
        for path in stale:
            print(f"{path} is stale: run python grafana/generate.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in templates.items():
        path.write_text(text, encoding="utf-8")
    built = render_dashboards()
    for name, text in built.items():
        (GRAFANA / name).write_text(text, encoding="utf-8")
    CONFIGMAP.write_text(render_configmap(built), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
