"""The de-duplication window's compact persisted form (tail record + sealed chunks)."""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from streams.core.ingest import DedupWindow

DAY = 86_400_000


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 20 * DAY)), max_size=700),
       st.integers(1, 300), st.integers(1, 30), st.integers(1, 60), st.sampled_from([DAY, 7 * DAY, 30 * DAY]))
# an id evicted (count bound) and added again: it is in an older chunk and in the tail
@example(adds=[(0, 0), (2, 0), (0, 0), (1, 0), (3, 0), (22, 5), (20, 9), (21, 0), (7, 0), (0, 2), (0, 28), (0, 0),
               (0, 7), (0, 14), (15, 12), (0, 13), (0, 9), (0, 11), (0, 10), (0, 9), (0, 8), (0, 7), (0, 6), (0, 5),
               (0, 4), (0, 3), (0, 0)], max_ids=8, chunk_size=8, flush_every=8, horizon=30 * DAY)
def test_tail_and_chunks_rebuild_the_same_window(adds, max_ids, chunk_size, flush_every, horizon):
    """Persist as the shell does (after every few adds: the tail record, sealed chunks written,
    dropped chunks deleted); a rebuild from what was persisted is the same window, and the
    store never keeps a chunk wholly outside it."""
    live = DedupWindow(max_ids, horizon, chunk_size)
    store: dict[int, list] = {}
    record = live.to_tail_record()
    for i, (n, ts) in enumerate(adds):
        live.add(f"id{n}", ts)
        if i % flush_every == 0 or i == len(adds) - 1:
            sealed, dropped = live.take_changes()
            store.update(sealed)
            for k in dropped:
                store.pop(k, None)
            record = live.to_tail_record()
    rebuilt = DedupWindow.from_tail_record(record, store, max_ids, horizon)
    assert list(rebuilt._ids.items()) == list(live._ids.items())
    assert (rebuilt.seq, rebuilt.high_water) == (live.seq, live.high_water)
    assert len(record["tail"]) < chunk_size
    first_retained = live.seq - len(live)
    assert all((k + 1) * chunk_size > first_retained for k in store)
    # and the rebuilt window persists on exactly like the live one
    live.add("next", 20 * DAY)
    rebuilt.add("next", 20 * DAY)
    assert live.take_changes() == rebuilt.take_changes()


def test_the_aux_record_stays_small_while_the_window_is_full():
    w = DedupWindow(2000, 7 * DAY)
    for i in range(5000):
        w.add(f"candidate-{i}", i)
        w.take_changes()
    assert len(w) == 2000 and len(w.to_tail_record()["tail"]) == 0  # 5000 = 50 full chunks
    w.add("one-more", 5000)
    assert [k for k, _ts in w.to_tail_record()["tail"]] == ["one-more"]


def test_a_user_persisted_with_another_chunk_size_keeps_it():
    """Users written with the old 100-id chunks (or a tail record that names no size, read as
    100) are rebuilt with their own size and go on sealing chunks of it; new users get the
    current SEEN_CHUNK_SIZE."""
    from streams.core.ingest import LEGACY_CHUNK_SIZE, SEEN_CHUNK_SIZE

    assert SEEN_CHUNK_SIZE != LEGACY_CHUNK_SIZE
    old = DedupWindow(10_000, 30 * DAY, LEGACY_CHUNK_SIZE)
    for i in range(250):
        old.add(f"id{i}", i)
    sealed, _ = old.take_changes()
    assert sorted(sealed) == [0, 1]
    for record in (old.to_tail_record(), {k: v for k, v in old.to_tail_record().items() if k != "chunk_size"}):
        rebuilt = DedupWindow.from_tail_record(record, sealed, 10_000, 30 * DAY)
        assert rebuilt.chunk_size == LEGACY_CHUNK_SIZE
        assert list(rebuilt._ids) == list(old._ids)
        for i in range(250, 300):
            rebuilt.add(f"id{i}", i)
        assert sorted(rebuilt.take_changes()[0]) == [2]  # ids 200..299: the third 100-id chunk
    assert DedupWindow().chunk_size == SEEN_CHUNK_SIZE


def test_a_tail_record_with_a_hostile_chunk_size_is_refused():
    import pytest

    for bad in (0, -5):
        with pytest.raises(ValueError, match="chunk_size"):
            DedupWindow.from_tail_record({"seq": 3, "tail": [], "chunk_size": bad}, {})
