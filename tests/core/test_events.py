from hypothesis import given, settings, strategies as st

from streams.core import UserMemory, event_sort_key, process_candidate, process_event

from .factories import candidate, event, formed


def test_formed_event_materializes_node_as_is():
    um = UserMemory("u1")
    out = process_event(um, formed("n1", "User lives in Berlin", timestamp=100, version_clock=7, sensitivity="personal",
                                   payload_extra={"source": "agent_inferred", "valid_from": 50}))
    node = um.live["n1"]
    assert out.node_upserts == [node] and out.ledger[0]["event_id"] == out.ledger[0]["event_id"]
    assert node["content"] == "User lives in Berlin" and node["source"] == "agent_inferred"
    assert node["valid_from"] == 50 and node["created_at"] == 100 and node["valid_until"] is None
    assert node["origin_event_id"] == out.ledger[0]["event_id"]
    assert um.clock == 7  # Lamport: derived events of this user now start above 7
    assert "n1" in um.index
    # and consolidation sees it
    assert process_candidate(um, candidate("user lives in berlin")).decision.existing_node_id == "n1"


def test_formed_event_for_existing_id_is_ledger_only():
    um = UserMemory("u1")
    process_event(um, formed("n1", "first"))
    out = process_event(um, formed("n1", "second version"))
    assert out.applied and not out.node_upserts and um.live["n1"]["content"] == "first"


def test_deletion_tombstone_formed_event_deletes():
    um = UserMemory("u1")
    process_event(um, formed("n1", "User's address is 1 Main St"))
    out = process_event(um, formed("n1", "[REDACTED]", payload_extra={"redacted": True, "redacted_reason": "deleted"}))
    assert out.node_deletions == ["n1"] and not um.live
    assert process_candidate(um, candidate("User's address is 1 Main St")).decision.code == "deleted_content"


def test_sensitivity_redacted_copy_is_not_materialized():
    um = UserMemory("u1")
    out = process_event(um, formed("n9", "[REDACTED]", payload_extra={"redacted": True, "redacted_sensitivity": "medical"}))
    assert out.applied and not out.node_upserts and not um.live and out.ledger[0]["payload"]["redacted"] is True


def test_accessed_updates_last_access_and_count_order_insensitively():
    um = UserMemory("u1")
    process_event(um, formed("n1", "User likes tea", timestamp=10))
    process_event(um, event("memory_accessed", {"node_id": "n1"}, timestamp=500))
    out = process_event(um, event("memory_accessed", {"node_id": "n1"}, timestamp=300))  # late
    assert out.late
    assert um.live["n1"]["last_accessed_at"] == 500 and um.live["n1"]["access_count"] == 2
    unknown = process_event(um, event("memory_accessed", {"node_id": "ghost"}))
    assert unknown.applied and not unknown.node_upserts


def test_pinned_latest_wins_even_when_late_and_deleted_does_nothing():
    um = UserMemory("u1")
    process_event(um, formed("n1", "User likes tea", timestamp=10))
    process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": True}, timestamp=200, version_clock=1))
    out = process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": False}, timestamp=100, version_clock=5))
    assert um.live["n1"]["pinned"] is True and not out.node_upserts  # older unpin loses
    process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": False}, timestamp=200, version_clock=2))
    assert um.live["n1"]["pinned"] is False  # same timestamp, higher clock wins
    process_event(um, event("memory_deleted", {"node_id": "n1"}, timestamp=300))
    out = process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": True}, timestamp=400))
    assert out.applied and not out.node_upserts and "n1" not in um.live and "n1" not in um.pins


def test_pin_that_overtakes_its_node_applies_on_formation():
    um = UserMemory("u1")
    process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": True}, timestamp=200))
    process_event(um, formed("n1", "User likes tea", timestamp=100))
    assert um.live["n1"]["pinned"] is True


def test_deleted_erases_and_formed_after_delete_is_refused():
    um = UserMemory("u1")
    process_event(um, formed("n1", "User likes tea"))
    out = process_event(um, event("memory_deleted", {"node_id": "n1"}))
    assert out.node_deletions == ["n1"] and um.node("n1") is None and "n1" in um.deleted_node_ids
    again = process_event(um, formed("n1", "something new"))
    assert [(r.code, r.redact_value) for r in again.dead_letters] == [("deleted_node", True)]
    # a deletion that overtakes the formation also records the content fingerprint
    um2 = UserMemory("u1")
    process_event(um2, event("memory_deleted", {"node_id": "n7"}, timestamp=50))
    process_event(um2, formed("n7", "User's PIN hint is blue", timestamp=10))
    assert process_candidate(um2, candidate("User's PIN hint is blue")).decision.code == "deleted_content"


def test_consolidated_supersede_from_an_agent_closes_the_node():
    um = UserMemory("u1")
    process_event(um, formed("old", "User lives in Berlin", timestamp=10))
    process_event(um, formed("new", "User lives in Paris", timestamp=20))
    out = process_event(um, event("memory_consolidated", {"action": "update", "existing_node_id": "old", "new_node_id": "new",
                                                          "reason": "moved", "superseded_valid_until": 20}, timestamp=21))
    assert out.ledger[0]["payload"]["action"] == "supersede"
    assert um.closed["old"]["valid_until"] == 20 and um.closed["old"]["superseded_by"] == "new"
    assert [n["node_id"] for n in um.as_of(15)] == ["old"] and [n["node_id"] for n in um.as_of(25)] == ["new"]


def test_audit_decayed_promoted_pass_through():
    um = UserMemory("u1")
    a = process_event(um, event("memory_audit", {"missed_patterns": ['preference: "I like tea"'], "turn_message": "I like tea"}))
    d = process_event(um, event("memory_decayed", {}))
    p = process_event(um, event("memory_promoted", {"node_id": "ghost", "from_confidence": 0.9, "to_confidence": 1.0, "reinforcement_count": 3, "reason": "x"}))
    for out in (a, d, p):
        assert out.applied and len(out.ledger) == 1 and not out.node_upserts


def test_wrong_user_is_a_dead_letter():
    um = UserMemory("u1")
    assert process_event(um, formed("n1", "x", motebit_id="u2")).dead_letters[0].code == "wrong_user"
    assert process_candidate(um, candidate("x", motebit_id="u2")).dead_letters[0].code == "wrong_user"


# --------------------------------------------------------------- out of order ----


def _state(um):
    aux = um.aux_record()
    aux["seen"] = sorted(k for k, _ in aux["seen"]["ids"])
    aux.pop("stats")
    return sorted(um.nodes(), key=lambda n: n["node_id"]), aux


@st.composite
def event_mixes(draw):
    n_nodes = draw(st.integers(1, 4))
    evs = []
    t = 1_000
    for i in range(n_nodes):
        evs.append(formed(f"n{i}", f"memory number {i} about {'xyz'[i % 3]} things", timestamp=t + i, version_clock=i))
    later = []
    for j in range(draw(st.integers(0, 25))):
        nid = f"n{draw(st.integers(0, n_nodes - 1))}"
        kind = draw(st.sampled_from(["accessed", "accessed", "pinned", "pinned", "deleted"]))
        ts = 2_000 + draw(st.integers(0, 50))
        vc = draw(st.integers(0, 5))
        eid = f"x{j}"
        if kind == "accessed":
            later.append(event("memory_accessed", {"node_id": nid}, timestamp=ts, version_clock=vc, event_id=eid))
        elif kind == "pinned":
            later.append(event("memory_pinned", {"node_id": nid, "pinned": draw(st.booleans())}, timestamp=ts, version_clock=vc, event_id=eid))
        else:
            later.append(event("memory_deleted", {"node_id": nid}, timestamp=ts, version_clock=vc, event_id=eid))
    return evs, later


def _apply(events):
    um = UserMemory("u1")
    for e in events:
        process_event(um, e)
    return um


@settings(max_examples=200, deadline=None)
@given(event_mixes(), st.randoms())
def test_late_events_converge_to_the_in_order_state(mix, rnd):
    """Pins / accesses / deletions applied directly in ANY arrival order (late ones included)
    end in exactly the state of the (timestamp, version_clock) order."""
    formations, later = mix
    in_order = _apply(sorted(formations + later, key=event_sort_key))
    tail = list(later)
    rnd.shuffle(tail)
    arrival = _apply(formations + tail)
    assert _state(arrival) == _state(in_order)


@settings(max_examples=200, deadline=None)
@given(event_mixes(), st.randoms())
def test_deletions_overtaking_formations_still_win(mix, rnd):
    """Everything shuffled, formations included: an access or pin that arrives before its
    node exists is ledger-only, but which nodes
    exist and what is deleted — ids and content fingerprints — never depends on order."""
    formations, later = mix
    in_order = _apply(sorted(formations + later, key=event_sort_key))
    arrival_events = formations + later
    rnd.shuffle(arrival_events)
    arrival = _apply(arrival_events)
    assert set(arrival.live) == set(in_order.live)
    assert arrival.deleted_node_ids == in_order.deleted_node_ids
    assert arrival.deleted_fingerprints == in_order.deleted_fingerprints


@settings(max_examples=150, deadline=None)
@given(event_mixes(), st.randoms())
def test_late_events_are_applied_flagged_and_counted_never_dropped(mix, rnd):
    """Nothing holds events back to sort them: each is applied as it arrives. One whose
    (timestamp, version_clock, event_id) is below an event already applied is late: applied
    all the same (it leads its own ledger), flagged on its Outcome and counted in the state."""
    formations, later = mix
    tail = list(later)
    rnd.shuffle(tail)
    um = UserMemory("u1")
    newest, late = None, []
    for e in formations + tail:
        out = process_event(um, e)
        assert not out.duplicate and not out.rejections
        assert out.ledger[0]["event_id"] == e["event_id"]  # applied, not dropped
        is_late = newest is not None and event_sort_key(e) < newest
        assert out.late is is_late
        if is_late:
            late.append(e["event_id"])
        newest = max(newest or event_sort_key(e), event_sort_key(e))
    assert um.stats["late"] == len(late)
    assert um.last_event_key == max(event_sort_key(e) for e in formations + later)
