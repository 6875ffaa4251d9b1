"""Tests for enricher.idle: when each container last used each device it holds.

The ledger's rule is table-driven here (active by NVML, by the upstream's instance activity,
unknown, never seen active, an allocation without a process, leaving and coming back); a
Hypothesis property holds "never overstates idleness" over random collections: the
timestamp is never before the enricher's first collection, nor before the container's newest
process there, nor after the collection, and it is the collection's time whenever the
container was active. What is written is read back by prometheus_client's parser.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from devkit.clocks import MovingClock
from enricher.attribution import REASON_HOST, AllocatedDevice, Attribution
from enricher.cli import parse_config
from enricher.idle import LAST_ACTIVE, IdleLedger, render_last_active
from enricher.labels import DeviceKey
from enricher.model import GpuProcess, PodInfo, ProcInfo
from enricher.promclient import LabelSets

from .conftest import examples
from .frozendemo import FrozenDemo
from .promreleases import PromRelease, Server, serve

U0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU: DeviceKey = (U0, "")
MIG: DeviceKey = (U0, "5")
A = PodInfo(uid="uid-a", namespace="team", name="a")
B = PodInfo(uid="uid-b", namespace="team", name="b")
T = 1_800_000_000.0


def att(
    pid: int,
    owner: PodInfo | None,
    *,
    gi: int | None = None,
    sm: float | None = 0.0,
    start: float | None = T - 86_400,
) -> Attribution:
    proc = GpuProcess(U0, 0, gi, pid, 1 << 30, sm)
    info = None if start is None else ProcInfo(pid, 0, start, "python", None)
    if owner is None:
        return Attribution(proc, info, None, "", REASON_HOST)
    return Attribution(proc, info, owner, "main", "")


def alloc(key: DeviceKey, name: str) -> AllocatedDevice:
    return AllocatedDevice(key, "team", name, "main", "nvidia.com/gpu", f"{key[0]}::0")


def key(device: DeviceKey, pod: PodInfo) -> tuple[DeviceKey, str, str, str]:
    return (device, pod.namespace, pod.name, "main")


def run(
    steps: list[tuple[float, list[Attribution], list[AllocatedDevice], dict[DeviceKey, float]]],
    threshold: float = 0.01,
) -> IdleLedger:
    ledger = IdleLedger(threshold)
    for taken_at, atts, allocated, activity in steps:
        ledger.advance(taken_at, atts, allocated, activity)
    return ledger


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            [(T, [att(1, A, sm=0.5)], [], {}), (T + 30, [att(1, A, sm=0.5)], [], {})],
            {key(GPU, A): T + 30},
            id="busy-by-nvml-is-now",
        ),
        pytest.param(
            [(T, [att(1, A, sm=0.5)], [], {}), (T + 30, [att(1, A, sm=0.0)], [], {})],
            {key(GPU, A): T},
            id="went-idle-keeps-the-last-busy-collection",
        ),
        pytest.param(
            [(T, [att(1, A, sm=0.01)], [], {})],
            {key(GPU, A): T},  # at the threshold is idle, but never before the first collection
            id="at-threshold-never-seen-active-is-the-first-collection",
        ),
        pytest.param(
            [(T, [att(1, A, sm=0.5)], [], {}), (T + 30, [att(1, A, sm=0.01)], [], {})],
            {key(GPU, A): T},  # active is ABOVE the threshold (docs/metrics.md): equal is idle
            id="at-threshold-after-busy-is-idle",
        ),
        pytest.param(
            [
                (T, [att(1, A, gi=5, sm=None)], [], {MIG: 0.4}),
                (T + 30, [att(1, A, gi=5, sm=None)], [], {MIG: 0.01}),
            ],
            {key(MIG, A): T},
            id="mig-instance-activity-at-threshold-is-idle",
        ),
        pytest.param(
            [(T, [att(1, A, sm=0.0)], [], {}), (T + 60, [att(1, A, sm=0.0)], [], {})],
            {key(GPU, A): T},
            id="process-older-than-the-enricher-counts-from-its-first-collection",
        ),
        pytest.param(
            [(T, [], [], {}), (T + 60, [att(1, A, sm=0.0, start=T + 45)], [], {})],
            {key(GPU, A): T + 45},
            id="process-newer-than-the-enricher-counts-from-its-start",
        ),
        pytest.param(
            [(T, [], [], {}), (T + 60, [att(1, A, sm=0.0, start=None)], [], {})],
            {key(GPU, A): T + 60},
            id="unknown-start-counts-from-the-collection-that-first-saw-it",
        ),
        pytest.param(
            [
                (T, [], [], {}),
                (T + 60, [], [alloc(GPU, "a")], {}),
                (T + 90, [], [alloc(GPU, "a")], {}),
            ],
            {key(GPU, A): T + 60},
            id="allocation-without-process-is-idle-since-first-seen",
        ),
        pytest.param(
            [(T, [att(1, A, gi=5, sm=None)], [], {MIG: 0.4})],
            {key(MIG, A): T},
            id="mig-busy-by-the-upstreams-instance-activity",
        ),
        pytest.param(
            [
                (T, [att(1, A, gi=5, sm=None)], [], {MIG: 0.4}),
                (T + 30, [att(1, A, gi=5, sm=None)], [], {MIG: 0.0}),
                (T + 60, [att(1, A, gi=5, sm=None)], [], {MIG: 0.0}),
            ],
            {key(MIG, A): T},
            id="mig-idle-instance",
        ),
        pytest.param(
            [
                (T, [att(1, A, sm=None)], [], {}),
                (T + 30, [att(1, A, sm=None)], [], {}),
            ],
            {key(GPU, A): T + 30},
            id="nothing-tells-counts-as-active",
        ),
        pytest.param(
            [
                (T, [att(1, A, gi=5, sm=None), att(2, B, gi=5, sm=None)], [], {MIG: 0.5}),
                (T + 30, [att(1, A, gi=5, sm=None), att(2, B, gi=5, sm=None)], [], {MIG: 0.5}),
            ],
            {key(MIG, A): T + 30, key(MIG, B): T + 30},
            id="shared-busy-instance-is-activity-for-each",
        ),
        pytest.param(
            [
                (T, [att(1, A, sm=0.5), att(2, None, sm=0.0)], [], {}),
                (T + 30, [att(1, A, sm=0.0), att(2, None, sm=0.9)], [], {GPU: 0.9}),
            ],
            {key(GPU, A): T},
            id="host-process-busy-is-not-the-pods-activity",
        ),
        pytest.param(
            [
                (T, [att(1, A, sm=0.5)], [], {}),
                (T + 30, [], [], {}),
                (T + 60, [att(1, A, sm=0.0)], [], {}),
            ],
            {key(GPU, A): T},  # the process started long before: the first collection bounds it
            id="left-and-came-back-starts-afresh",
        ),
        pytest.param(
            [(0.0, [att(1, A, sm=0.0)], [], {}), (T, [att(1, A, sm=0.0)], [], {})],
            {key(GPU, A): T},
            id="no-snapshot-accounts-nothing",
        ),
        pytest.param(
            [
                (T, [att(1, A, sm=0.5)], [], {}),
                (T + 60, [att(1, A, sm=0.0)], [], {}),
                (0.0, [], [], {}),  # NVML down: whatever A did meanwhile is unknown
                (T + 3600, [att(1, A, sm=0.0)], [], {}),
            ],
            {key(GPU, A): T + 3600},
            id="nvml-outage-counts-again-from-its-end",
        ),
    ],
)
def test_ledger_rule(
    steps: list[tuple[float, list[Attribution], list[AllocatedDevice], dict[DeviceKey, float]]],
    expected: dict[tuple[DeviceKey, str, str, str], float],
) -> None:
    assert run(steps).last_active == expected


def test_threshold_is_the_flags() -> None:
    steps = [(T, [att(1, A, sm=0.5)], [], {}), (T + 30, [att(1, A, sm=0.2)], [], {})]
    assert run(steps, threshold=0.01).last_active == {key(GPU, A): T + 30}
    assert run(steps, threshold=0.3).last_active == {key(GPU, A): T}


_collection = st.tuples(
    st.floats(0, 600),  # seconds since the previous collection
    st.lists(  # processes: (pid, owner, sm, start offset from the collection)
        st.tuples(
            st.integers(1, 6),
            st.sampled_from([A, B, None]),
            st.one_of(st.none(), st.floats(0, 1)),
            st.one_of(st.none(), st.floats(-100_000, 0)),
            st.sampled_from([None, 5]),
        ),
        max_size=6,
    ),
    st.lists(st.sampled_from([(GPU, "a"), (GPU, "b"), (MIG, "a")]), max_size=3),
    st.dictionaries(st.sampled_from([GPU, MIG]), st.floats(0, 1), max_size=2),
)


# 500 examples cover the ledger's few branches many times over (the CI profile's 2,000 took
# 19 s of a CI budget that is nearly spent).
@settings(max_examples=examples(500))
@given(st.lists(_collection, min_size=1, max_size=8))
def test_never_overstates_idleness(collections: list) -> None:  # type: ignore[type-arg]
    """For every container on every collection: first collection <= its timestamp <= now,
    newest process start <= timestamp, and timestamp == now when it was active."""
    ledger = IdleLedger(0.01)
    now = T
    for gap, procs, allocs, activity in collections:
        now += gap
        atts = [
            att(pid, owner, gi=gi, sm=sm, start=None if off is None else now + off)
            for pid, owner, sm, off, gi in procs
        ]
        allocated = [alloc(d, name) for d, name in allocs]
        ledger.advance(now, atts, allocated, activity)
        assert ledger.started is not None
        for k, ts in ledger.last_active.items():
            assert ledger.started <= ts <= now
            device = k[0]
            mine = [
                a
                for a in atts
                if a.pod is not None and (a.device_key, a.pod.name) == (device, k[2])
            ]
            starts = [a.info.start_time for a in mine if a.info is not None]
            if starts:
                assert ts >= min(max(starts), now)
            sms = [a.process.sm_util_ratio for a in mine if a.process.sm_util_ratio is not None]
            if sms and sum(sms) > 0.01:
                assert ts == now
            if mine and not sms and activity.get(device, 1.0) > 0.01:
                assert ts == now


def test_render_reads_back() -> None:
    ledger = run([(T, [att(1, A, sm=0.5), att(2, B, gi=5, sm=None)], [], {MIG: 0.0})])
    identities = {GPU: (("gpu", "0"), ("UUID", U0), ("Hostname", "h"))}
    # The Scraper's memo, which writes the enricher's node label on every set.
    text = render_last_active(ledger.last_active, identities, LabelSets(const=(("node", "n1"),)))
    (family,) = text_string_to_metric_families(text)
    assert family.name == LAST_ACTIVE
    got = {(s.labels.get("GPU_I_ID", ""), s.labels["pod"]): s.value for s in family.samples}
    assert got == {("", "a"): T, ("5", "b"): T}
    gpu_sample = next(s for s in family.samples if s.labels["pod"] == "a")
    assert gpu_sample.labels == {
        "gpu": "0",
        "UUID": U0,
        "Hostname": "h",
        "namespace": "team",
        "pod": "a",
        "container": "main",
        "node": "n1",
    }


# --------------------------------------------------------------------------- a real Prometheus

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
CULLING = ROOT / "docs" / "culling.md"
HOURS_BEHIND = 3
IDLE_RECORD = "namespace_pod_container:gpu_container_idle_seconds:min"
# The demo's story: alice's notebook went idle two minutes in; llama-eval finished its work and
# kept its CUDA context; finetune-mistral-0 was allocated GPU 5 and never ran on it.
HELD_IDLE = {
    ("jupyterhub", "jupyter-alice", "notebook"),
    ("ml-team", "llama-eval-7xq2m", "eval"),
    ("ml-team", "finetune-mistral-0", "trainer"),
}


def culling_queries() -> list[str]:
    """The PromQL blocks of docs/culling.md, in order."""
    return re.findall(r"```promql\n(.+?)\n```", CULLING.read_text(), re.DOTALL)


@dataclass
class IdleStack:
    server: Server
    first_collection: float  # the enricher's first collection, by the simulated clock

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.server.query(promql)


@pytest.fixture(scope="module")
def idle_stack(
    tmp_path_factory: pytest.TempPathFactory, prom_release: PromRelease
) -> Iterator[IdleStack]:
    """The demo, first collected three hours ago by its own clock (its notebook still busy),
    then at the real time (the notebook idle since), scraped by a real Prometheus with the
    shipped rules."""
    tmp = tmp_path_factory.mktemp(f"idle-{prom_release.id}")
    clock = MovingClock(HOURS_BEHIND * 3600.0)
    demo = FrozenDemo(tmp / "demo", clock=clock)
    url = f"http://127.0.0.1:{demo.port}/metrics"
    try:
        started = clock()
        first = _last_active(url)
        assert first and all(abs(v - started) < 10 for v in first.values()), first
        clock.catch_up()
        deadline = time.monotonic() + 30
        while min(_last_active(url).values()) == max(_last_active(url).values()):
            assert time.monotonic() < deadline, "no collection at the real time"
            time.sleep(0.2)
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "scrape_configs": [demo.scrape_job()],
            "rule_files": [str(RULES)],
        }
        with serve(prom_release, config, tmp / "prometheus") as server:
            deadline = time.monotonic() + 60
            while not (
                server.query('ALERTS{alertname="GpuHeldIdle"}') and server.query(IDLE_RECORD)
            ):
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.5)
            yield IdleStack(server, min(first.values()))
    finally:
        demo.close()


def _last_active(url: str) -> dict[tuple[str, str, str, str, str], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (
            s.labels["gpu"],
            s.labels.get("GPU_I_ID", ""),
            s.labels["namespace"],
            s.labels["pod"],
            s.labels["container"],
        ): s.value
        for f in text_string_to_metric_families(text)
        if f.name == LAST_ACTIVE
        for s in f.samples
    }


def _who(result: list[dict[str, Any]], *labels: str) -> set[tuple[str, ...]]:
    return {tuple(r["metric"].get(label, "") for label in labels) for r in result}


@pytest.mark.one_python
def test_the_idle_notebook_is_idle_since_it_stopped(idle_stack: IdleStack) -> None:
    """The record says each container's idleness: alice's since the first collection (her
    last busy one), with her JupyterHub user; the busy ones' under a minute."""
    got = idle_stack.query(IDLE_RECORD)
    idle = {
        (r["metric"]["namespace"], r["metric"]["pod"], r["metric"]["container"]): r for r in got
    }
    alice = idle[("jupyterhub", "jupyter-alice", "notebook")]
    assert alice["metric"]["user"] == "alice@example.com"
    expected = time.time() - idle_stack.first_collection
    assert float(alice["value"][1]) == pytest.approx(expected, abs=30)
    busy = {k: float(r["value"][1]) for k, r in idle.items() if k not in HELD_IDLE}
    assert busy and all(v < 60 for v in busy.values()), busy
    assert ("ml-team", "train-llama-4kq9z", "trainer") in busy


@pytest.mark.one_python
def test_held_idle_alert_names_exactly_the_idle_holders(idle_stack: IdleStack) -> None:
    alerts = [a for a in idle_stack.server.alerts() if a["labels"]["alertname"] == "GpuHeldIdle"]
    assert {
        (a["labels"]["namespace"], a["labels"]["pod"], a["labels"]["container"]) for a in alerts
    } == HELD_IDLE
    for a in alerts:
        assert a["state"] == "pending"  # for: 10m
        assert ("(user alice@example.com)" in a["annotations"]["description"]) == (
            a["labels"]["pod"] == "jupyter-alice"
        ), a


@pytest.mark.one_python
def test_culling_recipes_find_what_to_stop(idle_stack: IdleStack) -> None:
    """docs/culling.md's queries, as written there."""
    containers, pods, users, keda = culling_queries()
    assert _who(idle_stack.query(containers), "namespace", "pod", "container") == HELD_IDLE
    assert _who(idle_stack.query(pods), "namespace", "pod") == {p[:2] for p in HELD_IDLE}
    assert _who(idle_stack.query(users), "user") == {("alice@example.com",)}
    (busy,) = idle_stack.query(keda)
    assert float(busy["value"][1]) == 1.0  # vllm's one pod is busy: keep it
    idle_job = keda.replace('"Deployment"', '"Job"').replace('"inference"', '"ml-team"')
    (none,) = idle_stack.query(idle_job.replace('"vllm"', '"llama-eval"'))
    assert float(none["value"][1]) == 0.0  # the finished job: scale to zero


# --------------------------------------------------------------------------- the flag


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], {}, 0.01, id="default"),
        pytest.param(["--idle.threshold", "0.05"], {}, 0.05, id="flag"),
        pytest.param([], {"ENRICHER_IDLE_THRESHOLD": "0"}, 0.0, id="env-zero"),
    ],
)
def test_idle_threshold_flag(
    argv: list[str], env: dict[str, str], expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _, config, _ = parse_config(argv)
    assert config.idle_threshold == expected


@pytest.mark.parametrize("value", ["1", "1.5", "-0.1", "nan", "inf", "soon", ""])
def test_idle_threshold_must_be_a_ratio(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config([f"--idle.threshold={value}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--idle.threshold" in err, err


# Found by `make mutate` (docs/development.md): a container's processes on one device add up,
# and its newest process's start counts, whatever order NVML lists them in.
@pytest.mark.parametrize("order", [1, -1], ids=["listed-in-order", "listed-reversed"])
def test_a_containers_processes_on_one_device_add_up(order: int) -> None:
    """Two processes of one container at 0.3 each: 0.6 of the device, above a 0.5
    threshold, so it is active; neither alone is."""
    idle = [att(1, A, sm=0.0), att(2, A, sm=0.0)]
    busy = [att(1, A, sm=0.3), att(2, A, sm=0.3)][::order]
    ledger = run([(T - 60, idle, [], {}), (T, busy, [], {})], threshold=0.5)
    assert ledger.last_active == {key(GPU, A): T}


@pytest.mark.parametrize("order", [1, -1], ids=["listed-in-order", "listed-reversed"])
def test_idle_since_the_containers_newest_process_started(order: int) -> None:
    """An idle container whose two processes started at T-200 and T-100 (the ledger seeing it
    first at T-300) has been idle since the newer one started, not the older."""
    procs = [att(1, A, start=T - 200), att(2, A, start=T - 100)][::order]
    ledger = run([(T - 300, [], [alloc(GPU, "a")], {}), (T, procs, [], {})])
    assert ledger.last_active == {key(GPU, A): T - 100}
