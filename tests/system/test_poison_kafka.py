"""Poison records on two workers (issue #12): hostile or merely large records never stop the
fleet, never take other users' records with them, and always reach the DLQ exactly once.

Mixed among 1,000 valid candidates of other users (two `memstream worker` processes, RocksDB):
- a candidate with a 200,000-float embedding (~800 KB, under the broker's limit);
- a backlog of 300 candidates of ~8 KB for one user, queued while the workers are down (one
  batch: the user's redo log must stay bounded, `MEMSTREAM_STATE_BATCH_MAX_BYTES`);
- colliding ids: records for `victim/x` next to records of the user `victim`;
- a value framed with the registry id of a schema that is not a record (`"string"`);
- a key/`motebit_id` mismatch whose id is 400 KB (the dead letter must still fit);
- two 600 KB negotiator `remember` calls over HTTP.

And a user whose stored rows cannot be rebuilt is contained (DLQ, 503, gauge), not the worker.

Expected: no worker exits; each poison record is on pipeline.dlq.v1 exactly once with a reason;
every valid record is applied and the final node state equals a reference run (one fresh worker
of another group) over the same input; the same after both workers restart (no crash loop).

And the one failure that is not a record's: when the broker refuses a table row (here: the
changelog's `max.message.bytes` lowered under the worker), the worker stops with exit status 70
*without* committing the batch, and a restart applies it.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from streams.contracts import catalog
from streams.contracts.wire import encode_key
from streams.tools import kafkatools
from tests.kafka_util import candidate, http_call, produce
from tests.system.test_faults_kafka import (
    INPUTS,
    OUTPUTS,
    TOKEN,
    _stop_every_worker,  # noqa: F401 - no worker outlives a test
    answers,
    begin,
    fleet_for,
    read_outputs,
    stream_of,
)

pytestmark = pytest.mark.kafka

BASE_TS = 1_767_225_600_000


def _post(port: int, path: str, body: bytes, timeout: float = 90) -> int:
    """POST as a client would: a 503 (partitions moving, Retry-After) is retried."""
    deadline = time.monotonic() + timeout
    while True:
        status = http_call(port, "POST", path, TOKEN, body)[0]
        if status != 503 or time.monotonic() > deadline:
            return status
        time.sleep(1)


def _poison(stack, unique: str) -> tuple[list[tuple[str, bytes | dict]], list[str]]:
    """(key, value) poison candidates, and the substrings their dead letters' reasons must hold."""
    registry = SchemaRegistryClient({"url": stack.registry_url})
    string_id = registry.register_schema(f"it-poison-{unique}-string-value", Schema('"string"', "AVRO"))
    string_framed = b"\x00" + string_id.to_bytes(4, "big") + b"\x0aHello"
    huge_id = "z" * 400_000
    items: list[tuple[str, bytes | dict]] = [
        (f"mb-poison-{unique}-emb", candidate(f"mb-poison-{unique}-emb", f"p-{unique}-emb", BASE_TS, "Big vector.",
                                             embedding=[0.5] * 200_000)),
        (f"victim-{unique}/x", candidate(f"victim-{unique}/x", f"p-{unique}-slash", BASE_TS, "I collide.")),
        (f"mb-poison-{unique}-str", string_framed),
        (f"mb-poison-{unique}-mismatch", candidate(huge_id, f"p-{unique}-mm", BASE_TS, "Mismatch.")),
    ]
    return items, ["embedding", "/", "not a record", "motebit_id"]


def test_poison_records_among_valid_ones_on_two_workers(stack, unique):
    victim = f"victim-{unique}"
    valid = stream_of(f"poison-{unique}", users=20, n=1000, seed=11)
    valid += [(victim, candidate(victim, f"v-{unique}-{i}", BASE_TS + i, f"Victim fact number {i}.")) for i in range(5)]
    backlog_user = f"mb-poison-{unique}-backlog"
    backlog = [(backlog_user, candidate(backlog_user, f"b-{unique}-{i}", BASE_TS + i,
                                        f"Backlog entry {i}: " + " ".join(f"w{i}x{j}" for j in range(1100))))
               for i in range(300)]
    poison, reasons = _poison(stack, unique)
    sc = begin(stack, f"poison-{unique}", valid)
    sc.users = sorted({u for u, _ in valid + backlog})
    fleet = fleet_for(sc, "fleet")

    # the backlog and the poison are queued before the workers start: one big first batch
    produce(stack, catalog.MEMORY_CANDIDATES, backlog + poison[:2])
    produce(stack, catalog.MEMORY_CANDIDATES, valid[:500] + poison[2:] + valid[500:])
    fleet.start("a")
    fleet.start("b")
    for _ in range(2):  # two 600 KB negotiator remembers over HTTP: refused, nobody exits
        status = _post(fleet.ports["a"], f"/v1/negotiator/mb-poison-{unique}-neg/remember",
                       json.dumps({"kind": "fact", "content": "n" * 600_000}).encode())
        assert 400 <= status < 500, status
    sc.inputs_end = kafkatools.end_offsets(stack, INPUTS)
    fleet.wait_caught_up(sc.inputs_end)
    fleet.alive()
    time.sleep(1)
    fleet_answers = answers(fleet.ports["b"], [victim, backlog_user])
    # no crash loop: both restart and stay up, reading nothing new
    fleet.stop_all()
    fleet.start("a")
    fleet.start("b")
    time.sleep(5)
    fleet.alive()
    fleet.stop_all()
    middle = kafkatools.end_offsets(stack, OUTPUTS)
    got = read_outputs(stack, sc.outputs_start, middle)

    # every poison record on the DLQ exactly once, with its reason; nothing else of ours there
    # (delivery is at-least-once with deterministic outputs: a batch replayed after a rebalance
    # dead-letters its poison record again, as an identical copy with the same origin)
    why_of = {encode_key(k): why for (k, _), why in zip(poison, reasons, strict=True)}
    ours = [d for d in got.dead_letters if d["original_key"] in why_of]
    by_origin: dict[tuple, list[dict]] = {}
    for d in ours:
        by_origin.setdefault((d["original_topic"], d["original_partition"], d["original_offset"]), []).append(d)
    assert sorted(copies[0]["original_key"] for copies in by_origin.values()) == sorted(why_of), \
        [d["reason"][:120] for d in ours]
    for copies in by_origin.values():
        first = copies[0]
        assert why_of[first["original_key"]] in first["reason"], (why_of[first["original_key"]], first["reason"][:300])
        assert all({**c, "failed_at": 0, "worker": None} == {**first, "failed_at": 0, "worker": None} for c in copies)
    print(f"poison: {len(by_origin)} records dead-lettered, {len(ours) - len(by_origin)} repeated copies (replays)")
    assert all(len(d["reason"]) <= stack.dlq_max_reason_chars for d in got.dead_letters)
    negotiator_letters = [d for d in got.dead_letters if d["original_topic"] == catalog.NEGOTIATOR_REQUESTS]
    assert all(d["original_value"] is None or len(d["original_value"]) <= stack.dlq_max_copy_bytes
               for d in negotiator_letters)
    assert len(got.dead_letters) == len(ours) + len(negotiator_letters), "a valid record was dead-lettered"

    # the victim and the backlog user were served, and every valid record was applied
    assert fleet_answers[victim][0] == 200 and len(fleet_answers[victim][1]["nodes"]) == 5
    assert fleet_answers[backlog_user][0] == 200 and len(fleet_answers[backlog_user][1]["nodes"]) == 300

    ref = fleet_for(sc, "reference")
    ref.start("only")
    ref.wait_caught_up(sc.inputs_end)
    ref.stop_all()
    want = read_outputs(stack, middle, kafkatools.end_offsets(stack, OUTPUTS))
    assert want.nodes and got.nodes == want.nodes, f"{len(set(got.nodes) ^ set(want.nodes))} node keys differ"
    assert got.events.keys() == want.events.keys()


def test_a_refused_table_write_stops_the_worker_without_committing_its_batch(stack, unique):
    user = f"mb-refused-{unique}"
    sc = begin(stack, f"refused-{unique}", [(user, {})])
    fleet = fleet_for(sc, "fleet")
    fleet.start("a")
    changelog = f"{fleet.app_id}-memory-state-changelog"
    admin = AdminClient({"bootstrap.servers": stack.broker})
    _set_config(admin, changelog, {"max.message.bytes": "2000"})
    rows = [(user, candidate(user, f"r-{unique}-{i}", BASE_TS + i, f"Row {i} " + "long text " * 400)) for i in range(3)]
    produce(stack, catalog.MEMORY_CANDIDATES, rows)
    log = fleet.log_path("a")
    assert fleet.reap("a") == 70, "the worker did not stop with status 70 on a refused table write"
    assert "stopping the worker without committing" in log.read_text()
    ends = kafkatools.end_offsets(stack, INPUTS)
    assert kafkatools.group_lag(stack, fleet.app_id, ends) == len(rows), "the unapplied batch was committed"

    _set_config(admin, changelog, {"max.message.bytes": "1048588"})
    fleet.start("a")
    fleet.wait_caught_up(ends)
    status, body = answers(fleet.ports["a"], [user])[user]
    assert status == 200 and len(body["nodes"]) == len(rows)
    fleet.stop_all()


def _set_config(admin: AdminClient, topic: str, config: dict[str, str]) -> None:
    """Change only these settings of the topic (a plain alter would reset its cleanup policy)."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()]
    resource = ConfigResource("topic", topic, incremental_configs=entries)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.incremental_alter_configs([resource])[resource].result(30)
            return
        except Exception:  # noqa: BLE001 - the changelog may not exist yet right after start
            assert time.monotonic() < deadline, f"could not configure {topic}"
            time.sleep(1)


def test_a_user_whose_rows_cannot_be_rebuilt_is_contained_and_everybody_else_served(stack, unique):
    """A node row the core cannot read (written into the changelog by hand, as a bug or an
    older version might have) makes that one user unavailable — its records dead-lettered with
    the reason, its queries 503 with Retry-After, the gauge at 1 — while other users are served.
    A history row that is not a node (`<user>/~h/<node_id>`, read only when asked for) contains
    its user when a query or a sweep reads it: 503, not an error, and the gauge counts it too."""
    broken, fine, garbled = f"mb-broken-{unique}", f"mb-fine-{unique}", f"mb-garbled-{unique}"
    sc = begin(stack, f"contain-{unique}", [(broken, {}), (fine, {})])
    fleet = fleet_for(sc, "fleet")
    changelog, analytics = f"{fleet.app_id}-memory-state-changelog", f"{fleet.app_id}-analytics-changelog"
    admin = AdminClient({"bootstrap.servers": stack.broker})
    for done in admin.create_topics([NewTopic(t, stack.partitions, 1, config={"cleanup.policy": "compact"})
                                     for t in (changelog, analytics)]).values():
        done.result(30)
    p = Producer({"bootstrap.servers": stack.broker, "partitioner": "murmur2_random"})
    p.produce(changelog, key=f"{broken}/n-1".encode(), value=json.dumps({"motebit_id": broken, "node_id": "n-1"}).encode())
    p.produce(changelog, key=f"{garbled}/~h/n-0".encode(), value=json.dumps([1, 2]).encode())
    # analytics rows a worker cannot count into: one not a state (fine's), one not even JSON (broken's,
    # whose dead letters feed it)
    p.produce(analytics, key=fine.encode(), value=json.dumps({"subject": fine, "windows": [1, 2]}).encode())
    p.produce(analytics, key=broken.encode(), value=b"\xff{not json")
    assert p.flush(30) == 0
    fleet.start("a")
    produce(stack, catalog.MEMORY_CANDIDATES, [
        (broken, candidate(broken, f"c-{unique}-1", BASE_TS, "A fact of the broken user.")),
        (fine, candidate(fine, f"c-{unique}-2", BASE_TS, "A fact of the fine user.")),
    ])
    ends = kafkatools.end_offsets(stack, INPUTS)
    fleet.wait_caught_up(ends)
    port = fleet.ports["a"]
    status, body = answers(port, [fine])[fine]
    assert status == 200 and [n["content"] for n in body["nodes"]] == ["A fact of the fine user."]
    got = _get_with_headers(port, f"/v1/memory/{broken}/nodes")
    assert got[0] == 503 and got[1].get("Retry-After") and "cannot be rebuilt" in got[2]
    # contained by the first read of its history: a sweep's (every timer interval) or these queries'
    for path in (f"/v1/memory/{garbled}/nodes?include=superseded", f"/v1/memory/{garbled}/nodes/n-0"):
        got = _get_with_headers(port, path)
        assert got[0] == 503 and "n-0" in got[2] and "not a node of this user" in got[2], (path, got)
    metrics = http_call(port, "GET", "/metrics", timeout=15)[2].decode()
    assert "memstream_memory_users_contained 2" in metrics
    # the analytics rows: both subjects contained (their increments refused), the worker alive
    got = _get_with_headers(port, f"/v1/analytics/{fine}")
    assert got[0] == 503 and "cannot be read" in got[2] and "no 'clock'" in got[2], got
    status, _h, raw = http_call(port, "GET", "/v1/analytics/summary?window=1m", TOKEN, timeout=15)
    assert status == 200 and json.loads(raw)["contained"] == 2, raw
    metrics = http_call(port, "GET", "/metrics", timeout=15)[2].decode()
    assert "memstream_analytics_subjects_contained 2" in metrics
    assert 'memstream_analytics_refused_total{label="contained"}' in metrics
    fleet.alive()
    fleet.stop_all()
    letters = read_outputs(stack, sc.outputs_start, kafkatools.end_offsets(stack, OUTPUTS)).dead_letters
    assert [(d["original_key"], d["error_class"]) for d in letters] == [(broken.encode(), "memory.user_contained")]
    assert "cannot be rebuilt" in letters[0]["reason"] and letters[0]["original_value"]  # kept for a replay


def _get_with_headers(port: int, path: str) -> tuple[int, dict, str]:
    status, headers, raw = http_call(port, "GET", path, TOKEN, timeout=15)
    return status, headers, raw.decode()
