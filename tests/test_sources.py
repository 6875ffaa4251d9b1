"""The one source interface (enricher.sources): every source implements it, one wrapper reports
on any of them, one close path closes them all."""

from __future__ import annotations

import asyncio
import re
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from enricher import sourcetable
from enricher.demo import DEMO
from enricher.docker import DockerSource
from enricher.kube import KubernetesSource
from enricher.model import GpuSnapshot
from enricher.nvml import NvmlSource
from enricher.pipeline import Scraper
from enricher.podresources import PodResourcesSource
from enricher.procfs import ProcfsSource
from enricher.simnode.api import StaticPods
from enricher.simnode.gpus import SimulatedGpus
from enricher.sources import MeasuredSource, ReadResult, Source, close_all
from enricher.sourcetable import SOURCES as SOURCE_TABLE
from enricher.sourcetable import SourceEntry
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
    pytest.param("procfs", lambda tmp: ProcfsSource(str(tmp)), id="procfs"),
    pytest.param(
        "kubernetes",
        lambda _: KubernetesSource(kubernetes.client.ApiClient(), "node-a"),
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
        self,
        name: str,
        read: Callable[..., ReadResult[Any]],
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.errors_total = 0
        self.closed = 0
        self._read = read
        self._close = close

    def read(self, *args: Any) -> ReadResult[Any]:
        return self._read(*args)

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


def with_entries(*sources: Source) -> tuple[SourceEntry, ...]:
    """The table with one entry more per source: read in a worker of its own, within
    --scrape.timeout, its value used by nothing."""
    return (
        *SOURCE_TABLE,
        *(
            SourceEntry(s.name, worker=s.name, timeout=lambda c, _spent: c.scrape_timeout)
            for s in sources
        ),
    )


def _boom() -> ReadResult[Any]:
    raise RuntimeError("boom")


async def test_a_new_source_is_reported_without_scraper_code() -> None:
    """Sources added to the table get the four series, whatever their read did."""
    ok = Fake("gpfs", lambda: ReadResult(42))
    down = Fake("lustre", lambda: ReadResult(None, ok=False, error="unmounted"))
    broken = Fake("infiniband", _boom)
    config = replace(PER_SCRAPE, upstream_url="http://127.0.0.1:9/metrics", upstream_timeout=0.5)
    scraper = Scraper(
        config,
        table=with_entries(ok, down, broken),
        nvml=None,
        procfs=NoProcs(),
        kubernetes=None,
        **{s.name: s for s in (ok, down, broken)},
    )
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
    source = Fake("slow", lambda: ReadResult(release.wait(10)))
    worker = Worker("test-slow")
    measured = MeasuredSource(source, worker=worker, timeout=0.1)
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

    async def read(self) -> ReadResult[None]:
        return ReadResult(None)

    async def close(self) -> None:
        self.closed += 1
        await asyncio.sleep(60)


async def test_close_all_closes_each_source_once_and_bounds_a_hung_one() -> None:
    """One close per source; a blocking close that hangs (NVML waiting on a wedged call) and
    an async one that hangs are each cut at the timeout, and the others still close."""
    release = threading.Event()
    hung = Fake("hangs", lambda: ReadResult(None), close=lambda: release.wait(10) and None)
    async_hung = AsyncHang()
    plain = [Fake(f"fine-{i}", lambda: ReadResult(None)) for i in range(3)]
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
    gpu = Fake("nvml", lambda: ReadResult(None), close=lambda: release.wait(10) and None)
    procs = Fake("procfs", lambda: ReadResult({}))
    extra = Fake("gpfs", lambda: ReadResult(None))
    scraper = Scraper(
        PER_SCRAPE, table=with_entries(extra), nvml=gpu, procfs=procs, kubernetes=None, gpfs=extra
    )
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


# --------------------------------------------------------------------------- the table

DOCS = Path(__file__).parent.parent / "docs"


def test_the_docs_table_is_the_source_table() -> None:
    """docs/sources.md lists the sources of enricher.sourcetable.SOURCES, in its order (the
    order of the series)."""
    rows = re.findall(r"^\| `(\w+)` \| `enricher/", (DOCS / "sources.md").read_text(), re.M)
    assert rows == [entry.name for entry in SOURCE_TABLE]


def _worked_example() -> tuple[str, str]:
    """docs/sources.md's worked example: the module's code and the entry's."""
    text = (DOCS / "sources.md").read_text().split("## Adding a source", 1)[1]
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)^ *```", text, re.S | re.M)]
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


async def test_the_worked_example_adds_a_source_through_one_entry(tmp_path: Path) -> None:
    """The module and the one entry of docs/sources.md, added to the table as written there:
    serve's maker makes the source, the node side reads it (its value under its name) and
    /metrics reports it with the four series, up while its file reads and down after."""
    module_code, entry_code = _worked_example()
    module: dict[str, Any] = {"__name__": "enricher.loadavg", "__package__": "enricher"}
    exec(compile(module_code, "enricher/loadavg.py", "exec"), module)
    entry = eval(
        compile(entry_code, "enricher/sourcetable.py", "eval"), {**module, **vars(sourcetable)}
    )
    assert isinstance(entry, SourceEntry) and entry.name == "loadavg"
    (tmp_path / "loadavg").write_text("0.50 0.25 0.10 1/123 4567\n")
    config = replace(
        PER_SCRAPE,
        upstream_url="http://127.0.0.1:9/metrics",
        upstream_timeout=0.5,
        nvml_enabled=False,
        procfs=str(tmp_path),
        kube_enabled=False,
        kubelet_enabled=False,
    )
    table = (*SOURCE_TABLE, entry)
    made = sourcetable.make_sources(config, table)
    assert type(made["loadavg"]).__name__ == "LoadavgSource"
    scraper = Scraper(config, table=table, **made)
    try:
        read = await scraper.node.read_sources()
        assert read["loadavg"].value == (0.5, 0.25, 0.1)
        assert [s.name for s in (await scraper.node.read()).statuses][-1] == "loadavg"
        text = (await scraper.scrape()).body.decode()
        assert _series(text, "dcgm_enricher_source_up")["loadavg"] == 1.0
        assert _series(text, "dcgm_enricher_source_enabled")["loadavg"] == 1.0
        assert "loadavg" in _series(text, "dcgm_enricher_source_duration_seconds")
        (tmp_path / "loadavg").unlink()
        text = (await scraper.scrape()).body.decode()
        assert _series(text, "dcgm_enricher_source_up")["loadavg"] == 0.0
        assert _series(text, "dcgm_enricher_source_errors_total")["loadavg"] == 1.0
    finally:
        await scraper.close()


async def test_an_entry_orders_the_reads_and_hands_over_the_values(tmp_path: Path) -> None:
    """A source that needs another is read after it, with its value; one the table leaves
    out of the keywords is off; a name the table does not have is refused."""
    seen: list[Any] = []
    gpu = Fake("nvml", lambda: ReadResult(GpuSnapshot(taken_at=1.0)))

    def count(snapshot: GpuSnapshot) -> ReadResult[int]:
        seen.append(snapshot)
        return ReadResult(len(snapshot.processes))

    counter = Fake("gpucount", count)
    entry = SourceEntry(
        "gpucount",
        needs=("nvml",),
        args=lambda values: (values["nvml"],),
        worker="gpucount",
    )
    scraper = Scraper(PER_SCRAPE, table=(*SOURCE_TABLE, entry), nvml=gpu, gpucount=counter)
    try:
        outcomes = await scraper.node.read_sources()
        assert outcomes["gpucount"].value == 0 and seen == [GpuSnapshot(taken_at=1.0)]
        assert outcomes["procfs"].status.enabled is False  # not given: off
    finally:
        await scraper.close()
    with pytest.raises(ValueError, match="gpfs"):
        Scraper(PER_SCRAPE, gpfs=counter)


@pytest.mark.parametrize(
    ("table", "error"),
    [
        pytest.param((SourceEntry("a"), SourceEntry("a")), "twice", id="twice"),
        pytest.param((SourceEntry("a", needs=("b",)),), "not in the table", id="unknown"),
        pytest.param(
            (SourceEntry("a", after=("b",)), SourceEntry("b", needs=("a",))),
            "circle",
            id="circle",
        ),
    ],
)
def test_a_broken_table_is_refused(table: tuple[SourceEntry, ...], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        sourcetable.check_table(table)
