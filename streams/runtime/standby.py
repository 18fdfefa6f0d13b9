"""Standby replicas applied by a librdkafka consumer (issue 14): MEMSTREAM_STANDBY_APPLY=librdkafka.

A worker keeps a standby copy of table partitions other workers own (MEMSTREAM_STANDBY_REPLICAS),
so that taking one over after a failure reads only the changelog written since. Faust applies a
standby's changelog records through its per-record path: aiokafka's Python fetcher makes a
`ConsumerRecord` of each, Faust a `Message` and an `Event`, the conductor queues it, and its
recovery loop takes it back with an `asyncio.wait_for` (a task and a loop turn per record) before
it writes the bytes into RocksDB unchanged. Measured on the bench (two workers, 300 users,
bench/RESULTS.md "Issue 14, stop 21"): 0.08 ms of CPU per input record, a fifth of a two-worker
fleet's CPU, for a copy of bytes.

Here a worker's standby partitions of its RocksDB tables are read instead by one librdkafka
consumer in its own thread (no consumer group: assigned, never committed) and written as they
come, `WriteBatch` by `WriteBatch`, into the same partition stores with the same key and value
bytes Faust would write, and, in the same batch, the offset Faust keeps in each partition store
(`Store.set_persisted_offset`: the offset of the last record applied). So a standby partition
that becomes active is recovered by Faust exactly as before: from that offset on.

- Faust still assigns the standbys (its assignor) and opens their stores; it never fetches them:
  `RebalanceSafeConsumer.resume_partitions` leaves the partitions this module `claims` paused.
- The thread starts once a rebalance is complete (Faust's recovery done) at the offset after the
  persisted one, and stops, joined, before Faust touches its stores at the next rebalance (the
  consumer's `on_partitions_revoked` / `on_partitions_assigned`, before Faust's own) and when the
  worker stops. A failed thread (a RocksDB write error, a fatal consumer error) is logged and
  counted (`memstream_standby_total{event="apply_failed"}`); the copy then stays where it was, and a takeover reads more
  of the changelog: nothing is lost.
- Other stores (`memory://`) and MEMSTREAM_STANDBY_APPLY=faust keep Faust's path.

The grouping of fetched records into writes (`partition_writes`) is plain Python, tested without
Kafka; the thread is tested against a real broker (tests/runtime/test_standby_kafka.py) and by
the failover fault test.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .fetched import reading, records_of
from .loglimit import Throttled
from .restore import Batch, write_run
from .thread_names import name_os_thread

log = logging.getLogger("memstream.standby")

POLL_S = 0.1  #: the thread's longest wait for records (also how soon it sees a stop)
OFFSET_BEGINNING = -2  #: librdkafka's logical offset: the partition's first record
WARN_EVERY_S = 10.0  #: at most one warning line per this many seconds for non-fatal consumer errors
LAG_EVERY_S = 1.0  #: how often the thread measures how far behind the replicas are (`remaining`)


@dataclass(frozen=True)
class Replica:
    """One standby partition of a table: where its rows go and where reading starts."""

    topic: str  #: the table's changelog topic
    partition: int
    db: Any  #: the partition store (a rocksdict `Rdict`, raw keys and values)
    start: int  #: the first offset to read (`OFFSET_BEGINNING` when none was applied yet)


def partition_writes(records: Iterable[tuple[str, int, int, bytes | None, bytes | None]]
                     ) -> dict[tuple[str, int], Batch]:
    """(topic, partition, offset, key, value) records, in fetch order, grouped by partition in
    that order: each partition's rows (a value puts, a tombstone deletes) and its last offset.
    A record without a key (no table writes one) is left out but still moves the offset."""
    out: dict[tuple[str, int], Batch] = {}
    for topic, partition, offset, key, value in records:
        batch = out.get((topic, partition))
        if batch is None:
            batch = out[(topic, partition)] = Batch()
        if key is not None:
            batch.puts.append((key, value))
            batch.size += len(key) + len(value or b"")
        batch.last = max(batch.last, offset)
    return out


class StandbyApplier:
    """The thread that keeps one worker's claimed standby partitions up to date."""

    def __init__(self, config: Mapping[str, Any], batch_max: int, count: Any = None) -> None:
        self.config = dict(config)
        self.batch_max = batch_max
        self._count = count or (lambda _name, _n=1: None)
        self._applying: threading.Thread | None = None
        self._stopping = threading.Event()
        self._next: dict[tuple[str, int], int] = {}  #: the next offset to apply, per replica
        self._behind = 0
        #: non-fatal consumer errors (librdkafka retries them; a broker that is away reports one
        #: with every poll): at WARNING once per `WARN_EVERY_S`, every one at debug
        self._warn = Throttled(log, logging.WARNING, WARN_EVERY_S)
        self.replicas: list[Replica] = []  #: the claimed replicas, from `start` until `stop`
        self.applied = 0  #: records applied since the worker started
        self.failed: str | None = None  #: why the current thread stopped early

    @property
    def running(self) -> bool:
        return self._applying is not None and self._applying.is_alive()

    def start(self, replicas: list[Replica]) -> None:
        """Apply `replicas` from their start offsets (the previous thread must be stopped)."""
        assert not self.running, "standby applier started twice"
        self.replicas, self.failed, self._behind = list(replicas), None, 0
        self._next = {(r.topic, r.partition): r.start for r in replicas}
        if not replicas:
            return
        self._stopping.clear()
        self._applying = threading.Thread(target=self._run, args=(self.replicas,), name="memstream-standby",
                                        daemon=True)
        self._applying.start()
        log.info("standby replicas applied by librdkafka: %s",
                 ", ".join(f"{r.topic}[{r.partition}]@{r.start}" for r in replicas))

    async def stop(self) -> None:
        """Stop the thread and wait for it (its last batch is written or not at all)."""
        thread = self._applying
        if thread is None:
            return
        self._stopping.set()
        await asyncio.get_running_loop().run_in_executor(None, thread.join)
        self._applying, self.replicas, self._behind = None, [], 0

    def stop_now(self) -> None:
        """`stop` outside the event loop (tests, the worker's last resort)."""
        if self._applying is not None:
            self._stopping.set()
            self._applying.join()
            self._applying, self.replicas, self._behind = None, [], 0

    def remaining(self) -> int:
        """Changelog records the claimed replicas were behind when the thread last looked (the
        broker's high watermarks of its last fetches; at most `LAG_EVERY_S` old while it runs).
        A thread that failed keeps reporting the lag it measured last, until the next rebalance
        starts it again: its copies are not caught up, and `/health` must not say they are."""
        return self._behind if self.replicas else 0

    def _measure_lag(self, consumer: Any) -> None:
        """(In the thread: a confluent-kafka consumer is not called from two threads at once.)"""
        from confluent_kafka import TopicPartition

        behind = 0
        for (topic, partition), at in self._next.items():
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            except Exception:  # noqa: BLE001,S112 - a gauge: unknown counts as nothing behind
                continue
            start = at if at >= 0 else low  # a replica not yet begun is behind by the whole partition
            if high >= 0 and start >= 0:
                behind += max(0, high - start)
        self._behind = behind

    # ------------------------------------------------------------------------- the thread
    def _run(self, replicas: list[Replica]) -> None:
        from confluent_kafka import TopicPartition

        name_os_thread("ms-standby")

        dbs = {(r.topic, r.partition): r for r in replicas}
        lag_at = 0.0
        with reading(self.config, lambda reason: self._fail(reason, consumer)) as consumer:
            consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in replicas])
            while not self._stopping.is_set():
                messages = consumer.consume(self.batch_max, POLL_S)
                if messages:
                    self._apply(messages, dbs)
                if time.monotonic() >= lag_at:
                    self._measure_lag(consumer)
                    lag_at = time.monotonic() + LAG_EVERY_S

    def _apply(self, messages: list[Any], dbs: Mapping[tuple[str, int], Replica]) -> None:
        import rocksdict

        def new_batch() -> Any:
            return rocksdict.WriteBatch(raw_mode=True)

        records = [(m.topic(), m.partition(), m.offset(), m.key(), m.value())
                   for m in records_of(messages, self._warn, "standby replica")]
        for tp, batch in partition_writes(records).items():
            write_run(dbs[tp].db, batch, new_batch)  # the rows and Faust's persisted offset, atomically
            self._next[tp] = batch.last + 1
            self.applied += len(batch.puts)
            self._count("standby:applied", len(batch.puts))

    def _fail(self, reason: str, consumer: Any) -> None:
        try:  # the lag it stops at, for /health (the copies only fall further behind)
            self._measure_lag(consumer)
        except Exception:  # noqa: BLE001,S110 - a gauge
            pass
        self.failed = reason
        self._count("standby:apply_failed")
        log.error("standby replicas stopped (%s): they stay at the offsets applied so far, and a takeover "
                  "reads the changelog from there; the next rebalance starts them again", reason)
