"""NVML's process lists and utilization samples, read through pynvml's function pointers
into reused buffers, for the NVML source (``enricher.nvml``): which list versions the library
answers, which devices do not support per-process utilization, and the newest sample seen per
device. What comes back is parsed by the pure ``enricher.nvmlparse``.

The errors a device read raises (``DeviceError``) and how an NVML error is described live here
too, for both modules.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from .model import ProcessKind
from .nvmlparse import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_INSUFFICIENT_SIZE,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ROWS_SAMPLE,
    ROWS_V1,
    ROWS_V2,
    SUCCESS,
    UtilSample,
    newer_samples,
    parse_process_rows,
    parse_sample_rows,
)

log = logging.getLogger(__name__)

MAX_PROCESSES_PER_LIST = 16384
MAX_TRACKED_TIMESTAMPS = 1024
# A device whose process utilization NVML does not support (every MIG device: "On MIG-enabled
# GPUs, querying process utilization is not currently supported") is asked again only after
# this many seconds: one call per MIG device and collection saved, and a driver that learns it
# is still found.
UTILIZATION_RETRY_SECONDS = 300.0

_LIST_SYMBOLS = {
    ProcessKind.COMPUTE: "nvmlDeviceGetComputeRunningProcesses",
    ProcessKind.GRAPHICS: "nvmlDeviceGetGraphicsRunningProcesses",
    ProcessKind.MPS: "nvmlDeviceGetMPSComputeRunningProcesses",
}
_LIST_VERSIONS = (3, 2, 1)
# A learnt version (0: none answers) -> the versions to try, newest first.
_VERSIONS_FROM = {v: tuple(w for w in _LIST_VERSIONS if w <= v) for v in (0, *_LIST_VERSIONS)}
# (list, version) -> its symbol: looked up on every read of every device, not written anew.
_LIST_SYMBOL = {
    (kind, version): base + ("" if version == 1 else f"_v{version}")
    for kind, base in _LIST_SYMBOLS.items()
    for version in _LIST_VERSIONS
}
# A symbol that is absent, or present but built for another struct version: try an older one.
_TRY_OLDER = frozenset({ERROR_FUNCTION_NOT_FOUND, ERROR_ARGUMENT_VERSION_MISMATCH})


class DeviceError(Exception):
    """One GPU could not be read; the message names the call, ``code`` is NVML's answer
    (None for data NVML should not have given)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


# The process lists and utilization samples are read through pynvml's function pointers into
# plain buffers: pynvml's wrappers ask for the size first (two library calls where one does)
# and turn every row into a dict-backed object, which costs more than the call itself. The
# rows are unpacked with struct in one C call (the layouts are nvmlparse's).
_FIRST_CAPACITY = 32  # rows offered on the first call; most lists fit, so one call does
_LARGEST_ROW = max(ROWS_V1.size, ROWS_V2.size, ROWS_SAMPLE.size)


def _fill(
    symbol: str,
    rows: struct.Struct,
    call: Callable[[Any, Any], int],
    first: Any,
) -> tuple[int, list[tuple[Any, ...]]]:
    """Call an NVML "count in, rows out" function with room for _FIRST_CAPACITY rows; on
    NVML_ERROR_INSUFFICIENT_SIZE once more with room for what it asked (plus headroom for
    rows that appear between the calls, as pynvml allows), bounded by
    MAX_PROCESSES_PER_LIST. ``call(buffer, count_ref)`` makes the call. ``first``: the buffer
    of the first call (room for _FIRST_CAPACITY rows), reused across calls by a caller that
    makes one at a time (only the rows the call reports filled are read back). Returns
    the return code and the rows filled, unpacked (none unless the call succeeded)."""
    capacity = _FIRST_CAPACITY
    for attempt in range(2):
        buffer = first if attempt == 0 else (ctypes.c_ubyte * (capacity * rows.size))()
        count = ctypes.c_uint(capacity)
        ret = call(buffer, ctypes.byref(count))
        if ret != ERROR_INSUFFICIENT_SIZE:
            if ret != SUCCESS:
                return ret, []
            n = min(count.value, capacity)
            return ret, list(rows.iter_unpack(memoryview(buffer)[: n * rows.size]))
        if count.value > MAX_PROCESSES_PER_LIST:
            raise DeviceError(f"{symbol}: {count.value} rows, over {MAX_PROCESSES_PER_LIST}")
        capacity = min(count.value * 2 + 5, MAX_PROCESSES_PER_LIST)
    return ret, []


@dataclass(frozen=True)
class Target:
    """A handle whose process lists we read: a full GPU, or one MIG device."""

    uuid: str
    handle: Any
    gi_id: int | None
    kind: str  # "gpu" | "mig": process-list symbol versions are remembered per kind


def code_of(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def answer_of(err: BaseException) -> int | None:
    """NVML's return code behind a failed device read (pynvml's or ours)."""
    return err.code if isinstance(err, DeviceError) else code_of(err)


def describe(err: BaseException) -> str:
    code = code_of(err)
    try:
        text = str(err)
    except Exception:  # str() of an NVMLError calls into the library; never let it escape
        text = type(err).__name__
    return f"{text} (code {code})" if code is not None else text


# What a library returning malformed data makes pynvml or ctypes raise.
BAD_DATA = (ValueError, IndexError, OverflowError, ctypes.ArgumentError)


class ProcessCalls:
    """The process-list and utilization calls of one NVML initialisation (:meth:`forget` when
    NVML starts over). Not thread-safe: the NVML source calls it under its lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (target kind, list) -> the version that answered; 0 when none does.
        self._list_version: dict[tuple[str, ProcessKind], int] = {}
        self._last_seen: dict[str, int] = {}  # target uuid -> newest utilization timestamp
        # target uuid -> when to ask again for its process utilization, which it does not support
        self._util_unsupported: dict[str, float] = {}
        self._functions: dict[str, Any] = {}  # symbol -> pynvml function pointer
        # The first call's buffer of every list and sample read (one at a time): room for
        # _FIRST_CAPACITY rows of the largest layout, made once.
        self._first_buffer = (ctypes.c_ubyte * (_FIRST_CAPACITY * _LARGEST_ROW))()

    def forget(self, *, versions: bool) -> None:
        """What one initialisation learnt; ``versions`` too after a new nvmlInit (it may
        follow a driver upgrade)."""
        self._util_unsupported.clear()
        self._functions.clear()
        if versions:
            self._list_version.clear()

    def function(self, symbol: str) -> Any:
        fn = self._functions.get(symbol)
        if fn is None:
            fn = self._functions[symbol] = pynvml._nvmlGetFunctionPointer(symbol)
        return fn

    def read_list(self, target: Target, kind: ProcessKind) -> list[tuple[int, int | None]]:
        """One process list of one handle, trying older symbol versions where needed (from
        the one that answered last: on every later read, the first try is the one)."""
        key = (target.kind, kind)
        handle = target.handle
        for version in _VERSIONS_FROM[self._list_version.get(key, _LIST_VERSIONS[0])]:
            symbol = _LIST_SYMBOL[kind, version]
            rows: list[tuple[Any, ...]] = []
            try:
                fn = self.function(symbol)
            except pynvml.NVMLError as err:  # the library has no such symbol
                ret = code_of(err)
            else:
                layout = ROWS_V1 if version == 1 else ROWS_V2
                # Called at once, in this iteration: the lambda sees this iteration's fn.
                call = lambda buf, count: fn(handle, count, buf)  # noqa: B023, E731
                ret, rows = _fill(symbol, layout, call, self._first_buffer)
            if ret == SUCCESS:
                self._list_version[key] = version
                return parse_process_rows(rows)
            if ret in _TRY_OLDER:
                continue
            if ret == ERROR_NOT_SUPPORTED:
                return []
            raise DeviceError(f"{symbol}: {describe(pynvml.NVMLError(ret))}", ret)
        if self._list_version.get(key) != 0:
            log.warning("NVML has no usable %s for %s devices", _LIST_SYMBOLS[kind], target.kind)
            self._list_version[key] = 0
        return []

    def read_utilization(self, target: Target) -> list[UtilSample] | None:
        """Samples since the last read; [] for none, None where NVML cannot tell."""
        retry_at = self._util_unsupported.get(target.uuid)
        if retry_at is not None and self._clock() < retry_at:
            return None
        since = self._last_seen.get(target.uuid, 0)
        symbol = "nvmlDeviceGetProcessUtilization"
        try:
            fn = self.function(symbol)
        except pynvml.NVMLError as err:
            if code_of(err) == ERROR_FUNCTION_NOT_FOUND:
                return None
            raise
        last_seen = ctypes.c_ulonglong(since)
        handle = target.handle
        # New samples can arrive between two calls: _fill retries once with more room.
        ret, rows = _fill(
            symbol,
            ROWS_SAMPLE,
            lambda buf, count: fn(handle, buf, count, last_seen),
            self._first_buffer,
        )
        if ret == ERROR_NOT_SUPPORTED:  # the device's answer (a MIG device's), kept a while
            if len(self._util_unsupported) >= MAX_TRACKED_TIMESTAMPS:
                self._util_unsupported.clear()
            self._util_unsupported[target.uuid] = self._clock() + UTILIZATION_RETRY_SECONDS
            return None
        self._util_unsupported.pop(target.uuid, None)
        if ret == ERROR_FUNCTION_NOT_FOUND:
            return None
        if ret == ERROR_NOT_FOUND:
            return []  # no sample newer than ``since``: idle, not unknown
        if ret != SUCCESS:
            raise DeviceError(f"{symbol}: {describe(pynvml.NVMLError(ret))}", ret)
        fresh, newest = newer_samples(parse_sample_rows(rows), since)
        self._last_seen[target.uuid] = newest
        return fresh

    def prune_timestamps(self, current: set[str]) -> None:
        # Kept for devices that failed this time too (so a flaky GPU does not recount old
        # samples), until the table outgrows its bound; then only current devices stay.
        if len(self._last_seen) <= MAX_TRACKED_TIMESTAMPS:
            return
        self._last_seen = {u: ts for u, ts in self._last_seen.items() if u in current}
