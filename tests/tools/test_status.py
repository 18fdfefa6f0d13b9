"""Pure parts of `memstream status` (streams/tools/status.py): no broker."""

from __future__ import annotations

import zlib

from streams.tools import status as ops
from streams.tools.status import GroupStatus, Member, PartitionStatus


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
