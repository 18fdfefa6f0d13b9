"""Test fixtures.

Tests that need Kafka use a stack of their own: its own ports and stack dir, started with the
project's own `memstream dev up` (same code the README uses), wiped at the start of the session
so every run sees a fresh broker and registry, and stopped at the end. Pure tests never touch it.

`make test` runs the suite in parallel processes (pytest-xdist `-n N`, workers `gw0`…): each
process is a session of its own, with its own stack (ports shifted by `WORKER_PORT_STEP` per
worker, its own stack, data and lock paths), so a Kafka test never shares a broker with a test
running at the same moment — one that restarts the broker or counts a topic's records sees only
its own process's tests, as in a serial run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Shift every port the suite uses (stack and workers) so two checkouts can test side by side;
#: every port stays below 32768 (Linux hands out ports above it to outgoing connections).
BASE_PORT_OFFSET = int(os.environ.get("MEMSTREAM_TEST_PORT_OFFSET", "0"))
if not 0 <= BASE_PORT_OFFSET <= 2000:
    raise SystemExit("MEMSTREAM_TEST_PORT_OFFSET must be between 0 and 2000")
#: this process under pytest-xdist (`gw3` → 3), else 0; and how many there are
WORKER_ID = os.environ.get("PYTEST_XDIST_WORKER", "")
WORKER_INDEX = int(WORKER_ID[2:]) if WORKER_ID.startswith("gw") and WORKER_ID[2:].isdigit() else 0
WORKER_COUNT = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
WORKER_PORT_STEP = 10  #: a stack's ports (broker, controller, registry) per parallel worker
if WORKER_INDEX >= 32:
    raise SystemExit("at most 32 parallel test workers (pytest -n)")
#: this process's stack ports: the checkout's offset, then a step per parallel worker
PORT_OFFSET = BASE_PORT_OFFSET + WORKER_PORT_STEP * WORKER_INDEX
#: this process's own paths under .memstream/ (stack, data, locks): `-gw3`, or nothing alone
WORKER_SUFFIX = f"-{WORKER_ID}" if WORKER_ID else ""

TEST_ENV = {
    "MEMSTREAM_BROKER": f"127.0.0.1:{29092 + PORT_OFFSET}",
    "MEMSTREAM_CONTROLLER_PORT": str(29093 + PORT_OFFSET),
    "MEMSTREAM_REGISTRY_URL": f"http://127.0.0.1:{28081 + PORT_OFFSET}/apis/ccompat/v7",
    "MEMSTREAM_STACK_DIR": str(ROOT / ".memstream" / f"test-stack{WORKER_SUFFIX}"),
    "MEMSTREAM_PARTITIONS": "4",
    # the production store: tables are serialized (every read is a new object) and recover from
    # local RocksDB + changelog. memory:// hands out shared objects, which hid issue 17's race.
    "MEMSTREAM_STORE": "rocksdb://",
    # the suite starts workers by the hundred and few of them meet a user large enough for the
    # core's compiled loops: each start skips their warm-up (~1 s of CPU); a batch that needs them
    # loads them then. The warm-up itself: tests/core/test_warmup.py.
    "MEMSTREAM_WARM_UP": "false",
    # a broker that lives minutes: C1 only and the serial collector, half its CPU (start-up JIT and
    # G1's threads) on the 2-vCPU machine the suite must fit in 10 minutes on
    "MEMSTREAM_KAFKA_JVM_OPTIONS": "-Xms256m -Xmx1g -XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}
#: Every worker's data dir (RocksDB tables) lives under here, one per worker (tests/kafka_util.py
#: `worker`, tests/system/test_faults_kafka.py `Fleet`); wiped with the broker at the start of a session:
#: a local store's offsets refer to the broker it was filled from.
TEST_DATA = ROOT / ".memstream" / f"test-data{WORKER_SUFFIX}"


def memstream(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
              check: bool = True) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would)."""
    full_env = {**os.environ, **TEST_ENV, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "streams", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"memstream {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def settings():
    from streams.settings import Settings

    return Settings.from_env(TEST_ENV)


@pytest.fixture(scope="session")
def stack(settings):
    """A fresh local Kafka + registry for this test session.

    An exclusive lock serializes test sessions that need the stack (two pytest runs on one
    machine would otherwise wipe each other's broker)."""
    lock_path = ROOT / ".memstream" / f"test-stack{WORKER_SUFFIX}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        memstream("dev", "down", "--wipe", check=False)
        shutil.rmtree(TEST_DATA, ignore_errors=True)
        started = time.monotonic()
        memstream("dev", "up")
        print(f"\n[stack] test stack up in {time.monotonic() - started:.1f}s", file=sys.stderr)
        memstream("topics", "apply")
        try:
            yield settings
        finally:
            _record_largest(settings)
            memstream("dev", "down", check=False)


def _record_largest(settings) -> None:
    """Before the stack goes: the largest table row (changelog record) and dead letter the suite
    produced, for the record (`test-artifacts/largest-records.txt`; issue #12's closing note)."""
    from confluent_kafka.admin import AdminClient

    from streams.contracts import catalog
    from streams.tools import kafkatools

    try:
        names = AdminClient({"bootstrap.servers": settings.broker}).list_topics(timeout=10).topics
        topics = [t for t in names if t.endswith("-changelog")] + [catalog.DLQ]
        sizes = kafkatools.largest_records(settings, topics)
    except Exception as exc:  # noqa: BLE001 - a measurement, never a test failure
        print(f"\n[stack] largest records not measured: {exc}", file=sys.stderr)
        return
    row = max(((s, t, w) for t, (s, w) in sizes.items() if t != catalog.DLQ), default=(0, "-", "-"))
    dlq = sizes.get(catalog.DLQ, (0, "-"))
    line = (f"{time.strftime('%Y-%m-%d %H:%M')} largest table row {row[0]} bytes ({row[1]} {row[2]}); "
            f"largest dead letter {dlq[0]} bytes ({dlq[1]}); {len(topics) - 1} changelogs")
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with open(artifacts / "largest-records.txt", "a") as f:
        f.write(line + "\n")
    print(f"\n[stack] {line}", file=sys.stderr)


@pytest.fixture
def unique():
    """A short unique suffix for keys/group ids, so tests sharing the broker never collide."""
    return uuid.uuid4().hex[:10]


FAULT_SUITE_ENV = "MEMSTREAM_FAULT_SUITE"


#: Tests that take minutes (fleets, stacks of their own, client builds), with rough weights in
#: seconds on the 2-vCPU VM: under pytest-xdist they start first, one share per process, so
#: none of them begins last and stretches the run (`_long_tests_first`). A module with a
#: module-scoped stack of its own is one unit (its tests stay together).
LONG_TESTS: dict[str, int] = {
    "tests/tools/test_repartition_kafka.py": 300,
    "tests/system/test_faults_kafka.py::test_sigkill_and_restart_several_times_mid_stream": 120,
    "tests/system/test_faults_kafka.py::test_worker_added_and_removed_while_records_flow": 100,
    "tests/system/test_faults_kafka.py::test_broker_restart_mid_stream": 100,
    "tests/system/test_faults_kafka.py::test_failover_to_a_standby_replica": 90,
    "tests/examples/test_examples_kafka.py": 120,
    "tests/system/test_samejob_kafka.py": 120,
    "tests/system/test_poison_kafka.py::test_poison_records_among_valid_ones_on_two_workers": 120,
    "tests/runtime/test_registry_kafka.py": 120,
}


def _long_tests_first(items: list, workers: int) -> list:
    """The order in which pytest-xdist's worksteal scheduler hands each process, at the start, one
    contiguous share of the collection (process i gets the next `pending // (workers - i)`
    items), with the long tests spread over the shares' heads (heaviest first, to the lightest
    share) and every other test after them in collection order. Every process computes the same
    order (collection must agree)."""
    def unit(item) -> str | None:
        path = item.nodeid.split("::", 1)[0]
        return item.nodeid if item.nodeid in LONG_TESTS else path if path in LONG_TESTS else None

    long_units: dict[str, list] = {}
    rest = []
    for item in items:
        u = unit(item)
        (long_units.setdefault(u, []) if u is not None else rest).append(item)
    if not long_units:
        return items
    heads: list[list] = [[] for _ in range(workers)]
    load = [0] * workers
    for u in sorted(long_units, key=lambda u: (-LONG_TESTS[u], u)):
        i = load.index(min(load))
        heads[i] += long_units[u]
        load[i] += LONG_TESTS[u]
    out, pending = [], len(items)
    for i in range(workers):
        share = pending // (workers - i)
        fill = max(0, share - len(heads[i]))
        out += heads[i] + rest[:fill]
        del rest[:fill]
        pending -= len(heads[i]) + fill
    return out + rest


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the long tests first (`_long_tests_first`).

    The fault suite (tests/system/test_faults_kafka.py, marker `faults`) runs with the rest
    (issue 12 item 6: the four Faust paths that committed across unapplied records are closed,
    docs/state-and-failures.md §5). It takes ~6-10 minutes; `MEMSTREAM_FAULT_SUITE=0` skips it
    for a quicker local run (`make test-faults` runs it alone)."""
    if WORKER_COUNT > 1:
        items[:] = _long_tests_first(items, WORKER_COUNT)
    if os.environ.get(FAULT_SUITE_ENV, "1") != "0":
        return
    skip = pytest.mark.skip(reason=f"fault suite skipped by {FAULT_SUITE_ENV}=0")
    for item in items:
        if "faults" in item.keywords:
            item.add_marker(skip)
