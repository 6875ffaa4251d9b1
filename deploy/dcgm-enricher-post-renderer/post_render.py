#!/usr/bin/env python3
"""Helm post-renderer: adds dcgm-enricher to a release of NVIDIA's dcgm-exporter chart.

Helm gives it the rendered chart on stdin; it prints the same objects with the enricher added:

- the DaemonSet: the enricher container, ``hostPID: true``, a ServiceAccount token volume for the
  enricher container only, and the pod label ``app.kubernetes.io/part-of: dcgm-enricher``
  (the patch of manifests/components/add-to-dcgm-exporter, read from enricher-sidecar.yaml);
- the enricher's ClusterRole (manifests/base/rbac.yaml: pods get/list/watch, resourceslices list)
  bound to the ServiceAccount the DaemonSet runs as;
- the chart's Service: each port that reached the exporter now reaches the enricher (port name
  ``enricher``, 9401), so the chart's ServiceMonitor scrapes the enricher; that ServiceMonitor's
  endpoint gets ``honorLabels: true``;
- with ``--monitoring``: the PrometheusRule and the Grafana dashboard ConfigMap.

Everything else is passed through unchanged. Needs Python 3.10+ and PyYAML. A chart it cannot
handle (no such DaemonSet, TLS or basic auth on the exporter, ...) is an error on stderr and
exit status 1, which stops Helm. docs/install.md shows how Helm 3 and Helm 4 run it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PROG = "dcgm-enricher-post-renderer"
EXPORTER_CONTAINER = "exporter"  # the one container NVIDIA's chart renders
ENRICHER_CONTAINER = "dcgm-enricher"
ENRICHER_PORT_NAME = "enricher"
ENRICHER_PORT = 9401
MAX_INPUT_BYTES = 64 * 1024 * 1024
# Addresses the enricher can reach over the pod's loopback.
LOOPBACK_REACHABLE = frozenset({"", "0.0.0.0", "127.0.0.1", "localhost", "[::]"})
UPSTREAM_FLAG = "--upstream.url="

Doc = dict[str, Any]


class PostRenderError(Exception):
    """The chart's output is not something this post-renderer can add the enricher to."""


def load_docs(path: Path) -> list[Doc]:
    """The YAML documents of one of the shipped manifest files next to this script."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def parse_listen(address: str) -> tuple[str, int]:
    """Host and port of a dcgm-exporter listen address such as ``:9400``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        raise PostRenderError(f"cannot read the exporter's listen address {address!r}")
    return host, int(port)


def exporter_address(exporter: Doc) -> tuple[str, int]:
    """Where dcgm-exporter listens: -a/--address beats DCGM_EXPORTER_LISTEN beats :9400."""
    args = [str(a) for a in exporter.get("args") or []]
    for i, arg in enumerate(args):
        for flag in ("-a", "--address"):
            if arg == flag and i + 1 < len(args):
                return parse_listen(args[i + 1])
            if arg.startswith(flag + "="):
                return parse_listen(arg[len(flag) + 1 :])
    for env in exporter.get("env") or []:
        if env.get("name") == "DCGM_EXPORTER_LISTEN" and "value" in env:
            return parse_listen(str(env["value"]))
    return "", 9400


def container_port(container: Doc, ref: Any) -> int | None:
    """A Service targetPort (number or port name) resolved against one container."""
    if isinstance(ref, int):
        return ref
    for port in container.get("ports") or []:
        if port.get("name") == ref:
            number = port.get("containerPort")
            return number if isinstance(number, int) else None
    return None


def selects(selector: Any, labels: dict[str, Any]) -> bool:
    """A non-empty matchLabels-style selector matches these labels."""
    return (
        isinstance(selector, dict)
        and bool(selector)
        and all(labels.get(k) == v for k, v in selector.items())
    )


def the_daemonset(docs: list[Doc]) -> Doc:
    found = [
        d
        for d in docs
        if d.get("kind") == "DaemonSet"
        and any(
            c.get("name") == EXPORTER_CONTAINER
            for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
        )
    ]
    if len(found) != 1:
        raise PostRenderError(
            f"expected one DaemonSet with a container named {EXPORTER_CONTAINER!r} "
            f"(NVIDIA's dcgm-exporter chart), found {len(found)}"
        )
    return found[0]


def add_to_daemonset(daemonset: Doc, patch: Doc) -> int:
    """Apply the component's patch to the chart's DaemonSet; return the exporter's port."""
    template = daemonset["spec"]["template"]
    spec = template["spec"]
    names = [c.get("name") for c in (spec.get("initContainers") or []) + spec["containers"]]
    if ENRICHER_CONTAINER in names:
        raise PostRenderError(
            f"the DaemonSet already has a {ENRICHER_CONTAINER} container "
            "(its values add one, or the post-renderer ran twice)"
        )
    exporter = next(c for c in spec["containers"] if c.get("name") == EXPORTER_CONTAINER)
    if any(e.get("name") == "DCGM_EXPORTER_WEB_CONFIG_FILE" for e in exporter.get("env") or []):
        raise PostRenderError(
            "the exporter serves TLS or basic auth (tlsServerConfig / basicAuth): the enricher "
            "reads it over plain HTTP on the pod's loopback; turn those off for this release"
        )
    host, port = exporter_address(exporter)
    if host not in LOOPBACK_REACHABLE:
        raise PostRenderError(f"the exporter listens on {host}, which loopback cannot reach")
    if port == ENRICHER_PORT:
        raise PostRenderError(
            f"the exporter listens on {ENRICHER_PORT}, the enricher's port: set service.port "
            "and service.address of the chart to another port"
        )

    patch_template = patch["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("labels", {}).update(
        patch_template["metadata"]["labels"]
    )
    patch_spec = patch_template["spec"]
    spec["hostPID"] = patch_spec["hostPID"]
    volumes = spec.setdefault("volumes", [])
    taken = {v.get("name") for v in volumes}
    for volume in patch_spec.get("volumes", []):
        if volume["name"] in taken:
            raise PostRenderError(f"the DaemonSet already has a volume named {volume['name']}")
        volumes.append(copy.deepcopy(volume))
    (enricher,) = copy.deepcopy(patch_spec["containers"])
    upstream = f"{UPSTREAM_FLAG}http://127.0.0.1:{port}/metrics"
    enricher["args"] = [upstream if a.startswith(UPSTREAM_FLAG) else a for a in enricher["args"]]
    known = {v.get("name") for v in volumes}
    missing = [m["name"] for m in enricher.get("volumeMounts", []) if m["name"] not in known]
    if missing:
        raise PostRenderError(f"the DaemonSet lacks the volumes {missing} the enricher mounts")
    spec["containers"].append(enricher)
    return port


def retarget_scrape(docs: list[Doc], daemonset: Doc, exporter_port: int) -> None:
    """Point the chart's Service ports and ServiceMonitor endpoints at the enricher."""
    namespace = daemonset["metadata"]["namespace"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    exporter = next(
        c
        for c in daemonset["spec"]["template"]["spec"]["containers"]
        if c.get("name") == EXPORTER_CONTAINER
    )
    retargeted: list[tuple[Doc, str]] = []  # (Service, port name)
    for service in docs:
        if service.get("kind") != "Service":
            continue
        if service["metadata"].get("namespace") != namespace:
            continue
        if not selects(service.get("spec", {}).get("selector"), pod_labels):
            continue
        for port in service["spec"].get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            if container_port(exporter, target) == exporter_port:
                port["targetPort"] = ENRICHER_PORT_NAME
                retargeted.append((service, str(port.get("name", ""))))
    for monitor in docs:
        if monitor.get("kind") != "ServiceMonitor":
            continue
        spec = monitor.get("spec", {})
        names = spec.get("namespaceSelector", {}).get("matchNames")
        in_namespace = names is None and monitor["metadata"].get("namespace") == namespace
        if not (in_namespace or (isinstance(names, list) and namespace in names)):
            continue
        selector = spec.get("selector", {}).get("matchLabels")
        ports = {
            name
            for service, name in retargeted
            if selects(selector, service["metadata"].get("labels") or {})
        }
        for endpoint in spec.get("endpoints") or []:
            if endpoint.get("port") in ports:
                endpoint["honorLabels"] = True


def rbac_for(daemonset: Doc, rbac: list[Doc]) -> list[Doc]:
    """The component's ClusterRole and binding, named for this release, bound to its account."""
    meta = daemonset["metadata"]
    namespace = meta["namespace"]
    name = f"dcgm-enricher-{namespace}-{meta['name']}"
    labels = {
        "app.kubernetes.io/name": "dcgm-enricher",
        "app.kubernetes.io/part-of": "dcgm-enricher",
    }
    if "app.kubernetes.io/instance" in (meta.get("labels") or {}):
        labels["app.kubernetes.io/instance"] = meta["labels"]["app.kubernetes.io/instance"]
    account = daemonset["spec"]["template"]["spec"].get("serviceAccountName") or "default"
    out = []
    for doc in copy.deepcopy(rbac):
        doc["metadata"]["name"] = name
        doc["metadata"]["labels"] = dict(labels)
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = name
            doc["subjects"] = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
        out.append(doc)
    return out


def enrich(docs: list[Doc], parts: dict[str, list[Doc]], monitoring: bool = False) -> list[Doc]:
    """The chart's objects with the enricher added (a new list; ``docs`` is left as it was)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
            raise PostRenderError("a rendered document is not a Kubernetes object")
    daemonset = the_daemonset(docs)
    namespace = daemonset["metadata"].get("namespace")
    if not namespace:
        raise PostRenderError("the DaemonSet has no metadata.namespace (render with -n)")
    (patch,) = parts["enricher-sidecar.yaml"]
    port = add_to_daemonset(daemonset, patch)
    retarget_scrape(docs, daemonset, port)
    added = rbac_for(daemonset, parts["rbac.yaml"])
    if monitoring:
        for doc in copy.deepcopy(parts["prometheusrule.yaml"] + parts["grafana-dashboard.yaml"]):
            doc["metadata"]["namespace"] = namespace
            added.append(doc)
    return docs + added


def load_parts(here: Path = HERE) -> dict[str, list[Doc]]:
    names = ("enricher-sidecar.yaml", "rbac.yaml", "prometheusrule.yaml", "grafana-dashboard.yaml")
    return {name: load_docs(here / name) for name in names}


def post_render(text: str, monitoring: bool = False) -> str:
    """The post-renderer on text: Helm's rendered manifests in, the enriched ones out."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise PostRenderError(f"the rendered chart is not YAML: {err}") from err
    out = enrich(docs, load_parts(), monitoring)
    return yaml.safe_dump_all(out, sort_keys=False, explicit_start=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--monitoring",
        action="store_true",
        help="also add the PrometheusRule and the Grafana dashboard ConfigMap",
    )
    args = parser.parse_args(argv)
    data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    try:
        if len(data) > MAX_INPUT_BYTES:
            raise PostRenderError(f"the rendered chart exceeds {MAX_INPUT_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise PostRenderError(f"the rendered chart is not UTF-8: {err}") from err
        sys.stdout.write(post_render(text, args.monitoring))
    except PostRenderError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
