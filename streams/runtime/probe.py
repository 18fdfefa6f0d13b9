"""What one worker depends on, watched from a thread of its own (issue 18): the schema registry
(reachable, and still mapping every id the worker used to the same schema), the broker
(reachable) and the data disk (not full). A thread, so that it runs whatever the event loop is
doing (table recovery, an agent waiting on the registry).

- Registry ids: `verify_ids` compares every id the worker used (`streams.contracts.schemaids.KnownIds`, kept
  in `<data dir>/schema-ids.json`) with what the registry says now: at start, every
  MEMSTREAM_HEALTH_CHECK_INTERVAL_S, and when a record does not decode (`explains`). On a
  difference the worker stops consuming (`wait_consistent`), says so once at CRITICAL, in
  `/health` (`registry_mismatch`) and in `/metrics`, and resumes only when the registry maps every
  id as before again.
- Disk: free space of the data dir below MEMSTREAM_MIN_FREE_DISK_BYTES, or "No space left on
  device" from anything the worker logs (RocksDB's errors surface only as log lines of Faust's
  recovery, which otherwise retries forever), stops the worker at once with exit status
  `EXIT_DISK_FULL`, naming the directory. Nothing unapplied is committed (the process ends
  before any commit), and the next start discards the local tables (the `.running` mark stays).
- SIGTERM/SIGINT: `arm_shutdown_deadline` ends the process MEMSTREAM_SHUTDOWN_TIMEOUT_S after the
  signal if the orderly stop has not finished (exit status `EXIT_STOP_TIMEOUT`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.contracts.schemaids import IdMismatch, KnownIds, KnownSchema, mismatches
from streams.contracts.wire import RegistryError
from streams.runtime.thread_names import name_os_thread
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.contracts.schemas import SchemaVersion
    from streams.contracts.wire import CodecFactory

log = logging.getLogger("memstream.probe")

#: Exit status of a worker stopped because its data disk is full (sysexits EX_IOERR).
EXIT_DISK_FULL = 74
#: Exit status of a worker that did not stop within MEMSTREAM_SHUTDOWN_TIMEOUT_S of a signal.
EXIT_STOP_TIMEOUT = 75
KNOWN_IDS_FILE = "schema-ids.json"
ENOSPC_TEXT = "No space left on device"
#: a decode error re-checks the registry at most this often (bad data must not flood it)
EXPLAIN_MIN_INTERVAL_S = 2.0
#: the loggers of the registry client's HTTP library (confluent-kafka's vendored `httpx2`, or
#: `httpx`), which log one INFO line per request: ~2 lines a second from every worker's probe
HTTP_CLIENT_LOGGERS = ("httpx", "httpx2")

#: every problem /health and /metrics can name (streams/agents/ops.py)
REASONS = ("registry_unreachable", "registry_mismatch", "broker_unreachable", "disk_full", "recovery_stuck",
           "agent_stalled")


def quiet_http_clients() -> None:
    """Only warnings and errors from the HTTP clients' loggers."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def known_schema(version: SchemaVersion) -> KnownSchema:
    return KnownSchema(version.name, version.fingerprint.hex())


def stop_for_full_disk(directory: str, detail: str) -> None:
    """The one way a worker ends on a full disk: one clear line, then exit EXIT_DISK_FULL."""
    log.critical("data disk full: %s (%s); stopping the worker (exit %d) without committing anything "
                 "more: free space there, then restart it (its local tables are rebuilt from the changelogs)",
                 Path(directory).resolve(), detail, EXIT_DISK_FULL)
    logging.shutdown()
    os._exit(EXIT_DISK_FULL)


class _DiskFullLogHook(logging.Handler):
    """Turns "No space left on device" in any log record into `stop_for_full_disk`."""

    def __init__(self, directory: str) -> None:
        super().__init__(level=logging.WARNING)
        self.directory = directory

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == log.name:
            return  # its own line (which quotes the error)
        exc = record.exc_info[1] if record.exc_info else None
        text = f"{record.getMessage()} {exc or ''}"
        if ENOSPC_TEXT in text or getattr(exc, "errno", None) == errno.ENOSPC:
            stop_for_full_disk(self.directory, f"{record.name}: {text.strip()[:300]}")


class WorkerProbe:
    def __init__(self, settings: Settings, codecs: CodecFactory) -> None:
        self.settings = settings
        self.codecs = codecs
        self.path = Path(settings.data_dir) / KNOWN_IDS_FILE
        self.known = KnownIds("", {})
        self.mismatched: list[IdMismatch] = []
        self.registry_error: str | None = None
        self.broker_error: str | None = None
        self._lock = threading.Lock()
        #: thread id -> monotonic time its registry check began: the probe's rounds and `explains`
        #: (from the decode path) may check at once, and one ending must not hide the other
        self._checks: dict[int, float] = {}
        self._last_explain = 0.0
        self._admin: Any = None  # a confluent_kafka AdminClient, made on first use

    # ------------------------------------------------------------------ registry ids
    def load(self, cluster_id: str) -> None:
        """The ids this worker used before, if they were for this cluster."""
        try:
            known = KnownIds.from_json(self.path.read_text(), self.settings.max_known_schema_ids)
        except FileNotFoundError:
            known = KnownIds(cluster_id, {})
        except ValueError as exc:
            log.warning("%s is unreadable (%s); starting with no known schema ids", self.path, exc)
            known = KnownIds(cluster_id, {})
        self.known = known.for_cluster(cluster_id)

    def verify_ids(self) -> list[IdMismatch]:
        """Compare every id used (remembered, and cached by the codecs) with the registry now;
        remember the ids that agree. Raises RegistryError when the registry is unreachable."""
        cached = {i: known_schema(v) for i, v in self.codecs.known_ids().items()}
        known = {**cached, **self.known.ids}  # what an id meant first wins
        me = threading.get_ident()
        with self._lock:
            self._checks[me] = time.monotonic()
        try:
            now = {i: (known_schema(v) if v is not None else None)
                   for i, v in self.codecs.registry_now(sorted(known)).items()}
        except RegistryError as exc:
            with self._lock:
                self.registry_error = str(exc)
            raise
        finally:
            with self._lock:
                self._checks.pop(me, None)
        found = mismatches(known, now)
        for m in found:
            if m.schema_id in cached and cached[m.schema_id] != known[m.schema_id]:
                self.codecs.forget_id(m.schema_id)  # learned from the changed registry: read again later
        with self._lock:
            was = {m.schema_id for m in self.mismatched}
            self.mismatched, self.registry_error = found, None
        if found and {m.schema_id for m in found} != was:
            log.critical("schema registry at %s no longer maps the schema ids this worker used: %s; NOT consuming "
                         "(nothing is read with the wrong schema, nothing dead-lettered) until it does again: "
                         "restore the registry's storage (docs/operations.md, 'Schema ids')", self.settings.registry_url,
                         "; ".join(map(str, found[:5])) + (f"; and {len(found) - 5} more" if len(found) > 5 else ""))
        elif was and not found:
            log.warning("schema registry maps every known schema id as before again; consuming")
        if not found:
            self._remember({i: s for i, s in cached.items() if now.get(i) == s})
        return found

    @property
    def checking_since(self) -> float | None:
        """When the oldest registry check still waiting for its answers began (None: none is)."""
        with self._lock:
            return min(self._checks.values(), default=None)

    @property
    def hang_after_s(self) -> float:
        """How long a registry check may wait before the registry counts as unreachable: one
        request's timeout, or half the health interval if that is shorter (a registry that hangs
        shows on /health within about one interval, not after every request's timeout)."""
        return min(self.settings.registry_timeout_s, self.settings.health_check_interval_s / 2)

    def registry_problem(self, now: float | None = None) -> str | None:
        """Why the registry counts as unreachable now, or None: the last check's error, or a check
        that has waited longer than `hang_after_s` for its answers (a registry that hangs)."""
        with self._lock:
            error = self.registry_error
        if error:
            return error
        since = self.checking_since
        waited = (time.monotonic() if now is None else now) - since if since is not None else 0.0
        if waited > self.hang_after_s:
            return (f"schema registry at {self.settings.registry_url} has not answered for {waited:.0f} s "
                    f"(it accepts connections but does not answer: hung or overloaded)")
        return None

    def _remember(self, learned: dict[int, KnownSchema]) -> None:
        new = self.known.learn(learned, self.settings.max_known_schema_ids)
        if new == self.known and self.path.exists():
            return
        self.known = new
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(new.to_json())
            os.replace(tmp, self.path)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                stop_for_full_disk(self.settings.data_dir, f"writing {self.path}: {exc}")
            log.warning("could not save the known schema ids to %s: %s", self.path, exc)

    def explains(self, schema_id: int | None) -> bool:
        """Whether a record that did not decode is explained by the registry mapping its id (or
        any id used) differently than before: then the record is not at fault."""
        if schema_id is None or self.codecs.registry is None:
            return False
        if self.mismatched:
            return True
        if time.monotonic() - self._last_explain < EXPLAIN_MIN_INTERVAL_S:
            return False
        self._last_explain = time.monotonic()
        try:
            return bool(self.verify_ids())
        except RegistryError:
            return False  # the decode path retries registry errors itself

    async def wait_consistent(self) -> None:
        """Return at once while the registry agrees; otherwise when it agrees again."""
        while self.mismatched:  # noqa: ASYNC110 -- set by the periodic check, polled as it runs
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ broker, disk
    def check_broker(self) -> None:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.settings.broker, "log_level": 0})
        try:
            self._admin.list_topics(timeout=5)
            error = None
        except Exception as exc:  # noqa: BLE001 - any failure: unreachable
            error = f"cannot reach Kafka at {self.settings.broker}: {exc}"
        with self._lock:
            self.broker_error = error

    def check_disk(self) -> None:
        directory = self.settings.data_dir
        try:
            free = shutil.disk_usage(directory).free
        except OSError as exc:
            log.warning("free space of %s unknown: %s", directory, exc)
            return
        if free < self.settings.min_free_disk_bytes:
            stop_for_full_disk(directory, f"{free} bytes free, below MEMSTREAM_MIN_FREE_DISK_BYTES="
                                          f"{self.settings.min_free_disk_bytes}")

    def watch_log(self, logger: logging.Logger) -> None:
        """Watch this logger's records for "No space left on device" (call again after anything
        that replaces its handlers, as Faust's logging set-up does)."""
        if not any(isinstance(h, _DiskFullLogHook) for h in logger.handlers):
            logger.addHandler(_DiskFullLogHook(self.settings.data_dir))

    # ------------------------------------------------------------------ the thread
    def start(self, cluster_id: str) -> None:
        """First checks now (before the worker consumes anything), then a daemon thread."""
        quiet_http_clients()
        self.watch_log(logging.getLogger())
        self.check_disk()
        self.load(cluster_id)
        self._round(first=True)
        threading.Thread(target=self._run, name="memstream-probe", daemon=True).start()

    def _round(self, first: bool = False) -> None:
        self.check_disk()
        try:
            self.verify_ids()
        except RegistryError as exc:
            if first:
                log.warning("schema registry unreachable at start (%s)", exc)
        self.check_broker()

    def _run(self) -> None:
        name_os_thread("ms-probe")
        while True:
            time.sleep(self.settings.health_check_interval_s)
            try:
                self._round()
            except Exception:  # noqa: BLE001 - the probe must outlive anything odd
                log.exception("health probe round failed")


def arm_shutdown_deadline(timeout_s: float) -> None:
    """After a stop signal: end the process if the orderly stop takes longer than `timeout_s`."""

    def expire() -> None:
        time.sleep(timeout_s)
        log.error("the worker did not stop within MEMSTREAM_SHUTDOWN_TIMEOUT_S=%.0f s of the signal; exiting "
                  "(exit %d); nothing unapplied was committed", timeout_s, EXIT_STOP_TIMEOUT)
        logging.shutdown()
        os._exit(EXIT_STOP_TIMEOUT)

    threading.Thread(target=expire, name="memstream-stop-deadline", daemon=True).start()
