"""A simulated GPU node for the benchmark: fake NVML state, a /proc tree and the node's pods.

The GPUs and MIG instances are those of a :mod:`bench.payloads` shape, so the upstream
payload, NVML and the pods all name the same devices. Processes are spread over the devices
(one per device, the rest on the first devices again); each belongs to a pod that owns
nothing else (pods are :class:`enricher.demo.SimPod`, as the demo's and the tests' are).
:meth:`SimNode.churn` replaces pods the way a busy node does: the old pods go,
new pods with new UIDs and container IDs come, and their processes get the old PIDs back
(PID reuse, with a later start time).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enricher import fakeproc
from enricher.demo import SimPod
from tests.kubeapi import container_id, make_pod
from tests.nvmlfake import FakeNvmlState

from . import payloads

NODE = "gpu-node-bench"
NAMESPACES = ("inference", "training", "jupyterhub", "batch")
BTIME = 1_700_000_000
GIB = 1 << 30


def pod_object(pod: SimPod) -> dict[str, Any]:
    """``pod`` as the API-server stand-in holds it."""
    return make_pod(
        pod.name,
        pod.namespace,
        pod.uid,
        NODE,
        containers=[(pod.container, pod.container_id, "containerd")],
        owner=pod.owner,
        labels=dict(pod.labels),
        gpu_request=pod.gpu_request is not None,
    )


@dataclass
class SimProcess:
    pid: int
    device: payloads.Device
    pod: int  # index into SimNode.pods
    start_ticks: int
    memory: int


@dataclass
class SimNode:
    """The node: ``pods`` pods, ``procs`` GPU processes on the devices of ``shape``."""

    root: Path
    shape: payloads.Shape
    n_pods: int = 110
    n_procs: int = 64
    pods: list[SimPod] = field(default_factory=list)
    processes: list[SimProcess] = field(default_factory=list)
    generation: int = 0

    def __post_init__(self) -> None:
        self.pods = [self._new_pod(i) for i in range(self.n_pods)]
        devs = payloads.devices(self.shape)
        for i in range(self.n_procs):
            self.processes.append(
                SimProcess(
                    pid=10_000 + i,
                    device=devs[i % len(devs)],
                    pod=i % self.n_pods,
                    start_ticks=1_000 + i,
                    memory=(1 + i % 9) * GIB,
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

    def nvml(self) -> FakeNvmlState:
        state = FakeNvmlState(driver=payloads.DRIVER)
        for g in range(self.shape.gpus):
            state.gpu(uuid=payloads.gpu_uuid(g), name=payloads.MODEL, mig=bool(self.shape.migs))
        if self.shape.migs:
            for d in payloads.devices(self.shape):
                assert d.gi_id is not None
                state.mig(d.gpu, gi=d.gi_id, ci=0, profile=d.profile)
        for p in self.processes:
            gi = p.device.gi_id
            state.process(
                p.pid, gpu=p.device.gpu, gi=gi, ci=None if gi is None else 0, memory=p.memory
            )
            if gi is None:
                state.util(p.pid, 1_000 + self.generation, 10 + p.pid % 80, gpu=p.device.gpu)
        return state

    def write(self) -> None:
        """Write the /proc tree and the NVML state for the current pods and processes."""
        fakeproc.write_proc_stat(self.proc_root, BTIME)
        for p in self.processes:
            pod = self.pods[p.pod]
            fakeproc.write_process(
                self.proc_root,
                p.pid,
                comm="python3",
                cgroup=fakeproc.cgroup_v2_systemd(pod.uid, pod.container_id),
                start_ticks=p.start_ticks,
            )
        self.nvml().write(self.nvml_state)

    def pod_objects(self) -> list[dict[str, Any]]:
        return [pod_object(p) for p in self.pods]

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
            removed.append(self.pods[i].uid)
            self.pods[i] = self._new_pod(i)
            added.append(self.pods[i])
            for p in self.processes:
                if p.pod == i:
                    p.start_ticks += 10_000  # a new process under a reused PID
        self.write()
        return removed, added
