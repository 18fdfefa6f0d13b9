"""The Quix Streams peer of the e2e bench: Quix Streams running memstream's own
`process_candidate` / `process_event` on the bench's input records.

It runs in its own virtualenv (bench/.venv-quix, made by bench_e2e on first use: Quix Streams is a
benchmark dependency, not a runtime one, and its pins need not agree with ours) with the repo on
sys.path for `streams.core`, `streams.contracts.wire` and `bench.core_step`:

    bench/.venv-quix/bin/python bench/quix_peer.py --broker 127.0.0.1:9092 --registry URL \\
        --group G --output TOPIC --count N --topics memory.candidates.v1,memory.events.v1,...

A Quix `Application` (consumer group G, from the earliest offset) reads the input topics as
bytes, decodes each value with memstream's codec (the same Avro framing the worker reads), keeps one
`UserMemory` per user in a dict (no changelog: the peer is given the cheapest state there is),
calls memstream's `process_candidate` for a memory candidate and `process_event` for a memory event
(other topics: decoded, nothing else), and sends the resulting ledger events as JSON to TOPIC.
After N records it stops (Quix flushes its producer and commits). Prints one JSON line: records,
seconds from the first record until the application has stopped, records/s, CPU seconds of the
process over the same span, CPU ms per record.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from quixstreams import Application  # noqa: E402

from bench.core_step import run_core  # noqa: E402
from streams.contracts import catalog  # noqa: E402
from streams.contracts.wire import CodecFactory  # noqa: E402
from streams.core import UserMemory  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--count", type=int, required=True)
    args = ap.parse_args()

    factory = CodecFactory.from_url(args.registry)
    names = [t for t in args.topics.split(",") if t]
    codecs = {t: factory.codec(catalog.topic(t).value_schema) for t in names}
    users: dict[str, UserMemory] = {}
    state = {"n": 0, "t0": 0.0, "cpu0": 0.0, "failed": 0}

    app = Application(broker_address=args.broker, consumer_group=args.group, auto_offset_reset="earliest",
                      loglevel="WARNING")
    out_topic = app.topic(args.output, value_serializer="json", key_serializer="str")

    def handle(topic: str, value: bytes, key: str) -> list:
        if not state["n"]:
            state["t0"], state["cpu0"] = time.monotonic(), cpu_s()
        state["n"] += 1
        ledger: list = []
        try:
            ledger = run_core(codecs, users, topic, key, value)
        except ValueError:
            state["failed"] += 1
        if state["n"] >= args.count:
            app.stop()
        return ledger

    frames = []
    for name in names:
        topic = app.topic(name, value_deserializer="bytes", key_deserializer="str")

        def bound(value, key, _ts, _headers, _name=name):
            return handle(_name, value, key)

        frames.append(app.dataframe(topic).apply(bound, metadata=True, expand=True).to_topic(out_topic))
    started = time.monotonic()
    app.run()  # every dataframe defined above
    elapsed = time.monotonic() - (state["t0"] or started)
    cpu = cpu_s() - state["cpu0"]
    n = state["n"]
    print(json.dumps({"records": n, "seconds": elapsed, "rate": n / elapsed if elapsed > 0 else 0.0,
                      "cpu_s": cpu, "cpu_ms_per_record": 1000 * cpu / max(1, n), "undecodable": state["failed"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
