"""Memory analytics on event time (SPEC §4.10) — the pure core. No Kafka, no Faust.

* :mod:`.classify` — what the pipeline produces (ledger / relay events, quarantine entries,
  dead letters, compaction ledgers, graph states) → :class:`Increment` s per subject.
* :mod:`.windows` — per-subject tumbling minute / hour windows as a JSON-able dict: ``add``,
  ``due``, ``mark_published``, ``expire``, ``to_record``; the record-key recommendation is in
  its docstring.
* :mod:`.summary` — fleet-wide summary for ``GET /v1/analytics/summary``.

What the Faust shell does (one table ``analytics``: key = subject, value = window state)
-------------------------------------------------------------------------------------
1. Feed, always inside the event being processed (its partition owns the subject: the
   subject's routing key is that event's key, so the table write lands on the right changelog
   partition):

   * memory agent ``emit``: ``classify_outcome(out, relayed)`` — the outcome's ledger events,
     the relay events actually sent for them, its quarantine entries (subject ``motebit_id``);
     this covers candidates, memory events, the forget path and housekeeping sweeps;
   * every dead letter sent (``Runtime.dead_letter``): ``classify_dead_letter(record,
     int(msg.timestamp * 1000), index=i, partition=msg.partition)`` (Faust's message timestamp
     is in seconds; ``i`` numbers the dead letters of one source record);
   * session agent: ``classify_compaction(old_state, new_state, record["ts"])``;
   * graph agent: ``classify_graph_budget(old_state, new_state)``.

   For each subject, stage ``cp.update(table, subject, fn)`` where ``fn(state)`` does, on
   the row as it is when the batch writes, ``state = state or new_state(subject)``; ``result =
   add_increment(state, inc, now_ms=wall_clock_ms)`` per increment; counts ``result.refused``
   (``too_late`` / ``too_early``) in the worker stats; returns ``state``. Never a row read
   earlier: the table has several writers (docs/state.md).
2. Publish and expire on a partition-local timer (``Runtime.ticks``), for partition ``p``: the
   subjects whose rows ``p``'s store holds (RocksDB: that partition's database alone,
   ``streams.agents.state_scan.partition_items``; another store: the subjects with
   ``subject_partition(subject, rt.partition_of) == p``); ``clock =
   partition_clock(their states)``; per subject: ``pairs = records_due(state)``; send every
   record (key: the subject; ``window_identity`` tells its windows apart, see
   :mod:`.windows`); then, as a ``cp.update`` applied to the row as it is when written
   (increments counted during the sends are in it), ``mark_published(state, [w for w, _ in
   pairs])``; ``expire(state, clock)``. Sends first, table write last: a crash re-publishes
   (the same complete aggregates, harmless) instead of losing a publication. After a restart or
   a rebalance the recovered table publishes what was pending and expires what is due at its
   first tick — no window-close callback is involved.
3. Keep idle states (``is_idle``: no windows, a few hundred bytes) rather than deleting them:
   a deleted state forgets its clock, and a very late input would then re-create a window whose
   final record was already published, with a partial count. If they must be deleted (many
   short sessions), create replacements with ``new_state(subject, clock_ms=<the partition's
   clock>)``.
4. ``GET /v1/analytics/summary``: ``summarize(local states)`` on every worker (or one state
   per owned partition), ``merge_summaries`` of the answers.
"""

from .classify import (
    GRAPH_PREFIX,
    SESSION_PREFIX,
    SUBJECT_KINDS,
    UNKNOWN_SUBJECT,
    Increment,
    budget_cost_nanos,
    classify_compaction,
    classify_dead_letter,
    classify_graph_budget,
    classify_ledger_event,
    classify_outcome,
    classify_quarantine,
    classify_relay_event,
    dead_letter_subject,
    graph_subject,
    routing_key,
    session_subject,
    subject_kind,
    subject_owner,
    subject_partition,
    unknown_subject,
)
from .summary import merge_summaries, summarize, summarize_records
from .windows import (
    COUNTERS,
    DEFAULT_POLICY,
    EVENT_COUNTERS,
    HOUR,
    MINUTE,
    SIZES,
    TOO_EARLY,
    TOO_LATE,
    AddResult,
    Refused,
    WindowPolicy,
    add,
    add_increment,
    due,
    expire,
    is_expired,
    is_idle,
    mark_published,
    new_state,
    partition_clock,
    records_due,
    state_problem,
    to_record,
    window_bounds,
    window_identity,
    windows_of,
)

__all__ = [
    "GRAPH_PREFIX", "SESSION_PREFIX", "SUBJECT_KINDS", "UNKNOWN_SUBJECT", "Increment", "budget_cost_nanos",
    "classify_compaction", "classify_dead_letter", "classify_graph_budget", "classify_ledger_event",
    "classify_outcome", "classify_quarantine", "classify_relay_event", "dead_letter_subject", "graph_subject",
    "routing_key", "session_subject", "subject_kind", "subject_owner", "subject_partition", "unknown_subject",
    "merge_summaries", "summarize", "summarize_records",
    "COUNTERS", "DEFAULT_POLICY", "EVENT_COUNTERS", "HOUR", "MINUTE", "SIZES", "TOO_EARLY", "TOO_LATE",
    "AddResult", "Refused", "WindowPolicy", "add", "add_increment", "due", "expire", "is_expired", "is_idle",
    "mark_published", "new_state", "partition_clock", "records_due",
    "state_problem", "to_record", "window_bounds", "window_identity", "windows_of",
]
