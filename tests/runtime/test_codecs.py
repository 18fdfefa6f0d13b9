"""The Faust codecs are thin wrappers over the wire codecs."""

from __future__ import annotations

import pytest
from faust.exceptions import KeyDecodeError, ValueDecodeError
from faust.serializers import codecs
from faust.serializers.registry import Registry

from streams.contracts import schemas, wire
from streams.contracts.wire import CodecFactory
from streams.runtime import codecs as memstream_codecs

DELETED = {"event_id": "ev-2", "motebit_id": "mb-1", "device_id": None, "timestamp": 1, "version_clock": 1,
           "event_type": "memory_deleted", "payload": {"node_id": "n-1"},
           "caused_by": {"kind": "event", "id": "ev-1"}}


@pytest.fixture(scope="module")
def installed() -> dict[str, str]:
    return memstream_codecs.install(CodecFactory())


def test_one_codec_per_schema(installed):
    assert installed == {stem: f"avro-{stem}" for stem in schemas.default().current}
    for name in installed.values():
        assert isinstance(codecs.get_codec(name), memstream_codecs.AvroCodec)


def test_codecs_round_trip_through_faust_registry(installed):
    registry = Registry(key_serializer=memstream_codecs.KEY_CODEC, value_serializer="avro-memory_event")
    value = registry.dumps_value(None, DELETED)
    assert value[:2] == b"\xc3\x01"
    assert registry.loads_value(None, value) == DELETED
    key = registry.dumps_key(str, "mb-1")
    assert key == b"mb-1" and registry.loads_key(str, key) == "mb-1"
    assert registry.loads_value(None, None) is None  # a tombstone never reaches the codec


def test_faust_wraps_the_typed_error(installed):
    registry = Registry(key_serializer=memstream_codecs.KEY_CODEC, value_serializer="avro-memory_event")
    with pytest.raises(ValueDecodeError) as caught:
        registry.loads_value(None, b'{"json": true}')
    assert isinstance(caught.value.__cause__, wire.UnknownMagicByteError)
    with pytest.raises(KeyDecodeError) as caught_key:
        registry.loads_key(str, b"\xff")
    assert isinstance(caught_key.value.__cause__, wire.InvalidKeyError)


def test_clone_keeps_the_value_codec(installed):
    codec = codecs.get_codec("avro-memory_event")
    chained = codec | codecs.get_codec("binary")
    assert chained.loads(chained.dumps(DELETED)) == DELETED
