"""The same-job Quix Streams peer of the bench (bench/quix_samejob.py) cannot drift from the
worker: on a small input of the bench's stream, a real `memstream worker` and the peer write the
same records, topic by topic, as multisets of (key, decoded value) (bench/samejob_compare.py) —
the comparison the e2e bench prints before it prints a ratio to that peer (issue 33).

The peer runs in the bench's own virtualenv (`bench_e2e.QUIX_VENV`, under MEMSTREAM_CACHE_DIR:
Quix Streams pins confluent-kafka below memstream's lock, so it cannot join the project's
extras), made with pip on first use as the bench makes it; later runs, and later clones, reuse it.
"""

from __future__ import annotations

import uuid

import pytest

from bench import bench_e2e, samejob_compare
from streams.contracts import catalog
from tests.conftest import TEST_ENV

pytestmark = [pytest.mark.kafka]


def test_the_same_job_peer_writes_what_the_worker_writes(stack, settings, tmp_path, monkeypatch):
    for name, value in TEST_ENV.items():  # the worker and the peer read the suite's stack and settings
        monkeypatch.setenv(name, value)
    run = tmp_path / f"test-samejob-{uuid.uuid4().hex[:10]}"
    run.mkdir()
    load = bench_e2e.build_load(settings, users=3)
    try:
        result = bench_e2e.samejob_run(settings, load, run)
    finally:
        bench_e2e.delete_run_topics(settings, run.name)
    lines = "\n".join(result.comparison.lines())
    assert result.comparison.equal, f"the same-job peer wrote other records than the worker:\n{lines}"
    written = {t.topic: t.memstream for t in result.comparison.topics}
    # the input reaches every path the comparison covers: derived and relayed events, node rows
    # and tombstones (a negotiator forget), quarantine, negotiator replies, dead letters
    assert all(written[t] for t in samejob_compare.COMPARED), lines
    assert result.ratio is not None and result.peer.records == sum(len(p) for p in bench_e2e.samejob_phases(load))
    assert written[catalog.DLQ] and result.peer.records > 100, lines
    # the VM's speed probed around each system's phase, and the ratio calibrated by it
    assert result.probes is not None and all(p > 0 for p in result.probes)
    ours, theirs = (result.probes[0] + result.probes[1]) / 2, (result.probes[2] + result.probes[3]) / 2
    assert result.calibrated_ratio == pytest.approx(result.ratio * theirs / ours)
