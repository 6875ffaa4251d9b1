"""The shipped dashboards' queries and the shipped rules, read as the tests and the bench ask
them: every panel target (with Grafana's variable substitution), every PromQL text of a board,
and the rules by kind."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
# The family of dashboards (grafana/generate.py), by their key in the mixin's _config, from the
# widest scope to the narrowest, and the enricher's own.
BOARDS = {
    "cluster": "dcgm-enricher.json",
    "namespace": "dcgm-enricher-namespace.json",
    "pod": "dcgm-enricher-pod.json",
    "node": "dcgm-enricher-node.json",
    "enricher": "dcgm-enricher-self.json",
}
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"

# Grafana's built-in variables, with the values a short test range gives them.
BUILTINS = {"__range": "5m", "__rate_interval": "15s", "__interval": "1s"}
_VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def dashboard(board: str = "cluster") -> dict[str, Any]:
    """The shipped dashboard of key ``board``."""
    loaded: dict[str, Any] = json.loads((GRAFANA / BOARDS[board]).read_text())
    return loaded


@dataclass(frozen=True)
class Query:
    """One panel target: its dashboard (key), row, panel and refId, its PromQL as written, its
    legend, and whether Grafana asks it as an instant query (instant and not range)."""

    board: str
    row: str
    panel: str
    ref: str
    expr: str
    legend: str
    instant: bool = False

    @property
    def id(self) -> str:
        return f"{self.board}/{self.row}/{self.panel}/{self.ref}"


def board_queries(board: str) -> list[Query]:
    """Every panel target of the shipped dashboard ``board``, in order, each under its row."""
    out = []
    row = ""
    for panel in dashboard(board)["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for t in panel["targets"]:
            instant = bool(t.get("instant")) and not t.get("range")
            out.append(
                Query(board, row, panel["title"], t["refId"], t["expr"], t["legendFormat"], instant)
            )
    return out


# A matcher on a dashboard variable (grafana/boards/common.py writes them `, label=~"$var"`).
_VARIABLE_MATCHER = re.compile(r', (?:\$\{label_prefix\})?\w+=~"\$\w+"')


def queries() -> list[Query]:
    """Every distinct panel target of the shipped dashboards, in order: a panel that several
    dashboards show comes once, under the first of them, where its queries differ only by
    their matchers on variables (the same query with every variable on All, as the tests and
    the fleet ask it)."""
    seen: set[tuple[str, bool]] = set()
    out = []
    for board in BOARDS:
        for q in board_queries(board):
            key = (_VARIABLE_MATCHER.sub("", q.expr), q.instant)
            if key not in seen:
                seen.add(key)
                out.append(q)
    return out


def variables(board: str | None = None) -> dict[str, dict[str, Any]]:
    """The variables of dashboard ``board``, or of all of them (each has the same meaning
    wherever it is)."""
    out: dict[str, dict[str, Any]] = {}
    for key in [board] if board else BOARDS:
        for v in dashboard(key)["templating"]["list"]:
            out.setdefault(v["name"], v)
    return out


def interpolate(
    text: str, prefix: str = "", *, builtins: Mapping[str, str] = BUILTINS, **chosen: str
) -> str:
    """Grafana's variable substitution with every variable on All (regex ``.*``; a dashboard's
    one-value scope variable too, as if every value were chosen) but those ``chosen``, the pod
    labels under ``prefix`` (the dashboard's label_prefix), and Grafana's own variables as
    ``builtins`` (a short test range's by default)."""
    values = {**builtins, "label_prefix": prefix}
    for name, var in variables().items():
        if var["type"] == "query":
            values[name] = var.get("allValue", ".*")
    values.update(chosen)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown variable ${name}"
        return values[name]

    return _VAR_RE.sub(sub, text)


def promql_texts(board: dict[str, Any]) -> list[str]:
    """Every PromQL text of a dashboard: panel targets, variable queries, annotations."""
    out = [t["expr"] for p in board["panels"] for t in p.get("targets", []) if "expr" in t]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            out += [var["definition"], var["query"]["query"]]
    out += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    return out


def rule_groups() -> list[dict[str, Any]]:
    """The shipped rules file's groups."""
    loaded: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return loaded


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def record_rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "record" in r]


def alerts() -> list[str]:
    """The shipped alerts' names, in order."""
    return [r["alert"] for r in alert_rules()]


def records() -> list[str]:
    """The shipped records' names, in order."""
    return [r["record"] for r in record_rules()]
