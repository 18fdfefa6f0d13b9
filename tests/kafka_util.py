"""Helpers for tests that run against the real broker: produce, consume, run workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench.fleet import candidate, codecs  # noqa: F401 - re-exported for the tests
from streams.contracts import catalog
from streams.contracts.wire import InvalidKeyError, decode_key, encode_key
from streams.settings import Settings
from streams.tools import devstack, kafkatools

from .conftest import ROOT, TEST_DATA, TEST_ENV

# `codecs` (every catalog schema registered) and `candidate` (a full CandidateMemory record) live
# in bench/fleet.py, shared with the fault suite's fleet and the scripts' long runs


def producer(settings: Settings) -> Producer:
    return Producer({"bootstrap.servers": settings.broker, "partitioner": "murmur2_random",
                     "linger.ms": 5, "log_level": 0})


def produce(settings: Settings, topic: str, items: list[tuple[str | bytes, dict | bytes]],
            headers: list[tuple[str, bytes]] | None = None) -> None:
    """Produce (key, record-or-raw-bytes) pairs; records are encoded with the topic's schema."""
    codec = codecs(settings).codec(catalog.topic(topic).value_schema)
    p = producer(settings)
    for key, value in items:
        k = key if isinstance(key, bytes) else encode_key(key)
        v = value if isinstance(value, (bytes, bytearray)) else codec.encode(value)
        p.produce(topic, key=k, value=v, headers=headers)
    assert p.flush(30) == 0, "produce did not complete"


def consume(settings: Settings, topic: str, until: Callable[[list[dict]], bool], timeout: float = 90.0,
            decode: bool = True) -> list[dict]:
    """Read `topic` from the beginning until `until(messages)` holds; each message is a dict with
    key, value (decoded record, None for a tombstone), headers, partition, offset."""
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": f"test-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0})
    md = c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    codec = codecs(settings).codec(catalog.topic(topic).value_schema)
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error():
                if until(out):
                    return out
                continue
            raw = msg.value()
            key = msg.key()
            out.append({
                "key": _key(key) if topic != catalog.DLQ else key,
                "value": (codec.decode(raw) if decode and raw is not None else raw),
                "raw": raw,
                "headers": dict(msg.headers() or []),
                "partition": msg.partition(),
                "offset": msg.offset(),
            })
            # `until` scans what was read: ask it when caught up (above) and every so often, not
            # per message (a topic that earlier tests filled holds tens of thousands)
            if len(out) % 1000 == 0 and until(out):
                return out
        raise AssertionError(f"timed out after {timeout:.0f}s reading {topic}; got {len(out)} messages")
    finally:
        c.close()


@contextmanager
def worker(settings: Settings, name: str, env: dict[str, str] | None = None,
           ready_timeout: float = 120.0, from_start: bool = False,
           ready_text: bytes = b"Worker]: Ready") -> Iterator[subprocess.Popen]:
    """A real `memstream worker` subprocess; yields once the Faust worker says it is ready (once
    its log holds `ready_text`).

    A new consumer group starts at the current end of the input topics (unless `from_start`):
    a test sees only what it produces, not the thousands of records earlier tests left there. A
    group that has committed before (a restarted worker) resumes where it was."""
    log_dir = ROOT / ".memstream" / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full_env = {**os.environ, **TEST_ENV, **(env or {})}
    app_id = full_env.get("MEMSTREAM_APP_ID", Settings().app_id)
    inputs = [t.name for t in catalog.topics() if t.direction == "in"]
    if not from_start and not _has_offsets(settings, app_id, inputs):
        kafkatools.position_group(settings, app_id, kafkatools.end_offsets(settings, inputs))
    data_dir = full_env.setdefault("MEMSTREAM_DATA_DIR", str(TEST_DATA / name))
    full_env.setdefault("MEMSTREAM_WEB_PORT", str(free_port()))
    claim_data_dir(data_dir)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streams", "worker"], cwd=ROOT, env=full_env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + ready_timeout
        while ready_text not in log_path.read_bytes():
            if proc.poll() is not None:
                raise AssertionError(f"worker {name} exited {proc.returncode}; log {log_path}:\n"
                                     + log_path.read_text()[-3000:])
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {name} not ready after {ready_timeout:.0f}s; log {log_path}")
            time.sleep(0.3)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        release_data_dir(data_dir)


_DATA_DIRS_IN_USE: set[str] = set()


def claim_data_dir(path: str) -> None:
    """Two live workers on one data dir would share RocksDB tables (SPEC §7: one per worker)."""
    path = os.path.realpath(path)
    if path in _DATA_DIRS_IN_USE:
        raise AssertionError(f"data dir {path} is already used by a running test worker")
    _DATA_DIRS_IN_USE.add(path)


def release_data_dir(path: str) -> None:
    _DATA_DIRS_IN_USE.discard(os.path.realpath(path))


def _key(raw: bytes | None) -> str | bytes | None:
    """The UTF-8 key, or the raw bytes of a key that is not UTF-8 (the bad-input test leaves
    such records on the input topics: reading them is not this helper's caller's business)."""
    try:
        return decode_key(raw) if raw is not None else None
    except InvalidKeyError:
        return raw


def read_to_end(settings: Settings, topic: str, keys: set[bytes] | None = None, *,
                keep: Callable[[bytes | None, int, int], bool] | None = None, decode: bool = True,
                timeout: float = 120.0, isolation: str = "read_committed") -> list[dict]:
    """Every record of `topic` up to the high watermarks as of now, in partition order: an
    exact count, not "until enough arrived". Only records whose key is in `keys` and/or for
    which keep(key, partition, offset) holds; values decoded unless `decode` is False.

    read_committed (librdkafka's default) skips records of aborted transactions and reads up to
    the last stable offset; a partition's last offset may be a transaction marker, never
    delivered as a message, so "done" is the consumer's position, not the last message seen."""
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": f"test-end-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "log_level": 0, "fetch.max.bytes": 52_428_800,
                  "isolation.level": isolation})
    codec = codecs(settings).codec(catalog.topic(topic).value_schema)
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        out: list[dict] = []
        deadline = time.monotonic() + timeout
        while todo:
            assert time.monotonic() < deadline, f"timed out reading {topic} to its end; partitions left {todo}"
            for m in c.consume(10_000, 0.5):
                if m.error():
                    continue
                p, o, k = m.partition(), m.offset(), m.key()
                if o >= ends[p] - 1:
                    todo.discard(p)
                if o >= ends[p] or (keys is not None and k not in keys) or (keep is not None and not keep(k, p, o)):
                    continue
                raw = m.value()
                out.append({"key": k, "value": codec.decode(raw) if decode and raw is not None else None,
                            "raw": raw, "headers": dict(m.headers() or []), "partition": p, "offset": o,
                            "timestamp": m.timestamp()[1]})
            for tp in c.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= ends[tp.partition]:
                    todo.discard(tp.partition)
        return out
    finally:
        c.close()


def _has_offsets(settings: Settings, group: str, topics: list[str]) -> bool:
    parts = [TopicPartition(t, p) for (t, p) in kafkatools.end_offsets(settings, topics)]
    for attempt in range(10):  # right after the broker starts, the group coordinator may move
        c = kafkatools.consumer(settings, group)
        try:
            return any(tp.offset >= 0 for tp in c.committed(parts, timeout=10))
        except KafkaException:
            if attempt == 9:
                raise
            time.sleep(1)
        finally:
            c.close()
    return False


def http_call(port: int, method: str, path: str, token: str | None = None, body: dict | bytes | None = None,
              timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """Any request to a worker's HTTP API, as a client sends it; (status, headers, raw body)
    whatever the status. A dict body is sent as JSON, bytes as they are (JSON content type)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def http_get(port: int, path: str, token: str | None = None) -> tuple[int, dict]:
    """GET a worker's HTTP API; (status, JSON body)."""
    status, _, raw = http_call(port, "GET", path, token, timeout=15)
    return status, json.loads(raw)


def wait_caught_up(settings: Settings, group: str, topic: str, timeout: float = 120.0) -> None:
    """Until consumer group `group` has committed the end of every partition of `topic` (the
    worker waits for its outputs before it commits, so every output of those records is on the
    broker). A topic written in transactions ends with a marker the group may not commit past:
    read it with `read_to_end` (which stops at the consumer's position) instead."""
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        deadline = time.monotonic() + timeout
        while True:
            ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
            committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in parts], timeout=10)}
            lag = {p: end - max(committed[p], 0) for p, end in ends.items() if end - max(committed[p], 0) > 0}
            if not lag:
                return
            assert time.monotonic() < deadline, f"group {group} still behind on {topic}: {lag}"
            time.sleep(0.5)
    finally:
        c.close()


def free_port() -> int:
    """A free port below 32768 in this checkout's band (see `devstack.free_port`), in this test
    process's own slice of it when the suite runs in parallel (pytest-xdist worker `gwN`): two
    processes never pick the same port for workers they start at the same moment."""
    from .conftest import BASE_PORT_OFFSET, WORKER_COUNT, WORKER_INDEX

    width = 8000 // WORKER_COUNT
    low = 10000 + BASE_PORT_OFFSET * 4 + WORKER_INDEX % WORKER_COUNT * width
    return devstack.free_port(low, low + width)


def log_of(name: str) -> str:
    return (ROOT / ".memstream" / "test-logs" / f"{name}.log").read_text()


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text().splitlines()[-n:])


@contextmanager
def hung_broker() -> Iterator[tuple[str, list]]:
    """A "broker" that accepts connections and never answers (hung, not dead): yields its
    bootstrap address and the connections it accepted."""
    import socket
    import threading

    hung = socket.create_server(("127.0.0.1", 0))
    hung.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_say_nothing() -> None:
        hung.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(hung.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    try:
        yield f"127.0.0.1:{hung.getsockname()[1]}", accepted
    finally:
        stop.set()
        hung.close()
        for conn in accepted:
            conn.close()
