"""The worker's web port while the restore ahead runs (streams/runtime/restore.py), before Faust
starts its own web server on it.

The restore ahead of a large state takes minutes (up to MEMSTREAM_RESTORE_AHEAD_TIMEOUT_S). If
nothing listened on the port meanwhile, an orchestrator following the README ("restart the
worker when `/health/live` does not answer") would kill the worker in the middle of its copy,
and the next start would begin again: a restart loop that never gets the worker ready. So a
small threaded HTTP server answers on the same host and port until the copy is done:

- `GET /health/live`: 200 `{"status": "alive", "phase": "restoring"}` (the process is working);
- `GET /health`, `/health/ready`: 503 `{"status": "restoring", "reason": ..., "restored_records":
  n, "records_at_most": total}` with `Retry-After` (not ready: route no traffic here yet);
- `GET /metrics`: `memstream_ready 0`, `memstream_restore_ahead_in_progress 1` and
  `memstream_restore_ahead_records` (Prometheus text format);
- anything else, any method: 503 `{"error": "restoring", ...}` with `Retry-After`, never a 500.

It reads no request body, waits at most `REQUEST_TIMEOUT_S` for a client, and is closed before
Faust binds the port. A port that is already taken is logged and skipped (Faust then reports it).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("memstream.restore")

#: how long the server waits for a client's request line and headers
REQUEST_TIMEOUT_S = 5.0
#: Retry-After of the 503 answers, in seconds
RETRY_AFTER_S = 5
REASON = "copying the table changelogs into the local stores before joining the group (restore ahead)"


class RestoreStatus:
    """What the restore ahead has done so far (updated from its thread, read by the server's)."""

    def __init__(self) -> None:
        self.rows = 0
        self.total = 0

    def update(self, rows: int, total: int) -> None:
        self.rows, self.total = rows, total


def _answer(status: RestoreStatus, path: str) -> tuple[int, str, bytes]:
    """(HTTP status, content type, body) for a request of `path` while restoring."""
    route = path.split("?", 1)[0].rstrip("/") or "/"
    if route == "/health/live":
        return 200, "application/json", json.dumps({"status": "alive", "phase": "restoring"}).encode()
    if route in ("/health", "/health/ready"):
        body = {"status": "restoring", "reason": REASON, "restored_records": status.rows,
                "records_at_most": status.total}
        return 503, "application/json", json.dumps(body).encode()
    if route == "/metrics":
        text = ("# TYPE memstream_ready gauge\nmemstream_ready 0\n"
                "# TYPE memstream_restore_ahead_in_progress gauge\nmemstream_restore_ahead_in_progress 1\n"
                f"# TYPE memstream_restore_ahead_records gauge\nmemstream_restore_ahead_records {status.rows}\n")
        return 200, "text/plain; version=0.0.4; charset=utf-8", text.encode()
    return 503, "application/json", json.dumps({"error": "restoring", "reason": REASON}).encode()


def _handler(status: RestoreStatus) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a client that sends nothing holds its thread this long at most
        server_version = "memstream"
        sys_version = ""

        def _respond(self) -> None:
            code, ctype, body = _answer(status, self.path)
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            if code == 503:
                self.send_header("Retry-After", str(RETRY_AFTER_S))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.close_connection = True

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _respond

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's name
            log.debug("restoring: " + format, *args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # an open request never holds the worker back


@contextmanager
def serving(host: str, port: int) -> Iterator[RestoreStatus]:
    """Answer on `host:port` as described above while the block runs; the port is free again
    (for Faust) when it ends."""
    status = RestoreStatus()
    try:
        server = _Server((host, port), _handler(status))
    except OSError as exc:
        log.warning("cannot answer /health on %s:%d during the restore ahead (%s)", host, port, exc)
        yield status
        return
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="restoring-http", daemon=True)
    thread.start()
    try:
        yield status
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
