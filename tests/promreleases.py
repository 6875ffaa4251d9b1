"""The Prometheus releases every test that runs Prometheus or promtool runs on.

Two: Debian 12's 2.42 (the system package, /usr/bin) and the 3.5 LTS release, unpacked from
Debian's unstable suite into .cache/prometheus-3 by .ci/prometheus3 (``make test`` runs it).
ENRICHER_PROMETHEUS3_DIR names another root for 3.x (binaries in ROOT/usr/bin). In CI (CI set)
a missing release fails the tests that need it; elsewhere they skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS3_DIR = ROOT / ".cache" / "prometheus-3"
SYSTEM_BIN = Path("/usr/bin")


@dataclass(frozen=True)
class PromRelease:
    """One Prometheus release: its major.minor version and the paths of its two binaries."""

    version: str
    prometheus: str
    promtool: str

    @property
    def id(self) -> str:
        """The test id: prom2, prom3."""
        return "prom" + self.version.split(".")[0]


def _release(version: str, bindir: Path) -> PromRelease:
    return PromRelease(version, str(bindir / "prometheus"), str(bindir / "promtool"))


def releases() -> list[PromRelease]:
    """Both releases, present or not (``require`` checks a release before a test uses it)."""
    root = Path(os.environ.get("ENRICHER_PROMETHEUS3_DIR") or PROMETHEUS3_DIR)
    return [_release("2.42", SYSTEM_BIN), _release("3.5", root / "usr" / "bin")]


def missing(release: PromRelease) -> list[str]:
    """The binaries of ``release`` that are not there (or not executable)."""
    return [
        path
        for path in (release.prometheus, release.promtool)
        if not (os.access(path, os.X_OK) and Path(path).is_file())
    ]


def require(release: PromRelease) -> PromRelease:
    """``release`` when both binaries are there; fails in CI and skips elsewhere otherwise."""
    absent = missing(release)
    if absent:
        how = (
            "apt-get install prometheus"
            if release.version.startswith("2.")
            else ".ci/prometheus3 (make test runs it)"
        )
        message = f"Prometheus {release.version} is missing ({', '.join(absent)}): {how}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return release


@dataclass(frozen=True)
class Server:
    """A running Prometheus started by ``serve``: its base URL and its log file."""

    url: str
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of an HTTP API answer (``/api/v1/<path>``)."""
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
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


@contextlib.contextmanager
def serve(
    release: PromRelease,
    config: dict[str, Any],
    folder: Path,
    *,
    agent: bool = False,
    flags: Sequence[str] = (),
) -> Iterator[Server]:
    """``release``'s Prometheus running ``config`` (written to ``folder``), once it is ready;
    in agent mode (a WAL and remote write, no queries) with ``agent``, and ``flags`` added."""
    from .harness import free_port, stop_process  # harness imports conftest, which imports us

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                release.prometheus,
                f"--config.file={folder / 'prometheus.yml'}",
                *(
                    ["--agent", f"--storage.agent.path={folder / 'wal'}"]
                    if agent
                    else [f"--storage.tsdb.path={folder / 'tsdb'}"]
                ),
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response,
            ):
                if response.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus {release.version} did not start:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        stop_process(proc)
