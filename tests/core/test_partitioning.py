"""The partition rule (streams/core/partitioning.py): Kafka's murmur2, and a record on another
partition refused with a reason naming the partitioner (issue 15)."""

from __future__ import annotations

import zlib

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from streams.core.partitioning import (
    PARTITION_MEMO_KEY_BYTES,
    PARTITION_MEMO_KEYS,
    WRONG_PARTITION,
    misrouted,
    murmur2,
    partition_for,
    remembered_partition,
)


def test_murmur2_matches_the_java_clients_test_vectors():
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    assert {k: murmur2(k) for k in cases} == cases


@given(st.binary(max_size=200))
def test_murmur2_equals_the_kafka_client_the_workers_use(data):
    assert murmur2(data) & 0xFFFFFFFF == aiokafka_murmur2(data)  # aiokafka answers it unsigned


@given(st.text(min_size=1, max_size=60), st.integers(1, 64))
def test_a_record_on_its_murmur2_partition_passes(key, partitions):
    raw = key.encode()
    assert misrouted("memory.events.v1", raw, partition_for(raw, partitions), partitions) is None


@given(st.text(min_size=1, max_size=60), st.integers(2, 64), st.integers(1, 63))
def test_a_record_on_any_other_partition_is_refused_naming_murmur2_and_the_partition(key, partitions, shift):
    raw = key.encode()
    expected = partition_for(raw, partitions)
    wrong = (expected + 1 + shift % (partitions - 1)) % partitions
    rej = misrouted("memory.events.v1", raw, wrong, partitions)
    assert rej is not None and rej.code == WRONG_PARTITION and rej.dead_letter
    assert f"partition {wrong} of memory.events.v1" in rej.detail
    assert f"belongs on partition {expected}" in rej.detail and "murmur2" in rej.detail
    assert "murmur2_random" in rej.detail


def test_librdkafkas_default_partitioner_is_caught():
    """consistent_random = CRC32 of the key modulo the partitions; for most keys it differs."""
    keys = [f"mb-user-{i}".encode() for i in range(200)]
    differ = [k for k in keys if zlib.crc32(k) % 6 != partition_for(k, 6)]
    assert len(differ) > 100
    for k in differ:
        rej = misrouted("memory.candidates.v1", k, zlib.crc32(k) % 6, 6)
        assert rej is not None and "consistent_random" in rej.detail


def test_a_record_without_a_key_is_left_to_the_id_rules():
    assert misrouted("memory.events.v1", None, 3, 6) is None
    assert misrouted("memory.events.v1", b"", 3, 6) is None


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=50), st.integers(1, 1024))
def test_the_remembered_partition_is_the_one_murmur2_gives(keys, partitions):
    for key in keys + keys:  # asked twice: the second answer comes from the memo
        assert partition_for(key, partitions) == (murmur2(key) & 0x7FFFFFFF) % partitions


def test_the_partition_memo_is_bounded():
    remembered_partition.cache_clear()
    for i in range(PARTITION_MEMO_KEYS + 1000):
        partition_for(f"user-{i}".encode(), 12)
    info = remembered_partition.cache_info()
    assert info.maxsize == PARTITION_MEMO_KEYS and info.currsize == PARTITION_MEMO_KEYS


def test_a_key_over_the_memo_bound_is_answered_and_not_held():
    """A producer's huge keys reach the door's check before any validation: answered, never kept."""
    remembered_partition.cache_clear()
    for size in (PARTITION_MEMO_KEY_BYTES + 1, 1_000_000):
        key = b"k" * size
        assert partition_for(key, 12) == (murmur2(key) & 0x7FFFFFFF) % 12
    edge = b"e" * PARTITION_MEMO_KEY_BYTES
    assert partition_for(edge, 12) == (murmur2(edge) & 0x7FFFFFFF) % 12
    assert remembered_partition.cache_info().currsize == 1  # only the key at the bound
