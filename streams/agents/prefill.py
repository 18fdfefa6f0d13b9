"""Prefill: after every rebalance, load the local partitions' users into the memory cache in the
background, so that the first records of a user after a start or a partition move do not wait
for its rows to be read.

A user's state is read from its `memory-state` rows on first touch (streams/agents/memory_store.py):
a few milliseconds for a user with a full de-duplication window. Without a prefill the first
second of a worker's paced input paid that for every user it met, and its p99 (0.4-0.8 s) was
set by it (bench/RESULTS.md, issue 14). Here, once Faust has recovered the tables
(`on_rebalance_complete`), the users of each active partition are read in key order, in
slices of at most `SLICE_S` (see there) that hold the memory state's lock (a batch waits at most that long)
with the event loop free in between, until the loaded users' nodes reach MEMSTREAM_PREFILL_NODES
(capped at MEMSTREAM_LOADED_NODES_MAX, so that it evicts at most what its last user needs). A rebalance (or a stop)
abandons the pass; the next completed rebalance starts a new one. Users a record, a query or a
sweep loaded meanwhile are skipped; a user whose rows cannot be rebuilt is contained as on first
touch. Nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from streams.contracts import catalog

from . import state_scan

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

    from .memory_store import MemoryStore

log = logging.getLogger("memstream.memory")

#: longest one slice holds the memory state's lock, but for the skip scan that lists a
#: partition's users (one seek per user, at most as many users as the node limit leaves room for)
SLICE_S = 0.01
PAUSE_S = 0.002  #: the event loop's turn between two slices


class Prefill:
    """One worker's prefill passes (one per completed rebalance)."""

    def __init__(self, rt: Runtime, store: MemoryStore, owner_topic: str = catalog.MEMORY_CANDIDATES) -> None:
        self.rt, self.store, self.owner_topic = rt, store, owner_topic
        self.limit = min(rt.settings.prefill_nodes, rt.settings.loaded_nodes_max)
        self.generation = 0  #: completed rebalances so far
        self.recovering = True  #: between a rebalance's start and its completion: tables half recovered
        self._wake = asyncio.Event()
        #: the current pass: (its generation, partitions left, users left of the first of them)
        self._pass: tuple[int, list[int], list[str]] | None = None
        self.loaded = 0  #: users loaded by the current pass

    # signals (connected by `register`)
    async def on_rebalance_started(self, *args: Any, **kwargs: Any) -> None:
        self.recovering = True
        self._pass = None

    async def on_rebalance_complete(self, *args: Any, **kwargs: Any) -> None:
        self.recovering = False
        self.generation += 1
        self._wake.set()

    async def run(self) -> None:
        """The background loop (an app task): a pass after every completed rebalance."""
        if self.limit <= 0:
            return
        while True:
            await self._wake.wait()
            self._wake.clear()
            started, generation = time.monotonic(), self.generation
            self.loaded = 0
            while not self.recovering and self.generation == generation and not self.rt.draining:
                try:
                    async with self.store.lock:
                        more = self.step(generation, time.monotonic() + SLICE_S)
                except Exception:  # noqa: BLE001 - a prefill is an optimisation: users still load on first touch
                    log.exception("memory cache prefill failed; users are read on first touch instead")
                    self._pass = None
                    break
                if not more:
                    log.info("memory cache prefilled: %d users read (%d users, %d nodes loaded) in %.1fs",
                             self.loaded, len(self.store.users), self.store.users.total, time.monotonic() - started)
                    break
                await asyncio.sleep(PAUSE_S)

    def step(self, generation: int, deadline: float) -> bool:
        """One slice (the caller holds the store's lock): read users until `deadline`; False once
        the pass is over (every active partition read, or the cache holds `limit` nodes)."""
        if self.recovering or generation != self.generation:
            return False
        self.store.refresh()  # no batch is in flight (the lock is held): drops users read before the rebalance
        if self._pass is None or self._pass[0] != generation:
            partitions = sorted(self.rt.active_partitions(self.owner_topic))
            self._pass = (generation, partitions, [])
        _, partitions, users = self._pass
        while True:
            if self.store.users.total >= self.limit:
                return False
            if not users:
                if not partitions:
                    return False
                # every user weighs at least 1: more users than the room left could never be read
                room = self.limit - self.store.users.total
                users.extend(state_scan.partition_users(self.store.state, partitions.pop(0), self.rt.partition_of,
                                                        limit=room))
                users.reverse()  # popped from the end: key order
                continue
            if self.store.prefill_user(users.pop()):
                self.loaded += 1
            if time.monotonic() >= deadline:
                return True


def register(rt: Runtime, store: MemoryStore) -> Prefill:
    prefill = Prefill(rt, store)
    rt.app.on_partitions_revoked.connect(prefill.on_rebalance_started)
    rt.app.on_partitions_assigned.connect(prefill.on_rebalance_started)
    rt.app.on_rebalance_complete.connect(prefill.on_rebalance_complete)
    rt.app.task(prefill.run)
    return prefill
