"""A settable clock for the sources and loops that take one (``clock=``)."""

from __future__ import annotations


class Clock:
    """A clock that stands still until a test moves ``now``: caches and timers age only when
    told to (request timeouts stay on the real event loop's clock)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
