"""`memstream dlq inspect` and `memstream dlq replay`.

`dlq inspect` reads `pipeline.dlq.v1` from the beginning to its current end and prints one line
(or JSON object) per dead letter; `dlq replay` sends chosen dead letters' original key and value
bytes back to their original topic, with the header `memstream.replayed_from` =
`<dlq partition>:<dlq offset>`. A replayed record goes through the pipeline like any other
record: if its cause is still there it is dead-lettered again (a new DLQ entry), and the
pipeline's duplicate detection drops a record that was in fact applied before.

The pure parts (parsing, filtering, planning, formatting) are separate from the Kafka I/O and
tested without a broker (tests/tools/test_dlq.py).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from streams.contracts import catalog
from streams.settings import Settings
from streams.tools.kafkatools import KAFKA_TIMEOUT_S, OpsError, kafka_error

REPLAYED_FROM_HEADER = "memstream.replayed_from"
FILE_TOPIC_PREFIX = "file:"  # dead letters of the graph-log shipper (streams/tools/shipper.py)


# =========================================================================== dead letters (pure)


@dataclass(frozen=True)
class DeadLetter:
    """One record of pipeline.dlq.v1, where it sits in the DLQ, and what it says."""

    dlq_partition: int
    dlq_offset: int
    original_topic: str
    original_partition: int
    original_offset: int
    original_key: bytes | None
    original_value: bytes | None
    stage: str
    reason: str
    error_class: str
    failed_at: int
    worker: str | None = None
    value_size: int | None = None  # bytes of original_value (kept when the value itself is dropped)

    @classmethod
    def from_record(cls, partition: int, offset: int, record: dict) -> DeadLetter:
        value = record.get("original_value")
        return cls(partition, offset, record["original_topic"], record["original_partition"],
                   record["original_offset"], record.get("original_key"), value,
                   record["stage"], record["reason"], record["error_class"], record["failed_at"],
                   record.get("worker"), None if value is None else len(value))

    def without_value(self) -> DeadLetter:
        """The same dead letter with its value bytes dropped (to list many without holding them);
        `replay_block` still tells a withheld value from a dropped one by `value_size`."""
        return dataclasses.replace(self, original_value=None)

    @property
    def coords(self) -> str:
        """Where it sits in the DLQ: `partition:offset` (what `dlq replay --offsets` takes)."""
        return f"{self.dlq_partition}:{self.dlq_offset}"

    @property
    def origin(self) -> str:
        return f"{self.original_topic}[{self.original_partition}]@{self.original_offset}"

    @property
    def key_text(self) -> str:
        return key_text(self.original_key)

    def replay_block(self) -> str | None:
        """Why this dead letter cannot be replayed (None: it can): `<category>: <explanation>`."""
        if self.original_topic.startswith(FILE_TOPIC_PREFIX):
            return (f"from a file: {self.original_topic[len(FILE_TOPIC_PREFIX):]} (graph-log shipper) is not a "
                    "Kafka topic; fix the line in the file and ship it again")
        if self.original_topic == catalog.DLQ:
            return "from the DLQ: its original topic is the DLQ itself"
        if self.value_size is None:
            return "value withheld: the worker did not keep its value (e.g. re-submitted deleted content)"
        return None


def key_text(key: bytes | None) -> str:
    if key is None:
        return "<none>"
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + key.hex()


@dataclass(frozen=True)
class Filter:
    """Which dead letters a command looks at (None = any)."""

    topic: str | None = None
    stage: str | None = None
    error_class: str | None = None

    def __call__(self, letter: DeadLetter) -> bool:
        return ((self.topic is None or letter.original_topic == self.topic)
                and (self.stage is None or letter.stage == self.stage)
                and (self.error_class is None or letter.error_class == self.error_class))


def parse_offsets(spec: str) -> list[tuple[int, int]]:
    """`0:12,3:4` → [(0, 12), (3, 4)]: DLQ partition:offset pairs, in order, without repeats."""
    out: list[tuple[int, int]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        p, sep, o = item.partition(":")
        try:
            if not sep:
                raise ValueError
            pair = (int(p), int(o))
        except ValueError:
            raise OpsError(f"--offsets entry {item!r} is not PARTITION:OFFSET (e.g. 0:12)") from None
        if pair[0] < 0 or pair[1] < 0:
            raise OpsError(f"--offsets entry {item!r}: partition and offset must be >= 0")
        if pair not in out:
            out.append(pair)
    if not out:
        raise OpsError("--offsets names no PARTITION:OFFSET pair")
    return out


def most_recent(letters: Iterable[DeadLetter], limit: int | None) -> list[DeadLetter]:
    """The dead letters in the order they failed (failed_at, then DLQ position); with a limit,
    only the `limit` most recent ones."""
    ordered = sorted(letters, key=lambda d: (d.failed_at, d.dlq_partition, d.dlq_offset))
    if limit is None:
        return ordered
    if limit < 0:
        raise OpsError(f"--limit must be >= 0, not {limit}")
    return ordered[-limit:] if limit else []


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_line(d: DeadLetter) -> str:
    when = datetime.fromtimestamp(d.failed_at / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = "value withheld" if d.value_size is None else f"{d.value_size} B"
    return (f"{d.coords}  {when}  {d.origin}  stage={d.stage}  class={d.error_class}  "
            f"key={d.key_text}  ({value})  {_one_line(d.reason)}")


def to_json(d: DeadLetter) -> dict[str, Any]:
    return {
        "dlq_partition": d.dlq_partition, "dlq_offset": d.dlq_offset,
        "original_topic": d.original_topic, "original_partition": d.original_partition,
        "original_offset": d.original_offset, "key": d.key_text,
        "value_bytes": d.value_size,
        "stage": d.stage, "error_class": d.error_class, "reason": d.reason,
        "failed_at": d.failed_at, "worker": d.worker, "replayable": d.replay_block() is None,
    }


@dataclass
class ReplayPlan:
    send: list[DeadLetter] = field(default_factory=list)
    skipped: list[tuple[DeadLetter, str]] = field(default_factory=list)
    missing: list[tuple[int, int]] = field(default_factory=list)  # --offsets not found in the DLQ

    def summary_of_skips(self) -> str:
        return ", ".join(f"{n} {why.split(':')[0]}" for why, n in Counter(w for _, w in self.skipped).items())


def plan_replay(letters: Iterable[DeadLetter], *, offsets: list[tuple[int, int]] | None = None,
                error_class: str | None = None, select_all: bool = False, narrow: Filter = Filter(),
                existing_topics: set[str] | None = None) -> ReplayPlan:
    """Which dead letters to resend (ordered by original topic, partition, offset: the order they
    were first consumed in), which are skipped and why, which requested offsets do not exist."""
    if (offsets is not None) + (error_class is not None) + bool(select_all) != 1:
        raise OpsError("choose exactly one of --offsets, --error-class, --all")
    wanted = set(offsets or ())
    found: set[tuple[int, int]] = set()
    plan = ReplayPlan()
    for d in letters:
        pos = (d.dlq_partition, d.dlq_offset)
        if offsets is not None:
            if pos not in wanted:
                continue
            found.add(pos)
        elif error_class is not None and d.error_class != error_class:
            continue
        if not narrow(d):
            continue
        why = d.replay_block()
        if why is None and existing_topics is not None and d.original_topic not in existing_topics:
            why = f"topic missing: its original topic {d.original_topic} does not exist"
        if why:
            plan.skipped.append((d, why))
        else:
            plan.send.append(d)
    plan.send.sort(key=lambda d: (d.original_topic, d.original_partition, d.original_offset, d.dlq_partition, d.dlq_offset))
    plan.missing = [pos for pos in (offsets or ()) if pos not in found]
    return plan


# =========================================================================== dead letters (Kafka)


@dataclass
class DlqRead:
    letters: list[DeadLetter]
    undecodable: list[tuple[int, int, str]]  # (partition, offset, why)
    topics: set[str]  # every topic in the cluster (to check replay targets)


def read_dlq(settings: Settings, keep_value: Callable[[DeadLetter], bool] = lambda d: True,
             timeout_s: float = 120.0) -> DlqRead:
    """Every record of pipeline.dlq.v1 from the beginning to its end as of now, decoded; the value
    bytes are kept only of the dead letters `keep_value` chooses."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from streams.contracts.wire import CodecFactory, RegistryError

    try:
        c = Consumer({"bootstrap.servers": settings.broker, "group.id": "memstream-dlq-reader",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest", "log_level": 0,
                      "enable.partition.eof": False})
    except KafkaException as exc:
        raise kafka_error(settings, exc) from None
    try:
        try:
            md = c.list_topics(timeout=KAFKA_TIMEOUT_S)
        except KafkaException as exc:
            raise kafka_error(settings, exc) from None
        if catalog.DLQ not in md.topics:
            raise OpsError(f"topic {catalog.DLQ} does not exist at {settings.broker}: run `memstream topics apply`")
        ends: dict[int, int] = {}
        assign = []
        for p in sorted(md.topics[catalog.DLQ].partitions):
            low, high = c.get_watermark_offsets(TopicPartition(catalog.DLQ, p), timeout=KAFKA_TIMEOUT_S)
            if high > low:
                ends[p] = high
                assign.append(TopicPartition(catalog.DLQ, p, low))
        codec = CodecFactory.from_url(settings.registry_url).codec(catalog.topic(catalog.DLQ).value_schema)
        decode = _DeadLetterDecoder(codec)
        letters: list[DeadLetter] = []
        bad: list[tuple[int, int, str]] = []
        if assign:
            c.assign(assign)
        pending = dict(ends)
        last_progress = time.monotonic()
        while pending:
            msgs = c.consume(num_messages=500, timeout=1.0)
            if not msgs:
                # the last offsets before the end may be no records (e.g. transaction markers)
                for tp in c.position([TopicPartition(catalog.DLQ, p) for p in pending]):
                    if tp.offset >= 0 and tp.offset >= pending[tp.partition]:
                        del pending[tp.partition]
                if pending and time.monotonic() - last_progress > timeout_s:
                    raise OpsError(f"reading {catalog.DLQ} stalled for {timeout_s:.0f}s (partitions "
                                   f"{', '.join(map(str, sorted(pending)))} not read to their end)")
            for msg in msgs:
                if msg.error():
                    continue
                last_progress = time.monotonic()
                p, off = msg.partition(), msg.offset()
                if p not in pending:
                    continue
                if off + 1 >= pending[p]:  # type: ignore[operator]
                    del pending[p]
                if off >= ends[p]:  # type: ignore[operator]
                    continue
                try:
                    d = DeadLetter.from_record(p, off, decode(msg.value()))  # type: ignore[arg-type]
                    letters.append(d if keep_value(d) else d.without_value())
                except RegistryError as exc:
                    raise OpsError(f"cannot decode {catalog.DLQ}: schema registry at {settings.registry_url}: {exc}") from None
                except Exception as exc:  # noqa: BLE001 - a foreign record in the DLQ: report, go on
                    bad.append((p, off, f"{type(exc).__name__}: {exc}"))  # type: ignore[arg-type]
        return DlqRead(letters, bad, set(md.topics))
    finally:
        c.close()


class _DeadLetterDecoder:
    """Dead letters read with the registry when it knows their id; else (the registry is down,
    lost the id, or maps it to a schema that is not a DeadLetter) with the DeadLetter schemas this
    package ships (current, then released: the first that reads the whole body). Once the
    registry is found down it is not asked again during this read."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self.registry_down: str | None = None

    def __call__(self, value: bytes) -> dict:
        from streams.contracts.wire import (
            RegistryError,
            WireFormatError,
            confluent_schema_id,
            decode_with_shipped_schemas,
        )

        if self.registry_down is None or confluent_schema_id(value) is None:
            try:
                return self.codec.decode(value)
            except RegistryError as exc:
                self.registry_down = str(exc)
                first: Exception = exc
            except WireFormatError as exc:
                first = exc
        else:
            first = RegistryError(self.registry_down)
        try:
            return decode_with_shipped_schemas(self.codec, value)[0]
        except WireFormatError:
            raise first from None


def inspect(settings: Settings, *, narrow: Filter, limit: int | None, as_json: bool,
            out: TextIO = sys.stdout) -> int:
    read = read_dlq(settings, keep_value=lambda d: False)
    chosen = most_recent((d for d in read.letters if narrow(d)), limit)
    for d in chosen:
        print(json.dumps(to_json(d), sort_keys=True) if as_json else format_line(d), file=out)
    for p, off, why in read.undecodable:
        print(f"memstream: {catalog.DLQ} {p}:{off} is not a DeadLetter record: {why}", file=sys.stderr)
    total = sum(1 for d in read.letters if narrow(d))
    shown = f"{len(chosen)} of {total}" if len(chosen) != total else f"{total}"
    print(f"{shown} dead letter(s) shown ({len(read.letters)} in {catalog.DLQ})", file=sys.stderr)
    return 0


def replay(settings: Settings, *, offsets: list[tuple[int, int]] | None, error_class: str | None,
           select_all: bool, narrow: Filter, dry_run: bool, out: TextIO = sys.stdout) -> int:
    """Resend chosen dead letters; exit 0 when every chosen one was sent (or would be, with
    --dry-run), 1 when a delivery failed, a requested offset does not exist, or a dead letter named
    by --offsets cannot be replayed."""
    wanted = set(offsets or ())

    def selected(d: DeadLetter) -> bool:
        return narrow(d) and (select_all or d.error_class == error_class
                              or (d.dlq_partition, d.dlq_offset) in wanted)

    read = read_dlq(settings, keep_value=selected)
    plan = plan_replay(read.letters, offsets=offsets, error_class=error_class, select_all=select_all,
                       narrow=narrow, existing_topics=read.topics)
    for pos in plan.missing:
        print(f"memstream: no dead letter at {catalog.DLQ} {pos[0]}:{pos[1]}", file=sys.stderr)
    for d, why in plan.skipped:
        print(f"skip {d.coords} ({d.origin}): cannot replay: {why}", file=sys.stderr)
    if dry_run:
        for d in plan.send:
            print(f"would replay {d.coords} -> {d.original_topic} key={d.key_text} "
                  f"({d.value_size} B; was {d.stage}/{d.error_class})", file=out)
        print(f"dry run: {len(plan.send)} dead letter(s) would be replayed, {len(plan.skipped)} skipped"
              + (f" ({plan.summary_of_skips()})" if plan.skipped else ""), file=out)
        return 1 if plan.missing or (offsets is not None and plan.skipped) else 0
    sent, failed = _produce(settings, plan.send)
    by_topic = Counter(d.original_topic for d in sent)
    topics = ", ".join(f"{t} ({n})" for t, n in sorted(by_topic.items()))
    line = f"replayed {len(sent)} of {len(plan.send) + len(plan.skipped)} selected dead letter(s)"
    line += f" to {topics}" if topics else ""
    if plan.skipped:
        line += f"; skipped {len(plan.skipped)} ({plan.summary_of_skips()})"
    if failed:
        line += f"; {len(failed)} FAILED"
    print(line, file=out)
    return 1 if failed or plan.missing or (offsets is not None and plan.skipped) else 0


def _produce(settings: Settings, letters: list[DeadLetter]) -> tuple[list[DeadLetter], list[DeadLetter]]:
    from confluent_kafka import KafkaException, Producer

    from streams.tools.progress import Progress

    if not letters:
        return [], []
    try:
        p = Producer({"bootstrap.servers": settings.broker, "enable.idempotence": True, "acks": "all",
                      "partitioner": "murmur2_random", "linger.ms": 5, "log_level": 0})
    except KafkaException as exc:
        raise kafka_error(settings, exc) from None
    progress = Progress(len(letters), "dead letters replayed")
    sent: list[DeadLetter] = []
    failed: list[DeadLetter] = []

    def report(d: DeadLetter):
        def on_delivery(err, _msg) -> None:
            if err is None:
                sent.append(d)
            else:
                failed.append(d)
                print(f"memstream: replaying {d.coords} to {d.original_topic} failed: {err}", file=sys.stderr)
            progress.advance()
        return on_delivery

    for d in letters:
        assert d.original_value is not None, f"{d.coords}: value bytes were not kept"  # keep_value agrees with plan_replay
        while True:
            try:
                p.produce(d.original_topic, key=d.original_key, value=d.original_value,
                          headers=[(REPLAYED_FROM_HEADER, d.coords.encode())], on_delivery=report(d))
                break
            except BufferError:
                p.poll(0.5)
        p.poll(0)
    remaining = p.flush(60)
    if remaining:
        raise OpsError(f"{remaining} replayed record(s) not confirmed by {settings.broker} after 60 s")
    return sent, failed
