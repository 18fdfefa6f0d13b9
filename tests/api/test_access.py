"""Access control without a broker: the token format, scopes and user binding, masking of
content-derived values, query parameters, and the app's own route table (every route a worker
serves is documented in docs/http-api.md and refuses a request without a token, except the open
operations routes)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from streams.api.http import BadRequest, Forbidden, Token, mask_node, parse_ms, parse_tokens, permit
from streams.composition import register_all
from streams.runtime.app import Runtime
from streams.settings import Settings, SettingsError
from tests.kafka_util import free_port

HTTP_API_DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"
#: served without a token, as docs/http-api.md says: no ids, no content (checked on a real worker in
#: tests/api/test_access_kafka.py)
OPEN_ROUTES = {"/health", "/health/ready", "/health/live", "/metrics", "/dashboard"}


# ----------------------------------------------------------------------------- token format
def test_the_earlier_token_level_form_keeps_its_meaning_read_only_every_user():
    tokens = parse_tokens("t:secret, low:none ,a:b:personal")
    assert tokens["t"] == Token(name="token#1", level="secret")
    assert tokens["low"].level == "none" and not tokens["low"].scopes and tokens["low"].users is None
    assert tokens["a:b"].level == "personal"  # a token with ':' still parses as before
    assert parse_tokens("") == {}


def test_scopes_names_and_user_binding():
    tokens = parse_tokens("k:personal:admin+negotiator:name=privacy:users=tenant-a-*|bob:x,o:none:ops")
    k = tokens["k"]
    assert k.name == "privacy" and k.scopes == {"admin", "negotiator"}
    assert k.users == ("tenant-a-*", "bob:x")  # users= is last: ids may contain ':'
    assert k.may_access("tenant-a-1") and k.may_access("bob:x") and not k.may_access("bob")
    assert not k.may_access("tenant-b-1")
    assert tokens["o"].scopes == {"ops"} and tokens["o"].name == "token#2"
    assert parse_tokens("k:none:users=*")["k"].users is None


def test_json_form():
    tokens = parse_tokens('[{"token": "a,b:c", "level": "medical", "scopes": ["negotiator"], '
                          '"users": ["u1"], "name": "tenant"}]')
    assert tokens["a,b:c"] == Token(name="tenant", level="medical", scopes=frozenset({"negotiator"}), users=("u1",))


@pytest.mark.parametrize("spec", ["t", "t:everything", "t:none:root", ":none", "t:none:users=",
                                  "t:none:users=a*b", "a:none:name=x,b:none:name=x", "t:none:name=has space",
                                  '[{"token": "t", "level": "none", "role": "x"}]', "[not json"])
def test_bad_token_entries_are_settings_errors(spec):
    with pytest.raises(SettingsError):
        parse_tokens(spec)


def test_a_worker_with_a_bad_token_spec_stops_while_it_is_wired():
    """The tokens are parsed by the composition root, before any agent starts: a bad
    MEMSTREAM_API_TOKENS stops the worker there, not at its first request."""
    from streams.composition import create_runtime

    with pytest.raises(SettingsError):
        create_runtime(Settings(registry_url="", partitions=3, api_tokens="t:everything"))


def test_a_settings_error_never_shows_the_secret():
    with pytest.raises(SettingsError) as exc:
        parse_tokens("s3cr3t-value:everything")
    assert "s3cr3t-value" not in str(exc.value)


def test_permit_scopes_and_tenants():
    free = Token("free", "secret", frozenset({"admin"}))
    bound = Token("tenant", "secret", frozenset({"negotiator"}), ("a-*",))
    permit(free, scope="admin", user="anyone")
    permit(free, scope=None, user=None)
    with pytest.raises(Forbidden):
        permit(free, scope="negotiator", user="anyone")
    permit(bound, scope="negotiator", user="a-1")
    with pytest.raises(Forbidden):
        permit(bound, scope="negotiator", user="b-1")  # another tenant
    with pytest.raises(Forbidden):
        permit(bound, scope=None, user=None)  # not one user's route: a bound token gets nothing


# ----------------------------------------------------------------------------- masking
def test_a_masked_node_carries_no_content_derived_value():
    node = {"node_id": "n", "content": "PIN 1234", "sensitivity": "secret", "embedding": [0.1],
            "content_fingerprint": "sha256:abc"}
    shown = mask_node(node, "financial")
    assert shown["content"] == "[REDACTED]" and shown["content_fingerprint"] is None and "embedding" not in shown
    assert "1234" not in repr(shown) and "abc" not in repr(shown)
    clear = mask_node(node, "secret")
    assert clear["content"] == "PIN 1234" and clear["content_fingerprint"] == "sha256:abc"
    assert mask_node({**node, "sensitivity": "weird"}, "secret")["content_fingerprint"] is None  # fail closed


@pytest.mark.parametrize("raw", ["-99999999999999999999999999", "-1", "1e3", "abc", "", " 1", "9223372036854775808",
                                 "١٢٣", "9" * 5000])
def test_malformed_ms_parameters_are_bad_requests(raw):
    with pytest.raises(BadRequest):
        parse_ms({"as_of": raw}, "as_of")


def test_ms_parameters():
    assert parse_ms({}, "as_of") is None and parse_ms({}, "to", 7) == 7
    assert parse_ms({"as_of": "9223372036854775807"}, "as_of") == 2**63 - 1


# ----------------------------------------------------------------------------- the route table
def documented_routes() -> set[tuple[str, str]]:
    """(method, path) of every row of the route table of docs/http-api.md (query strings dropped)."""
    text = HTTP_API_DOC.read_text()
    section = text[text.index("\n## Routes\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| `(GET|PUT|POST|DELETE|PATCH) (/[^` ?]*)", section, re.M)
    assert len(rows) >= 10, "the route table of docs/http-api.md was not found"
    return set(rows)


@pytest.fixture(scope="module")
def served_routes():
    rt = Runtime(Settings(registry_url="", partitions=3, api_tokens="t:secret:admin+negotiator+ops"))
    register_all(rt)
    rt.app.web.init_server()
    return rt, [(r.method, r.resource.canonical) for r in rt.app.web.web_app.router.routes()]


def test_no_faust_builtin_page_is_served(served_routes):
    _rt, routes = served_routes
    paths = {p for _m, p in routes}
    assert not [p for p in paths if p == "/" or p.startswith(("/table", "/router", "/graph", "/stats",
                                                                "/assignment", "/performance", "/signal"))], paths


def test_every_served_route_is_documented(served_routes):
    _rt, routes = served_routes
    documented = documented_routes()
    doc = HTTP_API_DOC.read_text()
    for method, path in routes:
        if path in OPEN_ROUTES:
            assert f"`GET {path}`" in doc or f"{path}?" in doc or f"`{path}`" in doc, path
            continue
        if method == "HEAD":
            continue  # answered by the same view's get (or 405): checked below
        assert (method, path) in documented, f"{method} {path} is served but not in the route table of docs/http-api.md"
    assert "without authentication" in doc  # /health and /metrics are documented as open


def test_every_served_route_refuses_a_request_without_a_valid_token(served_routes):
    rt, routes = served_routes

    def concrete(path: str) -> str:
        return re.sub(r"\{[^}]+\}", "u-1", path)

    async def probe() -> list[tuple[str, str, int, int]]:
        out = []
        async with TestClient(TestServer(rt.app.web.web_app, host="127.0.0.1", port=free_port())) as client:
            for method, path in routes:
                if path in OPEN_ROUTES:
                    continue
                none = await client.request(method, concrete(path))
                wrong = await client.request(method, concrete(path), headers={"Authorization": "Bearer nope"})
                out.append((method, path, none.status, wrong.status))
        return out

    for method, path, no_token, wrong_token in asyncio.run(probe()):
        allowed = {401, 405} if method == "HEAD" else {401}
        assert no_token in allowed and wrong_token in allowed, (method, path, no_token, wrong_token)


# ----------------------------------------------------------------------------- server limits
@asynccontextmanager
async def served(rt: Runtime) -> AsyncIterator[int]:
    """The worker's web server of `rt`, in process, on a free port of this checkout's band
    (below 32768); yields the port."""
    from aiohttp import web

    rt.app.web.init_server()
    runner = rt.app.web._runner
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def test_server_limits_close_slow_heads_and_connections_beyond_the_cap():
    rt = Runtime(Settings(registry_url="", partitions=3, api_tokens="t:none", http_header_timeout_s=0.5,
                          http_max_connections=2, http_idle_timeout_s=1.0))
    register_all(rt)

    async def scenario() -> dict[str, object]:
        async with served(rt) as port:
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
            slow_w.write(b"GET /v1/graphs/g HTTP/1.1\r\nHost: x\r\n")  # the head never ends
            idle_r, _idle_w = await asyncio.open_connection("127.0.0.1", port)  # never sends a byte
            await asyncio.sleep(0.1)
            over_r, _over_w = await asyncio.open_connection("127.0.0.1", port)  # the third: over the cap
            over = await asyncio.wait_for(over_r.read(), 2)
            slow = await asyncio.wait_for(slow_r.read(), 3)  # closed by the head timeout
            idle = await asyncio.wait_for(idle_r.read(), 3)  # closed by the head / idle timeout
            ok_r, ok_w = await asyncio.open_connection("127.0.0.1", port)  # room again
            ok_w.write(b"GET /v1/graphs/g HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            ok = await asyncio.wait_for(ok_r.read(), 3)
            return {"over": over, "slow": slow, "idle": idle, "ok": ok}

    out = asyncio.run(scenario())
    assert out["over"] == b"" and out["slow"] == b"" and out["idle"] == b""
    assert out["ok"].startswith(b"HTTP/1.1 401")


def test_a_body_that_does_not_arrive_in_time_is_408():
    rt = Runtime(Settings(registry_url="", partitions=3, api_tokens="t:none:negotiator", http_read_timeout_s=0.5))
    register_all(rt)

    async def scenario() -> bytes:
        async with served(rt) as port:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST /v1/negotiator/u-1/forget HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"desc")
            return await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)

    assert asyncio.run(scenario()).startswith(b"HTTP/1.1 408")


def test_erase_refuses_a_hostile_body_before_anything_is_sent():
    """The erase route (admin scope) answers 400 for a body that is not an object, a requestId
    that is not a string, or ids that break the id rules; nothing reaches Kafka (the runtime is
    not started: a send would fail the request with a 500)."""
    rt = Runtime(Settings(registry_url="", partitions=3, api_tokens="adm:secret:admin"))
    register_all(rt)
    rt.app.web.init_server()
    cases = [("u-1", b"[1, 2]"), ("u-1", b'{"requestId": true}'), ("u-1", b'{"requestId": {"x": 1}}'),
             ("u-1", b'{"requestId": "' + b"r" * 129 + b'"}'), ("u-1", b'{"requestId": "a/b"}'),
             ("u%2Fx", b"{}"), ("u-1", b"not json")]

    async def probe() -> list[tuple[str, int, str]]:
        out = []
        async with TestClient(TestServer(rt.app.web.web_app, host="127.0.0.1", port=free_port())) as client:
            for user, body in cases:
                r = await client.post(f"/v1/memory/{user}/erase", data=body,
                                      headers={"Authorization": "Bearer adm", "Content-Type": "application/json"})
                out.append((body.decode()[:40], r.status, await r.text()))
        return out

    for body, status, text in asyncio.run(probe()):
        assert status == 400 and "error" in text, (body, status, text)


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_limit_is_413_naming_the_limit_and_logs_nothing_above_info(declared, caplog):
    """With a Content-Length over MEMSTREAM_HTTP_MAX_BODY_BYTES the body is refused before it is
    read; a chunked body (no Content-Length) as soon as it passes the limit. Either way: 413 with
    the limit and its setting in the message, no ERROR traceback, no WARNING."""
    rt = Runtime(Settings(registry_url="", partitions=3, api_tokens="t:none:negotiator", http_max_body_bytes=1000))
    register_all(rt)
    body = b'{"description": "' + b"x" * 5000 + b'"}'

    async def probe() -> tuple[int, str]:
        async with TestClient(TestServer(rt.app.web.web_app, host="127.0.0.1", port=free_port())) as client:
            async def chunks():
                for i in range(0, len(body), 512):
                    yield body[i:i + 512]

            data = body if declared else chunks()
            r = await client.post("/v1/negotiator/u-1/forget", data=data,
                                  headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
            return r.status, await r.text()

    caplog.set_level(logging.DEBUG)
    status, text = asyncio.run(probe())
    assert status == 413, text
    assert "1000-byte limit" in text and "MEMSTREAM_HTTP_MAX_BODY_BYTES" in text
    assert ("Content-Length 5" in text) == declared
    loud = [r for r in caplog.records if r.levelno > logging.INFO]
    assert loud == [], [r.getMessage() for r in loud]


def test_a_body_within_the_limit_is_read_whole():
    rt = Runtime(Settings(registry_url="", partitions=3, api_tokens="adm:secret:admin", http_max_body_bytes=64))
    register_all(rt)
    rt.app.web.init_server()

    async def probe() -> tuple[int, str]:
        async with TestClient(TestServer(rt.app.web.web_app, host="127.0.0.1", port=free_port())) as client:
            # exactly at the limit, and not JSON: read whole, then refused as a bad body (400), not 413
            r = await client.post("/v1/memory/u-1/erase", data=b"n" * 64,
                                  headers={"Authorization": "Bearer adm", "Content-Type": "application/json"})
            return r.status, await r.text()

    status, text = asyncio.run(probe())
    assert status == 400 and "not JSON" in text, text


def test_the_body_limit_must_be_positive():
    with pytest.raises(SettingsError, match="MEMSTREAM_HTTP_MAX_BODY_BYTES=0 must be at least 1"):
        Settings(http_max_body_bytes=0)


def test_a_body_read_twice_is_the_same_bytes():
    """Forwarding reads the body (to relay it to the key's owner), and the view that answers
    locally reads it again: the second read must get the same bytes, not an empty stream."""
    from types import SimpleNamespace

    from aiohttp import streams
    from aiohttp.test_utils import make_mocked_request

    from streams.api.http import ApiView

    async def twice() -> tuple[bytes, bytes]:
        protocol = SimpleNamespace(_reading_paused=False, pause_reading=lambda **_: None, resume_reading=lambda **_: None)
        payload = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
        payload.feed_data(b'{"description": "x"}')
        payload.feed_eof()
        request = make_mocked_request("POST", "/v1/negotiator/u-1/forget", headers={"Content-Length": "20"},
                                      payload=payload)
        view = SimpleNamespace(max_body_bytes=1000, read_timeout_s=1.0)
        return await ApiView.read_body(view, request), await ApiView.read_body(view, request)

    first, second = asyncio.run(twice())
    assert first == second == b'{"description": "x"}'
