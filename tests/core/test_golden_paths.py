"""Golden-output test of the fast paths of the pure core (issue 14).

The fast paths — exact scan without MinHash signatures while a user has at most
``exact_scan_below`` live nodes, the per-node shingle cache, one hasher shared by every user,
hash tables built on first need, the vectorized exact Jaccard (``scored_candidates``), uuid5
computed without ``uuid.UUID`` objects — must change nothing a consumer can see. The oracle is
the *old path*, run in the same test (no stored file: it would go stale whenever the
consolidation arithmetic changes): :func:`old_path` — every node hashed as it is added, no
shingle cache, each Jaccard on two Python sets, ids through :func:`uuid.uuid5` — with the same
``IndexConfig``, and also hashing for every user (``exact_scan_below=0``, the behaviour before
the exact scan) and a brute-force decider (every live node scored) where every user stays small.

LSH is probabilistic: an exact scan can find a node that LSH misses, so the old path with
``exact_scan_below=0`` can differ from the new one with 32 when a user is small; that is why
the oracle for an exact-scan size is the old path with the same size.

Input: the bench's streams with fixed seeds — `streams.tools.generate` (the e2e bench's mixed
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
from streams.contracts import catalog
from streams.core import DeterministicDecider, IndexConfig, UserMemory, ids, process_candidate, process_event
from streams.core.redaction import relay_events
from streams.core.similarity import MinHasher, SimilarityIndex, shared_minhasher, text_shingles
from streams.tools import generate

OLD_INDEX = IndexConfig(exact_scan_below=0)


def reference_uuid5_str(name: str) -> str:
    return str(uuid.uuid5(ids.NAMESPACE, name))


def mixed_stream(users: int = 60, seed: int = 7) -> list[tuple[str, str, dict]]:
    items = generate.interleave(generate.generate(seed=seed, users=users, kinds=("memory",)))
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


def old_path(stream, monkeypatch, config: IndexConfig = OLD_INDEX, decider=None) -> dict[str, Any]:
    """The stream through the path before the fast paths: every node hashed as it is added,
    no shingle cache, each Jaccard on two sets, ids through uuid.uuid5."""
    original_add = SimilarityIndex.add

    def eager_add(self, node_id, text, embedding=None):
        original_add(self, node_id, text, embedding)
        if not self.hashed:
            self._build()

    with monkeypatch.context() as m:
        m.setattr(ids, "uuid5_str", reference_uuid5_str)
        m.setattr(SimilarityIndex, "add", eager_add)
        m.setattr(SimilarityIndex, "shingles_of", lambda self, node_id, text: text_shingles(text))
        m.setattr(
            SimilarityIndex, "scored_candidates",
            lambda self, text, embedding=None, shingles=None, text_floor=None: (self.candidates(text, embedding, shingles), {}),
        )
        return run(stream, config, decider)


def assert_same(new: dict, old: dict) -> None:
    assert len(new["outputs"]) == len(old["outputs"])
    for i, (a, b) in enumerate(zip(new["outputs"], old["outputs"], strict=True)):
        assert a == b, f"record {i} differs"
    assert new["state"] == old["state"]


def test_the_mixed_stream_is_identical_on_the_old_and_the_new_path(monkeypatch):
    stream = mixed_stream()
    new = run(stream, IndexConfig())
    assert_same(new, old_path(stream, monkeypatch, IndexConfig()))
    assert_same(new, old_path(stream, monkeypatch))  # hashing for every user, as before the exact scan
    # every user stays small: these are the decisions of scoring every live node
    assert_same(new, old_path(stream, monkeypatch, decider=DeterministicDecider(use_index=False)))
    actions = {o["decision"].action for o in new["outputs"] if o["decision"]}
    assert {"accept", "merge", "supersede", "reject"} <= actions  # the stream exercises every decision


@pytest.mark.parametrize("dim", [0, 8])
def test_users_growing_past_the_exact_scan_size_are_identical_on_the_old_and_the_new_path(monkeypatch, dim):
    stream = growing_stream(seed=20240601 + dim, users=3, per_user=90, dim=dim)
    new = run(stream, IndexConfig())
    assert_same(new, old_path(stream, monkeypatch, IndexConfig()))
    # hashed from the first node on: the vectorized Jaccard against sets, on every query
    assert_same(run(stream, OLD_INDEX), old_path(stream, monkeypatch, OLD_INDEX))
    live = [sum(1 for n in nodes if n["valid_until"] is None) for nodes, _ in new["state"].values()]
    assert max(live) > IndexConfig().exact_scan_below  # the users did grow past it
    actions = {o["decision"].action for o in new["outputs"] if o["decision"]}
    assert {"accept", "merge", "supersede"} <= actions


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 40))
def test_any_exact_scan_size_gives_the_outputs_of_the_old_path(seed, threshold):
    """(LSH may miss a node the exact scan finds, so each exact-scan size is compared with the
    old path at the same size: the fast paths change nothing else.)"""
    stream = growing_stream(seed=seed, users=1, per_user=60, dim=4)
    config = IndexConfig(exact_scan_below=threshold)
    with pytest.MonkeyPatch.context() as mp:
        assert_same(run(stream, config), old_path(stream, mp, config))


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
