"""Background refresh: keep the newest result of a collection ready, off the scrape path.

A scrape that had to read NVML, procfs and the kubelet itself would wait for all three (and,
under the GIL, the event loop would too). A :class:`Refresher` runs the collection in the
background every ``interval`` seconds and hands the newest result to whoever asks, so a scrape
only fetches and rewrites the upstream. A :class:`Follower` goes one step further for the
upstream: it fetches dcgm-exporter right after each of its collections (learning their
rhythm from when the body changes), so a scrape waits for nothing at all.

Freshness is bounded, never assumed: :meth:`Refresher.get` returns the newest result only
while it is at most ``max_age`` old (counted from when its collection started); older than
that, because the loop fell behind or the collection failed, the caller waits for a new one.
The default ``max_age`` is the interval plus the time the last collection took plus a tenth
of the interval as slack, so a healthy loop never makes a scrape wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .episodes import EpisodeLog

log = logging.getLogger(__name__)

T = TypeVar("T")


class Refresher(Generic[T]):
    """Runs ``collect`` now and then every ``interval`` seconds; :meth:`get` returns the newest.
    With ``interval`` None there is no loop: something else calls :meth:`refresh` when a new
    result is due, and :meth:`get` collects itself once the newest is older than ``max_age``.

    One collection runs at a time: a :meth:`get` that finds the result too old joins the run in
    flight (or starts one) instead of starting another. A collection that raises keeps the
    previous result (until it is too old) and counts in ``errors``.
    """

    def __init__(
        self,
        collect: Callable[[], Awaitable[T]],
        interval: float | None,
        *,
        max_age: float | Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "refresh",
    ) -> None:
        """``max_age`` may be a function, asked on every :meth:`get` (for a bound that is
        learnt while running, such as the upstream's collection interval); without a loop
        (``interval`` None) it is required."""
        if interval is not None and not interval > 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        if interval is None and max_age is None:
            raise ValueError("without an interval, max_age is required")
        if max_age is not None and not callable(max_age) and not max_age > 0:
            raise ValueError(f"max_age must be positive, got {max_age!r}")
        self._collect = collect
        self.interval = None if interval is None else float(interval)
        self._max_age = max_age
        self._clock = clock
        self.name = name
        self._latest: T | None = None
        self._started_at = 0.0  # when the collection behind _latest started
        self._last_duration = 0.0
        self._inflight: asyncio.Task[T] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.runs = 0
        self.errors = 0
        # The loop's failures, by episode (enricher.episodes, as every source logs them).
        self._episodes = EpisodeLog(name, log)

    @property
    def last_duration(self) -> float:
        """How long the newest collection took."""
        return self._last_duration

    @property
    def max_age(self) -> float:
        """How old a result may be and still be served."""
        if callable(self._max_age):
            return self._max_age()
        if self._max_age is not None:
            return self._max_age
        assert self.interval is not None  # __init__ requires max_age without an interval
        return self.interval * 1.1 + self._last_duration

    def age(self) -> float | None:
        """Seconds since the newest result's collection started; None before the first."""
        if self._latest is None:
            return None
        return self._clock() - self._started_at

    def start(self) -> None:
        """Start the background loop (in the running event loop); a no-op while it runs, and
        without an interval."""
        if self.interval is None:
            return
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(
                self._run(), name=f"{self.name}-loop"
            )

    async def close(self) -> None:
        """Stop the loop and any collection in flight."""
        for task in (self._loop_task, self._inflight):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._loop_task = self._inflight = None

    async def get(self) -> T:
        """The newest result if it is at most ``max_age`` old, else a new one (waited for)."""
        latest = self._latest
        if latest is not None and self._clock() - self._started_at <= self.max_age:
            return latest
        return await self.refresh()

    async def refresh(self) -> T:
        """Collect now, or join the collection in flight. Raises what the collection raises."""
        task = self._inflight
        if task is None or task.done():
            task = self._inflight = asyncio.get_running_loop().create_task(
                self._collect_once(), name=f"{self.name}-collect"
            )
        # A caller that gives up (a cancelled scrape) must not cancel the shared collection.
        return await asyncio.shield(task)

    async def _collect_once(self) -> T:
        started = self._clock()
        self.runs += 1
        try:
            result = await self._collect()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.errors += 1
            raise
        self._latest, self._started_at = result, started
        self._last_duration = self._clock() - started
        return result

    async def _run(self) -> None:
        interval = self.interval
        if interval is None:  # start() runs no loop without an interval
            return
        while True:
            started = self._clock()
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Logged once per episode; get() keeps serving the last result until it is
                # too old, then waits for (and raises from) a collection of its own.
                self._episodes.fail(f"collection failed: {exc or type(exc).__name__}")
            else:
                self._episodes.ok()
            elapsed = self._clock() - started
            await asyncio.sleep(max(0.0, interval - elapsed))


# --------------------------------------------------------------------------- following


# In steady state the first poll of a collection comes this many steps before the earliest
# moment the collection can be due, so that a learnt interval a little too long (or a
# collection a little early) does not make the first poll the one that sees it.
LEAD_STEPS = 0.25
# How long past the latest moment a collection was due the follower keeps polling every step
# (this many steps, or WINDOW_RATIO of the interval if that is more) before it counts the
# rhythm as lost and falls back to a poll every ``coarse``.
WINDOW_STEPS = 5.0
# The most the lead grows to after collections came earlier than the first poll for them.
MAX_LEAD_STEPS = 2.0
WINDOW_RATIO = 0.02
# Gaps between precise changes kept for the interval (their average over collections).
GAPS_KEPT = 8


def follow_delay(
    now: float,
    polled_at: float,
    last_change: float | None,
    precise: bool,
    interval: float | None,
    *,
    step: float,
    coarse: float,
    learn_limit: float,
    rough: float | None = None,
    before_change: float | None = None,
    lead: float | None = None,
) -> float:
    """Seconds from ``now`` until the next poll of a source that changes once per collection
    (pure). Polls are spaced from the start of the last one (``polled_at``).

    ``last_change`` is when a poll last saw new content and ``before_change`` when the poll
    before it started (the change happened between the two); ``precise`` says whether that
    poll came right after the one before (so the change is known to within a step);
    ``interval`` is the collection interval learnt from the gaps between precise changes
    (None until there is one); ``rough`` the gap between changes seen with any precision
    (None until two changes were seen); ``lead`` how long before the earliest moment the next
    change can come the first poll for it goes (default: a quarter step; the follower widens
    it when a collection came earlier than that, and narrows it again).

    * Nothing seen yet: every ``coarse``.
    * The rhythm learnt (``precise`` and ``interval``): a source that changes on (nearly)
      every poll, every ``step``. Otherwise the next change is due between
      ``before_change + interval`` and ``last_change + interval``: one poll ``lead``
      before that window opens, then every ``step`` until the change shows, so it is seen at
      most a step after it happened and usually by the second poll (two requests per
      collection). No change by a window (five steps, or 2 % of the interval) after it was
      due: the rhythm is lost, every ``coarse``.
    * The interval known but the last change seen late (a coarse poll, or the first poll of a
      window): the change happened at most a coarse poll (or twice the lead and a step)
      before it was seen; one poll every ``coarse``, and every ``step`` from then plus the
      interval (less the lead) until a window after the next change is due; only ``coarse``
      once ``learn_limit`` seconds passed without a change.
    * Learning (no interval yet): every ``coarse``, and every ``step`` from two coarse polls
      before the next change is due (by ``rough``) until two coarse polls after it, so that it
      is seen within a step; only ``coarse`` while the gap is unknown and once
      ``learn_limit`` seconds have passed without a change.
    """
    fine = max(0.0, polled_at + step - now)
    slow = max(0.0, polled_at + coarse - now)
    if last_change is None:
        return slow
    since = now - last_change
    lead = LEAD_STEPS * step if lead is None else lead
    if interval is not None:
        if precise and interval < 2 * step:
            return fine
        window = max(WINDOW_STEPS * step, WINDOW_RATIO * interval)
        closes = last_change + interval + window
        if precise:
            lower = before_change if before_change is not None else last_change - step
            due = max(lower + interval - lead, last_change + 0.5 * interval)
            if now < due:
                return due - now
            return fine if now <= closes else slow
        if since > learn_limit:
            return slow
        lower = max(
            last_change - coarse,
            last_change - 2 * lead - step,
            before_change if before_change is not None else last_change - coarse,
        )
        opens = lower + interval - lead
        if now < opens:
            return min(opens - now, slow)
        return fine if now <= closes else slow
    if rough is None or since > learn_limit:
        return slow
    # Either change may have been seen up to a coarse poll after it happened.
    opens, closes = last_change + rough - 2 * coarse, last_change + rough + 2 * coarse
    if now < opens:
        return min(opens - now, slow)
    return fine if now <= closes else slow


class Follower(Generic[T]):
    """Polls a source right after each of its collections and keeps the newest answer.

    dcgm-exporter serves the same body between two collections. The follower learns the
    collection interval from when the answer changes (polling every ``step`` until it has
    seen two changes to within a step; the average over the last gaps between such changes,
    each counted in collections, so a collection that changed nothing does not stretch it and
    the estimate sharpens with every collection) and then polls right before the next
    collection is due and every ``step`` after it until it shows (see :func:`follow_delay`):
    once the rhythm is learnt, what it holds is at most ``step`` (plus one poll) behind the
    source, for about two requests per collection.
    ``key`` says what of an answer counts as its content (default: all of it);
    ``on_change`` runs after a poll that brought new content (to prepare the next scrapes'
    work). ``poll`` should not raise; if it does, the error is counted and logged and the
    previous answer kept. :meth:`latest` never returns an answer older than twice the
    longer of ``coarse`` and the interval: it polls itself if the loop fell that far behind.
    A change seen late at a moment the learnt interval cannot explain (the source restarted
    with another interval) makes it learn the interval again.
    """

    def __init__(
        self,
        poll: Callable[[], Awaitable[T]],
        *,
        step: float = 0.1,
        coarse: float = 1.0,
        learn_limit: float = 120.0,
        key: Callable[[T], object] | None = None,
        on_change: Callable[[T], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "follow",
    ) -> None:
        if not (step > 0 and coarse >= step):
            raise ValueError(f"need 0 < step <= coarse, got step={step!r} coarse={coarse!r}")
        self._poll = poll
        self.step = float(step)
        self.coarse = float(coarse)
        self.learn_limit = float(learn_limit)
        self._key = key
        self._on_change = on_change
        self._clock = clock
        self.name = name
        self._latest: tuple[T, float] | None = None  # (answer, when its poll started)
        self._content: object = None
        self.last_change: float | None = None
        self.precise = False  # the last change is known to within a step
        self.before_change: float | None = None  # when the poll before the last change began
        self.lead = LEAD_STEPS * self.step  # see follow_delay
        self._previous_poll: float | None = None
        self._last_duration = 0.0
        self._gaps: list[float] = []  # between two precise changes
        self._rough_gaps: list[float] = []  # between any two changes (not the first answer)
        self._task: asyncio.Task[None] | None = None
        self._polling: asyncio.Task[bool] | None = None
        self.polls = 0
        self.changes = 0
        self.errors = 0
        # Failed polls and failed preparations, each by episode (enricher.episodes).
        self._poll_episodes = EpisodeLog(name, log)
        self._prepare_episodes = EpisodeLog(f"{name} on_change", log)

    @property
    def interval(self) -> float | None:
        """The learnt collection interval (None until two precise changes were seen): the
        recent gaps between precise changes over the collections they span (a gap of about
        twice the shortest spans two), so each gap's error of up to a step is divided by the
        number of collections."""
        if not self._gaps:
            return None
        shortest = min(self._gaps)
        if shortest <= 0:
            return shortest
        spans = sum(max(1, round(gap / shortest)) for gap in self._gaps)
        return sum(self._gaps) / spans

    @property
    def rough_interval(self) -> float | None:
        """The gap between changes seen with any precision (None until two were seen)."""
        return min(self._rough_gaps) if self._rough_gaps else None

    @property
    def max_age(self) -> float:
        return 2.0 * max(self.coarse, self.interval or 0.0)

    def start(self) -> None:
        """Start polling (in the running event loop); a no-op while it runs."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"{self.name}-loop"
            )

    async def close(self) -> None:
        for task in (self._task, self._polling):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._polling = None

    async def latest(self) -> tuple[T, float]:
        """The newest answer and the clock time its poll started (polls if there is none, or
        if it is older than :attr:`max_age`)."""
        latest = self._latest
        if latest is None or self._clock() - latest[1] > self.max_age:
            await self.poll_once()
            latest = self._latest
            if latest is None:
                raise RuntimeError(f"{self.name}: no answer from the source")
        return latest

    async def poll_once(self) -> bool:
        """Poll now, or join the poll in flight; True when the content changed."""
        task = self._polling
        if task is None or task.done():
            task = self._polling = asyncio.get_running_loop().create_task(self._poll_once())
        return await asyncio.shield(task)

    async def _poll_once(self) -> bool:
        self.polls += 1
        started = self._clock()
        try:
            answer = await self._poll()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors += 1
            self._poll_episodes.fail(f"poll failed: {exc or type(exc).__name__}")
            return False
        self._poll_episodes.ok()
        content = answer if self._key is None else self._key(answer)
        changed = self._latest is None or content != self._content
        previous, self._previous_poll = self._previous_poll, started
        took, self._last_duration = self._last_duration, self._clock() - started
        if changed:
            self.changes += 1
            # Right after the previous poll: a step later, or at once if polls take longer.
            precise = previous is not None and started - previous <= 1.5 * max(self.step, took)
            if precise and self.precise and self.last_change is not None:
                self._gaps = [*self._gaps[-(GAPS_KEPT - 1) :], started - self.last_change]
            if self.last_change is not None and self.changes > 2:  # not from the first answer
                gap = started - self.last_change
                self._rough_gaps = [*self._rough_gaps[-4:], gap]
                earliest = (previous if previous is not None else started) - self.last_change
                if not precise and not self._fits(earliest, gap):
                    self._gaps = []  # another rhythm: learn it again
            if self.interval is not None:
                # Seen late although the rhythm was known: the collection came earlier than
                # the first poll for it, so go earlier; narrow again while they are on time.
                self.lead = (
                    min(2 * self.lead, MAX_LEAD_STEPS * self.step)
                    if not precise
                    else max(LEAD_STEPS * self.step, 0.9 * self.lead)
                )
            self.last_change, self.precise = started, precise
            self.before_change = previous
            # The new answer is published once what depends on it is prepared, so a reader
            # sees the previous answer with the previous preparation, or both new.
            if self._on_change is not None:
                try:
                    await self._on_change(answer)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # preparing is an optimisation: never stop polling
                    self._prepare_episodes.fail(f"failed: {exc or type(exc).__name__}")
                else:
                    self._prepare_episodes.ok()
        self._latest, self._content = (answer, started), content
        return changed

    def _fits(self, earliest: float, latest: float) -> bool:
        """Whether a change seen late, made between ``earliest`` and ``latest`` seconds after
        the change before it (that one known to a step), fits the learnt interval: a whole
        number of collections in between."""
        interval = self.interval
        if interval is None or interval <= 0:
            return True
        lo, hi = earliest - self.step, latest + self.step
        return math.floor(hi / interval) >= max(1, math.ceil(lo / interval))

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            delay = follow_delay(
                self._clock(),
                self._previous_poll or 0.0,
                self.last_change,
                self.precise,
                self.interval,
                step=self.step,
                coarse=self.coarse,
                learn_limit=self.learn_limit,
                rough=self.rough_interval,
                before_change=self.before_change,
                lead=self.lead,
            )
            await asyncio.sleep(delay)
