"""Faults injected into every source of the real app, one at a time.

Each test scrapes a healthy node, injects one fault, scrapes while it lasts and checks what
the enricher says about it (``dcgm_enricher_source_up``/``errors_total``, unattributed
reasons), clears the fault and checks that the first scrape after it has recovered.

Every scrape goes through :meth:`Env.scrape`, which also checks the invariants that hold in
every case: /metrics answers 200, each release's promtool accepts the output, and no series
names a pod that does not run a process on that device (:func:`check_no_wrong_pod`).

Real parts, on the full stack of tests/harness.py: the aiohttp app and an aiohttp upstream
over loopback, pynvml against the fake libnvidia-ml built from C (no GPU here), the real
ProcfsSource on a /proc tree on disk, and the real kubernetes client watching the API-server
stand-in (no cluster here). :class:`FaultyNode` describes the node once and writes all three
fakes from that description, so the test's idea of who runs where (the ground truth) is the
fakes' too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.kubeapi import KubeApiStandIn
from devkit.nvmlfake import (
    ERROR_DRIVER_NOT_LOADED,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    FakeNvml,
    FakeNvmlState,
    default_mig_uuid,
    nvml_state_of,
)
from devkit.upstream import Upstream
from enricher.kube import KubernetesSource
from enricher.memory import REASON_DRIVER_RESERVED, REASON_NOT_IN_PROCESS_LIST
from enricher.model import GpuDevice, MigDevice
from enricher.nvml import NvmlSource
from enricher.pipeline import Scraper
from enricher.simnode import fakeproc
from enricher.simnode.api import make_pod, pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode as DemoNode
from enricher.simnode.node import SimPod, SimProc

from .conftest import assert_valid_exposition
from .exposition import FamilyWriter
from .harness import MakeStack, Stack, assert_memory_adds_up, who

NODE = "gpu-node-faults"
GIB = 1 << 30
CLK_TCK = 100
BTIME = int(time.time()) - 10_000  # the simulated node booted 10 000 s ago
OLD_TICKS = 100 * CLK_TCK  # processes that started 100 s after boot
UUIDS = (
    "GPU-00000000-fa01-4000-8000-000000000000",
    "GPU-11111111-fa01-4000-8000-000000000001",
    "GPU-22222222-fa01-4000-8000-000000000002",
)
MODEL = "NVIDIA H100 80GB HBM3"
MAX_BYTES = 256 * 1024
UPSTREAM_TIMEOUT = 1.0

Key = tuple[str, str]  # (GPU UUID, GPU_I_ID or "")
Who = tuple[str, str, str]  # (namespace, pod, container)


def gpu_pod(namespace: str, name: str, uid: str, container: str, container_id: str) -> SimPod:
    """A pod of this node: one container, one GPU requested."""
    return SimPod(namespace, name, uid, container, container_id, None, "nvidia.com/gpu")


def _cid(n: int) -> str:
    return f"{n:064x}"


TRAIN = gpu_pod("ml", "train-0", "aaaaaaaa-0000-4000-8000-000000000001", "trainer", _cid(0x1))
INFER = gpu_pod("serving", "infer-0", "bbbbbbbb-0000-4000-8000-000000000002", "server", _cid(0x2))
NOTEBOOK = gpu_pod(
    "jupyterhub", "jupyter-bob", "cccccccc-0000-4000-8000-000000000003", "notebook", _cid(0x3)
)
RESERVED = gpu_pod("ml", "reserved-0", "dddddddd-0000-4000-8000-000000000004", "idle", _cid(0x4))


HOST_UNIT = "/system.slice/gpu-burn.service"


def proc(
    pid: int, gpu: int, owner: SimPod | None, memory: int = GIB, gi: int | None = None, **kw: Any
) -> SimProc:
    """A GPU process of this node (``owner`` None: a host process), started 100 s after boot
    unless ``start_ticks`` says otherwise."""
    return SimProc(pid, "python", gpu, gi, memory >> 20, 0.3, owner, host_cgroup=HOST_UNIT, **kw)


@dataclass
class FaultyNode:
    """The node as it is now: processes (:class:`enricher.simnode.node.SimProc`), MIG layout, what
    dcgm-exporter allocates and the faults injected; :meth:`sim` is it as a demo SimNode."""

    procs: list[SimProc] = field(
        default_factory=lambda: [
            proc(101, 0, TRAIN, memory=8 * GIB),
            proc(201, 1, INFER, memory=4 * GIB),
            proc(301, 1, NOTEBOOK, memory=2 * GIB),
        ]
    )
    # gpu -> GPU instance ids (with profile) when MIG is on
    mig: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    # what dcgm-exporter's PodResources mapping says for each whole GPU
    alloc: dict[int, SimPod] = field(default_factory=lambda: {0: TRAIN, 1: INFER, 2: RESERVED})
    util_fails: bool = False
    extra_fails: list[tuple[str, int, int | None]] = field(default_factory=list)
    init_fails: bool = False
    # pid -> how /proc/<pid> is damaged: no-cgroup | fifo | symlink | dir | bad-stat
    damage: dict[int, str] = field(default_factory=dict)

    def add(self, p: SimProc, damage: str = "") -> None:
        self.procs.append(p)
        if damage:
            self.damage[p.pid] = damage

    def update(self, pid: int, **changes: Any) -> None:
        self.procs = [replace(p, **changes) if p.pid == pid else p for p in self.procs]

    def remove(self, pid: int) -> None:
        self.procs = [p for p in self.procs if p.pid != pid]
        self.damage.pop(pid, None)

    def sim(self) -> DemoNode:
        # Not the demo's node: H100s, all processes started at once, and it changes between
        # scrapes (MIG on and off, processes coming and going).
        return DemoNode(
            NODE,
            tuple(GpuDevice(i, u, MODEL, mig_enabled=i in self.mig) for i, u in enumerate(UUIDS)),
            tuple(
                MigDevice(UUIDS[gpu], gpu, gi, 0, default_mig_uuid(gpu, gi, 0), profile)
                for gpu, instances in self.mig.items()
                for gi, profile in instances
            ),
            tuple(self.procs),
            (TRAIN, INFER, NOTEBOOK, RESERVED),
            first_ticks=OLD_TICKS,
            ticks_apart=0,
        )

    # -------------------------------------------------------------- the fakes

    def nvml_state(self) -> FakeNvmlState:
        s = nvml_state_of(self.sim())
        if self.util_fails:
            s.fail("nvmlDeviceGetProcessUtilization", ERROR_FUNCTION_NOT_FOUND)
        for symbol, code, which in self.extra_fails:
            s.fail(symbol, code, gpu=which)
        if self.init_fails:
            s.fail_init(ERROR_DRIVER_NOT_LOADED)
        return s

    def write_proc(self, root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)
        write_proc_tree(root, self.sim(), BTIME + 86_400)
        for pid, damage in self.damage.items():
            d = root / str(pid)
            cgroup = d / "cgroup"
            if damage == "no-cgroup":
                cgroup.unlink()
            elif damage == "fifo":
                cgroup.unlink()
                os.mkfifo(cgroup)
            elif damage == "symlink":
                # Pointing at a perfectly good file: the reader must not follow it.
                target = d / "cgroup.real"
                cgroup.rename(target)
                cgroup.symlink_to(target)
            elif damage == "dir":
                cgroup.unlink()
                cgroup.mkdir()
            elif damage == "bad-stat":
                (d / "stat").write_text(f"{pid} (python) S 1 2 3\n")

    def upstream_text(self) -> str:
        """dcgm-exporter's view: its label names and order, pod labels from PodResources."""
        w = FamilyWriter()
        w.family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
        w.family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
        for gpu, uuid in enumerate(UUIDS):
            base = [
                ("gpu", str(gpu)),
                ("UUID", uuid),
                ("device", f"nvidia{gpu}"),
                ("modelName", MODEL),
                ("Hostname", "dcgm-exporter-x7k2p"),
            ]
            pod = self.alloc.get(gpu)
            pod_labels = (
                [("container", pod.container), ("namespace", pod.namespace), ("pod", pod.name)]
                if pod
                else []
            )
            w.sample("DCGM_FI_DEV_GPU_UTIL", base + pod_labels, 10 * gpu)
            if gpu in self.mig:
                for gi, profile in self.mig[gpu]:
                    labels = [*base, ("GPU_I_PROFILE", profile), ("GPU_I_ID", str(gi))]
                    w.sample("DCGM_FI_DEV_FB_USED", labels, 1000 + gi)
            else:
                w.sample("DCGM_FI_DEV_FB_USED", base + pod_labels, 1000 * gpu)
        return w.render()

    # -------------------------------------------------------------- the truth

    def users(self) -> dict[Key, set[Who]]:
        """Who really runs a process NVML lists, per device; MIG counts for the whole GPU."""
        out: dict[Key, set[Who]] = {}
        for p in self.procs:
            uuid = UUIDS[p.gpu]
            keys = [(uuid, "")] + ([(uuid, str(p.gi))] if p.gi is not None else [])
            for key in keys:
                out.setdefault(key, set()).add(who(p.pod) if p.pod else ("", "", ""))
        return out

    def upstream_owner(self, key: Key) -> Who:
        gpu = UUIDS.index(key[0])
        pod = self.alloc.get(gpu)
        if pod is None or key[1]:
            return ("", "", "")
        return who(pod)


# --------------------------------------------------------------------------- reading output


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def value(text: str, name: str, **labels: str) -> float | None:
    for n, lab, v in samples(text):
        if n == name and all(lab.get(k) == x for k, x in labels.items()):
            return v
    return None


def by_source(text: str, name: str) -> dict[str, float]:
    return {lab["source"]: v for n, lab, v in samples(text) if n == name}


def named(text: str, name: str) -> dict[Key, set[Who]]:
    """Who the series of one family name, per device."""
    out: dict[Key, set[Who]] = {}
    for n, lab, _ in samples(text):
        if n == name and "UUID" in lab:
            key = (lab["UUID"], lab.get("GPU_I_ID", ""))
            who = (lab.get("namespace", ""), lab.get("pod", ""), lab.get("container", ""))
            out.setdefault(key, set()).add(who)
    return out


def reasons(text: str) -> dict[tuple[Key, str], float]:
    """The memory of unattributed processes by device and reason; the device-level parts
    (the driver's reservation, what no listed process holds) are held apart, by
    ``assert_memory_adds_up`` on the same text."""
    assert_memory_adds_up(text)
    return {
        ((lab["UUID"], lab.get("GPU_I_ID", "")), lab["reason"]): v
        for n, lab, v in samples(text)
        if n == "gpu_unattributed_memory_used_bytes"
        and lab["reason"] not in (REASON_DRIVER_RESERVED, REASON_NOT_IN_PROCESS_LIST)
    }


def pod_infos(text: str) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> pod_uid of every gpu_pod_info series."""
    return {
        (lab["namespace"], lab["pod"]): lab["pod_uid"]
        for n, lab, _ in samples(text)
        if n == "gpu_pod_info"
    }


def check_no_wrong_pod(text: str, node: FaultyNode, blind: Iterable[Key] = ()) -> None:
    """No series names a pod that does not run a process on its device.

    Device series of a device with no (visible) process keep dcgm-exporter's allocation
    labels (docs/labels.md); ``blind`` lists busy devices NVML could not read on this
    scrape, which are in that case too.
    """
    truth = node.users()
    blind = set(blind)
    everyone = {(ns, pod) for whos in truth.values() for ns, pod, _ in whos if pod}
    for name, lab, _ in samples(text):
        pod = lab.get("pod", "")
        if not pod:
            continue
        ns, container = lab.get("namespace", ""), lab.get("container", "")
        where = f"{name}{lab}"
        if name == "gpu_pod_info":
            assert (ns, pod) in everyone, where
            continue
        if "UUID" not in lab:
            continue
        key = (lab["UUID"], lab.get("GPU_I_ID", ""))
        users = truth.get(key, set())
        pods = {(n, p) for n, p, _ in users}
        if name.startswith(("gpu_container_", "gpu_process_")):
            assert (ns, pod) in pods, where
            assert container == "" or (ns, pod, container) in users, where
        elif key in blind or not users:
            assert (ns, pod, container) == node.upstream_owner(key), where
        else:
            # A device value cannot be split: only a sole pod may be named on it.
            assert pods == {(ns, pod)}, where
            containers = {c for _, _, c in users}
            assert container == "" or containers == {container}, where


# --------------------------------------------------------------------------- the environment


@dataclass
class Env:
    """The node running on the full stack (tests/harness.py), and its description."""

    node: FaultyNode
    nvml: FakeNvml
    stack: Stack
    promtools: list[str]

    @property
    def api(self) -> KubeApiStandIn:
        assert self.stack.api is not None
        return self.stack.api

    @property
    def cache(self) -> KubernetesSource:
        assert self.stack.cache is not None
        return self.stack.cache

    @property
    def upstream(self) -> Upstream:
        assert self.stack.upstream is not None
        return self.stack.upstream

    @property
    def scraper(self) -> Scraper:
        return self.stack.scraper

    def apply(self) -> None:
        """Write the node's current state to the fake NVML and the /proc tree."""
        self.nvml.write(self.node.nvml_state())
        self.node.write_proc(self.stack.proc_root)

    async def scrape(self, blind: Iterable[Key] = ()) -> str:
        text = await self.stack.scrape()
        assert "dcgm_enricher_build_info" in text
        for promtool in self.promtools:
            assert_valid_exposition(promtool, text)
        check_no_wrong_pod(text, self.node, blind)
        return text

    async def wait_index(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait (bounded) until the pod watch has caught up with the API stand-in."""
        for _ in range(500):
            if predicate():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"pod cache never saw: {what}")

    def has_pod(self, uid: str) -> bool:
        return uid in self.cache.index().by_uid

    def has_container(self, container_id: str) -> bool:
        return container_id in self.cache.index().by_container


MakeEnv = Callable[..., Awaitable[Env]]


@pytest.fixture
def make_env(full_stack: MakeStack, fake_nvml: FakeNvml, promtools: list[str]) -> MakeEnv:
    async def make(
        *,
        node: FaultyNode | None = None,
        gpu: NvmlSource | None = None,
        kube_down_at_start: bool = False,
    ) -> Env:
        node = node or FaultyNode()
        stack = await full_stack(
            upstream=node.upstream_text,
            nvml=node.nvml_state(),
            proc=node.write_proc,
            node=NODE,
            pods=[pod_object(p, NODE) for p in (TRAIN, INFER, NOTEBOOK, RESERVED)]
            + [make_pod("elsewhere", "default", node="another-node")],
            kube={"request_timeout_seconds": 1.0},
            kube_down_at_start=kube_down_at_start,
            gpu=gpu or fake_nvml.source(retry_interval=0.0),
            clk_tck=CLK_TCK,
            upstream_timeout=UPSTREAM_TIMEOUT,
            upstream_max_bytes=MAX_BYTES,
        )
        return Env(node, fake_nvml, stack, promtools)

    return make


def _healthy(text: str) -> None:
    assert by_source(text, "dcgm_enricher_source_up") == {
        "upstream": 1,
        "nvml": 1,
        "procfs": 1,
        "kubernetes": 1,
    }


# --------------------------------------------------------------------------- upstream faults


@pytest.mark.parametrize(
    "fault",
    ["refused", "stalled", "http-500", "cut", "garbage", "too-large", "gzip-bomb", "html"],
)
async def test_upstream_fault(make_env: MakeEnv, fault: str) -> None:
    env = await make_env()
    before = await env.scrape()
    _healthy(before)
    errors = by_source(before, "dcgm_enricher_source_errors_total")["upstream"]
    enriched = named(before, "DCGM_FI_DEV_GPU_UTIL")
    assert enriched[(UUIDS[0], "")] == {who(TRAIN)}
    assert enriched[(UUIDS[1], "")] == {("", "", "")}  # two pods share GPU 1

    await env.upstream.set(fault)
    text = await env.scrape()
    up = by_source(text, "dcgm_enricher_source_up")
    assert (up["nvml"], up["procfs"], up["kubernetes"]) == (1, 1, 1)
    # Our own families do not depend on the upstream; they keep its device labels.
    mem = named(text, "gpu_container_memory_used_bytes")
    assert mem[(UUIDS[0], "")] == {who(TRAIN)}
    assert mem[(UUIDS[1], "")] == {who(INFER), who(NOTEBOOK)}
    assert value(text, "gpu_container_memory_used_bytes", pod="train-0", modelName=MODEL)
    if fault == "garbage":
        # The junk is dropped line by line; the valid lines still pass.
        assert up["upstream"] == 1
        assert (value(text, "dcgm_enricher_upstream_invalid_lines") or 0) >= 3
        assert named(text, "DCGM_FI_DEV_GPU_UTIL") == enriched
    else:
        assert up["upstream"] == 0
        assert by_source(text, "dcgm_enricher_source_errors_total")["upstream"] == errors + 1
        assert "DCGM_FI_DEV" not in text  # nothing of a failed body is passed on
        assert value(text, "dcgm_enricher_upstream_samples") == 0

    await env.upstream.clear()
    after = await env.scrape()
    _healthy(after)
    assert named(after, "DCGM_FI_DEV_GPU_UTIL") == enriched
    assert value(after, "dcgm_enricher_upstream_invalid_lines") == 0
    assert by_source(after, "dcgm_enricher_source_errors_total")["upstream"] == (
        errors if fault == "garbage" else errors + 1
    )


# --------------------------------------------------------------------------- NVML faults


async def test_nvml_library_missing_then_installed(
    make_env: MakeEnv, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """The driver container has not put libnvidia-ml in place yet; later it has."""
    lib = tmp_path / "driver" / "libnvidia-ml.so.1"
    source = NvmlSource(library_path=str(lib), retry_interval=0.0)
    env = await make_env(gpu=source)
    everything = list(env.node.users())
    text = await env.scrape(blind=everything)
    up = by_source(text, "dcgm_enricher_source_up")
    assert (up["nvml"], up["upstream"], up["kubernetes"]) == (0, 1, 1)
    assert by_source(text, "dcgm_enricher_source_errors_total")["nvml"] >= 1
    assert value(text, "dcgm_enricher_gpu_processes", state="attributed") == 0
    assert "gpu_container_memory_used_bytes{" not in text
    # Without NVML's answer nothing is known of anyone's use: no idle-since at all.
    assert "gpu_container_last_active_timestamp_seconds{" not in text
    # Without NVML the device series keep dcgm-exporter's own labels.
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[1], "")] == {who(INFER)}

    lib.parent.mkdir()
    lib.symlink_to(fake_nvml.library)
    after = await env.scrape()
    _healthy(after)
    assert named(after, "gpu_container_memory_used_bytes")[(UUIDS[0], "")] == {who(TRAIN)}
    assert named(after, "gpu_container_last_active_timestamp_seconds")[(UUIDS[0], "")] == {
        who(TRAIN)
    }


async def test_nvml_init_failing_waits_for_the_retry_interval(
    make_env: MakeEnv, fake_nvml: FakeNvml
) -> None:
    now = [1000.0]
    node = FaultyNode(init_fails=True)
    source = fake_nvml.source(retry_interval=30.0, clock=lambda: now[0])
    env = await make_env(node=node, gpu=source)
    blind = list(node.users())
    text = await env.scrape(blind=blind)
    assert by_source(text, "dcgm_enricher_source_up")["nvml"] == 0
    assert value(text, "dcgm_enricher_gpu_processes", state="unattributed") == 0
    first_errors = by_source(text, "dcgm_enricher_source_errors_total")["nvml"]

    node.init_fails = False
    env.apply()
    # Within the retry interval the cached failure stands (NVML init is not hammered).
    text = await env.scrape(blind=blind)
    assert by_source(text, "dcgm_enricher_source_up")["nvml"] == 0
    assert by_source(text, "dcgm_enricher_source_errors_total")["nvml"] > first_errors
    now[0] += 30.0
    after = await env.scrape()
    _healthy(after)
    assert named(after, "gpu_container_memory_used_bytes")[(UUIDS[1], "")] == {
        who(INFER),
        who(NOTEBOOK),
    }


@pytest.mark.parametrize(
    "symbol",
    [
        # A lost GPU fails every call; the first one on each fetch is the MIG mode (its UUID
        # and name are read once per NVML init).
        pytest.param("nvmlDeviceGetMigMode", id="lost-before-process-lists"),
        pytest.param("nvmlDeviceGetProcessUtilization", id="lost-after-process-lists"),
    ],
)
async def test_gpu_lost_mid_scrape(make_env: MakeEnv, symbol: str) -> None:
    env = await make_env()
    _healthy(await env.scrape())
    env.node.extra_fails = [(symbol, ERROR_GPU_IS_LOST, 1)]
    env.apply()
    text = await env.scrape(blind=[(UUIDS[1], "")])
    up = by_source(text, "dcgm_enricher_source_up")
    assert (up["nvml"], up["upstream"]) == (0, 1)
    mem = named(text, "gpu_container_memory_used_bytes")
    assert mem == {(UUIDS[0], ""): {who(TRAIN)}}  # the other GPUs are still read
    assert set(pod_infos(text)) == {("ml", "train-0")}
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}

    env.node.extra_fails = []
    env.apply()
    after = await env.scrape()
    _healthy(after)
    assert named(after, "gpu_container_memory_used_bytes")[(UUIDS[1], "")] == {
        who(INFER),
        who(NOTEBOOK),
    }


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(("_v3",), id="no-v3-lists"),
        pytest.param(("_v3", "_v2"), id="only-v1-lists"),
    ],
)
async def test_old_driver_missing_functions(make_env: MakeEnv, missing: tuple[str, ...]) -> None:
    node = FaultyNode(util_fails=True)
    for base in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ):
        node.extra_fails += [(base + suffix, ERROR_FUNCTION_NOT_FOUND, None) for suffix in missing]
    env = await make_env(node=node)
    text = await env.scrape()
    _healthy(text)  # an older driver is not an error
    assert named(text, "gpu_container_memory_used_bytes") == {
        (UUIDS[0], ""): {who(TRAIN)},
        (UUIDS[1], ""): {who(INFER), who(NOTEBOOK)},
    }
    assert value(text, "gpu_container_memory_used_bytes", pod="train-0") == 8 * GIB
    assert "gpu_container_utilization_ratio{" not in text  # no data: absent, not 0

    node.util_fails = False
    node.extra_fails = []
    env.apply()
    after = await env.scrape()
    _healthy(after)
    assert value(after, "gpu_container_utilization_ratio", pod="train-0") == pytest.approx(0.3)


async def test_mig_mode_changes_between_scrapes(make_env: MakeEnv) -> None:
    node = FaultyNode()
    node.add(proc(401, 2, NOTEBOOK, memory=GIB))
    env = await make_env(node=node)
    text = await env.scrape()
    _healthy(text)
    assert named(text, "DCGM_FI_DEV_FB_USED")[(UUIDS[2], "")] == {who(NOTEBOOK)}

    # GPU 2 is reconfigured into MIG instances: the notebook is gone, two new users.
    node.mig = {2: [(1, "3g.40gb"), (2, "1g.10gb")]}
    node.remove(401)
    node.procs += [proc(402, 2, INFER, gi=1, memory=3 * GIB), proc(403, 2, None, gi=2)]
    env.apply()
    text = await env.scrape()
    _healthy(text)
    fb = named(text, "DCGM_FI_DEV_FB_USED")
    assert fb[(UUIDS[2], "1")] == {who(INFER)}
    assert fb[(UUIDS[2], "2")] == {("", "", "")}  # a host process: nobody is named
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[2], "")] == {("", "", "")}
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[2], "1")] == {who(INFER)}
    assert reasons(text)[((UUIDS[2], "2"), "host_process")] == GIB
    assert "jupyter-bob" not in {w[1] for w in named(text, "DCGM_FI_DEV_FB_USED")[(UUIDS[2], "1")]}

    # And back.
    node.mig = {}
    node.procs = [p for p in node.procs if p.pid < 400] + [proc(401, 2, NOTEBOOK, memory=GIB)]
    env.apply()
    text = await env.scrape()
    _healthy(text)
    assert named(text, "DCGM_FI_DEV_FB_USED")[(UUIDS[2], "")] == {who(NOTEBOOK)}
    assert (UUIDS[2], "1") not in named(text, "gpu_container_memory_used_bytes")


# --------------------------------------------------------------------------- procfs faults


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param("absent", id="gone-before-stat"),
        pytest.param("no-cgroup", id="gone-between-stat-and-cgroup"),
    ],
)
async def test_process_exits_between_listing_and_cgroup_read(
    make_env: MakeEnv, damage: str
) -> None:
    env = await make_env()
    _healthy(await env.scrape())
    # NVML lists a new process of the inference pod, but it exits before we read /proc.
    exited = damage == "absent"
    env.node.add(proc(202, 1, INFER, memory=GIB, exited=exited), "" if exited else damage)
    env.apply()
    text = await env.scrape()
    _healthy(text)  # a process that exits is normal, not a procfs error
    assert reasons(text) == {((UUIDS[1], ""), "process_exited"): GIB}
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}
    assert value(text, "dcgm_enricher_gpu_processes", state="unattributed") == 1

    # NVML stops listing it on the next read.
    env.node.remove(202)
    env.apply()
    after = await env.scrape()
    assert reasons(after) == {}
    assert value(after, "dcgm_enricher_gpu_processes", state="unattributed") == 0


async def test_pid_reused_by_another_container(make_env: MakeEnv) -> None:
    env = await make_env()
    text = await env.scrape()  # PID 201 read (and its cgroup cached) as the inference pod's
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[1], "")] == {
        who(INFER),
        who(NOTEBOOK),
    }
    # 201 exits after NVML listed it; the PID goes to a new process of the training pod,
    # which starts an hour "later" than the listing.
    env.node.update(
        201,
        cgroup=fakeproc.cgroup_v2_systemd(TRAIN.uid, TRAIN.container_id),
        start_ticks=(10_000 + 3_600) * CLK_TCK,
    )
    env.apply()
    text = await env.scrape()
    _healthy(text)
    assert reasons(text) == {((UUIDS[1], ""), "pid_reused"): 4 * GIB}
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[1], "")] == {who(NOTEBOOK)}
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[1], "")] == {("", "", "")}

    # The new process (started before this listing) really uses GPU 1: it is the trainer's.
    env.node.update(201, pod=TRAIN, start_ticks=(10_000 - 5) * CLK_TCK)
    env.apply()
    after = await env.scrape()
    _healthy(after)
    assert reasons(after) == {}
    assert named(after, "gpu_container_memory_used_bytes")[(UUIDS[1], "")] == {
        who(TRAIN),
        who(NOTEBOOK),
    }


@pytest.mark.parametrize("damage", ["fifo", "symlink", "dir", "bad-stat"])
async def test_unreadable_proc_files(make_env: MakeEnv, damage: str) -> None:
    env = await make_env()
    before = await env.scrape()
    errors = by_source(before, "dcgm_enricher_source_errors_total")["procfs"]
    env.node.add(proc(204, 0, INFER, memory=GIB), damage)
    env.apply()
    text = await env.scrape()
    assert by_source(text, "dcgm_enricher_source_up")["procfs"] == 0
    assert by_source(text, "dcgm_enricher_source_errors_total")["procfs"] == errors + 1
    assert reasons(text) == {((UUIDS[0], ""), "proc_unreadable"): GIB}
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {("", "", "")}
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[0], "")] == {who(TRAIN)}

    env.node.damage.pop(204)
    env.apply()
    after = await env.scrape()
    _healthy(after)
    assert reasons(after) == {}
    assert named(after, "gpu_container_memory_used_bytes")[(UUIDS[0], "")] == {
        who(TRAIN),
        who(INFER),
    }


@pytest.mark.parametrize(
    ("cgroup", "reason"),
    [
        pytest.param("\x00\x01\x02 binary junk\n", "unknown_cgroup", id="binary"),
        pytest.param(
            "0::/kubepods.slice/kubepods-podnot_a_uid.slice/x\n", "unknown_cgroup", id="bad-uid"
        ),
        pytest.param("0::/" + "a/" * 3000 + "\n", "unknown_cgroup", id="over-long-line"),
        pytest.param(
            fakeproc.cgroup_v2_systemd("eeeeeeee-0000-4000-8000-00000000000e", _cid(0xE)),
            "pod_not_found",
            id="pod-of-no-one",
        ),
        pytest.param(
            fakeproc.cgroup_v2_systemd(NOTEBOOK.uid, TRAIN.container_id),
            "cgroup_pod_mismatch",
            id="container-of-another-pod",
        ),
    ],
)
async def test_unexpected_cgroup_files(make_env: MakeEnv, cgroup: str, reason: str) -> None:
    env = await make_env()
    _healthy(await env.scrape())
    env.node.add(proc(205, 0, None, memory=GIB, cgroup=cgroup))
    env.apply()
    text = await env.scrape()
    _healthy(text)  # a file we do not understand is reported per process, not as an outage
    assert reasons(text) == {((UUIDS[0], ""), reason): GIB}
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {("", "", "")}
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[0], "")] == {who(TRAIN)}

    env.node.remove(205)
    env.apply()
    after = await env.scrape()
    assert reasons(after) == {}
    assert named(after, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}


# --------------------------------------------------------------------------- Kubernetes faults


async def test_kubernetes_down_at_start(make_env: MakeEnv) -> None:
    env = await make_env(kube_down_at_start=True)
    # The watch's first list attempt runs in its own thread: scrape until it has failed once
    # (a scrape that lands before it would see no error yet, which is not what this tests).
    deadline = time.monotonic() + 10
    while True:
        text = await env.scrape()
        if by_source(text, "dcgm_enricher_source_errors_total")["kubernetes"] >= 1:
            break
        assert time.monotonic() < deadline, "no failed list counted within 10 s"
        await asyncio.sleep(0.05)
    up = by_source(text, "dcgm_enricher_source_up")
    assert (up["kubernetes"], up["upstream"], up["nvml"], up["procfs"]) == (0, 1, 1, 1)
    assert by_source(text, "dcgm_enricher_source_errors_total")["kubernetes"] >= 1
    assert reasons(text) == {
        ((UUIDS[0], ""), "pod_not_found"): 8 * GIB,
        ((UUIDS[1], ""), "pod_not_found"): 6 * GIB,
    }
    assert pod_infos(text) == {}
    # Busy devices are cleared rather than left naming dcgm-exporter's guess.
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {("", "", "")}

    env.api.set_down(False)
    await env.wait_index(lambda: env.has_pod(TRAIN.uid), "the first list")
    after = await env.scrape()
    _healthy(after)
    assert named(after, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}


async def test_watch_dropped_resumes_without_relisting(make_env: MakeEnv) -> None:
    env = await make_env()
    before = await env.scrape()
    assert env.api.wait_for_watch()
    lists = env.api.list_requests
    env.api.drop_watches()
    text = await env.scrape()  # served from the last good cache
    assert named(text, "DCGM_FI_DEV_GPU_UTIL") == named(before, "DCGM_FI_DEV_GPU_UTIL")

    new = gpu_pod("ml", "train-1", "aaaaaaaa-0000-4000-8000-000000000011", "trainer", _cid(0x11))
    env.api.add_pod(pod_object(new, NODE))
    env.node.procs.append(proc(501, 2, new, memory=GIB))
    env.apply()
    await env.wait_index(lambda: env.has_container(new.container_id), "the new pod")
    after = await env.scrape()
    _healthy(after)
    assert named(after, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[2], "")] == {who(new)}
    assert env.api.list_requests == lists  # resumed from its resourceVersion


async def test_410_gone_relists(make_env: MakeEnv) -> None:
    env = await make_env()
    _healthy(await env.scrape())
    lists = env.api.list_requests
    env.api.set_down(True)  # a restart: watches cut, requests fail
    new = gpu_pod(
        "serving", "infer-1", "bbbbbbbb-0000-4000-8000-000000000012", "server", _cid(0x12)
    )
    env.api.add_pod(pod_object(new, NODE))
    env.api.compact()  # and the history the client would resume from is gone
    env.node.procs.append(proc(502, 2, new, memory=GIB))
    env.apply()
    await env.wait_index(lambda: not env.cache.up, "the outage")
    text = await env.scrape()
    up = by_source(text, "dcgm_enricher_source_up")
    assert (up["kubernetes"], up["nvml"]) == (0, 1)
    assert reasons(text) == {((UUIDS[2], ""), "pod_not_found"): GIB}
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}  # last good cache

    env.api.set_down(False)
    await env.wait_index(lambda: env.has_pod(new.uid), "the relist")
    assert env.api.expired_total >= 1
    assert env.api.list_requests > lists
    after = await env.scrape()
    _healthy(after)
    assert named(after, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[2], "")] == {who(new)}


async def test_slow_api_never_blocks_a_scrape(make_env: MakeEnv) -> None:
    env = await make_env()
    before = await env.scrape()
    env.api.set_delay(30.0)  # far over the client's 1 s request timeout
    env.api.drop_watches()
    new = gpu_pod("ml", "train-2", "aaaaaaaa-0000-4000-8000-000000000013", "trainer", _cid(0x13))
    env.api.add_pod(pod_object(new, NODE))
    env.node.procs.append(proc(503, 2, new, memory=GIB))
    env.apply()
    # The scrape reads the cache only. The guard is a hang guard, not a speed goal: far above
    # what a scrape takes, half of what waiting for the API would.
    text = await asyncio.wait_for(env.scrape(), 15.0)
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}
    assert (
        named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[1], "")]
        == named(before, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[1], "")]
    )
    assert reasons(text) == {((UUIDS[2], ""), "pod_not_found"): GIB}

    env.api.set_delay(0.0)
    await env.wait_index(lambda: env.has_container(new.container_id), "the new pod")
    after = await env.scrape()
    _healthy(after)
    assert named(after, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[2], "")] == {who(new)}


async def test_pod_deleted_while_its_process_runs(make_env: MakeEnv) -> None:
    env = await make_env()
    _healthy(await env.scrape())
    env.api.delete_pod(INFER.uid)
    await env.wait_index(lambda: not env.has_pod(INFER.uid), "the deletion")
    text = await env.scrape()
    _healthy(text)
    assert reasons(text) == {((UUIDS[1], ""), "pod_not_found"): 4 * GIB}
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[1], "")] == {who(NOTEBOOK)}
    assert ("serving", "infer-0") not in pod_infos(text)

    # The StatefulSet recreates infer-0 (new UID) while the old process still runs: the old
    # process must not be given to the new pod of the same name.
    again = replace(INFER, uid="bbbbbbbb-0000-4000-8000-0000000000ff", container_id=_cid(0xFF))
    env.api.add_pod(pod_object(again, NODE))
    await env.wait_index(lambda: env.has_pod(again.uid), "the new pod")
    text = await env.scrape()
    assert reasons(text) == {((UUIDS[1], ""), "pod_not_found"): 4 * GIB}
    assert ("serving", "infer-0") not in pod_infos(text)

    # The old process exits and the new pod's starts.
    env.node.procs = [p for p in env.node.procs if p.pid != 201]
    env.node.procs.append(proc(206, 1, again, memory=GIB))
    env.apply()
    after = await env.scrape()
    _healthy(after)
    assert reasons(after) == {}
    assert pod_infos(after)[("serving", "infer-0")] == again.uid


async def test_container_restarted_with_a_new_id(make_env: MakeEnv) -> None:
    env = await make_env()
    _healthy(await env.scrape())
    restarted = replace(TRAIN, container_id=_cid(0x21))
    # The new container's process shows up before the kubelet reports the new container ID.
    env.node.procs = [p for p in env.node.procs if p.pid != 101]
    env.node.procs.append(proc(102, 0, restarted, memory=8 * GIB))
    env.apply()
    text = await env.scrape()
    _healthy(text)
    # The pod UID alone is sure; which container is not yet: the pod is named, not the container.
    assert named(text, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {("ml", "train-0", "")}
    assert named(text, "gpu_container_memory_used_bytes")[(UUIDS[0], "")] == {("ml", "train-0", "")}

    env.api.update_pod(pod_object(restarted, NODE))
    await env.wait_index(lambda: env.has_container(restarted.container_id), "the new status")
    assert not env.has_container(TRAIN.container_id)
    after = await env.scrape()
    _healthy(after)
    assert named(after, "DCGM_FI_DEV_GPU_UTIL")[(UUIDS[0], "")] == {who(TRAIN)}
    assert named(after, "gpu_container_memory_used_bytes")[(UUIDS[0], "")] == {who(TRAIN)}


# --------------------------------------------------------------------------- the log


def episode_levels(caplog: pytest.LogCaptureFixture, source: str) -> list[str]:
    """Levels of the lines logged about ``source`` (those starting ``<source>:``), in order."""
    return [
        r.levelname
        for r in caplog.records
        if r.name.startswith("enricher") and r.getMessage().startswith(f"{source}:")
    ]


async def test_nvml_failure_is_logged_once_per_episode(
    make_env: MakeEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """One line per failure at the most (the source used to log it and the scraper again),
    WARNING to begin each episode, DEBUG while it lasts, INFO when it ends."""
    env = await make_env()
    caplog.set_level(logging.DEBUG, logger="enricher")
    _healthy(await env.scrape())
    ups = []
    for _episode in range(2):
        env.node.extra_fails = [("nvmlDeviceGetMigMode", ERROR_GPU_IS_LOST, 1)]
        env.apply()
        for _ in range(2):
            ups.append(
                by_source(await env.scrape(blind=[(UUIDS[1], "")]), "dcgm_enricher_source_up")[
                    "nvml"
                ]
            )
        env.node.extra_fails = []
        env.apply()
        ups.append(by_source(await env.scrape(), "dcgm_enricher_source_up")["nvml"])
    assert ups == [0, 0, 1, 0, 0, 1]
    assert episode_levels(caplog, "nvml") == ["WARNING", "DEBUG", "INFO"] * 2


async def test_procfs_failure_warns_again_after_a_recovery(
    make_env: MakeEnv, caplog: pytest.LogCaptureFixture
) -> None:
    env = await make_env()
    caplog.set_level(logging.DEBUG, logger="enricher")
    _healthy(await env.scrape())
    # A malformed stat file: read on every scrape (a cgroup file is cached once read).
    env.node.add(proc(204, 0, INFER, memory=GIB), "bad-stat")
    ups = []
    for _episode in range(2):
        env.node.damage[204] = "bad-stat"
        env.apply()
        for _ in range(2):
            ups.append(by_source(await env.scrape(), "dcgm_enricher_source_up")["procfs"])
        env.node.damage.pop(204)
        env.apply()
        ups.append(by_source(await env.scrape(), "dcgm_enricher_source_up")["procfs"])
    assert ups == [0, 0, 1, 0, 0, 1]
    assert episode_levels(caplog, "procfs") == ["WARNING", "DEBUG", "INFO"] * 2


# --------------------------------------------------------------------------- the invariant


def _line(name: str, uuid: str, pod: SimPod | None, gi: str = "", **extra: str) -> str:
    labels = [("UUID", uuid)] + ([("GPU_I_ID", gi)] if gi else [])
    if pod is not None:
        labels += [("namespace", pod.namespace), ("pod", pod.name), ("container", pod.container)]
    labels += list(extra.items())
    w = FamilyWriter()
    w.family(name, "x")
    w.sample(name, labels, 1)
    return w.render()


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        pytest.param(_line("DCGM_FI_DEV_GPU_UTIL", UUIDS[0], TRAIN), True, id="sole-user"),
        pytest.param(_line("DCGM_FI_DEV_GPU_UTIL", UUIDS[0], INFER), False, id="other-pod"),
        pytest.param(_line("DCGM_FI_DEV_GPU_UTIL", UUIDS[1], INFER), False, id="one-of-two"),
        pytest.param(_line("DCGM_FI_DEV_GPU_UTIL", UUIDS[1], None), True, id="shared-cleared"),
        pytest.param(_line("DCGM_FI_DEV_GPU_UTIL", UUIDS[2], RESERVED), True, id="idle-upstream"),
        pytest.param(_line("DCGM_FI_DEV_GPU_UTIL", UUIDS[2], TRAIN), False, id="idle-invented"),
        pytest.param(
            _line("gpu_container_memory_used_bytes", UUIDS[1], NOTEBOOK), True, id="container"
        ),
        pytest.param(
            _line("gpu_container_memory_used_bytes", UUIDS[0], NOTEBOOK), False, id="container-bad"
        ),
        pytest.param(
            _line("gpu_pod_info", UUIDS[0], RESERVED, pod_uid=RESERVED.uid), False, id="info-idle"
        ),
    ],
)
def test_the_invariant_catches_wrong_pods(text: str, ok: bool) -> None:
    """check_no_wrong_pod, used on every scrape above, can fail."""
    if ok:
        check_no_wrong_pod(text, FaultyNode())
    else:
        with pytest.raises(AssertionError):
            check_no_wrong_pod(text, FaultyNode())
