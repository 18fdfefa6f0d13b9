"""The `analytics` table has several writers (issue 17): the publish tick, and every agent that
feeds increments (memory batches, the memory housekeeping tick, sessions, graphs, dead letters)
— each under its own lock. These tests hold the tick between its read of a row and its write
(its send is gated) while a batch adds increments to that row, and check nothing is lost.

The table stores serialized values, as RocksDB does (every read is a fresh object): with a
`memory://` table both sides would share one dict object, which hides the race. The agent code
is the real `streams.agents.analytics.register`; only the Runtime around it is faked (no broker).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from streams.agents import analytics as analytics_agent
from streams.analytics import Increment, windows_of
from streams.contracts import catalog
from streams.runtime import checkpoint

NOW = 1_793_491_200_000  # a minute boundary
USER = "u1"


class SerializedTable:
    """A table whose rows are stored as JSON text, like Faust's RocksDB store: `get` returns a
    new object every time, and nothing but a write changes a stored row."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}

    def get(self, key, default=None):
        raw = self.rows.get(key)
        return default if raw is None else json.loads(raw)

    def __getitem__(self, key):
        return json.loads(self.rows[key])

    def __setitem__(self, key, value) -> None:
        self.rows[key] = json.dumps(value)

    def pop(self, key, default=None):
        self.rows.pop(key, None)  # not decoded, as the runtime's direct RocksDB write deletes (Runtime._write_direct)
        return default

    def items(self):
        return [(k, json.loads(v)) for k, v in self.rows.items()]

    def __contains__(self, key) -> bool:
        return key in self.rows


class SharedTable(dict):
    """A `memory://`-like table: `get` returns the stored object itself."""


class Event:
    def __init__(self, partition: int, offset: int) -> None:
        self.message = SimpleNamespace(partition=partition, offset=offset)


class FakeRuntime:
    """Just what `streams.agents.analytics.register` uses of `streams.runtime.app.Runtime`."""

    def __init__(self, table) -> None:
        self._table = table
        self.sent: list[tuple[str, str, dict]] = []
        self.gate: asyncio.Event | None = None  # when set up, every send waits for it
        self.held = asyncio.Event()  # set once a send is waiting at the gate
        self.counts: dict[str, int] = {}
        self.tick_handler = None
        self.hooks: list = []
        self.settings = SimpleNamespace(partitions=1)
        self.rebalance_handlers: list = []
        self.gauges: dict[str, float] = {}
        self.app = SimpleNamespace(on_partitions_assigned=SimpleNamespace(connect=self.rebalance_handlers.append))
        self.metrics = SimpleNamespace(set_gauge=self.gauges.__setitem__)

    def table(self, name: str):
        assert name == "analytics"
        return self._table

    def add_hook(self, hook) -> None:
        self.hooks.append(hook)

    def feed_analytics(self, cp, increments) -> None:
        for hook in self.hooks:
            hook.increments(cp, increments)

    def partition_of(self, key: str) -> int:
        return 0

    def ticks(self, name, owner_topic, handler, cache=None, lock=None) -> None:
        self.tick_handler = handler

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    # the runtime side of a checkpoint (streams.runtime.checkpoint.Sink)
    async def send(self, topic: str, key: str, value: dict, headers=None, cp=None) -> None:
        if self.gate is not None:
            self.held.set()
            await self.gate.wait()
        self.sent.append((topic, key, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        cp.record_ack(fut)

    def read_row(self, table, key):
        return checkpoint.current_row(table, key)

    def write_rows(self, cp, rows):
        checkpoint.write_through_tables(rows)

    # what Runtime.ticks / Runtime.stateful_agent do around a handler
    async def tick(self, partition: int, offset: int, now_ms: int = NOW + 5_000) -> None:
        async def handle(cp, _ev) -> bool:
            await self.tick_handler(cp, partition, now_ms)
            return True

        await checkpoint.run_batch([Event(partition, offset)], handle, sink=self)

    async def batch(self, partition: int, offset: int, increments: list[Increment]) -> None:
        async def handle(cp, _ev) -> bool:
            self.feed_analytics(cp, increments)
            return True

        await checkpoint.run_batch([Event(partition, offset)], handle, sink=self)


def formed(i: int, subject: str = USER, t: int = NOW + 1_000) -> Increment:
    return Increment(subject, t, {"formed": 1}, f"ledger:e{i}")


def minute_count(table, subject: str = USER, counter: str = "formed") -> int:
    state = table.get(subject)
    return sum(w["counters"].get(counter, 0) for w in windows_of(state, "minute")) if state else 0


def latest_published(rt: FakeRuntime, subject: str = USER) -> dict[tuple[str, int], dict]:
    out = {}
    for topic, key, record in rt.sent:
        if topic == catalog.MEMORY_ANALYTICS and key == subject:
            out[(record["window"], record["window_start"])] = record
    return out


@pytest.mark.parametrize("make_table", [SerializedTable, SharedTable], ids=["rocksdb-like", "memory-like"])
def test_increments_added_while_the_tick_is_between_read_and_write_are_kept_and_published(make_table):
    table = make_table()

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        await rt.batch(0, 1, [formed(1)])
        assert minute_count(table) == 1

        rt.gate = asyncio.Event()
        tick = asyncio.create_task(rt.tick(0, 100))
        await asyncio.wait_for(rt.held.wait(), 5)  # the tick read the row; its send is pending
        await rt.batch(0, 2, [formed(2), formed(3)])  # a batch (another lock) adds two
        assert minute_count(table) == 3
        rt.gate.set()
        await tick
        rt.gate = None

        assert minute_count(table) == 3, "the tick wrote back the row it read: increments lost"
        assert latest_published(rt)[("minute", NOW)]["formed"] == 1  # what the tick had read
        await rt.tick(0, 101)  # the increments after its read keep the window due
        assert latest_published(rt)[("minute", NOW)]["formed"] == 3
        assert latest_published(rt)[("hour", NOW)]["formed"] == 3
        sent = len(rt.sent)
        await rt.tick(0, 102)
        assert len(rt.sent) == sent  # nothing left to publish

    asyncio.run(scenario())


def test_a_window_expired_by_the_tick_is_not_dropped_when_a_batch_updated_it_meanwhile():
    table = SerializedTable()
    old = NOW - 3 * 3_600_000  # a minute window 3 h back: expired once the clock is at NOW

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        await rt.batch(0, 1, [formed(1, t=old + 1_000)])
        await rt.tick(0, 10)  # published; still open (the clock is its own event time)
        # another subject of the partition moves the partition clock 3 h ahead
        await rt.batch(0, 2, [formed(2, subject="u2", t=NOW + 1_000)])
        rt.gate = asyncio.Event()
        tick = asyncio.create_task(rt.tick(0, 11))
        await asyncio.wait_for(rt.held.wait(), 5)
        # u1's old window is still open by u1's own clock: a late increment lands in it
        await rt.batch(0, 3, [formed(3, t=old + 2_000)])
        rt.gate.set()
        await tick
        rt.gate = None
        state = table.get(USER)
        assert [w["counters"]["formed"] for w in windows_of(state, "minute")] == [2]  # kept, not dropped
        await rt.tick(0, 12)
        assert latest_published(rt)[("minute", old)]["formed"] == 2
        await rt.tick(0, 13)
        assert windows_of(table.get(USER), "minute") == []  # published, then expired

    asyncio.run(scenario())


def test_every_feeder_adds_to_the_row_as_it_is_when_written():
    """Two batches of different agents (own locks) feeding the same subject, interleaved:
    both read the row before either writes."""
    table = SerializedTable()

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        release = asyncio.Event()
        started = asyncio.Event()

        async def slow_batch():
            async def handle(cp, _ev) -> bool:
                rt.feed_analytics(cp, [formed(10)])
                started.set()
                fut = asyncio.get_running_loop().create_future()
                cp.record_ack(fut)
                await release.wait()
                fut.set_result(None)
                return True

            await checkpoint.run_batch([Event(0, 1)], handle, sink=rt)

        first = asyncio.create_task(slow_batch())
        await asyncio.wait_for(started.wait(), 5)
        await rt.batch(0, 2, [formed(11)])  # e.g. a dead letter of the sessions agent's batch
        release.set()
        await first
        assert minute_count(table) == 2

    asyncio.run(scenario())


def test_a_batch_adds_its_increments_of_one_subject_in_one_update_and_after_an_erasure_anew():
    """One `Adder` per subject and batch (later records join it while it is the row's last
    write), in order with the other writes of the row: increments fed after an erasure in the
    same batch count from an empty state, those before it are erased."""
    table = SerializedTable()

    async def scenario():
        rt = FakeRuntime(table)
        analytics_agent.register(rt)
        staged: list = []

        async def handle(cp, _ev) -> bool:
            rt.feed_analytics(cp, [formed(1)])
            rt.feed_analytics(cp, [formed(2), formed(3, subject="u2")])
            rt.feed_analytics(cp, [formed(4)])
            staged.append(cp.last_staged(table, USER).fn)
            assert isinstance(staged[0], analytics_agent.Adder) and len(staged[0].incs) == 3
            for hook in rt.hooks:
                hook.erase(cp, "u2")
            rt.feed_analytics(cp, [formed(5, subject="u2"), formed(6, subject="u2")])
            return True

        await checkpoint.run_batch([Event(0, 1)], handle, sink=rt)
        assert minute_count(table) == 3 and minute_count(table, "u2") == 2

    asyncio.run(scenario())
