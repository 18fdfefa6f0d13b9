"""The same-job comparison's compacted view (bench/samejob_compare.py): when the broker compacted
memstream's range of a compacted topic, each side's latest value per key is compared."""

from __future__ import annotations

from bench.samejob_compare import TopicComparison, latest_per_key


def test_the_compacted_view_keeps_each_keys_last_value_tombstones_included():
    records = [(b"u/1", b"v1"), (b"u/2", b"a"), (b"u/1", b"v2"), (b"u/3", b"x"), (b"u/3", None), (None, b"n")]
    assert latest_per_key(records) == [(b"u/1", b"v2"), (b"u/2", b"a"), (b"u/3", None), (None, b"n")]
    # what the cleaner leaves of the same log (a key's older values gone) reads the same
    cleaned = [(b"u/2", b"a"), (b"u/1", b"v2"), (b"u/3", None), (None, b"n")]
    assert set(latest_per_key(cleaned)) == set(latest_per_key(records))


def test_a_compacted_comparison_says_so():
    line = TopicComparison("memory.nodes.v1", 10, 10, compacted=True).line()
    assert "compacted by the broker meanwhile" in line and line.endswith(": equal")
    assert "compacted" not in TopicComparison("memory.nodes.v1", 10, 10).line()
