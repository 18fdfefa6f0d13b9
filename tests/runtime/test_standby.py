"""The standby applier's pure part (streams/runtime/standby.py `partition_writes`) and its settings;
the thread itself runs against the real broker in test_standby_kafka.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime import loglimit, standby
from streams.runtime.restore import Batch
from streams.runtime.standby import StandbyApplier, partition_writes
from streams.settings import Settings, SettingsError


def test_records_are_grouped_by_partition_in_fetch_order_with_their_last_offset():
    records = [
        ("t", 0, 5, b"a", b"1"),
        ("t", 1, 9, b"b", b"2"),
        ("t", 0, 6, b"a", None),  # a tombstone: delete
        ("u", 0, 2, b"c", b"3"),  # another changelog, same partition number: its own run
        ("t", 0, 8, b"a", b"4"),
    ]
    out = partition_writes(records)
    assert out == {
        ("t", 0): Batch(puts=[(b"a", b"1"), (b"a", None), (b"a", b"4")], size=5, last=8),
        ("t", 1): Batch(puts=[(b"b", b"2")], size=2, last=9),
        ("u", 0): Batch(puts=[(b"c", b"3")], size=2, last=2),
    }


def test_a_record_without_a_key_is_left_out_but_moves_the_offset():
    out = partition_writes([("t", 0, 3, b"k", b"v"), ("t", 0, 4, None, b"orphan")])
    assert out[("t", 0)].puts == [(b"k", b"v")]
    assert out[("t", 0)].last == 4


def test_nothing_fetched_writes_nothing():
    assert partition_writes([]) == {}


_records = st.lists(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 2),
                              st.sampled_from([b"a", b"b", b"c"]), st.one_of(st.none(), st.binary(max_size=4))),
                    max_size=60)


@given(_records)
def test_applying_the_runs_ends_as_applying_every_record_in_order(raw):
    """A store written run by run (puts, deletes) holds what the changelog says: each key's last
    value, a deleted key absent; and the persisted offset is each partition's last."""
    next_offset: dict[tuple[str, int], int] = {}
    records = []
    for topic, partition, key, value in raw:
        offset = next_offset.get((topic, partition), 0)
        next_offset[(topic, partition)] = offset + 1 + (offset % 3)  # compaction leaves gaps
        records.append((topic, partition, offset, key, value))
    expected: dict[tuple[str, int], dict[bytes, bytes]] = {}
    last: dict[tuple[str, int], int] = {}
    for topic, partition, offset, key, value in records:
        rows = expected.setdefault((topic, partition), {})
        if value is None:
            rows.pop(key, None)
        else:
            rows[key] = value
        last[(topic, partition)] = offset
    stores: dict[tuple[str, int], dict[bytes, bytes]] = {}
    for tp, batch in partition_writes(records).items():
        rows = stores.setdefault(tp, {})
        for key, value in batch.puts:
            if value is None:
                rows.pop(key, None)
            else:
                rows[key] = value
        assert batch.last == last[tp]
    assert stores == expected


@pytest.mark.parametrize("value", ["kafka", "", "LIBRDKAFKA"])
def test_an_unknown_standby_applier_is_a_settings_error_naming_the_variable(value):
    with pytest.raises(SettingsError, match=f"MEMSTREAM_STANDBY_APPLY={value!r} is not one of librdkafka, faust"):
        Settings.from_env({"MEMSTREAM_STANDBY_APPLY": value})


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_standby_batch_below_one_is_a_settings_error(value):
    with pytest.raises(SettingsError, match=f"MEMSTREAM_STANDBY_BATCH_MAX={value} must be at least 1"):
        Settings.from_env({"MEMSTREAM_STANDBY_BATCH_MAX": value})


def test_the_defaults_apply_standbys_with_librdkafka():
    settings = Settings.from_env({})
    assert (settings.standby_apply, settings.standby_batch_max) == ("librdkafka", 5000)


def test_non_fatal_consumer_errors_are_logged_once_per_interval_with_how_many_were_not(monkeypatch, caplog):
    clock = [1000.0]
    monkeypatch.setattr(loglimit.time, "monotonic", lambda: clock[0])
    applier = StandbyApplier({}, 10)
    caplog.set_level("DEBUG", logger="memstream.standby")
    for _ in range(5):
        applier._warn.log("standby replica: %s (retried by librdkafka)", "Broker: Not leader for partition")
        clock[0] += 1.0
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["standby replica: Broker: Not leader for partition (retried by librdkafka)"]
    assert sum(r.levelname == "DEBUG" for r in caplog.records) == 4
    clock[0] += standby.WARN_EVERY_S
    applier._warn.log("standby replica: %s (retried by librdkafka)", "Broker: Not leader for partition")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned[-1].endswith("(retried by librdkafka) (and 4 more since the last such line)")


def test_an_applier_that_claims_nothing_reports_no_lag():
    applier = StandbyApplier({}, 10)
    applier.start([])
    assert not applier.running and applier.remaining() == 0


# ------------------------------------------------------------------ which partitions, from which offset
@pytest.fixture
def runtime(offline_runtime):
    return lambda **env: offline_runtime("standby-claims", **env)


def _assigned(rt, monkeypatch, *, actives, standbys) -> None:
    monkeypatch.setattr(rt.app.assignor, "assigned_actives", lambda: set(actives))
    monkeypatch.setattr(rt.app.assignor, "assigned_standbys", lambda: set(standbys))


def _changelog(rt, table: str = "memory-state") -> str:
    return rt.tables[table].changelog_topic.get_topic_name()


def test_it_claims_the_standby_changelog_partitions_of_the_rocksdb_tables_only(runtime, monkeypatch):
    from faust.types import TP

    rt = runtime()
    state, analytics = _changelog(rt), _changelog(rt, "analytics")
    standbys = {TP(state, 1), TP(analytics, 4), TP(state, 2), TP("memory.candidates.v1", 1)}
    _assigned(rt, monkeypatch, actives={TP(state, 2), TP(state, 0)}, standbys=standbys)
    # a partition both active and standby stays Faust's; a source topic is no changelog; an
    # active partition, or one not assigned, is not a standby
    assert rt.standby_claims(standbys | {TP(state, 0), TP(state, 5)}) == {TP(state, 1), TP(analytics, 4)}


@pytest.mark.parametrize("env", [{"MEMSTREAM_STANDBY_APPLY": "faust"}, {"MEMSTREAM_STORE": "memory://"}])
def test_faust_applies_the_standbys_with_the_faust_applier_or_another_store(runtime, monkeypatch, env):
    from faust.types import TP

    rt = runtime(**env)
    standbys = {TP(_changelog(rt), 1)}
    _assigned(rt, monkeypatch, actives=set(), standbys=standbys)
    assert rt.standby_claims(standbys) == set()


def test_replicas_start_after_the_persisted_offset_and_a_store_that_will_not_open_is_left_out(runtime, monkeypatch):
    import asyncio

    from faust.types import TP

    from streams.runtime import faust_internals
    from streams.runtime.restore import OFFSET_KEY
    from streams.runtime.standby import OFFSET_BEGINNING

    rt = runtime()
    state = _changelog(rt)
    store = faust_internals.rocksdb_store(rt.tables["memory-state"])
    faust_internals.rocksdb_partition_db(store, 2).put(OFFSET_KEY, b"41")  # rows up to offset 41 applied
    _assigned(rt, monkeypatch, actives={TP(state, 0)}, standbys={TP(state, 1), TP(state, 2), TP(state, 3)})
    opened = faust_internals.rocksdb_partition_db

    def opening(st, partition):
        if partition == 3:
            raise OSError("IO error: lock hold by current process")
        return opened(st, partition)

    started, counted = [], []
    monkeypatch.setattr(faust_internals, "rocksdb_partition_db", opening)
    monkeypatch.setattr(rt.standby, "start", lambda replicas: started.extend(replicas))
    monkeypatch.setattr(rt, "count", lambda name, n=1: counted.append(name))
    asyncio.run(rt._start_standby())
    assert [(r.topic, r.partition, r.start) for r in started] == [(state, 1, OFFSET_BEGINNING), (state, 2, 42)]
    assert counted == ["standby:open_failed"]
