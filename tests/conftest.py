"""Shared test plumbing: golden-file switch, ../shared fixtures, the Prometheus releases."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from devkit.tools import require_tool

from .promreleases import PromRelease, releases, require

pytest_plugins = [
    "devkit.nvmlfake",
    "tests.harness",
    "tests.dockerengine",
    "tests.imagebuild",
    "tests.hygiene",
]

ROOT = Path(__file__).resolve().parent.parent
SHARED_DCGM = ROOT.parent / "shared" / "fixtures" / "dcgm"
GOLDEN = Path(__file__).resolve().parent / "golden"

# The long run (`make test-deep`, ENRICHER_TEST_DEEP=1): the deep Hypothesis profile, the tests
# marked `deep`, and every cross-product the default run samples once (both Helm releases for
# every chart render; the whole suite on the lowest Python too). Not run by CI.
DEEP = os.environ.get("ENRICHER_TEST_DEEP") == "1"

# Examples per property, by profile (HYPOTHESIS_PROFILE=dev|ci|deep overrides the choice):
# - dev: a developer's default run and `make check`;
# - ci: CI (CI=true, `make test`): every property sized to find what the mutations of
#   docs/development.md need, in minutes for the whole suite;
# - deep: `make test-deep`, twice the examples CI ran until 2026-12 (2,000), for a machine with
#   time. Properties that set their own max_examples scale with the profile (``examples``).
PROFILE_EXAMPLES = {"dev": 50, "ci": 200, "deep": 4000}
for _name, _count in PROFILE_EXAMPLES.items():
    settings.register_profile(
        _name, max_examples=_count, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "deep" if DEEP else "ci" if os.environ.get("CI") else "dev"
)
settings.load_profile(PROFILE)


# A property that sets its own count (``examples``) gets it in ci, a quarter in dev, four times
# in deep (more than the ci profile ran until 2026-12, where such counts were fixed).
PROFILE_SCALE = {"dev": 0.25, "ci": 1.0, "deep": 4.0}


def examples(ci_count: int) -> int:
    """A property's own max_examples, given as its count in the ci profile, scaled to the
    profile loaded (at least 10)."""
    return max(10, int(ci_count * PROFILE_SCALE.get(PROFILE, 1.0)))


# The test files that run on every Python `make test` tests (the lowest too): what can differ
# between Pythons. The imports and the CLI's parser, the pure core (parsing, attribution, the
# rewrite, memory, power, idle), the golden files that pin the bytes served, the asyncio server
# and its loop, TLS and the web config, ctypes (NVML), gRPC, the kubernetes client, one real
# Prometheus scraping the enricher (test_smoke) and the wheel installed into a clean virtualenv
# (test_wheel_install: the dependencies resolve for this Python). Everything else runs on the
# highest Python only: it judges files or real parts that do not depend on the Python running
# the tests, or the same code paths the files here already run on every Python.
EVERY_PYTHON = frozenset(
    {
        "test_imports.py",
        "test_cli.py",
        "test_attribution.py",
        "test_rewrite.py",
        "test_memory.py",
        "test_power.py",
        "test_idle.py",
        "test_podparse.py",
        "test_procfs.py",
        "test_cgroupmem.py",
        "test_nvmlparse.py",
        "test_families.py",
        "test_promclient.py",
        "test_golden.py",
        "test_allocation_golden.py",
        "test_docker_golden.py",
        "test_loop.py",
        "test_webconfig.py",
        "test_nvml.py",
        "test_podresources.py",
        "test_kube.py",
        "test_hygiene.py",
        "test_smoke.py",
        "test_wheel_install.py",
    }
)


# Files that judge what does not depend on the Python (the rules and the mixin's build, the
# benchmark's smoke runs) and run once, in the lowest Python's suite: `make test` runs the two
# suites side by side, and these minutes balance them (the highest's suite, with the image and
# every Prometheus test, is the longer). Marked ``lowest_only``; `make test-deep` runs them in
# the highest Python's suite.
LOWEST_ONLY = frozenset({"test_bench.py", "test_fleet.py", "test_mixin.py", "test_rules.py"})

# The files that start a Docker Engine: under pytest-xdist they share one worker (one engine,
# one image build).
DOCKER_FILES = frozenset(
    {"test_docker_engine.py", "test_image.py", "test_compose_real.py", "test_release.py"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the files of EVERY_PYTHON ``every_python`` (but their tests that start a
    Prometheus server per release: test_smoke is the lowest Python's); skips ``deep`` tests
    outside the long run."""
    skip = pytest.mark.skip(reason="the long run's (make test-deep)")
    xdist = bool(getattr(config.option, "numprocesses", None))
    for item in items:
        if xdist:  # pytest -n N --dist loadgroup: a file to a worker, the Docker files to one
            name = item.path.name
            item.add_marker(pytest.mark.xdist_group("docker" if name in DOCKER_FILES else name))
        if item.path.name in EVERY_PYTHON and "prom_release" not in getattr(
            item, "fixturenames", ()
        ):
            item.add_marker(pytest.mark.every_python)
        if item.path.name in LOWEST_ONLY:
            item.add_marker(pytest.mark.lowest_only)
        if not DEEP and item.get_closest_marker("deep"):
            item.add_marker(skip)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/*.out from the current output",
    )


@pytest.fixture
def parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The CLI's build_parser() as a clean shell builds it: the defaults read no ENRICHER_*
    variable (the flags reference and the threat model's table are generated from it)."""
    from enricher.cli import build_parser

    for name in list(os.environ):
        if name.startswith("ENRICHER_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    return build_parser()


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
