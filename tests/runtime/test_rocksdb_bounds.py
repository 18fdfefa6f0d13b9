"""The memory bounds of the tables' RocksDB partition stores (MEMSTREAM_ROCKSDB_*): they reach
every store Faust opens and every store the restore ahead opens, and a store written far past
its write buffers keeps its memtables within them (RocksDB flushes instead of growing)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from streams.composition import create_runtime
from streams.runtime import faust_internals, restore
from streams.settings import Settings, SettingsError

MIB = 1024 * 1024


def _runtime(tmp_path: Path, **env: str):
    return create_runtime(Settings.from_env({"MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_DATA_DIR": str(tmp_path),
                                             "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_APP_ID": "bounds", **env}))


def _memtables(db) -> int:
    return int(db.property_int_value("rocksdb.cur-size-all-mem-tables"))


def test_every_table_store_takes_the_bounds_from_the_settings(tmp_path):
    rt = _runtime(tmp_path, MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES=str(3 * MIB), MEMSTREAM_ROCKSDB_WRITE_BUFFERS="4",
                  MEMSTREAM_ROCKSDB_BLOCK_CACHE_BYTES=str(5 * MIB))
    assert set(rt.tables) >= {"memory-state", "analytics"}
    for name, table in rt.tables.items():
        options = faust_internals.rocksdb_store(table).rocksdb_options
        assert (options.write_buffer_size, options.max_write_buffer_number, options.block_cache_size) == \
            (3 * MIB, 4, 5 * MIB), name


def test_the_defaults_bound_a_store_far_below_fausts(tmp_path):
    options = faust_internals.rocksdb_store(_runtime(tmp_path).tables["memory-state"]).rocksdb_options
    assert options.write_buffer_size * options.max_write_buffer_number == 32 * MIB  # Faust's: 192 MiB
    assert options.block_cache_size == 32 * MIB  # Faust's: 2 GiB


@pytest.mark.parametrize("opened_by", ["faust", "restore ahead"])
def test_a_store_written_past_its_buffers_flushes_instead_of_growing(tmp_path, opened_by):
    buffer = 256 * 1024
    rt = _runtime(tmp_path, MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES=str(buffer), MEMSTREAM_ROCKSDB_WRITE_BUFFERS="2")
    store = faust_internals.rocksdb_store(rt.tables["memory-state"])
    db = (faust_internals.rocksdb_partition_db(store, 0) if opened_by == "faust"
          else restore.open_partition_store(store, 0, wal=False))
    row = os.urandom(1000)
    most = 0
    for i in range(8 * 1024):  # 8 MiB of rows: 32 write buffers' worth
        db.put(f"u-{i}".encode(), row)
        if i % 256 == 0:
            most = max(most, _memtables(db))
    # RocksDB's arena allocates ahead of what a memtable holds: some slack over 2 x 256 KiB
    assert 0 < most <= 2 * buffer + 256 * 1024, most
    assert db.get(b"u-8191") == row and db.get(b"u-0") == row  # flushed rows still read
    sst = [p for p in Path(store.partition_path(0)).iterdir() if p.suffix == ".sst"]
    assert sst, "nothing was flushed to an SST file"


def test_the_workers_rocksdb_memory_gauge_sums_every_open_store_by_kind(tmp_path):
    """`memstream_rocksdb_memory_bytes{kind}`: what RocksDB holds for every open partition store
    of every table (what RSS holds beside the Python heap: the soak separates the two with it)."""
    from streams.api.health import rocksdb_memory, worker_families

    rt = _runtime(tmp_path, MEMSTREAM_ROCKSDB_MEMORY_BYTES="0")  # each store its own block cache
    assert rocksdb_memory(rt) == {"memtables": 0, "block_cache": 0, "table_readers": 0}  # no store open yet
    stores = [faust_internals.rocksdb_store(rt.tables[name]) for name in ("memory-state", "analytics")]
    dbs = [faust_internals.rocksdb_partition_db(store, p) for store in stores for p in (0, 1)]
    for i, db in enumerate(dbs):
        for j in range(200 * (i + 1)):
            db.put(f"k-{j}".encode(), os.urandom(500))
    each = [_memtables(db) for db in dbs]
    assert all(each)
    got = rocksdb_memory(rt)
    assert got["memtables"] == sum(each)
    assert got["block_cache"] >= 0 and got["table_readers"] >= 0
    family = {f.name: f for f in worker_families(None, [], {}, got)}["memstream_rocksdb_memory_bytes"]
    assert {s.labels["kind"]: s.value for s in family.samples} == got


def _capacity(db) -> int:
    return int(db.property_int_value("rocksdb.block-cache-capacity"))


@pytest.mark.parametrize("opened_by", ["faust", "restore ahead"])
def test_every_store_of_a_worker_shares_one_block_cache_by_default(tmp_path, opened_by):
    """MEMSTREAM_ROCKSDB_MEMORY_BYTES: one cache for every store of every table (the property of
    each store reports the same cache); 0 gives each store its own (the per-store bound)."""
    from streams.api.health import rocksdb_memory

    rt = _runtime(tmp_path, MEMSTREAM_ROCKSDB_MEMORY_BYTES=str(48 * MIB))
    stores = [faust_internals.rocksdb_store(rt.tables[name]) for name in ("memory-state", "analytics", "negotiator")]
    open_ = (faust_internals.rocksdb_partition_db if opened_by == "faust"
             else lambda store, p: restore.open_partition_store(store, p, wal=False))
    dbs = [open_(store, p) for store in stores for p in (0, 3)]
    assert {_capacity(db) for db in dbs} == {48 * MIB}
    for i, db in enumerate(dbs):
        db.put(f"k-{i}".encode(), os.urandom(4000))
        db.flush()
        assert db.get(f"k-{i}".encode())  # read back through the cache
    usage = {int(db.property_int_value("rocksdb.block-cache-usage")) for db in dbs}
    assert len(usage) == 1 and usage.pop() == rt.rocksdb_shared.cache.get_usage() > 0  # one cache
    if opened_by == "faust":
        assert rocksdb_memory(rt)["block_cache"] > 0  # counted once, not once per store
    alone = _runtime(tmp_path / "alone", MEMSTREAM_ROCKSDB_MEMORY_BYTES="0", MEMSTREAM_ROCKSDB_BLOCK_CACHE_BYTES=str(5 * MIB))
    assert alone.rocksdb_shared is None
    assert _capacity(faust_internals.rocksdb_partition_db(faust_internals.rocksdb_store(alone.tables["analytics"]), 0)) == 5 * MIB


def _total_memtables(budget: int | None, tmp_path: Path) -> tuple[int, object]:
    """The most memory all memtables of 8 stores held while 24 MiB of rows went into them, each
    store's own bound far above the budget (4 MiB x 2); `budget` None: no shared budget."""
    env = {"MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES": str(4 * MIB),
           "MEMSTREAM_ROCKSDB_MEMORY_BYTES": "0" if budget is None else str(budget)}
    rt = _runtime(tmp_path, **env)
    dbs = [faust_internals.rocksdb_partition_db(faust_internals.rocksdb_store(rt.tables[name]), p)
           for name in ("memory-state", "analytics") for p in range(4)]
    row, most = os.urandom(1000), 0
    for i in range(24 * 1024):
        dbs[i % len(dbs)].put(f"u-{i}".encode(), row)
        if i % 128 == 0:
            most = max(most, sum(_memtables(db) for db in dbs))
    return most, rt.rocksdb_shared


def test_the_shared_budget_bounds_the_memtables_of_all_stores_together(tmp_path):
    """With a 4 MiB budget (memtables at most half: 2 MiB) the 8 stores' memtables stay near it
    (RocksDB flushes the store being written once they pass it; but a store's memtable holds at
    least one arena block, an 8th of its write buffer, so the floor is stores x that); without one
    they grow with the number of stores, each up to its own buffers (here 8 x 2 x 4 MiB)."""
    bounded, shared = _total_memtables(4 * MIB, tmp_path / "shared")
    unbounded, none = _total_memtables(None, tmp_path / "alone")
    assert none is None and shared.write_buffers.enabled() and shared.write_buffers.get_buffer_size() == 2 * MIB
    # every store's memtables are counted by the one manager, and charged to the one cache
    assert 0 < shared.write_buffers.get_usage() <= shared.cache.get_usage()
    # measured on an idle machine: ~7-15 MiB against ~21-29 MiB; flushes run in the background,
    # so on a busy one the bounded figure comes nearer (never above: nothing else differs)
    assert bounded < unbounded, (bounded, unbounded)


def test_the_bounds_refuse_values_rocksdb_cannot_use():
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES=1000 must be at least 65536"):
        Settings(rocksdb_write_buffer_bytes=1000)
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_WRITE_BUFFERS=1 must be at least 2"):
        Settings(rocksdb_write_buffers=1)
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_BLOCK_CACHE_BYTES=-1"):
        Settings(rocksdb_block_cache_bytes=-1)
    assert Settings(rocksdb_block_cache_bytes=0).rocksdb_block_cache_bytes == 0
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_MEMORY_BYTES=-1"):
        Settings(rocksdb_memory_bytes=-1)
    assert Settings(rocksdb_memory_bytes=0).rocksdb_memory_bytes == 0  # 0: each store bounded on its own
