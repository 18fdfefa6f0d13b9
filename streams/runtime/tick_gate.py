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

The ticks of one round are spread over the interval (`tick_offsets`), those of every timer of the
worker interleaved: sent all at once, the handlers of every partition and timer ran back to back,
a second of sweeps and publishes (and the memory state's lock held by the sweeps) every interval,
which the records arriving meanwhile waited out (p99 end-to-end ~0.8-1 s at half the sustained
rate, ~0.2 s with the timers off; bench/RESULTS.md).
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


def tick_offsets(partitions: int, timer: int, timers: int, interval_s: float) -> list[float]:
    """When, in seconds after a round begins, timer number `timer` (of `timers`) sends the tick of
    each of `partitions` partitions (in partition order): the round's `partitions * timers` ticks
    evenly spaced over the interval, the timers' ticks interleaved, each partition's tick at the
    same offset every round (an interval apart)."""
    if not 0 <= timer < timers:
        raise ValueError(f"timer {timer} of {timers}")
    slots = partitions * timers
    return [(i * timers + timer) * interval_s / slots for i in range(partitions)]
