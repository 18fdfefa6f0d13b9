"""Apicurio's serializer with headers (its 2.x default): schema id in record headers, raw Avro body.

Header names and encoding as Apicurio's serde writes them (`DefaultHeadersHandler.writeHeaders`:
`apicurio.value.globalId` or `apicurio.value.contentId`, `ByteBuffer.allocate(8).putLong(id)`, i.e.
an 8-byte big-endian long; `AvroSerdeHeaders`: `apicurio.value.encoding` = `BINARY` | `JSON`).
Pure tests here use the in-process mock registry and an injected globalId lookup; the real
Apicurio registry is exercised in `tests/contracts/test_wire_apicurio_kafka.py`.
"""

from __future__ import annotations

import io

import pytest
from fastavro import schemaless_writer

from streams.contracts import catalog, schemas, wire
from streams.contracts.wire import CodecFactory

CANDIDATE = {
    "candidate_id": "c-1", "motebit_id": "mb-1", "content": "prefers tea", "sensitivity": "personal",
    "source": "user_stated", "memory_type": "semantic", "confidence": None, "valid_from": None,
    "timestamp": 1_700_000_000_000, "embedding": [0.5, -1.0], "frontmatter_type": None, "extra": ["a: b"],
    "supersedes": None, "kind": None, "session_id": None,
}


def raw_body(record: dict, stem: str = "candidate_memory") -> bytes:
    """The value Apicurio's serializer writes with headers enabled: the Avro body alone."""
    out = io.BytesIO()
    schemaless_writer(out, schemas.default().get(stem).parsed, record)
    return out.getvalue()


def long_header(name: str, value: int) -> tuple[str, bytes]:
    return name, value.to_bytes(8, "big", signed=True)


@pytest.fixture
def factory() -> CodecFactory:
    built = CodecFactory.from_url("mock://test-apicurio")
    built.register(t.name for t in catalog.topics())
    return built


def test_content_id_header_reads_the_raw_body(factory):
    content_id = factory.schema_id("candidate_memory")
    codec = factory.codec("candidate_memory")
    headers = [long_header(wire.APICURIO_CONTENT_ID, content_id), (wire.APICURIO_ENCODING, b"BINARY")]
    assert codec.decode_message(raw_body(CANDIDATE), headers) == CANDIDATE
    assert codec.decode_message(raw_body(CANDIDATE), dict(headers)) == CANDIDATE  # a mapping works too


def test_global_id_header_is_looked_up_once_and_cached(factory):
    asked: list[int] = []
    text = schemas.default().get("candidate_memory").registry_text

    def lookup(global_id: int) -> str:
        asked.append(global_id)
        return text

    factory.apicurio = wire.ApicurioIds(factory, fetch=lookup)
    codec = factory.codec("candidate_memory")
    for _ in range(3):
        assert codec.decode_message(raw_body(CANDIDATE), [long_header(wire.APICURIO_GLOBAL_ID, 7)]) == CANDIDATE
    assert asked == [7]


def test_global_id_wins_over_content_id_and_the_last_header_of_a_name_wins(factory):
    text = schemas.default().get("candidate_memory").registry_text
    factory.apicurio = wire.ApicurioIds(factory, fetch=lambda gid: text if gid == 2 else "{}")
    codec = factory.codec("candidate_memory")
    headers = [long_header(wire.APICURIO_CONTENT_ID, 9999), long_header(wire.APICURIO_GLOBAL_ID, 1),
               long_header(wire.APICURIO_GLOBAL_ID, 2)]
    assert codec.decode_message(raw_body(CANDIDATE), headers) == CANDIDATE


def test_a_body_written_with_an_older_schema_is_resolved_into_the_current_one(factory):
    """The writer schema named by the header is resolved like any other (Avro schema resolution)."""
    older = {"type": "record", "name": "CandidateMemory", "namespace": "memstream.memory",
             "fields": [{"name": "candidate_id", "type": "string"}, {"name": "motebit_id", "type": "string"},
                        {"name": "content", "type": "string"}, {"name": "timestamp", "type": "long"}]}
    import json

    factory.apicurio = wire.ApicurioIds(factory, fetch=lambda gid: json.dumps(older))
    out = io.BytesIO()
    schemaless_writer(out, older, {"candidate_id": "c-9", "motebit_id": "mb-1", "content": "x", "timestamp": 5})
    record = factory.codec("candidate_memory").decode_message(out.getvalue(), [long_header(wire.APICURIO_GLOBAL_ID, 3)])
    assert record["candidate_id"] == "c-9" and record["sensitivity"] is None and record["memory_type"] == "semantic"


def test_without_apicurio_headers_the_other_framings_still_decode(factory):
    codec = factory.codec("candidate_memory")
    for data in (codec.encode(CANDIDATE), codec.encode(CANDIDATE, wire.WireFormat.SINGLE_OBJECT)):
        assert codec.decode_message(data, None) == CANDIDATE
        assert codec.decode_message(data, [("memstream.replayed_from", b"x"), ("apicurio.key.globalId", b"\0" * 8)]) \
            == CANDIDATE


def test_the_raw_body_without_headers_is_still_an_unknown_magic_byte(factory):
    body = raw_body(CANDIDATE)
    assert body[:1] not in (b"\x00", b"\xc3")
    with pytest.raises(wire.UnknownMagicByteError):
        factory.codec("candidate_memory").decode_message(body, [])


@pytest.mark.parametrize("headers, message", [
    ([(wire.APICURIO_GLOBAL_ID, b"\x00\x01")], "has 2 bytes; Apicurio writes an 8-byte big-endian long"),
    ([(wire.APICURIO_CONTENT_ID, None)], "has no value"),
    ([long_header(wire.APICURIO_CONTENT_ID, 1), (wire.APICURIO_ENCODING, b"JSON")], "reads Avro binary only"),
])
def test_unreadable_apicurio_headers_are_data_errors(factory, headers, message):
    with pytest.raises(wire.ApicurioHeaderError, match=message):
        factory.codec("candidate_memory").decode_message(raw_body(CANDIDATE), headers)
    assert issubclass(wire.ApicurioHeaderError, wire.WireFormatError)  # dead-lettered, not retried


def test_unknown_and_unusable_global_ids_are_data_errors_remembered(factory):
    asked: list[int] = []

    def lookup(global_id: int) -> str:
        asked.append(global_id)
        if global_id == 404:
            raise wire.UnknownSchemaIdError("Apicurio globalId 404 is not in the registry")
        return '{"type": "string"}'

    factory.apicurio = wire.ApicurioIds(factory, fetch=lookup)
    codec = factory.codec("candidate_memory")
    for _ in range(2):
        with pytest.raises(wire.UnknownSchemaIdError):
            codec.decode_message(b"\x02", [long_header(wire.APICURIO_GLOBAL_ID, 404)])
        with pytest.raises(wire.IncompatibleSchemaError, match="not an Avro record schema"):
            codec.decode_message(b"\x02", [long_header(wire.APICURIO_GLOBAL_ID, 5)])
    assert asked == [404, 5]


def test_a_global_id_needs_an_apicurio_registry_url():
    assert wire.apicurio_api_url("http://127.0.0.1:18081/apis/ccompat/v7") == "http://127.0.0.1:18081/apis/registry/v2"
    assert wire.apicurio_api_url("https://r.example/x/apis/ccompat/v6") == "https://r.example/x/apis/registry/v2"
    assert wire.apicurio_api_url("http://confluent:8081") is None
    assert wire.apicurio_api_url("mock://x") is None
    codec = CodecFactory.from_url("mock://plain").codec("candidate_memory")
    with pytest.raises(wire.UnknownSchemaIdError, match="use-id=contentId"):
        codec.decode_message(raw_body(CANDIDATE), [long_header(wire.APICURIO_GLOBAL_ID, 1)])


def test_an_unreachable_apicurio_api_is_not_the_datas_fault():
    factory = CodecFactory.from_url("http://127.0.0.1:1/apis/ccompat/v7")
    with pytest.raises(wire.RegistryError, match="fetching Apicurio globalId 1 failed"):
        factory.codec("candidate_memory").decode_message(raw_body(CANDIDATE), [long_header(wire.APICURIO_GLOBAL_ID, 1)])
