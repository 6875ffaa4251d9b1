"""Shared test plumbing: golden-file switch, ../shared fixtures, the Prometheus releases."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from .promreleases import PromRelease, releases, require
from .tools import require_tool

pytest_plugins = ["tests.nvmlfake", "tests.harness", "tests.dockerengine", "tests.imagebuild"]

ROOT = Path(__file__).resolve().parent.parent
SHARED_DCGM = ROOT.parent / "shared" / "fixtures" / "dcgm"
GOLDEN = Path(__file__).resolve().parent / "golden"

# CI (CI=true) runs many examples; a developer's default run stays quick.
# HYPOTHESIS_PROFILE=ci|dev overrides.
settings.register_profile(
    "ci", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/*.out from the current output",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def shared_dcgm_fixtures() -> list[Path]:
    """The real dcgm-exporter captures in ../shared (not ours: read, never copied)."""
    if not SHARED_DCGM.is_dir():
        return []
    return sorted(SHARED_DCGM.glob("*.prom"))


@pytest.fixture(scope="session", params=releases(), ids=lambda r: r.id)
def prom_release(request: pytest.FixtureRequest) -> PromRelease:
    """Each Prometheus release in turn (tests.promreleases): for tests that start a server."""
    release: PromRelease = request.param
    return require(release)


@pytest.fixture(scope="session")
def promtool(prom_release: PromRelease) -> str:
    """The promtool of each Prometheus release in turn: every test that takes it runs twice."""
    return prom_release.promtool


def promtool_check_metrics(promtool: str, text: str) -> subprocess.CompletedProcess[str]:
    """Run ``promtool check metrics`` on exposition text (it lints and validates)."""
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_valid_exposition(promtool: str, text: str) -> None:
    """promtool parses ``text``; its lint remarks concern only upstream names we must keep.

    One remark on our own families is by design: they copy the exporter's camelCase device
    labels (UUID, modelName, GPU_I_ID) so that joins with its series work.
    """
    res = promtool_check_metrics(promtool, text)
    out = res.stdout + res.stderr
    assert res.returncode in (0, 3), out
    assert "error while linting" not in out, out
    for line in out.splitlines():
        if line.startswith(("gpu_", "dcgm_enricher_")):
            assert "should be written in 'snake_case'" in line, line


def as_prometheus_client_writes(text: str) -> str:
    """``text``'s families as prometheus_client reads them (its parser) and writes them back
    (``generate_latest``): the oracle for what the enricher writes of its own families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Parsed(list(text_string_to_metric_families(text))))
    return generate_latest(registry).decode("utf-8")


class _Parsed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl (kustomize builds of the manifests): fails in CI, skips elsewhere, if missing."""
    return require_tool("kubectl", "kustomize builds of the manifests (.ci/system-deps)")


@pytest.fixture(scope="session")
def promtools() -> list[str]:
    """``promtool`` of every Prometheus release the tests run on, for batched checks that
    judge one set of outputs with each (tests/promcheck.py)."""
    return [require(r).promtool for r in releases()]
