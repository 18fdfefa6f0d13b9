"""Memory rules and relay held against the reference implementation (issue 15, "Behaviour to
align"): motebit (packages/memory-graph, packages/event-log, services/relay). Each test names
the reference file and test it mirrors; where SPEC says something explicitly, SPEC wins and the
test says so."""

import pytest

from streams.core import UserMemory, process_candidate, process_event
from streams.core.consolidation import ConsolidationPolicy
from streams.core.housekeeping import select_expired
from streams.core.ingest import validate_candidate, validate_event
from streams.core.nodes import DAY_MS, decayed_confidence, make_node
from streams.core.promotion import PromotionPolicy
from streams.core.redaction import relay_events

from .factories import candidate, event, formed

CONSOLIDATION_TEST = "motebit packages/memory-graph/src/__tests__/consolidation.test.ts"
INDEX_TEST = "motebit packages/memory-graph/src/__tests__/index.test.ts"
NO_PROMOTION = PromotionPolicy(min_reinforcements=10**6)


# ----------------------------------------------------------------------------------------------
# reinforcement arithmetic


def test_reinforce_adds_a_fixed_step_and_grows_the_half_life():
    # CONSOLIDATION_TEST "REINFORCE: existing confidence boosted, half-life increased, no duplicate
    # node created": confidence min(1, c + 0.1), half-life x 1.5, no new node
    um = UserMemory("u1")
    outs = [process_candidate(um, candidate("User likes Python a lot"), promotion=NO_PROMOTION) for _ in range(3)]
    assert [o.decision.action for o in outs] == ["accept", "merge", "merge"]
    confidences = [o.node_upserts[0]["confidence"] for o in outs]
    assert confidences == [0.7, 0.7 + 0.1, 0.7 + 0.1 + 0.1]  # exactly the doubles JS computes
    half_lives = [o.node_upserts[0]["half_life_ms"] for o in outs]
    assert half_lives[1] == int(half_lives[0] * 1.5) and half_lives[2] == int(half_lives[1] * 1.5)
    assert len(um.live) == 1


def test_reinforced_confidence_is_capped_at_one():
    # CONSOLIDATION_TEST "REINFORCE: half-life caps at MAX_HALF_LIFE (365 days)" (and confidence
    # min(1.0, …) in packages/memory-graph/src/index.ts consolidateAndForm)
    um = UserMemory("u1")
    outs = [process_candidate(um, candidate("User drinks green tea", confidence=0.95), promotion=NO_PROMOTION)
            for _ in range(3)]
    assert [o.node_upserts[0]["confidence"] for o in outs] == [0.95, 1.0, 1.0]


@pytest.mark.parametrize("spelling", ["noop", "reinforce", "NOOP", "Reinforce"])
def test_noop_and_reinforce_are_a_merge(spelling):
    # CONSOLIDATION_TEST "NOOP: no new node, existing confidence and half-life compounded" — the
    # reference treats noop exactly as reinforce; here both are the wire action merge, whose
    # arithmetic is the one above (test_reinforce_adds_a_fixed_step_and_grows_the_half_life)
    ev, rej = validate_event(event("memory_consolidated", {"action": spelling, "existing_node_id": "n1",
                                                            "new_node_id": None, "reason": "same"}))
    assert rej is None and ev["payload"]["action"] == "merge"


def test_promotion_keeps_the_spec_rule_not_the_reference_threshold_crossing():
    # SPEC §4.3 is explicit (reinforcement_count >= 3 && confidence >= 0.85), so it wins over the
    # reference's maybePromote (a threshold crossing alone): at 0.9 after two reinforcements no
    # promotion yet; the third reinforcement promotes
    um = UserMemory("u1")
    outs = [process_candidate(um, candidate("User runs marathons every spring")) for _ in range(4)]
    promoted = [i for i, o in enumerate(outs) for e in o.ledger if e["event_type"] == "memory_promoted"]
    assert outs[2].node_upserts[0]["confidence"] >= 0.85 and outs[2].node_upserts[0]["reinforcement_count"] == 2
    assert promoted == [3]


def test_policy_step_is_configurable_and_bounded():
    assert ConsolidationPolicy().reinforcement_step == 0.1
    with pytest.raises(ValueError):
        ConsolidationPolicy(reinforcement_step=-0.1)


# ----------------------------------------------------------------------------------------------
# half-life <= 0


def _node(half_life_ms, confidence=0.8):
    return make_node(node_id="n1", motebit_id="u1", content="User likes tea", sensitivity="none",
                     memory_type="semantic", confidence=confidence, created_at=1_700_000_000_000,
                     valid_from=1_700_000_000_000, origin_event_id="e1", half_life_ms=half_life_ms)


@pytest.mark.parametrize("half_life", [0, -1, -30 * DAY_MS])
def test_non_positive_half_life_leaves_confidence_unchanged(half_life):
    # INDEX_TEST "returns initial confidence when halfLife <= 0" (computeDecayedConfidence)
    node = _node(half_life)
    assert decayed_confidence(node, node["created_at"] + 5000) == 0.8
    assert decayed_confidence(node, node["created_at"] + 10_000 * DAY_MS) == 0.8
    # so housekeeping never deletes it for decay (sensitivity none has no retention limit)
    assert select_expired([node], node["created_at"] + 10_000 * DAY_MS) == []


def test_positive_half_life_still_decays():
    # INDEX_TEST "scales with initial confidence": 0.6 after one half-life is 0.3
    node = _node(1000, confidence=0.6)
    assert decayed_confidence(node, node["created_at"] + 1000) == pytest.approx(0.3)


# ----------------------------------------------------------------------------------------------
# the redaction sentinel never forms a node


@pytest.mark.parametrize("content", ["[REDACTED]", "  [REDACTED]\n"])
def test_candidate_with_sentinel_content_is_dead_lettered(content):
    # INDEX_TEST "rejects redacted content (literal '[REDACTED]')" (formMemory refuses it)
    _, rej = validate_candidate(candidate(content))
    assert rej.code == "redacted_content" and rej.dead_letter
    um = UserMemory("u1")
    out = process_candidate(um, candidate(content))
    assert [r.code for r in out.dead_letters] == ["redacted_content"]
    assert not um.live and not out.ledger and not out.node_upserts


def test_memory_formed_with_sentinel_content_is_dead_lettered():
    # INDEX_TEST "rejects redacted content (literal '[REDACTED]')"
    um = UserMemory("u1")
    out = process_event(um, formed("n1", "[REDACTED]"))
    assert [r.code for r in out.dead_letters] == ["redacted_content"]
    assert not um.live and not out.node_upserts and not out.ledger


def test_redacted_copies_and_tombstones_still_form_no_node_and_are_not_refused():
    # INDEX_TEST "rejects content with redacted flag set": a peer's redacted copy is kept on the
    # ledger (it records that the memory exists) but never becomes a node
    um = UserMemory("u1")
    out = process_event(um, formed("n1", "[REDACTED]", payload_extra={"redacted": True,
                                                                      "redacted_sensitivity": "medical"}))
    assert out.applied and not out.node_upserts and not um.live
    out = process_event(um, formed("n2", "[REDACTED]", payload_extra={"redacted": True, "redacted_reason": "deleted"}))
    assert out.applied and not um.live and "n2" in um.deleted_node_ids


def test_sentinel_inside_real_content_is_content():
    um = UserMemory("u1")
    out = process_candidate(um, candidate("User wrote [REDACTED] on the form"))
    assert out.decision.action == "accept" and len(um.live) == 1


# ----------------------------------------------------------------------------------------------
# a deletion tombstone keeps the deleted row's levels


def _tombstone(events):
    (tomb,) = [e for e in events if e["payload"].get("redacted_reason") == "deleted"]
    return tomb["payload"]


@pytest.mark.parametrize("threshold, redacted_sensitivity", [("personal", "medical"), ("secret", None)])
def test_tombstone_for_a_late_formed_keeps_the_row_levels(threshold, redacted_sensitivity):
    # motebit packages/event-log/src/index.ts redactMemoryContent rewrites the stored
    # memory_formed in place ({...payload, content: "[REDACTED]", redacted: true,
    # redacted_reason: "deleted"}): sensitivity and redacted_sensitivity stay the row's
    # (services/relay/src/__tests__/deletion-propagation.test.ts "a synced DeleteRequested
    # erases the node's stored memory_formed content"). The row is what the relay sent: redacted
    # (redacted_sensitivity = medical) under threshold personal, with content under secret.
    ev = formed("n1", "User takes insulin", sensitivity="medical")
    tomb = _tombstone(relay_events(ev, threshold, {"n1"}))
    assert tomb["content"] == "[REDACTED]" and tomb["redacted"] is True
    assert (tomb["sensitivity"], tomb["redacted_sensitivity"]) == ("medical", redacted_sensitivity)


def test_tombstone_of_a_memory_deleted_keeps_the_erased_node_levels():
    um = UserMemory("u1")
    nid = process_candidate(um, candidate("User banks with ACME", sensitivity="financial")).node_upserts[0]["node_id"]
    out = process_event(um, event("memory_deleted", {"node_id": nid}))
    assert out.deleted_rows == {nid: {"sensitivity": "financial"}}  # levels only, never content
    deletion = next(e for e in out.ledger if e["event_type"] == "memory_deleted")
    tomb = _tombstone(relay_events(deletion, "personal", um.deleted_node_ids, deleted_rows=out.deleted_rows))
    assert (tomb["sensitivity"], tomb["redacted_sensitivity"]) == ("financial", "financial")
    tomb = _tombstone(relay_events(deletion, "secret", um.deleted_node_ids, deleted_rows=out.deleted_rows))
    assert (tomb["sensitivity"], tomb["redacted_sensitivity"]) == ("financial", None)


def test_tombstone_without_a_known_row_fails_closed():
    # the node is unknown here (deleted before this worker saw it): nothing to keep -> secret/null
    tomb = _tombstone(relay_events(event("memory_deleted", {"node_id": "ghost"})))
    assert (tomb["sensitivity"], tomb["redacted_sensitivity"]) == ("secret", None)


def test_housekeeping_deletions_carry_the_rows_too():
    from streams.core.housekeeping import sweep_memory

    um = UserMemory("u1")
    out = process_candidate(um, candidate("User is seeing a cardiologist", sensitivity="medical"))
    nid = out.node_upserts[0]["node_id"]
    swept = sweep_memory(um, out.node_upserts[0]["created_at"] + 400 * DAY_MS)
    assert swept.deleted_rows == {nid: {"sensitivity": "medical"}}
