"""Graph event-log naming and line parsing."""

import hashlib
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.graphs.paths import (
    FIELDS,
    ParseError,
    belongs_to_file,
    file_hash,
    graph_events_filename,
    graph_events_hash,
    graph_events_path,
    parse_line,
    to_line,
)


@pytest.mark.parametrize("gid", ["g-1", "g-2", "graph/with spaces & slashes", "émoji-\U0001F600", ""])
def test_hash_is_first_12_hex_of_sha256_of_utf8(gid):
    expected = hashlib.sha256(gid.encode("utf-8")).hexdigest()[:12]
    assert graph_events_hash(gid) == expected
    assert len(expected) == 12


def test_known_hash_value():
    # computed independently: printf 'g-1' | sha256sum
    assert graph_events_hash("g-1") == hashlib.sha256(b"g-1").hexdigest()[:12]
    assert graph_events_hash("g-1") != graph_events_hash("g-2")


def test_path_names_files_like_the_recorder(tmp_path):
    p = graph_events_path(tmp_path, "g-1")
    assert p == os.path.join(str(tmp_path), "graph-events-" + hashlib.sha256(b"g-1").hexdigest()[:12] + ".ndjson")
    assert os.path.basename(p) == graph_events_filename("g-1")
    # a file named that way is recognised and attributed to its graph
    with open(p, "w") as f:
        f.write(to_line({"ts": 1, "graphId": "g-1", "event": "phase_change", "status": "executing"}))
    (name,) = os.listdir(tmp_path)
    assert file_hash(name) == hashlib.sha256(b"g-1").hexdigest()[:12]
    assert belongs_to_file(p, "g-1") and not belongs_to_file(p, "g-2")
    assert file_hash("graph-events-xyz.ndjson") is None
    assert file_hash("graph-events-0123456789ab.ndjson.tmp") is None
    assert file_hash("notes.txt") is None


def test_parse_minimal_line_fills_omitted_optionals_with_none():
    ev = parse_line('{"ts":1767225600000,"graphId":"g-1","event":"phase_change","status":"executing"}\n')
    assert set(ev) == set(FIELDS)
    assert ev["ts"] == 1767225600000 and ev["graphId"] == "g-1" and ev["status"] == "executing"
    assert ev["nodeId"] is None and ev["budget"] is None and ev["startedAt"] is None


def test_parse_full_node_completed_line():
    line = json.dumps({"ts": 10, "graphId": "g", "nodeId": "n1", "event": "node_completed", "status": "completed",
                       "signalType": "answer", "agent": "coder", "startedAt": 3, "completedAt": 10})
    ev = parse_line(line.encode() + b"\r\n")
    assert (ev["nodeId"], ev["signalType"], ev["agent"], ev["startedAt"], ev["completedAt"]) == ("n1", "answer", "coder", 3, 10)


def test_budget_normalized():
    ev = parse_line(json.dumps({"ts": 1, "graphId": "g", "event": "budget_update",
                                "budget": {"sessionsSpawned": 2, "inputTokens": 100.0, "costUsd": 1, "extra": "x"}}))
    assert ev["budget"] == {"sessionsSpawned": 2, "inputTokens": 100, "outputTokens": 0, "costUsd": 1.0}


def test_integral_float_ts_and_explicit_nulls_accepted():
    ev = parse_line('{"ts":1.7e12,"graphId":"g","event":"notification_degraded","status":"stall","nodeId":null}')
    assert ev["ts"] == 1_700_000_000_000 and isinstance(ev["ts"], int)


@pytest.mark.parametrize("line,kind", [
    ("", "empty"),
    ("   \n", "empty"),
    (b"\xff\xfe{}", "encoding"),
    ('{"ts":1,"graphId":"g","event":"phase_ch', "corrupt_json"),
    ("NaNsense", "corrupt_json"),
    ("[1,2]", "not_object"),
    ('"string"', "not_object"),
    ('{"graphId":"g","event":"phase_change","status":"idle"}', "missing_field"),
    ('{"ts":1,"event":"phase_change","status":"idle"}', "missing_field"),
    ('{"ts":1,"graphId":"g"}', "missing_field"),
    ('{"ts":"1","graphId":"g","event":"phase_change","status":"idle"}', "wrong_type"),
    ('{"ts":1.5,"graphId":"g","event":"phase_change","status":"idle"}', "wrong_type"),
    ('{"ts":true,"graphId":"g","event":"phase_change","status":"idle"}', "wrong_type"),
    ('{"ts":1,"graphId":7,"event":"phase_change","status":"idle"}', "wrong_type"),
    ('{"ts":1,"graphId":"","event":"phase_change","status":"idle"}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":3}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":"node_dispatched","nodeId":5}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":"node_completed","nodeId":"n","completedAt":"soon"}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":"budget_update","budget":[1]}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":"budget_update","budget":{"inputTokens":"9"}}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":"budget_update","budget":{"costUsd":true}}', "wrong_type"),
    ('{"ts":1,"graphId":"g","event":"node_exploded"}', "unknown_event"),
    ('{"ts":1,"graphId":"g","event":"node_dispatched"}', "missing_field"),
    ('{"ts":1,"graphId":"g","event":"phase_change"}', "missing_field"),
    ('{"ts":1,"graphId":"g","event":"budget_update"}', "missing_field"),
])
def test_bad_lines_give_typed_errors(line, kind):
    err = parse_line(line)
    assert isinstance(err, ParseError), err
    assert err.kind == kind
    assert str(err).startswith(kind + ":")


_opt_str = st.one_of(st.none(), st.text(min_size=1, max_size=8))
_opt_int = st.one_of(st.none(), st.integers(0, 2**53))
_events = st.builds(
    lambda ts, gid, ev, node, status, sig, agent, sa, ca, budget: {
        "ts": ts, "graphId": gid, "event": ev,
        "nodeId": node if node is not None or ev not in ("node_dispatched", "node_completed") else "n",
        "status": status if status is not None or ev != "phase_change" else "executing",
        "signalType": sig, "agent": agent, "startedAt": sa, "completedAt": ca,
        "budget": budget if budget is not None or ev != "budget_update" else {"sessionsSpawned": 0, "inputTokens": 0, "outputTokens": 0, "costUsd": 0.0},
    },
    st.integers(0, 2**53), st.text(min_size=1, max_size=12),
    st.sampled_from(["node_dispatched", "node_completed", "phase_change", "budget_update", "notification_degraded"]),
    _opt_str, _opt_str, _opt_str, _opt_str, _opt_int, _opt_int,
    st.one_of(st.none(), st.fixed_dictionaries({"sessionsSpawned": st.integers(0, 99), "inputTokens": st.integers(0, 10**9),
                                                "outputTokens": st.integers(0, 10**9),
                                                "costUsd": st.floats(0, 1e6, allow_nan=False)})),
)


@given(_events)
def test_to_line_round_trips_and_omits_absent_fields(ev):
    line = to_line(ev)
    assert line.endswith("\n") and line.count("\n") == 1
    assert not any(v is None for v in json.loads(line).values())
    assert parse_line(line) == ev
