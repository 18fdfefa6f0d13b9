"""Per-session compaction lifecycle checker and ledger reducer (SPEC §4.8) — pure.

``step(state, event) -> (new_state, violations)`` folds one SessionEvent (a plain dict shaped as
``memstream.session.SessionEvent``, see docs/records.md) into the session's state. Events are
processed in ``seq`` order; the state is a JSON-able plain dict that a Faust table can persist as
is, and ``to_record(state)`` gives the ``memstream.session.CompactionLedger`` record.

A violation never raises: it is returned (for the dead-letter topic), counted in the ledger's
``violationCount``, and the session keeps being tracked. ``step`` never mutates its input.

State shape
-----------
``{"record": <CompactionLedger dict>, "internal": {...}}`` — ``record`` holds exactly the record
fields; ``internal`` holds the bookkeeping the record schema has no field for:

- ``openTurn`` (int | None): the turn currently open (see the turn model below);
- ``turnBoundaries`` (bool): the session has logged an explicit ``turn/start`` / ``turn/end``;
- ``claim`` (dict | None): the armed shadow-price claim
  ``{"seq", "type", "compactionId", "shadowedSeqs", "shadowedTokenCount"}``;
- ``openStartTs`` (int | None): ``ts`` of the open compaction's ``compaction/start``;
- ``enclosureFlagged`` (bool): a turn boundary already crossed the open compaction (it was
  reported then; later boundaries inside the same bracket are not reported again);
- ``pendingCrossing``: only in a state written by an earlier version, which held a crossing back
  until the bracket closed; such a crossing is still reported when the bracket closes, so none is
  lost across the upgrade (this version never sets it);
- ``droppedCompactions`` (int): closed compactions trimmed from ``record.compactions`` (the
  record keeps the newest ``MAX_COMPACTIONS``; totals stay cumulative).

Turn model
----------
The seed says a numbered ``compaction/start`` owner is strictly enclosed by the open turn, and
``turn: null`` marks a standalone manual compaction between turns. We track the open turn from:

- ``turn/start`` events (data ``{"turn": n}``, usually as the GenericEvent ``json`` string): turn
  *n* is open;
- ``turn/end`` events: no turn is open;
- surface *appends* carrying a numbered ``turn`` T: turn T is open (implicitly ending a different
  previous turn) — for producers that do not log explicit turn boundaries. Surface *replaces*
  (compaction output) never move the turn.

Checks: a numbered start must name the open turn (``turn.not_open``); a ``null`` start while a turn
is open is ``turn.null_inside_turn`` — enforced only once the session has logged an explicit
``turn/start``/``turn/end`` (without boundaries we cannot know that a turn is over, so we do not
guess); an explicit ``turn/start``/``turn/end`` while a numbered compaction holds the lock, or a
surface append moving to another turn, is ``turn.enclosure``; an explicit ``turn/start``/``turn/end``
inside a standalone bracket is ``turn.crosses_standalone``. A crossing is reported **at the
boundary** (the reference's live check refuses the boundary event itself), once per bracket, and
recorded on the compaction's ledger entry (``crossing {seq, rule, retracted}``). When a later
``session/end-seed`` shows the bracket to be an inherited orphan, its boundaries were the crash
repair of a dead writer's history, which the reference accepts on replay: the report is then
retracted on the ledger entry (``crossing.retracted``, and the entry's ``error`` says so); it
stays counted in ``violationCount``, which counts what was dead-lettered. The end's owner
(``turn``, ``sourceCommandId``) must equal the start's (``lock.owner_mismatch``), the summary's
``sourceCommandId`` the start's (``summary.owner_mismatch``); an empty ``compactionId`` or
``sourceCommandId`` is ``event.empty_id`` (not applied).

``session/end-seed`` (written after the history a resumed or forked session inherited) releases a
compaction still open: closed ``failed`` with error ``orphaned: …`` (not counted in ``errorCount``).

Lock model
----------
``compaction/start`` takes the lock until the matching ``compaction/end``. A second start while
one is open is ``lock.second_start``; the lock then passes to the new compaction and the old one
is closed as ``failed`` with error ``"abandoned: …"`` (a producer that crashed mid-compaction never
ends it; this keeps one bad compaction from making every later one a violation). Abandonment is
not counted in ``errorCount`` (which counts ends carrying ``error``).

Shadow-price meter
------------------
``compaction/summary`` and ``compaction/prune`` arm a claim for ``shadowedSeqs`` at price
``shadowedTokenCount``. The very next event processed must be the surface ``replace`` whose
``sourceEventSeqs`` equal ``shadowedSeqs`` (same order): it settles the claim — tokensRemoved +=
claim, tokensAdded += ``price_message(role, content)``, tokensSaved += the difference (may be
negative). Any other event in between — including an ignorable one — expires the claim
(``shadow.not_adjacent``); a replace of a different range is ``shadow.range_mismatch``; a replace
with nothing armed is ``shadow.unclaimed_replace``; the error ``compaction/end`` of the summary's
own compaction lets the claim lapse silently (the compaction failed: no replacement is owed).
Seq gaps are not checked: "immediately follows"
means "is the next event the consumer sees". A claim whose token count is invalid settles without
touching the totals (its ``meter.bad_token_count`` was already reported).

Duplicates and order
--------------------
The topic is keyed by ``session_id``, so one session's events arrive in producer order. An event
with ``seq <= lastSeq`` was either seen already or arrives late; the state remembers a
fingerprint (``fingerprint``: SHA-256 of the event's canonical JSON, 128 bits) of each of the
last ``SEQ_WINDOW`` events it applied (``internal.seqPrints``: ``{str(seq): fingerprint}`` in
seq order, bounded; ``internal.seqFloor``: every applied seq ``>= seqFloor`` is in it), so:

- same seq, same fingerprint: a redelivery (at-least-once after a crash). Skipped: ``step``
  returns the *same* state object and no violations (that is how the caller counts it).
  This makes reprocessing idempotent;
- same seq, another fingerprint: ``session.seq_reused`` (a producer reused a seq for different
  content: dead-lettered, never silently dropped);
- a seq ``>= seqFloor`` never applied: ``session.seq_out_of_order`` (it arrived after a later seq);
- a seq ``< seqFloor``: ``session.seq_unverifiable`` (older than the remembered window, or than
  the first event a state without fingerprints — written before they existed — saw after the
  upgrade: it cannot be told from a redelivery, so it is dead-lettered rather than dropped).

Such an event changes nothing but ``violationCount`` (it is not an event of the session's log:
it neither moves ``lastSeq`` nor expires an armed shadow-price claim). An event of another
session (``event.session_mismatch``) is reported before any seq check.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from streams.core.limits import (
    DEFAULT_LIMITS,
    LimitExceeded,
    Limits,
    check_chars,
    check_count,
    check_id,
    check_json_depth,
    quote,
)

from .tokens import price_message

MAX_COMPACTIONS = 256
SEQ_WINDOW = 256  # fingerprints of the last SEQ_WINDOW applied seqs (~12 KB of a state row)

# rule id -> what it means. Stable: dashboards and the DLQ reason key on these ids.
RULES: dict[str, str] = {
    "lock.second_start": "compaction/start while another compaction holds the lock",
    "lock.reused_id": "compaction/start reuses the id of an earlier compaction of this session",
    "lock.end_not_open": "compaction/end for a compaction that is not the open one (unknown or already ended)",
    "lock.owner_mismatch": "compaction/end's owner (turn, sourceCommandId) differs from its compaction/start",
    "turn.not_open": "a numbered compaction owner is not the open turn",
    "turn.null_inside_turn": "turn: null (between turns) while a turn is open",
    "turn.enclosure": "a turn boundary (turn/start, turn/end, or a surface event of another turn) while a numbered compaction held the lock; reported at the boundary",
    "turn.crosses_standalone": "a turn/start or turn/end inside a standalone (turn: null) compaction bracket; reported at the boundary",
    "summary.not_open": "compaction/summary for a compaction that is not open",
    "summary.duplicate": "more than one compaction/summary for one compaction",
    "summary.owner_mismatch": "compaction/summary's sourceCommandId differs from (or omits) its compaction/start's",
    "summary.raw_output_missing": "llmStreamCall: true without rawOutput",
    "end.missing_summary": "a successful compaction/end (no error) without a compaction/summary",
    "meter.range_mismatch": "shadowedRange start/end are not the first/last of shadowedSeqs (or shadowedSeqs is empty)",
    "meter.bad_token_count": "shadowedTokenCount is not a non-negative integer",
    "shadow.not_adjacent": "the metering event was not immediately followed by its replacement (claim expired)",
    "shadow.range_mismatch": "a replace of a different range than the armed claim's shadowedSeqs",
    "shadow.unclaimed_replace": "a surface replace with no armed shadow-price claim",
    "event.unknown_type": "an unknown, non-ignorable event type",
    "event.malformed": "an event whose envelope or data cannot be interpreted",
    "event.empty_id": "a compaction event whose compactionId or sourceCommandId is the empty string (ids are non-empty when present)",
    "event.session_mismatch": "an event of another session was routed to this session's state",
    "session.seq_reused": "an already-applied seq arrives again with different content",
    "session.seq_out_of_order": "a seq below lastSeq that was never applied (it arrived after a later seq)",
    "session.seq_unverifiable": "a seq below lastSeq, older than the remembered fingerprints: redelivery or reuse cannot be told",
    "event.over_limit": "an event over an input limit or with an id against the id rules (MEMSTREAM_MAX_*)",
}

TURN_START = "turn/start"
TURN_END = "turn/end"
#: written by the producer right after the history a resumed or forked session inherited: a
#: compaction still open before it belongs to a writer whose lifecycle has ended (an orphan)
END_SEED = "session/end-seed"


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    session_id: str
    seq: int | None
    event_type: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "message": self.message,
            "sessionId": self.session_id,
            "seq": self.seq,
            "eventType": self.event_type,
        }

    def __str__(self) -> str:  # the DLQ "reason"
        return f"{self.rule}: {self.message}"


# --------------------------------------------------------------------------------------------
# state


def new_state(session_id: str) -> dict[str, Any]:
    return {
        "record": {
            "sessionId": session_id,
            "lastSeq": -1,
            "openCompactionId": None,
            "compactions": [],
            "tokensRemoved": 0,
            "tokensAdded": 0,
            "tokensSaved": 0,
            "violationCount": 0,
            "errorCount": 0,
        },
        "internal": {
            "openTurn": None,
            "turnBoundaries": False,
            "claim": None,
            "openStartTs": None,
            "enclosureFlagged": False,
            "droppedCompactions": 0,
            "seqPrints": {},
            "seqFloor": 0,
        },
    }


def to_record(state: Mapping[str, Any]) -> dict[str, Any]:
    """The ``memstream.session.CompactionLedger`` record (a fresh deep copy)."""
    return json.loads(json.dumps(state["record"]))


def fingerprint(event: Mapping[str, Any]) -> str:
    """128 bits of SHA-256 over the event's canonical JSON (sorted keys; bytes as hex): equal for
    a redelivery of the same record, different when any field differs."""
    canon = json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_canon)
    return hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _canon(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": bytes(v).hex()}
    return repr(v)


def _seq_floor(state: Mapping[str, Any]) -> int:
    """Every applied seq >= this has its fingerprint in ``seqPrints``. A state written before the
    fingerprints existed knows none of its seqs."""
    return state["internal"].get("seqFloor", state["record"]["lastSeq"] + 1)


def seen_check(state: Mapping[str, Any], event: Mapping[str, Any]) -> tuple[str, str] | None:
    """For an event with an integer ``seq <= lastSeq``: None when it is a redelivery of the
    applied event (same fingerprint), else ``(rule, message)``."""
    seq = event["seq"]
    last = state["record"]["lastSeq"]
    prints = state["internal"].get("seqPrints") or {}
    known = prints.get(str(seq))
    if known is not None:
        got = fingerprint(event)
        if got == known:
            return None
        return ("session.seq_reused",
                f"seq {seq} was already applied with different content (fingerprint {known}, this event {got}); "
                "a seq must not be reused")
    floor = _seq_floor(state)
    if seq >= floor:
        return ("session.seq_out_of_order",
                f"seq {seq} arrived after seq {last} and was never applied; a session's events must arrive in seq order")
    return ("session.seq_unverifiable",
            f"seq {seq} is below lastSeq {last} and older than the remembered window (seqs >= {floor}); "
            "cannot tell a redelivery from a reused seq")


def _remember_seq(ctx: _Ctx, state: Mapping[str, Any], event: Mapping[str, Any]) -> None:
    """Record the applied event's fingerprint; keep the newest SEQ_WINDOW."""
    floor = _seq_floor(state)
    prints = dict(ctx.internal.get("seqPrints") or {})
    prints[str(event["seq"])] = fingerprint(event)
    while len(prints) > SEQ_WINDOW:
        oldest = next(iter(prints))
        del prints[oldest]
        floor = max(floor, int(oldest) + 1)
    ctx.internal["seqPrints"] = prints
    ctx.internal["seqFloor"] = floor


def _new_compaction(cid: str, source_command_id: Any, turn: Any, seq: int) -> dict[str, Any]:
    return {
        "compactionId": cid,
        "sourceCommandId": source_command_id,
        "turn": turn,
        "startSeq": seq,
        "summarySeq": None,
        "endSeq": None,
        "shadowedRange": None,
        "shadowedSeqs": [],
        "shadowedTokenCount": None,
        "summaryTokens": None,
        "provider": None,
        "model": None,
        "maxTokens": None,
        "usage": None,
        "durationMs": None,
        "error": None,
        "status": "open",
        "crossing": None,
    }


class _Ctx:
    """Copy-on-write working copy of a state for one step, plus the violations found."""

    def __init__(self, state: Mapping[str, Any], event: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS):
        self.limits = limits
        self.rec = dict(state["record"])
        self.rec["compactions"] = list(self.rec["compactions"])
        self.internal = dict(state["internal"])
        self.violations: list[Violation] = []
        seq = event.get("seq") if isinstance(event, Mapping) else None
        typ = event.get("type") if isinstance(event, Mapping) else None
        self.seq = seq if _is_int(seq) else None
        self.type = typ if isinstance(typ, str) else None

    def violate(self, rule: str, message: str) -> None:
        assert rule in RULES, rule
        self.violations.append(Violation(rule, message, self.rec["sessionId"], self.seq, self.type))

    def find(self, cid: Any) -> int | None:
        comps = self.rec["compactions"]
        for i in range(len(comps) - 1, -1, -1):
            if comps[i]["compactionId"] == cid:
                return i
        return None

    def entry(self, idx: int) -> dict[str, Any]:
        """The compaction at ``idx``, copied so that it may be modified."""
        e = dict(self.rec["compactions"][idx])
        self.rec["compactions"][idx] = e
        return e

    def result(self) -> tuple[dict[str, Any], list[Violation]]:
        self.rec["violationCount"] += len(self.violations)
        return {"record": self.rec, "internal": self.internal}, self.violations


# --------------------------------------------------------------------------------------------
# helpers


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


def _data(event: Mapping[str, Any], limits: Limits) -> dict[str, Any] | None:
    """The event's data as a dict: the Avro union branch, a ``(name, dict)`` pair
    (fastavro ``return_record_name``) or a GenericEvent whose ``json`` is decoded. Raises
    LimitExceeded when that ``json`` nests deeper than ``max_json_depth`` (checked before the
    parse: the parser recurses per level)."""
    data = event.get("data")
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], Mapping):
        data = data[1]
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        return None
    if set(data.keys()) == {"json"}:
        raw = data.get("json")
        if raw is None:
            return {}
        if isinstance(raw, str):
            check_json_depth("data.json", raw, limits)
        try:
            decoded = json.loads(raw)
        except (TypeError, ValueError, RecursionError):  # RecursionError: a depth limit set past the parser's
            return None
        return decoded if isinstance(decoded, dict) else None
    return dict(data)


def _is_surface(data: Mapping[str, Any]) -> bool:
    return "role" in data and "content" in data


def _range_ok(data: Mapping[str, Any]) -> bool:
    seqs = data.get("shadowedSeqs")
    rng = data.get("shadowedRange")
    if not seqs or not isinstance(rng, Mapping):
        return False
    return rng.get("start") == seqs[0] and rng.get("end") == seqs[-1] and _is_int(rng.get("start")) and _is_int(rng.get("end"))


def _count_ok(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _trim(ctx: _Ctx) -> None:
    """Drop the oldest closed compactions beyond MAX_COMPACTIONS entries or beyond
    ``max_ledger_shadowed_seqs`` shadowed seqs in all (the row stays bounded)."""
    comps = ctx.rec["compactions"]
    budget = ctx.limits.max_ledger_shadowed_seqs
    shadowed = sum(len(c.get("shadowedSeqs") or ()) for c in comps)
    while len(comps) > MAX_COMPACTIONS or shadowed > budget:
        idx = next((i for i, c in enumerate(comps) if c["status"] != "open"), None)
        if idx is None:
            break
        shadowed -= len(comps[idx].get("shadowedSeqs") or ())
        del comps[idx]
        ctx.internal["droppedCompactions"] += 1


_LABEL_FIELDS = ("compactionId", "sourceCommandId", "provider", "model")
_SEQ_LISTS = ("shadowedSeqs", "sourceEventSeqs")


def _check_limits(ctx: _Ctx, event: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
    """Raise LimitExceeded when the event carries more than the state may keep."""
    lim = ctx.limits
    if ctx.type is not None:
        check_chars("type", ctx.type, lim, "max_label_chars")
    if not isinstance(data, Mapping):
        return
    for field in _LABEL_FIELDS:
        v = data.get(field)
        if isinstance(v, str):
            check_chars(field, v, lim, "max_label_chars")
    for field in _SEQ_LISTS:
        v = data.get(field)
        if isinstance(v, list):
            check_count(field, len(v), lim, "max_shadowed_seqs")


# --------------------------------------------------------------------------------------------
# the reducer


def step(state: Mapping[str, Any] | None, event: Mapping[str, Any],
         limits: Limits | None = None) -> tuple[dict[str, Any], list[Violation]]:
    """Fold one SessionEvent into the session state. Never raises on bad input.

    ``limits`` (:class:`~streams.core.limits.Limits`, defaults when None): an event whose
    sessionId breaks the id rules, or whose labels (``type``, ``compactionId``,
    ``sourceCommandId``, ``provider``, ``model``) or seq lists are over their limits, is the
    violation ``event.over_limit`` (the reason names the limit and its setting) and changes
    nothing but ``lastSeq`` (it is an event in between: an armed claim expires). A stored
    ``error`` is cut to ``max_error_chars``."""
    limits = limits or DEFAULT_LIMITS
    if state is None:
        sid = event.get("sessionId") if isinstance(event, Mapping) else None
        state = new_state(sid if isinstance(sid, str) else "")
    if not isinstance(event, Mapping) or not _is_int(event.get("seq")):
        ctx = _Ctx(state, event if isinstance(event, Mapping) else {}, limits)
        ctx.violate("event.malformed", "event has no integer seq; it cannot be placed in the session log")
        return ctx.result()
    seq = event["seq"]
    sid = event.get("sessionId")
    if sid != state["record"]["sessionId"]:
        ctx = _Ctx(state, event, limits)
        ctx.violate("event.session_mismatch", f"event of session {quote(sid)} routed to session {quote(ctx.rec['sessionId'])}")
        return ctx.result()
    if seq <= state["record"]["lastSeq"]:
        seen = seen_check(state, event)
        if seen is None:
            return state, []  # type: ignore[return-value]  # redelivered / already processed: idempotent skip
        ctx = _Ctx(state, event, limits)
        ctx.violate(*seen)
        return ctx.result()

    ctx = _Ctx(state, event, limits)
    _remember_seq(ctx, state, event)
    ctx.rec["lastSeq"] = seq

    typ = ctx.type
    try:
        data = _data(event, limits)
        check_id("sessionId", sid, limits)
        _check_limits(ctx, event, data)
    except LimitExceeded as exc:
        _expire_claim(ctx)
        ctx.violate("event.over_limit", str(exc))
        return ctx.result()
    if typ is None or data is None:
        _expire_claim(ctx)
        ctx.violate("event.malformed", "event has no string type" if typ is None else f"{typ} data is not an object")
        return ctx.result()

    surface = _is_surface(data)
    is_replace = surface and data.get("surfaceOp") == "replace"

    # The shadow-price claim only survives until the next event.
    claim = ctx.internal["claim"]
    if claim is not None:
        ctx.internal["claim"] = None
        if is_replace:
            _settle(ctx, claim, data)
            return ctx.result()
        if not _failed_end_of(claim, typ, data):
            ctx.violate(
                "shadow.not_adjacent",
                f"{claim['type']} at seq {claim['seq']} was followed by {typ} at seq {seq}, not by its replacement; claim expired",
            )
    elif is_replace:
        ctx.violate("shadow.unclaimed_replace", f"replace of seqs {data.get('sourceEventSeqs')} with no armed metering event")
        return ctx.result()

    ts = event.get("ts")
    if typ == "compaction/start":
        _on_start(ctx, data, ts)
    elif typ == "compaction/summary":
        _on_summary(ctx, data)
    elif typ == "compaction/end":
        _on_end(ctx, data, ts)
    elif typ == "compaction/prune":
        _on_prune(ctx, data)
    elif typ == TURN_START:
        _on_turn_start(ctx, data)
    elif typ == TURN_END:
        _on_turn_end(ctx)
    elif typ == END_SEED:
        _on_end_seed(ctx)
    elif surface:
        _on_surface_append(ctx, data)
    elif not event.get("ignorable", False):
        ctx.violate("event.unknown_type", f"unknown event type {typ!r} is not marked ignorable")
    return ctx.result()


def replay(events: Iterable[Mapping[str, Any]], state: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, list[Violation]]:
    """Fold events (in the given order) and collect every violation."""
    out: list[Violation] = []
    for ev in events:
        state, vs = step(state, ev)
        out.extend(vs)
    return state, out  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# handlers


def _expire_claim(ctx: _Ctx) -> None:
    claim = ctx.internal["claim"]
    if claim is not None:
        ctx.internal["claim"] = None
        ctx.violate("shadow.not_adjacent", f"{claim['type']} at seq {claim['seq']} was not followed by its replacement; claim expired")


def _settle(ctx: _Ctx, claim: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    seqs = data.get("sourceEventSeqs")
    if list(seqs or []) != list(claim["shadowedSeqs"]):
        ctx.violate(
            "shadow.range_mismatch",
            f"replace of seqs {seqs} while the {claim['type']} at seq {claim['seq']} priced seqs {claim['shadowedSeqs']}",
        )
        return
    content = data.get("content")
    price = price_message(data.get("role"), content if isinstance(content, list) else [])
    claimed = claim["shadowedTokenCount"]
    if claim["compactionId"] is not None:
        idx = ctx.find(claim["compactionId"])
        if idx is not None:
            ctx.entry(idx)["summaryTokens"] = price
    if not _count_ok(claimed):
        return
    ctx.rec["tokensRemoved"] += claimed
    ctx.rec["tokensAdded"] += price
    ctx.rec["tokensSaved"] += claimed - price


def _failed_end_of(claim: Mapping[str, Any], typ: str | None, data: Mapping[str, Any]) -> bool:
    """The event right after a summary is the error end of that summary's compaction: the
    compaction failed after summarizing, so no replacement follows and none is owed (the claim
    lapses without settling and without a violation). deepseek-harness
    packages/compaction/compaction-basic/src/region.ts: when the checkpoint append after the
    summary throws, the transaction closes with ``compaction/end`` + ``error`` and no checkpoint."""
    return (
        typ == "compaction/end"
        and claim["type"] == "compaction/summary"
        and claim["compactionId"] is not None
        and data.get("compactionId") == claim["compactionId"]
        and data.get("error") is not None
    )


def _check_turn_change(ctx: _Ctx, new_turn: int | None, explicit: bool = False) -> None:
    """A turn boundary while a compaction holds the lock: report the crossing now, at the
    boundary, as the reference's live check does (deepseek-harness
    packages/compaction/compaction/src/invariant.ts ``validateTurnBoundary``: "turn/end cannot
    cross an open compaction for turn N", "turn/start cannot cross an open standalone
    compaction"), and record it on the compaction's ledger entry.

    An explicit ``turn/start`` / ``turn/end`` crosses any open bracket; a surface append that moves
    the turn (``new_turn`` ≠ the owner) crosses a numbered one only. Once per bracket: a stuck lock
    does not add two dead letters per turn (the first boundary already told the operator)."""
    open_id = ctx.rec["openCompactionId"]
    if open_id is None or ctx.internal["enclosureFlagged"]:
        return
    idx = ctx.find(open_id)
    owner = ctx.rec["compactions"][idx]["turn"] if idx is not None else None
    what = TURN_END if new_turn is None else f"{TURN_START} of turn {new_turn}"
    if owner is None and explicit:
        rule, message = "turn.crosses_standalone", f"{what} at seq {ctx.seq} inside standalone compaction {open_id!r}"
    elif owner is not None and (explicit or owner != new_turn):
        if not explicit:
            what = f"a surface event of turn {new_turn}"
        rule, message = "turn.enclosure", f"{what} at seq {ctx.seq} crossed compaction {open_id!r} of turn {owner}, which still held the lock"
    else:
        return
    ctx.internal["enclosureFlagged"] = True
    ctx.violate(rule, message)
    if idx is not None:
        ctx.entry(idx)["crossing"] = {"seq": ctx.seq, "rule": rule, "retracted": False}


def _close_bracket(ctx: _Ctx) -> None:
    """The open bracket closes (end, or abandonment by a second start). A crossing an earlier
    version held back until now (``pendingCrossing`` in its stored state) is reported here."""
    legacy = ctx.internal.pop("pendingCrossing", None)
    ctx.internal["enclosureFlagged"] = False
    if legacy:
        ctx.violate(legacy[0], legacy[1])


def _empty_ids(ctx: _Ctx, data: Mapping[str, Any], what: str) -> bool:
    """Report ``event.empty_id`` (the event is then not applied): a compactionId or a present
    sourceCommandId must be a non-empty string (deepseek-harness invariant.ts validateId)."""
    empty = [f for f in ("compactionId", "sourceCommandId") if data.get(f) == ""]
    if empty:
        ctx.violate("event.empty_id", f"{what} has an empty {' and '.join(empty)}")
    return bool(empty)


def _turn_of(data: Mapping[str, Any]) -> tuple[bool, int | None]:
    turn = data.get("turn")
    return (turn is None or _is_int(turn)), turn


def _on_turn_start(ctx: _Ctx, data: Mapping[str, Any]) -> None:
    ok, turn = _turn_of(data)
    if not ok or turn is None:
        ctx.violate("event.malformed", "turn/start without an integer turn")
        return
    ctx.internal["turnBoundaries"] = True
    _check_turn_change(ctx, turn, explicit=True)
    ctx.internal["openTurn"] = turn


def _on_turn_end(ctx: _Ctx) -> None:
    ctx.internal["turnBoundaries"] = True
    _check_turn_change(ctx, None, explicit=True)
    ctx.internal["openTurn"] = None


def _on_end_seed(ctx: _Ctx) -> None:
    """``session/end-seed``: a compaction still open is an inherited orphan; release it (closed
    as ``failed``, error ``orphaned: …``, not counted in ``errorCount``). A turn boundary that
    crossed it was the crash repair of the inherited history (the reference accepts it on replay,
    invariant.ts ``inheritedOrphanStartSeqs``): its report, made at the boundary, is retracted on
    the entry (``crossing.retracted``, named in ``error``). A new start is then valid (in the same
    turn too); the stale id is closed, so a summary or end for it is ``summary.not_open`` /
    ``lock.end_not_open``."""
    open_id = ctx.rec["openCompactionId"]
    if open_id is None:
        return
    idx = ctx.find(open_id)
    if idx is not None:
        e = ctx.entry(idx)
        e["status"] = "failed"
        e["error"] = f"orphaned: inherited compaction released by {END_SEED} at seq {ctx.seq}"
        crossing = e.get("crossing")
        if crossing:
            e["crossing"] = {**crossing, "retracted": True}
            e["error"] += (f"; the turn boundary at seq {crossing['seq']} that crossed it was crash repair of the "
                           f"inherited history: its {crossing['rule']} report is retracted")
    ctx.rec["openCompactionId"] = None
    ctx.internal["openStartTs"] = None
    ctx.internal["enclosureFlagged"] = False
    ctx.internal.pop("pendingCrossing", None)  # an earlier version's held-back crossing: excused


def _on_surface_append(ctx: _Ctx, data: Mapping[str, Any]) -> None:
    ok, turn = _turn_of(data)
    if not ok:
        ctx.violate("event.malformed", f"surface event turn {turn!r} is not an integer")
        return
    if turn is not None and turn != ctx.internal["openTurn"]:
        _check_turn_change(ctx, turn)
        ctx.internal["openTurn"] = turn


def _on_start(ctx: _Ctx, data: Mapping[str, Any], ts: Any) -> None:
    cid = data.get("compactionId")
    ok, turn = _turn_of(data)
    if not isinstance(cid, str) or not ok:
        ctx.violate("event.malformed", "compaction/start needs a string compactionId and an integer or null turn")
        return
    if _empty_ids(ctx, data, "compaction/start"):
        return
    open_id = ctx.rec["openCompactionId"]
    if open_id is not None:
        ctx.violate("lock.second_start", f"compaction {cid!r} started while compaction {open_id!r} holds the lock")
        _close_bracket(ctx)
        idx = ctx.find(open_id)
        if idx is not None:
            e = ctx.entry(idx)
            e["status"] = "failed"
            e["error"] = f"abandoned: lock taken by compaction {cid!r} at seq {ctx.seq}"
    elif ctx.find(cid) is not None:
        ctx.violate("lock.reused_id", f"compaction id {cid!r} was already used in this session")

    open_turn = ctx.internal["openTurn"]
    if turn is not None and turn != open_turn:
        ctx.violate("turn.not_open", f"compaction {cid!r} is owned by turn {turn} but the open turn is {open_turn}")
    elif turn is None and ctx.internal["turnBoundaries"] and open_turn is not None:
        ctx.violate("turn.null_inside_turn", f"compaction {cid!r} has turn null while turn {open_turn} is open")

    ctx.rec["compactions"].append(_new_compaction(cid, data.get("sourceCommandId"), turn, ctx.seq))  # type: ignore[arg-type]  # applied: seq is an int
    ctx.rec["openCompactionId"] = cid
    ctx.internal["openStartTs"] = ts if _is_int(ts) else None
    ctx.internal["enclosureFlagged"] = False
    ctx.internal.pop("pendingCrossing", None)
    _trim(ctx)


def _check_meter(ctx: _Ctx, data: Mapping[str, Any], what: str) -> bool:
    """Shared checks of a metering event; False when it is too malformed to arm a claim."""
    seqs = data.get("shadowedSeqs")
    if not _is_int_list(seqs):
        ctx.violate("event.malformed", f"{what} shadowedSeqs is not a list of integers")
        return False
    if not _range_ok(data):
        ctx.violate(
            "meter.range_mismatch",
            f"{what} shadowedRange {data.get('shadowedRange')} does not match first/last of shadowedSeqs {seqs}",
        )
    if not _count_ok(data.get("shadowedTokenCount")):
        ctx.violate("meter.bad_token_count", f"{what} shadowedTokenCount {data.get('shadowedTokenCount')!r} is not a non-negative integer")
    return True


def _arm(ctx: _Ctx, kind: str, data: Mapping[str, Any], cid: str | None) -> None:
    ctx.internal["claim"] = {
        "seq": ctx.seq,
        "type": kind,
        "compactionId": cid,
        "shadowedSeqs": list(data["shadowedSeqs"]),
        "shadowedTokenCount": data.get("shadowedTokenCount"),
    }


def _on_summary(ctx: _Ctx, data: Mapping[str, Any]) -> None:
    cid = data.get("compactionId")
    if not isinstance(cid, str):
        ctx.violate("event.malformed", "compaction/summary needs a string compactionId")
        return
    if _empty_ids(ctx, data, "compaction/summary"):
        return
    if not _check_meter(ctx, data, "compaction/summary"):
        return
    if data.get("llmStreamCall") is True and data.get("rawOutput") is None:
        ctx.violate("summary.raw_output_missing", f"summary of {cid!r} has llmStreamCall: true but no rawOutput")

    open_id = ctx.rec["openCompactionId"]
    if cid != open_id:
        ctx.violate("summary.not_open", f"summary for compaction {cid!r} but the open compaction is {open_id!r}")
    else:
        idx = ctx.find(cid)
        if idx is not None and ctx.rec["compactions"][idx]["summarySeq"] is not None:
            first = ctx.rec["compactions"][idx]["summarySeq"]
            ctx.violate("summary.duplicate", f"second summary for compaction {cid!r} (first at seq {first})")
        elif idx is not None:
            e = ctx.entry(idx)
            if data.get("sourceCommandId") != e["sourceCommandId"]:
                ctx.violate(
                    "summary.owner_mismatch",
                    f"summary of {cid!r} names command {data.get('sourceCommandId')!r} but its start named "
                    f"{e['sourceCommandId']!r}",
                )
            e["summarySeq"] = ctx.seq
            rng = data.get("shadowedRange")
            e["shadowedRange"] = {"start": rng.get("start"), "end": rng.get("end")} if isinstance(rng, Mapping) else None
            e["shadowedSeqs"] = list(data["shadowedSeqs"])
            _trim(ctx)  # the ledger keeps at most max_ledger_shadowed_seqs in all
            count = data.get("shadowedTokenCount")
            e["shadowedTokenCount"] = count if _count_ok(count) else None
            e["provider"] = data.get("provider")
            e["model"] = data.get("model")
            e["maxTokens"] = data.get("maxTokens") if _is_int(data.get("maxTokens")) else None
            usage = data.get("usage")
            e["usage"] = (
                {k: usage.get(k) for k in ("inputTokens", "outputTokens", "totalTokens")}
                if isinstance(usage, Mapping)
                else None
            )
    # The replacement follows whatever the lock says: arm the claim regardless.
    _arm(ctx, "compaction/summary", data, cid)


def _on_prune(ctx: _Ctx, data: Mapping[str, Any]) -> None:
    if _check_meter(ctx, data, "compaction/prune"):
        _arm(ctx, "compaction/prune", data, None)


def _on_end(ctx: _Ctx, data: Mapping[str, Any], ts: Any) -> None:
    cid = data.get("compactionId")
    ok, turn = _turn_of(data)
    if not isinstance(cid, str) or not ok:
        ctx.violate("event.malformed", "compaction/end needs a string compactionId and an integer or null turn")
        return
    if _empty_ids(ctx, data, "compaction/end"):
        return
    open_id = ctx.rec["openCompactionId"]
    if cid != open_id:
        known = ctx.find(cid) is not None
        ctx.violate(
            "lock.end_not_open",
            f"end of compaction {cid!r} ({'already closed' if known else 'never started'}); open compaction is {open_id!r}",
        )
        return
    idx = ctx.find(cid)
    assert idx is not None
    e = ctx.entry(idx)
    if turn != e["turn"] or data.get("sourceCommandId") != e["sourceCommandId"]:
        ctx.violate(
            "lock.owner_mismatch",
            f"end of {cid!r} owned by (turn={turn}, command={data.get('sourceCommandId')!r}) but started by "
            f"(turn={e['turn']}, command={e['sourceCommandId']!r})",
        )
    _close_bracket(ctx)
    e["endSeq"] = ctx.seq
    start_ts = ctx.internal["openStartTs"]
    e["durationMs"] = ts - start_ts if _is_int(ts) and _is_int(start_ts) else None
    error = data.get("error")
    if error is not None:
        e["status"] = "failed"
        text = str(error)
        cap = ctx.limits.max_error_chars
        e["error"] = text if len(text) <= cap else text[:cap] + f"… (cut at {cap} characters: MEMSTREAM_MAX_ERROR_CHARS)"
        ctx.rec["errorCount"] += 1
    else:
        e["status"] = "succeeded"
        if e["summarySeq"] is None:
            ctx.violate("end.missing_summary", f"compaction {cid!r} ended successfully without a summary")
    ctx.rec["openCompactionId"] = None
    ctx.internal["openStartTs"] = None
