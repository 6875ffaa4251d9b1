"""The NVML source: which processes use each GPU and MIG instance, and how much.

:class:`NvmlSource` does the I/O through pynvml (``nvidia-ml-py``); what NVML answers is
parsed by the pure :mod:`enricher.nvmlparse` (return codes as reasons, MIG profiles, the rows of
the process lists and samples, one GPU's processes), which holds the rules and is tested alone.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from .model import (
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    MigDevice,
    PowerReading,
    ProcessKind,
)
from .nvmlcalls import (
    BAD_DATA,
    DeviceError,
    ProcessCalls,
    Target,
    answer_of,
    code_of,
    describe,
)
from .nvmlparse import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NO_PERMISSION,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_UNINITIALIZED,
    REASON_INIT_FAILED,
    REASON_LIBRARY_NOT_FOUND,
    REASON_READ_FAILED,
    SUCCESS,
    ProcessEntry,
    UtilSample,
    merge_processes,
    parse_mig_profile,
    reason_for_code,
    utilization_from_samples,
)
from .sources import ReadResult

log = logging.getLogger(__name__)

T = TypeVar("T")

# Bounds on what a misbehaving library can make us allocate or loop over.
MAX_DEVICES = 256
MAX_MIG_SLOTS = 64
# A reading the board lacks (power and energy): absent, not an error.
_OPTIONAL_ABSENT = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, ERROR_NO_PERMISSION})
_MIG_ENABLED = 1
_KINDS = tuple(ProcessKind)  # iterating the enum class itself costs more than the calls
_UUID_BUFFER_SIZE = ctypes.c_uint(pynvml.NVML_DEVICE_UUID_V2_BUFFER_SIZE)  # 96: what pynvml gives

# NVML fixes the device count and each index's handle at nvmlInit. A GPU that leaves while it
# runs (unbound from the driver, fallen off the bus, unplugged) answers GPU_IS_LOST through
# its handle; one that arrives, or comes back at another index, is seen by a new init only.
# These answers to a device call make the source initialise NVML again (UNINITIALIZED: the
# library was shut down under us).
_ENUMERATE_AGAIN = frozenset({ERROR_GPU_IS_LOST, ERROR_UNINITIALIZED})


class NvmlUnavailable(Exception):
    """NVML cannot be used right now: library missing, init failed, driver gone, ...

    ``reason`` is one of nvmlparse's ``REASON_*`` values; the message says what happened.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------- I/O


@dataclass
class _GpuRead:
    device: GpuDevice
    migs: list[MigDevice] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    entries: list[ProcessEntry] = field(default_factory=list)
    processes: tuple[GpuProcess, ...] = ()
    power: PowerReading | None = None


def snapshot_reading(fetch: Callable[[], GpuSnapshot]) -> ReadResult[GpuSnapshot]:
    """A snapshot as a Source reading: not ok when NVML reported errors or is unavailable."""
    try:
        snapshot = fetch()
    except NvmlUnavailable as exc:
        return ReadResult(GpuSnapshot(), False, f"NVML unavailable ({exc.reason}): {exc}")
    return ReadResult(snapshot, not snapshot.errors, "; ".join(snapshot.errors))


class NvmlSource:
    """Reads GPUs, MIG devices and their processes from NVML, one snapshot per fetch.

    ``library_path`` preloads that file (RTLD_GLOBAL) so pynvml's ``libnvidia-ml.so.1``
    resolves to it by soname; without it pynvml loads the system library. Init is lazy; after
    a failed init, or a read that shows NVML went away, the cached error is raised again
    until ``retry_interval`` seconds (by ``clock``) have passed.

    GPUs that come and go: NVML fixes its devices at init, so a device call that answers
    GPU_IS_LOST (or UNINITIALIZED) drops that GPU from the snapshot with an error, and the
    next fetch shuts NVML down and initialises it again (``reinitializations_total``), every
    cache with it; so does each fetch while a GPU listed before is missing since the last
    re-initialisation, until it is back. Either happens at most once per ``retry_interval``.
    """

    name = "nvml"
    enabled = True

    def __init__(
        self,
        library_path: str | None = None,
        retry_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.library_path = library_path
        self.retry_interval = retry_interval
        self.errors_total = 0
        self.reinitializations_total = 0  # NVML shut down and initialised again: GPUs changed
        self._clock = clock
        self._lock = threading.Lock()
        self._preloaded: ctypes.CDLL | None = None
        self._initialised = False
        self._failure: NvmlUnavailable | None = None
        self._retry_at = 0.0
        # The process lists and utilization samples (which versions answer, the newest
        # sample seen per device, devices without per-process utilization).
        self._calls = ProcessCalls(clock)
        # What cannot change while NVML stays initialised (indices are fixed at init; a GPU's
        # UUID and name are its own; a MIG UUID names one instance for its whole life): read
        # once per init instead of on every fetch. Forgotten on re-init and, per GPU, when a
        # call on it fails.
        self._driver: str | None = None
        self._gpus: dict[int, tuple[Any, str, str]] = {}  # index -> (handle, uuid, name)
        self._max_migs: dict[int, int] = {}  # index -> MIG slots
        self._mig_info: dict[str, tuple[int, int, str]] = {}  # MIG uuid -> (gi, ci, profile)
        # GPUs that come and go (the class's docstring). index -> uuid of every GPU read since
        # init, kept when its read fails (unlike _gpus): the GPUs this init enumerated.
        self._enumerated: dict[int, str] = {}
        self._lost: str | None = None  # a device call's answer that NVML must start over
        self._missing: frozenset[str] = frozenset()  # listed before, not since the last init
        self._before: frozenset[str] | None = None  # listed before the re-init just made
        self._reinit_at = 0.0  # no re-initialisation before then
        self._uuid_buffer = ctypes.create_string_buffer(_UUID_BUFFER_SIZE.value)

    # ------------------------------------------------------------------ public

    def fetch(self) -> GpuSnapshot:
        """Read one snapshot. Blocking; raises NvmlUnavailable when NVML cannot be used."""
        with self._lock:
            try:
                self._ensure_initialised()
                self._reinitialise_if_due()
                snapshot = self._read()
            except NvmlUnavailable:
                self.errors_total += 1
                raise
            # Logged by the caller (the scraper's episode log), not here: once, not twice.
            self.errors_total += len(snapshot.errors)
            return snapshot

    def read(self) -> ReadResult[GpuSnapshot]:
        """The Source read (blocking): one snapshot, or why NVML cannot be used."""
        return snapshot_reading(self.fetch)

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
                reason_for_code(code_of(err), REASON_INIT_FAILED), f"nvmlInit: {describe(err)}"
            )
            self._fail_until_retry(failure, now)
            raise failure from err
        self._initialised = True
        self._failure = None
        self._forget(versions=True)

    def _reinitialise_if_due(self) -> None:
        """Start NVML over when a GPU answered that it is lost, or while one listed before is
        missing: at most once per retry_interval (a GPU lost for good must not make every
        fetch initialise NVML). The first read after it says what changed (_settle)."""
        if self._lost is None and not self._missing:
            return
        now = self._clock()
        if now < self._reinit_at:
            return
        self._reinit_at = now + self.retry_interval
        why = self._lost or "looking for " + ", ".join(sorted(self._missing))
        log.debug("initialising NVML again: %s", why)
        self._before = frozenset((*self._enumerated.values(), *self._missing))
        self._lost = None
        self.reinitializations_total += 1
        self._shutdown()
        self._ensure_initialised()

    def _settle(self) -> None:
        """After the first read since a re-initialisation: the GPUs that left (looked for at
        the next ones until they are back) and those that arrived."""
        before, self._before = self._before, None
        if before is None:
            return
        listed = frozenset(self._enumerated.values())
        left, arrived = before - listed, listed - before
        if arrived or left != self._missing:
            log.warning(
                "NVML's GPUs changed: %s left, %s arrived",
                ", ".join(sorted(left)) or "none",
                ", ".join(sorted(arrived)) or "none",
            )
        else:
            log.debug("NVML initialised again; still missing: %s", ", ".join(sorted(left)))
        self._missing = frozenset(sorted(left)[:MAX_DEVICES])

    def _note_failure(self, index: int, err: BaseException, message: str) -> None:
        """A GPU's read failed: forget what was cached about it, and start NVML over on the
        next fetch when the answer says its handle is gone."""
        self._forget_gpu(index)
        if self._lost is None and answer_of(err) in _ENUMERATE_AGAIN:
            self._lost = message

    def _forget(self, *, versions: bool) -> None:
        """What this initialisation learnt (and, after a new nvmlInit, which may follow a
        driver upgrade, the symbol versions too)."""
        self._driver = None
        self._enumerated.clear()
        self._gpus.clear()
        self._max_migs.clear()
        self._mig_info.clear()
        self._calls.forget(versions=versions)

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
            log.debug("nvmlShutdown: %s", describe(err))

    # ------------------------------------------------------------------ read

    def _read(self) -> GpuSnapshot:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            # NVML itself went away (driver unloaded, library reset): start over later.
            self._shutdown()
            exc = NvmlUnavailable(
                reason_for_code(code_of(err), REASON_READ_FAILED),
                f"nvmlDeviceGetCount: {describe(err)}",
            )
            self._fail_until_retry(exc, self._clock())
            raise exc from err
        errors: list[str] = []
        if count > MAX_DEVICES:
            errors.append(f"NVML reports {count} GPUs; reading the first {MAX_DEVICES}")
            count = MAX_DEVICES
        if self._driver is None:
            self._driver = self._driver_version()
        driver = self._driver

        reads: list[_GpuRead] = []
        for index in range(count):
            try:
                reads.append(self._read_gpu(index))
            except (DeviceError, pynvml.NVMLError, *BAD_DATA) as err:
                errors.append(f"gpu {index}: {describe(err)}")
                self._note_failure(index, err, errors[-1])
        taken_at = time.time()
        self._settle()

        done: list[_GpuRead] = []
        for gpu in reads:
            try:
                gpu.processes = self._with_utilization(gpu)
            except (DeviceError, pynvml.NVMLError, *BAD_DATA) as err:
                errors.append(f"gpu {gpu.device.index}: {describe(err)}")
                self._note_failure(gpu.device.index, err, errors[-1])
                continue
            done.append(gpu)
        self._calls.prune_timestamps({t.uuid for g in done for t in g.targets})

        return GpuSnapshot(
            devices=tuple(g.device for g in done),
            migs=tuple(m for g in done for m in g.migs),
            processes=tuple(p for g in done for p in g.processes),
            power=tuple(g.power for g in done if g.power is not None),
            driver_version=driver,
            taken_at=taken_at,
            errors=tuple(errors),
        )

    def _driver_version(self) -> str:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except (pynvml.NVMLError, *BAD_DATA) as err:
            log.debug("nvmlSystemGetDriverVersion: %s", describe(err))
            return ""

    @staticmethod
    def _call(name: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            raise DeviceError(f"{name}: {describe(err)}", code_of(err)) from err

    def _forget_gpu(self, index: int) -> None:
        # A failing GPU may come back reset or replaced: read what was cached about it again.
        entry = self._gpus.pop(index, None)
        self._max_migs.pop(index, None)
        if entry is not None:
            self._mig_info.clear()

    def _gpu_identity(self, index: int) -> tuple[Any, str, str]:
        entry = self._gpus.get(index)
        if entry is None:
            handle = self._call(
                "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
            )
            uuid = str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
            name = str(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
            entry = self._gpus[index] = (handle, uuid, name)
            if len(self._enumerated) < MAX_DEVICES:
                self._enumerated[index] = uuid
        return entry

    def _read_gpu(self, index: int) -> _GpuRead:
        handle, uuid, name = self._gpu_identity(index)
        mig = self._mig_enabled(handle)
        gpu = _GpuRead(GpuDevice(index=index, uuid=uuid, name=name, mig_enabled=mig))
        if mig:
            self._read_migs(gpu, handle)
        else:
            gpu.targets.append(Target(uuid=uuid, handle=handle, gi_id=None, kind="gpu"))
        for target in gpu.targets:
            for kind in _KINDS:
                for pid, memory in self._calls.read_list(target, kind):
                    gpu.entries.append(ProcessEntry(target.gi_id, pid, memory, kind))
        gpu.power = self._read_power(handle, uuid)
        return gpu

    def _read_power(self, handle: Any, uuid: str) -> PowerReading | None:
        """The GPU's power draw (NVML: milliwatts) and total energy (millijoules); a reading
        NVML does not support is None, and None for both when it supports neither."""
        watts = self._optional("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, handle)
        energy = self._optional(
            "nvmlDeviceGetTotalEnergyConsumption",
            pynvml.nvmlDeviceGetTotalEnergyConsumption,
            handle,
        )
        if watts is None and energy is None:
            return None
        return PowerReading(
            uuid,
            None if watts is None else int(watts) / 1000.0,
            None if energy is None else float(int(energy)),
        )

    @staticmethod
    def _optional(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A reading some boards lack: None when NVML does not support it (or, for a caller
        without the privilege, refuses it); any other failure fails the GPU's read."""
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            if code_of(err) in _OPTIONAL_ABSENT:
                return None
            raise DeviceError(f"{name}: {describe(err)}", code_of(err)) from err

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as err:
            if code_of(err) in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND):
                return False
            raise DeviceError(f"nvmlDeviceGetMigMode: {describe(err)}", code_of(err)) from err
        return int(current) == _MIG_ENABLED

    def _read_migs(self, gpu: _GpuRead, handle: Any) -> None:
        index = gpu.device.index
        slots = self._max_migs.get(index)
        if slots is None:
            slots = self._max_migs[index] = int(
                self._call(
                    "nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle
                )
            )
        handle_fn = self._calls.function("nvmlDeviceGetMigDeviceHandleByIndex")
        uuid_fn = self._calls.function("nvmlDeviceGetUUID")
        uuid_buffer = self._uuid_buffer
        for slot in range(min(slots, MAX_MIG_SLOTS)):
            # The slot is read on every fetch (instances come and go while the GPU runs);
            # what an instance is never changes under its UUID. Both calls go through their
            # function pointers, as pynvml's wrappers would (they run for every instance on
            # every read: the wrappers' lookups cost more than the calls).
            mig_handle = pynvml.c_nvmlDevice_t()
            ret = handle_fn(handle, ctypes.c_uint(slot), ctypes.byref(mig_handle))
            if ret == ERROR_NOT_FOUND:
                continue  # an empty slot
            if ret != SUCCESS:
                raise DeviceError(
                    f"nvmlDeviceGetMigDeviceHandleByIndex({slot}): "
                    f"{describe(pynvml.NVMLError(ret))}",
                    ret,
                )
            ret = uuid_fn(mig_handle, uuid_buffer, _UUID_BUFFER_SIZE)
            if ret != SUCCESS:
                raise DeviceError(f"nvmlDeviceGetUUID: {describe(pynvml.NVMLError(ret))}", ret)
            uuid = uuid_buffer.value.decode()  # strict, as pynvml decodes: bad bytes fail the GPU
            info = self._mig_info.get(uuid)
            if info is None:
                info = self._read_mig_info(mig_handle)
                if len(self._mig_info) >= MAX_DEVICES * MAX_MIG_SLOTS:
                    self._mig_info.clear()
                self._mig_info[uuid] = info
            gi_id, ci_id, profile = info
            gpu.migs.append(
                MigDevice(
                    gpu_uuid=gpu.device.uuid,
                    gpu_index=gpu.device.index,
                    gi_id=gi_id,
                    ci_id=ci_id,
                    uuid=uuid,
                    profile=profile,
                )
            )
            gpu.targets.append(Target(uuid=uuid, handle=mig_handle, gi_id=gi_id, kind="mig"))

    def _read_mig_info(self, mig_handle: Any) -> tuple[int, int, str]:
        gi_id = int(
            self._call("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig_handle)
        )
        ci_id = int(
            self._call(
                "nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig_handle
            )
        )
        name = str(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, mig_handle))
        return gi_id, ci_id, parse_mig_profile(name)

    def _with_utilization(self, gpu: _GpuRead) -> tuple[GpuProcess, ...]:
        # Samples are pooled per GPU instance: a GI split into several compute instances
        # has one MIG handle per CI but one gi_id in the processes.
        supported: dict[int | None, list[UtilSample]] = {}
        for target in gpu.targets:
            samples = self._calls.read_utilization(target)
            if samples is not None:
                supported.setdefault(target.gi_id, []).extend(samples)
        ratios = {gi: utilization_from_samples(s) for gi, s in supported.items()}
        device = gpu.device
        return merge_processes(device.uuid, device.index, gpu.entries, ratios)
