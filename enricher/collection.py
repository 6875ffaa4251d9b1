"""The model of one collection, as the pipeline (``enricher.pipeline``) makes it and the node
page (``enricher.landing``) reads it: the body every scrape of the collection shares, the power
split behind it, each device's memory from the upstream's framebuffer gauges (lines the rewrite
hands over, never the served bytes), and one scrape's result. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from .attribution import AllocatedDevice, Attribution
from .idle import IdleKey
from .labels import DeviceKey
from .memory import DeviceMemory
from .model import GpuSnapshot, SourceStatus
from .nodeside import NodeView
from .power import Who
from .readings import Contract

DeviceLabels = dict[DeviceKey, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class PowerView:
    """The power split of one collection, for the node page: watts per GPU, per container on a
    device key, and unattributed per (device key, reason)."""

    device_watts: dict[str, float]
    container_watts: dict[tuple[DeviceKey, Who], float]
    unattributed_watts: dict[tuple[DeviceKey, str], float]


@dataclass(frozen=True, slots=True)
class CollectionBody:
    """The part of the body every scrape of one collection serves (all but the per-scrape
    self-metrics): the rewritten upstream collection and the enricher's families, encoded
    once. ``number`` names the bytes: a body made again from a newer read that came out the
    same keeps it, so what was made from the bytes (their gzip, on the HTTP side) is kept too.
    """

    number: int
    text: str | None  # the upstream body it was made from
    node: NodeView
    identities: DeviceLabels
    # The body in parts (the rewritten upstream, then each stage's chunk), encoded:
    # gzip reads them in turn and an identity body joins them with its tail, so the whole
    # body is never copied into one buffer of its own.
    chunks: tuple[bytes, ...]
    samples: int
    invalid_lines: int
    rewritten: str | None  # the rewritten upstream body
    stage_chunks: tuple[bytes, ...]  # what the stages wrote after it (enricher.stages)
    power: PowerView | None  # the power split the power stage wrote them from
    memory: dict[DeviceKey, DeviceMemory]  # each device's memory (enricher.memory)
    # When each container last used each device it holds, as the idle stage wrote it.
    last_active: Mapping[IdleKey, float]

    @property
    def size(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


@dataclass(frozen=True)
class ScrapeResult:
    """One scrape: what was served and what the node looked like. The identity body is
    ``shared``'s chunks followed by ``tail`` (this scrape's self-metrics), joined when first
    asked for: a scrape served with gzip never copies the whole body."""

    attributions: list[Attribution]
    snapshot: GpuSnapshot
    statuses: list[SourceStatus]
    finished_at: float
    identities: DeviceLabels
    allocations: list[AllocatedDevice]
    power: PowerView | None
    # Each device's memory, from the upstream's framebuffer gauges as the rewrite handed them
    # over (the model, not the body).
    memory: dict[DeviceKey, DeviceMemory]
    shared: CollectionBody
    tail: bytes
    # The idle ledger as the body writes it (gpu_container_last_active_timestamp_seconds).
    last_active: Mapping[IdleKey, float]
    # What the last upstream body said of dcgm-exporter's contract (enricher.readings).
    contract: Contract

    @cached_property
    def body(self) -> bytes:
        return b"".join((*self.shared.chunks, self.tail))
