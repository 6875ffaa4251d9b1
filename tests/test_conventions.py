"""The monitoring-mixin conventions, as their two linters check them: mixtool's `lint`
(monitoring-mixins/mixtool, pkg/mixer/lint.go: alert groups, names, severities, summary and
description forms, the dashboard's uid and title) and grafana's dashboard-linter (lint/rule_*.go:
a templated data source used by every panel, titles and descriptions, units, targets, valid
PromQL, $__rate_interval in rates, counters under rate, variables refreshed on time change).
Neither Go tool installs here, so their rules are applied to the shipped rules and dashboard by
this module; mixin/.lint (their format) names each rule the mixin does not follow, and why.
PromQL validity is the real parser's: promtool checks every dashboard query.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.dashboard import BOARDS, dashboard

from .test_dashboard import interpolate, queries

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
LINT = ROOT / "mixin" / ".lint"

# mixtool's patterns (pkg/mixer/lint.go).
CAMEL_CASE = re.compile(r"^([A-Z]+[a-z0-9]+)+$")
SENTENCE = re.compile(r"^[A-Z].+\.$")
GO_TEMPLATE = re.compile(r"\{\{.+}\}")
# dashboard-linter's units (lint/rule_panel_units.go), the ones this dashboard could use.
VALID_UNITS = {
    "none", "short", "percent", "percentunit", "bytes", "decbytes", "bits", "Bps", "bps",
    "watt", "kwatt", "watth", "kwatth", "joule", "celsius", "hertz", "rothz", "rotrpm",
    "s", "ms", "ns", "m", "h", "d", "dateTimeFromNow", "dateTimeAsIso", "cps", "ops", "reqps",
    "rps", "iops", "bool",
}  # fmt: skip
PANELS_WITH_UNITS = {"stat", "singlestat", "graph", "table-old", "timeseries", "gauge"}


def exclusions() -> dict[str, dict[str, Any]]:
    """mixin/.lint's exclusions: rule -> its reason and entries."""
    loaded: dict[str, dict[str, Any]] = yaml.safe_load(LINT.read_text())["exclusions"]
    return loaded


Exclusions = dict[str, dict[str, Any]]


def excluded(excl: Exclusions, rule: str, **where: str) -> bool:
    """Whether ``excl`` (mixin/.lint's) excludes ``rule`` everywhere, or at this place (an
    entry matching every attribute it sets)."""
    found = excl.get(rule)
    if found is None:
        return False
    entries = found.get("entries") or []
    if not entries:
        return True
    return any(all(where.get(k) == v for k, v in e.items() if k != "reason") for e in entries)


def alert_groups() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [g for g in groups if any("alert" in r for r in g["rules"])]


def alerts() -> list[dict[str, Any]]:
    return [r for g in alert_groups() for r in g["rules"] if "alert" in r]


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def boards() -> list[dict[str, Any]]:
    """Every dashboard of the family, as shipped."""
    return [dashboard(key) for key in BOARDS]


# --------------------------------------------------------------------------- mixtool


def mixtool_problems(excl: Exclusions) -> list[str]:
    out = []
    for group in alert_groups():
        if len(group["rules"]) > 20 and not excluded(excl, "alert-group-rule-count"):
            out.append(f"[alert-group-rule-count] {group['name']}")
        if len(group["name"]) > 40 and not excluded(excl, "alert-group-name-length"):
            out.append(f"[alert-group-name-length] {group['name']}")
    for rule in alerts():
        name, notes = rule["alert"], rule.get("annotations", {})
        checks = {
            "alert-name-camelcase": CAMEL_CASE.match(name) is not None,
            "alert-name-length": len(name) <= 40,
            "alert-severity-rule": rule.get("labels", {}).get("severity")
            in ("warning", "critical", "info"),
            "alert-description-missing-rule": "description" in notes,
            "alert-description-templating": GO_TEMPLATE.search(notes.get("description", ""))
            is not None,
            "alert-summary-missing-rule": "summary" in notes,
            "alert-summary-templating": GO_TEMPLATE.search(notes.get("summary", "")) is None,
            "alert-summary-style": SENTENCE.match(notes.get("summary", "")) is not None,
        }
        out += [
            f"[{r}] {name}"
            for r, ok in checks.items()
            if not ok and not excluded(excl, r, alert=name)
        ]
    return out


def test_the_alerts_pass_mixtools_lint() -> None:
    assert len(alerts()) >= 20
    assert mixtool_problems(exclusions()) == []


def test_the_dashboards_have_the_uid_and_title_mixtool_wants() -> None:
    found = [(b["uid"], b["title"]) for b in boards()]
    assert all(uid and title for uid, title in found)
    assert len({uid for uid, _ in found}) == len({title for _, title in found}) == len(BOARDS)


def test_mixtools_rules_find_what_they_should() -> None:
    """The rules themselves, on what breaks them."""
    assert CAMEL_CASE.match("GpuHeldIdle") and not CAMEL_CASE.match("gpu_held_idle")
    assert SENTENCE.match("A GPU is running hot.") and not SENTENCE.match("a GPU is hot")
    assert GO_TEMPLATE.search("on {{ $labels.node }}") and not GO_TEMPLATE.search("no template")


# --------------------------------------------------------------------------- dashboard-linter


def _matrix_ranges(expr: str) -> Iterator[tuple[str, str]]:
    """(the function applied, the range) of each range selector in ``expr``: ``rate(x[5m])``
    gives ("rate", "5m"). The innermost call the selector sits in, by the parentheses."""
    stack: list[str] = []
    word = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch in "{\"'":  # skip matchers and strings: their brackets are not PromQL's
            close = {"{": "}", '"': '"', "'": "'"}[ch]
            i = expr.index(close, i + 1) + 1
            continue
        if ch == "(":
            found = word.search(expr[:i].rstrip())
            stack.append(found.group() if found else "")
        elif ch == ")":
            if stack:
                stack.pop()
        elif ch == "[":
            end = expr.index("]", i)
            yield (stack[-1] if stack else ""), expr[i + 1 : end]
            i = end
        i += 1


def _counters_outside_rates(expr: str) -> list[str]:
    """Counters (names ending in _total) that no rate, irate or increase takes."""
    out = []
    for match in re.finditer(r"(?<![\w:\"'=~!])([a-zA-Z_:][\w:]*_total)\b", expr):
        before = expr[: match.start()]
        depth, fn = 0, ""
        for j in range(len(before) - 1, -1, -1):
            if before[j] == ")":
                depth += 1
            elif before[j] == "(":
                if depth == 0:
                    found = re.search(r"[A-Za-z_]\w*$", before[:j].rstrip())
                    fn = found.group() if found else ""
                    break
                depth -= 1
        if fn not in ("rate", "irate", "increase"):
            out.append(match.group(1))
    return out


def dashboard_linter_problems(b: dict[str, Any], excl: Exclusions) -> list[str]:
    out = []

    def report(rule: str, message: str, **where: str) -> None:
        if not excluded(excl, rule, **where):
            out.append(f"[{rule}] {message}")

    sources = [v for v in b["templating"]["list"] if v["type"] == "datasource"]
    if len(sources) != 1 or sources[0]["name"] not in ("datasource", "prometheus_datasource"):
        report("template-datasource-rule", f"templated data sources: {sources}")
    ds_refs = {f"${s['name']}" for s in sources} | {f"${{{s['name']}}}" for s in sources}
    for var in b["templating"]["list"]:
        if var["type"] != "query":
            continue
        if var.get("refresh") != 2:
            report("template-on-time-change-reload-rule", var["name"])
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        if not re.fullmatch(r"(label_values|label_names|metrics|query_result)\(.*\)", query):
            report("template-label-promql-rule", f"{var['name']}: {query}")
    for p in panels(b):
        if p["type"] == "row":
            continue
        title = p.get("title", "")
        if p.get("datasource", {}).get("uid") not in ds_refs:
            report("panel-datasource-rule", title, panel=title)
        if not title or not p.get("description"):
            report("panel-title-description-rule", title, panel=title)
        if not p.get("targets"):
            report("panel-no-targets-rule", title, panel=title)
        defaults = p.get("fieldConfig", {}).get("defaults", {})
        if (
            p["type"] in PANELS_WITH_UNITS
            and not defaults.get("mappings")
            and defaults.get("unit") not in VALID_UNITS
        ):
            report("panel-units-rule", f"{title}: {defaults.get('unit')}", panel=title)
        for idx, target in enumerate(p.get("targets", [])):
            expr = target.get("expr", "")
            for fn, window in _matrix_ranges(expr):
                if fn in ("rate", "irate") and window != "$__rate_interval":
                    report(
                        "target-rate-interval-rule",
                        f"{title}: {fn}(...[{window}])",
                        panel=title,
                        targetIdx=str(idx),
                    )
            for counter in _counters_outside_rates(expr):
                report("target-counter-agg-rule", f"{title}: {counter}", panel=title)
    if b.get("editable"):
        report("uneditable-dashboard", b["title"])
    return out


@pytest.mark.parametrize("key", list(BOARDS))
def test_the_dashboard_passes_dashboard_linters_rules(key: str) -> None:
    assert dashboard_linter_problems(dashboard(key), exclusions()) == []


def test_every_dashboard_query_is_valid_promql(tmp_path: Path, promtool: str) -> None:
    """target-promql-rule with the real parser: every query, its variables filled in, as a
    recording rule that promtool checks."""
    rules = [
        {"record": f"q:query_{i}:x", "expr": interpolate(q.expr, "")}
        for i, q in enumerate(queries())
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("expr", "ranges", "counters"),
    [
        pytest.param("rate(x_total[5m])", [("rate", "5m")], [], id="rate-5m"),
        pytest.param(
            'sum(rate(x_total{a="[1]"}[$__rate_interval]))',
            [("rate", "$__rate_interval")],
            [],
            id="rate-interval",
        ),
        pytest.param("max_over_time(x[1h])", [("max_over_time", "1h")], [], id="not-a-rate"),
        pytest.param("sum(x_total)", [], ["x_total"], id="raw-counter"),
        pytest.param("increase(x_total[1d]) / y", [("increase", "1d")], [], id="increase"),
    ],
)
def test_the_linters_rules_find_what_they_should(
    expr: str, ranges: list[tuple[str, str]], counters: list[str]
) -> None:
    assert list(_matrix_ranges(expr)) == ranges
    assert _counters_outside_rates(expr) == counters


def test_every_exclusion_gives_a_reason_and_is_still_needed() -> None:
    """A rule excluded in mixin/.lint says why, and would fail without the exclusion: one the
    mixin follows again is taken out of the file."""
    every = exclusions()
    # Rules about job and instance variables and matchers are not applied here: the
    # exclusion records the choice (the dashboard has neither, by design).
    unchecked = {
        "template-job-rule",
        "template-instance-rule",
        "target-job-rule",
        "target-instance-rule",
    }
    for rule, entry in every.items():
        assert entry.get("reason"), rule
        if rule in unchecked:
            continue
        rest = {k: v for k, v in every.items() if k != rule}
        found = [
            p
            for b in boards()
            for p in dashboard_linter_problems(b, rest) + mixtool_problems(rest)
            if rule in p
        ]
        assert found, f"{rule} is excluded in mixin/.lint but nothing breaks it"
