"""Linking outputs to inputs: every event memstream derives carries `caused_by` (the input that
caused it), and its id follows the documented UUIDv5 derivation (docs/contract.md)."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from streams.core import UserMemory, process_candidate, process_event
from streams.core.audit import audit_turn
from streams.core.housekeeping import deletion_event
from streams.core.ids import NAMESPACE, derive_id, event_id_for, input_reference, node_id_for
from streams.core.ingest import validate_event
from streams.core.promotion import PromotionPolicy

from .factories import candidate, event

_IDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._:@", min_size=1, max_size=20).filter(str.isalnum)


def uuid5_by_hand(user: str, source_id: str, role: str) -> str:
    """The derivation as docs/contract.md states it, written out independently of streams.core.ids."""
    return str(uuid.uuid5(uuid.UUID("047b1799-3fa7-5926-a4da-9c0088dd91e1"), f"{user}\x1f{source_id}\x1f{role}"))


def test_the_namespace_is_the_documented_one():
    assert NAMESPACE == uuid.uuid5(uuid.NAMESPACE_URL, "https://memstream.dev/ns/derived-ids/v1")


@given(user=_IDS, source=_IDS, role=st.sampled_from(["memory_formed", "memory_consolidated", "node", "quarantine"]))
def test_derived_ids_follow_the_documented_derivation(user, source, role):
    assert derive_id(user, source, role) == uuid5_by_hand(user, source, role)


def test_every_event_a_candidate_causes_names_the_candidate():
    memory = UserMemory("u1")
    cand = candidate("The user prefers oat milk.", candidate_id="cand-oat")
    out = process_candidate(memory, cand)
    assert [e["event_type"] for e in out.ledger] == ["memory_formed", "memory_consolidated"]
    for e in out.ledger:
        assert e["caused_by"] == {"kind": "candidate", "id": "cand-oat"}
        assert e["event_id"] == uuid5_by_hand("u1", "cand-oat", e["event_type"])
    assert out.ledger[0]["payload"]["node_id"] == node_id_for("u1", "cand-oat") == uuid5_by_hand("u1", "cand-oat", "node")


def test_a_promotion_names_the_candidate_whose_merge_promoted_the_node():
    memory = UserMemory("u1")
    policy = PromotionPolicy(min_reinforcements=1, min_confidence=0.0)
    process_candidate(memory, candidate("The user prefers oat milk.", candidate_id="c1"), promotion=policy)
    out = process_candidate(memory, candidate("The user prefers oat milk.", candidate_id="c2"), promotion=policy)
    promoted = [e for e in out.ledger if e["event_type"] == "memory_promoted"]
    assert promoted and promoted[0]["caused_by"] == input_reference("candidate", "c2")
    node_id = promoted[0]["payload"]["node_id"]
    assert promoted[0]["event_id"] == uuid5_by_hand("u1", node_id, "memory_promoted")  # once per node


def test_an_input_event_keeps_its_own_reference_and_its_derived_events_name_it():
    memory = UserMemory("u1")
    policy = PromotionPolicy(min_reinforcements=0, min_confidence=0.0)
    ev = event("memory_formed", {"node_id": "n1", "content": "The user likes chess.", "sensitivity": "none"},
               event_id="ev-in")
    out = process_event(memory, ev, promotion=policy)
    assert out.ledger[0]["event_id"] == "ev-in" and out.ledger[0]["caused_by"] is None
    assert [e["caused_by"] for e in out.ledger[1:]] == [{"kind": "event", "id": "ev-in"}]
    relayed = {**ev, "event_id": "ev-2", "caused_by": {"kind": "negotiator_request", "id": "req-1"}}
    assert process_event(UserMemory("u1"), relayed).ledger[0]["caused_by"] == {"kind": "negotiator_request", "id": "req-1"}


def test_a_malformed_input_reference_is_rejected_with_its_rule():
    ev = event("memory_accessed", {"node_id": "n1"})
    for bad in ("req-1", {"kind": "turn"}, {"kind": "turn", "id": "a/b"}, {"kind": "", "id": "x"}):
        normalized, rejection = validate_event({**ev, "caused_by": bad})
        assert normalized is None and rejection is not None
        assert rejection.code in ("invalid_caused_by", "invalid_id"), (bad, rejection)


def test_audits_and_housekeeping_deletions_name_their_cause():
    turn = {"turn_id": "t-1", "motebit_id": "u1", "timestamp": 1_700_000_000_000,
            "user_message": "I prefer window seats.", "agent_reply": None, "tagged_memories": []}
    audit = audit_turn(turn)
    assert audit is not None and audit["caused_by"] == {"kind": "turn", "id": "t-1"}
    assert audit["event_id"] == uuid5_by_hand("u1", "t-1", "memory_audit")
    swept = deletion_event("u1", "n-9", 5, 1)
    assert swept["caused_by"] == {"kind": "housekeeping", "id": "n-9"}
    assert swept["event_id"] == event_id_for("u1", "n-9", "memory_deleted") == uuid5_by_hand("u1", "n-9", "memory_deleted")
