"""What the pipeline produces → analytics counter increments (SPEC §4.10) — pure.

Every classifier returns a list of :class:`Increment` (``subject``, ``event_time_ms``,
``counters``, ``id``): zero or more, never raising on a record it has nothing to say about.
``id`` is deterministic (built from ids the pipeline already makes deterministic: event ids,
entry ids, source offsets, sequence numbers), so :func:`streams.analytics.windows.add` can skip
an input replayed after a crash.

Subjects (the ``motebit_id`` field of the published record)
----------------------------------------------------------
Memory activity belongs to a user: the subject is the ``motebit_id``. Compaction and graph
activity does not: ``session.events.v1`` is keyed by session id and ``graph.events.v1`` by graph
id, and no record maps a session or a graph to a user. Rather than guess, they are published
under documented pseudo subjects that live on the same partition as their source key:

* ``session:<session_id>`` — ``compaction_tokens_saved`` (and dead letters of session events);
* ``graph:<graph_id>`` — ``graph_cost_usd`` (and dead letters of graph events);
* ``(unknown)`` — a dead letter whose key is missing or not UTF-8. Several partitions can
  produce those, and one subject must live on one partition (its state is in a table written
  from that partition's events), so pass ``partition=`` and the subject is ``(unknown):<p>``.

Fleet-wide totals (``GET /v1/analytics/summary``) are computed by
:func:`streams.analytics.summary.summarize` over all subjects; there is no published ``*``
record. A ``motebit_id`` that itself starts with ``session:``, ``graph:`` or ``(unknown)`` would
be read as a pseudo subject by :func:`subject_kind`: those prefixes are reserved.

Counter rules
-------------
* ledger (``memory.ledger.v1``) ``memory_formed`` → ``formed`` (not a deletion tombstone:
  ``redacted_reason == "deleted"`` counts nothing — the ``memory_deleted`` it accompanies counts);
  ``memory_accessed`` → ``accessed``; ``memory_deleted`` → ``deleted``; ``memory_promoted`` →
  ``promoted``; ``memory_consolidated`` with action ``merge`` (or reinforce/noop) → ``merged``,
  ``supersede`` (or update) → ``superseded`` (accept / reject count nothing: an accept's
  ``memory_formed`` already counts). Pinned, audit, decayed: nothing.
* relay (``memory.relay.v1``) ``memory_formed`` with ``redacted: true`` and not a deletion
  tombstone → ``redacted``.
* quarantine entry → ``quarantined`` at ``quarantined_at``.
* dead letter → ``dead_lettered`` (one per dead-letter record) at the source record's Kafka
  timestamp (pass it: the dead letter's ``failed_at`` is wall-clock time and would change on a
  replay).
* compaction ledger: the increase of the cumulative ``tokensSaved`` between the previous and
  the new ledger of a session → ``compaction_tokens_saved`` (signed), at the session event's
  ``ts``. A ledger whose ``lastSeq`` is not newer counts nothing.
* graph budget: the change of the cumulative ``budget.costUsd`` between the previous and the
  new graph state → ``graph_cost_nanousd`` (signed, integer nano-dollars of the rounded
  snapshots, so the sum over windows telescopes exactly to the latest snapshot), at the new
  snapshot's ``budgetTs``. A replayed or older snapshot leaves the state's budget unchanged
  (``streams/graphs/state.py``: greatest ``ts`` wins) and so counts nothing — never twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.contracts import catalog
from streams.core.limits import DEFAULT_LIMITS, is_valid_id
from streams.core.vocabulary import try_normalize_action

from .windows import GRAPH_COST_NANOS, usd_to_nanos

SESSION_PREFIX = "session:"
GRAPH_PREFIX = "graph:"
UNKNOWN_SUBJECT = "(unknown)"
USER, SESSION, GRAPH, UNKNOWN = "user", "session", "graph", "unknown"
SUBJECT_KINDS = (USER, SESSION, GRAPH, UNKNOWN)
DELETED_REASON = "deleted"

_LEDGER_COUNTERS: dict[str | None, str] = {  # looked up with what an event carries, maybe nothing
    "memory_formed": "formed",
    "memory_accessed": "accessed",
    "memory_deleted": "deleted",
    "memory_promoted": "promoted",
}
_ACTION_COUNTERS: dict[str | None, str] = {"merge": "merged", "supersede": "superseded"}


@dataclass(slots=True)
class Increment:
    """Counters to add to ``subject``'s windows at ``event_time_ms``; ``id`` de-duplicates.
    Never changed once made (not ``frozen``: one is made per classified output, and a frozen
    dataclass's ``__init__`` costs three times a plain one's)."""

    subject: str
    event_time_ms: int
    counters: Mapping[str, int] = field(default_factory=dict)
    id: str | None = None


# --------------------------------------------------------------------------------------------
# subjects
# --------------------------------------------------------------------------------------------


def session_subject(session_id: str) -> str:
    return SESSION_PREFIX + session_id


def graph_subject(graph_id: str) -> str:
    return GRAPH_PREFIX + graph_id


def unknown_subject(partition: int | None = None) -> str:
    return UNKNOWN_SUBJECT if partition is None else f"{UNKNOWN_SUBJECT}:{int(partition)}"


def subject_kind(subject: str) -> str:
    """``user``, ``session``, ``graph`` or ``unknown``."""
    if subject.startswith(SESSION_PREFIX):
        return SESSION
    if subject.startswith(GRAPH_PREFIX):
        return GRAPH
    if subject.startswith(UNKNOWN_SUBJECT):
        return UNKNOWN
    return USER


def routing_key(subject: str) -> str | None:
    """The source key whose partition holds ``subject``'s state (None for ``(unknown)``
    subjects: see :func:`subject_partition`)."""
    kind = subject_kind(subject)
    if kind == SESSION:
        return subject[len(SESSION_PREFIX):]
    if kind == GRAPH:
        return subject[len(GRAPH_PREFIX):]
    if kind == UNKNOWN:
        return None
    return subject


def subject_owner(subject: str) -> str | int | None:
    """What places ``subject``'s state: its routing key, the partition ``p`` of ``(unknown):<p>``,
    or None for a bare ``(unknown)`` (the owner rule of the ``analytics`` table:
    streams/core/repartition.py)."""
    key = routing_key(subject)
    if key is not None:
        return key
    rest = subject[len(UNKNOWN_SUBJECT):]
    if rest.startswith(":") and rest[1:].isdigit():
        return int(rest[1:])
    return None


def subject_partition(subject: str, partition_of: Callable[[str], int]) -> int | None:
    """The partition that owns ``subject``: ``partition_of(routing_key)`` (the shell passes
    ``Runtime.partition_of``), or ``p`` for ``(unknown):<p>``; None for a bare ``(unknown)``."""
    owner = subject_owner(subject)
    return partition_of(owner) if isinstance(owner, str) else owner


# --------------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------------


def _is_tombstone(payload: Any) -> bool:
    return isinstance(payload, Mapping) and payload.get("redacted_reason") == DELETED_REASON


def _envelope(event: Mapping[str, Any]) -> tuple[str, int, str] | None:
    user, ts, eid = event.get("motebit_id"), event.get("timestamp"), event.get("event_id")
    if not isinstance(user, str) or not isinstance(ts, int) or isinstance(ts, bool) or not isinstance(eid, str):
        return None
    return user, ts, eid


def classify_ledger_event(event: Mapping[str, Any]) -> list[Increment]:
    """A ``memory.ledger.v1`` MemoryEvent → formed / accessed / deleted / promoted / merged /
    superseded (or nothing)."""
    env = _envelope(event)
    if env is None:
        return []
    user, ts, eid = env
    etype, payload = event.get("event_type"), event.get("payload")
    counter = _LEDGER_COUNTERS.get(etype)
    if etype == "memory_formed" and _is_tombstone(payload):
        counter = None
    elif etype == "memory_consolidated":
        action = try_normalize_action(payload.get("action")) if isinstance(payload, Mapping) else None
        counter = _ACTION_COUNTERS.get(action)
    if counter is None:
        return []
    return [Increment(user, ts, {counter: 1}, f"ledger:{eid}")]


def classify_relay_event(event: Mapping[str, Any]) -> list[Increment]:
    """A ``memory.relay.v1`` MemoryEvent → ``redacted`` when it is a sensitivity-redacted
    ``memory_formed`` (a deletion tombstone is not a redaction)."""
    env = _envelope(event)
    if env is None or event.get("event_type") != "memory_formed":
        return []
    payload = event.get("payload")
    if not isinstance(payload, Mapping) or payload.get("redacted") is not True or _is_tombstone(payload):
        return []
    user, ts, eid = env
    return [Increment(user, ts, {"redacted": 1}, f"relay:{eid}")]


def classify_quarantine(entry: Mapping[str, Any]) -> list[Increment]:
    """A ``memory.quarantine.v1`` QuarantineEntry → ``quarantined`` at ``quarantined_at``."""
    user, ts, eid = entry.get("motebit_id"), entry.get("quarantined_at"), entry.get("entry_id")
    if not isinstance(user, str) or not isinstance(ts, int) or isinstance(ts, bool):
        return []
    return [Increment(user, ts, {"quarantined": 1}, f"quarantine:{eid}" if isinstance(eid, str) else None)]


def classify_outcome(outcome: Any, relayed: Iterable[Mapping[str, Any]] = ()) -> list[Increment]:
    """Everything countable in one core ``Outcome`` (its ``ledger`` and ``quarantined``) plus
    the relay events the shell derived from that ledger (``relay_events``). Dead letters are
    classified where the shell builds them (:func:`classify_dead_letter`)."""
    out: list[Increment] = []
    for ev in getattr(outcome, "ledger", ()) or ():
        out.extend(classify_ledger_event(ev))
    for ev in relayed:
        out.extend(classify_relay_event(ev))
    for q in getattr(outcome, "quarantined", ()) or ():
        out.extend(classify_quarantine(q))
    return out


# --------------------------------------------------------------------------------------------
# dead letters
# --------------------------------------------------------------------------------------------


#: a dead letter's key names its analytics subject only if it follows the id rules (generous on
#: length: MEMSTREAM_MAX_ID_CHARS may be raised); otherwise it counts under the partition's
#: "(unknown)" subject, so a 200 KB key never becomes a table key
_SUBJECT_LIMITS = dataclasses.replace(DEFAULT_LIMITS, max_id_chars=1024)


def dead_letter_subject(original_key: bytes | str | None, original_topic: str, partition: int | None = None) -> str:
    """The subject a dead letter counts for: the key as ``motebit_id`` (or ``session:<key>`` /
    ``graph:<key>`` for session and graph events) when it is present and valid UTF-8, else
    :func:`unknown_subject` of ``partition``."""
    key: str | None
    if isinstance(original_key, (bytes, bytearray, memoryview)):
        try:
            key = bytes(original_key).decode("utf-8")
        except UnicodeDecodeError:
            key = None
    else:
        key = original_key if isinstance(original_key, str) else None
    if not key or not is_valid_id(key, _SUBJECT_LIMITS):
        return unknown_subject(partition)  # a hostile key never names an analytics row
    if original_topic == catalog.SESSION_EVENTS:
        return session_subject(key)
    if original_topic == catalog.GRAPH_EVENTS:
        return graph_subject(key)
    return key


def classify_dead_letter(dead_letter: Mapping[str, Any], event_time_ms: int, *, index: int = 0,
                         partition: int | None = None,
                         partition_of: Callable[[str], int] | None = None) -> list[Increment]:
    """A DeadLetter record (``streams.contracts.deadletter.dead_letter``) → ``dead_lettered``.

    ``event_time_ms``: the source record's Kafka timestamp (stable across replays).
    ``index``: the ordinal of this dead letter among those written for the same source record
    (a session event can break several rules). ``partition``: the partition whose state the
    shell writes (default: ``original_partition``), used for an ``(unknown)`` key.
    ``partition_of``: the key -> partition rule (the shell passes ``Runtime.partition_of``); a
    dead letter whose key belongs on another partition (a misrouted record: ``wrong_partition``)
    counts under ``(unknown):<partition>``, since its key's row lives in a partition this one
    never writes (a row there would be one that no worker publishes or re-partitions)."""
    topic = dead_letter.get("original_topic") or ""
    p = dead_letter.get("original_partition") if partition is None else partition
    subject = dead_letter_subject(dead_letter.get("original_key"), topic, p if isinstance(p, int) else None)
    if partition_of is not None and isinstance(p, int) and subject_partition(subject, partition_of) != p:
        subject = unknown_subject(p)
    off = dead_letter.get("original_offset")
    did = f"dlq:{topic}:{dead_letter.get('original_partition')}:{off}:{index}" if isinstance(off, int) else None
    return [Increment(subject, int(event_time_ms), {"dead_lettered": 1}, did)]


# --------------------------------------------------------------------------------------------
# compaction ledger and graph budget
# --------------------------------------------------------------------------------------------


def _ledger_record(x: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if x is None:
        return None
    return x["record"] if "record" in x and isinstance(x["record"], Mapping) else x


def classify_compaction(previous: Mapping[str, Any] | None, current: Mapping[str, Any],
                        event_time_ms: int) -> list[Increment]:
    """Tokens saved by one session event: ``current.tokensSaved - previous.tokensSaved`` under
    ``session:<sessionId>`` at ``event_time_ms`` (the session event's ``ts``).

    ``previous`` / ``current``: CompactionLedger records or ``lifecycle`` states (``{"record":
    ...}``); ``previous`` None = a new session. Nothing when the delta is zero or ``current`` is
    not newer (``lastSeq``) than ``previous`` (a redelivery)."""
    cur = _ledger_record(current)
    assert cur is not None  # current is not None
    prev = _ledger_record(previous)
    sid = cur.get("sessionId")
    if not isinstance(sid, str):
        return []
    prev_seq = prev.get("lastSeq", -1) if prev is not None else -1
    if prev is not None and cur.get("lastSeq", -1) <= prev_seq:
        return []
    delta = int(cur.get("tokensSaved", 0)) - (int(prev.get("tokensSaved", 0)) if prev is not None else 0)
    if delta == 0:
        return []
    return [Increment(session_subject(sid), int(event_time_ms), {"compaction_tokens_saved": delta},
                      f"compaction:{sid}:{cur.get('lastSeq')}")]


def budget_cost_nanos(state: Mapping[str, Any] | None) -> int:
    """Cumulative spend of a graph state / GraphState record, in integer nano-dollars (0 when it
    has no budget yet)."""
    budget = state.get("budget") if state is not None else None
    if not isinstance(budget, Mapping):
        return 0
    cost = budget.get("costUsd", 0.0)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost != cost or cost in (float("inf"), float("-inf")):
        return 0
    return usd_to_nanos(cost)


def classify_graph_budget(previous: Mapping[str, Any] | None, current: Mapping[str, Any],
                          event_time_ms: int | None = None) -> list[Increment]:
    """Graph spend of one graph event: the change of the cumulative ``budget.costUsd`` from
    ``previous`` to ``current`` (graph states of ``streams.graphs.state`` or GraphState
    records; ``previous`` None = a new graph) under ``graph:<graphId>``, at ``event_time_ms``
    (default: the new snapshot's ``budgetTs``, else ``updatedAt``)."""
    gid = current.get("graphId")
    if not isinstance(gid, str):
        return []
    before, after = budget_cost_nanos(previous), budget_cost_nanos(current)
    if after == before:
        return []
    if event_time_ms is None:
        event_time_ms = current.get("budgetTs")
        if event_time_ms is None:
            event_time_ms = current.get("updatedAt")
    if not isinstance(event_time_ms, int) or isinstance(event_time_ms, bool):
        return []
    ts = current.get("budgetTs", event_time_ms)
    return [Increment(graph_subject(gid), int(event_time_ms), {GRAPH_COST_NANOS: after - before},
                      f"graph:{gid}:{ts}:{before}->{after}")]
