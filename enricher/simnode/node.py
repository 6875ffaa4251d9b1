"""What a SIMULATED node holds: its GPUs and MIG devices, its GPU processes and its pods."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import DraDevice, GpuDevice, MigDevice, ProcessKind


@dataclass(frozen=True)
class SimPod:
    """A pod of a simulated node: the demo's, and the nodes the tests and the bench build."""

    namespace: str
    name: str
    uid: str
    container: str
    container_id: str
    owner: tuple[str, str] | None
    gpu_request: str | None  # resource name requested, None when the pod asked for no GPU
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    cgroup_style: str = "systemd"  # systemd | cgroupfs | crio
    # Device IDs the (simulated) device plugin allocated to the container, as the kubelet
    # reports them: GPU-<uuid>, GPU-<uuid>::<replica>, MIG-<uuid>.
    devices: tuple[str, ...] = ()
    # A static pod's config hash: the API server holds its mirror, under this hash, and the
    # kubelet names the pod's cgroup after it.
    mirror_of: str = ""
    qos: str = "burstable"  # guaranteed | burstable | besteffort: the cgroup path says which
    # Devices the (simulated) DRA driver allocated to the container through ResourceClaims.
    claims: tuple[DraDevice, ...] = ()

    @property
    def runtime(self) -> str:
        """The container runtime its containerID and cgroup name: CRI-O or containerd."""
        return "cri-o" if self.cgroup_style == "crio" else "containerd"


@dataclass(frozen=True)
class SimProc:
    """A GPU process of a simulated node: what NVML lists and what /proc holds for it."""

    pid: int
    comm: str
    gpu: int
    gi: int | None
    base_mib: int | None  # memory swings around this; None: NVML cannot tell
    util: float  # mean SM utilization 0..1
    pod: SimPod | None  # None: a host process
    kind: ProcessKind = ProcessKind.COMPUTE
    also: tuple[ProcessKind, ...] = ()  # further NVML lists naming it (a graphics context)
    # NVML's utilization samples (timestamp, SM percent) for the fake NVML; () derives one
    # sample from ``util``.
    samples: tuple[tuple[int, int], ...] = ()
    exited: bool = False  # NVML still lists it, /proc no longer has it
    host_cgroup: str = "/system.slice/gpu-benchmark.service"  # a host process's cgroup
    cgroup: str | None = None  # the cgroup file as written, where it is not its pod's
    start_ticks: int | None = None  # when it started; None: after the process before it
    # Seconds after the simulation starts that it stops computing and only holds its memory
    # (a notebook left open); None: it computes all along.
    busy_for: float | None = None


@dataclass(frozen=True)
class SimNode:
    """A simulated node: its GPUs and MIG devices, its GPU processes, and the pods the API
    server holds for it (a process's pod may be missing from them: deleted since)."""

    name: str
    gpus: tuple[GpuDevice, ...]
    migs: tuple[MigDevice, ...]
    procs: tuple[SimProc, ...]
    pods: tuple[SimPod, ...]
    driver: str = "550.90.07"
    # Where each MIG device sits on its GPU (its GPU instance's placement start, in memory
    # slices), by MIG UUID, as NVML's GPU-instance info says; one not given takes the first
    # free placement its profile allows, in the order of ``migs``.
    mig_placements: tuple[tuple[str, int], ...] = ()
    first_ticks: int = 100_000  # the first process's start time, in clock ticks after boot
    ticks_apart: int = 1000
