"""GPU / Enricher: dcgm-enricher itself. Its sources, durations and errors, what it costs the
nodes, and what its series cost Prometheus."""

from __future__ import annotations

from . import panels
from .common import (
    CL,
    SELF_FILTER,
    Board,
    Row,
    Target,
    _series,
    drill,
    own_process,
    sel,
    with_links,
)

TODAY = (
    "Sources up (worst node)",
    "Enrichers reporting",
    "Pod watch age",
    "Upstream lines dropped",
    "Sources per enricher",
    "Source duration (slowest enricher)",
    "Source errors",
    "GPU processes",
    "Enricher CPU (millicores)",
    "Enricher memory (RSS)",
    "Upstream requests per collection",
    "Scrapes, upstream requests and collections",
    "Bytes sent to scrapers",
)


def rows() -> list[Row]:
    today = [panels.panel("dcgm-enricher", title) for title in TODAY]
    with_links(today[4], {"node": drill("node", "node")})
    series = own_process(sel("scrape_samples_scraped", *SELF_FILTER))
    duration = own_process(sel("scrape_duration_seconds", *SELF_FILTER))
    cost = [
        _series(
            "Series per enricher",
            "Samples each scrape of an enricher returns (Prometheus's scrape_samples_scraped): "
            "the largest enricher's and the fleet's sum, what the enrichers cost Prometheus's "
            "head (docs/performance.md).",
            Target(f"max by ({CL}) ({series})", "largest enricher"),
            Target(f"sum by ({CL}) ({series})", "all enrichers"),
            width=12,
        ),
        _series(
            "Scrape duration",
            "How long Prometheus takes to scrape an enricher (scrape_duration_seconds): the "
            "slowest and the average.",
            Target(f"max by ({CL}) ({duration})", "slowest enricher"),
            Target(f"avg by ({CL}) ({duration})", "average"),
            unit="s",
            width=12,
        ),
    ]
    return [Row("dcgm-enricher", today), Row("Scrape cost", cost)]


BOARD = Board(
    "enricher",
    "dcgm-enricher-self.json",
    "dcgm-enricher itself: its data sources, durations and errors on every node, its CPU, "
    "memory and upstream load, and the series and scrape time it costs Prometheus.",
    ("datasource", "label_prefix", "cluster"),
    rows,
)
