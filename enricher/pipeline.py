"""The pipeline of a collection. The upstream's answer and one read of the node become a
collection body (``Assembler``: the rewritten upstream, then each stage's chunk,
enricher.stages), and each scrape adds its self-metrics (``SelfMetricsTail``, written by
enricher.selfmetrics). ``Scraper`` wires them to the schedule of reads (enricher.schedule:
following the upstream, the node side's rhythm, scrapes that share one in flight) and to the
node's sources (enricher.nodeside)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, cast

from .bridge import Bridge
from .cgroupmem import CGROUPFS, read_limit
from .collection import CollectionBody, DeviceLabels, ScrapeResult
from .config import Config
from .families import RenderOptions
from .labels import NODE_LABEL, RewritePlan
from .memory import device_memory, memory_parts
from .nodeside import NodeSide, NodeView, PodSource
from .power import upstream_power
from .promclient import OWN_PROCFS, LabelSets, MetricWriter
from .readings import NAMING_NONE, WATCH_NAMES, Contract, UpstreamReadings, read_upstream
from .rewrite import Rewriter, RewriteResult
from .schedule import Coalescer, Schedule, UpstreamAnswer
from .selfmetrics import (
    RuntimeFamilies,
    ScrapeCounters,
    collection_self_metrics,
    scrape_self_metrics,
)
from .sources import MeasuredRead, Source, close_all
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


class Assembler:
    """Makes each collection's body: the upstream's body rewritten, then each stage's chunk in
    the stages' order. Every piece of work is kept with what it read and done again only when
    that differs (by equality: the upstream's text, the node read's number, the device labels,
    each stage's reads)."""

    def __init__(
        self,
        options: RenderOptions,
        idle_threshold: float,
        label_sets: LabelSets,
        *,
        bridge_naming: str | None = None,
    ):
        # The upstream's fields served in one naming (--bridge.naming; None: as they came).
        # Only the served text: the readers read the rewrite's watched lines, as written.
        self.bridge = None if bridge_naming is None else Bridge(bridge_naming)
        self._bridged: tuple[str, str] = ("", "")  # the last text bridged, and its bridge
        # The lines of every name of the fields the readers need (enricher.readings), in any
        # naming, are handed over by the rewrite.
        self.rewriter = Rewriter(watch=WATCH_NAMES)
        # The label blocks of our own families (a set formatted once while it is in use, one
        # turn per collection): this pipeline's, so that another in the same process (tests,
        # the bench) neither turns nor fills them.
        self.label_sets = label_sets
        # The parts of the body after the rewritten upstream, in order (enricher.stages); each
        # one's last chunk is kept with what it read.
        self.stages: list[Stage] = make_stages(options, idle_threshold, label_sets)
        self._stage_chunks: dict[Stage, tuple[tuple[object, ...], Chunk]] = {}
        # Large rewrites, one at a time: the Rewriter's caches see one caller at a time, since
        # the loop rewrites inline only while this worker is idle.
        self.worker = Worker("enricher-rewrite")
        # The device labels the upstream last gave each device (bounded by MAX_IDENTITIES), so
        # our families keep the same label set while the upstream is briefly down.
        self._upstream_device_labels: DeviceLabels = {}
        # The devices of the watched lines' series (each series parsed once while it stays).
        self._line_devices = SeriesDevices()
        # What the last body said of dcgm-exporter's contract (its naming, unknown and missing
        # fields): logged when it changes, served as dcgm_enricher_upstream_*.
        self.contract = Contract()
        self._contract_shape = 0  # the rewrite's shape of the body it was read from
        self.newest: CollectionBody | None = None
        # Upstream bodies that differed from the one before: dcgm-exporter's collections as
        # seen here (with upstream_requests_total, the upstream's load per collection).
        self.collections_total = 0
        self._numbers = itertools.count(1)

    def identities(self, node: NodeView) -> DeviceLabels:
        """The device labels our families carry: NVML's, then the upstream's over them."""
        return {**node.nvml_identities, **self._upstream_device_labels}

    async def body_for(self, text: str | None, node: NodeView) -> CollectionBody:
        """The body for this upstream text and node read: the newest one while neither (nor
        the device labels) changed, else a new one."""
        body = self.newest
        if (
            body is not None
            and body.text == text
            and body.node.number == node.number
            and body.identities == self.identities(node)
        ):
            return body
        if text is not None and (body is None or text != body.text):
            self.collections_total += 1
        # A new collection (or node read): label sets not written since the previous one (a
        # pod that left) leave the label memo at the next.
        self.label_sets.turn()
        rewritten: RewriteResult | None = None
        if text is not None:
            rewritten = await self._rewrite(text, node.plan)
            self._remember(rewritten.identities)
        collection = self._collection(text, node, rewritten)
        chunks = [self.run_stage(stage, collection) for stage in self.stages]
        stage_chunks = tuple(chunk.body for chunk in chunks)
        power = next((chunk.view for chunk in chunks if chunk.view is not None), None)
        last_active = next((c.last_active for c in chunks if c.last_active is not None), {})
        out = await self._served(rewritten.text) if rewritten is not None else None
        samples = rewritten.samples if rewritten is not None else 0
        invalid = rewritten.invalid_lines + rewritten.dropped_duplicates if rewritten else 0
        if body is not None and body.rewritten == out and body.stage_chunks == stage_chunks:
            # Read again (every scrape without following), or an upstream body that differs
            # only in lines the rewrite drops, but the same bytes: the same number, so what was
            # made of the bytes (their gzip) still holds.
            self.newest = dataclasses.replace(
                body,
                text=text,
                node=node,
                identities=collection.identities,
                samples=samples,
                invalid_lines=invalid,
                power=power,
                memory=collection.memory,
                last_active=last_active,
            )
            return self.newest
        encoded = b""
        if out is not None:
            # A body near --upstream.max-bytes is encoded off the loop, as it is rewritten.
            if len(out) <= REWRITE_INLINE_MAX_CHARS:
                encoded = out.encode("utf-8")
            else:
                encoded = await self.worker.run(lambda: out.encode("utf-8"))
        self.newest = CollectionBody(
            number=next(self._numbers),
            text=text,
            node=node,
            identities=collection.identities,
            chunks=(encoded, *stage_chunks),
            samples=samples,
            invalid_lines=invalid,
            rewritten=out,
            stage_chunks=stage_chunks,
            power=power,
            memory=collection.memory,
            last_active=last_active,
        )
        return self.newest

    def _collection(
        self, text: str | None, node: NodeView, rewritten: RewriteResult | None
    ) -> Collection:
        """What the stages read: the body's readings in SI units (enricher.readings, read once
        from the lines the rewrite handed over), each device's memory and the parts of it no
        listed process holds (enricher.memory), and the upstream's power readings."""
        readings = UpstreamReadings()
        if rewritten is not None and text:
            # A text of the same shape as the last one read (the rewrite's template vouches
            # for it) declares the same families: its contract is the last one's.
            same = rewritten.shape != 0 and rewritten.shape == self._contract_shape
            readings = read_upstream(
                text,
                rewritten.watched,
                self._line_devices,
                contract=self.contract if same else None,
            )
            self._contract_shape = rewritten.shape
            self._note_contract(readings.contract)
        memory = device_memory(readings)
        return Collection(
            text,
            node,
            self.identities(node),
            memory,
            memory_parts(memory, node.attributions),
            upstream_power(readings),
        )

    def _note_contract(self, contract: Contract) -> None:
        """Keep the body's contract; say once when what it lacks or the naming changes."""
        before, self.contract = self.contract, contract
        if contract.missing != before.missing:
            if contract.missing:
                log.warning(
                    "the upstream's body has no field for %s under any name the field table "
                    "knows (naming %s; %d DCGM fields it does not know): a renamed field, or a "
                    "counters file without it; the memory split, the power split or dashboard "
                    "panels go without it (docs/compatibility.md)",
                    ", ".join(contract.missing),
                    contract.naming,
                    contract.unknown,
                )
            else:
                log.info("the upstream's body has every field the enricher needs again")
        if contract.naming != before.naming and before.naming != NAMING_NONE:
            log.info(
                "the upstream's field naming changed from %s to %s", before.naming, contract.naming
            )

    async def _rewrite(self, text: str, plan: RewritePlan) -> RewriteResult:
        """Rewrite ``text``: inline when it is small and no rewrite is under way, else in the
        rewrite worker. A pure-Python rewrite in a thread still takes the GIL, but gives it up
        every switch interval (5 ms), so the loop answers meanwhile."""
        if len(text) <= REWRITE_INLINE_MAX_CHARS and self.worker.idle:
            return self.rewriter.rewrite(text, plan)
        return await self.worker.run(lambda: self.rewriter.rewrite(text, plan))

    async def _served(self, rewritten: str) -> str:
        """The rewritten upstream as it is served: in the bridge's naming when there is one
        (inline or in the rewrite worker, as the rewrite; again only when the rewrite
        differs from the last one bridged), else as it is."""
        bridge = self.bridge
        if bridge is None:
            return rewritten
        last = self._bridged
        if rewritten is last[0] or rewritten == last[0]:
            return last[1]
        if len(rewritten) <= REWRITE_INLINE_MAX_CHARS and self.worker.idle:
            served = bridge.apply(rewritten)
        else:
            served = await self.worker.run(lambda: bridge.apply(rewritten))
        self._bridged = (rewritten, served)
        return served

    def run_stage(self, stage: Stage, collection: Collection) -> Chunk:
        """``stage``'s chunk of this collection: its last one while what it reads is the same
        (one rule for every stage: enricher.stages), else a new one."""
        reads = stage.reads(collection)
        last = self._stage_chunks.get(stage)
        if last is not None and last[0] == reads:
            return last[1]
        chunk = stage.write(collection)
        self._stage_chunks[stage] = (reads, chunk)
        return chunk

    def _remember(self, seen: DeviceLabels) -> None:
        if len(self._upstream_device_labels) + len(seen) > MAX_IDENTITIES:
            self._upstream_device_labels.clear()
            if len(seen) > MAX_IDENTITIES:  # an upstream claiming absurdly many devices
                seen = dict(itertools.islice(seen.items(), MAX_IDENTITIES))
        self._upstream_device_labels.update(seen)


class _Tail(NamedTuple):
    """The self-metrics of the last collection and upstream answer, written once."""

    collection: object
    answer: object
    before: bytes  # the families before the per-scrape counters
    after: bytes  # and after them
    runtime: bytes  # process_* and python_*
    memory_limit: int | None


class SelfMetricsTail:
    """Writes the tail of each scrape's body: the self-metrics of the collection, once per
    collection and upstream answer, around the per-scrape counters, then process_* and
    python_*. The enricher's own figures (its process, its memory limit) are read with the
    collection: once per collection, not again for each poll that found the upstream's body
    unchanged (a new answer, so new upstream figures, but the same collection)."""

    def __init__(
        self,
        label_sets: LabelSets,
        *,
        own_procfs: str = OWN_PROCFS,
        own_cgroupfs: str = CGROUPFS,
        const: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._label_sets = label_sets
        # process_* and python_*, this enricher's (never in prometheus_client's global
        # registry).
        self.runtime = RuntimeFamilies(own_procfs, const)
        self._own_procfs = own_procfs
        self._own_cgroupfs = own_cgroupfs
        self._last: _Tail | None = None

    def render(
        self,
        collection: object,
        answer: object,
        collection_metrics: Callable[[int | None], tuple[MetricWriter, MetricWriter]],
        per_scrape: MetricWriter,
    ) -> bytes:
        """The tail for this ``collection`` and upstream ``answer`` (compared by equality with
        the last ones): ``collection_metrics(memory_limit)`` writes the collection's families,
        before and after ``per_scrape``."""
        last = self._last
        if last is None or last.collection != collection or last.answer != answer:
            if last is not None and last.collection == collection:
                runtime, limit = last.runtime, last.memory_limit
            else:
                runtime = self.runtime.render()
                limit = read_limit(self._own_procfs, self._own_cgroupfs)
            before, after = collection_metrics(limit)
            last = self._last = _Tail(
                collection,
                answer,
                before.render(self._label_sets).encode("utf-8"),
                after.render(self._label_sets).encode("utf-8"),
                runtime,
                limit,
            )
        per_scrape_text = per_scrape.render(self._label_sets).encode("utf-8")
        return last.before + per_scrape_text + last.after + last.runtime


class Scraper:
    """One enricher's pipeline, its schedule and its sources: runs one scrape at a time;
    scrapes that arrive meanwhile share its result."""

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
        self.upstream = UpstreamSource(
            self._upstream_url,
            timeout=config.upstream_timeout,
            max_bytes=config.upstream_max_bytes,
            missing=_missing_upstream(config, watching=self.kubernetes is not None),
        )
        # Every source, in the order of the dcgm_enricher_source_* series (the table's).
        self.node = NodeSide(
            config, {**sources, "upstream": self.upstream}, table=table, clock=clock
        )
        # The node label every series carries (none where no node name is known).
        node_label = ((NODE_LABEL, config.node),) if config.node else ()
        label_sets = LabelSets(const=node_label)
        options = RenderOptions(
            node_name=config.node,
            label_keys=config.kube_pod_labels,
            annotation_keys=config.kube_pod_annotations,
            process_series=config.collector_process,
            docker=self.node.given("docker") is not None,
            device_taints=self.node.given("resourceslices") is not None,
        )
        self.assembler = Assembler(
            options, config.idle_threshold, label_sets, bridge_naming=config.bridge_naming
        )
        self.self_metrics = SelfMetricsTail(
            label_sets, own_procfs=own_procfs, own_cgroupfs=own_cgroupfs, const=node_label
        )
        self.counters = ScrapeCounters()
        self.schedule = Schedule(
            config,
            read_node=self.node.read,
            fetch_upstream=self._fetch_upstream,
            on_collection=self._prepare,
            clock=clock,
        )
        # Called with each new body made ahead of the scrapes (following the upstream): the
        # HTTP side's gzip (compress.GzipBodies.prepare).
        self.on_new_body: list[Callable[[CollectionBody], Awaitable[None]]] = []
        self.last: ScrapeResult | None = None
        self._scrape = Coalescer(self._scrape_once)
        self._clock = clock

    async def close(self) -> None:
        """Stop the background work, then close every source (each bounded: a hung NVML call
        cannot hold up shutdown) and the workers."""
        await self.schedule.close()
        await close_all(m.source for m in self.node.sources)
        self.node.close_workers()
        self.assembler.worker.close()

    def start(self) -> None:
        """Start the background work (following the upstream, a --collect.interval loop) in the
        running event loop, so that the first scrape finds it under way; a no-op once it runs.
        A scrape starts it too."""
        self.schedule.start()

    async def scrape(self, *, counted: bool = True) -> ScrapeResult:
        """Return a fresh scrape; joins the one in flight if there is one. ``counted`` False:
        not a scrape of /metrics (the node page), so dcgm_enricher_scrapes_total keeps still."""
        self.start()
        if counted:
            self.counters.scrapes += 1
            if self._scrape.busy:
                self.counters.shared_scrapes += 1
        result = await self._scrape()
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

    async def _fetch_upstream(self) -> UpstreamAnswer:
        """The upstream's answer. A body equal to the newest collection body's upstream text
        (dcgm-exporter has not collected since) comes back as that text: one copy of the body
        is kept, not one per poll."""
        answer: MeasuredRead[str | None] = await self.node.measured["upstream"].read(default=None)
        text, newest = answer.value, self.assembler.newest
        if text is not None and newest is not None and newest.text == text:
            return MeasuredRead(newest.text, answer.status)
        return answer

    async def _prepare(self, answer: UpstreamAnswer, node: NodeView) -> None:
        """A new upstream collection: make its body now (and what the HTTP side makes of it),
        so scrapes get the cached results."""
        body = await self.assembler.body_for(answer.value, node)
        for hook in self.on_new_body:
            await hook(body)

    async def _scrape_once(self) -> ScrapeResult:
        started = self._clock()
        upstream_task = asyncio.create_task(self.schedule.upstream_answer())
        node = await self.schedule.node_view()
        upstream = await upstream_task
        body = await self.assembler.body_for(upstream.value, node)
        statuses = [upstream.status, *node.statuses]
        kubelet = self.node.given("podresources") is not None

        def collection_metrics(memory_limit: int | None) -> tuple[MetricWriter, MetricWriter]:
            return collection_self_metrics(
                statuses,
                node.attributions,
                samples=body.samples,
                invalid_lines=body.invalid_lines,
                pods=node.index.pods if self.kubernetes is not None else None,
                allocated=len(node.allocated) if kubelet else None,
                unmapped=node.unmapped + node.listed.skipped,
                memory_limit=memory_limit,
                contract=self.assembler.contract,
            )

        counters = self.counters
        per_scrape = scrape_self_metrics(
            upstream_requests=self.upstream.requests_total,
            upstream_collections=self.assembler.collections_total,
            scrapes=counters.scrapes,
            shared_scrapes=counters.shared_scrapes,
            node_page_requests=counters.node_page_requests,
            last_duration=counters.last_duration,
            kubernetes_last_sync=self.kubernetes.last_sync if self.kubernetes else None,
            response_bytes=counters.response_bytes,
        )
        # The collection's self-metrics written once per node read, body and upstream answer
        # (a new poll that found the same body has new upstream figures); the per-scrape
        # counters on every scrape.
        tail = self.self_metrics.render(
            (node.number, body.number), upstream, collection_metrics, per_scrape
        )
        counters.last_duration = self._clock() - started
        return ScrapeResult(
            attributions=node.attributions,
            snapshot=node.snapshot,
            statuses=statuses,
            finished_at=time.time(),
            identities=body.identities,
            allocations=node.allocated,
            power=body.power,
            memory=body.memory,
            shared=body,
            tail=tail,
            last_active=body.last_active,
            contract=self.assembler.contract,
        )


def _missing_upstream(config: Config, *, watching: bool) -> str:
    """Why no upstream URL is known in discovery mode: what was searched, and where."""
    target = discovery_target(
        config.upstream_pod_selector, config.upstream_pod_namespace, config.kube_node_name
    )
    if not watching:
        return f"no pod watch to find a {target}"
    return f"no {target} with a pod IP (--upstream.pod-selector, --upstream.pod-namespace)"
