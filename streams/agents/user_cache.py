"""The memory agent's per-user state, loaded on first touch and kept in a bounded LRU.

No Kafka or Faust here: `load_user` turns the `memory-state` rows of ONE user into its
`UserMemory` (the rules `MemoryStore` applied to the whole table at every rebalance before),
and `UserCache` bounds how much of that derived state a worker keeps. Where the rows come from
(a prefix scan of the partition's RocksDB, or a scan of the table) is `streams.agents.state_scan`.

The row layout of `memory-state` is defined here, and only here (the pure `UserMemory` reports
what changed and is rebuilt from plain collections; it knows no keys): the key is `<user>` or
`<user>/<rest>` (`streams.agents.memory_store.node_key`). `<user>/~seen/<k>` is sealed chunk k of the
de-duplication window (`chunk_rows`; a non-integer k: the user cannot be rebuilt),
`<user>/~del/<node_id>`, `~fp/<fingerprint>`, `~pin/<node_id>` are side rows, one per deleted node
id, deleted content fingerprint and pin (`side_rows`), `<user>/~h/<node_id>` is a closed
(superseded) node — the user's history, kept apart so that loading a user reads its ids and not
its records (`node_rows`; `UserMemory.closed` reads a record when one is asked for) — and any
other row is classified by what it holds — an aux row (no `node_id`) under `<user>`, a live node
row under `<user>/<node_id>` (or a closed one written by an earlier version: held in memory with
the user, and moved to `~h/` when it next changes). No id can contain `~`, so no node id
collides with an internal row. A row whose `motebit_id` is another
user's (left by an older version that let ids contain `/`) is skipped and counted (`foreign`). A
user whose rows are neither, or that `UserMemory.from_nodes` refuses, is *contained* (`corrupt`:
the reason).

The redo log (`pending` of the aux row: `<rest>` → row, None = deleted) holds the other rows of
the last batch that changed the user. `MemoryStore.stage` writes the aux row *before* those rows,
so after a crash in between they may be missing or older in the table: `load_user` lays `pending`
over the stored rows (by node id for node rows) before it rebuilds the state.

A lazily loaded user is built by the same `UserMemory.from_nodes` call from the same rows as the
eager rebuild of every user did, so it decides exactly as before (tests/agents/test_user_cache.py
compares the two on generated tables).

Bound (`UserCache`): the loaded users' weights (`weight`: live and held nodes, a 32nd of the
other closed nodes and of the de-duplication window's ids, + 1) add up to at most
`max_nodes`, except that a *pinned* user is never evicted (the memory agent pins every user its
current batch touched until that batch's rows are written: its `UserMemory` holds the batch's
effects, which the table does not have yet) and the user just loaded stays even when it alone is
over the bound. Eviction is least recently used first.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from streams.core import UserMemory
from streams.core.housekeeping import HousekeepingPolicy, prune_reason
from streams.core.nodes import NODE_FIELDS, complete_node, is_open
from streams.core.similarity import IndexConfig
from streams.core.state import HistoryReader, SideChanges

KEY_SEP = "/"  #: a user id never contains it (validated at ingest): the first one ends the user id
SEEN_CHUNK_KEY = "~seen/"  #: `<user>/~seen/<k>`: sealed chunk k of the de-duplication window
DELETED_ID_KEY = "~del/"  #: `<user>/~del/<node_id>`: a deleted node id (row: 1)
DELETED_FP_KEY = "~fp/"  #: `<user>/~fp/<sha256>`: a deleted content fingerprint (row: 1)
PIN_KEY = "~pin/"  #: `<user>/~pin/<node_id>`: the latest memory_pinned of a node (row: the Pin)
HISTORY_KEY = "~h/"  #: `<user>/~h/<node_id>`: a closed (superseded) node (row: the node)
#: an id held without its node (a closed node's, one of the de-duplication window) costs this
#: fraction of a node against the bound (~100-200 bytes, against ~3-10 KB for a live node with
#: its similarity index entries)
HISTORY_WEIGHT_DIVISOR = 32
SIDE_PREFIXES = (DELETED_ID_KEY, DELETED_FP_KEY, PIN_KEY)
_INTERNAL = (SEEN_CHUNK_KEY, *SIDE_PREFIXES)  #: row suffixes that are not node ids
_NODE_FIELDS = frozenset(NODE_FIELDS)


def node_rows(node: dict[str, Any]) -> dict[str, Any]:
    """The rows (`<rest>` → row, None = delete) of a node upsert: a live node under its id; a
    closed one under `~h/<node_id>`, its row under its id deleted (it was live before, or
    written there by an earlier version)."""
    nid = node["node_id"]
    if is_open(node):
        return {nid: node}
    return {HISTORY_KEY + nid: node, nid: None}


def deletion_rows(node_id: str) -> dict[str, Any]:
    """The rows of a deleted node: wherever it was (a delete of an absent row writes nothing)."""
    return {node_id: None, HISTORY_KEY + node_id: None}


class TableHistory:
    """A `HistoryReader` over `memory-state` rows held in a mapping (key → row), for code that
    runs the rules without a worker (tests, benches); `MemoryStore.StoredHistory` reads the
    same keys out of RocksDB. `lost` only records what the state reported."""

    def __init__(self, table: dict[str, Any], user: str) -> None:
        self.table, self.prefix = table, f"{user}{KEY_SEP}{HISTORY_KEY}"
        self.lost_ids: dict[str, str] = {}

    def get(self, node_id: str) -> Any:
        return self.table.get(self.prefix + node_id)

    def all(self) -> list[tuple[str, Any]]:
        return [(key[len(self.prefix):], row) for key, row in self.table.items()
                if key.startswith(self.prefix) and row is not None]

    def lost(self, node_id: str, why: str) -> None:
        self.lost_ids[node_id] = why


def chunk_rows(sealed: dict[int, list], dropped: list[int]) -> dict[str, Any]:
    """The rows (`<rest>` → row, None = delete) of `UserMemory.seen_changes`."""
    rows: dict[str, Any] = {f"{SEEN_CHUNK_KEY}{k}": chunk for k, chunk in sealed.items()}
    rows.update({f"{SEEN_CHUNK_KEY}{k}": None for k in dropped})
    return rows


def side_rows(changes: SideChanges) -> dict[str, Any]:
    """The side rows (`<rest>` → row, None = delete) of `UserMemory.side_changes`."""
    rows: dict[str, Any] = {DELETED_ID_KEY + node_id: 1 for node_id in changes.deleted_node_ids}
    rows.update({DELETED_FP_KEY + fp: 1 for fp in changes.deleted_fingerprints})
    rows.update({PIN_KEY + node_id: None if pin is None else list(pin) for node_id, pin in changes.pins.items()})
    return rows


@dataclass
class Loaded:
    """One user's rows, read: its state, or why it cannot be rebuilt."""

    memory: UserMemory | None  #: None when contained (or when the rows were all foreign / absent: see `known`)
    corrupt: str | None = None  #: why the rows cannot be rebuilt (the user is contained)
    foreign: int = 0  #: rows under the user's keys that belong to another user (skipped)
    redo: dict[str, Any] = field(default_factory=dict)  #: the aux row's `pending`, rewritten on the next write
    rows: int = 0  #: rows read (foreign ones included)


def load_user(user: str, rows: Iterable[tuple[str, Any]], *, dedup_max_ids: int,
              index_config: IndexConfig | None = None, history: HistoryReader | None = None) -> Loaded:
    """The user's state from its rows `(key, row)` (keys `<user>` and `<user>/<rest>` only;
    None rows are tombstones and skipped). A user without rows (or with foreign ones only) gets
    an empty `UserMemory`, as a first record of a new user does. A `~h/` row counts by its key
    alone (its value is not read: the scan may leave it out); its record is read on demand
    through `history` (a closed node of the redo log is held in memory instead: the store may
    not have it yet)."""
    nodes: list[dict] = []
    history_ids: set[str] = set()
    redo_history: dict[str, dict] = {}
    chunks: dict[int, list] = {}
    side: dict[str, Any] = {}
    aux: dict | None = None
    corrupt: str | None = None
    foreign = count = 0
    for key, row in rows:
        count += 1
        owner_key, sep, rest = key.partition(KEY_SEP)
        if owner_key != user:
            raise ValueError(f"row {key[:200]!r} is not a row of {user[:200]!r}")
        if row is None:
            continue
        if sep and rest.startswith(SEEN_CHUNK_KEY):
            try:
                chunks[int(rest[len(SEEN_CHUNK_KEY):])] = row
            except ValueError:
                corrupt = corrupt or f"unreadable de-duplication chunk row {key[:200]!r}"
            continue
        if sep and rest.startswith(SIDE_PREFIXES):
            side[rest] = row
            continue
        if sep and rest.startswith(HISTORY_KEY):
            history_ids.add(rest[len(HISTORY_KEY):])
            continue
        owner = row.get("motebit_id") if isinstance(row, dict) else None
        if owner != user:
            foreign += 1
            continue
        if not sep and "node_id" not in row:
            aux = row
        elif sep and "node_id" in row:
            nodes.append(row)
        else:
            corrupt = corrupt or f"row {key[:200]!r} is neither an aux row nor a node row"
    redo: dict[str, Any] = {}
    if corrupt is None:
        try:
            redo = dict(aux["pending"]) if aux and aux.get("pending") else {}
            if redo:  # the redo log wins over the stored rows
                by_id = {n["node_id"]: n for n in nodes}
                for rest, row in redo.items():
                    if rest.startswith(SEEN_CHUNK_KEY):
                        target, ident = chunks, int(rest[len(SEEN_CHUNK_KEY):])
                    elif rest.startswith(SIDE_PREFIXES):
                        target, ident = side, rest  # type: ignore[assignment]  # four kinds of rows, one update
                    elif rest.startswith(HISTORY_KEY):
                        target, ident = redo_history, rest[len(HISTORY_KEY):]  # type: ignore[assignment]
                        if row is None:
                            history_ids.discard(ident)
                    else:
                        target, ident = by_id, rest  # type: ignore[assignment]
                    if row is None:
                        target.pop(ident, None)
                    else:
                        target[ident] = row
                nodes = list(by_id.values())
            history_ids.difference_update(redo_history)
            um = UserMemory.from_nodes(
                user, [*nodes, *redo_history.values()], aux, seen_chunks=chunks, dedup_max_ids=dedup_max_ids,
                index_config=index_config, history_ids=history_ids, history=history,
                deleted_node_ids=[k[len(DELETED_ID_KEY):] for k in side if k.startswith(DELETED_ID_KEY)],
                deleted_fingerprints=[k[len(DELETED_FP_KEY):] for k in side if k.startswith(DELETED_FP_KEY)],
                pins={k[len(PIN_KEY):]: row for k, row in side.items() if k.startswith(PIN_KEY)})
        except Exception as exc:  # noqa: BLE001 - one user's bad rows must not stop the others
            corrupt = f"{type(exc).__name__}: {str(exc)[:300]}"
    if corrupt is not None:
        return Loaded(None, corrupt, foreign, rows=count)
    return Loaded(um, None, foreign, redo, count)


def may_expire(rows: Iterable[tuple[str, Any]], now_ms: int, policy: HousekeepingPolicy) -> bool:
    """Whether a housekeeping sweep at `now_ms` could change the user these rows hold, read
    without building its state: some node row, stored or in the aux row's redo log, is expired
    (`prune_reason`). It checks a superset of the nodes `load_user` would keep (foreign rows and
    rows the redo log replaces included), so False means `sweep_memory` of the loaded user finds
    nothing; a row it cannot read says True (the full load then decides, or contains the user)."""
    for key, row in rows:
        if row is None:
            continue
        _user, sep, rest = key.partition(KEY_SEP)
        try:
            if not sep:
                pending = row.get("pending") or {}
                nodes = [r for k, r in pending.items() if r is not None and not k.startswith(_INTERNAL)]
            elif rest.startswith(_INTERNAL):
                continue
            else:
                nodes = [row]
            # a row the worker wrote is a complete node (every NODE_FIELDS key): `complete_node`
            # would change nothing `prune_reason` reads, and costs 3x the rule itself
            if any(prune_reason(n if n.keys() >= _NODE_FIELDS else complete_node(n), now_ms, policy) is not None
                   for n in nodes):
                return True
        except Exception:  # noqa: BLE001 - unreadable: let the full load decide
            return True
    return False


def group_rows(rows: Iterable[tuple[str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """`(key, row)` pairs of any users, grouped by user (the eager path, and a store that cannot
    scan one user's keys)."""
    out: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for key, row in rows:
        out[key.partition(KEY_SEP)[0]].append((key, row))
    return out


def weight(um: UserMemory) -> int:
    """What a loaded user counts against the bound: its live nodes, the closed ones held in
    memory, a `HISTORY_WEIGHT_DIVISOR`th of the ids it holds without their node — the closed
    nodes only known by id and the ids of its de-duplication window (up to
    MEMSTREAM_DEDUP_MAX_IDS, ~200 bytes each) — + 1."""
    held = um.closed.held
    ids = len(um.closed) - held + len(um.seen)
    return len(um.live) + held + -(-ids // HISTORY_WEIGHT_DIVISOR) + 1


class UserCache:
    """Loaded users, least recently used first, bounded by `max_nodes` (see the module doc)."""

    def __init__(self, max_nodes: int) -> None:
        if max_nodes < 1:
            raise ValueError("max_nodes must be >= 1")
        self.max_nodes = max_nodes
        self._users: OrderedDict[str, UserMemory] = OrderedDict()
        self._weights: dict[str, int] = {}
        self.pinned: set[str] = set()
        self.total = 0  #: sum of the weights (as of each user's last `put` / `unpin_all`)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, user: str) -> bool:
        return user in self._users

    def peek(self, user: str) -> UserMemory | None:
        """A loaded user, without making it the most recently used."""
        return self._users.get(user)

    def users(self) -> list[str]:
        """Loaded users, least recently used first."""
        return list(self._users)

    def get(self, user: str, pin: bool = False) -> UserMemory | None:
        um = self._users.get(user)
        if um is not None:
            self._users.move_to_end(user)
            if pin:
                self.pinned.add(user)
        return um

    def put(self, user: str, um: UserMemory, pin: bool = False) -> list[str]:
        """Add (or replace) a user as the most recently used; returns the users evicted."""
        self.total += weight(um) - self._weights.get(user, 0)
        self._weights[user] = weight(um)
        self._users[user] = um
        self._users.move_to_end(user)
        if pin:
            self.pinned.add(user)
        return self._evict(keep=user)

    def unpin_all(self) -> list[str]:
        """The batch that pinned users is written: re-weigh them (they may have grown), let them
        go and evict down to the bound; returns the users evicted."""
        for user in self.pinned:
            um = self._users.get(user)
            if um is not None:
                self.total += weight(um) - self._weights[user]
                self._weights[user] = weight(um)
        self.pinned.clear()
        return self._evict(keep=None)

    def drop(self, users: Iterable[str]) -> None:
        for user in users:
            if self._users.pop(user, None) is not None:
                self.total -= self._weights.pop(user)
            self.pinned.discard(user)

    def clear(self) -> None:
        self._users.clear()
        self._weights.clear()
        self.pinned.clear()
        self.total = 0

    def _evict(self, keep: str | None) -> list[str]:
        evicted: list[str] = []
        if self.total <= self.max_nodes:
            return evicted
        for user in list(self._users):
            if self.total <= self.max_nodes:
                break
            if user == keep or user in self.pinned:
                continue
            del self._users[user]
            self.total -= self._weights.pop(user)
            evicted.append(user)
        self.evictions += len(evicted)
        return evicted


class SweepSlices:
    """Where each partition's housekeeping sweep resumes. A sweep holds the memory state's lock
    (the agent's batches wait), and reading every row of a large partition takes seconds, so one
    tick reads at most `max_rows` rows of a partition and holds the lock at most `max_seconds`
    (by `clock`, from `start`; a user is never split, so a tick may run over by the user it
    is reading), and the next tick goes on after the last user it read, in user-id order; a
    sweep that reaches the end starts over next tick. A restart starts over (nothing is lost: a
    sweep only finds what has expired, and that stays expired). Retention and decay act within
    one cycle: ticks × interval.

    The time bound is what keeps a worker that owns many partitions, or whose users are not
    loaded yet (after a restart every user's rows are read from RocksDB), from spending its
    event loop and the lock on sweeps: the sweep awaits between users (the event loop runs other
    tasks meanwhile, its wall time counts here), so without it one tick could hold the lock for
    seconds and the agent applied a few records a second (issue 34, bench/RESULTS.md)."""

    def __init__(self, max_rows: int, max_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError("max_seconds must be > 0")
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self.clock = clock
        self._after: dict[int, str] = {}
        self._read: dict[int, int] = {}
        self._started: dict[int, float] = {}
        self._users: dict[int, list[str]] = {}  #: each partition's users as listed when its cycle began
        self._fresh: dict[int, bool] = {}  #: whether this tick begins a cycle (`start` returned None)

    def start(self, partition: int) -> str | None:
        """A tick begins: the user after which it resumes (None: from the first user)."""
        self._read[partition] = 0
        self._started[partition] = self.clock()
        after = self._after.pop(partition, None)
        self._fresh[partition] = after is None
        return after

    def users(self, partition: int, list_users: Callable[[], list[str]]) -> list[str]:
        """The partition's users for this tick, sorted: listed (`list_users`) when a cycle
        begins, else the list of the cycle's start, so a tick does not list every user of its
        partition again (one seek per user) to resume after one. A user added meanwhile is swept
        from the next cycle on (a new user has nothing expired yet); one removed reads no rows."""
        if self._fresh.get(partition, True) or partition not in self._users:
            self._users[partition] = sorted(list_users())
            self._fresh[partition] = False
        return self._users[partition]

    def read(self, partition: int, user: str, rows: int) -> bool:
        """`rows` rows of `user` were read; True when the tick's budget is spent, rows or time
        (stop after this user: the next tick resumes after it)."""
        self._read[partition] = self._read.get(partition, 0) + rows
        if self._read[partition] >= self.max_rows or (
                self.max_seconds is not None
                and self.clock() - self._started.get(partition, self.clock()) >= self.max_seconds):
            self._after[partition] = user
            return True
        return False
