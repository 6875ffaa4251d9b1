"""Build the fake ``libnvidia-ml.so.1`` (devkit/fakenvml/fake_nvml.c) and write its state.

No machine in CI has an NVIDIA GPU, so tests run the real pynvml against a small C library
that answers like NVML. What it reports comes from a text file named by ``FAKE_NVML_STATE``,
re-read on every ``nvmlInit`` and every ``nvmlDeviceGetCount_v2``, so a test may change the
GPUs between two scrapes. One record per line, fields separated by spaces::

    driver VERSION
    gpu INDEX UUID MIG NAME...            MIG: 1 on, 0 off, - not MIG-capable (NOT_SUPPORTED)
    mig GPU SLOT GI CI UUID NAME...       a MIG device in slot SLOT (0..7) of GPU
    power GPU MILLIWATTS MILLIJOULES      power draw and total energy (NOT_SUPPORTED without)
    bind GPU GENERATION                   GPU was unbound and bound again that many times
    proc DEV PID MEMORY LIST              MEMORY: bytes or "na"; LIST: compute|graphics|mps
    util DEV PID TIMESTAMP SM [MEM]       one nvmlProcessUtilizationSample_t
    fail SYMBOL DEV CODE                  SYMBOL returns CODE for DEV
    hang SYMBOL DEV                       SYMBOL never returns for DEV (a wedged driver)

``DEV`` is ``G`` (a full GPU), ``G/GI`` or ``G/GI/CI`` (a MIG instance), or ``*`` (any, only
for ``fail``). A ``fail`` rule for ``G`` also hits that GPU's MIG devices. GPUs must be listed
in index order; an unparsable or oversized file makes init fail with NVML_ERROR_UNKNOWN (999)
and prints the bad line to stderr. Limits: 64 GPUs, 8 MIG slots each, 4096 processes, 4096
samples, 64 fail rules.

GPUs come and go as in real NVML, where the device count and each index's handle are fixed at
``nvmlInit``: the count and the GPU at each index are those the state had at the first init
(the one with no init outstanding), and a handle stays bound to its GPU (its UUID) wherever
a later state lists it. A GPU that a later state no longer lists, or lists with another
``bind`` generation (unbound from the driver and bound again: ``gpu(binding=...)``), answers
NVML_ERROR_GPU_IS_LOST (15) through its old handle, its MIG devices' handles and
``nvmlDeviceGetHandleByIndex``; a GPU a later state adds is seen only after
``nvmlShutdown`` and a new init, which numbers the GPUs as the state then lists them. ``DEV``
and ``GPU`` in every record are indices in the state as it is now.

When ``FAKE_NVML_LOG`` names a file, each call appends ``SYMBOL DEVICE [ARGS]`` to it
(``DEVICE`` is ``-``, ``gpuN`` or ``gpuN/migS``); process lists and utilization log
``size COUNT|TIMESTAMP`` for the size query and ``fill ...`` for the second call.
:meth:`FakeNvml.calls` reads the log back.

In one Python process pynvml loads one library for good, so the default build is the one
loaded in-process; other builds (``defines``) must be exercised in a child process.

Use from another test module either through ``pytest_plugins = ["devkit.nvmlfake"]`` in
tests/conftest.py (fixtures ``fake_nvml_lib`` and ``fake_nvml``), or with the plain functions
:func:`session_fake_nvml_lib` and :func:`install_fake_nvml` from your own fixtures. The bench
builds the library with :func:`build_fake_nvml` and writes a simulated node's GPUs with
:func:`nvml_state_of`.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pynvml
import pytest

from enricher.model import ProcessKind
from enricher.nvml import NvmlSource
from enricher.simnode.node import SimNode

from .tools import require_tool

SOURCE = Path(__file__).parent / "fakenvml" / "fake_nvml.c"
SONAME = "libnvidia-ml.so.1"
CFLAGS = (
    "-shared",
    "-fPIC",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    f"-Wl,-soname,{SONAME}",
)
BUILD_TIMEOUT_S = 60.0

# Real NVML return codes (nvml.h), for states and assertions.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

MAX_GPUS = 64
MAX_MIG_SLOTS = 8

_DEFINE = re.compile(r"-D[A-Z_][A-Z0-9_]*(=[A-Za-z0-9_]*)?")
_TOKEN = re.compile(r"[^\s]+")
_SYMBOL = re.compile(r"nvml[A-Za-z0-9_]+")
_built: dict[tuple[Path, tuple[str, ...]], Path] = {}


class FakeNvmlBuildError(RuntimeError):
    """gcc ran but could not build the fake library."""


def build_fake_nvml(out_dir: Path, defines: Sequence[str] = ()) -> Path:
    """Compile fake_nvml.c into ``out_dir/<variant>/libnvidia-ml.so.1`` and return its path.

    ``defines`` are ``-D`` flags such as ``-DFAKE_NVML_NO_V3``. Builds are cached per
    (out_dir, defines) for the life of the process. Skips the calling test when gcc is missing.
    """
    flags = tuple(defines)
    for flag in flags:
        if not _DEFINE.fullmatch(flag):
            raise ValueError(f"not a -D flag: {flag!r}")
    key = (out_dir.resolve(), flags)
    cached = _built.get(key)
    if cached is not None and cached.exists():
        return cached
    gcc = require_tool("gcc", "it builds the fake libnvidia-ml.so.1 (.ci/system-deps)")
    variant = "-".join(f.removeprefix("-D").lower() for f in flags) or "default"
    target_dir = out_dir / variant
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / SONAME
    # Build beside the target and rename, so a concurrent reader never sees half a file.
    fd, tmp_name = tempfile.mkstemp(dir=target_dir, suffix=".so.tmp")
    os.close(fd)
    cmd = [gcc, *CFLAGS, *flags, "-o", tmp_name, str(SOURCE)]
    # The command is built from constants and validated -D flags above.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        Path(tmp_name).unlink(missing_ok=True)
        raise FakeNvmlBuildError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    os.replace(tmp_name, target)
    _built[key] = target
    return target


def default_gpu_uuid(index: int) -> str:
    """A stable, well-formed GPU UUID for GPU ``index``."""
    return f"GPU-{uuidlib.UUID(int=0xA100_0000 + index)}"


def default_mig_uuid(gpu: int, gi: int, ci: int) -> str:
    """A stable, well-formed MIG UUID for (gpu, gi, ci)."""
    return f"MIG-{uuidlib.UUID(int=(0xB000 + gpu) << 64 | gi << 32 | ci)}"


def _device(gpu: int, gi: int | None, ci: int | None) -> str:
    if gpu < 0 or (gi is not None and gi < 0) or (ci is not None and ci < 0):
        raise ValueError("device ids must be >= 0")
    if ci is not None and gi is None:
        raise ValueError("a compute instance needs a GPU instance")
    parts = [str(gpu)] + [str(x) for x in (gi, ci) if x is not None]
    return "/".join(parts)


def _token(value: str, what: str) -> str:
    if not _TOKEN.fullmatch(value) or len(value) >= 96:
        raise ValueError(f"{what} must be one word of 1..95 characters: {value!r}")
    return value


def _text(value: str, what: str) -> str:
    if not value.strip() or "\n" in value or "\r" in value or len(value) >= 96:
        raise ValueError(f"{what} must be one line of 1..95 characters: {value!r}")
    return value.strip()


@dataclass
class FakeNvmlState:
    """Builds a state file for the fake library; each method returns ``self`` to chain."""

    driver: str = "550.54.15"
    _gpus: list[str] = field(default_factory=list)
    _gpu_names: list[str] = field(default_factory=list)
    _mig_slots: dict[int, set[int]] = field(default_factory=dict)
    _lines: list[str] = field(default_factory=list)

    def gpu(
        self,
        uuid: str | None = None,
        name: str = "NVIDIA A100-SXM4-80GB",
        mig: bool | None = False,
        binding: int = 0,
    ) -> FakeNvmlState:
        """Add the next GPU (index = number added so far). ``mig=None``: not MIG-capable.
        ``binding``: how many times it was unbound from the driver and bound again; handles
        from an init that saw another generation answer GPU_IS_LOST."""
        index = len(self._gpus)
        if index >= MAX_GPUS:
            raise ValueError(f"at most {MAX_GPUS} GPUs")
        if not 0 <= binding <= 1 << 20:
            raise ValueError(f"binding out of range: {binding}")
        if binding:
            self._lines.append(f"bind {index} {binding}")
        mode = "-" if mig is None else str(int(mig))
        line = (
            f"gpu {index} {_token(uuid or default_gpu_uuid(index), 'uuid')} {mode} "
            f"{_text(name, 'name')}"
        )
        self._gpus.append(line)
        self._gpu_names.append(name)
        return self

    def mig(
        self,
        gpu: int,
        gi: int,
        ci: int = 0,
        profile: str = "1g.10gb",
        uuid: str | None = None,
        name: str | None = None,
        slot: int | None = None,
    ) -> FakeNvmlState:
        """Add a MIG device; its name defaults to real NVML's "<gpu name> MIG <profile>"."""
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu} yet")
        used = self._mig_slots.setdefault(gpu, set())
        if slot is None:
            slot = min(set(range(MAX_MIG_SLOTS)) - used, default=MAX_MIG_SLOTS)
        if not 0 <= slot < MAX_MIG_SLOTS or slot in used:
            raise ValueError(f"MIG slot {slot} of GPU {gpu} is taken or out of range")
        used.add(slot)
        full_name = name if name is not None else f"{self._gpu_names[gpu]} MIG {profile}"
        self._lines.append(
            f"mig {gpu} {slot} {gi} {ci} "
            f"{_token(uuid or default_mig_uuid(gpu, gi, ci), 'uuid')} {_text(full_name, 'name')}"
        )
        return self

    def power(self, gpu: int, milliwatts: int, millijoules: int) -> FakeNvmlState:
        """Give GPU ``gpu`` a power draw and a total-energy counter (NVML's units); a GPU
        without one answers NOT_SUPPORTED to both, as boards without a power sensor do."""
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu} yet")
        if not 0 <= milliwatts < 2**32 or not 0 <= millijoules < 2**64 - 1:
            raise ValueError("power and energy hold unsigned values")
        self._lines.append(f"power {gpu} {milliwatts} {millijoules}")
        return self

    def process(
        self,
        pid: int,
        gpu: int = 0,
        gi: int | None = None,
        ci: int | None = None,
        memory: int | None = 1 << 30,
        kind: ProcessKind | str = ProcessKind.COMPUTE,
    ) -> FakeNvmlState:
        """Add a process to one list; ``memory=None`` makes NVML report "not available"."""
        if not 0 <= pid < 2**32:
            raise ValueError(f"pid out of range: {pid}")
        if memory is not None and not 0 <= memory < 2**64 - 1:
            raise ValueError(f"memory out of range: {memory}")
        mem = "na" if memory is None else str(memory)
        self._lines.append(f"proc {_device(gpu, gi, ci)} {pid} {mem} {ProcessKind(kind).value}")
        return self

    def util(
        self,
        pid: int,
        timestamp: int,
        sm: int,
        gpu: int = 0,
        gi: int | None = None,
        ci: int | None = None,
        mem: int = 0,
    ) -> FakeNvmlState:
        """Add one utilization sample (``sm`` in percent, as NVML reports it)."""
        if timestamp < 0 or sm < 0 or mem < 0 or pid < 0:
            raise ValueError("samples hold unsigned values")
        self._lines.append(f"util {_device(gpu, gi, ci)} {pid} {timestamp} {sm} {mem}")
        return self

    def fail(
        self,
        symbol: str,
        code: int,
        gpu: int | None = None,
        gi: int | None = None,
        ci: int | None = None,
    ) -> FakeNvmlState:
        """Make ``symbol`` return ``code`` for one device (all devices when ``gpu`` is None)."""
        if not _SYMBOL.fullmatch(symbol) or len(symbol) >= 80:
            raise ValueError(f"not an NVML symbol: {symbol!r}")
        dev = "*" if gpu is None else _device(gpu, gi, ci)
        self._lines.append(f"fail {symbol} {dev} {int(code)}")
        return self

    def hang(
        self, symbol: str, gpu: int | None = None, gi: int | None = None, ci: int | None = None
    ) -> FakeNvmlState:
        """Make ``symbol`` block forever for one device (all devices when ``gpu`` is None),
        as a call into a wedged driver does; it logs ``hang`` first."""
        if not _SYMBOL.fullmatch(symbol) or len(symbol) >= 80:
            raise ValueError(f"not an NVML symbol: {symbol!r}")
        dev = "*" if gpu is None else _device(gpu, gi, ci)
        self._lines.append(f"hang {symbol} {dev}")
        return self

    def fail_init(self, code: int) -> FakeNvmlState:
        """Make both init entry points fail with ``code``."""
        return self.fail("nvmlInitWithFlags", code).fail("nvmlInit_v2", code)

    def render(self) -> str:
        """The state file's text."""
        head = [f"driver {_token(self.driver, 'driver')}"]
        return "\n".join([*head, *self._gpus, *self._lines]) + "\n"

    def write(self, path: Path) -> Path:
        """Write the state atomically (the fake may be reading it) and return ``path``."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.render(), encoding="utf-8")
        os.replace(tmp, path)
        return path


def nvml_state_of(node: SimNode) -> FakeNvmlState:
    """``node``'s GPUs, MIG devices and processes as the fake NVML reports them: memory
    fixed at each process's ``base_mib``, its ``samples`` (or one made from ``util``), and
    no per-process utilization on a MIG-enabled GPU, as real NVML answers there."""
    s = FakeNvmlState(driver=node.driver)
    for gpu in node.gpus:
        s.gpu(uuid=gpu.uuid, name=gpu.name, mig=gpu.mig_enabled)
    for mig in node.migs:
        s.mig(mig.gpu_index, gi=mig.gi_id, ci=mig.ci_id, profile=mig.profile, uuid=mig.uuid)
    for p in node.procs:
        ci = None if p.gi is None else 0
        memory = None if p.base_mib is None else p.base_mib << 20
        for kind in (p.kind, *p.also):
            s.process(p.pid, gpu=p.gpu, gi=p.gi, ci=ci, memory=memory, kind=kind)
    for p in node.procs:
        derived = ((1_000, round(100 * p.util)),) if p.util and p.gi is None else ()
        for timestamp, sm in p.samples or derived:
            s.util(p.pid, timestamp, sm, gpu=p.gpu)
    for gpu in node.gpus:
        if gpu.mig_enabled:
            s.fail("nvmlDeviceGetProcessUtilization", ERROR_NOT_SUPPORTED, gpu=gpu.index)
    return s


@dataclass
class FakeNvml:
    """The default fake library plus this test's state and call-log files."""

    library: Path
    state_path: Path
    log_path: Path
    sources: list[NvmlSource] = field(default_factory=list)

    def write(self, state: FakeNvmlState) -> None:
        """Replace the state the fake reports from its next init or device count."""
        state.write(self.state_path)

    def source(
        self, retry_interval: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> NvmlSource:
        """An NvmlSource preloading the fake; closed when the test ends."""
        src = NvmlSource(library_path=str(self.library), retry_interval=retry_interval, clock=clock)
        self.sources.append(src)
        return src

    def calls(self) -> list[list[str]]:
        """The calls logged so far, each split into [symbol, device, args...]."""
        if not self.log_path.exists():
            return []
        text = self.log_path.read_text(encoding="utf-8")
        return [line.split() for line in text.splitlines() if line]

    def count(self, symbol: str) -> int:
        """How many times ``symbol`` was called."""
        return sum(1 for call in self.calls() if call[0] == symbol)

    def calls_of(self, symbol: str) -> list[list[str]]:
        """The calls of ``symbol``: [symbol, device, "size"|"fill", args...] for the
        count-in, rows-out symbols (one call per list read while the rows fit the buffer
        offered, a second when the library answered that it needs more room)."""
        return [c for c in self.calls() if c[0] == symbol]

    def clear_log(self) -> None:
        """Forget the calls logged so far."""
        self.log_path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close every source this object made."""
        for src in self.sources:
            src.close()
        self.sources.clear()


def session_fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default build, compiled once per test session."""
    return build_fake_nvml(tmp_path_factory.getbasetemp() / "fakenvml")


def install_fake_nvml(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> FakeNvml:
    """Build (once) the default fake and point FAKE_NVML_STATE / FAKE_NVML_LOG at tmp_path.

    The state starts empty (no GPUs); call :meth:`FakeNvml.write` with a real one.
    """
    lib = session_fake_nvml_lib(tmp_path_factory)
    loaded = pynvml.nvmlLib
    if loaded is not None and not hasattr(loaded, "fake_nvml_is_fake"):
        # pynvml keeps the first library it loaded for the life of the process.
        pytest.skip("a real libnvidia-ml is already loaded in this process; cannot use the fake")
    fake = FakeNvml(
        library=lib,
        state_path=tmp_path / "fake_nvml.state",
        log_path=tmp_path / "fake_nvml.log",
    )
    fake.write(FakeNvmlState())
    monkeypatch.setenv("FAKE_NVML_STATE", str(fake.state_path))
    monkeypatch.setenv("FAKE_NVML_LOG", str(fake.log_path))
    return fake


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the default fake libnvidia-ml.so.1 (skips without gcc)."""
    return session_fake_nvml_lib(tmp_path_factory)


@pytest.fixture
def fake_nvml(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeNvml]:
    """A :class:`FakeNvml` with per-test state and log; its sources are closed afterwards."""
    fake = install_fake_nvml(tmp_path_factory, tmp_path, monkeypatch)
    yield fake
    fake.close()
