"""The one interface every data source implements, and the one wrapper that reports on it.

As node_exporter's collectors: a source has a ``name`` (the ``source`` label value, a
contract), says whether it is ``enabled``, counts its own ``errors_total``, answers ``read``
with a :class:`ReadResult`, and has a ``close``. ``read`` and ``close`` are blocking or async as
the source's I/O is; :class:`MeasuredSource` runs a blocking read in a daemon
:class:`~enricher.worker.Worker` with a time bound, times it, counts reads abandoned there,
logs failure episodes and turns the outcome into a :class:`~enricher.model.SourceStatus`
(``dcgm_enricher_source_{up,enabled,duration_seconds,errors_total}``). :func:`close_all` is
the one close path: every source at once, each bounded.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from .episodes import EpisodeLog
from .model import SourceStatus
from .worker import Worker

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long shutdown waits for each source's close: with aiohttp's 2 s for requests in flight,
# SIGTERM ends the process well within 5 s even while an NVML call hangs.
SOURCE_CLOSE_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class ReadResult(Generic[T]):
    """What one read returned: the value (partial when not ``ok``) and why it failed. An
    empty ``error`` on failure: the source logs its own episodes (a background thread)."""

    value: T
    ok: bool = True
    error: str = ""


@runtime_checkable
class Source(Protocol):
    """One data source: upstream, nvml, procfs, kubernetes, podresources, resourceslices,
    docker."""

    name: str

    @property
    def enabled(self) -> bool: ...

    @property
    def errors_total(self) -> int: ...

    def read(self, *args: Any, **kwargs: Any) -> ReadResult[Any] | Awaitable[ReadResult[Any]]: ...

    def close(self) -> Awaitable[None] | None: ...


class SwitchedOff:
    """A source switched off: reported with enabled 0, never read."""

    enabled = False
    errors_total = 0

    def __init__(self, name: str) -> None:
        self.name = name

    def read(self, *args: Any, **kwargs: Any) -> ReadResult[None]:
        return ReadResult(None, ok=False)

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class MeasuredRead(Generic[T]):
    """One measured read: the value (``None`` when the source is off) and its status."""

    value: T
    status: SourceStatus


class MeasuredSource:
    """A source with its bookkeeping: the episode log, the reads abandoned here (busy, past
    ``timeout``, or raising: counted into errors_total on top of the source's own count) and
    the worker its blocking reads run in (None: inline, for in-memory reads)."""

    def __init__(
        self,
        source: Source,
        *,
        worker: Worker | None = None,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.worker = worker
        self.timeout = timeout
        self.abandoned_total = 0
        self._clock = clock
        self._log = EpisodeLog(source.name, log)

    @property
    def name(self) -> str:
        return self.source.name

    def status(self, up: bool, duration: float) -> SourceStatus:
        source = self.source
        return SourceStatus(
            source.name,
            up,
            duration,
            source.errors_total + self.abandoned_total,
            enabled=source.enabled,
        )

    def skip(self, value: T) -> MeasuredRead[T]:
        """Nothing to read this time (procfs with no GPU process): up, and no time spent."""
        return MeasuredRead(value, self.status(True, 0.0))

    async def read(self, *args: Any, default: T, timeout: float | None = None) -> MeasuredRead[T]:
        """Read the source once; ``default`` is the value when the read is abandoned."""
        source = self.source
        if isinstance(source, SwitchedOff):
            return MeasuredRead(default, self.status(False, 0.0))
        start = self._clock()
        limit = self.timeout if timeout is None else timeout
        try:
            reading = await self._call(args, limit)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            reading = self._abandon(default, f"timeout: no answer within {limit:g}s")
        except _Busy:
            reading = self._abandon(default, "busy: the previous read is still running")
        except Exception as exc:  # a source should not raise; a bug must not fail the scrape
            reading = self._abandon(default, f"{type(exc).__name__}: {exc}")
        if reading.ok:
            self._log.ok()
        elif reading.error:
            self._log.fail(reading.error)
        return MeasuredRead(reading.value, self.status(reading.ok, self._clock() - start))

    async def _call(self, args: tuple[Any, ...], limit: float | None) -> ReadResult[Any]:
        read = self.source.read
        if inspect.iscoroutinefunction(read):
            return await asyncio.wait_for(read(*args), limit)
        if self.worker is None:
            result = read(*args)
            assert not inspect.isawaitable(result)
            return result
        if not self.worker.idle:
            raise _Busy  # never queue a read behind one that is stuck
        result = await self.worker.run(lambda: read(*args), limit)
        assert not inspect.isawaitable(result)
        return result

    def _abandon(self, default: T, error: str) -> ReadResult[T]:
        self.abandoned_total += 1
        return ReadResult(default, ok=False, error=error)


class _Busy(Exception):
    pass


async def close_source(source: Source, timeout: float = SOURCE_CLOSE_TIMEOUT) -> bool:
    """Close one source, waiting at most ``timeout`` seconds. A blocking close runs in a daemon
    thread (NVML's waits for a read in flight): a hung call must not outlive the kubelet's
    grace period. False when it did not finish in time or raised."""
    closer: Worker | None = None
    try:
        if inspect.iscoroutinefunction(source.close):
            await asyncio.wait_for(source.close(), timeout)
        else:
            closer = Worker(f"enricher-{source.name}-close")
            await closer.run(source.close, timeout)
    except asyncio.TimeoutError:  # not the builtin before Python 3.11
        log.warning(
            "%s: shutdown did not finish within %gs (a call hangs); exiting", source.name, timeout
        )
        return False
    except Exception as exc:
        log.warning("%s: shutdown failed: %s: %s", source.name, type(exc).__name__, exc)
        return False
    finally:
        if closer is not None:
            closer.close()
    return True


async def close_all(sources: Iterable[Source], timeout: float = SOURCE_CLOSE_TIMEOUT) -> bool:
    """Close every source at once, each bounded by ``timeout``: the one close path."""
    done = await asyncio.gather(*(close_source(s, timeout) for s in sources))
    return all(done)
