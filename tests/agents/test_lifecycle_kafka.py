"""Memory lifecycle through the real broker: redaction relay, deletion tombstones, housekeeping,
the missed-memory audit and the negotiator tools (Kafka and HTTP)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from streams.contracts import catalog
from streams.core.ids import node_id_for
from tests.kafka_util import candidate, consume, free_port, http_get, produce, worker

pytestmark = pytest.mark.kafka

MIN = 60_000
DAY = 24 * 60 * MIN


def _http(method, port, path, token, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_relay_redacts_tombstones_and_never_forwards_audits_housekeeping_prunes(stack, unique):
    user = f"mb-life-{unique}"
    now = int(time.time() * 1000)
    t0 = now - 10 * MIN
    allergy, tea = f"{unique}-allergy", f"{unique}-tea"
    port = free_port()
    env = {"MEMSTREAM_APP_ID": f"it-life-{unique}", "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_API_TOKENS": "t:secret:negotiator", "MEMSTREAM_TIMER_INTERVAL_S": "1"}
    with worker(stack, f"life-{unique}", env=env):
        produce(stack, catalog.MEMORY_CANDIDATES, [
            (user, candidate(user, allergy, t0, "The user is allergic to penicillin.", "medical")),
            (user, candidate(user, tea, t0 + MIN, "The user drinks green tea every afternoon.", "none")),
            # two years old and personal: past the 365-day retention, housekeeping deletes it
            (user, candidate(user, f"{unique}-old", now - 730 * DAY, "The user lived in Lisbon.", "personal")),
        ])
        produce(stack, catalog.MEMORY_TURNS, [(user, {
            "turn_id": f"{unique}-turn", "motebit_id": user, "timestamp": t0 + 2 * MIN,
            "user_message": "I prefer window seats when I fly.", "agent_reply": "Noted.", "tagged_memories": []})])
        allergy_node = node_id_for(user, allergy)
        old_node = node_id_for(user, f"{unique}-old")
        # delete only once the node is formed (the two input topics are consumed concurrently)
        consume(stack, catalog.MEMORY_RELAY, lambda out: any(
            m["key"] == user and m["value"]["payload"].get("node_id") == allergy_node for m in out))
        produce(stack, catalog.MEMORY_EVENTS, [(user, {
            "event_id": f"{unique}-del", "motebit_id": user, "device_id": "phone", "timestamp": t0 + 3 * MIN,
            "version_clock": 9, "event_type": "memory_deleted", "payload": {"node_id": allergy_node}})])
        relay = consume(stack, catalog.MEMORY_RELAY, lambda out: any(  # the allergy's tombstone ...
            m["key"] == user and m["value"]["payload"].get("redacted_reason") == "deleted"
            and m["value"]["payload"].get("node_id") == allergy_node for m in out) and any(
            m["key"] == user and m["value"]["event_type"] == "memory_deleted"  # ... and housekeeping's
            and m["value"]["payload"].get("node_id") == old_node for m in out))
        node_rows = consume(stack, catalog.MEMORY_NODES, lambda out: all(
            any(m["key"] == f"{user}/{n}" and m["value"] is None for m in out) for n in (allergy_node, old_node)))
        ledger = consume(stack, catalog.MEMORY_LEDGER, lambda out: any(
            m["key"] == user and m["value"]["event_type"] == "memory_audit" for m in out) and any(
            m["key"] == user and m["value"]["event_type"] == "memory_deleted"
            and m["value"]["payload"]["node_id"] == old_node for m in out))
        # a remember / forget round trip over HTTP (the same Kafka path as any client)
        remembered = _http("POST", port, f"/v1/negotiator/{user}/remember", "t",
                           {"kind": "playbook", "content": "Open 15% above the asking price."})
        remembered2 = _http("POST", port, f"/v1/negotiator/{user}/remember", "t",
                            {"kind": "playbook", "content": "Open 10% below list price for furniture."})
        dossier = _http("POST", port, f"/v1/negotiator/{user}/remember", "t",
                        {"kind": "counterparty_dossier", "content": "They always fold."})
        ambiguous = _http("POST", port, f"/v1/negotiator/{user}/forget", "t", {"description": "open"})
        by_id = _http("POST", port, f"/v1/negotiator/{user}/forget", "t", {"memoryId": remembered[1]["id"]})
        nothing = _http("POST", port, f"/v1/negotiator/{user}/forget", "t", {"description": "lottery numbers"})
        replies = consume(stack, catalog.NEGOTIATOR_REPLIES, lambda out: sum(1 for m in out if m["key"] == user) >= 6)
        live = http_get(port, f"/v1/memory/{user}/nodes", "t")[1]["nodes"]

    peer = [m["value"] for m in relay if m["key"] == user]
    formed = {e["payload"]["node_id"]: e["payload"] for e in peer if e["event_type"] == "memory_formed"}
    tea_node = node_id_for(user, tea)
    assert formed[tea_node]["content"] == "The user drinks green tea every afternoon."  # none passes
    # the medical node's formation is redacted, its deletion is a tombstone; no content ever
    allergy_views = [e["payload"] for e in peer if e["event_type"] == "memory_formed"
                     and e["payload"]["node_id"] == allergy_node]
    # the tombstone keeps the relayed row's levels (as motebit's deletion propagation does)
    assert [(p["content"], p["redacted"], p["sensitivity"], p["redacted_sensitivity"], p["redacted_reason"])
            for p in allergy_views] == [
        ("[REDACTED]", True, "medical", "medical", None), ("[REDACTED]", True, "medical", "medical", "deleted")]
    assert not any("penicillin" in json.dumps(e) for e in peer)
    assert all(e["payload"].get("reason", "") == "" for e in peer if e["event_type"] == "memory_consolidated")
    assert not any(e["event_type"] == "memory_audit" for e in peer)
    # the audit is on the ledger, local-only
    audit = next(m["value"]["payload"] for m in ledger if m["key"] == user and m["value"]["event_type"] == "memory_audit")
    assert audit["missed_patterns"] == ['preference: "I prefer window seats when I fly."']
    assert audit["turn_message"] == "I prefer window seats when I fly."
    # the deleted and the expired nodes end as nulls on memory.nodes.v1 and are gone from the API
    for n in (allergy_node, old_node):
        assert [m["value"] for m in node_rows if m["key"] == f"{user}/{n}"][-1] is None
    assert {n["node_id"] for n in live} == {tea_node}
    hk = [e for e in ledger if e["key"] == user and e["value"]["event_type"] == "memory_deleted"
          and e["value"]["payload"]["node_id"] == old_node]
    assert hk, "housekeeping emitted memory_deleted for the expired node"
    # negotiator: the seed's exact result shapes
    assert remembered[0] == 200 and set(remembered[1]) == {"id", "kind", "content"}
    assert remembered[1]["kind"] == "playbook" and remembered2[0] == 200
    assert dossier[0] == 400
    assert ambiguous == (200, {"status": "ambiguous", "candidates": [remembered[1], remembered2[1]]})
    assert by_id == (200, {"status": "deleted", "memory": remembered[1]})
    assert nothing == (200, {"status": "not_found"})
    assert len([m for m in replies if m["key"] == user]) == 6


def test_relay_threshold_changes_at_run_time_and_write_flag_off(stack, unique):
    user = f"mb-thr-{unique}"
    now = int(time.time() * 1000)
    port = free_port()
    env = {"MEMSTREAM_APP_ID": f"it-thr-{unique}", "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_API_TOKENS": "t:none:admin+negotiator:name=privacy-officer,r:secret", "MEMSTREAM_NEGOTIATOR_WRITE_ENABLED": "false"}
    with worker(stack, f"thr-{unique}", env=env):
        produce(stack, catalog.MEMORY_CANDIDATES,
                [(user, candidate(user, f"{unique}-a", now, "The user's GP is Dr. Lee.", "medical"))])
        consume(stack, catalog.MEMORY_RELAY, lambda out: any(
            m["key"] == user and m["value"]["event_type"] == "memory_formed" for m in out))
        assert _http("PUT", port, f"/v1/relay/{user}/threshold", "t", {"threshold": "medical"})[0] == 202
        deadline = time.monotonic() + 30
        while _http("GET", port, f"/v1/relay/{user}/threshold", "t")[1].get("threshold") != "medical":
            assert time.monotonic() < deadline, "threshold change not applied"
            time.sleep(0.2)
        produce(stack, catalog.MEMORY_CANDIDATES,
                [(user, candidate(user, f"{unique}-b", now + MIN, "The user takes vitamin D in winter.", "medical"))])
        relay = consume(stack, catalog.MEMORY_RELAY, lambda out: sum(
            1 for m in out if m["key"] == user and m["value"]["event_type"] == "memory_formed") >= 2)
        off = _http("POST", port, f"/v1/negotiator/{user}/remember", "t", {"kind": "threshold", "content": "Accept 40k."})
        forget = _http("POST", port, f"/v1/negotiator/{user}/forget", "t", {"description": "anything"})
        bad = _http("PUT", port, f"/v1/relay/{user}/threshold", "t", {"threshold": "everything"})
        unscoped = _http("PUT", port, f"/v1/relay/{user}/threshold", "r", {"threshold": "secret"})
        audit = consume(stack, catalog.SECURITY_AUDIT, lambda out: any(m["key"] == user for m in out))
    contents = [m["value"]["payload"]["content"] for m in relay
                if m["key"] == user and m["value"]["event_type"] == "memory_formed"]
    assert contents == ["[REDACTED]", "The user takes vitamin D in winter."]  # before / after the change
    assert off == (200, None)  # write flag off: remember returns null
    assert forget == (200, {"status": "not_found"})  # forget always works
    assert bad[0] == 400
    assert unscoped[0] == 403  # reading every level is not changing what peers receive: `admin` scope
    # the change is on the security audit topic: token name (never the secret), old -> new
    [record] = [m["value"] for m in audit if m["key"] == user]
    assert (record["action"], record["token_name"], record["old_value"], record["new_value"]) == (
        "relay_threshold", "privacy-officer", None, "medical")
    assert record["requested_at"] > 0 and record["applied_at"] >= record["requested_at"]
