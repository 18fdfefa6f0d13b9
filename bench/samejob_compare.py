"""Proof that the same-job Quix Streams peer (bench/quix_samejob.py) did memstream's job: both
systems' output records of one input, compared per topic as multisets of (key, decoded value).

    comparison = compare(settings, ours, theirs, prefix)   # ours / theirs: (start, end) offsets
    for line in comparison.lines(): print(line)
    comparison.equal                                      # False: the bench prints no ratio

The compared topics are the memory agent's outputs that the peer writes (`COMPARED`): ledger,
relay, node rows and tombstones, quarantine, negotiator replies and dead letters (analytics, which
the peer leaves out, and the erasure topics, which this input never reaches, are not). memstream's
are read from the catalog topics between two snapshots of their end offsets, the peer's from
`<prefix><topic>`. A value is decoded with memstream's codec and compared as canonical JSON; a
tombstone is None. Two fields of a dead letter say when and where it was written rather than what:
`failed_at` (the wall clock) and `worker`; they are blanked on both sides before the comparison.
Nothing else is: every id, clock, node row and reason must be the same.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from confluent_kafka import TopicPartition

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory
from streams.settings import Settings
from streams.tools import kafkatools

#: what the peer reads: the memory agent's inputs but memory.erase-requests.v1 (bench/quix_samejob.py)
INPUTS = (catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS, catalog.MEMORY_TURNS, catalog.NEGOTIATOR_REQUESTS)
#: what both write and the comparison reads
COMPARED = (catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.MEMORY_NODES, catalog.MEMORY_QUARANTINE,
            catalog.NEGOTIATOR_REPLIES, catalog.DLQ)
#: the fields of a dead letter that say when and by whom it was written
UNCOMPARED_DLQ_FIELDS = {"failed_at": 0, "worker": None}
SAMPLES = 5  #: differing records shown per topic

Offsets = kafkatools.Offsets
Key = tuple[bytes | None, bytes]  #: (key, canonical JSON of the decoded value)


@dataclass
class Read:
    """The records of a topic's offset range, in order per partition, and whether offsets were
    missing inside it (the broker compacted the range: older values of a key are gone)."""

    records: list[tuple[bytes | None, bytes | None]]
    compacted: bool = False


def read_range(settings: Settings, topic: str, start: Offsets, end: Offsets, timeout: float = 120) -> Read:
    """(key, value) of every record of `topic` from `start` to `end` (offsets of the topic's partitions)."""
    todo = {p: end[(t, p)] for (t, p) in end if t == topic and end[(t, p)] > start.get((t, p), 0)}
    if not todo:
        return Read([])
    c = kafkatools.consumer(settings, "memstream-bench-samejob-reader")
    read = Read([])
    expected = {p: start.get((topic, p), 0) for p in todo}
    try:
        c.assign([TopicPartition(topic, p, start.get((topic, p), 0)) for p in todo])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read {topic} up to {todo} within {timeout:.0f}s")
            for msg in c.consume(1000, 0.5):
                if msg.error() or msg.partition() not in todo:
                    continue
                if msg.offset() < todo[msg.partition()]:
                    read.records.append((msg.key(), msg.value()))
                    read.compacted |= msg.offset() != expected[msg.partition()]
                    expected[msg.partition()] = msg.offset() + 1
                if msg.offset() + 1 >= todo[msg.partition()]:
                    read.compacted |= msg.offset() + 1 < todo[msg.partition()]
                    del todo[msg.partition()]
    finally:
        c.close()
    return read


def latest_per_key(records: list[tuple[bytes | None, bytes | None]]) -> list[tuple[bytes | None, bytes | None]]:
    """The compacted view of records read in order per partition: each key's last value (a
    key's records all sit in one partition, so the last one read is the latest)."""
    return list({key: (key, value) for key, value in records}.values())


def canonical(topic: str, value: dict | None) -> bytes:
    """A decoded value as comparable bytes: sorted keys, bytes as hex; a dead letter's time and
    worker blanked."""
    if value is not None and topic == catalog.DLQ:
        value = {**value, **UNCOMPARED_DLQ_FIELDS}
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=_hex)


def _hex(value: object) -> str:
    """Bytes (a dead letter's original key and value) as hex in the canonical form."""
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} in a decoded record")


def multiset(codecs: CodecFactory, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> Counter[Key]:
    decode = codecs.codec(catalog.topic(topic).value_schema).decode
    return Counter((key, canonical(topic, None if value is None else decode(value))) for key, value in records)


@dataclass
class TopicComparison:
    topic: str
    memstream: int
    peer: int
    only_memstream: list[Key] = field(default_factory=list)  #: records (with repeats) the peer lacks
    only_peer: list[Key] = field(default_factory=list)  #: records memstream lacks
    #: the broker compacted memstream's range of this (compacted) topic while the bench ran: the
    #: latest value per key was compared on both sides, not every record
    compacted: bool = False

    @property
    def equal(self) -> bool:
        return not self.only_memstream and not self.only_peer

    def line(self) -> str:
        verdict = "equal" if self.equal else (f"DIFFER: {len(self.only_memstream):,} only in memstream's, "
                                               f"{len(self.only_peer):,} only in the peer's")
        view = " (compacted by the broker meanwhile: the latest value of each key compared)" if self.compacted else ""
        return f"{self.topic}: memstream {self.memstream:,} records, Quix same-job peer {self.peer:,}{view}: {verdict}"


@dataclass
class Comparison:
    topics: list[TopicComparison]

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.topics)

    @property
    def records(self) -> int:
        return sum(t.memstream for t in self.topics)

    def summary(self) -> str:
        if self.equal:
            return (f"equal: memstream and the Quix same-job peer wrote the same {self.records:,} records "
                    f"(key, decoded value) on {len(self.topics)} topics")
        differ = [t.topic for t in self.topics if not t.equal]
        return f"NOT EQUAL on {', '.join(differ)}: no ratio is printed for the same-job peer"

    def lines(self) -> list[str]:
        return [t.line() for t in self.topics] + [self.summary()]

    def write_differences(self, path: Path) -> None:
        """The differing records of every topic (at most `SAMPLES` each way), as JSON lines."""
        with path.open("w") as f:
            for t in self.topics:
                for side, keys in (("memstream only", t.only_memstream), ("peer only", t.only_peer)):
                    for key, value in keys[:SAMPLES]:
                        f.write(json.dumps({"topic": t.topic, "side": side, "key": None if key is None else
                                            key.decode(errors="replace"), "value": json.loads(value)}) + "\n")


def compare(settings: Settings, ours: tuple[Offsets, Offsets], theirs: tuple[Offsets, Offsets], prefix: str,
            topics: tuple[str, ...] = COMPARED) -> Comparison:
    """memstream's records of `topics` between the offsets `ours` against the peer's of
    `<prefix><topic>` between `theirs`, each topic as a multiset of (key, decoded value). A
    catalog topic that the broker compacted inside memstream's range (its offsets have holes:
    memory.nodes.v1 rolls a segment every few rounds of the bench, and the cleaner then drops a
    node's older rows) is compared as its compacted view on both sides: the latest value per key."""
    codecs = CodecFactory.from_url(settings.registry_url)
    result = []
    for topic in topics:
        ours_read, theirs_read = read_range(settings, topic, *ours), read_range(settings, f"{prefix}{topic}", *theirs)
        compacted = ours_read.compacted and "compact" in catalog.topic(topic).cleanup_policy
        views = [latest_per_key(r.records) if compacted else r.records for r in (ours_read, theirs_read)]
        mine, peer = (multiset(codecs, topic, v) for v in views)
        result.append(TopicComparison(topic, sum(mine.values()), sum(peer.values()),
                                      sorted((mine - peer).elements(), key=repr),
                                      sorted((peer - mine).elements(), key=repr), compacted))
    return Comparison(result)
