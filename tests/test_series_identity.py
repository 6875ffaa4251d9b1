"""Regression: two upstream series that Prometheus would store as one must leave as one.

Prometheus sorts labels and treats an empty label as absent, so the rewrite dedupes on that
identity, not on the text of the label block (found by the CI hypothesis profile).
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enricher.labels import RewritePlan
from enricher.rewrite import Rewriter

UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            f'C{{UUID="{UUID}"}} 1\nC{{UUID="{UUID}",pod="",namespace="",container=""}} 2\n',
            id="guards-added-vs-present-in-other-order",
        ),
        pytest.param('C{A=""} 1\nC 2\n', id="empty-label-vs-none"),
        pytest.param('C{a="1",b="2"} 1\nC{b="2",a="1"} 2\n', id="same-labels-other-order"),
    ],
)
def test_one_series_per_prometheus_identity(text: str) -> None:
    result = Rewriter().rewrite(text, RewritePlan())
    samples = [s for f in text_string_to_metric_families(result.text) for s in f.samples]
    assert [s.value for s in samples] == [1]
    assert result.dropped_duplicates == 1
