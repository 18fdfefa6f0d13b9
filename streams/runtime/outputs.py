"""The worker's output producer: one librdkafka producer for every record a batch writes.

The records the agents send (ledger, relay, nodes, quarantine, replies, receipts, analytics, graph
and session state, dead letters) and the changelog rows a batch writes (streams/runtime/checkpoint.py step 3)
go through this producer, which costs a fraction of the CPU per record of Faust's (aiokafka):
partitioning, batching and acknowledging happen in librdkafka's C threads. Faust's producer stays
for what Faust sends by itself: the tick topics, and a table write outside a batch (the
relay-policy agent's; a table is written either always inside batches or always outside them, so
one changelog partition never gets rows of one key from both producers).

The bytes are the same as Faust's path wrote: the value encoded by the topic's `wire` codec
(Confluent framing with the registry id; a tombstone is a null value), the key as UTF-8 (the DLQ's
key as the original raw bytes), the partition by murmur2 of the key bytes (``partitioner:
murmur2_random``, Kafka's Java default and aiokafka's; librdkafka's own default hashes with CRC32,
which would put a user's records on another partition: tests/runtime/test_outputs_kafka.py checks it),
records with a null key on a random partition, as aiokafka does.

Acknowledgements (the outputs-first protocol of streams/runtime/checkpoint.py): the records produced inside
a batch are counted by one `Deliveries` per batch, which the batch awaits before any table write
(step 2); its changelog rows by another, awaited before its offsets are acknowledged (step 4),
which then records each changelog partition's offset in the table's local store, as Faust does
after a changelog send (`Runtime._persisted`). A record the broker refuses (after librdkafka's
retries), or a fatal producer error (e.g. the idempotent producer fenced or out of sequence), fails
that wait with `OutputsFailed`: a failed output before the batch's rows are written, a failed
changelog row before its offsets are acknowledged. The batch's offsets are then never committed —
the worker stops as on any failure of a batch (`Runtime.never_ack_unless_applied`, exit 70), as it
did when a send through Faust's producer failed — and a restart processes the batch again, with
the same derived ids. The producer is idempotent with acks=all, so librdkafka's own retries
neither duplicate nor reorder a partition's records. A record that librdkafka refuses at once
(`produce()` raises, e.g. one over the message size limit) fails its handler: `guard`
dead-letters the input and the attempt runs again without it, as with Faust's producer.

Delivery reports are served by one poller thread; it hands a batch's completion to the event loop
once (`call_soon_threadsafe` when the batch's last record is acknowledged, or at its first error),
not once per record. While a batch waits for records still in flight, the thread flushes instead
of polling, so librdkafka sends them at once rather than after `MEMSTREAM_PRODUCER_LINGER_MS`
(a batch waits twice: for its outputs, then for its changelog rows). `flush()` (a stopping
worker, after its last batch) waits for every record.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from streams.runtime.thread_names import name_os_thread

log = logging.getLogger("memstream.outputs")

POLL_S = 0.1  #: the poller thread's longest wait for a delivery report (also how soon it sees a stop)
IDLE_POLL_S = 0.05  #: how often reports are served while no batch waits for its records
FULL_QUEUE_WAIT_S = 30.0  #: longest a table write waits for room in librdkafka's queue


class OutputsFailed(RuntimeError):
    """A batch's outputs were not all acknowledged (a refused record or a fatal producer error).
    Not one record's fault: the batch must not be applied (`guard` never dead-letters it)."""


class Deliveries:
    """The acknowledgements of the records one batch produced: awaitable (once every record is
    acknowledged; raises `OutputsFailed` at the first that is not)."""

    __slots__ = ("_loop", "_lock", "_pending", "_error", "_waiter", "offsets", "on_done", "_urge", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 on_done: Callable[[dict[tuple[str, int], int]], None] | None = None,
                 urge: Callable[[int], None] | None = None) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        #: told +1 when the batch starts waiting for records still in flight, -1 when it stops
        #: (its producer then sends without lingering: `OutputProducer.urge`)
        self._urge = urge
        #: with `on_done`: (topic, partition) -> the highest offset acknowledged, given to
        #: `on_done` (in the event loop) once every record is acknowledged
        self.on_done = on_done
        self.offsets: dict[tuple[str, int], int] | None = {} if on_done is not None else None

    def produced(self) -> None:
        """One more record to wait for (event-loop thread)."""
        with self._lock:
            self._pending += 1

    def unproduced(self) -> None:
        """`produce()` refused the record just counted: nothing to wait for."""
        self.delivered(None)

    def delivered(self, err: Any, msg: Any = None) -> None:
        """librdkafka's delivery report of one record (poller thread)."""
        with self._lock:
            self._pending -= 1
            if err is not None and self._error is None:
                self._error = OutputsFailed(f"an output record was not acknowledged: {err}")
            elif err is None and self.offsets is not None and msg is not None:
                tp = (msg.topic(), msg.partition())
                self.offsets[tp] = max(self.offsets.get(tp, -1), msg.offset())
            wake = self._waiter is not None and (self._pending == 0 or self._error is not None)
            waiter, self._waiter = (self._waiter, None) if wake else (None, self._waiter)
        if waiter is not None:
            self._stop_urging()
            self._loop.call_soon_threadsafe(_resolve, waiter)

    def fail(self, error: BaseException) -> None:
        """A fatal producer error: the records still pending will never be acknowledged."""
        with self._lock:
            if self._error is None:
                self._error = error
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._stop_urging()
            self._loop.call_soon_threadsafe(_resolve, waiter)

    def _stop_urging(self) -> None:
        """The waiter was taken (resolved, or its wait ended): no longer waiting."""
        if self._urge is not None:
            self._urge(-1)

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self) -> None:
        with self._lock:
            if self._pending > 0 and self._error is None:
                waiter = self._waiter = self._loop.create_future()
                if self._urge is not None:  # under the lock: before any report can take the waiter
                    self._urge(1)
            else:
                waiter = None
        if waiter is not None:
            try:
                await waiter
            finally:
                with self._lock:  # cancelled: the waiter was not taken by a report
                    taken = self._waiter is not waiter
                    if not taken:
                        self._waiter = None
                if not taken:
                    self._stop_urging()
        if self._error is not None:
            raise self._error
        if self.on_done is not None:
            done, self.on_done = self.on_done, None
            done(self.offsets)  # type: ignore[arg-type]


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class OutputProducer:
    """One librdkafka producer per worker, started on first use (inside the event loop)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._producer: Producer | None = None
        self._poller: threading.Thread | None = None
        self._stopping = threading.Event()
        self._fatal: BaseException | None = None
        #: batches whose records may be in flight (a fatal error fails them at once)
        self._open: weakref.WeakSet[Deliveries] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._urged = 0  #: batches waiting for records in flight
        self._urgent = threading.Event()  #: set while `_urged` > 0

    @classmethod
    def for_worker(cls, broker: str, client_id: str, linger_ms: int, max_request_size: int,
                   timeout_s: float = 60.0) -> OutputProducer:
        """`timeout_s` (MEMSTREAM_OUTPUT_TIMEOUT_S): a record not acknowledged by then fails its
        batch (a hung broker, a stuck producer), instead of librdkafka's 5 minutes."""
        return cls({
            "bootstrap.servers": broker,
            "client.id": client_id,
            "enable.idempotence": True,  # implies acks=all; retries keep order and add no duplicates
            "acks": "all",
            "linger.ms": linger_ms,
            "partitioner": "murmur2_random",  # Kafka's Java default (librdkafka's is CRC32-based)
            "message.max.bytes": max_request_size,
            "message.timeout.ms": int(timeout_s * 1000),
            "log_level": 3,
        })

    # ------------------------------------------------------------------------------- lifecycle
    def _start(self) -> Producer:
        self._producer = Producer({**self.config, "error_cb": self._on_error})
        self._poller = threading.Thread(target=self._poll, name="memstream-outputs", daemon=True)
        self._poller.start()
        return self._producer

    def connect(self, timeout: float) -> bool:
        """Start the producer now and read the cluster's metadata (every topic), so that the first
        batch does not wait for the connection, the idempotent producer's id and each output
        topic's leaders (a worker calls it before it takes records). False when the broker did
        not answer in `timeout` s (then that happens on first use, as before)."""
        producer = self._producer or self._start()
        try:
            producer.list_topics(timeout=timeout)
            return True
        except KafkaException as exc:
            log.warning("output producer: no metadata within %.0fs (%s); connecting on first use", timeout, exc)
            return False

    def _poll(self) -> None:
        """Serve the delivery reports; while a batch waits for records in flight, `flush`: librdkafka
        then sends what it holds at once instead of lingering (`linger.ms` only ever fills requests
        while the agents are still producing; a batch that waits gains nothing from it)."""
        name_os_thread("ms-outputs")
        producer, urgent, stopping = self._producer, self._urgent, self._stopping
        assert producer is not None
        while not stopping.is_set():
            try:
                if urgent.wait(IDLE_POLL_S):
                    producer.flush(POLL_S)  # reports served as they come; returns once nothing is in flight
                else:
                    producer.poll(0)
            except KafkaException as exc:  # a fatal error raised from poll() or flush(): as the error callback
                self._on_error(exc.args[0] if exc.args else exc)

    def urge(self, n: int) -> None:
        """A batch starts (+1) or stops (-1) waiting for records in flight (any thread)."""
        with self._lock:
            self._urged += n
            if self._urged > 0:
                self._urgent.set()
            else:
                self._urgent.clear()

    def _on_error(self, err: Any) -> None:
        fatal = isinstance(err, KafkaError) and err.fatal()
        if not fatal:
            log.warning("output producer: %s", err)  # transient: librdkafka retries on its own
            return
        log.error("output producer failed fatally: %s; the batches in flight are not applied", err)
        error = OutputsFailed(f"the output producer failed fatally: {err}")
        with self._lock:
            self._fatal = error
            open_batches = list(self._open)
        for deliveries in open_batches:
            deliveries.fail(error)

    def deliveries(self, on_done: Callable[[dict[tuple[str, int], int]], None] | None = None) -> Deliveries:
        """A new batch's acknowledgements (awaited by `streams.runtime.checkpoint` before its table writes)."""
        d = Deliveries(asyncio.get_running_loop(), on_done, self.urge)
        with self._lock:
            if self._fatal is not None:
                raise self._fatal
            self._open.add(d)
        return d

    async def produce(self, deliveries: Deliveries, topic: str, key: bytes | None, value: bytes | None,
                      headers: list[tuple[str, bytes]] | None = None) -> None:
        """Hand one record to librdkafka; `deliveries` gets its acknowledgement."""
        if self._fatal is not None:
            raise self._fatal
        producer = self._producer or self._start()
        deliveries.produced()
        while True:
            try:
                producer.produce(topic, value, key, headers=headers, on_delivery=deliveries.delivered)  # type: ignore[arg-type]
                return
            except BufferError:  # librdkafka's queue is full: wait for deliveries to make room
                await asyncio.sleep(0.01)
                if self._fatal is not None:
                    deliveries.unproduced()
                    raise self._fatal from None
            except BaseException:
                deliveries.unproduced()
                raise

    def produce_now(self, deliveries: Deliveries, topic: str, key: bytes | None, value: bytes | None,
                    partition: int) -> None:
        """`produce` for a caller that cannot await (a table write): a full local queue is
        drained by serving delivery reports here, at most `FULL_QUEUE_WAIT_S`."""
        if self._fatal is not None:
            raise self._fatal
        producer = self._producer or self._start()
        deliveries.produced()
        try:
            for _ in range(int(FULL_QUEUE_WAIT_S / POLL_S)):
                try:
                    producer.produce(topic, value, key, partition=partition, on_delivery=deliveries.delivered)
                    return
                except BufferError:
                    producer.poll(POLL_S)
            producer.produce(topic, value, key, partition=partition, on_delivery=deliveries.delivered)
        except BaseException:
            deliveries.unproduced()
            raise

    async def send_and_wait(self, topic: str, key: bytes | None, value: bytes | None,
                            headers: list[tuple[str, bytes]] | None = None) -> None:
        """One record outside any batch: returns once the broker has it."""
        d = self.deliveries()
        await self.produce(d, topic, key, value, headers)
        await d

    async def flush(self, timeout: float) -> int:
        """Wait (at most `timeout` s) until every record produced is acknowledged; the number
        still unacknowledged."""
        if self._producer is None:
            return 0
        return await asyncio.get_running_loop().run_in_executor(None, self._producer.flush, timeout)

    def close(self) -> None:
        self._stopping.set()
        if self._poller is not None:
            self._poller.join(timeout=2 * POLL_S + 1)
