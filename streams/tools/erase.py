"""`memstream erase <motebit_id>`: queue the erasure of a user and, with --wait, print its receipt.

The erasure itself runs in the pipeline (the memory agent that owns the user's partition:
streams/core/erasure.py); this command only produces the request to memory.erase-requests.v1
(murmur2 partitioning, like every producer must) and reads memory.erase-receipts.v1.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import TextIO

from streams.contracts import catalog
from streams.contracts.wire import encode_key
from streams.core.erasure import erase_request
from streams.core.limits import LimitExceeded
from streams.core.partitioning import partition_for
from streams.runtime.topology import Producer
from streams.settings import Settings

KAFKA_TIMEOUT_S = 15.0
PRODUCER = Producer("memstream erase", __name__, "`memstream erase <motebit_id>`: queues a user's erasure.",
                    sinks=(catalog.ERASE_REQUESTS,))


class EraseError(RuntimeError):
    """Something the operator can fix (a bad id, the stack down, no receipt in time)."""


def erase(settings: Settings, motebit_id: str, request_id: str | None = None, wait_s: float | None = None,
          out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Send the request; with `wait_s`, wait that long for its receipt and print it (JSON) on
    `out`. What a person reads (the request was sent, where) goes to `err`: `out` carries the
    receipt alone, so `memstream erase --wait … | jq` works."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    from streams.contracts.wire import CodecFactory, RegistryError

    try:
        record = erase_request(motebit_id, request_id or str(uuid.uuid4()), int(time.time() * 1000), "cli",
                               settings.limits())
    except LimitExceeded as exc:
        raise EraseError(str(exc)) from None
    factory = CodecFactory.from_url(settings.registry_url)
    try:
        factory.register([catalog.ERASE_REQUESTS, catalog.ERASE_RECEIPTS])
    except RegistryError as exc:
        raise EraseError(f"schema registry at {settings.registry_url} unavailable ({exc}); is the stack up? "
                         "(`memstream dev status`)") from None
    receipts = factory.codec(catalog.topic(catalog.ERASE_RECEIPTS).value_schema)
    partition = partition_for(encode_key(motebit_id), settings.partitions)
    start = None
    try:
        if wait_s is not None:  # the receipt comes after the request: read from the end as of now
            consumer = Consumer({"bootstrap.servers": settings.broker, "group.id": f"memstream-erase-{uuid.uuid4().hex}",
                                 "enable.auto.commit": False, "log_level": 0})
            start = consumer.get_watermark_offsets(TopicPartition(catalog.ERASE_RECEIPTS, partition),
                                                   timeout=KAFKA_TIMEOUT_S)[1]
        producer = Producer({"bootstrap.servers": settings.broker, "partitioner": "murmur2_random",
                             "enable.idempotence": True, "acks": "all", "log_level": 0})
        failures: list[str] = []
        producer.produce(catalog.ERASE_REQUESTS, key=encode_key(motebit_id),
                         value=factory.codec(catalog.topic(catalog.ERASE_REQUESTS).value_schema).encode(record),
                         on_delivery=lambda err, _msg: failures.append(str(err)) if err else None)
        if producer.flush(KAFKA_TIMEOUT_S) or failures:
            raise EraseError(f"the erase request was not delivered to {settings.broker} "
                             f"({failures[0] if failures else 'timed out'}); is the stack up? (`memstream dev status`)")
    except KafkaException as exc:
        raise EraseError(f"cannot reach Kafka at {settings.broker} ({exc}); is the stack up? (`memstream dev status`)") from None
    print(f"erase request {record['request_id']} for {motebit_id} sent to {catalog.ERASE_REQUESTS} "
          f"(partition {partition})" + ("; waiting for its receipt" if wait_s is not None else ""), file=err)
    if wait_s is None:
        return 0
    try:
        consumer.assign([TopicPartition(catalog.ERASE_RECEIPTS, partition, start)])  # type: ignore[arg-type]
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() or msg.value() is None:
                continue
            receipt = receipts.decode(msg.value())  # type: ignore[arg-type]
            if receipt["request_id"] == record["request_id"] and receipt["motebit_id"] == motebit_id:
                print(json.dumps(receipt, indent=2, sort_keys=True), file=out)
                return 0
    finally:
        consumer.close()
    raise EraseError(f"no receipt for erase request {record['request_id']} within {wait_s:.0f}s: is a worker running? "
                     f"(the request stays queued; its receipt will appear on {catalog.ERASE_RECEIPTS})")
