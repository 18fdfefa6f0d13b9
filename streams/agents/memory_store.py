"""The memory agent's durable state and the per-user state derived from it (`MemoryStore`).


Durable state: ONE table, `memory-state`, so that all of a user's rows share one changelog
partition and keep their write order: key `motebit_id` → the user's aux row (clock, the open
tail of the de-duplication window, and `pending`: the other rows of the last write batch, a redo
log), key `motebit_id/node_id` → a live node row, key `motebit_id/~h/node_id` → a closed
(superseded) node row, read on demand (`StoredHistory`), key `motebit_id/~seen/k` → sealed chunk k of the
de-duplication window (so a write does not carry the whole window), and one small side row per
deleted node id (`~del/<id>`), deleted content fingerprint (`~fp/<sha256>`) and pin
(`~pin/<node_id>`), so that no row grows with a user's history (the layout is defined, read and
laid out in `streams.agents.user_cache`; the core's `UserMemory` knows no keys). The per-user `UserMemory` with its
similarity index is derived: read from that user's rows on first touch (a prefix scan of its
partition's RocksDB: `streams.agents.state_scan`) into an LRU bounded by MEMSTREAM_LOADED_NODES_MAX
(`streams.agents.user_cache`), and dropped at every rebalance (so after a restart or a partition
move a user is read again from the recovered changelog, when it is next needed).

Write order (streams/runtime/checkpoint.py): a batch's outputs are sent and acknowledged first; then the
aux rows, then the node rows. So "the input is marked seen" implies "its outputs are durable",
and an aux row in the changelog without the node rows after it is completed from `pending`. A
crash re-processes the unwritten part of a batch with the same derived ids.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from streams.core import Outcome, UserMemory
from streams.core.redaction import threshold_for
from streams.runtime import checkpoint, faust_internals

from . import memory_step, state_scan
from .user_cache import HISTORY_KEY, UserCache, chunk_rows, deletion_rows, load_user, node_rows, side_rows

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.memory")

NODE_KEY_SEP = "/"
STATE_TABLE = "memory-state"  #: motebit_id -> aux row (with `pending`); motebit_id/node_id -> node row
NEGOTIATOR_TABLE = "negotiator"  #: user_id -> the negotiator's memories of that user
RELAY_POLICY_TABLE = "relay-policy"  #: motebit_id -> consented relay threshold (written by streams/agents/relay_policy.py)



def _redo_entry(staged: Any) -> Any:
    """A staged row as the aux row's redo log holds it: None for a deletion; a row staged encoded
    (bytes of the table's JSON) embedded as it is (`orjson.Fragment`: the aux row's encoding
    copies it), so a node row is encoded once, not once more inside its aux row."""
    if staged is checkpoint.DELETE:
        return None
    if isinstance(staged, (bytes, bytearray)):
        return orjson.Fragment(bytes(staged))
    return staged


def node_key(motebit_id: str, node_id: str) -> str:
    """The key of a user's row: `<motebit_id>/<rest>`. Collision-free because a user id can never
    contain the separator (validated at ingest: `streams.core.ingest`), so the first `/` always
    ends the user id; `rest` (a node id, or an internal row's suffix: `streams.agents.user_cache`) may contain
    anything."""
    return f"{motebit_id}{NODE_KEY_SEP}{node_id}"


def row_owner(key: str) -> str:
    """The user a `memory-state` row belongs to (the table's owner rule): the key up to its first
    `/` (`node_key`), the whole key for the user's aux row."""
    return key.split(NODE_KEY_SEP, 1)[0]


class StoredHistory:
    """A user's closed nodes as `memory-state` holds them (`<user>/~h/<node_id>`), read on demand
    (`streams.core.state.HistoryReader`); a node it lost or holds unreadable contains the user
    (`MemoryStore.contain`), as a row that cannot be read when the user is loaded does."""

    def __init__(self, store: MemoryStore, user: str, partition: int) -> None:
        self.store, self.user, self.partition = store, user, partition

    def get(self, node_id: str) -> Any:
        self.store.rt.count("memory_history_reads:node")
        return state_scan.user_row(self.store.state, node_key(self.user, HISTORY_KEY + node_id), self.partition)

    def all(self) -> list[tuple[str, Any]]:
        self.store.rt.count("memory_history_reads:range")
        skip = len(node_key(self.user, HISTORY_KEY))
        return [(key[skip:], row) for key, row in state_scan.user_history(self.store.state, self.user, self.partition)]

    def lost(self, node_id: str, why: str) -> None:
        self.store.contain(self.user, f"closed node {node_id[:200]!r}: {why}")


class UserContained(Exception):
    """The user's durable rows could not be rebuilt on this worker (see `MemoryStore._rebuild`)."""

    def __init__(self, motebit_id: str, why: str) -> None:
        super().__init__(memory_step.contained(why))
        self.motebit_id = motebit_id


class MemoryStore:
    """The partition-local memory state of this worker: the tables, and the per-user
    `UserMemory` derived from them, loaded on first touch into a bounded LRU
    (`streams.agents.user_cache`; bound: MEMSTREAM_LOADED_NODES_MAX).

    A user is loaded from its own rows only (`state_scan.user_rows`: a prefix scan of its
    partition's RocksDB) when a record, a housekeeping sweep or an HTTP query first needs it.
    Nothing is read at a rebalance: it only drops the loaded users (`_on_rebalance`), so a
    restarted worker is ready as soon as Faust has restored the changelog."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.state = rt.table(STATE_TABLE)  # motebit_id -> aux row; motebit_id/node_id -> node row
        self.negotiator = rt.table(NEGOTIATOR_TABLE)
        self.relay_policy = rt.table(RELAY_POLICY_TABLE)  # motebit_id -> consented threshold
        #: motebit_id -> its relay-policy row (None: no override), read once per user: the table's
        #: one writer (the relay-policy agent) drops a user's entry when it writes, a rebalance all
        self.relay_overrides: dict[str, Any] = {}
        self.lock = asyncio.Lock()  # one writer at a time: the agent's batches, the timer's sweeps
        self.users = UserCache(rt.settings.loaded_nodes_max)
        self.redo: dict[str, dict[str, Any]] = {}  # loaded user -> redo-log rows not yet rewritten
        self.corrupt: dict[str, str] = {}  # user -> why its rows could not be rebuilt (contained)
        self.foreign: dict[str, int] = {}  # user -> rows under its keys owned by another user
        self.index_config = rt.settings.index_config()
        self.valid = False
        rt.app.on_partitions_assigned.connect(self._on_rebalance)
        rt.app.on_partitions_revoked.connect(self._on_rebalance)
        # and again once the new partitions' changelogs are recovered (a user loaded in
        # between, e.g. by an HTTP query, may have been read from a half-recovered table)
        rt.app.on_rebalance_complete.connect(self._on_rebalance)

    async def _on_rebalance(self, *args: Any, **kwargs: Any) -> None:
        self.valid = False
        self.relay_overrides.clear()

    def relay_threshold(self, motebit_id: str) -> str:
        """`threshold_for` the user (its override, else MEMSTREAM_RELAY_THRESHOLD), without a
        table read per record."""
        if motebit_id not in self.relay_overrides:
            self.relay_overrides[motebit_id] = self.relay_policy.get(motebit_id)
        override = self.relay_overrides[motebit_id]
        return threshold_for(motebit_id, None if override is None else {motebit_id: override},
                             self.rt.settings.relay_threshold)

    # DerivedCache (streams.runtime.checkpoint): `refresh` before every batch attempt (the previous one is
    # written, or dropped by `invalidate`), `invalidate` after a failed attempt.
    def refresh(self) -> None:
        if not self.valid:
            self._reset()
        else:
            for user in self.users.pinned:  # the batch is written: its closed nodes are in the table
                um = self.users.peek(user)
                if um is not None and user not in self.redo:
                    um.closed.release()
            self._forget(self.users.unpin_all())
            self._gauges()  # the users the last batch grew, re-weighed: the gauge is the bound's figure

    def invalidate(self) -> None:
        """The failed attempt's effects are in the users it touched (pinned): drop those, they
        are loaded again from the table; every other loaded user is as the table has it."""
        pinned = list(self.users.pinned)
        self.users.drop(pinned)
        self._forget(pinned, evicted=False)

    def _reset(self) -> None:
        """Forget every loaded user (after a rebalance): each is read again on first touch."""
        self.users.clear()
        self.redo.clear()
        self.corrupt.clear()
        self.foreign.clear()
        self.valid = True
        self._gauges()

    def _forget(self, users: list[str], evicted: bool = True) -> None:
        if users and evicted:
            self.rt.count("memory_users:evicted", len(users))
        for u in users:
            self.redo.pop(u, None)  # the aux row still has it: read again with the user

    def _gauges(self) -> None:
        self.rt.metrics.set_gauge("memory_users_contained", len(self.corrupt))
        self.rt.metrics.set_gauge("memory_foreign_rows", sum(self.foreign.values()))
        self.rt.metrics.set_gauge("memory_users_loaded", len(self.users))
        self.rt.metrics.set_gauge("memory_nodes_loaded", self.users.total)

    def _readable(self) -> None:
        # A reader outside a batch (HTTP) drops stale users; inside one the loaded users stay
        # (the batch's own hold its effects not yet in the tables).
        if not self.valid and not self.lock.locked():
            self._reset()

    def _load(self, motebit_id: str, rows: list | None = None) -> tuple[UserMemory | None, dict]:
        """Read a user from its rows: its state and the redo log of its aux row, or (None, {})
        for a user whose rows cannot be rebuilt (contained: recorded in `corrupt`). Not cached."""
        partition = self.rt.partition_of(motebit_id)
        if rows is None:
            rows = state_scan.user_rows(self.state, motebit_id, partition, history=False)
        loaded = load_user(motebit_id, rows, dedup_max_ids=self.rt.settings.dedup_max_ids,
                           index_config=self.index_config, history=StoredHistory(self, motebit_id, partition))
        if loaded.foreign:
            if motebit_id not in self.foreign:
                log.warning("memory state of %r: skipped %d rows whose owner differs from their key (left by a "
                            "version that allowed %r in ids; see docs/operations.md, 'State written by an earlier version')",
                            motebit_id[:200], loaded.foreign, NODE_KEY_SEP)
            self.foreign[motebit_id] = loaded.foreign
        if loaded.memory is None:
            self.contain(motebit_id, loaded.corrupt or "unreadable rows")
        return loaded.memory, loaded.redo

    def containment(self, motebit_id: str) -> UserContained:
        """The error of a contained user (its records' dead letters, its queries' 503)."""
        return UserContained(motebit_id, self.corrupt.get(motebit_id, "unreadable rows"))

    def contain(self, motebit_id: str, why: str) -> None:
        """The user's rows cannot be rebuilt (or, read later, a node of its history): its records
        are dead-lettered (`UserContained`) and its queries answer 503 until an operator repairs
        the rows; every other user is served. A loaded copy is dropped (a batch attempt that held
        it fails with the error that contained it, and is applied again without it)."""
        self.users.drop([motebit_id])
        self.redo.pop(motebit_id, None)
        if motebit_id not in self.corrupt:
            log.error("memory state of user %r cannot be rebuilt (%s): its records are dead-lettered and its "
                      "queries answer 503 until the rows are repaired", motebit_id[:200], why)
        self.corrupt[motebit_id] = why
        self._gauges()

    def _keep(self, motebit_id: str, um: UserMemory, redo: dict, pin: bool) -> None:
        """Cache a loaded user with its redo log (rewritten by its next write: `stage`); `pin`
        (for a batch attempt) keeps it until the attempt is written."""
        self.rt.count("memory_users:loaded")
        self._forget(self.users.put(motebit_id, um, pin=pin))
        if redo:
            self.redo[motebit_id] = redo
        self._gauges()

    def user(self, motebit_id: str, cp: checkpoint.Checkpoint | None = None) -> UserMemory:
        """The user's state (loaded on first touch); raises `UserContained` for a user whose rows
        could not be rebuilt. For a batch attempt (`cp`, which the caller will change the user
        through) the user is pinned until the attempt is written."""
        self._readable()
        if motebit_id in self.corrupt:
            raise self.containment(motebit_id)
        um = self.users.get(motebit_id, pin=cp is not None)
        if um is None:
            um, redo = self._load(motebit_id)
            if um is None:
                raise self.containment(motebit_id)
            self._keep(motebit_id, um, redo, pin=cp is not None)
        return um

    def prefill_user(self, motebit_id: str) -> bool:
        """Load a user that is not loaded yet, without a record asking for it (`streams.agents.prefill`;
        the caller holds `lock`): False when it is loaded already, or contained."""
        if motebit_id in self.users or motebit_id in self.corrupt:
            return False
        um, redo = self._load(motebit_id)
        if um is None:
            return False
        self._keep(motebit_id, um, redo, pin=False)
        self.rt.count("memory_users:prefilled")
        return True

    def partition_users(self, partition: int, wanted: Callable[[list], bool] | None = None, after: str | None = None,
                        users: Callable[[Callable[[], list[str]]], list[str]] | None = None
                        ) -> Iterator[tuple[str, UserMemory | None, dict | None, int]]:
        """`(user, state, redo, rows)` of every user of a local partition in user-id order
        (after `after`, when given), for a sweep; `rows`: how many rows were read for it. A loaded
        user comes as it is (redo None); any other is read from the table one at a time, skipped
        (state None) unless `wanted(rows)`, and *not* cached, so a sweep does not flush the LRU:
        `keep(user, state, redo)` caches one that the sweep changes. Contained users are skipped.
        `users(list_them)`: the partition's users (sorted) from a listing the caller keeps
        (`SweepSlices.users`), `list_them()` listing them anew."""
        self._readable()
        listed = None if users is None else users(
            lambda: state_scan.partition_users(self.state, partition, self.rt.partition_of))
        for user, rows in state_scan.users_rows(self.state, partition, self.rt.partition_of, after, listed):
            if user in self.corrupt:
                continue
            um = self.users.get(user)
            if um is not None:
                yield user, um, None, len(um) + 1  # a sweep reads its history back: every row counts
                continue
            read = rows()
            if wanted is not None and not wanted(read):
                yield user, None, None, len(read)  # one user read: the caller lets the event loop run
                continue
            um, redo = self._load(user, read)
            if um is not None:
                yield user, um, redo, len(read)

    def keep(self, motebit_id: str, um: UserMemory, redo: dict | None) -> None:
        """A user from `partition_users` that a batch attempt changes: cached and pinned, so that
        the attempt's effects stay with it until they are written."""
        if self.users.get(motebit_id, pin=True) is None:
            self._keep(motebit_id, um, redo or {}, pin=True)

    def stage(self, cp: checkpoint.Checkpoint, motebit_id: str, um: UserMemory, out: Outcome) -> None:
        """Stage the user's rows after an outcome: the aux row first (with the batch's other
        rows of this user as its redo log: `pending`), then the node rows and the sealed
        chunks of the de-duplication window (the aux row keeps only its open tail). The first
        write after a rebuild also rewrites the rows of the user's last redo log: a crash may
        have kept them out of the table, and the new aux row will no longer carry them. Staged
        through the attempt's checkpoint `cp`."""
        for suffix, row in self.redo.pop(motebit_id, {}).items():
            cp.write(self.state, node_key(motebit_id, suffix), checkpoint.DELETE if row is None else row)
        nodes: dict[str, Any] = {}  # live nodes under their id, closed ones under `~h/` (user_cache.node_rows)
        for node in out.node_upserts:
            nodes.update(node_rows(node))
        for node_id in out.node_deletions:
            nodes.update(deletion_rows(node_id))
        sealed, dropped = um.seen_changes()
        side = side_rows(um.side_changes())  # deleted ids and fingerprints, pins: one small row each
        staged = 0
        for suffix, row in {**nodes, **chunk_rows(sealed, dropped), **side}.items():
            if row is None:
                cp.write(self.state, node_key(motebit_id, suffix), checkpoint.DELETE)
                staged += 64
                continue
            # encoded once (a RocksDB store's bytes), for the store, the changelog and the aux row's redo log
            value = faust_internals.encoded_row(self.state, row)
            staged += len(value) if isinstance(value, (bytes, bytearray)) else len(orjson.dumps(row))
            cp.write(self.state, node_key(motebit_id, suffix), value)
        # the aux row carries these rows as its redo log: past the budget, the batch is made
        # durable after this record (streams.runtime.checkpoint), so the aux row stays bounded
        cp.add_bytes(motebit_id, staged, self.rt.settings.state_batch_max_bytes)

        def aux_row(written: checkpoint.Checkpoint) -> dict:
            rows = written.staged_rows(self.state, motebit_id)
            pending = {k.split(NODE_KEY_SEP, 1)[1]: _redo_entry(v) for k, v in rows.items()}
            return {**um.aux_record(compact=True), "pending": pending}

        cp.write(self.state, motebit_id, aux_row, first=True)
