"""The values the enricher reads from dcgm-exporter's own lines: one parser for every reader.

Pure. The rewrite hands over the sample lines of the families it watches, each cut into its
series (the metric name and label block, as written) and its value part
(``textformat.WatchedLine``). :func:`watched_samples` turns them into (name, device, value,
names a pod) for the body's one reader (``readings.read_upstream``): a line that is not
valid exposition, names no GPU, or holds a non-finite or negative value is skipped. A series
is the same string from one collection to the next, so the reader keeps a
:class:`SeriesDevices` memo and parses each series once while it stays.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator

from .labels import CURRENT_SCHEME, OLD_SCHEME, DeviceKey, device_key
from .textformat import WatchedLine, first_blank, parse_label_block, valid_value

# How many devices a reader keeps from one body: a bound on what a misbehaving upstream can
# make it hold.
MAX_UPSTREAM_DEVICES = 4096

# A series' device, and whether the series names a pod (a non-empty pod label in either of
# dcgm-exporter's schemes).
_SeriesDevice = tuple[DeviceKey, bool]
_POD_NAMES = frozenset({CURRENT_SCHEME[1], OLD_SCHEME[1]})


class SeriesDevices:
    """A reader's memo: the series of its previous call and the devices they name. Only the
    last call's are kept, so a series of a pod that left (the upstream's pod labels follow the
    pods) does not stay. Its owner (each Scraper has one per reader) passes it to every call."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], _SeriesDevice | None] = {}


def _series_device(name: str, series: str) -> _SeriesDevice | None:
    """The device a sample line's series (its name and label block) names, and whether it
    names a pod (None: not valid exposition, or no device)."""
    if not series.startswith(name + "{"):
        return None  # a device field without labels names no GPU
    pairs = parse_label_block(series[len(name) + 1 : -1])
    if pairs is None:
        return None
    key = device_key(pairs)
    if key is None or not key[0]:
        return None
    return key, any(n in _POD_NAMES and v for n, v in pairs)


# A value as exporters write it (an integer or a %f float), alone after the label block: every
# string it matches is one valid_value accepts as it is.
_PLAIN_TAIL = re.compile(r" (-?[0-9]{1,200}(?:\.[0-9]+)?)")


def watched_samples(
    lines: Iterable[WatchedLine], names: Collection[str], memo: SeriesDevices | None = None
) -> Iterator[tuple[str, DeviceKey, float, bool]]:
    """The name, device and value of each sample line of ``names`` among ``lines``, and
    whether the line names a pod; a line that is not valid exposition, names no GPU, or has a
    non-finite or negative value is skipped. ``memo``: the series' devices from the previous
    call (each series parsed once while it stays), updated to this call's."""
    known = memo.last if memo is not None else {}
    seen: dict[tuple[str, str], _SeriesDevice | None] = {}
    for name, series, tail in lines:
        if name not in names:
            continue
        line_series = (name, series)
        if line_series in seen:
            key = seen[line_series]
        else:
            key = known[line_series] if line_series in known else _series_device(name, series)
            if len(seen) < 2 * MAX_UPSTREAM_DEVICES:
                seen[line_series] = key
        if key is None:
            continue
        value = _parse_value(tail)
        if value is not None:
            yield name, key[0], value, key[1]
    if memo is not None:
        memo.last = seen


def _parse_value(tail: str) -> float | None:
    plain = _PLAIN_TAIL.fullmatch(tail)
    if plain is not None:  # what dcgm-exporter writes: one check instead of the grammar's
        value = float(plain.group(1))
    else:
        checked = valid_value(tail)
        if checked is None:
            return None
        try:
            value = float(checked[: first_blank(checked)])
        except ValueError:
            return None
    if not value >= 0.0 or value == float("inf"):  # NaN fails the first test
        return None
    return value
