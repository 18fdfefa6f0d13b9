"""Codec throughput: encode + decode of a realistic memory_formed envelope, one core.

Compares memstream's value codec in both wire formats (Avro single-object encoding; Confluent
framing with the ids registered once up front, against an in-process mock registry) with JSON via
the standard library and via orjson. Run from the repo root::

    python -m bench.bench_codec [seconds-per-case]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import orjson

from streams.contracts.wire import CodecFactory, WireFormat

EVENT = {
    "event_id": "0b7e4c1a-3f1d-5c2e-9a77-0d6f0f8e21c4",
    "motebit_id": "mb_7f3a9c2e41d84b6f",
    "device_id": "ios-14F2A9",
    "timestamp": 1_767_225_600_123,
    "version_clock": 48_213,
    "event_type": "memory_formed",
    "payload": {
        "node_id": "node_5e2b1d7c9a4f4e3b8c1d",
        "content": "The user prefers green tea without sugar in the morning and avoids coffee after 2 pm.",
        "sensitivity": "personal",
        "source": "user_stated",
        "redacted": None,
        "redacted_sensitivity": None,
        "redacted_reason": None,
        "valid_from": 1_767_139_200_000,
        "valid_until": None,
    },
    "caused_by": None,
}


def rate(step: Callable[[], object], seconds: float) -> float:
    """Calls per second of `step`, best of three runs of about `seconds` / 3 each."""
    best = 0.0
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        deadline = start + seconds / 3
        while True:
            for _ in range(500):
                step()
            calls += 500
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, calls / (now - start))
    return best


def cases() -> dict[str, tuple[Callable[[dict], bytes], Callable[[bytes], object]]]:
    """(encode, decode) of every contender."""
    factory = CodecFactory.from_url("mock://bench")
    factory.register(["memory.events.v1"])
    codec = factory.codec("memory_event")
    return {
        "memstream avro single-object": (lambda r: codec.encode(r, WireFormat.SINGLE_OBJECT), codec.decode),
        "memstream avro confluent": (lambda r: codec.encode(r, WireFormat.CONFLUENT), codec.decode),
        "json (stdlib)": (lambda r: json.dumps(r, separators=(",", ":")).encode(), json.loads),
        "orjson": (orjson.dumps, orjson.loads),
    }


def main(seconds: float) -> None:
    print(f"memory_formed envelope, one core, Python {sys.version.split()[0]}")
    print(f"{'codec':<30} {'bytes':>6} {'encode/s':>11} {'decode/s':>11} {'enc+dec/s':>11}")
    for name, (encode, decode) in cases().items():
        data = encode(EVENT)
        assert decode(data) == EVENT, name
        enc = rate(lambda: encode(EVENT), seconds)  # noqa: B023 -- called in this iteration
        dec = rate(lambda: decode(data), seconds)  # noqa: B023 -- called in this iteration
        both = rate(lambda: decode(encode(EVENT)), seconds)  # noqa: B023 -- called in this iteration
        print(f"{name:<30} {len(data):>6} {enc:>11,.0f} {dec:>11,.0f} {both:>11,.0f}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.5)
