"""Similarity: text normalization, shingles, Jaccard, cosine, and the per-user candidate index.

Two layers, kept apart on purpose:

1. **Exact measures** (what decisions are made on). Reproducible bit-for-bit on any machine:
   ``text_similarity`` = Jaccard of the shingle sets of the normalized texts (character
   3-grams plus word tokens counted twice, see :func:`text_shingles`), and ``cosine`` computed
   with correctly-rounded sums (:func:`math.fsum`).

2. **Candidate generation** (what keeps a user with 100,000 live nodes from costing a scan of
   all of them per candidate). :class:`SimilarityIndex` holds, per live node,

   * a MinHash signature of its shingle set cut into LSH bands (``bands`` × ``rows``), with
     hash parameters derived from a fixed seed, so a pair with Jaccard ``J`` collides in at
     least one band with probability ``1 - (1 - J**rows)**bands``;
   * for nodes with an embedding, random-hyperplane LSH codes (``tables`` × ``bits`` sign bits,
     planes from a fixed seed per dimension), probed with Hamming radius 1 at query time.

   ``candidates(text, embedding)`` returns the union of the buckets the query falls into —
   a small set; the decider then scores exactly that set with the exact measures.
   Users with at most ``exact_scan_below`` live nodes (setting ``MEMSTREAM_EXACT_SCAN_NODES``)
   are scanned exactly (cheaper than hashing, and decisions for small users are then exactly
   the brute-force decisions). Nothing is hashed for them: the hash tables of a user are built
   the first time a query finds more nodes than that (so a restart rebuilds no signatures,
   and a user that is never queried never gets any), and kept in step from then on. While a
   user is scanned exactly, the shingle set of each node is kept (:meth:`shingles_of`), so a
   candidate costs one shingle computation (its own) instead of one per node. The MinHash
   and hyperplane families are derived once per process and shared by every user's index.

LSH is probabilistic: a node above the *lowest* decision threshold can, rarely, be missed.
With the defaults (256 permutations = 64 bands × 4 rows, 32 hyperplane tables × 16 bits,
see :class:`IndexConfig`) the probabilities are given by :meth:`IndexConfig.text_recall` /
:meth:`IndexConfig.embedding_recall`: a node at the lowest decision threshold (Jaccard 0.5,
cosine 0.80) is found with probability ≈ 0.98; merges (Jaccard ≥ 0.85, cosine ≥ 0.95) are
practically never missed.

The index is derived state: :meth:`SimilarityIndex.from_nodes` rebuilds it from node records
(the durable state), and the result is identical to the incrementally maintained index.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import unicodedata
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

# --------------------------------------------------------------------------------------------
# Text normalization and shingles (exact layer)
# --------------------------------------------------------------------------------------------

_APOSTROPHES = re.compile(r"['\u2019\u2018\u02bc`\u00b4]")
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)

#: Character n-gram size of the text shingles.
CHAR_N = 3
#: Word tokens are added to the shingle set this many times (distinct copies), so that a
#: changed *word* ("blue" → "green") weighs more than a typo that touches the same characters.
WORD_WEIGHT = 2

NEGATION_WORDS: frozenset[str] = frozenset(
    {
        "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without",
        "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent",
        "wont", "wouldnt", "shouldnt", "couldnt", "hasnt", "havent", "hadnt", "aint",
        "nolonger",
    }
)


def normalize_text(text: str) -> str:
    """NFKC, case-folded, apostrophes dropped (``don't`` → ``dont``), every run of
    non-alphanumeric characters (incl. ``_``) collapsed to one space, trimmed."""
    t = unicodedata.normalize("NFKC", text).casefold()
    t = _APOSTROPHES.sub("", t)
    t = _NON_WORD.sub(" ", t)
    return t.strip()


def char_shingles(normalized: str, n: int = CHAR_N) -> set[str]:
    """Character n-grams of ``" " + normalized + " "`` (word boundaries count)."""
    if not normalized:
        return set()
    padded = f" {normalized} "
    if len(padded) <= n:
        return {padded}
    return {padded[i : i + n] for i in range(len(padded) - n + 1)}


def word_shingles(normalized: str, n: int = 1) -> set[str]:
    """Word n-grams (space-joined) of a normalized text."""
    words = normalized.split()
    if len(words) < n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def text_shingles(text: str) -> frozenset[str]:
    """The shingle set text similarity is defined on: char 3-grams ∪ word tokens × WORD_WEIGHT.

    Word tokens carry a control-character prefix so they never equal a character n-gram."""
    norm = normalize_text(text)
    out = set(char_shingles(norm))
    for w in word_shingles(norm, 1):
        for copy in range(WORD_WEIGHT):
            out.add(f"\x01{copy}{w}")
    return frozenset(out)


def jaccard(a: Iterable[Any], b: Iterable[Any]) -> float:
    """|A ∩ B| / |A ∪ B|; two empty sets have similarity 0 (nothing to compare)."""
    sa = a if isinstance(a, (set, frozenset)) else set(a)
    sb = b if isinstance(b, (set, frozenset)) else set(b)
    if not sa and not sb:
        return 0.0
    inter = len(sa & sb)
    return inter / (len(sa) + len(sb) - inter)


def text_similarity(a: str, b: str) -> float:
    return jaccard(text_shingles(a), text_shingles(b))


def has_negation(text: str) -> bool:
    """True when the normalized text contains a negation word (polarity of a statement)."""
    return any(w in NEGATION_WORDS for w in normalize_text(text).split())


# --------------------------------------------------------------------------------------------
# Embeddings (exact layer)
# --------------------------------------------------------------------------------------------


def usable_embedding(embedding: Any) -> bool:
    """A non-empty sequence of finite numbers with a non-zero norm."""
    if embedding is None or isinstance(embedding, (str, bytes)):
        return False
    try:
        values = [float(x) for x in embedding]
    except (TypeError, ValueError):
        return False
    if not values or not all(math.isfinite(x) for x in values):
        return False
    return math.fsum(x * x for x in values) > 0.0


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Exact, reproducible cosine similarity (``math.fsum``); None when undefined
    (different dimensions or a zero vector)."""
    if len(a) != len(b) or not a:
        return None
    dot = math.fsum(float(x) * float(y) for x, y in zip(a, b))
    na = math.fsum(float(x) * float(x) for x in a)
    nb = math.fsum(float(y) * float(y) for y in b)
    if not (na > 0.0 and nb > 0.0 and math.isfinite(na) and math.isfinite(nb) and math.isfinite(dot)):
        return None
    c = dot / math.sqrt(na * nb)
    return max(-1.0, min(1.0, c))


def unit_vector(embedding: Sequence[float]) -> np.ndarray:
    v = np.asarray(embedding, dtype=np.float64)
    return v / np.linalg.norm(v)


# --------------------------------------------------------------------------------------------
# MinHash
# --------------------------------------------------------------------------------------------

#: Universe of the permutations: the Mersenne prime 2^31 − 1 (so ``a·x + b < 2^62`` never
#: overflows uint64 while ``a`` and ``b`` range over the whole field, as universal hashing needs).
_PRIME_31 = (1 << 31) - 1


def _seeded_field(seed: int, label: str, count: int, lo: int) -> list[int]:
    """``count`` reproducible integers in [lo, 2^31 − 1) from BLAKE2b (independent of numpy)."""
    out = []
    for i in range(count):
        h = hashlib.blake2b(f"{seed}:{label}:{i}".encode(), digest_size=8).digest()
        out.append(lo + int.from_bytes(h, "big") % (_PRIME_31 - lo))
    return out


def shingle_hashes(shingles: Iterable[str]) -> np.ndarray:
    """CRC-32 of each shingle reduced into the field (deterministic across processes,
    unlike ``hash()``)."""
    return np.fromiter((zlib.crc32(s.encode("utf-8")) % _PRIME_31 for s in shingles), dtype=np.uint64)


class MinHasher:
    """``num_perm`` universal hash functions ``(a·x + b) mod (2^31 − 1)``, ``a`` ∈ [1, p),
    ``b`` ∈ [0, p) from a fixed seed; the signature is the per-function minimum."""

    def __init__(self, num_perm: int, seed: int) -> None:
        self.num_perm = num_perm
        self._a = np.asarray(_seeded_field(seed, "minhash-a", num_perm, 1), dtype=np.uint64)[:, None]
        self._b = np.asarray(_seeded_field(seed, "minhash-b", num_perm, 0), dtype=np.uint64)[:, None]
        self._p = np.uint64(_PRIME_31)

    def signature(self, shingles: Iterable[str]) -> np.ndarray:
        h = shingle_hashes(shingles)
        if h.size == 0:
            return np.full(self.num_perm, _PRIME_31, dtype=np.uint64)
        return ((self._a * h[None, :] + self._b) % self._p).min(axis=1)


@functools.lru_cache(maxsize=8)
def shared_minhasher(num_perm: int, seed: int) -> MinHasher:
    """One MinHasher per (num_perm, seed) for the whole process: its arrays are read-only,
    so every user's index shares them instead of deriving its own."""
    return MinHasher(num_perm, seed)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _band_keys(signature: np.ndarray, bands: int, rows: int) -> tuple[int, ...]:
    """One 64-bit key per band (polynomial mix of its rows; wrap-around is intended)."""
    m = signature[: bands * rows].reshape(bands, rows)
    with np.errstate(over="ignore"):
        k = m[:, 0].copy()
        for j in range(1, rows):
            k = k * _MIX + m[:, j]
    return tuple(k.tolist())


# --------------------------------------------------------------------------------------------
# Index configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexConfig:
    """Candidate-generation parameters (not decision thresholds: those are in
    ``ConsolidationPolicy``). Changing them changes which nodes are *looked at*, never how
    a looked-at node is scored."""

    #: MinHash bands × rows (num_perm = bands · rows). 64 × 4: P(collision | J) is 0.984 at
    #: J=0.5 (the lowest text decision threshold), 0.996 at 0.55, 0.9999 at 0.6, ~1 at J≥0.7;
    #: 0.22 at J=0.25 and 0.006 at J=0.1 (unrelated memories).
    text_bands: int = 64
    text_rows: int = 4
    #: Bucket hits are verified on the stored signatures: a hit whose *estimated* Jaccard
    #: (share of equal MinHash values, σ ≈ 0.031 at J=0.5 with 256 values) is below this
    #: floor is dropped before exact scoring. Must sit well below the lowest text decision
    #: threshold (0.50): at J=0.5 the estimate falls under 0.35 with probability ~1e-6.
    #: None disables verification.
    text_verify_floor: float | None = 0.35
    #: Random-hyperplane LSH: tables × bits per table, probed with Hamming radius ≤ 1.
    hyperplane_tables: int = 32
    hyperplane_bits: int = 16
    multiprobe: bool = True
    #: Hyperplane hits whose float32 cosine is below this floor are dropped (must be below
    #: the lowest cosine decision threshold, default 0.80). None disables verification.
    embedding_verify_floor: float | None = 0.6
    #: Users with at most this many live nodes are scanned exactly (no hashing needed).
    exact_scan_below: int = 32
    #: Seed of every hash family: part of the replay contract (same seed, same candidates).
    seed: int = 0x6D656D73

    @property
    def num_perm(self) -> int:
        return self.text_bands * self.text_rows

    def text_recall(self, j: float) -> float:
        """P(a node with Jaccard ``j`` to the query collides in a band)."""
        return 1.0 - (1.0 - j**self.text_rows) ** self.text_bands

    def embedding_recall(self, cos: float) -> float:
        """P(a node with cosine ``cos`` to the query is in a probed bucket)."""
        p = 1.0 - math.acos(max(-1.0, min(1.0, cos))) / math.pi
        r = self.hyperplane_bits
        per_table = p**r + (r * p ** (r - 1) * (1 - p) if self.multiprobe else 0.0)
        return 1.0 - (1.0 - per_table) ** self.hyperplane_tables


# --------------------------------------------------------------------------------------------
# Buckets: dict[int, str | set[str]] (a single id is stored bare to save memory)
# --------------------------------------------------------------------------------------------


def _bucket_add(table: dict, key: int, node_id: str) -> None:
    cur = table.get(key)
    if cur is None:
        table[key] = node_id
    elif isinstance(cur, set):
        cur.add(node_id)
    elif cur != node_id:
        table[key] = {cur, node_id}


def _bucket_remove(table: dict, key: int, node_id: str) -> None:
    cur = table.get(key)
    if cur is None:
        return
    if isinstance(cur, set):
        cur.discard(node_id)
        if len(cur) == 1:
            table[key] = next(iter(cur))
        elif not cur:
            del table[key]
    elif cur == node_id:
        del table[key]


def _bucket_iter(table: dict, key: int) -> Iterator[str]:
    cur = table.get(key)
    if cur is None:
        return iter(())
    if isinstance(cur, set):
        return iter(cur)
    return iter((cur,))


# --------------------------------------------------------------------------------------------
# The per-user index
# --------------------------------------------------------------------------------------------


class _RowStore:
    """Fixed-width rows addressed by node id (a growable matrix with a free list), so a set
    of candidates can be verified with one vectorized numpy operation."""

    def __init__(self, width: int, dtype: Any) -> None:
        self._m = np.zeros((16, width), dtype=dtype)
        self._slot: dict[str, int] = {}
        self._free: list[int] = []
        #: slot -> node id (None: free)
        self.ids: list[str | None] = []

    def put(self, node_id: str, row: np.ndarray) -> None:
        slot = self._slot.get(node_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            else:
                slot = len(self._slot)
                self.ids.append(None)
                if slot >= self._m.shape[0]:
                    grown = np.zeros((self._m.shape[0] * 2, self._m.shape[1]), dtype=self._m.dtype)
                    grown[: self._m.shape[0]] = self._m
                    self._m = grown
            self._slot[node_id] = slot
            self.ids[slot] = node_id
        self._m[slot] = row

    def drop(self, node_id: str) -> None:
        slot = self._slot.pop(node_id, None)
        if slot is not None:
            self._free.append(slot)
            self.ids[slot] = None

    def slot_of(self, node_id: str) -> int:
        return self._slot[node_id]

    def rows_at(self, slots: np.ndarray) -> np.ndarray:
        return self._m[slots]

    def get(self, node_id: str) -> np.ndarray | None:
        slot = self._slot.get(node_id)
        return None if slot is None else self._m[slot]

    def rows(self, ids: Sequence[str]) -> np.ndarray:
        slots = np.fromiter((self._slot[i] for i in ids), dtype=np.int64, count=len(ids))
        return self._m[slots]


class _Hyperplanes:
    def __init__(self, dim: int, tables: int, bits: int, seed: int) -> None:
        # RandomState's stream is frozen by numpy's compatibility policy (NEP 19), so the
        # planes are the same on every numpy version.
        rs = np.random.RandomState((seed * 1_000_003 + dim) % (2**32))
        self.planes = rs.standard_normal((tables * bits, dim))
        self.tables = tables
        self.bits = bits
        self._weights = np.uint64(1) << np.arange(bits, dtype=np.uint64)

    def codes(self, unit: np.ndarray) -> tuple[int, ...]:
        signs = (self.planes @ unit) > 0.0
        m = signs.reshape(self.tables, self.bits).astype(np.uint64)
        return tuple((m * self._weights).sum(axis=1).tolist())


@functools.lru_cache(maxsize=16)
def shared_hyperplanes(dim: int, tables: int, bits: int, seed: int) -> _Hyperplanes:
    """One set of hyperplanes per (dim, tables, bits, seed) for the whole process (read-only)."""
    return _Hyperplanes(dim, tables, bits, seed)


class SimilarityIndex:
    """Per-user LSH index over live nodes: ``add`` / ``remove`` / ``candidates``.

    Memory per node of a hashed user: ``text_bands`` bucket entries + a ``num_perm`` × uint32
    signature row + its shingle numbers (int32 each, ~60 for a sentence; the per-user numbering
    keeps every shingle string once and is not trimmed when nodes go: it is rebuilt with the
    index), plus ``hyperplane_tables`` entries + a float32 unit vector when it has an
    embedding. A user not hashed holds only a reference to each node's text and embedding."""

    def __init__(self, config: IndexConfig | None = None) -> None:
        self.config = config or IndexConfig()
        c = self.config
        self._minhash = shared_minhasher(c.num_perm, c.seed)
        #: every indexed node: node_id -> (text, embedding) — what the hash tables are built from
        self._nodes: dict[str, tuple[str, Sequence[float] | None]] = {}
        #: the hash tables exist (built the first time a query finds more than
        #: ``exact_scan_below`` nodes; kept in step from then on)
        self._hashed = False
        #: shingle sets of the nodes while the user is scanned exactly (at most
        #: ``exact_scan_below`` entries; dropped when the user grows past that)
        self._shingles: dict[str, tuple[str, frozenset[str]]] = {}
        # the hash tables (created by ``_build``: a small user never needs them)
        self._text_tables: list[dict] = []
        self._text_keys: dict[str, tuple[int, ...]] = {}
        self._sigs: _RowStore | None = None
        #: hashed users: each distinct shingle of the indexed texts numbered (per user, so no
        #: collision is possible), and per node the sorted numbers of its shingle set — exact
        #: Jaccard of many nodes at once (:meth:`jaccard_many`)
        self._vocab: dict[str, int] = {}
        self._shingle_ids: dict[str, np.ndarray] = {}
        # node_id -> (dim, codes)
        self._emb: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._emb_tables: dict[int, list[dict]] = {}
        self._emb_rows: dict[int, _RowStore] = {}
        self._planes: dict[int, _Hyperplanes] = {}
        #: how many bucket hits the last ``candidates`` call saw before verification (stats)
        self.last_raw_candidates = 0

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_nodes(
        cls, nodes: Iterable[Mapping[str, Any]], config: IndexConfig | None = None
    ) -> "SimilarityIndex":
        """Rebuild from node records: every node whose validity is still open
        (``valid_until`` is null) is indexed on its content and embedding."""
        idx = cls(config)
        for n in nodes:
            if n.get("valid_until") is None:
                idx.add(n["node_id"], n["content"], n.get("embedding"))
        return idx

    def _hyperplanes(self, dim: int) -> _Hyperplanes:
        hp = self._planes.get(dim)
        if hp is None:
            c = self.config
            hp = self._planes[dim] = shared_hyperplanes(dim, c.hyperplane_tables, c.hyperplane_bits, c.seed)
            self._emb_tables[dim] = [dict() for _ in range(c.hyperplane_tables)]
            self._emb_rows[dim] = _RowStore(dim, np.float32)
        return hp

    def _signature(self, text: str, shingles: frozenset[str] | None = None) -> np.ndarray:
        return self._minhash.signature(text_shingles(text) if shingles is None else shingles).astype(np.uint32)

    def _keys(self, sig: np.ndarray) -> tuple[int, ...]:
        c = self.config
        return _band_keys(sig.astype(np.uint64), c.text_bands, c.text_rows)

    # -- mutation ----------------------------------------------------------------------
    def add(self, node_id: str, text: str, embedding: Sequence[float] | None = None) -> None:
        """Index a live node (re-adding replaces its previous entry)."""
        if node_id in self._nodes:
            self.remove(node_id)
        self._nodes[node_id] = (text, embedding)
        if self._hashed:
            self._hash_node(node_id, text, embedding)
        if self._shingles and len(self._nodes) > self.config.exact_scan_below:
            self._shingles.clear()  # no longer scanned exactly: the cache would only grow

    def _hash_node(self, node_id: str, text: str, embedding: Sequence[float] | None) -> None:
        shingles = text_shingles(text)
        sig = self._signature(text, shingles)
        vocab = self._vocab
        self._shingle_ids[node_id] = np.unique(
            np.fromiter((vocab.setdefault(x, len(vocab)) for x in shingles), dtype=np.int32, count=len(shingles))
        )
        keys = self._keys(sig)
        sigs = self._sigs
        assert sigs is not None
        sigs.put(node_id, sig)
        slot = sigs.slot_of(node_id)  # the text buckets hold signature slots (ints)
        for table, key in zip(self._text_tables, keys):
            _bucket_add(table, key, slot)
        self._text_keys[node_id] = keys
        if usable_embedding(embedding):
            unit = unit_vector(embedding)  # type: ignore[arg-type]
            dim = unit.shape[0]
            codes = self._hyperplanes(dim).codes(unit)
            for table, code in zip(self._emb_tables[dim], codes):
                _bucket_add(table, code, node_id)
            self._emb[node_id] = (dim, codes)
            self._emb_rows[dim].put(node_id, unit.astype(np.float32))

    def _build(self) -> None:
        """Hash every node (in node_id order, so the layout does not depend on history)."""
        self._hashed = True
        self._text_tables = [dict() for _ in range(self.config.text_bands)]
        self._sigs = _RowStore(self.config.num_perm, np.uint32)
        for node_id in sorted(self._nodes):
            text, embedding = self._nodes[node_id]
            self._hash_node(node_id, text, embedding)

    def remove(self, node_id: str) -> None:
        """Forget a node (no-op when it is not indexed)."""
        if self._nodes.pop(node_id, None) is None:
            return
        self._shingles.pop(node_id, None)
        keys = self._text_keys.pop(node_id, None)
        if keys is None:
            return
        sigs = self._sigs
        assert sigs is not None
        slot = sigs.slot_of(node_id)
        for table, key in zip(self._text_tables, keys):
            _bucket_remove(table, key, slot)
        sigs.drop(node_id)
        self._shingle_ids.pop(node_id, None)
        emb = self._emb.pop(node_id, None)
        if emb is not None:
            dim, codes = emb
            for table, code in zip(self._emb_tables[dim], codes):
                _bucket_remove(table, code, node_id)
            self._emb_rows[dim].drop(node_id)

    # -- queries -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def node_ids(self) -> set[str]:
        return set(self._nodes)

    @property
    def hashed(self) -> bool:
        """Whether the hash tables are built (a user that has had more than
        ``exact_scan_below`` nodes when queried)."""
        return self._hashed

    def embedding_dim_of(self, node_id: str) -> int | None:
        entry = self._nodes.get(node_id)
        if entry is None or not usable_embedding(entry[1]):
            return None
        return len(entry[1])  # type: ignore[arg-type]

    def shingles_of(self, node_id: str, text: str) -> frozenset[str]:
        """``text_shingles(text)`` of a node, kept while the user is scanned exactly (every
        candidate then scores every node: the shingles of a node are computed once)."""
        hit = self._shingles.get(node_id)
        if hit is not None and hit[0] == text:
            return hit[1]
        sh = text_shingles(text)
        if len(self._nodes) <= self.config.exact_scan_below and node_id in self._nodes:
            self._shingles[node_id] = (text, sh)
        return sh

    def jaccard_many(self, shingles: frozenset[str], node_ids: Sequence[str]) -> dict[str, float]:
        """``jaccard(shingles, text_shingles(text of node))`` for each hashed node of
        ``node_ids`` — the same floats, bit for bit (integer counts, one division), computed
        on the numbered shingle sets in one vectorized pass instead of one set per node.
        Nodes not hashed are left out (the caller scores them itself)."""
        ids = [i for i in node_ids if i in self._shingle_ids]
        if not ids:
            return {}
        vocab = self._vocab
        q = np.fromiter((n for n in map(vocab.get, shingles) if n is not None), dtype=np.int32)
        arrays = [self._shingle_ids[i] for i in ids]
        sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        hit = np.isin(np.concatenate(arrays), q)
        ends = np.cumsum(sizes)
        cum = np.concatenate(([0], np.cumsum(hit, dtype=np.int64)))
        inter = (cum[ends] - cum[ends - sizes]).tolist()
        lq = len(shingles)
        out = {}
        for nid, la, n in zip(ids, sizes.tolist(), inter):
            out[nid] = 0.0 if la == 0 and lq == 0 else n / (la + lq - n)
        return out

    def candidates(
        self, text: str, embedding: Sequence[float] | None = None, shingles: frozenset[str] | None = None
    ) -> set[str]:
        """The live nodes worth scoring exactly against (text, embedding): a small set.

        Nodes that will be scored by cosine (they and the query have embeddings of the same
        dimension) come from the hyperplane tables; every other node from the MinHash bands.
        Bucket hits are verified on the stored signatures / vectors (see IndexConfig).
        ``shingles``: ``text_shingles(text)`` when the caller has it already."""
        c = self.config
        if len(self._nodes) <= c.exact_scan_below:
            self.last_raw_candidates = len(self._nodes)
            return set(self._nodes)
        if not self._hashed:
            self._build()
        out: set[str] = set()
        raw = 0
        dim = None
        if usable_embedding(embedding):
            unit = unit_vector(embedding)  # type: ignore[arg-type]
            dim = unit.shape[0]
            if dim in self._emb_tables:
                hp = self._planes[dim]
                hits: set[str] = set()
                for table, code in zip(self._emb_tables[dim], hp.codes(unit)):
                    hits.update(_bucket_iter(table, code))
                    if c.multiprobe:
                        for j in range(hp.bits):
                            hits.update(_bucket_iter(table, code ^ (1 << j)))
                raw += len(hits)
                if hits and c.embedding_verify_floor is not None:
                    ids = list(hits)
                    est = self._emb_rows[dim].rows(ids) @ unit.astype(np.float32)
                    hits = {i for i, e in zip(ids, est.tolist()) if e >= c.embedding_verify_floor}
                out |= hits
        sig = self._signature(text, shingles)
        emb = self._emb
        sigs = self._sigs
        assert sigs is not None
        slots: set[int] = set()
        for table, key in zip(self._text_tables, self._keys(sig)):
            slots.update(_bucket_iter(table, key))
        slot_ids = sigs.ids
        if dim is not None and slots:
            # scored by cosine: their recall comes from the hyperplanes
            slots = {s for s in slots if (e := emb.get(slot_ids[s])) is None or e[0] != dim}  # type: ignore[arg-type]
        raw += len(slots)
        if slots and c.text_verify_floor is not None:
            at = np.fromiter(slots, dtype=np.int64, count=len(slots))
            est = (sigs.rows_at(at) == sig[None, :]).mean(axis=1)
            at = at[est >= c.text_verify_floor]
            out.update(slot_ids[s] for s in at.tolist())  # type: ignore[misc]
        else:
            out.update(slot_ids[s] for s in slots)  # type: ignore[misc]
        self.last_raw_candidates = raw
        return out
