"""Today's panels (the dashboard of one scope that the family replaced), each placed in its home
dashboard by the dashboard modules: ``panel(row, title)`` builds one afresh. docs/dashboard.md
maps each to its home."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import dashboard as dm

from .common import (
    ALLOCATED_IDLE,
    CL,
    CONTAINER_DEVICE,
    DEV_FILTER,
    DEV_LEGEND,
    DEVICE,
    DEVICE_PARTS_OUT,
    ENERGY,
    FB_USED_DEVICES,
    IDLE_MEMORY,
    IDLE_SINCE,
    IDLE_UTILIZATION,
    IN_USE_SHARE,
    MEM_DEV,
    MEM_REC,
    NOT_REQUESTED,
    NS,
    PEAK_MEMORY_BY_POD_DEVICE,
    POD,
    POD_DEVICE,
    POD_FILTER,
    POD_LEGEND,
    PODS_PER_DEVICE,
    POWER,
    POWER_ON_SHARED,
    PROCESS_CPU,
    SELF_FILTER,
    THRESHOLD_COLORS,
    UNATTR_POWER,
    USER,
    UTIL_DEV,
    UTIL_REC,
    Row,
    Target,
    _bars,
    _rate,
    _series,
    _stat,
    _table,
    device,
    device_record,
    field,
    own_process,
    recorded,
    sel,
    with_owner,
)


def panel(row: str, title: str) -> Any:
    """Today's panel ``title`` of ``row``, built afresh."""
    (found,) = [p for r in rows() if r.title == row for p in r.panels if _title(p) == title]
    return found


def _title(p: Any) -> str:
    return str(p._internal.title)


def rows() -> list[Row]:
    return [
        Row(
            "Overview",
            [
                _stat(
                    "GPUs",
                    "Physical GPUs that report metrics (dcgm-exporter), after the cluster, "
                    "node and GPU filters.",
                    f"count by (%(clusterLabel)s) (count by (%(clusterLabel)s, %(nodeLabel)s, gpu) "
                    f"({field('gpu_temp', *DEV_FILTER)}))",
                ),
                _stat(
                    "GPUs in use",
                    "Physical GPUs with at least one process on them, in a pod or not.",
                    f"count by ({CL}) (count by ({CL}, %(nodeLabel)s, gpu) ({MEM_DEV} or "
                    f"{sel('gpu_unattributed_memory_used_bytes', *DEV_FILTER, DEVICE_PARTS_OUT)}))",
                ),
                _stat(
                    "Pods on GPUs",
                    "Pods with a process on a GPU, after every filter.",
                    f"count by ({CL}) (count by ({CL}, {NS}, {POD}) ({MEM_REC}))",
                ),
                _stat(
                    "GPU memory used",
                    "Device memory in use on the selected GPUs (dcgm-exporter's framebuffer "
                    "counters; MIG GPUs counted per instance).",
                    # max by device: dcgm-exporter's vGPU mode repeats a device per pod.
                    f"sum by (%(clusterLabel)s) (max by ({DEVICE}) ({FB_USED_DEVICES}))",
                    unit="bytes",
                ),
                _stat(
                    "Memory unattributed",
                    "GPU memory held by processes that belong to no known pod (host processes, "
                    "containers outside Kubernetes, pods the watch has not seen; the MPS "
                    "server's own memory, the driver's reservation and memory no listed "
                    "process holds left out). Runbook: "
                    "docs/runbook.md#gpumemoryunattributed.",
                    "sum by (%(clusterLabel)s) ("
                    + sel(
                        "gpu_unattributed_memory_used_bytes",
                        *DEV_FILTER,
                        'reason!~"mps_server|driver_reserved|not_in_process_list"',
                    )
                    + ")",
                    unit="bytes",
                ).color_scheme(THRESHOLD_COLORS),
                _stat(
                    "Allocated but idle",
                    "Devices the kubelet allocated to a container that has no process on them "
                    "or uses them under %(idleUtilizationPercent)s%% right now (needs the "
                    "PodResources source).",
                    f"count by (%(clusterLabel)s) ({ALLOCATED_IDLE})",
                ),
            ],
        ),
        Row(
            "Memory",
            [
                _series(
                    "GPU memory by pod",
                    "Which pods hold GPU memory (NVML's per-process memory, summed per pod "
                    "over its devices).",
                    Target(f"sum by (%(clusterLabel)s, {NS}, {POD}) ({MEM_REC})", POD_LEGEND),
                    unit="bytes",
                    stacked=True,
                    width=12,
                ),
                _series(
                    "GPU memory by namespace",
                    "Which namespaces (teams) hold GPU memory.",
                    Target(f"sum by (%(clusterLabel)s, {NS}) ({MEM_REC})", "{{" + NS + "}}"),
                    unit="bytes",
                    stacked=True,
                    width=12,
                ),
                _series(
                    "GPU memory by workload",
                    "GPU memory per Deployment, Job, StatefulSet, ... (from gpu_pod_info): "
                    "all replicas of a workload together.",
                    Target(
                        f"sum by ({CL}, {NS}, workload_kind, workload_name) ({MEM_REC})",
                        "{{" + NS + "}}/{{workload_kind}}/{{workload_name}}",
                    ),
                    unit="bytes",
                    stacked=True,
                    width=8,
                ),
                _series(
                    "GPU memory by user",
                    "GPU memory per JupyterHub user (the hub.jupyter.org/username annotation "
                    "on gpu_pod_info; pods without it are left out).",
                    Target(
                        "sum by (%(clusterLabel)s, user) ("
                        + recorded(
                            "namespace_pod_device:gpu_container_memory_used_bytes:sum", 'user!=""'
                        )
                        + ")",
                        "{{user}}",
                    ),
                    unit="bytes",
                    stacked=True,
                    width=8,
                ),
                _series(
                    "Unattributed GPU memory by reason",
                    "GPU memory no container holds, per device and reason: processes "
                    "without a pod (host_process, pod_not_found, ...), the driver's "
                    "reservation (driver_reserved) and memory no listed process holds "
                    "(not_in_process_list); with the containers' memory it adds up to the "
                    "device's (docs/metrics.md#unattributed-memory-reason).",
                    Target(
                        "sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, reason) "
                        f"({sel('gpu_unattributed_memory_used_bytes', *DEV_FILTER)})",
                        DEV_LEGEND + " {{GPU_I_ID}} {{reason}}",
                    ),
                    unit="bytes",
                    stacked=True,
                    width=8,
                ),
            ],
        ),
        Row(
            "Utilization",
            [
                _series(
                    "SM utilization by pod",
                    "Share of SM time each pod used, in GPUs: 100% is one GPU kept busy, a pod "
                    "on two busy GPUs shows 200%. NVML has no per-process figure on MIG "
                    "instances, so MIG pods are missing here.",
                    Target(f"sum by (%(clusterLabel)s, {NS}, {POD}) ({UTIL_REC})", POD_LEGEND),
                    unit="percentunit",
                    stacked=True,
                    width=12,
                ),
                _series(
                    "SM utilization by namespace",
                    "GPUs' worth of SM time used per namespace.",
                    Target(f"sum by (%(clusterLabel)s, {NS}) ({UTIL_REC})", "{{" + NS + "}}"),
                    unit="percentunit",
                    stacked=True,
                    width=12,
                ),
            ],
        ),
        Row(
            "Top pods",
            [
                _table(
                    "Top pods by GPU memory",
                    "The 20 pod-device pairs holding the most GPU memory now, with their peak "
                    "over the dashboard's time range and their SM utilization. A peak well "
                    "under 10, 20 or 40 GiB says a MIG slice of that size would do.",
                    [
                        Target(f"sum by ({POD_DEVICE}) ({MEM_REC})", table=True),
                        Target(PEAK_MEMORY_BY_POD_DEVICE, table=True),
                        Target(f"sum by ({POD_DEVICE}) ({UTIL_REC})", table=True),
                    ],
                    {
                        "Value #A": "memory",
                        "Value #B": "peak memory",
                        "Value #C": "SM utilization",
                        "%(nodeLabel)s": "node",
                        "GPU_I_ID": "MIG instance",
                    },
                    "memory",
                    {
                        "memory": "bytes",
                        "peak memory": "bytes",
                        "SM utilization": "percentunit",
                    },
                    limit=20,
                ),
            ],
        ),
        Row(
            "Shared GPUs",
            [
                _series(
                    "Pods per shared device",
                    "Devices (GPUs or MIG instances) with processes of more than one pod: "
                    "time-slicing, MPS, or pods that see every GPU.",
                    Target(f"{PODS_PER_DEVICE} > 1", DEV_LEGEND + " {{GPU_I_ID}}"),
                    width=8,
                ),
                _bars(
                    "Memory split on shared devices",
                    "How the memory of each shared device divides between its pods.",
                    Target(
                        f"sum by ({DEVICE}, {NS}, {POD}) ({MEM_DEV}) and on ({DEVICE}) "
                        f"({PODS_PER_DEVICE} > 1)",
                        DEV_LEGEND + " {{GPU_I_ID}} " + POD_LEGEND,
                        instant=True,
                    ),
                    "bytes",
                ),
                _bars(
                    "SM split on shared devices",
                    "How the SM time of each shared device divides between its pods "
                    "(not available on MIG).",
                    Target(
                        f"sum by ({DEVICE}, {NS}, {POD}) ({UTIL_DEV}) and on ({DEVICE}) "
                        f"({PODS_PER_DEVICE} > 1)",
                        DEV_LEGEND + " {{GPU_I_ID}} " + POD_LEGEND,
                        instant=True,
                    ),
                    "percentunit",
                ),
            ],
        ),
        Row(
            "Waste",
            [
                _table(
                    "Allocated but idle",
                    "Devices allocated to a container that has no process on them, or only "
                    "processes under %(idleUtilizationPercent)s%% SM utilization, right now "
                    "(GpuAllocatedIdle fires "
                    "after two hours). Needs the PodResources source.",
                    [Target(ALLOCATED_IDLE, table=True)],
                    {"Value": "allocated", "%(nodeLabel)s": "node", "GPU_I_ID": "MIG instance"},
                    "namespace",
                    {},
                    ascending=True,
                    width=8,
                ),
                _table(
                    "Memory held while idle",
                    "Containers holding over %(idleMemoryGiB)s GiB of GPU memory with no SM use "
                    "for the last hour: finished jobs and notebooks that kept their CUDA "
                    "context. The 20 of each cluster holding the most.",
                    [
                        Target(
                            "topk by (%(clusterLabel)s) (20, "
                            f"sum by ({CONTAINER_DEVICE}) "
                            f"({sel('gpu_container_memory_used_bytes', *POD_FILTER)}) "
                            f"> {IDLE_MEMORY} and on ({CONTAINER_DEVICE}) "
                            f"max by ({CONTAINER_DEVICE}) (max_over_time("
                            f"{sel('gpu_container_utilization_ratio', *POD_FILTER)}[1h])) "
                            f"< {IDLE_UTILIZATION})",
                            table=True,
                        )
                    ],
                    {"Value": "memory", "%(nodeLabel)s": "node", "GPU_I_ID": "MIG instance"},
                    "memory",
                    {"memory": "bytes"},
                    width=8,
                ),
                _table(
                    "Used without request",
                    "Pods with processes on a GPU that requested no nvidia.com resource and "
                    "hold no allocation (for example NVIDIA_VISIBLE_DEVICES=all).",
                    [Target(NOT_REQUESTED, table=True)],
                    {"Value": "memory", "%(nodeLabel)s": "node", "GPU_I_ID": "MIG instance"},
                    "memory",
                    {"memory": "bytes"},
                    width=8,
                ),
                _table(
                    "Idle since",
                    "When each container last used a GPU it holds (memory or an allocation): "
                    "over --idle.threshold SM utilization on any of its GPUs, by NVML or, on "
                    "MIG, its instance's activity. Never earlier than the enricher's start or "
                    "the container's newest process (docs/metrics.md#idle-since); oldest "
                    "first. GpuHeldIdle fires past the mixin's heldIdleSeconds; "
                    "docs/culling.md stops them.",
                    [Target(IDLE_SINCE, table=True)],
                    {"Value": "last active", "%(nodeLabel)s": "node"},
                    "last active",
                    {"last active": "dateTimeFromNow"},
                    ascending=True,
                    width=24,
                ),
                _series(
                    "Allocated and in use, by namespace",
                    "Devices allocated to each namespace (solid) against the devices its "
                    "processes actually use (a shared device split between its containers). "
                    "The gap is waste; in-use above allocated is use without request.",
                    Target(
                        f"sum by ({CL}, {NS}) ({sel('gpu_container_allocated', *POD_FILTER)})",
                        "{{" + NS + "}} allocated",
                    ),
                    Target(
                        f"sum by (%(clusterLabel)s, {NS}) ({IN_USE_SHARE})", "{{" + NS + "}} in use"
                    ),
                    width=24,
                ),
            ],
        ),
        Row(
            "Power and energy",
            [
                _series(
                    "Watts by pod on shared GPUs",
                    "Each pod's share of the draw of a GPU that more than one pod uses "
                    "(time-slicing, MPS, MIG): by SM time, memory held or allocation "
                    "(docs/power.md). On one GPU the pods' watts and the unattributed watts "
                    "add up to the GPU's power.",
                    Target(
                        f"sum by ({CL}, %(nodeLabel)s, gpu, {NS}, {POD}) ({POWER_ON_SHARED})",
                        DEV_LEGEND + " " + POD_LEGEND,
                    ),
                    unit="watt",
                ),
                _series(
                    "Power by namespace",
                    "The namespaces' shares of their GPUs' draw, and the part no container "
                    "gets (idle GPUs, processes outside pods).",
                    Target(f"sum by (%(clusterLabel)s, {NS}) ({POWER})", "{{" + NS + "}}"),
                    Target(
                        f"sum by (%(clusterLabel)s, reason) ({UNATTR_POWER})",
                        "unattributed: {{reason}}",
                    ),
                    unit="watt",
                    stacked=True,
                ),
                _series(
                    "kWh per namespace per day",
                    "Energy attributed to each namespace's containers over the trailing day, "
                    "from the GPUs' own energy counters, in kWh.",
                    Target(
                        f"sum by (%(clusterLabel)s, {NS}) (increase({ENERGY}[1d])) / 3.6e6",
                        "{{" + NS + "}}",
                    ),
                    unit="kwatth",
                ),
                _table(
                    "Energy per workload and user, last day",
                    "kWh per workload (and JupyterHub user) over the trailing day; pods seen "
                    "with a GPU process only (an allocation alone has no gpu_pod_info).",
                    [
                        Target(
                            f"sum by (%(clusterLabel)s, {NS}, workload_kind, workload_name, "
                            f"{USER}) ("
                            + with_owner(
                                f"sum by (%(clusterLabel)s, {NS}, {POD}) (increase({ENERGY}[1d]))"
                            )
                            + ") / 3.6e6",
                            table=True,
                        )
                    ],
                    {"Value": "kWh"},
                    "kWh",
                    {"kWh": "kwatth"},
                ),
            ],
        ),
        Row(
            "Device health",
            [
                _series(
                    "Temperature",
                    "GPU temperature; GpuTemperatureHigh fires above %(temperatureCelsius)g °C.",
                    Target(device("gpu_temp"), DEV_LEGEND),
                    unit="celsius",
                ),
                _series(
                    "Power",
                    "Power draw per GPU, in watts.",
                    Target(device("power"), DEV_LEGEND),
                    unit="watt",
                ),
                _series(
                    "Device memory used",
                    "Share of each GPU's (or MIG instance's) memory in use; "
                    "GpuMemoryNearlyFull fires above %(memoryNearlyFullPercent)s%%.",
                    Target(
                        f"max by ({DEVICE}) ({device_record('device:gpu_memory_used:ratio')})",
                        DEV_LEGEND + " {{GPU_I_ID}}",
                    ),
                    unit="percentunit",
                ),
                _series(
                    "GPU utilization",
                    "dcgm-exporter's device utilization (the share of time a kernel ran).",
                    Target(device("gpu_util"), DEV_LEGEND),
                    unit="percentunit",
                ),
                _series(
                    "Last XID",
                    "The last XID error code per GPU (0: none). Which codes are critical: "
                    "docs/runbook.md#gpuxidcriticalerror.",
                    Target(device("xid"), DEV_LEGEND),
                ),
                _series(
                    "Remapped memory rows",
                    "Rows remapped after uncorrectable and correctable memory errors, and "
                    "remap failures (any failure: replace the GPU).",
                    Target(device("uncorrectable_remapped_rows"), DEV_LEGEND + " uncorrectable"),
                    Target(device("correctable_remapped_rows"), DEV_LEGEND + " correctable"),
                    Target(device("row_remap_failure"), DEV_LEGEND + " failure"),
                ),
                _series(
                    "Fabric health",
                    "NVML's fabric health summary of GPUs on an NVLink fabric (NVSwitch "
                    "systems, Hopper and later), where dcgm-exporter collects its opt-in fabric "
                    "health summary field: 0 not supported, 1 healthy, 2 unhealthy, "
                    "3 limited capacity. GpuFabricUnhealthy fires from 2 "
                    "(docs/runbook.md#gpufabricunhealthy).",
                    Target(device("fabric_health"), DEV_LEGEND),
                ),
                _series(
                    "PCIe replays",
                    "PCIe transfers the link had to retry, per second; GpuPcieReplaysHigh "
                    "fires above 8 a minute.",
                    Target(
                        device("pcie_replay", "sum", over=lambda s: f"rate({s}[$__rate_interval])"),
                        DEV_LEGEND,
                    ),
                    unit="cps",
                ),
                _series(
                    "Clocks",
                    "SM and memory clocks: an SM clock far under its peers' while busy means "
                    "thermal or power throttling.",
                    Target(device("sm_clock"), DEV_LEGEND + " SM"),
                    Target(device("mem_clock"), DEV_LEGEND + " memory"),
                    unit="hertz",
                ),
                _table(
                    "DRA device taints",
                    "The taints NVIDIA's DRA driver puts on GPUs and MIG devices in the node's "
                    "ResourceSlices (gpu.nvidia.com/xid, gpu-lost, unmonitored): its health "
                    "report. GpuDeviceTainted fires for a container on a tainted device "
                    "(docs/runbook.md#gpudevicetainted).",
                    [
                        Target(
                            f"max by ({CL}, %(nodeLabel)s, gpu, GPU_I_ID, UUID, key, value, "
                            "effect) "
                            f"({sel('gpu_device_taint', *DEV_FILTER)})",
                            table=True,
                        )
                    ],
                    {"Value": "taints", "%(nodeLabel)s": "node", "GPU_I_ID": "MIG instance"},
                    "node",
                    {},
                    ascending=True,
                    width=8,
                ),
            ],
        ),
        Row(
            "dcgm-enricher",
            [
                _stat(
                    "Sources up (worst node)",
                    "Per data source, 1 when it worked on every node's last scrape, 0 when it "
                    "failed on at least one (see the table beside).",
                    f"min by ({CL}, source) ({sel('dcgm_enricher_source_up', *SELF_FILTER)})",
                    legend="{{source}}",
                    width=8,
                )
                .mappings(
                    [
                        dm.ValueMap(
                            options={
                                "0": dm.ValueMappingResult(text="down", color="red"),
                                "1": dm.ValueMappingResult(text="up", color="green"),
                            }
                        )
                    ]
                )
                .color_scheme(THRESHOLD_COLORS)
                .thresholds(
                    dashboard.ThresholdsConfig()
                    .mode(dm.ThresholdsMode.ABSOLUTE)
                    .steps([dm.Threshold(None, "red"), dm.Threshold(1, "green")])
                ),
                _stat(
                    "Enrichers reporting",
                    "Enricher instances scraped, by version.",
                    f"count by ({CL}, version) ({sel('dcgm_enricher_build_info', *SELF_FILTER)})",
                    legend="{{version}}",
                    width=4,
                ),
                _stat(
                    "Pod watch age",
                    "Longest time since an enricher last heard from the Kubernetes API.",
                    "max by (%(clusterLabel)s) (time() - "
                    f"{sel('dcgm_enricher_kubernetes_last_sync_timestamp_seconds', *SELF_FILTER)})",
                    unit="s",
                    width=4,
                ),
                _stat(
                    "Upstream lines dropped",
                    "Invalid or repeated lines dropped from dcgm-exporter's output on the last "
                    "scrapes, all nodes together.",
                    f"sum by ({CL}) ({sel('dcgm_enricher_upstream_invalid_lines', *SELF_FILTER)})",
                    width=8,
                ),
                _table(
                    "Sources per enricher",
                    "The 20 sources of each cluster's enrichers lowest on their last scrape "
                    "(0: failed), failures first: every failure while there are under 20 (the "
                    "GPU / Cluster dashboard counts the nodes with one).",
                    [
                        Target(
                            "bottomk by (%(clusterLabel)s) (20, "
                            "min by (%(clusterLabel)s, instance, %(nodeLabel)s, source) "
                            f"({sel('dcgm_enricher_source_up', *SELF_FILTER)}))",
                            table=True,
                        )
                    ],
                    {"Value": "up", "%(nodeLabel)s": "node"},
                    "up",
                    {},
                    ascending=True,
                    width=8,
                ),
                _series(
                    "Source duration (slowest enricher)",
                    "Time each source took on the slowest enricher's last scrape.",
                    Target(
                        "max by (%(clusterLabel)s, source) "
                        f"({sel('dcgm_enricher_source_duration_seconds', *SELF_FILTER)})",
                        "{{source}}",
                    ),
                    Target(
                        f"max by ({CL}) "
                        f"({sel('dcgm_enricher_scrape_duration_seconds', *SELF_FILTER)})",
                        "whole scrape",
                    ),
                    unit="s",
                ),
                _series(
                    "Source errors",
                    "Errors per second of each source, all enrichers together.",
                    Target(
                        "sum by (%(clusterLabel)s, source) (rate("
                        f"{sel('dcgm_enricher_source_errors_total', *SELF_FILTER)}"
                        "[$__rate_interval]))",
                        "{{source}}",
                    ),
                    unit="cps",
                ),
                _series(
                    "GPU processes",
                    "GPU processes attributed to a pod, and those that are not.",
                    Target(
                        f"sum by ({CL}, state) "
                        f"({sel('dcgm_enricher_gpu_processes', *SELF_FILTER)})",
                        "{{state}}",
                    ),
                    width=8,
                ),
                _series(
                    "Enricher CPU (millicores)",
                    "CPU the enricher itself uses, from its own process_cpu_seconds_total: the "
                    "busiest enricher and the average over all of them. The manifests request "
                    "50m and limit it to 500m; at dcgm-exporter's default rhythm (a collection "
                    "every 30 s) it uses well under a millicore (docs/performance.md).",
                    Target(
                        f"max by (%(clusterLabel)s) ({own_process(PROCESS_CPU)}) * 1000",
                        "busiest enricher",
                    ),
                    Target(
                        f"avg by (%(clusterLabel)s) ({own_process(PROCESS_CPU)}) * 1000",
                        "average",
                    ),
                ),
                _series(
                    "Enricher memory (RSS)",
                    "Resident memory of the enricher itself, from its own "
                    "process_resident_memory_bytes: the largest and the average over all "
                    "enrichers. The manifests request 128Mi and limit it to 256Mi (the steady "
                    "RSS plus one upstream body at --upstream.max-bytes; docs/performance.md); "
                    "GpuEnricherMemoryNearLimit warns at 90 % of the container's limit.",
                    Target(
                        f"max by ({CL}) ({own_process(sel('process_resident_memory_bytes'))})",
                        "largest enricher",
                    ),
                    Target(
                        f"avg by ({CL}) ({own_process(sel('process_resident_memory_bytes'))})",
                        "average",
                    ),
                    unit="bytes",
                ),
                _series(
                    "Upstream requests per collection",
                    "Requests each enricher sends dcgm-exporter per collection it sees: about 2 "
                    "when it follows the upstream (the default), one per scrape with "
                    "--upstream.follow-step=0. Prometheus scraping dcgm-exporter directly would "
                    "send one per scrape.",
                    # No collection in the window (the upstream down: see the sources): no
                    # value rather than +Inf.
                    Target(
                        f"sum by ({CL}) ({_rate('dcgm_enricher_upstream_requests_total')}) / "
                        f"(sum by ({CL}) "
                        f"({_rate('dcgm_enricher_upstream_collections_total')}) > 0)",
                        "all enrichers",
                    ),
                    Target(
                        f"max by ({CL}) ({_rate('dcgm_enricher_upstream_requests_total')} / "
                        f"({_rate('dcgm_enricher_upstream_collections_total')} > 0))",
                        "highest enricher",
                    ),
                    width=12,
                ),
                _series(
                    "Scrapes, upstream requests and collections",
                    "Per second, all enrichers together: scrapes of /metrics served, requests "
                    "sent to dcgm-exporter and dcgm-exporter collections seen.",
                    Target(
                        f"sum by (%(clusterLabel)s) ({_rate('dcgm_enricher_scrapes_total')})",
                        "scrapes",
                    ),
                    Target(
                        f"sum by ({CL}) ({_rate('dcgm_enricher_upstream_requests_total')})",
                        "upstream requests",
                    ),
                    Target(
                        f"sum by ({CL}) ({_rate('dcgm_enricher_upstream_collections_total')})",
                        "collections",
                    ),
                    unit="reqps",
                    width=12,
                ),
                _series(
                    "Bytes sent to scrapers",
                    "Bytes per second of /metrics bodies the enrichers sent, all together, by "
                    "Content-Encoding: gzip to scrapers that accept it (Prometheus does), "
                    "identity otherwise. A gzip body is about 1/18 of the identity one on an "
                    "8 x 7 MIG node (docs/performance.md).",
                    Target(
                        f"sum by ({CL}, encoding) ({_rate('dcgm_enricher_response_bytes_total')})",
                        "{{encoding}}",
                    ),
                    unit="Bps",
                    width=24,
                ),
            ],
        ),
    ]
