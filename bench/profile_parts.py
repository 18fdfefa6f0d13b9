"""Where each system's main thread spends its time, by part of the job, from py-spy raw profiles:
the same parts named the same way for memstream's worker and the same-job Quix Streams peer, so
the two can be read side by side (`bench_e2e --profile`, the same-job run).

A sample belongs to the part of its innermost frame that a rule names (`PARTS`, checked from the
leaf towards the root): a leaf in `dict.get` called by the core is the core's; fastavro called
by `ValueCodec.encode` is encoding, even inside the worker's batch or Quix's serializer; a RocksDB
read made by the core is the state's. What no rule names is the framework's: the fetch, the
hand-off to the stream, sensors, the batch's bookkeeping, the event loop (Faust, mode, aiokafka,
asyncio in memstream; the app, the dataframe and the consumer loop in Quix Streams).

Only the main thread is counted (a stack whose root is not a thread's `_bootstrap`): py-spy counts
a thread that waits for a core as busy, and on two cores beside the broker that inflates every
helper thread (memstream's delivery-report poller showed 11% of the samples for 2% of the CPU
that /proc gives it). Each part's µs per record is its share of the main thread's samples times
the main thread's CPU per record; the rest of the process's CPU is read per thread from /proc
(`bench.core_step.thread_kinds`), one row per kind of thread.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

#: (part, pattern on a frame "function (path)"), in no order: the innermost matching frame wins
PARTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((part, re.compile(pattern)) for part, pattern in (
    ("decode the inputs", r"^(ValueCodec\.(decode|decode_message|_read_body)|decode_key) \(streams/contracts/wire\.py\)"
                          r"|^Runtime\._decode \(streams/runtime/app\.py\)"),
    ("encode the outputs", r"^(ValueCodec\.(encode|_pick_branches)|encode_key) \(streams/contracts/wire\.py\)"),
    ("the core (checks, consolidation, promotion, audit)", r"\((streams/core/|streams/agents/memory_step\.py)"),
    ("state: rows encoded, staged, read and written",
     r"\((streams/agents/(memory_store|user_cache|state_scan)\.py|streams/runtime/row_cache\.py|faust/stores/"
     r"|quixstreams/state/)|^(encoded_row|encoded_key|json_row_encoder\.<locals>\.encode) "
     r"|^(Checkpoint\._write_state|Runtime\.(write_rows|_write_direct|_changelog_row)) "
     r"|^MemoryJob\.(user|emit) \("),
    ("analytics (memstream only)", r"\((streams/analytics/|streams/agents/analytics\.py)|^Runtime\.feed_analytics "),
    ("produce (hand the outputs to librdkafka)",
     r"^(Runtime\._produce|OutputProducer\.(produce|produce_now)) |\(quixstreams/(rowproducer|internal_producer)\.py\)"
     r"|^(Producer\.produce|cimpl\.Producer\.produce) "),
))
FRAMEWORK = "the framework (fetch, hand-off, stream, batch bookkeeping, event loop)"
#: the rows of the other threads (`bench.core_step.thread_kinds`, from /proc, not sampled)
THREADS = {"librdkafka": "librdkafka's threads (rdk:*)",
           "ms-consumer": "Faust's consumer thread (ms-consumer: aiokafka's fetches)",
           "ms-input": "the inputs fetched by librdkafka (ms-input: MEMSTREAM_INPUT_FETCH=librdkafka)",
           "ms-outputs": "the delivery reports of the outputs and rows (ms-outputs)",
           "ms-probe": "the registry and broker probe (ms-probe)",
           "ms-standby": "the standby replicas' applier (ms-standby)",
           "python": "other Python threads",
           "rocksdb": "RocksDB's threads (flush, compaction)",
           "ended": "threads that ended during the run"}


def part_of(frames: list[str]) -> str:
    """The part a sample (its frames, root first) belongs to: the innermost frame a rule names."""
    for frame in reversed(frames):
        for part, pattern in PARTS:
            if pattern.search(frame):
                return part
    return FRAMEWORK


def main_thread(frames: list[str]) -> bool:
    """A sample of the main thread: its root is not a started thread's `Thread._bootstrap`."""
    return bool(frames) and not frames[0].startswith("Thread._bootstrap ")


def main_thread_parts(profile: Path) -> Counter[str]:
    """Samples of the main thread per part, from a py-spy `--format raw` profile."""
    parts = Counter[str]()
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if stack and main_thread(frames):
            parts[part_of(frames)] += int(count)
    return parts


def us_per_record(parts: Counter[str], threads_ms: dict[str, float]) -> dict[str, float]:
    """Each part's µs per record: its share of the main thread's samples × the main thread's
    CPU per record (`threads_ms["main"]`, ms per record); plus each other kind of thread's CPU
    (`THREADS`). The values add up to the process's CPU per record."""
    total = sum(parts.values())
    main_ms = threads_ms.get("main", 0.0)
    out = {part: 1000 * main_ms * n / total for part, n in parts.items()} if total else {}
    out.update((THREADS[kind], 1000 * ms) for kind, ms in threads_ms.items() if kind in THREADS)
    return out


def side_by_side(ours: dict[str, float], theirs: dict[str, float]) -> list[str]:
    """A markdown table: each part's µs per record for memstream and the peer, and the difference."""
    order = [p for p, _ in PARTS] + [FRAMEWORK, *THREADS.values()]
    lines = ["| part (main thread by py-spy; µs per input record) | memstream | the same-job peer | memstream − peer |",
             "|---|---|---|---|"]
    for part in order:
        a, b = ours.get(part, 0.0), theirs.get(part, 0.0)
        lines.append(f"| {part} | {a:,.0f} | {b:,.0f} | {a - b:+,.0f} |")
    a, b = sum(ours.values()), sum(theirs.values())
    lines.append(f"| **all** | **{a:,.0f}** | **{b:,.0f}** | **{a - b:+,.0f}** |")
    return lines
