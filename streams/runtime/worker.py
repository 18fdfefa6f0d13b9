"""`memstream worker`: one pipeline worker process (a Faust worker running the memstream app).

Several workers on one host run side by side when each has its own web port and data dir;
they share the work through the Kafka consumer group named by MEMSTREAM_APP_ID.
"""

from __future__ import annotations

import gc
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from streams.contracts.topics import TopicError, missing_topics, topic_partitions
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.worker")


def run(settings: Settings, create_runtime: Callable[[Settings], Runtime]) -> int:
    """Run one worker until it is stopped; `create_runtime` builds its Runtime with every agent
    and view registered (streams/composition.py: the runtime does not know them)."""
    broker_topics = topic_partitions(settings)
    missing = missing_topics(settings, broker_topics)
    if missing:
        raise TopicError(
            f"{len(missing)} catalog topic(s) missing ({', '.join(missing[:3])}…); run `memstream topics apply` first"
        )
    from streams.runtime import generation

    base_app_id = settings.app_id
    settings = generation.resolve(settings, set(broker_topics))  # its generation's group and changelogs
    refuse_partition_drift(settings, broker_topics)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    from streams.contracts.topics import ensure_internal
    from streams.runtime import faust_internals

    rt = create_runtime(settings)
    app = rt.app
    created = ensure_internal(settings, rt.internal_topics)
    if created:
        log.info("created internal topics %s", ", ".join(created))
    keep_tables_of(settings.app_id, base_app_id, Path(settings.data_dir), Path(app.conf.tabledir))
    # The worker keeps a large, long-lived heap (every local user's state and index): collect
    # the young generations less often and never rescan what was there at start-up.
    gc.set_threshold(50_000, 20, 100)
    gc.freeze()
    running = Path(settings.data_dir) / f"{settings.app_id}.running"
    if running.exists():
        discard_local_tables(Path(app.conf.tabledir))
        running.unlink()  # empty tables are consistent: a kill before Faust starts need not discard again
    from streams.runtime.probe import WorkerProbe, arm_shutdown_deadline

    # until Faust sets up its logging: the probe's first checks must be heard (Faust replaces this)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    faust_internals.warn_if_unpinned(log)  # another faust-streaming/aiokafka/mode: one WARNING, not a crash
    rt.probe = WorkerProbe(settings, rt.codecs)
    rt.probe.start(cluster_id(settings))  # disk and registry ids checked before anything is consumed
    from streams.runtime import restore, restoring_http

    # before Faust opens the stores (it then restores only what came after); the probe watches the
    # disk meanwhile, and the web port answers /health/live (an orchestrator must not kill the copy)
    if settings.restore_ahead:
        with restoring_http.serving(settings.web_host, settings.web_port) as status:
            restore.run(settings, rt.tables.values(), progress=status.update)
    # the core's compiled loops now, not in the first batch that needs them (streams/core/warmup.py)
    if settings.warm_up:
        from streams.core.warmup import warm_up

        log.info("consolidation core warmed up in %.1fs", warm_up(settings.index_config()))
    if rt.output_producer is not None:  # connected, with the topics' leaders, before the first batch
        rt.output_producer.connect(timeout=15.0)
    # only now: what the restore ahead wrote is always a correct prefix of the changelogs (a kill
    # during it keeps the copy); from here on Faust writes rows before their changelog does
    running.touch()

    # SIGTERM / SIGINT: bounded, whatever the state
    class _Worker(faust_internals.worker_class(lambda: arm_shutdown_deadline(settings.shutdown_timeout_s))):  # type: ignore[misc]
        def on_setup_root_logger(self, logger, level) -> None:  # Faust replaced the root handlers
            super().on_setup_root_logger(logger, level)
            rt.probe.watch_log(logger)  # type: ignore[union-attr]

    worker = _Worker(app, loglevel=settings.log_level, quiet=True)
    try:
        worker.execute_from_commandline()  # exits the process when the worker stops
    finally:
        running.unlink(missing_ok=True)
    return 0


def cluster_id(settings: Settings) -> str:
    """The Kafka cluster's id (the registry keeps its storage in the same cluster)."""
    from streams.contracts.topics import admin_client

    try:
        return admin_client(settings).list_topics(timeout=15).cluster_id or ""
    except Exception as exc:  # noqa: BLE001
        raise TopicError(f"cannot reach Kafka at {settings.broker} ({exc})") from None


def refuse_partition_drift(settings: Settings, topics: dict[str, int]) -> None:
    """A worker runs only where every catalog topic has MEMSTREAM_PARTITIONS partitions: with
    another count it would judge keys by the wrong partition and read the wrong state."""
    from streams.contracts import catalog

    wrong = [(t.name, topics[t.name]) for t in catalog.topics() if topics.get(t.name, settings.partitions) != settings.partitions]
    if wrong:
        name, n = wrong[0]
        raise TopicError(
            f"{name} has {n} partitions but MEMSTREAM_PARTITIONS is {settings.partitions} "
            f"({len(wrong)} catalog topic(s) differ): set MEMSTREAM_PARTITIONS to the deployment's count; to change "
            "the count, use `memstream repartition --to M` (raising partitions by hand leaves the tables' state behind)")


TABLES_OF = "tables-of"  #: a data dir's file naming the app id (generation) its local tables mirror


def keep_tables_of(app_id: str, base_app_id: str, data_dir: Path, tabledir: Path) -> None:
    """The local tables mirror one generation's changelogs (Faust keeps a store's changelog
    offset, not the topic's name): a data dir that last ran another generation (or, without the
    file, the deployment's first one) has its tables discarded, then recovered from this
    generation's changelogs."""
    marker = data_dir / TABLES_OF
    owner = marker.read_text().strip() if marker.exists() else base_app_id
    if owner != app_id and tabledir.exists():
        log.warning("the local tables in %s mirror %s, this worker runs %s: discarding them; "
                    "they are recovered from %s's changelogs", tabledir, owner, app_id, app_id)
        shutil.rmtree(tabledir)
    if owner != app_id or not marker.exists():
        marker.write_text(app_id + "\n")


def discard_local_tables(tabledir: Path) -> None:
    """After an unclean stop (the `.running` mark of the last run is still there: SIGKILL, power
    loss), drop the local RocksDB tables: Faust writes them at once but their changelog through
    the producer, so they may hold rows the changelog never got. The worker then recovers its
    partitions from the changelogs — slower, but the same state every other worker would see."""
    if tabledir.exists():
        log.warning("the last run of this worker did not stop cleanly: discarding %s; "
                    "tables are recovered from their changelogs", tabledir)
        shutil.rmtree(tabledir)
