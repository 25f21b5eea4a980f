"""`Progress`: rate-limited log lines for long work (runs, recovery scans, replays); the live bars are
`cec.progress` tasks."""

from __future__ import annotations

import logging
import time

__all__ = ["Progress"]

log = logging.getLogger("operators.runtime")  # the logger these lines always came from


class Progress:
    """Rate-limited progress messages for long work (runs, recovery scans, replays), logged at INFO;
    the live bars (total, rate, ETA) are `cec.progress` tasks, shown by the reporter the CLI installs."""

    def __init__(self, label: str, *, enabled: bool = True, every_s: float = 2.0) -> None:
        self.label = label
        self.enabled = enabled
        self.every_s = every_s
        self._last = time.monotonic()
        self._started = self._last

    def __call__(self, message: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= self.every_s):
            self._last = now
            log.info("[%s +%6.1fs] %s", self.label, now - self._started, message)
