"""GPU Operator mode: the upstream is found through the pod watch, not configured.

The enricher runs as its own DaemonSet beside the operator's nvidia-dcgm-exporter pods; the
pod watch of its node (the real kubernetes client against the API-server stand-in, no cluster
here) names the exporter pod, and the enricher scrapes that pod's IP with the port and path of
--upstream.url. Here the "pod IP" is 127.0.0.1, where a real HTTP server plays the exporter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from enricher.app import Scraper, make_app
from enricher.kube import PodCache, parse_selector
from tests.scraping import PER_SCRAPE

from .kubeapi import KubeApiStandIn, make_api_client, make_pod

NODE = "gpu-node-a"
EXPORTED = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 42\n'


class NoProcs:
    errors_total = 0

    def read_many(self, pids: Any, listed_at: float | None = None) -> dict[Any, Any]:
        return {}


@pytest.fixture
def api() -> Iterator[KubeApiStandIn]:
    with KubeApiStandIn() as stand_in:
        yield stand_in


def _values(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[s.labels.get("source", s.labels.get("UUID", ""))] = float(s.value)
    return out


async def test_scrapes_the_exporter_pod_on_this_node(api: KubeApiStandIn) -> None:
    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(text=EXPORTED, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = TestServer(app)
    await exporter.start_server()
    selector = "app=nvidia-dcgm-exporter"
    # An exporter pod on another node, and an unrelated pod here: neither may be used.
    api.add_pod(
        make_pod(
            "nvidia-dcgm-exporter-b",
            "gpu-operator",
            node="gpu-node-b",
            labels={"app": "nvidia-dcgm-exporter"},
            pod_ip="10.9.9.9",
        )
    )
    api.add_pod(make_pod("web-0", "default", node=NODE, labels={"app": "web"}, pod_ip="10.8.8.8"))
    cache = PodCache(
        make_api_client(api.url),
        NODE,
        upstream_selector=parse_selector(selector),
        watch_timeout_seconds=5,
        backoff_max_seconds=0.2,
    )
    cache.start()
    cfg = replace(
        PER_SCRAPE,
        upstream_url=f"http://127.0.0.1:{exporter.port}/metrics",
        upstream_discover_pod=True,
        upstream_pod_selector=selector,
        kube_node_name=NODE,
        upstream_timeout=1.0,
    )
    client = TestClient(TestServer(make_app(Scraper(cfg, gpu=None, procs=NoProcs(), pods=cache))))
    await client.start_server()
    try:
        assert cache.synced.wait(10)
        text = await (await client.get("/metrics")).text()
        # No exporter pod on this node yet: the upstream is down, and says why in the log.
        assert _values(text, "dcgm_enricher_source_up")["upstream"] == 0
        assert "DCGM_FI_DEV_GPU_UTIL" not in text

        api.add_pod(
            make_pod(
                "nvidia-dcgm-exporter-a",
                "gpu-operator",
                node=NODE,
                labels={"app": "nvidia-dcgm-exporter"},
                pod_ip="127.0.0.1",
            )
        )
        for _ in range(100):
            if cache.upstream_pods():
                break
            await asyncio.sleep(0.05)
        text = await (await client.get("/metrics")).text()
        assert _values(text, "dcgm_enricher_source_up")["upstream"] == 1
        assert _values(text, "DCGM_FI_DEV_GPU_UTIL") == {"GPU-x": 42}
    finally:
        await client.close()
        await exporter.close()
        cache.stop()
