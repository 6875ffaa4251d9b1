"""Tests for enricher.nvmlparse: NVML's answers parsed, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from enricher.model import ProcessKind
from enricher.nvmlparse import (
    REASON_DRIVER_NOT_LOADED,
    REASON_INIT_FAILED,
    REASON_LIBRARY_NOT_FOUND,
    REASON_NO_PERMISSION,
    REASON_READ_FAILED,
    REASON_UNINITIALIZED,
    ROWS_SAMPLE,
    ROWS_V1,
    ROWS_V2,
    VALUE_NOT_AVAILABLE_ULL,
    ProcessEntry,
    UtilSample,
    merge_processes,
    newer_samples,
    parse_mig_profile,
    parse_process_rows,
    parse_sample_rows,
    reason_for_code,
    utilization_from_samples,
)

C, G, M = ProcessKind.COMPUTE, ProcessKind.GRAPHICS, ProcessKind.MPS


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb", id="a100"),
        pytest.param("NVIDIA H100 80GB HBM3 MIG 7g.80gb", "7g.80gb", id="h100-full"),
        pytest.param("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me", id="media-ext"),
        pytest.param("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", "3g.40gb", id="ci-prefix"),
        pytest.param("NVIDIA A30 MIG 2g.12gb  ", "2g.12gb", id="trailing-space"),
        pytest.param("NVIDIA A100-SXM4-80GB", "", id="full-gpu"),
        pytest.param("NVIDIA A100 MIG", "", id="no-profile"),
        pytest.param("NVIDIA A100 MIG 1g", "", id="truncated"),
        pytest.param("NVIDIA A100 MIG 1g.5gb trailing", "", id="not-at-end"),
        pytest.param("", "", id="empty"),
    ],
)
def test_parse_mig_profile(name: str, expected: str) -> None:
    assert parse_mig_profile(name) == expected


@pytest.mark.parametrize(
    ("code", "default", "expected"),
    [
        pytest.param(9, REASON_INIT_FAILED, REASON_DRIVER_NOT_LOADED, id="driver"),
        pytest.param(12, REASON_INIT_FAILED, REASON_LIBRARY_NOT_FOUND, id="library"),
        pytest.param(4, REASON_INIT_FAILED, REASON_NO_PERMISSION, id="permission"),
        pytest.param(1, REASON_READ_FAILED, REASON_UNINITIALIZED, id="uninitialized"),
        pytest.param(999, REASON_INIT_FAILED, REASON_INIT_FAILED, id="unknown-init"),
        pytest.param(15, REASON_READ_FAILED, REASON_READ_FAILED, id="other-read"),
        pytest.param(None, REASON_READ_FAILED, REASON_READ_FAILED, id="no-code"),
    ],
)
def test_reason_for_code(code: int | None, default: str, expected: str) -> None:
    assert reason_for_code(code, default) == expected


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param([], [], id="empty"),
        pytest.param(
            [
                ProcessEntry(None, 7, 10, C),
                ProcessEntry(None, 7, 30, G),
                ProcessEntry(None, 7, 20, M),
            ],
            [(None, 7, 30, {C, G, M})],
            id="union-kinds-max-memory",
        ),
        pytest.param(
            [ProcessEntry(None, 7, None, C), ProcessEntry(None, 7, 5, G)],
            [(None, 7, 5, {C, G})],
            id="known-memory-beats-unknown",
        ),
        pytest.param(
            [ProcessEntry(None, 7, 5, G), ProcessEntry(None, 7, None, C)],
            [(None, 7, 5, {C, G})],
            id="unknown-after-known",
        ),
        pytest.param(
            [ProcessEntry(None, 7, None, C), ProcessEntry(None, 7, None, M)],
            [(None, 7, None, {C, M})],
            id="all-unknown",
        ),
        pytest.param(
            [ProcessEntry(2, 9, 1, C), ProcessEntry(1, 9, 2, C), ProcessEntry(1, 3, 3, C)],
            [(1, 3, 3, {C}), (1, 9, 2, {C}), (2, 9, 1, {C})],
            id="same-pid-two-instances-sorted",
        ),
        pytest.param(
            [ProcessEntry(0, 5, 1, C), ProcessEntry(None, 8, 1, C)],
            [(None, 8, 1, {C}), (0, 5, 1, {C})],
            id="full-gpu-sorts-first",
        ),
    ],
)
def test_merge_processes(
    entries: list[ProcessEntry], expected: list[tuple[int | None, int, int | None, set[Any]]]
) -> None:
    merged = merge_processes("GPU-x", 3, entries)
    got = [(p.gi_id, p.pid, p.used_memory_bytes, set(p.kinds)) for p in merged]
    assert got == expected
    assert all(p.gpu_uuid == "GPU-x" and p.gpu_index == 3 for p in merged)
    assert all(p.sm_util_ratio is None for p in merged)


@pytest.mark.parametrize(
    ("utilization", "expected"),
    [
        pytest.param({None: {7: 0.5}}, {(None, 7): 0.5, (None, 8): 0.0}, id="full-gpu"),
        pytest.param({}, {(None, 7): None, (None, 8): None}, id="no-data"),
        pytest.param({1: {9: 0.25}}, {(None, 7): None, (None, 8): None, (1, 9): 0.25}, id="mig"),
        pytest.param({1: {}, None: {}}, {(None, 7): 0.0, (None, 8): 0.0, (1, 9): 0.0}, id="idle"),
    ],
)
def test_merge_processes_utilization(
    utilization: dict[int | None, dict[int, float]], expected: dict[Any, float | None]
) -> None:
    """A ratio where NVML has samples, 0.0 where it has data but no sample of the process,
    None for an instance NVML cannot tell about."""
    entries = [ProcessEntry(None, 7, 1, C), ProcessEntry(None, 8, 1, G)]
    if (1, 9) in expected:
        entries.append(ProcessEntry(1, 9, 1, C))
    merged = merge_processes("GPU-x", 0, entries, utilization)
    assert {(p.gi_id, p.pid): p.sm_util_ratio for p in merged} == expected


@pytest.mark.parametrize(
    ("timestamps", "since", "kept", "newest"),
    [
        pytest.param([], 0, [], 0, id="none"),
        pytest.param([], 50, [], 50, id="none-keeps-since"),
        pytest.param([10, 30, 20], 0, [10, 30, 20], 30, id="all-new"),
        pytest.param([10, 30, 20], 20, [30], 30, id="old-dropped"),
        pytest.param([10, 20], 20, [], 20, id="equal-is-old"),
    ],
)
def test_newer_samples(timestamps: list[int], since: int, kept: list[int], newest: int) -> None:
    samples = [UtilSample(pid=1, timestamp=ts, sm_util=5) for ts in timestamps]
    fresh, got_newest = newer_samples(samples, since)
    assert [s.timestamp for s in fresh] == kept
    assert got_newest == newest


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([], {}, id="empty"),
        pytest.param([(1, 50), (1, 70)], {1: 0.6}, id="mean"),
        pytest.param([(1, 100), (2, 0)], {1: 1.0, 2: 0.0}, id="bounds"),
        pytest.param([(1, 250)], {1: 1.0}, id="clamped"),
        pytest.param([(1, 10), (2, 40), (1, 30)], {1: 0.2, 2: 0.4}, id="per-pid"),
    ],
)
def test_utilization_from_samples(
    samples: list[tuple[int, int]], expected: dict[int, float]
) -> None:
    got = utilization_from_samples(UtilSample(pid, i, sm) for i, (pid, sm) in enumerate(samples))
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("layout", "rows", "expected"),
    [
        pytest.param(ROWS_V1, [(7, 5), (8, 0)], [(7, 5), (8, 0)], id="v1"),
        pytest.param(ROWS_V2, [(7, 5, 1, 0)], [(7, 5)], id="v2"),
        pytest.param(
            ROWS_V2, [(7, VALUE_NOT_AVAILABLE_ULL, 0, 0)], [(7, None)], id="memory-not-available"
        ),
        pytest.param(ROWS_V1, [], [], id="empty"),
    ],
)
def test_parse_process_rows(
    layout: Any, rows: list[tuple[int, ...]], expected: list[tuple[int, int | None]]
) -> None:
    data = b"".join(layout.pack(*row) for row in rows)
    assert parse_process_rows(layout.iter_unpack(data)) == expected


def test_parse_sample_rows() -> None:
    data = ROWS_SAMPLE.pack(7, 1_000, 42, 1, 2, 3) + ROWS_SAMPLE.pack(8, 2_000, 0, 0, 0, 0)
    assert parse_sample_rows(ROWS_SAMPLE.iter_unpack(data)) == [
        UtilSample(7, 1_000, 42),
        UtilSample(8, 2_000, 0),
    ]
