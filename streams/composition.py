"""The composition root: the one place a worker is wired together.

The layers point down only: the pure rules (`streams.core`, `streams.sessions`, `streams.graphs`,
`streams.analytics`) know no framework; the runtime (`streams.runtime`: the Faust app, batches,
checkpoints, the web server) knows neither the agents nor the HTTP API; the agents
(`streams.agents`) build on the runtime; the HTTP API (`streams.api`) reads the agents' tables
through the runtime. This module is above all of them: it creates a `Runtime`, registers every
agent on it, then every API area (one Faust blueprint each). `scripts/import_graph.py --check`
(run by `make lint`) fails on any import circle, between modules or between packages.
"""

from __future__ import annotations

from types import ModuleType

from streams.runtime.app import Runtime
from streams.settings import Settings


def api_areas() -> list[ModuleType]:
    """The HTTP API areas (streams/api/), each one Faust blueprint (`module.blueprint`)."""
    from streams.api import analytics, dashboard, graphs, health, memory, sessions

    return [memory, sessions, graphs, analytics, dashboard, health]


def register_all(rt: Runtime) -> None:
    """Every agent on `rt` (checked against their declared topology), then every API area."""
    from streams.agents import analytics, graphs, memory, processors, sessions
    from streams.api import analytics as analytics_api
    from streams.api import http
    from streams.api import memory as memory_api
    from streams.runtime import topology

    http.tokens_of(rt)  # a bad MEMSTREAM_API_TOKENS stops the worker here, before anything starts
    contained = analytics.register(rt)
    agent = memory.register(rt)
    graphs.register(rt)
    sessions.register(rt)
    topology.check(rt, processors())  # what they registered is what they declare (once, at start)
    memory_api.attach(rt.app, agent)  # the memory views read and send through the memory agent
    analytics_api.attach(rt.app, contained)  # the analytics views leave out the subjects it contained
    for area in api_areas():
        area.blueprint.register(rt.app)


def create_runtime(settings: Settings) -> Runtime:
    """The memstream runtime: its Faust app with every agent and view registered."""
    rt = Runtime(settings)
    register_all(rt)
    return rt

