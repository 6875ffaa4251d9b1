"""The background refresher: freshness bound, one collection at a time, failures, shutdown.

Time is a fake clock wherever freshness is decided, so nothing here depends on how fast the
machine is; the one test of the background loop waits for events, not for durations.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from devkit.clocks import Clock
from enricher.refresh import Follower, Refresher, follow_delay


class Collect:
    """A collection that returns 1, 2, 3, ... and can be made slow, or to fail, on demand."""

    def __init__(self, clock: Clock, takes: float = 0.0) -> None:
        self.clock = clock
        self.takes = takes  # fake seconds one collection takes
        self.calls = 0
        self.gate: asyncio.Event | None = None  # when set: wait for it before answering
        self.fail: Exception | None = None

    async def __call__(self) -> int:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        self.clock.now += self.takes
        if self.fail is not None:
            raise self.fail
        return self.calls


@pytest.mark.parametrize(
    ("interval", "max_age"),
    [
        pytest.param(0.0, None, id="zero-interval"),
        pytest.param(-1.0, None, id="negative-interval"),
        pytest.param(float("nan"), None, id="nan-interval"),
        pytest.param(1.0, 0.0, id="zero-max-age"),
        pytest.param(None, None, id="no-interval-no-max-age"),
    ],
)
def test_rejects_bad_settings(interval: float | None, max_age: float | None) -> None:
    clock = Clock()
    with pytest.raises(ValueError):
        Refresher(Collect(clock), interval, max_age=max_age, clock=clock)


async def test_serves_the_newest_result_while_it_is_fresh() -> None:
    clock = Clock()
    collect = Collect(clock)
    r = Refresher(collect, 10.0, clock=clock)
    assert r.age() is None
    assert await r.get() == 1  # nothing yet: the first caller waits for a collection
    clock.now += 10.9
    assert await r.get() == 1  # within interval * 1.1: no new collection
    assert collect.calls == 1
    clock.now += 0.2
    assert await r.get() == 2  # too old: a new collection, waited for
    assert r.age() == 0.0


async def test_without_an_interval_it_collects_when_asked_or_too_old() -> None:
    """The aligned node side: no loop; refresh() when a collection is due, and get() collects
    itself only once the newest is older than max_age (here a bound learnt at run time)."""
    clock = Clock()
    collect = Collect(clock)
    bound = [5.0]
    r = Refresher(collect, None, max_age=lambda: bound[0], clock=clock)
    r.start()  # no loop to start
    await asyncio.sleep(0)
    assert collect.calls == 0
    assert await r.refresh() == 1
    clock.now += 5.0
    assert await r.get() == 1
    bound[0] = 2.0
    assert await r.get() == 2  # the bound shrank: too old now
    assert collect.calls == 2


async def test_a_slow_collection_widens_the_bound_by_its_duration() -> None:
    """Age counts from when a collection started, so the bound allows for its duration."""
    clock = Clock()
    r = Refresher(Collect(clock, takes=3.0), 10.0, clock=clock)
    await r.get()
    assert r.age() == 3.0
    assert r.max_age == pytest.approx(14.0)
    clock.now += 10.9  # age 13.9
    assert await r.get() == 1
    clock.now += 0.2  # age 14.1
    assert await r.get() == 2


async def test_explicit_max_age_is_the_bound() -> None:
    clock = Clock()
    r = Refresher(Collect(clock), 10.0, max_age=2.0, clock=clock)
    await r.get()
    clock.now += 2.0
    assert await r.get() == 1
    clock.now += 0.1
    assert await r.get() == 2


async def test_concurrent_callers_share_one_collection() -> None:
    clock = Clock()
    collect = Collect(clock)
    collect.gate = asyncio.Event()
    r = Refresher(collect, 10.0, clock=clock)
    waiters = [asyncio.create_task(r.get()) for _ in range(3)]
    await asyncio.sleep(0)
    collect.gate.set()
    assert await asyncio.gather(*waiters) == [1, 1, 1]
    assert collect.calls == 1


async def test_a_cancelled_caller_does_not_cancel_the_collection() -> None:
    """A scrape whose client went away must not abort the read the next scrape needs."""
    clock = Clock()
    collect = Collect(clock)
    collect.gate = asyncio.Event()
    r = Refresher(collect, 10.0, clock=clock)
    first = asyncio.create_task(r.get())
    await asyncio.sleep(0)
    first.cancel()
    second = asyncio.create_task(r.get())
    await asyncio.sleep(0)
    collect.gate.set()
    assert await second == 1
    assert collect.calls == 1
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_failures_keep_the_last_result_until_it_is_too_old() -> None:
    clock = Clock()
    collect = Collect(clock)
    r = Refresher(collect, 10.0, clock=clock)
    assert await r.get() == 1
    collect.fail = RuntimeError("nvml went away")
    with pytest.raises(RuntimeError):
        await r.refresh()
    assert r.errors == 1
    assert await r.get() == 1  # still fresh enough: served
    clock.now += 20.0
    with pytest.raises(RuntimeError, match="nvml went away"):
        await r.get()  # too old: never served stale, the failure shows
    collect.fail = None
    assert await r.get() == 4


async def test_first_collection_failing_raises_to_the_caller() -> None:
    clock = Clock()
    collect = Collect(clock)
    collect.fail = OSError("no /proc")
    r = Refresher(collect, 10.0, clock=clock)
    with pytest.raises(OSError):
        await r.get()
    assert r.age() is None


async def test_background_loop_keeps_collecting_and_stops_on_close() -> None:
    third = asyncio.Event()
    runs = 0

    async def collect() -> int:
        nonlocal runs
        runs += 1
        if runs == 3:
            third.set()
        return runs

    r = Refresher(collect, 0.001)
    r.start()
    r.start()  # a second start is a no-op: still one loop
    await asyncio.wait_for(third.wait(), 10)
    await r.close()
    stopped_at = runs
    await asyncio.sleep(0.01)
    assert runs == stopped_at
    assert r.runs == runs


async def test_background_loop_survives_a_failing_collection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recovered = asyncio.Event()
    runs = 0

    async def collect() -> int:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("transient")
        recovered.set()
        return runs

    r = Refresher(collect, 0.001, name="node")
    r.start()
    await asyncio.wait_for(recovered.wait(), 10)
    await r.close()
    assert r.errors == 1
    assert "node: collection failed: transient" in caplog.text
    assert await Refresher(collect, 1.0).get() >= 2


def _episode_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[str, str]]:
    """(level, message) of each record of ``name`` (``<name>: ...``), in order."""
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith(name + ": ")
    ]


async def test_loop_failures_are_logged_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As every source logs (enricher.episodes): an episode's first failure at WARNING, its
    repeats at DEBUG, the recovery at INFO, and the next failure begins a new episode."""
    caplog.set_level(logging.DEBUG)
    outcomes = iter(["down", "down", "down", "up", "up", "down"])
    done = asyncio.Event()

    async def collect() -> int:
        outcome = next(outcomes, None)
        if outcome is None:
            done.set()
            await asyncio.Event().wait()  # the test closes the refresher now
        if outcome == "down":
            raise RuntimeError("transient")
        return 1

    r = Refresher(collect, 0.001, name="node")
    r.start()
    await asyncio.wait_for(done.wait(), 10)
    await r.close()
    failed = "node: collection failed: transient"
    assert _episode_lines(caplog, "node") == [
        ("WARNING", failed),
        ("DEBUG", failed),
        ("DEBUG", failed),
        ("INFO", "node: recovered"),
        ("WARNING", failed),
    ]


async def test_follower_failures_are_logged_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Polls and preparations (on_change) each by episode, apart: a failing preparation does
    not end the episode of failing polls, nor the other way round."""
    caplog.set_level(logging.DEBUG)
    clock, source = Clock(), Source()

    async def prepare(answer: tuple[str, float]) -> None:
        if answer[0].startswith("bad"):
            raise ValueError("cannot prepare")

    f = follower(clock, source, on_change=prepare, name="follow")
    source.fail = RuntimeError("connection refused")
    for _ in range(3):
        await f.poll_once()
    source.fail = None
    for content in ("bad-1", "bad-2", "good", "good", "bad-3"):
        source.content = content
        await f.poll_once()
    poll_failed = "follow: poll failed: connection refused"
    assert _episode_lines(caplog, "follow") == [
        ("WARNING", poll_failed),
        ("DEBUG", poll_failed),
        ("DEBUG", poll_failed),
        ("INFO", "follow: recovered"),
    ]
    prepare_failed = "follow on_change: failed: cannot prepare"
    assert _episode_lines(caplog, "follow on_change") == [
        ("WARNING", prepare_failed),
        ("DEBUG", prepare_failed),
        ("INFO", "follow on_change: recovered"),
        ("WARNING", prepare_failed),
    ]


# --------------------------------------------------------------------------- following

STEP, COARSE, LEARN = 0.1, 1.0, 120.0


@pytest.mark.parametrize(
    ("now", "polled_at", "last_change", "precise", "interval", "rough", "delay"),
    [
        pytest.param(10.0, 9.8, None, False, None, None, 0.8, id="nothing-yet-coarse"),
        pytest.param(10.0, 9.95, 9.95, False, None, None, 0.95, id="late-change-no-gap-coarse"),
        pytest.param(10.0, 9.95, 9.95, True, None, None, 0.95, id="no-gap-yet-coarse"),
        pytest.param(200.0, 199.95, 70.0, False, None, None, 0.95, id="learning-gave-up-coarse"),
        pytest.param(10.0, 9.95, 9.95, True, 0.15, None, 0.05, id="changes-every-poll-fine"),
        # Due between 9.8 + 30 and 9.9 + 30: first poll a quarter step before.
        pytest.param(10.0, 9.9, 9.9, True, 30.0, None, 29.775, id="sleep-until-due"),
        pytest.param(39.5, 39.45, 10.0, True, 30.0, None, 0.375, id="first-poll-when-due"),
        pytest.param(39.9, 39.875, 10.0, True, 30.0, None, 0.075, id="then-every-step"),
        pytest.param(40.55, 40.5, 10.0, True, 30.0, None, 0.05, id="window-still-open"),
        pytest.param(40.7, 40.65, 10.0, True, 30.0, None, 0.95, id="window-closed-coarse"),
        pytest.param(10.0, 9.9, 9.9, True, 0.3, None, 0.075, id="short-interval"),
        pytest.param(10.0, 9.9, 9.9, True, 2.0, None, 1.775, id="sleep-until-due-2s"),
        pytest.param(71.0, 70.9, 10.0, True, 30.0, None, 0.9, id="rhythm-lost-coarse"),
        pytest.param(10.0, 9.0, 9.95, False, None, None, 0.0, id="never-negative"),
        # A rough gap of 30 s (changes seen by coarse polls): the next is due at 40 +- 2 s.
        pytest.param(11.0, 11.0, 10.0, False, None, 30.0, 1.0, id="before-window-coarse"),
        pytest.param(37.5, 37.5, 10.0, False, None, 30.0, 0.5, id="until-window-opens"),
        pytest.param(38.0, 38.0, 10.0, False, None, 30.0, 0.1, id="window-fine"),
        pytest.param(41.9, 41.9, 10.0, True, None, 30.0, 0.1, id="window-precise-no-interval"),
        pytest.param(42.5, 42.5, 10.0, False, None, 30.0, 1.0, id="after-window-coarse"),
        # The rhythm was lost and a change came late: its learnt interval gives the window,
        # from a coarse poll before the change was seen.
        pytest.param(38.5, 38.5, 10.0, False, 30.0, 5.0, 1.0, id="interval-beats-rough"),
        pytest.param(39.9, 39.85, 10.0, False, 30.0, 5.0, 0.05, id="late-change-window"),
        pytest.param(41.0, 40.98, 10.0, False, 30.0, None, 0.98, id="late-window-closed"),
        pytest.param(131.0, 130.5, 10.0, False, 30.0, None, 0.5, id="late-past-learn-limit"),
        pytest.param(130.5, 130.5, 10.0, False, None, 120.0, 1.0, id="past-learn-limit"),
        pytest.param(10.0, 9.95, 9.95, False, None, 0.5, 0.05, id="every-poll-changes-fine"),
    ],
)
def test_follow_delay(
    now: float,
    polled_at: float,
    last_change: float | None,
    precise: bool,
    interval: float | None,
    rough: float | None,
    delay: float,
) -> None:
    got = follow_delay(
        now,
        polled_at,
        last_change,
        precise,
        interval,
        step=STEP,
        coarse=COARSE,
        learn_limit=LEARN,
        rough=rough,
    )
    assert got == pytest.approx(delay)


class Source:
    """An upstream whose content the test changes; polls take no time on the fake clock."""

    def __init__(self) -> None:
        self.content = "collection-0"
        self.fail: Exception | None = None

    async def __call__(self) -> tuple[str, float]:
        if self.fail is not None:
            raise self.fail
        return self.content, 0.001  # (text, fetch duration): only the text is content


def follower(clock: Clock, source: Source, **kwargs: object) -> Follower[tuple[str, float]]:
    return Follower(
        source,
        step=STEP,
        coarse=COARSE,
        key=lambda answer: answer[0],
        clock=clock,
        **kwargs,  # type: ignore[arg-type]
    )


async def poll_at(f: Follower[tuple[str, float]], clock: Clock, at: float) -> bool:
    clock.now = at
    return await f.poll_once()


async def test_follower_learns_the_interval_from_precise_changes_only() -> None:
    clock, source = Clock(), Source()
    f = follower(clock, source)
    assert await poll_at(f, clock, 0.0)  # the first answer: new, but not known to a step
    assert not f.precise
    source.content = "collection-1"
    assert await poll_at(f, clock, 0.9)  # seen a coarse poll late: when it changed is unknown
    assert not f.precise and f.interval is None
    assert not await poll_at(f, clock, 1.0)
    source.content = "collection-2"
    assert await poll_at(f, clock, 1.1)  # a step after the last poll: precise
    assert f.precise and f.interval is None  # one precise change is no gap yet
    for t in (1.2, 1.3, 1.4, 10.9, 11.0):
        assert not await poll_at(f, clock, t)
    source.content = "collection-3"
    assert await poll_at(f, clock, 11.1)
    assert f.interval == pytest.approx(10.0)
    # Late again (the rhythm was lost, the collection seen by a coarse poll), but 3
    # collections after the last: no gap, and the interval stays.
    assert not await poll_at(f, clock, 40.5)
    source.content = "collection-4"
    assert await poll_at(f, clock, 41.5)
    assert not f.precise and f.interval == pytest.approx(10.0)
    # Seen 15 s after the last change, and not before 14 s: no whole number of intervals
    # fits, so the source changed its rhythm and the interval is learnt again.
    assert not await poll_at(f, clock, 55.5)
    source.content = "collection-5"
    assert await poll_at(f, clock, 56.5)
    assert f.interval is None
    assert f.changes == 6


async def test_follower_keeps_the_shortest_recent_gap() -> None:
    """A collection that changed nothing doubles one gap; the interval is not stretched."""
    clock, source = Clock(), Source()
    f = follower(clock, source)
    t = 0.0
    for i, gap in enumerate([10.0, 10.0, 20.0, 10.0]):
        await poll_at(f, clock, t - STEP)
        source.content = f"c{i}"
        await poll_at(f, clock, t)
        t += gap
    assert f.interval == pytest.approx(10.0)


async def test_latest_polls_when_there_is_nothing_or_it_is_too_old() -> None:
    clock, source = Clock(), Source()
    f = follower(clock, source)
    assert (await f.latest())[0] == ("collection-0", 0.001)
    assert f.polls == 1
    await f.latest()
    assert f.polls == 1  # young enough: no poll
    clock.now += 2 * COARSE + 0.1
    source.content = "collection-1"
    assert (await f.latest())[0][0] == "collection-1"
    assert f.polls == 2


async def test_poll_failure_keeps_the_previous_answer(caplog: pytest.LogCaptureFixture) -> None:
    clock, source = Clock(), Source()
    f = follower(clock, source)
    await f.poll_once()
    source.fail = RuntimeError("connection refused")
    assert not await f.poll_once()
    assert f.errors == 1
    assert (await f.latest())[0][0] == "collection-0"
    assert "connection refused" in caplog.text


async def test_on_change_runs_once_per_new_content_and_may_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, source = Clock(), Source()
    seen: list[str] = []

    async def prepare(answer: tuple[str, float]) -> None:
        seen.append(answer[0])
        if answer[0] == "bad":
            raise ValueError("cannot prepare")

    f = follower(clock, source, on_change=prepare)
    await f.poll_once()
    await f.poll_once()
    source.content = "bad"
    await f.poll_once()
    source.content = "good"
    await f.poll_once()
    assert seen == ["collection-0", "bad", "good"]
    assert "cannot prepare" in caplog.text


async def test_follower_loop_polls_until_closed() -> None:
    changed = asyncio.Event()
    count = 0

    async def poll() -> int:
        nonlocal count
        count += 1
        if count == 5:
            changed.set()
        return count // 2

    f = Follower(poll, step=0.001, coarse=0.001)
    f.start()
    await asyncio.wait_for(changed.wait(), 10)
    await f.close()
    stopped = count
    await asyncio.sleep(0.01)
    assert count == stopped
    assert f.changes >= 2


@pytest.mark.parametrize(
    ("step", "coarse"),
    [
        pytest.param(0.0, 1.0, id="zero-step"),
        pytest.param(2.0, 1.0, id="coarse-below-step"),
        pytest.param(float("nan"), 1.0, id="nan-step"),
    ],
)
def test_follower_rejects_bad_settings(step: float, coarse: float) -> None:
    async def poll() -> int:
        return 0

    with pytest.raises(ValueError):
        Follower(poll, step=step, coarse=coarse)


@dataclass
class Run:
    """What a simulated run of the real Follower did: when it polled, and for each collection
    it saw, how long after the collection it was seen."""

    polls: list[float]
    late: list[tuple[int, float]]  # (collection, seconds after it was made)
    follower: Follower[int]


async def simulate(
    monkeypatch: pytest.MonkeyPatch,
    made: Callable[[int], float],
    *,
    until: float,
    step: float = 0.1,
    took: float = 0.0,
) -> Run:
    """Run the real Follower against a source whose collection ``n`` is made at ``made(n)``
    (increasing), on a fake clock: sleeping moves it, a poll takes ``took`` of it."""
    clock = [0.0]
    polls: list[float] = []
    late: list[tuple[int, float]] = []

    async def poll() -> int:
        now = clock[0]
        polls.append(now)
        n = 0
        while made(n + 1) <= now:
            n += 1
        clock[0] += took
        return n

    async def on_change(collection: int) -> None:
        late.append((collection, polls[-1] - made(collection)))

    done = asyncio.Event()
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float) -> None:
        clock[0] += delay
        if clock[0] >= until:
            done.set()
            await real_sleep(3600)
        await real_sleep(0)

    monkeypatch.setattr("enricher.refresh.asyncio.sleep", fake_sleep)
    follower = Follower(poll, step=step, on_change=on_change, clock=lambda: clock[0])
    follower.start()
    await asyncio.wait_for(done.wait(), 60)
    await follower.close()
    return Run(polls, late, follower)


def jittered(
    interval: float, offset: float, jitter: float, seed: int = 7
) -> Callable[[int], float]:
    """Collections every ``interval`` from ``offset``, each up to ``jitter`` late (a
    collection takes a varying time), as dcgm-exporter's ticker makes them."""
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, jitter) for _ in range(100_000)]
    return lambda n: 0.0 if n == 0 else offset + n * interval + delays[n]


@pytest.mark.parametrize(
    ("interval", "jitter", "took"),
    [
        pytest.param(30.0, 0.0, 0.0, id="30s-exact"),
        pytest.param(30.0, 0.02, 0.004, id="30s-jitter"),
        pytest.param(2.0, 0.0, 0.0, id="2s-exact"),
        pytest.param(2.0, 0.02, 0.004, id="2s-jitter-slow-polls"),
        pytest.param(2.0, 0.03, 0.003, id="2s-30ms-jitter"),
        pytest.param(1.0, 0.01, 0.002, id="1s"),
    ],
)
async def test_steady_state_asks_about_twice_per_collection_and_sees_each_within_a_step(
    monkeypatch: pytest.MonkeyPatch, interval: float, jitter: float, took: float
) -> None:
    """docs/performance.md's figures: once the rhythm is learnt the real Follower asks at most
    2.5 times per collection (the target; about 2 here) and sees every collection within a step
    (plus the poll itself). Time is simulated: sleeping moves a fake clock."""
    step = 0.1
    made = jittered(interval, 0.013, jitter)
    collections = 200
    run = await simulate(monkeypatch, made, until=made(collections) + 0.5, step=step, took=took)
    learnt = 10  # collections the follower gets to learn
    steady = [p for p in run.polls if made(learnt) < p <= made(collections)]
    per_collection = len(steady) / (collections - learnt)
    print(f"{per_collection:.2f} polls per collection")
    assert per_collection <= 2.5
    assert run.follower.interval == pytest.approx(interval, abs=jitter + step / 10)
    steady_late = [t for n, t in run.late if n > learnt]
    assert len(steady_late) == collections - learnt  # every collection seen
    assert max(steady_late) <= step + took + 1e-9


async def test_learning_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """While it learns (the first collections, seen by coarse polls), the follower asks once a
    second and every step only around when a collection is due: docs/performance.md's bound
    of at most 4 coarse windows of step polls per collection, for the first four."""
    interval, step = 30.0, 0.1
    made = jittered(interval, 0.013, 0.0)
    run = await simulate(monkeypatch, made, until=900.0, step=step)
    learning = [p for p in run.polls if p < 4 * interval]
    print(f"{len(learning)} polls in the first four collections")
    assert len(learning) <= 4 * interval + 2 * 40  # 1 a second, and two windows of 4 s x 10
    assert max(t for n, t in run.late if n >= 3) <= step + 1e-9
    assert sorted(n for n, _ in run.late) == list(range(30))  # every collection seen
    assert len([p for p in run.polls if p >= 300]) <= 2.5 * 20


async def test_a_lost_rhythm_costs_a_bounded_number_of_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dcgm-exporter stalls for 20 s (a long collection) and goes on in a new phase: the
    follower polls every step for a short window past the due time, then once a second, then
    regains the rhythm within one collection; the stall costs a bounded number of polls."""
    interval, step, stall_after, stall = 2.0, 0.1, 50, 20.0

    def made(n: int) -> float:
        if n == 0:
            return 0.0
        return 0.013 + n * interval + (stall if n > stall_after else 0.0)

    run = await simulate(monkeypatch, made, until=made(150) + 0.5, step=step)
    during = [p for p in run.polls if made(stall_after) < p <= made(stall_after + 1)]
    window = max(5 * step, 0.02 * interval)
    # Every step up to a window past the due time, then one poll a second.
    assert len(during) <= (interval + window) / step + 2 + stall / 1.0
    regained = [t for n, t in run.late if n > stall_after + 2]
    assert regained and max(regained) <= step + 1e-9
    assert sorted(n for n, _ in run.late if n > stall_after + 2) == list(range(53, 151))
    after = [p for p in run.polls if made(stall_after + 3) < p <= made(150)]
    assert len(after) / (150 - stall_after - 3) <= 2.5


async def test_a_new_interval_is_learnt_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """dcgm-exporter restarted with --collect-interval 5 s instead of 2 s: the follower
    forgets the old interval and follows the new one."""
    step = 0.1

    def made(n: int) -> float:
        if n == 0:
            return 0.0
        return 0.013 + (n * 2.0 if n <= 40 else 80.0 + (n - 40) * 5.0)

    run = await simulate(monkeypatch, made, until=made(120) + 0.5, step=step)
    assert run.follower.interval == pytest.approx(5.0, abs=0.01)
    late = [t for n, t in run.late if n > 60]
    assert late and max(late) <= step + 1e-9
    assert sorted(n for n, _ in run.late if n > 60) == list(range(61, 121))  # every one seen
    steady = [p for p in run.polls if made(60) < p <= made(120)]
    assert len(steady) / 60 <= 2.5
