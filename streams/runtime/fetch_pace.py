"""How much a worker's fetch requests ask the broker to gather, from whether records are flowing.

A fetch that asks for 1 byte returns as soon as one record is there: a worker paced at 900
records/s then handles many small fetches and batches, and spent 72% of a core where one asking
for 64 KB (held at most 25 ms) spent 42% (bench/RESULTS.md, "Issue 14, stop 20"). But a fetch
held 25 ms makes an idle worker fetch 40 times a second (4.9% of a core instead of 1.5%). So the
consumer asks for the batch (MEMSTREAM_FETCH_MIN_BYTES, MEMSTREAM_FETCH_MAX_WAIT_MS) while
records arrive, and for Faust's 1 byte / 1500 ms once none came for MEMSTREAM_FETCH_QUIET_MS: the
first record after a quiet spell is answered at once, as before.

A flowing worker's fetch costs its consumer thread ~2 ms of CPU whatever it returns: aiokafka
builds each request and reads each response partition by partition in Python, and a worker fetches
every partition of every topic it reads (~90 in the bench's single worker). So the quiet spell
is short (500 ms): with 2000 ms, the flowing fetches after each burst were two fifths of the
same-job bench's fetches (bench/RESULTS.md, 2026-12-06). A longer MEMSTREAM_FETCH_MAX_WAIT_MS
would make fewer of them while records flow, at the price of latency: 100 ms cut the consumer
thread's CPU per record by two thirds and put p99 at half the sustained rate over 250 ms in three
runs of five.

During a backlog (a fetch handed the streams MEMSTREAM_FETCH_BACKLOG_RECORDS or more) a long wait
costs no latency: the records already fetched keep the worker busy, and the only partitions the
next requests fetch are those without buffered records (a worker's idle topics, mostly). So they
are held longer (MEMSTREAM_FETCH_BACKLOG_WAIT_MS), and a catching-up worker spends its consumer
thread's CPU on records rather than on requests that come back empty.
"""

from __future__ import annotations

#: what a quiet worker asks for: Faust's defaults (answered by the first record, else every 1.5 s)
QUIET = (1, 1500)


class FetchPace:
    """The (min bytes, max wait ms) a consumer's next fetch requests should ask for: `quiet` until
    records come, `flowing` while they do, `backlog` after a fetch handed at least
    `backlog_records` (until one hands fewer), `quiet` again after `quiet_after_s` without any."""

    def __init__(self, flowing: tuple[int, int], quiet_after_s: float, quiet: tuple[int, int] = QUIET,
                 backlog: tuple[int, int] | None = None, backlog_records: int = 0) -> None:
        self.flowing = flowing
        self.quiet = quiet
        self.quiet_after_s = quiet_after_s
        self.backlog = backlog if backlog is not None and backlog_records > 0 else None
        self.backlog_records = backlog_records
        self.current = quiet
        self._last_records = float("-inf")

    def observe(self, records: int, now: float, stream_records: int | None = None) -> tuple[int, int] | None:
        """After a fetch that returned `records` records at `now` (seconds, monotonic), of which
        `stream_records` (default: all) for the streams, the others a recovery's changelog rows:
        the new setting when it changes, else None. Only stream records make a backlog: a
        recovery is held back by long waits (its last partitions would come 1 MB per wait)."""
        if records > 0:
            self._last_records = now
            streamed = records if stream_records is None else stream_records
            want = self.backlog if self.backlog is not None and streamed >= self.backlog_records else self.flowing
        elif now - self._last_records >= self.quiet_after_s:
            want = self.quiet
        else:
            want = self.current
        if want == self.current:
            return None
        self.current = want
        return want
