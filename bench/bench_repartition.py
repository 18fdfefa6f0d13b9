"""How long `memstream repartition` takes, and how much memory, for a deployment of N memory nodes.

    python -m bench.bench_repartition --nodes 1000000 --users 100 --from 6 --to 12

On a stack of its own (ports 19192/19193/18181 unless MEMSTREAM_BROKER, MEMSTREAM_CONTROLLER_PORT
and MEMSTREAM_REGISTRY_URL say otherwise; stack dir .memstream/bench-repartition-stack), wiped
before and after: the command raises the catalog topics, which the e2e bench's stack must keep.
The deployment is synthesized as the e2e bench's recovery run synthesizes it (bench_e2e
`recovery_rows`: N node rows spread over the users, and each user's full de-duplication window,
written straight into the `memory-state` changelog at the users' partitions), plus one
`memory.nodes.v1` row per node (the compacted output topic the command also moves). Then
`memstream repartition --to M` runs as a subprocess, as an operator runs it: its wall time, CPU
time and peak RSS are printed, with the machine and its load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.bench_e2e import Sender, machine, recovery_rows, state_rows_per_user, write_state
from streams.contracts import catalog
from streams.contracts.wire import encode_key
from streams.core.partitioning import partition_for
from streams.settings import Settings
from streams.tools import kafkatools
from streams.tools.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
APP = "bench-repartition"
DEFAULT_ENV = {
    "MEMSTREAM_BROKER": "127.0.0.1:19192",
    "MEMSTREAM_CONTROLLER_PORT": "19193",
    "MEMSTREAM_REGISTRY_URL": "http://127.0.0.1:18181/apis/ccompat/v7",
    "MEMSTREAM_STACK_DIR": str(ROOT / ".memstream" / "bench-repartition-stack"),
}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "streams", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"memstream {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def write_node_rows(settings: Settings, rows: list[tuple[str, str, bytes]]) -> None:
    """One memory.nodes.v1 row per node (the bytes of its state row: the command never decodes)."""
    sender = Sender(settings, **{"linger.ms": 50})
    bar = Progress(len(rows), f"rows written to {catalog.MEMORY_NODES}", 2.0)
    for _user, key, row in rows:
        k = encode_key(key)
        sender.send(catalog.MEMORY_NODES, k, row, partition=partition_for(k, settings.partitions))
        bar.advance()
    sender.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--from", dest="from_partitions", type=int, default=6)
    ap.add_argument("--to", type=int, default=12)
    ap.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    args = ap.parse_args(argv)
    env = {**DEFAULT_ENV, **{k: v for k, v in os.environ.items() if k in DEFAULT_ENV},
           "MEMSTREAM_APP_ID": APP, "MEMSTREAM_PARTITIONS": str(args.from_partitions)}
    settings = Settings.from_env(env)
    say(f"== stack at {settings.broker} (wiped first)")
    cli(env, "dev", "down", "--wipe", check=False)
    cli(env, "dev", "up")
    try:
        cli(env, "topics", "apply")
        say(f"== synthesizing {args.nodes:,} nodes for {args.users} users on {args.from_partitions} partitions")
        rows = list(recovery_rows(settings, args.nodes, args.users))
        total = args.nodes + args.users * state_rows_per_user(settings, settings.dedup_max_ids)
        write_state(settings, APP, iter(rows), total)
        write_node_rows(settings, [r for r in rows if "/node-" in r[1]])
        del rows
        load = os.getloadavg()
        say(f"== memstream repartition --to {args.to} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
        started = time.monotonic()
        out = ROOT / ".memstream" / "bench-repartition.json"
        with open(out, "w") as stdout:
            proc = subprocess.Popen([sys.executable, "-m", "streams", "repartition", "--to", str(args.to)], cwd=ROOT,
                                    env={**os.environ, **env}, stdout=stdout)
            peak = cpu = 0.0
            while proc.poll() is None:  # the command's own peak RSS and CPU, sampled until it exits
                try:
                    peak, cpu = kafkatools.peak_rss_mib(proc.pid), kafkatools.cpu_seconds(proc.pid)
                except (OSError, RuntimeError):
                    pass
                time.sleep(0.2)
        wall = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"memstream repartition exited {proc.returncode}")
        summary = json.loads(out.read_text())
        rows_copied = sum(t["rows"] for t in summary["tables"].values())
        moved = sum(o["moved"] for o in summary["outputs"].values())
        print(f"\n{time.strftime('%Y-%m-%d %H:%M')} on {machine()}")
        print("| nodes | table rows copied | output rows moved | partitions | wall | CPU | peak RSS | load before |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| {args.nodes:,} | {rows_copied:,} | {moved:,} | {args.from_partitions} → {args.to} | {wall:.1f} s "
              f"| {cpu:.1f} s | {peak:.0f} MiB | {load[0]:.2f} |")
    finally:
        if not args.keep:
            cli(env, "dev", "down", "--wipe", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
