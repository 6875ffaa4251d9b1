"""A free event loop: large rewrites leave the loop, and SIGTERM ends `serve` within 5 s even
while an NVML call hangs (the fake libnvidia-ml made to block forever)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from devkit.nvmlfake import FakeNvml, FakeNvmlState
from devkit.ports import free_port
from enricher.app import make_app
from enricher.pipeline import REWRITE_INLINE_MAX_CHARS, Scraper
from enricher.procfs import ProcfsSource
from enricher.simnode import fakeproc

from .conftest import ROOT
from .scraping import PER_SCRAPE

SERIES = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",Hostname="h"} '


def _body(chars: int) -> str:
    lines = [f"{SERIES}{i}" for i in range(chars // len(SERIES) + 1)]
    return "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("chars", "off_loop"),
    [
        pytest.param(REWRITE_INLINE_MAX_CHARS * 2, True, id="large-in-the-worker"),
        pytest.param(4096, False, id="small-inline"),
    ],
)
async def test_large_rewrite_leaves_the_loop(tmp_path: Path, chars: int, off_loop: bool) -> None:
    """/healthz is answered while a large body's rewrite is still running (held here until
    /healthz has answered, or 5 s): the rewrite runs in the worker thread, not on the loop.
    A small body is rewritten inline, where a thread hop would cost more than it saves."""
    text = _body(chars)

    async def upstream_metrics(_request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    upstream_app = web.Application()
    upstream_app.router.add_get("/metrics", upstream_metrics)
    fakeproc.write_proc_stat(tmp_path, int(time.time()) - 3600)
    async with TestServer(upstream_app) as upstream:
        config = replace(
            PER_SCRAPE, upstream_url=str(upstream.make_url("/metrics")), nvml_enabled=False
        )
        scraper = Scraper(config, nvml=None, procfs=ProcfsSource(str(tmp_path)), kubernetes=None)
        release = threading.Event()
        threads: list[str] = []
        rewrite = scraper.assembler.rewriter.rewrite

        def held_rewrite(*args: Any) -> Any:
            threads.append(threading.current_thread().name)
            if off_loop:
                release.wait(5.0)  # on the loop, this wait would keep /healthz from answering
            return rewrite(*args)

        scraper.assembler.rewriter.rewrite = held_rewrite  # type: ignore[method-assign]
        async with TestClient(TestServer(make_app(scraper))) as client:
            scrape = asyncio.create_task(client.get("/metrics"))
            while not threads:
                await asyncio.sleep(0.01)
            health = await client.get("/healthz")
            answered_while_held = not release.is_set()
            release.set()
            resp = await scrape
            assert resp.status == 200 and health.status == 200
            assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in await resp.text()
        assert (threads == ["enricher-rewrite"]) == off_loop, threads
        if off_loop:
            assert answered_while_held


@pytest.mark.parametrize(
    ("symbol", "scrape_first"),
    [
        # A read hangs: the source's lock stays taken, so closing NVML would wait for ever.
        pytest.param("nvmlDeviceGetComputeRunningProcesses_v3", False, id="read-hangs"),
        # The reads work; nvmlShutdown itself never returns.
        pytest.param("nvmlShutdown", True, id="shutdown-hangs"),
    ],
)
def test_sigterm_exits_within_5s_while_nvml_hangs(
    tmp_path: Path, fake_nvml: FakeNvml, symbol: str, scrape_first: bool
) -> None:
    """`dcgm-enricher serve` on the fake NVML with one call made to block forever: SIGTERM
    ends it within 5 s, with status 0."""
    state = FakeNvmlState().gpu().process(4242).hang(symbol)
    fake_nvml.write(state)
    proc_root = tmp_path / "proc"
    fakeproc.write_proc_stat(proc_root, int(time.time()) - 3600)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enricher",
            "serve",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--upstream.url=http://127.0.0.1:{free_port()}/metrics",  # nobody listens
            f"--nvml.library={fake_nvml.library}",
            f"--path.procfs={proc_root}",
            "--kubelet.pod-resources-socket=",
            "--docker.host=",
            "--scrape.timeout=60",  # the scrape stays in flight: only shutdown may end it
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    base = f"http://127.0.0.1:{port}"

    def get(path: str, timeout: float) -> None:
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as r:
                r.read()
        except OSError:
            pass

    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not fake_nvml.count("nvmlInitWithFlags"):
            get("/healthz", 1)
            # Serving: a scrape (in its own thread, it may never answer) reads NVML.
            threading.Thread(target=get, args=("/metrics", 70), daemon=True).start()
            time.sleep(0.3)
        # Until a read got through the process lists (or hangs in them).
        listed = "nvmlDeviceGetComputeRunningProcesses_v3"
        while time.monotonic() < deadline and not fake_nvml.count(listed):
            time.sleep(0.1)
        time.sleep(0.2)
        assert fake_nvml.count(listed)
        assert any(c[-1:] == ["hang"] for c in fake_nvml.calls()) != scrape_first
        get("/healthz", 2)  # the loop still answers while the read hangs
    except BaseException:
        proc.kill()
        raise
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"still running 5 s after SIGTERM:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    assert time.monotonic() - sent < 5
    if scrape_first:
        assert any(c[:1] == ["nvmlShutdown"] and c[-1:] == ["hang"] for c in fake_nvml.calls())
    assert "nvml: shutdown did not finish" in out
