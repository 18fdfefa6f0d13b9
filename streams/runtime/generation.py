"""A deployment's generation: which consumer group and table changelogs its workers use.

A deployment (MEMSTREAM_APP_ID) starts in generation 0: its consumer group, its internal
topics and its tables' changelogs are named by the app id itself (`<app_id>-<table>-changelog`).
`memstream repartition --to M` (streams/tools/repartition.py) moves it to generation k+1 on M
partitions: group `<app_id>.g<k+1>`, changelogs `<app_id>.g<k+1>-<table>-changelog`, filled
from the old ones, which stay untouched until the operator deletes them.

The record of it is one JSON value per app id in the compacted topic `_memstream.generations`
(one partition), written by the command when it starts (`state: copying`) and when it has
verified everything (`state: done`). A worker reads it before it builds its app
(`resolve`): no record, generation 0; a finished one, its group, provided MEMSTREAM_PARTITIONS
says its partition count; an unfinished one, it refuses to start. A deployment never
re-partitioned has no record and the topic may not even exist: then nothing is read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from streams.settings import Settings

TOPIC = "_memstream.generations"  #: compacted, one partition; key: the app id, value: a `Generation` as JSON
TOPIC_CONFIG = {"cleanup.policy": "compact"}
CHANGELOG_CONFIG = {"cleanup.policy": "compact"}  #: a table changelog's topic configuration
READ_TIMEOUT_S = 15.0

COPYING, DONE = "copying", "done"


class GenerationError(RuntimeError):
    """A worker must not start on this deployment as configured: the message says what to do."""


def group_of(app_id: str, generation: int) -> str:
    """The consumer group (and Faust app id, prefix of its internal topics and changelogs) of a
    deployment's generation."""
    return app_id if generation == 0 else f"{app_id}.g{generation}"


def changelog_topic(group: str, table: str) -> str:
    """A table's changelog in a generation (Faust's naming: `<app id>-<table>-changelog`)."""
    return f"{group}-{table}-changelog"


@dataclass
class Generation:
    """One deployment's current generation, as `memstream repartition` records it."""

    app_id: str
    generation: int
    partitions: int
    from_generation: int
    from_partitions: int
    state: str  # COPYING | DONE
    started_at: str
    finished_at: str | None = None
    #: the old group's committed offset of every input partition when the command started
    #: ("topic" -> {"partition": offset}: JSON object keys are strings)
    input_offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per table: {"rows", "sha256"} of its old changelog and `"verified": true` once the new one matches
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per compacted output topic: {"rows", "sha256", "moved", "verified"}
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def group(self) -> str:
        return group_of(self.app_id, self.generation)

    @property
    def from_group(self) -> str:
        return group_of(self.app_id, self.from_generation)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Generation:
        try:
            data = json.loads(raw)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise GenerationError(f"{TOPIC} holds a record memstream cannot read ({exc}); "
                                  "it is written only by `memstream repartition`") from None


def read(settings: Settings, topics: set[str] | None = None) -> Generation | None:
    """The record of `settings.app_id`, or None (never re-partitioned). `topics`: the broker's
    topic names when the caller has them (a missing topic means no record: nothing is read)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    if topics is not None and TOPIC not in topics:
        return None
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": f"{settings.app_id}-generation-reader",
                  "enable.auto.commit": False, "log_level": 0})
    try:
        md = c.list_topics(TOPIC, timeout=READ_TIMEOUT_S).topics.get(TOPIC)
        if md is None or md.error is not None or not md.partitions:
            return None
        tp = TopicPartition(TOPIC, 0)
        low, high = c.get_watermark_offsets(tp, timeout=READ_TIMEOUT_S)
        if high <= low:
            return None
        c.assign([TopicPartition(TOPIC, 0, low)])
        found: bytes | None = None
        key = settings.app_id.encode()
        import time

        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                if msg.key() == key:
                    found = msg.value()
                if msg.offset() + 1 >= high:  # type: ignore[operator]
                    break
            elif c.position([TopicPartition(TOPIC, 0)])[0].offset >= high:
                break
            if time.monotonic() > deadline:
                raise GenerationError(f"could not read {TOPIC} on {settings.broker} within {READ_TIMEOUT_S:.0f}s")
    except KafkaException as exc:
        raise GenerationError(f"cannot read {TOPIC} on {settings.broker} ({exc}); is the stack up?") from None
    finally:
        c.close()
    return None if found is None else Generation.from_json(found)


def write(settings: Settings, gen: Generation) -> None:
    """Record `gen` (the topic is created on first use); returns once the broker has it."""
    from confluent_kafka import KafkaException, Producer

    from streams.contracts.topics import ensure_internal

    ensure_internal(settings, [(TOPIC, 1, TOPIC_CONFIG)])
    p = Producer({"bootstrap.servers": settings.broker, "acks": "all", "enable.idempotence": True, "log_level": 0})
    errors: list[str] = []
    try:
        p.produce(TOPIC, gen.to_json(), gen.app_id.encode(),
                  on_delivery=lambda err, _msg: errors.append(str(err)) if err is not None else None)
        if p.flush(READ_TIMEOUT_S) or errors:
            raise GenerationError(f"could not record generation {gen.generation} of {gen.app_id} in {TOPIC}: "
                                  f"{errors[0] if errors else 'not acknowledged in time'}")
    except KafkaException as exc:
        raise GenerationError(f"could not record generation {gen.generation} of {gen.app_id} in {TOPIC}: {exc}") from None


def resolve(settings: Settings, topics: set[str] | None = None) -> Settings:
    """The settings a worker of this deployment runs with: `app_id` is its generation's group.
    Refuses (GenerationError) while a re-partition is unfinished, or when MEMSTREAM_PARTITIONS is
    not the generation's partition count."""
    gen = read(settings, topics)
    if gen is None:
        return settings
    if gen.state != DONE:
        raise GenerationError(
            f"a re-partition of {gen.app_id} from {gen.from_partitions} to {gen.partitions} partitions started at "
            f"{gen.started_at} has not finished; run `memstream repartition --to {gen.partitions}` again to finish it "
            "(workers refuse to start until it has)")
    if settings.partitions != gen.partitions:
        raise GenerationError(
            f"{gen.app_id} runs on {gen.partitions} partitions since {gen.finished_at} (re-partitioned from "
            f"{gen.from_partitions}); set MEMSTREAM_PARTITIONS={gen.partitions}")
    return settings.replace(app_id=gen.group)
