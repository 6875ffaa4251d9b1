"""The enricher's own families through prometheus_client: metric families, the runtime
families (``process_*``, ``python_*``), and prometheus_client's text exposition.

The upstream rewrite stays hand-written (rewrite.Rewriter): it is the hot path, and it
copies the upstream's values and label order as they came. What the enricher writes itself
goes through prometheus_client, which also brings the standard ``process_*`` and ``python_*``
families. prometheus_client writes labels sorted by name and values in Go's float format
(``1.0``, ``7.516192768e+09``): the same samples for any reader.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string

from .textformat import written_value

# Where the process_* families come from: the enricher's own process, as the /proc of its own
# PID namespace shows it. Never --path.procfs: that is the host's /proc (or a fake tree in the
# demo and tests), read for the GPU processes' PIDs.
OWN_PROCFS = "/proc"
# The name prefixes of the runtime families (selfmetrics.RuntimeFamilies).
RUNTIME_PREFIXES = ("process_", "python_")


class MetricWriter(Collector):
    """The enricher's own families as prometheus_client metric families, in the order they
    were declared, samples in the order they were added; a Collector, so that a registry (or
    ``generate_latest`` directly) can serve it.

    Label values are cut to the enricher's bound and made writable (``written_value``) before
    prometheus_client sees them: it escapes them but neither cuts them nor can encode a lone
    surrogate. prometheus_client's objects are built only when collected: ``render`` (every
    scrape) writes the same text from the samples as given.
    """

    def __init__(self) -> None:
        # name -> (the name prometheus_client keeps, HELP, type); the samples as given.
        self._families: dict[str, tuple[str, str, str]] = {}
        self._raw: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = {}

    def family(self, name: str, help_text: str, typ: str = "gauge") -> None:
        """Declare a family once (later declarations are ignored). A counter's name ends in
        ``_total``, as its samples' do: prometheus_client keeps the name without it and
        writes it back on HELP and TYPE."""
        if name in self._families:
            return
        if typ == "counter":
            if not name.endswith("_total"):
                raise ValueError(f"counter {name!r}: the name must end in _total")
            self._families[name] = (name[: -len("_total")], help_text, typ)
        elif typ in _TYPES:
            self._families[name] = (name, help_text, typ)
        else:
            raise ValueError(
                f"{name!r}: a MetricWriter family is a counter or a gauge, not {typ!r}"
            )
        self._raw[name] = []

    def sample(self, name: str, labels: Iterable[tuple[str, str]], value: float) -> None:
        """Add a sample of the declared family ``name``, labels as (name, value) pairs."""
        if name not in self._families:
            raise KeyError(name)
        self._raw[name].append((tuple(labels), float(value)))

    def collect(self) -> Iterable[Metric]:
        out = []
        for name, (kept, documentation, typ) in self._families.items():
            metric = Metric(kept, documentation, typ)
            for pairs, value in self._raw[name]:
                metric.add_sample(name, {k: written_value(v) for k, v in pairs}, value)
            out.append(metric)
        return out

    def render(self, labels: LabelSets | None = None) -> str:
        """The families as text exposition (empty when none was declared): what
        ``render_metrics(self.collect())`` writes, each family's HELP and TYPE lines formatted
        once (a bounded cache) and each distinct label set once per ``labels`` memo (the
        Scraper's: the same families and device labels come back on every scrape and
        collection; without one, once per render)."""
        memo = labels if labels is not None else LabelSets()
        out: list[str] = []
        for name, spec in self._families.items():
            out.append(_family_head(*spec))
            sname = _metric_name(name)
            raw = self._raw[name]
            for (_, value), block in zip(raw, memo.texts([pairs for pairs, _ in raw]), strict=True):
                head = f"{sname}{{{block}}}" if block else sname
                out.append(f"{head} {floatToGoString(value)}\n")
        return "".join(out)


@functools.lru_cache(maxsize=1024)
def _family_head(kept: str, documentation: str, typ: str) -> str:
    """A family's HELP and TYPE lines as prometheus_client writes them. Checks the name as
    prometheus_client's Metric does (a ValueError for a name it refuses)."""
    Metric(kept, documentation, typ)
    exposed = _metric_name(kept + _SUFFIX.get(typ, ""))
    doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {exposed} {doc}\n# TYPE {exposed} {_TYPES[typ]}\n"


# How many label sets a LabelSets memo takes in one turn before it turns itself.
LABEL_SETS_MAX = 8192


def label_text(pairs: tuple[tuple[str, str], ...]) -> str:
    """The label block (without braces) prometheus_client writes for ``pairs``: values made
    writable (``written_value``), a repeated name keeping its last value, sorted by name,
    escaped by its rules."""
    return _label_block({k: written_value(v) for k, v in pairs})


class LabelSets:
    """A memo of :func:`label_text`: the label sets written since the last turn, and those of
    the turn before (written again, one moves back to the current ones). Its owner (each
    Scraper has one) turns it once per collection (:meth:`turn`), so a set not written for a
    whole collection (a pod that left) is gone at the next turn: the memo follows the series
    in use, with no fixed bound for pods that come and go to fill (a bound of 1,024 sets did,
    over thousands of scrapes under churn), nor for a node with more series than that to
    outgrow. An owner that never turns it turns it every ``bound`` new sets."""

    def __init__(
        self, bound: int = LABEL_SETS_MAX, const: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.bound = bound
        # Labels written on every set (the enricher's ``node``), before the set's own: a set
        # that names one of them keeps its own value.
        self.const = const
        self._current: dict[tuple[tuple[str, str], ...], str] = {}
        self._before: dict[tuple[tuple[str, str], ...], str] = {}

    def text(self, pairs: tuple[tuple[str, str], ...]) -> str:
        """``label_text(pairs)``, formatted once while the set stays in use."""
        return self.texts((pairs,))[0]

    def texts(self, sets: Iterable[tuple[tuple[str, str], ...]]) -> list[str]:
        """:meth:`text` of each of ``sets``, in one call (the hot path: a family's samples)."""
        current, before, bound = self._current, self._before, self.bound
        out = []
        for pairs in sets:
            block = current.get(pairs)
            if block is None:
                block = before.pop(pairs, None)
                if block is None:
                    block = label_text(self.const + pairs)
                if len(current) >= bound:
                    self.turn()
                    current, before = self._current, self._before
                current[pairs] = block
            out.append(block)
        return out

    def turn(self) -> None:
        """Start a new turn: the sets written before the previous turn and not since are
        dropped."""
        self._before, self._current = self._current, {}

    def held(self) -> int:
        """How many label sets the memo holds (both turns)."""
        return len(self._current) + len(self._before)


def _label_block(labels: dict[str, str]) -> str:
    """prometheus_client's label block for ``labels`` (sorted by name, its escapes)."""
    return ",".join(
        f'{_label_name(k)}="'
        + v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        + '"'
        for k, v in sorted(labels.items())
    )


# The families the fast path writes; any other (histograms, summaries, OpenMetrics-only
# samples) goes through generate_latest itself.
_TYPES = {"counter": "counter", "gauge": "gauge", "untyped": "untyped", "unknown": "untyped"}
_SUFFIX = {"counter": "_total"}


def floatToGoString(value: float) -> str:
    """prometheus_client's Go float format (its function is untyped)."""
    text: str = _float_to_go_string(value)  # type: ignore[no-untyped-call]
    return text


@functools.lru_cache(maxsize=4096)
def _metric_name(name: str) -> str:
    return escape_metric_name(name)


@functools.lru_cache(maxsize=4096)
def _label_name(name: str) -> str:
    return escape_label_name(name)


class _One(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def render_metrics(metrics: Iterable[Metric]) -> str:
    """The text exposition of ``metrics``, the same text prometheus_client's
    ``generate_latest`` writes (labels sorted by name, names escaped by its rule, values in
    its Go float format), for the price of a fraction: the escaped form of each metric and
    label name is computed once per name instead of once per sample (tests/test_promclient.py
    checks the two agree). Families of other types are written by ``generate_latest``."""
    out: list[str] = []
    for metric in metrics:
        mtype = _TYPES.get(metric.type)
        if mtype is None or any(
            s.name != metric.name + _SUFFIX.get(metric.type, "") and s.name != metric.name
            for s in metric.samples
        ):
            out.append(generate_latest(_One(metric)).decode("utf-8"))
            continue
        name = _metric_name(metric.name + _SUFFIX.get(metric.type, ""))
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        for sample in metric.samples:
            sname = _metric_name(sample.name)
            if sample.labels:
                labels = _label_block(sample.labels)
                line = f"{sname}{{{labels}}} {floatToGoString(sample.value)}"
            else:
                line = f"{sname} {floatToGoString(sample.value)}"
            if sample.timestamp is not None:
                line += f" {int(float(sample.timestamp) * 1000):d}"
            out.append(line + "\n")
    return "".join(out)
