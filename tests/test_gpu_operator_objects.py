"""GPU Operator mode against the objects the NVIDIA GPU Operator really creates.

../shared/fixtures/charts/gpu-operator/state-dcgm-exporter holds the operator's own manifests
for its dcgm-exporter (not ours: read, never copied; the operator fills the namespace and the
images at run time). Our gpu-operator mode, as kustomize builds manifests/overlays/gpu-operator
and as the chart renders its gpu-operator profile with Helm 3 and Helm 4, must find the
operator's exporter pods by their real labels, on the nodes where the operator schedules them,
on the port their exporter listens on, and must neither scrape nor be scraped by the operator's
own Service and ServiceMonitor. The tests skip when ../shared is absent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.tools import require_tool
from enricher.config import Config
from enricher.podparse import parse_selector
from enricher.upstream import url_for_pod_ip

from .helmreleases import releases, require
from .test_chart import render as render_chart
from .test_manifests import (
    DEFAULT_POD_SELECTOR,
    DEFAULT_UPSTREAM_URL,
    build,
    enricher_of,
    enricher_setting,
    of_kind,
    pod_spec,
    selects,
)

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = ROOT.parent / "shared" / "fixtures" / "charts" / "gpu-operator" / "state-dcgm-exporter"

Doc = dict[str, Any]
Docs = tuple[Doc, ...]

pytestmark = pytest.mark.skipif(
    not OPERATOR.is_dir(), reason=f"the GPU Operator's objects are not at {OPERATOR} (../shared)"
)


def operator_objects() -> Docs:
    docs = []
    for file in sorted(OPERATOR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(file.read_text()) if d]
    return tuple(docs)


def operator_one(kind: str) -> Doc:
    found = [d for d in operator_objects() if d["kind"] == kind]
    assert len(found) == 1, f"the operator's {kind} objects: {len(found)}"
    return found[0]


def operator_exporter() -> Doc:
    containers: list[Doc] = pod_spec(operator_one("DaemonSet"))["containers"]
    (container,) = containers
    return container


@pytest.fixture(params=["kustomize", "chart-helm3", "chart-helm4"])
def ours(request: pytest.FixtureRequest) -> Docs:
    """Our gpu-operator mode, from each source that renders it."""
    if request.param == "kustomize":
        require_tool("kubectl", "apt-get install kubectl (.ci/system-deps does)")
        return build("overlays/gpu-operator")
    release = require(releases()[0 if request.param == "chart-helm3" else 1])
    return render_chart(release, "gpu-operator")


def test_the_fixture_is_the_operators_dcgm_exporter() -> None:
    """What the tests below rely on, read from the operator's files."""
    daemonset = operator_one("DaemonSet")
    assert daemonset["metadata"]["name"] == "nvidia-dcgm-exporter"
    assert operator_exporter()["name"] == "nvidia-dcgm-exporter"
    service = operator_one("Service")
    assert service["metadata"]["name"] == "nvidia-dcgm-exporter"
    assert [p["name"] for p in service["spec"]["ports"]] == ["gpu-metrics"]


def test_the_pod_selector_finds_the_operators_pods(ours: Docs) -> None:
    _, enricher = enricher_of(ours)
    selector = parse_selector(
        enricher_setting(enricher, "--upstream.pod-selector", DEFAULT_POD_SELECTOR)
    )
    operator_pods = operator_one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selects(selector, operator_pods)
    # Never one of our own pods: the enricher must not scrape itself.
    for workload in of_kind(ours, "DaemonSet"):
        assert not selects(selector, workload["spec"]["template"]["metadata"]["labels"])


def test_the_default_selector_is_the_operators_label() -> None:
    """The flag's default (enricher.config) is the label the operator puts on its pods."""
    operator_pods = operator_one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selects(parse_selector(Config().upstream_pod_selector), operator_pods)


def test_the_scrape_reaches_the_operators_exporter_port(ours: Docs) -> None:
    """The discovered pod's IP with our --upstream.url's port and path is where the operator's
    exporter listens (DCGM_EXPORTER_LISTEN) and the port its container declares."""
    _, enricher = enricher_of(ours)
    url = url_for_pod_ip(
        enricher_setting(enricher, "--upstream.url", DEFAULT_UPSTREAM_URL), "10.1.2.3"
    )
    exporter = operator_exporter()
    (listen,) = [e["value"] for e in exporter["env"] if e["name"] == "DCGM_EXPORTER_LISTEN"]
    port = int(listen.rpartition(":")[2])
    assert url == f"http://10.1.2.3:{port}/metrics"
    assert {"name": "metrics", "containerPort": port} in exporter["ports"]
    (service_port,) = operator_one("Service")["spec"]["ports"]
    assert service_port["targetPort"] == port


def test_ours_runs_where_the_operators_exporter_runs(ours: Docs) -> None:
    workload, _ = enricher_of(ours)
    spec, theirs = pod_spec(workload), pod_spec(operator_one("DaemonSet"))
    assert spec["nodeSelector"] == theirs["nodeSelector"]
    assert all(t in spec["tolerations"] for t in theirs["tolerations"])


def test_no_cross_scrapes(ours: Docs) -> None:
    """The operator's ServiceMonitor does not select our Service, ours does not select the
    operator's Service, and a PodMonitor of ours would not select the operator's pods."""
    theirs_monitor = operator_one("ServiceMonitor")
    theirs_service = operator_one("Service")
    their_selector = theirs_monitor["spec"]["selector"]["matchLabels"]
    assert of_kind(ours, "Service") and of_kind(ours, "ServiceMonitor", "PodMonitor")
    for service in of_kind(ours, "Service"):
        assert not selects(their_selector, service["metadata"].get("labels", {}))
        assert not selects(service["spec"]["selector"], theirs_service["spec"]["selector"])
    operator_pods = operator_one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    for monitor in of_kind(ours, "ServiceMonitor", "PodMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert not selects(selector, theirs_service["metadata"]["labels"])
        assert not selects(selector, operator_pods)


def test_install_docs_name_the_operators_objects() -> None:
    """docs/install.md's advice against double scrapes names the operator's real Service, its
    real annotation and port name, and its real ServiceMonitor's selector label."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text.split("\n## GPU Operator\n", 1)[1].split("\n## ", 1)[0]
    service = operator_one("Service")
    name = service["metadata"]["name"]
    assert f"`{name}` Service" in section
    for key, value in service["metadata"]["annotations"].items():
        assert f'`{key}: "{value}"`' in section
    (port,) = service["spec"]["ports"]
    assert f"port `{port['name']}`" in section
    match = re.search(r"regex: gpu-operator;(\S+)", section)
    assert match and match.group(1) == name
    (label,) = operator_one("DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    assert f"`{label[0]}={label[1]}`" in section
