"""The topic catalog: the one place that names every topic memstream reads or writes.

Partitions, replication factor, cleanup policy and retention of each topic come from here;
`memstream topics apply` creates them, `memstream catalog` documents them, the README's topic
table is generated from them, and the Faust app declares its topics from them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from streams.settings import Settings

DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    direction: str  # "in" | "out"
    key: str  # what the UTF-8 string key is: the value field(s) it is taken from, "/"-joined
    value_schema: str  # stem of schemas/<value_schema>.avsc
    cleanup_policy: str  # "delete" | "compact" | "compact,delete"
    description: str
    retention_ms: int | None = None  # None = broker default (7 days)

    def partitions(self, settings: Settings) -> int:
        return settings.partitions

    def replication(self, settings: Settings) -> int:
        return settings.replication

    def config(self) -> dict[str, str]:
        cfg = {"cleanup.policy": self.cleanup_policy}
        if self.retention_ms is not None:
            cfg["retention.ms"] = str(self.retention_ms)
        return cfg


_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("memory.events.v1", "in", "motebit_id", "memory_event", "delete",
              "Memory event envelopes from agents and devices."),
    TopicSpec("memory.candidates.v1", "in", "motebit_id", "candidate_memory", "delete",
              "Candidate memories to consolidate."),
    TopicSpec("memory.turns.v1", "in", "motebit_id", "user_turn", "delete",
              "One user turn (and the agent reply) for the missed-memory audit."),
    TopicSpec("session.events.v1", "in", "sessionId", "session_event", "delete",
              "Session log events, including compaction/*."),
    TopicSpec("graph.events.v1", "in", "graphId", "graph_event", "delete",
              "Graph engine event records (shipped from graph-events-*.ndjson)."),
    TopicSpec("negotiator.requests.v1", "in", "user_id", "negotiator_request", "delete",
              "Negotiator remember / forget requests."),
    TopicSpec("memory.erase-requests.v1", "in", "motebit_id", "erase_request", "delete",
              "Requests to erase a user (`memstream erase`, POST /v1/memory/{motebit_id}/erase) and their continuation steps."),
    TopicSpec("memory.ledger.v1", "out", "motebit_id", "memory_event", "delete",
              "Every accepted memory event in order, incl. derived ones."),
    TopicSpec("memory.relay.v1", "out", "motebit_id", "memory_event", "delete",
              "The ledger as a sync peer may see it: redacted, tombstoned, local-only events dropped."),
    TopicSpec("memory.nodes.v1", "out", "motebit_id/node_id", "memory_node", "compact",
              "Current state of each memory node; null (tombstone) once deleted."),
    TopicSpec("memory.quarantine.v1", "out", "motebit_id", "quarantine_entry", "delete",
              "Instruction-form entries held at the exposure gate."),
    TopicSpec("memory.analytics.v1", "out", "motebit_id", "analytics_window", "compact,delete",
              "Windowed activity aggregates.", retention_ms=30 * DAY_MS),
    TopicSpec("session.compactions.v1", "out", "sessionId", "compaction_ledger", "compact",
              "Per-session compaction ledger."),
    TopicSpec("graph.state.v1", "out", "graphId", "graph_state", "compact",
              "Per-graph execution state."),
    TopicSpec("negotiator.replies.v1", "out", "user_id", "negotiator_reply", "delete",
              "Results of remember / forget."),
    TopicSpec("pipeline.dlq.v1", "out", "original key", "dead_letter", "delete",
              "Every record the pipeline could not accept, with the reason.", retention_ms=30 * DAY_MS),
    TopicSpec("shipper.positions.v1", "out", "shipper/file", "shipper_position", "compact",
              "The graph-log shipper's file positions, committed in the same transaction as the lines."),
    TopicSpec("security.audit.v1", "out", "motebit_id", "access_audit", "delete",
              "Every relay-threshold change made through the HTTP API: token name, old -> new, when; never content.",
              retention_ms=365 * DAY_MS),
    TopicSpec("memory.erase-receipts.v1", "out", "motebit_id", "erasure_receipt", "delete",
              "One receipt per erased user: what was removed (ids and counts, never content).",
              retention_ms=365 * DAY_MS),
)

TOPICS: dict[str, TopicSpec] = {t.name: t for t in _TOPICS}

# Names used by code, so a typo is an AttributeError rather than a silent new topic.
MEMORY_EVENTS = "memory.events.v1"
MEMORY_CANDIDATES = "memory.candidates.v1"
MEMORY_TURNS = "memory.turns.v1"
SESSION_EVENTS = "session.events.v1"
GRAPH_EVENTS = "graph.events.v1"
NEGOTIATOR_REQUESTS = "negotiator.requests.v1"
ERASE_REQUESTS = "memory.erase-requests.v1"
MEMORY_LEDGER = "memory.ledger.v1"
MEMORY_RELAY = "memory.relay.v1"
MEMORY_NODES = "memory.nodes.v1"
MEMORY_QUARANTINE = "memory.quarantine.v1"
MEMORY_ANALYTICS = "memory.analytics.v1"
SESSION_COMPACTIONS = "session.compactions.v1"
GRAPH_STATE = "graph.state.v1"
NEGOTIATOR_REPLIES = "negotiator.replies.v1"
DLQ = "pipeline.dlq.v1"
SHIPPER_POSITIONS = "shipper.positions.v1"
SECURITY_AUDIT = "security.audit.v1"
ERASE_RECEIPTS = "memory.erase-receipts.v1"


@dataclass(frozen=True)
class StorageTopic:
    """A topic the Schema Registry keeps its own storage in (Apicurio's KafkaSQL storage): not
    memstream records, so no schema and no key; created by `memstream dev up` before the registry
    starts, with the configuration Apicurio verifies at start-up (it refuses a compacted journal
    and any retention: the journal is the registry's whole history, every schema id included)."""

    name: str
    apicurio_property: str  # the Apicurio setting that names this topic
    description: str

    def config(self) -> dict[str, str]:
        return {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


#: The registry's storage (Apicurio 3 KafkaSQL): one partition each (a total order: schema ids
#: are handed out in journal order), never compacted, never expired.
REGISTRY_TOPICS: tuple[StorageTopic, ...] = (
    StorageTopic("_registry.journal", "apicurio.kafkasql.topic",
                 "Every change the Schema Registry made (subjects, schemas, ids): its durable storage."),
    StorageTopic("_registry.snapshots", "apicurio.kafkasql.snapshots.topic",
                 "Snapshots of the registry journal (none unless an operator takes one)."),
    StorageTopic("_registry.events", "apicurio.events.kafka.topic",
                 "The registry's change events (unused by memstream)."),
)


def topics() -> Iterator[TopicSpec]:
    return iter(_TOPICS)


def topic(name: str) -> TopicSpec:
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the topic catalog (streams/contracts/catalog.py)") from None


def markdown_table(settings: Settings | None = None) -> str:
    """The README's topic table, generated from the catalog."""
    settings = settings or Settings()
    rows = [
        "| topic | direction | key | value schema | cleanup | partitions | retention |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in _TOPICS:
        retention = "broker default" if t.retention_ms is None else f"{t.retention_ms // DAY_MS} d"
        rows.append(
            f"| `{t.name}` | {t.direction} | `{t.key}` | `schemas/{t.value_schema}.avsc` | "
            f"{t.cleanup_policy} | {t.partitions(settings)} | {retention} |"
        )
    for r in REGISTRY_TOPICS:
        rows.append(f"| `{r.name}` | registry | – | (Apicurio KafkaSQL storage) | delete | 1 | never expires |")
    return "\n".join(rows)
