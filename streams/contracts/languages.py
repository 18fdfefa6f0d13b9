"""`python -m streams.contracts`: the generated artefacts for other languages, under `contracts/`.

- `contracts/typescript/memstream.d.ts`: every record as the **avsc** npm library returns it
  with its default options (what `@kafkajs/confluent-schema-registry` decodes with): numbers for
  int/long/float/double, `Uint8Array` (avsc gives a Buffer) for bytes/fixed, string literal
  unions for enums, `T | null` for a union of null and one type, and avsc's *wrapped* form
  (`{"<branch full name>": value}`) for a union avsc finds ambiguous (`wrapUnions: 'auto'`:
  two branches in one bucket, e.g. two records) — `MemoryEvent.payload`, `SessionEvent.data`.
- `contracts/fingerprints.json`: per record, the CRC-64-AVRO fingerprint (hex of the 8 bytes
  in single-object wire order, little-endian) of the current schema and of each released one.
- `contracts/asyncapi.json`: the AsyncAPI 3.0 document of the catalog (default settings).

The sources are `schemas/*.avsc` and `streams/contracts/catalog.py`; `tests/contracts/test_contracts.py` fails when
a file differs from its regeneration, and decodes every record kind with avsc to type-check the
result against the `.d.ts`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streams.contracts import asyncapi, catalog, schemas
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "contracts"
TS_FILE = CONTRACTS / "typescript" / "memstream.d.ts"
FINGERPRINTS_FILE = CONTRACTS / "fingerprints.json"
ASYNCAPI_FILE = CONTRACTS / "asyncapi.json"

_NUMBERS = ("int", "long", "float", "double")
_TS_PRIMITIVE = {"null": "null", "boolean": "boolean", "string": "string", "bytes": "Uint8Array",
                 **{n: "number" for n in _NUMBERS}}


def _bucket(schema: Any, named: dict[str, dict]) -> str:
    """avsc's `getTypeBucket`: which JavaScript kind of value a branch decodes to."""
    kind = _kind(schema, named)
    if kind in _NUMBERS:
        return "number"
    if kind in ("bytes", "fixed"):
        return "buffer"
    if kind == "enum":
        return "string"
    if kind in ("map", "record", "error"):
        return "object"
    return kind


def _kind(schema: Any, named: dict[str, dict]) -> str:
    if isinstance(schema, str):
        return named[schema]["type"] if schema in named else schema
    return schema["type"] if isinstance(schema, dict) else "union"


def _branch_name(schema: Any, named: dict[str, dict]) -> str:
    """avsc's `branchName`: a named type's full name, else the type's name."""
    if isinstance(schema, str):
        return schema
    return schema.get("name") if schema.get("type") in ("record", "enum", "fixed", "error") else schema["type"]


class _Emitter:
    def __init__(self) -> None:
        self.named: dict[str, dict] = {}
        self.decls: dict[str, str] = {}  # full name -> declaration

    @staticmethod
    def short(full: str) -> str:
        return full.rsplit(".", 1)[-1]

    def collect(self, schema: Any) -> None:
        """Register every named type of a parsed schema (fastavro's parse: full names)."""
        if isinstance(schema, list):
            for branch in schema:
                self.collect(branch)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "enum", "fixed", "error"):
                self.named.setdefault(schema["name"], schema)
                for f in schema.get("fields", ()):
                    self.collect(f["type"])
            elif kind == "array":
                self.collect(schema["items"])
            elif kind == "map":
                self.collect(schema["values"])

    def ts(self, schema: Any) -> str:
        if isinstance(schema, list):
            return self.union(schema)
        if isinstance(schema, str):
            return self.short(schema) if schema in self.named else _TS_PRIMITIVE[schema]
        kind = schema["type"]
        if kind in ("record", "enum", "fixed", "error"):
            return self.short(schema["name"])
        if kind == "array":
            return f"Array<{self.ts(schema['items'])}>"
        if kind == "map":
            return f"{{ [key: string]: {self.ts(schema['values'])} }}"
        return _TS_PRIMITIVE[kind]

    def union(self, branches: list) -> str:
        buckets = [_bucket(b, self.named) for b in branches]
        if len(set(buckets)) == len(buckets):  # unambiguous: avsc returns the value as is
            return " | ".join(self.ts(b) for b in branches)
        return " | ".join("null" if _kind(b, self.named) == "null"
                          else f'{{ "{_branch_name(b, self.named)}": {self.ts(b)} }}' for b in branches)

    def declare(self, full: str) -> str:
        schema = self.named[full]
        name, doc = self.short(full), _comment(schema.get("doc"), "")
        if schema["type"] == "enum":
            return f"{doc}export type {name} = {' | '.join(json.dumps(s) for s in schema['symbols'])};\n"
        if schema["type"] == "fixed":
            return f"{doc}export type {name} = Uint8Array; // fixed({schema['size']})\n"
        lines = [f"{doc}export interface {name} {{"]
        for f in schema["fields"]:
            lines.append(_comment(f.get("doc"), "  ") + f"  {f['name']}: {self.ts(f['type'])};")
        return "\n".join(lines) + "\n}\n"


def _comment(doc: str | None, indent: str) -> str:
    if not doc:
        return ""
    return f"{indent}/** {' '.join(doc.replace('*/', '* /').split())} */\n"


def typescript() -> str:
    """The `.d.ts` text for every current schema (named types once, in first-seen order)."""
    from fastavro import parse_schema

    emitter = _Emitter()
    roots: dict[str, str] = {}
    current = schemas.default().current
    for stem in sorted(current):
        parsed = parse_schema(json.loads(current[stem].registry_text), _write_hint=False)
        emitter.collect(parsed)
        roots[stem] = parsed["name"]  # type: ignore[call-overload, index]
    shorts = [emitter.short(n) for n in emitter.named]
    clash = {s for s in shorts if shorts.count(s) > 1}
    if clash:
        raise ValueError(f"named types share a short name across namespaces: {sorted(clash)}")
    out = [
        "// Generated by `python -m streams.contracts` from schemas/*.avsc: do not edit.",
        "// Records as the avsc npm library decodes them with its default options (wrapUnions: 'auto'):",
        "// long -> number, bytes -> Buffer (a Uint8Array), enums -> string literals, [null, T] -> T | null,",
        "// an ambiguous union (several records) -> { \"<branch full name>\": value } (docs/contract.md#typescript).",
        "// A compacted topic's null value (tombstone) is not decoded: check message.value === null first.",
        "",
    ]
    out += [emitter.declare(full) for full in emitter.named]
    out.append("/** The value record of each topic (streams/contracts/catalog.py). */")
    out.append("export interface TopicValues {")
    for t in catalog.topics():
        out.append(f'  "{t.name}": {emitter.short(roots[t.value_schema])};')
    out.append("}")
    out.append("export type TopicName = keyof TopicValues;")
    out.append("export type TopicValue<T extends TopicName> = TopicValues[T];")
    return "\n".join(out) + "\n"


def fingerprints() -> str:
    """{stem: {"current": hex, "v1": hex, ...}}: the 8 fingerprint bytes in single-object wire order."""
    schema_set = schemas.default()
    table: dict[str, dict[str, str]] = {}
    for stem in sorted(schema_set.current):
        entry = {"current": schema_set.current[stem].fingerprint.hex()}
        for version in schema_set.released.get(stem, ()):
            entry[version.version] = version.fingerprint.hex()
        table[stem] = entry
    return json.dumps({"algorithm": "CRC-64-AVRO of the Parsing Canonical Form, little-endian (wire order)",
                       "schemas": table}, indent=2) + "\n"


def asyncapi_document() -> str:
    return asyncapi.render(Settings()) + "\n"


FILES = {TS_FILE: typescript, FINGERPRINTS_FILE: fingerprints, ASYNCAPI_FILE: asyncapi_document}


def main() -> None:
    for path, make in FILES.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
