"""The model of one collection, as the pipeline (``enricher.pipeline``) makes it and the node
page (``enricher.landing``) reads it: the head a scrape serves before its self-metrics, the
power split behind it, each device's memory from the upstream's framebuffer gauges (lines the
rewrite hands over, never the served bytes), and one scrape's result.

Nothing here does I/O; ``device_memory`` is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .attribution import AllocatedDevice, Attribution
from .compress import GzipHead
from .idle import IdleKey
from .labels import DeviceKey
from .memory import DeviceMemory, parse_device_memory
from .model import GpuSnapshot, SourceStatus
from .node import NodeView
from .power import Who
from .promclient import MetricWriter
from .sources import Outcome
from .textformat import WatchedLine

DeviceLabels = dict[DeviceKey, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class PowerView:
    """The power split of one collection, for the node page: watts per GPU, per container on a
    device key, and unattributed per (device key, reason)."""

    device_watts: dict[str, float]
    container_watts: dict[tuple[DeviceKey, Who], float]
    unattributed_watts: dict[tuple[DeviceKey, str], float]


@dataclass(slots=True)
class Head:
    """What a scrape serves before its self-metrics: the rewritten upstream collection and
    the enricher's families, the same for every scrape until the next collection (or node
    read), so it is encoded once, and gzipped at most once (``gzip``, when a scraper asks)."""

    text: str | None  # the upstream body it was made from (compared by identity)
    node: NodeView
    identities: DeviceLabels
    # The body in parts (the rewritten upstream, then each stage's chunk), encoded:
    # gzip reads them in turn and an identity body joins them with its tail, so the whole
    # body is never copied into one buffer of its own.
    chunks: tuple[bytes, ...]
    samples: int
    invalid_lines: int
    rewritten: str | None  # the rewritten upstream body (the Rewriter's, compared by identity)
    stage_chunks: tuple[bytes, ...]  # what the stages wrote after it (enricher.stages)
    power: PowerView | None  # the power split the power stage wrote them from
    watched: tuple[WatchedLine, ...] = ()  # the upstream's lines the rewrite handed over
    gzip: GzipHead | None = None
    memory: dict[DeviceKey, DeviceMemory] | None = None  # parse_device_memory(watched), once
    # When each container last used each device it holds, as the idle stage wrote it.
    last_active: Mapping[IdleKey, float] | None = None

    @property
    def size(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    def device_memory(self) -> dict[DeviceKey, DeviceMemory]:
        """Each device's memory, worked out once (for its unattributed parts, or the node
        page)."""
        if self.memory is None:
            self.memory = parse_device_memory(self.watched)
        return self.memory


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
        "last_active",
        "memory",
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
        identities: DeviceLabels | None = None,
        allocations: list[AllocatedDevice] | None = None,
        power: PowerView | None = None,
        head: Head | None = None,
        tail: bytes = b"",
        memory: dict[DeviceKey, DeviceMemory] | None = None,
        last_active: Mapping[IdleKey, float] | None = None,
    ) -> None:
        """``body`` None: ``head``'s chunks followed by ``tail``. ``memory``: each device's
        memory (None: the head's, from the lines the rewrite watched). ``last_active``: the
        idle ledger as the body writes it (None: the head's)."""
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
        self.memory = memory
        if last_active is None:
            last_active = head.last_active if head is not None else None
        self.last_active: Mapping[IdleKey, float] = last_active or {}

    @property
    def body(self) -> bytes:
        if self._body is None:
            chunks = self.head.chunks if self.head is not None else ()
            self._body = b"".join((*chunks, self.tail))
        return self._body

    def device_memory(self) -> dict[DeviceKey, DeviceMemory]:
        """Each device's memory in this collection, from the upstream's framebuffer gauges as
        the rewrite handed them over (the model, not the body)."""
        if self.memory is None:
            self.memory = self.head.device_memory() if self.head is not None else {}
        return self.memory


# --------------------------------------------------------------------------- the Scraper's cache
# of a collection's self-metrics (enricher.pipeline): a scrape of the same collection finds
# them instead of writing them again.


class CollectionTail(NamedTuple):
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
