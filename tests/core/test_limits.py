"""Input limits and id rules (issue 12): every limit accepts a record exactly at it and rejects
one over it with a reason that names the limit and its setting; ids follow the id rules; an
accepted record's rows stay within a bound computed from the limits."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core import UserMemory, process_candidate, process_event
from streams.core.ingest import validate_candidate, validate_event, validate_turn
from streams.core.limits import (
    ID_CHARSET,
    QUOTE_CHARS,
    LimitExceeded,
    Limits,
    check_id,
    check_json_depth,
    is_valid_id,
    json_depth,
    quote,
    setting_name,
)
from streams.core.negotiator import handle_request, validate_request
from streams.graphs import state as graph_state
from streams.sessions import lifecycle
from streams.settings import Settings

from .factories import candidate, event, formed

SMALL = Limits(max_content_bytes=64, max_embedding_dims=4, max_extra_entries=2, max_extra_entry_bytes=10,
               max_id_chars=16, max_label_chars=6, max_text_bytes=32, max_negotiator_content_bytes=16,
               max_negotiator_memories=2, max_negotiator_forgotten=2, max_graph_nodes=2, max_graph_labels=1,
               max_shadowed_seqs=3, max_ledger_shadowed_seqs=5, max_error_chars=10)


def rejected(rej, code: str, setting: str | None = None) -> str:
    assert rej is not None, "expected a rejection"
    assert rej.code == code, (rej.code, rej.detail)
    assert rej.dead_letter
    if setting:
        assert setting in rej.detail
    assert len(rej.detail) < 300
    return rej.detail


# ------------------------------------------------------------------------ settings ----


def test_settings_build_the_limits_with_the_same_defaults():
    assert Settings().limits() == Limits()
    env = {"MEMSTREAM_MAX_CONTENT_BYTES": "100", "MEMSTREAM_MAX_ID_CHARS": "16"}
    lim = Settings.from_env(env).limits()
    assert lim.max_content_bytes == 100 and lim.max_id_chars == 16
    for name in Limits.names():  # every limit is a documented setting
        assert any(var == setting_name(name) and doc for var, _, doc in Settings.documentation()), name


# ------------------------------------------------------------------------ candidates ----


def test_content_bytes_at_the_limit_accepted_one_over_rejected_naming_the_setting():
    lim = Limits(max_content_bytes=16384)
    ok, rej = validate_candidate(candidate("a" * 16384), lim)
    assert rej is None and ok is not None
    _, rej = validate_candidate(candidate("a" * 16385), lim)
    assert rejected(rej, "limit.content_bytes") == "content is 16385 bytes; MEMSTREAM_MAX_CONTENT_BYTES is 16384"


def test_content_bytes_count_utf8_not_characters():
    _, rej = validate_candidate(candidate("é" * 33), SMALL)  # 66 bytes, 33 characters
    rejected(rej, "limit.content_bytes", "MEMSTREAM_MAX_CONTENT_BYTES is 64")
    assert validate_candidate(candidate("é" * 32), SMALL)[1] is None


def test_embedding_dimensions():
    assert validate_candidate(candidate(embedding=[0.1, 0.2, 0.3, 0.4]), SMALL)[1] is None
    _, rej = validate_candidate(candidate(embedding=[0.1] * 5), SMALL)
    rejected(rej, "limit.embedding_dims", "MEMSTREAM_MAX_EMBEDDING_DIMS is 4")
    # the default: 200,000 floats (the crash) are refused before they are read
    _, rej = validate_candidate(candidate(embedding=[0.5] * 200_000))
    assert rejected(rej, "limit.embedding_dims") == "embedding is 200000 dimensions; MEMSTREAM_MAX_EMBEDDING_DIMS is 4096"


def test_extra_entries_and_entry_bytes():
    assert validate_candidate(candidate(extra=["a: 1", "b: 2"]), SMALL)[1] is None
    _, rej = validate_candidate(candidate(extra=["a: 1", "b: 2", "c: 3"]), SMALL)
    rejected(rej, "limit.extra_entries", "MEMSTREAM_MAX_EXTRA_ENTRIES is 2")
    assert validate_candidate(candidate(extra=["x" * 10]), SMALL)[1] is None
    _, rej = validate_candidate(candidate(extra=["x" * 11]), SMALL)
    assert rejected(rej, "limit.extra_entry_bytes") == "extra[0] is 11 bytes; MEMSTREAM_MAX_EXTRA_ENTRY_BYTES is 10"


@pytest.mark.parametrize("field", ["kind", "frontmatter_type"])
def test_labels(field):
    assert validate_candidate(candidate(**{field: "x" * 6}), SMALL)[1] is None
    _, rej = validate_candidate(candidate(**{field: "x" * 7}), SMALL)
    rejected(rej, "limit.label_chars", "MEMSTREAM_MAX_LABEL_CHARS is 6")


@pytest.mark.parametrize("field", ["candidate_id", "motebit_id", "supersedes", "session_id"])
def test_candidate_ids_length(field):
    ok = candidate(**{field: "a" * 16})
    assert validate_candidate(ok, SMALL)[1] is None
    _, rej = validate_candidate(candidate(**{field: "a" * 17}), SMALL)
    assert rejected(rej, "limit.id_chars") == f"{field} {'a' * 17!r} is 17 characters; MEMSTREAM_MAX_ID_CHARS is 16"


@pytest.mark.parametrize("field", ["candidate_id", "motebit_id", "supersedes", "session_id"])
def test_candidate_ids_charset(field):
    _, rej = validate_candidate(candidate(**{field: "victim/x"}))
    detail = rejected(rej, "invalid_id")
    assert field in detail and "'/'" in detail and ID_CHARSET in detail


def test_a_huge_id_is_never_quoted_whole():
    _, rej = validate_candidate(candidate(motebit_id="v" * 400_000))
    detail = rejected(rej, "limit.id_chars", "MEMSTREAM_MAX_ID_CHARS is 128")
    assert len(detail) < 200
    _, rej = validate_candidate(candidate(sensitivity="s" * 100_000))
    assert rej.code == "invalid_sensitivity" and len(rej.detail) < 200


# ------------------------------------------------------------------------ events ----


def test_event_content_and_ids():
    lim = Limits(max_content_bytes=10)
    assert validate_event(formed("n1", "x" * 10), lim)[1] is None
    _, rej = validate_event(formed("n1", "x" * 11), lim)
    rejected(rej, "limit.content_bytes", "MEMSTREAM_MAX_CONTENT_BYTES is 10")
    for bad in (formed("a/b", "hello"), formed("n1", "hello", event_id="e/1"), formed("n1", "hello", motebit_id="u/1"),
                formed("n1", "hello", device_id="d 1"), formed("~n1", "hello")):
        _, rej = validate_event(bad)
        rejected(rej, "invalid_id")
    for et, payload in (("memory_accessed", {"node_id": "x" * 129}), ("memory_deleted", {"node_id": "x" * 129}),
                        ("memory_pinned", {"node_id": "x" * 129, "pinned": True}),
                        ("memory_consolidated", {"action": "merge", "existing_node_id": "x" * 129, "reason": ""})):
        _, rej = validate_event(event(et, payload))
        rejected(rej, "limit.id_chars", "MEMSTREAM_MAX_ID_CHARS is 128")


def test_event_free_text_and_audit_lists():
    ok = event("memory_consolidated", {"action": "merge", "reason": "r" * 32})
    assert validate_event(ok, SMALL)[1] is None
    _, rej = validate_event(event("memory_consolidated", {"action": "merge", "reason": "r" * 33}), SMALL)
    rejected(rej, "limit.text_bytes", "MEMSTREAM_MAX_TEXT_BYTES is 32")
    audit = {"missed_patterns": ["a", "b", "c"], "turn_message": "hi"}
    _, rej = validate_event(event("memory_audit", audit), SMALL)
    rejected(rej, "limit.extra_entries")


def test_turns():
    turn = {"turn_id": "t1", "motebit_id": "u1", "timestamp": 1, "user_message": "m" * 32,
            "agent_reply": None, "tagged_memories": []}
    assert validate_turn(turn, SMALL) is None
    rejected(validate_turn({**turn, "user_message": "m" * 33}, SMALL), "limit.text_bytes")
    rejected(validate_turn({**turn, "agent_reply": "m" * 33}, SMALL), "limit.text_bytes")
    rejected(validate_turn({**turn, "turn_id": "t/1"}, SMALL), "invalid_id")
    rejected(validate_turn({**turn, "tagged_memories": ["a", "b", "c"]}, SMALL), "limit.extra_entries")


def test_a_rejected_record_leaves_the_state_untouched():
    um = UserMemory("u1")
    out = process_candidate(um, candidate("x" * 65), limits=SMALL)
    assert [r.code for r in out.dead_letters] == ["limit.content_bytes"]
    assert len(um) == 0 and not out.node_upserts and not out.ledger
    out = process_event(um, formed("n1", "x" * 65), limits=SMALL)
    assert [r.code for r in out.dead_letters] == ["limit.content_bytes"] and len(um) == 0


# ------------------------------------------------------------------------ ids ----


@pytest.mark.parametrize("good", ["mb-ada", "u1", "ada@example.com", "urn:agent:42", "3f2a9c1e-7b7d-4c52-9a0e-1d2b3c4d5e6f",
                                  "01HZY3K9V8E2M4N6P7Q8R9S0T1", "a.b_c", "x" * 128])
def test_valid_ids(good):
    assert is_valid_id(good)


@pytest.mark.parametrize("bad", ["", "victim/x", "~seen/0", "a b", "a\nb", ".", "..", "-x", "é", "a%2Fb", "a?b", "a#b",
                                 "x" * 129, "a\x00"])
def test_invalid_ids(bad):
    assert not is_valid_id(bad)


def test_every_sample_record_is_within_the_default_limits():
    """The sample stream (`memstream generate`) and its ids still validate: no sample record is
    rejected for a limit or an id (its deliberately bad records fail for their own reasons)."""
    from streams.contracts import catalog
    from streams.tools import generate

    items = [i for i in generate.generate(seed=7, users=12) if isinstance(i.value, dict)]
    assert len(items) > 100
    for item in items:
        assert is_valid_id(item.key), item.key
        v = item.value
        if item.topic == catalog.MEMORY_CANDIDATES:
            rej = validate_candidate(v)[1]
        elif item.topic == catalog.MEMORY_EVENTS:
            rej = validate_event(v)[1]
        elif item.topic == catalog.MEMORY_TURNS:
            rej = validate_turn(v)
        elif item.topic == catalog.NEGOTIATOR_REQUESTS:
            rej = validate_request(v)
        elif item.topic == catalog.SESSION_EVENTS:
            _, vs = lifecycle.step(lifecycle.new_state(item.key), v)
            assert "event.over_limit" not in [x.rule for x in vs]
            continue
        else:
            try:
                graph_state.apply(None, v, None)
            except graph_state.GraphEventError as exc:
                assert not exc.code.startswith("limit.") and exc.code != "invalid_id"
            continue
        assert rej is None or not (rej.code.startswith("limit.") or rej.code == "invalid_id"), (item, rej)


@given(st.builds(lambda a, b: a + "/" + b, st.text(max_size=20), st.text(max_size=20)))
def test_any_id_with_a_slash_is_rejected(text):
    assert not is_valid_id(text)
    _, rej = validate_candidate(candidate(motebit_id=text))
    assert rej is not None and rej.code in ("invalid_id", "missing_motebit_id")


@given(st.text(max_size=2000))
def test_quote_is_bounded(text):
    assert len(quote(text)) <= QUOTE_CHARS + 40


def test_check_id_names_the_field():
    with pytest.raises(ValueError, match="motebit_id 'a/b' has '/' at position 1"):
        check_id("motebit_id", "a/b")


# ------------------------------------------------------------------------ row bounds ----

ID_CHARS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)


def node_row_bound(lim: Limits) -> int:
    """JSON (ensure_ascii: \\uXXXX escapes, 6 bytes per UTF-16 unit, 12 for an astral code point)
    of a node row: content ≤ 6·max_content_bytes; the embedding ≤ 25 bytes per float; ids and
    labels ≤ 6 bytes per character; fixed fields < 1 KB."""
    return (6 * lim.max_content_bytes + 25 * lim.max_embedding_dims + 8 * 6 * lim.max_id_chars
            + 3 * 6 * lim.max_label_chars + 1024)


@settings(max_examples=60, deadline=None)
@given(content=st.text(min_size=1, max_size=64).filter(lambda s: s.strip()),
       emb=st.none() | st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=4),
       cid=ID_CHARS, kind=st.none() | st.text(max_size=6), extra=st.lists(st.text(max_size=10), max_size=2))
def test_accepted_candidate_node_row_within_the_bound(content, emb, cid, kind, extra):
    um = UserMemory("u1")
    out = process_candidate(um, candidate(content, candidate_id=cid, embedding=emb, kind=kind, extra=extra,
                                          frontmatter_type=kind), limits=SMALL)
    for node in out.node_upserts:
        assert len(json.dumps(node)) <= node_row_bound(SMALL)
    for ev in out.ledger:
        assert len(json.dumps(ev)) <= node_row_bound(SMALL) + 1024


def test_default_node_row_bound_is_well_under_a_kafka_message():
    assert node_row_bound(Limits()) < 300_000  # the changelog message limit is ~1 MB


def test_worst_case_node_row_at_the_default_limits():
    lim = Limits()
    um = UserMemory("u" * 128)
    out = process_candidate(um, candidate("\x01" * lim.max_content_bytes, motebit_id="u" * 128, candidate_id="c" * 128,
                                          embedding=[-1.2345678901234567e-300] * lim.max_embedding_dims,
                                          kind="k" * 128, frontmatter_type="f" * 128, session_id="s" * 128))
    assert not out.dead_letters
    (node,) = out.node_upserts
    assert len(json.dumps(node)) <= node_row_bound(lim)


# ------------------------------------------------------------------------ negotiator ----


def req(op="remember", rid="r1", **kw):
    return {"request_id": rid, "user_id": "u1", "op": op, "kind": kw.pop("kind", "playbook"), "content": kw.pop("content", None),
            "sessionId": None, "memoryId": None, "description": None, "timestamp": 1, **kw}


def test_negotiator_content_bytes():
    state, reply = handle_request(None, req(content="c" * 16), True, SMALL)
    assert reply["error"] is None and reply["remembered"]["content"] == "c" * 16
    state, reply = handle_request(None, req(content="c" * 17), True, SMALL)
    assert reply["error"] == "limit.negotiator_content_bytes: content is 17 bytes; MEMSTREAM_MAX_NEGOTIATOR_CONTENT_BYTES is 16"
    assert not state["memories"]
    _, reply = handle_request(None, req("forget", description="d" * 17), True, SMALL)
    assert reply["error"].startswith("limit.negotiator_content_bytes: description is 17 bytes")


def test_negotiator_memories_per_user():
    state = None
    for i in range(2):
        state, reply = handle_request(state, req(rid=f"r{i}", content=f"rule {i}"), True, SMALL)
        assert reply["error"] is None
    state, reply = handle_request(state, req(rid="r2", content="rule 2"), True, SMALL)
    assert reply["error"].startswith("limit.negotiator_memories: 2 memories are stored; MEMSTREAM_MAX_NEGOTIATOR_MEMORIES is 2")
    assert len(state["memories"]) == 2
    # forgetting makes room
    state, reply = handle_request(state, req("forget", rid="f1", description="rule 0"), True, SMALL)
    assert reply["forget"]["status"] == "deleted"
    state, reply = handle_request(state, req(rid="r3", content="rule 3"), True, SMALL)
    assert reply["error"] is None and len(state["memories"]) == 2


def test_negotiator_forgotten_is_bounded():
    lim = Limits(max_negotiator_memories=100, max_negotiator_forgotten=3)
    state = None
    for i in range(10):
        state, _ = handle_request(state, {**req(rid=f"r{i}", content=f"rule number {i}"), "timestamp": i}, True, lim)
        state, reply = handle_request(state, {**req("forget", rid=f"f{i}", description=f"rule number {i}"), "timestamp": i},
                                      True, lim)
        assert reply["forget"]["status"] == "deleted"
    assert len(state["forgotten"]) == 3 and len(state["forgotten_fingerprints"]) == 3
    assert {v["forgotten_at"] for v in state["forgotten"].values()} == {7, 8, 9}


def test_negotiator_memo_is_bounded_by_refs():
    from streams.core import negotiator

    lim = Limits(max_negotiator_memories=100)
    state = None
    for i in range(100):
        state, _ = handle_request(state, req(rid=f"r{i}", content=f"common rule {i}"), True, lim)
    for i in range(100):  # every forget "common rule" is ambiguous: 100 refs each
        state, reply = handle_request(state, req("forget", rid=f"f{i}", description="common rule"), True, lim)
        assert reply["forget"]["status"] == "ambiguous"
    refs = sum(negotiator._memo_refs(b) for _, b in state["replies"])
    assert refs <= negotiator.REPLY_MEMO_REFS
    assert len(json.dumps(state)) < 600_000


def test_default_negotiator_row_bound():
    lim = Limits()
    state = None
    for i in range(lim.max_negotiator_memories):
        # '"' is the worst a rule may hold: 2 bytes of JSON each (control characters are refused)
        state, reply = handle_request(state, req(rid=f"r{i:03d}", content=f"{i:03d}" + '"' * (lim.max_negotiator_content_bytes - 3)),
                                      True, lim)
        assert reply["error"] is None
    assert len(json.dumps(state, ensure_ascii=False)) < 500_000
    _, reply = handle_request(None, req(content="rule\x01"), True, lim)
    assert reply["error"].startswith("invalid_content: content has the control character")


def test_negotiator_request_ids():
    assert validate_request(req()) is None
    rejected(validate_request(req(rid="r/1")), "invalid_id")
    rejected(validate_request({**req(), "user_id": "u" * 129}), "limit.id_chars", "MEMSTREAM_MAX_ID_CHARS")
    rejected(validate_request({**req(), "sessionId": "s 1"}), "invalid_id")
    rejected(validate_request({**req(), "memoryId": "m" * 129}), "limit.id_chars")


# ------------------------------------------------------------------------ sessions ----


def sev(seq, typ, data, sid="s1"):
    return {"sessionId": sid, "seq": seq, "type": typ, "ts": seq, "data": data}


def test_session_labels_and_seq_lists():
    lim = Limits(max_label_chars=20, max_shadowed_seqs=3)
    st0 = lifecycle.new_state("s1")
    ok, vs = lifecycle.step(st0, sev(0, "compaction/start", {"compactionId": "c" * 20, "turn": None}), lim)
    assert vs == []
    _, vs = lifecycle.step(st0, sev(0, "compaction/start", {"compactionId": "c" * 21, "turn": None}), lim)
    assert [v.rule for v in vs] == ["event.over_limit"]
    assert str(vs[0]) == ("event.over_limit: limit.label_chars: compactionId is 21 characters; "
                          "MEMSTREAM_MAX_LABEL_CHARS is 20")
    assert _["record"]["compactions"] == [] and _["record"]["lastSeq"] == 0
    summary = {"compactionId": "c" * 20, "shadowedSeqs": [1, 2, 3, 4], "shadowedRange": {"start": 1, "end": 4},
               "shadowedTokenCount": 10}
    _, vs = lifecycle.step(ok, sev(1, "compaction/summary", summary), lim)
    assert [v.rule for v in vs] == ["event.over_limit"] and "MEMSTREAM_MAX_SHADOWED_SEQS is 3" in vs[0].message


def test_session_id_rule():
    st0 = lifecycle.new_state("s/1")
    _, vs = lifecycle.step(st0, sev(0, "turn/start", {"turn": 1}, sid="s/1"))
    assert [v.rule for v in vs] == ["event.over_limit"] and "invalid_id" in vs[0].message


def test_session_ledger_keeps_at_most_the_shadowed_budget_and_cuts_errors():
    lim = Limits(max_ledger_shadowed_seqs=6, max_shadowed_seqs=3, max_error_chars=10)
    st_ = lifecycle.new_state("s1")
    seq = 0
    for k in range(5):
        cid = f"c{k}"
        for typ, data in (("compaction/start", {"compactionId": cid, "turn": None}),
                          ("compaction/summary", {"compactionId": cid, "shadowedSeqs": [1, 2, 3],
                                                  "shadowedRange": {"start": 1, "end": 3}, "shadowedTokenCount": 5}),
                          ("user/message", {"role": "user", "content": [], "surfaceOp": "replace", "sourceEventSeqs": [1, 2, 3]}),
                          ("compaction/end", {"compactionId": cid, "turn": None, "error": "boom" * 20})):
            st_, vs = lifecycle.step(st_, sev(seq, typ, data), lim)
            seq += 1
    comps = st_["record"]["compactions"]
    assert sum(len(c["shadowedSeqs"]) for c in comps) <= 6
    assert st_["internal"]["droppedCompactions"] == 5 - len(comps)
    assert all(len(c["error"]) < 80 and c["error"].startswith("boomboombo") for c in comps)


# ------------------------------------------------------------------------ graphs ----


def gev(event, **kw):
    return {"ts": kw.pop("ts", 1), "graphId": kw.pop("graphId", "g1"), "event": event, **kw}


def test_graph_nodes_and_labels():
    st_ = None
    for n in ("a", "b"):
        st_ = graph_state.apply(st_, gev("node_dispatched", nodeId=n), None, limits=SMALL)
    st_ = graph_state.apply(st_, gev("node_completed", nodeId="a", status="done", ts=2), None, limits=SMALL)  # known node
    with pytest.raises(graph_state.GraphEventError, match="MEMSTREAM_MAX_GRAPH_NODES is 2") as exc:
        graph_state.apply(st_, gev("node_dispatched", nodeId="c"), None, limits=SMALL)
    assert exc.value.code == "limit.graph_nodes"
    st_ = graph_state.apply(st_, gev("notification_degraded", status="slow"), None, limits=SMALL)
    with pytest.raises(graph_state.GraphEventError, match="MEMSTREAM_MAX_GRAPH_LABELS is 1"):
        graph_state.apply(st_, gev("notification_degraded", status="fast"), None, limits=SMALL)
    with pytest.raises(graph_state.GraphEventError, match="MEMSTREAM_MAX_LABEL_CHARS is 6"):
        graph_state.apply(st_, gev("node_dispatched", nodeId="b", agent="a" * 7), None, limits=SMALL)
    with pytest.raises(graph_state.GraphEventError, match="MEMSTREAM_MAX_ID_CHARS is 16"):
        graph_state.apply(st_, gev("phase_change", status="x"), None, event_id="e" * 17, limits=SMALL)


def test_graph_id_rule():
    with pytest.raises(graph_state.GraphEventError) as exc:
        graph_state.apply(None, gev("phase_change", status="executing", graphId="g/1"), None)
    assert exc.value.code == "invalid_id"


def test_default_graph_row_bound():
    lim = Limits()
    st_ = None
    for i in range(lim.max_graph_nodes):
        st_ = graph_state.apply(st_, gev("node_dispatched", nodeId=f"{i:04d}" + "n" * 124, agent="a" * 128,
                                         status="s" * 128, ts=i), None, event_id=f"{i:04d}" + "e" * 124, limits=lim)
    assert len(json.dumps(st_)) < 800_000


# ----------------------------------------------------------------------------- JSON nesting depth
def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\ab'), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json_values, st.sampled_from([None, 2]))
def test_json_depth_counts_the_nesting_a_parser_sees_and_skips_brackets_inside_strings(value, indent):
    text = json.dumps(value, indent=indent)
    assert json_depth(text) == _depth(value)


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_a_hostile_depth_is_refused_before_any_parser_recurses(depth):
    text = "[" * depth + "]" * depth
    with pytest.raises(LimitExceeded) as exc:
        check_json_depth("data.json", text, Limits())
    assert exc.value.code == "limit.json_depth"
    assert f"data.json is {depth} levels deep; MEMSTREAM_MAX_JSON_DEPTH is 64" in str(exc.value)


def test_the_json_depth_limit_is_inclusive_and_configurable():
    at = "[" * 64 + "]" * 64
    assert check_json_depth("x", at, Limits()) == at
    with pytest.raises(LimitExceeded):
        check_json_depth("x", "[" + at + "]", Limits())
    assert check_json_depth("x", "[" + at + "]", Limits(max_json_depth=65))
    with pytest.raises(LimitExceeded):
        check_json_depth("x", '{"a": {"b": 1}}', Limits(max_json_depth=1))
    flat = '{"s": "' + "[" * 5000 + '"}'  # brackets inside a string are not nesting
    assert check_json_depth("x", flat, Limits()) == flat


def test_a_session_event_with_deeply_nested_json_is_a_rule_violation_not_a_crash():
    from streams.sessions import lifecycle

    deep = "[" * 10_000 + "]" * 10_000
    event = {"sessionId": "s-1", "seq": 1, "type": "ui/nested", "ts": 1, "ignorable": True, "data": {"json": deep}}
    state, vs = lifecycle.step(None, event)
    assert [(v.rule, v.seq) for v in vs] == [("event.over_limit", 1)]
    assert "limit.json_depth" in vs[0].message and "MEMSTREAM_MAX_JSON_DEPTH is 64" in vs[0].message
    assert state["record"]["lastSeq"] == 1 and state["record"]["violationCount"] == 1  # tracked on
    ok = {**event, "seq": 2, "data": {"json": '{"a": ' + "[" * 63 + "]" * 63 + "}"}}  # 64 deep
    assert lifecycle.step(state, ok)[1] == []


def test_a_graph_log_line_with_deeply_nested_json_is_a_parse_error_not_a_crash():
    from streams.graphs import paths

    line = '{"a":' * 10_000 + "1" + "}" * 10_000
    err = paths.parse_line(line)
    assert isinstance(err, paths.ParseError) and err.kind == "limit.json_depth"
    assert "MEMSTREAM_MAX_JSON_DEPTH is 64" in str(err)
    assert isinstance(paths.parse_line(line, Limits(max_json_depth=10_001)), paths.ParseError)  # corrupt, still no crash


@pytest.mark.parametrize("depth", [0, 513])
def test_the_json_depth_setting_stays_below_the_parsers_recursion(depth):
    from streams.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=f"MEMSTREAM_MAX_JSON_DEPTH={depth} must be between 1 and 512"):
        Settings(max_json_depth=depth)
