"""The tables' RocksDB stores and their write-ahead log (MEMSTREAM_STATE_WAL; docs/state-and-failures.md,
"The tables' write-ahead log"). No broker: each case kills a process that wrote to a store and reads
what the store kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

rocksdict = pytest.importorskip("rocksdict")

_WRITE_THROUGH_THE_RUNTIME = textwrap.dedent("""
    import os
    from streams.runtime import faust_internals
    from streams.composition import create_runtime
    from streams.settings import Settings

    rt = create_runtime(Settings.from_env())
    table = rt.tables["memory-state"]
    db = faust_internals.rocksdb_partition_db(faust_internals.rocksdb_store(table), 0)
    db.put(b"u-1", b"a row")
    print(db.path(), flush=True)
    os._exit(0)  # a kill: nothing is closed or flushed
""")


def _kept_after_a_kill(tmp_path: Path, wal: str) -> list:
    env = {**os.environ, "MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_DATA_DIR": str(tmp_path / wal),
           "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_STATE_WAL": wal}
    done = subprocess.run([sys.executable, "-c", _WRITE_THROUGH_THE_RUNTIME], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    path = done.stdout.strip().splitlines()[-1]
    db = rocksdict.Rdict(path, options=rocksdict.Options(raw_mode=True))
    try:
        return list(db.keys())
    finally:
        db.close()


def test_the_memory_tables_write_without_the_log_unless_it_is_asked_for(tmp_path):
    """The default: a write not yet flushed is gone after a kill (the log is off); with
    MEMSTREAM_STATE_WAL=true the same write survives it."""
    assert _kept_after_a_kill(tmp_path, "false") == []
    assert _kept_after_a_kill(tmp_path, "true") == [b"u-1"]


_WRITE_IN_ORDER = textwrap.dedent("""
    import os, sys
    import rocksdict
    from streams.runtime import faust_internals

    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(64 * 1024)  # many small memtables: many flushes during the run
    options.set_max_write_buffer_number(3)
    db = rocksdict.Rdict(sys.argv[1], options=options)
    db.set_write_options(faust_internals.no_wal_write_options())
    for i in range(ROWS):
        batch = rocksdict.WriteBatch(raw_mode=True)  # as a changelog restore writes: rows, then the offset
        batch.put(b"row-%08d" % i, b"x" * 1000)
        db.write(batch)
        if i % 10 == 9:
            db.put(b"__faust\\0offset__", str(i).encode())
    os._exit(0)
""")


def test_a_store_without_the_log_keeps_a_prefix_of_its_writes_after_a_kill(tmp_path):
    """What the safety argument rests on: without the log, a killed store holds its writes in
    order up to some point (RocksDB commits memtable flushes in order), the persisted offset
    among them, and never a later write without the earlier ones."""
    rows = 5000
    path = tmp_path / "db"
    done = subprocess.run([sys.executable, "-c", _WRITE_IN_ORDER.replace("ROWS", str(rows)), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        kept = sorted(int(k[4:]) for k in db.keys() if k.startswith(b"row-"))
        offset = db.get(b"__faust\0offset__")
    finally:
        db.close()
    assert 0 < len(kept) < rows  # some flushed, the rest lost with the process (the log is off)
    assert kept == list(range(len(kept)))  # a prefix, no gap
    assert offset is not None and int(offset) < len(kept)  # the offset kept never runs ahead of the rows


def test_opening_a_partition_store_reads_no_row_of_its_table(tmp_path, monkeypatch):
    """Which tables skip the log is decided by identity: a Faust table compares with `==` as a
    Mapping (every row of both decoded), which a WeakSet's membership test did at every
    partition store opened (each rebalance: 15% of a joining worker's samples in the bench)."""
    from streams.composition import create_runtime
    from streams.runtime import faust_internals
    from streams.settings import Settings

    rt = create_runtime(Settings.from_env({"MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_DATA_DIR": str(tmp_path),
                                           "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_APP_ID": "wal-identity"}))
    table = rt.tables["memory-state"]
    store = faust_internals.rocksdb_store(table)
    faust_internals.rocksdb_partition_db(store, 0).put(b"u-1", b'{"a":1}')

    def compared(self, other):
        raise AssertionError("a table was compared with ==")

    monkeypatch.setattr(type(table), "__eq__", compared)
    db = faust_internals.rocksdb_partition_db(store, 1)  # opened now, through the wrapped opener
    db.put(b"u-2", b'{"b":2}')
    assert db.get(b"u-2") == b'{"b":2}'
    assert faust_internals._without_wal(table) and not faust_internals._without_wal(rt.tables["analytics"].data)


_RESTORE_A_RUN = textwrap.dedent("""
    import os, sys
    import rocksdict
    from streams.composition import create_runtime
    from streams.runtime import faust_internals, restore
    from streams.settings import Settings

    settings = Settings.from_env()
    store = faust_internals.rocksdb_store(create_runtime(settings).tables["memory-state"])
    flush_every = None if sys.argv[1] == "never" else float(sys.argv[1])
    stores = restore.PartitionStores(lambda topic, p: restore.open_partition_store(store, p, wal=settings.state_wal),
                                     flush_every_s=flush_every)
    run = restore.Batch(puts=[(b"u-1", b"a row")], last=7)
    stores.write("changelog", 0, run, lambda: rocksdict.WriteBatch(raw_mode=True))
    print(store.partition_path(0), flush=True)
    if sys.argv[2] == "close":
        stores.close()
    os._exit(0)  # a kill unless closed above: nothing else is flushed
""")


def _restored(tmp_path: Path, wal: str, flush_every: str, end: str) -> list:
    data = tmp_path / f"{wal}-{flush_every}-{end}"
    env = {**os.environ, "MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_DATA_DIR": str(data), "MEMSTREAM_STORE": "rocksdb://",
           "MEMSTREAM_STATE_WAL": wal, "MEMSTREAM_APP_ID": "wal-restore"}
    done = subprocess.run([sys.executable, "-c", _RESTORE_A_RUN, flush_every, end], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    db = rocksdict.Rdict(done.stdout.strip().splitlines()[-1], options=rocksdict.Options(raw_mode=True))
    try:
        return sorted(db.keys())
    finally:
        db.close()


def test_the_restore_ahead_writes_without_the_log_unless_it_is_asked_for(tmp_path):
    """The restore ahead's stores skip the log as the tables do (a restore needs no more disk than
    the tables and writes each row once): an unflushed run is gone after a kill; with
    MEMSTREAM_STATE_WAL=true it survives. A flushed run survives a kill without the log (the
    restore flushes every FLUSH_EVERY_S, so a killed restore goes on from its copy), and a clean
    close keeps everything."""
    offset = b"__faust\0offset__"
    assert _restored(tmp_path, "false", "never", "kill") == []
    assert _restored(tmp_path, "true", "never", "kill") == [offset, b"u-1"]
    assert _restored(tmp_path, "false", "0", "kill") == [offset, b"u-1"]
    assert _restored(tmp_path, "false", "never", "close") == [offset, b"u-1"]
