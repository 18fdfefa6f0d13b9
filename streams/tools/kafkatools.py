"""Small Kafka helpers shared by the demo and the benchmarks (confluent-kafka, not Faust)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from streams.runtime.retry import retrying
from streams.settings import Settings

KAFKA_TIMEOUT_S = 15.0  #: operator commands' limit on one broker call


class OpsError(Exception):
    """A failure the operator can act on (broker unreachable, bad option): reported in one line."""


def kafka_error(settings: Settings, exc: BaseException) -> OpsError:
    return OpsError(f"cannot reach Kafka at {settings.broker} ({exc}); is the stack up? (`memstream dev status`)")

Offsets = dict[tuple[str, int], int]


def consumer(settings: Settings, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False,
                     "log_level": 0})


def end_offsets(settings: Settings, topics: list[str]) -> Offsets:
    """The high watermark of every partition of `topics` (transient broker errors retried)."""
    c = consumer(settings, "memstream-probe")
    try:
        md = retrying(lambda: c.list_topics(timeout=10), "list topics")
        out = {}
        for name in topics:
            for p in md.topics[name].partitions:
                tp = TopicPartition(name, p)
                _low, high = retrying(lambda: c.get_watermark_offsets(tp, timeout=10), f"end of {name}[{p}]")  # noqa: B023 -- called in this iteration
                out[(name, p)] = high
        return out
    finally:
        c.close()


def position_group(settings: Settings, group: str, offsets: Offsets) -> None:
    """Commit `offsets` for a consumer group that has not started yet (it then starts there)."""
    c = consumer(settings, group)
    try:
        c.commit(offsets=[TopicPartition(t, p, off) for (t, p), off in offsets.items()], asynchronous=False)
    finally:
        c.close()


def group_lag(settings: Settings, group: str, ends: Offsets) -> int:
    """Records of `ends` the group has not committed yet. A partition whose only offsets past the
    group's commit are transaction markers (a topic written in transactions, e.g. by
    `ship-graph-logs`, ends with a commit marker no consumer ever commits past) has no lag."""
    c = consumer(settings, group)
    try:
        committed = retrying(lambda: c.committed([TopicPartition(t, p) for (t, p) in ends], timeout=10),
                             f"committed offsets of {group}")
    finally:
        c.close()
    behind = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in committed
              if ends[(tp.topic, tp.partition)] > max(tp.offset, 0)}
    return sum(ends[tp] - off for tp, off in behind.items() if not only_markers(settings, tp, off, ends[tp]))


def only_markers(settings: Settings, tp: tuple[str, int], start: int, end: int, timeout: float = 3.0) -> bool:
    """True when a read_committed reader finds no record in [start, end) of the partition (only
    transaction markers, or aborted records); False when it finds one or cannot tell in time."""
    if end - start > 16:  # markers come one per transaction: a longer stretch holds records
        return False
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": "memstream-probe", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "log_level": 0})
    try:
        c.assign([TopicPartition(tp[0], tp[1], start)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is not None and not msg.error() and msg.offset() < end:  # type: ignore[operator]
                return False
            if c.position([TopicPartition(tp[0], tp[1])])[0].offset >= end:
                return True
        return False
    finally:
        c.close()


def last_timestamp_ms(settings: Settings, since: Offsets, timeout: float = 30) -> int | None:
    """The newest record timestamp among the records appended to the partitions of `since` after
    those offsets (the last record of each partition that grew), or None when none grew."""
    ends = end_offsets(settings, sorted({topic for topic, _ in since}))
    grown = [TopicPartition(t, p, ends[(t, p)] - 1) for (t, p), off in since.items() if ends[(t, p)] > off]
    if not grown:
        return None
    c = consumer(settings, "memstream-probe")
    pending = {(tp.topic, tp.partition) for tp in grown}
    newest = 0
    try:
        c.assign(grown)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                pending.discard((msg.topic(), msg.partition()))
                newest = max(newest, msg.timestamp()[1])
    finally:
        c.close()
    if pending:
        raise RuntimeError(f"could not read the last record of {len(pending)} partition(s) within {timeout:.0f}s")
    return newest


def spawn_worker(settings: Settings, app_id: str, log_path: Path,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """A `memstream worker` subprocess, not waited for (its data dir is var/<app_id> unless
    `extra_env` names another)."""
    env = {**os.environ, "MEMSTREAM_APP_ID": app_id, "MEMSTREAM_DATA_DIR": str(Path("var") / app_id),
           "MEMSTREAM_BROKER": settings.broker, "MEMSTREAM_REGISTRY_URL": settings.registry_url, **(extra_env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "streams", "worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def start_worker(settings: Settings, app_id: str, log_path: Path, extra_env: dict[str, str] | None = None,
                 timeout: float = 120) -> subprocess.Popen:
    """A `memstream worker` subprocess; returns once the Faust worker says it is ready."""
    proc = spawn_worker(settings, app_id, log_path, extra_env)
    deadline = time.monotonic() + timeout
    while b"Worker]: Ready" not in log_path.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited {proc.returncode} during start-up; read {log_path}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the worker was not ready after {timeout:.0f}s; read {log_path}")
        time.sleep(0.2)
    return proc


def worker_health(port: int, host: str = "127.0.0.1", timeout: float = 5) -> dict | None:
    """The body of a worker's `GET /health` (ready or not), or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:  # 503 while not ready: the body says why
        body = exc.read()
    except OSError:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used so far."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU time in a /proc `stat` file (a process's, or a thread's under `task/`)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM line")


def stop_worker(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def largest_records(settings: Settings, topics: list[str], timeout: float = 120) -> dict[str, tuple[int, str]]:
    """The largest record (key + value + headers, bytes) of each topic: {topic: (size, where)},
    `where` = "partition@offset". Reads every partition from its start to its current end."""
    ends = end_offsets(settings, topics)
    c = consumer(settings, "memstream-size-probe")
    out: dict[str, tuple[int, str]] = {t: (0, "-") for t in topics}
    try:
        todo = {tp: end for tp, end in ends.items() if end > 0}
        c.assign([TopicPartition(t, p, 0) for (t, p) in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error():
                for (t, p), end in list(todo.items()):  # a transaction marker ends some partitions
                    if c.position([TopicPartition(t, p)])[0].offset >= end:
                        todo.pop((t, p))
                continue
            tp = (msg.topic(), msg.partition())
            size = len(msg.key() or b"") + len(msg.value() or b"") + sum(len(k) + len(v or b"") for k, v in msg.headers() or [])  # type: ignore[misc, str-unpack]
            if size > out[msg.topic()][0]:  # type: ignore[index]
                out[msg.topic()] = (size, f"{msg.partition()}@{msg.offset()}")  # type: ignore[index]
            if msg.offset() + 1 >= todo.get(tp, 0):  # type: ignore[arg-type, operator]
                todo.pop(tp, None)  # type: ignore[arg-type]
    finally:
        c.close()
    return out
