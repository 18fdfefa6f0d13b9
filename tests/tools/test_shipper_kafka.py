"""The graph-log shipper against the real broker and registry: `memstream ship-graph-logs` as a
subprocess, its records read back with a plain consumer, and (for the restart case) a real
`memstream worker` materializing graph.state.v1 from what was shipped. Records are counted the
way a reader must read them: isolation.level=read_committed (librdkafka's default)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from streams.contracts import catalog
from streams.graphs import samples
from streams.graphs.paths import graph_events_filename, graph_events_path
from streams.graphs.shipper_state import HEADER_LINE_ID, HEADER_SOURCE_OFFSET, line_id
from tests.conftest import ROOT, TEST_ENV, memstream
from tests.kafka_util import codecs, consume, read_to_end, worker

pytestmark = pytest.mark.kafka


# ------------------------------------------------------------------------------------ helpers
def expected_ids(path: str | Path) -> list[str]:
    name = os.path.basename(path)
    ids, offset = [], 0
    with open(path, "rb") as f:
        for raw in f.read().split(b"\n")[:-1]:
            ids.append(line_id(name, offset, raw))
            offset += len(raw) + 1
    return ids


def start_follower(directory: Path, offsets: Path, log: Path, **env: str) -> subprocess.Popen:
    """`memstream ship-graph-logs DIR` without --once, as a user would run it."""
    full_env = {**os.environ, **TEST_ENV, **env}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "streams", "ship-graph-logs", str(directory), "--offsets", str(offsets),
                                 "--poll", "0.1"], cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"shipper exited {proc.returncode} while waiting for {what}:\n{log.read_text() if log else ''}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{log.read_text()[-3000:] if log else ''}"
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


# -------------------------------------------------------------------------------------- tests
def test_ship_once_delivers_every_line_exactly_once_and_dead_letters_bad_lines(stack, unique, tmp_path):
    logs = tmp_path / "logs"
    runs = [samples.graph_run(40 + k, graph_id=f"g-ship-{k}-{unique}") for k in range(3)]
    bad = samples.bad_lines(5, graph_id=runs[0].graph_id)
    foreign = samples.graph_run(1, graph_id=f"g-foreign-{unique}").lines()[0]
    huge = json.dumps({"ts": 1, "graphId": runs[1].graph_id, "event": "node_dispatched", "nodeId": "n1",
                       "agent": "x" * 1_100_000}) + "\n"  # valid, but over the producer's 1 MB message size
    paths = samples.write_run_files(logs, runs, extra_lines={runs[0].graph_id: [ln for ln, _ in bad] + [foreign],
                                                             runs[1].graph_id: [huge]})
    offsets = tmp_path / "offsets.json"

    started = time.monotonic()
    proc = memstream("ship-graph-logs", str(logs), "--once", "--offsets", str(offsets))
    elapsed = time.monotonic() - started
    assert proc.stderr.count("shipped graph-events-") >= 3 and "HTTP Request" not in proc.stderr, proc.stderr
    assert f"done: {sum(len(r.events) for r in runs) + len(bad) + 2} lines from 3 file(s)" in proc.stderr

    keys = {r.graph_id.encode() for r in runs}
    events = read_to_end(stack, catalog.GRAPH_EVENTS, keys)
    per_id = Counter(m["headers"][HEADER_LINE_ID].decode() for m in events)
    good_ids = set()
    for run in runs:
        ids = expected_ids(paths[run.graph_id])[: len(run.events)]  # the bad lines follow the run's lines
        good_ids |= set(ids)
        mine = [m for m in events if m["key"] == run.graph_id.encode()]
        assert [m["value"] for m in mine] == run.events  # in file order, one partition per graph
        assert mine[0]["raw"][0] == 0  # Confluent framing: the registry is configured
    assert set(per_id) == good_ids and set(per_id.values()) == {1}, "every line exactly once"

    name = graph_events_filename(runs[0].graph_id)
    letters = read_to_end(stack, catalog.DLQ, {name.encode()})
    assert len(letters) == len(bad) + 1
    for m, (line, kind) in zip(letters[:-1], bad, strict=True):  # the last: the wrong file, below
        rec = m["value"]
        assert rec["error_class"] == f"ship.{kind}" and rec["stage"] == "ship" and kind in rec["reason"]
        assert rec["original_topic"] == f"file:{name}" and rec["original_value"] == line.rstrip("\n").encode()
        assert m["headers"]["__connect.errors.offset"] == str(rec["original_offset"]).encode()
    assert letters[-1]["value"]["error_class"] == "ship.wrong_file"
    assert "does not belong to" in letters[-1]["value"]["reason"]
    (too_large,) = read_to_end(stack, catalog.DLQ, {graph_events_filename(runs[1].graph_id).encode()})
    assert too_large["value"]["error_class"] == "ship.too_large"
    assert too_large["value"]["original_value"] == huge.encode()[: 64 * 1024]

    # the offsets file remembers: a second run ships nothing
    again = memstream("ship-graph-logs", str(logs), "--once", "--offsets", str(offsets))
    assert "done: 0 lines" in again.stderr
    assert len(read_to_end(stack, catalog.GRAPH_EVENTS, keys)) == len(events)
    print(f"\n[shipper] --once shipped {len(events)} events + {len(letters)} dead letters in {elapsed:.1f}s")


def test_sigkill_three_times_during_three_files_leaves_every_line_exactly_once_on_the_topic(stack, unique, tmp_path):
    """SPEC §4.9 / issue 12: 3 files of 1,000 lines, the follower SIGKILLed three times at varied
    points (mostly mid-transaction: it commits every 10 lines), restarted each time, then a last
    `--once`: exactly 3,000 records on graph.events.v1 for a read_committed reader, each line
    once. Then a worker (read_committed too) materializes each graph from exactly those lines."""
    rng = random.Random(unique)
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = [samples.graph_run(60 + k, graph_id=f"g-kill-{k}-{unique}", nodes=300) for k in range(3)]
    lines = {r.graph_id: r.lines()[:1000] for r in runs}
    assert all(len(v) == 1000 for v in lines.values())
    files = {gid: graph_events_path(logs, gid) for gid in lines}

    def write_lines(start: int, stop: int) -> None:  # the recorder appending
        for gid, ls in lines.items():
            with open(files[gid], "a", encoding="utf-8") as f:
                f.writelines(ls[start:stop])

    write_lines(0, 400)
    kills = []
    for k, (lo, hi) in enumerate([(400, 700), (700, 1000), (1000, 1000)]):
        log = tmp_path / f"shipper-{k}.log"
        proc = start_follower(logs, tmp_path / "unused-offsets.json", log, MEMSTREAM_SHIPPER_BATCH_LINES="10")
        try:
            wait_for(lambda: "watching" in log.read_text(), 60, "the shipper to start", proc, log)  # noqa: B023 -- called in this iteration
            write_lines(lo, hi)
            target = rng.randint(3, 40)  # batches (transactions) committed by this run before the kill
            wait_for(lambda: log.read_text().count("shipped graph-events-") >= target, 60, f"{target} batches", proc, log)  # noqa: B023 -- called in this iteration
            time.sleep(rng.uniform(0, 0.05))  # and a little more: somewhere inside a later transaction
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            stop(proc)
        kills.append(log.read_text().count("shipped graph-events-"))
    memstream("ship-graph-logs", str(logs), "--once", "--offsets", str(tmp_path / "unused-offsets.json"))  # the last restart

    keys = {gid.encode() for gid in lines}
    committed = read_to_end(stack, catalog.GRAPH_EVENTS, keys)  # read_committed, as a reader must
    per_id = Counter(m["headers"][HEADER_LINE_ID].decode() for m in committed)
    all_ids = {i for p in files.values() for i in expected_ids(p)}
    assert len(all_ids) == 3000
    assert len(committed) == 3000, f"{len(committed)} records for 3,000 lines"
    assert set(per_id) == all_ids, "a line was lost across the kills"
    assert set(per_id.values()) == {1}, "a line was delivered twice"
    for gid in lines:  # in file order, per graph
        mine = [m["headers"][HEADER_SOURCE_OFFSET] for m in committed if m["key"] == gid.encode()]
        assert [int(o) for o in mine] == sorted(int(o) for o in mine)
    everything = read_to_end(stack, catalog.GRAPH_EVENTS, keys, isolation="read_uncommitted")
    print(f"\n[shipper] SIGKILLed after {kills} committed batches of 10 lines; read_committed: {len(committed)} "
          f"records for 3,000 lines; read_uncommitted also sees {len(everything) - len(committed)} aborted copies")

    # a transaction that never commits: a read_committed worker must not apply it
    ghost = Producer({"bootstrap.servers": stack.broker, "transactional.id": f"test-ghost-{unique}",
                      "partitioner": "murmur2_random", "log_level": 0})
    ghost.init_transactions(30)
    ghost.begin_transaction()
    codec = codecs(stack).codec("graph_event")
    extra = dict(samples.graph_run(1, graph_id=runs[0].graph_id).events[0])
    ghost.produce(catalog.GRAPH_EVENTS, key=runs[0].graph_id.encode(), value=codec.encode(extra),
                  headers=[(HEADER_LINE_ID, f"ghost-{unique}".encode())])
    ghost.flush(30)
    ghost.abort_transaction(30)

    app_id = f"it-ship-{unique}"
    with worker(stack, f"shipper-{unique}", env={"MEMSTREAM_APP_ID": app_id}, from_start=True):
        deadline = time.monotonic() + 120
        while True:
            states = {m["key"].decode(): m["value"] for m in read_to_end(stack, catalog.GRAPH_STATE, keys)}
            counts = {gid: states[gid]["eventCount"] for gid in lines if gid in states}
            if counts == {gid: 1000 for gid in lines}:
                break
            assert time.monotonic() < deadline, f"graph states not at 1,000 events each: {counts}"
            time.sleep(1)
        time.sleep(2)  # anything past the aborted record would show now
        states = {m["key"].decode(): m["value"] for m in read_to_end(stack, catalog.GRAPH_STATE, keys)}
    assert {gid: states[gid]["eventCount"] for gid in lines} == {gid: 1000 for gid in lines}


def test_a_second_shipper_with_the_same_id_fences_the_first(stack, unique, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_follower(logs, tmp_path / "o.json", first_log)
    second = None
    try:
        wait_for(lambda: "watching" in first_log.read_text(), 60, "the first shipper to start", first, first_log)
        second = start_follower(logs, tmp_path / "o.json", second_log)
        wait_for(lambda: "watching" in second_log.read_text(), 60, "the second shipper to start", second, second_log)
        run = samples.graph_run(78, graph_id=f"g-fence-{unique}")
        paths = samples.write_run_files(logs, [run])  # both see it; only the second may commit
        assert first.wait(60) != 0
        assert "took over (producer fenced)" in first_log.read_text()
        ids = set(expected_ids(paths[run.graph_id]))
        wait_for(lambda: "shipped graph-events-" in second_log.read_text(), 60, "the second to ship", second, second_log)
    finally:
        stop(first)
        if second is not None:
            stop(second)
    events = read_to_end(stack, catalog.GRAPH_EVENTS, {run.graph_id.encode()})
    assert sorted(m["headers"][HEADER_LINE_ID].decode() for m in events) == sorted(ids)


def test_follow_mode_picks_up_a_new_file_and_stops_cleanly_on_sigterm(stack, unique, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    offsets, log = tmp_path / "offsets.json", tmp_path / "shipper.log"
    proc = start_follower(logs, offsets, log)
    try:
        wait_for(lambda: "watching" in log.read_text(), 30, "the shipper to start", proc, log)
        run = samples.graph_run(77, graph_id=f"g-new-{unique}")
        paths = samples.write_run_files(logs, [run])  # created after the shipper started
        ids = set(expected_ids(paths[run.graph_id]))
        got = consume(stack, catalog.GRAPH_EVENTS, decode=False,  # the topic also holds other tests' garbage
                      until=lambda out: ids <= {m["headers"].get(HEADER_LINE_ID, b"").decode() for m in out})
        codec = codecs(stack).codec("graph_event")
        assert [codec.decode(m["raw"]) for m in got if m["key"] == run.graph_id] == run.events
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        stop(proc)
    text = log.read_text()
    assert "received SIGTERM" in text and "stopped:" in text and "Traceback" not in text
