"""The plain parts of the input fetch outside Faust (streams/runtime/direct_input.py) and its settings:
the offsets a batch commits, the record shape a handler reads, the bounds. The fetch itself runs
against a real broker in tests/runtime/test_direct_input_kafka.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime import direct_input
from streams.runtime.direct_input import Event, InputFetch, Message, event_of, next_offsets
from streams.settings import FETCH_MIN_BYTES_MAX, INPUT_QUEUE_KBYTES_MAX, Settings, SettingsError


def _event(topic: str, partition: int, offset: int) -> Event:
    return Event(Message(topic, partition, offset, b"k", b"v", None, 0.0))


records = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3), st.integers(0, 10_000)), max_size=60)


@given(records)
def test_a_batch_commits_one_past_the_highest_offset_of_each_of_its_partitions(recs):
    offsets = next_offsets(_event(t, p, o) for t, p, o in recs)
    assert set(offsets) == {(t, p) for t, p, _ in recs}
    for (t, p), committed in offsets.items():
        assert committed == max(o for tt, pp, o in recs if (tt, pp) == (t, p)) + 1


class FakeKafkaMessage:
    """What confluent-kafka hands for a record (the methods `event_of` calls)."""

    def __init__(self, ts: tuple[int, int], headers=None) -> None:
        self.ts, self.hdrs = ts, headers

    def topic(self):
        return "memory.candidates.v1"

    def partition(self):
        return 2

    def offset(self):
        return 41

    def key(self):
        return b"user"

    def value(self):
        return b"\x00\x00\x00\x00\x01"

    def headers(self):
        return self.hdrs

    def timestamp(self):
        return self.ts


def test_a_record_reads_as_fausts_message_does():
    e = event_of(FakeKafkaMessage((1, 1_767_225_600_123), [("h", b"v")]))
    m = e.message
    assert (m.topic, m.partition, m.offset, m.key, m.value) == ("memory.candidates.v1", 2, 41, b"user", b"\x00\x00\x00\x00\x01")
    assert m.timestamp == pytest.approx(1_767_225_600.123)  # seconds, as Faust's
    assert m.headers == [("h", b"v")]
    assert m.acked is False
    # a record without a timestamp (librdkafka: type 0, -1) reads as Faust's "none" (0.0)
    assert event_of(FakeKafkaMessage((0, -1))).message.timestamp == 0.0


def test_claims_are_the_partitions_of_its_topics_only():
    from faust.types import TP

    fetch = InputFetch("agent", ["a", "b"], {}, 10)
    tps = {TP("a", 0), TP("b", 3), TP("c", 0), TP("a-changelog", 1)}
    assert fetch.claims(tps) == {TP("a", 0), TP("b", 3)}


class _Consumer:
    """librdkafka's consumer as `_fetched_now` uses it: `poll` gives the first record, `consume`
    what is already fetched (the timeouts asked for are kept)."""

    def __init__(self, fetched: list) -> None:
        self.fetched, self.timeouts = list(fetched), []

    def poll(self, timeout: float):
        self.timeouts.append(("poll", timeout))
        return self.fetched.pop(0) if self.fetched else None

    def consume(self, n: int, timeout: float) -> list:
        self.timeouts.append(("consume", timeout))
        taken, self.fetched = self.fetched[:n], self.fetched[n:]
        return taken


def test_a_hand_over_is_what_librdkafka_has_fetched_without_waiting_for_more():
    """The first record is waited for (at most POLL_S, so a stop is seen); the rest of the batch
    is what librdkafka has already fetched, taken without a wait: the broker gathered them for up
    to MEMSTREAM_FETCH_MAX_WAIT_MS, and a wait here only delayed every batch at low rates."""
    fetch = InputFetch("agent", ["a"], {}, 3)
    consumer = _Consumer(["r1", "r2", "r3", "r4"])
    assert fetch._fetched_now(consumer) == ["r1", "r2", "r3"]  # at most a batch
    assert consumer.timeouts == [("poll", direct_input.POLL_S), ("consume", 0)]
    assert fetch._fetched_now(consumer) == ["r4"]  # one fetched: handed over alone, at once
    assert fetch._fetched_now(consumer) == []  # none within the poll: nothing
    assert InputFetch("agent", ["a"], {}, 1)._fetched_now(_Consumer(["r1", "r2"])) == ["r1"]  # a batch of one


def test_input_fetch_settings_are_checked():
    assert Settings().input_fetch == "librdkafka"
    assert Settings(input_fetch="faust").input_fetch == "faust"
    with pytest.raises(SettingsError, match="MEMSTREAM_INPUT_FETCH"):
        Settings(input_fetch="aiokafka")
    for bad in (0, -1, INPUT_QUEUE_KBYTES_MAX + 1):
        with pytest.raises(SettingsError, match="MEMSTREAM_INPUT_QUEUE_KBYTES"):
            Settings(input_queue_kbytes=bad)
    assert Settings(input_queue_kbytes=INPUT_QUEUE_KBYTES_MAX).input_queue_kbytes == INPUT_QUEUE_KBYTES_MAX
    for bad in (0, FETCH_MIN_BYTES_MAX + 1):  # also the input consumers' fetch.min.bytes
        with pytest.raises(SettingsError, match="MEMSTREAM_FETCH_MIN_BYTES"):
            Settings(fetch_min_bytes=bad)
    assert Settings(fetch_min_bytes=FETCH_MIN_BYTES_MAX).fetch_min_bytes == FETCH_MIN_BYTES_MAX


@pytest.mark.parametrize("name", ["batch_max", "batch_wait_ms"])
@pytest.mark.parametrize("value", [0, -1])
def test_a_batch_bound_below_one_is_refused(name, value):
    """MEMSTREAM_BATCH_MAX 0: no batch would ever hold a record (the fetch's loop would spin on
    empty takes, its thread block on a buffer of 0); MEMSTREAM_BATCH_WAIT_MS 0: Faust's
    `take_events` would have no timeout and wait for a full batch, however long."""
    with pytest.raises(SettingsError, match=f"MEMSTREAM_{name.upper()}={value} must be at least 1"):
        Settings(**{name: value})
    assert getattr(Settings(**{name: 1}), name) == 1


@pytest.mark.parametrize("name", ["batch_max", "standby_batch_max"])
def test_a_batch_over_what_one_consume_takes_is_refused(name):
    """Batches and standby batches are taken with one librdkafka `consume()`, which refuses more
    than a million records at run time (the fetch thread would stop, and the worker with it)."""
    from streams.settings import CONSUME_MAX

    for bad in (CONSUME_MAX + 1, 10**9):
        with pytest.raises(SettingsError, match=f"MEMSTREAM_{name.upper()}={bad} must be at most {CONSUME_MAX}"):
            Settings.from_env({f"MEMSTREAM_{name.upper()}": str(bad)})
    assert getattr(Settings(**{name: CONSUME_MAX}), name) == CONSUME_MAX


def test_a_batch_wait_over_ten_seconds_is_refused():
    """On Faust's path a batch's first record may wait the whole batch wait for company: an hour's
    wait would hold it, and its user's outputs, for an hour."""
    from streams.settings import BATCH_WAIT_MAX_MS

    for bad in (BATCH_WAIT_MAX_MS + 1, 3_600_000):
        with pytest.raises(SettingsError, match=f"MEMSTREAM_BATCH_WAIT_MS={bad} must be at most {BATCH_WAIT_MAX_MS}"):
            Settings.from_env({"MEMSTREAM_BATCH_WAIT_MS": str(bad)})
    assert Settings(batch_wait_ms=BATCH_WAIT_MAX_MS).batch_wait_ms == BATCH_WAIT_MAX_MS


def test_the_input_consumer_reads_the_group_offsets_and_asks_for_batches_of_bytes():
    from streams.runtime.direct_input import consumer_config

    s = Settings(broker="b:1", app_id="app", input_queue_kbytes=77, fetch_min_bytes=4242, fetch_max_wait_ms=31)
    config = consumer_config(s, "the-group")
    assert config == {"bootstrap.servers": "b:1", "client.id": "app-input", "group.id": "the-group",
                      "queued.max.messages.kbytes": 77, "fetch.min.bytes": 4242, "fetch.wait.max.ms": 31}
    assert consumer_config(Settings(), "g")["fetch.min.bytes"] == Settings().fetch_min_bytes == 65536


def test_the_loop_takes_everything_that_came_meanwhile_a_batch_at_a_time_and_the_thread_waits_at_the_limit():
    import asyncio
    import threading

    from streams.runtime.direct_input import Fetched

    async def scenario() -> None:
        fetched = Fetched(asyncio.get_running_loop(), limit=6)
        stopping = threading.Event()
        assert not fetched.ready.is_set()
        fetched.put([_event("a", 0, 0), _event("a", 0, 1)], stopping)
        fetched.put([_event("a", 1, 0)], stopping)  # came while the loop was busy: one batch with the rest
        await asyncio.wait_for(fetched.ready.wait(), 1)
        assert [(e.message.partition, e.message.offset) for e in fetched.take(10)] == [(0, 0), (0, 1), (1, 0)]
        assert not fetched.ready.is_set()
        # a batch is at most n; the rest waits for the next take
        fetched.put([_event("a", 0, o) for o in range(2, 7)], stopping)
        await asyncio.wait_for(fetched.ready.wait(), 1)
        assert [e.message.offset for e in fetched.take(3)] == [2, 3, 4] and fetched.ready.is_set()
        # at the limit the thread waits until the loop takes
        fetched.put([_event("a", 2, o) for o in range(4)], stopping)  # 2 + 4 = 6 waiting
        blocked = threading.Thread(target=fetched.put, args=([_event("a", 2, 99)], stopping))
        blocked.start()
        await asyncio.sleep(0.3)
        assert blocked.is_alive() and len(fetched.events) == 6
        assert len(fetched.take(6)) == 6
        await asyncio.get_running_loop().run_in_executor(None, blocked.join, 2)
        assert not blocked.is_alive() and [e.message.offset for e in fetched.take(6)] == [99]
        # dropped (the fetch stopped): nothing waits, a waiting loop wakes, a waiting thread gives up
        fetched.put([_event("a", 0, 7)], stopping)
        fetched.drop()
        assert fetched.take(10) == [] and fetched.ready.is_set()
        stopping.set()
        fetched.put([_event("a", 0, 8)], stopping)
        assert fetched.events == []

    asyncio.run(scenario())


def test_stop_returns_only_after_the_commit_that_follows_the_batch_being_applied():
    """A rebalance stops the fetch while a batch is applied; `run` commits it right after (no
    commit interval): `stop` returns once that commit is done, not while it is in flight."""
    import asyncio
    import threading

    from streams.runtime.direct_input import Fetched

    async def scenario() -> list[str]:
        steps: list[str] = []
        applying, release = asyncio.Event(), asyncio.Event()

        async def apply(events) -> bool:
            applying.set()
            await release.wait()
            steps.append("applied")
            return True

        async def commit(offsets) -> bool:
            await asyncio.sleep(0.2)  # a commit round trip
            steps.append(f"committed {sorted(offsets.items())}")
            return True

        fetch = InputFetch("agent", ["a"], {}, 10)
        fetched = fetch._fetched = Fetched(asyncio.get_running_loop(), 20)  # as `start` makes it (no thread here)
        fetched.put([_event("a", 0, 5), _event("a", 1, 7)], threading.Event())
        runner = asyncio.ensure_future(fetch.run(apply, commit))
        await asyncio.wait_for(applying.wait(), 2)
        stopping = asyncio.ensure_future(fetch.stop())
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.wait_for(stopping, 5)
        steps.append("stopped")
        runner.cancel()
        return steps

    assert asyncio.run(scenario()) == ["applied", "committed [(('a', 0), 6), (('a', 1), 8)]", "stopped"]


def test_a_hung_broker_applies_nothing_commits_nothing_and_does_not_hang_the_stop():
    """A broker that accepts connections and never answers: the fetch hands nothing over (the
    worker's group session decides the partitions' fate), and a rebalance's `stop` still returns
    at once — the thread sees the stop within its poll, however the broker behaves."""
    import asyncio
    import time

    from tests.kafka_util import hung_broker

    applied: list[int] = []
    commits: list[dict] = []

    async def apply(events) -> bool:
        applied.append(len(events))
        return True

    async def commit(offsets) -> bool:
        commits.append(offsets)
        return True

    async def scenario(broker: str) -> float:
        fetch = InputFetch("agent", ["memory.candidates.v1"], {"bootstrap.servers": broker, "group.id": "hung"},
                           10, commit_interval_s=0.5)
        runner = asyncio.ensure_future(fetch.run(apply, commit))
        fetch.start([("memory.candidates.v1", 0), ("memory.candidates.v1", 1)])
        await asyncio.sleep(2.0)
        assert fetch.running and fetch.failed is None
        started = time.monotonic()
        await asyncio.wait_for(fetch.stop(), 30)
        runner.cancel()
        assert not fetch.running
        return time.monotonic() - started

    with hung_broker() as (broker, accepted):
        stopped_in = asyncio.run(scenario(broker))
    assert accepted, "the fetch never connected to the hung broker"
    assert applied == [] and commits == []
    assert stopped_in < 10, stopped_in  # the poll (0.1 s) and librdkafka's close, not a broker timeout
