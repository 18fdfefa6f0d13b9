"""A checkpoint's rows written by the runtime itself (`Runtime.write_rows`) against the same rows
written through Faust (`checkpoint.write_through_tables`): the same bytes in each partition's
RocksDB store and the same changelog records, in the same order. Real RocksDB stores (a temporary
data dir), no broker: the output producer is replaced by a recorder of what it is handed."""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.composition import create_runtime
from streams.runtime import checkpoint, faust_internals
from streams.settings import Settings


class Deliveries:
    def __init__(self, on_done) -> None:
        self.on_done = on_done


class RecordingProducer:
    """What `Runtime._changelog_row` hands the output producer, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes | None, int]] = []

    def deliveries(self, on_done=None):
        return Deliveries(on_done)

    def produce_now(self, deliveries, topic, key, value, partition) -> None:
        self.records.append((topic, key, value, partition))


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    env = {"MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_STORE": "rocksdb://",
           "MEMSTREAM_DATA_DIR": str(tmp_path_factory.mktemp("write-rows")), "MEMSTREAM_APP_ID": "write-rows"}
    runtime = create_runtime(Settings.from_env(env))
    runtime.output_producer = RecordingProducer()  # type: ignore[assignment]
    return runtime


class _Event:  # what a row's writer reads of its event (weakly referenced, as Faust's are)
    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(topic="memory.candidates.v1", partition=partition)


_event = _Event


def _store_rows(table) -> dict[int, list[tuple[bytes, bytes]]]:
    store = faust_internals.rocksdb_store(table)
    return {p: sorted((k, v) for k, v in faust_internals.rocksdb_partition_db(store, p).items()
                      if not k.startswith(b"__faust"))
            for p in range(2)}


keys = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=12)
values = st.one_of(st.just(checkpoint.DELETE), st.dictionaries(st.text(max_size=5), st.integers(-2**63, 2**63 - 1) | st.text(max_size=30),
                                                               max_size=4))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(keys, values, st.integers(0, 1)), min_size=1, max_size=30, unique_by=lambda r: r[0]),
       st.integers(0, 10**9))
def test_direct_rows_are_the_rows_faust_would_write(rt, rows, salt):
    direct, faust_path = rt.tables["memory-state"], rt.tables["negotiator"]
    assert rt._direct_store(direct) is not None  # the direct path is the one under test
    recorder: RecordingProducer = rt.output_producer  # type: ignore[assignment]
    # two rounds over the same keys: the second overwrites and deletes rows the first wrote
    for round_ in range(2):
        # (a DELETE in the first round removes a row that is not there: no write, no tombstone)
        staged = [(f"{salt}-{key}", value if round_ or value is checkpoint.DELETE else {"first": key}, partition)
                  for key, value, partition in rows]
        recorder.records.clear()
        cp = checkpoint.Checkpoint(rt)
        rt.write_rows(cp, [checkpoint.Row(direct, k, v, _event(p)) for k, v, p in staged])
        by_runtime = list(recorder.records)
        recorder.records.clear()
        rt._writing = cp  # as `write_rows` does around Faust's writes
        try:
            checkpoint.write_through_tables([checkpoint.Row(faust_path, k, v, _event(p)) for k, v, p in staged])
        finally:
            rt._writing = None
        by_faust = list(recorder.records)
        assert [(k, v, p) for _t, k, v, p in by_runtime] == [(k, v, p) for _t, k, v, p in by_faust]
        assert {t for t, *_ in by_runtime} <= {rt._changelog_topics["memory-state"]}
        assert _store_rows(direct) == _store_rows(faust_path)
        assert bool(cp.state_acks) == bool(by_runtime)  # the records' acknowledgements are the checkpoint's
        store = faust_internals.rocksdb_store(direct)
        for k, v, p in staged:  # and they are the rows staged: there, or removed
            kept = faust_internals.rocksdb_partition_db(store, p).get(k.encode())
            assert (kept is None) == (v is checkpoint.DELETE)
            for partition in (p, 1 - p):  # the one-get read is the table's read, in either partition
                with checkpoint.in_event(_event(partition)):
                    assert faust_internals.read_row(direct, k) == direct.get(k)
                    assert (faust_internals.read_row(direct, k) is None) == (v is checkpoint.DELETE or partition != p)


def test_a_table_on_another_store_is_written_through_faust(tmp_path):
    env = {"MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_STORE": "memory://", "MEMSTREAM_DATA_DIR": str(tmp_path),
           "MEMSTREAM_APP_ID": "write-rows-memory"}
    runtime = create_runtime(Settings.from_env(env))
    runtime.output_producer = RecordingProducer()  # type: ignore[assignment]
    table = runtime.tables["memory-state"]
    assert runtime._direct_store(table) is None
    cp = checkpoint.Checkpoint(runtime)
    runtime.write_rows(cp, [checkpoint.Row(table, "u-1", {"a": 1}, _event(0)),
                            checkpoint.Row(table, "u-2", {"b": 2}, _event(1))])
    runtime.write_rows(cp, [checkpoint.Row(table, "u-2", checkpoint.DELETE, _event(1)),
                            checkpoint.Row(table, "u-3", checkpoint.DELETE, _event(1))])  # u-3 was never there
    with checkpoint.in_event(_event(0)):
        assert table.get("u-1") == {"a": 1}
    with checkpoint.in_event(_event(1)):
        assert table.get("u-2") is None
    assert [(k, v is None, p) for _t, k, v, p in runtime.output_producer.records] == [
        (b"u-1", False, 0), (b"u-2", False, 1), (b"u-2", True, 1)]


def test_rocksdb_rows_with_faust_as_the_output_producer_are_written_through_faust(tmp_path, monkeypatch):
    """MEMSTREAM_OUTPUT_PRODUCER=faust: no direct writes, every row through Faust (none dropped)."""
    env = {"MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_DATA_DIR": str(tmp_path),
           "MEMSTREAM_APP_ID": "write-rows-faust", "MEMSTREAM_OUTPUT_PRODUCER": "faust"}
    runtime = create_runtime(Settings.from_env(env))
    assert runtime.output_producer is None
    assert not runtime._caches_rows(runtime.tables["analytics"])  # rows through Faust: none kept decoded
    table = runtime.tables["memory-state"]
    sent: list[tuple[int, object, object]] = []

    def send_soon(*, key, value, partition, **_kw):  # Faust's producer buffer, without a broker
        sent.append((partition, key, value))
        return SimpleNamespace(message=SimpleNamespace(partition=partition))

    monkeypatch.setattr(table.changelog_topic, "send_soon", send_soon)
    cp = checkpoint.Checkpoint(runtime)
    runtime.write_rows(cp, [checkpoint.Row(table, "u-1", {"a": 1}, _event(0)),
                            checkpoint.Row(table, "u-2", {"b": 2}, _event(1))])
    for key, partition, row in (("u-1", 0, {"a": 1}), ("u-2", 1, {"b": 2})):
        with checkpoint.in_event(_event(partition)):
            assert table.get(key) == row
    assert [(p, k) for p, k, _v in sent] == [(0, "u-1"), (1, "u-2")]


_EXAMPLES = itertools.count()


def _update_batch(rt, table, partition: int, updates: dict[str, object]) -> None:
    """One batch attempt's step 3: an update per key (`updates`: key -> fn), in `partition`."""
    cp = checkpoint.Checkpoint(rt)
    cp.event = _event(partition)
    for key, fn in updates.items():
        cp.update(table, key, fn)
    cp._write_state()


def _stored(table, partition: int, key: str):
    with checkpoint.in_event(_event(partition)):
        return table.get(key)


def test_an_update_is_handed_the_row_its_key_last_wrote_and_never_a_row_the_store_lacks(rt):
    table = rt.tables["analytics"]
    assert checkpoint.is_updates_only(table) and rt._caches_rows(table)
    given_rows: list = []

    def step(n: int, fail: bool = False):
        def fn(row):
            given_rows.append(row)
            row = {"n": n, "items": list(range(n))} if row is None else {**row, "n": n}
            if fail:
                row["n"] = -1
                raise RuntimeError("the update failed")
            return row
        return fn

    rt.row_cache.clear()
    _update_batch(rt, table, 1, {"rc-a": step(1)})
    written = rt.row_cache._rows[("analytics", 1, "rc-a")][0]
    _update_batch(rt, table, 1, {"rc-a": step(2)})
    assert given_rows[-1] is written  # not read and decoded again: the object written last time
    assert _stored(table, 1, "rc-a") == {"n": 2, "items": [0]}
    given = given_rows[-1]  # mutated in place? no: `{**row}` made a new one, and the cache let it go
    assert ("analytics", 1, "rc-a") in rt.row_cache._rows and rt.row_cache._rows[("analytics", 1, "rc-a")][0] is not given

    with pytest.raises(RuntimeError):  # a failed batch: the key leaves the cache, the store keeps n=2
        _update_batch(rt, table, 1, {"rc-a": step(3, fail=True)})
    assert ("analytics", 1, "rc-a") not in rt.row_cache._rows
    _update_batch(rt, table, 1, {"rc-a": step(4)})
    assert given_rows[-1] == {"n": 2, "items": [0]}  # decoded from the store

    import asyncio
    asyncio.run(rt._forget_rows())  # partitions moved: every kept row is dropped
    assert len(rt.row_cache) == 0
    _update_batch(rt, table, 1, {"rc-a": step(5)})
    assert given_rows[-1] == {"n": 4, "items": [0]}
    _update_batch(rt, table, 1, {"rc-a": lambda row: checkpoint.DELETE})
    assert ("analytics", 1, "rc-a") not in rt.row_cache._rows and _stored(table, 1, "rc-a") is None
    _update_batch(rt, table, 0, {"rc-a": step(6)})  # the same key in another partition is another row
    assert given_rows[-1] is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "delete", "fail", "rebalance", "evict"]),
                          st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=25))
def test_updates_through_the_cache_see_what_the_store_holds(rt, steps):
    """Batches of updates, failed batches, rebalances and a cache too small for the rows, in any
    order: every update is handed exactly the row the store holds, and the store holds the model."""
    import asyncio

    table = rt.tables["analytics"]
    model: dict[tuple[str, int], dict] = {}
    salt = next(_EXAMPLES)  # keys no earlier example wrote
    for op, k, partition in steps:
        key = f"rc-{salt}-{k}"
        before = model.get((key, partition))
        seen: list = []

        def fn(row, op=op, seen=seen):
            seen.append(copy.deepcopy(row))
            if op == "delete":
                return checkpoint.DELETE
            row = row if row is not None else {"count": 0, "log": []}
            row["count"] += 1  # changed in place: the update owns the row it is handed
            row["log"].append(op)
            if op == "fail":
                raise RuntimeError("failed")
            return row

        if op == "rebalance":
            asyncio.run(rt._forget_rows())
            continue
        max_bytes = rt.row_cache.max_bytes
        if op == "evict":
            rt.row_cache.max_bytes = 10  # every row is larger: nothing is kept
        try:
            _update_batch(rt, table, partition, {key: fn})
        except RuntimeError:
            assert op == "fail"
        finally:
            rt.row_cache.max_bytes = max_bytes
        assert seen == [before]
        if op == "delete":
            model.pop((key, partition), None)
        elif op != "fail":
            model[(key, partition)] = {"count": (before or {"count": 0})["count"] + 1,
                                       "log": [*(before or {"log": []})["log"], op]}
        assert _stored(table, partition, key) == model.get((key, partition))
    assert rt.row_cache.bytes <= rt.row_cache.max_bytes
