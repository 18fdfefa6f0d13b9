"""Restore ahead: the tables' changelogs copied into the local stores in bulk, before the worker
joins the group (MEMSTREAM_RESTORE_AHEAD).

Faust restores a table partition record by record: every changelog row passes its consumer,
its per-message recovery bookkeeping and a JSON decode it never uses, about 100 µs per row
(bench/RESULTS.md, "recovery and bounded memory"): 1M memory nodes took ~110 s on an idle
2-core VM before `/health` was ready. A worker that starts with an empty data dir (its first
start, or any start after an unclean stop, which discards the local tables: `worker.py`) pays
that in full.

So before Faust starts, `restore_ahead` reads every partition of every table changelog, from
where the local store left it to the high watermark it saw when it began, with one librdkafka
consumer outside the consumer group (assigned partitions, nothing committed), and writes the
rows into the partition's RocksDB exactly as Faust's own restore does (raw key → raw value; a
tombstone deletes), in write batches. Faust then reads the persisted offset each batch left and
restores only what came after it: the rows written since, by the workers that own them.

Which partitions: all of them. Before joining, a worker cannot know which partitions it will
get, and with the default one standby replica a fleet of two holds every partition on each
worker anyway. In a larger fleet the partitions it does not get stay on disk unread (as Faust
itself leaves a revoked partition's store), and a later assignment restores only their tail.
MEMSTREAM_RESTORE_AHEAD=false leaves all of it to Faust.

Why a crash cannot leave a wrong store: each write batch holds a contiguous run of one
partition's changelog records, from the offset after the store's persisted one, *and* Faust's
persisted offset of the run's last record, and RocksDB applies a write batch atomically. So at
any moment a partition's store is exactly "the changelog up to its persisted offset", the same
invariant Faust's restore keeps, and a restore stopped anywhere (the deadline, an error, a
SIGKILL) leaves Faust a correct place to go on from. That is also why the worker sets its
`.running` mark (whose presence at start discards the local tables) only after the restore
ahead: a worker killed during the copy (an orchestrator's liveness probe, a deploy) keeps what it
copied, and its next start copies only the rest. Meanwhile the worker's web port answers
`/health/live` (streams/runtime/restoring_http.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("memstream.restore")

#: Faust's key of a partition store's persisted offset (faust-streaming 0.15.3 `Store.offset_key`).
OFFSET_KEY = b"__faust\0offset__"


@dataclass(frozen=True)
class Span:
    """What one changelog partition needs: records `start` .. `end - 1` (`end`: the high watermark)."""

    topic: str
    partition: int
    start: int
    end: int


def span_to_restore(topic: str, partition: int, persisted: int | None, low: int, high: int) -> Span | None:
    """The records a partition store lacks, or None when it lacks none (or is ahead of the
    changelog, which Faust's own consistency check reports). `persisted` is Faust's persisted
    offset: that of the last record the store holds."""
    start = low if persisted is None else max(low, persisted + 1)
    if persisted is not None and persisted >= high:
        return None
    if start >= high:
        return None
    return Span(topic, partition, start, high)


@dataclass
class Batch:
    """The rows of one partition waiting to be written, with the offset of the last one."""

    puts: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    size: int = 0
    last: int = -1


def write_run(db: Any, batch: Batch, new_batch: Callable[[], Any]) -> None:
    """A run of one partition's changelog rows into its store `db` (raw key -> raw value; a
    tombstone deletes) and the run's last offset as Faust's persisted offset, in one atomic write
    batch: the store is then always "the changelog up to its persisted offset" (also the
    standby replicas' write: streams/runtime/standby.py)."""
    wb = new_batch()
    for key, value in batch.puts:
        if value is None:
            wb.delete(key)
        else:
            wb.put(key, value)
    wb.put(OFFSET_KEY, str(batch.last).encode())
    db.write(wb)


@dataclass
class Report:
    """What a restore ahead did: rows written, partitions it had to read, how long, whether it
    read every span to its end (False: stopped at the deadline)."""

    rows: int = 0
    partitions: int = 0
    seconds: float = 0.0
    complete: bool = True
    #: (topic, partition) -> the offset the store holds now (its persisted offset)
    persisted: dict[tuple[str, int], int] = field(default_factory=dict)


#: without the write-ahead log, a store's copied runs are flushed to disk at least this often, so a
#: kill during the restore loses at most about this much of the copy (the next start goes on from
#: what was flushed)
FLUSH_EVERY_S = 1.0


class PartitionStores:
    """The RocksDB store of each changelog partition, opened with the options Faust opens it with
    (and closed again: Faust opens it itself once it starts). `flush_every_s` (stores opened
    without the write-ahead log): a store is flushed after its first run, then whenever it was
    last flushed that long ago."""

    def __init__(self, opener: Callable[[str, int], Any], flush_every_s: float | None = None) -> None:
        self._opener = opener
        self._open: dict[tuple[str, int], Any] = {}
        self._flush_every_s = flush_every_s
        self._flushed: dict[tuple[str, int], float] = {}

    def get(self, topic: str, partition: int) -> Any:
        key = (topic, partition)
        if key not in self._open:
            self._open[key] = self._opener(topic, partition)
            self._flushed[key] = float("-inf")  # the first run is flushed at once: progress from the start
        return self._open[key]

    def persisted(self, topic: str, partition: int) -> int | None:
        raw = self.get(topic, partition).get(OFFSET_KEY)
        return None if raw is None else int(raw)

    def write(self, topic: str, partition: int, batch: Batch, new_batch: Callable[[], Any]) -> None:
        """The batch's rows and its last offset as Faust's persisted offset, in one atomic write."""
        db = self.get(topic, partition)
        write_run(db, batch, new_batch)
        if self._flush_every_s is not None:
            now = time.monotonic()
            if now - self._flushed[(topic, partition)] >= self._flush_every_s:
                db.flush()  # the runs so far outlive a kill, without the log
                self._flushed[(topic, partition)] = now

    def close(self) -> None:
        for db in self._open.values():
            db.close()
        self._open.clear()


def _no_retry(call: Callable[[], Any], what: str) -> Any:
    return call()


def restore_ahead(consumer: Any, stores: PartitionStores, new_batch: Callable[[], Any],
                  partitions: Mapping[str, Iterable[int]], *, deadline_s: float, batch_rows: int,
                  batch_bytes: int, progress_every_s: float = 5.0,
                  retrying: Callable[[Callable[[], Any], str], Any] = _no_retry,
                  progress: Callable[[int, int], None] | None = None) -> Report:
    """Copy the changelog records each partition store lacks into it (see the module docstring).

    `consumer` is a confluent-kafka Consumer outside any group; `partitions` maps each changelog
    topic to its partitions. Stops at `deadline_s` with what it has written (Faust restores the
    rest); a partition's rows are written at the latest every `batch_rows` rows / `batch_bytes`.
    `retrying(call, what)` retries a metadata call on transient broker errors (a new topic's
    leader not elected yet: NOT_LEADER_FOR_PARTITION), with a bound. `progress(rows, total)` is
    told the rows written so far after every write."""
    from confluent_kafka import KafkaError, TopicPartition

    started = time.monotonic()
    report = Report()
    spans: dict[tuple[str, int], Span] = {}
    for topic, parts in partitions.items():
        for p in parts:
            tp = TopicPartition(topic, p)
            low, high = retrying(lambda: consumer.get_watermark_offsets(tp, timeout=15),  # noqa: B023 -- called here
                                 f"watermarks of {topic}[{p}]")
            span = span_to_restore(topic, p, stores.persisted(topic, p), low, high)
            if span is not None:
                spans[(topic, p)] = span
    total = sum(s.end - s.start for s in spans.values())  # an upper bound: compaction leaves gaps
    report.partitions = len(spans)
    if not spans:
        return report
    log.info("restoring %d changelog partition(s) ahead of joining the group: up to %d record(s)", len(spans), total)
    if progress is not None:
        progress(0, total)
    consumer.assign([TopicPartition(s.topic, s.partition, s.start) for s in spans.values()])
    batches: dict[tuple[str, int], Batch] = {k: Batch() for k in spans}
    left = set(spans)
    next_progress = started + progress_every_s

    def flush(key: tuple[str, int]) -> None:
        batch = batches[key]
        if batch.puts:
            stores.write(key[0], key[1], batch, new_batch)
            report.rows += len(batch.puts)
            report.persisted[key] = batch.last
            batches[key] = Batch()
            if progress is not None:
                progress(report.rows, total)

    try:
        while left:
            now = time.monotonic()
            if now - started > deadline_s:
                report.complete = False
                log.warning("restore ahead: stopped at its deadline (MEMSTREAM_RESTORE_AHEAD_TIMEOUT_S=%s) after "
                            "%d record(s); Faust restores the rest", deadline_s, report.rows)
                break
            if now >= next_progress:
                log.info("restore ahead: %d of up to %d record(s), %d partition(s) left, %.0f records/s",
                         report.rows, total, len(left), report.rows / max(now - started, 1e-9))
                next_progress = now + progress_every_s
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                key = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(key)
                    elif err.fatal() or key in left:  # a partition's own error (gone, not authorized)
                        raise RuntimeError(f"restore ahead: reading {key[0]}[{key[1]}] failed: {err}")
                    continue  # a client-wide event (a broker restarting): librdkafka retries; the deadline bounds it
                if key not in left:
                    continue  # fetched past the end before the partition was paused
                batch = batches[key]
                value = msg.value()
                k = msg.key()
                batch.puts.append((k, value))
                batch.size += len(k or b"") + len(value or b"")
                batch.last = msg.offset()
                if batch.last >= spans[key].end - 1:
                    left.discard(key)
                    consumer.pause([TopicPartition(key[0], key[1])])
                    flush(key)
                elif len(batch.puts) >= batch_rows or batch.size >= batch_bytes:
                    flush(key)
        for key in batches:
            flush(key)
    finally:
        report.seconds = time.monotonic() - started
    log.info("restore ahead: %d record(s) of %d partition(s) in %.1f s", report.rows, report.partitions, report.seconds)
    return report


# ------------------------------------------------------------------------------------------------
# the shell: the worker's tables and broker
# ------------------------------------------------------------------------------------------------

#: Most rows of one partition held before they are written (MEMSTREAM_RESTORE_AHEAD_BATCH_BYTES bounds their bytes).
BATCH_ROWS = 20_000


def open_partition_store(store: Any, partition: int, wal: bool) -> Any:
    """A partition's RocksDB store opened as Faust opens it (its options), with RocksDB's
    write-ahead log only when `wal` (MEMSTREAM_STATE_WAL), as the tables write: without it a
    restore needs no more disk than the tables and writes each row once. Safe for the same reason
    as the tables' writes: every run goes in one atomic batch with its persisted offset, so after a
    kill the store holds a prefix of the runs (the restore, or Faust's, goes on from its offset),
    and a clean close flushes what the log would have held."""
    from streams.runtime import faust_internals

    path = store.partition_path(partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = store.rocksdb_options.open(path)
    if not wal:
        db.set_write_options(faust_internals.no_wal_write_options())
    return db


def run(settings: Any, tables: Iterable[Any], progress: Callable[[int, int], None] | None = None) -> Report | None:
    """Restore ahead every RocksDB table of the worker (None: nothing to do, or turned off).
    A failure is logged and left to Faust's own restore: this only saves time. `progress` as
    for `restore_ahead`."""
    import rocksdict
    from confluent_kafka import Consumer

    from streams.runtime import faust_internals
    from streams.runtime.retry import retrying

    if not settings.restore_ahead:
        return None
    by_topic: dict[str, Any] = {}
    for table in tables:
        store = faust_internals.rocksdb_store(table)
        if store is not None:
            by_topic[table.changelog_topic.get_topic_name()] = store
    if not by_topic:
        return None

    def open_store(topic: str, partition: int) -> Any:
        return open_partition_store(by_topic[topic], partition, wal=settings.state_wal)

    consumer = Consumer({"bootstrap.servers": settings.broker, "group.id": f"{settings.app_id}-restore-ahead",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         # a span's start deleted meanwhile (retention): from what is left, never from the end
                         "auto.offset.reset": "earliest", "log_level": 0})
    stores = PartitionStores(open_store, flush_every_s=None if settings.state_wal else FLUSH_EVERY_S)
    try:
        metadata = retrying(lambda: consumer.list_topics(timeout=15), "list topics")
        partitions = {t: sorted(metadata.topics[t].partitions) for t in by_topic if t in metadata.topics}
        return restore_ahead(consumer, stores, lambda: rocksdict.WriteBatch(raw_mode=True), partitions,
                             deadline_s=settings.restore_ahead_timeout_s, batch_rows=BATCH_ROWS,
                             batch_bytes=settings.restore_ahead_batch_bytes,
                             retrying=lambda call, what: retrying(call, what, timeout=30.0), progress=progress)
    except Exception as exc:  # noqa: BLE001 - an optimization: Faust restores whatever this did not
        log.warning("restore ahead failed (%s: %s); Faust restores the tables from their changelogs",
                    type(exc).__name__, exc)
        return None
    finally:
        stores.close()
        consumer.close()
