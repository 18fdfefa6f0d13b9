"""graph.events.v1 → graph.state.v1: per-graph execution state (rules in streams/graphs/state.py).

State lives in the `graph-state` table keyed by `graphId` (the message key, so the table's
changelog partition is the source partition); outputs are acknowledged before the table write
(streams/runtime/checkpoint.py: the handlers send and stage through the batch's checkpoint `cp`).
A partition-local timer (`Runtime.ticks`)
re-evaluates stall flags on the graphs of each owned partition and republishes the graphs whose
flags changed. The HTTP view of a graph's state is in streams/api/graphs.py.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from streams.analytics import classify_graph_budget
from streams.contracts import catalog
from streams.core.limits import id_problem, quote
from streams.graphs import state as graph_state
from streams.runtime import checkpoint
from streams.runtime.handlers import Rejected
from streams.runtime.topology import Processor, Timer

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

EVENT_ID_HEADER = "memstream.event_id"
TABLE = "graph-state"  #: graphId -> graph state (read by streams/api/graphs.py)

PROCESSOR = Processor(
    "graph-state-agent", __name__,
    "Per-graph execution state; a timer re-evaluates stall flags and republishes the graphs whose flags changed.",
    sources=(catalog.GRAPH_EVENTS,),
    stores=(TABLE,),
    timers=(Timer("graph-stall", catalog.GRAPH_EVENTS, "stall flags of the partition's graphs (MEMSTREAM_GRAPH_STALL_MS)"),),
    sinks=(catalog.GRAPH_STATE, catalog.DLQ),
    feeds=("analytics",),
)


def register(rt: Runtime) -> None:
    s = rt.settings
    table = rt.table(TABLE)
    limits = s.limits()

    async def handle(cp: checkpoint.Checkpoint, event, key: str, record: dict) -> None:
        if (problem := id_problem(key, limits)) is not None:  # the key is the table key: never stored
            code, what = problem
            raise Rejected(f"{code}: key {what}", code)
        if record.get("graphId") != key:
            raise Rejected(f"record graphId {quote(record.get('graphId'))} differs from its key {quote(key)}", "graph.key_mismatch")
        headers = dict(event.message.headers or [])
        event_id = headers.get(EVENT_ID_HEADER)
        old = cp.read(table, key)
        try:
            new = graph_state.apply(old, record, s.graph_stall_ms,
                                    event_id=event_id.decode(errors="replace") if event_id else None, limits=limits)
        except graph_state.GraphEventError as exc:
            raise Rejected(str(exc), exc.code) from None
        if new is old:
            rt.count("duplicate:graph.events.v1")
            return
        await cp.send(catalog.GRAPH_STATE, key, graph_state.to_record(new))
        cp.write(table, key, new)
        rt.feed_analytics(cp, classify_graph_budget(old, new))

    lock = asyncio.Lock()  # the agent's batches and the stall sweeps write the same table
    rt.stateful_agent(rt.inputs[catalog.GRAPH_EVENTS], "graph-state-agent", handle, lock=lock)

    async def stall_sweep(cp: checkpoint.Checkpoint, partition: int, now_ms: int) -> None:
        """Re-evaluate stall flags of this partition's graphs; publish the ones that changed."""
        for key, st in list(table.items()):
            if st is None or rt.partition_of(key) != partition:
                continue
            marked = graph_state.mark_stalled(st, now_ms, s.graph_stall_ms)
            if graph_state.stalled_nodes(marked) != graph_state.stalled_nodes(st):
                await cp.send(catalog.GRAPH_STATE, key, graph_state.to_record(marked))
                cp.write(table, key, marked)

    rt.ticks("graph-stall", catalog.GRAPH_EVENTS, stall_sweep, lock=lock)
