"""File-position bookkeeping for the graph-event shipper."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from streams.graphs import samples
from streams.graphs.paths import graph_events_path, parse_line
from streams.graphs.shipper_state import (
    Line,
    OffsetsFileError,
    Position,
    line_id,
    list_event_files,
    load_offsets,
    poll_file,
    position_from_record,
    position_key,
    position_record,
)
from streams.graphs.state import apply, to_record


def lines_text(lines):
    return [ln.data.decode("utf-8", "replace") for ln in lines]


def write(path, data, mode="ab"):
    with open(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def test_half_written_line_is_withheld_until_complete(tmp_path):
    p = tmp_path / "graph-events-aaaaaaaaaaaa.ndjson"
    write(p, '{"a":1}\n{"b":')
    b1 = poll_file(p, None)
    assert lines_text(b1.lines) == ['{"a":1}']
    off = b1.end_offset
    assert off == len('{"a":1}\n')
    b2 = poll_file(p, b1.position)
    assert b2.lines == [] and b2.position == b1.position  # still half-written: nothing shipped, offset unchanged
    write(p, '2}\n{"c":3}\n')
    b3 = poll_file(p, b2.position)
    assert lines_text(b3.lines) == ['{"b":2}', '{"c":3}'] and not b3.restarted
    assert b3.end_offset == os.path.getsize(p)
    assert b3.lines[0] == Line(off, off + len('{"b":2}\n'), b'{"b":2}')


def test_empty_and_missing_files(tmp_path):
    p = tmp_path / "x.ndjson"
    assert poll_file(p, None) is None
    assert poll_file(p, Position(11, 17)) is None
    write(p, "")
    empty = poll_file(p, None)
    assert empty.lines == [] and empty.start_offset == empty.end_offset == 0 and not empty.restarted


def test_truncation_restarts_at_zero(tmp_path):
    p = tmp_path / "f.ndjson"
    write(p, "one\ntwo\nthree\n")
    first = poll_file(p, None)
    assert len(first.lines) == 3
    write(p, "new\n", mode="wb")  # truncated and rewritten (same inode), shorter than the offset
    assert os.stat(p).st_ino == first.inode
    batch = poll_file(p, first.position)
    assert batch.restarted and batch.reason == "truncated" and batch.start_offset == 0
    assert lines_text(batch.lines) == ["new"] and batch.end_offset == 4


def test_rotation_by_inode_change_restarts_at_zero(tmp_path):
    p = tmp_path / "f.ndjson"
    write(p, "a\nb\n")
    first = poll_file(p, None)
    assert lines_text(first.lines) == ["a", "b"] and not first.restarted
    # the path now names another file (rename over it), even a longer one
    other = tmp_path / "f.ndjson.new"
    write(other, "x\ny\nz\n")
    os.replace(other, p)
    batch = poll_file(p, first.position)
    assert batch.restarted and batch.reason == "rotated"
    assert lines_text(batch.lines) == ["x", "y", "z"]
    assert batch.inode != first.inode


def test_poll_resumes_at_stored_position(tmp_path):
    p = tmp_path / "f.ndjson"
    write(p, "a\nb\n")
    b1 = poll_file(p, None)
    write(p, "c\n")
    b2 = poll_file(p, b1.position)
    assert lines_text(b2.lines) == ["c"] and not b2.restarted and b2.start_offset == 4
    b3 = poll_file(p, b2.position)
    assert b3.lines == [] and b3.position == b2.position


def test_long_line_is_returned_whole_despite_max_bytes(tmp_path):
    p = tmp_path / "f.ndjson"
    long = "x" * 10_000
    write(p, long + "\nshort\n")
    first = poll_file(p, None, max_bytes=64)
    assert lines_text(first.lines)[0] == long
    rest = poll_file(p, first.position, max_bytes=64)
    assert lines_text(first.lines + rest.lines) == [long, "short"] and rest.end_offset == os.path.getsize(p)


def test_blank_lines_are_reported_as_blank(tmp_path):
    p = tmp_path / "f.ndjson"
    write(p, "a\n\n \nb\n")
    lines = poll_file(p, None).lines
    assert [ln.is_blank for ln in lines] == [False, True, True, False]


def test_position_records_round_trip_and_keys_do_not_collide():
    pos = Position(11, 120)
    rec = position_record("logs-0123456789ab", "graph-events-aaaaaaaaaaaa.ndjson", pos, 1_700_000_000_000)
    assert position_from_record(rec) == ("logs-0123456789ab", "graph-events-aaaaaaaaaaaa.ndjson", pos)
    key = position_key("logs-0123456789ab", "graph-events-aaaaaaaaaaaa.ndjson")
    assert key.rsplit("/", 1) == ["logs-0123456789ab", "graph-events-aaaaaaaaaaaa.ndjson"]
    # a file name never holds "/", so the last one splits any shipper id from the file
    assert position_key("a/b", "f").rsplit("/", 1) == ["a/b", "f"]


def test_an_old_offsets_file_is_read_for_import(tmp_path):
    off_path = tmp_path / "offsets.json"
    off_path.write_text(json.dumps({"version": 1, "files": {"graph-events-aaaaaaaaaaaa.ndjson": {"inode": 11, "offset": 120}}}))
    assert load_offsets(off_path) == {"graph-events-aaaaaaaaaaaa.ndjson": Position(11, 120)}
    assert load_offsets(tmp_path / "missing.json") == {}


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1}', b'{"version": 2, "files": {}}',
                                     b'{"version": 1, "files": {"f": {"inode": "1", "offset": 0}}}',
                                     b'{"version": 1, "files": {"f": {"inode": 1, "offset": -5}}}', b"\xff"])
def test_damaged_offsets_file_is_an_error_not_a_silent_reset(tmp_path, content):
    p = tmp_path / "offsets.json"
    p.write_bytes(content)
    with pytest.raises(OffsetsFileError):
        load_offsets(p)


def test_line_ids_are_deterministic_and_distinct():
    a = line_id("graph-events-aaaaaaaaaaaa.ndjson", 0, b'{"x":1}')
    assert a == line_id("graph-events-aaaaaaaaaaaa.ndjson", 0, b'{"x":1}')
    assert len(a) == 32
    assert a != line_id("graph-events-aaaaaaaaaaaa.ndjson", 8, b'{"x":1}')  # same bytes, other place
    assert a != line_id("graph-events-bbbbbbbbbbbb.ndjson", 0, b'{"x":1}')
    assert a != line_id("graph-events-aaaaaaaaaaaa.ndjson", 0, b'{"x":2}')


def test_list_event_files(tmp_path):
    for name in ["graph-events-0123456789ab.ndjson", "graph-events-ffffffffffff.ndjson", "offsets.json",
                 "graph-events-short.ndjson", "graph-events-0123456789ab.ndjson.tmp"]:
        (tmp_path / name).write_text("")
    assert [os.path.basename(p) for p in list_event_files(tmp_path)] == [
        "graph-events-0123456789ab.ndjson", "graph-events-ffffffffffff.ndjson"]
    assert list_event_files(tmp_path / "missing") == []


def _ship_once(directory, store, sink, crash_before_commit=False):
    """One pass of a shipper: read, 'produce' (append to sink), then commit the positions."""
    for path in list_event_files(directory):
        batch = poll_file(path, store.get(os.path.basename(path)))
        if batch is None:
            continue
        for line in batch.lines:
            sink.append((line_id(batch.name, line.start, line.data), line.data))
        if crash_before_commit:
            return
        store[batch.name] = batch.position


def test_lines_shipped_again_after_a_crash_carry_the_same_ids(tmp_path):
    """What a read_uncommitted reader sees after a kill mid-transaction: the aborted lines, then
    the same lines again; the line ids let the graph agent apply them once even then."""
    runs = samples.graph_runs(4, 3)
    samples.write_run_files(tmp_path / "logs", runs)
    store: dict = {}  # the committed positions
    sink = []
    _ship_once(tmp_path / "logs", store, sink, crash_before_commit=True)
    shipped_before_crash = list(sink)
    # restart: nothing was committed for the first file
    _ship_once(tmp_path / "logs", store, sink)
    _ship_once(tmp_path / "logs", store, sink)  # a further pass ships nothing new
    ids = [i for i, _ in sink]
    assert len(ids) == sum(len(r.events) for r in runs) + len(shipped_before_crash)
    assert set(ids[: len(shipped_before_crash)]) <= set(ids[len(shipped_before_crash):])
    # downstream, applying with the line ids as event ids dedupes the re-shipped lines
    states = {}
    for i, data in sink:
        e = parse_line(data)
        states[e["graphId"]] = apply(states.get(e["graphId"]), e, 60_000, event_id=i)
    for run in runs:
        rec = to_record(states[run.graph_id])
        assert rec["eventCount"] == len(run.events)
        assert rec["degradedNotifications"] == run.expected["degradedNotifications"]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(1, 200), min_size=1, max_size=40), st.data())
def test_shipping_while_the_writer_appends_in_arbitrary_chunks(tmp_path_factory, seed, cuts, data):
    d = tmp_path_factory.mktemp("ship")
    run = samples.graph_run(seed)
    content = "".join(run.lines()).encode()
    path = graph_events_path(d, run.graph_id)
    open(path, "wb").close()
    store: dict = {}  # the committed positions: all a fresh process knows
    shipped = []
    pos = 0
    for c in cuts + [len(content)]:
        chunk = content[pos:pos + c]
        pos += len(chunk)
        write(path, chunk)
        batch = poll_file(path, store.get(os.path.basename(path)), max_bytes=data.draw(st.integers(1, 512)))
        shipped.extend(batch.lines)
        store[batch.name] = batch.position
        if pos >= len(content):
            break
    # drain
    while True:
        batch = poll_file(path, store.get(os.path.basename(path)))
        if not batch.lines:
            break
        shipped.extend(batch.lines)
        store[batch.name] = batch.position
    assert [ln.data for ln in shipped] == [ln.rstrip("\n").encode() for ln in run.lines()]
    assert all(isinstance(parse_line(ln.data), dict) for ln in shipped)
    assert [ln.start for ln in shipped] == sorted({ln.start for ln in shipped})  # no line twice
