"""Two workers in one consumer group share the partitions; an HTTP query sent to either worker
is answered by the owner of the user's partition (forwarded when it is the other worker). On a
fresh stack every route answers from the first second: 2xx/4xx, or 503 + Retry-After, never 500."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from streams.contracts import catalog
from tests.kafka_util import candidate, consume, free_port, http_call, http_get, produce, worker

pytestmark = pytest.mark.kafka


FACTS = ["The user likes hiking in the Alps every summer.", "Her favourite colour is teal."]


def _aux_owners(port: int) -> set[str]:
    """The documented assignment view ({worker url: {changelog topic: [partitions]}}, scope
    `ops`): the workers that own partitions of the memory-state table (the table HTTP routing
    goes by)."""
    status, body = http_get(port, "/v1/cluster/assignment", "t")
    assert status == 200
    return {url for url, tables in body.items()
            if any(topic.endswith("-memory-state-changelog") and parts for topic, parts in tables.items())}


def test_queries_are_answered_by_the_partition_owner_from_any_worker(stack, unique):
    users = [f"mb-route-{unique}-{i}" for i in range(12)]
    now = int(time.time() * 1000)
    app = {"MEMSTREAM_APP_ID": f"it-route-{unique}", "MEMSTREAM_API_TOKENS": "t:secret:admin+negotiator+ops",
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


def call(port: int, method: str, path: str, token: str | None = "t", body: dict | None = None,
         timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """Any request with the suite's token; (status, headers, raw body)."""
    return http_call(port, method, path, token, body, timeout)


def documented_routes(users: list[str], unique: str) -> list[tuple[str, str, dict | None]]:
    """Every route of the route table of docs/http-api.md (and the operations routes), for `users`."""
    routes: list[tuple[str, str, dict | None]] = [
        ("GET", "/v1/analytics/summary?window=1h", None),
        ("GET", "/v1/analytics/summary?window=1m&scope=fleet", None),
        ("GET", "/v1/dashboard/data", None),
        ("GET", f"/v1/dashboard/data?scope=fleet&user={users[0]}", None),
        ("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/dashboard", None),
        ("GET", "/v1/cluster/assignment", None),
    ]
    for u in users:
        routes += [
            ("GET", f"/v1/memory/{u}/nodes", None),
            ("GET", f"/v1/memory/{u}/nodes?as_of={int(time.time() * 1000)}", None),
            ("GET", f"/v1/memory/{u}/nodes?include=superseded", None),
            ("GET", f"/v1/memory/{u}/nodes/n-1", None),
            ("PUT", f"/v1/relay/{u}/threshold", {"threshold": "personal"}),
            ("GET", f"/v1/relay/{u}/threshold", None),
            ("POST", f"/v1/negotiator/{u}/remember", {"kind": "playbook", "content": f"{u} likes tea", "requestId": f"r-{u}"}),
            ("POST", f"/v1/negotiator/{u}/forget", {"description": "coffee", "requestId": f"f-{u}"}),
            ("GET", f"/v1/sessions/s-{u}/compactions", None),
            ("GET", f"/v1/graphs/g-{u}", None),
            ("GET", f"/v1/analytics/{u}?window=1m", None),
        ]
    return routes


def test_a_fresh_stack_answers_every_route_from_the_first_second(stack, unique):
    """A new app id (its changelog topics brand new, nothing written to them yet): within 10 s of
    both workers' /health being ready, every documented route on both answers 2xx/4xx or 503 with
    Retry-After, never 500; and each 503 turns into a 2xx/4xx within a bounded retry."""
    app = {"MEMSTREAM_APP_ID": f"it-fresh-{unique}", "MEMSTREAM_API_TOKENS": "t:secret:admin+negotiator+ops",
           "MEMSTREAM_STANDBY_REPLICAS": "0"}
    users = [f"mb-fresh-{unique}-{i}" for i in range(6)]
    routes = documented_routes(users, unique)
    port_a, port_b = free_port(), free_port()
    with worker(stack, f"fresh-a-{unique}", env={**app, "MEMSTREAM_WEB_PORT": str(port_a)}), \
            worker(stack, f"fresh-b-{unique}", env={**app, "MEMSTREAM_WEB_PORT": str(port_b)}):
        deadline = time.monotonic() + 120
        while not all(call(p, "GET", "/health", None)[0] == 200 for p in (port_a, port_b)):
            assert time.monotonic() < deadline, "workers never ready"
            time.sleep(0.2)
        ready = time.monotonic()
        jobs = [(p, m, path, body) for p in (port_a, port_b) for m, path, body in routes]
        with ThreadPoolExecutor(16) as pool:
            first = list(pool.map(lambda j: (time.monotonic(), call(j[0], j[1], j[2], body=j[3])), jobs))
        started = [t for t, _ in first]
        assert max(started) - ready < 10, f"the first calls took {max(started) - ready:.1f}s to send"
        answers = {(j[0], j[1], j[2]): a for j, (_t, a) in zip(jobs, first, strict=True)}
        for (port, method, path), (status, headers, body) in answers.items():
            assert status != 500 and (200 <= status < 500 or status == 503), (port, method, path, status, body[:300])
            if status == 503:
                assert int(headers.get("Retry-After", "0")) >= 1, (port, method, path, headers)
        # not 503 forever: every route that was 503 answers 2xx/4xx within a bounded retry
        retried = [(p, m, path, body) for p, m, path, body in jobs if answers[(p, m, path)][0] == 503]
        final = {}
        deadline = time.monotonic() + 120
        for port, method, path, body in retried:
            while True:
                status, headers, raw = call(port, method, path, body=body)
                assert status != 500, (port, method, path, raw[:300])
                if status != 503:
                    final[(port, method, path)] = status
                    break
                assert time.monotonic() < deadline, f"{method} {path} on {port} still 503: {raw[:300]}"
                time.sleep(float(headers.get("Retry-After", "1")))
        owners = _aux_owners(port_a)
    statuses = {k: a[0] for k, a in answers.items()} | final
    assert all(200 <= s < 500 for s in statuses.values())
    for port in (port_a, port_b):  # what a fresh stack answers once settled
        for u in users:
            assert statuses[(port, "GET", f"/v1/memory/{u}/nodes")] == 200
            assert statuses[(port, "GET", f"/v1/sessions/s-{u}/compactions")] == 404
            assert statuses[(port, "GET", f"/v1/graphs/g-{u}")] == 404
            assert statuses[(port, "POST", f"/v1/negotiator/{u}/remember")] == 200
    assert len(owners) == 2, owners  # both workers owned partitions: some answers were forwarded
    print(f"\n[fresh] {len(jobs)} calls within {max(started) - ready:.1f}s of ready: "
          f"{sum(1 for a in answers.values() if a[0] == 503)} were 503 (all settled), none 500")
