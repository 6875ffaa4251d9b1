"""GpuEnricherDown and GpuEnricherAbsent work for every install: any release name, any namespace,
ServiceMonitor or PodMonitor, Helm or kustomize, or the plain scrape config.

Real parts: Helm renders the chart and ``kubectl kustomize`` builds the overlays; the real
Prometheus (2.42 and 3.5) scrapes with the scrape configuration that the Prometheus Operator
would write for each rendered monitor and loads the real rules file; promtool runs the rules
over the ``up`` series that Prometheus wrote. Stand-ins, for what cannot exist here: no
cluster and no Operator, so this file writes the Operator's scrape job for a monitor the way the
Operator does (its selection, its target labels, its job name: the Service's name for a
ServiceMonitor, ``<namespace>/<name>`` for a PodMonitor; then the monitor's own relabelings),
with static targets carrying the ``__meta_kubernetes_*`` labels that discovery would give the
rendered Service and DaemonSet pods. Each pod's address is a live stand-in ``/metrics`` (a
real enricher's golden output, served over HTTP) or a dead port.

The rules' ``for:`` are minutes: the live Prometheus is checked for the alerts' pending state
(the expression holds, the rules are not edited), and promtool checks each install's timing
to firing with the real ``for:`` on the series the live Prometheus recorded.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.ports import closed_port
from devkit.prometheus import EVERY_SECOND
from devkit.upstream import TextServer

from .conftest import GOLDEN
from .helmreleases import releases as helm_releases
from .helmreleases import require as require_helm
from .promreleases import PromRelease, Server, serve
from .test_manifests import (
    MANIFESTS,
    SCRAPE_CONFIG,
    build,
    edited_overlay,
    kustomize,
    of_kind,
    selects,
)

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "dcgm-enricher"
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
RELEASE_NAMES = ("dcgm-enricher", "gpu", "team-a")
NAMESPACES = ("gpu-monitoring", "monitoring")
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor")
# A user's relabelings, one of which tries to set job: the chart's own comes after them.
USER_RELABELINGS = [
    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
    {"targetLabel": "job", "replacement": "my-gpu-job"},
]
DOWN, ABSENT = "GpuEnricherDown", "GpuEnricherAbsent"
DEADLINE_SECONDS = 45
Doc = dict[str, Any]


# --------------------------------------------------------------------------- installs


@dataclass
class Install:
    """One way a user installs and scrapes the enricher: its rendered objects, and in each
    scenario the stand-in address of each of its pods."""

    name: str
    docs: tuple[Doc, ...]
    plain: bool = False  # scraped by manifests/prometheus/scrape-config.yaml
    # The monitor without the shipped job relabeling (as before it existed): the alerts
    # must not see it, which shows that the Operator's job names below are what they are.
    control: bool = False
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> address, per scenario


def strip_job_relabeling(docs: tuple[Doc, ...]) -> tuple[Doc, ...]:
    """``docs`` with each monitor's relabelings that set ``job`` removed."""
    out = copy.deepcopy(docs)
    for monitor in of_kind(out, "ServiceMonitor", "PodMonitor"):
        spec = monitor["spec"]
        for endpoint in spec.get("endpoints", []) + spec.get("podMetricsEndpoints", []):
            endpoint["relabelings"] = [
                r for r in endpoint.get("relabelings", []) if r.get("targetLabel") != "job"
            ]
    return out


@functools.cache
def helm_render(release: str, namespace: str, *values: str) -> tuple[Doc, ...]:
    """The chart's objects for one release, with every Helm release; they must agree."""
    rendered = []
    for helm in helm_releases():
        require_helm(helm)
        proc = subprocess.run(
            [helm.helm, "template", release, str(CHART), "-n", namespace, *values],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        rendered.append(tuple(d for d in yaml.safe_load_all(proc.stdout) if d))
    assert all(r == rendered[0] for r in rendered), "Helm 3 and Helm 4 render differently"
    return rendered[0]


def chart_installs() -> list[Install]:
    installs = []
    for release in RELEASE_NAMES:
        for namespace in NAMESPACES:
            for kind in MONITOR_KINDS:
                docs = helm_render(release, namespace, "--set", f"monitor.kind={kind}")
                installs.append(Install(f"helm {release} -n {namespace} {kind}", docs))
    relabeled = helm_render(
        "gpu",
        "monitoring",
        "--set",
        "monitor.kind=PodMonitor",
        "--set-json",
        f"monitor.relabelings={json.dumps(USER_RELABELINGS)}",
    )
    installs.append(Install("helm gpu -n monitoring PodMonitor monitor.relabelings", relabeled))
    for kind in MONITOR_KINDS:
        docs = helm_render("gpu", "monitoring", "--set", f"monitor.kind={kind}")
        installs.append(
            Install(
                f"control: helm gpu {kind} without the job relabeling",
                strip_job_relabeling(docs),
                control=True,
            )
        )
    return installs


def kustomize_installs(tmp: Path) -> list[Install]:
    swapped = edited_overlay(
        tmp / "podmonitor",
        "overlays/sidecar",
        "- ../../components/servicemonitor",
        "- ../../components/podmonitor",
    )
    # A user's overlay over the sidecar one, with names and a namespace of its own.
    copy_root = tmp / "prefixed" / "manifests"
    shutil.copytree(MANIFESTS, copy_root)
    overlay = copy_root / "overlays" / "team"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namePrefix": "team-",
                "namespace": "ml-gpu",
                "resources": ["../sidecar"],
            }
        )
    )
    return [
        Install("kustomize overlays/sidecar", build("overlays/sidecar")),
        Install("kustomize overlays/sidecar with components/podmonitor", swapped),
        Install("kustomize overlays/gpu-operator", build("overlays/gpu-operator")),
        Install("kustomize namePrefix team- namespace ml-gpu", kustomize(overlay)),
        Install("manifests/prometheus/scrape-config.yaml", build("overlays/sidecar"), plain=True),
    ]


@pytest.fixture(scope="module")
def installs(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> list[Install]:
    """Every install; kubectl (fails in CI, skips elsewhere when missing) builds the overlays."""
    return chart_installs() + kustomize_installs(tmp_path_factory.mktemp("overlays"))


# --------------------------------------------------------------------------- the Operator's job


def sanitize(name: str) -> str:
    """A Kubernetes label name as a Prometheus label name (what discovery does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabel_config(r: Doc) -> Doc:
    """A monitor's RelabelConfig (camelCase) as Prometheus's relabel_config."""
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "modulus": "modulus",
        "replacement": "replacement",
        "action": "action",
    }
    out = {names[k]: v for k, v in r.items()}
    if "action" in out:
        out["action"] = out["action"].lower()
    return out


def keep_selected(prefix: str, match_labels: dict[str, str]) -> list[Doc]:
    """The Operator's keep rules for a monitor's label selector."""
    return [
        {
            "action": "keep",
            "source_labels": [
                f"{prefix}_label_{sanitize(k)}",
                f"{prefix}_labelpresent_{sanitize(k)}",
            ],
            "regex": f"({v});true",
        }
        for k, v in sorted(match_labels.items())
    ]


def label_meta(prefix: str, labels: dict[str, str]) -> dict[str, str]:
    meta = {f"{prefix}_label_{sanitize(k)}": v for k, v in labels.items()}
    meta |= {f"{prefix}_labelpresent_{sanitize(k)}": "true" for k in labels}
    return meta


def pod_targets(workload: Doc, pods: dict[str, str]) -> list[dict[str, str]]:
    """Discovery's view of ``workload``'s pods: one target per container port of each pod,
    at the pod's stand-in address (a pod IP has one address for every port)."""
    template = workload["spec"]["template"]
    namespace = workload["metadata"]["namespace"]
    targets = []
    for pod, address in pods.items():
        for container in template["spec"]["containers"]:
            for port in container.get("ports", []):
                targets.append(
                    {
                        "__address__": address,
                        "__meta_kubernetes_namespace": namespace,
                        "__meta_kubernetes_pod_name": pod,
                        "__meta_kubernetes_pod_node_name": f"node-{pod}",
                        "__meta_kubernetes_pod_phase": "Running",
                        "__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                        **label_meta("__meta_kubernetes_pod", template["metadata"]["labels"]),
                    }
                )
    return targets


def endpoint_targets(service: Doc, workload: Doc, pods: dict[str, str]) -> list[dict[str, str]]:
    """Endpoints discovery of ``service``: its ports on the pods it selects."""
    if not selects(
        service["spec"].get("selector"), workload["spec"]["template"]["metadata"]["labels"]
    ):
        return []
    targets = []
    for port in service["spec"]["ports"]:
        target_port = port.get("targetPort", port["port"])
        for t in pod_targets(workload, pods):
            if target_port in (
                t["__meta_kubernetes_pod_container_port_name"],
                int(t["__meta_kubernetes_pod_container_port_number"]),
            ):
                targets.append(
                    {
                        **t,
                        "__meta_kubernetes_service_name": service["metadata"]["name"],
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        **label_meta(
                            "__meta_kubernetes_service", service["metadata"].get("labels", {})
                        ),
                    }
                )
    return targets


def static(targets: list[dict[str, str]]) -> list[Doc]:
    return [
        {
            "targets": [t["__address__"]],
            "labels": {k: v for k, v in t.items() if k != "__address__"},
        }
        for t in targets
    ]


def operator_job(monitor: Doc, docs: tuple[Doc, ...], pods: dict[str, str]) -> Doc:
    """The scrape job the Prometheus Operator writes for one monitor's (only) endpoint:
    selection, target labels, its job name, then the monitor's relabelings."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    namespace = meta["namespace"]
    (workload,) = of_kind(docs, "DaemonSet")
    # Discovery watches the monitor's own namespace (no namespaceSelector in ours).
    assert "namespaceSelector" not in spec
    meta_k8s = "__meta_kubernetes"
    if kind == "ServiceMonitor":
        (endpoint,) = spec["endpoints"]
        services = [s for s in of_kind(docs, "Service") if s["metadata"]["namespace"] == namespace]
        targets = [t for s in services for t in endpoint_targets(s, workload, pods)]
        prefix = f"{meta_k8s}_service"
        port_label = f"{meta_k8s}_endpoint_port_name"
        copies = {"namespace": "namespace", "service": "service_name", "pod": "pod_name"}
        job = {"source_labels": [f"{meta_k8s}_service_name"], "replacement": "${1}"}
    else:
        (endpoint,) = spec["podMetricsEndpoints"]
        in_namespace = workload["metadata"]["namespace"] == namespace
        targets = pod_targets(workload, pods) if in_namespace else []
        prefix = f"{meta_k8s}_pod"
        port_label = f"{meta_k8s}_pod_container_port_name"
        copies = {"namespace": "namespace", "pod": "pod_name"}
        job = {"replacement": f"{namespace}/{meta['name']}"}
    copies["container"] = "pod_container_name"
    relabel = [
        *keep_selected(prefix, spec["selector"]["matchLabels"]),
        {"action": "keep", "source_labels": [port_label], "regex": endpoint["port"]},
        *(
            {"source_labels": [f"{meta_k8s}_{source}"], "target_label": target}
            for target, source in copies.items()
        ),
        {**job, "target_label": "job"},
    ]
    if "jobLabel" in spec:
        relabel.append(
            {
                "source_labels": [f"{prefix}_label_{sanitize(spec['jobLabel'])}"],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    relabel += [relabel_config(r) for r in endpoint.get("relabelings", [])]
    return {
        "job_name": f"{kind.lower()[0]}{kind[1:]}/{namespace}/{meta['name']}/0",
        "honor_labels": endpoint.get("honorLabels", False),
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": static(targets),
        "relabel_configs": relabel,
    }


def plain_job(docs: tuple[Doc, ...], pods: dict[str, str]) -> Doc:
    """manifests/prometheus/scrape-config.yaml's job as written, its pod discovery (a label
    selector) done here on the rendered DaemonSet's pods."""
    (shipped,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    job: Doc = copy.deepcopy(shipped)
    (sd,) = job.pop("kubernetes_sd_configs")
    (selector,) = sd["selectors"]
    key, _, value = selector["label"].partition("=")
    (workload,) = of_kind(docs, "DaemonSet")
    chosen = selects({key: value}, workload["spec"]["template"]["metadata"]["labels"])
    job["static_configs"] = static(pod_targets(workload, pods) if chosen else [])
    return job


def scrape_jobs(install: Install) -> list[Doc]:
    if install.plain:
        return [plain_job(install.docs, install.pods)]
    monitors = of_kind(install.docs, "ServiceMonitor", "PodMonitor")
    assert len(monitors) == 1, install.name
    return [operator_job(monitors[0], install.docs, install.pods)]


def prometheus_config(installs: list[Install]) -> Doc:
    jobs = []
    for n, install in enumerate(installs):
        for job in scrape_jobs(install):
            if not install.plain:
                # One Prometheus scrapes installs that no one cluster could hold side by side
                # (same namespace and name): the scrape pools need names of their own. The
                # Operator's name is only the pool's; its relabeling writes the job label.
                job["job_name"] += f"/install-{n}"
            jobs.append(job)
    for job in jobs:
        # The monitors scrape every 30 s; every second here, so that the test is quick.
        job["scrape_interval"] = job["scrape_timeout"] = "1s"
    return {
        "global": EVERY_SECOND,
        "rule_files": [str(RULES)],
        "scrape_configs": jobs,
    }


# --------------------------------------------------------------------------- the scenarios


@dataclass
class Scenario:
    """One Prometheus: the installs it scrapes and what each pod's address is."""

    name: str
    installs: list[Install]
    live: set[str]  # addresses that serve /metrics
    dead: set[str]  # addresses nobody listens on
    server: Server | None = None


def state_of(server: Server) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """``{instance: its up labels}`` and ``{instance: up}`` of every target scraped."""
    result = server.query("up")
    labels = {
        r["metric"]["instance"]: {k: v for k, v in r["metric"].items() if k != "__name__"}
        for r in result
    }
    return labels, {r["metric"]["instance"]: r["value"][1] for r in result}


def evaluated_since(server: Server, since: float) -> bool:
    """Every rule group has been evaluated after ``since`` (a Unix time)."""
    groups = server.api("rules")["groups"]
    for group in groups:
        # RFC 3339 with up to nanoseconds: microseconds are precise enough here.
        stamp = re.sub(r"(\.\d{6})\d*", r"\1", group["lastEvaluation"]).replace("Z", "+00:00")
        if datetime.datetime.fromisoformat(stamp).timestamp() <= since:
            return False
    return bool(groups)


def our_alerts(server: Server) -> list[Doc]:
    return [a for a in server.alerts() if a["labels"]["alertname"] in (DOWN, ABSENT)]


@dataclass
class Run:
    """What one Prometheus showed once every target had been scraped and the rules run."""

    scenario: Scenario
    up: dict[str, dict[str, str]]  # instance -> the labels of its up series
    values: dict[str, str]  # instance -> up
    alerts: list[Doc]
    log: str


def settle(scenario: Scenario) -> Run:
    """Wait until every address was scraped, then until the rules have run after that."""
    server = scenario.server
    assert server is not None
    want = scenario.live | scenario.dead
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not want <= set(state_of(server)[0]):
        if time.monotonic() > deadline:
            pytest.fail(f"{scenario.name}: not every target was scraped\n{server.log_tail()}")
        time.sleep(0.5)
    scraped = time.time()
    while not evaluated_since(server, scraped + 1):
        if time.monotonic() > deadline:
            pytest.fail(f"{scenario.name}: the rules were not evaluated\n{server.log_tail()}")
        time.sleep(0.5)
    up, values = state_of(server)
    return Run(scenario, up, values, our_alerts(server), server.log_tail())


@pytest.fixture(scope="module")
def runs(
    installs: list[Install], prom_release: PromRelease, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Run]]:
    """Three Prometheus processes of one release, side by side, one per scenario:

    - up-and-down: each install has a pod that answers and a pod that does not;
    - all-down: each install has only a pod that does not answer;
    - gone: the monitors and the scrape job are there, but select no pod at all.
    """
    tmp = tmp_path_factory.mktemp(f"alert-jobs-{prom_release.id}")
    servers: list[TextServer] = []
    # The dead pods' ports, held (bound, not listening) so that no live server takes one.
    held: list[socket.socket] = []
    # A real enricher's output (the golden file of a node), less the lines whose values the
    # golden file leaves out.
    golden = (GOLDEN / "node.out").read_text().splitlines()
    body = "".join(f"{line}\n" for line in golden if "<volatile>" not in line).encode()
    scenarios: list[Scenario] = []
    for name in ("up-and-down", "all-down", "gone"):
        members = [copy.copy(i) for i in installs if name == "up-and-down" or not i.control]
        scenario = Scenario(name, members, set(), set())
        for install in members:
            slug = re.sub(r"[^a-z0-9]+", "-", install.name.lower()).strip("-")[:40]
            install.pods = {}
            if name != "gone":
                held.append(closed_port())
                dead = f"127.0.0.1:{held[-1].getsockname()[1]}"
                install.pods[f"{slug}-dead"] = dead
                scenario.dead.add(dead)
            if name == "up-and-down":
                server = TextServer(lambda _path: body)
                servers.append(server)
                live = f"127.0.0.1:{server.port}"
                install.pods[f"{slug}-live"] = live
                scenario.live.add(live)
        scenarios.append(scenario)
    try:
        with contextlib.ExitStack() as stack:
            for scenario in scenarios:
                scenario.server = stack.enter_context(
                    serve(prom_release, prometheus_config(scenario.installs), tmp / scenario.name)
                )
            yield {s.name: settle(s) for s in scenarios}
    finally:
        for server in servers:
            server.close()
        for sock in held:
            sock.close()


def address_of(install: Install, which: str) -> str:
    (address,) = [a for pod, a in install.pods.items() if pod.endswith(f"-{which}")]
    return address


def alerts_named(run: Run, name: str) -> list[Doc]:
    return [a for a in run.alerts if a["labels"]["alertname"] == name]


# --------------------------------------------------------------------------- tests


def test_the_installs_are_the_ones_the_issue_names(installs: list[Install]) -> None:
    """At least three release names x two namespaces x both monitor kinds, the overlays and
    the plain scrape config; the Service (so the Operator's job) differs between them."""
    charts = [i for i in installs if i.name.startswith("helm ") and not i.control]
    assert len(charts) >= len(RELEASE_NAMES) * len(NAMESPACES) * len(MONITOR_KINDS)
    services = {s["metadata"]["name"] for i in charts for s in of_kind(i.docs, "Service")}
    assert {"dcgm-enricher", "gpu-dcgm-enricher", "team-a-dcgm-enricher"} <= services
    assert any(i.plain for i in installs)


def test_every_target_is_scraped_with_the_job_label(runs: dict[str, Run]) -> None:
    run = runs["up-and-down"]
    for install in run.scenario.installs:
        live, dead = address_of(install, "live"), address_of(install, "dead")
        assert (run.values.get(live), run.values.get(dead)) == ("1", "0"), install.name
        if not install.control:
            assert run.up[live]["job"] == run.up[dead]["job"] == "dcgm-enricher", install.name


def test_user_relabelings_apply_before_the_job_relabeling(runs: dict[str, Run]) -> None:
    """monitor.relabelings run (a node label) and cannot move the job label (the chart's own
    relabeling comes after them)."""
    run = runs["up-and-down"]
    (install,) = [i for i in run.scenario.installs if i.name.endswith("monitor.relabelings")]
    for pod, address in install.pods.items():
        assert run.up[address]["node"] == f"node-{pod}"
        assert run.up[address]["job"] == "dcgm-enricher"


def test_the_operator_job_names_differ_without_the_relabeling(runs: dict[str, Run]) -> None:
    """The control installs: what the Operator names the job when the monitor does not."""
    run = runs["up-and-down"]
    jobs = {
        i.name: run.up[address_of(i, "live")]["job"] for i in run.scenario.installs if i.control
    }
    assert jobs == {
        "control: helm gpu ServiceMonitor without the job relabeling": "gpu-dcgm-enricher",
        "control: helm gpu PodMonitor without the job relabeling": "monitoring/gpu-dcgm-enricher",
    }


def test_down_target_is_pending_and_live_ones_stay_quiet(runs: dict[str, Run]) -> None:
    """GpuEnricherDown is pending (``for: 5m``, not edited) for the dead pod of every install,
    for no live pod, and not for the control installs; GpuEnricherAbsent stays quiet."""
    run = runs["up-and-down"]
    down = {a["labels"]["instance"]: a["state"] for a in alerts_named(run, DOWN)}
    expected = {address_of(i, "dead"): "pending" for i in run.scenario.installs if not i.control}
    missing = [
        i.name for i in run.scenario.installs if not i.control and address_of(i, "dead") not in down
    ]
    assert not missing, f"no {DOWN} for the dead pod of: {missing}\n{run.log}"
    assert down == expected
    assert alerts_named(run, ABSENT) == []


def test_every_target_down_is_absent_and_down(runs: dict[str, Run]) -> None:
    run = runs["all-down"]
    down = {a["labels"]["instance"] for a in alerts_named(run, DOWN) if a["state"] == "pending"}
    assert down == run.scenario.dead
    assert [a["state"] for a in alerts_named(run, ABSENT)] == ["pending"]


def test_no_target_at_all_is_absent(runs: dict[str, Run]) -> None:
    run = runs["gone"]
    assert run.up == {}
    assert alerts_named(run, DOWN) == []
    assert [a["state"] for a in alerts_named(run, ABSENT)] == ["pending"]


def rule(name: str) -> Doc:
    found: Doc = next(
        r
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == name
    )
    return found


def expected_annotations(name: str, instance: str) -> dict[str, str]:
    annotations = dict(rule(name)["annotations"])
    text = annotations["description"].replace("{{ $labels.instance }}", instance)
    # These Prometheus servers have no external labels: a cluster named from them is empty.
    text = re.sub(r"\{\{ with \$externalLabels\.\w+ \}\}.*?\{\{ end \}\}", "", text)
    assert "{{" not in text, "only $labels.instance and $externalLabels are filled in here"
    annotations["description"] = text
    return annotations


def series(labels: dict[str, str]) -> str:
    body = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"up{{{body}}}"


def test_each_install_alone_with_the_real_for(
    runs: dict[str, Run], prom_release: PromRelease, tmp_path: Path
) -> None:
    """Per install, as if it were the only one: its answering pod alone keeps both alerts
    quiet; its silent pod alone fires GpuEnricherDown after 5 m and GpuEnricherAbsent after
    15 m. The series are the ``up`` the live Prometheus wrote, labels and all."""
    run = runs["up-and-down"]
    tests = []
    for install in run.scenario.installs:
        if install.control:
            continue
        live, dead = run.up[address_of(install, "live")], run.up[address_of(install, "dead")]
        quiet = [{"eval_time": "30m", "alertname": a, "exp_alerts": []} for a in (DOWN, ABSENT)]
        tests.append(
            {
                "name": f"{install.name}: up",
                "interval": "1m",
                "input_series": [{"series": series(live), "values": "1x40"}],
                "alert_rule_test": quiet,
            }
        )
        instance = dead["instance"]
        tests.append(
            {
                "name": f"{install.name}: down",
                "interval": "1m",
                "input_series": [{"series": series(dead), "values": "0x40"}],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": DOWN, "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": DOWN,
                        "exp_alerts": [
                            {
                                "exp_labels": {**dead, "severity": "warning"},
                                "exp_annotations": expected_annotations(DOWN, instance),
                            }
                        ],
                    },
                    {"eval_time": "14m", "alertname": ABSENT, "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": ABSENT,
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical"},
                                "exp_annotations": expected_annotations(ABSENT, instance),
                            }
                        ],
                    },
                ],
            }
        )
    file = tmp_path / "installs.tests.yaml"
    file.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests})
    )
    proc = subprocess.run(
        [prom_release.promtool, "test", "rules", str(file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
