"""`make bench`: every benchmark, one after the other (results go to stdout; the figures we
recorded, with machine and date, are in bench/RESULTS.md).

    codec         Avro (both framings) vs JSON encode+decode, one core       (no broker)
    consolidation pure-core decisions/s at 1k / 10k / 100k live nodes       (no broker)
    pipeline      end-to-end candidates/s through one worker                 (local stack)
"""

from __future__ import annotations

import subprocess
import sys

STEPS = [
    ["-m", "bench.bench_codec"],
    ["bench/bench_consolidation.py", "--sizes", "1000,10000,100000", "--decisions", "600", "--brute", "10"],
    ["-m", "bench.bench_pipeline", "--candidates", "20000", "--users", "50"],
]

if __name__ == "__main__":
    for step in STEPS:
        print(f"\n$ python {' '.join(step)}", flush=True)
        if subprocess.run([sys.executable, *step]).returncode != 0:
            sys.exit(f"benchmark {' '.join(step)} failed")
