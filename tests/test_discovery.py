"""GPU Operator mode: the upstream is found through the pod watch, not configured.

The enricher runs as its own DaemonSet beside the operator's nvidia-dcgm-exporter pods; the
pod watch of its node (the real kubernetes client against the API-server stand-in, no cluster
here) names the exporter pod, and the enricher scrapes that pod's IP with the port and path of
--upstream.url. Here the "pod IP" is 127.0.0.1, where a real HTTP server plays the exporter
(the full stack of tests/harness.py, without NVML or /proc: only the upstream matters).

The operator's namespace reaches the enricher from the install itself: the chart and the
overlay pass --upstream.pod-namespace=$(POD_NAMESPACE), the pod's own namespace from the
downward API. The install tests render them with the real Helm 3 and 4 and kubectl kustomize
into each namespace and run the app with the command line the kubelet would hand it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from enricher.cli import parse_config
from enricher.podparse import parse_selector
from enricher.simnode.api import make_pod
from enricher.sourcetable import kubernetes_source_options
from tests.scraping import NoProcs

from .harness import MakeStack
from .helmreleases import releases as helm_releases
from .helmreleases import require as require_helm
from .test_chart import CHART, run_helm
from .test_manifests import (
    MANIFESTS,
    Doc,
    edited_overlay,
    enricher_of,
    kustomize,
    needs_kubectl,
)

NODE = "gpu-node-a"
EXPORTED = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 42\n'


def _values(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[s.labels.get("source", s.labels.get("UUID", ""))] = float(s.value)
    return out


async def test_scrapes_the_exporter_pod_on_this_node(full_stack: MakeStack) -> None:
    selector = "app=nvidia-dcgm-exporter"
    node = await full_stack(
        upstream=EXPORTED,
        gpu=None,
        procs=NoProcs(),
        node=NODE,
        # An exporter pod on another node, and an unrelated pod here: neither may be used.
        pods=[
            make_pod(
                "nvidia-dcgm-exporter-b",
                "gpu-operator",
                node="gpu-node-b",
                labels={"app": "nvidia-dcgm-exporter"},
                pod_ip="10.9.9.9",
            ),
            make_pod("web-0", "default", node=NODE, labels={"app": "web"}, pod_ip="10.8.8.8"),
        ],
        kube={"upstream_selector": parse_selector(selector)},
        upstream_discover_pod=True,
        upstream_pod_selector=selector,
        upstream_timeout=1.0,
    )
    api, cache, client = node.api, node.cache, node.client
    assert api is not None and cache is not None
    assert cache.synced.wait(10)
    text = await (await client.get("/metrics")).text()
    # No exporter pod on this node yet: the upstream is down, and says why in the log.
    assert _values(text, "dcgm_enricher_source_up")["upstream"] == 0
    assert "DCGM_FI_DEV_GPU_UTIL" not in text

    api.add_pod(
        make_pod(
            "nvidia-dcgm-exporter-a",
            "gpu-operator",
            node=NODE,
            labels={"app": "nvidia-dcgm-exporter"},
            pod_ip="127.0.0.1",
        )
    )
    for _ in range(100):
        if cache.upstream_pods():
            break
        await asyncio.sleep(0.05)
    text = await (await client.get("/metrics")).text()
    assert _values(text, "dcgm_enricher_source_up")["upstream"] == 1
    assert _values(text, "DCGM_FI_DEV_GPU_UTIL") == {"GPU-x": 42}


# ------------------------------------------------------------- any namespace, as installed

# The GPU Operator's namespace as the operator's own chart defaults it, as OpenShift's
# OperatorHub installs it, and one an operator picked.
OPERATOR_NAMESPACES = ("gpu-operator", "nvidia-gpu-operator", "gpu-telemetry")
_KUBELET_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def kubelet_argv(container: Doc, pod_namespace: str, node: str) -> list[str]:
    """The container's args as the kubelet hands them to the process: ``$(VAR)`` replaced by
    the container's variable (literal values and the downward API's metadata.namespace and
    spec.nodeName), ``$$`` by ``$``, an unknown ``$(VAR)`` left as it is. No kubelet runs here:
    this is its documented expansion, for the fields the shipped manifests use."""
    fields = {"metadata.namespace": pod_namespace, "spec.nodeName": node}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]

    def expand(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return [_KUBELET_VAR.sub(expand, arg) for arg in container["args"]]


def installed_enrichers(namespace: str, tmp_path: Path) -> dict[str, tuple[str, Doc]]:
    """The enricher container of GPU Operator mode installed into ``namespace`` each way the
    docs say, with the namespace its pod runs in: the chart (Helm 3 and 4, ``-n``), the overlay
    with its ``namespace:`` line changed, and the overlay under a kustomization of one's own
    that sets ``namespace:``. Rendered by the real tools."""
    found: dict[str, tuple[str, Doc]] = {}
    for release in helm_releases():
        proc = run_helm(
            require_helm(release),
            "template",
            "dcgm-enricher",
            str(CHART),
            "-n",
            namespace,
            "--set",
            "mode=gpu-operator",
        )
        assert proc.returncode == 0, proc.stderr
        docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
        workload, container = enricher_of(docs)
        found[release.id] = (workload["metadata"]["namespace"], container)
    edited = edited_overlay(
        tmp_path / "edited",
        "overlays/gpu-operator",
        "namespace: gpu-operator",
        f"namespace: {namespace}",
    )
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    overlay = os.path.relpath(MANIFESTS / "overlays" / "gpu-operator", wrapper)
    (wrapper / "kustomization.yaml").write_text(
        f"namespace: {namespace}\nresources:\n  - {overlay}\n"
    )
    for name, docs in (("overlay-edited", edited), ("overlay-wrapped", kustomize(wrapper))):
        workload, container = enricher_of(docs)
        found[name] = (workload["metadata"]["namespace"], container)
    return found


@pytest.mark.one_python
@needs_kubectl
@pytest.mark.parametrize("namespace", OPERATOR_NAMESPACES)
async def test_installed_into_any_namespace_the_exporter_there_is_found(
    full_stack: MakeStack, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each install into ``namespace`` hands the enricher --upstream.pod-namespace=<namespace>;
    the real app with that command line ignores an exporter-labelled pod of every other
    namespace (even one that answers), says where it looked, and scrapes the one there."""
    configs = {}
    for how, (pod_namespace, container) in installed_enrichers(namespace, tmp_path).items():
        assert pod_namespace == namespace, how
        _, config, _ = parse_config(kubelet_argv(container, pod_namespace, NODE))
        configs[how] = config
        assert config.upstream_pod_namespace == namespace, how
        assert config.upstream_discover_pod, how
    assert len({(c.upstream_pod_selector, c.upstream_pod_namespace) for c in configs.values()}) == 1
    config = next(iter(configs.values()))
    selector = config.upstream_pod_selector
    labels = dict(parse_selector(selector))
    # Pods with the exporter's labels on this node, in every other namespace: the operator's
    # of another install, and a tenant's. Each answers at the upstream's address.
    others = [ns for ns in (*OPERATOR_NAMESPACES, "team-a") if ns != namespace]
    decoys = [
        make_pod(f"nvidia-dcgm-exporter-{ns}", ns, node=NODE, labels=labels, pod_ip="127.0.0.1")
        for ns in others
    ]
    caplog.set_level(logging.WARNING, logger="enricher")
    node = await full_stack(
        upstream=EXPORTED,
        gpu=None,
        procs=NoProcs(),
        node=NODE,
        pods=decoys,
        kube=kubernetes_source_options(config),
        base=config,
        upstream_follow_step=0.0,
        upstream_timeout=1.0,
    )
    api, cache, client = node.api, node.cache, node.client
    assert api is not None and cache is not None
    text = await (await client.get("/metrics")).text()
    assert cache.upstream_pods() == []
    assert _values(text, "dcgm_enricher_source_up")["upstream"] == 0
    assert "DCGM_FI_DEV_GPU_UTIL" not in text
    searched = f"no pod labelled {selector} in namespace {namespace} on node {NODE}"
    assert any(searched in r.getMessage() for r in caplog.records), caplog.text
    # The runbook quotes that line, to tell this cause from a dead exporter.
    runbook = " ".join((MANIFESTS.parent / "docs" / "runbook.md").read_text().split())
    assert f"no pod labelled {selector} in namespace <ns> on node <node> with a pod IP" in runbook

    api.add_pod(
        make_pod("nvidia-dcgm-exporter-a", namespace, node=NODE, labels=labels, pod_ip="127.0.0.1")
    )
    for _ in range(100):
        if cache.upstream_pods():
            break
        await asyncio.sleep(0.05)
    assert [(p.namespace, p.name) for p in cache.upstream_pods()] == [
        (namespace, "nvidia-dcgm-exporter-a")
    ]
    text = await (await client.get("/metrics")).text()
    assert _values(text, "dcgm_enricher_source_up")["upstream"] == 1
    assert _values(text, "DCGM_FI_DEV_GPU_UTIL") == {"GPU-x": 42}


def test_an_unexpanded_namespace_variable_is_refused() -> None:
    """A manifest that names $(POD_NAMESPACE) without defining it: the kubelet leaves the text
    as it is, and no pod could ever match it; the enricher refuses to start, saying so."""
    container = {"args": ["serve", "--upstream.discover-pod", "--upstream.pod-namespace=$(NS)"]}
    argv = kubelet_argv(container, "gpu-operator", NODE)
    assert argv[-1] == "--upstream.pod-namespace=$(NS)"
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(err):
        parse_config(argv)
    assert exit_info.value.code == 2
    assert "'$(NS)' is not a namespace name" in err.getvalue()
