"""Each collection's upstream body, read once into device readings in SI units.

Pure. The rewrite hands over the sample lines of every name the readers' fields have in any
naming (``WATCH_NAMES``), and :func:`read_upstream` turns them into one
:class:`UpstreamReadings`: per device key (GPU UUID, ``GPU_I_ID``), per field of the table
(enricher.fieldtable), the value in the field's SI unit, whatever release wrote it. The memory
split, the power split, the energy ledger and the idle ledger read those, never a name or a
unit. The same call recognises the naming the body speaks from its family names, counts the
DCGM fields the table does not know (they pass through untouched), and names the fields the
product needs that the body has under no name the table knows (a future rename, or a counters
file without them): what ``dcgm_enricher_upstream_*`` and the node page report.

Which line holds a device's value: the device's own series (one that names no pod) where the
upstream writes one; else the first copy that names a pod. dcgm-exporter's virtual-GPU mode
(4.8.2 on: internal/pkg/transformation/kubernetes.go and process_metrics.go) keeps the device
series of GPU_UTIL and FB_USED and adds one per sharing pod holding that pod's share, and copies
every other field once per pod with the device's value, losing its device series: a copy is
never summed, and never read over the device's own series.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .fieldtable import FieldTable, table
from .labels import DeviceKey
from .textformat import WatchedLine, watched_lines
from .upstreamlines import MAX_UPSTREAM_DEVICES, SeriesDevices, watched_samples

# The fields the package reads from the upstream's body (the readers' and the node page's).
READ_FIELDS = ("fb_used", "fb_free", "fb_reserved", "power", "energy", "gr_engine_active")
# Every name they have in any naming: what the rewrite hands over.
WATCH_NAMES = table().all_names(READ_FIELDS)

# What the naming of a body is when its known names belong to no one naming, or it has none.
NAMING_MIXED = "mixed"
NAMING_NONE = "none"
# How many family names of one body are looked at (a bound on a hostile upstream).
MAX_FAMILIES = 10_000

_TYPE = "# TYPE "


@dataclass(frozen=True, slots=True)
class Contract:
    """What one body says of dcgm-exporter's contract: the naming it speaks (a naming of the
    table, ``mixed`` or ``none``), how many DCGM fields it has that the table knows and does
    not know, and the needed fields it has under no known name."""

    naming: str = NAMING_NONE
    known: int = 0
    unknown: int = 0
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UpstreamReadings:
    """One body's readings: per device key, per field, the value in the field's SI unit."""

    devices: Mapping[DeviceKey, Mapping[str, float]] = field(default_factory=dict)
    contract: Contract = Contract()

    def of(self, field_name: str) -> dict[DeviceKey, float]:
        """Each device key's value of ``field_name`` (devices without it left out)."""
        return {k: v[field_name] for k, v in self.devices.items() if field_name in v}

    def per_gpu(self, field_name: str) -> dict[str, float]:
        """Each GPU's value of a device field (power, energy): the GPU's own series where the
        upstream writes one; where it writes a MIG GPU's device fields only per ``GPU_I_ID``
        (copies of the device's value), the first instance's."""
        out: dict[str, float] = {}
        copies: dict[str, float] = {}
        for (uuid, gi), values in self.devices.items():
            if field_name in values:
                (copies if gi else out).setdefault(uuid, values[field_name])
        for uuid, value in copies.items():
            out.setdefault(uuid, value)
        return out


def family_names(text: str) -> list[str]:
    """The families a body declares (its ``# TYPE`` lines), in order, at most MAX_FAMILIES.
    Found with ``str.find``: a regex anchored at line starts costs 20 times as much on a
    1 MiB body (9 ms on the bench's mig56)."""
    out: list[str] = []
    at = 0 if text.startswith(_TYPE) else _next_type_line(text, 0)
    while at >= 0 and len(out) < MAX_FAMILIES:
        start = at + len(_TYPE)
        end = text.find("\n", start)
        words = text[start : len(text) if end < 0 else end].split(None, 1)
        if words:
            out.append(words[0])
        if end < 0:
            break
        at = _next_type_line(text, end)
    return out


def _next_type_line(text: str, pos: int) -> int:
    found = text.find("\n" + _TYPE, pos)
    return found + 1 if found >= 0 else -1


def recognise(names: Iterable[str], fields: FieldTable | None = None) -> Contract:
    """The contract a body with these family names speaks (``family_names``)."""
    t = fields or table()
    known = unknown = 0
    namings: frozenset[str] | None = None
    present: set[str] = set()
    for name in dict.fromkeys(names):
        if not t.is_upstream_field(name):
            continue
        of_name = t.namings_of(name)
        if not of_name:
            unknown += 1
            continue
        known += 1
        present.add(t.by_name[name][0].field)
        namings = of_name if namings is None else namings & of_name
    if namings is None:
        naming = NAMING_NONE
    elif not namings:
        naming = NAMING_MIXED
    else:
        naming = next(n for n in t.namings if n in namings)  # the oldest that fits
    missing = tuple(f for f in t.needed() if f not in present)
    return Contract(naming, known, unknown, missing)


@functools.lru_cache(maxsize=4)
def _readers(fields: FieldTable) -> dict[str, tuple[str, float, bool]]:
    """Each watched name's field, scale to SI and whether it is a ratio (capped at 1)."""
    out = {}
    for name in fields.all_names(READ_FIELDS):
        fn = fields.lookup(name)
        if fn is not None:
            out[name] = (fn.field, fn.scale, fn.si == "ratio")
    return out


def read_upstream(
    text: str,
    lines: Sequence[WatchedLine],
    memo: SeriesDevices | None = None,
    fields: FieldTable | None = None,
    contract: Contract | None = None,
) -> UpstreamReadings:
    """The readings of one body: ``text`` (for its family names) and its sample lines of
    ``WATCH_NAMES`` (``RewriteResult.watched``; other names are skipped). A line that is not
    valid exposition, names no GPU or carries a non-finite or negative value is skipped;
    ratios above 1 are read as 1. ``memo``: the caller's memo of the lines' series
    (``upstreamlines.watched_samples``). ``contract``: what a body with the same families
    said (the caller knows it is the same: ``RewriteResult.shape``), not worked out again."""
    t = fields or table()
    readers = _readers(t)
    devices: dict[DeviceKey, dict[str, float]] = {}
    own: set[tuple[DeviceKey, str]] = set()  # (device, field) read from the device's own series
    for name, key, value, names_pod in watched_samples(lines, readers, memo):
        field_name, scale, ratio = readers[name]
        values = devices.get(key)
        if values is None:
            if len(devices) >= MAX_UPSTREAM_DEVICES:
                continue
            values = devices[key] = {}
        if names_pod:
            if field_name in values:
                continue  # a copy never reads over the device's own series, or another copy
        elif (key, field_name) in own:
            continue
        else:
            own.add((key, field_name))
        si = value * scale if scale != 1 else value
        values[field_name] = min(si, 1.0) if ratio else si
    if contract is not None:
        return UpstreamReadings(devices, contract)
    names = family_names(text)
    if not names:  # a body without TYPE lines: its watched names at least
        names = [name for name, _, _ in lines]
    return UpstreamReadings(devices, recognise(names, t))


def read_body(text: str, fields: FieldTable | None = None) -> UpstreamReadings:
    """The readings of a whole body, its watched lines found here (what the pipeline has the
    rewrite hand over)."""
    return read_upstream(text, watched_lines(text, WATCH_NAMES), None, fields)
