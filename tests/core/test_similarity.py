import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from streams.core import similarity
from streams.core.similarity import (
    IndexConfig,
    SimilarityIndex,
    char_shingles,
    cosine,
    has_negation,
    jaccard,
    normalize_text,
    text_shingles,
    text_similarity,
    word_shingles,
)

from .factories import light_paraphrases, one_word_edit, sentence, sentences

LSH_ONLY = IndexConfig(exact_scan_below=0)


def test_normalization():
    assert normalize_text("  Hello,   WORLD!! don't  ") == "hello world dont"
    assert normalize_text("Straße_name") == "strasse name"
    assert normalize_text("ｆｕｌｌｗｉｄｔｈ") == "fullwidth"
    assert normalize_text("...") == ""


def test_normalization_cache_is_bounded_by_characters_not_entries():
    """Hostile contents that NFKC expands 18-fold (U+FDFA) at the 16 KiB content limit: the
    cache never holds more than NORMALIZE_CACHE_MAX_CHARS, and a cached answer equals a fresh one."""
    hostile = ["\ufdfa" * 5_461 + str(i) for i in range(40)]  # 16 KiB of UTF-8 each, ~98k chars normalized
    short = [f"memory number {i}" for i in range(5_000)]
    assert len(similarity._normalize(hostile[0])) > 90_000
    for text in hostile + short + hostile[:3] + short[:10]:
        assert normalize_text(text) == similarity._normalize(text)
        assert similarity.normalize_cache_chars() <= similarity.NORMALIZE_CACHE_MAX_CHARS
    assert hostile[0] not in similarity._normalized  # over NORMALIZE_CACHE_MAX_TEXT: never cached
    assert short[-1] in similarity._normalized and short[0] in similarity._normalized  # short texts: cached


def test_normalization_cache_evicts_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(similarity, "NORMALIZE_CACHE_MAX_CHARS", 3 * len("abcd" * 2))
    monkeypatch.setattr(similarity, "_normalized", {})
    monkeypatch.setattr(similarity, "_normalized_chars", 0)
    for t in ("abcd", "efgh", "ijkl"):
        normalize_text(t)
    normalize_text("abcd")  # now the most recent
    normalize_text("mnop")  # evicts "efgh"
    assert list(similarity._normalized) == ["ijkl", "abcd", "mnop"]
    assert similarity.normalize_cache_chars() == 3 * 8


def test_shingles():
    assert char_shingles("ab") == {" ab", "ab "}
    assert char_shingles("a") == {" a "}
    assert char_shingles("") == set()
    assert word_shingles("a b c", 2) == {"a b", "b c"}
    s = text_shingles("Hi there")
    assert "\x010hi" in s and "\x011there" in s and " hi" in s


def test_jaccard_and_text_similarity_examples():
    assert jaccard({1, 2}, {2, 3}) == pytest.approx(1 / 3)
    assert jaccard(set(), set()) == 0.0
    assert text_similarity("User prefers dark mode.", "user prefers DARK mode") == 1.0
    assert text_similarity("My favorite color is blue", "My favorite color is green") < 0.85
    assert text_similarity("My favorite color is blue", "My favorite color is green") >= 0.5
    assert text_similarity("User prefers dark mode in the editor", "User is allergic to peanuts") < 0.2


@given(sentences, sentences)
def test_jaccard_is_symmetric_and_bounded(a, b):
    s = text_similarity(a, b)
    assert s == text_similarity(b, a)
    assert 0.0 <= s <= 1.0
    assert text_similarity(a, a) == 1.0


def test_negation():
    assert has_negation("I don't like coffee")
    assert has_negation("never again")
    assert not has_negation("I like coffee")


def test_cosine_exact():
    assert cosine([1, 0], [0, 1]) == 0.0
    assert cosine([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert cosine([1, 0], [1, 0, 0]) is None
    assert cosine([0, 0], [1, 1]) is None


def test_recall_curves_documented():
    c = IndexConfig()
    assert c.text_recall(0.5) > 0.98
    assert c.text_recall(0.6) > 0.9998
    assert c.text_recall(0.85) > 1 - 1e-12
    assert c.text_recall(0.1) < 0.01
    assert c.embedding_recall(0.95) > 0.9999
    assert c.embedding_recall(0.80) > 0.98
    assert c.embedding_recall(0.0) < 0.01


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_index_finds_light_paraphrase_among_many(data):
    rnd = random.Random(data.draw(st.integers(0, 10**6)))
    idx = SimilarityIndex(LSH_ONLY)
    target = data.draw(sentences)
    idx.add("target", target)
    for i in range(200):
        idx.add(f"n{i}", sentence(rnd))
    query = data.draw(light_paraphrases(target))
    assert "target" in idx.candidates(query)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_index_finds_embedding_near_duplicate(data):
    rnd = random.Random(data.draw(st.integers(0, 10**6)))
    dim = data.draw(st.sampled_from([8, 32, 96]))
    idx = SimilarityIndex(LSH_ONLY)
    base = [rnd.gauss(0, 1) for _ in range(dim)]
    idx.add("target", "completely different words here", base)
    for i in range(200):
        idx.add(f"n{i}", sentence(rnd), [rnd.gauss(0, 1) for _ in range(dim)])
    noise = data.draw(st.floats(0.0, 0.1))
    query = [x + rnd.gauss(0, noise * 1.0) for x in base]
    assume(cosine(base, query) >= 0.95)
    assert "target" in idx.candidates("unrelated text of the query", query)


def test_candidates_do_not_scan():
    rnd = random.Random(7)
    idx = SimilarityIndex(LSH_ONLY)
    for i in range(5000):
        idx.add(f"n{i}", sentence(rnd))
    sizes = [len(idx.candidates(sentence(rnd))) for _ in range(50)]
    assert sum(sizes) / len(sizes) < 100  # a few percent at most of 5000, not a scan


def test_exact_duplicate_always_candidate_and_remove():
    rnd = random.Random(3)
    idx = SimilarityIndex(LSH_ONLY)
    texts = {f"n{i}": sentence(rnd) for i in range(500)}
    for k, t in texts.items():
        idx.add(k, t)
    for k in ("n1", "n250", "n499"):
        assert k in idx.candidates(texts[k])
    idx.remove("n250")
    assert "n250" not in idx.candidates(texts["n250"])
    assert "n250" not in idx and len(idx) == 499
    idx.remove("n250")  # idempotent
    idx.add("n1", "something else entirely")  # re-add replaces
    assert len(idx) == 499


def test_small_users_are_scanned_exactly():
    idx = SimilarityIndex(IndexConfig(exact_scan_below=32))
    for i in range(32):
        idx.add(f"n{i}", f"text {i}")
    assert idx.candidates("whatever") == {f"n{i}" for i in range(32)}
    idx.add("n32", "one more")
    assert len(idx.candidates("whatever")) < 33


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6))
def test_from_nodes_equals_incremental(seed):
    rnd = random.Random(seed)
    nodes = []
    inc = SimilarityIndex(LSH_ONLY)
    for i in range(120):
        emb = [rnd.gauss(0, 1) for _ in range(8)] if rnd.random() < 0.5 else None
        n = {"node_id": f"n{i}", "content": sentence(rnd), "embedding": emb, "valid_until": None}
        nodes.append(n)
        inc.add(n["node_id"], n["content"], emb)
    for n in nodes[::3]:
        inc.remove(n["node_id"])
        n["valid_until"] = 5  # closed nodes are not indexed
    rnd.shuffle(nodes)
    rebuilt = SimilarityIndex.from_nodes(nodes, LSH_ONLY)
    assert rebuilt.node_ids() == inc.node_ids()
    for n in nodes[:30]:
        q_text = one_word_edit(rnd, n["content"])
        q_emb = n["embedding"]
        assert rebuilt.candidates(q_text, q_emb) == inc.candidates(q_text, q_emb)


def test_measured_recall_in_the_contradiction_band():
    """LSH is probabilistic: measure recall (incl. signature verification) for pairs scored
    in [0.5, 0.6) — the bottom of the lowest decision band — over many deterministic pairs;
    above 0.6 it is ~certain."""
    rnd = random.Random(11)
    idx = SimilarityIndex(LSH_ONLY)
    pairs = []
    while len(pairs) < 300:
        a = sentence(rnd, 5, 9)
        b = one_word_edit(rnd, one_word_edit(rnd, a))
        if 0.5 <= text_similarity(a, b) < 0.6:
            pairs.append((a, b))
    for i, (a, _) in enumerate(pairs):
        idx.add(f"p{i}", a)
    found = sum(f"p{i}" in idx.candidates(b) for i, (_, b) in enumerate(pairs))
    assert found / len(pairs) >= 0.95


def test_cosine_undefined_for_non_finite():
    assert cosine([float("nan"), 1.0], [1.0, 1.0]) is None
    assert cosine([float("inf"), 1.0], [1.0, 1.0]) is None
