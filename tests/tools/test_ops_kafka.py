"""The operator's view on the real broker: one real worker (started once for this file) serves
/metrics and /health; the real CLI (`memstream status`, `dlq inspect`, `dlq replay`) runs as a
subprocess against it.

The worker's consumer group is positioned at the current end of the input topics before it starts,
so it sees only this file's records and its counters can be checked exactly.

Replay scenario: a dead letter whose cause is gone. Every dead letter today's pipeline writes has a
cause in the record itself (bad bytes, a key that differs from the record's id, a rule), and
replaying the same bytes fails the same way; the test shows that (a replayed key-mismatch lands in
the DLQ again). The case replay exists for is a record a worker refused because of a bug that has
since been fixed: the test writes such a dead letter exactly as `Runtime.dead_letter` would have
(stage `apply`, the exception's class, the original key and value bytes, Connect headers), replays
it, and the graph agent applies it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from streams.contracts import catalog, deadletter
from streams.tools import kafkatools
from streams.contracts.wire import encode_key

from tests.conftest import memstream
from tests.kafka_util import codecs, consume, free_port, produce, worker
from tests.runtime.test_metrics import strict_parse

pytestmark = pytest.mark.kafka

T0 = 1_793_491_200_000
INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]


def get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def scrape(port: int) -> dict:
    """/metrics as {(sample name, sorted labels): value}, after checking the whole text is valid."""
    status, ctype, text = get(port, "/metrics")
    # prometheus_client's text format (legacy names only, so the body is format 0.0.4 too)
    assert status == 200 and ctype == CONTENT_TYPE_LATEST, ctype
    fams = strict_parse(text)
    assert list(text_string_to_metric_families(text))  # Prometheus' own parser reads it too
    return {(n, tuple(sorted(lb.items()))): v for f in fams.values() for n, lb, v in f["samples"]}


def wait_for(check, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {result!r}")
        time.sleep(0.5)


def dlq_json(app_env: dict, *args: str) -> list[dict]:
    out = memstream("dlq", "inspect", "--json", *args, env=app_env).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def ops_worker(stack):
    u = uuid.uuid4().hex[:10]
    app_id, port = f"ops-{u}", free_port()
    kafkatools.position_group(stack, app_id, kafkatools.end_offsets(stack, INPUTS))
    env = {"MEMSTREAM_APP_ID": app_id, "MEMSTREAM_WEB_PORT": str(port), "MEMSTREAM_API_TOKENS": "t:none"}
    started = time.monotonic()
    with worker(stack, f"ops-{u}", env=env):
        first_health = get(port, "/health")
        yield {"u": u, "port": port, "env": env, "app_id": app_id, "first_health": first_health,
               "started": started, "settings": stack}
    after = memstream("status", env=env, check=False)
    assert after.returncode == 1 and "no members" in after.stdout, after.stdout + after.stderr


@pytest.fixture(scope="module")
def traffic(ops_worker):
    """Valid graph events, undecodable bytes and a key mismatch, through the worker."""
    s, u = ops_worker["settings"], ops_worker["u"]
    good, bad, mismatch = f"g-ops-{u}", f"g-bad-{u}", f"g-mm-{u}"
    events = [{"ts": T0, "graphId": good, "event": "phase_change", "status": "executing"},
              {"ts": T0 + 5, "graphId": good, "event": "phase_change", "status": "complete"}]
    produce(s, catalog.GRAPH_EVENTS, [(good, e) for e in events])
    produce(s, catalog.GRAPH_EVENTS, [(bad, b'{"graphId": "not avro"}')])
    produce(s, catalog.GRAPH_EVENTS, [(mismatch, {"ts": T0, "graphId": "someone-else", "event": "phase_change",
                                                  "status": "executing"})])
    consume(s, catalog.GRAPH_STATE, lambda out: any(m["key"] == good and m["value"]["eventCount"] == 2 for m in out))
    consume(s, catalog.DLQ, lambda out: {bad.encode(), mismatch.encode()} <= {m["key"] for m in out})
    return {"good": good, "bad": bad, "mismatch": mismatch}


def test_metrics_count_what_the_worker_did(ops_worker, traffic):
    port = ops_worker["port"]

    def settled():
        m = scrape(port)
        hist = m.get(("memstream_processing_seconds_count", (("topic", catalog.GRAPH_EVENTS),)), 0)
        return m if hist >= 2 else None

    m = wait_for(settled, what="the latency histogram")
    topic = (("topic", catalog.GRAPH_EVENTS),)
    assert m[("memstream_in_total", topic)] == 4  # 2 valid + undecodable + key mismatch
    assert m[("memstream_out_total", (("topic", catalog.GRAPH_STATE),))] == 2
    assert m[("memstream_dlq_total", (("error_class", "UnknownMagicByteError"), ("stage", "decode")))] == 1
    assert m[("memstream_dlq_total", (("error_class", "graph.key_mismatch"), ("stage", "validate")))] == 1
    # the two applied events were timed; the refused ones were not
    assert m[("memstream_processing_seconds_count", topic)] == 2
    assert m[("memstream_processing_seconds_bucket", (("le", "+Inf"),) + topic)] == 2
    assert 0 < m[("memstream_processing_seconds_sum", topic)] < 5
    assert m[("memstream_table_keys", (("table", "graph-state"),))] == 1
    assert m[("memstream_ready", ())] == 1 and m[("memstream_recovery_in_progress", ())] == 0

    # consumer lag: every owned input partition is reported, and once Faust has committed, the
    # committed offset reaches the broker's high watermark (lag 0)
    ends = kafkatools.end_offsets(ops_worker["settings"], [catalog.GRAPH_EVENTS])

    def caught_up():
        m = scrape(port)
        per = {p: (m.get(("memstream_consumer_committed_offset", (("partition", str(p)),) + topic)),
                   m.get(("memstream_consumer_highwater", (("partition", str(p)),) + topic)),
                   m.get(("memstream_consumer_lag", (("partition", str(p)),) + topic)))
               for (_t, p) in ends}
        return m if all(v == (ends[(catalog.GRAPH_EVENTS, p)], ends[(catalog.GRAPH_EVENTS, p)], 0)
                        for p, v in per.items()) else None

    m = wait_for(caught_up, what="committed offsets to reach the high watermarks")
    lag_topics = {dict(k[1])["topic"] for k in m if k[0] == "memstream_consumer_lag"}
    assert set(INPUTS) <= lag_topics
    assert not any(t.endswith("-changelog") for t in lag_topics)


def test_health_is_ready_without_a_token(ops_worker, traffic):
    status, first_type, first = ops_worker["first_health"]
    assert status in (200, 503)
    if status == 503:  # answered while still joining the group / recovering: says why
        assert json.loads(first)["reason"]
    status, ctype, body = get(ops_worker["port"], "/health")
    doc = json.loads(body)
    assert status == 200 and doc["status"] == "ready" and doc["ready"] is True
    assert doc["url"] == f"http://127.0.0.1:{ops_worker['port']}"
    assert f"{catalog.GRAPH_EVENTS}[0]" in doc["sources"] and doc["recovery_completed"] is True
    assert not any(tp.endswith("-changelog") for tp in doc["sources"])


def test_status_lists_the_worker_its_partitions_lag_and_health(ops_worker, traffic):
    env, port = ops_worker["env"], ops_worker["port"]
    doc = json.loads(memstream("status", "--json", env=env).stdout)  # exit 0: check=True
    assert doc["ok"] is True and doc["group"] == ops_worker["app_id"] and doc["unassigned"] == []
    (member,) = doc["members"]
    assert member["url"] == f"http://127.0.0.1:{port}"  # decoded from Faust's member metadata
    assert member["ready"] is True and member["health"]["status"] == "ready"
    assert {f"{t}[{p}]" for t in INPUTS for p in range(ops_worker["settings"].partitions)} <= set(member["actives"])
    rows = [p for p in doc["partitions"] if p["topic"] == catalog.GRAPH_EVENTS]
    assert len(rows) == ops_worker["settings"].partitions and all(r["owner"] == member["url"] for r in rows)
    text = memstream("status", env=env).stdout
    assert f"worker http://127.0.0.1:{port}" in text and "ready" in text and "lag:" in text
    assert f"{len(INPUTS) * ops_worker['settings'].partitions}/{len(INPUTS) * ops_worker['settings'].partitions} input partitions assigned" in text


def test_dlq_inspect_shows_the_bad_records_with_their_reasons(ops_worker, traffic):
    env = ops_worker["env"]
    letters = {d["key"]: d for d in dlq_json(env, "--topic", catalog.GRAPH_EVENTS)
               if d["key"] in (traffic["bad"], traffic["mismatch"])}
    bad, mm = letters[traffic["bad"]], letters[traffic["mismatch"]]
    assert bad["stage"] == "decode" and bad["error_class"] == "UnknownMagicByteError"
    assert "unknown magic byte" in bad["reason"] and bad["original_topic"] == catalog.GRAPH_EVENTS
    assert mm["stage"] == "validate" and mm["error_class"] == "graph.key_mismatch" and "someone-else" in mm["reason"]
    assert bad["replayable"] and bad["value_bytes"] == len(b'{"graphId": "not avro"}')
    # text form and filters
    out = memstream("dlq", "inspect", "--error-class", "graph.key_mismatch", env=env).stdout
    line = next(x for x in out.splitlines() if f"key={traffic['mismatch']}" in x)
    assert f"{mm['dlq_partition']}:{mm['dlq_offset']}" in line and "stage=validate" in line
    assert all("class=graph.key_mismatch" in x for x in out.splitlines())
    assert len(memstream("dlq", "inspect", "--limit", "1", env=env).stdout.splitlines()) == 1


def test_dlq_replay(ops_worker, traffic):
    s, env, u = ops_worker["settings"], ops_worker["env"], ops_worker["u"]
    fixed = f"g-fix-{u}"
    # 1. a valid record an earlier (buggy) worker refused in its handler, as Runtime.dead_letter writes it
    value = codecs(s).codec("graph_event").encode({"ts": T0, "graphId": fixed, "event": "phase_change",
                                                   "status": "executing"})
    bug = deadletter.dead_letter(deadletter.Origin(catalog.GRAPH_EVENTS, 1, 77, encode_key(fixed), value),
                                 stage=deadletter.STAGE_APPLY, reason="RuntimeError: simulated bug, fixed since",
                                 error_class="RuntimeError", failed_at=int(time.time() * 1000), worker="old:1")
    # 2. dead letters that cannot be replayed: value withheld, and a shipper line from a file
    withheld = deadletter.dead_letter(deadletter.Origin(catalog.MEMORY_CANDIDATES, 0, 5, encode_key(f"mb-{u}"), None),
                                      stage="validate", reason="deleted_content: ...", error_class="deleted_content",
                                      failed_at=int(time.time() * 1000))
    shipped = deadletter.dead_letter(deadletter.Origin(f"file:graph-events-{u}.ndjson", -1, 0, None, b"{oops"),
                                     stage=deadletter.STAGE_SHIP, reason="not JSON", error_class="JSONDecodeError",
                                     failed_at=int(time.time() * 1000))
    for key, rec in ((fixed, bug), (f"mb-{u}", withheld), (f"file-{u}", shipped)):
        produce(s, catalog.DLQ, [(encode_key(key), rec)], headers=deadletter.connect_headers(rec))
    letters = {d["key"]: d for d in dlq_json(env)}
    pos = {k: f"{letters[k]['dlq_partition']}:{letters[k]['dlq_offset']}"
           for k in (fixed, f"mb-{u}", traffic["mismatch"])}
    file_pos = next(f"{d['dlq_partition']}:{d['dlq_offset']}" for d in letters.values()
                    if d["original_topic"] == f"file:graph-events-{u}.ndjson")

    dry = memstream("dlq", "replay", "--offsets", pos[fixed], "--dry-run", env=env)
    assert f"would replay {pos[fixed]} -> {catalog.GRAPH_EVENTS} key={fixed}" in dry.stdout
    everything = memstream("dlq", "replay", "--all", "--dry-run", env=env)  # --all: lists, sends nothing
    assert "would replay" in everything.stdout and f"skip {file_pos}" in everything.stderr

    done = memstream("dlq", "replay", "--offsets", f"{pos[fixed]},{pos[traffic['mismatch']]}", env=env)
    assert f"replayed 2 of 2 selected dead letter(s) to {catalog.GRAPH_EVENTS} (2)" in done.stdout
    assert "dead letters replayed" in done.stderr  # the progress bar
    # the fixed record is applied now, and the replayed copy says where it came from
    consume(s, catalog.GRAPH_STATE, lambda out: any(m["key"] == fixed and m["value"]["phase"] == "executing"
                                                    for m in out))
    copies = consume(s, catalog.GRAPH_EVENTS, lambda out: any(m["key"] == fixed for m in out), decode=False)
    copy = next(m for m in copies if m["key"] == fixed)
    assert copy["raw"] == value and copy["headers"]["memstream.replayed_from"] == pos[fixed].encode()
    # the key mismatch is in the record itself: replayed, it is dead-lettered again
    consume(s, catalog.DLQ, lambda out: sum(m["key"] == traffic["mismatch"].encode() for m in out) >= 2)

    refused = memstream("dlq", "replay", "--offsets", f"{pos[f'mb-{u}']},{file_pos},9999:0", env=env, check=False)
    assert refused.returncode == 1
    assert "value withheld" in refused.stderr and "fix the line in the file" in refused.stderr
    assert "no dead letter at pipeline.dlq.v1 9999:0" in refused.stderr
    assert "replayed 0 of 2 selected dead letter(s); skipped 2 (" in refused.stdout

    def counted():
        m = scrape(ops_worker["port"])
        return m if m.get(("memstream_dlq_total", (("error_class", "graph.key_mismatch"), ("stage", "validate")))) == 2 else None

    m = wait_for(counted, what="the replayed key mismatch to be counted")
    assert m[("memstream_in_total", (("topic", catalog.GRAPH_EVENTS),))] == 6
