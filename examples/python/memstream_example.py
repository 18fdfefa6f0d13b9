"""memstream from Python: produce one memory candidate, delete the memory it formed, and read
what memstream wrote (ledger, relay, node table).

confluent-kafka with the Schema Registry serializers; see README.md beside this file.

    python examples/python/memstream_example.py mb-ada
    python examples/python/memstream_example.py mb-ada --broker 127.0.0.1:19092 \
        --registry http://127.0.0.1:18081/apis/ccompat/v7 --timeout 60

The last line on stdout is one JSON object (what was seen); everything before it is for people.
Exit status 0 when every expected record was seen, 1 (with an error naming what is missing) when
the time ran out first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

CANDIDATES = "memory.candidates.v1"
EVENTS = "memory.events.v1"
LEDGER = "memory.ledger.v1"
RELAY = "memory.relay.v1"
NODES = "memory.nodes.v1"

# the record schemas of this checkout (schemas/ is a symlink to streams/contracts/avsc)
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
DELETED_BRANCH = "memstream.memory.MemoryDeletedPayload"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("user", help="the user's motebit_id (the Kafka key)")
    parser.add_argument("--broker", default=os.environ.get("MEMSTREAM_BROKER", "127.0.0.1:19092"))
    parser.add_argument("--registry", default=os.environ.get("MEMSTREAM_REGISTRY_URL",
                                                             "http://127.0.0.1:18081/apis/ccompat/v7"))
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each step (default 60)")
    args = parser.parse_args(argv)
    user: str = args.user

    # a timeout for every registry request: the client's default is none at all, so a registry that
    # hangs (its port open, no answer) would hang this program on the first schema it has not cached
    registry = SchemaRegistryClient({"url": args.registry, "timeout": 10})
    # memstream registered every topic's schema at start: write with the registered (latest)
    # version of the subject `<topic>-value`, never register from here
    serializer_conf = {"auto.register.schemas": False, "use.latest.version": True}
    serialize_candidate = AvroSerializer(registry, (SCHEMAS / "candidate_memory.avsc").read_text(),
                                         conf=serializer_conf)
    serialize_event = AvroSerializer(registry, (SCHEMAS / "memory_event.avsc").read_text(), conf=serializer_conf)
    # the writer's schema comes from the registry (the id in each value); return_record_name
    # makes a union of records read as (branch name, record)
    deserialize = AvroDeserializer(registry, return_record_name=True)

    # murmur2 of the key, as the Java client and memstream partition (librdkafka's default,
    # consistent_random, hashes with CRC32: memstream would dead-letter as wrong_partition)
    producer = Producer({"bootstrap.servers": args.broker, "partitioner": "murmur2_random",
                         "enable.idempotence": True})
    consumer = Consumer({"bootstrap.servers": args.broker, "group.id": f"memstream-example-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([LEDGER, RELAY, NODES])
    seen = Seen(user)
    run = uuid.uuid4().hex[:12]
    try:
        # 1. one memory candidate
        candidate_id = f"ex-py-{run}"
        candidate = {
            "candidate_id": candidate_id, "motebit_id": user,
            # memstream never re-forms deleted content: this run's id keeps a second run's content new
            "content": f"The user prefers green tea in the morning (example run {run}).",
            "sensitivity": "personal", "source": "user_stated", "memory_type": "semantic",
            "confidence": 0.9, "valid_from": None, "timestamp": now_ms(), "embedding": None,
            "frontmatter_type": None, "extra": None, "supersedes": None, "kind": None, "session_id": None,
        }
        produce(producer, CANDIDATES, user, serialize_candidate, candidate)
        print(f"produced candidate {candidate_id} for {user} to {CANDIDATES}")
        seen.candidate_id = candidate_id

        wait(consumer, deserialize, seen, args.timeout, seen.formed_missing)
        print(f"memstream formed node {seen.node_id}")

        # 2. delete the memory it formed: name the payload branch (MemoryAccessedPayload has the
        # same fields, and a plain dict would be written as that branch: docs/records.md)
        deletion_id = f"ex-py-del-{run}"
        deletion = {
            "event_id": deletion_id, "motebit_id": user, "device_id": "python-example",
            "timestamp": now_ms(), "version_clock": 1, "event_type": "memory_deleted",
            "payload": (DELETED_BRANCH, {"node_id": seen.node_id}), "caused_by": None,
        }
        produce(producer, EVENTS, user, serialize_event, deletion)
        print(f"produced memory_deleted {deletion_id} of node {seen.node_id} to {EVENTS}")
        seen.deletion_id = deletion_id

        wait(consumer, deserialize, seen, args.timeout, seen.deleted_missing)
        print("memstream deleted the node: ledger event, relay tombstone and node-table tombstone seen")
    except TimedOut as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(json.dumps({**seen.summary(), "error": str(exc)}))
        return 1
    finally:
        consumer.close()
    print(json.dumps(seen.summary()))
    return 0


def now_ms() -> int:
    return int(time.time() * 1000)


def produce(producer: Producer, topic: str, key: str, serialize: AvroSerializer, record: dict) -> None:
    value = serialize(record, SerializationContext(topic, MessageField.VALUE))
    errors: list[KafkaError] = []
    producer.produce(topic, key=key.encode(), value=value,
                     on_delivery=lambda err, _msg: errors.append(err) if err else None)
    if producer.flush(30) or errors:
        raise SystemExit(f"could not produce to {topic}: {errors or 'not delivered in 30 s'}")


class TimedOut(Exception):
    pass


def wait(consumer: Consumer, deserialize: AvroDeserializer, seen: Seen, timeout: float, missing) -> None:
    """Poll the three topics until `missing()` names nothing, or raise TimedOut naming it."""
    deadline = time.monotonic() + timeout
    while missing():
        if time.monotonic() > deadline:
            raise TimedOut(f"gave up after {timeout:.0f} s waiting for {'; '.join(missing())}")
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                print(f"consumer: {error}", file=sys.stderr)
            continue
        topic, raw_key, raw = msg.topic() or "", msg.key(), msg.value()
        key = raw_key.decode(errors="replace") if isinstance(raw_key, bytes) else ""
        if not seen.wants(topic, key):
            continue  # another user's record: not decoded
        value: Any = None if raw is None else deserialize(raw, SerializationContext(topic, MessageField.VALUE))
        seen.add(topic, key, value)


def branch(union: Any) -> tuple[str | None, dict | None]:
    """(branch name, record) of a union read with return_record_name."""
    if isinstance(union, tuple):
        return union[0], union[1]
    return None, union


class Seen:
    """What the consumer saw of this run, and what is still missing."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.candidate_id: str | None = None
        self.deletion_id: str | None = None
        self.node_id: str | None = None
        self.ledger: list[dict] = []
        self.relay: list[dict] = []
        self.nodes: dict[str, list[dict | None]] = {}
        self.rejected: str | None = None

    def wants(self, topic: str, key: str) -> bool:
        return key.startswith(self.user + "/") if topic == NODES else key == self.user

    def add(self, topic: str, key: str, value: dict | None) -> None:
        if topic == NODES:
            # kept for every node of the user: the row can arrive before the ledger names the node
            self.nodes.setdefault(key, []).append(None if value is None else {
                f: value[f] for f in ("node_id", "content", "sensitivity", "confidence", "reinforcement_count",
                                      "origin_event_id")})
            print(f"  {NODES:<16} {key}: " + ("null (tombstone: node deleted)" if value is None else
                                              f"{value['content']!r} confidence {value['confidence']:.2f}"))
            return
        assert value is not None
        name, payload = branch(value["payload"])
        _, caused_by = branch(value.get("caused_by"))
        payload = payload or {}
        mine = (caused_by is not None and caused_by.get("id") == self.candidate_id) or \
            (self.node_id is not None and self.node_id in (payload.get("node_id"), payload.get("new_node_id"))) or \
            (self.deletion_id is not None and value["event_id"] == self.deletion_id)
        if not mine:
            return  # an earlier run's record of the same user
        entry = {"event_type": value["event_type"], "event_id": value["event_id"], "branch": name,
                 "node_id": payload.get("node_id") or payload.get("new_node_id")}
        for f in ("action", "content", "redacted", "redacted_reason", "reason"):
            if f in payload:
                entry[f] = payload[f]
        if topic == LEDGER:
            if value["event_type"] == "memory_formed" and self.node_id is None:
                self.node_id = payload["node_id"]
            if value["event_type"] == "memory_consolidated" and payload.get("action") == "reject":
                self.rejected = payload.get("reason") or "rejected"
            self.ledger.append(entry)
        else:
            self.relay.append(entry)
        detail = entry.get("action") or entry.get("redacted_reason") or repr(entry.get("content", ""))
        print(f"  {topic:<16} {entry['event_type']:<20} node {entry['node_id']}  {detail}")

    def _has(self, events: list[dict], event_type: str, **fields: Any) -> bool:
        return any(e["event_type"] == event_type and all(e.get(k) == v for k, v in fields.items()) for e in events)

    def formed_missing(self) -> list[str]:
        if self.rejected:
            raise TimedOut(f"memstream rejected the candidate: {self.rejected}")
        out = []
        if self.node_id is None:
            out.append(f"memory_formed for candidate {self.candidate_id} on {LEDGER}")
            return out
        if not self._has(self.ledger, "memory_consolidated", action="accept"):
            out.append(f"memory_consolidated (accept) on {LEDGER}")
        if not self._has(self.relay, "memory_formed", node_id=self.node_id):
            out.append(f"memory_formed of node {self.node_id} on {RELAY}")
        if not any(v is not None for v in self.nodes.get(f"{self.user}/{self.node_id}", [])):
            out.append(f"the row {self.user}/{self.node_id} on {NODES}")
        return out

    def deleted_missing(self) -> list[str]:
        out = []
        if not self._has(self.ledger, "memory_deleted", node_id=self.node_id):
            out.append(f"memory_deleted of node {self.node_id} on {LEDGER}")
        if not self._has(self.relay, "memory_formed", node_id=self.node_id, redacted_reason="deleted"):
            out.append(f"the deletion tombstone (redacted_reason deleted) of node {self.node_id} on {RELAY}")
        rows = self.nodes.get(f"{self.user}/{self.node_id}", [])
        if not rows or rows[-1] is not None:
            out.append(f"the tombstone (null value) of {self.user}/{self.node_id} on {NODES}")
        return out

    def summary(self) -> dict:
        return {"client": "python", "user": self.user, "candidate_id": self.candidate_id,
                "deletion_id": self.deletion_id, "node_id": self.node_id,
                "ledger": self.ledger, "relay": self.relay,
                "nodes": {k: v for k, v in self.nodes.items() if k == f"{self.user}/{self.node_id}"}}


if __name__ == "__main__":
    sys.exit(main())
