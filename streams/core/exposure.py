"""The exposure gate (SPEC §4.5).

An instruction-form candidate (the ONE predicate :func:`~streams.core.hints.is_instruction_entry`)
that the user did not state (``source != "user_stated"``, which includes an absent or
unknown source) is held on ``memory.quarantine.v1`` instead of being formed. Every other
candidate goes on to consolidation; instruction-form ones are formed with
``instruction_form=True`` on the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .hints import HeaderHints, hints_record, is_instruction_entry, read_header_hints
from .ids import quarantine_id_for
from .ingest import CANDIDATE_FIELDS

TRUSTED_INSTRUCTION_SOURCE = "user_stated"


@dataclass(frozen=True)
class GateResult:
    instruction_form: bool
    quarantine: bool
    hints: HeaderHints = field(default_factory=dict)  # type: ignore[assignment]
    reason: str | None = None


def declared_instructions(frontmatter_type: Any, extra: Any) -> list[str]:
    """What makes an entry instruction-form (empty = it is not): `type feedback`, `pinned`,
    `triggers`, `applies-when` — the ONE predicate's reasons, in that order."""
    if not is_instruction_entry(frontmatter_type, extra):
        return []
    hints = read_header_hints(extra)
    declared = ["type feedback"] if frontmatter_type == "feedback" else []
    for key, label in (("pinned", "pinned"), ("triggers", "triggers"), ("appliesWhen", "applies-when")):
        if hints.get(key):
            declared.append(label)
    return declared


def content_gate(content: str) -> str | None:
    """The exposure gate for content that arrives without `extra` lines (negotiator `remember`):
    its own lines are read as header lines, and instruction-form content is refused (there is no
    `source` to vouch for it, and a negotiator memory is a rule the client states, never one a
    header hint pins). None = passes; else the reason."""
    declared = declared_instructions(None, content.splitlines())
    if not declared:
        return None
    return (f"instruction-form content ({', '.join(declared)} header line) is refused by the exposure "
            "gate (SPEC §4.5): state the rule as plain text")


def exposure_gate(candidate: Mapping[str, Any]) -> GateResult:
    extra = candidate.get("extra")
    hints = read_header_hints(extra)
    instruction = is_instruction_entry(candidate.get("frontmatter_type"), extra)
    if not instruction:
        return GateResult(False, False, hints)
    if candidate.get("source") == TRUSTED_INSTRUCTION_SOURCE:
        return GateResult(True, False, hints)
    declared = declared_instructions(candidate.get("frontmatter_type"), extra)
    reason = (
        f"instruction-form entry ({', '.join(declared)}) from source "
        f"{candidate.get('source') or 'absent'}, not user_stated"
    )
    return GateResult(True, True, hints, reason)


def quarantine_entry(candidate: Mapping[str, Any], gate: GateResult) -> dict[str, Any]:
    """The QuarantineEntry record (deterministic ``entry_id``; ``quarantined_at`` = the
    candidate's event time)."""
    return {
        "entry_id": quarantine_id_for(candidate["motebit_id"], candidate["candidate_id"]),
        "motebit_id": candidate["motebit_id"],
        "candidate": {f: candidate.get(f) for f in CANDIDATE_FIELDS},
        "reason": gate.reason or "instruction-form entry not stated by the user",
        "hints": hints_record(gate.hints),
        "quarantined_at": int(candidate["timestamp"]),
    }
