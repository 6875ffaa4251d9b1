"""GPU / Pod: one pod's containers on each device it uses or holds: memory, SM, power,
energy, idle since, its allocation, and the health of those devices."""

from __future__ import annotations

from . import panels
from .common import (
    CL,
    CTR,
    DEV_LEGEND,
    ENERGY,
    NS,
    POD,
    POD_FILTER,
    POWER,
    Board,
    Row,
    Target,
    _series,
    _table,
    device,
    drill,
    sel,
    with_links,
)

# A container on a device.
ON_DEVICE = f"{CL}, %(nodeLabel)s, gpu, GPU_I_ID, {NS}, {POD}, {CTR}"
ON_DEVICE_LEGEND = DEV_LEGEND + " {{GPU_I_ID}} {{" + CTR + "}}"
# The devices the pod uses (a process) or holds (an allocation).
POD_DEVICES = (
    f"count by ({CL}, %(nodeLabel)s, gpu) "
    f"({sel('gpu_container_memory_used_bytes', *POD_FILTER)} "
    f"or {sel('gpu_container_allocated', *POD_FILTER)})"
)


def _on_pod_devices(expr: str) -> str:
    return f"{expr} and on ({CL}, %(nodeLabel)s, gpu) {POD_DEVICES}"


def _per_container(metric: str) -> str:
    return f"sum by ({ON_DEVICE}) ({sel(metric, *POD_FILTER)})"


def rows() -> list[Row]:
    containers = [
        _series(
            "Memory per container and device",
            "GPU memory each container's processes hold, per device (NVML's per-process memory).",
            Target(_per_container("gpu_container_memory_used_bytes"), ON_DEVICE_LEGEND),
            unit="bytes",
            width=12,
        ),
        _series(
            "SM utilization per container and device",
            "Share of each device's SM time the container used (not on MIG: NVML has no "
            "per-process figure there).",
            Target(_per_container("gpu_container_utilization_ratio"), ON_DEVICE_LEGEND),
            unit="percentunit",
            width=12,
        ),
        _series(
            "Power per container and device",
            "Each container's share of its device's draw (docs/power.md).",
            Target(f"sum by ({ON_DEVICE}) ({POWER})", ON_DEVICE_LEGEND),
            unit="watt",
        ),
        _series(
            "Energy over the trailing day",
            "kWh each container drew on each device over the trailing day.",
            Target(f"sum by ({ON_DEVICE}) (increase({ENERGY}[1d])) / 3.6e6", ON_DEVICE_LEGEND),
            unit="kwatth",
        ),
        with_links(
            _table(
                "Allocation",
                "The devices the kubelet or a DRA claim allocated to each container, by "
                "resource (needs the PodResources source). A node opens its dashboard.",
                [
                    Target(
                        f"max by ({ON_DEVICE}, UUID, resource) "
                        f"({sel('gpu_container_allocated', *POD_FILTER)})",
                        table=True,
                    )
                ],
                {"Value": "allocated", "%(nodeLabel)s": "node", "GPU_I_ID": "MIG instance"},
                "container",
                {},
                ascending=True,
                width=8,
            ),
            {"node": drill("node", "node")},
        ),
        panels.panel("Waste", "Idle since"),
    ]
    health = [
        _series(
            "Temperature of its GPUs",
            "The temperature of each GPU the pod uses or holds; GpuTemperatureHigh fires "
            "above %(temperatureCelsius)g °C.",
            Target(_on_pod_devices(device("gpu_temp")), DEV_LEGEND),
            unit="celsius",
        ),
        _series(
            "Last XID of its GPUs",
            "The last XID error code of each GPU the pod uses or holds (0: none; "
            "docs/runbook.md#gpuxidcriticalerror).",
            Target(_on_pod_devices(device("xid")), DEV_LEGEND),
        ),
        _series(
            "Remapped rows of its GPUs",
            "Rows remapped after uncorrectable memory errors, and remap failures, on the GPUs "
            "the pod uses or holds (any failure: replace the GPU).",
            Target(
                _on_pod_devices(device("uncorrectable_remapped_rows")),
                DEV_LEGEND + " uncorrectable",
            ),
            Target(_on_pod_devices(device("row_remap_failure")), DEV_LEGEND + " failure"),
        ),
    ]
    return [Row("Containers on devices", containers), Row("Its devices' health", health)]


BOARD = Board(
    "pod",
    "dcgm-enricher-pod.json",
    "One pod's containers on each GPU or MIG device: memory, SM, power, energy, idle since, "
    "allocation, and the health of its devices.",
    ("datasource", "label_prefix", "cluster", "namespace", "pod"),
    rows,
)
