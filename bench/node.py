"""A simulated GPU node for the benchmark: fake NVML state, a /proc tree and the node's pods.

The GPUs and MIG instances are those of a :mod:`bench.payloads` shape, so the upstream
payload, NVML and the pods all name the same devices. Processes are spread over the devices
(one per device, the rest on the first devices again); each belongs to a pod that owns
nothing else (pods and processes are :class:`enricher.simnode.node.SimPod` and `SimProc`, and
:meth:`BenchNode.sim` the node as an `enricher.simnode.node.SimNode`, as the demo's and the
tests' are).
:meth:`BenchNode.churn` replaces pods the way a busy node does: the old pods go,
new pods with new UIDs and container IDs come, and their processes get the old PIDs back
(PID reuse, with a later start time).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from devkit.nvmlfake import FakeNvmlState, default_mig_uuid, nvml_state_of
from enricher.model import GpuDevice, MigDevice
from enricher.simnode.api import container_id, pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode as DemoNode
from enricher.simnode.node import SimPod, SimProc

from . import payloads

NODE = "gpu-node-bench"
NAMESPACES = ("inference", "training", "jupyterhub", "batch")
BTIME = 1_700_000_000


@dataclass
class BenchNode:
    """The node: ``pods`` pods, ``procs`` GPU processes on the devices of ``shape``."""

    root: Path
    shape: payloads.Shape
    n_pods: int = 110
    n_procs: int = 64
    pods: list[SimPod] = field(default_factory=list)
    processes: list[SimProc] = field(default_factory=list)
    generation: int = 0

    def __post_init__(self) -> None:
        self.pods = [self._new_pod(i) for i in range(self.n_pods)]
        devs = payloads.devices(self.shape)
        for i in range(self.n_procs):
            d = devs[i % len(devs)]
            self.processes.append(
                SimProc(
                    10_000 + i,
                    "python3",
                    d.gpu,
                    d.gi_id,
                    (1 + i % 9) * 1024,
                    0.0,
                    self.pods[i % self.n_pods],
                    start_ticks=1_000 + i,
                )
            )

    @property
    def proc_root(self) -> Path:
        return self.root / "proc"

    @property
    def nvml_state(self) -> Path:
        return self.root / "fake_nvml.state"

    def _new_pod(self, i: int) -> SimPod:
        ns = NAMESPACES[i % len(NAMESPACES)]
        name = f"worker-{i:03d}-g{self.generation}-5d8f7c9b6-{i % 7}x{self.generation % 10}q"
        uid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"bench/{ns}/{name}"))
        return SimPod(
            ns,
            name,
            uid,
            "main",
            container_id(f"{ns}/{name}/main"),
            ("ReplicaSet", name.rsplit("-", 1)[0]),
            "nvidia.com/gpu",
            labels=(("pod-template-hash", name.rsplit("-", 2)[-2]),),
        )

    def sim(self) -> DemoNode:
        """The node now, as the demo's dataclasses describe a node."""
        # Not the demo's node: a payload shape's GPUs, and sample timestamps that move on
        # with each churn. On a MIG shape the fake NVML now answers NOT_SUPPORTED for
        # per-process utilization, as real NVML does there.
        migs = tuple(
            MigDevice(d.uuid, d.gpu, d.gi_id, 0, default_mig_uuid(d.gpu, d.gi_id, 0), d.profile)
            for d in payloads.devices(self.shape)
            if d.gi_id is not None
        )
        gpus = tuple(
            GpuDevice(g, payloads.gpu_uuid(g), payloads.MODEL, mig_enabled=bool(self.shape.migs))
            for g in range(self.shape.gpus)
        )
        procs = tuple(
            replace(p, samples=((1_000 + self.generation, 10 + p.pid % 80),)) if p.gi is None else p
            for p in self.processes
        )
        return DemoNode(NODE, gpus, migs, procs, tuple(self.pods), driver=payloads.DRIVER)

    def nvml(self) -> FakeNvmlState:
        return nvml_state_of(self.sim())

    def write(self) -> None:
        """Write the /proc tree and the NVML state for the current pods and processes."""
        write_proc_tree(self.proc_root, self.sim(), BTIME + 86_400)
        self.nvml().write(self.nvml_state)

    def pod_objects(self) -> list[dict[str, Any]]:
        return [pod_object(p, NODE) for p in self.pods]

    def churn(self, count: int) -> tuple[list[str], list[SimPod]]:
        """Replace ``count`` pods (round robin); returns (UIDs removed, pods added).

        The replaced pods' processes are taken over by the new pods under the same PIDs with
        a later start time, then the /proc tree and NVML state are rewritten.
        """
        self.generation += 1
        removed: list[str] = []
        added: list[SimPod] = []
        first = (self.generation - 1) * count
        for k in range(count):
            i = (first + k) % self.n_pods
            old = self.pods[i]
            removed.append(old.uid)
            self.pods[i] = self._new_pod(i)
            added.append(self.pods[i])
            self.processes = [
                # a new process under a reused PID
                replace(p, pod=self.pods[i], start_ticks=(p.start_ticks or 0) + 10_000)
                if p.pod is old
                else p
                for p in self.processes
            ]
        self.write()
        return removed, added
