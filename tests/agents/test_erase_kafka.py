"""Erasing a user through the real broker (issue 15), and records on the wrong partition.

Erasure: a user with nodes, negotiator memories and a relay-threshold override is erased over
HTTP (`POST /v1/memory/{motebit_id}/erase`); the erasure runs in steps of one node (so it
takes many batches) and the worker is SIGKILLed in the middle of it. After the restart the
erasure completes once (one receipt, repeated only as identical copies) and nothing of the
user's content is left in the latest values of `memory.nodes.v1` or of any changelog; another
user is untouched; the same inputs sent again form nothing.

Wrong partition: a producer with librdkafka's default partitioner (`consistent_random`, CRC32)
puts a user's records on other partitions than murmur2's; with two workers, every such record
is dead-lettered `wrong_partition` naming murmur2 and the expected partition, no row of the user
lands in any changelog partition, and `memstream dlq replay` (murmur2) then applies them.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import zlib

import pytest
from confluent_kafka import Producer as RdProducer

from bench.fleet import read_range
from streams.contracts import catalog
from streams.contracts.wire import encode_key
from streams.core.partitioning import partition_for
from streams.tools import kafkatools
from tests.agents.test_lifecycle_kafka import _http
from tests.conftest import TEST_ENV, memstream
from tests.kafka_util import candidate, codecs, consume, free_port, produce, worker
from tests.system.test_faults_kafka import (
    INPUTS,
    TOKEN,
    _stop_every_worker,  # noqa: F401 - no worker outlives a test
    answers,
    begin,
    fleet_for,
)

pytestmark = pytest.mark.kafka

BASE_TS = 1_767_225_600_000
WORDS = ("amber basil cedar delta ember fjord garnet harbor indigo juniper kelp lagoon marble nectar "
         "orchid pepper quartz raven saffron tundra umber velvet walnut yarrow zephyr").split()


def facts(tag: str, n: int, seed: int) -> list[str]:
    """n sentences that share no words (each forms its own node), each with a unique marker."""
    rng = random.Random(seed)
    return [f"canary-{tag}-{i} " + " ".join(rng.sample(WORDS, 5)) + f" {i * 7919}" for i in range(n)]


def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """An HTTP call as a client makes it: a 503 (partitions moving) or no answer is retried."""
    deadline = time.monotonic() + 90
    while True:
        try:
            status, answer = _http(method, port, path, TOKEN, body)
            if status != 503 or time.monotonic() > deadline:
                return status, answer
        except (urllib.error.URLError, ConnectionError, ValueError):
            assert time.monotonic() < deadline, f"{method} {path}: no answer"
        time.sleep(1)


def latest(settings, topic: str, start: dict | None = None) -> dict[bytes, bytes | None]:
    """The last value per key of `topic` (from `start`, default the beginning) up to its end now."""
    out: dict[bytes, bytes | None] = {}
    for msg in read_range(settings, topic, start or {}, kafkatools.end_offsets(settings, [topic])):
        out[msg.key()] = msg.value()
    return out


def records_of(settings, topic: str, start: dict, user: str) -> list[dict | None]:
    codec = codecs(settings).codec(catalog.topic(topic).value_schema)
    return [None if m.value() is None else codec.decode(m.value())
            for m in read_range(settings, topic, start, kafkatools.end_offsets(settings, [topic]))
            if m.key() == encode_key(user)]


def test_erase_a_user_with_a_worker_killed_in_the_middle(stack, unique):
    victim, bystander = f"mb-erase-{unique}", f"mb-keep-{unique}"
    texts = facts(unique, 30, seed=3)
    kept = facts(f"keep-{unique}", 3, seed=4)
    items = [(victim, candidate(victim, f"e-{unique}-{i}", BASE_TS + i, t, ["none", "personal", "medical"][i % 3]))
             for i, t in enumerate(texts)]
    items += [(bystander, candidate(bystander, f"k-{unique}-{i}", BASE_TS + i, t)) for i, t in enumerate(kept)]
    rules = ["Never reveal my walk-away price of 9137", "Open the bid at 12011"]
    negotiator = [(victim, {"request_id": f"n-{unique}-{i}", "user_id": victim, "op": "remember", "kind": "threshold",
                            "content": c, "sessionId": None, "memoryId": None, "description": None,
                            "timestamp": BASE_TS + 100 + i}) for i, c in enumerate(rules)]
    sc = begin(stack, f"erase-{unique}", items)
    outputs = [catalog.MEMORY_NODES, catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.ERASE_RECEIPTS,
               catalog.MEMORY_ANALYTICS, catalog.DLQ]
    out_start = kafkatools.end_offsets(stack, outputs)
    # one node per step and a long batch wait: the erasure spans many batches, so the kill lands in it
    fleet = fleet_for(sc, "fleet", MEMSTREAM_ERASE_MAX_NODES_PER_STEP="1", MEMSTREAM_BATCH_WAIT_MS="600",
                      MEMSTREAM_STANDBY_REPLICAS="0")
    produce(stack, catalog.MEMORY_CANDIDATES, items)
    produce(stack, catalog.NEGOTIATOR_REQUESTS, negotiator)
    fleet.start("a")
    fleet.wait_caught_up(kafkatools.end_offsets(stack, INPUTS))
    port = fleet.ports["a"]
    assert request(port, "PUT", f"/v1/relay/{victim}/threshold", {"threshold": "secret"})[0] == 202
    deadline = time.monotonic() + 60
    while request(port, "GET", f"/v1/relay/{victim}/threshold")[1].get("threshold") != "secret":
        assert time.monotonic() < deadline, "the relay threshold override never took effect"
        time.sleep(0.5)
    before = answers(port, [victim, bystander])
    victim_nodes = sorted(n["node_id"] for n in before[victim][1]["nodes"])
    assert len(victim_nodes) == len(texts) and len(before[bystander][1]["nodes"]) == len(kept)

    status, accepted = request(port, "POST", f"/v1/memory/{victim}/erase", {"requestId": f"gdpr-{unique}"})
    assert (status, accepted["request_id"]) == (202, f"gdpr-{unique}")
    deadline = time.monotonic() + 120  # the first step's deletions are out: kill now
    while not any(r and r["event_type"] == "memory_deleted"
                  for r in records_of(stack, catalog.MEMORY_LEDGER, out_start, victim)):
        assert time.monotonic() < deadline, "the erasure never started"
        time.sleep(0.2)
    fleet.kill("a")  # SIGKILL in the middle of the erasure: no flush, no commit
    mid = records_of(stack, catalog.ERASE_RECEIPTS, out_start, victim)
    assert mid == [], "the erasure had finished before the kill: the test did not crash it in the middle"
    deleted_at_kill = {r["payload"]["node_id"] for r in records_of(stack, catalog.MEMORY_LEDGER, out_start, victim)
                       if r and r["event_type"] == "memory_deleted"}
    assert 0 < len(deleted_at_kill) < len(victim_nodes)

    fleet.start("a")
    receipts = consume(stack, catalog.ERASE_RECEIPTS, lambda out: any(m["key"] == victim for m in out), timeout=240)
    fleet.wait_caught_up(kafkatools.end_offsets(stack, INPUTS))
    port = fleet.ports["a"]
    deadline = time.monotonic() + 60  # the override is removed by the relay-policy agent, right after
    while request(port, "GET", f"/v1/relay/{victim}/threshold")[1].get("threshold") != "personal":
        assert time.monotonic() < deadline, "the relay threshold override was not removed"
        time.sleep(0.5)
    after = answers(port, [victim, bystander])
    fleet.stop_all()  # a clean stop: every changelog write is on the broker

    # one receipt (copies only identical), counting everything, with no content
    copies = [r for r in records_of(stack, catalog.ERASE_RECEIPTS, out_start, victim)]
    assert copies and all(c == copies[0] for c in copies), copies
    receipt = copies[0]
    print(f"\nerasure: killed after {len(deleted_at_kill)} of {len(victim_nodes)} nodes; "
          f"{len(copies)} receipt copies; {receipt['steps']} steps")
    assert receipts
    assert (receipt["request_id"], receipt["nodes_erased"], sorted(receipt["node_ids"]), receipt["steps"]) == \
        (f"gdpr-{unique}", len(victim_nodes), victim_nodes, len(victim_nodes))
    assert (receipt["negotiator_memories_erased"], receipt["relay_policy_removed"], receipt["requested_by"]) == \
        (2, True, "token#1")
    assert receipt["relay_tombstones"] == len(victim_nodes)
    assert not any(t.encode() in json.dumps(receipt).encode() for t in texts + rules)

    # memory.nodes.v1: every node of the victim ends in a null; the bystander's stay
    nodes = latest(stack, catalog.MEMORY_NODES, out_start)
    victim_keys = {k: v for k, v in nodes.items() if k.startswith(encode_key(victim + "/"))}
    assert sorted(k.decode().split("/", 1)[1] for k in victim_keys) == victim_nodes
    assert all(v is None for v in victim_keys.values())
    assert (after[victim][0], after[victim][1]["nodes"]) == (200, [])
    assert after[bystander] == before[bystander]
    # the relay: a deletion tombstone per node, once per node id
    relay = records_of(stack, catalog.MEMORY_RELAY, out_start, victim)
    tombstones = {r["payload"]["node_id"] for r in relay if r["payload"].get("redacted_reason") == "deleted"}
    assert tombstones == set(victim_nodes)
    # analytics: a tombstone on the compacted topic
    assert latest(stack, catalog.MEMORY_ANALYTICS, out_start).get(encode_key(victim), b"absent") is None

    # no changelog holds the victim's content in a latest value; its rows are gone
    app = fleet.app_id
    state = latest(stack, f"{app}-memory-state-changelog")
    assert all(v is None for k, v in state.items() if k.startswith(encode_key(victim + "/"))
               and k.decode().split("/", 1)[1] in victim_nodes)
    for table in ("memory-state", "negotiator", "relay-policy", "analytics"):
        values = latest(stack, f"{app}-{table}-changelog")
        leaked = [t for t in texts + rules if any(v and t.encode() in v for v in values.values())]
        assert not leaked, (table, leaked[:2])
    assert latest(stack, f"{app}-relay-policy-changelog").get(encode_key(victim), b"absent") is None
    assert latest(stack, f"{app}-analytics-changelog").get(encode_key(victim), b"absent") is None
    kept_rows = latest(stack, f"{app}-memory-state-changelog")
    assert all(any(t.encode() in (v or b"") for v in kept_rows.values()) for t in kept)

    # nothing re-forms: the same inputs again, and the same content under new ids
    again = items[:len(texts)] + [(victim, candidate(victim, f"again-{unique}-{i}", BASE_TS + 500 + i, t))
                                  for i, t in enumerate(texts)]
    re_start = kafkatools.end_offsets(stack, [catalog.MEMORY_NODES])
    produce(stack, catalog.MEMORY_CANDIDATES, again)
    fleet.start("a")
    fleet.wait_caught_up(kafkatools.end_offsets(stack, INPUTS))
    assert answers(fleet.ports["a"], [victim])[victim][1]["nodes"] == []
    assert [v for v in records_of(stack, catalog.MEMORY_NODES, re_start, victim) if v is not None] == []
    fleet.stop_all()


def test_cli_erase_waits_for_the_receipt_and_refuses_a_bad_id(stack, unique):
    user = f"mb-cli-erase-{unique}"
    texts = facts(f"cli-{unique}", 3, seed=5)
    port = free_port()
    env = {"MEMSTREAM_APP_ID": f"it-erase-cli-{unique}", "MEMSTREAM_WEB_PORT": str(port)}
    with worker(stack, f"erase-cli-{unique}", env=env):
        produce(stack, catalog.MEMORY_CANDIDATES,
                [(user, candidate(user, f"c-{unique}-{i}", BASE_TS + i, t)) for i, t in enumerate(texts)])
        consume(stack, catalog.MEMORY_NODES, lambda out: sum(1 for m in out if str(m["key"]).startswith(user)) >= 3)
        done = memstream("erase", user, "--request-id", f"cli-{unique}", "--wait", "120")
    receipt = json.loads(done.stdout)  # stdout is the receipt alone: the human line is on stderr
    assert f"erase request cli-{unique} for {user} sent to" in done.stderr
    assert (receipt["motebit_id"], receipt["request_id"], receipt["nodes_erased"], receipt["requested_by"]) == \
        (user, f"cli-{unique}", 3, "cli")
    bad = memstream("erase", "no/slashes", check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("memstream: error: ") and len(bad.stderr.strip().splitlines()) == 1


def test_records_on_the_wrong_partition_are_dead_lettered_on_two_workers(stack, unique):
    """librdkafka's default partitioner (consistent_random: CRC32) instead of murmur2."""
    partitions = stack.partitions
    users = [u for u in (f"mb-crc-{unique}-{i}" for i in range(40))
             if zlib.crc32(encode_key(u)) % partitions != partition_for(encode_key(u), partitions)][:3]
    right = f"mb-murmur-{unique}"
    assert len(users) == 3
    sc = begin(stack, f"crc-{unique}", [(u, None) for u in users + [right]])
    fleet = fleet_for(sc, "fleet", MEMSTREAM_STANDBY_REPLICAS="0")
    fleet.start("a")
    fleet.start("b")
    codec = codecs(stack).codec(catalog.topic(catalog.MEMORY_CANDIDATES).value_schema)
    rd = RdProducer({"bootstrap.servers": stack.broker, "log_level": 0})  # the default: consistent_random
    sent = []
    for n, u in enumerate(users):
        for i, text in enumerate(facts(f"crc-{n}", 2, seed=n)):
            value = codec.encode(candidate(u, f"crc-{unique}-{i}", BASE_TS + i, text))
            rd.produce(catalog.MEMORY_CANDIDATES, key=encode_key(u), value=value,
                       on_delivery=lambda err, msg: sent.append((msg.key(), msg.partition())))
    assert rd.flush(30) == 0
    assert all(p == zlib.crc32(k) % partitions for k, p in sent)  # the client used CRC32 indeed
    produce(stack, catalog.MEMORY_CANDIDATES, [(right, candidate(right, f"ok-{unique}", BASE_TS, "Murmur fact."))])
    fleet.wait_caught_up(kafkatools.end_offsets(stack, INPUTS))
    fleet.alive()
    dead = consume(stack, catalog.DLQ, lambda out: sum(1 for m in out if m["value"]["error_class"] == "wrong_partition"
                                                     and m["value"]["original_key"] in {encode_key(u) for u in users}) >= 6)
    ours = {}
    for m in dead:
        d = m["value"]
        if d["error_class"] == "wrong_partition" and d["original_key"] in {encode_key(u) for u in users}:
            ours[(d["original_partition"], d["original_offset"])] = (d, m["partition"], m["offset"])
    assert len(ours) == 6
    for d, _p, _o in ours.values():
        expected = partition_for(d["original_key"], partitions)
        assert d["stage"] == "validate" and d["original_partition"] != expected
        assert f"belongs on partition {expected}" in d["reason"] and "murmur2" in d["reason"], d["reason"]
    got = answers(fleet.ports["b"], users + [right])
    assert all(got[u][1]["nodes"] == [] for u in users) and len(got[right][1]["nodes"]) == 1
    fleet.stop_all()
    state = latest(stack, f"{fleet.app_id}-memory-state-changelog")
    assert not [k for k in state if any(k.startswith(encode_key(u)) for u in users)], "a misrouted record left rows"

    # the fix: replay them with a murmur2 producer (`memstream dlq replay`), and they apply
    offsets = ",".join(f"{p}:{o}" for _d, p, o in ours.values())
    memstream("dlq", "replay", "--offsets", offsets)
    fleet.start("a")
    fleet.start("b")
    fleet.wait_caught_up(kafkatools.end_offsets(stack, INPUTS))
    got = answers(fleet.ports["a"], users)
    assert all(len(got[u][1]["nodes"]) == 2 for u in users), {u: got[u][1] for u in users}
    fleet.stop_all()
    assert TEST_ENV["MEMSTREAM_PARTITIONS"] == str(partitions)
