"""The worker's output producer (streams/runtime/outputs.py) on the real broker.

- golden: one input range processed twice by a fresh worker, once with Faust's producer (the
  earlier path, MEMSTREAM_OUTPUT_PRODUCER=faust) and once with the librdkafka one: every output
  topic gets the same records — key bytes, value bytes, headers, partition, and order among the
  records of one key — except a dead letter's `failed_at` and `worker` (when and where), and
  the memory-state table ends with the same rows on the same changelog partitions;
- partitions: every keyed record the librdkafka producer writes lands on murmur2(key) mod n
  (`streams.core.partitioning.partition_for`, the partition the Java client and aiokafka pick);
- a record the broker refuses fails the batch's wait for its outputs: no table row is written.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench.fleet import read_range
from streams.contracts import catalog
from streams.core.partitioning import partition_for
from streams.runtime import checkpoint
from streams.runtime.outputs import OutputProducer, OutputsFailed
from streams.tools import kafkatools
from tests.kafka_util import codecs, produce
from tests.system.test_faults_kafka import INPUTS, begin, fleet_for, stream_of

pytestmark = pytest.mark.kafka

#: every topic the memory agent writes for candidates, dead letters included
OUTPUT_TOPICS = [catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.MEMORY_NODES, catalog.MEMORY_QUARANTINE,
                 catalog.DLQ]


def _records(settings, start, end) -> dict[tuple[str, int, bytes | None], list[tuple]]:
    """(topic, partition, key) -> [(value, headers)] in offset order, of one output range.
    Per key, not per partition: a partition of memory.nodes.v1 (keyed `<user>/<node_id>`) mixes
    records of users from several input partitions, whose interleaving no run repeats."""
    out: dict[tuple[str, int, bytes | None], list[tuple]] = {}
    for topic in OUTPUT_TOPICS:
        for msg in read_range(settings, topic, start, end):
            value, headers = msg.value(), msg.headers() or []
            if topic == catalog.DLQ:  # when and where it failed: the only fields that may differ
                value = {**codecs(settings).codec(catalog.topic(topic).value_schema).decode(value),
                         "failed_at": 0, "worker": ""}
            out.setdefault((topic, msg.partition(), msg.key()), []).append((value, headers))
    return out


def _final_rows(settings, topic: str) -> dict[tuple[bytes, int], object]:
    last: dict[tuple[bytes, int], object] = {}
    for msg in read_range(settings, topic, {}, kafkatools.end_offsets(settings, [topic])):
        row = None if msg.value() is None else json.loads(msg.value())
        if isinstance(row, dict):
            row.pop("pending", None)
        last[(msg.key(), msg.partition())] = row
    # a key whose last row is a tombstone has no row: a batch that wrote and removed it (a node
    # superseded in the batch that formed it moves to `~h/`) sent nothing, one cut earlier sent both
    return {k: v for k, v in last.items() if v is not None}


def test_output_records_are_the_same_through_librdkafka_as_through_faust(stack, unique):
    tag = f"golden-{unique}"
    items = stream_of(tag, users=8, n=160)
    sc = begin(stack, tag, items)
    produce(stack, catalog.MEMORY_CANDIDATES, items)
    poison = [(items[0][0], b"\x00\x00\x00\x00\x07not avro"), (items[1][0], b"garbage")]
    produce(stack, catalog.MEMORY_CANDIDATES, poison)
    sc.inputs_end = kafkatools.end_offsets(stack, INPUTS)

    got = {}
    for mode in ("faust", "librdkafka"):
        start = kafkatools.end_offsets(stack, OUTPUT_TOPICS)
        fleet = fleet_for(sc, mode, MEMSTREAM_OUTPUT_PRODUCER=mode, MEMSTREAM_STANDBY_REPLICAS="0")
        try:
            fleet.start("only")
            fleet.wait_caught_up(sc.inputs_end)
        finally:
            fleet.stop_all()
        got[mode] = _records(stack, start, kafkatools.end_offsets(stack, OUTPUT_TOPICS))

    before, after = got["faust"], got["librdkafka"]
    assert {t for t, _p, _k in before} >= {catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.MEMORY_NODES,
                                       catalog.DLQ}, "the stream exercised too few outputs"
    assert sum(len(v) for k, v in before.items() if k[0] == catalog.DLQ) == len(poison)
    assert before.keys() == after.keys(), "a key landed on another partition (or was not written)"
    for where in before:
        assert before[where] == after[where], \
            f"{where}: {len(before[where])} records through Faust, {len(after[where])} through librdkafka"
    # the table rows: the same final row per key, on the same changelog partition (the aux row's
    # `pending` redo log lists the rows of its batch, and batches may be cut differently)
    state = {mode: _final_rows(stack, f"it-fault-{tag}-{mode}-memory-state-changelog") for mode in got}
    assert state["faust"] and state["faust"] == state["librdkafka"]
    partitions = stack.partitions
    for topic, p, key in after:
        if key:
            assert p == partition_for(key, partitions), f"{topic}: key {key!r} on partition {p}"


def test_librdkafka_keys_land_where_partition_for_says(stack, unique):
    """Also for keys no test stream happens to contain (every length mod 4, non-ASCII)."""
    topic = f"it-outputs-partitions-{unique}"
    admin = AdminClient({"bootstrap.servers": stack.broker})
    admin.create_topics([NewTopic(topic, num_partitions=7, replication_factor=1)])[topic].result(30)
    keys = [f"user-{i}-{'x' * (i % 5)}-ü".encode() for i in range(60)]
    out = OutputProducer.for_worker(stack.broker, "test-outputs", 5, 1_000_000)

    async def send_all():
        d = out.deliveries()
        for k in keys:
            await out.produce(d, topic, k, b"v")
        await d

    try:
        asyncio.run(send_all())
    finally:
        out.close()
    records = list(read_range(stack, topic, {}, kafkatools.end_offsets(stack, [topic])))
    assert len(records) == len(keys)
    for msg in records:
        assert msg.partition() == partition_for(msg.key(), 7), msg.key()
    admin.delete_topics([topic])


class _Table(dict):
    """A stand-in table (the checkpoint only calls get / [] / pop on it)."""

    name = "t"


def test_a_refused_output_keeps_the_batch_from_writing_its_state(stack, unique):
    """The broker refuses a record (over the topic's max.message.bytes, which librdkafka does not
    retry): the batch's wait for its outputs raises and no staged row is written; the worker then
    stops without committing (`Runtime.never_ack_unless_applied`)."""
    topic = f"it-outputs-small-{unique}"
    admin = AdminClient({"bootstrap.servers": stack.broker})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                  config={"max.message.bytes": "1000"})])[topic].result(30)
    out = OutputProducer.for_worker(stack.broker, "test-outputs", 5, 1_000_000)
    table = _Table()

    class Event:  # what the checkpoint needs of a Faust event: something to hold a weak reference to
        pass

    async def handle(cp, event) -> bool:
        if cp.deliveries is None:
            cp.deliveries = out.deliveries()
            cp.record_ack(cp.deliveries)
        await out.produce(cp.deliveries, topic, b"k", b"small")
        await out.produce(cp.deliveries, topic, b"k", b"x" * 5000)  # refused by the broker
        cp.write(table, "row", {"applied": True})
        return True

    async def run() -> None:
        await checkpoint.run_batch([Event()], handle)

    try:
        with pytest.raises(OutputsFailed, match="not acknowledged"):
            asyncio.run(run())
    finally:
        out.close()
    assert table == {}, "a row was written although an output of its batch was refused"
    admin.delete_topics([topic])


def test_connect_reads_the_metadata_before_the_first_batch_and_never_raises(stack):
    """A worker connects its output producer before it takes records (the first batch then does not
    wait for the connection and the topics' leaders); a broker that does not answer is logged, not fatal."""
    out = OutputProducer.for_worker(stack.broker, "test-outputs-connect", 5, 1_000_000)
    try:
        assert out.connect(timeout=30.0) is True
    finally:
        out.close()
    from tests.kafka_util import free_port

    nowhere = OutputProducer.for_worker(f"127.0.0.1:{free_port()}", "test-outputs-nowhere", 5, 1_000_000)
    try:
        assert nowhere.connect(timeout=1.0) is False
    finally:
        nowhere.close()


def test_a_waiting_batch_does_not_wait_for_the_linger(stack, unique):
    """While the agents produce, records linger (`MEMSTREAM_PRODUCER_LINGER_MS`, here a minute) to fill
    requests; once a batch waits for them, they are sent at once (the poller flushes). Without it this
    batch would wait the whole minute, twice per batch in a worker (outputs, then changelog rows)."""
    topic = f"it-outputs-linger-{unique}"
    admin = AdminClient({"bootstrap.servers": stack.broker})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    out = OutputProducer.for_worker(stack.broker, "test-outputs-linger", 60_000, 1_000_000, timeout_s=300.0)
    assert out.connect(timeout=30.0)

    async def run() -> int:
        d = out.deliveries()
        await out.produce(d, topic, b"k", b"lingering")
        await asyncio.sleep(1.0)
        held = len(out._producer)  # nobody waits yet: still held by the linger
        await asyncio.wait_for(d, 30.0)  # a minute's linger would time this out
        return held

    try:
        assert asyncio.run(run()) == 1
        assert len(out._producer) == 0
    finally:
        out.close()
    assert [m.value() for m in read_range(stack, topic, {}, kafkatools.end_offsets(stack, [topic]))] == [b"lingering"]
    admin.delete_topics([topic])
