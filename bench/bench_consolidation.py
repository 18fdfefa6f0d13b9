"""Consolidation throughput of the pure core for one user with 1k / 10k / 100k live nodes.

    .venv/bin/python bench/bench_consolidation.py                 # text + embeddings, 1k..100k
    .venv/bin/python bench/bench_consolidation.py --sizes 1000,10000 --decisions 500

For each size it builds a UserMemory from node records (the restart path), then runs
``process_candidate`` (validate → dedup → hard rules → gate → decide → apply → promotion)
for a mix of candidates: 1/3 exact re-statements of an existing memory (merge), 1/3 one-word
edits of one (contradiction band / merge), 1/3 new memories (accept). It reports
decisions/s (wall clock, and per CPU-second of this process: the figure that depends
least on what else runs on the machine), a digest of every output (decision, ledger events,
node rows: equal digests from two versions of the core mean identical outputs), the mean number of bucket hits, of verified candidates and of nodes scored
exactly — and, for comparison, the brute-force decider (a scan of every live node) on a few
candidates, with how many of its decisions the index's decider matches on the same state. Synthetic memories are drawn from 40 sentence templates over a 20,000-word
pseudo-vocabulary, so unrelated memories share template words like real ones do
("user prefers …"). No broker is involved: this measures the core only.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from streams.core import (  # noqa: E402
    ConsolidationPolicy,
    DeterministicDecider,
    IndexConfig,
    UserMemory,
    process_candidate,
)
from streams.core.nodes import complete_node  # noqa: E402
from streams.core.process import _DEFAULT_DECIDER  # noqa: E402

TEMPLATES = [
    "user prefers {} over {}", "user's {} is named {}", "user lives in {} near the {}",
    "user works as a {} at {}", "user is allergic to {} and {}", "user likes {} in the {}",
    "user's favourite {} is {}", "user speaks {} and a little {}", "user drives a {} {}",
    "user's {} birthday is in {}", "user plays {} every {}", "user is learning {} with {}",
    "user booked a {} trip to {}", "meeting with {} moved to {}", "user's doctor is {} in {}",
    "user wants to visit {} before {}", "user reads {} books about {}", "user hates {} at {}",
    "user's daughter studies {} at {}", "user's son plays {} for {}", "user runs {} kilometers on {}",
    "user switched from {} to {}", "user's team uses {} for {}", "user pays {} for {}",
    "user has a {} named {}", "user cooks {} on {}", "user grew up in {} with {}",
    "user keeps {} in the {}", "user is vegetarian except for {} at {}", "user's password manager is {} on {}",
    "user collects {} from {}", "user volunteers at {} on {}", "remind user about {} every {}",
    "user's commute is {} minutes by {}", "user sleeps better with {} and {}", "user's gym is {} near {}",
    "user is saving for a {} in {}", "user's partner works at {} in {}", "user avoids {} after {}",
    "user's project {} launches in {}",
]
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "va", "den", "mar", "lin", "tor", "bel",
             "qu", "es", "an", "or", "ix", "um", "zel", "fra", "gon", "wit", "pra", "sul", "ech", "bo"]


def vocabulary(rnd: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(2, 4))))
    return sorted(words)


def memory_text(rnd: random.Random, vocab: list[str]) -> str:
    t = rnd.choice(TEMPLATES)
    s = t.format(*(rnd.choice(vocab) for _ in range(t.count("{}"))))
    extra = " ".join(rnd.choice(vocab) for _ in range(rnd.randint(0, 4)))
    return f"{s} {extra}".strip()


def one_word_edit(rnd: random.Random, text: str, vocab: list[str]) -> str:
    w = text.split()
    w[rnd.randrange(len(w))] = rnd.choice(vocab)
    return " ".join(w)


def unit(rnd: random.Random, dim: int) -> list[float]:
    v = [rnd.gauss(0, 1) for _ in range(dim)]
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


def near(rnd: random.Random, v: list[float], noise: float) -> list[float]:
    w = [x + rnd.gauss(0, noise) for x in v]
    n = sum(x * x for x in w) ** 0.5
    return [x / n for x in w]


def build(n: int, rnd: random.Random, vocab: list[str], dim: int, config: IndexConfig) -> tuple[UserMemory, list[dict], float]:
    nodes = []
    for i in range(n):
        nodes.append(complete_node({
            "node_id": f"n{i:06d}", "motebit_id": "bench", "content": memory_text(rnd, vocab),
            "sensitivity": "personal", "memory_type": "semantic", "confidence": 0.7,
            "created_at": 1_700_000_000_000, "embedding": unit(rnd, dim) if dim else None,
        }))
    t0 = time.perf_counter()
    um = UserMemory.from_nodes("bench", nodes, index_config=config)
    # the hash tables are built on the first query past exact_scan_below (and the index's
    # compiled loops, if any, compiled or loaded from their cache)
    query = getattr(um.index, "scored_candidates", None)
    if query is not None:
        query(nodes[0]["content"], text_floor=0.5)
    else:
        um.index.candidates(nodes[0]["content"])
    return um, nodes, time.perf_counter() - t0


def candidates(rnd: random.Random, nodes: list[dict], vocab: list[str], count: int, dim: int) -> list[dict]:
    out = []
    for i in range(count):
        kind = i % 3
        base = rnd.choice(nodes)
        if kind == 0:
            text, emb = base["content"], (near(rnd, base["embedding"], 0.01) if dim else None)
        elif kind == 1:
            text, emb = one_word_edit(rnd, base["content"], vocab), (near(rnd, base["embedding"], 0.08) if dim else None)
        else:
            text, emb = memory_text(rnd, vocab), (unit(rnd, dim) if dim else None)
        out.append({
            "candidate_id": f"bench-{i}", "motebit_id": "bench", "content": text, "sensitivity": "personal",
            "source": "user_stated", "memory_type": "semantic", "timestamp": 1_700_000_100_000 + i, "embedding": emb,
        })
    return out


def outputs_digest(outcomes: list) -> str:
    """SHA-256 of every decision (action, code, target node, score), ledger event and node
    row, ids included, in order: equal digests from two versions of the core mean the same
    outputs for the whole run."""
    h = hashlib.sha256()
    for out in outcomes:
        d = out.decision
        record = {
            "decision": None if d is None else [d.action, d.code, d.existing_node_id, d.score, d.measure, d.reason],
            "ledger": out.ledger, "nodes": out.node_upserts, "deleted": out.node_deletions,
        }
        h.update(json.dumps(record, sort_keys=True, default=repr).encode())
    return h.hexdigest()


def run(sizes: list[int], decisions: int, dim: int, brute: int, seed: int, config: IndexConfig) -> list[dict]:
    rnd = random.Random(seed)
    vocab = vocabulary(rnd, 20_000)
    rows = []
    for n in sizes:
        gc.collect()
        um, nodes, build_s = build(n, rnd, vocab, dim, config)
        cands = candidates(rnd, nodes, vocab, decisions, dim)
        raw = verified = scored = 0
        actions: dict[str, int] = {}
        outcomes = []
        t0, cpu0 = time.perf_counter(), time.process_time()
        for c in cands:
            out = process_candidate(um, c)
            raw += um.index.last_raw_candidates
            scored += _DEFAULT_DECIDER.last_scored
            a = out.decision.action if out.decision else "none"
            actions[a] = actions.get(a, 0) + 1
            outcomes.append(out)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        digest = outputs_digest(outcomes)
        # verified-candidate size, measured separately on the same queries
        for c in cands[:100]:
            verified += len(um.index.candidates(c["content"], c["embedding"]))
        brute_rate = agree = None
        if brute:
            # the same candidates decided again on the final state, by the index and by the
            # brute-force scan: how often they agree (action and target node)
            scan, indexed = DeterministicDecider(use_index=False), DeterministicDecider()
            policy = ConsolidationPolicy()
            sample = [{**c, "candidate_id": c["candidate_id"] + "-again"} for c in cands[:brute]]
            t1 = time.perf_counter()
            exact = [scan.decide(c, um, policy) for c in sample]
            brute_rate = len(sample) / (time.perf_counter() - t1)
            agree = sum(
                (d.action, d.existing_node_id) == (e.action, e.existing_node_id)
                for d, e in zip((indexed.decide(c, um, policy) for c in sample), exact, strict=True)
            )
        rows.append({
            "live_nodes": n, "embedding_dim": dim, "build_s": build_s,
            "decisions_per_s": decisions / elapsed, "ms_per_decision": 1000 * elapsed / decisions,
            "decisions_per_cpu_s": decisions / cpu,
            "bucket_hits": raw / decisions, "verified": verified / min(100, len(cands)),
            "scored": scored / decisions, "brute_force_per_s": brute_rate, "agree_with_brute": agree,
            "actions": actions, "outputs_digest": digest,
        })
        r = rows[-1]
        print(
            f"{n:>7} nodes dim={dim:<3} build {build_s:6.1f}s | {r['decisions_per_s']:8.0f} decisions/s "
            f"({r['ms_per_decision']:.2f} ms; {r['decisions_per_cpu_s']:.0f} per CPU-s) | hits {r['bucket_hits']:7.1f} verified {r['verified']:6.1f} "
            f"scored {r['scored']:6.1f} | brute force {brute_rate or float('nan'):8.1f}/s"
            f"{'' if agree is None else f', agrees {agree}/{brute}'} | {actions} | outputs {digest[:16]}",
            flush=True,
        )
        del um, nodes
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--decisions", type=int, default=600)
    ap.add_argument("--dims", default="0,64", help="embedding dimensions to run (0 = text only)")
    ap.add_argument("--brute", type=int, default=20, help="candidates to time with the brute-force scan (0 = skip)")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--bands", type=int, default=IndexConfig.text_bands, help="MinHash LSH bands")
    ap.add_argument("--rows", type=int, default=IndexConfig.text_rows, help="MinHash rows per band")
    ap.add_argument("--verify-floor", type=float, default=IndexConfig.text_verify_floor)
    args = ap.parse_args(argv)
    config = IndexConfig(text_bands=args.bands, text_rows=args.rows, text_verify_floor=args.verify_floor)
    print(f"index: {config}")
    sizes = [int(s) for s in args.sizes.split(",")]
    for dim in (int(d) for d in args.dims.split(",")):
        rows = run(sizes, args.decisions, dim, args.brute, args.seed, config)
        if len(rows) >= 2:
            a, b = rows[0], rows[-1]
            growth = b["live_nodes"] / a["live_nodes"]
            slow = b["ms_per_decision"] / a["ms_per_decision"]
            print(f"  dim={dim}: nodes ×{growth:.0f} → time per decision ×{slow:.2f} (linear would be ×{growth:.0f})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
