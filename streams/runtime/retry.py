"""Broker calls retried through transient errors, with a bound (leadership moving after a topic
was created or a broker restarted). Used by the worker's restore ahead and by the operator
tools (streams/tools/kafkatools.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")

#: broker errors that pass (leadership moving, a broker restarting): retried with a bound
TRANSIENT = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TRANSPORT,
             KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError.UNKNOWN_TOPIC_OR_PART,
             KafkaError._ALL_BROKERS_DOWN, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS}


def retrying(call: Callable[[], T], what: str, timeout: float = 60.0) -> T:
    """`call()`, retried while it fails with a transient broker error, for at most `timeout` s
    (`what` names the call for the caller's messages)."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is None or not (err.retriable() or err.code() in TRANSIENT) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
