"""The compose stack (deploy/compose/): what can be checked without a container engine.

The compose files parse and hold what the stack needs, the enricher's command parses with the
real CLI, the Prometheus configuration passes ``promtool check config`` laid out as the
container sees it (rules included), and the Grafana provisioning matches the dashboards.
Checks of the rules and dashboards (issue 6) skip, saying so, until those files exist.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from devkit.promtool import run as promtool_run
from enricher.cli import parse_config
from enricher.docker import parse_docker_host

from .composefile import load_compose, merge

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
CGROUP_ONLY_FILE = COMPOSE / "cgroup-only.yml"
PROMETHEUS_FILE = COMPOSE / "prometheus" / "prometheus.yml"
DATASOURCES = COMPOSE / "grafana" / "provisioning" / "datasources"
DASHBOARD_PROVIDERS = COMPOSE / "grafana" / "provisioning" / "dashboards"
RULES_DIR = ROOT / "rules"
DASHBOARDS_DIR = ROOT / "grafana"
SIDECAR_DAEMONSET = ROOT / "manifests" / "overlays" / "sidecar" / "daemonset.yaml"
SERVICES = {"dcgm-exporter", "enricher", "prometheus", "grafana"}
PROM_CONFIG_IN_CONTAINER = PurePosixPath("/etc/prometheus/prometheus.yml")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose(COMPOSE_FILE)


def service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    svc = compose["services"][name]
    assert isinstance(svc, dict)
    return svc


def binds(svc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of every volume, short or long syntax."""
    out: list[tuple[str, str, bool]] = []
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
    return out


def gpu_requests(svc: dict[str, Any]) -> list[dict[str, Any]]:
    devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    return [d for d in devices or [] if d.get("driver") == "nvidia"]


def env(svc: dict[str, Any]) -> dict[str, str]:
    raw = svc.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def interpolate_default(value: str) -> str:
    """``${VAR:-default}`` as compose resolves it with VAR unset."""
    if value.startswith("${") and value.endswith("}") and ":-" in value:
        return value[2:-1].split(":-", 1)[1]
    return value


def host_path(source: str) -> Path:
    """A bind source relative to the compose file, on this checkout."""
    return (COMPOSE / source).resolve()


# --------------------------------------------------------------------------- compose file


def test_compose_file_parses_with_the_four_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == SERVICES
    assert "version" not in compose  # obsolete in the Compose specification
    for name, svc in compose["services"].items():
        assert svc.get("restart") == "unless-stopped", name
        assert not svc.get("privileged"), f"{name}: privileged"
        assert svc.get("network_mode") != "host", f"{name}: host network"
    for name, _vol in compose.get("volumes", {}).items():
        used = any(
            src == name for svc in compose["services"].values() for src, _t, _ro in binds(svc)
        )
        assert used, f"named volume {name} is not used"


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc["image"]
        if "build" in svc:
            assert svc.get("pull_policy") == "build", f"{name}: built here, never pulled"
            assert (host_path(svc["build"]["context"]) / "Dockerfile").is_file()
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: {image} not pinned"


def test_dcgm_exporter_image_is_the_one_the_manifests_use(compose: dict[str, Any]) -> None:
    images = {
        c["image"]
        for doc in yaml.safe_load_all(SIDECAR_DAEMONSET.read_text())
        if doc and doc.get("kind") == "DaemonSet"
        for c in doc["spec"]["template"]["spec"]["containers"]
        if "dcgm-exporter:" in c["image"]
    }
    assert images == {service(compose, "dcgm-exporter")["image"]}
    assert images == {"nvcr.io/nvidia/k8s/dcgm-exporter:4.6.1-4.8.4-distroless"}


def test_dcgm_exporter_service(compose: dict[str, Any]) -> None:
    svc = service(compose, "dcgm-exporter")
    assert "ports" not in svc, "raw series (wrong pod labels) must not be reachable from outside"
    assert "SYS_ADMIN" in svc["cap_add"]
    (gpu,) = gpu_requests(svc)
    assert gpu["count"] == "all" and "gpu" in gpu["capabilities"]
    assert env(svc)["DCGM_EXPORTER_KUBERNETES"] == "false"


@pytest.fixture
def enricher_config(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Any]]:
    svc = service(compose, "enricher")
    for key in list(os.environ):
        if key.startswith("ENRICHER_") or key in ("NODE_NAME", "KUBECONFIG"):
            monkeypatch.delenv(key)
    for key, value in env(svc).items():
        monkeypatch.setenv(key, value)
    yield parse_config(svc["command"])[:2]


def test_enricher_command_parses_with_the_real_cli(
    compose: dict[str, Any], enricher_config: tuple[str, Any]
) -> None:
    command, config = enricher_config
    assert command == "serve"
    assert not config.kube_active  # no Kubernetes on a Docker host
    upstream = urlsplit(config.upstream_url)
    assert upstream.hostname == "dcgm-exporter" and upstream.hostname in compose["services"]
    listen = env(service(compose, "dcgm-exporter"))["DCGM_EXPORTER_LISTEN"]
    assert upstream.port == int(listen.rsplit(":", 1)[1])
    port = config.listen_address.rsplit(":", 1)[1]
    assert service(compose, "enricher")["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert config.docker_active  # containers are named after Docker's
    assert config.docker_host == env(service(compose, "enricher"))["ENRICHER_DOCKER_HOST"]


def test_enricher_service(compose: dict[str, Any]) -> None:
    svc = service(compose, "enricher")
    assert svc["pid"] == "host"  # NVML reports host PIDs
    assert svc["cgroup"] == "host"
    assert svc["cap_drop"] == ["ALL"] and "cap_add" not in svc
    assert svc["read_only"] is True
    assert "no-new-privileges:true" in svc["security_opt"]
    (gpu,) = gpu_requests(svc)
    assert {"gpu", "utility"} <= set(gpu["capabilities"])
    assert env(svc)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    # The socket the enricher is told to use is the one mounted, read-only, and only that.
    socket = parse_docker_host(env(svc)["ENRICHER_DOCKER_HOST"])
    assert socket is not None
    ((source, target, read_only),) = binds(svc)
    assert target == socket and read_only
    assert interpolate_default(source) == "/var/run/docker.sock"
    (volume,) = svc["volumes"]
    assert volume["bind"]["create_host_path"] is False  # a missing socket fails loudly


def test_the_enricher_names_the_node_as_the_exporter_does(compose: dict[str, Any]) -> None:
    """Without Kubernetes the enricher's node label is its host name (socket.gethostname()):
    the same machine name dcgm-exporter writes into its own host label, GPU_HOST."""
    services = compose["services"]
    assert services["enricher"]["hostname"] == services["dcgm-exporter"]["hostname"]
    assert services["enricher"]["hostname"] == "${GPU_HOST:-gpu-host}"


def test_cgroup_only_override_drops_the_socket(compose: dict[str, Any]) -> None:
    merged = merge(compose, load_compose(CGROUP_ONLY_FILE))
    svc = service(merged, "enricher")
    assert binds(svc) == []
    assert parse_docker_host(env(svc)["ENRICHER_DOCKER_HOST"]) is None
    uid = int(str(svc["user"]).split(":")[0])
    assert uid != 0
    # Everything else stays as in the main file.
    assert svc["pid"] == "host" and svc["command"] == service(compose, "enricher")["command"]
    assert gpu_requests(svc) == gpu_requests(service(compose, "enricher"))


def test_relative_bind_sources_exist(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for source, _target, read_only in binds(svc):
            if source.startswith("./"):
                assert host_path(source).exists(), f"{name}: {source} is missing"
                assert read_only, f"{name}: {source} should be mounted read-only"


# --------------------------------------------------------------------------- Prometheus


def prometheus_config() -> dict[str, Any]:
    data = yaml.safe_load(PROMETHEUS_FILE.read_text())
    assert isinstance(data, dict)
    return data


def mounted_rule_files(compose: dict[str, Any]) -> dict[str, Path]:
    """Container path under /etc/prometheus -> rule file on this checkout."""
    out: dict[str, Path] = {}
    rules_dir = PROM_CONFIG_IN_CONTAINER.parent / "rules"
    for source, target, _ro in binds(service(compose, "prometheus")):
        if PurePosixPath(target).parent == rules_dir:
            rel = PurePosixPath(target).relative_to(PROM_CONFIG_IN_CONTAINER.parent)
            out[str(rel)] = host_path(source)
    return out


def repository_rule_files() -> list[Path]:
    """Rule files in rules/ (a top-level ``groups:``), not promtool's test files."""
    found = []
    for path in sorted([*RULES_DIR.glob("**/*.yaml"), *RULES_DIR.glob("**/*.yml")]):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and "groups" in data and "tests" not in data:
            found.append(path)
    return found


def test_prometheus_config_is_the_one_mounted(compose: dict[str, Any]) -> None:
    prom = service(compose, "prometheus")
    assert f"--config.file={PROM_CONFIG_IN_CONTAINER}" in prom["command"]
    assert ("./prometheus/prometheus.yml", str(PROM_CONFIG_IN_CONTAINER), True) in binds(prom)


def test_prometheus_scrapes_the_enricher_only(
    compose: dict[str, Any], enricher_config: tuple[str, Any]
) -> None:
    _command, config = enricher_config
    port = config.listen_address.rsplit(":", 1)[1]
    jobs = {j["job_name"]: j for j in prometheus_config()["scrape_configs"]}
    enricher = jobs["dcgm-enricher"]
    assert enricher["honor_labels"] is True
    targets = [t for sc in enricher["static_configs"] for t in sc["targets"]]
    assert targets == [f"enricher:{port}"]
    for job in jobs.values():
        for sc in job.get("static_configs", []):
            for target in sc["targets"]:
                assert not target.startswith("dcgm-exporter"), "raw series would be stored twice"
                assert not target.endswith(":9400"), "raw series would be stored twice"


@pytest.fixture
def prometheus_layout(compose: dict[str, Any], tmp_path: Path) -> Path:
    """/etc/prometheus as the container sees it: the config and the mounted rule files."""
    shutil.copy(PROMETHEUS_FILE, tmp_path / "prometheus.yml")
    for rel, source in mounted_rule_files(compose).items():
        if source.is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tmp_path / rel)
    return tmp_path / "prometheus.yml"


def test_promtool_check_config(promtool: str, prometheus_layout: Path) -> None:
    res = promtool_run(promtool, "check", "config", str(prometheus_layout), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_are_mounted_and_pass_promtool(
    compose: dict[str, Any], promtool: str, prometheus_layout: Path
) -> None:
    repo_rules = repository_rule_files()
    assert repo_rules, "rules/ holds no Prometheus rule file"
    mounted = mounted_rule_files(compose)
    assert sorted(mounted.values()) == repo_rules, (
        "deploy/compose/docker-compose.yml must mount every rule file in rules/ under "
        f"/etc/prometheus/rules/: it mounts {sorted(map(str, mounted.values()))}, rules/ holds "
        f"{list(map(str, repo_rules))}"
    )
    globs = prometheus_config()["rule_files"]
    for rel in mounted:
        assert any(PurePosixPath(rel).match(g) for g in globs), f"{rel} matches no rule_files glob"
    res = promtool_run(promtool, "check", "config", str(prometheus_layout), timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rel in mounted:
        assert f"Checking {prometheus_layout.parent / rel}" in out, out
        assert "SUCCESS" in out, out


# --------------------------------------------------------------------------- Grafana


def datasources() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(DATASOURCES.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert data["apiVersion"] == 1
        out += data["datasources"]
    return out


def dashboard_providers() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(DASHBOARD_PROVIDERS.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert data["apiVersion"] == 1
        out += data["providers"]
    return out


def test_grafana_datasource_is_the_stacks_prometheus(compose: dict[str, Any]) -> None:
    (ds,) = datasources()
    assert ds["type"] == "prometheus" and ds["isDefault"] is True and ds["uid"]
    url = urlsplit(ds["url"])
    assert url.hostname == "prometheus" and url.hostname in compose["services"]
    assert url.port == 9090  # Prometheus's default --web.listen-address
    interval = prometheus_config()["global"]["scrape_interval"]
    assert ds["jsonData"]["timeInterval"] == interval


def test_grafana_provisioning_is_mounted(compose: dict[str, Any]) -> None:
    grafana = binds(service(compose, "grafana"))
    assert ("./grafana/provisioning", "/etc/grafana/provisioning", True) in grafana
    (provider,) = dashboard_providers()
    assert provider["type"] == "file"
    dashboards = [(s, t) for s, t, ro in grafana if t == provider["options"]["path"] and ro]
    assert len(dashboards) == 1, "the provider's path must be the mounted dashboards folder"
    assert host_path(dashboards[0][0]) == DASHBOARDS_DIR


def _datasource_refs(node: Any) -> Iterator[Any]:
    """Every ``datasource`` value anywhere in a dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from _datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _datasource_refs(item)


def repository_dashboards() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(DASHBOARDS_DIR.glob("**/*.json")):
        out.append((path, json.loads(path.read_text())))
    return out


def test_dashboards_match_the_provisioning() -> None:
    dashboards = repository_dashboards()
    assert dashboards, f"{DASHBOARDS_DIR} holds no dashboard JSON"
    (ds,) = datasources()
    uids = []
    for path, dash in dashboards:
        # The file provider loads every JSON in the folder: each must be a dashboard.
        assert isinstance(dash.get("uid"), str) and dash["uid"], f"{path}: no fixed uid"
        assert isinstance(dash.get("panels"), list), f"{path}: not a dashboard"
        uids.append(dash["uid"])
        variables = {
            v["name"]: v
            for v in dash.get("templating", {}).get("list", [])
            if v.get("type") == "datasource"
        }
        prom_vars = {n for n, v in variables.items() if v.get("query") == "prometheus"}
        assert prom_vars, f"{path}: no Prometheus datasource variable to pick {ds['name']}"
        allowed = {f"${n}" for n in prom_vars} | {f"${{{n}}}" for n in prom_vars} | {ds["uid"]}
        for ref in _datasource_refs(dash):
            if ref is None:
                continue  # the panel default: the dashboard's datasource
            if isinstance(ref, dict):
                if ref.get("type") in ("grafana", "datasource", "dashboard"):
                    continue  # built-in annotations and mixed/dashboard sources
                ref = ref.get("uid")
            if ref in ("-- Grafana --", "-- Mixed --", "-- Dashboard --"):
                continue
            assert ref in allowed, f"{path}: datasource {ref!r} is not {sorted(allowed)}"
    assert len(set(uids)) == len(uids), "dashboard uids must be unique"
