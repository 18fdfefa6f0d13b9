"""`memstream demo` (behind `make demo`): the main job on the local default, end to end.

1. `dev up` (fetches Kafka and the registry on first use) and `topics apply`;
2. starts one `memstream worker` with a fresh app id (so its tables start empty) whose consumer
   group is positioned at the current end of the input topics — earlier runs' records are left
   alone, nothing is wiped;
3. produces the generated sample stream (`memstream generate`, seed 7);
4. waits until the worker has consumed everything, then prints what came out of each output
   topic since the run started, and stops the worker. The stack stays up (`memstream dev down`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from . import catalog, devstack, generate, topics
from .agents import consumed_topics
from .settings import Settings
from .wire import CodecFactory, decode_key


class DemoError(RuntimeError):
    """The demo could not complete; the message names the log to read."""


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _end_offsets(consumer: Consumer, names: list[str]) -> dict[tuple[str, int], int]:
    out = {}
    md = consumer.list_topics(timeout=10)
    for name in names:
        for p in md.topics[name].partitions:
            _low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            out[(name, p)] = high
    return out


def _read_since(s: Settings, start: dict[tuple[str, int], int], name: str, factory: CodecFactory) -> list[tuple]:
    c = Consumer({"bootstrap.servers": s.broker, "group.id": "memstream-demo-reader", "enable.auto.commit": False,
                  "log_level": 0})
    parts = [TopicPartition(t, p, off) for (t, p), off in start.items() if t == name]
    ends = _end_offsets(c, [name])
    c.assign(parts)
    codec = factory.codec(catalog.topic(name).value_schema)
    out, remaining = [], {(t, p): ends[(t, p)] for (t, p) in start if t == name and ends[(t, p)] > start[(t, p)]}
    deadline = time.monotonic() + 30
    while remaining and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        key = m.key() if name == catalog.DLQ else decode_key(m.key())
        out.append((key, codec.decode(m.value()) if m.value() is not None else None))
        if m.offset() + 1 >= remaining.get((m.topic(), m.partition()), 0):
            remaining.pop((m.topic(), m.partition()), None)
    c.close()
    return out


def _group_lag(s: Settings, group: str, ends: dict[tuple[str, int], int]) -> int:
    c = Consumer({"bootstrap.servers": s.broker, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    committed = c.committed([TopicPartition(t, p) for (t, p) in ends], timeout=10)
    c.close()
    return sum(max(ends[(tp.topic, tp.partition)] - max(tp.offset, 0), 0) for tp in committed)


def run(s: Settings) -> int:
    _say("== 1. local stack")
    devstack.up(s)
    report = topics.apply(s)
    if not report.ok:
        raise topics.TopicError("; ".join(map(str, report.drift)))
    _say(f"topics: {len(report.created)} created, {len(report.existing)} already there")

    factory = CodecFactory.from_url(s.registry_url)
    factory.register([t.name for t in catalog.topics()])
    inputs = [t.name for t in catalog.topics() if t.direction == "in"]
    outputs = [t.name for t in catalog.topics() if t.direction == "out"]
    probe = Consumer({"bootstrap.servers": s.broker, "group.id": "memstream-demo-probe", "log_level": 0})
    in_start = _end_offsets(probe, inputs)
    out_start = _end_offsets(probe, outputs)
    probe.close()

    app_id = f"memstream-demo-{int(time.time())}"
    # Position the new group at the current end of the inputs: only this run's records count.
    positioner = Consumer({"bootstrap.servers": s.broker, "group.id": app_id, "log_level": 0})
    positioner.commit(offsets=[TopicPartition(t, p, off) for (t, p), off in in_start.items()], asynchronous=False)
    positioner.close()

    _say(f"\n== 2. worker (app id {app_id})")
    log_path = Path(s.stack_dir) / "logs" / "demo-worker.log"
    env = {**os.environ, "MEMSTREAM_APP_ID": app_id, "MEMSTREAM_DATA_DIR": str(Path("var") / app_id),
           "MEMSTREAM_BROKER": s.broker, "MEMSTREAM_REGISTRY_URL": s.registry_url}
    with open(log_path, "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "streams", "worker"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        _wait_ready(worker, log_path)
        _say(f"worker ready (log {log_path})")

        _say("\n== 3. sample data (memstream generate, seed 7)")
        items = generate.generate(seed=7)
        generate.produce(items, s)
        in_end = {}
        probe = Consumer({"bootstrap.servers": s.broker, "group.id": "memstream-demo-probe", "log_level": 0})
        in_end = _end_offsets(probe, inputs)
        probe.close()
        _say(f"produced {len(items)} records: " + ", ".join(f"{n} {t}" for t, n in Counter(i.topic for i in items).items()))

        _say("\n== 4. processing")
        consumed = {tp: off for tp, off in in_end.items() if tp[0] in consumed_topics()}
        deadline = time.monotonic() + 180
        last = None
        while (lag := _group_lag(s, app_id, consumed)) > 0:
            if worker.poll() is not None:
                raise DemoError(f"the worker exited {worker.returncode}; read {log_path}")
            if time.monotonic() > deadline:
                raise DemoError(f"the worker still has {lag} records to process after 180s; read {log_path}")
            if lag != last:
                _say(f"  … {lag} records left")
                last = lag
            time.sleep(1)
        time.sleep(1)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()

    _say("\n== 5. what came out")
    results = {name: _read_since(s, out_start, name, factory) for name in outputs}
    for name in outputs:
        _say(f"{name:26} {len(results[name]):5} records")
    show_results(results)
    _say("\nThe stack is still up: `memstream dev down` stops it.")
    return 0


def _wait_ready(worker: subprocess.Popen, log_path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while b"Worker]: Ready" not in log_path.read_bytes():
        if worker.poll() is not None:
            raise DemoError(f"the worker exited {worker.returncode} during start-up; read {log_path}")
        if time.monotonic() > deadline:
            raise DemoError(f"the worker was not ready after {timeout:.0f}s; read {log_path}")
        time.sleep(0.3)


def show_results(results: dict[str, list[tuple]]) -> None:
    graphs = {}
    for key, value in results.get(catalog.GRAPH_STATE, []):
        graphs[key] = value
    if graphs:
        _say("\n-- graph execution state (graph.state.v1, latest per graph)")
        for gid, st in sorted(graphs.items()):
            budget = st["budget"] or {}
            statuses = Counter(n["status"] for n in st["nodes"])
            _say(f"  {gid}: phase={st['phase']:9} nodes={dict(statuses)} cost=${budget.get('costUsd', 0):.3f} "
                 f"tokens in/out={budget.get('inputTokens', 0)}/{budget.get('outputTokens', 0)} "
                 f"degraded={st['degradedNotifications']} stalled={st['stalledNodes']}")
    letters = results.get(catalog.DLQ, [])
    if letters:
        _say("\n-- dead letters (pipeline.dlq.v1): nothing is dropped silently")
        for _key, d in letters[:12]:
            _say(f"  {d['original_topic']}@{d['original_partition']}:{d['original_offset']} [{d['stage']}] {d['reason'][:110]}")
        if len(letters) > 12:
            _say(f"  … and {len(letters) - 12} more")
