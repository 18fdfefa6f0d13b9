"""The relay view (SPEC §2 ``memory.relay.v1``, §4.4, seed memory-events): what a sync peer
may see of the ledger.

:func:`relay_events` maps ONE ledger event to the list of relay events (0, 1 or 2). It is
pure: the shell passes, per user, the deleted node ids and content fingerprints its state
remembers (``UserMemory``: a ``memory_deleted`` or a deletion tombstone adds the node id, see
:func:`streams.core.process.process_event`) and the consented threshold (:func:`threshold_for`
over a table fed by a policy topic).

Rules, per ``event_type``:

``memory_formed``
    * node id deleted (or content fingerprint deleted) → the deletion tombstone of the node
      (:func:`tombstone_for`) instead: never content of a deleted node;
    * already a deletion tombstone (``redacted_reason == "deleted"``) → forwarded as a
      tombstone (content forced to the sentinel, whatever it held);
    * sensitivity missing or outside the vocabulary → redacted, fail closed: content
      ``"[REDACTED]"``, ``redacted: True``, ``sensitivity`` and ``redacted_sensitivity``
      ``"secret"`` (what the schema reads an unknown level as);
    * sensitivity above the user's threshold → content ``"[REDACTED]"``, ``redacted: True``,
      ``redacted_sensitivity: <original>`` (``sensitivity`` keeps the original: the seed's
      relay only swaps content and flips the flag);
    * an input already marked ``redacted`` → content forced to the sentinel;
    * otherwise forwarded with its content (``redacted*`` fields cleared).
``memory_deleted``
    forwarded (node id only) **followed by** the deletion tombstone of the node, so a peer
    that materializes from ``memory_formed`` events also erases the node and records that it
    must never re-form it. The shell adds the node id to the user's deleted set.
``memory_consolidated`` / ``memory_promoted``
    forwarded with the free-text ``reason`` blanked (``""``): deciders may quote content in it.
``memory_accessed`` / ``memory_pinned`` / ``memory_decayed``
    forwarded (ids and flags only).
``memory_audit``
    never forwarded (local-only: it quotes the raw user turn).
anything else (unknown ``event_type``)
    dropped (fail closed).

A deletion tombstone is the deleted row as the peer holds it with the deletion rewrite applied:
content ``"[REDACTED]"``, ``redacted: True``, ``redacted_reason: "deleted"``, and the row's own
``sensitivity`` and ``redacted_sensitivity`` kept (the reference rewrites the stored
``memory_formed`` in place: motebit packages/event-log/src/index.ts ``redactMemoryContent``,
services/relay/src/deletion-propagation.ts). "The row" is this view of the node's
``memory_formed`` (so ``redacted_sensitivity`` is set when the relay had redacted it). For a
``memory_deleted`` the shell passes the deleted node's sensitivity (``deleted_rows``); when it is
unknown the tombstone says ``secret`` / null (fail closed: a ``memory_formed`` must carry one).

Every forwarded payload is rebuilt with exactly its schema record's fields, so an extra key
smuggled into a payload dict never reaches the relay. Inputs are never mutated.

Thresholds: a level L passes with content iff ``rank(L) <= rank(threshold)``; the default
threshold ``personal`` lets ``none`` and ``personal`` through. An override that is not a
SensitivityLevel is ignored in favour of the most restrictive level, ``none`` (fail closed).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from .ids import derive_id
from .ingest import REDACTED_CONTENT
from .nodes import content_fingerprint
from .vocabulary import is_sensitivity, sensitivity_rank

DEFAULT_THRESHOLD = "personal"
#: Most restrictive threshold: used when a configured value is not a SensitivityLevel.
FAIL_CLOSED_THRESHOLD = "none"
#: Event types that never leave the local ledger.
LOCAL_ONLY_EVENT_TYPES: frozenset[str] = frozenset({"memory_audit"})
#: Role of the deterministic tombstone id: ``derive_id(user, node_id, TOMBSTONE_ROLE)``.
TOMBSTONE_ROLE = "deletion_tombstone"
DELETED_REASON = "deleted"

_ENVELOPE = ("event_id", "motebit_id", "device_id", "timestamp", "version_clock", "event_type")


# --------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------


def normalize_threshold(value: Any, fallback: str = FAIL_CLOSED_THRESHOLD) -> str:
    """``value`` when it is a SensitivityLevel, else ``fallback`` (default: ``none``)."""
    return value if is_sensitivity(value) else (fallback if is_sensitivity(fallback) else FAIL_CLOSED_THRESHOLD)


def threshold_for(user: str, overrides: Mapping[str, Any] | None, default: str = DEFAULT_THRESHOLD) -> str:
    """The consented threshold of ``user``: its override when the table has one, else
    ``default``. An invalid override (or default) reads as ``none`` — fail closed, never
    as "let everything through"."""
    # `is not None`, not truthiness: the shell passes a Faust table, whose len() walks every key
    if overrides is not None and user in overrides:
        return normalize_threshold(overrides[user])
    return normalize_threshold(default)



def passes(sensitivity: Any, threshold: str) -> bool:
    """Content of ``sensitivity`` may be relayed under ``threshold``; False for a missing
    or unknown sensitivity (fail closed)."""
    if not is_sensitivity(sensitivity):
        return False
    return sensitivity_rank(sensitivity) <= sensitivity_rank(normalize_threshold(threshold))


# --------------------------------------------------------------------------------------------
# Tombstones
# --------------------------------------------------------------------------------------------


def tombstone_id(user: str, node_id: str) -> str:
    """One id per deleted node (a node is deleted at most once), so the tombstone emitted
    with the ``memory_deleted`` and one substituted for a late ``memory_formed`` of the same
    node share it and peers de-duplicate them."""
    return derive_id(user, node_id, TOMBSTONE_ROLE)


def tombstone_for(node_id: str, user: str, source_event: Mapping[str, Any],
                  row: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The deletion tombstone of ``node_id``: a ``memory_formed``-shaped event with content
    ``"[REDACTED]"``, ``redacted: True``, ``redacted_reason: "deleted"``.
    ``sensitivity`` and ``redacted_sensitivity`` are the deleted ``row``'s (its relay payload);
    without a row (or one whose sensitivity is not a level) ``sensitivity`` is ``"secret"`` (the
    payload must carry one — receivers reject a ``memory_formed`` without it) and
    ``redacted_sensitivity`` null. Timestamp, version_clock and device come from
    ``source_event`` (the deletion or the formed event it replaces)."""
    sensitivity, redacted_sensitivity = "secret", None
    if row is not None and is_sensitivity(row.get("sensitivity")):
        sensitivity = row["sensitivity"]
        kept = row.get("redacted_sensitivity")
        redacted_sensitivity = kept if is_sensitivity(kept) else None
    return {
        "event_id": tombstone_id(user, node_id),
        "motebit_id": user,
        "device_id": source_event.get("device_id"),
        "timestamp": int(source_event["timestamp"]),
        "version_clock": int(source_event.get("version_clock") or 0),
        "event_type": "memory_formed",
        "payload": {
            "node_id": node_id,
            "content": REDACTED_CONTENT,
            "sensitivity": sensitivity,
            "source": None,
            "redacted": True,
            "redacted_sensitivity": redacted_sensitivity,
            "redacted_reason": DELETED_REASON,
            "valid_from": None,
            "valid_until": None,
        },
    }


# --------------------------------------------------------------------------------------------
# The view
# --------------------------------------------------------------------------------------------


def _envelope(event: Mapping[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    out = {k: event.get(k) for k in _ENVELOPE}
    out["payload"] = payload
    if "caused_by" in event:  # the input reference rides along (an id, never content)
        out["caused_by"] = event["caused_by"]
    return out


def _formed(
    event: Mapping[str, Any],
    threshold: str,
    deleted_node_ids: Collection[str],
    deleted_fingerprints: Collection[str],
) -> dict[str, Any]:
    p = event.get("payload") or {}
    node_id = p.get("node_id")
    payload = _formed_payload(p, threshold)
    content = p.get("content")
    if (
        p.get("redacted_reason") == DELETED_REASON
        or node_id in deleted_node_ids
        or (deleted_fingerprints and isinstance(content, str) and content_fingerprint(content) in deleted_fingerprints)
    ):
        return tombstone_for(node_id, event.get("motebit_id"), event, payload)
    return _envelope(event, payload)


def _formed_payload(p: Mapping[str, Any], threshold: str) -> dict[str, Any]:
    """The relay payload of a ``memory_formed`` payload ``p`` (no deletion considered)."""
    node_id = p.get("node_id")
    content = p.get("content")
    sensitivity = p.get("sensitivity")
    payload = {
        "node_id": node_id,
        "content": content,
        "sensitivity": sensitivity,
        "source": p.get("source"),
        "redacted": None,
        "redacted_sensitivity": None,
        "redacted_reason": None,
        "valid_from": p.get("valid_from"),
        "valid_until": p.get("valid_until"),
    }
    if not is_sensitivity(sensitivity):
        payload.update(content=REDACTED_CONTENT, sensitivity="secret", redacted=True, redacted_sensitivity="secret")
    elif not passes(sensitivity, threshold):
        payload.update(content=REDACTED_CONTENT, redacted=True, redacted_sensitivity=sensitivity)
    elif p.get("redacted") or not isinstance(content, str):
        # a copy someone already redacted: keep it redacted, never trust what ``content`` holds
        orig = p.get("redacted_sensitivity")
        payload.update(
            content=REDACTED_CONTENT,
            redacted=True,
            redacted_sensitivity=orig if is_sensitivity(orig) else sensitivity,
        )
    return payload


def relay_events(
    event: Mapping[str, Any],
    threshold: str = DEFAULT_THRESHOLD,
    deleted_node_ids: Collection[str] = (),
    *,
    deleted_fingerprints: Collection[str] = (),
    local_only: Collection[str] = LOCAL_ONLY_EVENT_TYPES,
    deleted_rows: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The relay events for one ledger event (see the module doc): ``[]`` (dropped), one
    event, or — for ``memory_deleted`` — the deletion followed by the node's tombstone.
    ``threshold`` is the user's consented SensitivityLevel (:func:`threshold_for`);
    ``deleted_rows`` maps a node id just deleted to its row (``sensitivity``, no content:
    :attr:`streams.core.process.Outcome.deleted_rows`), whose levels the tombstone keeps."""
    et = event.get("event_type")
    if et in LOCAL_ONLY_EVENT_TYPES or et in local_only:
        return []
    p = event.get("payload") or {}
    if et == "memory_formed":
        return [_formed(event, threshold, deleted_node_ids, deleted_fingerprints)]
    if et == "memory_deleted":
        node_id = p.get("node_id")
        deletion = _envelope(event, {"node_id": node_id})
        row = (deleted_rows or {}).get(node_id)
        # the row the peer holds: the node's memory_formed as this view relayed it
        kept = _formed_payload({"node_id": node_id, "content": REDACTED_CONTENT, **row}, threshold) if row else None
        return [deletion, tombstone_for(node_id, event.get("motebit_id"), event, kept)]
    if et == "memory_accessed":
        return [_envelope(event, {"node_id": p.get("node_id")})]
    if et == "memory_pinned":
        return [_envelope(event, {"node_id": p.get("node_id"), "pinned": bool(p.get("pinned"))})]
    if et == "memory_consolidated":
        return [
            _envelope(
                event,
                {
                    "action": p.get("action"),
                    "existing_node_id": p.get("existing_node_id"),
                    "new_node_id": p.get("new_node_id"),
                    "reason": "",
                    "superseded_valid_until": p.get("superseded_valid_until"),
                },
            )
        ]
    if et == "memory_promoted":
        return [
            _envelope(
                event,
                {
                    "node_id": p.get("node_id"),
                    "from_confidence": p.get("from_confidence"),
                    "to_confidence": p.get("to_confidence"),
                    "reinforcement_count": p.get("reinforcement_count"),
                    "reason": "",
                },
            )
        ]
    if et == "memory_decayed":
        return [_envelope(event, {})]
    return []  # unknown event type: fail closed
