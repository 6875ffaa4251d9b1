"""Device memory that adds up: each GPU's and MIG instance's used memory, from the upstream's
framebuffer gauges, split between the processes NVML lists and what no listed process holds.

Pure: ``device_memory`` takes each device's framebuffer fields (fb_used, fb_free, fb_reserved)
from the body's readings in bytes (enricher.readings, whatever release named them) and
``memory_parts`` works out, per device, the parts
that no process accounts for. ``families.render_families`` writes them as
gpu_unattributed_memory_used_bytes{reason}; docs/metrics.md states the fields and the rules.

Invariant: on every device whose upstream writes FB_USED, the containers' memory plus every
unattributed reason's memory is FB_USED + FB_RESERVED (its reservation, where written), unless
the processes list more than FB_USED (readings of two moments): then ``not_in_process_list``
is 0, never negative, and the parts exceed the device by that excess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .attribution import Attribution
from .labels import DeviceKey
from .readings import UpstreamReadings

MIB = 2**20

# Memory of a device that no process NVML lists holds, as reasons of
# gpu_unattributed_memory_used_bytes beside the reasons of unattributed processes.
REASON_DRIVER_RESERVED = "driver_reserved"
REASON_NOT_IN_PROCESS_LIST = "not_in_process_list"


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One device's framebuffer, in bytes, as the upstream wrote it: ``used`` (fb_used),
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


def device_memory(readings: UpstreamReadings) -> dict[DeviceKey, DeviceMemory]:
    """Each device's memory, in bytes, from one body's readings (enricher.readings: the
    device's own series, never a per-pod copy over it): a device needs ``fb_used``."""
    return {
        key: DeviceMemory(vals["fb_used"], vals.get("fb_free"), vals.get("fb_reserved"))
        for key, vals in readings.devices.items()
        if "fb_used" in vals
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
