"""A JupyterHub service that stops the servers whose pods have held a GPU idle for too long.

It asks Prometheus how long each pod's GPU containers have been idle (dcgm-enricher's
gpu_container_last_active_timestamp_seconds), asks the hub which servers run and in which pod
(the hub's own record: KubeSpawner's state names the pod and its namespace), and stops a server
only when the pod the hub names for it is idle past --idle-seconds. The user it stops is the
hub's, never the one a pod's hub.jupyter.org/username annotation claims: any pod creator writes
that (docs/threat-model.md).

Dry run unless --apply (or GPU_IDLE_CULLER_APPLY=true): it logs what it would stop.

Standard library only, so it runs in the hub's own image: jupyterhub_config.py beside it
registers it as a managed service with the scopes it needs. docs/culling.md explains it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

LOG = logging.getLogger("gpu-idle-culler")
# Seconds each GPU container of a pod has been idle, the least idle of them per pod: a pod with
# one busy GPU container is busy. The same numbers as the mixin's
# namespace_pod_container:gpu_container_idle_seconds:min record, without needing the rules.
IDLE_QUERY = "min by (namespace, pod) (time() - gpu_container_last_active_timestamp_seconds{%s})"
PAGE_SIZE = 200
MAX_PAGES = 1000  # bounds a hub that keeps sending a next page
MAX_BODY = 64 << 20  # bytes of one answer, from Prometheus or the hub
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Server:
    """A running server as the hub reports it."""

    user: str
    name: str  # "" for the user's default server
    namespace: str
    pod: str

    @property
    def api_path(self) -> str:
        """The hub API path that stops it (relative to the API URL)."""
        user = urllib.parse.quote(self.user, safe="")
        if not self.name:
            return f"/users/{user}/server"
        return f"/users/{user}/servers/{urllib.parse.quote(self.name, safe='')}"


def _flag_env(name: str, default: str) -> str:
    return os.environ.get("GPU_IDLE_CULLER_" + name.upper().replace("-", "_"), default)


def _own_namespace() -> str:
    """The namespace of the pod this runs in: a managed service gets few of the hub's
    variables (not POD_NAMESPACE), but the hub pod's service account names it."""
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip()
    except OSError:
        return ""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_idle_culler.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--prometheus-url",
        default=_flag_env("prometheus-url", "http://prometheus-operated.monitoring.svc:9090"),
        help="Prometheus (or Thanos, Mimir) base URL (default %(default)s)",
    )
    p.add_argument(
        "--selector",
        default=_flag_env("selector", 'job="dcgm-enricher"'),
        help="label matchers for the idle series: the enricher's scrape job (the job every "
        "install path here sets), so that no other source's series can stop anything; add "
        'cluster="prod" where one Prometheus holds several clusters (default %(default)s)',
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=float(_flag_env("idle-seconds", "3600")),
        help="stop a server whose pod's GPUs have all been idle this long (default %(default)s)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=float(_flag_env("interval", "300")),
        help="seconds between rounds; 0 runs one round and exits (default %(default)s)",
    )
    p.add_argument(
        "--namespace",
        default=_flag_env("namespace", "") or _own_namespace(),
        help="the namespace of servers whose state names none (KubeSpawner before 4 saved "
        "only the pod name; default: the hub pod's own, from its service account)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        default=_flag_env("apply", "false").lower() in ("1", "true", "yes"),
        help="stop the servers (default: a dry run that only logs them)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    return p.parse_args(argv)


def _read(
    request: urllib.request.Request, timeout: float, context: ssl.SSLContext | None
) -> tuple[int, bytes]:
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        body = response.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise ValueError(f"{request.full_url}: answer over {MAX_BODY} bytes")
        return int(response.status), body


def idle_pods(
    prometheus: str, selector: str, timeout: float, context: ssl.SSLContext | None = None
) -> dict[tuple[str, str], float]:
    """Seconds idle per (namespace, pod), from Prometheus's instant query API."""
    query = IDLE_QUERY % selector
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    _, body = _read(urllib.request.Request(url), timeout, context)
    answer = json.loads(body)
    if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
        raise ValueError(f"Prometheus: {answer.get('error', answer)}")
    out = {}
    for sample in answer["data"]["result"]:
        labels = sample["metric"]
        out[(labels.get("namespace", ""), labels.get("pod", ""))] = float(sample["value"][1])
    return out


class Hub:
    """The JupyterHub REST API, with the service's token."""

    def __init__(
        self, url: str, token: str, timeout: float, context: ssl.SSLContext | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = context  # for https: the CA bundle that signs the hub's certificate

    def request(self, method: str, path: str) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            headers={
                "Authorization": f"token {self.token}",
                "Accept": "application/jupyterhub-pagination+json",
            },
        )
        status, body = _read(req, self.timeout, self.context)
        return status, (json.loads(body) if body else None)

    def users(self) -> Iterator[dict[str, Any]]:
        """Every user with an active server (GET /users?state=active), page by page."""
        offset = 0
        for _ in range(MAX_PAGES):
            query = urllib.parse.urlencode(
                {"state": "active", "offset": offset, "limit": PAGE_SIZE}
            )
            _, page = self.request("GET", f"/users?{query}")
            if isinstance(page, list):  # a hub older than 2.0 answers with the whole list
                yield from page
                return
            yield from page["items"]
            following = (page.get("_pagination") or {}).get("next")
            if not following:
                return
            offset = int(following["offset"])
        raise ValueError(f"the hub sent over {MAX_PAGES} pages")


def running_servers(users: Iterator[dict[str, Any]], namespace: str) -> Iterator[Server]:
    """The servers the hub reports ready, each with the pod its spawner's state names. A server
    without a pod name in its state (another spawner, or a service token without the
    admin:server_state scope) is logged and left alone."""
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            if not server.get("ready") or server.get("pending"):
                continue
            state = server.get("state") or {}
            pod = state.get("pod_name")
            if not pod:
                # The state itself is not logged: another spawner may keep secrets there.
                LOG.warning(
                    "%s/%s: no pod_name in the server's state; left alone", user["name"], name
                )
                continue
            yield Server(user["name"], name, state.get("namespace") or namespace, pod)


def cull_round(args: argparse.Namespace, hub: Hub) -> list[Server]:
    """One round: the servers whose pod is idle past the threshold, stopped where --apply."""
    idle = idle_pods(args.prometheus_url, args.selector, args.timeout, hub.context)
    stopped = []
    # Every page first: a server stopped between two pages would shift the later pages by one.
    servers = list(running_servers(hub.users(), args.namespace))
    for server in servers:
        seconds = idle.get((server.namespace, server.pod))
        if seconds is None or seconds < args.idle_seconds:
            continue
        who = f"{server.user}/{server.name}" if server.name else server.user
        where = f"{server.namespace}/{server.pod}"
        if not args.apply:
            LOG.info("dry run: would stop %s (pod %s, GPU idle %.0f s)", who, where, seconds)
            stopped.append(server)
            continue
        try:
            status, _ = hub.request("DELETE", server.api_path)
        except urllib.error.HTTPError as exc:
            LOG.error("stopping %s (pod %s): %s", who, where, exc)
            continue
        LOG.info("stopped %s (pod %s, GPU idle %.0f s): HTTP %d", who, where, seconds, status)
        stopped.append(server)
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    url = os.environ["JUPYTERHUB_API_URL"]
    context = None  # only for https: a plain-HTTP hub and Prometheus need none
    if url.startswith("https:") or args.prometheus_url.startswith("https:"):
        context = ssl.create_default_context(cafile=os.environ.get("GPU_IDLE_CULLER_CA_FILE"))
    hub = Hub(url, os.environ["JUPYTERHUB_API_TOKEN"], args.timeout, context)
    if not args.apply:
        LOG.info("dry run: nothing is stopped (--apply or GPU_IDLE_CULLER_APPLY=true stops them)")
    while True:
        try:
            cull_round(args, hub)
        except (OSError, ValueError, KeyError) as exc:
            if args.interval <= 0:
                raise
            LOG.error("round failed: %s", exc)
        if args.interval <= 0:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
