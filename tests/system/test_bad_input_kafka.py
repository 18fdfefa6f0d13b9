"""Bad input at volume (issue #8): 10,000 malformed records of every kind the pipeline can meet,
mixed into a valid stream on every input topic, through one real worker.

Every kind of bad record the decoders, the validation rules and the memory rules can meet:

- decode (`streams/contracts/wire.py`, any input topic): JSON and random bytes (no magic byte), an empty
  value, a null value, a lone 0xC3, Confluent and single-object headers cut short, an Avro body
  cut short, trailing bytes after the body, a garbage body behind a valid header, a schema id no
  registry knows, a fingerprint of no memstream schema, another topic's schema (Confluent and
  single-object framing), a registry id naming a JSON schema, a key that is not UTF-8, no key;
- validate (`streams/core/ingest.py` and the agents): a record whose user/graph/session differs
  from its key, a missing sensitivity, empty content, empty ids, confidence out of range or NaN,
  an embedding holding NaN, an unknown event type or consolidation action (written as such, or
  as an enum symbol the reader does not know: every reader enum has a default, so an unknown
  symbol resolves to 'unknown' and the rule catches it), a memory_pinned without `pinned`,
  validity ending before it starts, a negative reinforcement count, an invalid graph event;
- limits and id rules (`streams/core/limits.py`): content one byte over MEMSTREAM_MAX_CONTENT_BYTES,
  an embedding one dimension over MEMSTREAM_MAX_EMBEDDING_DIMS, a user id with `/` (which would
  collide with another user's rows), a user id over MEMSTREAM_MAX_ID_CHARS, a session event with
  a compaction id over MEMSTREAM_MAX_LABEL_CHARS, a graph or session id with `/` — each
  dead-lettered with a reason naming the limit;
- memory rules (`streams/core/process.py`): re-forming deleted content, or a deleted node id
  (dead-lettered without their value: deleted content is never copied anywhere).

(`UnknownEnumSymbolError` cannot happen: every reader enum has a default. A candidate whose
sensitivity is a symbol newer than the reader resolves to `secret` and is rejected on the ledger,
fail closed; records exactly at the size limits — 16 KiB of content, 4096-dim embeddings — are
valid. Both are in the valid stream and must get their decision.)

The worker must keep running; every malformed record must be on pipeline.dlq.v1 exactly once
(matched by its origin topic, partition and offset) with a reason, the expected stage and error
class, its original key and (unless withheld) its original value; no valid record may be there;
and every valid record must be applied: a decision for every candidate, every event on the
ledger, nodes on memory.nodes.v1 (formed or tombstoned), the audit events the turns call for,
the session ledgers and graph states the pure reducers compute.

The group's offsets are committed at the topics' ends before the worker starts, so it reads only
this test's records (not those other tests left on the shared topics), and the test waits until
the group has committed every record it produced (Faust flushes its producer before it commits),
then reads each output topic to its end once: exact counts, not "until enough arrived".
"""

from __future__ import annotations

import io
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema
from fastavro import parse_schema, schemaless_writer

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory, WireFormat, WireFormatError
from streams.core.audit import audit_turn
from streams.core.erasure import erase_request
from streams.core.ids import event_id_for
from streams.graphs import samples as graph_samples
from streams.graphs import state as graph_state
from streams.sessions import lifecycle
from streams.sessions import samples as session_samples
from tests.kafka_util import candidate, codecs, read_to_end, worker

pytestmark = pytest.mark.kafka

BAD_TOTAL = 10_000
USERS = 24
DECODE, VALIDATE = "decode", "validate"
INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]
SCHEMA_OF = {t: catalog.topic(t).value_schema for t in INPUTS}
# for "another topic's schema": each input topic gets records of a different input's schema
FOREIGN = {catalog.MEMORY_CANDIDATES: catalog.GRAPH_EVENTS, catalog.MEMORY_EVENTS: catalog.MEMORY_CANDIDATES,
           catalog.MEMORY_TURNS: catalog.MEMORY_EVENTS, catalog.NEGOTIATOR_REQUESTS: catalog.MEMORY_TURNS,
           catalog.SESSION_EVENTS: catalog.NEGOTIATOR_REQUESTS, catalog.GRAPH_EVENTS: catalog.SESSION_EVENTS,
           catalog.ERASE_REQUESTS: catalog.MEMORY_TURNS}
WITHHELD = {"deleted_content", "deleted_node"}  # dead letters that must not carry the value


class Item:
    """One record to produce: where it goes, what it is, what must become of it."""

    __slots__ = ("topic", "key", "value", "kind", "stage", "error_class", "check", "partition", "offset", "order", "reason_has")

    def __init__(self, topic: str, key: bytes | None, value: bytes | None, kind: str,
                 stage: str | None = None, error_class: str | None = None, check: tuple | None = None) -> None:
        self.topic, self.key, self.value, self.kind = topic, key, value, kind
        self.stage, self.error_class = stage, error_class  # None: a valid record
        self.check = check  # for valid records: what must be applied
        self.reason_has: str | None = None  # for dead letters: a text their reason must contain
        self.partition = self.offset = None
        self.order = 0.0


# --------------------------------------------------------------------------------------------- records


def memory_event(user: str, eid: str, ts: int, event_type: str, payload, clock: int = 1) -> dict:
    return {"event_id": eid, "motebit_id": user, "device_id": "dev-1", "timestamp": ts, "version_clock": clock,
            "event_type": event_type, "payload": payload}


def formed(node_id: str, content: str, sensitivity: str | None = "none", **over) -> dict:
    return {"node_id": node_id, "content": content, "sensitivity": sensitivity, "source": "user_stated",
            "redacted": None, "redacted_sensitivity": None, "redacted_reason": None, "valid_from": None,
            "valid_until": None, **over}


def turn(user: str, tid: str, ts: int, message: str) -> dict:
    return {"turn_id": tid, "motebit_id": user, "timestamp": ts, "user_message": message,
            "agent_reply": "Noted.", "tagged_memories": []}


def negotiator_request(user: str, rid: str, ts: int) -> dict:
    return {"request_id": rid, "user_id": user, "op": "forget", "kind": None, "content": None, "sessionId": None,
            "memoryId": None, "description": "the thing I said about parking", "timestamp": ts}


def session_event(sid: str, seq: int, ts: int) -> dict:
    return {"sessionId": sid, "seq": seq, "type": "turn/start", "ts": ts, "ignorable": False,
            "data": {"json": '{"turn": 1}'}}


def graph_event(gid: str, ts: int, event: str, status: str | None = None) -> dict:
    return {"ts": ts, "graphId": gid, "nodeId": None, "event": event, "status": status, "signalType": None,
            "agent": None, "startedAt": None, "completedAt": None, "budget": None}


def variant_schema(stem: str, enum_name: str, extra_symbol: str) -> dict:
    """The current schema of `stem` with one more symbol in the enum `enum_name` (a newer writer)."""
    schema = json.loads(CodecFactory.from_url("").schema_set.get(stem).registry_text)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "enum" and node.get("name", "").split(".")[-1] == enum_name:
                node["symbols"] = [*node["symbols"], extra_symbol]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


# --------------------------------------------------------------------------------------------- the data set


class DataSet:
    def __init__(self, settings, unique: str) -> None:
        self.rng = random.Random(8)
        self.now = int(time.time() * 1000)
        self.unique = unique
        self.users = [f"mb-bad-{unique}-{i}" for i in range(USERS)]
        self.factory = codecs(settings)
        self.single = CodecFactory.from_url("")  # single-object encoding (no registry)
        self.items: list[Item] = []
        self.chains: list[list[Item]] = []  # records that must stay in this order (same key, same partition)
        self._register_writers(settings)

    # ---------------------------------------------------------------- encoders
    def enc(self, topic: str, record: dict, fmt: WireFormat | None = None, schema_topic: str | None = None) -> bytes:
        stem = SCHEMA_OF[schema_topic or topic]
        if fmt is WireFormat.SINGLE_OBJECT:
            return self.single.codec(stem).encode(record, WireFormat.SINGLE_OBJECT)
        return self.factory.codec(stem).encode(record)

    def _register_writers(self, settings) -> None:
        """Writers the registry knows but memstream does not read: newer enums, a JSON schema."""
        registry = self.factory.registry
        self.writers = {}
        for name, stem, enum_name, symbol in [
            ("event", "memory_event", "EventType", "memory_teleported"),
            ("action", "memory_event", "ConsolidationAction", "obliterate"),
            ("sensitivity", "candidate_memory", "SensitivityLevel", "classified"),
            ("graph", "graph_event", "GraphEventType", "node_teleported"),
        ]:
            schema = variant_schema(stem, enum_name, symbol)
            sid = registry.register_schema(f"it-bad-{self.unique}-{name}-value", Schema(json.dumps(schema), "AVRO"))
            self.writers[name] = (sid, parse_schema(schema))
        json_schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "NotAvro", "type": "object",
                       "properties": {"candidate_id": {"type": "string"}}}
        self.json_schema_id = registry.register_schema(f"it-bad-{self.unique}-json-value",
                                                       Schema(json.dumps(json_schema), "JSON"))

    def with_writer(self, name: str, record: dict) -> bytes:
        sid, parsed = self.writers[name]
        out = io.BytesIO()
        out.write(b"\x00" + sid.to_bytes(4, "big"))
        schemaless_writer(out, parsed, record)
        return out.getvalue()

    # ---------------------------------------------------------------- keys and sample records
    def user(self, i: int) -> str:
        return self.users[i % USERS]

    def sample(self, topic: str, i: int) -> tuple[str, dict]:
        """A valid record of `topic` (key, record), never applied for real: the base of a corruption."""
        u, ts = self.user(i), self.now + i
        if topic == catalog.MEMORY_CANDIDATES:
            return u, candidate(u, f"{self.unique}-base-{i}", ts, f"Base fact {i}")
        if topic == catalog.MEMORY_EVENTS:
            return u, memory_event(u, f"{self.unique}-base-{i}", ts, "memory_accessed", {"node_id": "n-base"})
        if topic == catalog.MEMORY_TURNS:
            return u, turn(u, f"{self.unique}-base-{i}", ts, "Hello there.")
        if topic == catalog.NEGOTIATOR_REQUESTS:
            return u, negotiator_request(u, f"{self.unique}-base-{i}", ts)
        if topic == catalog.ERASE_REQUESTS:  # a user of its own: a base is never applied, but never erase the stream's
            eraser = f"mb-bad-{self.unique}-erase"
            return eraser, erase_request(eraser, f"{self.unique}-base-{i}", ts, "test")
        if topic == catalog.SESSION_EVENTS:
            sid = f"s-bad-{self.unique}-{i % 7}"
            return sid, session_event(sid, 1, ts)
        gid = f"g-bad-{self.unique}-{i % 7}"
        return gid, graph_event(gid, ts, "phase_change", "running")

    def add(self, item: Item) -> Item:
        item.order = self.rng.random()
        self.items.append(item)
        return item

    def chain(self, *items: Item) -> None:
        """Records that must arrive in this order (one key): sorted positions in the shuffle."""
        orders = sorted(self.rng.random() for _ in items)
        for item, order in zip(items, orders, strict=True):
            item.order = order
            self.items.append(item)

    # ---------------------------------------------------------------- bad kinds
    def bad_kinds(self) -> list[tuple[str, Callable[[int], None]]]:
        kinds: list[tuple[str, Callable[[int], None]]] = []
        for topic in INPUTS:
            kinds += [(f"{topic}:{name}", (lambda fn, t: lambda i: fn(t, i))(fn, topic))  # noqa: B023 -- called in this iteration
                      for name, fn in self.decode_kinds().items()]
        kinds += [(f"rule:{name}", fn) for name, fn in self.rule_kinds().items()]
        return kinds

    def decode_kinds(self) -> dict[str, Callable[[str, int], None]]:
        rng = self.rng

        def bad(topic, key, value, error_class, kind):
            self.add(Item(topic, key, value, kind, DECODE, error_class))

        def base(topic, i, fmt=None):
            key, record = self.sample(topic, i)
            return key.encode(), self.enc(topic, record, fmt)

        def noise(topic, i):
            k, _ = base(topic, i)
            data = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 80)))
            bad(topic, k, data if data[0] != 0xC3 else b"\x01" + data[1:], "UnknownMagicByteError", "noise")

        def json_value(topic, i):
            k, _ = base(topic, i)
            bad(topic, k, json.dumps({"id": i, "topic": topic}).encode(), "UnknownMagicByteError", "json")

        def empty(topic, i):
            k, _ = base(topic, i)
            bad(topic, k, b"", "TruncatedMessageError", "empty")

        def null_value(topic, i):
            k, _ = base(topic, i)
            bad(topic, k, None, "_NullValue", "null-value")

        def lone_c3(topic, i):
            k, _ = base(topic, i)
            bad(topic, k, b"\xc3", "TruncatedMessageError", "lone-c3")

        def confluent_header_cut(topic, i):
            k, v = base(topic, i)
            bad(topic, k, v[: rng.randrange(1, 5)], "TruncatedMessageError", "confluent-header-cut")

        def single_header_cut(topic, i):
            k, v = base(topic, i, WireFormat.SINGLE_OBJECT)
            bad(topic, k, v[: rng.randrange(2, 10)], "TruncatedMessageError", "single-object-header-cut")

        def body_cut(topic, i):
            k, v = base(topic, i, rng.choice([None, WireFormat.SINGLE_OBJECT]))
            header = 5 if v[0] == 0 else 10
            cut = v[: rng.randrange(header, len(v))]
            bad(topic, k, cut, self.local_error(topic, cut), "body-cut")

        def trailing(topic, i):
            k, v = base(topic, i)
            bad(topic, k, v + bytes(rng.randrange(0, 256) for _ in range(rng.randrange(1, 9))),
                "MalformedBodyError", "trailing-bytes")

        def garbage_body(topic, i):
            k, v = base(topic, i)
            while True:
                data = v[:5] + bytes(rng.randrange(0, 256) for _ in range(rng.randrange(1, 40)))
                error = self.local_error(topic, data)
                if error is not None:
                    break
            bad(topic, k, data, error, "garbage-body")

        def unknown_schema_id(topic, i):
            k, v = base(topic, i)
            bad(topic, k, b"\x00" + (0x7FFFFFF0 + i % 4).to_bytes(4, "big") + v[5:], "UnknownSchemaIdError",
                "unknown-schema-id")

        def unknown_fingerprint(topic, i):
            k, v = base(topic, i, WireFormat.SINGLE_OBJECT)
            bad(topic, k, b"\xc3\x01" + rng.randbytes(8) + v[10:], "UnknownFingerprintError", "unknown-fingerprint")

        def foreign_schema(topic, i, fmt=None):
            k, _ = base(topic, i)
            _fkey, record = self.sample(FOREIGN[topic], i)
            bad(topic, k, self.enc(topic, record, fmt, schema_topic=FOREIGN[topic]), "IncompatibleSchemaError",
                "foreign-schema" if fmt is None else "foreign-schema-single-object")

        def json_schema_id(topic, i):
            k, v = base(topic, i)
            bad(topic, k, b"\x00" + self.json_schema_id.to_bytes(4, "big") + b'{"candidate_id": "x"}',
                "IncompatibleSchemaError", "json-schema-id")

        def key_not_utf8(topic, i):
            _k, v = base(topic, i)
            bad(topic, b"\xff\xfe" + str(i).encode(), v, "InvalidKeyError", "key-not-utf8")

        def no_key(topic, i):
            _k, v = base(topic, i)
            bad(topic, None, v, "InvalidKeyError", "no-key")

        return {"noise": noise, "json": json_value, "empty": empty, "null-value": null_value, "lone-c3": lone_c3,
                "confluent-header-cut": confluent_header_cut, "single-object-header-cut": single_header_cut,
                "body-cut": body_cut, "trailing-bytes": trailing, "garbage-body": garbage_body,
                "unknown-schema-id": unknown_schema_id, "unknown-fingerprint": unknown_fingerprint,
                "foreign-schema": foreign_schema,
                "foreign-schema-single-object": lambda t, i: foreign_schema(t, i, WireFormat.SINGLE_OBJECT),
                "json-schema-id": json_schema_id, "key-not-utf8": key_not_utf8, "no-key": no_key}

    def local_error(self, topic: str, data: bytes) -> str | None:
        """The error class the wire codec gives these bytes (None: they decode)."""
        try:
            self.factory.codec(SCHEMA_OF[topic]).decode(data)
        except WireFormatError as exc:
            return type(exc).__name__
        return None

    def rule_kinds(self) -> dict[str, Callable[[int], None]]:
        u, un = self.unique, self.now
        C, E, T, N = catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS, catalog.MEMORY_TURNS, catalog.NEGOTIATOR_REQUESTS
        S, G = catalog.SESSION_EVENTS, catalog.GRAPH_EVENTS

        def bad(topic, key: str, value: bytes, error_class: str, kind: str):
            return self.add(Item(topic, key.encode(), value, kind, VALIDATE, error_class))

        def cand(code, **over):
            def make(i):
                user = self.user(i)
                rec = {**candidate(user, f"{u}-{code}-{i}", un + i, f"Bad {code} {i}"), **over}
                bad(C, user, self.enc(C, rec), code, code)
            return make

        def event(code, event_type, payload, **over):
            def make(i):
                user = self.user(i)
                rec = {**memory_event(user, f"{u}-{code}-{i}", un + i, event_type, payload), **over}
                bad(E, user, self.enc(E, rec), code, code)
            return make

        def key_mismatch(topic):
            def make(i):
                user, other = self.user(i), self.user(i + 1)
                _k, rec = self.sample(topic, i)
                rec = {**rec, ("user_id" if topic == N else "motebit_id"): other}
                bad(topic, user, self.enc(topic, rec), "memory.key_mismatch", f"key-mismatch:{topic}")
            return make

        def empty_user(i):
            rec = candidate("", f"{u}-nouser-{i}", un + i, "Nobody's fact")
            bad(C, "", self.enc(C, rec), "missing_motebit_id", "missing_motebit_id")

        def unknown_event_symbol(i):
            user = self.user(i)
            rec = memory_event(user, f"{u}-teleport-{i}", un + i, "memory_teleported",
                               ("memstream.memory.MemoryDecayedPayload", {}))
            bad(E, user, self.with_writer("event", rec), "unknown_event_type", "unknown-enum-symbol:event_type")

        def unknown_action_symbol(i):
            user = self.user(i)
            rec = memory_event(user, f"{u}-obliterate-{i}", un + i, "memory_consolidated",
                               ("memstream.memory.MemoryConsolidatedPayload",
                                {"action": "obliterate", "existing_node_id": None, "new_node_id": None,
                                 "reason": "r", "superseded_valid_until": None}))
            bad(E, user, self.with_writer("action", rec), "unknown_action", "unknown-enum-symbol:action")

        def pinned_without_flag(i):
            user = self.user(i)
            rec = memory_event(user, f"{u}-pin-{i}", un + i, "memory_pinned",
                               ("memstream.memory.MemoryAccessedPayload", {"node_id": "n-1"}))
            bad(E, user, self.enc(E, rec), "invalid_pinned", "invalid_pinned")

        def deleted_content_and_node(i):
            """form a node, delete it, then re-form its content (new id) and its id (new content)."""
            user = self.user(i)
            node, ts = f"n-del-{u}-{i}", un + 10 * i
            content = f"Deleted fact {i} of {user}"
            setup = [memory_event(user, f"{u}-delf-{i}", ts, "memory_formed", formed(node, content), 1),
                     memory_event(user, f"{u}-deld-{i}", ts + 1, "memory_deleted", {"node_id": node}, 2)]
            first = [self.valid(E, user, rec, ("event", user, rec["event_id"])) for rec in setup]
            again = memory_event(user, f"{u}-delc-{i}", ts + 2, "memory_formed", formed(f"n-new-{u}-{i}", content), 3)
            reuse = memory_event(user, f"{u}-deln-{i}", ts + 3, "memory_formed", formed(node, f"Other fact {i}"), 4)
            self.chain(*first,
                       Item(E, user.encode(), self.enc(E, again), "deleted_content", VALIDATE, "deleted_content"),
                       Item(E, user.encode(), self.enc(E, reuse), "deleted_node", VALIDATE, "deleted_node"))
            self.tombstoned.add(f"{user}/{node}")

        def session_mismatch(i):
            sid = f"s-mis-{u}-{i}"
            rec = session_event(f"{sid}-other", 1, un + i)
            bad(S, sid, self.enc(S, rec), "event.session_mismatch", "event.session_mismatch")

        def graph_key_mismatch(i):
            gid = f"g-mis-{u}-{i % 11}"
            bad(G, gid, self.enc(G, graph_event(f"{gid}-other", un + i, "phase_change", "running")),
                "graph.key_mismatch", "graph.key_mismatch")

        def graph_invalid(i):
            gid = f"g-inv-{u}-{i % 11}"
            bad(G, gid, self.enc(G, graph_event(gid, un + i, "phase_change", None)), "graph.invalid_event",
                "graph.invalid_event")

        def graph_unknown_symbol(i):
            gid = f"g-sym-{u}-{i % 11}"
            bad(G, gid, self.with_writer("graph", graph_event(gid, un + i, "node_teleported")), "graph.invalid_event",
                "unknown-enum-symbol:graph-event")

        def over_limit(topic, key: str, record: dict, code: str, kind: str, reason_has: str):
            item = bad(topic, key, self.enc(topic, record), code, kind)
            item.reason_has = reason_has  # the reason names the limit's setting

        def content_over(i):
            user = self.user(i)
            rec = candidate(user, f"{u}-fat-{i}", un + i, "x" * (16 * 1024 + 1))
            over_limit(C, user, rec, "limit.content_bytes", "limit.content_bytes",
                       "content is 16385 bytes; MEMSTREAM_MAX_CONTENT_BYTES is 16384")

        def embedding_over(i):
            user = self.user(i)
            rec = candidate(user, f"{u}-wide-{i}", un + i, f"Wide {i}", embedding=[0.25] * 4097)
            over_limit(C, user, rec, "limit.embedding_dims", "limit.embedding_dims",
                       "embedding is 4097 dimensions; MEMSTREAM_MAX_EMBEDDING_DIMS is 4096")

        def user_with_slash(i):  # would collide with the rows of self.user(i)
            user = f"{self.user(i)}/x{i % 7}"
            over_limit(C, user, candidate(user, f"{u}-slash-{i}", un + i, f"Slash {i}"), "invalid_id",
                       "invalid_id:motebit_id", "has '/' at position")

        def user_too_long(i):
            user = f"u{i % 5}" + "x" * 200
            over_limit(C, user, candidate(user, f"{u}-long-{i}", un + i, f"Long {i}"), "limit.id_chars",
                       "limit.id_chars:motebit_id", "MEMSTREAM_MAX_ID_CHARS is 128")

        def session_label_over(i):
            sid = f"s-fat-{u}-{i}"
            rec = {**session_event(sid, 1, un + i), "type": "compaction/start",
                   "data": {"compactionId": "c" * 200, "sourceCommandId": None, "turn": None}}
            over_limit(S, sid, rec, "event.over_limit", "event.over_limit",
                       "compactionId is 200 characters; MEMSTREAM_MAX_LABEL_CHARS is 128")

        def session_json_too_deep(i):  # json.loads would recurse 10,000 levels: RecursionError
            sid = f"s-deep-{u}-{i}"
            rec = {**session_event(sid, 1, un + i), "type": "ui/nested", "ignorable": True,
                   "data": {"json": "[" * 10_000 + "]" * 10_000}}
            over_limit(S, sid, rec, "event.over_limit", "event.over_limit:json_depth",
                       "data.json is 10000 levels deep; MEMSTREAM_MAX_JSON_DEPTH is 64")

        def session_id_slash(i):
            sid = f"s-{u}/{i}"
            over_limit(S, sid, session_event(sid, 1, un + i), "invalid_id", "invalid_id:session", "has '/'")

        def graph_id_slash(i):
            gid = f"g-{u}/{i % 11}"
            over_limit(G, gid, graph_event(gid, un + i, "phase_change", "executing"), "invalid_id",
                       "invalid_id:graph", "has '/'")

        nan = float("nan")
        return {
            "limit.content_bytes": content_over,
            "limit.embedding_dims": embedding_over,
            "invalid_id:motebit_id": user_with_slash,
            "limit.id_chars:motebit_id": user_too_long,
            "event.over_limit": session_label_over,
            "event.over_limit:json_depth": session_json_too_deep,
            "invalid_id:session": session_id_slash,
            "invalid_id:graph": graph_id_slash,
            "missing_sensitivity": cand("missing_sensitivity", sensitivity=None),
            "empty_content": cand("empty_content", content="   "),
            "redacted_content": cand("redacted_content", content="[REDACTED]"),
            "missing_candidate_id": lambda i: bad(C, self.user(i), self.enc(C, candidate(
                self.user(i), "", un + i, f"No id {i}")), "missing_candidate_id", "missing_candidate_id"),
            "missing_motebit_id": empty_user,
            "confidence_out_of_range": cand("confidence_out_of_range", confidence=1.5),
            "invalid_confidence": cand("invalid_confidence", confidence=nan),
            "invalid_embedding": cand("invalid_embedding", embedding=[0.5, nan, 0.25]),
            "key_mismatch:candidates": key_mismatch(C),
            "key_mismatch:events": key_mismatch(E),
            "key_mismatch:turns": key_mismatch(T),
            "key_mismatch:negotiator": key_mismatch(N),
            "unknown_event_type": event("unknown_event_type", "unknown", ("memstream.memory.MemoryDecayedPayload", {})),
            "unknown-enum-symbol:event_type": unknown_event_symbol,
            "missing_event_id": lambda i: bad(E, self.user(i), self.enc(E, memory_event(
                self.user(i), "", un + i, "memory_accessed", {"node_id": "n-1"})), "missing_event_id",
                "missing_event_id"),
            "formed:missing_sensitivity": event("missing_sensitivity", "memory_formed", formed("n-x", "x", None)),
            "formed:empty_content": event("empty_content", "memory_formed", formed("n-x", "")),
            "formed:redacted_content": event("redacted_content", "memory_formed", formed("n-x", "[REDACTED]")),
            "invalid_validity": event("invalid_validity", "memory_formed",
                                      formed("n-x", "valid backwards", valid_from=un, valid_until=un - 1)),
            "unknown_action": event("unknown_action", "memory_consolidated",
                                    {"action": "unknown", "existing_node_id": None, "new_node_id": None,
                                     "reason": "r", "superseded_valid_until": None}),
            "unknown-enum-symbol:action": unknown_action_symbol,
            "invalid_pinned": pinned_without_flag,
            "missing_node_id": event("missing_node_id", "memory_accessed", {"node_id": ""}),
            "promoted:confidence_out_of_range": event(
                "confidence_out_of_range", "memory_promoted",
                {"node_id": "n-1", "from_confidence": 0.5, "to_confidence": 1.7, "reinforcement_count": 3,
                 "reason": ""}),
            "invalid_reinforcement_count": event(
                "invalid_reinforcement_count", "memory_promoted",
                {"node_id": "n-1", "from_confidence": 0.5, "to_confidence": 0.9, "reinforcement_count": -3,
                 "reason": ""}),
            "deleted_content+deleted_node": deleted_content_and_node,
            "event.session_mismatch": session_mismatch,
            "graph.key_mismatch": graph_key_mismatch,
            "graph.invalid_event": graph_invalid,
            "unknown-enum-symbol:graph-event": graph_unknown_symbol,
        }

    # ---------------------------------------------------------------- valid records
    def valid(self, topic: str, key: str, record_or_bytes, check: tuple | None, kind: str = "valid") -> Item:
        value = record_or_bytes if isinstance(record_or_bytes, bytes) else self.enc(topic, record_or_bytes)
        return Item(topic, key.encode(), value, kind, check=check)

    def build(self) -> None:
        self.tombstoned: set[str] = set()
        self.formed_nodes: set[str] = set()
        u, un, C, E = self.unique, self.now, catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS
        # --- the bad ones: BAD_TOTAL records, spread evenly over the kinds
        kinds = self.bad_kinds()
        per_kind = Counter({name: BAD_TOTAL // len(kinds) for name, _ in kinds})
        for name, _ in kinds[: BAD_TOTAL % len(kinds)]:
            per_kind[name] += 1
        for name, make in kinds:
            n = per_kind[name] // 2 if name == "rule:deleted_content+deleted_node" else per_kind[name]
            for i in range(n):
                make(i)
        if sum(1 for it in self.items if it.stage) < BAD_TOTAL:  # the odd one of the two-per-chain kind
            user = self.user(0)
            rec = candidate(user, f"{u}-extra", un, "Extra bad", sensitivity=None)
            self.add(Item(C, user.encode(), self.enc(C, rec), "missing_sensitivity", VALIDATE, "missing_sensitivity"))
        # --- the valid ones
        for i in range(600):  # candidates, both framings
            user = self.user(i)
            rec = candidate(user, f"{u}-ok-{i}", un + i, f"Fact {i}: {self.rng.random():.12f} about {user}")
            fmt = WireFormat.SINGLE_OBJECT if i % 5 == 0 else None
            self.add(self.valid(C, user, self.enc(C, rec, fmt), ("decision", user, rec["candidate_id"], None)))
        for i in range(12):  # exactly at the size limits: valid, consolidated like any other
            user = self.user(i)
            text = f"Big {i} " + " ".join(f"w{i}x{j}" for j in range(3_000))
            rec = candidate(user, f"{u}-big-{i}", un + i, text[:16 * 1024].ljust(16 * 1024, "z"),
                            embedding=[self.rng.uniform(-1, 1) for _ in range(4096)])
            self.add(self.valid(C, user, rec, ("decision", user, rec["candidate_id"], None), "valid:oversized"))
        for i in range(60):  # a sensitivity symbol newer than the reader: resolves to 'secret' (fail closed)
            user = self.user(i)
            rec = candidate(user, f"{u}-classified-{i}", un + i, f"Classified fact {i}", sensitivity="classified")
            self.add(self.valid(C, user, self.with_writer("sensitivity", rec),
                                ("decision", user, rec["candidate_id"], "reject"), "valid:unknown-sensitivity-symbol"))
        for i in range(300):  # formed nodes, then accessed and pinned
            user, node = self.user(i), f"n-ok-{u}-{i}"
            recs = [memory_event(user, f"{u}-okf-{i}", un + 10 * i, "memory_formed",
                                 formed(node, f"Formed {i} {user}"), 1),
                    memory_event(user, f"{u}-oka-{i}", un + 10 * i + 1, "memory_accessed", {"node_id": node}, 2),
                    memory_event(user, f"{u}-okp-{i}", un + 10 * i + 2, "memory_pinned",
                                 {"node_id": node, "pinned": True}, 3)]
            self.chain(*[self.valid(E, user, r, ("event", user, r["event_id"])) for r in recs[: 2 + i % 2]])
            self.formed_nodes.add(f"{user}/{node}")
        for i in range(120):  # turns: half say something worth remembering
            user = self.user(i)
            rec = turn(user, f"{u}-turn-{i}", un + i, "I prefer window seats." if i % 2 else "What time is it?")
            audited = audit_turn(rec) is not None
            check = ("audit", user, event_id_for(user, rec["turn_id"], "memory_audit")) if audited else None
            self.add(self.valid(catalog.MEMORY_TURNS, user, rec, check))
        self.sessions = {}
        for seed in (3, 4):  # whole sessions, in order
            s = session_samples.valid_session(seed, session_id=f"s-ok-{u}-{seed}")
            self.sessions[s.session_id] = s.events
            self.chain(*[self.valid(catalog.SESSION_EVENTS, s.session_id, ev, None) for ev in s.events])
        self.graphs = {}
        for seed in (5, 6, 7):
            g = graph_samples.graph_run(seed, graph_id=f"g-ok-{u}-{seed}")
            self.graphs[g.graph_id] = g.events
            self.chain(*[self.valid(catalog.GRAPH_EVENTS, g.graph_id, ev, None) for ev in g.events])
        self.items.sort(key=lambda it: it.order)


# --------------------------------------------------------------------------------------------- Kafka


def produce_all(settings, items: list[Item]) -> None:
    """Produce in bulk (idempotent producer: per-partition order kept), recording each record's
    partition and offset from its delivery report."""
    p = Producer({"bootstrap.servers": settings.broker, "partitioner": "murmur2_random", "linger.ms": 20,
                  "enable.idempotence": True, "batch.num.messages": 10_000, "queue.buffering.max.messages": 200_000,
                  "log_level": 0})
    failed = []

    def delivered(item: Item):
        def cb(err, msg):
            if err is not None:
                failed.append((item.kind, err))
            else:
                item.partition, item.offset = msg.partition(), msg.offset()
        return cb

    for n, item in enumerate(items):
        p.produce(item.topic, key=item.key, value=item.value, on_delivery=delivered(item))
        if n % 2000 == 0:
            p.poll(0)
    assert p.flush(60) == 0 and not failed, f"produce failed: {failed[:3]}"
    assert all(it.offset is not None for it in items)


def skip_to_end(settings, group: str) -> None:
    """Commit `group`'s offsets at the input topics' current ends: its worker reads only what
    this test produces next, not the records other tests left on the shared topics."""
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    try:
        ends = [TopicPartition(t, p, c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1])
                for t in INPUTS for p in c.list_topics(t, timeout=10).topics[t].partitions]
        c.commit(offsets=ends, asynchronous=False)
    finally:
        c.close()


def wait_committed(settings, group: str, items: list[Item], proc, timeout: float) -> None:
    """Until `group` has committed past the last record produced to every partition."""
    last: dict[tuple[str, int], int] = {}
    for it in items:
        last[(it.topic, it.partition)] = max(last.get((it.topic, it.partition), -1), it.offset)
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    deadline = time.monotonic() + timeout
    try:
        while True:
            committed = {(tp.topic, tp.partition): tp.offset
                         for tp in c.committed([TopicPartition(t, p) for t, p in last], timeout=10)}
            behind = {k: (committed[k], end + 1) for k, end in last.items() if committed[k] <= end}
            if not behind:
                return
            assert proc.poll() is None, f"the worker exited ({proc.returncode})"
            assert time.monotonic() < deadline, f"worker still behind (committed, wanted): {behind}"
            time.sleep(0.5)
    finally:
        c.close()


# --------------------------------------------------------------------------------------------- the test


def test_ten_thousand_malformed_records_of_every_kind_are_dead_lettered_and_valid_ones_applied(stack, unique):
    started = time.monotonic()
    data = DataSet(stack, unique)
    data.build()
    items = data.items
    bad = [it for it in items if it.stage]
    good = [it for it in items if not it.stage]
    assert len(bad) == BAD_TOTAL
    # the kinds' expectations agree with the wire codec (decode) before anything is sent
    for it in bad:
        if it.stage == DECODE and it.key is not None and it.key[:1] != b"\xff" and it.value is not None:
            assert data.local_error(it.topic, it.value) == it.error_class, it.kind
    kinds = Counter(it.kind for it in bad)
    built_s = time.monotonic() - started

    app_id = f"it-bad-{unique}"
    skip_to_end(stack, app_id)
    env = {"MEMSTREAM_APP_ID": app_id, "MEMSTREAM_API_TOKENS": "t:none"}
    with worker(stack, f"bad-{unique}", env=env) as proc:
        ready_s = time.monotonic() - started
        produce_all(stack, items)
        produced_s = time.monotonic() - started
        wait_committed(stack, app_id, items, proc, timeout=240)
        processed_s = time.monotonic() - started
        assert proc.poll() is None, "the worker kept running"

    # ------------------------------------------------------------------ dead letters
    by_origin = {(it.topic, it.partition, it.offset): it for it in items}
    mine = set(by_origin)
    dlq_codec = codecs(stack).codec("dead_letter")
    letters: dict[tuple, list[dict]] = defaultdict(list)
    for m in read_to_end(stack, catalog.DLQ, decode=False):
        h = m["headers"]  # the origin is in the Connect headers too: decode only this test's letters
        if (h.get("__connect.errors.topic", b"").decode(), int(h.get("__connect.errors.partition", b"-1")),
                int(h.get("__connect.errors.offset", b"-1"))) not in mine:
            continue
        d = dlq_codec.decode(m["raw"])
        origin = (d["original_topic"], d["original_partition"], d["original_offset"])
        if origin in mine:
            letters[origin].append({**d, "_headers": m["headers"], "_key": m["key"]})
    problems = []
    for it in bad:
        got = letters.get((it.topic, it.partition, it.offset), [])
        if len(got) != 1:
            problems.append(f"{it.kind} on {it.topic}: {len(got)} dead letters")
            continue
        d = got[0]
        if (d["stage"], d["error_class"]) != (it.stage, it.error_class):
            problems.append(f"{it.kind}: got {d['stage']}/{d['error_class']}, want {it.stage}/{it.error_class} "
                            f"({d['reason'][:120]})")
        if not d["reason"] or d["_headers"].get("__connect.errors.exception.class.name") != it.error_class.encode():
            problems.append(f"{it.kind}: no reason / wrong Connect header")
        if it.reason_has and it.reason_has not in d["reason"]:
            problems.append(f"{it.kind}: reason {d['reason'][:200]!r} does not name {it.reason_has}")
        want_value = None if it.error_class in WITHHELD else it.value
        if d["original_key"] != it.key or d["_key"] != it.key or d["original_value"] != want_value:
            problems.append(f"{it.kind}: original key/value not kept as sent")
    for it in good:
        if (it.topic, it.partition, it.offset) in letters:
            d = letters[(it.topic, it.partition, it.offset)][0]
            problems.append(f"valid {it.kind} on {it.topic} dead-lettered: {d['error_class']}: {d['reason'][:120]}")
    assert not problems, f"{len(problems)} problems, first: {problems[:10]}"

    # ------------------------------------------------------------------ valid records applied
    users = {u.encode() for u in data.users}
    ledger = read_to_end(stack, catalog.MEMORY_LEDGER, keep=lambda k, p, o: k in users)
    ledger_ids = Counter(m["value"]["event_id"] for m in ledger)
    decisions = {m["value"]["event_id"]: m["value"]["payload"]["action"] for m in ledger
                 if m["value"]["event_type"] == "memory_consolidated"}
    missing = []
    for it in good:
        if it.check is None:
            continue
        what, user, ident = it.check[:3]
        if what == "decision":
            action = decisions.get(event_id_for(user, ident, "memory_consolidated"))
            if action is None or (it.check[3] is not None and action != it.check[3]):
                missing.append(f"candidate {ident}: decision {action}")
        elif ledger_ids[ident] != 1:
            missing.append(f"{what} {ident}: {ledger_ids[ident]} times on the ledger")
    assert not missing, f"{len(missing)} valid records not applied, first: {missing[:10]}"

    node_keys = {k.encode() for k in data.formed_nodes | data.tombstoned}
    nodes = {}
    for m in read_to_end(stack, catalog.MEMORY_NODES, keep=lambda k, p, o: k in node_keys):
        nodes[m["key"].decode()] = m["value"]
    assert {k for k in data.formed_nodes if nodes.get(k) is not None} == data.formed_nodes
    assert all(k in nodes and nodes[k] is None for k in data.tombstoned)  # deleted: tombstone last
    pinned = [k for k, v in nodes.items() if v is not None and v["pinned"]]
    assert len(pinned) == sum(1 for i in range(300) if i % 2)

    ledgers = {}
    for m in read_to_end(stack, catalog.SESSION_COMPACTIONS, keep=lambda k, p, o: k.decode() in data.sessions):
        ledgers[m["key"].decode()] = m["value"]
    for sid, events in data.sessions.items():
        state, violations = lifecycle.replay(events)
        assert not violations and ledgers[sid] == lifecycle.to_record(state), sid
    graphs = {}
    for m in read_to_end(stack, catalog.GRAPH_STATE, keep=lambda k, p, o: k.decode() in data.graphs):
        graphs[m["key"].decode()] = m["value"]
    for gid, events in data.graphs.items():
        st = None
        for ev in events:
            st = graph_state.apply(st, ev, stack.graph_stall_ms)
        want, got = graph_state.to_record(st), graphs[gid]
        # (stall flags also follow the wall clock through the stall timer: not compared)
        same = ("phase", "budget", "eventCount", "degradedNotifications")
        assert {k: got[k] for k in same} == {k: want[k] for k in same}, gid
        assert [(n["nodeId"], n["status"]) for n in got["nodes"]] == [(n["nodeId"], n["status"]) for n in want["nodes"]]

    total = time.monotonic() - started
    stages = Counter(it.stage for it in bad)
    print(f"\n[bad-input] {len(bad)} malformed records ({len(kinds)} kinds, {stages[DECODE]} decode / "
          f"{stages[VALIDATE]} validate, {len({it.error_class for it in bad})} error classes) + {len(good)} valid on "
          f"{len({it.topic for it in items})} topics; built {built_s:.1f}s, worker ready {ready_s:.1f}s, produced "
          f"{produced_s:.1f}s, all committed {processed_s:.1f}s "
          f"({len(items) / max(processed_s - ready_s, 1e-9):.0f} records/s), verified, total {total:.1f}s")
