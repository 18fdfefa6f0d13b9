"""Faust agents: each module registers its tables, agents and timers on the Runtime.

`register_all` is the composition root of a worker: the agents first, then the HTTP API areas
that read their state (streams/api/: one Faust blueprint per area, `api_areas`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.runtime.app import Runtime


def _agent_modules():
    from streams.agents import analytics, graphs, memory, sessions

    return [analytics, memory, graphs, sessions]


def consumed_topics() -> list[str]:
    """Every input topic some agent reads (each agent module declares its SOURCES)."""
    return [t for m in _agent_modules() for t in m.SOURCES]


def api_areas():
    """The HTTP API areas (streams/api/), each one Faust blueprint (`module.blueprint`)."""
    from streams.api import analytics, dashboard, graphs, health, memory, sessions

    return [memory, sessions, graphs, analytics, dashboard, health]


def register_all(rt: "Runtime") -> None:
    from streams.agents import analytics, graphs, memory, sessions
    from streams.api import memory as memory_api

    analytics.register(rt)
    agent = memory.register(rt)
    graphs.register(rt)
    sessions.register(rt)
    memory_api.attach(rt.app, agent)  # the memory views read and send through the memory agent
    for area in api_areas():
        area.blueprint.register(rt.app)
