"""Golden-output test of the fast paths of the pure core (issue 14).

The fast paths — exact scan without MinHash signatures while a user has at most
``exact_scan_below`` live nodes, the per-node shingle cache, one hasher shared by every user,
hash tables built on first need, uuid5 computed without ``uuid.UUID`` objects — must change
nothing a consumer can see. The oracle is the *old path*, run in the same test (no stored
file: it would go stale whenever the consolidation arithmetic changes):

* ``IndexConfig(exact_scan_below=0)``: every query goes through the MinHash / hyperplane
  tables, hashed node by node as they are added (the old behaviour), no shingle cache;
* ids through :func:`uuid.uuid5` itself (the reference :func:`reference_uuid5_str`);
* a brute-force decider (every live node scored) as a second oracle.

Input: the bench's streams with fixed seeds — `streams.generate` (the e2e bench's mixed
stream: candidates and device events of many users, interleaved as the bench sends them) and
the consolidation bench's candidate mix (re-statements, one-word edits, new memories) for
users that grow past the exact-scan size, with and without embeddings. Compared: every
ledger event, relay event, node row (ids included), quarantine entry, rejection, the final
node records and aux record.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_consolidation import memory_text, near, one_word_edit, unit, vocabulary
from bench.bench_e2e import interleave
from streams import catalog, generate
from streams.core import DeterministicDecider, IndexConfig, UserMemory, ids, process_candidate, process_event
from streams.core.redaction import relay_events
from streams.core.similarity import MinHasher, shared_minhasher

OLD_INDEX = IndexConfig(exact_scan_below=0)


def reference_uuid5_str(name: str) -> str:
    return str(uuid.uuid5(ids.NAMESPACE, name))


def mixed_stream(users: int = 60, seed: int = 7) -> list[tuple[str, str, dict]]:
    items = interleave(generate.generate(seed=seed, users=users, kinds=("memory",)))
    return [(i.topic, i.key, i.value) for i in items if isinstance(i.value, dict)]


def growing_stream(seed: int, users: int, per_user: int, dim: int) -> list[tuple[str, str, dict]]:
    """The consolidation bench's mix for users that grow past the exact-scan size."""
    rnd = random.Random(seed)
    vocab = vocabulary(rnd, 300)  # a small vocabulary: many near-duplicates and contradictions
    out = []
    for u in range(users):
        user, said = f"grow-{u}", []
        for i in range(per_user):
            kind = rnd.randrange(3) if said else 2
            if kind == 0:
                text, emb = rnd.choice(said)
                emb = near(rnd, emb, 0.01) if emb else None
            elif kind == 1:
                base, emb = rnd.choice(said)
                text, emb = one_word_edit(rnd, base, vocab), (near(rnd, emb, 0.08) if emb else None)
            else:
                text, emb = memory_text(rnd, vocab), (unit(rnd, dim) if dim and rnd.random() < 0.8 else None)
            said.append((text, emb))
            out.append((catalog.MEMORY_CANDIDATES, user, {
                "candidate_id": f"{user}-c{i}", "motebit_id": user, "content": text, "sensitivity": "personal",
                "source": "user_stated", "memory_type": rnd.choice(["semantic", "semantic", "episodic"]),
                "timestamp": 1_700_000_000_000 + 1000 * i, "embedding": emb,
            }))
    return out


def run(stream: list[tuple[str, str, dict]], config: IndexConfig, decider=None) -> dict[str, Any]:
    """Every observable output of the core for the stream, per record, and the final state."""
    users: dict[str, UserMemory] = {}
    outputs = []
    for topic, key, record in stream:
        um = users.get(key)
        if um is None:
            um = users[key] = UserMemory(key, index_config=config)
        if topic == catalog.MEMORY_CANDIDATES:
            out = process_candidate(um, record, decider=decider)
        elif topic == catalog.MEMORY_EVENTS:
            out = process_event(um, record)
        else:
            continue
        relay = [r for ev in out.ledger
                 for r in relay_events(ev, "personal", um.deleted_node_ids, deleted_fingerprints=um.deleted_fingerprints)]
        outputs.append({
            "ledger": out.ledger, "relay": relay, "nodes": out.node_upserts, "deleted": out.node_deletions,
            "quarantined": out.quarantined, "rejections": [(r.code, r.detail, r.dead_letter) for r in out.rejections],
            "duplicate": out.duplicate, "decision": out.decision,
        })
    state = {u: (list(um.nodes()), um.aux_record()) for u, um in sorted(users.items())}
    return {"outputs": outputs, "state": state}


def old_path(stream, monkeypatch, decider=None) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setattr(ids, "uuid5_str", reference_uuid5_str)
        return run(stream, OLD_INDEX, decider)


def assert_same(new: dict, old: dict) -> None:
    assert len(new["outputs"]) == len(old["outputs"])
    for i, (a, b) in enumerate(zip(new["outputs"], old["outputs"])):
        assert a == b, f"record {i} differs"
    assert new["state"] == old["state"]


def test_the_mixed_stream_is_identical_on_the_old_and_the_new_path(monkeypatch):
    stream = mixed_stream()
    new = run(stream, IndexConfig())
    assert_same(new, old_path(stream, monkeypatch))
    actions = {o["decision"].action for o in new["outputs"] if o["decision"]}
    assert {"accept", "merge", "supersede", "reject"} <= actions  # the stream exercises every decision


@pytest.mark.parametrize("dim", [0, 8])
def test_users_growing_past_the_exact_scan_size_are_identical_on_the_old_and_the_new_path(monkeypatch, dim):
    stream = growing_stream(seed=20240601 + dim, users=3, per_user=90, dim=dim)
    new = run(stream, IndexConfig())
    old = old_path(stream, monkeypatch)
    assert_same(new, old)
    # and equal to scoring every live node (the decisions the spec defines)
    assert_same(new, old_path(stream, monkeypatch, DeterministicDecider(use_index=False)))
    live = [sum(1 for n in nodes if n["valid_until"] is None) for nodes, _ in new["state"].values()]
    assert max(live) > IndexConfig().exact_scan_below  # the users did grow past it
    actions = {o["decision"].action for o in new["outputs"] if o["decision"]}
    assert {"accept", "merge", "supersede"} <= actions


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 40))
def test_any_exact_scan_size_gives_the_outputs_of_the_old_path(seed, threshold):
    stream = growing_stream(seed=seed, users=1, per_user=60, dim=4)
    assert_same(run(stream, IndexConfig(exact_scan_below=threshold)), run(stream, OLD_INDEX))


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_uuid5_without_uuid_objects_equals_uuid5(name):
    assert ids.uuid5_str(name) == reference_uuid5_str(name)


def test_the_shared_hasher_equals_a_fresh_one():
    c = IndexConfig()
    fresh, shared = MinHasher(c.num_perm, c.seed), shared_minhasher(c.num_perm, c.seed)
    assert shared is shared_minhasher(c.num_perm, c.seed)
    assert (fresh._a == shared._a).all() and (fresh._b == shared._b).all()


def test_the_shingle_cache_is_bounded_by_the_exact_scan_size():
    cfg = IndexConfig(exact_scan_below=5)
    um = UserMemory("u", index_config=cfg)
    stream = growing_stream(seed=3, users=1, per_user=40, dim=0)
    hashed_before = False
    for _, _, rec in stream:
        process_candidate(um, {**rec, "motebit_id": "u"})
        assert len(um.index._shingles) <= cfg.exact_scan_below
        assert um.index.hashed or not hashed_before  # once built, the tables are kept in step
        hashed_before = um.index.hashed
    assert um.index.hashed and not um.index._shingles


def test_the_setting_reaches_the_index():
    from streams.settings import Settings

    assert Settings.from_env({"MEMSTREAM_EXACT_SCAN_NODES": "7"}).index_config().exact_scan_below == 7
    assert Settings().index_config() == IndexConfig()
