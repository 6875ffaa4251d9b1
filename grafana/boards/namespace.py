"""GPU / Namespace (Pods): one namespace's pods and workloads on GPUs. Memory, SM and power by
pod, the full list of its pods on devices (each a click away from its pod's dashboard),
allocated against used, idle since, and the chargeback: GPU-hours and energy."""

from __future__ import annotations

from typing import Any

from . import panels
from .common import (
    CL,
    NS,
    POD,
    POD_FILTER,
    POD_LEGEND,
    POWER,
    Board,
    Row,
    Target,
    _series,
    _table,
    drill,
    sel,
    with_links,
)

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


def rows() -> list[Row]:
    top = with_links(panels.panel("Top pods", "Top pods by GPU memory"), POD_LINKS)
    pods = [
        panels.panel("Memory", "GPU memory by pod"),
        panels.panel("Utilization", "SM utilization by pod"),
        panels.panel("Memory", "GPU memory by workload").span(12),
        panels.panel("Memory", "GPU memory by user").span(12),
        top,
    ]
    allocation = [
        with_links(panels.panel("Waste", "Allocated but idle"), POD_LINKS),
        with_links(panels.panel("Waste", "Memory held while idle"), POD_LINKS),
        with_links(panels.panel("Waste", "Used without request"), POD_LINKS),
        with_links(panels.panel("Waste", "Idle since"), POD_LINKS),
        panels.panel("Waste", "Allocated and in use, by namespace"),
    ]
    chargeback = [
        _gpu_hours(),
        panels.panel("Power and energy", "Energy per workload and user, last day").span(12),
        _series(
            "Power by pod",
            "Each pod's share of its GPUs' draw (docs/power.md).",
            Target(f"sum by ({CL}, {NS}, {POD}) ({POWER})", POD_LEGEND),
            unit="watt",
            width=24,
            stacked=True,
        ),
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
