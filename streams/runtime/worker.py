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

from streams.contracts.topics import TopicError, missing_topics
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.worker")


def run(settings: Settings, create_runtime: Callable[[Settings], Runtime]) -> int:
    """Run one worker until it is stopped; `create_runtime` builds its Runtime with every agent
    and view registered (streams/composition.py: the runtime does not know them)."""
    missing = missing_topics(settings)
    if missing:
        raise TopicError(
            f"{len(missing)} catalog topic(s) missing ({', '.join(missing[:3])}…); run `memstream topics apply` first"
        )
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    from streams.contracts.topics import ensure_internal
    from streams.runtime import faust_internals

    rt = create_runtime(settings)
    app = rt.app
    created = ensure_internal(settings, rt.internal_topics)
    if created:
        log.info("created internal topics %s", ", ".join(created))
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


def discard_local_tables(tabledir: Path) -> None:
    """After an unclean stop (the `.running` mark of the last run is still there: SIGKILL, power
    loss), drop the local RocksDB tables: Faust writes them at once but their changelog through
    the producer, so they may hold rows the changelog never got. The worker then recovers its
    partitions from the changelogs — slower, but the same state every other worker would see."""
    if tabledir.exists():
        log.warning("the last run of this worker did not stop cleanly: discarding %s; "
                    "tables are recovered from their changelogs", tabledir)
        shutil.rmtree(tabledir)
