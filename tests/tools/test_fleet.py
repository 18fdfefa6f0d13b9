"""The bench's and the fault suite's worker fleet (bench/fleet.py), without starting workers."""

from __future__ import annotations

import pytest

from bench.fleet import Fleet
from streams.settings import Settings


def test_two_workers_of_a_fleet_never_get_the_same_port():
    """Workers started without waiting have not bound their ports yet, so the free-port probe can
    hand the next one the same port (four workers of one fleet: one exited on its bind)."""
    probed = iter([13546, 13546, 13546, 14001, 13546, 15002])
    fleet = Fleet(Settings(), "app", free_port=lambda: next(probed))
    fleet.ports["a"] = fleet._new_port()
    fleet.ports["b"] = fleet._new_port()
    fleet.ports["c"] = fleet._new_port()
    assert fleet.ports == {"a": 13546, "b": 14001, "c": 15002}


def test_a_fleet_without_a_free_port_says_which_it_has_given():
    fleet = Fleet(Settings(), "app", free_port=lambda: 13546)
    fleet.ports["a"] = 13546
    with pytest.raises(RuntimeError, match=r"no free port for a worker of app outside \[13546\]"):
        fleet._new_port()
