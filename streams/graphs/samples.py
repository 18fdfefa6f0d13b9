"""Deterministic sample graph runs (for ``memstream generate``, the demo and tests).

``graph_run(seed, ...)`` plays a multi-agent graph the way the seed's recorder logs it: the engine
goes ``idle → executing``, nodes are dispatched in dependency waves and complete with a signal
(``answer``, sometimes ``revise_needed`` — then re-dispatched —, ``escalate`` or ``timeout``), a
cumulative ``budget_update`` follows each completion, a graph-notify seam occasionally degrades
(``notification_degraded`` with kind ``completion``/``terminal``/``stall`` in ``status``), and the
engine ends ``complete`` — unless ``unfinished=True``, which leaves nodes running (stall demos).

``SampleGraphRun.expected`` is what the GraphState must say after all its events (computed by the
generator from what it did, independently of the reducer). ``bad_lines(seed)`` gives corrupt lines
labelled with the ``ParseError.kind`` they must produce. ``write_run_files`` writes runs as
``graph-events-{hash}.ndjson`` files exactly as the recorder would (one complete line per write).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .paths import FIELDS, graph_events_path, to_line

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_AGENTS = ["planner", "researcher", "coder", "reviewer", "writer", "tester"]
_TASKS = ["plan", "research", "design", "implement", "test", "review", "docs", "release"]
# completion signal -> the node status the engine reports with it
SIGNAL_STATUS = {"answer": "completed", "revise_needed": "revise_needed", "escalate": "escalated", "timeout": "failed"}
DEGRADED_KINDS = ("completion", "terminal", "stall")


@dataclass
class SampleGraphRun:
    graph_id: str
    events: list[dict[str, Any]]  # full GraphEvent dicts, in file order
    expected: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The ndjson lines as the seed's writer emits them (optional fields omitted)."""
        return [to_line(e) for e in self.events]


def _event(ts: int, graph_id: str, event: str, **kw: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {f: None for f in FIELDS}
    ev.update(ts=ts, graphId=graph_id, event=event, **kw)
    return ev


def graph_run(seed: int, graph_id: str | None = None, nodes: int | None = None, unfinished: bool = False,
              t0: int | None = None) -> SampleGraphRun:
    rng = random.Random(seed)
    gid = graph_id or f"g-{rng.getrandbits(40):010x}"
    n_nodes = nodes if nodes is not None else rng.randint(3, 9)
    ts = (t0 if t0 is not None else T0 + rng.randint(0, 30 * 86_400_000))
    events: list[dict[str, Any]] = []
    budget = {"sessionsSpawned": 0, "inputTokens": 0, "outputTokens": 0, "costUsd": 0.0}
    final_nodes: dict[str, dict[str, Any]] = {}
    degraded: dict[str, int] = {}

    def tick(lo: int = 5, hi: int = 900) -> int:
        nonlocal ts
        ts += rng.randint(lo, hi)
        return ts

    def degrade() -> None:
        kind = rng.choice(DEGRADED_KINDS)
        degraded[kind] = degraded.get(kind, 0) + 1
        events.append(_event(tick(), gid, "notification_degraded", status=kind))

    events.append(_event(tick(), gid, "phase_change", status="executing"))
    ids = [f"n{k + 1}-{_TASKS[k % len(_TASKS)]}" for k in range(n_nodes)]
    waves: list[list[str]] = []
    k = 0
    while k < n_nodes:
        w = rng.randint(1, 3)
        waves.append(ids[k:k + w])
        k += w

    for wi, wave in enumerate(waves):
        last_wave = wi == len(waves) - 1
        running: list[tuple[str, str, int]] = []
        for nid in wave:
            agent = rng.choice(_AGENTS)
            started = tick()
            events.append(_event(started, gid, "node_dispatched", nodeId=nid, status="running", agent=agent, startedAt=started))
            budget["sessionsSpawned"] += 1
            running.append((nid, agent, started))
            final_nodes[nid] = {"status": "running", "agent": agent, "startedAt": started, "completedAt": None, "signalType": None}
        if unfinished and last_wave:
            break  # leave the last wave running
        rng.shuffle(running)
        for nid, agent, started in running:
            while True:
                signal = rng.choices(list(SIGNAL_STATUS), weights=[80, 10, 5, 5])[0]
                done = tick(200, 60_000)
                status = SIGNAL_STATUS[signal]
                events.append(_event(done, gid, "node_completed", nodeId=nid, status=status, signalType=signal,
                                     agent=agent, startedAt=started, completedAt=done))
                final_nodes[nid] = {"status": status, "agent": agent, "startedAt": started, "completedAt": done, "signalType": signal}
                inp, out = rng.randint(500, 20_000), rng.randint(100, 4_000)
                budget["inputTokens"] += inp
                budget["outputTokens"] += out
                budget["costUsd"] = round(budget["costUsd"] + inp * 3e-6 + out * 15e-6, 6)
                events.append(_event(tick(1, 50), gid, "budget_update", budget=dict(budget)))
                if rng.random() < 0.12:
                    degrade()
                if signal != "revise_needed":
                    break
                started = tick()  # re-dispatch after a revise
                events.append(_event(started, gid, "node_dispatched", nodeId=nid, status="running", agent=agent, startedAt=started))
                budget["sessionsSpawned"] += 1
                final_nodes[nid] = {"status": "running", "agent": agent, "startedAt": started, "completedAt": None, "signalType": None}
    if not unfinished:
        if rng.random() < 0.3:
            degrade()
        events.append(_event(tick(), gid, "phase_change", status="complete"))

    expected = {
        "graphId": gid,
        "phase": "executing" if unfinished else "complete",
        "nodes": final_nodes,
        "budget": next((dict(e["budget"]) for e in reversed(events) if e["event"] == "budget_update"), None),
        "degradedNotifications": degraded,
        "eventCount": len(events),
        "updatedAt": max(e["ts"] for e in events),
        "running": [nid for nid, n in final_nodes.items() if n["status"] == "running"],
    }
    return SampleGraphRun(gid, events, expected)


def graph_runs(seed: int, count: int, unfinished_ratio: float = 0.2) -> list[SampleGraphRun]:
    rng = random.Random(seed)
    return [graph_run(rng.getrandbits(32), unfinished=rng.random() < unfinished_ratio) for _ in range(count)]


def generate_graph_runs(seed: int, count: int = 4, unfinished_ratio: float = 0.25) -> list[SampleGraphRun]:
    """The runs ``memstream generate`` and the demo produce (same as ``graph_runs``)."""
    return graph_runs(seed, count, unfinished_ratio)


def bad_lines(seed: int, graph_id: str = "g-bad") -> list[tuple[str, str]]:
    """Corrupt / invalid lines (each ``\\n``-terminated), labelled with the expected ParseError kind."""
    rng = random.Random(seed)
    ts = T0 + rng.randint(0, 86_400_000)
    good = json.dumps({"ts": ts, "graphId": graph_id, "event": "phase_change", "status": "executing"}, separators=(",", ":"))
    cases = [
        (good[: rng.randint(5, len(good) - 5)], "corrupt_json"),  # a torn write
        ("[1, 2, 3]", "not_object"),
        (json.dumps({"graphId": graph_id, "event": "phase_change", "status": "idle"}), "missing_field"),
        (json.dumps({"ts": str(ts), "graphId": graph_id, "event": "phase_change", "status": "idle"}), "wrong_type"),
        (json.dumps({"ts": ts, "graphId": graph_id, "event": "node_exploded", "nodeId": "n1"}), "unknown_event"),
        (json.dumps({"ts": ts, "graphId": graph_id, "event": "budget_update", "budget": {"costUsd": "a lot"}}), "wrong_type"),
        (json.dumps({"ts": ts, "graphId": graph_id, "event": "node_dispatched", "agent": "coder"}), "missing_field"),
        (json.dumps({"ts": ts, "graphId": 42, "event": "phase_change", "status": "idle"}), "wrong_type"),
    ]
    rng.shuffle(cases)
    return [(line + "\n", kind) for line, kind in cases]


def write_run_files(directory: str | os.PathLike[str], runs: Iterable[SampleGraphRun],
                    extra_lines: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Append each run's lines to its ``graph-events-{hash}.ndjson`` file (one write per line, as
    the recorder does); ``extra_lines`` maps a graph id to raw lines appended after its run.
    Returns graph id -> path."""
    os.makedirs(directory, exist_ok=True)
    paths: dict[str, str] = {}
    for run in runs:
        path = graph_events_path(directory, run.graph_id)
        paths[run.graph_id] = path
        with open(path, "a", encoding="utf-8") as f:
            for line in run.lines():
                f.write(line)
            for line in (extra_lines or {}).get(run.graph_id, []):
                f.write(line)
    return paths
