"""The servers a test or the bench starts as processes: started with their logs, stopped."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent


def stop_process(proc: subprocess.Popen[bytes], seconds: float = 10) -> None:
    """SIGTERM a server started by a test, then SIGKILL if it is still there after
    ``seconds``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class Commands:
    """Servers started as commands from this checkout (``PYTHONPATH`` set to it), each writing
    its output to ``folder``/NAME.log; leaving the ``with`` block stops them, the last started
    first."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.folder / f"{name}.log").open("wb")
        self.logs.append(log)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.procs.append(proc)
        return proc

    def tail(self, name: str) -> str:
        """The end of NAME's log."""
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]

    def __enter__(self) -> Commands:
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)
        for log in self.logs:
            log.close()
