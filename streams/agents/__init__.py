"""Faust agents: each module registers its tables, agents and timers on the Runtime.

`register_all` is the composition root of a worker: the agents first, then the HTTP API areas
that read their state (streams/api/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.runtime.app import Runtime
    from streams.runtime.topology import Processor


def processors() -> list[Processor]:
    """Every processor's declaration (`PROCESSOR` of each agent module: streams/runtime/topology.py)."""
    from streams.agents import analytics, graphs, memory, relay_policy, sessions

    return [memory.PROCESSOR, relay_policy.PROCESSOR, sessions.PROCESSOR, graphs.PROCESSOR, analytics.PROCESSOR]


def consumed_topics() -> list[str]:
    """Every input topic some agent reads (the declared sources)."""
    return [t for p in processors() for t in p.sources]


def register_all(rt: Runtime) -> None:
    from streams.agents import analytics, graphs, memory, sessions
    from streams.api import dashboard, health
    from streams.api import memory as memory_api
    from streams.runtime import topology

    analytics.register(rt)
    agent = memory.register(rt)
    graphs.register(rt)
    sessions.register(rt)
    topology.check(rt, processors())  # what they registered is what they declare (once, at start)
    memory_api.register(rt, agent.store, agent.policy_topic, agent.calls)
    health.register(rt)
    dashboard.register(rt)
