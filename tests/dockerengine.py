"""A real Docker Engine for the tests: Debian's ``docker.io`` daemon, started by the tests.

The daemon runs as root with everything private to the test session (``--data-root``,
``--exec-root``, ``--pidfile``, its own containerd under the exec root, a unix socket in a
fresh directory under /tmp) and with nothing that touches the host's network: ``--bridge=none``,
``--iptables=false``, ``--ip6tables=false``; storage on ``vfs``, which needs no kernel module.
It is stopped, and its folders removed, when the session ends.

Containers run a ``busybox-static`` root file system imported as an image (``docker import``):
no registry is reachable here. The kernel writes real cgroup lines (``/docker/<id>`` on this
cgroup v1 machine) for their processes, which is what the enricher reads.

A missing part (not root, no ``dockerd``, no static busybox) fails the test in CI (CI set:
``.ci/system-deps`` installs them) and skips elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devkit.nvmlfake import default_gpu_uuid
from devkit.tools import require_tool

BUSYBOX_IMAGE = "enricher-test/busybox:1"
_BUSYBOX = Path("/bin/busybox")
_APPLETS = ("sh", "sleep", "cat", "ls", "true")
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 30.0

# The labels `docker compose` puts on a container of service "train" in project "lab".
COMPOSE = {
    "com.docker.compose.project": "lab",
    "com.docker.compose.service": "train",
    "com.docker.compose.container-number": "1",
}
# A workload that stays until it is removed.
SLEEP = ("sleep", "3600")


def upstream_body(gpus: int) -> str:
    """dcgm-exporter's text for a Docker host with ``gpus`` GPUs (no pod labels at all)."""
    lines = []
    for name, kind, value in (
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", 50),
        ("DCGM_FI_DEV_FB_USED", "gauge", 4096),
    ):
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        lines += [
            f'{name}{{gpu="{i}",UUID="{default_gpu_uuid(i)}",device="nvidia{i}",'
            f'modelName="NVIDIA A100-SXM4-80GB",Hostname="engine-host"}} {value}'
            for i in range(gpus)
        ]
    return "\n".join(lines) + "\n"


class EngineUnavailable(RuntimeError):
    """What the daemon or the CLI said when it did not work."""


def skip_or_fail(message: str) -> None:
    """Fail in CI (CI set: .ci/system-deps and .ci/image-base provide the parts), skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _is_static(path: Path) -> bool:
    """An ELF file without a PT_INTERP program header (no dynamic loader): runs in any root."""
    data = path.read_bytes()[: 1 << 16]
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only: the machine is x86_64
        return False
    phoff = int.from_bytes(data[32:40], "little")
    phentsize = int.from_bytes(data[54:56], "little")
    phnum = int.from_bytes(data[56:58], "little")
    for i in range(phnum):
        start = phoff + i * phentsize
        if int.from_bytes(data[start : start + 4], "little") == 3:  # PT_INTERP
            return False
    return True


@dataclass
class Engine:
    """One running dockerd and the ``docker`` CLI pointed at it."""

    root: Path
    process: subprocess.Popen[bytes]
    cli: str
    log_path: Path
    created: list[str] = field(default_factory=list)

    @property
    def socket_path(self) -> str:
        return str(self.root / "docker.sock")

    @property
    def host(self) -> str:
        """The value for ``--docker.host``."""
        return f"unix://{self.socket_path}"

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the ``docker`` CLI (or a Makefile running it) here."""
        env = {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}
        env.pop("DOCKER_CONTEXT", None)
        env["DOCKER_CONFIG"] = str(self.root / "cli-config")  # no user config, no credentials
        return env

    def docker(
        self, *args: str, input: bytes | None = None, timeout: float = 120.0, check: bool = True
    ) -> str:
        """Run the CLI against this daemon; its stdout (an error with stderr when it fails)."""
        done = subprocess.run(
            [self.cli, *args], input=input, capture_output=True, timeout=timeout, env=self.env
        )
        if check and done.returncode != 0:
            raise EngineUnavailable(
                f"docker {' '.join(args[:3])}... exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )
        return done.stdout.decode()

    def run(
        self,
        name: str,
        *command: str,
        image: str = BUSYBOX_IMAGE,
        labels: Mapping[str, str] | None = None,
        network: str = "none",
        options: Sequence[str] = (),
    ) -> str:
        """``docker run -d``, with no network unless told: the new container's full ID."""
        argv = ["run", "-d", "--name", name, "--network", network, *options]
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        cid = self.docker(*argv, image, *command).strip()
        self.created.append(cid)
        return cid

    def inspect(self, ref: str) -> dict[str, Any]:
        doc = json.loads(self.docker("inspect", "--type", "container", ref))
        assert isinstance(doc, list) and len(doc) == 1
        return dict(doc[0])

    def pid(self, ref: str) -> int:
        """The host PID of the container's main process (0 when it is not running)."""
        return int(self.inspect(ref)["State"]["Pid"])

    def remove(self, ref: str) -> None:
        self.docker("rm", "-f", "-v", ref, check=False)

    def api_version(self) -> str:
        """The newest API version the daemon serves, as ``docker version`` reports it."""
        return self.docker("version", "--format", "{{.Server.APIVersion}}").strip()

    def clean(self) -> None:
        """Remove every container the tests created."""
        for cid in self.created:
            self.remove(cid)
        self.created.clear()


def _wait_for_daemon(engine: Engine) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    last = ""
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            break
        try:
            engine.docker("version", "--format", "{{.Server.Version}}", timeout=10)
            return
        except (EngineUnavailable, subprocess.TimeoutExpired) as exc:
            last = str(exc)
        time.sleep(0.3)
    log = engine.log_path.read_text(errors="replace")[-3000:]
    raise EngineUnavailable(f"dockerd did not come up: {last}\n--- dockerd log ---\n{log}")


def _import_busybox(engine: Engine) -> None:
    """An image of nothing but the static busybox and a few applet links."""
    rootfs = engine.root / "busybox-root"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "tmp").mkdir()
    shutil.copy2(_BUSYBOX, rootfs / "bin" / "busybox")
    for applet in _APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True)
    engine.docker("import", "-", BUSYBOX_IMAGE, input=tar.stdout)


def _stop(engine: Engine) -> None:
    with contextlib.suppress(Exception):
        engine.clean()
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        try:
            engine.process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            engine.process.wait(10)
    # The daemon unmounts what it mounted on a clean stop; what it left (a killed daemon) is
    # unmounted here before the folders go, so nothing of the host's is removed through a mount.
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        ours = [line.split()[1] for line in mounts if str(engine.root) in line.split()[1]]
    for target in sorted(ours, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    shutil.rmtree(engine.root, ignore_errors=True)


@contextlib.contextmanager
def docker_daemon() -> Iterator[Engine]:
    """Start a private dockerd with the busybox image imported; stop it afterwards."""
    if os.geteuid() != 0:
        skip_or_fail("the real Docker Engine tests run dockerd, which needs root")
    dockerd = require_tool("dockerd", "apt-get install docker.io (.ci/system-deps does)")
    cli = require_tool("docker", "apt-get install docker.io (.ci/system-deps does)")
    if not _BUSYBOX.exists() or not _is_static(_BUSYBOX):
        skip_or_fail("no static /bin/busybox: apt-get install busybox-static (.ci/system-deps)")
    root = Path(tempfile.mkdtemp(prefix="dkd-", dir="/tmp"))  # a unix socket path stays short
    log_path = root / "dockerd.log"
    argv = [
        dockerd,
        "--storage-driver=vfs",
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        f"--data-root={root / 'data'}",
        f"--exec-root={root / 'exec'}",
        f"--pidfile={root / 'dockerd.pid'}",
        f"--host=unix://{root / 'docker.sock'}",
        "--log-level=warn",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    engine = Engine(root, process, cli, log_path)
    try:
        _wait_for_daemon(engine)
        _import_busybox(engine)
    except BaseException:
        _stop(engine)
        raise
    try:
        yield engine
    finally:
        _stop(engine)


@pytest.fixture
def real_docker(docker_engine_session: Engine) -> Iterator[Engine]:
    """The real Docker Engine; the containers a test starts are removed after it."""
    yield docker_engine_session
    docker_engine_session.clean()
