"""Queued ticks of a partition-local timer run at most once per partition per half interval
(`streams.runtime.tick_gate`, issue 34: a worker restarted onto a backlog handled a minute of
queued housekeeping and analytics ticks in a row and applied ~5 records/s meanwhile). The clock
is fake: no test here waits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.tick_gate import TickGate


def test_a_backlog_of_ticks_runs_once_per_partition_and_the_rest_do_nothing():
    now = [100.0]
    gate = TickGate(5.0, clock=lambda: now[0])
    ran = []
    # twelve intervals of ticks for six partitions, queued behind a backlog, handled in a burst
    for _interval in range(12):
        for p in range(6):
            now[0] += 0.01
            if gate.due(p):
                ran.append(p)
    assert sorted(ran) == list(range(6))
    assert gate.skipped == 12 * 6 - 6


def test_ticks_that_arrive_on_time_all_run_and_partitions_do_not_hold_each_other_back():
    now = [0.0]
    gate = TickGate(5.0, clock=lambda: now[0])
    ran = 0
    for _interval in range(10):
        now[0] += 5.0  # one tick per partition per interval, as the timer sends them
        ran += sum(gate.due(p) for p in range(12))
    assert ran == 10 * 12 and gate.skipped == 0
    # a tick a little early (the timer woke up late before) still runs; half an interval is the floor
    now[0] += 2.6
    assert gate.due(0)
    now[0] += 2.4
    assert not gate.due(0) and gate.due(1)


@given(st.integers(0, 64), st.integers(1, 5), st.floats(0.5, 3600))
def test_a_rounds_ticks_are_spread_evenly_over_the_interval_with_every_timers_interleaved(partitions, timers, interval):
    from streams.runtime.tick_gate import tick_offsets

    rounds = [tick_offsets(partitions, t, timers, interval) for t in range(timers)]
    every = sorted(o for offsets in rounds for o in offsets)
    assert all(len(offsets) == partitions for offsets in rounds)
    assert all(0 <= o < interval for o in every)
    assert all(offsets == sorted(offsets) for offsets in rounds)  # in partition order
    gaps = [b - a for a, b in zip(every, every[1:], strict=False)]
    assert all(abs(g - interval / (partitions * timers)) < 1e-9 * interval for g in gaps)  # evenly apart, none shared
    if partitions:
        assert rounds[0][0] == 0


def test_a_timer_outside_the_count_is_refused():
    from streams.runtime.tick_gate import tick_offsets

    with pytest.raises(ValueError):
        tick_offsets(3, 2, 2, 30.0)


@pytest.mark.parametrize("value", ["0", "-30", "nan"])
def test_a_timer_interval_not_above_zero_is_a_settings_error(value):
    # the timers' rounds would follow each other without pause: a flood of ticks
    from streams.settings import Settings, SettingsError

    assert Settings.from_env({}).timer_interval_s == 30.0
    with pytest.raises(SettingsError, match="MEMSTREAM_TIMER_INTERVAL_S=.* must be more than 0"):
        Settings.from_env({"MEMSTREAM_TIMER_INTERVAL_S": value})
