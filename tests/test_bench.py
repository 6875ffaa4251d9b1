"""The benchmark still works: its payloads have the exporter's shapes, and ``python -m bench
--quick`` runs every part through the real app and writes its JSON. Nothing here asserts a
timing: speed is the benchmark's business, on a machine chosen for it."""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from bench import payloads
from bench.node import NODE, BenchNode
from devkit.nvmlfake import FakeNvml
from devkit.tools import require_tool
from enricher.fieldtable import table
from enricher.pipeline import Scraper
from enricher.podparse import parse_pod
from enricher.procfs import ProcfsSource
from enricher.promclient import RUNTIME_PREFIXES
from enricher.simnode.api import StaticPods

from .harness import normalise
from .scraping import PER_SCRAPE

# The benchmark is a developer's tool on one Python: `make test` runs this file in the highest
# Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent

# dcgm-exporter's label order; the optional groups are MIG instances and allocated devices.
LABEL_ORDER = re.compile(
    r'\{gpu="\d+",UUID="GPU-[0-9a-f-]{36}",pci_bus_id="[0-9A-F:.]+",device="nvidia\d+",'
    r'modelName="[^"]+",(GPU_I_PROFILE="[^"]+",GPU_I_ID="\d+",)?Hostname="[^"]+",'
    r'DCGM_FI_DRIVER_VERSION="[^"]+"(,container="[^"]+",namespace="[^"]+",pod="[^"]+")?\} '
)


@pytest.mark.parametrize(
    ("shape", "series", "mig"),
    [
        pytest.param("gpu1", 40, False, id="gpu1"),
        pytest.param("node8", 400, False, id="node8"),
        pytest.param("mig56", 2520, True, id="mig56"),
        pytest.param("stress", 20160, True, id="stress"),
    ],
)
def test_payload_shapes(shape: str, series: int, mig: bool) -> None:
    text = payloads.generate(shape)
    lines = [line for line in text.split("\n") if line and not line.startswith("#")]
    assert len(lines) == series
    assert all(LABEL_ORDER.search(line) for line in lines)
    assert any("GPU_I_ID" in line for line in lines) == mig
    assert any('pod="' in line for line in lines)  # allocated devices carry pod labels
    assert any('pod="' not in line for line in lines) or shape == "gpu1"
    families = text.count("# TYPE ")
    assert text.count("# HELP ") == families == len({line.split("{")[0] for line in lines})


@pytest.mark.parametrize("shape", ["gpu1", "node8"])
def test_payloads_parse_and_differ_only_in_values(shape: str) -> None:
    one, two = payloads.generate(shape, 0), payloads.generate(shape, 1)
    parsed = [
        {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}
        for fams in (
            text_string_to_metric_families(one),
            text_string_to_metric_families(two),
        )
    ]
    assert parsed[0].keys() == parsed[1].keys()
    assert parsed[0] != parsed[1]


@pytest.mark.parametrize("naming", ["4.9", "4.10"])
def test_payloads_in_a_later_naming_are_the_same_node_in_its_names_and_units(
    naming: str,
) -> None:
    """generate(..., naming=): the table's names (enricher/dcgm_fields.json) and labels of
    that naming, the same series, each value the 4.8 body's in the naming's unit."""
    old, new = payloads.generate("mig56", 3), payloads.generate("mig56", 3, naming=naming)
    release = table().naming_first[naming]
    host, driver = table().label("host", release), table().label("driver_version", release)
    renamed_labels = {"Hostname": host, "DCGM_FI_DRIVER_VERSION": driver}

    def by_series(text: str, rename: dict[str, str]) -> dict[tuple[str, Any], tuple[Any, float]]:
        out = {}
        for f in text_string_to_metric_families(text):
            entry = table().lookup(f.name)
            assert entry is not None, f.name
            for s in f.samples:
                labels = tuple(sorted((rename.get(k, k), v) for k, v in s.labels.items()))
                out[(entry.field, labels)] = (entry, s.value)
        return out

    before, after = by_series(old, renamed_labels), by_series(new, {})
    assert before.keys() == after.keys()
    renamed = 0
    for key, (was_entry, was) in before.items():
        entry, now = after[key]
        assert entry.name == table().name(key[0], naming)
        assert math.isclose(now * entry.scale, was * was_entry.scale, rel_tol=1e-12), key
        renamed += entry.name != was_entry.name
    assert renamed


def test_pod_epochs_relabel_a_tenth_of_the_allocated_devices() -> None:
    shape = payloads.SHAPES["mig56"]
    before = {d.uuid + str(d.gi_id): d.pod for d in payloads.devices(shape, 0)}
    after = {d.uuid + str(d.gi_id): d.pod for d in payloads.devices(shape, 1)}
    changed = [k for k in before if before[k] != after[k]]
    allocated = [k for k in before if before[k] is not None]
    assert 0 < len(changed) <= len(allocated) // 10 + 1


def test_quick_benchmark_runs_every_part(tmp_path: Path) -> None:
    require_tool("gcc", "it builds the fake libnvidia-ml (.ci/system-deps)")
    out = tmp_path / "quick.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Targets" in proc.stdout  # the table was printed
    data = json.loads(out.read_text())
    assert data["mode"] == "quick"

    rewrite = data["rewrite"]["payloads"]
    assert set(rewrite) == set(payloads.SHAPES)
    for row in rewrite.values():
        assert row["series"] > 0
        assert row["rewrite_ms"] > 0 and row["limit_ms"] > 0 and row["line_by_line_ms"] > 0
    assert rewrite["mig56"]["naive_ms"] > 0

    # (new values through the template, a repeated body) expected
    rhythms = {"every_1": (True, False), "every_4": (True, True), "period_2": (None, True)}
    for rhythm, (template, repeated) in rhythms.items():
        e2e = data["e2e"][rhythm]
        targets = ["upstream", "proxy", "enricher_background", "enricher_per_scrape"]
        if rhythm.startswith("period"):
            targets.append("enricher")  # the shipped app follows a collection rhythm
        for kind in ("sequential", "concurrent3"):
            for target in targets:
                row = e2e[kind][target]
                assert row["p50_ms"] > 0
                assert row["age_max_s"] >= row["age_p50_s"] >= 0
        for name in targets[2:]:
            rewrites = e2e[f"{name}_rewrites"]
            assert rewrites["line_by_line"] >= 1
            assert set(e2e[f"{name}_inside_ms"]) >= {"rewrite", "scrape"}
            if name == "enricher":
                continue  # a quick run may end before the upstream's next collection
            # Through the real app over HTTP. With a 2 s rhythm, a quick run may see no new
            # collection at all, but the same body many times.
            if template is not None:
                assert (rewrites["template"] > 0) == template, (rhythm, name, rewrites)
            # A repeated body is the previous body's object (Scraper._fetch_upstream): with
            # the node side read in the background the scrape finds the prepared head by
            # identity and never asks the rewriter; read on every scrape, the node view is
            # new, and the rewriter gives back its last result for the same body.
            reused = repeated and name == "enricher_per_scrape"
            assert (rewrites["repeated"] > 0) == reused, (rhythm, name, rewrites)

    attribution = data["attribution"]
    assert attribution["node8"]["processes"] == attribution["node8"]["attributed"] == 64
    assert attribution["mig56"]["attributed"] == 64
    # The floors under procfs and, without MIG, under NVML: measured (no timing is compared
    # here: that is the benchmark's business).
    node8 = attribution["node8"]
    assert node8["stat_reads_floor_p50_ms"] > 0 and node8["nvml_calls_floor_p50_ms"] > 0
    assert attribution["mig56"]["nvml_calls_floor_p50_ms"] is None

    # The node side as it grows (bench/growth.py): every axis measured through the real
    # pipeline, every process attributed, a growth order for each cost (no timing compared).
    growth = data["growth"]
    assert set(growth["axes"]) == {"gpus", "procs", "pods"}
    for axis, part in growth["axes"].items():
        sizes = [row[axis] for row in part["rows"]]
        assert len(sizes) >= 2 and sizes == sorted(sizes)
        for row in part["rows"]:
            assert row["cpu_ms"] > 0 and row["held_mib"] > 0 and row["peak_mib"] > 0
            assert row["processes_seen"] == row["attributed"] == row["procs"]
        assert all(s["k"] is not None for s in part["slopes"].values())
    assert "index_build_ms" in growth["axes"]["pods"]["slopes"]
    assert "Node side growth" in proc.stdout

    memory = data["memory"]
    assert memory["churns"] >= 1
    assert set(memory["rss_mib"]) == {"start", "50", "100", "150"}
    assert memory["foreign_modules"] == ["bench"]  # no test or benchmark code but the glue
    floor = memory["floor_rss_mib"]
    # The kubernetes client and gRPC each add to what merely importing the enricher costs.
    assert 0 < floor["imports_without_kubernetes"] < floor["imports"]
    assert floor["imports"] < floor["imports_with_kubelet_grpc"]
    # Where the RSS over the floor is: the rows add up to the whole of it, within rounding, and
    # the enricher's own data is anonymous memory or the heap, which the floor barely has.
    rows = memory["rss_over_floor_by_mapping"]
    assert rows[-1]["mapping"] == "the rest"
    end = sum(row["end"] for row in rows)
    assert abs(end - memory["rss_mib"]["150"]) < 4.0, (end, memory["rss_mib"])
    over = sum(row["over_floor"] for row in rows)
    assert abs(over - (end - sum(row["floor"] for row in rows))) < 0.1
    assert {"[anon]", "[heap]"} & {row["mapping"] for row in rows[:-1]}
    assert "where the RSS over the floor" in proc.stdout

    loop = data["loop"]
    for kind in ("values", "labels"):
        for design in ("worker", "on_loop"):
            row = loop[f"{kind}_{design}"]
            assert row["busy"]["n"] > 0 and row["idle"]["n"] > 0
            assert row["busy"]["max_ms"] >= row["busy"]["p50_ms"] > 0
        assert loop[f"{kind}_max_ratio"] > 0
    assert loop["values_worker"]["rewrites"]["template"] > 0
    assert loop["labels_worker"]["rewrites"]["template"] == 0
    assert "Event loop" in proc.stdout

    # Every source on in the memory run: the kubelet's PodResources answered over gRPC.
    assert memory["kubelet_calls"] >= 1

    cost = data["cost"]
    for name in ("proxy", "enricher"):
        row = cost[name]
        assert row["scrapes"] > 0 and row["cpu_s"] >= 0
        assert row["wire_bytes"] > 0 and row["body_bytes"] >= row["wire_bytes"]
    # The scrapers ask for gzip: the enricher answers with it on every scrape, the plain
    # proxy never (it passes the identity body on).
    assert cost["enricher"]["gzip"] == cost["enricher"]["scrapes"]
    assert cost["proxy"]["gzip"] == 0
    assert cost["proxy"]["upstream_requests"] >= cost["proxy"]["scrapes"] > 0
    assert 0 < cost["gzip_fraction"] < 1
    assert "Cost to the node" in proc.stdout

    assert {t["name"] for t in data["targets"]} >= {
        "rewrite mig56 vs naive",
        "rewrite mig56 vs limit",
        "attribution 64 procs / 8 GPUs",
        "RSS",
        "attribution 64 procs / 8 GPUs vs bare /proc reads",
        "RSS over the import floor, every source on",
        "RSS drift 50 -> 150",
        "CPU enricher / proxy, same scrapes",
        "upstream requests per collection, steady",
        "bytes on the wire, gzip / identity body, mig56",
    }


def _without_self_metrics(body: bytes) -> str:
    # Our own health series differ in durations and request counts by design, and the
    # process's own figures (process_*, python_*) from one moment to the next; the idle-since
    # timestamps are each NVML read's own time (normalise marks them).
    lines = body.decode().split("\n")
    return normalise(
        "\n".join(
            line
            for line in lines
            if "dcgm_enricher_" not in line and not line.startswith(RUNTIME_PREFIXES)
        )
    )


@pytest.mark.parametrize(
    ("collect_interval", "follow_step"),
    [
        pytest.param(0.0, 0.1, id="default-following"),
        pytest.param(30.0, 0.0, id="node-in-background"),
        pytest.param(30.0, 0.05, id="following-node-in-background"),
    ],
)
async def test_background_modes_serve_what_the_app_serves(
    tmp_path: Path, fake_nvml: FakeNvml, collect_interval: float, follow_step: float
) -> None:
    """Following the upstream (the default), --collect.interval and their mix move work off
    the scrape path and change nothing in what a scrape returns: same upstream rewrite, same
    families as reading everything on the scrape."""
    sim = BenchNode(tmp_path, payloads.SHAPES["node8"])
    sim.write()
    fake_nvml.write(sim.nvml())
    text = payloads.generate("node8")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    upstream_app = web.Application()
    upstream_app.router.add_get("/metrics", metrics)
    async with TestServer(upstream_app) as server:
        config = replace(
            PER_SCRAPE,
            upstream_url=str(server.make_url("/metrics")),
            kube_node_name=NODE,
            kubelet_pod_resources_socket="",
        )
        pods = StaticPods([parse_pod(o) for o in sim.pod_objects()])
        plain = Scraper(
            config,
            nvml=fake_nvml.source(),
            procfs=ProcfsSource(str(sim.proc_root)),
            kubernetes=pods,
        )
        proposed = Scraper(
            replace(config, collect_interval=collect_interval, upstream_follow_step=follow_step),
            nvml=fake_nvml.source(),
            procfs=ProcfsSource(str(sim.proc_root)),
            kubernetes=pods,
        )
        try:
            want = _without_self_metrics((await plain.scrape()).body)
            got = _without_self_metrics((await proposed.scrape()).body)
            assert got == want
            assert 'pod="worker-' in got  # device series name the pods NVML saw
            if collect_interval:  # the next scrape: from what the background keeps ready
                assert _without_self_metrics((await proposed.scrape()).body) == want
        finally:
            await plain.close()
            await proposed.close()


_BREAKDOWN_PROBE = """
import asyncio, json
from bench import payloads
from bench.breakdown import CpuBreakdown
cpu = CpuBreakdown()
cpu.install()  # every path in FUNCTIONS must exist
from enricher.compress import GzipHead
from enricher.labels import RewritePlan
from enricher.rewrite import Rewriter
async def work():
    text = payloads.generate("mig56")
    for _ in range(3):
        GzipHead(Rewriter().rewrite(text, RewritePlan()).text.encode()).finish(b"")
asyncio.run(work())
print(json.dumps(cpu.report()))
"""


def test_cpu_breakdown_counts_the_pipeline_by_part() -> None:
    """bench.breakdown (``python -m bench --only cost --breakdown``) wraps the functions it
    names (a name the code lost fails the install) and the event loop's callbacks, in a
    process of its own (it replaces them for the whole process)."""
    proc = subprocess.run(
        [sys.executable, "-c", _BREAKDOWN_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    functions = report["functions"]
    assert functions["rewrite"] > 0 and functions["gzip of a collection's body"] > 0
    assert "gzip of each scrape's tail" in functions
    # The whole coroutine ran as one task: its time is the loop's, and holds the functions'.
    assert report["loop"]["task work"] >= functions["rewrite"]


SMAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 08:01 131 /usr/bin/python3.11
Size:                132 kB
Rss:                 128 kB
VmFlags: rd mr mw me sd
55d0c1000000-55d0c1400000 rw-p 00000000 00:00 0 [heap]
Rss:                4096 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Rss:                1000 kB
7f0000100000-7f0000200000 rw-p 00000000 00:00 0
Rss:                  24 kB
7f0000200000-7f0000300000 r-xp 00000000 08:01 77 /opt/venv/lib/cygrpc.cpython-311.so
Rss:                 512 kB
7f0000300000-7f0000301000 r--p 00001000 08:01 77 /opt/venv/lib/cygrpc.cpython-311.so
Rss:                   4 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
Rss:                  80 kB
"""


def test_rss_by_mapping_groups_smaps() -> None:
    """The memory part's breakdown of RSS: files by base name (each of a library's mappings
    added up), the kernel's named regions as named, nameless ones as anonymous."""
    from bench.memory import parse_smaps, rss_over_floor

    got = parse_smaps(SMAPS)
    assert got == {
        "python3.11": 128,
        "[heap]": 4096,
        "[anon]": 1024,
        "cygrpc.cpython-311.so": 516,
        "[stack]": 80,
    }
    floor = {"python3.11": 128, "[heap]": 1024, "[anon]": 1024, "[stack]": 80}
    rows = rss_over_floor(floor, floor, got, top=2)
    assert [r["mapping"] for r in rows] == ["[heap]", "cygrpc.cpython-311.so", "the rest"]
    assert rows[0] == {
        "mapping": "[heap]",
        "floor": 1.0,
        "start": 1.0,
        "end": 4.0,
        "over_floor": 3.0,
    }
    assert rows[2]["over_floor"] == 0.0 and rows[2]["end"] == round((128 + 1024 + 80) / 1024, 2)


# --------------------------------------------------------------------------- the tree's layout

TOPS = ("enricher", "devkit", "bench", "tools", "tests")
# A line that starts an import statement, at any indentation (imports inside functions count).
_IMPORT_LINE = re.compile(r"^[ \t]*((?:from[ \t]+[\w.]+[ \t]+)?import[ \t].*)$", re.MULTILINE)


def import_statements(text: str) -> str:
    """The import statements of a module's text, each at module level: what the import graph
    reads, at a tenth of the cost of parsing the whole tree. Those under ``if TYPE_CHECKING:``
    count too (as the package's type-only check counts them); a line that only looks like one
    (prose in a string) does not parse and is left out."""
    out: list[str] = []
    for match in _IMPORT_LINE.finditer(text):
        statement = match.group(1)
        if statement.rstrip().endswith("("):  # a parenthesised list: up to its closing paren
            statement += text[match.end() : text.index(")", match.end()) + 1]
        try:
            ast.parse(statement)
        except SyntaxError:
            continue
        out.append(statement)
    return "\n".join(out)


def tree_import_graph() -> dict[str, set[str]]:
    """Edges module -> module it imports, over every module of the package, the kit, the
    bench, the tools and the tests (tests/test_structure.py's reading of imports)."""
    from .test_structure import import_graph, module_name

    sources = {
        module_name(p): (import_statements(p.read_text()), p.name == "__init__.py")
        for top in TOPS
        for p in sorted((ROOT / top).rglob("*.py"))
        if not {"proto", "_build", "fixtures"} & set(p.relative_to(ROOT).parts)
    }
    return import_graph(sources, TOPS)


def test_no_import_cycle_in_the_tree_and_the_bench_and_tools_stand_apart() -> None:
    """No import circle anywhere (bench, tools, kit and tests included); the bench imports
    nothing from the tests, the tools nothing from the tests or the bench, the kit nothing
    but the package; and the bench's parts never import its runner back."""
    from .test_structure import find_cycle

    graph = tree_import_graph()
    assert {"bench.run", "bench.rewrite", "tools.load", "devkit.kubeapi"} <= set(graph)
    assert "bench.rewrite" in graph["bench.run"] and "devkit.ports" in graph["tests.harness"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())
    crossing = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if (name.startswith("bench") and target.startswith("tests"))
        or (name.startswith("tools") and target.split(".")[0] in ("tests", "bench"))
        or (name.startswith("devkit") and target.split(".")[0] in ("tests", "bench", "tools"))
        or (name not in ("bench.run", "bench.__main__") and target == "bench.run")
    )
    assert crossing == []
