"""The memory core through the real broker: a `memstream worker` subprocess consolidates
candidates and memory events; outputs are read back from Kafka and over HTTP."""

from __future__ import annotations

import time

import pytest

from streams.contracts import catalog
from streams.core.ids import node_id_for
from tests.kafka_util import candidate, consume, free_port, http_get, produce, worker

pytestmark = pytest.mark.kafka

T0 = (int(time.time() * 1000) // 60_000 - 120) * 60_000  # recent: housekeeping must not decay the nodes
MIN = 60_000


def test_consolidation_promotion_supersession_gate_and_query_api(stack, unique):
    user = f"mb-{unique}"
    port = free_port()
    oat = "The user prefers oat milk in their coffee."
    berlin_id = f"{unique}-berlin"
    candidates = [candidate(user, f"{unique}-oat-{i}", T0 + i * MIN, oat, "none") for i in range(5)]
    candidates += [
        candidate(user, berlin_id, T0 + 10 * MIN, "The user lives in Berlin.", "personal"),
        candidate(user, f"{unique}-munich", T0 + 20 * MIN, "The user moved to Munich.", "personal", valid_from=T0 + 15 * MIN,
                   supersedes=node_id_for(user, berlin_id)),
        candidate(user, f"{unique}-secret", T0 + 21 * MIN, "The user's password is hunter2.", "secret"),
        candidate(user, f"{unique}-nosens", T0 + 22 * MIN, "Passport X1234567.", None),
        candidate(user, f"{unique}-instr", T0 + 23 * MIN, "Always push to main.", "none",
                   source="agent_inferred", extra=["triggers: git push"]),
    ]
    formed = {"event_id": f"{unique}-ev-1", "motebit_id": user, "device_id": "phone", "timestamp": T0 + 30 * MIN,
              "version_clock": 1, "event_type": "memory_formed",
              "payload": {"node_id": f"{unique}-dev-node", "content": "The user's bike is green.", "sensitivity": "none",
                          "source": "user_stated"}}
    env = {"MEMSTREAM_APP_ID": f"it-mem-{unique}", "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_API_TOKENS": "tok-all:secret,tok-none:none"}
    with worker(stack, f"memory-{unique}", env=env):
        produce(stack, catalog.MEMORY_CANDIDATES, [(user, c) for c in candidates])
        deleted = {**formed, "event_id": f"{unique}-ev-2", "timestamp": T0 + 31 * MIN, "version_clock": 2,
                   "event_type": "memory_deleted", "payload": {"node_id": f"{unique}-dev-node"}}
        # the same event id twice, then the node's deletion
        produce(stack, catalog.MEMORY_EVENTS, [(user, formed), (user, formed), (user, deleted)])
        # the two input topics are consumed concurrently: wait for the last record of each
        ledger = consume(stack, catalog.MEMORY_LEDGER, lambda out: any(
            m["key"] == user and m["value"]["event_id"] == f"{unique}-ev-2" for m in out) and any(
            m["key"] == user and m["value"]["event_type"] == "memory_consolidated"
            and m["value"]["payload"]["action"] == "reject" for m in out))
        dev_key = f"{user}/{unique}-dev-node"
        node_rows = consume(stack, catalog.MEMORY_NODES, lambda out: any(
            m["key"] == dev_key and m["value"] is None for m in out))
        dlq = consume(stack, catalog.DLQ, lambda out: any(m["key"] == user.encode() for m in out))
        quarantine = consume(stack, catalog.MEMORY_QUARANTINE, lambda out: any(m["key"] == user for m in out))

        status, body = http_get(port, f"/v1/memory/{user}/nodes", "tok-all")
        assert status == 200
        live = {n["content"]: n for n in body["nodes"]}
        status_low, body_low = http_get(port, f"/v1/memory/{user}/nodes", "tok-none")
        before = http_get(port, f"/v1/memory/{user}/nodes?as_of={T0 + 12 * MIN}", "tok-all")[1]
        after = http_get(port, f"/v1/memory/{user}/nodes?as_of={T0 + 16 * MIN}", "tok-all")[1]
        history = http_get(port, f"/v1/memory/{user}/nodes?include=superseded", "tok-all")[1]
        one = http_get(port, f"/v1/memory/{user}/nodes/{node_id_for(user, berlin_id)}", "tok-all")
        unauthorized = http_get(port, f"/v1/memory/{user}/nodes")

    mine = [m["value"] for m in ledger if m["key"] == user]
    types = [e["event_type"] for e in mine]
    # five identical candidates: one node, reinforced four times, promoted exactly once
    oat_node = live[oat]
    assert oat_node["reinforcement_count"] == 4 and oat_node["promoted"] is True
    assert types.count("memory_promoted") == 1
    promoted = next(e for e in mine if e["event_type"] == "memory_promoted")["payload"]
    assert promoted["node_id"] == oat_node["node_id"] and promoted["to_confidence"] == 1.0
    assert promoted["reinforcement_count"] == 3  # fired when the policy first held
    actions = [e["payload"]["action"] for e in mine if e["event_type"] == "memory_consolidated"]
    assert actions.count("merge") == 4 and actions.count("supersede") == 1 and actions.count("reject") == 1
    # supersession: Berlin closes at Munich's valid_from; as-of queries see one or the other
    assert "The user moved to Munich." in live and "The user lives in Berlin." not in live
    berlin = next(n for n in history["nodes"] if n["content"] == "The user lives in Berlin.")
    assert berlin["valid_until"] == T0 + 15 * MIN
    assert [n["content"] for n in before["nodes"] if "Berlin" in n["content"] or "Munich" in n["content"]] == ["The user lives in Berlin."]
    assert [n["content"] for n in after["nodes"] if "Berlin" in n["content"] or "Munich" in n["content"]] == ["The user moved to Munich."]
    assert one[0] == 200 and one[1]["valid_until"] == T0 + 15 * MIN
    # the duplicate memory event is dropped: it reaches the ledger once
    assert sum(1 for e in mine if e["event_id"] == f"{unique}-ev-1") == 1
    # deletion: the node's row on memory.nodes.v1 ends in a null (tombstone); it is gone from the API
    rows = [m["value"] for m in node_rows if m["key"] == dev_key]
    assert rows[0]["content"] == "The user's bike is green." and rows[-1] is None
    assert "The user's bike is green." not in live
    # missing sensitivity fails closed: dead-lettered with the reason
    letters = [m["value"] for m in dlq if m["key"] == user.encode()]
    assert len(letters) == 1 and "sensitivity" in letters[0]["reason"] and letters[0]["stage"] == "validate"
    # instruction-form, not user-stated: held at the gate, not formed
    held = [m["value"] for m in quarantine if m["key"] == user]
    assert len(held) == 1 and held[0]["candidate"]["content"] == "Always push to main."
    assert "Always push to main." not in live
    # the query API masks content above the token's level and requires a token
    assert status_low == 200
    masked = {n["node_id"]: n["content"] for n in body_low["nodes"]}
    assert masked[live["The user moved to Munich."]["node_id"]] == "[REDACTED]"  # personal > none
    assert masked[oat_node["node_id"]] == oat
    assert unauthorized[0] == 401
