"""Run a coroutine's first step inline, and hand the rest to a task only if it suspends.

Faust's fetcher hands every fetched record to the streams with
``await consumer.wait_first(on_message(record), consumer.suspend_flow.wait())``: per record it
creates four tasks (the handler, the flow's suspension, the consumer's stop and crash), waits
for the first to finish and cancels the other three — about a fifth of a worker's CPU on a
caught-up stream (bench/RESULTS.md, issue 14). The handler (the conductor's `on_message`: decode
the key, put the event on each subscribing stream's queue) almost never suspends: only when a
stream's queue is full, the flow is suspended for a rebalance, or Faust's producer buffer is full.

`first_step` runs that first step in the calling task. A handler that returns without
suspending is done: nothing else could have finished first, since nothing else ran meanwhile
(this is the case in which Faust's own tasks would have found it done too). A handler that
suspends is continued by `Resumed`, an awaitable that carries on the started coroutine from the
point where it stopped, so the caller can wait for it exactly as before (in a task, racing the
flow's suspension, and cancelled with it).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

#: `first_step`'s result for a coroutine that finished: ``(True, its return value)``
Finished = tuple[bool, Any]


def first_step(coro: Coroutine[Any, Any, Any]) -> Finished | Resumed:
    """Run `coro` until it first suspends. ``(True, value)`` if it returned `value` without
    suspending; else a `Resumed` that continues it when awaited. An exception it raises in
    that first step propagates here (as awaiting it would)."""
    try:
        pending = coro.send(None)
    except StopIteration as done:
        return True, done.value
    return Resumed(coro, pending)


class Resumed:
    """A coroutine suspended in its first step (on `pending`, what it yielded to the event loop),
    continued when awaited: the awaiting task waits on `pending` as the coroutine would have,
    and sends (or throws, e.g. a cancellation) what it gets back into the coroutine."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self.coro = coro
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self.coro, self.pending
        while True:
            try:
                value = yield pending
            except BaseException as exc:  # noqa: BLE001 - thrown in by the awaiting task (a cancellation): passed on
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(value)
                except StopIteration as done:
                    return done.value
