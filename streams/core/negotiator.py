"""Negotiator remember / forget (SPEC §4.7, seed ``negotiator-memory-tools``).

A per-user negotiator memory store as a plain, JSON-serializable dict (the shell keeps it in
a table keyed by ``user_id``, the key of ``negotiator.requests.v1``)::

    {
      "user_id": "u1",
      "memories": {<id>: {"id", "kind", "content", "session_id", "request_id",
                          "created_at", "content_fingerprint"}},
      "forgotten": {<id>: {"content_fingerprint", "forgotten_at"}},   # ids never come back
      "forgotten_fingerprints": [<sha256:…>, …],                      # sorted, no content
      "replies": [[<request_id>, <forget status / error, ids only>], …],  # bounded replay memo
    }

Functions never mutate the state they are given: they return a new state (functional core).

remember
    ``kind`` must be ``disclosure_rule | playbook | threshold``; ``counterparty_dossier``
    (distilled from transcripts, never dictated) or anything else raises
    :class:`NegotiatorError` (``code="kind_not_rememberable"``), empty content
    ``code="empty_content"`` — the shell turns it into the reply's ``error``. Validation comes
    first, and content that is instruction-form by the exposure gate's one predicate (a
    ``pinned: true`` / ``triggers:`` / ``applies-when:`` line: :func:`~streams.core.exposure.content_gate`)
    is refused with ``code="instruction_form"`` (SPEC §4.5; an HTTP 400); then, with the host's write flag off, the result is ``None`` and the state is
    unchanged (the seed's ``null``). The id is ``derive_id(user, request_id,
    "negotiator_memory")``: a re-delivered request maps to the same memory and the same view
    (and does not resurrect a memory forgotten in between). A *new* request with the same
    content as a forgotten memory is a new, deliberate statement and is stored (under a new
    id); the forgotten fingerprint stays recorded — see the note on memory nodes below.

forget — always honoured, write flag or not
    * ``memory_id`` given → exact id match only (the description is then ignored: deletion by
      id never guesses);
    * else ``description`` → normalized (NFKC, case-folded, apostrophes dropped, punctuation
      as spaces: :func:`~streams.core.similarity.normalize_text`) and matched against each
      memory's normalized content in two tiers:
        1. *phrase*: the description's words appear contiguously, on word boundaries
           (``" walk away price "`` in ``" never reveal my walk away price before … "``);
        2. only if tier 1 matched nothing — *tokens*: every distinct word of the description
           is a word of the content, in any order.
      An empty (after normalization) description matches nothing.
    Result, exactly the seed's union: ``{"status": "deleted", "memory": view}`` (one match,
    deleted), ``{"status": "ambiguous", "candidates": [views]}`` (several, in creation order,
    nothing deleted), ``{"status": "not_found"}``. The deleted memory's id joins
    ``forgotten`` and its content fingerprint (:func:`~streams.core.nodes.content_fingerprint`)
    joins ``forgotten_fingerprints`` so the shell also deletes the matching memory node(s)
    (:func:`nodes_to_forget`) and the core never re-forms that content.

Bounds (:class:`~streams.core.limits.Limits`): the state row of a user holds at most
``max_negotiator_memories`` memories of at most ``max_negotiator_content_bytes`` each (a
``remember`` beyond either is refused with a ``limit.*`` error naming the setting; a forget
makes room), at most ``max_negotiator_forgotten`` forgotten ids and fingerprints (the oldest
are dropped: a re-delivery that old is outside Kafka's replay window), and a reply memo of at
most :data:`REPLY_MEMO_SIZE` entries holding at most :data:`REPLY_MEMO_REFS` memory refs in
all. Ids (``user_id``, ``request_id``, ``sessionId``, ``memoryId``) follow the id rules
(:func:`validate_request`, checked by the shell before the state is read: an invalid one is
dead-lettered, since the reply and the memo would carry it).

Replays (:func:`handle_request`, what the shell calls): ``remember`` is idempotent by its
derived id; forget results and errors are memoised per ``request_id`` (the last
:data:`REPLY_MEMO_SIZE` per user, ids and kinds only — never content), so a re-delivered
forget gets the same status and deletes nothing more.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .exposure import content_gate
from .ids import derive_id
from .ingest import REDACTED_CONTENT, Rejection
from .limits import DEFAULT_LIMITS, LimitExceeded, Limits, check_bytes, check_id, quote
from .nodes import content_fingerprint
from .similarity import normalize_text

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
REMEMBERABLE_KINDS: tuple[str, ...] = ("disclosure_rule", "playbook", "threshold")
REPLY_MEMO_SIZE = 256
#: memory refs ({id, kind} of a deleted or ambiguous match) kept in all memos of one user
REPLY_MEMO_REFS = 2048
ID_ROLE = "negotiator_memory"


class NegotiatorError(ValueError):
    """A request the store refuses; ``code`` is machine-readable, ``str(e)`` readable."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail

    def reply_error(self) -> str:
        return f"{self.code}: {self.detail}"


# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------


def empty_state(user_id: str) -> dict[str, Any]:
    return {"user_id": user_id, "memories": {}, "forgotten": {}, "forgotten_fingerprints": [], "replies": []}


def _ensure(state: Mapping[str, Any] | None, user_id: str) -> dict[str, Any]:
    """A deep copy of ``state`` (or a fresh one) with every key present."""
    if not state:
        return empty_state(user_id)
    s = copy.deepcopy(dict(state))
    if s.get("user_id") not in (None, user_id):
        raise NegotiatorError("wrong_user", f"state of {s.get('user_id')!r} given for {user_id!r}")
    s["user_id"] = user_id
    for k, v in empty_state(user_id).items():
        s.setdefault(k, v)
    return s


def memory_id_for(user_id: str, request_id: str) -> str:
    return derive_id(user_id, request_id, ID_ROLE)


def view_of(memory: Mapping[str, Any]) -> dict[str, str]:
    """The seed's ``NegotiatorMemoryToolView``: ``{id, kind, content}`` (no embedding, no refs)."""
    return {"id": memory["id"], "kind": memory["kind"], "content": memory["content"]}


def views(state: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """Every remembered memory, in creation order (created_at, id)."""
    if not state:
        return []
    return [view_of(m) for m in _ordered(state["memories"].values())]


def _ordered(memories: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(memories, key=lambda m: (int(m.get("created_at") or 0), m["id"]))


def forgotten_fingerprints(state: Mapping[str, Any] | None) -> frozenset[str]:
    return frozenset((state or {}).get("forgotten_fingerprints") or ())


def nodes_to_forget(nodes: Iterable[Mapping[str, Any]], fingerprints: Iterable[str]) -> list[str]:
    """Node ids (sorted) of memory nodes whose ``content_fingerprint`` was forgotten: the
    shell emits a ``memory_deleted`` for each."""
    fps = set(fingerprints)
    return sorted(n["node_id"] for n in nodes if n.get("content_fingerprint") in fps)


# --------------------------------------------------------------------------------------------
# remember
# --------------------------------------------------------------------------------------------


def validate_request(request: Any, limits: Limits = DEFAULT_LIMITS) -> Rejection | None:
    """None when the request's ids follow the id rules, else the Rejection (dead letter).
    Content and description sizes are checked by :func:`handle_request` (a reply error)."""
    if not isinstance(request, Mapping):
        return Rejection("not_a_record", "negotiator request is not a record")
    try:
        for field in ("user_id", "request_id"):
            v = request.get(field)
            if not isinstance(v, str) or not v:
                return Rejection(f"missing_{field}", f"{field} is missing or empty")
            check_id(field, v, limits)
        for field in ("sessionId", "memoryId"):
            v = request.get(field)
            if v is not None and v != "":
                check_id(field, v, limits)
    except LimitExceeded as e:
        return Rejection(e.code, e.detail)
    return None


def _limit_error(e: LimitExceeded) -> NegotiatorError:
    return NegotiatorError(e.code, e.detail)


def validate_remember(kind: Any, content: Any, limits: Limits = DEFAULT_LIMITS) -> tuple[str, str]:
    if kind not in REMEMBERABLE_KINDS:
        if kind == "counterparty_dossier":
            raise NegotiatorError(
                "kind_not_rememberable",
                "counterparty_dossier memories are distilled from negotiation transcripts, not dictated",
            )
        raise NegotiatorError(
            "kind_not_rememberable", f"kind {quote(kind)} is not one of {', '.join(REMEMBERABLE_KINDS)}"
        )
    if not isinstance(content, str) or not content.strip():
        raise NegotiatorError("empty_content", "content is missing or empty")
    content = content.strip()
    try:
        check_bytes("content", content, limits, "max_negotiator_content_bytes")
    except LimitExceeded as e:
        raise _limit_error(e) from None
    refused = content_gate(content)
    if refused is not None:
        raise NegotiatorError("instruction_form", refused)
    bad = _CONTROL_RE.search(content)
    if bad is not None:  # a stored control character costs 6 bytes of JSON (\u0001): none in a rule
        raise NegotiatorError("invalid_content", f"content has the control character {bad.group()!r} at position {bad.start()}")
    return kind, content


def remember(
    state: Mapping[str, Any] | None,
    user_id: str,
    kind: Any,  # validated here (validate_remember)
    content: Any,
    session_id: str | None,
    write_enabled: bool,
    request_id: str,
    now_ms: int,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Store a standing rule the client just stated. Returns ``(state, view)``, ``view``
    None when writes are disabled (state unchanged). Raises :class:`NegotiatorError` for a
    kind that cannot be remembered, empty content, content over
    ``max_negotiator_content_bytes`` or a store already holding ``max_negotiator_memories``
    (see the module doc)."""
    kind, content = validate_remember(kind, content, limits)
    s = _ensure(state, user_id)
    if not write_enabled:
        return s, None
    if not isinstance(request_id, str) or not request_id:
        raise NegotiatorError("missing_request_id", "remember needs a request_id (it derives the memory id)")
    mid = memory_id_for(user_id, request_id)
    existing = s["memories"].get(mid)
    if existing is not None:  # a re-delivered request: same memory, same view
        return s, view_of(existing)
    if mid in s["forgotten"]:  # re-delivered after it was forgotten: answer as before, store nothing
        return s, {"id": mid, "kind": kind, "content": content}
    if len(s["memories"]) >= limits.max_negotiator_memories:
        raise NegotiatorError(
            "limit.negotiator_memories",
            f"{len(s['memories'])} memories are stored; MEMSTREAM_MAX_NEGOTIATOR_MEMORIES is "
            f"{limits.max_negotiator_memories} (forget one first)",
        )
    s["memories"][mid] = {
        "id": mid,
        "kind": kind,
        "content": content,
        "session_id": session_id,
        "request_id": request_id,
        "created_at": int(now_ms),
        "content_fingerprint": content_fingerprint(content),
    }
    return s, view_of(s["memories"][mid])


# --------------------------------------------------------------------------------------------
# forget
# --------------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return normalize_text(text).split()


def match_description(description: str, memories: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The memories a description refers to (creation order), by the two tiers of the
    module doc. An empty description matches nothing."""
    words = _words(description or "")
    if not words:
        return []
    ordered = _ordered(memories)
    phrase = f" {' '.join(words)} "
    tier1 = [m for m in ordered if phrase in f" {' '.join(_words(m['content']))} "]
    if tier1:
        return tier1
    wanted = set(words)
    return [m for m in ordered if wanted <= set(_words(m["content"]))]


def forget(
    state: Mapping[str, Any] | None,
    user_id: str,
    memory_id: str | None = None,
    description: str | None = None,
    *,
    now_ms: int = 0,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Delete a memory by id or by description; always honoured (no write flag). Returns
    ``(state, result)`` with ``result`` the seed's ``NegotiatorMemoryForgetResult``. A
    description over ``max_negotiator_content_bytes`` raises :class:`NegotiatorError`."""
    if description:
        try:
            check_bytes("description", description, limits, "max_negotiator_content_bytes")
        except LimitExceeded as e:
            raise _limit_error(e) from None
    s = _ensure(state, user_id)
    memories = s["memories"]
    if memory_id:
        matches = [memories[memory_id]] if memory_id in memories else []
    else:
        matches = match_description(description or "", memories.values())
    if not matches:
        return s, {"status": "not_found"}
    if len(matches) > 1:
        return s, {"status": "ambiguous", "candidates": [view_of(m) for m in matches]}
    gone = memories.pop(matches[0]["id"])
    fp = gone.get("content_fingerprint") or content_fingerprint(gone["content"])
    s["forgotten"][gone["id"]] = {"content_fingerprint": fp, "forgotten_at": int(now_ms)}
    s["forgotten_fingerprints"] = sorted(set(s["forgotten_fingerprints"]) | {fp})
    _trim_forgotten(s, limits.max_negotiator_forgotten)
    return s, {"status": "deleted", "memory": view_of(gone)}


def forget_all(
    state: Mapping[str, Any] | None,
    user_id: str,
    *,
    now_ms: int = 0,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Forget every memory of the user (an erasure, :mod:`streams.core.erasure`): ``(state,
    forgotten ids in creation order)``. The state keeps no content: each memory's id and
    content fingerprint join ``forgotten`` / ``forgotten_fingerprints`` exactly as a ``forget``
    would leave them (so a re-delivered ``remember`` does not bring one back); the reply memo
    holds ids only. ``None`` in, ``None`` out (the user has no row)."""
    if state is None:
        return None, []
    s = _ensure(state, user_id)
    gone = _ordered(s["memories"].values())
    for m in gone:
        fp = m.get("content_fingerprint") or content_fingerprint(m["content"])
        s["forgotten"][m["id"]] = {"content_fingerprint": fp, "forgotten_at": int(now_ms)}
        s["forgotten_fingerprints"] = sorted(set(s["forgotten_fingerprints"]) | {fp})
    s["memories"] = {}
    _trim_forgotten(s, limits.max_negotiator_forgotten)
    return s, [m["id"] for m in gone]


def _trim_forgotten(s: dict[str, Any], keep: int) -> None:
    """Keep the newest ``keep`` forgotten ids (by (forgotten_at, id)) and the fingerprints of
    those and of no others; a fingerprint still held by a kept id stays."""
    forgotten = s["forgotten"]
    if len(forgotten) <= keep and len(s["forgotten_fingerprints"]) <= keep:
        return
    newest = sorted(forgotten.items(), key=lambda kv: (int(kv[1].get("forgotten_at") or 0), kv[0]))[-keep:] if keep > 0 else []
    s["forgotten"] = dict(newest)
    s["forgotten_fingerprints"] = sorted({v["content_fingerprint"] for _, v in newest})


# --------------------------------------------------------------------------------------------
# Records: NegotiatorRequest -> NegotiatorReply
# --------------------------------------------------------------------------------------------


def _forget_record(result: Mapping[str, Any]) -> dict[str, Any]:
    """The seed's union as the Avro ``ForgetResult`` record (``memory`` null and
    ``candidates`` [] where the union member has none)."""
    return {
        "status": result["status"],
        "memory": dict(result["memory"]) if result.get("memory") else None,
        "candidates": [dict(v) for v in result.get("candidates") or ()],
    }


def forget_result_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """Back from the ``ForgetResult`` record to the seed's union (for the HTTP API)."""
    status = record["status"]
    if status == "deleted":
        return {"status": "deleted", "memory": dict(record["memory"])}
    if status == "ambiguous":
        return {"status": "ambiguous", "candidates": [dict(v) for v in record.get("candidates") or ()]}
    return {"status": "not_found"}


def to_reply(
    request: Mapping[str, Any],
    *,
    remembered: Mapping[str, Any] | None = None,
    forget: Mapping[str, Any] | None = None,
    error: str | None = None,
    timestamp: int | None = None,
) -> dict[str, Any]:
    """A NegotiatorReply record (``schemas/negotiator_reply.avsc``) for ``request``.
    ``remembered`` null on a remember = write flag off; ``forget`` is the seed's result
    union; ``timestamp`` defaults to the request's (deterministic replies)."""
    op = request.get("op")
    return {
        "request_id": request["request_id"],
        "user_id": request["user_id"],
        "op": op if op in ("remember", "forget") else "unknown",
        "remembered": dict(remembered) if remembered else None,
        "forget": _forget_record(forget) if forget else None,
        "error": error,
        "timestamp": int(request["timestamp"] if timestamp is None else timestamp),
    }


def _ref(view: Mapping[str, Any]) -> dict[str, str]:
    return {"id": view["id"], "kind": view["kind"]}


def _memo_body(forgot: Mapping[str, Any] | None, err: str | None) -> dict[str, Any]:
    """What the memo keeps of a reply: ids and kinds, never content (a forgotten memory's
    content must not survive in the state)."""
    body: dict[str, Any] = {"error": err, "forget": None}
    if forgot is not None:
        body["forget"] = {
            "status": forgot["status"],
            "memory": _ref(forgot["memory"]) if forgot.get("memory") else None,
            "candidates": [_ref(v) for v in forgot.get("candidates") or ()],
        }
    return body


def _rebuild(state: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, str]:
    m = state["memories"].get(ref["id"])
    if m is not None:
        return view_of(m)
    return {"id": ref["id"], "kind": ref["kind"], "content": REDACTED_CONTENT}


def _replayed_forget(state: Mapping[str, Any], memo: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if memo is None:
        return None
    if memo["status"] == "deleted":
        return {"status": "deleted", "memory": _rebuild(state, memo["memory"])}
    if memo["status"] == "ambiguous":
        return {"status": "ambiguous", "candidates": [_rebuild(state, r) for r in memo["candidates"]]}
    return {"status": "not_found"}


def _memo_get(state: Mapping[str, Any], request_id: str) -> dict[str, Any] | None:
    for rid, body in state.get("replies") or ():
        if rid == request_id:
            return body
    return None


def _memo_refs(body: Mapping[str, Any]) -> int:
    forgot = body.get("forget") or {}
    return (1 if forgot.get("memory") else 0) + len(forgot.get("candidates") or ())


def _memo_put(state: dict[str, Any], request_id: str, body: Mapping[str, Any]) -> None:
    """Add a memo; the oldest go beyond REPLY_MEMO_SIZE memos or REPLY_MEMO_REFS refs in all
    (an ambiguous forget lists up to max_negotiator_memories refs)."""
    replies = [r for r in state.get("replies") or () if r[0] != request_id]
    replies.append([request_id, dict(body)])
    replies = replies[-REPLY_MEMO_SIZE:]
    refs = sum(_memo_refs(b) for _, b in replies)
    while len(replies) > 1 and refs > REPLY_MEMO_REFS:
        refs -= _memo_refs(replies.pop(0)[1])
    state["replies"] = replies


def handle_request(
    state: Mapping[str, Any] | None, request: Mapping[str, Any], write_enabled: bool,
    limits: Limits | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One NegotiatorRequest → ``(state, NegotiatorReply)``; never raises on bad requests
    (unknown op, refused kind, empty content, no reference → ``error``). ``now_ms`` is the
    request's timestamp (deterministic replay).

    Re-delivery (at-least-once): ``remember`` is idempotent by its derived id; ``forget``
    replies and errors are memoised per ``request_id`` (ids and kinds only), so a replayed
    forget gets the same status and deletes nothing more — without the memo a replayed
    ``forget "Open"`` that was ambiguous could delete the one candidate left after the user
    picked the other by id. A replayed reply shows ``"[REDACTED]"`` as the content of a memory
    that is gone by then."""
    limits = limits or DEFAULT_LIMITS
    user_id = request["user_id"]
    rid = request["request_id"]
    now_ms = int(request["timestamp"])
    try:
        s = _ensure(state, user_id)
    except NegotiatorError as e:
        return copy.deepcopy(dict(state or {})), to_reply(request, error=e.reply_error())
    memo = _memo_get(s, rid)
    if memo is not None:
        return s, to_reply(request, forget=_replayed_forget(s, memo.get("forget")), error=memo.get("error"))
    remembered = forgot = err = None
    op = request.get("op")
    try:
        if op == "remember":
            s, remembered = remember(
                s, user_id, request.get("kind"), request.get("content"), request.get("sessionId"), write_enabled, rid,
                now_ms, limits,
            )
        elif op == "forget":
            if not request.get("memoryId") and not (request.get("description") or "").strip():
                raise NegotiatorError("missing_reference", "forget needs memoryId or description")
            s, forgot = forget(s, user_id, request.get("memoryId"), request.get("description"), now_ms=now_ms,
                               limits=limits)
        else:
            raise NegotiatorError("unknown_op", f"op {quote(op)} is not remember or forget")
    except NegotiatorError as e:
        err = e.reply_error()
    if forgot is not None or err is not None:
        _memo_put(s, rid, _memo_body(forgot, err))
    return s, to_reply(request, remembered=remembered, forget=forgot, error=err)
