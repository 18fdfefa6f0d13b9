"""The session compaction ledger end to end: generated sessions (valid, and one per fault
scenario) through a real `memstream worker`; the ledger on session.compactions.v1 must equal the
pure reducer's replay, and the DLQ must hold exactly one dead letter per violation."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from streams.contracts import catalog
from streams.sessions import lifecycle, samples
from tests.kafka_util import codecs, free_port, http_get, produce, read_to_end, wait_caught_up, worker

pytestmark = pytest.mark.kafka


def renamed(session: samples.SampleSession, new_id: str) -> samples.SampleSession:
    """The same session under another id (every event, incl. the deliberately misrouted one whose
    sessionId is `<id>-other`), so sessions of different test runs never share a key."""
    old = session.session_id
    events = [{**ev, "sessionId": new_id + ev["sessionId"][len(old):] if ev["sessionId"].startswith(old) else ev["sessionId"]}
              for ev in session.events]
    return samples.SampleSession(new_id, session.scenario, events, session.expected)


def test_worker_keeps_the_ledger_and_dead_letters_every_violation(stack, unique):
    sessions = [samples.valid_session(seed, session_id=f"s-valid-{seed}-{unique}") for seed in (1, 2)]
    sessions += [renamed(samples.broken_session(sc, 1), f"sx-{sc}-{unique}") for sc in samples.SCENARIOS]
    expected = {}
    for s in sessions:
        state, violations = lifecycle.replay(s.events)
        assert sorted(v.rule for v in violations) == s.expected  # the sample says what it breaks
        expected[s.session_id] = (lifecycle.to_record(state), Counter((v.rule, v.seq) for v in violations))
    assert sum(len(v) for _, v in expected.values()) > len(samples.SCENARIOS)  # some break more than one rule

    app_id = f"it-sessions-{unique}"
    started = time.monotonic()
    port = free_port()
    env = {"MEMSTREAM_APP_ID": app_id, "MEMSTREAM_WEB_PORT": str(port), "MEMSTREAM_API_TOKENS": "t:none"}
    with worker(stack, f"sessions-{unique}", env=env):
        produce(stack, catalog.SESSION_EVENTS, [(s.session_id, ev) for s in sessions for ev in s.events])
        produce(stack, catalog.SESSION_EVENTS, [(sessions[0].session_id, b"not an avro record")])
        # redelivery (at-least-once upstream): the first session's first ten events again
        produce(stack, catalog.SESSION_EVENTS, [(sessions[0].session_id, ev) for ev in sessions[0].events[:10]])
        wait_caught_up(stack, app_id, catalog.SESSION_EVENTS)
        api = {s.session_id: http_get(port, f"/v1/sessions/{s.session_id}/compactions", "t") for s in sessions[:3]}
        unknown = http_get(port, "/v1/sessions/no-such-session/compactions", "t")
    for sid, (status, body) in api.items():  # the HTTP view serves the same ledger
        assert status == 200 and body == expected[sid][0]
    assert unknown[0] == 404
    elapsed = time.monotonic() - started
    keys = {s.session_id.encode() for s in sessions}

    latest = {}
    for m in read_to_end(stack, catalog.SESSION_COMPACTIONS, keys):
        latest[m["key"].decode()] = m["value"]
    for s in sessions:
        assert latest[s.session_id] == expected[s.session_id][0], s.scenario
    # a crossing reported at its boundary, then retracted by an end-seed, reaches the topic
    orphan = latest[f"sx-turn.orphan_crossing_retracted-{unique}"]
    assert [c["crossing"]["retracted"] for c in orphan["compactions"] if c["crossing"]] == [True]

    letters = read_to_end(stack, catalog.DLQ, keys)
    event_codec = codecs(stack).codec("session_event")
    got: dict[str, Counter] = {s.session_id: Counter() for s in sessions}
    decode_errors = []
    for m in letters:
        rec = m["value"]
        assert rec["original_topic"] == catalog.SESSION_EVENTS
        assert m["headers"]["__connect.errors.exception.class.name"] == rec["error_class"].encode()
        if rec["stage"] == "decode":
            decode_errors.append(rec)
            continue
        assert rec["error_class"] in lifecycle.RULES and rec["reason"].startswith(rec["error_class"] + ": ")
        assert rec["stage"] == ("validate" if rec["error_class"] in ("event.session_mismatch", "event.over_limit") else "apply")
        seq = event_codec.decode(rec["original_value"])["seq"]  # the original record, verbatim
        got[m["key"].decode()][(rec["error_class"], seq)] += 1
    for s in sessions:
        assert got[s.session_id] == expected[s.session_id][1], s.scenario  # exactly one per violation
    # a reused seq with different content is on the DLQ with its rule and reason (its identical
    # redelivery, produced just before it, is not); so are the first session's ten redeliveries not
    reused_sid = f"sx-session.seq_reused-{unique}"
    reused = [m["value"] for m in letters if m["key"].decode() == reused_sid]
    assert [r["error_class"] for r in reused] == ["session.seq_reused"]
    original = event_codec.decode(reused[0]["original_value"])
    assert reused[0]["reason"].startswith(f"session.seq_reused: seq {original['seq']} was already applied with "
                                          "different content")
    assert "another message reusing seq" in str(original["data"])
    assert not any(m["key"].decode() == sessions[0].session_id for m in letters if m["value"]["stage"] != "decode")
    assert len(decode_errors) == 1 and decode_errors[0]["original_value"] == b"not an avro record"
    print(f"\n[sessions] {sum(len(s.events) for s in sessions)} events, {len(letters)} dead letters, "
          f"worker run {elapsed:.1f}s")
