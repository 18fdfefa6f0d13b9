"""End to end on the local stack, in one run: raw Kafka baseline, pipeline throughput (one worker
per store, two workers), latency at half load, changelog recovery, peak RSS.

    .venv/bin/python -m bench.bench_e2e                      # the full run (`make bench` runs this)
    .venv/bin/python -m bench.bench_e2e --users 40 --latency-seconds 10 \\
        --recovery-nodes 20000 --stores rocksdb://           # a quick one
    .venv/bin/python -m bench.bench_e2e --profile            # also profile one worker with py-spy

What each figure means:

* **load**: `streams.tools.generate`'s sample stream (memory candidates, device events, turns, negotiator
  requests, sessions, graphs, bad records) for `--users` users, its newest event time one hour
  ago (`latest_first_epoch`: the generator starts each user 7 minutes after the previous one, so
  a stream that started an hour ago ran up to days into the future, and the worker refused every
  record more than MEMSTREAM_MAX_FUTURE_SKEW_MS ahead of its Kafka timestamp: until stop 20 about
  a third of a 300-user run was dead-lettered as `invalid_time`, while the Quix peer, which does
  not check times, consolidated them), interleaved round-robin by key (per-key order kept) and
  Avro-encoded once up front. "load generator" is the rate the producer alone sends it. Every
  pipeline run starts with each load user's de-duplication window already holding `--seen-ids`
  ids (default MEMSTREAM_DEDUP_MAX_IDS: users that have been active for a while, as in steady
  state; 0 = brand-new users), persisted as the worker does: sealed chunks of SEEN_CHUNK_SIZE
  ids in rows `<user>/~seen/<k>` and the open tail in the user's compact aux row.
* **raw baseline**: a confluent-kafka consumer→producer copying exactly those records (same
  bytes) from the input topics to a scratch topic (acks=all, async commits); records / time from
  the first fetch until the producer has flushed.
* **Quix Streams peer** (`--no-quix` skips it): Quix Streams 3.28.1 running memstream's own
  `process_candidate` / `process_event` on exactly those records (bench/quix_peer.py: decoded with
  memstream's codec, one `UserMemory` per user in a dict, ledger events sent as JSON to a scratch
  topic), in its own virtualenv made on first use under MEMSTREAM_CACHE_DIR (`venv-quix-<digest>`, one
  per set of its requirements; a benchmark dependency, not a runtime one); records / time from its first record until it has stopped (producer flushed,
  offsets committed), and its process CPU per record. Every pipeline figure is reported as a ratio
  to the raw copy and to this peer, measured in the same run, with the load average beside them.
* **the framework peers** (issue 14's table; `--peers` picks them, default all): the same
  records through three frameworks, each with two kinds of work (bench/core_step.py): a
  **per-user counter** in the framework's own state (what the framework costs with almost no
  work) and **memstream's core** as the Quix peer runs it. `plain-*`: a confluent-kafka batch loop
  (counter in a dict); `quix-*`: Quix Streams (counter in its RocksDB state; `quix-core` is the
  Quix peer above); `faust-*`: a minimal Faust agent, one event and one `send` at a time (counter
  in a `Table` on rocksdb://) — bench/peers.py, bench/quix_peer.py. Measured as the Quix peer is.
  `faust-input`: Faust only reading the records, in batches as memstream's worker takes them (no
  work, no output): what reading a record through Faust costs, the floor under a Faust worker.
* **same job** (issue 33; `--no-samejob` or `--no-quix` skips it): memstream and a Quix Streams
  application that does the memory agent's whole job (bench/quix_samejob.py: candidates, events,
  turns and negotiator requests in; ledger, relay, node rows and tombstones, quarantine, negotiator
  replies and dead letters out, Avro through the registry; each user's state in Quix's RocksDB
  state with its changelog; the worker's own rules, `streams.agents.memory_step`) on the same
  input: the load's records of those four topics, sent one topic after the other (all candidates,
  then events, turns, negotiator requests: `samejob_phases`), each phase taken by one worker (fresh
  app id and state, new users, timers slowed down) before the next is sent; then the peer reads
  exactly those records (Quix's `concat` hands a partition's records over in timestamp order, so
  both apply every user's records in the same order). Both systems' outputs are compared per topic
  as multisets of (key, decoded value) (bench/samejob_compare.py: a dead letter's `failed_at` and
  `worker` blanked); the summary prints the comparison and memstream's CPU per record ÷ the peer's,
  or no ratio when they differ. memstream's figure is its process CPU from the first phase's first
  send to the last commit, so it includes the idling while the bench waited for each phase's
  commit (printed beside it); the peer's is measured as the other peers'. The two run one after
  the other, and this VM's speed drifts by tens of percent within minutes: the core alone on the
  load's first records is timed before and after each system's phase (`speed_probe`), and the
  summary also prints the ratio calibrated by those probes (`SameJob.calibrated_ratio`). The pair
  runs `--samejob-rounds` times (3), each round with fresh app ids; the summary gives each round
  and the medians. With `--profile`, one more round runs both systems under py-spy and prints
  their CPU per record by part side by side (bench/profile_parts.py).
* **core alone**: the Quix peer's per-record work (decode, `process_candidate` /
  `process_event`, a dict of `UserMemory`) on the same records in the bench's own thread, without
  Kafka or any framework: the CPU per record every system running this core pays at least. (The
  Quix peer's figure minus this one is what Quix Streams costs; the pipeline's minus this one
  what memstream adds: relay, node rows, state and its changelogs, analytics, checks. The
  summary's "added around the core" table prints these differences for every system that runs
  the core, and each as a multiple of what Quix Streams adds.)
* **pipeline**: a fresh app id (consumer group, changelogs, data dir) per run, positioned at the
  end of the input topics; the workers are started, `/health` ready and their memory caches
  filled by the prefill that follows every rebalance (every seeded user read; it stays out of
  the figures) before the first record is produced. Time = first produce → the newest record timestamp (CreateTime, set by the
  worker's producer when it sends) on the output topics (ledger, relay, nodes, quarantine, DLQ,
  negotiator replies, compactions; not the timer-driven analytics / graph state), read once the
  group has committed past the last input record. Rate = input records / time.
* **two workers against one**: `--scaling-rounds` rounds (3) of a one-worker run then a two-worker
  run on the same input (RocksDB; the first round reuses the one-worker RocksDB run), one after the
  other: two workers' CPU per record ÷ one's, each round and the median (the kept target ≤ 1.15×,
  `SCALING_TARGET`). On two cores shared with the broker one pair's ratio moved by ±30% from one pair
  to the next, so the median of rounds is the figure.
* **latency**: one worker (store of the first one-worker run), the load's first records (at most
  all of it) produced for `--latency-seconds` at `--latency-rate` (default: half the first
  one-worker run's rate; several rates, comma-separated, give one run each), each record's
  Kafka timestamp = its send time, sent by a producer with librdkafka's default linger of 5 ms
  (`--latency-linger-ms`; until 2026-12-06 0 ms, a request per record, whose cost to the broker
  on the same two cores took CPU from the worker). The send time is taken before the record is
  handed to the producer: its linger is part of the latency. A consumer of `memory.ledger.v1` maps each
  ledger event to its input by id (the candidate's derived `memory_formed`/`memory_consolidated`
  id, the event's own id, the turn's `memory_audit` id) and takes each input's first ledger
  event. *visible* = the tap's receive time - send time (what a downstream consumer sees);
  *written* = the ledger record's CreateTime - send time (until the worker's send). *p50 first
  ¼ / last ¼*: visible p50 of the inputs sent in the first / last quarter of the run (a last
  quarter far above the first: the worker fell behind the rate); *p99 after the first ¼*: the
  visible p99 of the inputs sent after the first quarter (the run without its start); *worker CPU busy*: the worker's
  CPU time / wall time from the first send until all is processed (~100%: one core saturated).
* **recovery**: a `memory-state` changelog synthesized directly (node rows, and per user a full
  de-duplication window in the compact form above: chunk rows + aux row; each row in its user's
  partition), then a worker with an empty data dir: time from process start until `/health`
  is ready (tables recovered), and until the first `GET /v1/memory/{user}/nodes` answers
  with all of the user's nodes (the user's rows are read on its first touch); then the first
  query of two more users (*slowest first query of a user*). `--recovery-only` runs only this.
* **worker CPU / record**: user + system CPU time of the run's workers (/proc/<pid>/stat) from
  the first produce until the end, per input record; unlike the rates it hardly depends on what
  else runs on the machine.
* **peak RSS**: VmHWM of each worker process (/proc/<pid>/status) just before it is stopped.
* **profile** (`--profile`): one more one-worker run under `py-spy record --format raw` (100 Hz,
  busy threads only); prints the top functions by own time and memstream's by inclusive time.

Everything a run creates on the broker (topics, consumer groups) and its data dirs are deleted at
the end; worker logs (and the profile) stay in bench/out/<run id>/.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import hashlib
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from statistics import median

import orjson
from aiokafka.partitioner import murmur2
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from bench import profile_parts, samejob_compare
from bench.bench_consolidation import memory_text, vocabulary
from bench.core_step import CoreWork, thread_cpu, thread_kinds
from bench.fleet import load_average
from streams.agents.memory import PROCESSOR as MEMORY_PROCESSOR
from streams.agents.memory_store import STATE_TABLE, node_key
from streams.agents.user_cache import chunk_rows
from streams.contracts import catalog, topics
from streams.contracts.wire import CodecFactory, encode_key
from streams.core import UserMemory, event_id_for
from streams.core.nodes import make_node
from streams.core.warmup import warm_up as warm_up_core
from streams.settings import Settings
from streams.tools import devstack, generate, kafkatools
from streams.tools.progress import Progress

INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]
OUTPUTS = [catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.MEMORY_NODES, catalog.MEMORY_QUARANTINE,
           catalog.DLQ, catalog.NEGOTIATOR_REPLIES, catalog.SESSION_COMPACTIONS]
HOUR_MS = 3_600_000
TOKEN = "bench-token"
BENCH = Path(__file__).resolve().parent  #: this folder: the peers' scripts, from any working folder
OUT_DIR = Path("bench/out")
SCALING_TARGET = 1.15  #: two workers' CPU per record ÷ one's, at most (the kept target of bench/RESULTS.md)
PROGRESS_S = 5.0


class BenchError(RuntimeError):
    """A step of the benchmark could not run; the message says which and why."""


# ------------------------------------------------------------------------------------------ load
@dataclass(frozen=True)
class Record:
    """One pre-encoded input record and the ids of the ledger events it may cause first."""

    topic: str
    key: bytes
    value: bytes
    ledger_ids: tuple[str, ...]


def ledger_ids(item: generate.Item) -> tuple[str, ...]:
    value = item.value
    if isinstance(value, bytes):
        return ()
    if item.topic == catalog.MEMORY_CANDIDATES:
        return tuple(event_id_for(item.key, value["candidate_id"], kind)
                     for kind in ("memory_formed", "memory_consolidated"))
    if item.topic == catalog.MEMORY_EVENTS:
        return (value["event_id"],)
    if item.topic == catalog.MEMORY_TURNS:
        return (event_id_for(item.key, value["turn_id"], "memory_audit"),)
    return ()


def latest_event_time(items: list[generate.Item]) -> int:
    """The latest event time (`timestamp`, `valid_from`, top level or in the payload) of the items."""
    times = [0]
    for item in items:
        if isinstance(item.value, dict):
            payload = item.value.get("payload") if isinstance(item.value.get("payload"), dict) else {}
            times += [v for v in (item.value.get("timestamp"), item.value.get("valid_from"), payload.get("valid_from"))
                      if isinstance(v, int)]
    return max(times)


def latest_first_epoch(users: int, newest_ms: int) -> list[generate.Item]:
    """The sample stream for `users` users, shifted so its latest event time is `newest_ms`
    (generated times are the epoch plus fixed offsets)."""
    items = generate.generate(seed=7, users=users, epoch_ms=newest_ms)
    shifted = generate.generate(seed=7, users=users, epoch_ms=2 * newest_ms - latest_event_time(items))
    assert latest_event_time(shifted) == newest_ms, "the sample stream's times are not its epoch plus offsets"
    return shifted


def build_load(settings: Settings, users: int) -> list[Record]:
    items = generate.interleave(latest_first_epoch(users, int(time.time() * 1000) - HOUR_MS))
    factory = CodecFactory.from_url(settings.registry_url)
    factory.register(INPUTS)
    return [Record(i.topic, encode_key(i.key), i.value if isinstance(i.value, bytes) else
                   factory.codec(catalog.topic(i.topic).value_schema).encode(i.value), ledger_ids(i)) for i in items]


# ------------------------------------------------------------------------------------- producing
class Sender:
    """A confluent-kafka producer that retries a full queue and fails on undelivered records."""

    def __init__(self, settings: Settings, **config: object) -> None:
        self.producer = Producer({"bootstrap.servers": settings.broker, "partitioner": "murmur2_random",
                                  "linger.ms": 5, "acks": "all", "log_level": 0, **config})
        self.failures: list[str] = []

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self.failures.append(str(err))

    def send(self, topic: str, key: bytes, value: bytes, **kw: int) -> None:
        while True:
            try:
                self.producer.produce(topic, value, key, on_delivery=self._delivered, **kw)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def flush(self) -> None:
        remaining = self.producer.flush(120)
        if remaining or self.failures:
            raise BenchError(f"{remaining + len(self.failures)} record(s) not delivered: {self.failures[:1]}")


def produce(settings: Settings, records: list[Record]) -> float:
    """Send every record as fast as the producer goes; returns the send rate (records/s)."""
    sender, started = Sender(settings), time.monotonic()
    for r in records:
        sender.send(r.topic, r.key, r.value)
    sender.flush()
    return len(records) / (time.monotonic() - started)


def paced(settings: Settings, records: list[Record], rate: float, linger_ms: float) -> list[float]:
    """Send records at `rate`/s, each with its send time as Kafka timestamp, through a producer
    that waits up to `linger_ms` to fill a request; returns the send times."""
    sender, sent = Sender(settings, **{"linger.ms": linger_ms}), []
    started = last_report = time.time()
    for n, r in enumerate(records):
        delay = started + n / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        now = time.time()
        sent.append(now)
        sender.send(r.topic, r.key, r.value, timestamp=int(now * 1000))
        if now - last_report >= PROGRESS_S:
            last_report = now
            say(f"  … {n + 1}/{len(records)} sent at {rate:,.0f}/s")
    sender.flush()
    return sent


# -------------------------------------------------------------------------------- raw baseline
def raw_copy(settings: Settings, start: kafkatools.Offsets, end: kafkatools.Offsets, scratch: str) -> float:
    """Copy the records between `start` and `end` to `scratch`; returns records/s from the first
    record received until the last one is acknowledged."""
    consumer = kafkatools.consumer(settings, f"{scratch}-group")
    sender = Sender(settings)
    todo = {tp: off for tp, off in end.items() if off > start[tp]}
    consumer.assign([TopicPartition(t, p, start[(t, p)]) for (t, p) in todo])
    copied, started = 0, 0.0
    try:
        while todo:
            batch = consumer.consume(1000, 0.05)
            if batch and not started:
                started = time.monotonic()
            for msg in batch:
                if msg.error():
                    continue
                sender.send(scratch, msg.key(), msg.value())
                copied += 1
                tp = (msg.topic(), msg.partition())
                if tp in todo and msg.offset() + 1 >= todo[tp]:
                    del todo[tp]
            if batch:
                consumer.commit(asynchronous=True)
        sender.flush()
    finally:
        consumer.close()
    return copied / (time.monotonic() - started)


class PerRecord:
    """Rate and CPU per record of a run that has `records`, `seconds` and `cpu_s`."""

    records: int
    seconds: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_ms_per_record(self) -> float:
        return 1000 * self.cpu_s / self.records


# ------------------------------------------------------------------------------ Quix Streams peer
# The memstream code the peer runs (streams.core, streams.contracts.wire) gets the versions of memstream's
# lock; the whole lock cannot constrain this virtualenv (Quix Streams 3.28.1 needs confluent-kafka<2.13).
_LOCK_FILE = Path(__file__).resolve().parent.parent / "constraints.txt"
_LOCK = dict(line.split("==", 1) for line in _LOCK_FILE.read_text().splitlines() if "==" in line and not line.startswith("#"))
QUIX_REQUIREMENTS = ["quixstreams==3.28.1", f"numpy=={_LOCK['numpy']}", f"fastavro=={_LOCK['fastavro']}",
                     # the core's compiled loops, as in memstream's virtualenv (streams/core/_kernels.py)
                     f"numba=={_LOCK['numba']}", f"llvmlite=={_LOCK['llvmlite']}"]
#: the peer's virtualenv, outside the checkout beside `dev up`'s downloads (MEMSTREAM_CACHE_DIR), one per
#: set of requirements and Python: a fresh clone reuses it instead of installing Quix Streams again
QUIX_VENV = Path(Settings().cache_dir) / ("venv-quix-" + hashlib.sha256(
    "\n".join([sys.version, *QUIX_REQUIREMENTS]).encode()).hexdigest()[:12])


@dataclass(frozen=True)
class Peer(PerRecord):
    label: str
    records: int
    seconds: float
    cpu_s: float
    store: str = "dict"
    #: of it, each kind of thread's (`core_step.thread_kinds`; the same-job peer reports it)
    threads_cpu_s: dict[str, float] = field(default_factory=dict)


#: the framework peers, in issue 14's order: name -> (label, where the per-user state is)
PEERS = {
    "plain-counter": ("plain confluent-kafka batch loop, per-user counter", "dict"),
    "quix-counter": ("Quix Streams, per-user counter", "RocksDB state"),
    "faust-counter": ("minimal Faust agent, per-user counter", "Table, rocksdb://"),
    "plain-core": ("plain confluent-kafka batch loop + process_candidate", "dict"),
    "quix-core": ("Quix Streams + process_candidate", "dict"),
    "faust-core": ("minimal Faust agent + process_candidate", "dict"),
    "faust-input": ("Faust reading only (take_events batches as memstream's worker, no work, no output)", "–"),
}
QUIX_CORE = "quix-core"  #: the peer every figure is a ratio to (the issue's target)


def quix_python() -> Path:
    """The peer's own virtualenv (a benchmark dependency, not a runtime one: Quix Streams' pins
    need not agree with memstream's); made on first use."""
    python = QUIX_VENV / "bin" / "python"
    QUIX_VENV.parent.mkdir(parents=True, exist_ok=True)
    # one maker at a time (the test suite's processes and a bench may ask at once); a venv whose
    # making was interrupted has no `.complete` and is made again
    with open(QUIX_VENV.parent / f"{QUIX_VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok = (QUIX_VENV / ".complete").exists() and subprocess.run(
            [str(python), "-c", "import quixstreams, numpy, fastavro, numba"], capture_output=True).returncode == 0
        if not ok:
            say(f"   making {QUIX_VENV} ({', '.join(QUIX_REQUIREMENTS)}) …")
            shutil.rmtree(QUIX_VENV, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True)
            r = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *QUIX_REQUIREMENTS])
            if r.returncode != 0:
                raise BenchError(f"could not install {QUIX_REQUIREMENTS} into {QUIX_VENV}")
            (QUIX_VENV / ".complete").touch()
    return python


def run_peer(settings: Settings, name: str, start: kafkatools.Offsets, end: kafkatools.Offsets, run: Path) -> Peer:
    """One framework peer (`PEERS`) on the records from `start` to `end`, in its own process
    (bench/quix_peer.py in its own virtualenv, or bench/peers.py)."""
    label, store = PEERS[name]
    framework, work = name.split("-", 1)
    group, output, data = f"{run.name}-{name}", f"{run.name}-{name}-out", run / "data" / name  # removed with the run's data
    count = sum(off - start[tp] for tp, off in end.items() if off > start[tp])
    kafkatools.position_group(settings, group, start)  # the group starts where the load starts
    create_topic(settings, output, {})
    data.mkdir(parents=True, exist_ok=True)
    common = ["--work", work, "--broker", settings.broker, "--registry", settings.registry_url, "--group", group,
              "--output", output, "--topics", ",".join(INPUTS), "--count", str(count)]
    if framework == "quix":
        cmd = [str(quix_python()), str(BENCH / "quix_peer.py"), *common, "--state-dir", str(data)]
    else:
        cmd = [sys.executable, str(BENCH / "peers.py"), framework, *common, "--data-dir", str(data),
               "--partitions", str(settings.partitions)]
    say(f"   {label}: {count:,} records …")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    log_file = run / f"{name}.log"
    log_file.write_text(r.stdout + r.stderr)
    line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("{")), None)
    if r.returncode != 0 or line is None:
        raise BenchError(f"the peer {name} failed (exit {r.returncode}); see {log_file}")
    res = orjson.loads(line)
    peer = Peer(label, int(res["records"]), float(res["seconds"]), float(res["cpu_s"]), store)
    say(f"   {label}: {peer.rate:,.0f} records/s, CPU {peer.cpu_ms_per_record:.3f} ms/record")
    return peer


def core_alone(settings: Settings, load: list[Record], quiet: bool = False) -> Peer:
    """memstream's core without any Kafka or framework: the Quix peer's per-record work
    (bench/core_step.py `CoreWork`) on the same records, in this process's thread (its CPU
    time). The floor every peer running this core pays per record."""
    work = CoreWork(settings.registry_url, INPUTS)
    warm_up_core()  # the compiled loops, before the clock starts (as a worker and the peers do)
    gc.collect()
    started, cpu0 = time.monotonic(), time.thread_time()
    for r in load:
        work(r.topic, r.key.decode(), r.value)
    peer = Peer("memstream's core alone (decode + process_candidate, no Kafka)", len(load),
                time.monotonic() - started, time.thread_time() - cpu0)
    if not quiet:
        say(f"   core alone: {peer.rate:,.0f} records/s, CPU {peer.cpu_ms_per_record:.3f} ms/record")
    return peer


SPEED_PROBE_RECORDS = 4000  #: records of the load the speed probe runs through the core alone


def speed_probe(settings: Settings, load: list[Record]) -> float:
    """How fast the VM runs right now: the core alone's CPU ms per record on the load's first
    SPEED_PROBE_RECORDS records (~0.5 s). A VM's speed drifts by tens of percent within minutes;
    the same-job run probes before and after each system's phase (`SameJob.calibrated_ratio`)."""
    return core_alone(settings, load[:SPEED_PROBE_RECORDS], quiet=True).cpu_ms_per_record


# ----------------------------------------------------------------------- the same-job peer
SAMEJOB_LABEL = "Quix Streams, same job (bench/quix_samejob.py)"
#: the timers' interval in the same-job worker: housekeeping reads the wall clock (and the peer has none)
SAMEJOB_TIMER_S = "3600"
TAKEN_POLL_S = 0.25  #: how often `wait_taken` asks the same-job worker for what it has taken
SAMEJOB_IDLE_S = 3.0  #: how long the same-job worker's idle CPU rate is measured before the first phase


@dataclass
class SameJob:
    """memstream's worker and the same-job Quix Streams peer on the same input, and whether they
    wrote the same records."""

    memstream: Throughput
    peer: Peer
    comparison: samejob_compare.Comparison
    #: of memstream's CPU per record, about how much it spent idle while the bench waited for its
    #: commit after each phase (an idle worker's CPU rate × that wait; the ratio keeps it in)
    idle_ms_per_record: float = 0.0
    #: `speed_probe` before and after memstream's phases, and before and after the peer's run
    probes: tuple[float, float, float, float] | None = None
    #: each system's CPU ms per record by kind of thread (`core_step.thread_kinds`)
    threads: tuple[dict[str, float], dict[str, float]] | None = None
    #: of a profiled run: each system's µs per record by part (`profile_parts.us_per_record`)
    parts: tuple[dict[str, float], dict[str, float]] | None = None
    load: str = ""  #: the load average when the run ended

    @property
    def ratio(self) -> float | None:
        """memstream's CPU per record ÷ the peer's; None unless they wrote the same."""
        return self.memstream.cpu_ms_per_record / self.peer.cpu_ms_per_record if self.comparison.equal else None

    @property
    def calibrated_ratio(self) -> float | None:
        """`ratio` with each system's CPU divided by the mean of the speed probes around it: what
        the ratio would be had the VM run at one speed throughout."""
        if self.ratio is None or self.probes is None:
            return None
        ours, theirs = (self.probes[0] + self.probes[1]) / 2, (self.probes[2] + self.probes[3]) / 2
        return self.ratio * theirs / ours


def samejob_phases(load: list[Record]) -> list[list[Record]]:
    """The load's records of the peer's inputs, one phase per topic (candidates, events, turns,
    negotiator requests), each in the load's order. Kafka orders records within a partition, not
    across topics, and a user's event or turn applied before one of its candidates changes the
    clocks of the events derived after it (tests/system/test_faults_kafka.py streams candidates only
    for that reason): the worker finishes each phase before the next is sent, so both systems
    apply every user's records in the same order (the peer takes a partition's records of all
    topics in timestamp order: Quix's `concat`)."""
    return [[r for r in load if r.topic == topic] for topic in samejob_compare.INPUTS]


def samejob_run(settings: Settings, load: list[Record], run: Path, store: str = "rocksdb://", round_no: int = 0,
                profile: bool = False) -> SameJob:
    """One worker (fresh app id and state, new users, timers slowed down) on the peer's inputs of
    the load, phase by phase (`samejob_phases`); then the same-job Quix Streams peer
    (bench/quix_samejob.py) on exactly those records, writing to `<app id>-quix-<topic>`; then
    the comparison of both systems' outputs (bench/samejob_compare.py). `round_no` names the
    round's app id; `profile` runs both systems under py-spy (`SameJob.parts`)."""
    phases = samejob_phases(load)
    records = sum(len(p) for p in phases)
    app_id = f"{run.name}-samejob{round_no or ''}{'-profiled' if profile else ''}"
    say(f"\n== same job: memstream, one worker, {store}, {records:,} records in {len(phases)} phases (app id {app_id})")
    workers = start_workers(settings, app_id, 1, store, run, [], {"MEMSTREAM_TIMER_INTERVAL_S": SAMEJOB_TIMER_S})
    worker = workers[0]
    try:
        in_start = kafkatools.end_offsets(settings, list(samejob_compare.INPUTS))
        out_start = kafkatools.end_offsets(settings, list(samejob_compare.COMPARED))
        cpu0 = kafkatools.cpu_seconds(worker.proc.pid)
        time.sleep(SAMEJOB_IDLE_S)
        idle = (kafkatools.cpu_seconds(worker.proc.pid) - cpu0) / SAMEJOB_IDLE_S
        before = speed_probe(settings, load)
        spy = start_profiler(worker.proc.pid, run / f"py-spy-{app_id}.txt") if profile else None
        threads0 = thread_cpu(worker.proc.pid)
        cpu0, t0, taken, waited = kafkatools.cpu_seconds(worker.proc.pid), time.time(), 0, 0.0
        for phase in phases:
            produce(settings, phase)
            taken += len(phase)
            wait_taken(worker, taken)
            handed = time.monotonic()
            wait_processed(settings, app_id, kafkatools.end_offsets(settings, INPUTS), workers)
            waited += time.monotonic() - handed
        seconds = time.time() - t0
        cpu = kafkatools.cpu_seconds(worker.proc.pid) - cpu0
        threads = thread_kinds(threads0, thread_cpu(worker.proc.pid), worker.proc.pid, cpu)
        if spy is not None:
            stop_profiler(spy)
        rss = [kafkatools.peak_rss_mib(worker.proc.pid)]
        out_end = kafkatools.end_offsets(settings, list(samejob_compare.COMPARED))
        after = speed_probe(settings, load)
    finally:
        stop(workers)
    ours = Throughput("same job", 1, store, records, seconds, cpu, rss)
    say(f"   memstream: CPU {ours.cpu_ms_per_record:.3f} ms/record; between the phases it waited {waited:.1f} s for its "
        f"commits, at an idle worker's {100 * idle:.1f}% of a core: ~{1000 * idle * waited / records:.3f} ms/record")
    peer_before = speed_probe(settings, load)
    peer_profile = run / f"py-spy-{app_id}-quix.txt" if profile else None
    peer, prefix, peer_ends = samejob_peer(settings, in_start, records, app_id, run, peer_profile)
    probes = (before, after, peer_before, speed_probe(settings, load))
    say("   speed probes (the core alone, ms/record): around memstream {:.3f} / {:.3f}, around the peer "
        "{:.3f} / {:.3f}".format(*probes))
    zero = {tp: 0 for tp in peer_ends}
    comparison = samejob_compare.compare(settings, (out_start, out_end), (zero, peer_ends), prefix)
    for line in comparison.lines():
        say(f"   {line}")
    if not comparison.equal:
        comparison.write_differences(run / f"{app_id}-differences.jsonl")
        say(f"   the differing records: {run / f'{app_id}-differences.jsonl'}")
    by_thread = ({k: 1000 * v / records for k, v in threads.items()},
                 {k: 1000 * v / peer.records for k, v in peer.threads_cpu_s.items()})
    parts = None
    if profile:
        parts = (profile_parts.us_per_record(profile_parts.main_thread_parts(run / f"py-spy-{app_id}.txt"), by_thread[0]),
                 profile_parts.us_per_record(profile_parts.main_thread_parts(peer_profile), by_thread[1]))
    return SameJob(ours, peer, comparison, 1000 * idle * waited / records, probes, by_thread, parts,
                   load_average())


def samejob_rounds(settings: Settings, load: list[Record], run: Path, rounds: int, profile: bool) -> list[SameJob]:
    """`rounds` same-job runs one after the other (each memstream then the peer, fresh app ids),
    then, with `profile`, one more under py-spy (its figures only in the parts table)."""
    runs = [samejob_run(settings, load, run, round_no=n) for n in range(1, rounds + 1)]
    if profile:
        runs.append(samejob_run(settings, load, run, round_no=rounds + 1, profile=True))
    return runs


def wait_taken(worker: Worker, count: int, timeout: float = 600) -> None:
    """Until the worker has taken `count` records of the same-job inputs into its batches
    (`memstream_in_total`): the next phase's records then come in later batches. Polled every
    TAKEN_POLL_S: a scrape of /metrics is served by the worker's main thread, and the peer is not
    scraped (polled every 50 ms, the scrapes were ~5% of memstream's main thread in the profile)."""
    deadline = time.monotonic() + timeout
    while (taken := inputs_taken(worker.port)) is None or taken < count:
        check_alive([worker])
        if time.monotonic() > deadline:
            raise BenchError(f"the worker took {taken} of {count} records in {timeout:.0f}s; read {worker.log}")
        time.sleep(TAKEN_POLL_S)


def inputs_taken(port: int) -> float | None:
    """The worker's `memstream_in_total` of the same-job inputs (None while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    wanted = {f'memstream_in_total{{topic="{t}"}}' for t in samejob_compare.INPUTS}
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.rsplit(" ", 1)[0] in wanted)


def samejob_peer(settings: Settings, start: kafkatools.Offsets, count: int, app_id: str, run: Path,
                 profile: Path | None = None) -> tuple[Peer, str, kafkatools.Offsets]:
    """bench/quix_samejob.py on the `count` records from `start` (under py-spy into `profile`,
    if given); returns its figures, its output topics' prefix and their end offsets."""
    group, prefix, data = f"{app_id}-quix", f"{app_id}-quix-", run / "data" / f"{app_id}-quix"
    kafkatools.position_group(settings, group, start)
    for topic in samejob_compare.COMPARED:
        create_topic(settings, f"{prefix}{topic}", {})
    data.mkdir(parents=True, exist_ok=True)
    cmd = [str(quix_python()), str(BENCH / "quix_samejob.py"), "--broker", settings.broker, "--registry",
           settings.registry_url, "--group", group, "--output-prefix", prefix, "--count", str(count),
           "--state-dir", str(data)]
    if profile is not None:
        cmd = [py_spy(), "record", "--format", "raw", "--nolineno", "--rate", "100", "--output", str(profile), "--",
               *cmd]
    say(f"   {SAMEJOB_LABEL}: {count:,} records …")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    log_file = run / f"{app_id}-quix.log"
    log_file.write_text(r.stdout + r.stderr)
    line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("{")), None)
    if r.returncode != 0 or line is None:
        raise BenchError(f"the same-job peer failed (exit {r.returncode}); see {log_file}")
    res = orjson.loads(line)
    peer = Peer(SAMEJOB_LABEL, int(res["records"]), float(res["seconds"]), float(res["cpu_s"]), "RocksDB state",
                res["threads_cpu_s"])
    if peer.records != count:
        raise BenchError(f"the same-job peer read {peer.records} records, not {count}; see {log_file}")
    say(f"   {SAMEJOB_LABEL}: {peer.rate:,.0f} records/s, CPU {peer.cpu_ms_per_record:.3f} ms/record")
    return peer, prefix, kafkatools.end_offsets(settings, [f"{prefix}{t}" for t in samejob_compare.COMPARED])


# ------------------------------------------------------------------------------ memory-state rows
StateRow = tuple[str, str, bytes]  # (user, table key, JSON row) of the memory-state table


def bench_user(n: int) -> str:
    return f"bench-user-{n:04d}"


def user_state(settings: Settings, user: str, seen_ids: int, ts_ms: int) -> list[StateRow]:
    """A user's de-duplication window holding `seen_ids` candidate ids, as the worker persists
    it (`MemoryStore.stage`): the sealed chunks (`<user>/~seen/<k>`, SEEN_CHUNK_SIZE ids each)
    and the compact aux row (the open tail, an empty redo log)."""
    um = UserMemory(user, dedup_max_ids=settings.dedup_max_ids)
    for _ in range(seen_ids):
        um.seen.add(f"c:{uuid.uuid4()}", ts_ms)
    sealed, _dropped = um.seen_changes()  # chunks wholly out of the window are not in `sealed`
    chunks = chunk_rows(dict(sorted(sealed.items())), [])
    rows = [(user, node_key(user, rest), orjson.dumps(chunk)) for rest, chunk in chunks.items()]
    return rows + [(user, user, orjson.dumps({**um.aux_record(compact=True), "pending": {}}))]


def state_rows_per_user(settings: Settings, seen_ids: int) -> int:
    """Rows `user_state` writes for one user: the window's retained sealed chunks + the aux row."""
    return len(user_state(settings, "count", seen_ids, 0))


def history(settings: Settings, load: list[Record], seen_ids: int) -> list[StateRow]:
    """A window of `seen_ids` ids for every user of the load (users active for a while)."""
    users = sorted({r.key.decode() for r in load if r.topic in MEMORY_PROCESSOR.sources})
    ts_ms = int(time.time() * 1000) - 2 * HOUR_MS
    return [row for u in users for row in user_state(settings, u, seen_ids, ts_ms)] if seen_ids else []


def recovery_rows(settings: Settings, nodes: int, users: int) -> Iterator[StateRow]:
    """`nodes` live nodes spread over `users` users, and each user's full de-duplication window
    (chunk rows + aux row)."""
    rnd, vocab, ts_ms = random.Random(20240601), vocabulary(random.Random(1), 20_000), int(time.time() * 1000) - HOUR_MS
    for u in range(users):
        user = bench_user(u)
        for n in range(nodes // users):
            node_id = f"node-{n:07d}"
            yield user, node_key(user, node_id), orjson.dumps(make_node(
                node_id=node_id, motebit_id=user, content=memory_text(rnd, vocab), sensitivity="personal",
                memory_type="semantic", confidence=0.7, created_at=ts_ms, valid_from=ts_ms, origin_event_id=node_id))
        yield from user_state(settings, user, settings.dedup_max_ids, ts_ms)


def write_state(settings: Settings, app_id: str, rows: Iterable[StateRow], total: int) -> None:
    """Write rows straight into the app's memory-state changelog, each in its user's partition
    (where the worker's own writes go: the partition of the input that caused them)."""
    topic = f"{app_id}-{STATE_TABLE}-changelog"
    create_topic(settings, topic, {"cleanup.policy": "compact"})
    sender, bar = Sender(settings, **{"linger.ms": 50}), Progress(total, f"rows written to {topic}", PROGRESS_S)
    for user, key, row in rows:
        sender.send(topic, key.encode(), row, partition=(murmur2(user.encode()) & 0x7FFFFFFF) % settings.partitions)
        bar.advance()
    sender.flush()


# ------------------------------------------------------------------------------------- workers
@dataclass
class Worker:
    proc: subprocess.Popen
    port: int
    log: Path


def free_port() -> int:
    return devstack.free_port(20000, 28000)


def worker_env(port: int, store: str, data_dir: Path) -> dict[str, str]:
    return {"MEMSTREAM_WEB_PORT": str(port), "MEMSTREAM_STORE": store, "MEMSTREAM_DATA_DIR": str(data_dir),
            "MEMSTREAM_API_TOKENS": f"{TOKEN}:secret"}


def start_workers(settings: Settings, app_id: str, count: int, store: str, run: Path,
                  state: list[StateRow], extra_env: dict[str, str] | None = None) -> list[Worker]:
    """`count` workers of a fresh group positioned at the inputs' end, with `state` in their
    memory-state table, all ready and settled (`extra_env`: more MEMSTREAM_* settings)."""
    if state:
        write_state(settings, app_id, state, len(state))
    kafkatools.position_group(settings, app_id, kafkatools.end_offsets(settings, INPUTS))
    workers: list[Worker] = []
    try:
        for n in range(count):
            port = free_port()
            env, log = worker_env(port, store, run / "data" / f"{app_id}-w{n}"), run / f"{app_id}-w{n}.log"
            env.update(extra_env or {})
            workers.append(Worker(kafkatools.start_worker(settings, app_id, log, env), port, log))
        wait_settled(workers)
        warm_up(settings, workers, state)
    except BaseException:
        stop(workers)
        raise
    return workers


def prefilled_users(port: int) -> float | None:
    """The worker's `memstream_memory_users_total{event="prefilled"}` (None while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("memstream_memory_users_total{") and 'event="prefilled"' in line)


def warm_up(settings: Settings, workers: list[Worker], state: list[StateRow], timeout: float = 120) -> None:
    """Until the workers' prefill (streams/agents/prefill.py: after every rebalance, the local
    users' rows are read into the memory cache in the background) has read every seeded user and
    stopped, so that it runs before the measurement rather than beside its first batches."""
    users = len({user for user, _key, _row in state})
    if not users:
        return
    started, last, steady = time.monotonic(), -1.0, 0
    while True:
        counts = [prefilled_users(w.port) for w in workers]
        done = sum(c or 0 for c in counts)
        steady = steady + 1 if done == last else 0
        last = done
        if done >= users and steady >= 2:  # every user read (a pass abandoned by a rebalance reads some twice)
            break
        if time.monotonic() - started > timeout:
            raise BenchError(f"the prefill read {done:.0f} of {users} seeded users in {timeout:.0f}s; read the worker logs")
        time.sleep(0.25)
    say(f"   warm-up: prefill read {done:.0f} user states for {users} seeded users in {time.monotonic() - started:.1f}s")


def check_alive(workers: Iterable[Worker]) -> None:
    for w in workers:
        if w.proc.poll() is not None:
            raise BenchError(f"the worker on port {w.port} exited {w.proc.returncode}; read {w.log}")


def wait_settled(workers: list[Worker], timeout: float = 300) -> None:
    """Until every worker's /health has said ready three polls in a row (the group settled)."""
    streak, deadline, last_report = 0, time.monotonic() + timeout, time.monotonic()
    while streak < 3:
        check_alive(workers)
        states = [(kafkatools.worker_health(w.port) or {}).get("status", "down") for w in workers]
        streak = streak + 1 if all(s == "ready" for s in states) else 0
        if time.monotonic() > deadline:
            raise BenchError(f"workers not ready after {timeout:.0f}s: {states}")
        if time.monotonic() - last_report >= PROGRESS_S:
            last_report = time.monotonic()
            say(f"  … waiting for {len(workers)} worker(s) to settle: {', '.join(states)}")
        time.sleep(0.5)


def stop(workers: list[Worker]) -> None:
    for w in workers:
        kafkatools.stop_worker(w.proc)


def wait_processed(settings: Settings, app_id: str, ends: kafkatools.Offsets, workers: list[Worker]) -> None:
    """Until the group has committed past `ends`; prints the lag now and then."""
    started = last_report = time.monotonic()
    while (lag := kafkatools.group_lag(settings, app_id, ends)) > 0:
        check_alive(workers)
        if time.monotonic() - last_report >= PROGRESS_S:
            last_report = time.monotonic()
            say(f"  … lag {lag:,} records ({time.monotonic() - started:.0f}s)")
        time.sleep(0.5)


# ------------------------------------------------------------------------------------ throughput
@dataclass
class Throughput(PerRecord):
    label: str
    workers: int
    store: str
    records: int
    seconds: float
    cpu_s: float  # CPU time of all workers from the first produce to the end
    rss_mib: list[float]


def pipeline_run(settings: Settings, load: list[Record], state: list[StateRow], label: str, count: int,
                 store: str, run: Path, profile: Path | None = None) -> Throughput:
    app_id = f"{run.name}-{label}"
    say(f"\n== pipeline: {count} worker(s), {store}, {len(load):,} records (app id {app_id})")
    workers, spy = start_workers(settings, app_id, count, store, run, state), None
    try:
        if profile:
            spy = start_profiler(workers[0].proc.pid, profile)
        out_start = kafkatools.end_offsets(settings, OUTPUTS)
        cpu0, t0 = sum(kafkatools.cpu_seconds(w.proc.pid) for w in workers), time.time()
        produce(settings, load)
        wait_processed(settings, app_id, kafkatools.end_offsets(settings, INPUTS), workers)
        newest = kafkatools.last_timestamp_ms(settings, out_start)
        if newest is None:
            raise BenchError(f"{app_id} wrote no output")
        cpu = sum(kafkatools.cpu_seconds(w.proc.pid) for w in workers) - cpu0
        rss = [kafkatools.peak_rss_mib(w.proc.pid) for w in workers]
    finally:
        if spy:
            stop_profiler(spy)
        stop(workers)
    result = Throughput(label, count, store, len(load), newest / 1000 - t0, cpu, rss)
    say(f"   {result.rate:,.0f} records/s ({result.seconds:.1f}s), worker CPU {result.cpu_ms_per_record:.3f} ms/record, "
        f"peak RSS {', '.join(f'{r:.0f}' for r in rss)} MiB")
    return result


@dataclass
class Scaling:
    """One round of the two-worker comparison: one worker, then two, on the same input."""

    load: str  #: the load average when the round began
    one: Throughput
    two: Throughput

    @property
    def ratio(self) -> float:
        """Two workers' CPU per record ÷ one worker's (the kept target: ≤ SCALING_TARGET)."""
        return self.two.cpu_ms_per_record / self.one.cpu_ms_per_record


def scaling_rounds(settings: Settings, load: list[Record], state: list[StateRow], run: Path, rounds: int,
                   runs: list[Throughput]) -> list[Scaling]:
    """`rounds` rounds of one worker then two (RocksDB), one after the other: on two cores shared
    with the broker a single pair's ratio moved by ±30% from one pair to the next (bench/RESULTS.md),
    so the figure is the median of the rounds. The first round reuses the one-worker RocksDB run of
    `runs`, if there is one."""
    first = next((r for r in runs if r.workers == 1 and r.store == "rocksdb://"), None)
    out = []
    for n in range(1, rounds + 1):
        say(f"\n== two workers against one, round {n} of {rounds}")
        loadavg = load_average()
        one = first if n == 1 and first is not None else \
            pipeline_run(settings, load, state, f"1w-rocksdb-r{n}", 1, "rocksdb://", run)
        two = pipeline_run(settings, load, state, "2w-rocksdb" if n == 1 else f"2w-rocksdb-r{n}", 2, "rocksdb://", run)
        out.append(Scaling(loadavg, one, two))
        say(f"   two workers ÷ one: {out[-1].ratio:.2f}×")
    return out


def report_scaling(rounds: list[Scaling]) -> None:
    """The two-worker rounds and the median of their ratios."""
    say("\n| two workers against one (RocksDB, same input) | load average | one worker, CPU / record "
        "| two workers, CPU / record | two ÷ one | rates, one / two |\n|---|---|---|---|---|---|")
    for n, r in enumerate(rounds, 1):
        say(f"| round {n} | {r.load} | {r.one.cpu_ms_per_record:.3f} ms | {r.two.cpu_ms_per_record:.3f} ms | "
            f"{r.ratio:.2f}× | {r.one.rate:,.0f} / {r.two.rate:,.0f} records/s |")
    ratio = median(r.ratio for r in rounds)
    say(f"| **median of {len(rounds)}** | | {median(r.one.cpu_ms_per_record for r in rounds):.3f} ms | "
        f"{median(r.two.cpu_ms_per_record for r in rounds):.3f} ms | **{ratio:.2f}×** "
        f"({'≤' if ratio <= SCALING_TARGET else '>'} the target {SCALING_TARGET}×) | |")


# --------------------------------------------------------------------------------------- latency
class LedgerTap(threading.Thread):
    """Reads memory.ledger.v1 from given offsets in the background: (receive time, CreateTime ms, value)."""

    def __init__(self, settings: Settings, start: kafkatools.Offsets) -> None:
        super().__init__(daemon=True)
        self.consumer = kafkatools.consumer(settings, "memstream-bench-tap")
        self.consumer.assign([TopicPartition(t, p, off) for (t, p), off in start.items()])
        self.positions = dict(start)
        self.seen: list[tuple[float, int, bytes]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            batch = self.consumer.consume(500, 0.05)
            now = time.time()
            for msg in batch:
                if not msg.error():
                    self.seen.append((now, msg.timestamp()[1], msg.value()))
                    self.positions[(msg.topic(), msg.partition())] = msg.offset() + 1
        self.consumer.close()

    def drain(self, ends: kafkatools.Offsets, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while any(self.positions[tp] < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise BenchError(f"the ledger tap did not reach the end of {catalog.MEMORY_LEDGER} in {timeout:.0f}s")
            time.sleep(0.1)
        self.stopping.set()
        self.join()


@dataclass
class Latency:
    rate: float
    store: str
    records: int
    matched: int
    visible_ms: list[float]
    written_ms: list[float]
    early_ms: list[float]  #: visible latency of the inputs sent in the first quarter of the run
    late_ms: list[float]  #: ... in the last quarter (much higher than early: the worker falls behind)
    steady_ms: list[float]  #: ... after the first quarter (the run without its start)
    #: visible latencies by the second of the run (from the first send) in which their inputs were sent
    by_second: dict[int, list[float]]
    busy: float = 0.0  #: worker CPU seconds / wall seconds from the first send until all processed


def percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def latency_run(settings: Settings, load: list[Record], state: list[StateRow], base: Throughput, rate: float,
                seconds: float, run: Path, n: int = 0, profile: bool = False, linger_ms: float = 5) -> Latency:
    """The load's first records at `rate`/s (default: half `base`'s rate) through one worker of `base`'s store
    (a new application id per run `n`: `--latency-rate 0,0,0,0,0` is five runs from a cold start)."""
    rate = rate or base.rate / 2
    records = load[: max(2, int(rate * seconds))]
    app_id = f"{run.name}-latency-{rate:.0f}" + (f"-{n + 1}" if n else "")
    say(f"\n== latency: {len(records):,} records at {rate:,.0f}/s through one worker, {base.store} (app id {app_id})")
    workers = start_workers(settings, app_id, 1, base.store, run, state)
    try:
        ledger = [catalog.MEMORY_LEDGER]
        tap = LedgerTap(settings, kafkatools.end_offsets(settings, ledger))
        tap.start()
        spy = start_profiler(workers[0].proc.pid, run / f"py-spy-{app_id}.txt") if profile else None
        cpu0, t0 = kafkatools.cpu_seconds(workers[0].proc.pid), time.monotonic()
        try:
            sent = paced(settings, records, rate, linger_ms)
            wait_processed(settings, app_id, kafkatools.end_offsets(settings, INPUTS), workers)
        finally:
            if spy:
                stop_profiler(spy)
        busy = (kafkatools.cpu_seconds(workers[0].proc.pid) - cpu0) / (time.monotonic() - t0)
        tap.drain(kafkatools.end_offsets(settings, ledger))
    finally:
        stop(workers)
    if spy:
        report_profile(run / f"py-spy-{app_id}.txt")
    result = match_latencies(settings, records, sent, tap.seen, rate, base.store)
    result.busy = busy
    write_latency_series(run / f"{app_id.removeprefix(run.name + '-')}.tsv", result)
    say(f"   visible p50 {percentile(result.visible_ms, .5):,.0f} ms, p99 {percentile(result.visible_ms, .99):,.0f} ms "
        f"({result.matched:,} inputs matched); p50 first quarter {percentile(result.early_ms, .5):,.0f} ms, "
        f"last quarter {percentile(result.late_ms, .5):,.0f} ms; p99 after the first quarter "
        f"{percentile(result.steady_ms, .99):,.0f} ms; worker CPU busy {100 * busy:.0f}%")
    return result


def match_latencies(settings: Settings, records: list[Record], sent: list[float],
                    seen: list[tuple[float, int, bytes]], rate: float, store: str) -> Latency:
    """Each input's first ledger event: receive time and CreateTime minus the input's send time."""
    index: dict[str, int] = {}
    for n, r in enumerate(records):
        for eid in r.ledger_ids:
            index.setdefault(eid, n)
    decode = CodecFactory.from_url(settings.registry_url).codec("memory_event").decode
    first: dict[int, tuple[float, int]] = {}
    for received, created_ms, value in seen:
        n = index.get(decode(value)["event_id"])
        if n is not None and (n not in first or received < first[n][0]):
            first[n] = (received, created_ms)
    if len(first) < 2:
        raise BenchError(f"only {len(first)} ledger event(s) matched an input; cannot compute latency")
    visible = sorted((received - sent[n]) * 1000 for n, (received, _) in first.items())
    written = sorted(created - int(sent[n] * 1000) for n, (_, created) in first.items())
    quarter = len(records) // 4
    early = sorted((received - sent[n]) * 1000 for n, (received, _) in first.items() if n < quarter) or visible
    late = sorted((received - sent[n]) * 1000 for n, (received, _) in first.items() if n >= len(records) - quarter) or visible
    steady = sorted((received - sent[n]) * 1000 for n, (received, _) in first.items() if n >= quarter) or visible
    by_second: dict[int, list[float]] = {}
    for n, (received, _) in first.items():
        by_second.setdefault(int(sent[n] - sent[0]), []).append((received - sent[n]) * 1000)
    return Latency(rate, store, len(records), len(first), visible, written, early, late, steady, by_second)


def write_latency_series(path: Path, lat: Latency) -> None:
    """The run's visible latency second by second of sending (inputs matched, p50, p99, max):
    where in the run a tail comes from."""
    lines = ["second\tmatched\tp50_ms\tp99_ms\tmax_ms"]
    for second in sorted(lat.by_second):
        ms = sorted(lat.by_second[second])
        lines.append(f"{second}\t{len(ms)}\t{percentile(ms, .5):.0f}\t{percentile(ms, .99):.0f}\t{ms[-1]:.0f}")
    path.write_text("\n".join(lines) + "\n")
    say(f"   latency second by second: {path}")


# -------------------------------------------------------------------------------------- recovery
@dataclass
class Recovery:
    nodes: int
    users: int
    store: str
    ready_s: float
    query_s: float
    ready_rss_mib: float
    rss_mib: float
    first_query_s: float = 0.0  #: the slowest first query of one user (each user is read on its first touch)
    restore: str = "ahead"  #: MEMSTREAM_RESTORE_AHEAD of the run: "ahead" (true) or "faust" (false)


def recovery_run(settings: Settings, app_id: str, nodes: int, users: int, store: str, run: Path,
                 restore: str = "ahead") -> Recovery:
    """Start a worker on an empty data dir; time until /health is ready and a query answers, then
    the first query of two more users (each user's state is read on its first query). `restore`:
    "ahead" (the bulk restore before the worker joins, streams/runtime/restore.py) or "faust"
    (MEMSTREAM_RESTORE_AHEAD=false: Faust's record-by-record restore only)."""
    say(f"\n== recovery: {nodes:,} nodes / {users} users, {store}, restore {restore} (app id {app_id})")
    kafkatools.position_group(settings, app_id, kafkatools.end_offsets(settings, INPUTS))
    port, tag = free_port(), f"{store.split(':')[0]}-{restore}"
    env, log = worker_env(port, store, run / "data" / f"{app_id}-{tag}"), run / f"{app_id}-{tag}.log"
    env["MEMSTREAM_RESTORE_AHEAD"] = str(restore == "ahead").lower()
    started = time.monotonic()
    worker = Worker(kafkatools.spawn_worker(settings, app_id, log, env), port, log)
    firsts = []
    try:
        wait_ready(worker)
        ready, ready_rss = time.monotonic() - started, kafkatools.peak_rss_mib(worker.proc.pid)
        say(f"   /health ready after {ready:.1f}s (peak RSS {ready_rss:,.0f} MiB); querying users (each read on first touch)")
        for n, user in enumerate(dict.fromkeys([bench_user(0), bench_user(users // 2), bench_user(users - 1)])):
            asked = time.monotonic()
            answered = query_nodes(port, user)
            firsts.append(time.monotonic() - asked)
            if n == 0:
                queried = time.monotonic() - started
            if answered != nodes // users:
                raise BenchError(f"the recovered worker answered {answered} nodes for {user}, expected {nodes // users}")
        rss = kafkatools.peak_rss_mib(worker.proc.pid)
    finally:
        stop([worker])
    say(f"   first query answered after {queried:.1f}s; first query of a user took "
        f"{' / '.join(f'{f * 1000:,.0f} ms' for f in firsts)}; peak RSS {rss:,.0f} MiB")
    return Recovery(nodes, users, store, ready, queried, ready_rss, rss, max(firsts), restore)


def wait_ready(worker: Worker, timeout: float = 3600) -> None:
    deadline, last_report = time.monotonic() + timeout, time.monotonic()
    while True:
        check_alive([worker])
        health = kafkatools.worker_health(worker.port)
        if health and health["status"] == "ready":
            return
        if time.monotonic() > deadline:
            raise BenchError(f"the worker was not ready after {timeout:.0f}s")
        if time.monotonic() - last_report >= PROGRESS_S:
            last_report = time.monotonic()
            say(f"  … {health['reason'] if health else 'not answering yet'}")
        time.sleep(0.2)


def query_nodes(port: int, user: str, timeout: float = 3600) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/memory/{user}/nodes",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return len(orjson.loads(resp.read())["nodes"])


# ------------------------------------------------------------------------------------- profiling
def py_spy() -> str:
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if spy is None:
        raise BenchError("--profile needs py-spy: .venv/bin/pip install py-spy (a measuring tool, not a dependency)")
    return spy


def start_profiler(pid: int, out: Path) -> subprocess.Popen:
    spy = py_spy()
    say(f"   profiling pid {pid} with py-spy into {out}")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--nolineno", "--rate", "100",
                             "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(spy: subprocess.Popen) -> None:
    spy.send_signal(signal.SIGINT)
    spy.wait(60)


ENTRY_FRAMES = ("(streams/__main__.py)", "(streams/tools/cli.py)", "(streams/runtime/worker.py)")  # in every sample


def hotspots(collapsed: Path, top: int, scope: str) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """From a py-spy raw profile: (samples, the `top` functions by own time, the `top` functions
    whose file path contains `scope` by inclusive time, entry points left out), shares in % of
    all samples."""
    inclusive, own, total = Counter[str](), Counter[str](), 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    ours = [(f, n) for f, n in inclusive.most_common() if scope in f and not f.endswith(ENTRY_FRAMES)][:top]
    return total, [(f, 100 * n / total) for f, n in own.most_common(top)], [(f, 100 * n / total) for f, n in ours]


# ---------------------------------------------------------------------------------------- report
def say(msg: str) -> None:
    print(msg, flush=True)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return f"{os.cpu_count()} vCPU {cpu}, {mem_kib / 2**20:.0f} GiB, {platform.system()} {platform.release()}"


def versions(settings: Settings) -> str:
    libs = ", ".join(f"{name} {metadata.version(name)}" for name in
                     ("faust-streaming", "aiokafka", "confluent-kafka", "fastavro", "rocksdict", "orjson"))
    return f"Python {platform.python_version()}, Kafka {settings.kafka_version}, Apicurio {settings.apicurio_version}, {libs}"


def report(settings: Settings, args: argparse.Namespace, records: int, generator: float, raw: float,
           runs: list[Throughput], latencies: list[Latency], recoveries: list[Recovery],
           peers: dict[str, Peer] | None = None, core: Peer | None = None, samejob_runs: list[SameJob] | None = None,
           scaling: list[Scaling] | None = None) -> None:
    load = load_average()
    say(f"\n## Summary ({time.strftime('%Y-%m-%d %H:%M %Z')}, load average {load})\n\n{machine()}\n{versions(settings)}\n"
        f"partitions {settings.partitions}, standby replicas {settings.standby_replicas}, batch max "
        f"{settings.batch_max} / wait {settings.batch_wait_ms} ms, registry {'yes' if settings.registry_url else 'no'}, "
        f"at-least-once; {args.users} users, each starting with {args.seen_ids} ids in its de-duplication window\n")
    peers = peers or {}
    quix = peers.get(QUIX_CORE)
    of_quix = (lambda rate: f"{rate / quix.rate:.2f}×") if quix else (lambda rate: "–")
    cpu_of_quix = (lambda ms: f"{ms / quix.cpu_ms_per_record:.2f}×") if quix else (lambda ms: "–")
    if records:  # not with --recovery-only
        say("| run | workers | store | input records | time | records/s | of raw | of Quix peer | CPU / record | CPU of Quix peer's | peak RSS / worker |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
        say(f"| load generator (producer only) | – | – | {records:,} | – | {generator:,.0f} | – | – | – | – | – |")
        say(f"| raw consumer→producer copy | – | – | {records:,} | – | {raw:,.0f} | 100% | {of_quix(raw)} | – | – | – |")
    for peer in [*peers.values(), *([core] if core and records else [])]:
        say(f"| {peer.label} | 1 | {peer.store} | {peer.records:,} | {peer.seconds:.1f} s | {peer.rate:,.0f} | "
            f"{100 * peer.rate / raw:.1f}% | {of_quix(peer.rate)} | {peer.cpu_ms_per_record:.3f} ms | "
            f"{cpu_of_quix(peer.cpu_ms_per_record)} | – |")
    for r in runs:
        rss = " / ".join(f"{m:,.0f} MiB" for m in r.rss_mib)
        say(f"| pipeline | {r.workers} | {r.store} | {r.records:,} | {r.seconds:.1f} s | **{r.rate:,.0f}** | "
            f"{100 * r.rate / raw:.1f}% | {of_quix(r.rate)} | {r.cpu_ms_per_record:.3f} ms | "
            f"{cpu_of_quix(r.cpu_ms_per_record)} | {rss} |")
    measured = [sj for sj in samejob_runs or [] if sj.parts is None]
    samejob = measured[0] if measured else None
    if samejob is not None:
        peer = samejob.peer
        say(f"| {peer.label} | 1 | {peer.store} | {peer.records:,} | {peer.seconds:.1f} s | {peer.rate:,.0f} | "
            f"{100 * peer.rate / raw:.1f}% | {of_quix(peer.rate)} | {peer.cpu_ms_per_record:.3f} ms | "
            f"{cpu_of_quix(peer.cpu_ms_per_record)} | – |")
    if samejob_runs:
        report_samejob(samejob_runs)
    if scaling:
        report_scaling(scaling)
    if core and records and (peers or runs or samejob):
        same = [(f"{samejob.peer.label} (its own input: the memory agent's four topics)", samejob.peer.cpu_ms_per_record),
                ("memstream, same job (the same input)", samejob.memstream.cpu_ms_per_record)] if samejob else []
        report_added(core, [(p.label, p.cpu_ms_per_record) for n, p in peers.items() if n.endswith("-core")]
                     + [(f"memstream, {r.workers} worker(s), {r.store}", r.cpu_ms_per_record) for r in runs] + same,
                     quix)
    if latencies:
        say("\n| latency, one worker | inputs | matched | visible p50 | p99 | max | written p50 | p99 "
            "| p50 first ¼ | p50 last ¼ | p99 after the first ¼ | worker CPU busy |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    for lat in latencies:
        v, w = lat.visible_ms, lat.written_ms
        say(f"| {lat.rate:,.0f}/s, {lat.store} | {lat.records:,} | {lat.matched:,} | "
            f"{percentile(v, .5):,.0f} ms | {percentile(v, .99):,.0f} ms | {v[-1]:,.0f} ms | "
            f"{percentile(w, .5):,.0f} ms | {percentile(w, .99):,.0f} ms | "
            f"{percentile(lat.early_ms, .5):,.0f} ms | {percentile(lat.late_ms, .5):,.0f} ms | "
            f"{percentile(lat.steady_ms, .99):,.0f} ms | {100 * lat.busy:.0f}% |")
    if recoveries:
        say("\n| recovery: nodes | users | store | restore | /health ready | first query answered | slowest first query "
            "of a user | peak RSS at ready | peak RSS |\n|---|---|---|---|---|---|---|---|---|")
        for c in recoveries:
            say(f"| {c.nodes:,} | {c.users} | {c.store} | {c.restore} | {c.ready_s:.1f} s | {c.query_s:.1f} s | "
                f"{c.first_query_s * 1000:,.0f} ms | {c.ready_rss_mib:,.0f} MiB | {c.rss_mib:,.0f} MiB |")


def report_samejob(runs: list[SameJob]) -> None:
    """memstream against the same-job peer, round by round: CPU per record of each on the same
    input, the ratio (only when both wrote the same records), the ratio calibrated by the speed
    probes, then the medians of the rounds; the comparison of the first round, topic by topic;
    and the parts side by side of a profiled round."""
    measured = [sj for sj in runs if sj.parts is None]
    say("\n| same job, same input (phased: bench_e2e.samejob_phases) | load average | the same-job peer, CPU / record "
        "| memstream, one worker, CPU / record | ratio | speed probes around memstream / the peer | calibrated ratio |\n"
        "|---|---|---|---|---|---|---|")
    for n, sj in enumerate(runs, 1):
        ratio = f"{sj.ratio:.2f}×" if sj.ratio is not None else "– (the outputs differ)"
        probes = "{:.3f}/{:.3f} · {:.3f}/{:.3f} ms".format(*sj.probes) if sj.probes else "–"
        calibrated = f"{sj.calibrated_ratio:.2f}×" if sj.calibrated_ratio is not None else "–"
        label = f"round {n}" + (" (under py-spy: not in the medians)" if sj.parts is not None else "")
        say(f"| {label} | {sj.load} | {sj.peer.cpu_ms_per_record:.3f} ms | {sj.memstream.cpu_ms_per_record:.3f} ms | "
            f"{ratio} | {probes} | {calibrated} |")
    if measured and all(sj.ratio is not None for sj in measured):
        calibrated = [sj.calibrated_ratio for sj in measured if sj.calibrated_ratio is not None]
        say(f"| **median of {len(measured)}** | | {median(sj.peer.cpu_ms_per_record for sj in measured):.3f} ms | "
            f"{median(sj.memstream.cpu_ms_per_record for sj in measured):.3f} ms | "
            f"**{median(sj.ratio for sj in measured):.2f}×** | | "  # type: ignore[misc]
            f"{f'**{median(calibrated):.2f}×**' if calibrated else '–'} |")
    elif measured:
        say("| median | | | | – (a round's outputs differ: no ratio) | | |")
    say("\n(memstream's figures include ~{} ms/record of idling while the bench waited for its commit after each "
        "phase.)\n".format(" / ".join(f"{sj.idle_ms_per_record:.3f}" for sj in runs)))
    for n, sj in enumerate(runs, 1):
        if n == 1 or not sj.comparison.equal:  # every round is compared; the first printed, and any that differs
            say(f"Round {n}, the outputs compared:")
            for line in sj.comparison.lines():
                say(f"- {line}")
    kinds = ("main", *profile_parts.THREADS)
    say("| CPU per record by thread (µs; bench/profile_parts.py THREADS) | " + " | ".join(kinds) + " |\n"
        + "|---" * (len(kinds) + 1) + "|")
    for n, sj in enumerate(runs, 1):
        for name, by_kind in zip(("memstream", "the peer"), sj.threads or (), strict=False):
            say(f"| round {n}, {name} | " + " | ".join(f"{1000 * by_kind.get(k, 0.0):,.0f}" for k in kinds) + " |")
    for sj in runs:
        if sj.parts is not None:
            say("\nWhere each system's CPU per record goes (the profiled round; bench/profile_parts.py: the main thread "
                "by py-spy, the other threads from /proc):\n")
            for line in profile_parts.side_by_side(*sj.parts):
                say(line)


def report_added(core: Peer, systems: list[tuple[str, float]], quix: Peer | None) -> None:
    """What each system running the core adds around it: its CPU per record minus the core
    alone's, measured in the same run (and as a multiple of what Quix Streams adds)."""
    quix_added = quix.cpu_ms_per_record - core.cpu_ms_per_record if quix else None
    say("\n| added around the core (CPU / record minus the core alone's) | ms | ÷ Quix Streams' |\n|---|---|---|")
    for label, cpu_ms in systems:
        added = cpu_ms - core.cpu_ms_per_record
        times = f"{added / quix_added:.1f}×" if quix_added and quix_added > 0 else "–"
        say(f"| {label} | {added:.3f} ms | {times} |")


def report_profile(path: Path, top: int = 20) -> None:
    total, own, ours = hotspots(path, top, "streams/")
    say(f"\n## Profile of one worker under load ({total:,} py-spy samples of busy threads, {path})\n\n"
        "| own time (leaf function) | share |\n|---|---|")
    for frame, share in own:
        say(f"| `{frame}` | {share:.1f}% |")
    say("\n| memstream function (inclusive) | share |\n|---|---|")
    for frame, share in ours:
        say(f"| `{frame}` | {share:.1f}% |")


# ------------------------------------------------------------------------------------------ main
def create_topic(settings: Settings, name: str, config: dict[str, str]) -> None:
    admin = topics.admin_client(settings)
    admin.create_topics([NewTopic(name, settings.partitions, settings.replication, config=config)])[name].result()


def delete_run_topics(settings: Settings, prefix: str) -> None:
    """Drop every topic and consumer group the run created (changelogs, scratch topic, groups)."""
    admin = topics.admin_client(settings)
    names = [t for t in admin.list_topics(timeout=30).topics  # Quix Streams' changelogs: changelog__<group>--...
             if t.startswith(prefix) or t.startswith(f"changelog__{prefix}")]
    for fut in admin.delete_topics(names, operation_timeout=60).values() if names else ():
        fut.result()
    groups = [g.group_id for g in admin.list_consumer_groups().result(60).valid if g.group_id.startswith(prefix)]
    for group, fut in admin.delete_consumer_groups(groups).items() if groups else ():
        try:
            fut.result()
        except KafkaException as exc:  # e.g. a worker that failed still a member: never hide why the run failed
            say(f"   could not delete consumer group {group} ({exc}); delete it later with kafka-consumer-groups")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=400, help="users of the generated load (~50 records each)")
    ap.add_argument("--seen-ids", type=int, default=None,
                    help="ids already in each load user's de-duplication window (default: a full window; 0 = new users)")
    ap.add_argument("--latency-seconds", type=float, default=30, help="how long the paced latency run sends (0 = skip)")
    ap.add_argument("--latency-rate", default="0",
                    help="records/s of the latency run, comma-separated for several runs (0 = half the one-worker rate)")
    ap.add_argument("--recovery-nodes", default="100000,1000000", help="memory nodes to recover, comma-separated ('' = skip)")
    ap.add_argument("--recovery-users", type=int, default=100)
    ap.add_argument("--restore", default="faust,ahead",
                    help="restore modes of each recovery run, comma-separated: faust (MEMSTREAM_RESTORE_AHEAD=false), ahead")
    ap.add_argument("--recovery-only", action="store_true", help="only the recovery runs (no load, peers, throughput or latency runs)")
    ap.add_argument("--stores", default="rocksdb://,memory://", help="stores of the one-worker and recovery runs")
    ap.add_argument("--no-scaling", action="store_true", help="skip the two-worker runs")
    ap.add_argument("--scaling-rounds", type=int, default=3,
                    help="rounds of one worker then two on the same input, alternating (the ratio's median is the figure)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"framework peers to run, comma-separated ('' = none): {', '.join(PEERS)}")
    ap.add_argument("--no-quix", action="store_true", help="skip the Quix Streams peers (their virtualenv is made on first use)")
    ap.add_argument("--no-samejob", action="store_true",
                    help="skip the same-job run (memstream and bench/quix_samejob.py on the same input, outputs compared)")
    ap.add_argument("--samejob-rounds", type=int, default=3,
                    help="same-job runs one after the other (memstream, then the peer; the summary gives each and the medians)")
    ap.add_argument("--profile", action="store_true",
                    help="one more one-worker run under py-spy (bench/out/<run id>/py-spy-profile.txt), and one more "
                         "same-job round with both systems under py-spy (their parts side by side)")
    ap.add_argument("--latency-linger-ms", type=float, default=5,
                    help="the latency run's producer waits up to this long to fill a request (librdkafka's default "
                         "5; 0 sends a request per record, which costs the broker on this machine ~0.15 core at 925/s)")
    ap.add_argument("--keep-topics", action="store_true",
                    help="leave the run's topics (changelogs, scratch topic) and consumer groups on the broker, to look at")
    ap.add_argument("--profile-latency", action="store_true",
                    help="the first latency run's worker under py-spy (bench/out/<run id>/py-spy-<app id>.txt)")
    return ap.parse_args(argv)


def run_all(settings: Settings, args: argparse.Namespace, run: Path) -> None:
    stores = [s for s in args.stores.split(",") if s]
    if args.recovery_only:
        report(settings, args, 0, 0.0, 0.0, [], [], recovery_runs(settings, args, stores, run))
        return
    load = build_load(settings, args.users)
    say(f"== load: {len(load):,} records for {args.users} users: {dict(Counter(r.topic for r in load))}")
    state = history(settings, load, args.seen_ids)
    start = kafkatools.end_offsets(settings, INPUTS)
    generator = produce(settings, load)
    say(f"   load generator: {generator:,.0f} records/s")
    scratch = f"{run.name}-raw-copy"
    create_topic(settings, scratch, {})
    end = kafkatools.end_offsets(settings, INPUTS)
    raw = raw_copy(settings, start, end, scratch)
    say(f"   raw consumer→producer copy: {raw:,.0f} records/s")
    names = [n for n in args.peers.split(",") if n and not (args.no_quix and n.startswith("quix-"))]
    if unknown := [n for n in names if n not in PEERS]:
        raise BenchError(f"unknown peer(s) {', '.join(unknown)}: --peers takes {', '.join(PEERS)}")
    peers = {n: run_peer(settings, n, start, end, run) for n in PEERS if n in names}
    core = core_alone(settings, load)
    samejob = [] if args.no_quix or args.no_samejob else samejob_rounds(settings, load, run, args.samejob_rounds,
                                                                         args.profile)
    runs = [pipeline_run(settings, load, state, f"1w-{s.split(':')[0]}", 1, s, run) for s in stores]
    scaling = [] if args.no_scaling else scaling_rounds(settings, load, state, run, args.scaling_rounds, runs)
    runs += [pair.two for pair in scaling[:1]]
    if args.profile:
        profile = run / "py-spy-profile.txt"
        pipeline_run(settings, load, state, "profile", 1, "rocksdb://", run, profile)
        report_profile(profile)
    latencies = []
    if args.latency_seconds > 0 and runs:
        latencies = [latency_run(settings, load, state, runs[0], float(rate), args.latency_seconds, run, n,
                                 profile=args.profile_latency and n == 0, linger_ms=args.latency_linger_ms)
                     for n, rate in enumerate(r for r in args.latency_rate.split(",") if r)]
    report(settings, args, len(load), generator, raw, runs, latencies, recovery_runs(settings, args, stores, run), peers,
           core, samejob, scaling)


def recovery_runs(settings: Settings, args: argparse.Namespace, stores: list[str], run: Path) -> list[Recovery]:
    recoveries = []
    for nodes in (int(n) for n in args.recovery_nodes.split(",") if n):
        app_id = f"{run.name}-recovery-{nodes}"
        say(f"\n== synthesizing {nodes:,} nodes for {args.recovery_users} users")
        write_state(settings, app_id, recovery_rows(settings, nodes, args.recovery_users),
                    nodes + args.recovery_users * state_rows_per_user(settings, settings.dedup_max_ids))
        recoveries += [recovery_run(settings, app_id, nodes, args.recovery_users, s, run, r)
                       for s in stores for r in args.restore.split(",")]
    return recoveries


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.from_env()
    args.seen_ids = settings.dedup_max_ids if args.seen_ids is None else args.seen_ids
    run_id = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    run = OUT_DIR / run_id
    try:
        devstack.up(settings)
        if not topics.apply(settings).ok:
            raise BenchError("the catalog topics drifted; see `memstream topics apply`")
        try:
            run_all(settings, args, run)
        finally:
            shutil.rmtree(run / "data", ignore_errors=True)
            if not args.keep_topics:
                delete_run_topics(settings, run_id)
    except (BenchError, devstack.StackError, topics.TopicError, RuntimeError, KafkaException, OSError) as exc:
        sys.exit(f"bench_e2e: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
