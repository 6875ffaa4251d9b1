"""The node side of a collection: every source of the table (``sourcetable``), each read
through ``sources.MeasuredSource``, and one read of the node's into a :class:`NodeView` (who owns
each GPU process, what the kubelet allocated, the rewrite's plan)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .attribution import (
    AllocatedDevice,
    Attribution,
    attribute,
    device_taints,
    nvml_identities,
    plan_devices,
    resolve_allocations,
)
from .config import Config
from .labels import DeviceKey, RewritePlan
from .model import DeviceTaint, GpuSnapshot, PodIndex, PodInfo, SourceStatus
from .podresources import ListResult
from .resourceslices import SliceIndex
from .sources import MeasuredRead, MeasuredSource, Source, SwitchedOff
from .sourcetable import SOURCES, SourceEntry, check_table
from .worker import Worker


class PodSource(Source, Protocol):
    """The kubernetes source (kube.KubernetesSource, or a stand-in): besides the index it reads, the
    pods the upstream may be found in and when the watch last synced."""

    last_sync: float

    def index(self) -> PodIndex: ...

    def upstream_pods(self) -> list[PodInfo]: ...


@dataclass(frozen=True, slots=True)
class NodeView:
    """One read of the node: what the GPUs run and who owns it, and how each source did."""

    snapshot: GpuSnapshot
    statuses: list[SourceStatus]  # the node side's sources, in table order
    listed: ListResult
    index: PodIndex
    attributions: list[Attribution]
    allocated: list[AllocatedDevice]
    unmapped: int
    plan: RewritePlan
    # Device labels from NVML, for devices the upstream did not show (nvml_identities).
    nvml_identities: dict[DeviceKey, tuple[tuple[str, str], ...]]
    # The DRA driver's taints on each device (its ResourceSlices): gpu_device_taint.
    taints: dict[DeviceKey, tuple[DeviceTaint, ...]] = field(default_factory=dict)
    # Which read of the node this is (NodeSide counts them from 1): what a cache of the work
    # done on a node view is keyed by.
    number: int = 0


class NodeSide:
    """Every source of ``table``, measured (``sources`` in the table's order: the order of the
    dcgm_enricher_source_* series), and the read of the node side's."""

    def __init__(
        self,
        config: Config,
        sources: Mapping[str, Source | None],
        *,
        table: Sequence[SourceEntry] = SOURCES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sources``: by the table's names; a name left out or None is switched off (it is
        reported with enabled 0). Raises ValueError for a name the table does not have."""
        check_table(table)
        if unknown := sorted(set(sources) - {entry.name for entry in table}):
            raise ValueError(f"no such source in the table: {', '.join(unknown)}")
        self.config = config
        self.table = tuple(table)
        self._given = {name: source for name, source in sources.items() if source is not None}
        # One daemon thread per worker the table names (enricher.worker): a call that never
        # returns cannot keep the process from exiting. Each thread is named after the sources
        # it runs ("enricher-nvml-procfs").
        self._workers = {
            key: Worker("enricher-" + "-".join(e.name for e in table if e.worker == key))
            for key in dict.fromkeys(e.worker for e in table if e.worker is not None)
        }
        self.measured = {
            e.name: MeasuredSource(
                self._given.get(e.name) or SwitchedOff(e.name),
                worker=self._workers[e.worker] if e.worker is not None else None,
                clock=clock,
            )
            for e in table
        }
        self.sources: list[MeasuredSource] = [self.measured[e.name] for e in table]
        self._reads = itertools.count(1)

    def given(self, name: str) -> Source | None:
        """The source of that name (None: switched off)."""
        return self._given.get(name)

    def close_workers(self) -> None:
        for worker in self._workers.values():
            worker.close()

    async def read(self) -> NodeView:
        """Read the node side's sources, each as soon as those it depends on have answered
        (sourcetable), and attribute."""
        outcomes = await self.read_sources()
        values = {name: outcome.value for name, outcome in outcomes.items()}
        snapshot: GpuSnapshot = values["nvml"]
        listed: ListResult = values["podresources"]
        index: PodIndex = values["kubernetes"]
        # None without a Docker source: outside Docker mode nobody is named after Docker.
        containers = values["docker"] if self.given("docker") is not None else None
        attributions = attribute(snapshot, values["procfs"], index, containers)
        slices = values["resourceslices"]
        slice_index = slices if isinstance(slices, SliceIndex) else SliceIndex()
        allocated, unmapped = resolve_allocations(
            listed.allocations, snapshot, slice_index.uuids, slice_index.mig
        )
        return NodeView(
            snapshot=snapshot,
            statuses=[outcomes[e.name].status for e in self.table if e.node],
            listed=listed,
            index=index,
            attributions=attributions,
            allocated=allocated,
            unmapped=len(unmapped),
            plan=plan_devices(
                attributions,
                allocated,
                index,
                frozenset(self.config.upstream_pod_labels),
                node=self.config.node,
            ),
            nvml_identities=nvml_identities(snapshot, self.config.node),
            taints=device_taints(slice_index.taints, slice_index.uuids, snapshot),
            number=next(self._reads),
        )

    async def read_sources(self) -> dict[str, MeasuredRead[Any]]:
        """One read of every node-side source, each started once the sources it depends on
        have answered; all of them at once otherwise."""
        tasks: dict[str, asyncio.Task[MeasuredRead[Any]]] = {}
        spent: dict[str, float] = {}

        async def read(entry: SourceEntry) -> MeasuredRead[Any]:
            for name in (*entry.needs, *entry.after):
                await tasks[name]
            values = {name: tasks[name].result().value for name in entry.needs}
            measured = self.measured[entry.name]
            args = entry.args(values)
            if args is None:
                outcome: MeasuredRead[Any] = measured.skip(entry.default())
            else:
                outcome = await measured.read(
                    *args,
                    default=entry.default(),
                    timeout=entry.timeout(self.config, spent),
                )
            spent[entry.name] = outcome.status.duration_seconds
            return outcome

        for entry in self.table:
            if entry.node:
                tasks[entry.name] = asyncio.ensure_future(read(entry))
        try:
            await asyncio.gather(*tasks.values())
        finally:
            for task in tasks.values():
                task.cancel()
        return {name: task.result() for name, task in tasks.items()}
