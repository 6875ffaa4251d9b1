"""The enricher beside a release of NVIDIA's real dcgm-exporter Helm chart, two ways.

- deploy/dcgm-enricher-post-renderer, the Helm post-renderer;
- deploy/dcgm-exporter-native-sidecar-values.yaml, the chart's own initContainers value carrying
  the enricher as a native sidecar, with manifests/patches/dcgm-exporter-native-sidecar for the
  objects the chart has no value for.

NVIDIA's chart (../shared/fixtures/charts/dcgm-exporter-4.8.2, not ours: read, never copied) is
rendered by the real Helm 3 (``--post-renderer PATH``) and Helm 4 (the same folder installed as
a postrenderer/v1 plugin into a private HELM_DATA_HOME), and every object that comes out is
validated against the Kubernetes schemas and the invariants of tests/test_manifests.py. What the
post-renderer does not add or change must be NVIDIA's objects exactly as the chart renders them.
The tests skip when ../shared is absent. No cluster is needed.
"""

from __future__ import annotations

import copy
import functools
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.tools import load_script, run_tool

from .helmreleases import HelmRelease, releases, require
from .test_manifests import (
    ENRICHER_CONTAINER,
    ENRICHER_PORT,
    K8S_VERSIONS,
    MANIFESTS,
    binding_problems,
    build,
    enricher_of,
    enricher_problems,
    enricher_setting,
    image_problems,
    monitor_problems,
    namespace_problems,
    needs_kubectl,
    of_kind,
    other_container_problems,
    patch_problems,
    pod_spec,
    rbac_problems,
    schema_errors,
    uncommented_exceptions,
    wiring_problems,
)

ROOT = Path(__file__).resolve().parent.parent
RENDERER = ROOT / "deploy" / "dcgm-enricher-post-renderer"
SCRIPT = RENDERER / "post_render.py"
PLUGIN = "dcgm-enricher-post-renderer"
NVIDIA_CHART = ROOT.parent / "shared" / "fixtures" / "charts" / "dcgm-exporter-4.8.2"
RELEASE = "dcgm-exporter"
NAMESPACE = "gpu-monitoring"
NATIVE_VALUES = ROOT / "deploy" / "dcgm-exporter-native-sidecar-values.yaml"
COMPANION = "patches/dcgm-exporter-native-sidecar"
COMPONENT_PATCH = MANIFESTS / "components/add-to-dcgm-exporter/enricher-sidecar.yaml"
# What docs/install.md tells users to set on NVIDIA's chart: its defaults schedule on every node
# (no GPU node selector, no nvidia.com/gpu toleration), which the post-renderer leaves alone.
GPU_NODES = (
    '--set-json=nodeSelector={"nvidia.com/gpu.present":"true"}',
    '--set-json=tolerations=[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]',
)
SCHEDULING_PROBLEMS = [
    "no node selection on an nvidia.com/gpu* label",
    "the nvidia.com/gpu taint is not tolerated",
]

Doc = dict[str, Any]
Docs = tuple[Doc, ...]

# Checks real Helm against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = [
    pytest.mark.one_python,
    pytest.mark.skipif(
        not NVIDIA_CHART.is_dir(), reason=f"NVIDIA's chart is not at {NVIDIA_CHART} (../shared)"
    ),
]


# post_render.py is a script in a plugin folder, not a package.
post_render = load_script(SCRIPT, "dcgm_enricher_post_render")


@functools.cache
def helm_home(release: HelmRelease, base: str) -> dict[str, str]:
    """A private Helm home per release: Helm 4 gets the plugin installed, Helm 3 no plugins
    at all (Helm 3.17 cannot read Helm 4's apiVersion v1 plugin.yaml and says so)."""
    home = Path(base) / release.id
    env = {
        **os.environ,
        "HELM_DATA_HOME": str(home / "data"),
        "HELM_PLUGINS": str(home / "data" / "plugins"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        # The script's `#!/usr/bin/env python3` finds this Python (it has PyYAML).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    (home / "data" / "plugins").mkdir(parents=True, exist_ok=True)
    if release.id == "helm4":
        proc = run_helm(release, env, "plugin", "install", str(RENDERER))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return env


def run_helm(
    release: HelmRelease, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return run_tool([release.helm, *args], env=env)


def post_renderer_args(release: HelmRelease, *args: str) -> list[str]:
    """How docs/install.md passes the post-renderer to this Helm release."""
    target = str(SCRIPT) if release.id == "helm3" else PLUGIN
    return ["--post-renderer", target, *(x for a in args for x in ("--post-renderer-args", a))]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("helm-homes"))


@pytest.fixture(params=releases(), ids=lambda r: r.id)
def helm(request: pytest.FixtureRequest) -> HelmRelease:
    return require(request.param)


@functools.cache
def render_proc(
    release: HelmRelease, base: str, post: tuple[str, ...] | None, *values: str
) -> subprocess.CompletedProcess[str]:
    """``helm template`` of NVIDIA's chart; ``post`` None: without the post-renderer."""
    name, namespace = RELEASE, NAMESPACE
    rest = list(values)
    if rest and rest[0].startswith("release="):
        name, namespace = rest.pop(0).removeprefix("release=").split("/")
    args = ["template", name, str(NVIDIA_CHART), "-n", namespace, *rest]
    if post is not None:
        args += post_renderer_args(release, *post)
    return run_helm(release, helm_home(release, base), *args)


def render(release: HelmRelease, base: str, post: tuple[str, ...] | None, *values: str) -> Docs:
    """The parsed objects (a fresh copy each time: safe to mutate)."""
    proc = render_proc(release, base, post, *values)
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def key(doc: Doc) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return (doc["kind"], meta.get("namespace", ""), meta["name"])


def added_and_kept(chart: Docs, out: Docs) -> tuple[list[Doc], dict[tuple[str, str, str], Doc]]:
    """The objects the post-renderer added, and the chart's objects as they came out."""
    known = {key(d) for d in chart}
    assert len(known) == len(chart), "the chart renders two objects with one name"
    added = [d for d in out if key(d) not in known]
    kept = {key(d): d for d in out if key(d) in known}
    assert sorted(kept) == sorted(known), "the post-renderer dropped or renamed chart objects"
    return added, kept


def undo(kept: dict[tuple[str, str, str], Doc]) -> dict[tuple[str, str, str], Doc]:
    """The chart's objects with exactly the documented changes reverted."""
    patch = yaml.safe_load(COMPONENT_PATCH.read_text())
    reverted = copy.deepcopy(kept)
    for doc in reverted.values():
        if doc["kind"] == "DaemonSet":
            template = doc["spec"]["template"]
            for label in patch["spec"]["template"]["metadata"]["labels"]:
                del template["metadata"]["labels"][label]
            spec = template["spec"]
            spec["hostPID"] = False  # the chart's default, rendered explicitly
            spec["containers"] = [c for c in spec["containers"] if c["name"] != ENRICHER_CONTAINER]
            added = {v["name"] for v in patch["spec"]["template"]["spec"]["volumes"]}
            spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in added]
        if doc["kind"] == "Service":
            for port in doc["spec"]["ports"]:
                if port.get("targetPort") == "enricher":
                    port["targetPort"] = port["port"]
        if doc["kind"] == "ServiceMonitor":
            for endpoint in doc["spec"]["endpoints"]:
                endpoint["honorLabels"] = False  # the chart's default
    return reverted


def invariant_problems(chart: Docs, out: Docs, namespace: str = NAMESPACE) -> list[str]:
    """The invariants of tests/test_manifests.py for what the post-renderer adds, checked on
    the whole output; NVIDIA's own RBAC (a Role that reads its metrics ConfigMap) is the
    chart's, kept as it is, and left out of the RBAC checks."""
    added, _ = added_and_kept(chart, out)
    workload, container = enricher_of(out)
    account = [d for d in out if d["kind"] == "ServiceAccount"]
    return (
        image_problems(out)
        + rbac_problems(tuple(added))
        + binding_problems((*added, workload, *account), namespace)
        + monitor_problems(out)
        + wiring_problems(out)
        + enricher_problems(workload, container)
        + other_container_problems(out)
        + namespace_problems(out, namespace)
        + (patch_problems(out) if namespace == NAMESPACE else [])
    )


# --------------------------------------------------------------------------- with real Helm


def test_plugin_manifest_names_the_folder_and_the_script() -> None:
    plugin = yaml.safe_load((RENDERER / "plugin.yaml").read_text())
    assert plugin["apiVersion"] == "v1" and plugin["type"] == "postrenderer/v1"
    assert plugin["runtime"] == "subprocess"
    # A local `helm plugin install` links the folder under its own name; Helm finds the plugin
    # by its plugin.yaml name. They must agree, or --post-renderer finds nothing.
    assert plugin["name"] == RENDERER.name == PLUGIN
    (command,) = plugin["runtimeConfig"]["platformCommand"]
    assert command["command"] == "${HELM_PLUGIN_DIR}/" + SCRIPT.name
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env python3\n")


def test_plugin_parts_are_the_manifests() -> None:
    """One source: the container, RBAC, rules and dashboard are links to manifests/."""
    links = {
        "enricher-sidecar.yaml": "components/add-to-dcgm-exporter/enricher-sidecar.yaml",
        "rbac.yaml": "base/rbac.yaml",
        "prometheusrule.yaml": "monitoring/prometheusrule.yaml",
        "grafana-dashboard.yaml": "monitoring/grafana-dashboard.yaml",
    }
    for name, target in links.items():
        assert (RENDERER / name).is_symlink()
        assert (RENDERER / name).resolve() == MANIFESTS / target


def test_helm4_lists_the_plugin(base: str) -> None:
    helm4 = require(releases()[1])
    proc = run_helm(helm4, helm_home(helm4, base), "plugin", "list")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [PLUGIN, "0.1.0", "postrenderer/v1", "v1"] in [r[:4] for r in rows], proc.stdout


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_objects_match_schemas(helm: HelmRelease, base: str, k8s_version: str) -> None:
    errors = [
        f"{d['kind']}/{d['metadata']['name']}: {err}"
        for d in render(helm, base, ("--monitoring",), *GPU_NODES)
        for err in schema_errors(d, k8s_version)
    ]
    assert errors == []


def test_invariants(helm: HelmRelease, base: str) -> None:
    chart = render(helm, base, None, *GPU_NODES)
    out = render(helm, base, (), *GPU_NODES)
    assert invariant_problems(chart, out) == []


def test_chart_defaults_leave_only_the_chart_scheduling(helm: HelmRelease, base: str) -> None:
    """With NVIDIA's defaults the one thing missing is the chart's own: GPU node scheduling,
    which the post-renderer does not touch."""
    chart = render(helm, base, None)
    out = render(helm, base, ())
    assert invariant_problems(chart, out) == SCHEDULING_PROBLEMS


def test_everything_else_is_nvidias(helm: HelmRelease, base: str) -> None:
    """Reverting exactly the documented changes gives the chart's own objects back."""
    chart = render(helm, base, None, *GPU_NODES)
    added, kept = added_and_kept(chart, render(helm, base, (), *GPU_NODES))
    assert undo(kept) == {key(d): d for d in chart}
    assert sorted(d["kind"] for d in added) == ["ClusterRole", "ClusterRoleBinding"]


def test_scrape_points_at_the_enricher(helm: HelmRelease, base: str) -> None:
    out = render(helm, base, (), *GPU_NODES)
    (service,) = of_kind(out, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9400, "targetPort": "enricher", "protocol": "TCP"}
    ]
    (monitor,) = of_kind(out, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    _, container = enricher_of(out)
    assert {"name": "enricher", "containerPort": ENRICHER_PORT, "protocol": "TCP"} in container[
        "ports"
    ]


def test_the_exporter_gets_no_token(helm: HelmRelease, base: str) -> None:
    """Only the enricher container mounts the ServiceAccount token; the chart's pod keeps
    automountServiceAccountToken: false, so dcgm-exporter has none."""
    workload, enricher = enricher_of(render(helm, base, (), *GPU_NODES))
    spec = pod_spec(workload)
    assert spec["automountServiceAccountToken"] is False
    (exporter,) = [c for c in spec["containers"] if c["name"] == "exporter"]
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token_dir not in [m["mountPath"] for m in exporter.get("volumeMounts", [])]
    assert token_dir in [m["mountPath"] for m in enricher["volumeMounts"]]


def test_helm3_and_helm4_post_render_the_same(base: str) -> None:
    helm3, helm4 = (require(r) for r in releases())
    assert sorted(render(helm3, base, ("--monitoring",)), key=key) == sorted(
        render(helm4, base, ("--monitoring",)), key=key
    )


def test_follows_release_namespace_port_and_account(helm: HelmRelease, base: str) -> None:
    """Another release name and namespace, the exporter on 9500, a named ServiceAccount."""
    values = (
        "release=gpu-metrics/monitoring",
        *GPU_NODES,
        "--set=service.port=9500",
        "--set=service.address=:9500",
        "--set=serviceAccount.name=gpu-metrics-sa",
    )
    chart = render(helm, base, None, *values)
    out = render(helm, base, (), *values)
    assert invariant_problems(chart, out, "monitoring") == []
    workload, container = enricher_of(out)
    assert workload["metadata"]["name"] == "gpu-metrics-dcgm-exporter"
    upstream = enricher_setting(container, "--upstream.url", "")
    assert upstream == "http://127.0.0.1:9500/metrics"
    (binding,) = of_kind(out, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-metrics-sa", "namespace": "monitoring"}
    ]
    assert binding["metadata"]["name"] == "dcgm-enricher-monitoring-gpu-metrics-dcgm-exporter"


def test_without_the_charts_servicemonitor(helm: HelmRelease, base: str) -> None:
    """serviceMonitor.enabled=false: the Service still reaches the enricher, no monitor added
    (a plain Prometheus job scrapes it, docs/install.md)."""
    values = (*GPU_NODES, "--set=serviceMonitor.enabled=false")
    problems = invariant_problems(
        render(helm, base, None, *values), render(helm, base, (), *values)
    )
    assert problems == ["expected exactly one ServiceMonitor or PodMonitor, found []"]


def test_monitoring_adds_rules_and_dashboard(helm: HelmRelease, base: str) -> None:
    chart = render(helm, base, None, *GPU_NODES)
    added, _ = added_and_kept(chart, render(helm, base, ("--monitoring",), *GPU_NODES))
    shipped = [
        d
        for name in ("prometheusrule.yaml", "grafana-dashboard.yaml")
        for d in yaml.safe_load_all((MANIFESTS / "monitoring" / name).read_text())
    ]
    extra = [d for d in added if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
    assert [d["metadata"].pop("namespace") for d in extra] == [NAMESPACE, NAMESPACE]
    assert sorted(extra, key=key) == sorted(shipped, key=key)  # Helm 4 sorts by kind


def test_a_failure_stops_helm(helm: HelmRelease, base: str) -> None:
    """TLS on the exporter: Helm fails. Helm 3 shows the reason; Helm 4.1 drops a plugin's
    stderr (its debug log says stderr="" ), so docs/install.md says to run the script by
    hand to read it."""
    proc = render_proc(helm, base, (), "--set=tlsServerConfig.enabled=true")
    assert proc.returncode != 0 and proc.stdout == ""
    if helm.id == "helm3":
        assert "the exporter serves TLS or basic auth" in proc.stderr
    else:
        assert f'plugin "{PLUGIN}" exited with error' in proc.stderr


# --------------------------------------------------------------------------- the script itself


@pytest.fixture(scope="module")
def chart_docs(base: str) -> list[Doc]:
    helm3 = require(releases()[0])
    return list(render(helm3, base, None, *GPU_NODES))


def _daemonset(docs: list[Doc]) -> Doc:
    return next(d for d in docs if d["kind"] == "DaemonSet")


def _exporter(docs: list[Doc]) -> Doc:
    return next(c for c in pod_spec(_daemonset(docs))["containers"] if c["name"] == "exporter")


def _env(docs: list[Doc], name: str, value: str) -> None:
    env = _exporter(docs)["env"]
    env[:] = [e for e in env if e["name"] != name] + [{"name": name, "value": value}]


REFUSALS = [
    ("no-daemonset", lambda d: d.remove(_daemonset(d)), "found 0"),
    ("two-daemonsets", lambda d: d.append(copy.deepcopy(_daemonset(d))), "found 2"),
    (
        "enricher-present",
        lambda d: (
            pod_spec(_daemonset(d))
            .setdefault("initContainers", [])
            .append({"name": ENRICHER_CONTAINER, "image": "x:1"})
        ),
        "already has a dcgm-enricher container",
    ),
    ("tls", lambda d: _env(d, "DCGM_EXPORTER_WEB_CONFIG_FILE", "/w.yaml"), "TLS or basic auth"),
    ("on-9401", lambda d: _env(d, "DCGM_EXPORTER_LISTEN", ":9401"), "the enricher's port"),
    ("pod-ip", lambda d: _env(d, "DCGM_EXPORTER_LISTEN", "10.0.0.7:9400"), "loopback cannot"),
    ("bad-listen", lambda d: _env(d, "DCGM_EXPORTER_LISTEN", "9400"), "listen address"),
    (
        "no-namespace",
        lambda d: _daemonset(d)["metadata"].pop("namespace"),
        "no metadata.namespace",
    ),
    (
        "volume-taken",
        lambda d: pod_spec(_daemonset(d))["volumes"].append(
            {"name": "dcgm-enricher-api-access", "emptyDir": {}}
        ),
        "already has a volume named dcgm-enricher-api-access",
    ),
    (
        "no-pod-resources",
        lambda d: pod_spec(_daemonset(d))["volumes"].pop(0),
        "lacks the volumes ['pod-gpu-resources']",
    ),
    ("not-an-object", lambda d: d.append(["a", "list"]), "not a Kubernetes object"),
]


@pytest.mark.parametrize(
    ("mutate", "message"), [(m, msg) for _, m, msg in REFUSALS], ids=[i for i, _, _ in REFUSALS]
)
def test_refuses_what_it_cannot_handle(chart_docs: list[Doc], mutate: Any, message: str) -> None:
    docs = copy.deepcopy(chart_docs)
    mutate(docs)
    with pytest.raises(post_render.PostRenderError, match=message.replace("[", r"\[")):
        post_render.enrich(docs, post_render.load_parts())


def test_address_flag_beats_the_environment(chart_docs: list[Doc]) -> None:
    docs = copy.deepcopy(chart_docs)
    _exporter(docs)["args"] += ["-a", "127.0.0.1:9600"]
    out = post_render.enrich(docs, post_render.load_parts())
    _, container = enricher_of(tuple(out))
    assert "--upstream.url=http://127.0.0.1:9600/metrics" in container["args"]


def test_input_is_left_alone(chart_docs: list[Doc]) -> None:
    before = copy.deepcopy(chart_docs)
    post_render.enrich(chart_docs, post_render.load_parts())
    assert chart_docs == before


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"a: [unclosed\n", "is not YAML"),
        (b"\xff\xfe", "is not UTF-8"),
        (b"x" * 65, "exceeds 64 bytes"),
    ],
    ids=["not-yaml", "not-utf8", "too-big"],
)
def test_main_reports_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data: bytes, message: str
) -> None:
    monkeypatch.setattr(post_render, "MAX_INPUT_BYTES", 64)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert post_render.main([]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{PLUGIN}: error: ") and message in captured.err


# --------------------------------------------------------------------------- native sidecar


def native(helm: HelmRelease, base: str, *values: str) -> Docs:
    """NVIDIA's chart with the native-sidecar values file (and the GPU node scheduling)."""
    return render(helm, base, None, "-f", str(NATIVE_VALUES), *GPU_NODES, *values)


def as_regular_container(docs: Docs) -> Docs:
    """The objects with the enricher's native sidecar moved among the pod's containers, where
    the checks of tests/test_manifests.py look for it (they see the same container spec)."""
    moved = copy.deepcopy(docs)
    for workload in of_kind(moved, "DaemonSet"):
        spec = pod_spec(workload)
        sidecars = [c for c in spec.get("initContainers", []) if c["name"] == ENRICHER_CONTAINER]
        for sidecar in sidecars:
            assert sidecar.pop("restartPolicy") == "Always"
            spec["initContainers"].remove(sidecar)
            spec["containers"].append(sidecar)
        if "initContainers" in spec and not spec["initContainers"]:
            del spec["initContainers"]
    return moved


def test_native_sidecar_values_comment_their_exceptions() -> None:
    assert uncommented_exceptions(NATIVE_VALUES.read_text()) == []


def test_native_sidecar_is_the_components_container() -> None:
    """One container spec: the values file's init container is the component's container with
    restartPolicy: Always, and its token volume is the component's."""
    values = yaml.safe_load(NATIVE_VALUES.read_text())
    patch = yaml.safe_load(COMPONENT_PATCH.read_text())["spec"]["template"]["spec"]
    (sidecar,) = values["initContainers"]
    assert sidecar.pop("restartPolicy") == "Always"
    assert [sidecar] == patch["containers"]
    assert values["hostPID"] is patch["hostPID"] is True
    chart_default = yaml.safe_load((NVIDIA_CHART / "values.yaml").read_text())
    assert values["extraConfigMapVolumes"] == [
        *chart_default["extraConfigMapVolumes"],
        *patch["volumes"],
    ]


@needs_kubectl
@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_native_sidecar_objects_match_schemas(
    helm: HelmRelease, base: str, k8s_version: str
) -> None:
    docs = native(helm, base) + build(COMPANION)
    errors = [
        f"{d['kind']}/{d['metadata']['name']}: {err}"
        for d in docs
        for err in schema_errors(d, k8s_version)
    ]
    assert errors == []


@needs_kubectl
def test_native_sidecar_invariants(helm: HelmRelease, base: str) -> None:
    """The chart's release plus the companion entry point hold every invariant; the chart's
    own RBAC is NVIDIA's Role for its metrics ConfigMap, nothing that reads pods."""
    chart = native(helm, base)
    (workload,) = of_kind(chart, "DaemonSet")
    spec = pod_spec(workload)
    assert [c["name"] for c in spec["initContainers"]] == [ENRICHER_CONTAINER]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    companion = build(COMPANION)
    docs = as_regular_container(chart + companion)
    workload, container = enricher_of(docs)
    problems = (
        image_problems(docs)
        + rbac_problems(companion)
        + binding_problems((*companion, workload), NAMESPACE)
        + monitor_problems(docs)
        + wiring_problems(docs)
        + enricher_problems(workload, container)
        + other_container_problems(docs)
        + namespace_problems(docs, NAMESPACE)
        + patch_problems(docs)
    )
    assert problems == []
    chart_rbac = of_kind(chart, "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    assert [(d["kind"], d["metadata"]["name"]) for d in chart_rbac] == [
        ("Role", "dcgm-exporter-read-cm"),
        ("RoleBinding", "dcgm-exporter"),
    ]
    assert [r["resources"] for r in chart_rbac[0]["rules"]] == [["configmaps"]]
    # The chart's RoleBinding follows serviceAccount.name to the companion's ServiceAccount.
    assert chart_rbac[1]["subjects"][0]["name"] == "dcgm-enricher"
    assert not of_kind(chart, "ServiceAccount") and not of_kind(chart, "ServiceMonitor")


def test_the_charts_only_pod_grant_is_too_wide(helm: HelmRelease, base: str) -> None:
    """Finding: the chart's values cannot carry the enricher's RBAC. Its one pod-reading grant
    (kubernetes.enablePodLabels) is a single rule across both API groups and both resources
    (get/list/watch on resourceslices too, where the enricher lists only) and hands the
    exporter a token."""
    docs = native(helm, base, "--set=kubernetes.enablePodLabels=true")
    (role,) = of_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {
            "apiGroups": ["", "resource.k8s.io"],
            "resources": ["pods", "resourceslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    problems = rbac_problems(tuple(d for d in docs if d["kind"].startswith("Cluster")))
    assert "apiGroups ['', 'resource.k8s.io'], expected ['']" in problems
    assert pod_spec(of_kind(docs, "DaemonSet")[0])["automountServiceAccountToken"] is True


def test_the_charts_service_port_is_the_exporters(helm: HelmRelease, base: str) -> None:
    """Finding: the chart's values cannot point its Service at the enricher. service.port is
    the Service's port and targetPort, and also the exporter's containerPort and probe port:
    moving it to 9401 would send the exporter's /health probes to the enricher."""
    docs = native(helm, base, "--set=service.port=9401")
    (service,) = of_kind(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == 9401
    exporter = next(c for c in pod_spec(of_kind(docs, "DaemonSet")[0])["containers"])
    assert exporter["name"] == "exporter"
    assert exporter["ports"] == [{"name": "metrics", "containerPort": 9401}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert exporter[probe]["httpGet"] == {"path": "/health", "port": 9401, "scheme": "HTTP"}


def test_install_docs_use_the_shipped_paths_and_names() -> None:
    """docs/install.md's commands name the script, the plugin folder, the plugin and the
    values file as shipped."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text.split("\n## Existing dcgm-exporter Helm install\n", 1)[1].split("\n## ", 1)[0]
    assert f"--post-renderer ./{SCRIPT.relative_to(ROOT)}" in section
    assert f"helm plugin install ./{RENDERER.relative_to(ROOT)}" in section
    assert f"--post-renderer {PLUGIN} --post-renderer-args --monitoring" in section
    assert f"-f {NATIVE_VALUES.relative_to(ROOT)}" in section
    assert f"kubectl apply -k manifests/{COMPANION}" in section
