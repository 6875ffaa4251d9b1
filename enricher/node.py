"""The node side of a collection: the node's sources, each read through ``sources.Measured``,
and one read of them into a :class:`NodeView` (who owns each GPU process, what the kubelet
allocated, the rewrite's plan)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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
from .config import Config
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
from .resourceslices import SliceIndex
from .sources import Measured, Off, Source
from .worker import Worker


class PodSource(Source, Protocol):
    """The kubernetes source (kube.PodCache, or a stand-in): besides the index it reads, the
    pods the upstream may be found in and when the watch last synced."""

    last_sync: float

    def index(self) -> PodIndex: ...

    def upstream_pods(self) -> list[PodInfo]: ...


@dataclass(frozen=True, slots=True)
class NodeView:
    """One read of the node: what the GPUs run and who owns it, and how each source did."""

    snapshot: GpuSnapshot
    statuses: list[SourceStatus]  # the node side's sources, in NodeSide.sources order
    listed: ListResult
    index: PodIndex
    attributions: list[Attribution]
    allocated: list[AllocatedDevice]
    unmapped: int
    plan: RewritePlan
    fallback: dict[DeviceKey, tuple[tuple[str, str], ...]]  # device labels from NVML


class NodeSide:
    """The node's sources, measured, and the read that turns them into a :class:`NodeView`."""

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
    ) -> None:
        self.config = config
        self.gpu = gpu
        self.procs = procs
        self.pods = pods
        self.podresources = podresources
        self.resource_slices = resource_slices
        self.docker = docker
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
        # In the order of the dcgm_enricher_source_* series (after the upstream's).
        self.sources: list[Measured] = [
            self._nvml,
            self._procfs,
            self._kubernetes,
            self._podresources,
            self._resource_slices,
            self._docker,
            *self._extra,
        ]

    def close_workers(self) -> None:
        for worker in (self._gpu_worker, self._kubelet_worker, *self._extra_workers):
            worker.close()

    async def read(self) -> NodeView:
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
