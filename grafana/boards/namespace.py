"""GPU / Namespace (Pods): one namespace's pods and workloads on GPUs. Memory, SM and power by
pod, the full list of its pods on devices (each a click away from its pod's dashboard),
allocated against used, idle since, and the chargeback: GPU-hours and energy."""

from __future__ import annotations

from typing import Any

from . import panels
from .common import (
    CL,
    IDLE_SINCE,
    MEM_REC,
    NS,
    PEAK_MEMORY_BY_POD_DEVICE,
    POD,
    POD_DEVICE,
    POD_FILTER,
    POD_LEGEND,
    POWER,
    UTIL_REC,
    Board,
    Row,
    Target,
    _series,
    _table,
    drill,
    sel,
    with_links,
)

TOP = 20  # the pods each panel of the namespace shows: the most memory, the longest idle

POD_LINKS = {
    "pod": drill("pod", "namespace", "pod"),
    "node": drill("node", "node"),
}


def _gpu_hours() -> Any:
    """Device-hours of the namespace over the trailing day: allocated, and held by its
    processes, from a sample every 15 s (a subquery: no record keeps the namespace under the
    label prefix)."""
    allocated = sel("gpu_container_allocated", *POD_FILTER)
    by = f"{CL}, {NS}"
    return _table(
        "GPU-hours, last day",
        "Device-hours (GPUs or MIG instances) over the trailing day: allocated to the "
        "namespace's containers (needs the PodResources source) and held by their processes "
        "(a device shared by several containers counted once), from a sample every 15 s (as "
        "the rules' GPU-hour records).",
        [
            Target(
                f"sum by ({by}) (sum_over_time(sum by ({by}) ({allocated})[1d:15s])) / 240",
                table=True,
            ),
            Target(
                f"sum by ({by}) (sum_over_time(count by ({by}) (count by ({by}, "
                "%(nodeLabel)s, UUID, GPU_I_ID) "
                f"({sel('gpu_container_memory_used_bytes', *POD_FILTER)}))[1d:15s])) / 240",
                table=True,
            ),
        ],
        {"Value #A": "allocated GPU-hours", "Value #B": "GPU-hours in use"},
        "GPU-hours in use",
        {},
        width=12,
    )


def _top(expr: str) -> str:
    """The TOP series of each cluster highest in ``expr`` (at each step of a graph)."""
    return f"topk by ({CL}) ({TOP}, {expr})"


def _by_pod(title: str, description: str, record: str, unit: str) -> Any:
    return _series(
        title,
        f"{description} The {TOP} pods of the namespace highest at each moment (the table "
        "below lists them with their devices; a pod opens its own dashboard).",
        Target(_top(f"sum by ({CL}, {NS}, {POD}) ({record})"), POD_LEGEND),
        unit=unit,
        stacked=True,
        width=12,
    )


def _top_pods() -> Any:
    """Today's table, its TOP rows chosen in the query (the table asked every pod for
    Grafana to keep 20)."""
    top = _top(f"sum by ({POD_DEVICE}) ({MEM_REC})")
    return with_links(
        _table(
            "Top pods by GPU memory",
            f"The {TOP} pod-device pairs holding the most GPU memory now, with their peak "
            "over the dashboard's time range and their SM utilization. A peak well under 10, "
            "20 or 40 GiB says a MIG slice of that size would do.",
            [
                Target(top, table=True),
                Target(f"{PEAK_MEMORY_BY_POD_DEVICE} and on ({POD_DEVICE}) {top}", table=True),
                Target(
                    f"sum by ({POD_DEVICE}) ({UTIL_REC}) and on ({POD_DEVICE}) {top}", table=True
                ),
            ],
            {
                "Value #A": "memory",
                "Value #B": "peak memory",
                "Value #C": "SM utilization",
                "%(nodeLabel)s": "node",
                "GPU_I_ID": "MIG instance",
            },
            "memory",
            {"memory": "bytes", "peak memory": "bytes", "SM utilization": "percentunit"},
        ),
        POD_LINKS,
    )


def _idle_since() -> Any:
    return with_links(
        _table(
            "Idle since",
            f"The {TOP} containers of the namespace idle the longest: when each last used a "
            "GPU it holds (memory or an allocation), over --idle.threshold SM utilization on "
            "any of its GPUs, by NVML or, on MIG, its instance's activity. Never earlier than "
            "the enricher's start or the container's newest process "
            "(docs/metrics.md#idle-since). GpuHeldIdle fires past the mixin's "
            "heldIdleSeconds; docs/culling.md stops them.",
            [Target(f"bottomk by ({CL}) ({TOP}, {IDLE_SINCE})", table=True)],
            {"Value": "last active", "%(nodeLabel)s": "node"},
            "last active",
            {"last active": "dateTimeFromNow"},
            ascending=True,
        ),
        POD_LINKS,
    )


def rows() -> list[Row]:
    top = _top_pods()
    pods = [
        _by_pod(
            "GPU memory by pod",
            "Which pods hold GPU memory (NVML's per-process memory, summed per pod over its "
            "devices).",
            MEM_REC,
            "bytes",
        ),
        _by_pod(
            "SM utilization by pod",
            "Share of SM time each pod used, in GPUs: 100% is one GPU kept busy (none on MIG: "
            "NVML has no per-process figure there).",
            UTIL_REC,
            "percentunit",
        ),
        panels.panel("Memory", "GPU memory by workload").span(12),
        panels.panel("Memory", "GPU memory by user").span(12),
        top,
    ]
    allocation = [
        with_links(panels.panel("Waste", "Allocated but idle"), POD_LINKS),
        with_links(panels.panel("Waste", "Memory held while idle"), POD_LINKS),
        with_links(panels.panel("Waste", "Used without request"), POD_LINKS),
        _idle_since(),
        panels.panel("Waste", "Allocated and in use, by namespace"),
    ]
    chargeback = [
        _gpu_hours(),
        panels.panel("Power and energy", "Energy per workload and user, last day").span(12),
        _by_pod(
            "Power by pod", "Each pod's share of its GPUs' draw (docs/power.md).", POWER, "watt"
        ).span(24),
    ]
    return [
        Row("Pods", pods),
        Row("Allocated and used", allocation),
        Row("Chargeback", chargeback),
    ]


BOARD = Board(
    "namespace",
    "dcgm-enricher-namespace.json",
    "One namespace's pods and workloads on GPUs: memory, SM and power by pod, allocated "
    "against used, idle since, and GPU-hours and energy for chargeback.",
    ("datasource", "label_prefix", "cluster", "namespace"),
    rows,
)
