"""The table of sources: one entry per source says its name, what its read takes from the
sources read before it, where its read runs, how long it may take and how ``serve`` makes it.

From this table alone the Scraper builds its ``sources.MeasuredSource`` wrappers, the order of the
``dcgm_enricher_source_*`` series (the table's) and the node side's reads, each started as
soon as the sources it depends on have answered: NVML, then procfs for NVML's PIDs, then
Docker for the containers procfs found outside pods; the kubelet's PodResources beside them,
then the ResourceSlices of the DRA devices it reported; the pod index last, so it is at least
as new as the PIDs. A new source that is read, timed and reported is one module plus one
entry here (docs/sources.md); one whose value the attribution uses is also named in
``nodeside.NodeSide.read``, which hands each source's value to ``attribution`` by name.

An entry's name is the source's one name: the Scraper's keyword, the ``source`` label value
(a contract) and the name the source itself reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .attribution import docker_lookup_ids, dra_slice_keys
from .config import Config
from .model import GpuSnapshot, PodIndex
from .podparse import parse_mps_daemon_pods, parse_selector
from .podresources import ListResult
from .resourceslices import SliceIndex
from .sources import Source

if TYPE_CHECKING:
    from .docker import DockerSource
    from .nvml import NvmlSource
    from .podresources import PodResourcesSource
    from .procfs import ProcfsSource
    from .resourceslices import ResourceSlicesSource

# The values of the sources read so far, by name (a source switched off: its default).
Values = Mapping[str, Any]
# The sources ``serve`` made so far, by name (None: off).
Made = Mapping[str, Source | None]


def _no_args(_values: Values) -> tuple[Any, ...]:
    return ()


def _none() -> None:
    return None


def _no_timeout(_config: Config, _spent: Mapping[str, float]) -> float | None:
    return None


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One source of the table."""

    name: str
    # The sources whose values its read takes (``args`` sees them), read before it.
    needs: tuple[str, ...] = ()
    # Sources read before it whose values it does not take.
    after: tuple[str, ...] = ()
    # The arguments of its read from the values of ``needs``; None: nothing to read this time
    # (reported up, no time spent).
    args: Callable[[Values], tuple[Any, ...] | None] = _no_args
    # Its value when it is off or its read is abandoned.
    default: Callable[[], Any] = _none
    # The worker thread its blocking read runs in: entries that name the same one share it
    # (their reads never overlap). None: read inline (in-memory or async reads).
    worker: str | None = None
    # How long its read may take, from the configuration and the seconds each source read
    # before it took (None: no bound).
    timeout: Callable[[Config, Mapping[str, float]], float | None] = _no_timeout
    # How ``serve`` makes it from the configuration and the sources made before it (None:
    # switched off). None here: the Scraper makes it (the upstream).
    make: Callable[[Config, Made], Source | None] | None = None
    # Read by the node side (False: the upstream, which the Scraper follows itself).
    node: bool = True


# --------------------------------------------------------------------------- how serve makes them


def start_kubernetes_source(config: Config) -> Any:
    """Start the node's pod watch, or return None when Kubernetes is off.

    Raises whatever kube.load_api_client raises when no cluster config can be found.
    """
    if not config.kube_active:
        return None
    from .kube import KubernetesSource, load_api_client

    if not config.kube_node_name:
        raise ValueError("--kube.enabled needs --kube.node-name or $NODE_NAME")
    cache = KubernetesSource(
        load_api_client(config.kube_kubeconfig),
        config.kube_node_name,
        **kubernetes_source_options(config),
    )
    cache.start()
    return cache


def kubernetes_source_options(config: Config) -> dict[str, Any]:
    """The pod watch's options from ``config``: the label and annotation keys it copies and,
    with --upstream.discover-pod, the selector and namespace the upstream pod must match."""
    selector = (
        parse_selector(config.upstream_pod_selector) if config.upstream_discover_pod else None
    )
    return {
        "label_keys": config.kube_pod_labels,
        "annotation_keys": config.kube_pod_annotations,
        "upstream_selector": selector,
        "upstream_namespace": config.upstream_pod_namespace,
        "mps_daemon_pods": parse_mps_daemon_pods(
            config.mps_daemon_pod_selector, config.mps_daemon_pod_namespace
        ),
    }


def make_nvml_source(config: Config) -> NvmlSource | None:
    """The NVML source, or None with --no-nvml.enabled."""
    if not config.nvml_enabled:
        return None
    from .nvml import NvmlSource

    return NvmlSource(library_path=config.nvml_library)


def make_procfs_source(config: Config) -> ProcfsSource:
    """The procfs source over --path.procfs."""
    from .procfs import ProcfsSource

    return ProcfsSource(config.procfs)


def make_podresources_source(config: Config) -> PodResourcesSource | None:
    """The kubelet PodResources source, or None when it is off (see Config.kubelet_active)."""
    if not config.kubelet_active:
        return None
    from .podresources import PodResourcesSource

    return PodResourcesSource(
        config.kubelet_pod_resources_socket,
        timeout=config.kubelet_timeout,
        extra_resources=config.kubelet_gpu_resources,
        extra_drivers=config.kubelet_dra_drivers,
    )


def make_resourceslices_source(
    config: Config, api_client: Any = None
) -> ResourceSlicesSource | None:
    """The ResourceSlice source (which GPU each DRA device is, and its taints), or None: it
    runs where the kubelet source and Kubernetes both do, unless --no-kube.resource-slices.
    ``api_client``: the pod watch's (``KubernetesSource.api_client``), else one is loaded from
    the configuration.

    Raises whatever kube.load_api_client raises when no cluster config can be found.
    """
    if not (config.kube_resource_slices and config.kube_active and config.kubelet_active):
        return None
    from .kube import load_api_client
    from .resourceslices import ResourceSlicesSource, api_client_lister

    if api_client is None:
        api_client = load_api_client(config.kube_kubeconfig)
    # Health watching: the node's slices are listed every minute with or without DRA
    # allocations, so that a taint on any device is seen (gpu_device_taint).
    return ResourceSlicesSource(
        api_client_lister(api_client), config.kube_node_name, watch_health=True
    )


def make_docker_source(config: Config) -> DockerSource | None:
    """The Docker source in Docker mode (no Kubernetes), else None. With ``--docker.host=""``
    it runs in cgroup-only mode and never opens a socket."""
    if not config.docker_active:
        return None
    from .docker import DockerSource

    return DockerSource(config.docker_host, timeout=config.docker_timeout)


def _api_client(made: Made) -> Any:
    return getattr(made.get("kubernetes"), "api_client", None)


def _procfs_args(values: Values) -> tuple[Any, ...] | None:
    snapshot: GpuSnapshot = values["nvml"]
    pids = sorted({p.pid for p in snapshot.processes})
    return (pids, snapshot.taken_at or None) if pids else None


# --------------------------------------------------------------------------- the table

# In the order of the dcgm_enricher_source_* series.
SOURCES: tuple[SourceEntry, ...] = (
    SourceEntry("upstream", node=False),
    # One worker for NVML and procfs: their reads never overlap, and a hung NVML call cannot
    # pile up threads (the next read reports it busy instead). Together they are bounded by
    # --scrape.timeout.
    SourceEntry(
        "nvml",
        default=GpuSnapshot,
        worker="gpu",
        timeout=lambda config, _spent: config.scrape_timeout,
        make=lambda config, _made: make_nvml_source(config),
    ),
    SourceEntry(
        "procfs",
        needs=("nvml",),
        args=_procfs_args,
        default=dict,
        worker="gpu",
        timeout=lambda config, spent: max(config.scrape_timeout - spent["nvml"], 0.0),
        make=lambda config, _made: make_procfs_source(config),
    ),
    # Read last, so the index is at least as new as the PIDs procfs found.
    SourceEntry(
        "kubernetes",
        after=("docker", "resourceslices"),
        default=PodIndex,
        make=lambda config, _made: start_kubernetes_source(config),
    ),
    # The kubelet has its own worker, so a slow kubelet never delays NVML. Its call carries
    # its own deadline; the margin only guards against a stuck thread.
    SourceEntry(
        "podresources",
        default=lambda: ListResult(enabled=True),
        worker="kubelet",
        timeout=lambda config, _spent: config.kubelet_timeout + 1.0,
        make=lambda config, _made: make_podresources_source(config),
    ),
    # Asked about the DRA devices the kubelet reported (and, every minute, for the devices'
    # taints). It shares the kubelet's worker, so a slow API server never delays NVML either.
    SourceEntry(
        "resourceslices",
        needs=("podresources",),
        args=lambda values: (dra_slice_keys(values["podresources"].allocations),),
        default=SliceIndex,
        worker="kubelet",
        timeout=lambda _config, _spent: 10.0,
        make=lambda config, made: make_resourceslices_source(config, _api_client(made)),
    ),
    # Asked on every read, even with no process outside a pod, so its health stays current.
    SourceEntry(
        "docker",
        needs=("procfs",),
        args=lambda values: (docker_lookup_ids(values["procfs"]),),
        default=dict,
        make=lambda config, _made: make_docker_source(config),
    ),
)


def check_table(table: Sequence[SourceEntry]) -> None:
    """Raises ValueError unless every name is unique and the dependencies name entries of the
    table and form no circle."""
    names = [entry.name for entry in table]
    if len(set(names)) != len(names):
        raise ValueError(f"a source is in the table twice: {names}")
    deps = {entry.name: (*entry.needs, *entry.after) for entry in table}
    for name, before in deps.items():
        if unknown := [n for n in before if n not in deps]:
            raise ValueError(f"source {name!r} depends on sources not in the table: {unknown}")
    done: set[str] = set()
    while len(done) < len(deps):
        ready = [n for n, before in deps.items() if n not in done and set(before) <= done]
        if not ready:
            raise ValueError(f"the sources depend on each other in a circle: {set(deps) - done}")
        done.update(ready)


def make_sources(
    config: Config, table: Sequence[SourceEntry] = SOURCES
) -> dict[str, Source | None]:
    """Every source ``serve`` runs, made by the table's entries in order (the upstream is the
    Scraper's own). Raises what a maker raises (the pod watch without a cluster config)."""
    made: dict[str, Source | None] = {}
    for entry in table:
        if entry.make is not None:
            made[entry.name] = entry.make(config, made)
    return made
