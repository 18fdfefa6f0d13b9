"""The Faust app's wiring (no broker needed: the app is built, not started)."""

from __future__ import annotations

import pytest

from streams import catalog
from streams.app import Runtime
from streams.agents import consumed_topics, register_all
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
