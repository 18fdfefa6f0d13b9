"""`memstream repartition --to M`: take a stopped deployment from N to M partitions, its state carried.

Run while every worker of the deployment is stopped. In order (docs/scaling-out.md):

1. **refuses** (one line, exit 2) while a worker of the deployment's consumer group is alive,
   while any input partition holds a record the group has not committed (lag), when M is not
   more than N, or when the catalog topics do not all have N partitions;
2. **records** the new generation in `_memstream.generations` (`state: copying`, with the old
   group's committed offsets): from here on workers refuse to start until it is done;
3. **raises** every catalog topic to M partitions;
4. **copies** each table's live rows from its old changelog `<group>-<table>-changelog` into the
   new generation's (created with M partitions), each row into the partition its owner key gives
   it among M (`streams.core.repartition`, the owner rules in `streams.agents.table_owners`), then
   **verifies** that the new changelog holds exactly those rows (count and digest) at those partitions;
5. **moves** each live row of the compacted output topics (memory.nodes.v1, ...) whose key now
   belongs on another partition: the row at its new partition, then a tombstone carrying the
   header `memstream-moved-to` where it was; verified the same way;
6. **positions** the new group: on the old partitions where the old group stopped, on the new
   ones at their start; then records `state: done`.

Every step is idempotent and checks what is already done, so a run killed at any moment is
finished by running the command again (with the same `--to`). The old changelogs and the old
group are left untouched: delete them once the new generation runs (the summary names them).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from streams.contracts import catalog
from streams.core import repartition as rules
from streams.runtime import generation
from streams.runtime.generation import COPYING, DONE, Generation, changelog_topic
from streams.runtime.retry import retrying
from streams.settings import Settings
from streams.tools.kafkatools import KAFKA_TIMEOUT_S, OpsError, kafka_error

READ_TIMEOUT_S = 300.0  #: the longest a read of one topic partition to its end may take


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Deployment:
    """What the command works on: the broker, the deployment's record and its topics."""

    settings: Settings
    admin: Any  # confluent_kafka.admin.AdminClient

    def topics(self) -> dict[str, int]:
        """Every topic on the broker and its partition count."""
        from confluent_kafka import KafkaException

        try:
            md = retrying(lambda: self.admin.list_topics(timeout=KAFKA_TIMEOUT_S), "list topics")
        except KafkaException as exc:
            raise kafka_error(self.settings, exc) from None
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


# ------------------------------------------------------------------------------- refusals ----
def current_partitions(topics: dict[str, int]) -> int:
    """The partition count every catalog topic has (refuses a mix, or a missing topic)."""
    counts: dict[int, list[str]] = {}
    for spec in catalog.topics():
        if spec.name not in topics:
            raise OpsError(f"catalog topic {spec.name} does not exist; run `memstream topics apply` first")
        counts.setdefault(topics[spec.name], []).append(spec.name)
    if len(counts) > 1:
        detail = "; ".join(f"{n} partitions: {', '.join(names[:3])}{'…' if len(names) > 3 else ''}"
                           for n, names in sorted(counts.items()))
        raise OpsError(f"the catalog topics do not all have one partition count ({detail}): a topic was altered "
                       "by hand; raise them all to one count with `memstream repartition` only")
    return next(iter(counts))


def refuse_live_workers(d: Deployment, groups: list[str]) -> None:
    from confluent_kafka import KafkaException

    try:
        def describe(group: str) -> Any:
            return d.admin.describe_consumer_groups([group], request_timeout=KAFKA_TIMEOUT_S)[group].result()

        for group in groups:
            desc = retrying(partial(describe, group), f"members of {group}")
            if desc.members:
                hosts = sorted({f"{m.client_id}@{m.host}" for m in desc.members})
                raise OpsError(f"{len(desc.members)} worker(s) of consumer group {group} are alive ({', '.join(hosts[:3])}); "
                               "stop every worker of the deployment first (a worker killed less than "
                               f"MEMSTREAM_SESSION_TIMEOUT_S ({d.settings.session_timeout_s:.0f} s) ago still counts: wait, then run again)")
    except KafkaException as exc:
        raise kafka_error(d.settings, exc) from None


def consumed_topics(group: str) -> list[str]:
    """What the deployment's group reads that carries records to apply: the input topics and
    the internal topics its agents read (timer ticks excluded: a tick carries no record)."""
    from streams.agents import processors

    internal = sorted({f"{group}-{t}" for p in processors() for t in p.internal_sources})
    return [t.name for t in catalog.topics() if t.direction == "in"] + internal


def watermarks(d: Deployment, tps: list[tuple[str, int]]) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """(low, high) watermark of each partition."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    if not tps:
        return {}, {}
    def offsets(spec: Any) -> dict[tuple[str, int], int]:
        return {(tp.topic, tp.partition): f.result().offset for tp, f in d.admin.list_offsets(
            {TopicPartition(t, p): spec for t, p in tps}, request_timeout=KAFKA_TIMEOUT_S).items()}

    try:  # a partition just created or raised may not answer at once (NOT_LEADER_FOR_PARTITION)
        lows = retrying(lambda: offsets(OffsetSpec.earliest()), "earliest offsets")
        highs = retrying(lambda: offsets(OffsetSpec.latest()), "latest offsets")
    except KafkaException as exc:
        raise kafka_error(d.settings, exc) from None
    return lows, highs


def committed_offsets(d: Deployment, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

    try:
        tps = retrying(lambda: d.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=KAFKA_TIMEOUT_S)[group].result().topic_partitions,
            f"committed offsets of {group}")
    except KafkaException as exc:
        raise kafka_error(d.settings, exc) from None
    return {(tp.topic, tp.partition): tp.offset for tp in tps if tp.offset >= 0}


def capture_offsets(d: Deployment, group: str, topics: dict[str, int]) -> dict[tuple[str, int], int]:
    """The old group's position on every partition it reads; refuses while any has lag."""
    from streams.tools.kafkatools import only_markers

    tps = [(t, p) for t in consumed_topics(group) if t in topics for p in range(topics[t])]
    lows, highs = watermarks(d, tps)
    committed = committed_offsets(d, group)
    captured: dict[tuple[str, int], int] = {}
    behind: list[tuple[str, int, int]] = []
    for tp in tps:
        at = max(committed.get(tp, lows[tp]), lows[tp])
        if highs[tp] > at and not only_markers(d.settings, tp, at, highs[tp]):
            behind.append((tp[0], tp[1], highs[tp] - at))
        captured[tp] = highs[tp]  # no lag: the group has read everything there (markers are no records)
    if behind:
        total = sum(n for _t, _p, n in behind)
        where = ", ".join(f"{t}[{p}] {n}" for t, p, n in behind[:3])
        raise OpsError(f"{total} input record(s) not yet processed by consumer group {group} ({where}"
                       f"{'…' if len(behind) > 3 else ''}); run the workers until `memstream status` shows no lag, "
                       "stop them, then run this again")
    return captured


# ---------------------------------------------------------------------------- the topics ----
def read_partition(settings: Settings, topic: str, partition: int, end: int,
                   timeout: float = READ_TIMEOUT_S) -> Iterator[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]:
    """Every record (key, value, headers) of one partition from its start to `end` (exclusive).
    Transaction markers, which are offsets without a record, end it too."""
    from confluent_kafka import Consumer, TopicPartition

    if end <= 0:
        return
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": f"{settings.app_id}-repartition",
                  "enable.auto.commit": False, "log_level": 0, "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + timeout
        while True:
            for msg in c.consume(5000, 0.2):
                if msg.error() is not None or msg.offset() >= end:  # type: ignore[operator]
                    continue
                yield msg.key() or b"", msg.value(), list(msg.headers() or [])  # type: ignore[arg-type]
            if c.position([TopicPartition(topic, partition)])[0].offset >= end:
                return
            if time.monotonic() > deadline:
                raise OpsError(f"could not read {topic}[{partition}] to offset {end} within {timeout:.0f}s; "
                               "is the broker overloaded? run again")
    finally:
        c.close()


def read_rows(d: Deployment, topic: str, partitions: list[int] | None = None,
              ends: dict[tuple[str, int], int] | None = None) -> rules.Rows:
    """The live rows of a compacted topic (or of some of its partitions), up to `ends` (default:
    the partitions' ends now)."""
    count = d.topics().get(topic, 0)
    parts = list(range(count)) if partitions is None else partitions
    if ends is None:
        _lows, ends = watermarks(d, [(topic, p) for p in parts])
    records = ((p, k, v) for p in parts for k, v, _h in read_partition(d.settings, topic, p, ends[(topic, p)]))
    return rules.live_rows(records)


class Writer:
    """An idempotent producer to explicit partitions; `flush` returns once the broker has it all."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        self.settings = settings
        self.errors: list[str] = []
        self.sent = 0
        self.p = Producer({"bootstrap.servers": settings.broker, "acks": "all", "enable.idempotence": True,
                           "linger.ms": 20, "log_level": 0})

    def _done(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def put(self, topic: str, partition: int, key: bytes, value: bytes | None,
            headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
        while True:
            try:
                self.p.produce(topic, value, key, partition=partition, headers=headers or None, on_delivery=self._done)
                break
            except BufferError:
                self.p.poll(0.1)
        self.sent += 1
        self.p.poll(0)

    def flush(self, what: str) -> None:
        if self.p.flush(KAFKA_TIMEOUT_S * 4) or self.errors:
            raise OpsError(f"could not write {what}: {self.errors[0] if self.errors else 'not acknowledged in time'}; "
                           "run the command again (it goes on where it stopped)")


def raise_topics(d: Deployment, to: int) -> list[str]:
    """Raise every catalog topic with fewer than `to` partitions; wait for their leaders."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewPartitions

    topics = d.topics()
    above = [t.name for t in catalog.topics() if topics.get(t.name, 0) > to]
    if above:
        raise OpsError(f"{', '.join(above)} already have more than {to} partitions; re-partition to at least that many")
    todo = [t.name for t in catalog.topics() if topics.get(t.name, 0) < to]
    if todo:
        try:
            for name, fut in d.admin.create_partitions([NewPartitions(n, to) for n in todo],
                                                       request_timeout=KAFKA_TIMEOUT_S).items():
                try:
                    fut.result()
                except KafkaException as exc:
                    if "INVALID_PARTITIONS" not in str(exc) and "already has" not in str(exc):
                        raise OpsError(f"could not raise {name} to {to} partitions: {exc}") from None
        except KafkaException as exc:
            raise kafka_error(d.settings, exc) from None
    _wait_for_leaders(d, [t.name for t in catalog.topics()], to)
    return todo


def _wait_for_leaders(d: Deployment, names: list[str], partitions: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        md = d.admin.list_topics(timeout=KAFKA_TIMEOUT_S)
        ok = all(n in md.topics and len(md.topics[n].partitions) == partitions
                 and all(p.leader >= 0 for p in md.topics[n].partitions.values()) for n in names)
        if ok:
            return
        if time.monotonic() > deadline:
            raise OpsError(f"the topics do not all show {partitions} partitions with leaders after {timeout:.0f}s; run again")
        time.sleep(0.2)


# ---------------------------------------------------------------------------- the steps ----
def copy_table(d: Deployment, gen: Generation, table: str, rule: rules.OwnerRule) -> dict[str, Any]:
    """One table's visible rows from the old generation's changelog into the new one's, at their
    owner's partitions; verified. Returns the table's entry for the record."""
    from streams.contracts.topics import ensure_internal

    old, new = changelog_topic(gen.from_group, table), changelog_topic(gen.group, table)
    ensure_internal(d.settings, [(new, gen.partitions, generation.CHANGELOG_CONFIG)])
    topics = d.topics()
    if topics[new] != gen.partitions:
        raise OpsError(f"{new} has {topics[new]} partitions, not {gen.partitions}: delete it and run again")
    before, orphans, writer = rules.Digest(), 0, Writer(d.settings)
    old_parts = topics.get(old, 0)
    if old in topics and old_parts != gen.from_partitions:
        raise OpsError(f"{old} has {old_parts} partitions, the deployment had {gen.from_partitions}; "
                       "was it altered by hand? re-create it from a backup before re-partitioning")
    for p in range(old_parts):  # one old partition at a time: memory bounded by the largest
        visible, left = rules.split_visible(read_rows(d, old, [p]), rule, gen.from_partitions)
        orphans += len(left)
        before.add_rows(visible)
        for (dest, key), value in rules.place(table, visible, rule, gen.partitions).items():
            writer.put(new, dest, key, value)
        say(f"  {table}: partition {p + 1}/{old_parts} of {old} copied ({before.rows:,} rows so far)")
    writer.flush(f"the rows of {table} to {new}")
    after = rules.Digest()
    wrong: list[str] = []
    for q in range(gen.partitions):
        rows = read_rows(d, new, [q])
        after.add_rows(rows)
        wrong += rules.misplaced(table, rows, rule, gen.partitions, limit=10 - len(wrong)) if len(wrong) < 10 else []
    if wrong or after != before:
        raise OpsError(f"the copy of table {table} does not verify ({before.rows} rows before, {after.rows} after"
                       f"{'; ' + wrong[0] if wrong else ', digests differ'}); run the command again")
    say(f"  {table}: {after.rows:,} rows verified in {new} (sha256 {after.sha256[:16]}…)"
        + (f"; {orphans} orphan row(s) no worker reads left in {old}" if orphans else ""))
    return {**after.as_dict(), "orphans": orphans, "verified": True}


def compacted_outputs() -> list[str]:
    return [t.name for t in catalog.topics() if t.direction == "out" and "compact" in t.cleanup_policy]


def move_output(d: Deployment, gen: Generation, topic: str) -> dict[str, Any]:
    """Every live row of a compacted output topic at its key's partition among M; verified.
    Memory: the topic's keys, and one partition's rows at a time."""
    count = d.topics().get(topic, 0)
    _lows, ends = watermarks(d, [(topic, p) for p in range(count)])  # what is there before any write
    held = rules.live_keys((p, k, v) for p in range(count) for k, v, _h in read_partition(d.settings, topic, p, ends[(topic, p)]))
    expected, writer = rules.Digest(), Writer(d.settings)
    tombstones: list[tuple[int, bytes, int]] = []
    for p in range(count):
        rows = read_rows(d, topic, [p], ends)
        expected.add_rows(rules.after_move(rows, gen.partitions, held))
        move = rules.plan_move(rows, gen.partitions, held)
        for dest, key, value in move.puts:
            writer.put(topic, dest, key, value)
        tombstones += move.tombstones
    writer.flush(f"the moved rows of {topic}")  # every row at its new place before any tombstone
    for p, key, dest in tombstones:
        writer.put(topic, p, key, None, [(rules.MOVED_TO_HEADER, str(dest).encode())])
    writer.flush(f"the tombstones of {topic}")
    got, wrong = rules.Digest(), list[str]()
    for q in range(gen.partitions):
        rows = read_rows(d, topic, [q])
        got.add_rows(rows)
        wrong += rules.output_misplaced(topic, rows, gen.partitions, limit=10 - len(wrong)) if len(wrong) < 10 else []
    if wrong or got != expected:
        raise OpsError(f"the move of {topic} does not verify ({expected.rows} rows expected, {got.rows} found"
                       f"{'; ' + wrong[0] if wrong else ', digests differ'}); was something writing it? run again")
    say(f"  {topic}: {len(tombstones):,} of {got.rows:,} rows moved, verified")
    return {**got.as_dict(), "moved": len(tombstones), "verified": True}


def position_group(d: Deployment, gen: Generation) -> dict[tuple[str, int], int]:
    """The new group's offsets on every input partition (`rules.new_group_offsets`)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    captured = {(t, int(p)): off for t, parts in gen.input_offsets.items() for p, off in parts.items()}
    inputs = [t.name for t in catalog.topics() if t.direction == "in"]
    lows, _highs = watermarks(d, [(t, p) for t in inputs for p in range(gen.partitions)])
    offsets = rules.new_group_offsets({tp: off for tp, off in captured.items() if tp[0] in inputs}, lows)
    try:
        retrying(lambda: d.admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            gen.group, [TopicPartition(t, p, off) for (t, p), off in sorted(offsets.items())])],
            request_timeout=KAFKA_TIMEOUT_S)[gen.group].result(), f"offsets of {gen.group}")
    except KafkaException as exc:
        raise OpsError(f"could not set the offsets of consumer group {gen.group}: {exc}; run again") from None
    return offsets


# ------------------------------------------------------------------------------ the command ----
def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def begin(d: Deployment, to: int) -> Generation:
    """The generation to finish: the unfinished one recorded, or a new one (after the refusals)."""
    topics = d.topics()
    gen = generation.read(d.settings, set(topics))
    if gen is not None and gen.state == COPYING:
        if to != gen.partitions:
            raise OpsError(f"a re-partition of {gen.app_id} to {gen.partitions} partitions started at {gen.started_at} "
                           f"and has not finished; finish it first with `memstream repartition --to {gen.partitions}`")
        refuse_live_workers(d, [gen.from_group, gen.group])
        say(f"resuming the re-partition of {gen.app_id} from {gen.from_partitions} to {gen.partitions} partitions "
            f"(started {gen.started_at})")
        return gen
    n = current_partitions(topics)
    if gen is not None and n != gen.partitions:
        raise OpsError(f"{gen.app_id} is recorded on {gen.partitions} partitions but its topics have {n}: "
                       "a topic was altered by hand")
    if to <= n:
        raise OpsError(f"--to {to} is not more than the {n} partitions the topics have: a topic's partitions can "
                       "only be raised")
    if to > d.settings.max_partitions:
        raise OpsError(f"--to {to} is more than MEMSTREAM_MAX_PARTITIONS ({d.settings.max_partitions}); "
                       "raise that setting first if you mean it")
    from_gen = 0 if gen is None else gen.generation
    new = Generation(app_id=d.settings.app_id, generation=from_gen + 1, partitions=to, from_generation=from_gen,
                     from_partitions=n, state=COPYING, started_at=_now())
    refuse_live_workers(d, [new.from_group, new.group])
    captured = capture_offsets(d, new.from_group, topics)
    for (t, p), off in sorted(captured.items()):
        new.input_offsets.setdefault(t, {})[str(p)] = off
    generation.write(d.settings, new)
    say(f"re-partitioning {new.app_id} from {n} to {to} partitions: generation {new.generation}, "
        f"consumer group {new.group} (workers refuse to start until this finishes)")
    return new


def run(settings: Settings, to: int, owners: Callable[[], dict[str, rules.OwnerRule]] | None = None) -> int:
    """Re-partition the deployment `settings.app_id` to `to` partitions; prints a JSON summary on stdout."""
    import json

    from confluent_kafka.admin import AdminClient

    if owners is None:
        from streams.agents import table_owners

        owners = table_owners
    started = time.monotonic()
    d = Deployment(settings, AdminClient({"bootstrap.servers": settings.broker, "log_level": 0}))
    gen = begin(d, to)
    raised = raise_topics(d, gen.partitions)
    say(f"[1/4] catalog topics at {gen.partitions} partitions ({len(raised)} raised now)")
    for table, rule in sorted(owners().items()):
        if gen.tables.get(table, {}).get("verified"):
            say(f"  {table}: copied and verified by an earlier run")
            continue
        gen.tables[table] = copy_table(d, gen, table, rule)
        generation.write(settings, gen)
    say(f"[2/4] {len(gen.tables)} tables copied into generation {gen.generation}'s changelogs")
    for topic in compacted_outputs():
        if gen.outputs.get(topic, {}).get("verified"):
            say(f"  {topic}: moved and verified by an earlier run")
            continue
        gen.outputs[topic] = move_output(d, gen, topic)
        generation.write(settings, gen)
    say(f"[3/4] {len(gen.outputs)} compacted output topics moved")
    offsets = position_group(d, gen)
    say(f"[4/4] consumer group {gen.group} positioned on {len(offsets)} input partitions")
    gen.state, gen.finished_at = DONE, _now()
    generation.write(settings, gen)
    summary = {
        "app_id": gen.app_id, "generation": gen.generation, "group": gen.group, "partitions": gen.partitions,
        "from_partitions": gen.from_partitions, "from_group": gen.from_group, "seconds": round(time.monotonic() - started, 1),
        "tables": gen.tables, "outputs": gen.outputs,
        "old_changelogs": [changelog_topic(gen.from_group, t) for t in sorted(gen.tables)],
    }
    print(json.dumps(summary, indent=1, sort_keys=True))
    say(f"done: start the workers with MEMSTREAM_PARTITIONS={gen.partitions}; once they run, the old changelogs "
        f"({changelog_topic(gen.from_group, '<table>')}) and consumer group {gen.from_group} can be deleted")
    return 0
