"""End-to-end candidates/s through ONE memstream worker on the real local broker.

    .venv/bin/python -m bench.bench_pipeline [--candidates 20000] [--users 50]

Starts the local stack (`memstream dev up`), a worker with a fresh app id whose group starts at
the current end of the input topics, produces N generated candidates (a mix of new memories,
exact repeats and paraphrases over U users), and measures the time from the first produce until
the worker's group has committed past the last record. Prints one result line.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from pathlib import Path

from streams import catalog, devstack, generate, kafkatools, topics
from streams.settings import Settings


def candidates(n: int, users: int, seed: int = 11) -> list[generate.Item]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    items, base = [], generate.EPOCH_MS
    facts: list[tuple[str, str]] = []
    for i in range(n):
        user = f"bench-u{rng.randrange(users)}"
        if facts and rng.random() < 0.4:
            user, text = rng.choice(facts)  # a repeat: merge
        else:
            text = "The user " + " ".join(rng.choice(words) for _ in range(8)) + "."
            facts.append((user, text))
        items.append(generate.Item(catalog.MEMORY_CANDIDATES, user, generate._candidate(
            user, f"bench-{seed}-{i}", base + i * 1000, text, rng.choice(["none", "personal", "medical"]), "semantic")))
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=20000)
    ap.add_argument("--users", type=int, default=50)
    args = ap.parse_args()
    s = Settings.from_env()
    devstack.up(s)
    topics.apply(s)
    app_id = f"bench-pipeline-{int(time.time())}"
    ins = [catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS]
    kafkatools.position_group(s, app_id, kafkatools.end_offsets(s, [t.name for t in catalog.topics() if t.direction == "in"]))
    items = candidates(args.candidates, args.users)
    proc = kafkatools.start_worker(s, app_id, Path(s.stack_dir) / "logs" / "bench-worker.log",
                                   {})
    try:
        t0 = time.monotonic()
        generate.produce(items, s, progress=False)
        produced = time.monotonic() - t0
        ends = kafkatools.end_offsets(s, ins)
        while (lag := kafkatools.group_lag(s, app_id, ends)) > 0:
            time.sleep(0.5)
            if proc.poll() is not None:
                raise SystemExit(f"worker died; see {s.stack_dir}/logs/bench-worker.log")
        elapsed = time.monotonic() - t0
    finally:
        kafkatools.stop_worker(proc)
    print(f"{time.strftime('%Y-%m-%d')} {platform.node()} store={s.store} partitions={s.partitions}: "
          f"{args.candidates} candidates / {args.users} users in {elapsed:.1f}s = {args.candidates / elapsed:,.0f} candidates/s "
          f"end to end (produce took {produced:.1f}s)")


if __name__ == "__main__":
    main()
