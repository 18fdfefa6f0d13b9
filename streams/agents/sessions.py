"""session.events.v1 → session.compactions.v1: the per-session compaction ledger (SPEC §4.8;
rules in streams/sessions/lifecycle.py).

State lives in the `session-ledger` table keyed by the message key (the session id, so the
table's changelog partition is the source partition). For each event:

- the event goes through `lifecycle.step` against the state of the session its *key* names (a new
  session starts from `lifecycle.new_state(key)`). An event whose `sessionId` differs from its key
  is therefore caught by the lifecycle itself (rule `event.session_mismatch`): it is dead-lettered
  with that rule id and counted in the session's `violationCount`, exactly as
  `lifecycle.replay` of the session's events counts it, and it changes nothing else;
- a key (session id) against the id rules (streams/core/limits.py) is dead-lettered before the
  table is read;
- every violation `step` reports becomes one dead letter (stage `apply`, or `validate` for a
  session mismatch or an event over an input limit, `event.over_limit`; `error_class` = the rule id, `reason` = "rule: message"). A violation never
  stops the ledger: the new state is kept and the session continues;
- a redelivered event (`seq <= lastSeq` with the fingerprint the state remembers for that seq:
  `step` returns the same state object) is counted as a duplicate and produces nothing; an old
  seq with *different* content (`session.seq_reused`), a late seq never applied
  (`session.seq_out_of_order`) or one older than the remembered window
  (`session.seq_unverifiable`) is a violation like any other: dead-lettered, never dropped;
- otherwise the new ledger record is published to `session.compactions.v1` (key = session id)
  when it differs from the previous one, and the state is written to the table.

Outputs (ledger record, dead letters) are acknowledged by the broker *before* the table write
(streams/runtime/checkpoint.py: the agent runs in batches, and the handler sends and stages through
the batch's checkpoint `cp`), so a crash part-way re-processes the event
rather than finding it already in the table with its outputs missing. Re-processing is
deterministic (same state, same outputs), so the effect is at-least-once delivery of identical
records — the compacted ledger topic converges.

The HTTP view of the ledger is in streams/api/sessions.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streams.analytics import classify_compaction
from streams.contracts import catalog, deadletter
from streams.core.limits import id_problem
from streams.runtime import checkpoint
from streams.runtime.handlers import Rejected
from streams.runtime.topology import Processor
from streams.sessions import lifecycle

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

TABLE = "session-ledger"
PROCESSOR = Processor(
    "session-ledger-agent", __name__,
    "The per-session compaction ledger (docs/memory-rules.md): every rule violation a dead letter, the ledger "
    "republished when it changes.",
    sources=(catalog.SESSION_EVENTS,),
    stores=(TABLE,),
    sinks=(catalog.SESSION_COMPACTIONS, catalog.DLQ),
    feeds=("analytics",),
)
SESSION_MISMATCH = "event.session_mismatch"
VALIDATE_RULES = (SESSION_MISMATCH, "event.over_limit")


def register(rt: Runtime) -> None:
    table = rt.table(TABLE)
    limits = rt.settings.limits()

    async def handle(cp: checkpoint.Checkpoint, event, key: str, record: dict) -> None:
        if (problem := id_problem(key, limits)) is not None:  # the key is the table key: never stored
            code, what = problem
            raise Rejected(f"{code}: key {what}", code)
        old = cp.read(table, key)
        base = old if old is not None else lifecycle.new_state(key)
        new, violations = lifecycle.step(base, record, limits)
        if new is base and not violations:
            rt.count(f"duplicate:{catalog.SESSION_EVENTS}")
            return
        for v in violations:
            stage = deadletter.STAGE_VALIDATE if v.rule in VALIDATE_RULES else deadletter.STAGE_APPLY
            await cp.dead_letter(stage=stage, reason=str(v), error_class=v.rule)
            rt.count(f"violation:{v.rule}")
        if old is None or new["record"] != old["record"]:
            await cp.send(catalog.SESSION_COMPACTIONS, key, lifecycle.to_record(new))
            rt.feed_analytics(cp, classify_compaction(old, new, record["ts"]))
        cp.write(table, key, new)

    rt.stateful_agent(rt.inputs[catalog.SESSION_EVENTS], "session-ledger-agent", handle)
