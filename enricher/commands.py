"""The commands behind the CLI: serve, resolve and ps. They wire the real sources."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from .app import make_app, serve
from .attribution import (
    REASON_CONFLICT,
    REASON_CONTAINER_NOT_FOUND,
    REASON_MPS_SERVER,
    REASON_POD_NOT_FOUND,
    Attribution,
    attribute,
    cgroup_containers,
    choose_docker,
    docker_lookup_ids,
    mps_daemon_at,
    pod_of,
)
from .config import Config
from .model import CgroupRef, DockerContainer, PodIndex, ProcError, ProcInfo
from .nodeside import PodSource
from .pipeline import Scraper
from .procfs import ProcfsSource
from .sourcetable import make_docker_source, make_sources, start_kubernetes_source
from .upstream import discovery_target

log = logging.getLogger(__name__)


async def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_server(config: Config) -> int:
    """``dcgm-enricher serve``: the sidecar, until SIGTERM."""
    try:
        sources: dict[str, Any] = make_sources(config)
    except Exception as exc:
        log.error("cannot start the Kubernetes pod watch: %s", exc)
        return 2
    scraper = Scraper(config, **sources)
    from .webconfig import WebConfig, WebConfigError, apply, load_web_config, ssl_context

    try:
        web_cfg = load_web_config(config.web_config_file) if config.web_config_file else WebConfig()
        tls = ssl_context(web_cfg)
    except WebConfigError as exc:
        log.error("%s", exc)
        return 2
    app = make_app(scraper)
    apply(app, web_cfg)
    runner = await serve(
        app,
        config.listen_address,
        ssl_context=tls,
    )
    log.info(
        "dcgm-enricher serving on %s, upstream %s, kubelet PodResources %s, Docker %s",
        config.listen_address,
        (
            "discovered: a "
            + discovery_target(
                config.upstream_pod_selector,
                config.upstream_pod_namespace,
                config.kube_node_name,
            )
            if config.upstream_discover_pod
            else config.upstream_url
        ),
        config.kubelet_pod_resources_socket if config.kubelet_active else "off",
        _docker_mode(config),
    )
    try:
        await wait_for_signal()
    finally:
        # The app's cleanup closes the scraper, which closes every source (Scraper.close).
        await runner.cleanup()
    return 0


def _docker_mode(config: Config) -> str:
    if not config.docker_active:
        return "off (Kubernetes)"
    return config.docker_host or "cgroup-only (containers by short ID)"


def _docker_answers(
    config: Config, procs: Mapping[int, ProcInfo | ProcError]
) -> tuple[dict[str, DockerContainer | None] | None, str]:
    """A one-off Docker lookup for the troubleshooting commands: the answers by container ID
    (None outside Docker mode) and a note when containers are named by short ID only."""
    source = make_docker_source(config)
    if source is None:
        return None, ""

    async def ask(ids: list[str]) -> dict[str, DockerContainer | None]:
        try:
            return await source.lookup(ids)
        finally:
            await source.close()

    answers = asyncio.run(ask(docker_lookup_ids(procs)))
    if not source.enabled:
        return answers, "docker: cgroup-only mode, containers are named by short ID"
    if any(c is not None and not c.resolved for c in answers.values()):
        return answers, f"docker: no answer from {config.docker_host}, some containers by short ID"
    return answers, ""


def _pod_index(config: Config, wait: float = 5.0) -> tuple[PodIndex | None, str]:
    """A one-off view of this node's pods for the troubleshooting commands."""
    if not config.kube_active:
        return None, "kubernetes disabled (no node name)"
    try:
        cache = start_kubernetes_source(config)
    except Exception as exc:
        return None, f"kubernetes unreachable: {exc}"
    try:
        if not cache.synced.wait(wait):
            return None, f"kubernetes did not answer within {wait:.0f}s"
        index: PodIndex = cache.index()
        return index, ""
    finally:
        cache.stop()


# What resolve says of a PID whose cgroup names a pod it cannot name, by the reason /metrics
# gives the process (gpu_unattributed_memory_used_bytes{reason}): its exit status is 1 then.
MPS_DAEMON_NOTE = "the MPS control daemon or server (--mps.daemon-pod-selector): not a workload"
UNRESOLVED_NOTES = {
    REASON_POD_NOT_FOUND: "pod not found on this node",
    REASON_CONFLICT: "the container's pod is not the pod its cgroup names",
    REASON_CONTAINER_NOT_FOUND: "no such Docker container",
}


def resolve(config: Config, pids: Sequence[int], out: TextIO, pods: PodSource | None = None) -> int:
    """``dcgm-enricher resolve PID...``: one JSON line per PID. Exits 0 when every PID
    resolved (its cgroup read, and the pod or Docker container it names found where pods or
    containers are known), else 1. ``pods``: a pod source to ask instead of the API server."""
    reader = ProcfsSource(config.procfs)
    if pods is not None:
        index: PodIndex | None = pods.index()
        kube_note = ""
    else:
        index, kube_note = _pod_index(config)
    infos = {pid: reader.read_pid(pid) for pid in dict.fromkeys(pids)}
    docker, docker_note = _docker_answers(config, infos)
    failures = 0
    for pid in pids:
        info = infos[pid]
        rec: dict[str, Any] = {"pid": pid}
        if isinstance(info, ProcError):
            rec["error"] = info.value
            failures += 1
        elif info.cgroup is None:
            rec.update(comm=info.comm, error="unknown_cgroup")
            failures += 1
        else:
            cg = info.cgroup
            rec.update(
                comm=info.comm,
                pod_uid=cg.pod_uid,
                container_id=cg.container_id,
                runtime=cg.runtime.value or None,
                cgroup=cg.path,
            )
            owner = pod_of(cg, index) if index is not None else None
            if mps_daemon_at(info, owner):
                # Not a workload: /metrics names no pod for it either.
                rec.update(reason=REASON_MPS_SERVER, note=MPS_DAEMON_NOTE)
                if owner is not None and owner[0] is not None:
                    rec["mps_daemon_pod"] = f"{owner[0].namespace}/{owner[0].name}"
            elif owner is not None:
                pod, container, reason = owner
                if pod is not None:
                    rec.update(namespace=pod.namespace, pod=pod.name, container=container or None)
                else:
                    rec.update(reason=reason, note=UNRESOLVED_NOTES[reason])
            elif kube_note and cg.pod_uid:
                rec["note"] = kube_note
            if docker is not None and cg.container_id and not cg.pod_uid:
                rec.update(_docker_fields(docker, cg, docker_note))
            if rec.get("reason", REASON_MPS_SERVER) != REASON_MPS_SERVER:
                failures += 1
        out.write(json.dumps(rec, sort_keys=True) + "\n")
    return 1 if failures else 0


def _docker_fields(
    answers: Mapping[str, DockerContainer | None], cg: CgroupRef, note: str
) -> dict[str, Any]:
    found = choose_docker(cgroup_containers(cg), answers)
    if found is None:
        reason = REASON_CONTAINER_NOT_FOUND
        return {"reason": reason, "note": UNRESOLVED_NOTES[reason]}
    rec: dict[str, Any] = {"container": found.name}
    if found.id != cg.container_id:
        rec["docker_container_id"] = found.id  # the outer container of a nested one
    if found.resolved:
        rec.update(
            image=found.image,
            compose_project=found.compose_project,
            compose_service=found.compose_service,
        )
    elif note:
        rec["note"] = note
    return rec


def render_ps_table(attributions: Sequence[Attribution]) -> str:
    """The ``ps`` table (pure)."""
    head = ("GPU", "GI", "PID", "PROCESS", "MEMORY", "SM", "NAMESPACE", "POD", "CONTAINER", "NOTE")
    rows = [head]
    for a in sorted(
        attributions, key=lambda a: (a.process.gpu_index, a.process.gi_id or -1, a.process.pid)
    ):
        p = a.process
        rows.append(
            (
                str(p.gpu_index),
                "" if p.gi_id is None else str(p.gi_id),
                str(p.pid),
                a.comm[:24],
                "?" if p.used_memory_bytes is None else f"{p.used_memory_bytes / 2**20:.0f}MiB",
                "-" if p.sm_util_ratio is None else f"{p.sm_util_ratio * 100:.0f}%",
                a.pod.namespace if a.pod else "",
                a.pod.name if a.pod else "",
                a.container,
                a.reason,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )


def ps(config: Config, out: TextIO, pods: PodSource | None = None, gpu: Any = None) -> int:
    """``dcgm-enricher ps``: who is on this node's GPUs right now. ``pods`` and ``gpu``:
    sources to read instead of the API server and NVML (the demo's)."""
    from .nvml import NvmlSource, NvmlUnavailable

    if not config.nvml_enabled:
        print(
            "dcgm-enricher ps: ps lists the GPU processes that NVML reports, so it cannot run "
            "with --no-nvml.enabled",
            file=sys.stderr,
        )
        return 2
    source = gpu or NvmlSource(library_path=config.nvml_library, retry_interval=0)
    try:
        snapshot = source.fetch()
    except NvmlUnavailable as exc:
        out.write(f"NVML unavailable: {exc}\n")
        return 1
    finally:
        source.close()
    reader = ProcfsSource(config.procfs)
    procs = reader.read_many([p.pid for p in snapshot.processes], listed_at=snapshot.taken_at)
    if pods is not None:
        index: PodIndex | None = pods.index()
        note = ""
    else:
        index, note = _pod_index(config)
    docker, docker_note = _docker_answers(config, procs)
    attributions = attribute(snapshot, procs, index or PodIndex(), docker)
    out.write(render_ps_table(attributions))
    if note:
        out.write(f"# {note}: pods are not named\n")
    if docker_note:
        out.write(f"# {docker_note}\n")
    if snapshot.errors:
        out.write("# NVML errors: " + "; ".join(snapshot.errors) + "\n")
    out.write(
        f"# {len(attributions)} GPU processes at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
    )
    return 0
