"""What a librdkafka consumer's `consume()` handed: records, or errors in their place."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .loglimit import Throttled


def records_of(messages: list[Any], warn: Throttled, what: str) -> list[Any]:
    """The records among `messages`: a fatal error raises `KafkaException` (the caller's thread
    stops); any other error (a broker away: librdkafka retries on its own) is logged through
    `warn` (at most once per its interval) and left out."""
    out = []
    for m in messages:
        err = m.error()
        if err is None:
            out.append(m)
            continue
        if err.fatal():
            from confluent_kafka import KafkaException

            raise KafkaException(err)
        warn.log("%s: %s (retried by librdkafka)", what, err)
    return out


def reader(config: dict[str, Any]) -> Any:
    """A librdkafka consumer that reads assigned partitions outside the consumer group (it never
    commits), skipping aborted transactions as the worker's own consumer does (rebalance.py), from
    the beginning of a partition where it has no offset."""
    from confluent_kafka import Consumer

    return Consumer({
        **config,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "log_level": 3,
    })


@contextmanager
def reading(config: dict[str, Any], fail: Callable[[str], None]) -> Iterator[Any]:
    """A `reader` for a thread's loop: any error it raises stops the loop and is reported by
    `fail(reason)` (a consumer error, or anything else the loop hit); the consumer is closed after."""
    from confluent_kafka import KafkaException

    consumer = reader(config)
    try:
        yield consumer
    except KafkaException as exc:
        fail(f"consumer error: {exc}")
    except Exception as exc:  # noqa: BLE001 - anything else stops the loop, reported
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001,S110 - closing a consumer that failed
            pass
