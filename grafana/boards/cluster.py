"""GPU / Cluster: the fleet at a glance. How many devices are in use, allocated, idle and
wasted; memory, SM, power and energy by namespace; the top namespaces and workloads (each a
click away from its namespace's dashboard); the devices' and the enrichers' health by node
count."""

from __future__ import annotations

from typing import Any

from . import panels
from .common import (
    CL,
    CONTAINER_DEVICE,
    IDLE_MEMORY,
    IDLE_UTILIZATION,
    MEM_REC,
    NS,
    POD_FILTER,
    SELF_FILTER,
    UTIL_REC,
    Board,
    Row,
    Target,
    _stat,
    _table,
    drill,
    field,
    sel,
    with_links,
)

TOP = 10  # rows of the "top" tables; the full list is the namespace dashboard's


def _nodes_with(expr: str, every: str) -> str:
    """Nodes (per cluster) where ``expr`` has a series, 0 where none has but ``every`` (each
    node's series of the same kind) has: a healthy fleet reads 0, not "no data"."""
    return (
        f"count by ({CL}) (count by ({CL}, %(nodeLabel)s) ({expr})) "
        f"or count by ({CL}) (count by ({CL}, %(nodeLabel)s) ({every})) * 0"
    )


CLUSTER_FILTER = '%(clusterLabel)s=~"$cluster"'


def _dev(name: str) -> str:
    """dcgm-exporter's field ``name`` (its SI unit) in the chosen clusters."""
    return field(name, CLUSTER_FILTER)


def _allocated_devices() -> str:
    allocated = sel("gpu_container_allocated", *POD_FILTER)
    return f"count by ({CL}) (count by ({CL}, %(nodeLabel)s, UUID, GPU_I_ID) ({allocated}))"


def _held_idle() -> str:
    memory = sel("gpu_container_memory_used_bytes", *POD_FILTER)
    util = sel("gpu_container_utilization_ratio", *POD_FILTER)
    return (
        f"count by ({CL}) (sum by ({CONTAINER_DEVICE}) ({memory}) > {IDLE_MEMORY} "
        f"and on ({CONTAINER_DEVICE}) max by ({CONTAINER_DEVICE}) "
        f"(max_over_time({util}[1h])) < {IDLE_UTILIZATION})"
    )


def _top_namespaces() -> Any:
    return with_links(
        _table(
            "Top namespaces",
            f"The {TOP} namespaces of each cluster holding the most GPU memory now, with the "
            "GPUs' worth of SM time they use. A namespace opens its own dashboard (every pod "
            "of it).",
            [
                Target(f"topk by ({CL}) ({TOP}, sum by ({CL}, {NS}) ({MEM_REC}))", table=True),
                Target(
                    f"sum by ({CL}, {NS}) ({UTIL_REC}) and on ({CL}, {NS}) "
                    f"topk by ({CL}) ({TOP}, sum by ({CL}, {NS}) ({MEM_REC}))",
                    table=True,
                ),
            ],
            {"Value #A": "memory", "Value #B": "SM utilization"},
            "memory",
            {"memory": "bytes", "SM utilization": "percentunit"},
            width=12,
        ),
        {"namespace": drill("namespace", "namespace")},
    )


def _top_workloads() -> Any:
    by = f"{CL}, {NS}, workload_kind, workload_name"
    return with_links(
        _table(
            "Top workloads",
            f"The {TOP} workloads of each cluster (Deployments, Jobs, StatefulSets, ...; all "
            "replicas together) holding the most GPU memory now. A namespace opens its dashboard.",
            [Target(f"topk by ({CL}) ({TOP}, sum by ({by}) ({MEM_REC}))", table=True)],
            {"Value": "memory"},
            "memory",
            {"memory": "bytes"},
            width=12,
        ),
        {"namespace": drill("namespace", "namespace")},
    )


def rows() -> list[Row]:
    overview = [
        panels.panel("Overview", "GPUs").span(3),
        panels.panel("Overview", "GPUs in use").span(3),
        _stat(
            "GPUs allocated",
            "Devices (GPUs or MIG instances) the kubelet or a DRA claim allocated to a "
            "container (needs the PodResources source).",
            _allocated_devices(),
            width=3,
        ),
        panels.panel("Overview", "Allocated but idle").span(3),
        _stat(
            "Held while idle",
            "Containers holding over %(idleMemoryGiB)s GiB of a device's memory with no SM use "
            "for the last hour (the namespace dashboard lists them).",
            _held_idle(),
            width=3,
        ),
        panels.panel("Overview", "Pods on GPUs").span(3),
        panels.panel("Overview", "GPU memory used").span(3),
        panels.panel("Overview", "Memory unattributed").span(3),
    ]
    by_namespace = [
        panels.panel("Memory", "GPU memory by namespace").span(8),
        panels.panel("Utilization", "SM utilization by namespace").span(8),
        panels.panel("Power and energy", "Power by namespace"),
        panels.panel("Waste", "Allocated and in use, by namespace").span(16),
        panels.panel("Power and energy", "kWh per namespace per day"),
    ]
    health = [
        _stat(
            "Nodes with an XID",
            "Nodes where a GPU's last XID error is not 0 (docs/runbook.md#gpuxidcriticalerror); "
            "the node dashboard shows which GPU.",
            _nodes_with(f"{_dev('xid')} > 0", _dev("xid")),
            width=6,
        ),
        _stat(
            "Nodes with remapped rows",
            "Nodes with a GPU that remapped rows after uncorrectable memory errors or failed "
            "to remap one.",
            _nodes_with(
                f"{_dev('uncorrectable_remapped_rows')} > 0 or {_dev('row_remap_failure')} > 0",
                _dev("row_remap_failure"),
            ),
            width=6,
        ),
        _stat(
            "Nodes with tainted GPUs",
            "Nodes where NVIDIA's DRA driver taints a GPU or MIG device in its ResourceSlices "
            "(docs/runbook.md#gpudevicetainted).",
            _nodes_with(sel("gpu_device_taint", CLUSTER_FILTER), _dev("gpu_temp")),
            width=6,
        ),
        _stat(
            "Nodes with a source down",
            "Nodes whose enricher failed a data source on its last scrape (the enricher "
            "dashboard says which).",
            _nodes_with(
                f"{sel('dcgm_enricher_source_up', *SELF_FILTER)} == 0",
                sel("dcgm_enricher_source_up", *SELF_FILTER),
            ),
            width=6,
        ),
    ]
    return [
        Row("Devices", overview),
        Row("By namespace", by_namespace),
        Row("Top", [_top_namespaces(), _top_workloads()]),
        Row("Health", health),
    ]


BOARD = Board(
    "cluster",
    "dcgm-enricher.json",
    "The GPU fleet: devices in use, allocated, idle and wasted, memory, SM, power and energy by "
    "namespace, the top namespaces and workloads, and health by node count. From "
    "dcgm-exporter as rewritten by dcgm-enricher.",
    ("datasource", "label_prefix", "cluster"),
    rows,
)
