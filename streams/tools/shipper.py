"""`memstream ship-graph-logs DIR`: tail a directory of graph event logs into `graph.events.v1`
(SPEC §4.9).

The graph engine's recorder appends one JSON line per event to `DIR/graph-events-{hash}.ndjson`
(`hash` = first 12 hex chars of SHA-256 of the graph id). The shipper follows every such file like
`tail -F` — files that appear later, lines appended later; a truncated or replaced (new inode) file
is read again from its start (streams/graphs/shipper_state.py) — and sends each complete line:

- a valid line → `graph.events.v1`, key = its `graphId`, value = the GraphEvent in the wire format
  (Confluent framing with a registry, single-object encoding without; schemas registered once at
  startup), headers `memstream.event_id` (a deterministic id of the line: SHA-256 of file name,
  byte offset and bytes), `memstream.source.file`, `memstream.source.offset`;
- a line that is not a GraphEvent (torn write, bad JSON, wrong types, unknown kind), a line whose
  `graphId` does not hash to the file's name, or one the Avro encoder refuses → `pipeline.dlq.v1`
  as a DeadLetter: `original_topic` = `file:<name>`, `original_partition` = -1 (a file has none),
  `original_offset` = the line's byte offset, `original_key` = null, `original_value` = the line's
  bytes (without its newline), stage `ship`, `error_class` = `ship.<ParseError kind>` /
  `ship.wrong_file` / `ship.encode` / `ship.too_large` (a line over the producer's message size:
  its first 64 KiB are kept), the reason in words, `__connect.errors.*` headers. The DLQ
  record's Kafka key is the file name, so one file's dead letters stay in order;
- a blank line is skipped (counted in the batch log line; it carries no record).

Delivery guarantee: exactly once per line on the topic, for read_committed readers
-------------------------------------------------------------------------------------
Per file, lines go out in batches of at most `MEMSTREAM_SHIPPER_BATCH_LINES` (default 500), each
in one Kafka transaction together with the file's new position (inode + byte offset past the
batch's last line), a record keyed `<shipper id>/<file name>` on the compacted topic
`shipper.positions.v1`. The transactional producer's `transactional.id` is
`memstream-shipper-<shipper id>`; the id is `--id`, by default `<DIR name>-<sha256(real path of
DIR)[:12]>`, so it is stable across restarts. At startup the shipper calls `init_transactions`,
which fences any earlier shipper with that id (a zombie can no longer commit) and aborts its open
transaction; then it reads its committed positions back with `isolation.level=read_committed`
(every partition of the positions topic up to its high watermark; the latest record per key). So:

- a restart resumes at the committed position: no line is lost;
- a crash (SIGKILL included) before a batch's commit leaves an open transaction that the restart
  aborts: none of its records (events, dead letters, position) is visible to a read_committed
  consumer, and the batch is shipped again in a transaction that commits. Each line is on
  `graph.events.v1` (or `pipeline.dlq.v1`) exactly once *as a read_committed consumer sees the
  topic*. The aborted copies stay in the log, skipped by read_committed readers; a
  read_uncommitted reader sees them (with the same per-line ids). The worker reads
  read_committed (streams/runtime/rebalance.py), and librdkafka consumers do by default;
- a failed commit or delivery (broker down) aborts the transaction (or, when the outcome is
  unknown, starts a new producer, whose `init_transactions` settles it) and re-reads the
  committed positions: `--once` exits with an error; the follow mode logs it and retries after
  the poll interval;
- a second shipper started with the same id fences the first, which stops with an error;
- positions of files that disappear from DIR are forgotten (a tombstone; a later file of that
  name starts from its beginning).

A shipper killed and not restarted leaves its transaction open until the broker aborts it after
`MEMSTREAM_SHIPPER_TRANSACTION_TIMEOUT_S`; until then read_committed readers of the partitions it
wrote to wait at that point (the last stable offset). Restarting the shipper ends it at once.

Upgrading from the offsets-file shipper: at startup, if Kafka holds no position for this shipper
and an offsets file of the earlier version exists (`--offsets FILE`, or the default
`MEMSTREAM_SHIPPER_OFFSETS_DIR/<shipper id>.offsets.json`), its positions are imported in one
transaction and the file is renamed to `FILE.imported`. The file is not written any more.

Progress: one log line per batch shipped (file, lines, events, dead letters, byte range, offset).
`--once` ships what is there and exits; otherwise the shipper polls every `--poll` seconds until
SIGINT or SIGTERM, finishes the batch in hand, and exits 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from streams.contracts import catalog, deadletter
from streams.contracts.wire import CodecFactory, RegistryError, WireFormatError, encode_key
from streams.core.limits import DEFAULT_LIMITS, Limits
from streams.core.repartition import is_move_tombstone
from streams.graphs import paths
from streams.graphs.shipper_state import (
    HEADER_LINE_ID,
    HEADER_SOURCE_FILE,
    HEADER_SOURCE_OFFSET,
    Batch,
    Line,
    OffsetsFileError,
    Position,
    line_id,
    list_event_files,
    load_offsets,
    poll_file,
    position_from_record,
    position_key,
    position_record,
)
from streams.graphs.state import RECENT_IDS
from streams.runtime.topology import Producer
from streams.settings import Settings

log = logging.getLogger("memstream.shipper")

PRODUCER = Producer(
    "graph-log shipper", __name__,
    "`memstream ship-graph-logs DIR`: each graph-events-*.ndjson line, and the file positions, in one transaction.",
    sinks=(catalog.GRAPH_EVENTS, catalog.SHIPPER_POSITIONS, catalog.DLQ),
)

READ_BYTES = 256 * 1024  # bytes read from a file per poll (a longer single line is still read whole)
DLQ_PARTITION = -1  # a file line has no partition
BROKER_CHECK_TIMEOUT_S = 10.0  # how long startup waits for the broker's metadata
MAX_DLQ_VALUE = 64 * 1024  # a line too large to send is dead-lettered with its first 64 KiB
FILE_TOPIC_PREFIX = "file:"
TRANSACTIONAL_ID_PREFIX = "memstream-shipper-"
SHIPPER_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")


#: How long a fatal producer error waits for its cause (fenced or not) to be reported.
FATAL_CAUSE_WAIT_S = 2.0


class ShipperError(RuntimeError):
    """Something the user can fix: the directory is missing, the broker or registry is unreachable,
    a topic is missing, an old offsets file to import is damaged, a setting is out of range."""


class DeliveryError(ShipperError):
    """A batch's transaction may not have committed (broker unreachable, a record refused); the
    shipper re-reads its committed positions before it ships again."""


class FencedError(ShipperError):
    """Another shipper with the same id started: this one can no longer commit and stops."""


class RecordTooLargeError(ValueError):
    """The producer refuses a record as larger than its maximum message size (a line's fault)."""


# --------------------------------------------------------------------------------------------
# where records go


class Sink(Protocol):
    """What the shipper produces to, in transactions: the records produced since the last
    `commit` become visible together with the position changes `commit` is given, or not at all."""

    def load_positions(self) -> dict[str, Position]:
        """This shipper's committed positions (file name → position)."""

    def produce(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        """Queue one record in the open transaction; raises `RecordTooLargeError` if it can never
        be sent (the transaction goes on), `DeliveryError` if the transaction failed."""

    def commit(self, changes: dict[str, Position | None]) -> None:
        """Commit the transaction: every record produced since the last commit plus the new
        position of each file in `changes` (None: forget the file). Raises `DeliveryError` if it
        may not have committed (the caller re-reads the positions), `FencedError` if another
        shipper with this id took over."""

    def abort(self) -> None:
        """Discard what was produced since the last commit."""


def _fenced(err) -> bool:
    from confluent_kafka import KafkaError

    codes = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    return err.code() in codes or "fenced" in err.str().lower()


class KafkaSink:
    """A transactional confluent-kafka producer (murmur2 partitioning like the Java client, acks=all,
    idempotent) and the shipper's positions on `shipper.positions.v1`."""

    def __init__(self, broker: str, shipper_id: str, codecs: CodecFactory, transaction_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.broker = broker
        self.shipper_id = shipper_id
        self.transactional_id = TRANSACTIONAL_ID_PREFIX + shipper_id
        self.timeout_s = transaction_timeout_s
        self.clock = clock
        self._codec = codecs.codec(catalog.topic(catalog.SHIPPER_POSITIONS).value_schema)
        self._producer = self._new_producer()
        self._ready = False  # init_transactions done on the current producer
        self._in_txn = False

    def _on_error(self, err) -> None:
        # a fatal error reaches produce() only as "_FATAL"; its cause (fenced?) comes here
        if err.fatal():
            self._fatal = err

    def _new_producer(self):
        from confluent_kafka import Producer

        self._fatal = None
        timeout_ms = int(self.timeout_s * 1000)
        return Producer({
            "error_cb": self._on_error,
            "bootstrap.servers": self.broker,
            "partitioner": "murmur2_random",
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "transaction.timeout.ms": timeout_ms,
            "message.timeout.ms": timeout_ms,  # librdkafka: at most the transaction timeout
            "log_level": 0,
        })

    def check(self, topics: list[str], timeout_s: float | None = None) -> None:
        """Fail with a one-line `ShipperError` unless the broker answers and every topic exists."""
        from confluent_kafka import KafkaException

        try:
            md = self._producer.list_topics(timeout=BROKER_CHECK_TIMEOUT_S if timeout_s is None else timeout_s)
        except KafkaException as exc:
            raise ShipperError(f"cannot reach the Kafka broker at {self.broker} ({exc.args[0].str() if exc.args else exc}); "
                               "is it running (`memstream dev up`)?") from None
        missing = [t for t in topics if t not in md.topics or md.topics[t].error is not None]
        if missing:
            raise ShipperError(f"topic(s) {', '.join(missing)} missing on {self.broker}; run `memstream topics apply` first")

    # -- transactions --------------------------------------------------------------------------
    def start(self) -> None:
        """`init_transactions`: fences an earlier producer with this transactional id and settles
        (aborts, or completes a prepared commit of) its open transaction."""
        from confluent_kafka import KafkaException

        if self._ready:
            return
        try:
            self._producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            self._producer = self._new_producer()  # a failed init leaves the producer unusable
            raise DeliveryError(f"could not start a transactional producer ({self.transactional_id}) on {self.broker}: "
                                f"{err.str()}") from None
        self._ready = True
        self._in_txn = False

    def _fatal_cause(self, err):
        """The cause of a fatal error (fenced?): produce() reports only "_FATAL"; the cause comes
        through the error callback or as a KafkaException out of poll(), once the producer's
        background thread has queued it (it may take a moment)."""
        from confluent_kafka import KafkaError, KafkaException

        deadline = time.monotonic() + FATAL_CAUSE_WAIT_S
        while True:
            try:
                self._producer.poll(0.05)  # serve the error callback
            except KafkaException as exc:
                return exc.args[0] if exc.args else err
            except Exception:  # noqa: BLE001 - a closed producer: keep what we know
                return self._fatal or err
            if self._fatal is not None:
                return self._fatal
            if not (err.fatal() or err.code() == KafkaError._FATAL) or time.monotonic() > deadline:
                return err

    def _fail(self, what: str, err) -> NoReturn:
        """After a failed produce or commit: abort if the producer allows it, else start over with
        a new producer (its init_transactions settles the old transaction); then raise."""
        self._in_txn = False
        err = self._fatal_cause(err)
        if _fenced(err):
            raise FencedError(f"another ship-graph-logs with id {self.shipper_id!r} took over (producer fenced); "
                              "this one stops") from None
        if not err.fatal() and err.txn_requires_abort():
            try:
                self._producer.abort_transaction(self.timeout_s)
            except Exception:  # noqa: BLE001 - then start over below
                pass
            else:
                raise DeliveryError(f"{what} on {self.broker}: {err.str()}; transaction aborted")
        with contextlib.suppress(Exception):
            self._producer.purge()
            self._producer.flush(0)
        self._producer = self._new_producer()
        self._ready = False
        raise DeliveryError(f"{what} on {self.broker}: {err.str()}")

    def _begin(self) -> None:
        from confluent_kafka import KafkaException

        self.start()
        if not self._in_txn:
            try:
                self._producer.begin_transaction()
            except KafkaException as exc:
                self._fail("could not begin a transaction", exc.args[0])
            self._in_txn = True

    def produce(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self._begin()
        try:  # every call of the producer here: a fenced producer's error may surface at any of them
            while True:
                try:
                    self._producer.produce(topic, key=key, value=value, headers=headers)
                    break
                except BufferError:  # local queue full: serve delivery reports, then retry
                    self._producer.poll(0.1)
            self._producer.poll(0)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise RecordTooLargeError(f"{len(value or b'')} bytes exceed the producer's message.max.bytes") from None
            self._fail("could not produce", err)

    def commit(self, changes: dict[str, Position | None]) -> None:
        from confluent_kafka import KafkaException

        now_ms = int(self.clock() * 1000)
        for name, position in sorted(changes.items()):
            value = None if position is None else self._codec.encode(
                position_record(self.shipper_id, name, position, now_ms))
            self.produce(catalog.SHIPPER_POSITIONS, encode_key(position_key(self.shipper_id, name)), value, [])
        if not self._in_txn:
            return
        try:
            self._producer.commit_transaction(self.timeout_s)  # flushes, then commits
        except KafkaException as exc:
            self._fail("transaction not committed", exc.args[0])
        self._in_txn = False

    def abort(self) -> None:
        from confluent_kafka import KafkaException

        if not self._in_txn:
            return
        try:
            self._producer.abort_transaction(self.timeout_s)
            self._in_txn = False
        except KafkaException as exc:
            with contextlib.suppress(DeliveryError):
                self._fail("transaction not aborted", exc.args[0])

    # -- positions -----------------------------------------------------------------------------
    def load_positions(self) -> dict[str, Position]:
        """Read `shipper.positions.v1` with isolation.level=read_committed, every partition up to
        the high watermark as it is after `init_transactions` (so every transaction of this
        shipper is settled below it); the latest record per key of this shipper wins."""
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        self.start()
        topic = catalog.SHIPPER_POSITIONS
        base = {"bootstrap.servers": self.broker, "group.id": f"memstream-shipper-load-{self.shipper_id}",
                "enable.auto.commit": False, "log_level": 0}
        prefix = position_key(self.shipper_id, "")
        positions: dict[str, Position] = {}
        # the high watermark is what read_uncommitted sees; read_committed stops at the last
        # stable offset (LSO), which another shipper's open transaction may hold back a while
        probe = Consumer({**base, "isolation.level": "read_uncommitted"})
        reader = Consumer({**base, "isolation.level": "read_committed", "enable.partition.eof": True,
                           "auto.offset.reset": "earliest"})
        try:
            parts = probe.list_topics(topic, timeout=BROKER_CHECK_TIMEOUT_S).topics[topic].partitions
            ends = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=BROKER_CHECK_TIMEOUT_S)[1]
                    for p in parts}
            todo = {p for p, end in ends.items() if end > 0}
            reader.assign([TopicPartition(topic, p, 0) for p in todo])
            deadline = time.monotonic() + self.timeout_s + BROKER_CHECK_TIMEOUT_S
            while todo:
                if time.monotonic() > deadline:
                    raise DeliveryError(f"could not read {topic} to its end within {self.timeout_s + BROKER_CHECK_TIMEOUT_S:.0f}s "
                                        f"(partitions {sorted(todo)}; an open transaction?)")
                for m in reader.consume(1000, 0.1):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:  # type: ignore[operator]
                            todo.discard(m.partition())
                        elif err.code() != KafkaError._PARTITION_EOF and err.fatal():
                            raise DeliveryError(f"reading {topic}: {err.str()}")
                        continue
                    if m.offset() >= ends[m.partition()] - 1:  # type: ignore[operator]
                        todo.discard(m.partition())
                    key = m.key() or b""
                    if not key.startswith(prefix.encode()):
                        continue
                    name = key[len(prefix.encode()):].decode("utf-8", "replace")
                    if m.value() is None:
                        if not is_move_tombstone(m.headers()):  # a re-partition moved it: not deleted
                            positions.pop(name, None)
                    else:
                        shipper, file, position = position_from_record(self._codec.decode(m.value()))  # type: ignore[arg-type]
                        if shipper == self.shipper_id and file == name:
                            positions[name] = position
                # past trailing transaction markers (no message, maybe no new EOF event)
                for tp in reader.position([TopicPartition(topic, p) for p in todo]):
                    if tp.offset >= ends[tp.partition]:
                        todo.discard(tp.partition)
        except KafkaException as exc:
            raise DeliveryError(f"reading {topic} on {self.broker}: {exc.args[0].str() if exc.args else exc}") from None
        finally:
            probe.close()
            reader.close()
        return positions

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.abort()
        with contextlib.suppress(Exception):
            self._producer.flush(5)


# --------------------------------------------------------------------------------------------
# the shipper core


@dataclass(frozen=True)
class BatchReport:
    name: str
    start: int  # byte offset of the batch's first line
    end: int  # committed offset: just past its last line
    lines: int  # complete lines read (incl. blank ones)
    events: int  # sent to graph.events.v1
    dead_letters: int  # sent to pipeline.dlq.v1
    blank: int  # skipped
    restarted: str | None = None  # "truncated" | "rotated" when reading began again at 0

    def describe(self) -> str:
        extra = f", {self.blank} blank" if self.blank else ""
        again = f" (file {self.restarted}: read from 0)" if self.restarted else ""
        return (f"shipped {self.name}: {self.lines} lines ({self.events} events, {self.dead_letters} dead letters{extra}), "
                f"bytes {self.start}-{self.end}, offset {self.end}{again}")


@dataclass
class PassReport:
    batches: list[BatchReport] = field(default_factory=list)
    stopped: bool = False  # the stop flag cut the pass short

    @property
    def lines(self) -> int:
        return sum(b.lines for b in self.batches)

    @property
    def events(self) -> int:
        return sum(b.events for b in self.batches)

    @property
    def dead_letters(self) -> int:
        return sum(b.dead_letters for b in self.batches)

    @property
    def files(self) -> int:
        return len({b.name for b in self.batches if b.lines})


class Shipper:
    """Ships the graph event logs of one directory through a `Sink`: each batch of lines and the
    file's new position in one transaction. `positions` mirrors what the sink has committed; after
    a failed transaction it is read back from the sink before anything else is shipped."""

    def __init__(self, directory: str | os.PathLike[str], sink: Sink, codecs: CodecFactory, *,
                 batch_lines: int = 500, read_bytes: int = READ_BYTES, worker: str | None = None,
                 clock: Callable[[], float] = time.time, positions: dict[str, Position] | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        if not 1 <= batch_lines <= RECENT_IDS:
            raise ShipperError(f"batch size {batch_lines} lines is out of range 1..{RECENT_IDS} (a transaction's lines must "
                               "fit the graph agent's duplicate window); fix MEMSTREAM_SHIPPER_BATCH_LINES")
        self.directory = os.fspath(directory)
        self.sink = sink
        self.batch_lines = batch_lines
        self.read_bytes = read_bytes
        self.worker = worker or f"shipper@{socket.gethostname()}"
        self.clock = clock
        self.limits = limits
        self._event_codec = codecs.codec(catalog.topic(catalog.GRAPH_EVENTS).value_schema)
        self._dlq_codec = codecs.codec(catalog.topic(catalog.DLQ).value_schema)
        self.positions: dict[str, Position] = dict(positions) if positions is not None else {}
        self._stale = positions is None  # read the committed positions before shipping

    def _commit(self, changes: dict[str, Position | None]) -> None:
        """Commit the sink's transaction with these position changes; on any failure abort it and
        mark the positions for re-reading (the commit's outcome may be unknown)."""
        try:
            self.sink.commit(changes)
        except BaseException:
            self._abandon()
            raise
        for name, position in changes.items():
            if position is None:
                self.positions.pop(name, None)
            else:
                self.positions[name] = position

    def _abandon(self) -> None:
        self._stale = True
        with contextlib.suppress(Exception):
            self.sink.abort()

    # -- one pass ------------------------------------------------------------------------------
    def check_directory(self) -> None:
        if not os.path.isdir(self.directory):
            raise ShipperError(f"graph log directory {self.directory} does not exist (or is not a directory)")

    def ship_once(self, stop: threading.Event | None = None) -> PassReport:
        """Ship every complete line not yet shipped from every graph-events file, then return."""
        self.check_directory()
        if self._stale:
            self.positions = dict(self.sink.load_positions())
            self._stale = False
        report = PassReport()
        files = list_event_files(self.directory)
        present = {os.path.basename(p) for p in files}
        gone = [n for n in self.positions if n not in present] if os.path.isdir(self.directory) else []
        if gone:
            log.info("%s gone from %s; forgetting their positions", ", ".join(sorted(gone)), self.directory)
            self._commit({name: None for name in gone})
        for path in files:
            for batch in self._ship_file(path):
                report.batches.append(batch)
                log.info("%s", batch.describe())
                if stop is not None and stop.is_set():
                    report.stopped = True
                    return report
        return report

    def _ship_file(self, path: str) -> Iterator[BatchReport]:
        while True:
            name = os.path.basename(path)
            batch = poll_file(path, self.positions.get(name), self.read_bytes)
            if batch is None:  # vanished since the listing
                return
            if batch.restarted:
                log.warning("%s was %s: reading it again from the start", name, batch.reason)
            if not batch.lines:
                if batch.restarted:  # remember the new inode / offset 0, so it is reported once
                    self._commit({name: batch.position})
                return
            lines = batch.lines[: self.batch_lines]
            try:
                report = self._ship_lines(batch, lines)
            except BaseException:
                self._abandon()
                raise
            yield report

    def _ship_lines(self, batch: Batch, lines: list[Line]) -> BatchReport:
        """Produce the lines (events, dead letters) and commit them with the file's new position,
        all in one transaction."""
        name = batch.name
        events = dead = blank = 0
        for line in lines:
            if line.is_blank:
                blank += 1
                continue
            lid = line_id(name, line.start, line.data)
            headers = [(HEADER_LINE_ID, lid.encode()), (HEADER_SOURCE_FILE, name.encode()),
                       (HEADER_SOURCE_OFFSET, str(line.start).encode())]
            parsed = paths.parse_line(line.data, self.limits)
            if isinstance(parsed, paths.ParseError):
                self._dead_letter(name, line, headers, f"line at byte {line.start} of {name} is not a graph event: {parsed}",
                                  f"ship.{parsed.kind}")
                dead += 1
                continue
            graph_id = parsed["graphId"]
            if not paths.belongs_to_file(name, graph_id):
                self._dead_letter(
                    name, line, headers,
                    f"graphId {graph_id!r} does not belong to {name}: its events go to "
                    f"{paths.graph_events_filename(graph_id)}", "ship.wrong_file")
                dead += 1
                continue
            try:
                value = self._event_codec.encode(parsed)
                key = encode_key(graph_id)
            except WireFormatError as exc:
                self._dead_letter(name, line, headers, f"line at byte {line.start} of {name} cannot be encoded: {exc}",
                                  "ship.encode")
                dead += 1
                continue
            try:
                self.sink.produce(catalog.GRAPH_EVENTS, key, value, headers)
            except RecordTooLargeError as exc:
                self._dead_letter(name, line, headers, f"line at byte {line.start} of {name} is too large to send: {exc}",
                                  "ship.too_large", keep=MAX_DLQ_VALUE)
                dead += 1
                continue
            events += 1
        position = Position(batch.inode, lines[-1].end)
        self._commit({name: position})  # the lines and the position past them, atomically
        return BatchReport(name, lines[0].start, position.offset, len(lines), events, dead, blank, batch.reason)

    def _dead_letter(self, name: str, line: Line, headers: list[tuple[str, bytes]], reason: str, error_class: str,
                     keep: int | None = None) -> None:
        data = line.data
        if keep is not None and len(data) > keep:
            data = data[:keep]
            reason += f" (original_value holds its first {keep} of {len(line.data)} bytes)"
        origin = deadletter.Origin(FILE_TOPIC_PREFIX + name, DLQ_PARTITION, line.start, None, data)
        record = deadletter.dead_letter(origin, stage=deadletter.STAGE_SHIP, reason=reason, error_class=error_class,
                                        failed_at=int(self.clock() * 1000), worker=self.worker)
        value = self._dlq_codec.encode(record)
        try:
            self.sink.produce(catalog.DLQ, name.encode(), value, deadletter.connect_headers(record) + headers)
        except RecordTooLargeError:
            if keep is not None:
                raise
            self._dead_letter(name, line, headers, reason, error_class, keep=MAX_DLQ_VALUE)  # a huge corrupt line
            return
        log.info("dead-lettered %s@%d: %s", name, line.start, reason)

    # -- follow mode ---------------------------------------------------------------------------
    def follow(self, poll_s: float, stop: threading.Event) -> PassReport:
        """Ship, wait `poll_s`, repeat until `stop` is set; a delivery failure is logged and the
        batch retried from its committed position (with a growing pause, at most 30 s)."""
        total = PassReport()
        delay = poll_s
        while not stop.is_set():
            try:
                done = self.ship_once(stop)
                total.batches.extend(done.batches)
                delay = poll_s
            except DeliveryError as exc:
                log.warning("%s; retrying from the committed positions in %.1fs", exc, delay)
                stop.wait(delay)
                delay = min(max(delay, 0.5) * 2, 30.0)
                continue
            except FencedError:
                raise
            except ShipperError as exc:  # e.g. the directory went away: keep watching for it
                log.warning("%s; retrying in %.1fs", exc, poll_s)
            stop.wait(poll_s)
        total.stopped = True
        return total


# --------------------------------------------------------------------------------------------
# wiring: settings → a running shipper


def default_shipper_id(directory: str | os.PathLike[str]) -> str:
    """`<DIR name>-<first 12 hex of SHA-256 of DIR's real path>`: stable for one directory across
    restarts, distinct for two directories of the same name."""
    real = os.path.realpath(os.fspath(directory))
    tag = hashlib.sha256(real.encode("utf-8")).hexdigest()[:12]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(real.rstrip(os.sep)) or "root")[:120]
    return f"{base}-{tag}"


def default_offsets_path(settings: Settings, directory: str | os.PathLike[str]) -> str:
    """Where the offsets-file shipper (before transactions) kept this directory's offsets: read
    once, to import them."""
    return os.path.join(settings.shipper_offsets_dir, f"{default_shipper_id(directory)}.offsets.json")


def _import_offsets_file(shipper: Shipper, path: str, explicit: bool) -> None:
    """Carry over the positions of an offsets file of the earlier shipper, if Kafka has none."""
    if not os.path.exists(path):
        if explicit:
            log.info("--offsets %s: no such file, nothing to import (positions are kept in %s)", path,
                     catalog.SHIPPER_POSITIONS)
        return
    if shipper.positions:
        log.warning("%s ignored: %s already holds this shipper's positions (the file is no longer used)", path,
                    catalog.SHIPPER_POSITIONS)
        return
    try:
        legacy = load_offsets(path)
    except OffsetsFileError as exc:
        raise ShipperError(f"{exc}; fix or remove it (removing re-ships every file from its start)") from None
    if legacy:
        shipper._commit(dict(legacy))
    os.replace(path, path + ".imported")
    log.info("imported %d position(s) from the offsets file %s into %s (file renamed to %s.imported)", len(legacy),
             path, catalog.SHIPPER_POSITIONS, path)


@contextlib.contextmanager
def open_shipper(directory: str | os.PathLike[str], settings: Settings, offsets_path: str | None = None,
                 sink: Sink | None = None, shipper_id: str | None = None) -> Iterator[Shipper]:
    """A ready `Shipper` for `directory` (directory, broker, topics, registry checked; schemas
    registered once; earlier producers of this shipper id fenced; committed positions read back).
    Errors the user can fix raise `ShipperError`."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ShipperError(f"graph log directory {directory} does not exist (or is not a directory)")
    shipper_id = shipper_id or default_shipper_id(directory)
    if not SHIPPER_ID_RE.fullmatch(shipper_id):
        raise ShipperError(f"shipper id {shipper_id!r} must be 1-200 characters of A-Z a-z 0-9 . _ -")
    codecs = CodecFactory.from_url(settings.registry_url)
    kafka = None
    if sink is None:
        kafka = KafkaSink(settings.broker, shipper_id, codecs, settings.shipper_transaction_timeout_s)
        kafka.check([catalog.GRAPH_EVENTS, catalog.DLQ, catalog.SHIPPER_POSITIONS])
        sink = kafka
    try:
        try:
            codecs.register([catalog.GRAPH_EVENTS, catalog.DLQ, catalog.SHIPPER_POSITIONS])  # once, at startup
        except RegistryError as exc:
            raise ShipperError(f"schema registry at {settings.registry_url}: {exc}") from None
        if kafka is not None:
            kafka.start()  # fences an earlier shipper with this id, settles its open transaction
        shipper = Shipper(directory, sink, codecs, batch_lines=settings.shipper_batch_lines,
                          positions=sink.load_positions(), limits=settings.limits())
        _import_offsets_file(shipper, offsets_path or default_offsets_path(settings, directory), offsets_path is not None)
        log.info("shipping %s/graph-events-*.ndjson to %s as shipper %s (transactional id %s%s)", directory,
                 catalog.GRAPH_EVENTS, shipper_id, TRANSACTIONAL_ID_PREFIX, shipper_id)
        yield shipper
    finally:
        if kafka is not None:
            kafka.close()


def ship_directory(directory: str | os.PathLike[str], settings: Settings, offsets_path: str | None = None,
                   shipper_id: str | None = None) -> PassReport:
    """Ship what is in `directory` now and return (what `--once` does; usable in-process)."""
    with open_shipper(directory, settings, offsets_path, shipper_id=shipper_id) as shipper:
        return shipper.ship_once()


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        log.info("received %s: finishing the batch in hand, then stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _fenced_stops(shipper_id: str) -> Iterator[None]:
    """A fenced producer's error that surfaced outside the sink's guarded calls still ends the
    shipper as fenced (one line, exit non-zero), never as an unexplained crash."""
    from confluent_kafka import KafkaException

    try:
        yield
    except KafkaException as exc:
        if exc.args and _fenced(exc.args[0]):
            raise FencedError(f"another ship-graph-logs with id {shipper_id!r} took over (producer fenced: "
                              f"{exc.args[0].str()}); this one stops") from None
        raise


def run(directory: str, settings: Settings, *, once: bool = False, offsets_path: str | None = None,
        poll_s: float | None = None, shipper_id: str | None = None) -> int:
    """The `memstream ship-graph-logs` command."""
    if not logging.getLogger().handlers:  # our progress at INFO; libraries (HTTP clients) only warnings
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        log.setLevel(logging.INFO)
    poll = settings.shipper_poll_s if poll_s is None else poll_s
    if poll <= 0:
        raise ShipperError(f"poll interval must be positive, got {poll}")
    with open_shipper(directory, settings, offsets_path, shipper_id=shipper_id) as shipper:
        if once:
            report = shipper.ship_once()
            log.info("done: %d lines from %d file(s): %d events, %d dead letters",
                     report.lines, report.files, report.events, report.dead_letters)
            return 0
        stop = threading.Event()
        with _stop_on_signals(stop), _fenced_stops(shipper_id or default_shipper_id(directory)):
            log.info("watching %s every %.1fs (SIGINT/SIGTERM to stop)", directory, poll)
            report = shipper.follow(poll, stop)
        log.info("stopped: %d lines shipped: %d events, %d dead letters", report.lines, report.events, report.dead_letters)
        return 0
