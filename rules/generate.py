"""Generate manifests/monitoring/prometheusrule.yaml from rules/dcgm-enricher.rules.yaml.

The plain rules file is the single source of truth; the PrometheusRule carries the same groups
for the Prometheus Operator. Run after editing the rules:

    python rules/generate.py          # rewrite the PrometheusRule
    python rules/generate.py --check  # exit 1 if it is out of date (what the tests check)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
PROMETHEUS_RULE = ROOT / "manifests" / "monitoring" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from rules/dcgm-enricher.rules.yaml by rules/generate.py: edit that file, then run
# `python rules/generate.py`. The recording and alerting rules of dcgm-enricher for the
# Prometheus Operator; the Prometheus resource must select it (kube-prometheus-stack selects
# PrometheusRules by its `release` label by default: add that label in your overlay).
"""


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, so PromQL stays readable in the manifest."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def prometheus_rule(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule object holding ``groups`` unchanged."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "dcgm-enricher",
            "labels": {
                "app.kubernetes.io/name": "dcgm-enricher",
                "app.kubernetes.io/part-of": "dcgm-enricher",
            },
        },
        "spec": {"groups": groups},
    }


def render(rules_text: str) -> str:
    """The PrometheusRule manifest for the text of the plain rules file."""
    groups = yaml.safe_load(rules_text)["groups"]
    body = yaml.dump(
        prometheus_rule(groups),
        Dumper=_Dumper,
        sort_keys=False,
        width=100,
        allow_unicode=True,
    )
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args(argv)
    text = render(RULES.read_text(encoding="utf-8"))
    if args.check:
        current = PROMETHEUS_RULE.read_text(encoding="utf-8") if PROMETHEUS_RULE.exists() else ""
        if current != text:
            print(f"{PROMETHEUS_RULE} is stale: run python rules/generate.py", file=sys.stderr)
            return 1
        return 0
    PROMETHEUS_RULE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
