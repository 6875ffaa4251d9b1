"""The demo's real enricher over its SIMULATED node with the clock stopped, in a thread.

The simulated dcgm-exporter and NVML then report the same moment on every request, so a real
Prometheus that scrapes it holds values a test can compare exactly (to the simulated node's
truth, or between two Prometheus servers that scraped it at different instants). The enricher
is served from a thread of its own, so the test can block on Prometheus meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enricher import demo
from enricher.config import Config
from enricher.simnode.dialects import NEWEST

T0 = 1_800_000_000.0  # the stopped clock: the start of one of the simulated collections


class FrozenDemo:
    """``FrozenDemo(tmp)`` serves on 127.0.0.1:``port`` until ``close()``; ``clock``: the
    simulated node's time instead of the stopped T0 (a test that moves it)."""

    def __init__(
        self,
        tmp: Path,
        clock: Callable[[], float] = lambda: T0,
        *,
        exporter_version: str = NEWEST,
        virtual_gpus: bool = False,
    ) -> None:
        """``exporter_version``, ``virtual_gpus``: the simulated dcgm-exporter's dialect."""
        self.clock = clock
        self.exporter_version = exporter_version
        self.virtual_gpus = virtual_gpus
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tmp = tmp
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> int:
        socket_path = self.tmp / "pod-resources" / "kubelet.sock"
        socket_path.parent.mkdir(parents=True)
        _scraper, self.runners, self.kubelet = await demo.start_demo(
            Config(listen_address="127.0.0.1:0"),
            self.tmp / "proc",
            socket_path,
            clock=self.clock,
            exporter_version=self.exporter_version,
            virtual_gpus=self.virtual_gpus,
        )
        return int(self.runners[0].addresses[0][1])

    async def _stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
        self.kubelet.stop()

    def scrape_job(self) -> dict[str, Any]:
        """Prometheus's job for this enricher as every install path here writes it: job
        dcgm-enricher, honor_labels, and the enricher pod's own labels as the Prometheus
        Operator gives every target (which honor_labels keeps off the workload's)."""
        return {
            "job_name": "dcgm-enricher",
            "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}],
            "relabel_configs": [
                {"target_label": "pod", "replacement": "dcgm-enricher-x7k2p"},
                {"target_label": "namespace", "replacement": "gpu-monitoring"},
                {"target_label": "node", "replacement": "demo-gpu-node-1"},
            ],
        }

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
