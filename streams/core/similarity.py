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

   Layout of a hashed user (issue 14, "consolidation at 100k"): the band buckets of all
   bands are one sorted numpy array of band-tagged keys (:class:`_BandTable`; one
   ``searchsorted`` per query instead of 64 dict lookups and set unions, 12 bytes per entry);
   bucket hits are verified on the *low byte* of each stored MinHash value (b-bit MinHash:
   equal values have equal low bytes, so the share of equal bytes is never below the share of
   equal values — every hit the full values would keep is kept, at a quarter of the memory);
   the exact Jaccard of the verified hits is computed on numbered shingles stored end to end
   (:class:`_Ragged`), and hits below the lowest text threshold are dropped inside the index
   (:meth:`SimilarityIndex.scored_candidates`). A directory over the sorted band keys turns
   each band's binary search into two reads; each distinct shingle of a user is numbered once
   with its CRC-32 beside its number (:class:`_ShingleNumbers`), so a text's shingles are
   looked up in one pass for both its MinHash and its exact Jaccard. The inner loops (MinHash, bucket lookup,
   byte comparison, shingle counting) are compiled with numba when it is installed
   (:mod:`streams.core._kernels`: integer arithmetic only, the same results as the numpy
   expressions, bit for bit). The candidate set is a function of the live nodes and the query
   only: the layout (which nodes are merged into the sorted arrays, which removed entries wait
   for the next merge) changes speed and memory, never a candidate.

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
import threading
import unicodedata
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from . import _kernels

#: use the compiled loops of :mod:`streams.core._kernels` (same results as the numpy
#: expressions, bit for bit; False when numba is missing)
USE_KERNELS = _kernels.AVAILABLE

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


#: Most characters (keys and values together) the cache of `normalize_text` holds. Bounded by size,
#: not by entries: NFKC can expand a character up to 18-fold (U+FDFA), so 1,024 entries of
#: hostile 16 KiB contents could hold ~200 MB; this bound keeps the cache under ~4 MiB of
#: characters (16 MiB at 4 bytes per character) whatever the input.
NORMALIZE_CACHE_MAX_CHARS = 4 * 1024 * 1024
#: A text longer than this is normalized every time, never cached (one such entry would evict many).
NORMALIZE_CACHE_MAX_TEXT = 64 * 1024

_normalized: dict[str, str] = {}  # insertion order = recency (a hit moves its entry to the end)
_normalized_chars = 0
_normalized_lock = threading.Lock()  # the core runs on the event loop; a thread may call it too


def _normalize(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).casefold()
    t = _APOSTROPHES.sub("", t)
    t = _NON_WORD.sub(" ", t)
    return t.strip()


def normalize_text(text: str) -> str:
    """NFKC, case-folded, apostrophes dropped (``don't`` → ``dont``), every run of
    non-alphanumeric characters (incl. ``_``) collapsed to one space, trimmed. (Cached, least
    recently used out first, within NORMALIZE_CACHE_MAX_CHARS: a candidate's text is normalized
    for its shingles, its polarity and its fingerprint.)"""
    global _normalized_chars
    with _normalized_lock:
        hit = _normalized.pop(text, None)
        if hit is not None:
            _normalized[text] = hit
            return hit
    out = _normalize(text)
    size = len(text) + len(out)
    if size > NORMALIZE_CACHE_MAX_TEXT:
        return out
    with _normalized_lock:
        if text not in _normalized:
            while _normalized and _normalized_chars + size > NORMALIZE_CACHE_MAX_CHARS:
                oldest = next(iter(_normalized))
                _normalized_chars -= len(oldest) + len(_normalized.pop(oldest))
            _normalized[text] = out
            _normalized_chars += size
    return out


def normalize_cache_chars() -> int:
    """Characters the cache of `normalize_text` holds now (keys and values; for tests and metrics)."""
    return _normalized_chars


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


def usable_embedding(embedding: Any) -> TypeGuard[Sequence[float]]:
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
    dot = math.fsum(float(x) * float(y) for x, y in zip(a, b, strict=True))
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
    h = np.fromiter(map(zlib.crc32, map(str.encode, shingles)), dtype=np.uint64)  # UTF-8
    h %= np.uint64(_PRIME_31)
    return h


_P31 = np.uint64(_PRIME_31)
_S31 = np.uint64(31)


def _mod_p31(x: np.ndarray) -> np.ndarray:
    """``x % (2^31 − 1)`` for uint64 ``x < 2^62``, in place, without a division: two folds
    ``(x & p) + (x >> 31)`` (each keeps ``x ≡ x mod p``; the second leaves ``x ≤ p``), then
    ``p`` itself maps to 0 — the same integers as ``%``, bit for bit, ~2× faster."""
    for _ in range(2):
        hi = x >> _S31
        x &= _P31
        x += hi
    x[x == _P31] = 0
    return x


class MinHasher:
    """``num_perm`` universal hash functions ``(a·x + b) mod (2^31 − 1)``, ``a`` ∈ [1, p),
    ``b`` ∈ [0, p) from a fixed seed; the signature is the per-function minimum."""

    def __init__(self, num_perm: int, seed: int) -> None:
        self.num_perm = num_perm
        self._a = np.asarray(_seeded_field(seed, "minhash-a", num_perm, 1), dtype=np.uint64)[:, None]
        self._b = np.asarray(_seeded_field(seed, "minhash-b", num_perm, 0), dtype=np.uint64)[:, None]
        self._p = np.uint64(_PRIME_31)
        self._a_flat, self._b_flat = self._a[:, 0].copy(), self._b[:, 0].copy()

    def signature(self, shingles: Iterable[str]) -> np.ndarray:
        return self.signature_of_hashes(shingle_hashes(shingles))

    def signature_of_hashes(self, h: np.ndarray) -> np.ndarray:
        """The signature of a set given as its :func:`shingle_hashes`."""
        if USE_KERNELS:
            return _kernels.minhash(h, self._a_flat, self._b_flat)
        if h.size == 0:
            return np.full(self.num_perm, _PRIME_31, dtype=np.uint64)
        x = self._a * h[None, :]
        x += self._b
        return _mod_p31(x).min(axis=1)

    def signatures(self, hashes: Sequence[np.ndarray]) -> np.ndarray:
        """``signature_of_hashes`` of many sets at once (rows in order): one pass over
        their concatenation, the minima per set taken with ``minimum.reduceat``."""
        if USE_KERNELS:
            return np.stack([_kernels.minhash(h, self._a_flat, self._b_flat) for h in hashes]) if hashes else (
                np.empty((0, self.num_perm), dtype=np.uint64)
            )
        out = np.full((len(hashes), self.num_perm), _PRIME_31, dtype=np.uint64)
        sizes = np.fromiter((h.size for h in hashes), dtype=np.int64, count=len(hashes))
        full = np.flatnonzero(sizes)
        if full.size:
            x = self._a * np.concatenate([hashes[i] for i in full.tolist()])[None, :]
            x += self._b
            starts = np.concatenate(([0], np.cumsum(sizes[full])[:-1]))
            out[full] = np.minimum.reduceat(_mod_p31(x), starts, axis=1).T
        return out


@functools.lru_cache(maxsize=8)
def shared_minhasher(num_perm: int, seed: int) -> MinHasher:
    """One MinHasher per (num_perm, seed) for the whole process: its arrays are read-only,
    so every user's index shares them instead of deriving its own."""
    return MinHasher(num_perm, seed)


_MIX = np.uint64(0x9E3779B97F4A7C15)
#: a band key is 56 bits of the mix of its rows, tagged with its band number in the top 8
#: bits: the keys of every band live in one sorted array (so ``text_bands`` ≤ 256)
_BAND_SHIFT = np.uint64(56)
_KEY_MASK = np.uint64((1 << 56) - 1)
MAX_TEXT_BANDS = 256


def _band_keys_many(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) band-tagged keys of n signatures (rows of ``signatures``): per band, a
    polynomial mix of its rows (wrap-around intended) cut to 56 bits, ``band << 56 | key``.
    Two nodes collide in band b iff their keys in column b are equal."""
    if USE_KERNELS:
        sigs = np.ascontiguousarray(signatures, dtype=np.uint64)
        return _kernels.band_keys(sigs, bands, rows, _MIX, _KEY_MASK, _BAND_SHIFT)
    return _band_keys_numpy(signatures, bands, rows)


def _band_keys_numpy(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    m = signatures[:, : bands * rows].astype(np.uint64).reshape(signatures.shape[0], bands, rows)
    with np.errstate(over="ignore"):
        k = m[:, :, 0].copy()
        for j in range(1, rows):
            k *= _MIX
            k += m[:, :, j]
    k &= _KEY_MASK
    k |= np.arange(bands, dtype=np.uint64)[None, :] << _BAND_SHIFT
    return k


def key_directory(keys: np.ndarray, bands: int, per_entry: int) -> tuple[np.ndarray, np.uint64]:
    """(directory, shift) of ascending band-tagged keys (all below ``bands << 56``):
    ``directory[p]`` is the first index whose key has ``key >> shift >= p``, with about
    ``per_entry`` keys per entry (the keys within a band are uniform: they are hash mixes)."""
    per_band = max(1, keys.size // (per_entry * max(1, bands)))
    bits = min(per_band.bit_length() - 1, 48)
    shift = np.uint64(56 - bits)
    counts = np.bincount((keys >> shift).astype(np.int64), minlength=bands << bits)
    return np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(counts))), shift


def _band_keys(signature: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """The band-tagged keys of one signature (ascending: the band is the top byte)."""
    return _band_keys_many(signature[None, :], bands, rows)[0]


class _Hashed(NamedTuple):
    """A text as the index sees it: its shingles, their numbers (:class:`_ShingleNumbers`;
    only the numbered ones), its MinHash signature and its band keys."""

    text: str
    shingles: frozenset[str]
    numbers: np.ndarray
    signature: np.ndarray
    band_keys: np.ndarray


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
    #: The stored values are the low bytes of the MinHash values: their share of equal
    #: positions is ≥ that of the full values (plus ~(1 − J)/256), so no hit the full values
    #: keep is dropped. None disables verification.
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

    def __post_init__(self) -> None:
        if not 1 <= self.text_bands <= MAX_TEXT_BANDS or self.text_rows < 1:
            raise ValueError(f"need 1 <= text_bands <= {MAX_TEXT_BANDS} and text_rows >= 1")

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


def _bucket_add(table: dict, key: int, node_id: str | int) -> None:
    cur = table.get(key)
    if cur is None:
        table[key] = node_id
    elif isinstance(cur, set):
        cur.add(node_id)
    elif cur != node_id:
        table[key] = {cur, node_id}


def _bucket_remove(table: dict, key: int, node_id: str | int) -> None:
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


class _BandTable:
    """The MinHash LSH buckets of one user, every band in one structure: node ``slot`` is in
    bucket ``key`` (a band-tagged key, see :func:`_band_keys_many`).

    Most entries live in two numpy arrays sorted by key (``keys`` uint64, ``slots`` int32:
    12 bytes per entry, where a dict entry with its int key costs ~80); a lookup is one
    ``searchsorted`` for all bands at once. Nodes added since the last merge sit in a dict
    (``fresh``) and are merged in when they are more than an eighth of the rest (one
    ``np.insert``: linear, amortized over the batch). A removed node's entries stay in the
    arrays until the next merge, masked by ``dead``; its slot is not reused before that
    (:meth:`_RowStore.drop` with ``hold``), so a stale entry can never name another node.

    With the compiled lookup, a directory over the sorted keys (``_dir``: where the keys with
    each value of their top bits start, about one entry per 8 keys, 8 bytes each) replaces the
    binary search of each query key by two reads, each a cache miss on a large user.

    The layout changes nothing but speed and memory: ``lookup`` returns exactly the slots of
    the nodes that share a key with the query, whatever the history of adds and removes."""

    #: keys per directory entry (on average)
    keys_per_dir_entry = 8

    def __init__(self, bands: int, merge_min: int = 2048) -> None:
        self.bands = bands
        self.merge_min = merge_min
        self._keys = np.empty(0, dtype=np.uint64)
        self._slots = np.empty(0, dtype=np.int32)
        self._main = 0  # nodes in the arrays (dead ones included until the next merge)
        self._dead = np.zeros(0, dtype=bool)
        self._n_dead = 0
        #: nodes added since the last merge: slot -> its keys, and key -> slot | set of slots
        self._fresh_keys: dict[int, np.ndarray] = {}
        self._fresh: dict[int, Any] = {}
        self._dir_shift = np.uint64(56)
        self._dir = np.zeros(bands + 1, dtype=np.int64)

    def _set_arrays(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """The sorted arrays and their directory: ``_dir[p]`` is the first index whose key
        has ``key >> _dir_shift >= p`` (keys are below ``bands << 56``)."""
        self._keys, self._slots = keys, slots
        self._dir, self._dir_shift = key_directory(keys, self.bands, self.keys_per_dir_entry)

    def build(self, slots: np.ndarray, keys: np.ndarray) -> None:
        """Replace the contents with nodes ``slots`` having band keys ``keys`` (n, bands)."""
        flat = keys.reshape(-1)
        order = np.argsort(flat, kind="stable")
        self._set_arrays(flat[order], np.repeat(slots.astype(np.int32), self.bands)[order])
        self._main = len(slots)
        self._dead = np.zeros(int(slots.max()) + 1 if len(slots) else 0, dtype=bool)
        self._n_dead = 0
        self._fresh_keys, self._fresh = {}, {}

    def add(self, slot: int, keys: np.ndarray) -> None:
        self._fresh_keys[slot] = keys
        fresh = self._fresh
        for key in keys.tolist():
            if fresh.setdefault(key, slot) != slot:  # the key's bucket holds other nodes
                _bucket_add(fresh, key, slot)

    def remove(self, slot: int) -> bool:
        """Forget node ``slot``; False when its entries stay in the arrays until the next
        merge (then the caller must hold the slot back: see the class doc)."""
        keys = self._fresh_keys.pop(slot, None)
        if keys is not None:
            for key in keys.tolist():
                _bucket_remove(self._fresh, key, slot)
            return True
        if slot >= self._dead.size:
            grown = np.zeros(max(slot + 1, 2 * self._dead.size), dtype=bool)
            grown[: self._dead.size] = self._dead
            self._dead = grown
        self._dead[slot] = True
        self._n_dead += 1
        return False

    def needs_merge(self) -> bool:
        return len(self._fresh_keys) > max(self.merge_min, self._main // 8)

    def merge(self) -> list[int]:
        """Move the fresh nodes into the sorted arrays and drop dead entries; returns the
        slots of the dead nodes (free for reuse from now on)."""
        keys, slots = self._keys, self._slots
        released: list[int] = []
        if self._n_dead:
            dead = self._dead[slots]
            released = np.unique(slots[dead]).tolist()
            keys, slots = keys[~dead], slots[~dead]
            self._dead[:] = False
            self._n_dead = 0
        if self._fresh_keys:
            fs = np.fromiter(self._fresh_keys, dtype=np.int32, count=len(self._fresh_keys))
            fk = np.concatenate(list(self._fresh_keys.values()))
            fs = np.repeat(fs, self.bands)
            order = np.argsort(fk, kind="stable")
            fk, fs = fk[order], fs[order]
            at = np.searchsorted(keys, fk)
            keys, slots = np.insert(keys, at, fk), np.insert(slots, at, fs)
        self._set_arrays(keys, slots)
        self._main = len(keys) // self.bands if self.bands else 0
        if slots.size and int(slots.max()) >= self._dead.size:
            self._dead = np.zeros(int(slots.max()) + 1, dtype=bool)
        self._fresh_keys, self._fresh = {}, {}
        return released

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Sorted unique slots of the live nodes sharing at least one key with ``keys``
        (ascending band-tagged keys: one per band)."""
        extra = self._fresh_hits(keys)
        if USE_KERNELS:
            return _kernels.bucket_slots(
                self._keys, self._slots, self._dir, self._dir_shift, keys, self._dead, self._n_dead > 0, extra
            )
        parts = [extra]
        if self._keys.size:
            lo = np.searchsorted(self._keys, keys, "left")
            hi = np.searchsorted(self._keys, keys, "right")
            lens = hi - lo
            total = int(lens.sum())
            if total:
                # the ranges [lo, hi) laid end to end
                idx = np.arange(total) + np.repeat(lo - (np.cumsum(lens) - lens), lens)
                found = self._slots[idx]
                if self._n_dead:
                    found = found[~self._dead[found]]
                parts.append(found)
        found = np.concatenate(parts).astype(np.int64)
        if not found.size:
            return found
        found.sort()
        first = np.empty(found.size, dtype=bool)
        first[0] = True
        np.not_equal(found[1:], found[:-1], out=first[1:])
        return found[first]

    def _fresh_hits(self, keys: np.ndarray) -> np.ndarray:
        """The slots in the fresh buckets of ``keys`` (repeats possible)."""
        extra: list[int] = []
        if self._fresh:
            for cur in map(self._fresh.get, keys.tolist()):
                if cur is None:
                    continue
                if isinstance(cur, set):
                    extra.extend(cur)
                else:
                    extra.append(cur)
        return np.array(extra, dtype=np.int32)


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
        self._held: list[int] = []
        #: slot -> node id (None: free)
        self.ids: list[str | None] = []

    def put(self, node_id: str, row: np.ndarray) -> None:
        slot = self._slot.get(node_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            else:
                slot = len(self.ids)
                self.ids.append(None)
                if slot >= self._m.shape[0]:
                    grown = np.zeros((self._m.shape[0] * 2, self._m.shape[1]), dtype=self._m.dtype)
                    grown[: self._m.shape[0]] = self._m
                    self._m = grown
            self._slot[node_id] = slot
            self.ids[slot] = node_id
        self._m[slot] = row

    def drop(self, node_id: str, hold: bool = False) -> None:
        """Free the node's row; ``hold``: not reusable before :meth:`release`."""
        slot = self._slot.pop(node_id, None)
        if slot is not None:
            (self._held if hold else self._free).append(slot)
            self.ids[slot] = None

    def release(self, slots: Iterable[int]) -> None:
        """Make held rows reusable."""
        gone = set(slots)
        self._free.extend(s for s in self._held if s in gone)
        self._held = [s for s in self._held if s not in gone]

    def slot_of(self, node_id: str) -> int:
        return self._slot[node_id]

    def equal_counts(self, slots: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Per slot of ``slots``: how many positions of its row equal ``row``."""
        if USE_KERNELS:
            m = self._m
            if m.dtype == np.uint8 and m.shape[1] % 8 == 0:  # 8 bytes at a time
                return _kernels.equal_byte_counts(m.view(np.uint64), slots, np.ascontiguousarray(row).view(np.uint64))
            return _kernels.equal_counts(m, slots, row)
        return (self._m[slots] == row[None, :]).sum(axis=1, dtype=np.int64)

    def get(self, node_id: str) -> np.ndarray | None:
        slot = self._slot.get(node_id)
        return None if slot is None else self._m[slot]

    def rows(self, ids: Sequence[str]) -> np.ndarray:
        slots = np.fromiter((self._slot[i] for i in ids), dtype=np.int64, count=len(ids))
        return self._m[slots]


class _Ragged:
    """Variable-length int32 rows addressed by slot, end to end in one array (4 bytes per
    value, no object per row), so the rows of many slots are gathered in one numpy
    operation. A dropped row leaves a hole, squeezed out when holes exceed the rows kept."""

    def __init__(self) -> None:
        self._flat = np.zeros(1024, dtype=np.int32)
        self._used = 0
        self._holes = 0
        self.start = np.zeros(16, dtype=np.int64)
        self.length = np.zeros(16, dtype=np.int64)

    def put(self, slot: int, row: np.ndarray) -> None:
        if slot >= self.start.size:
            size = max(slot + 1, 2 * self.start.size)
            self.start = np.concatenate((self.start, np.zeros(size - self.start.size, dtype=np.int64)))
            self.length = np.concatenate((self.length, np.zeros(size - self.length.size, dtype=np.int64)))
        self.drop(slot)
        n = row.size
        if self._used + n > self._flat.size:
            if self._holes > self._used // 2:
                self._squeeze()
            if self._used + n > self._flat.size:
                grown = np.zeros(max(self._used + n, 2 * self._flat.size), dtype=np.int32)
                grown[: self._used] = self._flat[: self._used]
                self._flat = grown
        self._flat[self._used : self._used + n] = row
        self.start[slot], self.length[slot] = self._used, n
        self._used += n

    def drop(self, slot: int) -> None:
        if slot < self.length.size:
            self._holes += int(self.length[slot])
            self.length[slot] = 0

    def _squeeze(self) -> None:
        slots = np.flatnonzero(self.length)
        flat = self.gather(slots)
        self._flat[: flat.size] = flat
        self.start[slots] = np.cumsum(self.length[slots]) - self.length[slots]
        self._used, self._holes = int(flat.size), 0

    def member_counts(self, slots: np.ndarray, member: np.ndarray) -> np.ndarray:
        """Per slot of ``slots``: how many values of its row are marked in ``member``."""
        if USE_KERNELS:
            return _kernels.member_counts(self._flat, self.start, self.length, slots, member)
        sizes = self.length[slots]
        cum = np.concatenate(([0], np.cumsum(member[self.gather(slots)], dtype=np.int64)))
        ends = np.cumsum(sizes)
        return cum[ends] - cum[ends - sizes]

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """The rows of ``slots``, end to end (lengths: ``length[slots]``)."""
        lens = self.length[slots]
        total = int(lens.sum())
        if not total:
            return np.empty(0, dtype=np.int32)
        idx = np.arange(total) + np.repeat(self.start[slots] - (np.cumsum(lens) - lens), lens)
        return self._flat[idx]


class _ShingleNumbers:
    """Each distinct shingle of a user's indexed texts numbered once (per user, so no
    collision is possible), its :func:`shingle_hashes` value kept beside its number: one
    dictionary pass over a text's shingles gives both the numbers (exact Jaccard, see
    :meth:`_Ragged.member_counts`) and the hashes (MinHash), and a shingle's CRC-32 is
    computed once per user instead of once per text it occurs in. Numbers are never reused
    (the numbering is rebuilt with the index)."""

    def __init__(self) -> None:
        self._of: dict[str, int] = {}
        self._hash = np.zeros(1024, dtype=np.uint64)

    def __len__(self) -> int:
        return len(self._of)

    def lookup(self, shingles: Iterable[str], add: bool) -> tuple[np.ndarray, np.ndarray]:
        """(ascending numbers of the shingles, the hash of each shingle in some order);
        ``add``: number the shingles that have none yet (else they are left out of the
        numbers — no indexed node has them)."""
        of = self._of
        shingles = list(shingles)
        found = list(map(of.get, shingles))
        known = [n for n in found if n is not None]
        new = [sh for sh, n in zip(shingles, found, strict=True) if n is None] if len(known) < len(found) else []
        numbers = np.array(known, dtype=np.int64)
        new_hashes = shingle_hashes(new)
        hashes = np.concatenate((self._hash[numbers], new_hashes)) if new else self._hash[numbers]
        if add and new:
            first = len(of)
            of.update(zip(new, range(first, first + len(new)), strict=True))
            if len(of) > self._hash.size:
                grown = np.zeros(max(len(of), 2 * self._hash.size), dtype=np.uint64)
                grown[:first] = self._hash[:first]
                self._hash = grown
            self._hash[first : len(of)] = new_hashes
            numbers = np.concatenate((numbers, np.arange(first, len(of), dtype=np.int64)))
        numbers.sort()
        return numbers.astype(np.int32), hashes


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

    Memory per node of a hashed user: ``text_bands`` bucket entries of 12 bytes (see
    :class:`_BandTable`) + a ``num_perm``-byte row (the low byte of each MinHash value) + its
    shingle numbers (int32 each, ~70 for a sentence, end to end in one array; the per-user
    numbering keeps every shingle string once and is not trimmed when nodes go: it is rebuilt
    with the index) — ~1.3 KB of arrays for a sentence with the defaults, 4.8 KB of RSS per
    node measured for a 50k-node user (bench/RESULTS.md) — plus ``hyperplane_tables``
    dict entries + a float32 unit vector when it has an embedding. A user not hashed holds
    only a reference to each node's text and embedding."""

    #: fresh nodes are merged into the sorted bucket arrays past max(this, an eighth of them)
    band_merge_min = 2048

    def __init__(self, config: IndexConfig | None = None) -> None:
        self.config = config or IndexConfig()
        c = self.config
        self._minhash = shared_minhasher(c.num_perm, c.seed)
        #: the least count of equal values whose share passes ``text_verify_floor`` (the
        #: same float test, ``k / num_perm >= floor``, done once instead of per hit)
        floor = c.text_verify_floor
        passing = (k for k in range(c.num_perm + 1) if floor is None or k / c.num_perm >= floor)
        self._verify_min_equal = next(passing, c.num_perm + 1)
        #: every indexed node: node_id -> (text, embedding) — what the hash tables are built from
        self._nodes: dict[str, tuple[str, Sequence[float] | None]] = {}
        #: the hash tables exist (built the first time a query finds more than
        #: ``exact_scan_below`` nodes; kept in step from then on)
        self._hashed = False
        #: shingle sets of the nodes while the user is scanned exactly (at most
        #: ``exact_scan_below`` entries; dropped when the user grows past that)
        self._shingles: dict[str, tuple[str, frozenset[str]]] = {}
        # the hash tables (created by ``_build``: a small user never needs them)
        self._bands: _BandTable | None = None
        #: per node, the low byte of each MinHash value (b-bit MinHash, b = 8): what bucket
        #: hits are verified on (4× less memory than the values; see ``candidates``)
        self._sigs: _RowStore | None = None
        #: the last text hashed (a query or an added node): the node a candidate forms has
        #: the candidate's text, so it is not hashed twice
        self._last: _Hashed | None = None
        #: hashed users: each distinct shingle of the indexed texts numbered, and per node the
        #: sorted numbers of its shingle set — exact Jaccard of many nodes at once
        #: (:meth:`_jaccard_slots`)
        self._vocab = _ShingleNumbers()
        self._shingle_ids = _Ragged()  # by signature slot
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
    ) -> SimilarityIndex:
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

    def _hashed_text(self, text: str, shingles: frozenset[str] | None = None, add: bool = False) -> _Hashed:
        """The shingles, their numbers, the MinHash signature and the band keys of a text
        (``add``: every shingle numbered, for a node being indexed). The last one is kept:
        its numbers stay right because every text added after it replaces it."""
        last = self._last
        if last is not None and last.text == text and (not add or last.numbers.size == len(last.shingles)):
            return last
        if shingles is None:
            shingles = last.shingles if last is not None and last.text == text else text_shingles(text)
        numbers, hashes = self._vocab.lookup(shingles, add)
        if last is not None and last.text == text:  # a query's text, now added: numbers only
            sig, keys = last.signature, last.band_keys
        else:
            sig = self._minhash.signature_of_hashes(hashes)
            keys = _band_keys(sig, self.config.text_bands, self.config.text_rows)
        self._last = _Hashed(text, shingles, numbers, sig, keys)
        return self._last

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
        hashed = self._hashed_text(text, add=True)
        sigs, bands = self._sigs, self._bands
        assert sigs is not None and bands is not None
        sigs.put(node_id, hashed.signature.astype(np.uint8))  # the low byte of each value
        slot = sigs.slot_of(node_id)
        self._shingle_ids.put(slot, hashed.numbers)
        bands.add(slot, hashed.band_keys)  # the buckets hold signature slots (ints)
        if bands.needs_merge():
            sigs.release(bands.merge())
        self._hash_embedding(node_id, embedding)

    def _hash_embedding(self, node_id: str, embedding: Sequence[float] | None) -> None:
        if usable_embedding(embedding):
            unit = unit_vector(embedding)
            dim = unit.shape[0]
            codes = self._hyperplanes(dim).codes(unit)
            for table, code in zip(self._emb_tables[dim], codes, strict=True):
                _bucket_add(table, code, node_id)
            self._emb[node_id] = (dim, codes)
            self._emb_rows[dim].put(node_id, unit.astype(np.float32))

    def _build(self, chunk: int = 16) -> None:
        """Hash every node (in node_id order, so the layout does not depend on history);
        the signatures and band keys of ``chunk`` nodes at a time in one numpy pass."""
        c = self.config
        self._hashed = True
        self._bands = _BandTable(c.text_bands, self.band_merge_min)
        sigs = self._sigs = _RowStore(c.num_perm, np.uint8)
        self._last = None
        order = sorted(self._nodes)
        all_keys = []
        for i in range(0, len(order), chunk):
            ids = order[i : i + chunk]
            numbered = [self._vocab.lookup(text_shingles(self._nodes[n][0]), add=True) for n in ids]
            block = self._minhash.signatures([hashes for _, hashes in numbered])
            all_keys.append(_band_keys_many(block, c.text_bands, c.text_rows))
            low = block.astype(np.uint8)
            for j, (node_id, (numbers, _)) in enumerate(zip(ids, numbered, strict=True)):
                sigs.put(node_id, low[j])
                self._shingle_ids.put(sigs.slot_of(node_id), numbers)
                self._hash_embedding(node_id, self._nodes[node_id][1])
        slots = np.fromiter((sigs.slot_of(n) for n in order), dtype=np.int64, count=len(order))
        keys = np.concatenate(all_keys) if all_keys else np.empty((0, c.text_bands), dtype=np.uint64)
        self._bands.build(slots, keys)

    def remove(self, node_id: str) -> None:
        """Forget a node (no-op when it is not indexed)."""
        if self._nodes.pop(node_id, None) is None:
            return
        self._shingles.pop(node_id, None)
        if not self._hashed:
            return
        sigs, bands = self._sigs, self._bands
        assert sigs is not None and bands is not None
        slot = sigs.slot_of(node_id)
        sigs.drop(node_id, hold=not bands.remove(slot))
        self._shingle_ids.drop(slot)
        emb = self._emb.pop(node_id, None)
        if emb is not None:
            dim, codes = emb
            for table, code in zip(self._emb_tables[dim], codes, strict=True):
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

    def _jaccard_slots(self, query: _Hashed, at: np.ndarray) -> np.ndarray:
        """``jaccard(query.shingles, text_shingles(text of node))`` for the nodes in signature
        slots ``at`` — the same floats, bit for bit (integer counts, one division), computed on
        the numbered shingle sets in one pass instead of one set per node."""
        if not at.size:
            return np.empty(0, dtype=np.float64)
        member = np.zeros(len(self._vocab), dtype=bool)  # which numbered shingles the query has
        member[query.numbers] = True
        rows = self._shingle_ids
        sizes = rows.length[at]
        inter = rows.member_counts(at, member)
        union = sizes + len(query.shingles) - inter
        # int / int in float64 is the correctly rounded quotient, as Python's int / int
        return np.where(union == 0, 0.0, inter / np.maximum(union, 1))

    def candidates(
        self, text: str, embedding: Sequence[float] | None = None, shingles: frozenset[str] | None = None
    ) -> set[str]:
        """The live nodes worth scoring exactly against (text, embedding): a small set.

        Nodes that will be scored by cosine (they and the query have embeddings of the same
        dimension) come from the hyperplane tables; every other node from the MinHash bands.
        Bucket hits are verified on the stored signatures / vectors (see IndexConfig).
        ``shingles``: ``text_shingles(text)`` when the caller has it already."""
        return self._find(text, embedding, shingles, None, False)[0]

    def scored_candidates(
        self,
        text: str,
        embedding: Sequence[float] | None = None,
        shingles: frozenset[str] | None = None,
        text_floor: float | None = None,
    ) -> tuple[set[str], dict[str, float]]:
        """:meth:`candidates` with the exact Jaccard of the nodes found through the MinHash bands
        (node_id -> the float ``jaccard`` gives, bit for bit; empty while the user is scanned
        exactly). ``text_floor``: when the query has no usable embedding (so every node is
        scored by Jaccard), nodes whose exact Jaccard is below it are left out."""
        return self._find(text, embedding, shingles, text_floor, True)

    def _find(
        self,
        text: str,
        embedding: Sequence[float] | None,
        shingles: frozenset[str] | None,
        text_floor: float | None,
        score: bool,
    ) -> tuple[set[str], dict[str, float]]:
        c = self.config
        if len(self._nodes) <= c.exact_scan_below:
            self.last_raw_candidates = len(self._nodes)
            return set(self._nodes), {}
        if not self._hashed:
            self._build()
        out: set[str] = set()
        raw = 0
        dim = None
        if usable_embedding(embedding):
            unit = unit_vector(embedding)
            dim = unit.shape[0]
            if dim in self._emb_tables:
                hp = self._planes[dim]
                hits: set[str] = set()
                for table, code in zip(self._emb_tables[dim], hp.codes(unit), strict=True):
                    hits.update(_bucket_iter(table, code))
                    if c.multiprobe:
                        for j in range(hp.bits):
                            hits.update(_bucket_iter(table, code ^ (1 << j)))
                raw += len(hits)
                if hits and c.embedding_verify_floor is not None:
                    ids = list(hits)
                    est = self._emb_rows[dim].rows(ids) @ unit.astype(np.float32)
                    hits = {i for i, e in zip(ids, est.tolist(), strict=True) if e >= c.embedding_verify_floor}
                out |= hits
        query = self._hashed_text(text, shingles)
        sigs, bands = self._sigs, self._bands
        assert sigs is not None and bands is not None
        at = bands.lookup(query.band_keys)
        slot_ids = sigs.ids
        if dim is not None and at.size:
            # scored by cosine: their recall comes from the hyperplanes
            emb = self._emb
            at = np.fromiter(
                (s for s in at.tolist() if (e := emb.get(slot_ids[s])) is None or e[0] != dim),
                dtype=np.int64,
            )
        raw += at.size
        if at.size and c.text_verify_floor is not None:
            # the share of equal low bytes is at least the share of equal values (b-bit
            # MinHash): this keeps every hit the full values would keep, and a few more
            equal = sigs.equal_counts(at, query.signature.astype(np.uint8))
            at = at[equal >= self._verify_min_equal]
        self.last_raw_candidates = raw
        if not score:
            out.update(slot_ids[s] for s in at.tolist())
            return out, {}
        jac = self._jaccard_slots(query, at)
        if text_floor is not None and dim is None:
            keep = jac >= text_floor
            at, jac = at[keep], jac[keep]
        ids = [slot_ids[s] for s in at.tolist()]
        out.update(ids)
        return out, dict(zip(ids, jac.tolist(), strict=True))
