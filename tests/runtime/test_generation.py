"""A deployment's generation (streams/runtime/generation.py) and what a worker does with it before
it starts (streams/runtime/worker.py). The record on a real broker: tests/tools/test_repartition_kafka.py."""

from __future__ import annotations

import pytest

from streams.contracts.topics import TopicError
from streams.runtime import generation
from streams.runtime.generation import COPYING, DONE, Generation, GenerationError
from streams.runtime.worker import TABLES_OF, keep_tables_of, refuse_partition_drift
from streams.settings import Settings


def gen(**changes) -> Generation:
    base = dict(app_id="ms", generation=1, partitions=12, from_generation=0, from_partitions=6, state=DONE,
                started_at="2026-12-05T08:00:00+00:00", finished_at="2026-12-05T08:01:00+00:00")
    return Generation(**{**base, **changes})


def test_groups_and_changelogs_of_each_generation():
    assert generation.group_of("ms", 0) == "ms" and generation.group_of("ms", 2) == "ms.g2"
    g = gen(generation=2, from_generation=1)
    assert (g.group, g.from_group) == ("ms.g2", "ms.g1")
    assert generation.changelog_topic(g.group, "memory-state") == "ms.g2-memory-state-changelog"


def test_the_changelog_name_is_the_one_faust_gives_the_table():
    from streams.runtime.app import Runtime

    rt = Runtime(Settings(registry_url="", partitions=3, app_id="ms.g1"))
    table = rt.table("memory-state")
    assert table.changelog_topic.get_topic_name() == generation.changelog_topic("ms.g1", "memory-state")


def test_the_record_round_trips_and_a_foreign_one_is_named():
    g = gen(input_offsets={"memory.events.v1": {"0": 5}}, tables={"memory-state": {"rows": 3, "verified": True}})
    assert Generation.from_json(g.to_json()) == g
    with pytest.raises(GenerationError, match="_memstream.generations holds a record"):
        Generation.from_json(b'{"app_id": "ms"}')


def test_a_worker_runs_on_the_recorded_generation(monkeypatch):
    monkeypatch.setattr(generation, "read", lambda settings, topics=None: gen())
    assert generation.resolve(Settings(app_id="ms", partitions=12)).app_id == "ms.g1"


def test_a_worker_refuses_the_wrong_partition_count_or_an_unfinished_copy(monkeypatch):
    monkeypatch.setattr(generation, "read", lambda settings, topics=None: gen())
    with pytest.raises(GenerationError, match="set MEMSTREAM_PARTITIONS=12"):
        generation.resolve(Settings(app_id="ms", partitions=6))
    monkeypatch.setattr(generation, "read", lambda settings, topics=None: gen(state=COPYING, finished_at=None))
    with pytest.raises(GenerationError, match=r"has not finished; run `memstream repartition --to 12` again"):
        generation.resolve(Settings(app_id="ms", partitions=12))


def test_no_record_no_read():
    """A deployment never re-partitioned: the topic is absent and nothing is read (no broker here)."""
    assert generation.read(Settings(broker="127.0.0.1:1"), topics={"memory.events.v1"}) is None
    assert generation.resolve(Settings(broker="127.0.0.1:1"), topics=set()).app_id == "memstream"


def test_a_worker_refuses_topics_whose_count_is_not_its_setting():
    from streams.contracts import catalog

    topics = {t.name: 6 for t in catalog.topics()}
    refuse_partition_drift(Settings(partitions=6), topics)
    topics[catalog.MEMORY_EVENTS] = 12
    with pytest.raises(TopicError, match=r"memory.events.v1 has 12 partitions but MEMSTREAM_PARTITIONS is 6.*repartition"):
        refuse_partition_drift(Settings(partitions=6), topics)


def test_local_tables_of_another_generation_are_discarded(tmp_path):
    tables = tmp_path / "v1" / "tables"
    tables.mkdir(parents=True)
    keep_tables_of("ms", "ms", tmp_path, tables)  # first generation, no file yet: kept
    assert tables.exists() and (tmp_path / TABLES_OF).read_text().strip() == "ms"
    keep_tables_of("ms.g1", "ms", tmp_path, tables)  # the deployment was re-partitioned
    assert not tables.exists() and (tmp_path / TABLES_OF).read_text().strip() == "ms.g1"
    tables.mkdir(parents=True)
    keep_tables_of("ms.g1", "ms", tmp_path, tables)  # same generation again: kept
    assert tables.exists()


def test_a_data_dir_without_the_file_holds_the_first_generation(tmp_path):
    tables = tmp_path / "v1" / "tables"
    tables.mkdir(parents=True)
    keep_tables_of("ms.g1", "ms", tmp_path, tables)
    assert not tables.exists()
