"""The rule of the restore ahead (streams/runtime/restore.py) that decides what a partition store lacks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.restore import Span, span_to_restore


def test_an_empty_store_lacks_everything_from_the_low_watermark():
    assert span_to_restore("t", 0, None, 0, 10) == Span("t", 0, 0, 10)
    assert span_to_restore("t", 0, None, 4, 10) == Span("t", 0, 4, 10)  # deleted or compacted away before 4


def test_a_store_lacks_what_follows_its_persisted_offset():
    assert span_to_restore("t", 1, 6, 0, 10) == Span("t", 1, 7, 10)
    assert span_to_restore("t", 1, 2, 5, 10) == Span("t", 1, 5, 10)  # the records after 2 before 5 are gone


def test_nothing_when_up_to_date_or_empty_or_ahead():
    assert span_to_restore("t", 0, 9, 0, 10) is None
    assert span_to_restore("t", 0, None, 0, 0) is None
    assert span_to_restore("t", 0, None, 7, 7) is None
    assert span_to_restore("t", 0, 12, 0, 10) is None  # ahead of the changelog: Faust's consistency check says so


@given(persisted=st.none() | st.integers(-1, 200), low=st.integers(0, 100), extra=st.integers(0, 100))
def test_the_span_starts_after_what_the_store_has_and_ends_at_the_high_watermark(persisted, low, extra):
    high = low + extra
    span = span_to_restore("t", 3, persisted, low, high)
    have = -1 if persisted is None else persisted
    if span is None:
        assert have >= high - 1 or low >= high
        return
    assert span.end == high and span.start < span.end
    assert span.start == max(low, have + 1)  # nothing the store has is read again, nothing it lacks is skipped


def test_the_offset_key_is_fausts():
    from faust.stores.rocksdb import Store

    from streams.runtime.restore import OFFSET_KEY

    assert Store.offset_key == OFFSET_KEY


@pytest.mark.parametrize("var", ["MEMSTREAM_FETCH_MAX_WAIT_MS", "MEMSTREAM_FETCH_BACKLOG_WAIT_MS"])
def test_a_fetch_wait_over_ten_seconds_is_a_settings_error_naming_the_variable(var):
    """A fetch request held long keeps a drained partition from being fetched again meanwhile;
    past Faust's request timeout (90 s) it would fail every time."""
    from streams.settings import Settings, SettingsError

    assert getattr(Settings.from_env({var: "10000"}), var[len("MEMSTREAM_"):].lower()) == 10_000
    with pytest.raises(SettingsError, match=f"{var}=10001 must be at most 10000"):
        Settings.from_env({var: "10001"})


@pytest.mark.parametrize("var", ["MEMSTREAM_RESTORE_AHEAD_BATCH_BYTES", "MEMSTREAM_FETCH_MIN_BYTES",
                                 "MEMSTREAM_FETCH_MAX_WAIT_MS", "MEMSTREAM_FETCH_QUIET_MS",
                                 "MEMSTREAM_FETCH_BACKLOG_RECORDS", "MEMSTREAM_FETCH_BACKLOG_WAIT_MS"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_bound_below_one_is_a_settings_error_naming_the_variable(var, value):
    from streams.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=f"{var}={value} must be at least 1"):
        Settings.from_env({var: value})
