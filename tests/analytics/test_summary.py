"""Fleet-wide summary (streams/analytics/summary.py)."""

from __future__ import annotations

import json

import pytest

from streams.analytics import (
    HOUR,
    MINUTE,
    add,
    mark_published,
    merge_summaries,
    new_state,
    records_due,
    summarize,
    summarize_records,
)

T0 = 1_767_225_600_000
H = 3_600_000


def fleet():
    u1, u2, u3 = new_state("u1"), new_state("u2"), new_state("u3")
    add(u1, T0 + 1, {"formed": 3, "accessed": 1})
    add(u1, T0 + H + 1, {"deleted": 1})
    add(u2, T0 + 5, {"formed": 1, "dead_lettered": 2})
    add(u3, T0 + H, {"quarantined": 1})
    sess = new_state("session:s1")
    add(sess, T0 + 10, {"compaction_tokens_saved": 400})
    add(sess, T0 + H + 10, {"compaction_tokens_saved": -50})
    graph = new_state("graph:g1")
    add(graph, T0 + 20, {"graph_cost_usd": 0.1})
    add(graph, T0 + 30, {"graph_cost_usd": 0.2})
    unknown = new_state("(unknown):3")
    add(unknown, T0 + 40, {"dead_lettered": 1})
    add(u2, T0 - 10 * 24 * H, {"formed": 1})  # too late for both windows (clock is T0+5)
    return [u1, u2, u3, sess, graph, unknown]


def test_summary_totals_exact():
    s = summarize(fleet())
    assert s["window"] == HOUR and s["windows"] == 8
    assert s["totals"] == {"formed": 4, "accessed": 1, "deleted": 1, "merged": 0, "superseded": 0, "promoted": 0,
                           "redacted": 0, "quarantined": 1, "dead_lettered": 3, "compaction_tokens_saved": 350,
                           "graph_cost_usd": 0.3}
    assert s["subjects"] == {"user": 3, "session": 1, "graph": 1, "unknown": 1}
    assert s["by_kind"]["unknown"]["dead_lettered"] == 1 and s["by_kind"]["user"]["dead_lettered"] == 2
    assert s["by_kind"]["session"]["compaction_tokens_saved"] == 350
    assert [(p["window_start"], p["formed"], p["deleted"], p["compaction_tokens_saved"]) for p in s["series"]] == \
        [(T0, 4, 0, 400), (T0 + H, 0, 1, -50)]
    assert [(u["motebit_id"], u["events"]) for u in s["top_users"]] == [("u1", 5), ("u2", 3), ("u3", 1)]
    assert s["too_late"] == {MINUTE: 1, HOUR: 1} and s["clock"] == T0 + H + 10
    json.dumps(s)  # JSON-able for the HTTP API


def test_summary_range_and_minute_windows():
    s = summarize(fleet(), since_ms=T0 + H)
    assert s["totals"]["formed"] == 0 and s["totals"]["deleted"] == 1 and s["totals"]["quarantined"] == 1
    assert s["subjects"] == {"user": 2, "session": 1, "graph": 0, "unknown": 0}
    m = summarize(fleet(), window=MINUTE, until_ms=T0 + 60_000)
    assert m["totals"]["formed"] == 4 and m["totals"]["graph_cost_usd"] == 0.3 and m["windows"] == 5
    with pytest.raises(ValueError):
        summarize([], window="day")


def test_merge_of_per_worker_summaries_equals_the_whole():
    states = fleet()
    whole = summarize(states, top=2)
    parts = [summarize(states[:2], top=2), summarize(states[2:4], top=2), summarize(states[4:], top=2)]
    assert merge_summaries(parts, top=2) == whole
    assert [u["motebit_id"] for u in whole["top_users"]] == ["u1", "u2"]


def test_summary_from_published_records():
    states = fleet()
    records = []
    for st in states:
        pairs = records_due(st)
        records.extend(r for _, r in pairs)
        mark_published(st, [w for w, _ in pairs])
    add(states[0], T0 + 2, {"formed": 1})  # a later update: its record supersedes the first one
    records.extend(r for _, r in records_due(states[0]))
    from_records = summarize_records(records)
    from_states = summarize(states)
    for k in ("totals", "subjects", "by_kind", "series", "top_users", "windows"):
        assert from_records[k] == from_states[k]
    assert from_records["totals"]["formed"] == 5
