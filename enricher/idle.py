"""When each container last used each GPU it holds (pure): the idle-since family.

The ledger (``IdleLedger``) is the one piece of state, owned by the Scraper and advanced once
per collection; ``render_last_active`` writes it. No I/O, no clock of its own: every time comes
from NVML's snapshot (``GpuSnapshot.taken_at``) and /proc (``ProcInfo.start_time``).

The rule (docs/metrics.md#idle-since), which never overstates idleness:
- A container is *active* on a device on a collection where its processes' NVML utilization
  there adds up to more than the threshold; where NVML has none for them (MIG), where the
  upstream's activity of that device (the gr_engine_active field, per ``GPU_I_ID``) is above
  it. Exact when the container is the device's only user; on a device several share, a busy
  device counts as activity for each of them. Where neither says anything, it counts as active:
  idleness the enricher cannot see is never claimed.
  A container with an allocation and no process on the device is idle there.
- Active: its timestamp is that collection's time.
- Never seen active since it appeared: the latest of the enricher's first collection, its
  newest process's start on that device, and (for an allocation with no process, or a
  process whose start is unknown) the collection that first saw it. A process that starts
  later moves it on too: starting is doing something.
- A container that is on the device no more leaves the ledger; its return starts afresh. A
  collection without NVML's answer empties it, and the next answer counts as a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .attribution import AllocatedDevice, Attribution, attributed_to
from .families import device_labels
from .labels import DeviceKey
from .promclient import LabelSets, MetricWriter
from .textformat import cut_values

LAST_ACTIVE = "gpu_container_last_active_timestamp_seconds"

# (device key, namespace, pod, container), the values as written (cut to the label bound).
IdleKey = tuple[DeviceKey, str, str, str]


@dataclass(frozen=True, slots=True)
class _Seen:
    """One container on one device on this collection: whether it has a process there, its
    processes' utilization (None: NVML has none for them) and the newest start time among them
    (None: no process, or none known)."""

    has_process: bool
    util: float | None
    newest_start: float | None


def containers_on_devices(
    attributions: Iterable[Attribution], allocated: Iterable[AllocatedDevice]
) -> dict[IdleKey, _Seen]:
    """Each container with a process or an allocation on a device, and what this collection
    says of its use there."""
    util: dict[IdleKey, float] = {}  # only where NVML gave some process's utilization
    starts: dict[IdleKey, float] = {}
    with_process: set[IdleKey] = set()
    for a in attributions:
        who = attributed_to(a)
        if who is None:
            continue
        key: IdleKey = (a.device_key, *cut_values(who))
        with_process.add(key)
        if a.process.sm_util_ratio is not None:
            util[key] = util.get(key, 0.0) + a.process.sm_util_ratio
        if a.info is not None:
            starts[key] = max(starts.get(key, a.info.start_time), a.info.start_time)
    keys = with_process | {
        (d.key, *cut_values((d.namespace, d.pod, d.container))) for d in allocated
    }
    return {k: _Seen(k in with_process, util.get(k), starts.get(k)) for k in keys}


class IdleLedger:
    """The last time each container was active on each device it holds (the module's rule)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.last_active: dict[IdleKey, float] = {}
        self.started: float | None = None  # the first collection's time

    def advance(
        self,
        taken_at: float,
        attributions: Sequence[Attribution],
        allocated: Sequence[AllocatedDevice],
        activity: Mapping[DeviceKey, float],
    ) -> None:
        """Account one collection made at ``taken_at`` (NVML's wall clock). ``activity``: the
        upstream's activity per device key (``power.UpstreamPower.activity``).

        ``taken_at`` 0: NVML gave no snapshot, so nothing is known of the time since the last
        one: the ledger forgets everything, and counts again from the next answer as from a
        restart (what it did meanwhile is never taken for idleness)."""
        if taken_at <= 0:
            self.last_active = {}
            self.started = None
            return
        if self.started is None:
            self.started = taken_at
        seen = containers_on_devices(attributions, allocated)
        last: dict[IdleKey, float] = {}
        for key, now in seen.items():
            if self._active(now, activity.get(key[0])):
                last[key] = taken_at
                continue
            previous = self.last_active.get(key)
            if previous is None and now.newest_start is None:
                since = taken_at  # nothing says when it came: the collection that saw it
            else:
                # Never before the first collection (every kept value is after it), nor
                # before its newest process there started (starting is doing something).
                since = max(
                    self.started if previous is None else previous,
                    self.started if now.newest_start is None else now.newest_start,
                )
            last[key] = min(since, taken_at)
        self.last_active = last

    def _active(self, seen: _Seen, device_activity: float | None) -> bool:
        if not seen.has_process:
            return False  # an allocation without a process: nothing runs there
        if seen.util is not None:
            return seen.util > self.threshold
        if device_activity is not None:
            return device_activity > self.threshold
        return True  # nothing tells: never claim idleness the enricher cannot see


def render_last_active(
    last_active: Mapping[IdleKey, float],
    identities: Mapping[DeviceKey, tuple[tuple[str, str], ...]],
    label_sets: LabelSets | None = None,
) -> str:
    """``gpu_container_last_active_timestamp_seconds{<device>, namespace, pod, container}``."""
    w = MetricWriter()
    w.family(
        LAST_ACTIVE,
        "The last time a container's processes used a GPU or MIG instance it holds (memory or "
        "an allocation) above --idle.threshold, in Unix seconds; never earlier than the "
        "enricher's first collection or the container's newest process there "
        "(docs/metrics.md#idle-since).",
    )
    for key in sorted(last_active):
        device, ns, pod, container = key
        labels = (
            *device_labels(identities, device),
            ("namespace", ns),
            ("pod", pod),
            ("container", container),
        )
        w.sample(LAST_ACTIVE, labels, last_active[key])
    return w.render(label_sets)
