"""The Quix Streams peers of the e2e bench: Quix Streams running memstream's own
`process_candidate` / `process_event` (``--work core``), or a per-user counter in its RocksDB
state (``--work counter``), on the bench's input records.

It runs in its own virtualenv (`bench_e2e.QUIX_VENV`, under MEMSTREAM_CACHE_DIR, made by bench_e2e on first use: Quix Streams is a
benchmark dependency, not a runtime one, and its pins need not agree with ours) with the repo on
sys.path for `streams.core`, `streams.contracts.wire` and `bench.core_step`:

    $QUIX_VENV/bin/python bench/quix_peer.py --broker 127.0.0.1:9092 --registry URL \\
        --group G --output TOPIC --count N --topics memory.candidates.v1,memory.events.v1,... \\
        --state-dir DIR [--work core]

A Quix `Application` (consumer group G, from the earliest offset) reads the input topics as
bytes. ``core`` (bench/core_step.py `CoreWork`): decodes each value with memstream's codec (the
same Avro framing the worker reads), keeps one `UserMemory` per user in a dict (no changelog: the
peer is given the cheapest state there is), calls memstream's `process_candidate` for a memory
candidate and `process_event` for a memory event (other topics: decoded, nothing else), and sends
the resulting ledger events as JSON to TOPIC. ``counter``: adds one to the key's count in Quix's
state (RocksDB, with its changelog) and sends the count as JSON to TOPIC. After N records it stops
(Quix flushes its producer and commits). Prints one JSON line (`core_step.Tally`): records,
seconds from the first record until the application has stopped, records/s, CPU seconds of the
process over the same span, CPU ms per record.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from quixstreams import Application, State  # noqa: E402

from bench.core_step import WORKS, CoreWork, Tally  # noqa: E402
from streams.core.warmup import warm_up  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--work", choices=WORKS, default="core")
    ap.add_argument("--state-dir", required=True, help="Quix Streams' state directory (RocksDB of --work counter)")
    args = ap.parse_args()

    names = [t for t in args.topics.split(",") if t]
    work = CoreWork(args.registry, names)
    if args.work == "core":
        warm_up()  # the core's compiled loops, before the first record (as a worker does at start)
    tally = Tally(args.count)

    app = Application(broker_address=args.broker, consumer_group=args.group, auto_offset_reset="earliest",
                      loglevel="WARNING", state_dir=args.state_dir)
    out_topic = app.topic(args.output, value_serializer="json", key_serializer="str")

    def counted() -> None:
        if tally.seen():
            app.stop()

    def core(topic: str, value: bytes, key: str) -> list:
        counted()
        return work(topic, key, value)

    def counter(rs: State) -> int:
        counted()
        n = rs.get("n", 0) + 1
        rs.set("n", n)
        return n

    frames = []
    for name in names:
        topic = app.topic(name, value_deserializer="bytes", key_deserializer="str")
        sdf = app.dataframe(topic)
        if args.work == "core":
            def bound(value, key, _ts, _headers, _name=name):
                return core(_name, value, key)
            sdf = sdf.apply(bound, metadata=True, expand=True)
        else:
            sdf = sdf.apply(lambda _value, rs: counter(rs), stateful=True)
        frames.append(sdf.to_topic(out_topic))
    app.run()  # every dataframe defined above
    print(tally.result(work.undecodable))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
