"""The closed vocabularies of the memory wire (SPEC §3.1) and how the core reads them.

Everything here is total and side-effect free:

* ``SensitivityLevel`` is ordered ``none < personal < medical < financial < secret``.
  A missing sensitivity is *not* defaulted here: callers reject it (fail closed, §4.1).
* ``MemorySource`` values outside the vocabulary (including the Avro enum's ``unknown``
  default symbol) degrade to ``None`` (absent) — never to a trusted tier, never a rejection.
* Consolidation actions are read in both vocabularies (wire ``merge|supersede|reject|accept``
  and the reference emitter's ``add|update|reinforce|noop``), case-insensitively (``REINFORCE``
  is ``reinforce``, as the reference lower-cases a decider's action), and always written in the
  wire vocabulary; anything else is an error (the record goes to the dead-letter topic).
"""

from __future__ import annotations

from typing import Any

SENSITIVITY_LEVELS: tuple[str, ...] = ("none", "personal", "medical", "financial", "secret")
_SENSITIVITY_RANK = {name: i for i, name in enumerate(SENSITIVITY_LEVELS)}

MEMORY_SOURCES: frozenset[str] = frozenset(
    {"user_stated", "agent_inferred", "tool_derived", "peer_agent", "consolidation_derived"}
)

MEMORY_TYPES: tuple[str, ...] = ("episodic", "semantic")

EVENT_TYPES: tuple[str, ...] = (
    "memory_formed",
    "memory_accessed",
    "memory_pinned",
    "memory_deleted",
    "memory_consolidated",
    "memory_audit",
    "memory_promoted",
    "memory_decayed",
)

WIRE_ACTIONS: tuple[str, ...] = ("merge", "supersede", "reject", "accept")
_ACTION_ALIASES = {
    "merge": "merge",
    "supersede": "supersede",
    "reject": "reject",
    "accept": "accept",
    # the reference emitter's vocabulary (SPEC §3.1)
    "add": "accept",
    "update": "supersede",
    "reinforce": "merge",
    "noop": "merge",
}


class VocabularyError(ValueError):
    """A value outside a closed vocabulary where the spec says that is an error."""


def is_sensitivity(value: Any) -> bool:
    return isinstance(value, str) and value in _SENSITIVITY_RANK


def sensitivity_rank(level: str) -> int:
    """Position of ``level`` in the order none(0) < personal < medical < financial < secret(4)."""
    try:
        return _SENSITIVITY_RANK[level]
    except (KeyError, TypeError):
        raise VocabularyError(f"unknown sensitivity level {level!r}") from None


def max_sensitivity(*levels: str) -> str:
    return max(levels, key=sensitivity_rank)


def normalize_source(value: Any) -> str | None:
    """A known MemorySource, or ``None`` (absent) for anything else — never an error."""
    if isinstance(value, str) and value in MEMORY_SOURCES:
        return value
    return None


def normalize_action(value: Any) -> str:
    """Map either consolidation vocabulary, in any letter case, onto the wire vocabulary; raise
    on anything else."""
    if isinstance(value, str):
        wire = _ACTION_ALIASES.get(value.lower())
        if wire is not None:
            return wire
    raise VocabularyError(f"unknown consolidation action {value!r}")


def try_normalize_action(value: Any) -> str | None:
    try:
        return normalize_action(value)
    except VocabularyError:
        return None