"""Dead letters: what the pipeline could not accept, with where it came from and why.

Pure: builds the `memstream.pipeline.DeadLetter` record and the Kafka Connect style
`__connect.errors.*` headers that carry the same facts, so standard Connect tooling can read them.
The record keeps the original key and value bytes untouched, so `dlq replay` can resend them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Stages, named after where in the pipeline the record was refused.
STAGE_DECODE = "decode"  # bytes are not a record of the topic's schema
STAGE_VALIDATE = "validate"  # a record, but it breaks a rule of the spec (e.g. missing sensitivity)
STAGE_APPLY = "apply"  # valid, but applying it failed (e.g. a lifecycle violation, a bug)
STAGE_SHIP = "ship"  # the graph-log shipper could not parse a line


@dataclass(frozen=True)
class Origin:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def dead_letter(origin: Origin, *, stage: str, reason: str, error_class: str, failed_at: int,
                worker: str | None = None) -> dict:
    """The DeadLetter record (field names as schemas/dead_letter.avsc)."""
    return {
        "original_topic": origin.topic,
        "original_partition": origin.partition,
        "original_offset": origin.offset,
        "original_key": origin.key,
        "original_value": origin.value,
        "stage": stage,
        "reason": reason,
        "error_class": error_class,
        "failed_at": failed_at,
        "worker": worker,
    }


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
