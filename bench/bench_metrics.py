"""Cost of the per-record metric updates (streams/runtime/metrics.py), one core, no broker.

Per input record the Runtime increments `in` (and `out` per output, `dlq` per dead letter) and
observes the latency histogram. This times those calls on `Metrics` (prometheus_client objects,
the labelled children kept) beside the plain `defaultdict` increment the hand-written exposition
used before, and `labels()` looked up on every call (what keeping the children saves)::

    python -m bench.bench_metrics [repeats]
"""

from __future__ import annotations

import sys
import timeit
from collections import defaultdict

from streams.runtime.metrics import Metrics

N = 200_000


def main(repeats: int = 5) -> None:
    m = Metrics()
    plain: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    counter = m._counter("in")
    stmts = {
        "plain dict increment (before)": 'plain["in"]["graph.events.v1"] += 1',
        "Metrics.inc_label('in', topic)": 'm.inc_label("in", "graph.events.v1")',
        "Metrics.inc_label('dlq', 'stage/class')": 'm.inc_label("dlq", "decode/UnknownMagicByteError")',
        "Counter.labels(topic).inc() (no cache)": 'counter.labels("graph.events.v1").inc()',
        "Metrics.observe_latency(topic, 3 ms)": 'm.observe_latency("graph.events.v1", 0.003)',
        "one record: in + out + latency": 'm.inc_label("in", "graph.events.v1"); '
                                          'm.inc_label("out", "graph.state.v1"); '
                                          'm.observe_latency("graph.events.v1", 0.003)',
    }
    env = {"m": m, "plain": plain, "counter": counter}
    for name in stmts:
        best = min(timeit.repeat(stmts[name], globals=env, number=N, repeat=repeats)) / N
        print(f"{name:45s} {best * 1e9:7.0f} ns")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
