"""`make bench`: every benchmark, one after the other (results go to stdout; the figures we
recorded, with machine and date, are in bench/RESULTS.md). Arguments are passed to bench_e2e
(`make bench BENCH_ARGS="--users 100 --recovery-nodes 100000"`).

    codec         Avro (both framings) vs JSON encode+decode, one core        (no broker)
    consolidation pure-core decisions/s at 1k / 10k / 100k live nodes        (no broker)
    e2e           raw Kafka baseline, pipeline throughput (1 and 2 workers,  (local stack)
                  both stores), latency, changelog recovery, peak RSS
"""

from __future__ import annotations

import subprocess
import sys

STEPS = [
    ["-m", "bench.bench_codec"],
    ["bench/bench_consolidation.py", "--sizes", "1000,10000,100000", "--decisions", "600", "--brute", "10"],
    ["-m", "bench.bench_e2e"],
]

if __name__ == "__main__":
    for step in STEPS:
        step = step + sys.argv[1:] if step[-1] == "bench.bench_e2e" else step
        print(f"\n$ python {' '.join(step)}", flush=True)
        if subprocess.run([sys.executable, *step]).returncode != 0:
            sys.exit(f"benchmark {' '.join(step)} failed")
