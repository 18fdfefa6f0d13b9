"""Classification (streams/analytics/classify.py) of what the real pipeline core produces."""

from __future__ import annotations

from collections import Counter

from streams.analytics import (
    HOUR,
    Increment,
    WindowPolicy,
    add_increment,
    classify_compaction,
    classify_dead_letter,
    classify_graph_budget,
    classify_ledger_event,
    classify_outcome,
    classify_quarantine,
    classify_relay_event,
    dead_letter_subject,
    mark_published,
    new_state,
    records_due,
    routing_key,
    subject_kind,
    subject_partition,
    to_record,
    windows_of,
)
from streams.contracts import catalog, deadletter
from streams.core import UserMemory, process_candidate, process_event
from streams.core.redaction import relay_events
from streams.graphs import state as graph_state
from streams.sessions import lifecycle, samples
from tests.core.factories import candidate, event

T0 = 1_767_225_600_000


def totals(increments) -> Counter:
    c: Counter = Counter()
    for inc in increments:
        c.update(inc.counters)
    return c


def test_memory_pipeline_outcomes_are_classified():
    um = UserMemory("u1")
    incs: list[Increment] = []

    def run(out):
        relayed = [r for ev in out.ledger for r in relay_events(ev, "personal", um.deleted_node_ids)]
        found = classify_outcome(out, relayed)
        incs.extend(found)
        return out, totals(found)

    out, c = run(process_candidate(um, candidate("User prefers dark mode in the editor", timestamp=T0 + 1)))
    assert c == {"formed": 1}  # accept: memory_formed + memory_consolidated(accept)
    nid = out.node_upserts[0]["node_id"]
    merges = [run(process_candidate(um, candidate("User prefers dark mode in the editor", timestamp=T0 + 2 + i)))[1]
              for i in range(3)]
    assert merges == [{"merged": 1}, {"merged": 1}, {"merged": 1, "promoted": 1}]  # 3rd reinforcement promotes
    out, _ = run(process_candidate(um, candidate("User lives in Berlin with a dog named rex", timestamp=T0 + 10)))
    old = out.node_upserts[0]["node_id"]
    _, c = run(process_candidate(um, candidate("User lives in Paris now", supersedes=old, timestamp=T0 + 11)))
    assert c == {"formed": 1, "superseded": 1}
    _, c = run(process_candidate(um, candidate("always answer in french", frontmatter_type="feedback",
                                               source="agent_inferred", timestamp=T0 + 12)))
    assert c == {"quarantined": 1}
    _, c = run(process_event(um, event("memory_accessed", {"node_id": nid}, timestamp=T0 + 13)))
    assert c == {"accessed": 1}
    _, c = run(process_event(um, event("memory_deleted", {"node_id": nid}, timestamp=T0 + 14)))
    assert c == {"deleted": 1}  # its relay tombstone (redacted, reason deleted) is not a redaction
    _, c = run(process_candidate(um, candidate("blood pressure medication daily at nine", sensitivity="medical",
                                               timestamp=T0 + 15)))
    assert c == {"formed": 1, "redacted": 1}  # medical > personal: redacted on the relay
    _, c = run(process_event(um, event("memory_pinned", {"node_id": old, "pinned": True}, timestamp=T0 + 16)))
    assert c == {}
    assert totals(incs) == {"formed": 4, "merged": 3, "promoted": 1, "superseded": 1, "quarantined": 1,
                            "accessed": 1, "deleted": 1, "redacted": 1}
    assert {i.subject for i in incs} == {"u1"}
    assert len({i.id for i in incs}) == len(incs)  # distinct, deterministic ids

    s = new_state("u1")
    for inc in incs:
        assert add_increment(s, inc).counted
    hour = to_record("u1", windows_of(s, HOUR)[0])
    assert {k: hour[k] for k in ("formed", "merged", "promoted", "superseded", "quarantined", "accessed",
                                 "deleted", "redacted", "dead_lettered")} == \
        {"formed": 4, "merged": 3, "promoted": 1, "superseded": 1, "quarantined": 1, "accessed": 1,
         "deleted": 1, "redacted": 1, "dead_lettered": 0}
    for inc in incs:  # the same outcomes re-processed after a crash: nothing counted twice
        assert add_increment(s, inc).duplicate


def test_ledger_rules_directly():
    def ev(event_type, payload, **kw):
        return event(event_type, payload, timestamp=T0, event_id="e1", **kw)

    assert classify_ledger_event(ev("memory_consolidated", {"action": "reinforce", "reason": ""})) == \
        [Increment("u1", T0, {"merged": 1}, "ledger:e1")]
    assert totals(classify_ledger_event(ev("memory_consolidated", {"action": "noop", "reason": ""}))) == {"merged": 1}
    assert totals(classify_ledger_event(ev("memory_consolidated", {"action": "update", "reason": ""}))) == {"superseded": 1}
    for action in ("accept", "add", "reject", "bogus"):
        assert classify_ledger_event(ev("memory_consolidated", {"action": action, "reason": ""})) == []
    tomb = {"node_id": "n", "content": "[REDACTED]", "sensitivity": "personal", "redacted": True,
            "redacted_reason": "deleted"}
    assert classify_ledger_event(ev("memory_formed", tomb)) == []
    assert classify_relay_event(ev("memory_formed", tomb)) == []
    redacted = {**tomb, "redacted_reason": None}
    assert classify_relay_event(ev("memory_formed", redacted)) == [Increment("u1", T0, {"redacted": 1}, "relay:e1")]
    assert classify_relay_event(ev("memory_formed", {**redacted, "redacted": None})) == []
    for et in ("memory_audit", "memory_decayed", "memory_pinned"):
        assert classify_ledger_event(ev(et, {})) == []
    assert classify_ledger_event({"event_type": "memory_formed"}) == []  # no envelope: nothing
    q = {"entry_id": "q1", "motebit_id": "u1", "quarantined_at": T0 + 5}
    assert classify_quarantine(q) == [Increment("u1", T0 + 5, {"quarantined": 1}, "quarantine:q1")]


def _dl(topic, key, partition=2, offset=40):
    return deadletter.dead_letter(deadletter.Origin(topic, partition, offset, key, b"v"), stage="decode",
                                  reason="r", error_class="E", failed_at=999, worker="w")


def test_dead_letters():
    assert classify_dead_letter(_dl(catalog.MEMORY_EVENTS, b"u1"), T0, index=1) == \
        [Increment("u1", T0, {"dead_lettered": 1}, f"dlq:{catalog.MEMORY_EVENTS}:2:40:1")]
    assert classify_dead_letter(_dl(catalog.NEGOTIATOR_REQUESTS, b"u2"), T0)[0].subject == "u2"
    assert classify_dead_letter(_dl(catalog.SESSION_EVENTS, b"s1"), T0)[0].subject == "session:s1"
    assert classify_dead_letter(_dl(catalog.GRAPH_EVENTS, b"g1"), T0)[0].subject == "graph:g1"
    # a key that is not UTF-8, or none: "(unknown)" of the partition whose state it goes to
    assert classify_dead_letter(_dl(catalog.MEMORY_EVENTS, b"\xff\xfe"), T0)[0].subject == "(unknown):2"
    assert classify_dead_letter(_dl(catalog.MEMORY_EVENTS, None, partition=5), T0)[0].subject == "(unknown):5"
    assert dead_letter_subject(b"\xff", catalog.MEMORY_EVENTS) == "(unknown)"
    assert dead_letter_subject("u3", catalog.MEMORY_CANDIDATES) == "u3"
    # the event time is the one given (the source record's Kafka timestamp), not failed_at
    assert classify_dead_letter(_dl(catalog.MEMORY_EVENTS, b"u1"), T0 + 7)[0].event_time_ms == T0 + 7


def test_subjects_and_partitions():
    part = {"u1": 0, "s1": 1, "g1": 2}.__getitem__
    assert [subject_kind(s) for s in ("u1", "session:s1", "graph:g1", "(unknown)", "(unknown):3")] == \
        ["user", "session", "graph", "unknown", "unknown"]
    assert [routing_key(s) for s in ("u1", "session:s1", "graph:g1", "(unknown):3")] == ["u1", "s1", "g1", None]
    assert [subject_partition(s, part) for s in ("u1", "session:s1", "graph:g1", "(unknown):3", "(unknown)")] == \
        [0, 1, 2, 3, None]


def test_compaction_tokens_saved_sum_to_the_ledger_total():
    sample = samples.valid_session(3)
    state, incs = None, []
    for e in sample.events:
        new, _ = lifecycle.step(state, e)
        found = classify_compaction(state, new, e["ts"])
        for inc in found:
            assert inc.event_time_ms == e["ts"] and inc.subject == f"session:{sample.session_id}"
        incs.extend(found)
        # a redelivered event: step returns the same state, nothing is counted
        again, _ = lifecycle.step(new, e)
        assert classify_compaction(new, again, e["ts"]) == []
        state = new
    total = state["record"]["tokensSaved"]
    assert total == 2099 and sum(i.counters["compaction_tokens_saved"] for i in incs) == total
    assert len(incs) == 6
    s = new_state(f"session:{sample.session_id}")
    for inc in incs:
        assert add_increment(s, inc, policy=WindowPolicy(minute_lateness_ms=10 ** 9)).refused == []
    assert sum(w["counters"].get("compaction_tokens_saved", 0) for w in windows_of(s, "minute")) == 2099
    # records work too (not only lifecycle states); an older ledger counts nothing
    rec = lifecycle.to_record(state)
    assert classify_compaction(rec, {**rec, "lastSeq": rec["lastSeq"] - 1, "tokensSaved": 0}, T0) == []


def test_graph_spend_is_counted_once_per_change():
    def bu(ts, cost):
        return {"ts": ts, "graphId": "g1", "nodeId": None, "event": "budget_update", "status": None,
                "signalType": None, "agent": None, "startedAt": None, "completedAt": None,
                "budget": {"sessionsSpawned": 1, "inputTokens": 10, "outputTokens": 5, "costUsd": cost}}

    events = [bu(T0 + 1_000, 0.1), bu(T0 + 70_000, 0.35), bu(T0 + 5_000, 0.2),  # the last is older: ignored
              bu(T0 + 70_000, 0.35)]                                              # a replay: ignored
    state, incs = None, []
    for e in events:
        new = graph_state.apply(state, e, None)
        incs.extend(classify_graph_budget(state, new))
        state = new
    assert [(i.subject, i.event_time_ms, dict(i.counters)) for i in incs] == [
        ("graph:g1", T0 + 1_000, {"graph_cost_nanousd": 100_000_000}),
        ("graph:g1", T0 + 70_000, {"graph_cost_nanousd": 250_000_000}),
    ]
    s = new_state("graph:g1")
    for inc in incs:
        add_increment(s, inc)
        assert add_increment(s, inc).duplicate  # the same transition again (crash before the table write)
    recs = {(r["window"], r["window_start"]): r["graph_cost_usd"] for _, r in records_due(s)}
    assert recs == {("minute", T0): 0.1, ("minute", T0 + 60_000): 0.25, ("hour", T0): 0.35}
    # GraphState records work as well as internal states
    rec = graph_state.to_record(state)
    assert classify_graph_budget(None, rec, T0)[0].counters == {"graph_cost_nanousd": 350_000_000}
    assert classify_graph_budget(rec, rec, T0) == []


# ------------------------------------------------------------------------------ property --

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KINDS = {
    ("memory_formed", None): "formed", ("memory_accessed", None): "accessed",
    ("memory_deleted", None): "deleted", ("memory_promoted", None): "promoted",
    ("memory_consolidated", "merge"): "merged", ("memory_consolidated", "supersede"): "superseded",
    ("memory_consolidated", "accept"): None, ("memory_pinned", None): None, ("memory_audit", None): None,
}


@settings(max_examples=150, deadline=None)
@given(evs=st.lists(st.tuples(st.sampled_from(sorted(_KINDS, key=str)), st.integers(0, 5 * 3_600_000)),
                    min_size=1, max_size=50),
       order=st.randoms(use_true_random=False), replay=st.booleans())
def test_classified_ledger_counts_equal_published_sums(evs, order, replay):
    """Ledger events of every type at random times, in any order (and optionally all delivered
    twice): per counter, the sum over the published hour (and minute) windows equals the
    number of classified events that were not too late for that size."""
    from streams.analytics.windows import HOUR_MS, MINUTE_MS

    policy = WindowPolicy(minute_lateness_ms=30 * MINUTE_MS, hour_lateness_ms=HOUR_MS)
    ledger = []
    for i, ((etype, action), t) in enumerate(evs):
        payload = {"node_id": f"n{i}"} if action is None else {"action": action, "reason": ""}
        if etype == "memory_formed":
            payload.update(content="c", sensitivity="personal")
        ledger.append(event(etype, payload, timestamp=T0 + t, event_id=f"e{i}"))
    order.shuffle(ledger)
    deliveries = ledger + ledger if replay else ledger
    s = new_state("u1")
    expected = {"minute": Counter(), "hour": Counter()}
    published: dict[tuple, dict] = {}
    for n, ev in enumerate(deliveries):
        for inc in classify_ledger_event(ev):
            r = add_increment(s, inc, policy=policy)
            for size, _ in r.counted:
                expected[size].update(inc.counters)
        if n % 5 == 0:
            pairs = records_due(s, policy=policy)
            published.update({(r["window"], r["window_start"]): r for _, r in pairs})
            mark_published(s, [w for w, _ in pairs])
    published.update({(r["window"], r["window_start"]): r for _, r in records_due(s, policy=policy)})
    classified = Counter(_KINDS[(e["event_type"], e["payload"].get("action"))] for e in ledger)
    classified.pop(None, None)
    for size in ("minute", "hour"):
        for name in ("formed", "accessed", "deleted", "promoted", "merged", "superseded"):
            total = sum(r[name] for (sz, _), r in published.items() if sz == size)
            assert total == expected[size][name]
            assert total == classified[name] - _too_late(s, ledger, name, size, policy)


def _too_late(s, ledger, name, size, policy) -> int:
    """Independent oracle: inputs (first deliveries, in arrival order) of `name` whose `size`
    window had ended `lateness` before the greatest timestamp seen so far."""
    from streams.analytics.windows import SIZES

    ms, clock, late = SIZES[size], None, 0
    for e in ledger:
        incs = classify_ledger_event(e)
        if not incs:
            continue
        t = e["timestamp"]
        clock = t if clock is None else max(clock, t)
        if name in incs[0].counters and t - t % ms + ms + policy.lateness(size) <= clock:
            late += 1
    return late


def test_a_dead_letter_whose_key_breaks_the_id_rules_counts_under_its_partitions_unknown_subject():
    from streams.analytics.classify import dead_letter_subject, unknown_subject

    for bad in (b"victim/x", b"k" * 2000, b"has space", "caf\u00e9".encode()):
        assert dead_letter_subject(bad, "memory.candidates.v1", 3) == unknown_subject(3)
    assert dead_letter_subject(b"mb-ada", "memory.candidates.v1", 3) == "mb-ada"
