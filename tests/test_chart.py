"""Checks of the Helm chart charts/dcgm-enricher, with the real Helm 3 and Helm 4.

Every values profile in the chart's ci/ folder is linted (``helm lint --strict``) and rendered
(``helm template``) with both, each rendered object is validated against the Kubernetes schemas
and holds the invariants of tests/test_manifests.py, and the sidecar and gpu-operator profiles
render the same objects as ``kubectl kustomize`` of the matching overlays. What differs, on
purpose, and is normalised away before the comparison:

- Helm's own labels (helm.sh/chart, app.kubernetes.io/managed-by, app.kubernetes.io/instance,
  app.kubernetes.io/version). The instance label is also in the chart's selectors, so that two
  releases in one namespace do not select each other's pods.
- The sidecar overlay's Namespace object: a chart does not own its release namespace
  (``helm uninstall`` would delete everything in it); NOTES.txt says how to label it. The
  namespace profile (namespace.create, the release kept in another namespace) renders it, and
  is compared with the overlay's Namespace included.
- The names of the cluster-scoped objects (ClusterRole, ClusterRoleBinding): the chart's carry
  the namespace, <full name>-<namespace>, so that two releases of one name in two namespaces
  never share one; an overlay's are its own, which kustomize's namePrefix and nameSuffix
  change (tests/test_manifests.py).

No cluster is needed.
"""

from __future__ import annotations

import argparse
import base64
import copy
import functools
import json
import os
import re
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

import pytest
import yaml

from devkit.dashboard import BOARDS
from devkit.ports import free_port
from devkit.processes import stop_process
from devkit.prometheus import EVERY_SECOND
from devkit.tools import run_tool
from enricher.cli import build_parser

from .certs import bcrypt_hash
from .conftest import DEEP
from .helmreleases import HelmRelease, releases, require
from .promreleases import PromRelease, serve
from .test_alert_jobs import operator_job, relabel_config
from .test_manifests import (
    CLUSTER_SCOPED,
    IMAGE_UID,
    K8S_VERSIONS,
    MONITOR_KINDS,
    POD_RESOURCES_DIR,
    EntryPoint,
    all_problems,
    binding_problems,
    build,
    edited_overlay,
    enricher_of,
    flag_value,
    needs_kubectl,
    of_kind,
    pod_spec,
    project_version,
    rbac_problems,
    scc_problems,
    schema_errors,
    uncommented_exceptions,
)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "dcgm-enricher"
RELEASE = "dcgm-enricher"
HELM_LABELS = frozenset(
    {
        "helm.sh/chart",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
    }
)

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

Doc = dict[str, Any]
Docs = tuple[Doc, ...]

# Profile (ci/<profile>-values.yaml) -> the namespace it is rendered into, its mode, and the
# kustomize overlay it must equal (None: no overlay renders it as shipped).
PROFILES: dict[str, tuple[str, str, str | None]] = {
    "sidecar": ("gpu-monitoring", "sidecar", "overlays/sidecar"),
    "gpu-operator": ("gpu-operator", "gpu-operator", "overlays/gpu-operator"),
    "podmonitor": ("gpu-monitoring", "sidecar", None),
    "plain-prometheus": ("gpu-monitoring", "sidecar", None),
    "nonroot": ("gpu-monitoring", "sidecar", None),
    "namespace": ("gpu-monitoring", "sidecar", "overlays/sidecar"),
    "tls": ("gpu-monitoring", "sidecar", None),
    "least-privilege": ("nvidia-gpu-operator", "gpu-operator", None),
    "openshift": ("nvidia-gpu-operator", "gpu-operator", None),
}
# Profiles whose release lives in another namespace than its objects (namespace.name).
RELEASE_NAMESPACES = {"namespace": "default"}
# Profiles whose enricher runs as another UID than root (enricher.runAsUser).
UIDS = {"nonroot": IMAGE_UID, "least-privilege": IMAGE_UID}


# The tests that judge what the chart renders run on Helm 4 alone:
# test_helm3_and_helm4_render_the_same holds Helm 3's render of every profile to Helm 4's, byte
# for byte. The long run (make test-deep) runs them on both. What the two releases do
# differently (lint, their version, packaging, the values schema's refusals) runs on both
# always (``each_helm``).
RENDER_RELEASES = releases() if DEEP else releases()[-1:]


@pytest.fixture(params=RENDER_RELEASES, ids=lambda r: r.id)
def helm(request: pytest.FixtureRequest) -> HelmRelease:
    """The Helm release that renders (Helm 4; each in turn in the long run)."""
    return require(request.param)


@pytest.fixture(params=releases(), ids=lambda r: r.id)
def each_helm(request: pytest.FixtureRequest) -> HelmRelease:
    """Each Helm release in turn (tests.helmreleases)."""
    return require(request.param)


def run_helm(release: HelmRelease, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tool([release.helm, *args])


def refusal(release: HelmRelease, *overrides: str) -> str:
    """What ``helm template`` of the chart with these ``--set`` overrides says as it fails."""
    sets = [a for override in overrides for a in ("--set", override)]
    proc = run_helm(release, "template", RELEASE, str(CHART), *sets)
    assert proc.returncode != 0, proc.stdout[:500]
    return proc.stderr


def values_file(profile: str) -> Path:
    return CHART / "ci" / f"{profile}-values.yaml"


@functools.cache
def render_text(release: HelmRelease, profile: str, *extra: str) -> str:
    namespace = PROFILES[profile][0] if profile in PROFILES else "gpu-monitoring"
    namespace = RELEASE_NAMESPACES.get(profile, namespace)
    args = ["template", RELEASE, str(CHART), "-n", namespace, "-f", str(values_file(profile))]
    proc = run_helm(release, *args, *extra)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(release: HelmRelease, profile: str, *extra: str) -> Docs:
    """The chart's objects for one profile, parsed (cached text: safe to mutate)."""
    return tuple(d for d in yaml.safe_load_all(render_text(release, profile, *extra)) if d)


def normalised(docs: Docs) -> list[Doc]:
    """Objects without Helm's labels, in (kind, namespace, name) order."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in HELM_LABELS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    def key(d: Doc) -> tuple[str, str, str]:
        meta = d["metadata"]
        return (d["kind"], meta.get("namespace", ""), meta["name"])

    return sorted((strip(d) for d in docs), key=key)


def kustomize_cluster_names(docs: Docs) -> Docs:
    """The chart's objects with the names of the cluster-scoped ones as an overlay gives them:
    without the chart's ``-<namespace>`` suffix."""
    out = copy.deepcopy(docs)
    suffixes = {
        f"-{s['namespace']}" for b in of_kind(out, "ClusterRoleBinding") for s in b["subjects"]
    }

    def cut(name: str) -> str:
        (suffix,) = [x for x in suffixes if name.endswith(x)]
        return name.removesuffix(suffix)

    for d in out:
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] = cut(d["metadata"]["name"])
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] = cut(d["roleRef"]["name"])
    return out


def entry_of(profile: str) -> EntryPoint:
    namespace, mode, _ = PROFILES[profile]
    uid = UIDS.get(profile, 0)
    return EntryPoint(f"charts/dcgm-enricher ({profile})", namespace, mode, uid)


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def serve_flags() -> dict[str, argparse.Action]:
    """Every flag of `dcgm-enricher serve` but --help, by its name without dashes."""
    return {
        a.option_strings[0][2:]: a
        for a in serve_parser()._actions
        if not isinstance(a, argparse._HelpAction)
    }


# --------------------------------------------------------------------------- tests


def test_profiles_are_known() -> None:
    assert sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").iterdir()) == sorted(
        PROFILES
    )


def test_helm_reports_the_release(each_helm: HelmRelease) -> None:
    proc = run_helm(each_helm, "version", "--template", "{{.Version}}")
    assert proc.stdout.strip() == f"v{each_helm.version}", proc.stdout + proc.stderr


def test_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == project_version()


def test_chart_files_are_the_shipped_rules_and_dashboard() -> None:
    """One source: the chart's files are links to the rules file and the dashboard JSON."""
    files = CHART / "files"
    assert (files / "dcgm-enricher.rules.yaml").resolve() == ROOT / "rules/dcgm-enricher.rules.yaml"
    assert (files / "dcgm-enricher.json").resolve() == ROOT / "grafana/dcgm-enricher.json"


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_strict(each_helm: HelmRelease, profile: str) -> None:
    proc = run_helm(each_helm, "lint", "--strict", str(CHART), "-f", str(values_file(profile)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("profile", PROFILES)
def test_helm3_and_helm4_render_the_same(profile: str) -> None:
    helm3, helm4 = (require(r) for r in releases())
    assert render_text(helm3, profile) == render_text(helm4, profile)


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_objects_match_schemas(helm: HelmRelease, profile: str, k8s_version: str) -> None:
    errors = [
        f"{d['kind']}/{d['metadata']['name']}: {err}"
        for d in render(helm, profile)
        for err in schema_errors(d, k8s_version)
    ]
    assert errors == []


@pytest.mark.parametrize("profile", PROFILES)
def test_invariants(helm: HelmRelease, profile: str) -> None:
    docs = render(helm, profile)
    problems = all_problems(entry_of(profile), docs)
    if profile == "plain-prometheus":
        # No Prometheus Operator: no monitor at all, and nothing else that needs its CRDs.
        assert {d["apiVersion"].split("/")[0] for d in docs} <= {
            "v1",
            "apps",
            "rbac.authorization.k8s.io",
        }
        problems.remove("expected exactly one ServiceMonitor or PodMonitor, found []")
    assert problems == []


@pytest.mark.parametrize(
    ("profile", "kinds"),
    [("sidecar", ["ServiceMonitor"]), ("podmonitor", ["PodMonitor"]), ("plain-prometheus", [])],
)
def test_one_monitor_kind(helm: HelmRelease, profile: str, kinds: list[str]) -> None:
    assert [m["kind"] for m in of_kind(render(helm, profile), *MONITOR_KINDS)] == kinds


@pytest.mark.parametrize("profile", PROFILES)
def test_exceptions_are_commented(helm: HelmRelease, profile: str) -> None:
    assert uncommented_exceptions(render_text(helm, profile)) == []


@needs_kubectl
@pytest.mark.parametrize("profile", [p for p, (_, _, overlay) in PROFILES.items() if overlay])
def test_chart_renders_the_kustomize_objects(helm: HelmRelease, profile: str) -> None:
    overlay = PROFILES[profile][2]
    assert overlay is not None
    creates = profile in RELEASE_NAMESPACES  # namespace.create
    kustomized = tuple(d for d in build(overlay) if d["kind"] != "Namespace" or creates)
    chart = normalised(kustomize_cluster_names(render(helm, profile)))
    expected = normalised(kustomized)
    assert [(d["kind"], d["metadata"]["name"]) for d in chart] == [
        (d["kind"], d["metadata"]["name"]) for d in expected
    ]
    for got, want in zip(chart, expected, strict=True):
        assert got == want, f"{got['kind']}/{got['metadata']['name']} differs from {overlay}"


@needs_kubectl
def test_podmonitor_profile_is_the_overlay_with_the_podmonitor_swap(
    helm: HelmRelease, tmp_path: Path
) -> None:
    """The one-line PodMonitor swap of docs/install.md, as monitor.kind=PodMonitor."""
    swapped = edited_overlay(
        tmp_path,
        "overlays/sidecar",
        "- ../../components/servicemonitor",
        "- ../../components/podmonitor",
    )
    expected = normalised(tuple(d for d in swapped if d["kind"] != "Namespace"))
    assert normalised(kustomize_cluster_names(render(helm, "podmonitor"))) == expected


def test_schema_lists_every_serve_flag() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    flags = schema["properties"]["enricher"]["properties"]["flags"]
    assert flags["additionalProperties"] is False
    assert sorted(flags["properties"]) == sorted(serve_flags())


def _sample(action: argparse.Action) -> tuple[Any, Any]:
    """A value for the chart's enricher.flags that is not the flag's default, and what the
    parser must make of it."""
    if isinstance(action, argparse.BooleanOptionalAction):
        value = action.default is not True
        return value, value
    if action.choices:
        value = next(c for c in action.choices if c != action.default)
        return value, value
    if action.type is int:
        return 33554433, 33554433
    if action.type is float:
        # Valid for every float flag: the timeouts and intervals (positive) and the ratios
        # (--idle.threshold, under 1), and none's default.
        return 0.5, 0.5
    value = f"sample-{action.dest}"
    return value, value


def test_every_serve_flag_is_reachable_through_values(helm: HelmRelease, tmp_path: Path) -> None:
    """Each flag set in enricher.flags arrives at the parser as that value."""
    flags = serve_flags()
    samples = {name: _sample(action) for name, action in flags.items()}
    values = tmp_path / "flags.yaml"
    values.write_text(
        yaml.safe_dump({"enricher": {"flags": {n: v for n, (v, _) in samples.items()}}})
    )
    _, container = enricher_of(render(helm, "sidecar", "-f", str(values)))
    parsed = build_parser().parse_args(container["args"])
    assert parsed.command == "serve"
    assert {n: getattr(parsed, a.dest) for n, a in flags.items()} == {
        n: want for n, (_, want) in samples.items()
    }


def test_a_null_flag_drops_the_mode_default(helm: HelmRelease, tmp_path: Path) -> None:
    values = tmp_path / "null.yaml"
    values.write_text("enricher:\n  flags:\n    upstream.pod-selector: null\n")
    _, container = enricher_of(render(helm, "gpu-operator", "-f", str(values)))
    assert not [a for a in container["args"] if a.startswith("--upstream.pod-selector")]
    assert "--upstream.discover-pod" in container["args"]


RUNBOOK_BASE = "https://git.corp.lan/gpu/dcgm-enricher/blob/v0.1.0/docs/runbook.md"


def test_runbook_url_links_every_alert_and_the_dashboard(helm: HelmRelease) -> None:
    """prometheusRule.runbookUrl: URL#<anchor of the alert's runbook section> on every alert,
    the rules otherwise unchanged, and a Runbook link on the otherwise unchanged dashboard."""
    plain = render(helm, "sidecar")
    linked = render(helm, "sidecar", "--set", f"prometheusRule.runbookUrl={RUNBOOK_BASE}")
    rules = yaml.safe_load((ROOT / "rules" / "dcgm-enricher.rules.yaml").read_text())["groups"]
    (rule,) = of_kind(plain, "PrometheusRule")
    assert rule["spec"]["groups"] == rules  # no runbook_url unless the value is set
    (rule,) = of_kind(linked, "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == len([r for g in rules for r in g["rules"] if "alert" in r])
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    for alert in alerts:
        anchor = alert["alert"].lower()
        assert alert["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{anchor}"
        assert f"\n### {alert['alert']}\n" in runbook, f"docs/runbook.md has no #{anchor}"
        del alert["annotations"]["runbook_url"]
    assert rule["spec"]["groups"] == rules
    (dashboard,) = [
        d for d in linked if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    # Every dashboard of the family, each with the runbook's link and otherwise as shipped.
    assert sorted(dashboard["data"]) == sorted(BOARDS.values())
    for name in BOARDS.values():
        shipped = json.loads((ROOT / "grafana" / name).read_text())
        assert shipped["links"] == [], name
        board = json.loads(dashboard["data"][name])
        (link,) = board.pop("links")
        assert link["url"] == RUNBOOK_BASE and link["type"] == "link", name
        assert link["title"] == "Runbook", name
        shipped.pop("links")
        assert board == shipped, name


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mode=daemon", "mode"),
        ("monitor.kind=Both", "monitor"),
        ("enricher.flags.web\\.listen=:1", "flags"),
        ("enricher.runAsUser=-1", "runAsUser"),
        ("namespace.create=yes", "create"),
        ("namespace.name=GPU_Monitoring", "name"),
        ("webConfig.basicAuthUsers.prometheus=plaintext", "basicAuthUsers"),
        ("webConfig.tls.clientAuthType=RequireAnyClientCert", "clientAuthType"),
        ("webConfig.tls.minVersion=TLS11", "minVersion"),
        ("monitor.scheme=ftp", "scheme"),
        ("monitor.tlsConfig.caFil=/x", "tlsConfig"),
        ("monitor.basicAuth.username.name=s", "basicAuth"),
        ("monitor.metricRelabelings[0].action=dorp", "metricRelabelings"),
        ("extraVolumeMounts[0].name=x", "extraVolumeMounts"),
        ("dra.enabled=no", "enabled"),
        ("prometheusRule.runbookUrl=docs/runbook.md", "runbookUrl"),
        ("prometheusRule.runbookUrl=https://git.corp.lan/runbook.md#top", "runbookUrl"),
        ("monitor.relabelings[0].action=dorp", "relabelings"),
        ("monitor.relabelings[0].target_label=job", "relabelings"),
    ],
)
def test_schema_rejects(each_helm: HelmRelease, override: str, message: str) -> None:
    assert message in refusal(each_helm, override)


def notes_of(profile: str, *extra: str) -> str:
    """The NOTES of installing ``profile``, rendered by Helm 4 offline
    (``install --dry-run=client``); Helm 3.17 contacts a cluster for that, and its ``lint``
    renders NOTES.txt without showing them."""
    helm4 = require(releases()[1])
    release_namespace = RELEASE_NAMESPACES.get(profile, PROFILES[profile][0])
    args = ["install", RELEASE, str(CHART), "-n", release_namespace]
    proc = run_helm(helm4, *args, "-f", str(values_file(profile)), *extra, "--dry-run=client")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\nNOTES:\n", 1)[1]


# What the NOTES of a profile say beyond the checks every profile's have (whitespace folded).
NOTES_SAY = {
    "gpu-operator": ["labelled app=nvidia-dcgm-exporter in namespace gpu-operator only"],
    "tls": [
        "served with TLS (Secret dcgm-enricher-tls) and basic auth (prometheus);",
        "against ca.crt of Secret dcgm-enricher-tls and the name dcgm-enricher.gpu-monitoring.svc",
        "curl -sk -u <user>:<password> https://localhost:9401/metrics",
    ],
    "nonroot": ["runs as UID 10001, without the kubelet's PodResources socket"],
    "least-privilege": [
        "in namespace nvidia-gpu-operator only",
        "runs as UID 10001, without the kubelet's PodResources socket",
        "dra.enabled is false: no resourceslices rule",
    ],
    "openshift": [
        "the SecurityContextConstraints dcgm-enricher-nvidia-gpu-operator admits these pods,",
        "the Role dcgm-enricher-scc lets their ServiceAccount use it",
    ],
}


@pytest.mark.parametrize("profile", PROFILES)
def test_notes_say_how_to_verify(profile: str) -> None:
    """NOTES name the release's DaemonSet, only metrics that exist, and what each setting
    changes: the Pod Security label to set, the operator's namespace, the user, DRA, TLS."""
    namespace, mode, _ = PROFILES[profile]
    notes = notes_of(profile)
    assert f"kubectl -n {namespace} rollout status daemonset/{RELEASE}" in notes
    metrics = (ROOT / "docs" / "metrics.md").read_text()
    named = re.findall(r"dcgm_enricher_[a-z_]+", notes)
    assert named and all(name in metrics for name in named), named
    labels = mode == "sidecar" and profile not in RELEASE_NAMESPACES  # namespace.create
    assert ("pod-security.kubernetes.io/enforce=privileged" in notes) == labels
    assert ("`helm uninstall` deletes it" in notes) == (profile == "namespace")
    folded = " ".join(notes.split())
    for said in NOTES_SAY.get(profile, []):
        assert said in folded, said
    assert "Warning:" not in notes


@pytest.mark.parametrize(
    ("setting", "warning"),
    [
        ("monitor.tlsConfig.insecureSkipVerify=true", "Warning: monitor.tlsConfig.insecureSkip"),
        ("monitor.basicAuth=null", "Warning: monitor.basicAuth is empty"),
    ],
)
def test_notes_warn_of_a_monitor_that_cannot_scrape(setting: str, warning: str) -> None:
    assert warning in notes_of("tls", "--set", setting)


def test_package_holds_the_linked_files(each_helm: HelmRelease, tmp_path: Path) -> None:
    """``helm package`` copies the contents behind files/ and leaves ci/ out."""
    proc = run_helm(each_helm, "package", str(CHART), "-d", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (archive,) = tmp_path.glob("dcgm-enricher-*.tgz")
    with tarfile.open(archive) as tgz:
        names = tgz.getnames()
        rules = tgz.extractfile("dcgm-enricher/files/dcgm-enricher.rules.yaml")
        assert rules is not None
        assert rules.read() == (ROOT / "rules" / "dcgm-enricher.rules.yaml").read_bytes()
    assert "dcgm-enricher/files/dcgm-enricher.json" in names
    assert not [n for n in names if n.startswith("dcgm-enricher/ci/")]


def test_nonroot_changes_only_the_user_and_the_kubelet_source(helm: HelmRelease) -> None:
    """enricher.runAsUser=10001 is the sidecar profile with the enricher's user, group and
    runAsNonRoot changed, --no-kubelet.enabled added and the PodResources mount it could not
    use gone from the enricher (dcgm-exporter keeps its own); nothing else."""
    root, nonroot = (render(helm, p) for p in ("sidecar", "nonroot"))
    _, container = enricher_of(root)
    container["securityContext"].update(
        runAsNonRoot=True, runAsUser=IMAGE_UID, runAsGroup=IMAGE_UID
    )
    container["args"].insert(2, "--no-kubelet.enabled")
    container["volumeMounts"] = [
        m for m in container["volumeMounts"] if m["mountPath"] != POD_RESOURCES_DIR
    ]
    assert normalised(nonroot) == normalised(root)


def test_nonroot_kubelet_flag_wins(helm: HelmRelease, tmp_path: Path) -> None:
    """A node whose PodResources socket the UID may use: enricher.flags turns the source on."""
    values = tmp_path / "kubelet.yaml"
    values.write_text("enricher:\n  flags:\n    kubelet.enabled: true\n")
    _, container = enricher_of(render(helm, "nonroot", "-f", str(values)))
    assert "--kubelet.enabled" in container["args"]
    assert "--no-kubelet.enabled" not in container["args"]


def test_namespace_create_refuses_the_gpu_operators(each_helm: HelmRelease) -> None:
    message = refusal(each_helm, "mode=gpu-operator", "namespace.create=true")
    assert "namespace.create: the GPU Operator's namespace is the operator's" in message


def test_namespace_name_without_create_moves_every_object(helm: HelmRelease) -> None:
    """namespace.name alone: every namespaced object there, no Namespace object."""
    docs = render(helm, "sidecar", "--set", "namespace.name=monitoring")
    assert not of_kind(docs, "Namespace")
    assert all_problems(EntryPoint("charts (namespace.name)", "monitoring", "sidecar"), docs) == []


# --------------------------------------------------------------------------- least privilege


def test_least_privilege_drops_the_hostpath_and_the_resourceslice_rule(helm: HelmRelease) -> None:
    """UID 10001 in gpu-operator mode: no PodResources source and so no hostPath at all;
    dra.enabled false: the ClusterRole's only rule is the pod watch's, and the lookup is off."""
    docs = render(helm, "least-privilege")
    workload, container = enricher_of(docs)
    assert not [v for v in pod_spec(workload).get("volumes", []) if "hostPath" in v]
    assert "volumeMounts" not in container
    (role,) = of_kind(docs, "ClusterRole")
    assert [r["resources"] for r in role["rules"]] == [["pods"]]
    assert "--no-kube.resource-slices" in container["args"]
    assert "--no-kubelet.enabled" in container["args"]


def test_dra_switch_refuses_the_lookup_flag(each_helm: HelmRelease) -> None:
    message = refusal(each_helm, "dra.enabled=false", "enricher.flags.kube\\.resource-slices=true")
    assert "dra.enabled: false drops the ClusterRole's resourceslices rule" in message


def test_extra_volumes_and_mounts(helm: HelmRelease, tmp_path: Path) -> None:
    """extraVolumes join the pod's volumes, extraVolumeMounts the enricher's mounts, after the
    chart's own; dcgm-exporter gets none of them."""
    values = tmp_path / "extra.yaml"
    volume = {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}}
    mount = {"name": "ca-bundle", "mountPath": "/etc/dcgm-enricher/ca", "readOnly": True}
    values.write_text(yaml.safe_dump({"extraVolumes": [volume], "extraVolumeMounts": [mount]}))
    for profile in ("sidecar", "least-privilege"):
        workload, container = enricher_of(render(helm, profile, "-f", str(values)))
        assert pod_spec(workload)["volumes"][-1] == volume
        assert container["volumeMounts"][-1] == mount
        for other in pod_spec(workload)["containers"]:
            if other is not container:
                assert mount not in other.get("volumeMounts", [])


# --------------------------------------------------------------------------- TLS and basic auth


def test_probes_follow_the_web_config(helm: HelmRelease) -> None:
    """Plain HTTP: the overlay's probes. TLS: HTTPS on the same /healthz, which basic auth
    leaves open (no password in the pod spec; the kubelet does not check the certificate).
    Required client certificates, which the kubelet does not have: a TCP connection only."""
    probes = {}
    for name, extra in (
        ("plain", ()),
        ("tls", ("-f", str(values_file("tls")))),
        (
            "client-certificates",
            (
                "-f",
                str(values_file("tls")),
                "--set",
                "webConfig.tls.clientAuthType=RequireAndVerifyClientCert",
            ),
        ),
    ):
        _, container = enricher_of(render(helm, "sidecar", *extra))
        assert container["livenessProbe"]["periodSeconds"] == 10
        probes[name] = {k: container[k] for k in ("livenessProbe", "readinessProbe")}
        assert probes[name]["livenessProbe"] | {"failureThreshold": 0} == probes[name][
            "readinessProbe"
        ] | {"failureThreshold": 0}
    kinds = {
        name: {k: v for k, v in p["livenessProbe"].items() if k in ("httpGet", "tcpSocket")}
        for name, p in probes.items()
    }
    assert kinds == {
        "plain": {"httpGet": {"path": "/healthz", "port": "enricher"}},
        "tls": {"httpGet": {"path": "/healthz", "port": "enricher", "scheme": "HTTPS"}},
        "client-certificates": {"tcpSocket": {"port": "enricher"}},
    }


def rendered_web_config(docs: Docs) -> dict[str, Any]:
    (secret,) = [
        d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-web-config")
    ]
    parsed: dict[str, Any] = yaml.safe_load(base64.b64decode(secret["data"]["web-config.yml"]))
    return parsed


def test_client_certificates_project_the_ca(helm: HelmRelease) -> None:
    """clientAuthType asks for the CA beside the certificate, under the name the web config
    gives it; an existing Secret of the user's replaces the rendered one."""
    extra = (
        "-f",
        str(values_file("tls")),
        "--set",
        "webConfig.tls.clientAuthType=VerifyClientCertIfGiven",
    )
    docs = render(helm, "sidecar", *extra)
    assert rendered_web_config(docs)["tls_server_config"] == {
        "cert_file": "tls.crt",
        "key_file": "tls.key",
        "client_auth_type": "VerifyClientCertIfGiven",
        "client_ca_file": "ca.crt",
        "min_version": "TLS13",
    }
    workload, _ = enricher_of(docs)
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == "web-config"]
    tls_source = volume["projected"]["sources"][1]["secret"]
    assert tls_source["name"] == "dcgm-enricher-tls"
    assert [i["path"] for i in tls_source["items"]] == ["tls.crt", "tls.key", "ca.crt"]

    mine = render(helm, "sidecar", *extra, "--set", "webConfig.existingSecret=my-web-config")
    assert not of_kind(mine, "Secret")
    workload, container = enricher_of(mine)
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == "web-config"]
    assert volume["projected"]["sources"][0]["secret"]["name"] == "my-web-config"
    assert "--web.config.file=/etc/dcgm-enricher/web/web-config.yml" in container["args"]


def test_client_auth_without_a_certificate_is_refused(each_helm: HelmRelease) -> None:
    message = refusal(each_helm, "webConfig.tls.clientAuthType=RequireAndVerifyClientCert")
    assert "need webConfig.tls.secretName" in message


# The Prometheus Operator's folder for the Secret keys a monitor's tlsConfig names, as it
# mounts them into the Prometheus pod (secret_<namespace>_<name>_<key>).
OPERATOR_CERTS = "certs"


@dataclass
class RunningTls:
    """The tls profile's enricher, running with the rendered args and the files the kubelet
    would project for it, and what the Operator would make of the monitors' Secrets."""

    docs: dict[str, Docs]  # monitor kind -> the rendered objects
    address: str
    secrets: dict[str, dict[str, bytes]]  # the user's Secrets (stand-ins), name -> key -> bytes
    folder: Path
    password: str
    metrics: str  # /metrics as the right credentials get it


INSTALL_DOC = ROOT / "docs" / "install.md"
# The line of docs/install.md's openssl recipe that names the release's Service and namespace.
RECIPE_NAMES = "SVC=dcgm-enricher NS=gpu-monitoring"


def doc_blocks(language: str) -> list[str]:
    """The fenced ``language`` blocks of docs/install.md."""
    return re.findall(rf"^```{language}\n(.*?)^```$", INSTALL_DOC.read_text(), re.M | re.S)


def openssl_recipe_secret(folder: Path, service: str, namespace: str) -> tuple[str, Doc]:
    """The Secret docs/install.md's openssl recipe makes for ``service`` in ``namespace``: its
    commands run with the real openssl, its kubectl line recorded (no cluster here) and turned
    into the Secret's name and keys as ``kubectl create secret generic --from-file`` makes
    them (a key per file, named after it)."""
    (recipe,) = [b for b in doc_blocks("sh") if "openssl req -x509" in b]
    assert RECIPE_NAMES in recipe
    recipe = recipe.replace(RECIPE_NAMES, f"SVC={service} NS={namespace}")
    folder.mkdir(parents=True)
    stand_in = 'kubectl() { printf "%s\\n" "$@" > kubectl.args; }\n'
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", stand_in + recipe],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    args = (folder / "kubectl.args").read_text().splitlines()
    assert args[:5] == ["-n", namespace, "create", "secret", "generic"], args
    assert "--type=kubernetes.io/tls" in args
    files = [a.removeprefix("--from-file=") for a in args if a.startswith("--from-file=")]
    return args[5], {Path(f).name: (folder / f).read_bytes() for f in files}


def project_secrets(volume: Doc, secrets: dict[str, dict[str, bytes]], into: Path) -> None:
    """A projected volume's Secret sources written under ``into``, each item's key at its path
    (what the kubelet does; no kubelet runs here)."""
    into.mkdir(parents=True)
    for source in volume["projected"]["sources"]:
        secret = source["secret"]
        for item in secret["items"]:
            (into / item["path"]).write_bytes(secrets[secret["name"]][item["key"]])


def operator_endpoint_security(
    endpoint: Doc, namespace: str, secrets: dict[str, dict[str, bytes]], folder: Path
) -> Doc:
    """An endpoint's scheme, tlsConfig, basicAuth and metricRelabelings as the Prometheus
    Operator writes them into the scrape job: Secret keys named by tlsConfig become files in
    its certificate folder, basicAuth's are read and written into the job, the relabelings
    are translated as the other relabelings are."""
    job: Doc = {}
    if "scheme" in endpoint:
        job["scheme"] = endpoint["scheme"]

    def secret_file(ref: Doc) -> str:
        selector = ref["secret"]
        path = folder / f"secret_{namespace}_{selector['name']}_{selector['key']}"
        path.write_bytes(secrets[selector["name"]][selector["key"]])
        return str(path)

    tls = endpoint.get("tlsConfig")
    if tls is not None:
        fields = {"serverName": "server_name", "insecureSkipVerify": "insecure_skip_verify"}
        fields |= {"minVersion": "min_version", "maxVersion": "max_version"}
        tls_config = {fields[k]: v for k, v in tls.items() if k in fields}
        for key, name in (("ca", "ca_file"), ("cert", "cert_file")):
            if key in tls:
                tls_config[name] = secret_file(tls[key])
        if "keySecret" in tls:
            tls_config["key_file"] = secret_file({"secret": tls["keySecret"]})
        job["tls_config"] = tls_config
    auth = endpoint.get("basicAuth")
    if auth is not None:
        job["basic_auth"] = {
            k: secrets[auth[k]["name"]][auth[k]["key"]].decode() for k in ("username", "password")
        }
    if endpoint.get("metricRelabelings"):
        job["metric_relabel_configs"] = [relabel_config(r) for r in endpoint["metricRelabelings"]]
    return job


def endpoint_of(monitor: Doc) -> Doc:
    spec = monitor["spec"]
    (endpoint,) = spec.get("endpoints", []) + spec.get("podMetricsEndpoints", [])
    return endpoint


@pytest.fixture(scope="module")
def running_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTls]:
    """The enricher of the tls profile (both monitor kinds), run as the chart renders it.

    Stand-ins, for what cannot exist here: the user's Secrets (dcgm-enricher-tls as
    docs/install.md's openssl recipe makes it for the rendered Service, dcgm-enricher-scrape
    with this run's password, whose bcrypt hash replaces the profile's), the kubelet's
    projection of the Secrets into the pod's web-config volume (written as files under a
    folder standing for the pod's root) and the Operator's (operator_endpoint_security)."""
    helm4 = require(releases()[1])
    folder = tmp_path_factory.mktemp("tls")
    password = token_urlsafe(18)
    users = folder / "users.yaml"
    users.write_text(
        yaml.safe_dump(
            {"webConfig": {"basicAuthUsers": {"prometheus": bcrypt_hash(password.encode())}}}
        )
    )
    docs = {
        kind: render(helm4, "tls", "-f", str(users), "--set", f"monitor.kind={kind}")
        for kind in MONITOR_KINDS
    }
    service_monitor = docs["ServiceMonitor"]
    (service,) = of_kind(service_monitor, "Service")
    tls_secret, tls_keys = openssl_recipe_secret(
        folder / "recipe", service["metadata"]["name"], service["metadata"]["namespace"]
    )
    assert sorted(tls_keys) == ["ca.crt", "tls.crt", "tls.key"]
    user_secrets = {
        tls_secret: tls_keys,
        "dcgm-enricher-scrape": {"username": b"prometheus", "password": password.encode()},
    }
    for secret in of_kind(service_monitor, "Secret"):
        user_secrets[secret["metadata"]["name"]] = {
            k: base64.b64decode(v) for k, v in secret["data"].items()
        }
    workload, container = enricher_of(service_monitor)
    pod_root = folder / "pod"
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    for mount in container["volumeMounts"]:
        if mount["name"] == "web-config":
            assert mount["readOnly"] is True
            project_secrets(volumes["web-config"], user_secrets, pod_root / mount["mountPath"][1:])
    web_config = flag_value(container["args"], "--web.config.file")
    assert web_config is not None
    port = free_port()
    argv = [
        *container["args"],
        # Here rather than in a pod: loopback, the projected files under the pod's stand-in
        # root, and no GPU, kubelet or exporter (port 9 refuses) on this machine.
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.config.file={pod_root / web_config[1:]}",
        "--upstream.url=http://127.0.0.1:9/metrics",
        "--no-nvml.enabled",
        "--kubelet.pod-resources-socket=",
        "--docker.host=",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("NODE_NAME", "KUBERNETES_SERVICE_HOST"):
        env.pop(name, None)
    log = (folder / "enricher.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "enricher", *argv], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    # The certificate names the Service, not 127.0.0.1: the chain is checked here, the name by
    # Prometheus below.
    verified = ssl.create_default_context(cafile=str(folder / "recipe" / "ca.crt"))
    verified.check_hostname = False
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/healthz", context=verified, timeout=5
                ) as response:
                    assert response.read() == b"ok\n"
                break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        "the enricher did not start:\n" + (folder / "enricher.log").read_text()
                    )
                time.sleep(0.2)
        token = base64.b64encode(f"prometheus:{password}".encode()).decode()
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Basic {token}"}
        )
        with urllib.request.urlopen(request, context=verified, timeout=10) as response:
            metrics = response.read().decode()
        yield RunningTls(docs, f"127.0.0.1:{port}", user_secrets, folder, password, metrics)
    finally:
        stop_process(proc)
        log.close()


def test_probes_reach_the_tls_enricher(running_tls: RunningTls) -> None:
    """The rendered probe as the kubelet sends it (HTTPS without checking the certificate, no
    credentials) gets 200; /metrics without credentials gets 401."""
    _, container = enricher_of(running_tls.docs["ServiceMonitor"])
    get = container["readinessProbe"]["httpGet"]
    unverified = ssl._create_unverified_context()  # the kubelet's HTTPS probe does not verify
    url = f"{get['scheme'].lower()}://{running_tls.address}{get['path']}"
    with urllib.request.urlopen(url, context=unverified, timeout=5) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"https://{running_tls.address}/metrics", context=unverified)
    assert info.value.code == 401


def test_prometheus_scrapes_the_tls_enricher_with_the_monitors_settings(
    running_tls: RunningTls, prom_release: PromRelease, tmp_path: Path
) -> None:
    """One real Prometheus per release scrapes the enricher through each rendered monitor's
    scheme, tlsConfig (the chart's default: the TLS Secret's ca.crt and the Service's name),
    basicAuth and metricRelabelings, as the Operator writes them; the same job without the
    password, without the CA, or checking the name of the same release in another namespace is
    refused (so each setting matters, and the certificate is checked by name, not by IP)."""
    certs = tmp_path / OPERATOR_CERTS
    certs.mkdir()
    jobs = []
    for kind, docs in running_tls.docs.items():
        (monitor,) = of_kind(docs, kind)
        endpoint = endpoint_of(monitor)
        assert endpoint["scheme"] == "https"
        pod = f"dcgm-enricher-{kind.lower()}"
        job = operator_job(monitor, docs, {pod: running_tls.address})
        job |= operator_endpoint_security(
            endpoint, monitor["metadata"]["namespace"], running_tls.secrets, certs
        )
        jobs.append(job)
    (monitor,) = of_kind(running_tls.docs["ServiceMonitor"], "ServiceMonitor")
    for control, drop in (
        ("no-password", "basic_auth"),
        ("no-ca", "tls_config"),
        ("other-namespace", None),
    ):
        job = operator_job(
            monitor,
            running_tls.docs["ServiceMonitor"],
            {f"dcgm-enricher-{control}": running_tls.address},
        )
        job |= operator_endpoint_security(
            endpoint_of(monitor), monitor["metadata"]["namespace"], running_tls.secrets, certs
        )
        if drop is None:
            assert job["tls_config"]["server_name"] == "dcgm-enricher.gpu-monitoring.svc"
            job["tls_config"]["server_name"] = "dcgm-enricher.other.svc"
        else:
            del job[drop]
        job["job_name"] += f"-{control}"
        jobs.append(job)
    for job in jobs:
        job["scrape_interval"] = job["scrape_timeout"] = "1s"
    config = {"global": EVERY_SECOND, "scrape_configs": jobs}
    with serve(prom_release, config, tmp_path / "prometheus") as server:
        deadline = time.monotonic() + 45
        while True:
            targets = {
                t["labels"]["pod"]: t
                for t in server.api("targets", state="active")["activeTargets"]
            }
            if len(targets) == 5 and all(t["health"] != "unknown" for t in targets.values()):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"not every target was scraped: {targets}\n{server.log_tail()}")
            time.sleep(0.5)
        for kind in MONITOR_KINDS:
            target = targets[f"dcgm-enricher-{kind.lower()}"]
            assert target["health"] == "up", (kind, target["lastError"])
            assert target["scrapeUrl"].startswith("https://")
        assert "401" in targets["dcgm-enricher-no-password"]["lastError"]
        for control in ("no-ca", "other-namespace"):
            assert "certificate" in targets[f"dcgm-enricher-{control}"]["lastError"]
            assert targets[f"dcgm-enricher-{control}"]["health"] == "down"
        assert "dcgm-enricher.other.svc" in targets["dcgm-enricher-other-namespace"]["lastError"]
        pods = {r["metric"]["pod"] for r in server.query("dcgm_enricher_source_up")}
        assert pods == {f"dcgm-enricher-{kind.lower()}" for kind in MONITOR_KINDS}
        # The monitors' metricRelabelings drop python_gc_*, which the enricher serves.
        assert "\npython_gc_objects_collected_total{" in running_tls.metrics
        assert server.query('{__name__=~"python_gc_.+"}') == []
        assert server.query('{__name__=~"python_info"}')


# --------------------------------------------------------------------------- cluster operators


def test_two_releases_of_one_name_share_no_cluster_scoped_name(helm: HelmRelease) -> None:
    """The same release name in two namespaces (OpenShift's SCC included): no cluster-scoped
    object of one is the other's, and each binding names its own role and ServiceAccount.
    TLS's serverName follows the release's Service and namespace, a tlsConfig key of the
    user's replaces the chart's default for it alone, and priorityClassName reaches the pods
    (none by default: the overlays' pods, and clusters that admit system-node-critical only in
    kube-system)."""
    scc_on = ("--set", "openshift.scc.create=true")

    def release(name: str, namespace: str, *extra: str) -> Docs:
        args = ["template", name, str(CHART), "-n", namespace, *scc_on, *extra]
        proc = run_helm(helm, *args)
        assert proc.returncode == 0, proc.stderr
        return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)

    tls_on = ("--set", "webConfig.tls.secretName=enricher-tls")
    first = render(helm, "sidecar", *scc_on)  # dcgm-enricher in gpu-monitoring
    second = release(
        RELEASE,
        "gpu-monitoring-b",
        *tls_on,
        "--set",
        "monitor.tlsConfig.ca.configMap.name=corporate-ca",
        "--set",
        "monitor.tlsConfig.ca.configMap.key=ca.pem",
        "--set",
        "priorityClassName=system-node-critical",
    )
    names = []
    for namespace, docs in (("gpu-monitoring", first), ("gpu-monitoring-b", second)):
        assert rbac_problems(docs) == [] and scc_problems(docs) == []
        assert binding_problems(docs, namespace) == []
        scoped = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in CLUSTER_SCOPED}
        assert {kind for kind, _ in scoped} == {
            "ClusterRole",
            "ClusterRoleBinding",
            "SecurityContextConstraints",
        }
        names.append(scoped)
    assert names[0] & names[1] == set()

    (monitor,) = of_kind(second, "ServiceMonitor")
    assert endpoint_of(monitor)["tlsConfig"] == {
        "ca": {"configMap": {"name": "corporate-ca", "key": "ca.pem"}},
        "serverName": "dcgm-enricher.gpu-monitoring-b.svc",
    }
    workload, _ = enricher_of(second)
    assert pod_spec(workload)["priorityClassName"] == "system-node-critical"
    workload, _ = enricher_of(first)
    assert "priorityClassName" not in pod_spec(workload)
    (monitor,) = of_kind(first, "ServiceMonitor")
    assert "tlsConfig" not in endpoint_of(monitor)  # plain HTTP: no TLS settings at all

    other = release("gpu", "monitoring", *tls_on)
    (service,) = of_kind(other, "Service")
    (monitor,) = of_kind(other, "ServiceMonitor")
    assert service["metadata"]["name"] == "gpu-dcgm-enricher"
    assert endpoint_of(monitor)["tlsConfig"] == {
        "ca": {"secret": {"name": "enricher-tls", "key": "ca.crt"}},
        "serverName": "gpu-dcgm-enricher.monitoring.svc",
    }
    (role,) = of_kind(other, "ClusterRole")
    assert role["metadata"]["name"] == "gpu-dcgm-enricher-monitoring"


def test_docs_certificate_names_what_the_chart_renders(helm: HelmRelease) -> None:
    """docs/install.md's cert-manager Certificate writes the Secret the tls profile names,
    with the serverName its monitor checks among its DNS names, issued by a CA issuer that the
    same page makes (cert-manager then writes that CA as the Secret's ca.crt)."""
    objects = [d for block in doc_blocks("yaml") for d in yaml.safe_load_all(block) if d]
    certificates = {
        d["metadata"]["name"]: d["spec"] for d in objects if d.get("kind") == "Certificate"
    }
    issuers = {d["metadata"]["name"]: d["spec"] for d in objects if d.get("kind") == "Issuer"}
    docs = render(helm, "tls")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    tls = endpoint_of(monitor)["tlsConfig"]
    (server,) = [c for c in certificates.values() if c["secretName"] == tls["ca"]["secret"]["name"]]
    assert tls["serverName"] in server["dnsNames"]
    assert f"{tls['serverName']}.cluster.local" in server["dnsNames"]
    assert "server auth" in server["usages"]
    ca_secret = issuers[server["issuerRef"]["name"]]["ca"]["secretName"]
    (ca,) = [c for c in certificates.values() if c["secretName"] == ca_secret]
    assert ca["isCA"] is True and "selfSigned" in issuers[ca["issuerRef"]["name"]]
    workload, _ = enricher_of(docs)
    namespace = workload["metadata"]["namespace"]
    for d in objects:
        if d.get("kind") in ("Certificate", "Issuer"):
            assert d["metadata"]["namespace"] == namespace


@pytest.mark.parametrize(
    ("profile", "capabilities", "volumes", "uids"),
    [
        ("sidecar", ["SYS_ADMIN"], ["emptyDir", "hostPath", "projected"], {"uid": 0}),
        (
            "nonroot",
            ["SYS_ADMIN"],
            ["emptyDir", "hostPath", "projected"],
            {"uidRangeMin": 0, "uidRangeMax": IMAGE_UID},
        ),
        ("openshift", None, ["hostPath", "projected"], {"uid": 0}),
        ("least-privilege", None, ["projected"], {"uid": IMAGE_UID}),
    ],
)
def test_scc_grants_what_the_pods_use(
    helm: HelmRelease,
    profile: str,
    capabilities: list[str] | None,
    volumes: list[str],
    uids: dict[str, int],
) -> None:
    """openshift.scc.create: an SCC that admits the pods and grants nothing more (hostPath only
    with the PodResources mount, SYS_ADMIN only beside dcgm-exporter, the UIDs they run as),
    usable by their ServiceAccount alone through a Role; nothing of it otherwise."""
    if profile == "openshift":  # the gpu-operator profile with the SCC on
        assert not of_kind(render(helm, "gpu-operator"), "SecurityContextConstraints", "Role")
        docs = render(helm, profile)
    else:
        assert not of_kind(render(helm, profile), "SecurityContextConstraints", "Role")
        docs = render(helm, profile, "--set", "openshift.scc.create=true")
    (scc,) = of_kind(docs, "SecurityContextConstraints")
    assert scc_problems(docs) == []
    assert scc["allowedCapabilities"] == capabilities
    assert scc["volumes"] == volumes
    assert {k: v for k, v in scc["runAsUser"].items() if k != "type"} == uids
    assert rbac_problems(docs) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda scc, docs: scc.update(allowHostPID=False), "allowHostPID"),
        (lambda scc, docs: scc.update(allowedCapabilities=None), "allowedCapabilities"),
        (lambda scc, docs: scc["volumes"].append("secret"), "volumes"),
        (lambda scc, docs: scc.update(readOnlyRootFilesystem=True) or _writable(docs), "root"),
        (lambda scc, docs: scc["runAsUser"].update(uid=10001), "UID 0"),
        (lambda scc, docs: scc.update(seccompProfiles=["*"]), "seccomp"),
        (lambda scc, docs: scc.update(users=["system:serviceaccount:x:y"]), "users/groups"),
        (
            lambda scc, docs: of_kind(docs, "RoleBinding")[0]["subjects"][0].update(name="x"),
            "may not use it",
        ),
    ],
    ids=["hostpid", "sys-admin", "extra-volume", "writable-root", "uid", "seccomp", "users", "sa"],
)
def test_scc_problems_catch(
    helm: HelmRelease, mutate: Callable[[Doc, Docs], object], expected: str
) -> None:
    docs = copy.deepcopy(render(helm, "sidecar", "--set", "openshift.scc.create=true"))
    (scc,) = of_kind(docs, "SecurityContextConstraints")
    assert scc_problems(docs) == []
    mutate(scc, docs)
    assert any(expected in p for p in scc_problems(docs)), scc_problems(docs)


def _writable(docs: Docs) -> None:
    _, container = enricher_of(docs)
    container["securityContext"]["readOnlyRootFilesystem"] = False
