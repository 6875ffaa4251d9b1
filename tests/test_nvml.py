"""Tests for enricher.nvml; its pure parsing is tested in tests/test_nvmlparse.py.

NvmlSource is tested through the real pynvml against devkit/fakenvml/fake_nvml.c, a fake
libnvidia-ml.so.1 built here with gcc: the only stand-in is the library itself, because no GPU
or NVIDIA driver exists on the test machines.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from devkit import nvmlfake
from devkit.clocks import Clock
from devkit.nvmlfake import FakeNvml, FakeNvmlState
from enricher.model import GpuProcess, ProcessKind
from enricher.nvml import NvmlUnavailable
from enricher.nvmlcalls import UTILIZATION_RETRY_SECONDS
from enricher.nvmlparse import (
    REASON_DRIVER_NOT_LOADED,
    REASON_INIT_FAILED,
    REASON_LIBRARY_NOT_FOUND,
)

ROOT = Path(__file__).resolve().parent.parent
C, G, M = ProcessKind.COMPUTE, ProcessKind.GRAPHICS, ProcessKind.MPS
GIB = 1 << 30


@pytest.fixture
def fake(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeNvml]:
    f = nvmlfake.install_fake_nvml(tmp_path_factory, tmp_path, monkeypatch)
    yield f
    f.close()


def by_key(processes: tuple[GpuProcess, ...]) -> dict[tuple[int, int | None, int], GpuProcess]:
    return {(p.gpu_index, p.gi_id, p.pid): p for p in processes}


# --------------------------------------------------------------------------- through the fake


def test_plain_gpus_with_all_lists_deduplicated(fake: FakeNvml) -> None:
    state = (
        FakeNvmlState(driver="535.129.03")
        .gpu(name="NVIDIA A100-SXM4-80GB")
        .gpu(name="NVIDIA L4", mig=None)
        .process(10, gpu=0, memory=3 * GIB, kind=C)
        .process(10, gpu=0, memory=GIB, kind=M)
        .process(11, gpu=0, memory=GIB, kind=G)
        .process(10, gpu=1, memory=2 * GIB, kind=C)
    )
    fake.write(state)
    src = fake.source()
    before = time.time()
    snap = src.fetch()
    after = time.time()

    assert snap.errors == ()
    assert src.errors_total == 0
    assert snap.driver_version == "535.129.03"
    assert before <= snap.taken_at <= after
    assert [(d.index, d.uuid, d.name, d.mig_enabled) for d in snap.devices] == [
        (0, nvmlfake.default_gpu_uuid(0), "NVIDIA A100-SXM4-80GB", False),
        (1, nvmlfake.default_gpu_uuid(1), "NVIDIA L4", False),  # MIG not supported: off
    ]
    assert snap.migs == ()
    procs = by_key(snap.processes)
    assert set(procs) == {(0, None, 10), (0, None, 11), (1, None, 10)}
    assert procs[(0, None, 10)].kinds == {C, M}
    assert procs[(0, None, 10)].used_memory_bytes == 3 * GIB
    assert procs[(0, None, 11)].kinds == {G}
    assert procs[(1, None, 10)].used_memory_bytes == 2 * GIB
    assert procs[(1, None, 10)].gpu_uuid == nvmlfake.default_gpu_uuid(1)


def test_mig_gpu_with_processes_on_two_instances(fake: FakeNvml) -> None:
    state = (
        FakeNvmlState()
        .gpu(name="NVIDIA A100-SXM4-40GB", mig=True)
        # Slots 0 and 3: the empty slots between answer NOT_FOUND and must be skipped.
        .mig(0, gi=1, ci=0, profile="1g.5gb", slot=0)
        .mig(0, gi=2, ci=0, name="NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", slot=3)
        .process(100, gpu=0, gi=1, memory=GIB)
        .process(200, gpu=0, gi=2, memory=2 * GIB, kind=G)
        .process(200, gpu=0, gi=2, memory=GIB, kind=C)
    )
    fake.write(state)
    snap = fake.source().fetch()

    assert snap.errors == ()
    assert [d.mig_enabled for d in snap.devices] == [True]
    gpu_uuid = nvmlfake.default_gpu_uuid(0)
    assert [(m.gpu_uuid, m.gpu_index, m.gi_id, m.ci_id, m.uuid, m.profile) for m in snap.migs] == [
        (gpu_uuid, 0, 1, 0, nvmlfake.default_mig_uuid(0, 1, 0), "1g.5gb"),
        (gpu_uuid, 0, 2, 0, nvmlfake.default_mig_uuid(0, 2, 0), "3g.20gb"),
    ]
    procs = by_key(snap.processes)
    assert set(procs) == {(0, 1, 100), (0, 2, 200)}
    assert procs[(0, 2, 200)].kinds == {C, G}
    assert procs[(0, 2, 200)].used_memory_bytes == 2 * GIB
    # Each instance's list was read from its own MIG handle, not from the parent GPU.
    listed = {call[1] for call in fake.calls() if call[0].startswith("nvmlDeviceGetCompute")}
    assert listed == {"gpu0/mig0", "gpu0/mig3"}


def test_memory_not_available(fake: FakeNvml) -> None:
    fake.write(
        FakeNvmlState()
        .gpu()
        .process(5, memory=None)
        .process(6, memory=None, kind=C)
        .process(6, memory=4096, kind=G)
    )
    procs = by_key(fake.source().fetch().processes)
    assert procs[(0, None, 5)].used_memory_bytes is None
    assert procs[(0, None, 6)].used_memory_bytes == 4096


def test_utilization_mean_clamp_and_missing_samples(fake: FakeNvml) -> None:
    state = (
        FakeNvmlState()
        .gpu()
        .gpu()
        .gpu()
        .gpu(mig=True)
        .mig(3, gi=1)
        .process(10, gpu=0)
        .process(11, gpu=0)
        .process(12, gpu=0)
        .util(10, timestamp=100, sm=50, gpu=0)
        .util(10, timestamp=200, sm=70, gpu=0)
        .util(11, timestamp=150, sm=180, gpu=0)
        .util(99, timestamp=150, sm=90, gpu=0)  # a pid NVML no longer lists
        .process(20, gpu=1)  # GPU 1 has no samples at all: NOT_FOUND
        .process(30, gpu=2)
        .fail("nvmlDeviceGetProcessUtilization", nvmlfake.ERROR_NOT_SUPPORTED, gpu=2)
        .process(40, gpu=3, gi=1)
        .util(40, timestamp=100, sm=40, gpu=3, gi=1)
        .fail("nvmlDeviceGetProcessUtilization", nvmlfake.ERROR_FUNCTION_NOT_FOUND, gpu=3, gi=1)
    )
    fake.write(state)
    snap = fake.source().fetch()
    assert snap.errors == ()
    ratios = {(p.gpu_index, p.pid): p.sm_util_ratio for p in snap.processes}
    assert ratios == pytest.approx(
        {(0, 10): 0.6, (0, 11): 1.0, (0, 12): 0.0, (1, 20): 0.0, (2, 30): None, (3, 40): None}
    )


def test_unsupported_utilization_is_asked_again_only_after_a_while(fake: FakeNvml) -> None:
    """A device whose process utilization NVML does not support (every MIG device on real
    NVML) is not asked on every fetch: once per UTILIZATION_RETRY_SECONDS (its processes have
    no SM ratio meanwhile); a device that answers is asked every time, and one that starts
    answering is asked every time again."""
    now = [1000.0]

    def node() -> FakeNvmlState:  # the builder adds to itself: a new one each time
        return (
            FakeNvmlState()
            .gpu()
            .gpu(mig=True)
            .mig(1, gi=1)
            .process(10, gpu=0)
            .util(10, timestamp=100, sm=50, gpu=0)
            .process(40, gpu=1, gi=1)
        )

    fake.write(node().fail("nvmlDeviceGetProcessUtilization", nvmlfake.ERROR_NOT_SUPPORTED, 1, 1))
    src = fake.source(clock=lambda: now[0])

    def asked() -> list[str]:
        calls = fake.calls_of("nvmlDeviceGetProcessUtilization")
        fake.clear_log()
        return sorted({c[1] for c in calls})

    def ratios() -> dict[int, float | None]:
        return {p.pid: p.sm_util_ratio for p in src.fetch().processes}

    assert ratios() == {10: pytest.approx(0.5), 40: None}
    assert asked() == ["gpu0", "gpu1/mig0"]
    now[0] += UTILIZATION_RETRY_SECONDS - 1
    assert ratios() == {10: 0.0, 40: None}  # nothing newer on GPU 0: idle
    assert asked() == ["gpu0"]
    now[0] += 2
    fake.write(node().util(40, timestamp=500, sm=30, gpu=1, gi=1))  # the driver learnt it
    assert ratios() == {10: 0.0, 40: pytest.approx(0.3)}
    assert asked() == ["gpu0", "gpu1/mig0"]
    assert ratios() == {10: 0.0, 40: 0.0}
    assert asked() == ["gpu0", "gpu1/mig0"]


def test_utilization_last_seen_timestamp_advances(fake: FakeNvml) -> None:
    state = FakeNvmlState().gpu().process(10).util(10, timestamp=100, sm=50).util(10, 200, sm=70)
    fake.write(state)
    src = fake.source()
    assert src.fetch().processes[0].sm_util_ratio == pytest.approx(0.6)

    fake.write(state.util(10, timestamp=300, sm=10))
    assert src.fetch().processes[0].sm_util_ratio == pytest.approx(0.1)

    # Nothing newer than 300: NVML says NOT_FOUND, which means idle, not unknown.
    assert src.fetch().processes[0].sm_util_ratio == 0.0

    queries = fake.calls_of("nvmlDeviceGetProcessUtilization")
    assert [call[3] for call in queries] == ["0", "200", "300"]


def test_utilization_timestamp_is_per_device(fake: FakeNvml) -> None:
    state = (
        FakeNvmlState()
        .gpu()
        .gpu()
        .process(1, gpu=0)
        .process(2, gpu=1)
        .util(1, timestamp=500, sm=20, gpu=0)
        .util(2, timestamp=50, sm=30, gpu=1)
    )
    fake.write(state)
    src = fake.source()
    src.fetch()
    fake.clear_log()
    fake.write(state.util(2, timestamp=60, sm=90, gpu=1))
    snap = src.fetch()
    # GPU 1's clock is behind GPU 0's; sharing one timestamp would hide its new sample.
    assert by_key(snap.processes)[(1, None, 2)].sm_util_ratio == pytest.approx(0.9)
    queries = fake.calls_of("nvmlDeviceGetProcessUtilization")
    assert {call[1]: call[3] for call in queries} == {"gpu0": "500", "gpu1": "50"}


@pytest.mark.parametrize(
    ("failing", "code", "expected_version"),
    [
        pytest.param(("_v3",), nvmlfake.ERROR_FUNCTION_NOT_FOUND, "_v2", id="v3-missing"),
        pytest.param(("_v3",), nvmlfake.ERROR_ARGUMENT_VERSION_MISMATCH, "_v2", id="v3-mismatch"),
        pytest.param(("_v3", "_v2"), nvmlfake.ERROR_FUNCTION_NOT_FOUND, "", id="v3-v2-missing"),
    ],
)
def test_process_list_version_fallback(
    fake: FakeNvml, failing: tuple[str, ...], code: int, expected_version: str
) -> None:
    state = (
        FakeNvmlState()
        .gpu()
        .gpu()
        .process(10, gpu=0, memory=GIB, kind=C)
        .process(11, gpu=0, memory=None, kind=G)
        .process(12, gpu=1, memory=7, kind=M)
    )
    bases = [
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ]
    for base in bases:
        for suffix in failing:
            state.fail(base + suffix, code)
    fake.write(state)
    src = fake.source()
    for _ in range(2):
        snap = src.fetch()
        assert snap.errors == ()
        assert {(p.gpu_index, p.pid, p.used_memory_bytes, *p.kinds) for p in snap.processes} == {
            (0, 10, GIB, C),
            (0, 11, None, G),
            (1, 12, 7, M),
        }
    for base in bases:
        # Two GPUs x two fetches, but each failing symbol was tried once only.
        for suffix in failing:
            assert len(fake.calls_of(base + suffix)) == 1, base + suffix
        assert len(fake.calls_of(base + expected_version)) == 4, base + expected_version


def test_fake_follows_the_size_query_protocol(fake: FakeNvml) -> None:
    fake.write(FakeNvmlState().gpu().process(1).process(2).process(3))
    src = fake.source()
    src.fetch()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fn = pynvml.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3
    buffer = (pynvml.c_nvmlProcessInfo_v3_t * 2)()
    count = ctypes.c_uint(0)
    assert fn(handle, ctypes.byref(count), None) == nvmlfake.ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count.value = 2
    assert fn(handle, ctypes.byref(count), buffer) == nvmlfake.ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    assert fn(handle, None, None) == nvmlfake.ERROR_INVALID_ARGUMENT
    graphics = pynvml.nvmlLib.nvmlDeviceGetGraphicsRunningProcesses_v3
    count.value = 0
    assert graphics(handle, ctypes.byref(count), None) == nvmlfake.SUCCESS
    assert count.value == 0


def test_many_processes(fake: FakeNvml) -> None:
    state = FakeNvmlState().gpu()
    pids = range(1000, 4000)
    for pid in pids:
        state.process(pid, memory=pid)
    fake.write(state)
    snap = fake.source().fetch()
    assert [(p.pid, p.used_memory_bytes) for p in snap.processes] == [(p, p) for p in pids]


def test_lists_and_samples_longer_than_the_first_buffer(fake: FakeNvml) -> None:
    """A list that does not fit the rows offered first is asked for again with room for all
    (NVML answers INSUFFICIENT_SIZE with the count); a short one takes one call."""
    state = FakeNvmlState().gpu().gpu().process(7, gpu=1).util(7, timestamp=5, sm=40, gpu=1)
    pids = range(100, 180)
    for pid in pids:
        state.process(pid, memory=pid, gpu=0).util(pid, timestamp=pid, sm=pid % 90, gpu=0)
    fake.write(state)
    snap = fake.source().fetch()
    assert snap.errors == ()
    got = {(p.gpu_index, p.pid): (p.used_memory_bytes, p.sm_util_ratio) for p in snap.processes}
    expected = {(0, pid): (pid, pytest.approx((pid % 90) / 100)) for pid in pids}
    assert got == {**expected, (1, 7): (GIB, pytest.approx(0.4))}
    for symbol in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization"):
        per_gpu = [c[1] for c in fake.calls_of(symbol)]
        assert per_gpu == ["gpu0", "gpu0", "gpu1"], symbol  # 80 rows: asked twice; 1 row: once


def test_the_reused_first_buffer_gives_each_list_only_its_own_rows(fake: FakeNvml) -> None:
    """The lists of one read share the first call's buffer (the source reads one at a time):
    a short list after a long one, or a list that shrinks between reads, must not bring back
    rows the buffer still holds from before."""
    long = FakeNvmlState().gpu().gpu().gpu()
    for pid in range(100, 120):
        long.process(pid, gpu=0, memory=pid).util(pid, timestamp=pid, sm=50, gpu=0)
    long.process(7, gpu=1, memory=7).util(7, timestamp=5, sm=40, gpu=1)
    fake.write(long)
    src = fake.source()
    for _ in range(2):  # the first read learns each list's version; the second reads directly
        snap = src.fetch()
        assert snap.errors == ()
        by_gpu = {i: sorted(p.pid for p in snap.processes if p.gpu_index == i) for i in range(3)}
        assert by_gpu == {0: list(range(100, 120)), 1: [7], 2: []}
    fake.write(FakeNvmlState().gpu().gpu().gpu().process(100, gpu=0, memory=1))
    snap = src.fetch()
    assert [(p.gpu_index, p.pid, p.used_memory_bytes) for p in snap.processes] == [(0, 100, 1)]


def test_a_list_that_fails_after_its_version_was_learnt(fake: FakeNvml) -> None:
    """Once a list's version has answered it is called directly; a failure there takes the
    full path again, which reports it as before (the symbol, the GPU) and keeps the others."""
    state = FakeNvmlState().gpu().gpu().process(10, gpu=0).process(11, gpu=1)
    fake.write(state)
    src = fake.source()
    assert [p.pid for p in src.fetch().processes] == [10, 11]
    fake.write(
        state.fail("nvmlDeviceGetComputeRunningProcesses_v3", nvmlfake.ERROR_GPU_IS_LOST, gpu=1)
    )
    snap = src.fetch()
    assert [p.pid for p in snap.processes] == [10]
    assert len(snap.errors) == 1 and snap.errors[0].startswith("gpu 1: ")
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in snap.errors[0]
    assert "GPU is lost" in snap.errors[0]
    fake.write(FakeNvmlState().gpu().gpu().process(10, gpu=0).process(11, gpu=1))
    assert [p.pid for p in src.fetch().processes] == [10, 11]


def test_identity_is_read_once_per_init(fake: FakeNvml) -> None:
    """Handle, UUID and name of a GPU, the driver version and MIG instances' identities do not
    change while NVML stays initialised: read on the first fetch, not on every one; slots,
    MIG mode and the lists are read every time."""
    state = FakeNvmlState().gpu().gpu(mig=True).mig(1, gi=1).process(5, gpu=0)
    fake.write(state)
    src = fake.source()
    first = src.fetch()
    fake.clear_log()
    again = src.fetch()
    assert (again.devices, again.migs, again.driver_version) == (
        first.devices,
        first.migs,
        first.driver_version,
    )
    for once in (
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetName",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetMaxMigDeviceCount",
    ):
        assert fake.count(once) == 0, once
    assert fake.count("nvmlDeviceGetMigMode") == 2
    assert [c[1] for c in fake.calls_of("nvmlDeviceGetUUID")] == ["gpu1/mig0"]  # the slot's
    # After a re-init (NVML went away and came back) everything is read again.
    src.close()
    fake.clear_log()
    assert src.fetch().devices == first.devices
    assert fake.count("nvmlDeviceGetHandleByIndex_v2") == 2


def test_mig_instances_recreated_while_running(fake: FakeNvml) -> None:
    """MIG instances come and go without a re-init: a slot that now holds another instance
    (another UUID) is read afresh, never reported with the old instance's ids or profile."""
    base = FakeNvmlState().gpu(mig=True)
    fake.write(base.mig(0, gi=1, profile="1g.10gb", slot=0).process(5, gpu=0, gi=1))
    src = fake.source()
    assert [(m.gi_id, m.profile) for m in src.fetch().migs] == [(1, "1g.10gb")]
    again = FakeNvmlState().gpu(mig=True).mig(0, gi=2, profile="3g.40gb", slot=0)
    fake.write(again.process(6, gpu=0, gi=2))
    snap = src.fetch()
    assert [(m.gi_id, m.profile, m.uuid) for m in snap.migs] == [
        (2, "3g.40gb", nvmlfake.default_mig_uuid(0, 2, 0))
    ]
    assert [(p.gi_id, p.pid) for p in snap.processes] == [(2, 6)]


def test_gpu_identity_read_again_after_a_failure(fake: FakeNvml) -> None:
    """A GPU whose read fails (in a way that does not say it is lost) is forgotten: its
    handle, UUID and name are read again on the next fetch, the other GPUs' are not, and
    NVML is not initialised again."""
    state = FakeNvmlState().gpu().gpu().process(5, gpu=1)
    fake.write(state)
    src = fake.source()
    src.fetch()
    failing = FakeNvmlState().gpu().gpu().process(5, gpu=1)
    failing.fail("nvmlDeviceGetMigMode", nvmlfake.ERROR_UNKNOWN, gpu=1)
    fake.write(failing)
    assert [d.index for d in src.fetch().devices] == [0]
    fake.write(state)
    fake.clear_log()
    snap = src.fetch()
    assert [(d.index, d.uuid) for d in snap.devices] == [
        (0, nvmlfake.default_gpu_uuid(0)),
        (1, nvmlfake.default_gpu_uuid(1)),
    ]
    assert [c[2] for c in fake.calls_of("nvmlDeviceGetHandleByIndex_v2")] == ["1"]
    assert fake.count("nvmlInitWithFlags") == 0
    assert src.reinitializations_total == 0


def test_fake_reload_changed_mode(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE_NVML_RELOAD=changed (the benchmark's mode) still sees every rewrite of the state."""
    monkeypatch.setenv("FAKE_NVML_RELOAD", "changed")
    fake.write(FakeNvmlState().gpu().process(5))
    src = fake.source()
    assert [p.pid for p in src.fetch().processes] == [5]
    assert [p.pid for p in src.fetch().processes] == [5]
    for pids in ([6], [6, 7], [8]):
        state = FakeNvmlState().gpu()
        for pid in pids:
            state.process(pid)
        fake.write(state)
        assert [p.pid for p in src.fetch().processes] == pids


def test_state_over_the_fake_limits_fails_init_instead_of_overflowing(fake: FakeNvml) -> None:
    state = FakeNvmlState().gpu()
    for pid in range(4097):
        state.process(pid + 1)
    fake.write(state)
    with pytest.raises(NvmlUnavailable) as info:
        fake.source().fetch()
    assert info.value.reason == REASON_INIT_FAILED
    assert "999" in str(info.value)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(nvmlfake.ERROR_DRIVER_NOT_LOADED, REASON_DRIVER_NOT_LOADED, id="driver"),
        pytest.param(nvmlfake.ERROR_UNKNOWN, REASON_INIT_FAILED, id="unknown"),
    ],
)
def test_init_failure_waits_for_the_retry_interval(fake: FakeNvml, code: int, reason: str) -> None:
    good = FakeNvmlState().gpu().process(42)
    fake.write(FakeNvmlState().gpu().process(42).fail_init(code))
    clock = Clock()
    src = fake.source(retry_interval=30.0, clock=clock)

    with pytest.raises(NvmlUnavailable) as first:
        src.fetch()
    assert first.value.reason == reason
    assert fake.count("nvmlInitWithFlags") == 1

    fake.write(good)
    clock.now += 29.0
    with pytest.raises(NvmlUnavailable) as cached:
        src.fetch()
    assert cached.value.reason == reason
    assert fake.count("nvmlInitWithFlags") == 1  # not retried inside the interval
    assert src.errors_total == 2

    clock.now += 1.0
    snap = src.fetch()
    assert [p.pid for p in snap.processes] == [42]
    assert fake.count("nvmlInitWithFlags") == 2
    assert src.errors_total == 2


def test_whole_read_failure_reinitialises_after_the_interval(fake: FakeNvml) -> None:
    good = FakeNvmlState().gpu().process(42)
    fake.write(good)
    clock = Clock()
    src = fake.source(retry_interval=10.0, clock=clock)
    assert [p.pid for p in src.fetch().processes] == [42]

    driver_gone = FakeNvmlState().gpu().process(42)
    driver_gone.fail("nvmlDeviceGetCount_v2", nvmlfake.ERROR_DRIVER_NOT_LOADED)
    fake.write(driver_gone)
    with pytest.raises(NvmlUnavailable) as info:
        src.fetch()
    assert info.value.reason == REASON_DRIVER_NOT_LOADED
    assert fake.count("nvmlShutdown") == 1

    fake.write(good)
    clock.now += 5.0
    with pytest.raises(NvmlUnavailable):
        src.fetch()
    assert fake.count("nvmlInitWithFlags") == 1
    assert fake.count("nvmlDeviceGetCount_v2") == 2

    clock.now += 5.0
    assert [p.pid for p in src.fetch().processes] == [42]
    assert fake.count("nvmlInitWithFlags") == 2
    assert src.errors_total == 2


def test_library_path_missing(tmp_path: Path) -> None:
    from enricher.nvml import NvmlSource

    src = NvmlSource(library_path=str(tmp_path / "no-such" / "libnvidia-ml.so.1"))
    with pytest.raises(NvmlUnavailable) as info:
        src.fetch()
    assert info.value.reason == REASON_LIBRARY_NOT_FOUND
    assert "no-such" in str(info.value)
    assert src.errors_total == 1
    src.close()


@pytest.mark.parametrize(
    ("symbol", "gi"),
    [
        pytest.param("nvmlDeviceGetHandleByIndex_v2", None, id="handle"),
        pytest.param("nvmlDeviceGetUUID", None, id="uuid"),
        pytest.param("nvmlDeviceGetMigMode", None, id="mig-mode"),
        pytest.param("nvmlDeviceGetComputeRunningProcesses_v3", None, id="processes"),
        pytest.param("nvmlDeviceGetProcessUtilization", None, id="utilization"),
        pytest.param("nvmlDeviceGetGpuInstanceId", 2, id="one-mig-instance"),
    ],
)
def test_gpu_lost_on_one_device(fake: FakeNvml, symbol: str, gi: int | None) -> None:
    state = (
        FakeNvmlState()
        .gpu()
        .gpu(mig=True)
        .mig(1, gi=1)
        .mig(1, gi=2)
        .gpu()
        .process(10, gpu=0)
        .process(11, gpu=1, gi=1)
        .process(12, gpu=2)
        .fail(symbol, nvmlfake.ERROR_GPU_IS_LOST, gpu=1, gi=gi)
    )
    fake.write(state)
    src = fake.source()
    snap = src.fetch()
    assert [d.index for d in snap.devices] == [0, 2]
    assert snap.migs == ()
    assert [(p.gpu_index, p.pid) for p in snap.processes] == [(0, 10), (2, 12)]
    assert len(snap.errors) == 1
    assert snap.errors[0].startswith("gpu 1: ")
    assert symbol.removesuffix("_v2") in snap.errors[0]
    assert "GPU is lost" in snap.errors[0]
    assert src.errors_total == 1
    src.fetch()
    assert src.errors_total == 2


# --------------------------------------------------------------------------- GPUs that come and go

GPU_A, GPU_B, GPU_C = (nvmlfake.default_gpu_uuid(i) for i in range(3))
PID = {GPU_A: 10, GPU_B: 11, GPU_C: 12}  # each GPU's own process


def gpus(*uuids: str, rebound: tuple[str, ...] = ()) -> FakeNvmlState:
    """A node whose GPUs are listed in this order (as an init would number them), each with
    its own process; those ``rebound`` were unbound from the driver and bound again."""
    state = FakeNvmlState()
    for uuid in uuids:
        state.gpu(uuid=uuid, binding=int(uuid in rebound))
    for index, uuid in enumerate(uuids):
        state.process(PID[uuid], gpu=index)
    return state


def seen(snap: Any) -> list[tuple[int, str]]:
    """The snapshot's GPUs, after checking that every process is on the GPU it really runs on
    (never one read through another GPU's handle) and under that GPU's index."""
    index = {d.uuid: d.index for d in snap.devices}
    for p in snap.processes:
        assert p.gpu_uuid == next(u for u, pid in PID.items() if pid == p.pid), p
        assert p.gpu_index == index[p.gpu_uuid], p
    assert sorted(PID[u] for u in index) == sorted(p.pid for p in snap.processes)
    return [(d.index, d.uuid) for d in snap.devices]


def test_the_fake_fixes_its_gpus_at_init(fake: FakeNvml) -> None:
    """As real NVML: the count and each index's handle are what init found; a handle follows
    its GPU wherever the state lists it; a GPU bound to the driver again, or removed, answers
    GPU_IS_LOST until the next init, which numbers the GPUs as they are then."""
    fake.write(gpus(GPU_A, GPU_B))
    src = fake.source()
    src.fetch()
    second = pynvml.nvmlDeviceGetHandleByIndex(1)
    fake.write(gpus(GPU_A, GPU_C, GPU_B))  # C arrives before B
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlDeviceGetUUID(second) == GPU_B
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(second)] == [PID[GPU_B]]
    rebound, removed = gpus(GPU_A, GPU_C).gpu(uuid=GPU_B, binding=1), gpus(GPU_A, GPU_C)
    for state in (rebound, removed):
        fake.write(state)
        assert pynvml.nvmlDeviceGetCount() == 2  # the fake reads its state again here
        with pytest.raises(pynvml.NVMLError) as lost:
            pynvml.nvmlDeviceGetUUID(second)
        with pytest.raises(pynvml.NVMLError) as lost_index:
            pynvml.nvmlDeviceGetHandleByIndex(1)
        assert lost.value.value == lost_index.value.value == nvmlfake.ERROR_GPU_IS_LOST
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == GPU_A
    fake.write(gpus(GPU_C, GPU_A, GPU_B))
    src.close()
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        found = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    finally:
        pynvml.nvmlShutdown()
    assert (count, found) == (3, [GPU_C, GPU_A, GPU_B])


def test_a_gpu_that_leaves_and_comes_back(fake: FakeNvml) -> None:
    """A GPU that leaves answers GPU_IS_LOST: that fetch drops it (an error, no process read
    through its handle), the next initialises NVML again and numbers the GPUs left; while it
    is missing NVML is initialised again once per retry interval, and the one after it comes
    back lists it, without a restart."""
    clock = Clock()
    src = fake.source(retry_interval=30.0, clock=clock)
    fake.write(gpus(GPU_A, GPU_B, GPU_C))
    assert seen(src.fetch()) == [(0, GPU_A), (1, GPU_B), (2, GPU_C)]

    fake.write(gpus(GPU_A, GPU_C))  # B unbound: C's handle still reads C
    snap = src.fetch()
    assert seen(snap) == [(0, GPU_A), (2, GPU_C)]
    assert len(snap.errors) == 1 and snap.errors[0].startswith("gpu 1: ")
    assert "GPU is lost" in snap.errors[0]
    assert (src.errors_total, src.reinitializations_total) == (1, 0)

    reading = src.read()  # initialised again: the GPUs as they are now
    assert reading.ok and seen(reading.value) == [(0, GPU_A), (1, GPU_C)]
    assert (src.errors_total, src.reinitializations_total) == (1, 1)
    assert fake.count("nvmlShutdown") == 1 and fake.count("nvmlInitWithFlags") == 2

    fake.write(gpus(GPU_A, GPU_B, GPU_C, rebound=(GPU_B,)))  # B bound again, before C
    clock.now += 29.0
    assert seen(src.fetch()) == [(0, GPU_A), (1, GPU_C)]  # looked for once per interval, not now
    assert fake.count("nvmlInitWithFlags") == 2
    clock.now += 1.0
    snap = src.fetch()
    assert seen(snap) == [(0, GPU_A), (1, GPU_B), (2, GPU_C)] and snap.errors == ()
    assert (src.errors_total, src.reinitializations_total) == (1, 2)
    clock.now += 100.0
    src.fetch()  # nothing missing: not initialised again
    assert fake.count("nvmlInitWithFlags") == 3


def test_gpus_that_swap_indices(fake: FakeNvml) -> None:
    """Two GPUs unbound and bound again in the other order: their old handles are lost, so
    the fetch that sees it lists neither (never one's processes under the other's UUID or
    index), and the next lists each under its new index."""
    clock = Clock()
    src = fake.source(clock=clock)
    fake.write(gpus(GPU_A, GPU_B))
    assert seen(src.fetch()) == [(0, GPU_A), (1, GPU_B)]
    fake.write(gpus(GPU_B, GPU_A, rebound=(GPU_A, GPU_B)))
    snap = src.fetch()
    assert seen(snap) == [] and len(snap.errors) == 2
    assert seen(src.fetch()) == [(0, GPU_B), (1, GPU_A)]
    assert src.reinitializations_total == 1


def test_a_gpu_that_arrives_while_another_is_missing(fake: FakeNvml) -> None:
    """The count changes at a new init only: a GPU that takes the place of one that left is
    found when NVML is initialised again to look for the missing one."""
    clock = Clock()
    src = fake.source(retry_interval=10.0, clock=clock)
    fake.write(gpus(GPU_A, GPU_B))
    src.fetch()
    fake.write(gpus(GPU_A))
    assert seen(src.fetch()) == [(0, GPU_A)]
    assert seen(src.fetch()) == [(0, GPU_A)]
    assert pynvml.nvmlDeviceGetCount() == 1
    fake.write(gpus(GPU_A, GPU_C))
    assert seen(src.fetch()) == [(0, GPU_A)]
    clock.now += 10.0
    assert seen(src.fetch()) == [(0, GPU_A), (1, GPU_C)]
    assert src.reinitializations_total == 2


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(nvmlfake.ERROR_GPU_IS_LOST, id="lost"),
        pytest.param(nvmlfake.ERROR_UNINITIALIZED, id="uninitialized"),
    ],
)
def test_a_gpu_lost_for_good_starts_nvml_over_once_per_interval(fake: FakeNvml, code: int) -> None:
    """A GPU that stays enumerated but answers that it is lost (fallen off the bus) makes
    NVML start over at most once per retry interval; each fetch meanwhile reports it, and it
    is read again as soon as it answers."""
    clock = Clock()
    src = fake.source(retry_interval=30.0, clock=clock)
    fake.write(gpus(GPU_A, GPU_B).fail("nvmlDeviceGetMigMode", code, gpu=1))
    for _ in range(4):
        snap = src.fetch()
        assert seen(snap) == [(0, GPU_A)] and len(snap.errors) == 1
        clock.now += 5.0
    assert src.errors_total == 4
    assert (fake.count("nvmlInitWithFlags"), src.reinitializations_total) == (2, 1)
    fake.write(gpus(GPU_A, GPU_B))
    assert seen(src.fetch()) == [(0, GPU_A), (1, GPU_B)]
    assert (fake.count("nvmlInitWithFlags"), src.reinitializations_total) == (2, 1)


def test_mig_mode_changes_between_fetches(fake: FakeNvml) -> None:
    full = FakeNvmlState().gpu().process(10, memory=GIB)
    split = FakeNvmlState().gpu(mig=True).mig(0, gi=3).mig(0, gi=5).process(20, gi=3)
    split.process(21, gi=5)
    fake.write(full)
    src = fake.source()

    first = src.fetch()
    assert [d.mig_enabled for d in first.devices] == [False]
    assert [(p.gi_id, p.pid) for p in first.processes] == [(None, 10)]

    fake.write(split)
    second = src.fetch()
    assert [d.mig_enabled for d in second.devices] == [True]
    assert [m.gi_id for m in second.migs] == [3, 5]
    assert [(p.gi_id, p.pid) for p in second.processes] == [(3, 20), (5, 21)]

    fake.write(full)
    third = src.fetch()
    assert third.migs == ()
    assert [(p.gi_id, p.pid) for p in third.processes] == [(None, 10)]
    assert src.errors_total == 0


def test_unparsable_state_is_an_init_failure(fake: FakeNvml) -> None:
    fake.state_path.write_text("driver 1\ngpu 0 GPU-a 0 NVIDIA X\nproc 0 notapid 1 compute\n")
    with pytest.raises(NvmlUnavailable) as info:
        fake.source().fetch()
    assert info.value.reason == REASON_INIT_FAILED


def test_close_shuts_down_once(fake: FakeNvml) -> None:
    fake.write(FakeNvmlState().gpu())
    src = fake.source()
    src.close()
    assert fake.count("nvmlShutdown") == 0  # never initialised
    src.fetch()
    src.close()
    src.close()
    assert fake.count("nvmlShutdown") == 1
    # A fetch after close initialises again.
    assert len(src.fetch().devices) == 1
    assert fake.count("nvmlInitWithFlags") == 2


# --------------------------------------------------------------------------- child processes

# pynvml keeps the first library it loads for the life of the process, so other builds of the
# fake (and "no library at all") are exercised in a fresh interpreter.
_CHILD = r"""
import json, sys
from enricher.nvml import NvmlSource, NvmlUnavailable

src = NvmlSource(library_path=sys.argv[1] or None)
out = {}
try:
    for _ in range(2):
        snap = src.fetch()
    out["errors"] = list(snap.errors)
    out["processes"] = sorted(
        [p.gpu_index, p.pid, p.used_memory_bytes, sorted(k.value for k in p.kinds)]
        for p in snap.processes
    )
except NvmlUnavailable as exc:
    out["reason"] = exc.reason
finally:
    src.close()
print(json.dumps(out))
"""


def run_child(library: Path | None, env: dict[str, str]) -> dict[str, Any]:
    child_env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    child_env.update(env)
    child_env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(library or "")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=child_env,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.mark.parametrize(
    ("defines", "used"),
    [
        pytest.param(("-DFAKE_NVML_NO_V3",), "_v2", id="no-v3"),
        pytest.param(("-DFAKE_NVML_NO_V3", "-DFAKE_NVML_NO_V2"), "", id="no-v3-no-v2"),
    ],
)
def test_compiled_out_symbols_fall_back(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    defines: tuple[str, ...],
    used: str,
) -> None:
    library = nvmlfake.build_fake_nvml(tmp_path_factory.getbasetemp() / "fakenvml", defines)
    state = (
        FakeNvmlState()
        .gpu()
        .gpu()
        .process(10, gpu=0, memory=GIB, kind=C)
        .process(10, gpu=0, memory=None, kind=G)
        .process(11, gpu=1, memory=None, kind=M)
    )
    state_path = state.write(tmp_path / "state")
    log_path = tmp_path / "log"
    out = run_child(library, {"FAKE_NVML_STATE": str(state_path), "FAKE_NVML_LOG": str(log_path)})

    assert out == {
        "errors": [],
        "processes": [[0, 10, GIB, ["compute", "graphics"]], [1, 11, None, ["mps"]]],
    }
    calls = [line.split() for line in log_path.read_text().splitlines()]
    for base in ("Compute", "Graphics", "MPSCompute"):
        symbol = f"nvmlDeviceGet{base}RunningProcesses"
        queries = [c for c in calls if c[0] == symbol + used]
        assert len(queries) == 4  # 2 GPUs x 2 fetches, one call each (the rows fit)
        assert [c for c in calls if c[0].startswith(symbol) and c[0] != symbol + used] == []


def test_no_library_at_all_in_a_child_process(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("this machine has a real libnvidia-ml")
    out = run_child(None, {"FAKE_NVML_STATE": str(tmp_path / "unused")})
    assert out == {"reason": REASON_LIBRARY_NOT_FOUND}


def test_power_and_energy_read_through_pynvml(fake: FakeNvml) -> None:
    """nvmlDeviceGetPowerUsage (mW) and nvmlDeviceGetTotalEnergyConsumption (mJ) of each full
    GPU, MIG-enabled ones too (asked of the GPU's handle, never a MIG device's); a board
    without a sensor answers NOT_SUPPORTED and has no reading; the processes are unaffected."""
    state = (
        FakeNvmlState()
        .gpu()
        .gpu(mig=True)
        .mig(1, gi=1)
        .gpu(name="NVIDIA T4")
        .power(0, 312_456, 98_765_432_100)
        .power(1, 61_000, 5_000)
        .process(5, gpu=2)
    )
    fake.write(state)
    snap = fake.source().fetch()
    assert snap.errors == ()
    assert [(r.gpu_uuid, r.power_watts, r.energy_millijoules) for r in snap.power] == [
        (nvmlfake.default_gpu_uuid(0), 312.456, 98_765_432_100.0),
        (nvmlfake.default_gpu_uuid(1), 61.0, 5_000.0),
    ]
    assert [p.pid for p in snap.processes] == [5]
    asked = {c[1] for c in fake.calls_of("nvmlDeviceGetPowerUsage")}
    assert asked == {"gpu0", "gpu1", "gpu2"}
    assert {c[1] for c in fake.calls_of("nvmlDeviceGetTotalEnergyConsumption")} == asked


def test_power_failure_other_than_not_supported_fails_that_gpu(fake: FakeNvml) -> None:
    """A lost GPU answering the power call is an error of that GPU's read (reported, the
    others still read), not a silently missing reading; no permission is only a missing one."""
    state = (
        FakeNvmlState()
        .gpu()
        .gpu()
        .power(0, 100_000, 1)
        .power(1, 100_000, 1)
        .fail("nvmlDeviceGetPowerUsage", nvmlfake.ERROR_GPU_IS_LOST, gpu=0)
        .fail("nvmlDeviceGetTotalEnergyConsumption", 4, gpu=1)  # NVML_ERROR_NO_PERMISSION
    )
    fake.write(state)
    snap = fake.source().fetch()
    assert len(snap.errors) == 1 and "nvmlDeviceGetPowerUsage" in snap.errors[0]
    assert [d.index for d in snap.devices] == [1]
    assert [(r.power_watts, r.energy_millijoules) for r in snap.power] == [(100.0, None)]
