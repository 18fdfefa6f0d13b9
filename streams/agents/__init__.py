"""Faust agents: each module registers its tables, agents and timers on the Runtime.

`register_all` is the composition root of a worker: the agents first, then the HTTP API areas
that read their state (streams/api/: one Faust blueprint per area, `api_areas`)."""

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


def api_areas():
    """The HTTP API areas (streams/api/), each one Faust blueprint (`module.blueprint`)."""
    from streams.api import analytics, dashboard, graphs, health, memory, sessions

    return [memory, sessions, graphs, analytics, dashboard, health]


def register_all(rt: Runtime) -> None:
    from streams.agents import analytics, graphs, memory, sessions
    from streams.api import memory as memory_api
    from streams.runtime import topology

    analytics.register(rt)
    agent = memory.register(rt)
    graphs.register(rt)
    sessions.register(rt)
    topology.check(rt, processors())  # what they registered is what they declare (once, at start)
    memory_api.attach(rt.app, agent)  # the memory views read and send through the memory agent
    for area in api_areas():
        area.blueprint.register(rt.app)
