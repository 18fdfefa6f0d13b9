"""The relay-policy agent: the one writer of the `relay-policy` table (per-user relay thresholds).

A threshold changes at run time through an internal topic keyed by the user (so the table write
happens in an event of the user's partition, as Faust requires): `PUT /v1/relay/{id}/threshold`
(streams/api/memory.py) and an erasure's last step (the memory agent) send to it. Each change
is first written to `security.audit.v1`, then takes effect.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from streams.contracts import catalog
from streams.agents.memory_store import MemoryStore
from streams.runtime.topology import Processor

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.memory")

TOPIC = "relay-policy"  # the internal topic `<app_id>-relay-policy`
PROCESSOR = Processor(
    "relay-policy-agent", __name__,
    "The one writer of per-user relay thresholds: each change (PUT /v1/relay/{id}/threshold, or an "
    "erasure's removal) is audited first, then takes effect.",
    internal_sources=(TOPIC,),
    stores=("relay-policy",),
    sinks=(catalog.SECURITY_AUDIT,),
)


def threshold_change(value: bytes) -> dict:
    """A relay-policy topic value: `{"threshold", "token", "requested_at", "worker"}` (JSON), or
    the bare level an earlier version wrote (its token is unknown)."""
    if value.startswith(b"{"):
        change = orjson.loads(value)
        return {"threshold": change["threshold"], "token": str(change.get("token") or "unknown"),
                "requested_at": int(change.get("requested_at") or 0), "worker": str(change.get("worker") or "")}
    return {"threshold": value.decode(), "token": "unknown (earlier version)", "requested_at": 0, "worker": ""}



def register(rt: "Runtime", store: MemoryStore) -> Any:
    """Start the relay-policy agent; returns its topic (for the API and the erasure)."""
    app = rt.app
    # Per-user relay thresholds change at run time through an internal topic keyed by the user
    # (so the table write happens in an event of the user's partition, as Faust requires).
    policy_topic = rt.internal_topic(TOPIC)

    @app.agent(policy_topic, name="relay-policy-agent")
    async def relay_policy_agent(stream):
        async for event in stream.events():
            user = event.message.key.decode()
            if event.message.value.startswith(b"{") and "erase" in (removal := orjson.loads(event.message.value)):
                old = store.relay_policy.pop(user, None)  # a changelog tombstone
                store.relay_overrides.pop(user, None)
                log.warning("security audit: relay threshold override of %s (%s) removed by erasure %s",
                            user, old or "none", removal["erase"])
                continue
            change = threshold_change(event.message.value)
            level = change["threshold"]
            old = store.relay_policy.get(user)
            audit = {"audit_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"memstream:{user}:relay_threshold:"
                                                 f"{change['requested_at']}:{change['token']}")),
                     "motebit_id": user, "action": "relay_threshold", "token_name": change["token"],
                     "old_value": old, "new_value": level, "requested_at": change["requested_at"],
                     "applied_at": int(time.time() * 1000), "worker": change["worker"]}
            await rt.send(catalog.SECURITY_AUDIT, user, audit)  # before the change takes effect
            store.relay_policy[user] = level
            store.relay_overrides.pop(user, None)
            log.warning("security audit: relay threshold of %s changed %s -> %s by token %s (requested %d at %s)",
                        user, old or f"default ({rt.settings.relay_threshold})", level, change["token"],
                        change["requested_at"], change["worker"] or "?")
    return policy_topic
