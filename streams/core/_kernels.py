"""Compiled loops of the similarity index (numba), each the same integers as the numpy
expression it replaces in :mod:`streams.core.similarity`, bit for bit.

Only integer arithmetic and comparisons, no floating point: the results do not depend on
the CPU, the compiler or the order of operations. When numba cannot be imported
(``AVAILABLE`` is False) the index uses its numpy expressions instead, with the same
results (tests/core/test_index_layout.py compares the two on random inputs).

What it costs: numba and llvmlite are binary wheels (no compiler needed); each kernel is
compiled on its first call in a process (~1 s for all of them), and the machine code is cached
next to this file in ``__pycache__`` when that directory is writable.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

#: numba is importable (it is imported, and each kernel compiled, on a kernel's first call:
#: importing the core stays cheap for the CLI)
AVAILABLE = importlib.util.find_spec("numba") is not None

_P31 = (1 << 31) - 1


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    compiled: list[Callable[..., Any]] = []

    def call(*args: Any) -> Any:
        if not compiled:
            import numba

            compiled.append(numba.njit(cache=True, nogil=True)(fn))
        return compiled[0](*args)

    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


@_jit
def minhash(h, a, b):  # pragma: no cover - compiled
    """min over x in h of (a[i]·x + b[i]) mod (2^31 − 1), per i (2^31 − 1 when h is empty);
    a, b, h uint64 with a·x + b < 2^64."""
    k = a.shape[0]
    out = np.empty(k, dtype=np.uint64)
    p = np.uint64(_P31)
    for i in range(k):
        ai = a[i]
        bi = b[i]
        m = p
        for j in range(h.shape[0]):
            v = (ai * h[j] + bi) % p
            if v < m:
                m = v
        out[i] = m
    return out


@_jit
def bucket_slots(keys, slots, query, dead, any_dead):  # pragma: no cover - compiled
    """Sorted unique ``slots[j]`` for every j with ``keys[j]`` in ``query`` (``keys``
    ascending; entries whose slot is ``dead`` skipped when ``any_dead``)."""
    n = keys.shape[0]
    total = 0
    los = np.empty(query.shape[0], dtype=np.int64)
    his = np.empty(query.shape[0], dtype=np.int64)
    for i in range(query.shape[0]):
        lo = np.searchsorted(keys, query[i], side="left")
        hi = lo
        while hi < n and keys[hi] == query[i]:
            hi += 1
        los[i] = lo
        his[i] = hi
        total += hi - lo
    found = np.empty(total, dtype=np.int64)
    f = 0
    for i in range(query.shape[0]):
        for j in range(los[i], his[i]):
            s = slots[j]
            if any_dead and dead[s]:
                continue
            found[f] = s
            f += 1
    found = np.sort(found[:f])
    u = 0
    for j in range(f):
        if j == 0 or found[j] != found[j - 1]:
            found[u] = found[j]
            u += 1
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
    out = np.empty(at.shape[0], dtype=np.int64)
    for i in range(at.shape[0]):
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
    out = np.empty(at.shape[0], dtype=np.int64)
    k = query.shape[0]
    for i in range(at.shape[0]):
        r = words[at[i]]
        c = np.uint64(0)
        for j in range(k):
            x = r[j] ^ query[j]
            t = ~(((x & m7) + m7) | x | m7)
            c += ((t >> seven) * ones) >> top
        out[i] = c
    return out
