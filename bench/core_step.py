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
import time

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory
from streams.core import UserMemory, process_candidate, process_event

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


class Tally:
    """A peer process's records, from the first one: the clock and the process CPU its result
    is measured from, and the one JSON line it prints last (read by bench_e2e.run_peer)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.n = 0
        self.t0 = self.cpu0 = 0.0

    def seen(self) -> bool:
        """Count one record; True when it is the last one."""
        if not self.n:
            self.t0, self.cpu0 = time.monotonic(), cpu_s()
        self.n += 1
        return self.n == self.count

    def result(self, undecodable: int = 0) -> str:
        seconds = time.monotonic() - self.t0 if self.n else 0.0
        cpu = cpu_s() - self.cpu0 if self.n else 0.0
        return json.dumps({"records": self.n, "seconds": seconds, "rate": self.n / seconds if seconds > 0 else 0.0,
                           "cpu_s": cpu, "cpu_ms_per_record": 1000 * cpu / max(1, self.n),
                           "undecodable": undecodable})
