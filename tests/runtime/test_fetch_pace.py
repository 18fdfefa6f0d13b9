"""`FetchPace`: the fetch batching a consumer asks for, from when records last came."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.fetch_pace import QUIET, FetchPace

FLOWING = (65536, 25)


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 5)), max_size=40), st.floats(0.001, 3))
def test_it_gathers_while_records_came_within_the_quiet_spell_and_reports_only_changes(fetches, quiet_after):
    pace = FetchPace(FLOWING, quiet_after)
    assert pace.current == QUIET
    now, last = 0.0, None
    for records, gap in fetches:
        now += gap
        before = pace.current
        change = pace.observe(records, now)
        if records:
            last = now
        want = FLOWING if last is not None and now - last < quiet_after else (FLOWING if records else QUIET)
        assert pace.current == want
        assert change == (want if want != before else None)


def test_a_quiet_spell_ends_the_batching_and_the_next_record_restores_it():
    pace = FetchPace(FLOWING, 2.0)
    assert pace.observe(0, 0.0) is None  # quiet from the start: nothing to change
    assert pace.observe(5, 1.0) == FLOWING
    assert pace.observe(0, 2.9) is None
    assert pace.observe(0, 3.0) == QUIET
    assert pace.observe(1, 3.1) == FLOWING


BACKLOG = (65536, 250)


@given(st.lists(st.tuples(st.integers(0, 2000), st.floats(0, 5)), max_size=40), st.floats(0.001, 3),
       st.integers(1, 1500))
def test_a_fetch_of_a_backlog_holds_the_next_ones_longer_until_one_hands_fewer(fetches, quiet_after, threshold):
    pace = FetchPace(FLOWING, quiet_after, backlog=BACKLOG, backlog_records=threshold)
    now, last, mode = 0.0, None, QUIET
    for records, gap in fetches:
        now += gap
        before = pace.current
        change = pace.observe(records, now)
        if records:
            last, mode = now, BACKLOG if records >= threshold else FLOWING
        elif last is None or now - last >= quiet_after:
            mode = QUIET
        assert pace.current == mode
        assert change == (mode if mode != before else None)


def test_a_backlog_ends_with_a_smaller_fetch_or_a_quiet_spell_and_without_a_threshold_never_starts():
    pace = FetchPace(FLOWING, 0.5, backlog=BACKLOG, backlog_records=1000)
    assert pace.observe(999, 0.0) == FLOWING
    assert pace.observe(1000, 0.1) == BACKLOG
    assert pace.observe(0, 0.5) is None  # empty fetches during a backlog: the busy partitions are buffered
    assert pace.observe(20, 0.6) == FLOWING  # the backlog is worked off
    assert pace.observe(5000, 0.7) == BACKLOG
    assert pace.observe(0, 1.2) == QUIET
    assert pace.observe(5000, 1.3, stream_records=10) == FLOWING  # a recovery's changelog rows: no backlog
    assert pace.observe(5000, 1.4, stream_records=1000) == BACKLOG
    off = FetchPace(FLOWING, 0.5, backlog=BACKLOG, backlog_records=0)
    assert off.observe(10_000, 0.0) == FLOWING and off.backlog is None
