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

A subject whose row cannot be read or counted into (its stored bytes do not decode, or its
structure is not a state's: a bug, an older version, a hand-written changelog record) is
*contained* (`Contained`): its increments are not counted (`analytics_refused_total{label=
"contained"}`), its row is left as it is and not published, its HTTP view answers 503, the summary
leaves it out, and gauge `memstream_analytics_subjects_contained` counts it — rather than failing
every batch that touches it (a worker that exits on a stored row exits again after every
restart). Every other subject, and the memory agent's own work, goes on. An erasure deletes the
row (and so repairs it); a rebalance forgets what was contained (found again on its next use).

Record key: the catalog keys memory.analytics.v1 by `motebit_id`; each record is the complete
aggregate of one window (`window`, `window_start` in the value), so re-publishing is harmless.
Because the topic is compacted, a reader that starts late sees only the latest window per
user: read it live, or ask the HTTP API for history. Session and graph aggregates are published
under `session:<id>` / `graph:<id>` keys (they have no user).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
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
    state_problem,
    subject_partition,
)
from streams.contracts import catalog
from streams.runtime import checkpoint
from streams.runtime.topology import Processor, Timer

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.analytics")

TABLE = "analytics"  #: subject (a user id, `session:<id>`, `graph:<id>`, `(unknown):<p>`) -> its windows

PROCESSOR = Processor(
    "analytics", __name__,
    "Windowed activity aggregates, fed in-process by the other processors (Runtime.add_hook: their "
    "increments and every dead letter); reads no topic of its own.",
    stores=(TABLE,),
    timers=(Timer("analytics", catalog.MEMORY_CANDIDATES, "publish the changed windows, expire old ones"),),
    sinks=(catalog.MEMORY_ANALYTICS,),
)


class Contained:
    """The subjects of this worker whose analytics row cannot be read or counted into (subject ->
    why), since the last rebalance."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.why: dict[str, str] = {}

    def __contains__(self, subject: str) -> bool:
        return subject in self.why

    def add(self, subject: str, why: str) -> None:
        if subject not in self.why:
            log.error("analytics state of %r cannot be read (%s): its increments are not counted and it is not "
                      "published until the row is repaired (docs/state-and-failures.md)", subject[:200], why[:500])
        self.why[subject] = why[:500]
        self.rt.metrics.set_gauge("analytics_subjects_contained", len(self.why))

    def release(self, subject: str) -> None:
        """The row was deleted (an erasure): nothing left to contain."""
        if self.why.pop(subject, None) is not None:
            self.rt.metrics.set_gauge("analytics_subjects_contained", len(self.why))

    async def on_rebalance(self, *_args: Any, **_kwargs: Any) -> None:
        """Partitions moved: what was contained is found again on its next use."""
        self.why.clear()
        self.rt.metrics.set_gauge("analytics_subjects_contained", 0)

    def problem(self, subject: str, state: Any) -> str | None:
        """Why `state` (a row as read) is not `subject`'s state — containing the subject — else None."""
        why = subject_problem(subject, state)
        if why is not None:
            self.add(subject, why)
        return why


def subject_problem(subject: str, state: Any) -> str | None:
    """Why a stored row is not `subject`'s analytics state (None: it is one)."""
    if state is None:
        return None
    why = state_problem(state)
    if why is None and state["subject"] != subject:
        why = f"the row holds the state of {str(state['subject'])[:200]!r}"
    return why


class Adder:
    """A batch's update of one subject's row: its increments added to the row as it is when
    written (`Checkpoint.update`). One per subject and batch: a later record's increments join
    it while it is the row's last staged write (one function applied, not a chain of them)."""

    __slots__ = ("subject", "incs", "now_ms", "contained", "count")

    def __init__(self, subject: str, incs: list, now_ms: int, contained: Contained,
                 count: Callable[[str, int], None]) -> None:
        self.subject, self.incs, self.now_ms, self.contained, self.count = subject, incs, now_ms, contained, count

    def __call__(self, state: dict | None) -> Any:
        subject, contained = self.subject, self.contained
        if subject in contained:
            self.count("analytics_refused:contained", len(self.incs))
            return checkpoint.KEEP
        stored = state
        state = state if state is not None else new_state(subject)
        try:
            refusals = [r.reason for inc in self.incs for r in add_increment(state, inc, now_ms=self.now_ms).refused]
        except Exception:  # noqa: BLE001 - a row that is not a state: contain the subject, not the batch
            if contained.problem(subject, stored) is None:
                raise  # the row is a state: the failure is not the row's
            self.count("analytics_refused:contained", len(self.incs))
            return checkpoint.KEEP  # `state` may be half changed: nothing of it is written
        for reason in refusals:
            self.count(f"analytics_refused:{reason}", 1)
        return state

    def unreadable(self, exc: Exception) -> Any:
        """The stored row does not decode: contained, nothing written."""
        self.contained.add(self.subject, undecodable(exc))
        self.count("analytics_refused:contained", len(self.incs))
        return checkpoint.KEEP


def undecodable(exc: Exception) -> str:
    """Why a row that does not decode is contained."""
    return f"the stored row does not decode ({type(exc).__name__}: {exc})"


def register(rt: Runtime) -> Contained:
    table = checkpoint.updates_only(rt.table(TABLE))
    contained = Contained(rt)
    rt.app.on_partitions_assigned.connect(contained.on_rebalance)

    def feed(cp: checkpoint.Checkpoint, increments: Iterable) -> None:
        by_subject: dict[str, list] = {}
        for inc in increments:
            by_subject.setdefault(inc.subject, []).append(inc)
        for subject, incs in by_subject.items():
            staged = cp.last_staged(table, subject)
            adder = staged.fn if isinstance(staged, checkpoint.Update) else None
            if isinstance(adder, Adder):  # this batch's adder is still the row's last write: add to it
                adder.incs.extend(incs)
            else:
                adder = Adder(subject, incs, int(time.time() * 1000), contained, rt.count)
                cp.update(table, subject, adder, unreadable=adder.unreadable)

    class Hook:
        """The analytics agent's subscription to the pipeline (streams/runtime/handlers.py)."""

        increments = staticmethod(feed)

        @staticmethod
        def erase(cp: checkpoint.Checkpoint, subject: str) -> None:
            # an erasure (memory agent) removes the user's row; staged as an update, so it also
            # drops the increments the same batch fed before it
            def erased(_row: Any) -> Any:
                contained.release(subject)  # the row is gone, garbled or not
                return checkpoint.DELETE
            cp.update(table, subject, erased, unreadable=erased)

        @staticmethod
        def dead_lettered(cp: checkpoint.Checkpoint, record: Mapping[str, Any], event_time_ms: int, index: int,
                          partition: int) -> None:
            feed(cp, classify_dead_letter(record, event_time_ms, index=index, partition=partition,
                                          partition_of=rt.partition_of))

    rt.add_hook(Hook())

    async def publish(cp: checkpoint.Checkpoint, partition: int, now_ms: int) -> None:
        # the rows of this partition's store only (a scan of the whole table at every
        # partition's tick cost a worker with many partitions most of its event loop)
        mine = state_scan.partition_items(table, partition, lambda s: subject_partition(s, rt.partition_of) == partition,
                                          unreadable=lambda s, exc: contained.add(s, undecodable(exc)))
        clock = partition_clock(st for _s, st in mine)
        for subject, state in mine:  # `state` is as read: rows change while the sends await
            if subject in contained:
                continue
            try:
                pairs, expirable = records_due(state), _expirable(state, clock)
            except Exception:  # noqa: BLE001 - a row that is not a state
                if contained.problem(subject, state) is None:
                    raise
                continue
            # checked in full only when there is something to do (the subjects fed since the last tick)
            if (pairs or expirable) and contained.problem(subject, state) is None:
                for _snapshot, record in pairs:
                    await cp.send(catalog.MEMORY_ANALYTICS, subject, record)
                cp.update(table, subject, _publisher(subject, [snap for snap, _r in pairs], clock),
                          unreadable=lambda _exc: checkpoint.KEEP)

    def _publisher(subject: str, snapshots: list, clock: int | None):
        def published(state: dict | None):
            if state is None:  # never deleted; nothing to mark
                return checkpoint.DELETE
            if subject in contained:
                return checkpoint.KEEP
            try:
                mark_published(state, snapshots)
                expire(state, clock)
            except Exception:  # noqa: BLE001 - garbled since it was read
                if contained.problem(subject, state) is None:
                    raise
                return checkpoint.KEEP
            return state
        return published

    def _expirable(state: dict, clock: int | None) -> bool:
        own = state.get("clock")
        clock = own if clock is None else clock if own is None else max(own, clock)
        return any(is_expired(w["window"], w["start"], clock) for w in state["windows"].values())

    rt.ticks("analytics", catalog.MEMORY_CANDIDATES, publish)
    return contained
