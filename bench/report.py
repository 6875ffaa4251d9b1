"""The full run's verdicts against the targets (``evaluate``) and its table (``render_table``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .modes import (
    COST_SCRAPE_EVERY,
    COST_SCRAPERS,
    ENRICHERS,
    FRESHNESS_SLACK,
    FULL,
    LONG,
    QUICK,
    RHYTHMS,
    Mode,
)

# The targets of issue 3; each is checked against figures from this run only.
TARGET_NAIVE_SPEEDUP = 30.0  # rewrite of mig56 at least this many times faster than naive
TARGET_LIMIT_RATIO = 4.0  # ... and at most this many limit passes
TARGET_E2E_RATIO = 1.25  # enricher p50 / pass-through proxy p50 on mig56
TARGET_ATTRIBUTION_MS = 2.0  # 64 processes on 8 GPUs
TARGET_RSS_MIB = 64.0
TARGET_RSS_GROWTH = 0.05  # from scrape 1,000 to 10,000
TARGET_SCALING_EXPONENT = 1.1  # cost ~ series**k over gpu1..stress; 1 is linear
# The targets of issue 16 (what the enricher costs a node), from the same run.
TARGET_CPU_RATIO = 1.5  # enricher CPU seconds / pass-through proxy's, same scrapes
TARGET_UPSTREAM_PER_COLLECTION = 2.5  # upstream requests per collection, steady state
TARGET_GZIP_FRACTION = 1 / 8  # gzip body / identity body, mig56
TARGET_ATTRIBUTION_FLOOR_RATIO = 4.0  # attribution p50 / bare stat reads p50, node8
TARGET_RSS_OVER_FLOOR_MIB = 16.0  # steady RSS, every source on, over the import floor
TARGET_RSS_DRIFT_MIB = 2.0  # RSS at the last memory checkpoint minus the first


@dataclass
class Check:
    name: str
    target: str
    measured: str
    ok: bool


def evaluate(results: dict[str, Any], mode: Mode) -> list[Check]:
    checks: list[Check] = []
    mig = results["rewrite"]["payloads"]["mig56"]
    checks.append(
        Check(
            "rewrite mig56 vs naive",
            f">= {TARGET_NAIVE_SPEEDUP:g}x faster",
            f"{mig['naive_speedup']}x",
            mig["naive_speedup"] >= TARGET_NAIVE_SPEEDUP,
        )
    )
    checks.append(
        Check(
            "rewrite mig56 vs limit",
            f"<= {TARGET_LIMIT_RATIO:g} limit passes",
            f"{mig['limit_ratio']}",
            mig["limit_ratio"] <= TARGET_LIMIT_RATIO,
        )
    )
    for rhythm, value in RHYTHMS:
        e2e = results["e2e"][f"{rhythm}_{value:g}"]
        seq, conc = e2e["sequential"], e2e["concurrent3"]
        for name in ENRICHERS[:1]:  # the others are shown, not targets
            if name not in seq:
                continue
            ratios = [
                seq[f"{name}_vs_proxy_p50"],
                seq[f"{name}_vs_proxy_p99"],
                conc[f"{name}_vs_proxy_p50"],
                conc[f"{name}_vs_proxy_p99"],
            ]
            checks.append(
                Check(
                    f"e2e {name} / proxy, {_rhythm(rhythm, value)} (p50, p99; 3 scrapers)",
                    f"each <= {TARGET_E2E_RATIO:g}",
                    ", ".join(f"{r:.2f}" for r in ratios),
                    all(r <= TARGET_E2E_RATIO for r in ratios),
                )
            )
            if rhythm == "period":
                extra = seq[name]["age_max_s"] - seq["proxy"]["age_max_s"]
                allowed = results["e2e"]["follow_step_s"] + FRESHNESS_SLACK
                checks.append(
                    Check(
                        f"freshness {name}: oldest values served, beyond the proxy's",
                        f"<= {allowed * 1000:g} ms (step + one scrape)",
                        f"{extra * 1000:.0f} ms",
                        extra <= allowed,
                    )
                )
    attr = results["attribution"]["node8"]
    checks.append(
        Check(
            "attribution 64 procs / 8 GPUs",
            f"< {TARGET_ATTRIBUTION_MS:g} ms",
            f"{attr['p50_ms']} ms",
            attr["p50_ms"] < TARGET_ATTRIBUTION_MS,
        )
    )
    mem = results["memory"]
    first, last = (str(c) for c in mode.memory_checkpoints)
    peak = max(mem["rss_mib"].values())
    checks.append(Check("RSS", f"< {TARGET_RSS_MIB:g} MiB", f"{peak} MiB", peak < TARGET_RSS_MIB))
    checks.append(
        Check(
            f"RSS growth {first} -> {last}",
            f"< {TARGET_RSS_GROWTH:.0%}",
            f"{mem['growth']:.2%}",
            mem["growth"] < TARGET_RSS_GROWTH,
        )
    )
    ratio = attr["p50_ms"] / attr["stat_reads_floor_p50_ms"]
    checks.append(
        Check(
            "attribution 64 procs / 8 GPUs vs bare /proc reads",
            f"<= {TARGET_ATTRIBUTION_FLOOR_RATIO:g}x the stat reads (new)",
            f"{ratio:.2f}x ({attr['p50_ms']} / {attr['stat_reads_floor_p50_ms']} ms)",
            ratio <= TARGET_ATTRIBUTION_FLOOR_RATIO,
        )
    )
    floor = mem["floor_rss_mib"]["imports_with_kubelet_grpc"]
    steady = mem["rss_mib"][last]
    checks.append(
        Check(
            "RSS over the import floor, every source on",
            f"<= floor {floor} + {TARGET_RSS_OVER_FLOOR_MIB:g} MiB (new)",
            f"+{steady - floor:.1f} MiB ({steady} MiB)",
            steady - floor <= TARGET_RSS_OVER_FLOOR_MIB,
        )
    )
    drift = mem["rss_mib"][last] - mem["rss_mib"][first]
    checks.append(
        Check(
            f"RSS drift {first} -> {last}",
            f"<= {TARGET_RSS_DRIFT_MIB:g} MiB (new)",
            f"{drift:+.1f} MiB",
            drift <= TARGET_RSS_DRIFT_MIB,
        )
    )
    cost = results["cost"]
    checks.append(
        Check(
            "CPU enricher / proxy, same scrapes",
            f"<= {TARGET_CPU_RATIO:g}x (new)",
            f"{cost['cpu_ratio']:.2f}x ({cost['enricher']['cpu_s']} / {cost['proxy']['cpu_s']} s)",
            cost["cpu_ratio"] <= TARGET_CPU_RATIO,
        )
    )
    per = cost["enricher"]["upstream_requests_per_collection"]
    checks.append(
        Check(
            "upstream requests per collection, steady",
            f"<= {TARGET_UPSTREAM_PER_COLLECTION:g} (new; was 7)",
            f"{per}",
            per <= TARGET_UPSTREAM_PER_COLLECTION,
        )
    )
    fraction = cost["gzip_fraction"]
    checks.append(
        Check(
            "bytes on the wire, gzip / identity body, mig56",
            f"<= 1/{1 / TARGET_GZIP_FRACTION:g} (new)",
            f"1/{1 / fraction:.1f} ({cost['enricher']['wire_bytes_per_scrape']} of "
            f"{cost['identity_body_bytes']} bytes)",
            fraction <= TARGET_GZIP_FRACTION and cost["enricher"]["gzip"] > 0,
        )
    )
    k = results["rewrite"]["scaling_exponent"]
    checks.append(
        Check(
            "rewrite cost ~ series^k",
            f"k <= {TARGET_SCALING_EXPONENT:g}",
            f"k = {k}",
            k <= TARGET_SCALING_EXPONENT,
        )
    )
    return checks


def _rhythm(rhythm: str, value: float) -> str:
    if rhythm == "period":
        return f"new values every {value:g} s"
    n = int(value)
    return "new values on every fetch" if n == 1 else f"new values on every {n}th fetch"


def mode_first(results: dict[str, Any]) -> int:
    return {"quick": QUICK, "long": LONG}.get(results["mode"], FULL).memory_checkpoints[0]


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def render_table(results: dict[str, Any], checks: list[Check]) -> str:
    lines: list[str] = []
    rw = results["rewrite"]["payloads"]
    lines.append("Rewrite (median ms; values change on every call)")
    lines.append(
        f"{'payload':8} {'series':>7} {'KiB':>6} {'limit':>8} {'rewrite':>8} {'xlimit':>7} "
        f"{'line-by-line':>12} {'1st scrape':>10} {'naive':>9} {'xnaive':>7} {'ns/series':>9}"
    )
    for name, r in rw.items():
        lines.append(
            f"{name:8} {r['series']:>7} {r['bytes'] // 1024:>6} {r['limit_ms']:>8.3f} "
            f"{r['rewrite_ms']:>8.3f} {r['limit_ratio']:>7.2f} {r['line_by_line_ms']:>12.3f} "
            f"{r['first_scrape_ms']:>10.3f} {_num(r['naive_ms'], 9, 1)} "
            f"{_num(r['naive_speedup'], 7, 1)} "
            f"{r['rewrite_per_series_ns']:>9.1f}"
        )
    lines.append(
        f"scaling exponent (cost ~ series^k, gpu1..stress): k = "
        f"{results['rewrite']['scaling_exponent']} (limit pass: "
        f"{results['rewrite']['limit_scaling_exponent']})"
    )
    for rhythm, value in RHYTHMS:
        e2e = results["e2e"][f"{rhythm}_{value:g}"]
        lines.append("")
        lines.append(
            f"End to end, GET /metrics of mig56, {_rhythm(rhythm, value)} "
            f"(ms; {e2e['requests']} requests each)"
        )
        lines.append(
            f"{'target':18} {'p50':>7} {'p99':>7} {'3x p50':>7} {'3x p99':>7} "
            f"{'age p50':>8} {'age max':>8}  inside: fetch rewrite scrape"
        )
        seq, conc = e2e["sequential"], e2e["concurrent3"]
        for name in ("upstream", "proxy", *ENRICHERS):
            if name not in seq:
                continue
            s_, c_ = seq[name], conc[name]
            inside = e2e.get(f"{name}_inside_ms") or {}
            detail = " ".join(f"{inside.get(k, 0):>6.3f}" for k in ("fetch", "rewrite", "scrape"))
            lines.append(
                f"{name:18} {s_['p50_ms']:>7.2f} {s_['p99_ms']:>7.2f} {c_['p50_ms']:>7.2f} "
                f"{c_['p99_ms']:>7.2f} {s_.get('age_p50_s', 0):>8.3f} "
                f"{s_.get('age_max_s', 0):>8.3f}" + (f"  {detail}" if inside else "")
            )
        for name in ENRICHERS:
            if name not in seq:
                continue
            lines.append(
                f"{name + ' / proxy':18} {seq[f'{name}_vs_proxy_p50']:>7.2f} "
                f"{seq[f'{name}_vs_proxy_p99']:>7.2f} {conc[f'{name}_vs_proxy_p50']:>7.2f} "
                f"{conc[f'{name}_vs_proxy_p99']:>7.2f}"
            )
    lines.append(
        "enricher: the app as shipped: dcgm-exporter fetched right after each of its "
        f"collections (step {results['e2e']['follow_step_s'] * 1000:g} ms), the node side "
        "(NVML, procfs, kubelet) read with it, scrapes served from what is ready; it follows "
        "a collection rhythm, so it runs in the last table only. enricher_background: "
        "--upstream.follow-step=0 --collect.interval="
        f"{results['e2e']['collect_interval_s']:g} (upstream on every scrape, node side in the "
        "background). enricher_per_scrape: --upstream.follow-step=0 (everything on every "
        "scrape). age: of the upstream values served (s). inside: medians in the enricher's "
        "process."
    )
    lines.append("")
    lines.append("Attribution (NVML fake + procfs + pod lookup, ms)")
    for name, a in results["attribution"].items():
        bare = a.get("nvml_calls_floor_p50_ms") if name == "node8" else None
        nvml_floor = "" if bare is None else f" (its driver calls bare: {bare:.3f})"
        lines.append(
            f"{name:8} {a['processes']} processes on {a['devices']} devices of {a['gpus']} GPUs: "
            f"p50 {a['p50_ms']:.3f}, p99 {a['p99_ms']:.3f} ({a['attributed']} attributed); "
            f"p50 of NVML {a['nvml_p50_ms']:.3f}{nvml_floor}, procfs {a['procfs_p50_ms']:.3f} "
            f"(bare reads of the stat files: {a['stat_reads_floor_p50_ms']:.3f}), "
            f"lookup {a['lookup_p50_ms']:.3f}"
        )
    mem = results["memory"]
    lines.append("")
    lines.append(
        f"Memory (enricher RSS MiB, mig56, {mem['pods']} pods, {mem['churns']} churns, "
        f"{mem['seconds']} s)"
    )
    lines.append(
        "  "
        + ", ".join(f"after {k}: {v}" for k, v in mem["rss_mib"].items())
        + f"; peak {mem['peak_rss_mib']}; growth {mem['growth']:.2%}"
    )
    lines.append(
        f"  without the pod watch (no kubernetes client): {mem['rss_without_kube_mib']} after "
        f"{mode_first(results)} scrapes"
    )
    floor = mem["floor_rss_mib"]
    lines.append(
        f"  floor, a process importing what the enricher imports and nothing more: "
        f"{floor['imports']} (without the kubernetes client {floor['imports_without_kubernetes']}"
        f"; with the kubelet source's gRPC, as on a node: {floor['imports_with_kubelet_grpc']})"
    )
    lines.append(
        f"  where the RSS over the floor with gRPC is (MiB; at start, after {mem['scrapes']} "
        "scrapes):"
    )
    for row in mem["rss_over_floor_by_mapping"]:
        lines.append(
            f"    {row['mapping'][:40]:40} floor {row['floor']:7.2f}  start {row['start']:7.2f}"
            f"  end {row['end']:7.2f}  over {row['over_floor']:+7.2f}"
        )
    if "growth" in results:
        from .growth import render_growth

        lines.append("")
        lines.extend(render_growth(results["growth"]))
    if "loop" in results:
        lines.append("")
        lines.extend(render_loop(results["loop"]))
    if "cost" in results:
        lines.append("")
        lines.extend(render_cost(results["cost"]))
    lines.append("")
    lines.append("Targets")
    for c in checks:
        lines.append(f"  [{'ok' if c.ok else 'MISS'}] {c.name}: {c.measured} (target {c.target})")
    return "\n".join(lines)


def render_cost(cost: dict[str, Any]) -> list[str]:
    lines = [
        f"Cost to the node (mig56, upstream collecting every {cost['period_s']:g} s, "
        f"{COST_SCRAPERS} scrapers each asking every {COST_SCRAPE_EVERY:g} s with gzip; "
        f"{cost['window_s']} s steady window after {cost['learn_s']:g} s)",
        f"{'target':10} {'scrapes':>7} {'CPU s':>7} {'ms/scrape':>9} {'upstream':>8} "
        f"{'/collection':>11} {'bytes/scrape':>12} {'gzip':>5} {'age max':>8}",
    ]
    for name in ("proxy", "enricher"):
        r = cost[name]
        age = "-" if r["age_max_s"] is None else f"{r['age_max_s']:.3f}"
        lines.append(
            f"{name:10} {r['scrapes']:>7} {r['cpu_s']:>7.3f} {r['cpu_ms_per_scrape']:>9.3f} "
            f"{r['upstream_requests']:>8} {r['upstream_requests_per_collection']:>11.2f} "
            f"{r['wire_bytes_per_scrape']:>12} {r['gzip']:>5} {age:>8}"
        )
    lines.append(
        f"enricher / proxy CPU: {cost['cpu_ratio']:.2f}; gzip body / identity body "
        f"({cost['identity_body_bytes']} bytes): {cost['gzip_fraction']:.4f}"
    )
    return lines


def render_breakdown(where: dict[str, Any]) -> list[str]:
    """The instrumented cost run: milliseconds of CPU per collection, by event-loop callback
    (these add up to the loop's time), by function (inside those, or in worker threads) and
    in the garbage collector (inside both)."""
    lines = [
        "Where the enricher's CPU goes (ms per collection, instrumented run; "
        f"{where['enricher_cpu_ms_per_collection']:.3f} in all, every thread)"
    ]
    for table, title in (
        ("loop", "event loop, by callback"),
        ("functions", "by function (inside the above, or in threads)"),
        ("gc", "garbage collector"),
    ):
        lines.append(f"  {title}")
        for name, ms in list(where[table].items())[:12]:
            lines.append(f"    {ms:>8.3f}  {name}")
        if not where[table]:
            lines.append("    (none in the window)")
    return lines


def render_loop(loop: dict[str, Any]) -> list[str]:
    lines = [
        f"Event loop: GET /healthz (ms; one every {loop['healthz_every_ms']:g} ms) while "
        f"/metrics ({loop['values_worker']['body_mib']} MiB served, upstream body "
        f"{loop['shape']}) is scraped back to back"
    ]
    lines.append(
        f"{'bodies differ in, rewrite':26} {'n':>5} {'p50':>7} {'p99':>7} {'max':>7}  "
        f"{'idle p50':>8} {'idle max':>8}  scrape p50  rewrite p50"
    )
    for kind in ("values", "labels"):
        for design in ("worker", "on_loop"):
            row = loop[f"{kind}_{design}"]
            busy, idle = row["busy"], row["idle"]
            lines.append(
                f"{kind + ', ' + design:26} {busy['n']:>5} {busy['p50_ms']:>7.2f} "
                f"{busy['p99_ms']:>7.2f} {busy['max_ms']:>7.1f}  {idle['p50_ms']:>8.2f} "
                f"{idle['max_ms']:>8.1f}  {row['scrape_p50_ms']:>10.1f}  "
                f"{row['inside_ms'].get('rewrite', 0):>11.1f}"
            )
    lines.append(
        f"/healthz max, worker / on the loop: values {loop['values_max_ratio']}, labels "
        f"{loop['labels_max_ratio']}. worker: as shipped (bodies over "
        "enricher.pipeline.REWRITE_INLINE_MAX_CHARS rewritten in a thread); on_loop: every rewrite "
        "on the event loop, the design before."
    )
    return lines
