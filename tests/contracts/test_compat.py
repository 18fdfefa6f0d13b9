"""The compatibility gate passes on the repo and fails on incompatible changes, in the right direction."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from streams.contracts import compat, schemas
from streams.contracts.compat import BACKWARD, FORWARD

REPO_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def copy_schemas(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(REPO_SCHEMAS, target)
    return target


def edit(path: Path, change: Callable[[dict], None]) -> None:
    source = json.loads(path.read_text())
    change(source)
    path.write_text(json.dumps(source, indent=2))


def field(record: dict, name: str) -> dict:
    return next(f for f in record["fields"] if f["name"] == name)


def named(node: object, name: str) -> dict:
    """The inline definition of a named type inside a schema's JSON."""
    if isinstance(node, dict):
        if node.get("name") == name and node.get("type") in ("record", "enum"):
            return node
        children = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        raise KeyError(name)
    for child in children:
        try:
            return named(child, name)
        except KeyError:
            pass
    raise KeyError(name)


def kinds(problems: list[compat.Problem]) -> set[tuple[str, str, str]]:
    return {(p.stem, p.version, p.kind) for p in problems}


# ------------------------------------------------------------------------------------------- the repo
def test_repo_schemas_pass_the_gate():
    assert compat.check() == []


def test_run_check_prints_one_line_per_schema_version():
    out = io.StringIO()
    assert compat.run_check(out=out) == 0
    lines = out.getvalue().splitlines()
    for stem in schemas.default().current:
        assert any(line.split()[:2] == [stem, "v1"] and line.endswith("BACKWARD ok  FORWARD ok") for line in lines)
    assert lines[-1] == "17 schemas, 20 released versions: compatible (0 problems)"


# ------------------------------------------------------------------------------ incompatible changes
def test_new_field_without_default_breaks_backward_only(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "memory_node.avsc",
         lambda s: s["fields"].append({"name": "tier", "type": "string", "doc": "new, no default"}))
    problems = compat.check(root)
    assert kinds(problems) == {("memory_node", "v1", BACKWARD)}
    assert "tier" in problems[0].detail and "current reader cannot read v1 data" in problems[0].detail
    # both judges spoke: Apache Avro's checker (the rule, where) and fastavro's reading (the example)
    assert "Avro compatibility checker): reader_field_missing_default_value" in problems[0].detail
    assert "; by example: " in problems[0].detail


def test_new_field_with_default_is_compatible(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "memory_node.avsc",
         lambda s: s["fields"].append({"name": "tier", "type": ["null", "string"], "default": None, "doc": "new"}))
    assert compat.check(root) == []


def test_removed_field_without_default_breaks_forward_only(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "dead_letter.avsc", lambda s: s["fields"].remove(field(s, "reason")))
    problems = compat.check(root)
    assert kinds(problems) == {("dead_letter", "v1", FORWARD), ("dead_letter", "v2", FORWARD)}
    assert all("reason" in p.detail for p in problems)


def test_removed_enum_symbol_without_default_breaks_backward(tmp_path):
    root = copy_schemas(tmp_path)

    def drop_reinforce(s: dict) -> None:
        action = named(s, "ConsolidationAction")
        action["symbols"].remove("reinforce")
        del action["default"]

    edit(root / "memory_event.avsc", drop_reinforce)
    problems = compat.check(root)
    assert ("memory_event", "v1", BACKWARD) in kinds(problems)
    assert ("memory_event", "v1", FORWARD) not in kinds(problems)
    assert any("reinforce" in p.detail for p in problems if p.kind == BACKWARD)
    assert any(p.kind == "convention" and "enum has no default" in p.detail for p in problems)


def test_removed_enum_symbol_with_default_is_compatible(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "memory_event.avsc", lambda s: named(s, "ConsolidationAction")["symbols"].remove("noop"))
    assert compat.check(root) == []


def test_added_union_branch_breaks_forward(tmp_path):
    root = copy_schemas(tmp_path)

    def add_payload(s: dict) -> None:
        field(s, "payload")["type"].append(
            {"type": "record", "name": "MemoryArchivedPayload", "doc": "new", "fields": [
                {"name": "node_id", "type": "string", "doc": "n"}]})

    edit(root / "memory_event.avsc", add_payload)
    assert kinds(compat.check(root)) == {("memory_event", "v1", FORWARD), ("memory_event", "v2", FORWARD)}


def test_changed_type_breaks_both_directions(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "memory_event.avsc", lambda s: field(s, "version_clock").update(type="string"))
    assert kinds(compat.check(root)) == {("memory_event", v, d) for v in ("v1", "v2") for d in (BACKWARD, FORWARD)}


def test_the_input_reference_is_a_compatible_addition_only_with_its_default(tmp_path):
    """memory_event v2 added `caused_by` (null default): v1 readers and writers stay compatible;
    the same field without its default would break reading v1 data."""
    released_v1 = json.loads((REPO_SCHEMAS / "released" / "memory_event" / "v1.avsc").read_text())
    assert "caused_by" not in [f["name"] for f in released_v1["fields"]]
    assert compat.check() == []
    root = copy_schemas(tmp_path)
    edit(root / "memory_event.avsc", lambda s: field(s, "caused_by").pop("default"))
    problems = compat.check(root)
    assert ("memory_event", "v1", BACKWARD) in kinds(problems)
    assert ("memory_event", "v1", FORWARD) not in kinds(problems)


def test_nested_change_in_a_rare_branch_is_found(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "session_event.avsc", lambda s: field(named(s, "CompactionPrune"), "shadowedTokenCount")
         .update(type="string"))
    assert kinds(compat.check(root)) == {("session_event", "v1", BACKWARD), ("session_event", "v1", FORWARD)}


def test_every_released_version_is_checked_not_just_the_last(tmp_path):
    root = copy_schemas(tmp_path)
    v1 = json.loads((root / "user_turn.avsc").read_text())
    v2 = json.loads(json.dumps(v1))
    v2["fields"].append({"name": "lang", "type": "string", "default": "en", "doc": "language"})
    current = json.loads(json.dumps(v2))
    del field(current, "lang")["default"]  # fine against v2 data (it has lang), not against v1 data
    (root / "released" / "user_turn" / "v2.avsc").write_text(json.dumps(v2))
    (root / "user_turn.avsc").write_text(json.dumps(current))
    assert kinds(compat.check(root)) == {("user_turn", "v1", BACKWARD)}
    out = io.StringIO()
    assert compat.run_check(root, out) == 1
    assert "user_turn            v1   BACKWARD FAIL  FORWARD ok" in out.getvalue()
    assert "user_turn            v2   BACKWARD ok  FORWARD ok" in out.getvalue()


# ---------------------------------------------------------------------- conventions and consistency
def test_shared_type_that_drifts_between_files_is_reported(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "memory_node.avsc",
         lambda s: named(s, "MemorySource").update(doc="a different story"))
    problems = compat.check(root)
    assert [(p.kind, p.detail) for p in problems] == [
        ("consistency", "memstream.memory.MemorySource differs from its definition in candidate_memory.avsc")]


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: field(s, "worker").pop("doc"), "DeadLetter.worker: field has no doc"),
    (lambda s: s.pop("doc"), "memstream.pipeline.DeadLetter: record has no doc"),
    (lambda s: field(s, "worker").update(type=["string", "null"]), 'optional field must be ["null", T]'),
    (lambda s: field(s, "worker").pop("default"), 'optional field must be ["null", T]'),
    (lambda s: s.update(namespace="other"), "not in a memstream.<area> namespace"),
])
def test_conventions(tmp_path, change, message):
    root = copy_schemas(tmp_path)
    edit(root / "dead_letter.avsc", change)
    assert any(p.kind == "convention" and message in p.detail for p in compat.check(root))


def test_branch_by_must_match_the_union(tmp_path):
    root = copy_schemas(tmp_path)
    edit(root / "memory_event.avsc", lambda s: field(s, "payload")["memstream.branch_by"]["branches"]
         .update(memory_pinned="memstream.memory.Nope"))
    edit(root / "session_event.avsc", lambda s: field(s, "data")["memstream.branch_by"].update(field="kind"))
    edit(root / "negotiator_reply.avsc", lambda s: field(named(s, "ForgetResult"), "candidates")
         .update({"memstream.branch_by": {"field": "status", "branches": {}}}))
    details = [p.detail for p in compat.check(root)]
    assert any("NegotiatorReply.forget.candidates: memstream.branch_by must annotate a top-level" in d for d in details)
    assert any("maps 'memory_pinned' to 'memstream.memory.Nope', not a branch" in d for d in details)
    assert any("branch_by names 'kind', not a field" in d for d in details)


def test_broken_and_removed_files_are_problems_not_crashes(tmp_path):
    root = copy_schemas(tmp_path)
    (root / "graph_state.avsc").write_text("{oops")
    (root / "user_turn.avsc").unlink()
    problems = compat.check(root)
    assert ("graph_state", "current", "parse") in kinds(problems)
    assert ("user_turn", "v1", "released") in kinds(problems)
    assert compat.run_check(root, io.StringIO()) == 1


# ------------------------------------------------------------------------------------------ sampling
def test_samples_cover_every_branch_symbol_and_collection_shape():
    parsed = schemas.parsed("memory_event")
    samples = compat.sample_records(parsed)
    assert {s["event_type"] for s in samples} == set(field(parsed, "event_type")["type"]["symbols"])
    assert {s["payload"][0] for s in samples} == {b["name"] for b in field(parsed, "payload")["type"]}
    formed = [s["payload"][1] for s in samples if s["payload"][0].endswith("MemoryFormedPayload")]
    assert {f["sensitivity"] if f["sensitivity"] is None else f["sensitivity"][1] for f in formed} == {
        None, "none", "personal", "medical", "financial", "secret"}
    audits = [s["payload"][1]["missed_patterns"] for s in samples if s["payload"][0].endswith("AuditPayload")]
    assert [] in audits and any(audits)
    assert compat.sample_records(parsed) == samples  # deterministic


def test_sampler_stops_on_recursive_schemas():
    node = {"type": "record", "name": "memstream.t.Node", "doc": "n", "fields": [
        {"name": "next", "type": ["null", "memstream.t.Node"], "default": None, "doc": "n"},
        {"name": "children", "type": {"type": "array", "items": "memstream.t.Node"}, "default": [], "doc": "c"}]}
    parsed = schemas.SchemaVersion.from_source(node, "node", "current").parsed
    assert len(compat.sample_records(parsed, random_extra=2)) >= 2


def test_untag():
    assert compat.untag({"a": ("x.Y", {"b": [("x.Z", 1)]})}) == {"a": {"b": [1]}}
