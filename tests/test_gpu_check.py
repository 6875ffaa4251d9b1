"""tools/gpu_check.py, the real-GPU check (docs/gpu-check.md), proven on the fake NVML.

The check runs as a child process, as on the GPU machine: pynvml and the enricher it starts
load the fake libnvidia-ml.so.1 (``--nvml.library``), /proc is the real one, and the "CUDA
process" is a ``sleep`` child that the fake's process list names. The same script against a
real GPU is the ``gpu``-marked test, skipped where there is none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.nvmlfake import FakeNvmlState
from devkit.processes import stop_process
from tools import gpu_check

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_check.py"
WHEELS = ROOT / ".cache" / "gpu-wheels"
TIMEOUT_S = 200.0  # the check's own budget is 120 s below; this catches a wedged one


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    stop_process(proc)


def fake_state(tmp_path: Path, pid: int) -> Path:
    state = FakeNvmlState(driver="580.159.03")
    state.gpu(name="NVIDIA H200").gpu(name="NVIDIA H200", mig=True)
    state.process(pid, gpu=0, memory=256 << 20).util(pid, timestamp=1000, sm=42, gpu=0)
    state.power(0, 301_500, 9_000_000).power(1, 88_000, 5_000_000)
    return state.write(tmp_path / "nvml-state")


def run_check(
    args: list[str], tmp_path: Path, state: Path | None = None, python: str = sys.executable
) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("OUT", None)
    if state is not None:
        env["FAKE_NVML_STATE"] = str(state)
    out = tmp_path / "out"
    res = subprocess.run(
        [python, str(SCRIPT), "--out", str(out), "--budget", "120", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )
    report_file = out / "gpu-check.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return res.returncode, report, res.stdout + res.stderr


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {name: v["status"] for name, v in report["checks"].items()}


def test_check_on_the_fake_nvml(
    fake_nvml_lib: Path, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    state = fake_state(tmp_path, sleeper.pid)
    args = ["--workload-pid", str(sleeper.pid), "--nvml.library", str(fake_nvml_lib)]
    rc, report, output = run_check(args, tmp_path, state)
    assert rc == 0, output
    assert set(statuses(report).values()) == {"ok"}, output
    assert report["nvml"]["driver"] == "580.159.03"
    assert [d["mig"] for d in report["nvml"]["devices"]] == ["disabled", "enabled"]
    (mem,) = report["scrape"]["process_memory"]
    assert mem["value"] == 256 << 20
    assert mem["labels"]["pid"] == str(sleeper.pid)
    assert mem["labels"]["UUID"] == report["nvml"]["devices"][0]["uuid"]
    assert mem["labels"]["process_name"] == "sleep"
    assert report["attribution"]["comm"] == "sleep"
    assert report["attribution"]["cgroup"], report["attribution"]
    assert report["nvml"]["devices"][0]["utilization_samples"][0]["sm_util"] == 42
    # The sleeper, a process outside any container, holds GPU 0 alone: its 301.5 W are
    # unattributed with the process's reason; the MIG GPU with no process is idle.
    power = {p["labels"]["UUID"]: p for p in report["scrape"]["power"]}
    gpu0, gpu1 = (d["uuid"] for d in report["nvml"]["devices"])
    assert (power[gpu0]["name"], power[gpu0]["value"]) == ("gpu_unattributed_power_watts", 301.5)
    assert power[gpu0]["labels"]["reason"] == "host_process"
    assert (power[gpu1]["labels"]["reason"], power[gpu1]["value"]) == ("idle", 88.0)
    assert "NVML 301.5 W, enricher's parts 301.5 W" in report["checks"]["power_split"]["detail"]
    # The memory split: the fake has no v2 memory info, so no reservation; each GPU's parts
    # are its FB_USED (the sleeper's 256 MiB and what no listed process holds).
    split = report["checks"]["memory_split"]["detail"]
    assert "(NVML v1" in split and "not_in_process_list" in split, split
    assert report["runtime_s"] < 60
    assert "result: ok" in output


def test_check_without_a_workload_still_checks_nvml(fake_nvml_lib: Path, tmp_path: Path) -> None:
    state = FakeNvmlState().gpu(name="NVIDIA H200").write(tmp_path / "nvml-state")
    args = ["--workload", "none", "--nvml.library", str(fake_nvml_lib)]
    rc, report, output = run_check(args, tmp_path, state)
    assert rc == 0, output
    got = statuses(report)
    assert got["process_listed_by_nvml"] == got["cgroup_attribution"] == "skipped"
    assert got["power_split"] == "skipped"  # the fake's GPU has no power sensor here
    assert got["nvml"] == got["struct_layouts"] == got["scrape_valid"] == "ok"
    assert "no CUDA workload could be started" in report["workload"]["notes"]


def test_a_python_without_torch_is_said(fake_nvml_lib: Path, tmp_path: Path) -> None:
    state = FakeNvmlState().gpu().write(tmp_path / "nvml-state")
    args = ["--workload", "torch", "--workload-python", sys.executable, "--scrape-wait", "4"]
    rc, report, output = run_check([*args, "--nvml.library", str(fake_nvml_lib)], tmp_path, state)
    assert rc == 0, output
    assert report["workload"]["notes"][0] == "torch: no torch module", output
    assert report["workload"]["pid"] is None


def test_a_missing_process_fails_the_check(
    fake_nvml_lib: Path, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    state = FakeNvmlState().gpu().write(tmp_path / "nvml-state")  # lists no process
    args = ["--workload-pid", str(sleeper.pid), "--nvml.library", str(fake_nvml_lib)]
    rc, report, output = run_check([*args, "--scrape-wait", "4"], tmp_path, state)
    assert rc == 1, output
    assert statuses(report)["process_listed_by_nvml"] == "FAIL"
    assert statuses(report)["process_memory_from_enricher"] == "FAIL"


def test_struct_layouts_match_pynvml() -> None:
    rows = {r["struct"]: r for r in gpu_check.struct_layouts()}
    assert all(r["ok"] for r in rows.values()), rows
    assert rows["nvmlProcessInfo_v2_t"]["calcsize"] == 24
    assert rows["nvmlProcessUtilizationSample_t"]["calcsize"] == 32


def test_requirements_leave_out_kubernetes(tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / "x-1-py3-none-any.whl"
    meta = (
        "Metadata-Version: 2.1\nName: x\nRequires-Dist: aiohttp<4,>=3.9\n"
        'Requires-Dist: kubernetes>=37\nRequires-Dist: pytest>=8; extra == "test"\n'
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("x-1.dist-info/METADATA", meta)
    assert gpu_check.requirements(wheel) == ["aiohttp<4,>=3.9"]


@pytest.mark.slow
def test_bootstrap_installs_from_the_wheels(
    fake_nvml_lib: Path, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """`make gpu-check`'s path: a fresh venv from .cache/gpu-wheels (`make gpu-wheels`)."""
    if not any(WHEELS.glob("dcgm_enricher-*.whl")):
        pytest.skip("no .cache/gpu-wheels: `make gpu-wheels` fills it (needs the registry)")
    python = shutil.which("python3") or sys.executable
    state = fake_state(tmp_path, sleeper.pid)
    args = ["--wheels", str(WHEELS), "--workload-pid", str(sleeper.pid)]
    rc, report, output = run_check(
        [*args, "--nvml.library", str(fake_nvml_lib)], tmp_path, state, python
    )
    assert rc == 0, output
    assert "installed from" in output
    assert set(statuses(report).values()) == {"ok"}, output


def _has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU here (docs/gpu-check.md)")
def test_check_on_a_real_gpu(tmp_path: Path) -> None:
    rc, report, output = run_check(["--workload", "auto", "--duration", "60"], tmp_path)
    assert rc == 0, output
    assert report["workload"]["pid"] is not None, output
    assert statuses(report)["process_memory_from_enricher"] == "ok", output
