"""The memory node (a plain dict with exactly the MemoryNode fields of docs/records.md),
bi-temporal validity, content fingerprints and decay.

Validity: a node is valid at T iff ``valid_from <= T < valid_until`` (``valid_until`` null =
open interval). A supersession closes the old node's interval at the new node's
``valid_from`` and opens the new one there, so exactly one of them is valid at any T after
the new node's ``valid_from`` and ``as_of`` returns both versions of history.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from .similarity import normalize_text

DAY_MS = 24 * 60 * 60 * 1000

#: Default half-lives (SPEC §4.4) and the growth cap.
SEMANTIC_HALF_LIFE_MS = 30 * DAY_MS
EPISODIC_HALF_LIFE_MS = 3 * DAY_MS
MAX_HALF_LIFE_MS = 365 * DAY_MS
HALF_LIFE_GROWTH = 1.5

#: Every field of memstream.memory.MemoryNode, in schema order.
NODE_FIELDS: tuple[str, ...] = (
    "node_id",
    "motebit_id",
    "content",
    "sensitivity",
    "source",
    "memory_type",
    "confidence",
    "reinforcement_count",
    "half_life_ms",
    "created_at",
    "updated_at",
    "valid_from",
    "valid_until",
    "superseded_by",
    "pinned",
    "promoted",
    "instruction_form",
    "last_accessed_at",
    "access_count",
    "content_fingerprint",
    "embedding",
    "frontmatter_type",
    "kind",
    "session_id",
    "origin_event_id",
)


def content_fingerprint(content: str) -> str:
    """Stable hash of the normalized content (``sha256:<hex>``). Case, punctuation and
    whitespace variants of the same words share a fingerprint, so a forgotten memory cannot
    be re-formed by re-typing it with different capitalisation."""
    return "sha256:" + hashlib.sha256(normalize_text(content).encode("utf-8")).hexdigest()


def default_half_life_ms(memory_type: str) -> int:
    return EPISODIC_HALF_LIFE_MS if memory_type == "episodic" else SEMANTIC_HALF_LIFE_MS


def grown_half_life_ms(half_life_ms: int) -> int:
    """Half-life after one reinforcement: ×1.5, capped at 365 days (integer ms)."""
    return min(MAX_HALF_LIFE_MS, int(half_life_ms * HALF_LIFE_GROWTH))


def make_node(
    *,
    node_id: str,
    motebit_id: str,
    content: str,
    sensitivity: str,
    memory_type: str,
    confidence: float,
    created_at: int,
    valid_from: int,
    origin_event_id: str,
    source: str | None = None,
    valid_until: int | None = None,
    half_life_ms: int | None = None,
    instruction_form: bool = False,
    embedding: list[float] | None = None,
    frontmatter_type: str | None = None,
    kind: str | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """A new node record with every MemoryNode field set."""
    return {
        "node_id": node_id,
        "motebit_id": motebit_id,
        "content": content,
        "sensitivity": sensitivity,
        "source": source,
        "memory_type": memory_type,
        "confidence": float(confidence),
        "reinforcement_count": 0,
        "half_life_ms": int(half_life_ms if half_life_ms is not None else default_half_life_ms(memory_type)),
        "created_at": int(created_at),
        "updated_at": int(created_at),
        "valid_from": int(valid_from),
        "valid_until": valid_until,
        "superseded_by": None,
        "pinned": False,
        "promoted": False,
        "instruction_form": bool(instruction_form),
        "last_accessed_at": None,
        "access_count": 0,
        "content_fingerprint": content_fingerprint(content),
        "embedding": list(embedding) if embedding is not None else None,
        "frontmatter_type": frontmatter_type,
        "kind": kind,
        "session_id": session_id,
        "origin_event_id": origin_event_id,
    }


def complete_node(record: Mapping[str, Any]) -> dict[str, Any]:
    """A node dict from a (possibly older-schema) record: missing fields get their schema
    defaults, unknown fields are dropped, a missing fingerprint is computed."""
    node: dict[str, Any] = {
        "source": None,
        "memory_type": "semantic",
        "reinforcement_count": 0,
        "valid_until": None,
        "superseded_by": None,
        "pinned": False,
        "promoted": False,
        "instruction_form": False,
        "last_accessed_at": None,
        "access_count": 0,
        "embedding": None,
        "frontmatter_type": None,
        "kind": None,
        "session_id": None,
    }
    node.update({k: v for k, v in record.items() if k in NODE_FIELDS})
    node.setdefault("half_life_ms", default_half_life_ms(node["memory_type"]))
    node.setdefault("updated_at", node.get("created_at", 0))
    node.setdefault("valid_from", node.get("created_at", 0))
    node.setdefault("origin_event_id", node.get("node_id"))
    if not node.get("content_fingerprint"):
        node["content_fingerprint"] = content_fingerprint(node["content"])
    missing = [f for f in NODE_FIELDS if f not in node]
    if missing:
        raise ValueError(f"node record lacks required fields {missing}")
    return node


def is_open(node: Mapping[str, Any]) -> bool:
    """The node's validity has not been closed (it is a *live* node)."""
    return node.get("valid_until") is None


def valid_at(node: Mapping[str, Any], t: int) -> bool:
    """``valid_from <= t < valid_until`` (open when ``valid_until`` is null)."""
    vu = node.get("valid_until")
    return node["valid_from"] <= t and (vu is None or t < vu)


def as_of(nodes: Iterable[Mapping[str, Any]], t: int) -> list[Mapping[str, Any]]:
    """The nodes valid at ``t``, in (valid_from, node_id) order."""
    return sorted((n for n in nodes if valid_at(n, t)), key=lambda n: (n["valid_from"], n["node_id"]))


def decay_reference_ms(node: Mapping[str, Any]) -> int:
    """Decay runs from the later of the last change (formation, reinforcement, promotion)
    and the last access — an accessed memory is a live one."""
    return max(int(node["updated_at"]), int(node.get("last_accessed_at") or 0))


def decayed_confidence(node: Mapping[str, Any], now_ms: int) -> float:
    """``c · 0.5^(elapsed / half_life)`` (SPEC §4.4); no growth for negative elapsed time. A
    half-life ≤ 0 means no decay: the confidence is returned unchanged (the reference's
    ``computeDecayedConfidence``, motebit packages/memory-graph/src/index.ts), never 0."""
    hl = int(node["half_life_ms"])
    if hl <= 0:
        return float(node["confidence"])
    elapsed = max(0, int(now_ms) - decay_reference_ms(node))
    return float(node["confidence"]) * 0.5 ** (elapsed / hl)
