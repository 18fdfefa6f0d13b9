"""End to end through the real broker and registry: a real `memstream worker` subprocess."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from streams.contracts import catalog
from tests.conftest import ROOT
from tests.kafka_util import consume, free_port, http_get, produce, worker

pytestmark = pytest.mark.kafka


def test_avro_record_through_the_registry_reads_with_plain_confluent_deserializer(stack, unique):
    graph_id = f"g-registry-{unique}"
    event = {"ts": 1_793_491_200_000, "graphId": graph_id, "event": "phase_change", "status": "executing"}
    produce(stack, catalog.GRAPH_EVENTS, [(graph_id, event)])
    msgs = consume(stack, catalog.GRAPH_EVENTS, lambda out: any(m["key"] == graph_id for m in out), decode=False)
    raw = next(m["raw"] for m in msgs if m["key"] == graph_id)
    assert raw[0] == 0  # Confluent framing: a registry is configured
    # A consumer with only confluent-kafka's own deserializer (no memstream code) reads it.
    # (a timeout: once in a CI run the client's first request never got its answer and the
    # suite hung; a stuck request is retried with a fresh client rather than waited on for ever)
    for attempt in range(3):
        deser = AvroDeserializer(SchemaRegistryClient({"url": stack.registry_url, "timeout": 15}))
        try:
            record = deser(raw, SerializationContext(catalog.GRAPH_EVENTS, MessageField.VALUE))
            break
        except Exception:  # noqa: BLE001 - httpx timeout, wrapped differently across versions
            if attempt == 2:
                raise
    assert record["graphId"] == graph_id and record["event"] == "phase_change" and record["status"] == "executing"
    assert record["nodeId"] is None and record["budget"] is None


@pytest.mark.parametrize("input_fetch", ["librdkafka", "faust"])
def test_worker_materializes_graph_state_and_dead_letters_garbage(stack, unique, input_fetch):
    """Either input path (MEMSTREAM_INPUT_FETCH): librdkafka's, the default every other Kafka test
    runs, and Faust's own."""
    graph_id = f"g-e2e-{input_fetch}-{unique}"
    t0 = 1_793_491_200_000
    events = [
        {"ts": t0, "graphId": graph_id, "event": "phase_change", "status": "executing"},
        {"ts": t0 + 10, "graphId": graph_id, "nodeId": "n1", "event": "node_dispatched", "status": "running",
         "agent": "researcher", "startedAt": t0 + 10},
        {"ts": t0 + 900, "graphId": graph_id, "nodeId": "n1", "event": "node_completed", "status": "done",
         "signalType": "answer", "agent": "researcher", "startedAt": t0 + 10, "completedAt": t0 + 900},
        {"ts": t0 + 901, "graphId": graph_id, "event": "budget_update",
         "budget": {"sessionsSpawned": 1, "inputTokens": 1200, "outputTokens": 300, "costUsd": 0.012}},
        {"ts": t0 + 950, "graphId": graph_id, "event": "phase_change", "status": "complete"},
    ]
    port = free_port()
    env = {"MEMSTREAM_APP_ID": f"it-{input_fetch}-{unique}", "MEMSTREAM_WEB_PORT": str(port), "MEMSTREAM_API_TOKENS": "t:none",
           "MEMSTREAM_INPUT_FETCH": input_fetch}
    with worker(stack, f"graph-{input_fetch}-{unique}", env=env) as proc:
        produce(stack, catalog.GRAPH_EVENTS, [(graph_id, e) for e in events])
        produce(stack, catalog.GRAPH_EVENTS, [(graph_id, b'{"graphId": "not avro"}')])
        states = consume(stack, catalog.GRAPH_STATE,
                         lambda out: any(m["key"] == graph_id and m["value"]["eventCount"] == 5 for m in out))
        dlq = consume(stack, catalog.DLQ, lambda out: any(m["key"] == graph_id.encode() for m in out))
        api = http_get(port, f"/v1/graphs/{graph_id}", "t")
        missing = http_get(port, "/v1/graphs/no-such-graph", "t")
        denied = http_get(port, f"/v1/graphs/{graph_id}")
    log = (ROOT / ".memstream" / "test-logs" / f"graph-{input_fetch}-{unique}.log").read_text(errors="replace")
    assert ("input fetched by librdkafka" in log) == (input_fetch == "librdkafka"), proc.args
    final = [m["value"] for m in states if m["key"] == graph_id][-1]
    assert api == (200, final)  # the HTTP view serves the same state as the compacted topic
    assert missing[0] == 404 and denied[0] == 401
    assert final["phase"] == "complete"
    assert final["nodes"] == [{"nodeId": "n1", "status": "done", "agent": "researcher", "startedAt": t0 + 10,
                               "completedAt": t0 + 900, "signalType": "answer", "stalled": False}]
    assert final["budget"] == {"sessionsSpawned": 1, "inputTokens": 1200, "outputTokens": 300, "costUsd": 0.012}
    letter = next(m for m in dlq if m["key"] == graph_id.encode())
    assert letter["value"]["original_value"] == b'{"graphId": "not avro"}'
    assert letter["value"]["stage"] == "decode"
    assert "unknown magic byte" in letter["value"]["reason"] and "JSON" in letter["value"]["reason"]
    assert letter["headers"]["__connect.errors.topic"] == catalog.GRAPH_EVENTS.encode()
    assert letter["headers"]["__connect.errors.stage"] == b"decode"


def test_topics_apply_makes_the_registry_refuse_incompatible_schemas(stack):
    client = SchemaRegistryClient({"url": stack.registry_url})
    for spec in catalog.topics():
        assert client.get_compatibility(f"{spec.name}-value") == "FULL_TRANSITIVE"
    schema = json.loads((ROOT / "schemas" / "graph_event.avsc").read_text())
    schema["fields"].append({"name": "required_without_default", "type": "string", "doc": "breaks BACKWARD"})
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(f"{catalog.GRAPH_EVENTS}-value", Schema(json.dumps(schema), "AVRO"))
    assert refused.value.http_status_code == 409
