"""The ops views (streams/api/health.py: /metrics, /health) are registered without auth and say why a worker is not ready: no broker."""

from __future__ import annotations

import pytest


def test_ops_views_are_registered_without_auth():
    from streams.api import health as ops_area
    from streams.api.http import ApiView
    from streams.runtime.app import Runtime
    from streams.settings import Settings

    rt = Runtime(Settings(registry_url="", partitions=3, app_id="test-ops-views"))
    ops_area.blueprint.register(rt.app)
    views = rt.app.web.views
    assert {"/metrics", "/health"} <= set(views)
    for path in ("/metrics", "/health"):  # plain faust Views, not the bearer-token ApiView
        assert not isinstance(views[path], ApiView)


def fake_runtime(*, started=True, stopping=False, in_recovery=False, completed=True, rebalancing=False, remaining=0):
    from types import SimpleNamespace as NS

    from faust.types import TP

    class Event:
        def is_set(self):
            return completed

    recovery = NS(completed=Event(), in_recovery=in_recovery, active_remaining_total=lambda: remaining,
                  standby_remaining_total=lambda: 0)
    actives = {TP("graph.events.v1", 0), TP("app-graph-state-changelog", 0), TP("app-__assignor-__leader", 0)}
    app = NS(tables=NS(recovery=recovery, changelog_topics={"app-graph-state-changelog"}),
             rebalancing=rebalancing, should_stop=stopping, started=started, conf=NS(canonical_url="http://h:1"),
             assignor=NS(assigned_actives=lambda: actives, assigned_standbys=lambda: {TP("app-x-changelog", 1)}))
    return NS(app=app, worker_name="h:1", standby_remaining=lambda: 0)


@pytest.mark.parametrize("state, status, reason", [
    ({}, "ready", "1 source partitions"),
    ({"completed": False}, "starting", "first partition assignment"),
    ({"started": False, "completed": False}, "starting", "starting"),
    ({"in_recovery": True, "remaining": 42}, "recovering", "recovering: 42 offsets left"),
    ({"in_recovery": True, "completed": False, "remaining": 7, "rebalancing": True}, "recovering", "7 offsets left"),
    ({"rebalancing": True}, "rebalancing", "rebalancing"),
    ({"stopping": True}, "stopping", "shutting down"),
])
def test_health_is_ready_only_after_recovery_and_says_why_not(state, status, reason):
    from streams.api.health import health

    h = health(fake_runtime(**state))
    assert h.status == status and reason in h.reason and h.ready == (status == "ready")
    assert h.sources == ["graph.events.v1[0]"]  # no changelog, no leader topic
    assert (h.active_partitions, h.standby_partitions) == (3, 1)


class _Table:
    """A table whose `len()` takes `cost` seconds (RocksDB counts by iterating its keys)."""

    def __init__(self, rows: int, cost: float = 0.0) -> None:
        self.rows, self.cost, self.counted = rows, cost, 0

    def __len__(self) -> int:
        import time
        self.counted += 1
        if self.cost:
            time.sleep(self.cost)
        return self.rows


def test_table_sizes_are_counted_again_on_every_scrape_only_while_counting_is_cheap(monkeypatch):
    from types import SimpleNamespace as NS

    from streams.api import health

    cheap, slow = _Table(3), _Table(5, cost=2 * health.TABLE_SIZE_CHEAP_S)
    sizes, rt = health._TableSizes(), NS(tables={"a": cheap})
    assert sizes.get(rt) == {"a": 3} and sizes.get(rt) == {"a": 3} and cheap.counted == 2  # cheap: every scrape
    rt.tables["b"] = slow  # a new table: counted at once
    assert sizes.get(rt) == {"a": 3, "b": 5} and slow.counted == 1
    slow.rows = 6
    assert sizes.get(rt) == {"a": 3, "b": 5} and slow.counted == 1  # slow: the count is reused …
    clock = health.time.monotonic() + health.TABLE_SIZE_TTL_S
    monkeypatch.setattr(health.time, "monotonic", lambda: clock)
    assert sizes.get(rt) == {"a": 3, "b": 6} and slow.counted == 2  # … for TABLE_SIZE_TTL_S
