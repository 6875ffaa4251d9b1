"""The stages of a collection: each reads the collection and writes its part of the body.

A :class:`Collection` is what every stage reads: the upstream's body (as the rewrite handed
its watched lines over), one read of the node, the device labels the families carry, each
device's memory and the upstream's power readings. Each stage says what it reads
(:meth:`Stage.reads`) and writes its chunk (:meth:`Stage.write`); the pipeline
(``enricher.pipeline``) keeps each stage's last chunk and runs the stage again only when what
it reads differs from its last run (one rule for every stage, by equality). The order of
``make_stages``'s list is the order of the chunks in /metrics, after the rewritten upstream body.

A new stage is one class here and one entry in :func:`make_stages` (docs/architecture.md has
a worked example, which tests/test_stages.py runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from .collection import DeviceLabels, PowerView
from .families import RenderOptions, render_families
from .idle import IdleKey, IdleLedger, render_last_active
from .labels import DeviceKey
from .memory import DeviceMemory
from .nodeside import NodeView
from .power import (
    DeviceDraw,
    EnergyLedger,
    Part,
    UpstreamPower,
    choose_readings,
    power_families,
    render_power,
    split_power,
)
from .promclient import LabelSets


@dataclass(frozen=True, slots=True, eq=False)
class Collection:
    """One upstream body (None: the upstream did not answer) and one read of the node, with
    what the stages read of them, worked out once."""

    text: str | None
    node: NodeView
    identities: DeviceLabels
    memory: dict[DeviceKey, DeviceMemory]
    # The parts of each device's memory that no listed process holds (memory.memory_parts).
    memory_parts: dict[tuple[DeviceKey, str], float]
    readings: UpstreamPower  # the upstream's power, energy and per-instance activity


@dataclass(frozen=True, slots=True)
class Chunk:
    """A stage's part of the body, and what the node page reads of it (``view``)."""

    body: bytes
    view: PowerView | None = None
    # The idle ledger as this chunk wrote it (gpu_container_last_active_timestamp_seconds).
    last_active: Mapping[IdleKey, float] | None = None


class Stage(Protocol):
    """One part of the body. ``reads``: what the stage reads of a collection, compared by
    equality with its last run's to decide whether it runs again. ``write``: its chunk."""

    name: str

    def reads(self, c: Collection) -> tuple[object, ...]: ...

    def write(self, c: Collection) -> Chunk: ...


class ContainerFamiliesStage:
    """gpu_container_*, gpu_process_*, gpu_unattributed_memory_*, gpu_pod_info and the other
    families of an attribution (``families``). A new node read that found the same processes,
    owners, allocations, taints and memory (a MIG node has no per-process utilization; memory
    held by a training job rarely moves) writes nothing new."""

    name = "container-families"

    def __init__(self, options: RenderOptions, label_sets: LabelSets) -> None:
        self._options = options
        self._label_sets = label_sets

    def reads(self, c: Collection) -> tuple[object, ...]:
        node = c.node
        return (node.attributions, node.allocated, node.taints, c.identities, c.memory_parts)

    def write(self, c: Collection) -> Chunk:
        node = c.node
        text = render_families(
            node.attributions,
            c.identities,
            self._options,
            node.allocated,
            self._label_sets,
            node.taints,
            c.memory_parts,
        )
        return Chunk(text.encode("utf-8"))


class PowerStage:
    """gpu_container_power_watts, gpu_unattributed_power_watts and
    gpu_container_energy_joules_total (``power``). Each collection (upstream body and node
    read) is accounted once: its power split, and its energy-counter increase added to the
    containers; the same collection again adds nothing."""

    name = "power"

    def __init__(self, label_sets: LabelSets) -> None:
        self._label_sets = label_sets
        self.energy = EnergyLedger()
        # The last collection accounted: (its upstream body, its node read), and what came out.
        self.accounted: tuple[str | None, NodeView, list[DeviceDraw], dict[str, list[Part]]] | None
        self.accounted = None

    def reads(self, c: Collection) -> tuple[object, ...]:
        return (c.text, c.node, c.identities)

    def account(self, c: Collection) -> tuple[list[DeviceDraw], dict[str, list[Part]]]:
        last = self.accounted
        if last is not None and last[0] == c.text and last[1] == c.node:
            return last[2], last[3]
        node = c.node
        draws = choose_readings(c.readings, node.snapshot)
        parts = split_power(node.snapshot, node.attributions, node.allocated, c.readings.activity)
        self.energy.advance(draws, parts, answered=node.snapshot.taken_at > 0)
        self.accounted = (c.text, node, draws, parts)
        return draws, parts

    def write(self, c: Collection) -> Chunk:
        draws, parts = self.account(c)
        container_watts, unattributed_watts = power_families(draws, parts)
        body = render_power(
            draws,
            parts,
            self.energy.totals,
            c.identities,
            families=(container_watts, unattributed_watts),
            label_sets=self._label_sets,
        ).encode("utf-8")
        view = PowerView(
            {d.gpu_uuid: d.power_watts for d in draws if d.power_watts is not None},
            container_watts,
            unattributed_watts,
        )
        return Chunk(body, view)


class IdleStage:
    """gpu_container_last_active_timestamp_seconds (``idle``): when each container last used
    each device it holds, advanced once per collection."""

    name = "idle"

    def __init__(self, threshold: float, label_sets: LabelSets) -> None:
        self._label_sets = label_sets
        self.ledger = IdleLedger(threshold)
        self._advanced: tuple[str | None, NodeView] | None = None

    def reads(self, c: Collection) -> tuple[object, ...]:
        return (c.text, c.node, c.identities)

    def write(self, c: Collection) -> Chunk:
        last = self._advanced
        if last is None or last[0] != c.text or last[1] != c.node:
            node = c.node
            self.ledger.advance(
                node.snapshot.taken_at, node.attributions, node.allocated, c.readings.activity
            )
            self._advanced = (c.text, node)
        last_active = self.ledger.last_active  # replaced, never changed, on each advance
        body = render_last_active(last_active, c.identities, self._label_sets)
        return Chunk(body.encode("utf-8"), last_active=last_active)


def make_stages(
    options: RenderOptions, idle_threshold: float, label_sets: LabelSets
) -> list[Stage]:
    """One Scraper's stages, in the order of their chunks (each holds its own ledger)."""
    return [
        ContainerFamiliesStage(options, label_sets),
        PowerStage(label_sets),
        IdleStage(idle_threshold, label_sets),
    ]
