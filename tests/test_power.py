"""Tests for enricher.power: the upstream fields, the split rules, the energy ledger, and the
families through the real app.

The pure parts are table-driven, with the invariant (containers' watts plus unattributed watts
are the device's watts, on every GPU) and the ledger's monotonicity as Hypothesis properties
over random nodes. The oracle for what is written is prometheus_client's parser and, in the
full-stack tests, promtool. The full stack runs over the fake libnvidia-ml (no GPU here).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from bench import payloads
from devkit.nvmlfake import FakeNvml, FakeNvmlState, nvml_state_of
from enricher.attribution import REASON_HOST, REASON_MPS_SERVER, AllocatedDevice, Attribution
from enricher.fieldtable import table
from enricher.idle import LAST_ACTIVE
from enricher.labels import RewritePlan
from enricher.model import GpuDevice, GpuProcess, GpuSnapshot, MigDevice, PodInfo, PowerReading
from enricher.power import (
    ENERGY,
    POWER,
    REASON_IDLE,
    RULE_ALLOCATED,
    RULE_EQUAL,
    RULE_IDLE,
    RULE_MEMORY,
    RULE_OWNER,
    RULE_SM,
    SOURCE_NVML,
    SOURCE_UPSTREAM,
    UNATTR_POWER,
    DeviceDraw,
    EnergyLedger,
    UpstreamPower,
    choose_readings,
    mig_slices,
    render_power,
    split_power,
    upstream_power,
)
from enricher.readings import WATCH_NAMES, read_body, read_upstream
from enricher.rewrite import Rewriter
from enricher.simnode.api import pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode, SimPod, SimProc
from enricher.textformat import watched_lines
from enricher.upstreamlines import SeriesDevices

from .conftest import assert_valid_exposition
from .harness import MakeStack, cid, series

U0 = "GPU-00000000-0000-4000-8000-000000000000"
U1 = "GPU-11111111-1111-4111-8111-111111111111"
GIB = 1 << 30


def pod(name: str, ns: str = "team") -> PodInfo:
    return PodInfo(uid=f"uid-{ns}-{name}", namespace=ns, name=name)


def att(
    pid: int,
    owner: PodInfo | None,
    *,
    uuid: str = U0,
    gi: int | None = None,
    sm: float | None = 0.0,
    mem: int | None = GIB,
    container: str = "main",
    reason: str = "",
) -> Attribution:
    proc = GpuProcess(uuid, 0, gi, pid, mem, sm)
    if owner is None:
        return Attribution(proc, None, None, "", reason or REASON_HOST)
    return Attribution(proc, None, owner, container, "")


def alloc(key: tuple[str, str], name: str, container: str = "main") -> AllocatedDevice:
    return AllocatedDevice(key, "team", name, container, "nvidia.com/gpu", f"{key[0]}::0")


ONE_GPU = GpuSnapshot(devices=(GpuDevice(0, U0, "A100"),))
A, B = pod("a"), pod("b")


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "power", "energy", "activity"),
    [
        pytest.param(
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}"}} 312.5\n'
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="{U0}"}} 123456789\n',
            {U0: 312.5},
            {U0: 123456789.0},
            {},
            id="device-fields-first-line",
        ),
        pytest.param(
            "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",uuid="{U0}"}} 1e2 1700000000000\n',
            {U0: 100.0},
            {},
            {},
            id="old-uuid-label-and-timestamp",
        ),
        pytest.param(
            f'DCGM_FI_DEV_POWER_USAGE_INSTANT{{UUID="{U0}"}} 99\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="1"} 50\n'
            "DCGM_FI_DEV_POWER_USAGE 50\n"
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}"}} NaN\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}"}} -3\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}"}} 0x10\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}",UUID="x"}} 7\n'
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{UUID="{U1}"}} +Inf\n',
            {},
            {},
            {},
            id="longer-name-no-uuid-nan-negative-hex-duplicate-label-inf-skipped",
        ),
        pytest.param(
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U0}",GPU_I_ID="1"}} 50\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U0}",GPU_I_ID="2"}} 51\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}",GPU_I_ID="1"}} 70\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}"}} 80\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}",vgpu="1"}} 81\n',
            {U0: 50.0, U1: 80.0},
            {},
            {},
            id="device-sample-first-else-first-instance-copy",
        ),
        pytest.param(
            # --kubernetes-virtual-gpus: each device series once per sharing pod, identical.
            "".join(
                f'{name}{{gpu="0",UUID="{U0}",pod="{p}",namespace="n",vgpu="{i}"}} {v}\n'
                for name, v in (
                    ("DCGM_FI_DEV_POWER_USAGE", 300),
                    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 5000),
                    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.25),
                )
                for i, p in enumerate("abc")
            ),
            {U0: 300.0},
            {U0: 5000.0},
            {(U0, ""): 0.25},
            id="vgpu-copies-count-once",
        ),
        pytest.param(
            # A MIG GPU's device fields per GPU_I_ID, and each series once per pod on it.
            "".join(
                f'{name}{{UUID="{U1}",GPU_I_ID="{gi}",pod="{p}",namespace="n"}} {v}\n'
                for name, v in (
                    ("DCGM_FI_DEV_POWER_USAGE", 70),
                    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 9000),
                    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.125),
                )
                for gi in "12"
                for p in "ab"
            ),
            {U1: 70.0},
            {U1: 9000.0},
            {(U1, "1"): 0.125, (U1, "2"): 0.125},
            id="mig-instance-and-per-pod-copies-count-once",
        ),
        pytest.param(
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{UUID="{U0}",GPU_I_ID="1"}} 0.25\n'
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{UUID="{U0}",GPU_I_ID="2"}} 1.0000001\n'
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{UUID="{U1}"}} 0.5\r\n',
            {},
            {},
            {(U0, "1"): 0.25, (U0, "2"): 1.0, (U1, ""): 0.5},
            id="activity-per-instance-clamped-crlf",
        ),
    ],
)
def test_upstream_power(
    text: str,
    power: dict[str, float],
    energy: dict[str, float],
    activity: dict[tuple[str, str], float],
) -> None:
    got = upstream_power(read_body(text))
    assert dict(got.power_watts) == power
    # The energies above are as written (4.8's mJ); the readings are in joules.
    assert dict(got.energy_joules) == {k: v / 1000 for k, v in energy.items()}
    assert dict(got.activity) == activity


def test_the_parse_memo_follows_the_payload_not_the_uptime() -> None:
    """The upstream's pod labels follow the pods: after 2,000 pods came and went, the devices
    of only the last text's series are kept (white box: a bound of a fixed size would
    fill with departed pods' series and show as growth under churn), and each reading is
    still the one of its own text."""
    memo = SeriesDevices()
    for epoch in range(2_000):
        text = (
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U0}",pod="p-{epoch}"}} {epoch}\n'
            f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}",pod="q"}} 7\n'
        )
        got = upstream_power(read_upstream(text, watched_lines(text, WATCH_NAMES), memo))
        assert dict(got.power_watts) == {U0: float(epoch), U1: 7.0}
    assert sorted(memo.last) == [
        ("DCGM_FI_DEV_POWER_USAGE", f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U0}",pod="p-1999"}}'),
        ("DCGM_FI_DEV_POWER_USAGE", f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}",pod="q"}}'),
    ]


def test_each_parse_memo_is_its_owners(monkeypatch: pytest.MonkeyPatch) -> None:
    """A series is parsed once while its memo's owner reads it again; another memo (another
    Scraper's, over another node) neither uses nor replaces it, and a call without a memo
    touches none."""
    import enricher.upstreamlines as lines_module

    parsed: list[str] = []
    series_device = lines_module._series_device

    def counted(name: str, series: str) -> Any:
        parsed.append(series)
        return series_device(name, series)

    monkeypatch.setattr(lines_module, "_series_device", counted)
    a_text = f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U0}"}} 100\n'
    b_text = f'DCGM_FI_DEV_POWER_USAGE{{UUID="{U1}"}} 50\n'
    a, b = SeriesDevices(), SeriesDevices()
    for _ in range(2):
        got_a = upstream_power(read_upstream(a_text, watched_lines(a_text, WATCH_NAMES), a))
        got_b = upstream_power(read_upstream(b_text, watched_lines(b_text, WATCH_NAMES), b))
        assert (got_a.power_watts, got_b.power_watts) == ({U0: 100}, {U1: 50})
        assert upstream_power(read_body(b_text)).power_watts == {U1: 50}
    # a and b: once each, on their first reads; the memo-less call: every time.
    assert parsed.count(a_text.split(" ")[0]) == 1
    assert parsed.count(b_text.split(" ")[0]) == 1 + 2
    assert list(a.last) == [("DCGM_FI_DEV_POWER_USAGE", a_text.split(" ")[0])]
    assert list(b.last) == [("DCGM_FI_DEV_POWER_USAGE", b_text.split(" ")[0])]


def test_upstream_reading_preferred_per_gpu_and_per_field() -> None:
    snap = GpuSnapshot(
        devices=(GpuDevice(0, U0, "A100"), GpuDevice(1, U1, "A100")),
        power=(PowerReading(U0, 10.0, 1000.0), PowerReading(U1, 20.0, 2000.0)),
    )
    up = UpstreamPower(power_watts={U0: 300.0}, energy_joules={U1: 5.0})
    assert choose_readings(up, snap) == [
        DeviceDraw(U0, 300.0, SOURCE_UPSTREAM, 1.0, SOURCE_NVML),  # NVML's mJ, in joules
        DeviceDraw(U1, 20.0, SOURCE_NVML, 5.0, SOURCE_UPSTREAM),
    ]
    # A GPU NVML did not list is not split: nothing is known about its processes.
    assert choose_readings(UpstreamPower(power_watts={U1: 1.0}), ONE_GPU) == [
        DeviceDraw(U0, None, SOURCE_NVML, None, SOURCE_NVML)
    ]


@pytest.mark.parametrize(
    ("profile", "slices"),
    [
        ("1g.10gb", 1),
        ("3g.40gb", 3),
        ("7g.80gb", 7),
        ("1g.10gb+me", 1),
        ("", None),
        ("0g.1gb", None),
    ],
)
def test_mig_slices(profile: str, slices: int | None) -> None:
    assert mig_slices(profile) == slices


# --------------------------------------------------------------------------- the split rules

MIG_GPU = GpuSnapshot(
    devices=(GpuDevice(0, U0, "A100", mig_enabled=True),),
    migs=(
        MigDevice(U0, 0, 1, 0, "MIG-1", "3g.40gb"),
        MigDevice(U0, 0, 5, 0, "MIG-5", "2g.20gb"),
        MigDevice(U0, 0, 13, 0, "MIG-13", "1g.10gb"),
    ),
)


@pytest.mark.parametrize(
    ("snapshot", "attributions", "allocated", "activity", "expected"),
    [
        pytest.param(
            ONE_GPU,
            [att(1, A, sm=0.9), att(2, A, sm=0.0)],
            [],
            {},
            {("", "a"): (1.0, RULE_OWNER)},
            id="one-container-takes-all",
        ),
        pytest.param(
            ONE_GPU,
            [att(1, A, sm=0.6), att(2, B, sm=0.2), att(3, None, sm=0.2)],
            [alloc((U0, ""), "c")],
            {},
            {
                ("", "a"): (0.6, RULE_SM),
                ("", "b"): (0.2, RULE_SM),
                ("", REASON_HOST): (0.2, RULE_SM),
            },
            id="time-sliced-by-sm-time-process-beats-allocation",
        ),
        pytest.param(
            ONE_GPU,
            [att(1, A, sm=0.0, mem=3 * GIB), att(2, B, sm=0.0, mem=GIB)],
            [],
            {},
            {("", "a"): (0.75, RULE_MEMORY), ("", "b"): (0.25, RULE_MEMORY)},
            id="none-active-by-memory-held",
        ),
        pytest.param(
            ONE_GPU,
            [att(1, A, sm=None, mem=None), att(2, B, sm=None, mem=None), att(3, B, mem=None)],
            [],
            {},
            {("", "a"): (0.333333, RULE_EQUAL), ("", "b"): (0.666667, RULE_EQUAL)},
            id="nothing-known-equal-per-process",
        ),
        pytest.param(
            ONE_GPU,
            [att(1, A, container="x", sm=0.3), att(2, A, container="y", sm=0.1)],
            [],
            {},
            {("", "a"): (1.0, RULE_SM)},  # two containers of one pod: both "a" in this view
            id="two-containers-of-one-pod-split",
        ),
        pytest.param(
            ONE_GPU,
            [att(9, None, sm=0.0, mem=GIB, reason=REASON_MPS_SERVER)],
            [alloc((U0, ""), "a"), alloc((U0, ""), "b"), alloc((U0, ""), "b")],
            {},
            {("", "a"): (0.333333, RULE_ALLOCATED), ("", "b"): (0.666667, RULE_ALLOCATED)},
            id="no-process-goes-to-allocations-per-replica",
        ),
        pytest.param(ONE_GPU, [], [], {}, {("", REASON_IDLE): (1.0, RULE_IDLE)}, id="idle"),
        pytest.param(
            MIG_GPU,
            [att(1, A, gi=1, sm=None), att(2, None, gi=5, sm=None)],
            [alloc((U0, "13"), "b")],
            {},
            {
                ("1", "a"): (0.5, RULE_OWNER),
                ("5", REASON_HOST): (0.333333, RULE_MEMORY),
                ("13", "b"): (0.166667, RULE_ALLOCATED),
            },
            id="mig-by-slices-without-activity",
        ),
        pytest.param(
            MIG_GPU,
            [att(1, A, gi=1, sm=None)],
            [],
            {(U0, "1"): 0.5, (U0, "5"): 0.0, (U0, "13"): 0.5},
            {
                ("1", "a"): (0.75, RULE_OWNER),
                ("5", REASON_IDLE): (0.0, RULE_IDLE),
                ("13", REASON_IDLE): (0.25, RULE_IDLE),
            },
            id="mig-by-activity-times-slices",
        ),
        pytest.param(
            MIG_GPU,
            [],
            [],
            {(U0, "1"): 0.5, (U0, "5"): 0.2},  # one instance without activity: slices
            {
                ("1", REASON_IDLE): (0.5, RULE_IDLE),
                ("5", REASON_IDLE): (0.333333, RULE_IDLE),
                ("13", REASON_IDLE): (0.166667, RULE_IDLE),
            },
            id="mig-activity-incomplete-falls-back-to-slices",
        ),
    ],
)
def test_split_rules(
    snapshot: GpuSnapshot,
    attributions: list[Attribution],
    allocated: list[AllocatedDevice],
    activity: dict[tuple[str, str], float],
    expected: dict[tuple[str, str], tuple[float, str]],
) -> None:
    parts = split_power(snapshot, attributions, allocated, activity)
    assert set(parts) == {d.uuid for d in snapshot.devices}
    got: dict[tuple[str, str], tuple[float, str]] = {}
    for p in parts[U0]:
        k = (p.key[1], p.who[1] if p.who else p.reason)
        share, _rule = got.get(k, (0.0, p.rule))
        got[k] = (round(share + p.share, 6), p.rule)
    assert got == expected
    assert math.isclose(sum(p.share for p in parts[U0]), 1.0)


def test_mig_profile_unknown_splits_instances_equally() -> None:
    snap = GpuSnapshot(
        devices=(GpuDevice(0, U0, "A100", mig_enabled=True),),
        migs=(MigDevice(U0, 0, 1, 0, "MIG-1", "3g.40gb"), MigDevice(U0, 0, 2, 0, "MIG-2", "")),
    )
    assert [round(p.share, 6) for p in split_power(snap, [])[U0]] == [0.5, 0.5]


# --------------------------------------------------------------------------- random nodes

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "", "odd")
PODS = tuple(pod(n, ns) for n in ("p0", "p1", "p2") for ns in ("n0", "n1"))
REASONS = (REASON_HOST, "pod_not_found", "process_exited", REASON_MPS_SERVER)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[GpuSnapshot, list[Attribution], list[AllocatedDevice], Any]:
    """A random node: GPUs (some in MIG mode with random instances), processes owned by random
    containers or unattributed, allocations, activity and power readings (some missing)."""
    devices: list[GpuDevice] = []
    migs: list[MigDevice] = []
    keys: list[tuple[str, str, int, int | None]] = []
    for i in range(draw(st.integers(1, 4))):
        uuid = f"GPU-{i:08d}-0000-4000-8000-000000000000"
        mig = draw(st.booleans())
        devices.append(GpuDevice(i, uuid, "A100", mig_enabled=mig))
        if mig:
            for gi in draw(st.sets(st.integers(0, 14), max_size=4)):
                migs.append(
                    MigDevice(uuid, i, gi, 0, f"MIG-{i}-{gi}", draw(st.sampled_from(PROFILES)))
                )
                keys.append((uuid, str(gi), i, gi))
        else:
            keys.append((uuid, "", i, None))
    atts: list[Attribution] = []
    allocs: list[AllocatedDevice] = []
    if keys:
        for pid in range(draw(st.integers(0, 10))):
            uuid, _, index, on_gi = draw(st.sampled_from(keys))
            sm = None if on_gi is not None else draw(st.none() | st.floats(0, 1))
            mem = draw(st.none() | st.integers(0, 80 * GIB))
            proc = GpuProcess(uuid, index, on_gi, pid + 1, mem, sm)
            owner = draw(st.none() | st.sampled_from(PODS))
            if owner is None:
                atts.append(Attribution(proc, None, None, "", draw(st.sampled_from(REASONS))))
            else:
                container = draw(st.sampled_from(("main", "side")))
                atts.append(Attribution(proc, None, owner, container, ""))
        for _ in range(draw(st.integers(0, 4))):
            uuid, gi_text, _, _ = draw(st.sampled_from(keys))
            p = draw(st.sampled_from(PODS))
            allocs.append(AllocatedDevice((uuid, gi_text), p.namespace, p.name, "main", "r", "d"))
    activity = {(k[0], k[1]): draw(st.floats(0, 1)) for k in keys if k[1] and draw(st.booleans())}
    power = tuple(
        PowerReading(d.uuid, draw(st.floats(0, 1500)), None)
        for d in devices
        if draw(st.integers(0, 4)) > 0
    )
    snap = GpuSnapshot(devices=tuple(devices), migs=tuple(migs), power=power)
    return snap, atts, allocs, activity


def watts_by_gpu(text: str) -> tuple[dict[str, float], list[float]]:
    total: dict[str, float] = defaultdict(float)
    values: list[float] = []
    for fam in text_string_to_metric_families(text):
        if fam.name not in (POWER, UNATTR_POWER):
            continue
        for s in fam.samples:
            total[s.labels["UUID"]] += s.value
            values.append(s.value)
    return dict(total), values


@settings(deadline=None)
@given(nodes())
def test_invariant_parts_add_up_to_the_device_power(node: Any) -> None:
    """On every GPU with a power reading, the written container watts plus unattributed watts
    are the device's watts (prometheus_client's parser reads them back), none is negative,
    and a GPU without a reading writes no watts."""
    snap, atts, allocs, activity = node
    draws = choose_readings(UpstreamPower(), snap)
    parts = split_power(snap, atts, allocs, activity)
    for uuid, gpu_parts in parts.items():
        assert math.isclose(sum(p.share for p in gpu_parts), 1.0, rel_tol=1e-9), uuid
    text = render_power(draws, parts, {}, {})
    total, values = watts_by_gpu(text)
    expected = {d.gpu_uuid: d.power_watts for d in draws if d.power_watts is not None}
    assert set(total) <= set(expected)
    for uuid, watts in expected.items():
        assert math.isclose(total.get(uuid, 0.0), watts, rel_tol=1e-9, abs_tol=1e-9), uuid
    assert all(v >= 0.0 for v in values)


def test_two_containers_of_one_pod_split_by_their_own_sm_time() -> None:
    """The table above sums a pod's containers; here each container's own share: SM time
    0.3 and 0.1 of one pod's two containers give 3/4 and 1/4."""
    parts = split_power(
        ONE_GPU, [att(1, A, container="x", sm=0.3), att(2, A, container="y", sm=0.1)], [], {}
    )
    got = {p.who[2]: round(p.share, 6) for p in parts[U0] if p.who is not None}
    assert got == {"x": 0.75, "y": 0.25}
    assert {p.rule for p in parts[U0]} == {RULE_SM}


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(nodes(), st.lists(st.tuples(st.booleans(), st.integers(0, 10**9)), max_size=4)),
        min_size=1,
        max_size=6,
    )
)
def test_energy_never_decreases_while_a_container_stays(steps: Any) -> None:
    """Over random collections (the node changes, energy counters rise or reset), a container
    that stays on its device never sees its energy fall, and the energy added to containers on
    a step is the counters' increase times the attributed share, never more."""
    ledger = EnergyLedger()
    counters: dict[str, float] = {}
    for (snap, atts, allocs, activity), bumps in steps:
        draws = []
        for i, dev in enumerate(snap.devices):
            reset, step = bumps[i] if i < len(bumps) else (False, 0)
            counters[dev.uuid] = float(step) if reset else counters.get(dev.uuid, 0.0) + step
            draws.append(DeviceDraw(dev.uuid, None, SOURCE_NVML, counters[dev.uuid], SOURCE_NVML))
        before = dict(ledger.totals)
        baselines = {u: ledger._baseline.get(u) for u in counters}
        parts = split_power(snap, atts, allocs, activity)
        ledger.advance(draws, parts)
        for k, v in ledger.totals.items():
            if k in before:
                assert v >= before[k], k
        added = sum(v - before.get(k, 0.0) for k, v in ledger.totals.items())
        allowed = 0.0
        for d in draws:
            prev = baselines.get(d.gpu_uuid)
            now = d.energy_joules
            if prev is not None and now is not None and now >= prev[1]:
                attributed = sum(p.share for p in parts[d.gpu_uuid] if p.who is not None)
                allowed += (now - prev[1]) * attributed
        assert math.isclose(added, allowed, rel_tol=1e-9, abs_tol=1e-6)


def test_energy_counter_rules() -> None:
    """Baseline first, then increases by share; a counter that goes down is a reset (that
    interval counts nothing); a change of source is a new baseline; a container that leaves
    is dropped and starts from 0 when it returns."""
    ledger = EnergyLedger()
    two = split_power(ONE_GPU, [att(1, A, sm=0.75), att(2, B, sm=0.25)])
    one = split_power(ONE_GPU, [att(1, A, sm=0.5)])
    ka, kb = ((U0, ""), "team", "a", "main"), ((U0, ""), "team", "b", "main")

    def step(mj: float | None, parts: Any, source: str = SOURCE_UPSTREAM) -> dict[Any, float]:
        joules = None if mj is None else mj / 1000
        ledger.advance([DeviceDraw(U0, None, source, joules, source)], parts)
        return {k: round(v, 6) for k, v in ledger.totals.items()}

    assert step(None, two) == {}  # no counter ever read: no series
    assert step(1_000_000.0, two) == {ka: 0.0, kb: 0.0}  # baseline
    assert step(1_004_000.0, two) == {ka: 3.0, kb: 1.0}
    assert step(1_004_000.0, two) == {ka: 3.0, kb: 1.0}  # the same collection again
    assert step(500.0, two) == {ka: 3.0, kb: 1.0}  # reset: skipped, new baseline
    assert step(2_500.0, two) == {ka: 4.5, kb: 1.5}
    assert step(10_000.0, two, SOURCE_NVML) == {ka: 4.5, kb: 1.5}  # another counter: baseline
    assert step(12_000.0, one, SOURCE_NVML) == {ka: 6.5}  # b left
    assert step(14_000.0, two, SOURCE_NVML) == {ka: 8.0, kb: 0.5}  # b is back, from 0
    assert step(None, two) == {ka: 8.0, kb: 0.5}  # a missing reading keeps the baseline
    # A collection where NVML listed no GPU keeps everything; one where it listed others
    # drops the GPU that is gone.
    ledger.advance([], {})
    assert set(ledger.totals) == {ka, kb}
    ledger.advance([DeviceDraw(U1, None, SOURCE_NVML, 1.0, SOURCE_NVML)], {U1: []})
    assert ledger.totals == {}


def test_energy_of_the_only_gpu_leaves_when_nvml_lists_none() -> None:
    """A collection where NVML answered but listed no GPU (the node's only one unbound or
    lost) drops that GPU's containers, as one where it listed others does; one without NVML's
    answer (NVML down) keeps them."""
    ledger = EnergyLedger()
    parts = split_power(ONE_GPU, [att(1, A, sm=1.0)])
    for mj in (1_000.0, 3_000.0):
        ledger.advance([DeviceDraw(U0, None, SOURCE_NVML, mj / 1000, SOURCE_NVML)], parts)
    assert list(ledger.totals.values()) == [2.0]
    ledger.advance([], {})
    assert list(ledger.totals.values()) == [2.0]
    ledger.advance([], {}, answered=True)
    assert ledger.totals == {}


# --------------------------------------------------------------------------- the full stack

NODE = "power-node"
SHARED_GPU, IDLE_GPU = (
    GpuDevice(0, "GPU-5a5a5a5a-0000-4000-8000-000000000000", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(1, "GPU-6b6b6b6b-1111-4111-8111-111111111111", "NVIDIA A100-SXM4-80GB"),
)
CHAT = SimPod(
    "inference",
    "chat-0",
    "aaaaaaaa-0000-4000-8000-000000000001",
    "server",
    cid(0x51),
    ("StatefulSet", "chat"),
    "nvidia.com/gpu",
)
EMBED = SimPod(
    "search",
    "embed-0",
    "aaaaaaaa-0000-4000-8000-000000000002",
    "embedder",
    cid(0x52),
    ("StatefulSet", "embed"),
    "nvidia.com/gpu",
)
POWER_NODE = SimNode(
    NODE,
    (SHARED_GPU, IDLE_GPU),
    (),
    (
        SimProc(301, "python", 0, None, 20_000, 0.6, CHAT),
        SimProc(302, "python", 0, None, 4_000, 0.2, EMBED),
    ),
    (CHAT, EMBED),
)


def upstream_text(watts: float, millijoules: float) -> str:
    """A dcgm-exporter body with the two GPUs' power fields (the idle one at 60 W)."""
    lines = [
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
    ]
    for gpu, w in ((SHARED_GPU, watts), (IDLE_GPU, 60.0)):
        lines.append(
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="{gpu.index}",UUID="{gpu.uuid}",'
            f'device="nvidia{gpu.index}",modelName="{gpu.name}",Hostname="exporter"}} {w}'
        )
    lines += [
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
    ]
    for gpu, mj in ((SHARED_GPU, millijoules), (IDLE_GPU, 7_000_000)):
        lines.append(
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{gpu.index}",UUID="{gpu.uuid}",'
            f'device="nvidia{gpu.index}",modelName="{gpu.name}",Hostname="exporter"}} {mj}'
        )
    return "\n".join(lines) + "\n"


def values(text: str, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for s in series(text, name):
        out[(s["gpu"], s.get("pod", ""), s.get("reason", ""))] = round(float(s["__value__"]), 6)
    return out


def nvml_at(timestamp: int) -> Any:
    """The node's fake NVML state with one more utilization sample per process at
    ``timestamp`` (NVML's clock), so every read finds fresh SM samples: 60% and 20%."""
    state = nvml_state_of(POWER_NODE)
    for p in POWER_NODE.procs:
        state.util(p.pid, timestamp, round(100 * p.util), gpu=p.gpu)
    return state


async def start(full_stack: MakeStack, upstream: Callable[[], str] | None, nvml: Any) -> Any:
    def proc(root: Path) -> None:
        write_proc_tree(root, POWER_NODE, 1_700_000_000.0)

    return await full_stack(
        upstream=upstream,
        nvml=nvml,
        proc=proc,
        node=NODE,
        pods=[pod_object(p, NODE) for p in POWER_NODE.pods],
    )


async def test_shared_gpu_power_and_energy_from_the_upstream(
    full_stack: MakeStack, fake_nvml: FakeNvml, promtools: list[str]
) -> None:
    """Through the real app: the time-sliced GPU's watts go to its two pods by SM time (NVML's
    per-process utilization, 60% and 20%: 3 to 1), the idle GPU's to ``idle``; energy counts
    the upstream counter's increase from the second collection on, by the same shares, and a
    counter reset adds nothing."""
    reading: dict[str, Any] = {"w": 400.0, "mj": 1_000_000}
    node = await start(
        full_stack, lambda: upstream_text(reading["w"], reading["mj"]), nvml_at(2_000)
    )
    text = await node.scrape()
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    assert values(text, POWER) == {("0", "chat-0", ""): 300.0, ("0", "embed-0", ""): 100.0}
    assert values(text, UNATTR_POWER) == {("1", "", REASON_IDLE): 60.0}
    assert values(text, ENERGY) == {("0", "chat-0", ""): 0.0, ("0", "embed-0", ""): 0.0}
    # The series carry the upstream's device labels.
    assert {s["Hostname"] for s in series(text, POWER)} == {"exporter"}

    reading.update(w=200.0, mj=1_800_000)  # 800 J since the last collection
    fake_nvml.write(nvml_at(3_000))
    text = await node.scrape()
    assert values(text, POWER) == {("0", "chat-0", ""): 150.0, ("0", "embed-0", ""): 50.0}
    assert values(text, ENERGY) == {("0", "chat-0", ""): 600.0, ("0", "embed-0", ""): 200.0}

    reading.update(mj=400)  # the counter went down: a reset, this interval counts nothing
    fake_nvml.write(nvml_at(4_000))
    text = await node.scrape()
    assert values(text, ENERGY) == {("0", "chat-0", ""): 600.0, ("0", "embed-0", ""): 200.0}
    reading.update(mj=4_400)
    fake_nvml.write(nvml_at(5_000))
    text = await node.scrape()
    assert values(text, ENERGY) == {("0", "chat-0", ""): 603.0, ("0", "embed-0", ""): 201.0}


async def test_nvml_power_when_the_upstream_has_none(
    full_stack: MakeStack, fake_nvml: FakeNvml
) -> None:
    """An upstream without the power fields (or none at all): NVML's nvmlDeviceGetPowerUsage
    and nvmlDeviceGetTotalEnergyConsumption through pynvml, in NVML's units (mW, mJ)."""
    state = nvml_at(2_000).power(0, 250_000, 9_000_000).power(1, 55_500, 1_000)
    node = await start(full_stack, None, state)
    text = await node.scrape()
    assert values(text, POWER) == {("0", "chat-0", ""): 187.5, ("0", "embed-0", ""): 62.5}
    assert values(text, UNATTR_POWER) == {("1", "", REASON_IDLE): 55.5}
    fake_nvml.write(nvml_at(3_000).power(0, 250_000, 9_400_000).power(1, 55_500, 1_000))
    text = await node.scrape()
    assert values(text, ENERGY) == {("0", "chat-0", ""): 300.0, ("0", "embed-0", ""): 100.0}
    # The node page shows each container's watts.
    page = await (await node.client.get("/")).text()
    assert "187.5 W" in page and "62.5 W" in page and "55.5 W" in page


async def test_a_gpu_that_leaves_and_comes_back(full_stack: MakeStack, fake_nvml: FakeNvml) -> None:
    """Through the real app: the collection that finds the shared GPU unbound (its handle
    lost) writes none of its containers' series, read through the stale handle or kept from
    before, and says so in the nvml source's self-metrics; the next initialises NVML again
    and is up, the idle GPU read under its new index; bound again, the GPU and its containers
    are back within the retry interval (0 here), without a restart."""
    node = await full_stack(
        upstream=lambda: upstream_text(400.0, 1_000_000),
        nvml=nvml_at(2_000),
        proc=lambda root: write_proc_tree(root, POWER_NODE, 1_700_000_000.0),
        node=NODE,
        pods=[pod_object(p, NODE) for p in POWER_NODE.pods],
        gpu=fake_nvml.source(retry_interval=0.0),
    )

    def nvml_health(text: str) -> tuple[str, str]:
        (up,) = [s for s in series(text, "dcgm_enricher_source_up") if s["source"] == "nvml"]
        (errors,) = [
            s for s in series(text, "dcgm_enricher_source_errors_total") if s["source"] == "nvml"
        ]
        return up["__value__"], errors["__value__"]

    def containers(text: str) -> set[tuple[str, str]]:
        return {
            (s["UUID"], s["pod"])
            for name in (POWER, ENERGY, LAST_ACTIVE, "gpu_container_memory_used_bytes")
            for s in series(text, name)
        }

    on_shared = {(SHARED_GPU.uuid, "chat-0"), (SHARED_GPU.uuid, "embed-0")}
    text = await node.scrape()
    assert containers(text) == on_shared and nvml_health(text) == ("1.0", "0.0")

    unbound = FakeNvmlState(driver=POWER_NODE.driver).gpu(uuid=IDLE_GPU.uuid, name=IDLE_GPU.name)
    fake_nvml.write(unbound)
    text = await node.scrape()
    assert containers(text) == set() and nvml_health(text) == ("0.0", "1.0")
    assert values(text, UNATTR_POWER) == {("1", "", REASON_IDLE): 60.0}
    text = await node.scrape()
    assert containers(text) == set() and nvml_health(text) == ("1.0", "1.0")
    assert values(text, UNATTR_POWER) == {("1", "", REASON_IDLE): 60.0}

    fake_nvml.write(nvml_at(3_000))
    text = await node.scrape()
    assert containers(text) == on_shared and nvml_health(text) == ("1.0", "1.0")


def test_the_rewrites_watched_lines_give_the_whole_bodys_power() -> None:
    """The power split reads the upstream's power families from the lines the Rewriter hands
    over (RewriteResult.watched) instead of the whole body: on dcgm-exporter's shapes, over
    collections served by the line-by-line path and by the template, the same readings."""
    for shape in ("node8", "mig56"):
        rw = Rewriter(watch=WATCH_NAMES)
        fast = []
        for variant in range(3):
            text = payloads.generate(shape, variant, 0)
            got = rw.rewrite(text, RewritePlan())
            fast.append(got.fast)
            whole = upstream_power(read_body(text))
            assert whole.power_watts and upstream_power(read_upstream(text, got.watched)) == whole
            assert got.watched == tuple(watched_lines(text, WATCH_NAMES))
        assert fast == [False, True, True]


def named_upstream_text(naming: str, watts: float, joules: float, energy: str = "") -> str:
    """The power node's body as a release of ``naming`` writes it: each field under that
    naming's name (the field table), in its unit (4.8: mJ; 4.9 on: J). ``energy``: another
    name for the energy field (a release the table does not know)."""
    t = table()
    power_name = t.name("power", naming)
    energy_fn = t.field("energy").by_naming[naming]
    energy_name = energy or energy_fn.name
    lines = [f"# TYPE {power_name} gauge", f"# TYPE {energy_name} counter"]
    for gpu, w, j in ((SHARED_GPU, watts, joules), (IDLE_GPU, 60.0, 7_000.0)):
        labels = (
            f'gpu="{gpu.index}",UUID="{gpu.uuid}",device="nvidia{gpu.index}",'
            f'modelName="{gpu.name}",hostname="exporter"'
        )
        lines.append(f"{power_name}{{{labels}}} {w}")
        lines.append(f"{energy_name}{{{labels}}} {round(j / energy_fn.scale)}")
    return "\n".join(lines) + "\n"


async def test_a_node_upgraded_between_two_collections_keeps_counting(
    full_stack: MakeStack, fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """dcgm-exporter goes from 4.8.4 to 4.10.0 between two collections: the power split goes
    on, the energy counter read in joules on both sides adds the increase across the rename
    (the same counter under another name and unit), and the naming the enricher reports
    follows. A later release that renames the energy field again is reported, not guessed."""
    body = {"text": named_upstream_text("4.8", 400.0, 1_000.0)}
    node = await start(full_stack, lambda: body["text"], nvml_at(2_000))
    caplog.set_level(logging.INFO, logger="enricher")
    text = await node.scrape()
    assert values(text, POWER) == {("0", "chat-0", ""): 300.0, ("0", "embed-0", ""): 100.0}
    assert 'dcgm_enricher_upstream_naming_info{naming="4.8"' in text
    body["text"] = named_upstream_text("4.10", 400.0, 1_004.0)  # 4 J later, in J
    fake_nvml.write(nvml_at(3_000))
    text = await node.scrape()
    assert values(text, POWER) == {("0", "chat-0", ""): 300.0, ("0", "embed-0", ""): 100.0}
    assert values(text, ENERGY) == {("0", "chat-0", ""): 3.0, ("0", "embed-0", ""): 1.0}
    assert 'dcgm_enricher_upstream_naming_info{naming="4.9"' in text
    assert "naming changed from 4.8 to 4.9" in caplog.text
    # The next release renames the energy field: no energy is counted on a guess.
    body["text"] = named_upstream_text("4.10", 400.0, 1_008.0, energy="DCGM_FI_DEV_ENERGY_J")
    fake_nvml.write(nvml_at(4_000))
    text = await node.scrape()
    assert 'dcgm_enricher_upstream_field_missing{field="energy",node="power-node"} 1.0' in text
    assert 'dcgm_enricher_upstream_fields{node="power-node",table="unknown"} 1.0' in text
    assert "DCGM_FI_DEV_ENERGY_J{" in text  # passed through untouched
    # One warning per change of what is missing: this body has no memory or utilization field
    # at all (the first warning, at the first collection), then lost its energy too.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "energy" not in warnings[0] and "energy" in warnings[1]
    await node.scrape()  # the same body again: no more warnings
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
