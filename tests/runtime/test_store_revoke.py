"""faust-streaming's RocksDB store collects garbage at a revocation only when it closes a store
(`faust_internals.collect_only_when_a_store_closes`; bench/RESULTS.md stop 22). Real RocksDB
stores in a temporary data dir, no broker."""

from __future__ import annotations

import faust.stores.rocksdb as faust_rocksdb
import pytest
from faust.types import TP

from streams.runtime import faust_internals


@pytest.fixture
def store_and_collections(offline_runtime, monkeypatch):
    rt = offline_runtime("store-revoke")
    table = rt.tables["memory-state"]
    store = faust_internals.rocksdb_store(table)
    collections: list[int] = []

    class CountingGc:
        @staticmethod
        def collect(*_args) -> int:
            collections.append(1)
            return 0

    monkeypatch.setattr(faust_rocksdb, "gc", CountingGc)
    faust_internals.rocksdb_partition_db(store, 0).put(b"k", b"v")
    return table, store, collections


def test_a_revocation_that_closes_no_store_collects_nothing(store_and_collections):
    table, store, collections = store_and_collections
    changelog = table.changelog_topic.get_topic_name()
    store.revoke_partitions(table, {TP(changelog, 1), TP("memory.candidates.v1", 0)})  # not open here / not its topic
    store.revoke_partitions(table, set())
    assert collections == []
    assert faust_internals.rocksdb_open_partitions(store) == [0]


def test_a_revocation_that_closes_a_store_runs_fausts_code(store_and_collections):
    table, store, collections = store_and_collections
    changelog = table.changelog_topic.get_topic_name()
    store.revoke_partitions(table, {TP(changelog, 0), TP(changelog, 1)})
    assert collections == [1]  # once, as faust-streaming does: the collection closes a store a cycle holds
    assert faust_internals.rocksdb_open_partitions(store) == []
    # and the partition opens again (its lock was released)
    assert faust_internals.rocksdb_partition_db(store, 0).get(b"k") == b"v"
