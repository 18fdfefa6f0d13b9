"""The outputs-first protocol (streams/checkpoint.py), without a broker: tables are dicts that
record the order and the event context of every write; acks are futures resolved by the test."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from faust.streams import current_event
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime import checkpoint


class Table(dict):
    """Records (key, value, partition of the current event) for every write."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def __setitem__(self, key, value):
        self.log.append((key, value, current_event().message.partition))
        super().__setitem__(key, value)

    def pop(self, key, default=None):
        self.log.append((key, checkpoint.DELETE, current_event().message.partition))
        return super().pop(key, default)


class Event:
    """Just what the protocol reads of a Faust event (weak-referenceable, like Faust's)."""

    def __init__(self, partition: int, offset: int) -> None:
        self.message = SimpleNamespace(partition=partition, offset=offset)


event = Event


def test_rows_are_written_once_first_rows_first_in_the_last_staging_event():
    log: list = []
    nodes, aux = Table(log), Table(log)
    e1, e2 = event(1, 10), event(1, 11)

    async def handle(ev) -> bool:
        b = checkpoint.current_batch()
        checkpoint.write(nodes, f"u/n{ev.message.offset}", {"v": ev.message.offset})
        checkpoint.write(nodes, "u/shared", {"v": ev.message.offset})
        checkpoint.write(aux, "u", lambda batch: {"pending": sorted(batch.staged_rows(nodes, "u"))}, first=True)
        assert checkpoint.read(nodes, "u/shared") == {"v": ev.message.offset}  # reads its own writes
        assert b is not None and not log  # nothing written while the batch runs
        return True

    asyncio.run(checkpoint.run_batch([e1, e2], handle))
    assert log[0] == ("u", {"pending": ["u/n10", "u/n11", "u/shared"]}, 1)  # the aux row first
    assert [k for k, _v, _p in log[1:]] == ["u/n10", "u/shared", "u/n11"]  # each row once
    assert nodes["u/shared"] == {"v": 11}  # its last value


def test_state_is_written_only_after_every_output_is_acknowledged():
    log: list = []
    table = Table(log)
    acks: list[asyncio.Future] = []

    async def scenario():
        loop = asyncio.get_running_loop()

        async def handle(ev) -> bool:
            ack = loop.create_future()
            acks.append(ack)
            checkpoint.record_ack(ack)
            checkpoint.write(table, "k", ev.message.offset)
            return True

        task = asyncio.create_task(checkpoint.run_batch([event(0, 1), event(0, 2)], handle))
        await asyncio.sleep(0.01)
        assert not log and not task.done()  # waiting for the broker
        acks[0].set_result(None)
        await asyncio.sleep(0.01)
        assert not log  # one output is still unacknowledged
        acks[1].set_result(None)
        await task

    asyncio.run(scenario())
    assert log == [("k", 2, 0)]


def test_an_unexpected_failure_drops_the_attempt_and_reruns_the_rest_without_that_record():
    log: list = []
    table = Table(log)
    seen: list[int] = []
    calls = {"prepare": 0, "failure": 0}

    async def handle(ev) -> bool:
        seen.append(ev.message.offset)
        checkpoint.write(table, f"k{ev.message.offset}", ev.message.offset)
        return ev.message.offset != 2  # offset 2 is a "bug": dead-lettered by guard

    class Cache:
        def refresh(self):
            calls["prepare"] += 1

        def invalidate(self):
            calls["failure"] += 1

    asyncio.run(checkpoint.run_batch([event(0, 1), event(0, 2), event(0, 3)], handle, Cache()))
    assert seen == [1, 2, 1, 3]  # the first attempt stopped at 2; the rerun skips it
    assert sorted(table) == ["k1", "k3"] and [k for k, _v, _p in log] == ["k1", "k3"]
    assert calls == {"prepare": 2, "failure": 1}


def test_outside_a_batch_writes_happen_at_once():
    log: list = []
    table = Table(log)

    async def scenario():
        with checkpoint.in_event(event(3, 0)):
            checkpoint.write(table, "k", 1)
            checkpoint.write(table, "k", checkpoint.DELETE)

    asyncio.run(scenario())
    assert log == [("k", 1, 3), ("k", checkpoint.DELETE, 3)] and "k" not in table


def test_a_batch_returns_only_after_its_changelog_writes_are_acknowledged():
    """Step 4: the batch's source offsets may be acknowledged only once the broker has the rows
    (Faust's buffered changelog sends; a stopping worker could commit offsets before them)."""
    log: list = []
    changelog: list[asyncio.Future] = []

    class ChangelogTable(Table):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            fut = asyncio.get_running_loop().create_future()
            changelog.append(fut)
            checkpoint.record_state_ack(fut)

    table = ChangelogTable(log)

    async def scenario():
        async def handle(ev) -> bool:
            checkpoint.write(table, f"k{ev.message.offset}", ev.message.offset)
            return True

        task = asyncio.create_task(checkpoint.run_batch([event(0, 1), event(0, 2)], handle))
        await asyncio.sleep(0.01)
        assert len(log) == 2 and not task.done()  # rows written, not yet on the broker
        changelog[0].set_result(None)
        await asyncio.sleep(0.01)
        assert not task.done()
        changelog[1].set_result(None)
        await task

    asyncio.run(scenario())


def test_a_failed_changelog_write_fails_the_batch():
    """A row the broker refuses is an agent failure (the worker stops without committing)."""
    table = Table([])

    class Refused(Table):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(RuntimeError("MessageSizeTooLarge"))
            checkpoint.record_state_ack(fut)

    refused = Refused([])

    async def handle(ev) -> bool:
        checkpoint.write(refused, "k", 1)
        checkpoint.write(table, "j", 1)
        return True

    try:
        asyncio.run(checkpoint.run_batch([event(0, 1)], handle))
    except RuntimeError as exc:
        assert "MessageSizeTooLarge" in str(exc)
    else:
        raise AssertionError("a refused changelog write must fail the batch")


def _sized_batch(sizes: list[int], budget: int) -> tuple[list[list[int]], list[int]]:
    """Run a batch whose event i stages `sizes[i]` bytes for user "u"; returns the offsets of each
    attempt that was made durable, and the staged bytes each aux row carried as its redo log."""
    log: list = []
    table = Table(log)
    durable: list[list[int]] = []
    current: list[int] = []
    redo_bytes: list[int] = []

    async def handle(ev) -> bool:
        n = sizes[ev.message.offset]
        current.append(ev.message.offset)
        checkpoint.write(table, f"u/n{ev.message.offset}", n)

        def aux(batch):
            durable.append(list(current))
            current.clear()
            redo_bytes.append(sum(v for v in batch.staged_rows(table, "u").values()))
            return {}

        checkpoint.write(table, "u", aux, first=True)
        checkpoint.add_bytes("u", n, budget)
        return True

    asyncio.run(checkpoint.run_batch([event(0, i) for i in range(len(sizes))], handle))
    return durable, redo_bytes


def test_a_batch_over_its_byte_budget_is_made_durable_early_and_continues():
    durable, redo = _sized_batch([40, 40, 40, 10, 10, 10, 10, 200, 5], budget=100)
    assert durable == [[0, 1, 2], [3, 4, 5, 6, 7], [8]]  # over 100 after 2, after 7
    assert redo == [120, 240, 5]
    assert max(redo) <= 100 + 200  # the budget plus one record's rows


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=60),
       st.integers(min_value=1, max_value=200))
def test_the_redo_log_is_bounded_by_the_budget_plus_one_record_whatever_the_backlog(sizes, budget):
    durable, redo = _sized_batch(sizes, budget)
    assert [o for attempt in durable for o in attempt] == list(range(len(sizes)))  # each once, in order
    assert all(r <= budget + max(sizes) for r in redo)


def test_an_update_applies_to_the_row_as_it_is_when_written_after_the_batch_own_writes():
    log: list = []
    table = Table(log)
    dict.__setitem__(table, "n", {"count": 1})
    release = None

    def add(k):
        def fn(row):
            row = dict(row or {"count": 0})
            row["count"] += k
            return row
        return fn

    async def scenario():
        nonlocal release
        release = asyncio.get_running_loop().create_future()

        async def slow(ev) -> bool:
            checkpoint.update(table, "n", add(10))
            checkpoint.update(table, "n", add(100))  # composed after the first
            assert checkpoint.read(table, "n") == {"count": 111}  # read-through, nothing written
            assert table["n"] == {"count": 1}
            checkpoint.record_ack(release)
            return True

        async def quick(ev) -> bool:
            checkpoint.update(table, "n", add(1000))
            return True

        task = asyncio.create_task(checkpoint.run_batch([event(0, 1)], slow))
        await asyncio.sleep(0.01)
        await checkpoint.run_batch([event(0, 2)], quick)  # writes while the slow batch awaits the broker
        assert table["n"] == {"count": 1001}
        release.set_result(None)
        await task

    asyncio.run(scenario())
    assert table["n"] == {"count": 1111}  # neither batch's change lost
    assert [(k, v["count"], p) for k, v, p in log] == [("n", 1001, 0), ("n", 1111, 0)]  # one write per batch


def test_an_update_after_a_staged_value_or_delete_builds_on_it_and_sees_a_private_copy():
    table = Table([])
    stored = {"count": 5}
    dict.__setitem__(table, "n", stored)

    def bump(row):
        row = row if row is not None else {"count": 0}
        row["count"] += 1  # in place: it must be a copy
        return row

    async def handle(ev) -> bool:
        checkpoint.write(table, "a", {"count": 40})
        checkpoint.update(table, "a", bump)
        checkpoint.write(table, "d", checkpoint.DELETE)
        checkpoint.update(table, "d", bump)
        checkpoint.update(table, "n", bump)
        return True

    asyncio.run(checkpoint.run_batch([event(2, 1)], handle))
    assert table["a"] == {"count": 41} and table["d"] == {"count": 1} and table["n"] == {"count": 6}
    assert stored == {"count": 5}  # the table's own object was not changed in place

    with checkpoint.in_event(event(2, 2)):  # outside a batch: at once
        checkpoint.update(table, "n", bump)
    assert table["n"] == {"count": 7}


def test_a_table_declared_updates_only_refuses_plain_writes():
    table = checkpoint.updates_only(Table([]))
    with checkpoint.in_event(event(0, 0)):
        try:
            checkpoint.write(table, "k", {"count": 1})
        except TypeError as exc:
            assert "checkpoint.update" in str(exc)
        else:
            raise AssertionError("a plain write to an updates-only table was accepted")
        checkpoint.update(table, "k", lambda row: {"count": 1})
    assert table["k"] == {"count": 1}
