"""The benchmark's modes (full, quick, long), what every part shares about the enricher
designs and the upstream rhythms, and the small measuring helpers of every part."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

COST_PERIOD = 2.0  # the upstream collects every this many seconds in the cost part
COST_SCRAPERS = 2  # per target, each asking every COST_SCRAPE_EVERY seconds
COST_SCRAPE_EVERY = 1.0
# enricher_background reads the node side (NVML, procfs, kubelet) every this many seconds,
# as dcgm-exporter collects by default, and the upstream on every scrape.
COLLECT_INTERVAL = 30.0
# When the upstream has new values. ("every", 1): on every fetch, the worst case (every
# scrape is rewritten). ("every", 4): on every 4th fetch of each client, as an HA pair
# scraping every 15 s sees a dcgm-exporter that collects every 30 s (its default): the body
# repeats between collections. ("period", s): every s seconds of wall time, whoever asks: a
# real exporter's rhythm, sped up, the one where following the upstream can be measured.
RHYTHMS: tuple[tuple[str, float], ...] = (("every", 1), ("every", 4), ("period", 2.0))
# enricher: the app as shipped (its defaults: dcgm-exporter followed, fetched right after each
# of its collections, the node side read with it; scrapes served from what is ready).
# enricher_background: --upstream.follow-step=0 --collect.interval=30 (the upstream fetched and
# rewritten on every scrape, the node side in the background). enricher_per_scrape:
# --upstream.follow-step=0 (everything read on every scrape). The targets apply to the first.
ENRICHERS = ("enricher", "enricher_background", "enricher_per_scrape")
# "One scrape" in the freshness check: what an enricher may add to the age of the values
# beyond the follower's step (a poll and a rewrite, or a slow scrape).
FRESHNESS_SLACK = 0.05


@dataclass(frozen=True)
class Mode:
    rewrite_reps: int
    naive_reps: int
    e2e_requests: int
    e2e_concurrent: int  # requests per scraper, 3 scrapers
    attribution_reps: int
    memory_checkpoints: tuple[int, int]
    churn_every: int
    churn_pods: int
    follow_learn: float  # upstream periods the follower gets to learn the rhythm
    loop_scrapes: int  # scrapes of the large body per kind, /healthz asked meanwhile
    loop_shape: str  # the large body: max32 (31 MiB) in a full run
    cost_learn: float  # seconds the cost part lets the enricher learn the rhythm
    cost_window: float  # the steady window the cost part measures (seconds)


FULL = Mode(
    rewrite_reps=60,
    naive_reps=5,
    e2e_requests=600,  # p99 is the 6th slowest: a few stray slow requests do not decide it
    e2e_concurrent=100,
    attribution_reps=200,
    memory_checkpoints=(1_000, 10_000),
    churn_every=100,
    churn_pods=11,
    follow_learn=6.0,
    loop_scrapes=12,
    loop_shape="max32",
    cost_learn=20.0,
    cost_window=60.0,
)
QUICK = Mode(
    rewrite_reps=5,
    naive_reps=1,  # and none for stress
    e2e_requests=20,
    e2e_concurrent=10,
    attribution_reps=10,
    memory_checkpoints=(50, 150),
    churn_every=25,
    churn_pods=11,
    follow_learn=0.5,
    loop_scrapes=2,
    loop_shape="stress",  # 6 MiB: still over the inline limit, and quick to generate
    cost_learn=12.0,
    cost_window=8.0,
)
# --long: the memory run to 30,000 scrapes (the no-growth target's own checkpoints).
LONG = replace(FULL, memory_checkpoints=(3_000, 30_000))


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 4)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), nearest rank: an observed value, never an interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def time_once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
