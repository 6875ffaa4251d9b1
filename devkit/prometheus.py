"""A real Prometheus started on a config, and its HTTP API: the tests' releases
(tests/promreleases.py) and the bench's fleet (bench/fleet.py) start theirs here."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from .ports import free_port
from .processes import stop_process

# A test's Prometheus scrapes and evaluates every second, so that the test is quick.
EVERY_SECOND = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}


@dataclass(frozen=True)
class Server:
    """A running Prometheus started by ``serve``: its base URL, its log file and its pid."""

    url: str
    log: Path
    pid: int = 0

    def api(self, path: str, timeout: float = 5, **params: str) -> Any:
        """The ``data`` of an HTTP API answer (``/api/v1/<path>``)."""
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=promql)["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts, pending and firing, with their labels and state."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _raise(message: str) -> NoReturn:
    raise RuntimeError(message)


@contextlib.contextmanager
def serve(
    binary: str,
    config: dict[str, Any],
    folder: Path,
    *,
    agent: bool = False,
    flags: Sequence[str] = (),
    storage: Path | None = None,
    ready_seconds: float = 30,
    stop_seconds: float = 10,
    port: int = 0,
    failed: Callable[[str], NoReturn] = _raise,
) -> Iterator[Server]:
    """The Prometheus at ``binary`` running ``config`` (written to ``folder``), once it is
    ready; in agent mode (a WAL and remote write, no queries) with ``agent``, ``flags`` added,
    its TSDB in ``storage`` (``folder``/tsdb by default), listening on ``port`` (a free one by
    default: a config that scrapes Prometheus itself names it first). When it is not ready in
    ``ready_seconds``, ``failed`` is called with a message and the log's tail (a RuntimeError
    by default; the tests fail the test)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = port or free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                *(
                    ["--agent", f"--storage.agent.path={folder / 'wal'}"]
                    if agent
                    else [f"--storage.tsdb.path={storage or folder / 'tsdb'}"]
                ),
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", log, proc.pid)
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response,
            ):
                if response.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                failed(f"Prometheus did not start:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        stop_process(proc, stop_seconds)
