"""Housekeeping (SPEC §4.4): the partition-local timer's pure part.

:func:`sweep` deletes every unpinned node that

* is live and whose decayed confidence ``c · 0.5^(elapsed / half_life)`` fell under
  ``prune_below`` (0.5) — elapsed since the later of its last change and its last access; or
* is older (``now − created_at``) than the retention of its sensitivity: personal 365 d,
  medical 90 d, financial 90 d, secret 30 d, none never (live and superseded nodes alike:
  retention is a privacy bound on history too).

Each deletion is a ``memory_deleted`` event (id derived from the node id: a node is deleted
once, so a repeated sweep yields the same id) plus a node tombstone; the state remembers the
fingerprint like any deletion. Cost: one pass over the user's nodes per sweep (a timer, not
per record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .ids import event_id_for
from .nodes import DAY_MS, decayed_confidence, is_open
from .process import Outcome
from .state import UserMemory


def _default_retention() -> dict[str, int | None]:
    return {"none": None, "personal": 365 * DAY_MS, "medical": 90 * DAY_MS, "financial": 90 * DAY_MS, "secret": 30 * DAY_MS}


@dataclass(frozen=True)
class RetentionPolicy:
    prune_below: float = 0.5
    retention_ms: Mapping[str, int | None] = field(default_factory=_default_retention)


def expiry_reason(node: Mapping, now_ms: int, policy: RetentionPolicy) -> str | None:
    """Why housekeeping deletes ``node`` at ``now_ms`` (None: it stays)."""
    if node.get("pinned"):
        return None
    keep = policy.retention_ms.get(node["sensitivity"])
    if keep is not None and now_ms - int(node["created_at"]) > keep:
        return f"retention of {node['sensitivity']} ({keep // DAY_MS} d) passed"
    if is_open(node) and decayed_confidence(node, now_ms) < policy.prune_below:
        return f"decayed confidence under {policy.prune_below}"
    return None


def sweep(memory: UserMemory, now_ms: int, policy: RetentionPolicy | None = None) -> Outcome:
    policy = policy or RetentionPolicy()
    out = Outcome()
    doomed = [(n["node_id"], r) for n in memory.nodes() if (r := expiry_reason(n, now_ms, policy)) is not None]
    for nid, reason in sorted(doomed):
        memory.erase_node(nid)
        out.delete(nid)
        event = {
            "event_id": event_id_for(memory.motebit_id, nid, "memory_deleted"),
            "motebit_id": memory.motebit_id,
            "device_id": None,
            "timestamp": int(now_ms),
            "version_clock": memory.next_clock(),
            "event_type": "memory_deleted",
            "payload": {"node_id": nid},
        }
        out.ledger.append(event)
        memory.seen.add("e:" + event["event_id"], now_ms)
    return out
