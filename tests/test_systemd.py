"""deploy/systemd: the unit and its environment file, as systemd and the enricher read them.

Debian's ``systemd-analyze`` judges the unit offline, in a root tree of its own (the unit, a
stand-in for the installed program, the host's system units): ``verify`` must print nothing and
``security --offline=true`` must score it at most EXPOSURE_MAX, flagging only the exceptions
docs/install.md explains. No systemd runs as PID 1 here, so the sandbox itself is not started;
the unit's command line and environment file are run as the service runs them (a clean
environment, no Kubernetes), with the fake NVML and a /proc tree standing in for the GPU and
its processes, which cannot exist here.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.nvmlfake import FakeNvml, FakeNvmlState
from devkit.ports import free_port
from devkit.processes import stop_process
from devkit.tools import require_tool, run_tool
from devkit.upstream import TextServer
from enricher.cli import build_parser, env_name, parse_config
from enricher.memory import REASON_DRIVER_RESERVED, REASON_NOT_IN_PROCESS_LIST
from enricher.simnode import fakeproc

from .conftest import ROOT
from .dockerengine import upstream_body
from .harness import assert_memory_adds_up
from .test_manifests import memory_bytes

DEPLOY = ROOT / "deploy" / "systemd"
UNIT = DEPLOY / "dcgm-enricher.service"
ENV_FILE = DEPLOY / "dcgm-enricher.env"
DOCKER_DROPIN = DEPLOY / "docker.conf"
INSTALL_DOC = ROOT / "docs" / "install.md"
SIDECAR = ROOT / "manifests" / "overlays" / "sidecar" / "daemonset.yaml"
UNIT_NAME = "dcgm-enricher.service"
HOST_UNITS = Path("/usr/lib/systemd/system")

# The overall exposure systemd-analyze 252 gives the unit (0 best, 10 worst); docs/install.md
# states it.
EXPOSURE_MAX = 1.6
# What the analyzer flags and the unit keeps, each explained in docs/install.md: the GPU needs
# its devices, the enricher its network and the host's whole /proc.
EXCEPTIONS = frozenset(
    {
        "RootDirectory=/RootImage=",
        "PrivateDevices=",
        "DeviceAllow=",
        "RestrictAddressFamilies=~AF_UNIX",
        "RestrictAddressFamilies=~AF_(INET|INET6)",
        "PrivateNetwork=",
        "IPAddressDeny=",
        "ProtectProc=",
        "ProcSubset=",
        "PrivateUsers=",
    }
)
# The Docker drop-in adds the docker group, which is the point of it.
DOCKER_EXCEPTIONS = EXCEPTIONS | {"SupplementaryGroups="}
# [Service] settings that are no hardening the analyzer scores: what runs, resource limits, the
# device grants, and settings written out at their default to say why they stay there.
NOT_SCORED = frozenset(
    {
        "Type",
        "EnvironmentFile",
        "ExecStart",
        "Restart",
        "RestartSec",
        "DevicePolicy",  # with DeviceAllow= the default policy already closes the rest
        "DeviceAllow",
        "ProtectProc",
        "PrivateUsers",
        "PrivateIPC",
        "SystemCallErrorNumber",
        "MemoryMax",
        "CPUQuota",
        "TasksMax",
    }
)
_OVERALL = re.compile(r"Overall exposure level for \S+: ([0-9]+\.[0-9])\b")
_ENV_LINE = re.compile(r"([A-Z][A-Z0-9_]*)=([^\s\"'\\$]*)")


# --------------------------------------------------------------------------- parsing


def parse_unit(text: str) -> list[tuple[str, str, str]]:
    """A unit file's settings as (section, key, value), in order. Only the plain form this
    project writes: no line continuations, no quoting across lines."""
    settings: list[tuple[str, str, str]] = []
    section = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            raise ValueError(f"line {number}: continuation lines are not used here")
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if not sep or not section:
            raise ValueError(f"line {number}: not a setting: {raw!r}")
        settings.append((section, key.strip(), value.strip()))
    return settings


def unit_value(text: str, section: str, key: str) -> str:
    """The one value of ``key`` in ``section``."""
    (value,) = [v for s, k, v in parse_unit(text) if (s, k) == (section, key)]
    return value


def parse_env_file(text: str) -> dict[str, str]:
    """An EnvironmentFile= as systemd reads this project's: ``NAME=value`` lines, ``#``
    comments. Quotes, backslashes, ``$`` and spaces are refused: systemd and a shell would
    read them differently, and the file needs none of them."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith(("#", ";")):
            continue
        m = _ENV_LINE.fullmatch(raw)
        if m is None:
            raise ValueError(f"line {number}: not a plain NAME=value line: {raw!r}")
        if m[1] in env:
            raise ValueError(f"line {number}: {m[1]} set twice")
        env[m[1]] = m[2]
    return env


def serve_flags() -> dict[str, bool]:
    """Every flag of ``dcgm-enricher serve`` (its positive form), and whether it is a boolean."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = commands.choices["serve"]
    flags: dict[str, bool] = {}
    for action in serve._actions:
        options = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        positive = [o for o in options if not o.startswith("--no-")]
        if positive:
            flags[positive[0]] = any(o.startswith("--no-") for o in options)
    return flags


def exec_start() -> list[str]:
    """The unit's ExecStart= as argv (no specifiers or variables are used in it)."""
    value = unit_value(UNIT.read_text(), "Service", "ExecStart")
    assert not set(value) & set("%$\"'\\"), f"ExecStart= is no plain command line: {value}"
    return shlex.split(value)


def without_line(text: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    assert lines.count(line + "\n") == 1, line
    lines.remove(line + "\n")
    return "".join(lines)


def system_user(text: str) -> str:
    """The unit with a fixed system user in place of DynamicUser=, which implies some of its
    settings (ProtectSystem=strict, PrivateTmp=, NoNewPrivileges=, RemoveIPC=,
    RestrictSUIDSGID=): written out, they hold when a drop-in sets User=, and this variant is
    where dropping one shows."""
    assert "\nDynamicUser=yes\n" in text
    return text.replace("\nDynamicUser=yes\n", "\nUser=dcgm-enricher\n")


# --------------------------------------------------------------------------- systemd-analyze


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    return require_tool("systemd-analyze", "Debian's systemd package (.ci/system-deps installs it)")


@dataclass(frozen=True)
class Analysis:
    verify: str  # what verify printed: nothing when the unit is clean
    score: float
    flagged: frozenset[str]  # the security checks the unit fails

    def problems(self, exceptions: frozenset[str] = EXCEPTIONS) -> list[str]:
        """Why the unit is not as hardened as it is documented to be (empty: it is)."""
        found = []
        if self.verify:
            found.append(f"systemd-analyze verify: {self.verify}")
        if self.score > EXPOSURE_MAX:
            found.append(f"exposure {self.score} > {EXPOSURE_MAX}")
        if self.flagged - exceptions:
            found.append(f"newly flagged: {sorted(self.flagged - exceptions)}")
        return found


def analyze(
    tool: str, tmp_path: Path, unit_text: str, dropins: dict[str, str] | None = None
) -> Analysis:
    """Install ``unit_text`` (and drop-ins) into a root tree under ``tmp_path`` and run both
    checks on it. The tree holds a stand-in for the program ExecStart= names (verify checks
    it is executable) and the host's system units (verify loads the targets it orders after)."""
    root = tmp_path / "root"
    if root.exists():
        shutil.rmtree(root)
    unit_dir = root / "etc" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    (unit_dir / UNIT_NAME).write_text(unit_text)
    if dropins:
        (unit_dir / f"{UNIT_NAME}.d").mkdir()
        for name, text in dropins.items():
            (unit_dir / f"{UNIT_NAME}.d" / name).write_text(text)
    program = root / exec_start()[0].lstrip("/")
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    shutil.copytree(HOST_UNITS, root / HOST_UNITS.relative_to("/"), symlinks=True)
    where = (f"--root={root}", UNIT_NAME)
    verify = run_tool([tool, "verify", "--man=no", *where])
    security = run_tool([tool, "security", "--offline=true", *where])
    table = run_tool([tool, "security", "--offline=true", "--json=short", *where])
    assert table.returncode == 0, table.stderr
    m = _OVERALL.search(security.stdout)
    assert m is not None, security.stdout + security.stderr
    checks = json.loads(table.stdout)
    said = (verify.stdout + verify.stderr).strip()
    if verify.returncode != 0 and not said:
        said = f"exit status {verify.returncode}"
    return Analysis(
        verify=said,
        score=float(m[1]),
        flagged=frozenset(c["name"] for c in checks if not c["set"]),
    )


@pytest.mark.one_python
@pytest.mark.parametrize(
    ("variant", "exceptions"),
    [
        pytest.param("shipped", EXCEPTIONS, id="shipped"),
        pytest.param("docker", DOCKER_EXCEPTIONS, id="with-docker-drop-in"),
        pytest.param("system-user", EXCEPTIONS, id="system-user"),
    ],
)
def test_unit_passes_systemd_analyze(
    systemd_analyze: str, tmp_path: Path, variant: str, exceptions: frozenset[str]
) -> None:
    """verify prints nothing; the exposure stays at EXPOSURE_MAX with only the documented
    exceptions flagged, for the unit as shipped, with the Docker drop-in, and as a fixed user."""
    text = UNIT.read_text()
    dropins = {"docker.conf": DOCKER_DROPIN.read_text()} if variant == "docker" else None
    if variant == "system-user":
        text = system_user(text)
    result = analyze(systemd_analyze, tmp_path, text, dropins)
    assert result.problems(exceptions) == []
    assert result.flagged == exceptions, "an exception is gone: update EXCEPTIONS and the docs"


def hardening_lines() -> Iterator[str]:
    for section, key, value in parse_unit(UNIT.read_text()):
        if section == "Service" and key not in NOT_SCORED:
            yield f"{key}={value}"


@pytest.mark.one_python
@pytest.mark.parametrize("line", list(hardening_lines()))
def test_dropping_a_hardening_line_fails_the_check(
    systemd_analyze: str, tmp_path: Path, line: str
) -> None:
    """The checks above are tight enough to notice any one hardening line going, in the
    fixed-user variant where DynamicUser= implies none of them."""
    text = without_line(
        system_user(UNIT.read_text()), line.replace("DynamicUser=yes", "User=dcgm-enricher")
    )
    assert analyze(systemd_analyze, tmp_path, text).problems() != []


@pytest.mark.one_python
def test_install_doc_states_the_measured_exposure(systemd_analyze: str, tmp_path: Path) -> None:
    """The figures docs/install.md gives, in its order: the unit as shipped, with an IP allow
    list, and as root without capabilities."""
    unit = UNIT.read_text()
    measured = [
        analyze(systemd_analyze, tmp_path, unit, dropins).score
        for dropins in (
            None,
            {"ip.conf": "[Service]\nIPAddressDeny=any\nIPAddressAllow=localhost 192.0.2.10\n"},
            {"root.conf": "[Service]\nDynamicUser=no\n"},
        )
    ]
    section = bare_metal_section()
    stated = re.findall(r"exposure level[^0-9]*([0-9]+\.[0-9])", section)
    assert stated == [f"{score:.1f}" for score in measured]
    table = section.replace("\\|", "|")  # a | in a table cell is written \|
    for name in EXCEPTIONS:
        assert f"`{name}`" in table, f"docs/install.md does not explain {name}"


@pytest.mark.one_python
def test_install_doc_scrape_config_is_valid(promtools: list[str], tmp_path: Path) -> None:
    """The documented scrape job passes promtool and carries the job label the rules select."""
    (block,) = [
        b
        for b in re.findall(r"(?ms)^ *```yaml\n(.*?)^ *```", bare_metal_section())
        if "scrape_configs" in b
    ]
    config = yaml.safe_load(block)
    (job,) = config["scrape_configs"]
    assert (job["job_name"], job["honor_labels"]) == ("dcgm-enricher", True)
    path = tmp_path / "prometheus.yml"
    path.write_text(block)
    for promtool in promtools:
        res = run_tool([promtool, "check", "config", str(path)])
        assert res.returncode == 0, res.stdout + res.stderr


# --------------------------------------------------------------------------- flags and files


def bare_metal_section() -> str:
    text = INSTALL_DOC.read_text()
    m = re.search(r"(?ms)^## Bare-metal hosts \(systemd\)\n(.*?)(?=^## |\Z)", text)
    assert m is not None, "docs/install.md has no 'Bare-metal hosts (systemd)' section"
    return m[1]


def test_env_file_sets_only_real_flags() -> None:
    """Every variable is a flag's (a misspelt one would be ignored by the enricher without a
    word), and every boolean is spelt true or false (anything else reads as false)."""
    flags = serve_flags()
    by_env = {env_name(flag): flag for flag in flags}
    env = parse_env_file(ENV_FILE.read_text())
    assert env
    unknown = sorted(set(env) - set(by_env))
    assert not unknown, f"not a flag's variable: {unknown}"
    for name, value in env.items():
        if flags[by_env[name]]:
            assert value in ("true", "false"), f"{name}={value}: write true or false"


@pytest.mark.parametrize(
    "line",
    ["ENRICHER_LOG_LEVEL='info'", "ENRICHER_LOG_LEVEL = info", "export ENRICHER_LOG_LEVEL=info"],
)
def test_env_file_parser_refuses_what_systemd_reads_otherwise(line: str) -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_env_file(line + "\n")


def service_environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment systemd gives the service: the file's variables and nothing of this
    machine's (no NODE_NAME, no KUBECONFIG, no other ENRICHER_*)."""
    for name in list(os.environ):
        if name.startswith(("ENRICHER_", "KUBERNETES_")) or name in ("NODE_NAME", "KUBECONFIG"):
            monkeypatch.delenv(name)
    env = parse_env_file(ENV_FILE.read_text())
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_exec_start_parses_with_the_env_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """ExecStart= with the file's environment is a valid ``serve`` configuration for a host
    without Kubernetes: no pod watch, no kubelet, cgroup-only containers, dcgm-exporter on
    loopback."""
    service_environment(monkeypatch)
    argv = exec_start()
    assert argv[0] == "/opt/dcgm-enricher/bin/dcgm-enricher"
    command, config, _ = parse_config(argv[1:])
    assert command == "serve"
    assert not config.kube_active
    assert not config.kubelet_active
    assert not config.kube_resource_slices
    assert config.docker_host == "" and config.docker_active
    assert config.upstream_url == "http://127.0.0.1:9400/metrics"
    assert config.listen_address == ":9401"
    assert config.collector_process


def test_install_steps_name_the_unit_paths() -> None:
    """The documented steps put the program where ExecStart= runs it and the files where the
    unit and systemd read them."""
    section = bare_metal_section()
    program = exec_start()[0]
    venv = program.removesuffix("/bin/dcgm-enricher")
    assert f"python3 -m venv {venv}" in section
    assert f"{venv}/bin/pip install" in section
    env_path = unit_value(UNIT.read_text(), "Service", "EnvironmentFile")
    assert f"deploy/systemd/dcgm-enricher.env {env_path}" in section
    assert f"deploy/systemd/dcgm-enricher.service /etc/systemd/system/{UNIT_NAME}" in section
    assert f"deploy/systemd/docker.conf /etc/systemd/system/{UNIT_NAME}.d/docker.conf" in section
    assert "systemctl enable --now dcgm-enricher" in section


def test_unit_limits_are_the_manifests() -> None:
    """MemoryMax= and CPUQuota= are the enricher container's limits in the manifests."""
    docs = list(yaml.safe_load_all(SIDECAR.read_text()))
    (limits,) = [
        c["resources"]["limits"]
        for d in docs
        if d and d.get("kind") == "DaemonSet"
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "dcgm-enricher"
    ]
    text = UNIT.read_text()
    memory = re.fullmatch(r"([0-9]+)M", unit_value(text, "Service", "MemoryMax"))
    assert memory is not None
    assert int(memory[1]) << 20 == memory_bytes(limits["memory"])  # systemd's M is MiB
    cpu = re.fullmatch(r"([0-9]+)%", unit_value(text, "Service", "CPUQuota"))
    millicores = re.fullmatch(r"([0-9]+)m", str(limits["cpu"]))
    assert cpu is not None and millicores is not None
    assert int(cpu[1]) * 10 == int(millicores[1])


# The NVIDIA driver's character device groups as /proc/devices lists them, each with the
# (major, first minor, last minor) it registers, by driver generation. Before 550.40,
# nvidia-frontend registers all of major 195 (register_chrdev: /dev/nvidia<N> from minor 0,
# /dev/nvidiactl at 255). From 550.40 (open-gpu-kernel-modules, kernel-open/nvidia/nv.c,
# nv_register_chrdev), major 195 is two groups: "nvidia" (minors 0-247, /dev/nvidia<N>) and
# "nvidiactl" (minor 255); nvidia-container-toolkit's internal/info/proc/devices reads the
# rename the same way. nvidia-caps (MIG capabilities, /dev/nvidia-caps/nvidia-cap<N>),
# nvidia-caps-imex-channels and nvidia-uvm take dynamic majors (CAPS_MAJOR and the others here
# are examples).
NV_MAJOR = 195
CAPS_MAJOR = 236
NVIDIA_DEVICE_GROUPS = {
    "before-550.40": {
        "nvidia-frontend": (NV_MAJOR, 0, 255),
        "nvidia-caps": (CAPS_MAJOR, 0, 255),
        "nvidia-uvm": (237, 0, 1),
    },
    "550.40-and-later": {
        "nvidia": (NV_MAJOR, 0, 247),
        "nvidiactl": (NV_MAJOR, 255, 255),
        "nvidia-caps": (CAPS_MAJOR, 0, 255),
        "nvidia-caps-imex-channels": (235, 0, 2047),
        "nvidia-uvm": (237, 0, 1),
    },
}
# The nodes NVML opens, (major, minor, access): the control device and each GPU read-write,
# and on MIG GPUs the monitor capability (nvidia-cap2) read-only.
NVML_NODES = {
    "/dev/nvidiactl": (NV_MAJOR, 255, "rw"),
    "/dev/nvidia0": (NV_MAJOR, 0, "rw"),
    "/dev/nvidia7": (NV_MAJOR, 7, "rw"),
    "/dev/nvidia-caps/nvidia-cap2": (CAPS_MAJOR, 2, "r"),
}
# Nodes NVML does not open, which the unit must not reach: CUDA's memory manager, IMEX.
NOT_NVML_GROUPS = ("nvidia-uvm", "nvidia-caps-imex-channels")
SHIPPED_DEVICE_ALLOW = {
    ("char-nvidia-frontend", "rw"),
    ("char-nvidia", "rw"),
    ("char-nvidiactl", "rw"),
    ("char-nvidia-caps", "r"),
}


def device_allow(text: str) -> set[tuple[str, str]]:
    """The unit's DeviceAllow= lines as (specifier, access)."""
    out = set()
    for section, key, value in parse_unit(text):
        if (section, key) == ("Service", "DeviceAllow"):
            spec, _, access = value.partition(" ")
            out.add((spec, access.strip()))
    return out


def granted(
    allow: set[tuple[str, str]], groups: dict[str, tuple[int, int, int]]
) -> list[tuple[int, int, int, str]]:
    """(major, first minor, last minor, access) for each grant, as systemd.resource-control(5)
    documents ``char-NAME``: the devices of each /proc/devices group whose name matches NAME
    (a glob). (systemd's code grants the matched name's whole major, which is wider; the unit
    does not lean on that.)"""
    out = []
    for spec, access in allow:
        assert spec.startswith("char-"), f"only device groups, no paths: {spec}"
        for name, (major, first, last) in groups.items():
            if fnmatch.fnmatchcase(name, spec.removeprefix("char-")):
                out.append((major, first, last, access))
    return out


@pytest.mark.parametrize("driver", sorted(NVIDIA_DEVICE_GROUPS))
def test_unit_allows_exactly_the_devices_nvml_opens(driver: str) -> None:
    """DevicePolicy=closed with the DeviceAllow= set NVML needs, on either driver generation:
    /dev/nvidiactl and /dev/nvidia<N> read-write (groups nvidia-frontend before 550.40;
    nvidia and nvidiactl from 550.40, where the control device is a group of its own), the
    MIG capability nodes read-only (nvidia-caps), and nothing of nvidia-uvm (CUDA's, not
    NVML's) or IMEX. A name the running driver lacks in /proc/devices is skipped by systemd,
    so the unit names both generations'. Without one of these lines NVML cannot open its
    devices on some driver while systemd-analyze still passes (it scores DeviceAllow= only as
    set or not)."""
    text = UNIT.read_text()
    assert unit_value(text, "Service", "DevicePolicy") == "closed"
    allow = device_allow(text)
    groups = NVIDIA_DEVICE_GROUPS[driver]
    grants = granted(allow, groups)
    for node, (major, minor, access) in NVML_NODES.items():
        can = [a for m, first, last, a in grants if m == major and first <= minor <= last]
        assert any(set(access) <= set(a) for a in can), f"{driver}: NVML cannot open {node}"
    for name in NOT_NVML_GROUPS:
        if name in groups:
            major = groups[name][0]
            assert not [g for g in grants if g[0] == major], f"{driver}: {name} is reachable"
    assert allow == SHIPPED_DEVICE_ALLOW


# --------------------------------------------------------------------------- the service runs

CID = "c0ffee" * 10 + "abcd"
DEVICE_PARTS = (REASON_DRIVER_RESERVED, REASON_NOT_IN_PROCESS_LIST)
PODMAN_CID = "beef" * 16


def test_service_command_serves_without_kubernetes(
    fake_nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ExecStart='s command with the env file's environment and no Kubernetes anywhere starts
    and serves: a Docker and a Podman container's processes are attributed to their short IDs
    (cgroup-only), a Slurm job step's is host_process with its own per-process series, and no
    Kubernetes source is on. Only the listen address, the upstream's URL, the NVML library and
    the /proc root are pointed at the stand-ins."""
    env = service_environment(monkeypatch)
    proc_root = tmp_path / "proc"
    fakeproc.write_proc_stat(proc_root, int(time.time()) - 3600)
    state = FakeNvmlState().gpu().gpu()
    for pid, comm, gpu, gib, cgroup in (
        (4100, "python3", 0, 3, f"/system.slice/docker-{CID}.scope"),
        (4200, "train", 0, 1, "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0"),
        (4300, "infer", 1, 2, f"/machine.slice/libpod-{PODMAN_CID}.scope/container"),
    ):
        fakeproc.write_process(
            proc_root, pid, comm=comm, start_ticks=pid, cgroup=fakeproc.cgroup_host(cgroup)
        )
        state.process(pid, gpu=gpu, memory=gib << 30)
    fake_nvml.write(state)
    body = upstream_body(2).encode()
    upstream = TextServer(lambda path: body)
    port = free_port()
    env.update(
        ENRICHER_WEB_LISTEN_ADDRESS=f"127.0.0.1:{port}",
        ENRICHER_UPSTREAM_URL=f"http://127.0.0.1:{upstream.port}/metrics",
        ENRICHER_NVML_LIBRARY=str(fake_nvml.library),
        ENRICHER_PATH_PROCFS=str(proc_root),
        FAKE_NVML_STATE=os.environ["FAKE_NVML_STATE"],
        PATH=os.environ["PATH"],
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "enricher", *exec_start()[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env=env,
    )
    try:
        text = ""
        deadline = time.monotonic() + 30
        while not text and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.2)
        assert text, "the service did not serve /metrics"
    finally:
        stop_process(proc)
        upstream.close()
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 0, out
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def values(name: str, label: str) -> dict[str, float]:
        return {s.labels[label]: s.value for s in samples if s.name == name}

    assert values("dcgm_enricher_source_enabled", "source") == {
        "upstream": 1,
        "nvml": 1,
        "procfs": 1,
        "kubernetes": 0,
        "podresources": 0,
        "resourceslices": 0,
        "docker": 0,
    }
    up = values("dcgm_enricher_source_up", "source")
    assert (up["upstream"], up["nvml"], up["procfs"]) == (1, 1, 1)
    assert values("gpu_container_memory_used_bytes", "container") == {
        CID[:12]: 3 << 30,
        PODMAN_CID[:12]: 2 << 30,
    }
    reasons = values("gpu_unattributed_memory_used_bytes", "reason")
    # The device-level parts (what no listed process holds, the driver's reservation) are held
    # by assert_memory_adds_up; the processes' reason is the Slurm step's.
    assert {r: v for r, v in reasons.items() if r not in DEVICE_PARTS} == {"host_process": 1 << 30}
    assert_memory_adds_up(text)
    assert values("gpu_process_memory_used_bytes", "process_name") == {
        "python3": 3 << 30,
        "train": 1 << 30,
        "infer": 2 << 30,
    }
    assert "Traceback" not in out and "kubernetes" not in out.lower(), out
