"""Windowed activity analytics → memory.analytics.v1. The rules (classification, event-time
windows, lateness, expiry) are in `streams/analytics`; the HTTP views of the `analytics` table in
streams/api/analytics.py.

Other agents feed increments with `rt.feed_analytics(cp, increments)` (the runtime hands them to
this agent's hook, `Runtime.add_hook`) inside the event they are processing, with the checkpoint
of its batch (so the `analytics` table write, staged through that checkpoint, lands on that
event's partition, which owns the subject). A partition-local timer publishes every window whose aggregate changed and expires
old ones; the state is a table, so after a restart or a rebalance the recovered windows are
still published and expired (no reliance on Faust's window-close callback).

Writers: the `analytics` table is written by the publish tick and by every agent that feeds it
(memory batches and housekeeping, sessions, graphs, dead letters of any agent), each under its
own lock, and each batch awaits the broker between its reads and its writes. So no writer
stages a row it read: every change is a `cp.update`, a function applied to the row as it
is when the batch writes (streams/runtime/checkpoint.py, "Tables with more than one writer"):

- the feed adds its increments (`add_increment`) to that row;
- the tick publishes the windows due in the row it read, then marks *those snapshots*
  published (`mark_published`: a window counted again since keeps `rev > published`, so it
  stays due) and expires (`expire` drops only published windows) in the row as it is then.

Both commute, so no interleaving of feeds and ticks loses an increment or drops an unpublished
window. The table is declared `checkpoint.updates_only`: a plain `cp.write` to it raises.

Record key: the catalog keys memory.analytics.v1 by `motebit_id`; each record is the complete
aggregate of one window (`window`, `window_start` in the value), so re-publishing is harmless.
Because the topic is compacted, a reader that starts late sees only the latest window per
user: read it live, or ask the HTTP API for history. Session and graph aggregates are published
under `session:<id>` / `graph:<id>` keys (they have no user).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from streams.agents import state_scan
from streams.analytics import (
    add_increment,
    classify_dead_letter,
    expire,
    is_expired,
    mark_published,
    new_state,
    partition_clock,
    records_due,
    subject_partition,
)
from streams.contracts import catalog
from streams.runtime import checkpoint
from streams.runtime.topology import Processor, Timer

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

TABLE = "analytics"  #: subject (a user id, `session:<id>`, `graph:<id>`, `(unknown):<p>`) -> its windows

PROCESSOR = Processor(
    "analytics", __name__,
    "Windowed activity aggregates, fed in-process by the other processors (Runtime.add_hook: their "
    "increments and every dead letter); reads no topic of its own.",
    stores=(TABLE,),
    timers=(Timer("analytics", catalog.MEMORY_CANDIDATES, "publish the changed windows, expire old ones"),),
    sinks=(catalog.MEMORY_ANALYTICS,),
)


def register(rt: Runtime) -> None:
    table = checkpoint.updates_only(rt.table(TABLE))

    def feed(cp: checkpoint.Checkpoint, increments: Iterable) -> None:
        now = int(time.time() * 1000)
        by_subject: dict[str, list] = {}
        for inc in increments:
            by_subject.setdefault(inc.subject, []).append(inc)
        for subject, incs in by_subject.items():
            cp.update(table, subject, _adder(subject, incs, now))

    def _adder(subject: str, incs: list, now_ms: int):
        def add_to(state: dict | None) -> dict:
            state = state if state is not None else new_state(subject)
            for inc in incs:
                for refused in add_increment(state, inc, now_ms=now_ms).refused:
                    rt.count(f"analytics_refused:{refused.reason}")
            return state
        return add_to

    class Hook:
        """The analytics agent's subscription to the pipeline (streams/runtime/handlers.py)."""

        increments = staticmethod(feed)

        @staticmethod
        def erase(cp: checkpoint.Checkpoint, subject: str) -> None:
            # an erasure (memory agent) removes the user's row; staged as an update, so it also
            # drops the increments the same batch fed before it
            cp.update(table, subject, lambda _state: checkpoint.DELETE)

        @staticmethod
        def dead_lettered(cp: checkpoint.Checkpoint, record: Mapping[str, Any], event_time_ms: int, index: int,
                          partition: int) -> None:
            feed(cp, classify_dead_letter(record, event_time_ms, index=index, partition=partition,
                                          partition_of=rt.partition_of))

    rt.add_hook(Hook())

    async def publish(cp: checkpoint.Checkpoint, partition: int, now_ms: int) -> None:
        # the rows of this partition's store only (a scan of the whole table at every
        # partition's tick cost a worker with many partitions most of its event loop)
        mine = state_scan.partition_items(table, partition, lambda s: subject_partition(s, rt.partition_of) == partition)
        clock = partition_clock(st for _s, st in mine)
        for subject, state in mine:  # `state` is as read: rows change while the sends await
            pairs = records_due(state)
            for _snapshot, record in pairs:
                await cp.send(catalog.MEMORY_ANALYTICS, subject, record)
            if pairs or _expirable(state, clock):
                cp.update(table, subject, _publisher([snap for snap, _r in pairs], clock))

    def _publisher(snapshots: list, clock: int | None):
        def published(state: dict | None):
            if state is None:  # never deleted; nothing to mark
                return checkpoint.DELETE
            mark_published(state, snapshots)
            expire(state, clock)
            return state
        return published

    def _expirable(state: dict, clock: int | None) -> bool:
        own = state.get("clock")
        clock = own if clock is None else clock if own is None else max(own, clock)
        return any(is_expired(w["window"], w["start"], clock) for w in state["windows"].values())

    rt.ticks("analytics", catalog.MEMORY_CANDIDATES, publish)
