"""Users evicted from the bounded LRU and read again from RocksDB decide exactly as users kept
loaded: two real workers (rocksdb://) on the same candidates, one with MEMSTREAM_LOADED_NODES_MAX=1
(every user is dropped after each batch and read again from its rows by the next), one with the
default bound (nothing is evicted)."""

from __future__ import annotations

import re
import time

import pytest

from streams.contracts import catalog
from tests.kafka_util import candidate, free_port, http_call, http_get, log_of, produce, wait_caught_up, worker

pytestmark = pytest.mark.kafka

T0 = (int(time.time() * 1000) // 60_000 - 120) * 60_000  # recent: housekeeping must not decay the nodes
MIN = 60_000
FACTS = ["The user prefers oat milk in their coffee.", "The user prefers oat milk in coffee.",
         "The user lives in Berlin.", "The user moved to Munich.", "The user's bike is green.",
         "The user's bike is red now."]


def counter(port: int, event: str) -> int:
    text = http_call(port, "GET", "/metrics", timeout=15)[2].decode()
    found = re.search(rf'^memstream_memory_users_total{{event="{event}"}} (\d+)', text, re.M)
    return int(found.group(1)) if found else 0


def test_users_evicted_and_read_again_decide_as_users_kept_loaded(stack, unique):
    users = [f"mb-lru-{unique}-{i}" for i in range(5)]
    ports = {"small": free_port(), "default": free_port()}
    env = {name: {"MEMSTREAM_APP_ID": f"it-lru-{name}-{unique}", "MEMSTREAM_WEB_PORT": str(port),
                  "MEMSTREAM_API_TOKENS": "tok:secret"} for name, port in ports.items()}
    env["small"]["MEMSTREAM_LOADED_NODES_MAX"] = "1"
    with worker(stack, f"lru-small-{unique}", env=env["small"]), worker(stack, f"lru-default-{unique}", env=env["default"]):
        for wave in range(4):  # one wave at a time: each is a later batch that finds its users evicted
            produce(stack, catalog.MEMORY_CANDIDATES, [
                (u, candidate(u, f"{u}-{wave}-{j}", T0 + (10 * wave + j) * MIN, FACTS[(i + 2 * wave + j) % len(FACTS)]))
                for i, u in enumerate(users) for j in range(2)])
            for name in ports:
                wait_caught_up(stack, env[name]["MEMSTREAM_APP_ID"], catalog.MEMORY_CANDIDATES)
        answers = {name: {u: http_get(port, f"/v1/memory/{u}/nodes?include=superseded", "tok") for u in users}
                   for name, port in ports.items()}
        evicted = {name: counter(port, "evicted") for name, port in ports.items()}
        loaded = {name: counter(port, "loaded") for name, port in ports.items()}
    assert evicted["default"] == 0 and loaded["default"] >= len(users)  # nothing dropped
    assert evicted["small"] >= len(users) and loaded["small"] > loaded["default"]  # read again after eviction
    for u in users:
        assert answers["small"][u][0] == answers["default"][u][0] == 200
        assert answers["small"][u][1] == answers["default"][u][1], u
    nodes = [n for u in users for n in answers["default"][u][1]["nodes"]]
    assert any(n["reinforcement_count"] > 0 for n in nodes)  # merges across batches happened
    assert any(n["superseded_by"] for n in nodes) or len(nodes) > len(users)  # and more than one node per user


def _nodes(port: int, users: list[str]) -> dict[str, tuple[int, dict]]:
    return {u: http_get(port, f"/v1/memory/{u}/nodes?include=superseded", "tok") for u in users}


def test_a_restarted_worker_prefills_its_users_up_to_the_limit_and_answers_as_before(stack, unique):
    """streams/agents/prefill.py: after the rebalance that gives a worker its partitions, it reads
    their users into the cache with no record or query asking, stops at MEMSTREAM_PREFILL_NODES,
    and the users it read answer exactly as the worker that wrote them did."""
    users = [f"mb-prefill-{unique}-{i}" for i in range(6)]
    name, env = f"prefill-{unique}", {"MEMSTREAM_APP_ID": f"it-prefill-{unique}", "MEMSTREAM_API_TOKENS": "tok:secret"}
    port = free_port()
    with worker(stack, name, env={**env, "MEMSTREAM_WEB_PORT": str(port)}):
        produce(stack, catalog.MEMORY_CANDIDATES, [
            (u, candidate(u, f"{u}-{j}", T0 + j * MIN, FACTS[(i + j) % len(FACTS)]))
            for i, u in enumerate(users) for j in range(3)])
        wait_caught_up(stack, env["MEMSTREAM_APP_ID"], catalog.MEMORY_CANDIDATES)
        written = _nodes(port, users)
    port = free_port()  # the same data dir; a prefill of about one user's nodes (each has 2-4)
    with worker(stack, name, env={**env, "MEMSTREAM_WEB_PORT": str(port), "MEMSTREAM_PREFILL_NODES": "2"}):
        deadline = time.monotonic() + 60
        while "memory cache prefilled" not in (text := log_of(name)):
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.3)
        prefilled, loaded = counter(port, "prefilled"), counter(port, "loaded")
        assert 1 <= prefilled < len(users), (prefilled, text[-2000:])  # read unasked, stopped by the limit
        assert loaded == prefilled  # nothing else read a user
        answered = _nodes(port, users)  # the prefilled users from the cache, the others on first touch
    assert answered == written
    assert all(status == 200 and body["nodes"] for status, body in written.values())
