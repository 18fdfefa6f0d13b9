"""`memstream repartition` on a real broker: a stream on 6 partitions, stopped midway,
re-partitioned to 12, the rest of the stream with 4 workers, equals one worker that ran the whole
stream on 12 partitions (node state, ledger and relay events by event id, HTTP answers); the
same with the command SIGKILLed midway and run again. Its refusals (a worker alive, a count not
raised, an unfinished copy) and what a misrouted record does before and after the change are
checked on the way.

On a stack of its own (the devstack test's ports and lock): it changes the catalog topics'
partition counts, which every other test on a shared stack relies on. Between the runs the
catalog topics are deleted and created again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.fleet import Fleet, stream_of
from streams.contracts import catalog
from streams.contracts.wire import decode_key, encode_key
from streams.core.partitioning import partition_for
from streams.core.repartition import is_move_tombstone
from streams.runtime import generation
from streams.settings import Settings
from streams.tools import kafkatools
from tests.conftest import ROOT, TEST_DATA, TEST_ENV, WORKER_SUFFIX, memstream
from tests.kafka_util import candidate, claim_data_dir, codecs, free_port, producer, release_data_dir
from tests.system.test_faults_kafka import SHUTDOWN_TIMEOUT_S, TOKEN, answers
from tests.tools.test_devstack import OWN, own_stack

pytestmark = pytest.mark.kafka

ENV = {**OWN, "MEMSTREAM_STACK_DIR": str(ROOT / ".memstream" / f"repartition-test{WORKER_SUFFIX}")}
BEFORE, AFTER = 6, 12
INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]
EVENT_TOPICS = [catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY]
READY_S = 360  #: four workers starting at once on two busy cores (load 20+) took over 120 s


@pytest.fixture(scope="module")
def own():
    """A stack of this module's own, wiped before and after (its topics: `fresh_topics`)."""
    with own_stack(ENV, "rp-", apply_topics=False) as settings:
        yield settings


def fresh_topics(s: Settings, partitions: int) -> Settings:
    """The catalog topics (and every changelog) deleted, then created with `partitions`."""
    admin = AdminClient({"bootstrap.servers": s.broker})
    names = [n for n in admin.list_topics(timeout=10).topics
             if n in catalog.TOPICS or n.endswith("-changelog") or n.startswith("rp-") or n == generation.TOPIC]
    if names:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            fut.result()
        deadline = time.monotonic() + 60
        while set(names) & set(admin.list_topics(timeout=10).topics):
            assert time.monotonic() < deadline, "deleted topics still listed after 60 s"
            time.sleep(0.5)
    env = {**ENV, "MEMSTREAM_PARTITIONS": str(partitions)}
    memstream("topics", "apply", env=env)
    return Settings.from_env(env)


def produce(s: Settings, items: list[tuple[str, dict]], partition: int | None = None) -> None:
    """Candidates keyed by user, murmur2-partitioned by a producer that has the current metadata
    (or all to `partition`)."""
    codec = codecs(s).codec("candidate_memory")
    p = producer(s)
    for user, rec in items:
        extra = {} if partition is None else {"partition": partition}
        p.produce(catalog.MEMORY_CANDIDATES, key=encode_key(user), value=codec.encode(rec), **extra)
    assert p.flush(30) == 0


def fleet(s: Settings, app_id: str, partitions: int) -> Fleet:
    """Workers of deployment `app_id` on this module's stack (the fault suite's settings)."""
    return Fleet(s, app_id, {
        "MEMSTREAM_API_TOKENS": f"{TOKEN}:secret:admin+negotiator+ops", "MEMSTREAM_TIMER_INTERVAL_S": "3600",
        "MEMSTREAM_SESSION_TIMEOUT_S": "6", "MEMSTREAM_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S),
        "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_STANDBY_REPLICAS": "1", "MEMSTREAM_PARTITIONS": str(partitions)},
        log_dir=ROOT / ".memstream" / "test-logs", data_root=TEST_DATA, base_env={**TEST_ENV, **ENV},
        claim=claim_data_dir, release=release_data_dir, free_port=free_port)


def caught_up(s: Settings, group: str, f: Fleet, timeout: float = 600) -> None:
    ends = kafkatools.end_offsets(s, INPUTS)
    deadline = time.monotonic() + timeout
    while (lag := kafkatools.group_lag(s, group, ends)) > 0:
        f.alive()
        assert time.monotonic() < deadline, f"{group} still {lag} records behind after {timeout:.0f}s"
        time.sleep(0.5)
    time.sleep(1)  # outputs are acknowledged before the commit; this only lets the HTTP caches settle


def read_all(s: Settings, topic: str) -> list:
    """Every record of a topic, each partition from its start to its end now."""
    ends = kafkatools.end_offsets(s, [topic])
    todo = {p: end for (_t, p), end in ends.items() if end > 0}
    out = []
    c = Consumer({"bootstrap.servers": s.broker, "group.id": "rp-reader", "enable.auto.commit": False, "log_level": 0})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 60
        while todo:
            assert time.monotonic() < deadline, f"could not read {topic} to its end ({todo})"
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append(msg)
            if msg.offset() + 1 >= todo.get(msg.partition(), 0):
                todo.pop(msg.partition(), None)
    finally:
        c.close()
    return out


def outputs(s: Settings, partitions: int) -> dict:
    """The node table as a reader keeps it (a tombstone that says the row moved is skipped), every
    ledger and relay event by id (with its copies), and the dead letters."""
    f = codecs(s)
    nodes: dict[str, dict | None] = {}
    placed: dict[str, int] = {}
    for msg in sorted(read_all(s, catalog.MEMORY_NODES), key=lambda m: (m.partition(), m.offset())):
        key = decode_key(msg.key())
        if msg.value() is None and is_move_tombstone(msg.headers()):
            continue
        nodes[key] = None if msg.value() is None else f.codec("memory_node").decode(msg.value())
        placed[key] = msg.partition()
    live = {k: v for k, v in nodes.items() if v is not None}
    wrong = [k for k in live if placed[k] != partition_for(k.encode(), partitions)]
    assert not wrong, f"node rows live outside their key's partition: {wrong[:3]}"
    events: dict[str, list] = {}
    for topic in EVENT_TOPICS:
        for msg in read_all(s, topic):
            value = f.codec("memory_event").decode(msg.value())
            events.setdefault(f"{topic}:{value['event_id']}", []).append(value)
    dead = [f.codec("dead_letter").decode(m.value()) for m in read_all(s, catalog.DLQ)]
    return {"nodes": live, "events": events, "dead": dead}


def the_stream(tag: str):
    """The candidates of the run, split in two halves, and two users whose partitions among 6 and
    among 12 differ, one misrouted record each (one produced before the change, one after).
    One record per user: a replayed record comes after the records its user got meanwhile
    (docs/scaling-out.md), which would decide differently from the reference's order."""
    items = stream_of(tag, users=12, n=480)
    moved = [u for u in (f"mb-rp-misrouted-{i}" for i in range(100))
             if partition_for(u.encode(), BEFORE) != partition_for(u.encode(), AFTER)][:2]
    extra = [(u, candidate(u, f"{tag}-w{i}", 1_767_225_600_000 + 10_000_000 + i, f"Misrouted fact number {i}."))
             for i, u in enumerate(moved)]
    return items[:240], items[240:], extra, sorted({u for u, _ in items} | set(moved))


def reference(s0: Settings, tag: str) -> tuple[dict, dict]:
    """One worker that runs the whole stream on 12 partitions (the misrouted records routed right)."""
    first, second, extra, users = the_stream(tag)
    s = fresh_topics(s0, AFTER)
    produce(s, first + extra[:1] + second + extra[1:])
    ref = fleet(s, "rp-ref", AFTER)
    ref.env["MEMSTREAM_STANDBY_REPLICAS"] = "0"
    try:
        ref.start("only", wait=False)
        ref.wait_ready("only", READY_S)
        caught_up(s, "rp-ref", ref)
        got = answers(ref.ports["only"], users)
    finally:
        ref.stop_all()
    out = outputs(s, AFTER)
    assert out["nodes"] and out["events"] and not out["dead"], "the reference must produce nodes and events, no dead letter"
    return out, got


def repartition(app: str, *args: str, kill_on: str | None = None) -> subprocess.CompletedProcess | None:
    """`memstream repartition` of deployment `app`; with `kill_on`, SIGKILLed as soon as it
    prints a line holding it."""
    env = {**ENV, "MEMSTREAM_PARTITIONS": str(BEFORE), "MEMSTREAM_APP_ID": app}
    if kill_on is None:
        return memstream("repartition", *args, env=env, check=False)
    import os

    proc = subprocess.Popen([sys.executable, "-m", "streams", "repartition", *args], cwd=ROOT,
                            env={**os.environ, **TEST_ENV, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if kill_on in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(60)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {kill_on!r}: {''.join(seen)}"
    return None


def scenario(s0: Settings, tag: str, app: str, kill: bool) -> tuple[dict, dict]:
    first, second, extra, users = the_stream(tag)
    (early_user, _), (late_user, _) = extra
    s = fresh_topics(s0, BEFORE)
    # before: one worker on 6 partitions; a record on a wrong partition
    wrong = (partition_for(early_user.encode(), BEFORE) + 1) % BEFORE
    produce(s, first)
    produce(s, extra[:1], partition=wrong)
    before = fleet(s, app, BEFORE)
    before.start("a", wait=False)
    try:
        before.wait_ready("a", READY_S)
        caught_up(s, app, before)
        alive = repartition(app, "--to", str(AFTER))
        assert alive is not None and alive.returncode == 2 and "are alive" in alive.stderr, alive.stderr
        assert alive.stderr.count("\n") == 1 and "Traceback" not in alive.stderr
    finally:
        before.stop_all()
    same = repartition(app, "--to", str(BEFORE))
    assert same is not None and same.returncode == 2 and "not more than the 6 partitions" in same.stderr, same.stderr

    if kill:
        repartition(app, "--to", str(AFTER), kill_on="memory-state: partition 3/6")
        # a worker refuses to start on the half-copied deployment
        refused = memstream("worker", env={**ENV, "MEMSTREAM_APP_ID": app, "MEMSTREAM_PARTITIONS": str(AFTER),
                                           "MEMSTREAM_DATA_DIR": str(TEST_DATA / f"{app}-refused")}, check=False)
        assert refused.returncode == 2 and "has not finished" in refused.stderr, refused.stderr
        other = repartition(app, "--to", "24")
        assert other is not None and other.returncode == 2 and "finish it first" in other.stderr, other.stderr
    done = repartition(app, "--to", str(AFTER))
    assert done is not None and done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["group"] == f"{app}.g1" and summary["partitions"] == AFTER
    assert all(t["verified"] for t in summary["tables"].values()), summary["tables"]
    assert summary["tables"]["memory-state"]["rows"] > 0
    assert summary["outputs"][catalog.MEMORY_NODES]["moved"] > 0

    # after: the rest of the stream (a producer that knows 12 partitions), and one record of the
    # misrouted user from a producer that still routes by 6
    s12 = s.replace(partitions=AFTER)
    produce(s12, second)
    produce(s12, extra[1:], partition=partition_for(late_user.encode(), BEFORE))
    after = fleet(s12, app, AFTER)
    group = f"{app}.g1"
    try:
        for name in "abcd":
            after.start(name, wait=False)
        for name in "abcd":
            after.wait_ready(name, READY_S)
        caught_up(s12, group, after)
        dead = outputs(s12, AFTER)["dead"]
        # at least once: a batch read again after a rebalance repeats its dead letter, same source
        sources = {(d["original_partition"], d["original_offset"], d["error_class"]) for d in dead}
        assert len(sources) == 2 and {e for _p, _o, e in sources} == {"wrong_partition"}, sources
        assert {p for p, _o, _e in sources} == {wrong, partition_for(late_user.encode(), BEFORE)}, sources
        assert any(f"belongs on partition {partition_for(late_user.encode(), AFTER)}" in d["reason"]
                   for d in dead), dead
        # as documented: replayed, each goes to its key's partition among 12 and is applied
        replay = memstream("dlq", "replay", "--error-class", "wrong_partition",
                           env={**ENV, "MEMSTREAM_PARTITIONS": str(AFTER), "MEMSTREAM_APP_ID": app})
        assert f"replayed {len(dead)} of {len(dead)}" in replay.stdout + replay.stderr, replay.stdout + replay.stderr
        caught_up(s12, group, after)
        got = {name: answers(after.ports[name], users) for name in after.procs}
    finally:
        after.stop_all()
    return outputs(s12, AFTER), got


def field_diff(got: dict, want: dict) -> list[str]:
    keys = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
    out = []
    for k in keys[:5]:
        g, w = got.get(k) or {}, want.get(k) or {}
        out.append(f"{k}: " + ", ".join(f"{f}={g.get(f)!r} want {w.get(f)!r}" for f in sorted(g.keys() | w.keys())
                                        if g.get(f) != w.get(f)))
    return out


def compare(got: dict, answers_by_worker: dict, want: dict, want_answers: dict) -> None:
    assert got["nodes"] == want["nodes"], field_diff(got["nodes"], want["nodes"])
    assert got["events"].keys() == want["events"].keys(), (
        sorted(want["events"].keys() - got["events"].keys())[:5], sorted(got["events"].keys() - want["events"].keys())[:5])
    for eid, copies in got["events"].items():
        ref = want["events"][eid][0]
        for c in copies:
            assert c == ref, f"{eid}: a copy differs from the reference: " + "; ".join(
                f"{f}={c.get(f)!r} want {ref.get(f)!r}" for f in sorted(c.keys() | ref.keys()) if c.get(f) != ref.get(f))
    for name, per_user in answers_by_worker.items():
        for u, answer in per_user.items():
            assert answer[0] == 200 and answer == want_answers[u], f"worker {name} answers differently for {u}"


def test_repartition_carries_the_state_killed_midway_or_not(own):
    want, want_answers = reference(own, "rp")
    got, got_answers = scenario(own, "rp", "rp-kill", kill=True)
    compare(got, got_answers, want, want_answers)
    got, got_answers = scenario(own, "rp", "rp-clean", kill=False)
    compare(got, got_answers, want, want_answers)


def test_repartition_refuses_lag_and_a_wrong_count(own):
    """A count over MEMSTREAM_MAX_PARTITIONS. Lag: a group that has not read what is there. A topic
    raised by hand: the counts differ."""
    s = fresh_topics(own, BEFORE)
    produce(s, [("u-lag", candidate("u-lag", "lag-1", 1_767_225_600_000, "Some fact."))])
    huge = repartition("rp-lag", "--to", "5000")  # a typo's count: refused before anything is read or raised
    assert huge is not None and huge.returncode == 2 and "MEMSTREAM_MAX_PARTITIONS (1024)" in huge.stderr, huge.stderr
    lag = repartition("rp-lag", "--to", str(AFTER))
    assert lag is not None and lag.returncode == 2 and "not yet processed by consumer group" in lag.stderr, lag.stderr
    from confluent_kafka.admin import NewPartitions

    admin = AdminClient({"bootstrap.servers": s.broker})
    admin.create_partitions([NewPartitions(catalog.MEMORY_TURNS, 8)])[catalog.MEMORY_TURNS].result(30)
    drift = repartition("rp-lag", "--to", str(AFTER))
    assert drift is not None and drift.returncode == 2 and "do not all have one partition count" in drift.stderr
    worker = memstream("worker", env={**ENV, "MEMSTREAM_PARTITIONS": str(BEFORE), "MEMSTREAM_APP_ID": "rp-drift",
                                      "MEMSTREAM_DATA_DIR": str(TEST_DATA / "rp-drift")}, check=False)
    assert worker.returncode == 2 and "memory.turns.v1 has 8 partitions but MEMSTREAM_PARTITIONS is 6" in worker.stderr
