"""The procfs source: which pod and container a host PID belongs to.

``parse_*`` functions are pure and take file contents (the cgroup file's are in ``cgroups``);
``ProcfsSource`` does the reads under a configurable root (``--path.procfs``) so tests and the
demo can point it at a simulated tree.
"""

from __future__ import annotations

import logging
import math
import os
import re
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from .cgroups import MAX_FILE_BYTES, parse_cgroup
from .episodes import EpisodeLog
from .model import ProcError, ProcInfo
from .sources import ReadResult

__all__ = ["ProcfsSource", "parse_btime", "parse_stat", "read_bounded"]

log = logging.getLogger(__name__)

# /proc/stat carries one "intr" line with a counter per IRQ; on large nodes that line alone can
# exceed 64 KiB, and btime comes after it.
MAX_PROC_STAT_BYTES = 1024 * 1024
# How far the tree's btime may be from this machine's wall clock minus CLOCK_BOOTTIME for the
# tree to count as this machine's /proc (btime is whole seconds; NTP slews move it a little).
BOOT_CLOCK_MATCH_SECONDS = 2.0

_DIGITS = re.compile(r"[0-9]{1,20}")

# --------------------------------------------------------------------------- pure parsing


def _parse_stat(text: str) -> tuple[str, int]:
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 1 or close_paren < open_paren:
        raise ValueError("stat: no '(comm)' after the pid")
    # len, isascii and isdigit match what _DIGITS matches (the only ASCII digits are 0-9) at a
    # fraction of a regex call's cost, and this runs for every PID on every scrape.
    pid = text[:open_paren].strip()
    if not (len(pid) <= 20 and pid.isascii() and pid.isdigit()):
        raise ValueError("stat: the pid is not a number")
    comm = text[open_paren + 1 : close_paren]
    # Only fields up to starttime matter; 20 splits leave fields[0..19] whole and the ~30
    # fields after starttime in one unsplit tail.
    fields = text[close_paren + 1 :].split(None, 20)
    # fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
    if len(fields) < 20:
        raise ValueError(f"stat: {len(fields) + 2} fields, starttime is field 22")
    state, starttime = fields[0], fields[19]
    if len(state) != 1 or not state.isalpha():
        raise ValueError(f"stat: bad state {state[:8]!r}")
    if not (len(starttime) <= 20 and starttime.isascii() and starttime.isdigit()):
        raise ValueError(f"stat: bad starttime {starttime[:24]!r}")
    return comm, int(starttime)


def parse_stat(text: str) -> tuple[str, int]:
    """Return ``(comm, starttime)`` from ``/proc/<pid>/stat``; starttime is in clock ticks.

    comm runs from the first ``(`` to the last ``)``, so spaces and parentheses in it are
    fine. Raises ``ValueError`` when the text is not a stat line.
    """
    return _parse_stat(text)


def parse_btime(text: str) -> int:
    """Return the boot time (Unix seconds) from the ``btime`` line of ``/proc/stat``.

    Raises ``ValueError`` when there is no well-formed ``btime`` line.
    """
    for line in text.split("\n"):
        if line.startswith("btime "):
            fields = line.split()
            if len(fields) == 2 and _DIGITS.fullmatch(fields[1]):
                return int(fields[1])
            raise ValueError(f"/proc/stat: bad btime line {line[:40]!r}")
    raise ValueError("/proc/stat: no btime line")


# --------------------------------------------------------------------------- I/O


# O_NONBLOCK: a FIFO planted in a fake tree must not hang a scrape (regular files ignore it).
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _NotRegularFileError(OSError):
    pass


def read_bounded(path: str, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes; return the data and whether the file had more."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegularFileError(f"{path}: not a regular file")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def _is_gone(exc: OSError) -> bool:
    # ENOENT once the directory is gone; ESRCH when the process exits while a file is open.
    return isinstance(exc, (FileNotFoundError, ProcessLookupError))


class ProcfsSource:
    """Reads ``<root>/<pid>/{stat,cgroup}`` and says which container a PID runs in.

    The stat file is read on every call (it detects PID reuse); the result, with its parsed
    cgroup, is kept in a bounded LRU keyed by PID and start time. Safe to call from several
    threads.
    """

    name = "procfs"
    enabled = True

    def __init__(
        self,
        root: str = "/proc",
        clk_tck: int | None = None,
        cache_size: int = 8192,
        *,
        btime_max_age: float = 60.0,
        boot_clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``btime_max_age``: seconds between re-reads of ``<root>/stat`` (clock steps move it).

        ``boot_clock``: seconds since the tree's boot, now: the clock that process start
        times (``starttime``, in clock ticks) count on. None: CLOCK_BOOTTIME when the tree's
        btime agrees with it (this machine's /proc, as ``--path.procfs`` points at), else
        ``wall_clock() - btime`` (a tree written by ``enricher.fakeproc``)."""
        ticks = os.sysconf("SC_CLK_TCK") if clk_tck is None else clk_tck
        if ticks <= 0:
            raise ValueError(f"clk_tck must be positive, got {ticks}")
        if cache_size < 0:
            raise ValueError(f"cache_size must not be negative, got {cache_size}")
        self.root = root
        self.clk_tck = ticks
        self.cache_size = cache_size
        self.btime_max_age = btime_max_age
        self.errors_total = 0
        # The last ProcInfo per PID; its cgroup is valid while its start_time_ticks match.
        self._cache: OrderedDict[int, ProcInfo] = OrderedDict()
        self._btime: int | None = None
        self._btime_read_at = 0.0
        self._lock = threading.Lock()
        self._log = EpisodeLog("procfs", log)
        self._boot_clock = boot_clock
        self._wall_clock = wall_clock

    def read(
        self, pids: Iterable[int], listed_at: float | None = None
    ) -> ReadResult[dict[int, ProcInfo | ProcError]]:
        """The Source read (blocking): :meth:`read_many`, ok when no file was unreadable (the
        episodes are logged here, per unreadable file)."""
        errors_before = self.errors_total
        found = self.read_many(pids, listed_at)
        return ReadResult(found, self.errors_total == errors_before)

    def close(self) -> None:
        """Nothing to release: every file is closed after its read."""

    def read_pid(self, pid: int, listed_at: float | None = None) -> ProcInfo | ProcError:
        """Return what procfs says about ``pid``, or why it cannot tell.

        ``listed_at`` is the wall-clock time NVML listed the PID; a process that started after
        it, to the clock tick, is a newer process reusing the PID (``ProcError.REUSED``). The
        comparison is made on the boot clock (``boot_clock``), where start times are exact to
        the tick; btime, whole seconds, would hide a PID reused within a second.
        """
        return self._read_batch((pid,), listed_at)[0]

    def read_many(
        self, pids: Iterable[int], listed_at: float | None = None
    ) -> dict[int, ProcInfo | ProcError]:
        """``read_pid`` each distinct PID, all against the same ``listed_at``."""
        unique = list(dict.fromkeys(pids))
        errors_before = self.errors_total
        results = dict(zip(unique, self._read_batch(unique, listed_at), strict=True))
        if self.errors_total == errors_before:
            self._log.ok()
        return results

    # ----------------------------------------------------------------------- internals

    def _read_batch(
        self, pids: Sequence[int], listed_at: float | None
    ) -> list[ProcInfo | ProcError]:
        """What ``read_pid`` returns for each of ``pids``, in order."""
        results: list[ProcInfo | ProcError] = []
        # Joined once per batch, not per PID; join(root, "") + name is join(root, name).
        prefix = os.path.join(self.root, "")
        clk_tck = self.clk_tck
        cache = self._cache
        lock = self._lock
        btime: int | None = None
        listed_ticks = math.nan  # when NVML listed, in ticks since boot; NaN: not known
        for pid in pids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                results.append(self._unreadable(f"invalid pid {pid!r}"))
                continue
            if btime is None:
                # Once per batch; while it fails, each PID tries again and counts its error.
                btime = self._boot_time()
                if btime is None:
                    results.append(ProcError.UNREADABLE)
                    continue
                if listed_at is not None:
                    listed_ticks = self.listed_ticks(listed_at, btime)
            base = f"{prefix}{pid!s}"
            first = self._stat(base)
            if isinstance(first, ProcError):
                results.append(first)
                continue
            comm, ticks = first
            start = btime + ticks / clk_tck
            # For whole ticks, ticks > x is ticks > floor(x): started in a later tick than
            # the listing (the same tick cannot tell). NaN compares false, so a bad listed_at
            # never rejects a process.
            if ticks > listed_ticks:
                results.append(ProcError.REUSED)
                continue
            with lock:
                info = cache.get(pid)
                if info is not None and info.start_time_ticks == ticks:
                    cache.move_to_end(pid)
                    # ProcInfo is frozen, so the one built last time is handed out again while
                    # nothing in it changed: building a frozen dataclass costs more than the read.
                    if info.comm != comm or info.start_time != start:
                        info = ProcInfo(
                            pid=pid,
                            start_time_ticks=ticks,
                            start_time=start,
                            comm=comm,
                            cgroup=info.cgroup,
                        )
                        cache[pid] = info
                    results.append(info)
                    continue
            results.append(self._read_uncached(pid, base, comm, ticks, start))
        return results

    def listed_ticks(self, listed_at: float, btime: int) -> float:
        """``listed_at`` (wall clock) on the boot clock, in clock ticks (not rounded)."""
        boot_clock = self._boot_clock
        wall_now = self._wall_clock()
        if boot_clock is None:
            boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
            if abs(wall_now - boot_now - btime) > BOOT_CLOCK_MATCH_SECONDS:
                boot_now = wall_now - btime  # not this machine's boot: the tree's own btime
        else:
            boot_now = boot_clock()
        return (listed_at - wall_now + boot_now) * self.clk_tck

    def _read_uncached(
        self, pid: int, base: str, comm: str, ticks: int, start: float
    ) -> ProcInfo | ProcError:
        """Read and cache the cgroup of a process whose stat was just read."""
        try:
            raw, truncated = read_bounded(f"{base}/cgroup", MAX_FILE_BYTES)
        except OSError as exc:
            if _is_gone(exc):
                return ProcError.EXITED
            return self._unreadable(f"{base}/cgroup: {exc}")
        if truncated:
            raw = raw[: raw.rfind(b"\n") + 1]
        # Read stat again: a PID reused while the cgroup file was read shows a new start time.
        second = self._stat(base)
        if isinstance(second, ProcError):
            return second
        if second[1] != ticks:
            return ProcError.REUSED
        cgroup = parse_cgroup(raw.decode("utf-8", "replace"))
        info = ProcInfo(pid=pid, start_time_ticks=ticks, start_time=start, comm=comm, cgroup=cgroup)
        self._cache_put(info)
        return info

    def _unreadable(self, why: str) -> ProcError:
        with self._lock:
            self.errors_total += 1
        self._log.fail(why)
        return ProcError.UNREADABLE

    def _stat(self, base: str) -> tuple[str, int] | ProcError:
        # Three system calls, not read_bounded's five, as this runs for every PID:
        # - One read is whole: procfs builds a stat file in a single seq_file show and one read
        #   returns all of it up to the size asked for, as a read of a local regular file does.
        # - No fstat to refuse what is not a regular file: a directory fails the read (EISDIR),
        #   a FIFO gives nothing (no writer) or EAGAIN (O_NONBLOCK), a device node an error,
        #   nothing or more than the bound: each is UNREADABLE, as the S_ISREG check made it
        #   (only a FIFO kept fed with a well-formed line now passes, as that line in a file
        #   would). Opening such a node, the step that can have side effects, came before the
        #   check too.
        path = f"{base}/stat"
        try:
            fd = os.open(path, _OPEN_FLAGS)
            try:
                raw = os.read(fd, MAX_FILE_BYTES + 1)
            finally:
                os.close(fd)
        except OSError as exc:
            if _is_gone(exc):
                return ProcError.EXITED
            return self._unreadable(f"{path}: {exc}")
        if len(raw) > MAX_FILE_BYTES:
            return self._unreadable(f"{path}: longer than {MAX_FILE_BYTES} bytes")
        try:
            return _parse_stat(raw.decode("utf-8", "replace"))
        except ValueError as exc:
            return self._unreadable(f"{path}: {exc}")

    def _boot_time(self) -> int | None:
        now = time.monotonic()
        with self._lock:
            if self._btime is not None and now - self._btime_read_at < self.btime_max_age:
                return self._btime
        path = os.path.join(self.root, "stat")
        try:
            raw, _ = read_bounded(path, MAX_PROC_STAT_BYTES)
            btime = parse_btime(raw.decode("ascii", "replace"))
        except (OSError, ValueError) as exc:
            self._unreadable(f"{path}: {exc}")
            return None
        with self._lock:
            self._btime, self._btime_read_at = btime, now
        return btime

    def _cache_put(self, info: ProcInfo) -> None:
        if self.cache_size == 0:
            return
        with self._lock:
            # Keyed by PID alone so a reused PID replaces its predecessor's entry.
            self._cache[info.pid] = info
            self._cache.move_to_end(info.pid)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
