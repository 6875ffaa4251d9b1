"""GPU Operator mode: the upstream is found through the pod watch, not configured.

The enricher runs as its own DaemonSet beside the operator's nvidia-dcgm-exporter pods; the
pod watch of its node (the real kubernetes client against the API-server stand-in, no cluster
here) names the exporter pod, and the enricher scrapes that pod's IP with the port and path of
--upstream.url. Here the "pod IP" is 127.0.0.1, where a real HTTP server plays the exporter
(the full stack of tests/harness.py, without NVML or /proc: only the upstream matters).
"""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from enricher.kube import parse_selector
from tests.scraping import NoProcs

from .harness import MakeStack
from .kubeapi import make_pod

NODE = "gpu-node-a"
EXPORTED = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 42\n'


def _values(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[s.labels.get("source", s.labels.get("UUID", ""))] = float(s.value)
    return out


async def test_scrapes_the_exporter_pod_on_this_node(full_stack: MakeStack) -> None:
    selector = "app=nvidia-dcgm-exporter"
    node = await full_stack(
        upstream=EXPORTED,
        gpu=None,
        procs=NoProcs(),
        node=NODE,
        # An exporter pod on another node, and an unrelated pod here: neither may be used.
        pods=[
            make_pod(
                "nvidia-dcgm-exporter-b",
                "gpu-operator",
                node="gpu-node-b",
                labels={"app": "nvidia-dcgm-exporter"},
                pod_ip="10.9.9.9",
            ),
            make_pod("web-0", "default", node=NODE, labels={"app": "web"}, pod_ip="10.8.8.8"),
        ],
        kube={"upstream_selector": parse_selector(selector)},
        upstream_discover_pod=True,
        upstream_pod_selector=selector,
        upstream_timeout=1.0,
    )
    api, cache, client = node.api, node.cache, node.client
    assert api is not None and cache is not None
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
