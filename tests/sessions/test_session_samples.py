"""The deterministic sample session generator: valid streams pass, broken ones break exactly as labelled."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.sessions import samples
from streams.sessions.lifecycle import RULES, replay, to_record
from streams.sessions.tokens import price_message


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_valid_sessions_produce_no_violations(seed):
    s = samples.valid_session(seed)
    state, vs = replay(s.events)
    assert vs == [], [str(v) for v in vs]
    rec = to_record(state)
    assert rec["sessionId"] == s.session_id
    assert rec["openCompactionId"] is None
    assert all(c["status"] in ("succeeded", "failed") for c in rec["compactions"])
    assert rec["tokensSaved"] == rec["tokensRemoved"] - rec["tokensAdded"]
    assert [e["seq"] for e in s.events] == list(range(1, len(s.events) + 1))


@pytest.mark.parametrize("scenario", samples.SCENARIOS)
@pytest.mark.parametrize("seed", range(8))
def test_broken_sessions_produce_exactly_their_labels(scenario, seed):
    s = samples.broken_session(scenario, seed)
    assert s.expected, "every broken scenario names at least one rule"
    state, vs = replay(s.events)
    assert sorted(v.rule for v in vs) == s.expected, [str(v) for v in vs]
    # the session keeps being tracked after the fault
    assert state["record"]["lastSeq"] == max(e["seq"] for e in s.events if e["sessionId"] == s.session_id)
    assert state["record"]["violationCount"] == len(s.expected)


@pytest.mark.parametrize("seed", range(4))
def test_the_orphan_crossing_scenario_is_reported_then_retracted(seed):
    s = samples.broken_session("turn.orphan_crossing_retracted", seed)
    state, vs = replay(s.events)
    (v,) = vs
    assert next(e for e in s.events if e["seq"] == v.seq)["type"] == "turn/end"  # reported at the boundary
    (crossed,) = [c for c in state["record"]["compactions"] if c["crossing"] is not None]
    assert crossed["crossing"] == {"seq": v.seq, "rule": "turn.enclosure", "retracted": True}
    assert crossed["error"].startswith("orphaned:") and "retracted" in crossed["error"]


def test_every_rule_has_a_scenario():
    covered = {r for sc in samples.SCENARIOS for r in samples.broken_session(sc, 0).expected}
    assert covered == set(RULES)


def test_generation_is_deterministic():
    a = samples.valid_session(42)
    b = samples.valid_session(42)
    assert a.events == b.events and a.session_id == b.session_id
    assert samples.valid_session(43).events != a.events
    assert samples.broken_session("shadow.range_mismatch", 5).events == samples.broken_session("shadow.range_mismatch", 5).events
    assert [x.events for x in samples.sample_sessions(9, 10)] == [x.events for x in samples.sample_sessions(9, 10)]


def test_samples_are_realistic():
    sessions = [samples.valid_session(seed) for seed in range(40)]
    types = {e["type"] for s in sessions for e in s.events}
    assert {"compaction/start", "compaction/summary", "compaction/end", "compaction/prune", "user/message",
            "assistant/message", "tool/result", "turn/start", "turn/end", "ui/render"} <= types
    summaries = [e for s in sessions for e in s.events if e["type"] == "compaction/summary"]
    assert any(e["data"]["shadowedRange"]["start"] > e["data"]["shadowedRange"]["end"] for e in summaries)
    assert any(e["data"]["llmStreamCall"] for e in summaries) and any(not e["data"]["llmStreamCall"] for e in summaries)
    ends = [e for s in sessions for e in s.events if e["type"] == "compaction/end"]
    assert any(e["data"]["error"] for e in ends)
    manual = [e for s in sessions for e in s.events if e["type"] == "compaction/start" and e["data"]["sourceCommandId"]]
    assert manual and all(e["data"]["turn"] is None for e in manual)
    texts = [b.get("text") or "" for s in sessions for e in s.events if "content" in e["data"] for b in e["data"]["content"]]
    assert any(any(ord(ch) > 0xFFFF for ch in t) for t in texts)  # non-BMP emoji present
    json.dumps([s.events for s in sessions])  # wire-ready plain data


def test_shadowed_token_count_is_the_estimators_price_of_the_range():
    s = samples.valid_session(7, turns=12)
    by_seq = {e["seq"]: e for e in s.events}
    checked = 0
    for e in s.events:
        if e["type"] in ("compaction/summary", "compaction/prune"):
            price = sum(price_message(by_seq[q]["data"]["role"], by_seq[q]["data"]["content"]) for q in e["data"]["shadowedSeqs"])
            assert e["data"]["shadowedTokenCount"] == price
            checked += 1
    assert checked


def test_sample_mix_labels():
    mix = samples.sample_sessions(3, 40, broken_ratio=0.5)
    assert {s.scenario == "valid" for s in mix} == {True, False}
    for s in mix:
        _, vs = replay(s.events)
        assert sorted(v.rule for v in vs) == s.expected


def test_unknown_scenario():
    with pytest.raises(KeyError):
        samples.broken_session("no.such.rule", 1)


def test_samples_survive_the_avro_wire_format():
    """Every sample event is representable in schemas/session_event.avsc, and the checker gives the
    same verdict on the decoded events (what the Faust agent will see)."""
    wire = pytest.importorskip("streams.contracts.wire")
    codec = wire.CodecFactory().codec("session_event")
    ledger = wire.CodecFactory().codec("compaction_ledger")
    for s in samples.generate_sessions(11, count=6, every_scenario=True):
        decoded = [codec.decode(codec.encode(e)) for e in s.events]
        state, vs = replay(decoded)
        assert sorted(v.rule for v in vs) == s.expected, s.scenario
        rec = to_record(state)
        assert ledger.decode(ledger.encode(rec)) == rec
