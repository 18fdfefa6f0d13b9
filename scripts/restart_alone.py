"""A fleet restart after an outage (issue 34 item 5): a worker restarted ALONE onto every
partition's state and a backlog, its apply rate watched. Not part of `make test`.

    .venv/bin/python scripts/restart_alone.py                       # 300 users, 100k candidates
    .venv/bin/python scripts/restart_alone.py --records 40000 --watch 120   # a short trial

On the stack of MEMSTREAM_BROKER / MEMSTREAM_REGISTRY_URL (start it with `memstream dev up` and
`memstream topics apply`; nothing else of the stack is touched):

1. `--workers` workers (RocksDB, one standby replica, the housekeeping and analytics timers every
   `--timer-interval` s) of a fresh group positioned at the end of the inputs apply the first
   `--first` of `--records` candidates (the chaos script's stream: `--users` users, each with
   hundreds of memory nodes, `--records` 100k: ~120k `memory-state` keys on 6 partitions);
   every worker is stopped (SIGTERM: their data dirs keep their tables).
2. The rest of the candidates is produced while no worker runs (the outage).
3. The first worker is started again, alone, on its data dir: it owns every partition (its own,
   the ones it held standby copies of, the others restored from the changelogs), with the
   backlog. Every 5 s: the records it committed per second, lag, loaded users and nodes.

Reported (and written to bench/out/restart-alone-<time>/report.json): machine, load average,
the rate of the first run, when the restarted worker first committed records (it restores and
recovers the partitions it did not hold first), the records committed in the 15 s after that, the
slowest and the median 5-s rate after them while lag remained, the longest stall, the time to catch
up. Exit 1 when the worker did not catch up within `--watch` s, or stalled (5-s windows under
`--min-share` of the first run's rate) for more than `--max-stall` s in a row (before the fix: 0–21
records/s for 230 s against 1,126 in the first run: bench/RESULTS.md, "Issue 34 item 5").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_e2e import (  # noqa: E402
    INPUTS,
    Record,
    Worker,
    free_port,
    machine,
    produce,
    say,
    wait_settled,
)
from streams.contracts import catalog  # noqa: E402
from streams.contracts.wire import CodecFactory, encode_key  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.tools import kafkatools  # noqa: E402

TOKEN = "restart-alone"
WORDS = ["tea", "coffee", "hiking", "chess", "Lisbon", "Oslo", "teal", "red", "jazz", "piano", "sushi", "tennis"]


def candidates(settings: Settings, users: int, n: int, seed: int = 7) -> list[Record]:
    """The chaos script's candidate stream (new facts, exact repeats, one-word edits, sensitive
    ones), Avro-encoded, timestamps an hour ago (none expires, none is too late)."""
    factory = CodecFactory.from_url(settings.registry_url)
    factory.register([catalog.MEMORY_CANDIDATES])
    codec = factory.codec(catalog.topic(catalog.MEMORY_CANDIDATES).value_schema)
    rng = random.Random(seed)
    names = [f"mb-restart-{i}" for i in range(users)]
    facts: dict[str, list[str]] = {u: [] for u in names}
    start_ms, out = int(time.time() * 1000) - 3_600_000, []
    for i in range(n):
        user = rng.choice(names)
        known, roll = facts[user], rng.random()
        if known and roll < 0.3:
            text = rng.choice(known)
        elif known and roll < 0.5:
            text = f"{rng.choice(known).rpartition(' ')[0]} {rng.choice(WORDS)}."
        else:
            text = f"The user likes {rng.choice(WORDS)} and {rng.choice(WORDS)} number {i}."
            known.append(text)
        record = {"candidate_id": f"c{i}", "motebit_id": user, "content": text,
                  "sensitivity": rng.choice(["none", "none", "personal", "medical"]), "source": "user_stated",
                  "memory_type": "semantic", "confidence": None, "valid_from": None, "timestamp": start_ms + i,
                  "embedding": None, "frontmatter_type": None, "extra": None, "supersedes": None, "kind": None,
                  "session_id": None}
        out.append(Record(catalog.MEMORY_CANDIDATES, encode_key(user), codec.encode(record), ()))
    return out


def gauges(port: int) -> dict[str, float]:
    """The worker's memory cache gauges and counters (empty while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        for key in ("memstream_memory_users_loaded", "memstream_memory_nodes_loaded",
                    'memstream_memory_users_total{event="prefilled"}', 'memstream_memory_users_total{event="evicted"}'):
            if name == key:
                out[key.removeprefix("memstream_")] = float(value)
    return out


def longest_stall(samples: list[dict], moving: float | None, floor: float) -> float:
    """The longest run of consecutive 5-s windows, after the first records were committed and
    while lag remained, that committed less than `floor` records/s (seconds)."""
    longest, since, last_t = 0.0, None, moving
    for s in samples:
        if moving is None or s["t"] <= moving or s["lag"] == 0:
            last_t = s["t"]
            continue
        if s["rate"] < floor:
            since = last_t if since is None else since
            longest = max(longest, s["t"] - since)
        else:
            since = None
        last_t = s["t"]
    return longest


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--records", type=int, default=100_000, help="candidates in all")
    ap.add_argument("--first", type=float, default=0.8, help="share of them the fleet applies before the outage")
    ap.add_argument("--workers", type=int, default=2, help="workers before the outage (one restarts alone)")
    ap.add_argument("--timer-interval", type=float, default=5.0, help="MEMSTREAM_TIMER_INTERVAL_S of the workers")
    ap.add_argument("--watch", type=float, default=300, help="seconds the restarted worker may take to catch up")
    ap.add_argument("--min-share", type=float, default=0.05,
                    help="a 5-s window slower than this share of the first run's rate is a stall")
    ap.add_argument("--max-stall", type=float, default=30, help="longest stall allowed (seconds in a row)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument("--keep-data", action="store_true", help="keep the workers' data dirs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, settings = parse_args(argv), Settings.from_env()
    run = args.out / f"restart-alone-{time.strftime('%Y%m%d-%H%M%S')}"
    app_id = run.name
    run.mkdir(parents=True)
    say(f"{app_id}: {machine()}, load average {load_average()}")
    load = candidates(settings, args.users, args.records)
    first = int(len(load) * args.first)
    kafkatools.position_group(settings, app_id, kafkatools.end_offsets(settings, INPUTS))
    env = {"MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_STANDBY_REPLICAS": "1", "MEMSTREAM_API_TOKENS": f"{TOKEN}:secret",
           "MEMSTREAM_TIMER_INTERVAL_S": str(args.timer_interval)}
    ports = [free_port() for _ in range(args.workers)]
    workers: list[Worker] = []

    def start(n: int, log: Path) -> Worker:
        extra = {**env, "MEMSTREAM_WEB_PORT": str(ports[n]), "MEMSTREAM_DATA_DIR": str(run / "data" / f"w{n}")}
        return Worker(kafkatools.spawn_worker(settings, app_id, log, extra), ports[n], log)

    result: dict = {"app_id": app_id, "machine": machine(), "users": args.users, "records": args.records,
                    "workers_before": args.workers, "timer_interval_s": args.timer_interval}
    try:
        workers = [start(n, run / f"w{n}.log") for n in range(args.workers)]
        wait_settled(workers, timeout=600)
        say(f"{args.workers} worker(s) ready; {first:,} candidates")
        t0 = time.monotonic()
        produce(settings, load[:first])
        ends = kafkatools.end_offsets(settings, INPUTS)
        while kafkatools.group_lag(settings, app_id, ends) > 0:
            time.sleep(1)
        result["first_run_rate"] = round(first / (time.monotonic() - t0), 1)
        say(f"applied at {result['first_run_rate']:,.0f} records/s; stopping every worker")
        for w in workers:
            kafkatools.stop_worker(w.proc, timeout=120)
        produce(settings, load[first:])
        backlog_end = kafkatools.end_offsets(settings, INPUTS)
        backlog = kafkatools.group_lag(settings, app_id, backlog_end)
        say(f"outage: {backlog:,} candidates produced; w0 restarts alone (load average {load_average()})")
        result["load_average_at_restart"] = load_average()
        started = time.monotonic()
        workers = [start(0, run / "w0-alone.log")]
        samples, last_lag, last_t = [], backlog, started
        while time.monotonic() - started < args.watch:
            time.sleep(5)
            if workers[0].proc.poll() is not None:
                raise RuntimeError(f"the restarted worker exited {workers[0].proc.returncode}; read {workers[0].log}")
            lag, now = kafkatools.group_lag(settings, app_id, backlog_end), time.monotonic()
            rate = (last_lag - lag) / (now - last_t)
            samples.append({"t": round(now - started, 1), "lag": lag, "rate": round(rate, 1), **gauges(ports[0])})
            say(f"  t={now - started:5.0f}s committed {rate:7.1f}/s  lag {lag:,}  {gauges(ports[0])}")
            last_lag, last_t = lag, now
            if lag == 0:
                break
        # from the first records committed (before: restore, recovery of the partitions it did not hold)
        moving = next((s["t"] - 5 for s in samples if s["lag"] < backlog), None)
        after = [s["rate"] for s in samples if moving is not None and s["t"] > moving + 15 and s["lag"] > 0]
        result.update(
            backlog=backlog, samples=samples, caught_up_s=samples[-1]["t"] if samples and samples[-1]["lag"] == 0 else None,
            first_records_s=moving,
            first_15s=backlog - next((s["lag"] for s in samples if moving is not None and s["t"] >= moving + 15), backlog),
            slowest_after_15s=min(after) if after else None, median_after_15s=statistics.median(after) if after else None,
            longest_stall_s=longest_stall(samples, moving, args.min_share * result["first_run_rate"]),
            load_average_end=load_average())
    finally:
        for w in workers:
            kafkatools.stop_worker(w.proc, timeout=120)
        if not args.keep_data:
            shutil.rmtree(run / "data", ignore_errors=True)
    (run / "report.json").write_text(json.dumps(result, indent=1))
    floor = args.min_share * result["first_run_rate"]
    ok = result["caught_up_s"] is not None and result["longest_stall_s"] <= args.max_stall
    say(f"restart alone: first records committed after {result['first_records_s']} s, {result['first_15s']:,} in the "
        f"15 s that followed, then slowest {result['slowest_after_15s']}/s, "
        f"median {result['median_after_15s']}/s (first run {result['first_run_rate']}/s); longest stretch under "
        f"{floor:.0f}/s: {result['longest_stall_s']:.0f} s; "
        f"caught up after {result['caught_up_s']} s; load average {result['load_average_end']} -> {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
