"""streams/agents/prefill.py without a broker: the pass's bounds and what stops it (the Kafka
test, in tests/agents/test_user_cache_kafka.py, shows a real worker prefilling real rows)."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from types import SimpleNamespace

from faust.types import TP

from streams.agents import prefill
from streams.contracts import catalog
from streams.runtime.app import Runtime
from streams.settings import Settings


class _Users(dict):
    @property
    def total(self) -> int:
        return sum(self.values())


class _Store:
    """What the prefill uses of a `MemoryStore`: `users` (user -> weight), `prefill_user`, `refresh`."""

    def __init__(self, weight: int = 3) -> None:
        self.users, self.read, self.refreshed, self.listed = _Users(), [], 0, []
        self.lock = asyncio.Lock()
        self.state = object()
        self.weight = weight

    def prefill_user(self, user: str) -> bool:
        self.read.append(user)
        if user in self.users:
            return False
        self.users[user] = self.weight
        return True

    def refresh(self) -> None:
        self.refreshed += 1


def _prefill(monkeypatch, store, partitions=(0, 1), users_per_partition=4, **settings):
    actives = {*(TP(catalog.MEMORY_CANDIDATES, p) for p in partitions), TP(catalog.MEMORY_EVENTS, 9)}
    app = SimpleNamespace(assignor=SimpleNamespace(assigned_actives=lambda: actives))
    rt = SimpleNamespace(settings=Settings(**settings), draining=False, partition_of=lambda user: 0, app=app)
    rt.active_partitions = partial(Runtime.active_partitions, rt)  # the real one, on the stand-in's assignor
    def listed(table, p, partition_of, limit=None):
        store.listed.append(limit)
        return [f"u{p}-{i}" for i in range(users_per_partition)][:limit]

    monkeypatch.setattr(prefill.state_scan, "partition_users", listed)
    return prefill.Prefill(rt, store)


def test_a_pass_reads_every_active_partition_of_the_owner_topic_in_user_order(monkeypatch):
    store = _Store()
    p = _prefill(monkeypatch, store)
    asyncio.run(p.on_rebalance_complete())
    assert p.step(p.generation, time.monotonic() + 60) is False  # one slice was enough: the pass is over
    assert store.read == [f"u0-{i}" for i in range(4)] + [f"u1-{i}" for i in range(4)]  # not partition 9 of another topic
    assert p.loaded == 8 and store.refreshed == 1


def test_the_pass_stops_at_the_node_limit_capped_by_the_cache_bound(monkeypatch):
    store = _Store(weight=3)
    p = _prefill(monkeypatch, store, prefill_nodes=7)
    asyncio.run(p.on_rebalance_complete())
    assert p.step(p.generation, time.monotonic() + 60) is False
    assert store.users.total == 9 and len(store.read) == 3  # 3 users of 3 nodes: at the limit, no more
    assert store.listed == [7]  # a partition is listed only as far as the room left (each user weighs >= 1)
    store = _Store(weight=3)
    p = _prefill(monkeypatch, store, prefill_nodes=50_000, loaded_nodes_max=4)
    asyncio.run(p.on_rebalance_complete())
    p.step(p.generation, time.monotonic() + 60)
    assert store.users.total == 6  # the cache's bound, not the prefill's


def test_a_slice_ends_at_its_deadline_and_the_next_goes_on(monkeypatch):
    store = _Store()
    p = _prefill(monkeypatch, store)
    asyncio.run(p.on_rebalance_complete())
    assert p.step(p.generation, time.monotonic() - 1) is True  # past its deadline after one user
    assert store.read == ["u0-0"]
    assert p.step(p.generation, time.monotonic() + 60) is False
    assert len(store.read) == 8


def test_a_rebalance_abandons_the_pass_and_the_next_one_starts_over(monkeypatch):
    store = _Store()
    p = _prefill(monkeypatch, store)
    asyncio.run(p.on_rebalance_complete())
    generation = p.generation
    assert p.step(generation, time.monotonic() - 1) is True
    asyncio.run(p.on_rebalance_started())
    assert p.step(generation, time.monotonic() + 60) is False  # tables being recovered: nothing read
    assert store.read == ["u0-0"]
    asyncio.run(p.on_rebalance_complete())
    assert p.step(generation, time.monotonic() + 60) is False  # an older pass does not go on
    assert p.step(p.generation, time.monotonic() + 60) is False
    assert store.read == ["u0-0", *(f"u0-{i}" for i in range(4)), *(f"u1-{i}" for i in range(4))]


def test_the_background_loop_runs_a_pass_per_completed_rebalance_and_none_when_disabled(monkeypatch):
    async def main(**settings):
        store = _Store()
        p = _prefill(monkeypatch, store, **settings)
        task = asyncio.ensure_future(p.run())
        await p.on_rebalance_complete()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(store.read) == 8:
                break
        done = task.done()
        task.cancel()
        return store.read, done

    read, done = asyncio.run(main())
    assert len(read) == 8 and not done
    read, done = asyncio.run(main(prefill_nodes=0))
    assert read == [] and done  # MEMSTREAM_PREFILL_NODES=0: the loop returns at once


def test_a_failing_read_stops_the_pass_without_stopping_the_loop(monkeypatch, caplog):
    async def main():
        store = _Store()

        def broken(user):
            raise OSError("rocksdb says no")

        store.prefill_user = broken
        p = _prefill(monkeypatch, store)
        task = asyncio.ensure_future(p.run())
        await p.on_rebalance_complete()
        await asyncio.sleep(0.05)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(main())
    assert "memory cache prefill failed" in caplog.text


def test_a_negative_prefill_limit_is_refused_and_a_huge_one_is_capped_by_the_cache_bound():
    import pytest

    from streams.settings import SettingsError

    with pytest.raises(SettingsError, match="MEMSTREAM_PREFILL_NODES=-1"):
        Settings(prefill_nodes=-1)
    with pytest.raises(SettingsError, match="MEMSTREAM_PREFILL_NODES"):
        Settings.from_env({"MEMSTREAM_PREFILL_NODES": "lots"})
    huge = Settings.from_env({"MEMSTREAM_PREFILL_NODES": str(10**30)})
    store = _Store()
    assert prefill.Prefill(SimpleNamespace(settings=huge), store).limit == huge.loaded_nodes_max
