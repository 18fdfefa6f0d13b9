"""The framework peers of the e2e bench that run in memstream's own virtualenv (the Quix Streams ones
are bench/quix_peer.py): issue 14's table asks how much of a record's cost is the framework's, so
each framework runs the same input with each kind of work of bench/core_step.py (``core``:
memstream's own `process_candidate`; ``counter``: a per-user counter):

* ``plain``: a confluent-kafka (librdkafka) batch loop: `consume(1000)`, the work, `produce()`
  per output, an asynchronous commit per batch. The counter is a dict (no changelog).
* ``faust``: a minimal Faust agent, as Faust's documentation writes one: ``async for event in
  stream.events()``, one `Topic.send` per output (Faust's aiokafka producer), the counter in a
  `Table` on the production store (``rocksdb://``, with its changelog). With ``--work input`` it
  only reads: batches of `take_events` as memstream's worker takes them (MEMSTREAM_BATCH_MAX 500,
  20 ms), no work and no output: the floor of reading a record through Faust.

    .venv/bin/python bench/peers.py plain --work core --broker 127.0.0.1:9092 --registry URL \\
        --group G --output TOPIC --count N --topics memory.candidates.v1,... --data-dir DIR --partitions 6

Consumer group G starts where the bench positioned it; after N records the peer flushes its producer
and commits, then prints one JSON line (`core_step.Tally`): records, seconds and CPU seconds
of the process (every thread) from its first record until then.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import orjson

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.core_step import WORKS, CoreWork, Tally  # noqa: E402


def plain(args: argparse.Namespace) -> str:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

    tally = Tally(args.count)
    work = CoreWork(args.registry, args.topics) if args.work == "core" else None
    counts: dict[bytes, int] = {}
    consumer = Consumer({"bootstrap.servers": args.broker, "group.id": args.group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "log_level": 0})
    producer = Producer({"bootstrap.servers": args.broker, "partitioner": "murmur2_random", "linger.ms": 5,
                         "acks": "all", "log_level": 0})

    def send(key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(args.output, value, key)
                return
            except BufferError:
                producer.poll(0.05)

    consumer.subscribe(args.topics)
    done = False
    try:
        while not done:
            batch = consumer.consume(1000, 0.1)
            for msg in batch:
                if msg.error():
                    continue
                key = msg.key()
                if work is None:
                    n = counts[key] = counts.get(key, 0) + 1
                    send(key, orjson.dumps(n))
                else:
                    for ev in work(msg.topic(), key.decode(), msg.value()):
                        send(key, orjson.dumps(ev))
                if tally.seen():
                    done = True
                    break
            if batch:
                producer.poll(0)
                consumer.commit(asynchronous=True)
        producer.flush()
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:  # the last batch's asynchronous commit already took everything
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise
        return tally.result(work.undecodable if work else 0)
    finally:
        consumer.close()


def faust_agent(args: argparse.Namespace) -> None:
    import faust

    tally = Tally(args.count)
    work = CoreWork(args.registry, args.topics) if args.work == "core" else None
    app = faust.App(args.group, broker=f"kafka://{args.broker}", store="rocksdb://", datadir=args.data_dir,
                    topic_partitions=args.partitions, web_enabled=False, consumer_auto_offset_reset="earliest")
    source = app.topic(*args.topics, key_serializer="raw", value_serializer="raw")
    out = app.topic(args.output, key_serializer="raw", value_serializer="raw")
    counts = app.Table("counts", default=int, partitions=args.partitions)

    async def finish() -> None:
        await app.producer.flush()
        await app.consumer.commit()
        # fd 1 itself (Faust's worker logs what goes to sys.stdout), on a line of its own (its spinner)
        os.write(1, f"\n{tally.result(work.undecodable if work else 0)}\n".encode())
        try:  # leave the group (the bench deletes it), but do not wait for the rest of Faust's stop
            await asyncio.wait_for(app.consumer.stop(), 10)
        finally:
            os._exit(0)

    async def read_only(stream: Any) -> None:
        async for events in stream.take_events(500, 0.02):
            for _ in events:
                if tally.seen():
                    asyncio.ensure_future(finish())

    @app.agent(source)
    async def run(stream: Any) -> None:
        if args.work == "input":
            await read_only(stream)
            return
        async for event in stream.events():
            key = event.key
            if work is None:
                counts[key] += 1
                await out.send(key=key, value=orjson.dumps(counts[key]))
            else:
                for ev in work(event.message.topic, key.decode(), event.value):
                    await out.send(key=key, value=orjson.dumps(ev))
            if tally.seen():
                asyncio.ensure_future(finish())

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("framework", choices=("plain", "faust"))
    ap.add_argument("--work", choices=(*WORKS, "input"), default="core", help="input: Faust only, read and nothing else")
    ap.add_argument("--broker", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--group", required=True, help="consumer group (Faust: the app id)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--topics", required=True, type=lambda s: [t for t in s.split(",") if t])
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--data-dir", required=True, help="Faust's data directory (its Table's RocksDB)")
    ap.add_argument("--partitions", type=int, default=6, help="partitions of the input topics (Faust's Table)")
    args = ap.parse_args()
    if args.framework == "plain":
        print(plain(args), flush=True)
    else:
        faust_agent(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
