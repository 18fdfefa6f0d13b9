"""The operator's dashboard (`blueprint`, area "dashboard"): `GET /dashboard` (a static page) and
`GET /v1/dashboard/data` (JSON).

`/dashboard` serves `streams/web/dashboard.html`: one self-contained file (inline CSS and JS,
charts drawn as inline SVG by its own code, no external library, nothing fetched from outside
this worker; a Content-Security-Policy enforces it). It holds no data and needs no token. The
page takes a bearer token once, from `?token=` in its URL (then removed from the address bar)
or from a small form, keeps it in `sessionStorage` (this tab only) and every 5 s fetches
`/v1/dashboard/data` with it and redraws (no page reload). `?user=<motebit_id>` narrows the
activity charts and totals to one user.

`GET /v1/dashboard/data` (bearer token like every `/v1` view; any sensitivity level may read
it: counts only, no content) gathers what the page shows:

- `activity`: the analytics minute windows (fleet-wide sum of every subject, or one user's with
  `?user=`), the last `ACTIVITY_MINUTES` minutes of event time up to the newest window, per
  event type (formed, accessed, deleted, merged, superseded, promoted, redacted, quarantined,
  dead_lettered);
- `totals`: the same counters over the hour windows (everything still held: 2 days of event
  time), plus compaction tokens saved and graph spend; `rates`: promoted and redacted as a
  share of formed, per-minute rates over the last `RATE_MINUTES` minutes of the activity range,
  dead letters as a share of records received (this process's counters, `rt.metrics`);
- `graphs`: the graph-state table: cost (USD) and tokens per graph, the top `TOP` by cost, plus
  totals over every graph; `sessions`: the session-ledger table: tokensSaved per session, top
  `TOP`, plus totals;
- `lag`: consumer lag per owned input partition (committed offset vs high watermark), read the
  same way as `/metrics` (`streams/api/health.py: consumer_lag`);
- `top_users`: the most active users (fleet summary), for the page's user picker.

`?top=N` (1..200, default 15) sets how many graphs, sessions and users are listed; the page
passes on its own `?top=` (and draws at most 10 users).

Fleet: by default the answer covers every worker. This worker computes its own part from the
table partitions it owns *actively* (standby copies are skipped, so nothing is counted twice),
asks every other worker found in the partition assignor's table metadata for theirs
(`?scope=local`, same bearer token, `PEER_TIMEOUT_S`) and adds them up (subjects, graphs,
sessions and partitions are disjoint between workers). A worker that does not answer is listed
in `workers` with its error; the rest is still shown. `?scope=local` answers with this worker's
part only (the internal shape merged by `assemble`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson
from faust.web import Blueprint, Request, Response, View

from streams.analytics import HOUR, MINUTE, merge_summaries, subject_partition, summarize
from streams.analytics.summary import summarize_records
from streams.analytics.windows import EVENT_COUNTERS, MINUTE_MS
from streams.api.health import consumer_lag
from streams.api.http import ApiView, authenticated
from streams.contracts import catalog

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.dashboard")

PAGE = Path(str(resources.files("streams") / "web" / "dashboard.html"))  # package data (pyproject)
ACTIVITY_MINUTES = 120  # minute windows shown (the minute windows' lateness keeps ~2 h anyway)
RATE_MINUTES = 15
TOP = 15  # rows of the graph, session and user lists (`?top=` 1..TOP_MAX)
TOP_MAX = 200
PEER_TIMEOUT_S = 3.0
LAG_TIMEOUT_S = 6.0

# The page may run only its own inline code and talk only to this worker.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
}


# --------------------------------------------------------------------------- pure parts


def graph_item(state: Mapping[str, Any]) -> dict[str, Any]:
    """One graph's budget line from its `graph-state` table value."""
    budget = state.get("budget") or {}
    nodes = state.get("nodes") or {}
    return {
        "graph_id": state["graphId"],
        "phase": state.get("phase"),
        "cost_usd": round(float(budget.get("costUsd") or 0.0), 9),
        "input_tokens": int(budget.get("inputTokens") or 0),
        "output_tokens": int(budget.get("outputTokens") or 0),
        "sessions_spawned": int(budget.get("sessionsSpawned") or 0),
        "has_budget": bool(state.get("budget")),
        "nodes": len(nodes),
        "stalled": sum(1 for n in nodes.values() if n.get("stalled")),
        "updated_at": state.get("updatedAt") or None,
    }


def session_item(state: Mapping[str, Any]) -> dict[str, Any]:
    """One session's compaction line from its `session-ledger` table value."""
    rec = state["record"]
    return {
        "session_id": rec["sessionId"],
        "tokens_saved": int(rec.get("tokensSaved") or 0),
        "tokens_removed": int(rec.get("tokensRemoved") or 0),
        "tokens_added": int(rec.get("tokensAdded") or 0),
        "compactions": len(rec.get("compactions") or []),
        "violations": int(rec.get("violationCount") or 0),
        "errors": int(rec.get("errorCount") or 0),
    }


_GRAPH_SUMS = ("cost_usd", "input_tokens", "output_tokens", "sessions_spawned", "stalled")
_SESSION_SUMS = ("tokens_saved", "tokens_removed", "tokens_added", "compactions", "violations", "errors")


def _graphs_block(items: Iterable[Mapping[str, Any]], top: int = TOP) -> dict[str, Any]:
    items = list(items)
    totals = {k: sum(i[k] for i in items) for k in _GRAPH_SUMS}
    totals["cost_usd"] = round(totals["cost_usd"], 9)
    ranked = sorted(items, key=lambda i: (-i["cost_usd"], -(i["input_tokens"] + i["output_tokens"]), i["graph_id"]))
    return {"count": len(items), "with_budget": sum(1 for i in items if i["has_budget"]), "totals": totals,
            "items": [dict(i) for i in ranked[:top]]}


def _sessions_block(items: Iterable[Mapping[str, Any]], top: int = TOP) -> dict[str, Any]:
    items = list(items)
    totals = {k: sum(i[k] for i in items) for k in _SESSION_SUMS}
    compacted = [i for i in items if i["compactions"] or i["tokens_saved"]]
    ranked = sorted(compacted, key=lambda i: (-i["tokens_saved"], i["session_id"]))
    return {"count": len(items), "with_compactions": len(compacted), "totals": totals,
            "items": [dict(i) for i in ranked[:top]]}


def local_part(*, worker: str, url: str, analytics_states: Iterable[Mapping[str, Any] | None],
               graph_states: Iterable[Mapping[str, Any] | None], session_states: Iterable[Mapping[str, Any] | None],
               lags: list[dict[str, Any]] | None, counters: Mapping[str, Mapping[str, float]],
               top: int = TOP) -> dict[str, Any]:
    """What one worker contributes (`?scope=local`), from the table values it owns actively."""
    states = [s for s in analytics_states if s is not None]
    return {
        "worker": worker, "url": url,
        "minute": summarize(states, window=MINUTE, top=top),
        "hour": summarize(states, window=HOUR, top=top),
        "graphs": _graphs_block((graph_item(s) for s in graph_states if s is not None), top),
        "sessions": _sessions_block((session_item(s) for s in session_states if s is not None), top),
        "lag": lags,  # None: this worker cannot tell (the broker did not answer in time)
        "pipeline": {
            "records_in": int(sum(counters.get("in", {}).values())),
            "dead_letters": int(sum(counters.get("dlq", {}).values())),
            "duplicates": int(sum(counters.get("duplicate", {}).values())),
        },
    }


def _merge_blocks(blocks: list[Mapping[str, Any]], sums: tuple[str, ...], rank, top: int) -> dict[str, Any]:
    totals = {k: sum(b["totals"][k] for b in blocks) for k in sums}
    items = sorted((dict(i) for b in blocks for i in b["items"]), key=rank)
    out = {"count": sum(b["count"] for b in blocks), "totals": totals, "items": items[:top]}
    for extra in ("with_budget", "with_compactions"):
        if blocks and extra in blocks[0]:
            out[extra] = sum(b.get(extra, 0) for b in blocks)
    return out


def _events(point: Mapping[str, Any]) -> int:
    return sum(int(point.get(f, 0)) for f in EVENT_COUNTERS)


def activity(series: list[Mapping[str, Any]], now_ms: int, minutes: int = ACTIVITY_MINUTES) -> dict[str, Any]:
    """The minute series cut to the last `minutes` minutes up to the newest window that counted
    anything (not past the next minute of `now_ms`: one producer's clock far ahead must not
    push the chart off the real data). Points are sparse (windows with no input are absent)."""
    busy = [p for p in series if _events(p) or p.get("compaction_tokens_saved") or p.get("graph_cost_usd")]
    if not busy:
        return {"window": "minute", "minutes": minutes, "from_ms": None, "to_ms": None,
                "types": list(EVENT_COUNTERS), "series": [], "totals": {f: 0 for f in EVENT_COUNTERS}}
    limit = (now_ms // MINUTE_MS + 2) * MINUTE_MS
    to_ms = max(int(p["window_end"]) for p in busy)
    if to_ms > limit and any(int(p["window_end"]) <= limit for p in busy):
        to_ms = max(int(p["window_end"]) for p in busy if int(p["window_end"]) <= limit)
    from_ms = to_ms - minutes * MINUTE_MS
    points = [{"start": int(p["window_start"]), **{f: int(p.get(f, 0)) for f in EVENT_COUNTERS}}
              for p in series if from_ms <= int(p["window_start"]) < to_ms]
    totals = {f: sum(p[f] for p in points) for f in EVENT_COUNTERS}
    return {"window": "minute", "minutes": minutes, "from_ms": from_ms, "to_ms": to_ms,
            "types": list(EVENT_COUNTERS), "series": points, "totals": totals}


def _share(n: float, d: float) -> float | None:
    return round(n / d, 6) if d else None


def rates(act: Mapping[str, Any], totals: Mapping[str, Any], pipeline: Mapping[str, int],
          minutes: int = RATE_MINUTES) -> dict[str, Any]:
    """Promotion / redaction as a share of formed (all held windows), per-minute rates over the
    last `minutes` minutes of the activity range, dead letters per record received."""
    recent: dict[str, int] = {f: 0 for f in ("formed", "promoted", "redacted", "dead_lettered")}
    if act["to_ms"] is not None:
        lo = act["to_ms"] - minutes * MINUTE_MS
        for p in act["series"]:
            if p["start"] >= lo:
                for f in recent:
                    recent[f] += p[f]
    return {
        "promotion_share": _share(totals["promoted"], totals["formed"]),
        "redaction_share": _share(totals["redacted"], totals["formed"]),
        "dead_letter_share": _share(pipeline["dead_letters"], pipeline["records_in"]),
        "per_minute_window": minutes,
        "per_minute": {f: round(v / minutes, 4) for f, v in recent.items()},
    }


def assemble(parts: list[Mapping[str, Any]], *, now_ms: int, user: str | None = None,
             user_summaries: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
             workers: list[dict[str, Any]] | None = None, top: int = TOP) -> dict[str, Any]:
    """The page's data from the workers' parts (`local_part`); with `user`, the activity and
    totals come from that user's (minute, hour) summaries instead of the fleet's."""
    minute = merge_summaries([p["minute"] for p in parts], top=top)
    hour = merge_summaries([p["hour"] for p in parts], top=top)
    if user is not None:
        u_minute, u_hour = user_summaries if user_summaries is not None else (None, None)
        minute_series = u_minute["series"] if u_minute else []
        totals = dict(u_hour["totals"]) if u_hour else {f: 0 for f in hour["totals"]}
    else:
        minute_series, totals = minute["series"], dict(hour["totals"])
    pipeline = {k: sum(p["pipeline"][k] for p in parts) for k in ("records_in", "dead_letters", "duplicates")}
    lag_parts = [p["lag"] for p in parts if p.get("lag") is not None]
    partitions = sorted((dict(x) for lp in lag_parts for x in lp), key=lambda x: (x["topic"], x["partition"]))
    known = [x["lag"] for x in partitions if x["lag"] is not None]
    act = activity(minute_series, now_ms)
    sessions = _merge_blocks([p["sessions"] for p in parts], _SESSION_SUMS,
                             lambda i: (-i["tokens_saved"], i["session_id"]), top)
    graphs = _merge_blocks([p["graphs"] for p in parts], _GRAPH_SUMS,
                           lambda i: (-i["cost_usd"], -(i["input_tokens"] + i["output_tokens"]), i["graph_id"]), top)
    graphs["totals"]["cost_usd"] = round(graphs["totals"]["cost_usd"], 9)
    return {
        "generated_at": now_ms,
        "scope": "user" if user is not None else "fleet",
        "user": user,
        "workers": workers if workers is not None else [{"worker": p["worker"], "url": p["url"], "ok": True} for p in parts],
        "activity": act,
        "totals": totals,
        "subjects": hour["subjects"],
        "rates": rates(act, totals, pipeline),
        "pipeline": pipeline,
        "top_users": minute["top_users"] if minute["top_users"] else hour["top_users"],
        "graphs": graphs,
        "sessions": sessions,
        "lag": {"available": bool(lag_parts), "total": sum(known), "max": max(known, default=0),
                "partitions": partitions},
        "late": {"too_late": hour["too_late"], "too_early": hour["too_early"], "duplicates": hour["duplicates"]},
    }


# --------------------------------------------------------------------------- the shell


def _actives_of(rt: Runtime, table_name: str) -> set[int]:
    return rt.active_partitions(rt.tables[table_name].changelog_topic.get_topic_name())


def _owned(rt: Runtime, table_name: str, partition_of) -> list[Any]:
    """Values of `table_name` in the partitions this worker owns actively (not standbys)."""
    if table_name not in rt.tables:
        return []
    mine = _actives_of(rt, table_name)
    out = []
    for key, value in list(rt.tables[table_name].items()):
        p = partition_of(key)
        if p is None or p in mine:
            out.append(value)
    return out


async def _lags(rt: Runtime) -> list[dict[str, Any]] | None:
    try:
        got = await asyncio.wait_for(consumer_lag(rt), LAG_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the page still shows the rest
        log.warning("dashboard: consumer lag unavailable (%s)", exc)
        return None
    inputs = {t.name for t in catalog.topics() if t.direction == "in"}
    return [{"topic": p.topic, "partition": p.partition, "committed": p.committed, "highwater": p.highwater,
             "lag": p.lag, "worker": rt.worker_name} for p in got if p.topic in inputs]


async def _part(rt: Runtime, top: int) -> dict[str, Any]:
    return local_part(
        worker=rt.worker_name, url=_here(rt.app),
        analytics_states=_owned(rt, "analytics", lambda s: subject_partition(s, rt.partition_of)),
        graph_states=_owned(rt, "graph-state", rt.partition_of),
        session_states=_owned(rt, "session-ledger", rt.partition_of),
        lags=await _lags(rt), counters=rt.metrics.counters, top=top)


def _here(app: Any) -> str:
    return str(app.conf.canonical_url).rstrip("/")


async def _peer_get(app: Any, url: str, auth: str) -> Any:
    async def go():
        async with app.http_client.get(url, headers={"Authorization": auth}) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            return orjson.loads(await r.read())
    return await asyncio.wait_for(go(), PEER_TIMEOUT_S)


async def _user_summaries(rt: Runtime, user: str, auth: str) -> tuple[dict, dict]:
    """(minute, hour) summaries of one user's windows, from the worker that owns them."""
    app = rt.app
    try:
        dest = app.router.key_store("analytics", user)
    except KeyError:
        raise RuntimeError("partition owner unknown (rebalancing); retry") from None
    if (dest.host, dest.port) == (app.conf.canonical_url.host, app.conf.canonical_url.port):
        state = rt.tables["analytics"].get(user)
        states = [state] if state is not None else []
        return summarize(states, window=MINUTE), summarize(states, window=HOUR)
    base = f"{str(dest).rstrip('/')}/v1/analytics/{quote(user, safe='')}"
    m, h = await asyncio.gather(_peer_get(app, f"{base}?window=1m", auth), _peer_get(app, f"{base}?window=1h", auth))
    return (summarize_records(m["windows"], window=MINUTE), summarize_records(h["windows"], window=HOUR))


blueprint = Blueprint("dashboard")


@blueprint.route("/dashboard")
class DashboardPage(View):  # no auth: the page holds no data, it asks for a token
    async def get(self, request: Request) -> Response:
        try:
            html = PAGE.read_text(encoding="utf-8")  # noqa: ASYNC240 - a small local file, read per page view
        except OSError as exc:
            return self.text(f"dashboard page missing: {exc}", status=500)
        return self.html(html, headers=dict(PAGE_HEADERS))


@blueprint.route("/v1/dashboard/data")
class DashboardData(ApiView):
    @authenticated  # any level may read it: counts only, never content
    async def get(self, request: Request, allowed: str) -> Response:
        rt, app = self.runtime, self.app
        scope = request.query.get("scope", "fleet")
        if scope not in ("fleet", "local"):
            return self.problem(400, "scope must be fleet or local")
        user = request.query.get("user") or None
        try:
            top = int(request.query.get("top", TOP))
        except ValueError:
            return self.problem(400, "top must be an integer")
        if not 1 <= top <= TOP_MAX:
            return self.problem(400, f"top must be 1..{TOP_MAX}")
        if scope == "local":
            return self.reply(await _part(rt, top))
        auth = request.headers.get("Authorization", "")
        mine = await _part(rt, top)
        parts = [mine]
        workers = [{"worker": mine["worker"], "url": mine["url"], "ok": True}]
        peers = sorted({str(u).rstrip("/") for u in app.router.tables_metadata()} - {_here(app)})
        answers = await asyncio.gather(*(_peer_get(app, f"{u}/v1/dashboard/data?scope=local&top={top}", auth)
                                         for u in peers), return_exceptions=True)
        for url, ans in zip(peers, answers, strict=True):
            if isinstance(ans, BaseException):
                workers.append({"worker": None, "url": url, "ok": False,
                                "error": f"{type(ans).__name__}: {ans}" if str(ans) else type(ans).__name__})
            else:
                parts.append(ans)
                workers.append({"worker": ans.get("worker"), "url": url, "ok": True})
        summaries = None
        if user is not None:
            try:
                summaries = await _user_summaries(rt, user, auth)
            except Exception as exc:  # noqa: BLE001
                return self.unavailable(f"analytics of {user} unavailable: {exc}")
        data = assemble(parts, now_ms=int(time.time() * 1000), user=user, user_summaries=summaries,  # type: ignore[arg-type]
                        workers=workers, top=top)
        return self.reply(data)
