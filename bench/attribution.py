"""The attribution part: NVML (the fake libnvidia-ml) + procfs + pod lookup for 64 GPU
processes, with the floors under procfs and NVML (``bench_attribution``)."""

from __future__ import annotations

import os
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from . import payloads
from .modes import Mode, ms, pct, time_once
from .node import BenchNode


def bench_attribution(mode: Mode, work: Path, nvml_lib: Path) -> dict[str, Any]:
    from enricher.attribution import attribute, plan_devices
    from enricher.nvml import NvmlSource
    from enricher.podparse import build_index, parse_pod
    from enricher.procfs import ProcfsSource

    from .servers import use_fake_nvml

    out: dict[str, Any] = {}
    for shape_name in ("node8", "mig56"):
        sim = BenchNode(work / f"attr-{shape_name}", payloads.SHAPES[shape_name])
        sim.write()
        use_fake_nvml(str(sim.nvml_state))
        index = build_index(parse_pod(p) for p in sim.pod_objects())
        source = NvmlSource(library_path=str(nvml_lib))
        reader = ProcfsSource(str(sim.proc_root))

        parts: dict[str, list[float]] = {"nvml": [], "procfs": [], "lookup": []}

        def once(
            src: NvmlSource = source,
            rd: ProcfsSource = reader,
            ix: Any = index,
            parts: dict[str, list[float]] = parts,
        ) -> int:
            t0 = time.perf_counter()
            snap = src.fetch()
            t1 = time.perf_counter()
            procs = rd.read_many(sorted({p.pid for p in snap.processes}), snap.taken_at)
            t2 = time.perf_counter()
            attributions = attribute(snap, procs, ix)
            plan_devices(attributions)
            t3 = time.perf_counter()
            for name, took in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                parts[name].append(took)
            return sum(1 for a in attributions if a.pod is not None)

        attributed = once()  # first read: init, cgroup parse
        for part in parts.values():
            part.clear()
        times = [time_once(once) for _ in range(mode.attribution_reps)]
        source.close()
        # The floor under procfs: one open/read/close of each stat file, nothing else.
        stat_files = [str(sim.proc_root / str(p.pid) / "stat") for p in sim.processes]
        floor = [time_once(partial(_read_all, stat_files)) for _ in range(mode.attribution_reps)]
        # The floor under NVML (node8: no MIG): the library calls one read makes, bare. Shown,
        # not a target.
        nvml_floor = (
            _bare_nvml_floor(str(nvml_lib), mode.attribution_reps) if not sim.shape.migs else []
        )
        out[shape_name] = {
            "gpus": sim.shape.gpus,
            "devices": len(payloads.devices(sim.shape)),
            "processes": len(sim.processes),
            "attributed": attributed,
            "p50_ms": ms(statistics.median(times)),
            "p99_ms": ms(pct(times, 0.99)),
            **{f"{name}_p50_ms": ms(statistics.median(v)) for name, v in parts.items()},
            "stat_reads_floor_p50_ms": ms(statistics.median(floor)),
            "nvml_calls_floor_p50_ms": ms(statistics.median(nvml_floor)) if nvml_floor else None,
        }
    return out


def _bare_nvml_floor(library: str, reps: int) -> list[float]:
    """Timings of the driver calls one NVML read of a node without MIG makes (the count; per
    GPU the MIG mode, the three process lists, the utilization samples, power and energy),
    each through its ctypes function pointer into buffers made beforehand: what reading NVML
    costs from Python before any of the enricher's own work."""
    import ctypes

    import pynvml

    pynvml.nvmlInit()  # the library the source loaded (library_path): pynvml keeps it
    try:
        fn = pynvml._nvmlGetFunctionPointer
        count = fn("nvmlDeviceGetCount_v2")
        mig_mode = fn("nvmlDeviceGetMigMode")
        lists = [
            fn(f"nvmlDeviceGet{kind}RunningProcesses_v3")
            for kind in ("Compute", "Graphics", "MPSCompute")
        ]
        util = fn("nvmlDeviceGetProcessUtilization")
        power = fn("nvmlDeviceGetPowerUsage")
        energy = fn("nvmlDeviceGetTotalEnergyConsumption")
        n = ctypes.c_uint()
        count(ctypes.byref(n))
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n.value)]
        rows = (ctypes.c_ubyte * 4096)()
        size, current, pending = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        milliwatts, millijoules = ctypes.c_uint(), ctypes.c_ulonglong()
        since = ctypes.c_ulonglong()

        def calls() -> None:
            count(ctypes.byref(n))
            for handle in handles:
                mig_mode(handle, ctypes.byref(current), ctypes.byref(pending))
                for list_fn in lists:
                    size.value = 32
                    list_fn(handle, ctypes.byref(size), rows)
                size.value = 32
                util(handle, rows, ctypes.byref(size), since)
                power(handle, ctypes.byref(milliwatts))
                energy(handle, ctypes.byref(millijoules))

        return [time_once(calls) for _ in range(reps)]
    finally:
        pynvml.nvmlShutdown()


def _read_all(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 4096)
        finally:
            os.close(fd)
