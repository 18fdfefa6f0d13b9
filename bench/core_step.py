"""The per-record work of the e2e bench's peers (bench/quix_peer.py's Quix Streams application and
bench_e2e's core-alone run): one input record through memstream's own core, nothing around it."""

from __future__ import annotations

from typing import Any

from streams.contracts import catalog
from streams.core import UserMemory, process_candidate, process_event


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
