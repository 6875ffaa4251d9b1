"""The enricher's own families, pure, beside the container families of ``families``: those
that change once per collection and those that move with every scrape.

No I/O: the pipeline hands in the figures and gets writers back (``promclient.MetricWriter``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import __version__
from .attribution import Attribution
from .families import self_metrics, value_families
from .model import SourceStatus
from .promclient import MetricWriter


def collection_families(
    statuses: Sequence[SourceStatus],
    attributions: Sequence[Attribution],
    *,
    samples: int,
    invalid_lines: int,
    pods: int | None,
    allocated: int | None,
    unmapped: int,
    memory_limit: int | None,
) -> tuple[MetricWriter, MetricWriter]:
    """The self-metrics of one node view and upstream answer: those written before the
    per-scrape counters, and those after them (the order of the families on /metrics).
    ``pods``: the pod watch's pods (None: no watch); ``allocated`` and ``unmapped``: the
    kubelet's devices (``allocated`` None: no kubelet source); ``memory_limit``: of the
    enricher's own cgroup (None: none, and no series)."""
    before = self_metrics(
        statuses,
        attributions,
        version=None,
        extra={
            "dcgm_enricher_upstream_samples": (
                "Upstream samples passed through from the last upstream collection.",
                "gauge",
                samples,
            ),
            "dcgm_enricher_upstream_invalid_lines": (
                "Upstream lines dropped from the last upstream collection because they were "
                "not valid exposition (or repeated a series).",
                "gauge",
                invalid_lines,
            ),
        },
    )
    extra: dict[str, tuple[str, str, float]] = {}
    if pods is not None:
        extra["dcgm_enricher_kubernetes_pods"] = (
            "Pods of this node in the watch cache.",
            "gauge",
            pods,
        )
    if allocated is not None:
        extra["dcgm_enricher_podresources_allocated_devices"] = (
            "GPU device IDs (or shared replicas) the kubelet reported allocated to containers "
            "in the last collection and that name a device of this node.",
            "gauge",
            allocated,
        )
        extra["dcgm_enricher_podresources_unmapped_devices"] = (
            "GPU device IDs the kubelet reported allocated in the last collection that name no "
            "GPU or MIG device NVML reported (unknown ID scheme, or NVML down), DRA devices no "
            "ResourceSlice gives such a UUID, or entries skipped as malformed; their "
            "containers get no gpu_container_allocated series.",
            "gauge",
            unmapped,
        )
    if memory_limit is not None:
        extra["dcgm_enricher_memory_limit_bytes"] = (
            "The memory limit the kernel enforces on the enricher's own cgroup (its "
            "container's); absent when there is none.",
            "gauge",
            memory_limit,
        )
    return before, value_families(extra, version=__version__)


def scrape_families(
    *,
    upstream_requests: int,
    upstream_collections: int,
    scrapes: int,
    shared_scrapes: int,
    node_page_requests: int,
    last_duration: float,
    kubernetes_last_sync: float | None,
    response_bytes: Mapping[str, int],
) -> MetricWriter:
    """The self-metrics that move with every scrape (``kubernetes_last_sync`` None: no pod
    watch, no series)."""
    extra: dict[str, tuple[str, str, float]] = {
        "dcgm_enricher_upstream_requests_total": (
            "Requests sent to the upstream.",
            "counter",
            upstream_requests,
        ),
        "dcgm_enricher_upstream_collections_total": (
            "Upstream bodies that differed from the one before: dcgm-exporter's "
            "collections as the enricher saw them.",
            "counter",
            upstream_collections,
        ),
        "dcgm_enricher_scrapes_total": (
            "Scrapes of /metrics served.",
            "counter",
            scrapes,
        ),
        "dcgm_enricher_shared_scrapes_total": (
            "Scrapes that joined one already in flight instead of starting their own.",
            "counter",
            shared_scrapes,
        ),
        "dcgm_enricher_node_page_requests_total": (
            "Requests for the node page (/) served; not scrapes, so not in "
            "dcgm_enricher_scrapes_total.",
            "counter",
            node_page_requests,
        ),
        "dcgm_enricher_scrape_duration_seconds": (
            "Time the previous scrape took, end to end.",
            "gauge",
            last_duration,
        ),
    }
    if kubernetes_last_sync is not None:
        extra["dcgm_enricher_kubernetes_last_sync_timestamp_seconds"] = (
            "When the pod watch last heard from the API server (Unix time); the cache is "
            "served as of then while the API is unreachable.",
            "gauge",
            kubernetes_last_sync,
        )
    writer = value_families(extra)
    name = "dcgm_enricher_response_bytes_total"
    writer.family(
        name,
        "Bytes of /metrics bodies sent, by Content-Encoding (gzip when the scraper "
        "accepts it); this scrape's own body counts on the next.",
        "counter",
    )
    for encoding, sent in response_bytes.items():
        writer.sample(name, (("encoding", encoding),), sent)
    return writer
