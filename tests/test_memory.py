"""Tests for enricher.memory: each device's framebuffer split into its processes' memory and
what no listed process holds, so that it adds up.

Table-driven for the rules; the invariant (containers' memory plus every unattributed reason
is FB_USED + FB_RESERVED on every GPU and MIG instance, never negative, never less than the
device) as a Hypothesis property over random nodes, read back from the written families by
prometheus_client's parser, as tests/test_power.py holds the power split.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from enricher.attribution import REASON_HOST, REASON_MPS_SERVER, Attribution
from enricher.families import MEM, UNATTR, RenderOptions, render_families
from enricher.memory import (
    MIB,
    REASON_DRIVER_RESERVED,
    REASON_NOT_IN_PROCESS_LIST,
    DeviceMemory,
    device_memory,
    memory_parts,
)
from enricher.model import GpuProcess, PodInfo
from enricher.readings import read_body

from .conftest import examples

U0 = "GPU-00000000-0000-4000-8000-000000000000"
U1 = "GPU-11111111-1111-4111-8111-111111111111"
GIB = 1 << 30
A = PodInfo(uid="uid-a", namespace="team", name="a")
B = PodInfo(uid="uid-b", namespace="team", name="b")


def att(
    pid: int, owner: PodInfo | None, mem: int | None, *, uuid: str = U0, gi: int | None = None
) -> Attribution:
    proc = GpuProcess(uuid, 0, gi, pid, mem, None)
    if owner is None:
        return Attribution(proc, None, None, "", REASON_HOST)
    return Attribution(proc, None, owner, "main", "")


@pytest.mark.parametrize(
    ("memory", "attributions", "expected"),
    [
        pytest.param(
            {(U0, ""): DeviceMemory(10 * GIB, 60 * GIB, GIB // 2)},
            [att(1, A, 6 * GIB), att(2, None, GIB)],
            {
                ((U0, ""), REASON_DRIVER_RESERVED): GIB // 2,
                ((U0, ""), REASON_NOT_IN_PROCESS_LIST): 3 * GIB,
            },
            id="reserved-and-the-rest",
        ),
        pytest.param(
            {(U0, ""): DeviceMemory(4 * GIB)},
            [att(1, A, 3 * GIB), att(2, B, None)],
            {((U0, ""), REASON_NOT_IN_PROCESS_LIST): GIB},
            id="no-reserved-field-no-reserved-series",
        ),
        pytest.param(
            {(U0, ""): DeviceMemory(2 * GIB, None, 0.0)},
            [att(1, A, 3 * GIB)],
            {
                ((U0, ""), REASON_DRIVER_RESERVED): 0.0,
                ((U0, ""), REASON_NOT_IN_PROCESS_LIST): 0.0,
            },
            id="processes-list-more-clamped-to-zero",
        ),
        pytest.param(
            {
                (U1, ""): DeviceMemory(9 * GIB, None, GIB),
                (U1, "1"): DeviceMemory(5 * GIB, None, 0.0),
                (U1, "2"): DeviceMemory(2 * GIB),
            },
            [att(1, A, 4 * GIB, uuid=U1, gi=1)],
            {
                ((U1, "1"), REASON_DRIVER_RESERVED): 0.0,
                ((U1, "1"), REASON_NOT_IN_PROCESS_LIST): GIB,
                ((U1, "2"), REASON_NOT_IN_PROCESS_LIST): 2 * GIB,
            },
            id="mig-instances-not-the-gpu-too",
        ),
        pytest.param(
            {(U1, ""): DeviceMemory(9 * GIB)},
            [att(1, A, 4 * GIB, uuid=U1, gi=1), att(2, B, 2 * GIB, uuid=U1, gi=2)],
            {((U1, ""), REASON_NOT_IN_PROCESS_LIST): 3 * GIB},
            id="mig-gpu-read-whole-holds-its-instances-processes",
        ),
        pytest.param({}, [att(1, A, GIB)], {}, id="no-fb-used-no-remainder"),
    ],
)
def test_memory_parts(
    memory: dict[Any, DeviceMemory], attributions: list[Attribution], expected: dict[Any, float]
) -> None:
    assert memory_parts(memory, attributions) == expected


def test_reserved_is_outside_fb_used() -> None:
    """DCGM 3.x: FB_TOTAL is FB_USED + FB_FREE + FB_RESERVED; the device holds FB_USED and
    FB_RESERVED."""
    text = (
        f'DCGM_FI_DEV_FB_USED{{UUID="{U0}"}} 1000\n'
        f'DCGM_FI_DEV_FB_FREE{{UUID="{U0}"}} 80408\n'
        f'DCGM_FI_DEV_FB_RESERVED{{UUID="{U0}"}} 512\n'
    )
    (mem,) = device_memory(read_body(text)).values()
    assert (mem.in_use, mem.total) == (1512 * MIB, 81920 * MIB)


def fb_lines(labels: list[str]) -> str:
    """The three framebuffer gauges of one device (8 GiB used, 512 MiB reserved, 80 GiB in
    all), written once per label set, with the same values each time."""
    return "".join(
        f"DCGM_FI_DEV_{field}{{{lab}}} {mib}\n"
        for lab in labels
        for field, mib in (("FB_USED", 8192), ("FB_FREE", 73216), ("FB_RESERVED", 512))
    )


POD_A = 'pod="a",namespace="team",container="main"'
POD_B = 'pod="b",namespace="team",container="main"'


# dcgm-exporter writes a device's series more than once with identical whole-device values:
# once per sharing pod with --kubernetes-virtual-gpus (vgpu="<replica>"), per pod on a shared
# GPU, per pod on a MIG instance. Each copy is the whole device, never a part to add up.
@pytest.mark.parametrize(
    ("labels", "key", "atts"),
    [
        pytest.param(
            [f'UUID="{U0}",gpu="0"', f'UUID="{U0}",gpu="0",{POD_A},vgpu="0"'],
            (U0, ""),
            [att(1, A, 3 * GIB), att(2, B, 2 * GIB)],
            id="device-series-and-a-vgpu-copy",
        ),
        pytest.param(
            [
                f'UUID="{U0}",gpu="0",{POD_A},vgpu="0"',
                f'UUID="{U0}",gpu="0",{POD_B},vgpu="1"',
                f'UUID="{U0}",gpu="0",pod="c",namespace="infer",container="main",vgpu="2"',
            ],
            (U0, ""),
            [att(1, A, 3 * GIB), att(2, B, 2 * GIB), att(3, None, GIB)],
            id="three-vgpu-copies-only",
        ),
        pytest.param(
            [f'UUID="{U1}",GPU_I_ID="1",{POD_A}', f'UUID="{U1}",GPU_I_ID="1",{POD_B}'],
            (U1, "1"),
            [att(1, A, 3 * GIB, uuid=U1, gi=1), att(2, B, 2 * GIB, uuid=U1, gi=1)],
            id="mig-instance-per-pod-copies",
        ),
    ],
)
def test_repeated_device_series_count_once(
    labels: list[str], key: tuple[str, str], atts: list[Attribution]
) -> None:
    """The device's memory is one copy's, and its parts add up to that, not to the copies'
    sum: containers' memory plus every unattributed reason is FB_USED + FB_RESERVED."""
    memory = device_memory(read_body(fb_lines(labels)))
    assert memory == {key: DeviceMemory(8192 * MIB, 73216 * MIB, 512 * MIB)}
    assert memory[key].total == 80 * GIB
    text = render_families(atts, {}, RenderOptions(), memory=memory_parts(memory, atts))
    written, _ = by_device(text, (MEM, UNATTR))
    assert written == {key: (8192 + 512) * MIB}


# dcgm-exporter 4.8.2 on with --kubernetes-virtual-gpus (internal/pkg/transformation/
# kubernetes.go, Process, and process_metrics.go, isPerProcessMetric): FB_USED (and GPU_UTIL)
# keep the device series, with no pod label, and add one copy per sharing pod holding *that
# pod's* share (with pod_uid); FB_FREE and FB_RESERVED are copied once per pod with the device's
# value and lose their device series. The figures are a shared 80 GiB GPU whose device series
# says 31,288 MiB and whose two pods' copies say 22,528 and 7,680 MiB.
SHARE_A = f'pod="a",namespace="team",container="main",pod_uid="{A.uid}"'
SHARE_B = f'pod="b",namespace="team",container="main",pod_uid="{B.uid}"'


@pytest.mark.parametrize("device_first", [True, False], ids=["device-series-first", "copies-first"])
@pytest.mark.parametrize("gi", ["", "3"], ids=["whole-gpu", "mig-instance"])
@pytest.mark.parametrize("replica", [False, True], ids=["no-vgpu", "vgpu-replicas"])
def test_per_pod_shares_never_stand_for_the_device(
    device_first: bool, gi: str, replica: bool
) -> None:
    """The device's memory is its own series' (31,288 MiB), never a pod's share, wherever the
    copies come; the copied FB_FREE and FB_RESERVED count once; so the parts add up to the
    device's FB_USED + FB_RESERVED, and the memory no listed process holds is what the
    device holds beyond its processes (1,080 MiB), not a pod's share less them."""
    dev = f'UUID="{U0}",gpu="0"' + (f',GPU_I_ID="{gi}"' if gi else "")
    # A replica's copies also carry vgpu (getSharedGPU: <id>::<n>, GKE's <id>/vgpu<n>).
    share_a, share_b = (
        (f'{SHARE_A},vgpu="0"', f'{SHARE_B},vgpu="1"') if replica else (SHARE_A, SHARE_B)
    )
    used = [f"DCGM_FI_DEV_FB_USED{{{dev}}} 31288\n"]
    copies = [
        f"DCGM_FI_DEV_FB_USED{{{dev},{share_a}}} 22528\n",
        f"DCGM_FI_DEV_FB_USED{{{dev},{share_b}}} 7680\n",
    ]
    text = "".join(used + copies if device_first else copies + used)
    text += "".join(
        f"DCGM_FI_DEV_{field}{{{dev},{share}}} {mib}\n"
        for field, mib in (("FB_FREE", 49120), ("FB_RESERVED", 512))
        for share in (share_a, share_b)
    )
    memory = device_memory(read_body(text))
    key = (U0, gi)
    assert memory == {key: DeviceMemory(31288 * MIB, 49120 * MIB, 512 * MIB)}
    mig = {"uuid": U0, "gi": int(gi)} if gi else {}
    atts = [att(1, A, 22528 * MIB, **mig), att(2, B, 7680 * MIB, **mig)]
    parts = memory_parts(memory, atts)
    assert parts[(key, "not_in_process_list")] == (31288 - 22528 - 7680) * MIB
    text = render_families(atts, {}, RenderOptions(), memory=parts)
    written, _ = by_device(text, (MEM, UNATTR))
    assert written == {key: (31288 + 512) * MIB}


# --------------------------------------------------------------------------- the invariant

PODS = (A, B, PodInfo(uid="uid-c", namespace="infer", name="c"))
REASONS = (REASON_HOST, "pod_not_found", "process_exited", REASON_MPS_SERVER)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[str, list[Attribution]]:
    """A random node: GPUs (some in MIG mode with random instances, whose upstream may also
    write the GPU's own reading), processes owned by random containers or unattributed (some
    with no memory figure), and the upstream's framebuffer lines in whole MiB as DCGM writes
    them: FB_USED at least the processes' memory, or anything (readings of two moments),
    FB_RESERVED on some devices, some devices without FB_USED at all."""
    keys: list[tuple[str, int | None]] = []
    for i in range(draw(st.integers(1, 4))):
        uuid = f"GPU-{i:08d}-0000-4000-8000-000000000000"
        if draw(st.booleans()):
            keys += [(uuid, gi) for gi in draw(st.sets(st.integers(0, 14), min_size=1, max_size=4))]
            if draw(st.booleans()):
                keys.append((uuid, None))  # the GPU's own reading beside its instances'
        else:
            keys.append((uuid, None))
    mig_gpus = {uuid for uuid, gi in keys if gi is not None}
    atts: list[Attribution] = []
    held: dict[tuple[str, int | None], int] = defaultdict(int)
    on = [k for k in keys if k[1] is not None or k[0] not in mig_gpus]
    for pid in range(draw(st.integers(0, 10))):
        uuid, gi = draw(st.sampled_from(on))
        mem = draw(st.none() | st.integers(0, 80 * GIB))
        held[(uuid, gi)] += mem or 0
        proc = GpuProcess(uuid, 0, gi, pid + 1, mem, None)
        owner = draw(st.none() | st.sampled_from(PODS))
        if owner is None:
            atts.append(Attribution(proc, None, None, "", draw(st.sampled_from(REASONS))))
        else:
            container = draw(st.sampled_from(("main", "side")))
            atts.append(Attribution(proc, None, owner, container, ""))
    lines = []
    for uuid, gi in keys:
        labels = f'UUID="{uuid}"' + ("" if gi is None else f',GPU_I_ID="{gi}"')
        if draw(st.integers(0, 5)) == 0:
            continue  # no FB_USED: no remainder
        if draw(st.booleans()):
            used = math.ceil(held[(uuid, gi)] / MIB) + draw(st.integers(0, 4096))
        else:
            used = draw(st.integers(0, 81920))
        lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}")
        if draw(st.booleans()):
            lines.append(f"DCGM_FI_DEV_FB_RESERVED{{{labels}}} {draw(st.integers(0, 1024))}")
    return "\n".join(lines) + "\n", atts


def by_device(text: str, names: tuple[str, ...]) -> tuple[dict[Any, float], list[float]]:
    total: dict[Any, float] = defaultdict(float)
    values: list[float] = []
    for fam in text_string_to_metric_families(text):
        if fam.name not in names:
            continue
        for s in fam.samples:
            total[(s.labels["UUID"], s.labels.get("GPU_I_ID", ""))] += s.value
            values.append(s.value)
    return dict(total), values


# 500 examples: the CI profile's 2,000 took 17 s a suite of a CI budget that is nearly spent.
@settings(deadline=None, max_examples=examples(500))
@given(nodes())
def test_invariant_parts_add_up_to_the_device_memory(node: Any) -> None:
    """On every device with FB_USED: the written containers' memory plus every unattributed
    reason is FB_USED + FB_RESERVED whenever the processes list no more than FB_USED, and
    otherwise exceeds it by exactly their excess (not_in_process_list 0); no value is negative
    or non-finite. A MIG GPU's own reading is left out where its instances have theirs, and
    holds all its instances' processes where they have none."""
    upstream, atts = node
    memory = device_memory(read_body(upstream))
    text = render_families(atts, {}, RenderOptions(), memory=memory_parts(memory, atts))
    written, values = by_device(text, (MEM, UNATTR))
    assert all(v >= 0.0 and math.isfinite(v) for v in values)
    listed: dict[Any, float] = defaultdict(float)
    for a in atts:
        listed[a.device_key] += a.process.used_memory_bytes or 0
    split = {uuid for uuid, gi in memory if gi}
    for key, mem in memory.items():
        if key[0] not in split:  # the GPU's reading holds every process on it
            on = [k for k in set(written) | set(listed) if k[0] == key[0]]
            got = sum(written.get(k, 0.0) for k in on)
            excess = max(0.0, sum(listed[k] for k in on) - mem.used)
        elif key[1]:
            got, excess = written.get(key, 0.0), max(0.0, listed[key] - mem.used)
        else:
            continue  # a MIG GPU's own reading beside its instances'
        assert got == mem.in_use + excess, key
