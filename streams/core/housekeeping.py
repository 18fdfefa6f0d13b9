"""Housekeeping (SPEC §4.4): decay, retention, access and pinning — the pure rules.

The partition-local timer of the Faust shell calls :func:`sweep_memory` on a user's
:class:`UserMemory` (:func:`select_expired` is its selection over bare node records, and
:func:`deletion_event` the event it emits). ``memory_accessed`` and ``memory_pinned`` change
nodes through the one event entry point, :func:`streams.core.process.process_event` (the rules
are restated below because decay, retention and "cold" read what they write).

Decay
    ``decayed_confidence = c · 0.5^(elapsed / half_life)`` — :func:`streams.core.nodes.decayed_confidence`,
    ``elapsed`` measured from the later of the node's last change (``updated_at``: formation,
    reinforcement, promotion) and its last access. Half-life: 30 d semantic, 3 d episodic,
    ×1.5 per reinforcement, capped at 365 d (:func:`half_life_for`, built on the nodes.py helpers).

Pruning (:func:`prune_reason`), in this order:

1. **pinned** nodes are exempt from everything below, at any age;
2. **retention**: ``now − created_at`` *strictly greater* than the retention of the node's
   sensitivity (personal 365 d, medical 90 d, financial 90 d, secret 30 d, none never) →
   ``"retention_expired"``. Exactly at the boundary (age == retention) the node survives;
   one millisecond later it goes. Applies to live *and* superseded (closed) nodes: retention
   is a privacy bound on history too. A sensitivity outside the vocabulary gets the retention
   of ``secret`` (fail closed: the schema reads an unknown level as secret as well);
3. **decay**: a *live* (open) node whose decayed confidence is *strictly under*
   ``prune_below`` (0.5) → ``"decayed"``. Exactly 0.5 survives. Closed (superseded) nodes are
   history, kept for as-of queries: they do not decay away, only retention removes them.

Deletion events: one ``memory_deleted`` per node, ``event_id =
event_id_for(user, node_id, "memory_deleted")``. Why the node id alone is the right source
id: a node is deleted at most once (deleted ids are remembered for ever and a node id never
forms again), whereas a sweep repeated after a crash runs at a *different* ``now_ms`` — any
time bucket in the id would move to the next bucket and mint a second deletion event for
the same node. With the node id the re-run produces the same id and consumers de-duplicate
on it. (The timestamp / version_clock of the repeated event may differ; the id does not.)

Access (``process_event`` of a ``memory_accessed``): ``last_accessed_at`` becomes the max of
the old value and the event time (a late access never moves it back) and ``access_count`` goes
up by one, so any delivery order of the same accesses gives the same node.

Cold vs live (:func:`is_cold`): a node not accessed (or, never accessed, not formed) for
more than ``cold_after_ms`` is cold. Cold is informational (analytics, recall ranking); it
does not delete anything.

Pins (``process_event`` of a ``memory_pinned``): the latest ``memory_pinned`` wins by
``(timestamp, version_clock, event_id)`` (:func:`streams.core.ingest.event_sort_key`; the id only
breaks exact ties). The ordering key is *not* a MemoryNode field, so ``UserMemory.pins`` keeps it
(one :data:`~streams.core.state.Pin` per node id), also for a node that has not formed yet, so a
pin that overtakes its node still applies. Pinning a deleted node does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .ids import HOUSEKEEPING, event_id_for, input_reference
from .nodes import (
    DAY_MS,
    decayed_confidence,
    default_half_life_ms,
    grown_half_life_ms,
    is_open,
)
from .state import UserMemory
from .vocabulary import SENSITIVITY_LEVELS, is_sensitivity

#: Reasons returned by :func:`prune_reason` / :func:`select_expired`.
REASON_DECAYED = "decayed"
REASON_RETENTION = "retention_expired"

DEFAULT_RETENTION_MS: Mapping[str, int | None] = {
    "none": None,
    "personal": 365 * DAY_MS,
    "medical": 90 * DAY_MS,
    "financial": 90 * DAY_MS,
    "secret": 30 * DAY_MS,
}


def _default_retention() -> dict[str, int | None]:
    return dict(DEFAULT_RETENTION_MS)


@dataclass(frozen=True)
class HousekeepingPolicy:
    """Thresholds of the housekeeping timer (wired to settings by the shell).

    ``retention_ms`` overlays :data:`DEFAULT_RETENTION_MS`: a partial table changes only the
    levels it names; ``None`` means "kept for ever"."""

    prune_below: float = 0.5
    retention_ms: Mapping[str, int | None] = field(default_factory=_default_retention)
    cold_after_ms: int = 30 * DAY_MS

    def __post_init__(self) -> None:
        table = {**DEFAULT_RETENTION_MS, **dict(self.retention_ms)}
        unknown = sorted(set(table) - set(SENSITIVITY_LEVELS))
        if unknown:
            raise ValueError(f"retention_ms names unknown sensitivity levels {unknown}")
        if any(v is not None and v < 0 for v in table.values()):
            raise ValueError("retention must be >= 0 ms (or None for never)")
        object.__setattr__(self, "retention_ms", table)

    def retention_for(self, sensitivity: Any) -> int | None:
        """Retention of a sensitivity level; an unknown level gets ``secret``'s (fail closed)."""
        level = sensitivity if is_sensitivity(sensitivity) else "secret"
        return self.retention_ms[level]


_DEFAULT_POLICY = HousekeepingPolicy()


# --------------------------------------------------------------------------------------------
# Decay / retention
# --------------------------------------------------------------------------------------------


def half_life_for(memory_type: str, reinforcement_count: int = 0) -> int:
    """Half-life (ms) of a node of ``memory_type`` reinforced ``reinforcement_count`` times:
    the default (30 d semantic / 3 d episodic) grown ×1.5 per reinforcement, capped at 365 d
    (same integer arithmetic as consolidation's reinforcement)."""
    hl = default_half_life_ms(memory_type)
    for _ in range(max(0, int(reinforcement_count))):
        grown = grown_half_life_ms(hl)
        if grown == hl:
            break
        hl = grown
    return hl


def age_ms(node: Mapping[str, Any], now_ms: int) -> int:
    """Age for retention: measured from ``created_at`` (when the node formed)."""
    return int(now_ms) - int(node["created_at"])


def prune_reason(node: Mapping[str, Any], now_ms: int, policy: HousekeepingPolicy | None = None) -> str | None:
    """Why housekeeping deletes ``node`` at ``now_ms`` — :data:`REASON_RETENTION`,
    :data:`REASON_DECAYED` — or None when it stays (see the module doc for the exact rules
    and boundaries)."""
    policy = policy or _DEFAULT_POLICY
    if node.get("pinned"):
        return None
    keep = policy.retention_for(node.get("sensitivity"))
    if keep is not None and age_ms(node, now_ms) > keep:
        return REASON_RETENTION
    if is_open(node) and decayed_confidence(node, now_ms) < policy.prune_below:
        return REASON_DECAYED
    return None


def select_expired(
    nodes: Iterable[Mapping[str, Any]], now_ms: int, policy: HousekeepingPolicy | None = None
) -> list[tuple[str, str]]:
    """``[(node_id, reason)]`` of the nodes to delete at ``now_ms``, in node_id order."""
    policy = policy or _DEFAULT_POLICY
    out = [(n["node_id"], r) for n in nodes if (r := prune_reason(n, now_ms, policy)) is not None]
    return sorted(out)


def deletion_event(motebit_id: str, node_id: str, now_ms: int, version_clock: int) -> dict[str, Any]:
    """The ``memory_deleted`` MemoryEvent housekeeping emits for ``node_id`` (deterministic
    id: the same for every re-run of the sweep, see the module doc)."""
    return {
        "event_id": event_id_for(motebit_id, node_id, "memory_deleted"),
        "motebit_id": motebit_id,
        "device_id": None,
        "timestamp": int(now_ms),
        "version_clock": int(version_clock),
        "event_type": "memory_deleted",
        "payload": {"node_id": node_id},
        "caused_by": input_reference(HOUSEKEEPING, node_id),
    }


def sweep_memory(memory: UserMemory, now_ms: int, policy: HousekeepingPolicy | None = None):
    """Run housekeeping on one user's state: erase every expired node (its fingerprint and
    id are remembered, so it never re-forms) and return an
    :class:`~streams.core.process.Outcome` with one ``memory_deleted`` per node on the ledger
    and the node ids to tombstone on ``memory.nodes.v1``. The relay side (deletion
    tombstones) is :func:`streams.core.redaction.relay_events` applied to those ledger events.
    Cost: one pass over the user's nodes (a timer, not per record)."""
    from .process import Outcome  # process imports state; keep the import graph acyclic

    out = Outcome()
    for nid, _reason in select_expired(memory.nodes(), now_ms, policy):
        out.delete(nid, memory.erase_node(nid))
        event = deletion_event(memory.motebit_id, nid, now_ms, memory.next_clock())
        out.ledger.append(event)
        memory.seen.add("e:" + event["event_id"], now_ms)  # our own echo is a duplicate
    return out


# --------------------------------------------------------------------------------------------
# Live vs cold
# --------------------------------------------------------------------------------------------


def last_activity_ms(node: Mapping[str, Any]) -> int:
    """The last access, or (never accessed) the formation time."""
    last = node.get("last_accessed_at")
    return int(last) if last is not None else int(node["created_at"])


def is_cold(node: Mapping[str, Any], now_ms: int, cold_after_ms: int | None = None) -> bool:
    """Not accessed for *more than* ``cold_after_ms`` (default: the policy's 30 d);
    exactly at the boundary it is still live."""
    limit = _DEFAULT_POLICY.cold_after_ms if cold_after_ms is None else int(cold_after_ms)
    return int(now_ms) - last_activity_ms(node) > limit

