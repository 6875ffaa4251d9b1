"""Clocks for the sources and loops that take one (``clock=``): one that stands still until
moved, and one that runs behind the real clock until it catches up."""

from __future__ import annotations

import time


class Clock:
    """A clock that stands still until a test moves ``now``: caches and timers age only when
    told to (request timeouts stay on the real event loop's clock)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MovingClock:
    """The real clock, ``behind`` seconds late until ``catch_up()``: a simulated node whose
    history a test writes in the past, then the real clock (the one Prometheus's ``time()``
    reads)."""

    def __init__(self, behind: float) -> None:
        self.offset = -behind

    def __call__(self) -> float:
        return time.time() + self.offset

    def catch_up(self) -> None:
        self.offset = 0.0
