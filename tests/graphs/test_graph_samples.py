"""Deterministic sample graph runs and corrupt lines."""

import os

from streams.graphs import samples, state as graph_state
from streams.graphs.paths import ParseError, graph_events_hash, parse_line
from streams.graphs.shipper_state import list_event_files, poll_file


def test_runs_are_deterministic():
    assert samples.graph_run(7).events == samples.graph_run(7).events
    assert samples.graph_run(7).events != samples.graph_run(8).events
    assert [r.events for r in samples.graph_runs(1, 5)] == [r.events for r in samples.graph_runs(1, 5)]


def test_runs_are_realistic():
    runs = [samples.graph_run(s) for s in range(40)]
    kinds = {e["event"] for r in runs for e in r.events}
    assert kinds == {"node_dispatched", "node_completed", "phase_change", "budget_update", "notification_degraded"}
    signals = {e["signalType"] for r in runs for e in r.events if e["event"] == "node_completed"}
    assert signals == {"answer", "revise_needed", "escalate", "timeout"}
    for r in runs:
        assert r.events[0]["event"] == "phase_change" and r.events[0]["status"] == "executing"
        assert r.events[-1]["event"] == "phase_change" and r.events[-1]["status"] == "complete"
        ts = [e["ts"] for e in r.events]
        assert ts == sorted(ts)
        costs = [e["budget"]["costUsd"] for e in r.events if e["event"] == "budget_update"]
        assert costs == sorted(costs)  # cumulative
    # every line the writer would emit parses back to the same event
    for r in runs[:10]:
        assert [parse_line(line) for line in r.lines()] == r.events


def test_unfinished_run_leaves_nodes_running():
    r = samples.graph_run(3, unfinished=True)
    assert r.expected["phase"] == "executing" and r.expected["running"]
    assert not any(e["event"] == "phase_change" and e["status"] == "complete" for e in r.events)


def test_bad_lines_produce_their_labelled_errors():
    for seed in range(10):
        cases = samples.bad_lines(seed)
        assert {k for _, k in cases} >= {"corrupt_json", "not_object", "missing_field", "wrong_type", "unknown_event"}
        for line, kind in cases:
            err = parse_line(line)
            assert isinstance(err, ParseError) and err.kind == kind, (line, err)


def test_write_run_files_names_files_by_graph_hash(tmp_path):
    runs = samples.graph_runs(2, 4)
    bad = samples.bad_lines(2, graph_id=runs[0].graph_id)
    paths = samples.write_run_files(tmp_path, runs, extra_lines={runs[0].graph_id: [ln for ln, _ in bad]})
    assert sorted(paths.values()) == list_event_files(tmp_path)
    for r in runs:
        assert os.path.basename(paths[r.graph_id]) == f"graph-events-{graph_events_hash(r.graph_id)}.ndjson"
        lines = poll_file(paths[r.graph_id], None).lines
        parsed = [parse_line(ln.data) for ln in lines]
        good = [p for p in parsed if not isinstance(p, ParseError)]
        assert good == r.events
        st = None
        for e in good:
            st = graph_state.apply(st, e, 60_000)
        assert graph_state.to_record(st)["phase"] == "complete" or r.expected["phase"] == "executing"
    first_lines = poll_file(paths[runs[0].graph_id], None).lines
    assert sum(isinstance(parse_line(ln.data), ParseError) for ln in first_lines) == len(bad)


def test_samples_and_state_survive_the_avro_wire_format():
    import pytest

    wire = pytest.importorskip("streams.contracts.wire")
    factory = wire.CodecFactory()
    events, states = factory.codec("graph_event"), factory.codec("graph_state")
    for run in samples.generate_graph_runs(5, count=4):
        st = None
        for e in run.events:
            decoded = events.decode(events.encode(e))
            assert decoded == e
            st = graph_state.apply(st, decoded, 60_000)
        rec = graph_state.to_record(graph_state.mark_stalled(st, st["updatedAt"] + 10**7, 60_000))
        assert states.decode(states.encode(rec)) == rec
