"""The smoke test: the real enricher scraped by a real Prometheus, on the Python running the tests.

`dcgm-enricher demo` (the real enricher over the simulated GPU node: no GPU, no cluster here),
started with this interpreter, and the newest Prometheus release scraping it every second with
the shipped rules loaded, as every install does. Its target must be up, the enricher's series
queryable with their workload labels, and a recording rule computed from them. `make check`
runs it between edits; `make test` runs it on the lowest Python as well as the highest (the
end-to-end claim of the whole product, where the Python can differ). tests/test_dashboard.py
holds every panel, record and alert to account, on both releases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.ports import free_port
from devkit.processes import stop_process
from devkit.prometheus import EVERY_SECOND

from .promreleases import Server, releases, require, serve

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
DEADLINE_SECONDS = 60


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """The demo's address, once it serves /metrics."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "enricher", "demo", "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                assert proc.stderr is not None
                pytest.fail("the demo did not serve /metrics:\n" + proc.stderr.read().decode())
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


def poll(server: Server, promql: str) -> list[dict[str, object]]:
    """The query's result once it has series, or its last (empty) result at the deadline."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        result = server.query(promql)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def test_prometheus_scrapes_the_enricher_and_runs_the_rules(
    demo: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    release = require(releases()[-1])
    config = {
        "global": EVERY_SECOND,
        "scrape_configs": [
            {
                "job_name": "dcgm-enricher",
                "honor_labels": True,
                "static_configs": [{"targets": [demo]}],
            }
        ],
        "rule_files": [str(RULES)],
    }
    with serve(release, config, tmp_path_factory.mktemp("smoke")) as server:
        up = poll(server, 'up{job="dcgm-enricher"} == 1')
        assert up, "Prometheus did not scrape the demo:\n" + server.log_tail()
        memory = poll(server, 'gpu_container_memory_used_bytes{pod="jupyter-alice"}')
        assert memory, "no per-container memory for the demo's notebook"
        assert {s["metric"]["namespace"] for s in memory} == {"jupyterhub"}  # type: ignore[index]
        record = poll(server, "namespace_pod_device:gpu_container_memory_used_bytes:sum")
        assert record, "the shipped rules computed no record from the enricher's series"
        # The enricher's own alerts (a source down, the target absent) are quiet once the
        # alert rules have seen a scrape (before it, GpuEnricherAbsent is pending).
        own = 'ALERTS{alertname=~"GpuEnricher.*"}'
        deadline = time.monotonic() + DEADLINE_SECONDS
        while server.query(own) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.query(own) == []
