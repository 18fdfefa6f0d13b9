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
