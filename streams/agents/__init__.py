"""Faust agents: each module registers its tables, agents and timers on the Runtime (the
composition root, streams/composition.py, calls them) and declares what it reads and writes
(`PROCESSOR`: streams/runtime/topology.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.runtime.topology import Processor


def processors() -> list[Processor]:
    """Every processor's declaration (`PROCESSOR` of each agent module: streams/runtime/topology.py)."""
    from streams.agents import analytics, graphs, memory, relay_policy, sessions

    return [memory.PROCESSOR, relay_policy.PROCESSOR, sessions.PROCESSOR, graphs.PROCESSOR, analytics.PROCESSOR]


def consumed_topics() -> list[str]:
    """Every input topic some agent reads (the declared sources)."""
    return [t for p in processors() for t in p.sources]
