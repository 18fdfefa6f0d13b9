"""Which partition a key belongs on, and the rule for a record that is not there.

Every memstream input topic is partitioned by **murmur2 of the UTF-8 key bytes, modulo the
partition count** (Kafka's Java client default; `(murmur2(key) & 0x7fffffff) % partitions`).
All of a user's rows (memory state, negotiator memories, relay policy, analytics) live in the
changelog partition of that number, and the HTTP API routes a user's requests to its owner by
the same number. A record that a producer put on another partition (librdkafka's default
partitioner, `consistent_random`, hashes with CRC32) would be processed against the wrong
partition's state: its rows would land in another changelog partition, where a later deletion
or erasure of the user never looks (issue 15). So such a record is refused at the door
(:func:`misrouted`: a dead letter `wrong_partition` naming the partitioner and the expected
partition) instead of being applied; see README, "How a producer must partition".

Pure: no Kafka client is imported; :func:`murmur2` is Kafka's algorithm, written out.
"""

from __future__ import annotations

from functools import lru_cache

from .ingest import Rejection

WRONG_PARTITION = "wrong_partition"
#: the keys whose partition `partition_for` remembers (least recently used out): a worker meets the
#: same users' keys again and again, and murmur2 written out in Python costs 6-15 µs a key, a few
#: per record (the door's check, the analytics subjects, routing); ~100 bytes a key, ~7 MiB in all
PARTITION_MEMO_KEYS = 65_536
#: only keys up to this many bytes are remembered (ids are at most MEMSTREAM_MAX_ID_CHARS, 128 by
#: default): the check at the door runs before any validation, so a producer's huge keys (up to the
#: broker's record size each) would otherwise be held by the memo, 65,536 of them
PARTITION_MEMO_KEY_BYTES = 512

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) of `data`, as a signed 32-bit int (the Java client's
    `Utils.murmur2`)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - (length & 3)
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of `key` (its UTF-8 bytes) among `partitions`: murmur2, positive, modulo
    (remembered for the last `PARTITION_MEMO_KEYS` keys of at most `PARTITION_MEMO_KEY_BYTES`:
    the same answer, computed once)."""
    if len(key) > PARTITION_MEMO_KEY_BYTES:
        return _partition(key, partitions)
    return remembered_partition(key, partitions)


def _partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


remembered_partition = lru_cache(maxsize=PARTITION_MEMO_KEYS)(_partition)


def misrouted(topic: str, key: bytes | None, partition: int, partitions: int) -> Rejection | None:
    """A `wrong_partition` Rejection when a keyed record is not on `partition_for(key)`, else
    None. A record without a key (None or empty) is not judged here: no partitioner can place
    it, and the agents refuse it for its missing id."""
    if not key:
        return None
    expected = partition_for(key, partitions)
    if expected == partition:
        return None
    return Rejection(
        WRONG_PARTITION,
        f"record is on partition {partition} of {topic}, but its key belongs on partition {expected}: "
        f"murmur2 of the UTF-8 key modulo {partitions} (Kafka's default partitioner). The producer uses "
        "another partitioner (librdkafka's default `consistent_random` hashes with CRC32): set "
        "partitioner=murmur2_random (librdkafka clients) or use kafkajs' default partitioner, then "
        "replay this record (`memstream dlq replay`)",
        dead_letter=True,
    )
