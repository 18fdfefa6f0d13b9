"""The operator's view of one worker (`blueprint`, area "health"): `GET /metrics` (Prometheus),
`GET /health` and `GET /v1/cluster/assignment` (scope `ops`).

Both are served by every worker on its web port WITHOUT authentication, so that Prometheus and a
load balancer / orchestrator can call them: they expose counts, offsets and table sizes, never
record content, keys or user ids (the `/v1/...` API keeps its bearer tokens).

`/metrics` answers prometheus_client's `generate_latest` of the Runtime's own registry
(`Runtime.metrics.registry`, see streams/runtime/metrics.py): its counters, gauges and latency histogram,
and `WorkerCollector`, a collector of what Faust knows at scrape time:

- `memstream_consumer_committed_offset`, `memstream_consumer_highwater`, `memstream_consumer_lag`
  {topic, partition}: for each stream-source partition this worker owns (its active assignment
  less table changelogs and Faust's leader topic: the catalog inputs and internal tick topics) the offset Faust last committed for the group, the partition's high watermark (from
  the last fetch response, else asked from the broker) and their difference. Before the group has
  committed anything on a partition the log start offset stands in for the committed offset.
- `memstream_table_keys{table}`: keys of each table in this worker's active partitions (RocksDB
  counts by iterating its keys, so when that takes over 50 ms the figure is cached for
  `TABLE_SIZE_TTL_S`; the `memory://` store also counts the keys of its standby partitions).
- `memstream_rocksdb_memory_bytes{kind}`: memory RocksDB holds for the tables' open partition
  stores (standby copies included), by kind: `memtables`, `block_cache`, `table_readers` (each
  store's are bounded by MEMSTREAM_ROCKSDB_*; the sum grows with the stores a worker holds), and
  `memstream_python_allocated_blocks` (the interpreter's objects): what a worker's RSS is made of.
- `memstream_recovery_in_progress`, `memstream_recovery_active_remaining_offsets`,
  `memstream_recovery_standby_remaining_offsets`, `memstream_ready`, `memstream_rebalancing`,
  `memstream_assigned_partitions{kind=active|standby}`.

The collector's `collect()` is synchronous (prometheus_client calls it inside `generate_latest`):
it reads health and table sizes then; the offsets it may have to ask the broker for are fetched
by the view just before (`WorkerCollector.refresh`).

`/health` (also `/health/ready`: readiness) answers 200 `{"status": "ready", ...}` once the worker
is running, its first table recovery has completed and it is neither recovering nor rebalancing;
otherwise 503 `{"status": "starting"|"recovering"|"rebalancing"|"stopping"|"blocked", "reason": ...}`.
`problems` lists what is wrong (streams/runtime/probe.py REASONS), each with a detail and whether it
blocks: `registry_mismatch`, `broker_unreachable`, `recovery_stuck`, `agent_stalled` (and
`disk_full`, though the worker exits on it) make a ready worker `blocked` (503);
`registry_unreachable` alone leaves it ready (known schemas need no registry) and is named in the
reason. `memstream_health_problem{reason}` carries the same. `/health/live` answers 200 while the
process and its event loop answer (liveness).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from faust.types import TP
from faust.web import Blueprint, Request, Response, View
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streams.api.http import SCOPE_OPS, ApiView, authenticated, runtime_of
from streams.runtime import faust_internals
from streams.runtime.faust_internals import committed_offset
from streams.runtime.metrics import CONTENT_TYPE, metric_name

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.ops")

TABLE_SIZE_TTL_S = 15.0
#: a count of every table's rows that took longer than this is reused for TABLE_SIZE_TTL_S: a
#: RocksDB store counts by iterating its keys, on the event loop, and a scraper polling /metrics
#: often (the bench's same-job run polled every 50 ms) made that ~5% of a worker's main thread
TABLE_SIZE_CHEAP_S = 0.002
BROKER_TIMEOUT_S = 5.0


@dataclass
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    highwater: int | None

    @property
    def lag(self) -> int | None:
        if self.committed is None or self.highwater is None:
            return None
        return max(self.highwater - self.committed, 0)


@dataclass
class Health:
    status: str  # ready | starting | recovering | rebalancing | stopping
    reason: str
    worker: str
    url: str
    recovery_in_progress: bool
    recovery_completed: bool
    active_remaining: int
    standby_remaining: int
    rebalancing: bool
    sources: list[str] = field(default_factory=list)  # owned stream-source partitions, `topic[p]`
    active_partitions: int = 0  # every active partition (sources, changelogs, internal topics)
    standby_partitions: int = 0  # standby changelog partitions (table replicas)
    #: what is wrong, each {"reason": one of streams.runtime.probe.REASONS, "detail": ..., "blocking": bool}
    problems: list[dict] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.status == "ready"


#: problems that stop a worker from doing its work (503); the others leave it ready but degraded
BLOCKING = frozenset({"registry_mismatch", "broker_unreachable", "disk_full", "recovery_stuck", "agent_stalled"})


def problem(reason: str, detail: str) -> dict:
    return {"reason": reason, "detail": detail, "blocking": reason in BLOCKING}


def judge(status: str, reason: str, problems: list[dict]) -> tuple[str, str]:
    """The /health status and reason, given the lifecycle state and what is wrong: a blocking
    problem turns a ready worker `blocked` and names itself; any problem is named in the reason."""
    blocking = [p for p in problems if p["blocking"]]
    if status == "ready" and blocking:
        status = "blocked"
    if problems:
        reason = "; ".join(f"{p['reason']}: {p['detail']}" for p in (blocking or problems)) + (
            f" ({reason})" if status != "blocked" else "")
    return status, reason


def _problems(rt: Runtime, in_recovery: bool, remaining: int) -> list[dict]:
    out: list[dict] = []
    probe = getattr(rt, "probe", None)
    if probe is not None:
        if probe.mismatched:
            out.append(problem("registry_mismatch", "; ".join(map(str, probe.mismatched[:3])) +
                               " - not consuming until the registry maps them as before"))
        if (registry := probe.registry_problem()) is not None:
            out.append(problem("registry_unreachable", registry))
        if probe.broker_error:
            out.append(problem("broker_unreachable", probe.broker_error))
    now = time.monotonic()
    for _topic, (since, why) in sorted(getattr(rt, "stalls", {}).items()):
        out.append(problem("agent_stalled", f"{why}, for {now - since:.0f} s"))
    stall_s = getattr(getattr(rt, "settings", None), "recovery_stall_s", 120.0)
    last = getattr(rt, "recovery_progress", None)
    if not in_recovery:
        rt.recovery_progress = None
    elif last is None or last[0] != remaining:
        rt.recovery_progress = (remaining, now)
    elif now - last[1] >= stall_s:
        out.append(problem("recovery_stuck", f"table recovery made no progress for {now - last[1]:.0f} s "
                                             f"({remaining} offsets left)"))
    return out


def _tp_names(tps) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)]


LEADER_TOPIC_SUFFIX = "-__assignor-__leader"  # Faust's leader-election topic: never carries records


def _sources(app, tps) -> list[TP]:
    """The partitions of `tps` that are stream sources (no table changelogs, no leader topic)."""
    changelogs = set(app.tables.changelog_topics)
    return sorted(tp for tp in tps if tp.topic not in changelogs and not tp.topic.endswith(LEADER_TOPIC_SUFFIX))


def health(rt: Runtime) -> Health:
    app = rt.app
    recovery = app.tables.recovery  # type: ignore[attr-defined]
    completed = recovery.completed.is_set()
    in_recovery = bool(recovery.in_recovery)
    active_remaining = int(recovery.active_remaining_total())
    standby_remaining = rt.standby_remaining()
    rebalancing = bool(getattr(app, "rebalancing", False))
    actives, standbys = app.assignor.assigned_actives(), app.assignor.assigned_standbys()
    sources = _sources(app, actives)
    if app.should_stop:
        status, reason = "stopping", "the worker is shutting down"
    elif not app.started:
        status, reason = "starting", "the worker is starting"
    elif in_recovery:
        status, reason = "recovering", f"recovering: {active_remaining} offsets left"
    elif rebalancing:
        status, reason = "rebalancing", "rebalancing: partitions are moving between workers"
    elif not completed:
        status, reason = "starting", "waiting for the first partition assignment and table recovery"
    else:
        status, reason = "ready", (f"{len(sources)} source partitions, {len(actives) - len(sources)} active and "
                                   f"{len(standbys)} standby table/internal partitions; tables recovered")
    problems = _problems(rt, in_recovery, active_remaining)
    status, reason = judge(status, reason, problems)
    return Health(status=status, reason=reason, worker=rt.worker_name, url=str(app.conf.canonical_url),
                  recovery_in_progress=in_recovery, recovery_completed=completed,
                  active_remaining=active_remaining, standby_remaining=standby_remaining,
                  rebalancing=rebalancing, sources=_tp_names(sources), active_partitions=len(actives),
                  standby_partitions=len(standbys), problems=problems)


async def consumer_lag(rt: Runtime) -> list[PartitionLag]:
    """Committed offset and high watermark of every input partition this worker owns."""
    app = rt.app
    tps = _sources(app, app.assignor.assigned_actives())
    if not tps:
        return []
    consumer = app.consumer
    out: dict[TP, PartitionLag] = {}
    for tp in tps:
        committed = rt.input_committed(tp)  # an input fetched outside Faust (direct_input.py)
        if committed is None:
            committed = committed_offset(consumer, tp)
        try:  # a partition fetched outside Faust: aiokafka's high watermark is stale (asked below)
            highwater = None if rt.input_claims((tp,)) else consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - not assigned in aiokafka (yet): ask the broker below
            highwater = None
        out[tp] = PartitionLag(tp.topic, tp.partition, committed, highwater)
    missing_hw = [tp for tp, p in out.items() if p.highwater is None]
    missing_committed = [tp for tp, p in out.items() if p.committed is None]
    try:
        if missing_hw:
            for tp, hw in (await asyncio.wait_for(consumer.highwaters(*missing_hw), BROKER_TIMEOUT_S)).items():
                out[TP(tp.topic, tp.partition)].highwater = hw
        if missing_committed:
            # nothing committed yet (Faust also maps a committed 0 to None): the log start offset
            earliest = await asyncio.wait_for(consumer.earliest_offsets(*missing_committed), BROKER_TIMEOUT_S)
            for tp, off in earliest.items():
                out[TP(tp.topic, tp.partition)].committed = off
    except Exception as exc:  # noqa: BLE001 - a scrape must answer even when the broker is slow
        log.warning("consumer lag: broker offsets unavailable (%s)", exc)
    return [out[tp] for tp in tps]


class _TableSizes:
    """`len()` of every table; cached for TABLE_SIZE_TTL_S when counting took more than
    TABLE_SIZE_CHEAP_S (RocksDB iterates its keys), recomputed on every scrape when it was cheap
    (memory://, nearly empty stores)."""

    def __init__(self) -> None:
        self.at = 0.0
        self.cost = 0.0
        self.sizes: dict[str, int] = {}

    def get(self, rt: Runtime) -> dict[str, int]:
        now = time.monotonic()
        if self.cost <= TABLE_SIZE_CHEAP_S or now - self.at >= TABLE_SIZE_TTL_S or set(self.sizes) != set(rt.tables):
            sizes = {}
            for name, table in rt.tables.items():
                try:
                    sizes[name] = len(table)
                except Exception as exc:  # noqa: BLE001 - e.g. a store not open during a rebalance
                    log.debug("table %s size unavailable: %s", name, exc)
            self.sizes, self.at = sizes, now
            self.cost = time.monotonic() - now
        return self.sizes


def rocksdb_memory(rt: Runtime) -> dict[str, int]:
    """`faust_internals.rocksdb_memory` over every table's RocksDB store (none: {}); with the
    worker's shared budget (`Runtime.rocksdb_shared`), its cache counted once: the blocks in it
    (what it holds less the memtables' reservations) as `block_cache`."""
    total: dict[str, int] = {}
    shared = rt.rocksdb_shared
    if shared is not None:
        total["block_cache"] = max(0, int(shared.cache.get_usage()) - int(shared.write_buffers.get_usage()))
    for name, table in rt.tables.items():
        store = faust_internals.rocksdb_store(table)
        if store is None:
            continue
        try:
            for kind, n in faust_internals.rocksdb_memory(store).items():
                total[kind] = total.get(kind, 0) + n
        except Exception as exc:  # noqa: BLE001 - a store closing during a rebalance: skip this scrape's figure
            log.debug("table %s: RocksDB memory unavailable: %s", name, exc)
    return total


def worker_families(h: Health | None, lags: list[PartitionLag], table_sizes: dict[str, int],
                    rocksdb: dict[str, int] | None = None) -> list[GaugeMetricFamily]:
    """The Faust-derived gauges of one scrape (`h` None: the families without samples, which is
    what `WorkerCollector.describe` answers)."""
    def gauge(name: str, help_text: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(metric_name(name), help_text, labels=labels)

    per_partition = ("topic", "partition")
    committed = gauge("consumer_committed_offset", "Offset the consumer group last committed, by owned input partition.",
                      per_partition)
    highwater = gauge("consumer_highwater", "High watermark (next offset to be written), by owned input partition.",
                      per_partition)
    lag = gauge("consumer_lag", "Records not yet committed (high watermark - committed offset), by owned input partition.",
                per_partition)
    for p in lags:
        labels = [p.topic, str(p.partition)]
        if p.committed is not None:
            committed.add_metric(labels, p.committed)
        if p.highwater is not None:
            highwater.add_metric(labels, p.highwater)
        if p.lag is not None:
            lag.add_metric(labels, p.lag)
    tables = gauge("table_keys", "Keys in each table's locally held partitions.", ("table",))
    for name in sorted(table_sizes):
        tables.add_metric([name], table_sizes[name])
    rocks = gauge("rocksdb_memory_bytes", "Memory RocksDB holds for the tables' open partition stores (standby copies "
                  "included), by kind: memtables, block_cache, table_readers.", ("kind",))
    for kind, n in sorted((rocksdb or {}).items()):
        rocks.add_metric([kind], n)
    scalars = [  # (name, help, Health attribute)
        ("recovery_in_progress", "1 while the worker restores table partitions from their changelogs.",
         "recovery_in_progress"),
        ("recovery_active_remaining_offsets", "Changelog offsets left to restore for active table partitions.",
         "active_remaining"),
        ("recovery_standby_remaining_offsets", "Changelog offsets standby table partitions are behind.",
         "standby_remaining"),
        ("rebalancing", "1 while the consumer group is rebalancing.", "rebalancing"),
        ("ready", "1 when /health answers ready.", "ready"),
    ]
    blocks = gauge("python_allocated_blocks", "Memory blocks the Python interpreter has allocated (sys.getallocatedblocks: "
                   "its objects, not RocksDB's or librdkafka's memory).")
    if h is not None:
        blocks.add_metric([], float(sys.getallocatedblocks()))
    out = [committed, highwater, lag, tables, rocks, blocks]
    for name, help_text, attr in scalars:
        fam = gauge(name, help_text)
        if h is not None:
            fam.add_metric([], float(getattr(h, attr)))
        out.append(fam)
    problems = gauge("health_problem", "1 while /health names this problem (reason), else 0.", ("reason",))
    assigned = gauge("assigned_partitions", "Partitions assigned to this worker (all topics, changelogs included), "
                     "by kind.", ("kind",))
    if h is not None:
        from streams.runtime.probe import REASONS

        named = {p["reason"] for p in h.problems}
        for reason in REASONS:
            problems.add_metric([reason], float(reason in named))
        assigned.add_metric(["active"], h.active_partitions)
        assigned.add_metric(["standby"], h.standby_partitions)
    return [*out, problems, assigned]


class WorkerCollector(Collector):
    """The Faust-derived gauges, computed when the registry is collected (at scrape time)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.sizes = _TableSizes()
        self.lags: list[PartitionLag] = []

    async def refresh(self) -> None:
        """Fetch the consumer offsets (which may ask the broker) for the next `collect()`."""
        self.lags = [] if self.rt.app.should_stop else await consumer_lag(self.rt)

    def describe(self) -> list[GaugeMetricFamily]:
        return worker_families(None, [], {})

    def collect(self) -> list[GaugeMetricFamily]:
        h = health(self.rt)
        return worker_families(h, self.lags if h.status != "stopping" else [], self.sizes.get(self.rt),
                               rocksdb_memory(self.rt))


blueprint = Blueprint("health")


@blueprint.route("/metrics")
class MetricsView(View):  # no auth: Prometheus scrapes it (counts only, no content)
    def __post_init__(self) -> None:
        # one per app (a view is created once per app): its worker's registry collects it
        self.collector = WorkerCollector(runtime_of(self.app))
        self.collector.rt.metrics.registry.register(self.collector)

    async def get(self, request: Request) -> Response:
        await self.collector.refresh()
        return self.bytes(self.collector.rt.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


@blueprint.route("/v1/cluster/assignment")
class AssignmentView(ApiView):  # the `ops` scope: worker URLs are topology, not for tenants
    @authenticated(scope=SCOPE_OPS)
    async def get(self, request: Request, allowed: str) -> Response:
        """{worker url: {changelog topic: [active partitions]}}: which worker owns which key
        (the partition of a key is murmur2 of its UTF-8 bytes modulo the partition count)."""
        dist = self.app.router.tables_metadata()
        return self.reply({str(url): {t: sorted(p) for t, p in topics.items()} for url, topics in dist.items()})


@blueprint.route("/health")
class HealthView(View):  # no auth: for load balancers, orchestrators and `memstream status`
    async def get(self, request: Request) -> Response:  # readiness (kept at /health for compatibility)
        h = health(runtime_of(self.app))
        body = {**asdict(h), "ready": h.ready}
        return self.json(body, status=200 if h.ready else 503)


@blueprint.route("/health/ready")
class ReadyView(HealthView):  # the same answer under its explicit name
    pass


@blueprint.route("/health/live")
class LiveView(View):  # liveness: the process and its event loop answer (restart it when they do not)
    async def get(self, request: Request) -> Response:
        return self.json({"status": "alive", "worker": runtime_of(self.app).worker_name})
