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

The agent's durable state is `MemoryStore` (streams/agents/memory_store.py); the relay-policy
agent (streams/agents/relay_policy.py) is the one writer of per-user relay thresholds; the HTTP
views are in streams/api/memory.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from streams.agents import memory_step, prefill, relay_policy
from streams.agents.memory_store import STATE_TABLE, MemoryStore, UserContained
from streams.agents.negotiator_calls import NegotiatorCalls
from streams.analytics import classify_outcome
from streams.contracts import catalog
from streams.contracts.deadletter import STAGE_APPLY, STAGE_VALIDATE
from streams.core import (
    ConsolidationPolicy,
    Outcome,
    PromotionPolicy,
    UserMemory,
    process_event,
)
from streams.core.erasure import ErasurePolicy, erase_step, validate_erase_request
from streams.core.housekeeping import HousekeepingPolicy, sweep_memory
from streams.core.negotiator import forgotten_fingerprints, handle_request, nodes_to_forget, validate_request
from streams.core.state import MissingHistory
from streams.runtime.checkpoint import Checkpoint
from streams.runtime.handlers import Rejected
from streams.runtime.topology import Processor, Timer

from .user_cache import SweepSlices, may_expire

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.memory")

PROCESSOR = Processor(
    "memory-consolidate", __name__,
    "One user's memory: consolidation of events and candidates, the missed-memory audit of turns, "
    "negotiator remember/forget, erasure steps; decay and retention by a timer.",
    sources=(catalog.MEMORY_EVENTS, catalog.MEMORY_CANDIDATES, catalog.MEMORY_TURNS, catalog.NEGOTIATOR_REQUESTS,
             catalog.ERASE_REQUESTS),
    stores=(STATE_TABLE, "negotiator", "relay-policy"),
    timers=(Timer("memory-housekeeping", catalog.MEMORY_CANDIDATES,
                  "decay and retention of the partition's users (MEMSTREAM_HOUSEKEEPING_MAX_ROWS_PER_TICK rows, "
                  "MEMSTREAM_HOUSEKEEPING_MAX_SECONDS_PER_TICK seconds a tick)"),),
    sinks=(catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.MEMORY_QUARANTINE, catalog.MEMORY_NODES,
           catalog.NEGOTIATOR_REPLIES, catalog.ERASE_REQUESTS, catalog.ERASE_RECEIPTS, catalog.MEMORY_ANALYTICS,
           catalog.DLQ),
    internal_sinks=(relay_policy.TOPIC,),
    feeds=("analytics",),
)
KEY_FIELD = memory_step.KEY_FIELD  #: the field of each input that must equal its key


def policies(rt: Runtime) -> tuple[ConsolidationPolicy, PromotionPolicy]:
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


class MemoryAgent(NamedTuple):
    """What the memory agent registered, for the API to read and send through."""

    store: MemoryStore
    policy_topic: Any
    calls: NegotiatorCalls


def register(rt: Runtime) -> MemoryAgent:
    store = MemoryStore(rt)
    policy_topic = relay_policy.register(rt, store)
    calls = NegotiatorCalls(rt)
    consolidation, promotion = policies(rt)
    limits = rt.settings.limits()
    retention = HousekeepingPolicy()
    erasure = ErasurePolicy(max_nodes_per_step=rt.settings.erase_max_nodes_per_step,
                            max_receipt_ids=rt.settings.erase_receipt_max_ids)

    async def apply(cp: Checkpoint, event, key: str, record: dict) -> None:
        topic = event.message.topic
        record_ms = int(event.message.timestamp * 1000) if event.message.timestamp else None
        if (refused := memory_step.refusal(topic, key, record, record_ms, limits)) is not None:  # before any state
            raise Rejected(refused.reason, refused.rule)
        try:
            um = store.user(key, cp)
        except UserContained as exc:
            raise Rejected(str(exc), "memory.user_contained", stage=STAGE_APPLY) from None
        if topic == catalog.NEGOTIATOR_REQUESTS:
            await negotiate(cp, key, record, um)
            return
        if topic == catalog.ERASE_REQUESTS:
            await erase(cp, key, record, um)
            return
        out = memory_step.process(topic, um, record, consolidation, promotion, limits)
        for rej in out.dead_letters:
            await cp.dead_letter(STAGE_VALIDATE, f"{rej.code}: {rej.detail}", rej.code,
                                 keep_value=not rej.redact_value)
        if out.duplicate:
            rt.metrics.inc_label("duplicate", topic)
            return
        if out.decision is not None:
            rt.metrics.inc_label("decision", out.decision.action)
        await emit(cp, key, um, out)

    async def emit(cp: Checkpoint, key: str, um: UserMemory, out: Outcome) -> None:
        """Send an outcome (ledger and its relay view, quarantine, node rows) and stage the
        user's rows through the batch's checkpoint (written once its outputs are acknowledged:
        streams.runtime.checkpoint)."""
        records, relayed = memory_step.outputs(key, um, out, store.relay_threshold(key) if out.ledger else None)
        for topic, record_key, value in records:
            await cp.send(topic, record_key, value)
        rt.feed_analytics(cp, classify_outcome(out, relayed))
        store.stage(cp, key, um, out)

    async def negotiate(cp: Checkpoint, key: str, request: dict, um: UserMemory) -> None:
        """negotiator.requests.v1 → negotiator.replies.v1; a forget also deletes the user's
        memory nodes holding the forgotten content (and they can never re-form)."""
        rej = validate_request(request, limits)  # ids and sizes that a reply or the memo would carry
        if rej is not None:
            raise Rejected(f"{rej.code}: {rej.detail}", rej.code)
        state, reply = handle_request(cp.read(store.negotiator, key), request,
                                      rt.settings.negotiator_write_enabled, limits)
        await cp.send(catalog.NEGOTIATOR_REPLIES, key, reply)
        cp.write(store.negotiator, key, state)
        rt.count(f"negotiator:{request.get('op')}")
        forgotten = nodes_to_forget(um.live_nodes(), forgotten_fingerprints(state))
        for deletion in memory_step.forget_deletions(key, request, um, forgotten):
            await emit(cp, key, um, process_event(um, deletion, consolidation, promotion))
        calls.answered(request["request_id"], reply)

    async def erase(cp: Checkpoint, key: str, request: dict, um: UserMemory) -> None:
        """memory.erase-requests.v1: one step of a user's erasure (streams/core/erasure.py).
        Outputs first (node nulls, ledger deletions and relay tombstones, the next step or the
        receipt, the analytics tombstone, the relay-policy removal), rows after (the batch
        protocol of streams/runtime/checkpoint.py), so a crash anywhere repeats the same step."""
        rej = validate_erase_request(request, limits)
        if rej is not None:
            raise Rejected(f"{rej.code}: {rej.detail}", rej.code)
        step = erase_step(um, request, negotiator_state=cp.read(store.negotiator, key),
                          relay_override=store.relay_policy.get(key), policy=erasure, limits=limits)
        if step.duplicate:
            rt.count(f"duplicate:{catalog.ERASE_REQUESTS}")
            return
        await emit(cp, key, um, step.outcome)
        rt.count("erase:nodes", len(step.outcome.node_deletions))
        if step.continuation is not None:
            value = rt.codecs.codec(catalog.topic(catalog.ERASE_REQUESTS).value_schema).encode(step.continuation)
            cp.record_ack(await rt.inputs[catalog.ERASE_REQUESTS].send(key=key.encode(), value=value))
            return
        if step.negotiator_state is not None:
            cp.write(store.negotiator, key, step.negotiator_state)
        if step.remove_relay_policy:  # through the relay-policy agent, the table's one writer
            removal = {"erase": request["request_id"], "token": str(request.get("requested_by") or ""),
                       "requested_at": int(request["timestamp"]), "worker": rt.worker_name}
            cp.record_ack(await policy_topic.send(key=key.encode(), value=orjson.dumps(removal)))
        if step.erase_analytics:
            rt.erase_analytics(cp, key)  # staged after this batch's own increments for the user
            await cp.send(catalog.MEMORY_ANALYTICS, key, None)
        await cp.send(catalog.ERASE_RECEIPTS, key, step.receipt)
        rt.count("erase:receipts")
        log.warning("erasure %s of %s complete: %d nodes, %d negotiator memories, relay policy %s (%d steps)",
                    request["request_id"], key, step.receipt["nodes_erased"], step.receipt["negotiator_memories_erased"],  # type: ignore[index]
                    "removed" if step.remove_relay_policy else "none", step.receipt["steps"])  # type: ignore[index]

    slices = SweepSlices(rt.settings.housekeeping_max_rows_per_tick, rt.settings.housekeeping_max_seconds_per_tick)

    async def housekeeping(cp: Checkpoint, partition: int, now_ms: int) -> None:
        """Decay and retention for the users of one partition (a partition-local timer), at most
        MEMSTREAM_HOUSEKEEPING_MAX_ROWS_PER_TICK rows and MEMSTREAM_HOUSEKEEPING_MAX_SECONDS_PER_TICK
        of the memory state's lock a tick (`SweepSlices`): each user's rows are
        read in turn (a loaded user is used as it is), a user's state is built only when one of
        its node rows expires (`may_expire`), only a changed user is kept in the cache, and the
        event loop runs between users."""
        after = slices.start(partition)
        for user, um, redo, rows in store.partition_users(partition, lambda rows: may_expire(rows, now_ms, retention),
                                                          after, lambda list_them: slices.users(partition, list_them)):
            out = None
            if um is not None:
                try:
                    out = sweep_memory(um, now_ms, retention)
                except MissingHistory:  # the user is contained now (`StoredHistory.lost`): the sweep goes on
                    pass
            if um is not None and out is not None and (out.ledger or out.node_deletions):
                store.keep(user, um, redo)
                rt.count("housekeeping:deleted", len(out.node_deletions))
                await emit(cp, user, um, out)
            if slices.read(partition, user, rows):
                return
            await asyncio.sleep(0)

    prefill.register(rt, store)
    rt.ticks("memory-housekeeping", catalog.MEMORY_CANDIDATES, housekeeping, cache=store, lock=store.lock)
    rt.stateful_agent(rt.input_channel(*PROCESSOR.sources), "memory-consolidate", apply, cache=store, lock=store.lock)
    return MemoryAgent(store, policy_topic, calls)
