"""Checks of manifests/, the Prometheus scrape config and the Dockerfile.

Every kustomize entry point is built with the real kubectl, every object is validated against
the Kubernetes schemas (kubernetes-validate) or, for the Prometheus Operator kinds, against a
schema of the fields we use, and the built objects must keep what docs/install.md promises.

The invariant checks are plain functions that return the problems they find; the mutation
tests feed them broken copies of the real output, so each check is shown to fail when it should.
No cluster is needed: nothing here talks to an API server.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from devkit.tools import run_tool
from enricher.config import Config

from .promreleases import PromRelease, serve
from .schemas import PROMETHEUS_RULE_SCHEMA

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
SCRAPE_CONFIG = MANIFESTS / "prometheus" / "scrape-config.yaml"

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.usefixtures("kubectl")  # fails in CI, skips elsewhere

Doc = dict[str, Any]
Docs = tuple[Doc, ...]

ENRICHER_CONTAINER = "dcgm-enricher"
ENRICHER_IMAGE_REPO = "dcgm-enricher"
EXPORTER_IMAGE_REPO = "nvcr.io/nvidia/k8s/dcgm-exporter"
ENRICHER_PORT = 9401
ENRICHER_UID = 0  # root without capabilities: the kubelet socket is root-only (see manifests)
IMAGE_UID = 10001  # the image itself runs non-root by default
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_UPSTREAM_URL = "http://127.0.0.1:9400/metrics"
DEFAULT_POD_SELECTOR = "app=nvidia-dcgm-exporter"
# The GPU Operator's MPS control daemon pods (its nvidia-device-plugin-mps-control-daemon
# DaemonSet's label).
OPERATOR_MPS_SELECTOR = "app=nvidia-device-plugin-mps-control-daemon"
# Oldest and newest Kubernetes schema sets kubernetes-validate ships that we support.
K8S_VERSIONS = ("1.32.0", "1.37.0")
CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "SecurityContextConstraints"}
)
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor")
WORKLOAD_KINDS = ("DaemonSet", "Deployment", "StatefulSet")


def project_version() -> str:
    """The version in pyproject.toml (read with a regex: tomllib is 3.11+)."""
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match.group(1)


@dataclass(frozen=True)
class EntryPoint:
    path: str  # relative to manifests/
    namespace: str
    mode: str  # "sidecar", "gpu-operator" or "patch"
    uid: int = ENRICHER_UID  # the enricher's runAsUser (non-root: without PodResources)


ENTRY_POINTS = (
    EntryPoint("overlays/sidecar", "gpu-monitoring", "sidecar"),
    EntryPoint("overlays/gpu-operator", "gpu-operator", "gpu-operator"),
    EntryPoint("patches/existing-dcgm-exporter", "gpu-monitoring", "patch"),
)
# Builds on its own but is only ever applied through an overlay (no namespace, no workload).
LIBRARIES = ("base",)
# Applied beside a Helm release that runs the enricher (no workload of its own): checked
# together with that release in tests/test_dcgm_exporter_chart.py.
COMPANIONS = ("patches/dcgm-exporter-native-sidecar",)


# --------------------------------------------------------------------------- building


def kustomize(directory: Path) -> Docs:
    """Build one kustomization with the real kubectl and parse its output."""
    assert KUBECTL is not None
    proc = run_tool([KUBECTL, "kustomize", str(directory)])
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


@functools.cache
def build(path: str) -> Docs:
    """Built objects of an entry point, cached: tests must deep-copy before mutating."""
    return kustomize(MANIFESTS / path)


def kustomization_dirs() -> dict[str, str]:
    """Every directory under manifests/ with a kustomization, mapped to its kind."""
    found = {}
    for file in sorted(MANIFESTS.rglob("kustomization.yaml")):
        doc = yaml.safe_load(file.read_text())
        found[file.parent.relative_to(MANIFESTS).as_posix()] = doc.get("kind", "Kustomization")
    return found


def edited_overlay(tmp_path: Path, overlay: str, old: str, new: str) -> Docs:
    """Build a copy of manifests/ after replacing one line of an overlay's kustomization.

    This is how docs/install.md tells users to swap the ServiceMonitor for a PodMonitor or
    to drop the monitor for a plain Prometheus, so the edit is tested as written there.
    """
    copy_root = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy_root)
    kustomization = copy_root / overlay / "kustomization.yaml"
    text = kustomization.read_text()
    assert text.count(old) == 1, f"{old!r} is not one line of {overlay}"
    kustomization.write_text(text.replace(old, new))
    return kustomize(copy_root / overlay)


# --------------------------------------------------------------------------- object helpers


def of_kind(docs: Docs, *kinds: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") in kinds]


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def all_containers(spec: Doc) -> list[Doc]:
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def enricher_of(docs: Docs) -> tuple[Doc, Doc]:
    """The one workload that runs the enricher container, and that container."""
    found = [
        (w, c)
        for w in of_kind(docs, *WORKLOAD_KINDS)
        for c in pod_spec(w).get("containers", [])
        if c.get("name") == ENRICHER_CONTAINER
    ]
    assert len(found) == 1, f"expected one {ENRICHER_CONTAINER} container, found {len(found)}"
    return found[0]


def env_entry(container: Doc, name: str) -> Doc | None:
    for entry in container.get("env", []):
        if entry.get("name") == name:
            e: Doc = entry
            return e
    return None


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` (the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def bool_flag(args: list[str], flag: str) -> bool | None:
    """State of a ``--x`` / ``--no-x`` pair of flags (the last one wins); None if absent."""
    name = flag.removeprefix("--")
    state = None
    for arg in args:
        if arg == f"--{name}":
            state = True
        elif arg == f"--no-{name}":
            state = False
    return state


def _downward_variables(container: Doc, field_path: str) -> list[str]:
    """The container's variables set from the downward API's ``field_path``."""
    return [
        e["name"]
        for e in container.get("env", [])
        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == field_path
    ]


def enricher_setting(container: Doc, flag: str, default: str) -> str:
    """A flag's effective value: argument, then ENRICHER_* variable, then the default."""
    value = flag_value(container.get("args", []), flag)
    if value is not None:
        return value
    env = env_entry(container, "ENRICHER_" + re.sub(r"[.-]", "_", flag[2:]).upper())
    if env is not None and "value" in env:
        return str(env["value"])
    return default


def port_number(container: Doc, port: int | str) -> int | None:
    """Resolve a probe / targetPort reference (number or port name) against a container."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            number: int = p["containerPort"]
            return number
    return None


def selects(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    """A non-empty matchLabels-style selector matches these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def effective_security(spec: Doc, container: Doc) -> Doc:
    """Container securityContext over the pod's, for the fields both levels have."""
    pod = spec.get("securityContext", {})
    merged = {k: pod[k] for k in ("runAsNonRoot", "runAsUser", "seccompProfile") if k in pod}
    merged.update(container.get("securityContext", {}))
    return merged


def parse_duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration such as ``1m30s``; ValueError when malformed."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * units[u] for n, u in parts)


# --------------------------------------------------------------------------- invariant checks


def image_problem(image: str) -> str | None:
    """Why an image reference is not pinned, or None when it has a fixed tag or a digest."""
    name, _, digest = image.partition("@")
    if digest:
        return None if re.fullmatch(r"sha256:[0-9a-f]{64}", digest) else f"{image}: bad digest"
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"{image}: no tag (means latest)"
    tag = last.rsplit(":", 1)[1]
    if not tag or tag.startswith("latest"):
        return f"{image}: tag {tag!r} is not pinned"
    return None


def image_problems(docs: Docs) -> list[str]:
    problems = []
    for workload in of_kind(docs, *WORKLOAD_KINDS):
        for c in all_containers(pod_spec(workload)):
            problem = image_problem(c.get("image", ""))
            if problem:
                problems.append(f"{c.get('name')}: {problem}")
    return problems


def rbac_problems(docs: Docs) -> list[str]:
    """Exactly one ClusterRole: get/list/watch on core pods, list on resource.k8s.io
    resourceslices (the DRA lookup, unless --no-kube.resource-slices turns it off), and nothing
    else anywhere."""
    expected = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    enrichers = [
        c
        for w in of_kind(docs, *WORKLOAD_KINDS)
        for c in pod_spec(w).get("containers", [])
        if c.get("name") == ENRICHER_CONTAINER
    ]  # none where the objects checked are the RBAC alone
    if not any(bool_flag(c.get("args", []), "--kube.resource-slices") is False for c in enrichers):
        expected.append(
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}
        )
    problems = []
    scc_roles = {r["metadata"]["name"] for r in scc_use_roles(docs)}
    roles = [
        r for r in of_kind(docs, "Role", "ClusterRole") if r["metadata"]["name"] not in scc_roles
    ]
    if [r["kind"] for r in roles] != ["ClusterRole"]:
        problems.append(f"expected one ClusterRole, found {[r['kind'] for r in roles]}")
    for role in roles:
        if "aggregationRule" in role:
            problems.append(f"{role['metadata']['name']}: aggregationRule grants unknown rules")
        rules = role.get("rules", [])
        if len(rules) != len(expected):
            problems.append(
                f"{role['metadata']['name']}: {len(rules)} rules, expected {len(expected)}"
            )
        for rule, want in zip(rules, expected, strict=False):
            if set(rule) != {"apiGroups", "resources", "verbs"}:
                problems.append(f"unexpected rule fields {sorted(rule)}")
            if rule.get("apiGroups") != want["apiGroups"]:
                problems.append(f"apiGroups {rule.get('apiGroups')}, expected {want['apiGroups']}")
            if rule.get("resources") != want["resources"]:
                problems.append(f"resources {rule.get('resources')}, expected {want['resources']}")
            verbs = rule.get("verbs", [])
            if sorted(verbs) != want["verbs"]:
                problems.append(f"verbs {verbs}, expected {'/'.join(want['verbs'])}")
    names = {r["metadata"]["name"] for r in roles}
    for binding in of_kind(docs, "RoleBinding", "ClusterRoleBinding"):
        ref = binding["roleRef"]
        if ref.get("kind") == "Role" and ref.get("name") in scc_roles:
            continue
        if ref.get("kind") != "ClusterRole" or ref.get("name") not in names:
            problems.append(f"{binding['metadata']['name']}: roleRef {ref} is not our ClusterRole")
    return problems


SCC_API = "security.openshift.io"


def scc_use_roles(docs: Docs) -> list[Doc]:
    """Roles whose one rule is `use` of one of these objects' SecurityContextConstraints: the
    grant OpenShift asks for (the chart's openshift.scc.create), and nothing else."""
    sccs = {d["metadata"]["name"] for d in of_kind(docs, "SecurityContextConstraints")}
    return [
        role
        for role in of_kind(docs, "Role")
        if len(sccs) == 1
        and role.get("rules")
        == [
            {
                "apiGroups": [SCC_API],
                "resources": ["securitycontextconstraints"],
                "resourceNames": sorted(sccs),
                "verbs": ["use"],
            }
        ]
    ]


def _volume_type(volume: Doc) -> str:
    (kind,) = [k for k in volume if k != "name"]
    return kind


def _in_uid_strategy(strategy: Doc, uid: int | None) -> bool:
    kind = strategy.get("type")
    if kind == "RunAsAny":
        return True
    if uid is None:  # the image's user: OpenShift would have to pick one
        return False
    if kind == "MustRunAs":
        return bool(strategy.get("uid") == uid)
    if kind == "MustRunAsRange":
        return bool(strategy.get("uidRangeMin", 1) <= uid <= strategy.get("uidRangeMax", -1))
    if kind == "MustRunAsNonRoot":
        return uid != 0
    return False


def scc_problems(docs: Docs) -> list[str]:
    """Each SecurityContextConstraints admits the pods (as OpenShift's SCC admission judges a
    pod's hostPID, volumes, capabilities, UIDs, seccomp, privilege and root filesystem) and
    grants nothing they do not use; the pods' ServiceAccount may `use` it. A stand-in for
    OpenShift, which cannot run here: the fields it checks, not its code."""
    problems = []
    for scc in of_kind(docs, "SecurityContextConstraints"):
        name = scc["metadata"]["name"]
        for workload in of_kind(docs, *WORKLOAD_KINDS):
            spec = pod_spec(workload)
            for field, allowed in (
                ("hostPID", "allowHostPID"),
                ("hostIPC", "allowHostIPC"),
                ("hostNetwork", "allowHostNetwork"),
            ):
                if bool(spec.get(field)) != bool(scc.get(allowed)):
                    problems.append(
                        f"{name}: {allowed} {scc.get(allowed)}, the pod's {field} "
                        f"{spec.get(field, False)}"
                    )
            used = {_volume_type(v) for v in spec.get("volumes", [])}
            if spec.get("automountServiceAccountToken", True) is not False:
                used.add("projected")  # the kubelet's kube-api-access volume
            if set(scc.get("volumes") or []) != used:
                problems.append(
                    f"{name}: volumes {scc.get('volumes')}, the pod uses {sorted(used)}"
                )
            if bool(scc.get("allowHostDirVolumePlugin")) != ("hostPath" in used):
                problems.append(f"{name}: allowHostDirVolumePlugin does not follow the hostPath")
            added: set[str] = set()
            for c in all_containers(spec):
                security = effective_security(spec, c)
                caps = security.get("capabilities", {})
                added |= set(caps.get("add", []))
                if "ALL" in (scc.get("requiredDropCapabilities") or []) and "ALL" not in caps.get(
                    "drop", []
                ):
                    problems.append(f"{name}: {c['name']} does not drop ALL")
                if security.get("privileged") and not scc.get("allowPrivilegedContainer"):
                    problems.append(f"{name}: {c['name']} is privileged")
                if security.get("allowPrivilegeEscalation", True) and not scc.get(
                    "allowPrivilegeEscalation", True
                ):
                    problems.append(f"{name}: {c['name']} may escalate privileges")
                if scc.get("readOnlyRootFilesystem") and not security.get("readOnlyRootFilesystem"):
                    problems.append(f"{name}: {c['name']} has a writable root filesystem")
                if not _in_uid_strategy(scc.get("runAsUser", {}), security.get("runAsUser")):
                    problems.append(
                        f"{name}: {c['name']}'s UID {security.get('runAsUser')} "
                        f"is outside {scc.get('runAsUser')}"
                    )
                seccomp = security.get("seccompProfile", {}).get("type")
                if seccomp != "RuntimeDefault" or "runtime/default" not in (
                    scc.get("seccompProfiles") or []
                ):
                    problems.append(f"{name}: {c['name']}'s seccomp {seccomp} is not admitted")
            if set(scc.get("allowedCapabilities") or []) != added:
                problems.append(
                    f"{name}: allowedCapabilities {scc.get('allowedCapabilities')}, "
                    f"the containers add {sorted(added)}"
                )
            account = spec.get("serviceAccountName", "default")
            namespace = workload["metadata"].get("namespace")
            roles = {r["metadata"]["name"] for r in scc_use_roles(docs)}
            granted = [
                b
                for b in of_kind(docs, "RoleBinding")
                if b["roleRef"].get("kind") == "Role"
                and b["roleRef"].get("name") in roles
                and b["metadata"].get("namespace") == namespace
                and {"kind": "ServiceAccount", "name": account, "namespace": namespace}
                in b.get("subjects", [])
            ]
            if not granted:
                problems.append(f"{name}: ServiceAccount {namespace}/{account} may not use it")
        if scc.get("users") or scc.get("groups"):
            problems.append(f"{name}: granted through users/groups, not RBAC `use`")
    return problems


def binding_problems(docs: Docs, namespace: str) -> list[str]:
    """The binding names exactly the ServiceAccount the enricher's pods run as."""
    workload, _ = enricher_of(docs)
    account = pod_spec(workload).get("serviceAccountName", "default")
    expected = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    problems = []
    bindings = of_kind(docs, "ClusterRoleBinding", "RoleBinding")
    scc_roles = {r["metadata"]["name"] for r in scc_use_roles(docs)}
    bindings = [b for b in bindings if b["roleRef"].get("name") not in scc_roles]
    if len(bindings) != 1:
        problems.append(f"expected one binding, found {len(bindings)}")
    for binding in bindings:
        if binding.get("subjects") != expected:
            problems.append(f"subjects {binding.get('subjects')}, expected {expected}")
    accounts = {
        (a["metadata"]["name"], a["metadata"].get("namespace"))
        for a in of_kind(docs, "ServiceAccount")
    }
    if (account, namespace) not in accounts:
        problems.append(f"ServiceAccount {namespace}/{account} is not part of the install")
    return problems


def monitor_problems(docs: Docs) -> list[str]:
    """One monitor (two would scrape twice), honorLabels on every endpoint, sane timings."""
    problems = []
    monitors = of_kind(docs, *MONITOR_KINDS)
    if len(monitors) != 1:
        kinds = [m["kind"] for m in monitors]
        problems.append(f"expected exactly one ServiceMonitor or PodMonitor, found {kinds}")
    for monitor in monitors:
        spec = monitor.get("spec", {})
        endpoints = spec.get("endpoints", []) + spec.get("podMetricsEndpoints", [])
        if not endpoints:
            problems.append(f"{monitor['kind']} has no endpoints")
        for endpoint in endpoints:
            if endpoint.get("honorLabels") is not True:
                problems.append(
                    f"{monitor['kind']} endpoint {endpoint.get('port')}: honorLabels is not true"
                )
            interval = parse_duration_seconds(endpoint.get("interval", "30s"))
            timeout = parse_duration_seconds(endpoint.get("scrapeTimeout", "10s"))
            if timeout > interval:
                problems.append(f"scrapeTimeout {timeout}s exceeds interval {interval}s")
    return problems


def wiring_problems(docs: Docs) -> list[str]:
    """The Service and the monitor actually reach the enricher's port 9401."""
    problems = []
    workload, container = enricher_of(docs)
    pod_labels = workload["spec"]["template"]["metadata"].get("labels", {})
    reaching = []  # (service, service port name) pairs that end at the enricher's port
    for service in of_kind(docs, "Service"):
        if not selects(service["spec"].get("selector"), pod_labels):
            continue
        for port in service["spec"].get("ports", []):
            target = port.get("targetPort", port.get("port"))
            if port_number(container, target) == ENRICHER_PORT:
                reaching.append((service, port.get("name")))
    if not any(name == "metrics" for _, name in reaching):
        problems.append("no Service port named metrics reaches the enricher's port 9401")
    for monitor in of_kind(docs, "ServiceMonitor"):
        selector = monitor["spec"].get("selector", {}).get("matchLabels")
        for endpoint in monitor["spec"].get("endpoints", []):
            hit = [
                s
                for s, name in reaching
                if name == endpoint.get("port") and selects(selector, s["metadata"]["labels"])
            ]
            if not hit:
                problems.append(f"ServiceMonitor port {endpoint.get('port')} reaches no enricher")
            others = [
                s["metadata"]["name"]
                for s in of_kind(docs, "Service")
                if selects(selector, s["metadata"].get("labels", {})) and s not in hit
            ]
            if others:
                problems.append(f"ServiceMonitor also selects {others}")
    for monitor in of_kind(docs, "PodMonitor"):
        if not selects(monitor["spec"].get("selector", {}).get("matchLabels"), pod_labels):
            problems.append("PodMonitor does not select the enricher's pods")
        for endpoint in monitor["spec"].get("podMetricsEndpoints", []):
            if port_number(container, endpoint.get("port", "")) != ENRICHER_PORT:
                problems.append(f"PodMonitor port {endpoint.get('port')} is not the enricher's")
    return problems


def has_api_token(spec: Doc, container: Doc) -> bool:
    """Whether this container gets a ServiceAccount token (automount or a projected volume)."""
    projected = {
        v["name"]
        for v in spec.get("volumes", [])
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }
    mounted = any(
        m.get("mountPath") == SA_TOKEN_DIR and m.get("name") in projected
        for m in container.get("volumeMounts", [])
    )
    return mounted or spec.get("automountServiceAccountToken", True) is not False


def enricher_problems(workload: Doc, container: Doc, uid: int = ENRICHER_UID) -> list[str]:
    """The enricher container and its pod as docs/install.md describes them (as root, or as
    the non-root ``uid`` without the PodResources source)."""
    problems = []
    spec = pod_spec(workload)
    if spec.get("hostPID") is not True:
        problems.append("hostPID is not true (NVML reports host PIDs)")

    node_name = env_entry(container, "NODE_NAME") or {}
    field = node_name.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field != "spec.nodeName":
        problems.append("NODE_NAME does not come from fieldRef spec.nodeName")
    if (env_entry(container, "NVIDIA_VISIBLE_DEVICES") or {}).get("value") != "all":
        problems.append("NVIDIA_VISIBLE_DEVICES is not all")
    capabilities = (env_entry(container, "NVIDIA_DRIVER_CAPABILITIES") or {}).get("value", "")
    if "utility" not in capabilities.split(","):
        problems.append("NVIDIA_DRIVER_CAPABILITIES lacks utility (NVML)")

    if ENRICHER_PORT not in [p.get("containerPort") for p in container.get("ports", [])]:
        problems.append("container port 9401 is not declared")
    listen = enricher_setting(container, "--web.listen-address", ":9401")
    if not listen.endswith(f":{ENRICHER_PORT}"):
        problems.append(f"--web.listen-address {listen} is not port 9401")
    for probe_name in ("livenessProbe", "readinessProbe"):
        get = container.get(probe_name, {}).get("httpGet", {})
        if get.get("path") != "/healthz" or port_number(container, get.get("port", "")) != 9401:
            problems.append(f"{probe_name} is not httpGet /healthz on 9401")

    security = effective_security(spec, container)
    expected = {
        "runAsNonRoot": uid != 0,
        "runAsUser": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
    }
    for key, value in expected.items():
        if security.get(key) != value:
            problems.append(f"securityContext.{key} is {security.get(key)!r}, not {value!r}")
    if uid != 0 and bool_flag(container.get("args", []), "--kubelet.enabled") is not False:
        # The kubelet's socket is root-only: the source would only ever report itself down.
        problems.append(f"UID {uid} without --no-kubelet.enabled")
    if security.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("capabilities do not drop ALL")
    if security.get("capabilities", {}).get("add"):
        problems.append(f"capabilities added: {security['capabilities']['add']}")
    if security.get("privileged"):
        problems.append("the enricher is privileged")
    if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append("seccompProfile is not RuntimeDefault")

    problems += resource_problems(container)
    problems += sizing_problems(container)

    image = container.get("image", "")
    if image != f"{ENRICHER_IMAGE_REPO}:{project_version()}":
        problems.append(f"image {image} is not {ENRICHER_IMAGE_REPO}:{project_version()}")
    if "command" in container:
        problems.append("command overrides the image's ENTRYPOINT")
    if container.get("args", ["serve"])[:1] != ["serve"]:
        problems.append("args do not start with the serve command")

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    pod_resources = [
        m for m in container.get("volumeMounts", []) if m.get("mountPath") == POD_RESOURCES_DIR
    ]
    kubelet_off = bool_flag(container.get("args", []), "--kubelet.enabled") is False
    if kubelet_off and pod_resources:
        # Least privilege: a hostPath the source that reads it is switched off for.
        problems.append(f"{POD_RESOURCES_DIR} is mounted with --no-kubelet.enabled")
    elif not pod_resources and not kubelet_off:
        problems.append(f"{POD_RESOURCES_DIR} is not mounted")
    for mount in pod_resources:
        host = volumes.get(mount["name"], {}).get("hostPath", {}).get("path")
        if mount.get("readOnly") is not True or host != POD_RESOURCES_DIR:
            problems.append(f"{POD_RESOURCES_DIR} is not a read-only mount of the host's")

    if not has_api_token(spec, container):
        problems.append("the enricher has no ServiceAccount token for its pod watch")

    required = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    selector_keys = list(spec.get("nodeSelector", {})) + [
        e.get("key", "")
        for term in required.get("nodeSelectorTerms", [])
        for e in term.get("matchExpressions", [])
    ]
    if not any(k.startswith("nvidia.com/gpu") for k in selector_keys):
        problems.append("no node selection on an nvidia.com/gpu* label")
    tolerated = [
        t
        for t in spec.get("tolerations", [])
        if t.get("key") == "nvidia.com/gpu" or (t.get("operator") == "Exists" and "key" not in t)
    ]
    if not tolerated:
        problems.append("the nvidia.com/gpu taint is not tolerated")
    return problems


def resource_problems(container: Doc) -> list[str]:
    resources = container.get("resources", {})
    return [
        f"{container.get('name')}: no {kind}.{name}"
        for kind in ("requests", "limits")
        for name in ("cpu", "memory")
        if name not in resources.get(kind, {})
    ]


_QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi)?")
_BINARY_SUFFIX = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
# The bodies an enricher may hold at once beside its steady state, at --upstream.max-bytes: the
# body as it came, its decoded text and its rewrite.
LIMIT_BODIES = 3


def memory_bytes(quantity: object) -> int | None:
    """A memory quantity as the manifests write it (``128Mi``, ``256Mi``, bytes), in bytes;
    None for any other form (the sizing check then reports it)."""
    m = _QUANTITY.fullmatch(str(quantity))
    return int(m.group(1)) * _BINARY_SUFFIX[m.group(2)] if m is not None else None


@functools.cache
def measured_peak_rss_bytes() -> int:
    """The peak RSS of the enricher in the benchmark run bench/README.md records (mig56, the
    largest node the benchmark has, every source on: the pod watch and the kubelet over
    gRPC), from its Memory block."""
    text = (ROOT / "bench" / "README.md").read_text()
    m = re.search(r"(?m)^Memory \(enricher RSS MiB.*\n.*; peak ([0-9.]+);", text)
    assert m is not None, "bench/README.md records no Memory block with a peak RSS"
    return int(float(m.group(1)) * (1 << 20))


def sizing_problems(container: Doc) -> list[str]:
    """The enricher's memory request holds what it measurably uses (a pod using more than
    its requests is among the first the kubelet evicts under memory pressure: the node's
    metrics would go with it), and its limit holds that plus LIMIT_BODIES bodies at
    --upstream.max-bytes."""
    from enricher.config import Config

    memory = {
        kind: container.get("resources", {}).get(kind, {}).get("memory")
        for kind in ("requests", "limits")
    }
    request, limit = memory_bytes(memory["requests"]), memory_bytes(memory["limits"])
    if request is None or limit is None:
        return [f"memory {memory}: not quantities in Ki, Mi, Gi or bytes"]
    peak = measured_peak_rss_bytes()
    problems = []
    if request < peak:
        problems.append(
            f"memory request {memory['requests']} is below the measured peak RSS "
            f"({peak / (1 << 20):.1f} MiB, bench/README.md)"
        )
    room = peak + LIMIT_BODIES * Config().upstream_max_bytes
    if limit < room:
        problems.append(
            f"memory limit {memory['limits']} leaves no room for {LIMIT_BODIES} bodies at "
            f"--upstream.max-bytes over the measured peak ({room / (1 << 20):.0f} MiB)"
        )
    return problems


def other_container_problems(docs: Docs) -> list[str]:
    """Containers beside the enricher: only dcgm-exporter, with only its documented exception."""
    problems = []
    for workload in of_kind(docs, *WORKLOAD_KINDS):
        spec = pod_spec(workload)
        for c in all_containers(spec):
            if c.get("name") == ENRICHER_CONTAINER:
                continue
            if not c.get("image", "").startswith(EXPORTER_IMAGE_REPO + ":"):
                problems.append(f"unexpected container {c.get('name')} ({c.get('image')})")
            security = c.get("securityContext", {})
            added = set(security.get("capabilities", {}).get("add", []))
            if not added <= {"SYS_ADMIN"}:
                problems.append(f"{c.get('name')}: capabilities beyond SYS_ADMIN: {added}")
            if security.get("privileged"):
                problems.append(f"{c.get('name')} is privileged")
            problems += resource_problems(c)
    return problems


def exporter_listen_address(container: Doc) -> str:
    """dcgm-exporter's listen address: -a/--address beats DCGM_EXPORTER_LISTEN beats :9400."""
    args = container.get("args", [])
    for flag in ("--address", "-a"):
        value = flag_value(args, flag)
        if value is not None:
            return value
    env = env_entry(container, "DCGM_EXPORTER_LISTEN")
    return str(env["value"]) if env and "value" in env else ":9400"


def sidecar_problems(docs: Docs) -> list[str]:
    """dcgm-exporter is reachable from the enricher only, on the port the enricher scrapes."""
    problems = []
    workload, enricher = enricher_of(docs)
    spec = pod_spec(workload)
    exporters = [c for c in spec["containers"] if c.get("name") != ENRICHER_CONTAINER]
    if len(exporters) != 1:
        return [f"expected dcgm-exporter beside the enricher, found {len(exporters)} others"]
    exporter = exporters[0]
    host, _, port = exporter_listen_address(exporter).rpartition(":")
    if host != "127.0.0.1":
        problems.append(f"dcgm-exporter listens on {host or 'every address'}, not 127.0.0.1")
    upstream = urlsplit(enricher_setting(enricher, "--upstream.url", DEFAULT_UPSTREAM_URL))
    if upstream.hostname != "127.0.0.1" or str(upstream.port) != port:
        problems.append(f"the enricher scrapes {upstream.netloc}, the exporter is on :{port}")
    if bool_flag(enricher.get("args", []), "--upstream.discover-pod"):
        problems.append("the sidecar must scrape loopback, not discover a pod")
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe_name in exporter:
            problems.append(
                f"dcgm-exporter has a {probe_name}: the kubelet cannot reach "
                "a loopback-only listener"
            )
    if exporter.get("ports"):
        problems.append("dcgm-exporter declares a port it does not serve on the pod IP")
    if has_api_token(spec, exporter):
        problems.append("dcgm-exporter gets the enricher's API token")
    # Hardened as far as DCGM allows (docs/security.md): the runtime's default syscall filter,
    # a read-only root, and its writes (the embedded host engine's log) in bounded emptyDirs.
    security = effective_security(spec, exporter)
    if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append("dcgm-exporter's seccompProfile is not RuntimeDefault")
    if security.get("readOnlyRootFilesystem") is not True:
        problems.append("dcgm-exporter's root filesystem is writable")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    writable = {
        m["mountPath"]: m for m in exporter.get("volumeMounts", []) if not m.get("readOnly")
    }
    if sorted(writable) != ["/tmp", "/var/log"]:
        problems.append(f"dcgm-exporter writes to {sorted(writable)}, not /tmp and /var/log")
    for path, mount in writable.items():
        if not volumes.get(mount["name"], {}).get("emptyDir", {}).get("sizeLimit"):
            problems.append(f"dcgm-exporter's {path} is not an emptyDir with a sizeLimit")
    return problems


def gpu_operator_problems(docs: Docs) -> list[str]:
    problems = []
    _, enricher = enricher_of(docs)
    if bool_flag(enricher.get("args", []), "--upstream.discover-pod") is not True:
        problems.append("--upstream.discover-pod is not passed")
    selector = enricher_setting(enricher, "--upstream.pod-selector", DEFAULT_POD_SELECTOR)
    if selector != DEFAULT_POD_SELECTOR:
        problems.append(f"pod selector {selector} is not the GPU Operator's label")
    # The exporter is looked for in the enricher's own namespace, whatever it is called: the
    # downward API's, or the workload's namespace written out.
    workload, _ = enricher_of(docs)
    namespace = enricher_setting(enricher, "--upstream.pod-namespace", "gpu-operator")
    variable = re.fullmatch(r"\$\((\w+)\)", namespace)
    field = (env_entry(enricher, variable[1]) or {}) if variable else {}
    from_pod = field.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if from_pod != "metadata.namespace" and namespace != workload["metadata"].get("namespace"):
        problems.append(f"--upstream.pod-namespace {namespace} is not the enricher's namespace")
    # The operator's MPS control daemon runs in its namespace too, with its label (#30).
    defaults = Config()
    mps_namespaces = enricher_setting(
        enricher, "--mps.daemon-pod-namespace", ",".join(defaults.mps_daemon_pod_namespace)
    ).split(",")
    own = {workload["metadata"].get("namespace")}
    own |= {f"$({v})" for v in _downward_variables(enricher, "metadata.namespace")}
    if not own & set(mps_namespaces):
        problems.append(f"--mps.daemon-pod-namespace {mps_namespaces} misses the operator's")
    mps_selectors = enricher_setting(
        enricher, "--mps.daemon-pod-selector", defaults.mps_daemon_pod_selector
    ).split(";")
    if OPERATOR_MPS_SELECTOR not in mps_selectors:
        problems.append(f"--mps.daemon-pod-selector {mps_selectors} misses the operator's label")
    if any(
        c.get("image", "").startswith(EXPORTER_IMAGE_REPO)
        for w in of_kind(docs, *WORKLOAD_KINDS)
        for c in all_containers(pod_spec(w))
    ):
        problems.append("a second dcgm-exporter beside the operator's")
    if of_kind(docs, "Namespace"):
        problems.append("a Namespace object: `kubectl delete -k` would delete gpu-operator")
    return problems


def patch_problems(docs: Docs) -> list[str]:
    workload, _ = enricher_of(docs)
    names = [c.get("name") for c in pod_spec(workload)["containers"]]
    problems = []
    if sorted(names) != sorted(["exporter", ENRICHER_CONTAINER]):
        problems.append(f"patched DaemonSet has containers {names}")
    if workload["metadata"]["name"] != "dcgm-exporter":
        problems.append("the chart's DaemonSet was not the one patched")
    return problems


def namespace_problems(docs: Docs, namespace: str) -> list[str]:
    problems = []
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind in CLUSTER_SCOPED:
            if "namespace" in meta:
                problems.append(f"cluster-scoped {kind} has a namespace")
        elif meta.get("namespace") != namespace:
            problems.append(f"{kind}/{meta['name']} is in {meta.get('namespace')}, not {namespace}")
    for ns in of_kind(docs, "Namespace"):
        if ns["metadata"]["name"] != namespace:
            problems.append(f"Namespace object {ns['metadata']['name']} is not {namespace}")
        # hostPID, hostPath and SYS_ADMIN are all rejected below the privileged level.
        level = ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
        if level != "privileged":
            problems.append(f"Namespace enforces Pod Security level {level!r}")
    return problems


def all_problems(entry: EntryPoint, docs: Docs) -> list[str]:
    """Every invariant for one deployable entry point."""
    workload, container = enricher_of(docs)
    problems = (
        image_problems(docs)
        + rbac_problems(docs)
        + binding_problems(docs, entry.namespace)
        + monitor_problems(docs)
        + wiring_problems(docs)
        + enricher_problems(workload, container, entry.uid)
        + other_container_problems(docs)
        + namespace_problems(docs, entry.namespace)
        + scc_problems(docs)
    )
    extra: dict[str, Callable[[Docs], list[str]]] = {
        "sidecar": sidecar_problems,
        "gpu-operator": gpu_operator_problems,
        "patch": patch_problems,
    }
    return problems + extra[entry.mode](docs)


# Settings that weaken isolation must carry a comment saying why, in the YAML we ship.
EXCEPTION = re.compile(
    r"hostPID:\s*true|SYS_ADMIN|runAsUser:\s*0\b|runAsNonRoot:\s*false|hostPath:"
    r"|privileged|hostNetwork:\s*true"
)


def uncommented_exceptions(text: str) -> list[int]:
    """Line numbers of exception settings with no comment on the line or above its block.

    A comment counts when it is on the same line, or above the setting within its own mapping
    or the next two enclosing ones (so one comment can explain a whole securityContext).
    """
    lines = text.splitlines()
    missing = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#") or not EXCEPTION.search(line) or "#" in line:
            continue
        indent = len(line) - len(line.lstrip())
        climbs, found = 0, False
        for above in reversed(lines[max(0, number - 12) : number]):
            if not above.strip():
                continue
            if above.strip().startswith("#"):
                found = True
                break
            above_indent = len(above) - len(above.lstrip())
            if above_indent < indent:
                climbs += 1
                if climbs > 2:
                    break
                indent = above_indent
        if not found:
            missing.append(number + 1)
    return missing


# --------------------------------------------------------------------------- schemas

_DURATION = {"type": "string", "pattern": r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
_ENDPOINT_COMMON = {
    "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https"]},
    "interval": _DURATION,
    "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "relabelings": {"type": "array", "items": {"type": "object"}},
    "metricRelabelings": {"type": "array", "items": {"type": "object"}},
}
_SECRET_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "key"],
    "properties": {
        "name": {"type": "string"},
        "key": {"type": "string"},
        "optional": {"type": "boolean"},
    },
}
_SECRET_OR_CONFIGMAP = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY},
}
_TLS_VERSION = {"enum": ["TLS10", "TLS11", "TLS12", "TLS13"]}
# SafeTLSConfig (a PodMonitor's): everything from Secrets or ConfigMaps.
_SAFE_TLS_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ca": _SECRET_OR_CONFIGMAP,
        "cert": _SECRET_OR_CONFIGMAP,
        "keySecret": _SECRET_KEY,
        "serverName": {"type": "string"},
        "insecureSkipVerify": {"type": "boolean"},
        "minVersion": _TLS_VERSION,
        "maxVersion": _TLS_VERSION,
    },
}
# TLSConfig (a ServiceMonitor's): also files in the Prometheus container.
_TLS_CONFIG = {
    **_SAFE_TLS_CONFIG,
    "properties": {
        **_SAFE_TLS_CONFIG["properties"],
        "caFile": {"type": "string"},
        "certFile": {"type": "string"},
        "keyFile": {"type": "string"},
    },
}
_ENDPOINT_COMMON["basicAuth"] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["username", "password"],
    "properties": {"username": _SECRET_KEY, "password": _SECRET_KEY},
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "items": {"type": "string"}},
    },
}


def _monitor_schema(
    kind: str, endpoints_key: str, endpoint_props: dict[str, Any], tls_config: Doc
) -> Doc:
    endpoint = {
        "type": "object",
        "additionalProperties": False,
        "properties": {**_ENDPOINT_COMMON, **endpoint_props, "tlsConfig": tls_config},
        "anyOf": [{"required": [k]} for k in endpoint_props],
    }
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                    "namespace": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", endpoints_key],
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    "jobLabel": {"type": "string"},
                    endpoints_key: {"type": "array", "minItems": 1, "items": endpoint},
                },
            },
        },
    }


# The subset of the Prometheus Operator CRDs (monitoring.coreos.com/v1) that we use, strict
# about unknown fields so a misspelt `honorlabels` fails here rather than being pruned by the
# API server.
MONITOR_SCHEMAS = {
    "ServiceMonitor": _monitor_schema(
        "ServiceMonitor",
        "endpoints",
        {"port": {"type": "string"}, "targetPort": {"type": ["integer", "string"]}},
        _TLS_CONFIG,
    ),
    "PodMonitor": _monitor_schema(
        "PodMonitor",
        "podMetricsEndpoints",
        {"port": {"type": "string"}, "portNumber": {"type": "integer"}},
        _SAFE_TLS_CONFIG,
    ),
}


# OpenShift's SecurityContextConstraints (security.openshift.io/v1), from the CRD in
# openshift/api security/v1/zz_generated.crd-manifests/...securitycontextconstraints-Default
# (commit 9582650e): its fields and required ones, strict about the rest.
_STRATEGY = {"type": ["object", "null"]}
_STRINGS = {"type": ["array", "null"], "items": {"type": "string"}}
_SCC_FLAGS = [
    "allowHostDirVolumePlugin",
    "allowHostIPC",
    "allowHostNetwork",
    "allowHostPID",
    "allowHostPorts",
    "allowPrivilegedContainer",
    "readOnlyRootFilesystem",
]
_SCC_LISTS = [
    "allowedCapabilities",
    "defaultAddCapabilities",
    "requiredDropCapabilities",
    "allowedUnsafeSysctls",
    "forbiddenSysctls",
    "groups",
    "users",
    "seccompProfiles",
    "volumes",
]
_SCC_REQUIRED = [
    "apiVersion",
    "kind",
    "metadata",
    "allowHostDirVolumePlugin",
    "allowHostIPC",
    "allowHostNetwork",
    "allowHostPID",
    "allowHostPorts",
    "allowPrivilegedContainer",
    "allowedCapabilities",
    "defaultAddCapabilities",
    "priority",
    "readOnlyRootFilesystem",
    "requiredDropCapabilities",
    "volumes",
]
SCC_SCHEMA: Doc = {
    "type": "object",
    "additionalProperties": False,
    "required": _SCC_REQUIRED,
    "properties": {
        "apiVersion": {"const": "security.openshift.io/v1"},
        "kind": {"const": "SecurityContextConstraints"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "namespace": False},
        },
        **{k: {"type": "boolean"} for k in _SCC_FLAGS},
        "allowPrivilegeEscalation": {"type": ["boolean", "null"]},
        "defaultAllowPrivilegeEscalation": {"type": ["boolean", "null"]},
        **{k: _STRINGS for k in _SCC_LISTS},
        "allowedFlexVolumes": {"type": ["array", "null"]},
        "priority": {"type": ["integer", "null"]},
        "fsGroup": _STRATEGY,
        "supplementalGroups": _STRATEGY,
        "runAsUser": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "type": {"enum": ["MustRunAs", "MustRunAsRange", "MustRunAsNonRoot", "RunAsAny"]},
                "uid": {"type": "integer"},
                "uidRangeMin": {"type": "integer"},
                "uidRangeMax": {"type": "integer"},
            },
        },
        "seLinuxContext": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "type": {"enum": ["MustRunAs", "RunAsAny"]},
                "seLinuxOptions": {"type": "object"},
            },
        },
    },
}


def schema_errors(doc: Doc, k8s_version: str) -> list[str]:
    """Schema violations of one object: Kubernetes kinds strictly, monitors and OpenShift's
    SCC by our subset."""
    if doc["kind"] == "SecurityContextConstraints":
        validator = jsonschema.Draft202012Validator(SCC_SCHEMA)
        return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    if doc["kind"] == "PrometheusRule":
        validator = jsonschema.Draft202012Validator(PROMETHEUS_RULE_SCHEMA)
        return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    if doc["kind"] in MONITOR_SCHEMAS:
        validator = jsonschema.Draft202012Validator(MONITOR_SCHEMAS[doc["kind"]])
        return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    import kubernetes_validate  # a test extra: slow to import, so only when needed

    try:
        kubernetes_validate.validate(doc, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{list(e.absolute_path)}: {e.message}"]
    return []


# --------------------------------------------------------------------------- tests: building


def test_every_kustomization_is_known() -> None:
    """A new entry point or component must be added to this file's lists to be checked."""
    found = kustomization_dirs()
    entries = {e.path for e in ENTRY_POINTS} | set(LIBRARIES) | set(COMPANIONS)
    assert {p for p, kind in found.items() if kind == "Kustomization"} == entries
    components = {p for p, kind in found.items() if kind == "Component"}
    assert components == {
        "components/servicemonitor",
        "components/podmonitor",
        "components/runtimeclass-nvidia",
        "components/add-to-dcgm-exporter",
        # Checked in tests/test_rules.py, built over the sidecar overlay as docs/alerts.md shows.
        "components/runbook-url",
        "monitoring",
    }


@needs_kubectl
@pytest.mark.parametrize("path", [e.path for e in ENTRY_POINTS] + [*LIBRARIES, *COMPANIONS])
def test_entry_point_builds(path: str) -> None:
    docs = build(path)
    assert docs, f"{path} built to nothing"
    assert all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs)


@needs_kubectl
@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("path", [e.path for e in ENTRY_POINTS] + [*LIBRARIES, *COMPANIONS])
def test_objects_match_schemas(path: str, k8s_version: str) -> None:
    errors = [
        f"{d['kind']}/{d['metadata']['name']}: {err}"
        for d in build(path)
        for err in schema_errors(d, k8s_version)
    ]
    assert errors == []


@needs_kubectl
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: e.path)
def test_entry_point_invariants(entry: EntryPoint) -> None:
    assert all_problems(entry, build(entry.path)) == []


@needs_kubectl
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: e.path)
def test_podmonitor_swap_builds_and_keeps_invariants(entry: EntryPoint, tmp_path: Path) -> None:
    docs = edited_overlay(
        tmp_path, entry.path, "- ../../components/servicemonitor", "- ../../components/podmonitor"
    )
    assert [m["kind"] for m in of_kind(docs, *MONITOR_KINDS)] == ["PodMonitor"]
    assert all_problems(entry, docs) == []
    assert [e for d in docs for e in schema_errors(d, K8S_VERSIONS[-1])] == []


@needs_kubectl
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: e.path)
def test_without_prometheus_operator(entry: EntryPoint, tmp_path: Path) -> None:
    """Dropping the monitor and monitoring lines leaves nothing that needs the Prometheus
    Operator's CRDs (the rules then go to Prometheus as the plain rules file)."""
    docs = edited_overlay(
        tmp_path,
        entry.path,
        "- ../../components/servicemonitor\n"
        "  # The alert and recording rules (PrometheusRule) and the Grafana dashboard ConfigMap.\n"
        "  - ../../monitoring",
        "",
    )
    assert {d["apiVersion"].split("/")[0] for d in docs} <= {
        "v1",
        "apps",
        "rbac.authorization.k8s.io",
    }
    assert monitor_problems(docs) == ["expected exactly one ServiceMonitor or PodMonitor, found []"]
    assert wiring_problems(docs) == []


@needs_kubectl
def test_a_second_install_with_a_name_prefix_shares_no_cluster_scoped_name(
    tmp_path: Path,
) -> None:
    """The overlays name their ClusterRole and ClusterRoleBinding dcgm-enricher, whatever the
    namespace: a second install in another namespace sets namePrefix (docs/install.md), which
    renames every cluster-scoped object and the references to it, and keeps every invariant."""
    first = build("overlays/sidecar")
    second = edited_overlay(
        tmp_path,
        "overlays/sidecar",
        "namespace: gpu-monitoring",
        "namespace: gpu-monitoring-b\nnamePrefix: b-",
    )
    entry = EntryPoint("overlays/sidecar (namePrefix)", "gpu-monitoring-b", "sidecar")
    assert all_problems(entry, second) == []

    def cluster_names(docs: Docs) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in CLUSTER_SCOPED}

    assert cluster_names(first) & cluster_names(second) == set()
    assert ("ClusterRole", "b-dcgm-enricher") in cluster_names(second)


@needs_kubectl
def test_patch_follows_the_release_name(tmp_path: Path) -> None:
    """Another release name renames the DaemonSet and its ServiceAccount; the component
    still finds the DaemonSet by label and binds the renamed ServiceAccount."""
    entry = MANIFESTS / "patches" / "existing-dcgm-exporter"
    chart = (entry / "dcgm-exporter-chart.yaml").read_text()
    # What `helm install gpu-metrics` changes: object names and the instance label; the
    # app.kubernetes.io/name label stays the chart's name.
    renamed = re.sub(
        r"(?m)^(\s+(?:name|serviceAccountName): )dcgm-exporter$",
        r"\1gpu-metrics-dcgm-exporter",
        chart,
    ).replace(
        "app.kubernetes.io/instance: dcgm-exporter", "app.kubernetes.io/instance: gpu-metrics"
    )
    assert renamed.count("gpu-metrics-dcgm-exporter") == 4  # SA, Service, DaemonSet, its SA
    (tmp_path / "chart.yaml").write_text(renamed)
    kustomization = yaml.safe_load((entry / "kustomization.yaml").read_text())
    kustomization["resources"] = ["chart.yaml"]
    kustomization["namespace"] = "monitoring"
    kustomization["components"] = [
        os.path.relpath(entry / c, tmp_path) for c in kustomization["components"]
    ]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = kustomize(tmp_path)
    workload, _ = enricher_of(docs)
    assert workload["metadata"]["name"] == "gpu-metrics-dcgm-exporter"
    assert binding_problems(docs, "monitoring") == []
    assert wiring_problems(docs) == []


@needs_kubectl
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: e.path)
def test_shipped_entry_points_use_a_servicemonitor(entry: EntryPoint) -> None:
    """The default is a ServiceMonitor on the enricher's Service and nothing else
    (wiring_problems checks that it selects no other Service, e.g. the exporter's)."""
    assert [m["kind"] for m in of_kind(build(entry.path), *MONITOR_KINDS)] == ["ServiceMonitor"]


@needs_kubectl
def test_runtimeclass_component_only_in_gpu_operator_overlay() -> None:
    classes = {
        e.path: [pod_spec(w).get("runtimeClassName") for w in of_kind(build(e.path), "DaemonSet")]
        for e in ENTRY_POINTS
    }
    assert classes["overlays/gpu-operator"] == ["nvidia"]
    assert classes["overlays/sidecar"] == [None]


@needs_kubectl
def test_base_has_no_workload_and_no_namespace() -> None:
    """The base stays namespace-agnostic; overlays decide where it goes."""
    docs = build("base")
    assert of_kind(docs, *WORKLOAD_KINDS) == []
    assert [d for d in docs if "namespace" in d["metadata"]] == []
    assert rbac_problems(docs) == []


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(MANIFESTS).as_posix() for p in MANIFESTS.rglob("*.yaml")),
)
def test_exceptions_are_commented(path: str) -> None:
    assert uncommented_exceptions((MANIFESTS / path).read_text()) == []


def test_enricher_flags_exist_in_the_cli() -> None:
    """Every flag the manifests pass is one `dcgm-enricher serve` knows (the real parser)."""
    args: set[str] = set()
    for file in MANIFESTS.rglob("*.yaml"):
        for doc in yaml.safe_load_all(file.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") not in WORKLOAD_KINDS:
                continue
            for c in pod_spec(doc).get("containers", []):
                if c.get("name") == ENRICHER_CONTAINER:
                    args.update(a.split("=", 1)[0] for a in c.get("args", [])[1:])
    assert "--upstream.discover-pod" in args
    proc = run_tool([sys.executable, "-m", "enricher", "serve", "--help"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert sorted(a for a in args if a not in proc.stdout) == []


# --------------------------------------------------------------------------- tests: mutations


def _enricher(docs: list[Doc]) -> Doc:
    return next(
        c
        for d in docs
        if d["kind"] in WORKLOAD_KINDS
        for c in pod_spec(d)["containers"]
        if c["name"] == ENRICHER_CONTAINER
    )


def _exporter(docs: list[Doc]) -> Doc:
    return next(
        c
        for d in docs
        if d["kind"] in WORKLOAD_KINDS
        for c in pod_spec(d)["containers"]
        if c["name"] != ENRICHER_CONTAINER
    )


def _pod(docs: list[Doc]) -> Doc:
    return pod_spec(of_kind(tuple(docs), "DaemonSet")[0])


def _first(docs: list[Doc], kind: str) -> Doc:
    return of_kind(tuple(docs), kind)[0]


def _set_env(container: Doc, name: str, value: str) -> None:
    container["env"] = [e for e in container.get("env", []) if e["name"] != name]
    container["env"].append({"name": name, "value": value})


Mutation = Callable[[list[Doc]], None]

MUTATIONS = [
    pytest.param(
        lambda d: _first(d, "ClusterRole")["rules"][0]["verbs"].append("delete"),
        "verbs",
        id="extra-verb",
    ),
    pytest.param(
        lambda d: _first(d, "ClusterRole")["rules"][0]["resources"].append("secrets"),
        "resources",
        id="extra-resource",
    ),
    pytest.param(
        lambda d: _first(d, "ClusterRole")["rules"][0].update(apiGroups=["*"]),
        "apiGroups",
        id="any-api-group",
    ),
    pytest.param(
        lambda d: _first(d, "ClusterRole")["rules"].append(
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
        ),
        "rules",
        id="second-rule",
    ),
    pytest.param(
        lambda d: d.append({"kind": "Role", "metadata": {"name": "x"}, "rules": []}),
        "ClusterRole",
        id="extra-role",
    ),
    pytest.param(
        lambda d: _first(d, "ClusterRoleBinding")["subjects"][0].update(name="default"),
        "subjects",
        id="binding-wrong-account",
    ),
    pytest.param(
        lambda d: _first(d, "ClusterRoleBinding")["subjects"][0].update(namespace="kube-system"),
        "subjects",
        id="binding-wrong-namespace",
    ),
    pytest.param(
        lambda d: _enricher(d)["args"].append("--no-kube.resource-slices"),
        "2 rules, expected 1",
        id="dra-lookup-off-rule-kept",
    ),
    pytest.param(
        lambda d: _enricher(d)["args"].append("--no-kubelet.enabled"),
        "is mounted with --no-kubelet.enabled",
        id="kubelet-source-off-mount-kept",
    ),
    pytest.param(
        lambda d: _first(d, "ServiceMonitor")["spec"]["endpoints"][0].update(honorLabels=False),
        "honorLabels",
        id="honor-labels-false",
    ),
    pytest.param(
        lambda d: _first(d, "ServiceMonitor")["spec"]["endpoints"][0].pop("honorLabels"),
        "honorLabels",
        id="honor-labels-missing",
    ),
    pytest.param(
        lambda d: _first(d, "ServiceMonitor")["spec"]["endpoints"][0].update(scrapeTimeout="1m"),
        "scrapeTimeout",
        id="timeout-over-interval",
    ),
    pytest.param(
        lambda d: d.append(
            {
                "kind": "PodMonitor",
                "metadata": {"name": "x", "namespace": "gpu-monitoring"},
                "spec": {"podMetricsEndpoints": [{"port": "enricher", "honorLabels": True}]},
            }
        ),
        "exactly one",
        id="double-scrape",
    ),
    pytest.param(
        lambda d: _first(d, "ServiceMonitor")["spec"]["endpoints"][0].update(port="web"),
        "reaches no enricher",
        id="monitor-wrong-port",
    ),
    pytest.param(
        lambda d: _first(d, "Service")["spec"].update(selector={"app": "other"}),
        "no Service port",
        id="service-selects-nothing",
    ),
    pytest.param(
        lambda d: d.append(
            {
                "kind": "Service",
                "metadata": {
                    "name": "raw-exporter",
                    "namespace": "gpu-monitoring",
                    "labels": {"app.kubernetes.io/name": "dcgm-enricher"},
                },
                "spec": {"selector": {"app": "x"}, "ports": [{"name": "metrics", "port": 9400}]},
            }
        ),
        "also selects",
        id="monitor-selects-another-service",
    ),
    pytest.param(
        lambda d: _pod(d).update(
            nodeSelector={},
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/os", "operator": "Exists"}
                                ]
                            }
                        ]
                    }
                }
            },
        ),
        "node selection",
        id="affinity-not-on-gpu-label",
    ),
    pytest.param(lambda d: _pod(d).pop("hostPID"), "hostPID", id="no-host-pid"),
    pytest.param(
        lambda d: _enricher(d)["env"].__setitem__(
            0, {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        ),
        "NODE_NAME",
        id="node-name-wrong-field",
    ),
    pytest.param(
        lambda d: _enricher(d).update(image=f"{ENRICHER_IMAGE_REPO}:latest"),
        "not pinned",
        id="enricher-latest",
    ),
    pytest.param(
        lambda d: _exporter(d).update(image=EXPORTER_IMAGE_REPO),
        "no tag",
        id="exporter-untagged",
    ),
    pytest.param(
        lambda d: _enricher(d).update(image=f"{ENRICHER_IMAGE_REPO}:0.0.9"),
        "is not",
        id="enricher-tag-not-project-version",
    ),
    pytest.param(
        lambda d: _enricher(d)["securityContext"].update(runAsUser=1000),
        "runAsUser",
        id="enricher-other-uid",
    ),
    pytest.param(
        lambda d: _enricher(d)["securityContext"].pop("readOnlyRootFilesystem"),
        "readOnlyRootFilesystem",
        id="writable-root",
    ),
    pytest.param(
        lambda d: _enricher(d)["securityContext"]["capabilities"].update(add=["NET_ADMIN"]),
        "capabilities added",
        id="enricher-capability",
    ),
    pytest.param(
        lambda d: _enricher(d)["securityContext"].pop("seccompProfile"),
        "seccompProfile",
        id="no-seccomp",
    ),
    pytest.param(
        lambda d: _exporter(d)["securityContext"].pop("seccompProfile"),
        "dcgm-exporter's seccompProfile",
        id="exporter-no-seccomp",
    ),
    pytest.param(
        lambda d: _exporter(d)["securityContext"].update(readOnlyRootFilesystem=False),
        "dcgm-exporter's root filesystem is writable",
        id="exporter-writable-root",
    ),
    pytest.param(
        lambda d: _pod(d)["volumes"][1]["emptyDir"].pop("sizeLimit"),
        "dcgm-exporter's /var/log is not an emptyDir with a sizeLimit",
        id="exporter-unbounded-log",
    ),
    pytest.param(
        lambda d: _enricher(d)["securityContext"].update(allowPrivilegeEscalation=True),
        "allowPrivilegeEscalation",
        id="privilege-escalation",
    ),
    pytest.param(
        lambda d: _enricher(d)["readinessProbe"]["httpGet"].update(path="/metrics"),
        "readinessProbe",
        id="probe-path",
    ),
    pytest.param(
        lambda d: _enricher(d)["ports"][0].update(containerPort=8080),
        "9401",
        id="wrong-port",
    ),
    pytest.param(
        lambda d: _enricher(d)["resources"].pop("limits"),
        "limits",
        id="no-limits",
    ),
    pytest.param(
        lambda d: _enricher(d)["resources"]["requests"].update(memory="64Mi"),
        "below the measured peak RSS",
        id="memory-request-under-the-rss",
    ),
    pytest.param(
        lambda d: _enricher(d)["resources"]["limits"].update(memory="128Mi"),
        "leaves no room",
        id="memory-limit-without-room-for-a-body",
    ),
    pytest.param(
        lambda d: _enricher(d)["resources"]["requests"].update(memory="0.1Gi"),
        "not quantities",
        id="memory-request-in-a-form-not-checked",
    ),
    pytest.param(
        lambda d: _enricher(d)["volumeMounts"][0].update(readOnly=False),
        "read-only",
        id="pod-resources-writable",
    ),
    pytest.param(
        lambda d: _set_env(_enricher(d), "NVIDIA_DRIVER_CAPABILITIES", "compute"),
        "utility",
        id="no-utility-capability",
    ),
    pytest.param(
        lambda d: _pod(d).pop("tolerations"),
        "taint",
        id="no-gpu-toleration",
    ),
    pytest.param(
        lambda d: _pod(d).pop("nodeSelector"),
        "node selection",
        id="no-gpu-node-selection",
    ),
    pytest.param(
        lambda d: _enricher(d)["volumeMounts"].pop(),
        "token",
        id="enricher-without-token",
    ),
    pytest.param(
        lambda d: _set_env(_exporter(d), "DCGM_EXPORTER_LISTEN", ":9400"),
        "every address",
        id="exporter-on-all-addresses",
    ),
    pytest.param(
        lambda d: _exporter(d).update(args=["--address", "0.0.0.0:9400"]),
        "not 127.0.0.1",
        id="exporter-address-flag",
    ),
    pytest.param(
        lambda d: _set_env(_exporter(d), "DCGM_EXPORTER_LISTEN", "127.0.0.1:9500"),
        "scrapes",
        id="upstream-port-mismatch",
    ),
    pytest.param(
        lambda d: _exporter(d).update(livenessProbe={"httpGet": {"path": "/health", "port": 9400}}),
        "livenessProbe",
        id="exporter-probe-on-loopback",
    ),
    pytest.param(
        lambda d: _pod(d).pop("automountServiceAccountToken"),
        "API token",
        id="exporter-gets-token",
    ),
    pytest.param(
        lambda d: _exporter(d)["securityContext"]["capabilities"]["add"].append("NET_RAW"),
        "beyond SYS_ADMIN",
        id="exporter-extra-capability",
    ),
    pytest.param(
        lambda d: _first(d, "Namespace")["metadata"]["labels"].clear(),
        "Pod Security",
        id="namespace-not-privileged",
    ),
    pytest.param(
        lambda d: _first(d, "Service")["metadata"].update(namespace="default"),
        "not gpu-monitoring",
        id="object-in-wrong-namespace",
    ),
]


@needs_kubectl
@pytest.mark.parametrize(("mutate", "expected"), MUTATIONS)
def test_invariants_catch(mutate: Mutation, expected: str) -> None:
    docs = copy.deepcopy(list(build("overlays/sidecar")))
    assert all_problems(ENTRY_POINTS[0], tuple(docs)) == []
    mutate(docs)
    problems = all_problems(ENTRY_POINTS[0], tuple(docs))
    assert any(expected in p for p in problems), problems


@needs_kubectl
@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(
            lambda d: _enricher(d)["args"].remove("--upstream.discover-pod"),
            "discover-pod",
            id="no-discovery",
        ),
        pytest.param(
            lambda d: _enricher(d)["args"].append("--no-upstream.discover-pod"),
            "discover-pod",
            id="discovery-turned-off",
        ),
        pytest.param(
            lambda d: _enricher(d)["args"].append("--upstream.pod-selector=app=dcgm"),
            "pod selector",
            id="other-selector",
        ),
        pytest.param(
            lambda d: d.append({"kind": "Namespace", "metadata": {"name": "gpu-operator"}}),
            "Namespace object",
            id="owns-operator-namespace",
        ),
        pytest.param(
            # The flag's default (gpu-operator), installed into OpenShift's namespace.
            lambda d: (
                _enricher(d)["args"].remove("--upstream.pod-namespace=$(POD_NAMESPACE)"),
                _first(d, "DaemonSet")["metadata"].update(namespace="nvidia-gpu-operator"),
            ),
            "is not the enricher's namespace",
            id="default-operator-namespace-elsewhere",
        ),
        pytest.param(
            lambda d: _enricher(d)["env"].remove(env_entry(_enricher(d), "POD_NAMESPACE")),
            "is not the enricher's namespace",
            id="namespace-variable-undefined",
        ),
        pytest.param(
            # The MPS flag's default namespaces, installed into OpenShift's namespace.
            lambda d: (
                _enricher(d)["args"].remove("--mps.daemon-pod-namespace=$(POD_NAMESPACE)"),
                _first(d, "DaemonSet")["metadata"].update(namespace="nvidia-gpu-operator"),
            ),
            "--mps.daemon-pod-namespace",
            id="default-mps-namespace-elsewhere",
        ),
        pytest.param(
            lambda d: _enricher(d)["args"].append("--mps.daemon-pod-selector=app=my-mps"),
            "misses the operator's label",
            id="mps-selector-without-the-operators-label",
        ),
    ],
)
def test_gpu_operator_invariants_catch(mutate: Mutation, expected: str) -> None:
    docs = copy.deepcopy(list(build("overlays/gpu-operator")))
    mutate(docs)
    assert any(expected in p for p in gpu_operator_problems(tuple(docs)))


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        pytest.param("nvcr.io/nvidia/k8s/dcgm-exporter:4.6.1-4.8.4-distroless", True, id="tag"),
        pytest.param("ghcr.io/a/b@sha256:" + "0" * 64, True, id="digest"),
        pytest.param("ghcr.io/a/b:1.0@sha256:" + "a" * 64, True, id="tag-and-digest"),
        pytest.param("localhost:5000/b:1.0", True, id="registry-port-and-tag"),
        pytest.param("localhost:5000/b", False, id="registry-port-no-tag"),
        pytest.param("ghcr.io/a/b", False, id="no-tag"),
        pytest.param("ghcr.io/a/b:latest", False, id="latest"),
        pytest.param("nvidia/dcgm-exporter:latest-ubuntu22.04", False, id="latest-variant"),
        pytest.param("ghcr.io/a/b@sha256:abc", False, id="short-digest"),
        pytest.param("", False, id="empty"),
    ],
)
def test_image_problem(image: str, pinned: bool) -> None:
    assert (image_problem(image) is None) is pinned


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("spec:\n  # why\n  hostPID: true\n", [], id="comment-above"),
        pytest.param("spec:\n  hostPID: true # why\n", [], id="comment-inline"),
        pytest.param("spec:\n  hostPID: true\n", [2], id="hostpid-bare"),
        pytest.param(
            "securityContext:\n  # why\n  runAsUser: 0\n  capabilities:\n    add: [SYS_ADMIN]\n",
            [],
            id="comment-on-enclosing-block",
        ),
        pytest.param(
            "securityContext:\n  runAsUser: 0\n  capabilities:\n    add: [SYS_ADMIN]\n",
            [2, 4],
            id="security-bare",
        ),
        pytest.param(
            "a:\n  # unrelated, three levels up\n  b:\n    c:\n      d:\n        hostPath:\n",
            [6],
            id="comment-too-far-up",
        ),
        pytest.param("spec:\n  hostPID: false\n", [], id="not-an-exception"),
    ],
)
def test_uncommented_exceptions(text: str, expected: list[int]) -> None:
    assert uncommented_exceptions(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("30s", 30, id="seconds"),
        pytest.param("1m30s", 90, id="compound"),
        pytest.param("500ms", 0.5, id="millis"),
        pytest.param("1h", 3600, id="hours"),
    ],
)
def test_parse_duration_seconds(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "1.5s", "s", "30s "])
def test_parse_duration_seconds_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_seconds(text)


@pytest.mark.parametrize(
    ("kind", "mutate", "path"),
    [
        pytest.param(
            "ServiceMonitor",
            lambda m: m["spec"]["endpoints"][0].update(honorlabels=True),
            "endpoints",
            id="misspelt-field",
        ),
        pytest.param(
            "ServiceMonitor",
            lambda m: m["spec"]["endpoints"][0].update(interval="30"),
            "interval",
            id="bad-duration",
        ),
        pytest.param(
            "ServiceMonitor", lambda m: m["spec"].pop("selector"), "selector", id="no-selector"
        ),
        pytest.param(
            "ServiceMonitor",
            lambda m: m["spec"]["endpoints"][0].update(honorLabels="true"),
            "honorLabels",
            id="string-bool",
        ),
        pytest.param(
            "PodMonitor",
            lambda m: m["spec"]["podMetricsEndpoints"][0].pop("port"),
            "podMetricsEndpoints",
            id="no-port",
        ),
    ],
)
def test_monitor_schema_rejects(kind: str, mutate: Callable[[Doc], None], path: str) -> None:
    file = "servicemonitor" if kind == "ServiceMonitor" else "podmonitor"
    monitor = yaml.safe_load((MANIFESTS / "components" / file / f"{file}.yaml").read_text())
    assert schema_errors(monitor, K8S_VERSIONS[-1]) == []
    mutate(monitor)
    errors = schema_errors(monitor, K8S_VERSIONS[-1])
    assert errors and any(path in e for e in errors), errors


@needs_kubectl
def test_kubernetes_schema_rejects_a_misspelt_field() -> None:
    """Strict validation is on: an unknown field is an error, not silently dropped."""
    docs = copy.deepcopy(list(build("overlays/sidecar")))
    daemonset = _first(docs, "DaemonSet")
    pod_spec(daemonset)["hostPid"] = True
    assert any("hostPid" in e for e in schema_errors(daemonset, K8S_VERSIONS[0]))


# --------------------------------------------------------------------------- Prometheus config


def scrape_job() -> Doc:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    jobs = [j for j in config["scrape_configs"] if j["job_name"] == "dcgm-enricher"]
    assert len(jobs) == 1
    job: Doc = jobs[0]
    return job


def test_scrape_config_structure() -> None:
    job = scrape_job()
    assert job["honor_labels"] is True
    roles = [sd["role"] for sd in job["kubernetes_sd_configs"]]
    assert roles and set(roles) <= {"pod", "endpoints"}
    # Target labels named like the enricher's own would be written onto unattributed series.
    targets = {r.get("target_label") for r in job.get("relabel_configs", [])}
    assert not targets & {"pod", "namespace", "container"}
    assert parse_duration_seconds(job["scrape_timeout"]) <= parse_duration_seconds(
        job["scrape_interval"]
    )


@needs_kubectl
def test_scrape_config_keeps_only_the_enricher_port() -> None:
    """The keep rule on the port name matches the enricher's port and no other we ship."""
    keep = [
        r
        for r in scrape_job()["relabel_configs"]
        if r.get("action") == "keep"
        and r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
    ]
    assert len(keep) == 1
    regex = re.compile(keep[0]["regex"])  # Prometheus anchors relabel regexes: fullmatch
    names = {
        (c["name"], p.get("name", ""))
        for e in ENTRY_POINTS
        for w in of_kind(build(e.path), *WORKLOAD_KINDS)
        for c in all_containers(pod_spec(w))
        for p in c.get("ports", [])
    }
    assert {n for n in names if regex.fullmatch(n[1])} == {(ENRICHER_CONTAINER, "enricher")}


def _promtool_check(promtool: str, config: Doc, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return run_tool([promtool, "check", "config", str(path)])


def _promtool_has_kubernetes_sd(promtool: str, tmp_path: Path) -> bool:
    probe = {"scrape_configs": [{"job_name": "p", "kubernetes_sd_configs": [{"role": "pod"}]}]}
    return _promtool_check(promtool, probe, tmp_path).returncode == 0


def _without_kubernetes_sd(config: Doc) -> Doc:
    """The same config with Kubernetes discovery swapped for a static target."""
    config = copy.deepcopy(config)
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["127.0.0.1:9401"]}]
    return config


def test_scrape_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    """promtool checks everything but the discovery block where its build lacks Kubernetes SD."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    if _promtool_has_kubernetes_sd(promtool, tmp_path):
        proc = _promtool_check(promtool, config, tmp_path)
    else:
        proc = _promtool_check(promtool, _without_kubernetes_sd(config), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scrape_config_passes_promtool_with_kubernetes_sd(promtool: str, tmp_path: Path) -> None:
    if not _promtool_has_kubernetes_sd(promtool, tmp_path):
        pytest.skip("this promtool is built without kubernetes_sd_configs (Debian 12's 2.42 is)")
    proc = run_tool([promtool, "check", "config", str(SCRAPE_CONFIG)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def prometheus_targets(
    tmp_path: Path, prom_release: PromRelease
) -> Iterator[Callable[[list[Doc]], Doc]]:
    """Run the real Prometheus (each release) with the job's relabel rules over file targets.

    The targets carry the __meta_kubernetes_* labels that Kubernetes discovery would set, so
    the relabel rules run exactly as written; only the discovery mechanism differs.
    """
    servers = contextlib.ExitStack()
    started = 0

    def run(groups: list[Doc]) -> Doc:
        nonlocal started
        started += 1
        (tmp_path / "targets.json").write_text(json.dumps(groups))
        config = _without_kubernetes_sd(yaml.safe_load(SCRAPE_CONFIG.read_text()))
        job = config["scrape_configs"][0]
        job.pop("static_configs")
        job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
        server = servers.enter_context(
            serve(prom_release, config, tmp_path / f"prometheus-{started}")
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                data: Doc = server.api("targets", timeout=2, state="any")
                seen = len(data["activeTargets"]) + len(data["droppedTargets"])
                if seen == sum(len(g["targets"]) for g in groups):
                    return data
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        pytest.fail("Prometheus did not report the targets:\n" + server.log_tail())

    with servers:
        yield run


def _pod_target(address: str, port_name: str, phase: str, node: str) -> Doc:
    return {
        "targets": [address],
        "labels": {
            "__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_phase": phase,
            "__meta_kubernetes_pod_node_name": node,
            "__meta_kubernetes_pod_name": "dcgm-enricher-x7k2p",
            "__meta_kubernetes_namespace": "gpu-monitoring",
        },
    }


def test_scrape_config_relabeling_in_prometheus(
    prometheus_targets: Callable[[list[Doc]], Doc],
) -> None:
    data = prometheus_targets(
        [
            _pod_target("10.0.0.1:9401", "enricher", "Running", "gpu-node-1"),
            _pod_target("10.0.0.1:9400", "metrics", "Running", "gpu-node-1"),
            _pod_target("10.0.0.2:9401", "enricher", "Pending", "gpu-node-2"),
        ]
    )
    active = [t["labels"] for t in data["activeTargets"]]
    assert active == [{"instance": "10.0.0.1:9401", "job": "dcgm-enricher", "node": "gpu-node-1"}]
    assert len(data["droppedTargets"]) == 2


# --------------------------------------------------------------------------- container image


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip()) for ln in logical]


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = [[]]
    for instruction in dockerfile_instructions():
        if instruction[0] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages  # stages[0] holds the global ARGs


def test_dockerfile_base_images_are_pinned() -> None:
    stages = dockerfile_stages()
    global_args = dict(a.split("=", 1) for kind, a in stages[0] if kind == "ARG" and "=" in a)
    assert len(stages) >= 3, "expected a builder stage and a final stage"
    for stage in stages[1:]:
        image = stage[0][1].split()[0]
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], image)
        assert image_problem(resolved) is None, resolved


def test_dockerfile_final_stage() -> None:
    stages = dockerfile_stages()
    builder, final = stages[1], stages[-1]
    assert builder[0][1].endswith("AS builder")
    instructions = dict(final)  # one of each in the final stage
    assert instructions["USER"].split(":")[0] == str(IMAGE_UID)
    assert json.loads(instructions["ENTRYPOINT"]) == ["/opt/venv/bin/dcgm-enricher"]
    assert json.loads(instructions["CMD"]) == ["serve"]
    assert instructions["EXPOSE"] == str(ENRICHER_PORT)
    copies = [a for kind, a in final if kind == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"], "the final stage gets only the venv"
    assert not [a for kind, a in final if kind == "RUN"], "no shell steps in the final stage"
    args = dict(a.split("=", 1) for kind, a in final if kind == "ARG" and "=" in a)
    assert args["VERSION"] == project_version()
    # The version here; the commit and the repository come from `make image` (from git), and
    # tests/test_image.py reads them off the built image.
    assert "org.opencontainers.image.version" in instructions["LABEL"]


def test_dockerfile_entrypoint_is_the_console_script() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dcgm-enricher\s*=\s*"enricher\.cli:main"', pyproject, re.MULTILINE)


def test_dockerignore_lets_in_what_the_builder_copies() -> None:
    """The context is an allow-list; every COPY source of the builder must be on it."""
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    builder = dockerfile_stages()[1]
    sources = [
        src
        for kind, a in builder
        if kind == "COPY" and not a.startswith("--from")
        for src in shlex.split(a)[:-1]
    ]
    assert sources and all(s.rstrip("/") in allowed for s in sources), sources


# --------------------------------------------------------------------------- docs


def test_documented_kustomize_paths_exist() -> None:
    """Every `kubectl apply -k` / `delete -k` path in the docs is a shipped entry point."""
    texts = [p.read_text() for p in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))]
    paths = {
        m.group(1).rstrip("/")
        for text in texts
        for m in re.finditer(r"kubectl (?:apply|delete) -k (manifests/[^\s`]+)", text)
    }
    assert paths, "the docs show no kubectl apply -k command"
    entries = {"manifests/" + p for p in [e.path for e in ENTRY_POINTS] + list(COMPANIONS)}
    assert paths <= entries, paths - entries
