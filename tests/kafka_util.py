"""Helpers for tests that run against the real broker: produce, consume, run workers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from confluent_kafka import Consumer, Producer, TopicPartition

from streams import catalog
from streams.settings import Settings
from streams.wire import CodecFactory, decode_key, encode_key

from .conftest import ROOT, TEST_ENV

_FACTORIES: dict[str, CodecFactory] = {}


def codecs(settings: Settings) -> CodecFactory:
    if settings.registry_url not in _FACTORIES:
        f = CodecFactory.from_url(settings.registry_url)
        f.register([t.name for t in catalog.topics()])
        _FACTORIES[settings.registry_url] = f
    return _FACTORIES[settings.registry_url]


def candidate(user: str, cid: str, ts: int, content: str, sensitivity: str | None = "none", **fields) -> dict:
    """A CandidateMemory record (user-stated, semantic) with every field; `fields` override."""
    return {"candidate_id": cid, "motebit_id": user, "content": content, "sensitivity": sensitivity,
            "source": "user_stated", "memory_type": "semantic", "confidence": None, "valid_from": None,
            "timestamp": ts, "embedding": None, "frontmatter_type": None, "extra": None, "supersedes": None,
            "kind": None, "session_id": None, **fields}


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
            out.append({
                "key": msg.key() if topic == catalog.DLQ else decode_key(msg.key()),
                "value": (codec.decode(raw) if decode and raw is not None else raw),
                "raw": raw,
                "headers": dict(msg.headers() or []),
                "partition": msg.partition(),
                "offset": msg.offset(),
            })
            if until(out):
                return out
        raise AssertionError(f"timed out after {timeout:.0f}s reading {topic}; got {len(out)} messages")
    finally:
        c.close()


@contextmanager
def worker(settings: Settings, name: str, env: dict[str, str] | None = None,
           ready_timeout: float = 120.0) -> Iterator[subprocess.Popen]:
    """A real `memstream worker` subprocess; yields once the Faust worker says it is ready."""
    log_dir = ROOT / ".memstream" / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full_env = {**os.environ, **TEST_ENV, **(env or {})}
    full_env.setdefault("MEMSTREAM_DATA_DIR", str(ROOT / ".memstream" / "test-data" / name))
    full_env.setdefault("MEMSTREAM_WEB_PORT", str(free_port()))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streams", "worker"], cwd=ROOT, env=full_env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + ready_timeout
        while b"Worker]: Ready" not in log_path.read_bytes():
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


def http_get(port: int, path: str, token: str | None = None) -> tuple[int, dict]:
    """GET a worker's HTTP API; (status, JSON body)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_of(name: str) -> str:
    return (ROOT / ".memstream" / "test-logs" / f"{name}.log").read_text()


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text().splitlines()[-n:])
