"""The commands behind the CLI: serve, resolve and ps. They wire the real sources."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any, TextIO

from .app import PodSource, Scraper, make_app, serve
from .config import Config
from .enrich import Attribution, attribute
from .model import PodIndex, ProcError
from .podresources import PodResourcesSource
from .procfs import ProcReader

log = logging.getLogger("enricher")


def start_pod_cache(config: Config) -> Any:
    """Start the node's pod watch, or return None when Kubernetes is off.

    Raises whatever kube.load_api_client raises when no cluster config can be found.
    """
    if not config.kube_active:
        return None
    from .kube import PodCache, load_api_client, parse_selector

    if not config.kube_node_name:
        raise ValueError("--kube.enabled needs --kube.node-name or $NODE_NAME")
    selector = (
        parse_selector(config.upstream_pod_selector) if config.upstream_discover_pod else None
    )
    cache = PodCache(
        load_api_client(config.kube_kubeconfig),
        config.kube_node_name,
        label_keys=config.kube_pod_labels,
        annotation_keys=config.kube_pod_annotations,
        upstream_selector=selector,
    )
    cache.start()
    return cache


def make_podresources_source(config: Config) -> PodResourcesSource | None:
    """The kubelet PodResources source, or None when --kubelet.pod-resources-socket is empty."""
    if not config.kubelet_pod_resources_socket:
        return None
    return PodResourcesSource(
        config.kubelet_pod_resources_socket,
        timeout=config.kubelet_timeout,
        extra_resources=config.kubelet_gpu_resources,
    )


def make_gpu_source(config: Config) -> Any:
    if not config.nvml_enabled:
        return None
    from .nvml import NvmlSource

    return NvmlSource(library_path=config.nvml_library, retry_interval=config.nvml_retry_interval)


async def run_server(config: Config) -> int:
    """``dcgm-enricher serve``: the sidecar, until SIGTERM."""
    from .cli import wait_for_signal

    try:
        pods = start_pod_cache(config)
    except Exception as exc:
        log.error("cannot start the Kubernetes pod watch: %s", exc)
        return 2
    gpu = make_gpu_source(config)
    podresources = make_podresources_source(config)
    scraper = Scraper(
        config, gpu=gpu, procs=ProcReader(config.procfs), pods=pods, podresources=podresources
    )
    runner = await serve(
        make_app(scraper), config.listen_address, max_header_bytes=config.max_request_header_bytes
    )
    log.info(
        "dcgm-enricher serving on %s, upstream %s, kubelet PodResources %s",
        config.listen_address,
        "discovered on this node" if config.upstream_discover_pod else config.upstream_url,
        config.kubelet_pod_resources_socket or "off",
    )
    try:
        await wait_for_signal()
    finally:
        await runner.cleanup()
        if pods is not None:
            pods.stop()
        if gpu is not None:
            gpu.close()
        if podresources is not None:
            podresources.close()
    return 0


def _pod_index(config: Config, wait: float = 5.0) -> tuple[PodIndex | None, str]:
    """A one-off view of this node's pods for the troubleshooting commands."""
    if not config.kube_active:
        return None, "kubernetes disabled (no node name)"
    try:
        cache = start_pod_cache(config)
    except Exception as exc:
        return None, f"kubernetes unreachable: {exc}"
    try:
        if not cache.synced.wait(wait):
            return None, f"kubernetes did not answer within {wait:.0f}s"
        index: PodIndex = cache.index()
        return index, ""
    finally:
        cache.stop()


def resolve(config: Config, pids: Sequence[int], out: TextIO) -> int:
    """``dcgm-enricher resolve PID...``: one JSON line per PID."""
    reader = ProcReader(config.procfs)
    index, kube_note = _pod_index(config)
    failures = 0
    for pid in pids:
        info = reader.read(pid)
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
            if index is not None:
                hit = index.by_container.get(cg.container_id or "")
                pod = hit[0] if hit else index.by_uid.get(cg.pod_uid or "")
                if pod is not None:
                    rec.update(
                        namespace=pod.namespace, pod=pod.name, container=hit[1] if hit else None
                    )
                elif cg.pod_uid:
                    rec["note"] = "pod not found on this node"
            elif kube_note and cg.pod_uid:
                rec["note"] = kube_note
        out.write(json.dumps(rec, sort_keys=True) + "\n")
    return 1 if failures == len(pids) else 0


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


def ps(config: Config, out: TextIO, pods: PodSource | None = None) -> int:
    """``dcgm-enricher ps``: who is on this node's GPUs right now."""
    from .nvml import NvmlSource, NvmlUnavailable

    source = NvmlSource(library_path=config.nvml_library, retry_interval=0)
    try:
        snapshot = source.fetch()
    except NvmlUnavailable as exc:
        out.write(f"NVML unavailable: {exc}\n")
        return 1
    finally:
        source.close()
    reader = ProcReader(config.procfs)
    procs = reader.read_many([p.pid for p in snapshot.processes], listed_at=snapshot.taken_at)
    if pods is not None:
        index: PodIndex | None = pods.index()
        note = ""
    else:
        index, note = _pod_index(config)
    attributions = attribute(snapshot, procs, index or PodIndex())
    out.write(render_ps_table(attributions))
    if note:
        out.write(f"# {note}: pods are not named\n")
    if snapshot.errors:
        out.write("# NVML errors: " + "; ".join(snapshot.errors) + "\n")
    out.write(
        f"# {len(attributions)} GPU processes at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
    )
    return 0
