"""The graph-log shipper's logic, without Kafka: a fake sink stands in for the producer.
(The Kafka behaviour itself — delivery, restart, the graph agent's dedupe — is in
tests/tools/test_shipper_kafka.py against the real broker.)"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory, decode_key
from streams.graphs import samples
from streams.graphs import state as graph_state
from streams.graphs.paths import graph_events_path
from streams.graphs.shipper_state import HEADER_LINE_ID, Position, line_id
from streams.settings import Settings
from streams.tools import cli
from streams.tools import shipper as shipper_module
from streams.tools.shipper import (
    DeliveryError,
    RecordTooLargeError,
    Shipper,
    ShipperError,
    default_offsets_path,
    open_shipper,
    ship_directory,
)

CODECS = CodecFactory.from_url("")  # no registry: single-object encoding
EVENTS = CODECS.codec("graph_event")
DLQ = CODECS.codec("dead_letter")


class FakeSink:
    """Records what was produced; `commit` moves records from pending to delivered together with
    the position changes (a transaction), or fails and delivers nothing."""

    def __init__(self, fail_on_commit: set[int] | None = None):
        self.pending: list[dict] = []
        self.delivered: list[dict] = []
        self.aborted: list[dict] = []
        self.committed: dict[str, Position] = {}
        self.commits = 0
        self.loads = 0
        self.fail_on_commit = fail_on_commit or set()
        self.positions_at_commit: list[dict] = []
        self.max_bytes = 100_000

    def load_positions(self):
        self.loads += 1
        return dict(self.committed)

    def produce(self, topic, key, value, headers):
        if len(value) > self.max_bytes:
            raise RecordTooLargeError(f"{len(value)} bytes exceed the producer's message.max.bytes")
        self.pending.append({"topic": topic, "key": key, "value": value, "headers": dict(headers)})

    def commit(self, changes):
        self.commits += 1
        self.positions_at_commit.append(dict(self.committed))
        if self.commits in self.fail_on_commit:
            raise DeliveryError("1 record(s) not delivered: broker went away")
        self.delivered += self.pending
        self.pending.clear()
        for name, position in changes.items():
            if position is None:
                self.committed.pop(name, None)
            else:
                self.committed[name] = position

    def abort(self):
        self.aborted += self.pending
        self.pending.clear()

    def events(self):
        return [m for m in self.delivered if m["topic"] == catalog.GRAPH_EVENTS]

    def dead_letters(self):
        return [m for m in self.delivered if m["topic"] == catalog.DLQ]


def make_shipper(directory, sink, batch_lines=500):
    return Shipper(directory, sink, CODECS, batch_lines=batch_lines)


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
    shipper = make_shipper(tmp_path / "logs", sink)
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
        assert sink.committed[name].offset == os.path.getsize(paths[run.graph_id])
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
    shipper = make_shipper(tmp_path, sink)
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
    report = make_shipper(tmp_path, sink).ship_once()
    assert report.events == len(run.events) and report.dead_letters == len(bad) + 1
    assert report.batches[0].blank == 1
    letters = sink.dead_letters()
    data = open(path, "rb").read()
    for m, (line, kind) in zip(letters[:-1], bad, strict=True):  # the last: the wrong file, below
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
    report = make_shipper(tmp_path, sink).ship_once()
    assert report.events == 2 and report.dead_letters == 1
    rec = DLQ.decode(sink.dead_letters()[0]["value"])
    assert rec["error_class"] == "ship.too_large" and "too large" in rec["reason"]
    assert len(rec["original_value"]) == 64 * 1024 and "first 65536 of" in rec["reason"]
    write(path, "{" * 200_000 + "\n")  # a huge hostile line (refused by its nesting, unparsed): cut to fit as well
    report = make_shipper(tmp_path, sink).ship_once()
    rec = DLQ.decode(sink.dead_letters()[1]["value"])
    assert rec["error_class"] == "ship.limit.json_depth" and len(rec["original_value"]) == 64 * 1024
    assert "200000 levels deep; MEMSTREAM_MAX_JSON_DEPTH is 64" in rec["reason"]


def test_each_batch_commits_its_lines_with_the_files_position(tmp_path):
    run = samples.graph_run(4, graph_id="g-batches", nodes=12)
    path = graph_events_path(tmp_path, run.graph_id)
    name = os.path.basename(path)
    write(path, "".join(run.lines()))
    sink = FakeSink()
    report = make_shipper(tmp_path, sink, batch_lines=7).ship_once()
    n = len(run.events)
    assert [b.lines for b in report.batches] == [7] * (n // 7) + ([n % 7] if n % 7 else [])
    assert sink.commits == len(report.batches)  # one transaction per batch
    # each transaction moves the position from the previous batch's end to its own
    ends = [0] + [b.end for b in report.batches]
    seen = [pos[name].offset if name in pos else 0 for pos in sink.positions_at_commit]
    assert seen == ends[:-1] and sink.committed[name].offset == ends[-1]
    assert all(b.start == e for b, e in zip(report.batches, ends[:-1], strict=True))


def test_a_failed_transaction_delivers_nothing_and_the_batch_is_resent(tmp_path):
    run = samples.graph_run(6, graph_id="g-retry", nodes=10)
    path = graph_events_path(tmp_path, run.graph_id)
    write(path, "".join(run.lines()))
    name = os.path.basename(path)
    sink = FakeSink(fail_on_commit={2})
    shipper = make_shipper(tmp_path, sink, batch_lines=5)
    with pytest.raises(DeliveryError):
        shipper.ship_once()
    assert len(sink.events()) == 5 and sink.committed[name].offset == len("".join(run.lines()[:5]).encode())
    assert len(sink.aborted) == 5  # the second batch was aborted
    loads = sink.loads
    shipper.ship_once()  # e.g. the follow loop's retry
    assert sink.loads == loads + 1  # the positions were read back before shipping again
    assert [EVENTS.decode(m["value"]) for m in sink.events()] == run.events  # nothing lost, none twice


def test_a_kill_before_the_commit_ships_that_batch_exactly_once(tmp_path, monkeypatch):
    run = samples.graph_run(12, graph_id="g-crash", nodes=10)
    path = graph_events_path(tmp_path, run.graph_id)
    write(path, "".join(run.lines()))
    sink = FakeSink()
    real_commit = FakeSink.commit

    def killed_at_third_commit(self, changes):
        if self.commits == 2:
            raise SystemExit("killed mid-transaction")
        real_commit(self, changes)

    monkeypatch.setattr(FakeSink, "commit", killed_at_third_commit)
    with pytest.raises(SystemExit):
        make_shipper(tmp_path, sink, batch_lines=6).ship_once()
    monkeypatch.setattr(FakeSink, "commit", real_commit)
    sink.pending.clear()  # the restart's init_transactions aborts the open transaction
    make_shipper(tmp_path, sink, batch_lines=6).ship_once()  # the restart reads the positions back
    ids = [m["headers"][HEADER_LINE_ID] for m in sink.events()]
    assert len(ids) == len(set(ids)) == len(run.events)  # every line once
    assert materialize(sink.events())[run.graph_id]["eventCount"] == run.expected["eventCount"]


def test_truncated_and_replaced_files_are_read_again_from_the_start(tmp_path, caplog):
    run = samples.graph_run(2, graph_id="g-trunc")
    path = graph_events_path(tmp_path, run.graph_id)
    lines = run.lines()
    write(path, "".join(lines))
    sink = FakeSink()
    shipper = make_shipper(tmp_path, sink)
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
    shipper = make_shipper(tmp_path, sink)
    shipper.ship_once()
    write(tmp_path / "notes.txt", "not a graph log\n")  # ignored: not a graph-events file
    paths = samples.write_run_files(tmp_path, [b])
    assert shipper.ship_once().events == len(b.events)
    os.unlink(paths["g-b"])
    shipper.ship_once()
    assert set(sink.committed) == {os.path.basename(graph_events_path(tmp_path, "g-a"))}


def test_follow_mode_ships_new_files_until_stopped(tmp_path):
    sink = FakeSink()
    shipper = make_shipper(tmp_path, sink)
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
    sink = FakeSink(fail_on_commit={1})
    shipper = make_shipper(tmp_path, sink)
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
        make_shipper(tmp_path, FakeSink(), batch_lines=513)
    s = Settings(registry_url="", shipper_offsets_dir=str(tmp_path / "state"))
    with pytest.raises(ShipperError, match="does not exist"):
        ship_directory(tmp_path / "missing", s)
    p = default_offsets_path(s, tmp_path)
    assert p.startswith(str(tmp_path / "state")) and p.endswith(".offsets.json")
    assert default_offsets_path(s, tmp_path) == p != default_offsets_path(s, tmp_path / "x")
    assert shipper_module.default_shipper_id(tmp_path / "a b").startswith("a_b-")
    with pytest.raises(ShipperError, match="shipper id 'a/b' must be"):
        with open_shipper(tmp_path, s, sink=FakeSink(), shipper_id="a/b"):
            pass
    bad = tmp_path / "bad.json"
    bad.write_text("{ torn")
    with pytest.raises(ShipperError, match="not a valid offsets file"):
        with open_shipper(tmp_path, s, str(bad), sink=FakeSink()):
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


def test_an_old_offsets_file_is_imported_once_then_renamed(tmp_path):
    run = samples.graph_run(1, graph_id="g-json")
    paths = samples.write_run_files(tmp_path / "logs", [run])
    name = os.path.basename(paths["g-json"])
    half = len("".join(run.lines()[:3]).encode())
    s = Settings(registry_url="", shipper_offsets_dir=str(tmp_path / "state"))
    old = default_offsets_path(s, tmp_path / "logs")  # where the offsets-file shipper kept it
    os.makedirs(os.path.dirname(old))
    with open(old, "w") as f:
        json.dump({"version": 1, "files": {name: {"inode": os.stat(paths["g-json"]).st_ino, "offset": half}}}, f)
    sink = FakeSink()
    with open_shipper(tmp_path / "logs", s, sink=sink) as shipper:
        assert sink.committed[name].offset == half  # imported in one transaction
        shipper.ship_once()
    assert [EVENTS.decode(m["value"]) for m in sink.events()] == run.events[3:]  # not re-shipped
    assert not os.path.exists(old) and os.path.exists(old + ".imported")
    # once Kafka holds positions, an offsets file is ignored (with a warning)
    with open(old, "w") as f:
        json.dump({"version": 1, "files": {name: {"inode": 1, "offset": 0}}}, f)
    with open_shipper(tmp_path / "logs", s, sink=sink) as shipper:
        assert shipper.ship_once().lines == 0
    assert os.path.exists(old)


# ----------------------------------------------------------------------- a fenced producer stops
class _FatalLater:
    """A producer whose fatal error's cause arrives a few polls after produce() said "_FATAL":
    raised by poll() (`raise_cause`) or handed to the error callback (`sink`)."""

    def __init__(self, cause, raise_cause: bool, sink=None) -> None:
        self.cause, self.raise_cause, self.sink, self.polls = cause, raise_cause, sink, 0

    def poll(self, timeout: float) -> int:
        from confluent_kafka import KafkaException

        self.polls += 1
        if self.polls >= 3:
            if self.raise_cause:
                raise KafkaException(self.cause)
            self.sink._on_error(self.cause)
        return 0


@pytest.mark.parametrize("raise_cause", [True, False], ids=["cause-raised-by-poll", "cause-in-error-callback"])
def test_a_fatal_produce_error_waits_for_its_cause_and_stops_a_fenced_shipper(raise_cause):
    from confluent_kafka import KafkaError

    sink = shipper_module.KafkaSink("127.0.0.1:1", "fence-me", CODECS)
    fenced = KafkaError(KafkaError._FENCED, "This instance has been fenced by a newer instance", fatal=True)
    sink._producer = _FatalLater(fenced, raise_cause, sink)
    with pytest.raises(shipper_module.FencedError, match="took over"):
        sink._fail("could not produce", KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))
    assert sink._producer.polls >= 3  # it waited for the cause instead of starting a new producer


def test_a_fatal_error_with_another_cause_is_a_delivery_error_not_fenced():
    from confluent_kafka import KafkaError

    sink = shipper_module.KafkaSink("127.0.0.1:1", "not-fenced", CODECS)
    cause = KafkaError(KafkaError._GAPLESS_GUARANTEE, "gap in sequence", fatal=True)
    sink._producer = _FatalLater(cause, True, sink)
    with pytest.raises(DeliveryError, match="gap in sequence"):
        sink._fail("could not produce", KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))
