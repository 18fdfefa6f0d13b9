"""Per-graph execution state reducer (SPEC §4.9) — pure.

``apply(state, event, stall_after_ms, event_id=None) -> state`` folds one GraphEvent dict into
the graph's state; ``mark_stalled(state, now_ms, stall_after_ms)`` re-evaluates stall flags as of a
wall-clock time (a timer calls it); ``to_record(state)`` gives the ``memstream.graph.GraphState``
record. Inputs are never mutated; the state is a JSON-able plain dict a Faust table can persist.

What is materialized
--------------------
- ``phase``: ``idle`` until a ``phase_change``, which carries the *target* phase in ``status``.
- nodes: ``status`` (``running`` on dispatch unless the event says otherwise; the completion's
  ``status`` on ``node_completed``), ``agent``, ``startedAt`` (the event's, else the event ``ts``),
  ``completedAt`` (the event's, else ``ts``), ``signalType``.
- ``budget``: ``budget_update`` carries the cumulative snapshot, taken as-is (never summed).
- ``degradedNotifications``: count per kind; the kind rides in ``status`` (``unknown`` if absent).
- ``stalled``: a node whose status is ``running`` is stalled when ``clock - startedAt >
  stall_after_ms`` (strictly longer than the stall time; exactly ``stall_after_ms`` is not stalled).
  ``clock`` is the latest time the state has seen: the max of event ``ts`` and every ``now_ms`` given
  to ``mark_stalled`` — so a wall-clock timer's stall flag is not cleared by an older event.
  ``stall_after_ms=None`` disables stall detection.
- ``eventCount`` (events applied, duplicates excluded) and ``updatedAt`` (max event ``ts``).

Out-of-order tolerance
----------------------
The shipper preserves file order per graph and the topic is keyed by ``graphId``, so reordering is
rare; when it happens the reducer converges to the same state regardless of arrival order:
- phase: a ``phase_change`` older (by ``ts``) than the last applied one is ignored, and a known
  phase never moves backwards (``complete`` is not undone by a late ``executing``);
- node: each node remembers the ordering key ``(ts, kind)`` of the event that set its status
  (``node_dispatched`` < ``node_completed`` at equal ``ts``); an older event only fills fields still
  missing (e.g. ``agent``) and never reverts the status. A re-dispatch *after* a completion (a
  ``revise_needed`` re-run) is newer and makes the node running again;
- budget: the snapshot with the greatest ``ts`` wins (ties: the later arrival);
- degraded counts and eventCount are commutative.

Duplicates
----------
At-least-once delivery can replay an event. ``apply`` remembers the ids of the last
``RECENT_IDS`` events and skips a repeat, returning the *same* state object. The id is the
caller's ``event_id`` (the shipper's deterministic per-line id from the record headers) or, when
absent, a fingerprint of the event's content.

Bounds
------
The state row holds at most ``max_graph_nodes`` nodes and ``max_graph_labels`` degraded-notification
kinds (:class:`~streams.core.limits.Limits`), ``RECENT_IDS`` event ids of at most ``max_id_chars``,
and labels (``nodeId``, ``status``, ``agent``, ``signalType``) of at most ``max_label_chars``;
``graphId`` follows the id rules (it is the table key). An event that would break one raises
``GraphEventError`` with code ``limit.<name>`` / ``invalid_id`` and a reason naming the setting.

Bad input
---------
An event that is not a valid GraphEvent (see ``paths.validate_record``: unknown kind, wrong types,
missing ``nodeId``/``status``/``budget`` where the kind needs it) or that belongs to another graph
raises ``GraphEventError`` — the caller dead-letters it; the state is untouched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from streams.core.limits import DEFAULT_LIMITS, LimitExceeded, Limits, check_chars, check_count, check_id, quote

from .paths import ParseError, validate_record

RECENT_IDS = 512
PHASE_RANK = {"idle": 0, "executing": 1, "complete": 2}
_KIND_RANK = {"node_dispatched": 0, "node_completed": 1}


class GraphEventError(ValueError):
    """The event cannot be applied to this graph's state (dead-letter it); ``code`` is
    machine-readable (``graph.invalid_event``, or ``limit.<name>`` / ``invalid_id``)."""

    def __init__(self, message: str, code: str = "graph.invalid_event") -> None:
        super().__init__(message)
        self.code = code


_LABELS = ("nodeId", "status", "agent", "signalType")


def _check_limits(state: Mapping[str, Any] | None, ev: Mapping[str, Any], event_id: str | None, limits: Limits) -> None:
    try:
        check_id("graphId", ev["graphId"], limits)
        if event_id is not None:
            check_chars("event id", event_id, limits, "max_id_chars")
        for field in _LABELS:
            if isinstance(ev.get(field), str):
                check_chars(field, ev[field], limits, "max_label_chars")
        if state is not None:
            if ev["event"] in _KIND_RANK and ev["nodeId"] not in state["nodes"]:
                check_count("graph nodes", len(state["nodes"]) + 1, limits, "max_graph_nodes", "nodes")
            kind = ev.get("status") or "unknown"
            if ev["event"] == "notification_degraded" and kind not in state["degradedNotifications"]:
                check_count("degraded-notification kinds", len(state["degradedNotifications"]) + 1, limits,
                            "max_graph_labels", "kinds")
    except LimitExceeded as exc:
        raise GraphEventError(str(exc), exc.code) from None


def new_state(graph_id: str) -> dict[str, Any]:
    return {
        "graphId": graph_id,
        "phase": "idle",
        "phaseTs": None,
        "nodes": {},
        "budget": None,
        "budgetTs": None,
        "degradedNotifications": {},
        "updatedAt": 0,
        "eventCount": 0,
        "clockMs": 0,
        "recentIds": [],
    }


def event_fingerprint(event: Mapping[str, Any]) -> str:
    """A content fingerprint of a (normalized) GraphEvent, used when no event id is given."""
    raw = json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)
    return "fp:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]


def _copy(state: Mapping[str, Any]) -> dict[str, Any]:
    st = dict(state)
    st["nodes"] = dict(state["nodes"])
    st["degradedNotifications"] = dict(state["degradedNotifications"])
    st["recentIds"] = list(state["recentIds"])
    return st


def _new_node(node_id: str) -> dict[str, Any]:
    return {"nodeId": node_id, "status": None, "agent": None, "startedAt": None, "completedAt": None,
            "signalType": None, "stalled": False, "orderKey": None}


def _newer(key: list[int], old: Any) -> bool:
    return old is None or tuple(key) >= tuple(old)


def apply(state: Mapping[str, Any] | None, event: Mapping[str, Any], stall_after_ms: int | None,
          event_id: str | None = None, limits: Limits | None = None) -> dict[str, Any]:
    ev = validate_record(dict(event) if isinstance(event, Mapping) else event)
    if isinstance(ev, ParseError):
        raise GraphEventError(str(ev))
    if state is not None and ev["graphId"] != state["graphId"]:
        raise GraphEventError(f"event of graph {quote(ev['graphId'])} applied to graph {quote(state['graphId'])}")
    _check_limits(state, ev, event_id, limits or DEFAULT_LIMITS)
    if state is None:
        state = new_state(ev["graphId"])
    eid = event_id or event_fingerprint(ev)
    if eid in state["recentIds"]:
        return state  # type: ignore[return-value]  # a redelivered event: idempotent skip, the state as given

    st = _copy(state)
    ts = ev["ts"]
    kind = ev["event"]
    if kind in _KIND_RANK:
        _apply_node(st, ev, kind)
    elif kind == "phase_change":
        target = ev["status"]
        cur = st["phase"]
        stale = st["phaseTs"] is not None and ts < st["phaseTs"]
        backwards = cur in PHASE_RANK and target in PHASE_RANK and PHASE_RANK[target] < PHASE_RANK[cur]
        if not stale and not backwards:
            st["phase"] = target
            st["phaseTs"] = ts
    elif kind == "budget_update":
        if st["budgetTs"] is None or ts >= st["budgetTs"]:
            st["budget"] = dict(ev["budget"])
            st["budgetTs"] = ts
    elif kind == "notification_degraded":
        k = ev["status"] or "unknown"
        st["degradedNotifications"][k] = st["degradedNotifications"].get(k, 0) + 1

    st["eventCount"] += 1
    st["updatedAt"] = max(st["updatedAt"], ts)
    st["recentIds"].append(eid)
    del st["recentIds"][:-RECENT_IDS]
    return _restall(st, max(st["clockMs"], ts), stall_after_ms)


def _apply_node(st: dict[str, Any], ev: Mapping[str, Any], kind: str) -> None:
    nid = ev["nodeId"]
    node = dict(st["nodes"].get(nid) or _new_node(nid))
    key = [ev["ts"], _KIND_RANK[kind]]
    if _newer(key, node["orderKey"]):
        node["orderKey"] = key
        if kind == "node_dispatched":
            node["status"] = ev["status"] or "running"
            node["startedAt"] = ev["startedAt"] if ev["startedAt"] is not None else ev["ts"]
            node["completedAt"] = None
            node["signalType"] = None
        else:
            node["status"] = ev["status"] or ev["signalType"] or "completed"
            node["completedAt"] = ev["completedAt"] if ev["completedAt"] is not None else ev["ts"]
            node["signalType"] = ev["signalType"]
            if ev["startedAt"] is not None:
                node["startedAt"] = ev["startedAt"]
        if ev["agent"] is not None:
            node["agent"] = ev["agent"]
    else:  # a late event: only fill what is still unknown
        if node["agent"] is None:
            node["agent"] = ev["agent"]
        if node["startedAt"] is None:
            node["startedAt"] = ev["startedAt"] if ev["startedAt"] is not None else (ev["ts"] if kind == "node_dispatched" else None)
    st["nodes"][nid] = node


def _restall(st: dict[str, Any], clock: int, stall_after_ms: int | None) -> dict[str, Any]:
    st["clockMs"] = clock
    for nid, node in st["nodes"].items():
        stalled = (
            stall_after_ms is not None
            and node["status"] == "running"
            and node["startedAt"] is not None
            and clock - node["startedAt"] > stall_after_ms
        )
        if stalled != node["stalled"]:
            node = dict(node)
            node["stalled"] = stalled
            st["nodes"][nid] = node
    return st


def mark_stalled(state: Mapping[str, Any], now_ms: int, stall_after_ms: int | None) -> dict[str, Any]:
    """Re-evaluate every node's stall flag as of ``now_ms`` (never earlier than the state's clock)."""
    st = dict(state)
    st["nodes"] = dict(state["nodes"])
    return _restall(st, max(state["clockMs"], now_ms), stall_after_ms)


def stalled_nodes(state: Mapping[str, Any]) -> list[str]:
    return [nid for nid, n in state["nodes"].items() if n["stalled"]]


def to_record(state: Mapping[str, Any]) -> dict[str, Any]:
    """The ``memstream.graph.GraphState`` record (fresh copies; nodes in first-seen order)."""
    return {
        "graphId": state["graphId"],
        "phase": state["phase"],
        "nodes": [
            {k: n[k] for k in ("nodeId", "status", "agent", "startedAt", "completedAt", "signalType", "stalled")}
            for n in state["nodes"].values()
        ],
        "budget": dict(state["budget"]) if state["budget"] is not None else None,
        "degradedNotifications": dict(state["degradedNotifications"]),
        "stalledNodes": stalled_nodes(state),
        "updatedAt": state["updatedAt"],
        "eventCount": state["eventCount"],
    }
