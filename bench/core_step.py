"""The per-record work of the e2e bench's peers (bench/quix_peer.py's Quix Streams application,
bench/peers.py's plain confluent-kafka loop and minimal Faust agent, and bench_e2e's core-alone
run), and what every peer process measures and prints (`Tally`).

Two kinds of work, the rows of issue 14's table:

* ``core``: one input record through memstream's own core, nothing around it (`CoreWork`): decode
  with memstream's codec, `process_candidate` / `process_event` on the user's `UserMemory` (one per
  user in a dict: no changelog, the cheapest state there is), the ledger events sent as JSON;
* ``counter``: a per-user counter in the framework's own state (a dict for the plain loop, a
  Table for Faust, RocksDB state for Quix Streams), the count sent as JSON: what the framework
  costs with (almost) no work of its own.
"""

from __future__ import annotations

import json
import resource
import threading
import time
from pathlib import Path

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory
from streams.core import UserMemory, process_candidate, process_event
from streams.tools.kafkatools import stat_cpu_seconds

WORKS = ("core", "counter")


class CoreWork:
    """The ``core`` work, one input record through memstream's own core and nothing around it:
    ``work(topic, key, value)`` decodes `value` with memstream's codec for `topic`, runs
    `process_candidate` / `process_event` on the user's `UserMemory` (made on first use) and
    returns the ledger events (none for the other input topics, decoded only). A value that does
    not decode (the codec's ValueError) returns none and is counted in `undecodable`."""

    def __init__(self, registry_url: str, topics: list[str]) -> None:
        factory = CodecFactory.from_url(registry_url)
        self.codecs = {t: factory.codec(catalog.topic(t).value_schema) for t in topics}
        self.users: dict[str, UserMemory] = {}
        self.undecodable = 0

    def __call__(self, topic: str, key: str, value: bytes) -> list:
        try:
            record = self.codecs[topic].decode(value)
        except ValueError:
            self.undecodable += 1
            return []
        if topic not in (catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS):
            return []
        um = self.users.get(key)
        if um is None:
            um = self.users[key] = UserMemory(key)
        return (process_candidate if topic == catalog.MEMORY_CANDIDATES else process_event)(um, record).ledger


def cpu_s() -> float:
    """CPU seconds of this process so far (every thread: librdkafka's, Faust's fetch thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def thread_cpu(pid: int | str = "self") -> dict[int, tuple[str, float]]:
    """Each live thread of a process: tid -> (its name, the CPU seconds it has used so far), from
    /proc (librdkafka names its threads `rdk:…`, RocksDB `rocksdb:…`; Python's keep the process's)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = ((task / "comm").read_text().strip(), stat_cpu_seconds(task / "stat"))
        except OSError:  # the thread ended meanwhile
            continue
    return out


def thread_kinds(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], main: int,
                 process_cpu_s: float) -> dict[str, float]:
    """CPU seconds between two `thread_cpu` readings by kind of thread: main, librdkafka,
    RocksDB, a memstream worker's named threads (`ms-consumer`, `ms-outputs`, …:
    streams/runtime/thread_names.py), other Python threads, and what threads that ended
    meanwhile used (the process's CPU less all the others)."""
    kinds = {"main": 0.0, "librdkafka": 0.0, "rocksdb": 0.0, "python": 0.0}
    for tid, (comm, cpu) in after.items():
        used = cpu - before.get(tid, (comm, 0.0))[1]
        kind = "main" if tid == main else "librdkafka" if comm.startswith("rdk:") else \
            "rocksdb" if comm.startswith("rocksdb") else comm if comm.startswith("ms-") else "python"
        kinds[kind] = kinds.get(kind, 0.0) + used
    kinds["ended"] = max(0.0, process_cpu_s - sum(kinds.values()))
    return kinds


class Tally:
    """A peer process's records, from the first one: the clock and the process CPU its result
    is measured from, and the one JSON line it prints last (read by bench_e2e.run_peer)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.n = 0
        self.t0 = self.cpu0 = 0.0
        self.threads0: dict[int, tuple[str, float]] = {}

    def seen(self) -> bool:
        """Count one record; True when it is the last one."""
        if not self.n:
            self.t0, self.cpu0 = time.monotonic(), cpu_s()
            self.threads0 = thread_cpu()
        self.n += 1
        return self.n == self.count

    def result(self, undecodable: int = 0) -> str:
        seconds = time.monotonic() - self.t0 if self.n else 0.0
        cpu = cpu_s() - self.cpu0 if self.n else 0.0
        # each kind of thread's share (a peer counts and reports from its main thread)
        threads = thread_kinds(self.threads0, thread_cpu(), threading.get_native_id(), cpu) if self.n else {}
        return json.dumps({"records": self.n, "seconds": seconds, "rate": self.n / seconds if seconds > 0 else 0.0,
                           "cpu_s": cpu, "cpu_ms_per_record": 1000 * cpu / max(1, self.n),
                           "threads_cpu_s": threads,
                           "undecodable": undecodable})
