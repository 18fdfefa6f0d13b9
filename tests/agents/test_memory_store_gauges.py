"""The loaded-nodes gauge follows the cache's figure after every batch, not only when a user is
read: users grow in the cache as their batches add nodes (`UserCache.unpin_all` re-weighs them),
and the gauge is what an operator compares with MEMSTREAM_LOADED_NODES_MAX. Before, it kept the
figure of the last load (a soak's workers showed 8,257 nodes for an hour of growing users)."""

from __future__ import annotations

from types import SimpleNamespace

from streams.agents.memory_store import MemoryStore
from streams.core import UserMemory
from streams.core.nodes import complete_node
from streams.settings import Settings


class _Signal:
    def connect(self, _fn) -> None:
        return None


class _Metrics:
    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}

    def set_gauge(self, name: str, value: float) -> None:
        self.gauges[name] = value


def _runtime() -> SimpleNamespace:
    app = SimpleNamespace(on_partitions_assigned=_Signal(), on_partitions_revoked=_Signal(), on_rebalance_complete=_Signal())
    return SimpleNamespace(settings=Settings(), app=app, metrics=_Metrics(), table=lambda name: {},
                           count=lambda *args, **kwargs: None)


def _node(user: str, i: int) -> dict:
    return complete_node({"node_id": f"n{i}", "motebit_id": user, "content": f"fact number {i}", "sensitivity": "none",
                          "memory_type": "semantic", "confidence": 0.7, "created_at": 1_700_000_000_000 + i})


def test_the_loaded_nodes_gauge_counts_what_a_batch_added_once_it_is_written():
    rt = _runtime()
    store = MemoryStore(rt)  # type: ignore[arg-type]
    store.valid = True
    um = UserMemory.from_nodes("u1", [_node("u1", 0)])
    store._keep("u1", um, {}, pin=True)  # read for a batch attempt
    assert rt.metrics.gauges["memory_nodes_loaded"] == 2  # one node + 1 per user
    for i in range(1, 6):  # the batch adds five nodes to the cached user
        um.put_node(_node("u1", i))
    store.refresh()  # the next attempt: the last one is written, its users re-weighed
    assert store.users.total == 7
    assert rt.metrics.gauges["memory_nodes_loaded"] == 7
