"""The one source interface (enricher.sources): every source implements it, one wrapper reports
on any of them, one close path closes them all."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from enricher.demo import DEMO
from enricher.docker import DockerSource
from enricher.kube import PodCache
from enricher.nvml import NvmlSource
from enricher.pipeline import Scraper
from enricher.podresources import PodResourcesSource
from enricher.procfs import ProcReader
from enricher.simnode.api import StaticPods
from enricher.simnode.gpus import SimulatedGpus
from enricher.sources import Measured, Reading, Source, close_all
from enricher.upstream import UpstreamSource
from enricher.worker import Worker
from tests.scraping import PER_SCRAPE, NoProcs

SERIES = (
    "dcgm_enricher_source_up",
    "dcgm_enricher_source_enabled",
    "dcgm_enricher_source_duration_seconds",
    "dcgm_enricher_source_errors_total",
)

SOURCES: list[Any] = [
    pytest.param(
        "upstream",
        lambda _: UpstreamSource(lambda: None, timeout=1.0, max_bytes=1024),
        id="upstream",
    ),
    pytest.param("nvml", lambda _: NvmlSource(library_path="/nonexistent"), id="nvml"),
    pytest.param("procfs", lambda tmp: ProcReader(str(tmp)), id="procfs"),
    pytest.param(
        "kubernetes",
        lambda _: PodCache(kubernetes.client.ApiClient(), "node-a"),
        id="kubernetes",
    ),
    pytest.param("podresources", lambda _: PodResourcesSource(""), id="podresources"),
    pytest.param("docker", lambda _: DockerSource(""), id="docker"),
    pytest.param("nvml", lambda _: SimulatedGpus(DEMO), id="demo-gpus"),
    pytest.param("kubernetes", lambda _: StaticPods([]), id="demo-pods"),
]


@pytest.mark.parametrize(("name", "make"), SOURCES)
def test_every_source_implements_the_interface(
    name: str, make: Callable[[Path], Any], tmp_path: Path
) -> None:
    """Each source is a Source, named by its ``source`` label value (a contract)."""
    source = make(tmp_path)
    assert isinstance(source, Source)
    assert source.name == name
    assert isinstance(source.enabled, bool)
    assert source.errors_total == 0


class Fake:
    """A seventh source: only what the interface asks for."""

    enabled = True

    def __init__(
        self, name: str, read: Callable[[], Reading[Any]], close: Callable[[], None] = lambda: None
    ) -> None:
        self.name = name
        self.errors_total = 0
        self.closed = 0
        self._read = read
        self._close = close

    def read(self) -> Reading[Any]:
        return self._read()

    def close(self) -> None:
        self.closed += 1
        self._close()


def _series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('source="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def _boom() -> Reading[Any]:
    raise RuntimeError("boom")


async def test_a_new_source_is_reported_without_scraper_code() -> None:
    """Sources handed to the Scraper get the four series, whatever their read did."""
    ok = Fake("gpfs", lambda: Reading(42))
    down = Fake("lustre", lambda: Reading(None, ok=False, error="unmounted"))
    broken = Fake("infiniband", _boom)
    config = replace(PER_SCRAPE, upstream_url="http://127.0.0.1:9/metrics", upstream_timeout=0.5)
    scraper = Scraper(config, gpu=None, procs=NoProcs(), pods=None, sources=[ok, down, broken])
    try:
        text = (await scraper.scrape()).body.decode()
    finally:
        await scraper.close()
    builtin = {
        *("upstream", "nvml", "procfs", "kubernetes", "podresources", "resourceslices", "docker")
    }
    added = {"gpfs", "lustre", "infiniband"}
    assert set(_series(text, "dcgm_enricher_source_enabled")) == builtin | added
    for name in (
        SERIES[0],
        *SERIES[2:],
    ):  # a source that is off (None here) has only its enabled series
        assert set(_series(text, name)) == {"upstream", "procfs"} | added, name
    assert _series(text, "dcgm_enricher_source_up") == {
        "upstream": 0.0,
        "procfs": 1.0,
        "gpfs": 1.0,
        "lustre": 0.0,
        "infiniband": 0.0,
    }
    errors = _series(text, "dcgm_enricher_source_errors_total")
    assert (errors["gpfs"], errors["lustre"], errors["infiniband"]) == (0, 0, 1)
    assert ok.closed == down.closed == broken.closed == 1


async def test_a_hung_blocking_read_is_bounded_and_counted() -> None:
    """A read past its timeout reports down and counts an error; the next one, while the first
    still hangs, is refused (busy) instead of queued, and counted too."""
    release = threading.Event()
    source = Fake("slow", lambda: Reading(release.wait(10)))
    worker = Worker("test-slow")
    measured = Measured(source, worker=worker, timeout=0.1)
    try:
        first = await measured.read(default=None)
        second = await measured.read(default=None)
    finally:
        release.set()
        worker.close()
    assert not first.status.up and first.status.errors_total == 1
    assert first.status.duration_seconds < 1.0
    assert not second.status.up and second.status.errors_total == 2


class AsyncHang:
    name = "hangs-async"
    enabled = True
    errors_total = 0

    def __init__(self) -> None:
        self.closed = 0

    async def read(self) -> Reading[None]:
        return Reading(None)

    async def close(self) -> None:
        self.closed += 1
        await asyncio.sleep(60)


async def test_close_all_closes_each_source_once_and_bounds_a_hung_one() -> None:
    """One close per source; a blocking close that hangs (NVML waiting on a wedged call) and
    an async one that hangs are each cut at the timeout, and the others still close."""
    release = threading.Event()
    hung = Fake("hangs", lambda: Reading(None), close=lambda: release.wait(10) and None)
    async_hung = AsyncHang()
    plain = [Fake(f"fine-{i}", lambda: Reading(None)) for i in range(3)]
    started = time.monotonic()
    try:
        done = await close_all([hung, async_hung, *plain], timeout=0.2)
    finally:
        release.set()
    assert time.monotonic() - started < 1.5
    assert done is False
    assert hung.closed == async_hung.closed == 1
    assert [s.closed for s in plain] == [1, 1, 1]


async def test_scraper_close_closes_every_source_once(tmp_path: Path) -> None:
    """Scraper.close is the one close path: every source it was given, once, hung or not."""
    release = threading.Event()
    gpu = Fake("nvml", lambda: Reading(None), close=lambda: release.wait(10) and None)
    procs = Fake("procfs", lambda: Reading({}))
    extra = Fake("gpfs", lambda: Reading(None))
    scraper = Scraper(PER_SCRAPE, gpu=gpu, procs=procs, pods=None, sources=[extra])
    started = time.monotonic()
    try:
        await scraper.close()
    finally:
        release.set()
    assert time.monotonic() - started < 3.0
    assert (gpu.closed, procs.closed, extra.closed) == (1, 1, 1)


def test_docs_list_every_source() -> None:
    """docs/sources.md has a row for each source the table above checks."""
    text = (Path(__file__).parent.parent / "docs" / "sources.md").read_text()
    for param in SOURCES:
        if not param.id.startswith("demo-"):
            assert f"| `{param.values[0]}` |" in text, param.id
