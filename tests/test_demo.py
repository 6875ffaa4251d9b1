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

import asyncio
import base64
import io
import json
import math
import os
import re
import shlex
import socket
import ssl
import subprocess
import time
import urllib.request
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enricher import demo
from enricher.cli import parse_config
from enricher.commands import ps
from enricher.config import Config
from enricher.fieldtable import table
from enricher.landing import MIB
from enricher.simnode.dialects import NEWEST, dialect
from enricher.simnode.exporter import DRIVER_RESERVED_MIB
from enricher.simnode.gpus import POWER_MODELS, UPTIME_AT_START, SimulatedGpus, power_model
from enricher.simnode.node import SimNode

from .certs import bcrypt_hash, make_pki
from .harness import CHECKOUT, cli, demo_process

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


def field_samples(
    text: str, field: str, version: str, unit: float = 1.0
) -> list[tuple[dict[str, str], float]]:
    """The samples of ``field`` (a key of enricher/dcgm_fields.json) under its name in release
    ``version``, each value in ``unit`` (1.0: SI)."""
    entry = table().field(field).by_naming[dialect(version).naming]
    return [(labels, v * entry.scale / unit) for labels, v in samples(text, entry.name)]


def field_by_device(text: str, field: str, version: str, unit: float) -> dict[DeviceKey, float]:
    out: dict[DeviceKey, float] = defaultdict(float)
    for labels, value in field_samples(text, field, version, unit):
        out[(labels["UUID"], labels.get("GPU_I_ID", ""))] += value
    return dict(out)


# The last release of the 4.8 naming (memory in MiB, utilization in percent), and the demo's
# default, the newest (memory in bytes, utilization as a ratio).
VERSIONS = ["4.8.4", NEWEST]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("t", [T0, T0 + 37.5, T0 + 600, T0 + 3 * 3600 + 11])
def test_device_memory_is_its_processes_memory(t: float, version: str) -> None:
    """FB_USED of every GPU and MIG instance is what the SIMULATED NVML lists for its
    processes at the same moment, each counted once (the defect: twice on a GPU without MIG),
    in whole MiB rounded up, plus what the story says no listed process holds; FB_RESERVED is
    the driver's on each whole GPU, and the three fields make the board's total."""
    nvml = demo.demo_gpus(lambda: t).fetch()
    listed: dict[DeviceKey, float] = defaultdict(float)
    for p in nvml.processes:
        listed[(p.gpu_uuid, "" if p.gi_id is None else str(p.gi_id))] += p.used_memory_bytes or 0
    served = demo.render_upstream(demo.demo_gpus(lambda: t), collected(t), version)
    used = field_by_device(served, "fb_used", version, MIB)
    reserved = field_by_device(served, "fb_reserved", version, MIB)
    free = field_by_device(served, "fb_free", version, MIB)
    index = {g.uuid: g.index for g in demo.GPUS}
    for key, mib in used.items():
        gi = int(key[1]) if key[1] else None
        unlisted = demo.UNLISTED_MIB.get((index[key[0]], gi), 0)
        assert mib == -(-listed.get(key, 0) // MIB) + unlisted, key
        assert reserved[key] == (0 if key[1] else DRIVER_RESERVED_MIB), key
        if not key[1]:
            assert mib + reserved[key] + free[key] == 81_920, key
    # Every device with a process reports its memory: none is left out of the comparison.
    assert set(listed) <= set(used)


@pytest.mark.parametrize("version", VERSIONS)
def test_zero_utilization_stays_zero(version: str) -> None:
    """The allocated idle GPU and the finished job's GPU report 0 % (the defect: 30 %), and a
    shared GPU's utilization is the sum of its processes' (the MPS server computes nothing)."""
    gpus = demo.demo_gpus()
    for t in (T0, T0 + 15, T0 + 200):
        served = demo.render_upstream(gpus, t, version)
        util = {
            labels["gpu"]: round(value, 9)
            for labels, value in field_samples(served, "gpu_util", version, 0.01)
        }
        assert util["5"] == 0 and util["6"] == 0, util
        on_4 = sum(gpus.proc_util(p, t) or 0 for p in demo.PROCS if p.gpu == 4)
        assert util["4"] == round(100 * on_4)


# --------------------------------------------------------------------------- the physics

NOTEBOOK = next(p for p in demo.PROCS if p.pod is demo.JUPYTER)
# Two power swings (300 s each), every 2 s from before the demo started to after the
# notebook's stop.
SWINGS = [T0 - 60 + 2 * i for i in range(300)]


def test_power_stays_within_each_models_limit() -> None:
    """No GPU draws more than its model's power limit (the defect: an A100-SXM4-80GB, limit
    400 W, at 438 W), and a fully loaded one reaches it: the power brake, not a scale-down,
    keeps it there. Every model the simulated nodes use, on the demo's loads."""
    for name, model in POWER_MODELS.items():
        gpus = [replace(g, name=name) for g in demo.GPUS]
        sim = SimulatedGpus(
            SimNode(demo.NODE, tuple(gpus), demo.MIGS, demo.PROCS, demo.PODS), lambda: T0
        )
        top = {g.index: max(sim.power_watts(g.index, t) for t in SWINGS) for g in gpus}
        assert max(top.values()) == model.limit_watts, (name, top)
        assert min(top.values()) == model.idle_watts, (name, top)  # GPU 5: nothing runs


def test_an_idle_notebooks_gpu_draws_idle_power() -> None:
    """Once the notebook stops computing (two minutes in), its GPU draws its model's idle
    power, as the GPUs nobody computes on do (the defect: 118 W against their 60 W)."""
    gpus = demo.demo_gpus(lambda: T0)
    idle = power_model(demo.GPUS[NOTEBOOK.gpu].name).idle_watts
    assert NOTEBOOK.busy_for is not None
    stop = T0 + NOTEBOOK.busy_for
    assert all(gpus.power_watts(NOTEBOOK.gpu, t) > idle for t in (T0, stop - 1))
    assert {gpus.power_watts(NOTEBOOK.gpu, t) for t in (stop, stop + 77, stop + 86_400)} == {idle}
    assert gpus.power_watts(5, T0) == idle  # the allocated idle GPU: no process at all


def test_energy_counts_from_boot_and_is_the_power_drawn() -> None:
    """DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION ("since boot", mJ) starts at 0 when the SIMULATED
    node booted, a day before the demo started, as its /proc/stat says (the defect: power
    times Unix time, 160 MWh), and grows by exactly the energy the power draws, across the
    notebook's stop and the power brake (a numerical integral of power_watts)."""
    gpus = demo.demo_gpus(lambda: T0)
    assert gpus.booted == T0 - UPTIME_AT_START
    for gpu in demo.GPUS:
        i = gpu.index
        model = power_model(gpu.name)
        assert gpus.energy_millijoules(i, gpus.booted) == 0.0
        at_start = gpus.energy_millijoules(i, T0) / 1000  # joules
        assert model.idle_watts * UPTIME_AT_START <= at_start <= model.limit_watts * UPTIME_AT_START
        a, b, n = T0 + 60, T0 + 420, 3600  # 0.1 s steps, the notebook's stop in between
        h = (b - a) / n
        drawn = sum(gpus.power_watts(i, a + (k + 0.5) * h) for k in range(n)) * h
        counted = (gpus.energy_millijoules(i, b) - gpus.energy_millijoules(i, a)) / 1000
        assert math.isclose(counted, drawn, rel_tol=1e-6), (i, counted, drawn)


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
    # The frozen demo's exporter speaks the default release (each field in its unit there).
    fb_used = field_by_device(text, "fb_used", NEWEST, MIB)
    fb_reserved = field_by_device(text, "fb_reserved", NEWEST, MIB)
    assert fb_used and fb_reserved
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

    fb_free = field_by_device(text, "fb_free", NEWEST, MIB)
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
    # One name for the node: the page's, the simulated dcgm-exporter's host label (the defect:
    # its pod's name, dcgm-exporter-demo) and the enricher's node label.
    (named,) = re.findall(r"<h1>GPUs on ([^<]+)</h1>", page)
    hosts = {
        (labels.get("hostname", labels.get("Hostname")), labels["node"])
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("DCGM_FI_")
        for labels in [s.labels]
    }
    assert hosts == {(named, named)}, hosts


async def test_ps_the_page_and_metrics_read_one_clock(tmp_path: Path) -> None:
    """ps --demo (its sources as the CLI makes them from the demo's /proc tree), /metrics and
    the node page say the same of the notebook at each moment: computing at first, then, once
    it stops two minutes into the demo, at 0 % on its GPU, which draws idle power, and idle
    since the series' gpu_container_last_active_timestamp_seconds on the page (the defects:
    ps counted busy_for from its own start and showed 12 %; the GPU stayed at 118 W; the page
    said nothing of idleness)."""
    now = [T0]
    socket_path = tmp_path / "pod-resources" / "kubelet.sock"
    socket_path.parent.mkdir()
    proc = tmp_path / "proc"
    _scraper, runners, kubelet = await demo.start_demo(
        Config(listen_address="127.0.0.1:0"), proc, socket_path, clock=lambda: now[0]
    )
    url = f"http://127.0.0.1:{runners[0].addresses[0][1]}"
    idle_watts = power_model(demo.GPUS[NOTEBOOK.gpu].name).idle_watts
    _, config, _ = parse_config(["ps", "--demo", "--path.procfs", str(proc)])
    # What ps --demo reads, as the CLI makes it, on the test's clock instead of the wall's.
    ps_config, gpus, pods = demo.looking_at(config, lambda: now[0])
    try:
        async with aiohttp.ClientSession() as session:
            for t in (T0 + 30, T0 + 300):
                now[0] = t
                # The enricher follows the simulated exporter: wait for its collection at t.
                draw = round(gpus.power_watts(0, t), 3)
                deadline = time.monotonic() + 30
                while True:
                    async with session.get(url + "/metrics") as r:
                        text = await r.text()
                    got = field_samples(text, "power", NEWEST)
                    if [v for lb, v in got if lb["gpu"] == "0"] == [draw]:
                        break
                    assert time.monotonic() < deadline, "no collection at the moved clock"
                    await asyncio.sleep(0.1)
                async with session.get(url + "/") as r:
                    page = await r.text()
                out = io.StringIO()
                # ps is a command: it runs its own event loop, so not on this one.
                assert await asyncio.to_thread(ps, ps_config, out, pods, gpus) == 0
                row = next(r for r in out.getvalue().splitlines() if "jupyter-alice" in r)
                (served,) = (
                    v
                    for labels, v in samples(text, "gpu_container_utilization_ratio")
                    if labels["pod"] == "jupyter-alice"
                )
                assert row.split()[4] == f"{served * 100:.0f}%", (t, row, served)
                watts = {lb["gpu"]: v for lb, v in field_samples(text, "power", NEWEST)}
                (since,) = (
                    v
                    for labels, v in samples(text, "gpu_container_last_active_timestamp_seconds")
                    if labels["pod"] == "jupyter-alice"
                )
                stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
                notebook_row = next(r for r in page.split("<tr>") if "jupyter-alice" in r)
                if t == T0 + 30:
                    assert served > 0 and watts[str(NOTEBOOK.gpu)] > idle_watts
                    assert since == t and "idle since" not in notebook_row, notebook_row
                else:
                    assert served == 0 and watts[str(NOTEBOOK.gpu)] == idle_watts
                    assert since == T0 + 30
                    assert f"idle since {stamp}" in notebook_row, notebook_row
    finally:
        for runner in runners:
            await runner.cleanup()
        kubelet.stop()


async def test_the_demo_honours_its_web_config(tmp_path: Path) -> None:
    """`demo --web.config.file` serves as the file says, as serve does (it used to serve plain
    HTTP without a word): TLS with the file's certificate, basic auth on /metrics, and the
    printed URL says https."""
    pki = make_pki(tmp_path / "pki")
    web_config = tmp_path / "web.yml"
    web_config.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  alice: '{bcrypt_hash(b'secret')}'\n"
    )
    socket_path = tmp_path / "pod-resources" / "kubelet.sock"
    socket_path.parent.mkdir()
    config = Config(listen_address="127.0.0.1:0", web_config_file=str(web_config))
    _scraper, runners, kubelet = await demo.start_demo(
        config, tmp_path / "proc", socket_path, clock=lambda: T0
    )
    port = runners[0].addresses[0][1]
    assert demo.demo_url(replace(config, listen_address=f"127.0.0.1:{port}")).startswith("https:")
    tls = ssl.create_default_context(cafile=str(pki.ca))
    try:
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{port}/metrics"
            async with session.get(url, ssl=tls) as r:
                assert r.status == 401
            auth = {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()}
            async with session.get(url, ssl=tls, headers=auth) as r:
                assert r.status == 200 and "gpu_container_memory_used_bytes" in await r.text()
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/metrics", headers=auth) as r:
                    await r.read()
    finally:
        for runner in runners:
            await runner.cleanup()
        kubelet.stop()


# --------------------------------------------------------------------------- a running demo


def run(command: str) -> subprocess.CompletedProcess[str]:
    """A ``dcgm-enricher ...`` command line of the docs, run from this checkout."""
    program, *args = command.split()
    assert program == "dcgm-enricher"
    return cli(*args)


# A shell's PATH without the test's virtualenv: where a bare `dcgm-enricher` is not found, as
# in a new user's second terminal.
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"


def run_as_printed(command: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A command line as the demo printed it, run as a shell runs it (PATH without the
    virtualenv): only this checkout on the import path, as the printed program has it."""
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(
        shlex.split(command),
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        cwd=CHECKOUT,
        env={**os.environ, "PATH": BARE_PATH, "PYTHONPATH": str(CHECKOUT)},
        check=False,
        **kw,
    )


def test_ps_and_resolve_against_a_running_demo(tmp_path: Path) -> None:
    """The ps and resolve lines the demo prints run as printed, from a shell whose PATH lacks
    the virtualenv (the defect: "dcgm-enricher: command not found"), agree with its /metrics,
    and are the ones docs/commands.md shows; resolve's exit status says whether every PID
    resolved; ps into a pipe its reader closed ends without a traceback."""
    with demo_process(tmp_path, path=BARE_PATH) as running:
        check_ps_and_resolve(running.url, running.printed())


def check_ps_and_resolve(url: str, printed: str) -> None:
    commands = re.findall(r"^\s+(\S+(?: -m enricher)? (?:ps|resolve) .*)$", printed, re.MULTILINE)
    assert len(commands) == 2, printed
    ps_line, resolve_line = commands
    assert ps_line.startswith(demo.program()), ps_line  # no bare name: PATH cannot find it
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    served = {
        (labels["gpu"], labels.get("GPU_I_ID", ""), labels["pod"], labels["container"])
        for labels, _ in samples(text, "gpu_container_memory_used_bytes")
    }

    ps = run_as_printed(ps_line)
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

    resolved = run_as_printed(resolve_line)
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    by_pid = {int(cell(r, "PID")): r for r in rows if not r.startswith("#")}
    for line in resolved.stdout.splitlines():
        rec = json.loads(line)
        assert rec.get("pod", "") == cell(by_pid[rec["pid"]], "POD"), rec

    # A PID that is not on the node: resolve says so, and its exit status too.
    missing = run_as_printed(resolve_line + " 424242")
    assert missing.returncode == 1
    assert json.loads(missing.stdout.splitlines()[-1]) == {
        "pid": 424242,
        "error": "process_exited",
    }

    # `ps | head` where head has gone: a pipe with no reader. No traceback, exit status 1.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        closed = run_as_printed(ps_line, stdout=write_end)
    finally:
        os.close(write_end)
    assert (closed.returncode, closed.stderr) == (1, ""), closed.stderr

    # docs/commands.md shows these very commands (the demo's temporary folder as XXXXXXXX;
    # the program as a shell with the virtualenv on its PATH finds it).
    doc = (ROOT / "docs" / "commands.md").read_text()
    for line in (ps_line, resolve_line):
        shown = re.sub(r"dcgm-enricher-demo-[^/]+/", "dcgm-enricher-demo-XXXXXXXX/", line)
        shown = "dcgm-enricher" + shown.removeprefix(demo.program())
        assert shown in doc, shown


def test_the_printed_program_runs_where_it_is_printed(tmp_path: Path) -> None:
    """The demo prints `dcgm-enricher` only where PATH finds this installation's script; else
    the script's absolute path, or the interpreter with -m enricher where there is no script."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.touch()
    assert demo.program(str(python), str(venv)) == f"{python} -m enricher"
    script = venv / "dcgm-enricher"
    script.touch(mode=0o755)
    assert demo.program(str(python), BARE_PATH) == str(script)
    assert demo.program(str(python), f"{BARE_PATH}:{venv}") == "dcgm-enricher"
    other = tmp_path / "other"
    other.mkdir()
    (other / "dcgm-enricher").touch(mode=0o755)
    assert demo.program(str(python), f"{other}:{venv}") == str(script)


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


def test_the_demo_speaks_the_renamed_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dcgm-enricher demo --demo.exporter-version 4.9.0` (or 4.10.0, or the lines 4.9 and
    4.10): the simulated dcgm-exporter writes that release's names, the field table's, and
    the demo serves them."""
    for flag, version in (("4.9.0", "4.9.0"), ("4.9", "4.9.0"), ("4.10.0", "4.10.0")):
        _, _, ns = parse_config(["demo", "--demo.exporter-version", flag])
        assert dialect(ns.demo_exporter_version).version == version
    monkeypatch.setenv("ENRICHER_DEMO_EXPORTER_VERSION", "4.10")
    with (
        demo_process(tmp_path) as running,
        urllib.request.urlopen(running.url + "/metrics", timeout=10) as r,
    ):
        text = r.read().decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    fields = ("fb_used", "fb_capacity", "gpu_util", "energy", "power", "pcie_tx_rate")
    assert {table().name(f, "4.10") for f in fields} <= families
    assert not families & {table().name(f, "4.8") for f in ("fb_used", "gpu_util", "energy")}
