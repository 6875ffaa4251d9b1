"""A SIMULATED node's GPUs: a stand-in for NVML whose memory, utilization and power move."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..model import GpuProcess, GpuSnapshot, PowerReading
from ..sources import ReadResult
from .node import SimNode, SimProc

# SIMULATED power: each GPU draws 60 W idle plus up to 300 W with its mean load, swinging
# slowly. The form has a closed integral, so the simulated energy counter is exactly the
# energy the simulated power draws (as a real GPU's counter is), whatever times are asked.
IDLE_WATTS = 60.0
LOAD_WATTS = 300.0
POWER_PERIOD_SECONDS = 300.0

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
        self, node: SimNode, clock: Callable[[], float] = time.time, step: float = 0.0
    ) -> None:
        """``step``: memory and utilization move once per ``step`` seconds (the simulated
        dcgm-exporter's collection interval, so that both report the same moment), or
        continuously with 0. Power and energy always follow ``clock``."""
        self.node = node
        self.clock = clock
        self.started = clock()  # SimProc.busy_for counts from here
        self.step = step
        self.errors_total = 0

    def proc_memory(self, proc: SimProc, t: float) -> int | None:
        if proc.base_mib is None:
            return None
        return int((proc.base_mib * (0.9 + 0.2 * wave(t, 120, proc.pid))) * 2**20)

    def proc_util(self, proc: SimProc, t: float) -> float | None:
        if proc.gi is not None:
            return None
        if proc.busy_for is not None and t - self.started >= proc.busy_for:
            return 0.0
        return round(min(1.0, proc.util * (0.7 + 0.6 * wave(t, 45, proc.pid))), 3)

    def _mean_load(self, gpu: int) -> float:
        on_gpu = (p for p in self.node.procs if p.gpu == gpu)
        return min(1.0, sum((p.util if p.gi is None else MIG_PROCESS_LOAD) for p in on_gpu))

    def power_watts(self, gpu: int, t: float) -> float:
        """The SIMULATED draw of GPU ``gpu`` at ``t``, in watts."""
        load = self._mean_load(gpu)
        return IDLE_WATTS + LOAD_WATTS * load * (0.7 + 0.6 * wave(t, POWER_PERIOD_SECONDS, gpu))

    def energy_millijoules(self, gpu: int, t: float) -> float:
        """The SIMULATED energy counter of GPU ``gpu`` at ``t``: the integral of
        ``power_watts`` from 0 to ``t``, in millijoules."""
        load = self._mean_load(gpu)
        omega = 2 * math.pi / POWER_PERIOD_SECONDS
        # The integral of wave: 0.5 t - 0.5 cos(omega t + phase) / omega, from 0.
        swing = 0.5 * t - 0.5 * (math.cos(omega * t + gpu) - math.cos(gpu)) / omega
        joules = IDLE_WATTS * t + LOAD_WATTS * load * (0.7 * t + 0.6 * swing)
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
