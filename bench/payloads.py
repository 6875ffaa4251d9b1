"""Synthetic dcgm-exporter payloads in the shapes the real exporter writes.

Label names and order follow dcgm-exporter 3.3+/4.x: ``gpu, UUID, pci_bus_id, device,
modelName, [GPU_I_PROFILE, GPU_I_ID], <host>, <driver version>, [container, namespace, pod]``;
one ``# HELP``/``# TYPE`` pair per family; every MIG instance of a MIG-enabled GPU gets its own
series; devices that the kubelet allocated to a pod carry that pod's labels (what the
exporter's PodResources mapping writes), the others none. Float fields are printed the way
the exporter's Go code prints them (``%f``), integer fields as integers.

Field and label names come from the field table (enricher/dcgm_fields.json), in a chosen
naming: ``4.8`` (the default, 4.8.2's labels: the bench's figures stay comparable), or ``4.9``
and ``4.10``, where the renamed fields carry their new units (bytes, ratio, J, Hz; DOUBLE
values in Go's shortest form, as the simulated exporter of those releases writes them) and the
labels are those releases' (``hostname``, the new driver-version label).

Values change with ``variant`` while every label block stays the same, as on consecutive
collections of a real exporter.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass

from enricher.fieldtable import FieldName, table
from enricher.simnode.dialects import DOUBLE_UNITS, go_float

HOSTNAME = "nvidia-dcgm-exporter-x7k2p"
DRIVER = "550.90.07"
MODEL = "NVIDIA A100-SXM4-80GB"
MIG_PROFILES = ("1g.10gb",) * 7  # seven 1g.10gb instances: the largest split of an A100 80GB


@dataclass(frozen=True, slots=True)
class Field:
    field: str  # a key of enricher/dcgm_fields.json
    type: str  # gauge | counter
    help: str  # the bench's own HELP text (the 4.8 naming's; the table's where it has one)
    kind: str  # int | float | ratio | big: how values are drawn, in the 4.8 naming's unit

    def name(self, naming: str = "4.8") -> str:
        found = table().name(self.field, naming)
        assert found is not None, (self.field, naming)
        return found


# The exporter's default counters (default-counters.csv, about 40 on a full GPU).
DEFAULT_FIELDS = (
    Field("sm_clock", "gauge", "SM clock frequency (in MHz).", "int"),
    Field("mem_clock", "gauge", "Memory clock frequency (in MHz).", "int"),
    Field("memory_temp", "gauge", "Memory temperature (in C).", "int"),
    Field("gpu_temp", "gauge", "GPU temperature (in C).", "int"),
    Field("slowdown_temp", "gauge", "Slowdown temperature (in C).", "int"),
    Field("shutdown_temp", "gauge", "Shutdown temperature (in C).", "int"),
    Field("power", "gauge", "Power draw (in W).", "float"),
    Field("power_limit", "gauge", "Power management limit (in W).", "float"),
    Field(
        "energy",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "big",
    ),
    Field("pcie_replay", "counter", "Total number of PCIe retries.", "int"),
    Field("gpu_util", "gauge", "GPU utilization (in %).", "int"),
    Field("mem_copy_util", "gauge", "Memory utilization (in %).", "int"),
    Field("enc_util", "gauge", "Encoder utilization (in %).", "int"),
    Field("dec_util", "gauge", "Decoder utilization (in %).", "int"),
    Field("xid", "gauge", "Value of the last XID error encountered.", "int"),
    Field("clock_event_reasons", "gauge", "Current clock throttle reasons.", "int"),
    Field("pstate", "gauge", "Performance state (P-State) 0-15.", "int"),
    Field("fb_total", "gauge", "Total framebuffer memory (in MiB).", "int"),
    Field("fb_free", "gauge", "Framebuffer memory free (in MiB).", "int"),
    Field("fb_used", "gauge", "Framebuffer memory used (in MiB).", "int"),
    Field("fb_reserved", "gauge", "Framebuffer memory reserved (in MiB).", "int"),
    Field("fb_used_share", "gauge", "Percentage of framebuffer used.", "float"),
    Field("ecc_sbe_volatile", "counter", "Total single-bit volatile ECC.", "int"),
    Field("ecc_dbe_volatile", "counter", "Total double-bit volatile ECC.", "int"),
    Field("ecc_sbe_aggregate", "counter", "Total single-bit persistent ECC.", "int"),
    Field("ecc_dbe_aggregate", "counter", "Total double-bit persistent ECC.", "int"),
    Field("retired_pages_sbe", "counter", "Total retired pages from single-bit.", "int"),
    Field("retired_pages_dbe", "counter", "Total retired pages from double-bit.", "int"),
    Field("retired_pages_pending", "counter", "Total pages pending retirement.", "int"),
    Field(
        "uncorrectable_remapped_rows",
        "counter",
        "Number of remapped rows for uncorrectable errors.",
        "int",
    ),
    Field(
        "correctable_remapped_rows",
        "counter",
        "Number of remapped rows for correctable errors.",
        "int",
    ),
    Field("row_remap_failure", "gauge", "Whether remapping of rows failed.", "int"),
    Field(
        "nvlink_bandwidth",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "big",
    ),
    Field(
        "nvlink_crc_flit_errors",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        "int",
    ),
    Field(
        "nvlink_replay_errors",
        "counter",
        "Total number of NVLink retries.",
        "int",
    ),
    Field("vgpu_license_status", "gauge", "vGPU License status", "int"),
    Field("power_violation", "counter", "Throttling duration due to power.", "big"),
    Field("thermal_violation", "counter", "Throttling duration due to thermal.", "big"),
    Field(
        "gr_engine_active",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "ratio",
    ),
    Field(
        "tensor_active",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "ratio",
    ),
)

# The profiling (DCP) counters a node8/mig56 exporter adds (dcp-metrics-included.csv).
PROFILING_FIELDS = (
    Field("sm_active", "gauge", "The ratio of cycles an SM has a warp.", "ratio"),
    Field(
        "sm_occupancy",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        "ratio",
    ),
    Field("dram_active", "gauge", "Ratio of cycles the memory is active.", "ratio"),
    Field(
        "fp64_active",
        "gauge",
        "Ratio of cycles the fp64 pipe is active.",
        "ratio",
    ),
    Field(
        "fp32_active",
        "gauge",
        "Ratio of cycles the fp32 pipe is active.",
        "ratio",
    ),
    Field(
        "fp16_active",
        "gauge",
        "Ratio of cycles the fp16 pipe is active.",
        "ratio",
    ),
    Field(
        "pcie_tx_rate",
        "counter",
        "The number of bytes of active pcie tx data including both header and payload.",
        "big",
    ),
    Field(
        "pcie_rx_rate",
        "counter",
        "The number of bytes of active pcie rx data including both header and payload.",
        "big",
    ),
    Field(
        "nvlink_tx_rate",
        "counter",
        "The number of bytes of active NvLink tx data.",
        "big",
    ),
    Field(
        "nvlink_rx_rate",
        "counter",
        "The number of bytes of active NvLink rx data.",
        "big",
    ),
)
# Fields DCGM does not report per MIG instance (board-wide ECC and NVLink error totals).
_NOT_PER_INSTANCE = frozenset(
    {
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "nvlink_crc_flit_errors",
        "nvlink_replay_errors",
        "nvlink_bandwidth",
    }
)


@dataclass(frozen=True, slots=True)
class Shape:
    """A node: ``gpus`` GPUs, each split into ``migs`` MIG instances (0: full GPUs)."""

    name: str
    gpus: int
    migs: int
    profiling: bool
    # Every ``pod_every``-th device (GPU or MIG instance) is allocated to a pod.
    pod_every: int = 2


SHAPES: dict[str, Shape] = {
    "gpu1": Shape("gpu1", gpus=1, migs=0, profiling=False, pod_every=1),
    "node8": Shape("node8", gpus=8, migs=0, profiling=True),
    "mig56": Shape("mig56", gpus=8, migs=7, profiling=True),
    "stress": Shape("stress", gpus=64, migs=7, profiling=True),
}
# A body just under the enricher's default --upstream.max-bytes (32 MiB): 31 MiB, for the
# event-loop part of the benchmark (not one of the rewrite payloads above).
MAX32 = Shape("max32", gpus=320, migs=7, profiling=True)


@dataclass(frozen=True, slots=True)
class Device:
    """One series-producing device: a full GPU or one MIG instance."""

    gpu: int
    uuid: str
    gi_id: int | None
    profile: str
    pod: tuple[str, str, str] | None  # (namespace, pod, container) as the exporter wrote it


def gpu_uuid(index: int) -> str:
    """Stable GPU UUIDs, shared with the benchmark's fake NVML state."""
    return f"GPU-{uuidlib.UUID(int=0x5EED_0000_0000 + index)}"


def devices(shape: Shape, epoch: int = 0) -> list[Device]:
    """The devices of ``shape``. Each ``epoch`` gives a tenth of the allocated devices a new
    pod (the exporter's PodResources mapping follows pod churn), round robin."""
    out: list[Device] = []
    n = 0
    for g in range(shape.gpus):
        for i in range(shape.migs or 1):
            gi = i + 7 if shape.migs else None  # A100 1g.10gb instances get GI ids 7..13
            pod = None
            if n % shape.pod_every == 0:
                k = n // shape.pod_every  # the k-th allocated device
                gen = (epoch + k % 10) // 10
                pod = ("inference", f"llm-{n:03d}-7d9f8b6c5-g{gen}x{n % 10}k", "server")
            out.append(Device(g, gpu_uuid(g), gi, MIG_PROFILES[i] if shape.migs else "", pod))
            n += 1
    return out


def fields(shape: Shape) -> tuple[Field, ...]:
    fs = DEFAULT_FIELDS + (PROFILING_FIELDS if shape.profiling else ())
    if shape.migs:
        fs = tuple(f for f in fs if f.field not in _NOT_PER_INSTANCE)
    return fs


# The release whose labels each naming's payloads carry: 4.8.2's for 4.8 (``Hostname``), the
# first of the naming's releases otherwise.
LABELS_OF = {"4.8": "4.8.2"}


def _release(naming: str) -> str:
    return LABELS_OF.get(naming) or table().naming_first[naming]


def label_block(dev: Device, naming: str = "4.8") -> str:
    release = _release(naming)
    parts = [
        f'gpu="{dev.gpu}"',
        f'UUID="{dev.uuid}"',
        f'pci_bus_id="00000000:{0x10 + dev.gpu:02X}:00.0"',
        f'device="nvidia{dev.gpu}"',
        f'modelName="{MODEL}"',
    ]
    if dev.gi_id is not None:
        parts += [f'GPU_I_PROFILE="{dev.profile}"', f'GPU_I_ID="{dev.gi_id}"']
    parts += [
        f'{table().label("host", release)}="{HOSTNAME}"',
        f'{table().label("driver_version", release)}="{DRIVER}"',
    ]
    if dev.pod is not None:
        ns, pod, container = dev.pod
        parts += [f'container="{container}"', f'namespace="{ns}"', f'pod="{pod}"']
    return "{" + ",".join(parts) + "}"


def _number(kind: str, seed: int) -> int | float:
    # A cheap deterministic mix: different per series and per variant, no RNG state.
    h = (seed * 2654435761) & 0xFFFFFFFF
    if kind == "ratio":
        return (h % 1_000_000) / 1_000_000
    if kind == "float":
        return (h % 400_000) / 1000
    if kind == "big":
        return h * 4099
    return h % 2000


def _value(kind: str, seed: int) -> str:
    """A value in the 4.8 naming's unit, as 4.8's exporter writes it (``%f`` for floats)."""
    number = _number(kind, seed)
    return f"{number:f}" if kind in ("ratio", "float") else str(number)


def _convert(value: float, old: FieldName, new: FieldName) -> float:
    """``value`` in ``old``'s unit, in ``new``'s: exact for the decimal and binary factors
    between them (percent / 100, mJ / 1000, MiB x 2**20, MHz x 10**6)."""
    if old.scale == new.scale:
        return value
    up = old.scale / new.scale
    if up >= 1:
        return value * round(up)
    return value / round(new.scale / old.scale)


def _writer(f: Field, naming: str) -> Callable[[int], str]:
    """How ``f``'s values are written in ``naming``, from the seed of each."""
    if naming == "4.8":
        return lambda seed: _value(f.kind, seed)
    old = table().field(f.field).by_naming["4.8"]
    new = table().field(f.field).by_naming[naming]
    double = f.kind in ("ratio", "float") or new.unit in DOUBLE_UNITS

    def write(seed: int) -> str:
        value = _convert(_number(f.kind, seed), old, new)
        return go_float(value) if double else str(round(value))

    return write


def generate(shape: Shape | str, variant: int = 0, epoch: int = 0, naming: str = "4.8") -> str:
    """The exposition text of ``shape`` for collection number ``variant`` in pod ``epoch``, in
    ``naming`` (enricher/dcgm_fields.json: 4.8, 4.9, 4.10)."""
    if isinstance(shape, str):
        shape = SHAPES[shape]
    devs = devices(shape, epoch)
    blocks = [label_block(d, naming) for d in devs]
    lines: list[str] = []
    for fi, f in enumerate(fields(shape)):
        name = f.name(naming)
        text = (
            f.help if naming == "4.8" else (table().field(f.field).by_naming[naming].help or f.help)
        )
        write = _writer(f, naming)
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {f.type}")
        for di, block in enumerate(blocks):
            lines.append(f"{name}{block} {write((variant * 7919 + fi) * 100_003 + di)}")
    return "\n".join(lines) + "\n"


def series_count(text: str) -> int:
    return sum(1 for line in text.split("\n") if line and line[0] != "#")
