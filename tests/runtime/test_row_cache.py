"""`DecodedRows` against a plain model: what it holds, its byte bound, least recently written out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.row_cache import MISSING, DecodedRows
from streams.settings import Settings, SettingsError

slots = st.tuples(st.sampled_from(["analytics", "other"]), st.integers(0, 2), st.sampled_from(["a", "b", "c", "d"]))
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), slots, st.integers(0, 40)),
    st.tuples(st.just("take"), slots, st.just(0)),
    st.tuples(st.just("drop"), slots, st.just(0)),
    st.tuples(st.just("clear"), slots, st.just(0)),
), max_size=60)


@given(st.integers(0, 100), ops)
def test_the_cache_is_its_model(max_bytes, steps):
    cache = DecodedRows(max_bytes)
    model: list[tuple[tuple, object, int]] = []  # oldest write first
    for n, (op, slot, size) in enumerate(steps):
        if op == "put":
            row = {"n": n}
            cache.put(*slot, row, size)
            model = [e for e in model if e[0] != slot]
            if size <= max_bytes:
                model.append((slot, row, size))
                while sum(s for _k, _r, s in model) > max_bytes:
                    model.pop(0)
        elif op == "take":
            want = next((r for k, r, _s in model if k == slot), MISSING)
            assert cache.take(*slot) is want  # the very object put (the caller owns it now)
            model = [e for e in model if e[0] != slot]
        elif op == "drop":
            cache.drop(*slot)
            model = [e for e in model if e[0] != slot]
        else:
            cache.clear()
            model = []
        assert len(cache) == len(model)
        assert cache.bytes == sum(s for _k, _r, s in model) <= max_bytes


def test_a_row_is_taken_once_and_a_none_row_is_not_missing():
    cache = DecodedRows(100)
    cache.put("t", 0, "k", None, 4)
    assert cache.take("t", 0, "k") is None
    assert cache.take("t", 0, "k") is MISSING
    cache.put("t", 0, "k", {"x": 1}, 10)
    assert cache.take("t", 1, "k") is MISSING  # another partition's row is another row


def test_the_bound_evicts_the_least_recently_written_and_refuses_a_row_larger_than_it():
    cache = DecodedRows(10)
    cache.put("t", 0, "a", 1, 4)
    cache.put("t", 0, "b", 2, 4)
    cache.put("t", 0, "a", 3, 4)  # rewritten: now the newest
    cache.put("t", 0, "c", 4, 4)  # 12 > 10: the oldest write (b) leaves
    assert cache.take("t", 0, "b") is MISSING and cache.take("t", 0, "a") == 3 and cache.take("t", 0, "c") == 4
    cache.put("t", 0, "big", 5, 11)
    assert len(cache) == 0 and cache.bytes == 0
    none = DecodedRows(0)  # MEMSTREAM_ROW_CACHE_BYTES=0 keeps nothing (a 0-byte row is no row)
    none.put("t", 0, "a", 1, 1)
    assert none.take("t", 0, "a") is MISSING


def test_the_setting_refuses_a_negative_bound():
    assert Settings().row_cache_bytes == 32 * 1024 * 1024
    with pytest.raises(SettingsError, match="MEMSTREAM_ROW_CACHE_BYTES=-1"):
        Settings(row_cache_bytes=-1)
    with pytest.raises(SettingsError, match="MEMSTREAM_ROW_CACHE_BYTES"):
        Settings.from_env({"MEMSTREAM_ROW_CACHE_BYTES": "lots"})
    with pytest.raises(ValueError, match="max_bytes"):
        DecodedRows(-1)
