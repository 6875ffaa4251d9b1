"""The benchmark's servers in processes of their own: started (spawned, so that each holds only
what its part loads), asked over a pipe, measured from /proc and stopped."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Child:
    proc: Any
    conn: Any
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def rss_mib(self) -> float:
        return status_kib(self.proc.pid, "VmRSS") / 1024.0

    def hwm_mib(self) -> float:
        return status_kib(self.proc.pid, "VmHWM") / 1024.0

    def ask(self, what: Any) -> Any:
        """Send ``what`` and return the answer's payload (None without one in 10 s)."""
        self.conn.send(what)
        return self.conn.recv()[1] if self.conn.poll(10) else None

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send("stop")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def start(target: Callable[..., None], *args: Any) -> Child:
    """``target(conn, *args)`` in a spawned process, once it has said it is ready (its port)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    child.close()
    if not parent.poll(120):
        proc.terminate()
        raise RuntimeError(f"{target.__name__} did not start")
    msg = parent.recv()
    if not (isinstance(msg, tuple) and msg[0] == "ready"):
        raise RuntimeError(f"{target.__name__}: unexpected {msg!r}")
    return Child(proc, parent, int(msg[1]))
