"""The record schemas: load, parse and fingerprint every ``schemas/**.avsc`` once.

The schemas are package data, ``streams/contracts/avsc/`` (the repo's ``schemas/`` is a symlink to
it), found through ``importlib.resources`` (``schemas_dir()``), so an installed wheel, ``pip install .``
or the Docker image load the same files as a checkout. Layout of that directory (``SCHEMAS_DIR``)::

    schemas/<stem>.avsc                  current version of a record: the single source of truth
    schemas/released/<stem>/v<N>.avsc    every released version, never edited again

Shared named types (``SensitivityLevel``, ``MemorySource``, ``ContentBlock``, ...) are defined in full
in every file that uses them (inline, at their first use). So each file parses on its own with plain
``fastavro.parse_schema``, registers in a Schema Registry without schema references, and is usable by
any Avro tool in any language. The copies must stay identical: the compatibility gate
(``streams/contracts/compat.py``) fails when two files define the same full name differently.

Fingerprints are CRC-64-AVRO of the Parsing Canonical Form, as the 8 bytes that Avro single-object
encoding writes (little-endian, per the Avro spec). ``fastavro.schema.fingerprint`` returns the hex of
exactly those bytes, so ``bytes.fromhex`` of it is the wire form.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

from fastavro import parse_schema
from fastavro.schema import fingerprint as _fingerprint_hex
from fastavro.schema import to_parsing_canonical_form


def schemas_dir() -> Path:
    """The directory of the record schemas, inside the installed ``streams`` package.

    Resolved from the ``streams`` package (not from this module's file), so the answer does not
    depend on which subpackage this module lives in. A package installed as files (a wheel, an
    editable or a plain install) gives a real directory; a zipped import is not supported.
    """
    return Path(str(resources.files("streams") / "contracts" / "avsc"))


SCHEMAS_DIR = schemas_dir()
CURRENT = "current"
_RELEASED_FILE = re.compile(r"^v([1-9][0-9]*)\.avsc$")
_NAMED = ("record", "enum", "fixed")


class SchemaLoadError(ValueError):
    """A schema file that is not valid JSON or not a valid Avro schema; the message names the file."""


@dataclass(frozen=True)
class SchemaVersion:
    """One version of one record schema, parsed, with its canonical form and fingerprint."""

    stem: str  # file stem, e.g. "memory_event"
    version: str  # "current", "v1", "v2", ... (or a registry label for a schema fetched by id)
    source: dict[str, Any] = field(repr=False)  # the JSON as written in the file
    parsed: dict[str, Any] = field(repr=False)  # fastavro.parse_schema(source)
    canonical: str = field(repr=False)  # Avro Parsing Canonical Form
    fingerprint: bytes  # CRC-64-AVRO of `canonical`, wire (little-endian) byte order

    @classmethod
    def from_source(cls, source: dict[str, Any], stem: str, version: str) -> "SchemaVersion":
        """Parse a schema given as JSON data; raises fastavro's errors on an invalid schema."""
        parsed = parse_schema(source, named_schemas={})
        canonical = to_parsing_canonical_form(parsed)
        return cls(stem, version, source, parsed, canonical, bytes.fromhex(_fingerprint_hex(canonical, "CRC-64-AVRO")))

    @property
    def name(self) -> str:
        """Full name of the record, e.g. ``memstream.memory.MemoryEvent``."""
        return self.parsed["name"]

    @property
    def label(self) -> str:
        """``<stem> <version>``, for messages."""
        return f"{self.stem} {self.version}"

    @cached_property
    def registry_text(self) -> str:
        """The schema as registered in a Schema Registry: the file's JSON, compact, docs kept."""
        return json.dumps(self.source, separators=(",", ":"), ensure_ascii=False)


def schema_files(schemas_dir: Path) -> Iterator[tuple[str, str, Path]]:
    """(stem, version, path) of every schema file: current ones, then released ones oldest first."""
    for path in sorted(schemas_dir.glob("*.avsc")):
        yield path.stem, CURRENT, path
    released = schemas_dir / "released"
    for stem_dir in sorted(p for p in released.glob("*") if p.is_dir()):
        numbered = []
        for path in stem_dir.glob("*.avsc"):
            match = _RELEASED_FILE.match(path.name)
            if match is None:
                raise SchemaLoadError(f"{path}: released versions must be named v<N>.avsc")
            numbered.append((int(match.group(1)), path))
        for number, path in sorted(numbered):
            yield stem_dir.name, f"v{number}", path


def load_file(path: Path, stem: str, version: str) -> SchemaVersion:
    """Read and parse one .avsc file; a broken file raises SchemaLoadError naming it."""
    try:
        source = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaLoadError(f"{path}: not readable JSON: {exc}") from exc
    try:
        return SchemaVersion.from_source(source, stem, version)
    except Exception as exc:  # fastavro raises several unrelated types for a bad schema
        raise SchemaLoadError(f"{path}: not a valid Avro schema: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class SchemaSet:
    """Every schema of a schemas directory: the current version and the released versions of each stem."""

    current: dict[str, SchemaVersion]
    released: dict[str, tuple[SchemaVersion, ...]]  # oldest first

    @classmethod
    def load(cls, schemas_dir: Path) -> "SchemaSet":
        """Load a schemas directory; the first broken file raises SchemaLoadError."""
        current: dict[str, SchemaVersion] = {}
        released: dict[str, list[SchemaVersion]] = {}
        for stem, version, path in schema_files(schemas_dir):
            loaded = load_file(path, stem, version)
            if version == CURRENT:
                current[stem] = loaded
            else:
                released.setdefault(stem, []).append(loaded)
        if not current:
            raise SchemaLoadError(f"{schemas_dir}: no *.avsc schema files")
        return cls(current, {stem: tuple(versions) for stem, versions in released.items()})

    def get(self, stem: str) -> SchemaVersion:
        """The current version of a stem."""
        try:
            return self.current[stem]
        except KeyError:
            raise KeyError(f"no schema {stem!r}; known: {', '.join(sorted(self.current))}") from None

    def versions(self, stem: str) -> tuple[SchemaVersion, ...]:
        """Current version first, then the released versions, newest first."""
        return (self.get(stem), *reversed(self.released.get(stem, ())))

    @cached_property
    def by_fingerprint(self) -> dict[bytes, SchemaVersion]:
        """Every known version by fingerprint; on equal fingerprints the current / newest wins."""
        table: dict[bytes, SchemaVersion] = {}
        for stem in self.current:
            for version in self.versions(stem):
                table.setdefault(version.fingerprint, version)
        return table


def named_types(parsed: Any) -> dict[str, dict[str, Any]]:
    """Every named type (record, enum, fixed) defined in a parsed schema, by full name, in definition order."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in _NAMED:
                found.setdefault(node["name"], node)
                for fld in node.get("fields", ()):
                    walk(fld["type"])
            elif kind == "array":
                walk(node["items"])
            elif kind == "map":
                walk(node["values"])

    walk(parsed)
    return found


@cache
def default() -> SchemaSet:
    """The repo's schemas, loaded and parsed once per process."""
    return SchemaSet.load(SCHEMAS_DIR)


def parsed(stem: str) -> dict[str, Any]:
    """The parsed current schema of a stem (for fastavro)."""
    return default().get(stem).parsed


def canonical_form(stem: str) -> str:
    """Parsing Canonical Form of the current schema of a stem."""
    return default().get(stem).canonical


def fingerprint(stem: str) -> bytes:
    """CRC-64-AVRO fingerprint of the current schema of a stem, 8 bytes in wire (little-endian) order."""
    return default().get(stem).fingerprint
