"""The similarity index's layout (issue 14, consolidation at 100k live nodes) changes speed and
memory, never a candidate or a decision.

The oracle is the definition of a candidate, computed here from scratch for every live node
with plain numpy (the MinHash formula ``min((a·x + b) mod (2^31 − 1))``, the band keys, the
verification rule): a node is a text candidate when it shares a band key with the query and
the share of equal low bytes of their MinHash values reaches ``text_verify_floor``. The index —
sorted bucket arrays, nodes waiting in the fresh dict, removed entries waiting for a merge,
compiled kernels or numpy — must return exactly that set, and that set contains every node
the full 32-bit values would keep (the verification of the layout before issue 14's change).
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.core import ConsolidationPolicy, DeterministicDecider, IndexConfig, UserMemory, _kernels, process_candidate
from streams.core import similarity as sim
from streams.core.similarity import (
    MinHasher,
    SimilarityIndex,
    _band_keys,
    jaccard,
    shingle_hashes,
    text_shingles,
)

from .factories import one_word_edit, sentence
from .test_golden_paths import assert_same, growing_stream, run

LSH_ONLY = IndexConfig(exact_scan_below=0)
reference_hasher = functools.lru_cache(maxsize=4)(MinHasher)


@functools.lru_cache(maxsize=4096)
def reference_signature(config: IndexConfig, text: str) -> np.ndarray:
    mh = reference_hasher(config.num_perm, config.seed)
    h = shingle_hashes(text_shingles(text))
    if h.size == 0:
        return np.full(config.num_perm, (1 << 31) - 1, dtype=np.uint64)
    return ((mh._a * h[None, :] + mh._b) % mh._p).min(axis=1)


def reference_candidates(config: IndexConfig, live: dict[str, str], query: str, low_byte: bool = True) -> set[str]:
    """The text candidates by definition (``low_byte=False``: verified on the full values)."""
    q = reference_signature(config, query)
    qk = _band_keys(q, config.text_bands, config.text_rows)
    out = set()
    for nid, text in live.items():
        s = reference_signature(config, text)
        if not (_band_keys(s, config.text_bands, config.text_rows) == qk).any():
            continue
        equal = ((s & 0xFF) == (q & 0xFF)) if low_byte else (s == q)
        if config.text_verify_floor is None or int(equal.sum()) / config.num_perm >= config.text_verify_floor:
            out.add(nid)
    return out


@pytest.fixture(params=[True, False] if _kernels.AVAILABLE else [False], ids=["kernels", "numpy"])
def kernels(request, monkeypatch):
    monkeypatch.setattr(sim, "USE_KERNELS", request.param)
    return request.param


ops = st.lists(st.tuples(st.sampled_from(["add", "add", "add", "remove", "query"]), st.integers(0, 10**6)), max_size=120)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), merge_min=st.integers(0, 6), program=ops)
def test_candidates_are_the_definition_whatever_the_history(kernels, seed, merge_min, program):
    """(The fixture only sets which implementation runs: nothing to reset between examples.)
    Random adds, re-adds, removes and queries, merges every few adds (merge_min small):
    every query returns exactly the candidates by definition of the live nodes, and the exact
    Jaccard of ``scored_candidates`` is ``jaccard`` of the shingle sets, bit for bit."""
    rnd = random.Random(seed)
    pool = [sentence(rnd) for _ in range(12)]
    pool += [one_word_edit(rnd, t) for t in pool] + [""]
    idx = SimilarityIndex(LSH_ONLY)
    idx.band_merge_min = merge_min
    live: dict[str, str] = {}
    for op, k in program:
        text = pool[k % len(pool)]
        nid = f"n{k % 40}"
        if op == "add":
            idx.add(nid, text)
            live[nid] = text
        elif op == "remove":
            idx.remove(nid)
            live.pop(nid, None)
        else:
            assert idx.candidates(text) == reference_candidates(LSH_ONLY, live, text)
            found, scores = idx.scored_candidates(text, text_floor=0.5)
            q = text_shingles(text)
            assert scores == {n: jaccard(q, text_shingles(live[n])) for n in found}
            assert found == {n for n in reference_candidates(LSH_ONLY, live, text) if scores.get(n, -1.0) >= 0.5}
    assert idx.node_ids() == set(live)


def test_a_query_then_the_node_it_forms_then_the_query_again(kernels):
    """The index keeps the last text it hashed (its shingle numbers included): a query whose
    shingles are new to the user (the first query also builds the hash tables), then the node
    it forms, then the same text again — the second query scores the new node from its
    numbers as they are now (Jaccard 1); the node removed and the text added under another id
    likewise. Every score is ``jaccard`` of the shingle sets."""
    rnd = random.Random(7)
    live = {f"n{i}": sentence(rnd) for i in range(20)}
    nodes = [{"node_id": n, "content": t, "valid_until": None} for n, t in live.items()]
    idx = SimilarityIndex.from_nodes(nodes, LSH_ONLY)
    text = "zyxwv qutsr " + live["n3"]  # new words: shingles no node has
    q = text_shingles(text)
    found, scores = idx.scored_candidates(text, text_floor=0.0)
    assert "t" not in found and scores == {n: jaccard(q, text_shingles(live[n])) for n in found}
    for nid in ("t", "u"):
        idx.add(nid, text)
        live[nid] = text
        found, scores = idx.scored_candidates(text, text_floor=0.0)
        assert scores == {n: jaccard(q, text_shingles(live[n])) for n in found}
        assert scores[nid] == 1.0 and found == reference_candidates(LSH_ONLY, live, text)
        idx.remove(nid)
        live.pop(nid)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10**6))
def test_verification_keeps_every_node_the_full_values_keep(seed):
    """b-bit verification is a superset of the verification on the full MinHash values
    (what the index verified on before): recall at the decision thresholds cannot drop."""
    rnd = random.Random(seed)
    live = {}
    for i in range(150):
        live[f"n{i}"] = sentence(rnd) if i % 2 or not live else one_word_edit(rnd, rnd.choice(list(live.values())))
    idx = SimilarityIndex.from_nodes(
        [{"node_id": n, "content": t, "valid_until": None} for n, t in live.items()], LSH_ONLY
    )
    for _ in range(10):
        query = one_word_edit(rnd, rnd.choice(list(live.values())))
        got = idx.candidates(query)
        assert got >= reference_candidates(LSH_ONLY, live, query, low_byte=False)
        # and a node at or above the merge threshold is always among them
        q = text_shingles(query)
        assert {n for n, t in live.items() if jaccard(q, text_shingles(t)) >= 0.85} <= got


@pytest.mark.skipif(not _kernels.AVAILABLE, reason="numba not installed")
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_kernels_give_the_numpy_results(data):
    rnd = np.random.RandomState(data.draw(st.integers(0, 2**32 - 1)))
    mh = MinHasher(64, data.draw(st.integers(0, 2**40)))
    h = rnd.randint(0, (1 << 31) - 1, size=data.draw(st.integers(0, 90))).astype(np.uint64)
    expect = np.full(64, (1 << 31) - 1, dtype=np.uint64) if h.size == 0 else ((mh._a * h[None, :] + mh._b) % mh._p).min(axis=1)
    assert (_kernels.minhash(h, mh._a_flat, mh._b_flat) == expect).all()
    # values that are 0 mod p: a·x + b = 0 and = p (the division-free modulo folds p to 0)
    p31 = (1 << 31) - 1
    a, b = np.array([1, 1, 5], dtype=np.uint64), np.array([0, 1, 3], dtype=np.uint64)
    for xs in ([0, 9], [p31 - 1, 4], [p31 - 2, 1]):
        hx = np.array(xs, dtype=np.uint64)
        assert (_kernels.minhash(hx, a, b) == ((a[:, None] * hx[None, :] + b[:, None]) % p31).min(axis=1)).all()

    rows = rnd.randint(0, 4, size=(40, 32)).astype(np.uint8)
    at = rnd.randint(0, 40, size=data.draw(st.integers(0, 60))).astype(np.int64)
    q = rnd.randint(0, 4, size=32).astype(np.uint8)
    assert (_kernels.equal_counts(rows, at, q) == (rows[at] == q[None, :]).sum(axis=1)).all()
    assert (_kernels.equal_byte_counts(rows.view(np.uint64), at, q.view(np.uint64)) == (rows[at] == q[None, :]).sum(axis=1)).all()

    # band-tagged keys of 3 bands, many equal (small key values) or spread over the 56 bits
    bands = 3
    spread = data.draw(st.sampled_from([50, 1 << 56]))
    size = data.draw(st.integers(0, 300))
    tag = rnd.randint(0, bands, size=size).astype(np.uint64) << np.uint64(56)
    keys = np.sort(tag | rnd.randint(0, spread, size=size, dtype=np.uint64))
    slots = rnd.randint(0, 70, size=size).astype(np.int32)
    dead = rnd.rand(70) < 0.2
    query = (np.arange(bands, dtype=np.uint64) << np.uint64(56)) | rnd.randint(0, spread, size=bands, dtype=np.uint64)
    if size:
        query[: bands // 2 + 1] = rnd.choice(keys, size=bands // 2 + 1)  # some keys that are there
    query.sort()
    directory, shift = sim.key_directory(keys, bands, data.draw(st.integers(1, 9)))
    extra = rnd.randint(70, 90, size=data.draw(st.integers(0, 5))).astype(np.int32)  # fresh hits, repeats too
    hit = np.isin(keys, query) & ~dead[slots]
    expect = np.unique(np.concatenate((slots[hit], extra)))
    assert (_kernels.bucket_slots(keys, slots, directory, shift, query, dead, True, extra) == expect).all()
    expect = np.unique(np.concatenate((slots[np.isin(keys, query)], extra)))
    assert (_kernels.bucket_slots(keys, slots, directory, shift, query, dead, False, extra) == expect).all()

    sigs = rnd.randint(0, (1 << 31) - 1, size=(data.draw(st.integers(0, 5)), 24)).astype(np.uint64)
    rows_per_band = data.draw(st.sampled_from([1, 3, 4]))
    got = _kernels.band_keys(sigs, 24 // rows_per_band, rows_per_band, sim._MIX, sim._KEY_MASK, sim._BAND_SHIFT)
    assert (got == sim._band_keys_numpy(sigs, 24 // rows_per_band, rows_per_band)).all()


def test_the_layout_does_not_change_decisions(monkeypatch):
    """The consolidation bench's mix through the core: merged into the sorted arrays after
    nearly every add, never merged, numpy instead of the kernels — the same outputs, ids and
    rows included."""
    stream = growing_stream(seed=99, users=2, per_user=120, dim=0)
    config = IndexConfig(exact_scan_below=0)
    base = run(stream, config)
    monkeypatch.setattr(SimilarityIndex, "band_merge_min", 0)
    assert_same(run(stream, config), base)
    monkeypatch.setattr(SimilarityIndex, "band_merge_min", 10**9)
    assert_same(run(stream, config), base)
    monkeypatch.setattr(sim, "USE_KERNELS", not sim.USE_KERNELS)
    assert_same(run(stream, config), base)


def test_small_corpora_decide_as_the_brute_force_scan():
    """Where every node at or above the lowest text threshold is found (checked by the exact
    scan), the index's decider and the brute-force scan decide the same."""
    rnd = random.Random(5)
    indexed, scan = DeterministicDecider(), DeterministicDecider(use_index=False)
    um = UserMemory("u", index_config=LSH_ONLY)
    said: list[str] = []
    agree = total = 0
    for i in range(200):
        text = one_word_edit(rnd, rnd.choice(said)) if said and i % 2 else sentence(rnd)
        cand = {"candidate_id": f"c{i}", "motebit_id": "u", "content": text, "sensitivity": "personal",
                "source": "user_stated", "memory_type": "semantic", "timestamp": 1_700_000_000_000 + i}
        policy = ConsolidationPolicy()
        a, b = indexed.decide(cand, um, policy), scan.decide(cand, um, policy)
        total += 1
        agree += (a.action, a.existing_node_id) == (b.action, b.existing_node_id)
        q = text_shingles(text)
        above = {n for n, node in um.live.items() if jaccard(q, text_shingles(node["content"])) >= 0.5}
        if above <= um.index.candidates(text):
            assert (a.action, a.existing_node_id, a.score) == (b.action, b.existing_node_id, b.score)
        process_candidate(um, cand)
        said.append(text)
    assert agree >= 0.95 * total


def test_index_config_bounds_the_bands():
    with pytest.raises(ValueError):
        IndexConfig(text_bands=sim.MAX_TEXT_BANDS + 1)
    with pytest.raises(ValueError):
        IndexConfig(text_rows=0)
    assert IndexConfig(text_bands=sim.MAX_TEXT_BANDS).num_perm == sim.MAX_TEXT_BANDS * 4
