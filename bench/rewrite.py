"""The rewrite part: per payload, the enricher's rewrite against the *limit* (split into
lines and join again) and the *naive* round trip (prometheus_client's parser, then its
renderer), and how its cost grows with the series (``bench_rewrite``)."""

from __future__ import annotations

import gc
import statistics
from functools import partial
from typing import Any

from . import payloads
from .growth import exponent
from .modes import Mode, ms, time_once


def _naive_round_trip(text: str, owners: dict[tuple[str, str], tuple[str, str, str]]) -> str:
    """What a Python developer would write: parse with prometheus_client, set the pod labels,
    render with prometheus_client."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import Collector, CollectorRegistry
    from prometheus_client.samples import Sample

    families = list(text_string_to_metric_families(text))
    for fam in families:
        new = []
        for s in fam.samples:
            labels = dict(s.labels)
            owner = owners.get((labels.get("UUID", ""), labels.get("GPU_I_ID", "")))
            ns, pod, container = owner if owner is not None else ("", "", "")
            if owner is not None or "pod" not in labels:
                labels.update(namespace=ns, pod=pod, container=container)
            new.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
        fam.samples = new

    class Families(Collector):
        def collect(self) -> Any:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return generate_latest(registry).decode()


def _limit_pass(text: str) -> str:
    """The least any line rewrite costs: split into lines and join them again."""
    return "\n".join(text.split("\n"))


def bench_rewrite(mode: Mode) -> dict[str, Any]:
    from enricher.labels import Owner, RewritePlan
    from enricher.rewrite import Rewriter

    out: dict[str, Any] = {}
    for name, shape in payloads.SHAPES.items():
        texts = [payloads.generate(shape, v) for v in range(4)]
        devs = payloads.devices(shape)
        # A busy node: a third of the devices run one pod's processes, a sixth are shared.
        owners = {}
        for i, d in enumerate(devs):
            key = (d.uuid, "" if d.gi_id is None else str(d.gi_id))
            if i % 3 == 0:
                owners[key] = Owner("ml", f"train-{i}", "trainer")
            elif i % 6 == 1:
                owners[key] = Owner("", "", "")
        plan = RewritePlan(owners=owners)
        naive_owners = {k: (o.namespace, o.pod, o.container) for k, o in owners.items()}
        series = payloads.series_count(texts[0])

        fast = Rewriter()
        first = time_once(partial(fast.rewrite, texts[0], plan))  # line by line + template
        slow = Rewriter(templates=False)
        slow.rewrite(texts[0], plan)
        reps = mode.rewrite_reps if series < 10_000 else max(3, mode.rewrite_reps // 6)
        limit_t: list[float] = []
        fast_t: list[float] = []
        slow_t: list[float] = []
        gc.collect()
        for r in range(reps):  # interleaved, so drift on the machine hits all alike
            text = texts[(r + 1) % len(texts)]
            limit_t.append(time_once(partial(_limit_pass, text)))
            fast_t.append(time_once(partial(fast.rewrite, text, plan)))
            slow_t.append(time_once(partial(slow.rewrite, text, plan)))
        if fast.slow_rewrites != 1:
            raise AssertionError(f"{name}: the template missed ({fast.slow_rewrites - 1} times)")
        if fast.rewrite(texts[1], plan).text != slow.rewrite(texts[1], plan).text:
            raise AssertionError(f"{name}: fast and line-by-line rewrites differ")
        # The naive round trip of stress takes seconds: once in a full run, never in --quick.
        naive_reps = mode.naive_reps if series < 10_000 else min(1, mode.naive_reps - 1)
        naive_t = [
            time_once(partial(_naive_round_trip, texts[r % len(texts)], naive_owners))
            for r in range(naive_reps)
        ]
        limit = statistics.median(limit_t)
        fast_med = statistics.median(fast_t)
        out[name] = {
            "series": series,
            "bytes": len(texts[0].encode()),
            "limit_ms": ms(limit),
            "rewrite_ms": ms(fast_med),
            "line_by_line_ms": ms(statistics.median(slow_t)),
            "first_scrape_ms": ms(first),
            "naive_ms": ms(statistics.median(naive_t)) if naive_t else None,
            "rewrite_per_series_ns": round(fast_med / series * 1e9, 1),
            "limit_ratio": round(fast_med / limit, 2),
            "naive_speedup": round(statistics.median(naive_t) / fast_med, 1) if naive_t else None,
            "line_by_line_limit_ratio": round(statistics.median(slow_t) / limit, 2),
        }
        del texts
        gc.collect()
    big, mid = out["stress"], out["mig56"]
    return {
        "payloads": out,
        # Least-squares slope of log(cost) over log(series): 1 is linear. The limit pass's own
        # exponent shows what the machine's caches do to any pass over a bigger text.
        "scaling_exponent": exponent(out, "rewrite_ms"),
        "limit_scaling_exponent": exponent(out, "limit_ms"),
        "stress_vs_mig56_per_series": round(
            big["rewrite_per_series_ns"] / mid["rewrite_per_series_ns"], 2
        ),
    }
