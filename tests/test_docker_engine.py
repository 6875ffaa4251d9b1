"""The Docker source against a real Docker Engine (tests/dockerengine.py starts Debian's
dockerd with private folders), and attribution of real container processes through the real
/proc: ``resolve``, ``ps`` and a scrape of the real app.

What is real: the daemon, its API on a unix socket, the containers (busybox-static, no
network), the kernel's cgroup lines for their processes, /proc. What is simulated, because it
cannot exist on this machine: the GPU (pynvml against the fake libnvidia-ml, listing the
containers' real PIDs) and dcgm-exporter (its text over HTTP).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from devkit.nvmlfake import FakeNvml, FakeNvmlState, default_gpu_uuid
from enricher.cgroupmem import read_limit
from enricher.commands import ps, resolve
from enricher.config import Config
from enricher.docker import DockerSource
from enricher.model import ProcError, Runtime, short_id
from enricher.procfs import ProcfsSource

from .conftest import assert_valid_exposition
from .dockerengine import BUSYBOX_IMAGE, COMPOSE, SLEEP, Engine, upstream_body
from .harness import MakeStack, ps_rows, series

pytestmark = pytest.mark.usefixtures("real_docker")

GIB = 1 << 30


def lookup(engine: Engine, *ids: str) -> dict[str, object]:
    async def go() -> tuple[dict[str, object], str | None]:
        source = DockerSource(engine.host, timeout=5.0)
        try:
            got = await source.lookup(ids)
            return dict(got), source.api_version
        finally:
            await source.close()

    answers, version = asyncio.run(go())
    answers["__api_version__"] = version
    return answers


def wait_for_pid_change(engine: Engine, ref: str, old: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid = engine.pid(ref)
        if pid and pid != old:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"{ref}: the main process did not change from {old}")


# --------------------------------------------------------------------------- the API


def test_names_images_and_compose_labels(real_docker: Engine) -> None:
    cid = real_docker.run("lab-train-1", *SLEEP, labels=COMPOSE)
    plain = real_docker.run("notebook", *SLEEP)
    answers = lookup(real_docker, cid, plain)
    train, nb = answers[cid], answers[plain]
    assert train is not None and nb is not None
    assert (train.id, train.name, train.image) == (cid, "lab-train-1", BUSYBOX_IMAGE)  # type: ignore[attr-defined]
    assert (train.compose_project, train.compose_service) == ("lab", "train")  # type: ignore[attr-defined]
    assert (nb.name, nb.compose_project, nb.compose_service) == ("notebook", "", "")  # type: ignore[attr-defined]


def test_negotiates_the_daemons_api_version(real_docker: Engine) -> None:
    """The source speaks the daemon's own newest version (Debian's 20.10 serves 1.41)."""
    cid = real_docker.run("versioned", *SLEEP)
    answers = lookup(real_docker, cid)
    assert answers[cid] is not None
    assert answers["__api_version__"] == real_docker.api_version()
    assert answers["__api_version__"].startswith("1.")  # type: ignore[union-attr]


def test_removed_container_is_gone_and_recreated_one_has_a_new_id(real_docker: Engine) -> None:
    old = real_docker.run("worker", *SLEEP)
    real_docker.remove(old)
    new = real_docker.run("worker", *SLEEP)  # what `docker compose up` does on a change
    assert new != old
    answers = lookup(real_docker, old, new)
    assert answers[old] is None  # Docker said 404: no such container
    assert answers[new] is not None and answers[new].name == "worker"  # type: ignore[union-attr]


def test_unknown_id_is_gone_not_an_error(real_docker: Engine) -> None:
    ghost = "f" * 64
    answers = lookup(real_docker, ghost)
    assert answers[ghost] is None


# --------------------------------------------------------------------------- the real /proc


def test_real_cgroup_names_the_container(real_docker: Engine) -> None:
    cid = real_docker.run("cg", *SLEEP)
    pid = real_docker.pid(cid)
    info = ProcfsSource("/proc").read_pid(pid)
    assert not isinstance(info, ProcError), info
    assert info.comm == "sleep"
    assert info.cgroup is not None
    assert info.cgroup.container_id == cid
    assert info.cgroup.runtime is Runtime.DOCKER
    assert info.cgroup.pod_uid is None


def test_real_memory_limit_of_a_container(real_docker: Engine) -> None:
    """The kernel's cgroup tree as the host sees it: a container run with a memory limit
    (Docker writes it to the container's cgroup), read for its process by enricher.cgroupmem
    as the enricher reads its own; a container without one has none."""
    limited = real_docker.run("limited", *SLEEP, options=["--memory", "64m"])
    assert read_limit("/proc", pid=str(real_docker.pid(limited))) == 64 << 20
    free = real_docker.run("unlimited", *SLEEP)
    assert read_limit("/proc", pid=str(real_docker.pid(free))) is None


def test_a_restarted_container_keeps_its_id_under_a_new_pid(real_docker: Engine) -> None:
    cid = real_docker.run("restarter", *SLEEP)
    before = real_docker.pid(cid)
    real_docker.docker("restart", "--time", "0", cid)
    after = wait_for_pid_change(real_docker, cid, before)
    assert isinstance(ProcfsSource("/proc").read_pid(before), ProcError)
    info = ProcfsSource("/proc").read_pid(after)
    assert not isinstance(info, ProcError) and info.cgroup is not None
    assert info.cgroup.container_id == cid


def command_config(fake_nvml: FakeNvml, engine: Engine, docker_host: str | None = None) -> Config:
    return replace(
        Config(),
        procfs="/proc",
        nvml_library=str(fake_nvml.library),
        kube_node_name="",
        docker_host=engine.host if docker_host is None else docker_host,
    )


def test_resolve_real_pids(real_docker: Engine, fake_nvml: FakeNvml) -> None:
    cid = real_docker.run("lab-train-1", *SLEEP, labels=COMPOSE)
    pid = real_docker.pid(cid)
    out = io.StringIO()
    assert resolve(command_config(fake_nvml, real_docker), [pid, os.getpid()], out) == 0
    box, me = (json.loads(line) for line in out.getvalue().splitlines())
    assert box["pid"] == pid and box["comm"] == "sleep"
    assert (box["container"], box["container_id"], box["runtime"]) == ("lab-train-1", cid, "docker")
    assert (box["image"], box["compose_project"], box["compose_service"]) == (
        BUSYBOX_IMAGE,
        "lab",
        "train",
    )
    assert box["cgroup"].endswith(f"/docker/{cid}")
    # The test process itself runs in no Docker container: no name, no guess.
    assert "container" not in me and me["container_id"] != cid


def test_ps_lists_real_container_processes(real_docker: Engine, fake_nvml: FakeNvml) -> None:
    train = real_docker.run("lab-train-1", *SLEEP, labels=COMPOSE)
    nb = real_docker.run("notebook", *SLEEP)
    pids = {real_docker.pid(train): "lab-train-1", real_docker.pid(nb): "notebook"}
    state = FakeNvmlState().gpu().gpu()
    for gpu, pid in enumerate(pids):
        state.process(pid, gpu=gpu, memory=(gpu + 1) * GIB)
    fake_nvml.write(state)
    out = io.StringIO()
    assert ps(command_config(fake_nvml, real_docker), out) == 0
    rows = ps_rows(out.getvalue())
    assert {int(pid): row["CONTAINER"] for pid, row in rows.items()} == pids
    assert {(row["PROCESS"], row["NOTE"]) for row in rows.values()} == {("sleep", "")}


# --------------------------------------------------------------------------- a scrape


@pytest.fixture
def ghost_cgroup(real_docker: Engine) -> Iterator[tuple[str, int]]:
    """A process in a real ``/docker/<id>`` cgroup that the daemon does not know: what a
    container's process looks like after the daemon lost the container (a runtime that crashed
    under it, or ``docker rm`` racing the scrape). Made by hand with the kernel's cgroup v1
    files; skipped where the hierarchies are not writable."""
    ghost = "e" * 64
    made: list[Path] = []
    proc = subprocess.Popen(["sleep", "3600"])
    try:
        for hierarchy in ("pids", "memory", "systemd"):
            docker_dir = Path("/sys/fs/cgroup") / hierarchy / "docker"
            if not docker_dir.is_dir():
                continue
            group = docker_dir / ghost
            try:
                group.mkdir(exist_ok=True)
                made.append(group)
                (group / "cgroup.procs").write_text(str(proc.pid))
            except OSError as exc:
                pytest.skip(f"cannot make a cgroup here: {exc}")
        if not made:
            pytest.skip("no cgroup v1 docker hierarchy to write into")
        yield ghost, proc.pid
    finally:
        proc.kill()
        proc.wait()
        for group in made:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


async def test_scrape_attributes_real_containers(
    real_docker: Engine,
    full_stack: MakeStack,
    ghost_cgroup: tuple[str, int],
    promtool: str,
) -> None:
    train = real_docker.run("lab-train-1", *SLEEP, labels=COMPOSE)
    nb = real_docker.run("notebook", *SLEEP)
    removed = real_docker.run("short-lived", *SLEEP)
    removed_pid = real_docker.pid(removed)
    real_docker.remove(removed)  # NVML still lists its PID: the process has exited
    ghost, ghost_pid = ghost_cgroup
    state = (
        FakeNvmlState()
        .gpu()
        .gpu()
        .gpu()
        .process(real_docker.pid(train), gpu=0, memory=8 * GIB)
        .process(real_docker.pid(nb), gpu=1, memory=2 * GIB)
        .process(ghost_pid, gpu=1, memory=1 * GIB)
        .process(removed_pid, gpu=2, memory=3 * GIB)
    )
    node = await full_stack(
        upstream=upstream_body(3),
        nvml=state,
        procs=ProcfsSource("/proc"),
        node="",
        docker_host=real_docker.host,
        upstream_timeout=2.0,
        docker_timeout=5.0,
    )
    text = await node.scrape()
    assert_valid_exposition(promtool, text)
    mem = {
        (s["UUID"], s["container"]): float(s["__value__"])
        for s in series(text, "gpu_container_memory_used_bytes")
    }
    assert mem == {
        (default_gpu_uuid(0), "lab-train-1"): 8.0 * GIB,
        (default_gpu_uuid(1), "notebook"): 2.0 * GIB,
    }
    info = {s["container"]: s for s in series(text, "gpu_container_info")}
    assert info["lab-train-1"]["container_id"] == train
    assert info["lab-train-1"]["compose_project"] == "lab"
    assert info["notebook"]["image"] == BUSYBOX_IMAGE
    # The GPU the compose container holds alone is named after it; the shared one is not.
    util = {s["UUID"]: s for s in series(text, "DCGM_FI_DEV_GPU_UTIL")}
    assert util[default_gpu_uuid(0)]["container"] == "lab-train-1"
    assert util[default_gpu_uuid(1)]["container"] == ""
    unattributed = {
        (s["UUID"], s["reason"]): float(s["__value__"])
        for s in series(text, "gpu_unattributed_memory_used_bytes")
    }
    assert unattributed[(default_gpu_uuid(1), "container_not_found")] == 1.0 * GIB
    assert unattributed[(default_gpu_uuid(2), "process_exited")] == 3.0 * GIB
    assert ghost not in {s.get("container_id") for s in series(text, "gpu_container_info")}
    assert short_id(ghost) not in text  # never named by a guess
    up = {s["source"]: s["__value__"] for s in series(text, "dcgm_enricher_source_up")}
    assert up["docker"] == "1.0" and up["procfs"] == "1.0"
