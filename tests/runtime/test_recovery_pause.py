"""Stream partitions stay unfetchable while this worker's active changelogs recover.

Faust's recovery (faust/tables/recovery.py, faust-streaming 0.15.3) calls `consumer.resume_flow()`
at the START of an active recovery ("Resuming flow...", after resuming the active changelog
partitions), and again once the actives are read (standbys), and in `on_recovery_completed`
after resuming the stream partitions and seeking them. `RebalanceSafeConsumer` defers the stream
partitions a recovery resumes until `resume_flow` (defect 3); these tests pin that the deferral
never leaks into the first two `resume_flow` calls: a stream partition becomes fetchable (is in
the set the fetcher hands to aiokafka) only after `on_recovery_completed`'s own resume, also when
an earlier recovery was interrupted between its resume and its `resume_flow`.

The calls are replayed in Faust's order on the real consumer class (the partition sets are
Faust's `Consumer`'s own); nothing is started and no broker is needed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from faust.types import TP

from streams.runtime.rebalance import RebalanceSafeConsumer

CHANGELOG = "app-memory-state-changelog"
STREAM = "memory.candidates.v1"
ACTIVE_CL = {TP(CHANGELOG, 3), TP(CHANGELOG, 10)}
STANDBY_CL = {TP(CHANGELOG, 4)}
STREAMS = {TP(STREAM, 3), TP(STREAM, 10)}
ASSIGNED = ACTIVE_CL | STANDBY_CL | STREAMS


class Replay(RebalanceSafeConsumer):
    """The consumer's partition bookkeeping without a transport, an app or a thread."""

    def __init__(self) -> None:  # no Service init: only the set logic is exercised
        self.app = SimpleNamespace(tables=SimpleNamespace(changelog_topics={CHANGELOG}), in_recovery=False)
        self._active_partitions = set()
        self._paused_partitions = set()
        self._buffered_partitions = set()
        self._deferred = set()
        self.flow_active = True
        self.can_resume_flow = asyncio.Event()
        self.suspend_flow = asyncio.Event()

    def assignment(self) -> set:
        return set(ASSIGNED)

    def fetchable(self) -> set:
        """What Faust's `_wait_next_records` hands to `_getmany` (and so to aiokafka)."""
        return set(self._get_active_partitions())


def rebalance(c: Replay) -> None:
    """A rebalance up to the recovery: the revocation pauses the old assignment
    (app._on_partitions_revoked), the assignment sets the active set and pauses it all
    (Consumer.on_partitions_assigned, app._on_partitions_assigned)."""
    c.stop_flow()
    c.pause_partitions(c.assignment())
    c._deferred.clear()  # RebalanceSafeConsumer.on_partitions_revoked
    c._paused_partitions.intersection_update(ASSIGNED)
    c._set_active_tps(ASSIGNED)
    c.pause_partitions(ASSIGNED)


def start_active_recovery(c: Replay) -> None:
    """recovery.py `_restart_recovery`: "Restoring state from changelog topics... Resuming flow..." """
    c.resume_partitions(ACTIVE_CL)
    c.resume_flow()


def test_stream_partitions_are_not_fetchable_while_the_actives_recover():
    c = Replay()
    rebalance(c)
    start_active_recovery(c)
    assert c.fetchable() == ACTIVE_CL
    # actives read: paused again; standbys resumed with another resume_flow (recovery.py 475-546)
    c.pause_partitions(ACTIVE_CL)
    c.resume_partitions(STANDBY_CL)
    c.resume_flow()
    assert not c.fetchable() & STREAMS


def test_stream_partitions_become_fetchable_only_with_the_completed_recoverys_resume_flow():
    c = Replay()
    rebalance(c)
    start_active_recovery(c)
    c.pause_partitions(ACTIVE_CL)
    # on_recovery_completed: resume the streams, seek them (perform_seek awaits), then resume_flow
    c.resume_partitions({tp for tp in c.assignment() if tp.topic != CHANGELOG})
    assert not c.fetchable() & STREAMS  # during perform_seek (defect 3)
    c.resume_flow()
    assert STREAMS <= c.fetchable()


def test_a_recovery_interrupted_before_its_resume_flow_leaves_no_stream_partition_to_the_next_one():
    c = Replay()
    rebalance(c)
    start_active_recovery(c)
    c.pause_partitions(ACTIVE_CL)
    c.resume_partitions(STREAMS)  # on_recovery_completed, then RebalanceAgain during perform_seek
    rebalance(c)
    start_active_recovery(c)
    assert c.fetchable() == ACTIVE_CL


def test_a_stream_partition_under_pressure_before_the_rebalance_is_not_resumed_by_its_queue_draining():
    # Faust's on_buffer_drop re-adds a "buffered" partition to the active set, paused or not;
    # the consumer's pause forgets the buffered partitions (faust_internals.forget_buffered)
    c = Replay()
    tp = next(iter(STREAMS))
    c.on_buffer_full(tp)  # outside a recovery: taken out of the active set, marked buffered
    rebalance(c)
    c.on_buffer_drop(tp)  # the stream's queue drained (cleared by the rebalance)
    start_active_recovery(c)
    assert tp not in c.fetchable()
