"""The per-record work of the e2e bench's peers (bench/quix_peer.py's Quix Streams application,
bench/peers.py's plain confluent-kafka loop and minimal Faust agent, and bench_e2e's core-alone
run), and the one result line every peer process prints.

Two kinds of work, the rows of issue 14's table:

* ``core``: one input record through memstream's own core, nothing around it (`run_core`): decode
  with memstream's codec, `process_candidate` / `process_event` on the user's `UserMemory` (one per
  user in a dict: no changelog, the cheapest state there is), the ledger events sent as JSON;
* ``counter``: a per-user counter in the framework's own state (a dict for the plain loop, a
  Table for Faust, RocksDB state for Quix Streams), the count sent as JSON: what the framework
  costs with (almost) no work of its own.
"""

from __future__ import annotations

import json
import resource
from typing import Any

from streams.contracts import catalog
from streams.core import UserMemory, process_candidate, process_event

WORKS = ("core", "counter")


def run_core(codecs: dict[str, Any], users: dict[str, UserMemory], topic: str, key: str, value: bytes) -> list:
    """Decode `value` with memstream's codec for `topic`, run `process_candidate` /
    `process_event` on the user's `UserMemory` (made on first use in `users`) and return the
    ledger events (none for the other input topics, decoded only). Raises ValueError (the codec's
    errors) for a value that does not decode."""
    record = codecs[topic].decode(value)
    if topic not in (catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS):
        return []
    um = users.get(key)
    if um is None:
        um = users[key] = UserMemory(key)
    return (process_candidate if topic == catalog.MEMORY_CANDIDATES else process_event)(um, record).ledger


def cpu_s() -> float:
    """CPU seconds of this process so far (every thread: librdkafka's, Faust's fetch thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def result_line(records: int, seconds: float, cpu: float, undecodable: int = 0) -> str:
    """The JSON line a peer process prints last (read by bench_e2e.run_peer)."""
    return json.dumps({"records": records, "seconds": seconds, "rate": records / seconds if seconds > 0 else 0.0,
                       "cpu_s": cpu, "cpu_ms_per_record": 1000 * cpu / max(1, records), "undecodable": undecodable})
