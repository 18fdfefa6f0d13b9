"""Fault tolerance on the real broker, against a single-worker reference run.

Each scenario streams generated candidates for its own users into memory.candidates.v1 while
workers (real `memstream worker` processes, RocksDB store, one standby replica) are killed with
SIGKILL and restarted, added and removed, or while the broker itself restarts. When the fleet has
caught up, ONE fresh worker (another app id, so another consumer group and fresh state) processes
the same input range: the reference. Then:

- the final `memory.nodes.v1` state (last value per key, null = deleted) of the scenario's output
  range equals the reference's;
- the ledger and relay hold the same event ids with the same records; the scenario may repeat a
  record (at-least-once), but only as an identical copy a consumer recognises by its event id;
- nothing of the input range was dead-lettered;
- every user queried over HTTP on every surviving worker answers what the reference answers.

Only candidates are streamed: Kafka orders records within a partition, not across topics, so a
user's mix of candidates and events could interleave differently in two runs (and legitimately
decide differently). Timers are slowed down (housekeeping reads the wall clock).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.fleet import OUTPUTS, Fleet, Offsets, http_json, read_outputs, save_diff, stream_of  # noqa: F401 - read_outputs, stream_of: for the suites that import them from here
from bench.fleet import answers as answers_with
from bench.fleet import finish_and_compare as compare_with_reference
from streams.contracts import catalog
from streams.contracts.wire import encode_key
from streams.settings import Settings
from streams.tools import devstack, kafkatools
from tests.conftest import ROOT, TEST_DATA, TEST_ENV
from tests.kafka_util import candidate, claim_data_dir, codecs, free_port, http_get, producer, release_data_dir

pytestmark = [pytest.mark.kafka, pytest.mark.faults]

TOKEN = "faults"
ARTIFACTS = ROOT / "test-artifacts"
SHUTDOWN_TIMEOUT_S = 30  #: a fleet worker's stop deadline (its own, documented exit 75), below `Fleet.stop`'s wait


# ------------------------------------------------------------------------------ the input ----
# `stream_of` (bench/fleet.py): candidates only, new facts, repeats, one-word edits, sensitive ones
class Producer:
    """Produces the stream in chunks from a thread (records keep flowing during the faults)."""

    def __init__(self, settings: Settings, items: list[tuple[str, dict]], chunk: int, pause_s: float) -> None:
        self.settings, self.items, self.chunk, self.pause_s = settings, items, chunk, pause_s
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            codec = codecs(self.settings).codec(catalog.topic(catalog.MEMORY_CANDIDATES).value_schema)
            p = producer(self.settings)
            for start in range(0, len(self.items), self.chunk):
                for key, value in self.items[start:start + self.chunk]:
                    p.produce(catalog.MEMORY_CANDIDATES, key=encode_key(key), value=codec.encode(value))
                p.poll(0)
                time.sleep(self.pause_s)
            assert p.flush(180) == 0, "the producer could not deliver every record"
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def start(self) -> Producer:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join(300)
        assert not self.thread.is_alive(), "the producer did not finish"
        if self.error:
            raise self.error


# ---------------------------------------------------------------------------- a scenario ----
@dataclass
class Scenario:
    settings: Settings
    tag: str
    users: list[str]
    inputs_start: Offsets
    inputs_end: Offsets = field(default_factory=dict)
    outputs_start: Offsets = field(default_factory=dict)


INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]


def begin(settings: Settings, tag: str, items: list[tuple[str, dict]]) -> Scenario:
    """The scenario's groups start at the current end of every input topic (only its own
    records are processed: earlier tests left thousands, malformed ones included)."""
    return Scenario(settings, tag, sorted({u for u, _ in items}), kafkatools.end_offsets(settings, INPUTS),
                    outputs_start=kafkatools.end_offsets(settings, OUTPUTS))


def answers(port: int, users: list[str]) -> dict[str, tuple[int, dict]]:
    """Every user's nodes as one worker answers to the suite's token (bench/fleet.py `answers`)."""
    return answers_with(port, users, TOKEN)


_FLEETS: list[Fleet] = []


@pytest.fixture(autouse=True)
def _stop_every_worker():
    """Whatever a test does or fails at, no worker outlives it (a stray worker of another group
    would keep writing the same derived records into the shared output topics)."""
    yield
    while _FLEETS:
        fleet = _FLEETS.pop()
        for name in list(fleet.procs):
            fleet.kill(name)


def fleet_for(sc: Scenario, name: str, **env: str) -> Fleet:
    app_id = f"it-fault-{sc.tag}-{name}"
    kafkatools.position_group(sc.settings, app_id, sc.inputs_start)
    fleet = Fleet(sc.settings, app_id, {
        "MEMSTREAM_API_TOKENS": f"{TOKEN}:secret:admin+negotiator+ops", "MEMSTREAM_TIMER_INTERVAL_S": "3600",
        "MEMSTREAM_SESSION_TIMEOUT_S": "6", "MEMSTREAM_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S),
        "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_STANDBY_REPLICAS": "1", **env},
        log_dir=ROOT / ".memstream" / "test-logs", data_root=TEST_DATA, base_env=TEST_ENV,
        claim=claim_data_dir, release=release_data_dir, free_port=free_port)
    _FLEETS.append(fleet)
    return fleet


def finish_and_compare(sc: Scenario, fleet: Fleet) -> dict:
    """Wait for the fleet to catch up, read its outputs and HTTP answers, run the reference and
    compare (bench/fleet.py `finish_and_compare`). Returns figures for the report."""
    sc.inputs_end = kafkatools.end_offsets(sc.settings, INPUTS)
    ref = fleet_for(sc, "reference", MEMSTREAM_STANDBY_REPLICAS="0")
    result = compare_with_reference(fleet, ref, sc.users, sc.inputs_end, sc.outputs_start, TOKEN)
    if result.got.nodes != result.want.nodes:
        save_diff(ARTIFACTS / f"diff-{sc.tag}.json", result.got.nodes, result.want.nodes)
    assert not result.problems, "\n".join(result.problems[:10])
    return {k: result.figures[k] for k in ("nodes", "events", "repeated_events")}


def report(name: str, figures: dict) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    line = f"{time.strftime('%Y-%m-%d %H:%M')} {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items())
    with open(ARTIFACTS / "faults.txt", "a") as f:
        f.write(line + "\n")
    print(line)


# ------------------------------------------------------------------------------ the tests ----
def test_sigkill_and_restart_several_times_mid_stream(stack, unique):
    items = stream_of(f"kill-{unique}", users=24, n=2400)
    sc = begin(stack, f"kill-{unique}", items)
    fleet = fleet_for(sc, "fleet")
    fleet.start("a")
    fleet.start("b")
    feed = Producer(stack, items, chunk=100, pause_s=0.5).start()
    for victim in ["a", "b", "a"]:
        time.sleep(3)
        fleet.kill(victim)
        fleet.start(victim)  # same data dir: its unclean stop makes it discard local tables
    feed.join()
    figures = finish_and_compare(sc, fleet)
    report("sigkill x3 (2 workers)", figures)


def test_worker_added_and_removed_while_records_flow(stack, unique):
    items = stream_of(f"scale-{unique}", users=24, n=2400, seed=8)
    sc = begin(stack, f"scale-{unique}", items)
    fleet = fleet_for(sc, "fleet")
    fleet.start("a")
    feed = Producer(stack, items, chunk=100, pause_s=0.5).start()
    time.sleep(2)
    fleet.start("b")
    time.sleep(2)
    fleet.start("c")
    time.sleep(2)
    fleet.stop("a")
    feed.join()
    figures = finish_and_compare(sc, fleet)
    report("add b, add c, remove a (mid-stream)", figures)


def test_broker_restart_mid_stream(stack, unique):
    items = stream_of(f"broker-{unique}", users=24, n=2000, seed=9)
    sc = begin(stack, f"broker-{unique}", items)
    fleet = fleet_for(sc, "fleet")
    fleet.start("a")
    fleet.start("b")
    feed = Producer(stack, items, chunk=100, pause_s=0.5).start()
    time.sleep(4)
    pid = devstack.KAFKA.pid(stack)
    assert pid is not None, "the test broker is not running"
    devstack._stop_pid(pid, "kafka")
    devstack.KAFKA.pid_file(stack).unlink(missing_ok=True)
    time.sleep(2)
    devstack.up(stack)
    feed.join()
    figures = finish_and_compare(sc, fleet)
    report("broker restart (2 workers)", figures)


def test_failover_to_a_standby_replica(stack, unique):
    """Two workers with a standby replica each; one is killed and never comes back. The
    survivor takes over its partitions from its standby copy: time to the first answer for a
    user of the dead worker's partitions, and how much changelog it had to read."""
    items = stream_of(f"failover-{unique}", users=24, n=1500, seed=10)
    sc = begin(stack, f"failover-{unique}", items)
    fleet = fleet_for(sc, "fleet")
    fleet.start("a")
    fleet.start("b")
    Producer(stack, items, chunk=500, pause_s=0).start().join()
    fleet.wait_caught_up(kafkatools.end_offsets(stack, INPUTS))
    victim_users = [u for u in sc.users if _owner(fleet, u) == "a"]
    assert victim_users, "worker a owns no user: nothing would fail over"
    probe_user = victim_users[0]
    killed = time.monotonic()
    fleet.kill("a")
    probe = candidate(probe_user, f"failover-{unique}-probe", 1_767_225_600_000 + 10**8, "A brand new probe fact.")
    items.append((probe_user, probe))
    Producer(stack, [(probe_user, probe)], chunk=1, pause_s=0).start().join()
    deadline = time.monotonic() + 120
    while True:
        status, body = http_json(fleet.ports["b"], f"/v1/memory/{probe_user}/nodes", TOKEN)
        if status == 200 and any(n["content"] == probe["content"] for n in body["nodes"]):
            break
        assert time.monotonic() < deadline, "the survivor never took over the dead worker's partitions"
        time.sleep(0.2)
    failover_s = time.monotonic() - killed
    restored = _standby_note(fleet.log_path("b"))
    # the survivor's copy was kept by the standby applier (MEMSTREAM_STANDBY_APPLY=librdkafka, the
    # default), and Faust recovered from the offset it persisted: only the tail is read again
    assert "standby replicas applied by librdkafka" in fleet.log_path("b").read_text(errors="replace")
    assert restored["replayed_at_failover"] <= restored["state_changelog_records"] // 2, restored
    figures = finish_and_compare(sc, fleet)
    report("failover to standby (session timeout 6 s)", {"failover_s": round(failover_s, 1), **restored, **figures})


def _owner(fleet: Fleet, user: str) -> str:
    """Which fleet worker owns the user's partition (the documented assignment view, scope `ops`)."""
    port = next(iter(fleet.ports[n] for n in fleet.procs))
    status, body = http_get(port, f"/v1/memory/{user}/nodes", TOKEN)
    assert status == 200
    owner_port = None
    status, router = http_get(port, "/v1/cluster/assignment", TOKEN)
    assert status == 200
    part = _partition(fleet.settings, user)
    for url, tables in router.items():
        for topic, parts in tables.items():
            if topic.endswith("-memory-state-changelog") and part in parts:
                owner_port = int(url.rsplit(":", 1)[1])
    return next(n for n, p in fleet.ports.items() if p == owner_port)


def _partition(settings: Settings, key: str) -> int:
    from aiokafka.partitioner import murmur2

    return (murmur2(key.encode()) & 0x7FFFFFFF) % settings.partitions


def _standby_note(log: Path) -> dict:
    """From the survivor's last recovery (Faust logs the changelog highwaters and where reading
    starts): memory-state changelog records it had to replay to take over, out of all of them."""
    lines = log.read_text(errors="replace").splitlines()
    high_at = max(i for i, line in enumerate(lines) if "Highwater for active changelog partitions" in line)
    start_at = next(i for i in range(high_at, len(lines)) if "active offsets at start of reading" in lines[i])
    high, start = _changelog_table(lines, high_at + 1), _changelog_table(lines, start_at + 1)
    total = sum(h + 1 for h in high.values())
    replayed = sum(h - start.get(p, -1) for p, h in high.items())
    return {"state_changelog_records": total, "replayed_at_failover": replayed}


def _changelog_table(lines: list[str], at: int) -> dict[int, int]:
    """memory-state changelog rows of one of Faust's recovery tables: partition -> offset."""
    out: dict[int, int] = {}
    topic = ""
    for line in lines[at:]:
        if not line.startswith(("|", "+")):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("+") or len(cells) != 3 or not cells[1].isdigit():
            continue
        topic = topic if cells[0] == "\u3003" else cells[0]
        if topic.endswith("-memory-state-changelog"):
            out[int(cells[1])] = int(cells[2])
    return out
