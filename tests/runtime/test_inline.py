"""streams/runtime/inline.py, and the consumer's per-record hand-off that uses it
(`RebalanceSafeConsumer.wait_first`): a handler that does not suspend finishes inline; one that
suspends is continued with what it waits for, its exceptions and cancellations intact."""

from __future__ import annotations

import asyncio

import pytest

from streams.runtime.inline import Resumed, first_step


async def _returns(value):
    return value


async def _raises():
    raise ValueError("bad record")


def test_a_coroutine_that_does_not_suspend_finishes_in_its_first_step():
    trace = []

    async def handler():
        trace.append("ran")
        return 42

    assert first_step(handler()) == (True, 42)
    assert trace == ["ran"]


def test_an_exception_of_the_first_step_propagates():
    with pytest.raises(ValueError, match="bad record"):
        first_step(_raises())


def test_a_suspended_coroutine_is_continued_with_what_it_waited_for():
    async def main():
        fut = asyncio.get_running_loop().create_future()
        trace = []

        async def handler():
            trace.append("before")
            got = await fut
            trace.append(f"after {got}")
            await asyncio.sleep(0)  # a bare yield to the loop, later on
            return got * 2

        step = first_step(handler())
        assert isinstance(step, Resumed)
        assert trace == ["before"]  # the first step ran here, once
        task = asyncio.ensure_future(step)
        await asyncio.sleep(0)
        assert not task.done()
        fut.set_result(21)
        assert await task == 42
        assert trace == ["before", "after 21"]

    asyncio.run(main())


def test_a_suspended_coroutine_sees_the_exception_of_what_it_waited_for():
    async def main():
        fut = asyncio.get_running_loop().create_future()

        async def handler():
            try:
                await fut
            except KeyError:
                return "handled"
            return "not raised"

        task = asyncio.ensure_future(first_step(handler()))
        await asyncio.sleep(0)
        fut.set_exception(KeyError("x"))
        assert await task == "handled"

    asyncio.run(main())


def test_cancelling_the_task_cancels_the_suspended_coroutine():
    async def main():
        entered, cleaned = asyncio.Event(), []

        async def handler():
            entered.set()
            try:
                await asyncio.Event().wait()  # never set: like a full stream queue
            finally:
                cleaned.append(True)

        step = first_step(handler())
        assert isinstance(step, Resumed)
        task = asyncio.ensure_future(step)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == [True]

    asyncio.run(main())


class _Consumer:
    """What mode's `Service.wait_first` would be asked (replaced by `race`: the real one needs a
    running service)."""

    def __init__(self, *, stopping: bool = False):
        self.should_stop = stopping
        self.raced: list = []

    async def race(self, *coros, timeout=None):
        self.raced.append(coros)
        futures = [asyncio.ensure_future(c) for c in coros]
        done, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
        for f in pending:
            f.cancel()
        return [f.result() for f in done]


@pytest.fixture
def consumer(monkeypatch):
    """A `RebalanceSafeConsumer` (not started) whose base `wait_first` is `_Consumer.race`."""
    from mode.services import Service

    from streams.runtime.rebalance import RebalanceSafeConsumer

    stand_in = _Consumer()

    async def race(self, *coros, timeout=None):
        return await stand_in.race(*coros, timeout=timeout)

    monkeypatch.setattr(Service, "wait_first", race)
    monkeypatch.setattr(RebalanceSafeConsumer, "should_stop", property(lambda self: stand_in.should_stop))
    real = RebalanceSafeConsumer.__new__(RebalanceSafeConsumer)
    return stand_in, real


def test_the_consumer_hands_a_record_over_inline_without_any_task(consumer):
    stand_in, real = consumer

    async def main():
        suspended = asyncio.Event().wait()
        result = await real.wait_first(_returns("delivered"), suspended)
        assert result.results == ["delivered"] and not result.stopped
        assert stand_in.raced == []  # no race, no task
        assert suspended.cr_frame is None  # the flow's wait was closed, not left un-awaited

    asyncio.run(main())


def test_a_stopping_consumer_reports_stopped_as_faust_does(consumer):
    stand_in, real = consumer
    stand_in.should_stop = True

    async def main():
        result = await real.wait_first(_returns("delivered"), asyncio.Event().wait())
        assert result.stopped and result.results == []

    asyncio.run(main())


def test_a_handler_that_suspends_is_raced_against_the_flow_as_before(consumer):
    stand_in, real = consumer

    async def main():
        queue_has_room, flow_suspended = asyncio.Event(), asyncio.Event()
        trace = []

        async def on_message():
            trace.append("decoded")
            await queue_has_room.wait()
            trace.append("queued")

        waiting = asyncio.ensure_future(real.wait_first(on_message(), flow_suspended.wait()))
        await asyncio.sleep(0.01)
        assert trace == ["decoded"] and len(stand_in.raced) == 1
        assert isinstance(stand_in.raced[0][0], Resumed)
        flow_suspended.set()  # a rebalance suspends the flow: the hand-off is abandoned, as in Faust
        assert await waiting == [True]  # the flow's wait won
        assert trace == ["decoded"]

    asyncio.run(main())


def test_an_exception_of_the_handler_propagates_and_closes_the_flow_wait(consumer):
    _, real = consumer

    async def main():
        suspended = asyncio.Event().wait()
        with pytest.raises(ValueError, match="bad record"):
            await real.wait_first(_raises(), suspended)
        assert suspended.cr_frame is None

    asyncio.run(main())
