"""The project builds as a wheel that installs into a clean virtualenv and runs.

This is what the container image does (Dockerfile builder stage), without a container engine:
copy in only what .dockerignore lets into the image's build context, build the wheel from that,
install it with its dependencies from the package registry into a fresh venv that cannot see
this checkout's .venv, and run the console script. It needs the registry (pip
downloads the build backend and the dependencies); without one it is skipped, saying so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 300.0  # the whole test, all steps together

# The first step that needs the registry fails with one of these when it is unreachable.
OFFLINE = re.compile(
    r"NewConnectionError|Temporary failure in name resolution|Name or service not known"
    r"|Network is unreachable|Max retries exceeded|ConnectTimeout|ReadTimeout"
    r"|Could not find a version that satisfies|No matching distribution found"
)

pytestmark = pytest.mark.slow


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def docker_context(into: Path) -> Path:
    """Copy what .dockerignore admits (an allow-list after ``*``) into a fresh directory."""
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert lines[0] == "*", ".dockerignore is expected to be an allow-list"
    into.mkdir()
    for name in (ln[1:].rstrip("/") for ln in lines if ln.startswith("!")):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, into / name)
    return into


class Steps:
    """Runs commands under one shared deadline, so the test as a whole stays bounded."""

    def __init__(self, budget_s: float, cwd: Path) -> None:
        self.deadline = time.monotonic() + budget_s
        self.cwd = cwd
        # A clean environment for pip: nothing from the venv this test runs in leaks through.
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER"}
        }
        self.env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")

    def run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"over the {BUDGET_S:.0f} s budget before running {args[:3]}")
        try:
            return subprocess.run(
                [str(a) for a in args],
                capture_output=True,
                text=True,
                timeout=left,
                cwd=self.cwd,
                env=self.env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"over the {BUDGET_S:.0f} s budget in {args[:3]}")

    def registry_step(self, what: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """A step that downloads: skipped when the registry is unreachable, failed otherwise."""
        proc = self.run(*args)
        if proc.returncode != 0:
            output = proc.stdout + proc.stderr
            if OFFLINE.search(output) and not self.registry_reachable():
                pytest.skip(f"{what}: the package registry is unreachable, so no install test")
            pytest.fail(f"{what} failed:\n{output[-4000:]}")
        return proc

    def registry_reachable(self) -> bool:
        """Whether pip can fetch anything at all (a tiny, always-present package)."""
        probe = self.cwd / "probe"
        proc = self.run(
            sys.executable, "-m", "pip", "download", "--no-deps", "--dest", probe, "iniconfig"
        )
        return proc.returncode == 0


def test_wheel_installs_into_clean_venv_and_runs(tmp_path: Path) -> None:
    steps = Steps(BUDGET_S, tmp_path)
    dist = tmp_path / "dist"
    # Built from a copy: the image's context, and nothing written into the checkout.
    source = docker_context(tmp_path / "context")

    steps.registry_step(
        "building the wheel",
        sys.executable, "-m", "pip", "wheel", "--no-deps", source, "--wheel-dir", dist,
    )  # fmt: skip
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name for w in wheels] == [f"dcgm_enricher-{project_version()}-py3-none-any.whl"]

    # No pip inside (ensurepip alone takes seconds): this interpreter's pip installs into it.
    venv = tmp_path / "venv"
    created = steps.run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert created.returncode == 0, created.stderr
    config = (venv / "pyvenv.cfg").read_text()
    assert re.search(r"include-system-site-packages\s*=\s*false", config)
    python = venv / "bin" / "python"

    # --no-compile: byte-compiling the kubernetes client is a third of the install time and
    # proves nothing here (the image's build does compile).
    steps.registry_step(
        "installing the wheel",
        sys.executable, "-m", "pip", "--python", python, "install", "--no-compile", wheels[0],
    )  # fmt: skip

    # Clean means clean: the test runner's own packages are not importable there ...
    leaked = steps.run(python, "-c", "import pytest")
    assert leaked.returncode != 0, "the new venv sees this checkout's packages"
    # ... and `enricher` comes from the installed wheel, not from this source tree.
    where = steps.run(python, "-c", "import enricher, pathlib; print(enricher.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    helped = steps.run(venv / "bin" / "dcgm-enricher", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--upstream.url" in helped.stdout

    # `python -m enricher` is the other documented way in, and `serve` is the image's CMD.
    served = steps.run(python, "-m", "enricher", "serve", "--help")
    assert served.returncode == 0, served.stderr
    assert "--upstream.url" in served.stdout
