"""The HTTP side: the scrape pipeline (sources -> pure enrichment -> text) and the aiohttp app."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from . import __version__
from .config import Config
from .enrich import (
    AllocatedDevice,
    Attribution,
    RenderOptions,
    attribute,
    docker_lookup_ids,
    fallback_identity,
    plan_devices,
    render_families,
    resolve_allocations,
    self_metrics,
)
from .episodes import EpisodeLog
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
from .promclient import OWN_PROCFS, LatestMetrics, make_registry, render_registry
from .refresh import Follower, Refresher
from .rewrite import Rewriter, RewriteResult
from .upstream import UpstreamError, fetch_upstream, url_for_pod_ip
from .worker import Worker

log = logging.getLogger("enricher")

LANDING_MAX_AGE_SECONDS = 15.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_IDENTITIES = 4096
# Upstream bodies up to this size are rewritten on the event loop (a few milliseconds at
# most: the template path does about 1 MiB in 2 ms); larger ones in the rewrite worker, so a
# body near --upstream.max-bytes never stalls /healthz or other scrapes (bench: loop part).
REWRITE_INLINE_MAX_CHARS = 1 << 20


class GpuSource(Protocol):
    """NVML or the demo's simulated GPUs."""

    errors_total: int

    def fetch(self) -> GpuSnapshot: ...


class ProcSource(Protocol):
    errors_total: int

    def read_many(
        self, pids: Sequence[int], listed_at: float | None = None
    ) -> dict[int, ProcInfo | ProcError]: ...


class PodSource(Protocol):
    """The pod watch (kube.PodCache) or the demo's fixed pod list."""

    up: bool
    errors_total: int
    last_sync: float

    def index(self) -> PodIndex: ...

    def upstream_pods(self) -> list[PodInfo]: ...


class AllocationSource(Protocol):
    """The kubelet PodResources source (podresources.PodResourcesSource)."""

    errors_total: int

    def fetch(self) -> ListResult: ...

    def close(self) -> None: ...


class ContainerSource(Protocol):
    """The Docker source (docker.DockerSource): container names by container ID."""

    up: bool
    enabled: bool
    errors_total: int

    async def lookup(self, container_ids: Sequence[str]) -> dict[str, DockerContainer | None]: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class ScrapeResult:
    body: bytes
    attributions: list[Attribution]
    snapshot: GpuSnapshot
    statuses: list[SourceStatus]
    finished_at: float
    identities: dict[DeviceKey, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    allocations: list[AllocatedDevice] = field(default_factory=list)


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


class Scraper:
    """Runs one scrape at a time; scrapes that arrive meanwhile share its result."""

    def __init__(
        self,
        config: Config,
        *,
        gpu: GpuSource | None,
        procs: ProcSource,
        pods: PodSource | None,
        podresources: AllocationSource | None = None,
        docker: ContainerSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        own_procfs: str = OWN_PROCFS,
    ) -> None:
        """``docker``: name containers outside pods after Docker containers (Docker mode, for
        hosts without Kubernetes); None reports the docker source disabled. ``own_procfs``:
        the /proc whose ``self`` the process_* families describe (the enricher's own /proc,
        not --path.procfs)."""
        self.config = config
        self.gpu = gpu
        self.procs = procs
        self.pods = pods
        self.podresources = podresources
        self.docker = docker
        self._clock = clock
        # The enricher's self-metrics, process_* and python_*: a registry per Scraper.
        self._latest = LatestMetrics()
        self.registry = make_registry(self._latest, own_procfs)
        self._rewriter = Rewriter()
        self._identities: dict[DeviceKey, tuple[tuple[str, str], ...]] = {}
        self._inflight: asyncio.Future[ScrapeResult] | None = None
        self._session: aiohttp.ClientSession | None = None
        # One worker: NVML and procfs reads never overlap, and a hung NVML call cannot pile up
        # threads (the next scrape reports it busy instead). Daemon threads (enricher.worker):
        # a call that never returns cannot keep the process from exiting.
        self._gpu_worker = Worker("enricher-gpu")
        # The kubelet call has its own worker, so a slow kubelet never delays NVML; the source
        # itself refuses to start a call while one is running.
        self._kubelet_worker = Worker("enricher-kubelet")
        self._kubelet_errors = 0  # calls abandoned here (the source counts its own failures)
        # Large rewrites, one at a time: the Rewriter's caches see one caller at a time, since
        # the loop rewrites inline only while this worker is idle.
        self._rewrite_worker = Worker("enricher-rewrite")
        self.upstream_errors = 0
        self.upstream_requests = 0
        self.scrapes_total = 0
        self.shared_scrapes_total = 0
        self.node_page_requests_total = 0  # GET /: reads the node too, but is not a scrape
        self.last: ScrapeResult | None = None
        self._last_duration = 0.0
        self._log_upstream = EpisodeLog("upstream", log)
        self._log_nvml = EpisodeLog("nvml", log)
        self._log_kubelet = EpisodeLog("podresources", log)
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
                key=lambda answer: answer[0],
                on_change=self._prepare,
                clock=clock,
                name="upstream",
            )
            if config.upstream_follow_step > 0
            else None
        )
        self._families_memo: tuple[NodeView, dict[DeviceKey, Any], str] | None = None

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.close()
        if self._node is not None:
            await self._node.close()
        if self._session is not None:
            await self._session.close()
        if self.docker is not None:
            await self.docker.close()
        self._gpu_worker.close()
        self._kubelet_worker.close()
        self._rewrite_worker.close()

    def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=True,
                connector=aiohttp.TCPConnector(limit=4),
            )
        return self._session

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

    async def _fetch_upstream(self) -> tuple[str | None, float]:
        start = self._clock()
        url = self._upstream_url()
        try:
            if url is None:
                raise UpstreamError("no_upstream_pod", "no matching dcgm-exporter pod on this node")
            self.upstream_requests += 1
            text = await fetch_upstream(
                self._session_get(),
                url,
                timeout=self.config.upstream_timeout,
                max_bytes=self.config.upstream_max_bytes,
            )
            self._log_upstream.ok()
            return text, self._clock() - start
        except UpstreamError as exc:
            self.upstream_errors += 1
            self._log_upstream.fail(f"{url}: {exc}")
            return None, self._clock() - start

    def _collect_gpu(
        self,
    ) -> tuple[GpuSnapshot, bool, float, dict[int, ProcInfo | ProcError], float]:
        """Blocking: NVML then procfs, in the worker thread."""
        snapshot = GpuSnapshot()
        nvml_ok = False
        t0 = self._clock()
        if self.gpu is not None:
            try:
                snapshot = self.gpu.fetch()
                nvml_ok = not snapshot.errors
                if snapshot.errors:
                    self._log_nvml.fail("; ".join(snapshot.errors))
                else:
                    self._log_nvml.ok()
            except Exception as exc:  # NvmlUnavailable, or anything a driver throws at us
                reason = getattr(exc, "reason", None)  # NvmlUnavailable's
                detail = str(exc) or type(exc).__name__
                self._log_nvml.fail(f"NVML unavailable ({reason}): {detail}" if reason else detail)
        t1 = self._clock()
        pids = sorted({p.pid for p in snapshot.processes})
        procs = self.procs.read_many(pids, listed_at=snapshot.taken_at or None) if pids else {}
        return snapshot, nvml_ok, t1 - t0, procs, self._clock() - t1

    async def _gpu_side(
        self,
    ) -> tuple[GpuSnapshot, bool, float, dict[int, ProcInfo | ProcError], float]:
        if not self._gpu_worker.idle:
            self._log_nvml.fail("previous NVML read still running")
            return GpuSnapshot(), False, 0.0, {}, 0.0
        try:
            return await self._gpu_worker.run(self._collect_gpu, self.config.scrape_timeout)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            self._log_nvml.fail(f"NVML/procfs read took over {self.config.scrape_timeout}s")
            return GpuSnapshot(), False, self.config.scrape_timeout, {}, 0.0

    async def _fetch_allocations(self) -> tuple[ListResult, float]:
        """One PodResources List call in the kubelet worker, bounded by --kubelet.timeout."""
        start = self._clock()
        source = self.podresources
        if source is None:
            return ListResult(enabled=False), 0.0
        if not self._kubelet_worker.idle:
            # Never queue a second call behind one that is stuck.
            self._kubelet_errors += 1
            result = ListResult(enabled=True, error="busy: the previous List call is still running")
            self._log_kubelet.fail(result.error)
            return result, self._clock() - start
        # The call carries its own deadline; this margin only guards against a stuck thread.
        limit = self.config.kubelet_timeout + 1.0
        try:
            result = await self._kubelet_worker.run(source.fetch, limit)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            self._kubelet_errors += 1
            result = ListResult(enabled=True, error=f"timeout: no answer within {limit:g}s")
        except Exception as exc:  # the source never raises; a bug must not fail the scrape
            self._kubelet_errors += 1
            result = ListResult(enabled=True, error=f"{type(exc).__name__}: {exc}")
        if result.ok:
            self._log_kubelet.ok()
        elif result.enabled:
            self._log_kubelet.fail(result.error)
        return result, self._clock() - start

    async def _lookup_containers(
        self, procs: dict[int, ProcInfo | ProcError]
    ) -> tuple[dict[str, DockerContainer | None] | None, float]:
        """The Docker source's answers for the containers of GPU processes outside pods (None
        when there is no Docker source), and the time it took. Asked on every scrape, even
        with no such process, so the source's health stays current."""
        if self.docker is None:
            return None, 0.0
        start = self._clock()
        try:
            answers = await self.docker.lookup(docker_lookup_ids(procs))
        except Exception as exc:  # the source never raises; a bug must not fail the scrape
            log.warning("docker: lookup failed: %s: %s", type(exc).__name__, exc)
            answers = {}
        return answers, self._clock() - start

    async def _prepare(self, answer: tuple[str | None, float]) -> None:
        """A new upstream collection: read the node side now when aligned with the upstream,
        and rewrite the collection, so scrapes get the cached results."""
        node = await (self._node.refresh() if self._aligned and self._node else self._node_view())
        text = answer[0]
        if text is not None:
            rewritten, _ = await self._rewrite(text, node.plan, encode=False)
            self._remember(rewritten.identities)

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

    async def _upstream(self) -> tuple[str | None, float]:
        if self._follower is not None:
            answer, _polled_at = await self._follower.latest()
            if answer[0] is None:
                # A failure is never served from the cache: while the upstream is down (or not
                # found yet), every scrape asks again, as without following.
                await self._follower.poll_once()
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
            plan=plan_devices(
                attributions, allocated, index, frozenset(self.config.upstream_pod_labels)
            ),
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
        node = await self._node_view()
        text, upstream_dur = await upstream_task

        parts: list[bytes] = []
        invalid_lines = samples = 0
        if text is not None:
            rewritten, encoded = await self._rewrite(text, node.plan, encode=True)
            parts.append(encoded)
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
        parts.append(self._families(node, identities, options).encode("utf-8"))

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
        self._latest.current = self_metrics(
            statuses, node.attributions, version=__version__, extra=extra
        )
        parts.append(render_registry(self.registry))
        body = b"".join(parts)
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

    def _remember(self, seen: dict[DeviceKey, tuple[tuple[str, str], ...]]) -> None:
        """Keep the upstream's device labels so our families keep the same label set when the
        upstream is briefly down."""
        if len(self._identities) + len(seen) > MAX_IDENTITIES:
            self._identities.clear()
            if len(seen) > MAX_IDENTITIES:  # an upstream claiming absurdly many devices
                seen = dict(itertools.islice(seen.items(), MAX_IDENTITIES))
        self._identities.update(seen)


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

    async def metrics(_request: web.Request) -> web.Response:
        result = await scraper.scrape()
        return web.Response(body=result.body, headers={"Content-Type": CONTENT_TYPE})

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
