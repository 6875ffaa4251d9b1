"""How each dcgm-exporter release writes its /metrics: the SIMULATED exporter's dialects.

Pure data and one pure writer. Each :class:`Dialect` says what NVIDIA's code at that release
writes (cited per trait below, path@commit of NVIDIA/dcgm-exporter): the host label's name,
which labels come in which order, which fields the default counters file has and their HELP
text, how values are formatted, the order of families, and what Kubernetes mode does with a
device several pods share (``--kubernetes-virtual-gpus``). :func:`render` writes a body from
rows the simulation computes; ``enricher.demo`` owns the rows.

Commits: 3.3.1 = tag 3.3.3-3.3.1 (0518edcf895579159aff977728f0535e55f1ed5e); 4.2.0 = tag
4.2.3-4.2.0 (9378144a2febda0c61f80130fbd11d69ff98e7b6); 4.8.2 = tag 4.5.3-4.8.2
(691c92762eb551313c825f6efe4ceeee20982801). 4.8.4 (tag 4.6.1-4.8.4): its code is not in the
snapshots at hand; what differs from 4.8.2 comes from the commits it contains (48f252a, the
``hostname`` rename of PR 655; 272801e, PR 660) and from a real body written by a build newer
than 4.8.2 (../shared/fixtures/dcgm/pr-736-mixed-models-mig-lowercase-hostname.prom: family
order, value format, HELP texts), and is marked INFERRED where no code says it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# DCGM field IDs (dcgm_fields.h): 4.x orders families by them.
FIELD_IDS = {
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_FB_FREE": 251,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_FB_RESERVED": 253,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
}
# DCGM_FT_DOUBLE fields; every other one here is DCGM_FT_INT64.
DOUBLE_FIELDS = frozenset({"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"})
# The two fields 4.8.2 on keeps per device and adds per pod (process_metrics.go,
# isPerProcessMetric, @691c927:30-32).
PER_PROCESS_FIELDS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"})

# etc/default-counters.csv (TYPE, HELP) of 4.2.0 and 4.8.2, in the file's order.
_COUNTERS_4 = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
)
_HELP_3_3 = {
    "DCGM_FI_DEV_FB_FREE": "Frame buffer memory free (in MB).",
    "DCGM_FI_DEV_FB_USED": "Frame buffer memory used (in MB).",
}
# INFERRED for 4.8.4: the HELP texts the PR-736 body (a build newer than 4.8.2) writes, and the
# energy text of NVIDIA's test of the counter files after 4.8.3.
_HELP_4_8_4 = {
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in °C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power usage (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "Total energy consumption since the driver was last reloaded (in mJ)."
    ),
}

# How a release writes a shared device's series in Kubernetes mode with
# --kubernetes-virtual-gpus.
VIRTUAL_NONE = "none"  # no such flag (it came in 4.0.3, PR 432)
VIRTUAL_COPIES = "copies"  # one copy per pod; the device series and pod-less devices gone
VIRTUAL_SHARES = "shares"  # GPU_UTIL, FB_USED: device series plus each pod's share


@dataclass(frozen=True)
class Dialect:
    version: str
    tag: str
    # Hostname to 4.8.2 (render_metrics.go's template), hostname from 4.8.3 (48f252a).
    host_label: str
    # pci_bus_id after the UUID: from 3.5.0 (render_metrics.go@9378144:47); not in 3.3.1
    # (pipeline.go@0518edc:261-277).
    pci_bus_id: bool
    # The counters file: (name, TYPE, HELP) in its order.
    counters: tuple[tuple[str, str, str], ...]
    # Family order: "csv" (3.3.1: the map key is a *Counter into the file's slice, which Go's
    # template sorts by address, pipeline.go@0518edc:336-352), "field_id" (4.x: the key is a
    # Counter struct led by FieldID, collector/types.go@9378144:91), "name" (INFERRED, 4.8.4:
    # the PR-736 body's families are in name order).
    order: str
    # Values of DCGM_FT_DOUBLE fields: "%f" (gpu_collector.go toString, @0518edc:309,
    # @691c927:386), or Go's shortest form (INFERRED, 4.8.4: the PR-736 body's 34.959).
    floats: str
    # container="",namespace="",pod="" on every GPU without a pod (3.3.1, kubernetes.go@0518edc:
    # 87-93; gone in 3.4.1, 5c8a810).
    empty_pod_labels: bool
    # err_code and err_msg on DCGM_FI_DEV_XID_ERRORS (from 3.4.2; gpu_collector.go@691c927:
    # 323-332).
    xid_attributes: bool
    virtual: str
    # The dra_* labels of a ResourceClaim's device (--kubernetes-enable-dra, from 4.4.0).
    dra: bool
    notes: tuple[str, ...] = field(default=())

    def help_of(self, name: str) -> tuple[str, str] | None:
        for counter, typ, text in self.counters:
            if counter == name:
                return typ, text
        return None


def _counters(
    drop: Iterable[str] = (), help_texts: Mapping[str, str] | None = None
) -> tuple[tuple[str, str, str], ...]:
    gone = set(drop)
    texts = help_texts or {}
    return tuple((n, t, texts.get(n, h)) for n, t, h in _COUNTERS_4 if n not in gone)


DIALECTS: dict[str, Dialect] = {
    d.version: d
    for d in (
        Dialect(
            "3.3.1",
            "3.3.3-3.3.1",
            "Hostname",
            pci_bus_id=False,
            # etc/default-counters.csv@0518edc: no FB_RESERVED, no profiling field.
            counters=_counters(
                ("DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"), _HELP_3_3
            ),
            order="csv",
            floats="%f",
            empty_pod_labels=True,
            xid_attributes=False,
            virtual=VIRTUAL_NONE,
            dra=False,
        ),
        Dialect(
            "4.2.0",
            "4.2.3-4.2.0",
            "Hostname",
            pci_bus_id=True,
            counters=_counters(("DCGM_FI_DEV_FB_RESERVED",)),  # added to the file in 4.8.x
            order="field_id",
            floats="%f",
            empty_pod_labels=False,
            xid_attributes=True,
            # transformation/kubernetes.go@9378144:184-229: a copy per pod, then
            # metrics[counter] = newmetrics, whatever it holds.
            virtual=VIRTUAL_COPIES,
            dra=False,
        ),
        Dialect(
            "4.8.2",
            "4.5.3-4.8.2",
            "Hostname",
            pci_bus_id=True,
            counters=_counters(),
            order="field_id",
            floats="%f",
            empty_pod_labels=False,
            xid_attributes=True,
            # transformation/kubernetes.go@691c927:338-410 (Process), 201-252
            # (createPerProcessMetrics: pod_uid always), 399-403 (a pod-less device kept).
            virtual=VIRTUAL_SHARES,
            dra=True,
        ),
        Dialect(
            "4.8.4",
            "4.6.1-4.8.4",
            "hostname",
            pci_bus_id=True,
            counters=_counters(help_texts=_HELP_4_8_4),
            order="name",
            floats="shortest",
            empty_pod_labels=False,
            xid_attributes=True,
            virtual=VIRTUAL_SHARES,
            dra=True,
            notes=(
                "family order, float format and three HELP texts are inferred from a body "
                "written by a build newer than 4.8.2",
            ),
        ),
    )
}
NEWEST = "4.8.4"
# What --demo.exporter-version accepts besides the versions: the release tags, and 3.3/4.2.
ALIASES = {
    **{d.tag: d.version for d in DIALECTS.values()},
    "3.3": "3.3.1",
    "4.2": "4.2.0",
}


def dialect(name: str) -> Dialect:
    """The dialect of release ``name`` (a version, a tag or an alias); ValueError if unknown."""
    version = ALIASES.get(name, name)
    try:
        return DIALECTS[version]
    except KeyError:
        known = ", ".join(sorted(DIALECTS))
        raise ValueError(f"no dialect for dcgm-exporter {name!r} (known: {known})") from None


def dialect_for(name: str, virtual_gpus: bool) -> Dialect:
    """The dialect of release ``name`` in that mode; ValueError if the release is unknown, or
    has no --kubernetes-virtual-gpus and ``virtual_gpus`` asks for it."""
    dia = dialect(name)
    if virtual_gpus and dia.virtual == VIRTUAL_NONE:
        raise ValueError(
            f"dcgm-exporter {dia.version} has no --kubernetes-virtual-gpus (it came in 4.0.3)"
        )
    return dia


@dataclass(frozen=True)
class Row:
    """One series before the dialect writes it: the field, the device's own labels (gpu,
    UUID, pci_bus_id, device, modelName, and GPU_I_PROFILE/GPU_I_ID on a MIG instance), the
    attributes dcgm-exporter's transformations add (pod labels, dra_*, vgpu, pod_uid), and the
    value (an int, or a float for a DCGM_FT_DOUBLE field)."""

    name: str
    device: tuple[tuple[str, str], ...]
    attributes: tuple[tuple[str, str], ...]
    value: int | float


def format_value(dia: Dialect, name: str, value: float) -> str:
    if name not in DOUBLE_FIELDS:
        return f"{int(value):d}"
    if dia.floats == "%f":
        return f"{value:f}"
    text = repr(float(value))  # Go's strconv.FormatFloat(v, 'f', -1, 64) for these values
    return text[:-2] if text.endswith(".0") else text


def _family_key(dia: Dialect, name: str) -> tuple[int, str]:
    if dia.order == "field_id":
        return FIELD_IDS[name], name
    if dia.order == "name":
        return 0, name
    return [c[0] for c in dia.counters].index(name), name


def render(dia: Dialect, host: str, rows: Sequence[Row]) -> str:
    """The body dcgm-exporter ``dia`` writes for ``rows`` (in the rows' order within a family):
    HELP and TYPE, then each series as its template writes it: the device's labels, the host
    label, then the attributes in sorted order (Go's template ranges over a map by key)."""
    by_family: dict[str, list[Row]] = {}
    for row in rows:
        by_family.setdefault(row.name, []).append(row)
    out: list[str] = []
    for name in sorted(by_family, key=lambda n: _family_key(dia, n)):
        meta = dia.help_of(name)
        if meta is None:
            continue
        typ, text = meta
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {typ}")
        for row in by_family[name]:
            labels = [(k, v) for k, v in row.device if dia.pci_bus_id or k != "pci_bus_id"]
            labels.append((dia.host_label, host))
            labels.extend(sorted(row.attributes))
            block = ",".join(f'{k}="{v}"' for k, v in labels)
            out.append(f"{name}{{{block}}} {format_value(dia, name, row.value)}")
    return "\n".join(out) + "\n" if out else ""
