"""A Faust consumer that does not lose input partitions or records in a rebalance.

Found while testing a second worker joining a busy group (tests/api/test_dashboard_browser.py's
fleet test and tests/system/test_faults_kafka.py): faust-streaming 0.15.3 with aiokafka 0.14.0 could
leave a partition unprocessed and uncommitted for good, or skip records of it, logging nothing.
`Runtime` installs this class as the app's consumer.

It also reads with `isolation.level=read_committed` (faust-streaming 0.15.3 hard-codes
read_uncommitted unless its exactly-once mode is on): the graph-log shipper writes
`graph.events.v1` in transactions, and a batch it aborted (killed mid-transaction) must not be
applied. Topics nobody writes transactionally read the same either way.

It also hands a fetched record to the streams without Faust's four tasks per record
(`wait_first`, streams/runtime/inline.py): not a defect, a cost.

The private methods overridden here are listed in `streams.runtime.faust_internals.CONSUMER_OVERRIDES`
(a test allows exactly those names in this module); every private attribute read or written goes
through a function of `streams.runtime.faust_internals`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.services import WaitResults

from streams.runtime.faust_internals import (
    consumer_thread,
    fetch_batching,
    forget_ack,
    forget_buffered,
    is_changelog_tp,
    position_known,
    read_committed,
    read_offset,
    rebalance_queue_stopped,
    set_read_offset,
    unacked_messages,
)
from streams.runtime.fetch_pace import QUIET, FetchPace
from streams.runtime.inline import Resumed, first_step
from streams.runtime.thread_names import name_os_thread

log = logging.getLogger(__name__)

#: how often a rebalance callback waiting for the event loop checks that the consumer still runs (defect 8)
CALLBACK_CHECK_S = 0.5


def sparse_fetches(settings: Any) -> bool:
    """Whether Faust's consumer fetches only sparse records: the timers' ticks, relay-policy
    changes and a recovery's changelogs, the stateful agents' inputs being fetched by librdkafka
    (MEMSTREAM_INPUT_FETCH) and the standby replicas applied by librdkafka (MEMSTREAM_STANDBY_APPLY).
    Its fetches then keep Faust's 1 byte / 1500 ms, which answers a tick at once: batching them
    while records flow put every tick in a flowing spell of fetches held MEMSTREAM_FETCH_MAX_WAIT_MS
    (each ~2 ms of the consumer thread's CPU), most of an idle worker's CPU (bench/RESULTS.md)."""
    return settings.input_fetch == "librdkafka" and settings.standby_apply == "librdkafka"


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread whose worker consumer skips aborted transactions and batches its
    fetches while records flow (MEMSTREAM_FETCH_*: streams/runtime/fetch_pace.py) when it fetches
    records at a rate (`sparse_fetches`)."""

    async def on_thread_started(self) -> None:
        name_os_thread("ms-consumer")
        await super().on_thread_started()

    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        read_committed(consumer)  # read by aiokafka when it starts its fetcher
        settings = self.app.memstream_runtime.settings  # type: ignore[attr-defined]
        if sparse_fetches(settings):
            self._pace = FetchPace(QUIET, settings.fetch_quiet_ms / 1000)  # Faust's 1 byte / 1500 ms throughout
        else:
            self._pace = FetchPace((settings.fetch_min_bytes, settings.fetch_max_wait_ms), settings.fetch_quiet_ms / 1000,
                                   backlog=(settings.fetch_min_bytes,
                                            max(settings.fetch_max_wait_ms, settings.fetch_backlog_wait_ms)),
                                   backlog_records=settings.fetch_backlog_records)
        fetch_batching(consumer, *self._pace.current)
        return consumer

    async def _fetch_records(self, consumer, active_partitions, timeout=None, max_records=None):
        """Faust's fetch (in the consumer's thread), then the fetch batching its outcome calls for
        (streams/runtime/fetch_pace.py)."""
        records = await super()._fetch_records(consumer, active_partitions, timeout=timeout, max_records=max_records)
        total = sum(len(recs) for recs in records.values())
        stream = total if total < self._pace.backlog_records else \
            sum(len(recs) for tp, recs in records.items() if not is_changelog_tp(self.consumer, tp))
        change = self._pace.observe(total, time.monotonic(), stream)
        if change is not None:
            fetch_batching(consumer, *change)
        return records


def seek_positions(partitions: Mapping[Any, int | None]) -> dict[Any, int]:
    """The recovery's seek targets with an offset not built yet (None: a rebalance refilled the
    recovery's partitions during its pass, defect 11) as the partition's beginning (0), which is
    where Faust seeks a partition that has no persisted offset (-1 -> 0). Logged at WARNING."""
    unbuilt = sorted(str(tp) for tp, offset in partitions.items() if offset is None)
    if unbuilt:
        log.warning("recovery sought %d changelog partition(s) whose offsets a rebalance left unbuilt (%s); "
                    "from their beginning, until the recovery it started seeks them again", len(unbuilt),
                    ", ".join(unbuilt[:4]) + (" …" if len(unbuilt) > 4 else ""))
    return {tp: 0 if offset is None else offset for tp, offset in partitions.items()}


class RebalanceSafeConsumer(faust_aiokafka.Consumer):
    """Faust's Kafka consumer with eleven defects of faust-streaming 0.15.3 closed (ten of rebalances, one of the stop).

    A worker joining the group could leave input partitions unprocessed and uncommitted for
    good (or skip records of them), logging nothing:

    1. Faust hands the fetch thread its live set of active partitions (the object itself).
       aiokafka's `fetched_records` re-reads it on every wake-up and treats an empty set as
       "every partition", so while a rebalance pauses everything (the set is empty between the
       recovery of the active changelogs and the standby ones) an in-flight fetch drains the
       paused stream partitions; `getmany` then drops those records (not active), counting on
       the seek to the committed offsets to fetch them again. Here the fetch gets a copy.
    2. That seek (aiokafka `seek_to_committed`) skips partitions whose committed offset is
       missing (or 0): records dropped there were skipped for good. Here they are rewound to
       the beginning (`consumer_auto_offset_reset` is earliest), where a first fetch starts.
    3. `Recovery.on_recovery_completed` resumes the stream partitions, awaits `perform_seek()`
       (a committed-offset lookup per partition), then calls `app.flow_control.resume()`,
       which empties every stream queue (`clear_on_resume`). Records fetched for the resumed
       partitions during the seek were put in those queues and `_read_offset` moved past
       them; the queues were emptied, and the copies fetched after the seek were dropped by
       `_drain_messages` as already read: never processed nor acked, so the commit stalled at
       the hole (or skipped it, when a gap was recorded). Here stream partitions resumed by
       the recovery only become fetchable in `resume_flow()`, which Faust calls right after
       that `flow_control.resume()`.
    4. Faust's fetcher reads the consumer generation only once a fetch has returned, so records
       fetched before a rebalance (the positions before it) can be handed to the streams after
       it, once the seek to the committed offsets has already moved the positions back. The first
       of them then lies past the committed offset; Faust records the offsets in between as a
       "gap" (meant for transaction markers and compacted records), drops them when they arrive
       as "already read", and commits across them: records skipped for good. Found by the fault
       suite (a worker added and removed, a worker killed and restarted: 50-200 records of one
       partition never applied). Here a fetch that overlapped a seek or a rebalance is checked
       against the positions the consumer was sent to (`refetch_from`); a partition's
       records that do not start there are dropped and the partition sought there again. The
       same holds for changelog partitions, which the recovery seeks (`seek_wait`) to their
       persisted offsets: a standby's records fetched before the rebalance would otherwise be
       applied first, out of order, and the restored table could count as recovered before the
       rows in between were read. (A compacted changelog may legitimately start past the sought
       offset; then one fetch is dropped and repeated, and the repeat is not checked.)
    5. Faust acknowledges records nobody applied: a stream skips *and acknowledges* a record it
       takes while a rebalance or a stop has suspended the flow (or one of an older generation),
       and after a revocation its commit is no longer anchored at the committed offset, so one
       such acknowledgement can carry the commit across a taken batch that was never applied.
       Here the acknowledgement of a stateful agent's record counts only once the runtime
       applied its batch (`Runtime.counts_ack`); any other is recorded without being counted,
       so the commit stops before it and the record is read again after the seek.
    6. Faust's fetcher silently drops every record below the partition's *read offset* as
       "already read" (`_drain_messages`; logged at Faust's dev level only), neither applied nor
       acknowledged. The read offset follows each delivered record and each seek; a record the
       fetcher delivers after the seek back to the committed offsets (one fetched before it)
       moves it past the sought position, and the records from there up to it are dropped. The
       next commit after a revocation is not anchored (defect 5), so it crosses them: the shape
       of the last unexplained loss of the fault suite (73 consecutive records of one partition,
       no gap recorded, no acknowledgement refused). Which Faust path moved the read offset there
       is not confirmed. Here a fetch whose first record of a partition lies below the read
       offset (`dropped_as_read`; no seek leaves it so) moves the read offset back to that
       record (logged at WARNING): records are delivered again, a duplicate at worst (found in
       the de-duplication window), never dropped.
    7. A fetch under way when a rebalance starts returns, once the new assignment is in place,
       records of a kept partition read from the new assignment's initial position (the
       committed offset). When they arrive while the recovery is seeking the stream partitions
       to their committed offsets (the flow is already resumed for the changelogs), Faust hands
       them to the streams, whose queues are emptied at the end of the recovery: never applied.
       aiokafka's own seek ran before they were consumed, so the position is left *after* them,
       the next fetch starts there, and Faust records the records in between as a "gap" and
       commits across them. Caught by the fault suite with the instrumentation of the hunt
       (`sigkill_x3`: offsets 533-585 of one partition fetched at 533 during the seek, the next
       fetch at 586, gap 534..586, commit 587). Here a stream partition's records fetched before
       it was sought since its assignment are dropped and the partition is sought to their
       first offset, and the first fetch after any seek must start exactly where the partition
       was sought (else it is dropped and the partition sought there again, once: the fetch
       after that is delivered wherever it starts — past it, transaction markers, aborted or
       deleted records; before it, an offset the broker reset — unless it overlapped a move).
    8. A rebalance that reaches a worker while it stops hangs the stop. The fetch thread hands
       aiokafka's rebalance callbacks to the event loop through the consumer's method queue and
       waits for them; that queue stops with the consumer, so a callback queued after it (a peer
       left, the group rebalanced, this worker re-joined during its own stop) waits forever, and
       with it aiokafka's coordinator, the fetch thread's stop and the worker's: it ended at its
       MEMSTREAM_SHUTDOWN_TIMEOUT_S (exit 75; CI, `test_erase_kafka`'s two-worker test, the log
       ending at "(Re-)joining group"). Here a callback that arrives once the consumer is
       stopping is not queued, and one queued is given up when the queue stops before running
       it (`threadsafe_partitions_assigned` / `_revoked`): a stopping worker takes no partitions
       and commits nothing more; what it did not commit is read again by the group.
    9. Faust's livelock detector (`verify_event_path`, every 2.5 commit intervals outside a
       rebalance) reads each assigned partition's fetch position from aiokafka, which asserts
       that it is known; a partition assigned but not yet sought has none, so the assertion
       crashed the consumer service and stopped the worker (seen when four workers joined a
       re-partitioned group at once: tests/tools/test_repartition_kafka.py). Here a partition
       without a position is skipped by the check (it has nothing to be slow at yet).
    10. A worker stopped while records flow waited until MEMSTREAM_SHUTDOWN_TIMEOUT_S (exit 75),
        and its next start then discarded its local tables as after a kill. Faust's stop waits in
        `wait_empty` until every record handed to the streams is acknowledged; once the runtime
        drains, a stateful agent applies no batch any more (`Runtime.hold_back`), so the records
        still queued behind its last batch were never acknowledged (scripts/chaos_fleet.py, the
        outage: all four workers, each waiting for one record of `memory.candidates.v1`). Here
        `wait_empty` first marks those records acknowledged without counting them
        (`Runtime.never_applied`): never committed, read again by the partition's next owner,
        as a held-back batch is; the records of other agents are waited for as before.
    11. A rebalance that comes while the recovery reads the active changelogs crashed the
        recovery service and stopped the worker (exit 1): Faust's recovery loop, once the actives
        are read, seeks the standby changelog partitions with `standby_tps` / `standby_offsets`,
        which the new rebalance has meanwhile refilled; a standby partition new to this worker
        whose store holds no offset is there with the offset None (`Recovery._add`), not yet
        built, and aiokafka's `seek` refuses it ("Offset must be a positive integer").
        (scripts/chaos_fleet.py: a kill, then a second kill 60 s later while the first's
        takeover was still recovering.) Here such a partition is sought to its beginning, as
        Faust seeks a partition whose built offset is -1 (`seek_positions`); the recovery the
        new rebalance started then seeks every partition again to its built offset.
    """

    _deferred: set
    #: where each partition's next record must start: the offset it was sought to, then one
    #: past the last record fetched (defects 4 and 7)
    _expected: dict
    #: stream partitions sought since their last accepted fetch: that fetch must start exactly
    #: where they were sought (defect 7)
    _sought: set
    #: stream partitions this consumer sought again after dropping a fetch: the next fetch is
    #: delivered wherever it starts unless it overlapped a move (see `refetch_from`)
    _lenient: set
    #: counts seeks and rebalances: a fetch during which it changed may hold stale records
    _moves: int

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        # Not a rebalance defect: the cost of Faust's per-record hand-off (streams/runtime/inline.py).
        # The fetcher awaits ``wait_first(on_message(record), suspend_flow.wait())`` for every
        # record; the handler's first step runs here, and only a handler that suspends is raced
        # against the flow's suspension (and the consumer's stop) in tasks, as Faust does.
        if coros and asyncio.iscoroutine(coros[0]):
            try:
                step = first_step(coros[0])
            except BaseException:
                _close(coros[1:])
                raise
            if not isinstance(step, Resumed):
                _close(coros[1:])
                return WaitResults([], [], True) if self.should_stop else WaitResults([coros[0]], [step[1]], False)
            coros = (step, *coros[1:])
        return await super().wait_first(*coros, timeout=timeout)

    def verify_event_path(self, now: float, tp: Any) -> None:
        """Faust's livelock check of one partition, skipped while it has no position (defect 9)."""
        runtime = getattr(getattr(self, "app", None), "memstream_runtime", None)
        if runtime is not None and runtime.input_claims((tp,)):
            return  # fetched outside Faust (direct_input.py): Faust's fetch positions say nothing of it
        if position_known(consumer_thread(self), tp):
            super().verify_event_path(now, tp)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._deferred = set()
        self._expected = {}
        self._sought = set()
        self._lenient = set()
        self._moves = 0

    async def _getmany(self, active_partitions, timeout):
        moves = self._moves
        records = await super()._getmany(None if active_partitions is None else set(active_partitions), timeout)
        moved = moves != self._moves
        refetch = {}
        for tp, recs in records.items():
            if recs:
                at = refetch_from(FetchCheck(
                    first=recs[0].offset, expected=self._expected.get(tp), moved=moved,
                    stream=not is_changelog_tp(self, tp), sought=tp in self._sought, lenient=tp in self._lenient))
                if at is not None:
                    refetch[tp] = at
        if refetch:
            log.warning("dropped records fetched before a rebalance or seek (%s); fetching again from %s",
                        ", ".join(f"{tp.topic}[{tp.partition}]@{records[tp][0].offset}" for tp in sorted(refetch)),
                        ", ".join(f"{tp.topic}[{tp.partition}]@{refetch[tp]}" for tp in sorted(refetch)))
            records = {tp: recs for tp, recs in records.items() if tp not in refetch}
            assigned = self.assignment()
            for tp in sorted(refetch):
                if tp in assigned:
                    await self.seek(tp, refetch[tp])
                    if not is_changelog_tp(self, tp):
                        self._lenient.add(tp)
        first = {tp: recs[0].offset for tp, recs in records.items() if recs}
        behind = dropped_as_read(first, {tp: read_offset(self, tp) for tp in first})
        if behind:
            log.warning("records fetched from %s lay below Faust's read offset (%s) and would have been dropped "
                        "as already read; delivering them (a duplicate at worst)",
                        ", ".join(f"{tp.topic}[{tp.partition}]@{first[tp]}" for tp in sorted(behind)),
                        ", ".join(str(read_offset(self, tp)) for tp in sorted(behind)))
            for tp in behind:
                set_read_offset(self, tp, first[tp])
        for tp, recs in records.items():
            if recs:
                self._expected[tp] = recs[-1].offset + 1
                self._sought.discard(tp)
                self._lenient.discard(tp)
        return records

    async def wait_empty(self) -> None:
        # defect 10: records a draining runtime will never apply are not waited for
        runtime = getattr(self.app, "memstream_runtime", None)
        if runtime is not None:
            for message in unacked_messages(self):
                if not message.acked and runtime.never_applied(message):
                    forget_ack(message)
        await super().wait_empty()

    def ack(self, message) -> bool:
        # defect 5: Faust acknowledges records nobody applied (see `Runtime.counts_ack`)
        runtime = getattr(self.app, "memstream_runtime", None)
        if runtime is not None and not message.acked and not runtime.counts_ack(message):
            forget_ack(message)
            return False
        return super().ack(message)

    async def seek(self, partition, offset: int) -> None:
        # counted before and after: a fetch that starts or ends while positions move is checked
        self._moves += 1
        await super().seek(partition, offset)
        self._moves += 1
        self._sought_to(partition, offset)

    def _sought_to(self, tp, offset: int) -> None:
        self._expected[tp] = offset
        self._lenient.discard(tp)
        if not is_changelog_tp(self, tp):
            self._sought.add(tp)

    async def seek_wait(self, partitions) -> None:
        # the recovery's seeks of changelog partitions (actives to their persisted offsets, standbys)
        partitions = seek_positions(partitions)  # defect 11
        self._moves += 1
        await super().seek_wait(partitions)
        self._moves += 1
        for tp, offset in partitions.items():
            self._sought_to(tp, max(offset, 0))

    async def threadsafe_partitions_assigned(self, receiver_loop, assigned, generation_id: int = 0) -> None:
        await self._while_running("assignment", super().threadsafe_partitions_assigned(receiver_loop, assigned,
                                                                                        generation_id))

    async def threadsafe_partitions_revoked(self, receiver_loop, revoked) -> None:
        await self._while_running("revocation", super().threadsafe_partitions_revoked(receiver_loop, revoked))

    async def _while_running(self, what: str, callback: Any) -> None:
        """Await a rebalance callback handed to the event loop (in the fetch thread), unless
        this consumer stops before the loop runs it (defect 8)."""
        if self.should_stop:
            callback.close()
            log.info("rebalance %s ignored: the worker is stopping", what)
            return
        waiting = asyncio.ensure_future(callback)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=CALLBACK_CHECK_S)
            if done:
                waiting.result()
                return
            if rebalance_queue_stopped(self):
                waiting.cancel()
                log.info("rebalance %s given up: the worker stopped before it ran", what)
                return

    async def on_partitions_assigned(self, assigned, generation_id: int = 0) -> None:
        self._moves += 1
        await self._stop_standby()
        await super().on_partitions_assigned(assigned, generation_id)

    def resume_partitions(self, tps) -> None:
        tps = set(tps)
        runtime = getattr(self.app, "memstream_runtime", None)
        if runtime is not None:  # not rebalance defects: standby copies and inputs read outside Faust
            tps -= runtime.standby_claims(tps)  # (standby.py)
            tps -= runtime.input_claims(tps)  # (direct_input.py)
        streams = {tp for tp in tps if not is_changelog_tp(self, tp)}
        self._deferred |= streams
        super().resume_partitions(tps - streams)

    async def _stop_standby(self) -> None:
        """Before Faust opens or closes a table's partition stores: the standby applier writes into
        them, and the inputs fetched outside Faust apply batches to them (their last batch is
        committed now, while this worker is still the group's member for them)."""
        runtime = getattr(self.app, "memstream_runtime", None)
        if runtime is not None:
            await runtime.stop_inputs()
            await runtime.standby.stop()

    def pause_partitions(self, tps) -> None:
        tps = set(tps)
        self._deferred -= tps
        forget_buffered(self, tps)  # getmany delivers "buffered" partitions even when paused
        super().pause_partitions(tps)

    def resume_flow(self) -> None:
        deferred, self._deferred = self._deferred, set()
        if deferred:
            super().resume_partitions(deferred & self.assignment())
        super().resume_flow()

    async def on_partitions_revoked(self, revoked) -> None:
        self._moves += 1
        await self._stop_standby()
        self._deferred.clear()
        for tp in revoked:
            self._expected.pop(tp, None)
            self._sought.discard(tp)
            self._lenient.discard(tp)
        await super().on_partitions_revoked(revoked)

    async def seek_to_committed(self):
        self._moves += 1  # and again once every position is set (as `seek`)
        committed = await super().seek_to_committed()
        never = []
        if self.app.conf.consumer_auto_offset_reset == "earliest":
            thread = consumer_thread(self)
            assigned = thread.assignment()
            never = [tp for tp, offset in committed.items()
                     if (offset is None or offset <= 0) and tp in assigned and not is_changelog_tp(self, tp)]
            if never:
                await thread.seek_to_beginning(*never)
        self._moves += 1
        for tp, offset in committed.items():
            if not is_changelog_tp(self, tp):
                # a partition read from its beginning: its first record may be past 0 (retention),
                # then at most one fetch is dropped and repeated
                self._sought_to(tp, 0 if tp in never or offset is None or offset < 0 else offset)
        return committed


def _close(awaitables: tuple) -> None:
    """Close coroutines that will never be awaited (no "never awaited" warning)."""
    for aw in awaitables:
        if asyncio.iscoroutine(aw):
            aw.close()


@dataclass(frozen=True)
class FetchCheck:
    """What is known about one partition's records in a fetch (see `refetch_from`)."""

    first: int  #: offset of its first record
    expected: int | None  #: where its next record must start; None: not sought since it was assigned
    moved: bool  #: a seek or a rebalance happened while the fetch was under way
    stream: bool  #: a stream partition (False: a table's changelog)
    sought: bool  #: the first fetch since the partition was sought (stream partitions)
    lenient: bool  #: the first fetch since this consumer sought it again after dropping a fetch


def refetch_from(c: FetchCheck) -> int | None:
    """None to deliver a partition's fetched records; else drop them and seek the partition to
    the returned offset (so no record is skipped: nothing before it was delivered).

    - A stream partition not sought since it was assigned has records fetched before Faust's
      seek to the committed offsets (at the new assignment's initial position, consumed while
      the seek ran): refetch from their own first offset (defect 7).
    - A stream partition's first fetch since a seek, and any fetch that overlapped a seek or a
      rebalance, must start exactly where it was sought or the last fetch ended (defects 4 and
      7); else refetch from there. The first fetch after such a refetch is delivered wherever
      it starts unless it overlapped a move too: past the offset, transaction markers, aborted
      or deleted records lie before it; before it, the broker reset an offset out of range
      (repeats, never a loss). So one partition is refetched at most once per move.
    - A changelog partition is checked only for a fetch that overlapped a move (a compacted
      changelog may start past the sought offset: then one fetch is repeated).
    - Otherwise a fetch starting past the expected offset is legitimate (transaction markers)."""
    if not c.stream:
        return c.expected if c.moved and c.expected is not None and c.first != c.expected else None
    if c.expected is None:
        return c.first
    if c.first == c.expected:
        return None
    if c.lenient and not c.moved:
        return None
    return c.expected if c.moved or c.sought or c.lenient else None


def dropped_as_read(first_offsets: Mapping[Any, int], read_offsets: Mapping[Any, int | None]) -> set:
    """The partitions of a fetch (`first_offsets`: each one's first record) whose first record
    Faust's fetcher would drop as already read: it lies below the partition's read offset. After
    a seek the read offset is the sought offset and a fetch starts there or later, and after a
    delivered record it is that record's offset and the next fetch starts past it; so this holds
    only for a read offset moved past the position by a record fetched before the last seek."""
    return {tp for tp, first in first_offsets.items()
            if (r := read_offsets.get(tp)) is not None and first < r}
