"""What every dashboard of the family shares: the series filters, the queries built from them,
the panel builders (grafana-foundation-sdk's typed builders, Grafana 11.6 line) and the links
between the dashboards.

Queries name the mixin's _config as %(name)s (mixin/dashboards/dashboards.libsonnet fills them
in) and Grafana's variables as $name. The filters name every variable any dashboard has; a
dashboard without one of them drops its matcher (``scoped``), which is what that variable on
All (``.*``, matching an absent label too) would select: one query text serves every scope.

dcgm-exporter's fields: every query reads one by meaning (``field("fb_used", ...)``), in its
SI unit, under every name the field table (enricher/dcgm_fields.json) gives it, newest first,
joined by ``or`` (devkit/fieldquery.py): each device answers in whichever naming its node's
exporter writes, so a fleet in the middle of an upgrade shows one number in one unit.

Pod label names: every query writes ``${label_prefix}namespace``, ``${label_prefix}pod`` and
``${label_prefix}container``. ``label_prefix`` is a dashboard text box: empty when Prometheus
scrapes the enricher with ``honor_labels: true`` (every manifest here), ``exported_`` when it
scrapes with ``honor_labels: false`` and renamed the enricher's labels.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
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
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from devkit import fieldquery

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


def field(
    name: str, *matchers: str, over: Callable[[str], str] | None = None, summed: bool = False
) -> str:
    """dcgm-exporter's field ``name`` in its SI unit, whatever naming each node's exporter
    writes: each of its names as a selector (the mixin's _config.dcgmSelector first), ``over``
    wrapping each (a range function), joined by ``or``, or ``summed`` (a counter's rate:
    devkit/fieldquery.py)."""
    return fieldquery.read(name, DCGM_SELECTOR, *matchers, over=over, summed=summed)


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
# the per-container series to gpu_pod_info at every step (22 to 73x the sum of the gpu_util
# field on 100 to 1,000 simulated nodes: docs/performance.md#a-fleet-on-one-prometheus).
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
# Framebuffer memory in use, in bytes.
MIG_FB_USED = field("fb_used", *DEV_FILTER, 'GPU_I_ID!=""')
# MIG GPUs report memory per instance: count those, and the whole GPUs without instances.
FB_USED_DEVICES = (
    f"{MIG_FB_USED} or ({field('fb_used', *DEV_FILTER)} "
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


def device(name: str, agg: str = "max", over: Callable[[str], str] | None = None) -> str:
    """dcgm-exporter's field ``name`` per GPU (its SI unit), after the device filters: each
    name aggregated, then scaled (devkit/fieldquery.aggregate)."""
    return fieldquery.aggregate(
        name, agg, "%(clusterLabel)s, %(nodeLabel)s, gpu", DCGM_SELECTOR, *DEV_FILTER, over=over
    )


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
POD_DEVICE = (
    f"%(clusterLabel)s, {NS}, {POD}, workload_kind, workload_name, %(nodeLabel)s, gpu, GPU_I_ID"
)
# The peak over the range: the record is already one series per pod and device with its
# owners, so the peak of each is the peak of the sum, without a subquery (106x the range
# baseline on 100 simulated nodes with the join inside a subquery, 44x on 300
# with the join outside: bench/fleet.py, docs/performance.md#a-fleet-on-one-prometheus).
PEAK_MEMORY_BY_POD_DEVICE = f"sum by ({POD_DEVICE}) (max_over_time({MEM_REC}[$__range]))"


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


# --------------------------------------------------------------------------- the family


@dataclass(frozen=True)
class Board:
    """One dashboard of the family: its key in _config (``<key>DashboardUid``, ``...Title``),
    its file (in mixin/dashboards/ and grafana/), its variables and its rows."""

    key: str
    file: str
    description: str
    variables: tuple[str, ...]
    rows: Any  # () -> list[Row]


# A matcher on a dashboard variable: `label=~"$var"` (after the `, ` that joins it to the one
# before: the first matcher of every selector is _config.dcgmSelector or the cluster's).
_MATCHER = re.compile(r', (?:\$\{label_prefix\})?[\w%()]+=~"\$(\w+)"')


def scoped(text: str, variables: tuple[str, ...]) -> str:
    """``text`` without the matchers on variables the dashboard does not have: what each of
    them on All (``.*``, which matches an absent label too) selects."""
    return _MATCHER.sub(lambda m: m.group(0) if m.group(1) in variables else "", text)


# The dashboards' uids, from _config (mixin/dashboards/dashboards.libsonnet fills them in).
def uid(key: str) -> str:
    return f"%({key}DashboardUid)s"


def drill(key: str, *fields: str) -> list[dict[str, Any]]:
    """A data link to dashboard ``key`` that keeps the data source, the label prefix, the
    cluster selection and the time range, and sets each variable of ``fields`` from the
    clicked row's column of that name (kubernetes-mixin's drill-down)."""
    params = "&".join(
        ["${datasource:queryparam}", "${label_prefix:queryparam}", "${cluster:queryparam}"]
        + [f"var-{f}=${{__data.fields.{f}}}" for f in fields]
        + ["${__url_time_range}"]
    )
    return [{"title": f"{key} dashboard", "url": f"/d/{uid(key)}/?{params}"}]


def with_links(panel: Any, links: dict[str, list[dict[str, Any]]]) -> Any:
    """``panel`` (a table) with a data link on each named column."""
    for column, link in links.items():
        panel.override_by_name(column, [dm.DynamicConfigValue(id_val="links", value=link)])
    return panel
