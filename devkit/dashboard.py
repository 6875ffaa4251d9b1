"""The shipped dashboard's queries and the shipped rules, read as the tests and the bench ask
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
DASHBOARD = ROOT / "grafana" / "dcgm-enricher.json"
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"

# Grafana's built-in variables, with the values a short test range gives them.
BUILTINS = {"__range": "5m", "__rate_interval": "15s", "__interval": "1s"}
_VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


@dataclass(frozen=True)
class Query:
    """One panel target: its row, panel and refId, its PromQL as written, its legend, and
    whether Grafana asks it as an instant query (instant and not range)."""

    row: str
    panel: str
    ref: str
    expr: str
    legend: str
    instant: bool = False

    @property
    def id(self) -> str:
        return f"{self.row}/{self.panel}/{self.ref}"


def queries() -> list[Query]:
    """Every panel target of the shipped dashboard, in order, each under its row."""
    out = []
    row = ""
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for t in panel["targets"]:
            instant = bool(t.get("instant")) and not t.get("range")
            out.append(
                Query(row, panel["title"], t["refId"], t["expr"], t["legendFormat"], instant)
            )
    return out


def variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def interpolate(
    text: str, prefix: str = "", *, builtins: Mapping[str, str] = BUILTINS, **chosen: str
) -> str:
    """Grafana's variable substitution with every variable on All (regex ``.*``) but those
    ``chosen``, the pod labels under ``prefix`` (the dashboard's label_prefix), and Grafana's
    own variables as ``builtins`` (a short test range's by default)."""
    values = {**builtins, "label_prefix": prefix}
    for name, var in variables().items():
        if var["type"] == "query":
            values[name] = var["allValue"]
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
