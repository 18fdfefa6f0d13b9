"""A table row encoded without Faust's serializer layers (`faust_internals.json_row_encoder`) is
byte for byte the row Faust encodes, for the store and for the changelog, on any JSON row."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.agents import memory_store
from streams.composition import register_all
from streams.runtime import checkpoint, faust_internals
from streams.runtime.app import Runtime
from streams.settings import Settings


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(Settings(registry_url="", partitions=3))
    register_all(rt)
    return rt


scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
rows = st.dictionaries(
    st.text(max_size=8) | st.integers(-5, 5),  # Faust's options let orjson write int keys as strings
    st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
                 | st.tuples(inner, inner), max_leaves=12),
    max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows)
def test_a_row_is_the_bytes_faust_writes_to_the_store_and_the_changelog(runtime, row):
    for name, table in runtime.tables.items():
        store = table.data
        encode = faust_internals.json_row_encoder(store)
        assert encode is not None, f"{name}: its rows should take the direct path"
        encoded = faust_internals.encoded_row(table, row)
        assert encoded == encode(row) == store._encode_value(row), name
        assert encoded == table.changelog_topic.prepare_value(row, table.value_serializer, None, None)[0], name


def test_a_value_faust_would_serialize_otherwise_goes_through_faust(runtime):
    table = runtime.tables["memory-state"]
    store = table.data
    encode = faust_internals.json_row_encoder(store)
    assert encode is not None
    for value in ([1, 2], "text", 3, None):  # not a dict: Faust's own path, the same bytes
        assert encode(value) == store._encode_value(value)
    assert faust_internals.encoded_row(table, b'{"a":1}') == b'{"a":1}'  # bytes pass as they are


def test_a_store_with_another_serializer_or_a_model_keeps_fausts_path(runtime, monkeypatch):
    store = runtime.tables["memory-state"].data
    monkeypatch.setattr(store, "value_serializer", "raw")
    assert faust_internals.json_row_encoder(store) is None
    monkeypatch.setattr(store, "value_serializer", "json")
    monkeypatch.setattr(store, "value_type", dict)
    assert faust_internals.json_row_encoder(store) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows, rows)
def test_an_aux_row_whose_redo_log_holds_encoded_rows_is_the_aux_row_with_the_rows(runtime, node, aux):
    """`MemoryStore.stage` stages a user's rows encoded once and embeds those bytes in the aux
    row's redo log (`memory_store._redo_entry`): the aux row is byte for byte the one Faust
    writes for the same rows as objects."""
    table = runtime.tables["memory-state"]
    staged = {"n-1": faust_internals.encoded_row(table, node), "n-2": checkpoint.DELETE}
    embedded = {**aux, "pending": {k: memory_store._redo_entry(v) for k, v in staged.items()}}
    as_rows = {**aux, "pending": {"n-1": node, "n-2": None}}
    assert faust_internals.encoded_row(table, embedded) == table.data._encode_value(as_rows)
