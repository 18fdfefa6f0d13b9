"""The generated artefacts under contracts/ agree with the schemas and the catalog, and the
TypeScript types describe what avsc really returns.

The avsc check writes sample records of every schema (every union branch, every enum symbol:
`streams.contracts.compat.sample_records`) with fastavro, decodes them with the avsc npm package in node
(default options, as `@kafkajs/confluent-schema-registry` does), turns each decoded value into a
TypeScript literal typed with the generated record type, and runs `tsc --strict --noEmit` on it:
a missing field, an extra field, a numeric enum or an unwrapped ambiguous union fails to compile.
node and npm are needed (the packages are installed once under .memstream/npm).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fastavro import schemaless_writer

from streams.contracts import catalog, compat, languages, schemas

ROOT = Path(__file__).resolve().parents[2]
NPM_DIR = ROOT / ".memstream" / "npm"
NPM_PACKAGES = ("avsc@5.7.9", "typescript@5.9.3")
SAMPLES_PER_SCHEMA = 40


@pytest.mark.parametrize("path", sorted(languages.FILES), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_file_matches_a_regeneration(path):
    assert path.read_text() == languages.FILES[path](), f"{path} is stale: run `python -m streams.contracts`"


def interfaces(text: str) -> dict[str, list[str]]:
    """{interface name: [property names]} of a .d.ts."""
    found = {}
    for m in re.finditer(r"export interface (\w+) \{\n(.*?)^\}", text, re.S | re.M):
        found[m.group(1)] = re.findall(r"^  (\w+): ", m.group(2), re.M)
    return found


def test_every_record_and_field_is_declared_with_string_enums():
    text = languages.typescript()
    declared = interfaces(text)
    for version in schemas.default().current.values():
        for full, named in schemas.named_types(version.parsed).items():
            short = full.rsplit(".", 1)[-1]
            if named["type"] == "record":
                assert declared[short] == [f["name"] for f in named["fields"]], full
            elif named["type"] == "enum":
                assert f"export type {short} = " + " | ".join(json.dumps(s) for s in named["symbols"]) + ";" in text
    topics = re.search(r"export interface TopicValues \{\n(.*?)\n\}", text, re.S).group(1)
    assert len(topics.splitlines()) == len(list(catalog.topics()))


def test_look_alike_unions_are_wrapped_and_nullable_ones_are_not():
    text = languages.typescript()
    assert ('payload: { "memstream.memory.MemoryFormedPayload": MemoryFormedPayload } | '
            '{ "memstream.memory.MemoryAccessedPayload": MemoryAccessedPayload }') in text
    assert 'data: { "memstream.session.CompactionStart": CompactionStart }' in text
    assert "  caused_by: null | InputReference;" in text
    assert "  original_value: null | Uint8Array;" in text


def test_fingerprints_are_the_single_object_header_bytes():
    table = json.loads(languages.fingerprints())["schemas"]
    for stem, version in schemas.default().current.items():
        assert table[stem]["current"] == version.fingerprint.hex()
        assert set(table[stem]) == {"current"} | {v.version for v in schemas.default().released[stem]}
    factory_codec = __import__("streams.contracts.wire", fromlist=["CodecFactory"]).CodecFactory().codec("memory_node")
    header = factory_codec.encode(next(iter(compat.untag(r) for r in compat.sample_records(
        schemas.default().current["memory_node"].parsed, random_extra=0)[:1])))[:10]
    assert header[2:].hex() == table["memory_node"]["current"]


def _safe_longs(value):
    """avsc's default long type refuses integers beyond 2^53: keep the samples within it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else 2**41 + 1
    if isinstance(value, tuple):
        return (value[0], _safe_longs(value[1]))
    if isinstance(value, dict):
        return {k: _safe_longs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_safe_longs(v) for v in value]
    return value


def _npm_tools() -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed")
    NPM_DIR.mkdir(parents=True, exist_ok=True)
    ready = NPM_DIR / f"installed-{'-'.join(NPM_PACKAGES)}"
    if not ready.exists():
        for _attempt in range(2):
            done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(NPM_DIR),
                                   *NPM_PACKAGES], capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                ready.touch()
                break
        else:
            pytest.skip(f"npm could not install {NPM_PACKAGES}: {done.stderr[-500:]}")
    return NPM_DIR / "node_modules"


DECODE_JS = r"""
const avro = require(process.argv[2] + "/avsc");
const input = JSON.parse(require("fs").readFileSync(process.argv[3], "utf8"));
function lit(v) {
  if (v === null) return "null";
  if (Buffer.isBuffer(v)) return "new Uint8Array([" + Array.from(v).join(", ") + "])";
  if (Array.isArray(v)) return "[" + v.map(lit).join(", ") + "]";
  if (typeof v === "object") return "{" + Object.keys(v).map(k => JSON.stringify(k) + ": " + lit(v[k])).join(", ") + "}";
  if (typeof v === "number") return Number.isFinite(v) ? String(v) : (Number.isNaN(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity"));
  return JSON.stringify(v);
}
const out = ['import type * as T from "./memstream";'];
for (const item of input) {
  const type = avro.Type.forSchema(JSON.parse(item.schema));
  item.bodies.forEach((hex, i) => {
    out.push("export const " + item.stem + "_" + i + ": T." + item.root + " = " + lit(type.fromBuffer(Buffer.from(hex, "hex"))) + ";");
  });
}
process.stdout.write(out.join("\n") + "\n");
"""


def test_typescript_types_describe_what_avsc_decodes(tmp_path):
    modules = _npm_tools()
    items = []
    for stem, version in sorted(schemas.default().current.items()):
        bodies = []
        for record in compat.sample_records(version.parsed, random_extra=4)[:SAMPLES_PER_SCHEMA]:
            out = io.BytesIO()
            schemaless_writer(out, version.parsed, _safe_longs(record))
            bodies.append(out.getvalue().hex())
        items.append({"stem": stem, "root": version.parsed["name"].rsplit(".", 1)[-1],
                      "schema": version.registry_text, "bodies": bodies})
    (tmp_path / "input.json").write_text(json.dumps(items))
    (tmp_path / "decode.js").write_text(DECODE_JS)
    shutil.copy(languages.TS_FILE, tmp_path / "memstream.d.ts")
    decoded = subprocess.run(["node", str(tmp_path / "decode.js"), str(modules), str(tmp_path / "input.json")],
                             capture_output=True, text=True, timeout=300)
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    check = tmp_path / "check.ts"
    check.write_text(decoded.stdout)
    assert decoded.stdout.count("export const ") == sum(len(i["bodies"]) for i in items)
    # the wrapped payload union is what avsc returned, not an artefact of the types
    assert '"payload": {"memstream.memory.MemoryFormedPayload": {' in decoded.stdout
    compiled = subprocess.run(["node", str(modules / "typescript" / "bin" / "tsc"), "--strict", "--noEmit",
                               "--target", "es2020", "--module", "commonjs", str(check)],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stdout[-3000:]


def test_a_wrong_type_would_fail_the_check(tmp_path):
    """The check has teeth: a numeric enum (what one generator produced) does not compile."""
    modules = _npm_tools()
    bad = languages.typescript().replace(
        'export type SensitivityLevel = "none" | "personal" | "medical" | "financial" | "secret";',
        "export enum SensitivityLevel { none, personal, medical, financial, secret }")
    (tmp_path / "memstream.d.ts").write_text(bad)
    (tmp_path / "check.ts").write_text('import type * as T from "./memstream";\n'
                                       'export const level: T.SensitivityLevel = "personal";\n')
    compiled = subprocess.run(["node", str(modules / "typescript" / "bin" / "tsc"), "--strict", "--noEmit",
                               str(tmp_path / "check.ts")], capture_output=True, text=True, timeout=300)
    assert compiled.returncode != 0 and "SensitivityLevel" in compiled.stdout
