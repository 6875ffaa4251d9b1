"""Synthetic dcgm-exporter payloads in the shapes the real exporter writes.

Label names and order follow dcgm-exporter 3.3+/4.x: ``gpu, UUID, pci_bus_id, device,
modelName, [GPU_I_PROFILE, GPU_I_ID], Hostname, DCGM_FI_DRIVER_VERSION, [container, namespace,
pod]``; one ``# HELP``/``# TYPE`` pair per family; every MIG instance of a MIG-enabled GPU gets
its own series; devices that the kubelet allocated to a pod carry that pod's labels (what the
exporter's PodResources mapping writes), the others none. Float fields are printed the way
the exporter's Go code prints them (``%f``), integer fields as integers.

Values change with ``variant`` while every label block stays the same, as on consecutive
collections of a real exporter.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass

HOSTNAME = "nvidia-dcgm-exporter-x7k2p"
DRIVER = "550.90.07"
MODEL = "NVIDIA A100-SXM4-80GB"
MIG_PROFILES = ("1g.10gb",) * 7  # seven 1g.10gb instances: the largest split of an A100 80GB


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str  # gauge | counter
    help: str
    kind: str  # int | float | ratio | big


# The exporter's default counters (default-counters.csv, about 40 on a full GPU).
DEFAULT_FIELDS = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "int"),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "int"),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "int"),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "int"),
    Field("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature (in C).", "int"),
    Field("DCGM_FI_DEV_SHUTDOWN_TEMP", "gauge", "Shutdown temperature (in C).", "int"),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "float"),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", "float"),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "big",
    ),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "int"),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "int"),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "int"),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "int"),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "int"),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "int"),
    Field("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons.", "int"),
    Field("DCGM_FI_DEV_PSTATE", "gauge", "Performance state (P-State) 0-15.", "int"),
    Field("DCGM_FI_DEV_FB_TOTAL", "gauge", "Total framebuffer memory (in MiB).", "int"),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "int"),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "int"),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "int"),
    Field("DCGM_FI_DEV_FB_USED_PERCENT", "gauge", "Percentage of framebuffer used.", "float"),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total single-bit volatile ECC.", "int"),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total double-bit volatile ECC.", "int"),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total single-bit persistent ECC.", "int"),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total double-bit persistent ECC.", "int"),
    Field("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total retired pages from single-bit.", "int"),
    Field("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total retired pages from double-bit.", "int"),
    Field("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total pages pending retirement.", "int"),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors.",
        "int",
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors.",
        "int",
    ),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows failed.", "int"),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "big",
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        "int",
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        "int",
    ),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "int"),
    Field("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power.", "big"),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal.", "big"),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "ratio",
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "ratio",
    ),
)

# The profiling (DCP) counters a node8/mig56 exporter adds (dcp-metrics-included.csv).
PROFILING_FIELDS = (
    Field("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has a warp.", "ratio"),
    Field(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        "ratio",
    ),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the memory is active.", "ratio"),
    Field(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipe is active.",
        "ratio",
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipe is active.",
        "ratio",
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipe is active.",
        "ratio",
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "counter",
        "The number of bytes of active pcie tx data including both header and payload.",
        "big",
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "counter",
        "The number of bytes of active pcie rx data including both header and payload.",
        "big",
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "counter",
        "The number of bytes of active NvLink tx data.",
        "big",
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "counter",
        "The number of bytes of active NvLink rx data.",
        "big",
    ),
)
# Fields DCGM does not report per MIG instance (board-wide ECC and NVLink error totals).
_NOT_PER_INSTANCE = frozenset(
    {
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
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
        fs = tuple(f for f in fs if f.name not in _NOT_PER_INSTANCE)
    return fs


def label_block(dev: Device) -> str:
    parts = [
        f'gpu="{dev.gpu}"',
        f'UUID="{dev.uuid}"',
        f'pci_bus_id="00000000:{0x10 + dev.gpu:02X}:00.0"',
        f'device="nvidia{dev.gpu}"',
        f'modelName="{MODEL}"',
    ]
    if dev.gi_id is not None:
        parts += [f'GPU_I_PROFILE="{dev.profile}"', f'GPU_I_ID="{dev.gi_id}"']
    parts += [f'Hostname="{HOSTNAME}"', f'DCGM_FI_DRIVER_VERSION="{DRIVER}"']
    if dev.pod is not None:
        ns, pod, container = dev.pod
        parts += [f'container="{container}"', f'namespace="{ns}"', f'pod="{pod}"']
    return "{" + ",".join(parts) + "}"


def _value(kind: str, seed: int) -> str:
    # A cheap deterministic mix: different per series and per variant, no RNG state.
    h = (seed * 2654435761) & 0xFFFFFFFF
    if kind == "ratio":
        return f"{(h % 1_000_000) / 1_000_000:f}"
    if kind == "float":
        return f"{(h % 400_000) / 1000:f}"
    if kind == "big":
        return str(h * 4099)
    return str(h % 2000)


def generate(shape: Shape | str, variant: int = 0, epoch: int = 0) -> str:
    """The exposition text of ``shape`` for collection number ``variant`` in pod ``epoch``."""
    if isinstance(shape, str):
        shape = SHAPES[shape]
    devs = devices(shape, epoch)
    blocks = [label_block(d) for d in devs]
    lines: list[str] = []
    for fi, f in enumerate(fields(shape)):
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for di, block in enumerate(blocks):
            lines.append(f"{f.name}{block} {_value(f.kind, (variant * 7919 + fi) * 100_003 + di)}")
    return "\n".join(lines) + "\n"


def series_count(text: str) -> int:
    return sum(1 for line in text.split("\n") if line and line[0] != "#")
