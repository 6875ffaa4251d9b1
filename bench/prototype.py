"""The scrape pipeline with the node side refreshed in the background (the proposed app.py).

Until app.py has the change, the benchmark measures it through this subclass. It is the code
proposed for ``enricher.app.Scraper``: ``_scrape_once`` split in two, the node side (NVML,
procfs, the kubelet, attribution, the plan) in ``_node_side``, run by an
:class:`enricher.refresh.Refresher` every ``collect_interval`` seconds (or on every scrape when
it is 0, as before), and our families rendered once per node view and device identities.
With ``follow_step`` > 0 the upstream is not fetched by scrapes either: an
:class:`enricher.refresh.Follower` fetches it right after each of its collections and
rewrites it at once, so a scrape finds everything ready. Everything else is app.py's code.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from enricher import __version__
from enricher.app import Scraper, ScrapeResult
from enricher.enrich import (
    AllocatedDevice,
    Attribution,
    RenderOptions,
    attribute,
    fallback_identity,
    plan_devices,
    render_families,
    render_self_metrics,
    resolve_allocations,
)
from enricher.exposition import DeviceKey, RewritePlan
from enricher.model import GpuSnapshot, PodIndex, SourceStatus
from enricher.podresources import ListResult
from enricher.refresh import Follower, Refresher


@dataclass(frozen=True, slots=True)
class NodeView:
    """One read of the node: what the GPUs run and who owns it."""

    snapshot: GpuSnapshot
    nvml_ok: bool
    nvml_duration: float
    procfs_ok: bool
    procfs_duration: float
    listed: ListResult
    kubelet_duration: float
    docker_duration: float
    index: PodIndex
    attributions: list[Attribution]
    kube_duration: float
    allocated: list[AllocatedDevice]
    unmapped: int
    plan: RewritePlan
    fallback: dict[DeviceKey, tuple[tuple[str, str], ...]]  # device labels from NVML


class RefreshingScraper(Scraper):
    def __init__(
        self,
        *args: Any,
        collect_interval: float = 0.0,
        follow_step: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._node = (
            Refresher(self._node_side, collect_interval, name="node")
            if collect_interval > 0
            else None
        )
        self._follower = (
            Follower(
                self._fetch_upstream,
                step=follow_step,
                coarse=max(follow_step, 1.0),
                key=lambda answer: answer[0],
                on_change=self._prepare,
                name="upstream",
            )
            if follow_step > 0
            else None
        )
        self._families_memo: tuple[NodeView, dict[DeviceKey, Any], str] | None = None

    async def scrape(self) -> ScrapeResult:
        if self._node is not None:
            self._node.start()
        if self._follower is not None:
            self._follower.start()
        return await super().scrape()

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.close()
        if self._node is not None:
            await self._node.close()
        await super().close()

    async def _prepare(self, answer: tuple[str | None, float]) -> None:
        """A new upstream collection: rewrite it now, so scrapes get the cached result."""
        text = answer[0]
        if text is not None:
            node = await (self._node.get() if self._node is not None else self._node_side())
            self._remember(self._rewriter.rewrite(text, node.plan).identities)

    async def _upstream(self) -> tuple[str | None, float]:
        if self._follower is not None:
            answer, _polled_at = await self._follower.latest()
            return answer
        return await self._fetch_upstream()

    async def _node_side(self) -> NodeView:
        kubelet_task = asyncio.create_task(self._fetch_allocations())
        procfs_errors_before = self.procs.errors_total
        snapshot, nvml_ok, nvml_dur, procs, procfs_dur = await self._gpu_side()
        containers, docker_dur = await self._lookup_containers(procs)
        listed, kubelet_dur = await kubelet_task
        t_kube = self._clock()
        index = self.pods.index() if self.pods is not None else PodIndex()
        attributions = attribute(snapshot, procs, index, containers)
        kube_dur = self._clock() - t_kube
        allocated, unmapped = resolve_allocations(listed.allocations, snapshot)
        return NodeView(
            snapshot=snapshot,
            nvml_ok=nvml_ok,
            nvml_duration=nvml_dur,
            procfs_ok=self.procs.errors_total == procfs_errors_before,
            procfs_duration=procfs_dur,
            listed=listed,
            kubelet_duration=kubelet_dur,
            docker_duration=docker_dur,
            index=index,
            attributions=attributions,
            kube_duration=kube_dur,
            allocated=allocated,
            unmapped=len(unmapped),
            plan=plan_devices(attributions, allocated),
            fallback=fallback_identity(snapshot, self.config.kube_node_name),
        )

    def _families(
        self, node: NodeView, identities: dict[DeviceKey, Any], options: RenderOptions
    ) -> str:
        memo = self._families_memo
        if memo is not None and memo[0] is node and memo[1] == identities:
            return memo[2]
        text = render_families(node.attributions, identities, options, node.allocated)
        self._families_memo = (node, identities, text)
        return text

    async def _scrape_once(self) -> ScrapeResult:
        started = self._clock()
        upstream_task = asyncio.create_task(self._upstream())
        node = await (self._node.get() if self._node is not None else self._node_side())
        text, upstream_dur = await upstream_task

        parts: list[str] = []
        invalid_lines = samples = 0
        if text is not None:
            rewritten = self._rewriter.rewrite(text, node.plan)
            parts.append(rewritten.text)
            invalid_lines = rewritten.invalid_lines + rewritten.dropped_duplicates
            samples = rewritten.samples
            self._remember(rewritten.identities)
        identities = {**node.fallback, **self._identities}
        options = RenderOptions(
            node_name=self.config.kube_node_name,
            label_keys=self.config.kube_pod_labels,
            annotation_keys=self.config.kube_pod_annotations,
            process_series=self.config.collector_process,
            docker=self.docker is not None,
        )
        parts.append(self._families(node, identities, options))

        statuses = [
            SourceStatus("upstream", text is not None, upstream_dur, self.upstream_errors),
            SourceStatus(
                "nvml",
                node.nvml_ok,
                node.nvml_duration,
                self.gpu.errors_total if self.gpu else 0,
                enabled=self.gpu is not None,
            ),
            SourceStatus("procfs", node.procfs_ok, node.procfs_duration, self.procs.errors_total),
            SourceStatus(
                "kubernetes",
                bool(self.pods and self.pods.up),
                node.kube_duration,
                self.pods.errors_total if self.pods else 0,
                enabled=self.pods is not None,
            ),
            SourceStatus(
                "podresources",
                node.listed.ok,
                node.kubelet_duration,
                (self.podresources.errors_total if self.podresources else 0) + self._kubelet_errors,
                enabled=node.listed.enabled,
            ),
            SourceStatus(
                "docker",
                bool(self.docker and self.docker.up),
                node.docker_duration,
                self.docker.errors_total if self.docker else 0,
                enabled=bool(self.docker and self.docker.enabled),
            ),
        ]
        extra: dict[str, tuple[str, str, float]] = {
            "dcgm_enricher_upstream_samples": (
                "Upstream samples passed through on this scrape.",
                "gauge",
                samples,
            ),
            "dcgm_enricher_upstream_invalid_lines": (
                "Upstream lines dropped on this scrape because they were not valid exposition "
                "(or repeated a series).",
                "gauge",
                invalid_lines,
            ),
            "dcgm_enricher_upstream_requests_total": (
                "Requests sent to the upstream.",
                "counter",
                self.upstream_requests,
            ),
            "dcgm_enricher_scrapes_total": (
                "Scrapes of /metrics served.",
                "counter",
                self.scrapes_total,
            ),
            "dcgm_enricher_shared_scrapes_total": (
                "Scrapes that joined one already in flight instead of starting their own.",
                "counter",
                self.shared_scrapes_total,
            ),
            "dcgm_enricher_scrape_duration_seconds": (
                "Time the previous scrape took, end to end.",
                "gauge",
                self._last_duration,
            ),
        }
        if self.pods is not None:
            extra["dcgm_enricher_kubernetes_last_sync_timestamp_seconds"] = (
                "When the pod watch last heard from the API server (Unix time); the cache is "
                "served as of then while the API is unreachable.",
                "gauge",
                self.pods.last_sync,
            )
            extra["dcgm_enricher_kubernetes_pods"] = (
                "Pods of this node in the watch cache.",
                "gauge",
                len({p.uid for p in node.index.by_uid.values()}),
            )
        if self.podresources is not None:
            extra["dcgm_enricher_podresources_allocated_devices"] = (
                "GPU device IDs (or shared replicas) the kubelet reported allocated to containers "
                "on this scrape and that name a device of this node.",
                "gauge",
                len(node.allocated),
            )
            extra["dcgm_enricher_podresources_unmapped_devices"] = (
                "GPU device IDs the kubelet reported allocated on this scrape that name no GPU "
                "or MIG device NVML reported (unknown ID scheme, or NVML down), or that were "
                "skipped as malformed; their containers get no gpu_container_allocated series.",
                "gauge",
                node.unmapped + node.listed.skipped,
            )
        parts.append(
            render_self_metrics(statuses, node.attributions, version=__version__, extra=extra)
        )
        body = "".join(parts).encode("utf-8")
        self._last_duration = self._clock() - started
        return ScrapeResult(
            body,
            node.attributions,
            node.snapshot,
            statuses,
            time.time(),
            identities,
            node.allocated,
        )
