"""Faust codecs over the wire codecs: ``avro-<stem>`` for every value schema, ``utf8-key`` for keys.

Call ``install(factory)`` once at startup (after ``factory.register(...)`` when a registry is
configured), then name the codecs on topics and tables, e.g.
``app.topic("memory.events.v1", key_serializer="utf8-key", value_serializer="avro-memory_event")``.
Faust never calls a codec for a null value (a tombstone stays ``None``), and wraps a codec's error in
its ``KeyDecodeError`` / ``ValueDecodeError``; the ``wire.WireFormatError`` is the ``__cause__``.
"""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs

from streams.contracts.wire import CodecFactory, ValueCodec, decode_key, encode_key

KEY_CODEC = "utf8-key"


def codec_name(stem: str) -> str:
    """Name of the Faust codec of a value schema stem."""
    return f"avro-{stem}"


class AvroCodec(codecs.Codec):
    """Faust codec of one value schema, delegating to a ``wire.ValueCodec``."""

    def __init__(self, value_codec: ValueCodec, **kwargs: Any) -> None:
        super().__init__(value_codec=value_codec, **kwargs)
        self.value_codec = value_codec

    def _dumps(self, obj: Any) -> bytes:
        return self.value_codec.encode(obj)

    def _loads(self, s: bytes) -> Any:
        return self.value_codec.decode(s)


class Utf8KeyCodec(codecs.Codec):
    """Faust codec of record keys: UTF-8 strings."""

    def _dumps(self, obj: Any) -> bytes:
        return encode_key(obj)

    def _loads(self, s: bytes) -> Any:
        return decode_key(s)


def install(factory: CodecFactory) -> dict[str, str]:
    """Register ``utf8-key`` and one ``avro-<stem>`` codec per schema; returns {stem: codec name}."""
    codecs.register(KEY_CODEC, Utf8KeyCodec())
    names = {}
    for stem in factory.schema_set.current:
        names[stem] = codec_name(stem)
        codecs.register(names[stem], AvroCodec(factory.codec(stem)))
    return names
