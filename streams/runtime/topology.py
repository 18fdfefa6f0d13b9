"""What each processor reads, keeps and writes, declared next to its code, and the topology drawn
from those declarations (as Kafka Streams' `Topology.describe()` lists its sub-topologies).

Every agent module declares one `Processor` (`PROCESSOR = Processor(...)`): the catalog topics it
reads (`sources`: its Faust agent's channel is built from them) and writes (`sinks`), the tables
it reads or writes (`stores`), its partition-local timers (`Runtime.ticks`), the internal topics
(`<app_id>-<suffix>`) it reads or writes, and the processors it feeds in-process (the analytics
hook). A tool or the HTTP API that writes to catalog topics declares a `Producer`.

The declarations are checked, never trusted:
- `check(rt, processors)` runs once when a worker registers its agents (`register_all`): the
  tables, internal topics, tick timers and Faust agents the runtime holds must be exactly the
  declared ones (a worker with an undeclared table, a forgotten timer or an agent reading other
  topics than it declares does not start); nothing is checked per record;
- tests/agents/test_topology.py checks each module's registration, that every `catalog.X` a
  module sends to is a declared sink (and every declared sink is sent to), and that the
  declarations and the catalog agree.

`describe()` renders the listing and `mermaid()` the flowchart of README's "Topology" section and
docs/architecture.md (`python -m streams.tools.readme`; `python -m streams.tools.topology` prints
the listing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from streams.contracts import catalog

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

#: how an internal topic is written in the docs (its name is `<app_id>-<suffix>`, MEMSTREAM_APP_ID)
INTERNAL_PREFIX = "<app>-"


@dataclass(frozen=True)
class Timer:
    """A partition-local timer (`Runtime.ticks(name, partitions_of, ...)`): a tick to each
    partition of `partitions_of` this worker owns, every MEMSTREAM_TIMER_INTERVAL_S, through the
    internal topic `<app>-<name>-ticks` (read by the Faust agent `<name>-tick-agent`)."""

    name: str
    partitions_of: str
    description: str

    @property
    def topic(self) -> str:
        return f"{self.name}-ticks"

    @property
    def agent(self) -> str:
        return f"{self.name}-tick-agent"


@dataclass(frozen=True)
class Processor:
    """One processor of the worker: a Faust agent reading `sources` (named `name`) and/or timers."""

    name: str  # the Faust agent's name (a processor fed only by hooks and timers has none)
    module: str  # the module that declares it and holds its code (`__name__`)
    description: str
    sources: tuple[str, ...] = ()  # catalog topics read
    sinks: tuple[str, ...] = ()  # catalog topics written (pipeline.dlq.v1: every agent that runs `Runtime.guard`)
    stores: tuple[str, ...] = ()  # tables read or written
    timers: tuple[Timer, ...] = ()
    internal_sources: tuple[str, ...] = ()  # internal topics read (suffix of `<app_id>-`)
    internal_sinks: tuple[str, ...] = ()  # internal topics written
    feeds: tuple[str, ...] = ()  # processors fed in-process (`Runtime.feed_analytics`: the analytics hook)

    def internal_topics(self) -> tuple[str, ...]:
        """Every internal topic this processor reads or writes, its timers' tick topics included."""
        return tuple(dict.fromkeys((*self.internal_sources, *self.internal_sinks,
                                    *(t.topic for t in self.timers))))


@dataclass(frozen=True)
class Producer:
    """Something outside the worker's agents that writes catalog topics (a tool, the HTTP API)."""

    name: str
    module: str
    description: str
    sinks: tuple[str, ...] = ()
    internal_sinks: tuple[str, ...] = ()


@dataclass
class Registered:
    """What a runtime holds once its agents are registered (or what declarations promise)."""

    stores: set[str] = field(default_factory=set)
    internal_topics: set[str] = field(default_factory=set)  # suffixes; tick topics included, changelogs not
    agents: dict[str, set[str]] = field(default_factory=dict)  # Faust agent -> topics read (internal: suffix)

    def minus(self, before: "Registered") -> "Registered":
        """What was registered since `before` (one module's `register`)."""
        return Registered(self.stores - before.stores, self.internal_topics - before.internal_topics,
                          {a: t for a, t in self.agents.items() if a not in before.agents})


class TopologyMismatch(RuntimeError):
    """The agents registered something their declarations do not say (or the reverse)."""


def registered(rt: "Runtime") -> Registered:
    prefix = f"{rt.settings.app_id}-"
    changelogs = {t.changelog_topic.get_topic_name() for t in rt.tables.values()}

    def local(topic: str) -> str:
        return topic[len(prefix):] if topic.startswith(prefix) and topic not in catalog.TOPICS else topic

    internal = {local(name) for name, _p, _c in rt.internal_topics if name not in changelogs}
    agents = {name: {local(t) for t in getattr(agent.channel, "topics", ())} for name, agent in rt.app.agents.items()}
    return Registered(set(rt.tables), internal, agents)


def expected(processors: Iterable[Processor]) -> Registered:
    """What registering these processors must leave in a runtime."""
    out = Registered()
    for p in processors:
        out.stores.update(p.stores)
        out.internal_topics.update(p.internal_topics())
        if p.sources or p.internal_sources:
            out.agents[p.name] = {*p.sources, *p.internal_sources}
        for t in p.timers:
            out.agents[t.agent] = {t.topic}
    return out


def mismatches(actual: Registered, processors: Iterable[Processor]) -> list[str]:
    """Every difference between what was registered and what the processors declare, in words."""
    want = expected(processors)
    problems = []
    for what, have, declared in (("table", actual.stores, want.stores),
                                 ("internal topic", actual.internal_topics, want.internal_topics)):
        problems += [f"{what} {n!r} is registered but no processor declares it" for n in sorted(have - declared)]
        problems += [f"{what} {n!r} is declared but not registered" for n in sorted(declared - have)]
    for name in sorted(actual.agents.keys() | want.agents.keys()):
        have, declared = actual.agents.get(name), want.agents.get(name)
        if declared is None:
            problems.append(f"agent {name!r} is registered but no processor (or timer) declares it")
        elif have is None:
            problems.append(f"agent {name!r} is declared but not registered")
        elif have != declared:
            problems.append(f"agent {name!r} reads {sorted(have)}, its declaration says {sorted(declared)}")
    return problems


def check(rt: "Runtime", processors: Iterable[Processor]) -> None:
    """Refuse a runtime whose registered agents differ from the declarations (once, at registration)."""
    problems = mismatches(registered(rt), processors)
    if problems:
        raise TopologyMismatch("the agents' declarations (PROCESSOR in streams/agents/) and what they "
                               "registered differ: " + "; ".join(problems))


def _internal(suffix: str) -> str:
    return INTERNAL_PREFIX + suffix


def _listing(items: Iterable[str]) -> str:
    items = list(items)
    return ", ".join(items) if items else "-"


def describe(processors: Iterable[Processor], producers: Iterable[Producer] = ()) -> str:
    """The topology as text: each processor with its sources, stores, timers and sinks."""
    processors, producers = list(processors), list(producers)
    lines = ["Processors (one Faust agent each; every input is keyed and co-partitioned, so state is partition-local):"]
    for p in processors:
        lines += ["", f"  Processor: {p.name}  ({p.module})", f"    {p.description}",
                  f"    sources: {_listing([*p.sources, *map(_internal, p.internal_sources)])}",
                  f"    stores:  {_listing(p.stores)}"]
        for t in p.timers:
            lines.append(f"    timer:   {t.name} (a tick per owned partition of {t.partitions_of}, "
                         f"through {_internal(t.topic)}): {t.description}")
        lines.append(f"    sinks:   {_listing([*p.sinks, *map(_internal, p.internal_sinks)])}")
        if p.feeds:
            lines.append(f"    feeds:   {_listing(p.feeds)} (in-process, within the same batch)")
    if producers:
        lines += ["", "Producers outside the agents:"]
        for q in producers:
            lines += ["", f"  Producer: {q.name}  ({q.module})", f"    {q.description}",
                      f"    sinks:   {_listing([*q.sinks, *map(_internal, q.internal_sinks)])}"]
    written = {t for d in [*processors, *producers] for t in d.sinks}
    clients = [t.name for t in catalog.topics() if t.direction == "in" and t.name not in written]
    if clients:
        lines += ["", f"Inputs only clients write (agents, devices; `memstream generate`): {_listing(clients)}"]
    return "\n".join(lines)


def _id(kind: str, name: str) -> str:
    return f"{kind}_{re.sub(r'[^A-Za-z0-9]', '_', name)}"


def mermaid(processors: Iterable[Processor], producers: Iterable[Producer] = ()) -> str:
    """The topology as a Mermaid flowchart: topics, processors, stores (cylinders), timers, producers."""
    processors, producers = list(processors), list(producers)
    out = ["flowchart LR"]
    nodes: dict[str, str] = {}

    def topic(name: str, internal: bool = False) -> str:
        node = _id("it" if internal else "t", name)
        label = _internal(name).replace("<", "#lt;").replace(">", "#gt;") if internal else name  # Mermaid entities
        nodes.setdefault(node, f'{node}[/"{label}"/]')
        return node

    edges = []
    for p in processors:
        me = _id("p", p.name)
        nodes[me] = f'{me}["{p.name}"]'
        edges += [f"{topic(t)} --> {me}" for t in p.sources]
        edges += [f"{topic(t, True)} --> {me}" for t in p.internal_sources]
        for s in p.stores:
            store = _id("s", s)
            nodes.setdefault(store, f'{store}[("{s}")]')
            edges.append(f"{me} --- {store}")
        for t in p.timers:
            timer = _id("k", t.name)
            nodes[timer] = f'{timer}{{{{"{t.name} timer"}}}}'
            edges.append(f"{timer} -.-> {me}")
        edges += [f"{me} --> {topic(t)}" for t in p.sinks]
        edges += [f"{me} --> {topic(t, True)}" for t in p.internal_sinks]
        edges += [f"{me} -. hook .-> {_id('p', f)}" for f in p.feeds]
    for q in producers:
        me = _id("x", q.name)
        nodes[me] = f'{me}>"{q.name}"]'
        edges += [f"{me} --> {topic(t)}" for t in q.sinks]
        edges += [f"{me} --> {topic(t, True)}" for t in q.internal_sinks]
    out += [f"  {n}" for n in nodes.values()]
    out += [f"  {e}" for e in edges]
    return "\n".join(out)
