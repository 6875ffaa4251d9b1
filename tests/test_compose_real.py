"""The compose stack (deploy/compose/) under real Docker Compose v2: Debian unstable's
docker-compose 2.40 (``.ci/compose`` unpacks it into .cache, never installs it), used as the
``docker compose`` CLI plugin through a private ``DOCKER_CONFIG``.

``docker compose config`` validates every combination of files the docs show (their
``docker compose [-f ...]`` command lines are read, not listed here), with and without the
variables the stack reads, and rejects broken files; what real Compose makes of the
cgroup-only override is what tests/test_compose.py's reading of the files (tests/composefile.py)
assumes.

``docker compose up`` runs the stack on the real Docker Engine (tests/dockerengine.py) with
the test override tests/compose-override.yml, which says what it stands in for and why: the
enricher service as the stack defines it, from the image the tests build (tests/imagebuild.py),
beside a stand-in dcgm-exporter (busybox's httpd with a recorded text) and the fake NVML
listing a container of the project; the prometheus service's command, configuration and rules
run by the real Prometheus 3.5 binary. Prometheus's target for the enricher must be up, the
enriched series queryable and every rule evaluated. The engine has no networking, so the whole
stack shares one network namespace with only loopback instead of a project network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from devkit.nvmlfake import FakeNvmlState, default_gpu_uuid
from devkit.tools import require_tool

from .composefile import load_compose, merge
from .conftest import ROOT
from .dockerengine import Engine, skip_or_fail, upstream_body
from .imagebuild import Built
from .promreleases import releases, require

COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
CGROUP_ONLY_FILE = COMPOSE_DIR / "cgroup-only.yml"
OVERRIDE = ROOT / "tests" / "compose-override.yml"
FETCH_SCRIPT = ROOT / ".ci" / "compose"
PLUGIN = ROOT / ".cache" / "compose" / "usr" / "libexec" / "docker" / "cli-plugins"
PLUGIN = PLUGIN / "docker-compose"
# Where the docs show `docker compose` command lines.
DOCS = [
    ROOT / "README.md",
    ROOT / "docs" / "docker.md",
    COMPOSE_DIR / "README.md",
    COMPOSE_FILE,
    CGROUP_ONLY_FILE,
]
_COMMAND = re.compile(r"docker compose((?:\s+-f\s+\S+)*)\s+(?:up|config|down|logs|exec|ps)\b")
GIB = 1 << 30
# `docker compose ARGS` in a folder, with extra variables (the fixture compose_cli).
ComposeRun = Callable[..., "subprocess.CompletedProcess[str]"]

pytestmark = pytest.mark.one_python


def wanted_version() -> str:
    """The Compose version .ci/compose fetches (and docs/docker.md names)."""
    found = re.search(r'^want="([0-9.]+)"$', FETCH_SCRIPT.read_text(), re.MULTILINE)
    assert found, f'{FETCH_SCRIPT} sets no want="VERSION"'
    return found.group(1)


@pytest.fixture(scope="session")
def compose_plugin() -> Path:
    if not os.access(PLUGIN, os.X_OK):
        skip_or_fail(f"no Compose v2 at {PLUGIN}: run .ci/compose (make test does)")
    return PLUGIN


def plugin_config(config_dir: Path, plugin: Path) -> Path:
    """A DOCKER_CONFIG folder whose cli-plugins hold Compose: the CLI then has `compose`."""
    plugins = config_dir / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.exists():
        link.symlink_to(plugin)
    return config_dir


@pytest.fixture(scope="session")
def compose_cli(compose_plugin: Path, tmp_path_factory: pytest.TempPathFactory) -> ComposeRun:
    """``docker compose ARGS`` without a daemon (``config`` needs none), run in deploy/compose
    with only the variables given (none of the caller's DOCKER_*, GPU_HOST, ENRICHER_TEST_*)."""
    docker = require_tool("docker", "apt-get install docker.io (.ci/system-deps does)")
    config = plugin_config(tmp_path_factory.mktemp("docker-config"), compose_plugin)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DOCKER_", "COMPOSE_", "ENRICHER_TEST_")) and k != "GPU_HOST"
    }
    base |= {"DOCKER_CONFIG": str(config), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}

    def run(
        *args: str, env: dict[str, str] | None = None, cwd: Path = COMPOSE_DIR
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [docker, "compose", *args],
            cwd=cwd,
            env={**base, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return run


def documented_combinations() -> set[tuple[str, ...]]:
    """The ``-f`` files of every ``docker compose`` command line in the docs (() is the
    default file, docker-compose.yml)."""
    found: set[tuple[str, ...]] = set()
    for path in DOCS:
        for match in _COMMAND.finditer(path.read_text()):
            found.add(tuple(re.findall(r"-f\s+(\S+)", match.group(1))))
    return found


def file_args(files: tuple[str, ...]) -> list[str]:
    return [arg for name in files for arg in ("-f", name)]


def merged(
    compose_cli: ComposeRun, *args: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    done = compose_cli(*args, "config", "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


def test_compose_is_v2_at_the_version_the_docs_name(compose_cli: ComposeRun) -> None:
    done = compose_cli("version", "--short")
    assert done.returncode == 0, done.stderr
    want = wanted_version()
    assert done.stdout.strip().lstrip("v").startswith(f"{want}."), done.stdout
    for doc in (ROOT / "docs" / "docker.md", COMPOSE_DIR / "README.md"):
        assert f"Compose {want}" in doc.read_text(), f"{doc} does not say Compose {want}"


def test_every_documented_combination_is_valid(compose_cli: ComposeRun) -> None:
    combinations = documented_combinations()
    # The two the stack ships: the default file, and the cgroup-only override on it.
    assert {(), ("docker-compose.yml", "cgroup-only.yml")} <= combinations, combinations
    for files in sorted(combinations):
        for name in files:
            assert (COMPOSE_DIR / name).is_file(), f"the docs name {name}, which is not there"
        done = compose_cli(*file_args(files), "config", "--quiet")
        assert (done.returncode, done.stderr) == (0, ""), f"{files}: {done.stderr}"
        # The variables the README documents reach the services.
        env = {"GPU_HOST": "node-7", "DOCKER_SOCKET": "/run/user/1000/docker.sock"}
        services = merged(compose_cli, *file_args(files), env=env)["services"]
        assert set(services) == {"dcgm-exporter", "enricher", "prometheus", "grafana"}
        assert services["dcgm-exporter"]["hostname"] == "node-7"
        sockets = [v["source"] for v in services["enricher"].get("volumes", [])]
        assert sockets == ([] if "cgroup-only.yml" in files else [env["DOCKER_SOCKET"]])


def test_the_test_override_is_valid_and_says_what_it_needs(compose_cli: ComposeRun) -> None:
    """Without its variables the override stops at the first, naming it; with them it is
    valid, runs no service with a GPU reservation, a published port or a registry image."""
    files = file_args((str(COMPOSE_FILE), str(OVERRIDE)))
    done = compose_cli(*files, "config", "--quiet")
    assert done.returncode != 0
    assert "required variable ENRICHER_TEST_" in done.stderr, done.stderr
    env = {
        "ENRICHER_TEST_IMAGE": "enricher:t",
        "ENRICHER_TEST_BUSYBOX": "busybox:t",
        "ENRICHER_TEST_BASE": "base:t",
        "ENRICHER_TEST_UPSTREAM": "/tmp/upstream",
        "ENRICHER_TEST_NVML": "/tmp/nvml",
        "ENRICHER_TEST_PROMETHEUS": "/tmp/prometheus",
    }
    services = merged(compose_cli, *files, env=env)["services"]
    assert "grafana" not in services  # its profile is never enabled
    for name, svc in services.items():
        assert svc["pull_policy"] == "never", name
        assert svc["image"] in env.values(), name
        assert not svc.get("ports") and "deploy" not in svc, name
        assert svc["network_mode"] in ("none", "service:netns"), name
    # The enricher service keeps what the stack gives it.
    stack = merged(compose_cli, "-f", str(COMPOSE_FILE))["services"]["enricher"]
    ours = services["enricher"]
    for key in ("command", "user", "pid", "cgroup", "read_only", "cap_drop", "security_opt"):
        assert ours[key] == stack[key], key
    assert ours["healthcheck"] == stack["healthcheck"]
    prometheus = merged(compose_cli, "-f", str(COMPOSE_FILE))["services"]["prometheus"]
    assert services["prometheus"]["command"] == prometheus["command"]


def test_real_compose_merges_cgroup_only_as_the_tests_read_it(compose_cli: ComposeRun) -> None:
    """tests/test_compose.py reads the files with tests/composefile.py's merge; real Compose
    gives the enricher the same user, socket variable and (no) volumes."""
    real = merged(compose_cli, "-f", "docker-compose.yml", "-f", "cgroup-only.yml")
    ours = merge(load_compose(COMPOSE_FILE), load_compose(CGROUP_ONLY_FILE))
    real_svc, our_svc = real["services"]["enricher"], ours["services"]["enricher"]
    assert real_svc["user"] == our_svc["user"] == "10001:10001"
    assert real_svc["environment"]["ENRICHER_DOCKER_HOST"] == ""
    assert our_svc["environment"]["ENRICHER_DOCKER_HOST"] == ""
    assert "volumes" not in real_svc and our_svc["volumes"] == []


BROKEN = {
    "misspelt-key": (
        "docker-compose.yml",
        ("    restart: unless-stopped\n", "    restrat: unless-stopped\n"),
        "additional properties 'restrat' not allowed",
    ),
    "unknown-dependency": (
        "docker-compose.yml",
        ("      - dcgm-exporter\n", "      - dcgm-exporterr\n"),
        "depends on undefined service",
    ),
    "cgroup-value": (
        "docker-compose.yml",
        ("    cgroup: host\n", "    cgroup: hosts\n"),
        "services.enricher.cgroup value must be one of 'host', 'private'",
    ),
    "override-type": (
        "cgroup-only.yml",
        ('    user: "10001:10001"\n', "    user: [10001]\n"),
        "services.enricher.user must be a string",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_file_is_refused(compose_cli: ComposeRun, tmp_path: Path, case: str) -> None:
    """The check catches errors: a copy of deploy/compose with one mistake fails it."""
    name, (old, new), message = BROKEN[case]
    copy = tmp_path / "compose"
    shutil.copytree(COMPOSE_DIR, copy)
    text = (copy / name).read_text()
    assert old in text, f"{name} no longer holds {old!r}: update the case"
    (copy / name).write_text(text.replace(old, new, 1))
    args = ("-f", "docker-compose.yml", "-f", "cgroup-only.yml", "config", "--quiet")
    assert compose_cli(*args, cwd=COMPOSE_DIR).returncode == 0
    done = compose_cli(*args, cwd=copy)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# --------------------------------------------------------------------------- compose up


class Stack:
    """The stack started by ``docker compose up`` on the test engine."""

    def __init__(self, engine: Engine, env_file: Path) -> None:
        self.engine = engine
        self.args = ["compose", "--env-file", str(env_file)]
        self.args += file_args((str(COMPOSE_FILE), str(OVERRIDE)))

    def compose(self, *args: str, timeout: float = 180.0, check: bool = True) -> str:
        return self.engine.docker(*self.args, *args, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        (cid,) = self.compose("ps", "--all", "--quiet", service).split()
        return cid

    def api(self, path: str) -> Any:
        """GET Prometheus's HTTP API from inside the stack (its loopback is the stack's)."""
        fetch = (
            "import sys, urllib.request as u; "
            "sys.stdout.buffer.write(u.urlopen(sys.argv[1], timeout=5).read())"
        )
        out = self.compose(
            "exec", "-T", "prometheus", "python3", "-c", fetch, f"http://127.0.0.1:9090{path}"
        )
        body = json.loads(out)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api(f"/api/v1/query?query={quote(promql)}")["result"]
        return result


def wait_until(what: str, check: Callable[[], Any], stack: Stack, timeout: float = 120.0) -> Any:
    """Poll ``check()`` until it returns something true; fail with the stack's logs."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1.0)
    logs = stack.compose("logs", "--no-color", "--tail", "40", check=False)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})\n{logs[-6000:]}")


def stack_prometheus() -> str:
    """The Prometheus release of the stack's prometheus image (prom/prometheus:v3.5.0)."""
    image = load_compose(COMPOSE_FILE)["services"]["prometheus"]["image"]
    version = ".".join(image.rpartition(":v")[2].split(".")[:2])
    (release,) = [r for r in releases() if r.version == version]
    return require(release).prometheus


@pytest.mark.image
def test_compose_up_runs_the_stack_and_its_prometheus_scrapes_the_enricher(
    real_docker: Engine,
    built_image: Built,
    fake_nvml_lib: Path,
    compose_plugin: Path,
    tmp_path: Path,
) -> None:
    plugin_config(real_docker.root / "cli-config", compose_plugin)
    upstream = tmp_path / "upstream"
    nvml = tmp_path / "nvml"
    for folder in (upstream, nvml):
        folder.mkdir()
        folder.chmod(0o755)
    (upstream / "metrics").write_text(upstream_body(1))
    shutil.copyfile(fake_nvml_lib, nvml / "libnvidia-ml.so.1")
    env_file = tmp_path / "stack.env"
    variables = {
        "ENRICHER_TEST_IMAGE": built_image.image,
        "ENRICHER_TEST_BUSYBOX": "enricher-test/busybox:1",
        "ENRICHER_TEST_BASE": built_image.base,
        "ENRICHER_TEST_UPSTREAM": str(upstream),
        "ENRICHER_TEST_NVML": str(nvml),
        "ENRICHER_TEST_PROMETHEUS": stack_prometheus(),
        "DOCKER_SOCKET": real_docker.socket_path,
        "GPU_HOST": "compose-host",
    }
    env_file.write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
    stack = Stack(real_docker, env_file)
    try:
        # The GPU's user first, so that the fake NVML lists its PID from the enricher's start.
        stack.compose("up", "--detach", "workload")
        workload = stack.container("workload")
        pid = real_docker.pid(workload)
        FakeNvmlState().gpu().process(pid, gpu=0, memory=6 * GIB).write(nvml / "state")
        for path in (nvml / "state", nvml / "libnvidia-ml.so.1", upstream / "metrics"):
            path.chmod(0o644)
        stack.compose("up", "--detach")
        name = real_docker.inspect(workload)["Name"].lstrip("/")
        assert name == "dcgm-enricher-workload-1"  # Compose's name: project, service, number

        def target() -> list[dict[str, Any]]:
            active = stack.api("/api/v1/targets?state=active")["activeTargets"]
            return [t for t in active if t["labels"]["job"] == "dcgm-enricher"]

        (scraped,) = wait_until("a scrape of the enricher", lambda: target(), stack)
        (scraped,) = wait_until(
            "the enricher's target up", lambda: [t for t in target() if t["health"] == "up"], stack
        )
        assert scraped["scrapeUrl"] == "http://enricher:9401/metrics"  # the stack's own config
        (up,) = stack.query('up{job="dcgm-enricher"}')
        assert up["value"][1] == "1"

        memory = f'gpu_container_memory_used_bytes{{container="{name}"}}'
        (row,) = wait_until(memory, lambda: stack.query(memory), stack)
        assert float(row["value"][1]) == 6 * GIB
        assert row["metric"]["UUID"] == default_gpu_uuid(0)
        (info,) = stack.query(f'gpu_container_info{{container="{name}"}}')
        # Named through the Docker socket the stack mounts, with Compose's own labels.
        assert info["metric"]["container_id"] == workload
        assert info["metric"]["compose_project"] == "dcgm-enricher"
        assert info["metric"]["compose_service"] == "workload"
        (device,) = stack.query(f'DCGM_FI_DEV_FB_USED{{UUID="{default_gpu_uuid(0)}"}}')
        assert device["metric"]["container"] == name  # the upstream series, rewritten
        sources = {
            r["metric"]["source"]: r["value"][1] for r in stack.query("dcgm_enricher_source_up")
        }
        assert sources == {"upstream": "1", "nvml": "1", "procfs": "1", "docker": "1"}

        def evaluated() -> list[dict[str, Any]]:
            groups = stack.api("/api/v1/rules")["groups"]
            rules = [r for g in groups for r in g["rules"]]
            assert rules, "no rule loaded"
            if any(r["lastEvaluation"].startswith("0001-") for r in rules):
                return []
            return rules

        rules = wait_until("every rule evaluated once", evaluated, stack)
        assert [r["name"] for r in rules if r["health"] != "ok"] == []
        loaded = {Path(g["file"]).name for g in stack.api("/api/v1/rules")["groups"]}
        assert loaded == {"dcgm-enricher.rules.yaml"}
        inspect = "{{.State.Health.Status}}"
        enricher = stack.container("enricher")
        wait_until(
            "the enricher's healthcheck",
            lambda: (
                real_docker.docker("inspect", "--format", inspect, enricher).strip() == "healthy"
            ),
            stack,
        )
    finally:
        logs = stack.compose("logs", "--no-color", "--tail", "30", check=False)
        stack.compose("down", "--volumes", "--timeout", "5", check=False)
        print(f"--- compose logs ---\n{logs[-6000:]}")
