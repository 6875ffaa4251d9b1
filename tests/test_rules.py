"""The alerting and recording rules: promtool, their style, the runbook, the PrometheusRule.

Real parts: the promtool of both Prometheus releases (2.42 and 3.5, tests/promreleases.py)
checks the rules and runs their unit tests (rules/*.tests.yaml, a firing and a quiet case for
every alert); the real kubectl builds the monitoring component. What the rules do against a
live Prometheus scraping the demo node is in test_dashboard.py.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from devkit import fieldquery
from devkit.dashboard import alert_rules, record_rules, rule_groups
from devkit.tools import load_script, run_tool
from enricher.fieldtable import table

from .schemas import PROMETHEUS_RULE_SCHEMA
from .test_manifests import build

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "rules"
RULES = RULES_DIR / "dcgm-enricher.rules.yaml"
TEST_FILES = sorted(RULES_DIR.glob("*.tests.yaml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
MONITORING = ROOT / "manifests" / "monitoring"
# A URL where a user's runbook could be published; the tests only check how it is joined.
RUNBOOK_BASE = "https://git.corp.lan/gpu/dcgm-enricher/blob/v0.1.0/docs/runbook.md"
ALERT_PREFIX = "Gpu"
SEVERITIES = {"info", "warning", "critical"}
KUBECTL = shutil.which("kubectl")


generate = load_script(RULES_DIR / "generate.py", "rules_generate")


# --------------------------------------------------------------------------- promtool


def test_promtool_check_rules(promtool: str) -> None:
    proc = run_tool([promtool, "check", "rules", str(RULES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules()) + len(record_rules())} rules found" in proc.stdout


def test_promtool_unit_tests(promtool: str) -> None:
    proc = run_tool([promtool, "test", "rules", *(p.name for p in TEST_FILES)], cwd=RULES_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests_catch_a_changed_threshold(promtool: str, tmp_path: Path) -> None:
    """The unit tests are not decoration: a rule whose threshold moves fails them."""
    text = RULES.read_text()
    temperature = fieldquery.read("gpu_temp").replace("{}", "")
    old = f"max by (cluster, node, gpu, UUID, modelName) ({temperature}) > 85"
    assert text.count(old) == 1
    (tmp_path / RULES.name).write_text(text.replace(old, old.replace("> 85", "> 95")))
    for file in TEST_FILES:
        shutil.copy(file, tmp_path / file.name)
    proc = run_tool([promtool, "test", "rules", "dcgm-enricher.tests.yaml"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "GpuTemperatureHigh" in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- every naming
# The unit tests feed dcgm-exporter's fields under 4.8's names and units. Every record and alert
# must answer the same under every later naming, on a fleet that has both, and on a node whose
# exporter is upgraded while the rules run: the same tests, their input series renamed by the
# field table (enricher/dcgm_fields.json) and their values converted to the new unit, with the
# same expected samples and alerts.

_TOKEN = re.compile(r"^(?P<a>[-+]?[^-+x_]+?)(?:(?P<op>[-+])(?P<b>[^x]+))?(?:x(?P<n>\d+))?$")


def expand(values: str) -> list[float | str]:
    """promtool's expanding notation as one entry per sample: a number, ``_`` (missing) or
    ``stale`` (``'1+2x2 _x2 stale'`` -> ``[1, 3, 5, '_', '_', 'stale']``)."""
    out: list[float | str] = []
    for token in values.split():
        if token == "stale" or token == "_":
            out.append(token)
        elif token.startswith("_x"):
            out += ["_"] * int(token[2:])
        else:
            m = _TOKEN.match(token)
            assert m, token
            a, n = float(m["a"]), int(m["n"] or 0)
            b = float(m["b"] or 0) * (-1 if m["op"] == "-" else 1)
            out += [a + b * i for i in range(n + 1)]
    return out


def render(samples: list[float | str]) -> str:
    return " ".join(
        s if isinstance(s, str) else str(int(s)) if s == int(s) else repr(s) for s in samples
    )


@pytest.mark.parametrize(
    ("text", "samples"),
    [
        ("78000x2", [78000, 78000, 78000]),
        ("0+20x2 _x2 stale", [0, 20, 40, "_", "_", "stale"]),
        ("0x1 79x1", [0, 0, 79, 79]),
        ("4-1x2 _", [4, 3, 2, "_"]),
        ("1e3", [1000]),
    ],
)
def test_expand(text: str, samples: list[float | str]) -> None:
    assert expand(text) == samples


def renamed(series: str, naming: str) -> tuple[str, float] | None:
    """``series`` (a promtool series text) under ``naming``'s name of its field and the factor
    that takes its values there; None for a series that is no field of the table's."""
    name, _, labels = series.partition("{")
    old = table().lookup(name)
    if old is None:
        return None
    new = table().field(old.field).by_naming[naming]
    return f"{new.name}{{{labels}", old.scale / new.scale


def convert(values: list[float | str], factor: float) -> list[float | str]:
    return [v if isinstance(v, str) else v * factor for v in values]


def in_naming(tests: dict[str, Any], naming: str, how: str) -> dict[str, Any]:
    """The unit tests of ``tests`` that feed a field, with its series in ``naming``: ``every``
    series, the ``mixed`` fleet's every other device (in order of appearance, so that each test
    has devices of both), or every series ``upgraded`` half-way: its old name stale from the
    middle sample on, its new name from there."""
    out = copy.deepcopy(tests)
    out["tests"] = [
        case
        for case in out["tests"]
        if any(renamed(e["series"], naming) for e in case.get("input_series", []))
    ]
    for case in out["tests"]:
        devices: dict[tuple[str, ...], int] = {}
        series_out = []
        for entry in case.get("input_series", []):
            found = renamed(entry["series"], naming)
            if found is None:
                series_out.append(entry)
                continue
            new_series, factor = found
            if new_series == entry["series"]:
                series_out.append(entry)
                continue
            values = expand(entry["values"])
            labels = dict(re.findall(r'(\w+)="([^"]*)"', entry["series"]))
            device = (labels.get("node", ""), labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
            if how == "every" or (how == "mixed" and devices.setdefault(device, len(devices)) % 2):
                series_out.append({"series": new_series, "values": render(convert(values, factor))})
            elif how == "mixed":
                series_out.append(entry)
            else:
                mid = len(values) // 2
                old_part = [*values[:mid], "stale"]
                new_part = ["_"] * mid + convert(values[mid:], factor)
                series_out.append({"series": entry["series"], "values": render(old_part)})
                series_out.append({"series": new_series, "values": render(new_part)})
        case["input_series"] = series_out
    return out


@pytest.mark.parametrize("how", ["every", "mixed", "upgraded"])
@pytest.mark.parametrize("naming", table().namings[1:])
def test_promtool_unit_tests_in_every_naming(
    promtool: str, tmp_path: Path, naming: str, how: str
) -> None:
    """Every unit test passes with dcgm-exporter's fields in ``naming``'s names and units:
    on every device, on a fleet of both namings, and across an upgrade."""
    names = []
    for file in TEST_FILES:
        tests = yaml.safe_load(file.read_text())
        tests["rule_files"] = [str(RULES)]
        converted = in_naming(tests, naming, how)
        if converted["tests"]:
            (tmp_path / file.name).write_text(yaml.safe_dump(converted, sort_keys=False))
            names.append(file.name)
    assert names
    proc = run_tool([promtool, "test", "rules", *names], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_naming_variants_rename_what_the_rules_read() -> None:
    """The variants above test something: the unit tests feed every field the rules read,
    and the newest naming renames and rescales the memory."""
    tests = yaml.safe_load((RULES_DIR / "dcgm-enricher.tests.yaml").read_text())
    fed = {
        found.field
        for case in tests["tests"]
        for entry in case.get("input_series", [])
        if (found := table().lookup(entry["series"].partition("{")[0]))
    }
    read = {
        f
        for f in table().fields
        for rule in alert_rules() + record_rules()
        if any(re.search(rf"\b{n}\b", rule["expr"]) for n in table().names(f))
    }
    assert read and read <= fed, read - fed
    newest = in_naming(tests, table().namings[-1], "every")
    used = [
        e
        for case in newest["tests"]
        for e in case["input_series"]
        if e["series"].startswith(table().name("fb_used", table().namings[-1]) + "{")
    ]
    assert used and all(float(expand(e["values"])[0]) >= 2**20 for e in used)


def _alert_cases() -> dict[str, list[dict[str, Any]]]:
    cases: dict[str, list[dict[str, Any]]] = {}
    for file in TEST_FILES:
        for test in yaml.safe_load(file.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(case)
    return cases


@pytest.mark.parametrize("alert", [a["alert"] for a in alert_rules()])
def test_every_alert_has_a_firing_and_a_quiet_case(alert: str) -> None:
    cases = _alert_cases().get(alert, [])
    firing = [c for c in cases if c.get("exp_alerts")]
    assert firing, f"no case where {alert} fires"
    assert [c for c in cases if not c.get("exp_alerts")], f"no case where {alert} stays quiet"
    rule = next(a for a in alert_rules() if a["alert"] == alert)
    for case in firing:
        for exp in case["exp_alerts"]:
            # The whole alert is checked: its severity and every annotation, verbatim.
            assert exp["exp_labels"]["severity"] == rule["labels"]["severity"]
            assert set(exp["exp_annotations"]) == set(rule["annotations"])


def test_every_recording_rule_is_unit_tested() -> None:
    tested = {
        name
        for file in TEST_FILES
        for test in yaml.safe_load(file.read_text())["tests"]
        for case in test.get("promql_expr_test", [])
        for name in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", case["expr"])
    }
    untested = {r["record"] for r in record_rules()} - tested
    # The join helper is exercised through every workload and user record.
    assert untested <= {"namespace_pod:gpu_pod_info:max"}, untested


# --------------------------------------------------------------------------- style


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_follows_the_mixin_style(rule: dict[str, Any]) -> None:
    assert re.fullmatch(rf"{ALERT_PREFIX}(?:[A-Z][a-z0-9]*)+", rule["alert"]), rule["alert"]
    assert "for" in rule, "every alert says how long it must hold"
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    # No runbook_url in the shipped rules: it is added from the install's one value
    # (docs/alerts.md#runbook-links); the description names the runbook's section meanwhile.
    assert set(annotations) == {"summary", "description"}
    assert annotations["summary"].endswith(".") and "{{" not in annotations["summary"]
    assert len(annotations["description"]) > 80, "the description says what to do"
    anchor = generate.runbook_anchor(rule["alert"])
    assert annotations["description"].endswith(f" Runbook: docs/runbook.md#{anchor}.")
    assert annotations["description"].count("#") == 1


@pytest.mark.parametrize("rule", record_rules(), ids=lambda r: r["record"])
def test_record_names_follow_level_metric_operations(rule: dict[str, Any]) -> None:
    assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]
    # Every aggregation keeps the cluster label of multi-cluster setups.
    for by in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
        assert "cluster" in by.split(", "), f"{rule['record']}: by ({by}) drops cluster"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        pytest.param("GpuAllocatedIdle", "gpuallocatedidle", id="camel-case"),
        pytest.param("The enricher", "the-enricher", id="spaces"),
        pytest.param("Waste (and misuse)", "waste-and-misuse", id="punctuation"),
    ],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def runbook_sections() -> dict[str, str]:
    """Alert sections of the runbook (### headings), by anchor, with their text."""
    sections: dict[str, str] = {}
    current = None
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("### "):
            current = github_anchor(line[4:])
            sections[current] = ""
        elif line.startswith("## "):
            current = None
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def test_runbook_has_one_section_per_alert() -> None:
    sections = runbook_sections()
    assert set(sections) == {generate.runbook_anchor(a["alert"]) for a in alert_rules()}
    for anchor, text in sections.items():
        assert "**Meaning.**" in text and "**Mitigation.**" in text, anchor


def test_runbook_links_resolve() -> None:
    anchors = {github_anchor(m) for m in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), re.M)}
    for target in re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text()):
        assert target in anchors, target


def test_alerts_doc_counts_and_lists_every_alert() -> None:
    doc = (ROOT / "docs" / "alerts.md").read_text()
    counts = re.search(r"(\d+) alerts and (\d+) recording\s+rules", doc)
    assert counts is not None, "docs/alerts.md states how many alerts and recording rules there are"
    assert (int(counts[1]), int(counts[2])) == (len(alert_rules()), len(record_rules()))
    table = set(re.findall(r"^\| \[(Gpu\w+)\]\(runbook\.md#(\w+)\) \|", doc, re.M))
    assert table == {(a["alert"], a["alert"].lower()) for a in alert_rules()}


def golden_sources() -> list[str]:
    """Every source the enricher reports, as its golden outputs (the real app's) name them."""
    pattern = re.compile(r'^dcgm_enricher_source_enabled\{source="([a-z]+)"\}', re.M)
    return sorted(
        {
            m
            for f in (ROOT / "tests" / "golden").glob("*.out")
            for m in pattern.findall(f.read_text())
        }
    )


@pytest.mark.parametrize("source", golden_sources())
def test_every_source_that_can_be_down_has_an_alert(source: str) -> None:
    exprs = [a["expr"] for a in alert_rules()]
    assert any(f'dcgm_enricher_source_up{{source="{source}"}} == 0' in e for e in exprs), source


# --------------------------------------------------------------------------- PrometheusRule


def test_prometheus_rule_is_generated_from_the_rules_file() -> None:
    assert (MONITORING / "prometheusrule.yaml").read_text() == generate.render(RULES.read_text())


def test_prometheus_rule_holds_the_same_groups() -> None:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == rule_groups()


def test_generate_check_detects_a_stale_file(tmp_path: Path, monkeypatch: Any) -> None:
    """--check finds a stale or missing output, and a plain run rewrites them all (every output
    pointed under tmp_path: no test writes into the checkout, tests/hygiene.py)."""
    rules_copy = tmp_path / RULES.name
    rules_copy.write_text(RULES.read_text())
    monkeypatch.setattr(generate, "RULES", rules_copy)
    component = tmp_path / "runbook-url" / "kustomization.yaml"
    monkeypatch.setattr(generate, "RUNBOOK_COMPONENT", component)
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(generate.render(RULES.read_text()).replace("for: 2h", "for: 3h"))
    monkeypatch.setattr(generate, "PROMETHEUS_RULE", stale)
    assert generate.main(["--check"]) == 1
    monkeypatch.setattr(generate, "PROMETHEUS_RULE", tmp_path / "missing.yaml")
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0
    assert generate.main(["--check"]) == 0
    component.write_text(component.read_text().replace("=gpuenricherdown", "=gpuenricherup"))
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0
    rules_copy.write_text(rules_copy.read_text().replace('for: "2h"', 'for: "3h"', 1))
    assert generate.main(["--check"]) == 1


def test_runbook_component_is_generated_from_the_rules_file() -> None:
    assert generate.RUNBOOK_COMPONENT.read_text() == generate.render_runbook_component(
        RULES.read_text()
    )


def test_generate_writes_the_rules_with_runbook_urls(
    promtool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--runbook-url URL`, for a Prometheus without the Operator: a copy that promtool loads,
    the same rules but for URL#<anchor of the alert's runbook section> on every alert."""
    assert generate.main(["--runbook-url", RUNBOOK_BASE]) == 0
    copy_file = tmp_path / "dcgm-enricher.rules.yaml"
    copy_file.write_text(capsys.readouterr().out)
    proc = run_tool([promtool, "check", "rules", str(copy_file)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = yaml.safe_load(copy_file.read_text())["groups"]
    sections = runbook_sections()
    expected = copy.deepcopy(rule_groups())
    for group in expected:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = f"{RUNBOOK_BASE}#{rule['alert'].lower()}"
                assert rule["alert"].lower() in sections
    assert written == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--runbook-url", "docs/runbook.md"], "http(s) URL", id="relative"),
        pytest.param(["--runbook-url", RUNBOOK_BASE + "#top"], "#fragment", id="fragment"),
        pytest.param(["--runbook-url", "https://a b/runbook.md"], "http(s) URL", id="space"),
        pytest.param(["--runbook-url", RUNBOOK_BASE, "--check"], "do not go", id="with-check"),
    ],
)
def test_generate_refuses_a_bad_runbook_url(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        generate.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def prometheus_rule_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(PROMETHEUS_RULE_SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_prometheus_rule_matches_the_schema() -> None:
    doc = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert prometheus_rule_errors(doc) == []


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        pytest.param(lambda d: d["spec"]["groups"][0].update(rulez=[]), "groups", id="misspelt"),
        pytest.param(
            lambda d: d["spec"]["groups"][2]["rules"][0].update({"for": "2 hours"}),
            "for",
            id="bad-for",
        ),
        pytest.param(
            lambda d: d["spec"]["groups"][0]["rules"][0].pop("record"), "rules", id="no-name"
        ),
        pytest.param(
            lambda d: d.update(apiVersion="monitoring.coreos.com/v1alpha1"), "apiVersion", id="api"
        ),
    ],
)
def test_prometheus_rule_schema_rejects(mutate: Any, where: str) -> None:
    doc = copy.deepcopy(yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text()))
    mutate(doc)
    errors = prometheus_rule_errors(doc)
    assert errors and any(where in e for e in errors), errors


def test_promtool_accepts_the_prometheus_rule_groups(promtool: str, tmp_path: Path) -> None:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    (tmp_path / "groups.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = run_tool([promtool, "check", "rules", str(tmp_path / "groups.yaml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.usefixtures("kubectl")  # fails in CI, skips elsewhere
def test_monitoring_component_builds(tmp_path: Path) -> None:
    """An overlay that adds the component gets the PrometheusRule and the dashboard."""
    assert KUBECTL is not None
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "gpu-monitoring",
                "components": [os.path.relpath(MONITORING, tmp_path)],
            }
        )
    )
    proc = run_tool([KUBECTL, "kustomize", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [("ConfigMap", "dcgm-enricher-dashboard"), ("PrometheusRule", "dcgm-enricher")]
    assert all(d["metadata"]["namespace"] == "gpu-monitoring" for d in docs)
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == rule_groups()
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap")
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}
    shipped = (ROOT / "grafana" / "dcgm-enricher.json").read_text()
    assert dashboard["data"]["dcgm-enricher.json"] == shipped


def runbook_overlay(tmp_path: Path, url_configmap: bool) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize` of the overlay docs/alerts.md shows: the sidecar overlay, the
    runbook-url component and (or not) the URL's ConfigMap, beside a copy of manifests/."""
    manifests = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", manifests)
    doc = (ROOT / "docs" / "alerts.md").read_text()
    example = re.search(
        r"```yaml\n(apiVersion: kustomize.config.k8s.io/v1beta1\n.*?)```", doc, re.S
    )
    assert example is not None, "docs/alerts.md shows the runbook-url overlay"
    kustomization = yaml.safe_load(example[1])
    literal = kustomization["configMapGenerator"][0]["literals"]
    assert literal == ["url=https://<host>/<path>/docs/runbook.md"]
    literal[0] = f"url={RUNBOOK_BASE}"
    if not url_configmap:
        del kustomization["configMapGenerator"]
    overlay = manifests / "overlays" / "with-runbook"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return run_tool([KUBECTL or "kubectl", "kustomize", str(overlay)])


@pytest.mark.usefixtures("kubectl")  # fails in CI, skips elsewhere
def test_runbook_url_component_sets_every_runbook_url(tmp_path: Path) -> None:
    proc = runbook_overlay(tmp_path, url_configmap=True)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    without = build("overlays/sidecar")
    # The same objects as the overlay alone (neither ConfigMap of the component is applied)...
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in without
    )
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    # ...and the rules, but for URL#<anchor> on every alert: the anchor of its runbook section.
    assert rule["spec"]["groups"] == generate.with_runbook_urls(rule_groups(), RUNBOOK_BASE)
    urls = [
        r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    assert sorted(u.split("#")[1] for u in urls) == sorted(runbook_sections())


@pytest.mark.usefixtures("kubectl")  # fails in CI, skips elsewhere
def test_runbook_url_component_without_the_url_stops_the_build(tmp_path: Path) -> None:
    proc = runbook_overlay(tmp_path, url_configmap=False)
    assert proc.returncode != 0
    assert "nothing selected by ConfigMap" in proc.stderr
    assert generate.RUNBOOK_URL_CONFIGMAP in proc.stderr
