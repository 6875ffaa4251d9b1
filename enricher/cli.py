"""Command line: flags (each with an ENRICHER_* environment variable) into one frozen Config,
then the chosen command. Nothing here does the work itself."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .bridge import OFF, naming_of_setting
from .config import Config
from .fieldtable import table
from .podparse import NAMESPACE_RE, parse_mps_daemon_pods, parse_selector
from .textformat import LABEL_NAME_RE

COMMANDS = ("serve", "demo", "resolve", "ps")
_D = Config()


def env_name(flag: str) -> str:
    """``--upstream.url`` -> ``ENRICHER_UPSTREAM_URL``."""
    return "ENRICHER_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def _env(flag: str, default: Any) -> Any:
    return os.environ.get(env_name(flag), default)


def _env_bool(flag: str, default: bool | None) -> bool | None:
    raw = os.environ.get(env_name(flag))
    if raw is None:
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def pod_annotation_keys(text: str) -> tuple[str, ...]:
    """The annotation keys ``--kube.pod-annotations`` asks for: the default keys, plus each
    key it names, less each it names with a leading ``-`` (annotation keys never start with
    one), in order. Naming one more key never drops the JupyterHub user annotation that the
    rules, the dashboard and the culling recipes read."""
    keys = list(_D.kube_pod_annotations)
    for key in _csv(text):
        if key.startswith("-"):
            keys = [k for k in keys if k != key[1:].strip()]
        elif key not in keys:
            keys.append(key)
    return tuple(keys)


# The demo answers on loopback alone unless told otherwise: it is for the machine it runs on.
DEMO_LISTEN_ADDRESS = "127.0.0.1" + _D.listen_address


def _add_common(
    p: argparse.ArgumentParser, *, server: bool, listen_address: str = _D.listen_address
) -> None:
    """Flags shared by the commands; ``server`` adds those only a server needs."""
    g = p.add_argument_group("flags (each also read from ENRICHER_<FLAG>)")
    if server:
        g.add_argument(
            "--web.listen-address",
            metavar="ADDR",
            dest="listen_address",
            default=_env("--web.listen-address", listen_address),
            help="address to serve /metrics, /healthz and / on (default %(default)s"
            + (
                f"; demo's: {DEMO_LISTEN_ADDRESS}, this machine alone)"
                if listen_address == _D.listen_address
                else ": this machine alone)"
            ),
        )
        g.add_argument(
            "--upstream.url",
            metavar="URL",
            dest="upstream_url",
            default=_env("--upstream.url", _D.upstream_url),
            help="dcgm-exporter's metrics URL (default %(default)s)",
        )
        g.add_argument(
            "--upstream.timeout",
            metavar="SECONDS",
            dest="upstream_timeout",
            type=float,
            default=_env("--upstream.timeout", _D.upstream_timeout),
            help="seconds for the whole upstream request (default %(default)s)",
        )
        g.add_argument(
            "--upstream.max-bytes",
            metavar="BYTES",
            dest="upstream_max_bytes",
            type=int,
            default=_env("--upstream.max-bytes", _D.upstream_max_bytes),
            help="largest upstream body accepted, after decompression (default %(default)s)",
        )
        g.add_argument(
            "--upstream.pod-labels",
            metavar="NAMES",
            dest="upstream_pod_labels",
            default=_env("--upstream.pod-labels", ",".join(_D.upstream_pod_labels)),
            help="comma-separated label names that dcgm-exporter copies from pods "
            "(--kubernetes-enable-pod-labels), as they appear on its series: removed from a "
            "series moved to another pod even when the pod watch does not know the old pod "
            "(default: only the labels the watch knows)",
        )
        g.add_argument(
            "--upstream.discover-pod",
            dest="upstream_discover_pod",
            action=argparse.BooleanOptionalAction,
            default=_env_bool("--upstream.discover-pod", _D.upstream_discover_pod),
            help="find the dcgm-exporter pod on this node through the pod watch and "
            "scrape its IP, with the port and path of --upstream.url "
            "(GPU Operator mode)",
        )
        g.add_argument(
            "--upstream.pod-selector",
            metavar="SELECTOR",
            dest="upstream_pod_selector",
            default=_env("--upstream.pod-selector", _D.upstream_pod_selector),
            help="label selector (k=v,...) of the dcgm-exporter pod for "
            "--upstream.discover-pod (default %(default)s)",
        )
        g.add_argument(
            "--upstream.pod-namespace",
            metavar="NAMESPACE",
            dest="upstream_pod_namespace",
            default=_env("--upstream.pod-namespace", _D.upstream_pod_namespace),
            help="namespace the discovered dcgm-exporter pod must be in, so that no other "
            "pod with the same labels can become the upstream (default %(default)s)",
        )
        g.add_argument(
            "--collect.interval",
            metavar="SECONDS",
            dest="collect_interval",
            type=float,
            default=_env("--collect.interval", _D.collect_interval),
            help="read NVML, procfs and the kubelet in the background every SECONDS (at most "
            "dcgm-exporter's collect interval); default 0: right after each upstream collection "
            "when following it, else on every scrape",
        )
        g.add_argument(
            "--upstream.follow-step",
            metavar="SECONDS",
            dest="upstream_follow_step",
            type=float,
            default=_env("--upstream.follow-step", _D.upstream_follow_step),
            help="fetch dcgm-exporter right after each of its collections (from just before "
            "the next is due, every SECONDS until it shows) and serve scrapes from that "
            "(default %(default)s; 0: fetch on every scrape)",
        )
        g.add_argument(
            "--web.config.file",
            metavar="FILE",
            dest="web_config_file",
            default=_env("--web.config.file", _D.web_config_file),
            help="exporter-toolkit web config (YAML): TLS and basic auth for every path but "
            "/healthz (default: none, plain HTTP)",
        )
        g.add_argument(
            "--kubelet.pod-resources-socket",
            metavar="PATH",
            dest="kubelet_pod_resources_socket",
            default=_env("--kubelet.pod-resources-socket", None),
            help="the kubelet's PodResources socket, for which container was allocated each "
            "GPU; giving one switches the source on, and a path that does not exist reports it "
            f"down (default {_D.kubelet_pod_resources_socket})",
        )
        g.add_argument(
            "--kubelet.enabled",
            dest="kubelet_enabled",
            action=argparse.BooleanOptionalAction,
            default=_env_bool("--kubelet.enabled", None),
            help="ask the kubelet's PodResources API which container was allocated each GPU "
            "(default: on with Kubernetes, or with --kubelet.pod-resources-socket)",
        )
        g.add_argument(
            "--kubelet.timeout",
            metavar="SECONDS",
            dest="kubelet_timeout",
            type=float,
            default=_env("--kubelet.timeout", _D.kubelet_timeout),
            help="seconds for one PodResources List call (default %(default)s)",
        )
        g.add_argument(
            "--kubelet.gpu-resources",
            metavar="NAMES",
            dest="kubelet_gpu_resources",
            default=_env("--kubelet.gpu-resources", ",".join(_D.kubelet_gpu_resources)),
            help="more device plugin resource names whose devices are GPUs, besides "
            "nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* (comma list)",
        )
        g.add_argument(
            "--kubelet.dra-drivers",
            metavar="NAMES",
            dest="kubelet_dra_drivers",
            default=_env("--kubelet.dra-drivers", ",".join(_D.kubelet_dra_drivers)),
            help="more DRA driver names whose devices are GPUs (ResourceSlices with a uuid "
            "attribute), besides gpu.nvidia.com (comma list)",
        )
        g.add_argument(
            "--kube.resource-slices",
            dest="kube_resource_slices",
            action=argparse.BooleanOptionalAction,
            default=_env_bool("--kube.resource-slices", _D.kube_resource_slices),
            help="list this node's ResourceSlices to find the GPU of each device the kubelet "
            "reports allocated through DRA (needs list on resource.k8s.io resourceslices; "
            "off: DRA devices are counted as unmapped)",
        )
        g.add_argument(
            "--collector.process",
            dest="collector_process",
            action=argparse.BooleanOptionalAction,
            default=_env_bool("--collector.process", _D.collector_process),
            help="also export gpu_process_memory_used_bytes per PID (off: PIDs churn)",
        )
        g.add_argument(
            "--idle.threshold",
            metavar="RATIO",
            dest="idle_threshold",
            type=float,
            default=_env("--idle.threshold", _D.idle_threshold),
            help="SM utilization (0 to 1) above which a container counts as active on a GPU, "
            "for gpu_container_last_active_timestamp_seconds (default %(default)s)",
        )
        g.add_argument(
            "--bridge.naming",
            metavar="NAMING",
            dest="bridge_naming",
            default=_env("--bridge.naming", OFF),
            help="serve dcgm-exporter's fields under one naming whatever its release: "
            f"{', '.join(table().namings)} (a release such as 4.8.4 names its own), each "
            "renamed family with its values in that naming's unit, HELP and TYPE, and the "
            "driver-version label; for tools that still read 4.8's names behind a 4.9+ "
            "exporter (docs/upgrading.md). Default %(default)s: every name as it came",
        )
        g.add_argument(
            "--scrape.timeout",
            metavar="SECONDS",
            dest="scrape_timeout",
            type=float,
            default=_env("--scrape.timeout", _D.scrape_timeout),
            help="seconds to wait for NVML and procfs on one scrape (default %(default)s)",
        )
    g.add_argument(
        "--path.procfs",
        metavar="DIR",
        dest="procfs",
        default=_env("--path.procfs", _D.procfs),
        help="procfs mount of the host PID namespace (default %(default)s)",
    )
    g.add_argument(
        "--nvml.library",
        metavar="FILE",
        dest="nvml_library",
        default=_env("--nvml.library", _D.nvml_library),
        help="path of libnvidia-ml.so.1 to load (default: the system's)",
    )
    g.add_argument(
        "--nvml.enabled",
        dest="nvml_enabled",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("--nvml.enabled", _D.nvml_enabled),
        help="query NVML for GPU processes (default on)",
    )
    g.add_argument(
        "--kube.enabled",
        dest="kube_enabled",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("--kube.enabled", None),
        help="watch this node's pods (default: on when a node name is known)",
    )
    g.add_argument(
        "--kube.node-name",
        metavar="NAME",
        dest="kube_node_name",
        default=_env("--kube.node-name", os.environ.get("NODE_NAME", "")),
        help="this node's name (default: $NODE_NAME)",
    )
    g.add_argument(
        "--kube.kubeconfig",
        metavar="FILE",
        dest="kube_kubeconfig",
        default=_env("--kube.kubeconfig", None),
        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)",
    )
    g.add_argument(
        "--kube.pod-labels",
        metavar="KEYS",
        dest="kube_pod_labels",
        default=_env("--kube.pod-labels", ",".join(_D.kube_pod_labels)),
        help="pod labels to copy onto gpu_pod_info as label_<name> (comma list)",
    )
    g.add_argument(
        "--kube.pod-annotations",
        metavar="KEYS",
        dest="kube_pod_annotations",
        default=_env("--kube.pod-annotations", ""),
        help="pod annotations to copy onto gpu_pod_info as annotation_<name>, besides "
        f"{','.join(_D.kube_pod_annotations)} (comma list; a key with a leading - drops it "
        f"from the list: --kube.pod-annotations=-{_D.kube_pod_annotations[0]})",
    )
    g.add_argument(
        "--mps.daemon-pod-selector",
        metavar="SELECTORS",
        dest="mps_daemon_pod_selector",
        default=_env("--mps.daemon-pod-selector", _D.mps_daemon_pod_selector),
        help="label selectors (k=v,..., alternatives separated by ';') of the pods that run "
        "the MPS control daemon: only in those (and on the host) is a process named "
        "nvidia-cuda-mps-* the daemon, elsewhere it is its pod's (default %(default)s)",
    )
    g.add_argument(
        "--mps.daemon-pod-namespace",
        metavar="NAMESPACES",
        dest="mps_daemon_pod_namespace",
        default=_env("--mps.daemon-pod-namespace", ",".join(_D.mps_daemon_pod_namespace)),
        help="namespaces (comma list) the MPS daemon pods must be in: namespaces where "
        "tenants cannot create pods (default %(default)s)",
    )
    g.add_argument(
        "--docker.host",
        metavar="URL",
        dest="docker_host",
        default=_env("--docker.host", _D.docker_host),
        help="Docker Engine API socket, to name the containers of GPU processes when "
        "Kubernetes is off; empty: cgroup-only mode, containers named by short ID "
        "(default %(default)s)",
    )
    g.add_argument(
        "--docker.timeout",
        metavar="SECONDS",
        dest="docker_timeout",
        type=float,
        default=_env("--docker.timeout", _D.docker_timeout),
        help="seconds for one Docker API request (default %(default)s)",
    )
    g.add_argument(
        "--log.level",
        metavar="LEVEL",
        dest="log_level",
        default=_env("--log.level", _D.log_level),
        choices=("debug", "info", "warning", "error"),
        help="log level (default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dcgm-enricher",
        description="Sidecar for dcgm-exporter: attributes GPU use to the real pod, namespace "
        "and container. Every flag can also be set by an environment variable "
        "ENRICHER_<FLAG> (e.g. --upstream.url as ENRICHER_UPSTREAM_URL).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("serve", help="run the sidecar (the default command)")
    _add_common(p, server=True)
    p = sub.add_parser("demo", help="run the real pipeline on a simulated node (no GPU needed)")
    _add_common(p, server=True, listen_address=DEMO_LISTEN_ADDRESS)
    from .simnode.dialects import ALIASES, DIALECTS, NEWEST

    p.add_argument(
        "--demo.exporter-version",
        dest="demo_exporter_version",
        metavar="VERSION",
        choices=list(DIALECTS) + sorted(ALIASES),
        default=_env("--demo.exporter-version", NEWEST),
        help="the dcgm-exporter release whose /metrics the simulated exporter writes: "
        f"{', '.join(DIALECTS)} (or a release tag such as 4.6.1-4.8.4, or 3.3, 4.2, 4.9, "
        "4.10); default: %(default)s",
    )
    p.add_argument(
        "--demo.kubernetes-virtual-gpus",
        dest="demo_virtual_gpus",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("--demo.kubernetes-virtual-gpus", False),
        help="the simulated exporter runs with dcgm-exporter's --kubernetes-virtual-gpus "
        "(4.2 on): a shared device's series once per pod",
    )
    p = sub.add_parser("resolve", help="print what the cgroup of each PID says, as JSON lines")
    _add_common(p, server=False)
    _add_demo_flag(p)
    p.add_argument("pids", metavar="PID", nargs="+", type=int)
    p = sub.add_parser("ps", help="table of the GPU processes on this node and their pods")
    _add_common(p, server=False)
    _add_demo_flag(p)
    return parser


def _add_demo_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--demo",
        dest="demo",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("--demo", False),
        help="look at a running `dcgm-enricher demo` instead of this node: its SIMULATED "
        "GPUs and pods, and its /proc tree (give the --path.procfs that the demo prints)",
    )


def parse_config(argv: Sequence[str]) -> tuple[str, Config, argparse.Namespace]:
    """Parse ``argv`` (without the program name); ``serve`` is the default command."""
    args_list = list(argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first not in COMMANDS and not any(a in ("-h", "--help", "--version") for a in args_list[:1]):
        args_list.insert(0, "serve")
    parser = build_parser()
    ns = parser.parse_args(args_list)
    values = {k: v for k, v in vars(ns).items() if k in Config.__dataclass_fields__}
    values["kube_pod_labels"] = _csv(values.get("kube_pod_labels") or "")
    values["upstream_pod_labels"] = _csv(values.get("upstream_pod_labels") or "")
    for name in values["upstream_pod_labels"]:
        if LABEL_NAME_RE.match(name) is None:
            parser.error(f"--upstream.pod-labels: {name!r} is not a label name")
    values["kube_pod_annotations"] = pod_annotation_keys(values.get("kube_pod_annotations") or "")
    values["mps_daemon_pod_namespace"] = _csv(values.get("mps_daemon_pod_namespace") or "")
    if "kubelet_pod_resources_socket" in values:
        socket_path = values.pop("kubelet_pod_resources_socket")
        if socket_path is not None:
            # Naming a socket asks for the source; naming none (empty) is the old way to
            # switch it off, kept.
            values["kubelet_pod_resources_socket"] = socket_path
            if values["kubelet_enabled"] is None:
                values["kubelet_enabled"] = bool(socket_path)
            elif values["kubelet_enabled"] and not socket_path:
                parser.error("--kubelet.enabled needs a --kubelet.pod-resources-socket")
    if "kubelet_gpu_resources" in values:
        values["kubelet_gpu_resources"] = _csv(values["kubelet_gpu_resources"] or "")
    if "kubelet_dra_drivers" in values:
        values["kubelet_dra_drivers"] = _csv(values["kubelet_dra_drivers"] or "")
    try:
        for key in ("upstream_timeout", "scrape_timeout", "kubelet_timeout", "docker_timeout"):
            if key in values:
                values[key] = float(values[key])
                if not 0 < values[key] < float("inf"):
                    raise ValueError(f"--{key.replace('_', '.', 1)} must be positive")
        for key, flag in (
            ("collect_interval", "--collect.interval"),
            ("upstream_follow_step", "--upstream.follow-step"),
        ):
            if key in values:
                values[key] = float(values[key])
                if not 0 <= values[key] < float("inf"):
                    raise ValueError(f"{flag} must be 0 or positive")
        if "idle_threshold" in values:
            raw = values["idle_threshold"]
            try:
                values["idle_threshold"] = float(raw)
            except ValueError:
                raise ValueError(f"--idle.threshold: {raw!r} is not a number") from None
            if not 0 <= values["idle_threshold"] < 1:
                raise ValueError(
                    f"--idle.threshold: {raw!r} is not an SM utilization ratio from 0 up to 1"
                )
        if "bridge_naming" in values:
            try:
                values["bridge_naming"] = naming_of_setting(values["bridge_naming"] or OFF)
            except ValueError as exc:
                raise ValueError(f"--bridge.naming: {exc}") from None
        if "upstream_max_bytes" in values:
            values["upstream_max_bytes"] = int(values["upstream_max_bytes"])
            if values["upstream_max_bytes"] < 1024:
                raise ValueError("--upstream.max-bytes must be at least 1024")
        try:
            parse_mps_daemon_pods(values["mps_daemon_pod_selector"], ())
        except ValueError as exc:
            raise ValueError(f"--mps.daemon-pod-selector: {exc}") from None
        for namespace in values["mps_daemon_pod_namespace"]:
            if NAMESPACE_RE.fullmatch(namespace) is None:
                raise ValueError(f"--mps.daemon-pod-namespace: {namespace!r} is not a namespace")
        from .docker import parse_docker_host

        parse_docker_host(values["docker_host"])
        if "listen_address" in values:
            from .app import parse_listen_address

            parse_listen_address(values["listen_address"])
        if values.get("upstream_discover_pod"):
            parse_selector(values["upstream_pod_selector"])
            namespace = values.get("upstream_pod_namespace")
            if not namespace:
                raise ValueError("--upstream.discover-pod needs --upstream.pod-namespace")
            if NAMESPACE_RE.fullmatch(namespace) is None:
                # e.g. "$(POD_NAMESPACE)" left as it is: the kubelet expands only variables
                # the container defines, so no pod would ever match.
                raise ValueError(
                    f"--upstream.pod-namespace {namespace!r} is not a namespace name "
                    "(an unexpanded $(VAR) means the container has no such variable)"
                )
        if values.get("web_config_file"):
            from .webconfig import load_web_config, ssl_context

            ssl_context(load_web_config(values["web_config_file"]))  # fail at start, not later
        elif "web_config_file" in values:
            values["web_config_file"] = None
    except ValueError as exc:
        parser.error(str(exc))
    if values.get("nvml_library") == "":
        values["nvml_library"] = None
    values["host_name"] = socket.gethostname()
    return ns.command, Config(**values), ns


def main(argv: Sequence[str] | None = None) -> int:
    command, config, ns = parse_config(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if command in ("resolve", "ps"):
        from .commands import ps, resolve

        if ns.demo and config.procfs == _D.procfs:
            print(
                f"dcgm-enricher {command} --demo: give the --path.procfs that "
                "`dcgm-enricher demo` printed (the simulated node's /proc tree)",
                file=sys.stderr,
            )
            return 2
        gpu, pods = None, None
        if ns.demo:
            from .demo import looking_at

            try:
                config, gpu, pods = looking_at(config)
            except (OSError, ValueError) as exc:
                print(
                    f"dcgm-enricher {command} --demo: no running demo's /proc tree at "
                    f"{config.procfs} ({exc}): give the --path.procfs that "
                    "`dcgm-enricher demo` printed while it runs",
                    file=sys.stderr,
                )
                return 2
        try:
            if command == "resolve":
                status = resolve(config, ns.pids, sys.stdout, pods=pods)
            else:
                status = ps(config, sys.stdout, pods=pods, gpu=gpu)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader left (`ps | head`): no traceback, and nothing more to flush at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        return status
    if command == "demo":
        from .demo import run_demo
        from .simnode.dialects import dialect_for

        virtual = bool(ns.demo_virtual_gpus)
        try:
            version = dialect_for(ns.demo_exporter_version, virtual).version
        except ValueError as exc:
            print(f"dcgm-enricher demo: {exc}", file=sys.stderr)
            return 2
        return asyncio.run(run_demo(config, version, virtual))
    from .commands import run_server

    return asyncio.run(run_server(config))
