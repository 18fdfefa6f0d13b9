"""The restore ahead (streams/runtime/restore.py) on the real broker, into real RocksDB stores
opened with Faust's own options.

- every partition store ends as "the changelog up to its last record": each key's last value,
  a tombstone's key absent, Faust's persisted offset that of the last record;
- every write is atomic and covers a contiguous run of one partition's records *with* the
  offset of its last one, so a restore stopped between two writes leaves a correct store;
- a store that already has a persisted offset is given only what follows it;
- the limits: MEMSTREAM_RESTORE_AHEAD_BATCH_BYTES bounds a write's rows, the deadline stops the
  restore (what it wrote stays correct and Faust restores the rest);
- a real worker on an empty data dir restores its tables ahead and answers exactly as the worker
  that wrote them did, and as a worker with MEMSTREAM_RESTORE_AHEAD=false (Faust's restore only);
- while it restores, its web port answers /health/live 200 and /health 503 "restoring"; killed
  in the middle, it keeps what it copied (no `.running` mark yet) and its next start copies only
  the rest (no restart loop under an orchestrator's liveness probe).
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from pathlib import Path

import pytest
import rocksdict
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from faust.stores.rocksdb import RocksDBOptions

from streams.composition import create_runtime
from streams.contracts import catalog
from streams.contracts.topics import ensure_internal
from streams.runtime import restore, retry
from tests.conftest import TEST_DATA
from tests.kafka_util import (
    candidate,
    free_port,
    http_call,
    http_get,
    log_of,
    produce,
    producer,
    wait_caught_up,
    worker,
)

pytestmark = pytest.mark.kafka

PARTITIONS = 3


class RecordingStores(restore.PartitionStores):
    """Real stores that also keep, per write, (partition, keys written, persisted offset written)."""

    def __init__(self, tmp_path) -> None:
        super().__init__(lambda topic, p: RocksDBOptions().open(tmp_path / f"{topic}-{p}.db"))
        self.writes: list[tuple[int, list[bytes], int]] = []

    def write(self, topic, partition, batch, new_batch) -> None:
        super().write(topic, partition, batch, new_batch)
        self.writes.append((partition, [k for k, _ in batch.puts], batch.last))


def _changelog(settings, topic: str) -> dict[int, list[tuple[int, bytes, bytes | None]]]:
    """Write a changelog-like topic: keys updated several times, some deleted (tombstones);
    returns partition -> [(offset, key, value)]."""
    admin = AdminClient({"bootstrap.servers": settings.broker})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    written: dict[int, list[tuple[int, bytes, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    p = producer(settings)

    def delivered(err, msg) -> None:
        assert err is None, err
        written[msg.partition()].append((msg.offset(), msg.key(), msg.value()))

    for i in range(600):
        key = f"user-{i % 40}/node-{i % 97}".encode()
        value = None if i % 11 == 0 else f'{{"v": {i}, "pad": "{"x" * (i % 50)}"}}'.encode()
        p.produce(topic, key=key, value=value, partition=i % PARTITIONS, on_delivery=delivered)
    assert p.flush(30) == 0
    return {part: sorted(rows) for part, rows in written.items()}


def _expected(rows: list[tuple[int, bytes, bytes | None]], after: int = -1) -> dict[bytes, bytes]:
    last: dict[bytes, bytes | None] = {}
    for offset, key, value in rows:
        if offset > after:
            last[key] = value
    return {k: v for k, v in last.items() if v is not None}


def _contents(stores: restore.PartitionStores, topic: str, partition: int) -> dict[bytes, bytes]:
    db = stores.get(topic, partition)
    return {k: v for k, v in db.items() if k != restore.OFFSET_KEY}


def _consumer(settings) -> Consumer:
    return Consumer({"bootstrap.servers": settings.broker, "group.id": "restore-ahead-test",
                     "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 0})


def _restore(settings, stores, topic, *, deadline_s=60.0, batch_rows=restore.BATCH_ROWS, batch_bytes=1 << 20):
    consumer = _consumer(settings)
    try:
        return restore.restore_ahead(consumer, stores, lambda: rocksdict.WriteBatch(raw_mode=True),
                                     {topic: range(PARTITIONS)}, deadline_s=deadline_s, batch_rows=batch_rows,
                                     batch_bytes=batch_bytes, retrying=retry.retrying)
    finally:
        consumer.close()


@pytest.fixture
def written(stack, unique, tmp_path):
    """(topic, its records per partition, empty recording stores) for one test."""
    topic = f"restore-{unique}-changelog"
    rows = _changelog(stack, topic)
    stores = RecordingStores(tmp_path)
    try:
        yield topic, rows, stores
    finally:
        stores.close()


def test_an_empty_store_ends_as_the_changelog_in_atomic_contiguous_writes(stack, written):
    topic, rows, stores = written
    report = _restore(stack, stores, topic, batch_rows=37)
    assert report.complete and report.rows == sum(len(r) for r in rows.values())
    for p in range(PARTITIONS):
        assert _contents(stores, topic, p) == _expected(rows[p])
        assert stores.persisted(topic, p) == rows[p][-1][0]
    # each write: the next run of the partition's records, with the offset of its last one
    done = {p: -1 for p in range(PARTITIONS)}
    for p, keys, last in stores.writes:
        run = [r for r in rows[p] if done[p] < r[0] <= last]
        assert [k for _, k, _ in run] == keys and len(keys) <= 37
        done[p] = last
    assert done == {p: rows[p][-1][0] for p in range(PARTITIONS)}


def test_a_store_with_a_persisted_offset_gets_only_what_follows(stack, written):
    topic, rows, stores = written
    cut = rows[1][len(rows[1]) // 2][0]
    db = stores.get(topic, 1)
    db[b"only-in-the-store"] = b"kept"  # a row the store has: never touched
    db[restore.OFFSET_KEY] = str(cut).encode()
    report = _restore(stack, stores, topic)
    assert report.rows == sum(len(r) for r in rows.values()) - sum(1 for r in rows[1] if r[0] <= cut)
    assert all(last > cut for p, _, last in stores.writes if p == 1)
    after = _expected(rows[1], after=cut)
    deleted_after = {k for o, k, v in rows[1] if o > cut and v is None}
    contents = _contents(stores, topic, 1)
    assert contents.pop(b"only-in-the-store") == b"kept"
    assert {k: v for k, v in contents.items() if k in after} == after
    assert not deleted_after & set(contents)
    assert stores.persisted(topic, 1) == rows[1][-1][0]
    _restore(stack, stores, topic)  # up to date: nothing to read
    assert stores.persisted(topic, 1) == rows[1][-1][0]


def test_batch_bytes_bounds_every_write(stack, written):
    topic, rows, stores = written
    _restore(stack, stores, topic, batch_bytes=1)  # every record over the bound: one write each
    assert len(stores.writes) == sum(len(r) for r in rows.values())
    assert all(len(keys) == 1 for _, keys, _ in stores.writes)
    for p in range(PARTITIONS):
        assert _contents(stores, topic, p) == _expected(rows[p])


def test_the_deadline_stops_it_with_correct_stores(stack, written):
    topic, rows, stores = written
    report = _restore(stack, stores, topic, deadline_s=0.0)
    assert not report.complete and report.rows == 0 and not stores.writes
    for p in range(PARTITIONS):
        assert stores.persisted(topic, p) is None and _contents(stores, topic, p) == {}
    report = _restore(stack, stores, topic)  # the next start (or Faust) goes on from there
    assert report.complete
    for p in range(PARTITIONS):
        assert _contents(stores, topic, p) == _expected(rows[p])


def _answers(port: int, users: list[str], timeout: float = 120.0) -> dict[str, dict]:
    """Each user's nodes (superseded ones too), once the worker answers 200 (it answers 503 while
    its tables are recovered)."""
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    for u in users:
        while True:
            status, body = http_get(port, f"/v1/memory/{u}/nodes?include=superseded", "tok")
            if status == 200:
                out[u] = body
                break
            assert status == 503 and time.monotonic() < deadline, (status, body)
            time.sleep(0.5)
    return out


def test_a_worker_on_an_empty_data_dir_answers_as_the_one_that_wrote_its_tables(stack, unique):
    users = [f"mb-ra-{unique}-{i}" for i in range(4)]
    facts = ["The user prefers oat milk.", "The user prefers oat milk in coffee.", "The user lives in Berlin.",
             "The user moved to Munich.", "The user's bike is green."]
    t0 = (int(time.time() * 1000) // 60_000 - 120) * 60_000
    env = {"MEMSTREAM_APP_ID": f"it-restore-{unique}", "MEMSTREAM_API_TOKENS": "tok:secret"}
    answers, logs = {}, {}
    for run, ahead in (("writer", "true"), ("ahead", "true"), ("faust", "false")):
        port = free_port()
        name = f"restore-{run}-{unique}"  # each run its own, empty, data dir
        with worker(stack, name, env={**env, "MEMSTREAM_WEB_PORT": str(port), "MEMSTREAM_RESTORE_AHEAD": ahead}):
            if run == "writer":
                produce(stack, catalog.MEMORY_CANDIDATES, [
                    (u, candidate(u, f"{u}-{j}", t0 + j * 60_000, facts[(i + j) % len(facts)]))
                    for i, u in enumerate(users) for j in range(6)])
                wait_caught_up(stack, env["MEMSTREAM_APP_ID"], catalog.MEMORY_CANDIDATES)
            answers[run] = _answers(port, users)
        logs[run] = log_of(name)
    restored = re.search(r"restore ahead: (\d+) record\(s\) of (\d+) partition", logs["ahead"])
    assert restored and int(restored.group(1)) >= len(users) * 2, logs["ahead"][-3000:]
    assert "restore ahead" not in logs["faust"]
    assert all(len(answers["writer"][u]["nodes"]) >= 2 for u in users)
    assert answers["ahead"] == answers["writer"] == answers["faust"]


#: tombstones of keys nobody wrote: a long restore (one write per row at batch bytes 1) that
#: leaves nothing behind for the worker to load
PADDING_ROWS = 600_000
_UP_TO = re.compile(rb"ahead of joining the group: up to (\d+) record")


def test_a_worker_killed_during_the_restore_ahead_keeps_its_copy_and_answers_live_meanwhile(stack, unique):
    settings = dataclasses.replace(stack, app_id=f"it-restore-kill-{unique}")
    rt = create_runtime(settings)
    ensure_internal(settings, rt.internal_topics)
    changelog = rt.tables["memory-state"].changelog_topic.get_topic_name()
    p = producer(settings)
    for i in range(PADDING_ROWS):
        while True:
            try:
                p.produce(changelog, key=b"pad-%d" % i, value=None, partition=i % settings.partitions)
                break
            except BufferError:  # the producer's queue is full: let it deliver
                p.poll(0.1)
    assert p.flush(60) == 0
    name = f"restore-kill-{unique}"
    port = free_port()
    env = {"MEMSTREAM_APP_ID": settings.app_id, "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_RESTORE_AHEAD_BATCH_BYTES": "1"}
    with worker(stack, name, env=env, ready_text=b"ahead of joining the group") as proc:
        status, _, body = http_call(port, "GET", "/health/live", None, timeout=15)
        assert (status, body) == (200, b'{"status": "alive", "phase": "restoring"}')
        deadline = time.monotonic() + 60
        while True:  # until part of the copy is in the stores
            status, ready = http_get(port, "/health")
            assert status == 503 and ready["status"] == "restoring", ready
            assert ready["records_at_most"] >= PADDING_ROWS
            if ready["restored_records"] > 0:
                break
            assert time.monotonic() < deadline, ready
            time.sleep(0.1)
        status, answer = http_get(port, "/v1/memory/someone/nodes", "tok")
        assert status == 503 and answer["error"] == "restoring"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    first = log_of(name)
    assert not re.search(r"restore ahead: \d+ record\(s\) of", first), "the copy ended before the kill"
    assert not (Path(TEST_DATA) / name / f"{settings.app_id}.running").exists()
    with worker(stack, name, env=env):  # the same data dir: goes on from the copy
        pass
    second = log_of(name)
    assert "did not stop cleanly" not in second
    copied = int(_UP_TO.search(first.encode()).group(1))
    left = int(_UP_TO.search(second.encode()).group(1))
    assert left < copied, (copied, left)
