"""The Prometheus releases every test that runs Prometheus or promtool runs on.

Two: Debian 12's 2.42 (the system package, /usr/bin) and the 3.5 LTS release, unpacked from
Debian's unstable suite into .cache/prometheus-3 by .ci/prometheus3 (``make test`` runs it).
ENRICHER_PROMETHEUS3_DIR names another root for 3.x (binaries in ROOT/usr/bin). In CI (CI set)
a missing release fails the tests that need it; elsewhere they skip.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from devkit import prometheus
from devkit.prometheus import Server

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS3_DIR = ROOT / ".cache" / "prometheus-3"
SYSTEM_BIN = Path("/usr/bin")


@dataclass(frozen=True)
class PromRelease:
    """One Prometheus release: its major.minor version and the paths of its two binaries."""

    version: str
    prometheus: str
    promtool: str

    @property
    def id(self) -> str:
        """The test id: prom2, prom3."""
        return "prom" + self.version.split(".")[0]


def _release(version: str, bindir: Path) -> PromRelease:
    return PromRelease(version, str(bindir / "prometheus"), str(bindir / "promtool"))


def releases() -> list[PromRelease]:
    """Both releases, present or not (``require`` checks a release before a test uses it)."""
    root = Path(os.environ.get("ENRICHER_PROMETHEUS3_DIR") or PROMETHEUS3_DIR)
    return [_release("2.42", SYSTEM_BIN), _release("3.5", root / "usr" / "bin")]


def missing(release: PromRelease) -> list[str]:
    """The binaries of ``release`` that are not there (or not executable)."""
    return [
        path
        for path in (release.prometheus, release.promtool)
        if not (os.access(path, os.X_OK) and Path(path).is_file())
    ]


def require(release: PromRelease) -> PromRelease:
    """``release`` when both binaries are there; fails in CI and skips elsewhere otherwise."""
    absent = missing(release)
    if absent:
        how = (
            "apt-get install prometheus"
            if release.version.startswith("2.")
            else ".ci/prometheus3 (make test runs it)"
        )
        message = f"Prometheus {release.version} is missing ({', '.join(absent)}): {how}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return release


@contextlib.contextmanager
def serve(
    release: PromRelease, config: dict[str, Any], folder: Path, **options: Any
) -> Iterator[Server]:
    """``release``'s Prometheus running ``config`` (written to ``folder``), once it is ready,
    with ``options`` as devkit.prometheus.serve takes them (``agent``, ``flags``). One that
    does not start fails the test."""

    def failed(message: str) -> NoReturn:
        pytest.fail(f"Prometheus {release.version}: {message}")

    with prometheus.serve(release.prometheus, config, folder, failed=failed, **options) as server:
        yield server
