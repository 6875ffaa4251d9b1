"""One daemon thread that runs blocking calls in order, off the event loop.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, so
one NVML call that never returns (a wedged driver) would keep the process alive until the
kubelet's SIGKILL. A :class:`Worker`'s thread is a daemon that nobody joins: at shutdown a
caller waits for it only as long as it chooses (:meth:`Worker.run` with a timeout), and the
process exits even while a call is stuck in C.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Future[Any], Callable[[], Any]]


class Worker:
    """Runs submitted calls one at a time, in submission order, in one daemon thread
    (started on the first call)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._last: Future[Any] | None = None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; the future holds its result or exception. Raises RuntimeError after
        :meth:`close`."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._jobs.put((future, fn))
            self._last = future
        return future

    async def run(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` in the thread and wait for it (at most ``timeout`` seconds: then raises
        asyncio.TimeoutError and the call goes on, its result dropped). Cancelling the caller never
        cancels a call that has started."""
        future = self.submit(fn)
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)

    @property
    def idle(self) -> bool:
        """True when every call submitted so far has finished."""
        last = self._last
        return last is None or last.done()

    def close(self) -> None:
        """Refuse new calls and cancel the queued ones; a call that is running finishes (or
        hangs) on its own, and nothing waits for it."""
        with self._lock:
            self._closed = True
            self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            future, fn = job
            if self._closed:
                future.cancel()
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # handed to the waiter, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)
        # Calls queued after the sentinel (none: submit refuses them once closed).
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job[0].cancel()
