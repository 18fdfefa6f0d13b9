"""Process metrics of one worker (counters and a latency histogram), kept in memory.

The Runtime calls `inc("family:label")` and `observe_latency(topic, seconds)`; the `/metrics`
view renders them in the Prometheus text format.
"""

from __future__ import annotations

from collections import defaultdict

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.latency: dict[str, list[int]] = {}  # topic -> cumulative bucket counts (+Inf last)
        self.latency_sum: dict[str, float] = defaultdict(float)

    def inc(self, name: str, n: int = 1) -> None:
        family, _, label = name.partition(":")
        self.counters[family][label] += n

    def observe_latency(self, topic: str, seconds: float) -> None:
        buckets = self.latency.setdefault(topic, [0] * (len(LATENCY_BUCKETS) + 1))
        for i, upper in enumerate(LATENCY_BUCKETS):
            if seconds <= upper:
                buckets[i] += 1
        buckets[-1] += 1
        self.latency_sum[topic] += seconds
