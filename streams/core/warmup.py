"""Warm-up: run the consolidation core once on a synthetic user before a worker takes records.

The similarity index's compiled loops (streams/core/_kernels.py) are compiled, or loaded from
numba's cache, on their first call in a process: about half a second with a warm cache, longer
without one. Without a warm-up that first call happens inside the first batch that meets a user
past ``exact_scan_below`` live nodes, and every record of that batch, and of the batches queued
behind it, waits for it (in a fresh process, building and querying a first user of 64 nodes took
0.42-0.60 s; after the warm-up, 0.01 s). `warm_up` pays it at start-up instead. The synthetic user is built in memory and
dropped: nothing is read from or written to any table or topic.
"""

from __future__ import annotations

import dataclasses
import time

from .consolidation import ConsolidationPolicy
from .nodes import complete_node
from .process import process_candidate
from .promotion import PromotionPolicy
from .similarity import IndexConfig
from .state import UserMemory

#: the warm-up user's embedding width (the compiled loops do not depend on it)
_DIM = 8
_WORDS = ("tea", "coffee", "morning", "evening", "garden", "music", "train", "book", "river", "city",
          "winter", "summer", "dog", "cat", "bread", "rice")


def _text(i: int) -> str:
    w = _WORDS
    return f"the user likes {w[i % 16]} and {w[(i * 7 + 3) % 16]} with {w[(i * 5 + 1) % 16]} on day {i}"


def _embedding(i: int) -> list[float]:
    v = [float(((i + 1) * (k + 3)) % 11 - 5) or 1.0 for k in range(_DIM)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def warm_up(index_config: IndexConfig | None = None) -> float:
    """Consolidate a few candidates against a synthetic user with more live nodes than
    ``exact_scan_below`` (so its index is built and queried, text and embeddings); the seconds
    it took."""
    # the loops are the same whatever the threshold: an operator's large one need not make a large user
    config = index_config or IndexConfig()
    config = dataclasses.replace(config, exact_scan_below=min(config.exact_scan_below, 32))
    started = time.perf_counter()
    nodes = [complete_node({
        "node_id": f"warm-up-{i}", "motebit_id": "warm-up", "content": _text(i), "sensitivity": "personal",
        "memory_type": "semantic", "confidence": 0.7, "created_at": 1_700_000_000_000, "embedding": _embedding(i),
    }) for i in range(config.exact_scan_below + 16)]
    um = UserMemory.from_nodes("warm-up", nodes, index_config=config)
    for i, (content, embedding) in enumerate([(_text(3), _embedding(3)), (_text(3) + " again", None),
                                              ("an unrelated memory about mountains", _embedding(99))]):
        process_candidate(um, {
            "candidate_id": f"warm-up-{i}", "motebit_id": "warm-up", "content": content, "sensitivity": "personal",
            "source": "user_stated", "memory_type": "semantic", "timestamp": 1_700_000_100_000 + i,
            "embedding": embedding}, ConsolidationPolicy(), PromotionPolicy())
    return time.perf_counter() - started
