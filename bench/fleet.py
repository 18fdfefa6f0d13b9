"""A fleet of real `memstream worker` processes, a paced candidate stream, and the comparison of
a fleet's outputs with a single-worker reference run: shared by the fault suite
(tests/system/test_faults_kafka.py) and the long runs in scripts/ (chaos_fleet.py, soak.py).

- `candidate_stream` / `stream_of`: a deterministic stream of candidates only (new facts, exact
  repeats, one-word edits, sensitive ones). Only candidates: Kafka orders a partition, not several
  topics, so a mix of candidates and events could interleave differently in two runs (and
  legitimately decide differently).
- `Fleet`: workers of one app id; each name keeps its port and data dir across restarts.
- `read_outputs` / `compare` / `finish_and_compare`: the fleet's final `memory.nodes.v1` state,
  ledger and relay against a single-worker reference on the same input range (docs/fault-tolerance.md,
  "What the fault suite checks").
- `PacedFeeder`, `LedgerTap`, `Sampler`: paced input with each record's send time, each input's
  first ledger event (latency), and the group's lag and committed progress over time.
- per-process figures: RSS, open file descriptors, the size of a data dir.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from streams.contracts import catalog
from streams.contracts.wire import CodecFactory, decode_key, encode_key
from streams.core import event_id_for
from streams.settings import Settings
from streams.tools import devstack, kafkatools

ROOT = Path(__file__).resolve().parent.parent
INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]
OUTPUTS = [catalog.MEMORY_NODES, catalog.MEMORY_LEDGER, catalog.MEMORY_RELAY, catalog.DLQ]
READY_LINE = b"Worker]: Ready"
Offsets = dict[tuple[str, int], int]


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# ------------------------------------------------------------------------------ the input ----
def candidate(user: str, cid: str, ts: int, content: str, sensitivity: str | None = "none", **fields) -> dict:
    """A CandidateMemory record (user-stated, semantic) with every field; `fields` override."""
    return {"candidate_id": cid, "motebit_id": user, "content": content, "sensitivity": sensitivity,
            "source": "user_stated", "memory_type": "semantic", "confidence": None, "valid_from": None,
            "timestamp": ts, "embedding": None, "frontmatter_type": None, "extra": None, "supersedes": None,
            "kind": None, "session_id": None, **fields}


@dataclass(frozen=True)
class Fact:
    """One candidate of the stream before its time is set: user, candidate id, text, sensitivity."""

    user: str
    cid: str
    text: str
    sensitivity: str

    def record(self, ts: int) -> dict:
        return candidate(self.user, self.cid, ts, self.text, self.sensitivity)

    def ledger_ids(self) -> tuple[str, ...]:
        """The ids of the ledger events a (non-duplicate) candidate causes first: exactly one of them."""
        return tuple(event_id_for(self.user, self.cid, kind) for kind in ("memory_formed", "memory_consolidated"))


def candidate_stream(tag: str, users: int, seed: int = 7) -> Iterator[Fact]:
    """An endless deterministic candidate stream: new facts, exact repeats (merge, reinforcement,
    promotion), one-word edits (merge or supersede) and sensitive ones (relay redaction)."""
    rng = random.Random(seed)
    names = [f"mb-fault-{tag}-{i}" for i in range(users)]
    facts: dict[str, list[str]] = {u: [] for u in names}
    words = ["tea", "coffee", "hiking", "chess", "Lisbon", "Oslo", "teal", "red", "jazz", "piano", "sushi", "tennis"]
    for i in itertools.count():
        user = rng.choice(names)
        known = facts[user]
        roll = rng.random()
        if known and roll < 0.3:
            text = rng.choice(known)
        elif known and roll < 0.5:
            head, _, _last = rng.choice(known).rpartition(" ")
            text = f"{head} {rng.choice(words)}."
        else:
            text = f"The user likes {rng.choice(words)} and {rng.choice(words)} number {i}."
            known.append(text)
        yield Fact(user, f"{tag}-c{i}", text, rng.choice(["none", "none", "personal", "medical"]))


def stream_of(tag: str, users: int, n: int, seed: int = 7, base_ms: int = 1_767_225_600_000) -> list[tuple[str, dict]]:
    """The first `n` candidates of `candidate_stream`, one second apart from `base_ms`."""
    return [(f.user, f.record(base_ms + i * 1000)) for i, f in enumerate(itertools.islice(candidate_stream(tag, users, seed), n))]


# ---------------------------------------------------------------------------- the workers ----
def _noop(_path: str) -> None:
    return None


@dataclass
class Fleet:
    """`memstream worker` processes of one app id; each name keeps its port and data dir.

    `base_env` is the stack's (broker, registry, partitions), `env` the fleet's own settings on
    top; `claim` / `release` are told of a data dir a worker takes and gives back (the test suite
    refuses two live workers on one)."""

    settings: Settings
    app_id: str
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = ROOT / ".memstream" / "fleet-logs"
    data_root: Path = ROOT / ".memstream" / "fleet-data"
    base_env: dict[str, str] = field(default_factory=dict)
    claim: Callable[[str], None] = _noop
    release: Callable[[str], None] = _noop
    free_port: Callable[[], int] = lambda: devstack.free_port(20000, 28000)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{self.app_id}-{name}-{self.starts[name]}.log"

    def data_dir(self, name: str) -> str:
        """One per worker name (a restarted worker finds its RocksDB tables again)."""
        return str(self.data_root / f"{self.app_id}-{name}")

    def _new_port(self) -> int:
        """A free port that no other worker of this fleet was given: workers started without waiting
        have not bound theirs yet, so the free-port probe alone could hand two of them the same one
        (a worker then exits on its bind)."""
        given = set(self.ports.values())
        for _ in range(100):
            if (port := self.free_port()) not in given:
                return port
        raise RuntimeError(f"no free port for a worker of {self.app_id} outside {sorted(given)}")

    def start(self, name: str, wait: bool = True) -> None:
        if name not in self.ports:
            self.ports[name] = self._new_port()
        self.starts[name] = self.starts.get(name, 0) + 1
        env = {**self.base_env, "MEMSTREAM_APP_ID": self.app_id, "MEMSTREAM_WEB_PORT": str(self.ports[name]),
               "MEMSTREAM_DATA_DIR": self.data_dir(name), **self.env}
        path = self.log_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.claim(env["MEMSTREAM_DATA_DIR"])
        with open(path, "wb") as log:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "streams", "worker"], cwd=ROOT,
                                                env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(name)

    def ready(self, name: str) -> bool:
        """The worker's log says Faust's worker is ready (it joined; recovery may still run)."""
        path = self.log_path(name)
        assert self.procs[name].poll() is None, f"worker {name} exited; log {path}:\n{path.read_text()[-3000:]}"
        return READY_LINE in path.read_bytes()

    def wait_ready(self, name: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready(name):
            assert time.monotonic() < deadline, f"worker {name} not ready after {timeout:.0f}s; log {self.log_path(name)}"
            time.sleep(0.2)

    def states(self) -> dict[str, str]:
        """Each running worker's /health status ("down" while it does not answer)."""
        return {n: (kafkatools.worker_health(self.ports[n], timeout=2) or {}).get("status", "down") for n in self.procs}

    def wait_settled(self, timeout: float = 300, progress: Callable[[], None] | None = None) -> None:
        """Until every worker's /health says ready three polls in a row (the group settled)."""
        streak, deadline = 0, time.monotonic() + timeout
        while streak < 3:
            states = self.states()
            streak = streak + 1 if all(s == "ready" for s in states.values()) else 0
            assert time.monotonic() < deadline, f"workers not ready after {timeout:.0f}s: {states}"
            if progress:
                progress()
            time.sleep(0.5)

    def kill(self, name: str) -> None:
        """SIGKILL: no shutdown, no commit, no flush."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.release(self.data_dir(name))

    def reap(self, name: str, timeout: float = 90) -> int:
        """Wait for a worker that stops by itself; its exit status."""
        proc = self.procs[name]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {name} did not stop within {timeout:.0f}s; log {self.log_path(name)}") from None
        self.procs.pop(name)
        self.release(self.data_dir(name))
        return proc.returncode

    def stop(self, name: str, signalled: bool = False) -> int:
        """A clean stop (SIGTERM): the worker commits and leaves the group. A worker whose stop
        hangs ends at its MEMSTREAM_SHUTDOWN_TIMEOUT_S (exit 75, nothing unapplied committed),
        which this waits for and prints. Seen once in CI (2026-12-03): a worker stopped while the
        group rebalanced after the other one left waited for a rebalance callback its stopped
        consumer never ran (streams/runtime/rebalance.py defect 8, fixed since). Its exit status."""
        proc = self.procs.pop(name)
        if not signalled:
            proc.terminate()
        proc.wait(float(self.env.get("MEMSTREAM_SHUTDOWN_TIMEOUT_S", 30)) + 30)
        if proc.returncode == 75:
            print(f"worker {name} ended at its shutdown deadline (exit 75); log {self.log_path(name)}")
        self.release(self.data_dir(name))
        return proc.returncode

    def alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"worker {name} died; log {self.log_path(name)}"

    def wait_caught_up(self, ends: Offsets, timeout: float = 900, progress: Callable[[int], None] | None = None,
                       revive: Callable[[str], None] | None = None) -> None:
        """Until the group has committed `ends`. A worker that exits meanwhile fails the wait,
        unless `revive` is given: it is then told the worker's name (and may start it again)."""
        deadline = time.monotonic() + timeout
        while (lag := kafkatools.group_lag(self.settings, self.app_id, ends)) > 0:
            if revive is not None:
                for name in [n for n, proc in self.procs.items() if proc.poll() is not None]:
                    revive(name)
            self.alive()
            assert time.monotonic() < deadline, f"{self.app_id} still {lag} records behind after {timeout:.0f}s"
            if progress:
                progress(lag)
            time.sleep(0.5)

    def stop_all(self) -> dict[str, int]:
        """A clean stop of every worker, signalled together (one rebalance, not one per worker);
        their exit statuses."""
        for proc in self.procs.values():
            proc.terminate()
        return {name: self.stop(name, signalled=True) for name in list(self.procs)}

    def kill_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)


# ---------------------------------------------------------------------------- the outputs ----
_CODECS: dict[str, CodecFactory] = {}


def codecs(settings: Settings) -> CodecFactory:
    """A codec factory with every catalog schema registered (one per registry URL)."""
    if settings.registry_url not in _CODECS:
        f = CodecFactory.from_url(settings.registry_url)
        f.register([t.name for t in catalog.topics()])
        _CODECS[settings.registry_url] = f
    return _CODECS[settings.registry_url]


@dataclass
class Outputs:
    nodes: dict[str, dict | None]  # last value per key
    events: dict[str, list[dict]]  # ledger + relay: (topic:event_id) -> every copy
    dead_letters: list[dict]


def read_outputs(settings: Settings, start: Offsets, end: Offsets) -> Outputs:
    """Every output record between two snapshots of the output topics' end offsets."""
    nodes: dict[str, dict | None] = {}
    events: dict[str, list[dict]] = {}
    dead: list[dict] = []
    for topic in OUTPUTS:
        codec = codecs(settings).codec(catalog.topic(topic).value_schema)
        for msg in read_range(settings, topic, start, end):
            value = None if msg.value() is None else codec.decode(msg.value())
            if topic == catalog.MEMORY_NODES:
                nodes[decode_key(msg.key())] = value
            elif topic == catalog.DLQ:
                dead.append(value)
            else:
                events.setdefault(f"{topic}:{value['event_id']}", []).append(value)
    return Outputs(nodes, events, dead)


def read_range(settings: Settings, topic: str, start: Offsets, end: Offsets, idle_timeout: float = 60):
    """The records of `topic` between `start` and `end` (per partition), in partition order."""
    parts = [p for (t, p) in end if t == topic and end[(t, p)] > start.get((t, p), 0)]
    if not parts:
        return
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": "fault-reader", "enable.auto.commit": False,
                  "log_level": 0})
    try:
        c.assign([TopicPartition(topic, p, start.get((topic, p), 0)) for p in parts])
        remaining = {p: end[(topic, p)] for p in parts}
        deadline = time.monotonic() + idle_timeout
        while remaining:
            assert time.monotonic() < deadline, f"could not read {topic} up to {remaining}"
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            deadline = time.monotonic() + idle_timeout  # a long range: the limit is on waiting, not on reading
            if msg.offset() < remaining.get(msg.partition(), -1):
                yield msg
            if msg.offset() + 1 >= remaining.get(msg.partition(), 0):
                remaining.pop(msg.partition(), None)
    finally:
        c.close()


def http_json(port: int, path: str, token: str, timeout: float = 15) -> tuple[int, dict]:
    """GET a worker's HTTP API: (status, JSON body); (0, {}) when it does not answer JSON."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {}
    except (OSError, ValueError):  # refused, reset, or not JSON: forwarding to a worker that is gone
        return 0, {}


def answers(port: int, users: list[str], token: str, timeout: float = 60) -> dict[str, tuple[int, dict]]:
    """Every user's nodes as one worker answers (it forwards to the owner); a 503 (the worker
    or the owner is rebalancing) is retried, as a client would."""
    out = {}
    for u in users:
        deadline = time.monotonic() + timeout
        while (got := http_json(port, f"/v1/memory/{u}/nodes?include=superseded", token))[0] in (0, 503):
            assert time.monotonic() < deadline, f"no answer for {u} from port {port} within {timeout:.0f}s: {got}"
            time.sleep(0.5)
        out[u] = got
    return out


def differing(got: dict, want: dict) -> list[str]:
    return sorted(k for k in got.keys() | want.keys() if got.get(k, "<absent>") != want.get(k, "<absent>"))


def diff(got: dict, want: dict) -> str:
    keys = differing(got, want)
    return (f"{len(keys)} node keys differ, e.g. {keys[:3]}: got {[got.get(k, '<absent>') for k in keys[:1]]} "
            f"want {[want.get(k, '<absent>') for k in keys[:1]]}")


def diff_answers(got: dict, want: dict) -> str:
    g = {n["node_id"]: n for n in got.get("nodes", [])}
    w = {n["node_id"]: n for n in want.get("nodes", [])}
    if g.keys() != w.keys():
        return f"nodes only here {sorted(g.keys() - w.keys())}, only in the reference {sorted(w.keys() - g.keys())}"
    return "; ".join(f"{nid}.{f}: {g[nid].get(f)!r} != {w[nid].get(f)!r}"
                     for nid in g for f in g[nid].keys() | w[nid].keys() if g[nid].get(f) != w[nid].get(f))


def save_diff(path: Path, got: dict, want: dict) -> None:
    """Every differing node key with both values: the first lines of a mismatch show three keys;
    finding the record that diverged needs them all (each node names the record that formed it:
    `origin_event_id`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"key": k, "got": got.get(k, "<absent>"), "want": want.get(k, "<absent>")} for k in differing(got, want)]
    path.write_text(json.dumps(rows, indent=1))


def compare(got: Outputs, want: Outputs, fleet_answers: dict[str, dict[str, tuple[int, dict]]],
            ref_answers: dict[str, tuple[int, dict]]) -> list[str]:
    """What differs between a fleet's outputs (`got`) and the reference's (`want`), one line per
    finding; empty when they are equal: the same final node state; the same ledger and relay
    event ids, each copy of the fleet's (at-least-once repeats) equal to the reference's one;
    nothing dead-lettered; every worker's HTTP answer for every user equal to the reference's."""
    problems = []
    if not (want.nodes and want.events):
        problems.append("the reference produced nothing: the run tests nothing")
    if want.dead_letters or got.dead_letters:
        problems.append(f"dead letters: fleet {len(got.dead_letters)}, reference {len(want.dead_letters)}: "
                        f"{(got.dead_letters or want.dead_letters)[:2]}")
    if got.nodes != want.nodes:
        problems.append(diff(got.nodes, want.nodes))
    if got.events.keys() != want.events.keys():
        problems.append(f"ledger/relay: missing {sorted(want.events.keys() - got.events.keys())[:5]} "
                        f"({len(want.events.keys() - got.events.keys())}), extra "
                        f"{sorted(got.events.keys() - want.events.keys())[:5]} ({len(got.events.keys() - want.events.keys())})")
    for eid, copies in got.events.items():
        if eid in want.events and not all(c == want.events[eid][0] for c in copies):
            problems.append(f"{eid}: a repeated event differs from the reference")
        if len(want.events.get(eid, ())) > 1:
            problems.append(f"the reference itself repeated {eid}")
    for name, per_user in fleet_answers.items():
        for u, answer in per_user.items():
            if not (answer[0] == 200 and answer == ref_answers.get(u)):
                problems.append(f"worker {name} answers differently for {u}: "
                                f"{diff_answers(answer[1], ref_answers.get(u, (0, {}))[1])}")
    return problems


@dataclass
class Comparison:
    problems: list[str]
    figures: dict
    got: Outputs
    want: Outputs


def finish_and_compare(fleet: Fleet, reference: Fleet, users: list[str], inputs_end: Offsets, outputs_start: Offsets,
                       token: str, timeout: float = 900, progress: Callable[[str], None] | None = None) -> Comparison:
    """Wait for `fleet` to reach `inputs_end`, read its outputs and HTTP answers, stop it; then
    the same for `reference` (one worker of a group positioned where the fleet's started), and
    compare (`compare`). Figures: nodes, events, repeated events, and the seconds of each step."""
    note = progress or (lambda _msg: None)
    timings: dict[str, float] = {}
    started = time.monotonic()
    fleet.wait_caught_up(inputs_end, timeout)
    timings["fleet_catch_up_s"] = time.monotonic() - started
    time.sleep(1)  # outputs are acknowledged before the commit; this only lets the HTTP caches settle
    note(f"fleet caught up; asking {len(fleet.procs)} worker(s) for {len(users)} users' nodes")
    fleet_answers = {name: answers(fleet.ports[name], users, token) for name in fleet.procs}
    fleet.stop_all()
    middle = kafkatools.end_offsets(fleet.settings, OUTPUTS)
    got = read_outputs(fleet.settings, outputs_start, middle)
    note(f"fleet outputs read ({len(got.nodes):,} node keys, {len(got.events):,} events); the reference starts")

    started = time.monotonic()
    reference.start("only")
    reference.wait_caught_up(inputs_end, timeout, progress=_every(30, lambda lag: note(f"reference: {lag:,} records behind")))
    timings["reference_s"] = time.monotonic() - started
    time.sleep(1)
    ref_answers = answers(reference.ports["only"], users, token)
    reference.stop_all()
    want = read_outputs(fleet.settings, middle, kafkatools.end_offsets(fleet.settings, OUTPUTS))
    problems = compare(got, want, fleet_answers, ref_answers)
    figures = {"nodes": len(want.nodes), "events": len(want.events),
               "repeated_events": sum(len(c) - 1 for c in got.events.values()),
               "dead_letters": len(got.dead_letters), **{k: round(v, 1) for k, v in timings.items()}}
    return Comparison(problems, figures, got, want)


def _every(seconds: float, fn: Callable[[int], None]) -> Callable[[int], None]:
    last = [0.0]

    def call(value: int) -> None:
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            fn(value)
    return call


# ---------------------------------------------------------------------- paced input, taps ----
class PacedFeeder(threading.Thread):
    """Sends the stream's candidates at `rate`/s to memory.candidates.v1 until stopped, each
    with its send time as record time and candidate `timestamp`; remembers, per ledger event id
    an input may cause first, the input's number, and each input's send time. `rate` may be
    changed while it runs; `burst(n)` sends the next `n` as fast as the producer goes."""

    def __init__(self, settings: Settings, stream: Iterator[Fact], rate: float) -> None:
        super().__init__(daemon=True)
        self.codec = codecs(settings).codec(catalog.topic(catalog.MEMORY_CANDIDATES).value_schema)
        self.producer = Producer({"bootstrap.servers": settings.broker, "partitioner": "murmur2_random",
                                  "linger.ms": 5, "acks": "all", "log_level": 0})
        self.stream, self.rate = stream, rate
        self.sent: list[float] = []  #: send time (epoch s) of input n
        self.index: dict[str, int] = {}  #: ledger event id -> input n
        self.users: set[str] = set()
        self.failures: list[str] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self.failures.append(str(err))

    def send_one(self) -> None:
        fact = next(self.stream)
        now = time.time()
        n = len(self.sent)
        for eid in fact.ledger_ids():
            self.index[eid] = n
        self.sent.append(now)
        self.users.add(fact.user)
        value = self.codec.encode(fact.record(int(now * 1000)))
        while True:
            try:
                self.producer.produce(catalog.MEMORY_CANDIDATES, value, encode_key(fact.user),
                                      on_delivery=self._delivered, timestamp=int(now * 1000))
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def burst(self, n: int) -> None:
        for _ in range(n):
            self.send_one()
        self.flush()

    def run(self) -> None:
        try:
            started, sent = time.time(), 0
            while not self.stopping.is_set():
                delay = started + sent / self.rate - time.time()
                if delay > 0:
                    time.sleep(min(delay, 0.2))
                    continue
                self.send_one()
                sent += 1
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(60)
        if self.error:
            raise self.error
        self.flush()

    def flush(self) -> None:
        remaining = self.producer.flush(300)
        if remaining or self.failures:
            raise RuntimeError(f"{remaining + len(self.failures)} input record(s) not delivered: {self.failures[:1]}")


class LedgerTap(threading.Thread):
    """Reads memory.ledger.v1 from `start` in the background and keeps, per input of `feeder`,
    the time its first ledger event was received; and per ledger partition the record times
    (CreateTime, ms) it saw, to tell when a partition produced again after a fault."""

    def __init__(self, settings: Settings, start: Offsets, feeder: PacedFeeder) -> None:
        super().__init__(daemon=True)
        self.consumer = kafkatools.consumer(settings, "memstream-fleet-tap")
        self.consumer.assign([TopicPartition(t, p, off) for (t, p), off in start.items()])
        self.decode = codecs(settings).codec("memory_event").decode
        self.feeder = feeder
        self.first: dict[int, float] = {}  #: input n -> receive time of its first ledger event
        #: ledger partition -> (CreateTime ms, receive time s) of the records seen, in order
        self.created: dict[int, list[tuple[int, float]]] = {}
        self.stopping = threading.Event()
        self.errors = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                batch = self.consumer.consume(500, 0.1)
            except KafkaException:  # the broker restarting: librdkafka reconnects
                self.errors += 1
                time.sleep(0.5)
                continue
            now = time.time()
            for msg in batch:
                if msg.error() or msg.value() is None:
                    continue
                self.created.setdefault(msg.partition(), []).append((msg.timestamp()[1], now))
                n = self.feeder.index.get(self.decode(msg.value())["event_id"])
                if n is not None and n not in self.first:
                    self.first[n] = now
        self.consumer.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)

    def longest_pause(self, partitions: list[int], start_s: float, end_s: float) -> float | None:
        """The longest stretch of [start_s, end_s] in which one of `partitions` had no ledger
        record become visible (the window's edges count as a pause's edges); None for no partition."""
        worst = None
        for p in partitions:
            edges = [start_s, *sorted(r for _c, r in self.created.get(p, ()) if start_s <= r <= end_s), end_s]
            gap = max(b - a for a, b in zip(edges, edges[1:], strict=False))
            worst = gap if worst is None else max(worst, gap)
        return worst

    def latencies_ms(self, start_s: float, end_s: float) -> list[float]:
        """Visible latency (first ledger event received - sent) of the inputs sent in [start_s, end_s), sorted."""
        sent = self.feeder.sent
        return sorted((self.first[n] - sent[n]) * 1000 for n in list(self.first) if start_s <= sent[n] < end_s)

    def back_after(self, partitions: list[int], since_ms: int) -> float | None:
        """Seconds from `since_ms` until every one of `partitions` had a ledger record written
        after it (CreateTime) and visible (received by the tap); None while one has not. Visible,
        not only written: a worker goes on writing into its producer's queue while the broker is
        down."""
        firsts = []
        for p in partitions:
            later = [received for created, received in self.created.get(p, ()) if created > since_ms]
            if not later:
                return None
            firsts.append(min(later))
        return max(0.0, max(firsts) - since_ms / 1000) if firsts else 0.0


def percentile(sorted_values: list[float], q: float) -> float | None:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else None


@dataclass
class Sample:
    t: float  #: epoch s
    committed: int  #: input records the group has committed (sum over input partitions, from the run's start)
    lag: int  #: input records not committed yet
    sent: int  #: input records sent so far


class Sampler(threading.Thread):
    """Every `every` seconds: the group's committed progress and lag on the input topics."""

    def __init__(self, settings: Settings, group: str, start: Offsets, feeder: PacedFeeder, every: float = 5) -> None:
        super().__init__(daemon=True)
        self.settings, self.group, self.start_offsets, self.feeder, self.every = settings, group, start, feeder, every
        self.samples: list[Sample] = []
        self.last: Offsets = dict(start)  #: each partition's committed offset as last read
        #: (time, partition, committed before, committed now) of a committed offset that moved back
        self.backwards: list[tuple[float, str, int, int]] = []
        self.stopping = threading.Event()

    def sample(self) -> Sample:
        ends = kafkatools.end_offsets(self.settings, [catalog.MEMORY_CANDIDATES])
        c = kafkatools.consumer(self.settings, self.group)
        try:
            committed = c.committed([TopicPartition(t, p) for (t, p) in ends], timeout=10)
        finally:
            c.close()
        now = time.time()
        for tp in committed:
            key = (tp.topic, tp.partition)
            if tp.offset < 0 or tp.error is not None:  # not answered this time: the last one read stands
                continue
            if tp.offset < self.last[key]:
                self.backwards.append((now, f"{tp.topic}[{tp.partition}]", self.last[key], tp.offset))
            self.last[key] = max(tp.offset, self.start_offsets[key])
        return Sample(now, sum(self.last[tp] - self.start_offsets[tp] for tp in ends),
                      sum(ends[tp] - self.last[tp] for tp in ends), len(self.feeder.sent))

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            try:
                self.samples.append(self.sample())
            except (KafkaException, RuntimeError):  # the broker restarting: the next sample
                continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


# ------------------------------------------------------------------ a worker's own figures ----
def rss_mib(pid: int) -> float:
    """Resident set size (VmRSS) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def dir_mib(path: str | Path) -> float:
    """Bytes on disk under `path` (as `du` counts them: allocated blocks), in MiB."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:  # a file RocksDB removed meanwhile
                continue
    return total / 2**20


def metrics_text(port: int) -> str:
    """A worker's /metrics (Prometheus text), or "" while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def metric(text: str, name: str) -> float | None:
    """The sum of the series of one metric (`memstream_...`, every label) in a /metrics text."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ")]
    return sum(values) if values else None


def owned_partitions(port: int, topic: str = catalog.MEMORY_CANDIDATES) -> list[int]:
    """The partitions of `topic` a worker owns (its /metrics consumer_lag series, one per owned input partition)."""
    out = set()
    for line in metrics_text(port).splitlines():
        if line.startswith("memstream_consumer_lag{") and f'topic="{topic}"' in line:
            out.add(int(line.split('partition="', 1)[1].split('"', 1)[0]))
    return sorted(out)


# ------------------------------------------------------------------------------ a run's stack ----
def own_stack(broker_port: int, registry_port: int, name: str) -> dict[str, str]:
    """A run's own stack: the broker on `broker_port` (its KRaft controller on the next port), the
    registry on `registry_port` (its management port the next), data under .memstream/`name`."""
    return {"MEMSTREAM_BROKER": f"127.0.0.1:{broker_port}", "MEMSTREAM_CONTROLLER_PORT": str(broker_port + 1),
            "MEMSTREAM_REGISTRY_URL": f"http://127.0.0.1:{registry_port}/apis/ccompat/v7",
            "MEMSTREAM_STACK_DIR": str(ROOT / ".memstream" / name)}


def stack_env(defaults: dict[str, str], partitions: int) -> dict[str, str]:
    """The run's stack settings: each MEMSTREAM_* of `defaults` unless the environment sets it,
    and the partition count."""
    return {**{k: os.environ.get(k, v) for k, v in defaults.items()}, "MEMSTREAM_PARTITIONS": str(partitions)}


def start_stack(settings: Settings, wipe: bool) -> None:
    """`memstream dev up` on the run's own ports (after `dev down --wipe` with `wipe`: a fresh
    broker and registry, so the catalog is created with the run's partition count), then `topics apply`."""
    from streams.contracts import topics

    if wipe:
        devstack.down(settings, wipe=True)
    devstack.up(settings)
    if not topics.apply(settings).ok:
        raise RuntimeError(f"the catalog topics on {settings.broker} drifted (another partition count?): "
                           "run without --keep-stack to start on a fresh stack")


def measure_sustained(fleet: Fleet, feeder: PacedFeeder, records: int) -> float:
    """The fleet's sustained rate on this stream: `records` sent as fast as the producer goes,
    records / time from the first send to the newest output record's CreateTime once the group
    has committed past them (bench/bench_e2e.py's method)."""
    settings = fleet.settings
    out_start = kafkatools.end_offsets(settings, OUTPUTS)
    t0 = time.time()
    feeder.burst(records)
    fleet.wait_caught_up(kafkatools.end_offsets(settings, [catalog.MEMORY_CANDIDATES]),
                         progress=_every(10, lambda lag: say(f"  … measuring: {lag:,} records behind")))
    newest = kafkatools.last_timestamp_ms(settings, out_start)
    if newest is None:
        raise RuntimeError("the fleet wrote no output while its rate was measured")
    return records / max(newest / 1000 - t0, 1e-3)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def plot_timeline(path: Path, title: str, panels: list[tuple[str, dict[str, tuple[list[float], list[float]]], bool]],
                  events: list[tuple[float, str]]) -> None:
    """A PNG of stacked panels over a shared time axis (minutes): each panel (y label, {series
    label: (x, y)}, log scale), every event a dashed vertical line labelled in the top panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(13, 2.6 * len(panels) + 0.8), squeeze=False)
    for ax, (label, series, log) in zip(axes[:, 0], panels, strict=True):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, label=name, linewidth=1.2)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend(loc="upper right", fontsize=8)
        for x, _text in events:
            ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
    top = axes[0, 0]
    for x, text in events:
        top.annotate(text, (x, 1), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top",
                     ha="right", color="dimgrey")
    axes[-1, 0].set_xlabel("minutes")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------- the scripts' common frame ----
def run_arguments(doc: str, *, minutes: float, workers: int, partitions: int, users: int, seed: int):
    """The options chaos_fleet.py and soak.py share (their own come on top)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=minutes, help="minutes of paced input")
    ap.add_argument("--workers", type=int, default=workers)
    ap.add_argument("--partitions", type=int, default=partitions)
    ap.add_argument("--users", type=int, default=users, help="users of the candidate stream")
    ap.add_argument("--rate", type=float, default=0, help="records/s to send (0: half the measured sustained rate)")
    ap.add_argument("--measure-records", type=int, default=20000, help="candidates sent to measure the sustained rate")
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="where the run's folder goes")
    ap.add_argument("--keep-stack", action="store_true", help="reuse the stack as it is (default: wipe it first)")
    ap.add_argument("--leave-up", action="store_true", help="leave the stack running at the end")
    ap.add_argument("--keep-data", action="store_true", help="keep the workers' data dirs (default: removed at the end)")
    return ap


@dataclass
class Run:
    """A script's run: its stack settings (and the environment its workers get), its folder."""

    settings: Settings
    env: dict[str, str]
    folder: Path


@contextmanager
def stack_run(args, kind: str, stack_defaults: dict[str, str]) -> Iterator[Run]:
    """The run's stack up (wiped first unless `--keep-stack`) and its folder `<--out>/<kind>-<time>`;
    afterwards the stack stopped (unless `--leave-up`) and the workers' data dirs removed (unless
    `--keep-data`), whatever happened."""
    import shutil

    env = stack_env(stack_defaults, args.partitions)
    settings = Settings.from_env(env)
    folder = args.out / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    say(f"{kind} run {folder.name}: stack {settings.broker} / {settings.registry_url} ({settings.stack_dir}), output {folder}")
    try:
        start_stack(settings, wipe=not args.keep_stack)
        yield Run(settings, env, folder)
    finally:
        if not args.leave_up:
            devstack.down(settings)
        if not args.keep_data:
            shutil.rmtree(folder / "data", ignore_errors=True)


def start_and_measure(fleet: Fleet, names: list[str], feeder: PacedFeeder, args) -> tuple[float, float | None]:
    """Start the named workers together and wait until each is ready; then the rate to send:
    `--rate`, or half the sustained rate measured with `--measure-records` (returned too)."""
    say(f"== starting {len(names)} workers (app id {fleet.app_id}, {fleet.settings.partitions} partitions)")
    for name in names:
        fleet.start(name, wait=False)
    for name in names:
        fleet.wait_ready(name, timeout=300)
    fleet.wait_settled()
    if args.rate:
        return args.rate, None
    say(f"== measuring the workers' sustained rate: {args.measure_records:,} candidates as fast as they go")
    sustained = measure_sustained(fleet, feeder, args.measure_records)
    say(f"   sustained {sustained:,.0f} records/s; the run sends half: {sustained / 2:,.0f}/s")
    return sustained / 2, sustained


class PacedRun:
    """What a script's run is made of (scripts/chaos_fleet.py, scripts/soak.py): a fleet of a
    fresh group positioned at the inputs' end, the paced candidate feeder, the ledger tap, the lag
    sampler. `execute()` (the script's) returns the results, `markdown` and `plot` report them."""

    kind = "run"

    def __init__(self, args, run: Run, worker_env: dict[str, str], names: list[str], sample_every: float = 5) -> None:
        self.args, self.settings, self.folder = args, run.settings, run.folder
        self.fleet = Fleet(run.settings, run.folder.name, worker_env, log_dir=run.folder / "logs",
                           data_root=run.folder / "data", base_env=run.env)
        self.names = names
        self.inputs_start = kafkatools.end_offsets(self.settings, INPUTS)
        self.outputs_start = kafkatools.end_offsets(self.settings, OUTPUTS)
        kafkatools.position_group(self.settings, self.fleet.app_id, self.inputs_start)
        self.feeder = PacedFeeder(self.settings, candidate_stream(f"{self.kind}{args.seed}", args.users, args.seed), 1.0)
        self.tap = LedgerTap(self.settings, {tp: off for tp, off in self.outputs_start.items()
                                             if tp[0] == catalog.MEMORY_LEDGER}, self.feeder)
        self.sampler = Sampler(self.settings, self.fleet.app_id, self.inputs_start, self.feeder, every=sample_every)
        self.t0 = 0.0  #: when paced sending started
        self.rate, self.sustained = 0.0, None

    def begin(self) -> None:
        """Tap and sampler running, the workers started, the rate settled (`start_and_measure`),
        then paced sending from now on (`t0`)."""
        self.tap.start()
        self.sampler.start()
        self.rate, self.sustained = start_and_measure(self.fleet, self.names, self.feeder, self.args)
        self.feeder.rate = self.rate
        self.t0 = time.time()
        self.feeder.start()

    def execute(self) -> dict:
        raise NotImplementedError

    def markdown(self, res: dict) -> str:
        raise NotImplementedError

    def plot(self, res: dict, path: Path) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Whatever happened: no thread sends or reads any more, no worker of the run lives on."""
        self.feeder.stopping.set()
        self.tap.stopping.set()
        self.sampler.stopping.set()
        self.fleet.kill_all()

    def header(self) -> dict:
        """The results' common part: when, where, what was sent."""
        from bench.bench_e2e import machine, versions

        return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.t0)), "load_average_end": load_average(),
                "machine": machine(), "versions": versions(self.settings), "app_id": self.fleet.app_id,
                "args": vars(self.args), "partitions": self.settings.partitions,
                "sustained_rate": None if self.sustained is None else round(self.sustained, 1), "rate": round(self.rate, 1),
                "inputs": len(self.feeder.sent), "users": len(self.feeder.users)}


def run_script(args, stack_defaults: dict[str, str], cls: type[PacedRun]) -> tuple[PacedRun, dict]:
    """A script's whole run: the stack (`stack_run`), `cls(args, run).execute()`, everything
    stopped, then report.json, report.md and <kind>.png in the run's folder."""
    with stack_run(args, cls.kind, stack_defaults) as run:
        harness = cls(args, run)  # type: ignore[call-arg]  # a script's subclass takes (args, run)
        try:
            res = harness.execute()
        finally:
            harness.stop()
    (run.folder / "report.json").write_text(json.dumps(res, indent=1, default=str))
    (run.folder / "report.md").write_text(harness.markdown(res))
    harness.plot(res, run.folder / f"{harness.kind}.png")
    print(harness.markdown(res))
    say(f"report: {run.folder / 'report.md'}, {run.folder / 'report.json'}, plot {run.folder / f'{harness.kind}.png'}")
    return harness, res
