"""Golden tests for a GPU host without Kubernetes: GPU use attributed to Docker containers.

The whole pipeline through the real aiohttp app, as ``tests/test_golden.py`` does for a
Kubernetes node. Real parts: dcgm-exporter-shaped text over HTTP (a plain Docker host's: no
pod labels at all), pynvml against the fake libnvidia-ml built from C (no GPU here), a /proc
tree on disk read by the real ProcfsSource, and the real aiohttp client of the Docker source
talking HTTP over a unix socket to the Docker Engine API stand-in (tests/dockerapi.py: no
Docker engine runs on CI machines). ``pytest --update-golden`` rewrites the golden files.

One simulated host carries the cgroup layouts of several real ones, one per process: cgroup
v2 with systemd (``/system.slice/docker-<id>.scope``), cgroup v1 with cgroupfs
(``/docker/<id>`` in every hierarchy), rootless Docker under ``user.slice``, and Docker in
Docker (``/docker/<outer>/docker/<inner>``).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from devkit.nvmlfake import FakeNvml, FakeNvmlState, default_mig_uuid, nvml_state_of
from devkit.ports import free_port
from devkit.promtool import held_series, run_rule_tests
from enricher.commands import ps, resolve
from enricher.config import Config
from enricher.model import GpuDevice, MigDevice, short_id
from enricher.pipeline import Scraper
from enricher.procfs import ProcfsSource
from enricher.simnode import fakeproc
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode, SimProc

from .conftest import ROOT, assert_valid_exposition
from .dockerapi import DockerAPI, compose_labels, container_id
from .harness import (
    MakeStack,
    Stack,
    assert_memory_adds_up,
    check_golden,
    docker_engine,
    process_reasons,
    ps_rows,
    series,
)

FIXTURE = Path(__file__).parent / "fixtures" / "upstream" / "docker-host.prom"
HOST = "lab-box"
GIB = 1 << 30
U = [
    "GPU-4e4e4e4e-4444-4444-8444-444444444444",
    "GPU-5f5f5f5f-5555-4555-8555-555555555555",
    "GPU-6a6a6a6a-6666-4666-8666-666666666666",
    "GPU-7b7b7b7b-7777-4777-8777-777777777777",
]


@dataclass(frozen=True)
class Box:
    """A container on the simulated host: its name, image and labels as Docker has them."""

    name: str
    image: str
    labels: dict[str, str]

    @property
    def id(self) -> str:
        return container_id(self.name)


TRAIN = Box("lab-train-1", "ghcr.io/lab/trainer:2.3", compose_labels("lab", "train"))
NOTEBOOK = Box("jupyter", "quay.io/jupyter/pytorch-notebook:cuda12-2024-09-02", {})
ROOTLESS = Box("alice-sd", "ghcr.io/alice/sd-webui:1.10", {})
DIND = Box("ci-dind-1", "docker:27-dind", compose_labels("ci", "dind"))
BOXES = [TRAIN, NOTEBOOK, ROOTLESS, DIND]
# Started by the daemon inside DIND: the host's Docker has never heard of it.
INNER = container_id("inner build container")
# Removed between NVML's listing and the lookup (or left behind by a crashed runtime).
REMOVED = container_id("removed container")
LATE = Box("late-starter", "nvcr.io/nvidia/pytorch:24.08-py3", {})

_V1_CONTROLLERS = ("memory", "cpu,cpuacct", "devices", "pids", "blkio", "freezer")


def cgroup_v1(path: str) -> str:
    """A cgroup v1 file with ``path`` in every hierarchy (Docker's cgroupfs driver)."""
    lines = [f"{len(_V1_CONTROLLERS) + 1 - i}:{c}:{path}" for i, c in enumerate(_V1_CONTROLLERS)]
    return "\n".join([*lines, f"1:name=systemd:{path}", "0::/"]) + "\n"


def cgroup_v2(path: str) -> str:
    return f"0::{path}\n"


ROOTLESS_SCOPE = (
    f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ROOTLESS.id}.scope"
)


def box_proc(
    pid: int, comm: str, gpu: int, gi: int | None, mib: int, cgroup: str, *samples: tuple[int, int]
) -> SimProc:
    """A process of this host: no pod, only its cgroup says which container runs it."""
    return SimProc(pid, comm, gpu, gi, mib, 0.0, None, samples=samples, cgroup=cgroup)


# Not the demo's node: a Docker host, whose containers only their cgroup paths name.
HOST_NODE = SimNode(
    HOST,
    tuple(GpuDevice(i, u, "NVIDIA A100-SXM4-80GB", mig_enabled=i == 2) for i, u in enumerate(U)),
    tuple(
        MigDevice(U[2], 2, gi, 0, default_mig_uuid(2, gi, 0), profile)
        for gi, profile in ((1, "3g.40gb"), (2, "2g.20gb"), (3, "1g.10gb"))
    ),
    (
        box_proc(
            1001,
            "python",
            0,
            None,
            10 * 1024,
            cgroup_v2(f"/system.slice/docker-{TRAIN.id}.scope"),
            (100, 80),
        ),
        box_proc(
            1002,
            "pt_data_worker",
            0,
            None,
            1024,
            cgroup_v2(f"/system.slice/docker-{TRAIN.id}.scope"),
            (100, 5),
        ),
        box_proc(2001, "python", 1, None, 4 * 1024, cgroup_v1(f"/docker/{NOTEBOOK.id}"), (100, 30)),
        box_proc(2002, "python3", 1, None, 6 * 1024, cgroup_v2(ROOTLESS_SCOPE), (100, 25)),
        box_proc(3001, "python", 2, 1, 30 * 1024, cgroup_v1(f"/docker/{DIND.id}/docker/{INNER}")),
        box_proc(3002, "ollama", 2, 2, 9 * 1024, cgroup_v2("/system.slice/ollama.service")),
        box_proc(
            3003, "python", 2, 3, 2 * 1024, cgroup_v2(f"/system.slice/docker-{REMOVED}.scope")
        ),
        box_proc(3004, "nvidia-cuda-mps", 2, 3, 256, cgroup_v2("/system.slice/nvidia-mps.service")),
    ),
    (),
    first_ticks=1000,
    ticks_apart=1,
)
BOOT = 1_700_000_000


def write_proc(root: Path) -> None:
    write_proc_tree(root, HOST_NODE, BOOT + 86_400)


def nvml_state() -> FakeNvmlState:
    return nvml_state_of(HOST_NODE)


@pytest.fixture
def dockerd() -> Iterator[DockerAPI]:
    with docker_engine((box.name, box.image, box.labels) for box in BOXES) as api:
        yield api


@pytest.fixture
def host_factory(full_stack: MakeStack, dockerd: DockerAPI) -> Callable[..., Awaitable[Stack]]:
    def make(docker_host: str | None = None, **config: Any) -> Awaitable[Stack]:
        return full_stack(
            upstream=FIXTURE.read_text(),
            nvml=nvml_state(),
            proc=write_proc,
            node="",  # no Kubernetes: Docker mode
            host_name=HOST,  # the node label's value there (cli.py: socket.gethostname())
            docker_host=f"unix://{dockerd.socket_path}" if docker_host is None else docker_host,
            upstream_timeout=2.0,
            **config,
        )

    return make


async def scrape(host: Stack) -> str:
    return await host.scrape()


def who(row: dict[str, str]) -> tuple[str, str, str]:
    return (row.get("namespace", "-"), row.get("pod", "-"), row.get("container", "-"))


def device_rows(text: str, name: str) -> dict[str, dict[str, str]]:
    """Series of one family by ``UUID`` or ``UUID/GPU_I_ID``."""
    return {
        s["UUID"] + (f"/{s['GPU_I_ID']}" if s.get("GPU_I_ID") else ""): s
        for s in series(text, name)
    }


# --------------------------------------------------------------------------- golden


async def test_docker_host_golden(
    host_factory: Any, update_golden: bool, promtools: list[str]
) -> None:
    text = await scrape(await host_factory())
    check_golden("docker-host", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)


async def test_cgroup_only_golden(
    host_factory: Any, update_golden: bool, promtools: list[str]
) -> None:
    text = await scrape(await host_factory(docker_host=""))
    check_golden("docker-host-cgroup-only", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)


# --------------------------------------------------------------------------- meaning


async def test_device_series_name_the_container(host_factory: Any, dockerd: DockerAPI) -> None:
    """The golden file's meaning: who each device series names, and why not elsewhere."""
    text = await scrape(await host_factory())
    temp = device_rows(text, "DCGM_FI_DEV_GPU_TEMP")
    fb = device_rows(text, "DCGM_FI_DEV_FB_USED")
    # One compose container holds GPU 0 (two processes, one container).
    assert who(temp[U[0]]) == ("", "", TRAIN.name)
    # GPU 1 is shared by a `docker run` container (cgroup v1) and a rootless one: nobody.
    assert who(temp[U[1]]) == ("", "", "")
    # MIG: the Docker-in-Docker build is named after the outer container, which the host's
    # Docker knows; the host process and the removed container leave theirs unnamed.
    assert who(fb[f"{U[2]}/1"]) == ("", "", DIND.name)
    assert who(fb[f"{U[2]}/2"]) == ("", "", "")
    assert who(fb[f"{U[2]}/3"]) == ("", "", "")
    assert who(temp[U[2]]) == ("", "", "")  # the whole GPU: several owners
    # An idle GPU gets the empty pod labels only (the upstream had none).
    assert who(temp[U[3]]) == ("", "", "")
    # Every upstream label is kept, the driver version included.
    assert temp[U[0]]["DCGM_FI_DRIVER_VERSION"] == "550.90.07"
    assert temp[U[0]]["Hostname"] == HOST
    # Only the two containers the host's Docker cannot know were asked about in vain.
    assert dockerd.inspects(INNER) == 1 and dockerd.inspects(REMOVED) == 1
    assert dockerd.methods() == {"GET"}


async def test_container_families(host_factory: Any) -> None:
    text = await scrape(await host_factory())
    mem = {
        (s["UUID"], s.get("GPU_I_ID", ""), s["container"]): float(s["__value__"])
        for s in series(text, "gpu_container_memory_used_bytes")
    }
    assert mem == {
        (U[0], "", TRAIN.name): 11.0 * GIB,
        (U[1], "", NOTEBOOK.name): 4.0 * GIB,
        (U[1], "", ROOTLESS.name): 6.0 * GIB,
        (U[2], "1", DIND.name): 30.0 * GIB,
    }
    rows = series(text, "gpu_container_memory_used_bytes")
    assert all(r["namespace"] == "" and r["pod"] == "" and r["Hostname"] == HOST for r in rows)
    util = {
        s["container"]: float(s["__value__"])
        for s in series(text, "gpu_container_utilization_ratio")
    }
    assert util == pytest.approx({TRAIN.name: 0.85, NOTEBOOK.name: 0.30, ROOTLESS.name: 0.25})
    unattr = {
        (s["UUID"], s.get("GPU_I_ID", ""), s["reason"]): float(s["__value__"])
        for s in process_reasons(text)
    }
    assert_memory_adds_up(text)
    assert unattr == {
        (U[2], "2", "host_process"): 9.0 * GIB,
        (U[2], "3", "container_not_found"): 2.0 * GIB,
        (U[2], "3", "mps_server"): 0.25 * GIB,
    }
    info = {s["container"]: s for s in series(text, "gpu_container_info")}
    assert set(info) == {b.name for b in BOXES}
    for box in BOXES:
        row = info[box.name]
        assert row["container_id"] == box.id
        assert row["image"] == box.image
        assert row["compose_project"] == box.labels.get("com.docker.compose.project", "")
        assert row["compose_service"] == box.labels.get("com.docker.compose.service", "")
        assert (row["namespace"], row["pod"]) == ("", "")
    assert series(text, "gpu_pod_info") == []
    procs = {s["state"]: s["__value__"] for s in series(text, "dcgm_enricher_gpu_processes")}
    assert procs == {"attributed": "5.0", "unattributed": "3.0"}
    up = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}
    assert up == {"upstream": "1.0", "nvml": "1.0", "procfs": "1.0", "docker": "1.0"}
    enabled = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_enabled")}
    assert enabled["kubernetes"] == "0.0" and enabled["docker"] == "1.0"


async def test_cgroup_only_names_by_short_id(host_factory: Any, dockerd: DockerAPI) -> None:
    text = await scrape(await host_factory(docker_host=""))
    mem = {
        (s["UUID"], s.get("GPU_I_ID", ""), s["container"])
        for s in series(text, "gpu_container_memory_used_bytes")
    }
    # Nothing to ask: the innermost container of each cgroup, by the ID `docker ps` shows. A
    # removed container cannot be told from a live one without the API.
    assert mem == {
        (U[0], "", short_id(TRAIN.id)),
        (U[1], "", short_id(NOTEBOOK.id)),
        (U[1], "", short_id(ROOTLESS.id)),
        (U[2], "1", short_id(INNER)),
        (U[2], "3", short_id(REMOVED)),
    }
    info = {r["container_id"]: r for r in series(text, "gpu_container_info")}
    assert set(info) == {TRAIN.id, NOTEBOOK.id, ROOTLESS.id, INNER, REMOVED}
    for cid, row in info.items():
        assert row["container"] == short_id(cid)
        assert row["image"] == row["compose_project"] == row["compose_service"] == ""
    assert who(device_rows(text, "DCGM_FI_DEV_GPU_TEMP")[U[0]]) == ("", "", short_id(TRAIN.id))
    enabled = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_enabled")}
    assert enabled["docker"] == "0.0"
    assert "docker" not in {s["source"] for s in series(text, "dcgm_enricher_source_up")}
    assert dockerd.requests == []  # the socket exists, but cgroup-only mode never opens it


async def test_daemon_trouble_keeps_names_and_shows_in_health(
    host_factory: Any, dockerd: DockerAPI, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    host = await host_factory()
    first = await scrape(host)
    assert {s["container"] for s in series(first, "gpu_container_info")} == {b.name for b in BOXES}
    # The daemon starts failing; answers age past their TTL; a new container starts on GPU 3.
    for box in [*BOXES, LATE]:
        dockerd.fail[box.id] = 500
    dockerd.add(LATE.name, image=LATE.image)
    assert host.docker is not None
    host.clock.now += host.docker.found_ttl + 1
    fakeproc.write_process(
        tmp_path / "proc",
        4001,
        comm="python",
        cgroup=cgroup_v2(f"/system.slice/docker-{LATE.id}.scope"),
        start_ticks=2000,
    )
    fake_nvml.write(nvml_state().process(4001, gpu=3, memory=5 * GIB))
    text = await scrape(host)
    names = {s["container"] for s in series(text, "gpu_container_memory_used_bytes")}
    # The last answers hold rather than flapping to short IDs; the new one has only its ID.
    assert names == {TRAIN.name, NOTEBOOK.name, ROOTLESS.name, DIND.name, short_id(LATE.id)}
    assert who(device_rows(text, "DCGM_FI_DEV_GPU_TEMP")[U[3]]) == ("", "", short_id(LATE.id))
    up = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}
    errors = {
        s["source"]: float(s["__value__"])
        for s in series(text, "dcgm_enricher_source_errors_total")
    }
    assert up["docker"] == "0.0" and up["upstream"] == "1.0"
    assert errors["docker"] >= 1
    # The daemon recovers: the new container gets its name on the next scrape.
    dockerd.fail.clear()
    text = await scrape(host)
    assert who(device_rows(text, "DCGM_FI_DEV_GPU_TEMP")[U[3]]) == ("", "", LATE.name)
    assert {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}[
        "docker"
    ] == "1.0"


async def test_slow_daemon_does_not_hold_the_scrape(host_factory: Any, dockerd: DockerAPI) -> None:
    """A hung inspect costs at most twice --docker.timeout; the scrape still answers."""
    dockerd.delay[TRAIN.id] = 30
    # 1 s, far under the hung inspect's 30 s: 0.2 s left the others' answers (and the
    # version check) too little room on a loaded CI machine (CI, 2026-12-01).
    host = await host_factory(docker_timeout=1.0)
    text = await scrape(host)
    mem = {s["UUID"]: s["container"] for s in series(text, "gpu_container_memory_used_bytes")}
    assert mem[U[0]] == short_id(TRAIN.id)  # not answered in time: its ID
    info = {s["container"] for s in series(text, "gpu_container_info")}
    assert NOTEBOOK.name in info  # the others were answered meanwhile


async def test_container_not_in_pod_without_docker_mode(
    host_factory: Any, tmp_path: Path, fake_nvml: FakeNvml
) -> None:
    """Without a Docker source (a Kubernetes node), containers outside pods stay unnamed."""
    host = await host_factory()
    scraper = Scraper(
        host.scraper.config,
        nvml=fake_nvml.source(),
        procfs=ProcfsSource(str(tmp_path / "proc")),
        kubernetes=None,
    )
    try:
        result = await scraper.scrape()
    finally:
        await scraper.close()
    text = result.body.decode()
    reasons = {s["reason"] for s in process_reasons(text)}
    assert reasons == {"container_not_in_pod", "host_process", "mps_server"}
    assert series(text, "gpu_container_memory_used_bytes") == []
    assert "gpu_container_info" not in text
    enabled = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_enabled")}
    assert enabled["docker"] == "0.0"


# --------------------------------------------------------------------------- PromQL


def promtool_eval(text: str, tmp_path: Path, promtool: str, expr: str, want: list[Any]) -> str:
    """Evaluate ``expr`` in Prometheus's engine (promtool test rules) over ``text``."""
    series = held_series(text, 5, ("gpu_container_",))
    check = {"expr": expr, "eval_time": "5m", "exp_samples": want}
    res = run_rule_tests(promtool, tmp_path / "promql-test.yml", series, [check], timeout=60)
    return res.stdout + res.stderr if res.returncode else "SUCCESS"


def series_families(text: str) -> list[list[tuple[str, dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        [(s.name, dict(s.labels), float(s.value)) for s in fam.samples]
        for fam in text_string_to_metric_families(text)
        if fam.name.startswith("gpu_container_")
    ]


COMPOSE_JOIN = """sum by (compose_project) (
  gpu_container_memory_used_bytes
    * on (instance, container) group_left (compose_project) gpu_container_info
)"""


async def test_compose_join_works_in_promql(
    host_factory: Any, tmp_path: Path, promtools: list[str]
) -> None:
    """The join the compose README shows: GPU memory per compose project."""
    text = await scrape(await host_factory())
    want = [
        {"labels": '{compose_project="lab"}', "value": 11 * GIB},
        {"labels": '{compose_project="ci"}', "value": 30 * GIB},
        {"labels": "{}", "value": 10 * GIB},  # `docker run` containers: no project
    ]
    wrong = [{**want[0], "value": 12 * GIB}, *want[1:]]
    for i, promtool in enumerate(promtools):
        (tmp := tmp_path / f"prom{i}").mkdir()
        assert promtool_eval(text, tmp, promtool, COMPOSE_JOIN, want) == "SUCCESS"
        assert "FAILED" in promtool_eval(text, tmp, promtool, COMPOSE_JOIN, wrong)


# --------------------------------------------------------------------------- ps and resolve


def command_config(tmp_path: Path, fake_nvml: FakeNvml, docker_host: str) -> Config:
    write_proc(tmp_path / "proc")
    fake_nvml.write(nvml_state())
    return replace(
        Config(),
        procfs=str(tmp_path / "proc"),
        nvml_library=str(fake_nvml.library),
        kube_node_name="",
        docker_host=docker_host,
    )


def test_ps_names_docker_containers(
    tmp_path: Path, fake_nvml: FakeNvml, dockerd: DockerAPI
) -> None:
    cfg = command_config(tmp_path, fake_nvml, f"unix://{dockerd.socket_path}")
    out = io.StringIO()
    assert ps(cfg, out) == 0
    rows = ps_rows(out.getvalue())
    assert {pid: (r["CONTAINER"], r["NOTE"]) for pid, r in rows.items()} == {
        "1001": (TRAIN.name, ""),
        "1002": (TRAIN.name, ""),
        "2001": (NOTEBOOK.name, ""),
        "2002": (ROOTLESS.name, ""),
        "3001": (DIND.name, ""),
        "3002": ("", "host_process"),
        "3003": ("", "container_not_found"),
        "3004": ("", "mps_server"),
    }
    assert all(r["NAMESPACE"] == r["POD"] == "" for r in rows.values())
    assert "short ID" not in out.getvalue()


def test_ps_in_cgroup_only_mode(tmp_path: Path, fake_nvml: FakeNvml, dockerd: DockerAPI) -> None:
    cfg = command_config(tmp_path, fake_nvml, "")
    out = io.StringIO()
    assert ps(cfg, out) == 0
    rows = ps_rows(out.getvalue())
    assert rows["1001"]["CONTAINER"] == short_id(TRAIN.id)
    assert rows["3003"]["CONTAINER"] == short_id(REMOVED)
    assert "# docker: cgroup-only mode, containers are named by short ID" in out.getvalue()
    assert dockerd.requests == []


def test_resolve_names_docker_containers(
    tmp_path: Path, fake_nvml: FakeNvml, dockerd: DockerAPI
) -> None:
    cfg = command_config(tmp_path, fake_nvml, f"unix://{dockerd.socket_path}")
    out = io.StringIO()
    # 3003's container is gone from Docker: that PID did not resolve, so the exit status is 1.
    assert resolve(cfg, [1001, 3001, 3003, 3002], out) == 1
    assert resolve(cfg, [1001, 3001, 3002], io.StringIO()) == 0
    train, dind, removed, host = (json.loads(line) for line in out.getvalue().splitlines())
    assert (train["container"], train["container_id"]) == (TRAIN.name, TRAIN.id)
    assert (train["image"], train["compose_project"], train["compose_service"]) == (
        TRAIN.image,
        "lab",
        "train",
    )
    # The nested container's own ID, and the outer container the host's Docker knows.
    assert (dind["container"], dind["container_id"]) == (DIND.name, INNER)
    assert dind["docker_container_id"] == DIND.id
    assert removed["note"] == "no such Docker container" and "container" not in removed
    assert host["container_id"] is None and "container" not in host


def test_resolve_in_cgroup_only_mode(
    tmp_path: Path, fake_nvml: FakeNvml, dockerd: DockerAPI
) -> None:
    cfg = command_config(tmp_path, fake_nvml, "")
    out = io.StringIO()
    assert resolve(cfg, [1001], out) == 0
    (row,) = (json.loads(line) for line in out.getvalue().splitlines())
    assert row["container"] == short_id(TRAIN.id)
    assert "image" not in row and "cgroup-only" in row["note"]
    assert dockerd.requests == []


def test_serve_in_docker_mode(tmp_path: Path, fake_nvml: FakeNvml, dockerd: DockerAPI) -> None:
    """`dcgm-enricher serve` as the compose stack runs it: no Kubernetes, the Docker socket."""
    write_proc(tmp_path / "proc")
    fake_nvml.write(nvml_state())
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENRICHER_")}
    env.pop("NODE_NAME", None)
    env["ENRICHER_DOCKER_HOST"] = f"unix://{dockerd.socket_path}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enricher",
            "serve",
            f"--web.listen-address=127.0.0.1:{port}",
            "--upstream.url=http://127.0.0.1:9/metrics",  # discard port: refused
            f"--path.procfs={tmp_path / 'proc'}",
            f"--nvml.library={fake_nvml.library}",
            "--kubelet.pod-resources-socket=",
            "--no-kube.enabled",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    try:
        text = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert text, "serve did not answer /metrics"
        info = {s["container"]: s for s in series(text, "gpu_container_info")}
        assert set(info) == {b.name for b in BOXES}
        up = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}
        assert up["docker"] == "1.0" and up["upstream"] == "0.0"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert f"Docker unix://{dockerd.socket_path}" in out
