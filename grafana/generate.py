"""Generate the dashboard of the mixin (mixin/dashboards/dcgm-enricher.json), then build the
mixin and write what it makes with the default _config: grafana/dcgm-enricher.json and its
ConfigMap for the Grafana sidecar (manifests/monitoring/grafana-dashboard.yaml).

The dashboard is written as code here so that every panel's query is built from the same
filters and the tests can run each of them against a real Prometheus; grafana-foundation-sdk's
builders (Python 3.11 or newer) write Grafana's JSON model and lay the panels out
(docs/dashboard.md says what it cannot express: those parts stay plain JSON here). Its queries
name the mixin's _config as %(name)s (the dcgm-exporter series selector, the cluster label, the idle
thresholds); mixin/dashboards/dashboards.libsonnet fills them in, with the uid, title and
refresh, so a user's _config override reaches every query.

    python grafana/generate.py          # rewrite the three files
    python grafana/generate.py --check  # exit 1 if any is out of date (what the tests check)

Pod label names: every query writes ``${label_prefix}namespace``, ``${label_prefix}pod`` and
``${label_prefix}container``. ``label_prefix`` is a dashboard text box: empty when Prometheus
scrapes the enricher with ``honor_labels: true`` (every manifest here), ``exported_`` when it
scrapes with ``honor_labels: false`` and renamed the enricher's labels.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "grafana" / "dcgm-enricher.json"
TEMPLATE = ROOT / "mixin" / "dashboards" / "dcgm-enricher.json"
CONFIGMAP = ROOT / "manifests" / "monitoring" / "grafana-dashboard.yaml"

SCHEMA_VERSION = 39  # Grafana 11.0; newer Grafanas migrate it on load
DS_JSON = {"type": "prometheus", "uid": "${datasource}"}
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
THRESHOLD_COLORS = dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)
# The label that names the JupyterHub user on gpu_pod_info: the mixin's _config.userLabel.
USER = "%(userLabel)s"

# Pod label names as Prometheus stored them (see the module docstring).
NS = "${label_prefix}namespace"
POD = "${label_prefix}pod"
CTR = "${label_prefix}container"

# A device: the node (the enricher's node label, _config.nodeLabel: the Kubernetes node's name
# whatever dcgm-exporter calls its own label), the GPU index and, for MIG, the GPU instance.
DEVICE = "%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID"
DEV_FILTER = ('%(clusterLabel)s=~"$cluster"', '%(nodeLabel)s=~"$node"', 'gpu=~"$gpu"')
NS_FILTER = f'{NS}=~"$namespace"'
WORKLOAD_FILTER = 'workload_name=~"$workload"'
POD_FILTER = (*DEV_FILTER, NS_FILTER, f'{POD}=~"$pod"')
SELF_FILTER = ('%(clusterLabel)s=~"$cluster"',)
# The cluster label, for the aggregations that keep each cluster apart (tests/test_clusters.py).
CL = "%(clusterLabel)s"
# The mixin's _config (mixin/config.libsonnet) fills these in: queries name them as
# %(name)s, which mixin/dashboards/dashboards.libsonnet formats.
DCGM_SELECTOR = "%(dcgmSelector)s"
IDLE_UTILIZATION = "%(idleUtilizationThreshold)g"
IDLE_MEMORY = "%(idleMemoryBytes)d"


def sel(metric: str, *matchers: str) -> str:
    """A series selector; the mixin's _config.dcgmSelector comes first (an empty one vanishes)."""
    return metric + "{" + ", ".join((DCGM_SELECTOR, *matchers)) + "}"


def owners(*extra: str) -> str:
    """The workload and user of each pod, filtered by the workload and user variables."""
    info = sel(
        "gpu_pod_info",
        '%(clusterLabel)s=~"$cluster"',
        'workload_name=~"$workload"',
        f'{USER}=~"$user"',
        *extra,
    )
    return f"max by (%(clusterLabel)s, {NS}, {POD}, workload_kind, workload_name, {USER}) ({info})"


def with_owner(series: str, *extra: str) -> str:
    """Per-container series joined to their pod's workload and user (and filtered by them)."""
    return (
        f"{series} * on (%(clusterLabel)s, {NS}, {POD}) "
        f"group_left (workload_kind, workload_name, {USER}) {owners(*extra)}"
    )


def record_sel(record: str, *matchers: str) -> str:
    """A record of the mixin's rules (the dcgm-enricher.dashboard group), filtered by
    ``matchers``; no dcgmSelector: a record has no job label."""
    return record + "{" + ", ".join(matchers) + "}"


def recorded(record: str, *extra: str) -> str:
    """A record filtered by every variable: each pod's series on each device with its workload
    and ``user`` (the owners joined once per rule evaluation, not at every step of the panel).
    The records keep ``exported_namespace`` and ``exported_pod`` where Prometheus scrapes with
    honor_labels: false, so ${label_prefix} names the pod in either mode."""
    return record_sel(record, *POD_FILTER, WORKLOAD_FILTER, 'user=~"$user"', *extra)


def device_record(record: str) -> str:
    """A per-device record, filtered by the device variables."""
    return record_sel(record, *DEV_FILTER)


# Each pod's memory and SM use per device, with its owners (recorded: mixin/rules): the panels
# that count pods or sum them by pod, namespace, workload or user read these instead of joining
# the per-container series to gpu_pod_info at every step (22 to 73x sum(DCGM_FI_DEV_GPU_UTIL)
# on 100 to 1,000 simulated nodes: docs/performance.md#a-fleet-on-one-prometheus).
MEM_REC = recorded("namespace_pod_device:gpu_container_memory_used_bytes:sum")
UTIL_REC = recorded("namespace_pod_device:gpu_container_utilization_ratio:sum")
MEM_DEV = sel("gpu_container_memory_used_bytes", *DEV_FILTER)
# The unattributed memory of processes only: the device-level parts are on every device.
DEVICE_PARTS_OUT = 'reason!~"driver_reserved|not_in_process_list"'
UTIL_DEV = sel("gpu_container_utilization_ratio", *DEV_FILTER)
CONTAINER_DEVICE = f"{DEVICE}, UUID, {NS}, {POD}, {CTR}"


# Allocated but idle (recorded: mixin/rules, where GpuAllocatedIdle reads the same record).
ALLOCATED_IDLE = (
    f"max by ({CONTAINER_DEVICE}) "
    f"({record_sel('namespace_pod_container_device:gpu_allocated_idle:max', *POD_FILTER)})"
)
NOT_REQUESTED = (
    f"sum by ({CONTAINER_DEVICE}, {USER}) ("
    + with_owner(sel("gpu_container_memory_used_bytes", *POD_FILTER), 'gpu_requested="false"')
    + f") unless on (%(clusterLabel)s, {NS}, {POD}) {sel('gpu_container_allocated')}"
)
# When each container last used any GPU it holds (ms, for Grafana's time units), with its
# workload and user (recorded: mixin/rules, the owners joined once per evaluation; a container
# with no GPU process, an allocation alone, keeps its row without them).
IDLE_SINCE = (
    f"max by (%(clusterLabel)s, %(nodeLabel)s, {NS}, {POD}, {CTR}, workload_kind, workload_name, "
    "user) ("
    + recorded("namespace_pod_container_device:gpu_container_last_active_timestamp_seconds:max")
    + ") * 1000"
)
# Pods, and containers, with a GPU process on each device (recorded: mixin/rules).
PODS_PER_DEVICE = device_record("device:gpu_pods:count")
CONTAINERS_PER_DEVICE = device_record("device:gpu_containers:count")
MIG_FB_USED = sel("DCGM_FI_DEV_FB_USED", *DEV_FILTER, 'GPU_I_ID!=""')
# MIG GPUs report memory per instance: count those, and the whole GPUs without instances.
FB_USED_DEVICES = (
    f"{MIG_FB_USED} or ({sel('DCGM_FI_DEV_FB_USED', *DEV_FILTER)} "
    f"unless on (%(clusterLabel)s, %(nodeLabel)s, gpu) {MIG_FB_USED})"
)
IN_USE_SHARE = (
    f"count by ({DEVICE}, {NS}) ({sel('gpu_container_memory_used_bytes', *POD_FILTER)}) "
    f"/ on ({DEVICE}) group_left () {CONTAINERS_PER_DEVICE}"
)


POWER = sel("gpu_container_power_watts", *POD_FILTER)
ENERGY = sel("gpu_container_energy_joules_total", *POD_FILTER)
UNATTR_POWER = sel("gpu_unattributed_power_watts", *DEV_FILTER)
# Each pod's watts on each GPU that more than one pod draws on (recorded).
POWER_ON_SHARED = record_sel(
    "namespace_pod_gpu:gpu_container_power_watts:sum_on_shared", *POD_FILTER
)


def device(metric: str, agg: str = "max") -> str:
    return f"{agg} by (%(clusterLabel)s, %(nodeLabel)s, gpu) ({sel(metric, *DEV_FILTER)})"


# --------------------------------------------------------------------------- panels
# Grafana's JSON model is grafana-foundation-sdk's (the Grafana 11.6 line, pinned in
# pyproject.toml): typed builders per panel kind, laid out row by row by the dashboard builder.


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False

    def query(self, ref: str) -> prometheus.Dataquery:
        query = (
            prometheus.Dataquery()
            .datasource(DS)
            .ref_id(ref)
            .expr(self.expr)
            .legend_format(self.legend or "__auto")
        )
        if self.table:
            query.format(pm.PromQueryFormat.TABLE)
        return query.instant() if self.instant or self.table else query.range()


@dataclass
class Row:
    title: str
    panels: list[Any]


def _panel(
    kind: Any, title: str, description: str, targets: list[Target], unit: str, w: int, h: int
) -> Any:
    """A panel of builder ``kind`` with what every panel has."""
    panel = kind.Panel().title(title).description(description).datasource(DS).unit(unit)
    for i, target in enumerate(targets):
        panel.with_target(target.query(chr(ord("A") + i)))
    return panel.span(w).height(h)


LAST = common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def _stat(title: str, description: str, expr: str, unit: str = "short", **kw: Any) -> Any:
    target = Target(expr, kw.pop("legend", ""), instant=True)
    return (
        _panel(stat, title, description, [target], unit, kw.pop("width", 4), 4)
        .reduce_options(LAST)
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .text_mode(cm.BigValueTextMode.AUTO)
        .justify_mode(cm.BigValueJustifyMode.AUTO)
        .orientation(cm.VizOrientation.AUTO)
        .no_value("0")
    )


def _series(
    title: str,
    description: str,
    *targets: Target,
    unit: str = "short",
    width: int = 8,
    stacked: bool = False,
) -> Any:
    return (
        _panel(timeseries, title, description, list(targets), unit, width, 8)
        .draw_style(cm.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(25 if stacked else 0)
        .stacking(
            common.StackingConfig()
            .mode(cm.StackingMode.NORMAL if stacked else cm.StackingMode.NONE)
            .group("A")
        )
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(
            common.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.RIGHT)
            .calcs(["lastNotNull"])
            .show_legend(True)
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(cm.TooltipDisplayMode.MULTI)
            .sort(cm.SortOrder.DESCENDING)
        )
    )


def _bars(title: str, description: str, target: Target, unit: str) -> Any:
    """Each series' last value as a horizontal bar."""
    return (
        _panel(bargauge, title, description, [target], unit, 8, 8)
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .reduce_options(LAST)
        .show_unfilled(True)
    )


def _table(
    title: str,
    description: str,
    targets: list[Target],
    names: dict[str, str],
    sort_by: str,
    units: dict[str, str],
    *,
    limit: int = 0,
    ascending: bool = False,
    width: int = 24,
) -> Any:
    renames = {
        "exported_namespace": "namespace",
        "exported_pod": "pod",
        "exported_container": "container",
        USER: "user",
        **names,
    }
    steps = [
        ("merge", {}),
        ("organize", {"excludeByName": {"Time": True}, "renameByName": renames}),
        ("sortBy", {"sort": [{"field": sort_by, "desc": not ascending}]}),
    ]
    if limit:
        steps.append(("limit", {"limitField": limit}))
    panel = (
        _panel(table, title, description, targets, "short", width, 8)
        .transformations([dm.DataTransformerConfig(id_val=i, options=o) for i, o in steps])
        .show_header(True)
        .cell_height(cm.TableCellHeight.SM)
        .footer(common.TableFooterOptions().show(False).reducer([]))
    )
    for column, unit in units.items():
        panel.override_by_name(column, [dm.DynamicConfigValue(id_val="unit", value=unit)])
    return panel


# --------------------------------------------------------------------------- the panels

DEV_LEGEND = "{{%(nodeLabel)s}} GPU {{gpu}}"
POD_LEGEND = "{{" + NS + "}}/{{" + POD + "}}"
POD_DEVICE = f"%(clusterLabel)s, {NS}, {POD}, workload_kind, workload_name, %(nodeLabel)s, gpu, GPU_I_ID"
# The peak over the range: the record is already one series per pod and device with its
# owners, so the peak of each is the peak of the sum, without a subquery (106x
# sum(DCGM_FI_DEV_GPU_UTIL) on 100 simulated nodes with the join inside a subquery, 44x on 300
# with the join outside: bench/fleet.py, docs/performance.md#a-fleet-on-one-prometheus).
PEAK_MEMORY_BY_POD_DEVICE = f"sum by ({POD_DEVICE}) (max_over_time({MEM_REC}[$__range]))"


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
                    f"({sel('DCGM_FI_DEV_GPU_TEMP', *DEV_FILTER)}))",
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
                    f"sum by (%(clusterLabel)s) (max by ({DEVICE}) ({FB_USED_DEVICES})) * 1048576",
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
                    "for the last "
                    "hour: finished jobs and notebooks that kept their CUDA context.",
                    [
                        Target(
                            f"sum by ({CONTAINER_DEVICE}) "
                            f"({sel('gpu_container_memory_used_bytes', *POD_FILTER)}) "
                            f"> {IDLE_MEMORY} and on ({CONTAINER_DEVICE}) "
                            f"max by ({CONTAINER_DEVICE}) (max_over_time("
                            f"{sel('gpu_container_utilization_ratio', *POD_FILTER)}[1h])) "
                            f"< {IDLE_UTILIZATION}",
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
                    Target(device("DCGM_FI_DEV_GPU_TEMP"), DEV_LEGEND),
                    unit="celsius",
                ),
                _series(
                    "Power",
                    "Power draw per GPU, in watts.",
                    Target(device("DCGM_FI_DEV_POWER_USAGE"), DEV_LEGEND),
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
                    Target(device("DCGM_FI_DEV_GPU_UTIL"), DEV_LEGEND),
                    unit="percent",
                ),
                _series(
                    "Last XID",
                    "The last XID error code per GPU (0: none). Which codes are critical: "
                    "docs/runbook.md#gpuxidcriticalerror.",
                    Target(device("DCGM_FI_DEV_XID_ERRORS"), DEV_LEGEND),
                ),
                _series(
                    "Remapped memory rows",
                    "Rows remapped after uncorrectable and correctable memory errors, and "
                    "remap failures (any failure: replace the GPU).",
                    Target(
                        device("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
                        DEV_LEGEND + " uncorrectable",
                    ),
                    Target(
                        device("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
                        DEV_LEGEND + " correctable",
                    ),
                    Target(device("DCGM_FI_DEV_ROW_REMAP_FAILURE"), DEV_LEGEND + " failure"),
                ),
                _series(
                    "Fabric health",
                    "NVML's fabric health summary of GPUs on an NVLink fabric (NVSwitch "
                    "systems, Hopper and later), where dcgm-exporter collects the opt-in "
                    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY: 0 not supported, 1 healthy, 2 unhealthy, "
                    "3 limited capacity. GpuFabricUnhealthy fires from 2 "
                    "(docs/runbook.md#gpufabricunhealthy).",
                    Target(device("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"), DEV_LEGEND),
                ),
                _series(
                    "PCIe replays",
                    "PCIe transfers the link had to retry, per second; GpuPcieReplaysHigh "
                    "fires above 8 a minute.",
                    Target(
                        "sum by (%(clusterLabel)s, %(nodeLabel)s, gpu) (rate("
                        f"{sel('DCGM_FI_DEV_PCIE_REPLAY_COUNTER', *DEV_FILTER)}"
                        "[$__rate_interval]))",
                        DEV_LEGEND,
                    ),
                    unit="cps",
                ),
                _series(
                    "Clocks",
                    "SM and memory clocks: an SM clock far under its peers' while busy means "
                    "thermal or power throttling.",
                    Target(device("DCGM_FI_DEV_SM_CLOCK"), DEV_LEGEND + " SM"),
                    Target(device("DCGM_FI_DEV_MEM_CLOCK"), DEV_LEGEND + " memory"),
                    unit="rotmhz",
                ),
                _table(
                    "DRA device taints",
                    "The taints NVIDIA's DRA driver puts on GPUs and MIG devices in the node's "
                    "ResourceSlices (gpu.nvidia.com/xid, gpu-lost, unmonitored): its health "
                    "report. GpuDeviceTainted fires for a container on a tainted device "
                    "(docs/runbook.md#gpudevicetainted).",
                    [
                        Target(
                            f"max by ({CL}, %(nodeLabel)s, gpu, GPU_I_ID, UUID, key, value, effect) "
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
                    "Each enricher's sources on its last scrape (0: failed); failures first.",
                    [
                        Target(
                            "min by (%(clusterLabel)s, instance, %(nodeLabel)s, source) "
                            f"({sel('dcgm_enricher_source_up', *SELF_FILTER)})",
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


def _rate(counter: str) -> str:
    """The per-second rate of one of the enricher's own counters."""
    return f"rate({sel(counter, *SELF_FILTER)}[$__rate_interval])"


PROCESS_CPU = f"rate({sel('process_cpu_seconds_total')}[$__rate_interval])"


def own_process(expr: str) -> str:
    """``expr`` over process_* series kept to the enricher's own targets: those series carry
    no name of their own (every prometheus_client and Go exporter writes them), so they are
    joined to the target's dcgm_enricher_build_info."""
    info = sel("dcgm_enricher_build_info", *SELF_FILTER)
    return f"{expr} * on (%(clusterLabel)s, job, instance) group_left () {info}"


# --------------------------------------------------------------------------- rendering


def _query_variable(name: str, label: str, definition: str, description: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "description": description,
        "datasource": DS_JSON,
        "definition": definition,
        "query": {"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "multi": True,
        "includeAll": True,
        # Matches series that lack the label too (no cluster label, a device with no pod).
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
    }


def variables() -> list[dict[str, Any]]:
    return [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "regex": "",
            "current": {},
            "options": [],
            "hide": 0,
        },
        {
            "type": "textbox",
            "name": "label_prefix",
            "label": "Pod label prefix",
            "description": "Leave empty when Prometheus scrapes the enricher with "
            "honor_labels: true (every manifest of dcgm-enricher does). Type exported_ when it "
            "scrapes with honor_labels: false and stored the pod labels as exported_namespace, "
            "exported_pod and exported_container.",
            "query": "",
            "current": {"selected": False, "text": "", "value": ""},
            "options": [{"selected": True, "text": "", "value": ""}],
            "hide": 0,
        },
        _query_variable(
            "cluster",
            "Cluster",
            f"label_values({sel('DCGM_FI_DEV_GPU_TEMP')}, %(clusterLabel)s)",
            "Where the series carry a cluster label (external labels, Thanos, Mimir).",
        ),
        _query_variable(
            "node",
            "Node",
            f"label_values({sel('DCGM_FI_DEV_GPU_TEMP', *SELF_FILTER)}, %(nodeLabel)s)",
            "The node's name, from the enricher's node label (the Kubernetes node, or the host).",
        ),
        _query_variable(
            "gpu",
            "GPU",
            f"label_values({sel('DCGM_FI_DEV_GPU_TEMP', *DEV_FILTER[:2])}, gpu)",
            "GPU index on the node.",
        ),
        _query_variable(
            "namespace",
            "Namespace",
            f"label_values({sel('gpu_container_memory_used_bytes', *DEV_FILTER[:2])}, {NS})",
            "Namespaces with a process on a GPU.",
        ),
        _query_variable(
            "workload",
            "Workload",
            f"label_values({sel('gpu_pod_info', *SELF_FILTER, NS_FILTER)}, workload_name)",
            "The pods' controller: Deployment, Job, StatefulSet, ... (gpu_pod_info).",
        ),
        _query_variable(
            "pod",
            "Pod",
            f"label_values({sel('gpu_pod_info', *SELF_FILTER, NS_FILTER, WORKLOAD_FILTER)}, {POD})",
            "Pods with a process on a GPU.",
        ),
        _query_variable(
            "user",
            "User",
            f"label_values({sel('gpu_pod_info', *SELF_FILTER, NS_FILTER)}, {USER})",
            "JupyterHub user, from the hub.jupyter.org/username annotation the enricher "
            "copies onto gpu_pod_info (--kube.pod-annotations).",
        ),
    ]


def _dashboard_defaults() -> dict[str, str]:
    """The uid, title and refresh of mixin/config.libsonnet's _config: defined there once."""
    text = _mixin_build().evaluate(
        "{uid: mixin._config.dashboardUid, title: mixin._config.dashboardTitle,"
        " refresh: mixin._config.dashboardRefresh}"
    )
    loaded: dict[str, str] = json.loads(text)
    return loaded


def build() -> dict[str, Any]:
    defaults = _dashboard_defaults()
    board = (
        dashboard.Dashboard(defaults["title"])
        .uid(defaults["uid"])
        .description(
            "Who uses the GPUs: per-pod, namespace, workload and user GPU memory and "
            "utilization, shared GPUs, waste and device health, from dcgm-exporter as rewritten "
            "by dcgm-enricher."
        )
        .tags(["gpu", "dcgm", "kubernetes", "dcgm-enricher"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .time("now-6h", "now")
        .refresh(defaults["refresh"])
        .timezone("")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        # A runbook link needs the URL where docs/runbook.md is published for the users: the
        # chart adds it from prometheusRule.runbookUrl (docs/alerts.md).
        .links([])
    )
    for row in rows():
        board.with_row(dashboard.Row(row.title))
        for panel in row.panels:
            board.with_panel(panel)
    model = board.build()
    model.schema_version = SCHEMA_VERSION
    for pid, panel in enumerate(model.panels or [], 1):
        panel.id_val = pid
    out: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(model))
    # Not in the SDK's types: a query variable's `definition` (what Grafana's Prometheus
    # variable editor shows) and a Prometheus annotation's step, title and text formats.
    out["templating"] = {"list": variables()}
    out["annotations"] = {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            {
                "datasource": DS_JSON,
                "enable": True,
                "iconColor": "red",
                "name": "GPU alerts",
                # The cluster's alerts only, where one Prometheus (Thanos, Mimir) holds many.
                "expr": 'ALERTS{alertname=~"Gpu.*", alertstate="firing", '
                '%(clusterLabel)s=~"$cluster"}',
                "step": "60s",
                "titleFormat": "{{alertname}}",
                "textFormat": "{{%(nodeLabel)s}} {{gpu}} {{namespace}}/{{pod}}",
                "useValueForTime": False,
            },
        ]
    }
    return out


def render_template() -> str:
    """The mixin's dashboard, its queries naming _config as %(name)s."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def _mixin_build() -> Any:
    """mixin/build.py, loaded once a process, so that every caller shares its cached builds."""
    if "mixin_build" not in sys.modules:
        spec = importlib.util.spec_from_file_location("mixin_build", ROOT / "mixin" / "build.py")
        assert spec is not None and spec.loader is not None
        sys.modules["mixin_build"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["mixin_build"])
    return sys.modules["mixin_build"]


def render_dashboard(config: str | None = None) -> str:
    """The dashboard the mixin builds (from the template on disk) with the default _config, or
    with ``config`` (a jsonnet object) merged into it."""
    return str(_mixin_build().dashboards(config)["dcgm-enricher.json"])


def render_configmap(dashboard_json: str) -> str:
    """A ConfigMap that the Grafana sidecar (label grafana_dashboard: "1") loads."""
    body = "".join(f"    {line}\n" if line else "\n" for line in dashboard_json.splitlines())
    return (
        "# GENERATED by grafana/generate.py (the mixin's dashboard, default _config): do not\n"
        "# edit.\n"
        "# The Grafana sidecar of kube-prometheus-stack (grafana.sidecar.dashboards.enabled)\n"
        '# loads every ConfigMap labelled grafana_dashboard: "1"; it must watch this namespace\n'
        "# (sidecar.dashboards.searchNamespace: ALL, or the namespace of this ConfigMap).\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: dcgm-enricher-dashboard\n"
        "  labels:\n"
        '    grafana_dashboard: "1"\n'
        "  annotations:\n"
        "    # Folder, where the sidecar is configured with folderAnnotation: grafana_folder.\n"
        "    grafana_folder: GPU\n"
        "data:\n"
        "  dcgm-enricher.json: |\n" + body
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args(argv)
    template = render_template()
    if args.check:
        outputs = {TEMPLATE: template}
        if TEMPLATE.exists() and TEMPLATE.read_text("utf-8") == template:
            dashboard = render_dashboard()
            outputs |= {DASHBOARD: dashboard, CONFIGMAP: render_configmap(dashboard)}
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text("utf-8") != text]
        for path in stale:
            print(f"{path} is stale: run python grafana/generate.py", file=sys.stderr)
        return 1 if stale else 0
    TEMPLATE.write_text(template, encoding="utf-8")
    dashboard = render_dashboard()
    for path, text in {DASHBOARD: dashboard, CONFIGMAP: render_configmap(dashboard)}.items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
