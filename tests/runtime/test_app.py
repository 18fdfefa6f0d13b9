"""The Faust app's wiring (no broker needed: the app is built, not started)."""

from __future__ import annotations

import pytest

from streams.agents import consumed_topics
from streams.composition import register_all
from streams.contracts import catalog
from streams.runtime.app import Runtime
from streams.settings import Settings


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(Settings(registry_url="", partitions=5))
    register_all(rt)
    return rt


def test_every_table_changelog_keys_are_the_source_key_bytes(runtime):
    # table_route and the changelog partition both hash these bytes: they must be the UTF-8
    # key the input topics are partitioned by (not Faust's default JSON-quoted key)
    for name, table in runtime.tables.items():
        assert runtime.app.router._get_serialized_key(table, "mb-ünï") == "mb-ünï".encode(), name
        assert table.changelog_topic.partitions == 5, name


def test_every_changelog_and_internal_topic_is_created_by_the_worker_before_faust_subscribes(runtime):
    # a topic missing from the consumer's first metadata snapshot reads as 0 partitions until the
    # next refresh (minutes): Faust then refuses the table's first write (PartitionsMismatch)
    created = {name: (partitions, config) for name, partitions, config in runtime.internal_topics}
    for name, table in runtime.tables.items():
        assert created[table.changelog_topic.get_topic_name()] == (5, {"cleanup.policy": "compact"}), name
    ticks = [n for n in created if n.endswith("-ticks")]
    assert ticks and all(created[n][1] == {"retention.ms": "3600000"} for n in ticks)


def test_partition_of_matches_murmur2_of_the_java_client(runtime):
    # reference values: Java's Utils.murmur2 (positive) % 5, as librdkafka's murmur2_random computes
    from aiokafka.partitioner import murmur2

    for key in ("mb-ada", "g-1", "s-x", ""):
        assert runtime.partition_of(key) == (murmur2(key.encode()) & 0x7FFFFFFF) % 5


def test_agents_consume_every_input_topic_and_only_inputs():
    inputs = {t.name for t in catalog.topics() if t.direction == "in"}
    assert set(consumed_topics()) == inputs


def test_worker_views_are_registered(runtime):
    pages = set(runtime.app.web.views)
    expected = {"/v1/memory/{motebit_id}/nodes", "/v1/memory/{motebit_id}/nodes/{node_id}", "/v1/graphs/{graph_id}",
                "/v1/sessions/{session_id}/compactions", "/v1/negotiator/{user_id}/remember",
                "/v1/negotiator/{user_id}/forget", "/v1/relay/{motebit_id}/threshold"}
    assert expected <= pages, expected - pages


def test_key_owner_comes_from_the_assignor_not_the_kafka_clients_metadata(runtime):
    # Faust's own router asked the producer for the changelog topic's metadata: None on a fresh
    # stack (TypeError, a 500). Ours needs only the assignor's changelog partition -> URL table:
    # it answers here, in an app whose producer never started (Faust's raises NotReady).
    from streams.runtime.web import OwnerUnknown, PartitionRouter

    router = runtime.app.router
    assert isinstance(router, PartitionRouter)
    table = runtime.tables["session-ledger"]
    topic = table.changelog_topic.get_topic_name()
    assignor = runtime.app.assignor
    assignor.changelog_distribution = {}
    with pytest.raises(OwnerUnknown):  # a KeyError: ApiView.answer_at_owner answers 503 + Retry-After
        router.key_store("session-ledger", "s-1")
    p = runtime.partition_of("s-1")
    assignor.changelog_distribution = {"http://a:1": {topic: [q for q in range(5) if q != p]},
                                       "http://b:2": {topic: [p]}}
    try:
        assert str(router.key_store("session-ledger", "s-1")) == "http://b:2"
        for key in ("mb-ünï", "g-7", "x/y"):
            owner = "http://b:2" if runtime.partition_of(key) == p else "http://a:1"
            assert str(router.key_store("session-ledger", key)) == owner
    finally:
        assignor.changelog_distribution = {}


def test_an_unexpected_exception_in_a_view_is_a_logged_empty_500(runtime, caplog):
    import asyncio

    from streams.api.http import ApiView

    class Boom(ApiView):
        async def get(self, request, **kwargs):
            raise TypeError("'NoneType' object is not iterable")

    class FakeRequest:
        method, path, match_info = "GET", "/v1/boom", {}

    view = Boom(runtime.app, runtime.app.web)
    response = asyncio.run(view.dispatch(FakeRequest()))
    assert response.status == 500 and response.body == b""
    assert "GET /v1/boom failed" in caplog.text


def test_unavailable_answers_503_with_retry_after(runtime):
    from streams.api.http import RETRY_AFTER_S, ApiView

    view = ApiView(runtime.app, runtime.app.web)
    response = view.unavailable("retry")
    assert response.status == 503 and response.headers["Retry-After"] == str(RETRY_AFTER_S)


class _Message:
    """What `Runtime.counts_ack` reads of a Faust message (weak-referenceable, as Faust's are)."""

    def __init__(self, topic: str, offset: int) -> None:
        self.topic, self.offset, self.acked = topic, offset, False


def test_the_stateful_agents_source_topics_are_guarded(runtime):
    # every input a stateful agent applies in batches: its records are committed only once applied
    for name in (catalog.MEMORY_CANDIDATES, catalog.MEMORY_EVENTS, catalog.SESSION_EVENTS, catalog.GRAPH_EVENTS):
        assert runtime.counts_ack(_Message(name, 7)) is False, name


def test_an_ack_counts_only_for_a_record_whose_batch_was_applied(runtime):
    applied, skipped = _Message(catalog.MEMORY_CANDIDATES, 1), _Message(catalog.MEMORY_CANDIDATES, 2)
    runtime._applied.add(applied)
    assert runtime.counts_ack(applied) is True
    # Faust skips and acknowledges a record taken while the flow is suspended: not counted
    assert runtime.counts_ack(skipped) is False
    # once counted, the record is forgotten (an acknowledgement is counted once)
    assert runtime.counts_ack(applied) is False


def test_records_of_other_topics_count_as_faust_acknowledges_them(runtime):
    assert runtime.counts_ack(_Message("it-app-memory-housekeeping-ticks", 3)) is True


def _changelog_message(topic: str, value: bytes):
    from faust.types.tuples import Message

    return Message(topic=topic, partition=0, offset=7, timestamp=0, timestamp_type=0, headers=[],
                   key="mb-ünï".encode(), value=value, checksum=None)


def test_a_rocksdb_tables_changelog_records_reach_the_store_undecoded(runtime):
    # recovery and standby replicas: the RocksDB store writes the value bytes as they are, so
    # decoding them (JSON) was thrown away; what the table sends is still JSON of the row
    import asyncio

    for name, table in runtime.tables.items():
        topic = table.changelog_topic
        event = asyncio.run(topic.decode(_changelog_message(topic.get_topic_name(), b'{"a": [1, 2]}')))
        assert event.key == "mb-ünï" and event.value == b'{"a": [1, 2]}', name
        assert table.value_serializer == "json", name
        sent = topic.prepare_value({"a": [1, 2]}, table.value_serializer, None, None)[0]
        assert sent == b'{"a":[1,2]}', name


def test_a_rocksdb_row_is_encoded_once_into_the_bytes_the_store_and_its_changelog_would_make(runtime):
    # Faust serializes a row for the store and again for the changelog, and serializes no bytes:
    # assigning the encoded row gives both exactly what they made before, and reads still decode
    from streams.runtime.faust_internals import encoded_row

    row = {"node_id": "n-ü", "pending": {"a/b": None, "c": {"x": [1.5, -0.0, 1e-7]}}, "n": 2 ** 40}
    for name, table in runtime.tables.items():
        store = table.data
        encoded = encoded_row(table, row)
        assert isinstance(encoded, bytes), name
        assert encoded == store._encode_value(row), name
        assert encoded == table.changelog_topic.prepare_value(row, table.value_serializer, None, None)[0], name
        assert store._encode_value(encoded) == encoded, name  # passed through, not encoded again
        assert table.changelog_topic.prepare_value(encoded, table.value_serializer, None, None)[0] == encoded, name
        assert store._decode_value(encoded) == row, name
        assert encoded_row(table, encoded) is encoded, name


def test_a_memory_tables_row_is_kept_as_the_object():
    from streams.runtime.faust_internals import encoded_row

    rt = Runtime(Settings(registry_url="", partitions=5, store="memory://"))
    register_all(rt)
    row = {"a": [1, 2]}
    for table in rt.tables.values():
        assert encoded_row(table, row) is row


def test_a_memory_tables_changelog_records_are_decoded():
    # memory:// keeps the decoded objects: its changelog values must be decoded as before
    import asyncio

    rt = Runtime(Settings(registry_url="", partitions=5, store="memory://"))
    register_all(rt)
    for name, table in rt.tables.items():
        topic = table.changelog_topic
        event = asyncio.run(topic.decode(_changelog_message(topic.get_topic_name(), b'{"a": [1, 2]}')))
        assert event.value == {"a": [1, 2]}, name


def _fetch_settings_seen(monkeypatch, **settings) -> list[tuple]:
    """The worker consumer's fetch (min bytes, max wait) at its start and after each of a series
    of fetches (records of an input, none, none after a pause, a backlog, a recovery's changelog)."""
    import asyncio
    from types import SimpleNamespace

    from faust.transport.drivers import aiokafka as faust_aiokafka
    from faust.types import TP

    fetched: list[dict] = []

    async def faust_fetch(self, consumer, active_partitions, timeout=None, max_records=None):
        return fetched.pop(0)

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "_fetch_records", faust_fetch)

    async def settings_seen():
        rt = Runtime(Settings(registry_url="", partitions=5, fetch_min_bytes=777, fetch_max_wait_ms=33,
                              fetch_quiet_ms=50, fetch_backlog_records=3, fetch_backlog_wait_ms=444, **settings))
        register_all(rt)
        thread = rt.app.consumer._thread
        consumer = thread._create_worker_consumer(rt.app.transport)
        consumer._fetcher = SimpleNamespace(_fetch_min_bytes=None, _fetch_max_wait_ms=None)  # as started
        seen = [(consumer._fetch_min_bytes, consumer._fetch_max_wait_ms, consumer._isolation_level)]
        try:
            tp, tq = TP("memory.candidates.v1", 0), TP("memory.events.v1", 1)
            changelog = TP(rt.tables["memory-state"].changelog_topic.get_topic_name(), 0)
            for records, pause in (({tp: [1, 2]}, 0), ({}, 0), ({}, 0.08), ({tp: [3]}, 0),
                                   ({tp: [4, 5], tq: [6]}, 0), ({}, 0), ({tp: [7]}, 0),
                                   ({changelog: [8, 9, 10, 11]}, 0)):
                await asyncio.sleep(pause)
                fetched.append(records)
                assert await thread._fetch_records(consumer, None, timeout=1) == records
                seen.append((consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms))
            return seen
        finally:
            consumer._fetcher = None  # (never started)
            await consumer.stop()

    return asyncio.run(settings_seen())


@pytest.mark.parametrize("fetched_by_faust", [{"input_fetch": "faust"}, {"standby_apply": "faust"}])
def test_the_worker_consumer_batches_its_fetches_while_records_flow_and_reads_committed(monkeypatch, fetched_by_faust):
    """Faust's consumer fetches inputs or standby changelogs at a rate: its fetches gather while
    records flow (MEMSTREAM_FETCH_*)."""
    assert _fetch_settings_seen(monkeypatch, **fetched_by_faust) == [
        (1, 1500, "read_committed"),  # quiet until records come: the first is answered at once
        (777, 33),  # records: fetches gather
        (777, 33),  # an empty fetch right after: still flowing
        (1, 1500),  # none for longer than MEMSTREAM_FETCH_QUIET_MS: quiet again
        (777, 33),
        (777, 444),  # MEMSTREAM_FETCH_BACKLOG_RECORDS in one fetch: a backlog, held longer
        (777, 444),
        (777, 33),  # fewer: flowing
        (777, 33),  # a recovery's changelog rows, however many, are no backlog (its waits stay short)
    ]


def test_a_worker_consumer_that_fetches_only_sparse_records_keeps_fausts_fetch_settings(monkeypatch):
    """The defaults (inputs fetched and standbys applied by librdkafka): Faust's consumer fetches
    ticks, relay-policy changes and a recovery's changelogs only, always with 1 byte / 1500 ms."""
    from streams.runtime.rebalance import sparse_fetches

    assert sparse_fetches(Settings())
    assert not sparse_fetches(Settings(input_fetch="faust")) and not sparse_fetches(Settings(standby_apply="faust"))
    seen = _fetch_settings_seen(monkeypatch)
    assert seen[0] == (1, 1500, "read_committed")
    assert set(seen[1:]) == {(None, None)}, seen  # the fetcher's settings never changed from the start's


def test_a_record_that_reaches_faust_for_a_fetched_agent_is_logged_and_never_applied(caplog):
    """With the inputs fetched by librdkafka, Faust's agent of a stateful input only subscribes: a
    record that reached it anyway (it never should: the partitions stay paused) is not applied,
    not counted towards a commit, and said once per interval, not per record."""
    import asyncio
    import logging

    rt = Runtime(Settings(registry_url="", partitions=4))
    register_all(rt)
    agent = rt.app.agents["graph-state-agent"]

    async def scenario() -> list:
        async with agent.test_context() as ctx:
            events = []
            for _ in range(3):
                event = await ctx.put(key=b"g", value=b"not applied", partition=0)
                events.append(event)
            return events

    with caplog.at_level(logging.DEBUG, logger="memstream"):
        events = asyncio.run(scenario())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "reached Faust's stream" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    assert "not applied, not committed" in errors[0].getMessage()
    assert len(events) == 3 and not rt._applied  # none applied
    assert all(e.message.acked for e in events)  # and acknowledged without telling the consumer


def test_two_fetched_agents_never_read_the_same_topic():
    """Each input record is fetched, applied and committed by one agent: a second stateful agent
    declaring a topic another already reads is refused when it is declared, naming both."""
    rt = Runtime(Settings(registry_url="", partitions=4))
    register_all(rt)
    sessions = rt.inputs[catalog.SESSION_EVENTS]

    async def handler(cp, event, key, record) -> None:
        return None

    with pytest.raises(ValueError, match="'session-ledger-agent' and 'another-agent' both read session"):
        rt.stateful_agent(sessions, "another-agent", handler)
    assert "another-agent" not in rt.input_fetches
