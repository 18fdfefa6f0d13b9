"""Faust agents: each module registers its tables, agents, timers and views on the Runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.runtime.app import Runtime


def _modules():
    from streams.agents import analytics, graphs, memory, sessions
    from streams.api import dashboard, health

    return [analytics, memory, graphs, sessions, health, dashboard]


def consumed_topics() -> list[str]:
    """Every input topic some agent reads (each agent module declares its SOURCES)."""
    return [t for m in _modules() for t in m.SOURCES]


def register_all(rt: "Runtime") -> None:
    for module in _modules():
        module.register(rt)
