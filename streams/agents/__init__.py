"""Faust agents: each module registers its tables, agents, timers and views on the Runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..app import Runtime


def _modules():
    from . import analytics, dashboard, graphs, memory, ops, sessions

    return [analytics, memory, graphs, sessions, ops, dashboard]


def consumed_topics() -> list[str]:
    """Every input topic some agent reads (each agent module declares its SOURCES)."""
    return [t for m in _modules() for t in m.SOURCES]


def register_all(rt: "Runtime") -> None:
    for module in _modules():
        module.register(rt)
