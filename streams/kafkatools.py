"""Small Kafka helpers shared by the demo and the benchmarks (confluent-kafka, not Faust)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from .settings import Settings

Offsets = dict[tuple[str, int], int]


def consumer(settings: Settings, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False,
                     "log_level": 0})


def end_offsets(settings: Settings, topics: list[str]) -> Offsets:
    """The high watermark of every partition of `topics`."""
    c = consumer(settings, "memstream-probe")
    try:
        md = c.list_topics(timeout=10)
        out = {}
        for name in topics:
            for p in md.topics[name].partitions:
                _low, high = c.get_watermark_offsets(TopicPartition(name, p), timeout=10)
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
    """Records of `ends` the group has not committed yet."""
    c = consumer(settings, group)
    try:
        committed = c.committed([TopicPartition(t, p) for (t, p) in ends], timeout=10)
    finally:
        c.close()
    return sum(max(ends[(tp.topic, tp.partition)] - max(tp.offset, 0), 0) for tp in committed)


def start_worker(settings: Settings, app_id: str, log_path: Path, extra_env: dict[str, str] | None = None,
                 timeout: float = 120) -> subprocess.Popen:
    """A `memstream worker` subprocess; returns once the Faust worker says it is ready."""
    env = {**os.environ, "MEMSTREAM_APP_ID": app_id, "MEMSTREAM_DATA_DIR": str(Path("var") / app_id),
           "MEMSTREAM_BROKER": settings.broker, "MEMSTREAM_REGISTRY_URL": settings.registry_url, **(extra_env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streams", "worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while b"Worker]: Ready" not in log_path.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited {proc.returncode} during start-up; read {log_path}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the worker was not ready after {timeout:.0f}s; read {log_path}")
        time.sleep(0.2)
    return proc


def stop_worker(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
