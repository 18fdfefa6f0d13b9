"""The fetch rules of the rebalance-safe consumer (streams/runtime/rebalance.py): which fetched
records are dropped and fetched again (defects 4 and 7), and when Faust's read offset is moved
back so that no fetched record is dropped as already read (defect 6).

The Kafka behaviour (records fetched before a rebalance handed to the streams after the seek)
is exercised by the fault suite (tests/system/test_faults_kafka.py: workers added, removed,
killed mid-stream), which compares every output with a single worker's; these tests pin the
rules that decide which fetched records are dropped and fetched again, and for which partitions
Faust's read offset is moved back so that no fetched record is dropped as already read."""

from __future__ import annotations

import asyncio

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime import rebalance
from streams.runtime.rebalance import FetchCheck, RebalanceSafeConsumer, dropped_as_read, refetch_from

P0, P1, P2 = (TP("memory.candidates.v1", p) for p in range(3))


def check(first, expected, *, moved=False, stream=True, sought=False, lenient=False):
    return refetch_from(FetchCheck(first=first, expected=expected, moved=moved, stream=stream,
                                   sought=sought, lenient=lenient))


def test_a_fetch_overlapping_a_seek_that_starts_past_it_is_refetched_from_the_sought_offset():
    # sought back to 392 (the committed offset) while a fetch of 442.. from before was under way
    assert check(442, 392, moved=True) == 392


def test_records_starting_where_the_partition_was_sought_are_delivered():
    assert check(392, 392, moved=True, sought=True) is None
    assert check(484, 484) is None


def test_records_behind_the_expected_offset_are_refetched_too():
    assert check(10, 392, moved=True) == 392
    assert check(10, 392, sought=True) == 392


def test_records_fetched_before_the_seek_of_a_new_assignment_are_refetched_from_their_own_start():
    # the fault suite's case: 533..585 fetched at the new assignment's initial position while
    # Faust's seek to the committed offsets ran; delivering them lost them, skipping them too
    assert check(533, None, moved=True) == 533
    assert check(533, None) == 533


def test_the_first_fetch_after_a_seek_must_start_there():
    # the fault suite's case, second half: after the seek to 533 the position was 586
    assert check(586, 533, sought=True) == 533


def test_after_a_refetch_the_next_fetch_is_delivered_wherever_it_starts():
    # a transaction marker (or aborted or deleted records) at the sought offset
    assert check(534, 533, sought=True, lenient=True) is None
    # an offset out of range that the broker reset to the earliest: repeats, and no refetch loop
    assert check(500, 533, sought=True, lenient=True) is None
    # unless that fetch overlapped a move again
    assert check(534, 533, sought=True, lenient=True, moved=True) == 533


def test_a_continuing_fetch_may_start_past_the_last_one():
    # transaction markers between two fetches of a transactional topic (graph.events.v1)
    assert check(120, 118) is None


def test_changelogs_are_checked_only_when_a_fetch_overlapped_a_move():
    assert check(1200, 990, stream=False) is None
    assert check(1200, 990, stream=False, sought=True) is None
    assert check(1200, 990, stream=False, moved=True) == 990
    assert check(1200, None, stream=False, moved=True) is None


offsets = st.integers(0, 1000)


@given(offsets, st.none() | offsets, st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_a_refetch_never_skips_a_record_and_a_match_is_always_delivered(first, expected, moved, stream, sought, lenient):
    at = check(first, expected, moved=moved, stream=stream, sought=sought, lenient=lenient)
    if at is not None:
        # nothing before the refetch offset is lost: it is where the partition was sought or the
        # last fetch ended (nothing past it delivered), or the dropped records' own first offset
        assert at in (expected, first)
        assert at <= first or at == expected
    if expected is not None and first == expected:
        assert at is None
    if stream and expected is not None and first != expected and (moved or sought) and not (lenient and not moved):
        assert at == expected
    if lenient and not moved and expected is not None:
        assert at is None  # refetched at most once per move: no loop


def test_records_below_the_read_offset_would_be_dropped():
    # sought back to 1616 (committed), then a record fetched before the seek was delivered: 1688
    assert dropped_as_read({P0: 1616}, {P0: 1688}) == {P0}


def test_a_fetch_starting_at_or_past_the_read_offset_is_delivered():
    # at: right after a seek (the read offset is the sought offset); past: after a delivered record
    assert dropped_as_read({P0: 1616, P1: 443}, {P0: 1616, P1: 442}) == set()


def test_no_read_offset_drops_nothing():
    # Faust stores None for "nothing read" (a fresh partition, a seek to 0, a revoked partition)
    assert dropped_as_read({P0: 0, P1: 5}, {P0: None}) == set()


@given(st.dictionaries(st.integers(0, 5), st.integers(0, 1000)),
       st.dictionaries(st.integers(0, 5), st.none() | st.integers(0, 1000)))
def test_dropped_exactly_when_the_first_record_lies_below_the_read_offset(first, read):
    firsts = {TP("t", p): o for p, o in first.items()}
    reads = {TP("t", p): o for p, o in read.items()}
    behind = dropped_as_read(firsts, reads)
    assert behind <= firsts.keys()
    for tp, offset in firsts.items():
        r = reads.get(tp)
        assert (tp in behind) == (r is not None and offset < r)


# ---------------------------------------------- defect 8: rebalance callbacks during the worker's stop
def _run_callbacks(offline_runtime, monkeypatch, prepare) -> list:
    """Hand an assignment and a revocation to the consumer the way its fetch thread does, after
    `prepare(consumer)`; returns the callbacks that ran on the loop."""
    ran: list = []

    async def scenario() -> None:
        consumer = offline_runtime("rebalance-stop").app.consumer
        assert isinstance(consumer, RebalanceSafeConsumer)

        async def assigned(tps, generation_id=0):
            ran.append(("assigned", set(tps)))

        async def revoked(tps):
            ran.append(("revoked", set(tps)))

        monkeypatch.setattr(consumer, "on_partitions_assigned", assigned)
        monkeypatch.setattr(consumer, "on_partitions_revoked", revoked)
        monkeypatch.setattr(rebalance, "CALLBACK_CHECK_S", 0.05)
        await prepare(consumer)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(consumer.threadsafe_partitions_assigned(loop, {P0}, 3), 10)
        await asyncio.wait_for(consumer.threadsafe_partitions_revoked(loop, {P1}), 10)

    asyncio.run(scenario())
    return ran


def test_rebalance_callbacks_of_a_running_consumer_run_on_the_event_loop(offline_runtime, monkeypatch):
    async def running(consumer):
        await consumer._method_queue.start()

    ran = _run_callbacks(offline_runtime, monkeypatch, running)
    assert ran == [("assigned", {P0}), ("revoked", {P1})]


def test_a_rebalance_reaching_a_stopping_consumer_is_ignored_instead_of_waiting_forever(offline_runtime, monkeypatch):
    async def stopping(consumer):
        await consumer._method_queue.start()
        consumer._stopped.set()  # Service.stop's first step: the consumer should stop
        await consumer._method_queue.stop()

    ran = _run_callbacks(offline_runtime, monkeypatch, stopping)
    assert ran == []


def test_a_callback_queued_just_before_the_queue_stopped_is_given_up(offline_runtime, monkeypatch):
    # the race the first check cannot close: the consumer still runs, its queue has stopped
    async def queue_stopped(consumer):
        await consumer._method_queue.start()
        await consumer._method_queue.stop()

    ran = _run_callbacks(offline_runtime, monkeypatch, queue_stopped)
    assert ran == []  # and returned: without the check, wait_for above raises at 10 s


def test_the_livelock_check_skips_a_partition_assigned_but_not_yet_sought(monkeypatch):
    """Defect 9: Faust's livelock check read the fetch position of a partition aiokafka had not
    positioned yet, and aiokafka's assertion crashed the consumer. `position_known` (real
    aiokafka subscription state) says when the check may look; the consumer skips it before."""
    from types import SimpleNamespace

    from aiokafka.consumer.subscription_state import SubscriptionState
    from aiokafka.structs import TopicPartition

    from streams.runtime.faust_internals import position_known

    async def check() -> tuple[bool, bool, bool]:
        subs = SubscriptionState()
        thread = SimpleNamespace(_ensure_consumer=lambda: SimpleNamespace(_fetcher=SimpleNamespace(_subscriptions=subs)))
        before_assignment = position_known(thread, TP("t", 0))
        subs.assign_from_user({TopicPartition("t", 0)})
        assigned = position_known(thread, TP("t", 0))
        subs.seek(TopicPartition("t", 0), 5)
        return before_assignment, assigned, position_known(thread, TP("t", 0))

    assert asyncio.run(check()) == (False, False, True)

    class Probe(RebalanceSafeConsumer):
        def __init__(self) -> None:  # no app: only the check's guard is exercised
            pass

    checked: list[TP] = []
    monkeypatch.setattr(rebalance.faust_aiokafka.Consumer, "verify_event_path", lambda self, now, tp: checked.append(tp))
    monkeypatch.setattr(rebalance, "consumer_thread", lambda consumer: None)
    for known in (False, True):
        monkeypatch.setattr(rebalance, "position_known", lambda thread, tp, known=known: known)
        Probe().verify_event_path(0.0, TP("t", 0))
    assert checked == [TP("t", 0)]  # checked only once the position is known

    # a partition whose records are fetched outside Faust (direct_input.py) is never checked
    class Claiming(Probe):
        app = SimpleNamespace(memstream_runtime=SimpleNamespace(input_claims=lambda tps: {tp for tp in tps if tp.topic == "in"}))

    checked.clear()
    Claiming().verify_event_path(0.0, TP("in", 0))
    Claiming().verify_event_path(0.0, TP("t", 0))
    assert checked == [TP("t", 0)]

# ------------------------------------------ defect 10: records queued behind a stopping worker's last batch
def _message(topic: str, offset: int):
    from faust.types.tuples import Message

    return Message(topic, 0, offset, 0.0, 0, None, b"k", b"v", None, tp=TP(topic, 0))


def _wait_empty(offline_runtime, draining: bool, topic: str, applied: bool = False) -> tuple[bool, bool]:
    """A record handed to the streams and not acknowledged; (whether the consumer's `wait_empty`
    returned within 3 s, whether the record was marked acknowledged). `wait_empty` does not
    give in to a cancellation: a wait that goes on is ended by the consumer's stop flag."""
    async def scenario() -> tuple[bool, bool]:
        rt = offline_runtime("wait-empty")
        consumer = rt.app.consumer
        assert isinstance(consumer, RebalanceSafeConsumer)
        message = _message(topic, 7)
        consumer.track_message(message)
        if applied:
            rt._applied.add(message)
        rt.draining = draining
        consumer.commit = _nothing  # offline: no broker to commit to
        waiting = asyncio.ensure_future(consumer.wait_empty())
        await asyncio.wait([waiting], timeout=3)  # it checks once a second
        returned = waiting.done()
        consumer._stopped.set()  # as Service.stop does first: ends a wait that goes on
        await asyncio.wait_for(waiting, 10)
        return returned, message.acked

    return asyncio.run(scenario())


async def _nothing(*_args, **_kwargs) -> bool:
    return False


def test_a_draining_worker_does_not_wait_for_a_record_its_stateful_agent_will_never_apply(offline_runtime):
    # the chaos script's outage: each of four workers waited here until its shutdown deadline
    assert _wait_empty(offline_runtime, draining=True, topic="memory.candidates.v1") == (True, True)


def test_records_are_waited_for_as_before_unless_the_runtime_drains_and_would_never_apply_them(offline_runtime):
    assert _wait_empty(offline_runtime, draining=False, topic="memory.candidates.v1") == (False, False)
    # another agent's record (not a stateful agent's source): its agent may still be at it
    assert _wait_empty(offline_runtime, draining=True, topic="not-a-stateful-source") == (False, False)
    # a record of a batch already applied: its acknowledgement (counted, committed) comes as usual
    assert _wait_empty(offline_runtime, draining=True, topic="memory.candidates.v1", applied=True) == (False, False)


# ------------------------------------------ defect 11: a rebalance during the recovery's pass
def test_aiokafka_refuses_to_seek_to_an_offset_faust_left_unbuilt():
    """The shape of defect 11: Faust's recovery seeks a standby changelog partition that a
    rebalance added during its pass with the offset None (`Recovery._add`); aiokafka refuses
    it before touching anything, and the refusal crashed the recovery service."""
    import pytest
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    with pytest.raises(ValueError, match="Offset must be a positive integer"):
        AIOKafkaConsumer.seek(object(), TopicPartition("t-changelog", 0), None)  # type: ignore[arg-type]


def test_the_recovery_seeks_an_unbuilt_offset_from_the_partition_beginning(monkeypatch, caplog):
    """Defect 11: the consumer hands aiokafka 0 for an offset that is None (where Faust seeks a
    partition without a persisted offset) and every built offset unchanged, logs the partitions
    at WARNING, and records the positions it sought (defects 4 and 7 check fetches against them)."""
    sought: list[dict] = []

    async def faust_seek_wait(self, partitions) -> None:
        sought.append(dict(partitions))

    class Probe(RebalanceSafeConsumer):
        def __init__(self) -> None:  # no app: only the seek's bookkeeping is exercised
            self._moves, self._expected, self._lenient, self._sought = 0, {}, set(), set()

    monkeypatch.setattr(rebalance.faust_aiokafka.Consumer, "seek_wait", faust_seek_wait)
    monkeypatch.setattr(rebalance, "is_changelog_tp", lambda consumer, tp: True)
    probe = Probe()
    new, built, empty = TP("a-changelog", 3), TP("a-changelog", 4), TP("b-changelog", 0)
    with caplog.at_level("WARNING", logger=rebalance.__name__):
        asyncio.run(probe.seek_wait({new: None, built: 17, empty: 0}))
    assert sought == [{new: 0, built: 17, empty: 0}]
    assert probe._expected == {new: 0, built: 17, empty: 0} and probe._moves == 2
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "a-changelog" in caplog.text
    caplog.clear()
    assert rebalance.seek_positions({built: 17}) == {built: 17} and not caplog.records  # nothing unbuilt: silent
