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


def test_the_bounds_refuse_values_rocksdb_cannot_use():
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES=1000 must be at least 65536"):
        Settings(rocksdb_write_buffer_bytes=1000)
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_WRITE_BUFFERS=1 must be at least 2"):
        Settings(rocksdb_write_buffers=1)
    with pytest.raises(SettingsError, match="MEMSTREAM_ROCKSDB_BLOCK_CACHE_BYTES=-1"):
        Settings(rocksdb_block_cache_bytes=-1)
    assert Settings(rocksdb_block_cache_bytes=0).rocksdb_block_cache_bytes == 0
