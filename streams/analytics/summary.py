"""Fleet-wide analytics summary (``GET /v1/analytics/summary``) — pure.

:func:`summarize` folds many subjects' window states (the ``analytics`` table of one worker)
into one JSON-able dict; :func:`merge_summaries` adds up the summaries of several workers (each
subject lives on exactly one partition, so workers' subject sets are disjoint and every figure,
including the top-N list, merges exactly). :func:`summarize_records` does the same over
``AnalyticsWindow`` records (e.g. read back from ``memory.analytics.v1``; the latest record of
each window wins).

Only one window size is summed (default ``hour``): minute and hour windows count the same
inputs, adding both would count everything twice. The states only hold windows that have not
expired (2 days of hour windows by default); for longer history read the topic. ``too_late``,
``too_early`` and ``duplicates`` are the states' running totals (not restricted to the range).

Shape::

    {"window": "hour", "since_ms": int|None, "until_ms": int|None,   # window_start in [since, until)
     "windows": <windows summed>, "clock": <latest event time seen>|None,
     "totals": {formed, accessed, ..., compaction_tokens_saved, graph_cost_usd},
     "subjects": {"user": n, "session": n, "graph": n, "unknown": n},   # with a window in range
     "by_kind": {"user": {<totals>}, "session": {...}, "graph": {...}, "unknown": {...}},
     "series": [{"window_start", "window_end", <totals>}, ...],            # oldest first
     "top_users": [{"motebit_id", "events", <totals>}, ...],               # most events first
     "too_late": {"minute": n, "hour": n}, "too_early": n, "duplicates": n,
     "contained": n}   # subjects left out: their stored state cannot be read (the worker sets it)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .classify import SUBJECT_KINDS, USER, subject_kind
from .windows import EVENT_COUNTERS, HOUR, SIZES, to_record, window_identity

#: Record fields summed by the summary (the AnalyticsWindow counters, dollars for graph spend).
FIELDS: tuple[str, ...] = EVENT_COUNTERS + ("compaction_tokens_saved", "graph_cost_usd")
DEFAULT_TOP = 10


def _zero() -> dict[str, Any]:
    return {f: (0.0 if f == "graph_cost_usd" else 0) for f in FIELDS}


def _add_into(acc: dict[str, Any], rec: Mapping[str, Any]) -> None:
    for f in FIELDS:
        acc[f] += rec.get(f, 0)


def _events(t: Mapping[str, Any]) -> int:
    return sum(int(t.get(f, 0)) for f in EVENT_COUNTERS)


def _round_money(t: dict[str, Any]) -> dict[str, Any]:
    t["graph_cost_usd"] = round(float(t["graph_cost_usd"]), 9)
    return t


def _empty(window: str, since_ms: int | None, until_ms: int | None) -> dict[str, Any]:
    return {
        "window": window, "since_ms": since_ms, "until_ms": until_ms, "windows": 0, "clock": None,
        "totals": _zero(),
        "subjects": {k: 0 for k in SUBJECT_KINDS},
        "by_kind": {k: _zero() for k in SUBJECT_KINDS},
        "series": [], "top_users": [],
        "too_late": {s: 0 for s in SIZES}, "too_early": 0, "duplicates": 0,
        "contained": 0,
    }


def _in_range(start: int, since_ms: int | None, until_ms: int | None) -> bool:
    return (since_ms is None or start >= since_ms) and (until_ms is None or start < until_ms)


def _fold(out: dict[str, Any], records: Iterable[Mapping[str, Any]], top: int) -> dict[str, Any]:
    window, since_ms, until_ms = out["window"], out["since_ms"], out["until_ms"]
    series: dict[int, dict[str, Any]] = {}
    per_subject: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec["window"] != window or not _in_range(int(rec["window_start"]), since_ms, until_ms):
            continue
        subject = rec["motebit_id"]
        out["windows"] += 1
        _add_into(out["totals"], rec)
        _add_into(out["by_kind"][subject_kind(subject)], rec)
        point = series.get(rec["window_start"])
        if point is None:
            point = series[rec["window_start"]] = {"window_start": int(rec["window_start"]),
                                                    "window_end": int(rec["window_end"]), **_zero()}
        _add_into(point, rec)
        acc = per_subject.get(subject)
        if acc is None:
            acc = per_subject[subject] = _zero()
        _add_into(acc, rec)
    for subject in per_subject:
        out["subjects"][subject_kind(subject)] += 1
    out["series"] = [_round_money(series[k]) for k in sorted(series)]
    users = [{"motebit_id": s, "events": _events(t), **t} for s, t in per_subject.items() if subject_kind(s) == USER]
    out["top_users"] = [_round_money(u) for u in _top(users, top)]
    _round_money(out["totals"])
    for k in SUBJECT_KINDS:
        _round_money(out["by_kind"][k])
    return out


def _top(users: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    ranked = [u for u in users if u["events"] > 0]
    ranked.sort(key=lambda u: (-u["events"], u["motebit_id"]))
    return ranked[:top]


def summarize(states: Iterable[Mapping[str, Any] | None], *, window: str = HOUR, since_ms: int | None = None,
              until_ms: int | None = None, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Summary of the given window states (None entries are skipped)."""
    if window not in SIZES:
        raise ValueError(f"window must be one of {', '.join(SIZES)}")
    out = _empty(window, since_ms, until_ms)
    present = [s for s in states if s is not None]
    for s in present:
        for size in SIZES:
            out["too_late"][size] += int(s["too_late"].get(size, 0))
        out["too_early"] += int(s.get("too_early", 0))
        out["duplicates"] += int(s.get("duplicates", 0))
        if s.get("clock") is not None:
            out["clock"] = s["clock"] if out["clock"] is None else max(out["clock"], s["clock"])
    records = (to_record(s["subject"], w) for s in present for w in s["windows"].values())
    return _fold(out, records, top)


def summarize_records(records: Iterable[Mapping[str, Any]], *, window: str = HOUR, since_ms: int | None = None,
                      until_ms: int | None = None, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Summary of AnalyticsWindow records in topic order: the last record of each window
    (:func:`~streams.analytics.windows.window_identity`) wins. ``clock`` is the latest
    ``updated_at``; refusal counts are unknown from records (0)."""
    if window not in SIZES:
        raise ValueError(f"window must be one of {', '.join(SIZES)}")
    latest: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for rec in records:
        latest[window_identity(rec)] = rec
    out = _empty(window, since_ms, until_ms)
    for rec in latest.values():
        ua = rec.get("updated_at")
        if ua is not None:
            out["clock"] = ua if out["clock"] is None else max(out["clock"], ua)
    return _fold(out, latest.values(), top)


def merge_summaries(parts: Iterable[Mapping[str, Any]], *, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Add up summaries of disjoint sets of subjects (one per worker), made with the same
    ``window`` / ``since_ms`` / ``until_ms``."""
    parts = list(parts)
    if not parts:
        return _empty(HOUR, None, None)
    first = parts[0]
    for p in parts[1:]:
        if (p["window"], p["since_ms"], p["until_ms"]) != (first["window"], first["since_ms"], first["until_ms"]):
            raise ValueError("summaries of different windows or ranges cannot be merged")
    out = _empty(first["window"], first["since_ms"], first["until_ms"])
    series: dict[int, dict[str, Any]] = {}
    users: list[dict[str, Any]] = []
    for p in parts:
        out["windows"] += p["windows"]
        if p["clock"] is not None:
            out["clock"] = p["clock"] if out["clock"] is None else max(out["clock"], p["clock"])
        _add_into(out["totals"], p["totals"])
        for k in SUBJECT_KINDS:
            out["subjects"][k] += p["subjects"].get(k, 0)
            _add_into(out["by_kind"][k], p["by_kind"].get(k, {}))
        for size in SIZES:
            out["too_late"][size] += p["too_late"].get(size, 0)
        out["too_early"] += p["too_early"]
        out["duplicates"] += p["duplicates"]
        out["contained"] += p.get("contained", 0)
        for point in p["series"]:
            acc = series.get(point["window_start"])
            if acc is None:
                acc = series[point["window_start"]] = {"window_start": point["window_start"],
                                                       "window_end": point["window_end"], **_zero()}
            _add_into(acc, point)
        users.extend(dict(u) for u in p["top_users"])
    out["series"] = [_round_money(series[k]) for k in sorted(series)]
    out["top_users"] = _top(users, top)
    _round_money(out["totals"])
    for k in SUBJECT_KINDS:
        _round_money(out["by_kind"][k])
    return out
