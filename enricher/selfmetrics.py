"""The enricher's own families (self-metrics), beside the container families of
``families``: per-source health, process counts and build info (``self_metrics``), those that
change once per collection (``collection_self_metrics``) and those that move with every scrape
(``scrape_self_metrics``), and this process's runtime families (``RuntimeFamilies``:
process_*, python_*).

No I/O but the runtime families' (prometheus_client reads /proc/self): the pipeline hands in
the figures and gets writers back (``promclient.MetricWriter``); ``ScrapeCounters`` holds what
the scrapes and the HTTP side count. The enricher's memory limit comes from its own data
source, ``cgroupmem``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from . import __version__
from .attribution import Attribution
from .fieldtable import table
from .model import SourceStatus
from .promclient import OWN_PROCFS, MetricWriter, render_metrics
from .readings import Contract


def collection_self_metrics(
    statuses: Sequence[SourceStatus],
    attributions: Sequence[Attribution],
    *,
    samples: int,
    invalid_lines: int,
    pods: int | None,
    allocated: int | None,
    unmapped: int,
    memory_limit: int | None,
    contract: Contract | None = None,
) -> tuple[MetricWriter, MetricWriter]:
    """The self-metrics of one node view and upstream answer: those written before the
    per-scrape counters, and those after them (the order of the families on /metrics).
    ``pods``: the pod watch's pods (None: no watch); ``allocated`` and ``unmapped``: the
    kubelet's devices (``allocated`` None: no kubelet source); ``memory_limit``: of the
    enricher's own cgroup (None: none, and no series); ``contract``: what the last upstream
    body said of dcgm-exporter's contract (enricher.readings)."""
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
    contract_families(contract or Contract(), before)
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


def contract_families(contract: Contract, w: MetricWriter) -> None:
    """dcgm_enricher_upstream_naming_info, _fields and _field_missing (docs/metrics.md)."""
    w.family(
        "dcgm_enricher_upstream_naming_info",
        "The naming of dcgm-exporter's fields the last upstream body speaks (enricher/"
        "dcgm_fields.json: 4.8 up to 4.8.x, 4.9, 4.10; the oldest that fits its names), mixed "
        "when its names belong to no one naming, none before a body with a known field; 1.",
    )
    w.sample("dcgm_enricher_upstream_naming_info", (("naming", contract.naming),), 1)
    w.family(
        "dcgm_enricher_upstream_fields",
        "DCGM fields (families) in the last upstream body, by whether the field table knows "
        "them; unknown ones pass through untouched.",
        "gauge",
    )
    w.sample("dcgm_enricher_upstream_fields", (("table", "known"),), contract.known)
    w.sample("dcgm_enricher_upstream_fields", (("table", "unknown"),), contract.unknown)
    w.family(
        "dcgm_enricher_upstream_field_missing",
        "1 when the last upstream body has a field the enricher needs under no name the field "
        "table knows (a renamed field, or a counters file without it), else 0.",
        "gauge",
    )
    for name in table().needed():
        w.sample(
            "dcgm_enricher_upstream_field_missing",
            (("field", name),),
            1 if name in contract.missing else 0,
        )


def scrape_self_metrics(
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


def self_metrics(
    statuses: Sequence[SourceStatus],
    attributions: Sequence[Attribution],
    *,
    version: str | None,
    extra: Mapping[str, tuple[str, str, float]] | None = None,
) -> MetricWriter:
    """The dcgm_enricher_* families: per-source health, process counts and build info (none
    when ``version`` is None). ``extra`` maps a metric name to (help, type, value) for
    single-value gauges and counters."""
    w = MetricWriter()
    w.family(
        "dcgm_enricher_source_up",
        "Whether a data source worked in the last collection (1) or failed (0); absent when "
        "disabled.",
    )
    w.family(
        "dcgm_enricher_source_enabled", "Whether a data source is configured (1) or disabled (0)."
    )
    w.family(
        "dcgm_enricher_source_duration_seconds",
        "Time the source took in the last collection.",
    )
    w.family(
        "dcgm_enricher_source_errors_total",
        "Errors a data source has had since the enricher started.",
        "counter",
    )
    for st in statuses:
        src = (("source", st.name),)
        w.sample("dcgm_enricher_source_enabled", src, 1 if st.enabled else 0)
        if not st.enabled:
            continue
        w.sample("dcgm_enricher_source_up", src, 1 if st.up else 0)
        w.sample("dcgm_enricher_source_duration_seconds", src, st.duration_seconds)
        w.sample("dcgm_enricher_source_errors_total", src, st.errors_total)
    w.family(
        "dcgm_enricher_gpu_processes",
        "GPU processes on this node in the last collection, by whether a pod (or, without "
        "Kubernetes, a Docker container) was found for them.",
    )
    attributed = sum(1 for a in attributions if a.attributed)
    w.sample("dcgm_enricher_gpu_processes", (("state", "attributed"),), attributed)
    w.sample(
        "dcgm_enricher_gpu_processes",
        (("state", "unattributed"),),
        len(attributions) - attributed,
    )
    return value_families(extra or {}, version=version, writer=w)


def value_families(
    extra: Mapping[str, tuple[str, str, float]],
    *,
    version: str | None = None,
    writer: MetricWriter | None = None,
) -> MetricWriter:
    """Single-value families (``extra``: name -> (help, type, value)), then
    dcgm_enricher_build_info when ``version`` is given, added to ``writer`` (or a new one)."""
    w = writer if writer is not None else MetricWriter()
    for name, (help_text, typ, value) in extra.items():
        w.family(name, help_text, typ)
        w.sample(name, (), value)
    if version is not None:
        w.family("dcgm_enricher_build_info", "Build information of the running dcgm-enricher; 1.")
        w.sample("dcgm_enricher_build_info", (("version", version),), 1)
    return w


class RuntimeFamilies(Collector):
    """prometheus_client's process (from ``procfs``/self), platform and garbage collector
    families, registered nowhere (never in prometheus_client's global registry): a Collector
    for a registry, and :meth:`render`, which writes the platform's (fixed at start) once."""

    def __init__(self, procfs: str = OWN_PROCFS, const: tuple[tuple[str, str], ...] = ()) -> None:
        self._const = dict(const)  # labels written on every sample (the enricher's node)
        self._process = ProcessCollector(proc=procfs, registry=None)
        self._platform = PlatformCollector(registry=None)
        # GCCollector registers itself (it needs a registry), and only on CPython.
        holder = CollectorRegistry(auto_describe=False)
        collector = GCCollector(registry=holder)
        self._gc: Collector | None = collector if list(holder.collect()) else None
        self._platform_text = render_metrics(self._labelled(self._platform.collect()))

    def _labelled(self, metrics: Iterable[Metric]) -> list[Metric]:
        """``metrics`` with the constant labels on every sample (a sample's own win)."""
        if not self._const:
            return list(metrics)
        out = []
        for metric in metrics:
            copy = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            copy.samples = [s._replace(labels={**self._const, **s.labels}) for s in metric.samples]
            out.append(copy)
        return out

    def collect(self) -> Iterable[Metric]:
        out = [*self._process.collect(), *self._platform.collect()]
        if self._gc is not None:
            out.extend(self._gc.collect())
        return self._labelled(out)

    def render(self) -> bytes:
        """What ``render_metrics(self.collect())`` writes, as UTF-8."""
        gc = self._labelled(self._gc.collect()) if self._gc is not None else []
        text = render_metrics(self._labelled(self._process.collect()))
        text += self._platform_text + render_metrics(gc)
        return text.encode("utf-8")


@dataclass
class ScrapeCounters:
    """What the scrapes and the HTTP side count, served by ``scrape_self_metrics``."""

    scrapes: int = 0
    shared_scrapes: int = 0
    node_page_requests: int = 0  # GET /: reads the node too, but is not a scrape
    # Bytes of /metrics bodies sent, by Content-Encoding (enricher.app counts them).
    response_bytes: dict[str, int] = field(default_factory=lambda: {"gzip": 0, "identity": 0})
    last_duration: float = 0.0  # of the last scrape, in seconds
