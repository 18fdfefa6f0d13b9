"""Event-time analytics windows through the real broker: exact counts per window, a late
event landing in its own (earlier) window, published on memory.analytics.v1 and over HTTP."""

from __future__ import annotations

import time

import pytest

from streams.contracts import catalog
from streams.core.ids import node_id_for
from tests.kafka_util import candidate, consume, free_port, http_get, log_of, produce, worker

pytestmark = pytest.mark.kafka

MIN = 60_000


def _latest(records: list[dict]) -> dict[tuple[str, int], dict]:
    out = {}
    for r in records:
        out[(r["window"], r["window_start"])] = r
    return out


def test_windows_count_exactly_per_event_time_and_late_events_land_in_their_window(stack, unique):
    user = f"mb-an-{unique}"
    now = int(time.time() * 1000)
    m1 = (now // MIN - 30) * MIN  # two consecutive minutes, half an hour ago (inside one hour
    m2 = m1 + MIN                 # unless m1 is the hour's last minute: then the hour test adapts)
    facts = ["The user keeps bees on the roof.", "Her car is a red Fiat Panda.", "He studies cello on Sundays."]
    cands = [candidate(user, f"{unique}-c{i}", m1 + i * 1000, f) for i, f in enumerate(facts)]
    cands.append(candidate(user, f"{unique}-c0-again", m1 + 5000, facts[0]))  # merge
    cands.append(candidate(user, f"{unique}-c1-new", m2 + 1000, "Her car is now a blue Tesla.",
                            supersedes=node_id_for(user, f"{unique}-c1")))  # supersede (forms one)
    late_access = {"event_id": f"{unique}-acc", "motebit_id": user, "device_id": "phone",
                   "timestamp": m1 + 30_000, "version_clock": 1, "event_type": "memory_accessed",
                   "payload": {"node_id": node_id_for(user, f"{unique}-c0")}}
    port = free_port()
    env = {"MEMSTREAM_APP_ID": f"it-an-{unique}", "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_API_TOKENS": "t:none", "MEMSTREAM_TIMER_INTERVAL_S": "1"}
    expected = {
        ("minute", m1): {"formed": 3, "merged": 1, "accessed": 1, "superseded": 0},
        ("minute", m2): {"formed": 1, "merged": 0, "accessed": 0, "superseded": 1},
    }
    hour = (m1 // (60 * MIN)) * 60 * MIN
    hours: dict[int, dict] = {}
    for (_w, start), counts in expected.items():
        h = hours.setdefault((start // (60 * MIN)) * 60 * MIN, {k: 0 for k in counts})
        for k, v in counts.items():
            h[k] += v
    for start, counts in hours.items():
        expected[("hour", start)] = counts

    def done(out):
        latest = _latest([m["value"] for m in out if m["key"] == user])
        return all(k in latest and all(latest[k][c] == v for c, v in want.items()) for k, want in expected.items())

    with worker(stack, f"an-{unique}", env=env):
        produce(stack, catalog.MEMORY_CANDIDATES, [(user, c) for c in cands])
        consume(stack, catalog.MEMORY_LEDGER, lambda out: sum(
            1 for m in out if m["key"] == user and m["value"]["event_type"] == "memory_consolidated") == 5)
        produce(stack, catalog.MEMORY_EVENTS, [(user, late_access)])  # after m2's records: late, out of order
        published = consume(stack, catalog.MEMORY_ANALYTICS, done, timeout=60)
        minute_api = http_get(port, f"/v1/analytics/{user}?window=1m", "t")
        hour_api = http_get(port, f"/v1/analytics/{user}?window=1h&from={hour}&to={hour + 60 * MIN}", "t")
        summary = http_get(port, "/v1/analytics/summary?window=1m", "t")
        bad = http_get(port, f"/v1/analytics/{user}?window=5m", "t")
    # a fresh app id: its tick topics existed (with leaders) before the consumer subscribed, so
    # the group's leader assigned them at once (else no ticks until the next rebalance)
    assert "Ignoring missing topic" not in log_of(f"an-{unique}")
    latest = _latest([m["value"] for m in published if m["key"] == user])
    for k, want in expected.items():
        got = latest[k]
        assert {c: got[c] for c in want} == want, k
        assert got["deleted"] == 0 and got["promoted"] == 0 and got["quarantined"] == 0 and got["dead_lettered"] == 0
        assert got["window_end"] - got["window_start"] == (MIN if k[0] == "minute" else 60 * MIN)
    assert minute_api[0] == 200
    assert {(w["window"], w["window_start"]): w["formed"] for w in minute_api[1]["windows"]} == {
        ("minute", m1): 3, ("minute", m2): 1}
    assert [w["formed"] for w in hour_api[1]["windows"]] == [hours[hour]["formed"]]
    assert summary[0] == 200 and bad[0] == 400

    # Restart the worker (same group, same tables): the recovered windows keep counting — one
    # more memory formed in minute m2 republishes m2 with formed 2, not a fresh count of 1.
    extra = candidate(user, f"{unique}-after-restart", m2 + 9000, "The user runs a chess club on Fridays.")
    with worker(stack, f"an2-{unique}", env={**env, "MEMSTREAM_WEB_PORT": str(free_port())}):
        produce(stack, catalog.MEMORY_CANDIDATES, [(user, extra)])
        again = consume(stack, catalog.MEMORY_ANALYTICS, lambda out: any(
            m["key"] == user and m["value"]["window"] == "minute" and m["value"]["window_start"] == m2
            and m["value"]["formed"] == 2 for m in out), timeout=60)
    after = _latest([m["value"] for m in again if m["key"] == user])
    assert after[("minute", m2)]["formed"] == 2 and after[("minute", m2)]["superseded"] == 1
    assert after[("minute", m1)] == latest[("minute", m1)]  # untouched window: same aggregate
