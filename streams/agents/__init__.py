"""Faust agents: each module registers its tables, agents and timers on the Runtime (the
composition root, streams/composition.py, calls them) and declares what it reads and writes
(`PROCESSOR`: streams/runtime/topology.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.core.repartition import OwnerRule
    from streams.runtime.topology import Processor


def processors() -> list[Processor]:
    """Every processor's declaration (`PROCESSOR` of each agent module: streams/runtime/topology.py)."""
    from streams.agents import analytics, graphs, memory, relay_policy, sessions

    return [memory.PROCESSOR, relay_policy.PROCESSOR, sessions.PROCESSOR, graphs.PROCESSOR, analytics.PROCESSOR]


def consumed_topics() -> list[str]:
    """Every input topic some agent reads (the declared sources)."""
    return [t for p in processors() for t in p.sources]


def table_owners() -> dict[str, OwnerRule]:
    """Each table's owner rule: which input key's partition a row of it belongs to (what a
    re-partition places it by: streams/core/repartition.py). Every declared store has one
    (tests/agents/test_topology.py)."""
    from streams.agents import analytics, graphs, memory_store, sessions
    from streams.analytics import subject_owner
    from streams.core.repartition import own_key

    return {memory_store.STATE_TABLE: memory_store.row_owner, memory_store.NEGOTIATOR_TABLE: own_key,
            memory_store.RELAY_POLICY_TABLE: own_key, sessions.TABLE: own_key, graphs.TABLE: own_key,
            analytics.TABLE: subject_owner}
