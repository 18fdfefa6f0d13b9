"""`memstream catalog --format asyncapi`: an AsyncAPI 3.0 document generated from the catalog.

Channels are the catalog's topics; each carries its key (a UTF-8 string), its Avro value schema
(embedded from `schemas/`), and a Kafka binding with partitions, replicas and the topic
configuration (cleanup policy, retention). Operations say which side memstream is on: `receive`
for input topics, `send` for output topics. Written as JSON (a valid AsyncAPI serialization).
"""

from __future__ import annotations

import json

from streams import __version__
from streams.contracts import catalog
from streams.contracts.schemas import SCHEMAS_DIR
from streams.settings import Settings

AVRO_FORMAT = "application/vnd.apache.avro;version=1.9.0"


def _channel_id(topic_name: str) -> str:
    return topic_name.replace(".", "_")


def document(settings: Settings | None = None) -> dict:
    settings = settings or Settings()
    channels: dict = {}
    operations: dict = {}
    messages: dict = {}
    for t in catalog.topics():
        cid = _channel_id(t.name)
        msg_id = f"{cid}_message"
        schema = json.loads((SCHEMAS_DIR / f"{t.value_schema}.avsc").read_text())
        messages[msg_id] = {
            "name": schema.get("name", t.value_schema),
            "title": f"{t.name} record",
            "summary": t.description,
            "contentType": "application/octet-stream",
            "payload": {"schemaFormat": AVRO_FORMAT, "schema": schema},
            "bindings": {
                "kafka": {
                    "key": {"type": "string", "description": f"UTF-8 `{t.key}`; partitioned with murmur2"},
                    "schemaIdLocation": "payload",
                    "schemaIdPayloadEncoding": "confluent",
                    "bindingVersion": "0.5.0",
                }
            },
        }
        topic_config: dict = {"cleanup.policy": [p.strip() for p in t.cleanup_policy.split(",")]}
        if t.retention_ms is not None:
            topic_config["retention.ms"] = t.retention_ms
        channels[cid] = {
            "address": t.name,
            "description": t.description,
            "messages": {msg_id: {"$ref": f"#/components/messages/{msg_id}"}},
            "bindings": {
                "kafka": {
                    "topic": t.name,
                    "partitions": t.partitions(settings),
                    "replicas": t.replication(settings),
                    "topicConfiguration": topic_config,
                    "bindingVersion": "0.5.0",
                }
            },
        }
        operations[f"{'consume' if t.direction == 'in' else 'produce'}_{cid}"] = {
            "action": "receive" if t.direction == "in" else "send",
            "channel": {"$ref": f"#/channels/{cid}"},
            "summary": ("memstream reads " if t.direction == "in" else "memstream writes ") + t.name,
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "memstream",
            "version": __version__,
            "description": "Topics of the memstream pipeline (generated from streams/contracts/catalog.py).",
        },
        "defaultContentType": "application/octet-stream",
        "servers": {
            "local": {"host": settings.broker, "protocol": "kafka", "description": "the local dev stack"},
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def render(settings: Settings | None = None) -> str:
    return json.dumps(document(settings), indent=2, sort_keys=False)
