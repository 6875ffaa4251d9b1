"""The pipeline of a collection: the upstream's answer (followed, ``refresh``) and one read of
the node (``node``) become a head (the rewritten upstream, our families, the power families,
encoded once), and each scrape adds its self-metrics (``selfmetrics``). ``Scraper`` owns every
cache this takes, each named for what it holds."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import cast

from .cgroupmem import CGROUPFS, read_limit
from .collection import CollectionTail, DeviceLabels, Head, ScrapeResult
from .compress import GzipHead
from .config import Config
from .families import RenderOptions
from .labels import NODE_LABEL, RewritePlan
from .memory import MEMORY_NAMES, memory_parts, parse_device_memory
from .model import SourceStatus
from .node import NodeSide, NodeView, PodSource
from .power import UPSTREAM_NAMES, UpstreamPower, upstream_power
from .promclient import OWN_PROCFS, LabelSets, MetricWriter
from .refresh import Follower, Refresher
from .rewrite import Rewriter, RewriteResult
from .selfmetrics import RuntimeFamilies, collection_self_metrics, scrape_self_metrics
from .sources import Measured, Outcome, Source, close_all
from .sourcetable import SOURCES, SourceEntry
from .stages import Chunk, Collection, Stage, make_stages
from .upstream import UpstreamSource, discovery_target, url_for_pod_ip
from .upstreamlines import SeriesDevices
from .worker import Worker

log = logging.getLogger(__name__)

MAX_IDENTITIES = 4096
# Upstream bodies up to this size are rewritten on the event loop (a few milliseconds at
# most: the template path does about 1 MiB in 2 ms); larger ones in the rewrite worker, so a
# body near --upstream.max-bytes never stalls /healthz or other scrapes (bench: loop part).
REWRITE_INLINE_MAX_CHARS = 1 << 20
# Heads up to this size are gzipped on the event loop (zlib-ng level 2: about 0.3 ms for
# mig56's 900 KiB, 2 ms at most); larger ones in the rewrite worker (zlib-ng lets go of the GIL
# while it compresses). On the loop, the compressor's buffers come from the main thread's heap
# instead of the worker thread's own malloc arena, which would keep freed memory resident.
GZIP_INLINE_MAX_BYTES = 4 << 20


class Scraper:
    """Runs one scrape at a time; scrapes that arrive meanwhile share its result."""

    def __init__(
        self,
        config: Config,
        *,
        table: Sequence[SourceEntry] = SOURCES,
        clock: Callable[[], float] = time.monotonic,
        own_procfs: str = OWN_PROCFS,
        own_cgroupfs: str = CGROUPFS,
        **sources: Source | None,
    ) -> None:
        """The node's sources by their names in ``table`` (enricher.sourcetable), each an
        ``enricher.sources.Source``; one left out or None is switched off (reported with
        enabled 0); the Scraper makes the upstream's itself. ``docker``: name containers
        outside pods after Docker containers (Docker mode, for hosts without Kubernetes).
        ``own_procfs``: the /proc whose ``self`` the process_* families describe (the
        enricher's own /proc, not --path.procfs); ``own_cgroupfs``: the cgroup filesystem its
        memory limit is read from (enricher.cgroupmem). Raises ValueError for a name the table
        does not have."""
        if "upstream" in sources:
            raise ValueError("the Scraper makes the upstream source itself")
        self.config = config
        self.kubernetes = cast("PodSource | None", sources.get("kubernetes"))
        self._clock = clock
        # process_* and python_*, this Scraper's (never in prometheus_client's global registry).
        # The node label every series carries (none where no node name is known).
        node_label = ((NODE_LABEL, config.node),) if config.node else ()
        self._runtime = RuntimeFamilies(own_procfs, node_label)
        self._own_procfs = own_procfs
        self._own_cgroupfs = own_cgroupfs
        # The self-metrics of the last collection, written once (not per scrape).
        self._collection_tail: CollectionTail | None = None
        # The power families and the framebuffer gauges are handed over by the rewrite.
        self._rewriter = Rewriter(watch=UPSTREAM_NAMES + MEMORY_NAMES)
        # The device labels the upstream last gave each device (bounded by MAX_IDENTITIES).
        self._upstream_device_labels: DeviceLabels = {}
        self._inflight: asyncio.Future[ScrapeResult] | None = None
        self.upstream = UpstreamSource(
            self._upstream_url,
            timeout=config.upstream_timeout,
            max_bytes=config.upstream_max_bytes,
            missing=_missing_upstream(config, watching=self.kubernetes is not None),
        )
        self.node = NodeSide(
            config, {**sources, "upstream": self.upstream}, table=table, clock=clock
        )
        self._upstream = self.node.measured["upstream"]
        # Every source, in the order of the dcgm_enricher_source_* series (the table's).
        self.sources: list[Measured] = self.node.sources
        # Large rewrites, one at a time: the Rewriter's caches see one caller at a time, since
        # the loop rewrites inline only while this worker is idle.
        self._rewrite_worker = Worker("enricher-rewrite")
        self.scrapes_total = 0
        self.shared_scrapes_total = 0
        # Upstream bodies that differed from the one before: dcgm-exporter's collections as
        # seen here (with upstream_requests_total, the upstream's load per collection).
        self.upstream_collections_total = 0
        # Bytes of /metrics bodies sent, by Content-Encoding (make_app counts them).
        self.response_bytes = {"gzip": 0, "identity": 0}
        self.node_page_requests_total = 0  # GET /: reads the node too, but is not a scrape
        self.last: ScrapeResult | None = None
        self._last_duration = 0.0
        # The upstream fetched right after each of its collections (--upstream.follow-step);
        # with 0, on every scrape.
        follow = config.upstream_follow_step > 0
        # The node side (NVML, procfs, the kubelet, Docker): with --collect.interval, read in
        # the background every that many seconds. Without it, when following the upstream,
        # read right after each upstream collection ("aligned": both sides of a scrape are
        # as old as that collection, and gpu_container_utilization_ratio covers the same
        # interval as dcgm-exporter's own averages); a scrape reads it itself only when the
        # last one is older than the upstream's interval. Neither: on every scrape.
        self._aligned = follow and config.collect_interval == 0
        self._node_refresh: Refresher[NodeView] | None = None
        if config.collect_interval > 0:
            self._node_refresh = Refresher(
                self.node.read, config.collect_interval, clock=clock, name="node"
            )
        elif self._aligned:
            # No loop of its own: each upstream collection refreshes it (see _prepare).
            self._node_refresh = Refresher(
                self.node.read,
                None,
                max_age=self._aligned_max_age,
                clock=clock,
                name="node",
            )
        self._follower = (
            Follower(
                self._fetch_upstream,
                step=config.upstream_follow_step,
                coarse=max(config.upstream_follow_step, 1.0),
                key=lambda answer: answer.value,
                on_change=self._prepare,
                clock=clock,
                name="upstream",
            )
            if config.upstream_follow_step > 0
            else None
        )
        # The head of the newest collection: what scrapes serve before their self-metrics.
        self._newest_head: Head | None = None
        self._gzip_wanted = False  # a scraper asked for gzip: compress each new head at once
        self._options = RenderOptions(
            node_name=config.node,
            label_keys=config.kube_pod_labels,
            annotation_keys=config.kube_pod_annotations,
            process_series=config.collector_process,
            docker=self.node.given("docker") is not None,
            device_taints=self.node.given("resourceslices") is not None,
        )
        # The label blocks of our own families (a set formatted once while it is in use, one
        # turn per collection) and the devices of the upstream's power lines (each series
        # parsed once): this Scraper's, so that another in the same process (tests, the
        # bench) neither turns nor fills them.
        self._label_sets = LabelSets(const=node_label)
        self._power_line_devices = SeriesDevices()
        self._memory_line_devices = SeriesDevices()  # the same, for the framebuffer lines
        # The parts of the body after the rewritten upstream, in order (enricher.stages): the
        # container families, the power split and energy, the idle ledger. Each keeps its
        # ledger; the Scraper keeps each one's last chunk with what it read.
        self.stages: list[Stage] = make_stages(
            self._options, config.idle_threshold, self._label_sets
        )
        self._stage_chunks: dict[Stage, tuple[tuple[object, ...], Chunk]] = {}

    async def close(self) -> None:
        """Stop the background work, then close every source (each bounded: a hung NVML call
        cannot hold up shutdown) and the workers."""
        if self._follower is not None:
            await self._follower.close()
        if self._node_refresh is not None:
            await self._node_refresh.close()
        await close_all(m.source for m in self.sources)
        self.node.close_workers()
        self._rewrite_worker.close()

    def _aligned_max_age(self) -> float:
        """How old the node side may be when it is read after each upstream collection: one
        learnt collection interval (with slack) plus a step and the read itself; before the
        interval is learnt, the follower's coarse poll."""
        follower, refresh = self._follower, self._node_refresh
        if follower is None or refresh is None:
            return 0.0
        interval = follower.interval
        if interval is None:
            return follower.coarse
        return interval * 1.1 + follower.step + refresh.last_duration

    def start(self) -> None:
        """Start the background work (following the upstream, a --collect.interval loop) in the
        running event loop, so that the first scrape finds it under way; a no-op once it runs.
        A scrape starts it too."""
        if self._node_refresh is not None:
            self._node_refresh.start()
        if self._follower is not None:
            self._follower.start()

    async def scrape(self, *, counted: bool = True) -> ScrapeResult:
        """Return a fresh scrape; joins the one in flight if there is one. ``counted`` False:
        not a scrape of /metrics (the node page), so dcgm_enricher_scrapes_total keeps still."""
        self.start()
        if counted:
            self.scrapes_total += 1
        if self._inflight is not None and not self._inflight.done():
            if counted:
                self.shared_scrapes_total += 1
            return await asyncio.shield(self._inflight)
        fut: asyncio.Future[ScrapeResult] = asyncio.get_running_loop().create_future()
        self._inflight = fut
        try:
            result = await self._scrape_once()
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: joiners re-raise it themselves
            raise
        fut.set_result(result)
        self.last = result
        return result

    def _upstream_url(self) -> str | None:
        if not self.config.upstream_discover_pod:
            return self.config.upstream_url
        if self.kubernetes is None:
            return None
        for pod in self.kubernetes.upstream_pods():
            if pod.pod_ip:
                return url_for_pod_ip(self.config.upstream_url, pod.pod_ip)
        return None

    async def _fetch_upstream(self) -> Outcome[str | None]:
        """The upstream's answer. A body equal to the one the newest head was made from
        (dcgm-exporter has not collected since) comes back as that head's object: one copy
        of the body is kept, not one per poll, and what was prepared for it is found by
        identity (the head, the power split) instead of being compared or worked out again."""
        answer: Outcome[str | None] = await self._upstream.read(default=None)
        text = answer.value
        last = self._newest_head.text if self._newest_head is not None else None
        if text is not None and last is not None and text is not last and text == last:
            return Outcome(last, answer.status)
        return answer

    async def _prepare(self, answer: Outcome[str | None]) -> None:
        """A new upstream collection: read the node side now when aligned with the upstream,
        rewrite the collection and encode it with the families (and gzip it, once a scraper
        asked for gzip), so scrapes get the cached results."""
        node = await (
            self._node_refresh.refresh()
            if self._aligned and self._node_refresh
            else self._node_view()
        )
        head = await self._head_for(answer.value, node)
        if self._gzip_wanted:
            await self._gzip(head)

    async def _head_for(self, text: str | None, node: NodeView) -> Head:
        """The head for this upstream body and node view: the last one while neither changed
        (nor the device labels the families carry), else a new one."""
        head = self._newest_head
        if (
            head is not None
            and head.text is text
            and head.node is node
            and head.identities == {**node.nvml_identities, **self._upstream_device_labels}
        ):
            return head
        if text is not None and (head is None or text is not head.text):
            # A body that differs from the last head's (_fetch_upstream hands an equal one
            # back as that head's object): one upstream collection.
            self.upstream_collections_total += 1
        # A new collection (or node view): label sets not written since the previous one (a
        # pod that left) leave the label memo at the next.
        self._label_sets.turn()
        rewritten: RewriteResult | None = None
        if text is not None:
            rewritten, _ = await self._rewrite(text, node.plan, encode=False)
            self._remember(rewritten.identities)
        identities = {**node.nvml_identities, **self._upstream_device_labels}
        watched = rewritten.watched if rewritten is not None else ()
        # Each device's memory and the parts of it no listed process holds (enricher.memory),
        # and the upstream's power readings: read from the lines the rewrite handed over, once
        # for every stage.
        memory = parse_device_memory(watched, self._memory_line_devices) if text is not None else {}
        readings = (
            upstream_power(watched, self._power_line_devices)
            if text is not None
            else UpstreamPower()
        )
        collection = Collection(
            text, node, identities, memory, memory_parts(memory, node.attributions), readings
        )
        chunks = [self._run_stage(stage, collection) for stage in self.stages]
        stage_chunks = tuple(chunk.body for chunk in chunks)
        power = next((chunk.view for chunk in chunks if chunk.view is not None), None)
        last_active = next((c.last_active for c in chunks if c.last_active is not None), None)
        out = rewritten.text if rewritten is not None else None
        if head is not None and head.rewritten is out and head.stage_chunks == stage_chunks:
            # Read again (every scrape without following), but the same bytes: keep the
            # encoded body and its gzip.
            head.text, head.node, head.identities, head.power = text, node, identities, power
            head.memory, head.last_active = collection.memory, last_active
            return head
        encoded = b""
        if out is not None:
            # A body near --upstream.max-bytes is encoded off the loop, as it is rewritten.
            if len(out) <= REWRITE_INLINE_MAX_CHARS:
                encoded = out.encode("utf-8")
            else:
                encoded = await self._rewrite_worker.run(lambda: out.encode("utf-8"))
        head = Head(
            text,
            node,
            identities,
            (encoded, *stage_chunks),
            rewritten.samples if rewritten is not None else 0,
            rewritten.invalid_lines + rewritten.dropped_duplicates if rewritten is not None else 0,
            out,
            stage_chunks,
            power,
            watched,
            memory=collection.memory,
            last_active=last_active,
        )
        self._newest_head = head
        return head

    async def _gzip(self, head: Head) -> GzipHead:
        """``head`` gzipped, once per head."""
        if head.gzip is None:
            if head.size <= GZIP_INLINE_MAX_BYTES or not self._rewrite_worker.idle:
                gz = GzipHead(*head.chunks)
            else:
                gz = await self._rewrite_worker.run(lambda: GzipHead(*head.chunks))
            if head.gzip is None:
                head.gzip = gz
        return head.gzip

    async def gzip_body(self, result: ScrapeResult) -> bytes:
        """``result``'s body gzipped: its head compressed once (and kept), its tail on each
        call. From now on each new head is compressed as soon as it is made."""
        self._gzip_wanted = True
        if result.head is None:  # not made by this Scraper's scrape: compress it whole
            return GzipHead(result.body).finish(b"")
        gz = await self._gzip(result.head)
        return gz.finish(result.tail)

    async def _rewrite(
        self, text: str, plan: RewritePlan, *, encode: bool
    ) -> tuple[RewriteResult, bytes]:
        """Rewrite ``text`` (and encode the result when ``encode``): inline when it is small
        and no rewrite is under way, else in the rewrite worker. A pure-Python rewrite in a
        thread still takes the GIL, but gives it up every switch interval (5 ms), so the
        loop answers meanwhile."""

        def work() -> tuple[RewriteResult, bytes]:
            result = self._rewriter.rewrite(text, plan)
            return result, result.text.encode("utf-8") if encode else b""

        if len(text) <= REWRITE_INLINE_MAX_CHARS and self._rewrite_worker.idle:
            return work()
        return await self._rewrite_worker.run(work)

    async def _node_view(self) -> NodeView:
        return await (
            self._node_refresh.get() if self._node_refresh is not None else self.node.read()
        )

    async def _upstream_answer(self) -> Outcome[str | None]:
        if self._follower is not None:
            answer, _polled_at = await self._follower.latest()
            if answer.value is None:
                # A failure is never served from the cache: while the upstream is down (or not
                # found yet), every scrape asks again, as without following.
                await self._follower.poll_once()
                answer, _polled_at = await self._follower.latest()
            return answer
        return await self._fetch_upstream()

    def _run_stage(self, stage: Stage, collection: Collection) -> Chunk:
        """``stage``'s chunk of this collection: its last one while what it reads is the same
        (one rule for every stage: enricher.stages), else a new one."""
        reads = stage.reads(collection)
        last = self._stage_chunks.get(stage)
        if last is not None and last[0] == reads:
            return last[1]
        chunk = stage.write(collection)
        self._stage_chunks[stage] = (reads, chunk)
        return chunk

    async def _scrape_once(self) -> ScrapeResult:
        started = self._clock()
        upstream_task = asyncio.create_task(self._upstream_answer())
        node = await self._node_view()
        upstream = await upstream_task
        head = await self._head_for(upstream.value, node)
        samples, invalid_lines = head.samples, head.invalid_lines

        statuses = [upstream.status, *node.statuses]
        memo = self._collection_tail
        if (
            memo is None
            or memo.node is not node
            or memo.upstream is not upstream
            or memo.head is not head
        ):
            # The process's own figures (and its memory limit) are read with the collection:
            # once per node view and head, not again for each poll that found the upstream's
            # body unchanged (a new answer, so new upstream figures, but the same collection;
            # docs/metrics.md).
            kept = memo if memo is not None and memo.node is node and memo.head is head else None
            if kept is not None:
                limit, runtime = kept.memory_limit, kept.runtime_text
            else:
                limit = read_limit(self._own_procfs, self._own_cgroupfs)
                runtime = self._runtime.render()
            before, after = self._collection_metrics(statuses, node, samples, invalid_lines, limit)
            memo = self._collection_tail = CollectionTail(
                node,
                upstream,
                head,
                before,
                after,
                before.render(self._label_sets).encode("utf-8"),
                after.render(self._label_sets).encode("utf-8"),
                runtime,
                limit,
            )
        per_scrape = self._scrape_metrics()
        # The collection's families written once, the per-scrape counters on every scrape.
        tail = memo.before_text + per_scrape.render(self._label_sets).encode("utf-8")
        tail += memo.after_text
        tail += memo.runtime_text
        self._last_duration = self._clock() - started
        return ScrapeResult(
            None,
            node.attributions,
            node.snapshot,
            statuses,
            time.time(),
            head.identities,
            node.allocated,
            head.power,
            head,
            tail,
        )

    def _collection_metrics(
        self,
        statuses: list[SourceStatus],
        node: NodeView,
        samples: int,
        invalid_lines: int,
        memory_limit: int | None,
    ) -> tuple[MetricWriter, MetricWriter]:
        """The self-metrics of one node view and upstream answer (enricher.selfmetrics)."""
        return collection_self_metrics(
            statuses,
            node.attributions,
            samples=samples,
            invalid_lines=invalid_lines,
            pods=node.index.pods if self.kubernetes is not None else None,
            allocated=len(node.allocated) if self.node.given("podresources") else None,
            unmapped=node.unmapped + node.listed.skipped,
            memory_limit=memory_limit,
        )

    def _scrape_metrics(self) -> MetricWriter:
        """The self-metrics that move with every scrape (enricher.selfmetrics)."""
        return scrape_self_metrics(
            upstream_requests=self.upstream.requests_total,
            upstream_collections=self.upstream_collections_total,
            scrapes=self.scrapes_total,
            shared_scrapes=self.shared_scrapes_total,
            node_page_requests=self.node_page_requests_total,
            last_duration=self._last_duration,
            kubernetes_last_sync=self.kubernetes.last_sync if self.kubernetes is not None else None,
            response_bytes=self.response_bytes,
        )

    def _remember(self, seen: DeviceLabels) -> None:
        """Keep the upstream's device labels so our families keep the same label set when the
        upstream is briefly down."""
        if len(self._upstream_device_labels) + len(seen) > MAX_IDENTITIES:
            self._upstream_device_labels.clear()
            if len(seen) > MAX_IDENTITIES:  # an upstream claiming absurdly many devices
                seen = dict(itertools.islice(seen.items(), MAX_IDENTITIES))
        self._upstream_device_labels.update(seen)


def _missing_upstream(config: Config, *, watching: bool) -> str:
    """Why no upstream URL is known in discovery mode: what was searched, and where."""
    target = discovery_target(
        config.upstream_pod_selector, config.upstream_pod_namespace, config.kube_node_name
    )
    if not watching:
        return f"no pod watch to find a {target}"
    return f"no {target} with a pod IP (--upstream.pod-selector, --upstream.pod-namespace)"
