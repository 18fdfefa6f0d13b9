"""A fleet under chaos (issue 34 item 2): paced input into a fleet of workers while workers are
killed, added and removed, the broker and the registry restarted, and the whole fleet stopped and
restarted onto fewer workers; then the outputs against a single-worker reference.

    .venv/bin/python scripts/chaos_fleet.py --minutes 15 --partitions 12 --workers 4
    .venv/bin/python scripts/chaos_fleet.py --minutes 5 --event-every 30      # a short trial

On a stack of its own (MEMSTREAM_BROKER 127.0.0.1:19892, MEMSTREAM_CONTROLLER_PORT 19893,
MEMSTREAM_REGISTRY_URL http://127.0.0.1:18881/apis/ccompat/v7, MEMSTREAM_STACK_DIR
.memstream/chaos-stack; each of these environment variables overrides), wiped at the start
(`--keep-stack` reuses it) and stopped at the end (`--leave-up` keeps it).

1. `--workers` workers (RocksDB, one standby replica, timers slowed down as in the fault suite:
   housekeeping reads the wall clock, so it would decide differently from the reference) join a
   fresh group positioned at the end of the inputs.
2. The fleet's sustained rate on the stream: `--measure-records` candidates as fast as the producer
   goes (skipped with `--rate`). The run then sends at half of it (or `--rate`).
3. For `--minutes`: candidates (bench/fleet.py `candidate_stream`, `--users` users) paced at the
   rate, each with its send time. The first interval of `--event-every` seconds is calm, then one
   chaos event per interval, the last interval calm again. Events: `kill` (SIGKILL a random worker,
   restart it at once on its data dir), `join` (a fifth worker joins) and later `leave` (it stops
   cleanly), `broker` (the broker stopped and started again, once), `registry` (the same, once),
   `outage` (once: every worker stopped, `--outage-s` without any, then `--outage-first` of them
   started alone — many partitions on few workers — and the others `--outage-alone-s` later).
   The events are in a random order (`--seed`); the intervals left over are kills.
4. When the fleet has caught up: its node state, ledger and relay against ONE fresh worker that
   processes the same input range (bench/fleet.py `finish_and_compare`, as the fault suite):
   equal node state, same event ids (repeats only as identical copies), nothing dead-lettered,
   every worker's HTTP answers for every user equal to the reference's.

Reported (progress lines while it runs; `bench/out/chaos-<time>/report.json`, `report.md`,
`chaos.png`): the sustained rate and the rate sent; per minute of sending, the inputs' visible
latency (first ledger event received - sent) p50/p99/max, with the minute's event, and for a
minute with an event the p99 of the inputs sent after the fleet recovered from it ("calm part");
for every event the time until the partitions it disturbed produced again (a ledger record written
after the event — after the broker was back, after every worker had stopped — visible
on each: the killed worker's partitions, every partition for the others; for `kill` the failover
time) and the longest any of them showed no output within two minutes of it; committed offsets
that moved back; the comparison; the PNG: throughput (committed input records/s and the rate
sent), latency p50/p99 per 10 s of sending, lag, events marked.

Exit 0 when the comparison found nothing and the fleet caught up; 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet import (  # noqa: E402
    INPUTS,
    Fleet,
    PacedRun,
    Run,
    finish_and_compare,
    own_stack,
    owned_partitions,
    percentile,
    plot_timeline,
    run_arguments,
    run_script,
    save_diff,
    say,
)
from streams.tools import devstack, kafkatools  # noqa: E402

STACK = own_stack(19892, 18881, "chaos-stack")  #: each MEMSTREAM_* of it overridden by the environment
TOKEN = "chaos"
PROGRESS_S = 10.0
ONCE = ("broker", "registry", "outage")


@dataclass
class Event:
    kind: str
    at: float  #: epoch s when it started
    worker: str = ""
    partitions: list[int] = field(default_factory=list)  #: the partitions it disturbed
    note: str = ""
    #: from when "produced again" counts (epoch s): `at`, or for a broker restart the moment it
    #: was back, for the outage the moment every worker had stopped (until then records written
    #: before the fault still become visible)
    since: float | None = None
    back_s: float | None = None  #: from `at` until each of `partitions` had a record written after `since` visible
    pause_s: float | None = None  #: the longest any of `partitions` showed no output, up to 2 min or the next event


def schedule(slots: int, rng: random.Random) -> list[str]:
    """One event per slot: `broker`, `registry`, `outage` once each, a `join` followed 1–3 slots
    later by its `leave` (no outage between them), the rest `kill`s; what does not fit is left out."""
    plan = ["kill"] * slots
    if slots >= 2:
        join = rng.randrange(0, slots - 1)
        leave = rng.randrange(join + 1, min(join + 3, slots - 1) + 1)
        plan[join], plan[leave] = "join", "leave"
        free = [i for i in range(slots) if plan[i] == "kill"]
        outside = [i for i in free if not join < i < leave]
        for kind in ONCE:
            pool = outside if kind == "outage" else free
            if not pool:
                continue
            i = rng.choice(pool)
            plan[i] = kind
            free.remove(i)
            if i in outside:
                outside.remove(i)
    return plan


class Chaos(PacedRun):
    kind = "chaos"

    def __init__(self, args: argparse.Namespace, run: Run) -> None:
        worker_env = {"MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_STANDBY_REPLICAS": "1",
                      "MEMSTREAM_TIMER_INTERVAL_S": "3600", "MEMSTREAM_SHUTDOWN_TIMEOUT_S": "30",
                      "MEMSTREAM_API_TOKENS": f"{TOKEN}:secret:admin+negotiator+ops"}
        if args.session_timeout:
            worker_env["MEMSTREAM_SESSION_TIMEOUT_S"] = str(args.session_timeout)
        super().__init__(args, run, worker_env, [f"w{i + 1}" for i in range(args.workers)], args.sample_every)
        self.rng = random.Random(args.seed)
        self.app_id = self.fleet.app_id
        # the reference alone holds every user of the run: with the default cache bound it read most
        # users back from RocksDB at every record (a 15-minute run: 405k inputs, ~400k nodes, 44 records/s
        # at the end); the bound is derived state, not a rule, so a bound above the run's nodes decides the same
        self.reference = Fleet(self.settings, f"{self.app_id}-reference",
                               {**worker_env, "MEMSTREAM_STANDBY_REPLICAS": "0",
                                "MEMSTREAM_LOADED_NODES_MAX": str(args.reference_nodes_max)},
                               log_dir=self.fleet.log_dir, data_root=self.fleet.data_root, base_env=run.env)
        kafkatools.position_group(self.settings, self.reference.app_id, self.inputs_start)
        self.extra = f"w{args.workers + 1}"
        self.events: list[Event] = []
        self.skipped: list[str] = []  #: events of the plan that found no time left in the run
        self.last_progress = 0.0

    # ------------------------------------------------------------------ the fleet and events
    def states(self) -> dict[str, str]:
        return self.fleet.states()

    def progress(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last_progress < PROGRESS_S:
            return
        self.last_progress = now
        for name, proc in list(self.fleet.procs.items()):
            if proc.poll() is not None:
                self.revive(name)
        s = self.sampler.samples[-2:]
        rate = (s[-1].committed - s[0].committed) / (s[-1].t - s[0].t) if len(s) == 2 and s[-1].t > s[0].t else 0.0
        lag = s[-1].lag if s else 0
        states = " ".join(f"{n}:{st}" for n, st in sorted(self.states().items()))
        say(f"  … {len(self.feeder.sent):,} sent, {rate:,.0f}/s committed, lag {lag:,}, {states}")

    def revive(self, name: str) -> None:
        """A worker that exited by itself (a finding, reported as `died`) is started again, as a
        supervisor would."""
        proc = self.fleet.procs.pop(name)
        self.events.append(Event("died", time.time(), name, note=f"exit {proc.returncode}; log {self.fleet.log_path(name)}"))
        say(f"!! worker {name} exited {proc.returncode} by itself; log {self.fleet.log_path(name)}; starting it again")
        self.fleet.start(name, wait=False)

    def sleep_until(self, t: float) -> None:
        while (left := t - time.time()) > 0:
            time.sleep(min(left, 1.0))
            self.progress()

    def running(self) -> list[str]:
        return [n for n in self.fleet.procs if n != self.extra] or list(self.fleet.procs)

    def owning(self, name: str) -> list[int]:
        """The input partitions a worker owns while it is ready (else none)."""
        if self.states().get(name) != "ready":
            return []
        return owned_partitions(self.fleet.ports[name])

    def victim(self) -> tuple[str, list[int]]:
        """A random worker of the fleet that is ready and owns partitions (waiting for one, at most
        two minutes; then any running one). A fifth worker on 12 partitions may own none: Faust's
        sticky assignor moves a partition to a new member only when that lowers the most any
        member holds (ceil(12 / 5) = 3 = 12 / 4)."""
        deadline = time.time() + 120
        while True:
            names = self.running()
            owners = {n: p for n in names if (p := self.owning(n))}
            if owners or time.time() > deadline:
                break
            time.sleep(1)
            self.progress()
        name = self.rng.choice(sorted(owners) or names)
        return name, owners.get(name, [])

    def do(self, kind: str) -> None:
        at = time.time()
        if kind == "kill":
            victim, parts = self.victim()
            at = time.time()
            self.fleet.kill(victim)
            self.fleet.start(victim, wait=False)
            self.events.append(Event("kill", at, victim, parts))
            say(f"== SIGKILL {victim} (partitions {parts}); restarted at once")
        elif kind == "join":
            self.fleet.start(self.extra, wait=False)
            self.events.append(Event("join", at, self.extra, list(range(self.settings.partitions))))
            say(f"== {self.extra} joins")
        elif kind == "leave":
            if self.extra not in self.fleet.procs:
                say(f"== {self.extra} is not running (the outage stopped it): no leave")
                return
            deadline = time.time() + 120  # it has joined: ready (what it owns may be nothing)
            while self.states().get(self.extra) != "ready" and time.time() < deadline:
                time.sleep(1)
                self.progress()
            owned = owned_partitions(self.fleet.ports[self.extra])
            at = time.time()
            code = self.fleet.stop(self.extra)
            # its leaving rebalances the whole group (Faust's eager protocol): every partition is disturbed
            self.events.append(Event("leave", at, self.extra, list(range(self.settings.partitions)),
                                     note=f"owned {owned or 'no'} partitions; exit {code} after {time.time() - at:.1f}s"))
            say(f"== {self.extra} left (it owned partitions {owned}; exit {code} after {time.time() - at:.1f}s)")
        elif kind in ("broker", "registry"):
            svc = devstack.KAFKA if kind == "broker" else devstack.REGISTRY
            say(f"== restarting the {kind}")
            devstack.stop(self.settings, svc)
            time.sleep(2)
            devstack.up(self.settings)
            # after a broker restart output counts once the broker is back (records written before
            # it stopped still become visible); the registry's restart does not stop records that flow
            self.events.append(Event(kind, at, partitions=list(range(self.settings.partitions)),
                                     since=time.time() if kind == "broker" else None,
                                     note=f"down and up again in {time.time() - at:.1f}s"))
            say(f"== the {kind} is back after {time.time() - at:.1f}s")
        elif kind == "outage":
            self.outage()

    def outage(self) -> None:
        """Every worker stopped; none for `--outage-s`; then `--outage-first` of them alone (many
        partitions on few workers), the others `--outage-alone-s` later."""
        args, at = self.args, time.time()
        say(f"== outage: stopping all {len(self.fleet.procs)} workers")
        codes = self.fleet.stop_all()
        stopped = time.time() - at
        self.sleep_until(time.time() + args.outage_s)
        first, rest = self.names[:args.outage_first], self.names[args.outage_first:]
        restart = time.time()
        for name in first:
            self.fleet.start(name, wait=False)
        say(f"== outage: {', '.join(first)} started alone on {self.settings.partitions} partitions")
        deadline = time.time() + args.outage_alone_s
        ready_s = None
        while time.time() < deadline:
            if ready_s is None and all(self.states().get(n) == "ready" for n in first):
                ready_s = time.time() - restart
                say(f"== outage: {', '.join(first)} ready after {ready_s:.1f}s")
            time.sleep(1)
            self.progress()
        for name in rest:
            self.fleet.start(name, wait=False)
        say(f"== outage: {', '.join(rest)} started")
        self.events.append(Event("outage", at, partitions=list(range(self.settings.partitions)), since=at + stopped,
                                 note=f"stopped in {stopped:.1f}s (exit {', '.join(map(str, codes.values()))}), "
                                      f"{args.outage_s:.0f}s without workers, "
                                      f"{len(first)} alone for {args.outage_alone_s:.0f}s "
                                      f"(ready after {ready_s if ready_s is None else round(ready_s, 1)}s)"))

    # --------------------------------------------------------------------------------- run
    def execute(self) -> dict:
        args = self.args
        self.begin()
        t0 = self.t0
        plan = schedule(max(0, int(args.minutes * 60 // args.event_every) - 2), self.rng)
        say(f"== {args.minutes:g} minutes at {self.rate:,.0f}/s; events every {args.event_every:g}s: {', '.join(plan)}")
        self.skipped += [kind for kind in ("join", "leave", *ONCE) if kind not in plan]  # too few slots for them
        last_end, calm_end = t0, t0 + args.minutes * 60 - args.event_every
        for k, kind in enumerate(plan, start=1):
            # one slot each, and at least half a slot after the previous event ended (a broker
            # restart or the outage takes longer than a short slot); none in the last slot
            at = max(t0 + k * args.event_every, last_end + args.event_every / 2)
            if at > calm_end and kind not in (*ONCE, "leave"):
                say(f"== no time left for the {kind} of slot {k}: skipped")
                self.skipped.append(kind)
                continue
            self.sleep_until(at)
            self.do(kind)
            last_end = time.time()
        self.sleep_until(t0 + args.minutes * 60)
        self.feeder.stop()
        t_end = time.time()
        say(f"== sending stopped: {len(self.feeder.sent):,} records; waiting for the fleet ({', '.join(self.fleet.procs)})")
        for name in self.names:  # every worker of the fleet runs at the end (one may still be starting)
            if name not in self.fleet.procs:
                self.fleet.start(name, wait=False)
        inputs_end = kafkatools.end_offsets(self.settings, INPUTS)
        caught_up = True
        try:
            self.fleet.wait_caught_up(inputs_end, args.catch_up_timeout, progress=lambda _lag: self.progress(),
                                      revive=self.revive)
        except AssertionError as exc:
            caught_up = False
            say(f"!! {exc}")
        time.sleep(2)
        self.tap.stop()
        self.sampler.stop()
        for e, later in zip(self.events, [*self.events[1:], None], strict=True):
            since = e.since or e.at
            back = self.tap.back_after(e.partitions, int(since * 1000)) if e.partitions else None
            e.back_s = None if back is None else since - e.at + back
            e.pause_s = self.tap.longest_pause(e.partitions, e.at, min(e.at + 120, later.at if later else time.time()))
            if later is not None and e.back_s is not None and later.at < e.at + e.back_s:
                e.note = f"{e.note}; overlapped by the {later.kind} {later.at - e.at:.0f}s after it".lstrip("; ")
        comparison: dict = {"ran": False}
        if caught_up:
            say("== comparing with a single-worker reference on the same input range")
            try:
                result = finish_and_compare(self.fleet, self.reference, sorted(self.feeder.users), inputs_end,
                                            self.outputs_start, TOKEN, timeout=args.catch_up_timeout, progress=say)
            except AssertionError as exc:  # the reference did not catch up: the report is still written
                say(f"!! comparison not finished: {exc}")
                comparison = {"ran": False, "error": str(exc)}
            else:
                if result.got.nodes != result.want.nodes:
                    save_diff(self.folder / "diff-nodes.json", result.got.nodes, result.want.nodes)
                comparison = {"ran": True, "equal": not result.problems, "problems": result.problems[:20],
                              "problem_count": len(result.problems), **result.figures}
        return self.results(t_end, plan, caught_up, comparison, inputs_end)

    def stop(self) -> None:
        super().stop()
        self.reference.kill_all()

    # ----------------------------------------------------------------------------- report
    def results(self, t_end: float, plan: list[str], caught_up: bool, comparison: dict, inputs_end: dict) -> dict:
        t0, minutes = self.t0, []
        for m in range(int((t_end - t0 + 59) // 60)):
            start, end = t0 + 60 * m, min(t0 + 60 * (m + 1), t_end)
            events = [e for e in self.events if start <= e.at < end]
            lat = self.tap.latencies_ms(start, end)
            calm_from = max([e.at + (e.back_s or 0) for e in events], default=start)
            calm = self.tap.latencies_ms(calm_from, end) if events else lat
            lag_start = next((smp.lag for smp in self.sampler.samples if smp.t >= start), None)
            minutes.append({"minute": m, "lag_at_start": lag_start, "events": ", ".join(f"{e.kind}{' ' + e.worker if e.worker else ''}" for e in events),
                            "calm": not events, "inputs": sum(1 for s in self.feeder.sent if start <= s < end),
                            "matched": len(lat), "p50_ms": _round(percentile(lat, .5)), "p99_ms": _round(percentile(lat, .99)),
                            "max_ms": _round(lat[-1] if lat else None), "calm_part_p99_ms": _round(percentile(calm, .99)),
                            "calm_part_inputs": len(calm)})
        return {**self.header(), "plan": plan, "skipped": self.skipped,
                "inputs_paced": sum(1 for s in self.feeder.sent if s >= t0),
                "inputs_with_a_ledger_event_seen": len(self.tap.first), "caught_up": caught_up,
                "input_range": {f"{t}:{p}": [self.inputs_start[(t, p)], off] for (t, p), off in inputs_end.items()
                                if off > self.inputs_start[(t, p)]},
                "events": [asdict(e) | {"at_min": round((e.at - t0) / 60, 2)} for e in self.events],
                "minutes": minutes, "comparison": comparison, "tap_errors": self.tap.errors,
                "committed_offsets_moved_back": self.sampler.backwards,
                "samples": [asdict(s) | {"t_min": round((s.t - t0) / 60, 3)} for s in self.sampler.samples]}

    def plot(self, res: dict, path: Path) -> None:
        t0 = self.t0
        samples = self.sampler.samples
        xs = [(s.t - t0) / 60 for s in samples[1:]]
        committed = [(b.committed - a.committed) / (b.t - a.t) for a, b in zip(samples, samples[1:], strict=False)]
        sent = [(b.sent - a.sent) / (b.t - a.t) for a, b in zip(samples, samples[1:], strict=False)]
        buckets: dict[int, list[float]] = {}
        sent_times = self.feeder.sent
        for n, got in list(self.tap.first.items()):
            if sent_times[n] >= t0:
                buckets.setdefault(int((sent_times[n] - t0) // 10), []).append((got - sent_times[n]) * 1000)
        bx = sorted(buckets)
        p50 = [percentile(sorted(buckets[b]), .5) or 0 for b in bx]
        p99 = [percentile(sorted(buckets[b]), .99) or 0 for b in bx]
        events = [((e.at - t0) / 60, f"{e.kind} {e.worker}".strip()) for e in self.events]
        plot_timeline(path, f"memstream chaos: {len(self.names)} workers, {self.settings.partitions} partitions, "
                      f"{res['rate']:,.0f} records/s sent ({res['date']})", [
                          ("input records/s", {"committed": (xs, committed), "sent": (xs, sent)}, False),
                          ("visible latency, ms\n(per 10 s of sending)", {"p50": ([b / 6 for b in bx], p50),
                                                                          "p99": ([b / 6 for b in bx], p99)}, True),
                          ("lag (records)", {"lag": ([(s.t - t0) / 60 for s in samples], [s.lag for s in samples])}, False),
                      ], events)

    def markdown(self, res: dict) -> str:
        return markdown(res)


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def markdown(res: dict) -> str:
    c = res["comparison"]
    verdict = ("**equal to the single-worker reference**" if c.get("equal") else
               "**DIFFERENT from the reference**" if c.get("ran") else
               f"**not compared** ({c['error']})" if c.get("error") else "**not compared** (the fleet did not catch up)")
    lines = [f"# Chaos run {res['app_id']} ({res['date']})", "",
             f"{res['machine']}; load average at the end {res['load_average_end']}", f"{res['versions']}", "",
             f"{len(res['plan'])} events over {res['args']['minutes']:g} minutes, {res['args']['workers']} workers, "
             f"{res['partitions']} partitions, {res['users']} users; sustained rate "
             f"{res['sustained_rate'] or '–'} records/s, sent at {res['rate']:,.0f}/s; {res['inputs']:,} inputs "
             f"({res['inputs_paced']:,} paced). Outputs {verdict}: {c.get('nodes', '–')} node keys, "
             f"{c.get('events', '–')} ledger/relay events, {c.get('repeated_events', '–')} repeated (identical copies), "
             f"{c.get('dead_letters', '–')} dead letters; fleet caught up: {res['caught_up']}.", ""]
    if c.get("problems"):
        lines += ["Differences (first 20):", "", *[f"- {p}" for p in c["problems"]], ""]
    if res.get("committed_offsets_moved_back"):
        moved = res["committed_offsets_moved_back"]
        lines += [f"A committed offset moved back {len(moved)} time(s) (records read again, not lost): "
                  + ", ".join(f"{where} {before}→{now}" for _t, where, before, now in moved[:5]), ""]
    if res["skipped"]:
        lines += [f"Events skipped (no slot or no time left in the run): {', '.join(res['skipped'])}.", ""]
    lines += ["| event | at (min) | worker | partitions | until they produced again | longest pause of one | note |",
              "|---|---|---|---|---|---|---|"]
    for e in res["events"]:
        back = "–" if e["back_s"] is None else f"{e['back_s']:.1f} s"
        pause = "–" if e.get("pause_s") is None else f"{e['pause_s']:.1f} s"
        lines.append(f"| {e['kind']} | {e['at_min']:.2f} | {e['worker'] or '–'} | {len(e['partitions'])} | {back} | {pause} "
                     f"| {e['note']} |")
    lines += ["", "| minute | events | lag at its start | inputs | visible p50 | p99 | max | p99 after recovery (inputs) |",
              "|---|---|---|---|---|---|---|---|"]
    for m in res["minutes"]:
        calm = "calm" if m["calm"] else f"{_ms(m['calm_part_p99_ms'])} ({m['calm_part_inputs']:,})"
        lag = "–" if m["lag_at_start"] is None else f"{m['lag_at_start']:,}"
        lines.append(f"| {m['minute']} | {m['events'] or 'calm'} | {lag} | {m['inputs']:,} | {_ms(m['p50_ms'])} | "
                     f"{_ms(m['p99_ms'])} | {_ms(m['max_ms'])} | {calm} |")
    return "\n".join(lines) + "\n"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = run_arguments(__doc__, minutes=15, workers=4, partitions=12, users=300, seed=34)
    ap.add_argument("--event-every", type=float, default=60, help="seconds between chaos events")
    ap.add_argument("--outage-s", type=float, default=20, help="seconds the outage leaves the group without workers")
    ap.add_argument("--outage-first", type=int, default=1, help="workers started alone after the outage")
    ap.add_argument("--outage-alone-s", type=float, default=45, help="seconds they run alone before the others start")
    ap.add_argument("--session-timeout", type=float, default=0, help="MEMSTREAM_SESSION_TIMEOUT_S of the workers (0: the default)")
    ap.add_argument("--sample-every", type=float, default=5, help="seconds between lag samples")
    ap.add_argument("--reference-nodes-max", type=int, default=5_000_000,
                    help="MEMSTREAM_LOADED_NODES_MAX of the single-worker reference (it holds every user of the run)")
    ap.add_argument("--catch-up-timeout", type=float, default=1200, help="seconds the fleet, then the reference, may take to catch up")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    _chaos, res = run_script(parse_args(argv), STACK, Chaos)
    return 0 if res["caught_up"] and res["comparison"].get("equal") else 1


if __name__ == "__main__":
    raise SystemExit(main())
