"""Pure parts of the operator commands (streams/tools/ops.py) and the ops views' registration: no broker."""

from __future__ import annotations

import json
import zlib

import pytest

from streams.contracts import catalog
from streams.tools import cli, ops
from streams.tools.ops import DeadLetter, Filter, GroupStatus, Member, OpsError, PartitionStatus


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


def test_faust_member_metadata_decodes_to_the_worker_url_and_its_partitions():
    # encoded exactly as faust's PartitionAssignor does (metadata: JSON; assignment: zlib(JSON))
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
    from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

    assignment = ClientAssignment(actives={"graph.events.v1": [0, 2]}, standbys={"app-graph-state-changelog": [1]})
    meta = ClientMetadata(assignment=assignment, url="http://w1:6066", changelog_distribution={})
    raw_meta = ConsumerProtocolMemberMetadata(4, ["graph.events.v1"], meta.dumps()).encode()
    raw_assign = ConsumerProtocolMemberAssignment(
        4, [("graph.events.v1", [0, 2]), ("app-graph-state-changelog", [1])], zlib.compress(meta.dumps())).encode()
    info = ops.decode_faust_metadata(raw_meta, raw_assign)
    assert info == {"url": "http://w1:6066", "actives": [("graph.events.v1", 0), ("graph.events.v1", 2)],
                    "standbys": [("app-graph-state-changelog", 1)]}
    assert ops.decode_faust_metadata(raw_meta, None) == {"url": "http://w1:6066"}


def test_workers_option_matches_answers_by_url_or_by_partitions():
    a = Member("m-a", "c", "/10.0.0.1", [("t", 0)], url="http://a:1")
    b = Member("m-b", "c", "/10.0.0.2", [("t", 1), ("t-changelog", 1)])  # URL unknown
    notes: list[str] = []
    answers = {"http://x:9/": {"status": "ready", "url": "http://b:2", "sources": ["t[1]"]},
               "http://y:9/": {"status": "ready", "url": "http://a:1", "sources": ["t[0]"]},
               "http://z:9/": {"status": "recovering", "url": "http://c:3", "sources": ["t[5]"]}}
    ops._match_workers([a, b], answers, notes)
    assert a.health["url"] == "http://a:1" and b.health["url"] == "http://b:2" and b.url == "http://b:2"
    assert notes and "http://z:9/" in notes[0]


def test_group_is_ok_only_with_members_all_ready_and_every_partition_owned():
    ready = Member("m", "c", "h", [], url="u", health={"status": "ready"})
    owned = PartitionStatus("t", 0, 5, 9, 0, "u")
    assert owned.lag == 4 and PartitionStatus("t", 1, None, 9, 2, "u").lag == 7  # uncommitted: from log start
    assert GroupStatus("g", "STABLE", [ready], [owned]).ok
    assert not GroupStatus("g", "EMPTY", [], [owned]).ok
    assert not GroupStatus("g", "STABLE", [ready], [owned, PartitionStatus("t", 1, 0, 0, 0, None)]).ok
    recovering = Member("m2", "c", "h", [], url="u2", health={"status": "recovering"})
    assert not GroupStatus("g", "STABLE", [ready, recovering], [owned]).ok
    text = ops.format_status(GroupStatus("g", "STABLE", [ready], [owned, PartitionStatus("t", 1, None, 0, 0, None)]))
    assert "1/2 input partitions assigned" in text and "UNASSIGNED" in text


def test_cli_refuses_bad_replay_options_in_one_line(capsys):
    assert cli.main(["dlq", "replay", "--offsets", "zero:1"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PARTITION:OFFSET" in err[0]
    with pytest.raises(SystemExit):  # argparse: one selection is required
        cli.main(["dlq", "replay", "--dry-run"])


def test_ops_views_are_registered_without_auth():
    from streams.api import health as ops_agent
    from streams.runtime.app import Runtime
    from streams.settings import Settings

    rt = Runtime(Settings(registry_url="", partitions=3, app_id="test-ops-views"))
    ops_agent.register(rt)
    views = rt.app.web.views
    assert {"/metrics", "/health"} <= set(views)
    for path in ("/metrics", "/health"):  # plain faust Views, not the bearer-token ApiView
        assert not isinstance(views[path], rt.View)


def fake_runtime(*, started=True, stopping=False, in_recovery=False, completed=True, rebalancing=False, remaining=0):
    from types import SimpleNamespace as NS

    from faust.types import TP

    class Event:
        def is_set(self):
            return completed

    recovery = NS(completed=Event(), in_recovery=in_recovery, active_remaining_total=lambda: remaining,
                  standby_remaining_total=lambda: 0)
    actives = {TP("graph.events.v1", 0), TP("app-graph-state-changelog", 0), TP("app-__assignor-__leader", 0)}
    app = NS(tables=NS(recovery=recovery, changelog_topics={"app-graph-state-changelog"}),
             rebalancing=rebalancing, should_stop=stopping, started=started, conf=NS(canonical_url="http://h:1"),
             assignor=NS(assigned_actives=lambda: actives, assigned_standbys=lambda: {TP("app-x-changelog", 1)}))
    return NS(app=app, worker_name="h:1")


@pytest.mark.parametrize("state, status, reason", [
    ({}, "ready", "1 source partitions"),
    ({"completed": False}, "starting", "first partition assignment"),
    ({"started": False, "completed": False}, "starting", "starting"),
    ({"in_recovery": True, "remaining": 42}, "recovering", "recovering: 42 offsets left"),
    ({"in_recovery": True, "completed": False, "remaining": 7, "rebalancing": True}, "recovering", "7 offsets left"),
    ({"rebalancing": True}, "rebalancing", "rebalancing"),
    ({"stopping": True}, "stopping", "shutting down"),
])
def test_health_is_ready_only_after_recovery_and_says_why_not(state, status, reason):
    from streams.api.health import health

    h = health(fake_runtime(**state))
    assert h.status == status and reason in h.reason and h.ready == (status == "ready")
    assert h.sources == ["graph.events.v1[0]"]  # no changelog, no leader topic
    assert (h.active_partitions, h.standby_partitions) == (3, 1)
