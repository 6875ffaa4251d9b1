"""The load test (tools/load.py) in its quick form: 50 scrapers for about five seconds.

Real parts: the enricher's app in its own process on the demo's simulated node, a slow
dcgm-exporter stand-in (200 ms per answer) and aiohttp clients, all on loopback. The
assertions are about correctness and bounds, never about speed: latency figures depend on the
machine and belong to the full run's report (python -m tools.load).
"""

from __future__ import annotations

import pytest

from tools.load import LoadConfig, format_result, run_load

MIB_GROWTH_LIMIT = 32.0


@pytest.mark.parametrize(
    "follow_step", [pytest.param(None, id="default-following"), pytest.param(0.0, id="per-scrape")]
)
async def test_fifty_scrapers_share_upstream_fetches_without_errors(
    follow_step: float | None,
) -> None:
    cfg = LoadConfig(scrapers=50, duration=5.0, upstream_delay=0.2, follow_step=follow_step)
    result = await run_load(cfg)
    print(format_result(result, "tests/test_load.py"))
    assert result.errors == 0, result.first_error
    assert result.degraded == 0  # the slow upstream never timed out
    assert result.scrapes >= cfg.scrapers
    assert result.upstream_requests >= 1
    # Scrapes never multiply upstream requests: following polls on the upstream's rhythm,
    # whatever the scrapers do; per scrape, concurrent scrapes join the one in flight.
    assert result.upstream_requests * 10 <= result.scrapes
    if follow_step == 0:
        assert result.shared_scrapes >= result.scrapes - result.upstream_requests
    # Memory stays bounded under load.
    assert result.rss_after_mib - result.rss_before_mib <= MIB_GROWTH_LIMIT
