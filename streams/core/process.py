"""The two entry points the Faust agents call: :func:`process_candidate` and
:func:`process_event`. Each takes the user's :class:`~streams.core.state.UserMemory` and one
decoded record, updates the state in place and returns an :class:`Outcome` — everything the
shell has to write/send. No I/O, no clocks, no randomness: the same record applied to the
same state gives the same Outcome (ids, clocks, node states).

Validation happens before any mutation, so a rejected record leaves the state untouched
(apart from remembering its id for de-duplication when it had a valid one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .consolidation import (
    ConsolidationPolicy,
    Decider,
    Decision,
    DeterministicDecider,
    apply,
    check_decision,
    hard_rules,
)
from .exposure import exposure_gate, quarantine_entry
from .ids import CANDIDATE, EVENT, link_to_input, node_id_for
from .ingest import Rejection, event_sort_key, validate_candidate, validate_event
from .limits import DEFAULT_LIMITS, Limits
from .nodes import content_fingerprint, make_node
from .promotion import PromotionPolicy, promote, should_promote
from .state import UserMemory

_DEFAULT_DECIDER = DeterministicDecider()


@dataclass
class Outcome:
    """What one input record produced.

    ``ledger``          MemoryEvent dicts for ``memory.ledger.v1`` (key motebit_id), in order:
                        the accepted input event (normalized) and/or the derived events.
    ``node_upserts``    MemoryNode dicts for ``memory.nodes.v1`` (key ``motebit_id/node_id``);
                        one entry per node, its final state.
    ``node_deletions``  node ids to tombstone (null value) on ``memory.nodes.v1``.
    ``deleted_rows``    node id → ``{"sensitivity": …}`` of each node erased here (no content):
                        the relay's deletion tombstone keeps the row's levels
                        (:func:`streams.core.redaction.relay_events` ``deleted_rows``).
    ``quarantined``     QuarantineEntry dicts for ``memory.quarantine.v1``.
    ``rejections``      why (parts of) the record were not applied; ``dead_letter=True``
                        ones go to ``pipeline.dlq.v1`` with ``detail`` as the reason.
    ``duplicate``       the record's id was already seen for this user: nothing else happened.
    ``late``            (events) the record is older than one already applied.
    ``decision``        (candidates) the consolidation decision, when one was made."""

    ledger: list[dict[str, Any]] = field(default_factory=list)
    node_upserts: list[dict[str, Any]] = field(default_factory=list)
    node_deletions: list[str] = field(default_factory=list)
    deleted_rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    duplicate: bool = False
    late: bool = False
    decision: Decision | None = None

    @property
    def dead_letters(self) -> list[Rejection]:
        return [r for r in self.rejections if r.dead_letter]

    @property
    def applied(self) -> bool:
        """The record was accepted (it may still have been a consolidation ``reject``)."""
        return not self.duplicate and not self.dead_letters

    def upsert(self, node: dict[str, Any]) -> None:
        """Record a node write; a later write of the same node replaces the earlier one."""
        for i, n in enumerate(self.node_upserts):
            if n["node_id"] == node["node_id"]:
                self.node_upserts[i] = node
                return
        self.node_upserts.append(node)

    def delete(self, node_id: str, row: Mapping[str, Any] | None = None) -> None:
        """Record a node deletion; ``row`` (the erased node) gives its relay-relevant levels."""
        if row is not None:
            self.deleted_rows[node_id] = {"sensitivity": row.get("sensitivity")}
        self.node_upserts = [n for n in self.node_upserts if n["node_id"] != node_id]
        if node_id not in self.node_deletions:
            self.node_deletions.append(node_id)


def _reject(code: str, detail: str, *, redact_value: bool = False) -> Outcome:
    return Outcome(rejections=[Rejection(code, detail, True, redact_value)])


def _maybe_promote(memory: UserMemory, node: dict[str, Any], timestamp: int, policy: PromotionPolicy, out: Outcome) -> None:
    if should_promote(node, policy):
        promoted, event = promote(node, policy, timestamp=timestamp, version_clock=memory.next_clock())
        memory.put_node(promoted)
        out.upsert(promoted)
        out.ledger.append(event)
        memory.seen.add("e:" + event["event_id"], timestamp)


# --------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------


def process_candidate(
    memory: UserMemory,
    candidate: Mapping[str, Any],
    policy: ConsolidationPolicy | None = None,
    promotion: PromotionPolicy | None = None,
    decider: Decider | None = None,
    limits: Limits | None = None,
) -> Outcome:
    """Consolidate one candidate (``memory.candidates.v1``) into ``memory``.

    Steps: validate, sizes and ids included (``limits``; → dead letter) · de-duplicate on
    ``candidate_id`` · hard rules (secret,
    deleted content → ``reject`` on the ledger) · exposure gate (→ quarantine) · decide ·
    apply · promotion check."""
    policy = policy or ConsolidationPolicy()
    promotion = promotion or PromotionPolicy()
    decider = decider or _DEFAULT_DECIDER
    cand, rej = validate_candidate(candidate, limits or DEFAULT_LIMITS)
    if rej is not None:
        return Outcome(rejections=[rej])
    assert cand is not None
    if cand["motebit_id"] != memory.motebit_id:
        return _reject("wrong_user", f"candidate for {cand['motebit_id']!r} given to the state of {memory.motebit_id!r}")
    key = "c:" + cand["candidate_id"]
    if key in memory.seen or memory.knows(node_id_for(memory.motebit_id, cand["candidate_id"])):
        # the second test makes replays idempotent beyond the de-duplication window: the node
        # this candidate forms (accept/supersede) already exists or was deleted.
        memory.seen.duplicates += 1
        return Outcome(duplicate=True)
    ts = int(cand["timestamp"])
    out = Outcome()

    decision = hard_rules(cand, memory, policy)
    gate = None
    if decision is None:
        gate = exposure_gate(cand)
        if gate.quarantine:
            out.quarantined.append(quarantine_entry(cand, gate))
            memory.seen.add(key, ts)
            return out
        try:
            decision = decider.decide(cand, memory, policy)
        except Exception as exc:  # noqa: BLE001 -- a plugged-in judge failed: dead-letter, state untouched
            return _reject("decider_error", f"decider raised {type(exc).__name__}: {exc}")
        problem = check_decision(decision, memory)
        if problem is not None:
            return _reject("invalid_decision", problem)
    out.decision = decision
    applied = apply(cand, decision, memory, policy, instruction_form=bool(gate and gate.instruction_form))
    out.ledger.extend(applied.events)
    for n in applied.upserts:
        out.upsert(n)
    if decision.action == "reject":
        out.rejections.append(Rejection(decision.code, decision.reason, dead_letter=False))
    if applied.node_id is not None and applied.node_id in memory.live:
        _maybe_promote(memory, memory.live[applied.node_id], ts, promotion, out)
    memory.seen.add(key, ts)
    link_to_input(out.ledger, CANDIDATE, cand["candidate_id"])
    for e in out.ledger:
        memory.seen.add("e:" + e["event_id"], ts)  # an echo of our own events is a duplicate
    return out


# --------------------------------------------------------------------------------------------
# Memory events
# --------------------------------------------------------------------------------------------


def process_event(
    memory: UserMemory,
    event: Mapping[str, Any],
    policy: ConsolidationPolicy | None = None,
    promotion: PromotionPolicy | None = None,
    limits: Limits | None = None,
) -> Outcome:
    """Apply one memory event (``memory.events.v1``) to ``memory`` (validated first, sizes
    and ids against ``limits``: a record over a limit is a dead letter).

    memory_formed       the agent formed a node: materialize it as-is (unless its id or its
                        content was deleted → dead letter without the value; a deletion
                        tombstone (``redacted_reason: deleted``) deletes; a sensitivity-
                        redacted copy carries no content → ledger only; an existing id → ledger
                        only, first formation wins)
    memory_accessed     last_accessed_at = max, access_count + 1
    memory_pinned       latest (timestamp, version_clock, event_id) wins; a deleted node: nothing
    memory_deleted      erase the node (tombstone), remember its fingerprint and id
    memory_consolidated normalized to the wire vocabulary; a supersede closes the existing
                        live node at ``superseded_valid_until`` (or the event time)
    memory_promoted     ledger; the node (if any) records promoted / to_confidence
    memory_audit, memory_decayed  ledger only
    """
    policy = policy or ConsolidationPolicy()
    promotion = promotion or PromotionPolicy()
    ev, rej = validate_event(event, limits or DEFAULT_LIMITS)
    if rej is not None:
        return Outcome(rejections=[rej])
    assert ev is not None
    if ev["motebit_id"] != memory.motebit_id:
        return _reject("wrong_user", f"event for {ev['motebit_id']!r} given to the state of {memory.motebit_id!r}")
    key = "e:" + ev["event_id"]
    if key in memory.seen:
        memory.seen.duplicates += 1
        return Outcome(duplicate=True)
    ts = int(ev["timestamp"])
    sort_key = event_sort_key(ev)
    out = Outcome()
    if memory.last_event_key is not None and sort_key < memory.last_event_key:
        out.late = True
        memory.stats["late"] = memory.stats.get("late", 0) + 1

    handler = _HANDLERS[ev["event_type"]]
    refused = handler(memory, ev, policy, promotion, out)
    memory.seen.add(key, ts)
    if refused is not None:
        return Outcome(rejections=[refused], late=out.late)
    memory.observe_clock(ev["version_clock"])
    if memory.last_event_key is None or sort_key > memory.last_event_key:
        memory.last_event_key = sort_key
    link_to_input(out.ledger, EVENT, ev["event_id"])  # the events it caused (a promotion), not itself
    out.ledger.insert(0, ev)
    return out


def _on_formed(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    p = ev["payload"]
    nid = p["node_id"]
    if p.get("redacted_reason") == "deleted":
        # a deletion tombstone propagated by a forget path: content is gone for good
        erased = memory.erase_node(nid)
        if erased is not None:
            out.delete(nid, erased)
        return None
    if p.get("redacted"):
        return None  # a sensitivity-redacted copy: no content to materialize; ledger only
    if nid in memory.deleted_node_ids:
        # the deletion overtook the formation: the content belongs to a deleted node, so it
        # joins the deleted fingerprints exactly as if the deletion had come second
        memory.forget_content(content_fingerprint(p["content"]))
        return Rejection("deleted_node", f"node {nid} was deleted and is never re-formed", True, True)
    fp = content_fingerprint(p["content"])
    if memory.is_deleted_content(fp):
        return Rejection("deleted_content", "content was deleted and is never re-formed", True, True)
    if memory.node(nid) is not None:
        return None  # already formed: first formation wins
    node = make_node(
        node_id=nid,
        motebit_id=memory.motebit_id,
        content=p["content"],
        sensitivity=p["sensitivity"],
        source=p.get("source"),
        memory_type="semantic",
        confidence=policy.default_confidence,
        created_at=ev["timestamp"],
        valid_from=p["valid_from"] if p.get("valid_from") is not None else ev["timestamp"],
        valid_until=p.get("valid_until"),
        half_life_ms=policy.half_life_for("semantic"),
        origin_event_id=ev["event_id"],
    )
    pin = memory.pins.get(nid)
    if pin is not None:  # a memory_pinned that overtook the node it pins
        node = {**node, "pinned": pin[3]}
    memory.put_node(node)
    out.upsert(node)
    _maybe_promote(memory, node, ev["timestamp"], promotion, out)
    return None


def _on_accessed(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    node = memory.node(ev["payload"]["node_id"])
    if node is not None:
        last = node.get("last_accessed_at")
        updated = {
            **node,
            "last_accessed_at": ev["timestamp"] if last is None else max(int(last), ev["timestamp"]),
            "access_count": int(node.get("access_count") or 0) + 1,
        }
        memory.put_node(updated)
        out.upsert(updated)
    return None


def _on_pinned(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    p = ev["payload"]
    nid = p["node_id"]
    if nid in memory.deleted_node_ids:
        return None  # pinning a deleted node does nothing
    key = event_sort_key(ev)
    current = memory.pins.get(nid)
    if current is not None and key <= current[:3]:
        return None  # an older pin/unpin: the latest one already won
    memory.set_pin(nid, (*key, p["pinned"]))
    node = memory.node(nid)
    if node is not None and bool(node.get("pinned")) != p["pinned"]:
        updated = {**node, "pinned": p["pinned"]}
        memory.put_node(updated)
        out.upsert(updated)
    return None


def _on_deleted(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    nid = ev["payload"]["node_id"]
    erased = memory.erase_node(nid)
    if erased is not None:
        out.delete(nid, erased)
    return None


def _on_consolidated(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    p = ev["payload"]
    if p["action"] == "supersede" and p.get("existing_node_id"):
        old = memory.live.get(p["existing_node_id"])
        if old is not None:
            until = p.get("superseded_valid_until")
            until = ev["timestamp"] if until is None else int(until)
            closed = {
                **old,
                "valid_until": max(until, int(old["valid_from"])),
                "superseded_by": p.get("new_node_id") or old.get("superseded_by"),
                "updated_at": max(int(old["updated_at"]), ev["timestamp"]),
            }
            memory.put_node(closed)
            out.upsert(closed)
    return None


def _on_promoted(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    p = ev["payload"]
    node = memory.node(p["node_id"])
    if node is not None and not node.get("promoted"):
        updated = {
            **node,
            "promoted": True,
            "confidence": float(p["to_confidence"]),
            "updated_at": max(int(node["updated_at"]), ev["timestamp"]),
        }
        memory.put_node(updated)
        out.upsert(updated)
    return None


def _on_passthrough(memory: UserMemory, ev: dict, policy: ConsolidationPolicy, promotion: PromotionPolicy, out: Outcome) -> Rejection | None:
    return None


_HANDLERS = {
    "memory_formed": _on_formed,
    "memory_accessed": _on_accessed,
    "memory_pinned": _on_pinned,
    "memory_deleted": _on_deleted,
    "memory_consolidated": _on_consolidated,
    "memory_promoted": _on_promoted,
    "memory_audit": _on_passthrough,
    "memory_decayed": _on_passthrough,
}
