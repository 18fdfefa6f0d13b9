"""The one settings object.

Every knob memstream has is a field here, read from an environment variable with the
``MEMSTREAM_`` prefix (the field name upper-cased). Nothing else in the code reads the
environment. ``memstream settings`` prints the effective values; docs/operations.md documents them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .core.limits import DEFAULT_LIMITS, MAX_JSON_DEPTH_CEILING, Limits

PREFIX = "MEMSTREAM_"


#: the longest a fetch request may be held (MEMSTREAM_FETCH_MAX_WAIT_MS, MEMSTREAM_FETCH_BACKLOG_WAIT_MS): while
#: one is held, a drained partition waits for it before it is fetched again (and Faust's request timeout is 90 s)
FETCH_WAIT_MAX_MS = 10_000
OUTPUT_PRODUCERS = ("librdkafka", "faust")  #: values of MEMSTREAM_OUTPUT_PRODUCER
STANDBY_APPLIERS = ("librdkafka", "faust")  #: values of MEMSTREAM_STANDBY_APPLY
INPUT_FETCHERS = ("faust", "librdkafka")  #: values of MEMSTREAM_INPUT_FETCH
INPUT_QUEUE_KBYTES_MAX = 2_097_151  #: librdkafka's largest `queued.max.messages.kbytes`
FETCH_MIN_BYTES_MAX = 100_000_000  #: librdkafka's largest `fetch.min.bytes`
CONSUME_MAX = 1_000_000  #: most records one `consume()` of confluent-kafka takes (batches and standby batches)
#: longest batch wait (MEMSTREAM_INPUT_FETCH=faust): a batch's first record may wait this long for company
BATCH_WAIT_MAX_MS = 10_000


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used."""


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "memstream")


@dataclass(frozen=True)
class Settings:
    # --- Kafka and the Schema Registry -------------------------------------------------
    broker: str = field(default="127.0.0.1:19092", metadata={"doc": "Kafka bootstrap servers (host:port[,host:port])."})
    registry_url: str = field(
        default="http://127.0.0.1:18081/apis/ccompat/v7",
        metadata={"doc": "Confluent-compatible Schema Registry URL; empty = no registry (Avro single-object encoding)."},
    )
    partitions: int = field(default=6, metadata={"doc": "Partitions of every catalog topic (and so of every changelog)."})
    max_partitions: int = field(default=1024, metadata={"doc": "The most partitions `memstream repartition --to` raises a deployment to (a typo of 10000 would create that many partitions per topic and changelog)."})
    replication: int = field(default=1, metadata={"doc": "Replication factor of every catalog topic."})
    # --- the worker ---------------------------------------------------------------------
    app_id: str = field(default="memstream", metadata={"doc": "Faust app id = Kafka consumer group id and changelog prefix."})
    store: str = field(default="rocksdb://", metadata={"doc": "Faust table store: rocksdb:// (production and the Kafka tests) or memory:// (nothing kept on disk)."})
    web_port: int = field(default=6066, metadata={"doc": "HTTP port of this worker (each worker on one host needs its own)."})
    web_host: str = field(default="127.0.0.1", metadata={"doc": "Interface the worker's HTTP server binds and advertises."})
    data_dir: str = field(default="var/worker", metadata={"doc": "Faust data dir (RocksDB tables); one per worker on a host."})
    standby_replicas: int = field(default=1, metadata={"doc": "Table standby replicas kept by other workers for fast failover."})
    standby_apply: str = field(default="librdkafka", metadata={"doc": "Who applies a worker's standby replicas of its RocksDB tables: `librdkafka` (one confluent-kafka consumer in its own thread writes their changelog records into the partition stores in write batches, with Faust's persisted offset, so a takeover recovers from there as before; streams/runtime/standby.py) or `faust` (Faust's record-by-record path: measured at 0.08 ms of CPU per input record on a two-worker fleet, bench/RESULTS.md). The `memory://` store always uses Faust's."})
    standby_batch_max: int = field(default=5000, metadata={"doc": "Most changelog records the standby applier (MEMSTREAM_STANDBY_APPLY=librdkafka) takes from its consumer and writes at once (one RocksDB write batch per partition); 1 to 1000000 (what one librdkafka consume() takes)."})
    log_level: str = field(default="info", metadata={"doc": "Worker log level."})
    session_timeout_s: float = field(default=10.0, metadata={"doc": "Consumer-group session timeout: a worker that stops heartbeating (killed, hung) loses its partitions after this long (failover time)."})
    output_timeout_s: float = field(default=60.0, metadata={"doc": "The longest a record the worker sends through its output producer (an output or a changelog row) may stay unacknowledged (librdkafka's `message.timeout.ms`, whose own default is 300 s). After it the batch fails, nothing of it is committed and the worker exits (70), so that a supervisor restarts it and its partitions move, instead of holding them while a broker hangs or its producer is stuck (one was seen delivering nothing after its broker's restart until this timeout)."})
    producer_linger_ms: int = field(default=5, metadata={"doc": "How long the worker's producer waits to fill a request while the agents produce (larger requests, fewer syscalls); once a batch waits for its records they are sent at once."})
    output_producer: str = field(default="librdkafka", metadata={"doc": "What sends a batch's output records and changelog rows: `librdkafka` (one confluent-kafka producer per worker, idempotent, acks=all, murmur2 partitioner; a batch awaits its acknowledgements before its table writes, and those of its rows before its offsets) or `faust` (Faust's own producer, the earlier path: about twice the CPU per record). Same bytes, keys and partitions either way (tests/runtime/test_outputs_kafka.py)."})
    batch_max: int = field(default=500, metadata={"doc": "Most input records a stateful agent takes in one batch (outputs of a batch are acknowledged before its table writes); 1 to 1000000 (what one librdkafka consume() takes)."})
    dlq_max_copy_bytes: int = field(default=512 * 1024, metadata={"doc": "A dead letter copies the original key and value only up to this many bytes together; a larger original is referenced (topic, partition, offset, size, SHA-256), so a dead letter always fits the broker's message limit."})
    dlq_max_reason_chars: int = field(default=2000, metadata={"doc": "Longest reason a dead letter (and its `__connect.errors.exception.message` header) carries; longer ones are cut, saying how much was left out."})
    state_batch_max_bytes: int = field(default=256 * 1024, metadata={"doc": "Most bytes of one user's rows a batch stages before it is made durable early (bounds the redo log in the user's memory-state row by this plus one record's rows, whatever the backlog)."})
    health_check_interval_s: float = field(default=10.0, metadata={"doc": "Seconds between a worker's checks of what it depends on: the schema registry (reachable, every schema id it used still naming the same schema), the broker (reachable) and its data disk (docs/operations.md, monitoring)."})
    registry_timeout_s: float = field(default=5.0, metadata={"doc": "Seconds one request of a worker to the schema registry may take. A registry that hangs (its port open, no answer) fails the request after this: a record that needs a schema id not yet cached waits this long per attempt (then it is retried), and the health probe names `registry_unreachable` once a check has waited this long or half of MEMSTREAM_HEALTH_CHECK_INTERVAL_S, whichever is shorter."})
    min_free_disk_bytes: int = field(default=32 * 1024 * 1024, metadata={"doc": "A worker whose data dir has less free space than this stops at once with exit status 74, naming the directory (as it does on any \"No space left on device\")."})
    shutdown_timeout_s: float = field(default=60.0, metadata={"doc": "A worker still stopping this many seconds after SIGTERM/SIGINT ends at once (exit status 75); nothing unapplied is committed."})
    recovery_stall_s: float = field(default=120.0, metadata={"doc": "/health reports `recovery_stuck` when table recovery has made no progress for this many seconds."})
    restore_ahead: bool = field(default=True, metadata={"doc": "Before joining the group, a worker copies every table changelog partition its local store lacks into it in bulk (streams/runtime/restore.py: one librdkafka consumer, RocksDB write batches with Faust's persisted offsets), so Faust restores only what was written since: an empty data dir is ready many times sooner. Every partition is copied (which ones the worker gets is unknown before it joins); `false` leaves everything to Faust's record-by-record restore."})
    warm_up: bool = field(default=True, metadata={"doc": "Before taking records, a worker runs the consolidation core once on a synthetic user (streams/core/warmup.py), so its compiled loops are loaded (numba's cache; compiled on a first start) before the first batch needs them: ~1 s of CPU at each start. `false` skips it: the first batch that meets a user past MEMSTREAM_EXACT_SCAN_NODES live nodes pays instead (the test suite's workers, which start by the hundred and seldom need the loops, run with `false`)."})
    restore_ahead_timeout_s: float = field(default=300.0, metadata={"doc": "Longest the restore ahead runs; what it has not copied by then Faust restores."})
    restore_ahead_batch_bytes: int = field(default=16 * 1024 * 1024, metadata={"doc": "Most bytes of one partition's rows the restore ahead holds before it writes them (with their offset) to the partition's store."})
    row_cache_bytes: int = field(default=32 * 1024 * 1024, metadata={"doc": "Bound (encoded JSON bytes) of the decoded rows a worker keeps of the tables written only by updates (the analytics table): the row a batch writes is handed to the key's next update instead of being read and decoded again (streams/runtime/row_cache.py); least recently written first out, emptied at every rebalance. 0 keeps none."})
    state_wal: bool = field(default=False, metadata={"doc": "Whether the tables' RocksDB stores keep RocksDB's write-ahead log. Off by default: a store then holds, after any stop, a prefix of its writes in order (Faust's persisted changelog offset included), which the changelog completes at the next start, and an unclean stop discards the local tables anyway (docs/state-and-failures.md, \"The tables' write-ahead log\"); off saved ~7% of the CPU per record (bench/RESULTS.md). `true` keeps the log (a clean restart then never re-reads rows from the changelog)."})
    rocksdb_write_buffer_bytes: int = field(default=16 * 1024 * 1024, metadata={"doc": "Size of one RocksDB memtable of one table partition store. A worker holds a store per table partition it owns or keeps as a standby, each with up to MEMSTREAM_ROCKSDB_WRITE_BUFFERS memtables, so its memory for unflushed rows is bounded by stores × this × that (Faust's default, 64 MiB × 3, let two workers on 6 partitions grow ~700 MiB each before a first flush: bench/RESULTS.md, soak)."})
    rocksdb_write_buffers: int = field(default=2, metadata={"doc": "Most RocksDB memtables (one being written, the rest being flushed) of one table partition store; at least 2."})
    rocksdb_block_cache_bytes: int = field(default=32 * 1024 * 1024, metadata={"doc": "RocksDB block cache of one table partition store (reads of rows not in the worker's own caches). Faust's default is 2 GiB per store; 0 caches no block."})
    rocksdb_memory_bytes: int = field(default=256 * 1024 * 1024, metadata={"doc": "One RocksDB memory budget for all of a worker's table partition stores (every table, active and standby): a block cache of this size shared by every store, the memtables charged to it (at most half of it; past that RocksDB flushes the largest), so RocksDB's memory does not grow with the stores a worker holds (a worker that takes over many partitions after an outage, or a table added). Each store's MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES and _WRITE_BUFFERS still bound its own memtables; MEMSTREAM_ROCKSDB_BLOCK_CACHE_BYTES is then unused. 0: no shared budget, each store has its own block cache (MEMSTREAM_ROCKSDB_BLOCK_CACHE_BYTES) and RocksDB's memory grows with the number of stores."})
    max_known_schema_ids: int = field(default=10000, metadata={"doc": "Most schema ids a worker remembers (with the schema each named) in `<data dir>/schema-ids.json`, to notice a registry that hands them out again."})
    fetch_min_bytes: int = field(default=65536, metadata={"doc": "While records flow, a worker's fetch requests ask the broker to hold them until this many bytes of records are there (or MEMSTREAM_FETCH_MAX_WAIT_MS passed); after MEMSTREAM_FETCH_QUIET_MS without records they ask for Faust's 1 byte / 1500 ms, so the first record after a quiet spell is answered at once and an idle worker does not poll (streams/runtime/fetch_pace.py). Paced at 900 records/s, 65536 with a 25 ms wait cut a worker's CPU by 40% against 1 byte (bench/RESULTS.md). 1 asks for single records throughout. The stateful agents' input consumers (MEMSTREAM_INPUT_FETCH=librdkafka) always ask for this, held at most MEMSTREAM_FETCH_MAX_WAIT_MS (librdkafka cannot change it on a running consumer): paced at 925 records/s, asking for 1 byte made the broker answer a fetch per few records and cost it more CPU than the worker's own (p99 8.7 s against 0.47 s, bench/RESULTS.md); an idle worker's input consumers then fetch every MEMSTREAM_FETCH_MAX_WAIT_MS. At most 100000000 (librdkafka's limit)."})
    fetch_max_wait_ms: int = field(default=25, metadata={"doc": "While records flow, the longest the broker holds a worker's fetch request for MEMSTREAM_FETCH_MIN_BYTES: at most this much latency added at low rates (1500 when quiet: MEMSTREAM_FETCH_QUIET_MS); at most 10000."})
    fetch_backlog_records: int = field(default=1000, metadata={"doc": "A fetch that hands the streams at least this many records means a backlog: the worker's next fetch requests may be held MEMSTREAM_FETCH_BACKLOG_WAIT_MS, until a fetch hands fewer (the records already fetched keep it busy meanwhile; only its partitions without buffered records are fetched then, and each request costs the consumer thread ~2 ms of CPU)."})
    fetch_backlog_wait_ms: int = field(default=250, metadata={"doc": "The longest the broker holds a worker's fetch request during a backlog (MEMSTREAM_FETCH_BACKLOG_RECORDS); at most MEMSTREAM_FETCH_MAX_WAIT_MS has no effect; at most 10000."})
    fetch_quiet_ms: int = field(default=500, metadata={"doc": "After this long without a fetched record a worker's fetch requests go back to Faust's 1 byte / 1500 ms (an idle worker then fetches every 1.5 s instead of every MEMSTREAM_FETCH_MAX_WAIT_MS). Each fetch of a flowing worker costs its consumer thread ~2 ms of CPU (aiokafka handles every assigned partition in Python): after a burst, 2000 ms of flowing fetches cost the same-job bench ~25 µs per record (bench/RESULTS.md). Faust's consumer batches its fetches only while it fetches records at a rate (MEMSTREAM_INPUT_FETCH=faust or MEMSTREAM_STANDBY_APPLY=faust); with both librdkafka (the defaults) it fetches only ticks, relay-policy changes and a recovery's changelogs, always with 1 byte / 1500 ms (streams/runtime/rebalance.py `sparse_fetches`): each tick otherwise began a flowing spell, and an idle worker spent 10.8% of a core instead of 5.5%."})
    input_fetch: str = field(default="librdkafka", metadata={"doc": "Who fetches the stateful agents' input records: `librdkafka` (one confluent-kafka consumer per stateful agent, in its own thread, hands the agent whole batches; Faust still assigns the partitions and restores the tables, and each batch's offsets are committed through Faust's consumer, the group's member: streams/runtime/direct_input.py, docs/state-and-failures.md §9) or `faust` (Faust's consumer and its per-record hand-off to the agent's stream, the earlier path: about a sixth more CPU per record on the same-job bench)."})
    input_queue_kbytes: int = field(default=16384, metadata={"doc": "With MEMSTREAM_INPUT_FETCH=librdkafka: most KiB of input records each stateful agent's consumer prefetches (librdkafka's `queued.max.messages.kbytes`)."})
    batch_wait_ms: int = field(default=5, metadata={"doc": "With MEMSTREAM_INPUT_FETCH=faust: the longest a stateful agent waits, after a batch's first record, for more to fill it; 1 to 10000 (a batch's first record may wait that long). The librdkafka fetch (the default) does not wait: a batch is what librdkafka has fetched when the agent is ready for one, since the broker already holds each fetch for up to MEMSTREAM_FETCH_MAX_WAIT_MS to gather records and records that come during a batch wait for the next; its 5 ms wait had only delayed every batch at low rates (bench/RESULTS.md)."})
    # --- pipeline rules ------------------------------------------------------------------
    text_merge_threshold: float = field(default=0.85, metadata={"doc": "Text similarity (n-gram Jaccard) at or above which a candidate merges into a node."})
    text_supersede_threshold: float = field(default=0.50, metadata={"doc": "Lower edge of the text contradiction band (supersede) for semantic memories."})
    embedding_merge_threshold: float = field(default=0.95, metadata={"doc": "Embedding cosine at or above which a candidate merges."})
    embedding_supersede_threshold: float = field(default=0.80, metadata={"doc": "Lower edge of the embedding contradiction band (supersede)."})
    promotion_min_reinforcements: int = field(default=3, metadata={"doc": "Promotion policy: reinforcement count needed (seed default 3)."})
    promotion_min_confidence: float = field(default=0.85, metadata={"doc": "Promotion policy: confidence needed (seed default 0.85)."})
    exact_scan_nodes: int = field(default=32, metadata={"doc": "A user with at most this many live nodes is compared with each of them exactly, without hashing (no MinHash signatures or LSH tables are built for the user until it has more; also bounds the per-user cache of node shingle sets). Only speed and memory depend on it, never a decision of the default decider on the bench streams (tests/core/test_golden_paths.py)."})
    loaded_nodes_max: int = field(default=100_000, metadata={"doc": "Bound of the memory state a worker keeps loaded: users are read from the `memory-state` table on first touch (a record, a sweep, a query) and the least recently used are dropped once the loaded users' live nodes (+1 per user, + a 32nd of the ids each holds without their node: its superseded nodes, read on demand, and its de-duplication window) exceed this. ~10 KB per node with its similarity index, so the default keeps it near 1 GiB; a user larger than the bound is still loaded (alone), and the users of the batch being applied stay until it is written."})
    prefill_nodes: int = field(default=50_000, metadata={"doc": "After every rebalance (and at start) a worker reads the users of its partitions into the memory cache in the background, in slices of at most 10 ms, until the loaded users' nodes reach this (capped at MEMSTREAM_LOADED_NODES_MAX): the first records of a user then do not wait for its rows to be read (streams/agents/prefill.py). 0: users are read on first touch only."})
    dedup_max_ids: int = field(default=2000, metadata={"doc": "Input ids remembered per user for duplicate detection (within 7 days)."})
    relay_threshold: str = field(default="personal", metadata={"doc": "Default consented sensitivity threshold of the relay: content above it is redacted (per-user override: PUT /v1/relay/{motebit_id}/threshold)."})
    erase_max_nodes_per_step: int = field(default=1000, metadata={"doc": "Most memory nodes one step of a user's erasure deletes (`memstream erase`); a larger user is erased in several steps, each a bounded batch of rows (the agent sends itself the next step)."})
    erase_receipt_max_ids: int = field(default=1000, metadata={"doc": "Most node ids an erasure receipt (memory.erase-receipts.v1) lists; it always counts them all and carries a digest of every id."})
    negotiator_write_enabled: bool = field(default=True, metadata={"doc": "The host's memory write flag: off = negotiator `remember` returns null (forget always works)."})
    api_tokens: str = field(default="", metadata={"doc": "HTTP bearer tokens: `token:level[:scope+scope][:name=n][:users=id|prefix*]`, comma-separated, or a JSON list (docs/http-api.md). `level` (none..secret) is the highest sensitivity the token reads; scopes `admin` (relay thresholds), `negotiator` (remember/forget), `ops` (cluster assignment); `users=` binds it to users. The earlier `token:level` still works: read-only, every user."})
    http_header_timeout_s: float = field(default=10.0, metadata={"doc": "A new HTTP connection that has not sent a complete request head within this many seconds is closed (slow or half-open clients)."})
    http_read_timeout_s: float = field(default=30.0, metadata={"doc": "A request body that has not arrived within this many seconds is answered 408."})
    http_idle_timeout_s: float = field(default=75.0, metadata={"doc": "An HTTP connection with no request in flight (keep-alive, or never used) is closed after this many seconds."})
    http_max_body_bytes: int = field(default=1024 * 1024, metadata={"doc": "Largest HTTP request body a worker reads (bytes); a larger one is answered 413, from its Content-Length before any of it is read, or as soon as a body without one passes the limit."})
    http_max_connections: int = field(default=1000, metadata={"doc": "Most open HTTP connections per worker; a connection beyond it is closed at once (forwarding between workers uses connections too)."})
    graph_stall_ms: int = field(default=15 * 60 * 1000, metadata={"doc": "A graph node running longer than this (ms) is flagged stalled."})
    timer_interval_s: float = field(default=30.0, metadata={"doc": "Seconds between rounds of the partition-local timers (housekeeping, analytics publish, graph stalls; more than 0): each round's ticks are sent spread over the interval."})
    housekeeping_max_rows_per_tick: int = field(default=20_000, metadata={"doc": "Most `memory-state` rows one housekeeping tick reads in one partition (the sweep holds the memory state's lock, so the agent's batches wait for it): the next tick goes on after the last user read, and the sweep of a partition takes ceil(rows / this) ticks. A user is never split."})
    housekeeping_max_seconds_per_tick: float = field(default=0.1, metadata={"doc": "Longest one housekeeping tick holds the memory state's lock in one partition (seconds, wall clock: the sweep lets the event loop run between users, and that time counts): the next tick goes on after the last user read. Without it a worker that owns many partitions, or whose users are not loaded yet (a restart), spent its time in sweeps and applied a few records a second. A user is never split."})
    # --- input limits (docs/records.md#limits): a record over one is dead-lettered, the limit named
    max_content_bytes: int = field(default=DEFAULT_LIMITS.max_content_bytes, metadata={"doc": "Most UTF-8 bytes of a memory's content (candidate, `memory_formed`): a node row and its events stay far below Kafka's 1 MB message limit."})
    max_embedding_dims: int = field(default=DEFAULT_LIMITS.max_embedding_dims, metadata={"doc": "Most dimensions of a candidate's embedding (the largest common embedding models have 3072–4096)."})
    max_extra_entries: int = field(default=DEFAULT_LIMITS.max_extra_entries, metadata={"doc": "Most `extra` header lines of a candidate (also: `missed_patterns` and `tagged_memories` entries)."})
    max_extra_entry_bytes: int = field(default=DEFAULT_LIMITS.max_extra_entry_bytes, metadata={"doc": "Most UTF-8 bytes of one `extra` header line (and of one `missed_patterns` entry)."})
    max_id_chars: int = field(default=DEFAULT_LIMITS.max_id_chars, metadata={"doc": "Most characters of any id (motebit_id, user_id, candidate_id, event_id, node_id, session_id, graph_id, turn_id, request_id, device_id, …); ids use only `[A-Za-z0-9._:@-]`, first a letter or digit."})
    max_label_chars: int = field(default=DEFAULT_LIMITS.max_label_chars, metadata={"doc": "Most characters of a short label: `kind`, `frontmatter_type`, a graph node's agent/status/signal type, a session's compaction id, command id, provider, model."})
    max_text_bytes: int = field(default=DEFAULT_LIMITS.max_text_bytes, metadata={"doc": "Most UTF-8 bytes of free text that is passed on but not stored: a turn's user message and agent reply, an event's `reason`, `turn_message`."})
    max_negotiator_content_bytes: int = field(default=DEFAULT_LIMITS.max_negotiator_content_bytes, metadata={"doc": "Most UTF-8 bytes of a negotiator `remember` content (and of a `forget` description); with the memories per user this bounds the user's negotiator row and an `ambiguous` forget reply."})
    max_negotiator_memories: int = field(default=DEFAULT_LIMITS.max_negotiator_memories, metadata={"doc": "Most negotiator memories stored per user (a `remember` beyond it is refused with an error; forget one first)."})
    max_negotiator_forgotten: int = field(default=DEFAULT_LIMITS.max_negotiator_forgotten, metadata={"doc": "Forgotten negotiator memory ids (and their fingerprints) remembered per user; the oldest are dropped beyond it."})
    max_graph_nodes: int = field(default=DEFAULT_LIMITS.max_graph_nodes, metadata={"doc": "Most nodes in one graph's state (an event introducing one more is dead-lettered)."})
    max_graph_labels: int = field(default=DEFAULT_LIMITS.max_graph_labels, metadata={"doc": "Most distinct degraded-notification kinds counted per graph."})
    max_shadowed_seqs: int = field(default=DEFAULT_LIMITS.max_shadowed_seqs, metadata={"doc": "Most `shadowedSeqs` / `sourceEventSeqs` in one session event."})
    max_ledger_shadowed_seqs: int = field(default=DEFAULT_LIMITS.max_ledger_shadowed_seqs, metadata={"doc": "Most shadowed seqs kept over all compactions of one session ledger (the oldest closed compactions are trimmed first)."})
    max_error_chars: int = field(default=DEFAULT_LIMITS.max_error_chars, metadata={"doc": "A compaction's `error` text is stored cut to this many characters."})
    max_json_depth: int = field(default=DEFAULT_LIMITS.max_json_depth, metadata={"doc": "Most levels arrays and objects may nest in JSON carried inside a record (a session event's `json` data, a graph-log line); checked before parsing, so a hostile document is dead-lettered with this limit named, not a parser crash. 1..512."})
    max_future_skew_ms: int = field(default=DEFAULT_LIMITS.max_future_skew_ms, metadata={"doc": "A memory input (event, candidate, turn, negotiator request) whose `timestamp` or `valid_from` is later than its Kafka record timestamp plus this many ms, or earlier than 2000-01-01, is dead-lettered (`invalid_time`). The Kafka record timestamp, not the clock, so a replay decides the same."})
    # --- the graph-log shipper (memstream ship-graph-logs) ---------------------------------
    shipper_offsets_dir: str = field(default="var/shipper", metadata={"doc": "Where `ship-graph-logs` looks for an offsets file of its earlier (pre-transactions) version to import once (`<shipper id>.offsets.json`) unless --offsets names one; positions now live in `shipper.positions.v1`."})
    shipper_poll_s: float = field(default=1.0, metadata={"doc": "Seconds `ship-graph-logs` waits between scans of the directory (unless --poll)."})
    shipper_batch_lines: int = field(default=500, metadata={"doc": "Most lines the shipper sends in one transaction, with the file's position (1..512: even a read_uncommitted reader's graph agent dedupes an aborted batch and its retry)."})
    shipper_transaction_timeout_s: float = field(default=30.0, metadata={"doc": "Transaction timeout of the shipper's producer: a shipper killed and not restarted holds back read_committed readers of what it wrote for at most this long (a restart ends it at once)."})
    # --- the local stack (memstream dev up) ----------------------------------------------
    cache_dir: str = field(default_factory=_default_cache_dir, metadata={"doc": "Where `dev up` keeps downloaded Kafka / Apicurio, outside git (default $XDG_CACHE_HOME/memstream or ~/.cache/memstream)."})
    stack_dir: str = field(default=".memstream/stack", metadata={"doc": "Runtime dir of the local stack: data, logs, pid files."})
    kafka_version: str = field(default="4.1.1", metadata={"doc": "Apache Kafka version fetched from Maven Central."})
    apicurio_version: str = field(default="3.3.3", metadata={"doc": "Apicurio Registry version fetched from Maven Central."})
    controller_port: int = field(default=19093, metadata={"doc": "KRaft controller port of the local broker."})
    registry_java: str = field(default="", metadata={"doc": "java binary for Apicurio (needs Java 21+); empty = search JAVA_HOME and /usr/lib/jvm."})
    kafka_jvm_options: str = field(default="-Xms256m -Xmx1g -XX:+UseG1GC", metadata={"doc": "JVM options of the local broker (`dev up`), split like a shell line. The test suite uses `-Xms256m -Xmx1g -XX:+UseSerialGC -XX:TieredStopAtLevel=1`: C1 only and the serial collector, about half the broker's CPU for its short-lived stacks."})
    stack_timeout: float = field(default=120.0, metadata={"doc": "Seconds `dev up` waits for each service to answer."})

    # ------------------------------------------------------------------------------------
    @property
    def broker_host_port(self) -> tuple[str, int]:
        first = self.broker.split(",")[0]
        host, _, port = first.rpartition(":")
        return host or "127.0.0.1", int(port)

    @property
    def registry_host_port(self) -> tuple[str, int]:
        from urllib.parse import urlparse

        u = urlparse(self.registry_url)
        return u.hostname or "127.0.0.1", u.port or 80

    def limits(self) -> Limits:
        """The input limits as the pure core takes them (streams.core.limits.Limits)."""
        return Limits(**{name: getattr(self, name) for name in Limits.names()})

    def index_config(self) -> Any:
        """The similarity-index parameters the pure core takes (streams.core.IndexConfig)."""
        from .core.similarity import IndexConfig

        return IndexConfig(exact_scan_below=max(0, self.exact_scan_nodes))

    def __post_init__(self) -> None:
        if self.output_producer not in OUTPUT_PRODUCERS:
            raise SettingsError(f"MEMSTREAM_OUTPUT_PRODUCER={self.output_producer!r} is not one of "
                                f"{', '.join(OUTPUT_PRODUCERS)}")
        if self.input_fetch not in INPUT_FETCHERS:
            raise SettingsError(f"MEMSTREAM_INPUT_FETCH={self.input_fetch!r} is not one of {', '.join(INPUT_FETCHERS)}")
        if not 1 <= self.input_queue_kbytes <= INPUT_QUEUE_KBYTES_MAX:
            raise SettingsError(f"MEMSTREAM_INPUT_QUEUE_KBYTES={self.input_queue_kbytes} must be between 1 and "
                                f"{INPUT_QUEUE_KBYTES_MAX} (librdkafka's limit)")
        if self.standby_apply not in STANDBY_APPLIERS:
            raise SettingsError(f"MEMSTREAM_STANDBY_APPLY={self.standby_apply!r} is not one of "
                                f"{', '.join(STANDBY_APPLIERS)}")
        for name in ("loaded_nodes_max", "housekeeping_max_rows_per_tick",  # bounds: 0 would bound nothing
                     "restore_ahead_batch_bytes", "fetch_min_bytes", "fetch_max_wait_ms", "fetch_quiet_ms",
                     "fetch_backlog_records", "fetch_backlog_wait_ms",
                     "standby_batch_max", "http_max_body_bytes",  # (the broker refuses < 0)
                     "batch_max",  # 0: no batch ever holds a record (the agent would spin, its input never read)
                     "batch_wait_ms"):  # 0: Faust's take_events would wait for a full batch, however long
            if getattr(self, name) < 1:
                raise SettingsError(f"MEMSTREAM_{name.upper()}={getattr(self, name)} must be at least 1")
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH_CEILING:  # the parser recurses per level
            raise SettingsError(f"MEMSTREAM_MAX_JSON_DEPTH={self.max_json_depth} must be between 1 and {MAX_JSON_DEPTH_CEILING}")
        if not self.housekeeping_max_seconds_per_tick > 0:
            raise SettingsError(f"MEMSTREAM_HOUSEKEEPING_MAX_SECONDS_PER_TICK={self.housekeeping_max_seconds_per_tick} "
                                "must be more than 0")
        if not self.timer_interval_s > 0:  # 0 or less: the timers would send ticks without pause
            raise SettingsError(f"MEMSTREAM_TIMER_INTERVAL_S={self.timer_interval_s} must be more than 0")
        if self.fetch_min_bytes > FETCH_MIN_BYTES_MAX:  # also the input consumers' `fetch.min.bytes`
            raise SettingsError(f"MEMSTREAM_FETCH_MIN_BYTES={self.fetch_min_bytes} must be at most {FETCH_MIN_BYTES_MAX} "
                                "(librdkafka's limit)")
        for name in ("fetch_max_wait_ms", "fetch_backlog_wait_ms"):  # the broker holds the request this long:
            if getattr(self, name) > FETCH_WAIT_MAX_MS:  # meanwhile no other partition of it is fetched
                raise SettingsError(f"MEMSTREAM_{name.upper()}={getattr(self, name)} must be at most {FETCH_WAIT_MAX_MS}")
        for name in ("batch_max", "standby_batch_max"):  # taken with one consume(); more is refused there, at run time
            if getattr(self, name) > CONSUME_MAX:
                raise SettingsError(f"MEMSTREAM_{name.upper()}={getattr(self, name)} must be at most {CONSUME_MAX} "
                                    "(one librdkafka consume() takes at most that many records)")
        if self.batch_wait_ms > BATCH_WAIT_MAX_MS:
            raise SettingsError(f"MEMSTREAM_BATCH_WAIT_MS={self.batch_wait_ms} must be at most {BATCH_WAIT_MAX_MS} (a "
                                "batch's first record may wait that long for company)")
        if not max(1, self.producer_linger_ms + 1) <= self.output_timeout_s * 1000 <= 2**31 - 1:  # librdkafka's bounds
            raise SettingsError(f"MEMSTREAM_OUTPUT_TIMEOUT_S={self.output_timeout_s} must be more than "
                                f"MEMSTREAM_PRODUCER_LINGER_MS ({self.producer_linger_ms} ms) and at most 2147483")
        if not self.registry_timeout_s > 0:
            raise SettingsError(f"MEMSTREAM_REGISTRY_TIMEOUT_S={self.registry_timeout_s} must be more than 0")
        if self.rocksdb_write_buffer_bytes < 64 * 1024:  # RocksDB's own floor
            raise SettingsError(f"MEMSTREAM_ROCKSDB_WRITE_BUFFER_BYTES={self.rocksdb_write_buffer_bytes} must be at least 65536")
        if self.rocksdb_write_buffers < 2:  # one written while one is flushed (RocksDB raises less to 2)
            raise SettingsError(f"MEMSTREAM_ROCKSDB_WRITE_BUFFERS={self.rocksdb_write_buffers} must be at least 2")
        for name in ("prefill_nodes", "row_cache_bytes", "rocksdb_block_cache_bytes", "rocksdb_memory_bytes"):  # 0: none
            if getattr(self, name) < 0:
                raise SettingsError(f"MEMSTREAM_{name.upper()}={getattr(self, name)} must be 0 (none) or more")

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = PREFIX + f.name.upper()
            if key not in env:
                continue
            raw = env[key]
            values[f.name] = _coerce(key, raw, f.type)
        return cls(**values)

    @classmethod
    def documentation(cls) -> list[tuple[str, str, str]]:
        """(variable, default, doc) for every setting, for README and `memstream settings`."""
        out = []
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else "(computed)"
            out.append((PREFIX + f.name.upper(), str(default), f.metadata.get("doc", "")))
        return out


def _coerce(key: str, raw: str, typ: Any) -> Any:
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if typ == "int":
            return int(raw)
        if typ == "float":
            return float(raw)
        if typ == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not a valid {typ}") from None
    return raw
