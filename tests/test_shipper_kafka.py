"""The graph-log shipper against the real broker and registry: `memstream ship-graph-logs` as a
subprocess, its records read back with a plain consumer, and (for the restart case) a real
`memstream worker` materializing graph.state.v1 from what was shipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from streams import catalog
from streams.graphs import samples
from streams.graphs.paths import graph_events_filename, graph_events_path
from streams.graphs.shipper_state import HEADER_LINE_ID, line_id

from .conftest import ROOT, TEST_ENV, memstream
from .kafka_util import codecs, consume, read_to_end, worker

pytestmark = pytest.mark.kafka


# ------------------------------------------------------------------------------------ helpers
def wait_caught_up(settings, group: str, topic: str, timeout: float = 120.0) -> None:
    """Until consumer group `group` has committed the end of every partition of `topic` (Faust
    flushes its producer before it commits, so every output of those records is on the broker)."""
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        deadline = time.monotonic() + timeout
        while True:
            ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
            committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in parts], timeout=10)}
            lag = {p: end - max(committed[p], 0) for p, end in ends.items() if end - max(committed[p], 0) > 0}
            if not lag:
                return
            assert time.monotonic() < deadline, f"group {group} still behind on {topic}: {lag}"
            time.sleep(0.5)
    finally:
        c.close()


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
    for m, (line, kind) in zip(letters, bad):
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


def test_killed_shipper_resumes_without_losing_or_double_applying_a_line(stack, unique, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = [samples.graph_run(60 + k, graph_id=f"g-kill-{k}-{unique}", nodes=25) for k in range(3)]
    files = {r.graph_id: graph_events_path(logs, r.graph_id) for r in runs}
    offsets, log = tmp_path / "offsets.json", tmp_path / "shipper.log"
    pending = {r.graph_id: r.lines() for r in runs}

    def append(n: int) -> None:  # the recorder writing: n more lines to each graph's file
        for gid, lines in pending.items():
            with open(files[gid], "a", encoding="utf-8") as f:
                f.writelines(lines[:n])
            del lines[:n]

    append(10)
    proc = start_follower(logs, offsets, log, MEMSTREAM_SHIPPER_BATCH_LINES="5")
    try:
        # keep appending while it ships; SIGKILL it once a few batches are committed
        wait_for(lambda: (append(2) or True) and log.read_text().count("shipped graph-events-") >= 8,
                 60, "8 batches shipped", proc, log)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop(proc)
    at_kill = tmp_path / "offsets-at-kill.json"
    shutil.copy(offsets, at_kill)
    append(10_000)  # the recorder finishes meanwhile
    total = {gid: len(expected_ids(p)) for gid, p in files.items()}

    memstream("ship-graph-logs", str(logs), "--once", "--offsets", str(offsets))  # the restart
    keys = {r.graph_id.encode() for r in runs}
    first = Counter(m["headers"][HEADER_LINE_ID].decode() for m in read_to_end(stack, catalog.GRAPH_EVENTS, keys))
    all_ids = {i for p in files.values() for i in expected_ids(p)}
    assert set(first) == all_ids, "a line was lost across the kill"
    assert all(n <= 2 for n in first.values())  # at most the one batch between flush and commit again

    # a crash between flush and commit, made wide: put back the offsets as they were at the kill
    # and ship again — every line after that point goes out a second time, with the same id
    shutil.copy(at_kill, offsets)
    memstream("ship-graph-logs", str(logs), "--once", "--offsets", str(offsets))
    events = read_to_end(stack, catalog.GRAPH_EVENTS, keys)
    per_id = Counter(m["headers"][HEADER_LINE_ID].decode() for m in events)
    assert set(per_id) == all_ids and max(per_id.values()) >= 2, "the rewind re-sent lines"
    killed_at = {name: pos["offset"] for name, pos in json.loads(at_kill.read_text())["files"].items()}
    print(f"\n[shipper] killed at byte offsets {sorted(killed_at.values())} of files of "
          f"{sorted(os.path.getsize(p) for p in files.values())} bytes; restart re-sent "
          f"{sum(n - 1 for n in first.values())} line(s); rewind re-sent {len(events) - len(all_ids)}")

    # the graph agent applies each line once: eventCount = distinct lines, state as generated
    app_id = f"it-ship-{unique}"
    with worker(stack, f"shipper-{unique}", env={"MEMSTREAM_APP_ID": app_id}, from_start=True):
        wait_caught_up(stack, app_id, catalog.GRAPH_EVENTS)
    states = {}
    for m in read_to_end(stack, catalog.GRAPH_STATE, keys):
        states[m["key"].decode()] = m["value"]
    for run in runs:
        assert states[run.graph_id]["eventCount"] == total[run.graph_id] == len(run.events)
        assert states[run.graph_id]["phase"] == run.expected["phase"]
        assert states[run.graph_id]["budget"] == run.expected["budget"]


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
