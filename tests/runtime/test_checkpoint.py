"""The outputs-first protocol (streams/runtime/checkpoint.py), without a broker: tables are dicts
that record the order and the event context of every write; acks are futures resolved by the
test; the handler gets the attempt's checkpoint `cp` and does everything through it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
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


class Sink:
    """The runtime side of a checkpoint (`checkpoint.Sink`): records what each checkpoint sent
    and dead-lettered; `acks` are futures the test resolves (None: acknowledged at once)."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, str, str, object]] = []
        self.dead: list[tuple[object, object, str]] = []
        self.acks: dict[str, asyncio.Future] = {}
        self.writing = None  # the checkpoint whose rows are being written
        self.written_by: list[object] = []

    async def send(self, topic, key, value, headers=None, cp=None) -> None:
        self.sent.append((cp, topic, key, value))
        ack = self.acks.get(key)
        if ack is None:
            ack = asyncio.get_running_loop().create_future()
            ack.set_result(None)
        cp.record_ack(ack)

    async def dead_letter(self, cp, event, stage, reason, error_class, keep_value=True) -> None:
        self.dead.append((cp, event, error_class))

    def read_row(self, table, key):
        return checkpoint.current_row(table, key)

    def write_rows(self, cp, rows):
        assert self.writing is None
        self.writing = cp
        self.written_by.append(cp)
        try:
            checkpoint.write_through_tables(rows)
        finally:
            self.writing = None


def test_rows_are_written_once_first_rows_first_in_the_last_staging_event():
    log: list = []
    nodes, aux = Table(log), Table(log)
    e1, e2 = event(1, 10), event(1, 11)

    async def handle(cp, ev) -> bool:
        cp.write(nodes, f"u/n{ev.message.offset}", {"v": ev.message.offset})
        cp.write(nodes, "u/shared", {"v": ev.message.offset})
        cp.write(aux, "u", lambda written: {"pending": sorted(written.staged_rows(nodes, "u"))}, first=True)
        assert cp.read(nodes, "u/shared") == {"v": ev.message.offset}  # reads its own writes
        assert cp.event is ev and not log  # nothing written while the batch runs
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

        async def handle(cp, ev) -> bool:
            ack = loop.create_future()
            acks.append(ack)
            cp.record_ack(ack)
            cp.write(table, "k", ev.message.offset)
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

    async def handle(cp, ev) -> bool:
        seen.append(ev.message.offset)
        cp.write(table, f"k{ev.message.offset}", ev.message.offset)
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


def test_a_batch_returns_only_after_its_changelog_writes_are_acknowledged():
    """Step 4: the batch's source offsets may be acknowledged only once the broker has the rows
    (Faust's buffered changelog sends; a stopping worker could commit offsets before them)."""
    log: list = []
    changelog: list[asyncio.Future] = []
    sink = Sink()

    class ChangelogTable(Table):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            fut = asyncio.get_running_loop().create_future()
            changelog.append(fut)
            sink.writing.record_state_ack(fut)

    table = ChangelogTable(log)

    async def scenario():
        async def handle(cp, ev) -> bool:
            cp.write(table, f"k{ev.message.offset}", ev.message.offset)
            return True

        task = asyncio.create_task(checkpoint.run_batch([event(0, 1), event(0, 2)], handle, sink=sink))
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
    sink = Sink()

    class Refused(Table):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(RuntimeError("MessageSizeTooLarge"))
            sink.writing.record_state_ack(fut)

    refused = Refused([])

    async def handle(cp, ev) -> bool:
        cp.write(refused, "k", 1)
        cp.write(table, "j", 1)
        return True

    try:
        asyncio.run(checkpoint.run_batch([event(0, 1)], handle, sink=sink))
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

    async def handle(cp, ev) -> bool:
        n = sizes[ev.message.offset]
        current.append(ev.message.offset)
        cp.write(table, f"u/n{ev.message.offset}", n)

        def aux(written):
            durable.append(list(current))
            current.clear()
            redo_bytes.append(sum(v for v in written.staged_rows(table, "u").values()))
            return {}

        cp.write(table, "u", aux, first=True)
        cp.add_bytes("u", n, budget)
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

        async def slow(cp, ev) -> bool:
            cp.update(table, "n", add(10))
            cp.update(table, "n", add(100))  # composed after the first
            assert cp.read(table, "n") == {"count": 111}  # read-through, nothing written
            assert table["n"] == {"count": 1}
            cp.record_ack(release)
            return True

        async def quick(cp, ev) -> bool:
            cp.update(table, "n", add(1000))
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

    async def handle(cp, ev) -> bool:
        cp.write(table, "a", {"count": 40})
        cp.update(table, "a", bump)
        cp.write(table, "d", checkpoint.DELETE)
        cp.update(table, "d", bump)
        cp.update(table, "n", bump)
        return True

    asyncio.run(checkpoint.run_batch([event(2, 1)], handle))
    assert table["a"] == {"count": 41} and table["d"] == {"count": 1} and table["n"] == {"count": 6}
    assert stored == {"count": 5}  # the table's own object was not changed in place

    async def again(cp, ev) -> bool:
        cp.update(table, "n", bump)
        return True

    asyncio.run(checkpoint.run_batch([event(2, 2)], again))
    assert table["n"] == {"count": 7}


class Unreadable(Table):
    """A table whose rows under `bad` keys do not decode (a garbled stored row)."""

    def __init__(self, log: list, bad: set[str]) -> None:
        super().__init__(log)
        self.bad = bad
        self.reads: list[str] = []

    def get(self, key, default=None):
        self.reads.append(key)
        if key in self.bad:
            raise ValueError(f"row {key!r} does not decode")
        return super().get(key, default)


def test_an_update_that_keeps_its_row_writes_nothing_and_the_next_one_reads_the_stored_row_again():
    log: list = []
    table = Table(log)
    dict.__setitem__(table, "k", {"count": 5})
    dict.__setitem__(table, "s", {"count": 5})

    def spoil_and_keep(row):
        row["count"] = -1  # changed, then given up: nothing of it may be written
        return checkpoint.KEEP

    def bump(row):
        row = row if row is not None else {"count": 0}
        row["count"] += 1
        return row

    async def handle(cp, ev) -> bool:
        cp.update(table, "k", spoil_and_keep)
        cp.update(table, "s", spoil_and_keep)
        cp.update(table, "s", bump)  # after KEEP: the stored row, read again
        cp.write(table, "v", {"count": 40})
        cp.update(table, "v", lambda row: checkpoint.KEEP)  # keeps the staged value
        cp.write(table, "d", {"count": 1})
        cp.update(table, "d", lambda row: checkpoint.DELETE)
        cp.update(table, "d", lambda row: checkpoint.KEEP)  # keeps the staged deletion
        assert cp.read(table, "k") == {"count": 5} and cp.read(table, "d") is None
        return True

    asyncio.run(checkpoint.run_batch([event(1, 1)], handle))
    assert table == {"k": {"count": 5}, "s": {"count": 6}, "v": {"count": 40}}
    assert [(k, v if v is checkpoint.DELETE else v["count"]) for k, v, _p in log] == [
        ("s", 6), ("v", 40), ("d", checkpoint.DELETE)]  # nothing written for "k"


def test_an_update_given_an_unreadable_row_uses_its_unreadable_value_and_without_one_fails_the_batch():
    log: list = []
    table = Unreadable(log, bad={"bad", "worse"})
    seen: list[str] = []

    def keep(exc):
        seen.append(str(exc))
        return checkpoint.KEEP

    async def tolerant(cp, ev) -> bool:
        cp.update(table, "bad", lambda row: {"count": 1}, unreadable=keep)
        cp.update(table, "bad", lambda row: {"count": 2}, unreadable=lambda exc: {"count": 99})  # re-reads
        cp.update(table, "worse", lambda row: {"count": 1}, unreadable=keep)
        cp.write(table, "gone", checkpoint.DELETE)
        return True

    asyncio.run(checkpoint.run_batch([event(0, 1)], tolerant))
    assert dict(table) == {"bad": {"count": 99}}  # "worse" kept (not written); nothing for "gone" to read
    assert seen == ["row 'bad' does not decode", "row 'worse' does not decode"]

    async def erase_first(cp, ev) -> bool:  # a deletion staged first: the update needs no read
        cp.write(table, "worse", checkpoint.DELETE)
        cp.update(table, "worse", lambda row: {"count": 0 if row is None else -1})
        return True

    reads = len(table.reads)
    asyncio.run(checkpoint.run_batch([event(0, 2)], erase_first))
    assert table["worse"] == {"count": 0} and len(table.reads) == reads

    async def strict(cp, ev) -> bool:
        cp.update(table, "bad-again", lambda row: row)
        return True

    table.bad.add("bad-again")
    with pytest.raises(ValueError, match="does not decode"):
        asyncio.run(checkpoint.run_batch([event(0, 3)], strict))


def test_a_table_declared_updates_only_refuses_plain_writes():
    table = checkpoint.updates_only(Table([]))

    async def handle(cp, ev) -> bool:
        try:
            cp.write(table, "k", {"count": 1})
        except TypeError as exc:
            assert "cp.update" in str(exc)
        else:
            raise AssertionError("a plain write to an updates-only table was accepted")
        cp.update(table, "k", lambda row: {"count": 1})
        return True

    asyncio.run(checkpoint.run_batch([event(0, 0)], handle))
    assert table["k"] == {"count": 1}


def test_effects_go_through_the_checkpoint_of_their_attempt_and_a_finished_one_takes_none():
    """Every send and dead letter names its checkpoint; once the attempt is written or dropped,
    its checkpoint refuses any further effect (e.g. from a task the handler left running)."""
    sink = Sink()
    table = Table([])
    kept: list = []

    async def handle(cp, ev) -> bool:
        await cp.send("out", f"k{ev.message.offset}", {"v": 1})
        if ev.message.offset == 2:
            await cp.dead_letter("validate", "bad", "rule")
        cp.write(table, f"k{ev.message.offset}", ev.message.offset)
        kept.append(cp)
        return ev.message.offset != 3  # 3: a bug, its attempt is dropped

    asyncio.run(checkpoint.run_batch([event(0, 1), event(0, 2), event(0, 3)], handle, sink=sink))
    first, second = kept[0], kept[-1]
    assert first is kept[1] is kept[2] and second is not first  # one checkpoint per attempt
    assert [(cp, key) for cp, _t, key, _v in sink.sent] == [(first, "k1"), (first, "k2"), (first, "k3"),
                                                           (second, "k1"), (second, "k2")]
    assert [(cp, ev.message.offset, rule) for cp, ev, rule in sink.dead] == [(first, 2, "rule"), (second, 2, "rule")]
    assert sink.written_by == [second] and sorted(table) == ["k1", "k2"]  # the dropped attempt wrote nothing
    for cp in (first, second):
        assert cp.finished
        with pytest.raises(checkpoint.CheckpointFinished):
            asyncio.run(cp.send("out", "late", {"v": 2}))
        with pytest.raises(checkpoint.CheckpointFinished):
            cp.write(table, "late", 1)
        with pytest.raises(checkpoint.CheckpointFinished):
            cp.record_ack(object())
    assert "late" not in table and len(sink.sent) == 5


def test_two_batches_at_once_keep_their_effects_apart():
    """Two agents' batches interleave (each awaits the broker while the other runs): each waits
    only for its own outputs, writes only its own rows, and a failure of one drops only its own."""
    sink = Sink()
    log: list = []
    table = Table(log)

    async def scenario():
        loop = asyncio.get_running_loop()
        sink.acks["a"] = loop.create_future()  # batch A's output stays unacknowledged for a while
        started = asyncio.Event()

        async def batch_a(cp, ev) -> bool:
            await cp.send("out", "a", {"v": 1})
            cp.write(table, "a", 1)
            started.set()
            return True

        async def batch_b(cp, ev) -> bool:
            await cp.send("out", "b", {"v": 2})
            cp.write(table, f"b{ev.message.offset}", 2)
            return ev.message.offset != 6  # 6 fails: only B's attempt is dropped

        task = asyncio.create_task(checkpoint.run_batch([event(0, 1)], batch_a, sink=sink))
        await started.wait()
        await checkpoint.run_batch([event(1, 5), event(1, 6)], batch_b, sink=sink)
        assert log == [("b5", 2, 1)] and not task.done()  # B wrote without waiting for A's output
        sink.acks["a"].set_result(None)
        await task

    asyncio.run(scenario())
    assert log == [("b5", 2, 1), ("a", 1, 0)]  # each row in its own batch's event
    a_cp = next(cp for cp, _t, key, _v in sink.sent if key == "a")
    assert all(cp is not a_cp for cp, _t, key, _v in sink.sent if key == "b")
    assert len(sink.written_by) == 2 and len(set(map(id, sink.written_by))) == 2
