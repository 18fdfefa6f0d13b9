"""Compiled loops of the similarity index (numba), each the same integers as the numpy
expression it replaces in :mod:`streams.core.similarity`, bit for bit.

Only integer arithmetic and comparisons, no floating point: the results do not depend on
the CPU, the compiler or the order of operations. When numba cannot be imported
(``AVAILABLE`` is False) the index uses its numpy expressions instead, with the same
results (tests/core/test_index_layout.py compares the two on random inputs).

What it costs: numba and llvmlite are binary wheels (no compiler needed); each kernel is
compiled on its first call in a process (~1 s for all of them), and the machine code is cached
next to this file in ``__pycache__`` when that directory is writable.

The loops over bucket hits read rows scattered over arrays of tens of megabytes (a 100k-node
user): each row is a cache miss. They ask the CPU to fetch the rows a few iterations ahead
(:func:`prefetch`, LLVM's ``llvm.prefetch``: a hint that changes no result), so the misses
overlap instead of being waited for one by one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, cast

import numpy as np

#: numba is importable (it is imported, and each kernel compiled, on a kernel's first call:
#: importing the core stays cheap for the CLI)
AVAILABLE = importlib.util.find_spec("numba") is not None

_P31 = (1 << 31) - 1
#: how many rows ahead the loops over bucket hits ask for their rows
AHEAD = 8


def prefetch(arr: Any, i: Any) -> None:  # pragma: no cover - replaced before any kernel compiles
    """Ask the CPU to bring element ``i`` of the C-contiguous array ``arr`` (flat index) into
    the cache; no effect on any result. Replaced by :func:`_prefetch_intrinsic` on the first
    kernel call (a numba intrinsic: numba is imported only then)."""


def trailing_zeros(x: Any) -> Any:  # pragma: no cover - replaced before any kernel compiles
    """The number of trailing zero bits of a non-zero integer (LLVM's ``cttz``, numba's
    intrinsic), put in place on the first kernel call as :func:`prefetch` is."""


def _prefetch_intrinsic() -> Any:
    from llvmlite import ir  # type: ignore[import-untyped]  # (ships no type information)
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx: Any, arr: Any, i: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            where = builder.bitcast(builder.gep(ary.data, [args[1]]), i8p)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
            )
            builder.call(fn, [where, i32(0), i32(3), i32(1)])  # read, keep in all cache levels, data
            return context.get_dummy_value()

        return types.void(arr, types.intp), codegen

    return prefetch


_intrinsics_installed = False


def _install_intrinsics() -> None:
    """Put the intrinsics in place of :func:`prefetch` and :func:`trailing_zeros` (the
    kernels name them as globals)."""
    global prefetch, trailing_zeros, _intrinsics_installed
    if not _intrinsics_installed:
        from numba.cpython.unsafe.numbers import trailing_zeros as cttz

        prefetch, trailing_zeros = _prefetch_intrinsic(), cast(Any, cttz)
        _intrinsics_installed = True


#: the kernels compiled (or loaded from numba's cache) in this process, by name
_compiled: set[str] = set()


def compiled() -> frozenset[str]:
    """The names of the kernels compiled (or loaded) so far in this process."""
    return frozenset(_compiled)


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    jitted: list[Callable[..., Any]] = []

    def call(*args: Any) -> Any:
        if not jitted:
            import numba

            _install_intrinsics()
            jitted.append(numba.njit(cache=True, nogil=True)(fn))
            _compiled.add(fn.__name__)
        return jitted[0](*args)

    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


@_jit
def minhash(h, a, b):  # pragma: no cover - compiled
    """min over x in h of (a[i]·x + b[i]) mod (2^31 − 1), per i (2^31 − 1 when h is empty);
    a, b, h uint64 below 2^31 − 1 (so a·x + b < 2^62). The modulo without a division, as
    ``similarity._mod_p31``: two folds ``(v & p) + (v >> 31)`` leave ``v ≡ a·x + b`` with
    ``v ≤ p``, and ``p`` itself is 0."""
    k = a.shape[0]
    out = np.empty(k, dtype=np.uint64)
    p = np.uint64(_P31)
    s31 = np.uint64(31)
    zero = np.uint64(0)
    for i in range(k):
        ai = a[i]
        bi = b[i]
        m = p
        for j in range(h.shape[0]):
            v = ai * h[j] + bi
            v = (v & p) + (v >> s31)
            v = (v & p) + (v >> s31)
            if v == p:
                v = zero
            if v < m:
                m = v
        out[i] = m
    return out


@_jit
def bucket_slots(keys, slots, directory, shift, query, dead, any_dead, extra):  # pragma: no cover - compiled
    """Sorted unique ``slots[j]`` for every j with ``keys[j]`` in ``query`` (``keys``
    ascending; entries whose slot is ``dead`` skipped when ``any_dead``), and the slots of
    ``extra`` (the fresh buckets' hits: never dead). ``directory[p]``
    is the first j with ``keys[j] >> shift >= p`` (so the keys equal to q lie in
    ``[directory[q >> shift], directory[(q >> shift) + 1])``: a few entries, not a binary
    search over all of them)."""
    nq = query.shape[0]
    prefix = np.empty(nq, dtype=np.int64)
    for i in range(nq):
        prefix[i] = np.int64(query[i] >> shift)
        prefetch(directory, prefix[i])
    los = np.empty(nq, dtype=np.int64)
    his = np.empty(nq, dtype=np.int64)
    for i in range(nq):
        los[i] = directory[prefix[i]]
        his[i] = directory[prefix[i] + 1]
        prefetch(keys, los[i])
        prefetch(slots, los[i])
    total = 0
    for i in range(nq):
        lo = los[i] + np.searchsorted(keys[los[i] : his[i]], query[i], side="left")
        hi = lo
        while hi < his[i] and keys[hi] == query[i]:
            hi += 1
        los[i] = lo
        his[i] = hi
        total += hi - lo
    found = np.empty(total + extra.shape[0], dtype=np.int64)
    found[: extra.shape[0]] = extra
    f = extra.shape[0]
    for i in range(nq):
        for j in range(los[i], his[i]):
            s = slots[j]
            if any_dead and dead[s]:
                continue
            found[f] = s
            f += 1
    # sorted and unique without a sort (a comparison sort of ~1,400 slots cost more than
    # the rest of the lookup): one bit per slot, then the set bits in ascending order
    top = 0
    for j in range(f):
        top = max(top, found[j])
    words = np.zeros((top >> 6) + 1, dtype=np.uint64)
    one = np.uint64(1)
    for j in range(f):
        s = found[j]
        words[s >> 6] |= one << np.uint64(s & 63)
    u = 0
    for w in range(words.shape[0]):
        bits = words[w]
        while bits:
            found[u] = (w << 6) + np.int64(trailing_zeros(bits))
            u += 1
            bits &= bits - one
    return found[:u]


@_jit
def equal_counts(rows, at, query):  # pragma: no cover - compiled
    """Per slot s in ``at``: how many positions of ``rows[s]`` equal ``query``."""
    out = np.empty(at.shape[0], dtype=np.int64)
    k = query.shape[0]
    for i in range(at.shape[0]):
        r = rows[at[i]]
        c = 0
        for j in range(k):
            if r[j] == query[j]:
                c += 1
        out[i] = c
    return out


@_jit
def member_counts(flat, start, length, at, member):  # pragma: no cover - compiled
    """Per slot s in ``at``: how many values of row s (``flat[start[s]:start[s] +
    length[s]]``) are marked in ``member``."""
    n = at.shape[0]
    out = np.empty(n, dtype=np.int64)
    for i in range(min(n, 2 * AHEAD)):
        prefetch(start, at[i])
        prefetch(length, at[i])
    for i in range(n):
        if i + 2 * AHEAD < n:
            prefetch(start, at[i + 2 * AHEAD])
            prefetch(length, at[i + 2 * AHEAD])
        if i + AHEAD < n:
            ahead = at[i + AHEAD]
            for line in range(0, length[ahead], 16):  # 16 int32 a cache line
                prefetch(flat, start[ahead] + line)
        s = at[i]
        c = 0
        for j in range(start[s], start[s] + length[s]):
            if member[flat[j]]:
                c += 1
        out[i] = c
    return out


@_jit
def equal_byte_counts(words, at, query):  # pragma: no cover - compiled
    """``equal_counts`` of uint8 rows seen as uint64 words (8 bytes a word): per word, the
    zero bytes of ``row ^ query`` counted with the exact SWAR test (high bit of each byte of
    ``~(((x & 0x7F..) + 0x7F..) | x | 0x7F..)`` set iff that byte of x is 0)."""
    m7 = np.uint64(0x7F7F7F7F7F7F7F7F)
    ones = np.uint64(0x0101010101010101)
    seven = np.uint64(7)
    top = np.uint64(56)
    n = at.shape[0]
    out = np.empty(n, dtype=np.int64)
    k = query.shape[0]
    for i in range(n):
        if i + AHEAD < n:
            for line in range(0, k, 8):  # 8 words a cache line
                prefetch(words, at[i + AHEAD] * k + line)
        r = words[at[i]]
        c = np.uint64(0)
        for j in range(k):
            x = r[j] ^ query[j]
            t = ~(((x & m7) + m7) | x | m7)
            c += ((t >> seven) * ones) >> top
        out[i] = c
    return out


@_jit
def band_keys(signatures, bands, rows, mix, key_mask, band_shift):  # pragma: no cover - compiled
    """(n, bands) band-tagged keys of n signatures: per band, ``k = k·mix + value`` over
    its rows (uint64, wrapping), cut to 56 bits (``key_mask``), tagged ``band << 56``."""
    n = signatures.shape[0]
    out = np.empty((n, bands), dtype=np.uint64)
    for i in range(n):
        for b in range(bands):
            k = signatures[i, b * rows]
            for j in range(1, rows):
                k = k * mix + signatures[i, b * rows + j]
            out[i, b] = (k & key_mask) | (np.uint64(b) << band_shift)
    return out
