"""Issue 17 through the broker: one worker on RocksDB with a 1 s publish tick, the generator's
memory + negotiator + garbage mix produced in small chunks (so ticks interleave with batches),
and every counter of every subject on memory.analytics.v1 equal to what the ledger, relay,
quarantine and DLQ say happened (tests/system/analytics_audit.py). scripts/analytics_audit.py runs
the bigger version (and the SIGKILL run) for the issue's table."""

from __future__ import annotations

import pytest

from tests.system import analytics_audit

pytestmark = pytest.mark.kafka


def test_published_windows_count_every_increment_per_counter_and_subject(stack, unique):
    audit = analytics_audit.run(stack, unique, users=6, chunk=25, pause_s=0.15)
    expected = audit.totals("expected")
    assert expected["formed"] > 0 and expected["merged"] > 0 and expected["dead_lettered"] > 0, expected
    assert audit.mismatches() == [], audit.mismatches()[:10]
    assert audit.lost() == 0 and audit.over() == 0
    assert audit.refused == {"too_late": {"minute": 0, "hour": 0}, "too_early": 0, "duplicates": 0}
