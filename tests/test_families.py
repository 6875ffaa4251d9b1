"""What the enricher writes of an attribution (enricher.families): sums per container and per
reason, the optional per-process family, and pod info; read back with prometheus_client's
parser and checked with promtool."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enricher.attribution import REASON_HOST, REASON_MPS_SERVER, Attribution
from enricher.families import (
    MEM,
    POD_INFO,
    PROC_MEM,
    UNATTR,
    UTIL,
    RenderOptions,
    render_families,
)
from enricher.model import GpuProcess, PodInfo, SourceStatus
from enricher.selfmetrics import self_metrics

from .conftest import assert_valid_exposition

G0 = "GPU-00000000-0000-4000-8000-000000000000"
GIB = 1 << 30
POD = PodInfo(uid="u-1", namespace="ml", name="train-0", workload_kind="Job", workload_name="t")


def att(pid: int, memory: int | None, util: float | None, reason: str = "") -> Attribution:
    proc = GpuProcess(G0, 0, None, pid, memory, util)
    if reason:
        return Attribution(proc, None, None, "", reason)
    return Attribution(proc, None, POD, "trainer", "")


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_a_containers_processes_add_up_and_the_rest_is_unattributed_by_reason(
    promtools: list[str],
) -> None:
    rows = [
        att(1, 2 * GIB, 0.25),
        att(2, 1 * GIB, 0.5),
        att(3, None, None),  # NVML cannot tell: no memory of its own, still the pod's
        att(4, 3 * GIB, None, REASON_HOST),
        att(5, GIB // 2, 0.0, REASON_MPS_SERVER),
    ]
    text = render_families(rows, {}, RenderOptions())
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    got = samples(text)
    ((labels, memory),) = got[MEM]
    assert (labels["UUID"], labels["namespace"], labels["pod"], labels["container"]) == (
        G0,
        "ml",
        "train-0",
        "trainer",
    )
    assert memory == 3 * GIB
    assert [v for _, v in got[UTIL]] == [0.75]
    assert {lbl["reason"]: v for lbl, v in got[UNATTR]} == {
        REASON_HOST: 3 * GIB,
        REASON_MPS_SERVER: GIB // 2,
    }
    ((info, one),) = got[POD_INFO]
    assert (info["pod"], info["workload_kind"], one) == ("train-0", "Job", 1)
    assert PROC_MEM not in got


def test_utilization_is_capped_at_one() -> None:
    text = render_families([att(1, GIB, 0.7), att(2, GIB, 0.6)], {}, RenderOptions())
    assert [v for _, v in samples(text)[UTIL]] == [1.0]


@pytest.mark.parametrize("process_series", [True, False])
def test_the_per_process_family_only_when_asked(process_series: bool) -> None:
    text = render_families(
        [att(7, GIB, 0.1), att(8, None, None)], {}, RenderOptions(process_series=process_series)
    )
    got = samples(text)
    if not process_series:
        assert PROC_MEM not in got
        return
    # A process whose memory NVML cannot tell has no per-process series.
    assert [(lbl["pid"], v) for lbl, v in got[PROC_MEM]] == [("7", GIB)]


def test_self_metrics_report_every_enabled_source_and_count_processes() -> None:
    statuses = [
        SourceStatus("nvml", enabled=True, up=True, duration_seconds=0.01, errors_total=0),
        SourceStatus("docker", enabled=False, up=False, duration_seconds=0.0, errors_total=0),
    ]
    rows = [att(1, GIB, 0.1), att(2, GIB, None, REASON_HOST)]
    got = samples(self_metrics(statuses, rows, version="test").render())
    assert {lbl["source"]: v for lbl, v in got["dcgm_enricher_source_enabled"]} == {
        "nvml": 1,
        "docker": 0,
    }
    assert [lbl["source"] for lbl, _ in got["dcgm_enricher_source_up"]] == ["nvml"]
    assert {lbl["state"]: v for lbl, v in got["dcgm_enricher_gpu_processes"]} == {
        "attributed": 1,
        "unattributed": 1,
    }
