"""The analytics HTTP API (`blueprint`, area "analytics"): a user's windows and the activity
summary, from the `analytics` table the analytics agent keeps (streams/agents/analytics.py).

`GET /v1/analytics/{motebit_id}` is answered by the worker that owns the user's partition
(`ApiView.answer_at_owner` forwards); `GET /v1/analytics/summary` by any worker, from its own
subjects, or with `?scope=fleet` merged with every other worker's part (`PEER_TIMEOUT_S` each;
503 when one does not answer: a fleet total without a worker's part would be wrong).
"""

from __future__ import annotations

from typing import Any

import aiohttp
from faust.web import Blueprint, Request, Response

from streams.agents import state_scan
from streams.agents.analytics import Contained, undecodable
from streams.analytics import HOUR, MINUTE, merge_summaries, summarize, windows_of
from streams.analytics import to_record as window_record
from streams.api.http import ApiView, BadRequest, attached, authenticated, parse_ms

TABLE = "analytics"  #: the analytics agent's table (streams/agents/analytics.py)
WINDOW_PARAM = {"1m": MINUTE, "1h": HOUR}
PEER_TIMEOUT_S = 5.0  # a fleet summary asks every other worker for its part

blueprint = Blueprint("analytics")


def attach(app: Any, contained: Contained) -> None:
    """Give `app`'s analytics views the analytics agent's record of contained subjects."""
    app.memstream_analytics_contained = contained


class AnalyticsView(ApiView):
    """A view of the analytics area."""

    @property
    def contained(self) -> Contained:
        """The analytics agent's contained subjects (`attach`)."""
        return attached(self.app, "memstream_analytics_contained",
                        "the analytics agent's contained subjects (streams.api.analytics.attach)")


# routed first: aiohttp matches in order, so /summary is not taken for a motebit_id
@blueprint.route("/v1/analytics/summary")
class FleetSummary(AnalyticsView):
    @authenticated
    async def get(self, request: Request, allowed: str) -> Response:
        """This worker's subjects; with ?scope=fleet, merged with every other worker's."""
        app = self.app
        size = WINDOW_PARAM.get(request.query.get("window", "1h"))
        if size is None:
            return self.problem(400, "window must be 1m or 1h")
        local = self._local_summary(size)
        if request.query.get("scope") != "fleet":
            return self.reply(local)
        parts = [local]
        here = str(app.conf.canonical_url).rstrip("/")
        for url in sorted({str(u).rstrip("/") for u in app.router.tables_metadata()} - {here}):
            try:
                async with app.http_client.get(
                        f"{url}/v1/analytics/summary?window={request.query.get('window', '1h')}",
                        headers={"Authorization": request.headers.get("Authorization", "")},
                        timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as r:
                    if r.status != 200:  # a fleet total without a worker's part would be wrong
                        return self.unavailable(f"worker {url} answered {r.status}; retry")
                    parts.append(await r.json())
            except (TimeoutError, aiohttp.ClientError) as exc:
                return self.unavailable(f"worker {url} did not answer ({type(exc).__name__}); retry")
        return self.reply(merge_summaries(parts))

    def _local_summary(self, size: str) -> dict:
        """This worker's subjects, without those whose state cannot be read (contained: counted)."""
        contained, undecoded = self.contained, []

        def unreadable(subject: str, exc: Exception) -> None:
            contained.add(subject, undecodable(exc))
            undecoded.append(subject)

        rows = state_scan.table_items(self.runtime.tables[TABLE], unreadable)
        states = [st for s, st in rows if s not in contained and contained.problem(s, st) is None]
        out = summarize(states, window=size)
        out["contained"] = len(undecoded) + len(rows) - len(states)
        return out


@blueprint.route("/v1/analytics/{motebit_id}")
class UserAnalytics(AnalyticsView):
    @authenticated
    async def get(self, request: Request, motebit_id: str, allowed: str) -> Response:
        table = self.runtime.tables[TABLE]
        return await self.answer_at_owner(request, table, motebit_id, lambda: self._local(request, table, motebit_id))

    async def _local(self, request: Request, table, motebit_id: str) -> Response:
        size = WINDOW_PARAM.get(request.query.get("window", "1m"))
        if size is None:
            return self.problem(400, "window must be 1m or 1h")
        try:
            lo = parse_ms(request.query, "from", 0)
            hi = parse_ms(request.query, "to", 2**62)
        except BadRequest as exc:
            return self.problem(400, str(exc))
        try:
            state = table.get(motebit_id)
        except Exception as exc:  # noqa: BLE001 - whatever the table's value serializer raises
            self.contained.add(motebit_id, undecodable(exc))
            state = None
        if motebit_id in self.contained or self.contained.problem(motebit_id, state) is not None:
            return self.unavailable(f"the analytics state of {motebit_id[:200]!r} cannot be read "
                                    f"({self.contained.why.get(motebit_id, 'unreadable')}); it is counted again "
                                    "once the row is repaired")
        windows = [window_record(motebit_id, w) for w in windows_of(state, size)] if state else []
        windows = [w for w in windows if lo <= w["window_start"] < hi]
        return self.reply({"motebit_id": motebit_id, "window": request.query.get("window", "1m"),
                           "windows": windows})
