"""The processors' declarations (`PROCESSOR`, `PRODUCER`) against what the code registers and
sends, and against the topic catalog (no broker: the app is built, not started)."""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

from streams.agents import analytics, consumed_topics, graphs, memory, processors, relay_policy, sessions
from streams.composition import register_all
from streams.contracts import catalog
from streams.runtime import topology
from streams.runtime.app import Runtime
from streams.settings import Settings
from streams.tools import topology as topology_tool

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "streams"

#: modules that send to catalog topics on behalf of another module's declaration
ON_BEHALF = {"streams.agents.negotiator_calls": "streams.api.memory",  # the HTTP negotiator views' requests
             "streams.agents.memory_step": "streams.agents.memory"}  # the records the memory agent sends


def _runtime() -> Runtime:
    return Runtime(Settings(registry_url="", partitions=3))


def test_each_agent_module_registers_exactly_what_its_processors_declare():
    rt = _runtime()
    # register_all's order; memory.register also starts the relay-policy agent (its table's one writer)
    steps = [(analytics.register, [analytics.PROCESSOR]),
             (memory.register, [memory.PROCESSOR, relay_policy.PROCESSOR]),
             (graphs.register, [graphs.PROCESSOR]),
             (sessions.register, [sessions.PROCESSOR])]
    for register, declared in steps:
        before = topology.registered(rt)
        register(rt)
        added = topology.registered(rt).minus(before)
        assert topology.mismatches(added, declared) == [], register.__module__
        assert added.agents, register.__module__  # every module starts at least one Faust agent
    assert {p.name for _r, ps in steps for p in ps} == {p.name for p in processors()}


def test_the_worker_refuses_agents_that_register_what_they_do_not_declare():
    rt = _runtime()
    register_all(rt)  # checks: passes as declared
    rt.table("undeclared-table")
    rt.ticks("undeclared-sweep", catalog.GRAPH_EVENTS, lambda _p, _now: None)
    with pytest.raises(topology.TopologyMismatch) as err:
        topology.check(rt, processors())
    message = str(err.value)
    assert "table 'undeclared-table' is registered but no processor declares it" in message
    assert "internal topic 'undeclared-sweep-ticks' is registered" in message
    assert "agent 'undeclared-sweep-tick-agent' is registered" in message


def test_a_declaration_the_agents_do_not_register_is_refused_too():
    rt = _runtime()
    register_all(rt)
    changed = [topology.Processor(p.name, p.module, p.description, sources=p.sources[:1], sinks=p.sinks,
                                  stores=(*p.stores, "promised-table"), timers=p.timers,
                                  internal_sources=p.internal_sources, internal_sinks=p.internal_sinks)
               if p is memory.PROCESSOR else p for p in processors()]
    problems = topology.mismatches(topology.registered(rt), changed)
    assert "table 'promised-table' is declared but not registered" in problems
    assert any(m.startswith("agent 'memory-consolidate' reads") for m in problems)


def _declarations(module_name: str) -> list:
    module = importlib.import_module(module_name)
    return [d for d in (getattr(module, "PROCESSOR", None), getattr(module, "PRODUCER", None)) if d is not None]


def _catalog_constant(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "catalog":
        return getattr(catalog, node.attr, None) if node.attr.isupper() else None
    return None


def sends(tree: ast.AST) -> set[str]:
    """Catalog topics a module sends to: `x.send(catalog.X, ...)`, `x.produce(catalog.X, ...)`,
    `rt.inputs[catalog.X].send(...)`."""
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("send", "produce", "send_and_wait")):
            continue
        target = node.func.value
        if node.args and (name := _catalog_constant(node.args[0])):
            out.add(name)
        elif isinstance(target, ast.Subscript) and (name := _catalog_constant(target.slice)):
            out.add(name)
    return out


def calls(tree: ast.AST, attr: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
               for n in ast.walk(tree))


@functools.cache
def _modules() -> dict[str, ast.AST]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): ast.parse(p.read_text())
            for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_sender_finds_every_form_of_send():
    tree = ast.parse("async def f(rt, p, catalog):\n"
                     "    await rt.send(catalog.MEMORY_LEDGER, k, v)\n"
                     "    await rt.inputs[catalog.ERASE_REQUESTS].send(key=k, value=v)\n"
                     "    p.produce(catalog.GRAPH_EVENTS, k, v)\n"
                     "    p.produce(topic, k, v)\n"
                     "    rt.count(catalog.DLQ)\n")
    assert sends(tree) == {catalog.MEMORY_LEDGER, catalog.ERASE_REQUESTS, catalog.GRAPH_EVENTS}


def test_every_catalog_topic_a_module_sends_to_is_a_declared_sink_and_every_sink_is_sent_to():
    modules = _modules()
    sent: dict[str, set[str]] = {}
    for name, tree in modules.items():
        if topics := sends(tree):
            sent.setdefault(ON_BEHALF.get(name, name), set()).update(topics)
    assert {"streams.agents.memory", "streams.tools.shipper"} <= set(sent)  # the scan sees the senders
    # the runtime sends only dead letters, for the agents whose records it guards (`Runtime.guard`)
    assert sent.pop("streams.runtime.app") == {catalog.DLQ}
    for name, topics in sorted(sent.items()):
        declared = _declarations(name)
        assert declared, f"{name} sends to {sorted(topics)} but declares no PROCESSOR / PRODUCER"
        sinks = {t for d in declared for t in d.sinks}
        assert topics <= sinks, f"{name} sends to {sorted(topics - sinks)}, not among its declared sinks"
    for d in [*processors(), *topology_tool.producers()]:
        assert d.module in modules, d
        # the dead-letter topic of an agent is written by `Runtime.guard` (streams/runtime/app.py)
        through_guard = {catalog.DLQ} if isinstance(d, topology.Processor) and d.sources else set()
        unsent = set(d.sinks) - sent.get(d.module, set()) - through_guard
        assert not unsent, f"{d.name} declares sinks {sorted(unsent)} its module never sends to"


def test_a_processor_that_reads_catalog_topics_dead_letters_and_feeds_the_analytics_hook_as_declared():
    modules = _modules()
    for p in processors():
        assert p.module == importlib.import_module(p.module).__name__ and _declarations(p.module)[0] is p
        if p.sources:  # every record goes through `Runtime.guard`: a refused one is a dead letter
            assert catalog.DLQ in p.sinks, p.name
        tree = modules[p.module]
        feeds = calls(tree, "feed_analytics") or calls(tree, "erase_analytics")
        assert feeds == ("analytics" in p.feeds), p.name


def test_the_declarations_and_the_catalog_agree():
    procs, producers = processors(), topology_tool.producers()
    names = [p.name for p in procs]
    assert len(names) == len(set(names))
    inputs = {t.name for t in catalog.topics() if t.direction == "in"}
    outputs = {t.name for t in catalog.topics() if t.direction == "out"}
    read = {t for p in procs for t in p.sources}
    written = {t for d in [*procs, *producers] for t in d.sinks}
    assert read == inputs, "every input topic is read by some processor, and processors read only inputs"
    assert outputs <= written, f"output topics no processor or producer writes: {sorted(outputs - written)}"
    assert written <= set(catalog.TOPICS)
    assert set(consumed_topics()) == inputs
    internal_read = {t for p in procs for t in p.internal_sources}
    for d in [*procs, *producers]:
        assert set(d.internal_sinks) <= internal_read, f"{d.name} writes an internal topic nobody reads"
    for p in procs:
        assert set(p.feeds) <= set(names), p.name
        for t in p.timers:  # ticks go to the owned partitions of a topic this worker's group reads
            assert t.partitions_of in read, (p.name, t.name)
