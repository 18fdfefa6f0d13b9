"""Confluent framing against an in-process mock Schema Registry (the real-registry test lives elsewhere)."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from streams.contracts import catalog, schemas, wire
from streams.contracts.wire import CodecFactory, WireFormat

FORMED = {
    "event_id": "ev-1", "motebit_id": "mb-1", "device_id": "phone", "timestamp": 1_700_000_000_000,
    "version_clock": 3, "event_type": "memory_formed",
    "payload": {"node_id": "n-1", "content": "prefers tea", "sensitivity": "personal", "source": "user_stated",
                "redacted": None, "redacted_sensitivity": None, "redacted_reason": None,
                "valid_from": None, "valid_until": None},
    "caused_by": None,
}


class CountingRegistry:
    """A registry client that counts the calls made through it."""

    def __init__(self, inner: SchemaRegistryClient) -> None:
        self.inner = inner
        self.calls: list[tuple[str, object]] = []

    def register_schema(self, subject, schema, normalize_schemas=False):
        self.calls.append(("register", subject))
        return self.inner.register_schema(subject, schema)

    def get_schema(self, schema_id, *args, **kwargs):
        self.calls.append(("get", schema_id))
        return self.inner.get_schema(schema_id)


class FailingRegistry:
    """A registry client whose every call fails with a given error."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def register_schema(self, *args, **kwargs):
        raise self.error

    def get_schema(self, *args, **kwargs):
        raise self.error


@pytest.fixture
def mock_registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": "mock://test-registry"})


def test_register_once_per_topic_subject_and_never_per_record(mock_registry):
    registry = CountingRegistry(mock_registry)
    factory = CodecFactory(registry)
    topics = [t.name for t in catalog.topics()]
    ids = factory.register(topics)
    assert set(ids) == set(topics)
    assert [c for c in registry.calls] == [("register", f"{t}-value") for t in topics]
    assert factory.register(topics) == ids  # idempotent: same schema, same id
    registry.calls.clear()
    codec = factory.codec("memory_event")
    for _ in range(5):
        assert codec.decode(codec.encode(FORMED)) == FORMED
    assert registry.calls == []
    subjects = set(mock_registry.get_subjects())
    assert {"memory.events.v1-value", "memory.ledger.v1-value", "pipeline.dlq.v1-value"} <= subjects


def test_another_process_fetches_an_unknown_id_once(mock_registry):
    producer = CodecFactory(mock_registry)
    producer.register(["memory.events.v1"])
    data = producer.codec("memory_event").encode(FORMED)
    registry = CountingRegistry(mock_registry)
    consumer = CodecFactory(registry)  # registered nothing: knows no id yet
    for _ in range(3):
        assert consumer.codec("memory_event").decode(data) == FORMED
    assert registry.calls == [("get", int.from_bytes(data[1:5], "big"))]


def test_unknown_id_is_asked_once_then_remembered(mock_registry):
    registry = CountingRegistry(mock_registry)
    codec = CodecFactory(registry).codec("memory_event")
    for _ in range(3):
        with pytest.raises(wire.UnknownSchemaIdError, match="schema id 4242 is not in the schema registry"):
            codec.decode(b"\x00" + (4242).to_bytes(4, "big") + b"\x00")
    assert registry.calls == [("get", 4242)]


def test_both_framings_are_read_with_a_registry(mock_registry):
    factory = CodecFactory(mock_registry)
    factory.register(["memory.events.v1"])
    codec = factory.codec("memory_event")
    assert codec.decode(codec.encode(FORMED, WireFormat.SINGLE_OBJECT)) == FORMED
    assert codec.decode(codec.encode(FORMED, WireFormat.CONFLUENT)) == FORMED


def test_interoperates_with_confluent_avro_serializers(mock_registry):
    topic = "memory.events.v1"
    context = SerializationContext(topic, MessageField.VALUE)
    text = schemas.default().get("memory_event").registry_text
    theirs = AvroSerializer(mock_registry, text)(FORMED, context)
    factory = CodecFactory(mock_registry)
    assert factory.codec("memory_event").decode(theirs) == FORMED
    factory.register([topic])
    ours = factory.codec("memory_event").encode(FORMED)
    assert AvroDeserializer(mock_registry)(ours, context) == FORMED


def test_encoding_confluent_needs_registration(mock_registry):
    with pytest.raises(wire.RegistryError, match="call CodecFactory.register"):
        CodecFactory(mock_registry).codec("memory_event").encode(FORMED)
    with pytest.raises(wire.RegistryError, match="no schema registry is configured"):
        CodecFactory().codec("memory_event").encode(FORMED, WireFormat.CONFLUENT)
    assert CodecFactory().register(["memory.events.v1"]) == {}
    with pytest.raises(wire.RegistryError, match="no schema registry is configured"):
        CodecFactory().register_subject("x-value", "memory_event")


def test_registry_failures_are_not_data_errors():
    refused = CodecFactory(FailingRegistry(SchemaRegistryError(409, 409, "incompatible schema")))
    with pytest.raises(wire.RegistryError, match="subject 'memory.events.v1-value' failed: .*incompatible"):
        refused.register(["memory.events.v1"])
    broken = CodecFactory(FailingRegistry(SchemaRegistryError(500, 50001, "store down")))
    with pytest.raises(wire.RegistryError, match="fetching schema id 9 failed"):
        broken.codec("memory_event").decode(b"\x00\x00\x00\x00\x09\x00")
    unreachable = CodecFactory(SchemaRegistryClient({"url": "http://127.0.0.1:1", "max.retries": 0}))
    with pytest.raises(wire.RegistryError, match="fetching schema id 9 failed"):
        unreachable.codec("memory_event").decode(b"\x00\x00\x00\x00\x09\x00")
    assert not issubclass(wire.RegistryError, wire.WireFormatError)


def test_registry_schema_that_is_not_usable(mock_registry):
    from confluent_kafka.schema_registry import Schema

    json_id = mock_registry.register_schema("j-value", Schema('{"type": "object"}', "JSON"))
    registry = CountingRegistry(mock_registry)
    codec = CodecFactory(registry).codec("memory_event")
    for _ in range(2):
        with pytest.raises(wire.IncompatibleSchemaError, match=f"schema id {json_id} is a JSON schema, not Avro"):
            codec.decode(b"\x00" + json_id.to_bytes(4, "big") + b"\x00")
    assert registry.calls == [("get", json_id)]
    other_id = mock_registry.register_schema(
        "o-value", Schema('{"type": "record", "name": "Other", "fields": [{"name": "a", "type": "long"}]}', "AVRO"))
    with pytest.raises(wire.IncompatibleSchemaError, match=f"with registry id {other_id} .*read as memory_event"):
        codec.decode(b"\x00" + other_id.to_bytes(4, "big") + b"\x02")
