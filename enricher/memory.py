"""Device memory that adds up: each GPU's and MIG instance's used memory, from the upstream's
framebuffer gauges, split between the processes NVML lists and what no listed process holds.

Pure: the rewrite hands over the upstream's FB_USED, FB_FREE and FB_RESERVED lines
(``parse_device_memory`` reads them) and ``memory_parts`` works out, per device, the parts
that no process accounts for. ``families.render_families`` writes them as
gpu_unattributed_memory_used_bytes{reason}; docs/metrics.md states the fields and the rules.

Invariant: on every device whose upstream writes FB_USED, the containers' memory plus every
unattributed reason's memory is FB_USED + FB_RESERVED (its reservation, where written), unless
the processes list more than FB_USED (readings of two moments): then ``not_in_process_list``
is 0, never negative, and the parts exceed the device by that excess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .attribution import Attribution
from .labels import DeviceKey
from .textformat import WatchedLine
from .upstreamlines import SeriesDevices, watched_samples

MIB = 2**20
# dcgm-exporter's framebuffer gauges (MiB). DCGM 3.x fills them from NVML's v2 memory info:
# FB_USED excludes the driver's reservation, which is FB_RESERVED, so FB_TOTAL is
# FB_USED + FB_FREE + FB_RESERVED.
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
# The names the rewrite hands over for the memory split and the node page.
MEMORY_NAMES = (FB_USED, FB_FREE, FB_RESERVED)

# Memory of a device that no process NVML lists holds, as reasons of
# gpu_unattributed_memory_used_bytes beside the reasons of unattributed processes.
REASON_DRIVER_RESERVED = "driver_reserved"
REASON_NOT_IN_PROCESS_LIST = "not_in_process_list"


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One device's framebuffer, in bytes, as the upstream wrote it: ``used`` (FB_USED),
    ``free`` and ``reserved`` (None where the upstream does not write them)."""

    used: float
    free: float | None = None
    reserved: float | None = None

    @property
    def in_use(self) -> float:
        """What the device holds: FB_USED plus the driver's reservation where written."""
        return self.used + (self.reserved or 0.0)

    @property
    def total(self) -> float | None:
        """The whole framebuffer (None without FB_FREE)."""
        return None if self.free is None else self.in_use + self.free


def parse_device_memory(
    lines: Iterable[WatchedLine], memo: SeriesDevices | None = None
) -> dict[DeviceKey, DeviceMemory]:
    """Each device's memory from the upstream's ``MEMORY_NAMES`` sample lines
    (``RewriteResult.watched``; other watched names are skipped). A device needs FB_USED;
    lines that are not valid exposition, name no GPU or carry a non-finite or negative value
    are skipped. Each value is the device's own series: in dcgm-exporter's virtual-GPU mode
    (4.8.2 on, internal/pkg/transformation/kubernetes.go and process_metrics.go) FB_USED keeps
    the device series, with no pod label, and adds one copy per sharing pod holding that pod's
    share, while FB_FREE and FB_RESERVED are copied once per pod with the device's value and
    lose their device series. So the line that names no pod is the device's; where every line
    names a pod, the first one stands for the device (a copy is never summed, and never read
    over the device's own series). ``memo``: the caller's memo of the lines' series
    (``upstreamlines.watched_samples``)."""
    seen: dict[DeviceKey, dict[str, float]] = {}
    own: set[tuple[DeviceKey, str]] = set()  # (device, name) read from the device's own series
    for name, key, value, names_pod in watched_samples(lines, MEMORY_NAMES, memo):
        values = seen.setdefault(key, {})
        if (key, name) in own or (names_pod and name in values):
            continue
        values[name] = value * MIB
        if not names_pod:
            own.add((key, name))
    return {
        key: DeviceMemory(vals[FB_USED], vals.get(FB_FREE), vals.get(FB_RESERVED))
        for key, vals in seen.items()
        if FB_USED in vals
    }


def memory_parts(
    memory: Mapping[DeviceKey, DeviceMemory], attributions: Sequence[Attribution]
) -> dict[tuple[DeviceKey, str], float]:
    """The memory of each device that no listed process holds, by (device key, reason):
    ``driver_reserved`` (FB_RESERVED, where the upstream writes it) and
    ``not_in_process_list`` (FB_USED less the memory of every process NVML lists on the
    device, whoever owns it; 0 where they list as much or more). A MIG GPU's own reading is
    left out where the upstream writes its instances' (their processes are the instances');
    where it writes none, the GPU's reading holds the processes of all its instances."""
    split = {uuid for uuid, gi in memory if gi}
    held: dict[DeviceKey, float] = {}
    for a in attributions:
        key = a.device_key if a.device_key[0] in split else (a.device_key[0], "")
        held[key] = held.get(key, 0.0) + (a.process.used_memory_bytes or 0)
    out: dict[tuple[DeviceKey, str], float] = {}
    for key, mem in memory.items():
        if not key[1] and key[0] in split:
            continue
        if mem.reserved is not None:
            out[(key, REASON_DRIVER_RESERVED)] = mem.reserved
        out[(key, REASON_NOT_IN_PROCESS_LIST)] = max(0.0, mem.used - held.get(key, 0.0))
    return out
