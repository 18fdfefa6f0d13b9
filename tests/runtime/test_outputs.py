"""streams/runtime/outputs.py without a broker: a batch's acknowledgements, and a fatal producer error.
(The records themselves, their partitions and a refusal by the broker: tests/runtime/test_outputs_kafka.py.)"""

from __future__ import annotations

import asyncio
import threading

import pytest
from confluent_kafka import KafkaError

from streams.runtime import checkpoint
from streams.runtime.outputs import Deliveries, OutputProducer, OutputsFailed


def _in_thread(fn, *args) -> None:
    """Delivery reports arrive on librdkafka's poller thread, never on the event loop's."""
    t = threading.Thread(target=fn, args=args)
    t.start()
    t.join()


def test_deliveries_wait_for_every_record_of_the_batch():
    async def run() -> list[str]:
        d = Deliveries(asyncio.get_running_loop())
        for _ in range(3):
            d.produced()
        seen = []
        waiter = asyncio.ensure_future(d)
        waiter.add_done_callback(lambda _f: seen.append("done"))
        for i in range(3):
            await asyncio.sleep(0)
            seen.append(f"ack {i}")
            _in_thread(d.delivered, None, None)
        await waiter
        return seen

    assert asyncio.run(run()) == ["ack 0", "ack 1", "ack 2", "done"]


def test_deliveries_with_nothing_produced_are_done_at_once():
    async def run() -> None:
        await Deliveries(asyncio.get_running_loop())

    asyncio.run(run())


def test_one_refused_record_fails_the_batch_at_once():
    async def run() -> None:
        d = Deliveries(asyncio.get_running_loop())
        d.produced()
        d.produced()
        _in_thread(d.delivered, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
        await d  # the other record is still pending: the error does not wait for it

    with pytest.raises(OutputsFailed, match="not acknowledged"):
        asyncio.run(run())


def test_a_fatal_producer_error_fails_the_open_batches_and_refuses_new_records():
    out = OutputProducer.for_worker("127.0.0.1:1", "test", 5, 1_000_000)

    async def run() -> None:
        d = out.deliveries()
        d.produced()  # a record in flight when the producer fails
        _in_thread(out._on_error, KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        with pytest.raises(OutputsFailed, match="fatally"):
            await d  # the open batch fails at once
        with pytest.raises(OutputsFailed, match="fatally"):
            out.deliveries()  # no new batch
        with pytest.raises(OutputsFailed, match="fatally"):
            await out.produce(d, "t", b"k", b"v")  # no new record

    asyncio.run(run())


def test_a_transient_producer_error_fails_nothing():
    out = OutputProducer.for_worker("127.0.0.1:1", "test", 5, 1_000_000)

    async def run() -> None:
        d = out.deliveries()
        d.produced()
        _in_thread(out._on_error, KafkaError(KafkaError._TRANSPORT, "broker down"))
        _in_thread(d.delivered, None, None)  # librdkafka retried: delivered after all
        await d

    asyncio.run(run())


def test_a_batch_whose_outputs_fail_writes_no_state():
    """checkpoint.run_batch with a failed acknowledgement: the exception leaves the batch before step
    3 (the agent then stops the worker without committing: Runtime.never_ack_unless_applied)."""
    table: dict = {}

    class Event:
        pass

    async def handle(cp, event) -> bool:
        d = cp.deliveries = Deliveries(asyncio.get_running_loop())
        cp.record_ack(d)
        d.produced()
        cp.write(table, "row", {"applied": True})
        threading.Timer(0.01, d.delivered, (KafkaError(KafkaError.REQUEST_TIMED_OUT), None)).start()
        return True

    with pytest.raises(OutputsFailed):
        asyncio.run(checkpoint.run_batch([Event()], handle))
    assert table == {}


def test_a_record_a_hung_broker_never_acknowledges_fails_its_batch_within_the_output_timeout():
    """A "broker" that accepts connections and never answers (hung, not dead): the batch's
    wait for its outputs fails once MEMSTREAM_OUTPUT_TIMEOUT_S has passed (librdkafka's
    `message.timeout.ms`), instead of after librdkafka's own 5 minutes."""
    import time

    from tests.kafka_util import hung_broker

    async def batch(out: OutputProducer) -> float:
        d = out.deliveries()
        await out.produce(d, "memory.ledger.v1", b"k", b"v")
        started = time.monotonic()
        with pytest.raises(OutputsFailed, match="not acknowledged"):
            await d
        return time.monotonic() - started

    with hung_broker() as (broker, accepted):
        out = OutputProducer.for_worker(broker, "test-outputs-hung", 5, 1_000_000, timeout_s=2.0)
        try:
            waited = asyncio.run(batch(out))
        finally:
            out.close()
    assert accepted, "the producer never connected to the hung broker"
    assert 1.5 <= waited < 30, waited  # the 2 s bound (librdkafka checks timeouts about once a second), not 300 s


def test_the_output_timeout_is_the_producers_and_must_outlast_its_linger():
    from streams.settings import Settings, SettingsError

    settings = Settings.from_env({"MEMSTREAM_OUTPUT_TIMEOUT_S": "7.5"})
    out = OutputProducer.for_worker("127.0.0.1:1", "t", settings.producer_linger_ms, 1_000_000, settings.output_timeout_s)
    assert out.config["message.timeout.ms"] == 7500
    assert Settings().output_timeout_s == 60.0
    for bad in ("0", "-1", "0.005", "3000000"):  # 5 ms: not more than the 5 ms linger; over librdkafka's limit
        with pytest.raises(SettingsError, match=f"MEMSTREAM_OUTPUT_TIMEOUT_S={float(bad)} must be more than"):
            Settings.from_env({"MEMSTREAM_OUTPUT_TIMEOUT_S": bad})


class _Urges:
    """What a batch tells its producer: +1 when it starts waiting for records in flight, -1 when it stops."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)

    async def waiting(self, records: int) -> tuple[Deliveries, asyncio.Future]:
        """A batch with `records` in flight, waiting for them."""
        d = Deliveries(asyncio.get_running_loop(), urge=self)
        for _ in range(records):
            d.produced()
        waiter = asyncio.ensure_future(d)
        await asyncio.sleep(0)
        return d, waiter


def test_a_waiting_batch_urges_its_producer_until_its_last_report():
    async def run(urges: _Urges) -> None:
        d, waiter = await urges.waiting(2)
        assert urges.calls == [1]
        _in_thread(d.delivered, None, None)
        assert urges.calls == [1]  # one record still in flight
        _in_thread(d.delivered, None, None)
        await waiter
        await Deliveries(asyncio.get_running_loop(), urge=urges)  # nothing in flight: no urge at all

    urges = _Urges()
    asyncio.run(run(urges))
    assert urges.calls == [1, -1]


def test_a_batch_that_stops_waiting_stops_urging_once():
    """Cancelled (a stopping worker), failed by a refused record, or failed by a fatal producer
    error: the urge ends exactly once in each case."""
    async def cancelled(urges: _Urges) -> None:
        d, waiter = await urges.waiting(1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        _in_thread(d.delivered, None, None)  # the report comes later: nothing left to end

    async def refused(urges: _Urges) -> None:
        d, waiter = await urges.waiting(2)
        _in_thread(d.delivered, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
        with pytest.raises(OutputsFailed):
            await waiter
        _in_thread(d.delivered, None, None)

    async def fatal(urges: _Urges) -> None:
        d, waiter = await urges.waiting(1)
        _in_thread(d.fail, OutputsFailed("fenced"))
        with pytest.raises(OutputsFailed):
            await waiter

    for case in (cancelled, refused, fatal):
        urges = _Urges()
        asyncio.run(case(urges))
        assert urges.calls == [1, -1], case.__name__


def test_the_producer_is_urgent_while_any_batch_waits():
    out = OutputProducer({"bootstrap.servers": "127.0.0.1:1"})
    out.urge(1)
    out.urge(1)
    out.urge(-1)
    assert out._urgent.is_set()
    out.urge(-1)
    assert not out._urgent.is_set()
