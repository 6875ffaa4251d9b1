"""A SIMULATED node's GPUs: a stand-in for NVML whose memory, utilization and power move."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..model import GpuProcess, GpuSnapshot, PowerReading
from ..sources import ReadResult
from .node import SimNode, SimProc

# SIMULATED power. A GPU draws its model's idle power plus a share of the rest with the load of
# the processes computing on it at that moment, swinging slowly; a power brake holds it at its
# model's power limit (the enforced limit, as a real board's driver does), never above. The
# form has a closed integral, so the simulated energy counter is exactly the energy the
# simulated power draws (as a real GPU's counter is), whatever times are asked.
POWER_PERIOD_SECONDS = 300.0
SWING = 0.3  # the draw swings by this share of its load's watts either side


@dataclass(frozen=True)
class PowerModel:
    """A GPU model's SIMULATED power: ``idle_watts`` with nothing computing, ``load_watts``
    more at full load (mean of the swing) and ``limit_watts``, its default power limit."""

    idle_watts: float
    load_watts: float
    limit_watts: float


# Default power limits from NVIDIA's data sheets; idle draws as such boards report them.
POWER_MODELS = {
    "NVIDIA A100-SXM4-80GB": PowerModel(60.0, 300.0, 400.0),
    "NVIDIA A100-SXM4-40GB": PowerModel(55.0, 300.0, 400.0),
    "NVIDIA H100 80GB HBM3": PowerModel(70.0, 560.0, 700.0),
    "NVIDIA H200": PowerModel(75.0, 560.0, 700.0),
    "NVIDIA L4": PowerModel(16.0, 50.0, 72.0),
    "NVIDIA T4": PowerModel(10.0, 55.0, 70.0),
}
# A model the table lacks draws as an A100 does.
DEFAULT_POWER = POWER_MODELS["NVIDIA A100-SXM4-80GB"]
# How long the SIMULATED node has been up when its story starts: /proc/stat's btime (written
# by enricher.simnode.fakeproc) and the energy counter ("since boot") both count from then.
UPTIME_AT_START = 86_400


def power_model(name: str) -> PowerModel:
    """The SIMULATED power of the GPU model ``name`` (NVML's name)."""
    return POWER_MODELS.get(name, DEFAULT_POWER)


def _capped_integral(theta: float, mean: float, swing: float, cap: float) -> float:
    """An antiderivative of ``min(cap, mean + swing * sin(theta))`` over ``theta``, with
    ``swing >= 0``: exact, so that energy is the integral of the power at any times."""
    if swing <= 0 or cap >= mean + swing:
        return min(cap, mean) * theta if swing <= 0 else mean * theta - swing * math.cos(theta)
    if cap <= mean - swing:
        return cap * theta
    a = math.asin((cap - mean) / swing)  # the draw reaches the cap at a, leaves it at pi - a
    capped = math.pi - 2 * a
    per_turn = 2 * math.pi * mean - ((mean - cap) * capped + 2 * swing * math.cos(a))
    turns, r = divmod(theta - a, 2 * math.pi)
    if r <= capped:
        inside = cap * r
    else:
        inside = cap * capped + (
            mean * (a + r - (math.pi - a)) - swing * (math.cos(a + r) - math.cos(math.pi - a))
        )
    return turns * per_turn + inside


# A MIG instance's processes show no per-process utilization in NVML; the simulated engine
# activity of each counts this much.
MIG_PROCESS_LOAD = 0.3


def wave(t: float, period: float, phase: float) -> float:
    """A slow swing between 0 and 1: what every simulated value moves with."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period) + phase)


def collected_at(now: float, interval: float) -> float:
    """When the collection serving ``now`` was made: the start of its interval (``now``
    itself with no interval, for a stand-in that changes on every request)."""
    return now - now % interval if interval > 0 else now


class SimulatedGpus:
    """SIMULATED stand-in for NVML: ``node``'s GPUs with memory and utilization that move."""

    name = "nvml"
    enabled = True

    def __init__(
        self,
        node: SimNode,
        clock: Callable[[], float] = time.time,
        step: float = 0.0,
        started: float | None = None,
    ) -> None:
        """``step``: memory and utilization move once per ``step`` seconds (the simulated
        dcgm-exporter's collection interval, so that both report the same moment), or
        continuously with 0. Power and energy always follow ``clock``. ``started``: when the
        node's story starts (``SimProc.busy_for`` counts from it; None: now); the node booted
        ``UPTIME_AT_START`` before it, and every reader of one node passes the same."""
        self.node = node
        self.clock = clock
        self.started = clock() if started is None else started
        self.booted = self.started - UPTIME_AT_START
        self.step = step
        self.errors_total = 0

    def proc_memory(self, proc: SimProc, t: float) -> int | None:
        if proc.base_mib is None:
            return None
        return int((proc.base_mib * (0.9 + 0.2 * wave(t, 120, proc.pid))) * 2**20)

    def busy(self, proc: SimProc, t: float) -> bool:
        """Whether ``proc`` computes at ``t`` (a notebook left open stops at its busy_for)."""
        return proc.busy_for is None or t - self.started < proc.busy_for

    def proc_util(self, proc: SimProc, t: float) -> float | None:
        if proc.gi is not None:
            return None
        if not self.busy(proc, t):
            return 0.0
        return round(min(1.0, proc.util * (0.7 + 0.6 * wave(t, 45, proc.pid))), 3)

    def _mean_load(self, gpu: int, t: float) -> float:
        """GPU ``gpu``'s mean load at ``t``: its processes computing then (a MIG instance's,
        which NVML gives no utilization, each ``MIG_PROCESS_LOAD``), at most 1."""
        on_gpu = (p for p in self.node.procs if p.gpu == gpu and self.busy(p, t))
        return min(1.0, sum((p.util if p.gi is None else MIG_PROCESS_LOAD) for p in on_gpu))

    def _power_terms(self, gpu: int, load: float) -> tuple[float, float, float]:
        """(mean, swing, cap) of GPU ``gpu``'s draw at ``load``, in watts."""
        model = power_model(self.node.gpus[gpu].name)
        watts = model.load_watts * load
        return model.idle_watts + watts, SWING * watts, model.limit_watts

    def power_watts(self, gpu: int, t: float) -> float:
        """The SIMULATED draw of GPU ``gpu`` at ``t``, in watts: at most its power limit."""
        mean, swing, cap = self._power_terms(gpu, self._mean_load(gpu, t))
        theta = 2 * math.pi * t / POWER_PERIOD_SECONDS + gpu
        return min(cap, mean + swing * math.sin(theta))

    def energy_millijoules(self, gpu: int, t: float) -> float:
        """The SIMULATED energy counter of GPU ``gpu`` at ``t``: the integral of
        ``power_watts`` since the node booted, in millijoules (0 before)."""
        omega = 2 * math.pi / POWER_PERIOD_SECONDS
        # The load changes only where a process stops computing: integrate between those.
        stops = sorted(
            self.started + p.busy_for
            for p in self.node.procs
            if p.gpu == gpu and p.busy_for is not None and self.booted < self.started + p.busy_for
        )
        joules = 0.0
        start = self.booted
        for end in [*(s for s in stops if s < t), t]:
            if end <= start:
                continue
            mean, swing, cap = self._power_terms(gpu, self._mean_load(gpu, start))
            joules += (
                _capped_integral(omega * end + gpu, mean, swing, cap)
                - _capped_integral(omega * start + gpu, mean, swing, cap)
            ) / omega
            start = end
        return joules * 1000.0

    def fetch(self) -> GpuSnapshot:
        t = self.clock()
        state = collected_at(t, self.step)
        node = self.node
        procs = tuple(
            GpuProcess(
                node.gpus[p.gpu].uuid,
                p.gpu,
                p.gi,
                p.pid,
                self.proc_memory(p, state),
                self.proc_util(p, state),
                frozenset({p.kind, *p.also}),
            )
            for p in node.procs
        )
        power = tuple(
            PowerReading(g.uuid, self.power_watts(g.index, t), self.energy_millijoules(g.index, t))
            for g in node.gpus
        )
        return GpuSnapshot(
            node.gpus,
            node.migs,
            procs,
            power=power,
            driver_version=f"{node.driver} (simulated)",
            taken_at=t,
        )

    def read(self) -> ReadResult[GpuSnapshot]:
        return ReadResult(self.fetch())

    def close(self) -> None:
        pass
