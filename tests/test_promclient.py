"""The enricher's own families through prometheus_client (enricher.promclient).

Real parts: prometheus_client's collectors, registry and exposition; the Scraper behind the
real aiohttp app; promtool of each Prometheus release as the oracle for validity, and
prometheus_client's parser for the samples. The process collector reads the real /proc/self,
or a fake /proc tree on disk.
"""

from __future__ import annotations

import math
import mmap
import os
import platform
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from enricher.app import make_app
from enricher.attribution import plan_devices
from enricher.pipeline import Scraper
from enricher.promclient import (
    LabelSets,
    MetricWriter,
    label_text,
    render_metrics,
)
from enricher.rewrite import Rewriter
from enricher.selfmetrics import RuntimeFamilies
from enricher.textformat import written_value
from tests.scraping import PER_SCRAPE, NoProcs

from .conftest import as_prometheus_client_writes, promtool_check_metrics
from .exposition import FamilyWriter

PROCESS_FAMILIES = (
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
)
PYTHON_FAMILIES = (
    "python_info",
    "python_gc_objects_collected_total",
    "python_gc_objects_uncollectable_total",
    "python_gc_collections_total",
)
REFUSED = "http://127.0.0.1:9/metrics"  # the discard port: the upstream is down


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by sample name (prometheus_client's parser)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def value(text: str, name: str) -> float:
    (only,) = samples(text)[name]
    return only[1]


def type_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# TYPE ")]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[TestClient[Any, Any]]]]:
    """The real app on a Scraper without NVML or Kubernetes; ``upstream_text`` None: the
    upstream refuses connections."""
    cleanup: list[Any] = []

    async def make(upstream_text: str | None = None, **scraper: Any) -> TestClient[Any, Any]:
        url = REFUSED
        if upstream_text is not None:

            async def metrics(_r: web.Request) -> web.Response:
                return web.Response(text=upstream_text, content_type="text/plain")

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            upstream = TestServer(app)
            await upstream.start_server()
            cleanup.append(upstream)
            url = str(upstream.make_url("/metrics"))
        config = replace(PER_SCRAPE, upstream_url=url, upstream_timeout=1.0)
        client = TestClient(
            TestServer(
                make_app(Scraper(config, nvml=None, procfs=NoProcs(), kubernetes=None, **scraper))
            )
        )
        await client.start_server()
        cleanup.append(client)
        return client

    yield make
    for c in reversed(cleanup):
        await c.close()


async def get_metrics(client: TestClient[Any, Any]) -> str:
    resp = await client.get("/metrics")
    assert resp.status == 200
    return await resp.text()


# --------------------------------------------------------------------------- on /metrics


async def test_metrics_serve_process_and_python_families(serve: Any, promtools: list[str]) -> None:
    text = await get_metrics(await serve())
    got = samples(text)
    for name in (*PROCESS_FAMILIES, *PYTHON_FAMILIES):
        assert name in got, name
    assert value(text, "process_resident_memory_bytes") > 0
    assert value(text, "process_virtual_memory_bytes") >= value(
        text, "process_resident_memory_bytes"
    )
    assert value(text, "process_cpu_seconds_total") > 0  # importing the enricher takes CPU
    assert 3 <= value(text, "process_open_fds") <= value(text, "process_max_fds")
    start = value(text, "process_start_time_seconds")
    assert time.time() - 24 * 3600 < start <= time.time()
    ((info, one),) = got["python_info"]
    assert (info["version"], info["implementation"], one) == (
        platform.python_version(),
        platform.python_implementation(),
        1.0,
    )
    assert {labels["generation"] for labels, _ in got["python_gc_collections_total"]} >= {
        "0",
        "1",
        "2",
    }
    # After the enricher's own families, each family once, and the whole body valid.
    names = [line.split()[2] for line in type_lines(text)]
    assert names.index("dcgm_enricher_build_info") < names.index("process_cpu_seconds_total")
    assert len(names) == len(set(names))
    for promtool in promtools:
        res = promtool_check_metrics(promtool, text)
        assert res.returncode == 0, res.stdout + res.stderr


async def test_process_families_describe_the_enricher_itself(serve: Any) -> None:
    """--path.procfs is the host's /proc (read for GPU processes); process_* come from the
    enricher's own /proc/self, whatever that flag says."""
    text = await get_metrics(await serve())
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().split(b")")[-1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat", "rb") as f:
        btime = next(float(ln.split()[1]) for ln in f if ln.startswith(b"btime "))
    assert value(text, "process_start_time_seconds") == pytest.approx(
        float(fields[19]) / ticks + btime, abs=0.02
    )


def _fake_proc(root: Path, *, rss_pages: int, utime: int, stime: int, fds: int) -> None:
    """A /proc with the files ProcessCollector reads: stat (btime) and self/{stat,limits,fd}."""
    (root / "self" / "fd").mkdir(parents=True)
    (root / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\n")
    fields = ["S"] + ["0"] * 40
    fields[11], fields[12], fields[19] = str(utime), str(stime), "500"
    fields[20], fields[21] = "987654321", str(rss_pages)
    (root / "self" / "stat").write_text("4242 (dcgm-enricher) " + " ".join(fields) + "\n")
    (root / "self" / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            4096                 524288               files\n"
    )
    for i in range(fds):
        (root / "self" / "fd" / str(i)).write_text("")


async def test_process_families_read_the_own_procfs_root(serve: Any, tmp_path: Path) -> None:
    _fake_proc(tmp_path, rss_pages=2048, utime=250, stime=50, fds=5)
    text = await get_metrics(await serve(own_procfs=str(tmp_path)))
    ticks = os.sysconf("SC_CLK_TCK")
    assert value(text, "process_resident_memory_bytes") == 2048 * mmap.PAGESIZE
    assert value(text, "process_virtual_memory_bytes") == 987654321
    assert value(text, "process_cpu_seconds_total") == pytest.approx(300 / ticks)
    assert value(text, "process_start_time_seconds") == pytest.approx(1700000000 + 500 / ticks)
    assert value(text, "process_open_fds") == 5
    assert value(text, "process_max_fds") == 4096


async def test_a_missing_own_procfs_leaves_only_the_process_families_out(
    serve: Any, tmp_path: Path, promtools: list[str]
) -> None:
    text = await get_metrics(await serve(own_procfs=str(tmp_path / "absent")))
    got = samples(text)
    assert not [n for n in got if n.startswith("process_")]
    assert "python_info" in got and "dcgm_enricher_build_info" in got
    for promtool in promtools:
        res = promtool_check_metrics(promtool, text)
        assert res.returncode == 0, res.stdout + res.stderr


async def test_upstream_process_families_are_dropped_for_ours(
    serve: Any, promtools: list[str]
) -> None:
    """A Go exporter upstream writes process_* about its own process: under the enricher's
    target they would repeat our families, so they are dropped like any reserved name."""
    upstream = (
        "# HELP process_cpu_seconds_total Upstream's.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 123456\n"
        "# TYPE python_info gauge\n"
        'python_info{version="0.0"} 1\n'
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0"} 40\n'
    )
    text = await get_metrics(await serve(upstream))
    names = [line.split()[2] for line in type_lines(text)]
    assert names.count("process_cpu_seconds_total") == 1
    assert names.count("python_info") == 1
    assert value(text, "process_cpu_seconds_total") != 123456
    assert samples(text)["python_info"][0][0]["version"] == platform.python_version()
    assert value(text, "DCGM_FI_DEV_GPU_TEMP") == 40
    assert value(text, "dcgm_enricher_upstream_samples") == 1
    for promtool in promtools:
        res = promtool_check_metrics(promtool, text)
        assert res.returncode == 0, res.stdout + res.stderr
    result = Rewriter().rewrite(upstream, plan_devices([]))
    assert (result.samples, result.dropped_reserved) == (1, 5)


# --------------------------------------------------------------------------- the registry


async def test_each_scraper_counts_its_own_and_registers_nothing_globally() -> None:
    """Two Scrapers in one process: each body counts its own scrapes, its own families are
    what prometheus_client writes for them, and prometheus_client's global registry holds
    none of them."""
    before = set(REGISTRY._collector_to_names)  # prometheus_client's global registry
    config = replace(PER_SCRAPE, upstream_url=REFUSED, upstream_timeout=1.0)
    a = Scraper(config, nvml=None, procfs=NoProcs(), kubernetes=None)
    b = Scraper(config, nvml=None, procfs=NoProcs(), kubernetes=None)
    try:
        await a.scrape()
        await a.scrape()
        body_b = (await b.scrape()).body.decode()
        body_a = (await a.scrape()).body.decode()
        assert value(body_a, "dcgm_enricher_scrapes_total") == 3
        assert value(body_b, "dcgm_enricher_scrapes_total") == 1
        for body in (body_a, body_b):
            own = "".join(ln + "\n" for ln in body.split("\n") if "dcgm_enricher_" in ln)
            assert own and as_prometheus_client_writes(own) == own
    finally:
        await a.close()
        await b.close()
    assert set(REGISTRY._collector_to_names) == before
    assert "dcgm_enricher_scrapes_total" not in generate_latest(REGISTRY).decode()


# --------------------------------------------------------------------------- MetricWriter


def _both(labels: tuple[tuple[str, str], ...], v: float, typ: str = "gauge") -> tuple[str, str]:
    """The same family written by the hand-written FamilyWriter and by MetricWriter."""
    name = "t_total" if typ == "counter" else "t"
    out = []
    for w in (FamilyWriter(), MetricWriter()):
        w.family(name, 'Help with "quotes", a \\ and a\nnewline.', typ)
        w.sample(name, labels, v)
        out.append(w.render())
    return out[0], out[1]


VALUES = [
    pytest.param(0, id="zero"),
    pytest.param(1, id="one"),
    pytest.param(0.6, id="fraction"),
    pytest.param(7516192768, id="seven-gib"),
    pytest.param(2**53 + 1, id="beyond-float-precision"),
    pytest.param(1e15, id="1e15"),
    pytest.param(123456789012345678, id="large-int"),
    pytest.param(1.5e-7, id="tiny"),
    pytest.param(-3.25, id="negative"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="minus-inf"),
]


@pytest.mark.parametrize("v", VALUES)
def test_values_parse_as_the_hand_written_ones(v: float, promtools: list[str]) -> None:
    hand, ours = _both((("a", "x"),), v)
    assert samples(ours) == samples(hand)
    for typ_line in ("# TYPE t gauge",):
        assert typ_line in ours
    for promtool in promtools:
        res = promtool_check_metrics(promtool, ours)
        assert res.returncode == 0, res.stdout + res.stderr


def test_nan_parses_as_nan() -> None:
    _, ours = _both((), math.nan)
    assert math.isnan(value(ours, "t"))


LABEL_VALUES = [
    pytest.param("plain", id="plain"),
    pytest.param('a "quoted" \\ back\nslash', id="escapes"),
    pytest.param("x" * 5000, id="over-the-cut"),
    pytest.param("é" * 1023 + "\\\\", id="escape-at-the-cut"),
    pytest.param("ok\ud800bad\udfff", id="lone-surrogates"),
    pytest.param("\ud83d" * 2000, id="surrogates-over-the-cut"),
    pytest.param("", id="empty"),
]


@pytest.mark.parametrize("label", LABEL_VALUES)
def test_label_values_are_cut_and_sanitised(label: str, promtools: list[str]) -> None:
    """prometheus_client escapes but neither cuts nor replaces lone surrogates: the writer
    hands it what the hand-written writer would have written."""
    hand, ours = _both((("z", label), ("a", "first")), 1)
    ((labels, _),) = samples(ours)["t"]
    assert labels == {"z": written_value(label), "a": "first"}
    assert len(labels["z"]) <= 1024
    assert samples(ours) == samples(hand)
    for promtool in promtools:
        res = promtool_check_metrics(promtool, ours)
        assert res.returncode == 0, res.stdout + res.stderr


def test_counters_keep_their_names_and_write_no_created() -> None:
    hand, ours = _both((("a", "x"),), 3, "counter")
    assert "# TYPE t_total counter\n" in ours
    assert '\nt_total{a="x"} 3.0\n' in ours
    assert "_created" not in ours
    assert samples(ours) == samples(hand)
    with pytest.raises(ValueError, match="_total"):
        MetricWriter().family("t", "no suffix", "counter")


def _pod_series(pods: range) -> MetricWriter:
    w = MetricWriter()
    w.family("t", "T.")
    for i in pods:
        w.sample("t", (("namespace", "ns"), ("pod", f"p-{i}")), i)
    return w


def test_the_label_memo_follows_the_series_in_use() -> None:
    """Pods come and go, ten on the node at a time, one collection each: after 2,000 pods
    the memo holds the sets of the last two turns only (a fixed bound would have filled with
    departed pods'), and every line is still written as prometheus_client writes it."""
    memo = LabelSets()
    for collection in range(2_000):
        memo.turn()
        text = _pod_series(range(collection, collection + 10)).render(memo)
        assert f't{{namespace="ns",pod="p-{collection}"}} {float(collection)}\n' in text
    assert memo.held() == 11  # this turn's ten and the one pod of the turn before


def test_a_label_set_written_again_survives_its_turn() -> None:
    memo = LabelSets()
    pairs = (("pod", 'a"b'),)
    first = memo.text(pairs)
    assert first == label_text(pairs) == 'pod="a\\"b"'
    memo.turn()
    assert memo.text(pairs) is first  # moved back from the turn before, not written anew
    memo.turn()
    memo.turn()
    assert memo.text(pairs) == first and memo.text(pairs) is not first


def test_the_label_memo_turns_itself_at_its_bound() -> None:
    """An owner that never turns it still holds at most two bounds of sets."""
    memo = LabelSets(bound=100)
    _pod_series(range(1_000)).render(memo)
    assert memo.held() <= 200


def test_each_label_memo_is_its_owners() -> None:
    """Two memos (two Scrapers) in one process: rendering or turning one leaves the other as
    it was, and a writer rendered without a memo fills none."""
    a, b = LabelSets(), LabelSets()
    _pod_series(range(10)).render(a)
    _pod_series(range(5)).render(b)
    assert (a.held(), b.held()) == (10, 5)
    b.turn()
    b.turn()
    _pod_series(range(3)).render()
    assert (a.held(), b.held()) == (10, 0)
    assert _pod_series(range(3)).render() == _pod_series(range(3)).render(a)


def test_families_keep_their_order_and_empty_ones_their_help() -> None:
    w = MetricWriter()
    w.family("b_second", "B.")
    w.family("a_first", "A.")
    w.family("b_second", "ignored: declared once")
    w.sample("a_first", (), 1)
    assert w.render() == (
        "# HELP b_second B.\n# TYPE b_second gauge\n"
        "# HELP a_first A.\n# TYPE a_first gauge\na_first 1.0\n"
    )
    assert MetricWriter().render() == ""


def _odd_families() -> MetricWriter:
    w = MetricWriter()
    w.family("odd_gauge", 'help with \\ a backslash,\na newline and "quotes"')
    w.sample("odd_gauge", (("b", 'x"y'), ("a", "back\\slash"), ("c", "new\nline")), 1.5)
    w.sample("odd_gauge", (("label-with-dash", "v"), ("ünï", "ü")), float("nan"))
    w.sample("odd_gauge", (), float("inf"))
    w.sample("odd_gauge", (("z", ""),), -0.0)
    w.family("odd_count_total", "a counter", "counter")
    w.sample("odd_count_total", (("k", "v"),), 7.516192768e09)
    w.sample("odd_count_total", (), 12345678.0)
    w.family("empty_family", "no samples")
    return w


def test_render_metrics_writes_what_generate_latest_writes() -> None:
    """The fast exposition (names escaped once per name) against prometheus_client's own, on
    odd names, values and HELP texts."""
    writer = _odd_families()
    assert render_metrics(writer.collect()) == generate_latest(writer).decode()
    assert writer.render() == generate_latest(writer).decode()


def test_runtime_families_render_what_they_collect() -> None:
    """RuntimeFamilies.render (the platform family written once) against prometheus_client's
    exposition of the same collectors: the same lines; the process's own figures may move
    between the two, so those compare without values."""
    runtime = RuntimeFamilies()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(runtime)
    fast, slow = runtime.render().decode(), generate_latest(registry).decode()
    assert [line.rsplit(" ", 1)[0] for line in fast.split("\n")] == [
        line.rsplit(" ", 1)[0] for line in slow.split("\n")
    ]
    assert "python_info{" in fast and "process_cpu_seconds_total " in fast
    moving = ("process_", "python_gc_")
    assert [ln for ln in fast.split("\n") if not ln.startswith(moving)] == [
        ln for ln in slow.split("\n") if not ln.startswith(moving)
    ]


_LABEL_NAMES = st.sampled_from(["a", "UUID", "pod", "container", "z_last", "GPU_I_ID"])
_LABEL_VALUES = st.text(
    st.characters(codec=None, exclude_categories=()), max_size=40
) | st.sampled_from(["", '"', "\\", "\n", "\ud800"])


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["g", "c_total"]),
            st.lists(st.tuples(_LABEL_NAMES, _LABEL_VALUES), max_size=6),
            st.floats(allow_nan=True, allow_infinity=True),
        ),
        max_size=12,
    )
)
def test_writer_render_is_generate_latest(rows: list[tuple[str, list[Any], float]]) -> None:
    """MetricWriter.render (each label set formatted once, cached) writes exactly what
    prometheus_client's generate_latest writes for the same writer: repeated label names,
    escapes, lone surrogates, every float, twice over (the second time from the cache)."""
    w = MetricWriter()
    w.family("g", "a gauge")
    w.family("c_total", "a counter", "counter")
    for name, labels, value in rows:
        w.sample(name, labels, value if name == "g" else abs(value))
    for _ in range(2):
        assert w.render() == generate_latest(w).decode()


async def test_memory_limit_of_the_own_cgroup(
    serve: Any, tmp_path: Path, promtools: list[str]
) -> None:
    """dcgm_enricher_memory_limit_bytes: the limit of the enricher's own cgroup (here a
    cgroup v1 container's tree), next to process_resident_memory_bytes from the same /proc."""
    _fake_proc(tmp_path / "proc", rss_pages=2048, utime=1, stime=1, fds=1)
    (tmp_path / "proc" / "self" / "cgroup").write_text("4:memory:/kubepods/pod1/abc\n")
    limit = tmp_path / "cg" / "memory" / "memory.limit_in_bytes"
    limit.parent.mkdir(parents=True)
    limit.write_text("268435456\n")
    scraper = {"own_procfs": str(tmp_path / "proc"), "own_cgroupfs": str(tmp_path / "cg")}
    text = await get_metrics(await serve(**scraper))
    assert value(text, "dcgm_enricher_memory_limit_bytes") == 256 << 20
    assert value(text, "process_resident_memory_bytes") == 2048 * mmap.PAGESIZE
    for promtool in promtools:
        res = promtool_check_metrics(promtool, text)
        assert res.returncode == 0, res.stdout + res.stderr
    # No limit: no series (an alert on the ratio has nothing to divide by).
    limit.write_text("9223372036854771712\n")
    text = await get_metrics(await serve(**scraper))
    assert "dcgm_enricher_memory_limit_bytes" not in samples(text)
