"""The ONE module that touches private Faust, aiokafka and mode attributes (issue 16).

memstream works around, or builds on, behaviour of faust-streaming 0.15.3, aiokafka 0.14.0 and
mode-streaming 0.7.1 that those libraries do not offer as public API (each function below says
which private name of which version it uses, and why memstream needs it). Everything else in
`streams/` calls these functions; a test (tests/runtime/test_faust_internals.py) scans every
other module for the names in `WRAPPED_PRIVATE_NAMES` and for assignments to the attributes in
`PATCHED_ATTRIBUTES`, so a new use cannot slip in elsewhere.

One exception, by choice: `streams/runtime/rebalance.py` keeps its two subclasses of Faust's
aiokafka consumer and consumer thread, because fixing Faust's rebalance defects means overriding
private methods (a subclass must spell their names: moving the classes here would make this module
the rebalance fix rather than a thin adapter). The private methods they override are listed once,
here, in `CONSUMER_OVERRIDES`; the test allows exactly those names in rebalance.py, and every
private attribute they *read or write* goes through a function of this module.

`PINNED` is the set of versions these were read in and verified against. Another installed version
fails tests/runtime/test_faust_internals.py loudly, and the worker logs one WARNING at start
(`warn_if_unpinned`; it does not refuse to start). rocksdict is used through its public API only
(`Rdict.get`, `items(from_key=...)`, `iter()`, `set_write_options`), so it is not listed.

Not covered here: aiohttp internals (`RequestHandler._manager`, `AppRunner._make_server`, ...) in
`streams/runtime/web.py`'s server limits; they are aiohttp's, not Faust's.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any

from faust import streams as _faust_streams
from faust.stores.base import SerializedStore

if TYPE_CHECKING:
    import faust
    from faust.types import TP, EventT, TableT

#: The versions whose private APIs this module was read against (the exact pins of pyproject.toml).
PINNED: dict[str, str] = {
    "faust-streaming": "0.15.3",
    "aiokafka": "0.14.0",
    "mode-streaming": "0.7.1",
}

#: (where, private name) of every private attribute used below, `where` an importable
#: `module` or `module:Class` of the pinned versions (the test checks each still exists there).
PRIVATE_API: tuple[tuple[str, str], ...] = (
    ("faust.streams", "_current_event"),
    ("faust.transport.consumer:Consumer", "_committed_offset"),
    ("faust.transport.consumer:Consumer", "_read_offset"),
    ("faust.transport.consumer:Consumer", "_buffered_partitions"),
    ("faust.transport.consumer:Consumer", "_unacked_messages"),
    ("faust.transport.consumer:Consumer", "_is_changelog_tp"),
    ("faust.transport.consumer:ThreadDelegateConsumer", "_thread"),
    ("faust.transport.consumer:ThreadDelegateConsumer", "_method_queue"),
    ("faust.tables.base:Collection", "_new_changelog_topic"),
    ("faust.tables.base:Collection", "_verify_source_topic_partitions"),
    ("faust.stores.rocksdb:Store", "_dbs"),
    ("faust.stores.rocksdb:Store", "_db_for_partition"),
    ("faust.stores.rocksdb:Store", "_open_for_partition"),
    ("faust.stores.base:Store", "_decode_value"),
    ("faust.stores.base:Store", "_encode_key"),
    ("faust.stores.base:Store", "_encode_value"),
    ("faust.web.base:BlueprintManager", "_enabled"),
    ("faust.web.drivers.aiohttp:Web", "_runner"),
    ("aiokafka.consumer.consumer:AIOKafkaConsumer", "_isolation_level"),
    ("aiokafka.consumer.consumer:AIOKafkaConsumer", "_fetch_min_bytes"),
    ("aiokafka.consumer.consumer:AIOKafkaConsumer", "_fetch_max_wait_ms"),
    ("aiokafka.consumer.consumer:AIOKafkaConsumer", "_fetcher"),
    ("aiokafka.consumer.fetcher:Fetcher", "_fetch_min_bytes"),
    ("aiokafka.consumer.fetcher:Fetcher", "_subscriptions"),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_ensure_consumer"),
    ("aiokafka.consumer.fetcher:Fetcher", "_fetch_max_wait_ms"),
    ("mode.worker:Worker", "_schedule_shutdown"),
    ("mode.worker:Worker", "_signal_stop_time"),
)

#: The private methods `streams/runtime/rebalance.py` overrides (and calls through `super()`).
CONSUMER_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_create_worker_consumer"),
    ("faust.transport.drivers.aiokafka:Consumer", "_new_consumer_thread"),
    ("faust.transport.consumer:Consumer", "_reset_state"),
    ("faust.transport.consumer:Consumer", "_getmany"),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_fetch_records"),
)

#: Private names no module of `streams/` but this one (and rebalance.py, for `CONSUMER_OVERRIDES`) spells.
WRAPPED_PRIVATE_NAMES: tuple[str, ...] = tuple(sorted({name for _, name in PRIVATE_API + CONSUMER_OVERRIDES}))

#: Public attributes of Faust objects that memstream replaces (monkeypatches) on an instance or a
#: class: assigned here only.
PATCHED_ATTRIBUTES: tuple[str, ...] = (
    "Consumer", "acked", "changelog_topic", "key_serializer", "max_messages", "send_changelog", "value_serializer")

#: Faust's built-in web apps (tables, router, stats, graph, metrics pages) are blueprints named so.
_BUILTIN_BLUEPRINTS = "faust.web.apps."


# ------------------------------------------------------------------------------------------------
# versions
# ------------------------------------------------------------------------------------------------


def installed_versions(dists: Iterable[str] = PINNED) -> dict[str, str | None]:
    """The installed version of each distribution (None: not installed)."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def version_mismatches(installed: Mapping[str, str | None], pinned: Mapping[str, str] = PINNED) -> list[str]:
    """One message per pinned distribution whose installed version differs (none when all match)."""
    return [f"{dist} {installed.get(dist) or '(not installed)'} is installed but memstream relies on private "
            f"internals of {dist} {version}: review streams/runtime/faust_internals.py"
            for dist, version in pinned.items() if installed.get(dist) != version]


def warn_if_unpinned(log: logging.Logger, installed: Mapping[str, str | None] | None = None) -> list[str]:
    """At worker start: one WARNING naming every mismatch (the worker still starts). `installed`:
    the installed versions (default: `installed_versions()`)."""
    problems = version_mismatches(installed_versions() if installed is None else installed)
    if problems:
        log.warning("unverified library versions: %s", "; ".join(problems))
    return problems


# ------------------------------------------------------------------------------------------------
# events and acknowledgements
# ------------------------------------------------------------------------------------------------


@contextmanager
def current_event(event: EventT) -> Iterator[None]:
    """Make `event` Faust's current event while the block runs.

    faust-streaming 0.15.3: `faust.streams._current_event`, a module ContextVar holding a weak
    reference to the event (set the same way by `Stream.__aiter__`). A table write goes to the
    changelog partition of the current event; memstream writes a batch's staged rows after the
    batch's outputs are acknowledged (streams/runtime/checkpoint.py), outside the stream's loop, so
    it sets each row's event itself."""
    token = _faust_streams._current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _faust_streams._current_event.reset(token)


def mark_acked_without_commit(events: Iterable[EventT]) -> None:
    """Mark the events' messages acknowledged without telling the consumer, so their offsets are
    never committed (a restart or the partition's next owner reads them again).

    faust-streaming 0.15.3: `Consumer.ack` returns at once for a message whose `acked` is set, and
    `Stream.take_events` acknowledges every taken event when the agent leaves the batch, even by an
    exception; memstream needs a batch it did not apply never to be committed."""
    for event in events:
        forget_ack(event.message)


# ------------------------------------------------------------------------------------------------
# consumer
# ------------------------------------------------------------------------------------------------


def install_consumer_class(app: faust.App, cls: type) -> None:
    """Make `cls` the consumer class of the app's transport (before anything creates
    `app.consumer`).

    faust-streaming 0.15.3 has no setting for the consumer class of the `kafka://` transport:
    `Transport.Consumer` is a class attribute. memstream installs its rebalance-safe consumer
    (streams/runtime/rebalance.py)."""
    app.transport.Consumer = cls  # type: ignore[misc]


def committed_offset(consumer: Any, tp: TP) -> int | None:
    """The offset Faust last committed (or read as committed) for `tp`; None when it knows none.

    faust-streaming 0.15.3: `Consumer._committed_offset`, a defaultdict (read with `.get`: `[]`
    would insert None). Read by `/metrics` (consumer lag) without a broker round trip."""
    return getattr(consumer, "_committed_offset", {}).get(tp)


def read_offset(consumer: Any, tp: TP) -> int | None:
    """The offset below which Faust's fetcher drops a record of `tp` as already read; None: none.

    faust-streaming 0.15.3: `Consumer._read_offset`, a defaultdict (read with `.get`), written by
    `_drain_messages` after each delivered record and by `seek`/`perform_seek`. rebalance.py checks
    each fetch against it (defect 6)."""
    return getattr(consumer, "_read_offset", {}).get(tp)


def set_read_offset(consumer: Any, tp: TP, offset: int) -> None:
    """Let Faust's fetcher deliver the records of `tp` from `offset` on, as its `seek` does
    (`Consumer._read_offset`; 0 is stored as None, Faust's own convention)."""
    consumer._read_offset[tp] = offset if offset else None


def forget_ack(message: Any) -> None:
    """Mark one message acknowledged without counting it: `Consumer.ack` returns at once for it
    from then on, and its offset is never committed (as `mark_acked_without_commit`)."""
    message.acked = True


def unacked_messages(consumer: Any) -> list[Any]:
    """The messages the consumer has handed to the streams and not seen acknowledged yet.

    faust-streaming 0.15.3: `Consumer._unacked_messages`, a WeakSet filled by `track_message`;
    `Consumer.wait_empty` (a stopping worker) loops until it is empty, dropping those whose
    `acked` is set after each round (`_clean_unacked_messages`)."""
    return list(consumer._unacked_messages)


def forget_buffered(consumer: Any, tps: set[TP]) -> None:
    """Drop `tps` from the partitions Faust treats as buffered.

    faust-streaming 0.15.3: `Consumer._buffered_partitions`; `getmany` delivers records of a
    "buffered" partition even while it is paused (rebalance.py's `pause_partitions`)."""
    consumer._buffered_partitions -= tps


def is_changelog_tp(consumer: Any, tp: TP) -> bool:
    """Whether `tp` is a table changelog partition (faust-streaming 0.15.3 `Consumer._is_changelog_tp`):
    rebalance.py defers resuming stream partitions only, never changelogs."""
    return bool(consumer._is_changelog_tp(tp))


def rebalance_queue_stopped(consumer: Any) -> bool:
    """Whether the consumer's method queue, through which its fetch thread hands rebalance
    callbacks to the event loop (`Consumer.threadsafe_partitions_assigned` / `_revoked`), has
    stopped: a callback queued now is never run, and its promise never fulfilled."""
    return bool(consumer._method_queue.should_stop)


def consumer_thread(consumer: Any) -> Any:
    """The consumer's aiokafka thread (faust-streaming 0.15.3 `ThreadDelegateConsumer._thread`):
    rebalance.py asks it for the assignment and seeks partitions there to their beginning, and
    the runtime commits the offsets of inputs fetched outside Faust through its `commit`
    (`AIOKafkaConsumerThread.commit`: the assigned partitions' offsets, as the group's member;
    False when a rebalance came first)."""
    return consumer._thread


def position_known(thread: Any, tp: TP) -> bool:
    """Whether aiokafka knows where `tp`'s next fetch starts (faust-streaming 0.15.3
    `AIOKafkaConsumerThread._ensure_consumer`, aiokafka 0.14.0 `Fetcher._subscriptions` and the
    partition state's public `has_valid_position`): between an assignment and the seek that
    gives a partition its position it does not, and Faust's livelock check reading `position`
    then fails an assertion that crashes the consumer (rebalance.py defect 9)."""
    from aiokafka.structs import TopicPartition

    consumer = thread._ensure_consumer()
    assignment = consumer._fetcher._subscriptions.subscription
    if assignment is None:
        return False
    state = assignment.assignment.state_value(TopicPartition(tp.topic, tp.partition))
    return state is not None and bool(state.has_valid_position)


def read_committed(aiokafka_consumer: Any) -> None:
    """Make an aiokafka consumer read with `isolation.level=read_committed`.

    aiokafka 0.14.0: `AIOKafkaConsumer._isolation_level`, read when it starts its fetcher;
    faust-streaming 0.15.3 passes read_uncommitted unless its exactly-once mode is on, and the
    graph-log shipper's aborted transactions must not be applied (docs/shipper.md)."""
    aiokafka_consumer._isolation_level = "read_committed"


def fetch_batching(aiokafka_consumer: Any, min_bytes: int, max_wait_ms: int) -> None:
    """Make an aiokafka consumer's fetch requests ask the broker to wait for `min_bytes` of
    records, at most `max_wait_ms`, from its next fetch request on.

    aiokafka 0.14.0: `AIOKafkaConsumer._fetch_min_bytes` / `_fetch_max_wait_ms`, read when it
    starts its fetcher, which copies them and reads its own copies each time it builds a fetch
    request (`Fetcher._fetch_min_bytes` / `_fetch_max_wait_ms`); faust-streaming 0.15.3 passes
    neither (aiokafka's 1 byte) and 1,500 ms. Call it in the consumer's own thread."""
    aiokafka_consumer._fetch_min_bytes = min_bytes
    aiokafka_consumer._fetch_max_wait_ms = max_wait_ms
    fetcher = getattr(aiokafka_consumer, "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_min_bytes = min_bytes
        fetcher._fetch_max_wait_ms = max_wait_ms


# ------------------------------------------------------------------------------------------------
# tables and their changelogs
# ------------------------------------------------------------------------------------------------


def rebuild_changelog_topic(table: TableT, key_serializer: str, value_serializer: str,
                            decode_values: bool = True) -> Any:
    """Give the table these serializers and rebuild its changelog topic with them; returns the topic.

    faust-streaming 0.15.3 builds the changelog topic in the table's constructor with serializers
    derived from `key_type` (JSON when unset), ignoring the schema; `Collection._new_changelog_topic`
    builds it again. memstream needs the changelog keys to be the source key bytes (routing and the
    changelog partition hash them).

    `decode_values=False` (a RocksDB table): the topic hands the changelog records Faust reads
    (recovery, standby replicas) to the table with their value bytes undecoded. The RocksDB store
    writes `message.value` as it is (`Store.apply_changelog_batch`) and never looks at the decoded
    value, so decoding it (JSON, a user's aux row up to MEMSTREAM_STATE_BATCH_MAX_BYTES) was work
    thrown away for every row restored or replicated. Sending is unchanged: `Table.send_changelog`
    names the table's own serializers."""
    table.key_serializer = key_serializer  # type: ignore[attr-defined]
    table.value_serializer = value_serializer  # type: ignore[attr-defined]
    topic = table._new_changelog_topic()  # type: ignore[attr-defined]
    if not decode_values:
        from faust import Schema

        topic = topic.derive(schema=Schema(key_serializer=key_serializer, value_serializer="raw"))
    table.changelog_topic = topic
    return topic


def read_row(table: TableT, key: Any) -> Any:
    """`table.get(key)` inside an event, for one RocksDB read instead of two.

    faust-streaming 0.15.3: `Mapping.get` on a table asks `key in store` (a RocksDB get in the
    current event's partition) and then `store[key]` (the same get again, then the decode). A
    RocksDB store is read here as its own `Store._get` reads it in an event (the partition store
    of the current event, for a table neither global nor using the partitioner): one get, one
    decode. Any other store, or no current event: `table.get(key)`."""
    store = rocksdb_store(table)
    partition = current_partition() if store is not None else None
    if store is None or partition is None or table.is_global or table.use_partitioner:
        return table.get(key)
    raw = store._db_for_partition(partition).get(store._encode_key(key))
    return None if raw is None else store._decode_value(raw)


def current_partition() -> int | None:
    """The partition of Faust's current event (where a table write goes), None outside one."""
    event = _faust_streams.current_event()
    return None if event is None else event.message.partition


def verify_source_partitions(table: TableT, source_topic: str) -> None:
    """Faust's check before a table's first row from `source_topic` (faust-streaming 0.15.3
    `Collection._verify_source_topic_partitions`, once per topic): raises `PartitionsMismatch`
    when the topic and the table's changelog have different partition counts (a row would land in
    the changelog partition of another key space)."""
    table._verify_source_topic_partitions(source_topic)  # type: ignore[attr-defined]


def encoded_key(store: SerializedStore, key: Any) -> bytes:
    """The bytes a serialized store (and the table's changelog, `Runtime.table`) keeps for `key`
    (faust-streaming 0.15.3 `Store._encode_key`: the table's key serializer)."""
    return store._encode_key(key)


def encoded_row(table: TableT, value: Any) -> Any:
    """What to assign to `table[key]` for the row `value`: for a serialized store (RocksDB) the
    bytes it would write, else the value itself.

    faust-streaming 0.15.3 serializes a table row twice, both times through
    `app.serializers.dumps_value` with the table's value serializer: once for the store
    (`SerializedStore._encode_value`) and once for the changelog (`Topic.prepare_value`), and
    neither serializes a `bytes` value (`dumps_value(skip=(bytes,))`). Encoding the row here once
    gives both the same bytes they would have made, for half the work (a user's aux row carries
    its batch's node rows: up to MEMSTREAM_STATE_BATCH_MAX_BYTES). Reads still decode.

    A store whose rows go through Faust's `json` codec alone (no model type, the codec not
    chained) is encoded by the call that codec ends in — `orjson.dumps` with Faust's `on_default`
    and options (`faust.utils.json.dumps`) — without the serializer registry's layers (~1.5 µs a
    row); `json_row_encoder` decides once per store, and tests/runtime/test_row_encoding.py holds
    the bytes equal to Faust's."""
    store = getattr(table, "data", None)
    if isinstance(value, (bytes, bytearray)) or not isinstance(store, SerializedStore):
        return value
    chosen = _ROW_ENCODERS.get(id(store))
    if chosen is None or chosen[0]() is not store:
        chosen = _ROW_ENCODERS[id(store)] = (weakref.ref(store), json_row_encoder(store) or store._encode_value)
    return chosen[1](value)


#: id(store) -> (a reference to it, its row encoder): `encoded_row`'s choice, made once per store
_ROW_ENCODERS: dict[int, tuple[Callable[[], Any], Callable[[Any], bytes | None]]] = {}


def json_row_encoder(store: SerializedStore) -> Callable[[Any], bytes | None] | None:
    """`orjson.dumps` as faust-streaming 0.15.3 calls it for a row of `store`, when that is all
    `Store._encode_value` does with a plain row: the value serializer is the `json` codec itself
    (`faust.serializers.codecs.json`, nothing chained after it), no model type, and Faust's JSON
    backend is orjson (`faust.utils.json.dumps`). None otherwise (Faust's own path is used)."""
    from faust.serializers import codecs as faust_codecs
    from faust.utils import json as faust_json

    orjson = getattr(faust_json, "orjson", None)
    serializer = getattr(store, "value_serializer", None)
    if orjson is None or store.value_type is not None or serializer != "json":
        return None
    codec = faust_codecs.get_codec(serializer)
    if type(codec) is not faust_codecs.json or codec.children:
        return None
    dumps, default = orjson.dumps, faust_json.on_default
    option = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z

    def encode(value: Any) -> bytes | None:
        if type(value) is dict:  # a row: what the codec would hand orjson
            return dumps(value, default=default, option=option)
        return store._encode_value(value)  # a model or anything else: Faust's way
    return encode


def replace_send_changelog(table: TableT, send: Callable[..., Any]) -> None:
    """Route the table's changelog writes through `send(partition, key, value, key_serializer,
    value_serializer)`, which returns what `changelog_sent` returns (or Faust's FutureMessage).

    faust-streaming 0.15.3: `Table.on_key_set` / `on_key_del` call `send_changelog` and read only
    the returned message's partition; memstream makes a batch wait for its rows (and may send them
    through its own producer, streams/runtime/outputs.py)."""
    table.send_changelog = send  # type: ignore[method-assign]


class _ChangelogSent:
    """What `Table.on_key_set` reads of a changelog send: the message's partition."""

    __slots__ = ("message", "partition")

    def __init__(self, partition: int) -> None:
        self.message = self
        self.partition = partition


def changelog_sent(partition: int) -> Any:
    """A stand-in for Faust's FutureMessage of a changelog row sent by other means (faust-streaming
    0.15.3 `Table.on_key_set` reads `fut.message.partition`, nothing else)."""
    return _ChangelogSent(partition)


def mark_changelog_persisted(table: TableT, tp: TP, offset: int) -> None:
    """What Faust does once it has sent a changelog row (faust-streaming 0.15.3
    `Collection._on_changelog_sent`): remember the offset in the table's local store, so that
    recovery reads only what follows. Needed for rows memstream sends itself."""
    table.data.set_persisted_offset(tp, offset)  # type: ignore[attr-defined]


def rocksdb_store(table: TableT) -> Any | None:
    """The table's RocksDB store (rocksdict driver), or None for any other store.

    faust-streaming 0.15.3 `faust/stores/rocksdb.py`: one `rocksdict.Rdict` per partition in
    `Store._dbs`, opened by `Store._db_for_partition`. memstream reads one user's rows by a prefix
    scan instead of every row of the table (streams/agents/state_scan.py)."""
    store = getattr(table, "data", None)
    if hasattr(store, "_dbs") and getattr(store, "use_rocksdict", False) and hasattr(store, "_db_for_partition"):
        return store
    return None


#: id(table) -> a weak reference to it, for the tables whose partition stores skip RocksDB's WAL.
#: Not a WeakSet: its membership test compares tables with `==`, which for a Faust table is
#: `Mapping.__eq__` (every row of both decoded), and it ran at every partition store opened.
_WITHOUT_WAL: dict[int, weakref.ref] = {}


def _without_wal(table: Any) -> bool:
    ref = _WITHOUT_WAL.get(id(table))
    return ref is not None and ref() is table


def write_without_wal(table: TableT) -> None:
    """Open the table's RocksDB partition stores with RocksDB's write-ahead log off (rocksdict
    `WriteOptions.disable_wal`, for every `put`, `delete` and write batch through that handle).

    faust-streaming 0.15.3 opens a partition's Rdict in `Store._open_for_partition` and never
    sets its write options; this wraps that method (once, for the class) to set them on the
    stores of the tables named here. Why it is safe is in docs/state-and-failures.md ("The
    tables' write-ahead log"); the restore ahead opens its own handles (`RocksDBOptions.open`)
    and sets the same write options on them (streams/runtime/restore.py `open_partition_store`)."""
    from faust.stores.rocksdb import Store

    _WITHOUT_WAL[id(table)] = weakref.ref(table)
    if getattr(Store._open_for_partition, "memstream_no_wal", False):
        return
    opened = Store._open_for_partition

    def _open_for_partition(self: Any, partition: int) -> Any:
        db = opened(self, partition)
        if _without_wal(self.table):
            db.set_write_options(no_wal_write_options())
        return db

    _open_for_partition.memstream_no_wal = True  # type: ignore[attr-defined]
    Store._open_for_partition = _open_for_partition  # type: ignore[method-assign]


def collect_only_when_a_store_closes() -> None:
    """Skip faust-streaming's full garbage collection at a revocation that closes no partition store.

    faust-streaming 0.15.3 `Store.revoke_partitions` (RocksDB) drops the Rdicts of the revoked
    partitions of its table and then calls `gc.collect()` (the collection closes an Rdict that a
    reference cycle still holds, releasing its lock): once per table at every rebalance, whether
    it dropped a store or not. A full collection walks the worker's whole heap, its loaded users
    included, with the event loop blocked (bench/RESULTS.md stop 22: 20-60 ms a table at start,
    more with more users loaded). This wraps that method (once, for the class) so that a call
    that would drop no store does nothing; one that drops a store runs Faust's code unchanged."""
    from faust.stores.rocksdb import Store

    if getattr(Store.revoke_partitions, "memstream_collect_when_closing", False):
        return
    revoke = Store.revoke_partitions

    def revoke_partitions(self: Any, table: Any, tps: Any) -> None:
        topics = table.changelog_topic.topics
        if any(tp.topic in topics and tp.partition in self._dbs for tp in tps):
            revoke(self, table, tps)

    revoke_partitions.memstream_collect_when_closing = True  # type: ignore[attr-defined]
    Store.revoke_partitions = revoke_partitions  # type: ignore[method-assign]


def no_wal_write_options() -> Any:
    """rocksdict write options with the write-ahead log off (sync off, as RocksDB's default)."""
    import rocksdict

    options = rocksdict.WriteOptions()
    # a property in rocksdict 0.3.29 (its .pyi declares a method: hence the ignore)
    options.disable_wal = True  # type: ignore[method-assign, assignment]
    return options


def rocksdb_partition_db(store: Any, partition: int) -> Any:
    """The partition's Rdict (raw keys and values), opened if Faust has not yet, as its own `_get`
    does (faust-streaming 0.15.3 `Store._db_for_partition`)."""
    return store._db_for_partition(partition)


def rocksdb_open_partitions(store: Any) -> list[int]:
    """The partitions whose Rdict is open (faust-streaming 0.15.3 `Store._dbs`; standby copies too)."""
    return list(store._dbs)


#: the table option (a `SharedRocksDBMemory`) that `share_rocksdb_memory` gives every store it opens
SHARED_MEMORY_OPTION = "memstream_shared_memory"


class SharedRocksDBMemory:
    """One RocksDB memory budget for every partition store of a worker: one LRU block cache of
    `capacity` bytes shared by every store, with the stores' memtables charged to it by one write
    buffer manager (memtables at most half of it: past that RocksDB flushes the largest), so what
    RocksDB holds is bounded by `capacity` whatever the number of stores (tables × partitions,
    active and standby) a worker holds. Kafka Streams bounds its stores the same way (a shared
    `Cache` and `WriteBufferManager` in a `RocksDBConfigSetter`)."""

    def __init__(self, capacity: int) -> None:
        import rocksdict

        self.capacity = capacity
        self.cache = rocksdict.Cache(capacity)
        self.write_buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            capacity // 2, False, self.cache)


def share_rocksdb_memory() -> None:
    """Open every RocksDB store whose table options carry a `SharedRocksDBMemory`
    (`SHARED_MEMORY_OPTION`) with that budget's block cache and write buffer manager.

    faust-streaming 0.15.3 `RocksDBOptions.as_options` (rocksdict driver) builds each store's
    options with a block cache of its own (`Cache(block_cache_size)`) and keeps the table
    options it does not know in `extra_options` (unused by that driver); this wraps that method
    (once, for the class) to set the shared cache and the write buffer manager instead, with
    Faust's other table options (bloom filter, index type). Faust's stores and the restore
    ahead's (`RocksDBOptions.open`) both open through it."""
    from faust.stores.rocksdb import RocksDBOptions

    if getattr(RocksDBOptions.as_options, "memstream_shared_memory", False):
        return
    as_options = RocksDBOptions.as_options

    def shared_as_options(self: Any) -> Any:
        options = as_options(self)
        shared = self.extra_options.get(SHARED_MEMORY_OPTION) if self.use_rocksdict else None
        if shared is not None:
            import rocksdict

            table = rocksdict.BlockBasedOptions()
            table.set_bloom_filter(self.bloom_filter_size, block_based=True)
            table.set_block_cache(shared.cache)
            table.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
            options.set_block_based_table_factory(table)
            options.set_write_buffer_manager(shared.write_buffers)
        return options

    shared_as_options.memstream_shared_memory = True  # type: ignore[attr-defined]
    RocksDBOptions.as_options = shared_as_options  # type: ignore[method-assign]


#: `rocksdb_memory`'s kinds: RocksDB's property for each (per partition store, summed)
ROCKSDB_MEMORY_PROPERTIES = {"memtables": "rocksdb.cur-size-all-mem-tables",
                             "block_cache": "rocksdb.block-cache-usage",
                             "table_readers": "rocksdb.estimate-table-readers-mem"}


def rocksdb_memory(store: Any) -> dict[str, int]:
    """Bytes of memory RocksDB itself holds for the store's open partition stores (standby copies
    too), by kind (`ROCKSDB_MEMORY_PROPERTIES`): memtables, block cache (one per partition store:
    `RocksDBOptions.as_options` makes a `Cache` per open), index and filter blocks of the SST files.
    A store with a shared budget (`SharedRocksDBMemory`) counts no block cache here: that cache is
    the worker's, counted once by its owner."""
    shared = store.rocksdb_options.extra_options.get(SHARED_MEMORY_OPTION) is not None
    out = dict.fromkeys(ROCKSDB_MEMORY_PROPERTIES, 0)
    for db in list(store._dbs.values()):
        for kind, prop in ROCKSDB_MEMORY_PROPERTIES.items():
            if not (shared and kind == "block_cache"):
                out[kind] += int(db.property_int_value(prop) or 0)
    return out


def rocksdb_value_decoder(store: Any) -> Callable[[bytes], Any]:
    """The store's decoder of a stored value (faust-streaming 0.15.3 `Store._decode_value`: the
    table's value serializer)."""
    return store._decode_value


# ------------------------------------------------------------------------------------------------
# app, web server, producer, worker
# ------------------------------------------------------------------------------------------------


def set_producer_buffer_max(app: faust.App, messages: int) -> None:
    """Let the producer buffer `messages` before it pauses the stream to flush them one by one
    (faust-streaming 0.15.3 `ProducerBuffer.max_messages`, 100, no setting). A batch writes its
    table rows in one burst; the default would throttle every batch."""
    app.producer.buffer.max_messages = messages


def drop_builtin_blueprints(app: faust.App) -> None:
    """Serve none of Faust's built-in web apps, whatever the settings say (an operator's
    `APP_WEB_*_ENABLED` variable included): with stats off Faust still mounts its production
    index at `/`. faust-streaming 0.15.3: `BlueprintManager._enabled`, the (prefix, blueprint)
    pairs it will mount (docs/threat-model.md)."""
    blueprints = app.web.blueprints
    blueprints._enabled = [(prefix, bp) for prefix, bp in blueprints._enabled
                           if not (isinstance(bp, str) and bp.startswith(_BUILTIN_BLUEPRINTS))]


def install_web_runner(app: faust.App, make_runner: Callable[[Any], Any]) -> None:
    """Replace the aiohttp `AppRunner` of the app's web server by `make_runner(web_app)` (before the
    server starts). faust-streaming 0.15.3 `faust.web.drivers.aiohttp.Web._runner`, built as
    `AppRunner(web_app, access_log=None)` with no limits: memstream needs timeouts and a connection
    cap (streams/runtime/web.py `install_server_limits`)."""
    app.web._runner = make_runner(app.web.web_app)  # type: ignore[attr-defined]


def worker_class(on_first_stop_signal: Callable[[], None]) -> type:
    """A `faust.Worker` subclass that calls `on_first_stop_signal()` at the first SIGTERM/SIGINT.

    mode-streaming 0.7.1: `Worker._schedule_shutdown(signal)` handles both signals and sets
    `Worker._signal_stop_time` at the first. memstream arms a bounded shutdown deadline there
    (streams/runtime/probe.py `arm_shutdown_deadline`)."""
    from faust.worker import Worker

    class _BoundedStopWorker(Worker):
        def _schedule_shutdown(self, signal: Any) -> None:
            if not self._signal_stop_time:
                on_first_stop_signal()
            super()._schedule_shutdown(signal)

    return _BoundedStopWorker
