"""Pure parsing of NVML's answers for the NVML source: return codes as reasons, MIG profile
names, the rows of the process lists and utilization samples, and how one GPU's rows become its
processes. No I/O: the calls into pynvml are ``nvml.NvmlSource``'s.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .model import GpuProcess, ProcessKind

# The reasons NvmlUnavailable carries; the app may use them as label values.
REASON_LIBRARY_NOT_FOUND = "library_not_found"
REASON_DRIVER_NOT_LOADED = "driver_not_loaded"
REASON_NO_PERMISSION = "no_permission"
REASON_VERSION_MISMATCH = "driver_library_mismatch"
REASON_UNINITIALIZED = "uninitialized"
REASON_INIT_FAILED = "init_failed"
REASON_READ_FAILED = "read_failed"

# NVML's return codes (nvml.h) that the source tells apart.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_ARGUMENT_VERSION_MISMATCH = 25
VALUE_NOT_AVAILABLE_ULL = 2**64 - 1

_REASON_BY_CODE = {
    ERROR_LIBRARY_NOT_FOUND: REASON_LIBRARY_NOT_FOUND,
    ERROR_DRIVER_NOT_LOADED: REASON_DRIVER_NOT_LOADED,
    ERROR_NO_PERMISSION: REASON_NO_PERMISSION,
    ERROR_LIB_RM_VERSION_MISMATCH: REASON_VERSION_MISMATCH,
    ERROR_UNINITIALIZED: REASON_UNINITIALIZED,
}
# Real NVML names MIG devices "<GPU name> MIG <profile>", with a "<n>c." prefix when the
# compute instance is smaller than its GPU instance; dcgm-exporter's GPU_I_PROFILE label is
# the GPU instance part, so that is what we keep.
_MIG_PROFILE = re.compile(r"\bMIG\s+(?:\d+c\.)?(\d+g\.\d+gb(?:[+-][a-z0-9.]+)*)\s*$", re.IGNORECASE)


class ProcessEntry(NamedTuple):
    """One row of one NVML process list, before deduplication."""

    gi_id: int | None
    pid: int
    used_memory_bytes: int | None
    kind: ProcessKind


class UtilSample(NamedTuple):
    """The parts of an ``nvmlProcessUtilizationSample_t`` that we use."""

    pid: int
    timestamp: int  # microseconds, NVML's clock
    sm_util: int  # percent


def parse_mig_profile(name: str) -> str:
    """The GPU instance profile in a MIG device name ("... MIG 1g.10gb" -> "1g.10gb"), or ""."""
    match = _MIG_PROFILE.search(name)
    return match.group(1) if match else ""


def reason_for_code(code: int | None, default: str) -> str:
    """The NvmlUnavailable reason for an NVML return code; ``default`` for the others."""
    if code is None:
        return default
    return _REASON_BY_CODE.get(code, default)


def merge_processes(
    gpu_uuid: str,
    gpu_index: int,
    entries: Iterable[ProcessEntry],
    utilization: Mapping[int | None, Mapping[int, float]] | None = None,
) -> tuple[GpuProcess, ...]:
    """Deduplicate one GPU's list rows per (GPU instance, pid).

    A pid listed several times keeps the union of its kinds and the largest known memory
    (None only when no row knew it). ``utilization`` holds the SM ratios per GPU instance
    (None: the full GPU): a process on an instance there gets its ratio, 0.0 without samples;
    on an instance not there (NVML cannot tell), None. Sorted by (gi_id, pid) so snapshots
    compare and render stably.
    """
    ratios = utilization or {}
    # (gi_id, pid) -> [largest known memory, kinds]; almost every pid is listed once.
    merged: dict[tuple[int | None, int], list[Any]] = {}
    for gi_id, pid, memory, kind in entries:
        row = merged.get((gi_id, pid))
        if row is None:
            merged[(gi_id, pid)] = [memory, {kind}]
            continue
        row[1].add(kind)
        if memory is not None and (row[0] is None or memory > row[0]):
            row[0] = memory
    out = []
    for key in sorted(merged, key=_instance_then_pid):
        gi_id, pid = key
        memory, kinds = merged[key]
        ratio = ratios.get(gi_id)
        out.append(
            GpuProcess(
                gpu_uuid=gpu_uuid,
                gpu_index=gpu_index,
                gi_id=gi_id,
                pid=pid,
                used_memory_bytes=memory,
                sm_util_ratio=None if ratio is None else ratio.get(pid, 0.0),
                kinds=frozenset(kinds),
            )
        )
    return tuple(out)


def _instance_then_pid(key: tuple[int | None, int]) -> tuple[int, int]:
    return (-1 if key[0] is None else key[0], key[1])


def newer_samples(samples: Iterable[UtilSample], since: int) -> tuple[list[UtilSample], int]:
    """The samples taken after ``since`` and the newest timestamp seen (``since`` if none).

    NVML is asked only for samples after ``since`` already; filtering again means a driver
    that ignores the argument still cannot make us count a sample twice.
    """
    fresh = [s for s in samples if s.timestamp > since]
    newest = max((s.timestamp for s in fresh), default=since)
    return fresh, newest


def utilization_from_samples(samples: Iterable[UtilSample]) -> dict[int, float]:
    """Per pid, the mean SM utilisation of its samples as a ratio clamped to [0, 1]."""
    total: dict[int, int] = {}
    count: dict[int, int] = {}
    for s in samples:
        total[s.pid] = total.get(s.pid, 0) + s.sm_util
        count[s.pid] = count.get(s.pid, 0) + 1
    return {pid: min(1.0, max(0.0, total[pid] / count[pid] / 100.0)) for pid in total}


# The rows of NVML's process lists and samples, unpacked with struct in one C call; the layouts
# use native alignment, as the C compiler lays the structs out.
ROWS_V1 = struct.Struct("@IQ")  # nvmlProcessInfo_v1_t: pid, usedGpuMemory
# nvmlProcessInfo_v2_t, also what the _v3 symbols fill: pid, usedGpuMemory, gpuInstanceId,
# computeInstanceId
ROWS_V2 = struct.Struct("@IQII")
# nvmlProcessUtilizationSample_t: pid, timeStamp, smUtil, memUtil, encUtil, decUtil
ROWS_SAMPLE = struct.Struct("@IQIIII")


def parse_process_rows(rows: Iterable[tuple[Any, ...]]) -> list[tuple[int, int | None]]:
    """``(pid, used memory)`` of each row of a process list (ROWS_V1 or ROWS_V2); the memory is
    None where NVML says it is not available."""
    return [(r[0], None if r[1] == VALUE_NOT_AVAILABLE_ULL else r[1]) for r in rows]


def parse_sample_rows(rows: Iterable[tuple[Any, ...]]) -> list[UtilSample]:
    """The utilization samples of rows of ROWS_SAMPLE."""
    return [UtilSample(pid, stamp, sm) for pid, stamp, sm, _m, _e, _d in rows]
