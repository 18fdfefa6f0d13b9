"""Windowed activity analytics → memory.analytics.v1 and the analytics HTTP API.
The rules (classification, event-time windows, lateness, expiry) are in `streams/analytics`.

Other agents feed increments with `rt.feed_analytics(increments)` inside the event they are
processing (so the `analytics` table write, staged with that event's batch, lands on that
event's partition, which owns the subject). A partition-local timer publishes every window whose aggregate changed and expires
old ones; the state is a table, so after a restart or a rebalance the recovered windows are
still published and expired (no reliance on Faust's window-close callback).

Record key: the catalog keys memory.analytics.v1 by `motebit_id`; each record is the complete
aggregate of one window (`window`, `window_start` in the value), so re-publishing is harmless.
Because the topic is compacted, a reader that starts late sees only the latest window per
user: read it live, or ask the HTTP API for history. Session and graph aggregates are published
under `session:<id>` / `graph:<id>` keys (they have no user).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Iterable

import aiohttp
from faust.web import Request, Response

from .. import catalog, effects
from ..analytics import (
    HOUR,
    MINUTE,
    add_increment,
    expire,
    mark_published,
    merge_summaries,
    new_state,
    partition_clock,
    records_due,
    subject_partition,
    summarize,
    windows_of,
)
from ..analytics import to_record as window_record
from ..http import BadRequest, authenticated, parse_ms

if TYPE_CHECKING:
    from ..app import Runtime

SOURCES: list[str] = []  # fed by the other agents, reads no topic of its own
WINDOW_PARAM = {"1m": MINUTE, "1h": HOUR}
PEER_TIMEOUT_S = 5.0  # a fleet summary asks every other worker for its part


def register(rt: "Runtime") -> None:
    app = rt.app
    table = rt.table("analytics")

    def feed(increments: Iterable) -> None:
        now = int(time.time() * 1000)
        for inc in increments:
            state = effects.read(table, inc.subject) or new_state(inc.subject)
            result = add_increment(state, inc, now_ms=now)
            for refused in result.refused:
                rt.count(f"analytics_refused:{refused.reason}")
            effects.write(table, inc.subject, state)

    rt.feed_analytics = feed

    async def publish(partition: int, now_ms: int) -> None:
        mine = [(s, st) for s, st in list(table.items())
                if st is not None and subject_partition(s, rt.partition_of) == partition]
        clock = partition_clock(st for _s, st in mine)
        for subject, state in mine:
            pairs = records_due(state)
            for _snapshot, record in pairs:
                await rt.send(catalog.MEMORY_ANALYTICS, subject, record)
            mark_published(state, [snap for snap, _r in pairs])
            dropped = expire(state, clock)
            if pairs or dropped:
                effects.write(table, subject, state)

    rt.ticks("analytics", catalog.MEMORY_CANDIDATES, publish)

    # registered first: aiohttp matches in order, so /summary is not taken for a motebit_id
    @app.page("/v1/analytics/summary")
    class FleetSummary(rt.View):
        @authenticated
        async def get(self, request: Request, allowed: str) -> Response:
            """This worker's subjects; with ?scope=fleet, merged with every other worker's."""
            size = WINDOW_PARAM.get(request.query.get("window", "1h"))
            if size is None:
                return self.error(400, "window must be 1m or 1h")
            local = summarize((st for _s, st in table.items()), window=size)
            if request.query.get("scope") != "fleet":
                return self.reply(local)
            parts = [local]
            here = str(app.conf.canonical_url).rstrip("/")
            for url in sorted({str(u).rstrip("/") for u in rt.app.router.tables_metadata()} - {here}):
                try:
                    async with app.http_client.get(
                            f"{url}/v1/analytics/summary?window={request.query.get('window', '1h')}",
                            headers={"Authorization": request.headers.get("Authorization", "")},
                            timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as r:
                        if r.status != 200:  # a fleet total without a worker's part would be wrong
                            return self.unavailable(f"worker {url} answered {r.status}; retry")
                        parts.append(await r.json())
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    return self.unavailable(f"worker {url} did not answer ({type(exc).__name__}); retry")
            return self.reply(merge_summaries(parts))

    @app.page("/v1/analytics/{motebit_id}")
    class UserAnalytics(rt.View):
        @authenticated
        async def get(self, request: Request, motebit_id: str, allowed: str) -> Response:
            return await self.route(request, table, motebit_id, lambda: self._local(request, motebit_id))

        async def _local(self, request: Request, motebit_id: str) -> Response:
            size = WINDOW_PARAM.get(request.query.get("window", "1m"))
            if size is None:
                return self.error(400, "window must be 1m or 1h")
            try:
                lo = parse_ms(request.query, "from", 0)
                hi = parse_ms(request.query, "to", 2**62)
            except BadRequest as exc:
                return self.error(400, str(exc))
            state = table.get(motebit_id)
            windows = [window_record(motebit_id, w) for w in windows_of(state, size)] if state else []
            windows = [w for w in windows if lo <= w["window_start"] < hi]
            return self.reply({"motebit_id": motebit_id, "window": request.query.get("window", "1m"),
                               "windows": windows})
