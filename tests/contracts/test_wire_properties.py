"""Property tests: any bytes decode or raise WireFormatError; any valid record round-trips."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.contracts import catalog, compat, schemas, wire
from streams.contracts.wire import CodecFactory, WireFormat

STEMS = sorted(schemas.default().current)
FACTORY = CodecFactory.from_url("mock://test-properties")
FACTORY.register(t.name for t in catalog.topics())
CONFLUENT_HEADER = b"\x00" + FACTORY.schema_id("memory_event").to_bytes(4, "big")
HEADERS = [b"", CONFLUENT_HEADER] + [b"\xc3\x01" + schemas.fingerprint(stem) for stem in STEMS]

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def avro_values(schema: Any, named: dict[str, dict]) -> st.SearchStrategy:
    """Values of a parsed Avro schema; named union branches as (full_name, value) tuples."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        options = []
        for branch in schema:
            name = branch.get("name", branch["type"]) if isinstance(branch, dict) else branch
            values = avro_values(branch, named)
            options.append(values.map(lambda v, n=name: (n, v)) if name in named else values)
        return st.one_of(options)
    kind = schema["type"] if isinstance(schema, dict) else schema
    simple = {
        "null": st.none(), "boolean": st.booleans(), "int": INT32, "long": INT64,
        "float": st.floats(width=32, allow_nan=False), "double": st.floats(allow_nan=False),
        "bytes": st.binary(max_size=16), "string": st.text(max_size=16),
    }
    if kind in simple:
        return simple[kind]
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(avro_values(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=6), avro_values(schema["values"], named), max_size=3)
    assert kind == "record", kind
    return st.fixed_dictionaries({f["name"]: avro_values(f["type"], named) for f in schema["fields"]})


def records_of(stem: str) -> st.SearchStrategy:
    parsed = schemas.parsed(stem)
    return avro_values(parsed, schemas.named_types(parsed))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(stem=st.sampled_from(STEMS), header=st.sampled_from(HEADERS), body=st.binary(max_size=64))
def test_any_bytes_decode_or_raise_wire_format_error(stem, header, body):
    try:
        FACTORY.codec(stem).decode(header + body)
    except wire.WireFormatError:
        pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), stem=st.sampled_from(STEMS), fmt=st.sampled_from(list(WireFormat)))
def test_valid_records_round_trip(data, stem, fmt):
    record = data.draw(records_of(stem))
    codec = FACTORY.codec(stem)
    assert codec.decode(codec.encode(record, fmt)) == compat.untag(record)


@given(st.text())
def test_text_keys_round_trip(key):
    try:
        encoded = wire.encode_key(key)
    except wire.InvalidKeyError:  # lone surrogates are not UTF-8
        return
    assert wire.decode_key(encoded) == key


@given(st.binary(max_size=32))
def test_any_key_bytes_decode_or_raise_invalid_key(data):
    try:
        assert isinstance(wire.decode_key(data), str)
    except wire.InvalidKeyError:
        pass
