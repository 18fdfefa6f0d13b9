"""The v2 header hints over ``extra`` lines, and the ONE instruction-form predicate (SPEC §4.5).

Port of the seed ``header-hints.d.ts``:

* ``pinned: true`` — only the exact literal ``true`` counts; anything else is absent.
* ``triggers: a, b, c`` — comma-split, trimmed, empties dropped; an empty result is absent.
* ``last-confirmed: YYYY-MM-DD…`` — kept as the raw (trimmed) value when it starts with the
  ISO-date shape ``\\d{4}-\\d{2}-\\d{2}``; anything else is absent.
* ``applies-when: <free text>`` — non-empty trimmed free text.

Grammar of a line (our reading of "a header line"): the key sits at column 0, spelled exactly
as above (lower case), immediately followed by ``:``; the value is the rest of the line,
trimmed. Lines with other keys, non-string items, indented lines and ``key :`` are simply not
hint lines. The FIRST WELL-FORMED line of each key wins: a malformed ``pinned: yes`` does not
block a later ``pinned: true``, and a later duplicate never overrides an earlier good one.
Nothing here raises on bad input.

``is_instruction_entry`` is the single predicate every reader uses (the exposure gate, the
HTTP API, audits): ``frontmatter_type == "feedback"`` or the hints declare ``pinned``,
``triggers`` or ``applies-when``. ``last-confirmed`` is bookkeeping and does not count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypedDict

_LINE = re.compile(r"^(pinned|triggers|last-confirmed|applies-when):(.*)$", re.DOTALL)
_ISO_DATE_PREFIX = re.compile(r"^\d{4}-\d{2}-\d{2}")

# Avro / JSON field names of the hints record (docs/records.md QuarantineEntry.hints).
HINT_FIELDS = ("pinned", "triggers", "lastConfirmedAt", "appliesWhen")


class HeaderHints(TypedDict, total=False):
    pinned: bool
    triggers: list[str]
    lastConfirmedAt: str
    appliesWhen: str


def _parse_value(key: str, raw: str) -> tuple[str, Any] | None:
    value = raw.strip()
    if key == "pinned":
        return ("pinned", True) if value == "true" else None
    if key == "triggers":
        items = [t.strip() for t in value.split(",")]
        items = [t for t in items if t]
        return ("triggers", items) if items else None
    if key == "last-confirmed":
        return ("lastConfirmedAt", value) if _ISO_DATE_PREFIX.match(value) else None
    if key == "applies-when":
        return ("appliesWhen", value) if value else None
    return None  # pragma: no cover - the regex only admits the four keys


def read_header_hints(extra: Iterable[Any] | None) -> HeaderHints:
    """Parse the v2 hints; every field is absent unless a well-formed line was found."""
    hints: dict[str, Any] = {}
    if not extra or isinstance(extra, (str, bytes)):
        return hints  # type: ignore[return-value]
    try:
        lines = list(extra)
    except TypeError:
        return hints  # type: ignore[return-value]
    for line in lines:
        if not isinstance(line, str):
            continue
        m = _LINE.match(line.rstrip("\r\n"))
        if m is None:
            continue
        parsed = _parse_value(m.group(1), m.group(2))
        if parsed is None:
            continue  # malformed = absent; a later well-formed line of the key may still win
        field, value = parsed
        hints.setdefault(field, value)
    return hints  # type: ignore[return-value]


def hints_record(hints: HeaderHints) -> dict[str, Any]:
    """The hints as the Avro record of docs/records.md (every field present, null = absent)."""
    return {name: hints.get(name) for name in HINT_FIELDS}


def is_instruction_entry(frontmatter_type: Any, extra: Iterable[Any] | None) -> bool:
    """THE instruction-form predicate (mechanical, no content heuristics)."""
    if frontmatter_type == "feedback":
        return True
    hints = read_header_hints(extra)
    return bool(hints.get("pinned") or hints.get("triggers") or hints.get("appliesWhen"))
