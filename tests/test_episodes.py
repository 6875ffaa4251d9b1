"""The episode log every source shares: WARNING, DEBUG while it lasts, INFO, WARNING again."""

from __future__ import annotations

import logging

import pytest

from enricher.episodes import EpisodeLog


@pytest.mark.parametrize(
    ("events", "levels"),
    [
        pytest.param("ooo", [], id="never-failing-says-nothing"),
        pytest.param("fff", ["WARNING", "DEBUG", "DEBUG"], id="one-episode"),
        pytest.param("ffo", ["WARNING", "DEBUG", "INFO"], id="recovery"),
        pytest.param("fofo", ["WARNING", "INFO", "WARNING", "INFO"], id="warns-again"),
        pytest.param("foof", ["WARNING", "INFO", "WARNING"], id="one-recovery-line"),
    ],
)
def test_levels(events: str, levels: list[str], caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("enricher.test-episodes")
    episodes = EpisodeLog("src", logger)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        for event in events:
            episodes.fail("broken") if event == "f" else episodes.ok()
    assert [r.levelname for r in caplog.records] == levels
    assert all(r.getMessage() in ("src: broken", "src: recovered") for r in caplog.records)
    assert episodes.episodes_total == levels.count("WARNING")
    assert episodes.failing == (events[-1] == "f")
