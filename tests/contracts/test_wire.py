"""Value and key codecs: both framings round-trip every schema, and every kind of bad input has its typed error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from streams.contracts import compat, schemas, wire
from streams.contracts.wire import CodecFactory, WireFormat

REPO_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
STEMS = sorted(schemas.default().current)

FORMED = {
    "event_id": "ev-1", "motebit_id": "mb-1", "device_id": None, "timestamp": 1_700_000_000_000,
    "version_clock": 3, "event_type": "memory_formed",
    "payload": {"node_id": "n-1", "content": "prefers tea", "sensitivity": "personal", "source": "user_stated",
                "redacted": None, "redacted_sensitivity": None, "redacted_reason": None,
                "valid_from": None, "valid_until": None},
    "caused_by": None,
}
DELETED = {**FORMED, "event_id": "ev-2", "event_type": "memory_deleted", "payload": {"node_id": "n-1"}}


@pytest.fixture
def factory() -> CodecFactory:
    """A factory on an in-process mock registry, with every catalog topic registered."""
    from streams.contracts import catalog

    built = CodecFactory.from_url("mock://test-wire")
    built.register(t.name for t in catalog.topics())
    return built


def single_object_factory(schemas_dir: Path) -> CodecFactory:
    return CodecFactory(schema_set=schemas.SchemaSet.load(schemas_dir))


def write_schemas(root: Path, current: dict, released: list[dict]) -> Path:
    """A schemas dir with one stem `x`: its current schema and released versions v1..vN."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "x.avsc").write_text(json.dumps(current))
    for number, source in enumerate(released, start=1):
        (root / "released" / "x").mkdir(parents=True, exist_ok=True)
        (root / "released" / "x" / f"v{number}.avsc").write_text(json.dumps(source))
    return root


def record_schema(*fields: dict) -> dict:
    return {"type": "record", "name": "X", "namespace": "memstream.test", "doc": "test", "fields": list(fields)}


# ------------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize("fmt", list(WireFormat))
def test_every_schema_round_trips_generated_records(factory, stem, fmt):
    codec = factory.codec(stem)
    for record in compat.sample_records(schemas.parsed(stem), seed=7):
        data = codec.encode(record, fmt)
        assert wire.detect_format(data) is fmt
        assert codec.decode(data) == compat.untag(record)


def test_default_format_follows_registry(factory):
    assert factory.default_format is WireFormat.CONFLUENT
    assert CodecFactory().default_format is WireFormat.SINGLE_OBJECT
    assert CodecFactory.from_url("").registry is None
    assert CodecFactory().codec("memory_event").encode(FORMED)[:2] == b"\xc3\x01"


def test_framing_bytes(factory):
    codec = factory.codec("memory_event")
    single = codec.encode(FORMED, WireFormat.SINGLE_OBJECT)
    assert single[:2] == b"\xc3\x01" and single[2:10] == schemas.fingerprint("memory_event")
    confluent = codec.encode(FORMED, WireFormat.CONFLUENT)
    assert confluent[0] == 0 and int.from_bytes(confluent[1:5], "big") == factory.schema_id("memory_event")
    assert single[10:] == confluent[5:]  # same Avro body under both framings


def test_plain_fastavro_reader_decodes_single_object_without_memstream_code():
    data = CodecFactory().codec("memory_event").encode(FORMED)
    schema = fastavro.parse_schema(json.loads((REPO_SCHEMAS / "memory_event.avsc").read_text()))
    expected_fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == expected_fp
    assert fastavro.schemaless_reader(io.BytesIO(data[10:]), schema) == FORMED


def test_codec_instances_are_shared():
    built = CodecFactory()
    assert built.codec("memory_event") is built.codec("memory_event")
    assert built.codec("memory_event").stem == "memory_event"


# ------------------------------------------------------------------------------------ union branches
def written_branch(data: bytes, stem: str, field: str) -> str:
    record = fastavro.schemaless_reader(io.BytesIO(data[10:]), schemas.parsed(stem), return_record_name=True)
    return record[field][0]


def test_payload_branch_follows_event_type():
    codec = CodecFactory().codec("memory_event")
    # MemoryAccessedPayload and MemoryDeletedPayload have the same fields: fastavro alone would guess.
    assert written_branch(codec.encode(DELETED), "memory_event", "payload") == "memstream.memory.MemoryDeletedPayload"
    accessed = {**DELETED, "event_type": "memory_accessed"}
    assert written_branch(codec.encode(accessed), "memory_event", "payload") == "memstream.memory.MemoryAccessedPayload"
    # An explicit (branch, value) tuple wins.
    tagged = {**DELETED, "payload": ("memstream.memory.MemoryAccessedPayload", {"node_id": "n"})}
    assert written_branch(codec.encode(tagged), "memory_event", "payload") == "memstream.memory.MemoryAccessedPayload"


def test_session_data_branch_follows_type():
    codec = CodecFactory().codec("session_event")
    end = {"sessionId": "s", "seq": 4, "type": "compaction/end", "ts": 1, "data": {"compactionId": "c", "turn": None}}
    assert written_branch(codec.encode(end), "session_event", "data") == "memstream.session.CompactionEnd"
    assert codec.decode(codec.encode(end))["data"] == {"compactionId": "c", "sourceCommandId": None, "turn": None,
                                                       "error": None}
    other = {**end, "type": "tool/result", "data": {"json": "{}"}}
    assert written_branch(codec.encode(other), "session_event", "data") == "memstream.session.GenericEvent"


def test_omitted_optional_fields_take_their_defaults():
    codec = CodecFactory().codec("memory_event")
    minimal = {k: v for k, v in FORMED.items() if k != "device_id"}
    minimal["payload"] = {"node_id": "n-1", "content": "c"}
    decoded = codec.decode(codec.encode(minimal))
    assert decoded["device_id"] is None and decoded["payload"]["sensitivity"] is None


# --------------------------------------------------------------------------------------- evolution
def test_older_released_writer_is_resolved_into_current_reader(tmp_path):
    v1 = record_schema({"name": "a", "type": "string", "doc": "a"})
    v2 = record_schema({"name": "a", "type": "string", "doc": "a"},
                       {"name": "b", "type": "long", "default": 5, "doc": "b"},
                       {"name": "e", "type": {"type": "enum", "name": "E", "doc": "e", "symbols": ["u", "p"],
                                              "default": "u"}, "default": "p", "doc": "e"})
    old = single_object_factory(write_schemas(tmp_path / "old", v1, [v1]))
    new = single_object_factory(write_schemas(tmp_path / "new", v2, [v1]))
    assert new.codec("x").decode(old.codec("x").encode({"a": "hi"})) == {"a": "hi", "b": 5, "e": "p"}
    # An old reader has never seen the newer, unreleased fingerprint.
    with pytest.raises(wire.UnknownFingerprintError, match="not a current or released"):
        old.codec("x").decode(new.codec("x").encode({"a": "hi", "b": 1, "e": "u"}))


def test_newer_writer_by_registry_id_with_unknown_enum_symbol_reads_as_default(tmp_path):
    enum_v1 = {"type": "enum", "name": "E", "doc": "e", "symbols": ["u", "p"], "default": "u"}
    enum_v2 = {**enum_v1, "symbols": ["u", "p", "q"]}
    old_schema = record_schema({"name": "e", "type": enum_v1, "doc": "e"})
    new_schema = record_schema({"name": "e", "type": enum_v2, "doc": "e"},
                               {"name": "extra", "type": ["null", "string"], "default": None, "doc": "x"})
    registry = wire.SchemaRegistryClient.new_client({"url": "mock://test-evolution"})
    new = CodecFactory(registry, schemas.SchemaSet.load(write_schemas(tmp_path / "new", new_schema, [old_schema])))
    old = CodecFactory(registry, schemas.SchemaSet.load(write_schemas(tmp_path / "old", old_schema, [old_schema])))
    new.register_subject("x-value", "x")
    data = new.codec("x").encode({"e": "q", "extra": "z"})
    assert old.codec("x").decode(data) == {"e": "u"}


def test_unknown_enum_symbol_without_reader_default(tmp_path):
    with_c = record_schema({"name": "e", "type": {"type": "enum", "name": "E", "doc": "e", "symbols": ["a", "b", "c"]},
                            "doc": "e"})
    without_c = record_schema({"name": "e", "type": {"type": "enum", "name": "E", "doc": "e", "symbols": ["a", "b"]},
                               "doc": "e"})
    writer = single_object_factory(write_schemas(tmp_path / "w", with_c, []))
    reader = single_object_factory(write_schemas(tmp_path / "r", without_c, [with_c]))
    assert reader.codec("x").decode(writer.codec("x").encode({"e": "a"})) == {"e": "a"}
    with pytest.raises(wire.UnknownEnumSymbolError, match="c not found in reader symbol list"):
        reader.codec("x").decode(writer.codec("x").encode({"e": "c"}))


def test_other_records_schema_is_incompatible():
    built = CodecFactory()
    dead = built.codec("dead_letter").encode({
        "original_topic": "t", "original_partition": 0, "original_offset": 1, "stage": "decode",
        "reason": "r", "error_class": "E", "failed_at": 2})
    with pytest.raises(wire.IncompatibleSchemaError, match="written with dead_letter current .* read as memory_event"):
        built.codec("memory_event").decode(dead)


# ------------------------------------------------------------------------------------------ bad bytes
@pytest.mark.parametrize(("data", "error", "message"), [
    (b'{"event_id": "x"}', wire.UnknownMagicByteError, "unknown magic byte 0x7b .*is the producer writing JSON"),
    (b"\x01\x02", wire.UnknownMagicByteError, r"unknown magic byte 0x01 0x02 \(expected 0x00"),
    (b"\xc3\x02abc", wire.UnknownMagicByteError, "0xc3 0x02"),
    (b"", wire.TruncatedMessageError, "empty value"),
    (b"\xc3", wire.TruncatedMessageError, "single-object header C3 01 cut short"),
    (b"\xc3\x01\x00\x01", wire.TruncatedMessageError, r"single-object header \(10 bytes\) cut short"),
    (b"\x00\x00\x01", wire.TruncatedMessageError, r"Confluent header \(5 bytes\) cut short"),
    (b"\xc3\x01" + b"\x11" * 8 + b"\x00", wire.UnknownFingerprintError, "fingerprint 1111111111111111"),
    (b"\x00\x00\x00\x00\x07\x00", wire.UnknownSchemaIdError, "schema id 7 is unknown and no schema registry"),
])
def test_bad_framing(data, error, message):
    with pytest.raises(error, match=message):
        CodecFactory().codec("memory_event").decode(data)


def test_bad_bodies():
    codec = CodecFactory().codec("memory_event")
    good = codec.encode(FORMED)
    with pytest.raises(wire.TruncatedMessageError, match="Avro body ends early"):
        codec.decode(good[:-3])
    with pytest.raises(wire.MalformedBodyError, match="2 trailing bytes after the Avro body"):
        codec.decode(good + b"\x00\x00")
    header = good[:10]
    bad_enum = header + b"\x02e\x02m\x00\x02\x02\x7e"  # event_type index 63: no such symbol
    with pytest.raises(wire.MalformedBodyError, match="does not match its schema"):
        codec.decode(bad_enum)
    bad_utf8 = header + b"\x04\xff\xfe"  # event_id: 2 bytes that are not UTF-8
    with pytest.raises(wire.MalformedBodyError, match="UnicodeDecodeError"):
        codec.decode(bad_utf8)
    for error in (wire.TruncatedMessageError, wire.MalformedBodyError, wire.UnknownMagicByteError):
        assert issubclass(error, wire.WireFormatError) and issubclass(error, ValueError)


# ------------------------------------------------------------------------------------------ bad records
@pytest.mark.parametrize(("record", "message"), [
    ({**FORMED, "evnet_id": "typo"}, "more fields than the schema specifies: evnet_id"),
    ({k: v for k, v in FORMED.items() if k != "timestamp"}, "timestamp"),
    ({**FORMED, "timestamp": "yesterday"}, r"MemoryEvent.timestamp = 'yesterday', expected long"),
    ({**FORMED, "event_type": "memory_exploded"}, "expected a symbol of memstream.memory.EventType"),
    ({**DELETED, "event_type": "memory_formed"}, r"MemoryFormedPayload.content = None, expected string"),
    (None, "record does not fit schema memory_event current"),
])
def test_records_that_do_not_fit_raise_encode_error(record, message):
    with pytest.raises(wire.RecordEncodeError, match=message):
        CodecFactory().codec("memory_event").encode(record)


# ------------------------------------------------------------------------------------------------- keys
def test_keys():
    assert wire.decode_key(wire.encode_key("mb-1/nøde-🙂")) == "mb-1/nøde-🙂"
    with pytest.raises(wire.InvalidKeyError, match=r"not valid UTF-8 \(byte 0xff at offset 1\)"):
        wire.decode_key(b"a\xffb")
    with pytest.raises(wire.InvalidKeyError, match="has no key"):
        wire.decode_key(None)
    with pytest.raises(wire.InvalidKeyError, match="must be a str, got int"):
        wire.encode_key(7)
    with pytest.raises(wire.InvalidKeyError, match="not encodable as UTF-8"):
        wire.encode_key("\ud800")
