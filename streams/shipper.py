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

Delivery guarantee: exactly-once *effect*, at-least-once delivery
-------------------------------------------------------------------
Per file, lines go out in batches of at most `MEMSTREAM_SHIPPER_BATCH_LINES` (default 500). A batch
is produced (idempotent producer, acks=all), `flush()`ed, and every delivery report checked; only
then is the file's position (inode + byte offset past the batch's last line) committed to the
offsets file, atomically (tmp file + fsync + rename). So:

- a restart resumes at the committed position: no line is lost;
- a crash between `flush` and the commit re-sends that one batch after the restart, with the same
  per-line ids. The graph agent skips event ids it has already applied (it remembers the last 512
  per graph, which is why a batch may hold at most 512 lines), so no line's effect is applied twice;
- a failed delivery (broker down) never commits: `--once` exits with an error, the follow mode logs
  it, drops what the producer still holds and re-reads the batch from the committed position after
  the poll interval.

The offsets file (JSON `{"version": 1, "files": {name: {"inode", "offset"}}}`) defaults to
`MEMSTREAM_SHIPPER_OFFSETS_DIR/<dir name>-<sha256(real path of DIR)[:12]>.offsets.json`, one per
shipped directory; `--offsets FILE` names another. An exclusive lock (`FILE.lock`) keeps two
shippers from using one offsets file. Positions of files that disappear from DIR are forgotten (a
later file of that name starts from its beginning).

Progress: one log line per batch shipped (file, lines, events, dead letters, byte range, offset).
`--once` ships what is there and exits; otherwise the shipper polls every `--poll` seconds until
SIGINT or SIGTERM, finishes the batch in hand, and exits 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from . import catalog, deadletter
from .graphs import paths
from .graphs.shipper_state import (
    HEADER_LINE_ID,
    HEADER_SOURCE_FILE,
    HEADER_SOURCE_OFFSET,
    Batch,
    Line,
    OffsetsFileError,
    OffsetStore,
    Position,
    line_id,
    list_event_files,
    poll_file,
)
from .graphs.state import RECENT_IDS
from .settings import Settings
from .wire import CodecFactory, RegistryError, WireFormatError, encode_key

log = logging.getLogger("memstream.shipper")

READ_BYTES = 256 * 1024  # bytes read from a file per poll (a longer single line is still read whole)
DLQ_PARTITION = -1  # a file line has no partition
BROKER_CHECK_TIMEOUT_S = 10.0  # how long startup waits for the broker's metadata
MAX_DLQ_VALUE = 64 * 1024  # a line too large to send is dead-lettered with its first 64 KiB
FILE_TOPIC_PREFIX = "file:"


class ShipperError(RuntimeError):
    """Something the user can fix: the directory is missing, the broker or registry is unreachable,
    a topic is missing, the offsets file is damaged or in use, a setting is out of range."""


class DeliveryError(ShipperError):
    """The broker did not acknowledge every record of a batch; the batch's offset is not committed."""


class RecordTooLargeError(ValueError):
    """The producer refuses a record as larger than its maximum message size (a line's fault)."""


# --------------------------------------------------------------------------------------------
# where records go


class Sink(Protocol):
    """What the shipper produces to. `flush` returns only once every record produced since the
    last flush is acknowledged, and raises `DeliveryError` if any was not."""

    def produce(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        """Queue one record; raises `RecordTooLargeError` if it can never be sent."""

    def flush(self) -> None: ...


class KafkaSink:
    """A confluent-kafka producer: murmur2 partitioning (like the Java client), idempotent, acks=all."""

    def __init__(self, broker: str, message_timeout_s: float = 30.0) -> None:
        self.broker = broker
        self.message_timeout_s = message_timeout_s
        self._failures: list[str] = []
        self._producer = self._new_producer()

    def _new_producer(self):  # type: ignore[no-untyped-def]
        from confluent_kafka import Producer

        return Producer({
            "bootstrap.servers": self.broker,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": int(self.message_timeout_s * 1000),
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

    def _delivered(self, err, _msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            self._failures.append(str(err))

    def produce(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        from confluent_kafka import KafkaError, KafkaException

        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers, on_delivery=self._delivered)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                self._producer.poll(0.1)
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise RecordTooLargeError(f"{len(value)} bytes exceed the producer's message.max.bytes") from None
                raise
        self._producer.poll(0)

    def flush(self) -> None:
        remaining = self._producer.flush(self.message_timeout_s + 5.0)
        failures, self._failures = self._failures, []
        if remaining or failures:
            self._reset()
            detail = failures[0] if failures else f"{remaining} record(s) unacknowledged"
            raise DeliveryError(f"{remaining + len(failures)} record(s) not delivered to {self.broker}: {detail}")

    def _reset(self) -> None:
        """Drop what the producer still holds (it is re-sent from the committed offset) and start a
        fresh producer (an idempotent producer may be left in a fatal state)."""
        with contextlib.suppress(Exception):
            self._producer.purge()
            self._producer.flush(0)
        self._producer = self._new_producer()

    def close(self) -> None:
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
    """Ships the graph event logs of one directory through a `Sink`, committing file positions to
    an `OffsetStore` only after the sink confirms every record of the batch."""

    def __init__(self, directory: str | os.PathLike[str], sink: Sink, offsets: OffsetStore, codecs: CodecFactory, *,
                 batch_lines: int = 500, read_bytes: int = READ_BYTES, worker: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not 1 <= batch_lines <= RECENT_IDS:
            raise ShipperError(f"batch size {batch_lines} lines is out of range 1..{RECENT_IDS} (a re-sent batch must fit "
                               "the graph agent's duplicate window); fix MEMSTREAM_SHIPPER_BATCH_LINES")
        self.directory = os.fspath(directory)
        self.sink = sink
        self.offsets = offsets
        self.batch_lines = batch_lines
        self.read_bytes = read_bytes
        self.worker = worker or f"shipper@{socket.gethostname()}"
        self.clock = clock
        self._event_codec = codecs.codec(catalog.topic(catalog.GRAPH_EVENTS).value_schema)
        self._dlq_codec = codecs.codec(catalog.topic(catalog.DLQ).value_schema)

    # -- one pass ------------------------------------------------------------------------------
    def check_directory(self) -> None:
        if not os.path.isdir(self.directory):
            raise ShipperError(f"graph log directory {self.directory} does not exist (or is not a directory)")

    def ship_once(self, stop: threading.Event | None = None) -> PassReport:
        """Ship every complete line not yet shipped from every graph-events file, then return."""
        self.check_directory()
        report = PassReport()
        files = list_event_files(self.directory)
        present = {os.path.basename(p) for p in files}
        gone = [n for n in self.offsets.positions if n not in present] if os.path.isdir(self.directory) else []
        for name in gone:
            log.info("%s is gone from %s; forgetting its position", name, self.directory)
            self.offsets.forget(name)
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
            batch = poll_file(path, self.offsets.get(name), self.read_bytes)
            if batch is None:  # vanished since the listing
                return
            if batch.restarted:
                log.warning("%s was %s: reading it again from the start", name, batch.reason)
            if not batch.lines:
                if batch.restarted:  # remember the new inode / offset 0, so it is reported once
                    self.offsets.commit(name, batch.position)
                return
            lines = batch.lines[: self.batch_lines]
            yield self._ship_lines(batch, lines)

    def _ship_lines(self, batch: Batch, lines: list[Line]) -> BatchReport:
        name = batch.name
        events = dead = blank = 0
        for line in lines:
            if line.is_blank:
                blank += 1
                continue
            lid = line_id(name, line.start, line.data)
            headers = [(HEADER_LINE_ID, lid.encode()), (HEADER_SOURCE_FILE, name.encode()),
                       (HEADER_SOURCE_OFFSET, str(line.start).encode())]
            parsed = paths.parse_line(line.data)
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
        self.sink.flush()  # every record acknowledged (raises DeliveryError otherwise) ...
        position = Position(batch.inode, lines[-1].end)
        self.offsets.commit(name, position)  # ... only then does the file's position move
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
                log.warning("%s; retrying from the committed offsets in %.1fs", exc, delay)
                stop.wait(delay)
                delay = min(max(delay, 0.5) * 2, 30.0)
                continue
            except ShipperError as exc:  # e.g. the directory went away: keep watching for it
                log.warning("%s; retrying in %.1fs", exc, poll_s)
            stop.wait(poll_s)
        total.stopped = True
        return total


# --------------------------------------------------------------------------------------------
# wiring: settings → a running shipper


def default_offsets_path(settings: Settings, directory: str | os.PathLike[str]) -> str:
    real = os.path.realpath(os.fspath(directory))
    tag = hashlib.sha256(real.encode("utf-8")).hexdigest()[:12]
    base = os.path.basename(real.rstrip(os.sep)) or "root"
    return os.path.join(settings.shipper_offsets_dir, f"{base}-{tag}.offsets.json")


@contextlib.contextmanager
def _exclusive(offsets_path: str) -> Iterator[None]:
    import fcntl

    lock_path = offsets_path + ".lock"
    os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ShipperError(f"another ship-graph-logs is using the offsets file {offsets_path}") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def open_shipper(directory: str | os.PathLike[str], settings: Settings, offsets_path: str | None = None,
                 sink: Sink | None = None) -> Iterator[Shipper]:
    """A ready `Shipper` for `directory` (directory, broker, topics, registry checked; schemas
    registered once; offsets file loaded and locked). Errors the user can fix raise `ShipperError`."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ShipperError(f"graph log directory {directory} does not exist (or is not a directory)")
    offsets_path = offsets_path or default_offsets_path(settings, directory)
    with _exclusive(offsets_path):
        try:
            offsets = OffsetStore(offsets_path)
        except OffsetsFileError as exc:
            raise ShipperError(f"{exc}; fix or remove it (removing re-ships every file from its start)") from None
        kafka = None
        if sink is None:
            kafka = KafkaSink(settings.broker)
            kafka.check([catalog.GRAPH_EVENTS, catalog.DLQ])
            sink = kafka
        codecs = CodecFactory.from_url(settings.registry_url)
        try:
            codecs.register([catalog.GRAPH_EVENTS, catalog.DLQ])  # once, at startup
        except RegistryError as exc:
            raise ShipperError(f"schema registry at {settings.registry_url}: {exc}") from None
        shipper = Shipper(directory, sink, offsets, codecs, batch_lines=settings.shipper_batch_lines)
        log.info("shipping %s/graph-events-*.ndjson to %s (offsets %s)", directory, catalog.GRAPH_EVENTS, offsets_path)
        try:
            yield shipper
        finally:
            if kafka is not None:
                kafka.close()


def ship_directory(directory: str | os.PathLike[str], settings: Settings, offsets_path: str | None = None) -> PassReport:
    """Ship what is in `directory` now and return (what `--once` does; usable in-process)."""
    with open_shipper(directory, settings, offsets_path) as shipper:
        return shipper.ship_once()


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):  # type: ignore[no-untyped-def]
        log.info("received %s: finishing the batch in hand, then stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run(directory: str, settings: Settings, *, once: bool = False, offsets_path: str | None = None,
        poll_s: float | None = None) -> int:
    """The `memstream ship-graph-logs` command."""
    if not logging.getLogger().handlers:  # our progress at INFO; libraries (HTTP clients) only warnings
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        log.setLevel(logging.INFO)
    poll = settings.shipper_poll_s if poll_s is None else poll_s
    if poll <= 0:
        raise ShipperError(f"poll interval must be positive, got {poll}")
    with open_shipper(directory, settings, offsets_path) as shipper:
        if once:
            report = shipper.ship_once()
            log.info("done: %d lines from %d file(s): %d events, %d dead letters",
                     report.lines, report.files, report.events, report.dead_letters)
            return 0
        stop = threading.Event()
        with _stop_on_signals(stop):
            log.info("watching %s every %.1fs (SIGINT/SIGTERM to stop)", directory, poll)
            report = shipper.follow(poll, stop)
        log.info("stopped: %d lines shipped: %d events, %d dead letters", report.lines, report.events, report.dead_letters)
        return 0
