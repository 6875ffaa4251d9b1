"""``dcgm-enricher demo``: the real pipeline on a SIMULATED node, for a newcomer with no GPU.

This module is the demo node's story (its GPUs, MIG devices, pods and processes, and what
dcgm-exporter's own mapping says of them) and the wiring that starts it and prints how to
look at it; the simulation itself is enricher.simnode, and says so: the GPUs (a stand-in for
NVML whose load, power and energy follow one clock: :mod:`.simnode.gpus`), the dcgm-exporter
(an HTTP server on loopback: :mod:`.simnode.exporter`), the /proc tree (written to a
temporary directory), the node's pods (a fixed list instead of a watch), the kubelet's
PodResources API (a real gRPC server on a temporary unix socket, answering with the simulated
allocations, DRA devices among them) and the DRA driver's ResourceSlices (a fixed list body).
What runs on top is the real thing: the upstream fetch over HTTP, the PodResources client, the
procfs reader and cgroup parser, attribution, the rewrite and the HTTP server.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from .app import make_app, serve
from .commands import wait_for_signal
from .config import Config
from .model import DeviceTaint, DraDevice, GpuDevice, MigDevice, ProcessKind
from .pipeline import Scraper
from .podparse import parse_mps_daemon_pods, parse_pod
from .podresources import PodResourcesSource
from .procfs import ProcfsSource, parse_btime
from .resourceslices import ResourceSlicesSource
from .simnode.api import (
    DRA_DRIVER,
    StaticPods,
    pod_object,
    resource_slices,
    static_slice_lister,
)
from .simnode.dialects import NEWEST, dialect, dialect_for
from .simnode.exporter import ExporterStory, make_exporter_app, render_exporter
from .simnode.fakeproc import write_proc_tree
from .simnode.gpus import UPTIME_AT_START, SimulatedGpus, collected_at
from .simnode.kubelet import SimulatedKubelet, allocations, list_response
from .simnode.node import SimNode, SimPod, SimProc
from .webconfig import WebConfig, WebConfigError, apply, load_web_config, ssl_context

NODE = "demo-gpu-node-1"
# The simulated dcgm-exporter's host label names the node, as dcgm-exporter writes it where its
# manifest sets NODE_NAME (NVIDIA's chart and the GPU Operator do): the page, the series'
# Hostname and the enricher's node label say one name.
EXPORTER_HOST = NODE


def _cid(n: int) -> str:
    return f"{n:02x}" * 32


GPUS = (
    GpuDevice(0, "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(1, "GPU-1e2f3a4b-5c6d-7e8f-90a1-b2c3d4e5f607", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(
        2, "GPU-2f3a4b5c-6d7e-8f90-a1b2-c3d4e5f60718", "NVIDIA A100-SXM4-80GB", mig_enabled=True
    ),
    GpuDevice(3, "GPU-3a4b5c6d-7e8f-90a1-b2c3-d4e5f6071829", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(4, "GPU-4c5d6e7f-8091-a2b3-c4d5-e6f70819203a", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(5, "GPU-5d6e7f80-91a2-b3c4-d5e6-f708192a3b4c", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(6, "GPU-6e7f8091-a2b3-c4d5-e6f7-08192a3b4c5d", "NVIDIA A100-SXM4-80GB"),
    GpuDevice(7, "GPU-7f8091a2-b3c4-d5e6-f708-192a3b4c5d6e", "NVIDIA A100-SXM4-80GB"),
)
MIGS = (
    MigDevice(GPUS[2].uuid, 2, 1, 0, "MIG-4b5c6d7e-8f90-5a1b-b2c3-d4e5f607182a", "3g.40gb"),
    MigDevice(GPUS[2].uuid, 2, 5, 0, "MIG-5c6d7e8f-905a-6b1c-c3d4-e5f607182a3b", "2g.20gb"),
    MigDevice(GPUS[2].uuid, 2, 13, 0, "MIG-6d7e8f90-5a6b-7c1d-d4e5-f607182a3b4c", "1g.10gb"),
    MigDevice(GPUS[2].uuid, 2, 14, 0, "MIG-7e8f905a-6b7c-8d1e-e5f6-07182a3b4c5d", "1g.10gb"),
)
# Where each instance sits on GPU 2 (placement starts, in memory slices): the four fill it.
MIG_PLACEMENTS = ((MIGS[0].uuid, 4), (MIGS[1].uuid, 0), (MIGS[2].uuid, 2), (MIGS[3].uuid, 3))
TRAIN = SimPod(
    "ml-team",
    "train-llama-4kq9z",
    "3f1c2b4a-6d7e-4f80-9a1b-2c3d4e5f6a70",
    "trainer",
    _cid(0xA1),
    ("Job", "train-llama"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
    devices=(GPUS[0].uuid,),
)
VLLM = SimPod(
    "inference",
    "vllm-7d9f8c6b5-k2x4p",
    "5b6c7d8e-9f01-4a2b-8c3d-4e5f60718293",
    "vllm",
    _cid(0xB2),
    ("ReplicaSet", "vllm-7d9f8c6b5"),
    "nvidia.com/gpu",
    labels=(("pod-template-hash", "7d9f8c6b5"), ("team", "serving")),
    devices=(f"{GPUS[1].uuid}::0",),  # a replica of the time-sliced GPU
)
TRITON = SimPod(
    "inference",
    "triton-5c6d7f8b9-p8m2n",
    "6c7d8e9f-0a1b-4c2d-9e3f-405162738495",
    "triton",
    _cid(0xC3),
    ("ReplicaSet", "triton-5c6d7f8b9"),
    "nvidia.com/gpu",
    labels=(("pod-template-hash", "5c6d7f8b9"), ("team", "serving")),
    cgroup_style="crio",
    devices=(f"{GPUS[1].uuid}::3",),
)
BERT = SimPod(
    "research",
    "bert-finetune-0",
    "7d8e9f0a-1b2c-4d3e-8f40-516273849506",
    "trainer",
    _cid(0xD4),
    ("StatefulSet", "bert-finetune"),
    "nvidia.com/mig-3g.40gb",
    labels=(("team", "nlp"),),
    cgroup_style="cgroupfs",
    devices=(MIGS[0].uuid,),
    qos="guaranteed",  # a MIG device is allocated by its own UUID
)
JUPYTER = SimPod(
    "jupyterhub",
    "jupyter-alice",
    "8e9f0a1b-2c3d-4e4f-9051-627384950617",
    "notebook",
    _cid(0xE5),
    None,
    None,
    labels=(
        ("hub.jupyter.org/username", "alice-40example-2ecom"),
        ("component", "singleuser-server"),
    ),
    annotations=(("hub.jupyter.org/username", "alice@example.com"),),
)
EVAL = SimPod(
    "research",
    "eval-harness-0",
    "9f0a1b2c-3d4e-4f5a-8b6c-7d8e9f0a1b2c",
    "eval",
    _cid(0xF6),
    ("StatefulSet", "eval-harness"),
    "nvidia.com/mig-1g.10gb",
    labels=(("team", "nlp"),),
    devices=(MIGS[2].uuid,),
)
MPS_DAEMON = SimPod(
    "nvidia-device-plugin",
    "nvidia-device-plugin-mps-control-daemon-5wq8k",
    "0a1b2c3d-4e5f-4a6b-9c7d-8e9f0a1b2c3d",
    "mps-control-daemon",
    _cid(0x17),
    ("DaemonSet", "nvidia-device-plugin-mps-control-daemon"),
    None,
    # The plugin Helm chart's pod labels: --mps.daemon-pod-selector's default admits it.
    labels=(
        ("app.kubernetes.io/name", "nvidia-device-plugin"),
        ("app.kubernetes.io/instance", "nvdp"),
    ),
)
EMBED_A = SimPod(
    "search",
    "embedder-6f7d8c9b4-q7w2e",
    "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e",
    "embedder",
    _cid(0x28),
    ("ReplicaSet", "embedder-6f7d8c9b4"),
    "nvidia.com/gpu.shared",  # MPS replicas under the renamed resource
    labels=(("pod-template-hash", "6f7d8c9b4"), ("team", "search")),
    devices=(f"{GPUS[4].uuid}::0",),
)
EMBED_B = replace(
    EMBED_A,
    name="embedder-6f7d8c9b4-m3x9z",
    uid="2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f",
    container_id=_cid(0x39),
    devices=(f"{GPUS[4].uuid}::1",),
)
FINETUNE = SimPod(
    "ml-team",
    "finetune-mistral-0",
    "3d4e5f6a-7b8c-4d9e-8f0a-1b2c3d4e5f6a",
    "trainer",
    _cid(0x4A),
    ("Job", "finetune-mistral"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
    devices=(GPUS[5].uuid,),
)
LLAMA_EVAL = SimPod(
    "ml-team",
    "llama-eval-7xq2m",
    "4e5f6a7b-8c9d-4e0f-9a1b-2c3d4e5f6a7b",
    "eval",
    _cid(0x5B),
    ("Job", "llama-eval"),
    "nvidia.com/gpu",
    labels=(("team", "llm"),),
    devices=(GPUS[6].uuid,),
)
DRA_TRAIN = SimPod(
    "ml-team",
    "dra-train-0",
    "5f6a7b8c-9d0e-4f1a-8b2c-3d4e5f6a7b8c",
    "trainer",
    _cid(0x6C),
    ("Job", "dra-train"),
    None,  # a DRA pod names a ResourceClaim, not an nvidia.com/* resource
    labels=(("team", "llm"),),
    claims=(DraDevice("dra-train-0-gpu-x7k2p", "ml-team", DRA_DRIVER, NODE, "gpu-7"),),
)
DRA_WHISPER = SimPod(
    "research",
    "dra-whisper-0",
    "6a7b8c9d-0e1f-4a2b-9c3d-4e5f6a7b8c9d",
    "whisper",
    _cid(0x7D),
    ("StatefulSet", "dra-whisper"),
    None,
    labels=(("team", "speech"),),
    # A MIG device NVIDIA's DRA driver publishes: gpu-<minor>-mig-<profile ID>-<start>-<size>.
    claims=(
        DraDevice("dra-whisper-0-mig-4fj2q", "research", DRA_DRIVER, NODE, "gpu-2-mig-19-3-1"),
    ),
)
PODS = (
    TRAIN,
    VLLM,
    TRITON,
    BERT,
    EVAL,
    JUPYTER,
    MPS_DAEMON,
    EMBED_A,
    EMBED_B,
    FINETUNE,
    LLAMA_EVAL,
    DRA_TRAIN,
    DRA_WHISPER,
)

PROCS = (
    SimProc(4101, "python", 0, None, 31_000, 0.82, TRAIN),
    SimProc(4102, "pt_data_worker", 0, None, 1_200, 0.05, TRAIN),
    SimProc(5201, "python3", 1, None, 20_500, 0.45, VLLM),
    SimProc(5301, "tritonserver", 1, None, 12_000, 0.30, TRITON),
    SimProc(6101, "python", 2, 1, 30_000, 0.0, BERT),  # MIG: NVML has no per-process SM data
    SimProc(6201, "python", 2, 13, 4_000, 0.0, EVAL),
    SimProc(7001, "python3", 2, 5, 9_000, 0.0, None),  # a host process (systemd service)
    # Alice ran cells for the demo's first two minutes, then left her notebook open, holding
    # its memory: gpu_container_last_active_timestamp_seconds stops, GpuHeldIdle follows.
    SimProc(8101, "python", 3, None, 6_000, 0.15, JUPYTER, ProcessKind.COMPUTE, busy_for=120.0),
    # MPS: the server holds memory for its clients; the clients come from NVML's MPS list.
    SimProc(9001, "nvidia-cuda-mps-server", 4, None, 500, 0.0, MPS_DAEMON),
    SimProc(9101, "python", 4, None, 7_000, 0.25, EMBED_A, ProcessKind.MPS),
    SimProc(9102, "python", 4, None, 7_000, 0.20, EMBED_B, ProcessKind.MPS),
    # GPU 5: allocated to finetune-mistral-0, which has no process on it (idle).
    # GPU 6: an evaluation job that finished its work but kept its CUDA context: memory held
    # at zero utilization.
    SimProc(4201, "python", 6, None, 18_000, 0.0, LLAMA_EVAL),
    # GPU 7: given to dra-train-0 through a DRA ResourceClaim (NVIDIA's DRA driver).
    SimProc(4301, "python", 7, None, 22_000, 0.64, DRA_TRAIN),
    # GPU 2's fourth MIG instance: given to dra-whisper-0 through a DRA ResourceClaim.
    SimProc(6301, "python", 2, 14, 5_000, 0.0, DRA_WHISPER),
)
# What dcgm-exporter's own PodResources mapping says: it sees only pods that requested a GPU,
# and on the time-sliced GPU it names just one of the two pods.
UPSTREAM_PODS: dict[tuple[int, int | None], SimPod] = {
    (0, None): TRAIN,
    (1, None): VLLM,
    (2, 1): BERT,
    (7, None): DRA_TRAIN,  # with the dra_* labels of its claim, as dcgm-exporter writes them
    (2, 14): DRA_WHISPER,  # and a MIG device's dra_mig_profile and dra_mig_device_uuid
}
DEMO = SimNode(NODE, GPUS, MIGS, PROCS, PODS, mig_placements=MIG_PLACEMENTS)
# What the SIMULATED driver holds on GPU 5, allocated to a pod that leaves it idle, that no
# listed process holds (MiB): what an exited process's context left behind until the driver
# frees it.
UNLISTED_MIB: dict[tuple[int, int | None], float] = {(5, None): 1536}
EXPORTER = ExporterStory(EXPORTER_HOST, UPSTREAM_PODS, UNLISTED_MIB)
# The SIMULATED DRA driver's health report: it lost track of GPU 7's health events, which
# dra-train-0 runs on (gpu_device_taint, GpuDeviceTainted).
TAINTS = {GPUS[7].uuid: (DeviceTaint("gpu.nvidia.com/unmonitored", "", "NoSchedule"),)}

# Like dcgm-exporter, the simulated one collects on an interval and serves the same body
# in between (dcgm-exporter's default is 30 s; shorter here so the demo moves).
UPSTREAM_COLLECT_INTERVAL = 5.0


def render_upstream(
    gpus: SimulatedGpus, t: float, version: str = NEWEST, virtual_gpus: bool = False
) -> str:
    """The demo's SIMULATED dcgm-exporter's /metrics at ``t`` (enricher.simnode.exporter)."""
    return render_exporter(gpus, t, EXPORTER, version, virtual_gpus)


def demo_gpus(
    clock: Callable[[], float] = time.time, started: float | None = None
) -> SimulatedGpus:
    """The demo node's SIMULATED NVML: memory and utilization step with its dcgm-exporter's
    collections; ``started``: when the demo started (None: now)."""
    return SimulatedGpus(DEMO, clock, step=UPSTREAM_COLLECT_INTERVAL, started=started)


def running_demo_gpus(proc_root: Path, clock: Callable[[], float] = time.time) -> SimulatedGpus:
    """The SIMULATED NVML of the demo whose /proc tree is ``proc_root``, on that demo's
    clock: its story started ``UPTIME_AT_START`` after the boot its /proc/stat says, so the
    demo's enricher, ``ps --demo`` and ``resolve --demo`` read one node at every moment.
    OSError or ValueError when there is no such tree."""
    btime = parse_btime((proc_root / "stat").read_text(encoding="utf-8"))
    return demo_gpus(clock, started=float(btime + UPTIME_AT_START))


def looking_at(
    config: Config, clock: Callable[[], float] = time.time
) -> tuple[Config, SimulatedGpus, StaticPods]:
    """For ``ps --demo`` and ``resolve --demo``: ``config`` on the demo's node (Kubernetes
    mode: no Docker lookups), and the SIMULATED NVML and pods of the demo whose /proc tree is
    ``config.procfs``, on that demo's clock (``running_demo_gpus``). OSError or ValueError
    without a demo's tree there."""
    gpus = running_demo_gpus(Path(config.procfs), clock)
    return replace(config, kube_node_name=NODE, kube_enabled=True), gpus, demo_pods(config)


def demo_pods(config: Config) -> StaticPods:
    """The demo node's SIMULATED pods, as the pod watch would parse them under ``config``."""
    return StaticPods(
        [
            parse_pod(
                pod_object(p, NODE),
                config.kube_pod_labels,
                config.kube_pod_annotations,
                parse_mps_daemon_pods(
                    config.mps_daemon_pod_selector, config.mps_daemon_pod_namespace
                ),
            )
            for p in PODS
        ]
    )


async def start_demo(
    config: Config,
    proc_root: Path,
    socket_path: Path,
    clock: Callable[[], float] = time.time,
    *,
    exporter_version: str = NEWEST,
    virtual_gpus: bool = False,
) -> tuple[Scraper, list[web.AppRunner], SimulatedKubelet]:
    """Start the simulated dcgm-exporter and kubelet, and the enricher in front of them, served
    as ``config.web_config_file`` says (TLS, basic auth; WebConfigError if it cannot be).
    ``clock``: the simulated node's time (tests freeze it); ``exporter_version`` and
    ``virtual_gpus``: the dialect the simulated dcgm-exporter speaks (ValueError if unknown)."""
    dialect_for(exporter_version, virtual_gpus)  # an unknown release or mode fails here
    web_cfg = load_web_config(config.web_config_file) if config.web_config_file else WebConfig()
    tls = ssl_context(web_cfg)
    write_proc_tree(proc_root, DEMO, clock())
    # The demo reads its clock as ps --demo does: from the tree it wrote.
    gpus = running_demo_gpus(proc_root, clock)
    upstream_app = make_exporter_app(
        lambda: render_upstream(
            gpus,
            collected_at(clock(), UPSTREAM_COLLECT_INTERVAL),
            exporter_version,
            virtual_gpus,
        )
    )
    response = list_response(allocations(PODS))
    kubelet = SimulatedKubelet(str(socket_path), lambda _context: response)
    kubelet.start()
    upstream = await serve(upstream_app, "127.0.0.1:0")
    port = upstream.addresses[0][1]
    pods = demo_pods(config)
    demo_config = replace(
        config,
        upstream_url=f"http://127.0.0.1:{port}/metrics",
        upstream_discover_pod=False,
        procfs=str(proc_root),
        kube_node_name=NODE,
        kubelet_pod_resources_socket=str(socket_path),
        simulated=True,
    )
    podresources = PodResourcesSource(
        str(socket_path),
        timeout=demo_config.kubelet_timeout,
        extra_resources=demo_config.kubelet_gpu_resources,
        extra_drivers=demo_config.kubelet_dra_drivers,
    )
    scraper = Scraper(
        demo_config,
        nvml=gpus,
        procfs=ProcfsSource(str(proc_root)),
        kubernetes=pods,
        podresources=podresources,
        resourceslices=ResourceSlicesSource(
            static_slice_lister(resource_slices(DEMO, taints=TAINTS)), NODE
        ),
    )
    app = make_app(scraper)
    apply(app, web_cfg)
    try:
        runner = await serve(
            app,
            config.listen_address,
            ssl_context=tls,
        )
    except OSError:
        await scraper.close()  # its upstream client session, before the error is shown
        await upstream.cleanup()
        kubelet.stop()
        raise
    return scraper, [runner, upstream], kubelet


# PIDs for the printed resolve command: a training job's, a Jupyter notebook's and a host
# process's on a MIG instance.
RESOLVE_EXAMPLE_PIDS = (4101, 8101, 7001)


def program(executable: str | None = None, path: str | None = None) -> str:
    """How a shell runs this installation's dcgm-enricher, as the demo prints it: the bare name
    where ``path`` (default $PATH) finds the script beside ``executable`` (default this
    interpreter: a virtualenv's), that script's absolute path where it does not (a virtualenv
    not activated), and the interpreter with ``-m enricher`` where there is no script."""
    interpreter = executable or sys.executable
    script = Path(interpreter).parent / "dcgm-enricher"
    if not script.is_file():
        return f"{shlex.quote(interpreter)} -m enricher"
    found = shutil.which("dcgm-enricher", path=path)
    if found is not None and os.path.samefile(found, script):
        return "dcgm-enricher"
    return shlex.quote(str(script))


def ps_command(proc_root: Path, prog: str) -> str:
    """The ``ps`` command line that looks at the demo whose /proc tree is ``proc_root``."""
    return f"{prog} ps --demo --path.procfs {shlex.quote(str(proc_root))}"


def resolve_command(proc_root: Path, prog: str) -> str:
    """The ``resolve`` command line for a few of the demo's PIDs (see ps_command)."""
    pids = " ".join(str(pid) for pid in RESOLVE_EXAMPLE_PIDS)
    return f"{prog} resolve --demo --path.procfs {shlex.quote(str(proc_root))} {pids}"


def demo_url(config: Config) -> str:
    """Where the demo's enricher answers, as ``config`` serves it."""
    host_port = config.listen_address
    host = "localhost" + host_port if host_port.startswith(":") else host_port
    scheme = "http"
    if config.web_config_file and load_web_config(config.web_config_file).tls is not None:
        scheme = "https"
    return f"{scheme}://{host}"


def _served_as(config: Config) -> str:
    """What the printed URLs need beyond themselves: the web config's TLS and basic auth."""
    if not config.web_config_file:
        return ""
    cfg = load_web_config(config.web_config_file)
    needs = [
        *(["TLS: curl --cacert <its CA>"] if cfg.tls is not None else []),
        *(["basic auth: curl -u <user>"] if cfg.auth_enabled else []),
    ]
    return f"\n  as {config.web_config_file} says" + (f" ({'; '.join(needs)})" if needs else "")


async def run_demo(
    config: Config, exporter_version: str = NEWEST, virtual_gpus: bool = False
) -> int:
    """``dcgm-enricher demo``: serve until interrupted."""
    with tempfile.TemporaryDirectory(prefix="dcgm-enricher-demo-") as tmp:
        proc_root = Path(tmp) / "proc"
        socket_path = Path(tmp) / "pod-resources" / "kubelet.sock"
        socket_path.parent.mkdir()
        try:
            _scraper, runners, kubelet = await start_demo(
                config,
                proc_root,
                socket_path,
                exporter_version=exporter_version,
                virtual_gpus=virtual_gpus,
            )
        except WebConfigError as exc:
            print(f"dcgm-enricher demo: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(
                f"dcgm-enricher demo: cannot listen on {config.listen_address}: {exc}",
                file=sys.stderr,
            )
            return 2
        url = demo_url(config)
        prog = program()
        print(
            "dcgm-enricher demo: a SIMULATED GPU node (8 A100s: one training job, one GPU\n"
            "time-sliced between two inference pods, one in MIG mode with pods on three\n"
            "instances (one given through a DRA ResourceClaim) and a host process, one used\n"
            "by a Jupyter pod that never requested a GPU and goes idle two minutes in, one\n"
            "shared through MPS by two pods, one allocated to a pod that leaves it idle, one\n"
            "held by a finished job that keeps its memory at zero utilization, one given to a\n"
            "pod through a DRA ResourceClaim).\n"
            "The GPUs, the dcgm-exporter, the kubelet's PodResources API, the ResourceSlices,\n"
            "/proc and the pods are simulated; the enricher is the real one. The simulated\n"
            f"dcgm-exporter speaks {dialect(exporter_version).version}'s dialect"
            f"{' with --kubernetes-virtual-gpus' if virtual_gpus else ''}.\n"
            f"\n  enriched metrics:  {url}/metrics\n"
            f"  who is on the GPUs: {url}/{_served_as(config)}\n"
            f"\n  try: curl -s {url}/metrics | grep -E '^gpu_(container|pod|unattr)'\n"
            f"       {ps_command(proc_root, prog)}\n"
            f"       {resolve_command(proc_root, prog)}\n"
            "\nCtrl-C to stop.",
            flush=True,
        )
        try:
            await wait_for_signal()
        finally:
            for runner in runners:
                await runner.cleanup()
            kubelet.stop()
    return 0
