"""Process metrics of one worker (counters, gauges and a latency histogram) as prometheus_client
objects in a `CollectorRegistry` of the worker's own.

The Runtime calls `inc("family:label")` / `inc_label(family, label)`, `observe_latency(topic,
seconds)` and `set_gauge(name, value)`; `streams/api/health.py` registers, in the same registry,
the collector of the gauges read from Faust at scrape time (consumer lag, table sizes, recovery)
and serves `render()` at `GET /metrics`:

- every counter family `F` is the prometheus_client Counter `memstream_F_total` with one label;
  its label name comes from `FAMILY_LABELS` (`in`/`out`/`duplicate` → `topic`, `decision` →
  `action`, `violation` → `rule`, `negotiator` → `op`, `housekeeping` → `kind`, ...); `dlq`
  labels `stage/error_class` become the two labels `stage` and `error_class`; a family not listed
  gets the label `label`. The declared families are registered up front, so a scrape names them
  (HELP and TYPE) before their first increment, and so does `tests/api/test_grafana.py`;
- the processing latency is the histogram `memstream_processing_seconds{topic}` (`_bucket{le}`,
  `_sum`, `_count`), counted in plain ints by `LatencyHistogram` and exported as prometheus_client's
  `Histogram` would export it (a test holds the two expositions equal);
- `GAUGE_HELP` names the gauges set by the agents (`memstream_<name>`, 0 until first set).

One registry per Metrics, never prometheus_client's global default one: a process can hold
several runtimes (the tests do), each exporting only its own counts. `_created` series are off
(`disable_created_metrics()`: prometheus_client 0.26 has no per-registry switch, so this holds
for the whole process; they would double every counter and histogram for nothing Prometheus uses).

Per record, the Runtime increments counters and observes the histogram: the labelled children are
looked up once and kept (`labels()` costs about 4× an increment), the event loop's increments
are noted in a dict and added to the counters after each batch and before every read (`flush`,
see `inc_label`), and the histogram takes no lock.

No Faust, no Kafka (tests/runtime/test_metrics.py parses the output).
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

disable_created_metrics()  # process-wide in prometheus_client 0.26 (see the module docstring)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

PREFIX = "memstream"
#: what `GET /metrics` answers with: the Prometheus text format; every name is a legacy one
#: (`metric_name`), so the body reads the same as text format 0.0.4
CONTENT_TYPE = CONTENT_TYPE_LATEST

# counter family -> (label names, help). A `rt.count("family:label")` family not listed here is
# still exported, with the label name `label`.
FAMILY_LABELS: dict[str, tuple[tuple[str, ...], str]] = {
    "in": (("topic",), "Input records received, by input topic."),
    "input": (("event",), "The inputs fetched outside Faust (MEMSTREAM_INPUT_FETCH=librdkafka): `commit_refused` "
                          "(a batch's commit refused: a rebalance came first; its records are read again by their "
                          "owner), `fetch_failed` (the fetch stopped on an error; the worker exits)."),
    "out": (("topic",), "Records sent, by output topic."),
    "decision": (("action",), "Consolidation decisions, by action."),
    "dlq": (("stage", "error_class"), "Records sent to pipeline.dlq.v1, by stage and error class."),
    "duplicate": (("topic",), "Redelivered or duplicate input records dropped, by input topic."),
    "violation": (("rule",), "Session lifecycle violations, by rule."),
    "negotiator": (("op",), "Negotiator requests handled, by op."),
    "housekeeping": (("kind",), "Housekeeping actions (e.g. expired nodes deleted), by kind."),
    "memory_users": (("event",), "Users' memory state read from the memory-state table (`loaded`; `prefilled`: of those, "
                     "read by the prefill after a rebalance, unasked) and dropped from the bounded LRU (`evicted`)."),
    "memory_history_reads": (("read",), "Superseded (history) nodes read back from the memory-state table on demand: one "
                             "node (`node`: a supersession chain, an event on history) or a user's whole history "
                             "(`range`: an as-of query, a sweep, an erasure)."),
    "erase": (("label",), "Erasure work done: memory nodes deleted (`nodes`) and receipts sent (`receipts`)."),
    "analytics_refused": (("label",), "Analytics records refused, by reason."),
    "standby": (("event",), "The standby applier (MEMSTREAM_STANDBY_APPLY=librdkafka): changelog records written into "
                            "standby copies (`applied`); its thread stopped by an error (`apply_failed`); a standby "
                            "partition whose store did not open, so no copy is kept (`open_failed`)."),
    "acks_not_counted": (("reason",), "Input records Faust acknowledged that do not count towards a commit (`unapplied`: "
                                      "their batch was not applied; read again after the rebalance's seek)."),
}

GAUGE_HELP: dict[str, str] = {
    "memory_users_contained": "Users whose memory state could not be rebuilt on this worker (records dead-lettered, queries 503), among the users read since the last rebalance (a user is read on first touch).",
    "analytics_subjects_contained": ("Analytics subjects (users, sessions, graphs) whose stored state this worker cannot read or count "
                                     "into (increments refused as `contained`, not published, their view 503, left out of the "
                                     "summary), since the last rebalance."),
    "memory_foreign_rows": "memory-state rows skipped because their owner differs from their key, among the users read since the last rebalance.",
    "memory_users_loaded": "Users whose memory state this worker holds loaded (the LRU bounded by MEMSTREAM_LOADED_NODES_MAX).",
    "memory_nodes_loaded": ("Live nodes (+1 per user, + a 32nd of the superseded nodes' and de-duplication ids they hold) of the loaded users, "
                            "the figure bounded by MEMSTREAM_LOADED_NODES_MAX (pinned users of the running batch may exceed it)."),
}

PROCESSING_HELP = "Seconds a handler took to apply one decoded input record, by input topic."

_NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")


class Metrics:
    """One worker's counters, gauges and latency histogram, in `self.registry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._owner = threading.get_ident()  # whose increments wait for `flush` (see `inc_label`)
        self._pending: dict[tuple[str, str], int] = {}
        self._counters: dict[str, Counter] = {}
        self._children: dict[str, dict[str, Counter]] = {}  # family -> label -> labelled child
        self._gauges: dict[str, Gauge] = {}
        self._latency = LatencyHistogram(metric_name("processing_seconds"), PROCESSING_HELP, LATENCY_BUCKETS)
        self.registry.register(self._latency)
        for family in FAMILY_LABELS:
            self._counter(family)
        for name in GAUGE_HELP:
            self._gauge(name)

    def set_gauge(self, name: str, value: float) -> None:
        """A value that is set, not counted (exported as the gauge `memstream_<name>`)."""
        gauge = self._gauges.get(name) or self._gauge(name)
        gauge.set(value)

    def inc(self, name: str, n: int = 1) -> None:
        family, _, label = name.partition(":")
        self.inc_label(family, label, n)

    def inc_label(self, family: str, label: str, n: int = 1) -> None:
        """`inc(f"{family}:{label}", n)` without building and splitting the name (per record).
        On the thread that made this Metrics (the event loop's) the increment is only noted and
        reaches its counter at the next `flush` (a prometheus_client increment takes a lock: ~1 µs,
        several per record); every read flushes first (`render`, `counters`) and the agents flush
        after each batch. Other threads increment at once."""
        if threading.get_ident() == self._owner:
            key = (family, label)
            self._pending[key] = self._pending.get(key, 0) + n
            return
        self._inc_now(family, label, n)

    def flush(self) -> None:
        """Add the increments noted by `inc_label` to their counters (on the owning thread only:
        a read from another thread, e.g. /metrics served during a restore, sees them later)."""
        if not self._pending or threading.get_ident() != self._owner:
            return
        pending, self._pending = self._pending, {}
        for (family, label), n in pending.items():
            self._inc_now(family, label, n)

    def _inc_now(self, family: str, label: str, n: int) -> None:
        try:
            child = self._children[family][label]
        except KeyError:
            child = self._child(family, label)
        child.inc(n)

    def observe_latency(self, topic: str, seconds: float) -> None:
        self._latency.observe(topic, seconds)

    @property
    def counters(self) -> dict[str, dict[str, float]]:
        """{family: {label: count}} of every counter incremented so far (`label` as counted, the
        `dlq` one `stage/error_class`), read from the counters' own samples."""
        self.flush()
        out: dict[str, dict[str, float]] = {}
        for family, counter in self._counters.items():
            names = _label_names(family)
            out[family] = {"/".join(s.labels[n] for n in names): s.value
                           for m in counter.collect() for s in m.samples if s.name.endswith("_total")}
        return out

    def render(self) -> bytes:
        """The exposition of everything in the registry (`CONTENT_TYPE`)."""
        self.flush()
        return generate_latest(self.registry)

    def _counter(self, family: str) -> Counter:
        counter = self._counters.get(family)
        if counter is None:
            help_text = FAMILY_LABELS.get(family, ((), f"Events counted as {family!r}, by label."))[1]
            counter = Counter(metric_name(f"{family}_total"), help_text, _label_names(family), registry=self.registry)
            self._counters[family], self._children[family] = counter, {}
        return counter

    def _child(self, family: str, label: str) -> Counter:
        names = _label_names(family)
        child = self._counter(family).labels(*_split_label(label, len(names)))
        self._children[family][label] = child
        return child

    def _gauge(self, name: str) -> Gauge:
        gauge = Gauge(metric_name(name), GAUGE_HELP.get(name, f"Gauge {name!r}."), registry=self.registry)
        self._gauges[name] = gauge
        return gauge


def _label_names(family: str) -> tuple[str, ...]:
    return FAMILY_LABELS.get(family, (("label",), ""))[0]


class LatencyHistogram:
    """The processing-latency histogram (one series per `topic`), counted in plain ints and
    exported as a histogram family when the registry is collected: prometheus_client's
    `Histogram.observe` takes a lock for the sum and one for the bucket (~1.3% of a worker's
    main thread at one observation per record). The exposition is the same as that Histogram's:
    `_bucket{le}` cumulative, `+Inf`, `_sum`, `_count`. Observed from the event loop; a scrape
    from another thread may see one observation's bucket before its sum."""

    def __init__(self, name: str, documentation: str, bounds: Iterable[float]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = tuple(float(b) for b in bounds)
        self._le = [floatToGoString(b) for b in (*self.bounds, math.inf)]
        self.series: dict[str, list] = {}  #: topic -> [counts per bucket (the last: above every bound), sum]

    def observe(self, topic: str, seconds: float) -> None:
        series = self.series.get(topic)
        if series is None:
            series = self.series[topic] = [[0] * (len(self.bounds) + 1), 0.0]
        series[0][bisect.bisect_left(self.bounds, seconds)] += 1  # the first bound ≥ seconds (`le`)
        series[1] += seconds

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=("topic",))]

    def collect(self) -> list[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=("topic",))
        for topic, (counts, total) in list(self.series.items()):
            buckets, seen = [], 0
            for le, n in zip(self._le, list(counts), strict=True):
                seen += n
                buckets.append((le, float(seen)))
            family.add_metric([topic], buckets, total)
        return [family]


def _split_label(label: str, n: int) -> list[str]:
    if n == 1:
        return [label]
    parts = label.split("/", n - 1)
    return parts + [""] * (n - len(parts))


def metric_name(name: str) -> str:
    """`memstream_<name>` with every character Prometheus does not allow replaced by `_`."""
    out = f"{PREFIX}_{_BAD_NAME_CHARS.sub('_', name)}"
    assert _NAME_OK.match(out), out
    return out


def sample_names(families: Iterable[Metric]) -> set[str]:
    """The names of the series these families export in the text format, whether or not they
    have samples yet: a counter `N` exports `N_total`, a histogram `N_bucket`, `N_sum` and
    `N_count`, a gauge `N` (the Grafana dashboard's test checks its queries against them)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {f.name + s for f in families for s in suffixes.get(f.type, ("",))}
