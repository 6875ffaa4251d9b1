"""Configs shared by the tests that drive the app's Scraper directly."""

from __future__ import annotations

from typing import Any

from enricher.config import Config
from enricher.model import ProcError, ProcInfo
from enricher.sources import ReadResult

# The product follows the upstream by default (--upstream.follow-step): dcgm-exporter is
# fetched right after each of its collections and the node side read with it, so a change
# shows on the scrape after the next collection. Tests of how each source fails and recovers
# check what the very next scrape sees, which is the per-scrape mode; following itself is
# tested in tests/test_follow.py and tests/test_refresh.py, and both modes are checked to
# serve the same bytes.
PER_SCRAPE = Config(upstream_follow_step=0.0)


class NoProcs:
    """The procfs source with no GPU process to read (these tests have the GPU side off)."""

    name = "procfs"
    enabled = True
    errors_total = 0

    def read(
        self, pids: Any, listed_at: float | None = None
    ) -> ReadResult[dict[int, ProcInfo | ProcError]]:
        return ReadResult({})

    def close(self) -> None:
        pass
