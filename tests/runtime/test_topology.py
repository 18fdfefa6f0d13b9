"""The topology's rendering and its comparison with a runtime (pure: made-up declarations)."""

from __future__ import annotations

import re

from streams.contracts import catalog
from streams.runtime.topology import Processor, Producer, Registered, Timer, describe, expected, mismatches, mermaid

TICK = Timer("sweep", catalog.GRAPH_EVENTS, "a sweep")
READER = Processor("reader", "pkg.reader", "Reads graph events.", sources=(catalog.GRAPH_EVENTS,),
                   sinks=(catalog.GRAPH_STATE, catalog.DLQ), stores=("graph-rows",), timers=(TICK,),
                   internal_sinks=("changes",), feeds=("hooked",))
HOOKED = Processor("hooked", "pkg.hooked", "Fed in-process.", internal_sources=("changes",), stores=("totals",),
                   sinks=(catalog.MEMORY_ANALYTICS,))
TOOL = Producer("a tool", "pkg.tool", "Writes graph events.", sinks=(catalog.GRAPH_EVENTS,), internal_sinks=("changes",))


def test_expected_registration_of_declarations():
    want = expected([READER, HOOKED])
    assert want.stores == {"graph-rows", "totals"}
    assert want.internal_topics == {"changes", "sweep-ticks"}
    assert want.agents == {"reader": {catalog.GRAPH_EVENTS}, "sweep-tick-agent": {"sweep-ticks"},
                           "hooked": {"changes"}}


def test_mismatches_name_every_difference_and_none_when_equal():
    assert mismatches(expected([READER, HOOKED]), [READER, HOOKED]) == []
    actual = Registered(stores={"graph-rows", "totals", "stray"}, internal_topics={"changes"},
                        agents={"reader": {catalog.GRAPH_EVENTS, catalog.SESSION_EVENTS}, "hooked": {"changes"},
                                "ghost": {"x"}})
    problems = mismatches(actual, [READER, HOOKED])
    assert "table 'stray' is registered but no processor declares it" in problems
    assert "internal topic 'sweep-ticks' is declared but not registered" in problems
    assert "agent 'ghost' is registered but no processor (or timer) declares it" in problems
    assert "agent 'sweep-tick-agent' is declared but not registered" in problems
    assert any(p.startswith("agent 'reader' reads ['graph.events.v1', 'session.events.v1']") for p in problems)
    assert len(problems) == 5


def test_minus_keeps_what_one_registration_added():
    before = Registered({"a"}, {"t"}, {"x": {"s"}})
    after = Registered({"a", "b"}, {"t", "u"}, {"x": {"s"}, "y": {"u"}})
    assert after.minus(before) == Registered({"b"}, {"u"}, {"y": {"u"}})


def test_describe_lists_each_processor_with_its_sources_stores_timers_and_sinks_in_that_order():
    text = describe([READER, HOOKED], [TOOL])
    block = text.split("Processor: reader  (pkg.reader)")[1].split("Processor: hooked")[0]
    order = [block.index(s) for s in ("sources: graph.events.v1", "stores:  graph-rows",
                                      "timer:   sweep (a tick per owned partition of graph.events.v1, "
                                      "through <app>-sweep-ticks): a sweep",
                                      "sinks:   graph.state.v1, pipeline.dlq.v1, <app>-changes", "feeds:   hooked")]
    assert order == sorted(order)
    assert "sources: <app>-changes" in text and "Producer: a tool  (pkg.tool)" in text
    clients = text.split("Inputs only clients write")[1]  # inputs neither a processor nor a producer writes
    assert catalog.MEMORY_EVENTS in clients and catalog.GRAPH_EVENTS not in clients


def test_mermaid_declares_every_node_once_and_every_edge_joins_declared_nodes():
    lines = mermaid([READER, HOOKED], [TOOL]).splitlines()
    assert lines[0] == "flowchart LR"
    nodes = [re.match(r"\s+(\w+)[\[({>]", line).group(1) for line in lines[1:] if not re.search(r"--|-\.", line)]
    edges = [line.split() for line in lines[1:] if re.search(r"--|-\.", line)]
    assert len(nodes) == len(set(nodes))
    for edge in edges:
        assert edge[0] in nodes and edge[-1] in nodes, edge
    text = "\n".join(lines)
    assert "#lt;app#gt;-changes" in text and "<app>" not in text  # Mermaid would read <app> as HTML
    assert "p_reader -. hook .-> p_hooked" in text and "k_sweep -.-> p_reader" in text
    assert 't_graph_events_v1[/"graph.events.v1"/]' in text and 's_totals[("totals")]' in text
    assert sum(1 for e in edges if e[-1] == "t_graph_events_v1") == 1  # the tool's edge
