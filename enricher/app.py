"""The HTTP side: the scrape pipeline (sources -> pure enrichment -> text) and the aiohttp app."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from aiohttp import web

from . import __version__
from .attribution import (
    AllocatedDevice,
    Attribution,
    attribute,
    docker_lookup_ids,
    dra_slice_keys,
    fallback_identity,
    plan_devices,
    resolve_allocations,
)
from .cgroupmem import CGROUPFS, read_limit
from .compress import GzipHead, accepts_gzip
from .config import Config
from .families import RenderOptions, render_families, self_metrics, value_families
from .labels import DeviceKey, RewritePlan
from .model import (
    DockerContainer,
    GpuSnapshot,
    PodIndex,
    PodInfo,
    ProcError,
    ProcInfo,
    SourceStatus,
)
from .podresources import ListResult
from .power import (
    UPSTREAM_NAMES,
    DeviceDraw,
    EnergyLedger,
    HeadDevices,
    Part,
    UpstreamPower,
    Who,
    choose_readings,
    power_families,
    render_power,
    split_power,
    upstream_power,
)
from .promclient import (
    OWN_PROCFS,
    LabelSets,
    MetricWriter,
    RuntimeFamilies,
)
from .refresh import Follower, Refresher
from .resourceslices import SliceIndex
from .rewrite import Rewriter, RewriteResult
from .sources import Measured, Off, Outcome, Source, close_all
from .textformat import WatchedLine
from .upstream import UpstreamSource, discovery_target, url_for_pod_ip
from .worker import Worker

log = logging.getLogger(__name__)

LANDING_MAX_AGE_SECONDS = 15.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
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


class PodSource(Source, Protocol):
    """The kubernetes source (kube.PodCache, or a stand-in): besides the index it reads, the
    pods the upstream may be found in and when the watch last synced."""

    last_sync: float

    def index(self) -> PodIndex: ...

    def upstream_pods(self) -> list[PodInfo]: ...


@dataclass(slots=True)
class Head:
    """What a scrape serves before its self-metrics: the rewritten upstream collection and
    the enricher's families, the same for every scrape until the next collection (or node
    read), so it is encoded once, and gzipped at most once (``gzip``, when a scraper asks)."""

    text: str | None  # the upstream body it was made from (compared by identity)
    node: NodeView
    identities: dict[DeviceKey, tuple[tuple[str, str], ...]]
    # The body in parts (the rewritten upstream, our families, the power families), encoded:
    # gzip reads them in turn and an identity body joins them with its tail, so the whole
    # body is never copied into one buffer of its own.
    chunks: tuple[bytes, ...]
    samples: int
    invalid_lines: int
    rewritten: str | None  # the rewritten upstream body (the Rewriter's, compared by identity)
    families: str
    power_body: bytes  # the power families, as written
    power: PowerView | None  # the power split they were written from
    gzip: GzipHead | None = None

    @property
    def size(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


class _CollectionTail(NamedTuple):
    """The self-metrics of one node view, upstream answer and head, written once: the families
    before the per-scrape counters and after them, and process_* and python_*."""

    node: NodeView
    upstream: Outcome[str | None]
    head: Head
    before: MetricWriter
    after: MetricWriter
    before_text: bytes
    after_text: bytes
    runtime_text: bytes
    memory_limit: int | None


class ScrapeResult:
    """One scrape: what was served and what the node looked like. ``body`` (the identity
    body) is joined from ``head`` and ``tail`` when first asked for: a scrape served with
    gzip never copies the whole body."""

    __slots__ = (
        "_body",
        "allocations",
        "attributions",
        "finished_at",
        "head",
        "identities",
        "power",
        "snapshot",
        "statuses",
        "tail",
    )

    def __init__(
        self,
        body: bytes | None,
        attributions: list[Attribution],
        snapshot: GpuSnapshot,
        statuses: list[SourceStatus],
        finished_at: float,
        identities: dict[DeviceKey, tuple[tuple[str, str], ...]] | None = None,
        allocations: list[AllocatedDevice] | None = None,
        power: PowerView | None = None,
        head: Head | None = None,
        tail: bytes = b"",
    ) -> None:
        """``body`` None: ``head``'s chunks followed by ``tail``."""
        self._body = body
        self.attributions = attributions
        self.snapshot = snapshot
        self.statuses = statuses
        self.finished_at = finished_at
        self.identities = identities if identities is not None else {}
        self.allocations = allocations if allocations is not None else []
        self.power = power
        self.head = head
        self.tail = tail

    @property
    def body(self) -> bytes:
        if self._body is None:
            chunks = self.head.chunks if self.head is not None else ()
            self._body = b"".join((*chunks, self.tail))
        return self._body


@dataclass(frozen=True, slots=True)
class PowerView:
    """The power split of one scrape, for the node page: watts per GPU, per container on a
    device key, and unattributed per (device key, reason)."""

    device_watts: dict[str, float]
    container_watts: dict[tuple[DeviceKey, Who], float]
    unattributed_watts: dict[tuple[DeviceKey, str], float]


# The power families as written for (draws, identities): the body and the node page's view.
_PowerOut = tuple[list[DeviceDraw], dict[DeviceKey, Any], bytes, PowerView]


@dataclass(frozen=True, slots=True)
class NodeView:
    """One read of the node: what the GPUs run and who owns it, and how each source did."""

    snapshot: GpuSnapshot
    statuses: list[SourceStatus]  # the node side's sources, in Scraper.sources order
    listed: ListResult
    index: PodIndex
    attributions: list[Attribution]
    allocated: list[AllocatedDevice]
    unmapped: int
    plan: RewritePlan
    fallback: dict[DeviceKey, tuple[tuple[str, str], ...]]  # device labels from NVML


class Scraper:
    """Runs one scrape at a time; scrapes that arrive meanwhile share its result."""

    def __init__(
        self,
        config: Config,
        *,
        gpu: Source | None,
        procs: Source,
        pods: PodSource | None,
        podresources: Source | None = None,
        docker: Source | None = None,
        resource_slices: Source | None = None,
        sources: Sequence[Source] = (),
        clock: Callable[[], float] = time.monotonic,
        own_procfs: str = OWN_PROCFS,
        own_cgroupfs: str = CGROUPFS,
    ) -> None:
        """The node's sources, each an ``enricher.sources.Source``; None switches one off (it
        is reported with enabled 0). ``docker``: name containers outside pods after Docker
        containers (Docker mode, for hosts without Kubernetes). ``sources``: more sources,
        read on every node read and reported like the others; nothing else uses their
        values. ``own_procfs``: the /proc whose ``self`` the process_* families describe (the
        enricher's own /proc, not --path.procfs); ``own_cgroupfs``: the cgroup filesystem its
        memory limit is read from (enricher.cgroupmem)."""
        self.config = config
        self.gpu = gpu
        self.procs = procs
        self.pods = pods
        self.podresources = podresources
        self.resource_slices = resource_slices
        self.docker = docker
        self._clock = clock
        # process_* and python_*, this Scraper's (never in prometheus_client's global registry).
        self._runtime = RuntimeFamilies(own_procfs)
        self._own_procfs = own_procfs
        self._own_cgroupfs = own_cgroupfs
        # The self-metrics that change once per collection (not per scrape), written once.
        self._tail_memo: _CollectionTail | None = None
        self._rewriter = Rewriter(watch=UPSTREAM_NAMES)
        self._identities: dict[DeviceKey, tuple[tuple[str, str], ...]] = {}
        self._inflight: asyncio.Future[ScrapeResult] | None = None
        self.upstream = UpstreamSource(
            self._upstream_url,
            timeout=config.upstream_timeout,
            max_bytes=config.upstream_max_bytes,
            missing=_missing_upstream(config, watching=pods is not None),
        )
        # One worker: NVML and procfs reads never overlap, and a hung NVML call cannot pile up
        # threads (the next scrape reports it busy instead). Daemon threads (enricher.worker):
        # a call that never returns cannot keep the process from exiting.
        self._gpu_worker = Worker("enricher-gpu")
        # The kubelet call has its own worker, so a slow kubelet never delays NVML. Its call
        # carries its own deadline; the margin only guards against a stuck thread.
        self._kubelet_worker = Worker("enricher-kubelet")
        self._extra_workers = [Worker(f"enricher-{s.name}") for s in sources]

        def measured(source: Source | None, name: str, **kw: Any) -> Measured:
            return Measured(source if source is not None else Off(name), clock=clock, **kw)

        # Every source, in the order of the dcgm_enricher_source_* series; the node side's
        # pipeline below says what each one's read depends on.
        self._upstream = measured(self.upstream, "upstream")
        self._nvml = measured(gpu, "nvml", worker=self._gpu_worker)
        self._procfs = measured(procs, "procfs", worker=self._gpu_worker)
        self._kubernetes = measured(pods, "kubernetes")
        self._podresources = measured(
            podresources,
            "podresources",
            worker=self._kubelet_worker,
            timeout=config.kubelet_timeout + 1.0,
        )
        self._docker = measured(docker, "docker")
        # After the kubelet's answer: asked only about the DRA devices it reported. It shares
        # the kubelet's worker, so a slow API server never delays NVML either.
        self._resource_slices = measured(
            resource_slices, "resourceslices", worker=self._kubelet_worker, timeout=10.0
        )
        self._extra = [
            measured(s, s.name, worker=w, timeout=config.scrape_timeout)
            for s, w in zip(sources, self._extra_workers, strict=True)
        ]
        self.sources: list[Measured] = [
            self._upstream,
            self._nvml,
            self._procfs,
            self._kubernetes,
            self._podresources,
            self._resource_slices,
            self._docker,
            *self._extra,
        ]
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
        self._node: Refresher[NodeView] | None = None
        if config.collect_interval > 0:
            self._node = Refresher(
                self._node_side, config.collect_interval, clock=clock, name="node"
            )
        elif self._aligned:
            # No loop of its own: each upstream collection refreshes it (see _prepare).
            self._node = Refresher(
                self._node_side,
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
        self._families_memo: tuple[NodeView, dict[DeviceKey, Any], str] | None = None
        self._head: Head | None = None
        self._gzip_wanted = False  # a scraper asked for gzip: compress each new head at once
        self.gzip_heads_total = 0
        self._options = RenderOptions(
            node_name=config.kube_node_name,
            label_keys=config.kube_pod_labels,
            annotation_keys=config.kube_pod_annotations,
            process_series=config.collector_process,
            docker=docker is not None,
        )
        # Energy per container, from each GPU's energy counter: advanced on every upstream
        # collection (when following) and every scrape; a repeated reading adds nothing.
        self._energy = EnergyLedger()
        # The label blocks of our own families (a set formatted once while it is in use, one
        # turn per collection) and the devices of the upstream's power lines (each head
        # parsed once): this Scraper's, so that another in the same process (tests, the
        # bench) neither turns nor fills them.
        self._label_sets = LabelSets()
        self._power_heads = HeadDevices()
        # The last collection accounted and the last power families written: a scrape of the
        # same collection (the same upstream text and node view) reuses them.
        self._power_memo: tuple[str | None, NodeView, list[DeviceDraw], Any] | None = None
        self._power_out_memo: _PowerOut | None = None

    async def close(self) -> None:
        """Stop the background work, then close every source (each bounded: a hung NVML call
        cannot hold up shutdown) and the workers."""
        if self._follower is not None:
            await self._follower.close()
        if self._node is not None:
            await self._node.close()
        await close_all(m.source for m in self.sources)
        for worker in (self._gpu_worker, self._kubelet_worker, *self._extra_workers):
            worker.close()
        self._rewrite_worker.close()

    def _aligned_max_age(self) -> float:
        """How old the node side may be when it is read after each upstream collection: one
        learnt collection interval (with slack) plus a step and the read itself; before the
        interval is learnt, the follower's coarse poll."""
        follower, node = self._follower, self._node
        if follower is None or node is None:
            return 0.0
        interval = follower.interval
        if interval is None:
            return follower.coarse
        return interval * 1.1 + follower.step + node.last_duration

    def start(self) -> None:
        """Start the background work (following the upstream, a --collect.interval loop) in the
        running event loop, so that the first scrape finds it under way; a no-op once it runs.
        A scrape starts it too."""
        if self._node is not None:
            self._node.start()
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
        if self.pods is None:
            return None
        for pod in self.pods.upstream_pods():
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
        last = self._head.text if self._head is not None else None
        if text is not None and last is not None and text is not last and text == last:
            return Outcome(last, answer.status)
        return answer

    async def _prepare(self, answer: Outcome[str | None]) -> None:
        """A new upstream collection: read the node side now when aligned with the upstream,
        rewrite the collection and encode it with the families (and gzip it, once a scraper
        asked for gzip), so scrapes get the cached results."""
        node = await (self._node.refresh() if self._aligned and self._node else self._node_view())
        head = await self._head_for(answer.value, node)
        if self._gzip_wanted:
            await self._gzip(head)

    async def _head_for(self, text: str | None, node: NodeView) -> Head:
        """The head for this upstream body and node view: the last one while neither changed
        (nor the device labels the families carry), else a new one."""
        head = self._head
        if (
            head is not None
            and head.text is text
            and head.node is node
            and head.identities == {**node.fallback, **self._identities}
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
        identities = {**node.fallback, **self._identities}
        families = self._families(node, identities, self._options)
        # The power split of this collection (its energy accounted once) and its families.
        power_body, power = self._power(
            text, rewritten.watched if rewritten is not None else (), node, identities
        )
        out = rewritten.text if rewritten is not None else None
        if (
            head is not None
            and head.rewritten is out
            and head.families == families
            and head.power_body == power_body
        ):
            # Read again (every scrape without following), but the same bytes: keep the
            # encoded body and its gzip.
            head.text, head.node, head.identities, head.power = text, node, identities, power
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
            (encoded, families.encode("utf-8"), power_body),
            rewritten.samples if rewritten is not None else 0,
            rewritten.invalid_lines + rewritten.dropped_duplicates if rewritten is not None else 0,
            out,
            families,
            power_body,
            power,
        )
        self._head = head
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
                self.gzip_heads_total += 1
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
        return await (self._node.get() if self._node is not None else self._node_side())

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

    async def _node_side(self) -> NodeView:
        """Read the node's sources and attribute: the kubelet at once, in its own worker;
        NVML, then procfs for NVML's PIDs (both bounded together by --scrape.timeout), then
        Docker for the containers procfs found outside pods; the pod index last."""
        kubelet_task = asyncio.create_task(
            self._podresources.read(default=ListResult(enabled=True))
        )
        extra_tasks = [asyncio.create_task(m.read(default=None)) for m in self._extra]
        limit = self.config.scrape_timeout
        nvml = await self._nvml.read(default=GpuSnapshot(), timeout=limit)
        snapshot = nvml.value
        pids = sorted({p.pid for p in snapshot.processes})
        no_procs: dict[int, ProcInfo | ProcError] = {}
        procfs = (
            await self._procfs.read(
                pids,
                snapshot.taken_at or None,
                default=no_procs,
                timeout=max(limit - nvml.status.duration_seconds, 0.0),
            )
            if pids
            else self._procfs.skip(no_procs)
        )
        # Asked on every read, even with no such process, so the source's health stays
        # current; None when there is no Docker source.
        no_answers: dict[str, DockerContainer | None] = {}
        docker = await self._docker.read(docker_lookup_ids(procfs.value), default=no_answers)
        containers = docker.value if self.docker is not None else None
        kubelet = await kubelet_task
        listed = kubelet.value
        slices = await self._resource_slices.read(
            dra_slice_keys(listed.allocations), default=SliceIndex()
        )
        kube = await self._kubernetes.read(default=PodIndex())
        index = kube.value
        attributions = attribute(snapshot, procfs.value, index, containers)
        slice_index = slices.value if isinstance(slices.value, SliceIndex) else SliceIndex()
        allocated, unmapped = resolve_allocations(listed.allocations, snapshot, slice_index.uuids)
        extra = [(await task).status for task in extra_tasks]
        return NodeView(
            snapshot=snapshot,
            statuses=[
                *(nvml.status, procfs.status, kube.status, kubelet.status),
                *(slices.status, docker.status),
                *extra,
            ],
            listed=listed,
            index=index,
            attributions=attributions,
            allocated=allocated,
            unmapped=len(unmapped),
            plan=plan_devices(
                attributions, allocated, index, frozenset(self.config.upstream_pod_labels)
            ),
            fallback=fallback_identity(snapshot, self.config.kube_node_name),
        )

    def _account_power(
        self, text: str | None, watched: tuple[WatchedLine, ...], node: NodeView
    ) -> tuple[list[DeviceDraw], dict[str, list[Part]]]:
        """Split each GPU's power for this collection and add its energy-counter increase to
        the containers (enricher.power); returns the draws and the parts. The same collection
        again is not accounted twice (it would add nothing: its energy reading is the same).
        ``watched``: the rewrite's lines of the upstream power families in ``text``."""
        memo = self._power_memo
        if memo is not None and memo[0] is text and memo[1] is node:
            return memo[2], memo[3]
        upstream = (
            upstream_power(watched, self._power_heads) if text is not None else UpstreamPower()
        )
        draws = choose_readings(upstream, node.snapshot)
        parts = split_power(node.snapshot, node.attributions, node.allocated, upstream.activity)
        self._energy.advance(draws, parts)
        self._power_memo = (text, node, draws, parts)
        return draws, parts

    def _power(
        self,
        text: str | None,
        watched: tuple[WatchedLine, ...],
        node: NodeView,
        identities: dict[DeviceKey, Any],
    ) -> tuple[bytes, PowerView]:
        """The power families of this scrape and their values for the node page."""
        draws, parts = self._account_power(text, watched, node)
        memo = self._power_out_memo
        if memo is not None and memo[0] is draws and memo[1] == identities:
            return memo[2], memo[3]
        container_watts, unattributed_watts = power_families(draws, parts)
        body = render_power(
            draws,
            parts,
            self._energy.totals,
            identities,
            families=(container_watts, unattributed_watts),
            label_sets=self._label_sets,
        ).encode("utf-8")
        view = PowerView(
            {d.gpu_uuid: d.power_watts for d in draws if d.power_watts is not None},
            container_watts,
            unattributed_watts,
        )
        self._power_out_memo = (draws, identities, body, view)
        return body, view

    def _families(
        self, node: NodeView, identities: dict[DeviceKey, Any], options: RenderOptions
    ) -> str:
        memo = self._families_memo
        if (
            memo is not None
            and memo[1] == identities
            and (
                memo[0] is node
                # A new read that found the same processes, owners and memory (a MIG node
                # has no per-process utilization; memory held by a training job rarely
                # moves): the same text, without rendering it again.
                or (
                    memo[0].attributions == node.attributions
                    and memo[0].allocated == node.allocated
                )
            )
        ):
            self._families_memo = (node, identities, memo[2])
            return memo[2]
        text = render_families(
            node.attributions, identities, options, node.allocated, self._label_sets
        )
        self._families_memo = (node, identities, text)
        return text

    async def _scrape_once(self) -> ScrapeResult:
        started = self._clock()
        upstream_task = asyncio.create_task(self._upstream_answer())
        node = await self._node_view()
        upstream = await upstream_task
        head = await self._head_for(upstream.value, node)
        samples, invalid_lines = head.samples, head.invalid_lines

        statuses = [upstream.status, *node.statuses]
        memo = self._tail_memo
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
            memo = self._tail_memo = _CollectionTail(
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
        """The self-metrics of one node view and upstream answer: those written before the
        per-scrape counters, and those after them (the order of the families on /metrics).
        ``memory_limit``: of the enricher's own cgroup (None: none, and no series)."""
        before = self_metrics(
            statuses,
            node.attributions,
            version=None,
            extra={
                "dcgm_enricher_upstream_samples": (
                    "Upstream samples passed through from the last upstream collection.",
                    "gauge",
                    samples,
                ),
                "dcgm_enricher_upstream_invalid_lines": (
                    "Upstream lines dropped from the last upstream collection because they were "
                    "not valid exposition (or repeated a series).",
                    "gauge",
                    invalid_lines,
                ),
            },
        )
        extra: dict[str, tuple[str, str, float]] = {}
        if self.pods is not None:
            extra["dcgm_enricher_kubernetes_pods"] = (
                "Pods of this node in the watch cache.",
                "gauge",
                len({p.uid for p in node.index.by_uid.values()}),
            )
        if self.podresources is not None:
            extra["dcgm_enricher_podresources_allocated_devices"] = (
                "GPU device IDs (or shared replicas) the kubelet reported allocated to containers "
                "in the last collection and that name a device of this node.",
                "gauge",
                len(node.allocated),
            )
            extra["dcgm_enricher_podresources_unmapped_devices"] = (
                "GPU device IDs the kubelet reported allocated in the last collection that name no "
                "GPU or MIG device NVML reported (unknown ID scheme, or NVML down), DRA devices no "
                "ResourceSlice gives such a UUID, or entries skipped as malformed; their "
                "containers get no gpu_container_allocated series.",
                "gauge",
                node.unmapped + node.listed.skipped,
            )
        if memory_limit is not None:
            extra["dcgm_enricher_memory_limit_bytes"] = (
                "The memory limit the kernel enforces on the enricher's own cgroup (its "
                "container's); absent when there is none.",
                "gauge",
                memory_limit,
            )
        return before, value_families(extra, version=__version__)

    def _scrape_metrics(self) -> MetricWriter:
        """The self-metrics that move with every scrape."""
        extra: dict[str, tuple[str, str, float]] = {
            "dcgm_enricher_upstream_requests_total": (
                "Requests sent to the upstream.",
                "counter",
                self.upstream.requests_total,
            ),
            "dcgm_enricher_upstream_collections_total": (
                "Upstream bodies that differed from the one before: dcgm-exporter's "
                "collections as the enricher saw them.",
                "counter",
                self.upstream_collections_total,
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
            "dcgm_enricher_node_page_requests_total": (
                "Requests for the node page (/) served; not scrapes, so not in "
                "dcgm_enricher_scrapes_total.",
                "counter",
                self.node_page_requests_total,
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
        writer = value_families(extra)
        name = "dcgm_enricher_response_bytes_total"
        writer.family(
            name,
            "Bytes of /metrics bodies sent, by Content-Encoding (gzip when the scraper "
            "accepts it); this scrape's own body counts on the next.",
            "counter",
        )
        for encoding, sent in self.response_bytes.items():
            writer.sample(name, (("encoding", encoding),), sent)
        return writer

    def _remember(self, seen: dict[DeviceKey, tuple[tuple[str, str], ...]]) -> None:
        """Keep the upstream's device labels so our families keep the same label set when the
        upstream is briefly down."""
        if len(self._identities) + len(seen) > MAX_IDENTITIES:
            self._identities.clear()
            if len(seen) > MAX_IDENTITIES:  # an upstream claiming absurdly many devices
                seen = dict(itertools.islice(seen.items(), MAX_IDENTITIES))
        self._identities.update(seen)


def _missing_upstream(config: Config, *, watching: bool) -> str:
    """Why no upstream URL is known in discovery mode: what was searched, and where."""
    target = discovery_target(
        config.upstream_pod_selector, config.upstream_pod_namespace, config.kube_node_name
    )
    if not watching:
        return f"no pod watch to find a {target}"
    return f"no {target} with a pod IP (--upstream.pod-selector, --upstream.pod-namespace)"


# --------------------------------------------------------------------------- HTTP


def parse_listen_address(addr: str) -> tuple[str | None, int]:
    """``:9401`` -> (None, 9401); ``127.0.0.1:9401``; ``[::1]:9401``; port 0 picks a free one.

    Raises ValueError.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"invalid listen address {addr!r}: want [host]:port")
    host = host.strip("[]")
    return (host or None), int(port)


def make_app(scraper: Scraper) -> web.Application:
    """The aiohttp application: /metrics, /healthz and the landing page."""
    app = web.Application(client_max_size=1024)

    async def metrics(request: web.Request) -> web.Response:
        result = await scraper.scrape()
        # The body depends on Accept-Encoding: caches must keep the two apart.
        headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            headers["Content-Encoding"] = "gzip"
            body = await scraper.gzip_body(result)
            scraper.response_bytes["gzip"] += len(body)
        else:
            body = result.body
            scraper.response_bytes["identity"] += len(body)
        return web.Response(body=body, headers=headers)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def landing(_request: web.Request) -> web.Response:
        from .landing import render_landing

        # Someone looking at the page behind a port-forward may have no Prometheus scraping
        # this node: refresh a view older than the page's own refresh period.
        scraper.node_page_requests_total += 1
        last = scraper.last
        if last is None or time.time() - last.finished_at > LANDING_MAX_AGE_SECONDS:
            await scraper.scrape(counted=False)
        return web.Response(
            text=render_landing(scraper.last, scraper.config), content_type="text/html"
        )

    async def on_startup(_app: web.Application) -> None:
        scraper.start()

    async def on_cleanup(_app: web.Application) -> None:
        await scraper.close()

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", landing)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def serve(
    app: web.Application,
    listen_address: str,
    *,
    max_header_bytes: int,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Start serving ``app``; returns the runner (call ``runner.cleanup()`` to stop)."""
    host, port = parse_listen_address(listen_address)
    runner = web.AppRunner(
        app,
        access_log=None,
        max_line_size=max_header_bytes,
        max_field_size=max_header_bytes,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host=host, port=port, ssl_context=ssl_context)
    await site.start()
    return runner
