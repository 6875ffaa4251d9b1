"""Configs shared by the tests that drive the app's Scraper directly."""

from __future__ import annotations

from enricher.config import Config

# The product follows the upstream by default (--upstream.follow-step): dcgm-exporter is
# fetched right after each of its collections and the node side read with it, so a change
# shows on the scrape after the next collection. Tests of how each source fails and recovers
# check what the very next scrape sees, which is the per-scrape mode; following itself is
# tested in tests/test_follow.py and tests/test_refresh.py, and both modes are checked to
# serve the same bytes.
PER_SCRAPE = Config(upstream_follow_step=0.0)
