"""The /metrics exposition (streams/runtime/metrics.py, streams/api/health.py; written by prometheus_client
from the Runtime's own registry) is valid Prometheus text format, and since every name is a legacy
one, valid format 0.0.4 too: checked line by line by a strict checker here, and parsed by
prometheus_client's own text parser."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.api.health import Health, PartitionLag, WorkerCollector, worker_families
from streams.runtime.metrics import LATENCY_BUCKETS, Metrics, metric_name

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)"
SAMPLE = re.compile(rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})? (?P<value>{_VALUE})$")
HELP = re.compile(rf"^# HELP (?P<name>{_NAME}) (?:[^\\\n]|\\\\|\\n)*$")
TYPE = re.compile(rf"^# TYPE (?P<name>{_NAME}) (?P<type>counter|gauge|histogram|summary|untyped)$")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def strict_parse(text: str) -> dict[str, dict]:
    """A strict reader of the 0.0.4 text format: every line is HELP, TYPE or a sample; each family
    has one HELP and one TYPE before its samples and its samples are contiguous; sample names
    belong to the family (histogram: _bucket/_sum/_count); no duplicate series; histogram buckets
    are cumulative, end at le="+Inf" and equal _count. Returns {family: {type, samples}}."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    families: dict[str, dict] = {}
    current = None
    series: set = set()
    for n, line in enumerate(text.splitlines(), 1):
        if m := HELP.match(line):
            assert m["name"] not in families, f"line {n}: family {m['name']} declared twice"
            current = m["name"]
            families[current] = {"type": None, "samples": []}
            continue
        if m := TYPE.match(line):
            assert m["name"] == current and families[current]["type"] is None, f"line {n}: TYPE out of place"
            families[current]["type"] = m["type"]
            continue
        m = SAMPLE.match(line)
        assert m, f"line {n} is not a valid sample: {line!r}"
        assert current is not None and families[current]["type"], f"line {n}: sample before HELP/TYPE"
        name, typ = m["name"], families[current]["type"]
        allowed = {current} if typ != "histogram" else {current + s for s in ("_bucket", "_sum", "_count")}
        assert name in allowed, f"line {n}: sample {name} outside its family {current}"
        labels = tuple(LABEL_PAIR.findall(m["labels"] or ""))
        assert len({k for k, _ in labels}) == len(labels), f"line {n}: repeated label"
        assert (name, labels) not in series, f"line {n}: duplicate series"
        series.add((name, labels))
        families[current]["samples"].append((name, dict(labels), float(m["value"].replace("Inf", "inf"))))
    for fam, data in families.items():
        assert data["type"], f"{fam} has no TYPE"
        if data["type"] == "counter":
            assert fam.endswith("_total"), fam
        if data["type"] == "histogram":
            _check_histogram(fam, data["samples"])
    return families


def _check_histogram(fam: str, samples: list) -> None:
    by_series: dict = {}
    for name, labels, value in samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        by_series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if name.endswith("_bucket"):
            by_series[key]["buckets"].append((float(labels["le"].replace("Inf", "inf")), value))
        elif name.endswith("_sum"):
            by_series[key]["sum"] = value
        else:
            by_series[key]["count"] = value
    for key, s in by_series.items():
        les = [le for le, _ in s["buckets"]]
        assert les == sorted(les) and les[-1] == math.inf, f"{fam}{key}: le not ascending to +Inf"
        counts = [c for _, c in s["buckets"]]
        assert counts == sorted(counts), f"{fam}{key}: buckets not cumulative"
        assert s["count"] == counts[-1] and s["sum"] is not None, f"{fam}{key}: _count != +Inf bucket"


def sample_metrics() -> Metrics:
    m = Metrics()
    m.inc("in:graph.events.v1", 5)
    m.inc("in:memory.candidates.v1")
    m.inc("out:graph.state.v1", 4)
    m.inc("decision:merge", 2)
    m.inc("dlq:decode/UnknownMagicByteError")
    m.inc("dlq:validate/memory.key_mismatch")
    m.inc("dlq:weird")  # no error class part
    m.inc("duplicate:graph.events.v1")
    m.inc("violation:event.session_mismatch")
    m.inc("negotiator:remember")
    m.inc("housekeeping:deleted", 3)
    m.inc('odd-family.x:a "quoted" \\ back\nslash')  # a family nobody declared, a nasty label
    for s in (0.0004, 0.003, 0.003, 0.2, 7.0):
        m.observe_latency("graph.events.v1", s)
    m.observe_latency("memory.candidates.v1", 0.01)
    return m


def health(status="ready") -> Health:
    return Health(status=status, reason="x", worker="h:1", url="http://h:1", recovery_in_progress=status == "recovering",
                  recovery_completed=status == "ready", active_remaining=7 if status == "recovering" else 0,
                  standby_remaining=2, rebalancing=False, sources=["a[0]", "b[1]"], active_partitions=3, standby_partitions=1)


class Fixed:
    """A collector of fixed worker families (what WorkerCollector.collect reads from Faust)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def full_text(status="ready") -> str:
    lags = [PartitionLag("graph.events.v1", 0, 10, 12), PartitionLag("graph.events.v1", 1, None, 3)]
    m = sample_metrics()
    m.registry.register(Fixed(worker_families(health(status), lags, {"graph-state": 4, "memory-nodes": 0},
                                              {"memtables": 2048, "block_cache": 0, "table_readers": 16})))
    return m.render().decode()


def test_exposition_is_strictly_valid_and_has_every_family():
    fams = strict_parse(full_text())
    assert {"memstream_in_total", "memstream_out_total", "memstream_decision_total", "memstream_dlq_total",
            "memstream_duplicate_total", "memstream_violation_total", "memstream_negotiator_total",
            "memstream_housekeeping_total", "memstream_processing_seconds", "memstream_consumer_lag",
            "memstream_consumer_committed_offset", "memstream_consumer_highwater", "memstream_table_keys",
            "memstream_recovery_in_progress", "memstream_recovery_active_remaining_offsets",
            "memstream_recovery_standby_remaining_offsets", "memstream_ready"} <= set(fams)
    samples = {(n, tuple(sorted(lb.items()))): v for f in fams.values() for n, lb, v in f["samples"]}
    assert samples[("memstream_in_total", (("topic", "graph.events.v1"),))] == 5
    assert samples[("memstream_dlq_total", (("error_class", "UnknownMagicByteError"), ("stage", "decode")))] == 1
    assert samples[("memstream_dlq_total", (("error_class", "memory.key_mismatch"), ("stage", "validate")))] == 1
    assert samples[("memstream_dlq_total", (("error_class", ""), ("stage", "weird")))] == 1
    assert samples[("memstream_decision_total", (("action", "merge"),))] == 2
    assert samples[("memstream_housekeeping_total", (("kind", "deleted"),))] == 3
    assert samples[("memstream_consumer_lag", (("partition", "0"), ("topic", "graph.events.v1")))] == 2
    # a partition whose committed offset is unknown has a highwater but no lag sample
    assert ("memstream_consumer_lag", (("partition", "1"), ("topic", "graph.events.v1"))) not in samples
    assert samples[("memstream_table_keys", (("table", "graph-state"),))] == 4
    assert samples[("memstream_rocksdb_memory_bytes", (("kind", "memtables"),))] == 2048
    assert samples[("memstream_python_allocated_blocks", ())] > 1000
    assert samples[("memstream_ready", ())] == 1
    # the undeclared family got a valid name and its label value survived escaping
    assert samples[("memstream_odd_family_x_total", (("label", 'a \\"quoted\\" \\\\ back\\nslash'),))] == 1


def test_latency_histogram_buckets_sum_and_count():
    fams = strict_parse(full_text())
    hist = [s for s in fams["memstream_processing_seconds"]["samples"] if s[1]["topic"] == "graph.events.v1"]
    buckets = {s[1]["le"]: s[2] for s in hist if s[0].endswith("_bucket")}
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert buckets["0.001"] == 1 and buckets["0.005"] == 3 and buckets["0.25"] == 4 and buckets["5.0"] == 4
    assert buckets["+Inf"] == 5
    (total,) = [s[2] for s in hist if s[0].endswith("_sum")]
    assert total == pytest.approx(0.0004 + 0.003 + 0.003 + 0.2 + 7.0)


def test_not_ready_worker_exposes_recovery():
    fams = strict_parse(full_text("recovering"))
    value = {f: fams[f]["samples"][0][2] for f in ("memstream_ready", "memstream_recovery_in_progress",
                                                   "memstream_recovery_active_remaining_offsets")}
    assert value == {"memstream_ready": 0, "memstream_recovery_in_progress": 1,
                     "memstream_recovery_active_remaining_offsets": 7}


def test_prometheus_client_parser_reads_it():
    parser = pytest.importorskip("prometheus_client.parser")
    fams = {f.name: f for f in parser.text_string_to_metric_families(full_text())}
    # prometheus_client names a counter family without its _total suffix
    assert fams["memstream_in"].type == "counter"
    assert {s.labels["topic"]: s.value for s in fams["memstream_in"].samples} == {
        "graph.events.v1": 5, "memory.candidates.v1": 1}
    assert fams["memstream_processing_seconds"].type == "histogram"
    count = [s for s in fams["memstream_processing_seconds"].samples
             if s.name == "memstream_processing_seconds_count" and s.labels["topic"] == "graph.events.v1"]
    assert count[0].value == 5
    odd = fams["memstream_odd_family_x"].samples[0]
    assert odd.labels["label"] == 'a "quoted" \\ back\nslash'  # escaping round-trips
    assert fams["memstream_consumer_lag"].type == "gauge"


def test_empty_metrics_still_render_valid_text():
    fams = strict_parse(Metrics().render().decode())
    assert fams["memstream_processing_seconds"]["samples"] == []
    assert fams["memstream_in_total"]["samples"] == []  # declared up front, counted on first use
    assert fams["memstream_memory_users_loaded"]["samples"] == [("memstream_memory_users_loaded", {}, 0)]


def test_no_created_series():
    text = full_text()
    assert "_created" not in text, "created timestamps are disabled (streams/runtime/metrics.py)"


def test_each_metrics_has_its_own_registry():
    """Several runtimes in one process (the tests run several apps): each counts only its own,
    and nothing lands in prometheus_client's global registry."""
    from prometheus_client import REGISTRY

    a, b = Metrics(), Metrics()
    a.inc("in:t", 3)
    b.inc("in:t")
    b.observe_latency("t", 0.01)
    a.flush()
    b.flush()
    assert a.registry.get_sample_value("memstream_in_total", {"topic": "t"}) == 3
    assert b.registry.get_sample_value("memstream_in_total", {"topic": "t"}) == 1
    assert a.registry.get_sample_value("memstream_processing_seconds_count", {"topic": "t"}) is None
    assert REGISTRY.get_sample_value("memstream_in_total", {"topic": "t"}) is None


def test_counters_mapping_reads_the_counters():
    m = sample_metrics()
    counters = m.counters
    assert counters["in"] == {"graph.events.v1": 5, "memory.candidates.v1": 1}
    assert counters["dlq"] == {"decode/UnknownMagicByteError": 1, "validate/memory.key_mismatch": 1, "weird/": 1}
    assert counters["violation"] == {"event.session_mismatch": 1}
    assert counters["erase"] == {}  # declared, never counted


def test_inc_label_reuses_the_labelled_child():
    m = Metrics()
    m.inc_label("in", "t")
    m.flush()
    child = m._children["in"]["t"]
    m.inc("in:t", 2)
    m.flush()
    assert m._children["in"]["t"] is child
    assert m.registry.get_sample_value("memstream_in_total", {"topic": "t"}) == 3


def test_the_event_loops_increments_reach_the_counters_at_the_next_flush_and_before_every_read():
    import threading

    m = Metrics()
    value = lambda: m.registry.get_sample_value("memstream_out_total", {"topic": "t"})  # noqa: E731
    m.inc_label("out", "t")
    m.inc("out:t", 2)
    assert value() is None  # noted, not yet counted (no lock taken per record)
    m.flush()
    assert value() == 3
    m.inc_label("out", "t")
    assert "memstream_out_total{topic=\"t\"} 4.0" in m.render().decode()  # a scrape flushes first
    m.inc_label("out", "t", 5)
    assert m.counters["out"] == {"t": 9}  # so does the dashboard's read

    def elsewhere() -> None:  # another thread counts at once, and cannot flush the loop's notes
        m.inc_label("out", "u", 2)
        m.inc_label("out", "t")
        m.flush()

    m.inc_label("out", "t", 10)
    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert m.registry.get_sample_value("memstream_out_total", {"topic": "u"}) == 2
    assert value() == 10  # 9 + the other thread's 1; the loop's 10 still noted
    m.flush()
    assert value() == 20


def test_worker_collector_describes_what_it_collects():
    described = {(f.name, f.type) for f in WorkerCollector(rt=None).describe()}
    collected = {(f.name, f.type) for f in worker_families(health(), [PartitionLag("t", 0, 1, 2)], {"x": 1})}
    assert described == collected
    assert all(not f.samples for f in WorkerCollector(rt=None).describe())


def test_names_are_sanitized():
    assert metric_name("a-b.c d") == "memstream_a_b_c_d"
    m = Metrics()
    m.inc("odd-family.x:v")
    m.flush()
    assert m.registry.get_sample_value("memstream_odd_family_x_total", {"label": "v"}) == 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b.c", "d"]),
                          st.one_of(st.sampled_from([0.0, *LATENCY_BUCKETS]),
                                    st.floats(0, 20, allow_nan=False), st.floats(-1, 0))), max_size=60))
def test_the_latency_histogram_exports_what_prometheus_clients_histogram_exports(observations):
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from streams.runtime.metrics import LatencyHistogram

    theirs_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    theirs = Histogram("memstream_processing_seconds", "h", ("topic",), buckets=LATENCY_BUCKETS,
                       registry=theirs_registry)
    ours = LatencyHistogram("memstream_processing_seconds", "h", LATENCY_BUCKETS)
    ours_registry.register(ours)
    for topic, seconds in observations:
        theirs.labels(topic).observe(seconds)
        ours.observe(topic, seconds)
    # the same lines, in any order of series (sums compared as floats: added in the same order)
    assert sorted(generate_latest(ours_registry).splitlines()) == sorted(generate_latest(theirs_registry).splitlines())
