"""Schema ids kept honest, without Kafka (issue 18): the known-ids rules (streams/contracts/schemaids.py),
the probe's comparison against an in-process mock registry that is "reset" (another registry
handing the same ids out in another order), dead letters read with the shipped schemas, /health's
judgement of problems, and the full-disk stop of a real process."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from hypothesis import given
from hypothesis import strategies as st

from streams.api.health import judge, problem
from streams.contracts import catalog, deadletter
from streams.contracts.schemaids import IdMismatch, KnownIds, KnownSchema, mismatches
from streams.contracts.wire import (
    CodecFactory,
    RegistryError,
    UnknownSchemaIdError,
    decode_with_shipped_schemas,
)
from streams.runtime.probe import EXIT_DISK_FULL, WorkerProbe
from streams.settings import Settings
from streams.tools.dlq import _DeadLetterDecoder
from tests.conftest import ROOT

A = KnownSchema("memstream.memory.MemoryEvent", "193a7cc9910b1858")
B = KnownSchema("memstream.memory.CandidateMemory", "9df686d5e65bb7c7")
TOPICS = [t.name for t in catalog.topics()]


def registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})


# ------------------------------------------------------------------ the pure rules
def test_mismatches_name_an_id_that_now_names_another_schema_or_nothing():
    found = mismatches({1: A, 2: B, 3: A}, {1: B, 2: None, 3: A})
    assert found == [IdMismatch(1, A, B), IdMismatch(2, B, None)]
    assert "schema id 1 named memstream.memory.MemoryEvent" in str(found[0]) and "now names" in str(found[0])
    assert "is not in the registry any more" in str(found[1])
    assert mismatches({1: A}, {}) == []  # not asked: no verdict


def test_known_ids_never_change_meaning_and_are_bounded():
    known = KnownIds("c1", {1: A}).learn({1: B, 2: B}, limit=10)
    assert known.ids == {1: A, 2: B}  # id 1 keeps what it meant first
    assert list(KnownIds("c1", {}).learn({i: A for i in range(20)}, limit=5).ids) == [15, 16, 17, 18, 19]
    assert known.for_cluster("c1") is known and known.for_cluster("c2").ids == {}


@given(st.dictionaries(st.integers(1, 2**31 - 1), st.sampled_from([A, B]), max_size=30), st.text(max_size=20))
def test_known_ids_round_trip_through_json(ids, cluster):
    known = KnownIds(cluster, ids)
    assert KnownIds.from_json(known.to_json(), limit=100) == known


@pytest.mark.parametrize("text", ["", "[]", '{"ids": {}}', '{"cluster_id": "c", "ids": {"x": {}}}'])
def test_known_ids_refuse_anything_else(text):
    with pytest.raises(ValueError):
        KnownIds.from_json(text, limit=10)


# ------------------------------------------------------------------ the probe against a "reset" registry
def test_probe_finds_a_registry_that_hands_ids_out_again_and_accepts_the_same_one(tmp_path):
    settings = Settings(data_dir=str(tmp_path), registry_url="mock://x")
    factory = CodecFactory(registry())
    factory.register(TOPICS)
    probe = WorkerProbe(settings, factory)
    probe.load("cluster-1")
    assert probe.verify_ids() == [] and (tmp_path / "schema-ids.json").exists()

    again = WorkerProbe(settings, factory)  # a restarted worker, same registry: same ids
    again.load("cluster-1")
    assert again.known.ids and again.verify_ids() == []

    reset = registry()  # emptied, then ids handed out in another order
    CodecFactory(reset).register(list(reversed(TOPICS)))
    fresh = CodecFactory(reset)
    fresh.register(TOPICS)  # what a restarted worker registers: consistent with the new registry...
    restarted = WorkerProbe(settings, fresh)
    restarted.load("cluster-1")
    found = restarted.verify_ids()  # ...but not with the ids its records were framed with
    assert found and restarted.mismatched == found and restarted.explains(1)
    other_cluster = WorkerProbe(settings, fresh)
    other_cluster.load("cluster-2")  # a wiped stack: a new cluster, a new registry, nothing to compare
    assert other_cluster.verify_ids() == []


def test_registry_now_parses_a_schema_text_once_sees_a_remapped_id_and_keeps_a_bounded_memo(monkeypatch):
    from streams.contracts import wire

    parsed = []
    real = wire.SchemaVersion.from_source
    monkeypatch.setattr(wire.SchemaVersion, "from_source",
                        classmethod(lambda cls, *a: parsed.append(a[2]) or real(*a)))
    factory = CodecFactory(registry())
    factory.register(TOPICS)
    ids = sorted(factory.known_ids())
    first = factory.registry_now(ids)
    assert len(parsed) == len(ids)  # each (id, text) parsed once...
    assert factory.registry_now(ids) == first and len(parsed) == len(ids)  # ...and not again next round

    reset = registry()  # the same ids handed out in another order: every id names another text now
    CodecFactory(reset).register(list(reversed(TOPICS)))
    factory.registry = reset
    now = factory.registry_now(ids)
    assert any(now[i] is not None and first[i].fingerprint != now[i].fingerprint for i in ids)

    monkeypatch.setattr(wire, "PARSED_TEXTS_MAX", 3)
    factory._parsed_by_text.clear()
    factory.registry_now(ids)
    assert 0 < len(factory._parsed_by_text) <= 3


def test_probe_reports_an_unreachable_registry():
    class Down:
        def clear_caches(self):
            pass

        def get_schema(self, *a, **k):
            raise ConnectionError("refused")

    factory = CodecFactory(registry())
    factory.register(TOPICS[:1])
    probe = WorkerProbe(Settings(data_dir="/nonexistent", registry_url="mock://x"), factory)
    factory.registry = Down()
    with pytest.raises(RegistryError):
        probe.verify_ids()
    assert "refused" in probe.registry_error and not probe.explains(1)


@pytest.mark.parametrize("timeout_s, interval_s, hang_after_s", [(5.0, 10.0, 5.0), (30.0, 10.0, 5.0), (1.0, 10.0, 1.0)])
def test_a_registry_that_hangs_is_named_once_a_check_has_waited_too_long(timeout_s, interval_s, hang_after_s):
    """A registry whose port accepts but never answers: the probe's check blocks in the client
    (up to MEMSTREAM_REGISTRY_TIMEOUT_S per request). /health names `registry_unreachable` once
    the check has waited `hang_after_s` (the timeout, or half the interval if that is shorter),
    without waiting for the request to give up."""
    import threading
    import time

    answer = threading.Event()

    class Hung:
        def clear_caches(self):
            pass

        def get_schema(self, *a, **k):
            answer.wait(10)
            raise ConnectionError("timed out")

    factory = CodecFactory(registry())
    factory.register(TOPICS[:1])
    probe = WorkerProbe(Settings(data_dir="/nonexistent", registry_url="mock://x", registry_timeout_s=timeout_s,
                                 health_check_interval_s=interval_s), factory)
    assert probe.hang_after_s == hang_after_s and probe.registry_problem() is None
    factory.registry = Hung()
    check = threading.Thread(target=lambda: pytest.raises(RegistryError, probe.verify_ids), daemon=True)
    check.start()
    deadline = time.monotonic() + 5
    while probe.checking_since is None:
        assert time.monotonic() < deadline, "the check never started"
        time.sleep(0.01)
    started = probe.checking_since
    assert probe.registry_problem(now=started + hang_after_s - 0.1) is None  # not yet
    named = probe.registry_problem(now=started + hang_after_s + 0.1)
    assert named is not None and "has not answered for" in named and "mock://x" in named
    if hang_after_s <= 1.0:  # /health itself, on the clock
        time.sleep(max(0.0, started + hang_after_s + 0.1 - time.monotonic()))
        status, reason = judge("ready", "ok", probe_problems(probe))
        assert status == "ready" and reason.startswith("registry_unreachable: schema registry at mock://x has not")
    answer.set()  # the request gives up: its error is the reason from now on
    check.join(5)
    assert "timed out" in probe.registry_problem() and probe.checking_since is None


def test_a_check_that_ends_does_not_hide_another_still_waiting():
    """The probe's round and a decode's `explains` may check the registry at once (two threads):
    the one that ends must not clear the other's start, or a hung registry would go unnamed."""
    import threading
    import time

    release = {name: threading.Event() for name in ("slow", "quick")}

    class PerThread:
        def clear_caches(self):
            pass

        def get_schema(self, *a, **k):
            release[threading.current_thread().name].wait(10)
            raise ConnectionError("timed out")

    factory = CodecFactory(registry())
    factory.register(TOPICS[:1])
    probe = WorkerProbe(Settings(data_dir="/nonexistent", registry_url="mock://x", registry_timeout_s=1.0), factory)
    factory.registry = PerThread()
    checks = {name: threading.Thread(target=lambda: pytest.raises(RegistryError, probe.verify_ids), name=name,
                                     daemon=True) for name in ("slow", "quick")}
    checks["slow"].start()
    deadline = time.monotonic() + 5
    while probe.checking_since is None:
        assert time.monotonic() < deadline, "the slow check never started"
        time.sleep(0.01)
    slow_started = probe.checking_since
    checks["quick"].start()
    release["quick"].set()
    checks["quick"].join(5)
    with probe._lock:
        probe.registry_error = None  # as if the quick check had succeeded: only the waiting one is left
    assert probe.checking_since == slow_started  # the slow check still counts from its own start
    assert "has not answered for" in probe.registry_problem(now=slow_started + 1.1)
    release["slow"].set()
    checks["slow"].join(5)
    assert probe.checking_since is None


def probe_problems(probe: WorkerProbe) -> list[dict]:
    """What streams/api/health.py reports for this probe alone."""
    from types import SimpleNamespace

    from streams.api.health import _problems

    return _problems(SimpleNamespace(probe=probe, stalls={}, settings=probe.settings), False, 0)


def test_the_registry_timeout_must_be_positive():
    from streams.settings import SettingsError

    with pytest.raises(SettingsError, match="MEMSTREAM_REGISTRY_TIMEOUT_S=0"):
        Settings(registry_timeout_s=0)


# ------------------------------------------------------------------ dead letters without the registry
def _dead_letter_bytes(factory: CodecFactory) -> bytes:
    record = deadletter.dead_letter(deadletter.Origin("memory.events.v1", 0, 7, b"k", b"\x00bad"),
                                    stage="decode", reason="r", error_class="E", failed_at=1)
    return factory.codec("dead_letter").encode(record)


def test_dead_letters_read_with_the_shipped_schemas_when_the_registry_lost_their_id():
    writer = CodecFactory(registry())
    writer.register([catalog.DLQ])
    data = _dead_letter_bytes(writer)
    empty = CodecFactory(registry()).codec("dead_letter")  # a registry that never had the id
    with pytest.raises(UnknownSchemaIdError):
        empty.decode(data)
    record, version = decode_with_shipped_schemas(empty, data)
    assert record["original_offset"] == 7 and version.stem == "dead_letter"
    assert _DeadLetterDecoder(empty)(data)["original_topic"] == "memory.events.v1"


def test_dead_letters_read_with_the_shipped_schemas_when_the_registry_is_down():
    writer = CodecFactory(registry())
    writer.register([catalog.DLQ])
    data = _dead_letter_bytes(writer)
    factory = CodecFactory.from_url("http://127.0.0.1:9/apis/ccompat/v7")  # nothing listens on port 9
    decode = _DeadLetterDecoder(factory.codec("dead_letter"))
    assert decode(data)["original_offset"] == 7 and decode.registry_down
    assert decode(data)["original_offset"] == 7  # not asked again


def test_a_dead_letter_that_fits_no_shipped_schema_keeps_the_first_error():
    decode = _DeadLetterDecoder(CodecFactory(registry()).codec("dead_letter"))
    with pytest.raises(UnknownSchemaIdError):
        decode(b"\x00\x00\x00\x00\x09\xff\xff")


# ------------------------------------------------------------------ /health's judgement
@pytest.mark.parametrize("problems, status, in_reason", [
    ([], "ready", "base"),
    ([problem("registry_unreachable", "down")], "ready", "registry_unreachable: down (base)"),
    ([problem("registry_mismatch", "id 1")], "blocked", "registry_mismatch: id 1"),
    ([problem("agent_stalled", "waiting"), problem("registry_unreachable", "down")], "blocked", "agent_stalled: waiting"),
    ([problem("broker_unreachable", "no")], "blocked", "broker_unreachable: no"),
    ([problem("recovery_stuck", "120 s")], "blocked", "recovery_stuck"),
])
def test_health_names_the_reason_and_blocks_only_for_blocking_problems(problems, status, in_reason):
    got_status, reason = judge("ready", "base", problems)
    assert got_status == status and in_reason in reason


def test_health_keeps_the_lifecycle_status_and_adds_the_reason():
    status, reason = judge("recovering", "recovering: 5 offsets left", [problem("recovery_stuck", "no progress")])
    assert status == "recovering" and reason.startswith("recovery_stuck: no progress")


# ------------------------------------------------------------------ a full disk stops the process
def test_no_space_left_on_device_in_any_log_line_stops_the_process_naming_the_directory(tmp_path):
    code = ("import logging; from streams.runtime.probe import _DiskFullLogHook; logging.basicConfig(); "
            f"logging.getLogger().addHandler(_DiskFullLogHook({str(tmp_path)!r})); "
            "logging.getLogger('faust.tables').error('RocksIOError: IO error: No space left on device: While appending'); "
            "print('still running')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_DISK_FULL and "still running" not in proc.stdout
    assert f"data disk full: {tmp_path}" in proc.stderr


def test_free_space_below_the_threshold_stops_the_process(tmp_path):
    code = ("import logging; logging.basicConfig(); from streams.runtime.probe import WorkerProbe; from streams.settings import Settings; "
            f"WorkerProbe(Settings(data_dir={str(tmp_path)!r}, min_free_disk_bytes=2**62), None).check_disk(); "
            "print('still running')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_DISK_FULL and "below MEMSTREAM_MIN_FREE_DISK_BYTES" in proc.stderr


def test_the_probe_silences_the_registry_clients_request_lines():
    """Every probe round GETs each schema id the worker used; the HTTP library logs each request at
    INFO. The logger the installed registry client really uses is among those silenced."""
    import logging

    from confluent_kafka.schema_registry._sync import schema_registry_client

    from streams.runtime.probe import HTTP_CLIENT_LOGGERS, quiet_http_clients

    http = next(name for name in ("httpx2", "httpx") if name in vars(schema_registry_client))
    used = vars(schema_registry_client)[http]._client.logger.name
    assert used in HTTP_CLIENT_LOGGERS
    quiet_http_clients()
    assert not logging.getLogger(used).isEnabledFor(logging.INFO)
