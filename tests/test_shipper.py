"""The graph-log shipper's logic, without Kafka: a fake sink stands in for the producer.
(The Kafka behaviour itself — delivery, restart, the graph agent's dedupe — is in
tests/test_shipper_kafka.py against the real broker.)"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from streams import catalog, cli
from streams import shipper as shipper_module
from streams.graphs import samples, state as graph_state
from streams.graphs.paths import graph_events_path, parse_line
from streams.graphs.shipper_state import HEADER_LINE_ID, OffsetStore, line_id, load_offsets
from streams.settings import Settings
from streams.shipper import DeliveryError, RecordTooLargeError, Shipper, ShipperError, default_offsets_path, open_shipper, ship_directory
from streams.wire import CodecFactory, decode_key

CODECS = CodecFactory.from_url("")  # no registry: single-object encoding
EVENTS = CODECS.codec("graph_event")
DLQ = CODECS.codec("dead_letter")


class FakeSink:
    """Records what was produced; `flush` moves records from pending to delivered (or fails)."""

    def __init__(self, offsets_path=None, fail_on_flush: set[int] | None = None):
        self.pending: list[dict] = []
        self.delivered: list[dict] = []
        self.flushes = 0
        self.fail_on_flush = fail_on_flush or set()
        self.offsets_path = offsets_path
        self.offsets_at_flush: list[dict] = []
        self.max_bytes = 100_000

    def produce(self, topic, key, value, headers):
        if len(value) > self.max_bytes:
            raise RecordTooLargeError(f"{len(value)} bytes exceed the producer's message.max.bytes")
        self.pending.append({"topic": topic, "key": key, "value": value, "headers": dict(headers)})

    def flush(self):
        self.flushes += 1
        if self.offsets_path is not None:
            self.offsets_at_flush.append(dict(load_offsets(self.offsets_path)))
        if self.flushes in self.fail_on_flush:
            self.pending.clear()
            raise DeliveryError("1 record(s) not delivered: broker went away")
        self.delivered += self.pending
        self.pending.clear()

    def events(self):
        return [m for m in self.delivered if m["topic"] == catalog.GRAPH_EVENTS]

    def dead_letters(self):
        return [m for m in self.delivered if m["topic"] == catalog.DLQ]


def make_shipper(directory, offsets_path, sink, batch_lines=500):
    return Shipper(directory, sink, OffsetStore(offsets_path), CODECS, batch_lines=batch_lines)


def write(path, text, mode="a"):
    with open(path, mode, encoding="utf-8") as f:
        f.write(text)


def materialize(events: list[dict]) -> dict[str, dict]:
    """What the graph agent would make of the shipped records (dedupe by the line-id header)."""
    states: dict[str, dict] = {}
    for m in events:
        rec = EVENTS.decode(m["value"])
        key = decode_key(m["key"])
        states[key] = graph_state.apply(states.get(key), rec, None, event_id=m["headers"][HEADER_LINE_ID].decode())
    return {k: graph_state.to_record(v) for k, v in states.items()}


def test_ships_every_line_once_keyed_by_graph_with_its_line_id(tmp_path):
    runs = samples.graph_runs(11, 3)
    paths = samples.write_run_files(tmp_path / "logs", runs)
    sink = FakeSink()
    shipper = make_shipper(tmp_path / "logs", tmp_path / "offsets.json", sink)
    report = shipper.ship_once()
    assert report.events == sum(len(r.events) for r in runs) and report.dead_letters == 0
    for run in runs:
        mine = [m for m in sink.events() if m["key"] == run.graph_id.encode()]
        assert [EVENTS.decode(m["value"]) for m in mine] == run.events  # file order, all fields
        name = os.path.basename(paths[run.graph_id])
        offset, ids = 0, []
        for line in run.lines():
            ids.append(line_id(name, offset, line.rstrip("\n").encode()))
            offset += len(line.encode())
        assert [m["headers"][HEADER_LINE_ID].decode() for m in mine] == ids
        assert mine[3]["headers"]["memstream.source.file"] == name.encode()
        assert load_offsets(tmp_path / "offsets.json")[name].offset == os.path.getsize(paths[run.graph_id])
    # the graph agent's view equals the generator's expectation
    states = materialize(sink.events())
    for run in runs:
        assert states[run.graph_id]["eventCount"] == run.expected["eventCount"]
        assert states[run.graph_id]["phase"] == run.expected["phase"]
    # a second pass has nothing to send
    assert shipper.ship_once().lines == 0 and len(sink.delivered) == report.events


def test_appended_lines_and_a_half_written_line(tmp_path):
    run = samples.graph_run(5, graph_id="g-append")
    path = graph_events_path(tmp_path, run.graph_id)
    lines = run.lines()
    write(path, "".join(lines[:4]) + lines[4][:10])  # the 5th line is being written
    sink = FakeSink()
    shipper = make_shipper(tmp_path, tmp_path / "o.json", sink)
    assert shipper.ship_once().events == 4
    write(path, lines[4][10:] + "".join(lines[5:]))
    assert shipper.ship_once().events == len(lines) - 4
    assert [EVENTS.decode(m["value"]) for m in sink.events()] == run.events


def test_corrupt_blank_and_foreign_lines(tmp_path):
    run = samples.graph_run(8, graph_id="g-bad-lines")
    other = samples.graph_run(9, graph_id="g-someone-else")
    bad = samples.bad_lines(3, graph_id=run.graph_id)
    foreign = other.lines()[0]
    path = graph_events_path(tmp_path, run.graph_id)
    name = os.path.basename(path)
    write(path, run.lines()[0] + "\n" + "".join(line for line, _ in bad) + foreign + "".join(run.lines()[1:]))
    sink = FakeSink()
    report = make_shipper(tmp_path, tmp_path / "o.json", sink).ship_once()
    assert report.events == len(run.events) and report.dead_letters == len(bad) + 1
    assert report.batches[0].blank == 1
    letters = sink.dead_letters()
    data = open(path, "rb").read()
    for m, (line, kind) in zip(letters, bad):
        rec = DLQ.decode(m["value"])
        assert rec["error_class"] == f"ship.{kind}"
        assert rec["original_topic"] == f"file:{name}" and rec["original_partition"] == -1
        assert rec["original_value"] == line.rstrip("\n").encode()
        assert data[rec["original_offset"]:].startswith(line.encode())  # the byte offset of the line
        assert rec["stage"] == "ship" and kind in rec["reason"] and "not a graph event" in rec["reason"]
        assert rec["original_key"] is None and m["key"] == name.encode()
        assert m["headers"]["__connect.errors.topic"] == f"file:{name}".encode()
        assert m["headers"]["__connect.errors.stage"] == b"ship"
        assert m["headers"]["__connect.errors.exception.class.name"] == f"ship.{kind}".encode()
    wrong = DLQ.decode(letters[-1]["value"])
    assert wrong["error_class"] == "ship.wrong_file"
    assert "'g-someone-else' does not belong to " + name in wrong["reason"]
    assert wrong["original_value"] == foreign.rstrip("\n").encode()


def test_a_line_too_large_to_send_is_dead_lettered_with_its_start(tmp_path):
    run = samples.graph_run(13, graph_id="g-huge")
    huge = dict(run.events[1], agent="x" * 300_000)
    path = graph_events_path(tmp_path, run.graph_id)
    write(path, run.lines()[0] + json.dumps({k: v for k, v in huge.items() if v is not None}) + "\n" + run.lines()[2])
    sink = FakeSink()
    report = make_shipper(tmp_path, tmp_path / "o.json", sink).ship_once()
    assert report.events == 2 and report.dead_letters == 1
    rec = DLQ.decode(sink.dead_letters()[0]["value"])
    assert rec["error_class"] == "ship.too_large" and "too large" in rec["reason"]
    assert len(rec["original_value"]) == 64 * 1024 and "first 65536 of" in rec["reason"]
    write(path, "{" * 200_000 + "\n")  # a huge corrupt line: its dead letter is cut to fit as well
    report = make_shipper(tmp_path, tmp_path / "o.json", sink).ship_once()
    rec = DLQ.decode(sink.dead_letters()[1]["value"])
    assert rec["error_class"] == "ship.corrupt_json" and len(rec["original_value"]) == 64 * 1024


def test_batches_flush_before_the_offset_moves(tmp_path):
    run = samples.graph_run(4, graph_id="g-batches", nodes=12)
    path = graph_events_path(tmp_path, run.graph_id)
    name = os.path.basename(path)
    write(path, "".join(run.lines()))
    sink = FakeSink(offsets_path=tmp_path / "o.json")
    report = make_shipper(tmp_path, tmp_path / "o.json", sink, batch_lines=7).ship_once()
    n = len(run.events)
    assert [b.lines for b in report.batches] == [7] * (n // 7) + ([n % 7] if n % 7 else [])
    assert sink.flushes == len(report.batches)
    # at each flush the committed offset is still the previous batch's end
    ends = [0] + [b.end for b in report.batches]
    seen = [pos[name].offset if name in pos else 0 for pos in sink.offsets_at_flush]
    assert seen == ends[:-1]
    assert all(b.start == e for b, e in zip(report.batches, ends))


def test_failed_delivery_commits_nothing_and_the_batch_is_resent(tmp_path):
    run = samples.graph_run(6, graph_id="g-retry", nodes=10)
    path = graph_events_path(tmp_path, run.graph_id)
    write(path, "".join(run.lines()))
    name = os.path.basename(path)
    sink = FakeSink(fail_on_flush={2})
    shipper = make_shipper(tmp_path, tmp_path / "o.json", sink, batch_lines=5)
    with pytest.raises(DeliveryError):
        shipper.ship_once()
    first = load_offsets(tmp_path / "o.json")[name].offset
    assert len(sink.events()) == 5 and first == len("".join(run.lines()[:5]).encode())
    shipper.ship_once()  # e.g. the follow loop's retry, or the next run
    assert [EVENTS.decode(m["value"]) for m in sink.events()] == run.events  # nothing lost, in order


def test_crash_between_flush_and_commit_resends_with_the_same_ids(tmp_path, monkeypatch):
    run = samples.graph_run(12, graph_id="g-crash", nodes=10)
    path = graph_events_path(tmp_path, run.graph_id)
    write(path, "".join(run.lines()))
    sink = FakeSink()
    commits = {"n": 0}
    real_commit = OffsetStore.commit

    def crashing_commit(self, name, position):
        commits["n"] += 1
        if commits["n"] == 3:
            raise SystemExit("killed after flush, before commit")
        real_commit(self, name, position)

    monkeypatch.setattr(OffsetStore, "commit", crashing_commit)
    with pytest.raises(SystemExit):
        make_shipper(tmp_path, tmp_path / "o.json", sink, batch_lines=6).ship_once()
    monkeypatch.setattr(OffsetStore, "commit", real_commit)
    make_shipper(tmp_path, tmp_path / "o.json", sink, batch_lines=6).ship_once()  # the restart
    ids = [m["headers"][HEADER_LINE_ID] for m in sink.events()]
    assert len(ids) == len(run.events) + 6  # the third batch went out twice ...
    assert len(set(ids)) == len(run.events)  # ... with the same ids
    # ... so its effect is applied once
    assert materialize(sink.events())[run.graph_id]["eventCount"] == run.expected["eventCount"]


def test_truncated_and_replaced_files_are_read_again_from_the_start(tmp_path, caplog):
    run = samples.graph_run(2, graph_id="g-trunc")
    path = graph_events_path(tmp_path, run.graph_id)
    lines = run.lines()
    write(path, "".join(lines))
    sink = FakeSink()
    shipper = make_shipper(tmp_path, tmp_path / "o.json", sink)
    shipper.ship_once()
    write(path, lines[0], mode="w")  # truncated, one line rewritten
    with caplog.at_level("WARNING", logger="memstream.shipper"):
        report = shipper.ship_once()
    assert report.events == 1 and report.batches[0].restarted == "truncated"
    assert "truncated" in caplog.text
    os.replace(_write_new(tmp_path / "new.tmp", "".join(lines[:2])), path)  # rotated: a new inode
    report = shipper.ship_once()
    assert report.events == 2 and report.batches[0].restarted == "rotated"


def _write_new(path, text):
    write(path, text, mode="w")
    return path


def test_new_files_are_picked_up_and_vanished_files_forgotten(tmp_path):
    a, b = samples.graph_run(1, graph_id="g-a"), samples.graph_run(2, graph_id="g-b")
    samples.write_run_files(tmp_path, [a])
    sink = FakeSink()
    shipper = make_shipper(tmp_path, tmp_path / "o.json", sink)
    shipper.ship_once()
    write(tmp_path / "notes.txt", "not a graph log\n")  # ignored: not a graph-events file
    paths = samples.write_run_files(tmp_path, [b])
    assert shipper.ship_once().events == len(b.events)
    os.unlink(paths["g-b"])
    shipper.ship_once()
    assert set(load_offsets(tmp_path / "o.json")) == {os.path.basename(graph_events_path(tmp_path, "g-a"))}


def test_follow_mode_ships_new_files_until_stopped(tmp_path):
    sink = FakeSink()
    shipper = make_shipper(tmp_path, tmp_path / "o.json", sink)
    stop = threading.Event()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", shipper.follow(0.05, stop)))
    t.start()
    try:
        run = samples.graph_run(3, graph_id="g-follow")
        samples.write_run_files(tmp_path, [run])
        deadline = time.monotonic() + 10
        while len(sink.events()) < len(run.events) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive() and result["r"].stopped
    assert [EVENTS.decode(m["value"]) for m in sink.events()] == run.events


def test_follow_mode_retries_after_a_delivery_failure(tmp_path):
    run = samples.graph_run(7, graph_id="g-flaky")
    samples.write_run_files(tmp_path, [run])
    sink = FakeSink(fail_on_flush={1})
    shipper = make_shipper(tmp_path, tmp_path / "o.json", sink)
    stop = threading.Event()
    t = threading.Thread(target=shipper.follow, args=(0.05, stop))
    t.start()
    deadline = time.monotonic() + 10
    while len(sink.events()) < len(run.events) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(10)
    assert [EVENTS.decode(m["value"]) for m in sink.events()] == run.events


def test_settings_and_setup_errors(tmp_path):
    with pytest.raises(ShipperError, match="out of range"):
        make_shipper(tmp_path, tmp_path / "o.json", FakeSink(), batch_lines=513)
    s = Settings(registry_url="", shipper_offsets_dir=str(tmp_path / "state"))
    with pytest.raises(ShipperError, match="does not exist"):
        ship_directory(tmp_path / "missing", s)
    p = default_offsets_path(s, tmp_path)
    assert p.startswith(str(tmp_path / "state")) and p.endswith(".offsets.json")
    assert default_offsets_path(s, tmp_path) == p != default_offsets_path(s, tmp_path / "x")
    bad = tmp_path / "bad.json"
    bad.write_text("{ torn")
    with pytest.raises(ShipperError, match="not a valid offsets file"):
        with open_shipper(tmp_path, s, str(bad), sink=FakeSink()):
            pass
    with open_shipper(tmp_path, s, str(tmp_path / "o.json"), sink=FakeSink()):
        with pytest.raises(ShipperError, match="another ship-graph-logs"):
            with open_shipper(tmp_path, s, str(tmp_path / "o.json"), sink=FakeSink()):
                pass


def test_cli_reports_user_errors_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEMSTREAM_SHIPPER_OFFSETS_DIR", str(tmp_path / "state"))
    assert cli.main(["ship-graph-logs", str(tmp_path / "nope"), "--once"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith("memstream: error: graph log directory") and "\n" not in err
    monkeypatch.setenv("MEMSTREAM_BROKER", "127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(shipper_module, "BROKER_CHECK_TIMEOUT_S", 1.5)
    monkeypatch.setenv("MEMSTREAM_REGISTRY_URL", "")
    assert cli.main(["ship-graph-logs", str(tmp_path), "--once"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("memstream: error: cannot reach the Kafka broker at 127.0.0.1:9")


def test_offsets_file_is_the_documented_json(tmp_path):
    samples.write_run_files(tmp_path / "logs", [samples.graph_run(1, graph_id="g-json")])
    make_shipper(tmp_path / "logs", tmp_path / "o.json", FakeSink()).ship_once()
    doc = json.loads((tmp_path / "o.json").read_text())
    (name, pos), = doc["files"].items()
    assert doc["version"] == 1 and set(pos) == {"inode", "offset"}
    assert parse_line(open(tmp_path / "logs" / name, "rb").read().splitlines()[0])["graphId"] == "g-json"
