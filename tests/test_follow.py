"""The default scrape mode through the real app: dcgm-exporter followed (fetched right after
each of its collections, found by polling every --upstream.follow-step) and the node side
(NVML, procfs) read with each collection, so a scrape waits for neither.

Real parts: the aiohttp app and client, an HTTP stand-in for dcgm-exporter that collects when
the test says so (the same body in between, as dcgm-exporter serves it), pynvml on the fake
libnvidia-ml, a /proc tree on disk. The scraper's clock is a fake one the test moves, so which
results are fresh enough is decided by the test, not by how fast this machine is; the
follower's polling runs on real time (a 20 ms step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from devkit.clocks import Clock
from devkit.nvmlfake import FakeNvml, FakeNvmlState
from enricher.app import make_app
from enricher.config import Config
from enricher.pipeline import Scraper
from enricher.procfs import ProcfsSource
from enricher.simnode import fakeproc
from tests.harness import series

GIB = 1 << 30
STEP = 0.02
WAIT = 10.0


@dataclass
class Exporter:
    """dcgm-exporter as the enricher sees it: a body that changes only when it collects."""

    collection: int = 1
    down: bool = False
    requests: int = 0

    def body(self) -> str:
        return (
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-0",Hostname="exporter"}} {self.collection}\n'
        )

    async def handle(self, _request: web.Request) -> web.Response:
        self.requests += 1
        if self.down:
            return web.Response(status=503, text="collecting failed")
        return web.Response(text=self.body(), content_type="text/plain")


@dataclass
class Env:
    exporter: Exporter
    nvml: FakeNvml
    clock: Clock
    scraper: Scraper
    client: TestClient[Any, Any]

    async def scrape(self) -> dict[str, float]:
        resp = await self.client.get("/metrics")
        assert resp.status == 200
        return values(await resp.text())

    def gpu_memory(self, gib: int) -> None:
        self.nvml.write(FakeNvmlState().gpu(uuid="GPU-0").process(4242, memory=gib * GIB))


def values(text: str) -> dict[str, float]:
    """The samples this test looks at: the upstream's value, the unattributed memory (the
    process is on no pod: there is no pod watch) and whether the upstream answered."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "DCGM_FI_DEV_GPU_UTIL":
                out["upstream"] = s.value
            elif s.name == "gpu_unattributed_memory_used_bytes":
                out["memory"] = out.get("memory", 0.0) + s.value
            elif s.name == "dcgm_enricher_source_up" and s.labels["source"] == "upstream":
                out["upstream_up"] = s.value
    return out


async def eventually(env: Env, ok: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    deadline = time.monotonic() + WAIT
    while True:
        got = await env.scrape()
        if ok(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {WAIT} s: {got}")
        await asyncio.sleep(STEP)


@pytest.fixture
async def env(tmp_path: Path, fake_nvml: FakeNvml) -> AsyncIterator[Env]:
    exporter = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", exporter.handle)
    upstream = TestServer(app)
    await upstream.start_server()
    proc = tmp_path / "proc"
    fakeproc.write_proc_stat(proc, 1_700_000_000)
    fakeproc.write_process(
        proc, 4242, comm="train", cgroup=fakeproc.cgroup_host(), start_ticks=1000
    )
    clock = Clock()
    config = replace(
        Config(),  # the defaults: following, node side aligned with the collections
        upstream_url=f"http://127.0.0.1:{upstream.port}/metrics",
        upstream_follow_step=STEP,
        kube_enabled=False,
    )
    scraper = Scraper(
        config,
        nvml=fake_nvml.source(),
        procfs=ProcfsSource(str(proc)),
        kubernetes=None,
        clock=clock,
    )
    client = TestClient(TestServer(make_app(scraper)))
    await client.start_server()
    e = Env(exporter, fake_nvml, clock, scraper, client)
    e.gpu_memory(1)
    yield e
    await client.close()
    await upstream.close()


def test_following_is_the_default() -> None:
    config = Config()
    assert config.upstream_follow_step == 0.1
    assert config.collect_interval == 0  # the node side is read with each collection


async def test_following_starts_with_the_app(env: Env) -> None:
    """The first scrape finds the collection already fetched and prepared."""
    deadline = time.monotonic() + WAIT
    while env.exporter.requests == 0:
        assert time.monotonic() < deadline, "the follower did not start with the app"
        await asyncio.sleep(STEP)
    assert env.scraper.counters.scrapes == 0


async def test_node_side_is_read_with_each_upstream_collection(env: Env) -> None:
    assert await env.scrape() == {"upstream": 1, "memory": 1 * GIB, "upstream_up": 1}

    # NVML changes, dcgm-exporter has not collected again, and the clock has not moved: the
    # scrape serves the collection as it was, both sides of it, without reading anything.
    env.gpu_memory(2)
    requests = env.exporter.requests
    assert await env.scrape() == {"upstream": 1, "memory": 1 * GIB, "upstream_up": 1}

    # dcgm-exporter collects: the follower sees it within a step, reads the node side and
    # prepares the scrape; no scrape ever mixes a new collection with an old node side.
    env.exporter.collection = 2
    got = await eventually(env, lambda v: v["upstream"] == 2)
    assert got == {"upstream": 2, "memory": 2 * GIB, "upstream_up": 1}
    assert env.exporter.requests > requests  # fetched by the follower, not by the scrapes


async def test_node_side_too_old_is_read_by_the_scrape(env: Env) -> None:
    """Without a new collection (dcgm-exporter stuck, or its values unchanged) a scrape reads
    the node side itself once the last read is older than the bound (before the rhythm is
    learnt: the follower's coarse poll, 1 s)."""
    await env.scrape()
    env.gpu_memory(3)
    env.clock.now += 1.5
    assert (await env.scrape())["memory"] == 3 * GIB


async def test_upstream_failure_is_never_served_from_the_cache(env: Env) -> None:
    await env.scrape()
    env.exporter.down = True
    env.exporter.collection = 2  # a failed answer is new content too: the follower sees it
    assert (await eventually(env, lambda v: v["upstream_up"] == 0)).get("upstream") is None
    # While it is down every scrape asks again, so the first scrape after it recovers has it.
    env.exporter.down = False
    requests = env.exporter.requests
    assert await env.scrape() == {"upstream": 2, "memory": 1 * GIB, "upstream_up": 1}
    assert env.exporter.requests > requests


async def test_polls_of_an_unchanged_body_do_not_read_the_process_figures_again(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """process_* and python_* are read with a collection (docs/metrics.md): a poll that finds
    dcgm-exporter's body unchanged brings new upstream figures, but not a new collection, so
    the scrapes after it serve the process figures read with the collection."""
    await env.scrape()
    runtime = env.scraper.self_metrics.runtime
    reads: list[bytes] = []
    render = runtime.render

    def counted() -> bytes:
        reads.append(render())
        return reads[-1]

    monkeypatch.setattr(runtime, "render", counted)
    polls = env.exporter.requests
    deadline = time.monotonic() + WAIT
    while env.exporter.requests < polls + 3:
        assert time.monotonic() < deadline, "the follower stopped polling"
        await asyncio.sleep(STEP)
    head = env.scraper.assembler.newest
    await env.scrape()
    await env.scrape()
    assert env.scraper.assembler.newest is head
    assert reads == []
    # A new collection: read again, with it.
    env.exporter.collection = 2
    await eventually(env, lambda v: v["upstream"] == 2)
    assert len(reads) >= 1


async def test_a_new_collection_turns_the_label_memo(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Scraper's label memo (promclient.LabelSets) follows the series in use by one turn
    per collection: a poll that finds the body unchanged, or a scrape, turns nothing; a new
    collection turns it, before its families are written."""
    await env.scrape()
    turns: list[object] = []
    memo = env.scraper.assembler.label_sets
    monkeypatch.setattr(memo, "turn", lambda: turns.append(env.scraper.assembler.newest))
    polls = env.exporter.requests
    deadline = time.monotonic() + WAIT
    while env.exporter.requests < polls + 3:
        assert time.monotonic() < deadline, "the follower stopped polling"
        await asyncio.sleep(STEP)
    await env.scrape()
    assert turns == []
    head = env.scraper.assembler.newest
    env.exporter.collection = 2
    await eventually(env, lambda v: v["upstream"] == 2)
    assert turns[:1] == [head]  # turned while the body before was still the newest


async def test_an_unchanged_body_is_kept_once(env: Env) -> None:
    """Between two collections dcgm-exporter serves the same body: each poll's copy is dropped
    for the one already prepared, so the enricher keeps one copy of it, and a scrape finds the
    prepared collection body (the upstream's body is not rewritten again)."""
    await env.scrape()
    head = env.scraper.assembler.newest
    assert head is not None
    polls = env.exporter.requests
    deadline = time.monotonic() + WAIT
    while env.exporter.requests < polls + 3:  # the follower polls every step while learning
        assert time.monotonic() < deadline, "the follower stopped polling"
        await asyncio.sleep(STEP)
    follower = env.scraper.schedule.follower
    assert follower is not None
    latest, _started = await follower.latest()
    assert latest.value is head.text
    repeated = env.scraper.assembler.rewriter.repeated_rewrites
    (power_stage,) = [s for s in env.scraper.assembler.stages if s.name == "power"]
    power = power_stage.accounted  # type: ignore[attr-defined]  # the prepared head's split
    assert await env.scrape() == {"upstream": 1, "memory": 1 * GIB, "upstream_up": 1}
    assert env.scraper.assembler.newest is head
    assert env.scraper.assembler.rewriter.repeated_rewrites == repeated
    assert power_stage.accounted is power  # type: ignore[attr-defined]

    # A new collection is a new body: prepared anew, and kept from then on.
    env.exporter.collection = 2
    await eventually(env, lambda v: v["upstream"] == 2)
    assert env.scraper.assembler.newest is not head
    assert (await follower.latest())[0].value is env.scraper.assembler.newest.text


def _counter(text: str, name: str) -> float:
    (sample,) = series(text, name)
    return float(sample["__value__"])


async def test_collections_are_counted_once_each_beside_the_requests(env: Env) -> None:
    """dcgm_enricher_upstream_collections_total counts the upstream bodies that differed from
    the one before, however many polls and scrapes saw each; with
    dcgm_enricher_upstream_requests_total it gives the upstream's load per collection on a
    live node (docs/performance.md)."""
    await env.scrape()
    for collection in (2, 3):
        polls = env.exporter.requests
        deadline = time.monotonic() + WAIT
        while env.exporter.requests < polls + 3:  # polls that find the body unchanged
            assert time.monotonic() < deadline, "the follower stopped polling"
            await asyncio.sleep(STEP)
        await env.scrape()
        env.exporter.collection = collection
        await eventually(env, lambda v, c=collection: v["upstream"] == c)
    env.exporter.down = True  # a failed answer is no collection
    await eventually(env, lambda v: v["upstream_up"] == 0)
    resp = await env.client.get("/metrics")
    text = await resp.text()
    assert _counter(text, "dcgm_enricher_upstream_collections_total") == 3
    requests = _counter(text, "dcgm_enricher_upstream_requests_total")
    assert requests > 3 * 3  # the unchanged polls were requests, not collections
    assert requests <= env.exporter.requests
