"""Which ticks of a partition-local timer run (`Runtime.ticks`): at most one per partition per half
interval, by the worker's clock when the tick is handled.

A timer sends one tick per owned partition every MEMSTREAM_TIMER_INTERVAL_S, through an internal
topic that the worker reads with its inputs. While it works through a backlog (a restart after an
outage, many partitions on few workers) the ticks queue behind the input records and then arrive
together: a restarted worker handled a minute of queued ticks in a row, each a sweep of its
partition, and applied a few records a second meanwhile (issue 34, bench/RESULTS.md). A tick
handled less than half an interval after the previous tick of its partition does nothing (it is
acknowledged as handled); the next one comes an interval later. Ticks sent on time are an
interval apart and all run. Nothing is lost by skipping: a tick carries only the time it was
sent, and each handler (a housekeeping sweep, the analytics publish) looks at the partition's
state as it is when it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TickGate:
    """Whether a tick of a partition runs now (`due`); one gate per timer."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_gap_s = interval_s / 2
        self.clock = clock
        self._last: dict[int, float] = {}
        self.skipped = 0  #: ticks that did nothing so far

    def due(self, partition: int) -> bool:
        """True (and the partition's last run is now) unless the partition's last tick ran less
        than half an interval ago."""
        now = self.clock()
        last = self._last.get(partition)
        if last is not None and now - last < self.min_gap_s:
            self.skipped += 1
            return False
        self._last[partition] = now
        return True
