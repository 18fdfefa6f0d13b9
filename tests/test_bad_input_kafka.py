"""Bad input at volume: thousands of malformed records of every kind mixed into a valid stream.
The worker keeps running, every malformed record is on the dead-letter topic with its reason, and
every valid record is applied."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from streams import catalog
from streams.wire import CodecFactory, WireFormat

from .kafka_util import candidate, codecs, consume, produce, worker

pytestmark = pytest.mark.kafka

BAD_PER_KIND = 500  # x 6 kinds = 3,000 malformed records (issue #8 asks for 10,000 in its suite)


def test_malformed_records_of_every_kind_are_dead_lettered_and_valid_ones_applied(stack, unique):
    rng = random.Random(5)
    now = int(time.time() * 1000)
    users = [f"mb-bad-{unique}-{i}" for i in range(8)]
    enc = codecs(stack).codec("candidate_memory")
    single_object = CodecFactory.from_url("").codec("candidate_memory")
    good, bad = [], []
    for i in range(400):
        u = users[i % len(users)]
        good.append((u, enc.encode(candidate(u, f"{unique}-ok-{i}", now + i, f"Fact {i}: {rng.random():.12f} {u}"))))
    # single-object encoding (no registry) is valid input too
    for i in range(100):
        u = users[i % len(users)]
        good.append((u, single_object.encode(candidate(u, f"{unique}-so-{i}", now + i, f"SO fact {i} {rng.random()}"),
                                             WireFormat.SINGLE_OBJECT)))
    valid_bytes = enc.encode(candidate(users[0], "x", now, "x"))
    for i in range(BAD_PER_KIND):
        u = users[i % len(users)]
        bad.append(("json", u, b'{"candidate_id": "%d"}' % i))
        noise = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 60)))
        bad.append(("random", u, noise if noise[0] != 0xC3 else b"\x01" + noise[1:]))  # never a valid magic
        bad.append(("truncated", u, valid_bytes[: rng.randrange(1, len(valid_bytes) - 1)]))
        bad.append(("unknown-schema-id", u, b"\x00\x7f\xff\xff\xf0" + valid_bytes[5:]))
        bad.append(("no-sensitivity", u, enc.encode(candidate(u, f"{unique}-nos-{i}", now, "no sensitivity", None))))
        bad.append(("key-mismatch", u, enc.encode(candidate(users[(i + 1) % len(users)], f"{unique}-km-{i}", now, "k"))))
    mixed = [(k, v) for k, v in good] + [(u, v) for _kind, u, v in bad]
    rng.shuffle(mixed)

    env = {"MEMSTREAM_APP_ID": f"it-bad-{unique}"}
    with worker(stack, f"bad-{unique}", env=env) as proc:
        produce(stack, catalog.MEMORY_CANDIDATES, mixed)
        letters = consume(stack, catalog.DLQ, lambda out: sum(
            1 for m in out if m["key"].decode(errors="replace") in users) >= len(bad), timeout=240)
        ledger = consume(stack, catalog.MEMORY_LEDGER, lambda out: sum(
            1 for m in out if m["key"] in users and m["value"]["event_type"] == "memory_consolidated") >= len(good),
            timeout=240)
        assert proc.poll() is None, "the worker kept running"
    mine = [m["value"] for m in letters if m["key"].decode(errors="replace") in users]
    assert len(mine) == len(bad)  # every malformed record, exactly once
    assert all(d["reason"] and d["stage"] in ("decode", "validate") for d in mine)
    by_class = Counter(d["error_class"] for d in mine)
    assert by_class["missing_sensitivity"] == BAD_PER_KIND
    assert by_class["memory.key_mismatch"] == BAD_PER_KIND
    assert by_class["UnknownSchemaIdError"] == BAD_PER_KIND
    assert by_class["UnknownMagicByteError"] == 2 * BAD_PER_KIND  # JSON and random bytes
    assert by_class["TruncatedMessageError"] + by_class["MalformedBodyError"] == BAD_PER_KIND
    sent = {v for _k, v in mixed}
    assert {d["original_value"] for d in mine} <= sent  # the original bytes, untouched
    consolidated = [m["value"] for m in ledger if m["key"] in users and m["value"]["event_type"] == "memory_consolidated"]
    assert len(consolidated) == len(good)  # every valid candidate got a decision
