"""The fleet benchmark's harness stays honest (``python -m bench --only fleet --quick``): a
small fleet (8 simulated nodes, ten minutes of blocks and one live scrape) goes through
promtool's backfill (the series, then the shipped recording rules over them) into a real
Prometheus 3.5 that runs the shipped rules, every dashboard query and alert expression answers,
and the panels that read records answer as their old forms did. No timing is asserted: the
figures are the benchmark's (bench/README.md, docs/performance.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench import fleet
from devkit.dashboard import BOARDS, board_queries, queries
from devkit.tools import require_tool

from .promreleases import releases, require

pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent


def test_every_node_is_renamed_and_churns() -> None:
    """Many nodes from one rendered body: each has its own Hostname, GPU UUIDs and pods, the
    target labels Prometheus adds, and its pods get new names when its generation moves."""
    text = (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0d1e2f3a-4b5c",Hostname="dcgm-exporter-demo",'
        'pod="train-0",pod_uid="u-1"} 63\n'
        "# TYPE dcgm_enricher_scrapes_total counter\n"
        "dcgm_enricher_scrapes_total 10\n"
    )
    later = text.replace(" 63\n", " 70\n").replace(" 10\n", " 14\n")
    body = fleet.parse_bodies("demo", [text, later])
    f = fleet.Fleet({"demo": body, "node8": body}, nodes=2)
    a = f.heads(0, 0, with_target=True)
    b = f.heads(1, 0, with_target=True)
    assert a != b
    assert 'Hostname="gpu-node-0000"' in a[0] and 'Hostname="gpu-node-0001"' in b[0]
    assert 'UUID="GPU-00002f3a-4b5c"' in a[0] and 'UUID="GPU-00012f3a-4b5c"' in b[0]
    assert 'pod="train-0-n0g0"' in a[0] and 'pod_uid="u-1-n0g0"' in a[0]
    assert 'cluster="east"' in a[0] and 'job="dcgm-enricher"' in a[0]
    assert 'node="gpu-node-0000"' in a[1]
    assert 'pod="train-0-n0g1"' in f.heads(0, 1, with_target=True)[0]
    # Gauges cycle through the rendered values; counters keep growing.
    assert [f.values(0, j)[0] for j in range(3)] == [63.0, 70.0, 63.0]
    assert [f.values(0, j)[1] for j in range(3)] == [10.0, 14.0, 18.0]
    assert f.generation(0, 0) != f.generation(0, fleet.CHURN_S)


def test_small_fleet(tmp_path: Path) -> None:
    require(releases()[1])
    require_tool("gcc", "make system-deps")
    out = tmp_path / "fleet.json"
    subprocess.run(
        [sys.executable, "-m", "bench", "--only", "fleet", "--quick", "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())["fleet"]
    assert result["nodes"] == fleet.FLEET_QUICK.nodes
    assert result["history_samples"] > 0
    assert result["ingest"]["head_series"] > 0
    assert result["ingest"]["samples_appended"] > 0
    # Every rule group of the shipped file was evaluated, without an error.
    doc = yaml.safe_load(fleet.RULES.read_text())
    groups = {g["name"]: g for g in result["rule_groups"]}
    assert set(groups) == {g["name"] for g in doc["groups"]}
    assert all(g["last_error"] is None and g["evaluation_ms"] > 0 for g in groups.values())
    # Every dashboard query and alert expression answered; the panels of GPU series have data.
    panels = {r["id"]: r for r in result["panels"]}
    assert set(panels) == {q.id for q in queries()}
    assert panels["node/Health and taints/GPU utilization/A"]["series"] > 0
    assert panels["namespace/Pods/GPU memory by pod/A"]["series"] > 0
    # Each dashboard opened with its default variables: the scope's first value, and every
    # panel counted (a panel that reads what the fleet has gets series).
    boards = {b["board"]: b for b in result["boards"]}
    assert list(boards) == list(BOARDS)
    assert boards["node"]["variables"] == {"node": "gpu-node-0000"}
    assert boards["pod"]["variables"]["namespace"] == boards["namespace"]["variables"]["namespace"]
    assert boards["pod"]["variables"]["pod"]
    for board in BOARDS:
        shown = {f"{q.row}/{q.panel}" for q in board_queries(board)}
        assert set(boards[board]["series"]) == shown, board
        assert boards[board]["max_series"] > 0 and boards[board]["ratio"] > 0, board
    assert {r["id"] for r in result["alerts"]} == {
        r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r
    }
    assert result["baseline"]["range"]["p50_ms"] > 0
    # The records are backfilled over the history, and the panels that read them answer what
    # their old forms (joins at every step) answered.
    assert result["record_blocks"] > 0
    assert {r["id"].removesuffix(" (before)") for r in result["before"]} == set(fleet.BEFORE)
    assert all(r["same_answer"] for r in result["before"]), result["before"]
    assert re.fullmatch(r"\d+(\.\d+)?", str(result["dashboard_load"]["wall_ms"]))
