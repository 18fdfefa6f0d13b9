"""The re-partition rules (streams/core/repartition.py): where rows go, the digest, the moves of
compacted output topics, and the new group's offsets. Pure; the command on the broker is
tests/tools/test_repartition_kafka.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.agents import processors, table_owners
from streams.agents.memory_store import node_key, row_owner
from streams.analytics import classify_dead_letter, subject_owner
from streams.core import repartition as r
from streams.core.partitioning import partition_for

users = st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=8)
values = st.binary(min_size=1, max_size=6)


def owner_rows(draw_rows: list[tuple[str, str, bytes]], partitions: int) -> r.Rows:
    """A memory-state-like table on `partitions`: each row at its user's partition."""
    return {(partition_for(u.encode(), partitions), (node_key(u, rest) if rest else u).encode()): v
            for u, rest, v in draw_rows}


table_rows = st.lists(st.tuples(users, st.text(alphabet="xyz/~", max_size=5), values), max_size=40)


def test_destination_of_each_kind_of_owner():
    assert r.destination("u1", 3, 12) == partition_for(b"u1", 12)
    assert r.destination(5, 5, 12) == 5  # (unknown):5 stays on 5
    assert r.destination(None, 4, 12) == 4  # nothing owns it: it stays
    with pytest.raises(r.PlacementError, match="partition 12"):
        r.destination(12, 0, 12)


def test_the_owner_rules():
    assert row_owner("u1") == "u1" and row_owner(node_key("u1", "n/2")) == "u1" and row_owner("u1/~del/x") == "u1"
    assert subject_owner("u1") == "u1" and subject_owner("session:s/1") == "s/1" and subject_owner("graph:g") == "g"
    assert subject_owner("(unknown):3") == 3 and subject_owner("(unknown)") is None
    assert r.own_key("s-1") == "s-1"


def test_every_declared_table_has_an_owner_rule():
    assert set(table_owners()) == {s for p in processors() for s in p.stores}


def test_a_misrouted_dead_letter_counts_where_it_was_read():
    """A wrong_partition dead letter's key belongs on another partition: its increment goes to
    `(unknown):<p>` (a row under the key's name here would be one no worker publishes)."""
    def of(key: str) -> int:
        return partition_for(key.encode(), 6)

    letter = {"original_topic": "memory.events.v1", "original_key": b"u1", "original_partition": of("u1"),
              "original_offset": 7}
    assert classify_dead_letter(letter, 1000, partition_of=of)[0].subject == "u1"
    moved = {**letter, "original_partition": (of("u1") + 1) % 6}
    assert classify_dead_letter(moved, 1000, partition_of=of)[0].subject == f"(unknown):{(of('u1') + 1) % 6}"
    assert classify_dead_letter(moved, 1000)[0].subject == "u1"  # without the rule: as before


def test_digest_is_a_multiset_digest():
    a = r.Digest().add_rows({(0, b"k"): b"v", (1, b"j"): b"w"})
    b = r.Digest().add_rows({(5, b"j"): b"w", (2, b"k"): b"v"})
    assert a == b and a.rows == 2 and len(a.sha256) == 64
    assert a != r.Digest().add_rows({(0, b"k"): b"v", (1, b"j"): b"x"})
    assert a != r.Digest().add_rows({(0, b"k"): b"v"})
    # the length prefix: ("ab", "c") is not ("a", "bc")
    assert r.Digest().add_rows({(0, b"ab"): b"c"}) != r.Digest().add_rows({(0, b"a"): b"bc"})


def test_live_rows_keeps_the_latest_and_drops_tombstones():
    rows = r.live_rows([(0, b"a", b"1"), (0, b"b", b"x"), (0, b"a", b"2"), (0, b"b", None), (1, b"a", b"3")])
    assert rows == {(0, b"a"): b"2", (1, b"a"): b"3"}


@settings(max_examples=200, deadline=None)
@given(table_rows, st.integers(1, 8), st.integers(1, 8))
def test_a_table_placed_on_more_partitions_keeps_every_row_at_its_owner(rows, n, extra):
    m = n + extra
    before = owner_rows(rows, n)
    visible, orphans = r.split_visible(before, row_owner, n)
    assert visible == before and not orphans
    placed = r.place("memory-state", visible, row_owner, m)
    assert r.Digest().add_rows(placed) == r.Digest().add_rows(before)
    assert r.misplaced("memory-state", placed, row_owner, m) == []
    for (p, key) in placed:
        assert p == partition_for(row_owner(key.decode()).encode(), m)


def test_orphans_are_not_carried():
    """A row outside its owner's partition (an older version wrote it there) is no worker's:
    it stays behind, counted, and cannot collide with the user's real row."""
    home = partition_for(b"u1", 4)
    rows = {(home, b"u1"): b"real", ((home + 1) % 4, b"u1"): b"orphan"}
    visible, orphans = r.split_visible(rows, row_owner, 4)
    assert visible == {(home, b"u1"): b"real"} and orphans == {((home + 1) % 4, b"u1"): b"orphan"}
    with pytest.raises(r.PlacementError, match="live in two partitions"):
        r.place("memory-state", rows, row_owner, 8)  # placing both would lose one


def test_rows_no_key_owns_stay_and_pinned_rows_stay_on_their_partition():
    rows = {(2, b"(unknown)"): b"a", (3, b"(unknown):3"): b"b", (1, b"\xff\xfe"): b"c"}
    placed = r.place("analytics", rows, subject_owner, 12)
    assert placed == rows


compacted = st.dictionaries(st.binary(min_size=1, max_size=6), values, max_size=40)


@settings(max_examples=200, deadline=None)
@given(compacted, st.integers(1, 8), st.integers(1, 8), st.data())
def test_moving_a_compacted_topic_converges_from_any_interruption(by_key, n, extra, data):
    m = n + extra
    rows = {(partition_for(k, n), k): v for k, v in by_key.items()}
    final = r.after_move(rows, m)
    assert final == {(partition_for(k, m), k): v for k, v in by_key.items()}
    assert r.output_misplaced("t", final, m) == []
    assert r.after_move(final, m) == final and r.plan_move(final, m) == r.Move([], [])
    # interrupted: every put was written (the command flushes them first), some tombstones
    move = r.plan_move(rows, m)
    partial = dict(rows)
    for dest, k, v in move.puts:
        partial[(dest, k)] = v
    done = data.draw(st.integers(0, len(move.tombstones)))
    for p, k, _dest in move.tombstones[:done]:
        del partial[(p, k)]
    again = r.plan_move(partial, m)
    assert again.puts == []  # nothing is put twice over a row already at its place
    assert r.after_move(partial, m) == final


@settings(max_examples=100, deadline=None)
@given(compacted, st.integers(1, 6), st.integers(1, 6), st.data())
def test_a_move_planned_one_partition_at_a_time_is_the_whole_topic_s(by_key, n, extra, data):
    """The command reads one partition at a time, knowing only where every key is live
    (`live_keys`): the same puts, tombstones and final rows as a plan over the whole topic, from
    any state an interrupted run leaves."""
    m = n + extra
    rows = {(partition_for(k, n), k): v for k, v in by_key.items()}
    whole = r.plan_move(rows, m)
    done = data.draw(st.integers(0, len(whole.puts)))
    for dest, k, v in whole.puts[:done]:  # an earlier run put some rows, tombstoned none
        rows[(dest, k)] = v
    held = r.live_keys((p, k, v) for (p, k), v in sorted(rows.items()))
    assert held == {k: {p for (p, kk) in rows if kk == k} for k in {k for _p, k in rows}}
    by_partition: dict[int, r.Rows] = {}
    for (p, k), v in rows.items():
        by_partition.setdefault(p, {})[(p, k)] = v
    puts, tombstones, final = [], [], {}
    for p in sorted(by_partition):
        move = r.plan_move(by_partition[p], m, held)
        puts += move.puts
        tombstones += move.tombstones
        final.update(r.after_move(by_partition[p], m, held))
    assert sorted(puts) == sorted(r.plan_move(rows, m).puts) and sorted(tombstones) == sorted(r.plan_move(rows, m).tombstones)
    assert final == r.after_move(rows, m) == {(partition_for(k, m), k): v for k, v in by_key.items()}


def test_live_keys_follows_tombstones():
    assert r.live_keys([(0, b"a", b"1"), (1, b"a", b"1"), (0, b"a", None), (2, b"b", b"2")]) == {b"a": {1}, b"b": {2}}


def test_a_row_already_at_its_new_partition_wins():
    """A key written at its new partition since the raise (a shipper's position) is newer than
    the row left at the old one: the move only tombstones the old row."""
    key = next(k for k in (f"k{i}".encode() for i in range(100)) if partition_for(k, 2) != partition_for(k, 4))
    old, new = partition_for(key, 2), partition_for(key, 4)
    move = r.plan_move({(old, key): b"older", (new, key): b"newer"}, 4)
    assert move.puts == [] and move.tombstones == [(old, key, new)]
    assert r.after_move({(old, key): b"older", (new, key): b"newer"}, 4) == {(new, key): b"newer"}


def test_move_tombstones_are_recognised():
    assert r.is_move_tombstone([(r.MOVED_TO_HEADER, b"3")])
    assert r.is_move_tombstone({r.MOVED_TO_HEADER: b"3"})
    assert not r.is_move_tombstone(None) and not r.is_move_tombstone([("other", b"x")])


def test_the_new_group_starts_where_the_old_stopped_and_at_the_start_of_new_partitions():
    captured = {("t", 0): 10, ("t", 1): 7}
    low = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0, ("t", 3): 4}
    assert r.new_group_offsets(captured, low) == {("t", 0): 10, ("t", 1): 7, ("t", 2): 0, ("t", 3): 4}
