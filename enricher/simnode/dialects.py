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
order, value format, HELP texts), and is marked INFERRED where no code says it. 4.9.0 and
4.10.0 (tags "4.9.0", "4.10.0"): no code of theirs was at hand either; they are 4.8.4's traits in
their naming of enricher/dcgm_fields.json (fields renamed to DCGM 4.7's names, several in base
units: bytes, ratio, joules, hertz), with what their release notes add, each marked below.

Names, units and HELP texts are the field table's: no field name is written here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from ..fieldtable import FieldName, table

# The fields are the table's (enricher/dcgm_fields.json): each dialect writes a field under the
# name, in the unit and with the HELP text of its release's naming (table().naming_of_release);
# the rows carry SI values (bytes, ratio, joules, watts, hertz), converted when written.

# DCGM field IDs of the 4.8 names (dcgm_fields.h): 4.2.0 and 4.8.2 order families by them.
FIELD_IDS = {
    "sm_clock": 100,
    "mem_clock": 101,
    "gpu_temp": 150,
    "power": 155,
    "energy": 156,
    "pcie_replay": 202,
    "gpu_util": 203,
    "mem_copy_util": 204,
    "xid": 230,
    "fb_free": 251,
    "fb_used": 252,
    "fb_reserved": 253,
    "uncorrectable_remapped_rows": 393,
    "correctable_remapped_rows": 394,
    "row_remap_failure": 395,
    "gr_engine_active": 1001,
}
# The units DCGM keeps as DCGM_FT_DOUBLE; every other field here is DCGM_FT_INT64. Watts
# (BOARD_POWER_WATTS, BOARD_POWER_LIMIT_REQUESTED_WATTS) and ratios (FB_USED_RATIO, the
# profiling fields) are DOUBLE in dcgmlib/src/dcgm_fields.cpp of NVIDIA/DCGM@v4.6.0 (e.g.
# :1039-1040, :1843-1844). INFERRED for 4.9 on: the DCGM 4.7 fields in a fractional unit
# (GPU_UTIL_RATIO, MEMORY_UTIL_RATIO: field 1613 on is a DOUBLE ratio by the field-identifier
# list research quotes; GPU_ENERGY_JOULES_TOTAL, whose mJ source would lose its resolution as
# an INT64) are DOUBLE, the bytes and hertz ones INT64 like the fields they replace.
DOUBLE_UNITS = frozenset({"W", "ratio", "J"})
# The two fields 4.8.2 on keeps per device and adds per pod (process_metrics.go,
# isPerProcessMetric, @691c927:30-32); INFERRED for 4.9 on: the same two fields under their
# new names, each pod's share in the field's unit.
PER_PROCESS_FIELDS = frozenset({"gpu_util", "fb_used"})

# The simulated exporter's counters file: the rows of etc/default-counters.csv of 4.2.0 and
# 4.8.2 it draws, in the file's order. TYPE and HELP (the 4.8 naming's texts) are the table's.
_COUNTERS_4 = (
    "sm_clock",
    "mem_clock",
    "gpu_temp",
    "power",
    "energy",
    "pcie_replay",
    "gpu_util",
    "mem_copy_util",
    "xid",
    "fb_free",
    "fb_used",
    "fb_reserved",
    "uncorrectable_remapped_rows",
    "correctable_remapped_rows",
    "row_remap_failure",
    "gr_engine_active",
)
# 4.9.0 on: FB_CAPACITY_BYTES collected by default (4.9.0 release notes, as mirrored at
# https://newreleases.io/project/github/NVIDIA/dcgm-exporter/release/4.9.0), and the PCIe rates,
# on by default since 4.8.x (etc/default-counters.csv@691c927; 4.10.0 release notes: "stay on
# by default"), which the simulation draws from 4.9.0 on so that 4.10.0's renames of them show
# (the older dialects keep the bodies their goldens hold).
_COUNTERS_4_9 = (*_COUNTERS_4[:9], "fb_capacity", *_COUNTERS_4[9:], "pcie_tx_rate", "pcie_rx_rate")
_HELP_3_3 = {
    "fb_free": "Frame buffer memory free (in MB).",
    "fb_used": "Frame buffer memory used (in MB).",
}
# INFERRED for 4.8.4: the HELP texts the PR-736 body (a build newer than 4.8.2) writes, and the
# energy text of NVIDIA's test of the counter files after 4.8.3.
_HELP_4_8_4 = {
    "gpu_temp": "GPU temperature (in °C).",
    "power": "Power usage (in W).",
    "energy": "Total energy consumption since the driver was last reloaded (in mJ).",
}
# The HELP texts of the 4.9 and 4.10 names in the table are INFERRED: no 4.9.0 or 4.10.0
# counters file was at hand (docs/compatibility.md, "Where each name comes from"). Each is the
# 4.8.4 text with the naming's unit ("(in bytes)", "(in Hz)", "(in J)", "(ratio, 0 to 1)"),
# or the 4.8 text where the unit did not change.

# How a release writes a shared device's series in Kubernetes mode with
# --kubernetes-virtual-gpus.
VIRTUAL_NONE = "none"  # no such flag (it came in 4.0.3, PR 432)
VIRTUAL_COPIES = "copies"  # one copy per pod; the device series and pod-less devices gone
VIRTUAL_SHARES = "shares"  # GPU_UTIL, FB_USED: device series plus each pod's share


@dataclass(frozen=True)
class Dialect:
    version: str
    tag: str
    # pci_bus_id after the UUID: from 3.5.0 (render_metrics.go@9378144:47); not in 3.3.1
    # (pipeline.go@0518edc:261-277).
    pci_bus_id: bool
    # The counters file: (field, TYPE, HELP) in its order, the fields the table's.
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
    # err_code and err_msg on the last-XID field (from 3.4.2; gpu_collector.go@691c927:
    # 323-332).
    xid_attributes: bool
    virtual: str
    # The dra_* labels of a ResourceClaim's device (--kubernetes-enable-dra, from 4.4.0).
    dra: bool
    # The driver-version label (a "label" row of the counters file: after the host label,
    # before the attributes, render_metrics.go@691c927:46-55) on every series. Not in the
    # counters NVIDIA's chart ships up to 4.8.4 (deployment/templates/metrics-configmap.yaml@
    # 691c927 has no such row; the 4.9.0 release notes: Helm installs, which lacked it, now
    # get it), which the simulated exporter follows; its name is the table's.
    driver_label: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def naming(self) -> str:
        """The table's naming this release writes (4.8, 4.9, 4.10)."""
        return table().naming_of_release(self.version)

    @property
    def host_label(self) -> str:
        """Hostname to 4.8.2 (render_metrics.go's template), hostname from 4.8.3 (48f252a)."""
        return table().label("host", self.version)

    @property
    def driver_version_label(self) -> str:
        return table().label("driver_version", self.version)

    def entry(self, field_key: str) -> FieldName:
        """The table's name, unit and HELP of ``field_key`` in this release's naming."""
        return table().field(field_key).by_naming[self.naming]

    def name_of(self, field_key: str) -> str:
        return self.entry(field_key).name

    def help_of(self, field_key: str) -> tuple[str, str] | None:
        for counter, typ, text in self.counters:
            if counter == field_key:
                return typ, text
        return None


def _counters(
    version: str,
    fields: Sequence[str] = _COUNTERS_4,
    drop: Iterable[str] = (),
    help_texts: Mapping[str, str] | None = None,
) -> tuple[tuple[str, str, str], ...]:
    naming = table().naming_of_release(version)
    gone = set(drop)
    texts = help_texts or {}
    out = []
    for f in fields:
        if f in gone:
            continue
        fn = table().field(f).by_naming[naming]
        out.append((f, fn.type, texts.get(f, fn.help)))
    return tuple(out)


def _newer(version: str) -> Dialect:
    """4.9.0 on: 4.8.4's traits (INFERRED: no 4.9.0 or 4.10.0 code was at hand; the release
    notes name no change to them) in the release's naming, with FB_CAPACITY_BYTES and the
    driver-version label (cited on _COUNTERS_4_9 and Dialect.driver_label). Release tags are
    plain versions from 4.8.4 on (docs/compatibility.md, "Where each name comes from")."""
    return Dialect(
        version,
        version,
        pci_bus_id=True,
        counters=_counters(version, _COUNTERS_4_9),
        order="name",
        floats="shortest",
        empty_pod_labels=False,
        xid_attributes=True,
        virtual=VIRTUAL_SHARES,
        dra=True,
        driver_label=True,
        notes=(
            "names, units and HELP texts are the table's (the 4.9 and 4.10 namings are "
            "inferred from the release notes and DCGM 4.7's field names); family order, float "
            "format, label order, virtual-GPU and MIG behaviour are 4.8.4's",
        ),
    )


DIALECTS: dict[str, Dialect] = {
    d.version: d
    for d in (
        Dialect(
            "3.3.1",
            "3.3.3-3.3.1",
            pci_bus_id=False,
            # etc/default-counters.csv@0518edc: no FB_RESERVED, no profiling field.
            counters=_counters(
                "3.3.1", drop=("fb_reserved", "gr_engine_active"), help_texts=_HELP_3_3
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
            pci_bus_id=True,
            counters=_counters("4.2.0", drop=("fb_reserved",)),  # added to the file in 4.8.x
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
            pci_bus_id=True,
            counters=_counters("4.8.2"),
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
            pci_bus_id=True,
            counters=_counters("4.8.4", help_texts=_HELP_4_8_4),
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
        _newer("4.9.0"),
        _newer("4.10.0"),
    )
}
# The demo's default: the newest release the table and the dialects know.
NEWEST = "4.10.0"
# What --demo.exporter-version accepts besides the versions: the release tags, and the
# major.minor of each release.
ALIASES = {
    **{d.tag: d.version for d in DIALECTS.values() if d.tag != d.version},
    "3.3": "3.3.1",
    "4.2": "4.2.0",
    "4.9": "4.9.0",
    "4.10": "4.10.0",
}


def dialect(name: str) -> Dialect:
    """The dialect of release ``name`` (a version, a tag or an alias); ValueError if unknown."""
    version = ALIASES.get(name, name)
    try:
        return DIALECTS[version]
    except KeyError:
        known = ", ".join(DIALECTS)
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
    """One series before the dialect writes it: the field (the table's key), the device's own
    labels (gpu, UUID, pci_bus_id, device, modelName, and GPU_I_PROFILE/GPU_I_ID on a MIG
    instance), the attributes dcgm-exporter's transformations add (pod labels, dra_*, vgpu,
    pod_uid), and the value in the field's SI unit (bytes, ratio, joules, watts, hertz)."""

    field: str
    device: tuple[tuple[str, str], ...]
    attributes: tuple[tuple[str, str], ...]
    value: int | float


def go_float(value: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64): the shortest digits that read back as
    ``value``, never an exponent, no trailing ".0"."""
    text = repr(float(value))
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text[:-2] if text.endswith(".0") else text


def format_value(dia: Dialect, field_key: str, value: float) -> str:
    """``value`` (SI) as release ``dia`` writes ``field_key``: in its naming's unit, an
    integer for an INT64 field, Go's float format of the release for a DOUBLE one."""
    fn = dia.entry(field_key)
    written = value / fn.scale if fn.scale != 1 else value
    if fn.unit not in DOUBLE_UNITS:
        return f"{round(written):d}"
    if dia.floats == "%f":
        return f"{written:f}"
    return go_float(written)


def _family_key(dia: Dialect, field_key: str) -> tuple[int, str]:
    name = dia.name_of(field_key)
    if dia.order == "field_id":
        return FIELD_IDS[field_key], name
    if dia.order == "name":
        return 0, name
    return [c[0] for c in dia.counters].index(field_key), name


def render(dia: Dialect, host: str, rows: Sequence[Row], driver: str = "") -> str:
    """The body dcgm-exporter ``dia`` writes for ``rows`` (in the rows' order within a family):
    HELP and TYPE, then each series as its template writes it: the device's labels, the host
    label, the driver-version label where the release writes it (``driver``), then the
    attributes in sorted order (Go's template ranges over a map by key)."""
    by_family: dict[str, list[Row]] = {}
    for row in rows:
        by_family.setdefault(row.field, []).append(row)
    host_label = dia.host_label
    extra = [(dia.driver_version_label, driver)] if dia.driver_label else []
    out: list[str] = []
    for key in sorted(by_family, key=lambda f: _family_key(dia, f)):
        meta = dia.help_of(key)
        if meta is None:
            continue
        typ, text = meta
        name = dia.name_of(key)
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {typ}")
        for row in by_family[key]:
            labels = [(k, v) for k, v in row.device if dia.pci_bus_id or k != "pci_bus_id"]
            labels.append((host_label, host))
            labels.extend(extra)
            labels.extend(sorted(row.attributes))
            block = ",".join(f'{k}="{v}"' for k, v in labels)
            out.append(f"{name}{{{block}}} {format_value(dia, key, row.value)}")
    return "\n".join(out) + "\n" if out else ""
