"""Erasure of one user (issue 15): the pure rule behind `memstream erase` and
``POST /v1/memory/{motebit_id}/erase``.

An erase request (``memory.erase-requests.v1``, key ``motebit_id``, schema ``EraseRequest``)
is applied by the memory agent that owns the user's partition, in order with the user's other
records. :func:`erase_step` takes the user's :class:`~streams.core.state.UserMemory` and
returns an :class:`Erasure`, everything the shell has to send and write:

* every node of the user, live or superseded, is erased (``UserMemory.erase_node``): a
  ``memory_deleted`` on the ledger (derived id: ``event_id_for(user, "<request_id>/<node_id>",
  "memory_deleted")``), which the relay turns into the node's deletion tombstone, and a null on
  ``memory.nodes.v1``; the node row leaves the state table (a changelog tombstone). Its id and
  content fingerprint stay recorded (side rows, no content), so the same content never forms a
  node again and a late ``memory_formed`` of the id never brings it back. The de-duplication
  window is left as it is (ids only): a replayed input stays a duplicate.
* at most ``ErasurePolicy.max_nodes_per_step`` nodes per step, so that one step's rows (and the
  redo log in the user's aux row) stay bounded whatever the user's size. When more remain, the
  outcome carries a *continuation*: the next step's request, with the tallies so far, which the
  shell sends to the request topic under the same key. The last step also
* forgets every negotiator memory (``negotiator.forget_all``: ids and fingerprints kept as
  forgotten, content dropped),
* asks for the relay-policy override to be removed, and the analytics rows (the shell deletes
  the ``analytics`` row and writes a tombstone on ``memory.analytics.v1``), and
* writes the receipt (``ErasureReceipt``): counts and ids, never content.

Each step is recorded in the de-duplication window as ``x:<request_id>/<step>``: a re-delivered
step (a crash after its outputs, a duplicate continuation) is a duplicate and does nothing. A
step re-processed because its rows were never written (a crash before the table writes) runs on
the same state and so yields the same events, the same continuation and the same receipt
(same ids, same counts): consumers see identical copies.

Records of the user that arrive while a multi-step erasure runs are applied in between, in
partition order; nodes they form are erased by the later steps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .ids import derive_id, event_id_for
from .ingest import Rejection
from .limits import DEFAULT_LIMITS, Limits, check_id, id_problem, quote
from .negotiator import forget_all
from .process import Outcome
from .state import UserMemory

RECEIPT_ROLE = "erasure_receipt"
SEEN_PREFIX = "x:"


@dataclass(frozen=True)
class ErasurePolicy:
    """Bounds of an erasure (settings ``MEMSTREAM_ERASE_MAX_NODES_PER_STEP`` and
    ``MEMSTREAM_ERASE_RECEIPT_MAX_IDS``)."""

    max_nodes_per_step: int = 1000
    max_receipt_ids: int = 1000


@dataclass
class Erasure:
    """What one erase step produced (see the module doc)."""

    outcome: Outcome = field(default_factory=Outcome)  #: memory_deleted events, node deletions
    continuation: dict[str, Any] | None = None  #: the next step's EraseRequest, when nodes remain
    receipt: dict[str, Any] | None = None  #: ErasureReceipt, on the last step
    #: the user's negotiator row after the last step (content-free), or None: leave it alone
    negotiator_state: dict[str, Any] | None = None
    remove_relay_policy: bool = False  #: the last step: remove the user's relay-threshold override
    erase_analytics: bool = False  #: the last step: delete the analytics row, tombstone the topic

    @property
    def duplicate(self) -> bool:
        return self.outcome.duplicate


def validate_erase_request(record: Any, limits: Limits = DEFAULT_LIMITS) -> Rejection | None:
    """None when the request can be applied, else why not (a dead letter)."""
    if not isinstance(record, Mapping):
        return Rejection("not_a_record", "erase request is not a record")
    for name in ("request_id", "motebit_id"):
        problem = id_problem(record.get(name), limits)
        if problem is not None:
            code, what = problem
            return Rejection(code, f"{name} {quote(record.get(name), 40)} {what}")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return Rejection("invalid_step", f"step {quote(step)} is not an integer >= 0")
    for name in ("timestamp", "nodes_erased"):
        value = record.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return Rejection(f"invalid_{name}", f"{name} {quote(value)} is not an integer >= 0")
    return None


def erase_request(motebit_id: str, request_id: str, timestamp: int, requested_by: str = "",
                  limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The EraseRequest record a caller sends (step 0), validated: raises
    :class:`~streams.core.limits.LimitExceeded` for an id that breaks the id rules."""
    record = {"request_id": request_id, "motebit_id": motebit_id, "timestamp": int(timestamp),
              "requested_by": requested_by, "step": 0, "nodes_erased": 0, "node_ids": [], "node_ids_digest": ""}
    check_id("motebit_id", motebit_id, limits)
    check_id("request_id", request_id, limits)
    return record


def digest_step(previous: str, node_ids: list[str]) -> str:
    """The receipt's digest chain: ``"sha256:" + hex(SHA-256(previous + "\\n" + ids joined by "\\n"))``."""
    text = previous + "\n" + "\n".join(node_ids)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def receipt_id_for(motebit_id: str, request_id: str) -> str:
    return derive_id(motebit_id, request_id, RECEIPT_ROLE)


def erase_step(
    memory: UserMemory,
    request: Mapping[str, Any],
    *,
    negotiator_state: Mapping[str, Any] | None = None,
    relay_override: Any = None,
    policy: ErasurePolicy = ErasurePolicy(),
    limits: Limits = DEFAULT_LIMITS,
) -> Erasure:
    """Apply one step of an erase request to ``memory`` (mutated in place, like
    :func:`~streams.core.process.process_event`). ``negotiator_state`` is the user's negotiator
    row, ``relay_override`` its relay-threshold override (None: none). The request must have
    passed :func:`validate_erase_request` and be the memory's user's."""
    user = memory.motebit_id
    if request["motebit_id"] != user:
        raise ValueError(f"erase request for {request['motebit_id']!r} given to the state of {user!r}")
    request_id, step, ts = str(request["request_id"]), int(request["step"]), int(request["timestamp"])
    seen_key = f"{SEEN_PREFIX}{request_id}/{step}"
    if seen_key in memory.seen:
        memory.seen.duplicates += 1
        return Erasure(outcome=Outcome(duplicate=True))
    memory.seen.add(seen_key, ts)

    out = Outcome()
    todo = sorted({*memory.live, *memory.closed})  # ids: a step reads only the history it erases
    per_step = max(1, policy.max_nodes_per_step)  # 0 would never finish
    batch, remaining = todo[:per_step], todo[per_step:]
    for node_id in batch:
        deletion = {"event_id": event_id_for(user, f"{request_id}/{node_id}", "memory_deleted"),
                    "motebit_id": user, "device_id": None, "timestamp": ts,
                    "version_clock": memory.next_clock(), "event_type": "memory_deleted",
                    "payload": {"node_id": node_id}}
        memory.erase_node(node_id)
        out.ledger.append(deletion)
        out.delete(node_id)

    erased = int(request.get("nodes_erased") or 0) + len(batch)
    listed = (list(request.get("node_ids") or []) + batch)[:max(0, policy.max_receipt_ids)]
    digest = digest_step(str(request.get("node_ids_digest") or ""), batch)
    if remaining:
        continuation = {"request_id": request_id, "motebit_id": user, "timestamp": ts,
                        "requested_by": str(request.get("requested_by") or ""), "step": step + 1,
                        "nodes_erased": erased, "node_ids": listed, "node_ids_digest": digest}
        return Erasure(outcome=out, continuation=continuation)

    negotiator, forgotten = forget_all(negotiator_state, user, now_ms=ts, limits=limits)
    receipt = {
        "receipt_id": receipt_id_for(user, request_id),
        "request_id": request_id,
        "motebit_id": user,
        "requested_at": ts,
        "requested_by": str(request.get("requested_by") or ""),
        "nodes_erased": erased,
        "node_ids": listed,
        "node_ids_omitted": erased - len(listed),
        "node_ids_digest": digest,
        "relay_tombstones": erased,  # redaction.relay_events: one tombstone per memory_deleted
        "negotiator_memories_erased": len(forgotten),
        "negotiator_memory_ids": forgotten,
        "relay_policy_removed": relay_override is not None,
        "fingerprints_kept": len(memory.deleted_fingerprints),
        "steps": step + 1,
    }
    return Erasure(outcome=out, receipt=receipt, negotiator_state=negotiator,
                   remove_relay_policy=relay_override is not None, erase_analytics=True)
