"""A subject whose analytics row cannot be read or counted into is contained, not the worker
(streams/agents/analytics.py, `Contained`): its increments are refused as `contained`, its row is
left exactly as stored and not published, every other subject is counted and published, an
erasure deletes the row, a rebalance forgets. Without a broker: the real agent code on the fake
runtime of tests/analytics/test_writers.py, whose table stores JSON text as RocksDB stores bytes.
(A real worker with a garbled changelog row: tests/system/test_poison_kafka.py.)

And `windows.state_problem`, the check behind it: a state it passes is one every function of the
module can use (property test over garbled copies of real states)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.agents import analytics as analytics_agent
from streams.analytics import Increment, add, expire, new_state, records_due, state_problem, summarize
from streams.runtime import checkpoint
from tests.analytics.test_writers import (
    NOW,
    Event,
    FakeRuntime,
    SerializedTable,
    formed,
    latest_published,
    minute_count,
)

GARBLED = {  # stored rows that are not a state of "u1", each as a real row could be garbled
    "a list": [1, 2],
    "windows a list": {**new_state("u1"), "windows": []},
    "a counter as text": {**new_state("u1"), "windows": {
        f"minute/{NOW}": {"window": "minute", "start": NOW, "end": NOW + 60_000, "counters": {"formed": "3"},
                          "updated_at": NOW, "rev": 1, "published": 0}}},
    "no subject": {k: v for k, v in new_state("u1").items() if k != "subject"},
    "another subject's": new_state("u9"),
}


def _run(scenario) -> None:
    asyncio.run(scenario())


@pytest.mark.parametrize("garble", [*GARBLED, "not JSON"])
def test_a_garbled_row_contains_its_subject_and_every_other_subject_is_counted_and_published(garble):
    table = SerializedTable()
    table.rows["u1"] = "{not json" if garble == "not JSON" else json.dumps(GARBLED[garble])
    stored = table.rows["u1"]

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        await rt.batch(0, 1, [formed(1), formed(2, subject="u2"), formed(3)])
        await rt.batch(0, 2, [formed(4)])  # contained: not even read again
        assert table.rows["u1"] == stored  # left exactly as stored
        assert minute_count(table, "u2") == 1
        assert rt.counts == {"analytics_refused:contained": 3}
        assert rt.gauges == {"analytics_subjects_contained": 1}
        if garble == "not JSON":
            return  # the tick reads RocksDB's bytes itself (state_scan): tests/system/test_poison_kafka.py
        await rt.tick(0, 10)  # the publish tick goes on past it
        assert latest_published(rt, "u2")[("minute", NOW)]["formed"] == 1
        assert latest_published(rt, "u1") == {} and table.rows["u1"] == stored

    _run(scenario)


def test_an_erasure_deletes_a_contained_row_and_the_subject_counts_again():
    table = SerializedTable()
    table.rows["u1"] = "{not json"

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        await rt.batch(0, 1, [formed(1)])
        assert rt.gauges == {"analytics_subjects_contained": 1}

        async def erase(cp, _ev) -> bool:
            rt.feed_analytics(cp, [formed(2)])  # fed before the erasure in the same batch: erased too
            for hook in rt.hooks:
                hook.erase(cp, "u1")
            return True

        await checkpoint.run_batch([Event(0, 2)], erase, sink=rt)
        assert "u1" not in table.rows and rt.gauges == {"analytics_subjects_contained": 0}
        await rt.batch(0, 3, [formed(3)])
        assert minute_count(table) == 1

    _run(scenario)


def test_a_rebalance_forgets_what_was_contained_and_a_repaired_row_counts_again():
    table = SerializedTable()
    table.rows["u1"] = json.dumps([1, 2])

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        await rt.batch(0, 1, [formed(1)])
        assert rt.counts == {"analytics_refused:contained": 1}
        table.rows["u1"] = json.dumps(new_state("u1"))  # repaired (a tombstone, a restore) while contained
        await rt.batch(0, 2, [formed(2)])
        assert minute_count(table) == 0  # still contained until partitions move
        for handler in rt.rebalance_handlers:
            await handler(None, set())
        assert rt.gauges["analytics_subjects_contained"] == 0
        await rt.batch(0, 3, [formed(3)])
        assert minute_count(table) == 1

    _run(scenario)


def test_a_failure_that_is_not_the_rows_still_fails_the_batch():
    """A readable state and an increment the windows refuse (an unknown counter: a bug of a
    classifier): not contained — the batch fails, as every unexpected failure of a batch does."""
    table = SerializedTable()

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        await rt.batch(0, 1, [formed(1)])
        with pytest.raises(ValueError, match="unknown analytics counter"):
            await rt.batch(0, 2, [Increment("u1", NOW + 1_000, {"bogus": 1}, "ledger:x")])
        assert rt.gauges.get("analytics_subjects_contained", 0) == 0 and minute_count(table) == 1

    _run(scenario)


# ------------------------------------------------------------------------------ state_problem
def _real_state(n: int) -> dict:
    s = new_state("u1")
    for i in range(n):
        add(s, NOW + i * 50_000, {"formed": 1, "accessed": i % 3}, id=f"e{i}")
    return json.loads(json.dumps(s))  # as stored


_GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3), st.floats(allow_nan=False),
                     st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def _paths(value, path=()):
    """Every place in a JSON value (a key path), the value itself included."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _garbled(state: dict, path: tuple, garbage, drop: bool):
    if not path:
        return garbage
    out = copy.deepcopy(state)
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    if drop and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = garbage
    return out


def _uses(state) -> None:
    """What the agent and the HTTP views do with a stored state."""
    s = copy.deepcopy(state)
    add(s, NOW + 10 * 60_000, {"formed": 1}, id="next")
    records_due(s)
    expire(s, NOW + 3 * 86_400_000)
    summarize([copy.deepcopy(state)], window="minute")


@settings(max_examples=400, deadline=None)
@given(n=st.integers(0, 4), pick=st.integers(0, 10_000), garbage=_GARBAGE, drop=st.booleans())
def test_a_state_that_state_problem_passes_is_one_every_function_can_use(n, pick, garbage, drop):
    state = _real_state(n)
    assert state_problem(state) is None
    _uses(state)
    paths = list(_paths(state))
    garbled = _garbled(state, paths[pick % len(paths)], garbage, drop)
    if state_problem(garbled) is None:
        _uses(garbled)  # passed: must not raise
    else:
        assert isinstance(state_problem(garbled), str)


def test_state_problem_names_what_is_wrong():
    assert state_problem([1]) == "not an object but list"
    assert state_problem({**new_state("u1"), "windows": []}) == "'windows' is not an object"
    assert "no 'subject'" == state_problem({k: v for k, v in new_state("u1").items() if k != "subject"})
    s = _real_state(2)
    w = next(iter(s["windows"]))
    s["windows"][w]["end"] += 1
    assert state_problem(s) == f"window {w!r}: 'end' is not 'start' plus the window's size"
