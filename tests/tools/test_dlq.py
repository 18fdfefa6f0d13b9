"""Pure parts of `memstream dlq` (streams/tools/dlq.py): no broker."""

from __future__ import annotations

import json

import pytest

from streams.contracts import catalog
from streams.tools import cli
from streams.tools import dlq as ops
from streams.tools.dlq import DeadLetter, Filter
from streams.tools.kafkatools import OpsError


def letter(p=0, o=0, topic=catalog.GRAPH_EVENTS, stage="decode", cls="UnknownMagicByteError", value=b"v",
           key=b"g-1", failed_at=1000, reason="bad\nbytes") -> DeadLetter:
    return DeadLetter.from_record(p, o, {
        "original_topic": topic, "original_partition": 3, "original_offset": 40 + o, "original_key": key,
        "original_value": value, "stage": stage, "reason": reason, "error_class": cls, "failed_at": failed_at,
        "worker": "w:1"})


def test_parse_offsets_keeps_order_drops_repeats_and_refuses_garbage():
    assert ops.parse_offsets("0:12, 3:4,0:12,") == [(0, 12), (3, 4)]
    for bad in ("", "7", "a:1", "1:-2", "1:2:3", " , "):
        with pytest.raises(OpsError):
            ops.parse_offsets(bad)


def test_filter_matches_every_given_field():
    d = letter()
    assert Filter()(d) and Filter(topic=catalog.GRAPH_EVENTS, stage="decode")(d)
    assert not Filter(topic=catalog.MEMORY_EVENTS)(d)
    assert not Filter(stage="validate")(d)
    assert Filter(error_class="UnknownMagicByteError")(d) and not Filter(error_class="X")(d)


def test_most_recent_orders_by_failure_time_and_limits():
    ds = [letter(0, 5, failed_at=30), letter(1, 0, failed_at=10), letter(2, 9, failed_at=20)]
    assert [d.failed_at for d in ops.most_recent(ds, None)] == [10, 20, 30]
    assert [d.failed_at for d in ops.most_recent(ds, 2)] == [20, 30]
    assert ops.most_recent(ds, 0) == []


def test_line_and_json_name_source_stage_class_reason_and_key():
    line = ops.format_line(letter(2, 7))
    assert line.startswith("2:7  ") and "graph.events.v1[3]@47" in line
    assert "stage=decode" in line and "class=UnknownMagicByteError" in line and "key=g-1" in line
    assert line.endswith("bad bytes") and "\n" not in line  # a multi-line reason stays one line
    assert "value withheld" in ops.format_line(letter(value=None))
    assert ops.key_text(b"\xff\x00") == "0xff00" and ops.key_text(None) == "<none>"
    doc = ops.to_json(letter(value=None))
    assert doc["replayable"] is False and doc["value_bytes"] is None and doc["key"] == "g-1"
    assert json.dumps(doc)


def test_replay_blocks_files_withheld_values_and_the_dlq_itself():
    assert letter().replay_block() is None
    assert letter(topic="file:graph-events-ab.ndjson").replay_block().startswith("from a file:")
    assert letter(value=None).replay_block().startswith("value withheld:")
    dropped = letter(value=b"12345").without_value()  # listed without its bytes: still replayable
    assert dropped.replay_block() is None and dropped.value_size == 5 and "(5 B)" in ops.format_line(dropped)
    assert letter(topic=catalog.DLQ).replay_block()


def test_plan_replay_selects_skips_orders_and_reports_missing_offsets():
    ds = [letter(1, 9, cls="A"), letter(0, 2, cls="B"), letter(0, 3, cls="A", value=None),
          letter(2, 1, cls="A", topic="file:x.ndjson"), letter(3, 3, cls="A", topic="gone.v1")]
    existing = {catalog.GRAPH_EVENTS}
    plan = ops.plan_replay(ds, select_all=True, existing_topics=existing)
    assert [d.coords for d in plan.send] == ["0:2", "1:9"]  # original offset order (42 before 49)
    assert sorted(d.coords for d, _ in plan.skipped) == ["0:3", "2:1", "3:3"]
    assert "does not exist" in dict((d.coords, w) for d, w in plan.skipped)["3:3"]
    assert plan.summary_of_skips() == "1 value withheld, 1 from a file, 1 topic missing"
    plan = ops.plan_replay(ds, error_class="A", existing_topics=existing)
    assert [d.coords for d in plan.send] == ["1:9"] and len(plan.skipped) == 3
    plan = ops.plan_replay(ds, offsets=[(0, 2), (5, 5), (0, 3)], existing_topics=existing)
    assert [d.coords for d in plan.send] == ["0:2"] and plan.missing == [(5, 5)]
    assert [d.coords for d, _ in plan.skipped] == ["0:3"]
    plan = ops.plan_replay(ds, select_all=True, narrow=Filter(stage="validate"))
    assert plan.send == [] and plan.skipped == []
    for bad in ({}, {"select_all": True, "error_class": "A"}):
        with pytest.raises(OpsError):
            ops.plan_replay(ds, **bad)


def test_cli_refuses_bad_replay_options_in_one_line(capsys):
    assert cli.main(["dlq", "replay", "--offsets", "zero:1"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PARTITION:OFFSET" in err[0]
    with pytest.raises(SystemExit):  # argparse: one selection is required
        cli.main(["dlq", "replay", "--dry-run"])
