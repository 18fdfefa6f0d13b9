"""Kafka record bytes <-> record dicts, in the two wire formats memstream speaks.

Values (one ``ValueCodec`` per schema stem, built by a ``CodecFactory``):

* Confluent Schema Registry framing, written when a registry is configured:
  ``0x00`` + 4-byte big-endian schema id + Avro binary body. Subjects follow TopicNameStrategy
  (``<topic>-value``). ``CodecFactory.register(topic_names)`` registers every schema once at startup;
  encoding never calls the registry.
* Avro single-object encoding, written when no registry is configured:
  ``0xC3 0x01`` + 8-byte CRC-64-AVRO fingerprint (little-endian, as the Avro spec says) + body.

Decoding accepts both, always, and a third framing it never writes:

* Apicurio Registry's serializer with headers (``apicurio.registry.headers.enabled=true``, the
  default of its 2.x serde): the schema reference rides in record headers — ``apicurio.value.globalId``
  or ``apicurio.value.contentId``, each an 8-byte big-endian long — and the value is the raw Avro
  body (no magic byte). ``ValueCodec.decode_message(value, headers)`` reads it; a contentId is the id
  the Confluent-compatible API serves, a globalId is looked up in Apicurio's own API
  (``/apis/registry/v2/ids/globalIds/<id>``, beside the ``/apis/ccompat/...`` URL configured).
 The writer schema is found by schema id (cached; an id this process
has not seen is fetched from the registry once) or by fingerprint (the current and every released
version under ``schemas/``), and the body is resolved into the current schema (Avro schema
resolution: defaults fill missing fields, unknown enum symbols read as the enum's default).

Records are plain dicts with the schema's field names. A union field annotated with
``"memstream.branch_by"`` in its .avsc (``MemoryEvent.payload`` by ``event_type``,
``SessionEvent.data`` by ``type``) is written as the branch its discriminator names, never as
fastavro's best guess (``MemoryAccessedPayload`` and ``MemoryDeletedPayload`` look alike). A union
value may also be given as fastavro's ``(branch_full_name, value)`` tuple to pick the branch.
Encoding is strict: a key the schema does not know, or a missing field without default, is an error.

Keys are UTF-8 strings: ``encode_key`` / ``decode_key``.

Errors: everything wrong with the bytes or the record raises a subclass of ``WireFormatError``
(a ``ValueError``; the message names what is wrong) — the data's fault, so dead-letter it. A registry
that cannot be reached, refuses a registration, or a schema not registered before encoding raises
``RegistryError`` (a ``RuntimeError``) — not the data's fault, so do not dead-letter the record.
"""

from __future__ import annotations

import enum
import io
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.validation import ValidationError, validate

from streams.contracts import catalog, schemas
from streams.contracts.schemas import SchemaSet, SchemaVersion

CONFLUENT_MAGIC = b"\x00"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_CONFLUENT_HEADER = 5  # magic + 4-byte id
_SINGLE_OBJECT_HEADER = 10  # 2-byte magic + 8-byte fingerprint
_REFUSED_IDS_KEPT = 1024  # bound on the cache of ids that named no usable schema
REGISTRY_TIMEOUT_S = 30  # one request to the Schema Registry (the CLI's tools; a worker's: MEMSTREAM_REGISTRY_TIMEOUT_S)


class WireFormat(enum.Enum):
    """The two value framings."""

    CONFLUENT = "confluent"  # 0x00 + schema id (big-endian int32) + body
    SINGLE_OBJECT = "single-object"  # C3 01 + CRC-64-AVRO fingerprint (little-endian) + body


# --------------------------------------------------------------------------------------------- errors
class WireFormatError(ValueError):
    """Bytes that are not a record of the expected schema, or a record that does not fit its schema."""


class UnknownMagicByteError(WireFormatError):
    """The value starts with neither 0x00 (Confluent framing) nor C3 01 (single-object encoding)."""


class TruncatedMessageError(WireFormatError):
    """The value ends inside the header or inside the Avro body."""


class UnknownSchemaIdError(WireFormatError):
    """Confluent framing names a schema id that neither this process nor the registry knows."""


class UnknownFingerprintError(WireFormatError):
    """Single-object encoding names a fingerprint of no current or released schema."""


class MalformedBodyError(WireFormatError):
    """The Avro body does not decode with its writer schema (bad data, or bytes left over after it)."""


class IncompatibleSchemaError(WireFormatError):
    """The writer schema cannot be resolved into the reader schema (Avro schema resolution failed)."""


class UnknownEnumSymbolError(IncompatibleSchemaError):
    """The writer used an enum symbol the reader does not have, and the reader's enum has no default."""


class RecordEncodeError(WireFormatError):
    """A record that does not fit the schema it is written with."""


class InvalidKeyError(WireFormatError):
    """A key that is not a UTF-8 string."""


class ApicurioHeaderError(WireFormatError):
    """Apicurio serde headers that cannot be read: an id header that is not 8 bytes, a JSON body encoding."""


class RegistryError(RuntimeError):
    """The Schema Registry is unreachable or refused a request, or a schema was never registered."""


# ------------------------------------------------------------------------------------------------ keys
def encode_key(key: str) -> bytes:
    """A record key as UTF-8 bytes."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"record key must be a str, got {type(key).__name__}")
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"record key {key!r} is not encodable as UTF-8: {exc.reason}") from exc


def decode_key(data: bytes | None) -> str:
    """A record key from its UTF-8 bytes."""
    if data is None:
        raise InvalidKeyError("record has no key (every memstream topic is keyed)")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidKeyError(
            f"record key is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}): {bytes(data)[:64]!r}"
        ) from exc


def detect_format(data: bytes) -> WireFormat:
    """Which framing a value uses, from its first bytes."""
    if not data:
        raise TruncatedMessageError("empty value: no framing header (expected 0x00 or C3 01)")
    if data[0] == 0x00:
        return WireFormat.CONFLUENT
    if data[:2] == SINGLE_OBJECT_MAGIC:
        return WireFormat.SINGLE_OBJECT
    if data == SINGLE_OBJECT_MAGIC[:1]:
        raise TruncatedMessageError("value is the single byte 0xc3: single-object header C3 01 cut short")
    first = " ".join(f"0x{b:02x}" for b in data[:2])
    hint = "; is the producer writing JSON?" if data[:1] in (b"{", b"[", b'"') else ""
    raise UnknownMagicByteError(
        f"unknown magic byte {first} (expected 0x00 Confluent framing or C3 01 single-object){hint}"
    )


# ----------------------------------------------------------------------------------------- the factory
#: (id, schema text) pairs whose parse a factory keeps (far above what memstream's topics use)
PARSED_TEXTS_MAX = 1024

class CodecFactory:
    """Builds the value codecs of one process and owns what they share: schemas, registry ids, caches."""

    registry_url = ""  # set by from_url; Apicurio's own API (globalId headers) is found beside it

    def __init__(self, registry: SchemaRegistryClient | None = None, schema_set: SchemaSet | None = None) -> None:
        self.registry = registry
        self.apicurio = ApicurioIds(self)
        self.schema_set = schema_set or schemas.default()
        self._ids_by_stem: dict[str, int] = {}
        self._writers_by_id: dict[int, SchemaVersion] = {}
        self._refused_ids: dict[int, WireFormatError] = {}  # ids that named no usable schema, and why
        self._codecs: dict[str, ValueCodec] = {}
        #: (id, schema text) -> its parse: the health probe re-fetches every id it used each round,
        #: and parsing the same text again cost more CPU than the fetch (bounded: PARSED_TEXTS_MAX)
        self._parsed_by_text: dict[tuple[int, str], SchemaVersion] = {}

    @classmethod
    def from_url(cls, registry_url: str, schema_set: SchemaSet | None = None,
                 timeout_s: float = REGISTRY_TIMEOUT_S) -> CodecFactory:
        """A factory for a registry URL (``mock://...`` gives an in-process mock); empty = no registry.
        ``timeout_s`` bounds one request (the client's default waits forever on a registry that
        hangs); a worker passes MEMSTREAM_REGISTRY_TIMEOUT_S."""
        registry = SchemaRegistryClient.new_client({"url": registry_url, "timeout": timeout_s}) if registry_url else None
        factory = cls(registry, schema_set)
        factory.registry_url = registry_url
        return factory

    @property
    def default_format(self) -> WireFormat:
        """Confluent framing with a registry, single-object encoding without."""
        return WireFormat.CONFLUENT if self.registry is not None else WireFormat.SINGLE_OBJECT

    def register(self, topic_names: Iterable[str]) -> dict[str, int]:
        """Register each topic's value schema under ``<topic>-value``; returns {topic: schema id}.

        Call once at startup, before encoding. Idempotent (the registry returns the existing id of an
        identical schema). Without a registry there is nothing to register and the result is empty.
        """
        if self.registry is None:
            return {}
        return {
            topic: self.register_subject(f"{topic}-value", catalog.topic(topic).value_schema) for topic in topic_names
        }

    def register_subject(self, subject: str, stem: str) -> int:
        """Register the current schema of a stem under a subject; returns its id (``register`` uses this)."""
        if self.registry is None:
            raise RegistryError(f"cannot register {stem!r} under {subject!r}: no schema registry is configured")
        version = self.schema_set.get(stem)
        try:
            schema_id = self.registry.register_schema(subject, Schema(version.registry_text, "AVRO"))
        except Exception as exc:  # SchemaRegistryError (refused) or a transport error (unreachable)
            raise RegistryError(f"registering {version.label} under subject {subject!r} failed: {exc}") from exc
        self._ids_by_stem.setdefault(stem, schema_id)
        self._writers_by_id[schema_id] = version
        return schema_id

    def codec(self, stem: str) -> ValueCodec:
        """The codec of a value schema stem (e.g. ``memory_event``); one instance per stem."""
        if stem not in self._codecs:
            self._codecs[stem] = ValueCodec(self, self.schema_set.get(stem))
        return self._codecs[stem]

    def schema_id(self, stem: str) -> int:
        """The registry id used to write a stem (the id of its first registered subject)."""
        if stem not in self._ids_by_stem:
            why = "no schema registry is configured" if self.registry is None else "call CodecFactory.register() first"
            raise RegistryError(f"schema {stem!r} has no registry id: {why}")
        return self._ids_by_stem[stem]

    def writer_by_id(self, schema_id: int) -> SchemaVersion:
        """The writer schema of a Confluent-framed value: cached, else fetched from the registry once.

        An id that names no usable schema (not in the registry, not Avro) is remembered too, so bad
        data does not turn into one registry request per record.
        """
        known = self._writers_by_id.get(schema_id)
        if known is not None:
            return known
        if self.registry is None:
            raise UnknownSchemaIdError(f"schema id {schema_id} is unknown and no schema registry is configured")
        refused = self._refused_ids.get(schema_id)
        if refused is not None:
            raise type(refused)(str(refused))
        try:
            writer = self._fetch(schema_id)
        except WireFormatError as exc:
            if len(self._refused_ids) >= _REFUSED_IDS_KEPT:
                self._refused_ids.clear()
            self._refused_ids[schema_id] = exc
            raise
        self._writers_by_id[schema_id] = writer
        return writer

    def writer_by_fingerprint(self, fingerprint: bytes) -> SchemaVersion:
        """The writer schema of a single-object value: a current or released version."""
        writer = self.schema_set.by_fingerprint.get(fingerprint)
        if writer is None:
            raise UnknownFingerprintError(
                f"schema fingerprint {fingerprint.hex()} is not a current or released memstream schema "
                "(a newer producer with an unreleased schema, or not memstream data)"
            )
        return writer

    def _fetch(self, schema_id: int) -> SchemaVersion:
        """Ask the registry for a schema id and parse what it returns."""
        try:
            fetched = self.registry.get_schema(schema_id)  # type: ignore[union-attr]
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise RegistryError(f"fetching schema id {schema_id} failed: {exc}") from exc
            raise UnknownSchemaIdError(f"schema id {schema_id} is not in the schema registry") from exc
        except Exception as exc:  # transport errors of the registry client
            raise RegistryError(f"fetching schema id {schema_id} failed: {type(exc).__name__}: {exc}") from exc
        if (fetched.schema_type or "AVRO") != "AVRO":
            raise IncompatibleSchemaError(f"schema id {schema_id} is a {fetched.schema_type} schema, not Avro")
        if fetched.references:
            raise IncompatibleSchemaError(f"schema id {schema_id} uses schema references; memstream does not read them")
        version = self._parsed_by_text.get((schema_id, fetched.schema_str))  # type: ignore[arg-type]
        if version is None:
            try:
                version = SchemaVersion.from_source(json.loads(fetched.schema_str), "registry", f"id {schema_id}")  # type: ignore[arg-type]
            except Exception as exc:
                raise IncompatibleSchemaError(f"schema id {schema_id} is not a valid Avro schema: {_shortened(str(exc))}") from exc
            if len(self._parsed_by_text) >= PARSED_TEXTS_MAX:
                self._parsed_by_text.clear()  # a registry with that many distinct schemas: start over
            self._parsed_by_text[(schema_id, fetched.schema_str)] = version  # type: ignore[index]
        if not isinstance(version.parsed, dict) or version.parsed.get("type") != "record":
            # anyone may register `"string"` or an array; no memstream topic carries one
            kind = version.parsed.get("type") if isinstance(version.parsed, dict) else type(version.parsed).__name__
            raise IncompatibleSchemaError(f"schema id {schema_id} is a {_shortened(str(kind), 40)} schema, not a record")
        # A known schema keeps its memstream identity (and the reader's no-resolution fast path).
        return self.schema_set.by_fingerprint.get(version.fingerprint, version)

    # --------------------------------------------- what the registry says now (issue 18: ids kept honest)
    def known_ids(self) -> dict[int, SchemaVersion]:
        """Every schema id this process has used (registered or read), with its schema."""
        return dict(self._writers_by_id)

    def registry_now(self, schema_ids: Iterable[int]) -> dict[int, SchemaVersion | None]:
        """What the registry maps each id to right now (its cache bypassed), None for an id it does
        not have (or that names no usable Avro record). Raises ``RegistryError`` when unreachable."""
        if self.registry is None:
            return {}
        self.registry.clear_caches()
        out: dict[int, SchemaVersion | None] = {}
        for schema_id in schema_ids:
            try:
                out[schema_id] = self._fetch(schema_id)
            except WireFormatError:
                out[schema_id] = None
        return out

    def forget_id(self, schema_id: int) -> None:
        """Drop what this process cached of an id (the registry may map it differently now)."""
        self._writers_by_id.pop(schema_id, None)
        self._refused_ids.pop(schema_id, None)


def confluent_schema_id(data: bytes | None) -> int | None:
    """The schema id of a Confluent-framed value, None for any other value."""
    if data and len(data) >= _CONFLUENT_HEADER and data[0] == 0x00:
        return int.from_bytes(data[1:_CONFLUENT_HEADER], "big")
    return None


def decode_with_shipped_schemas(codec: ValueCodec, data: bytes) -> tuple[dict[str, Any], SchemaVersion]:
    """A Confluent-framed value read without the registry: its body is tried with each version of
    the codec's schema this package ships (current first, then released ones), and the first that
    reads the whole body cleanly wins. For a topic that carries one record type (the DLQ), when
    the registry lost the id or maps it to another schema. Raises the first version's error."""
    if confluent_schema_id(data) is None:
        raise UnknownMagicByteError("not a Confluent-framed value: nothing to read with the shipped schemas")
    first: WireFormatError | None = None
    for version in codec.factory.schema_set.versions(codec.stem):
        try:
            return codec._read_body(data, _CONFLUENT_HEADER, version), version
        except WireFormatError as exc:
            first = first or exc
    assert first is not None  # every stem has at least its current version
    raise first


# ------------------------------------------------------------------------------------------ the codec
class ValueCodec:
    """Encodes records with the current version of one schema; decodes values written with any known version."""

    def __init__(self, factory: CodecFactory, schema: SchemaVersion) -> None:
        self.factory = factory
        self.schema = schema
        self._branch_by = _branch_annotations(schema.parsed)

    @property
    def stem(self) -> str:
        return self.schema.stem

    def encode(self, record: Mapping[str, Any], fmt: WireFormat | None = None) -> bytes:
        """A record as value bytes, in ``fmt`` or the factory's default format."""
        fmt = fmt or self.factory.default_format
        if fmt is WireFormat.CONFLUENT:
            header = CONFLUENT_MAGIC + self.factory.schema_id(self.stem).to_bytes(4, "big")
        else:
            header = SINGLE_OBJECT_MAGIC + self.schema.fingerprint
        out = io.BytesIO()
        out.write(header)
        try:
            schemaless_writer(out, self.schema.parsed, self._pick_branches(record), strict_allow_default=True)
        except Exception as exc:  # fastavro raises ValueError / TypeError / KeyError / AttributeError here
            reason = self._explain(record, exc)
            raise RecordEncodeError(f"record does not fit schema {self.schema.label}: {reason}") from exc
        return out.getvalue()

    def decode(self, data: bytes) -> dict[str, Any]:
        """A record from value bytes in either framing, resolved into the current schema."""
        fmt = detect_format(data)
        if fmt is WireFormat.CONFLUENT:
            if len(data) < _CONFLUENT_HEADER:
                raise TruncatedMessageError(f"value is {len(data)} bytes: Confluent header (5 bytes) cut short")
            writer = self.factory.writer_by_id(int.from_bytes(data[1:_CONFLUENT_HEADER], "big"))
            start = _CONFLUENT_HEADER
        else:
            if len(data) < _SINGLE_OBJECT_HEADER:
                raise TruncatedMessageError(f"value is {len(data)} bytes: single-object header (10 bytes) cut short")
            writer = self.factory.writer_by_fingerprint(bytes(data[2:_SINGLE_OBJECT_HEADER]))
            start = _SINGLE_OBJECT_HEADER
        return self._read_body(data, start, writer)

    def decode_message(self, data: bytes, headers: Headers = None) -> dict[str, Any]:
        """A record from a Kafka message's value and headers: Apicurio's header framing (raw Avro
        body) when an ``apicurio.value.globalId`` / ``contentId`` header is present, else ``decode``."""
        reference = apicurio_reference(headers)
        if reference is None:
            return self.decode(data)
        return self._read_body(data, 0, self.factory.apicurio.writer(*reference))

    def _read_body(self, data: bytes, start: int, writer: SchemaVersion) -> dict[str, Any]:
        body = io.BytesIO(data)
        body.seek(start)
        reader = None if writer.fingerprint == self.schema.fingerprint else self.schema.parsed
        where = f"written with {writer.label} ({writer.name}), read as {self.schema.label}"
        try:
            record = schemaless_reader(body, writer.parsed, reader)
        except SchemaResolutionError as exc:
            why = _shortened(str(exc))  # fastavro's text quotes both schemas whole (tens of KB)
            if "not found in reader symbol list" in str(exc):
                raise UnknownEnumSymbolError(f"unknown enum symbol without a reader default, {where}: {why}") from exc
            raise IncompatibleSchemaError(f"cannot resolve {where}: {why}") from exc
        except EOFError as exc:
            raise TruncatedMessageError(f"Avro body ends early ({len(data) - start} bytes), {where}: {exc}") from exc
        except Exception as exc:  # garbage makes fastavro raise IndexError, UnicodeDecodeError, ValueError, ...
            why = f"{type(exc).__name__}: {exc}"
            raise MalformedBodyError(f"Avro body does not match its schema, {where}: {why}") from exc
        left = len(data) - body.tell()
        if left:
            raise MalformedBodyError(f"{left} trailing bytes after the Avro body, {where}")
        return record  # type: ignore[return-value]

    def _pick_branches(self, record: Mapping[str, Any]) -> Mapping[str, Any]:
        """Name the branch of every ``memstream.branch_by`` union after its discriminator's value."""
        for union_field, discriminator, branches in self._branch_by:
            value = record.get(union_field)
            branch = branches.get(record.get(discriminator))  # type: ignore[arg-type]
            if branch is not None and isinstance(value, Mapping):
                record = {**record, union_field: (branch, value)}
        return record

    def _explain(self, record: Any, exc: Exception) -> str:
        """The clearest reason a record did not encode: fastavro's validator names the field."""
        try:
            validate(self._pick_branches(record), self.schema.parsed, raise_errors=True)
        except ValidationError as invalid:
            expected: dict[str, list[str]] = {}  # a union reports one error per branch: merge them
            for error in invalid.errors:
                expected.setdefault(f"{error.field} = {error.datum!r}", []).append(_describe(error.schema))
            return "; ".join(f"{where}, expected {' or '.join(kinds)}" for where, kinds in expected.items())
        except Exception:  # noqa: BLE001 -- the validator chokes on some malformed inputs; the writer's own message stands
            pass
        return f"{type(exc).__name__}: {exc}"


def _branch_annotations(parsed: Mapping[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(union field, discriminator field, {discriminator value: branch full name}) of a record schema."""
    return [
        (fld["name"], fld["memstream.branch_by"]["field"], dict(fld["memstream.branch_by"]["branches"]))
        for fld in parsed["fields"]
        if "memstream.branch_by" in fld
    ]


def _describe(schema: Any) -> str:
    """A schema in a few words, for error messages."""
    if isinstance(schema, list):
        return " or ".join(map(_describe, schema))
    if isinstance(schema, dict):
        if schema.get("type") == "enum":
            return f"a symbol of {schema['name']} {schema['symbols']}"
        return str(schema.get("name") or schema.get("type"))
    return str(schema)


def _shortened(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


# ------------------------------------------------------------------- Apicurio: schema id in headers
APICURIO_GLOBAL_ID = "apicurio.value.globalId"
APICURIO_CONTENT_ID = "apicurio.value.contentId"
APICURIO_ENCODING = "apicurio.value.encoding"
_APICURIO_ID_BYTES = 8  # Java's ByteBuffer.putLong: a big-endian signed long

Headers = Mapping[str, bytes] | Iterable[tuple[str, bytes | None]] | None


def apicurio_reference(headers: Headers) -> tuple[str, int] | None:
    """``("globalId" | "contentId", id)`` from the headers Apicurio's serializer writes, or None.

    ``headers`` as Kafka clients give them: (name, value) pairs (the last of a name wins, as Java's
    ``Headers.lastHeader``) or a mapping. A globalId wins over a contentId (Apicurio's deserializer
    resolves it first). An ``apicurio.value.encoding`` other than ``BINARY`` is refused: memstream
    reads Avro's binary encoding only.
    """
    if not headers:
        return None
    found = dict(headers.items() if isinstance(headers, Mapping) else headers)
    name = APICURIO_GLOBAL_ID if APICURIO_GLOBAL_ID in found else APICURIO_CONTENT_ID
    if name not in found:
        return None
    encoding = found.get(APICURIO_ENCODING)
    if encoding is not None and bytes(encoding).strip().upper() != b"BINARY":
        raise ApicurioHeaderError(
            f"{APICURIO_ENCODING} is {bytes(encoding)[:20]!r}: memstream reads Avro binary only "
            "(set apicurio.registry.avro.encoding=BINARY on the producer)")
    raw = found[name]
    if raw is None or len(raw) != _APICURIO_ID_BYTES:
        size = "no value" if raw is None else f"{len(raw)} bytes"
        raise ApicurioHeaderError(f"header {name} has {size}; Apicurio writes an 8-byte big-endian long")
    return name.rsplit(".", 1)[1], int.from_bytes(raw, "big", signed=True)


def apicurio_api_url(registry_url: str) -> str | None:
    """Apicurio's own REST API (v2, served by Apicurio 2.x and 3.x) beside a ``.../apis/ccompat/...``
    URL; None when the URL is not an Apicurio ccompat URL (a Confluent registry, a mock)."""
    base, found, _ = registry_url.partition("/apis/ccompat/")
    return f"{base}/apis/registry/v2" if found and base.startswith(("http://", "https://")) else None


class ApicurioIds:
    """Writer schemas of Apicurio header references, cached; an id that names nothing is remembered too.

    A contentId is the id Apicurio's Confluent-compatible API serves, so it goes through
    ``CodecFactory.writer_by_id``. A globalId (one per artifact version) is fetched from Apicurio's
    own API by ``fetch`` (``globalId -> schema text``; by default over HTTP beside the registry URL).
    """

    def __init__(self, factory: CodecFactory, fetch: Callable[[int], str] | None = None) -> None:
        self.factory = factory
        self.fetch = fetch or self._fetch_over_http
        self._by_global_id: dict[int, SchemaVersion | WireFormatError] = {}  # bounded: _REFUSED_IDS_KEPT

    def writer(self, kind: str, schema_id: int) -> SchemaVersion:
        if kind == "contentId":
            return self.factory.writer_by_id(schema_id)
        if schema_id not in self._by_global_id:
            self._by_global_id[schema_id] = self._lookup(schema_id)
        outcome = self._by_global_id[schema_id]
        if isinstance(outcome, WireFormatError):  # remembered: bad data is not one request per record
            raise type(outcome)(str(outcome))
        return outcome

    def _lookup(self, global_id: int) -> SchemaVersion | WireFormatError:
        """The writer of a globalId, or the data error it names (RegistryError propagates: retried)."""
        if len(self._by_global_id) >= _REFUSED_IDS_KEPT:
            self._by_global_id.clear()
        try:
            return self._parse(global_id, self.fetch(global_id))
        except WireFormatError as exc:
            return exc

    def _parse(self, global_id: int, text: str) -> SchemaVersion:
        try:
            version = SchemaVersion.from_source(json.loads(text), "registry", f"globalId {global_id}")
        except Exception as exc:
            raise IncompatibleSchemaError(
                f"Apicurio globalId {global_id} is not an Avro schema: {_shortened(str(exc))}") from exc
        if not isinstance(version.parsed, dict) or version.parsed.get("type") != "record":
            raise IncompatibleSchemaError(f"Apicurio globalId {global_id} is not an Avro record schema")
        return self.factory.schema_set.by_fingerprint.get(version.fingerprint, version)

    def _fetch_over_http(self, global_id: int) -> str:
        api = apicurio_api_url(self.factory.registry_url)
        if api is None:
            raise UnknownSchemaIdError(
                f"record names Apicurio globalId {global_id}, which only Apicurio Registry's own API resolves, "
                f"and the registry URL {self.factory.registry_url or '(none)'!r} is not an Apicurio "
                "/apis/ccompat/ URL (configure the producer with apicurio.registry.use-id=contentId)")
        url = f"{api}/ids/globalIds/{global_id}"
        try:
            with urllib.request.urlopen(url, timeout=15) as answer:
                return answer.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise UnknownSchemaIdError(f"Apicurio globalId {global_id} is not in the registry ({url})") from exc
            raise RegistryError(f"fetching Apicurio globalId {global_id} failed: HTTP {exc.code}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise RegistryError(f"fetching Apicurio globalId {global_id} failed: {type(exc).__name__}: {exc}") from exc
