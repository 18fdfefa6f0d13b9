"""The stale-fetch rule of the rebalance-safe consumer (streams/runtime/rebalance.py, defect 4).

The Kafka behaviour (records fetched before a rebalance handed to the streams after the seek)
is exercised by the fault suite (tests/system/test_faults_kafka.py: workers added, removed,
killed mid-stream), which compares every output with a single worker's; these tests pin the
rule that decides which fetched records are dropped and fetched again."""

from __future__ import annotations

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.rebalance import stale_partitions

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
