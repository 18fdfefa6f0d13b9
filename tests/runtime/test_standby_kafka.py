"""The standby applier (streams/runtime/standby.py, MEMSTREAM_STANDBY_APPLY=librdkafka) on the real
broker, into real RocksDB stores opened with Faust's own options.

- a standby copy ends as "the changelog up to its last record", with Faust's persisted offset of
  that record (what a takeover recovers from);
- started again, it applies only what follows the persisted offset;
- MEMSTREAM_STANDBY_BATCH_MAX bounds every take (and so every write);
- a stopped applier writes nothing more (it is stopped before Faust closes its stores);
- a write that fails stops the thread, counted and logged, and leaves the store at the offset it
  had: nothing is marked applied that was not, so a takeover reads the changelog from there; the
  lag it stopped at stays reported until the next rebalance.

Whole workers (Faust's assignor, the claimed partitions left paused, a takeover from the copy):
tests/system/test_faults_kafka.py `test_failover_to_a_standby_replica`.
"""

from __future__ import annotations

import time

import pytest
from faust.stores.rocksdb import RocksDBOptions

from streams.runtime import standby
from streams.runtime.restore import OFFSET_KEY
from streams.runtime.standby import OFFSET_BEGINNING, Replica, StandbyApplier
from tests.kafka_util import producer
from tests.runtime.test_restore_kafka import PARTITIONS, _changelog, _expected

pytestmark = pytest.mark.kafka


def _applier(settings, batch_max: int = 5000, count=None) -> StandbyApplier:
    return StandbyApplier({"bootstrap.servers": settings.broker, "group.id": "standby-test"}, batch_max, count=count)


def _persisted(db) -> int | None:
    raw = db.get(OFFSET_KEY)
    return None if raw is None else int(raw)


def _contents(db) -> dict[bytes, bytes]:
    return {k: v for k, v in db.items() if k != OFFSET_KEY}


def _wait_applied(dbs, rows, applier: StandbyApplier, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_persisted(dbs[p]) != rows[p][-1][0] for p in range(PARTITIONS)):
        assert applier.failed is None, applier.failed
        assert time.monotonic() < deadline, {p: (_persisted(dbs[p]), rows[p][-1][0]) for p in range(PARTITIONS)}
        time.sleep(0.1)


def _apply_all(settings, topic, rows, dbs, starts=None, batch_max: int = 5000) -> StandbyApplier:
    """Start an applier on every partition (from `starts`, else the beginning), wait until each
    store holds its partition's last offset, stop it; returns it (stopped)."""
    applier = _applier(settings, batch_max=batch_max)
    applier.start([Replica(topic, p, dbs[p], OFFSET_BEGINNING if starts is None else starts[p])
                   for p in range(PARTITIONS)])
    try:
        _wait_applied(dbs, rows, applier)
        assert applier.running
    finally:
        applier.stop_now()
    assert not applier.running
    return applier


@pytest.fixture
def changelog(stack, unique, tmp_path):
    """(topic, its records per partition, an open RocksDB store per partition)."""
    topic = f"standby-{unique}-changelog"
    rows = _changelog(stack, topic)
    dbs = {p: RocksDBOptions().open(tmp_path / f"{topic}-{p}.db") for p in range(PARTITIONS)}
    try:
        yield topic, rows, dbs
    finally:
        for db in dbs.values():
            db.close()


def test_a_standby_copy_ends_as_the_changelog_with_fausts_persisted_offset(stack, changelog):
    topic, rows, dbs = changelog
    applier = _apply_all(stack, topic, rows, dbs)
    for p in range(PARTITIONS):
        assert _contents(dbs[p]) == _expected(rows[p]), f"partition {p}"
    assert applier.applied == sum(len(r) for r in rows.values())
    assert applier.failed is None


def test_started_again_it_applies_only_what_follows_the_persisted_offset(stack, changelog):
    topic, rows, dbs = changelog
    cut = {p: rows[p][len(rows[p]) // 2][0] for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        for key, value in _expected(rows[p][: len(rows[p]) // 2 + 1]).items():
            dbs[p][key] = value
        # a marker row the first half of the changelog would overwrite if it were read again
        dbs[p][b"marker"] = b"kept"
        dbs[p][OFFSET_KEY] = str(cut[p]).encode()
    applier = _apply_all(stack, topic, rows, dbs, starts={p: cut[p] + 1 for p in range(PARTITIONS)})
    for p in range(PARTITIONS):
        assert _contents(dbs[p]) == {**_expected(rows[p]), b"marker": b"kept"}, f"partition {p}"
    assert applier.applied == sum(len(r) - (len(r) // 2 + 1) for r in rows.values())


def test_standby_batch_max_bounds_every_take(stack, changelog, monkeypatch):
    topic, rows, dbs = changelog
    runs: list[int] = []
    write_run = standby.write_run

    def recording(db, batch, new_batch):
        runs.append(len(batch.puts))
        write_run(db, batch, new_batch)

    monkeypatch.setattr(standby, "write_run", recording)
    _apply_all(stack, topic, rows, dbs, batch_max=7)
    assert runs and max(runs) <= 7
    assert sum(runs) == sum(len(r) for r in rows.values())
    for p in range(PARTITIONS):
        assert _contents(dbs[p]) == _expected(rows[p])


def test_a_stopped_applier_writes_nothing_more(stack, changelog):
    topic, rows, dbs = changelog
    _apply_all(stack, topic, rows, dbs)
    before = {p: (_contents(dbs[p]), _persisted(dbs[p])) for p in range(PARTITIONS)}
    p = producer(stack)
    for i in range(30):
        p.produce(topic, key=f"after-stop-{i}".encode(), value=b"late", partition=i % PARTITIONS)
    assert p.flush(30) == 0
    time.sleep(1.5)  # more than the thread's poll: had it still been running it would have applied them
    assert {p: (_contents(dbs[p]), _persisted(dbs[p])) for p in range(PARTITIONS)} == before


class _FailingStore:
    """A partition store whose writes fail (a full disk, a closed store)."""

    def __init__(self) -> None:
        self.attempts = 0

    def write(self, batch) -> None:
        self.attempts += 1
        raise OSError("IO error: No space left on device")


def test_a_failed_write_stops_the_thread_counted_and_leaves_the_store_at_its_offset(stack, changelog, caplog):
    topic, rows, dbs = changelog
    counted: list[str] = []
    failing = _FailingStore()
    applier = _applier(stack, count=lambda name, n=1: counted.append(name))
    applier.start([Replica(topic, 0, failing, OFFSET_BEGINNING)])
    deadline = time.monotonic() + 60
    while applier.running:
        assert time.monotonic() < deadline, "the applier kept running after its store failed"
        time.sleep(0.1)
    # until the next rebalance /health reports the lag it stopped at, not "caught up"
    assert applier.remaining() >= len(rows[0]) > 0
    applier.stop_now()
    assert applier.remaining() == 0  # stopped for a rebalance: it claims nothing until started again
    assert failing.attempts == 1  # it stopped at the first failure: no later run written past it
    assert applier.failed == "OSError: IO error: No space left on device"
    assert counted == ["standby:apply_failed"]
    assert applier.applied == 0
    assert "standby replicas stopped (OSError: IO error: No space left on device)" in caplog.text
    # a real store the failing run was never written to keeps no persisted offset: Faust reads all of it
    assert _persisted(dbs[0]) is None
