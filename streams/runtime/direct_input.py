"""A stateful agent's input records fetched by librdkafka (MEMSTREAM_INPUT_FETCH=librdkafka).

Faust hands each fetched record to an agent through its per-record machinery: aiokafka's Python
fetcher in a thread of its own (a fetch request costs that thread ~2 ms of CPU whatever it returns),
a `Message` and an `Event` per record, the conductor, the channel's queue, the stream's iterator
with its sensors, `take_events`' buffer, and an acknowledgement per record. Profiled on the same-job
bench (bench/RESULTS.md), that hand-off was ~14% of a worker's main thread and its fetch thread
~18 µs per record more: most of what memstream costs beyond the same-job Quix Streams peer.

Here one librdkafka consumer per stateful agent fetches that agent's input partitions in its own
thread and hands the event loop whole batches; the agent applies them with the same batch protocol
(streams/runtime/checkpoint.py), and the applied batches' offsets are committed through Faust's
consumer, the group's member (as often as Faust commits its own, and at every stop), so a commit
of a worker that lost its partitions in a rebalance is refused by the broker.

- Faust still subscribes the topics, its assignor still assigns them (co-partitioned with the
  tables' changelogs and standbys), and its recovery still restores the tables; it never fetches
  them: `RebalanceSafeConsumer.resume_partitions` leaves the partitions an `InputFetch` `claims`
  paused, as it does the standby partitions of streams/runtime/standby.py.
- A rebalance stops the fetch first (`stop`, from the consumer's `on_partitions_revoked` /
  `on_partitions_assigned`, before Faust's own): no batch starts after that, the batch in flight
  finishes and the applied batches are committed (still as this generation's member), the thread and its
  consumer are closed, and records it had fetched beyond that batch are dropped (never committed:
  read again by the partition's owner).
- Once the rebalance is complete (Faust's recovery done) the fetch starts again on the agent's
  active partitions, each at the group's committed offset (librdkafka's stored offset; none
  committed: the partition's beginning, as `consumer_auto_offset_reset=earliest`).
- A batch that fails is never committed and the worker exits (70), as on Faust's path
  (`Runtime.never_ack_unless_applied`); a commit the broker refuses (a rebalance got there first)
  leaves the records to be read again by the partition's owner (derived ids repeat).

Bounds: at most `MEMSTREAM_INPUT_QUEUE_KBYTES` of records prefetched per agent (librdkafka's
`queued.max.messages.kbytes`) and at most two batches handed to the event loop ahead of the one
being applied. The grouping of offsets to commit (`next_offsets`) is plain Python, tested without
Kafka; the fetch is tested against a real broker (tests/runtime/test_direct_input_kafka.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from .fetched import reading, records_of
from .loglimit import Throttled
from .thread_names import name_os_thread

log = logging.getLogger("memstream.input")

POLL_S = 0.1  #: the thread's longest wait for a first record (also how soon it sees a stop)
AHEAD = 2  #: batches handed to the event loop ahead of the one it applies
WARN_EVERY_S = 10.0  #: at most one warning line per this many seconds for non-fatal consumer errors
OFFSET_STORED = -1000  #: librdkafka's logical offset: the group's committed offset (else auto.offset.reset)


class Message:
    """The fields of an input record an agent reads, named as Faust's `Message` names them
    (`timestamp` in seconds, `headers` a list of (str, bytes) or None)."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "acked", "__weakref__")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]] | None, timestamp: float) -> None:
        self.topic, self.partition, self.offset, self.key, self.value = topic, partition, offset, key, value
        self.headers, self.timestamp, self.acked = headers, timestamp, False


class Event:
    """What a handler gets for one record (Faust's `Event`: `event.message`)."""

    __slots__ = ("message", "__weakref__")

    def __init__(self, message: Message) -> None:
        self.message = message


def event_of(m: Any) -> Event:
    """An `Event` of a librdkafka message (a record, not an error)."""
    _kind, ms = m.timestamp()
    return Event(Message(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers(),
                         ms / 1000 if ms > 0 else 0.0))


def next_offsets(events: Iterable[Event]) -> dict[tuple[str, int], int]:
    """The offsets to commit once `events` are applied: per partition, one past its highest."""
    out: dict[tuple[str, int], int] = {}
    for event in events:
        m = event.message
        tp = (m.topic, m.partition)
        if m.offset + 1 > out.get(tp, -1):
            out[tp] = m.offset + 1
    return out


class InputFetch:
    """One stateful agent's input partitions, fetched by librdkafka in a thread of their own."""

    def __init__(self, name: str, topics: Iterable[str], config: Mapping[str, Any], batch_max: int,
                 batch_wait_s: float, count: Callable[..., None] | None = None,
                 on_failed: Callable[[str], None] | None = None, commit_interval_s: float = 0.0) -> None:
        """`on_failed(reason)` is called in the event loop when the thread stops on an error (the
        worker stops: it must not hold partitions it no longer reads). Applied batches' offsets
        are committed at most every `commit_interval_s` (0: after every batch), and always by
        `stop`."""
        self.name = name
        self.topics = frozenset(topics)
        self.config = dict(config)
        self.batch_max, self.batch_wait_s = batch_max, batch_wait_s
        self._count = count or (lambda _name, _n=1: None)
        self._on_failed = on_failed or (lambda _reason: None)
        self._fetching: threading.Thread | None = None
        self._stopping = threading.Event()
        #: (generation, events, the semaphore to release once the loop took them)
        self._queue: asyncio.Queue[tuple[int, list[Event], threading.Semaphore]] | None = None
        self._generation = 0  #: chunks of an earlier `start` are dropped
        self._busy = False
        self._idle: asyncio.Event | None = None
        self._warn = Throttled(log, logging.WARNING, WARN_EVERY_S)
        self.partitions: list[tuple[str, int]] = []  #: fetched from `start` until `stop`
        self.committed: dict[tuple[str, int], int] = {}  #: the offsets this fetch committed last
        self.commit_interval_s = commit_interval_s
        #: the offsets of applied batches not committed yet, and what commits them (`run`)
        self._pending: dict[tuple[str, int], int] = {}
        self._commit: Callable[[dict[tuple[str, int], int]], Awaitable[bool]] | None = None
        self.failed: str | None = None  #: why the thread stopped early (the worker then exits)

    def claims(self, tps: Iterable[Any]) -> set[Any]:
        """The partitions of `tps` this fetch reads (Faust must never fetch them)."""
        return {tp for tp in tps if tp.topic in self.topics}

    @property
    def running(self) -> bool:
        return self._fetching is not None and self._fetching.is_alive()

    def _loop_side(self) -> tuple[asyncio.Queue, asyncio.Event]:
        if self._queue is None:
            self._queue, self._idle = asyncio.Queue(), asyncio.Event()
            self._idle.set()
        assert self._idle is not None
        return self._queue, self._idle

    def start(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Fetch `partitions` from the group's committed offsets (the previous fetch must be stopped)."""
        assert not self.running, f"input fetch of {self.name} started twice"
        queue, _idle = self._loop_side()
        self.partitions = sorted(set(partitions))
        self.failed = None
        if not self.partitions:
            return
        self._generation += 1
        self._stopping.clear()
        self._fetching = threading.Thread(target=self._run, args=(self.partitions, self._generation, queue,
                                                                asyncio.get_running_loop(), threading.Semaphore(AHEAD)),
                                        name=f"memstream-input-{self.name}", daemon=True)
        self._fetching.start()
        log.info("%s: input fetched by librdkafka from the committed offsets of %s", self.name,
                 ", ".join(f"{t}[{p}]" for t, p in self.partitions))

    async def stop(self) -> None:
        """No batch starts after this; the batch being applied finishes, the applied batches'
        offsets are committed, the thread stops and is joined; records fetched beyond are dropped
        (never committed)."""
        queue, idle = self._loop_side()
        self._generation += 1  # what is queued now is never applied
        thread = self._fetching
        if thread is not None:
            self._stopping.set()
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
            self._fetching = None
        while not queue.empty():
            queue.get_nowait()
        await idle.wait()
        await self._flush()
        self.partitions = []

    async def run(self, apply: Callable[[list[Event]], Awaitable[bool]],
                  commit: Callable[[dict[tuple[str, int], int]], Awaitable[bool]]) -> None:
        """Apply every batch fetched and commit the applied batches' offsets (every
        `commit_interval_s`; the agent's task, for good). A batch `apply` did not apply (False:
        the worker drains) is not committed."""
        queue, idle = self._loop_side()
        self._commit = commit
        loop = asyncio.get_running_loop()
        due = 0.0  #: when the pending offsets must be committed
        while True:
            if self._pending and self.commit_interval_s > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), max(0.0, due - loop.time()))
                except TimeoutError:
                    await self._busy_while(idle, self._flush())
                    continue
            else:
                item = await queue.get()
            generation, events, room = item
            room.release()
            if generation != self._generation:
                continue
            if await self._busy_while(idle, apply(events)):
                if not self._pending:
                    due = loop.time() + self.commit_interval_s
                for tp, offset in next_offsets(events).items():
                    self._pending[tp] = max(offset, self._pending.get(tp, -1))
                if loop.time() >= due:
                    await self._busy_while(idle, self._flush())

    async def _busy_while(self, idle: asyncio.Event, work: Awaitable[Any]) -> Any:
        """Run `work` as what `stop` waits for (a batch being applied, a commit under way)."""
        self._busy = True
        idle.clear()
        try:
            return await work
        finally:
            self._busy = False
            idle.set()

    async def _flush(self) -> None:
        """Commit the offsets of the batches applied so far (refused: a rebalance came first, and
        the partitions' owner reads those records again)."""
        if not self._pending or self._commit is None:
            return
        offsets, self._pending = self._pending, {}
        if await self._commit(offsets):
            self.committed.update(offsets)
        else:
            self._count("input:commit_refused")
            log.info("%s: commit of %s refused (a rebalance came first); the partitions' owner reads those "
                     "records again", self.name, ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(offsets.items())))

    # ------------------------------------------------------------------------- the thread
    def _run(self, partitions: list[tuple[str, int]], generation: int, queue: asyncio.Queue,
             loop: asyncio.AbstractEventLoop, room: threading.Semaphore) -> None:
        from confluent_kafka import TopicPartition

        name_os_thread("ms-input")
        with reading(self.config, lambda reason: self._fail(reason, loop)) as consumer:
            consumer.assign([TopicPartition(t, p, OFFSET_STORED) for t, p in partitions])
            while not self._stopping.is_set():
                first = consumer.poll(POLL_S)
                if first is None:
                    continue
                messages = [first, *consumer.consume(self.batch_max - 1, self.batch_wait_s)] \
                    if self.batch_max > 1 else [first]
                events = self._events(messages)
                while events and not self._stopping.is_set():
                    if room.acquire(timeout=POLL_S):
                        loop.call_soon_threadsafe(queue.put_nowait, (generation, events, room))
                        break

    def _events(self, messages: list[Any]) -> list[Event]:
        return [event_of(m) for m in records_of(messages, self._warn, f"{self.name} input")]

    def _fail(self, reason: str, loop: asyncio.AbstractEventLoop) -> None:
        self.failed = reason
        self._count("input:fetch_failed")
        log.critical("%s: the input fetch stopped (%s); what it did not commit is read again by the "
                     "partitions' next owner", self.name, reason)
        loop.call_soon_threadsafe(self._on_failed, reason)
