"""Power and energy per container: each GPU's draw split between the containers on it.

Pure: the readings come in (the upstream body's, in SI units: enricher.readings; NVML's
snapshot), shares and exposition go out. ``upstream_power`` takes the three upstream fields it
needs from the body's readings, ``choose_readings`` prefers the upstream's reading of a GPU to
NVML's, ``split_power`` decides each container's share of each GPU, ``EnergyLedger`` adds each GPU's
energy-counter increase to the containers by those shares, and ``render_power`` writes the
families. docs/power.md states the rules and
where they are an estimate.

Invariant: for every GPU with a power reading, the shares ``split_power`` returns add up to 1,
so the containers' watts plus the unattributed watts are the device's watts.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .attribution import REASON_MPS_SERVER, AllocatedDevice, Attribution, attributed_to
from .families import NO_POD, device_labels
from .labels import DeviceKey
from .model import GpuSnapshot, PowerReading
from .promclient import LabelSets, MetricWriter
from .readings import UpstreamReadings
from .textformat import cut_values

POWER = "gpu_container_power_watts"
ENERGY = "gpu_container_energy_joules_total"
UNATTR_POWER = "gpu_unattributed_power_watts"

# The share of a device with no (workload) process and no allocation.
REASON_IDLE = "idle"

# Where a reading came from; an energy baseline is only compared with a reading of its source.
SOURCE_UPSTREAM = "upstream"
SOURCE_NVML = "nvml"

# Bounds on what a hostile or broken upstream can make us keep.
_MIG_SLICES = re.compile(r"(\d{1,2})g\.")

Who = tuple[str, str, str]  # (namespace, pod, container) as written


@dataclass(frozen=True, slots=True)
class UpstreamPower:
    """The upstream's power fields on one collection, in SI units: per GPU UUID (the
    device-level series, without ``GPU_I_ID``) and, for activity (0..1), per device key."""

    power_watts: Mapping[str, float] = field(default_factory=dict)
    energy_joules: Mapping[str, float] = field(default_factory=dict)
    activity: Mapping[DeviceKey, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeviceDraw:
    """What one GPU draws on this collection, and where each reading came from."""

    gpu_uuid: str
    power_watts: float | None
    power_source: str
    energy_joules: float | None  # the GPU's energy counter (since the driver loaded)
    energy_source: str


@dataclass(frozen=True, slots=True)
class Part:
    """A share of one GPU's power: a container's (``who``) or an unattributed one (``reason``),
    on the device key whose labels it is written with (the GPU, or one of its MIG instances)."""

    key: DeviceKey
    who: Who | None
    reason: str
    share: float  # of the whole GPU's power, 0..1
    rule: str  # which split rule gave it: one of the RULE_* names


# The rules split_power applies, as they appear in Part.rule (and on the node page).
RULE_OWNER = "one owner"
RULE_SM = "SM time"
RULE_MEMORY = "memory held"
RULE_EQUAL = "equal per process"
RULE_ALLOCATED = "allocation"
RULE_IDLE = "idle"


# --------------------------------------------------------------------------- parsing


def upstream_power(readings: UpstreamReadings) -> UpstreamPower:
    """The power, energy and per-instance activity of one body's readings
    (enricher.readings): power and energy are device fields, each GPU's own reading (its MIG
    instances' first copy where the upstream writes them only per ``GPU_I_ID``); activity is
    per device key."""
    return UpstreamPower(
        readings.per_gpu("power"), readings.per_gpu("energy"), readings.of("gr_engine_active")
    )


def choose_readings(upstream: UpstreamPower, snapshot: GpuSnapshot) -> list[DeviceDraw]:
    """Each NVML GPU's draw: the upstream's reading of it where the upstream has one (it is
    what users already chart), NVML's otherwise, per reading. GPUs NVML did not list are left
    out: without their processes there is nothing to split."""
    nvml = {r.gpu_uuid: r for r in snapshot.power}
    out = []
    for dev in snapshot.devices:
        own = nvml.get(dev.uuid, PowerReading(dev.uuid, None, None))
        up_w = upstream.power_watts.get(dev.uuid)
        up_e = upstream.energy_joules.get(dev.uuid)
        own_e = None if own.energy_millijoules is None else own.energy_millijoules / 1000.0
        out.append(
            DeviceDraw(
                dev.uuid,
                up_w if up_w is not None else own.power_watts,
                SOURCE_UPSTREAM if up_w is not None else SOURCE_NVML,
                up_e if up_e is not None else own_e,
                SOURCE_UPSTREAM if up_e is not None else SOURCE_NVML,
            )
        )
    return out


# --------------------------------------------------------------------------- the split


def mig_slices(profile: str) -> int | None:
    """The compute slices of a GPU instance profile ("3g.40gb" -> 3), None when unknown."""
    m = _MIG_SLICES.match(profile)
    return int(m.group(1)) if m is not None and int(m.group(1)) > 0 else None


def who_of(a: Attribution) -> Who | None:
    """The (namespace, pod, container) a process's power goes to, cut as the labels are
    written, so two names that only differ past the cut are one container; None when the
    process is unattributed."""
    who = attributed_to(a)
    return None if who is None else cut_values(who)


def split_power(
    snapshot: GpuSnapshot,
    attributions: Sequence[Attribution],
    allocated: Sequence[AllocatedDevice] = (),
    activity: Mapping[DeviceKey, float] | None = None,
) -> dict[str, list[Part]]:
    """Each NVML GPU's parts, by GPU UUID; every GPU's shares add up to 1.

    A MIG GPU is first split between its GPU instances: by ``activity`` times the instance's
    slices where every instance has an activity (dcgm-exporter's GR_ENGINE_ACTIVE per
    ``GPU_I_ID``) and one is active, by slices otherwise (equally when a profile does not say
    its slices). Each scope (a full GPU, or one instance with its part) is then split:

    - workload processes (MPS daemons are not workloads) of one container: all of it;
    - processes of several containers, or any unattributed one: by SM time (NVML's per-process
      utilization since the previous read, the window of gpu_container_utilization_ratio)
      when known and some process is active; else by memory held; else equally per process;
      an unattributed process's share carries its reason;
    - no workload process, allocated by the kubelet: between the containers it is allocated
      to, per replica each holds;
    - neither: unattributed, reason ``idle``.
    """
    acts = activity or {}
    procs: dict[DeviceKey, list[Attribution]] = defaultdict(list)
    for a in attributions:
        if a.reason != REASON_MPS_SERVER:
            procs[a.device_key].append(a)
    allocs: dict[DeviceKey, list[AllocatedDevice]] = defaultdict(list)
    for d in allocated:
        allocs[d.key].append(d)
    instances: dict[str, dict[int, str]] = defaultdict(dict)
    for m in snapshot.migs:
        instances[m.gpu_uuid].setdefault(m.gi_id, m.profile)
    out: dict[str, list[Part]] = {}
    for dev in snapshot.devices:
        gis = instances.get(dev.uuid, {}) if dev.mig_enabled else {}
        if not gis:
            key = (dev.uuid, "")
            out[dev.uuid] = _split_scope(key, 1.0, procs.get(key, []), allocs.get(key, []))
            continue
        parts: list[Part] = []
        weights = _instance_weights(dev.uuid, gis, acts)
        for gi, weight in weights.items():
            key = (dev.uuid, str(gi))
            parts += _split_scope(key, weight, procs.get(key, []), allocs.get(key, []))
        out[dev.uuid] = parts
    return out


def _instance_weights(
    uuid: str, gis: Mapping[int, str], activity: Mapping[DeviceKey, float]
) -> dict[int, float]:
    slices = {gi: mig_slices(profile) for gi, profile in gis.items()}
    size = {gi: float(s) if s is not None else 1.0 for gi, s in slices.items()}
    if any(s is None for s in slices.values()):
        size = dict.fromkeys(gis, 1.0)
    acts = [activity.get((uuid, str(gi))) for gi in gis]
    if all(x is not None for x in acts):
        busy = {gi: size[gi] * (activity[(uuid, str(gi))]) for gi in gis}
        total = sum(busy.values())
        if total > 0:
            return {gi: w / total for gi, w in busy.items()}
    total = sum(size.values())
    return {gi: w / total for gi, w in size.items()}


def _split_scope(
    key: DeviceKey,
    weight: float,
    procs: Sequence[Attribution],
    allocs: Sequence[AllocatedDevice],
) -> list[Part]:
    if procs:
        groups = [(w, a.reason if w is None else "", a) for a in procs for w in (who_of(a),)]
        owners = {g[0] for g in groups}
        if len(owners) == 1 and None not in owners:
            return [Part(key, groups[0][0], "", weight, RULE_OWNER)]
        sm = [a.process.sm_util_ratio for a in procs]
        if all(x is not None for x in sm) and sum(x or 0.0 for x in sm) > 0:
            rule, values = RULE_SM, [max(0.0, x or 0.0) for x in sm]
        else:
            mem = [max(0, a.process.used_memory_bytes or 0) for a in procs]
            if sum(mem) > 0:
                rule, values = RULE_MEMORY, [float(m) for m in mem]
            else:
                rule, values = RULE_EQUAL, [1.0] * len(procs)
        total = sum(values)
        merged: dict[tuple[Who | None, str], float] = {}
        for (who, reason, _a), v in zip(groups, values, strict=True):
            merged[(who, reason)] = merged.get((who, reason), 0.0) + v / total
        return [Part(key, who, reason, weight * s, rule) for (who, reason), s in merged.items()]
    if allocs:
        held: dict[Who, int] = {}
        for d in allocs:
            who = cut_values((d.namespace, d.pod, d.container))
            held[who] = held.get(who, 0) + 1
        count = sum(held.values())
        return [Part(key, who, "", weight * n / count, RULE_ALLOCATED) for who, n in held.items()]
    return [Part(key, None, REASON_IDLE, weight, RULE_IDLE)]


# --------------------------------------------------------------------------- energy


EnergyKey = tuple[DeviceKey, str, str, str]  # (device key, namespace, pod, container)


class EnergyLedger:
    """Energy per container since the enricher first saw it on a device, from each GPU's own
    energy counter (never from integrating sampled power).

    On each ``advance``, a GPU's counter increase since its previous reading is split by the
    shares of that collection. The rules for the counter: the first reading (and the first
    after the reading's source changes between the upstream and NVML) is only a baseline; a
    reading below the previous one is a reset (a driver reload, a GPU reset): that interval
    counts nothing and the new reading is the baseline; an equal one adds nothing. A
    container that has no part on its GPU any more leaves the ledger (a later return starts
    again from 0, which Prometheus reads as a counter reset); while it stays, its total never
    decreases. A GPU NVML does not list leaves the ledger, containers and baseline, when NVML
    listed other GPUs or ``answered`` (a GPU unbound or lost, the node's only one included);
    a collection without NVML's answer (NVML down) keeps everything, so a brief NVML failure
    neither resets nor double-counts. A GPU whose energy counter was never read has no
    entries.
    """

    def __init__(self) -> None:
        self.totals: dict[EnergyKey, float] = {}
        self._baseline: dict[str, tuple[str, float]] = {}  # GPU uuid -> (source, J)

    def advance(
        self,
        draws: Iterable[DeviceDraw],
        parts: Mapping[str, Sequence[Part]],
        *,
        answered: bool = False,
    ) -> None:
        """Account one collection: ``draws`` from ``choose_readings``, ``parts`` from
        ``split_power``; ``answered``: NVML answered this collection (its snapshot was read)."""
        seen: set[str] = set()
        for draw in draws:
            uuid = draw.gpu_uuid
            seen.add(uuid)
            gpu_parts = parts.get(uuid, ())
            present = {(p.key, *p.who) for p in gpu_parts if p.who is not None}
            for k in [k for k in self.totals if k[0][0] == uuid and k not in present]:
                del self.totals[k]
            if draw.energy_joules is None and uuid not in self._baseline:
                continue  # no energy counter: nothing to count, no series
            for k in present:
                self.totals.setdefault(k, 0.0)
            delta_j = self._increase(uuid, draw)
            if delta_j <= 0.0:
                continue
            for p in gpu_parts:
                if p.who is not None:
                    k = (p.key, *p.who)
                    self.totals[k] += delta_j * p.share
        if seen or answered:
            for k in [k for k in self.totals if k[0][0] not in seen]:
                del self.totals[k]
            for uuid in [u for u in self._baseline if u not in seen]:
                del self._baseline[uuid]

    def _increase(self, uuid: str, draw: DeviceDraw) -> float:
        """Joules since the previous reading; 0 for a baseline, a reset, or no reading."""
        now = draw.energy_joules
        if now is None:
            return 0.0
        before = self._baseline.get(uuid)
        self._baseline[uuid] = (draw.energy_source, now)
        if before is None or before[0] != draw.energy_source or now < before[1]:
            return 0.0
        return now - before[1]


# --------------------------------------------------------------------------- exposition


def power_families(
    draws: Sequence[DeviceDraw], parts: Mapping[str, Sequence[Part]]
) -> tuple[dict[tuple[DeviceKey, Who], float], dict[tuple[DeviceKey, str], float]]:
    """Container watts and unattributed watts by their series, for GPUs with a power reading."""
    watts = {d.gpu_uuid: d.power_watts for d in draws if d.power_watts is not None}
    container: dict[tuple[DeviceKey, Who], float] = defaultdict(float)
    unattr: dict[tuple[DeviceKey, str], float] = defaultdict(float)
    for uuid, w in watts.items():
        for p in parts.get(uuid, ()):
            if p.who is not None:
                container[(p.key, p.who)] += p.share * w
            else:
                unattr[(p.key, p.reason)] += p.share * w
    return dict(container), dict(unattr)


def render_power(
    draws: Sequence[DeviceDraw],
    parts: Mapping[str, Sequence[Part]],
    ledger: Mapping[EnergyKey, float],
    identities: Mapping[DeviceKey, tuple[tuple[str, str], ...]],
    families: tuple[Mapping[tuple[DeviceKey, Who], float], Mapping[tuple[DeviceKey, str], float]]
    | None = None,
    label_sets: LabelSets | None = None,
) -> str:
    """The three power families (HELP and TYPE even when empty). ``families``: what
    :func:`power_families` gives for ``draws`` and ``parts``, when the caller has it;
    ``label_sets``: the caller's label memo (MetricWriter.render)."""
    w = MetricWriter()
    w.family(
        POWER,
        "A container's share of its GPU's power draw, in watts: all of it for the only "
        "workload on the device, else by SM time, memory held or allocation (docs/power.md).",
    )
    w.family(
        ENERGY,
        "Energy attributed to a container on a GPU or MIG instance since the enricher first "
        "saw it there, in joules: the GPU's own energy counter's increase, split as its power.",
        "counter",
    )
    w.family(
        UNATTR_POWER,
        "The part of a GPU's power draw no container gets, in watts, by reason: an "
        "unattributed process's reason, or idle (no process, no allocation).",
    )

    def ident(key: DeviceKey) -> tuple[tuple[str, str], ...]:
        return device_labels(identities, key)

    container, unattr = families if families is not None else power_families(draws, parts)
    for (key, who), value in sorted(container.items()):
        labels = (*ident(key), ("namespace", who[0]), ("pod", who[1]), ("container", who[2]))
        w.sample(POWER, labels, value)
    for ek in sorted(ledger):
        key, ns, pod, c = ek
        labels = (*ident(key), ("namespace", ns), ("pod", pod), ("container", c))
        w.sample(ENERGY, labels, ledger[ek])
    for (key, reason), value in sorted(unattr.items()):
        w.sample(UNATTR_POWER, (*ident(key), *NO_POD, ("reason", reason)), value)
    return w.render(label_sets)
