"""A Docker Engine API stand-in: a real HTTP server on a unix socket, in its own thread.

It answers what the enricher asks (``/_ping``, ``/version``, ``/containers/<ref>/json``) the
way dockerd does: versioned and unversioned paths, a 400 with Docker's message for a version
outside the daemon's range, a container found by full ID, name or unique ID prefix, and a 404
with Docker's JSON error body (``{"message": "No such container: <ref>"}``) for one that is
gone. Tests can slow an answer down, garble it, fail it, or have it name another container.

Only the Docker daemon is simulated here (no engine runs on CI machines); the client side
under test is the real aiohttp stack over a real socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import socket
import stat
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

DAEMON_VERSION = "28.5.1"
MAX_API = "1.51"
MIN_API = "1.24"
_VERSIONED = re.compile(r"/v([0-9]+\.[0-9]+)(/.*)")


def container_id(seed: str) -> str:
    """A deterministic 64-hex container ID."""
    return hashlib.sha256(seed.encode()).hexdigest()


def _api_tuple(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor)


@dataclass
class FakeContainer:
    id: str
    name: str  # without the leading "/"; inspect writes it with one, as Docker does
    image: str = "nvcr.io/nvidia/pytorch:24.08-py3"
    labels: dict[str, str] = field(default_factory=dict)
    pid: int = 4242
    status: str = "running"


def compose_labels(project: str, service: str, number: int = 1) -> dict[str, str]:
    """The labels ``docker compose`` puts on a service's container."""
    return {
        "com.docker.compose.project": project,
        "com.docker.compose.service": service,
        "com.docker.compose.container-number": str(number),
        "com.docker.compose.oneoff": "False",
        "com.docker.compose.project.working_dir": f"/home/lab/{project}",
        "com.docker.compose.version": "2.29.7",
    }


def inspect_document(c: FakeContainer) -> dict[str, Any]:
    """``GET /containers/<id>/json`` as dockerd writes it (the fields clients commonly read,
    with the same shapes; dockerd has more)."""
    image_id = "sha256:" + hashlib.sha256(c.image.encode()).hexdigest()
    running = c.status == "running"
    return {
        "Id": c.id,
        "Created": "2025-06-02T09:14:03.512340981Z",
        "Path": "python",
        "Args": ["train.py", "--epochs", "90"],
        "State": {
            "Status": c.status,
            "Running": running,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": c.pid if running else 0,
            "ExitCode": 0,
            "Error": "",
            "StartedAt": "2025-06-02T09:14:04.101122334Z",
            "FinishedAt": "0001-01-01T00:00:00Z",
        },
        "Image": image_id,
        "ResolvConfPath": f"/var/lib/docker/containers/{c.id}/resolv.conf",
        "HostnamePath": f"/var/lib/docker/containers/{c.id}/hostname",
        "HostsPath": f"/var/lib/docker/containers/{c.id}/hosts",
        "LogPath": f"/var/lib/docker/containers/{c.id}/{c.id}-json.log",
        "Name": "/" + c.name,
        "RestartCount": 0,
        "Driver": "overlay2",
        "Platform": "linux",
        "MountLabel": "",
        "ProcessLabel": "",
        "AppArmorProfile": "docker-default",
        "ExecIDs": None,
        "HostConfig": {
            "NetworkMode": "bridge",
            "Runtime": "runc",
            "CgroupParent": "",
            "CgroupnsMode": "private",
            "PidMode": "",
            "IpcMode": "private",
            "DeviceRequests": [
                {
                    "Driver": "nvidia",
                    "Count": -1,
                    "DeviceIDs": None,
                    "Capabilities": [["gpu"]],
                    "Options": {},
                }
            ],
        },
        "GraphDriver": {"Name": "overlay2", "Data": None},
        "Mounts": [],
        "Config": {
            "Hostname": c.id[:12],
            "Domainname": "",
            "User": "",
            "AttachStdin": False,
            "AttachStdout": False,
            "AttachStderr": False,
            "Tty": False,
            "OpenStdin": False,
            "StdinOnce": False,
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
                "NVIDIA_VISIBLE_DEVICES=all",
            ],
            "Cmd": ["python", "train.py", "--epochs", "90"],
            "Image": c.image,
            "Volumes": None,
            "WorkingDir": "/workspace",
            "Entrypoint": None,
            "OnBuild": None,
            "Labels": dict(c.labels),
        },
        "NetworkSettings": {
            "Bridge": "",
            "SandboxID": hashlib.sha256(b"sandbox" + c.id.encode()).hexdigest(),
            "Ports": {},
            "Networks": {},
        },
    }


class DockerAPI:
    """The stand-in daemon on ``socket_path``; start with ``start()`` or ``with``.

    Knobs (safe to change while it runs): ``max_api``/``min_api`` (the daemon's version
    range), ``advertise_version`` (False: no Api-Version header, like a non-Docker server),
    ``delay[ref]`` seconds before answering an inspect, ``garbage`` (refs answered with a
    broken body), ``fail[ref]`` (an HTTP status answered with Docker's error body),
    ``impostor[ref]`` (answer with another container's document), ``huge`` (refs answered
    with a document padded past ``huge_bytes``).
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.max_api = MAX_API
        self.min_api = MIN_API
        self.advertise_version = True
        self.containers: dict[str, FakeContainer] = {}
        self.delay: dict[str, float] = {}
        self.garbage: set[str] = set()
        self.fail: dict[str, int] = {}
        self.impostor: dict[str, str] = {}
        self.huge: set[str] = set()
        self.huge_bytes = 2 << 20
        self.requests: list[tuple[str, str]] = []  # (method, path) as received
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ test side

    def add(
        self,
        name: str,
        *,
        image: str = "nvcr.io/nvidia/pytorch:24.08-py3",
        labels: dict[str, str] | None = None,
        cid: str | None = None,
    ) -> FakeContainer:
        c = FakeContainer(cid or container_id(name), name, image, dict(labels or {}))
        with self._lock:
            self.containers[c.id] = c
        return c

    def remove(self, cid: str) -> None:
        with self._lock:
            self.containers.pop(cid, None)

    def rename(self, cid: str, name: str) -> None:
        with self._lock:
            self.containers[cid].name = name

    def inspects(self, cid: str | None = None) -> int:
        """Inspect requests received (for one container ID or reference, or in all)."""
        with self._lock:
            return sum(
                1
                for _m, p in self.requests
                if "/containers/" in p and (cid is None or f"/containers/{cid}/" in p)
            )

    def pings(self) -> int:
        with self._lock:
            return sum(1 for _m, p in self.requests if p.endswith("/_ping"))

    def methods(self) -> set[str]:
        with self._lock:
            return {m for m, _p in self.requests}

    def start(self) -> DockerAPI:
        self._thread = threading.Thread(target=self._run, name="fake-dockerd", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake dockerd did not start")
        if self._error is not None:
            raise RuntimeError("fake dockerd failed") from self._error
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        fut.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None
        self._ready.clear()

    def __enter__(self) -> DockerAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ server side

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _serve(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("*", "/{tail:.*}", self._route)
        # A short shutdown: a handler held in a simulated delay must not hold up the test.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        # Bound here rather than by web.UnixSite: since Python 3.13 asyncio removes the socket
        # file of a unix server it closes, and a stopped stand-in must behave the same on every
        # Python. It leaves the file behind, as a killed dockerd does (connections are then
        # refused); a test that wants the socket gone removes it.
        if os.path.exists(self.socket_path) and stat.S_ISSOCK(os.stat(self.socket_path).st_mode):
            os.unlink(self.socket_path)  # a restart on the same path, as asyncio would do
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.socket_path)
        except OSError:
            sock.close()
            raise
        await web.SockSite(self._runner, sock).start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        # Handlers still held in a simulated delay end here, not when the loop is closed.
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def _headers(self) -> dict[str, str]:
        headers = {
            "Docker-Experimental": "false",
            "Ostype": "linux",
            "Server": f"Docker/{DAEMON_VERSION} (linux)",
        }
        if self.advertise_version:
            headers["Api-Version"] = self.max_api
        return headers

    def _error_body(self, status: int, message: str) -> web.Response:
        return web.Response(
            status=status,
            body=json.dumps({"message": message}) + "\n",
            content_type="application/json",
            headers=self._headers(),
        )

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        with self._lock:
            self.requests.append((request.method, request.path))
        response: web.StreamResponse = await handler(request)
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        m = _VERSIONED.fullmatch(path)
        if m is not None:
            version, path = m.group(1), m.group(2)
            if _api_tuple(version) > _api_tuple(self.max_api):
                return self._error_body(
                    400,
                    f"client version {version} is too new. "
                    f"Maximum supported API version is {self.max_api}",
                )
            if _api_tuple(version) < _api_tuple(self.min_api):
                return self._error_body(
                    400,
                    f"client version {version} is too old. Minimum supported API version is "
                    f"{self.min_api}, please upgrade your client to a newer version",
                )
        if path == "/_ping" and request.method in ("GET", "HEAD"):
            return web.Response(
                text="OK",  # aiohttp sends no body on HEAD
                content_type="text/plain",
                charset="utf-8",
                headers={
                    **self._headers(),
                    "Cache-Control": "no-cache, no-store, must-revalidate",
                    "Pragma": "no-cache",
                },
            )
        if path == "/version" and request.method == "GET":
            return web.json_response(
                {
                    "Version": DAEMON_VERSION,
                    "ApiVersion": self.max_api,
                    "MinAPIVersion": self.min_api,
                    "Os": "linux",
                    "Arch": "amd64",
                },
                headers=self._headers(),
            )
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "containers" and parts[3] == "json":
            if request.method != "GET":
                return self._error_body(405, "method not allowed")
            return await self._inspect(parts[2])
        return self._error_body(404, "page not found")

    def _resolve(self, ref: str) -> FakeContainer | None:
        """Docker's order: full ID, then name, then a unique ID prefix."""
        with self._lock:
            if ref in self.containers:
                return self.containers[ref]
            by_name = [c for c in self.containers.values() if c.name == ref.lstrip("/")]
            if by_name:
                return by_name[0]
            prefixed = [c for c in self.containers.values() if c.id.startswith(ref)]
            return prefixed[0] if len(prefixed) == 1 and ref else None

    async def _inspect(self, ref: str) -> web.StreamResponse:
        delay = self.delay.get(ref, 0.0)
        if delay:
            await asyncio.sleep(delay)
        if ref in self.fail:
            return self._error_body(self.fail[ref], "Internal Server Error: simulated failure")
        if ref in self.garbage:
            return web.Response(
                body=b'{"Id": "' + ref.encode() + b'", "Name": ', content_type="application/json"
            )
        c = self._resolve(self.impostor.get(ref, ref))
        if c is None:
            return self._error_body(404, f"No such container: {ref}")
        doc = inspect_document(c)
        if ref in self.huge:
            doc["Config"]["Env"] = ["PAD=" + "x" * self.huge_bytes]
        return web.Response(
            body=json.dumps(doc) + "\n", content_type="application/json", headers=self._headers()
        )
