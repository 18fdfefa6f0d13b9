"""Graph event-log file naming and line parsing (SPEC §4.9, seed ``graph-events.d.ts.txt``). Pure.

- ``graph_events_hash(graph_id)``: first 12 hex chars of SHA-256 of the UTF-8 graph id;
- ``graph_events_path(directory, graph_id)``: ``directory/graph-events-{hash}.ndjson``;
- ``parse_line(line)``: one ndjson line → a GraphEvent dict (``memstream.graph.GraphEvent``, every
  field present, optional ones ``None``) or a ``ParseError`` (never raises).

The seed's writer omits optional fields when undefined; we also accept an explicit JSON ``null``
for an optional field as "absent". Validation: ``ts`` an integer (an integral float such as
``1.7e12`` is accepted and made int), ``graphId`` a non-empty string, ``event`` one of the five
known kinds (an unknown kind is an error: it goes to the DLQ with its bytes rather than being
silently coerced), the field a kind needs present (``nodeId`` for node events, ``status`` — the
target phase — for ``phase_change``, ``budget`` for ``budget_update``), optional strings strings, optional times integers, ``budget`` an object whose
counters are numbers (a missing counter is 0, extra keys are ignored).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from streams.core.limits import DEFAULT_LIMITS, LimitExceeded, Limits, check_json_depth

GRAPH_EVENT_TYPES = ("node_dispatched", "node_completed", "phase_change", "budget_update", "notification_degraded")
FILE_PREFIX = "graph-events-"
FILE_SUFFIX = ".ndjson"
FILE_RE = re.compile(r"^graph-events-([0-9a-f]{12})\.ndjson$")

# GraphEvent field order (the seed's GraphEventRecord order; also the order the writer emits).
FIELDS = ("ts", "graphId", "nodeId", "event", "status", "signalType", "agent", "startedAt", "completedAt", "budget")
_OPT_STR = ("nodeId", "status", "signalType", "agent")
_OPT_TIME = ("startedAt", "completedAt")
# The field each kind cannot do without (nodeId for node events, the target phase, the snapshot).
_REQUIRED_BY_KIND = {
    "node_dispatched": "nodeId",
    "node_completed": "nodeId",
    "phase_change": "status",
    "budget_update": "budget",
    "notification_degraded": None,  # the kind (status) defaults to "unknown"
}
BUDGET_INT_FIELDS = ("sessionsSpawned", "inputTokens", "outputTokens")
BUDGET_FLOAT_FIELDS = ("costUsd",)


def graph_events_hash(graph_id: str) -> str:
    return hashlib.sha256(graph_id.encode("utf-8")).hexdigest()[:12]


def graph_events_filename(graph_id: str) -> str:
    return f"{FILE_PREFIX}{graph_events_hash(graph_id)}{FILE_SUFFIX}"


def graph_events_path(directory: str | os.PathLike[str], graph_id: str) -> str:
    return os.path.join(os.fspath(directory), graph_events_filename(graph_id))


def file_hash(path_or_name: str | os.PathLike[str]) -> str | None:
    """The ``{hash}`` of a ``graph-events-{hash}.ndjson`` name, or None for any other name."""
    m = FILE_RE.match(os.path.basename(os.fspath(path_or_name)))
    return m.group(1) if m else None


def belongs_to_file(path_or_name: str | os.PathLike[str], graph_id: str) -> bool:
    """Whether ``graph_id`` is the graph this file is named after (the seed reader skips others)."""
    return file_hash(path_or_name) == graph_events_hash(graph_id)


@dataclass(frozen=True)
class ParseError:
    """Why a line is not a GraphEvent. ``kind`` is one of: ``empty``, ``encoding``,
    ``limit.json_depth``, ``corrupt_json``, ``not_object``, ``missing_field``, ``wrong_type``,
    ``unknown_event``."""

    kind: str
    message: str
    field: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_int(v: Any) -> int | None:
    if _is_int(v):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _as_number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def parse_budget(raw: Any) -> dict[str, Any] | ParseError:
    if not isinstance(raw, dict):
        return ParseError("wrong_type", "budget is not an object", "budget")
    out: dict[str, Any] = {}
    for k in BUDGET_INT_FIELDS:
        v = raw.get(k, 0)
        iv = _as_int(v) if v is not None else 0
        if iv is None:
            return ParseError("wrong_type", f"budget.{k} is not an integer: {v!r}", f"budget.{k}")
        out[k] = iv
    for k in BUDGET_FLOAT_FIELDS:
        v = raw.get(k, 0.0)
        fv = _as_number(v) if v is not None else 0.0
        if fv is None:
            return ParseError("wrong_type", f"budget.{k} is not a number: {v!r}", f"budget.{k}")
        out[k] = fv
    return out


def validate_record(obj: Any) -> dict[str, Any] | ParseError:
    """Validate and normalize a decoded JSON object into a full GraphEvent dict."""
    if not isinstance(obj, dict):
        return ParseError("not_object", f"line is JSON {type(obj).__name__}, not an object")
    for k in ("ts", "graphId", "event"):
        if obj.get(k) is None:
            return ParseError("missing_field", f"required field {k!r} is missing", k)
    ts = _as_int(obj["ts"])
    if ts is None:
        return ParseError("wrong_type", f"ts is not an integer epoch-ms: {obj['ts']!r}", "ts")
    if not isinstance(obj["graphId"], str) or not obj["graphId"]:
        return ParseError("wrong_type", f"graphId is not a non-empty string: {obj['graphId']!r}", "graphId")
    if not isinstance(obj["event"], str):
        return ParseError("wrong_type", f"event is not a string: {obj['event']!r}", "event")
    if obj["event"] not in GRAPH_EVENT_TYPES:
        return ParseError("unknown_event", f"unknown event kind {obj['event']!r}", "event")
    out: dict[str, Any] = {f: None for f in FIELDS}
    out.update(ts=ts, graphId=obj["graphId"], event=obj["event"])
    for k in _OPT_STR:
        v = obj.get(k)
        if v is not None and not isinstance(v, str):
            return ParseError("wrong_type", f"{k} is not a string: {v!r}", k)
        out[k] = v
    for k in _OPT_TIME:
        v = obj.get(k)
        if v is not None:
            iv = _as_int(v)
            if iv is None:
                return ParseError("wrong_type", f"{k} is not an integer epoch-ms: {v!r}", k)
            v = iv
        out[k] = v
    if obj.get("budget") is not None:
        b = parse_budget(obj["budget"])
        if isinstance(b, ParseError):
            return b
        out["budget"] = b
    needed = _REQUIRED_BY_KIND[out["event"]]
    if needed is not None and out[needed] is None:
        return ParseError("missing_field", f"{out['event']} requires {needed!r}", needed)
    return out


def parse_line(line: str | bytes, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any] | ParseError:
    """Parse one ndjson line (trailing newline allowed). Never raises: a line whose JSON nests
    deeper than ``limits.max_json_depth`` is the error ``limit.json_depth``."""
    if isinstance(line, (bytes, bytearray)):
        try:
            line = bytes(line).decode("utf-8")
        except UnicodeDecodeError as e:
            return ParseError("encoding", f"line is not UTF-8: {e}")
    text = line.strip()
    if not text:
        return ParseError("empty", "blank line")
    try:
        check_json_depth("line", text, limits)  # before json.loads, which recurses per level
    except LimitExceeded as e:
        return ParseError(e.code, e.detail)
    try:
        obj = json.loads(text)
    except ValueError as e:  # JSONDecodeError, and e.g. huge-int conversion errors
        return ParseError("corrupt_json", f"not JSON: {e}")
    except RecursionError:  # only with a depth limit set above what the parser can recurse
        return ParseError("limit.json_depth", "line nests deeper than the JSON parser can go")
    return validate_record(obj)


def to_line(event: dict[str, Any]) -> str:
    """Serialize a GraphEvent the way the seed's writer does: optional fields omitted when
    undefined, compact JSON, one ``\\n``-terminated line."""
    obj = {k: event[k] for k in FIELDS if event.get(k) is not None}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"
