"""Promotion: a memory becomes "absolute" once reinforced enough (SPEC §4.3).

Default policy from the seed: ``reinforcement_count >= 3 and confidence >= 0.85``.
``memory_promoted`` is emitted exactly once per node: the node records ``promoted=True``
(and ``confidence`` = ``to_confidence``), later checks see the flag and stay silent, and
the event id is derived from the node id alone, so a re-processed input that promotes the
same node again yields the same event id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .ids import event_id_for


@dataclass(frozen=True)
class PromotionPolicy:
    min_reinforcements: int = 3
    min_confidence: float = 0.85
    to_confidence: float = 1.0


def should_promote(node: Mapping[str, Any], policy: PromotionPolicy) -> bool:
    return (
        not node.get("promoted")
        and node.get("valid_until") is None
        and int(node["reinforcement_count"]) >= policy.min_reinforcements
        and float(node["confidence"]) >= policy.min_confidence
    )


def promotion_reason(node: Mapping[str, Any], policy: PromotionPolicy) -> str:
    return (
        f"reinforcement_count {node['reinforcement_count']} >= {policy.min_reinforcements} "
        f"and confidence {float(node['confidence']):.4f} >= {policy.min_confidence}"
    )


def promote(
    node: Mapping[str, Any], policy: PromotionPolicy, *, timestamp: int, version_clock: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(promoted node, ``memory_promoted`` event). Call only when :func:`should_promote`."""
    payload = {
        "node_id": node["node_id"],
        "from_confidence": float(node["confidence"]),
        "to_confidence": float(policy.to_confidence),
        "reinforcement_count": int(node["reinforcement_count"]),
        "reason": promotion_reason(node, policy),
    }
    event = {
        "event_id": event_id_for(node["motebit_id"], node["node_id"], "memory_promoted"),
        "motebit_id": node["motebit_id"],
        "device_id": None,
        "timestamp": int(timestamp),
        "version_clock": int(version_clock),
        "event_type": "memory_promoted",
        "payload": payload,
    }
    promoted = {
        **node,
        "promoted": True,
        "confidence": float(policy.to_confidence),
        "updated_at": max(int(node["updated_at"]), int(timestamp)),
    }
    return promoted, event
