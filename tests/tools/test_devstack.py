"""`memstream dev` and `memstream topics apply` against a real broker and registry.

This test runs a second, throw-away stack on its own ports so it can stop it and check that
nothing is left behind, without disturbing the session's stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import socket
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from streams.contracts import catalog
from tests.conftest import PORT_OFFSET, ROOT, WORKER_SUFFIX, memstream

pytestmark = pytest.mark.kafka

BROKER_PORT, REGISTRY_PORT = 24092 + PORT_OFFSET, 23081 + PORT_OFFSET
OWN = {
    "MEMSTREAM_BROKER": f"127.0.0.1:{BROKER_PORT}",
    "MEMSTREAM_CONTROLLER_PORT": str(BROKER_PORT + 1),
    "MEMSTREAM_REGISTRY_URL": f"http://127.0.0.1:{REGISTRY_PORT}/apis/ccompat/v7",
    "MEMSTREAM_STACK_DIR": str(ROOT / ".memstream" / f"devstack-test{WORKER_SUFFIX}"),
}


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pids() -> list[int]:
    stack = Path(OWN["MEMSTREAM_STACK_DIR"])
    return [int(p.read_text()) for p in stack.glob("*.pid")]


@contextlib.contextmanager
def own_ports():
    """Holds the lock of the OWN ports (one stack at a time on them, across test sessions)."""
    path = ROOT / ".memstream" / f"devstack-test{WORKER_SUFFIX}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def own_stack(env: dict[str, str], data_prefix: str, apply_topics: bool = True):
    """A throw-away stack on the OWN ports (`env` on top of OWN), wiped before and after, with
    the local tables of its workers (TEST_DATA/<data_prefix>*) removed first: they refer to the
    broker it wipes. Yields its Settings."""
    from streams.settings import Settings
    from tests.conftest import TEST_DATA

    with own_ports():
        memstream("dev", "down", "--wipe", env=env, check=False)
        for d in TEST_DATA.glob(f"{data_prefix}*"):
            shutil.rmtree(d)
        memstream("dev", "up", env=env)
        if apply_topics:
            memstream("topics", "apply", env=env)
        try:
            yield Settings.from_env(env)
        finally:
            memstream("dev", "down", "--wipe", env=env, check=False)


@pytest.fixture
def own_stack_lock():
    """Serializes this test across concurrent test sessions (it owns its stack's ports)."""
    with own_ports():
        yield


def test_up_is_idempotent_topics_apply_reports_drift_and_down_leaves_nothing(own_stack_lock):
    memstream("dev", "down", "--wipe", env=OWN, check=False)
    first = memstream("dev", "up", env=OWN)
    assert "stack up" in first.stdout
    pids = _pids()
    assert len(pids) == 2 and all(Path(f"/proc/{p}").exists() for p in pids)
    assert memstream("dev", "status", env=OWN).returncode == 0

    again = memstream("dev", "up", env=OWN)
    assert "already up" in again.stdout
    assert _pids() == pids  # nothing new started

    # A topic created by hand with the wrong partition count and cleanup policy is drift.
    admin = AdminClient({"bootstrap.servers": OWN["MEMSTREAM_BROKER"]})
    admin.create_topics([NewTopic("memory.nodes.v1", 1, 1, config={"cleanup.policy": "delete"})])["memory.nodes.v1"].result()
    for _ in range(2):  # idempotent: the second apply creates nothing and reports the same drift
        res = memstream("topics", "apply", env=OWN, check=False)
        assert res.returncode == 1
        assert "DRIFT    memory.nodes.v1: partition count is 1, catalog says 4" in res.stderr
        assert "DRIFT    memory.nodes.v1: cleanup.policy is delete, catalog says compact" in res.stderr
    assert "created" not in res.stdout and "exists   memory.events.v1" in res.stdout

    memstream("dev", "down", "--wipe", env=OWN)
    assert not any(Path(f"/proc/{p}").exists() and b"java" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)
    assert not _port_open(BROKER_PORT) and not _port_open(REGISTRY_PORT)
    assert _pids() == []
    assert memstream("dev", "status", env=OWN, check=False).returncode == 1


def test_topics_apply_twice_is_idempotent(stack):
    second = memstream("topics", "apply")
    assert "created" not in second.stdout
    assert second.stdout.count("exists") == len(list(catalog.topics()))


def test_worker_refuses_to_start_without_topics():
    env = {**OWN, "MEMSTREAM_BROKER": "127.0.0.1:1"}
    res = memstream("worker", env=env, check=False, timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith("memstream: error: cannot reach Kafka at 127.0.0.1:1")
    assert "Traceback" not in res.stderr


def test_kafka_cluster_ids_never_look_like_options():
    from streams.tools.devstack import _kafka_cluster_id

    ids = {_kafka_cluster_id() for _ in range(2000)}  # ~1 in 64 raw ids starts with "-"
    assert len(ids) == 2000 and not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids)


def test_kafka_jvm_options_split_like_a_shell_line_and_a_broken_line_is_named():
    from streams.tools.devstack import StackError, _jvm_options

    assert _jvm_options("-Xmx1g  -Dx='a b'") == ["-Xmx1g", "-Dx=a b"]
    with pytest.raises(StackError, match="MEMSTREAM_KAFKA_JVM_OPTIONS cannot be split"):
        _jvm_options("-Dx='unclosed")


def test_the_suites_broker_runs_with_the_light_jvm_options(stack):
    """The session's broker was started with the suite's options (C1 only, serial collector)."""
    pid = int((Path(stack.stack_dir) / "kafka.pid").read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"-XX:TieredStopAtLevel=1" in argv and b"-XX:+UseSerialGC" in argv
    assert b"-XX:+UseG1GC" not in argv
