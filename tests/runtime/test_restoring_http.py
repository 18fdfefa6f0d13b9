"""The web port while the restore ahead runs (streams/runtime/restoring_http.py): alive, not
ready, never a 500, bounded against idle and oversized requests, and free again for Faust."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time

import pytest

from streams.runtime import restoring_http
from tests.kafka_util import free_port


def _call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_alive_but_not_ready_and_every_other_route_503_with_retry_after():
    port = free_port()
    with restoring_http.serving("127.0.0.1", port) as status:
        status.update(1234, 5000)
        code, _, body = _call(port, "GET", "/health/live")
        assert (code, json.loads(body)) == (200, {"status": "alive", "phase": "restoring"})
        for path in ("/health", "/health/ready", "/health/?x=1"):
            code, headers, body = _call(port, "GET", path)
            answer = json.loads(body)
            assert code == 503 and headers["retry-after"] == str(restoring_http.RETRY_AFTER_S)
            assert answer["status"] == "restoring"
            assert (answer["restored_records"], answer["records_at_most"]) == (1234, 5000)
        code, headers, body = _call(port, "GET", "/metrics")
        assert code == 200 and headers["content-type"].startswith("text/plain")
        lines = body.decode().splitlines()
        assert "memstream_ready 0" in lines and "memstream_restore_ahead_records 1234" in lines
        for method, path, payload in (("GET", "/v1/memory/u1/nodes", None), ("POST", "/v1/negotiator/remember", b"{}"),
                                      ("DELETE", "/v1/memory/u1", None), ("PUT", "/", b"x" * 10_000)):
            code, headers, body = _call(port, method, path, payload)
            assert code == 503 and json.loads(body)["error"] == "restoring", (method, path)
            assert headers["retry-after"] == str(restoring_http.RETRY_AFTER_S)
        code, headers, body = _call(port, "HEAD", "/health")
        assert code == 503 and body == b""


def test_an_idle_client_does_not_hold_the_others_and_oversized_requests_get_4xx():
    port = free_port()
    with restoring_http.serving("127.0.0.1", port):
        silent = socket.create_connection(("127.0.0.1", port))  # connects, never sends a request
        try:
            assert _call(port, "GET", "/health/live")[0] == 200
            assert _call(port, "GET", "/" + "a" * 70_000)[0] == 414  # request line over the stdlib's 64 KiB
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            with raw:
                raw.sendall(b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n")
                assert raw.recv(64).startswith(b"HTTP/1.0 431")  # over the stdlib's 100 headers
            started = time.monotonic()
            silent.settimeout(restoring_http.REQUEST_TIMEOUT_S + 10)
            assert silent.recv(1) == b""  # closed by the server after its request timeout
            assert time.monotonic() - started < restoring_http.REQUEST_TIMEOUT_S + 10
        finally:
            silent.close()


def test_the_port_is_free_for_faust_afterwards():
    port = free_port()
    with restoring_http.serving("127.0.0.1", port):
        assert _call(port, "GET", "/health/live")[0] == 200
    with pytest.raises(OSError):
        _call(port, "GET", "/health/live")  # nothing answers any more
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's create_server does
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
    finally:
        s.close()


def test_a_taken_port_is_logged_and_the_restore_goes_on(caplog):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="memstream.restore"):
            with restoring_http.serving("127.0.0.1", port) as status:
                status.update(1, 2)  # the restore still gets its status object
        assert any(f"127.0.0.1:{port}" in r.getMessage() for r in caplog.records)
    finally:
        taken.close()
