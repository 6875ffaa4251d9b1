"""The culling recipes in deploy/culling (docs/culling.md), each run as a user would run it,
and the flag that names the pod annotations they may read.

One real Prometheus (the newest release) scrapes the demo's real enricher, whose SIMULATED node
was first collected three hours ago by its own clock and then at the real time: its notebook
(jupyterhub/jupyter-alice), llama-eval-7xq2m and finetune-mistral-0 have held their GPUs idle
for three hours, every other pod is busy. Against it:

- jupyterhub/gpu_idle_culler.py, started with the command jupyterhub_config.py gives the hub,
  against a JupyterHub API stand-in: a dry run stops nothing; --apply stops exactly the servers
  the hub reports whose pod (by the hub's state, never the pod's user annotation) is idle.
- cronjob/scale_idle_to_zero.py, with the command and environment of the CronJob that
  `kubectl kustomize deploy/culling/cronjob` builds, against an API-server stand-in: a dry run
  patches nothing; the real run scales to zero exactly the Deployments and StatefulSets whose
  every pod is idle, never an opted-out one, and makes only calls its Role grants.
- keda-scale-to-zero.yaml: each trigger's query, sent as KEDA sends it, is one number: the
  busy pods per workload over the demo; the wake-up trigger's, by ``promtool test rules`` on
  an ingress's request counter (which the demo lacks).

No JupyterHub, API server with Deployments or KEDA runs here: the stand-ins answer the calls
the recipes make as the real ones do (paths, methods, pagination, tokens, content type).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.clocks import MovingClock
from devkit.http import get as devkit_get
from devkit.prometheus import EVERY_SECOND
from devkit.promtool import run as promtool_run
from enricher.cli import parse_config
from enricher.idle import LAST_ACTIVE

from .frozendemo import FrozenDemo
from .promreleases import PromRelease, Server, releases, require, serve
from .test_autoscaling import scaled_object_errors

pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
CULLING = ROOT / "deploy" / "culling"
CULLER = CULLING / "jupyterhub" / "gpu_idle_culler.py"
HUB_CONFIG = CULLING / "jupyterhub" / "jupyterhub_config.py"
CRONJOB = CULLING / "cronjob"
SCALER = CRONJOB / "scale_idle_to_zero.py"
KEDA = CULLING / "keda-scale-to-zero.yaml"
HOURS_BEHIND = 3
USERNAME = "hub.jupyter.org/username"
SERVERNAME = "hub.jupyter.org/servername"


# --------------------------------------------------------------------------- the flag


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], "", (USERNAME,), id="default"),
        pytest.param(["--kube.pod-annotations", SERVERNAME], "", (USERNAME, SERVERNAME), id="adds"),
        pytest.param([], f"{SERVERNAME}, team", (USERNAME, SERVERNAME, "team"), id="env-adds"),
        pytest.param(["--kube.pod-annotations", USERNAME], "", (USERNAME,), id="no-duplicate"),
        pytest.param([f"--kube.pod-annotations=-{USERNAME}"], "", (), id="drops-the-default"),
        pytest.param([], f"-{USERNAME},team", ("team",), id="env-drops-and-adds"),
    ],
)
def test_pod_annotations_add_to_the_default(
    argv: list[str], env: str, expected: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Naming one more annotation keeps the JupyterHub user the rules, the dashboard and the
    recipes read; only a key with a leading - drops one."""
    monkeypatch.setenv("ENRICHER_KUBE_POD_ANNOTATIONS", env)  # "" adds nothing
    _, config, _ = parse_config(argv)
    assert config.kube_pod_annotations == expected


# --------------------------------------------------------------------------- stand-ins

# Neither a JupyterHub nor an API server with Deployments runs here (devkit's API stand-in
# serves pods and ResourceSlices only): each recipe's calls go to a small stand-in that
# answers as the real one does for those calls (paths, methods, pagination, auth, content
# type) and records them.


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # with the query string
    authorization: str
    content_type: str
    body: Any


class StandIn:
    """A threaded HTTP server on 127.0.0.1 whose ``answer`` (overridden) gives (status, JSON)
    for each request; every request is kept in ``calls``."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                call = Call(
                    self.command,
                    self.path,
                    self.headers.get("Authorization", ""),
                    self.headers.get("Content-Type", ""),
                    json.loads(raw) if raw else None,
                )
                stand_in.calls.append(call)
                status, body = stand_in.answer(call)
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, call: Call) -> tuple[int, Any]:
        raise NotImplementedError

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


HUB_TOKEN = "service-token-3f9c"


def hub_server(
    name: str, *, pod: str | None, namespace: str | None = None, ready: bool = True
) -> dict[str, Any]:
    """A server model as GET /hub/api/users gives it with read:servers and
    admin:server_state: KubeSpawner's state names the pod (and, from KubeSpawner 4, its
    namespace)."""
    state: dict[str, Any] = {}
    if pod is not None:
        state["pod_name"] = pod
    if namespace is not None:
        state["namespace"] = namespace
    return {
        "name": name,
        "ready": ready,
        "pending": None if ready else "spawn",
        "stopped": False,
        "url": f"/user/x/{name}",
        "state": state,
    }


class HubStandIn(StandIn):
    """JupyterHub's REST API under /hub/api: GET /users?state=active (paginated as the hub
    does for a client that sends its pagination Accept type, at most PAGE_MAX a page),
    DELETE /users/<name>/server and /users/<name>/servers/<server>; the service token only."""

    PAGE_MAX = 2

    def __init__(self, users: dict[str, dict[str, dict[str, Any]]]) -> None:
        self.users = users  # name -> server name -> server model
        super().__init__()

    def answer(self, call: Call) -> tuple[int, Any]:
        if call.authorization != f"token {HUB_TOKEN}":
            return 403, {"status": 403, "message": "Forbidden"}
        url = urllib.parse.urlsplit(call.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")]
        if call.method == "GET" and url.path == "/hub/api/users":
            query = dict(urllib.parse.parse_qsl(url.query))
            assert query.get("state") == "active", call
            active = [
                {"kind": "user", "name": n, "admin": False, "servers": s}
                for n, s in sorted(self.users.items())
                if s
            ]
            offset = int(query.get("offset", 0))
            limit = min(int(query.get("limit", self.PAGE_MAX)), self.PAGE_MAX)
            items = active[offset : offset + limit]
            end = offset + len(items)
            following = {"offset": end, "limit": limit} if end < len(active) else None
            total = len(active)
            page = {"offset": offset, "limit": limit, "total": total, "next": following}
            return 200, {"items": items, "_pagination": page}
        if call.method == "DELETE" and parts[:4] == ["", "hub", "api", "users"]:
            user = self.users.get(parts[4], {})
            if parts[5:] == ["server"]:
                server = ""
            elif parts[5:6] == ["servers"] and len(parts) == 7:
                server = parts[6]
            else:
                return 404, None
            if server not in user:
                return 400, {"status": 400, "message": "not running"}
            del user[server]
            return 202, None
        return 404, None


API_TOKEN = "job-token-7d1e"


def deployment(
    kind: str, name: str, selector: dict[str, str], replicas: int = 1, **annotations: str
) -> dict[str, Any]:
    return {
        "kind": "Deployment" if kind == "deployments" else "StatefulSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}},
    }


def api_pod(name: str, phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "status": {"phase": phase}}


class AppsStandIn(StandIn):
    """The API server's calls the CronJob makes: GET .../apps/v1/namespaces/<ns>/<kind>
    (list), GET /api/v1/namespaces/<ns>/pods?labelSelector=k=v,..., PATCH
    .../<kind>/<name>/scale with a merge patch; the job's token only."""

    def __init__(
        self, objects: dict[tuple[str, str], list[dict[str, Any]]], pods: dict[str, list[Any]]
    ) -> None:
        self.objects = objects  # (namespace, deployments|statefulsets) -> objects
        self.pods = pods  # namespace -> pods
        super().__init__()

    def answer(self, call: Call) -> tuple[int, Any]:
        if call.authorization != f"Bearer {API_TOKEN}":
            return 401, {"kind": "Status", "code": 401}
        url = urllib.parse.urlsplit(call.path)
        parts = url.path.strip("/").split("/")
        if (
            call.method == "GET"
            and parts[:3] == ["api", "v1", "namespaces"]
            and parts[4:] == ["pods"]
        ):
            selector = dict(urllib.parse.parse_qsl(url.query))["labelSelector"]
            terms = dict(term.split("=", 1) for term in selector.split(","))
            items = [
                p
                for p in self.pods.get(parts[3], [])
                if terms.items() <= p["metadata"]["labels"].items()
            ]
            return 200, {"kind": "PodList", "items": items}
        if parts[:4] != ["apis", "apps", "v1", "namespaces"] or len(parts) < 6:
            return 404, None
        namespace, kind = parts[4], parts[5]
        found = self.objects.get((namespace, kind), [])
        if call.method == "GET" and len(parts) == 6:
            return 200, {"items": found}
        if call.method == "PATCH" and len(parts) == 8 and parts[7] == "scale":
            if call.content_type != "application/merge-patch+json":
                return 415, None
            obj = next((o for o in found if o["metadata"]["name"] == parts[6]), None)
            if obj is None:
                return 404, None
            obj["spec"]["replicas"] = call.body["spec"]["replicas"]
            return 200, {"kind": "Scale", "spec": {"replicas": obj["spec"]["replicas"]}}
        return 404, None


# --------------------------------------------------------------------------- a real Prometheus


def _last_active(url: str) -> list[float]:
    text = devkit_get(url).decode()
    return [
        s.value
        for f in text_string_to_metric_families(text)
        if f.name == LAST_ACTIVE
        for s in f.samples
    ]


@dataclass
class Culling:
    release: PromRelease
    server: Server
    tmp: Path

    def keda(self, query: str) -> list[dict[str, Any]]:
        """The query as KEDA's prometheus scaler sends it: query and an RFC 3339 time."""
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        result: list[dict[str, Any]] = self.server.api("query", query=query, time=now)["result"]
        return result


@pytest.fixture(scope="module")
def culling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Culling]:
    """The demo, first collected three hours ago by its own clock, then at the real time: its
    notebook (jupyter-alice), llama-eval-7xq2m and finetune-mistral-0 idle since, the rest
    busy; scraped by one real Prometheus (the newest release: the recipes' queries are plain
    PromQL that tests/test_idle.py already runs on both)."""
    release = require(releases()[-1])
    tmp = tmp_path_factory.mktemp("culling")
    clock = MovingClock(HOURS_BEHIND * 3600.0)
    demo = FrozenDemo(tmp / "demo", clock=clock)
    url = f"http://127.0.0.1:{demo.port}/metrics"
    config = {"global": EVERY_SECOND, "scrape_configs": [demo.scrape_job()]}
    try:
        # Prometheus first: its first scrape waits for service discovery's first update
        # (5 s), time the demo's clock spends catching up meanwhile.
        with serve(release, config, tmp / "prometheus") as server:
            assert _last_active(url)  # the first collection, three hours back
            clock.catch_up()
            deadline = time.monotonic() + 60
            while max(_last_active(url)) < time.time() - 600:
                assert time.monotonic() < deadline, "no collection at the real time"
                time.sleep(0.2)
            # A scrape after the catch-up: the busy containers are active now.
            while not server.query(f"{LAST_ACTIVE} > time() - 600"):
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.2)
            yield Culling(release, server, tmp)
    finally:
        demo.close()


def run_script(script: Path, args: list[str], env: dict[str, str]) -> str:
    """The recipe's script in a fresh Python, as its pod runs it; its log (stderr). Without
    site-packages (-S) and isolated (-I): the scripts need the standard library alone."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), **env},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def load_module(path: Path) -> ModuleType:
    """A recipe's script as a module (its dataclasses need it in sys.modules)."""
    name = f"deploy_culling_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- JupyterHub


class _Section:
    """A traitlets config section as jupyterhub_config.py sees it: a list trait that was
    never set is a LazyConfigValue, which takes append (here, an empty list)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "values":
            raise AttributeError(name)
        return self.values.setdefault(name, [])


class _Config:
    def __init__(self) -> None:
        self.sections: dict[str, _Section] = {}

    def __getattr__(self, name: str) -> _Section:
        if name.startswith("_") or name == "sections":
            raise AttributeError(name)
        return self.sections.setdefault(name, _Section())


def hub_config(existing_service: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """jupyterhub_config.py run as the hub runs it, on a config that has a service already:
    the culler's service entry and role, after checking the existing one survived."""
    config = _Config()
    config.JupyterHub.services.append(existing_service)
    runpy.run_path(str(HUB_CONFIG), init_globals={"get_config": lambda: config})
    services = config.JupyterHub.services
    assert services[0] == existing_service  # appended, not replaced
    (service,) = services[1:]
    (role,) = config.JupyterHub.load_roles
    return service, role


def test_jupyterhub_config_registers_the_service_with_its_role() -> None:
    """The service is managed (the hub starts it), starts as a dry run, and has exactly the
    scopes its calls need; its command's flags are the script's."""
    service, role = hub_config({"name": "idle-culler", "command": ["python3", "-m", "x"]})
    assert role["services"] == [service["name"]] == ["gpu-idle-culler"]
    assert sorted(role["scopes"]) == [
        "admin:server_state",  # the server's state: KubeSpawner's pod and namespace
        "delete:servers",  # DELETE .../server and .../servers/<name>
        "list:users",  # GET /users
        "read:servers",  # the users' servers
    ]
    command = service["command"]
    assert Path(command[1]).name == CULLER.name
    assert service["environment"] == {"GPU_IDLE_CULLER_APPLY": "false"}
    args = load_module(CULLER).parse_args(command[2:])
    assert (args.idle_seconds, args.apply) == (3600, False)


def culler_args(culling: Culling) -> list[str]:
    """The command jupyterhub_config.py gives the hub, on this machine: the script from the
    checkout, this Prometheus, one round."""
    service, _ = hub_config({"name": "other"})
    args = [a for a in service["command"][2:] if not a.startswith("--prometheus-url=")]
    return [*args, f"--prometheus-url={culling.server.url}", "--interval=0"]


def hub_env(hub: HubStandIn, apply: bool) -> dict[str, str]:
    """What the hub gives a managed service, and the service entry's environment."""
    return {
        "JUPYTERHUB_API_URL": f"{hub.url}/hub/api",
        "JUPYTERHUB_API_TOKEN": HUB_TOKEN,
        # The hub's namespace, which the service finds in its service account's files in a
        # pod: for the servers whose state names none.
        "GPU_IDLE_CULLER_NAMESPACE": "ml-team",
        "GPU_IDLE_CULLER_APPLY": "true" if apply else "false",
    }


def deletes(hub: HubStandIn) -> list[str]:
    return [c.path for c in hub.calls if c.method == "DELETE"]


def test_gpu_idle_culler_stops_the_idle_servers_the_hub_reports(culling: Culling) -> None:
    """Over the demo, with a hub that reports seven users (three pages): a dry run stops
    nothing; --apply stops alice's default server and dave's named server, whose pods the hub
    says are jupyterhub/jupyter-alice and (by the hub's namespace) ml-team/llama-eval-7xq2m,
    both idle for hours. Never carol's (a busy pod), erin's (still spawning), frank's (the
    same pod name in another namespace), grace's (no pod in its state) or bob's (stopped);
    and never under the user name jupyter-alice's annotation claims (alice@example.com)."""
    users = {
        "alice": {"": hub_server("", pod="jupyter-alice", namespace="jupyterhub")},
        "bob": {},
        "carol": {"": hub_server("", pod="train-llama-4kq9z", namespace="ml-team")},
        "dave": {"eval": hub_server("eval", pod="llama-eval-7xq2m")},
        "erin": {"": hub_server("", pod="finetune-mistral-0", namespace="ml-team", ready=False)},
        "frank": {"": hub_server("", pod="jupyter-alice", namespace="elsewhere")},
        "grace": {"": hub_server("", pod=None)},
    }
    claimed = culling.server.query('gpu_pod_info{pod="jupyter-alice"}')
    assert claimed[0]["metric"]["annotation_hub_jupyter_org_username"] == "alice@example.com"
    hub = HubStandIn(users)
    try:
        log = run_script(CULLER, culler_args(culling), hub_env(hub, apply=False))
        assert deletes(hub) == []
        assert "would stop alice (pod jupyterhub/jupyter-alice" in log, log
        assert "would stop dave/eval (pod ml-team/llama-eval-7xq2m" in log, log
        assert {c.method for c in hub.calls} == {"GET"}
        assert len(hub.calls) == 3  # six active users, two a page
        hub.calls.clear()
        run_script(CULLER, culler_args(culling), hub_env(hub, apply=True))
        assert sorted(deletes(hub)) == [
            "/hub/api/users/alice/server",
            "/hub/api/users/dave/servers/eval",
        ]
        assert not any("example.com" in c.path for c in hub.calls)
        assert set(users["carol"]) == set(users["erin"]) == set(users["frank"]) == {""}
        assert users["alice"] == users["dave"] == {}
    finally:
        hub.close()


def test_a_pod_that_claims_a_hub_user_is_not_that_users_server(culling: Culling) -> None:
    """jupyter-alice is idle and its annotation says alice@example.com, but the hub says
    alice@example.com's server runs in another pod (which holds no GPU): nothing is
    stopped."""
    users = {
        "alice@example.com": {
            "": hub_server("", pod="jupyter-alice-40example-2ecom", namespace="jupyterhub")
        },
        "carol": {"": hub_server("", pod="train-llama-4kq9z", namespace="ml-team")},
    }
    hub = HubStandIn(users)
    try:
        log = run_script(CULLER, culler_args(culling), hub_env(hub, apply=True))
        assert deletes(hub) == [], log
        assert [c.method for c in hub.calls] == ["GET"]
    finally:
        hub.close()


# --------------------------------------------------------------------------- the CronJob


def test_cronjob_builds_with_its_script_rbac_and_a_dry_run(kubectl: str) -> None:
    """`kubectl kustomize deploy/culling/cronjob`: valid objects (Kubernetes 1.32, strictly),
    the script as a ConfigMap mounted where the command runs it, a dry run, least privilege,
    and no API token where it is not needed."""
    import kubernetes_validate

    docs = kustomize_cronjob(kubectl)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["ConfigMap", "CronJob", "Role", "RoleBinding", "ServiceAccount"]
    (namespace,) = {d["metadata"]["namespace"] for d in docs}
    pod = by_kind["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] == by_kind["ConfigMap"]["metadata"]["name"]
    assert by_kind["ConfigMap"]["data"] == {SCALER.name: SCALER.read_text()}
    assert container["command"][-1] == f"{mount['mountPath']}/{SCALER.name}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SCALE_IDLE_APPLY"] == "false"
    account = by_kind["ServiceAccount"]["metadata"]["name"]
    assert pod["serviceAccountName"] == account
    assert by_kind["ServiceAccount"]["automountServiceAccountToken"] is False
    assert by_kind["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]
    assert by_kind["RoleBinding"]["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def kustomize_cronjob(kubectl: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [kubectl, "kustomize", str(CRONJOB)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def needed(call: Call) -> tuple[str, str, str]:
    """The (API group, resource, verb) RBAC checks for one call the job made."""
    parts = urllib.parse.urlsplit(call.path).path.strip("/").split("/")
    if parts[0] == "api":
        return ("", parts[4], "list")
    resource = parts[5] + ("/" + parts[7] if len(parts) == 8 else "")
    return ("apps", resource, {"GET": "list", "PATCH": "patch"}[call.method])


def test_cronjob_scales_to_zero_only_workloads_whose_every_pod_is_idle(
    culling: Culling, kubectl: str, tmp_path: Path
) -> None:
    """The CronJob's command and environment, over the demo and an API stand-in: a dry run
    patches nothing; the real run scales ml-team's Deployment llama-eval and StatefulSet
    finetune-mistral (every pod idle for hours, a finished pod aside) and nothing else: not
    train-llama (busy), team-llm (one of its pods busy), web (no GPU series), parked (at
    zero already), jupyterhub's notebook (opted out), nor research (not its namespace). Every
    call is one its Role grants, and it uses every grant."""
    objects = {
        ("ml-team", "deployments"): [
            deployment("deployments", "llama-eval", {"app": "llama-eval"}),
            deployment("deployments", "train-llama", {"app": "train-llama"}),
            deployment("deployments", "team-llm", {"team": "llm"}, replicas=4),
            deployment("deployments", "web", {"app": "web"}, replicas=2),
            deployment("deployments", "parked", {"app": "parked"}, replicas=0),
        ],
        ("ml-team", "statefulsets"): [
            deployment("statefulsets", "finetune-mistral", {"app": "finetune-mistral"}),
        ],
        ("jupyterhub", "deployments"): [
            deployment(
                "deployments",
                "notebook",
                {"app": "notebook"},
                **{"gpu.dcgm-enricher.io/cull": "false"},
            ),
        ],
        ("research", "statefulsets"): [
            deployment("statefulsets", "eval-harness", {"app": "eval-harness"}),
        ],
    }
    pods = {
        "ml-team": [
            api_pod("llama-eval-7xq2m", app="llama-eval", team="llm"),
            api_pod("llama-eval-old", "Succeeded", app="llama-eval"),
            api_pod("train-llama-4kq9z", app="train-llama", team="llm"),
            api_pod("finetune-mistral-0", app="finetune-mistral", team="llm"),
            api_pod("web-5f6d7-abcde", app="web"),
            api_pod("web-5f6d7-fghij", app="web"),
        ],
        "jupyterhub": [api_pod("jupyter-alice", app="notebook")],
        "research": [api_pod("eval-harness-0", app="eval-harness")],
    }
    docs = kustomize_cronjob(kubectl)
    (cronjob,) = [d for d in docs if d["kind"] == "CronJob"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "python3"
    token = tmp_path / "token"
    token.write_text(API_TOKEN + "\n")
    api = AppsStandIn(objects, pods)
    env = {e["name"]: e.get("value") or "ml-team" for e in container["env"]}  # fieldRef: its own
    env |= {
        "SCALE_IDLE_PROMETHEUS_URL": culling.server.url,
        "SCALE_IDLE_API_SERVER": api.url,
        "SCALE_IDLE_TOKEN_FILE": str(token),
    }
    try:
        log = run_script(SCALER, [], env)
        assert [c for c in api.calls if c.method != "GET"] == []
        assert "would scale deployments ml-team/llama-eval from 1 to 0" in log, log
        assert "would scale statefulsets ml-team/finetune-mistral from 1 to 0" in log, log
        api.calls.clear()
        env |= {"SCALE_IDLE_APPLY": "true", "SCALE_IDLE_NAMESPACES": "ml-team,jupyterhub"}
        run_script(SCALER, [], env)
        patches = [c for c in api.calls if c.method == "PATCH"]
        assert [(c.path, c.body) for c in patches] == [
            (
                "/apis/apps/v1/namespaces/ml-team/deployments/llama-eval/scale",
                {"spec": {"replicas": 0}},
            ),
            (
                "/apis/apps/v1/namespaces/ml-team/statefulsets/finetune-mistral/scale",
                {"spec": {"replicas": 0}},
            ),
        ]
        assert {needed(c) for c in api.calls} == granted(role)
        assert not any("/research/" in c.path for c in api.calls)
        replicas = {
            (ns, o["metadata"]["name"]): o["spec"]["replicas"]
            for (ns, _), found in objects.items()
            for o in found
        }
        assert replicas == {
            ("ml-team", "llama-eval"): 0,
            ("ml-team", "train-llama"): 1,
            ("ml-team", "team-llm"): 4,
            ("ml-team", "web"): 2,
            ("ml-team", "parked"): 0,
            ("ml-team", "finetune-mistral"): 0,
            ("jupyterhub", "notebook"): 1,
            ("research", "eval-harness"): 1,
        }
    finally:
        api.close()


# --------------------------------------------------------------------------- KEDA


def test_scale_to_zero_matches_kedas_crd() -> None:
    doc = yaml.safe_load(KEDA.read_text())
    assert scaled_object_errors(doc) == []
    assert doc["spec"]["minReplicaCount"] == 0
    triggers = {t["name"]: t for t in doc["spec"]["triggers"]}
    assert sorted(triggers) == ["gpu-busy", "requests"]
    for trigger in triggers.values():
        assert trigger["type"] == "prometheus"
        float(trigger["metadata"]["threshold"])  # KEDA parses both as floats
        float(trigger["metadata"]["activationThreshold"])


def keda_queries() -> dict[str, str]:
    doc = yaml.safe_load(KEDA.read_text())
    return {t["name"]: t["metadata"]["query"] for t in doc["spec"]["triggers"]}


def for_workload(query: str, namespace: str, kind: str, name: str) -> str:
    """The shipped query (inference's Deployment vllm) for another workload."""
    return (
        query.replace('namespace="inference"', f'namespace="{namespace}"')
        .replace('workload_kind="Deployment"', f'workload_kind="{kind}"')
        .replace('workload_name="vllm"', f'workload_name="{name}"')
    )


@pytest.mark.parametrize(
    ("namespace", "kind", "name", "busy"),
    [
        pytest.param("inference", "Deployment", "vllm", 1, id="vllm-busy"),
        pytest.param("search", "Deployment", "embedder", 2, id="embedder-two-busy"),
        pytest.param("research", "StatefulSet", "bert-finetune", 1, id="mig-busy"),
        pytest.param("ml-team", "Job", "llama-eval", 0, id="idle-for-hours"),
        pytest.param("jupyterhub", "Pod", "jupyter-alice", 0, id="idle-notebook"),
        pytest.param("inference", "Deployment", "absent", 0, id="at-zero"),
    ],
)
def test_scale_to_zero_counts_the_pods_busy_in_the_last_hour(
    culling: Culling, namespace: str, kind: str, name: str, busy: int
) -> None:
    """The gpu-busy trigger, sent as KEDA sends it, is one number: the workload's pods that
    used a GPU in the last hour (a MIG pod by its instance's activity); 0, which lets KEDA
    scale to zero, once all have idled an hour or none is left. The requests trigger is one
    number too (0 here: the demo has no ingress)."""
    queries = keda_queries()
    (sample,) = culling.keda(for_workload(queries["gpu-busy"], namespace, kind, name))
    assert float(sample["value"][1]) == busy
    (requests,) = culling.keda(queries["requests"])
    assert float(requests["value"][1]) == 0


def test_requests_wake_a_deployment_at_zero(culling: Culling, tmp_path: Path) -> None:
    """The requests trigger over an ingress's request counter, by ``promtool test rules``:
    0 before any request (KEDA keeps it at zero), above 0 once requests for vllm arrive, even
    while every one of them gets 503 (nothing serves them yet), and blind to other
    Services'."""
    query = keda_queries()["requests"]
    counter = "nginx_ingress_controller_requests"
    labels = 'exported_namespace="inference",ingress="vllm",method="POST",path="/"'
    unit = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # vllm: no request for 10 minutes, then 60 a minute, all 503 at first
                    {
                        "series": f'{counter}{{{labels},exported_service="vllm",status="503"}}',
                        "values": "0x10 60+60x5",
                    },
                    {
                        "series": f'{counter}{{{labels},exported_service="other",status="200"}}',
                        "values": "0+600x20",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "8m",
                        "exp_samples": [{"labels": "{}", "value": 0}],
                    },
                    {
                        "expr": query,
                        "eval_time": "14m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "wake.tests.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = promtool_run(culling.release.promtool, "test", "rules", "wake.tests.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_z2jh_values_give_the_same_service_and_role() -> None:
    """z2jh-values.yaml is jupyterhub_config.py for the Zero to JupyterHub chart, which
    appends each hub.services and hub.loadRoles entry, named by its key, to the same lists:
    the same service (its script where hub.extraFiles mounts it) and the same role."""
    service, role = hub_config({"name": "other"})
    hub = yaml.safe_load((CULLING / "jupyterhub" / "z2jh-values.yaml").read_text())["hub"]
    ((name, values_service),) = hub["services"].items()
    assert {"name": name, **values_service} | {"command": service["command"]} == service
    ((role_name, values_role),) = hub["loadRoles"].items()
    assert {"name": role_name, **values_role} == role
    assert hub["extraFiles"][name]["mountPath"] == service["command"][1]


def test_the_docs_show_the_shipped_query() -> None:
    """docs/culling.md's KEDA block (the last PromQL block, which tests/test_idle.py runs) is
    the gpu-busy trigger's query as shipped."""
    blocks = re.findall(r"```promql\n(.+?)\n```", (ROOT / "docs" / "culling.md").read_text(), re.S)
    assert " ".join(blocks[-1].split()) == " ".join(keda_queries()["gpu-busy"].split())
