"""The input fetch outside Faust (streams/runtime/direct_input.py, MEMSTREAM_INPUT_FETCH=librdkafka)
on the real broker:

- it reads its partitions from the group's committed offsets (the beginning when none), hands
  every record once, in each partition's order, in batches of at most MEMSTREAM_BATCH_MAX, and
  commits one past each batch's last offset per partition once the batch is applied;
- started again (the next rebalance), it reads only what follows the committed offsets;
- a batch not applied (the worker drains) is not committed: started again, it is read again;
- stopped, it hands nothing more, and a batch being applied finishes before `stop` returns;
- with a commit interval, the applied batches' offsets are committed together once it has
  passed, and by `stop` whatever it is;
- the prefetch bound reaches librdkafka.

A whole worker with its inputs fetched so (Faust's assignor, the claimed partitions left paused in
Faust's consumer, the commits as the group's member): tests/system/test_pipeline_kafka.py
`test_inputs_fetched_by_librdkafka`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streams.runtime.direct_input import InputFetch, consumer_config
from tests.kafka_util import producer

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def _topic(settings, name: str, n: int) -> dict[int, list[int]]:
    """A topic of `n` records (value = its number) spread over the partitions; partition -> offsets."""
    admin = AdminClient({"bootstrap.servers": settings.broker})
    admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])[name].result(30)
    return _produce(settings, name, range(n))


def _produce(settings, name: str, numbers) -> dict[int, list[int]]:
    written: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    p = producer(settings)

    def delivered(err, msg) -> None:
        assert err is None, err
        written[msg.partition()].append(msg.offset())

    for i in numbers:
        p.produce(name, key=f"k{i % 17}".encode(), value=str(i).encode(), on_delivery=delivered)
    assert p.flush(30) == 0
    return written


class Group:
    """Commits as a group with no members may (what the runtime does through Faust's consumer)."""

    def __init__(self, settings, group: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False})
        self.commits: list[dict[tuple[str, int], int]] = []

    async def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
        self.consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
        self.commits.append(dict(offsets))
        return True

    def committed(self, topic: str) -> dict[int, int]:
        tps = self.consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}


def _fetch(settings, topic: str, group: str, batch_max: int = 50, queue_kbytes: int = 1024,
           commit_interval_s: float = 0.0, **more) -> InputFetch:
    """An `InputFetch` with the worker's consumer configuration (`consumer_config`: its fetch
    min bytes and max wait included) from `settings` with `more` changed."""
    config = consumer_config(dataclasses.replace(settings, input_queue_kbytes=queue_kbytes, **more), group)
    return InputFetch("test", [topic], config, batch_max, commit_interval_s=commit_interval_s)


async def _run_until(fetch: InputFetch, group: Group, want: int, apply=None, timeout: float = 60) -> list:
    """Start the fetch on every partition, apply (record) batches until `want` records came, stop."""
    batches: list[list] = []

    async def record(events) -> bool:
        batches.append([(e.message.partition, e.message.offset, e.message.value) for e in events])
        return True if apply is None else await apply(events)

    runner = asyncio.ensure_future(fetch.run(record, group.commit))
    fetch.start((topic, p) for topic in fetch.topics for p in range(PARTITIONS))
    deadline = time.monotonic() + timeout
    try:
        while sum(map(len, batches)) < want:
            assert fetch.failed is None, fetch.failed
            assert time.monotonic() < deadline, f"{sum(map(len, batches))} of {want} records"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything more would come now
        await fetch.stop()
    finally:
        runner.cancel()
    return batches


async def _running(fetch: InputFetch, commit, until, what: str, timeout: float = 30) -> tuple[list[int], asyncio.Future]:
    """Start the fetch on every partition with an `apply` that notes each batch's size; returns
    (those sizes, the running task) once `until(sizes)`."""
    sizes: list[int] = []

    async def apply(events) -> bool:
        sizes.append(len(events))
        return True

    runner = asyncio.ensure_future(fetch.run(apply, commit))
    fetch.start((topic, p) for topic in fetch.topics for p in range(PARTITIONS))
    deadline = time.monotonic() + timeout
    while not until(sizes):
        assert time.monotonic() < deadline, f"{what} (batches applied: {sizes})"
        await asyncio.sleep(0.05)
    return sizes, runner


def test_records_come_once_in_order_in_bounded_batches_and_are_committed(stack, unique):
    topic, group = f"it-input-{unique}", f"it-input-{unique}"
    written = _topic(stack, topic, 400)
    g = Group(stack, group)
    fetch = _fetch(stack, topic, group, batch_max=50)
    batches = asyncio.run(_run_until(fetch, g, 400))
    assert all(1 <= len(b) <= 50 for b in batches)
    seen = [r for b in batches for r in b]
    for p in range(PARTITIONS):
        assert [o for pp, o, _ in seen if pp == p] == written[p]  # each once, in the partition's order
    assert sorted(int(v) for _, _, v in seen) == list(range(400))
    assert g.committed(topic) == {p: written[p][-1] + 1 for p in range(PARTITIONS)}
    assert fetch.committed == {(topic, p): written[p][-1] + 1 for p in range(PARTITIONS)}
    assert fetch.config["queued.max.messages.kbytes"] == 1024  # MEMSTREAM_INPUT_QUEUE_KBYTES


def test_a_lone_record_comes_although_the_fetch_asks_for_more_bytes_than_there_will_ever_be(stack, unique):
    """MEMSTREAM_FETCH_MIN_BYTES far above what the topic holds: the broker answers each fetch
    after MEMSTREAM_FETCH_MAX_WAIT_MS with what there is, so a single record is not held back."""
    topic, group = f"it-input-lone-{unique}", f"it-input-lone-{unique}"
    written = _topic(stack, topic, 1)
    fetch = _fetch(stack, topic, group, fetch_min_bytes=10_000_000, fetch_max_wait_ms=50)
    assert (fetch.config["fetch.min.bytes"], fetch.config["fetch.wait.max.ms"]) == (10_000_000, 50)
    batches = asyncio.run(_run_until(fetch, Group(stack, group), 1, timeout=30))
    assert [(p, o) for b in batches for p, o, _ in b] == [(p, o) for p, offs in written.items() for o in offs]


def test_started_again_it_reads_only_what_follows_the_committed_offsets(stack, unique):
    topic, group = f"it-input-again-{unique}", f"it-input-again-{unique}"
    _topic(stack, topic, 120)
    g = Group(stack, group)
    asyncio.run(_run_until(_fetch(stack, topic, group), g, 120))
    _produce(stack, topic, range(1000, 1030))
    batches = asyncio.run(_run_until(_fetch(stack, topic, group), g, 30))
    assert sorted(int(v) for b in batches for _, _, v in b) == list(range(1000, 1030))


def test_a_batch_not_applied_is_not_committed_and_is_read_again(stack, unique):
    topic, group = f"it-input-drain-{unique}", f"it-input-drain-{unique}"
    _topic(stack, topic, 90)
    g = Group(stack, group)

    async def refuse(_events) -> bool:  # a draining worker applies nothing
        return False

    asyncio.run(_run_until(_fetch(stack, topic, group), g, 90, apply=refuse))
    assert g.commits == []
    assert all(o < 0 for o in g.committed(topic).values())  # nothing committed
    batches = asyncio.run(_run_until(_fetch(stack, topic, group), g, 90))
    assert sorted(int(v) for b in batches for _, _, v in b) == list(range(90))


def test_stop_waits_for_the_batch_being_applied_and_nothing_comes_after(stack, unique):
    topic, group = f"it-input-stop-{unique}", f"it-input-stop-{unique}"
    _topic(stack, topic, 300)
    g = Group(stack, group)
    fetch = _fetch(stack, topic, group, batch_max=20)

    async def scenario() -> int:
        applied: list[int] = []
        entered = asyncio.Event()
        release = asyncio.Event()

        async def slow(events) -> bool:
            entered.set()
            await release.wait()
            applied.append(len(events))
            return True

        runner = asyncio.ensure_future(fetch.run(slow, g.commit))
        fetch.start((topic, p) for p in range(PARTITIONS))
        await asyncio.wait_for(entered.wait(), 30)
        stopping = asyncio.ensure_future(fetch.stop())
        await asyncio.sleep(0.5)
        assert not stopping.done(), "stop returned while a batch was being applied"
        release.set()
        await asyncio.wait_for(stopping, 30)
        assert len(applied) == 1 and len(g.commits) == 1  # that batch, committed; nothing queued after it
        await asyncio.sleep(0.5)
        assert len(applied) == 1, "a batch was applied after stop"
        assert not fetch.running
        runner.cancel()
        return applied[0]

    first = asyncio.run(scenario())
    # what was fetched beyond the applied batch is read again, and only that
    batches = asyncio.run(_run_until(_fetch(stack, topic, group), g, 300 - first))
    assert sum(map(len, batches)) == 300 - first


def test_a_fetch_that_fails_says_why_counts_it_and_commits_nothing(stack, unique, monkeypatch):
    from streams.runtime import direct_input

    topic, group = f"it-input-fail-{unique}", f"it-input-fail-{unique}"
    _topic(stack, topic, 30)
    g = Group(stack, group)
    counted: list[str] = []
    failed: list[str] = []

    def broken(_m):
        raise ValueError("a record librdkafka handed could not be read")

    monkeypatch.setattr(direct_input, "event_of", broken)
    fetch = InputFetch("test", [topic], {"bootstrap.servers": stack.broker, "group.id": group}, 50,
                       count=lambda name, n=1: counted.append(name), on_failed=failed.append)

    async def scenario() -> None:
        applied, runner = await _running(fetch, g.commit, lambda _sizes: bool(failed), "the fetch did not report its failure")
        await fetch.stop()
        runner.cancel()
        assert applied == []

    asyncio.run(scenario())
    assert failed == ["ValueError: a record librdkafka handed could not be read"] == [fetch.failed]
    assert counted == ["input:fetch_failed"]
    assert g.commits == [] and all(o < 0 for o in g.committed(topic).values())


def test_with_a_commit_interval_applied_batches_are_committed_together_and_by_stop(stack, unique):
    topic, group = f"it-input-interval-{unique}", f"it-input-interval-{unique}"
    written = _topic(stack, topic, 200)
    g = Group(stack, group)
    ends = {(topic, p): written[p][-1] + 1 for p in range(PARTITIONS)}

    async def scenario(interval: float) -> list[int]:
        fetch = _fetch(stack, topic, f"{group}-{interval}", batch_max=10, commit_interval_s=interval)
        fetch_group = Group(stack, f"{group}-{interval}")
        _sizes, runner = await _running(fetch, fetch_group.commit, lambda sizes: sum(sizes) >= 200, "200 records")
        if interval < 10:
            await asyncio.sleep(interval + 0.5)  # the interval passes: committed without a stop
            assert fetch_group.commits and fetch_group.commits[-1] == {tp: o for tp, o in ends.items()
                                                                       if tp in fetch_group.commits[-1]}
            assert {tp: o for c in fetch_group.commits for tp, o in c.items()} == ends
        else:
            assert fetch_group.commits == []  # 20 batches applied, none committed before the interval
        await fetch.stop()
        runner.cancel()
        assert fetch.committed == ends
        assert fetch_group.committed(topic) == {p: o for (_t, p), o in ends.items()}
        return [len(c) for c in fetch_group.commits]

    assert asyncio.run(scenario(3600.0)) == [PARTITIONS]  # one commit, by stop, of every partition's end
    assert len(asyncio.run(scenario(0.5))) < 20  # fewer commits than batches
    assert g.commits == []
