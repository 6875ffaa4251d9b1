"""The real-GPU check (issue #14): the enricher against a real NVML and the real /proc.

Run on a machine with an NVIDIA GPU and no network. Stdlib only up to the point where it
runs inside an environment holding the project: with ``--wheels DIR`` it first makes a venv in
a temporary folder (``--without-pip``; pip runs from its own wheel in DIR), installs the project
and its dependencies from DIR with ``--no-index``, and runs itself again in it. Then it

1. starts a CUDA process: PyTorch if the starting Python has it, else a tiny kernel loop built
   with ``nvcc``, else none (and says so; NVML is checked all the same);
2. reads NVML through pynvml: driver, GPUs, MIG mode, the process list, a utilization sample;
3. compares the struct layouts enricher/nvmlparse.py unpacks with pynvml's own ctypes structures;
4. serves a simulated dcgm-exporter on loopback that names the real GPUs, runs
   ``python -m enricher serve`` on it with ``--path.procfs=/proc --collector.process``, scrapes it,
   checks the scrape with prometheus_client's parser (and ``promtool check metrics`` if on PATH);
5. asks ``python -m enricher resolve PID`` what the CUDA process's cgroup says.

It prints a plain-text report and writes it (gpu-check.txt) and gpu-check.json under
``--out`` (default ``$OUT``).
Exit status: 0 when no check failed (a check with nothing to look at is "skipped"), 1 when one
did, 2 when the environment could not be set up. Everything has a timeout; the whole run is
bounded by ``--budget`` seconds (default 270, under 5 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

WORKLOAD_MIB = 256  # what the CUDA process allocates on top of its context

TORCH_WORKLOAD = """
import sys, time
try:
    import torch
except ImportError:
    sys.exit(3)
if not torch.cuda.is_available():
    sys.exit(4)
held = torch.empty({mib} * 2**20, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn_like(a)
(a @ b).sum().item()
print("ready", flush=True)
end = time.time() + {duration}
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""

CUDA_WORKLOAD = r"""
#include <cstdio>
#include <ctime>
__global__ void spin(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) for (int k = 0; k < 20000; k++) x[i] = x[i] * 0.9999f + 1.0f;
}
int main() {
    int n = %(mib)d * 1024 * 1024 / 4;
    float *x;
    cudaError_t err = cudaMalloc(&x, (size_t)n * 4);
    if (err != cudaSuccess) {
        fprintf(stderr, "cudaMalloc: %%s\n", cudaGetErrorString(err));
        return 4;
    }
    cudaMemset(x, 0, (size_t)n * 4);
    spin<<<(n + 255) / 256, 256>>>(x, n);
    err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        fprintf(stderr, "kernel: %%s\n", cudaGetErrorString(err));
        return 5;
    }
    printf("ready\n");
    fflush(stdout);
    time_t end = time(0) + %(duration)d;
    while (time(0) < end) { spin<<<(n + 255) / 256, 256>>>(x, n); cudaDeviceSynchronize(); }
    return 0;
}
"""


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.end - time.monotonic()))


# --------------------------------------------------------------------------- bootstrap


# Left out of the wheel folder and the install (tools/gpu_wheels.sh says why).
NOT_INSTALLED = frozenset({"kubernetes"})


def requirements(wheel: Path) -> list[str]:
    """The wheel's runtime requirements (Requires-Dist without extras), less NOT_INSTALLED."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(name).decode()
    out = []
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = line.split(":", 1)[1].split(";")[0].strip()
            if re.split(r"[\s<>=!~\[(]", req, maxsplit=1)[0].lower() not in NOT_INSTALLED:
                out.append(req.replace(" ", ""))
    return out


def bootstrap(args: argparse.Namespace, argv: list[str]) -> int:
    """Install from the wheel folder into a fresh venv, run the check there."""
    wheels = Path(args.wheels).resolve()
    pips = sorted(wheels.glob("pip-*.whl"))
    if not pips:
        print(f"gpu-check: no pip wheel in {wheels} (run `make gpu-wheels`)", file=sys.stderr)
        return 2
    project = sorted(wheels.glob("dcgm_enricher-*.whl"))
    if not project:
        print(f"gpu-check: no dcgm_enricher wheel in {wheels}", file=sys.stderr)
        return 2
    deadline = Deadline(args.budget)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            check=True,
            timeout=60,
        )
        python = venv / "bin" / "python"
        started = time.monotonic()
        pip = [str(python), str(pips[-1]) + "/pip", "install", "-q", "--no-index",
               "--disable-pip-version-check", "--find-links", str(wheels)]  # fmt: skip
        install = subprocess.run(
            [*pip, *requirements(project[-1])],
            capture_output=True, text=True, timeout=deadline.left(150), check=False,
        )  # fmt: skip
        if install.returncode == 0:
            install = subprocess.run(
                [*pip, "--no-deps", str(project[-1])],
                capture_output=True, text=True, timeout=deadline.left(60), check=False,
            )  # fmt: skip
        if install.returncode != 0:
            print(install.stdout + install.stderr, file=sys.stderr)
            print("gpu-check: installing from the wheels failed", file=sys.stderr)
            return 2
        print(f"gpu-check: installed from {wheels} in {time.monotonic() - started:.1f} s")
        inner = [a for a in argv if not a.startswith("--wheels=")]
        if "--wheels" in inner:
            i = inner.index("--wheels")
            inner = inner[:i] + inner[i + 2 :]
        left = int(deadline.end - time.monotonic())
        cmd = [str(python), str(Path(__file__).resolve()), *inner]
        cmd += ["--workload-python", args.workload_python or sys.executable, "--budget", str(left)]
        # The child is bounded by its own budget; this timeout only catches a wedged one.
        return subprocess.run(cmd, timeout=left + 30, check=False).returncode


# --------------------------------------------------------------------------- workload


class Workload:
    def __init__(self) -> None:
        self.kind = "none"
        self.pid: int | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.notes: list[str] = []
        self.ready_s: float | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _wait_ready(proc: subprocess.Popen[str], err: Path, timeout: float) -> str | None:
    """None when the process printed "ready" in time, else what went wrong."""
    box: list[str] = []
    assert proc.stdout is not None
    out = proc.stdout
    reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if box and box[0].strip() == "ready":
        return None
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    if not box:
        return f"not ready after {timeout:.0f} s"
    said = err.read_text(errors="replace").strip() if err.exists() else ""
    return f"exited {proc.returncode}: {said[-300:]}"


def start_workload(args: argparse.Namespace, tmp: Path, deadline: Deadline) -> Workload:
    w = Workload()
    if args.workload_pid:
        w.kind, w.pid = "external", args.workload_pid
        return w
    choices = ["torch", "nvcc"] if args.workload == "auto" else [args.workload]
    for kind in choices:
        started = time.monotonic()
        if kind == "torch":
            python = args.workload_python or sys.executable
            script = TORCH_WORKLOAD.format(mib=WORKLOAD_MIB, duration=args.duration)
            cmd = [python, "-c", script]
        elif kind == "nvcc":
            nvcc = shutil.which("nvcc")
            if nvcc is None:
                w.notes.append("nvcc: not on PATH")
                continue
            src = tmp / "spin.cu"
            src.write_text(CUDA_WORKLOAD % {"mib": WORKLOAD_MIB, "duration": args.duration})
            try:
                built = subprocess.run(
                    [nvcc, "-O2", "-o", str(tmp / "spin"), str(src)],
                    capture_output=True, text=True, timeout=deadline.left(120), check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                w.notes.append("nvcc: build timed out")
                continue
            if built.returncode != 0:
                w.notes.append(f"nvcc: build failed: {built.stderr.strip()[-300:]}")
                continue
            cmd = [str(tmp / "spin")]
        else:
            continue
        # stderr to a file: a chatty workload never blocks on a full pipe nobody reads.
        err = tmp / f"{kind}.stderr"
        with err.open("w") as err_file:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err_file, text=True, start_new_session=True
            )
        problem = _wait_ready(proc, err, deadline.left(120))
        if problem is None:
            w.kind, w.pid, w.proc = kind, proc.pid, proc
            w.ready_s = round(time.monotonic() - started, 1)
            return w
        reasons = {3: "no torch module", 4: "torch sees no CUDA device"} if kind == "torch" else {}
        w.notes.append(f"{kind}: {reasons.get(proc.returncode or 0) or problem}")
    w.notes.append("no CUDA workload could be started")
    return w


# --------------------------------------------------------------------------- NVML


def _nvml_call(errors: list[str], what: str, fn: Any, *a: Any) -> Any:
    try:
        return fn(*a)
    except Exception as exc:  # NVMLError and its subclasses, per call
        errors.append(f"{what}: {exc}")
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(library: str | None, pid: int | None) -> dict[str, Any]:
    """What pynvml itself says: driver, GPUs, MIG mode, processes, utilization samples."""
    import pynvml

    if library:
        # As NvmlSource does: pynvml then resolves libnvidia-ml.so.1 to this file by soname.
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    errors: list[str] = []
    out: dict[str, Any] = {"errors": errors, "devices": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        out["init_error"] = str(exc)
        return out
    try:
        out["driver"] = _text(_nvml_call(errors, "driver", pynvml.nvmlSystemGetDriverVersion))
        count = _nvml_call(errors, "count", pynvml.nvmlDeviceGetCount) or 0
        handles = []
        for i in range(count):
            h = _nvml_call(errors, f"gpu {i} handle", pynvml.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                continue
            handles.append(h)
            dev: dict[str, Any] = {
                "index": i,
                "name": _text(_nvml_call(errors, f"gpu {i} name", pynvml.nvmlDeviceGetName, h)),
                "uuid": _text(_nvml_call(errors, f"gpu {i} uuid", pynvml.nvmlDeviceGetUUID, h)),
            }
            try:
                current, pending = pynvml.nvmlDeviceGetMigMode(h)
                names = {0: "disabled", 1: "enabled"}
                dev["mig"] = names.get(int(current), str(current))
                if pending != current:
                    dev["mig"] += f" (pending {names.get(int(pending), str(pending))})"
            except pynvml.NVMLError_NotSupported:
                dev["mig"] = "not supported"
            except Exception as exc:
                dev["mig"] = f"error: {exc}"
            # v2 (R510 drivers on) says the driver's reservation apart, as DCGM 3.x's
            # FB_RESERVED does, and leaves it out of `used`; v1's `used` counts it.
            try:
                mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                dev["memory_used_bytes"], dev["memory_total_bytes"] = mem2.used, mem2.total
                dev["memory_reserved_bytes"], dev["memory_info"] = mem2.reserved, "v2"
            except Exception as exc:
                mem = _nvml_call(errors, f"gpu {i} memory", pynvml.nvmlDeviceGetMemoryInfo, h)
                if mem is not None:
                    dev["memory_used_bytes"], dev["memory_total_bytes"] = mem.used, mem.total
                    dev["memory_info"] = f"v1 (v2: {exc})"
            dev.update(_read_power(pynvml, h))
            procs = _nvml_call(
                errors, f"gpu {i} processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h
            )
            dev["processes"] = [
                {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory} for p in procs or []
            ]
            out["devices"].append(dev)
        # Utilization comes from samples since a timestamp; give the workload a moment to run.
        time.sleep(2.0)
        for dev, h in zip(out["devices"], handles, strict=True):
            try:
                samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
            except pynvml.NVMLError_NotFound:
                samples = []  # no sample in the window: NVML says NOT_FOUND
            except Exception as exc:
                errors.append(f"gpu {dev['index']} utilization: {exc}")
                samples = []
            later = _read_power(pynvml, h)
            if "energy_mj" in later:
                dev["energy_mj_after_2s"] = later["energy_mj"]
            dev["utilization_samples"] = [
                {"pid": s.pid, "timestamp": s.timeStamp, "sm_util": s.smUtil, "mem_util": s.memUtil}
                for s in samples
                if pid is None or s.pid == pid
            ]
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def struct_layouts() -> list[dict[str, Any]]:
    """The formats enricher/nvmlparse.py unpacks rows with, against pynvml's ctypes structures."""
    import pynvml

    from enricher import nvmlparse

    pairs = [
        ("nvmlProcessInfo_v1_t", nvmlparse.ROWS_V1, ["c_nvmlProcessInfo_v1_t"]),
        ("nvmlProcessInfo_v2_t", nvmlparse.ROWS_V2, ["c_nvmlProcessInfo_v2_t"]),
        ("nvmlProcessInfo_v3_t", nvmlparse.ROWS_V2, ["c_nvmlProcessInfo_v3_t"]),
        ("nvmlProcessInfo_t", nvmlparse.ROWS_V2, ["c_nvmlProcessInfo_t"]),
        (
            "nvmlProcessUtilizationSample_t",
            nvmlparse.ROWS_SAMPLE,
            ["c_nvmlProcessUtilizationSample_t"],
        ),
    ]
    rows = []
    for c_name, rows_struct, candidates in pairs:
        fmt = rows_struct.format
        fields = fmt.lstrip("@=<>!")
        offsets = [struct.calcsize("@" + fields[: i + 1]) - struct.calcsize("@" + ch)
                   for i, ch in enumerate(fields)]  # fmt: skip
        row: dict[str, Any] = {
            "struct": c_name,
            "format": fmt,
            "calcsize": struct.calcsize(fmt),
            "offsets": offsets,
        }
        cls = next((getattr(pynvml, n) for n in candidates if hasattr(pynvml, n)), None)
        if cls is None:
            row["pynvml"] = f"{candidates[0]} absent in this pynvml"
            # v1 is v2's first two fields: check those against pynvml's v2 class.
            base = getattr(pynvml, "c_nvmlProcessInfo_v2_t", None)
            if base is not None and c_name.endswith("_v1_t"):
                f_names = [f[0] for f in base._fields_[: len(fields)]]
                c_offsets = [getattr(base, n).offset for n in f_names]
                row.update(compared_with="c_nvmlProcessInfo_v2_t's first fields", fields=f_names)
                row["ok"] = c_offsets == offsets
            else:
                row["ok"] = None
        else:
            f_names = [f[0] for f in cls._fields_]
            c_offsets = [getattr(cls, n).offset for n in f_names]
            row.update(pynvml=candidates[0], sizeof=ctypes.sizeof(cls), fields=f_names)
            row["pynvml_offsets"] = c_offsets
            row["ok"] = ctypes.sizeof(cls) == struct.calcsize(fmt) and c_offsets == offsets
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- upstream


def _read_power(pynvml: Any, handle: Any) -> dict[str, Any]:
    """The board's power draw (mW) and total-energy counter (mJ), as the enricher reads them;
    "not supported" where the board has no sensor (NVML's NOT_SUPPORTED)."""
    out: dict[str, Any] = {}
    for key, fn in (
        ("power_mw", pynvml.nvmlDeviceGetPowerUsage),
        ("energy_mj", pynvml.nvmlDeviceGetTotalEnergyConsumption),
    ):
        try:
            out[key] = int(fn(handle))
        except pynvml.NVMLError_NotSupported:
            out[key + "_error"] = "not supported"
        except Exception as exc:
            out[key + "_error"] = str(exc)
    return out


def render_upstream(devices: list[dict[str, Any]], version: str = "4.8.2") -> str:
    """A minimal dcgm-exporter /metrics naming the real GPUs, as release ``version`` writes
    it: its field and label names and units (the enricher's field table)."""
    from enricher.fieldtable import table  # the wheel under test's own table

    naming = table().naming_of_release(version)
    host_label = table().label("host", version)
    lines: list[str] = []
    host = socket.gethostname().replace("\\", "\\\\").replace('"', '\\"')
    for field, key in (
        ("gpu_util", ""),
        ("fb_used", "memory_used_bytes"),
        ("fb_reserved", "memory_reserved_bytes"),
    ):
        entry = table().field(field).by_naming[naming]
        name = entry.name
        lines += [f"# HELP {name} {entry.help}", f"# TYPE {name} {entry.type}"]
        for d in devices:
            if key and key not in d:
                continue  # as DCGM writes no field it could not read
            value = int(d[key] // entry.scale) if key else 0  # bytes in the release's unit
            model = str(d["name"]).replace("\\", "\\\\").replace('"', '\\"')
            lines.append(
                f'{name}{{gpu="{d["index"]}",UUID="{d["uuid"]}",device="nvidia{d["index"]}",'
                f'modelName="{model}",{host_label}="{host}"}} {value}'
            )
    return "\n".join(lines) + "\n"


def serve_upstream(body: str) -> ThreadingHTTPServer:
    data = body.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------- enricher


# This script runs as a file on a machine with a GPU, in a virtualenv holding the wheel alone
# (its own folder on its path, not the checkout): it keeps its own port and GET, stdlib only,
# where the tests and the bench take devkit.ports.free_port and devkit.http.get.
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def common_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--no-kube.enabled", f"--path.procfs={args.procfs}", "--docker.host="]
    if args.nvml_library:
        flags.append(f"--nvml.library={args.nvml_library}")
    return flags


def run_enricher(
    args: argparse.Namespace, upstream: str, pid: int | None, tmp: Path, deadline: Deadline
) -> dict[str, Any]:
    """Start ``python -m enricher serve``, scrape until the workload shows (or time runs out)."""
    port = _free_port()
    log = (tmp / "enricher.log").open("w")
    cmd = [sys.executable, "-m", "enricher", "serve", f"--web.listen-address=127.0.0.1:{port}",
           f"--upstream.url={upstream}", "--no-kubelet.enabled", "--collector.process",
           *common_flags(args)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    out: dict[str, Any] = {"command": cmd[1:]}
    text = ""
    try:
        until = time.monotonic() + deadline.left(args.scrape_wait)
        scrapes = 0
        while time.monotonic() < until and proc.poll() is None:
            try:
                text = _get(f"http://127.0.0.1:{port}/metrics", timeout=deadline.left(15))
                scrapes += 1
            except OSError:
                time.sleep(0.3)
                continue
            if pid is None or (scrapes >= 2 and f'pid="{pid}"' in text):
                break
            time.sleep(2.0)
        out["scrapes"] = scrapes
        if proc.poll() is not None:
            out["exited"] = proc.returncode
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
    out["log_tail"] = (tmp / "enricher.log").read_text()[-1500:]
    out["text"] = text
    return out


def check_scrape(text: str, pid: int | None, deadline: Deadline) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {"bytes": len(text)}
    samples = []
    try:
        for fam in text_string_to_metric_families(text):
            samples.extend(fam.samples)
        out["prometheus_client"] = "ok"
    except Exception as exc:
        out["prometheus_client"] = f"error: {exc}"
    out["samples"] = len(samples)
    proc_mem = [s for s in samples if s.name == "gpu_process_memory_used_bytes"]
    out["process_memory"] = [
        {"labels": s.labels, "value": s.value}
        for s in proc_mem
        if pid is None or s.labels.get("pid") == str(pid)
    ]
    out["utilization"] = [
        {"labels": s.labels, "value": s.value}
        for s in samples
        if s.name == "gpu_container_utilization_ratio"
    ]
    out["power"] = [
        {"name": s.name, "labels": s.labels, "value": s.value}
        for s in samples
        if s.name in ("gpu_container_power_watts", "gpu_unattributed_power_watts")
    ]
    out["memory"] = [
        {"name": s.name, "labels": s.labels, "value": s.value}
        for s in samples
        if s.name in ("gpu_container_memory_used_bytes", "gpu_unattributed_memory_used_bytes")
    ]
    out["energy"] = [
        {"labels": s.labels, "value": s.value}
        for s in samples
        if s.name == "gpu_container_energy_joules_total"
    ]
    out["sources_up"] = {
        s.labels.get("source", "?"): s.value for s in samples if s.name == "dcgm_enricher_source_up"
    }
    promtool = shutil.which("promtool")
    if promtool is None:
        out["promtool"] = "not on PATH"
    elif text:
        res = subprocess.run(
            [promtool, "check", "metrics"],
            input=text, capture_output=True, text=True, timeout=deadline.left(30), check=False,
        )  # fmt: skip
        said = (res.stdout + res.stderr).strip()
        # Exit code 3 is lint remarks (camelCase labels copied from dcgm-exporter, by design),
        # not parse errors; the suite's own promtool check draws the same line.
        parsed = res.returncode in (0, 3) and "error while linting" not in said
        out["promtool"] = (
            ("ok" if res.returncode == 0 else f"ok ({len(said.splitlines())} lint remarks)")
            if parsed
            else f"error: {said[:500]}"
        )
    return out


def resolve(args: argparse.Namespace, pid: int, deadline: Deadline) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, "-m", "enricher", "resolve", *common_flags(args), str(pid)],
        capture_output=True, text=True, timeout=deadline.left(30), check=False,
    )  # fmt: skip
    try:
        return dict(json.loads(res.stdout.splitlines()[0]))
    except (IndexError, ValueError):
        return {"error": f"resolve exited {res.returncode}: {res.stderr.strip()[-300:]}"}


# --------------------------------------------------------------------------- report


def verdicts(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each check: "ok", "FAIL", or "skipped" (nothing to look at, e.g. no CUDA process)."""
    pid = report["workload"]["pid"]
    nv = report["nvml"]
    sc = report["scrape"]
    out: dict[str, dict[str, Any]] = {}

    def put(name: str, ok: bool | None, detail: str) -> None:
        status = "skipped" if ok is None else ("ok" if ok else "FAIL")
        out[name] = {"status": status, "detail": detail}

    def about_pid(found: bool, detail: str, missing: str) -> tuple[bool | None, str]:
        if pid is None:
            return None, "no CUDA process"
        return found, detail or missing

    devices = nv["devices"]
    gpus = f"driver {nv.get('driver')}, {len(devices)} GPU(s)"
    put("nvml", "init_error" not in nv and bool(devices), nv.get("init_error") or gpus)
    listed = [(d["index"], p) for d in devices for p in d["processes"] if p["pid"] == pid]
    text = "; ".join(
        f"GPU {i}: pid {p['pid']} uses {p['used_memory_bytes']} bytes" for i, p in listed
    )
    put("process_listed_by_nvml", *about_pid(bool(listed), text, f"pid {pid} in no process list"))
    mem = sc["process_memory"]
    text = "; ".join(f"{m['value']:.0f} bytes {m['labels']}" for m in mem)
    put("process_memory_from_enricher", *about_pid(bool(mem), text, "no series for the pid"))
    samples = [(d["index"], s) for d in devices for s in d.get("utilization_samples", [])]
    util = sc["utilization"]
    text = "; ".join(
        [f"GPU {i}: sm {s['sm_util']}% at {s['timestamp']}" for i, s in samples]
        + [f"enricher {u['value']} {u['labels']}" for u in util]
    )
    missing = "no sample for the pid in NVML's window, none from the enricher"
    put("utilization_sample", *about_pid(bool(samples or util), text, missing))
    put("power_split", *power_verdict(devices, sc, pid))
    put("memory_split", *memory_verdict(devices, sc))
    bad = [r["struct"] for r in report["structs"] if r["ok"] is False]
    sizes = ", ".join(f"{r['struct']} {r['calcsize']}" for r in report["structs"])
    put("struct_layouts", not bad, "mismatch: " + ", ".join(bad) if bad else sizes)
    modes = ", ".join(f"GPU {d['index']}: {d.get('mig')}" for d in devices)
    put("mig_mode", bool(devices), modes or "no GPU")
    att = report.get("attribution") or {}
    # An unknown cgroup is an answer (a bare host process); a vanished pid is not.
    found = bool(att) and att.get("error") not in ("no_such_pid", "permission_denied")
    put("cgroup_attribution", *about_pid(found, json.dumps(att, sort_keys=True), "no answer"))
    promtool = str(sc.get("promtool", ""))
    valid = sc["prometheus_client"] == "ok" and not promtool.startswith("error")
    put(
        "scrape_valid",
        bool(sc["bytes"]) and valid,
        f"{sc['samples']} samples, prometheus_client {sc['prometheus_client']}, "
        f"promtool {promtool}, sources up {sc['sources_up']}",
    )
    return out


def power_verdict(
    devices: list[dict[str, Any]], scrape: dict[str, Any], pid: int | None
) -> tuple[bool | None, str]:
    """Each GPU with a power reading has parts in the scrape (container and unattributed watts)
    that add up to a draw like NVML's (the enricher reads it at its own moment, so within a
    factor of two), and its energy counter did not go down over the check's 2 s. Skipped
    where no board reports power."""
    metered = [d for d in devices if "power_mw" in d]
    if not metered:
        reasons = {str(d.get("power_mw_error")) for d in devices}
        return None, f"no power reading: {', '.join(sorted(reasons)) or 'no GPU'}"
    ok = True
    parts: list[str] = []
    for d in metered:
        watts = d["power_mw"] / 1000
        mine = [p for p in scrape.get("power", []) if p["labels"].get("UUID") == d["uuid"]]
        total = sum(p["value"] for p in mine)
        pods = ", ".join(
            f"{p['labels'].get('pod') or p['labels'].get('reason') or p['labels'].get('container')}"
            f" {p['value']:.1f} W"
            for p in mine
        )
        close = bool(mine) and (watts == total == 0 or 0.5 * watts <= total <= 2 * watts + 1)
        energy_ok = d.get("energy_mj_after_2s", d.get("energy_mj", 0)) >= d.get("energy_mj", 0)
        ok = ok and close and energy_ok
        said = f"GPU {d['index']}: NVML {watts:.1f} W, enricher's parts {total:.1f} W"
        said += f" ({pods or 'none'})" + ("" if energy_ok else ", energy counter went down")
        parts.append(said)
    return ok, "; ".join(parts)


def memory_verdict(
    devices: list[dict[str, Any]], scrape: dict[str, Any]
) -> tuple[bool | None, str]:
    """Each GPU's memory as the simulated dcgm-exporter wrote it from NVML (FB_USED, and
    FB_RESERVED from the v2 memory info) is the enricher's parts: its containers' memory and
    every unattributed reason (driver_reserved, not_in_process_list among them), or less than
    them, with not_in_process_list 0, where the processes grew between the two reads."""
    read = [d for d in devices if "memory_used_bytes" in d]
    if not read:
        return None, "no memory reading"
    ok = True
    said: list[str] = []
    for d in read:
        device = (d["memory_used_bytes"] >> 20 << 20) + (
            d.get("memory_reserved_bytes", 0) >> 20 << 20
        )
        mine = [m for m in scrape.get("memory", []) if m["labels"].get("UUID") == d["uuid"]]
        total = sum(m["value"] for m in mine)
        rest = sum(m["value"] for m in mine if m["labels"].get("reason") == "not_in_process_list")
        adds_up = bool(mine) and (total == device or (total > device and rest == 0))
        ok = ok and adds_up
        parts = ", ".join(
            f"{m['labels'].get('pod') or m['labels'].get('reason') or m['labels'].get('container')}"
            f" {int(m['value']) >> 20} MiB"
            for m in mine
        )
        said.append(
            f"GPU {d['index']}: device {device >> 20} MiB (NVML {d.get('memory_info')}), "
            f"parts {int(total) >> 20} MiB ({parts or 'none'})"
        )
    return ok, "; ".join(said)


def render_text(report: dict[str, Any]) -> str:
    w = report["workload"]
    lines = [
        f"gpu-check: dcgm-enricher {report['versions']['enricher']}, Python "
        f"{report['versions']['python']}, nvidia-ml-py {report['versions']['pynvml']}",
        f"workload: {w['kind']} pid {w['pid']}"
        + (f" (ready after {w['ready_s']} s)" if w["ready_s"] is not None else "")
        + (f"; {'; '.join(w['notes'])}" if w["notes"] else ""),
    ]
    for d in report["nvml"]["devices"]:
        lines.append(
            f"GPU {d['index']} {d['name']} {d['uuid']} MIG {d.get('mig')} memory "
            f"{d.get('memory_used_bytes', 0) >> 20}/{d.get('memory_total_bytes', 0) >> 20} MiB"
        )
    for r in report["structs"]:
        lines.append(
            f"struct {r['struct']}: '{r['format']}' calcsize {r['calcsize']}"
            f" offsets {r['offsets']};"
            f" pynvml {r['pynvml']}"
            + (f" (compared with {r['compared_with']})" if "compared_with" in r else "")
            + f" sizeof {r.get('sizeof', '-')}"
            f" offsets {r.get('pynvml_offsets', '-')} -> {r['ok']}"
        )
    for name, v in report["checks"].items():
        lines.append(f"[{v['status']:>7}] {name}: {v['detail']}")
    lines.append(f"result: {'ok' if report['ok'] else 'FAIL'} in {report['runtime_s']} s")
    return "\n".join(lines)


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    import pynvml  # noqa: F401 (missing dependencies fail here, before a workload starts)

    import enricher

    started = time.monotonic()
    deadline = Deadline(args.budget)
    report: dict[str, Any] = {
        "versions": {
            "enricher": enricher.__version__,
            "python": sys.version.split()[0],
            "pynvml": _dist_version("nvidia-ml-py"),
        }
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-run-") as tmp_name:
        tmp = Path(tmp_name)
        workload = start_workload(args, tmp, deadline)
        try:
            report["workload"] = {
                "kind": workload.kind, "pid": workload.pid,
                "ready_s": workload.ready_s, "notes": workload.notes,
            }  # fmt: skip
            report["nvml"] = read_nvml(args.nvml_library, workload.pid)
            report["structs"] = struct_layouts()
            server = serve_upstream(render_upstream(report["nvml"]["devices"]))
            try:
                url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
                run = run_enricher(args, url, workload.pid, tmp, deadline)
            finally:
                server.shutdown()
            text = run.pop("text")
            report["enricher"] = run
            report["scrape"] = check_scrape(text, workload.pid, deadline)
            if workload.pid is not None:
                report["attribution"] = resolve(args, workload.pid, deadline)
        finally:
            workload.stop()
    report["checks"] = verdicts(report)
    report["ok"] = all(v["status"] != "FAIL" for v in report["checks"].values())
    report["runtime_s"] = round(time.monotonic() - started, 1)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", help="install the project from this wheel folder into a venv first")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write gpu-check.json here")
    p.add_argument("--workload", choices=("auto", "torch", "nvcc", "none"), default="auto")
    p.add_argument("--workload-pid", type=int, help="check this running process instead")
    p.add_argument("--workload-python", help="Python that runs the torch workload")
    p.add_argument("--duration", type=int, default=60, help="seconds the CUDA process runs at most")
    p.add_argument("--nvml.library", dest="nvml_library", help="NVML library (default: system)")
    p.add_argument("--path.procfs", dest="procfs", default="/proc")
    p.add_argument("--budget", type=float, default=270.0, help="seconds for the whole check")
    p.add_argument(
        "--scrape-wait", type=float, default=45.0, help="seconds to wait for the pid in a scrape"
    )
    p.add_argument("--print-requirements", metavar="WHEEL", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.print_requirements:
        print(" ".join(requirements(Path(args.print_requirements))))
        return 0
    if args.wheels:
        return bootstrap(args, argv)
    try:
        report = run_check(args)
    except ImportError as exc:
        print(f"gpu-check: {exc}; run with --wheels DIR (make gpu-wheels)", file=sys.stderr)
        return 2
    text = render_text(report)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu-check.txt").write_text(text + "\n")
        (Path(args.out) / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
