"""The per-graph execution state reducer."""

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.graphs import samples
from streams.graphs.paths import FIELDS
from streams.graphs.state import GraphEventError, apply, mark_stalled, new_state, stalled_nodes, to_record

GRAPH_STATE_FIELDS = {"graphId", "phase", "nodes", "budget", "degradedNotifications", "stalledNodes", "updatedAt", "eventCount"}
NODE_FIELDS = {"nodeId", "status", "agent", "startedAt", "completedAt", "signalType", "stalled"}
STALL = 60_000


def ev(ts, event, gid="g-1", **kw):
    e = {f: None for f in FIELDS}
    e.update(ts=ts, graphId=gid, event=event, **kw)
    return e


def fold(events, stall=STALL, state=None):
    for e in events:
        state = apply(state, e, stall)
    return state


def node(state, nid):
    return next(n for n in to_record(state)["nodes"] if n["nodeId"] == nid)


def test_phases_idle_executing_complete():
    st0 = new_state("g-1")
    assert to_record(st0)["phase"] == "idle"
    s = fold([ev(1, "phase_change", status="executing")], state=st0)
    assert to_record(s)["phase"] == "executing"
    s = fold([ev(2, "phase_change", status="complete")], state=s)
    rec = to_record(s)
    assert rec["phase"] == "complete"
    assert set(rec) == GRAPH_STATE_FIELDS
    assert rec["eventCount"] == 2 and rec["updatedAt"] == 2


def test_late_phase_changes_never_move_the_phase_back():
    s = fold([ev(1, "phase_change", status="executing"), ev(5, "phase_change", status="complete")])
    # reordered: an older executing arrives after complete
    s = fold([ev(3, "phase_change", status="executing")], state=s)
    assert s["phase"] == "complete"
    # even with a newer ts, complete is not undone to a known earlier phase
    s = fold([ev(9, "phase_change", status="idle")], state=s)
    assert s["phase"] == "complete"
    # an unknown phase is taken when newer
    s2 = fold([ev(1, "phase_change", status="executing"), ev(2, "phase_change", status="paused")])
    assert s2["phase"] == "paused"
    s2 = fold([ev(1, "phase_change", status="draining")], state=s2)  # older: ignored
    assert s2["phase"] == "paused"


def test_node_dispatch_and_completion():
    s = fold([
        ev(100, "node_dispatched", nodeId="n1", status="running", agent="coder", startedAt=100),
        ev(150, "node_dispatched", nodeId="n2", agent="writer"),  # no status / startedAt: running, since ts
        ev(400, "node_completed", nodeId="n1", status="completed", signalType="answer", agent="coder",
           startedAt=100, completedAt=400),
    ])
    n1, n2 = node(s, "n1"), node(s, "n2")
    assert set(n1) == NODE_FIELDS
    assert (n1["status"], n1["agent"], n1["startedAt"], n1["completedAt"], n1["signalType"]) == ("completed", "coder", 100, 400, "answer")
    assert (n2["status"], n2["agent"], n2["startedAt"], n2["completedAt"]) == ("running", "writer", 150, None)
    assert [n["nodeId"] for n in to_record(s)["nodes"]] == ["n1", "n2"]


def test_completion_without_status_or_completed_at():
    s = fold([ev(5, "node_completed", nodeId="n1", signalType="timeout")])
    n = node(s, "n1")
    assert (n["status"], n["completedAt"], n["signalType"]) == ("timeout", 5, "timeout")


def test_redispatch_after_revise_runs_again():
    s = fold([
        ev(1, "node_dispatched", nodeId="n1", status="running", agent="a", startedAt=1),
        ev(5, "node_completed", nodeId="n1", status="revise_needed", signalType="revise_needed", completedAt=5),
        ev(6, "node_dispatched", nodeId="n1", status="running", agent="a", startedAt=6),
    ])
    n = node(s, "n1")
    assert (n["status"], n["startedAt"], n["completedAt"], n["signalType"]) == ("running", 6, None, None)


def test_completion_arriving_before_its_dispatch():
    s = fold([
        ev(9, "node_completed", nodeId="n1", status="completed", signalType="answer", completedAt=9),
        ev(2, "node_dispatched", nodeId="n1", status="running", agent="coder", startedAt=2),
    ])
    n = node(s, "n1")
    assert n["status"] == "completed"  # the late dispatch does not revert it
    assert n["agent"] == "coder" and n["startedAt"] == 2  # but fills what was missing
    assert not n["stalled"]


def test_same_ms_dispatch_and_completion_in_either_order():
    d = ev(7, "node_dispatched", nodeId="n1", status="running", startedAt=7)
    c = ev(7, "node_completed", nodeId="n1", status="completed", signalType="answer")
    assert node(fold([d, c]), "n1")["status"] == "completed"
    assert node(fold([c, d]), "n1")["status"] == "completed"


def test_budget_is_the_cumulative_snapshot_not_a_sum():
    b1 = {"sessionsSpawned": 1, "inputTokens": 100, "outputTokens": 10, "costUsd": 0.5}
    b2 = {"sessionsSpawned": 3, "inputTokens": 900, "outputTokens": 70, "costUsd": 2.25}
    s = fold([ev(1, "budget_update", budget=b1), ev(2, "budget_update", budget=b2)])
    assert to_record(s)["budget"] == b2
    # a late, older snapshot does not replace a newer one
    s = fold([ev(1, "budget_update", budget={"sessionsSpawned": 9, "inputTokens": 9, "outputTokens": 9, "costUsd": 9.0})], state=s)
    assert to_record(s)["budget"] == b2
    assert to_record(new_state("g"))["budget"] is None


def test_degraded_notifications_counted_by_kind():
    s = fold([
        ev(1, "notification_degraded", status="completion"),
        ev(2, "notification_degraded", status="stall"),
        ev(3, "notification_degraded", status="completion"),
        ev(4, "notification_degraded"),
    ])
    assert to_record(s)["degradedNotifications"] == {"completion": 2, "stall": 1, "unknown": 1}


def test_stall_flag_at_the_exact_boundary():
    s = fold([ev(1_000, "node_dispatched", nodeId="n1", status="running", startedAt=1_000)], stall=500)
    assert not node(s, "n1")["stalled"]
    exactly = mark_stalled(s, 1_500, 500)  # running exactly stall_after_ms: not yet
    assert not node(exactly, "n1")["stalled"]
    assert to_record(exactly)["stalledNodes"] == []
    over = mark_stalled(s, 1_501, 500)  # one ms longer: stalled
    assert node(over, "n1")["stalled"]
    assert to_record(over)["stalledNodes"] == ["n1"]
    assert not node(s, "n1")["stalled"]  # mark_stalled did not mutate its input


def test_stall_evaluated_at_event_time_too():
    s = fold([ev(0, "node_dispatched", nodeId="n1", status="running", startedAt=0),
              ev(100, "node_dispatched", nodeId="n2", status="running", startedAt=100),
              ev(600, "phase_change", status="executing")], stall=500)
    assert stalled_nodes(s) == ["n1"]  # 600 - 0 > 500; 600 - 100 = 500 is not


def test_stall_clears_on_completion_and_clock_never_goes_back():
    s = fold([ev(0, "node_dispatched", nodeId="n1", status="running", startedAt=0),
              ev(0, "node_dispatched", nodeId="n2", status="running", startedAt=0)], stall=500)
    s = mark_stalled(s, 10_000, 500)
    assert stalled_nodes(s) == ["n1", "n2"]
    # an event older than the wall clock the timer saw does not un-stall n2
    s = apply(s, ev(700, "node_completed", nodeId="n1", status="completed", signalType="answer"), 500)
    assert stalled_nodes(s) == ["n2"]
    s = mark_stalled(s, 5, 500)
    assert stalled_nodes(s) == ["n2"]


def test_stall_detection_can_be_disabled():
    s = fold([ev(0, "node_dispatched", nodeId="n1", status="running", startedAt=0)], stall=None)
    assert stalled_nodes(mark_stalled(s, 10**12, None)) == []


def test_duplicate_event_ids_are_skipped():
    e = ev(1, "notification_degraded", status="stall")
    s = apply(None, e, STALL, event_id="line-1")
    again = apply(s, e, STALL, event_id="line-1")
    assert again is s
    s2 = apply(s, e, STALL, event_id="line-2")  # the same content on another line is a new event
    assert to_record(s2)["degradedNotifications"] == {"stall": 2}
    # without ids, the content fingerprint dedupes a redelivery
    s3 = apply(apply(None, e, STALL), e, STALL)
    assert to_record(s3)["eventCount"] == 1


def test_bad_events_raise_for_the_dead_letter_topic():
    s = fold([ev(1, "phase_change", status="executing")])
    with pytest.raises(GraphEventError):
        apply(s, ev(2, "phase_change", gid="g-2", status="complete"), STALL)
    with pytest.raises(GraphEventError):
        apply(s, ev(2, "unknown"), STALL)
    with pytest.raises(GraphEventError):
        apply(s, ev(2, "node_dispatched"), STALL)  # no nodeId
    with pytest.raises(GraphEventError):
        apply(s, {"ts": "x", "graphId": "g-1", "event": "phase_change"}, STALL)
    assert to_record(s)["eventCount"] == 1


def test_apply_does_not_mutate_and_state_is_json():
    run = samples.graph_run(11)
    state = None
    for e in run.events:
        before = copy.deepcopy(state)
        new = apply(state, e, STALL)
        assert state == before
        state = new
    assert json.loads(json.dumps(state)) == state
    json.dumps(to_record(state))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.randoms(use_true_random=False))
def test_sample_runs_materialize_as_expected_in_any_order(seed, unfinished, rnd):
    run = samples.graph_run(seed, unfinished=unfinished)
    exp = run.expected
    straight = fold(run.events, stall=STALL)
    shuffled_events = list(run.events)
    rnd.shuffle(shuffled_events)
    shuffled = fold(shuffled_events, stall=STALL)
    for s in (straight, shuffled):
        rec = to_record(s)
        assert rec["phase"] == exp["phase"]
        assert {n["nodeId"]: {k: n[k] for k in ("status", "agent", "startedAt", "completedAt", "signalType")}
                for n in rec["nodes"]} == exp["nodes"]
        assert rec["budget"] == exp["budget"]
        assert rec["degradedNotifications"] == exp["degradedNotifications"]
        assert rec["eventCount"] == exp["eventCount"]
        assert rec["updatedAt"] == exp["updatedAt"]
    assert sorted(stalled_nodes(straight)) == sorted(stalled_nodes(shuffled))


def test_unfinished_run_nodes_stall_later():
    run = samples.graph_run(5, unfinished=True)
    s = fold(run.events, stall=STALL)
    later = mark_stalled(s, run.expected["updatedAt"] + 10 * STALL, STALL)
    assert sorted(stalled_nodes(later)) == sorted(run.expected["running"])
    assert run.expected["running"]
