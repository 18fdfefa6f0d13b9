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
`queued.max.messages.kbytes`) and at most twice MEMSTREAM_BATCH_MAX records fetched and waiting for
the event loop, which takes them a batch at a time when it is ready for one (`Fetched`). The
grouping of offsets to commit (`next_offsets`) and the hand-over (`Fetched`) are tested without
Kafka; the fetch is tested against a real broker (tests/runtime/test_direct_input_kafka.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .fetched import reading, records_of
from .loglimit import Throttled
from .thread_names import name_os_thread

if TYPE_CHECKING:
    from streams.settings import Settings

log = logging.getLogger("memstream.input")

POLL_S = 0.1  #: the thread's longest wait for a first record (also how soon it sees a stop)
AHEAD = 2  #: the records fetched and not yet taken are at most this many batches (MEMSTREAM_BATCH_MAX)
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


def consumer_config(settings: Settings, group: str) -> dict[str, Any]:
    """An agent's input consumer: reads `group`'s committed offsets (never joins it, never commits),
    prefetches at most MEMSTREAM_INPUT_QUEUE_KBYTES, and asks the broker to hold each fetch until
    MEMSTREAM_FETCH_MIN_BYTES are there or MEMSTREAM_FETCH_MAX_WAIT_MS passed: asking for 1 byte,
    a worker paced at 925 records/s had a fetch answered per few records, which cost the broker
    (on the same two cores) more CPU than the worker's own (bench/RESULTS.md)."""
    return {"bootstrap.servers": settings.broker, "client.id": f"{settings.app_id}-input", "group.id": group,
            "queued.max.messages.kbytes": settings.input_queue_kbytes,
            "fetch.min.bytes": settings.fetch_min_bytes, "fetch.wait.max.ms": settings.fetch_max_wait_ms}


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


class Fetched:
    """The records one fetch thread fetched and the event loop has not taken yet. The loop takes
    them a batch at a time when it is ready for one, so a batch holds everything that came while
    the previous one was applied (as Faust's `take_events` does); the thread waits while
    `limit` records are waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.loop, self.limit = loop, limit
        self.events: list[Event] = []
        self.room = threading.Condition()
        self.ready = asyncio.Event()  #: set while there are records (or the buffer is dropped)
        self.dropped = False

    def put(self, events: list[Event], stopping: threading.Event) -> None:
        """(The thread.) Add `events` once fewer than `limit` wait (or the fetch stops)."""
        with self.room:
            while len(self.events) >= self.limit and not stopping.is_set():
                self.room.wait(POLL_S)
            if stopping.is_set():
                return
            was_empty = not self.events
            self.events.extend(events)
        if was_empty:
            self.loop.call_soon_threadsafe(self.ready.set)

    def take(self, n: int) -> list[Event]:
        """(The event loop.) Up to `n` of the waiting records, oldest first."""
        with self.room:
            taken, self.events = self.events[:n], self.events[n:]
            if not self.events and not self.dropped:
                self.ready.clear()
            self.room.notify()
        return taken

    def drop(self) -> None:
        """(The event loop.) The fetch stopped: what waits is never applied; a `run` waiting wakes."""
        with self.room:
            self.events, self.dropped = [], True
            self.room.notify()
        self.ready.set()


class InputFetch:
    """One stateful agent's input partitions, fetched by librdkafka in a thread of their own."""

    def __init__(self, name: str, topics: Iterable[str], config: Mapping[str, Any], batch_max: int,
                 count: Callable[..., None] | None = None,
                 on_failed: Callable[[str], None] | None = None, commit_interval_s: float = 0.0) -> None:
        """`on_failed(reason)` is called in the event loop when the thread stops on an error (the
        worker stops: it must not hold partitions it no longer reads). Applied batches' offsets
        are committed at most every `commit_interval_s` (0: after every batch), and always by
        `stop`."""
        self.name = name
        self.topics = frozenset(topics)
        self.config = dict(config)
        self.batch_max = batch_max
        self._count = count or (lambda _name, _n=1: None)
        self._on_failed = on_failed or (lambda _reason: None)
        self._fetching: threading.Thread | None = None
        self._stopping = threading.Event()
        self._fetched: Fetched | None = None  #: the current fetch's records (None: none started)
        self._started = asyncio.Event()  #: set by `start` (wakes a `run` waiting for a fetch)
        self._idle: asyncio.Event | None = None  #: clear while a batch is applied or a commit is under way
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

    def _loop_side(self) -> asyncio.Event:
        """What `stop` waits for: no batch being applied, no commit under way."""
        if self._idle is None:
            self._idle = asyncio.Event()
            self._idle.set()
        return self._idle

    def start(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Fetch `partitions` from the group's committed offsets (the previous fetch must be stopped)."""
        assert not self.running, f"input fetch of {self.name} started twice"
        self._loop_side()
        self.partitions = sorted(set(partitions))
        self.failed = None
        if not self.partitions:
            return
        self._stopping.clear()
        fetched = self._fetched = Fetched(asyncio.get_running_loop(), AHEAD * self.batch_max)
        self._started.set()
        self._fetching = threading.Thread(target=self._run, args=(self.partitions, fetched),
                                          name=f"memstream-input-{self.name}", daemon=True)
        self._fetching.start()
        log.info("%s: input fetched by librdkafka from the committed offsets of %s", self.name,
                 ", ".join(f"{t}[{p}]" for t, p in self.partitions))

    async def stop(self) -> None:
        """No batch starts after this; the batch being applied finishes, the applied batches'
        offsets are committed, the thread stops and is joined; records fetched beyond are dropped
        (never committed)."""
        idle = self._loop_side()
        fetched, self._fetched = self._fetched, None
        self._stopping.set()
        if fetched is not None:
            fetched.drop()  # what waits now is never applied
        thread = self._fetching
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
            self._fetching = None
        while not idle.is_set():  # the batch being applied; then a commit `run` may start right after
            await idle.wait()  # it, which clears `idle` again once this waiter was woken: look again
        await self._flush()
        self.partitions = []

    async def run(self, apply: Callable[[list[Event]], Awaitable[bool]],
                  commit: Callable[[dict[tuple[str, int], int]], Awaitable[bool]]) -> None:
        """Apply every batch fetched and commit the applied batches' offsets (every
        `commit_interval_s`; the agent's task, for good). A batch `apply` did not apply (False:
        the worker drains) is not committed."""
        idle = self._loop_side()
        self._commit = commit
        loop = asyncio.get_running_loop()
        due = 0.0  #: when the pending offsets must be committed
        while True:
            fetched = self._fetched
            if fetched is None:
                self._started.clear()
                waiting = self._started.wait()
            else:
                waiting = fetched.ready.wait()
            if self._pending and self.commit_interval_s > 0:
                try:
                    await asyncio.wait_for(waiting, max(0.0, due - loop.time()))
                except TimeoutError:
                    await self._busy_while(idle, self._flush())
                    continue
            else:
                await waiting
            if fetched is None or fetched is not self._fetched:
                continue  # started, or stopped meanwhile: look again
            events = fetched.take(self.batch_max)
            if not events:
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
        idle.clear()
        try:
            return await work
        finally:
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
    def _run(self, partitions: list[tuple[str, int]], fetched: Fetched) -> None:
        from confluent_kafka import TopicPartition

        name_os_thread("ms-input")
        with reading(self.config, lambda reason: self._fail(reason, fetched.loop)) as consumer:
            consumer.assign([TopicPartition(t, p, OFFSET_STORED) for t, p in partitions])
            while not self._stopping.is_set():
                messages = self._fetched_now(consumer)
                events = self._events(messages)
                if events:
                    fetched.put(events, self._stopping)

    def _fetched_now(self, consumer: Any) -> list[Any]:
        """The next hand-over: the first record (waited for at most POLL_S), then whatever else
        librdkafka has already fetched, up to a batch, without waiting for more. The broker already
        holds each fetch for up to MEMSTREAM_FETCH_MAX_WAIT_MS to gather records, and records that
        come while the agent applies a batch wait in `Fetched` for the next one; a wait here for
        more (MEMSTREAM_BATCH_WAIT_MS on Faust's path) only delayed every batch at low rates
        (bench/RESULTS.md)."""
        first = consumer.poll(POLL_S)
        if first is None:
            return []
        return [first, *consumer.consume(self.batch_max - 1, 0)] if self.batch_max > 1 else [first]

    def _events(self, messages: list[Any]) -> list[Event]:
        return [event_of(m) for m in records_of(messages, self._warn, f"{self.name} input")]

    def _fail(self, reason: str, loop: asyncio.AbstractEventLoop) -> None:
        self.failed = reason
        self._count("input:fetch_failed")
        log.critical("%s: the input fetch stopped (%s); what it did not commit is read again by the "
                     "partitions' next owner", self.name, reason)
        loop.call_soon_threadsafe(self._on_failed, reason)
