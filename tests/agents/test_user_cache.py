"""The memory agent's lazily loaded, bounded per-user state (issue 14, recovery):
`streams.agents.user_cache` (row classification, the LRU bound) and `streams.agents.state_scan`
(one user's rows out of a real RocksDB partition, as Faust's store keeps them).

The oracle of "a lazily loaded user decides like an eagerly loaded one" is the rebuild of every
user that `MemoryStore._rebuild` did before (commit 35de57c), kept here as `eager_rebuild`."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import rocksdict
from faust.types import TP
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streams.agents import state_scan
from streams.agents.user_cache import (
    DELETED_FP_KEY,
    DELETED_ID_KEY,
    HISTORY_KEY,
    HISTORY_WEIGHT_DIVISOR,
    PIN_KEY,
    SEEN_CHUNK_KEY,
    SIDE_PREFIXES,
    SweepSlices,
    TableHistory,
    UserCache,
    chunk_rows,
    deletion_rows,
    group_rows,
    load_user,
    may_expire,
    node_rows,
    side_rows,
    weight,
)
from streams.contracts import catalog
from streams.core import IndexConfig, UserMemory, process_candidate, process_event
from streams.core.housekeeping import HousekeepingPolicy, sweep_memory
from streams.core.limits import DEFAULT_LIMITS, id_problem
from streams.core.state import MissingHistory
from streams.tools import generate
from tests.core.test_determinism import _run, _stream

MAX_IDS = 50  # a small de-duplication window: sealed chunks and dropped chunks happen


def side_kwargs(side: dict[str, Any]) -> dict[str, Any]:
    """`UserMemory.from_nodes`' keyword arguments of a user's side rows (`<rest>` -> row)."""
    return {"deleted_node_ids": [k[len(DELETED_ID_KEY):] for k in side if k.startswith(DELETED_ID_KEY)],
            "deleted_fingerprints": [k[len(DELETED_FP_KEY):] for k in side if k.startswith(DELETED_FP_KEY)],
            "pins": {k[len(PIN_KEY):]: row for k, row in side.items() if k.startswith(PIN_KEY)}}


def eager_rebuild(items) -> tuple[dict[str, UserMemory], dict[str, str], int]:
    """The rebuild of every user from the whole table, as `MemoryStore._rebuild` did it (for
    aux rows without a redo log: the tables it is compared on have none)."""
    by_user, chunks, side, aux, corrupt, foreign = defaultdict(list), defaultdict(dict), defaultdict(dict), {}, {}, 0
    for key, row in items:
        if row is None:
            continue
        user, sep, rest = key.partition("/")
        if sep and rest.startswith(SEEN_CHUNK_KEY):
            try:
                chunks[user][int(rest[len(SEEN_CHUNK_KEY):])] = row
            except ValueError:
                corrupt.setdefault(user, "chunk")
            continue
        if sep and rest.startswith(SIDE_PREFIXES):
            side[user][rest] = row
            continue
        mine = isinstance(row, dict) and row.get("motebit_id") == user
        kind = ("foreign" if not mine else "aux" if (not sep and "node_id" not in row)
                else "node" if (sep and "node_id" in row) else "neither")
        foreign += kind == "foreign"
        if kind == "aux":
            aux[user] = row
        elif kind == "node":
            by_user[user].append(row)
        elif kind == "neither":
            corrupt.setdefault(user, kind)
    cache = {}
    for u in set(by_user) | set(aux) | set(side):
        if u in corrupt:
            continue
        try:
            cache[u] = UserMemory.from_nodes(u, by_user.get(u, ()), aux.get(u), seen_chunks=chunks.get(u),
                                             dedup_max_ids=MAX_IDS, **side_kwargs(side.get(u, {})))
        except Exception as exc:  # noqa: BLE001
            corrupt[u] = type(exc).__name__
    return cache, corrupt, foreign


def apply_rows(table: dict[str, Any], user: str, rows: dict[str, Any]) -> None:
    for suffix, row in rows.items():
        if row is None:
            table.pop(f"{user}/{suffix}", None)
        else:
            table[f"{user}/{suffix}"] = row


def write_rows(table: dict[str, Any], um: UserMemory, out, layout: str = "current") -> None:
    """A user's rows after an outcome, in the layout `MemoryStore.stage` writes (pending empty);
    `layout="earlier"`: closed nodes under their id, as versions before the history rows wrote them."""
    user, rows = um.motebit_id, {}
    for node in out.node_upserts:
        rows.update(node_rows(node) if layout == "current" else {node["node_id"]: node})
    for nid in out.node_deletions:
        rows.update(deletion_rows(nid))
    rows.update({**chunk_rows(*um.seen_changes()), **side_rows(um.side_changes())})
    apply_rows(table, user, rows)
    table[user] = {**um.aux_record(compact=True), "pending": {}}


def run(stream, users: dict[str, UserMemory], table: dict[str, Any] | None, layout: str = "current",
        release: bool = False) -> list:
    """Apply a stream; with a table, write each outcome's rows into it (`release`: the users'
    closed nodes are then dropped from memory, as the store does once a batch is written)."""
    outputs = []
    for topic, key, record in stream:
        um = users.get(key)
        if um is None:
            um = users[key] = UserMemory(key, dedup_max_ids=MAX_IDS)
            if release:
                um.closed.reader = TableHistory(table, key)
        out = process_candidate(um, record) if topic == catalog.MEMORY_CANDIDATES else process_event(um, record)
        outputs.append((out.ledger, out.node_upserts, out.node_deletions, out.quarantined, out.duplicate))
        if table is not None:
            write_rows(table, um, out, layout)
            if release:
                um.closed.release()
    return outputs


def state(um: UserMemory) -> tuple:
    return list(um.nodes()), um.aux_record()


def mixed(users: int, seed: int) -> list:
    items = generate.interleave(generate.generate(seed=seed, users=users, kinds=("memory",)))
    return [(i.topic, i.key, i.value) for i in items
            if isinstance(i.value, dict) and i.topic in (catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS)]


@pytest.mark.parametrize("layout", ["current", "earlier"])
def test_a_user_loaded_from_its_rows_equals_the_eager_rebuild_and_decides_like_the_state_that_wrote_them(layout):
    """Both row layouts: closed nodes under `~h/` (read by key only when loading, their records
    on demand) and under their id (as an earlier version wrote them: held with the user)."""
    stream = mixed(users=30, seed=11)
    half = len(stream) // 2
    live: dict[str, UserMemory] = {}
    table: dict[str, Any] = {}
    run(stream[:half], live, table, layout)
    assert sum(len(um.closed) for um in live.values()) > 10  # the stream supersedes: there is history
    eager, corrupt, foreign = eager_rebuild(table.items())
    assert not corrupt and foreign == 0 and eager
    grouped = group_rows(table.items())
    lazy = {}
    for user in sorted(grouped):
        rows = [(k, state_scan.UNREAD if f"/{HISTORY_KEY}" in k else v) for k, v in grouped[user]]
        loaded = load_user(user, rows, dedup_max_ids=MAX_IDS, history=TableHistory(table, user))
        assert loaded.corrupt is None and loaded.foreign == 0
        lazy[user] = loaded.memory
        assert loaded.memory.closed.held == (0 if layout == "current" else len(live[user].closed))
        assert state(loaded.memory) == state(eager[user]) == state(live[user]), user
    # the rest of the stream decides the same on the loaded users as on the ones that never stopped
    assert run(stream[half:], lazy, None) == run(stream[half:], live, None)
    assert {u: state(m) for u, m in lazy.items()} == {u: state(m) for u, m in live.items()}


NODE = {"node_id": "n-1", "content": "A fact.", "content_fingerprint": "f", "memory_type": "semantic",
        "sensitivity": "personal", "confidence": 0.7, "created_at": 1, "updated_at": 1, "valid_from": 1,
        "valid_to": None, "superseded_by": None, "origin_event_id": "e", "reinforcement_count": 0}
users_ = st.sampled_from(["u", "u-1", "u.x", "v", "u0"])
rest_ = st.sampled_from(["n-1", "n-2", f"{SEEN_CHUNK_KEY}0", f"{SEEN_CHUNK_KEY}x", "~del/n-9", "~pin/n-1", "a/b"])
row_ = st.one_of(
    st.none(),
    st.builds(lambda owner, nid: {**NODE, "node_id": nid, "motebit_id": owner}, users_, st.sampled_from(["n-1", "n-2"])),
    st.builds(lambda owner: {"motebit_id": owner, "clock": 3}, users_),
    st.just([1, 2, "e", True]),
    st.just({"motebit_id": "u", "node_id": "broken"}),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(users_, st.one_of(st.none(), rest_), row_), max_size=25))
def test_lazy_loading_classifies_rows_as_the_eager_rebuild(rows):
    """Foreign rows, tombstones, unreadable chunks, rows that are neither aux nor node rows and
    rows `from_nodes` refuses: per user, the same state, the same containment, the same count."""
    table = {(u if rest is None else f"{u}/{rest}"): row for u, rest, row in rows}
    eager, corrupt, foreign = eager_rebuild(table.items())
    lazy_foreign = 0
    for user, user_rows in group_rows(table.items()).items():
        loaded = load_user(user, user_rows, dedup_max_ids=MAX_IDS)
        lazy_foreign += loaded.foreign
        assert (loaded.corrupt is not None) == (user in corrupt), user
        if user in eager:
            assert state(loaded.memory) == state(eager[user])
        elif loaded.memory is not None:  # no rows of its own: a new user, as the eager cache made it
            assert state(loaded.memory) == state(UserMemory(user, dedup_max_ids=MAX_IDS))
    assert lazy_foreign == foreign


def test_a_user_whose_rows_cannot_be_rebuilt_is_contained_when_loaded():
    rows = [("mb-broken/n-1", {"motebit_id": "mb-broken", "node_id": "n-1"})]  # as the poison test writes
    loaded = load_user("mb-broken", rows, dedup_max_ids=MAX_IDS)
    assert loaded.memory is None and loaded.corrupt
    loaded = load_user("mb-broken", [("mb-broken/~seen/x", [])], dedup_max_ids=MAX_IDS)
    assert loaded.memory is None and "chunk" in loaded.corrupt
    aux = UserMemory("mb-broken", dedup_max_ids=MAX_IDS).aux_record(compact=True)
    for bad in (0, -1, "many"):  # a hostile chunk size in the aux row: contained, not a crash
        hostile = {**aux, "seen": {**aux["seen"], "chunk_size": bad}}
        loaded = load_user("mb-broken", [("mb-broken", hostile)], dedup_max_ids=MAX_IDS)
        assert loaded.memory is None and ("chunk_size" in loaded.corrupt or "many" in loaded.corrupt)


def test_the_redo_log_of_the_aux_row_comes_with_the_user():
    um = UserMemory("u", dedup_max_ids=MAX_IDS)
    pending = {"n-1": {**NODE, "motebit_id": "u"}, "n-2": None}
    loaded = load_user("u", [("u", {**um.aux_record(compact=True), "pending": pending})], dedup_max_ids=MAX_IDS)
    assert loaded.redo == pending and [n["node_id"] for n in loaded.memory.nodes()] == ["n-1"]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 60), st.data())
def test_the_redo_log_completes_a_partly_written_batch(seed, n, data):
    """`MemoryStore.stage` writes a batch's compact aux row (with `pending`: the batch's node
    rows, de-duplication chunks and side rows) before those rows; a crash can leave any prefix
    of them unwritten. Loading the user from the old rows + the new aux row gives the state
    after the whole batch, and the redo log comes with it (rewritten by the next write)."""
    cfg = IndexConfig(exact_scan_below=0)
    ops, _ = _stream(seed, n)
    cut = data.draw(st.integers(0, len(ops)))
    um = UserMemory("u1", index_config=cfg, dedup_max_ids=data.draw(st.integers(5, 50)))
    table: dict[str, Any] = {}  # the user's rows in the memory-state table

    def staged(outs) -> dict:
        """What `MemoryStore.stage` writes after these outcomes: last row per `<rest>`, None = delete."""
        rows: dict = {}
        for out in outs:
            for node in out.node_upserts:
                rows.update(node_rows(node))
            for node_id in out.node_deletions:
                rows.update(deletion_rows(node_id))
            rows.update({**chunk_rows(*um.seen_changes()), **side_rows(um.side_changes())})
        return rows

    apply_rows(table, "u1", staged(_run(um, ops[:cut])))  # an earlier batch, fully written
    changes = staged(_run(um, ops[cut:]))  # this batch
    table["u1"] = {**um.aux_record(compact=True), "pending": changes}  # the aux row first
    apply_rows(table, "u1", dict(list(changes.items())[:data.draw(st.integers(0, len(changes)))]))  # the crash
    loaded = load_user("u1", list(table.items()), dedup_max_ids=um.seen.max_ids, index_config=cfg,
                       history=TableHistory(table, "u1"))
    assert loaded.corrupt is None and loaded.redo == changes
    assert list(loaded.memory.nodes()) == list(um.nodes())
    assert loaded.memory.aux_record() == um.aux_record()


def test_no_id_can_name_an_internal_row():
    """The layout relies on it: a node id (any id) never starts like a chunk or side row."""
    for prefix in (SEEN_CHUNK_KEY, HISTORY_KEY, *SIDE_PREFIXES):
        assert id_problem(prefix + "0", DEFAULT_LIMITS) is not None, prefix
        assert id_problem(prefix.strip("/~") + "0", DEFAULT_LIMITS) is None  # the rule refuses the mark, not the word


def test_load_user_refuses_rows_of_another_user():
    with pytest.raises(ValueError):
        load_user("u", [("v/n-1", None)], dedup_max_ids=MAX_IDS)


# ------------------------------------------------------------------------------------ the bound
def grown(user: str, nodes: int) -> UserMemory:
    um = UserMemory(user)
    for i in range(nodes):
        um.put_node({**NODE, "motebit_id": user, "node_id": f"n-{i}", "content": f"fact {i} of {user}"})
    return um


def test_the_loaded_nodes_never_exceed_the_bound_least_recently_used_go_first():
    cache = UserCache(max_nodes=10)
    evicted = []
    for user in ["a", "b", "c", "d"]:  # weight 3 each (2 nodes + 1)
        evicted += cache.put(user, grown(user, 2))
        assert cache.total <= 10
    assert evicted == ["a"] and cache.users() == ["b", "c", "d"]
    cache.get("b")  # used: now the most recent
    assert cache.put("e", grown("e", 2)) == ["c"]
    assert cache.users() == ["d", "b", "e"] and cache.evictions == 2


def test_a_user_larger_than_the_bound_is_loaded_alone():
    cache = UserCache(max_nodes=5)
    cache.put("small", grown("small", 1))
    assert cache.put("big", grown("big", 9)) == ["small"]
    assert cache.users() == ["big"] and cache.total == 10 > cache.max_nodes
    assert cache.put("next", grown("next", 0)) == ["big"]


def test_pinned_users_are_never_evicted_until_unpinned_and_are_reweighed_then():
    cache = UserCache(max_nodes=6)
    a = grown("a", 2)
    cache.put("a", a, pin=True)
    cache.put("b", grown("b", 2), pin=True)
    assert cache.put("c", grown("c", 2)) == []  # 9 > 6, but a and b are pinned and c is the newest
    for i in range(2, 6):  # the batch grows a
        a.put_node({**NODE, "motebit_id": "a", "node_id": f"n-{i}", "content": f"more {i}"})
    assert cache.total == 9  # weights as of the put
    assert cache.unpin_all() == ["a"]  # a now weighs 7: 13 > 6; least recently used first, down to 6
    assert cache.users() == ["b", "c"] and cache.total == 6 and not cache.pinned
    assert weight(cache.get("b")) == weight(cache.get("c")) == 3


def test_a_dropped_user_gives_back_its_weight_and_its_pin():
    cache = UserCache(max_nodes=100)
    cache.put("a", grown("a", 3), pin=True)
    cache.put("b", grown("b", 1))
    cache.drop(["a", "zzz"])
    assert cache.users() == ["b"] and cache.total == 2 and not cache.pinned
    cache.clear()
    assert len(cache) == 0 and cache.total == 0


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError):
        UserCache(max_nodes=0)


def test_ids_held_without_their_node_weigh_a_fraction_of_a_node():
    """Closed nodes known by id and the de-duplication window's ids: a 32nd each (so the bound
    also bounds them: a user's window holds up to MEMSTREAM_DEDUP_MAX_IDS ids)."""
    um = grown("u", 3)
    for i in range(70):
        um.closed.know(f"h-{i}")
    um.closed.hold({**NODE, "motebit_id": "u", "node_id": "h-0", "valid_until": 5})
    assert um.closed.held == 1 and len(um.closed) == 70
    assert weight(um) == 3 + 1 + -(-69 // HISTORY_WEIGHT_DIVISOR) + 1 == 8
    for i in range(100):
        um.seen.add(f"c:{i}", 1000 + i)
    assert weight(um) == 3 + 1 + -(-(69 + 100) // HISTORY_WEIGHT_DIVISOR) + 1 == 11
    cache = UserCache(max_nodes=20)
    cache.put("u", um)
    assert cache.total == 11


# ------------------------------------------------------------------- history read on demand
@pytest.mark.parametrize("seed", [3, 11])
def test_a_user_whose_history_is_released_after_each_write_decides_like_one_that_holds_it(seed):
    """The store drops a user's closed nodes from memory once a batch is written and reads one
    back when a rule needs it (supersession chains, events on history, sweeps, erasure): the
    same outputs, nodes and as-of answers as a state that holds its whole history."""
    stream = mixed(users=12, seed=seed)
    holding: dict[str, UserMemory] = {}
    releasing: dict[str, UserMemory] = {}
    table: dict[str, Any] = {}
    assert run(stream, releasing, table, release=True) == run(stream, holding, None)
    assert sum(len(um.closed) for um in releasing.values()) > 5
    assert all(um.closed.held == 0 for um in releasing.values())
    times = sorted({n["valid_from"] for um in holding.values() for n in um.nodes()})
    for user, um in holding.items():
        assert state(releasing[user]) == state(um)
        for t in times[:: max(1, len(times) // 7)]:
            assert releasing[user].as_of(t) == um.as_of(t)
    last = times[-1] + 400 * 86_400_000  # retention reaches history too (read back to be erased)
    expired = 0
    for user, um in holding.items():
        swept = sweep_memory(releasing[user], last)
        assert swept.node_deletions == sweep_memory(um, last).node_deletions
        assert state(releasing[user]) == state(um)
        expired += len(swept.node_deletions)
    assert expired


@pytest.mark.parametrize("stored", [None, [1, 2], "node", {**NODE, "motebit_id": "u", "node_id": "n-other"},
                                    {**NODE, "motebit_id": "v", "node_id": "n-gone"}])
def test_a_closed_node_the_store_lost_or_garbled_fails_the_rule_that_needs_it_by_name(stored):
    """A history row that is gone, not a node, another node's or another user's: the rule that
    reads it (one node, or the whole history) raises `MissingHistory` naming the node, and the
    reader is told first (the worker contains the user: `MemoryStore.contain`)."""
    table = {} if stored is None else {f"u/{HISTORY_KEY}n-gone": stored}
    for read in (lambda um: um.node("n-gone"), lambda um: list(um.nodes()), lambda um: um.as_of(5)):
        um = UserMemory("u")
        um.closed.reader = reader = TableHistory(table, "u")
        um.closed.know("n-gone")
        assert um.knows("n-gone") and len(um) == 1
        with pytest.raises(MissingHistory, match="n-gone"):
            read(um)
        assert list(reader.lost_ids) == ["n-gone"]


# ------------------------------------------------------------------------ RocksDB prefix scans
class _Store:
    """What `state_scan` uses of Faust's RocksDB store (faust/stores/rocksdb.py): `_dbs`, the
    per-partition Rdicts opened in raw mode, `_db_for_partition`, `_decode_value` (JSON here)."""

    use_rocksdict = True
    offset_key = b"__faust\0offset__"

    def __init__(self, path) -> None:
        self.path, self._dbs = path, {}
        self.app = SimpleNamespace(assignor=SimpleNamespace(assigned_actives=lambda: ACTIVE))

    def _db_for_partition(self, partition: int):
        if partition not in self._dbs:
            self._dbs[partition] = rocksdict.Rdict(str(self.path / f"p{partition}"),
                                                   options=rocksdict.Options(raw_mode=True))
        return self._dbs[partition]

    def _decode_value(self, value: bytes) -> Any:
        return json.loads(value)


class _Table:
    changelog_topic_name, is_global = "app-memory-state-changelog", False

    def __init__(self, store: _Store) -> None:
        self.data = store


ACTIVE = {TP(_Table.changelog_topic_name, 0), TP(_Table.changelog_topic_name, 1)}


def partition_of(user: str) -> int:
    return len(user) % 2


ids_ = st.text(alphabet="ab-./0:_~", min_size=1, max_size=4).filter(lambda s: "/" not in s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(ids_, st.one_of(st.none(), st.text(alphabet="ab-./0~", max_size=4))), max_size=30))
@example(keys=[("0", ""), ("0.0", None)])  # "0.0" sorts before "0/" in RocksDB but after "0" as an id
def test_a_prefix_scan_of_the_users_partition_finds_exactly_the_users_rows(tmp_path_factory, keys):
    """User ids that sort around `/` (`-`, `.`, `0`, `:`) next to each other in RocksDB: the
    prefix scan returns each user's rows and no other, and the skip scan every user once."""
    store = _Store(tmp_path_factory.mktemp("rocks"))
    table = {}
    for user, rest in keys:
        key = user if rest is None else f"{user}/{rest}"
        table[key] = {"k": key}
        store._db_for_partition(partition_of(user))[key.encode()] = json.dumps({"k": key}).encode()
    for p in (0, 1):
        store._db_for_partition(p)[store.offset_key] = b"7"
    rocks = _Table(store)
    want = {u: sorted(rows) for u, rows in group_rows(table.items()).items()}
    for user in want:
        assert sorted(state_scan.user_rows(rocks, user, partition_of(user)), key=lambda kv: kv[0]) == \
            sorted(want[user], key=lambda kv: kv[0])
    for p in (0, 1):
        mine = sorted(u for u in want if partition_of(u) == p)
        assert sorted(state_scan.partition_users(rocks, p, partition_of)) == mine
        for limit in (0, 1, len(mine) // 2, len(mine) + 3):  # the prefill's bound: the first users found
            first = state_scan.partition_users(rocks, p, partition_of, limit=limit)
            assert first == state_scan.partition_users(rocks, p, partition_of)[:limit]
        # users in id order (a sweep in slices resumes after a user id), each with exactly its rows
        assert [(u, sorted(r(), key=lambda kv: kv[0])) for u, r in state_scan.users_rows(rocks, p, partition_of)] == \
            [(u, sorted(want[u], key=lambda kv: kv[0])) for u in mine]
        assert [u for u, _r in state_scan.users_rows(rocks, p, partition_of, users=mine)] == mine
        if mine:
            after = mine[len(mine) // 2]
            assert [u for u, _ in state_scan.users_rows(rocks, p, partition_of, after)] == [u for u in mine if u > after]
    assert state_scan.user_rows(rocks, "nobody", 0) == []
    standby = TP(_Table.changelog_topic_name, 1)
    ACTIVE.discard(standby)  # a partition this worker only holds a standby copy of: not read
    try:
        assert state_scan.partition_users(rocks, 1, partition_of) == []
        assert all(state_scan.user_rows(rocks, u, 1) == [] for u in want if partition_of(u) == 1)
    finally:
        ACTIVE.add(standby)
    for db in store._dbs.values():
        db.close()


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(alphabet="abc-/0", min_size=1, max_size=4).filter(lambda u: "/" not in u),
                       st.integers(1, 9), max_size=25), st.integers(1, 30))
def test_a_sweep_in_slices_reads_every_user_once_per_cycle_and_at_most_the_budget_plus_one_user(users, budget):
    """`SweepSlices` + `users_rows(after=)`: ticks read the users in id order, never more than the
    budget plus the last user's rows, resume after the last user read, and start over at the end."""
    class Plain(dict):
        data = object()

    table = Plain({f"{u}/n{i}" if i else u: {"i": i} for u, n in users.items() for i in range(n)})
    slices = SweepSlices(budget)
    flat: list[str] = []
    for _tick in range(2 * len(users) + 2):
        after, tick = slices.start(0), []
        for user, rows in state_scan.users_rows(table, 0, lambda u: 0, after):
            tick.append((user, len(rows())))
            if slices.read(0, user, tick[-1][1]):
                break
        assert sum(n for _, n in tick[:-1]) < budget  # stopped at the first user reaching the budget
        assert after is None or all(u > after for u, _ in tick)
        flat += [u for u, _ in tick]
    cycle = sorted(users)
    assert len(flat) >= len(cycle) and flat == (cycle * (len(flat) + 1))[:len(flat)]


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(alphabet="abc-/0", min_size=1, max_size=4).filter(lambda u: "/" not in u),
                       st.integers(1, 9), max_size=25), st.integers(1, 5))
def test_a_sweep_tick_stops_once_its_time_budget_is_spent_and_the_next_goes_on(users, per_tick):
    """Issue 34: after a restart a tick read every row of its partition from RocksDB (nothing
    loaded yet) while the event loop ran other ticks between users, and held the memory state's
    lock for seconds (the agent applied ~5 records/s). With MEMSTREAM_HOUSEKEEPING_MAX_SECONDS_PER_TICK
    a tick stops at the first user read after its budget is spent, whatever the row budget
    leaves, and the sweep still reads every user once per cycle, in id order. The clock is
    fake: every user read takes 1 s, the budget is `per_tick` s."""
    class Plain(dict):
        data = object()

    now = [0.0]
    table = Plain({f"{u}/n{i}" if i else u: {"i": i} for u, n in users.items() for i in range(n)})
    slices = SweepSlices(10**9, max_seconds=per_tick, clock=lambda: now[0])
    flat: list[str] = []
    for _tick in range(2 * len(users) + 2):
        after, tick = slices.start(0), []
        for user, rows in state_scan.users_rows(table, 0, lambda u: 0, after):
            rows()
            now[0] += 1.0  # reading this user took a second
            tick.append(user)
            if slices.read(0, user, 1):
                break
        assert len(tick) <= per_tick  # the lock is given back once the budget is spent
        # ... and not before, unless the cycle ended (empty: the previous tick ended on the last user)
        assert len(tick) == per_tick or not tick or tick[-1] == max(users)
        flat += tick
    cycle = sorted(users)
    assert len(flat) >= len(cycle) and flat == (cycle * (len(flat) + 1))[:len(flat)]


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(alphabet="abc-/0", min_size=1, max_size=4).filter(lambda u: "/" not in u),
                       st.integers(1, 9), max_size=25), st.integers(1, 30))
def test_a_sweep_lists_its_partitions_users_once_per_cycle_not_at_every_tick(users, budget):
    """Listing a partition's users is a skip scan with one seek per user: done at every tick it
    cost a partition of many users more than the tick's time budget before the first user was
    read. `SweepSlices.users` lists them when a cycle begins and the cycle's ticks resume in that
    list; the ticks read the same users in the same order as with a listing per tick."""
    class Plain(dict):
        data = object()

    table = Plain({f"{u}/n{i}" if i else u: {"i": i} for u, n in users.items() for i in range(n)})
    listed, cycles = [0], 0
    listing = SweepSlices(budget)
    fresh = SweepSlices(budget)

    def list_them() -> list[str]:
        listed[0] += 1
        return state_scan.partition_users(table, 0, lambda u: 0)

    for _tick in range(2 * len(users) + 2):
        after = listing.start(0)
        cycles += after is None
        got = []
        for user, rows in state_scan.users_rows(table, 0, lambda u: 0, after, listing.users(0, list_them)):
            got.append(user)
            if listing.read(0, user, len(rows())):
                break
        want, after2 = [], fresh.start(0)
        for user, rows in state_scan.users_rows(table, 0, lambda u: 0, after2):
            want.append(user)
            if fresh.read(0, user, len(rows())):
                break
        assert got == want
    assert listed[0] == cycles


def test_a_user_added_during_a_cycle_is_swept_from_the_next_one(tmp_path):
    store = _Store(tmp_path)
    db = store._db_for_partition(0)
    for user in ("a", "c"):
        db[user.encode()] = json.dumps({"u": user}).encode()
    table, slices = _Table(store), SweepSlices(1)  # one row a tick: one user a tick

    def tick() -> list[str]:
        after, read = slices.start(0), []
        listed = slices.users(0, lambda: state_scan.partition_users(table, 0, lambda u: 0))
        for user, rows in state_scan.users_rows(table, 0, lambda u: 0, after, listed):
            read.append(user)
            if slices.read(0, user, len(rows())):
                break
        return read

    assert tick() == ["a"]
    db[b"b"] = json.dumps({"u": "b"}).encode()  # a new user, between the two
    assert tick() == ["c"]  # the cycle goes on in the list it began with
    assert tick() == []  # ... to its end
    assert [tick() for _ in range(3)] == [["a"], ["b"], ["c"]]
    db.close()


def test_the_sweep_budget_must_be_positive():
    with pytest.raises(ValueError):
        SweepSlices(0)
    with pytest.raises(ValueError):
        SweepSlices(1, max_seconds=0)


def test_a_partition_local_timer_reads_and_decodes_only_its_partitions_rows(tmp_path):
    """Issue 34: the analytics tick of each partition read (and decoded) every row of every
    active partition to keep its own, so a worker owning P partitions decoded the table P times
    per interval; a worker restarted alone spent most of its event loop there. `partition_items`
    reads the tick's partition's store only; another store is filtered by `owned`."""
    decoded: list[bytes] = []

    class Counting(_Store):
        def _decode_value(self, value: bytes) -> Any:
            decoded.append(value)
            return json.loads(value)

    store = Counting(tmp_path)
    rows = {p: {f"s{p}-{i}": {"p": p, "i": i} for i in range(5)} for p in (0, 1)}
    for p, mine in rows.items():
        db = store._db_for_partition(p)
        db[store.offset_key] = b"7"
        for key, row in mine.items():
            db[key.encode()] = json.dumps(row).encode()
    table = _Table(store)
    for p in (0, 1):
        decoded.clear()
        got = state_scan.partition_items(table, p, owned=lambda _k: False)  # not asked: RocksDB reads the partition
        assert sorted(got) == sorted(rows[p].items())
        assert len(decoded) == len(rows[p])  # the other partition's rows were not read
    standby = TP(_Table.changelog_topic_name, 1)
    ACTIVE.discard(standby)  # a standby copy is not read
    try:
        assert state_scan.partition_items(table, 1, owned=lambda _k: True) == []
    finally:
        ACTIVE.add(standby)
    for db in store._dbs.values():
        db.close()

    class Plain(dict):
        data = object()  # memory://: one dict for every partition

    plain = Plain({"a": {"n": 1}, "b": {"n": 2}, "c": None})
    assert state_scan.partition_items(plain, 0, owned=lambda k: k != "b") == [("a", {"n": 1})]


def test_a_users_history_rows_are_listed_by_key_and_read_on_demand(tmp_path):
    """`user_rows(history=False)`: the `~h/` rows of a user come as keys (`UNREAD`), every other
    row decoded; `user_history` reads those rows, `user_row` one of them; no other user's."""
    store = _Store(tmp_path)
    rows = {"u": {"a": 1}, "u/n-1": {"n": 1}, f"u/{HISTORY_KEY}h-1": {"h": 1}, f"u/{HISTORY_KEY}h-2": {"h": 2},
            "u/~pin/n-1": [1], "u/~seen/0": [], "u0/~h/x": {"other": 1}, "u/~h": {"not": "history"}}
    for key, row in rows.items():
        store._db_for_partition(partition_of(key.split("/")[0]))[key.encode()] = json.dumps(row).encode()
    rocks = _Table(store)
    p = partition_of("u")
    got = dict(state_scan.user_rows(rocks, "u", p, history=False))
    assert got == {k: (state_scan.UNREAD if f"/{HISTORY_KEY}" in k else v) for k, v in rows.items()
                   if k == "u" or k.startswith("u/")}
    assert dict(state_scan.user_rows(rocks, "u", p)) == {k: v for k, v in rows.items() if k == "u" or k.startswith("u/")}
    assert state_scan.user_history(rocks, "u", p) == [(f"u/{HISTORY_KEY}h-1", {"h": 1}), (f"u/{HISTORY_KEY}h-2", {"h": 2})]
    assert state_scan.user_row(rocks, f"u/{HISTORY_KEY}h-2", p) == {"h": 2}
    assert state_scan.user_row(rocks, f"u/{HISTORY_KEY}h-3", p) is None
    for db in store._dbs.values():
        db.close()


def test_a_store_without_rocksdb_is_scanned_whole():
    class Plain(dict):
        data = object()  # memory://: no per-partition databases

    table = Plain({"u": {"k": 1}, "u/n": {"k": 2}, "u-10/n": {"k": 3}, "v": {"k": 4}})
    assert sorted(state_scan.user_rows(table, "u", 0)) == [("u", {"k": 1}), ("u/n", {"k": 2})]
    assert state_scan.partition_users(table, 1, partition_of) == ["u", "v"]
    assert state_scan.partition_users(table, 1, partition_of, limit=1) == ["u"]
    assert state_scan.partition_users(table, 1, partition_of, limit=0) == []
    assert [(u, r()) for u, r in state_scan.users_rows(table, 1, partition_of)] == \
        [("u", [("u", {"k": 1}), ("u/n", {"k": 2})]), ("v", [("v", {"k": 4})])]


@pytest.mark.parametrize("days", [0, 2, 10, 40, 100, 400])
def test_a_user_the_sweep_skips_unread_is_one_the_sweep_would_not_change(days):
    """`may_expire` on the stored rows (a pending redo log included) against `sweep_memory` on
    the loaded user, at ages where nothing, some or every node expires."""
    stream = mixed(users=20, seed=5)
    table: dict[str, Any] = {}
    run(stream, {}, table)
    grouped = group_rows(table.items())
    first = next(iter(grouped))  # one user's node rows survive only in its aux row's redo log
    is_node = lambda key, row: key != first and isinstance(row, dict) and "node_id" in row  # noqa: E731
    moved = {k.split("/", 1)[1]: v for k, v in grouped[first] if is_node(k, v)}
    grouped[first] = [(first, {**table[first], "pending": moved})] + \
        [(k, v) for k, v in grouped[first] if k != first and not is_node(k, v)]
    now_ms = max(n["created_at"] for n in moved.values()) + days * 86_400_000
    policy = HousekeepingPolicy()
    changed = skipped = 0
    for user, rows in grouped.items():
        um = load_user(user, rows, dedup_max_ids=MAX_IDS, history=TableHistory(table, user)).memory
        out = sweep_memory(um, now_ms, policy)
        if not may_expire(rows, now_ms, policy):
            assert not out.node_deletions and not out.ledger, user
            skipped += 1
        changed += bool(out.node_deletions)
    assert skipped or changed  # one of the two happened at every age
    if days == 0:
        assert skipped == len(grouped)
    if days == 400:
        assert changed == len(grouped)


def test_an_unreadable_node_row_is_left_to_the_full_load():
    assert may_expire([("u/n-1", {"motebit_id": "u", "node_id": "n-1"})], 0, HousekeepingPolicy())


def test_a_row_put_by_hand_in_another_partition_is_read_with_its_user_but_swept_in_its_users_partition(tmp_path):
    """The worker writes a user's rows only in its partition; a row produced by hand into another
    partition (tests/system/test_poison_kafka.py does, to contain a user) is still read with the user,
    as a scan of the table reads it, and the other partition's sweep does not list the user."""
    store, user = _Store(tmp_path), "ab"  # partition_of("ab") == 0
    store._db_for_partition(0)[b"ab"] = json.dumps({"motebit_id": "ab"}).encode()
    store._db_for_partition(1)[b"ab/n-1"] = json.dumps({"motebit_id": "ab", "node_id": "n-1"}).encode()
    store._db_for_partition(1)[b"abc/n-1"] = json.dumps({"motebit_id": "abc"}).encode()
    rocks = _Table(store)
    assert state_scan.user_rows(rocks, user, 0) == [("ab", {"motebit_id": "ab"}),
                                                    ("ab/n-1", {"motebit_id": "ab", "node_id": "n-1"})]
    assert state_scan.partition_users(rocks, 0, partition_of) == ["ab"]
    assert state_scan.partition_users(rocks, 1, partition_of) == ["abc"]
    assert load_user(user, state_scan.user_rows(rocks, user, 0), dedup_max_ids=MAX_IDS).corrupt  # contained
    for db in store._dbs.values():
        db.close()


def test_a_node_row_missing_fields_is_completed_before_the_rule():
    """An older row without `half_life_ms` / `updated_at` expires by the completed node's values."""
    policy, day = HousekeepingPolicy(), 86_400_000
    old = {**NODE, "motebit_id": "u", "memory_type": "episodic", "confidence": 0.6, "created_at": 0}
    del old["updated_at"]  # completed from created_at; the episodic half-life is 3 days
    assert may_expire([("u/n-1", old)], 10 * day, policy)
    assert not may_expire([("u/n-1", old)], 0, policy)


@pytest.mark.parametrize("var", ["MEMSTREAM_LOADED_NODES_MAX", "MEMSTREAM_HOUSEKEEPING_MAX_ROWS_PER_TICK"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_bound_below_one_is_a_settings_error_naming_the_variable(var, value):
    from streams.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=f"{var}={value} must be at least 1"):
        Settings.from_env({var: value})


@pytest.mark.parametrize("value", ["0", "-0.5"])
def test_a_tick_time_budget_not_above_zero_is_a_settings_error(value):
    from streams.settings import Settings, SettingsError

    assert Settings.from_env({}).housekeeping_max_seconds_per_tick == 0.1
    with pytest.raises(SettingsError, match=f"MEMSTREAM_HOUSEKEEPING_MAX_SECONDS_PER_TICK={float(value)} must be more than 0"):
        Settings.from_env({"MEMSTREAM_HOUSEKEEPING_MAX_SECONDS_PER_TICK": value})
