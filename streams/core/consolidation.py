"""Consolidation: decide what a candidate memory does to a user's memory, then apply it.

Decisions (SPEC §4.2), in this order:

1. **Hard rules** (:func:`hard_rules`, applied before any decider so a plugged-in judge can
   never override them): ``sensitivity == secret`` (or above ``policy.max_sensitivity``) →
   reject; content whose fingerprint was deleted → reject (never re-formed).
2. **Explicit supersession**: ``supersedes`` names a node → the live head of its
   supersession chain is superseded. A name that resolves to nothing live (unknown or
   deleted) is ignored and the decider goes on.
3. **Similarity** against the user's live nodes of the same ``memory_type``, found through
   the similarity index (a small candidate set) and scored exactly: cosine of the
   embeddings when the candidate and the node both have one of the same dimension, else the
   Jaccard text similarity.

   * score ≥ merge threshold (cosine 0.95 / text 0.85) → **merge** into that node
     (reinforce), unless the two differ in polarity (one states a negation the other does
     not: "likes coffee" vs "doesn't like coffee") — then it is a contradiction;
   * supersede threshold ≤ score < merge threshold (cosine 0.80 / text 0.50) on a *semantic*
     node → a **contradiction**: same topic, different content ("favourite colour is blue" vs
     "… green") → **supersede**. Episodic memories are events: two similar episodes are both
     true, so the band does not supersede them (→ accept);
   * otherwise **accept** (form a new node).

   Among several matches: merge beats contradiction, then the higher score, then the
   smaller node_id (total order → replayable).

This contradiction heuristic is lexical and deliberately simple (no model): it cannot tell
"likes hiking" + "likes swimming" (both true) from a changed fact. The :class:`Decider`
protocol is where an LLM judge can replace it; the hard rules and the shape checks of
:func:`check_decision` still apply to any decider.

Apply (:func:`apply`): returns the derived ledger events (deterministic ids from the
candidate id, timestamps = the candidate's event time, Lamport ``version_clock``) and the
node upserts, and updates the :class:`~streams.core.state.UserMemory` in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .ids import event_id_for, node_id_for
from .nodes import DAY_MS, content_fingerprint, make_node
from .similarity import SimilarityIndex, cosine, has_negation, jaccard, text_shingles, usable_embedding
from .state import UserMemory
from .vocabulary import WIRE_ACTIONS, max_sensitivity, sensitivity_rank


@dataclass(frozen=True)
class ConsolidationPolicy:
    """Decision thresholds and reinforcement arithmetic (wired to settings by the shell)."""

    text_merge_threshold: float = 0.85
    text_supersede_threshold: float = 0.50
    embedding_merge_threshold: float = 0.95
    embedding_supersede_threshold: float = 0.80
    #: memory types on which the contradiction band supersedes (episodes do not contradict)
    contradiction_memory_types: tuple[str, ...] = ("semantic",)
    #: near-duplicates that differ in negation are contradictions, not merges
    negation_contradicts: bool = True
    #: compare a candidate only with live nodes of its own memory_type
    same_memory_type_only: bool = True
    #: a candidate at or above this sensitivity is rejected (secret is never stored)
    max_sensitivity_rejected: str = "secret"
    #: confidence of a node formed from a candidate that carries none
    default_confidence: float = 0.7
    #: merge (reinforce / noop): confidence' = min(1, c + step)   (0.7 → 0.8 → 0.9 → 1.0), the
    #: reference's arithmetic (motebit packages/memory-graph/src/index.ts consolidateAndForm)
    reinforcement_step: float = 0.1
    semantic_half_life_ms: int = 30 * DAY_MS
    episodic_half_life_ms: int = 3 * DAY_MS
    max_half_life_ms: int = 365 * DAY_MS
    half_life_growth: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.text_supersede_threshold <= self.text_merge_threshold <= 1.0:
            raise ValueError("need 0 <= text_supersede_threshold <= text_merge_threshold <= 1")
        if not -1.0 <= self.embedding_supersede_threshold <= self.embedding_merge_threshold <= 1.0:
            raise ValueError("need -1 <= embedding_supersede_threshold <= embedding_merge_threshold <= 1")
        if not 0.0 <= self.reinforcement_step <= 1.0 or not 0.0 <= self.default_confidence <= 1.0:
            raise ValueError("reinforcement_step and default_confidence must be in 0..1")
        sensitivity_rank(self.max_sensitivity_rejected)

    def half_life_for(self, memory_type: str) -> int:
        return self.episodic_half_life_ms if memory_type == "episodic" else self.semantic_half_life_ms


@dataclass(frozen=True)
class Decision:
    """What to do with a candidate. ``action`` is in the wire vocabulary."""

    action: str  # accept | merge | supersede | reject
    reason: str
    code: str  # machine-readable: no_similar, near_duplicate, explicit_supersedes, contradiction, negation, secret, deleted_content, …
    existing_node_id: str | None = None
    score: float | None = None
    measure: str | None = None  # "cosine" | "jaccard" | None


@runtime_checkable
class Decider(Protocol):
    """Pluggable consolidation judge. Must be deterministic (same candidate + same state →
    same decision) for replays to converge; must not mutate ``memory``."""

    def decide(self, candidate: Mapping[str, Any], memory: UserMemory, policy: ConsolidationPolicy) -> Decision: ...


# --------------------------------------------------------------------------------------------
# Hard rules
# --------------------------------------------------------------------------------------------


def hard_rules(candidate: Mapping[str, Any], memory: UserMemory, policy: ConsolidationPolicy) -> Decision | None:
    """Rejections no decider may override; None when the candidate may be consolidated."""
    if sensitivity_rank(candidate["sensitivity"]) >= sensitivity_rank(policy.max_sensitivity_rejected):
        return Decision("reject", f"sensitivity {candidate['sensitivity']} is never stored", "secret")
    if memory.is_deleted_content(content_fingerprint(candidate["content"])):
        return Decision("reject", "content was deleted and is never re-formed", "deleted_content")
    return None


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

_MERGE, _CONTRADICTION, _NONE = 2, 1, 0


@dataclass
class _Query:
    content: str
    shingles: frozenset[str]
    embedding: list[float] | None
    negated: bool
    memory_type: str
    #: where the shingle sets of the user's nodes are cached (None: computed each time)
    index: SimilarityIndex | None = None
    #: exact Jaccard scores already computed in one pass (node_id -> score; see
    #: SimilarityIndex.scored_candidates)
    text_scores: dict[str, float] = field(default_factory=dict)


def _query(candidate: Mapping[str, Any], index: SimilarityIndex | None = None) -> _Query:
    emb = candidate.get("embedding")
    return _Query(
        content=candidate["content"],
        shingles=text_shingles(candidate["content"]),
        embedding=list(emb) if usable_embedding(emb) else None,
        negated=has_negation(candidate["content"]),
        memory_type=candidate.get("memory_type") or "semantic",
        index=index,
    )


def _node_shingles(q: _Query, node: Mapping[str, Any]) -> frozenset[str]:
    if q.index is None:
        return text_shingles(node["content"])
    return q.index.shingles_of(node["node_id"], node["content"])


def score_pair(q: _Query, node: Mapping[str, Any]) -> tuple[float, str]:
    """(score, measure): cosine when both have same-dimension embeddings, else Jaccard."""
    ne = node.get("embedding")
    if q.embedding is not None and ne is not None and len(ne) == len(q.embedding):
        c = cosine(q.embedding, ne)
        if c is not None:
            return c, "cosine"
    score = q.text_scores.get(node["node_id"])
    if score is None:
        score = jaccard(q.shingles, _node_shingles(q, node))
    return score, "jaccard"


def classify(q: _Query, node: Mapping[str, Any], policy: ConsolidationPolicy) -> tuple[int, float, str, str]:
    """(class, score, measure, code) of one live node against the query."""
    score, measure = score_pair(q, node)
    if measure == "cosine":
        merge_t, sup_t = policy.embedding_merge_threshold, policy.embedding_supersede_threshold
    else:
        merge_t, sup_t = policy.text_merge_threshold, policy.text_supersede_threshold
    contradiction_ok = node.get("memory_type", "semantic") in policy.contradiction_memory_types
    if score >= merge_t:
        if policy.negation_contradicts and q.negated != has_negation(node["content"]):
            return (_CONTRADICTION if contradiction_ok else _NONE), score, measure, "negation"
        return _MERGE, score, measure, "near_duplicate"
    if score >= sup_t and contradiction_ok:
        return _CONTRADICTION, score, measure, "contradiction"
    return _NONE, score, measure, "no_similar"


class DeterministicDecider:
    """The default decider (see the module doc). ``use_index=False`` scans every live node
    (the brute-force reference the index is tested against)."""

    def __init__(self, use_index: bool = True) -> None:
        self.use_index = use_index
        #: size of the last scored set (observability / benchmarks)
        self.last_scored = 0

    def decide(self, candidate: Mapping[str, Any], memory: UserMemory, policy: ConsolidationPolicy) -> Decision:
        hard = hard_rules(candidate, memory, policy)
        if hard is not None:
            return hard
        target = candidate.get("supersedes")
        if target:
            head = memory.head_of(target)
            if head is not None:
                via = "" if head["node_id"] == target else f" (head of the chain from {target})"
                return Decision(
                    "supersede",
                    f"candidate explicitly supersedes {head['node_id']}{via}",
                    "explicit_supersedes",
                    existing_node_id=head["node_id"],
                )
        q = _query(candidate, memory.index)
        if self.use_index:
            # without an embedding every node is scored by Jaccard, and below the lowest text
            # threshold classify() finds nothing (no_similar): the index leaves those out
            floor = min(policy.text_supersede_threshold, policy.text_merge_threshold)
            ids, q.text_scores = memory.index.scored_candidates(q.content, q.embedding, q.shingles, floor)
        else:
            ids = set(memory.live)
        best: tuple[int, float, str] | None = None  # (class, score, -) ordering helper
        best_info: tuple[str, str, str] | None = None  # node_id, measure, code
        scored = 0
        for nid in ids:
            node = memory.live.get(nid)
            if node is None:
                continue
            if policy.same_memory_type_only and node.get("memory_type", "semantic") != q.memory_type:
                continue
            scored += 1
            cls, score, measure, code = classify(q, node, policy)
            if cls == _NONE:
                continue
            key = (cls, score)
            if best is None or key > best[:2] or (key == best[:2] and nid < best[2]):
                best = (cls, score, nid)
                best_info = (nid, measure, code)
        self.last_scored = scored
        if best is None or best_info is None:
            return Decision("accept", "no similar live memory", "no_similar")
        cls, score, nid = best
        _, measure, code = best_info
        if cls == _MERGE:
            return Decision("merge", f"near-duplicate of {nid} ({measure} {score:.4f})", code, nid, score, measure)
        what = "negates" if code == "negation" else "contradicts"
        return Decision("supersede", f"{what} {nid} ({measure} {score:.4f})", code, nid, score, measure)


def check_decision(decision: Decision, memory: UserMemory) -> str | None:
    """Why ``decision`` cannot be applied to ``memory`` (None when it can)."""
    if not isinstance(decision, Decision):
        return f"decider returned {type(decision).__name__}, not a Decision"
    if decision.action not in WIRE_ACTIONS:
        return f"action {decision.action!r} is not in the wire vocabulary"
    if decision.action in ("merge", "supersede"):
        if not decision.existing_node_id or decision.existing_node_id not in memory.live:
            return f"{decision.action} target {decision.existing_node_id!r} is not a live node"
    return None


# --------------------------------------------------------------------------------------------
# Apply
# --------------------------------------------------------------------------------------------


@dataclass
class Applied:
    events: list[dict[str, Any]] = field(default_factory=list)
    upserts: list[dict[str, Any]] = field(default_factory=list)
    node_id: str | None = None  # the node formed or reinforced


def derived_event(
    memory: UserMemory, source_id: str, event_type: str, timestamp: int, payload: dict[str, Any]
) -> dict[str, Any]:
    """A MemoryEvent envelope derived from input ``source_id`` (deterministic id)."""
    return {
        "event_id": event_id_for(memory.motebit_id, source_id, event_type),
        "motebit_id": memory.motebit_id,
        "device_id": None,
        "timestamp": int(timestamp),
        "version_clock": memory.next_clock(),
        "event_type": event_type,
        "payload": payload,
    }


def formed_payload(node: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "node_id": node["node_id"],
        "content": node["content"],
        "sensitivity": node["sensitivity"],
        "source": node.get("source"),
        "redacted": None,
        "redacted_sensitivity": None,
        "redacted_reason": None,
        "valid_from": node["valid_from"],
        "valid_until": node.get("valid_until"),
    }


def consolidated_payload(
    action: str, reason: str, existing: str | None, new: str | None, superseded_valid_until: int | None = None
) -> dict[str, Any]:
    return {
        "action": action,
        "existing_node_id": existing,
        "new_node_id": new,
        "reason": reason,
        "superseded_valid_until": superseded_valid_until,
    }


def _new_node(candidate: Mapping[str, Any], memory: UserMemory, policy: ConsolidationPolicy, instruction_form: bool) -> dict[str, Any]:
    ts = int(candidate["timestamp"])
    conf = candidate.get("confidence")
    return make_node(
        node_id=node_id_for(memory.motebit_id, candidate["candidate_id"]),
        motebit_id=memory.motebit_id,
        content=candidate["content"],
        sensitivity=candidate["sensitivity"],
        source=candidate.get("source"),
        memory_type=candidate.get("memory_type") or "semantic",
        confidence=policy.default_confidence if conf is None else float(conf),
        created_at=ts,
        valid_from=int(candidate["valid_from"]) if candidate.get("valid_from") is not None else ts,
        origin_event_id=candidate["candidate_id"],
        half_life_ms=policy.half_life_for(candidate.get("memory_type") or "semantic"),
        instruction_form=instruction_form,
        embedding=candidate.get("embedding"),
        frontmatter_type=candidate.get("frontmatter_type"),
        kind=candidate.get("kind"),
        session_id=candidate.get("session_id"),
    )


def reinforce(node: Mapping[str, Any], candidate: Mapping[str, Any], policy: ConsolidationPolicy, instruction_form: bool) -> dict[str, Any]:
    """The merged node: confidence up, count + 1, half-life × growth (capped); the stricter
    sensitivity of the two is kept (fail closed), instruction-form is sticky."""
    c = float(node["confidence"])
    return {
        **node,
        "confidence": min(1.0, c + policy.reinforcement_step),
        "reinforcement_count": int(node["reinforcement_count"]) + 1,
        "half_life_ms": min(policy.max_half_life_ms, int(int(node["half_life_ms"]) * policy.half_life_growth)),
        "updated_at": max(int(node["updated_at"]), int(candidate["timestamp"])),
        "sensitivity": max_sensitivity(node["sensitivity"], candidate["sensitivity"]),
        "instruction_form": bool(node.get("instruction_form")) or instruction_form,
    }


def apply(
    candidate: Mapping[str, Any],
    decision: Decision,
    memory: UserMemory,
    policy: ConsolidationPolicy,
    *,
    instruction_form: bool = False,
) -> Applied:
    """Carry out ``decision`` (checked with :func:`check_decision` first) on ``memory``.

    accept    → memory_formed, memory_consolidated(accept, new_node_id=new)
    merge     → memory_consolidated(merge, existing=new=target); the target reinforced
    supersede → memory_formed(new), memory_consolidated(supersede, existing=old, new=new,
                superseded_valid_until=close); old.valid_until = close, old.superseded_by = new
    reject    → memory_consolidated(reject) (no content in the event)
    """
    cid = candidate["candidate_id"]
    ts = int(candidate["timestamp"])
    out = Applied()
    if decision.action == "reject":
        out.events.append(
            derived_event(memory, cid, "memory_consolidated", ts, consolidated_payload("reject", decision.reason, None, None))
        )
        return out
    if decision.action == "merge":
        target = memory.live[decision.existing_node_id]  # type: ignore[index]
        merged = reinforce(target, candidate, policy, instruction_form)
        memory.put_node(merged)
        out.upserts.append(merged)
        out.node_id = merged["node_id"]
        out.events.append(
            derived_event(
                memory, cid, "memory_consolidated", ts,
                consolidated_payload("merge", decision.reason, merged["node_id"], merged["node_id"]),
            )
        )
        return out
    new = _new_node(candidate, memory, policy, instruction_form)
    out.node_id = new["node_id"]
    if decision.action == "accept":
        memory.put_node(new)
        out.upserts.append(new)
        out.events.append(derived_event(memory, cid, "memory_formed", ts, formed_payload(new)))
        out.events.append(
            derived_event(
                memory, cid, "memory_consolidated", ts,
                consolidated_payload("accept", decision.reason, None, new["node_id"]),
            )
        )
        return out
    # supersede
    old = memory.live[decision.existing_node_id]  # type: ignore[index]
    close_at = max(int(new["valid_from"]), int(old["valid_from"]))
    closed = {
        **old,
        "valid_until": close_at,
        "superseded_by": new["node_id"],
        "updated_at": max(int(old["updated_at"]), ts),
    }
    memory.put_node(closed)
    memory.put_node(new)
    out.upserts.extend([closed, new])
    out.events.append(derived_event(memory, cid, "memory_formed", ts, formed_payload(new)))
    out.events.append(
        derived_event(
            memory, cid, "memory_consolidated", ts,
            consolidated_payload("supersede", decision.reason, old["node_id"], new["node_id"], close_at),
        )
    )
    return out
