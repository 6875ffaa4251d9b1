"""The demo tells the truth about its own simulated node.

The demo is the first thing a newcomer sees, so its numbers must add up as a real node's do:
a device's used memory (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_RESERVED) is the memory of its
processes, the driver's reservation and what the story declares no listed process holds, a
GPU nobody computes on shows zero utilization, the node page shows the figures /metrics
serves, and `ps` and `resolve` work against a running demo as docs/commands.md shows.
Everything below the enricher is SIMULATED (there is no GPU or cluster here): the GPUs, the
dcgm-exporter, the kubelet, /proc and the pods of enricher.demo.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enricher import demo
from enricher.config import Config
from enricher.landing import MIB

from .harness import cli, demo_process

ROOT = Path(__file__).resolve().parent.parent
# A moment at the start of one of the simulated dcgm-exporter's collections.
T0 = 1_800_000_000.0
DeviceKey = tuple[str, str]  # (UUID, GPU_I_ID)


def collected(t: float) -> float:
    """When the SIMULATED dcgm-exporter's collection serving ``t`` was made."""
    return demo.collected_at(t, demo.UPSTREAM_COLLECT_INTERVAL)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


def by_device(text: str, name: str) -> dict[DeviceKey, float]:
    """The sum of ``name``'s samples per device (UUID, GPU_I_ID)."""
    out: dict[DeviceKey, float] = defaultdict(float)
    for labels, value in samples(text, name):
        out[(labels["UUID"], labels.get("GPU_I_ID", ""))] += value
    return dict(out)


@pytest.mark.parametrize("t", [T0, T0 + 37.5, T0 + 600, T0 + 3 * 3600 + 11])
def test_device_memory_is_its_processes_memory(t: float) -> None:
    """FB_USED of every GPU and MIG instance is what the SIMULATED NVML lists for its
    processes at the same moment, each counted once (the defect: twice on a GPU without MIG),
    in whole MiB rounded up, plus what the story says no listed process holds; FB_RESERVED is
    the driver's on each whole GPU, and the three fields make the board's total."""
    nvml = demo.demo_gpus(lambda: t).fetch()
    listed: dict[DeviceKey, float] = defaultdict(float)
    for p in nvml.processes:
        listed[(p.gpu_uuid, "" if p.gi_id is None else str(p.gi_id))] += p.used_memory_bytes or 0
    served = demo.render_upstream(demo.demo_gpus(lambda: t), collected(t))
    used = by_device(served, "DCGM_FI_DEV_FB_USED")
    reserved = by_device(served, "DCGM_FI_DEV_FB_RESERVED")
    free = by_device(served, "DCGM_FI_DEV_FB_FREE")
    index = {g.uuid: g.index for g in demo.GPUS}
    for key, mib in used.items():
        gi = int(key[1]) if key[1] else None
        unlisted = demo.UNLISTED_MIB.get((index[key[0]], gi), 0)
        assert mib == -(-listed.get(key, 0) // MIB) + unlisted, key
        assert reserved[key] == (0 if key[1] else demo.DRIVER_RESERVED_MIB), key
        if not key[1]:
            assert mib + reserved[key] + free[key] == 81_920, key
    # Every device with a process reports its memory: none is left out of the comparison.
    assert set(listed) <= set(used)


def test_zero_utilization_stays_zero() -> None:
    """The allocated idle GPU and the finished job's GPU report 0 % (the defect: 30 %), and a
    shared GPU's utilization is the sum of its processes' (the MPS server computes nothing)."""
    gpus = demo.demo_gpus()
    for t in (T0, T0 + 15, T0 + 200):
        served = demo.render_upstream(gpus, t)
        util = {labels["gpu"]: value for labels, value in samples(served, "DCGM_FI_DEV_GPU_UTIL")}
        assert util["5"] == 0 and util["6"] == 0, util
        on_4 = sum(gpus.proc_util(p, t) or 0 for p in demo.PROCS if p.gpu == 4)
        assert util["4"] == round(100 * on_4)


@pytest.fixture
async def frozen_demo(tmp_path: Path) -> Any:
    """The demo's real enricher over its SIMULATED node, with the node's clock stopped at T0:
    the simulated dcgm-exporter and NVML then report the same moment on every request."""
    socket_path = tmp_path / "pod-resources" / "kubelet.sock"
    socket_path.parent.mkdir()
    _scraper, runners, kubelet = await demo.start_demo(
        Config(listen_address="127.0.0.1:0"), tmp_path / "proc", socket_path, clock=lambda: T0
    )
    port = runners[0].addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for runner in runners:
            await runner.cleanup()
        kubelet.stop()


async def test_served_memory_adds_up_and_the_page_shows_it(frozen_demo: str) -> None:
    """Through the real enricher: on every device, its containers' memory plus its
    unattributed memory (the driver's reservation and what no listed process holds included)
    is FB_USED + FB_RESERVED to the byte; the node page shows that and each container's
    memory as /metrics has them; the finished job's container is at zero utilization."""
    async with aiohttp.ClientSession() as session:
        async with session.get(frozen_demo + "/metrics") as r:
            text = await r.text()
        async with session.get(frozen_demo + "/") as r:
            page = await r.text()
    fb_used = by_device(text, "DCGM_FI_DEV_FB_USED")
    fb_reserved = by_device(text, "DCGM_FI_DEV_FB_RESERVED")
    held = by_device(text, "gpu_container_memory_used_bytes")
    unattributed = by_device(text, "gpu_unattributed_memory_used_bytes")
    for key, mib in fb_used.items():
        accounted = held.get(key, 0.0) + unattributed.get(key, 0.0)
        assert (mib + fb_reserved[key]) * MIB == accounted, (key, mib, accounted / MIB)
    reasons = {
        labels["reason"]: value
        for labels, value in samples(text, "gpu_unattributed_memory_used_bytes")
        if labels["gpu"] == "5"
    }
    assert reasons == {"driver_reserved": 512 * MIB, "not_in_process_list": 1536 * MIB}
    idle = [
        value
        for labels, value in samples(text, "gpu_container_utilization_ratio")
        if labels["pod"] == "llama-eval-7xq2m"
    ]
    assert idle == [0.0]

    # The page: each device's "<used> of <total> used" and each container row's memory.
    def shown(n: float) -> str:
        return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / MIB:.0f} MiB"

    fb_free = by_device(text, "DCGM_FI_DEV_FB_FREE")
    for key, mib in fb_used.items():
        in_use = mib + fb_reserved[key]
        line = f"{shown(in_use * MIB)} of {shown((in_use + fb_free[key]) * MIB)} used"
        assert line in page, (key, line)
    # The parts no process makes up, as rows of their own.
    assert "<code>driver_reserved</code>" in page
    assert "<code>not_in_process_list</code>" in page
    # One table row per container on a device: its memory cell, then its pod cell.
    row_re = re.compile(
        r"<td class='mem'>.*?<span class='num'>([^<]*)</span>.*<td class='pod'>([^<]*)<"
    )
    page_rows = {m.groups() for row in page.split("<tr>") if (m := row_re.search(row))}
    served_rows = {
        (shown(value), labels["pod"])
        for labels, value in samples(text, "gpu_container_memory_used_bytes")
    }
    assert served_rows <= page_rows


# --------------------------------------------------------------------------- a running demo


def run(command: str) -> subprocess.CompletedProcess[str]:
    """A printed ``dcgm-enricher ...`` command line, run as the user runs it."""
    program, *args = command.split()
    assert program == "dcgm-enricher"
    return cli(*args)


def test_ps_and_resolve_against_a_running_demo(tmp_path: Path) -> None:
    """The ps and resolve lines the demo prints work, agree with its /metrics, and are the
    ones docs/commands.md shows; resolve's exit status says whether every PID resolved."""
    with demo_process(tmp_path) as running:
        check_ps_and_resolve(running.url, running.printed())


def check_ps_and_resolve(url: str, printed: str) -> None:
    commands = re.findall(r"^\s+(dcgm-enricher (?:ps|resolve) .*)$", printed, re.MULTILINE)
    assert len(commands) == 2, printed
    ps_line, resolve_line = commands
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    served = {
        (labels["gpu"], labels.get("GPU_I_ID", ""), labels["pod"], labels["container"])
        for labels, _ in samples(text, "gpu_container_memory_used_bytes")
    }

    ps = run(ps_line)
    assert ps.returncode == 0, ps.stderr
    header, *rows = ps.stdout.splitlines()
    cols = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()

    def cell(row: str, name: str) -> str:
        i = names.index(name)
        end = cols[i + 1] if i + 1 < len(cols) else None
        return row[cols[i] : end].strip()

    listed = {
        (cell(r, "GPU"), cell(r, "GI"), cell(r, "POD"), cell(r, "CONTAINER"))
        for r in rows
        if not r.startswith("#") and cell(r, "POD")
    }
    assert listed == served
    assert ps.stderr == ""

    resolved = run(resolve_line)
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    by_pid = {int(cell(r, "PID")): r for r in rows if not r.startswith("#")}
    for line in resolved.stdout.splitlines():
        rec = json.loads(line)
        assert rec.get("pod", "") == cell(by_pid[rec["pid"]], "POD"), rec

    # A PID that is not on the node: resolve says so, and its exit status too.
    missing = run(resolve_line + " 424242")
    assert missing.returncode == 1
    assert json.loads(missing.stdout.splitlines()[-1]) == {
        "pid": 424242,
        "error": "process_exited",
    }

    # docs/commands.md shows these very commands (the demo's temporary folder as XXXXXXXX).
    doc = (ROOT / "docs" / "commands.md").read_text()
    for line in (ps_line, resolve_line):
        shown = re.sub(r"dcgm-enricher-demo-[^/]+/", "dcgm-enricher-demo-XXXXXXXX/", line)
        assert shown in doc, shown


def test_ps_refuses_without_nvml_and_demo_needs_its_procfs() -> None:
    """`ps --no-nvml.enabled` is refused with a clear message (it used to read NVML anyway);
    `--demo` without the demo's /proc tree says what to pass."""
    no_nvml = run("dcgm-enricher ps --no-nvml.enabled")
    assert no_nvml.returncode == 2
    assert "cannot run with --no-nvml.enabled" in no_nvml.stderr
    no_tree = run("dcgm-enricher ps --demo")
    assert no_tree.returncode == 2
    assert "--path.procfs" in no_tree.stderr


def test_a_taken_port_ends_with_the_clear_error_alone() -> None:
    """The demo on a port in use prints one line saying so, and nothing about unclosed
    sessions (its enricher's upstream client is closed before it exits)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run(f"dcgm-enricher demo --web.listen-address 127.0.0.1:{port}")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"dcgm-enricher demo: cannot listen on 127.0.0.1:{port}: ")
    assert "Unclosed" not in res.stderr + res.stdout
