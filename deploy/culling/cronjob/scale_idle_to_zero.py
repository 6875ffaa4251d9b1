"""Scale to zero the Deployments and StatefulSets whose every pod has held its GPUs idle too long.

For each namespace it is given, it lists the Deployments and StatefulSets (the API's own
objects, with their selectors), lists each one's pods by that selector, and asks Prometheus how
long each pod's GPU containers have been idle (dcgm-enricher's
gpu_container_last_active_timestamp_seconds). A workload is scaled to zero only when every one
of its pods is idle past --idle-seconds: a pod with no GPU series (no GPU, just started, the
enricher not scraped) or one busy GPU container keeps it up. Who owns a pod comes from the API,
never from the workload labels a pod's creator can write (docs/threat-model.md). A workload
annotated gpu.dcgm-enricher.io/cull: "false" is never scaled.

Dry run unless --apply (or SCALE_IDLE_APPLY=true): it logs what it would scale. To bring a
workload back: kubectl scale --replicas=N (the log says how many it had).

Standard library only; in a pod it reads its service account's token and CA. The CronJob and
its RBAC in this folder run it; docs/culling.md explains it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LOG = logging.getLogger("scale-idle-to-zero")
OPT_OUT = "gpu.dcgm-enricher.io/cull"
KINDS = ("deployments", "statefulsets")
# Seconds each GPU container of a pod has been idle, the least idle of them per pod: a pod with
# one busy GPU container is busy. The same numbers as the mixin's
# namespace_pod_container:gpu_container_idle_seconds:min record, without needing the rules.
IDLE_QUERY = (
    "min by (namespace, pod) ("
    'time() - gpu_container_last_active_timestamp_seconds{namespace="%s"%s}'
    ")"
)
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_BODY = 64 << 20  # bytes of one answer, from Prometheus or the API server


@dataclass(frozen=True)
class Workload:
    kind: str  # deployments | statefulsets
    namespace: str
    name: str
    replicas: int
    pods: tuple[str, ...]
    opted_out: bool


def _env(name: str, default: str) -> str:
    return os.environ.get("SCALE_IDLE_" + name.upper().replace("-", "_"), default)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scale_idle_to_zero.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--namespaces",
        default=_env("namespaces", ""),
        help="comma list of the namespaces to look after (each needs the RoleBinding)",
    )
    p.add_argument(
        "--prometheus-url",
        default=_env("prometheus-url", "http://prometheus-operated.monitoring.svc:9090"),
        help="Prometheus (or Thanos, Mimir) base URL (default %(default)s)",
    )
    p.add_argument(
        "--selector",
        default=_env("selector", 'job="dcgm-enricher"'),
        help="label matchers for the idle series: the enricher's scrape job (the job every "
        "install path here sets), so that no other source's series can stop anything; add "
        'cluster="prod" where one Prometheus holds several clusters (default %(default)s)',
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=float(_env("idle-seconds", "3600")),
        help="scale a workload whose pods' GPUs have all been idle this long (default %(default)s)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        default=_env("apply", "false").lower() in ("1", "true", "yes"),
        help="scale them (default: a dry run that only logs them)",
    )
    p.add_argument(
        "--api-server",
        default=_env("api-server", ""),
        help="the Kubernetes API's URL (default: the in-cluster one)",
    )
    p.add_argument(
        "--token-file",
        default=_env("token-file", f"{SERVICE_ACCOUNT}/token"),
        help="bearer token for the API (default: the pod's service account's)",
    )
    p.add_argument(
        "--ca-file",
        default=_env("ca-file", f"{SERVICE_ACCOUNT}/ca.crt"),
        help="CA bundle of the API's certificate (default: the service account's)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    args = p.parse_args(argv)
    args.namespaces = [n.strip() for n in args.namespaces.split(",") if n.strip()]
    if not args.namespaces:
        p.error("--namespaces names none")
    if args.selector and not args.selector.startswith(","):
        args.selector = "," + args.selector
    return args


class Http:
    """GET and PATCH with a bearer token (the API server) or without (Prometheus)."""

    def __init__(
        self, timeout: float, token: str = "", cafile: str | None = None, *, https: bool = False
    ) -> None:
        self.timeout = timeout
        self.token = token
        # Only for https (the API server in a pod): a plain-HTTP URL needs none.
        self.context = ssl.create_default_context(cafile=cafile) if https else None

    def call(self, method: str, url: str, body: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(
            request, timeout=self.timeout, context=self.context
        ) as response:
            raw = response.read(MAX_BODY + 1)
        if len(raw) > MAX_BODY:
            raise ValueError(f"{url}: answer over {MAX_BODY} bytes")
        return json.loads(raw)


def idle_pods(prom: Http, url: str, namespace: str, selector: str) -> dict[str, float]:
    """Seconds idle per pod of ``namespace``, from Prometheus's instant query API."""
    query = IDLE_QUERY % (namespace, selector)
    answer = prom.call(
        "GET", url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    )
    if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
        raise ValueError(f"Prometheus: {answer.get('error', answer)}")
    return {s["metric"].get("pod", ""): float(s["value"][1]) for s in answer["data"]["result"]}


def label_selector(selector: dict[str, Any]) -> str:
    """A workload's spec.selector as the ?labelSelector= text the API takes."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, values = expr["operator"], ",".join(expr.get("values") or [])
        if op == "In":
            terms.append(f"{expr['key']} in ({values})")
        elif op == "NotIn":
            terms.append(f"{expr['key']} notin ({values})")
        elif op == "Exists":
            terms.append(expr["key"])
        elif op == "DoesNotExist":
            terms.append(f"!{expr['key']}")
        else:
            raise ValueError(f"selector operator {op!r}")
    if not terms:
        raise ValueError("an empty selector selects every pod")
    return ",".join(terms)


def workloads(api: Http, server: str, namespace: str) -> list[Workload]:
    """The namespace's Deployments and StatefulSets with the names of their live pods."""
    base = f"{server.rstrip('/')}/apis/apps/v1/namespaces/{urllib.parse.quote(namespace)}"
    pods_url = f"{server.rstrip('/')}/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods"
    out = []
    for kind in KINDS:
        for item in api.call("GET", f"{base}/{kind}")["items"]:
            meta, spec = item["metadata"], item["spec"]
            query = urllib.parse.urlencode({"labelSelector": label_selector(spec["selector"])})
            pods = api.call("GET", f"{pods_url}?{query}")["items"]
            live = tuple(
                sorted(
                    p["metadata"]["name"]
                    for p in pods
                    if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                )
            )
            annotations = meta.get("annotations") or {}
            out.append(
                Workload(
                    kind,
                    namespace,
                    meta["name"],
                    int(spec.get("replicas", 1)),
                    live,
                    annotations.get(OPT_OUT, "").strip().lower() == "false",
                )
            )
    return out


def to_scale(found: list[Workload], idle: dict[str, float], threshold: float) -> list[Workload]:
    """The workloads to scale to zero: running, not opted out, and every pod idle past the
    threshold (a pod Prometheus has no idle series for counts as busy)."""
    return [
        w
        for w in found
        if w.replicas > 0
        and not w.opted_out
        and w.pods
        and all(idle.get(pod, -1.0) >= threshold for pod in w.pods)
    ]


def run(args: argparse.Namespace, api: Http, prom: Http) -> list[Workload]:
    """One pass over the namespaces; returns the workloads scaled (or, dry, to scale)."""
    scaled = []
    for namespace in args.namespaces:
        idle = idle_pods(prom, args.prometheus_url, namespace, args.selector)
        for w in to_scale(workloads(api, args.api_server, namespace), idle, args.idle_seconds):
            least = min(idle[pod] for pod in w.pods)
            what = f"{w.kind} {w.namespace}/{w.name}"
            if not args.apply:
                LOG.info(
                    "dry run: would scale %s from %d to 0 (GPUs idle %.0f s)",
                    what,
                    w.replicas,
                    least,
                )
                scaled.append(w)
                continue
            url = (
                f"{args.api_server.rstrip('/')}/apis/apps/v1/namespaces/"
                f"{urllib.parse.quote(w.namespace)}/{w.kind}/{urllib.parse.quote(w.name)}/scale"
            )
            try:
                api.call("PATCH", url, {"spec": {"replicas": 0}})
            except urllib.error.HTTPError as exc:
                LOG.error("scaling %s: %s", what, exc)
                continue
            LOG.info(
                "scaled %s from %d to 0 (GPUs idle %.0f s); back: kubectl scale -n %s %s/%s "
                "--replicas=%d",
                what,
                w.replicas,
                least,
                w.namespace,
                w.kind[:-1],
                w.name,
                w.replicas,
            )
            scaled.append(w)
    return scaled


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.api_server:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        args.api_server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    with open(args.token_file) as f:
        token = f.read().strip()
    cafile = args.ca_file if os.path.exists(args.ca_file) else None
    if not args.apply:
        LOG.info("dry run: nothing is scaled (--apply or SCALE_IDLE_APPLY=true scales them)")
    api = Http(args.timeout, token, cafile, https=args.api_server.startswith("https:"))
    prom = Http(args.timeout, https=args.prometheus_url.startswith("https:"))
    run(args, api, prom)
    return 0


if __name__ == "__main__":
    sys.exit(main())
