"""A log line that repeats per record or per poll, written at most once per interval.

A burst (bad records dead-lettered, a broker away that librdkafka reports with every poll) would
otherwise cost more in logging than in processing. The first line of a burst and then one per
interval are logged at their level, each saying how many were held back since the one before;
every one is logged at debug."""

from __future__ import annotations

import logging
import time
from typing import Any


class Throttled:
    """One repeating log line of `logger`, at `level` at most once per `interval_s` seconds."""

    def __init__(self, logger: logging.Logger, level: int, interval_s: float) -> None:
        self.logger, self.level, self.interval_s = logger, level, interval_s
        self._logged_at = float("-inf")  #: when the line was last logged at `level`
        self._held = 0  #: lines logged at debug only since then

    def log(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._logged_at >= self.interval_s:
            more = f" (and {self._held} more since the last such line)" if self._held else ""
            self.logger.log(self.level, msg + "%s", *args, more)
            self._logged_at, self._held = now, 0
        else:
            self._held += 1
            self.logger.debug(msg, *args)
