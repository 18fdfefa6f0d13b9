"""The memory agent's rules around the core for one input record, without Kafka or Faust: which
records it refuses before touching a user's state, how a turn is audited, which core function a
record goes to, the deletions a negotiator `forget` causes, and which output records an
`Outcome` makes (ledger, its relay view, quarantine, node rows and their tombstones).

The worker's memory agent (streams/agents/memory.py) calls these for every record, and so does
the same-job Quix Streams peer of the benchmark (bench/quix_samejob.py): the peer cannot drift
from the worker on any of them. What stays in the agent is the shell: the table reads and
writes, the checkpoint, metrics, the analytics feed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from streams.contracts import catalog
from streams.core import ConsolidationPolicy, Outcome, PromotionPolicy, UserMemory, event_id_for, process_candidate
from streams.core import process_event as core_process_event
from streams.core.audit import audit_turn
from streams.core.ids import NEGOTIATOR_REQUEST, input_reference
from streams.core.ingest import time_problem, validate_turn
from streams.core.limits import Limits, id_problem, quote
from streams.core.redaction import relay_events

from .user_cache import KEY_SEP

#: the field of each input that must equal the record's key
KEY_FIELD = {catalog.MEMORY_EVENTS: "motebit_id", catalog.MEMORY_CANDIDATES: "motebit_id",
             catalog.MEMORY_TURNS: "motebit_id", catalog.NEGOTIATOR_REQUESTS: "user_id",
             catalog.ERASE_REQUESTS: "motebit_id"}


class Refusal(NamedTuple):
    """A record refused before any state is touched: dead-lettered with `reason` and `rule`."""

    reason: str
    rule: str


def refusal(topic: str, key: str, record: dict, record_ms: int | None, limits: Limits) -> Refusal | None:
    """Why a decoded input record is refused before its user's state is read (its key is not
    a valid id, differs from the record's user field, or its times are out of bounds), or None."""
    if (problem := id_problem(key, limits)) is not None:
        code, what = problem
        if key == "":
            code = f"missing_{KEY_FIELD[topic]}"
        return Refusal(f"{code}: key {what}", code)
    if record.get(KEY_FIELD[topic]) != key:
        return Refusal(f"record {KEY_FIELD[topic]} {quote(record.get(KEY_FIELD[topic]))} differs from its key {quote(key)}",
                       "memory.key_mismatch")
    if (late := time_problem(record, record_ms, limits)) is not None:
        return Refusal(f"{late.code}: {late.detail}", late.code)
    return None


def contained(why: str) -> str:
    """The dead letter's reason for a record of a user whose rows cannot be rebuilt (contained)."""
    return (f"the memory state of this user cannot be rebuilt ({why}); its records are dead-lettered until an "
            "operator repairs the rows")


def audit(um: UserMemory, turn: dict, limits: Limits) -> Outcome:
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


def process(topic: str, um: UserMemory, record: dict, consolidation: ConsolidationPolicy,
            promotion: PromotionPolicy, limits: Limits) -> Outcome:
    """A turn, a candidate or a memory event through the core."""
    if topic == catalog.MEMORY_TURNS:
        return audit(um, record, limits)
    if topic == catalog.MEMORY_CANDIDATES:
        return process_candidate(um, record, consolidation, promotion, limits=limits)
    return core_process_event(um, record, consolidation, promotion, limits=limits)


def forget_deletions(key: str, request: dict, um: UserMemory, node_ids: list[str]) -> Iterator[dict]:
    """The `memory_deleted` events of a negotiator `forget` (one per node holding forgotten
    content), each made when the previous one has been applied (its clock is the user's next)."""
    for node_id in node_ids:
        yield {"event_id": event_id_for(key, f"{request['request_id']}/{node_id}", "memory_deleted"),
               "motebit_id": key, "device_id": None, "timestamp": int(request["timestamp"]),
               "version_clock": um.next_clock(), "event_type": "memory_deleted",
               "payload": {"node_id": node_id},
               "caused_by": input_reference(NEGOTIATOR_REQUEST, request["request_id"])}


#: one output record: (topic, key, value); value None is a tombstone
Output = tuple[str, str, "dict[str, Any] | None"]


class Outputs(list[Output]):
    """The output records of one outcome, in the order they are to be sent."""

    def send(self, topic: str, key: str, value: dict[str, Any] | None) -> None:
        self.append((topic, key, value))


def outputs(key: str, um: UserMemory, out: Outcome, threshold: str | None) -> tuple[Outputs, list[dict]]:
    """The output records of an outcome, in the order the agent sends them (each ledger event
    followed by its relay view, then quarantine entries, node rows, node tombstones; a node row's
    key is `<user>/<node_id>`), and the relay events among them. `threshold`: the user's relay
    threshold, needed only when the outcome has ledger events."""
    records = Outputs()
    relayed: list[dict] = []
    for ev in out.ledger:
        records.send(catalog.MEMORY_LEDGER, key, ev)
        for peer_ev in relay_events(ev, threshold, um.deleted_node_ids,  # type: ignore[arg-type]
                                    deleted_fingerprints=um.deleted_fingerprints, deleted_rows=out.deleted_rows):
            records.send(catalog.MEMORY_RELAY, key, peer_ev)
            relayed.append(peer_ev)
    for q in out.quarantined:
        records.send(catalog.MEMORY_QUARANTINE, key, q)
    for node in out.node_upserts:
        records.send(catalog.MEMORY_NODES, f"{key}{KEY_SEP}{node['node_id']}", node)
    for node_id in out.node_deletions:
        records.send(catalog.MEMORY_NODES, f"{key}{KEY_SEP}{node_id}", None)
    return records, relayed
