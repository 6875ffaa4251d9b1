"""The NVML source: which processes use each GPU and MIG instance, and how much.

:class:`NvmlSource` does the I/O through pynvml (``nvidia-ml-py``); the pure helpers
(:func:`parse_mig_profile`, :func:`merge_processes`, :func:`newer_samples`,
:func:`utilization_from_samples`, :func:`reason_for_code`) hold the rules and are tested alone.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

import pynvml

from enricher.model import GpuDevice, GpuProcess, GpuSnapshot, MigDevice, ProcessKind

log = logging.getLogger(__name__)

T = TypeVar("T")

# Bounds on what a misbehaving library can make us allocate or loop over.
MAX_DEVICES = 256
MAX_MIG_SLOTS = 64
MAX_PROCESSES_PER_LIST = 16384
MAX_TRACKED_TIMESTAMPS = 1024

# The reasons NvmlUnavailable carries; the app may use them as label values.
REASON_LIBRARY_NOT_FOUND = "library_not_found"
REASON_DRIVER_NOT_LOADED = "driver_not_loaded"
REASON_NO_PERMISSION = "no_permission"
REASON_VERSION_MISMATCH = "driver_library_mismatch"
REASON_UNINITIALIZED = "uninitialized"
REASON_INIT_FAILED = "init_failed"
REASON_READ_FAILED = "read_failed"
REASONS = (
    REASON_LIBRARY_NOT_FOUND,
    REASON_DRIVER_NOT_LOADED,
    REASON_NO_PERMISSION,
    REASON_VERSION_MISMATCH,
    REASON_UNINITIALIZED,
    REASON_INIT_FAILED,
    REASON_READ_FAILED,
)

_SUCCESS = 0
_ERROR_UNINITIALIZED = 1
_ERROR_NOT_SUPPORTED = 3
_ERROR_NO_PERMISSION = 4
_ERROR_NOT_FOUND = 6
_ERROR_INSUFFICIENT_SIZE = 7
_ERROR_DRIVER_NOT_LOADED = 9
_ERROR_LIBRARY_NOT_FOUND = 12
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_LIB_RM_VERSION_MISMATCH = 18
_ERROR_ARGUMENT_VERSION_MISMATCH = 25
_VALUE_NOT_AVAILABLE_ULL = 2**64 - 1
_MIG_ENABLED = 1

_REASON_BY_CODE = {
    _ERROR_LIBRARY_NOT_FOUND: REASON_LIBRARY_NOT_FOUND,
    _ERROR_DRIVER_NOT_LOADED: REASON_DRIVER_NOT_LOADED,
    _ERROR_NO_PERMISSION: REASON_NO_PERMISSION,
    _ERROR_LIB_RM_VERSION_MISMATCH: REASON_VERSION_MISMATCH,
    _ERROR_UNINITIALIZED: REASON_UNINITIALIZED,
}

_LIST_SYMBOLS = {
    ProcessKind.COMPUTE: "nvmlDeviceGetComputeRunningProcesses",
    ProcessKind.GRAPHICS: "nvmlDeviceGetGraphicsRunningProcesses",
    ProcessKind.MPS: "nvmlDeviceGetMPSComputeRunningProcesses",
}
_LIST_VERSIONS = (3, 2, 1)
# A symbol that is absent, or present but built for another struct version: try an older one.
_TRY_OLDER = frozenset({_ERROR_FUNCTION_NOT_FOUND, _ERROR_ARGUMENT_VERSION_MISMATCH})

# Real NVML names MIG devices "<GPU name> MIG <profile>", with a "<n>c." prefix when the
# compute instance is smaller than its GPU instance; dcgm-exporter's GPU_I_PROFILE label is
# the GPU instance part, so that is what we keep.
_MIG_PROFILE = re.compile(r"\bMIG\s+(?:\d+c\.)?(\d+g\.\d+gb(?:[+-][a-z0-9.]+)*)\s*$", re.IGNORECASE)


class NvmlUnavailable(Exception):
    """NVML cannot be used right now: library missing, init failed, driver gone, ...

    ``reason`` is one of :data:`REASONS`; the message says what happened.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------- pure parts


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
    gpu_uuid: str, gpu_index: int, entries: Iterable[ProcessEntry]
) -> tuple[GpuProcess, ...]:
    """Deduplicate one GPU's list rows per (GPU instance, pid).

    A pid listed several times keeps the union of its kinds and the largest known memory
    (None only when no row knew it). ``sm_util_ratio`` is left None for the caller to fill.
    Sorted by (gi_id, pid) so snapshots compare and render stably.
    """
    kinds: dict[tuple[int | None, int], set[ProcessKind]] = {}
    memory: dict[tuple[int | None, int], int | None] = {}
    for entry in entries:
        key = (entry.gi_id, entry.pid)
        kinds.setdefault(key, set()).add(entry.kind)
        known = memory.get(key)
        if entry.used_memory_bytes is not None and (
            known is None or entry.used_memory_bytes > known
        ):
            memory[key] = entry.used_memory_bytes
        else:
            memory.setdefault(key, None)
    return tuple(
        GpuProcess(
            gpu_uuid=gpu_uuid,
            gpu_index=gpu_index,
            gi_id=gi_id,
            pid=pid,
            used_memory_bytes=memory[(gi_id, pid)],
            sm_util_ratio=None,
            kinds=frozenset(kinds[(gi_id, pid)]),
        )
        for gi_id, pid in sorted(kinds, key=lambda k: (-1 if k[0] is None else k[0], k[1]))
    )


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


# --------------------------------------------------------------------------- I/O


class _DeviceError(Exception):
    """One GPU could not be read; the message names the call."""


class _ProcessInfoV1(ctypes.Structure):
    # nvmlProcessInfo_v1_t; pynvml no longer ships a wrapper for the unversioned symbols.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


@dataclass(frozen=True)
class _Target:
    """A handle whose process lists we read: a full GPU, or one MIG device."""

    uuid: str
    handle: Any
    gi_id: int | None
    kind: str  # "gpu" | "mig": process-list symbol versions are remembered per kind


@dataclass
class _GpuRead:
    device: GpuDevice
    migs: list[MigDevice] = field(default_factory=list)
    targets: list[_Target] = field(default_factory=list)
    processes: tuple[GpuProcess, ...] = ()


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _describe(err: BaseException) -> str:
    code = _code(err)
    try:
        text = str(err)
    except Exception:  # str() of an NVMLError calls into the library; never let it escape
        text = type(err).__name__
    return f"{text} (code {code})" if code is not None else text


# What a library returning malformed data makes pynvml or ctypes raise.
_BAD_DATA = (ValueError, IndexError, OverflowError, ctypes.ArgumentError)


class NvmlSource:
    """Reads GPUs, MIG devices and their processes from NVML, one snapshot per fetch.

    ``library_path`` preloads that file (RTLD_GLOBAL) so pynvml's ``libnvidia-ml.so.1``
    resolves to it by soname; without it pynvml loads the system library. Init is lazy; after
    a failed init, or a read that shows NVML went away, the cached error is raised again
    until ``retry_interval`` seconds (by ``clock``) have passed.
    """

    def __init__(
        self,
        library_path: str | None = None,
        retry_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.library_path = library_path
        self.retry_interval = retry_interval
        self.errors_total = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._preloaded: ctypes.CDLL | None = None
        self._initialised = False
        self._failure: NvmlUnavailable | None = None
        self._retry_at = 0.0
        # (target kind, list) -> the version that answered; 0 when none does.
        self._list_version: dict[tuple[str, ProcessKind], int] = {}
        self._last_seen: dict[str, int] = {}  # target uuid -> newest utilization timestamp
        self._logged_errors: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ public

    def fetch(self) -> GpuSnapshot:
        """Read one snapshot. Blocking; raises NvmlUnavailable when NVML cannot be used."""
        with self._lock:
            try:
                self._ensure_initialised()
                snapshot = self._read()
            except NvmlUnavailable as exc:
                self.errors_total += 1
                self._log_errors([f"NVML unavailable ({exc.reason}): {exc}"])
                raise
            self.errors_total += len(snapshot.errors)
            self._log_errors(snapshot.errors)
            return snapshot

    def close(self) -> None:
        """Shut NVML down if this source initialised it. A later fetch initialises again."""
        with self._lock:
            self._shutdown()

    # ------------------------------------------------------------------ init

    def _ensure_initialised(self) -> None:
        if self._initialised:
            return
        now = self._clock()
        if self._failure is not None and now < self._retry_at:
            raise NvmlUnavailable(self._failure.reason, str(self._failure))
        try:
            self._preload()
            pynvml.nvmlInit()
        except NvmlUnavailable as unavailable:
            self._fail_until_retry(unavailable, now)
            raise
        except pynvml.NVMLError as err:
            failure = NvmlUnavailable(
                reason_for_code(_code(err), REASON_INIT_FAILED), f"nvmlInit: {_describe(err)}"
            )
            self._fail_until_retry(failure, now)
            raise failure from err
        self._initialised = True
        self._failure = None
        # A re-init may follow a driver upgrade: learn the symbol versions again.
        self._list_version.clear()

    def _preload(self) -> None:
        if self.library_path is None or self._preloaded is not None:
            return
        try:
            self._preloaded = ctypes.CDLL(self.library_path, mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            # pynvml maps any failure to load the library to LIBRARY_NOT_FOUND as well.
            raise NvmlUnavailable(
                REASON_LIBRARY_NOT_FOUND, f"cannot load {self.library_path}: {err}"
            ) from err

    def _fail_until_retry(self, exc: NvmlUnavailable, now: float) -> None:
        self._failure = exc
        self._retry_at = now + self.retry_interval

    def _shutdown(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.debug("nvmlShutdown: %s", _describe(err))

    # ------------------------------------------------------------------ read

    def _read(self) -> GpuSnapshot:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            # NVML itself went away (driver unloaded, library reset): start over later.
            self._shutdown()
            exc = NvmlUnavailable(
                reason_for_code(_code(err), REASON_READ_FAILED),
                f"nvmlDeviceGetCount: {_describe(err)}",
            )
            self._fail_until_retry(exc, self._clock())
            raise exc from err
        errors: list[str] = []
        if count > MAX_DEVICES:
            errors.append(f"NVML reports {count} GPUs; reading the first {MAX_DEVICES}")
            count = MAX_DEVICES
        driver = self._driver_version()

        reads: list[_GpuRead] = []
        for index in range(count):
            try:
                reads.append(self._read_gpu(index))
            except (_DeviceError, pynvml.NVMLError, *_BAD_DATA) as err:
                errors.append(f"gpu {index}: {_describe(err)}")
        taken_at = time.time()

        done: list[_GpuRead] = []
        for gpu in reads:
            try:
                gpu.processes = self._with_utilization(gpu)
            except (_DeviceError, pynvml.NVMLError, *_BAD_DATA) as err:
                errors.append(f"gpu {gpu.device.index}: {_describe(err)}")
                continue
            done.append(gpu)
        self._prune_timestamps(done)

        return GpuSnapshot(
            devices=tuple(g.device for g in done),
            migs=tuple(m for g in done for m in g.migs),
            processes=tuple(p for g in done for p in g.processes),
            driver_version=driver,
            taken_at=taken_at,
            errors=tuple(errors),
        )

    def _driver_version(self) -> str:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except (pynvml.NVMLError, *_BAD_DATA) as err:
            log.debug("nvmlSystemGetDriverVersion: %s", _describe(err))
            return ""

    @staticmethod
    def _call(name: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            raise _DeviceError(f"{name}: {_describe(err)}") from err

    def _read_gpu(self, index: int) -> _GpuRead:
        handle = self._call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
        uuid = str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
        name = str(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
        mig = self._mig_enabled(handle)
        gpu = _GpuRead(GpuDevice(index=index, uuid=uuid, name=name, mig_enabled=mig))
        if mig:
            self._read_migs(gpu, handle)
        else:
            gpu.targets.append(_Target(uuid=uuid, handle=handle, gi_id=None, kind="gpu"))
        entries: list[ProcessEntry] = []
        for target in gpu.targets:
            for kind in ProcessKind:
                for pid, memory in self._read_list(target, kind):
                    entries.append(ProcessEntry(target.gi_id, pid, memory, kind))
        gpu.processes = merge_processes(uuid, index, entries)
        return gpu

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as err:
            if _code(err) in (_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND):
                return False
            raise _DeviceError(f"nvmlDeviceGetMigMode: {_describe(err)}") from err
        return int(current) == _MIG_ENABLED

    def _read_migs(self, gpu: _GpuRead, handle: Any) -> None:
        slots = self._call(
            "nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle
        )
        for slot in range(min(int(slots), MAX_MIG_SLOTS)):
            try:
                mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as err:
                if _code(err) == _ERROR_NOT_FOUND:
                    continue  # an empty slot
                raise _DeviceError(
                    f"nvmlDeviceGetMigDeviceHandleByIndex({slot}): {_describe(err)}"
                ) from err
            gi_id = int(
                self._call(
                    "nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig_handle
                )
            )
            ci_id = int(
                self._call(
                    "nvmlDeviceGetComputeInstanceId",
                    pynvml.nvmlDeviceGetComputeInstanceId,
                    mig_handle,
                )
            )
            uuid = str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig_handle))
            name = str(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, mig_handle))
            gpu.migs.append(
                MigDevice(
                    gpu_uuid=gpu.device.uuid,
                    gpu_index=gpu.device.index,
                    gi_id=gi_id,
                    ci_id=ci_id,
                    uuid=uuid,
                    profile=parse_mig_profile(name),
                )
            )
            gpu.targets.append(_Target(uuid=uuid, handle=mig_handle, gi_id=gi_id, kind="mig"))

    def _read_list(self, target: _Target, kind: ProcessKind) -> list[tuple[int, int | None]]:
        """One process list of one handle, trying older symbol versions where needed."""
        key = (target.kind, kind)
        start = self._list_version.get(key, _LIST_VERSIONS[0])
        for version in _LIST_VERSIONS:
            if version > start:
                continue
            symbol = _LIST_SYMBOLS[kind] + ("" if version == 1 else f"_v{version}")
            try:
                rows = self._list_call(symbol, version, target.handle)
            except pynvml.NVMLError as err:
                code = _code(err)
                if code in _TRY_OLDER:
                    continue
                if code == _ERROR_NOT_SUPPORTED:
                    return []
                raise _DeviceError(f"{symbol}: {_describe(err)}") from err
            self._list_version[key] = version
            return rows
        if self._list_version.get(key) != 0:
            log.warning("NVML has no usable %s for %s devices", _LIST_SYMBOLS[kind], target.kind)
            self._list_version[key] = 0
        return []

    @staticmethod
    def _list_call(symbol: str, version: int, handle: Any) -> list[tuple[int, int | None]]:
        if version == 1:
            return _list_v1(symbol, handle)
        wrapper = getattr(pynvml, symbol, None)
        if wrapper is None:  # an older pynvml without this wrapper: same as a missing symbol
            raise pynvml.NVMLError(_ERROR_FUNCTION_NOT_FOUND)
        return [(int(p.pid), _memory(p.usedGpuMemory)) for p in wrapper(handle)]

    def _with_utilization(self, gpu: _GpuRead) -> tuple[GpuProcess, ...]:
        # Samples are pooled per GPU instance: a GI split into several compute instances
        # has one MIG handle per CI but one gi_id in the processes.
        supported: dict[int | None, list[UtilSample]] = {}
        for target in gpu.targets:
            samples = self._read_utilization(target)
            if samples is not None:
                supported.setdefault(target.gi_id, []).extend(samples)
        ratios = {gi: utilization_from_samples(s) for gi, s in supported.items()}
        return tuple(
            replace(
                p,
                sm_util_ratio=ratios[p.gi_id].get(p.pid, 0.0) if p.gi_id in ratios else None,
            )
            for p in gpu.processes
        )

    def _read_utilization(self, target: _Target) -> list[UtilSample] | None:
        """Samples since the last read; [] for none, None where NVML cannot tell."""
        since = self._last_seen.get(target.uuid, 0)
        raw: Sequence[Any] = ()
        for attempt in range(2):
            try:
                raw = pynvml.nvmlDeviceGetProcessUtilization(target.handle, since)
                break
            except pynvml.NVMLError as err:
                code = _code(err)
                # pynvml raises "error 0" when the size query finds nothing to report.
                if code in (_ERROR_NOT_FOUND, _SUCCESS):
                    return []
                if code in (_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND):
                    return None
                # New samples can arrive between pynvml's size query and its fill call.
                if code == _ERROR_INSUFFICIENT_SIZE and attempt == 0:
                    continue
                raise _DeviceError(f"nvmlDeviceGetProcessUtilization: {_describe(err)}") from err
        samples = [UtilSample(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in raw]
        fresh, newest = newer_samples(samples, since)
        self._last_seen[target.uuid] = newest
        return fresh

    def _prune_timestamps(self, done: list[_GpuRead]) -> None:
        # Kept for devices that failed this time too (so a flaky GPU does not recount old
        # samples), until the table outgrows its bound; then only current devices stay.
        if len(self._last_seen) <= MAX_TRACKED_TIMESTAMPS:
            return
        current = {t.uuid for g in done for t in g.targets}
        self._last_seen = {u: ts for u, ts in self._last_seen.items() if u in current}

    def _log_errors(self, errors: Iterable[str]) -> None:
        # A new problem is a warning; the same problem on the next scrape is debug noise.
        current = frozenset(errors)
        for message in sorted(current):
            level = logging.DEBUG if message in self._logged_errors else logging.WARNING
            log.log(level, "nvml: %s", message)
        self._logged_errors = current


def _memory(value: Any) -> int | None:
    if value is None:
        return None
    number = int(value)
    return None if number == _VALUE_NOT_AVAILABLE_ULL else number


def _list_v1(symbol: str, handle: Any) -> list[tuple[int, int | None]]:
    """Call an unversioned process-list symbol with the v1 struct (size, then fill)."""
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == _SUCCESS:
        return []
    if ret != _ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(ret)
    if count.value > MAX_PROCESSES_PER_LIST:
        raise _DeviceError(f"{symbol}: {count.value} processes, over {MAX_PROCESSES_PER_LIST}")
    # Headroom for processes that start between the two calls, as pynvml does.
    size = min(count.value * 2 + 5, MAX_PROCESSES_PER_LIST)
    buffer = (_ProcessInfoV1 * size)()
    count.value = size
    ret = fn(handle, ctypes.byref(count), buffer)
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    return [
        (int(buffer[i].pid), _memory(buffer[i].usedGpuMemory))
        for i in range(min(count.value, size))
    ]
