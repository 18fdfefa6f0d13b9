"""Ingest: validation of incoming memory events and candidates, de-duplication, ordering.

Validation never raises on bad data: it returns a :class:`Rejection` with a machine-readable
``code`` and a readable ``detail`` (the dead-letter ``reason``). Rules (SPEC §3, §4.1):

* a ``memory_formed`` event or a candidate without ``sensitivity`` is rejected — fail closed,
  never defaulted to ``none``; a sensitivity outside the vocabulary is rejected too;
* missing / empty ids (``event_id``, ``motebit_id``, ``node_id``, ``candidate_id``),
  a missing timestamp, empty content, ``confidence`` outside 0..1 (or not a number),
  an unknown ``event_type`` or consolidation ``action`` are rejected;
* content that is the redaction sentinel ``"[REDACTED]"`` (surrounding whitespace ignored) is
  rejected with code ``redacted_content`` — a candidate, and a ``memory_formed`` that is neither
  marked ``redacted`` nor a deletion tombstone: a placeholder never forms a node (the reference's
  ``formMemory`` refuses it: motebit packages/memory-graph/src/index.ts). A ``memory_formed``
  marked ``redacted`` (a peer's redacted copy) is still accepted, ledger only;
* an unknown ``source`` degrades to absent (``None``) — never a rejection;
* an embedding that is not a list of finite numbers is rejected; an all-zero one is
  treated as absent (cosine is undefined for it);
* sizes and ids (:mod:`streams.core.limits`): every id must follow the id rules (allowed
  characters, at most ``max_id_chars``), content, embedding dimensions, ``extra`` entries, short
  labels (``kind``, ``frontmatter_type``) and free text (reasons, turn messages) must be within
  their :class:`~streams.core.limits.Limits` — over a limit is a rejection whose code is
  ``limit.<name>`` and whose reason names the limit and its setting. A reason never quotes more
  than a few dozen characters of any input.

De-duplication (:class:`DedupWindow`): ids are remembered per user in a bounded window —
at most ``max_ids`` ids and only those within ``horizon_ms`` of the newest timestamp seen.
A re-delivery inside the window is dropped and counted. Bounding is deliberate: Kafka
re-delivers within the uncommitted window (seconds to minutes) and topics keep 7 days; an
unbounded set would grow forever per user. Older re-sends fall back on the idempotency of
the core (deterministic ids; formation of an existing or deleted node id is refused).

Ordering: within a key, ``(timestamp, version_clock, event_id)`` (:func:`event_sort_key`) is
the order of memory events. Nothing is held back to sort them: ``process_event`` applies each
event as it arrives, and one older than an event already applied (``UserMemory.last_event_key``)
is *late*: applied at once — never dropped, nothing disappears — flagged ``late`` on its
Outcome, and counted (``UserMemory.stats["late"]``). The state updates events make are
order-insensitive (latest ``memory_pinned`` wins by this same sort key, ``last_accessed_at`` is
a max, counts add, deletion is permanent and a deleted node id can never form again), so a late
record lands in the state it would have produced in order.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from .limits import (
    DEFAULT_LIMITS,
    LimitExceeded,
    Limits,
    check_bytes,
    check_chars,
    check_count,
    check_id,
    quote,
)
from .similarity import usable_embedding
from .vocabulary import (
    EVENT_TYPES,
    MEMORY_TYPES,
    is_sensitivity,
    normalize_source,
    try_normalize_action,
)

#: The sentinel that replaces redacted content on the wire (seed memory-events).
REDACTED_CONTENT = "[REDACTED]"


def is_redaction_sentinel(content: Any) -> bool:
    """``content`` is the redaction sentinel (surrounding whitespace ignored): never a memory."""
    return isinstance(content, str) and content.strip() == REDACTED_CONTENT


CANDIDATE_FIELDS: tuple[str, ...] = (
    "candidate_id",
    "motebit_id",
    "content",
    "sensitivity",
    "source",
    "memory_type",
    "confidence",
    "valid_from",
    "timestamp",
    "embedding",
    "frontmatter_type",
    "extra",
    "supersedes",
    "kind",
    "session_id",
)

#: 2000-01-01T00:00:00Z in Unix ms: no memory input is older (a time before it is a unit or clock error)
MIN_TIME_MS = 946_684_800_000


def time_problem(record: Any, record_time_ms: int | None, limits: Limits = DEFAULT_LIMITS) -> Rejection | None:
    """A Rejection (``invalid_time``) when a memory input's event time is before 2000-01-01 or
    later than ``record_time_ms`` (the Kafka record's timestamp: what a replay sees again, so the
    decision never changes) plus ``max_future_skew_ms``; None otherwise. Checked: ``timestamp``
    and ``valid_from`` (top level or, for a memory event, in the payload) against both bounds;
    ``valid_until`` / ``superseded_valid_until`` against the lower one only (a validity may
    legitimately end in the future). Values that are not integers are left to the validators.
    Without a record time (``None`` or <= 0) only the lower bound applies."""
    if not isinstance(record, Mapping):
        return None
    payload = p if isinstance(p := record.get("payload"), Mapping) else {}
    latest = None
    if record_time_ms is not None and record_time_ms > 0:
        latest = int(record_time_ms) + limits.max_future_skew_ms
    checks = [("timestamp", record.get("timestamp"), True), ("valid_from", record.get("valid_from"), True),
              ("payload.valid_from", payload.get("valid_from"), True),
              ("payload.valid_until", payload.get("valid_until"), False),
              ("payload.superseded_valid_until", payload.get("superseded_valid_until"), False)]
    for name, value, upper in checks:
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if value < MIN_TIME_MS:
            return Rejection("invalid_time", f"{name} {value} is before 2000-01-01 ({MIN_TIME_MS} ms)")
        if upper and latest is not None and value > latest:
            return Rejection("invalid_time", f"{name} {value} is more than MEMSTREAM_MAX_FUTURE_SKEW_MS "
                                             f"({limits.max_future_skew_ms}) after the record's Kafka timestamp "
                                             f"{record_time_ms}")
    return None


@dataclass(frozen=True)
class Rejection:
    """Why a record was not applied.

    ``dead_letter`` — True: invalid input, the shell sends it to ``pipeline.dlq.v1`` with
    ``detail`` as the reason. False: a policy decision that is itself recorded (e.g. a
    consolidation ``reject`` on the ledger).
    ``redact_value`` — True when the original value must not be copied into the DLQ because
    it carries content the user deleted (re-formation attempts of forgotten content)."""

    code: str
    detail: str
    dead_letter: bool = True
    redact_value: bool = False


class Invalid(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.rejection = Rejection(code, detail)


def _rejection(exc: Exception) -> Rejection:
    if isinstance(exc, LimitExceeded):
        return Rejection(exc.code, exc.detail)
    assert isinstance(exc, Invalid)
    return exc.rejection


# --------------------------------------------------------------------------------------------
# Field readers
# --------------------------------------------------------------------------------------------


def _req_str(d: Mapping[str, Any], key: str, code: str | None = None) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v.strip():
        raise Invalid(code or f"missing_{key}", f"{key} is missing or empty")
    return v


def _opt_str(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise Invalid(f"invalid_{key}", f"{key} must be a string, got {type(v).__name__}")
    return v


def _req_id(d: Mapping[str, Any], key: str, limits: Limits) -> str:
    return check_id(key, _req_str(d, key), limits)


def _opt_id(d: Mapping[str, Any], key: str, limits: Limits) -> str | None:
    v = _opt_str(d, key)
    return None if v is None or v == "" else check_id(key, v, limits)


def _opt_label(d: Mapping[str, Any], key: str, limits: Limits) -> str | None:
    v = _opt_str(d, key)
    return None if v is None else check_chars(key, v, limits, "max_label_chars")


def _caused_by(raw: Mapping[str, Any], limits: Limits) -> dict[str, str] | None:
    """An event's ``caused_by`` input reference (kind a label, id an id), kept as it came; None when absent."""
    ref = raw.get("caused_by")
    if ref is None:
        return None
    if not isinstance(ref, Mapping):
        raise Invalid("invalid_caused_by", "caused_by must be a record {kind, id}")
    kind = check_chars("caused_by.kind", _req_str(ref, "kind", "invalid_caused_by"), limits, "max_label_chars")
    return {"kind": kind, "id": check_id("caused_by.id", _req_str(ref, "id", "invalid_caused_by"), limits)}


def _text(key: str, v: str, limits: Limits) -> str:
    return check_bytes(key, v, limits, "max_text_bytes")


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _req_int(d: Mapping[str, Any], key: str) -> int:
    v = _as_int(d.get(key))
    if v is None:
        raise Invalid(f"missing_{key}" if d.get(key) is None else f"invalid_{key}", f"{key} must be an integer")
    return v


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    if d.get(key) is None:
        return None
    v = _as_int(d.get(key))
    if v is None:
        raise Invalid(f"invalid_{key}", f"{key} must be an integer (Unix ms)")
    return v


def _sensitivity(d: Mapping[str, Any], key: str = "sensitivity") -> str:
    v = d.get(key)
    if v is None:
        raise Invalid("missing_sensitivity", "sensitivity is required (fail closed: never defaulted)")
    if not is_sensitivity(v):
        raise Invalid("invalid_sensitivity", f"sensitivity {quote(v)} is not a SensitivityLevel")
    return v


def _confidence(d: Mapping[str, Any], key: str, required: bool) -> float | None:
    v = d.get(key)
    if v is None:
        if required:
            raise Invalid(f"missing_{key}", f"{key} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise Invalid("invalid_confidence", f"{key} must be a number in 0..1")
    if not 0.0 <= float(v) <= 1.0:
        raise Invalid("confidence_out_of_range", f"{key}={v} is outside 0..1")
    return float(v)


def _embedding(d: Mapping[str, Any], limits: Limits) -> list[float] | None:
    v = d.get("embedding")
    if v is None:
        return None
    if isinstance(v, (str, bytes, Mapping)):
        raise Invalid("invalid_embedding", "embedding must be an array of floats")
    if hasattr(v, "__len__"):  # before converting: a huge array is refused unread
        check_count("embedding", len(v), limits, "max_embedding_dims", "dimensions")
    try:
        values = [float(x) for x in v]
        if any(isinstance(x, bool) for x in v):
            raise TypeError
    except (TypeError, ValueError):
        raise Invalid("invalid_embedding", "embedding must be an array of floats") from None
    if not all(math.isfinite(x) for x in values):
        raise Invalid("invalid_embedding", "embedding holds NaN or infinity")
    return values if usable_embedding(values) else None


# --------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------


def _extra(raw: Mapping[str, Any], limits: Limits) -> list[str] | None:
    extra = raw.get("extra")
    if extra is None:
        return None
    if isinstance(extra, (str, bytes, Mapping)) or not hasattr(extra, "__iter__"):
        raise Invalid("invalid_extra", "extra must be an array of strings")
    if hasattr(extra, "__len__"):
        check_count("extra", len(extra), limits, "max_extra_entries")
    # non-string items are not header lines: the hint parser ignores them (never an error)
    lines = [x for x in extra if isinstance(x, str)]
    check_count("extra", len(lines), limits, "max_extra_entries")
    for i, line in enumerate(lines):
        check_bytes(f"extra[{i}]", line, limits, "max_extra_entry_bytes")
    return lines


def validate_candidate(raw: Any, limits: Limits = DEFAULT_LIMITS) -> tuple[dict[str, Any] | None, Rejection | None]:
    """(normalized candidate with every CandidateMemory field, None) or (None, Rejection)."""
    try:
        if not isinstance(raw, Mapping):
            raise Invalid("not_a_record", "candidate is not a record")
        cand: dict[str, Any] = {
            "candidate_id": _req_id(raw, "candidate_id", limits),
            "motebit_id": _req_id(raw, "motebit_id", limits),
        }
        content = raw.get("content")
        if not isinstance(content, str) or not content.strip():
            raise Invalid("empty_content", "content is missing or empty")
        if is_redaction_sentinel(content):
            raise Invalid("redacted_content",
                          f"content is the redaction sentinel {REDACTED_CONTENT}: a placeholder never forms a node")
        cand["content"] = check_bytes("content", content, limits, "max_content_bytes")
        cand["sensitivity"] = _sensitivity(raw)
        cand["source"] = normalize_source(raw.get("source"))
        mt = raw.get("memory_type")
        if mt is None:
            mt = "semantic"
        if mt not in MEMORY_TYPES:
            raise Invalid("invalid_memory_type", f"memory_type {quote(mt)} is not episodic|semantic")
        cand["memory_type"] = mt
        cand["confidence"] = _confidence(raw, "confidence", required=False)
        cand["valid_from"] = _opt_int(raw, "valid_from")
        cand["timestamp"] = _req_int(raw, "timestamp")
        cand["embedding"] = _embedding(raw, limits)
        cand["frontmatter_type"] = _opt_label(raw, "frontmatter_type", limits)
        cand["extra"] = _extra(raw, limits)
        cand["supersedes"] = _opt_id(raw, "supersedes", limits)
        cand["kind"] = _opt_label(raw, "kind", limits)
        cand["session_id"] = _opt_id(raw, "session_id", limits)
        return cand, None
    except (Invalid, LimitExceeded) as e:
        return None, _rejection(e)


# --------------------------------------------------------------------------------------------
# Memory events
# --------------------------------------------------------------------------------------------


def _payload(event_type: str, p: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    if event_type == "memory_formed":
        redacted = p.get("redacted") is True
        reason = p.get("redacted_reason")
        out: dict[str, Any] = {
            "node_id": _req_id(p, "node_id", limits),
            "content": p.get("content"),
            "sensitivity": _sensitivity(p),
            "source": normalize_source(p.get("source")),
            "redacted": True if redacted else None,
            "redacted_sensitivity": p.get("redacted_sensitivity") if is_sensitivity(p.get("redacted_sensitivity")) else None,
            "redacted_reason": "deleted" if reason == "deleted" else None,
            "valid_from": _opt_int(p, "valid_from"),
            "valid_until": _opt_int(p, "valid_until"),
        }
        if not isinstance(out["content"], str) or (not out["content"].strip() and not redacted):
            raise Invalid("empty_content", "memory_formed content is missing or empty")
        if is_redaction_sentinel(out["content"]) and not redacted and out["redacted_reason"] is None:
            raise Invalid(
                "redacted_content",
                f"memory_formed content is the redaction sentinel {REDACTED_CONTENT} but the event is neither "
                "marked redacted nor a deletion tombstone: a placeholder never forms a node",
            )
        check_bytes("content", out["content"], limits, "max_content_bytes")
        if (
            out["valid_from"] is not None
            and out["valid_until"] is not None
            and out["valid_until"] < out["valid_from"]
        ):
            raise Invalid("invalid_validity", "valid_until is before valid_from")
        return out
    if event_type in ("memory_accessed", "memory_deleted"):
        return {"node_id": _req_id(p, "node_id", limits)}
    if event_type == "memory_pinned":
        pinned = p.get("pinned")
        if not isinstance(pinned, bool):
            raise Invalid("invalid_pinned", "memory_pinned needs a boolean pinned")
        return {"node_id": _req_id(p, "node_id", limits), "pinned": pinned}
    if event_type == "memory_consolidated":
        action = try_normalize_action(p.get("action"))
        if action is None:
            raise Invalid("unknown_action", f"consolidation action {quote(p.get('action'))} is not in either vocabulary")
        reason = p.get("reason")
        return {
            "action": action,
            "existing_node_id": _opt_id(p, "existing_node_id", limits),
            "new_node_id": _opt_id(p, "new_node_id", limits),
            "reason": _text("reason", reason, limits) if isinstance(reason, str) else "",
            "superseded_valid_until": _opt_int(p, "superseded_valid_until"),
        }
    if event_type == "memory_audit":
        patterns = p.get("missed_patterns")
        if patterns is None:
            patterns = []
        if isinstance(patterns, (str, bytes)) or not all(isinstance(x, str) for x in patterns):
            raise Invalid("invalid_missed_patterns", "missed_patterns must be an array of strings")
        check_count("missed_patterns", len(patterns), limits, "max_extra_entries")
        for i, pattern in enumerate(patterns):
            check_bytes(f"missed_patterns[{i}]", pattern, limits, "max_extra_entry_bytes")
        msg = p.get("turn_message")
        if not isinstance(msg, str):
            raise Invalid("missing_turn_message", "memory_audit needs turn_message")
        return {"missed_patterns": list(patterns), "turn_message": _text("turn_message", msg, limits)}
    if event_type == "memory_promoted":
        rc = _as_int(p.get("reinforcement_count"))
        if rc is None or rc < 0:
            raise Invalid("invalid_reinforcement_count", "reinforcement_count must be a non-negative integer")
        reason = p.get("reason")
        return {
            "node_id": _req_id(p, "node_id", limits),
            "from_confidence": _confidence(p, "from_confidence", required=True),
            "to_confidence": _confidence(p, "to_confidence", required=True),
            "reinforcement_count": rc,
            "reason": _text("reason", reason, limits) if isinstance(reason, str) else "",
        }
    # memory_decayed: reserved, no payload shape may be assumed (seed)
    return {}


def validate_event(raw: Any, limits: Limits = DEFAULT_LIMITS) -> tuple[dict[str, Any] | None, Rejection | None]:
    """(normalized MemoryEvent dict, None) or (None, Rejection).

    Normalization: source degraded to absent when unknown, consolidation actions rewritten
    into the wire vocabulary, payload reduced to its record's fields."""
    try:
        if not isinstance(raw, Mapping):
            raise Invalid("not_a_record", "event is not a record")
        event_type = raw.get("event_type")
        if event_type not in EVENT_TYPES:
            raise Invalid("unknown_event_type", f"event_type {quote(event_type)} is not a memory event type")
        payload = raw.get("payload")
        if payload is None and event_type == "memory_decayed":
            payload = {}
        if not isinstance(payload, Mapping):
            raise Invalid("missing_payload", "payload is missing or not a record")
        event = {
            "event_id": _req_id(raw, "event_id", limits),
            "motebit_id": _req_id(raw, "motebit_id", limits),
            "device_id": _opt_id(raw, "device_id", limits),
            "timestamp": _req_int(raw, "timestamp"),
            "version_clock": _req_int(raw, "version_clock"),
            "event_type": event_type,
            "payload": _payload(event_type, payload, limits),
            "caused_by": _caused_by(raw, limits),
        }
        return event, None
    except (Invalid, LimitExceeded) as e:
        return None, _rejection(e)


def validate_turn(raw: Any, limits: Limits = DEFAULT_LIMITS) -> Rejection | None:
    """None when a UserTurn (``memory.turns.v1``) is within the limits and its ids follow the
    id rules, else the Rejection. (The audit reads nothing else that could grow its output:
    the ``memory_audit`` event is bounded by the message size.)"""
    try:
        if not isinstance(raw, Mapping):
            raise Invalid("not_a_record", "turn is not a record")
        _req_id(raw, "turn_id", limits)
        _req_id(raw, "motebit_id", limits)
        _req_int(raw, "timestamp")
        msg = raw.get("user_message")
        if not isinstance(msg, str):
            raise Invalid("missing_user_message", "user_message is missing")
        _text("user_message", msg, limits)
        reply = raw.get("agent_reply")
        if isinstance(reply, str):
            _text("agent_reply", reply, limits)
        tagged = raw.get("tagged_memories") or []
        if isinstance(tagged, (str, bytes)) or not hasattr(tagged, "__len__"):
            raise Invalid("invalid_tagged_memories", "tagged_memories must be an array of strings")
        check_count("tagged_memories", len(tagged), limits, "max_extra_entries")
        for i, t in enumerate(tagged):
            if isinstance(t, str):
                check_bytes(f"tagged_memories[{i}]", t, limits, "max_content_bytes")
        return None
    except (Invalid, LimitExceeded) as e:
        return _rejection(e)


# --------------------------------------------------------------------------------------------
# De-duplication
# --------------------------------------------------------------------------------------------


#: ids per sealed chunk of a new user's persisted de-duplication window. The open chunk (its
#: tail, up to SEEN_CHUNK_SIZE - 1 ids) rides in the user's aux row, which is rewritten in almost
#: every batch that touches the user, so a small chunk keeps that row small: 25 instead of 100
#: cut the caught-up CPU per record by ~1% (bench/RESULTS.md, "Issue 14, stop 20"). A user keeps
#: the chunk size its tail record names, so users persisted with another size stay readable.
SEEN_CHUNK_SIZE = 25
LEGACY_CHUNK_SIZE = 100  #: the chunk size of a tail record that names none (none was written without it)


class DedupWindow:
    """The ids seen for ONE user, bounded by count and by event-time horizon.

    Two persisted forms. ``to_record`` / ``from_record``: the whole window in one record.
    The compact form the shell keeps in its table (so that a write does not rewrite up to
    ``max_ids`` ids): ``to_tail_record`` (sequence number, the ids of the open chunk, counters)
    plus immutable *sealed chunks* of ``SEEN_CHUNK_SIZE`` ids, chunk ``k`` holding the ids with
    sequence numbers ``[k·size, (k+1)·size)``; ``take_changes`` says which chunks were sealed
    (to write) and which fell wholly out of the window (to delete) since it was last called;
    ``from_tail_record`` rebuilds the same window from the tail and the chunks."""

    def __init__(self, max_ids: int = 10_000, horizon_ms: int = 7 * 24 * 60 * 60 * 1000,
                 chunk_size: int = SEEN_CHUNK_SIZE) -> None:
        self.max_ids = max_ids
        self.horizon_ms = horizon_ms
        self.chunk_size = chunk_size
        self._ids: OrderedDict[str, int] = OrderedDict()
        self.high_water = 0
        self.duplicates = 0
        self.seq = 0  #: ids ever added (the next id's sequence number)
        self._sealed: list[int] = []  # chunks sealed since take_changes
        self._low_chunk = 0  # the oldest chunk not yet reported dropped

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, key: str, timestamp: int) -> None:
        if key in self._ids:
            return
        self._ids[key] = int(timestamp)
        self.seq += 1
        if self.seq % self.chunk_size == 0:
            self._sealed.append(self.seq // self.chunk_size - 1)
        self.high_water = max(self.high_water, int(timestamp))
        self._evict()

    def _evict(self) -> None:
        floor = self.high_water - self.horizon_ms
        ids = self._ids
        while ids and (len(ids) > self.max_ids or next(iter(ids.values())) < floor):
            ids.popitem(last=False)

    # ---- the whole window in one record
    def to_record(self) -> dict[str, Any]:
        return {"ids": [[k, v] for k, v in self._ids.items()], "high_water": self.high_water, "duplicates": self.duplicates}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | None, max_ids: int = 10_000, horizon_ms: int = 7 * 24 * 60 * 60 * 1000) -> DedupWindow:
        w = cls(max_ids, horizon_ms)
        if rec and "tail" in rec:
            raise ValueError("a compact window record needs its chunks: use DedupWindow.from_tail_record")
        if rec:
            for k, v in rec.get("ids", []):
                w._ids[k] = int(v)
            w.high_water = int(rec.get("high_water", 0))
            w.duplicates = int(rec.get("duplicates", 0))
            w._evict()
        w.seq = len(w._ids)
        w._low_chunk = w.seq // w.chunk_size
        return w

    # ---- the compact form: tail record + sealed chunks
    def _last(self, n: int) -> list[list]:
        """The newest `n` retained ids as [id, timestamp] pairs, oldest first."""
        out = [[key, ts] for key, ts in islice(reversed(self._ids.items()), max(n, 0))]
        out.reverse()
        return out

    def _chunk_rows(self, k: int) -> list[list]:
        """The retained ids of chunk `k` (sequence numbers [k·size, (k+1)·size))."""
        first_retained = self.seq - len(self._ids)
        start, stop = max(k * self.chunk_size, first_retained), min((k + 1) * self.chunk_size, self.seq)
        if stop <= start:
            return []
        newest = self._last(self.seq - start)
        return newest[: stop - start]

    def to_tail_record(self) -> dict[str, Any]:
        return {"seq": self.seq, "tail": self._last(self.seq % self.chunk_size), "chunk_size": self.chunk_size,
                "high_water": self.high_water, "duplicates": self.duplicates}

    def take_changes(self) -> tuple[dict[int, list[list]], list[int]]:
        """(chunks sealed since the last call: k -> rows, chunks now wholly outside the window)."""
        sealed = {k: self._chunk_rows(k) for k in self._sealed}
        self._sealed = []
        first_retained = self.seq - len(self._ids)
        dropped = []
        while self._low_chunk < self.seq // self.chunk_size and (self._low_chunk + 1) * self.chunk_size <= first_retained:
            dropped.append(self._low_chunk)
            sealed.pop(self._low_chunk, None)
            self._low_chunk += 1
        return sealed, dropped

    @classmethod
    def from_tail_record(cls, rec: Mapping[str, Any], chunks: Mapping[int, list], max_ids: int = 10_000,
                         horizon_ms: int = 7 * 24 * 60 * 60 * 1000) -> DedupWindow:
        chunk_size = int(rec.get("chunk_size", LEGACY_CHUNK_SIZE))
        if chunk_size < 1:
            raise ValueError(f"a de-duplication tail record with chunk_size {chunk_size}: it must be at least 1")
        w = cls(max_ids, horizon_ms, chunk_size)
        # in sequence order; an id added again after it left the window is in an older chunk
        # too: its later copy decides its place (the live window appended it at the end)
        for key, ts in [*(row for k in sorted(chunks) for row in chunks[k]), *rec.get("tail", [])]:
            w._ids.pop(key, None)
            w._ids[key] = int(ts)
        w.seq = int(rec.get("seq", len(w._ids)))
        w.high_water = int(rec.get("high_water", 0))
        w.duplicates = int(rec.get("duplicates", 0))
        w._low_chunk = min(chunks) if chunks else w.seq // w.chunk_size
        w._evict()  # the same window as before the restart (eviction only ever drops a prefix)
        return w

    def copy(self) -> DedupWindow:
        w = DedupWindow(self.max_ids, self.horizon_ms, self.chunk_size)
        w._ids = OrderedDict(self._ids)
        w.high_water = self.high_water
        w.duplicates = self.duplicates
        w.seq = self.seq
        w._sealed = list(self._sealed)
        w._low_chunk = self._low_chunk
        return w


# --------------------------------------------------------------------------------------------
# Ordering
# --------------------------------------------------------------------------------------------


def event_sort_key(event: Mapping[str, Any]) -> tuple[int, int, str]:
    """(timestamp, version_clock, event_id): the total order within a key. The id is the
    final tie-breaker so equal clocks still order deterministically."""
    return (
        int(event.get("timestamp") or 0),
        int(event.get("version_clock") or 0),
        str(event.get("event_id") or event.get("candidate_id") or ""),
    )

