"""The real container image: the project's Dockerfile built by a real Docker Engine
(tests/dockerengine.py), then run the way the Docker-host deployment runs it and the
Kubernetes manifests' security settings ask (read-only root, every capability dropped, no new
privileges, the host's PID namespace and cgroups), as UID 0 with the Docker socket and as the
image's default UID 10001 in cgroup-only mode. A real Prometheus scrapes it.

What is real: the engine, the build, the image, the kernel's enforcement of the settings,
the workload container and its cgroup, /proc, Prometheus. What is simulated: the GPU (the fake
libnvidia-ml, bind-mounted where the NVIDIA Container Toolkit mounts the real one, listing
the workload container's real PID) and dcgm-exporter (its text over HTTP on loopback).

The image is built once per session (tests/imagebuild.py: the fixture ``built_image``, on a
stand-in for the Dockerfile's ``PYTHON_IMAGE``, since no registry is reachable here). The build
takes minutes on the vfs driver, so these tests carry the ``image`` mark and ``make test`` runs
them once, on one Python: the image brings its own interpreter, whatever runs the tests.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.nvmlfake import FakeNvmlState, default_gpu_uuid
from devkit.ports import free_port
from devkit.prometheus import EVERY_SECOND
from devkit.upstream import TextServer

from .composefile import load_compose
from .conftest import ROOT
from .dockerengine import COMPOSE, SLEEP, Engine, upstream_body
from .imagebuild import IMAGE, Built, head_revision, project_version
from .promreleases import Server, releases, require, serve

pytestmark = pytest.mark.image

COMPOSE_FILE = ROOT / "deploy" / "compose" / "docker-compose.yml"
CGROUP_ONLY_FILE = ROOT / "deploy" / "compose" / "cgroup-only.yml"
SIDECAR = ROOT / "manifests" / "overlays" / "sidecar" / "daemonset.yaml"
# Where the NVIDIA Container Toolkit puts the driver's NVML in a container (Debian's multiarch
# directory, searched by the dynamic loader without any LD_LIBRARY_PATH).
NVML_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
GIB = 1 << 30


def image_config(engine: Engine) -> dict[str, Any]:
    doc = json.loads(engine.docker("image", "inspect", IMAGE))
    return dict(doc[0]["Config"])


def test_image_defaults(real_docker: Engine, built_image: Built) -> None:
    """What the Dockerfile promises: a numeric non-root user, the entry point, no pip."""
    config = image_config(real_docker)
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/opt/venv/bin/dcgm-enricher"]
    assert config["Cmd"] == ["serve"]
    assert "9401/tcp" in config["ExposedPorts"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "dcgm-enricher"
    # `make image`'s labels: the release, the commit, and the repository only where the
    # checkout's origin is a URL (never a local path, never credentials).
    assert labels["org.opencontainers.image.version"] == project_version()
    assert labels.get("org.opencontainers.image.revision") == head_revision()
    source = labels.get("org.opencontainers.image.source")
    assert source is None or (source.startswith(("https://", "http://")) and "@" not in source)
    listing = real_docker.docker(
        "run", "--rm", "--network", "none", "--entrypoint", "/bin/ls", IMAGE, "/opt/venv/bin"
    ).split()
    assert "dcgm-enricher" in listing and "pip" not in listing
    version = real_docker.docker("run", "--rm", "--network", "none", IMAGE, "--version")
    assert version.strip() == f"dcgm-enricher {project_version()}"
    # The image is the built wheel, not the work tree: the tests are not in it.
    found = real_docker.docker(
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "/opt/venv/bin/python",
        IMAGE,
        "-c",
        "import enricher, os; print(os.listdir(os.path.dirname(enricher.__file__)))",
    )
    assert "commands.py" in found and "tests" not in found and "_build" not in found


# --------------------------------------------------------------------------- running it


def compose_service(path: Path) -> dict[str, Any]:
    return dict(load_compose(path)["services"]["enricher"])


def run_flags(user: str) -> list[str]:
    """``docker run`` flags for the enricher, taken from the shipped deployment files: the
    compose stack's service (pid, cgroup, read_only, cap_drop, security_opt), the image's
    user or the one given."""
    svc = compose_service(COMPOSE_FILE)
    flags = ["--pid", svc["pid"], "--cgroupns", svc["cgroup"]]
    if svc["read_only"]:
        flags.append("--read-only")
    for cap in svc["cap_drop"]:
        flags += ["--cap-drop", cap]
    for opt in svc["security_opt"]:
        flags += ["--security-opt", opt]
    flags += ["--user", user]
    return flags


def test_run_flags_follow_the_manifests() -> None:
    """The compose stack and the Kubernetes manifests ask the same of the enricher container,
    so running it with the compose file's settings is running it as the manifests do."""
    docs = list(yaml.safe_load_all(SIDECAR.read_text()))
    (ds,) = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (ctr,) = [c for c in spec["containers"] if c["name"] == "dcgm-enricher"]
    sc = ctr["securityContext"]
    svc = compose_service(COMPOSE_FILE)
    assert spec["hostPID"] is True and svc["pid"] == "host"
    assert sc["readOnlyRootFilesystem"] is True and svc["read_only"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] == svc["cap_drop"]
    assert sc["allowPrivilegeEscalation"] is False
    assert "no-new-privileges:true" in svc["security_opt"]
    assert (sc["runAsUser"], svc["user"]) == (0, "0:0")
    assert compose_service(CGROUP_ONLY_FILE)["user"] == "10001:10001"


def wait_for(prom: Server, promql: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The first non-empty answer to ``promql`` in ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            result = prom.query(promql)
            if result:
                return result
        time.sleep(0.5)
    raise AssertionError(f"no result for {promql} in {timeout:.0f} s\n" + prom.log_tail())


@contextlib.contextmanager
def prometheus_scraping(target: str, tmp: Path) -> Iterator[Server]:
    """Debian's Prometheus scraping ``target`` every second, as the shipped config does
    (honor_labels: the enricher's pod labels are the ones to keep)."""
    config = {
        "global": EVERY_SECOND,
        "scrape_configs": [
            {
                "job_name": "enricher",
                "honor_labels": True,
                "static_configs": [{"targets": [target]}],
            }
        ],
    }
    with serve(require(releases()[0]), config, tmp) as prom:
        yield prom


def proc_status(pid: int) -> dict[str, str]:
    rows = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (row.partition(":") for row in rows)}


@pytest.mark.parametrize(
    "user, with_socket",
    [("0:0", True), ("10001:10001", False)],
    ids=["uid0-docker-socket", "uid10001-cgroup-only"],
)
def test_image_attributes_a_real_container(
    real_docker: Engine,
    built_image: Built,
    fake_nvml_lib: Path,
    tmp_path: Path,
    user: str,
    with_socket: bool,
) -> None:
    workload = real_docker.run("lab-train-1", *SLEEP, labels=COMPOSE)
    pid = real_docker.pid(workload)
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir()
    FakeNvmlState().gpu().gpu().process(pid, gpu=0, memory=6 * GIB).write(nvml_dir / "state")
    # The driver's files are world-readable; the fake is built under this session's umask.
    shutil.copyfile(fake_nvml_lib, nvml_dir / "libnvidia-ml.so.1")
    for path, mode in ((nvml_dir, 0o755), (nvml_dir / "state", 0o644)):
        path.chmod(mode)
    (nvml_dir / "libnvidia-ml.so.1").chmod(0o644)
    body = upstream_body(2).encode()
    upstream = TextServer(lambda path: body)  # on loopback: the containers share the host's
    port = free_port()
    args = [
        "serve",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--upstream.url=http://127.0.0.1:{upstream.port}/metrics",
        "--no-kube.enabled",
    ]
    flags = run_flags(user)
    flags += ["--memory", "256m"]  # the manifests' limit: the kernel enforces it on the cgroup
    flags += ["-v", f"{nvml_dir / 'libnvidia-ml.so.1'}:{NVML_IN_CONTAINER}:ro"]
    flags += ["-v", f"{nvml_dir}:/run/nvml:ro"]
    flags += ["-e", "FAKE_NVML_STATE=/run/nvml/state"]
    if with_socket:
        flags += ["-v", f"{real_docker.socket_path}:/var/run/docker.sock:ro"]
        flags += ["-e", "ENRICHER_DOCKER_HOST=unix:///var/run/docker.sock"]
    else:
        flags += ["-e", "ENRICHER_DOCKER_HOST="]
    name = f"enricher-{user.split(':')[0]}"
    try:
        # The host's network: the test's upstream and Prometheus are on loopback.
        enricher = real_docker.run(
            name, *args, image=built_image.image, network="host", options=flags
        )
        host = real_docker.inspect(enricher)["HostConfig"]
        assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]
        assert host["PidMode"] == "host"
        # The kernel's view of the enricher's process: no capability, no new privileges.
        status = proc_status(real_docker.pid(enricher))
        assert status["CapEff"] == status["CapPrm"] == "0000000000000000"
        assert status["NoNewPrivs"] == "1"
        assert status["Uid"].split()[0] == user.split(":")[0]
        want = "lab-train-1" if with_socket else workload[:12]
        with prometheus_scraping(f"127.0.0.1:{port}", tmp_path) as prom:
            (row,) = wait_for(prom, f'gpu_container_memory_used_bytes{{container="{want}"}}')
            assert float(row["value"][1]) == 6 * GIB
            assert row["metric"]["UUID"] == default_gpu_uuid(0)
            # Empty labels are no labels in Prometheus: no pod on a Docker host.
            assert "namespace" not in row["metric"] and "pod" not in row["metric"]
            (info,) = wait_for(prom, "gpu_container_info")
            assert info["metric"]["container_id"] == workload
            if with_socket:
                assert info["metric"]["compose_project"] == "lab"
            device = wait_for(prom, f'DCGM_FI_DEV_FB_USED{{UUID="{default_gpu_uuid(0)}"}}')
            assert device[0]["metric"]["container"] == want
            up = {
                r["metric"]["source"]: r["value"][1]
                for r in wait_for(prom, "dcgm_enricher_source_up")
            }
            want_up = {"upstream": "1", "nvml": "1", "procfs": "1"}
            if with_socket:
                want_up["docker"] = "1"
            assert up == want_up
            # Its own memory limit, read inside the container from its cgroup's files.
            (limit,) = wait_for(prom, "dcgm_enricher_memory_limit_bytes")
            assert float(limit["value"][1]) == 256 << 20
            (scrape,) = wait_for(prom, 'up{job="enricher"}')
            assert scrape["value"][1] == "1"
            # Every sample of the scrape was taken: nothing Prometheus's parser refused.
            (added,) = wait_for(prom, 'scrape_samples_post_metric_relabeling{job="enricher"}')
            (scraped,) = wait_for(prom, 'scrape_samples_scraped{job="enricher"}')
            assert added["value"][1] == scraped["value"][1]
    finally:
        logs = real_docker.docker("logs", name, check=False)
        real_docker.remove(name)
        upstream.close()
        print(f"--- enricher container log ({user}) ---\n{logs[-3000:]}")
