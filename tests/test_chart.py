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

No cluster is needed.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from enricher.cli import build_parser

from .helmreleases import HelmRelease, releases, require
from .test_manifests import (
    IMAGE_UID,
    K8S_VERSIONS,
    MONITOR_KINDS,
    EntryPoint,
    all_problems,
    build,
    edited_overlay,
    enricher_of,
    needs_kubectl,
    of_kind,
    project_version,
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
}
# Profiles whose release lives in another namespace than its objects (namespace.name).
RELEASE_NAMESPACES = {"namespace": "default"}
# Profiles whose enricher runs as another UID than root (enricher.runAsUser).
UIDS = {"nonroot": IMAGE_UID}


@pytest.fixture(params=releases(), ids=lambda r: r.id)
def helm(request: pytest.FixtureRequest) -> HelmRelease:
    """Each Helm release in turn (tests.helmreleases)."""
    return require(request.param)


def run_helm(release: HelmRelease, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [release.helm, *args], capture_output=True, text=True, timeout=60, check=False
    )


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


def test_helm_reports_the_release(helm: HelmRelease) -> None:
    proc = run_helm(helm, "version", "--template", "{{.Version}}")
    assert proc.stdout.strip() == f"v{helm.version}", proc.stdout + proc.stderr


def test_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == project_version()


def test_chart_files_are_the_shipped_rules_and_dashboard() -> None:
    """One source: the chart's files are links to the rules file and the dashboard JSON."""
    files = CHART / "files"
    assert (files / "dcgm-enricher.rules.yaml").resolve() == ROOT / "rules/dcgm-enricher.rules.yaml"
    assert (files / "dcgm-enricher.json").resolve() == ROOT / "grafana/dcgm-enricher.json"


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_strict(helm: HelmRelease, profile: str) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values_file(profile)))
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
    chart = normalised(render(helm, profile))
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
    assert normalised(render(helm, "podmonitor")) == expected


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
        return 2.5, 2.5
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


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mode=daemon", "mode"),
        ("monitor.kind=Both", "monitor"),
        ("enricher.flags.web\\.listen=:1", "flags"),
        ("enricher.runAsUser=-1", "runAsUser"),
        ("namespace.create=yes", "create"),
        ("namespace.name=GPU_Monitoring", "name"),
    ],
)
def test_schema_rejects(helm: HelmRelease, override: str, message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", override)
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.parametrize("profile", ["sidecar", "gpu-operator", "namespace"])
def test_notes_say_how_to_verify(profile: str) -> None:
    """NOTES name the release's DaemonSet and only metrics that exist. Helm 4 renders them
    offline (``install --dry-run=client``); Helm 3.17 contacts a cluster for that, and its
    ``lint`` renders NOTES.txt without showing them."""
    helm4 = require(releases()[1])
    namespace = PROFILES[profile][0]
    release_namespace = RELEASE_NAMESPACES.get(profile, namespace)
    args = ["install", RELEASE, str(CHART), "-n", release_namespace]
    proc = run_helm(helm4, *args, "-f", str(values_file(profile)), "--dry-run=client")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("\nNOTES:\n", 1)[1]
    assert f"kubectl -n {namespace} rollout status daemonset/{RELEASE}" in notes
    metrics = (ROOT / "docs" / "metrics.md").read_text()
    named = re.findall(r"dcgm_enricher_[a-z_]+", notes)
    assert named and all(name in metrics for name in named), named
    assert ("pod-security.kubernetes.io/enforce=privileged" in notes) == (profile == "sidecar")
    assert ("`helm uninstall` deletes it" in notes) == (profile == "namespace")


def test_package_holds_the_linked_files(helm: HelmRelease, tmp_path: Path) -> None:
    """``helm package`` copies the contents behind files/ and leaves ci/ out."""
    proc = run_helm(helm, "package", str(CHART), "-d", str(tmp_path))
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
    runAsNonRoot changed and --no-kubelet.enabled added; nothing else."""
    root, nonroot = (render(helm, p) for p in ("sidecar", "nonroot"))
    _, container = enricher_of(root)
    container["securityContext"].update(
        runAsNonRoot=True, runAsUser=IMAGE_UID, runAsGroup=IMAGE_UID
    )
    container["args"].insert(2, "--no-kubelet.enabled")
    assert normalised(nonroot) == normalised(root)


def test_nonroot_kubelet_flag_wins(helm: HelmRelease, tmp_path: Path) -> None:
    """A node whose PodResources socket the UID may use: enricher.flags turns the source on."""
    values = tmp_path / "kubelet.yaml"
    values.write_text("enricher:\n  flags:\n    kubelet.enabled: true\n")
    _, container = enricher_of(render(helm, "nonroot", "-f", str(values)))
    assert "--kubelet.enabled" in container["args"]
    assert "--no-kubelet.enabled" not in container["args"]


def test_namespace_create_refuses_the_gpu_operators(helm: HelmRelease) -> None:
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--set",
        "mode=gpu-operator",
        "--set",
        "namespace.create=true",
    )
    assert proc.returncode != 0
    assert "namespace.create: the GPU Operator's namespace is the operator's" in proc.stderr


def test_namespace_name_without_create_moves_every_object(helm: HelmRelease) -> None:
    """namespace.name alone: every namespaced object there, no Namespace object."""
    docs = render(helm, "sidecar", "--set", "namespace.name=monitoring")
    assert not of_kind(docs, "Namespace")
    assert all_problems(EntryPoint("charts (namespace.name)", "monitoring", "sidecar"), docs) == []
