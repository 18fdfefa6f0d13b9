"""The bench's parts of a profile (bench/profile_parts.py): which part a sample is, the main
thread only, and µs per record that add up to the process's CPU per record."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import profile_parts as pp
from bench.core_step import thread_cpu, thread_kinds

ROOT = "_run_module_as_main (<frozen runpy>);<module> (streams/__main__.py)"
CORE = "the core (checks, consolidation, promotion, audit)"
ENCODE = "encode the outputs"
STATE = "state: rows encoded, staged, read and written"


def frames(*names: str) -> list[str]:
    return [*ROOT.split(";"), *names]


@pytest.mark.parametrize("stack, part", [
    # the innermost named frame wins: fastavro under the codec under the batch is encoding
    (["run_batch (streams/runtime/checkpoint.py)", "ValueCodec.encode (streams/contracts/wire.py)",
      "schemaless_writer (fastavro/_write_py.py)"], ENCODE),
    # a plain leaf under the core is the core's
    (["process (streams/agents/memory_step.py)", "process_candidate (streams/core/process.py)", "dict.get (x)"], CORE),
    # a RocksDB read the core makes is the state's
    (["process_candidate (streams/core/process.py)", "StoredHistory.get (streams/agents/memory_store.py)"], STATE),
    # Quix's state and the peer's row writing; memstream's rows as JSON
    (["MemoryJob.emit (quix_samejob.py)", "State.set (quixstreams/state/base/state.py)"], STATE),
    (["Checkpoint._write_state (streams/runtime/checkpoint.py)", "encoded_row (streams/runtime/faust_internals.py)",
      "dumps (orjson)"], STATE),
    (["Runtime._decode (streams/runtime/app.py)", "ValueCodec._read_body (streams/contracts/wire.py)"],
     "decode the inputs"),
    (["Runtime._produce (streams/runtime/app.py)", "OutputProducer.produce (streams/runtime/outputs.py)"],
     "produce (hand the outputs to librdkafka)"),
    (["register.<locals>._adder.<locals>.add_to (streams/agents/analytics.py)"], "analytics (memstream only)"),
    # nothing named: the framework's
    (["Consumer._drain_messages (faust/transport/consumer.py)", "on_message (faust/transport/conductor.py)"],
     pp.FRAMEWORK),
])
def test_a_sample_is_the_part_of_its_innermost_named_frame(stack, part):
    assert pp.part_of(frames(*stack)) == part


def test_only_the_main_thread_counts(tmp_path):
    profile = tmp_path / "p.txt"
    profile.write_text("\n".join([
        f"{ROOT};process_candidate (streams/core/process.py) 7",
        f"{ROOT};Consumer._drain_messages (faust/transport/consumer.py) 3",
        "Thread._bootstrap (threading.py);Thread.run (threading.py);OutputProducer._poll (streams/runtime/outputs.py) 50",
    ]) + "\n")
    assert pp.main_thread_parts(profile) == Counter({CORE: 7, pp.FRAMEWORK: 3})


@given(st.dictionaries(st.sampled_from([p for p, _ in pp.PARTS] + [pp.FRAMEWORK]), st.integers(1, 10_000), min_size=1),
       st.floats(0.01, 5.0), st.dictionaries(st.sampled_from(sorted(pp.THREADS)), st.floats(0.0, 5.0)))
def test_the_parts_add_up_to_the_process_cpu_per_record(samples, main_ms, others_ms):
    us = pp.us_per_record(Counter(samples), {"main": main_ms, **others_ms})
    assert sum(us.values()) == pytest.approx(1000 * (main_ms + sum(others_ms.values())))
    for kind, ms in others_ms.items():
        assert us[pp.THREADS[kind]] == pytest.approx(1000 * ms)
    biggest = max(samples, key=samples.__getitem__)
    assert us[biggest] == max(v for k, v in us.items() if k not in pp.THREADS.values())


def test_side_by_side_names_every_part_and_the_difference():
    lines = pp.side_by_side({CORE: 180.0, pp.FRAMEWORK: 90.0}, {CORE: 170.0, pp.FRAMEWORK: 40.0})
    assert lines[0].startswith("| part") and len(lines) == 2 + len(pp.PARTS) + 1 + len(pp.THREADS) + 1
    assert f"| {CORE} | 180 | 170 | +10 |" in lines
    assert f"| {pp.FRAMEWORK} | 90 | 40 | +50 |" in lines
    assert lines[-1] == "| **all** | **270** | **210** | **+60** |"


def test_threads_are_counted_by_kind_and_the_ended_ones_by_difference():
    before = {1: ("python", 1.0), 2: ("rdk:broker1", 0.5), 3: ("python", 0.0), 9: ("rocksdb:low", 0.1),
              5: ("ms-outputs", 0.5)}
    after = {1: ("python", 3.0), 2: ("rdk:broker1", 1.5), 3: ("python", 0.25), 4: ("rdk:main", 0.25),
             9: ("rocksdb:low", 0.2), 5: ("ms-outputs", 0.75), 6: ("ms-consumer", 0.5)}
    kinds = thread_kinds(before, after, main=1, process_cpu_s=5.0)
    assert kinds == pytest.approx({"main": 2.0, "librdkafka": 1.25, "python": 0.25, "rocksdb": 0.1, "ms-outputs": 0.25,
                                   "ms-consumer": 0.5, "ended": 0.65})
    assert set(kinds) <= {"main", *pp.THREADS}  # every kind has its row


def test_thread_cpu_reads_this_process_threads():
    threads = thread_cpu()
    assert threading_ids() <= set(threads) and all(cpu >= 0 for _, cpu in threads.values())


def threading_ids() -> set[int]:
    import threading
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}
