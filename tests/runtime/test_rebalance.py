"""The stale-fetch rule (defect 4) and the already-read rule (defect 6) of the rebalance-safe
consumer (streams/runtime/rebalance.py).

The Kafka behaviour (records fetched before a rebalance handed to the streams after the seek)
is exercised by the fault suite (tests/system/test_faults_kafka.py: workers added, removed,
killed mid-stream), which compares every output with a single worker's; these tests pin the
rules that decide which fetched records are dropped and fetched again, and for which partitions
Faust's read offset is moved back so that no fetched record is dropped as already read."""

from __future__ import annotations

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.rebalance import dropped_as_read, stale_partitions

P0, P1, P2 = (TP("memory.candidates.v1", p) for p in range(3))


def test_records_past_the_sought_offset_are_stale():
    # sought back to 392 (the committed offset) while a fetch of 442.. from before was under way
    assert stale_partitions({P1: 442}, {P1: 392}) == {P1}


def test_records_starting_where_the_partition_was_sought_are_kept():
    assert stale_partitions({P0: 484, P1: 392}, {P0: 484, P1: 392}) == set()


def test_records_behind_the_sought_offset_are_stale_too():
    # a seek forward (never done by memstream, but the rule does not assume it)
    assert stale_partitions({P1: 10}, {P1: 392}) == {P1}


def test_a_partition_never_sought_is_kept():
    assert stale_partitions({P2: 7}, {P1: 392}) == set()


@given(st.dictionaries(st.integers(0, 5), st.integers(0, 1000)), st.dictionaries(st.integers(0, 5), st.integers(0, 1000)))
def test_stale_exactly_when_expected_and_different(first, expected):
    firsts = {TP("t", p): o for p, o in first.items()}
    expects = {TP("t", p): o for p, o in expected.items()}
    stale = stale_partitions(firsts, expects)
    assert stale <= firsts.keys() & expects.keys()
    for tp in firsts.keys() & expects.keys():
        assert (tp in stale) == (firsts[tp] != expects[tp])


def test_records_below_the_read_offset_would_be_dropped():
    # sought back to 1616 (committed), then a record fetched before the seek was delivered: 1688
    assert dropped_as_read({P0: 1616}, {P0: 1688}) == {P0}


def test_a_fetch_starting_at_or_past_the_read_offset_is_delivered():
    # at: right after a seek (the read offset is the sought offset); past: after a delivered record
    assert dropped_as_read({P0: 1616, P1: 443}, {P0: 1616, P1: 442}) == set()


def test_no_read_offset_drops_nothing():
    # Faust stores None for "nothing read" (a fresh partition, a seek to 0, a revoked partition)
    assert dropped_as_read({P0: 0, P1: 5}, {P0: None}) == set()


@given(st.dictionaries(st.integers(0, 5), st.integers(0, 1000)),
       st.dictionaries(st.integers(0, 5), st.none() | st.integers(0, 1000)))
def test_dropped_exactly_when_the_first_record_lies_below_the_read_offset(first, read):
    firsts = {TP("t", p): o for p, o in first.items()}
    reads = {TP("t", p): o for p, o in read.items()}
    behind = dropped_as_read(firsts, reads)
    assert behind <= firsts.keys()
    for tp, offset in firsts.items():
        r = reads.get(tp)
        assert (tp in behind) == (r is not None and offset < r)
