"""Two workers in one consumer group share the partitions; an HTTP query sent to either worker
is answered by the owner of the user's partition (forwarded when it is the other worker)."""

from __future__ import annotations

import time

import pytest

from streams import catalog

from .kafka_util import candidate, consume, free_port, http_get, produce, worker

pytestmark = pytest.mark.kafka


FACTS = ["The user likes hiking in the Alps every summer.", "Her favourite colour is teal."]


def _aux_owners(port: int) -> set[str]:
    """Faust's own router view ({worker url: {changelog topic: [partitions]}}): the workers
    that own partitions of the memory-state table (the table HTTP routing goes by)."""
    status, body = http_get(port, "/router/")
    assert status == 200
    return {url for url, tables in body.items()
            if any(topic.endswith("-memory-state-changelog") and parts for topic, parts in tables.items())}


def test_queries_are_answered_by_the_partition_owner_from_any_worker(stack, unique):
    users = [f"mb-route-{unique}-{i}" for i in range(12)]
    now = int(time.time() * 1000)
    app = {"MEMSTREAM_APP_ID": f"it-route-{unique}", "MEMSTREAM_API_TOKENS": "t:secret",
           "MEMSTREAM_STANDBY_REPLICAS": "0"}
    port_a, port_b = free_port(), free_port()
    with worker(stack, f"route-a-{unique}", env={**app, "MEMSTREAM_WEB_PORT": str(port_a)}), \
            worker(stack, f"route-b-{unique}", env={**app, "MEMSTREAM_WEB_PORT": str(port_b)}):
        # wait until the group has rebalanced onto both workers
        deadline = time.monotonic() + 90
        while True:
            hosts = _aux_owners(port_a)
            if len(hosts) == 2:
                break
            assert time.monotonic() < deadline, f"partitions never spread over both workers: {hosts}"
            time.sleep(1)
        produce(stack, catalog.MEMORY_CANDIDATES,
                [(u, candidate(u, f"{u}-c{j}", now + j, fact)) for u in users for j, fact in enumerate(FACTS)])
        consume(stack, catalog.MEMORY_LEDGER, lambda out: {m["key"] for m in out if m["key"] in users} == set(users)
                and sum(1 for m in out if m["key"] in users and m["value"]["event_type"] == "memory_formed") == 24)
        time.sleep(1)
        answers_a = {u: http_get(port_a, f"/v1/memory/{u}/nodes", "t") for u in users}
        answers_b = {u: http_get(port_b, f"/v1/memory/{u}/nodes", "t") for u in users}
        owners = _aux_owners(port_b)
    for u in users:
        assert answers_a[u][0] == 200 and answers_b[u][0] == 200
        assert len(answers_a[u][1]["nodes"]) == 2, u  # the owner's state, whichever worker was asked
        assert answers_a[u] == answers_b[u]
    assert owners == {f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"}, owners
    # both workers own partitions: half the answers above were forwarded to the other worker
