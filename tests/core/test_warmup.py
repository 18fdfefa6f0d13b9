"""streams/core/warmup.py: after the warm-up, a worker's first real user past the exact-scan
threshold compiles (or loads) no kernel of its own: the first batch does not wait for numba."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from streams.core import _kernels

FRESH_PROCESS = textwrap.dedent("""
    import random, sys
    sys.path.insert(0, ".")
    from bench.bench_consolidation import build, candidates, vocabulary
    from streams.core import ConsolidationPolicy, PromotionPolicy, _kernels, process_candidate
    from streams.core.similarity import IndexConfig
    from streams.core.warmup import warm_up

    warm_up(IndexConfig())
    after_warm_up = _kernels.compiled()
    rnd = random.Random(7)
    vocab = vocabulary(rnd, 3000)
    for dim in (0, 384):  # text only, and the embeddings of a real model's width
        um, nodes, _ = build(200, rnd, vocab, dim, IndexConfig())
        for c in candidates(rnd, nodes, vocab, 30, dim):
            process_candidate(um, c, ConsolidationPolicy(), PromotionPolicy())
    print(sorted(after_warm_up))
    print(sorted(_kernels.compiled()))
""")


@pytest.mark.skipif(not _kernels.AVAILABLE, reason="numba is not installed: the index uses numpy, nothing to warm")
def test_after_the_warm_up_a_real_user_compiles_no_kernel():
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, check=True, timeout=300)
    warmed, used = out.stdout.strip().splitlines()[-2:]
    assert warmed != "[]", "the warm-up compiled nothing"
    assert used == warmed, f"kernels first compiled by a real user: warm-up {warmed}, then {used}"


def test_the_warm_up_user_is_small_whatever_the_threshold(monkeypatch):
    from streams.core import warmup
    from streams.core.similarity import IndexConfig

    built = []
    from_nodes = warmup.UserMemory.from_nodes

    def recording(user, nodes, **kw):
        built.append((len(nodes), kw["index_config"].exact_scan_below))
        return from_nodes(user, nodes, **kw)

    monkeypatch.setattr(warmup.UserMemory, "from_nodes", recording)
    assert warmup.warm_up(IndexConfig(exact_scan_below=4)) >= 0.0
    assert warmup.warm_up(IndexConfig(exact_scan_below=4)) >= 0.0  # twice in a process: nothing left over
    # an operator's huge exact-scan threshold does not make the warm-up build a huge user
    warmup.warm_up(IndexConfig(exact_scan_below=10_000_000))
    assert built == [(20, 4), (20, 4), (48, 32)]  # always past the threshold it is built with
