"""Schema ids across registry restarts and resets, health that names the reason, a full disk
(issue 18), on a throw-away stack of its own (the ports of tests/tools/test_devstack.py, under its lock):
this module restarts and empties its registry, which would break every other test's ids.

One worker runs through it all; the registry and the worker's health are checked at each step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory, encode_key
from streams.runtime.probe import EXIT_DISK_FULL, EXIT_STOP_TIMEOUT
from streams.settings import Settings
from streams.tools import devstack
from tests.conftest import PORT_OFFSET, ROOT, TEST_DATA, WORKER_SUFFIX, memstream
from tests.kafka_util import candidate, http_get, producer, read_to_end, wait_caught_up, worker
from tests.tools.test_devstack import OWN, own_stack

pytestmark = pytest.mark.kafka

ENV = {**OWN, "MEMSTREAM_STACK_DIR": str(ROOT / ".memstream" / f"registry-test{WORKER_SUFFIX}"), "MEMSTREAM_PARTITIONS": "2",
       "MEMSTREAM_HEALTH_CHECK_INTERVAL_S": "1", "MEMSTREAM_STANDBY_REPLICAS": "0",
       "MEMSTREAM_SHUTDOWN_TIMEOUT_S": "15"}
APP = "memstream-registry-test"


@pytest.fixture(scope="module")
def own():
    """A stack of this module's own (the devstack test's ports and lock), wiped before and after."""
    with own_stack(ENV, "registry-test-") as settings:
        yield settings


def subject_ids(s: Settings) -> dict[str, int]:
    with urllib.request.urlopen(s.registry_url + "/subjects", timeout=10) as r:
        subjects = json.load(r)
    out = {}
    for sub in subjects:
        with urllib.request.urlopen(f"{s.registry_url}/subjects/{sub}/versions/latest", timeout=10) as r:
            out[sub] = json.load(r)["id"]
    return out


def produce_candidates(s: Settings, factory: CodecFactory, user: str, n: int, start: int = 0) -> None:
    codec = factory.codec("candidate_memory")
    p = producer(s)
    for i in range(start, start + n):
        rec = candidate(user, f"c-{user}-{i}", 1_700_000_000_000 + i, f"{uuid.uuid4().hex} {uuid.uuid4().hex}")
        p.produce(catalog.MEMORY_CANDIDATES, key=encode_key(user), value=codec.encode(rec))
    assert p.flush(30) == 0


def fresh_factory(s: Settings, order: list[str] | None = None) -> CodecFactory:
    f = CodecFactory.from_url(s.registry_url)
    f.register(order or [t.name for t in catalog.topics()])
    return f


def ledger_of(s: Settings, user: str) -> list[dict]:
    return read_to_end(s, catalog.MEMORY_LEDGER, {user.encode()}, decode=False)


def dead_letters_of(s: Settings, user: str) -> list[dict]:
    return read_to_end(s, catalog.DLQ, {user.encode()}, decode=False)


def health(port: int) -> tuple[int, dict]:
    return http_get(port, "/health")


def wait_for(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def restart_registry(s: Settings, wipe_storage: bool = False) -> None:
    devstack.stop(s, devstack.REGISTRY)
    if wipe_storage:  # a registry reset: its storage emptied
        admin = AdminClient({"bootstrap.servers": s.broker})
        for fut in admin.delete_topics([t.name for t in catalog.REGISTRY_TOPICS], operation_timeout=30).values():
            fut.result()
        wait_for("the registry topics to go", lambda: not set(t.name for t in catalog.REGISTRY_TOPICS)
                 & set(admin.list_topics(timeout=10).topics))
    devstack.up(s)


def test_ids_survive_a_registry_restart_and_a_reset_stops_the_worker_without_dead_letters(own):
    s = own
    user = f"u-{uuid.uuid4().hex[:8]}"
    port = 26000 + PORT_OFFSET
    env = {**ENV, "MEMSTREAM_APP_ID": APP, "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_DATA_DIR": str(TEST_DATA / "registry-test-worker")}
    ids_before = subject_ids(s)
    with worker(s, "registry-test-worker", env=env) as proc:
        # phase 1: valid records and one bad one (the only dead letter)
        produce_candidates(s, fresh_factory(s), user, 20)
        p = producer(s)
        p.produce(catalog.MEMORY_CANDIDATES, key=encode_key(user), value=b"\x00\x00\x00\x00\x02garbage")
        assert p.flush(30) == 0
        wait_caught_up(s, APP, catalog.MEMORY_CANDIDATES)
        assert http_get(port, "/health/live")[0] == 200
        # its own threads are named in the OS (what `top -H` and the bench's per-thread CPU show)
        names = {(task / "comm").read_text().strip() for task in Path(f"/proc/{proc.pid}/task").iterdir()}
        assert {"ms-consumer", "ms-outputs", "ms-probe"} <= names, names

        # the registry hangs (paused: its port still accepts, nothing answers): /health names it
        # within about one health interval (1 s here), not after the client's timeouts (~2 minutes before)
        pid = devstack.REGISTRY.pid(s)
        assert pid is not None, "the registry of this test's stack is not running"
        os.kill(pid, signal.SIGSTOP)
        try:
            hung = time.monotonic()
            status, body = wait_for("registry_unreachable in /health while the registry hangs", lambda: (lambda h: h if any(
                p["reason"] == "registry_unreachable" for p in h[1]["problems"]) else None)(health(port)), timeout=15)
            named_after = time.monotonic() - hung
            assert status == 200 and body["status"] == "ready", body  # known schemas need no registry
            assert "has not answered for" in str(body["problems"]) or "timed out" in str(body["problems"]).lower(), body
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"\n[registry] a hung registry named on /health after {named_after:.1f} s", file=sys.stderr)
        wait_for("registry_unreachable to clear", lambda: (lambda h: h if not any(
            p["reason"] == "registry_unreachable" for p in h[1]["problems"]) else None)(health(port)), timeout=60)

        # the registry restarts (KafkaSQL storage): the worker is degraded meanwhile, then every id is kept
        devstack.stop(s, devstack.REGISTRY)
        status, body = wait_for("registry_unreachable in /health", lambda: (lambda h: h if any(
            p["reason"] == "registry_unreachable" for p in h[1]["problems"]) else None)(health(port)))
        assert status == 200 and body["status"] == "ready", body  # known schemas need no registry
        devstack.up(s)
        assert subject_ids(s) == ids_before

        # phase 2 with a new producer (registers again: the same ids)
        produce_candidates(s, fresh_factory(s), user, 20, start=20)
        wait_caught_up(s, APP, catalog.MEMORY_CANDIDATES)
        ledger = ledger_of(s, user)
        events = fresh_factory(s).codec("memory_event")
        formed = [r for r in ledger if events.decode(r["raw"])["event_type"] == "memory_formed"]
        assert len(formed) == 40  # every valid record applied
        deser = AvroDeserializer(SchemaRegistryClient({"url": s.registry_url}))
        ctx = SerializationContext(catalog.MEMORY_LEDGER, MessageField.VALUE)
        assert all(deser(r["raw"], ctx)["motebit_id"] == user for r in ledger)  # old and new, a standard client
        assert len(dead_letters_of(s, user)) == 1
        inspect = memstream("dlq", "inspect", "--json", env=env)
        assert [json.loads(line)["original_topic"] for line in inspect.stdout.splitlines()
                if json.loads(line)["key"] == user] == [catalog.MEMORY_CANDIDATES]

        # a registry reset: emptied, then ids handed out in another order
        restart_registry(s, wipe_storage=True)
        new = fresh_factory(s, [t.name for t in reversed(list(catalog.topics()))])
        assert new.schema_id("candidate_memory") != ids_before["memory.candidates.v1-value"]
        status, body = wait_for("registry_mismatch in /health", lambda: (lambda h: h if h[0] == 503 else None)(health(port)))
        assert body["status"] == "blocked" and [p["reason"] for p in body["problems"]][:1] == ["registry_mismatch"], body
        written = len(ledger_of(s, user))  # (a housekeeping sweep may have added to it since)
        produce_candidates(s, new, user, 10, start=40)
        time.sleep(3)  # the worker must NOT consume them: nothing to wait for but time
        assert len(dead_letters_of(s, user)) == 1  # no valid record dead-lettered
        assert len(ledger_of(s, user)) == written  # nothing applied with the wrong schema
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'memstream_health_problem{reason="registry_mismatch"} 1' in metrics
        log = (ROOT / ".memstream" / "test-logs" / "registry-test-worker.log").read_text()
        assert "no longer maps the schema ids this worker used" in log
        # the dead letters stay readable: the registry lost their id, the shipped schemas read them
        inspect = memstream("dlq", "inspect", "--json", env=env)
        assert [json.loads(line)["original_topic"] for line in inspect.stdout.splitlines()
                if json.loads(line)["key"] == user] == [catalog.MEMORY_CANDIDATES]

        proc.send_signal(signal.SIGTERM)  # honoured while blocked, within MEMSTREAM_SHUTDOWN_TIMEOUT_S
        assert proc.wait(30) in (0, EXIT_STOP_TIMEOUT)


def test_full_disk_stops_the_worker_naming_the_directory_and_a_restart_applies_everything(own):
    s = own
    user = f"d-{uuid.uuid4().hex[:8]}"
    app = f"{APP}-disk-{uuid.uuid4().hex[:6]}"
    data = TEST_DATA / "registry-test-disk"
    env = {**ENV, "MEMSTREAM_APP_ID": app, "MEMSTREAM_DATA_DIR": str(data)}
    full = {**env, "MEMSTREAM_MIN_FREE_DISK_BYTES": str(2 ** 62)}  # more than any disk has: "full"
    with pytest.raises(AssertionError, match=f"exited {EXIT_DISK_FULL}") as err:
        with worker(s, "registry-test-disk", env=full):  # its group starts at the current end
            pass
    assert f"data disk full: {data.resolve()}" in str(err.value)
    produce_candidates(s, fresh_factory(s), user, 5)
    with worker(s, "registry-test-disk", env=env):  # space freed: resumes where the group was
        wait_caught_up(s, app, catalog.MEMORY_CANDIDATES)
    events = fresh_factory(s).codec("memory_event")
    assert sum(events.decode(r["raw"])["event_type"] == "memory_formed" for r in ledger_of(s, user)) == 5
