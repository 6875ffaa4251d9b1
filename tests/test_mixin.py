"""The monitoring mixin (mixin/): built with the real jsonnet, it is what every install path ships,
and a user's ``_config`` reaches every expression.

Real parts: jsonnet (PyPI's C++ build) evaluates the mixin; the promtool of both Prometheus
releases checks the built rules (default and overridden) and runs the rules' unit tests on the
build. What ships: rules/dcgm-enricher.rules.yaml (the chart's files/ and the Compose stack
mount it; test_chart.py and test_compose.py check that), the PrometheusRule, and the dashboard
(grafana/*.json, their ConfigMap, the chart's files/).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import _jsonnet
import pytest
import yaml

from devkit import fieldquery
from devkit.dashboard import BOARDS, promql_texts
from devkit.promtool import run as promtool_run
from devkit.tools import load_script
from enricher.fieldtable import table

# Checks a real part (jsonnet, promtool) against what does not depend on the Python running the
# tests: `make test` runs this file in the highest Python's suite only.
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
MIXIN = ROOT / "mixin"
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
PROMETHEUS_RULE = ROOT / "manifests" / "monitoring" / "prometheusrule.yaml"
GRAFANA = ROOT / "grafana"
OUT = "dashboards_out/"
CONFIGMAP = ROOT / "manifests" / "monitoring" / "grafana-dashboard.yaml"
CHART_FILES = ROOT / "charts" / "dcgm-enricher" / "files"

# Every _config value a user may override, changed.
OVERRIDE = {
    "enricherSelector": 'job="gpu-enricher", namespace="monitoring"',
    "dcgmSelector": 'job="gpu-metrics"',
    "clusterLabel": "k8s_cluster",
    "nodeLabel": "kubernetes_node",
    "idleUtilizationThreshold": 0.05,
    "idleMemoryBytes": 2147483648,
    "memoryNearlyFullRatio": 0.9,
    "memoryGrowthMinBytes": 3221225472,
    "temperatureCelsius": 90,
    "enricherMemoryLimitRatio": 0.8,
    "heldIdleSeconds": 7200,
    "userLabel": "label_hub_jupyter_org_user",
    "runbookURLPattern": "https://git.corp.lan/gpu/dcgm-enricher/blob/v0.1.0/docs/runbook.md#%s",
    "clusterDashboardUid": "gpu-cluster",
    "clusterDashboardTitle": "GPU workloads (prod)",
    "namespaceDashboardUid": "gpu-namespace",
    "namespaceDashboardTitle": "GPU namespace (prod)",
    "podDashboardUid": "gpu-pod",
    "podDashboardTitle": "GPU pod (prod)",
    "nodeDashboardUid": "gpu-node",
    "nodeDashboardTitle": "GPU node (prod)",
    "enricherDashboardUid": "gpu-enricher",
    "enricherDashboardTitle": "GPU enricher (prod)",
    "dashboardRefresh": "1m",
}
OVERRIDE_JSONNET = json.dumps(OVERRIDE)
DEFAULTS = {
    "idleUtilizationThreshold": "0.01",
    "idleMemoryBytes": "1073741824",
    "memoryNearlyFullRatio": "0.95",
    "memoryGrowthMinBytes": "1073741824",
    "temperatureCelsius": "85",
    "enricherMemoryLimitRatio": "0.9",
    "heldIdleSeconds": "3600",
}
# Where each threshold is compared: (alert or dashboard, the comparison with the value).
THRESHOLD_USES = {
    "idleUtilizationThreshold": [
        (
            "namespace_pod_container_device:gpu_allocated_idle:max",
            "gpu_container_utilization_ratio{{{sel}}} > {v}",
        ),
        ("GpuMemoryHeldWhileIdle", ") < {v}"),
    ],
    "idleMemoryBytes": [("GpuMemoryHeldWhileIdle", ") > {v}")],
    "memoryNearlyFullRatio": [("GpuMemoryNearlyFull", ") > {v}")],
    "memoryGrowthMinBytes": [("GpuPodMemoryGrowing", "[1d]), {v})")],
    "temperatureCelsius": [("GpuTemperatureHigh", ") > {v}")],
    "enricherMemoryLimitRatio": [("GpuEnricherMemoryNearLimit", "> {v}")],
    "heldIdleSeconds": [("GpuHeldIdle", ") > {v}")],
}
# The series the rules and the dashboard read: dcgm-exporter's, the enricher's own.
METRIC = re.compile(r"(?<![\w:$])(DCGM_FI_\w+|gpu_\w+|dcgm_enricher_\w+|process_\w+|up)\b(?!\s*\()")
BRACES = re.compile(r"\{[^{}]*\}")


# The generators' own module of it (devkit/tools.py): one build of each kind a run.
build = load_script(MIXIN / "build.py", "mixin_build")


@pytest.fixture(scope="module")
def default_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mixin built by its command line's main, as `make mixin` builds it, into a fresh
    folder (in this process, so that it shares the run's one build of each kind;
    test_build_runs_as_a_script runs the script itself)."""
    out = tmp_path_factory.mktemp("mixin")
    assert build.main(["--out", str(out)]) == 0
    return out


def test_build_runs_as_a_script(tmp_path: Path) -> None:
    """`python mixin/build.py` as `make mixin` runs it: its imports and arguments (a bad
    --config stops it with jsonnet's error, before any file is written)."""
    proc = subprocess.run(
        [sys.executable, str(MIXIN / "build.py"), "--out", str(tmp_path), "--config", "{ x: }"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "RUNTIME ERROR" in proc.stderr or "STATIC ERROR" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def overridden() -> dict[str, str]:
    return dict(build.build(OVERRIDE_JSONNET))


@pytest.fixture(scope="module")
def defaults() -> dict[str, str]:
    return dict(build.build())


def groups_of(text: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = yaml.safe_load(text)["groups"]
    return loaded


def rules_of(files: dict[str, str]) -> list[dict[str, Any]]:
    return [
        rule
        for name in (build.RULES, build.ALERTS)
        for group in groups_of(files[name])
        for rule in group["rules"]
    ]


def selectors(expr: str) -> list[tuple[str, str]]:
    """Each series a PromQL text reads: its metric name and its matchers ('' when none)."""
    expr = expr.replace("${label_prefix}", "")  # the dashboard's pod label prefix
    masked = BRACES.sub(lambda m: "{" + "x" * (len(m.group()) - 2) + "}", expr)
    out = []
    for match in METRIC.finditer(masked):
        rest = expr[match.end() :]
        braces = BRACES.match(rest)
        out.append((match.group(1), braces.group()[1:-1] if braces else ""))
    return out


# --------------------------------------------------------------------------- the layout


def _doc_block(heading: str, lang: str) -> str:
    """The first ``lang`` code block under ``heading`` in docs/alerts.md."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    section = text[text.index(heading) :]
    found = re.search(rf"^```{lang}\n(.*?)^```", section, re.M | re.S)
    assert found is not None, (heading, lang)
    return found.group(1)


def test_the_worked_kube_prometheus_example_builds_beside_etcds_mixin(tmp_path: Path) -> None:
    """docs/alerts.md's jsonnetfile and worked override, built in the layout jsonnet-bundler
    makes of them in a kube-prometheus project: this mixin under the `name` its jsonnetfile
    entry gives it, and kube-prometheus's etcd mixin under the legacy name `mixin` beside it.
    kube-prometheus and etcd's mixin are STAND-INS (nothing is downloaded here): each a file of
    the shape and path the example imports, so the test proves the import paths do not
    collide and the example evaluates with the real jsonnet."""
    import _jsonnet

    entry = json.loads(_doc_block("### Vendoring it with jsonnet-bundler", "json"))
    (dependency,) = entry["dependencies"]
    assert dependency["source"]["git"]["subdir"] == "mixin"
    name = dependency["name"]
    assert name != "mixin"
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / name).symlink_to(MIXIN, target_is_directory=True)
    etcd = vendor / "mixin"  # kube-prometheus's etcd contrib/mixin, by its legacy name
    etcd.mkdir()
    (etcd / "mixin.libsonnet").write_text(
        "{ prometheusAlerts+:: { groups+: [{ name: 'etcd', rules: [] }] } }\n"
    )
    (vendor / "kube-prometheus").mkdir()
    (vendor / "kube-prometheus" / "main.libsonnet").write_text(
        "{ values:: { common: { namespace: 'default' }, grafana: { dashboards: {} } },\n"
        "  etcdMixin:: (import 'mixin/mixin.libsonnet') }\n"
    )
    example = _doc_block("### A worked override: kube-prometheus", "jsonnet")
    # The example's last line is the manifest it adds; keep etcd's alerts in view too.
    example = example.replace(
        "{ 'dcgm-enricher-prometheusRule': kp.dcgmEnricher.prometheusRule }",
        "{ rule: kp.dcgmEnricher.prometheusRule, etcd: kp.etcdMixin.prometheusAlerts,"
        " dashboards: std.objectFields(kp.values.grafana.dashboards) }",
    )
    out = json.loads(_jsonnet.evaluate_snippet("example.jsonnet", example, jpathdir=[str(vendor)]))
    groups = out["rule"]["spec"]["groups"]
    assert {g["name"] for g in groups} >= {"dcgm-enricher.records", "dcgm-enricher.memory"}
    exprs = " ".join(r["expr"] for g in groups for r in g["rules"])
    assert 'job="dcgm-enricher"' in exprs and "k8s_cluster" in exprs
    assert out["etcd"]["groups"] == [{"name": "etcd", "rules": []}]
    assert out["dashboards"] == sorted(BOARDS.values())


def test_mixin_has_the_four_fields_and_a_jsonnetfile() -> None:
    fields = json.loads(
        build.evaluate(
            "[f for f in ['_config', 'prometheusAlerts', 'prometheusRules', 'grafanaDashboards']"
            " if std.objectHasAll(mixin, f)]"
        )
    )
    assert fields == ["_config", "prometheusAlerts", "prometheusRules", "grafanaDashboards"]
    jsonnetfile = json.loads((MIXIN / "jsonnetfile.json").read_text())
    assert jsonnetfile["version"] == 1
    assert isinstance(jsonnetfile["dependencies"], list)


def test_the_mixin_holds_the_field_table_byte_for_byte() -> None:
    """A mixin vendored alone (jsonnet-bundler fetches mixin/ only) reads dcgm-exporter's
    names from its own copy of the table, which rules/generate.py keeps equal to the
    package's."""
    assert (MIXIN / "lib" / "dcgm_fields.json").read_bytes() == (
        ROOT / "enricher" / "dcgm_fields.json"
    ).read_bytes()


# Each way the rules and the dashboards read a field: (jsonnet arguments after the field and
# its matchers, devkit.fieldquery.read's keyword arguments).
READS = {
    "plain": ("", {}),
    "rate": (", function(s) 'rate(%s[10m])' % s", {"over": lambda s: f"rate({s}[10m])"}),
    "changes": (
        ", function(s) 'changes(%s[15m])' % s, unitless=true, summed=true",
        {"over": lambda s: f"changes({s}[15m])", "unitless": True, "summed": True},
    ),
    "increase": (
        ", function(s) 'increase(%s[1h])' % s, summed=true",
        {"over": lambda s: f"increase({s}[1h])", "summed": True},
    ),
}


def test_the_mixin_reads_every_field_as_the_dashboards_do() -> None:
    """mixin/lib/fields.libsonnet (the rules and alerts) and devkit/fieldquery.py (the
    dashboards, the recipes, the bench) write the same PromQL for every field of the table,
    each way a field is read."""
    matchers = '%(dcgmSelector)s, gpu=~"$gpu"'
    code = (
        "local fields = import 'lib/fields.libsonnet';\n{\n"
        + "".join(
            f"  '{field}/{how}': fields.read('{field}', '{matchers}'{args}),\n"
            for field in table().fields
            for how, (args, _) in READS.items()
        )
        + "}\n"
    )
    built = json.loads(_jsonnet.evaluate_snippet(str(MIXIN / "fields-test.jsonnet"), code))
    expected = {
        f"{field}/{how}": fieldquery.read(field, *matchers.split(", "), **kwargs)
        for field in table().fields
        for how, (_, kwargs) in READS.items()
    }
    assert built == expected


def test_the_mixin_aggregates_every_field_as_the_dashboards_do() -> None:
    """fields.aggregate and devkit.fieldquery.aggregate write the same PromQL."""
    cases = [(op, by) for op in ("sum", "max", "min", "count") for by in ("", "node, gpu")]
    code = (
        "local fields = import 'lib/fields.libsonnet';\n{\n"
        + "".join(
            f"  '{field}/{op}/{by}': fields.aggregate('{field}', '{op}', '{by}', 'job=\"x\"'),\n"
            for field in table().fields
            for op, by in cases
        )
        + "}\n"
    )
    built = json.loads(_jsonnet.evaluate_snippet(str(MIXIN / "fields-test.jsonnet"), code))
    assert built == {
        f"{field}/{op}/{by}": fieldquery.aggregate(field, op, by, 'job="x"')
        for field in table().fields
        for op, by in cases
    }


def test_build_writes_the_three_outputs(default_build: Path) -> None:
    assert sorted(str(p.relative_to(default_build)) for p in default_build.rglob("*.*")) == [
        *sorted(OUT + name for name in BOARDS.values()),
        "prometheus_alerts.yaml",
        "prometheus_rules.yaml",
    ]
    alerts = groups_of((default_build / "prometheus_alerts.yaml").read_text())
    records = groups_of((default_build / "prometheus_rules.yaml").read_text())
    assert all("alert" in r for g in alerts for r in g["rules"])
    assert all("record" in r for g in records for r in g["rules"])


def test_alerts_follow_the_mixin_style(default_build: Path) -> None:
    alerts = [
        r
        for g in groups_of((default_build / "prometheus_alerts.yaml").read_text())
        for r in g["rules"]
    ]
    assert len(alerts) >= 20
    for alert in alerts:
        assert re.fullmatch(r"Gpu[A-Z][A-Za-z]+", alert["alert"])
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert "for" in alert


# --------------------------------------------------------------------------- one source of truth


def test_the_shipped_rules_are_the_build(default_build: Path) -> None:
    built = groups_of((default_build / "prometheus_rules.yaml").read_text()) + groups_of(
        (default_build / "prometheus_alerts.yaml").read_text()
    )
    assert groups_of(RULES.read_text()) == built
    assert yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"] == built
    # The chart packs the same file (a link), the Compose stack mounts it (test_compose.py).
    assert (CHART_FILES / RULES.name).resolve() == RULES


def test_the_shipped_dashboards_are_the_build(default_build: Path) -> None:
    configmap = yaml.safe_load(CONFIGMAP.read_text())["data"]
    for name in BOARDS.values():
        built = (default_build / OUT / name).read_text()
        assert (GRAFANA / name).read_text() == built, name
        assert configmap[name] == built, name
        # The chart packs the same files (links); its template names each.
        assert (CHART_FILES / name).resolve() == GRAFANA / name
        assert f'"{name}"' in (CHART_FILES.parent / "templates" / "dashboard.yaml").read_text()


def test_the_default_build_reads_as_plain_promql(defaults: dict[str, str]) -> None:
    """An empty dcgmSelector leaves no ``{}`` or ``{, `` behind, and no _config reference is
    left unfilled."""
    texts = [r["expr"] for r in rules_of(defaults)]
    texts += [t for name in BOARDS.values() for t in promql_texts(_shipped(name))]
    for text in texts:
        assert "{}" not in text and "{, " not in text and "%(" not in text, text


# --------------------------------------------------------------------------- _config


def test_override_reaches_every_rule_expression(
    overridden: dict[str, str], defaults: dict[str, str]
) -> None:
    default_rules = rules_of(defaults)
    rules = rules_of(overridden)
    assert [r.get("alert", r.get("record")) for r in rules] == [
        r.get("alert", r.get("record")) for r in default_rules
    ]
    for rule, default in zip(rules, default_rules, strict=True):
        name = rule.get("alert", rule.get("record"))
        expr = rule["expr"]
        for metric, matchers in selectors(expr):
            wanted = OVERRIDE["enricherSelector" if metric == "up" else "dcgmSelector"]
            assert matchers.startswith(wanted), f"{name}: {metric}{{{matchers}}}"
        assert not re.search(r"\bcluster\b", expr), f"{name}: {expr}"
        assert len(re.findall(r"\bk8s_cluster\b", expr)) == len(
            re.findall(r"\bcluster\b", default["expr"])
        ), name
        # The node label moves everywhere: in the expression and in the description.
        assert not re.search(r"\bnode\b", expr), f"{name}: {expr}"
        assert "$labels.node " not in rule.get("annotations", {}).get("description", ""), name
        assert len(re.findall(r"\bkubernetes_node\b", expr)) == len(
            re.findall(r"\bnode\b", default["expr"])
        ), name
        default_description = default.get("annotations", {}).get("description", "")
        assert rule.get("annotations", {}).get("description", "").count(
            "$labels.kubernetes_node"
        ) == default_description.count("$labels.node"), name
        # Labels are the contract: the same names, whatever the config.
        assert rule.get("labels") == default.get("labels"), name


@pytest.mark.parametrize("key", sorted(THRESHOLD_USES))
def test_override_moves_every_threshold(
    overridden: dict[str, str], defaults: dict[str, str], key: str
) -> None:
    default_rules = {r.get("alert", r.get("record")): r for r in rules_of(defaults)}
    rules = {r.get("alert", r.get("record")): r for r in rules_of(overridden)}
    for alert, pattern in THRESHOLD_USES[key]:
        sel = OVERRIDE["dcgmSelector"]
        old = pattern.format(v=DEFAULTS[key], sel="").replace("{}", "")
        new = pattern.format(v=OVERRIDE[key], sel=sel)
        # Every use moves: as many comparisons with the new value as the default build has
        # with the default, and none left at the default (a hard-coded copy stays there).
        uses = default_rules[alert]["expr"].count(old)
        assert uses, (alert, old)
        expr = rules[alert]["expr"]
        assert (expr.count(new), expr.count(old)) == (uses, 0), (alert, new, old, expr)


def test_override_reaches_the_annotations(
    overridden: dict[str, str], defaults: dict[str, str]
) -> None:
    alerts = {r["alert"]: r for r in rules_of(overridden) if "alert" in r}
    assert "over 90% used" in alerts["GpuMemoryNearlyFull"]["annotations"]["summary"]
    assert "(over 7200 s)" in alerts["GpuHeldIdle"]["annotations"]["description"]
    for name in ("GpuAllocatedIdle", "GpuMemoryHeldWhileIdle"):
        assert "under 5% utilization" in alerts[name]["annotations"]["description"]
    for name, alert in alerts.items():
        url = alert["annotations"]["runbook_url"]
        assert (
            url
            == f"https://git.corp.lan/gpu/dcgm-enricher/blob/v0.1.0/docs/runbook.md#{name.lower()}"
        )
    # Without a pattern (the default) no alert has one: the chart and the kustomize component
    # add them from one install value (docs/alerts.md).
    assert not [r for r in rules_of(defaults) if "runbook_url" in r.get("annotations", {})]


def _shipped(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GRAFANA / name).read_text())
    return loaded


@pytest.mark.parametrize("key", list(BOARDS))
def test_override_reaches_every_dashboard_query(overridden: dict[str, str], key: str) -> None:
    """Every _config field a dashboard names moves in it: the selectors, labels and
    thresholds of every query, the uid, title and refresh, and the uids its links name."""
    name = BOARDS[key]
    board = json.loads(overridden[OUT + name])
    default = _shipped(name)
    assert (board["uid"], board["title"], board["refresh"]) == (
        OVERRIDE[f"{key}DashboardUid"],
        OVERRIDE[f"{key}DashboardTitle"],
        "1m",
    )
    queries, default_queries = promql_texts(board), promql_texts(default)
    assert len(queries) == len(default_queries) > 10
    for query, before in zip(queries, default_queries, strict=True):
        found = selectors(query)
        assert len(found) == len(selectors(before))
        for metric, matchers in found:
            assert matchers.startswith(OVERRIDE["dcgmSelector"]), f"{metric}{{{matchers}}}: {query}"
        assert not re.search(r"(?<!\$)\bcluster\b", query), query
        assert len(re.findall(r"\bk8s_cluster\b", query)) == len(
            re.findall(r"(?<!\$)\bcluster\b", before)
        ), query
        assert not re.search(r"(?<!\$)\bnode\b", query), query
        assert len(re.findall(r"\bkubernetes_node\b", query)) == len(
            re.findall(r"(?<!\$)\bnode\b", before)
        ), query
        assert "0.01" not in query and "1073741824" not in query, query
    # The node label's name in the legends, the annotation's text and the tables' columns too.
    texts, default_texts = node_texts(board), node_texts(default)
    assert texts == [t.replace("{{node}}", "{{kubernetes_node}}") for t in default_texts]
    assert any("{{node}}" in t for t in default_texts)
    columns, default_columns = renamed_columns(board), renamed_columns(default)
    renamed = {
        "node": "kubernetes_node",
        "annotation_hub_jupyter_org_username": OVERRIDE["userLabel"],
    }
    assert columns == [{renamed.get(k, k): v for k, v in c.items()} for c in default_columns]
    # The links to the other dashboards name their overridden uids.
    links, default_links = link_urls(board), link_urls(default)
    uids = {f"/d/{_default_uid(k)}/": f"/d/{OVERRIDE[k + 'DashboardUid']}/" for k in BOARDS}
    moved = default_links
    for old, new in uids.items():
        moved = [u.replace(old, new) for u in moved]
    assert links == moved
    assert all(old not in u for u in links for old in uids if old not in uids.values())


def _default_uid(key: str) -> str:
    return str(json.loads(build.evaluate(f"mixin._config.{key}DashboardUid")))


def test_override_reaches_the_thresholds_of_the_dashboards(overridden: dict[str, str]) -> None:
    queries = [q for n in BOARDS.values() for q in promql_texts(json.loads(overridden[OUT + n]))]
    held = [q for q in queries if "> 2147483648 and" in q and "< 0.05" in q]
    idle = [q for q in queries if "namespace_pod_container_device:gpu_allocated_idle:max" in q]
    assert idle and held  # the allocated-but-idle threshold: in its record (above)
    links = [u for n in BOARDS.values() for u in link_urls(json.loads(overridden[OUT + n]))]
    assert links and all(re.search(r"/d/gpu-(namespace|pod|node)/", u) for u in links), links


def link_urls(board: dict[str, Any]) -> list[str]:
    """The URLs of every data link of a dashboard's tables, in order."""
    return [
        link["url"]
        for p in _panels(board)
        for o in p.get("fieldConfig", {}).get("overrides", [])
        for prop in o["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]


# The _config fields worked out from others (the texts' percentages and GiB), not set.
DERIVED = {"idleUtilizationPercent", "memoryNearlyFullPercent", "idleMemoryGiB"}


def test_every_config_field_is_overridden_by_the_tests() -> None:
    """Each field mixin/config.libsonnet offers is in OVERRIDE, so the tests above move it."""
    fields = set(re.findall(r"^    (\w+): ", (MIXIN / "config.libsonnet").read_text(), re.M))
    assert fields - DERIVED == set(OVERRIDE)


# What each panel description says of a threshold: (the default's words, the override's).
DESCRIBED = {
    "idleUtilizationThreshold": ("under 1%", "under 5%"),
    "idleMemoryBytes": ("over 1 GiB", "over 2 GiB"),
    "temperatureCelsius": ("above 85 °C", "above 90 °C"),
    "memoryNearlyFullRatio": ("above 95%", "above 90%"),
}


@pytest.mark.parametrize("field", sorted(DESCRIBED))
def test_override_reaches_the_panel_descriptions(overridden: dict[str, str], field: str) -> None:
    """A threshold moved in _config moves in the text that tells the user about it: no panel
    keeps saying the default."""
    old, new = DESCRIBED[field]
    names = list(BOARDS.values())
    before = [p.get("description", "") for n in names for p in _panels(_shipped(n))]
    after = [
        p.get("description", "") for n in names for p in _panels(json.loads(overridden[OUT + n]))
    ]
    said = [i for i, text in enumerate(before) if old in text]
    assert said, (field, old)
    assert [i for i, text in enumerate(after) if new in text] == said
    assert not [text for text in after if old in text]


def test_override_moves_the_user_label_everywhere(
    overridden: dict[str, str], defaults: dict[str, str]
) -> None:
    """The user label of _config, in every rule, alert text, query and column that names it."""
    old, new = "annotation_hub_jupyter_org_username", OVERRIDE["userLabel"]
    names = list(BOARDS.values())
    texts = {
        "rules": overridden[build.RULES] + overridden[build.ALERTS],
        "dashboard": "".join(overridden[OUT + n] for n in names),
    }
    before = {
        "rules": defaults[build.RULES] + defaults[build.ALERTS],
        "dashboard": "".join(json.dumps(_shipped(n)) for n in names),
    }
    for where, text in texts.items():
        assert old not in text, where
        assert text.count(new) == before[where].count(old) > 0, where


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def node_texts(board: dict[str, Any]) -> list[str]:
    """The dashboard's legends and annotation texts, in order."""
    out = [t.get("legendFormat", "") for p in _panels(board) for t in p.get("targets", [])]
    return out + [a.get("textFormat", "") for a in board["annotations"]["list"]]


def renamed_columns(board: dict[str, Any]) -> list[dict[str, str]]:
    """Each table's column renames (Grafana's organize transformation), in order."""
    return [
        x["options"].get("renameByName", {})
        for p in _panels(board)
        for x in p.get("transformations", [])
        if x["id"] == "organize"
    ]


RULE_FILE_FIELD = "{ groups: mixin.prometheusRules.groups + mixin.prometheusAlerts.groups }"


def test_the_fast_yaml_is_jsonnets_own() -> None:
    """build.yaml_doc (jsonnet's quoted keys, unquoted) writes jsonnet's own
    ``quote_keys=false`` document byte for byte (the slow path: about 14 s)."""
    assert build.yaml_doc(RULE_FILE_FIELD) == build.yaml_doc_by_jsonnet(RULE_FILE_FIELD)


@pytest.mark.deep
def test_the_fast_yaml_is_jsonnets_own_with_overrides() -> None:
    """The same with every _config field overridden. The overrides change values, not keys,
    and the unquoting reads keys only: test_the_fast_yaml_is_jsonnets_own holds the claim in
    the default run, this second slow build runs in the long one."""
    assert build.yaml_doc(RULE_FILE_FIELD, OVERRIDE_JSONNET) == build.yaml_doc_by_jsonnet(
        RULE_FILE_FIELD, OVERRIDE_JSONNET
    )


def test_promtool_checks_the_overridden_rules(
    promtool: str, overridden: dict[str, str], tmp_path: Path
) -> None:
    for name in (build.RULES, build.ALERTS):
        (tmp_path / name).write_text(overridden[name])
        proc = promtool_run(promtool, "check", "rules", str(tmp_path / name))
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_overridden_held_idle_waits_the_overridden_time(
    promtool: str, overridden: dict[str, str], tmp_path: Path
) -> None:
    """With heldIdleSeconds: 7200, GpuHeldIdle stays quiet after 100 idle minutes (the
    default's hour and its 10m ``for`` long past) and fires after 140, through both branches of
    its ``or`` (a pod with a Jupyter user, a pod without gpu_pod_info): every use of the value
    moved, the description's too."""
    (tmp_path / build.ALERTS).write_text(overridden[build.ALERTS])
    where = 'job="gpu-metrics",k8s_cluster="c1",kubernetes_node="node-a",Hostname="exporter-pod"'
    pods = [
        ("hub", "jupyter-bob", "notebook", "bob"),
        ("ml", "spare-0", "trainer", None),
    ]
    series = []
    expected = []
    for ns, pod, container, user in pods:
        who = f'namespace="{ns}",pod="{pod}",container="{container}"'
        last_active = f'gpu_container_last_active_timestamp_seconds{{{where},gpu="0",{who}}}'
        series.append({"series": last_active, "values": "0x150"})  # idle since time 0
        if user is not None:
            info = f'gpu_pod_info{{job="gpu-metrics",k8s_cluster="c1",namespace="{ns}",'
            info += f'pod="{pod}",{OVERRIDE["userLabel"]}="{user}"}}'
            series.append({"series": info, "values": "1x150"})
        labels = {"severity": "warning", "k8s_cluster": "c1", "kubernetes_node": "node-a"}
        labels |= {"namespace": ns, "pod": pod, "container": container}
        description = f"Container {container} of pod {ns}/{pod}"
        if user is not None:
            labels["user"] = user
            description += f" (user {user})"
        description += (
            " on node-a holds GPU memory or an allocation and has not used any of its GPUs for"
            " 2h 20m 0s (over 7200 s). Stop it, or let the culler do it (docs/culling.md)."
            " Runbook: docs/runbook.md#gpuheldidle."
        )
        annotations = {
            "summary": "A container holds GPUs it has not used for a long time.",
            "description": description,
            "runbook_url": str(OVERRIDE["runbookURLPattern"]) % "gpuheldidle",
        }
        expected.append({"exp_labels": labels, "exp_annotations": annotations})
    unit = {
        "rule_files": [build.ALERTS],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "GpuHeldIdle at heldIdleSeconds 7200",
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "100m", "alertname": "GpuHeldIdle", "exp_alerts": []},
                    {"eval_time": "140m", "alertname": "GpuHeldIdle", "exp_alerts": expected},
                ],
            }
        ],
    }
    (tmp_path / "held-idle.tests.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = promtool_run(promtool, "test", "rules", "held-idle.tests.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- promtool on the build


def test_promtool_checks_the_built_rules(promtool: str, default_build: Path) -> None:
    for name in ("prometheus_rules.yaml", "prometheus_alerts.yaml"):
        proc = promtool_run(promtool, "check", "rules", str(default_build / name))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout
