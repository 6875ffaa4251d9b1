"""Write rules/dcgm-enricher.rules.yaml from the mixin, and the PrometheusRule from it.

The mixin (mixin/: alerts/alerts.libsonnet, rules/rules.libsonnet, config.libsonnet) is the
single source of truth: rules/dcgm-enricher.rules.yaml is its build with the default _config
(the recording rules' groups, then the alerts'), the PrometheusRule
(manifests/monitoring/prometheusrule.yaml) carries the same groups for the Prometheus Operator,
and manifests/components/runbook-url adds a runbook_url to each of its alerts from one base URL.
The mixin reads dcgm-exporter's fields by meaning from its own copy of the field table
(mixin/lib/dcgm_fields.json, so that a mixin vendored alone has it): this writes that copy
first, byte for byte enricher/dcgm_fields.json. The prometheus-adapter recipe
(deploy/autoscaling/prometheus-adapter.yaml) reads a field too: it is written here from the
table as well. Run after editing the mixin or the table:

    python rules/generate.py          # rewrite the rules file, the PrometheusRule, the component
    python rules/generate.py --check  # exit 1 if any is out of date (what the tests check)

For a Prometheus without the Operator, a copy of the rules with runbook links:

    python rules/generate.py --runbook-url https://HOST/PATH/docs/runbook.md > my.rules.yaml
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import yaml

# The checkout's devkit and enricher (the field table).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from devkit import fieldquery

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
PROMETHEUS_RULE = ROOT / "manifests" / "monitoring" / "prometheusrule.yaml"
RUNBOOK_COMPONENT = ROOT / "manifests" / "components" / "runbook-url" / "kustomization.yaml"
TABLE = ROOT / "enricher" / "dcgm_fields.json"
MIXIN_TABLE = ROOT / "mixin" / "lib" / "dcgm_fields.json"
ADAPTER = ROOT / "deploy" / "autoscaling" / "prometheus-adapter.yaml"
# The ConfigMap (key url) that an overlay using the component supplies, and the component's own
# map of each alert's runbook anchor; neither is applied (kustomize's local-config annotation).
RUNBOOK_URL_CONFIGMAP = "dcgm-enricher-runbook"
RUNBOOK_ANCHORS_CONFIGMAP = "dcgm-enricher-runbook-anchors"
LOCAL_CONFIG = {"config.kubernetes.io/local-config": "true"}

RULES_HEADER = """\
# GENERATED from the mixin (mixin/alerts, mixin/rules, default _config) by rules/generate.py:
# edit the mixin, then run `python rules/generate.py`. dcgm-enricher's recording and alerting
# rules, for `rule_files:` in prometheus.yml; the chart and the Compose stack ship this file.
# Every rule assumes the enricher is scraped with honor_labels: true (what every manifest here
# does), so that `namespace`, `pod` and `container` name the workload on the GPU, and that its
# targets carry job="dcgm-enricher" (docs/alerts.md). Each alert's description names its section
# of docs/runbook.md.
"""
HEADER = """\
# GENERATED from rules/dcgm-enricher.rules.yaml by rules/generate.py: edit the mixin, then run
# `python rules/generate.py`. The recording and alerting rules of dcgm-enricher for the
# Prometheus Operator; the Prometheus resource must select it (kube-prometheus-stack selects
# PrometheusRules by its `release` label by default: add that label in your overlay).
"""
RUNBOOK_COMPONENT_HEADER = f"""\
# GENERATED from rules/dcgm-enricher.rules.yaml by rules/generate.py: edit the mixin, then run
# `python rules/generate.py`. Adds runbook_url <URL>#<anchor> to every alert of the
# PrometheusRule, from one value: the URL where docs/runbook.md is published for your users (your
# fork or mirror of this repository, an internal Git host, a wiki). Without this component the
# alerts carry no runbook_url; each description names its docs/runbook.md section.
#
# Use it in an overlay of your own, after a base that has ../../monitoring, and give the URL as
# a ConfigMap named {RUNBOOK_URL_CONFIGMAP} (key url) that is not applied:
#
#   resources:
#     - <path to>/manifests/overlays/sidecar
#   components:
#     - <path to>/manifests/components/runbook-url
#   configMapGenerator:
#     - name: {RUNBOOK_URL_CONFIGMAP}
#       literals:
#         - url=https://<host>/<path>/docs/runbook.md
#       options:
#         disableNameSuffixHash: true
#         annotations:
#           config.kubernetes.io/local-config: "true"
#
# Without that ConfigMap the build stops: "nothing selected by ConfigMap...".
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


def runbook_anchor(alert: str) -> str:
    """The anchor of an alert's section in docs/runbook.md (its ### heading, as GitHub and most
    Markdown renderers make it)."""
    return alert.lower()


def check_runbook_url(url: str) -> str:
    """``url`` when it can be the base of every runbook_url, else a ValueError saying why."""
    if not re.fullmatch(r"https?://[^\s#]+", url):
        raise ValueError(
            f"--runbook-url {url!r}: expected the http(s) URL of docs/runbook.md, without a "
            "#fragment: each alert adds #<its anchor>"
        )
    return url


def with_runbook_urls(groups: list[dict[str, Any]], base_url: str) -> list[dict[str, Any]]:
    """A copy of ``groups`` whose every alert has runbook_url ``base_url#<its anchor>``."""
    out = copy.deepcopy(groups)
    for group in out:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = f"{base_url}#{runbook_anchor(rule['alert'])}"
    return out


def render_runbook_component(rules_text: str) -> str:
    """manifests/components/runbook-url/kustomization.yaml for the plain rules file's text.

    kustomize's replacements cannot join two values, so each alert takes two: the URL creates
    its runbook_url, then its anchor (from the component's own map) is appended after a ``#``.
    """
    groups = yaml.safe_load(rules_text)["groups"]
    select = {
        "kind": "PrometheusRule",
        "labelSelector": "app.kubernetes.io/part-of=dcgm-enricher",
    }
    paths = {
        rule["alert"]: (
            f"spec.groups.[name={group['name']}].rules.[alert={rule['alert']}]"
            ".annotations.runbook_url"
        )
        for group in groups
        for rule in group["rules"]
        if "alert" in rule
    }
    replacements: list[dict[str, Any]] = [
        {
            "source": {"kind": "ConfigMap", "name": RUNBOOK_URL_CONFIGMAP, "fieldPath": "data.url"},
            "targets": [
                {"select": select, "fieldPaths": list(paths.values()), "options": {"create": True}}
            ],
        }
    ]
    replacements += [
        {
            "source": {
                "kind": "ConfigMap",
                "name": RUNBOOK_ANCHORS_CONFIGMAP,
                "fieldPath": f"data.{alert}",
            },
            "targets": [
                {"select": select, "fieldPaths": [path], "options": {"delimiter": "#", "index": 1}}
            ],
        }
        for alert, path in paths.items()
    ]
    component = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "configMapGenerator": [
            {
                "name": RUNBOOK_ANCHORS_CONFIGMAP,
                "literals": [f"{alert}={runbook_anchor(alert)}" for alert in paths],
                "options": {"disableNameSuffixHash": True, "annotations": LOCAL_CONFIG},
            }
        ],
        "replacements": replacements,
    }
    body = yaml.dump(component, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return RUNBOOK_COMPONENT_HEADER + body


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


def render_with_runbook_urls(rules_text: str, base_url: str) -> str:
    """The plain rules file with a runbook_url on every alert (comments are not kept)."""
    groups = with_runbook_urls(yaml.safe_load(rules_text)["groups"], base_url)
    body = yaml.dump(
        {"groups": groups}, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True
    )
    return (
        "# GENERATED from rules/dcgm-enricher.rules.yaml by rules/generate.py --runbook-url\n"
        f"# {base_url}: every alert's runbook_url is that URL and its section's anchor.\n" + body
    )


# deploy/autoscaling/prometheus-adapter.yaml, with the field its MIG rule reads.
ADAPTER_TEMPLATE = """\
# GENERATED by rules/generate.py (ADAPTER_TEMPLATE, with the names of dcgm-exporter's fields
# from enricher/dcgm_fields.json): edit it there, then run `python rules/generate.py`.
# prometheus-adapter rules for dcgm-enricher's per-pod GPU series (docs/autoscaling.md).
#
# The custom metrics API gets two pod metrics for whole and shared GPUs, each the sum over the
# pod's containers and GPUs (a pod with two busy GPUs reports 2):
#   pods/gpu_pod_utilization_ratio  SM time the pod's processes used, 0 to 1 per GPU (absent on
#                                   MIG instances: NVML has no per-process data there)
#   pods/gpu_pod_memory_used_bytes  GPU memory the pod's processes hold
# and a third for MIG, where NVML has no per-process SM time (hpa-mig.yaml):
#   pods/gpu_pod_mig_engine_active_ratio  the graphics engine's activity of each MIG instance
#                                   the pod holds (dcgm-exporter's gr_engine_active field per
#                                   GPU_I_ID, 0 to 1, under whichever of its names the node's
#                                   exporter release writes), summed over its instances
# The two come from the enricher's gpu_container_* series, whose namespace and pod labels name
# the workload that really runs on the GPU (the MIG one from the device series the enricher
# names for the pod on each instance): time-sliced and MPS replicas each get their own share,
# and Prometheus must scrape the enricher with honor_labels: true (as every install path here
# does). This file is the adapter's own config format (its --config file, the adapter-config
# ConfigMap of kube-prometheus); with the prometheus-community Helm chart, the list under
# `rules:` goes under the chart's `rules.custom`.
rules:
  - seriesQuery: 'gpu_container_utilization_ratio{{namespace!="",pod!=""}}'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
    name:
      matches: "^gpu_container_(.*)$"
      as: "gpu_pod_${{1}}"
    metricsQuery: 'sum by (<<.GroupBy>>) (<<.Series>>{{<<.LabelMatchers>>}})'
  - seriesQuery: 'gpu_container_memory_used_bytes{{namespace!="",pod!=""}}'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
    name:
      matches: "^gpu_container_(.*)$"
      as: "gpu_pod_${{1}}"
    metricsQuery: 'sum by (<<.GroupBy>>) (<<.Series>>{{<<.LabelMatchers>>}})'
  # Every name of the field, each a series of the same metric: the query reads the field
  # itself, not <<.Series>>, so either name's series answers for the pod.
  - seriesQuery: '{{__name__=~"{names}",namespace!="",pod!="",GPU_I_ID!=""}}'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
    name:
      matches: "^({names})$"
      as: "gpu_pod_mig_engine_active_ratio"
    # GPU_I_ID!="" again: a whole GPU's series names one pod even where several time-slice it.
    metricsQuery: 'sum by (<<.GroupBy>>) ({engine})'
"""


def render_adapter() -> str:
    """deploy/autoscaling/prometheus-adapter.yaml: ADAPTER_TEMPLATE with the MIG rule's field
    under every name the table gives it."""
    return ADAPTER_TEMPLATE.format(
        names=fieldquery.names_regex("gr_engine_active"),
        engine=fieldquery.read("gr_engine_active", "<<.LabelMatchers>>", 'GPU_I_ID!=""'),
    )


def _mixin_build() -> Any:
    """mixin/build.py, loaded once a process, so that every caller shares its cached builds."""
    if "mixin_build" not in sys.modules:
        spec = importlib.util.spec_from_file_location("mixin_build", ROOT / "mixin" / "build.py")
        assert spec is not None and spec.loader is not None
        sys.modules["mixin_build"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["mixin_build"])
    return sys.modules["mixin_build"]


def render_rules() -> str:
    """rules/dcgm-enricher.rules.yaml: the mixin's rules and alerts with the default _config."""
    return RULES_HEADER + str(_mixin_build().rule_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    parser.add_argument(
        "--runbook-url",
        metavar="URL",
        help="write the rules to standard output with runbook_url URL#<anchor> on every alert "
        "(URL: where docs/runbook.md is published for your users); nothing else is written",
    )
    args = parser.parse_args(argv)
    # The arguments are judged before the build, which takes seconds.
    if args.runbook_url is not None:
        if args.check:
            parser.error("--runbook-url and --check do not go together")
        try:
            base_url = check_runbook_url(args.runbook_url)
        except ValueError as exc:
            parser.error(str(exc))
    table_text = TABLE.read_text("utf-8")
    # The build reads the copy: a plain run brings it up to date first.
    if not args.check and args.runbook_url is None and _stale(MIXIN_TABLE, table_text):
        MIXIN_TABLE.write_text(table_text, encoding="utf-8")
    rules_text = render_rules()
    if args.runbook_url is not None:
        sys.stdout.write(render_with_runbook_urls(rules_text, base_url))
        return 0
    outputs = {
        MIXIN_TABLE: table_text,
        ADAPTER: render_adapter(),
        RULES: rules_text,
        PROMETHEUS_RULE: render(rules_text),
        RUNBOOK_COMPONENT: render_runbook_component(rules_text),
    }
    stale = [p for p, text in outputs.items() if _stale(p, text)]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python rules/generate.py", file=sys.stderr)
        return 1 if stale else 0
    # Only what changed: mixin/build.py keeps its builds while the mixin's files keep their
    # modification times, and the table's copy is one of them.
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[path], encoding="utf-8")
    return 0


def _stale(path: Path, text: str) -> bool:
    return not path.exists() or path.read_text("utf-8") != text


if __name__ == "__main__":
    sys.exit(main())
