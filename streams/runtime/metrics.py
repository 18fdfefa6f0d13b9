"""Process metrics of one worker (counters and a latency histogram), kept in memory, and their
Prometheus text exposition (format 0.0.4).

The Runtime calls `inc("family:label")` and `observe_latency(topic, seconds)`. `render()` turns
them, plus the gauges the `/metrics` view reads from Faust at scrape time (consumer lag, table
sizes, recovery), into the text Prometheus scrapes:

- every counter family `F` becomes `memstream_F_total` with one label; its label name comes from
  `FAMILY_LABELS` (`in`/`out`/`duplicate` → `topic`, `decision` → `action`, `violation` → `rule`,
  `negotiator` → `op`, `housekeeping` → `kind`); `dlq` labels `stage/error_class` become the two
  labels `stage` and `error_class`; a family not listed gets the label `label`;
- the processing latency is the histogram `memstream_processing_seconds{topic}` (`_bucket{le}`,
  `_sum`, `_count`).

Pure: no Faust, no Kafka (tests/runtime/test_metrics.py parses the output).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

PREFIX = "memstream"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# counter family -> (label names, help). A `rt.count("family:label")` family not listed here is
# still exported, with the label name `label`.
FAMILY_LABELS: dict[str, tuple[tuple[str, ...], str]] = {
    "in": (("topic",), "Input records received, by input topic."),
    "out": (("topic",), "Records sent, by output topic."),
    "decision": (("action",), "Consolidation decisions, by action."),
    "dlq": (("stage", "error_class"), "Records sent to pipeline.dlq.v1, by stage and error class."),
    "duplicate": (("topic",), "Redelivered or duplicate input records dropped, by input topic."),
    "violation": (("rule",), "Session lifecycle violations, by rule."),
    "negotiator": (("op",), "Negotiator requests handled, by op."),
    "housekeeping": (("kind",), "Housekeeping actions (e.g. expired nodes deleted), by kind."),
    "memory_users": (("event",), "Users' memory state read from the memory-state table (`loaded`) and dropped from the bounded LRU (`evicted`)."),
}

GAUGE_HELP: dict[str, str] = {
    "memory_users_contained": "Users whose memory state could not be rebuilt on this worker (records dead-lettered, queries 503), among the users read since the last rebalance (a user is read on first touch).",
    "memory_foreign_rows": "memory-state rows skipped because their owner differs from their key, among the users read since the last rebalance.",
    "memory_users_loaded": "Users whose memory state this worker holds loaded (the LRU bounded by MEMSTREAM_LOADED_NODES_MAX).",
    "memory_nodes_loaded": "Nodes (+1 per user) of the loaded users, the figure bounded by MEMSTREAM_LOADED_NODES_MAX (pinned users of the running batch may exceed it).",
}

_NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_OK = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.latency: dict[str, list[int]] = {}  # topic -> cumulative bucket counts (+Inf last)
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.gauges: dict[str, float] = {}

    def set_gauge(self, name: str, value: float) -> None:
        """A value that is set, not counted (exported as the gauge `memstream_<name>`)."""
        self.gauges[name] = value

    def inc(self, name: str, n: int = 1) -> None:
        family, _, label = name.partition(":")
        self.counters[family][label] += n

    def inc_label(self, family: str, label: str, n: int = 1) -> None:
        """`inc(f"{family}:{label}", n)` without building and splitting the name (per record)."""
        self.counters[family][label] += n

    def observe_latency(self, topic: str, seconds: float) -> None:
        buckets = self.latency.setdefault(topic, [0] * (len(LATENCY_BUCKETS) + 1))
        for i, upper in enumerate(LATENCY_BUCKETS):
            if seconds <= upper:
                buckets[i] += 1
        buckets[-1] += 1
        self.latency_sum[topic] += seconds

    def families(self) -> list["Family"]:
        """The counters and the latency histogram as exposition families."""
        out = []
        for family in sorted(self.counters):
            labels_of = self.counters[family]
            names, help_text = FAMILY_LABELS.get(family, (("label",), f"Events counted as {family!r}, by label."))
            fam = Family(metric_name(f"{family}_total"), "counter", help_text)
            for label in sorted(labels_of):
                fam.add(dict(zip(names, _split_label(label, len(names)), strict=True)), labels_of[label])
            out.append(fam)
        hist = Family(metric_name("processing_seconds"), "histogram",
                      "Seconds a handler took to apply one decoded input record, by input topic.")
        for topic in sorted(self.latency):
            counts = self.latency[topic]
            for upper, count in zip((*LATENCY_BUCKETS, math.inf), counts, strict=True):
                hist.add({"topic": topic, "le": format_value(upper)}, count, suffix="_bucket")
            hist.add({"topic": topic}, self.latency_sum[topic], suffix="_sum")
            hist.add({"topic": topic}, counts[-1], suffix="_count")
        out.append(hist)
        for name in sorted(self.gauges):
            out.append(Family(metric_name(name), "gauge", GAUGE_HELP.get(name, f"Gauge {name!r}.")).add({}, self.gauges[name]))
        return out

    def render(self, extra: Iterable["Family"] = ()) -> str:
        return render([*self.families(), *extra])


def _split_label(label: str, n: int) -> list[str]:
    if n == 1:
        return [label]
    parts = label.split("/", n - 1)
    return parts + [""] * (n - len(parts))


# --------------------------------------------------------------------------- exposition


@dataclass
class Family:
    """One metric family: HELP, TYPE and its samples (suffix, labels, value)."""

    name: str
    type: str  # counter | gauge | histogram | untyped
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: Mapping[str, object], value: float, suffix: str = "") -> "Family":
        self.samples.append((suffix, {k: str(v) for k, v in labels.items()}, value))
        return self


def metric_name(name: str) -> str:
    """`memstream_<name>` with every character Prometheus does not allow replaced by `_`."""
    out = f"{PREFIX}_{_BAD_NAME_CHARS.sub('_', name)}"
    assert _NAME_OK.match(out), out
    return out


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    for name in labels:
        if not _LABEL_OK.match(name) or name.startswith("__"):
            raise ValueError(f"invalid label name {name!r}")
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items()) + "}"


def render(families: Sequence[Family]) -> str:
    """Prometheus text format 0.0.4: per family `# HELP`, `# TYPE`, then its samples."""
    lines: list[str] = []
    seen: set[str] = set()
    for fam in families:
        if fam.name in seen:
            raise ValueError(f"metric family {fam.name} rendered twice")
        seen.add(fam.name)
        lines.append(f"# HELP {fam.name} {escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for suffix, labels, value in fam.samples:
            lines.append(f"{fam.name}{suffix}{_labels(labels)} {format_value(value)}")
    return "\n".join(lines) + "\n"
