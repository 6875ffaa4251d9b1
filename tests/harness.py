"""The one full-stack harness: the real Scraper and aiohttp app over every stand-in.

A test asks the ``full_stack`` fixture for a node and says what is on it: the text the
upstream serves, the fake NVML's state, the /proc tree, the pods the API server holds, and,
when the node has them, the kubelet's PodResources answers and a Docker Engine. The fixture
starts each stand-in, wires the real sources to it, serves the real app on loopback and
tears it all down afterwards. The golden, fault, allocation, Docker and discovery suites
differ in those parameters only; the plumbing is here.

Stand-ins (devkit/, shared with the bench): dcgm-exporter is an aiohttp server on loopback
(devkit.upstream.Upstream, which also plays its failures), NVML is pynvml over the fake
libnvidia-ml built from C (devkit/nvmlfake.py), /proc is a tree on disk
(enricher.simnode.fakeproc), the API server is devkit/kubeapi.py under the real kubernetes
client, the kubelet is a real gRPC server on a unix socket
(enricher.simnode.kubelet.SimulatedKubelet) and the Docker Engine is tests/dockerapi.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from devkit.clocks import Clock
from devkit.kubeapi import KubeApiStandIn, make_api_client
from devkit.nvmlfake import FakeNvml, FakeNvmlState
from devkit.ports import free_port
from devkit.processes import stop_process
from devkit.upstream import Upstream
from enricher.app import make_app
from enricher.config import Config
from enricher.docker import DockerSource
from enricher.fieldtable import table
from enricher.kube import KubernetesSource
from enricher.memory import REASON_DRIVER_RESERVED, REASON_NOT_IN_PROCESS_LIST
from enricher.pipeline import Scraper
from enricher.procfs import ProcfsSource
from enricher.simnode.kubelet import SimulatedKubelet
from enricher.simnode.node import SimPod
from enricher.sourcetable import make_podresources_source, make_resourceslices_source

from .conftest import GOLDEN
from .dockerapi import DockerAPI
from .scraping import PER_SCRAPE

# A port nothing listens on (discard): the upstream URL of a node whose exporter is down.
REFUSED_URL = "http://127.0.0.1:9/metrics"


CHECKOUT = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``dcgm-enricher ARGS...`` as a user runs it, from this checkout."""
    return subprocess.run(
        [sys.executable, "-m", "enricher", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=CHECKOUT,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
        check=False,
    )


@dataclass
class DemoProcess:
    """A running ``dcgm-enricher demo`` (see demo_process)."""

    url: str
    log: Path
    returncode: int | None = None

    def printed(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def demo_process(
    folder: Path, wait: float = 30.0, path: str | None = None
) -> Iterator[DemoProcess]:
    """``dcgm-enricher demo`` started as a user starts it, its output in ``folder``/demo.log,
    answering on /healthz before it is yielded; SIGTERM at the end (``returncode`` set).
    ``path``: its PATH (default the test's)."""
    port = free_port()
    log = folder / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "enricher", "demo", "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=CHECKOUT,
            env={**os.environ, "PYTHONPATH": str(CHECKOUT), "PATH": path or os.environ["PATH"]},
        )
        running = DemoProcess(f"http://127.0.0.1:{port}", log)
        try:
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(running.url + "/healthz", timeout=5).close()
                    break
                except OSError:
                    time.sleep(0.2)
            yield running
        finally:
            stop_process(proc)
            running.returncode = proc.returncode


def cid(n: int) -> str:
    """A 64-hex-digit container ID made from ``n``."""
    return f"{n:064x}"


def series(text: str, name: str) -> list[dict[str, str]]:
    """The samples of family ``name`` in ``text``: labels plus ``__value__`` (repr of float)."""
    for fam in text_string_to_metric_families(text):
        if fam.name == name or fam.name + "_total" == name:
            return [
                dict(s.labels) | {"__value__": repr(float(s.value))}
                for s in fam.samples
                if s.name == name
            ]
    return []


# The reasons of memory no listed process holds (enricher.memory).
MEMORY_REASONS = (REASON_DRIVER_RESERVED, REASON_NOT_IN_PROCESS_LIST)


def process_reasons(text: str) -> list[dict[str, str]]:
    """gpu_unattributed_memory_used_bytes of processes: without the reasons of memory no
    listed process holds (``MEMORY_REASONS``)."""
    return [
        s
        for s in series(text, "gpu_unattributed_memory_used_bytes")
        if s["reason"] not in MEMORY_REASONS
    ]


def memory_gaps(text: str) -> dict[tuple[str, str], float]:
    """Per device (UUID, GPU_I_ID) whose upstream writes FB_USED (FB_USED_BYTES from 4.9.0):
    FB_USED + FB_RESERVED (in bytes) less its containers' memory and every unattributed
    reason's, as written; 0.0 on every device where the memory adds up. A MIG GPU's own
    reading is left out where its instances have theirs."""

    def by_device(
        name: str, scale: float = 1.0, device: bool = False
    ) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for s in series(text, name):
            key = (s["UUID"], s.get("GPU_I_ID", ""))
            value = float(s["__value__"]) * scale
            # A device's own reading is its largest series: dcgm-exporter's per-pod copies
            # (--kubernetes-virtual-gpus) repeat it or hold a pod's share of it.
            out[key] = max(out.get(key, 0.0), value) if device else out.get(key, 0.0) + value
        return out

    def reading(key: str) -> dict[tuple[str, str], float]:
        """The device readings of ``key`` under whichever of its names the body writes, in
        bytes (enricher/dcgm_fields.json: MiB up to 4.8.x, bytes from 4.9.0)."""
        out: dict[tuple[str, str], float] = {}
        for name in table().names(key):
            entry = table().lookup(name)
            assert entry is not None
            out.update(by_device(name, entry.scale, device=True))
        return out

    used = reading("fb_used")
    reserved = reading("fb_reserved")
    held = by_device("gpu_container_memory_used_bytes")
    for key, value in by_device("gpu_unattributed_memory_used_bytes").items():
        held[key] = held.get(key, 0.0) + value
    split = {uuid for uuid, gi in used if gi}
    return {
        key: value + reserved.get(key, 0.0) - held.get(key, 0.0)
        for key, value in used.items()
        if key[1] or key[0] not in split
    }


def assert_memory_adds_up(text: str) -> None:
    """On every device with FB_USED, the parts written are never less than the device's
    memory, and exactly it wherever some memory is held by no listed process (the processes
    list less than FB_USED; where they list more, ``not_in_process_list`` is 0)."""
    rest = {
        (s["UUID"], s.get("GPU_I_ID", "")): float(s["__value__"])
        for s in series(text, "gpu_unattributed_memory_used_bytes")
        if s["reason"] == "not_in_process_list"
    }
    gaps = memory_gaps(text)
    assert set(gaps) <= set(rest), "a device with FB_USED has no not_in_process_list"
    assert all(gap <= 0.0 for gap in gaps.values()), gaps
    assert all(gaps[key] == 0.0 for key, value in rest.items() if value > 0), gaps
    assert all(value >= 0.0 for value in rest.values()), rest


def ps_rows(text: str) -> dict[str, dict[str, str]]:
    """``ps`` table rows by PID, each cell under its header's column."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    head = lines[0]
    names = head.split()
    starts = [head.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    rows = {}
    for line in lines[1:]:
        row = {n: line[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)}
        rows[row["PID"]] = row
    return rows


def who(pod: SimPod) -> tuple[str, str, str]:
    """(namespace, pod, container): how a series names ``pod``'s container."""
    return (pod.namespace, pod.name, pod.container)


# --------------------------------------------------------------------------- golden files

_VOLATILE = re.compile(
    r"^((?:dcgm_enricher_source_duration_seconds|dcgm_enricher_scrape_duration_seconds|"
    r"dcgm_enricher_kubernetes_last_sync_timestamp_seconds|"
    # NVML's wall clock of the collection (tests/test_idle.py holds its values).
    r"gpu_container_last_active_timestamp_seconds|"
    # The bytes of the bodies before: they carry the timings.
    r"dcgm_enricher_response_bytes_total)(?:\{[^}]*\})?) \S+$",
    re.MULTILINE,
)


# prometheus_client's families about the enricher's own process and interpreter: CPU, memory,
# file descriptors, garbage collections, and python_info's version labels.
_RUNTIME = re.compile(r"^((?:process|python)_\w+)(\{[^}]*\})? \S+$", re.MULTILINE)


def _runtime(m: re.Match[str]) -> str:
    if m.group(1) == "python_info":
        return "python_info{<volatile>} <volatile>"
    return f"{m.group(1)}{m.group(2) or ''} <volatile>"


def normalise(text: str) -> str:
    """Timings and the process's own figures change every run: their values become
    <volatile>, their presence stays."""
    return _RUNTIME.sub(_runtime, _VOLATILE.sub(r"\1 <volatile>", text))


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / f"{name}.out"
    got = normalise(text)
    if update or not path.exists():
        path.write_text(got)
        if not update:
            pytest.fail(f"{path} did not exist; written. Review it and run again.")
    assert got == path.read_text(), f"differs from {path}; run pytest --update-golden to accept"


# --------------------------------------------------------------------------- the other stand-ins


@contextlib.contextmanager
def short_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp: unix socket paths are limited to 107 bytes, and pytest's
    tmp_path can be longer."""
    directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        yield Path(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def docker_engine(containers: Iterable[tuple[str, str, Mapping[str, str]]]) -> Iterator[DockerAPI]:
    """The Docker Engine API stand-in on a unix socket, holding (name, image, labels)."""
    with short_dir("dk-") as directory:
        api = DockerAPI(str(directory / "docker.sock")).start()
        for name, image, labels in containers:
            api.add(name, image=image, labels=dict(labels))
        try:
            yield api
        finally:
            api.stop()


# --------------------------------------------------------------------------- the node


@dataclass
class Stack:
    """One running node: the real scraper and app, and the stand-ins under them."""

    scraper: Scraper
    client: TestClient[Any, Any]
    config: Config
    proc_root: Path
    gpu: Any
    upstream: Upstream | None = None
    api: KubeApiStandIn | None = None
    cache: KubernetesSource | None = None
    kubelet: SimulatedKubelet | None = None
    docker: DockerSource | None = None
    clock: Clock = field(default_factory=Clock)

    async def scrape(self) -> str:
        """GET /metrics: asserts a 200 and returns the body."""
        resp = await self.client.get("/metrics")
        assert resp.status == 200
        return await resp.text()

    async def close(self) -> None:
        await self.client.close()
        if self.upstream is not None:
            await self.upstream.stop()
        # The app's cleanup closed the scraper's sources (the pod watch, NVML, the kubelet).
        if self.api is not None:
            self.api.stop()
        if self.kubelet is not None:
            self.kubelet.stop(grace=None)


# What ``full_stack`` yields: ``await make(upstream=..., **options)`` starts one node (its
# keywords are those of ``make`` below).
MakeStack = Callable[..., Awaitable["Stack"]]


@pytest.fixture
async def full_stack(tmp_path: Path, fake_nvml: FakeNvml) -> AsyncIterator[MakeStack]:
    """Start a node (see :data:`MakeStack`); every node started is torn down afterwards.

    ``upstream``: what the exporter serves (None: nothing listens). ``nvml``/``proc``: the
    fake NVML state and a writer of the /proc tree (under tmp_path). ``node``/``pods``: the
    node name and the pod objects the API server holds (None: no Kubernetes); ``kube``: the
    pod cache's options; ``slices``: the ResourceSlices the API server holds, served at
    ``slice_versions``, read by the ResourceSlice source as ``serve`` makes it (None: the
    source is off). ``podresources``: read the kubelet's socket, where ``kubelet``
    answers (None: no kubelet listens). ``docker_host``: Docker mode with that host ("":
    cgroup-only). ``gpu``/``procs``: replace the NVML or procfs source. ``base`` and the
    other keywords: the config.
    """
    made: list[Stack] = []
    dirs = contextlib.ExitStack()

    async def make(
        *,
        upstream: str | Callable[[], str] | None,
        nvml: FakeNvmlState | None = None,
        proc: Callable[[Path], None] | None = None,
        node: str = "",
        pods: Iterable[Mapping[str, Any]] | None = None,
        slices: Sequence[Mapping[str, Any]] | None = None,
        slice_versions: Sequence[str] = ("v1",),
        kube: Mapping[str, Any] | None = None,
        kube_down_at_start: bool = False,
        podresources: bool = False,
        kubelet: Callable[[Any], Any] | None = None,
        docker_host: str | None = None,
        gpu: Any = ...,
        procs: Any = None,
        clk_tck: int | None = None,
        base: Config = PER_SCRAPE,
        **config: Any,
    ) -> Stack:
        proc_root = tmp_path / "proc"
        if nvml is not None:
            fake_nvml.write(nvml)
        if proc is not None:
            proc(proc_root)
        server = None
        if upstream is not None:
            server = Upstream(upstream, max_bytes=config.get("upstream_max_bytes", 256 * 1024))
            await server.start()
        api = cache = None
        if pods is not None:
            api = KubeApiStandIn()
            for obj in pods:
                api.add_pod(obj)
            if slices is not None:
                api.set_resource_slices(slices, slice_versions)
            if kube_down_at_start:
                api.set_down(True)
            cache = KubernetesSource(
                make_api_client(api.url),
                node,
                **{"watch_timeout_seconds": 5, "backoff_max_seconds": 0.2, **(kube or {})},
            )
            cache.start()
            if not kube_down_at_start:
                assert cache.synced.wait(10)
        settings: dict[str, Any] = {
            "upstream_url": server.url if server is not None else REFUSED_URL,
            "kube_node_name": node,
        }
        sim_kubelet = None
        if podresources:
            socket_path = dirs.enter_context(short_dir("pr-")) / "kubelet.sock"
            settings |= {"kubelet_pod_resources_socket": str(socket_path), "kubelet_timeout": 1.0}
            if kubelet is not None:
                sim_kubelet = SimulatedKubelet(str(socket_path), kubelet)
                sim_kubelet.start()
        if docker_host is not None:
            settings["docker_host"] = docker_host
        cfg = replace(base, **(settings | config))
        clock = Clock()
        docker = None
        if docker_host is not None:
            assert cfg.docker_active
            docker = DockerSource(cfg.docker_host, timeout=cfg.docker_timeout, clock=clock)
        source = fake_nvml.source() if gpu is ... else gpu
        reader = procs
        if reader is None:
            reader = ProcfsSource(str(proc_root), clk_tck=clk_tck)
        scraper = Scraper(
            cfg,
            nvml=source,
            procfs=reader,
            kubernetes=cache,
            podresources=make_podresources_source(cfg) if podresources else None,
            resourceslices=(
                make_resourceslices_source(cfg, cache.api_client)
                if slices is not None and cache is not None
                else None
            ),
            docker=docker,
            # The golden outputs do not depend on the memory limit of the machine's cgroup
            # (tests/test_cgroupmem.py and tests/test_promclient.py read limits).
            own_cgroupfs=str(proc_root / "no-cgroupfs"),
        )
        client = TestClient(TestServer(make_app(scraper)))
        await client.start_server()
        stack = Stack(
            scraper,
            client,
            cfg,
            proc_root,
            source,
            upstream=server,
            api=api,
            cache=cache,
            kubelet=sim_kubelet,
            docker=docker,
            clock=clock,
        )
        made.append(stack)
        return stack

    yield make
    for stack in made:
        await stack.close()
    dirs.close()
