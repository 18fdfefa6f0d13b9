"""The .avsc files: complete, conventional, self-contained, and fingerprinted the way the Avro spec says."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro
import pytest

from streams.contracts import schemas

REPO_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

# Top-level field names exactly as docs/records.md names them.
FIELDS = {
    "memory_event": ["event_id", "motebit_id", "device_id", "timestamp", "version_clock", "event_type", "payload",
                     "caused_by"],
    "candidate_memory": ["candidate_id", "motebit_id", "content", "sensitivity", "source", "memory_type", "confidence",
                         "valid_from", "timestamp", "embedding", "frontmatter_type", "extra", "supersedes", "kind",
                         "session_id"],
    "user_turn": ["turn_id", "motebit_id", "timestamp", "user_message", "agent_reply", "tagged_memories"],
    "memory_node": ["node_id", "motebit_id", "content", "sensitivity", "source", "memory_type", "confidence",
                    "reinforcement_count", "half_life_ms", "created_at", "updated_at", "valid_from", "valid_until",
                    "superseded_by", "pinned", "promoted", "instruction_form", "last_accessed_at", "access_count",
                    "content_fingerprint", "embedding", "frontmatter_type", "kind", "session_id", "origin_event_id"],
    "quarantine_entry": ["entry_id", "motebit_id", "candidate", "reason", "hints", "quarantined_at"],
    "session_event": ["sessionId", "seq", "type", "ts", "ignorable", "data"],
    "graph_event": ["ts", "graphId", "nodeId", "event", "status", "signalType", "agent", "startedAt", "completedAt",
                    "budget"],
    "negotiator_request": ["request_id", "user_id", "op", "kind", "content", "sessionId", "memoryId", "description",
                           "timestamp"],
    "negotiator_reply": ["request_id", "user_id", "op", "remembered", "forget", "error", "timestamp"],
    "compaction_ledger": ["sessionId", "lastSeq", "openCompactionId", "compactions", "tokensRemoved", "tokensAdded",
                          "tokensSaved", "violationCount", "errorCount"],
    "graph_state": ["graphId", "phase", "nodes", "budget", "degradedNotifications", "stalledNodes", "updatedAt",
                    "eventCount"],
    "analytics_window": ["motebit_id", "window", "window_start", "window_end", "formed", "accessed", "deleted",
                         "merged", "superseded", "promoted", "redacted", "quarantined", "dead_lettered",
                         "compaction_tokens_saved", "graph_cost_usd", "updated_at"],
    "dead_letter": ["original_topic", "original_partition", "original_offset", "original_key", "original_value",
                    "original_size", "original_sha256", "stage", "reason", "error_class", "failed_at", "worker"],
    "shipper_position": ["shipper", "file", "inode", "offset", "committed_at"],
    "access_audit": ["audit_id", "motebit_id", "action", "token_name", "old_value", "new_value", "requested_at",
                     "applied_at", "worker"],
    "erase_request": ["request_id", "motebit_id", "timestamp", "requested_by", "step", "nodes_erased", "node_ids",
                      "node_ids_digest"],
    "erasure_receipt": ["receipt_id", "request_id", "motebit_id", "requested_at", "requested_by", "nodes_erased",
                        "node_ids", "node_ids_omitted", "node_ids_digest", "relay_tombstones",
                        "negotiator_memories_erased", "negotiator_memory_ids", "relay_policy_removed",
                        "fingerprints_kept", "steps"],
}

PAYLOAD_FIELDS = {
    "MemoryFormedPayload": ["node_id", "content", "sensitivity", "source", "redacted", "redacted_sensitivity",
                            "redacted_reason", "valid_from", "valid_until"],
    "MemoryAccessedPayload": ["node_id"],
    "MemoryPinnedPayload": ["node_id", "pinned"],
    "MemoryDeletedPayload": ["node_id"],
    "MemoryConsolidatedPayload": ["action", "existing_node_id", "new_node_id", "reason", "superseded_valid_until"],
    "MemoryAuditPayload": ["missed_patterns", "turn_message"],
    "MemoryPromotedPayload": ["node_id", "from_confidence", "to_confidence", "reinforcement_count", "reason"],
    "MemoryDecayedPayload": [],
}


def load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO exactly as the Avro specification's reference code computes it."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp & 0xFFFFFFFFFFFFFFFF)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_every_documented_record_has_a_schema_with_the_documented_fields():
    assert set(schemas.default().current) == set(FIELDS)
    for stem, names in FIELDS.items():
        assert [f["name"] for f in schemas.parsed(stem)["fields"]] == names, stem


def test_memory_event_payloads_are_the_eight_seed_records():
    payload = next(f for f in schemas.parsed("memory_event")["fields"] if f["name"] == "payload")
    found = {branch["name"].rsplit(".", 1)[1]: [f["name"] for f in branch["fields"]] for branch in payload["type"]}
    assert found == PAYLOAD_FIELDS


@pytest.mark.parametrize("path", sorted(REPO_SCHEMAS.rglob("*.avsc")), ids=lambda p: str(p.relative_to(REPO_SCHEMAS)))
def test_each_file_parses_on_its_own_with_plain_fastavro(path):
    parsed = fastavro.parse_schema(load_json(path))
    assert parsed["name"].startswith("memstream.")


def test_every_schema_has_a_released_v1():
    for stem in FIELDS:
        assert (REPO_SCHEMAS / "released" / stem / "v1.avsc").is_file(), stem
        assert schemas.default().released[stem][0].version == "v1"


def test_enums_default_and_fail_closed_sensitivity():
    named = schemas.named_types(schemas.parsed("memory_event"))
    levels = ["none", "personal", "medical", "financial", "secret"]
    assert named["memstream.memory.SensitivityLevel"]["symbols"] == levels
    assert named["memstream.memory.SensitivityLevel"]["default"] == "secret"
    assert named["memstream.memory.MemorySource"]["default"] == "unknown"
    assert named["memstream.memory.EventType"]["default"] == "unknown"
    for stem in FIELDS:
        for name, definition in schemas.named_types(schemas.parsed(stem)).items():
            if definition["type"] == "enum":
                assert definition["default"] in definition["symbols"], name


def test_branch_by_names_a_payload_for_every_event_type():
    fields = {f["name"]: f for f in schemas.parsed("memory_event")["fields"]}
    branches = fields["payload"]["memstream.branch_by"]["branches"]
    event_types = fields["event_type"]["type"]["symbols"]
    assert set(branches) == set(event_types) - {"unknown"}
    assert set(branches.values()) == {b["name"] for b in fields["payload"]["type"]}


def test_fingerprint_is_crc64_avro_of_canonical_form_little_endian():
    assert fastavro.schema.fingerprint('"null"', "CRC-64-AVRO") == (7195948357588979594).to_bytes(8, "little").hex()
    for stem in FIELDS:
        version = schemas.default().get(stem)
        assert version.canonical == fastavro.schema.to_parsing_canonical_form(version.parsed)
        assert schemas.fingerprint(stem) == crc64_avro(version.canonical.encode()).to_bytes(8, "little")
        assert schemas.canonical_form(stem) == version.canonical


def test_fingerprints_are_distinct_across_records():
    prints = [schemas.fingerprint(stem) for stem in FIELDS]
    assert len(set(prints)) == len(prints)


def test_loaded_once():
    assert schemas.default() is schemas.default()
    assert schemas.parsed("memory_event") is schemas.parsed("memory_event")


def test_registry_text_is_the_file_json(tmp_path):
    version = schemas.default().get("dead_letter")
    assert json.loads(version.registry_text) == load_json(REPO_SCHEMAS / "dead_letter.avsc")


def test_broken_file_is_named(tmp_path):
    (tmp_path / "broken.avsc").write_text('{"type": "record", "name": "X", "fields": [{"name": "a"}]}')
    with pytest.raises(schemas.SchemaLoadError, match="broken.avsc"):
        schemas.SchemaSet.load(tmp_path)
    (tmp_path / "broken.avsc").write_text("{not json")
    with pytest.raises(schemas.SchemaLoadError, match="broken.avsc: not readable JSON"):
        schemas.SchemaSet.load(tmp_path)


def test_released_files_must_be_numbered(tmp_path):
    (tmp_path / "x.avsc").write_text('{"type": "record", "name": "memstream.t.X", "doc": "x", "fields": []}')
    (tmp_path / "released" / "x").mkdir(parents=True)
    (tmp_path / "released" / "x" / "latest.avsc").write_text("{}")
    with pytest.raises(schemas.SchemaLoadError, match="v<N>.avsc"):
        schemas.SchemaSet.load(tmp_path)


def test_versions_and_fingerprint_lookup(tmp_path):
    source = {"type": "record", "name": "memstream.t.X", "doc": "x", "fields": []}
    newer = {**source, "fields": [{"name": "a", "type": "long", "default": 0, "doc": "a"}]}
    (tmp_path / "x.avsc").write_text(json.dumps(newer))
    for number, body in ((1, source), (2, newer)):
        (tmp_path / "released" / "x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "released" / "x" / f"v{number}.avsc").write_text(json.dumps(body))
    loaded = schemas.SchemaSet.load(tmp_path)
    assert [v.version for v in loaded.versions("x")] == ["current", "v2", "v1"]
    # v2 has the same canonical form as current: the lookup returns the current version.
    assert loaded.by_fingerprint[loaded.get("x").fingerprint].version == "current"
    assert loaded.by_fingerprint[loaded.released["x"][0].fingerprint].version == "v1"
    with pytest.raises(KeyError, match="no schema 'nope'"):
        loaded.get("nope")
