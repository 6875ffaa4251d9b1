"""How every source logs its failures: once per failure episode, not once per scrape.

A source that fails on every scrape would otherwise repeat the same line every few seconds, and
one that only warns once per process lifetime hides the second outage. The rule, for every
source alike: the first failure of an episode at WARNING, repeats at DEBUG, the recovery at
INFO, and the next failure after a recovery starts a new episode (WARNING again).
"""

from __future__ import annotations

import logging
import threading


class EpisodeLog:
    """Failure episodes of one source, logged to ``logger`` as ``<name>: <message>``.

    Thread-safe: procfs and NVML fail in a worker thread, the pod watch in its own.
    """

    def __init__(self, name: str, logger: logging.Logger) -> None:
        self.name = name
        self.logger = logger
        self.failing = False
        self.episodes_total = 0  # episodes begun since start
        self._lock = threading.Lock()

    def fail(self, message: str) -> None:
        """One failure: WARNING when it begins an episode, else DEBUG."""
        with self._lock:
            first, self.failing = not self.failing, True
            if first:
                self.episodes_total += 1
        self.logger.log(logging.WARNING if first else logging.DEBUG, "%s: %s", self.name, message)

    def ok(self) -> None:
        """One success: ends the episode (INFO) if one is under way, else says nothing."""
        with self._lock:
            recovered, self.failing = self.failing, False
        if recovered:
            self.logger.info("%s: recovered", self.name)
