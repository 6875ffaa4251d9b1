"""GPU / Node: one node's devices and who is on each (the enricher's node page as a
dashboard), how they are shared (MIG, MPS, time-slicing), and their health and taints."""

from __future__ import annotations

from . import panels
from .common import (
    CL,
    CTR,
    DEV_FILTER,
    NS,
    POD,
    Board,
    Row,
    Target,
    _table,
    drill,
    field,
    sel,
    with_links,
)

MIG = 'GPU_I_ID!=""'
WHO = f"{CL}, %(nodeLabel)s, gpu, GPU_I_ID, UUID, {NS}, {POD}, {CTR}"


def rows() -> list[Row]:
    who = with_links(
        _table(
            "Who is on each device",
            "Each GPU or MIG instance of the node with the containers whose processes hold its "
            "memory, and the SM share they use (the node page's view). A pod opens its "
            "dashboard, a namespace its own.",
            [
                Target(
                    f"sum by ({WHO}) ({sel('gpu_container_memory_used_bytes', *DEV_FILTER)})",
                    table=True,
                ),
                Target(
                    f"sum by ({WHO}) ({sel('gpu_container_utilization_ratio', *DEV_FILTER)})",
                    table=True,
                ),
            ],
            {
                "Value #A": "memory",
                "Value #B": "SM utilization",
                "%(nodeLabel)s": "node",
                "GPU_I_ID": "MIG instance",
            },
            "gpu",
            {"memory": "bytes", "SM utilization": "percentunit"},
            ascending=True,
        ),
        {"pod": drill("pod", "namespace", "pod"), "namespace": drill("namespace", "namespace")},
    )
    mig = _table(
        "MIG instances",
        "The node's MIG instances: profile, and the memory in use on each.",
        [
            Target(
                "max by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, GPU_I_PROFILE) "
                f"({field('fb_used', *DEV_FILTER, MIG)})",
                table=True,
            )
        ],
        {"Value": "memory used", "%(nodeLabel)s": "node", "GPU_I_ID": "MIG instance"},
        "gpu",
        {"memory used": "bytes"},
        ascending=True,
        width=8,
    )
    devices = [
        who,
        panels.panel("Memory", "Unattributed GPU memory by reason").span(12),
        panels.panel("Device health", "Device memory used").span(12),
    ]
    sharing = [
        panels.panel("Shared GPUs", "Pods per shared device"),
        panels.panel("Shared GPUs", "Memory split on shared devices"),
        panels.panel("Shared GPUs", "SM split on shared devices"),
        mig,
        panels.panel("Power and energy", "Watts by pod on shared GPUs").span(16),
    ]
    health = [
        panels.panel("Device health", title)
        for title in (
            "Temperature",
            "Power",
            "GPU utilization",
            "Last XID",
            "Remapped memory rows",
            "Fabric health",
            "PCIe replays",
            "Clocks",
            "DRA device taints",
        )
    ]
    return [
        Row("Devices", devices),
        Row("Sharing: MIG, MPS, time-slicing", sharing),
        Row("Health and taints", health),
    ]


BOARD = Board(
    "node",
    "dcgm-enricher-node.json",
    "One node's GPUs and MIG instances and who is on each, how they are shared (MIG, MPS, "
    "time-slicing), and their health and DRA taints.",
    ("datasource", "label_prefix", "cluster", "node"),
    rows,
)
