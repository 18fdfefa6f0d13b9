"""The Faust app: topics from the catalog, codecs, tables, agents and web views, wired together.

The shell is thin. Agents (in `streams/agents/`) decode a record, call the pure core, write
tables and send results; this module gives them one `Runtime` with what they share:
- input topics are read as raw bytes, so a record that cannot be decoded still has its original
  bytes for the dead-letter topic (a Faust codec error would be logged and the record lost);
- output topics write through the registered Avro codecs (`avro-<schema>`) with UTF-8 keys;
- `dead_letter()` sends a refused record, with its reason, to `pipeline.dlq.v1`;
- `guard()` runs a handler per event and turns any exception into a dead letter (an exception
  escaping a Faust agent would ack the message and lose it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import faust
from faust.types import TP

from streams.contracts import catalog, deadletter
from streams.contracts.wire import (
    CodecFactory,
    RegistryError,
    WireFormatError,
    confluent_schema_id,
    decode_key,
    encode_key,
)
from streams.core.partitioning import misrouted, partition_for
from streams.runtime import checkpoint, codecs, faust_internals
from streams.runtime.direct_input import InputFetch, consumer_config
from streams.runtime.handlers import PipelineHook, Rejected
from streams.runtime.loglimit import Throttled
from streams.runtime.metrics import Metrics
from streams.runtime.outputs import OutputProducer, OutputsFailed
from streams.runtime.rebalance import RebalanceSafeConsumer
from streams.runtime.row_cache import MISSING, DecodedRows
from streams.runtime.standby import OFFSET_BEGINNING, Replica, StandbyApplier
from streams.runtime.tick_gate import TickGate, tick_offsets
from streams.runtime.web import PartitionRouter, ServerLimits, install_server_limits
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.runtime.probe import WorkerProbe

log = logging.getLogger("memstream")

#: Exit status of a worker stopped because an agent itself failed (not one record).
EXIT_AGENT_FAILED = 70
#: Dead letters are logged at info at most once per this many seconds (each one at debug).
DLQ_LOG_INTERVAL_S = 5.0

#: a stateful agent's handler: ``apply(cp, event, key, record)`` (streams/runtime/checkpoint.py)
Handler = Callable[[checkpoint.Checkpoint, faust.types.EventT, str, dict], Awaitable[None]]
#: a tick handler: ``sweep(cp, partition, now_ms)``
TickHandler = Callable[[checkpoint.Checkpoint, int, int], Awaitable[None]]


class Runtime:
    """What every agent of one worker shares."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.codecs = CodecFactory.from_url(settings.registry_url, timeout_s=settings.registry_timeout_s)
        self.codecs.register([t.name for t in catalog.topics()])  # once, at startup
        codecs.install(self.codecs)
        self.worker_name = f"{socket.gethostname()}:{settings.web_port}"
        self.draining = False  # set by a stopping worker: no batch starts any more
        self._inflight = 0
        #: the stateful agents' source topics: a record of one is committed only once applied
        #: (`counts_ack`); the records of the batches applied since, until their acknowledgement
        self._guarded_topics: set[str] = set()
        self._applied: weakref.WeakSet = weakref.WeakSet()
        self._idle = asyncio.Event()
        self._idle.set()
        self.app = _DrainingApp(
            settings.app_id,
            broker=f"kafka://{settings.broker}",
            store=settings.store,
            datadir=settings.data_dir,
            web_bind=settings.web_host,
            web_host=settings.web_host,
            web_port=settings.web_port,
            canonical_url=f"http://{_advertised_host(settings)}:{settings.web_port}",
            topic_partitions=settings.partitions,
            topic_replication_factor=settings.replication,
            table_standby_replicas=settings.standby_replicas,
            processing_guarantee="at_least_once",
            consumer_auto_offset_reset="earliest",
            autodiscover=False,
            web_enabled=True,
            # Faust's built-in pages serve table rows (content), partition owners, sensor
            # statistics and the service graph to anyone: none of them is served (see
            # `_only_documented_pages`; docs/threat-model.md).
            web_router_enabled=False,
            web_tables_enabled=False,
            web_stats_enabled=False,
            web_graph_enabled=False,
            web_metrics_enabled=False,
            key_serializer="raw",
            value_serializer="raw",
            producer_acks=-1,
            producer_linger=settings.producer_linger_ms / 1000,
            broker_session_timeout=settings.session_timeout_s,
            broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
            Router=PartitionRouter,  # key owner from the assignor, not the Kafka client's metadata
        )
        _only_documented_pages(self.app)
        install_server_limits(self.app, ServerLimits(
            header_timeout_s=settings.http_header_timeout_s, idle_timeout_s=settings.http_idle_timeout_s,
            max_connections=settings.http_max_connections))
        self.app.memstream_runtime = self
        # A batch writes its table rows in one burst; Faust's default (pause the stream at 100
        # buffered messages and drain them one by one) would throttle every batch.
        faust_internals.set_producer_buffer_max(self.app, max(100, settings.batch_max * 20))
        faust_internals.install_consumer_class(self.app, RebalanceSafeConsumer)  # before anything creates app.consumer
        self.inputs: dict[str, faust.TopicT] = {}
        self.outputs: dict[str, faust.TopicT] = {}
        for spec in catalog.topics():
            if spec.direction == "in":
                self.inputs[spec.name] = self.app.topic(
                    spec.name, key_serializer="raw", value_serializer="raw", partitions=spec.partitions(settings))
            else:
                self.outputs[spec.name] = self.app.topic(
                    spec.name,
                    key_serializer="raw" if spec.name == catalog.DLQ else codecs.KEY_CODEC,
                    value_serializer=codecs.codec_name(spec.value_schema),
                    partitions=spec.partitions(settings),
                )
        #: output topic -> its value encoder (the bytes Faust's `avro-<schema>` codec writes)
        self._encoders: dict[str, Callable[[dict], bytes]] = {
            spec.name: self.codecs.codec(spec.value_schema).encode for spec in catalog.topics()
            if spec.direction != "in"}
        #: the agents' outputs (streams/runtime/outputs.py); None: through Faust's producer (the earlier path)
        self.output_producer: OutputProducer | None = None
        if settings.output_producer == "librdkafka":
            self.output_producer = OutputProducer.for_worker(
                settings.broker, f"{settings.app_id}-outputs", settings.producer_linger_ms,
                self.app.conf.producer_max_request_size, settings.output_timeout_s)
        self.metrics = Metrics()
        #: subscribers to what the pipeline did (the analytics agent is one): `add_hook`
        self._hooks: list[PipelineHook] = []
        self._tick_timers: list[str] = []  #: the partition-local timers (`ticks`), in order
        self._dlq_index: dict[tuple[str, int], tuple[int, int]] = {}
        self._dlq_log = Throttled(log, logging.INFO, DLQ_LOG_INTERVAL_S)
        self.tables: dict[str, faust.types.TableT] = {}
        self._changelogs: dict[str, faust.types.TableT] = {}  # changelog topic -> its table
        self._changelog_topics: dict[str, str] = {}  # table name -> its changelog topic
        self._direct_stores: dict[str, Any] = {}  # table name -> its RocksDB store, or None (`write_rows`)
        #: the rows of the updates-only tables written directly, kept decoded (`read_row`)
        self.row_cache = DecodedRows(settings.row_cache_bytes)
        #: every table store's RocksDB memory, one budget (None: each store bounded on its own)
        self.rocksdb_shared = (faust_internals.SharedRocksDBMemory(settings.rocksdb_memory_bytes)
                               if settings.rocksdb_memory_bytes > 0 and settings.store.startswith("rocksdb:") else None)
        for signal in (self.app.on_partitions_assigned, self.app.on_partitions_revoked, self.app.on_rebalance_complete):
            signal.connect(self._forget_rows)
        #: this worker's standby replicas of its RocksDB tables, applied outside Faust's per-record
        #: path (MEMSTREAM_STANDBY_APPLY=librdkafka, streams/runtime/standby.py)
        self.standby = StandbyApplier({"bootstrap.servers": settings.broker, "client.id": f"{settings.app_id}-standby",
                                       "group.id": f"{settings.app_id}-standby"},  # never joined: assigned, no commits
                                      settings.standby_batch_max, count=self.count)
        self.app.on_rebalance_complete.connect(self._start_standby)
        #: the stateful agents' inputs fetched by librdkafka (MEMSTREAM_INPUT_FETCH=librdkafka,
        #: streams/runtime/direct_input.py), by agent name
        self.input_fetches: dict[str, InputFetch] = {}
        self.app.on_rebalance_complete.connect(self._start_inputs)
        #: the checkpoint whose rows are being written (`write_rows`: a synchronous block)
        self._writing: checkpoint.Checkpoint | None = None
        #: (name, partitions, retention ms) of the internal topics: the worker creates them first
        self.internal_topics: list[tuple[str, int, dict[str, str]]] = []
        #: set by `memstream worker`: watches the registry ids, broker and disk (streams/runtime/probe.py)
        self.probe: WorkerProbe | None = None
        self.recovery_progress: tuple[int, float] | None = None  # api/health.py: (offsets left, since)
        #: topic -> (since, why) of an agent waiting on one record (reported by /health)
        self.stalls: dict[str, tuple[float, str]] = {}

    def input_channel(self, *names: str) -> faust.TopicT:
        """One channel over several co-partitioned input topics (raw bytes, decoded by `guard`)."""
        if len(names) == 1:
            return self.inputs[names[0]]
        return self.app.topic(*names, key_serializer="raw", value_serializer="raw")

    def rocksdb_options(self) -> dict[str, Any]:
        """The memory bounds of every table partition store (faust `RocksDBOptions` keywords; the
        restore ahead opens its stores with the same, `store.rocksdb_options`), and the worker's
        shared budget when there is one (`faust_internals.share_rocksdb_memory`)."""
        options: dict[str, Any] = {"write_buffer_size": self.settings.rocksdb_write_buffer_bytes,
                                   "max_write_buffer_number": self.settings.rocksdb_write_buffers,
                                   "block_cache_size": self.settings.rocksdb_block_cache_bytes}
        if self.rocksdb_shared is not None:
            faust_internals.share_rocksdb_memory()
            options[faust_internals.SHARED_MEMORY_OPTION] = self.rocksdb_shared
        return options

    def table(self, name: str) -> faust.types.TableT:
        """A table keyed by the UTF-8 message key (same bytes as the source key, so its changelog
        partition, HTTP routing (`ApiView.answer_at_owner`) and the source partition agree), values stored
        as JSON."""
        table = self.app.Table(
            name, default=None, partitions=self.settings.partitions,
            schema=faust.Schema(key_serializer=codecs.KEY_CODEC, value_serializer="json"),
            options=self.rocksdb_options(),
        )
        # Faust builds the changelog topic in the constructor with serializers derived from
        # key_type (json when unset), ignoring the schema: the router would then
        # partition the key's JSON-quoted bytes and forward requests to the wrong worker, and
        # the changelog keys would not be the source key bytes. Rebuild it with UTF-8 keys.
        changelog = faust_internals.rebuild_changelog_topic(
            table, codecs.KEY_CODEC, "json", decode_values=not self.settings.store.startswith("rocksdb:"))
        send_changelog = table.send_changelog
        self._changelogs[changelog.get_topic_name()] = table
        self._changelog_topics[name] = changelog.get_topic_name()

        def send_changelog_tracked(partition: int | None, key: Any, value: Any, key_serializer: Any = None,
                                   value_serializer: Any = None) -> Any:
            cp = self._writing
            if self.output_producer is None or cp is None or partition is None:
                # a FutureMessage: done once the broker has the row
                fut = send_changelog(partition, key, value, key_serializer, value_serializer)
                if cp is not None:
                    cp.record_state_ack(fut)
                return fut
            # a batch's rows go through the output producer too (same bytes as Faust's send)
            k = changelog.prepare_key(key, key_serializer or table.key_serializer, None, None)[0]  # type: ignore[attr-defined]
            v = None if value is None else changelog.prepare_value(
                value, value_serializer or table.value_serializer, None, None)[0]  # type: ignore[attr-defined]
            self._changelog_row(cp, changelog.get_topic_name(), k, v, partition)
            return faust_internals.changelog_sent(partition)

        # the checkpoint waits for it (streams.runtime.checkpoint step 4)
        faust_internals.replace_send_changelog(table, send_changelog_tracked)
        if self.settings.store.startswith("rocksdb:") and not self.settings.state_wal:
            faust_internals.write_without_wal(table)
        if self.settings.store.startswith("rocksdb:"):
            faust_internals.collect_only_when_a_store_closes()
        # created by the worker before Faust subscribes, as the internal topics are: a changelog
        # missing from the consumer's metadata snapshot reads as 0 partitions, and Faust's check of
        # the first write to the table (`PartitionsMismatch`) then stops the worker
        self.internal_topics.append((changelog.get_topic_name(), self.settings.partitions,
                                     {"cleanup.policy": "compact"}))
        self.tables[name] = table
        return table

    def write_rows(self, cp: checkpoint.Checkpoint, rows: list[checkpoint.Row]) -> None:
        """Step 3 of `cp` (`checkpoint.Sink`): write its rows, in order, synchronously (so no other
        checkpoint's rows are written meanwhile); their changelog acknowledgements are `cp`'s.

        A RocksDB table's rows (with the output producer) are written as `table[key] = row` would
        write them: the same key and value bytes into the store of the event's partition, then the
        same record to that changelog partition, in the same order; only Faust's per-row layers
        are skipped (its mapping, store and changelog wrappers, two serializer lookups, the
        current-event switch: ~3.5% of a caught-up worker's CPU, bench/RESULTS.md "Issue 14, stop
        20"). Each partition store gets one RocksDB write batch, written before any of the rows'
        changelog records is produced (Faust's order: the store, then the changelog). Any other
        table: through Faust (`checkpoint.write_through_tables`)."""
        assert self._writing is None, "rows of two checkpoints written at once"
        self._writing = cp
        try:
            direct: list[checkpoint.Row] = []
            through: list[checkpoint.Row] = []
            for row in rows:
                ours = self.output_producer is not None and self._direct_store(row.table) is not None
                (direct if ours else through).append(row)
            checkpoint.write_through_tables(through)
            if direct:
                self._write_direct(cp, direct)
        finally:
            self._writing = None

    def read_row(self, table: faust.types.TableT, key: str) -> Any:
        """`checkpoint.Sink.read_row`: a row of an updates-only table written directly is taken
        from `row_cache` (the object written last, now the caller's; streams/runtime/row_cache.py),
        else read (and decoded) from the table."""
        partition = faust_internals.current_partition()
        if partition is not None and self._caches_rows(table):
            row = self.row_cache.take(table.name, partition, key)
            if row is not MISSING:
                return row
        return checkpoint.current_row(table, key)

    def _caches_rows(self, table: faust.types.TableT) -> bool:
        return (self.output_producer is not None and self._direct_store(table) is not None
                and checkpoint.is_updates_only(table))

    async def _forget_rows(self, *args: Any, **kwargs: Any) -> None:
        """Partitions move: their rows may change behind the cache (recovery, standby replicas)."""
        self.row_cache.clear()

    def standby_claims(self, tps: Any) -> set[TP]:
        """The partitions of `tps` whose standby copy `standby` applies: standby (not active)
        changelog partitions of the RocksDB tables, with MEMSTREAM_STANDBY_APPLY=librdkafka. Faust
        must never fetch them (`RebalanceSafeConsumer.resume_partitions` leaves them paused)."""
        if self.settings.standby_apply != "librdkafka":
            return set()
        standbys, actives = self.app.assignor.assigned_standbys(), self.app.assignor.assigned_actives()
        return {tp for tp in tps
                if tp in standbys and tp not in actives and self._replicated_store(tp.topic) is not None}

    def _replicated_store(self, changelog_topic: str) -> Any | None:
        table = self._changelogs.get(changelog_topic)
        return None if table is None else self._direct_store(table)

    async def _start_standby(self, *args: Any, **kwargs: Any) -> None:
        """A rebalance is complete (Faust's recovery done): apply the claimed standby partitions
        from the offset after the one each store holds."""
        await self.standby.stop()
        if self.draining or self.app.should_stop:
            return
        replicas = []
        for tp in sorted(self.standby_claims(self.app.assignor.assigned_standbys())):
            store = self._replicated_store(tp.topic)
            assert store is not None  # claimed: a RocksDB table's changelog
            try:
                db = faust_internals.rocksdb_partition_db(store, tp.partition)
                persisted = store.persisted_offset(tp)
            except Exception as exc:  # noqa: BLE001 - a store that will not open (a lock, the disk): no copy
                self.count("standby:open_failed")
                log.error("standby copy of %s[%d] not kept: its store did not open (%s: %s); a takeover "
                          "reads its changelog from the last offset the store holds", tp.topic, tp.partition,
                          type(exc).__name__, exc)
                continue
            replicas.append(Replica(tp.topic, tp.partition, db, OFFSET_BEGINNING if persisted is None else persisted + 1))
        self.standby.start(replicas)

    def input_claims(self, tps: Any) -> set[TP]:
        """The partitions of `tps` an `InputFetch` reads: Faust must never fetch them
        (`RebalanceSafeConsumer.resume_partitions` leaves them paused)."""
        claimed: set[TP] = set()
        for fetch in self.input_fetches.values():
            claimed |= fetch.claims(tps)
        return claimed

    def input_committed(self, tp: TP) -> int | None:
        """The offset an `InputFetch` last committed for `tp` (None: not one of its partitions,
        or nothing committed by it yet)."""
        for fetch in self.input_fetches.values():
            if tp.topic in fetch.topics:
                return fetch.committed.get((tp.topic, tp.partition))
        return None

    async def stop_inputs(self) -> None:
        """Before a rebalance moves partitions (and when the worker stops): no batch of a fetched
        input starts any more; the one being applied finishes and is committed."""
        for fetch in self.input_fetches.values():
            await fetch.stop()

    async def _start_inputs(self, *args: Any, **kwargs: Any) -> None:
        """A rebalance is complete (Faust's recovery done): fetch each agent's active input
        partitions from the group's committed offsets."""
        await self.stop_inputs()
        if self.draining or self.app.should_stop:
            return
        actives = self.app.assignor.assigned_actives()
        for fetch in self.input_fetches.values():
            fetch.start((tp.topic, tp.partition) for tp in fetch.claims(actives))

    @staticmethod
    def _input_failed(reason: str) -> None:
        """An input fetch stopped on an error (logged CRITICAL): the worker stops without
        committing anything more, so that its partitions move (`EXIT_AGENT_FAILED`)."""
        logging.shutdown()
        os._exit(EXIT_AGENT_FAILED)

    async def _commit_inputs(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Commit applied batches' offsets as the group's member (Faust's consumer): refused
        (False) when a rebalance took the partitions first."""
        return await faust_internals.consumer_thread(self.app.consumer).commit(
            {TP(topic, partition): offset for (topic, partition), offset in offsets.items()})

    def standby_remaining(self) -> int:
        """Changelog records this worker's standby copies are behind (Faust's and `standby`'s)."""
        claimed = {(r.topic, r.partition) for r in self.standby.replicas}  # Faust never fetches these
        recovery = self.app.tables.recovery  # type: ignore[attr-defined]
        fausts = sum(n for tp, n in recovery.standby_remaining().items() if (tp.topic, tp.partition) not in claimed)
        return int(fausts) + self.standby.remaining()

    def _direct_store(self, table: faust.types.TableT) -> Any | None:
        """The table's RocksDB store when this runtime writes its rows itself (`write_rows`)."""
        name = table.name
        if name not in self._direct_stores:
            ours = self.tables.get(name) is table and name in self._changelog_topics
            self._direct_stores[name] = faust_internals.rocksdb_store(table) if ours else None
        return self._direct_stores[name]

    def _write_direct(self, cp: checkpoint.Checkpoint, rows: list[checkpoint.Row]) -> None:
        import rocksdict

        batches: dict[tuple[str, int], Any] = {}
        records = []
        cached: list[tuple[str, int, str, Any, int]] = []  # (table, partition, key, row or DELETE, size)
        for row in rows:
            store = self._direct_stores[row.table.name]
            faust_internals.verify_source_partitions(row.table, row.event.message.topic)  # as Faust's write does
            partition = row.event.message.partition
            key = faust_internals.encoded_key(store, row.key)
            caches = self._caches_rows(row.table)
            if row.value is checkpoint.DELETE:
                if caches:
                    cached.append((row.table.name, partition, row.key, checkpoint.DELETE, 0))
                # `table.pop(key, None)` removes (and sends a tombstone for) a row that is there only
                if faust_internals.rocksdb_partition_db(store, partition).get(key) is None:
                    continue
                value = None
            else:
                value = faust_internals.encoded_row(row.table, row.value)
                if caches and not isinstance(row.value, (bytes, bytearray)):
                    cached.append((row.table.name, partition, row.key, row.value, len(value)))
            batch = batches.get((row.table.name, partition))
            if batch is None:
                batch = batches[(row.table.name, partition)] = rocksdict.WriteBatch(raw_mode=True)
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            records.append((self._changelog_topics[row.table.name], key, value, partition))
        for (name, partition), batch in batches.items():
            faust_internals.rocksdb_partition_db(self._direct_stores[name], partition).write(batch)
        for name, partition, key_text, row_value, size in cached:  # in the store now: kept decoded
            if row_value is checkpoint.DELETE:
                self.row_cache.drop(name, partition, key_text)
            else:
                self.row_cache.put(name, partition, key_text, row_value, size)
        for topic, key, value, partition in records:
            self._changelog_row(cp, topic, key, value, partition)

    def _changelog_row(self, cp: checkpoint.Checkpoint, topic: str, key: bytes, value: bytes | None,
                       partition: int) -> None:
        """A table row's changelog record, through the output producer, acknowledged with `cp`."""
        assert self.output_producer is not None
        if cp.state_deliveries is None:
            cp.state_deliveries = self.output_producer.deliveries(on_done=self._persisted)
            cp.record_state_ack(cp.state_deliveries)
        self.output_producer.produce_now(cp.state_deliveries, topic, key, value, partition)

    def _persisted(self, offsets: dict[tuple[str, int], int]) -> None:
        """What Faust does once it has sent a changelog row, for the rows the output producer sent
        (`faust_internals.mark_changelog_persisted`): recovery then reads only what follows."""
        for (topic, partition), offset in offsets.items():
            faust_internals.mark_changelog_persisted(self._changelogs[topic], TP(topic, partition), offset)

    def internal_topic(self, suffix: str, retention: timedelta | None = None) -> faust.TopicT:
        """An internal topic `<app_id>-<suffix>` (raw bytes, the catalog's partition count),
        recorded in `internal_topics` (as the tables' changelogs are) so that the worker creates it before Faust subscribes:
        a topic Faust creates itself at start-up may not be in the broker's metadata yet when
        the consumer subscribes, and aiokafka then ignores it until its next metadata refresh
        (minutes: no ticks, no housekeeping, no analytics publishing until then)."""
        topic = self.app.topic(f"{self.settings.app_id}-{suffix}", partitions=self.settings.partitions,
                               internal=True, key_serializer="raw", value_serializer="raw", retention=retention)
        self.internal_topics.append((topic.get_topic_name(), self.settings.partitions,
                                     {"retention.ms": str(int(retention.total_seconds() * 1000))} if retention else {}))
        return topic

    def active_partitions(self, topic: str) -> set[int]:
        """The partitions of `topic` this worker is assigned as active (standbys not included)."""
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic}

    def partition_of(self, key: str) -> int:
        """The partition of a UTF-8 key in every catalog topic (murmur2, as the Java client)."""
        return partition_for(key.encode(), self.settings.partitions)

    def ticks(self, name: str, owner_topic: str, handler: TickHandler,
              cache: checkpoint.DerivedCache | None = None, lock: asyncio.Lock | None = None) -> None:
        """A partition-local timer whose handler runs inside an event of partition p.

        Faust refuses table writes outside a stream event, and a write's changelog partition is
        the event's partition. So the timer does not touch tables: every MEMSTREAM_TIMER_INTERVAL_S
        it sends a tick (wall-clock ms) to partition p of an internal topic for each partition p
        of `owner_topic` this worker owns; the tick topic has the same partition count and
        subscribers, so Faust co-partitions it, and `handler(cp, p, now_ms)` runs in that event
        (with the outputs-first protocol of `streams.runtime.checkpoint`: it sends and stages
        through the checkpoint `cp`; pass the `cache` and `lock` of the agent that owns the same
        state). Ticks that queued up (a backlog) run at most once per partition per half interval
        (`streams.runtime.tick_gate`).
        """
        lock = lock or asyncio.Lock()
        topic = self.internal_topic(f"{name}-ticks", retention=timedelta(hours=1))
        gate = TickGate(self.settings.timer_interval_s)  # queued ticks (a backlog) run once per half interval

        async def handle(cp: checkpoint.Checkpoint, event: faust.types.EventT) -> bool:
            if not gate.due(event.message.partition):
                log.debug("%s tick on partition %s skipped: the previous one ran less than half an interval ago",
                          name, event.message.partition)
                return True
            try:
                await handler(cp, event.message.partition, int(event.message.value))  # type: ignore[arg-type]
                return True
            except Exception:  # noqa: BLE001 - a failed sweep must not stop the worker
                log.exception("%s tick on partition %s failed", name, event.message.partition)
                return False

        @self.app.agent(topic, name=f"{name}-tick-agent")
        async def on_tick(stream):
            async for event in stream.events():
                if self.draining:
                    await self.hold_back([event])
                with self.never_ack_unless_applied(f"{name}-tick-agent", [event]):
                    await self.consistent_ids()  # a sweep writes records framed with registry ids too
                    with self.in_flight():
                        async with lock:  # the sweep's outputs first, then its table writes
                            await checkpoint.run_batch([event], handle, cache, self)

        timer = len(self._tick_timers)
        self._tick_timers.append(name)

        @self.app.task
        async def send_ticks() -> None:
            """Every interval, a tick (the wall clock's ms) to each partition of `owner_topic` this
            worker owns, spread over the interval with the other timers' (`tick_offsets`)."""
            interval = self.settings.timer_interval_s
            loop = asyncio.get_running_loop()
            begins = loop.time()
            while True:
                begins += interval  # a round every interval, however long the sends took
                await asyncio.sleep(max(0.0, begins - loop.time()))
                partitions = sorted(self.active_partitions(owner_topic))  # as owned when the round begins
                offsets = tick_offsets(len(partitions), timer, len(self._tick_timers), interval)
                for partition, offset in zip(partitions, offsets, strict=True):
                    await asyncio.sleep(max(0.0, begins + offset - loop.time()))
                    await topic.send(value=str(int(time.time() * 1000)).encode(), partition=partition)

    def add_hook(self, hook: PipelineHook) -> None:
        """Subscribe `hook` to what the pipeline does (see streams/runtime/handlers.py)."""
        self._hooks.append(hook)

    def feed_analytics(self, cp: checkpoint.Checkpoint, increments: Any) -> None:
        """An agent reports the classified increments of the record it is handling (the hooks
        stage their updates through its checkpoint `cp`)."""
        for hook in self._hooks:
            hook.increments(cp, increments)

    def erase_analytics(self, cp: checkpoint.Checkpoint, subject: str) -> None:
        """An erasure's last step: every hook forgets `subject` (staged through `cp`)."""
        for hook in self._hooks:
            hook.erase(cp, subject)

    def count(self, name: str, n: int = 1) -> None:
        self.metrics.inc(name, n)

    def decoder(self, topic_name: str) -> Callable[..., dict]:
        """`decode(value, headers)` of a topic: any framing `wire` reads (Apicurio's headers too)."""
        return self.codecs.codec(catalog.topic(topic_name).value_schema).decode_message

    async def send(self, topic_name: str, key: str, value: dict | None,
                   headers: list[tuple[str, bytes]] | None = None, cp: checkpoint.Checkpoint | None = None) -> None:
        """Send a record to an output topic (`value` None: a tombstone). With a checkpoint `cp`
        (a handler calls `cp.send`), its batch awaits the acknowledgement before its table writes
        (streams.runtime.checkpoint); without one this returns once the broker has it."""
        if self.output_producer is None:
            if value is None:  # a tombstone: no codec (Avro has no "null record")
                ack = await self.outputs[topic_name].send(key=key, value=None, headers=headers, value_serializer="raw")
            else:
                ack = await self.outputs[topic_name].send(key=key, value=value, headers=headers)
            await _acknowledged(ack, cp)
        else:
            encode = self._encoders[topic_name]
            await self._produce(cp, topic_name, encode_key(key), None if value is None else encode(value), headers)
        self.metrics.inc_label("out", topic_name)

    async def _produce(self, cp: checkpoint.Checkpoint | None, topic_name: str, key: bytes | None,
                       value: bytes | None, headers: list[tuple[str, bytes]] | None) -> None:
        """One encoded record through the output producer, acknowledged with `cp` (without one:
        awaited here)."""
        assert self.output_producer is not None, "only with MEMSTREAM_OUTPUT_PRODUCER=librdkafka"
        if cp is None:
            await self.output_producer.send_and_wait(topic_name, key, value, headers)
            return
        if cp.deliveries is None:
            cp.deliveries = self.output_producer.deliveries()
            cp.record_ack(cp.deliveries)
        await self.output_producer.produce(cp.deliveries, topic_name, key, value, headers)

    async def dead_letter(self, cp: checkpoint.Checkpoint, event: faust.types.EventT, stage: str, reason: str,
                          error_class: str, keep_value: bool = True) -> None:
        """Send the event's record to the DLQ, acknowledged with `cp` (a handler calls
        `cp.dead_letter`). `keep_value=False` drops the original value bytes (a record that
        re-submits deleted content must not be copied anywhere)."""
        msg = event.message
        origin = deadletter.Origin(msg.topic, msg.partition, msg.offset, msg.key, msg.value if keep_value else None)
        record = deadletter.dead_letter(origin, stage=stage, reason=reason, error_class=error_class,
                                        failed_at=int(time.time() * 1000), worker=self.worker_name,
                                        max_copy_bytes=self.settings.dlq_max_copy_bytes,
                                        max_reason_chars=self.settings.dlq_max_reason_chars)
        if self.output_producer is None:
            ack = await self.outputs[catalog.DLQ].send(key=record["original_key"], value=record,
                                                       headers=deadletter.connect_headers(record))
            cp.record_ack(ack)
        else:
            await self._produce(cp, catalog.DLQ, record["original_key"], self._encoders[catalog.DLQ](record),
                                deadletter.connect_headers(record))
        last_offset, index = self._dlq_index.get((msg.topic, msg.partition), (-1, -1))
        index = index + 1 if last_offset == msg.offset else 0  # the n-th dead letter of this record
        self._dlq_index[(msg.topic, msg.partition)] = (msg.offset, index)
        for hook in self._hooks:
            hook.dead_lettered(cp, record, int(msg.timestamp * 1000), index, msg.partition)
        self.metrics.inc_label("dlq", f"{stage}/{error_class}")
        # one line per DLQ_LOG_INTERVAL_S at info, every one at debug; all of them are counted
        # (`memstream_dlq_total`) and on the dead-letter topic with their reasons
        self._dlq_log.log("dead-lettered %s[%s]@%s at %s: %s", msg.topic, msg.partition, msg.offset, stage, reason)

    async def guard(self, cp: checkpoint.Checkpoint, event: faust.types.EventT, handler: Handler) -> bool:
        """Decode the event's key and value, run `handler(cp, event, key, record)`; every failure
        becomes a dead letter (through `cp`). False when the handler failed unexpectedly (its
        partial effects must be discarded)."""
        msg = event.message
        self.metrics.inc_label("in", msg.topic)
        wrong = misrouted(msg.topic, msg.key, msg.partition, self.settings.partitions)
        if wrong is not None:  # its rows would land in another partition's changelog (issue 15)
            await cp.dead_letter(deadletter.STAGE_VALIDATE, f"{wrong.code}: {wrong.detail}", wrong.code)
            return True
        try:
            key = decode_key(msg.key)
            record = await self._decode(msg.topic, msg.value, msg.headers)
        except WireFormatError as exc:
            await cp.dead_letter(deadletter.STAGE_DECODE, str(exc), type(exc).__name__)
            return True
        except Exception as exc:  # noqa: BLE001 - a codec bug on odd bytes: the record still goes to the DLQ
            log.exception("decoding %s[%s]@%s failed unexpectedly", msg.topic, msg.partition, msg.offset)
            await cp.dead_letter(deadletter.STAGE_DECODE, f"{type(exc).__name__}: {exc}", type(exc).__name__)
            return True
        started = time.perf_counter()
        try:
            await handler(cp, event, key, record)
            self.metrics.observe_latency(msg.topic, time.perf_counter() - started)
        except OutputsFailed:  # not this record's fault: the whole batch fails (streams/runtime/outputs.py)
            raise
        except Rejected as exc:
            await cp.dead_letter(exc.stage, exc.reason, exc.rule)
        except Exception as exc:  # noqa: BLE001 - a bug must not lose the record or stop the worker
            log.exception("handler failed on %s[%s]@%s", msg.topic, msg.partition, msg.offset)
            await cp.dead_letter(deadletter.STAGE_APPLY, f"{type(exc).__name__}: {exc}", type(exc).__name__)
            return False
        return True

    def stateful_agent(self, channel: faust.TopicT, name: str, handler: Handler,
                       cache: checkpoint.DerivedCache | None = None, lock: asyncio.Lock | None = None) -> None:
        """An agent that runs `handler(cp, event, key, record)` per event with the outputs-first
        protocol of `streams.runtime.checkpoint` (one checkpoint `cp` per batch attempt; batches of MEMSTREAM_BATCH_MAX, waiting at most MEMSTREAM_BATCH_WAIT_MS).
        `cache` is state derived from the tables (refreshed before a batch, dropped after a failed
        one); `lock` serializes its batches with other writers of the same state (timers)."""
        lock = lock or asyncio.Lock()

        async def handle(cp: checkpoint.Checkpoint, event: faust.types.EventT) -> bool:
            return await self.guard(cp, event, handler)

        self._guarded_topics.update(getattr(channel, "topics", ()))
        if self.settings.input_fetch == "librdkafka":
            self._fetched_agent(channel, name, handle, cache, lock)
            return

        @self.app.agent(channel, name=name)
        async def run(stream):
            async for events in stream.take_events(self.settings.batch_max, self.settings.batch_wait_ms / 1000):
                if self.draining:
                    await self.hold_back(events)
                await self._apply_batch(name, list(events), handle, cache, lock)
                self._applied.update(event.message for event in events)

    async def _apply_batch(self, name: str, events: list, handle: Callable[..., Awaitable[bool]],
                           cache: checkpoint.DerivedCache | None, lock: asyncio.Lock) -> None:
        """One batch of a stateful agent, whoever fetched it: the registry ids consistent, then the
        batch protocol of `streams.runtime.checkpoint` under the agent's lock, counted in flight; a
        failure is never committed (`never_ack_unless_applied`)."""
        with self.never_ack_unless_applied(name, events):
            await self.consistent_ids()
            with self.in_flight():
                async with lock:
                    await checkpoint.run_batch(events, handle, cache, self)
            self.metrics.flush()

    def _fetched_agent(self, channel: faust.TopicT, name: str, handle: Callable[..., Awaitable[bool]],
                       cache: checkpoint.DerivedCache | None, lock: asyncio.Lock) -> None:
        """`stateful_agent` with its inputs fetched by librdkafka (streams/runtime/direct_input.py):
        the same batch protocol, then the batch's offsets committed through Faust's consumer."""
        for other, declared in self.input_fetches.items():  # each record is one agent's: fetched, applied and
            if shared := declared.topics & set(channel.topics):  # committed once (a group commits once per partition)
                raise ValueError(f"agents {other!r} and {name!r} both read {', '.join(sorted(shared))}: a topic is "
                                 "one stateful agent's input when librdkafka fetches them (MEMSTREAM_INPUT_FETCH)")
        fetch = self.input_fetches[name] = InputFetch(
            name, channel.topics, consumer_config(self.settings, self.app.conf.id),  # reads its offsets, never commits
            self.settings.batch_max, count=self.count, on_failed=self._input_failed,
            commit_interval_s=float(self.app.conf.broker_commit_interval))  # as often as Faust commits

        strays = Throttled(log, logging.ERROR, 10.0)

        @self.app.agent(channel, name=name)
        async def subscribed(stream):
            """Faust subscribes (and assigns) the topics; it never fetches them (`input_claims`).
            Record by record: `take_events` would wake every MEMSTREAM_BATCH_WAIT_MS for nothing."""
            async for event in stream.events():
                strays.log("%s: a record (%s[%d]@%d) reached Faust's stream although librdkafka fetches its "
                           "input; not applied, not committed (the fetch applies it)", name,
                           event.message.topic, event.message.partition, event.message.offset)
                faust_internals.mark_acked_without_commit([event])

        async def apply(events: list) -> bool:
            if self.draining:
                return False  # never applied, never committed: the partition's next owner reads them
            await self._apply_batch(name, events, handle, cache, lock)
            return True

        @self.app.task
        async def fetched() -> None:
            await fetch.run(apply, self._commit_inputs)

    async def consistent_ids(self) -> None:
        """Wait while the schema registry maps an id this worker used differently than before
        (streams/runtime/probe.py): no batch is applied (nor committed) until it maps them as before."""
        if self.probe is not None:
            await self.probe.wait_consistent()

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """One batch being applied. A stopping worker (`drain`) lets it finish — outputs, table
        rows and their acknowledgements — before Faust closes the tables and commits; a batch
        taken after the drain began is not applied (and so never committed: the partition's
        next owner reads it)."""
        self._inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()

    def counts_ack(self, message: Any) -> bool:
        """Whether the consumer may count `message`'s acknowledgement towards a commit (asked by
        `RebalanceSafeConsumer.ack`). A record of a stateful agent's source topic counts only
        once its batch was applied: Faust also acknowledges records nobody applied — one a
        stream takes while a rebalance or a stop has suspended the flow, or of an older
        consumer generation, is skipped *and* acknowledged — and after a revocation its commit
        is not anchored at the committed offset, so such an acknowledgement could carry the
        commit across a batch that was never applied (the fault suite's lost records). Not
        counting it leaves a hole the commit stops at; the seek after the rebalance (or the
        partition's next owner) reads the record again."""
        if message.topic not in self._guarded_topics:
            return True
        if message in self._applied:
            self._applied.discard(message)
            return True
        self.count("acks_not_counted:unapplied")
        return False

    def never_applied(self, message: Any) -> bool:
        """Whether a record the consumer still waits for will never be applied: the worker drains
        (no batch starts any more), the record is of a stateful agent's source, and no applied
        batch holds it. A stopping consumer need not wait for it (rebalance.py defect 10)."""
        return self.draining and message.topic in self._guarded_topics and message not in self._applied

    @staticmethod
    async def hold_back(events: list[faust.types.EventT]) -> None:
        """A batch taken while the worker stops: never applied, never acknowledged (so never
        committed); this agent waits until the stop cancels it."""
        faust_internals.mark_acked_without_commit(events)  # Faust's consumer skips an already-acked message
        await asyncio.Event().wait()

    async def drain(self, timeout: float = 60.0) -> None:
        """Stop starting batches and wait for those in flight (called first when the worker stops)."""
        self.draining = True
        deadline = time.monotonic() + timeout
        await self.standby.stop()  # before Faust closes the stores it writes into
        await self.stop_inputs()  # the batch being applied finishes and is committed
        if self._inflight:
            log.info("stopping: waiting for %d batch(es) in flight", self._inflight)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("stopping: %d batch(es) still in flight after %.0fs; their records are not committed "
                        "and will be read again", self._inflight, timeout)
        if self.output_producer is not None:  # every batch awaited its outputs: normally nothing left
            left = await self.output_producer.flush(max(1.0, deadline - time.monotonic()))
            if left:
                log.warning("stopping: %d output record(s) not acknowledged; their batches are not committed", left)
            self.output_producer.close()

    @contextmanager
    def never_ack_unless_applied(self, agent: str, events: list[faust.types.EventT]) -> Iterator[None]:
        """Faust acknowledges every event of a taken batch when the agent leaves it, even when it
        leaves by an exception or a cancellation (`Stream.take_events` acks in a `finally`), and
        then commits those offsets. A batch whose state was not written must not be committed:
        its messages are marked acknowledged *without* telling the consumer, so their offsets
        are never committed and a restart (or the partition's next owner) reads them again.
        A cancellation (the worker stopping, a partition being revoked) is re-raised; any other
        failure of the agent itself (not of one record: `guard` dead-letters those) stops the
        worker at once, before anything later can be committed past the unapplied records."""
        try:
            yield
        except BaseException as exc:
            faust_internals.mark_acked_without_commit(events)  # as `hold_back`: never committed
            if isinstance(exc, (asyncio.CancelledError, GeneratorExit, KeyboardInterrupt, SystemExit)):
                raise
            log.critical("agent %s failed on a batch of %d records (%s: %s); stopping the worker without "
                         "committing them: a restart reads them again", agent, len(events), type(exc).__name__,
                         exc, exc_info=exc)
            logging.shutdown()
            os._exit(EXIT_AGENT_FAILED)

    async def _decode(self, topic: str, value: bytes | None, headers=None) -> dict:
        if value is None:
            raise _NullValue(f"{topic} record has a null value; inputs never carry tombstones")
        decode = self.decoder(topic)
        delay = 0.5
        waited = False
        try:
            while True:
                try:
                    record = decode(value, headers)
                except RegistryError as exc:  # not the record's fault: wait for the registry, keep the record
                    self._stalled(topic, f"waiting for the schema registry to decode a {topic} record ({exc})")
                    log.warning("schema registry unavailable (%s); retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
                    waited = True
                    continue
                except WireFormatError:
                    if not await self._registry_changed(value):
                        raise  # the record's fault: the caller dead-letters it
                    self._stalled(topic, f"a {topic} record waits for the schema registry to map its ids as before")
                    await self.probe.wait_consistent()  # type: ignore[union-attr]
                    continue
                if waited and await self._registry_changed(None):  # reconnected: is it the same registry?
                    await self.probe.wait_consistent()  # type: ignore[union-attr]
                    waited = False
                    continue
                return record
        finally:
            self.stalls.pop(topic, None)

    def _stalled(self, topic: str, why: str) -> None:
        self.stalls.setdefault(topic, (time.monotonic(), why))

    async def _registry_changed(self, value: bytes | None) -> bool:
        """Whether the registry maps an id this worker used differently now (then a record that did
        not decode is not at fault, and nothing may be read until it maps them as before)."""
        if self.probe is None:
            return False
        schema_id = confluent_schema_id(value) if value is not None else 0
        return await asyncio.get_running_loop().run_in_executor(None, self.probe.explains, schema_id)


async def _acknowledged(ack: Any, cp: checkpoint.Checkpoint | None) -> None:
    """A Faust send's acknowledgement: the checkpoint's to await, else awaited now."""
    if cp is not None:
        cp.record_ack(ack)
    else:
        await ack


class _DrainingApp(faust.App):
    """Faust's app, with the memstream runtime drained first when it stops: Faust's own stop
    closes the tables and commits without waiting for a batch that is in flight (its
    `wait_empty` returns at once once the consumer is stopping), so a batch could write rows
    into closed tables, or after its partition was handed to another worker."""

    memstream_runtime: Runtime | None = None

    async def on_stop(self) -> None:
        if self.memstream_runtime is not None:
            await self.memstream_runtime.drain()
        await super().on_stop()


class _NullValue(WireFormatError):
    """An input record with no value."""



def _only_documented_pages(app: faust.App) -> None:
    """Serve none of Faust's built-in blueprints, whatever the settings say (an operator's
    `APP_WEB_*_ENABLED` variable included): with stats off Faust still mounts its production
    index at `/`. Only the views memstream registers (README, "HTTP API") are served."""
    faust_internals.drop_builtin_blueprints(app)


def _advertised_host(settings: Settings) -> str:
    return socket.gethostname() if settings.web_host in ("0.0.0.0", "::") else settings.web_host
