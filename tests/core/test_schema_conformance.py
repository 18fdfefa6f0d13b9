"""The core's records are plain dicts with exactly the field names of docs/records.md; this
checks them against the Avro schemas in schemas/ (the single source of truth)."""

import io
import json
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.validation import validate

from streams.core import UserMemory, process_candidate, process_event, sweep_memory

from .factories import candidate, event, formed

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _schema(stem):
    path = SCHEMAS / f"{stem}.avsc"
    if not path.exists():
        pytest.skip(f"{path} not there yet")
    return parse_schema(json.loads(path.read_text()), named_schemas={})


def _roundtrip(schema, record):
    assert validate(record, schema, strict=True)
    buf = io.BytesIO()
    schemaless_writer(buf, schema, record)
    buf.seek(0)
    return schemaless_reader(buf, schema)


def _exercise():
    um = UserMemory("u1")
    outs = []
    outs.append(process_candidate(um, candidate("User prefers dark mode in the editor", embedding=[0.1, 0.2, 0.3], extra=["pinned: true"], frontmatter_type="user", kind="playbook", session_id="s1")))
    for _ in range(4):
        outs.append(process_candidate(um, candidate("User prefers dark mode in the editor")))
    outs.append(process_candidate(um, candidate("User prefers light mode in the editor", valid_from=5)))
    outs.append(process_candidate(um, candidate("secret stuff", sensitivity="secret")))
    outs.append(process_candidate(um, candidate("Always answer in French", source="agent_inferred", frontmatter_type="feedback", extra=["triggers: a, b", "last-confirmed: 2024-01-01"])))
    outs.append(process_event(um, formed("n1", "User lives in Berlin", payload_extra={"source": "bogus"})))
    outs.append(process_event(um, event("memory_accessed", {"node_id": "n1"})))
    outs.append(process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": True})))
    outs.append(process_event(um, event("memory_consolidated", {"action": "reinforce", "existing_node_id": "n1", "new_node_id": None, "reason": "r"})))
    outs.append(process_event(um, event("memory_audit", {"missed_patterns": ['goal: "run a marathon"'], "turn_message": "I want to run a marathon"})))
    outs.append(process_event(um, event("memory_promoted", {"node_id": "n1", "from_confidence": 0.5, "to_confidence": 1.0, "reinforcement_count": 3, "reason": "x"})))
    outs.append(process_event(um, event("memory_decayed", {})))
    outs.append(process_event(um, event("memory_deleted", {"node_id": "n1"})))
    outs.append(sweep_memory(um, 10**13))
    return outs


def test_node_upserts_match_memory_node_schema():
    schema = _schema("memory_node")
    nodes = [n for o in _exercise() for n in o.node_upserts]
    assert nodes
    for n in nodes:
        back = _roundtrip(schema, n)
        assert set(back) == set(n)
        assert {k: v for k, v in back.items() if k not in ("embedding", "confidence")} == {k: v for k, v in n.items() if k not in ("embedding", "confidence")}


def test_ledger_events_match_memory_event_schema():
    schema = _schema("memory_event")
    events = [e for o in _exercise() for e in o.ledger]
    assert {e["event_type"] for e in events} >= {
        "memory_formed", "memory_consolidated", "memory_promoted", "memory_accessed", "memory_pinned",
        "memory_audit", "memory_decayed", "memory_deleted",
    }
    for e in events:
        back = _roundtrip(schema, e)
        assert back["event_id"] == e["event_id"] and back["event_type"] == e["event_type"]


def test_quarantine_entries_match_schema():
    schema = _schema("quarantine_entry")
    entries = [q for o in _exercise() for q in o.quarantined]
    assert entries
    for q in entries:
        back = _roundtrip(schema, q)
        assert back["entry_id"] == q["entry_id"] and back["hints"] == q["hints"]


def test_candidates_match_candidate_schema():
    schema = _schema("candidate_memory")
    from streams.core import validate_candidate

    cand, _ = validate_candidate(candidate("x", embedding=[1.0], extra=["a"], confidence=0.5))
    _roundtrip(schema, cand)
