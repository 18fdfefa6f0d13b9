import pytest

from streams.core import (
    DedupWindow,
    UserMemory,
    event_sort_key,
    process_candidate,
    process_event,
    validate_candidate,
    validate_event,
)

from .factories import candidate, event, formed


# ------------------------------------------------------------------ candidates ----


def _code(raw):
    _, rej = validate_candidate(raw)
    return None if rej is None else rej.code


def test_candidate_missing_sensitivity_is_rejected_fail_closed():
    c = candidate("User's blood type is O-")
    del c["sensitivity"]
    assert _code(c) == "missing_sensitivity"
    assert _code({**c, "sensitivity": None}) == "missing_sensitivity"
    assert _code({**c, "sensitivity": "unknown"}) == "invalid_sensitivity"
    um = UserMemory("u1")
    out = process_candidate(um, c)
    assert [(r.code, r.dead_letter) for r in out.rejections] == [("missing_sensitivity", True)]
    assert not out.ledger and not out.node_upserts and not um.live


@pytest.mark.parametrize(
    "change, code",
    [
        ({"candidate_id": None}, "missing_candidate_id"),
        ({"candidate_id": "  "}, "missing_candidate_id"),
        ({"motebit_id": ""}, "missing_motebit_id"),
        ({"content": ""}, "empty_content"),
        ({"content": None}, "empty_content"),
        ({"confidence": 1.01}, "confidence_out_of_range"),
        ({"confidence": -0.1}, "confidence_out_of_range"),
        ({"confidence": float("nan")}, "invalid_confidence"),
        ({"confidence": "high"}, "invalid_confidence"),
        ({"confidence": True}, "invalid_confidence"),
        ({"memory_type": "procedural"}, "invalid_memory_type"),
        ({"timestamp": None}, "missing_timestamp"),
        ({"timestamp": "yesterday"}, "invalid_timestamp"),
        ({"embedding": [1.0, float("nan")]}, "invalid_embedding"),
        ({"embedding": "1,2"}, "invalid_embedding"),
        ({"extra": "pinned: true"}, "invalid_extra"),
        ({"valid_from": 1.5}, "invalid_valid_from"),
    ],
)
def test_candidate_validation_reasons(change, code):
    assert _code({**candidate("x y z"), **change}) == code


def test_candidate_confidence_bounds_inclusive():
    assert _code(candidate("a", confidence=0)) is None
    assert _code(candidate("a", confidence=1)) is None


def test_unknown_source_is_absent_not_rejected():
    um = UserMemory("u1")
    out = process_candidate(um, candidate("User likes jazz", source="martian_overlord"))
    assert out.decision.action == "accept"
    assert out.node_upserts[0]["source"] is None
    assert out.ledger[0]["payload"]["source"] is None
    cand, rej = validate_candidate(candidate("x", source="unknown"))
    assert rej is None and cand["source"] is None


def test_zero_embedding_is_absent_and_defaults_filled():
    cand, rej = validate_candidate({**candidate("x"), "embedding": [0.0, 0.0], "memory_type": None})
    assert rej is None and cand["embedding"] is None and cand["memory_type"] == "semantic"
    assert set(cand) == {
        "candidate_id", "motebit_id", "content", "sensitivity", "source", "memory_type", "confidence",
        "valid_from", "timestamp", "embedding", "frontmatter_type", "extra", "supersedes", "kind", "session_id",
    }


# ---------------------------------------------------------------------- events ----


def _ecode(raw):
    _, rej = validate_event(raw)
    return None if rej is None else rej.code


def test_memory_formed_without_sensitivity_is_rejected():
    e = formed("n1", "User lives in Berlin")
    del e["payload"]["sensitivity"]
    assert _ecode(e) == "missing_sensitivity"
    um = UserMemory("u1")
    out = process_event(um, e)
    assert [r.code for r in out.dead_letters] == ["missing_sensitivity"] and not um.live and not out.ledger


def test_event_validation_reasons():
    assert _ecode(event("memory_exploded", {"node_id": "n"})) == "unknown_event_type"
    assert _ecode(event("unknown", {"node_id": "n"})) == "unknown_event_type"
    assert _ecode(event("memory_accessed", {"node_id": "n"}, event_id="")) == "missing_event_id"
    assert _ecode(event("memory_accessed", {"node_id": "n"}, motebit_id=None)) == "missing_motebit_id"
    assert _ecode(event("memory_accessed", {})) == "missing_node_id"
    assert _ecode(event("memory_accessed", {"node_id": "n"}, timestamp=None)) == "missing_timestamp"
    assert _ecode(event("memory_accessed", {"node_id": "n"}, version_clock="x")) == "invalid_version_clock"
    assert _ecode(event("memory_consolidated", {"action": "explode", "reason": "?"})) == "unknown_action"
    assert _ecode(event("memory_consolidated", {"action": "unknown", "reason": "?"})) == "unknown_action"
    assert _ecode(event("memory_pinned", {"node_id": "n", "pinned": "yes"})) == "invalid_pinned"
    assert _ecode(event("memory_promoted", {"node_id": "n", "from_confidence": 0.5, "to_confidence": 1.5, "reinforcement_count": 3, "reason": ""})) == "confidence_out_of_range"
    assert _ecode(formed("n", "x", payload_extra={"valid_from": 10, "valid_until": 5})) == "invalid_validity"
    assert _ecode(event("memory_decayed", None)) is None  # reserved: any (or no) payload


def test_alternate_action_vocabulary_is_normalized_on_the_ledger():
    um = UserMemory("u1")
    for alt, wire in (("add", "accept"), ("update", "supersede"), ("reinforce", "merge"), ("noop", "merge")):
        out = process_event(um, event("memory_consolidated", {"action": alt, "existing_node_id": None, "new_node_id": None, "reason": "r"}))
        assert out.ledger[0]["payload"]["action"] == wire


def test_formed_event_unknown_source_degrades():
    um = UserMemory("u1")
    out = process_event(um, formed("n1", "User lives in Berlin", payload_extra={"source": "unknown"}))
    assert out.applied and um.live["n1"]["source"] is None and out.ledger[0]["payload"]["source"] is None


# --------------------------------------------------------------------- dedup ----


def test_duplicate_event_id_dropped_and_counted_other_user_not_duplicate():
    u1, u2 = UserMemory("u1"), UserMemory("u2")
    e = event("memory_accessed", {"node_id": "n1"}, event_id="same-id")
    process_event(u1, formed("n1", "User likes tea", motebit_id="u1"))
    first = process_event(u1, e)
    again = process_event(u1, dict(e))
    assert first.applied and not first.duplicate and len(first.ledger) == 1
    assert again.duplicate and not again.ledger and not again.node_upserts and not again.rejections
    assert u1.seen.duplicates == 1
    assert u1.live["n1"]["access_count"] == 1  # applied once
    other = process_event(u2, {**e, "motebit_id": "u2"})
    assert other.applied and not other.duplicate and u2.seen.duplicates == 0


def test_duplicate_candidate_id_dropped():
    um = UserMemory("u1")
    c = candidate("User likes tea")
    assert process_candidate(um, c).decision.action == "accept"
    assert process_candidate(um, dict(c)).duplicate
    assert um.seen.duplicates == 1
    assert next(iter(um.live.values()))["reinforcement_count"] == 0


def test_candidate_replay_beyond_the_window_is_still_idempotent():
    um = UserMemory("u1", dedup_max_ids=1)
    c = candidate("User likes tea")
    process_candidate(um, c)
    for i in range(5):
        process_candidate(um, candidate(f"filler fact number {i} about gardening tomatoes"))
    assert "c:" + c["candidate_id"] not in um.seen  # evicted
    assert process_candidate(um, c).duplicate  # its node exists: still a duplicate


def test_echo_of_a_derived_event_is_a_duplicate():
    um = UserMemory("u1")
    out = process_candidate(um, candidate("User likes tea"))
    echo = dict(out.ledger[0])
    assert process_event(um, echo).duplicate


def test_dedup_window_bounds():
    w = DedupWindow(max_ids=3, horizon_ms=100)
    for i, ts in enumerate((10, 20, 30, 40)):
        w.add(f"id{i}", ts)
    assert "id0" not in w and len(w) == 3
    w.add("late", 500)  # horizon: everything older than 400 goes
    assert list(w.to_record()["ids"]) == [["late", 500]]
    r = DedupWindow.from_record(w.to_record(), max_ids=3, horizon_ms=100)
    assert "late" in r and r.high_water == 500


# ------------------------------------------------------------------- ordering ----


def test_sort_key():
    a = event("memory_accessed", {"node_id": "n"}, timestamp=5, version_clock=2, event_id="b")
    b = event("memory_accessed", {"node_id": "n"}, timestamp=5, version_clock=1, event_id="z")
    c = event("memory_accessed", {"node_id": "n"}, timestamp=4, version_clock=9, event_id="a")
    assert [e["event_id"] for e in sorted([a, b, c], key=event_sort_key)] == ["a", "z", "b"]
    assert event_sort_key(a) == (5, 2, "b")


def test_event_times_outside_2000_to_record_time_plus_skew_are_rejected():
    from streams.core.ingest import MIN_TIME_MS, time_problem
    from streams.core.limits import Limits

    lim = Limits(max_future_skew_ms=1000)
    rec_ms = 1_800_000_000_000
    assert time_problem({"timestamp": rec_ms + 1000}, rec_ms, lim) is None
    assert time_problem({"timestamp": rec_ms + 1001}, rec_ms, lim).code == "invalid_time"
    assert time_problem({"timestamp": 2**63 - 1}, rec_ms, lim).code == "invalid_time"
    assert time_problem({"timestamp": MIN_TIME_MS - 1}, rec_ms, lim).code == "invalid_time"
    assert time_problem({"timestamp": rec_ms, "valid_from": rec_ms + 5000}, rec_ms, lim).code == "invalid_time"
    event = {"timestamp": rec_ms, "payload": {"valid_from": rec_ms, "valid_until": 2**62}}
    assert time_problem(event, rec_ms, lim) is None  # a validity may end in the future
    assert time_problem({**event, "payload": {"valid_until": 5}}, rec_ms, lim).code == "invalid_time"
    # deterministic: the bound is the record's Kafka timestamp, not the clock; without one only the lower bound
    assert time_problem({"timestamp": 2**62}, None, lim) is None
    assert time_problem({"timestamp": "x"}, rec_ms, lim) is None  # left to the validators
