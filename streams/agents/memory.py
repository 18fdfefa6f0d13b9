"""The memory agent: consolidation, lifecycle, relay, audit and negotiator tools for one user's
partition-local state, and the memory HTTP API. The rules are in `streams/core`.

Topology (every input is keyed by the user — `motebit_id`, or `user_id` for the negotiator,
taken to be the same identity — and has the same partition count, so one agent reads them all
and a user's state is partition-local):

    memory.events.v1 ───────┐                      ┌─> memory.ledger.v1     (key motebit_id)
    memory.candidates.v1 ───┤                      ├─> memory.relay.v1      (redacted, tombstoned)
    memory.turns.v1 ────────┼─> memory-consolidate ─┼─> memory.nodes.v1      (key motebit_id/node_id, null = deleted)
    negotiator.requests.v1 ─┤   tables:             ├─> memory.quarantine.v1
    memory.erase-requests.v1┘   memory-state        ├─> negotiator.replies.v1
    <app>-memory-housekeeping-ticks (timer)         ├─> memory.erase-receipts.v1 (and the next step of an erasure)
                              negotiator,           └─> pipeline.dlq.v1
                              relay-policy

Durable state: ONE table, `memory-state`, so that all of a user's rows share one changelog
partition and keep their write order: key `motebit_id` → the user's aux row (clock, the open
tail of the de-duplication window, and `pending`: the other rows of the last write batch, a redo
log), key `motebit_id/node_id` → a node row, key `motebit_id/~seen/k` → sealed chunk k of the
de-duplication window (so a write does not carry the whole window), and one small side row per
deleted node id (`~del/<id>`), deleted content fingerprint (`~fp/<sha256>`) and pin
(`~pin/<node_id>`), so that no row grows with a user's history (the layout is defined, read and
laid out in `streams.agents.user_cache`; the core's `UserMemory` knows no keys). The per-user `UserMemory` with its
similarity index is derived: read from that user's rows on first touch (a prefix scan of its
partition's RocksDB: `streams.agents.state_scan`) into an LRU bounded by MEMSTREAM_LOADED_NODES_MAX
(`streams.agents.user_cache`), and dropped at every rebalance (so after a restart or a partition
move a user is read again from the recovered changelog, when it is next needed).

Write order (streams/effects.py): a batch's outputs are sent and acknowledged first; then the
aux rows, then the node rows. So "the input is marked seen" implies "its outputs are durable",
and an aux row in the changelog without the node rows after it is completed from `pending`. A
crash re-processes the unwritten part of a batch with the same derived ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator

import orjson
from faust.web import Request, Response

from .. import catalog, effects
from ..app import Rejected
from ..core import (
    ConsolidationPolicy,
    Outcome,
    PromotionPolicy,
    UserMemory,
    event_id_for,
    process_candidate,
    process_event,
)
from ..analytics import classify_outcome
from ..core.audit import audit_turn
from ..core.erasure import ErasurePolicy, erase_request, erase_step, validate_erase_request
from ..core.limits import quote
from ..core.housekeeping import HousekeepingPolicy, sweep_memory
from ..core.ids import NEGOTIATOR_REQUEST, input_reference
from ..core.ingest import REDACTED_CONTENT, time_problem, validate_turn
from ..core.limits import LimitExceeded, check_id, id_problem
from ..core.negotiator import (
    forget_result_of,
    forgotten_fingerprints,
    handle_request,
    nodes_to_forget,
    validate_request,
)
from ..core.redaction import relay_events, threshold_for
from ..deadletter import STAGE_APPLY, STAGE_VALIDATE
from ..core.vocabulary import SENSITIVITY_LEVELS
from . import state_scan
from .user_cache import SweepSlices, UserCache, chunk_rows, load_user, may_expire, side_rows, weight
from ..http import SCOPE_ADMIN, SCOPE_NEGOTIATOR, BadRequest, Token, authenticated, mask_node, parse_ms, visible

if TYPE_CHECKING:
    from ..app import Runtime

log = logging.getLogger("memstream.memory")

SOURCES = [catalog.MEMORY_EVENTS, catalog.MEMORY_CANDIDATES, catalog.MEMORY_TURNS, catalog.NEGOTIATOR_REQUESTS,
           catalog.ERASE_REQUESTS]
KEY_FIELD = {catalog.MEMORY_EVENTS: "motebit_id", catalog.MEMORY_CANDIDATES: "motebit_id",
             catalog.MEMORY_TURNS: "motebit_id", catalog.NEGOTIATOR_REQUESTS: "user_id",
             catalog.ERASE_REQUESTS: "motebit_id"}
NODE_KEY_SEP = "/"
NEGOTIATOR_SENSITIVITY = "secret"  #: the level negotiator memories are shown at (they carry none)
STATE_TABLE = "memory-state"  #: motebit_id -> aux row (with `pending`); motebit_id/node_id -> node row


def node_key(motebit_id: str, node_id: str) -> str:
    """The key of a user's row: `<motebit_id>/<rest>`. Collision-free because a user id can never
    contain the separator (validated at ingest: `streams.core.ingest`), so the first `/` always
    ends the user id; `rest` (a node id, or an internal row's suffix: `streams.agents.user_cache`) may contain
    anything."""
    return f"{motebit_id}{NODE_KEY_SEP}{node_id}"


class UserContained(Exception):
    """The user's durable rows could not be rebuilt on this worker (see `MemoryStore._rebuild`)."""

    def __init__(self, motebit_id: str, why: str) -> None:
        super().__init__(f"the memory state of this user cannot be rebuilt ({why}); its records are "
                         "dead-lettered until an operator repairs the rows")
        self.motebit_id = motebit_id


def threshold_change(value: bytes) -> dict:
    """A relay-policy topic value: `{"threshold", "token", "requested_at", "worker"}` (JSON), or
    the bare level an earlier version wrote (its token is unknown)."""
    if value.startswith(b"{"):
        change = orjson.loads(value)
        return {"threshold": change["threshold"], "token": str(change.get("token") or "unknown"),
                "requested_at": int(change.get("requested_at") or 0), "worker": str(change.get("worker") or "")}
    return {"threshold": value.decode(), "token": "unknown (earlier version)", "requested_at": 0, "worker": ""}


def policies(rt: "Runtime") -> tuple[ConsolidationPolicy, PromotionPolicy]:
    s = rt.settings
    return (
        ConsolidationPolicy(
            text_merge_threshold=s.text_merge_threshold,
            text_supersede_threshold=s.text_supersede_threshold,
            embedding_merge_threshold=s.embedding_merge_threshold,
            embedding_supersede_threshold=s.embedding_supersede_threshold,
        ),
        PromotionPolicy(min_reinforcements=s.promotion_min_reinforcements,
                        min_confidence=s.promotion_min_confidence),
    )


class MemoryStore:
    """The partition-local memory state of this worker: the tables, and the per-user
    `UserMemory` derived from them, loaded on first touch into a bounded LRU
    (`streams.agents.user_cache`; bound: MEMSTREAM_LOADED_NODES_MAX).

    A user is loaded from its own rows only (`state_scan.user_rows`: a prefix scan of its
    partition's RocksDB) when a record, a housekeeping sweep or an HTTP query first needs it.
    Nothing is read at a rebalance: it only drops the loaded users (`_on_rebalance`), so a
    restarted worker is ready as soon as Faust has restored the changelog."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.state = rt.table(STATE_TABLE)  # motebit_id -> aux row; motebit_id/node_id -> node row
        self.negotiator = rt.table("negotiator")
        self.relay_policy = rt.table("relay-policy")  # motebit_id -> consented threshold
        #: motebit_id -> its relay-policy row (None: no override), read once per user: the table's
        #: one writer (the relay-policy agent) drops a user's entry when it writes, a rebalance all
        self.relay_overrides: dict[str, Any] = {}
        self.lock = asyncio.Lock()  # one writer at a time: the agent's batches, the timer's sweeps
        self.users = UserCache(rt.settings.loaded_nodes_max)
        self.redo: dict[str, dict[str, Any]] = {}  # loaded user -> redo-log rows not yet rewritten
        self.corrupt: dict[str, str] = {}  # user -> why its rows could not be rebuilt (contained)
        self.foreign: dict[str, int] = {}  # user -> rows under its keys owned by another user
        self.index_config = rt.settings.index_config()
        self.valid = False
        rt.app.on_partitions_assigned.connect(self._on_rebalance)
        rt.app.on_partitions_revoked.connect(self._on_rebalance)
        # and again once the new partitions' changelogs are recovered (a user loaded in
        # between, e.g. by an HTTP query, may have been read from a half-recovered table)
        rt.app.on_rebalance_complete.connect(self._on_rebalance)

    async def _on_rebalance(self, *args: Any, **kwargs: Any) -> None:
        self.valid = False
        self.relay_overrides.clear()

    def relay_threshold(self, motebit_id: str) -> str:
        """`threshold_for` the user (its override, else MEMSTREAM_RELAY_THRESHOLD), without a
        table read per record."""
        if motebit_id not in self.relay_overrides:
            self.relay_overrides[motebit_id] = self.relay_policy.get(motebit_id)
        override = self.relay_overrides[motebit_id]
        return threshold_for(motebit_id, None if override is None else {motebit_id: override},
                             self.rt.settings.relay_threshold)

    # DerivedCache (streams.effects): `refresh` before every batch attempt (the previous one is
    # written, or dropped by `invalidate`), `invalidate` after a failed attempt.
    def refresh(self) -> None:
        if not self.valid:
            self._reset()
        else:
            self._forget(self.users.unpin_all())

    def invalidate(self) -> None:
        """The failed attempt's effects are in the users it touched (pinned): drop those, they
        are loaded again from the table; every other loaded user is as the table has it."""
        pinned = list(self.users.pinned)
        self.users.drop(pinned)
        self._forget(pinned, evicted=False)

    def _reset(self) -> None:
        """Forget every loaded user (after a rebalance): each is read again on first touch."""
        self.users.clear()
        self.redo.clear()
        self.corrupt.clear()
        self.foreign.clear()
        self.valid = True
        self._gauges()

    def _forget(self, users: list[str], evicted: bool = True) -> None:
        if users and evicted:
            self.rt.count("memory_users:evicted", len(users))
        for u in users:
            self.redo.pop(u, None)  # the aux row still has it: read again with the user

    def _gauges(self) -> None:
        self.rt.metrics.set_gauge("memory_users_contained", len(self.corrupt))
        self.rt.metrics.set_gauge("memory_foreign_rows", sum(self.foreign.values()))
        self.rt.metrics.set_gauge("memory_users_loaded", len(self.users))
        self.rt.metrics.set_gauge("memory_nodes_loaded", self.users.total)

    def _readable(self) -> None:
        # A reader outside a batch (HTTP) drops stale users; inside one the loaded users stay
        # (the batch's own hold its effects not yet in the tables).
        if not self.valid and not self.lock.locked():
            self._reset()

    def _load(self, motebit_id: str, rows: list | None = None) -> tuple[UserMemory | None, dict]:
        """Read a user from its rows: its state and the redo log of its aux row, or (None, {})
        for a user whose rows cannot be rebuilt (contained: recorded in `corrupt`). Not cached."""
        if rows is None:
            rows = state_scan.user_rows(self.state, motebit_id, self.rt.partition_of(motebit_id))
        loaded = load_user(motebit_id, rows, dedup_max_ids=self.rt.settings.dedup_max_ids,
                           index_config=self.index_config)
        if loaded.foreign:
            if motebit_id not in self.foreign:
                log.warning("memory state of %r: skipped %d rows whose owner differs from their key (left by a "
                            "version that allowed %r in ids; see README, 'State from earlier versions')",
                            motebit_id[:200], loaded.foreign, NODE_KEY_SEP)
            self.foreign[motebit_id] = loaded.foreign
        if loaded.memory is None:
            if motebit_id not in self.corrupt:
                log.error("memory state of user %r cannot be rebuilt (%s): its records are dead-lettered and its "
                          "queries answer 503 until the rows are repaired", motebit_id[:200], loaded.corrupt)
            self.corrupt[motebit_id] = loaded.corrupt or "unreadable rows"
            self._gauges()
        return loaded.memory, loaded.redo

    def _keep(self, motebit_id: str, um: UserMemory, redo: dict) -> None:
        """Cache a loaded user with its redo log (rewritten by its next write: `stage`); inside
        a batch it is pinned until the batch is written."""
        self.rt.count("memory_users:loaded")
        self._forget(self.users.put(motebit_id, um, pin=effects.current_batch() is not None))
        if redo:
            self.redo[motebit_id] = redo
        self._gauges()

    def user(self, motebit_id: str) -> UserMemory:
        """The user's state (loaded on first touch); raises `UserContained` for a user whose rows
        could not be rebuilt. Inside a batch the user is pinned until the batch is written."""
        self._readable()
        if motebit_id in self.corrupt:
            raise UserContained(motebit_id, self.corrupt[motebit_id])
        um = self.users.get(motebit_id, pin=effects.current_batch() is not None)
        if um is None:
            um, redo = self._load(motebit_id)
            if um is None:
                raise UserContained(motebit_id, self.corrupt[motebit_id])
            self._keep(motebit_id, um, redo)
        return um

    def partition_users(self, partition: int, wanted: Callable[[list], bool] | None = None, after: str | None = None
                        ) -> Iterator[tuple[str, UserMemory | None, dict | None, int]]:
        """`(user, state, redo, rows)` of every user of a local partition in user-id order
        (after `after`, when given), for a sweep; `rows`: how many rows were read for it. A loaded
        user comes as it is (redo None); any other is read from the table one at a time, skipped
        (state None) unless `wanted(rows)`, and *not* cached, so a sweep does not flush the LRU:
        `keep(user, state, redo)` caches one that the sweep changes. Contained users are skipped."""
        self._readable()
        for user, rows in state_scan.users_rows(self.state, partition, self.rt.partition_of, after):
            if user in self.corrupt:
                continue
            um = self.users.get(user)
            if um is not None:
                yield user, um, None, weight(um)
                continue
            read = rows()
            if wanted is not None and not wanted(read):
                yield user, None, None, len(read)  # one user read: the caller lets the event loop run
                continue
            um, redo = self._load(user, read)
            if um is not None:
                yield user, um, redo, len(read)

    def keep(self, motebit_id: str, um: UserMemory, redo: dict | None) -> None:
        """A user from `partition_users` that the batch changes: cached (and pinned) so that the
        batch's effects stay with it until they are written."""
        if self.users.get(motebit_id, pin=effects.current_batch() is not None) is None:
            self._keep(motebit_id, um, redo or {})

    def stage(self, motebit_id: str, um: UserMemory, out: Outcome) -> None:
        """Stage the user's rows after an outcome: the aux row first (with the batch's other
        rows of this user as its redo log: `pending`), then the node rows and the sealed
        chunks of the de-duplication window (the aux row keeps only its open tail). The first
        write after a rebuild also rewrites the rows of the user's last redo log: a crash may
        have kept them out of the table, and the new aux row will no longer carry them."""
        for suffix, row in self.redo.pop(motebit_id, {}).items():
            effects.write(self.state, node_key(motebit_id, suffix), effects.DELETE if row is None else row)
        for node in out.node_upserts:
            effects.write(self.state, node_key(motebit_id, node["node_id"]), node)
        for node_id in out.node_deletions:
            effects.write(self.state, node_key(motebit_id, node_id), effects.DELETE)
        sealed, dropped = um.seen_changes()
        side = side_rows(um.side_changes())  # deleted ids and fingerprints, pins: one small row each
        for suffix, row in {**chunk_rows(sealed, dropped), **side}.items():
            effects.write(self.state, node_key(motebit_id, suffix), effects.DELETE if row is None else row)
        # the aux row carries these rows as its redo log: past the budget, the batch is made
        # durable after this record (streams.effects), so the aux row stays bounded
        staged = sum(len(orjson.dumps(n)) for n in out.node_upserts) + sum(len(orjson.dumps(r)) for r in sealed.values())
        effects.add_bytes(motebit_id, staged + 64 * (len(out.node_deletions) + len(side)),
                          self.rt.settings.state_batch_max_bytes)

        def aux_row(batch: effects.Batch | None) -> dict:
            rows = batch.staged_rows(self.state, motebit_id) if batch else {}
            pending = {k.split(NODE_KEY_SEP, 1)[1]: (None if v is effects.DELETE else v) for k, v in rows.items()}
            return {**um.aux_record(compact=True), "pending": pending}

        effects.write(self.state, motebit_id, aux_row, first=True)


def register(rt: "Runtime") -> None:
    app = rt.app
    store = MemoryStore(rt)
    consolidation, promotion = policies(rt)
    limits = rt.settings.limits()
    retention = HousekeepingPolicy()
    erasure = ErasurePolicy(max_nodes_per_step=rt.settings.erase_max_nodes_per_step,
                            max_receipt_ids=rt.settings.erase_receipt_max_ids)

    async def apply(event, key: str, record: dict) -> None:
        topic = event.message.topic
        if (problem := id_problem(key, limits)) is not None:  # before any state is touched
            code, what = problem
            if key == "":
                code = f"missing_{KEY_FIELD[topic]}"
            raise Rejected(f"{code}: key {what}", code)
        if record.get(KEY_FIELD[topic]) != key:
            raise Rejected(f"record {KEY_FIELD[topic]} {quote(record.get(KEY_FIELD[topic]))} differs from its key {quote(key)}",
                           "memory.key_mismatch")
        record_ms = int(event.message.timestamp * 1000) if event.message.timestamp else None
        if (late := time_problem(record, record_ms, limits)) is not None:
            raise Rejected(f"{late.code}: {late.detail}", late.code)
        try:
            um = store.user(key)
        except UserContained as exc:
            raise Rejected(str(exc), "memory.user_contained", stage=STAGE_APPLY) from None
        if topic == catalog.NEGOTIATOR_REQUESTS:
            await negotiate(key, record, um)
            return
        if topic == catalog.ERASE_REQUESTS:
            await erase(key, record, um)
            return
        if topic == catalog.MEMORY_TURNS:
            out = audit(um, record)
        elif topic == catalog.MEMORY_CANDIDATES:
            out = process_candidate(um, record, consolidation, promotion, limits=limits)
        else:
            out = process_event(um, record, consolidation, promotion, limits=limits)
        for rej in out.dead_letters:
            await rt.dead_letter(event, STAGE_VALIDATE, f"{rej.code}: {rej.detail}", rej.code,
                                 keep_value=not rej.redact_value)
        if out.duplicate:
            rt.metrics.inc_label("duplicate", topic)
            return
        if out.decision is not None:
            rt.metrics.inc_label("decision", out.decision.action)
        await emit(key, um, out)

    async def emit(key: str, um: UserMemory, out: Outcome) -> None:
        """Send an outcome (ledger and its relay view, quarantine, node rows) and stage the
        user's rows (written once the batch's outputs are acknowledged: streams.effects)."""
        relayed = []
        if out.ledger:  # a table read: only when there is something to relay
            threshold = store.relay_threshold(key)
        for ev in out.ledger:
            await rt.send(catalog.MEMORY_LEDGER, key, ev)
            for peer_ev in relay_events(ev, threshold, um.deleted_node_ids,
                                        deleted_fingerprints=um.deleted_fingerprints,
                                        deleted_rows=out.deleted_rows):
                await rt.send(catalog.MEMORY_RELAY, key, peer_ev)
                relayed.append(peer_ev)
        rt.feed_analytics(classify_outcome(out, relayed))
        for q in out.quarantined:
            await rt.send(catalog.MEMORY_QUARANTINE, key, q)
        for node in out.node_upserts:
            await rt.send(catalog.MEMORY_NODES, node_key(key, node["node_id"]), node)
        for node_id in out.node_deletions:
            await rt.send(catalog.MEMORY_NODES, node_key(key, node_id), None)
        store.stage(key, um, out)

    def audit(um: UserMemory, turn: dict) -> Outcome:
        """memory.turns.v1: the missed-memory audit (local-only: never reaches the relay)."""
        rej = validate_turn(turn, limits)
        if rej is not None:
            return Outcome(rejections=[rej])
        seen_key = "t:" + turn["turn_id"]
        if seen_key in um.seen:
            um.seen.duplicates += 1
            return Outcome(duplicate=True)
        um.seen.add(seen_key, int(turn["timestamp"]))
        ev = audit_turn(turn, version_clock=um.next_clock())
        return Outcome(ledger=[ev] if ev else [])

    async def negotiate(key: str, request: dict, um: UserMemory) -> None:
        """negotiator.requests.v1 → negotiator.replies.v1; a forget also deletes the user's
        memory nodes holding the forgotten content (and they can never re-form)."""
        rej = validate_request(request, limits)  # ids and sizes that a reply or the memo would carry
        if rej is not None:
            raise Rejected(f"{rej.code}: {rej.detail}", rej.code)
        state, reply = handle_request(effects.read(store.negotiator, key), request,
                                      rt.settings.negotiator_write_enabled, limits)
        await rt.send(catalog.NEGOTIATOR_REPLIES, key, reply)
        effects.write(store.negotiator, key, state)
        rt.count(f"negotiator:{request.get('op')}")
        for node_id in nodes_to_forget(um.live_nodes(), forgotten_fingerprints(state)):
            deletion = {"event_id": event_id_for(key, f"{request['request_id']}/{node_id}", "memory_deleted"),
                        "motebit_id": key, "device_id": None, "timestamp": int(request["timestamp"]),
                        "version_clock": um.next_clock(), "event_type": "memory_deleted",
                        "payload": {"node_id": node_id},
                        "caused_by": input_reference(NEGOTIATOR_REQUEST, request["request_id"])}
            await emit(key, um, process_event(um, deletion, consolidation, promotion))
        waiter = pending_replies.pop(request["request_id"], None)
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    async def erase(key: str, request: dict, um: UserMemory) -> None:
        """memory.erase-requests.v1: one step of a user's erasure (streams/core/erasure.py).
        Outputs first (node nulls, ledger deletions and relay tombstones, the next step or the
        receipt, the analytics tombstone, the relay-policy removal), rows after (the batch
        protocol of streams/effects.py), so a crash anywhere repeats the same step."""
        rej = validate_erase_request(request, limits)
        if rej is not None:
            raise Rejected(f"{rej.code}: {rej.detail}", rej.code)
        step = erase_step(um, request, negotiator_state=effects.read(store.negotiator, key),
                          relay_override=store.relay_policy.get(key), policy=erasure, limits=limits)
        if step.duplicate:
            rt.count(f"duplicate:{catalog.ERASE_REQUESTS}")
            return
        await emit(key, um, step.outcome)
        rt.count("erase:nodes", len(step.outcome.node_deletions))
        if step.continuation is not None:
            value = rt.codecs.codec(catalog.topic(catalog.ERASE_REQUESTS).value_schema).encode(step.continuation)
            effects.record_ack(await rt.inputs[catalog.ERASE_REQUESTS].send(key=key.encode(), value=value))
            return
        if step.negotiator_state is not None:
            effects.write(store.negotiator, key, step.negotiator_state)
        if step.remove_relay_policy:  # through the relay-policy agent, the table's one writer
            removal = {"erase": request["request_id"], "token": str(request.get("requested_by") or ""),
                       "requested_at": int(request["timestamp"]), "worker": rt.worker_name}
            effects.record_ack(await policy_topic.send(key=key.encode(), value=orjson.dumps(removal)))
        if step.erase_analytics:
            rt.erase_analytics(key)  # staged after this batch's own increments for the user
            await rt.send(catalog.MEMORY_ANALYTICS, key, None)
        await rt.send(catalog.ERASE_RECEIPTS, key, step.receipt)
        rt.count("erase:receipts")
        log.warning("erasure %s of %s complete: %d nodes, %d negotiator memories, relay policy %s (%d steps)",
                    request["request_id"], key, step.receipt["nodes_erased"], step.receipt["negotiator_memories_erased"],
                    "removed" if step.remove_relay_policy else "none", step.receipt["steps"])

    slices = SweepSlices(rt.settings.housekeeping_max_rows_per_tick)

    async def housekeeping(partition: int, now_ms: int) -> None:
        """Decay and retention for the users of one partition (a partition-local timer), at most
        MEMSTREAM_HOUSEKEEPING_MAX_ROWS_PER_TICK rows a tick (`SweepSlices`): each user's rows are
        read in turn (a loaded user is used as it is), a user's state is built only when one of
        its node rows expires (`may_expire`), only a changed user is kept in the cache, and the
        event loop runs between users."""
        after = slices.start(partition)
        for user, um, redo, rows in store.partition_users(partition, lambda rows: may_expire(rows, now_ms, retention),
                                                          after):
            if um is not None:
                out = sweep_memory(um, now_ms, retention)
                if out.ledger or out.node_deletions:
                    store.keep(user, um, redo)
                    rt.count("housekeeping:deleted", len(out.node_deletions))
                    await emit(user, um, out)
            if slices.read(partition, user, rows):
                return
            await asyncio.sleep(0)

    rt.ticks("memory-housekeeping", catalog.MEMORY_CANDIDATES, housekeeping, cache=store, lock=store.lock)
    pending_replies: dict[str, asyncio.Future] = {}

    # Per-user relay thresholds change at run time through an internal topic keyed by the user
    # (so the table write happens in an event of the user's partition, as Faust requires).
    policy_topic = rt.internal_topic("relay-policy")

    @app.agent(policy_topic, name="relay-policy-agent")
    async def relay_policy_agent(stream):
        async for event in stream.events():
            user = event.message.key.decode()
            if event.message.value.startswith(b"{") and "erase" in (removal := orjson.loads(event.message.value)):
                old = store.relay_policy.pop(user, None)  # a changelog tombstone
                store.relay_overrides.pop(user, None)
                log.warning("security audit: relay threshold override of %s (%s) removed by erasure %s",
                            user, old or "none", removal["erase"])
                continue
            change = threshold_change(event.message.value)
            level = change["threshold"]
            old = store.relay_policy.get(user)
            audit = {"audit_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"memstream:{user}:relay_threshold:"
                                                 f"{change['requested_at']}:{change['token']}")),
                     "motebit_id": user, "action": "relay_threshold", "token_name": change["token"],
                     "old_value": old, "new_value": level, "requested_at": change["requested_at"],
                     "applied_at": int(time.time() * 1000), "worker": change["worker"]}
            await rt.send(catalog.SECURITY_AUDIT, user, audit)  # before the change takes effect
            store.relay_policy[user] = level
            store.relay_overrides.pop(user, None)
            log.warning("security audit: relay threshold of %s changed %s -> %s by token %s (requested %d at %s)",
                        user, old or f"default ({rt.settings.relay_threshold})", level, change["token"],
                        change["requested_at"], change["worker"] or "?")

    rt.stateful_agent(rt.input_channel(*SOURCES), "memory-consolidate", apply, cache=store, lock=store.lock)

    @app.page("/v1/memory/{motebit_id}/nodes")
    class UserNodes(rt.View):
        @authenticated
        async def get(self, request: Request, motebit_id: str, allowed: str) -> Response:
            return await self.route(request, store.state, motebit_id, lambda: self._local(request, motebit_id, allowed))

        async def _local(self, request: Request, motebit_id: str, allowed: str) -> Response:
            try:
                um = store.user(motebit_id)
            except UserContained as exc:
                return self.unavailable(str(exc))
            try:
                as_of = parse_ms(request.query, "as_of")
            except BadRequest as exc:
                return self.error(400, str(exc))
            include = set(filter(None, request.query.get("include", "").split(",")))
            if as_of is not None:
                nodes = um.as_of(as_of)
            elif "superseded" in include:
                nodes = list(um.nodes())
            else:
                nodes = list(um.live_nodes())
            shown = sorted((mask_node(n, allowed) for n in nodes), key=lambda n: (n["valid_from"], n["node_id"]))
            return self.reply({"motebit_id": motebit_id, "as_of": as_of, "nodes": shown})

    @app.page("/v1/memory/{motebit_id}/nodes/{node_id}")
    class OneNode(rt.View):
        @authenticated
        async def get(self, request: Request, motebit_id: str, node_id: str, allowed: str) -> Response:
            return await self.route(request, store.state, motebit_id, lambda: self._local(motebit_id, node_id, allowed))

        async def _local(self, motebit_id: str, node_id: str, allowed: str) -> Response:
            try:
                node = store.user(motebit_id).node(node_id)
            except UserContained as exc:
                return self.unavailable(str(exc))
            if node is None:
                return self.error(404, f"no node {node_id} for {motebit_id}")
            return self.reply(mask_node(node, allowed))

    @app.page("/v1/relay/{motebit_id}/threshold")
    class RelayThreshold(rt.View):
        @authenticated(scope=SCOPE_ADMIN)
        async def put(self, request: Request, motebit_id: str, allowed: str, token: Token) -> Response:
            try:
                level = (await self.json_body(request)).get("threshold")
            except BadRequest as exc:
                return self.error(400, str(exc))
            if level not in SENSITIVITY_LEVELS:
                return self.error(400, f"threshold must be one of {', '.join(SENSITIVITY_LEVELS)}")
            change = {"threshold": level, "token": token.name, "requested_at": int(time.time() * 1000),
                      "worker": rt.worker_name}
            await policy_topic.send(key=motebit_id.encode(), value=orjson.dumps(change))
            return self.reply({"motebit_id": motebit_id, "threshold": level, "status": "accepted"}, 202)

        @authenticated
        async def get(self, request: Request, motebit_id: str, allowed: str) -> Response:
            return await self.route(request, store.relay_policy, motebit_id, lambda: self._local(motebit_id))

        async def _local(self, motebit_id: str) -> Response:
            level = threshold_for(motebit_id, store.relay_policy, rt.settings.relay_threshold)
            return self.reply({"motebit_id": motebit_id, "threshold": level})

    @app.page("/v1/memory/{motebit_id}/erase")
    class Erase(rt.View):
        @authenticated(scope=SCOPE_ADMIN)
        async def post(self, request: Request, motebit_id: str, allowed: str, token: Token) -> Response:
            """Queue the erasure of a user (streams/core/erasure.py): 202 with the request id;
            the owner of the user's partition applies it and writes the receipt to
            memory.erase-receipts.v1. Any worker can accept it (it is a Kafka record)."""
            try:
                body = await self.json_body(request)
                request_id = body.get("requestId")
                if request_id is not None and not isinstance(request_id, str):
                    raise BadRequest(f"requestId must be a string, not {type(request_id).__name__}")
                record = erase_request(motebit_id, request_id or str(uuid.uuid4()),
                                       int(time.time() * 1000), token.name, limits)
            except BadRequest as exc:
                return self.error(400, str(exc))
            except LimitExceeded as exc:
                return self.error(400, str(exc))
            value = rt.codecs.codec(catalog.topic(catalog.ERASE_REQUESTS).value_schema).encode(record)
            await (await rt.inputs[catalog.ERASE_REQUESTS].send(key=motebit_id.encode(), value=value))
            log.warning("security audit: erasure %s of %s requested by token %s",
                        record["request_id"], motebit_id, token.name)
            return self.reply({"motebit_id": motebit_id, "request_id": record["request_id"], "status": "accepted",
                               "receipt_topic": catalog.ERASE_RECEIPTS}, 202)

    async def call_negotiator(user_id: str, body: dict, op: str) -> dict:
        """Send a request through negotiator.requests.v1 (same path as Kafka clients) and wait
        for this worker's agent to answer it."""
        request_id = str(body.get("requestId") or uuid.uuid4())
        record = {"request_id": request_id, "user_id": user_id, "op": op, "kind": body.get("kind"),
                  "content": body.get("content"), "sessionId": body.get("sessionId"),
                  "memoryId": body.get("memoryId"), "description": body.get("description"),
                  "timestamp": int(time.time() * 1000)}
        waiter = pending_replies[request_id] = asyncio.get_running_loop().create_future()
        value = rt.codecs.codec("negotiator_request").encode(record)
        await rt.inputs[catalog.NEGOTIATOR_REQUESTS].send(key=user_id.encode(), value=value)
        try:
            return await asyncio.wait_for(waiter, timeout=30)
        finally:
            pending_replies.pop(request_id, None)

    def mask_forget(result: dict, allowed: str) -> dict:
        """A forget result as the caller may see it. Negotiator memories carry no sensitivity:
        their content (walk-away prices, disclosure rules) is treated as `secret` (fail closed),
        so a token below `secret` gets ids and kinds with "[REDACTED]" content — an `ambiguous`
        reply is no read oracle for stored rules."""
        if visible(NEGOTIATOR_SENSITIVITY, allowed):
            return result
        def masked(view: dict) -> dict:
            return {**view, "content": REDACTED_CONTENT}
        if result.get("memory"):
            result = {**result, "memory": masked(result["memory"])}
        if result.get("candidates"):
            result = {**result, "candidates": [masked(v) for v in result["candidates"]]}
        return result

    class NegotiatorView(rt.View):
        op = ""

        @authenticated(scope=SCOPE_NEGOTIATOR)
        async def post(self, request: Request, user_id: str, allowed: str) -> Response:
            try:
                body = await self.json_body(request)
                check_id("user_id", user_id, limits)
                if body.get("requestId") is not None:
                    check_id("requestId", str(body.get("requestId")), limits)
            except BadRequest as exc:
                return self.error(400, str(exc))
            except LimitExceeded as exc:
                return self.error(400, str(exc))
            return await self.route(request, store.negotiator, user_id, lambda: self._local(user_id, body, allowed))

        async def _local(self, user_id: str, body: dict, allowed: str) -> Response:
            try:
                reply = await call_negotiator(user_id, body, self.op)
            except asyncio.TimeoutError:
                return self.unavailable("no answer within 30s (rebalancing?); retry with the same requestId")
            if reply.get("error"):
                return self.error(400, reply["error"])
            if self.op == "remember":
                return self.reply(reply["remembered"])  # the stored view, or null: write flag off
            return self.reply(mask_forget(forget_result_of(reply["forget"]), allowed))

    app.page("/v1/negotiator/{user_id}/remember")(type("Remember", (NegotiatorView,), {"op": "remember"}))
    app.page("/v1/negotiator/{user_id}/forget")(type("Forget", (NegotiatorView,), {"op": "forget"}))
