"""The same-job Quix Streams peer of the e2e bench: a Quix Streams application that does what
memstream's memory agent does with its inputs, and writes what it writes (issue 33).

It reads memory.candidates.v1, memory.events.v1, memory.turns.v1 and negotiator.requests.v1
(memory.erase-requests.v1 is left out: an erasure's steps resend themselves to their input
topic; the bench's input has none) with memstream's registry codecs, runs every record through
the same rules as the worker (`streams.agents.memory_step`: the refusals before any state, the
turn audit, `process_candidate` / `process_event`, a negotiator `forget`'s deletions, the output
records of an outcome; `streams.contracts.deadletter` for dead letters), keeps each user's state
in Quix's RocksDB state (with its changelog, committed by Quix's own checkpointing) and writes,
Avro-encoded through the registry as the worker does, to `<prefix><topic>` for each of
memory.ledger.v1, memory.relay.v1 (the default threshold, MEMSTREAM_RELAY_THRESHOLD),
memory.nodes.v1 (rows and tombstones), memory.quarantine.v1, negotiator.replies.v1 and
pipeline.dlq.v1. Analytics and the housekeeping timer are left out.

Written as Quix's documentation writes an application: one `Application`, the input topics'
dataframes concatenated (`sdf.concat`: Quix then hands a partition's records of all of them over
in timestamp order), one stateful `apply` (`expand=True`: one input, any number of outputs),
`set_headers`, and `to_topic` with a callable choosing the output topic and key; values are
encoded by a Quix `Serializer` that calls memstream's codec.

State, per user (Quix's `State` is already scoped to the message key), laid out as the worker's
rows (streams/agents/user_cache.py) so that a write touches only what changed: ``aux`` (the
compact aux record), ``r/<rest>`` one row per node, sealed de-duplication chunk and side row
(`chunk_rows`, `side_rows`), ``rows`` (the list of ``<rest>`` a user has, rewritten when it
changes: Quix's state cannot list a key's sub-keys), ``neg`` (the negotiator state) and ``gen``
(which process wrote the user last). The `UserMemory` built from those rows (`load_user`, as
the worker builds it) is kept in a dict while ``gen`` says this process wrote the user last; a
Quix checkpoint makes the rows and the outputs durable together (its producer flushed, its
changelog written, then the offsets committed), so no redo log is needed.

    $QUIX_VENV/bin/python bench/quix_samejob.py --broker 127.0.0.1:9092 --registry URL \\
        --group G --output-prefix P --count N --state-dir DIR

After N records it stops (Quix flushes its producer and commits) and prints one JSON line
(`core_step.Tally`), as bench/quix_peer.py does. Settings (limits, thresholds, partitions, the
relay threshold) come from the same MEMSTREAM_* environment as a worker's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any, NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from quixstreams import Application, State, message_context  # noqa: E402
from quixstreams.models.serializers import SerializationContext, Serializer  # noqa: E402

from bench.core_step import Tally  # noqa: E402
from streams.agents import memory_step  # noqa: E402
from streams.agents.user_cache import chunk_rows, load_user, side_rows  # noqa: E402
from streams.contracts import catalog, deadletter  # noqa: E402
from streams.contracts.wire import CodecFactory, WireFormatError, decode_key, encode_key  # noqa: E402
from streams.core import ConsolidationPolicy, Outcome, PromotionPolicy, UserMemory, process_event  # noqa: E402
from streams.core.negotiator import forgotten_fingerprints, handle_request, nodes_to_forget, validate_request  # noqa: E402
from streams.core.partitioning import misrouted  # noqa: E402
from streams.core.redaction import threshold_for  # noqa: E402
from streams.core.warmup import warm_up  # noqa: E402
from streams.settings import Settings  # noqa: E402

#: what the peer reads (the memory agent's sources but memory.erase-requests.v1)
INPUTS = (catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS, catalog.MEMORY_TURNS, catalog.NEGOTIATOR_REQUESTS)
#: what it writes (to `<prefix><topic>`): the memory agent's outputs but analytics and erasure
OUTPUTS = (catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.MEMORY_NODES, catalog.MEMORY_QUARANTINE,
           catalog.NEGOTIATOR_REPLIES, catalog.DLQ)
WORKER = "quix-samejob"  #: the `worker` of its dead letters


class Out(NamedTuple):
    """One output record: the catalog topic, its key (str; bytes or None for a dead letter), the
    value (None: a tombstone) and headers."""

    topic: str
    key: Any
    value: dict | None
    headers: list


class Encoded(Serializer):
    """A Quix `Serializer` of `Out` values: memstream's registry codec of the topic's schema."""

    def __init__(self, encode: Any) -> None:
        super().__init__()
        self.encode = encode

    def __call__(self, value: Out, ctx: SerializationContext) -> bytes | None:
        return None if value.value is None else self.encode(value.value)


class Key(Serializer):
    """A Quix `Serializer` of keys: UTF-8 (memstream's `encode_key`), bytes as they are."""

    def __call__(self, value: Any, ctx: SerializationContext) -> bytes:
        return value if isinstance(value, bytes) else encode_key(value)


class MemoryJob:
    """The memory agent's per-record work on Quix state: `__call__` is the stateful apply."""

    def __init__(self, settings: Settings, codecs: CodecFactory) -> None:
        self.settings = settings
        self.limits = settings.limits()
        self.consolidation = ConsolidationPolicy(
            text_merge_threshold=settings.text_merge_threshold, text_supersede_threshold=settings.text_supersede_threshold,
            embedding_merge_threshold=settings.embedding_merge_threshold,
            embedding_supersede_threshold=settings.embedding_supersede_threshold)
        self.promotion = PromotionPolicy(min_reinforcements=settings.promotion_min_reinforcements,
                                         min_confidence=settings.promotion_min_confidence)
        self.index_config = settings.index_config()
        self.decoders = {t: codecs.codec(catalog.topic(t).value_schema).decode_message for t in INPUTS}
        self.me = uuid.uuid4().hex  # `gen` written by this process: "<me>:<n>"
        self.writes = 0
        self.users: dict[str, tuple[UserMemory, str, set[str]]] = {}  # user -> (state, its gen, its row names)

    def dead(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, stage: str,
             reason: str, error_class: str) -> Out:
        record = deadletter.dead_letter(
            deadletter.Origin(topic, partition, offset, key, value), stage=stage, reason=reason, error_class=error_class,
            failed_at=int(time.time() * 1000), worker=WORKER, max_copy_bytes=self.settings.dlq_max_copy_bytes,
            max_reason_chars=self.settings.dlq_max_reason_chars)
        return Out(catalog.DLQ, record["original_key"], record, deadletter.connect_headers(record))

    def __call__(self, value: bytes | None, key: bytes | None, timestamp: int, headers: Any, state: State) -> list[Out]:
        ctx = message_context()
        topic, partition, offset = ctx.topic, ctx.partition, ctx.offset

        def dead(stage: str, reason: str, error_class: str, keep_value: bool = True) -> Out:
            return self.dead(topic, partition, offset, key, value if keep_value else None, stage, reason, error_class)

        wrong = misrouted(topic, key, partition, self.settings.partitions)
        if wrong is not None:
            return [dead(deadletter.STAGE_VALIDATE, f"{wrong.code}: {wrong.detail}", wrong.code)]
        try:
            user = decode_key(key)
            if value is None:
                raise _NullValue(f"{topic} record has a null value; inputs never carry tombstones")
            record = self.decoders[topic](value, headers)
        except WireFormatError as exc:
            return [dead(deadletter.STAGE_DECODE, str(exc), type(exc).__name__)]
        # the worker's record time: Faust's float seconds back to milliseconds
        record_ms = int(timestamp / 1000 * 1000) if timestamp else None
        refused = memory_step.refusal(topic, user, record, record_ms, self.limits)
        if refused is not None:
            return [dead(deadletter.STAGE_VALIDATE, refused.reason, refused.rule)]
        loaded = self.user(user, state)
        if isinstance(loaded, str):
            return [dead(deadletter.STAGE_APPLY, loaded, "memory.user_contained")]
        um, names = loaded
        outs: list[Out] = []
        if topic == catalog.NEGOTIATOR_REQUESTS:
            rej = validate_request(record, self.limits)
            if rej is not None:
                return [dead(deadletter.STAGE_VALIDATE, f"{rej.code}: {rej.detail}", rej.code)]
            negotiator, reply = handle_request(state.get("neg"), record, self.settings.negotiator_write_enabled,
                                               self.limits)
            outs.append(Out(catalog.NEGOTIATOR_REPLIES, user, reply, []))
            state.set("neg", negotiator)
            forgotten = nodes_to_forget(um.live_nodes(), forgotten_fingerprints(negotiator))
            for deletion in memory_step.forget_deletions(user, record, um, forgotten):
                self.emit(outs, user, um, process_event(um, deletion, self.consolidation, self.promotion), state, names)
            return outs
        out = memory_step.process(topic, um, record, self.consolidation, self.promotion, self.limits)
        for rej in out.dead_letters:
            outs.append(dead(deadletter.STAGE_VALIDATE, f"{rej.code}: {rej.detail}", rej.code,
                             keep_value=not rej.redact_value))
        if not out.duplicate:
            self.emit(outs, user, um, out, state, names)
        return outs

    def emit(self, outs: list[Out], user: str, um: UserMemory, out: Outcome, state: State, names: set[str]) -> None:
        """An outcome's output records (`memory_step.outputs`), and the user's changed rows into
        the state (as the worker's `MemoryStore.stage` lays them out)."""
        threshold = threshold_for(user, None, self.settings.relay_threshold) if out.ledger else None
        records, _relayed = memory_step.outputs(user, um, out, threshold)
        outs.extend(Out(topic, key, value, []) for topic, key, value in records)
        rows: dict[str, Any] = {node["node_id"]: node for node in out.node_upserts}
        rows.update((node_id, None) for node_id in out.node_deletions)
        sealed, dropped = um.seen_changes()
        rows.update(chunk_rows(sealed, dropped))
        rows.update(side_rows(um.side_changes()))
        renamed = False
        for rest, row in rows.items():
            if row is None:
                state.delete(f"r/{rest}")
                renamed |= rest in names
                names.discard(rest)
            else:
                state.set(f"r/{rest}", row)
                renamed |= rest not in names
                names.add(rest)
        if renamed:
            state.set("rows", sorted(names))
        state.set("aux", um.aux_record(compact=True))
        self.writes += 1
        gen = f"{self.me}:{self.writes}"
        state.set("gen", gen)
        self.users[user] = (um, gen, names)

    def user(self, user: str, state: State) -> tuple[UserMemory, set[str]] | str:
        """The user's state: the one this process keeps while it wrote the user last, else read
        from the rows (`load_user`, as the worker reads its rows); a str says why it cannot be
        rebuilt (the worker's `UserContained`)."""
        kept = self.users.get(user)
        gen = state.get("gen")
        if kept is not None and kept[1] == gen:
            return kept[0], kept[2]
        names = set(state.get("rows") or ())
        aux = state.get("aux")
        rows: list[tuple[str, Any]] = [] if aux is None else [(user, aux)]
        rows += [(f"{user}/{rest}", state.get(f"r/{rest}")) for rest in sorted(names)]
        loaded = load_user(user, rows, dedup_max_ids=self.settings.dedup_max_ids, index_config=self.index_config)
        if loaded.memory is None:
            return memory_step.contained(loaded.corrupt or "unreadable rows")
        self.users[user] = (loaded.memory, gen, names)
        return loaded.memory, names


class _NullValue(WireFormatError):
    """An input record with no value (the worker's `streams.runtime.app._NullValue`)."""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--output-prefix", required=True, help="the outputs go to <prefix><catalog topic>")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--state-dir", required=True, help="Quix Streams' state directory (RocksDB)")
    args = ap.parse_args()

    settings = Settings.from_env()
    warm_up(settings.index_config())  # the core's compiled loops before the first record, as a worker does
    codecs = CodecFactory.from_url(args.registry)
    codecs.register(OUTPUTS)  # as a worker does at start: the subjects' ids frame what it writes
    job = MemoryJob(settings, codecs)
    tally = Tally(args.count)

    app = Application(broker_address=args.broker, consumer_group=args.group, auto_offset_reset="earliest",
                      loglevel="WARNING", state_dir=args.state_dir)
    outputs = {t: app.topic(f"{args.output_prefix}{t}", key_serializer=Key(),
                            value_serializer=Encoded(codecs.codec(catalog.topic(t).value_schema).encode))
               for t in OUTPUTS}

    def step(value: bytes | None, key: bytes | None, timestamp: int, headers: Any, state: State) -> list[Out]:
        outs = job(value, key, timestamp, headers, state)
        if tally.seen():
            app.stop()
        return outs

    frames = [app.dataframe(app.topic(t, key_deserializer="bytes", value_deserializer="bytes")) for t in INPUTS]
    sdf = frames[0]
    for other in frames[1:]:
        sdf = sdf.concat(other)
    sdf = sdf.apply(step, stateful=True, metadata=True, expand=True)
    sdf = sdf.set_headers(lambda out, _key, _ts, _headers: out.headers)
    sdf.to_topic(lambda out, _key, _ts, _headers: outputs[out.topic], key=lambda out: out.key)
    app.run()
    print(tally.result())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
