"""The two Prometheus releases the tests run on are the ones they claim to be."""

from __future__ import annotations

import subprocess

import pytest

from .promreleases import PromRelease, releases


def test_releases_are_two_majors() -> None:
    assert [r.id for r in releases()] == ["prom2", "prom3"]


@pytest.mark.parametrize("binary", ["prometheus", "promtool"])
def test_binary_reports_the_release(prom_release: PromRelease, binary: str) -> None:
    path = getattr(prom_release, binary)
    proc = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    first = (proc.stdout + proc.stderr).splitlines()[0]
    assert first.startswith(f"{binary}, version {prom_release.version}."), first
