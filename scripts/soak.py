"""A soak (issue 34 item 3): workers under paced input for an hour; what grows?

    .venv/bin/python scripts/soak.py --minutes 60 --workers 2
    .venv/bin/python scripts/soak.py --minutes 10 --sample-every 60 --warmup-minutes 3   # a short trial

On a stack of its own (MEMSTREAM_BROKER 127.0.0.1:19992, MEMSTREAM_CONTROLLER_PORT 19993,
MEMSTREAM_REGISTRY_URL http://127.0.0.1:18981/apis/ccompat/v7, MEMSTREAM_STACK_DIR
.memstream/soak-stack; each of these environment variables overrides), wiped at the start
(`--keep-stack` reuses it) and stopped at the end (`--leave-up` keeps it).

`--workers` workers with the product's defaults (RocksDB, one standby replica, housekeeping
timers running) join a fresh group; their sustained rate on the stream is measured first
(`--measure-records` candidates as fast as they go; `--rate` skips it), then candidates
(bench/fleet.py `candidate_stream`, `--users` users, each with its send time) are sent at half
that rate for `--minutes`. Every `--sample-every` seconds, per worker: RSS (VmRSS), RocksDB's own
memory (`memstream_rocksdb_memory_bytes`: memtables, block caches, SST readers; RSS less it is
the Python side), open file descriptors (/proc/<pid>/fd), the size of its data dir (RocksDB tables, `du`); and the group's
lag and the interval's processing rate and visible latency p99 (inputs sent in the interval: first
ledger event received - sent). Written to `bench/out/soak-<time>/`: `samples.csv`, `report.json`,
`report.md`, `soak.png` (those figures over time, and the lag every 5 s).

The checks, after the first `--warmup-minutes` (each a PASS or FAIL line): every worker's RSS
stays within ±`--rss-band` (10%) of its first sample after the warm-up, and so does its RSS less
RocksDB's memory (bounded per partition store by MEMSTREAM_ROCKSDB_*, it fills towards that bound
as the stores grow); the lag stays bounded (at
most `--max-lag-s` seconds of input at the rate, at every sample and at the end); no worker
exited. File descriptors and the data dirs' growth are reported beside them (a data dir grows
with the users' memories: that is state, not a leak). Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import fleet  # noqa: E402

STACK = fleet.own_stack(19992, 18981, "soak-stack")  #: each MEMSTREAM_* of it overridden by the environment
TOKEN = "soak"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = fleet.run_arguments(__doc__, minutes=60, workers=2, partitions=6, users=2000, seed=35)
    ap.add_argument("--sample-every", type=float, default=300, help="seconds between samples")
    ap.add_argument("--warmup-minutes", type=float, default=10, help="minutes before the checks apply")
    ap.add_argument("--rss-band", type=float, default=0.10, help="allowed RSS change after the warm-up (fraction)")
    ap.add_argument("--max-lag-s", type=float, default=60, help="the lag bound, in seconds of input at the rate")
    return ap.parse_args(argv)


class Soak(fleet.PacedRun):
    kind = "soak"

    def __init__(self, args: argparse.Namespace, run: fleet.Run) -> None:
        super().__init__(args, run, {"MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_API_TOKENS": f"{TOKEN}:secret"},
                         [f"w{i + 1}" for i in range(args.workers)])
        self.rows: list[dict] = []  #: one per worker per sample
        self.died: list[str] = []

    def sample(self, since: float) -> None:
        now = time.time()
        lag = self.sampler.samples[-1].lag if self.sampler.samples else 0
        window = [s for s in self.sampler.samples if s.t >= since]
        rate = ((window[-1].committed - window[0].committed) / (window[-1].t - window[0].t)
                if len(window) > 1 and window[-1].t > window[0].t else 0.0)
        # inputs sent in the interval up to 10 s ago (their ledger events have had time to arrive)
        p99 = fleet.percentile(self.tap.latencies_ms(since - 10, now - 10), .99)
        for name in self.names:
            proc = self.fleet.procs.get(name)
            if proc is None or proc.poll() is not None:
                if name not in self.died:
                    self.died.append(name)
                    fleet.say(f"!! worker {name} exited; log {self.fleet.log_path(name)}")
                continue
            text = fleet.metrics_text(self.fleet.ports[name])
            row = {"t_min": round((now - self.t0) / 60, 2), "worker": name, "rss_mib": round(fleet.rss_mib(proc.pid), 1),
                   "open_fds": fleet.open_fds(proc.pid), "data_dir_mib": round(fleet.dir_mib(self.fleet.data_dir(name)), 1),
                   "nodes_loaded": fleet.metric(text, "memstream_memory_nodes_loaded"),
                   "state_keys": fleet.metric(text, 'memstream_table_keys{table="memory-state"}'),
                   "rocksdb_mib": round((fleet.metric(text, "memstream_rocksdb_memory_bytes") or 0) / 2**20, 1),  # every kind
                   "python_blocks": fleet.metric(text, "memstream_python_allocated_blocks"),
                   "lag": lag, "committed_per_s": round(rate, 1), "p99_ms": None if p99 is None else round(p99)}
            row["rss_less_rocksdb_mib"] = round(row["rss_mib"] - row["rocksdb_mib"], 1)
            self.rows.append(row)
            fleet.say(f"  sample {row['t_min']:6.1f} min {name}: RSS {row['rss_mib']:,.0f} MiB, {row['open_fds']} fds, "
                f"data dir {row['data_dir_mib']:,.0f} MiB, RocksDB {row['rocksdb_mib']:,.0f} MiB, {row['nodes_loaded'] or 0:,.0f} nodes loaded; lag {lag:,}, {rate:,.0f}/s committed, p99 {row['p99_ms']} ms")

    def execute(self) -> dict:
        args = self.args
        self.begin()
        fleet.say(f"== {args.minutes:g} minutes at {self.rate:,.0f}/s, a sample every {args.sample_every:g}s")
        self.sample(self.t0)
        end, last = self.t0 + args.minutes * 60, self.t0
        while (now := time.time()) < end:
            nxt = min(last + args.sample_every, end)
            time.sleep(max(0.0, min(nxt - now, 5.0)))
            if time.time() >= nxt:
                self.sample(last)
                last = nxt
        self.feeder.stop()
        time.sleep(15)  # the last interval's ledger events
        self.sample(last)
        self.tap.stop()
        self.sampler.stop()
        return self.results()

    def results(self) -> dict:
        args, rate = self.args, self.rate
        checks = []
        warm = [r for r in self.rows if r["t_min"] >= args.warmup_minutes]
        for key, what in (("rss_mib", "RSS"), ("rss_less_rocksdb_mib", "RSS less RocksDB's memory")):
            for name in self.names:
                mine = [r[key] for r in warm if r["worker"] == name]
                if not mine:
                    checks.append(("FAIL", f"{what} {name}: no sample after the {args.warmup_minutes:g}-minute warm-up"))
                    continue
                lo, hi, base = min(mine), max(mine), mine[0]
                ok = base * (1 - args.rss_band) <= lo and hi <= base * (1 + args.rss_band)
                checks.append(("PASS" if ok else "FAIL", f"{what} {name} within ±{args.rss_band:.0%} of {base:,.0f} MiB "
                               f"after {args.warmup_minutes:g} min: {lo:,.0f}–{hi:,.0f} MiB ({100 * (lo / base - 1):+.1f}% / "
                               f"{100 * (hi / base - 1):+.1f}%, {len(mine)} samples)"))
        bound = rate * args.max_lag_s
        lags = [s.lag for s in self.sampler.samples if (s.t - self.t0) / 60 >= args.warmup_minutes]
        worst, final = max(lags, default=0), (lags[-1] if lags else 0)
        checks.append(("PASS" if lags and worst <= bound else "FAIL",
                       f"lag bounded after {args.warmup_minutes:g} min: at most {worst:,} records, {final:,} at the end "
                       f"(bound {bound:,.0f} = {args.max_lag_s:g} s of input; {len(lags)} samples every 5 s)"))
        checks.append(("PASS" if not self.died else "FAIL",
                        "no worker exited" if not self.died else f"worker(s) exited: {', '.join(self.died)}"))
        growth: dict[str, dict] = {}
        for name in self.names:
            mine = [r for r in warm if r["worker"] == name]
            # after the warm-up, and over its second half only (a growth that levels off shows there)
            for part, rows in (("after_warmup", mine), ("second_half", mine[len(mine) // 2:])):
                if len(rows) > 1:
                    hours = (rows[-1]["t_min"] - rows[0]["t_min"]) / 60 or 1
                    growth.setdefault(name, {})[part] = {k: round((rows[-1][k] - rows[0][k]) / hours, 1)
                                                         for k in ("rss_mib", "rocksdb_mib", "open_fds", "data_dir_mib")}
        for name, parts in growth.items():
            text = "; ".join(f"{'after the warm-up' if part == 'after_warmup' else 'its second half'}: RSS "
                             f"{g['rss_mib']:+,.0f} MiB (RocksDB {g['rocksdb_mib']:+,.0f}), open fds {g['open_fds']:+,.0f}, data dir {g['data_dir_mib']:+,.0f} MiB"
                             for part, g in parts.items())
            checks.append(("INFO", f"{name}, per hour, {text}"))
        return {**self.header(), "checks": checks, "growth_per_hour": growth, "rows": self.rows,
                "lag_every_5s": [(round((s.t - self.t0) / 60, 3), s.lag) for s in self.sampler.samples]}

    def plot(self, res: dict, path: Path) -> None:
        def per_worker(key: str) -> dict[str, tuple[list[float], list[float]]]:
            return {n: ([r["t_min"] for r in self.rows if r["worker"] == n], [r[key] for r in self.rows if r["worker"] == n])
                    for n in self.names}
        first = [r for r in self.rows if r["worker"] == self.names[0]]
        p99 = [(r["t_min"], r["p99_ms"]) for r in first if r["p99_ms"] is not None]
        fleet.plot_timeline(path, f"memstream soak: {len(self.names)} workers, {res['rate']:,.0f} records/s ({res['date']})", [
            ("RSS, MiB", per_worker("rss_mib"), False),
            ("RocksDB's memory, MiB", per_worker("rocksdb_mib"), False),
            ("RSS less RocksDB's, MiB", per_worker("rss_less_rocksdb_mib"), False),
            ("Python's allocated blocks", per_worker("python_blocks"), False),
            ("open fds", per_worker("open_fds"), False),
            ("data dir, MiB", per_worker("data_dir_mib"), False),
            ("lag (records)", {"lag": ([t for t, _ in res["lag_every_5s"]], [v for _, v in res["lag_every_5s"]])}, False),
            ("p99 of the interval, ms", {"p99": ([t for t, _ in p99], [v for _, v in p99])}, False),
        ], [(self.args.warmup_minutes, "end of warm-up")])

    def markdown(self, res: dict) -> str:
        return markdown(res)


def markdown(res: dict) -> str:
    lines = [f"# Soak {res['app_id']} ({res['date']})", "", f"{res['machine']}; load average at the end {res['load_average_end']}",
             res["versions"], "",
             f"{res['args']['minutes']:g} minutes, {res['args']['workers']} workers, {res['partitions']} partitions, "
             f"{res['users']} users; sustained rate {res['sustained_rate'] or '–'} records/s, sent at {res['rate']:,.0f}/s; "
             f"{res['inputs']:,} inputs.", "",
             "| min | worker | RSS MiB | RocksDB MiB | open fds | data dir MiB | nodes loaded | state keys | lag | committed/s | p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['t_min']:.1f} | {r['worker']} | {r['rss_mib']:,.0f} | {_n(r.get('rocksdb_mib'))} | {r['open_fds']} | {r['data_dir_mib']:,.0f} | "
                     f"{_n(r.get('nodes_loaded'))} | {_n(r.get('state_keys'))} | "
                     f"{r['lag']:,} | {r['committed_per_s']:,.0f} | {r['p99_ms'] if r['p99_ms'] is not None else '–'} |")
    lines += ["", *[f"- {verdict}: {text}" for verdict, text in res["checks"]]]
    return "\n".join(lines) + "\n"


def _n(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def main(argv: list[str] | None = None) -> int:
    soak, res = fleet.run_script(parse_args(argv), STACK, Soak)
    with open(soak.folder / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(res["rows"][0]) if res["rows"] else ["t_min"])
        writer.writeheader()
        writer.writerows(res["rows"])
    for verdict, text in res["checks"]:
        print(f"{verdict}: {text}")
    fleet.say(f"samples: {soak.folder / 'samples.csv'}")
    return 0 if all(v != "FAIL" for v, _ in res["checks"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
