"""Erasure of a user (streams/core/erasure.py, issue 15): every node deleted with a ledger
deletion (and so a relay tombstone), negotiator memories forgotten, relay override and analytics
flagged for removal, fingerprints kept so nothing re-forms, a receipt without content; bounded
steps; a re-delivered step does nothing; a re-processed step repeats the same outputs."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core import UserMemory, process_candidate, process_event
from streams.core.erasure import (
    ErasurePolicy,
    digest_step,
    erase_request,
    erase_step,
    receipt_id_for,
    validate_erase_request,
)
from streams.core.ids import event_id_for
from streams.core.limits import LimitExceeded
from streams.core.negotiator import handle_request
from streams.core.redaction import relay_events

from .factories import candidate, event

USER = "u1"
TS = 1_700_000_500_000
FACTS = ["User prefers dark mode in the editor", "User is allergic to peanuts and shellfish",
         "User's daughter is named Luna", "User commutes by bicycle on Mondays",
         "User plays chess on Thursday evenings"]


def _memory(facts=FACTS) -> UserMemory:
    um = UserMemory(USER)
    for i, text in enumerate(facts):
        out = process_candidate(um, candidate(text, candidate_id=f"c{i}", timestamp=TS - 1000 + i,
                                              sensitivity="medical" if i % 2 else "personal"))
        assert out.applied
    return um


def _negotiator():
    state = None
    for i, content in enumerate(["Never reveal my walk-away price of 900", "Open at 1200"]):
        state, _reply = handle_request(state, {"request_id": f"r{i}", "user_id": USER, "op": "remember",
                                               "kind": "threshold", "content": content, "timestamp": TS - 10 + i}, True)
    return state


def _request(**kw):
    return {**erase_request(USER, "erase-1", TS, "privacy-officer"), **kw}


def test_every_node_is_deleted_with_a_ledger_deletion_and_a_relay_tombstone():
    um = _memory()
    process_event(um, event("memory_pinned", {"node_id": sorted(um.live)[0], "pinned": True}, timestamp=TS - 5))
    nodes = sorted(n["node_id"] for n in um.nodes())
    er = erase_step(um, _request())
    assert er.outcome.node_deletions == nodes and er.outcome.node_upserts == []
    assert [e["event_type"] for e in er.outcome.ledger] == ["memory_deleted"] * len(nodes)
    assert [e["event_id"] for e in er.outcome.ledger] == [event_id_for(USER, f"erase-1/{n}", "memory_deleted")
                                                        for n in nodes]
    clocks = [e["version_clock"] for e in er.outcome.ledger]
    assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
    tombstones = [r for e in er.outcome.ledger for r in relay_events(e) if r["event_type"] == "memory_formed"]
    assert [t["payload"]["node_id"] for t in tombstones] == nodes
    assert all(t["payload"]["redacted_reason"] == "deleted" for t in tombstones)
    assert len(um) == 0 and not um.pins and set(nodes) <= um.deleted_node_ids


def test_the_receipt_lists_ids_and_counts_never_content():
    um = _memory()
    nodes = sorted(n["node_id"] for n in um.nodes())
    er = erase_step(um, _request(), negotiator_state=_negotiator(), relay_override="secret")
    r = er.receipt
    assert r == {**r, "receipt_id": receipt_id_for(USER, "erase-1"), "request_id": "erase-1", "motebit_id": USER,
                 "requested_at": TS, "requested_by": "privacy-officer", "nodes_erased": len(nodes),
                 "node_ids": nodes, "node_ids_omitted": 0, "node_ids_digest": digest_step("", nodes),
                 "relay_tombstones": len(nodes), "negotiator_memories_erased": 2, "relay_policy_removed": True,
                 "fingerprints_kept": len(nodes), "steps": 1}
    assert len(r["negotiator_memory_ids"]) == 2
    text = json.dumps(r)
    assert not any(word in text for word in ("dark mode", "peanuts", "Luna", "bicycle", "chess"))
    assert "walk-away" not in text and "1200" not in text
    assert er.remove_relay_policy and er.erase_analytics and er.continuation is None


def test_negotiator_memories_are_forgotten_keeping_ids_and_fingerprints_only():
    state = _negotiator()
    er = erase_step(_memory(), _request(), negotiator_state=state)
    after = er.negotiator_state
    assert after["memories"] == {}
    assert set(after["forgotten"]) == set(state["memories"])
    assert "walk-away" not in json.dumps(after) and "1200" not in json.dumps(after)
    # a re-delivered remember does not bring a forgotten memory back
    again, reply = handle_request(after, {"request_id": "r0", "user_id": USER, "op": "remember", "kind": "threshold",
                                          "content": "Never reveal my walk-away price of 900", "timestamp": TS + 5}, True)
    assert again["memories"] == {}


def test_no_negotiator_row_and_no_override_stay_untouched():
    er = erase_step(_memory(), _request())
    assert er.negotiator_state is None and not er.remove_relay_policy
    assert er.receipt["negotiator_memories_erased"] == 0 and er.receipt["relay_policy_removed"] is False


def test_nothing_re_forms_after_an_erasure():
    um = _memory()
    erase_step(um, _request())
    for i, text in enumerate(FACTS):  # the same inputs again: duplicates
        assert process_candidate(um, candidate(text, candidate_id=f"c{i}", timestamp=TS + i)).duplicate
    for i, text in enumerate(FACTS):  # the same content under new ids: rejected, no node
        out = process_candidate(um, candidate(text, candidate_id=f"new{i}", timestamp=TS + 100 + i))
        assert out.node_upserts == [] and out.decision.action == "reject"
    assert len(um) == 0


def test_the_erased_state_survives_a_rebuild():
    um = _memory()
    erase_step(um, _request())
    rebuilt = um.clone()
    assert len(rebuilt) == 0 and rebuilt.deleted_fingerprints == um.deleted_fingerprints
    assert "x:erase-1/0" in rebuilt.seen


def test_a_re_delivered_step_is_a_duplicate_and_does_nothing():
    um = _memory()
    erase_step(um, _request())
    again = erase_step(um, _request())
    assert again.duplicate and again.receipt is None and again.outcome.ledger == []


def test_a_step_re_processed_after_a_crash_repeats_the_same_outputs():
    """A crash before the table writes: the step runs again on the state it first ran on."""
    um = _memory()
    before = um.clone()
    first = erase_step(um, _request(), negotiator_state=_negotiator(), relay_override="none")
    second = erase_step(before, _request(), negotiator_state=_negotiator(), relay_override="none")
    assert first.receipt == second.receipt and first.outcome.ledger == second.outcome.ledger
    assert first.negotiator_state == second.negotiator_state


def test_a_large_user_is_erased_in_bounded_steps():
    facts = [f"Fact number {i} about {w}" for i, w in enumerate("tea coffee chess piano sushi tennis oslo".split())]
    um = _memory(facts)
    nodes = sorted(n["node_id"] for n in um.nodes())
    policy = ErasurePolicy(max_nodes_per_step=3, max_receipt_ids=4)
    request, steps, deleted = _request(), [], []
    while True:
        er = erase_step(um, request, policy=policy)
        assert len(er.outcome.node_deletions) <= 3
        deleted += er.outcome.node_deletions
        steps.append(er)
        if er.continuation is None:
            break
        assert validate_erase_request(er.continuation) is None
        assert erase_step(um.clone(), request, policy=policy).duplicate  # a re-sent earlier step
        request = er.continuation
    assert deleted == nodes and len(steps) == 3 and len(um) == 0
    r = steps[-1].receipt
    assert (r["nodes_erased"], r["node_ids"], r["node_ids_omitted"], r["steps"]) == (7, nodes[:4], 3, 3)
    assert r["node_ids_digest"] == digest_step(digest_step(digest_step("", nodes[:3]), nodes[3:6]), nodes[6:])


def test_a_step_limit_of_zero_still_finishes():
    um = _memory()
    er = erase_step(um, _request(), policy=ErasurePolicy(max_nodes_per_step=0, max_receipt_ids=0))
    assert len(er.outcome.node_deletions) == 1 and er.continuation is not None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(FACTS + [f"{f} again" for f in FACTS]), min_size=0, max_size=25), st.integers(1, 6))
def test_any_user_is_erased_completely(texts, per_step):
    um = _memory(texts)
    count = len(um)
    request = _request()
    for _ in range(30):
        er = erase_step(um, request, policy=ErasurePolicy(max_nodes_per_step=per_step))
        if er.continuation is None:
            break
        request = er.continuation
    assert er.receipt is not None and er.receipt["nodes_erased"] == count and len(um) == 0


def test_bad_requests_are_refused():
    good = _request()
    assert validate_erase_request(good) is None
    assert validate_erase_request("nope").code == "not_a_record"
    assert validate_erase_request({**good, "motebit_id": "a/b"}).code == "invalid_id"
    assert validate_erase_request({**good, "request_id": ""}).code == "invalid_id"
    assert validate_erase_request({**good, "step": -1}).code == "invalid_step"
    assert validate_erase_request({**good, "timestamp": "x"}).code == "invalid_timestamp"
    try:
        erase_request("a b", "r", TS)
    except LimitExceeded as exc:
        assert exc.code == "invalid_id"
    else:
        raise AssertionError("an invalid id was accepted")
