"""The autoscaling recipes in deploy/autoscaling (docs/autoscaling.md), as each tool runs them.

- prometheus-adapter.yaml is checked against the adapter's config structs, strictly as the
  adapter loads it (yaml.UnmarshalStrict), and each rule is run the way the adapter runs it:
  its seriesQuery through /api/v1/series, its name mapping on the names found, its
  metricsQuery rendered as the adapter renders it for an HPA's pods (namespace matcher, then
  the pod names, grouped by pod).
- keda-scaledobject.yaml is checked against KEDA's ScaledObject CRD (the cloudcoil models
  generated from it), strictly, and each trigger's query is sent as KEDA's prometheus scaler
  sends it (GET /api/v1/query with query and time) and must be one number.
- A pod on two GPUs (two gpu_container_* series), which the demo lacks, is held to the sum
  of both by ``promtool test rules`` on the adapter's and KEDA's queries.
- hpa.yaml is checked against the Kubernetes API schema and must ask for the metrics the
  adapter serves, for the Deployment the ScaledObject scales.

A real Prometheus (2.42 and 3.5) scrapes the demo's real enricher, whose node is SIMULATED
(GPUs, NVML, dcgm-exporter, kubelet, pods: no GPU or cluster exists here) with its clock
stopped, so every answer can be held to the simulated node's truth: per pod, the sum of its
processes' SM time and memory as the simulated NVML reports them. The demo's inference
Deployments cover a time-sliced GPU (vllm and triton share GPU 1) and MPS (the two embedder
replicas share GPU 4); no adapter or KEDA binary exists here, so their query building is
reproduced from their source and said so.
"""

from __future__ import annotations

import datetime
import re
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from devkit.prometheus import EVERY_SECOND
from devkit.promtool import run as promtool_run
from enricher import demo
from enricher.attribution import is_mps_daemon
from enricher.fieldtable import table
from enricher.model import ProcessKind
from enricher.simnode.exporter import device_usage

from .frozendemo import T0, FrozenDemo
from .promreleases import PromRelease, Server, serve

pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "deploy" / "autoscaling"
ADAPTER = RECIPES / "prometheus-adapter.yaml"
KEDA = RECIPES / "keda-scaledobject.yaml"
HPA = RECIPES / "hpa.yaml"
HPA_MIG = RECIPES / "hpa-mig.yaml"
DEADLINE_SECONDS = 60
UTIL = "gpu_container_utilization_ratio"
MEMORY = "gpu_container_memory_used_bytes"
# The field the MIG rule reads (under every name the table gives it), and the name the demo
# writes it under.
MIG = "gr_engine_active"
MIG_ACTIVE = table().name(MIG, table().naming_of_release(demo.NEWEST))

# The adapter's discovery config (pkg/config/config.go: MetricsDiscoveryConfig, DiscoveryRule,
# RegexFilter, ResourceMapping, GroupResource, NameMapping, LabelValueReplacement), loaded with
# yaml.UnmarshalStrict: an unknown key anywhere is an error. The resourceRules and
# externalRules we do not ship are left out, so they are refused here too.
_STR = {"type": "string"}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["seriesQuery"],
    "properties": {
        "seriesQuery": _STR,
        "seriesFilters": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "maxProperties": 1,
                "properties": {"is": _STR, "isNot": _STR},
            },
        },
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "template": _STR,
                "overrides": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["resource"],
                        "properties": {"group": _STR, "resource": _STR},
                    },
                },
            },
        },
        "name": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"matches": _STR, "as": _STR},
        },
        "metricsQuery": _STR,
        "labelValueReplacements": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"find": _STR, "replace": _STR},
            },
        },
    },
}
ADAPTER_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["rules"],
    "properties": {"rules": {"type": "array", "minItems": 1, "items": _RULE}},
}
# The fields the adapter's metricsQuery template may use (pkg/naming/metrics_query.go,
# queryTemplateArgs); the recipes use the three string ones.
_TEMPLATE_FIELD = re.compile(r"<<\s*\.(\w+)\s*>>")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def series_of(rule: Mapping[str, Any]) -> str:
    """The metric name a rule's seriesQuery selects (its leading name), or the field of
    dcgm-exporter's whose every name it selects (a ``__name__`` regex)."""
    m = re.match(r'^(\w+)|^\{__name__=~"([\w|]+)"', rule["seriesQuery"])
    assert m, rule
    if m[1]:
        return m[1]
    names = m[2].split("|")
    fields = {found.field for n in names if (found := table().lookup(n))}
    assert len(fields) == 1 and set(names) == set(table().names(*fields)), rule
    return fields.pop()


def go_quote(value: str) -> str:
    """Go's %q for the label values the adapter writes (names of pods and namespaces)."""
    assert re.fullmatch(r"[a-z0-9.|-]+", value), value
    return f'"{value}"'


def adapter_query(template: str, series: str, namespace: str, pods: list[str]) -> str:
    """The PromQL the adapter's metricsQuery.Build sends for a Pods metric of ``pods`` in
    ``namespace`` (the pod resource's label is `pod`, the namespace's `namespace`): the
    namespace matcher, then the pod names (`=` for one, `=~` joined by `|` for several),
    grouped by the pod label."""
    pod_matcher = (
        f"pod={go_quote(pods[0])}" if len(pods) == 1 else f"pod=~{go_quote('|'.join(pods))}"
    )
    args = {
        "Series": series,
        "LabelMatchers": f"namespace={go_quote(namespace)},{pod_matcher}",
        "GroupBy": "pod",
    }

    def field(m: re.Match[str]) -> str:
        assert m.group(1) in args, f"the recipe uses a template field we do not render: {m[0]}"
        return args[m.group(1)]

    rendered = _TEMPLATE_FIELD.sub(field, template)
    assert "<<" not in rendered and ">>" not in rendered, rendered
    return rendered


def adapter_name(name: Mapping[str, str], series: str) -> str | None:
    """The custom metric name the adapter's NameMapping gives ``series`` (Go's ${n} and $n)."""
    m = re.search(name.get("matches") or ".*", series)
    if m is None:
        return None
    default = "$1" if m.re.groups == 1 else "$0"
    as_ = name.get("as") or default
    return re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g.group(1))) or "", as_)


def gpu_rules() -> list[dict[str, Any]]:
    """The adapter's rules on the enricher's per-container series (not the MIG rule)."""
    return [r for r in load(ADAPTER)["rules"] if series_of(r) in (UTIL, MEMORY)]


# --------------------------------------------------------------------------- the demo's truth


@dataclass(frozen=True)
class Deployment:
    namespace: str
    name: str
    pods: tuple[str, ...]


def deployments() -> list[Deployment]:
    """The demo's Deployments: pods owned by a ReplicaSet named <deployment>-<template hash>."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pod in demo.PODS:
        hash_ = dict(pod.labels).get("pod-template-hash")
        if pod.owner and pod.owner[0] == "ReplicaSet" and hash_:
            found[(pod.namespace, pod.owner[1].removesuffix(f"-{hash_}"))].append(pod.name)
    return [Deployment(ns, name, tuple(sorted(p))) for (ns, name), p in sorted(found.items())]


def truth() -> dict[str, dict[tuple[str, str], float]]:
    """Per metric and (namespace, pod): what the SIMULATED NVML reports for the pod's
    processes at T0, summed (the MPS server holds memory for its clients: no pod's)."""
    owner = {p.pid: p.pod for p in demo.PROCS}
    comm = {p.pid: p.comm for p in demo.PROCS}
    out: dict[str, dict[tuple[str, str], float]] = {UTIL: defaultdict(float), MEMORY: {}}
    memory: dict[tuple[str, str], float] = defaultdict(float)
    for proc in demo.demo_gpus(lambda: T0).fetch().processes:
        pod = owner[proc.pid]
        if pod is None or is_mps_daemon(comm[proc.pid]):
            continue
        key = (pod.namespace, pod.name)
        memory[key] += proc.used_memory_bytes or 0
        if proc.sm_util_ratio is not None:
            out[UTIL][key] += proc.sm_util_ratio
    out[MEMORY] = dict(memory)
    out[UTIL] = dict(out[UTIL])
    return out


def mig_pods() -> list[tuple[demo.SimPod, tuple[int, int]]]:
    """The demo's pods with a process on a MIG instance, and that instance (GPU, GPU_I_ID)."""
    return sorted(
        {(p.pod, (p.gpu, p.gi)) for p in demo.PROCS if p.pod is not None and p.gi is not None},
        key=lambda item: item[0].name,
    )


def test_the_demo_has_a_time_sliced_and_an_mps_deployment() -> None:
    """The cases the recipes must get right are in the demo: two Deployments' pods sharing one
    GPU by time-slicing, and one Deployment's two replicas sharing one by MPS."""
    found = {(d.namespace, d.name): d.pods for d in deployments()}
    assert set(found) == {("inference", "vllm"), ("inference", "triton"), ("search", "embedder")}
    assert len(found[("search", "embedder")]) == 2
    kinds = {p.pod.name: p.kind for p in demo.PROCS if p.pod is not None}
    assert all(kinds[pod] is ProcessKind.MPS for pod in found[("search", "embedder")])
    gpus = {p.pod.name: p.gpu for p in demo.PROCS if p.pod is not None}
    assert gpus[found[("inference", "vllm")][0]] == gpus[found[("inference", "triton")][0]]


# --------------------------------------------------------------------------- the files alone


def test_adapter_config_loads_as_the_adapter_loads_it() -> None:
    config = load(ADAPTER)
    jsonschema.Draft202012Validator(ADAPTER_SCHEMA).validate(config)
    for rule in config["rules"]:
        assert set(_TEMPLATE_FIELD.findall(rule["metricsQuery"])) <= {
            "Series",
            "LabelMatchers",
            "GroupBy",
        }
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }


@pytest.mark.parametrize(
    "broken",
    [
        {"rules": [{"seriesQuery": "x", "metricQuery": "x"}]},  # a misspelt key
        {"rules": [{"seriesQuery": "x", "resources": {"overrides": {"pod": {"kind": "pod"}}}}]},
        {"rules": [], "resourceRule": {}},
    ],
)
def test_the_adapter_schema_refuses_what_the_adapter_refuses(broken: dict[str, Any]) -> None:
    assert list(jsonschema.Draft202012Validator(ADAPTER_SCHEMA).iter_errors(broken))


def _unknown_keys(model: Any, value: Any, path: str) -> list[str]:
    """Keys of ``value`` that the pydantic model (or the models in its field types) does not
    declare: the CRD's structural schema prunes or refuses them, the models only allow them."""
    from pydantic import BaseModel

    if isinstance(value, list):
        return [e for i, v in enumerate(value) for e in _unknown_keys(model, v, f"{path}[{i}]")]
    if not (isinstance(value, dict) and isinstance(model, type) and issubclass(model, BaseModel)):
        return []
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    errors = []
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}")
            continue
        for inner in _model_types(fields[key].annotation):
            errors += _unknown_keys(inner, item, f"{path}.{key}")
    return errors


def _model_types(annotation: Any) -> Iterator[Any]:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _model_types(arg)


def scaled_object_errors(doc: dict[str, Any]) -> list[str]:
    """Violations of KEDA's ScaledObject CRD (keda.sh/v1alpha1), through the models cloudcoil
    generates from it: types and required fields by pydantic, unknown keys by _unknown_keys."""
    from cloudcoil.models.keda.v1alpha1 import ScaledObject
    from pydantic import ValidationError

    try:
        ScaledObject.model_validate(doc)
    except ValidationError as exc:
        return [str(exc)]
    return _unknown_keys(ScaledObject, {k: v for k, v in doc.items()}, "")


def test_scaled_object_matches_kedas_crd() -> None:
    doc = load(KEDA)
    assert scaled_object_errors(doc) == []
    triggers = doc["spec"]["triggers"]
    assert [t["type"] for t in triggers] == ["prometheus", "prometheus"]
    for trigger in triggers:
        float(trigger["metadata"]["threshold"])  # KEDA parses it as a float


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "scaleTargetRef"), {"nmae": "vllm"}),  # a misspelt key
        (("spec", "minReplicaCount"), "one"),
        (("spec", "triggers"), [{"metadata": {}}]),  # a trigger without its type
    ],
)
def test_the_crd_check_refuses_a_broken_scaled_object(path: tuple[str, ...], value: Any) -> None:
    doc = load(KEDA)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert scaled_object_errors(doc)


@pytest.mark.parametrize("k8s_version", ["1.32.0", "1.37.0"])
def test_hpa_matches_the_kubernetes_schema(k8s_version: str) -> None:
    import kubernetes_validate

    for path in (HPA, HPA_MIG):
        kubernetes_validate.validate(load(path), k8s_version, strict=True)


def test_mig_hpa_asks_only_for_what_a_mig_pod_has() -> None:
    """hpa-mig.yaml asks for the MIG rule's metric alone: never the SM time a MIG pod never
    has (an HPA missing one of its metrics never scales down), for one of the demo's
    StatefulSets on MIG instances."""
    hpa = load(HPA_MIG)
    (rule,) = [r for r in load(ADAPTER)["rules"] if series_of(r) == MIG]
    asked = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert asked == ["gpu_pod_mig_engine_active_ratio"]
    # Every name of the field is the same metric.
    assert {adapter_name(rule["name"], n) for n in table().names(MIG)} == set(asked)
    target = hpa["spec"]["scaleTargetRef"]
    assert (hpa["metadata"]["namespace"], target["kind"], target["name"]) in {
        (p.namespace, p.owner[0], p.owner[1]) for p, _ in mig_pods() if p.owner
    }


def test_hpa_and_scaled_object_scale_the_same_deployment_on_the_adapters_metrics() -> None:
    hpa, scaled = load(HPA), load(KEDA)
    assert [series_of(r) for r in load(ADAPTER)["rules"]] == [UTIL, MEMORY, MIG]
    assert hpa["metadata"]["namespace"] == scaled["metadata"]["namespace"]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert hpa["spec"]["scaleTargetRef"]["name"] == scaled["spec"]["scaleTargetRef"]["name"]
    served = {
        adapter_name(rule["name"], series)
        for rule in load(ADAPTER)["rules"]
        for series in (UTIL, MEMORY)
        if series_of(rule) == series
    }
    asked = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert asked == served == {"gpu_pod_utilization_ratio", "gpu_pod_memory_used_bytes"}


# --------------------------------------------------------------------------- a real Prometheus


@dataclass
class Stack:
    server: Server

    def keda(self, query: str) -> list[dict[str, Any]]:
        """The query as KEDA's prometheus scaler sends it: query and an RFC 3339 time."""
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        result: list[dict[str, Any]] = self.server.api("query", query=query, time=now)["result"]
        return result

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.server.query(promql)

    def series(self, selector: str) -> list[dict[str, str]]:
        found: list[dict[str, str]] = self.server.api("series", **{"match[]": selector})
        return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prom_release: PromRelease) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp(f"autoscaling-{prom_release.id}")
    frozen = FrozenDemo(tmp / "demo")
    config = {
        "global": EVERY_SECOND,
        "scrape_configs": [frozen.scrape_job()],
    }
    try:
        with serve(prom_release, config, tmp / "prometheus") as server:
            built = Stack(server)
            deadline = time.monotonic() + DEADLINE_SECONDS
            scraped = 'count_over_time(up{job="dcgm-enricher"}[1m]) >= 2'
            while not (built.query(scraped) and built.query(f"count({MEMORY})")):
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.5)
            yield built
    finally:
        frozen.close()


def values_by_pod(result: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample in result:
        pod = sample["metric"]["pod"]
        assert pod not in out, f"two values for {pod}: {result}"
        out[pod] = float(sample["value"][1])
    return out


def test_adapter_discovers_the_metrics_on_workload_pods(stack: Stack) -> None:
    """Each rule's seriesQuery finds series that name the workloads' pods (never the
    enricher's own), and its name mapping gives the names the HPA asks for."""
    names = set()
    workloads = {(p.namespace, p.name) for p in demo.PODS}
    for rule in load(ADAPTER)["rules"]:
        found = stack.series(rule["seriesQuery"])
        assert found, rule["seriesQuery"]
        for series in found:
            assert (series["namespace"], series["pod"]) in workloads, series
            names.add(adapter_name(rule["name"], series["__name__"]))
    assert names == {
        "gpu_pod_utilization_ratio",
        "gpu_pod_memory_used_bytes",
        "gpu_pod_mig_engine_active_ratio",
    }


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d.name)
def test_adapter_gives_each_pod_its_own_value(stack: Stack, deployment: Deployment) -> None:
    """The metricsQuery of each rule, rendered as the adapter renders it for the HPA of
    ``deployment`` (all its pods), returns one value per pod: the simulated node's truth."""
    real = truth()
    for rule in gpu_rules():
        series = series_of(rule)
        promql = adapter_query(
            rule["metricsQuery"], series, deployment.namespace, list(deployment.pods)
        )
        got = values_by_pod(stack.query(promql))
        expected = {pod: real[series][(deployment.namespace, pod)] for pod in deployment.pods}
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-9), promql


def keda_query_for(query: str, deployment: Deployment) -> str:
    """The shipped query with the shipped Deployment (inference/vllm) replaced by another."""
    return query.replace('"inference"', f'"{deployment.namespace}"').replace(
        'workload_name="vllm"', f'workload_name="{deployment.name}"'
    )


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d.name)
def test_keda_gets_one_number_the_sum_of_the_pods(stack: Stack, deployment: Deployment) -> None:
    """Each trigger's query, sent as KEDA sends it, is one number for the Deployment (KEDA
    refuses several): the sum over its pods of the truth, which KEDA divides by the replicas.
    Without the outer sum it is one value per pod, the same as the adapter's."""
    real = truth()
    triggers = load(KEDA)["spec"]["triggers"]
    for trigger, series in zip(triggers, (UTIL, MEMORY), strict=True):
        query = keda_query_for(trigger["metadata"]["query"], deployment)
        assert series in query
        expected = {pod: real[series][(deployment.namespace, pod)] for pod in deployment.pods}
        result = stack.keda(query)
        assert len(result) == 1, result
        assert float(result[0]["value"][1]) == pytest.approx(sum(expected.values()), rel=1e-9)
        inner = re.fullmatch(r"\s*sum\(\s*(.*)\s*\)\s*", query, re.S)
        assert inner, query
        per_pod = values_by_pod(stack.query(inner.group(1)))
        assert per_pod == pytest.approx(expected, rel=1e-9, abs=1e-9)


# --------------------------------------------------------------------------- a pod on two GPUs

# The demo gives every pod one gpu_container_* series per metric, where sum and max agree; a
# pod on two GPUs has two series (gpu and UUID apart), and each recipe must add them up (the
# adapter's header: "a pod with two busy GPUs reports 2"). Exact binary fractions, so that
# promtool's comparison is exact. vllm-two-gpus and vllm-one-gpu are the shipped Deployment's
# (inference/vllm); triton-0, on the same node and namespace, is another Deployment's.
TWO_GPU_PODS = {
    # pod: (workload, [(gpu, SM ratio, memory bytes) per GPU])
    "vllm-two-gpus": ("vllm", [("0", 0.25, 3 << 30), ("1", 0.5, 5 << 30)]),
    "vllm-one-gpu": ("vllm", [("2", 0.125, 2 << 30)]),
    "triton-0": ("triton", [("3", 0.5, 7 << 30)]),
}


def _two_gpu_series() -> list[dict[str, str]]:
    out = []
    for pod, (workload, gpus) in TWO_GPU_PODS.items():
        for gpu, util, memory in gpus:
            labels = (
                f'Hostname="node-a",UUID="GPU-{gpu}",gpu="{gpu}",'
                f'namespace="inference",pod="{pod}",container="server"'
            )
            out.append({"series": f"{UTIL}{{{labels}}}", "values": f"{util}x10"})
            out.append({"series": f"{MEMORY}{{{labels}}}", "values": f"{memory}x10"})
        info = (
            f'gpu_pod_info{{namespace="inference",pod="{pod}",'
            f'workload_kind="Deployment",workload_name="{workload}"}}'
        )
        out.append({"series": info, "values": "1x10"})
    return out


def _expected(series: str, labels: str, value: float) -> dict[str, Any]:
    return {"labels": labels, "value": int(value) if series == MEMORY else value}


def test_recipes_add_up_a_pod_on_two_gpus(promtool: str, tmp_path: Path) -> None:
    """The adapter's metricsQuery (for the vllm HPA's two pods) and each KEDA query, outer and
    per pod, on a pod holding two GPUs: its value is the sum over both (a ``max`` would give
    the larger GPU's alone), by ``promtool test rules`` with input series (no rule file)."""
    pods = sorted(p for p, (workload, _) in TWO_GPU_PODS.items() if workload == "vllm")
    per_pod = {
        series: {pod: sum(gpu[index] for gpu in TWO_GPU_PODS[pod][1]) for pod in pods}
        for series, index in ((UTIL, 1), (MEMORY, 2))
    }
    assert per_pod[UTIL]["vllm-two-gpus"] == 0.75  # not 0.5, as max by would say
    cases: list[dict[str, Any]] = []
    for rule in gpu_rules():
        series = series_of(rule)
        cases.append(
            {
                "expr": adapter_query(rule["metricsQuery"], series, "inference", pods),
                "eval_time": "5m",
                "exp_samples": [
                    _expected(series, f'{{pod="{pod}"}}', per_pod[series][pod]) for pod in pods
                ],
            }
        )
    for trigger, series in zip(load(KEDA)["spec"]["triggers"], (UTIL, MEMORY), strict=True):
        query = trigger["metadata"]["query"]
        inner = re.fullmatch(r"\s*sum\(\s*(.*)\s*\)\s*", query, re.S)
        assert inner, query
        cases.append(
            {
                "expr": query,
                "eval_time": "5m",
                "exp_samples": [_expected(series, "{}", sum(per_pod[series].values()))],
            }
        )
        cases.append(
            {
                "expr": inner.group(1),
                "eval_time": "5m",
                "exp_samples": [
                    _expected(
                        series,
                        f'{{namespace="inference", pod="{pod}"}}',
                        per_pod[series][pod],
                    )
                    for pod in pods
                ],
            }
        )
    unit = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "a pod on two GPUs",
                "interval": "1m",
                "input_series": _two_gpu_series(),
                "promql_expr_test": cases,
            }
        ],
    }
    (tmp_path / "two-gpus.tests.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = promtool_run(promtool, "test", "rules", "two-gpus.tests.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- MIG


def test_mig_rule_gives_each_mig_pod_its_instances_activity(stack: Stack) -> None:
    """The MIG rule's metricsQuery, rendered as the adapter renders it for each MIG pod (the
    demo's StatefulSets bert-finetune and eval-harness, and the DRA pod dra-whisper-0), is
    one value per pod: the simulated activity of its instance. The SM-time rule that hpa.yaml
    asks for has nothing for them: the reason hpa-mig.yaml exists."""
    (rule,) = [r for r in load(ADAPTER)["rules"] if series_of(r) == MIG]
    (util_rule,) = [r for r in gpu_rules() if series_of(r) == UTIL]
    _, busy = device_usage(demo.demo_gpus(lambda: T0), T0, demo.UNLISTED_MIB)
    found = mig_pods()
    assert {p.name for p, _ in found} >= {"bert-finetune-0", "eval-harness-0"}
    for pod, instance in found:
        promql = adapter_query(rule["metricsQuery"], MIG_ACTIVE, pod.namespace, [pod.name])
        got = values_by_pod(stack.query(promql))
        assert got == pytest.approx({pod.name: busy[instance]}, abs=1e-6), promql
        assert 0 < got[pod.name] <= 1
        util = adapter_query(util_rule["metricsQuery"], UTIL, pod.namespace, [pod.name])
        assert stack.query(util) == [], util
    # A whole GPU's device series names one pod of the two that time-slice it: never served.
    vllm = next(d for d in deployments() if d.name == "vllm")
    promql = adapter_query(rule["metricsQuery"], MIG_ACTIVE, vllm.namespace, list(vllm.pods))
    assert stack.query(promql) == []


def test_mig_rule_reads_every_naming_of_the_field(promtool: str, tmp_path: Path) -> None:
    """The MIG rule gives a pod its instances' activity whatever dcgm-exporter release writes
    it: a pod on two nodes' instances, one node on the oldest naming and one on the newest,
    gets their sum; a pod whose node was upgraded gets its one instance's value once. Its
    seriesQuery finds the series of both namings."""
    (rule,) = [r for r in load(ADAPTER)["rules"] if series_of(r) == MIG]
    oldest, newest = (table().name(MIG, n) for n in (table().namings[0], table().namings[-1]))
    assert oldest != newest

    def series(name: str, node: str, pod: str, values: str) -> dict[str, str]:
        labels = f'node="{node}",gpu="0",GPU_I_ID="1",namespace="research",pod="{pod}"'
        return {"series": f"{name}{{{labels}}}", "values": values}

    unit = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "the MIG rule on every naming",
                "interval": "1m",
                "input_series": [
                    series(oldest, "node-old", "bert-0", "0.25x10"),
                    series(newest, "node-new", "bert-0", "0.5x10"),
                    # Upgraded at 5m: the old name stale from there, the new one on.
                    series(oldest, "node-up", "eval-0", "0.125x4 stale"),
                    series(newest, "node-up", "eval-0", "_x5 0.125x5"),
                ],
                "promql_expr_test": [
                    {
                        "expr": adapter_query(
                            rule["metricsQuery"], newest, "research", ["bert-0", "eval-0"]
                        ),
                        "eval_time": t,
                        "exp_samples": [
                            {"labels": '{pod="bert-0"}', "value": 0.75},
                            {"labels": '{pod="eval-0"}', "value": 0.125},
                        ],
                    }
                    for t in ("2m", "7m")
                ],
            }
        ],
    }
    (tmp_path / "mig.tests.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = promtool_run(promtool, "test", "rules", "mig.tests.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    named = re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"])
    assert named and {oldest, newest} <= set(named[1].split("|"))
