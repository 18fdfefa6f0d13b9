"""The suite's own scheduling rule (tests/conftest.py `_long_tests_first`): under pytest-xdist
the long tests head the processes' first shares, so none of them starts last."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import LONG_TESTS, _long_tests_first


def shares(order: list, workers: int) -> list[list[str]]:
    """What worksteal hands each process first: `pending // (workers - i)` items in turn."""
    out, pending, pos = [], len(order), 0
    for i in range(workers):
        n = pending // (workers - i)
        out.append([x.nodeid for x in order[pos:pos + n]])
        pos, pending = pos + n, pending - n
    return out


def test_long_tests_head_the_shares_and_nothing_is_lost_or_repeated():
    items = [SimpleNamespace(nodeid=f"tests/x/test_{i}.py::t") for i in range(60)]
    long = [SimpleNamespace(nodeid=k if "::" in k else f"{k}::t{j}") for k in LONG_TESTS for j in range(2 if "::" not in k else 1)]
    items[20:20] = long
    order = _long_tests_first(items, 4)
    assert sorted(x.nodeid for x in order) == sorted(x.nodeid for x in items)
    heads = shares(order, 4)
    for share in heads:  # each share starts with its long tests, then the rest
        flags = [any(n == k or n.startswith(k + "::") for k in LONG_TESTS) for n in share]
        assert flags == sorted(flags, reverse=True), share[:5]
    module_tests = [n for share in heads for n in share if n.startswith("tests/tools/test_repartition_kafka.py")]
    assert any(set(module_tests) <= set(share) for share in heads)  # a module with its own stack stays in one share
    assert _long_tests_first(items[:5], 4) == items[:5]  # no long test: the collection order
