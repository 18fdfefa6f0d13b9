"""Outputs first, state after: how a stateful agent stays consistent across a crash.

Kafka has no atomic write across topics without transactions, and Faust writes a table row to
its local store at once and to its changelog through the same buffered producer as the outputs,
in no guaranteed order across partitions. If a table row that marks an input as applied became
durable before that input's outputs, a crash in between would lose the outputs for good: the
re-delivered input would be found "already seen". So a stateful agent takes its input in batches
and, for each batch:

1. runs every event (decode, the pure core, sends): outputs and dead letters go to the producer
   and their acknowledgements are collected; table writes are only *staged* here;
2. waits until every output of the batch is acknowledged by the broker;
3. writes the staged rows, each row once (its last value) and in the context of the last event
   that staged it (Faust puts a row on the changelog partition of the current event, which for
   co-partitioned keys is the input partition). Rows staged with ``first=True`` are written
   before the others, so in every changelog partition they precede the rows they describe.

4. waits until every changelog write of step 3 is acknowledged by the broker (Faust would
   otherwise leave them in its producer buffer, and a stopping worker may commit its offsets
   before that buffer is flushed).

The source offsets are acknowledged (and later committed) only after step 4. A batch never
grows one row group's staged bytes past a budget (`Batch.add_bytes`, called by the agent that
knows its rows): once a group is over it, the events handled so far are made durable (steps
2-4) and the rest of the batch continues in a new one — so a row that carries a batch's other
rows as a redo log is bounded by the budget plus one record's rows, whatever the backlog. A crash before
step 3 re-processes the batch: the same outputs again, with the same derived ids (so a consumer
recognizes the duplicates), and no state. A crash during step 3 leaves, in each changelog
partition, a prefix of the writes: an agent that writes a summary row ``first`` (the memory agent's
per-user row, which also carries the node rows of the batch as a redo log) can always rebuild.

A handler that fails unexpectedly (a bug, not bad input) has its record dead-lettered by
`Runtime.guard`; the attempt's staged state is dropped, the agent's derived caches are rebuilt
from the tables (`DerivedCache.invalidate`) and the batch runs again without that record.

Tables with more than one writer
--------------------------------
Step 2 awaits the broker, so other agents' batches and timers run between a batch's reads and
its writes. A row staged as a *value* is what the batch computed from what it read: if another
writer changed the row meanwhile, writing the value loses that change. So every table has one
writer discipline, and a table written by several agents uses one of these two:

* **one lock**: every writer of the table runs its batches under the same `asyncio.Lock`
  (passed to `Runtime.stateful_agent` / `Runtime.ticks`), from its first read to its last
  write. The writers then never interleave; staged values are safe.
* **updates** (`update`): a write staged as a function ``fn(row) -> row``, applied in step 3 to
  the row *as it is then* (a private copy of it; None when absent), after the batch's earlier
  staged writes of that key. Writers may then interleave freely as long as their functions
  commute on what they change (adding to counters does; marking "published up to revision r"
  does). `updates_only(table)` makes `write` refuse plain values for such a table.

Which table uses which (keep this list current when adding a writer: `Runtime.tables` lists
the tables; grep `checkpoint.write(`, `checkpoint.update(` and `feed_analytics` for their writers;
docs/state.md has the same list):

- ``analytics``: updates. Writers: the analytics feed (`Runtime.feed_analytics`), called from
  the memory agent's batches, the memory housekeeping tick, the session agent, the graph agent
  and every dead letter (`Runtime.dead_letter`, any agent); the analytics publish tick; and an
  erasure's last step (`Runtime.erase_analytics`, an update that returns DELETE).
- ``memory-state``: one lock (``MemoryStore.lock``): the memory agent and the memory
  housekeeping tick.
- ``graph-state``: one lock (the graph module's): the graph agent and the graph stall tick.
- ``negotiator`` (memory agent), ``session-ledger`` (session agent), ``relay-policy``
  (relay-policy agent): a single writer each.
"""

from __future__ import annotations

import asyncio
import copy
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from faust.stores.base import SerializedStore
from faust.types import EventT, TableT

from streams.runtime import faust_internals

DELETE = object()  #: a staged value meaning "remove the row"


@dataclass(frozen=True)
class Update:
    """A write computed from the row as it is when written: ``fn(row)`` gets a private copy of
    the row (None when absent) and returns the new row, or DELETE. It may run more than once
    for one write when the batch reads the key back (`read`), so keep it free of effects other
    than on the row (counting statistics is tolerable)."""

    fn: Callable[[Any], Any]


@dataclass
class _Write:
    table: TableT
    key: str
    value: Any  # a row, DELETE, an Update, or a callable(batch) -> row evaluated when written
    event: EventT
    first: bool


#: id(table) -> a reference to it (tables are unhashable; the reference tells a reused id apart)
_UPDATES_ONLY: dict[int, Callable[[], Any]] = {}


def updates_only(table: TableT) -> TableT:
    """Declare a table with several unsynchronized writers: `write` of a plain value (which
    would overwrite the others' changes made since it was read) raises; use `update`."""
    try:
        ref: Callable[[], Any] = weakref.ref(table)
    except TypeError:  # not weak-referenceable: keep it (tables live as long as the app)
        ref = lambda: table  # noqa: E731
    _UPDATES_ONLY[id(table)] = ref
    return table


def _current(table: TableT, key: str) -> Any:
    """A private copy of the row: a serialized store (RocksDB) decodes a new object on every
    read; any other (memory://, a test's dict) hands out its stored object itself."""
    row = table.get(key)
    return row if isinstance(getattr(table, "data", None), SerializedStore) else copy.deepcopy(row)


def _evaluate(value: Any, table: TableT, key: str, batch: "Batch | None") -> Any:
    """The row a staged value stands for, now."""
    if isinstance(value, Update):
        return value.fn(_current(table, key))
    if callable(value):
        return value(batch)
    return value


def _then(first: Any, then: Update, batch: "Batch") -> Update:
    """`then` applied after an earlier staged value of the same key (a value, DELETE, an Update
    or a callable(batch))."""
    def fn(row: Any) -> Any:
        if isinstance(first, Update):
            before = first.fn(row)
        elif first is DELETE:
            before = DELETE
        elif callable(first):
            before = first(batch)
        else:
            before = copy.deepcopy(first)
        return then.fn(None if before is DELETE else before)
    return Update(fn)


@dataclass
class Batch:
    """The held-back effects of one attempt at a batch of events."""

    acks: list[Awaitable[Any]] = field(default_factory=list)
    #: the last write per (table, key), in the order each key was first staged
    writes: dict[tuple[int, str], _Write] = field(default_factory=dict)
    #: keys staged per (table, group) for `staged_rows` (group: the key up to `group_sep`)
    groups: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    event: EventT | None = None  #: the event being handled
    #: changelog deliveries of `write_state` (Faust's FutureMessage per table write)
    state_acks: list[Awaitable[Any]] = field(default_factory=list)
    #: bytes staged per row group (`add_bytes`); `full` once one is over its budget
    group_bytes: dict[str, int] = field(default_factory=dict)
    full: bool = False
    #: the acknowledgements of the records the batch sent through the worker's output producer
    #: (streams/runtime/outputs.py: one awaitable for all of them, also in `acks`)
    deliveries: Any = None
    #: the same for the changelog rows of `write_state` (also in `state_acks`)
    state_deliveries: Any = None

    def add_bytes(self, group: str, n: int, budget: int) -> None:
        """Count `n` staged bytes for a row group; over `budget`, the batch ends after this event."""
        total = self.group_bytes[group] = self.group_bytes.get(group, 0) + n
        if total > budget:
            self.full = True

    def stage(self, table: TableT, key: str, value: Any, first: bool = False, group_sep: str = "/") -> None:
        assert self.event is not None, "stage() outside an event"
        slot = (id(table), key)
        if slot not in self.writes:
            group = key.split(group_sep, 1)[0]
            self.groups.setdefault((id(table), group), []).append(key)
        elif isinstance(value, Update):
            value = _then(self.writes[slot].value, value, self)
        self.writes[slot] = _Write(table, key, value, self.event, first)

    def staged(self, table: TableT, key: str, default: Any = None) -> Any:
        """Read through the batch: the last value staged for the key (an update: applied to
        the table's row as it is now), else the table's."""
        w = self.writes.get((id(table), key))
        if w is None:
            return table.get(key, default)
        value = w.value.fn(_current(table, key)) if isinstance(w.value, Update) else w.value
        return default if value is DELETE else value

    def staged_rows(self, table: TableT, group: str) -> dict[str, Any]:
        """The last staged value of every key of `table` of the form `<group>/...` (DELETE kept;
        an update applied to the table's row as it is now)."""
        out = {}
        for k in self.groups.get((id(table), group), ()):
            if k != group:
                v = self.writes[(id(table), k)].value
                out[k] = v.fn(_current(table, k)) if isinstance(v, Update) else v
        return out

    async def wait_for_outputs(self) -> None:
        if self.acks:
            await asyncio.gather(*self.acks)
            self.acks.clear()

    async def wait_for_state(self) -> None:
        if self.state_acks:
            await asyncio.gather(*self.state_acks)
            self.state_acks.clear()

    def write_state(self) -> None:
        """Write the staged rows: `first` ones, then the rest; each once, with its last value."""
        ordered = sorted(self.writes.values(), key=lambda w: not w.first)  # stable: staging order kept
        for w in ordered:
            with in_event(w.event):
                value = _evaluate(w.value, w.table, w.key, self)
                if value is DELETE:
                    w.table.pop(w.key, None)
                else:
                    w.table[w.key] = value
        self.writes.clear()
        self.groups.clear()


_CURRENT: ContextVar[Batch | None] = ContextVar("memstream_batch", default=None)


def current_batch() -> Batch | None:
    return _CURRENT.get()


#: `with in_event(event):` makes `event` Faust's current event (a table write goes to its partition).
in_event = faust_internals.current_event


def record_ack(ack: Awaitable[Any]) -> None:
    """Called for every send: inside a batch, the batch waits for it before writing state."""
    batch = _CURRENT.get()
    if batch is not None:
        batch.acks.append(ack)


def record_state_ack(ack: Awaitable[Any]) -> None:
    """Called for every changelog write: inside a batch, the batch waits for it before the
    batch's source offsets may be acknowledged."""
    batch = _CURRENT.get()
    if batch is not None:
        batch.state_acks.append(ack)


def add_bytes(group: str, n: int, budget: int) -> None:
    """Count staged bytes of a row group in the current batch (see `Batch.add_bytes`)."""
    batch = _CURRENT.get()
    if batch is not None:
        batch.add_bytes(group, n, budget)


def write(table: TableT, key: str, value: Any, first: bool = False) -> None:
    """Set (or, with DELETE, remove) a table row: staged inside a batch, at once outside one."""
    ref = _UPDATES_ONLY.get(id(table))
    if ref is not None and ref() is table and not isinstance(value, Update):
        raise TypeError(f"table {getattr(table, 'name', table)!r} has several writers: "
                        "change its rows with checkpoint.update, not by writing a value")
    batch = _CURRENT.get()
    if batch is not None:
        batch.stage(table, key, value, first)
        return
    value = _evaluate(value, table, key, None)
    if value is DELETE:
        table.pop(key, None)
    else:
        table[key] = value


def update(table: TableT, key: str, fn: Callable[[Any], Any], first: bool = False) -> None:
    """Change a row by `fn(row) -> row` (or DELETE) applied to the row as it is when written:
    staged inside a batch (after the batch's earlier writes of the key), at once outside one.
    The discipline of a table that several agents write without a common lock."""
    write(table, key, Update(fn), first)


def read(table: TableT, key: str, default: Any = None) -> Any:
    """A table row as the current batch sees it (its own staged writes included)."""
    batch = _CURRENT.get()
    return batch.staged(table, key, default) if batch is not None else table.get(key, default)


class DerivedCache(Protocol):
    """State an agent derives from its tables (e.g. the memory agent's per-user index)."""

    def refresh(self) -> None:
        """Rebuild from the tables if invalidated (called with no batch in progress)."""

    def invalidate(self) -> None:
        """Mark stale: it holds effects that were dropped, or partitions moved."""


async def run_batch(events: list[EventT], handle: Callable[[EventT], Awaitable[bool]],
                    cache: DerivedCache | None = None) -> None:
    """Run `handle` (True = handled, False = failed unexpectedly and dead-lettered) over the
    events with the outputs-first protocol described above. The `cache` derived from the
    tables is refreshed before each attempt and invalidated after a failed one (it holds the
    dropped attempt's effects). An attempt that fills its batch (`Batch.full`) is made durable
    at once and the remaining events continue in a new attempt."""
    todo = list(events)
    while todo:
        if cache is not None:
            cache.refresh()
        batch = Batch()
        token = _CURRENT.set(batch)
        failed = None
        ran = len(todo)
        try:
            for i, event in enumerate(todo):
                batch.event = event
                if not await handle(event):
                    failed = i
                    break
                if batch.full:
                    ran = i + 1
                    break
            await batch.wait_for_outputs()
            if failed is None:
                batch.write_state()
                await batch.wait_for_state()
                todo = todo[ran:]
                continue
        finally:
            _CURRENT.reset(token)
        # drop this attempt's state; caches are rebuilt from the tables; run the rest again
        if cache is not None:
            cache.invalidate()
        todo = todo[:failed] + todo[failed + 1:]
