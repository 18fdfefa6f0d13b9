"""Issue 17's measurement: memory.analytics.v1 counts vs what the pipeline says happened.

    MEMSTREAM_TEST_PORT_OFFSET=400 .venv/bin/python scripts/analytics_audit.py --users 60 --runs 3 --kill-runs 1

Runs on the test suite's stack (tests/conftest.py TEST_ENV: its ports, its stack dir), starting
it with `memstream dev up` when it is not up (`--down` stops it afterwards). Each run is a fresh
app id and fresh users (tests/system/analytics_audit.py): one worker on RocksDB with a 1 s publish tick,
the generator's memory + negotiator + garbage mix produced in small chunks with event time = now.
A kill run SIGKILLs the worker part-way, produces the rest, restarts it on the same data dir.
Prints a markdown table (published minute-window sums; hour windows are checked the same way
and counted in `lost` / `over`).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import TEST_ENV, memstream  # noqa: E402
from tests.system import analytics_audit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=60)
    ap.add_argument("--runs", type=int, default=3, help="ordinary runs")
    ap.add_argument("--kill-runs", type=int, default=1, help="runs with a SIGKILL part-way")
    ap.add_argument("--kill-after", type=float, default=0.5, help="fraction produced before the SIGKILL")
    ap.add_argument("--chunk", type=int, default=40, help="records per produced chunk")
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between chunks")
    ap.add_argument("--down", action="store_true", help="stop the stack at the end")
    args = ap.parse_args()

    from streams.settings import Settings

    settings = Settings.from_env(TEST_ENV)
    up = memstream("dev", "status", check=False)
    if up.returncode != 0 or "down" in up.stdout.lower():
        memstream("dev", "up")
    memstream("topics", "apply")

    rows = []
    plan = [("ordinary", None)] * args.runs + [("SIGKILL", args.kill_after)] * args.kill_runs
    for i, (kind, kill) in enumerate(plan, 1):
        tag = f"{uuid.uuid4().hex[:6]}"
        audit = analytics_audit.run(settings, tag, users=args.users, chunk=args.chunk, pause_s=args.pause,
                                    kill_after=kill, log=lambda m: print(m, file=sys.stderr, flush=True))
        rows.append((i, kind, audit))
        for size, subj, c, e, g in audit.mismatches()[:20]:
            print(f"  run {i} {size} {subj} {c}: expected {e}, published {g}", file=sys.stderr)

    cols = analytics_audit.COLUMNS
    print(f"\n{args.users} users per run; counts = sums of the latest record of every minute window "
          f"(hour windows agree unless `lost`/`over` say otherwise; those two count both sizes)\n")
    print("| run | kind | records | " + " | ".join(cols) + " | accessed | deleted | redacted | lost | over-count "
          "| too_late / too_early / duplicates | s |")
    print("|" + "---|" * (len(cols) + 10))
    for i, kind, a in rows:
        exp, got = a.totals("expected"), a.totals("got")
        extra = ("accessed", "deleted", "redacted")
        print(f"| {i} expected | | {a.records} | " + " | ".join(str(exp[c]) for c in cols + extra) + " | – | – | – | |")
        r = a.refused
        late = f"{r.get('too_late')} / {r.get('too_early')} / {r.get('duplicates')}" if r else "?"
        print(f"| {i} published | {kind} | {a.records} | " + " | ".join(str(got[c]) for c in cols + extra)
              + f" | {a.lost()} | {a.over()} | {late} | {a.seconds:.0f} |")
    users_lost = {(i, s) for i, _k, a in rows for s in a.expected if a.lost(subject=s)}
    print(f"\nsubjects with a lost increment: {len(users_lost)}; "
          f"with an over-count: {len({(i, s) for i, _k, a in rows for s in a.expected if a.over(subject=s)})}")
    if args.down:
        memstream("dev", "down", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
