"""The schema compatibility gate.

``check(schemas_dir)`` proves, for every record, that the current schema and every released version
(``schemas/released/<stem>/v<N>.avsc``, all of them: transitive, not just the last) are

* BACKWARD compatible: the current schema, as reader, reads data written with the released version;
* FORWARD compatible: the released version, as reader, reads data written with the current schema.

Apache Avro's own ``ReaderWriterCompatibilityChecker`` (the ``avro`` package) decides each direction
by the specification's resolution rules. Then the pipeline's own reader confirms it by example, with
real schema resolution: a deterministic generator
(``sample_records``) writes records that take every union branch (null and non-null), every enum
symbol, empty and non-empty arrays and maps, plus a few random ones; each is written with one schema
(``fastavro.schemaless_writer``) and read with the other (``fastavro.schemaless_reader``).

It also enforces the conventions of docs/records.md on the current schemas (a ``doc`` on every
record, enum and field; a namespace; optional fields ``["null", T]`` with default null; a default
on every enum; valid ``memstream.branch_by`` annotations) and that a named type repeated in several
files is defined identically everywhere.

``run_check(schemas_dir=None) -> int`` prints one line per schema and version and returns the exit
status (0 = compatible); the CLI calls it.
"""

from __future__ import annotations

import io
import json
import random
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import schemaless_reader, schemaless_writer

from streams.contracts.schemas import (
    CURRENT,
    SCHEMAS_DIR,
    SchemaLoadError,
    SchemaVersion,
    load_file,
    named_types,
    schema_files,
)

BACKWARD = "BACKWARD"
FORWARD = "FORWARD"
_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_MAX_DEPTH = 12  # deeper than this a recursive schema takes its null branch / empty collections
_STRING_ALPHABET = "abc xyz-_/:0189ÅéΩ漢字🙂\n\""


@dataclass(frozen=True)
class Problem:
    """One reason the gate fails."""

    stem: str
    version: str  # the released version compared with, or "current"
    kind: str  # "parse", "convention", "consistency", "released", BACKWARD or FORWARD
    detail: str

    def __str__(self) -> str:
        return f"{self.stem} {self.version} {self.kind}: {self.detail}"


# --------------------------------------------------------------------------------------- the sampler
def sample_records(schema: dict[str, Any], seed: int = 0, random_extra: int = 16, limit: int = 2000) -> list[Any]:
    """Records of a parsed schema that cover every union branch, enum symbol and empty / non-empty collection.

    Each choice point (a union, an enum, an array or map's emptiness) at each position of the schema
    cycles through its options on successive visits, and records are generated until every choice
    point seen has taken all its options (at most ``limit``); then ``random_extra`` records with random
    choices follow. Deterministic for a seed. Named union branches are given as fastavro's
    ``(full_name, value)`` tuples so that the writer takes exactly that branch; ``untag`` removes them.
    """
    sampler = _Sampler(named_types(schema), random.Random(seed))
    records = []
    while len(records) < limit and (not records or not sampler.covered()):
        records.append(sampler.value(schema, "$", 0, cycle=True))
    records.extend(sampler.value(schema, "$", 0, cycle=False) for _ in range(random_extra))
    return records


def untag(value: Any) -> Any:
    """A sampled value without ``(branch_name, value)`` union tuples: what a reader returns."""
    if isinstance(value, tuple):
        return untag(value[1])
    if isinstance(value, dict):
        return {key: untag(item) for key, item in value.items()}
    if isinstance(value, list):
        return [untag(item) for item in value]
    return value


class _Sampler:
    """Walks a parsed schema producing values; remembers how often each choice point was visited."""

    def __init__(self, named: dict[str, dict[str, Any]], rng: random.Random) -> None:
        self.named = named
        self.rng = rng
        self.visits: dict[str, int] = {}
        self.options: dict[str, int] = {}

    def covered(self) -> bool:
        return all(self.visits[path] >= count for path, count in self.options.items())

    def choose(self, path: str, count: int, cycle: bool) -> int:
        visits = self.visits.get(path, 0)
        self.visits[path] = visits + 1
        self.options[path] = count
        return visits % count if cycle else self.rng.randrange(count)

    def value(self, schema: Any, path: str, depth: int, cycle: bool) -> Any:
        if isinstance(schema, str) and schema in self.named:
            schema = self.named[schema]
        if isinstance(schema, list):
            return self._union(schema, path, depth, cycle)
        kind = schema["type"] if isinstance(schema, dict) else schema
        if kind in _PRIMITIVES:
            return self._primitive(kind)
        if kind == "enum":
            return schema["symbols"][self.choose(path, len(schema["symbols"]), cycle)]
        if kind == "fixed":
            return self.rng.randbytes(schema["size"])
        if kind == "record":
            return {f["name"]: self.value(f["type"], f"{path}.{f['name']}", depth + 1, cycle) for f in schema["fields"]}
        if kind in ("array", "map"):
            size = 0 if depth > _MAX_DEPTH or self.choose(path, 2, cycle) == 0 else 1 + self.rng.randrange(3)
            if kind == "array":
                return [self.value(schema["items"], f"{path}[]", depth + 1, cycle) for _ in range(size)]
            return {self._primitive("string") + str(i): self.value(schema["values"], f"{path}{{}}", depth + 1, cycle)
                    for i in range(size)}
        raise ValueError(f"cannot sample schema type {kind!r} at {path}")

    def _union(self, branches: list[Any], path: str, depth: int, cycle: bool) -> Any:
        if depth > _MAX_DEPTH and "null" in branches:
            return None
        branch = branches[self.choose(path, len(branches), cycle)]
        name = self._branch_name(branch)
        value = self.value(branch, f"{path}|{name}", depth + 1, cycle)
        return (name, value) if name in self.named else value

    def _branch_name(self, branch: Any) -> str:
        if isinstance(branch, dict):
            return branch.get("name") or branch["type"]
        return branch

    def _primitive(self, kind: str) -> Any:
        rng = self.rng
        if kind == "null":
            return None
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "int":
            return rng.choice((0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-1000, 1000)))
        if kind == "long":
            return rng.choice((0, 1, -1, 2**63 - 1, -(2**63), rng.randint(0, 2**41)))
        if kind == "float":  # a value float32 holds exactly, so it round-trips
            return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e3, 1e3)))[0]
        if kind == "double":
            return rng.choice((0.0, 1.0, -0.5, rng.uniform(-1e9, 1e9)))
        if kind == "bytes":
            return rng.randbytes(rng.randrange(6))
        return "".join(rng.choice(_STRING_ALPHABET) for _ in range(rng.randrange(9)))


# ----------------------------------------------------------------------------------------- the checks
def check(schemas_dir: Path | None = None) -> list[Problem]:
    """Every problem in a schemas directory (the repo's by default); empty = the gate passes."""
    return _gate(Path(schemas_dir or SCHEMAS_DIR))[0]


def _gate(schemas_dir: Path) -> tuple[list[Problem], dict[str, SchemaVersion], dict[str, list[SchemaVersion]]]:
    """The problems of a schemas directory, with the schemas it loaded."""
    problems, current, released = _load_all(schemas_dir)
    for stem, schema in current.items():
        problems.extend(Problem(stem, CURRENT, "convention", detail) for detail in conventions(schema.parsed))
    problems.extend(_consistency(current))
    for stem, versions in released.items():
        if stem not in current:
            problems.append(Problem(stem, versions[-1].version, "released", "released schema has no current .avsc"))
            continue
        for old in versions:
            problems.extend(compare(current[stem], old))
    return problems, current, released


def compare(new: SchemaVersion, old: SchemaVersion) -> list[Problem]:
    """BACKWARD (new reads old) and FORWARD (old reads new) problems between two versions of a schema.
    Two judges, both must pass: Apache Avro's own reader/writer compatibility checker (the
    specification's resolution rules), and fastavro (the library the pipeline reads with) reading
    sample records written with the other schema — a difference between the rules and the reader we
    run fails too, and the example usually names the field or enum symbol the checker only locates."""
    problems = []
    for direction, writer, reader in ((BACKWARD, old, new), (FORWARD, new, old)):
        # both run: the checker names the rule, the example usually the field or symbol
        errors = [e for e in (_incompatibility(writer, reader), _first_unreadable(writer, reader)) if e]
        if errors:
            problems.append(Problem(new.stem, old.version, direction, "; by example: ".join(errors)))
    return problems


def _incompatibility(writer: SchemaVersion, reader: SchemaVersion) -> str | None:
    """What Apache Avro's `ReaderWriterCompatibilityChecker` finds wrong with `reader` reading
    `writer` data (its kinds of incompatibility, locations and messages), or None."""
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(json.dumps(reader.source)), avro.schema.parse(json.dumps(writer.source)))
    if result.compatibility is SchemaCompatibilityType.compatible:
        return None
    kinds = ", ".join(sorted({i.value for i in result.incompatibilities})) or "incompatible"
    detail = "; ".join(sorted(map(str, result.messages)))
    return (f"{reader.version} reader cannot read {writer.version} data (Avro compatibility checker): {kinds} "
            f"at {', '.join(sorted(result.locations))}{f': {detail}' if detail else ''}")


def _first_unreadable(writer: SchemaVersion, reader: SchemaVersion) -> str | None:
    """Why the first sample written with `writer` cannot be read with `reader`, or None if all can."""
    for record in sample_records(writer.parsed):
        buf = io.BytesIO()
        schemaless_writer(buf, writer.parsed, record)
        buf.seek(0)
        try:
            schemaless_reader(buf, writer.parsed, reader.parsed)
        except Exception as exc:  # fastavro raises SchemaResolutionError, but also KeyError/TypeError on odd schemas
            who = f"{reader.version} reader cannot read {writer.version} data"
            return f"{who}: {type(exc).__name__}: {exc}"
    return None


def conventions(parsed: Any) -> list[str]:
    """Where a parsed schema breaks the conventions of docs/records.md."""
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return ["the top level must be a record"]
    found: list[str] = []
    if not parsed["name"].startswith("memstream."):
        found.append(f"{parsed['name']} is not in a memstream.<area> namespace")
    for where, node in _walk(parsed, parsed["name"]):
        if isinstance(node, dict) and node.get("type") in ("record", "enum", "fixed") and not node.get("doc"):
            found.append(f"{where}: {node['type']} has no doc")
        if isinstance(node, dict) and node.get("type") == "enum" and node.get("default") not in node["symbols"]:
            found.append(f"{where}: enum has no default symbol")
        if isinstance(node, dict) and node.get("type") == "record":
            found.extend(_field_conventions(where, node, top=node is parsed))
    return found


def _field_conventions(where: str, record: dict[str, Any], top: bool) -> Iterator[str]:
    names = {fld["name"] for fld in record["fields"]}
    for fld in record["fields"]:
        at = f"{where}.{fld['name']}"
        if not fld.get("doc"):
            yield f"{at}: field has no doc"
        kind = fld["type"]
        if isinstance(kind, list) and "null" in kind and (kind[0] != "null" or fld.get("default", ...) is not None):
            yield f'{at}: optional field must be ["null", T] with "default": null'
        if "memstream.branch_by" in fld:
            yield from _branch_by_problems(at, fld["memstream.branch_by"], kind, names, top)


def _branch_by_problems(at: str, branch_by: Any, union: Any, names: set[str], top: bool) -> Iterator[str]:
    """memstream.branch_by must sit on a top-level union field and map values of a sibling field to its branches."""
    if not top or not isinstance(union, list) or not isinstance(branch_by, dict):
        yield f"{at}: memstream.branch_by must annotate a top-level union field with {{field, branches}}"
        return
    if branch_by.get("field") not in names:
        yield f"{at}: memstream.branch_by names {branch_by.get('field')!r}, not a field of the record"
    members = {b["name"] if isinstance(b, dict) else b for b in union}
    for value, branch in dict(branch_by.get("branches", {})).items():
        if branch not in members:
            yield f"{at}: memstream.branch_by maps {value!r} to {branch!r}, not a branch of the union"


def _consistency(current: dict[str, SchemaVersion]) -> list[Problem]:
    """Named types defined in several current files must be defined identically."""
    first: dict[str, tuple[str, Any]] = {}
    problems = []
    for stem, schema in current.items():
        for name, definition in named_types(schema.parsed).items():
            shallow = _shallow(definition)
            seen = first.setdefault(name, (stem, shallow))
            if seen[1] != shallow:
                problems.append(Problem(stem, CURRENT, "consistency",
                                        f"{name} differs from its definition in {seen[0]}.avsc"))
    return problems


def _shallow(node: Any, top: bool = True) -> Any:
    """A parsed definition with nested named types replaced by their names (fastavro internals dropped)."""
    if isinstance(node, list):
        return [_shallow(item, False) for item in node]
    if isinstance(node, dict):
        if not top and node.get("type") in ("record", "enum", "fixed"):
            return node["name"]
        return {key: _shallow(value, False) for key, value in node.items() if not key.startswith("__")}
    return node


def _load_all(schemas_dir: Path) -> tuple[list[Problem], dict[str, SchemaVersion], dict[str, list[SchemaVersion]]]:
    problems: list[Problem] = []
    current: dict[str, SchemaVersion] = {}
    released: dict[str, list[SchemaVersion]] = {}
    try:
        files = list(schema_files(schemas_dir))
    except SchemaLoadError as exc:
        return [Problem("-", "-", "parse", str(exc))], current, released
    if not files:
        problems.append(Problem("-", "-", "parse", f"{schemas_dir}: no *.avsc schema files"))
    for stem, version, path in files:
        try:
            loaded = load_file(path, stem, version)
        except SchemaLoadError as exc:
            problems.append(Problem(stem, version, "parse", str(exc)))
            continue
        if version == CURRENT:
            current[stem] = loaded
        else:
            released.setdefault(stem, []).append(loaded)
    return problems, current, released


def _walk(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    """(position, node) of every node of a parsed schema (a named type once, where it is defined)."""
    yield where, node
    if isinstance(node, list):
        for branch in node:
            yield from _walk(branch, where)
    elif isinstance(node, dict):
        if node.get("type") == "record":
            for fld in node.get("fields", ()):
                yield from _walk(fld["type"], f"{where}.{fld['name']}")
        elif node.get("type") == "array":
            yield from _walk(node["items"], f"{where}[]")
        elif node.get("type") == "map":
            yield from _walk(node["values"], f"{where}{{}}")


# -------------------------------------------------------------------------------------------- the CLI
def run_check(schemas_dir: Path | None = None, out: TextIO | None = None) -> int:
    """Run the gate, print one line per schema and version (then the problems), return 0 or 1."""
    out = out or sys.stdout
    problems, current, released = _gate(Path(schemas_dir or SCHEMAS_DIR))
    failed = {(p.stem, p.version, p.kind) for p in problems}
    for stem in sorted(set(current) | set(released)):
        for old in released.get(stem, []):
            verdicts = "  ".join(
                f"{direction} {'FAIL' if (stem, old.version, direction) in failed else 'ok'}"
                for direction in (BACKWARD, FORWARD)
            )
            out.write(f"{stem:<20} {old.version:<4} {verdicts if stem in current else 'no current schema'}\n")
        if stem not in released:
            out.write(f"{stem:<20} -    nothing released yet\n")
    for problem in problems:
        out.write(f"PROBLEM {problem}\n")
    count = sum(len(v) for v in released.values())
    verdict = "FAILED" if problems else "compatible"
    out.write(f"{len(current)} schemas, {count} released versions: {verdict} ({len(problems)} problems)\n")
    return 1 if problems else 0
