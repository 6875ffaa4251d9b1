"""The page at ``/``: this node's GPUs and who is on each, as of the last scrape.

The ``ps`` view as a page: one section per GPU or MIG instance with a memory bar per container,
SM utilization, namespace, pod, container, workload, the memory of processes that belong to no
pod, and the device's memory no listed process holds (the driver's reservation, the rest), so
the rows add up to the device's used memory as ``/metrics`` does. It refreshes itself and
loads nothing from elsewhere (inline CSS, no script), so it works offline and
behind ``kubectl port-forward``.

It reads the last scrape's model (``ScrapeModel``; ``enricher.collection.ScrapeResult`` is one):
the attribution, the allocations, the power split and each device's memory from the upstream's
framebuffer gauges as the rewrite handed them over; never the bytes ``/metrics`` served.
``build_view`` is pure; ``render_landing`` only writes HTML.
"""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from . import __version__
from .attribution import Attribution
from .collection import PowerView
from .config import Config
from .idle import IdleKey
from .labels import DeviceKey
from .memory import (
    MIB,
    REASON_DRIVER_RESERVED,
    REASON_NOT_IN_PROCESS_LIST,
    DeviceMemory,
    memory_parts,
)
from .model import DockerContainer, DraDevice, GpuSnapshot, SourceStatus
from .power import REASON_IDLE
from .readings import Contract
from .textformat import cut_values

REFRESH_SECONDS = 10
MAX_PIDS_SHOWN = 8


# --------------------------------------------------------------------------- pure: the view


class Allocation(Protocol):
    """A device (or replica) the kubelet gave a container (attribution.AllocatedDevice)."""

    @property
    def key(self) -> DeviceKey: ...
    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def dra(self) -> DraDevice | None: ...


class ScrapeModel(Protocol):
    """What the page reads of the last scrape (``collection.ScrapeResult`` is one): its model,
    with no served body in it."""

    @property
    def attributions(self) -> Sequence[Attribution]: ...
    @property
    def allocations(self) -> Sequence[Allocation]: ...
    @property
    def snapshot(self) -> GpuSnapshot: ...
    @property
    def statuses(self) -> Sequence[SourceStatus]: ...
    @property
    def finished_at(self) -> float: ...
    @property
    def power(self) -> PowerView | None: ...
    @property
    def memory(self) -> Mapping[DeviceKey, DeviceMemory]: ...
    @property
    def last_active(self) -> Mapping[IdleKey, float]: ...
    @property
    def contract(self) -> Contract: ...


def allocation_label(al: Allocation) -> str:
    """What the allocated column says: the resource name, or a DRA device's driver, claim
    and device name."""
    if al.dra is None:
        return al.resource
    return f"{al.dra.driver} (DRA claim {al.dra.claim_name}, {al.dra.device})"


@dataclass(frozen=True, slots=True)
class OwnerRow:
    """One container on a device, or the processes of one unattributed reason."""

    namespace: str
    pod: str
    container: str
    workload: str
    memory_bytes: float | None  # None when NVML could not tell for any of its processes
    util_ratio: float | None  # None where NVML has no per-process data (MIG)
    processes: tuple[tuple[int, str], ...]  # (pid, command)
    reason: str = ""  # non-empty: no pod, and why
    allocated: str = ""  # resource names the kubelet allocated to it on this device
    power_watts: float | None = None  # its share of the GPU's draw; None: no power reading
    # When it last used the device, where that is before this collection (idle since then, as
    # gpu_container_last_active_timestamp_seconds says); None: active now, or not known.
    idle_since: float | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """(namespace, pod, container): whose row it is."""
        return (self.namespace, self.pod, self.container)


@dataclass(frozen=True, slots=True)
class DeviceView:
    key: DeviceKey
    title: str  # "GPU 0", "GPU 2 · MIG 3g.40gb (GI 1)"
    model: str
    used_bytes: float | None  # device memory in use, from the upstream; None if unknown
    total_bytes: float | None
    owners: tuple[OwnerRow, ...] = ()
    power_watts: float | None = None  # the whole GPU's draw (a MIG instance: its GPU's)

    @property
    def unattributed_bytes(self) -> float:
        return sum(o.memory_bytes or 0 for o in self.owners if o.reason)


@dataclass(frozen=True, slots=True)
class PageView:
    devices: tuple[DeviceView, ...] = ()
    statuses: tuple[SourceStatus, ...] = ()
    finished_at: float | None = None
    pods: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    contract: Contract = field(default_factory=Contract)  # what the last upstream body said

    @property
    def unattributed_bytes(self) -> float:
        return sum(d.unattributed_bytes for d in self.devices)

    @property
    def allocations_known(self) -> bool:
        """Whether the kubelet's allocations were read on the last scrape."""
        return any(s.name == "podresources" and s.enabled and s.up for s in self.statuses)


def _owner_rows(
    attributions: Sequence[Attribution], allocations: Sequence[Allocation] = ()
) -> tuple[OwnerRow, ...]:
    groups: dict[tuple[str, str, str, str], list[Attribution]] = defaultdict(list)
    for a in attributions:
        if a.pod is not None:
            groups[(a.pod.namespace, a.pod.name, a.container, "")].append(a)
        elif a.docker is not None:  # Docker mode: the container's name, no pod
            groups[("", "", a.container, "")].append(a)
        else:
            groups[("", "", "", a.reason or "unknown")].append(a)
    given: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for al in allocations:
        given[(al.namespace, al.pod, al.container)].add(allocation_label(al))
    rows = []
    for (ns, pod, container, reason), members in groups.items():
        info = members[0].pod
        known_mem = [m.process.used_memory_bytes for m in members]
        known_util = [m.process.sm_util_ratio for m in members]
        rows.append(
            OwnerRow(
                namespace=ns,
                pod=pod,
                container=container,
                workload=(
                    f"{info.workload_kind}/{info.workload_name}"
                    if info
                    else _compose(members[0].docker)
                ),
                memory_bytes=(
                    sum(v for v in known_mem if v is not None)
                    if any(v is not None for v in known_mem)
                    else None
                ),
                util_ratio=(
                    min(1.0, sum(v for v in known_util if v is not None))
                    if any(v is not None for v in known_util)
                    else None
                ),
                processes=tuple(sorted((m.process.pid, m.comm) for m in members)),
                reason=reason,
                allocated=", ".join(sorted(given.pop((ns, pod, container), ()))) if pod else "",
            )
        )
    # Allocated containers with no process on the device: the idle allocations.
    for (ns, pod, container), resources in given.items():
        rows.append(OwnerRow(ns, pod, container, "", 0, None, (), "", ", ".join(sorted(resources))))
    # Pods first, biggest memory first; unattributed last.
    rows.sort(key=lambda r: (bool(r.reason), -(r.memory_bytes or 0), r.namespace, r.pod))
    return tuple(rows)


def _with_power(
    key: DeviceKey, owners: tuple[OwnerRow, ...], power: PowerView
) -> tuple[OwnerRow, ...]:
    """Each row with its watts (enricher.power's split, as the metrics say), and a row for the
    idle share of a device nobody holds."""
    if key[0] not in power.device_watts:
        return owners
    rows = []
    for o in owners:
        if o.reason:
            watts = power.unattributed_watts.get((key, o.reason))
        else:
            watts = power.container_watts.get((key, (o.namespace, o.pod, o.container)))
        rows.append(replace(o, power_watts=watts))
    idle = power.unattributed_watts.get((key, REASON_IDLE))
    if idle is not None:
        rows.append(OwnerRow("", "", "", "", 0, None, (), REASON_IDLE, "", idle))
    return tuple(rows)


def _with_idle_since(
    key: DeviceKey, owners: tuple[OwnerRow, ...], last_active: Mapping[IdleKey, float], now: float
) -> tuple[OwnerRow, ...]:
    """Each container's row with the time it went idle on the device: the idle stage's ledger
    (``enricher.idle``), the value /metrics writes, where it is before this collection."""
    rows = []
    for o in owners:
        since = None if o.reason else last_active.get((key, *cut_values(o.key)))
        rows.append(replace(o, idle_since=since) if since is not None and since < now else o)
    return tuple(rows)


def _with_memory_parts(
    key: DeviceKey, owners: tuple[OwnerRow, ...], parts: Mapping[tuple[DeviceKey, str], float]
) -> tuple[OwnerRow, ...]:
    """The rows of the device's memory no listed process holds, after the processes' (as
    gpu_unattributed_memory_used_bytes writes them: ``memory.memory_parts``)."""
    extra = [
        OwnerRow("", "", "", "", value, None, (), reason)
        for (k, reason), value in sorted(parts.items())
        if k == key and value > 0
    ]
    return owners + tuple(extra)


def _device_list(snapshot: GpuSnapshot) -> list[tuple[DeviceKey, str, str]]:
    out: list[tuple[DeviceKey, str, str]] = []
    for dev in sorted(snapshot.devices, key=lambda d: d.index):
        migs = sorted((m for m in snapshot.migs if m.gpu_uuid == dev.uuid), key=lambda m: m.gi_id)
        if dev.mig_enabled and migs:
            for mig in migs:
                profile = f"MIG {mig.profile} " if mig.profile else "MIG "
                out.append(
                    (
                        (dev.uuid, str(mig.gi_id)),
                        f"GPU {dev.index} · {profile}(GI {mig.gi_id})",
                        dev.name,
                    )
                )
        else:
            out.append(((dev.uuid, ""), f"GPU {dev.index}", dev.name))
    return out


def build_view(last: ScrapeModel | None) -> PageView:
    """Who is on which device at the last scrape, with device memory from the upstream's
    framebuffer gauges (the scrape's model: ``ScrapeResult.memory``)."""
    if last is None:
        return PageView()
    by_device: dict[DeviceKey, list[Attribution]] = defaultdict(list)
    for a in last.attributions:
        by_device[a.device_key].append(a)
    allocations: Sequence[Allocation] = last.allocations
    allocated: dict[DeviceKey, list[Allocation]] = defaultdict(list)
    for al in allocations:
        allocated[al.key].append(al)
    memory = last.memory
    # The same parts /metrics writes, by the same function over the same model.
    parts = memory_parts(memory, last.attributions)
    power = last.power
    devices = []
    listed: set[DeviceKey] = set()
    for key, title, model in _device_list(last.snapshot):
        listed.add(key)
        used, total = _used_total(memory.get(key))
        owners = _owner_rows(by_device[key], allocated[key])
        device_watts = None
        if power is not None:
            owners = _with_power(key, owners, power)
            device_watts = power.device_watts.get(key[0])
        owners = _with_idle_since(key, owners, last.last_active, last.snapshot.taken_at)
        owners = _with_memory_parts(key, owners, parts)
        devices.append(DeviceView(key, title, model, used, total, owners, device_watts))
    # Devices NVML did not list on this scrape: never hide who is on them.
    for key in sorted((set(by_device) | set(allocated)) - listed):
        used, total = _used_total(memory.get(key))
        title = f"{key[0]}" + (f" (GI {key[1]})" if key[1] else "")
        owners = _with_memory_parts(key, _owner_rows(by_device[key], allocated[key]), parts)
        devices.append(DeviceView(key, title, "", used, total, owners))
    pods = frozenset((o.namespace, o.pod) for d in devices for o in d.owners if o.pod)
    return PageView(tuple(devices), tuple(last.statuses), last.finished_at, pods, last.contract)


def _used_total(mem: DeviceMemory | None) -> tuple[float | None, float | None]:
    return (None, None) if mem is None else (mem.in_use, mem.total)


# --------------------------------------------------------------------------- rendering


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _wrappable(text: str) -> str:
    """Escaped, with a line break allowed after each ``/``: workloads and resource names
    (``StatefulSet/bert-finetune``, ``nvidia.com/mig-3g.40gb``) may wrap there, so that the
    table fits a 1024 px screen."""
    return _e(text).replace("/", "/<wbr>")


def _bytes(n: float | None) -> str:
    if n is None:
        return "?"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / MIB:.0f} MiB"


def _bar(part: float | None, whole: float | None, css: str = "") -> str:
    if part is None or not whole:
        return ""
    pct = max(0.0, min(100.0, 100.0 * part / whole))
    return (
        f"<div class='bar' title='{pct:.1f}% of the device'>"
        f"<span class='{css}' style='width:{pct:.1f}%'></span></div>"
    )


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _watts(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} W"


def _processes(row: OwnerRow) -> str:
    shown = [f"{pid} {comm}".strip() for pid, comm in row.processes[:MAX_PIDS_SHOWN]]
    more = len(row.processes) - MAX_PIDS_SHOWN
    if more > 0:
        shown.append(f"+{more} more")
    return _e(", ".join(shown))


def _device_rows(dev: DeviceView, allocations_known: bool) -> str:
    owners_mem = sum(o.memory_bytes or 0 for o in dev.owners)
    scale = dev.total_bytes or max(owners_mem, dev.used_bytes or 0) or None
    span = max(1, len(dev.owners))
    used = _bytes(dev.used_bytes) if dev.used_bytes is not None else _bytes(owners_mem)
    total = f" of {_bytes(dev.total_bytes)}" if dev.total_bytes else ""
    draws = (
        "" if dev.power_watts is None else f"<small>GPU draws {_e(_watts(dev.power_watts))}</small>"
    )
    head = (
        f"<th scope='rowgroup' rowspan='{span}' class='dev'>{_e(dev.title)}"
        f"<small>{_e(dev.model)}</small>"
        f"<small>{_e(used)}{_e(total)} used</small>"
        f"{_bar(dev.used_bytes, dev.total_bytes)}"
        f"{draws}</th>"
    )
    if not dev.owners:
        return f"<tbody><tr>{head}<td colspan='9' class='idle'>no process</td></tr></tbody>"
    not_allocated = "<span class='un'>not allocated</span>" if allocations_known else ""
    rows = []
    for i, o in enumerate(dev.owners):
        util = _e("n/a" if o.util_ratio is None else f"{o.util_ratio * 100:.0f}%")
        if o.idle_since is not None:
            util += f"<small class='since'>idle since {_e(_stamp(o.idle_since))}</small>"
        mem = (
            f"{_bar(o.memory_bytes, scale, 'un' if o.reason else '')}"
            f"<span class='num'>{_e(_bytes(o.memory_bytes))}</span>"
        )
        if o.reason:
            who = (
                "<td></td><td class='un' colspan='2'>unattributed: "
                f"<code>{_e(o.reason)}</code></td><td></td><td></td>"
            )
        else:
            who = (
                f"<td>{_e(o.namespace)}</td><td class='pod'>{_e(o.pod)}</td>"
                f"<td>{_e(o.container)}</td><td>{_wrappable(o.workload)}</td>"
                f"<td>{_wrappable(o.allocated) or not_allocated}</td>"
            )
        procs = (
            _processes(o)
            or f"<span class='un'>{_e(_NO_PROCESS.get(o.reason, _IDLE_ALLOCATION))}</span>"
        )
        cells = (
            f"<td class='mem'>{mem}</td><td class='num'>{util}</td>"
            f"<td class='num'>{_e(_watts(o.power_watts))}</td>"
            f"{who}<td class='pids'>{procs}</td>"
        )
        rows.append(f"<tr>{head if i == 0 else ''}{cells}</tr>")
    return "<tbody>" + "".join(rows) + "</tbody>"


_IDLE_ALLOCATION = "no process: allocated, idle"
# What the processes column says for a row that no process makes up.
_NO_PROCESS = {
    REASON_IDLE: "no process, no allocation",
    REASON_DRIVER_RESERVED: "the driver's reservation (FB_RESERVED)",
    REASON_NOT_IN_PROCESS_LIST: "held by no process NVML lists",
}


def _fields(contract: Contract) -> str:
    """The upstream's field naming, and the fields it lacks that the enricher needs."""
    text = f"upstream fields: {_e(contract.naming)} naming"
    if contract.unknown:
        text += f", {contract.unknown} not in the field table"
    if not contract.missing:
        return f"<span class='chip up'>{text}</span>"
    return (
        f"<span class='chip down'>{text}; missing under every known name: "
        f"{_e(', '.join(contract.missing))} (docs/compatibility.md)</span>"
    )


def _sources(statuses: Sequence[SourceStatus]) -> str:
    chips = []
    for st in statuses:
        state = "off" if not st.enabled else ("up" if st.up else "down")
        chips.append(f"<span class='chip {state}'>{_e(st.name)}: {state}</span>")
    return " ".join(chips)


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#1d1d1f}"
    "h1{font-size:1.4em;margin:0 0 .3em}small{display:block;color:#666;font-weight:normal}"
    "table{border-collapse:collapse;width:100%;margin-top:1em}"
    "th,td{border-bottom:1px solid #ddd;padding:.3em .4em;text-align:left;vertical-align:top}"
    "table{font-size:.92em}thead th{background:#f3f3f5}th.dev{width:11em;background:#fafafa}"
    ".bar{background:#e6e6ea;height:.7em;width:4em;display:inline-block;margin-right:.4em}"
    "td.mem,td.num{white-space:nowrap}small.since{white-space:normal}"
    ".bar span{display:block;height:100%;background:#3b7dd8}.bar span.un{background:#d8893b}"
    ".num{font-variant-numeric:tabular-nums}.un{color:#a65a00}.idle{color:#888}"
    ".pids{font-size:.85em;color:#555}.chip{padding:.1em .5em;border-radius:.8em;"
    "font-size:.85em;margin-right:.3em}.chip.up{background:#dff3e3}.chip.down"
    "{background:#f8d7da}.chip.off{background:#eee}.banner{background:#fff3cd;"
    "padding:.5em 1em;border:1px solid #e0c36a}"
)


def render_landing(last: ScrapeModel | None, config: Config) -> str:
    """The whole page, self-contained; ``last`` is the newest scrape (None before the first)."""
    view = build_view(last)
    banner = (
        "<p class='banner'><strong>SIMULATED NODE</strong>: this is "
        "<code>dcgm-enricher demo</code>; no GPU, process or pod here is real.</p>"
        if config.simulated
        else ""
    )
    node = f" on {_e(config.kube_node_name)}" if config.kube_node_name else ""
    if view.finished_at is None:
        when = "no scrape yet: open /metrics, or wait for Prometheus to scrape"
    else:
        age = max(0.0, time.time() - view.finished_at)
        when = f"as of the last scrape, {_stamp(view.finished_at)} ({age:.0f} s ago)"
    summary = (
        f"<p>{len(view.devices)} devices · {len(view.pods)} pods on them · "
        f"unattributed memory {_e(_bytes(view.unattributed_bytes))} · {_sources(view.statuses)} "
        f"{_fields(view.contract)}</p>"
    )
    head = (
        "<thead><tr><th scope='col'>device</th><th scope='col'>memory</th>"
        "<th scope='col'>SM util</th><th scope='col'>power</th>"
        "<th scope='col'>namespace</th><th scope='col'>pod</th>"
        "<th scope='col'>container</th><th scope='col'>workload</th>"
        "<th scope='col'>allocated</th><th scope='col'>processes</th></tr></thead>"
    )
    body = "".join(_device_rows(d, view.allocations_known) for d in view.devices)
    if not view.devices:
        body = "<tbody><tr><td colspan='10' class='idle'>no GPU seen yet</td></tr></tbody>"
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>dcgm-enricher{node}</title><style>{_CSS}</style></head><body>"
        f"<h1>GPUs{node}</h1>{banner}"
        f"<p>{_e(when)} · refreshes every {REFRESH_SECONDS} s · "
        "<a href='metrics'>/metrics</a> · <a href='healthz'>/healthz</a> · "
        f"dcgm-enricher {_e(__version__)}</p>"
        f"{summary}<table id='gpus'>{head}{body}</table></body></html>"
    )


def _compose(container: DockerContainer | None) -> str:
    """A Docker container's compose project/service, else its image."""
    if container is None:
        return ""
    if container.compose_project:
        return f"compose {container.compose_project}/{container.compose_service}"
    return container.image
