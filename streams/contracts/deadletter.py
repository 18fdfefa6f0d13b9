"""Dead letters: what the pipeline could not accept, with where it came from and why.

Pure: builds the `memstream.pipeline.DeadLetter` record and the Kafka Connect style
`__connect.errors.*` headers that carry the same facts, so standard Connect tooling can read them.
The record keeps the original key and value bytes untouched, so `dlq replay` can resend them.

A dead letter always fits the broker's message limit (~1 MB by default): the reason and the
header that repeats it are cut to ``max_reason_chars``, and an original too large to copy
(the key, which rides twice, and the value over ``max_copy_bytes``) is *referenced* instead: ``original_value`` is null and
``original_size`` / ``original_sha256`` name the bytes, which stay at
``original_topic``/``original_partition``/``original_offset`` for the input's retention.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# Stages, named after where in the pipeline the record was refused.
STAGE_DECODE = "decode"  # bytes are not a record of the topic's schema
STAGE_VALIDATE = "validate"  # a record, but it breaks a rule of the spec (e.g. missing sensitivity)
STAGE_APPLY = "apply"  # valid, but applying it failed (e.g. a lifecycle violation, a bug)
STAGE_SHIP = "ship"  # the graph-log shipper could not parse a line

#: Defaults of MEMSTREAM_DLQ_MAX_COPY_BYTES and MEMSTREAM_DLQ_MAX_REASON_CHARS.
MAX_COPY_BYTES = 512 * 1024
MAX_REASON_CHARS = 2000


@dataclass(frozen=True)
class Origin:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def dead_letter(origin: Origin, *, stage: str, reason: str, error_class: str, failed_at: int,
                worker: str | None = None, max_copy_bytes: int = MAX_COPY_BYTES,
                max_reason_chars: int = MAX_REASON_CHARS) -> dict:
    """The DeadLetter record (field names as schemas/dead_letter.avsc), bounded in size."""
    key, value = origin.key, origin.value
    size = sha256 = None
    # the key rides twice: as the dead letter's message key and in `original_key`
    if 2 * len(key or b"") + len(value or b"") > max_copy_bytes:
        if value is not None:
            size, sha256 = len(value), hashlib.sha256(value).hexdigest()
            reason = f"[value of {len(value)} bytes not copied: over MEMSTREAM_DLQ_MAX_COPY_BYTES] {reason}"
            value = None
        if 2 * len(key or b"") > max_copy_bytes:
            reason = (f"[key of {len(key)} bytes not copied (sha256 {hashlib.sha256(key).hexdigest()}): "  # type: ignore[arg-type]
                      f"over MEMSTREAM_DLQ_MAX_COPY_BYTES] {reason}")
            key = None
    return {
        "original_topic": _cut(origin.topic, 255),
        "original_partition": origin.partition,
        "original_offset": origin.offset,
        "original_key": key,
        "original_value": value,
        "original_size": size,
        "original_sha256": sha256,
        "stage": stage,
        "reason": _cut(reason, max_reason_chars),
        "error_class": _cut(error_class, 200),
        "failed_at": failed_at,
        "worker": worker,
    }


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters; a cut text says how much was left out."""
    if len(text) <= limit:
        return text
    note = f"… ({len(text) - limit} more characters)"
    return text[:max(0, limit - len(note))] + note


def connect_headers(record: dict) -> list[tuple[str, bytes]]:
    """`__connect.errors.*` headers (the Kafka Connect DLQ convention) for a DeadLetter record."""
    return [
        ("__connect.errors.topic", record["original_topic"].encode()),
        ("__connect.errors.partition", str(record["original_partition"]).encode()),
        ("__connect.errors.offset", str(record["original_offset"]).encode()),
        ("__connect.errors.stage", record["stage"].encode()),
        ("__connect.errors.exception.class.name", record["error_class"].encode()),
        ("__connect.errors.exception.message", record["reason"].encode()),
        ("__connect.errors.connector.name", b"memstream"),
    ]
