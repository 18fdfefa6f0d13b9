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
3. writes the staged rows, each row once (its last value) and in the partition of the last event
   that staged it (Faust puts a row on the changelog partition of the current event, which for
   co-partitioned keys is the input partition). Rows staged with ``first=True`` are written
   before the others, so in every changelog partition they precede the rows they describe. The
   runtime writes a RocksDB table's rows itself, byte for byte as Faust would, one write batch
   per partition store (`Sink.write_rows`, `Runtime.write_rows`).

4. waits until every changelog write of step 3 is acknowledged by the broker (Faust would
   otherwise leave them in its producer buffer, and a stopping worker may commit its offsets
   before that buffer is flushed).

The source offsets are acknowledged (and later committed) only after step 4. A batch never
grows one row group's staged bytes past a budget (`Checkpoint.add_bytes`, called by the agent that
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

The checkpoint a handler gets
-----------------------------
`run_batch` creates one `Checkpoint` per batch attempt and hands it to the handler with every
event: ``handler(cp, event)`` (the runtime's `stateful_agent` calls ``apply(cp, event, key,
record)``, `Runtime.ticks` ``sweep(cp, partition, now_ms)``). Everything the handler does that
must wait for the batch goes through it; nothing is found through an ambient variable:

* ``await cp.send(topic, key, value)`` — an output record (None: a tombstone); step 1.
* ``await cp.dead_letter(stage, reason, error_class)`` — the current event to the dead-letter topic.
* ``cp.record_ack(ack)`` — a record the handler sent itself (e.g. to an internal topic through
  Faust): the batch awaits ``ack`` in step 2.
* ``cp.write(table, key, value, first=False)`` (``DELETE`` removes the row; a callable
  ``value(cp)`` is evaluated when written), ``cp.update(table, key, fn)`` — staged for step 3.
* ``cp.read(table, key)`` — the row as this attempt sees it (its own staged writes included);
  ``cp.staged_rows(table, group)``; ``cp.add_bytes(group, n, budget)`` (above).
* ``rt.feed_analytics(cp, increments)`` / ``rt.erase_analytics(cp, subject)`` — the pipeline's
  hooks (streams/runtime/handlers.py) stage their updates through the same checkpoint.

A checkpoint belongs to one attempt: once the attempt is written or dropped it is *finished*, and
any later send, ack or staged write through it raises `CheckpointFinished` (an effect that would
otherwise slip out of the protocol, e.g. from a task the handler left running). Two batches
running at once (another agent, a timer) each have their own checkpoint, so neither can stage
into, wait for, or drop the other's effects. The runtime side (`Runtime`, the `Sink` protocol)
sends the records, and while the rows are written (step 3, synchronous: no other task runs in
between) routes the tables' changelog acknowledgements to the checkpoint (`Sink.write_rows`).

Tables with more than one writer
--------------------------------
Step 2 awaits the broker, so other agents' batches and timers run between a batch's reads and
its writes. A row staged as a *value* is what the batch computed from what it read: if another
writer changed the row meanwhile, writing the value loses that change. So every table has one
writer discipline, and a table written by several agents uses one of these two:

* **one lock**: every writer of the table runs its batches under the same `asyncio.Lock`
  (passed to `Runtime.stateful_agent` / `Runtime.ticks`), from its first read to its last
  write. The writers then never interleave; staged values are safe.
* **updates** (`Checkpoint.update`): a write staged as a function ``fn(row) -> row``, applied in step 3 to
  the row *as it is then* (a private copy of it; None when absent), after the batch's earlier
  staged writes of that key. Writers may then interleave freely as long as their functions
  commute on what they change (adding to counters does; marking "published up to revision r"
  does). `updates_only(table)` makes `Checkpoint.write` refuse plain values for such a table.
  An update may return ``KEEP`` (nothing is written for it) and may say what to write when the
  stored row does not decode (``unreadable``): the analytics agent contains a subject whose row it
  cannot read instead of failing every batch that touches it.

Which table uses which (keep this list current when adding a writer: `Runtime.tables` lists
the tables; grep `cp.write(`, `cp.update(` and `feed_analytics` for their writers;
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
import functools
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from faust.stores.base import SerializedStore
from faust.types import EventT, TableT

from streams.runtime import faust_internals

DELETE = object()  #: a staged value meaning "remove the row"
#: what an update returns to leave its row as it was: nothing is written for it (the row stays as
#: stored, or as the attempt's earlier writes of the key left it)
KEEP = object()


class CheckpointFinished(RuntimeError):
    """An effect through a checkpoint whose attempt is already written or dropped."""


@dataclass(frozen=True)
class Update:
    """A write computed from the row as it is when written: ``fn(row)`` gets a private copy of
    the row (None when absent) and returns the new row, or DELETE. It may run more than once
    for one write when the batch reads the key back (`Checkpoint.read`), so keep it free of
    effects other than on the row (counting statistics is tolerable)."""

    fn: Callable[[Any], Any]
    #: the value (a row, DELETE or KEEP) to use when the stored row cannot be read (its bytes do
    #: not decode); without it, the read's error fails the batch
    unreadable: Callable[[Exception], Any] | None = None
    #: False: `fn` does not look at the row (it is given None; nothing is read)
    reads: bool = True

    def apply(self, read: Callable[[], Any]) -> Any:
        """`fn` of the stored row, `read()` (or `unreadable` of the error the read raised)."""
        if not self.reads:
            return self.fn(None)
        if self.unreadable is None:
            return self.fn(read())
        try:
            row = read()
        except Exception as exc:  # noqa: BLE001 - a stored row that does not decode, whatever its decoder raised
            return self.unreadable(exc)
        return self.fn(row)


@dataclass
class _Write:
    table: TableT
    key: str
    value: Any  # a row, DELETE, an Update, or a callable(checkpoint) -> row evaluated when written
    event: EventT
    first: bool


class Row(NamedTuple):
    """One row a checkpoint writes in step 3: `value` a row or DELETE, in `event`'s partition."""

    table: TableT
    key: str
    value: Any
    event: EventT


def write_through_tables(rows: Iterable[Row]) -> None:
    """Write rows as a Faust agent does (`table[key] = row`, `table.pop(key)`, each in the context
    of its event): the store and the changelog of any table (RocksDB: the value encoded once for
    both, `faust_internals.encoded_row`)."""
    for row in rows:
        with in_event(row.event):
            if row.value is DELETE:
                row.table.pop(row.key, None)
            else:
                row.table[row.key] = faust_internals.encoded_row(row.table, row.value)


#: id(table) -> a reference to it (tables are unhashable; the reference tells a reused id apart)
_UPDATES_ONLY: dict[int, Callable[[], Any]] = {}


def updates_only(table: TableT) -> TableT:
    """Declare a table with several unsynchronized writers: `Checkpoint.write` of a plain value
    (which would overwrite the others' changes made since it was read) raises; use `update`."""
    try:
        ref: Callable[[], Any] = weakref.ref(table)
    except TypeError:  # not weak-referenceable: keep it (tables live as long as the app)
        ref = lambda: table  # noqa: E731
    _UPDATES_ONLY[id(table)] = ref
    return table


def is_updates_only(table: TableT) -> bool:
    ref = _UPDATES_ONLY.get(id(table))
    return ref is not None and ref() is table


def current_row(table: TableT, key: str) -> Any:
    """A private copy of the row: a serialized store (RocksDB) decodes a new object on every
    read; any other (memory://, a test's dict) hands out its stored object itself."""
    row = faust_internals.read_row(table, key)
    return row if isinstance(getattr(table, "data", None), SerializedStore) else copy.deepcopy(row)


def _then(first: Any, then: Update, cp: Checkpoint, read: Callable[[], Any]) -> Update:
    """`then` applied after an earlier staged value of the same key (a value, DELETE, an Update
    or a callable(checkpoint)); `read()` reads the stored row."""
    if isinstance(first, Update):
        def unreadable(exc: Exception) -> Any:
            return _after(first.unreadable(exc), then, read)  # type: ignore[misc]
        return Update(lambda row: _after(first.fn(row), then, read),
                      unreadable if first.unreadable is not None else None, first.reads)

    def fn(_row: Any) -> Any:
        before = DELETE if first is DELETE else first(cp) if callable(first) else copy.deepcopy(first)
        return _after(before, then, read)
    return Update(fn, reads=False)


def _after(before: Any, then: Update, read: Callable[[], Any]) -> Any:
    """What `then` makes of the value an earlier write left (`before`): after KEEP, `then` gets
    the stored row (read again); `then` returning KEEP leaves `before`."""
    after = then.apply(read) if before is KEEP else then.fn(None if before is DELETE else before)
    return before if after is KEEP else after


#: `with in_event(event):` makes `event` Faust's current event (a table write goes to its partition).
in_event = faust_internals.current_event


class Sink(Protocol):
    """The runtime side of a checkpoint (`streams.runtime.app.Runtime`)."""

    async def send(self, topic: str, key: str, value: dict | None,
                   headers: list[tuple[str, bytes]] | None = None, cp: Checkpoint | None = None) -> None:
        """Send an output record; with `cp`, its acknowledgement joins the checkpoint's."""

    async def dead_letter(self, cp: Checkpoint, event: EventT, stage: str, reason: str, error_class: str,
                          keep_value: bool = True) -> None:
        """Send `event`'s record to the dead-letter topic, acknowledged with `cp`."""

    def write_rows(self, cp: Checkpoint, rows: list[Row]) -> None:
        """Step 3: write `cp`'s rows in this order (synchronously); the acknowledgements of their
        changelog records are `cp`'s (`cp.record_state_ack`)."""

    def read_row(self, table: TableT, key: str) -> Any:
        """The row an update staged for `key` is applied to, in step 3 (the current event's
        partition): a private object, which the update may change (`current_row`)."""


class Checkpoint:
    """The held-back effects of one attempt at a batch of events (see the module docstring for
    what a handler may do with it)."""

    def __init__(self, sink: Sink | None = None) -> None:
        self._sink = sink
        self.event: EventT | None = None  #: the event being handled
        self.acks: list[Awaitable[Any]] = []  #: outputs to wait for (step 2)
        #: changelog deliveries of the row writes (step 4)
        self.state_acks: list[Awaitable[Any]] = []
        #: the last write per (table, key), in the order each key was first staged
        self._writes: dict[tuple[int, str], _Write] = {}
        #: keys staged per (table, group) for `staged_rows` (group: the key up to `group_sep`)
        self._groups: dict[tuple[int, str], list[str]] = {}
        #: bytes staged per row group (`add_bytes`); `full` once one is over its budget
        self._group_bytes: dict[str, int] = {}
        self.full = False
        self.finished = False
        #: the acknowledgements of the records the attempt sent through the worker's output
        #: producer (streams/runtime/outputs.py: one awaitable for all of them, also in `acks`)
        self.deliveries: Any = None
        #: the same for the changelog rows it writes (also in `state_acks`)
        self.state_deliveries: Any = None

    def _open(self) -> None:
        if self.finished:
            raise CheckpointFinished("this batch attempt is already written or dropped: its checkpoint "
                                     "takes no more effects")

    # -- outputs (step 1, awaited in step 2)
    async def send(self, topic: str, key: str, value: dict | None,
                   headers: list[tuple[str, bytes]] | None = None) -> None:
        """Send an output record (`value` None: a tombstone); the batch awaits its
        acknowledgement before writing any row."""
        self._open()
        if self._sink is None:
            raise RuntimeError("this checkpoint has no runtime to send through")
        await self._sink.send(topic, key, value, headers, cp=self)

    async def dead_letter(self, stage: str, reason: str, error_class: str, keep_value: bool = True) -> None:
        """Send the event being handled to the dead-letter topic (`keep_value=False`: without its
        value bytes), acknowledged with the batch's outputs."""
        self._open()
        if self._sink is None or self.event is None:
            raise RuntimeError("a dead letter needs a runtime and an event being handled")
        await self._sink.dead_letter(self, self.event, stage, reason, error_class, keep_value)

    def record_ack(self, ack: Awaitable[Any]) -> None:
        """A record sent some other way: the batch awaits `ack` before writing any row."""
        self._open()
        self.acks.append(ack)

    def record_state_ack(self, ack: Awaitable[Any]) -> None:
        """A changelog write of this checkpoint's rows: awaited before the offsets may be
        acknowledged (called by the runtime while the rows are written)."""
        self.state_acks.append(ack)

    # -- staged state (written in step 3)
    def write(self, table: TableT, key: str, value: Any, first: bool = False, group_sep: str = "/") -> None:
        """Stage a row (DELETE: remove it; a callable ``value(cp)``: evaluated when written).
        `first` rows are written before the others."""
        self._open()
        if is_updates_only(table) and not isinstance(value, Update):
            raise TypeError(f"table {getattr(table, 'name', table)!r} has several writers: "
                            "change its rows with cp.update, not by writing a value")
        assert self.event is not None, "a write outside an event"
        slot = (id(table), key)
        if slot not in self._writes:
            group = key.split(group_sep, 1)[0]
            self._groups.setdefault((id(table), group), []).append(key)
        elif isinstance(value, Update):
            value = _then(self._writes[slot].value, value, self, lambda: self._stored_row(table, key))
        self._writes[slot] = _Write(table, key, value, self.event, first)

    def update(self, table: TableT, key: str, fn: Callable[[Any], Any], first: bool = False,
               unreadable: Callable[[Exception], Any] | None = None) -> None:
        """Stage `fn(row) -> row` (or DELETE, or KEEP: nothing written), applied to the row as it is
        when written, after this attempt's earlier writes of the key: the discipline of a table
        that several agents write without a common lock. `fn` owns the row it is given (it may
        change it, also when it returns KEEP) and returns it or a new object that nothing else
        keeps: the runtime may keep the row it writes, decoded, for the key's next update
        (streams/runtime/row_cache.py). `unreadable(error)`: the value instead, when the stored
        row does not decode (without it, that fails the batch)."""
        self.write(table, key, Update(fn, unreadable), first)

    def last_staged(self, table: TableT, key: str) -> Any:
        """The value this attempt last staged for the key (an `Update`, a row, DELETE), else None:
        a writer that staged an update whose function it can still extend (its own, and still the
        key's last write) may add to it instead of staging another."""
        w = self._writes.get((id(table), key))
        return None if w is None else w.value

    def read(self, table: TableT, key: str, default: Any = None) -> Any:
        """Read through the attempt: the last value staged for the key (an update: applied to
        the table's row as it is now), else the table's."""
        w = self._writes.get((id(table), key))
        if w is None:
            return table.get(key, default)
        value = w.value.apply(lambda: current_row(table, key)) if isinstance(w.value, Update) else w.value
        if value is KEEP:
            return table.get(key, default)
        return default if value is DELETE else value

    def staged_rows(self, table: TableT, group: str) -> dict[str, Any]:
        """The last staged value of every key of `table` of the form `<group>/...` (DELETE kept;
        an update applied to the table's row as it is now)."""
        out = {}
        for k in self._groups.get((id(table), group), ()):
            if k != group:
                v = self._writes[(id(table), k)].value
                stored: Callable[[], Any] = functools.partial(current_row, table, k)
                out[k] = v.apply(stored) if isinstance(v, Update) else v
                if out[k] is KEEP:
                    out[k] = stored()
        return out

    def add_bytes(self, group: str, n: int, budget: int) -> None:
        """Count `n` staged bytes for a row group; over `budget`, the batch ends after this event."""
        total = self._group_bytes[group] = self._group_bytes.get(group, 0) + n
        if total > budget:
            self.full = True

    # -- the protocol (run_batch)
    async def _wait_for_outputs(self) -> None:
        if self.acks:
            await asyncio.gather(*self.acks)
            self.acks.clear()

    async def _wait_for_state(self) -> None:
        if self.state_acks:
            await asyncio.gather(*self.state_acks)
            self.state_acks.clear()

    def _stored_row(self, table: TableT, key: str) -> Any:
        """The row an update is applied to in step 3 (`Sink.read_row`; `current_row` without a sink)."""
        return current_row(table, key) if self._sink is None else self._sink.read_row(table, key)

    def _evaluate(self, w: _Write) -> Any:
        """The row a staged value stands for, now."""
        if isinstance(w.value, Update):
            return w.value.apply(lambda: self._stored_row(w.table, w.key))
        if callable(w.value):
            return w.value(self)
        return w.value

    def _write_state(self) -> None:
        """Write the staged rows: `first` ones, then the rest; each once, with its last value.
        Synchronous: no other batch runs while the rows are written."""
        ordered = sorted(self._writes.values(), key=lambda w: not w.first)  # stable: staging order kept
        rows = []
        for w in ordered:  # every value first (an update reads its row), then the writes
            with in_event(w.event):
                value = self._evaluate(w)
            if value is not KEEP:
                rows.append(Row(w.table, w.key, value, w.event))
        if self._sink is not None:
            self._sink.write_rows(self, rows)
        else:
            write_through_tables(rows)
        self._writes.clear()
        self._groups.clear()


class DerivedCache(Protocol):
    """State an agent derives from its tables (e.g. the memory agent's per-user index)."""

    def refresh(self) -> None:
        """Rebuild from the tables if invalidated (called with no batch in progress)."""

    def invalidate(self) -> None:
        """Mark stale: it holds effects that were dropped, or partitions moved."""


async def run_batch(events: list[EventT], handle: Callable[[Checkpoint, EventT], Awaitable[bool]],
                    cache: DerivedCache | None = None, sink: Sink | None = None) -> None:
    """Run `handle(cp, event)` (True = handled, False = failed unexpectedly and dead-lettered)
    over the events with the outputs-first protocol described above, one `Checkpoint` per
    attempt (sending through `sink`). The `cache` derived from the tables is refreshed before
    each attempt and invalidated after a failed one (it holds the dropped attempt's effects). An
    attempt that fills its checkpoint (`Checkpoint.full`) is made durable at once and the
    remaining events continue in a new attempt."""
    todo = list(events)
    while todo:
        if cache is not None:
            cache.refresh()
        cp = Checkpoint(sink)
        failed = None
        ran = len(todo)
        try:
            for i, event in enumerate(todo):
                cp.event = event
                if not await handle(cp, event):
                    failed = i
                    break
                if cp.full:
                    ran = i + 1
                    break
            await cp._wait_for_outputs()
            if failed is None:
                cp._write_state()
                await cp._wait_for_state()
                todo = todo[ran:]
                continue
        finally:
            cp.finished = True
        # drop this attempt's state; caches are rebuilt from the tables; run the rest again
        if cache is not None:
            cache.invalidate()
        todo = todo[:failed] + todo[failed + 1:]
