"""Event-time windows (streams/analytics/windows.py): assignment, lateness, expiry,
idempotent publication, determinism across replays and JSON round trips (recovered tables)."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.analytics import (
    HOUR,
    MINUTE,
    TOO_EARLY,
    TOO_LATE,
    WindowPolicy,
    add,
    due,
    expire,
    is_expired,
    is_idle,
    mark_published,
    new_state,
    partition_clock,
    records_due,
    to_record,
    window_bounds,
    window_identity,
    windows_of,
)
from streams.analytics.windows import DAY_MS, HOUR_MS, MINUTE_MS

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a multiple of one hour


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


def counts(state: dict, size: str) -> dict[int, dict[str, int]]:
    return {w["start"]: w["counters"] for w in windows_of(state, size)}


class Topic:
    """The latest record of each window (`window_identity`: what a consumer of the compacted topic
    de-duplicates on) wins."""

    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}
        self.sent: list[dict] = []

    def sweep(self, state: dict, clock_ms: int | None = None, policy: WindowPolicy = WindowPolicy()) -> list[dict]:
        pairs = records_due(state, policy=policy)
        for _, rec in pairs:
            self.latest[window_identity(rec)] = rec
            self.sent.append(rec)
        mark_published(state, [w for w, _ in pairs])
        return expire(state, clock_ms, policy=policy)

    def total(self, size: str, field: str) -> int:
        return sum(r[field] for r in self.latest.values() if r["window"] == size)


# ------------------------------------------------------------------------------ assignment --


def test_generated_data_known_counts_per_window():
    """600 generated events over 3 hours, shuffled: every minute and hour window holds exactly
    the events whose time falls in it (nothing is late: the lateness covers the whole span)."""
    rnd = random.Random(7)
    names = ["formed", "accessed", "deleted", "merged", "promoted"]
    events = [(T0 + rnd.randrange(3 * HOUR_MS), rnd.choice(names)) for _ in range(600)]
    expected_min: dict[int, Counter] = defaultdict(Counter)
    expected_hour: dict[int, Counter] = defaultdict(Counter)
    for t, name in events:
        expected_min[t - t % MINUTE_MS][name] += 1
        expected_hour[t - t % HOUR_MS][name] += 1
    rnd.shuffle(events)
    policy = WindowPolicy(minute_lateness_ms=3 * HOUR_MS, hour_lateness_ms=2 * DAY_MS)
    s = new_state("u1")
    for i, (t, name) in enumerate(events):
        assert add(s, t, {name: 1}, id=f"e{i}", policy=policy).refused == []
    assert counts(s, MINUTE) == {k: dict(v) for k, v in expected_min.items()}
    assert counts(s, HOUR) == {k: dict(v) for k, v in expected_hour.items()}
    assert sorted(counts(s, HOUR)) == [T0, T0 + HOUR_MS, T0 + 2 * HOUR_MS]
    assert sum(sum(c.values()) for c in counts(s, HOUR).values()) == 600
    assert s["clock"] == max(t for t, _ in events)


def test_hand_computed_windows():
    s = new_state("u1")
    add(s, T0 + 5_000, {"formed": 1})
    add(s, T0 + 59_999, {"formed": 1, "accessed": 2})
    add(s, T0 + 61_000, {"deleted": 1})
    add(s, T0 + HOUR_MS + 1, {"promoted": 1, "compaction_tokens_saved": 120, "graph_cost_usd": 0.125})
    assert counts(s, MINUTE) == {
        T0: {"formed": 2, "accessed": 2},
        T0 + MINUTE_MS: {"deleted": 1},
        T0 + HOUR_MS: {"promoted": 1, "compaction_tokens_saved": 120, "graph_cost_nanousd": 125_000_000},
    }
    assert counts(s, HOUR) == {
        T0: {"formed": 2, "accessed": 2, "deleted": 1},
        T0 + HOUR_MS: {"promoted": 1, "compaction_tokens_saved": 120, "graph_cost_nanousd": 125_000_000},
    }
    m0 = windows_of(s, MINUTE)[0]
    assert (m0["start"], m0["end"], m0["updated_at"]) == (T0, T0 + MINUTE_MS, T0 + 59_999)


@pytest.mark.parametrize("t, minute, hour", [
    (T0, T0, T0),
    (T0 + MINUTE_MS - 1, T0, T0),
    (T0 + MINUTE_MS, T0 + MINUTE_MS, T0),           # exactly on a minute boundary: the next minute
    (T0 + HOUR_MS - 1, T0 + HOUR_MS - MINUTE_MS, T0),
    (T0 + HOUR_MS, T0 + HOUR_MS, T0 + HOUR_MS),     # exactly on an hour boundary: the next hour
    (0, 0, 0),
    (-1, -MINUTE_MS, -HOUR_MS),                     # floor, not truncation
])
def test_boundary_goes_to_the_next_window(t, minute, hour):
    assert window_bounds(t, MINUTE) == (minute, minute + MINUTE_MS)
    assert window_bounds(t, HOUR) == (hour, hour + HOUR_MS)
    s = new_state("u1")
    result = add(s, t, {"formed": 1})
    assert result.counted == [(MINUTE, minute), (HOUR, hour)]
    assert s["windows"][f"minute/{minute}"]["end"] == minute + MINUTE_MS


# ------------------------------------------------------------------ late and out of order --


def test_late_and_out_of_order_events_land_in_their_own_window():
    policy = WindowPolicy(minute_lateness_ms=2 * HOUR_MS, hour_lateness_ms=2 * DAY_MS)
    s = new_state("u1")
    add(s, T0 + 10 * MINUTE_MS + 5, {"formed": 1}, policy=policy)   # 00:10
    add(s, T0 + 1 * MINUTE_MS + 5, {"formed": 1}, policy=policy)    # 00:01, out of order
    add(s, T0 + 2 * HOUR_MS, {"accessed": 1}, policy=policy)        # 02:00: clock moves on
    r = add(s, T0 + 30 * MINUTE_MS, {"formed": 1}, policy=policy)   # 00:30, 1 h 30 late: still open
    assert r.refused == [] and r.counted == [(MINUTE, T0 + 30 * MINUTE_MS), (HOUR, T0)]
    assert counts(s, MINUTE) == {
        T0 + MINUTE_MS: {"formed": 1}, T0 + 10 * MINUTE_MS: {"formed": 1},
        T0 + 30 * MINUTE_MS: {"formed": 1}, T0 + 2 * HOUR_MS: {"accessed": 1},
    }
    assert counts(s, HOUR) == {T0: {"formed": 3}, T0 + 2 * HOUR_MS: {"accessed": 1}}
    assert s["clock"] == T0 + 2 * HOUR_MS


def test_too_late_events_are_reported_not_lost():
    policy = WindowPolicy(minute_lateness_ms=2 * HOUR_MS, hour_lateness_ms=2 * DAY_MS)
    s = new_state("u1")
    add(s, T0 + 2 * HOUR_MS + MINUTE_MS, {"formed": 1}, policy=policy)   # clock 02:01
    # minute [00:00, 00:01) ends 00:01; + 2 h lateness = 02:01 <= clock: expired. hour 00:00 is not.
    r = add(s, T0 + 30_000, {"merged": 1}, id="late-1", policy=policy)
    assert r.counted == [(HOUR, T0)]
    assert len(r.too_late) == 1
    late = r.too_late[0]
    assert (late.subject, late.reason, late.window, late.window_start, late.window_end) == \
        ("u1", TOO_LATE, MINUTE, T0, T0 + MINUTE_MS)
    assert (late.event_time_ms, dict(late.counters), late.id, late.clock_ms) == \
        (T0 + 30_000, {"merged": 1}, "late-1", T0 + 2 * HOUR_MS + MINUTE_MS)
    assert s["too_late"] == {MINUTE: 1, HOUR: 0}
    assert f"minute/{T0}" not in s["windows"]
    assert counts(s, HOUR) == {T0: {"merged": 1}, T0 + 2 * HOUR_MS: {"formed": 1}}
    # one ms newer: its minute window [00:01, 00:02) ends at 00:02 > 02:01 - 2 h: still open
    r = add(s, T0 + MINUTE_MS, {"merged": 1}, policy=policy)
    assert r.refused == [] and counts(s, MINUTE)[T0 + MINUTE_MS] == {"merged": 1}
    # 2 days + later: the hour window has expired too
    add(s, T0 + 2 * DAY_MS + HOUR_MS, {"formed": 1}, policy=policy)
    r = add(s, T0 + 5, {"formed": 1}, policy=policy)
    assert r.counted == [] and [x.window for x in r.refused] == [MINUTE, HOUR]
    assert s["too_late"] == {MINUTE: 2, HOUR: 1}


def test_too_early_guard_keeps_a_bogus_clock_out():
    s = new_state("u1")
    now = T0 + HOUR_MS
    r = add(s, T0 + 100 * 365 * DAY_MS, {"formed": 1}, now_ms=now)
    assert [x.reason for x in r.refused] == [TOO_EARLY] and r.refused[0].window is None
    assert s["clock"] is None and s["too_early"] == 1 and s["windows"] == {}
    assert add(s, now + DAY_MS, {"formed": 1}, now_ms=now).counted  # within max_future_ms
    assert add(s, T0, {"formed": 1}).counted  # without now_ms there is no guard


# ---------------------------------------------------------------- publication and expiry --


def test_due_publishes_full_aggregates_and_republishes_only_changes():
    s = new_state("u1")
    add(s, T0 + 1, {"formed": 1})
    add(s, T0 + 2, {"formed": 1})
    first = records_due(s)
    assert [(r["window"], r["window_start"], r["formed"]) for _, r in first] == [(MINUTE, T0, 2), (HOUR, T0, 2)]
    assert records_due(s) == first  # not marked yet (e.g. a crash before the table write): same records
    mark_published(s, [w for w, _ in first])
    assert due(s) == []
    add(s, T0 + HOUR_MS - 1, {"formed": 1})
    again = records_due(s)
    assert [(r["window"], r["window_start"], r["formed"]) for _, r in again] == \
        [(HOUR, T0, 3), (MINUTE, T0 + HOUR_MS - MINUTE_MS, 1)]  # the hour record is the full count


def test_update_between_due_and_mark_stays_due():
    s = new_state("u1")
    add(s, T0, {"formed": 1})
    snaps = due(s)
    add(s, T0 + 1, {"formed": 1})  # another agent counted while the records were being sent
    mark_published(s, snaps)
    assert [(w["window"], w["counters"]) for w in due(s)] == [(MINUTE, {"formed": 2}), (HOUR, {"formed": 2})]


def test_expire_drops_only_published_expired_windows():
    policy = WindowPolicy(minute_lateness_ms=10 * MINUTE_MS, hour_lateness_ms=HOUR_MS)
    s = new_state("u1")
    add(s, T0, {"formed": 1}, policy=policy)
    add(s, T0 + 11 * MINUTE_MS, {"formed": 1}, policy=policy)  # minute T0 expired (end + 10 min <= clock)
    assert expire(s, policy=policy) == []                        # ... but not published yet: kept
    assert f"minute/{T0}" in s["windows"]
    assert [(w["window"], w["start"]) for w in due(s, final_only=True, policy=policy)] == [(MINUTE, T0)]
    topic = Topic()
    dropped = topic.sweep(s, policy=policy)
    assert [(w["window"], w["start"], w["counters"]) for w in dropped] == [(MINUTE, T0, {"formed": 1})]
    assert sorted(s["windows"]) == [f"hour/{T0}", f"minute/{T0 + 11 * MINUTE_MS}"]
    # a late event for the dropped window is refused, never re-creates it with a partial count
    r = add(s, T0 + 1, {"formed": 1}, policy=policy)
    assert [x.window for x in r.too_late] == [MINUTE] and f"minute/{T0}" not in s["windows"]
    assert topic.latest[("u1", MINUTE, T0)]["formed"] == 1
    # the partition clock expires an idle subject's windows; the hour window got the late
    # event, so it is published (full count) before it is dropped
    assert [(w["window"], w["counters"]) for w in due(s)] == [(HOUR, {"formed": 3})]
    assert expire(s, T0 + 3 * HOUR_MS, policy=policy) == [
        {"window": MINUTE, "start": T0 + 11 * MINUTE_MS, "end": T0 + 12 * MINUTE_MS,
         "counters": {"formed": 1}, "updated_at": T0 + 11 * MINUTE_MS, "rev": 1, "published": 1}]
    assert sorted(s["windows"]) == [f"hour/{T0}"]
    dropped = topic.sweep(s, policy=policy)
    assert [(w["window"], w["start"]) for w in dropped] == [(HOUR, T0)]
    assert is_idle(s) and s["clock"] == T0 + 3 * HOUR_MS and s["recent_ids"] == []
    assert topic.latest[("u1", HOUR, T0)]["formed"] == 3
    assert topic.total(MINUTE, "formed") == 2 and topic.total(HOUR, "formed") == 3


def test_a_window_expires_once_its_end_is_at_the_watermark_and_partition_clock():
    """Per size, the watermark is clock - lateness: a window ending at or before it is expired."""
    policy = WindowPolicy(minute_lateness_ms=5, hour_lateness_ms=7)
    s = new_state("a")
    assert s["clock"] is None and not is_expired(MINUTE, 0, s["clock"], policy)  # no clock yet
    add(s, 1000, {"formed": 1}, policy=policy)
    assert s["clock"] == 1000
    for size, length, watermark in ((MINUTE, MINUTE_MS, 995), (HOUR, HOUR_MS, 993)):
        assert is_expired(size, watermark - length, s["clock"], policy)  # ends at the watermark
        assert not is_expired(size, watermark + 1 - length, s["clock"], policy)  # one ms later: open
        assert not is_expired(size, watermark + 1000 - length, s["clock"], policy)
        assert is_expired(size, watermark + 1000 - length, 2000, policy)  # a later clock moves it
    b = new_state("b", clock_ms=5000)
    assert partition_clock([s, b, None, new_state("c")]) == 5000
    assert partition_clock([]) is None


def test_duplicates_by_id_are_skipped():
    s = new_state("u1")
    assert add(s, T0, {"formed": 1}, id="x").counted
    r = add(s, T0, {"formed": 1}, id="x")
    assert r.duplicate and not r.counted and s["duplicates"] == 1
    assert counts(s, HOUR) == {T0: {"formed": 1}}
    assert add(s, T0, {"formed": 1}).counted  # no id: no de-duplication
    assert counts(s, HOUR) == {T0: {"formed": 2}}


def test_recent_ids_are_bounded():
    policy = WindowPolicy(recent_ids=3)
    s = new_state("u1")
    for i in range(5):
        add(s, T0 + i, {"formed": 1}, id=f"i{i}", policy=policy)
    assert len(s["recent_ids"]) == 3
    assert add(s, T0 + 4, {"formed": 1}, id="i4", policy=policy).duplicate
    assert add(s, T0, {"formed": 1}, id="i0", policy=policy).counted  # forgotten: beyond the bound


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "add", "json", "copy", "expire"]), st.integers(0, 9),
                          st.integers(0, 3 * HOUR_MS)), max_size=60), st.integers(1, 6))
def test_duplicates_are_found_as_a_scan_of_the_persisted_ids_would(ops, keep):
    """`recent_ids` indexes its digests (windows.RecentIds); the decisions, and the list as it is
    persisted, are those of scanning the plain list, across JSON round trips, copies and expiry."""
    policy = WindowPolicy(recent_ids=keep)
    s = new_state("u1")
    for op, n, t in ops:
        if op == "json":
            s = json.loads(json.dumps(s))
            continue
        if op == "copy":
            s = copy.deepcopy(s)
            continue
        if op == "expire":
            expire(s, T0 + t, policy=policy)
            continue
        persisted = [entry[0] for entry in json.loads(json.dumps(s["recent_ids"]))]
        expected_duplicate = windows_digest(f"id{n}") in persisted
        before = json.loads(json.dumps(s["recent_ids"]))
        r = add(s, T0 + t, {"formed": 1}, id=f"id{n}", policy=policy)
        assert r.duplicate == expected_duplicate
        if not r.duplicate and r.counted:
            assert json.loads(json.dumps(s["recent_ids"])) == (before + [[windows_digest(f"id{n}"), T0 + t]])[-keep:]
        assert len(s["recent_ids"]) <= keep


def test_a_garbled_recent_id_never_matches_and_is_dropped_in_turn():
    """A persisted entry whose digest is not a str (a garbled row) never matched the scan; it
    does not match the index either, nor stop the state from counting."""
    policy = WindowPolicy(recent_ids=2)
    s = new_state("u1")
    s["recent_ids"] = [[["not", "a", "digest"], T0], [{"x": 1}, T0]]
    assert add(s, T0, {"formed": 1}, id="a", policy=policy).counted
    assert add(s, T0, {"formed": 1}, id="a", policy=policy).duplicate
    assert add(s, T0 + 1, {"formed": 1}, id="b", policy=policy).counted
    assert [entry[0] for entry in s["recent_ids"]] == [windows_digest("a"), windows_digest("b")]


def windows_digest(id_: str) -> str:
    from streams.analytics.windows import _digest
    return _digest(id_)


def test_zero_and_invalid_counters():
    s = new_state("u1")
    assert add(s, T0, {"formed": 0}).counted == [] and s["clock"] is None and s["windows"] == {}
    assert add(s, T0, {"compaction_tokens_saved": -40}).counted  # signed amounts are allowed
    before = json.dumps(s)
    for bad in ({"nope": 1}, {"formed": 1.5}, {"formed": True}, {"graph_cost_usd": float("nan")}):
        with pytest.raises(ValueError):
            add(s, T0, bad)
    with pytest.raises(ValueError):
        add(s, "soon", {"formed": 1})
    assert json.dumps(s) == before  # validation happens before any change
    with pytest.raises(ValueError):
        WindowPolicy(minute_lateness_ms=-1)


# ---------------------------------------------------------------------------- records --


def test_record_matches_the_schema_and_encodes():
    from streams.contracts.wire import CodecFactory

    s = new_state("u1")
    add(s, T0 + 10, {"formed": 2, "accessed": 1, "deleted": 1, "merged": 1, "superseded": 1, "promoted": 1,
                     "redacted": 1, "quarantined": 1, "dead_lettered": 3, "compaction_tokens_saved": 512,
                     "graph_cost_usd": 1.5})
    rec = to_record("u1", windows_of(s, HOUR)[0])
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "analytics_window.avsc").read_text())
    assert list(rec) == [f["name"] for f in schema["fields"]]
    assert rec == {"motebit_id": "u1", "window": "hour", "window_start": T0, "window_end": T0 + HOUR_MS,
                   "formed": 2, "accessed": 1, "deleted": 1, "merged": 1, "superseded": 1, "promoted": 1,
                   "redacted": 1, "quarantined": 1, "dead_lettered": 3, "compaction_tokens_saved": 512,
                   "graph_cost_usd": 1.5, "updated_at": T0 + 10}
    codec = CodecFactory.from_url("").codec("analytics_window")
    data = codec.encode(rec)
    assert data[:2] == b"\xc3\x01"
    assert codec.decode(data) == rec


def test_window_identity():
    rec = {"motebit_id": "a/b", "window": HOUR, "window_start": T0}
    assert window_identity(rec) == ("a/b", HOUR, T0)
    assert window_identity({**rec, "window_start": float(T0)}) == ("a/b", HOUR, T0)


# ---------------------------------------------------------------------------- determinism --


def _run(events, *, restart_every: int | None, sweep_every: int, policy: WindowPolicy):
    """Process events with periodic sweeps; optionally 'restart' (JSON round trip of the table,
    i.e. recovery from its changelog) every few events. Returns (records sent, final state)."""
    topic = Topic()
    s = new_state("u1")
    for i, (t, name, eid) in enumerate(events):
        add(s, t, {name: 1}, id=eid, policy=policy)
        if restart_every and i % restart_every == 0:
            s = roundtrip(s)
        if i % sweep_every == 0:
            topic.sweep(s, policy=policy)
            if restart_every:
                s = roundtrip(s)
    topic.sweep(s, policy=policy)
    return topic.sent, s


def test_replay_and_recovery_give_identical_records():
    rnd = random.Random(11)
    policy = WindowPolicy(minute_lateness_ms=5 * MINUTE_MS, hour_lateness_ms=HOUR_MS)
    events = []
    t = T0
    for i in range(400):
        t += rnd.randrange(0, 40_000)
        jitter = rnd.choice([0, 0, 0, -rnd.randrange(0, 20 * MINUTE_MS)])  # some late, some too late
        events.append((t + jitter, rnd.choice(["formed", "accessed"]), f"e{i}"))
    plain = _run(events, restart_every=None, sweep_every=7, policy=policy)
    again = _run(events, restart_every=None, sweep_every=7, policy=policy)
    recovered = _run(events, restart_every=3, sweep_every=7, policy=policy)
    assert plain == again
    assert plain[0] == recovered[0] and plain[1] == roundtrip(recovered[1])
    assert plain[1]["too_late"][MINUTE] > 0  # the data did exercise lateness


def test_recovered_state_publishes_and_expires_like_the_original():
    policy = WindowPolicy(minute_lateness_ms=MINUTE_MS, hour_lateness_ms=HOUR_MS)
    s = new_state("u1")
    for i in range(0, 50):
        add(s, T0 + i * 17_000, {"formed": 1}, id=f"e{i}", policy=policy)
    mark_published(s, due(s)[:5])
    r = roundtrip(s)
    assert r == s
    assert due(r, policy=policy) == due(s, policy=policy)
    clock = T0 + 3 * HOUR_MS
    Topic().sweep(s, clock, policy)
    Topic().sweep(r, clock, policy)
    assert r == s and is_idle(s)


# ------------------------------------------------------------------------------ properties --

items = st.lists(
    st.tuples(st.integers(0, 4 * HOUR_MS), st.sampled_from(["formed", "merged", "dead_lettered"]),
              st.integers(1, 3)),
    min_size=1, max_size=60,
)
policies = st.builds(WindowPolicy, minute_lateness_ms=st.sampled_from([0, MINUTE_MS, 30 * MINUTE_MS]),
                     hour_lateness_ms=st.sampled_from([0, HOUR_MS, 3 * HOUR_MS]))


@settings(max_examples=200, deadline=None)
@given(items=items, order=st.randoms(use_true_random=False), policy=policies,
       sweeps=st.lists(st.booleans(), min_size=60, max_size=60), data=st.data())
def test_sum_over_windows_equals_inputs_not_too_late(items, order, policy, sweeps, data):
    """For any arrival order, with sweeps (publish + expire) and recoveries at any point: the
    sum over the compacted topic's windows of a counter equals the inputs that were not too
    late for that window size, and each window holds exactly those inputs (oracle: an input is
    too late iff its window ended at least `lateness` before the greatest event time so far)."""
    arrivals = [(T0 + t, name, n, f"id{i}") for i, (t, name, n) in enumerate(items)]
    order.shuffle(arrivals)
    topic = Topic()
    s = new_state("u1")
    reported = Counter()
    clock = None
    oracle: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for i, (t, name, n, eid) in enumerate(arrivals):
        r = add(s, t, {name: n}, id=eid, policy=policy)
        clock = t if clock is None else max(clock, t)
        for size, ms in ((MINUTE, MINUTE_MS), (HOUR, HOUR_MS)):
            start = t - t % ms
            late = start + ms + policy.lateness(size) <= clock
            assert ((size, start) in r.counted) == (not late)
            if late:
                reported[size] += 1
            else:
                oracle[(size, start)][name] += n
        assert len(r.counted) + len(r.too_late) == 2
        if sweeps[i % len(sweeps)]:
            topic.sweep(s, policy=policy)
        if data.draw(st.booleans(), label="recover"):
            s = roundtrip(s)
    topic.sweep(s, policy=policy)
    assert s["too_late"] == {MINUTE: reported[MINUTE], HOUR: reported[HOUR]}
    for size in (MINUTE, HOUR):
        for field in ("formed", "merged", "dead_lettered"):
            expected = sum(c[field] for (sz, _), c in oracle.items() if sz == size)
            assert topic.total(size, field) == expected
        got = {r["window_start"]: {f: r[f] for f in ("formed", "merged", "dead_lettered") if r[f]}
               for r in topic.latest.values() if r["window"] == size}
        want = {start: dict(c) for (sz, start), c in oracle.items() if sz == size}
        assert got == want
    # replaying everything (at-least-once redelivery) changes nothing
    before = {k: dict(v) for k, v in topic.latest.items()}
    for t, name, n, eid in arrivals:
        r = add(s, t, {name: n}, id=eid, policy=policy)
        assert not r.counted
    topic.sweep(s, policy=policy)
    assert topic.latest == before


@settings(max_examples=100, deadline=None)
@given(items=items, order=st.randoms(use_true_random=False),
       costs=st.lists(st.floats(-5, 5, allow_nan=False), min_size=60, max_size=60))
def test_aggregates_do_not_depend_on_arrival_order(items, order, costs):
    """With no input too late, the published windows are the same for every arrival order —
    including graph spend, kept as exact integer nano-dollars."""
    policy = WindowPolicy(minute_lateness_ms=5 * HOUR_MS, hour_lateness_ms=5 * HOUR_MS)
    arrivals = [(T0 + t, {name: n, "graph_cost_usd": costs[i]}) for i, (t, name, n) in enumerate(items)]

    def publish(seq):
        topic = Topic()
        s = new_state("u1")
        for t, c in seq:
            assert add(s, t, c, policy=policy).refused == []
        topic.sweep(s, policy=policy)
        return topic.latest

    first = publish(arrivals)
    order.shuffle(arrivals)
    assert publish(arrivals) == first


# ------------------------------------------------------------------ add against its definition --

def reference_add(state: dict, event_time_ms: int, counters: dict, *, id=None, clock_ms=None, now_ms=None,
                  policy: WindowPolicy = WindowPolicy()) -> tuple:
    """`add` as the module's docstring defines it, written for reading, not for speed: the
    window of each size from `window_bounds`, too late by `is_expired` on the clock so far."""
    from streams.analytics.windows import SIZES, _digest, normalize_counters
    incs = normalize_counters(counters)
    if not incs:
        return [], [], False
    digest = _digest(id) if id is not None else None
    if digest is not None and any(e[0] == digest for e in state["recent_ids"]):
        state["duplicates"] += 1
        return [], [], True
    if now_ms is not None and event_time_ms > now_ms + policy.max_future_ms:
        state["too_early"] += 1
        return [], [(TOO_EARLY, None, None)], False
    clock = max(c for c in (state["clock"], clock_ms, event_time_ms) if c is not None)
    state["clock"] = clock
    counted, refused = [], []
    for size in SIZES:
        start, end = window_bounds(event_time_ms, size)
        if is_expired(size, start, clock, policy):
            state["too_late"][size] += 1
            refused.append((TOO_LATE, size, start))
            continue
        w = state["windows"].setdefault(f"{size}/{start}", {
            "window": size, "start": start, "end": end, "counters": {}, "updated_at": event_time_ms,
            "rev": 0, "published": 0})
        for name, value in incs.items():
            w["counters"][name] = w["counters"].get(name, 0) + value
        w["updated_at"] = max(w["updated_at"], event_time_ms)
        w["rev"] += 1
        counted.append((size, start))
    if digest is not None:
        ids = list(state["recent_ids"]) + [[digest, event_time_ms]]
        state["recent_ids"] = ids[max(0, len(ids) - policy.recent_ids):]
    return counted, refused, False


adds = st.lists(st.fixed_dictionaries({
    "t": st.integers(-240, 720).map(lambda k: k * 30_000),  # a grid: window ends and clocks meet
    "counters": st.dictionaries(st.sampled_from(["formed", "accessed", "graph_cost_nanousd", "graph_cost_usd"]),
                                st.integers(-3, 3), max_size=3),
    "id": st.one_of(st.none(), st.sampled_from([f"e{i}" for i in range(12)])),
    "clock_ms": st.one_of(st.none(), st.integers(0, 960).map(lambda k: T0 + k * 30_000)),
    "now_ms": st.one_of(st.none(), st.integers(-120, 720).map(lambda k: T0 + k * 30_000)),
}), max_size=40)


@settings(max_examples=300, deadline=None)
@given(adds=adds, policy=st.builds(WindowPolicy, minute_lateness_ms=st.sampled_from([0, MINUTE_MS, 2 * HOUR_MS]),
                                   hour_lateness_ms=st.sampled_from([0, HOUR_MS, 2 * DAY_MS]),
                                   recent_ids=st.integers(0, 5), max_future_ms=st.sampled_from([0, HOUR_MS])))
def test_add_does_what_its_definition_says(adds, policy):
    """The inlined `add` (bounds, expiry and clock written out for speed) changes a state and
    reports exactly as the definition written with `window_bounds`, `is_expired` and a scan of
    the persisted ids, for any sequence of inputs, ids, clocks, guards and policies."""
    fast, slow = new_state("u"), new_state("u")
    for a in adds:
        counters = {k: (v / 1e9 if k == "graph_cost_usd" else v) for k, v in a["counters"].items()}
        kw = {"id": a["id"], "clock_ms": a["clock_ms"], "now_ms": a["now_ms"], "policy": policy}
        got = add(fast, T0 + a["t"], counters, **kw)
        want = reference_add(slow, T0 + a["t"], counters, **kw)
        assert (got.counted, [(r.reason, r.window, r.window_start) for r in got.refused], got.duplicate) == want
        assert roundtrip(fast) == roundtrip(slow)
