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

import json
import time
import urllib.request
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from streams.agents import consumed_topics
from streams.contracts import catalog, topics
from streams.contracts.wire import CodecFactory, decode_key
from streams.core.nodes import decayed_confidence
from streams.graphs import samples as graph_samples
from streams.settings import Settings
from streams.tools import devstack, generate, kafkatools, shipper


class DemoError(RuntimeError):
    """The demo could not complete; the message names the log to read."""


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _read_since(s: Settings, start: dict[tuple[str, int], int], name: str, factory: CodecFactory) -> list[tuple]:
    c = Consumer({"bootstrap.servers": s.broker, "group.id": "memstream-demo-reader", "enable.auto.commit": False,
                  "log_level": 0})
    parts = [TopicPartition(t, p, off) for (t, p), off in start.items() if t == name]
    ends = kafkatools.end_offsets(s, [name])
    c.assign(parts)
    codec = factory.codec(catalog.topic(name).value_schema)
    out, remaining = [], {(t, p): ends[(t, p)] for (t, p) in start if t == name and ends[(t, p)] > start[(t, p)]}
    deadline = time.monotonic() + 30
    while remaining and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        key = m.key() if name == catalog.DLQ else decode_key(m.key())
        out.append((key, codec.decode(m.value()) if m.value() is not None else None))  # type: ignore[arg-type]
        if m.offset() + 1 >= remaining.get((m.topic(), m.partition()), 0):  # type: ignore[arg-type, operator]
            remaining.pop((m.topic(), m.partition()), None)  # type: ignore[arg-type]
    c.close()
    return out


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
    in_start = kafkatools.end_offsets(s, inputs)
    out_start = kafkatools.end_offsets(s, outputs)

    app_id = f"memstream-demo-{int(time.time())}"
    # Position the new group at the current end of the inputs: only this run's records count.
    kafkatools.position_group(s, app_id, in_start)

    _say(f"\n== 2. worker (app id {app_id})")
    log_path = Path(s.stack_dir) / "logs" / "demo-worker.log"
    worker = kafkatools.start_worker(s, app_id, log_path, {"MEMSTREAM_API_TOKENS": DEMO_TOKEN,
                                                           "MEMSTREAM_TIMER_INTERVAL_S": str(HOUSEKEEPING_S)})
    try:
        _say(f"worker ready (log {log_path}; HTTP API on {s.web_host}:{s.web_port})")

        _say("\n== 3. sample data (memstream generate, seed 7, clock starting yesterday)")
        epoch = (int(time.time() * 1000) // HOUR - 24) * HOUR
        items = generate.generate(seed=7, epoch_ms=epoch, kinds=("memory", "negotiator", "sessions", "garbage"))
        items += _expired_memories(items, epoch)
        generate.produce(items, s)
        _say(f"produced {len(items)} records: " + ", ".join(f"{n} {t}" for t, n in Counter(i.topic for i in items).items()))
        log_dir = Path("var") / app_id / "graph-logs"
        runs = graph_samples.generate_graph_runs(7)
        graph_samples.write_run_files(log_dir, runs)
        shipped = shipper.ship_directory(log_dir, s, offsets_path=str(Path("var") / app_id / "shipper.offsets.json"))
        _say(f"memstream ship-graph-logs {log_dir}: {shipped.files} files, {shipped.events} graph events shipped")
        in_end = kafkatools.end_offsets(s, inputs)

        _say("\n== 4. processing")
        consumed = {tp: off for tp, off in in_end.items() if tp[0] in consumed_topics()}
        deadline = time.monotonic() + 180
        last = None
        while (lag := kafkatools.group_lag(s, app_id, consumed)) > 0:
            if worker.poll() is not None:
                raise DemoError(f"the worker exited {worker.returncode}; read {log_path}")
            if time.monotonic() > deadline:
                raise DemoError(f"the worker still has {lag} records to process after 180s; read {log_path}")
            if lag != last:
                _say(f"  … {lag} records left")
                last = lag
            time.sleep(1)
        time.sleep(1)
        show_api(s, items)
    finally:
        kafkatools.stop_worker(worker)

    _say("\n== 5. what came out")
    results = {name: _read_since(s, out_start, name, factory) for name in outputs}
    for name in outputs:
        _say(f"{name:26} {len(results[name]):5} records")
    show_results(results)
    _say("\nThe stack is still up: `memstream dev down` stops it.")
    return 0


DEMO_TOKEN = "demo-token:personal"
HOUR = 3_600_000
HOUSEKEEPING_S = 2


def _expired_memories(items: list, epoch: int) -> list:
    """One 400-day-old personal memory per user: past its retention, housekeeping deletes it."""
    users = sorted({i.key for i in items if i.topic == catalog.MEMORY_CANDIDATES})
    return [generate.Item(catalog.MEMORY_CANDIDATES, u, generate._candidate(
        u, f"{u}-old-address", epoch - 400 * 24 * HOUR, "The user lived on Elm Street in 2025.", "personal", "semantic"))
        for u in users]


def show_api(s: Settings, items: list) -> None:
    """One query of the HTTP API, as a backend would make it (token allowed up to `personal`)."""
    user = next(i.key for i in items if i.topic == catalog.MEMORY_CANDIDATES)
    url = f"http://{s.web_host}:{s.web_port}/v1/memory/{user}/nodes"
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + DEMO_TOKEN.split(":")[0]})
    with urllib.request.urlopen(req, timeout=10) as r:
        nodes = json.loads(r.read())["nodes"]
    _say(f"\n-- GET {url}  (token may read up to 'personal')")
    for n in nodes[:6]:
        _say(f"  [{n['sensitivity']:9}] {n['content'][:80]}")
    redacted = sum(1 for n in nodes if n.get("redacted"))
    _say(f"  … {len(nodes)} live nodes, {redacted} shown as [REDACTED] (medical/financial above the token's level)")


def show_memory(results: dict[str, list[tuple]]) -> None:
    ledger = [v for _k, v in results.get(catalog.MEMORY_LEDGER, [])]
    if not ledger:
        return
    actions = Counter(e["payload"]["action"] for e in ledger if e["event_type"] == "memory_consolidated")
    kinds = Counter(e["event_type"] for e in ledger)
    _say("\n-- consolidation (memory.ledger.v1)")
    _say("  decisions: " + ", ".join(f"{a} {actions.get(a, 0)}" for a in ("accept", "merge", "supersede", "reject")))
    _say(f"  promoted: {kinds.get('memory_promoted', 0)}   formed: {kinds.get('memory_formed', 0)}   "
         f"quarantined: {len(results.get(catalog.MEMORY_QUARANTINE, []))}   ledger events: {len(ledger)}")
    for e in ledger:
        p = e["payload"]
        if e["event_type"] == "memory_consolidated" and p["action"] in ("supersede", "reject"):
            _say(f"  {e['motebit_id']}: {p['action']:9} {p['reason'][:100]}")
            break
    for e in ledger:
        if e["event_type"] == "memory_promoted":
            p = e["payload"]
            _say(f"  {e['motebit_id']}: promoted {p['node_id'][:8]}… after {p['reinforcement_count']} reinforcements "
                 f"(confidence {p['from_confidence']:.3f} → {p['to_confidence']})")
            break
    for _k, q in results.get(catalog.MEMORY_QUARANTINE, [])[:3]:
        _say(f"  {q['motebit_id']}: quarantined \"{q['candidate']['content']}\" ({q['reason'][:70]})")
    nodes: dict[str, dict | None] = {}
    for key, value in results.get(catalog.MEMORY_NODES, []):
        nodes[key] = value
    live = [n for n in nodes.values() if n is not None and n["valid_until"] is None]
    if live:
        user = sorted(live, key=lambda n: n["motebit_id"])[0]["motebit_id"]
        _say(f"\n-- memory.nodes.v1: {len(live)} live nodes, {sum(v is None for v in nodes.values())} deleted; {user}'s:")
        for n in sorted((n for n in live if n["motebit_id"] == user), key=lambda n: -n["confidence"]):
            flags = "".join([" promoted" if n["promoted"] else "", " pinned" if n["pinned"] else "",
                             " instruction" if n["instruction_form"] else ""])
            _say(f"  [{n['sensitivity']:9}] conf {n['confidence']:.2f} x{n['reinforcement_count']}{flags}: {n['content'][:70]}")


def show_lifecycle(results: dict[str, list[tuple]]) -> None:
    ledger = [v for _k, v in results.get(catalog.MEMORY_LEDGER, [])]
    relay = [v for _k, v in results.get(catalog.MEMORY_RELAY, [])]
    if not ledger:
        return
    now = int(time.time() * 1000)
    nodes: dict[str, dict | None] = {}
    for key, value in results.get(catalog.MEMORY_NODES, []):
        nodes[key] = value
    live = [n for n in nodes.values() if n is not None and n["valid_until"] is None]
    _say("\n-- decay: confidence now = c · 0.5^(elapsed / half-life) (pruned under 0.5 unless pinned)")
    for n in sorted(live, key=lambda n: n["half_life_ms"])[:4]:
        _say(f"  {n['memory_type']:8} half-life {n['half_life_ms'] / 86_400_000:5.1f} d: stored {n['confidence']:.2f} → "
             f"now {decayed_confidence(n, now):.2f}  {n['content'][:60]}")
    housekept = [e for e in ledger if e["event_type"] == "memory_deleted" and e["device_id"] is None]
    _say(f"  housekeeping deleted {len(housekept)} expired nodes (400-day-old personal memories: retention 365 d)")

    _say("\n-- the ledger vs what a sync peer sees (memory.relay.v1, threshold 'personal')")
    by_id = {e["event_id"]: e for e in relay}
    shown = 0
    for e in ledger:
        p = e["payload"]
        if e["event_type"] == "memory_formed" and p.get("sensitivity") in ("medical", "financial") and shown < 2:
            r = by_id.get(e["event_id"], {}).get("payload", {})
            _say(f"  ledger: [{p['sensitivity']}] {p['content'][:60]}")
            _say(f"  relay:  content={r.get('content')!r} redacted={r.get('redacted')} redacted_sensitivity={r.get('redacted_sensitivity')}")
            shown += 1
    tomb = next((e for e in relay if e["event_type"] == "memory_formed" and e["payload"].get("redacted_reason") == "deleted"), None)
    if tomb:
        _say(f"  deletion tombstone on the relay: node {tomb['payload']['node_id'][:8]}… content={tomb['payload']['content']!r} "
             f"redacted_reason={tomb['payload']['redacted_reason']!r}")
    audits_ledger = [e for e in ledger if e["event_type"] == "memory_audit"]
    _say(f"  memory_audit: {len(audits_ledger)} on the ledger, {sum(e['event_type'] == 'memory_audit' for e in relay)} on the relay (local-only)")
    if audits_ledger:
        _say(f"  audit finding: {audits_ledger[0]['payload']['missed_patterns']}")

    replies = [v for _k, v in results.get(catalog.NEGOTIATOR_REPLIES, [])]
    if replies:
        _say("\n-- negotiator remember / forget (negotiator.replies.v1)")
        for r in replies[:7]:
            if r["op"] == "remember":
                view = r["remembered"]
                _say(f"  remember → {view['kind']}: {view['content'][:60]}" if view else f"  remember → {r['error'] or 'null'}")
            else:
                f = r["forget"] or {}
                detail = (f.get("memory") or {}).get("content") or ", ".join(c["content"][:30] for c in f.get("candidates") or [])
                _say(f"  forget   → {f.get('status')} {detail[:80]}")


def show_sessions(results: dict[str, list[tuple]]) -> None:
    ledgers: dict[str, dict] = {}
    for key, value in results.get(catalog.SESSION_COMPACTIONS, []):
        ledgers[key] = value
    if not ledgers:
        return
    _say("\n-- session compaction ledgers (session.compactions.v1, latest per session)")
    for sid, led in sorted(ledgers.items()):
        models = sorted({c["model"] for c in led["compactions"] if c.get("model")})
        _say(f"  {sid}: {len(led['compactions'])} compactions, tokens removed {led['tokensRemoved']} added {led['tokensAdded']} "
             f"saved {led['tokensSaved']}, violations {led['violationCount']}, models {models}")


def show_analytics(results: dict[str, list[tuple]]) -> None:
    latest: dict[tuple, dict] = {}
    for key, rec in results.get(catalog.MEMORY_ANALYTICS, []):
        latest[(key, rec["window"], rec["window_start"])] = rec
    hours = [(k, r) for k, r in latest.items() if k[1] == "hour" and not k[0].startswith(("session:", "graph:"))]
    if not hours:
        return
    cols = ("formed", "merged", "superseded", "promoted", "redacted", "quarantined", "deleted", "dead_lettered")
    totals = {c: 0 for c in cols}
    for (_user, _w, _start), rec in hours:
        for c in cols:
            totals[c] += rec[c]
    minutes = sum(1 for k in latest if k[1] == "minute")
    _say(f"\n-- analytics (memory.analytics.v1, event-time windows): {minutes} minute and {len(hours)} hour windows "
         "for users; totals over the hour windows:")
    _say("  " + "  ".join(f"{c} {totals[c]}" for c in cols))


def show_results(results: dict[str, list[tuple]]) -> None:
    show_memory(results)
    show_lifecycle(results)
    show_analytics(results)
    show_sessions(results)
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
