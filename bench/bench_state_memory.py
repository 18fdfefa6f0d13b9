"""What a worker's loaded state holds per record, by part: the soak's growth, attributed.

    .venv/bin/python -m bench.bench_state_memory --users 1000 --records 120000

The soak's stream (bench/fleet.py `candidate_stream`, one user's records as a worker applies
them: `streams.agents.memory_step.process`) through `UserMemory` states that behave as the
memory store keeps them: each user's closed nodes written to a table (a dict standing in for
RocksDB) and released from memory after every record (`History.release`), as `MemoryStore`
does after every batch. Every `--every` records it measures, over all users, the bytes each part
holds (a deep `sys.getsizeof` walk, every object counted once):

- `live nodes`: the live node records (`UserMemory.live`);
- `similarity index`: `UserMemory.index`;
- `history ids`: the ids of closed nodes (`UserMemory.closed`, records not held);
- `dedup window`: the de-duplication window (`UserMemory.seen`);
- `analytics windows`: the decoded analytics state of each user (`streams.analytics.windows`,
  one increment per record at the record's minute, as the analytics agent adds them; the
  worker keeps these decoded in its row cache, bounded by MEMSTREAM_ROW_CACHE_BYTES of JSON);

and `tracemalloc`'s total of everything allocated since the start, less the table of closed
nodes (it stands for RocksDB). Prints a table of bytes per record for each part, and each
part's growth between the first and the last measurement, per record.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet import candidate_stream  # noqa: E402
from streams.agents import memory_step  # noqa: E402
from streams.agents.user_cache import HISTORY_KEY, TableHistory, node_rows, weight  # noqa: E402
from streams.analytics import windows  # noqa: E402
from streams.contracts import catalog  # noqa: E402
from streams.core import UserMemory  # noqa: E402
from streams.settings import Settings  # noqa: E402


def deep_size(roots: Iterable[Any], seen: set[int]) -> int:
    """Bytes of the objects reachable from `roots` not in `seen` (which it extends)."""
    total, stack = 0, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
        elif hasattr(obj, "__slots__"):
            stack.extend(getattr(obj, s) for s in obj.__slots__ if hasattr(obj, s))
        elif hasattr(obj, "nbytes"):  # numpy arrays: their buffer
            total += int(obj.nbytes)
    return total


def measure(users: dict[str, UserMemory], analytics: dict[str, dict]) -> dict[str, int]:
    seen: set[int] = {id(None)}
    # shared objects (interned strings, small ints) are counted once, by the first part that meets them
    parts = {
        "live nodes": deep_size([um.live for um in users.values()], seen),
        "similarity index": deep_size([um.index for um in users.values()], seen),
        "history ids": deep_size([um.closed._ids for um in users.values()], seen),
        "dedup window": deep_size([um.seen for um in users.values()], seen),
        "analytics windows": deep_size(analytics.values(), seen),
    }
    parts["weight (nodes, the cache's figure)"] = sum(weight(um) for um in users.values())
    return parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=1000, help="users of one worker (the soak: 2,000 over 2 workers)")
    ap.add_argument("--records", type=int, default=120_000, help="records applied (the soak: ~15,000 a minute per worker)")
    ap.add_argument("--every", type=int, default=20_000, help="records between measurements")
    ap.add_argument("--rate", type=float, default=253.0, help="records per second of event time (one soak worker's)")
    args = ap.parse_args(argv)

    settings = Settings.from_env()
    consolidation, promotion = memory_step_policies(settings)
    limits = settings.limits()
    table: dict[str, Any] = {}
    users: dict[str, UserMemory] = {}
    analytics: dict[str, dict] = {}
    base_ms = int(time.time() * 1000) // 60_000 * 60_000
    tracemalloc.start()
    start_traced = tracemalloc.get_traced_memory()[0]
    rows: list[tuple[int, dict[str, int], int]] = []
    t0 = time.monotonic()
    stream = candidate_stream("mem", args.users, seed=35)
    for i, fact in enumerate(itertools.islice(stream, args.records), 1):
        ts = base_ms + int(i * 1000 / args.rate)
        um = users.get(fact.user)
        if um is None:
            um = users[fact.user] = UserMemory(fact.user, dedup_max_ids=settings.dedup_max_ids,
                                               index_config=settings.index_config())
            um.closed.reader = TableHistory(table, fact.user)
        out = memory_step.process(catalog.MEMORY_CANDIDATES, um, fact.record(ts), consolidation, promotion, limits)
        for node in out.node_upserts:
            for rest, row in node_rows(node).items():
                if row is None:
                    table.pop(f"{fact.user}/{rest}", None)
                elif rest.startswith(HISTORY_KEY):
                    table[f"{fact.user}/{rest}"] = row
        um.seen_changes()
        um.side_changes()
        um.closed.release()
        state = analytics.get(fact.user)
        if state is None:
            state = analytics[fact.user] = windows.new_state(fact.user)
        windows.add(state, ts, {"formed": len(out.node_upserts)}, id=f"c:{i}")
        if i % args.every == 0 or i == args.records:
            gc.collect()
            # the table of closed nodes stands for RocksDB: not the worker's Python memory
            traced = tracemalloc.get_traced_memory()[0] - start_traced - deep_size([table], set())
            rows.append((i, measure(users, analytics), traced))
            print(f"{i:>9,} records, {time.monotonic() - t0:5.0f}s: "
                  + ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in rows[-1][1].items() if not k.startswith("weight"))
                  + f"; traced {traced / 2**20:,.1f} MiB", flush=True)
    tracemalloc.stop()
    print()
    print(f"| part | MiB at {rows[0][0]:,} records | MiB at {rows[-1][0]:,} | bytes per record, between |")
    print("|---|---|---|---|")
    (n0, first, t_first), (n1, last, t_last) = rows[0], rows[-1]
    for part in first:
        unit = 1 if part.startswith("weight") else 2**20
        a, b = (f"{first[part] / unit:,.{0 if unit == 1 else 1}f}", f"{last[part] / unit:,.{0 if unit == 1 else 1}f}")
        print(f"| {part} | {a} | {b} | {(last[part] - first[part]) / (n1 - n0):,.1f} |")
    print(f"| everything traced (tracemalloc), less the table | {t_first / 2**20:,.1f} | {t_last / 2**20:,.1f} | "
          f"{(t_last - t_first) / (n1 - n0):,.1f} |")
    return 0


def memory_step_policies(settings: Settings):
    """The worker's policies from the settings (`streams.agents.memory.policies`, without a runtime)."""
    from types import SimpleNamespace

    from streams.agents.memory import policies

    return policies(SimpleNamespace(settings=settings))  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
