"""Dead letters are bounded: they always fit the broker's message limit (streams/contracts/deadletter.py)."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from streams.contracts import deadletter
from streams.contracts.schemas import default as schema_set
from streams.contracts.wire import CodecFactory

BROKER_LIMIT = 1_048_588  # Kafka's default message.max.bytes


def _letter(key: bytes | None, value: bytes | None, reason: str = "why", **limits) -> dict:
    origin = deadletter.Origin("memory.candidates.v1", 3, 17, key, value)
    return deadletter.dead_letter(origin, stage="validate", reason=reason, error_class="E", failed_at=1, **limits)


def _encoded_size(record: dict) -> int:
    codec = CodecFactory(None, schema_set()).codec("dead_letter")
    headers = deadletter.connect_headers(record)
    return len(codec.encode(record)) + sum(len(k) + len(v) for k, v in headers) + len(record["original_key"] or b"")


def test_a_small_record_is_copied_verbatim():
    d = _letter(b"alice", b"\x00value")
    assert d["original_key"] == b"alice" and d["original_value"] == b"\x00value"
    assert d["original_size"] is None and d["original_sha256"] is None


def test_a_value_over_the_copy_limit_is_referenced_by_size_and_sha256():
    value = b"v" * 1001
    d = _letter(b"alice", value, max_copy_bytes=1000)
    assert d["original_value"] is None and d["original_key"] == b"alice"
    assert d["original_size"] == 1001 and d["original_sha256"] == hashlib.sha256(value).hexdigest()
    assert d["reason"].startswith("[value of 1001 bytes not copied: over MEMSTREAM_DLQ_MAX_COPY_BYTES] why")
    # at the limit (key + value) it is still copied
    assert _letter(b"alice", b"v" * 990, max_copy_bytes=1000)["original_value"] == b"v" * 990  # 2 x 5 + 990


def test_a_key_over_the_copy_limit_is_dropped_and_named_by_its_hash():
    key = b"k" * 501
    d = _letter(key, b"v", max_copy_bytes=1000)
    assert d["original_key"] is None and d["original_value"] is None
    assert hashlib.sha256(key).hexdigest() in d["reason"]


def test_the_reason_and_its_header_are_cut_to_the_limit_saying_so():
    d = _letter(b"k", b"v", reason="x" * 5000, max_reason_chars=300)
    assert len(d["reason"]) == 300 and d["reason"].endswith("more characters)")
    header = dict(deadletter.connect_headers(d))["__connect.errors.exception.message"]
    assert header.decode() == d["reason"]
    assert len(_letter(b"k", b"v", reason="x" * 300, max_reason_chars=300)["reason"]) == 300  # at the limit: kept


@given(key=st.one_of(st.none(), st.binary(max_size=4000)), value=st.one_of(st.none(), st.binary(max_size=4000)),
       reason=st.text(max_size=3000), error_class=st.text(max_size=500))
def test_any_dead_letter_fits_within_its_limits(key, value, reason, error_class):
    d = _letter(key, value, reason, max_copy_bytes=1000, max_reason_chars=400)
    d = {**d, "error_class": deadletter._cut(error_class, 200)}
    assert 2 * len(d["original_key"] or b"") + len(d["original_value"] or b"") <= 1000
    assert len(d["reason"]) <= 400 and len(d["error_class"]) <= 200
    if value is not None and d["original_value"] is None:
        assert d["original_size"] == len(value)


def test_the_defaults_keep_a_dead_letter_of_a_huge_record_under_the_broker_limit():
    huge_key, huge_value = "k" * 400_000, b"\x00" + b"v" * 1_000_000
    d = _letter(huge_key.encode(), huge_value, reason=f"key {huge_key!r} differs from {huge_key!r}")
    assert _encoded_size(d) < BROKER_LIMIT // 2
