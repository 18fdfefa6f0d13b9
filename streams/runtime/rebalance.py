"""A Faust consumer that does not lose input partitions or records in a rebalance.

Found while testing a second worker joining a busy group (tests/api/test_dashboard_browser.py's
fleet test and tests/system/test_faults_kafka.py): faust-streaming 0.15.3 with aiokafka 0.14.0 could
leave a partition unprocessed and uncommitted for good, or skip records of it, logging nothing.
`Runtime` installs this class as the app's consumer.

It also reads with `isolation.level=read_committed` (faust-streaming 0.15.3 hard-codes
read_uncommitted unless its exactly-once mode is on): the graph-log shipper writes
`graph.events.v1` in transactions, and a batch it aborted (killed mid-transaction) must not be
applied. Topics nobody writes transactionally read the same either way.

The private methods overridden here are listed in `streams.runtime.faust_internals.CONSUMER_OVERRIDES`
(a test allows exactly those names in this module); every private attribute read or written goes
through a function of `streams.runtime.faust_internals`.
"""

from __future__ import annotations

from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.runtime.faust_internals import consumer_thread, forget_buffered, is_changelog_tp, read_committed


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread whose worker consumer skips aborted transactions."""

    def _create_worker_consumer(self, transport):  # type: ignore[no-untyped-def]
        consumer = super()._create_worker_consumer(transport)
        read_committed(consumer)  # read by aiokafka when it starts its fetcher
        return consumer


class RebalanceSafeConsumer(faust_aiokafka.Consumer):
    """Faust's Kafka consumer with three rebalance defects of faust-streaming 0.15.3 closed.

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
    """

    _deferred: set

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._deferred = set()

    async def _getmany(self, active_partitions, timeout):
        return await super()._getmany(None if active_partitions is None else set(active_partitions), timeout)

    def resume_partitions(self, tps) -> None:
        tps = set(tps)
        streams = {tp for tp in tps if not is_changelog_tp(self, tp)}
        self._deferred |= streams
        super().resume_partitions(tps - streams)

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
        self._deferred.clear()
        await super().on_partitions_revoked(revoked)

    async def seek_to_committed(self):
        committed = await super().seek_to_committed()
        if self.app.conf.consumer_auto_offset_reset == "earliest":
            thread = consumer_thread(self)
            assigned = thread.assignment()
            never = [tp for tp, offset in committed.items()
                     if (offset is None or offset <= 0) and tp in assigned and not is_changelog_tp(self, tp)]
            if never:
                await thread.seek_to_beginning(*never)
        return committed
