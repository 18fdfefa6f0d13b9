"""HTTP API plumbing shared by every view: bearer-token auth, sensitivity masking, JSON replies,
and forwarding a request to the worker that owns its key.

Tokens come from MEMSTREAM_API_TOKENS (`token:level,...`): each token may read content up to a
sensitivity level; anything above it is returned as "[REDACTED]" (never the content, never the
embedding). A request without a valid token gets 401. Views subclass `ApiView`.

Routing (one path for every view, `ApiView.route`): the partition of a key is murmur2 of its
changelog key bytes modulo the table's partition count — computed here, not asked of the Kafka
client (Faust's own router asks the producer for the changelog topic's metadata, which it only has
once this worker has written to that topic: on a fresh stack that was a `TypeError` and a 500) —
and the owner of that partition is read from the partition assignor's table of changelog
partition → worker URL, which every member receives with its assignment. `PartitionRouter`
replaces Faust's router with this, so `app.router.key_store` (and Faust's `/router/` views) use it
too. When no owner is known (before the first assignment, during a rebalance) or the owner cannot
be reached, the answer is 503 with `Retry-After: RETRY_AFTER_S`; a forwarded request that
arrives at a worker which does not own the key either (ownership moved in between) is not
forwarded again: 503 + Retry-After. An unexpected exception in a view is logged and answered
with an empty 500.
"""

from __future__ import annotations

import asyncio
import logging
from functools import wraps
from typing import Any, Awaitable, Callable, Mapping

import aiohttp
import orjson
from aiokafka.partitioner import murmur2
from faust.app.router import Router
from faust.web import Request, Response, View
from yarl import URL

from .core.ingest import REDACTED_CONTENT
from .core.vocabulary import SENSITIVITY_LEVELS, sensitivity_rank

log = logging.getLogger("memstream.http")

RETRY_AFTER_S = 1  #: seconds a 503 asks the client to wait (`Retry-After`)
FORWARD_TIMEOUT_S = 40.0  #: a forwarded request's limit (the negotiator view waits up to 30 s)
FORWARDED_HEADER = "X-Memstream-Forwarded"  #: set on a forwarded request: never forwarded twice
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class OwnerUnknown(KeyError):
    """No worker is known to own the key's partition (no assignment yet, or rebalancing)."""


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a key: murmur2 as the Java client (and aiokafka's default partitioner)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def owner_url(distribution: Mapping[Any, Mapping[str, Any]], topic: str, partition: int) -> str | None:
    """The worker URL that actively owns `topic`'s `partition` in the assignor's distribution
    ({url: {topic: [partitions]}}), or None."""
    for url, topics in distribution.items():
        if partition in (topics.get(topic) or ()):
            return str(url)
    return None


class PartitionRouter(Router):
    """Faust's router without the Kafka client's topic metadata (see the module docstring)."""

    def key_store(self, table_name: str, key: Any) -> URL:
        table = self._get_table(table_name)
        topic = self._get_table_topic(table)
        partitions = table.changelog_topic.partitions or self.app.conf.topic_partitions
        partition = key_partition(self._get_serialized_key(table, key), partitions)
        url = owner_url(self._assignor.tables_metadata(), topic, partition)
        if url is None:
            raise OwnerUnknown(f"no worker owns partition {partition} of {topic} yet")
        return URL(url)



class AuthError(Exception):
    """No or unknown bearer token."""


class BadRequest(Exception):
    """The request's body or parameters are wrong (400)."""


def parse_tokens(spec: str) -> dict[str, str]:
    """`tok:personal,tok2:secret` → {token: level}; a bad entry is a settings error."""
    from .settings import SettingsError

    tokens: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        token, sep, level = entry.rpartition(":")
        if not sep or not token or level not in SENSITIVITY_LEVELS:
            raise SettingsError(
                f"MEMSTREAM_API_TOKENS entry {entry!r} must be token:level with level one of {', '.join(SENSITIVITY_LEVELS)}")
        tokens[token] = level
    return tokens


def authorize(headers: Mapping[str, str], tokens: Mapping[str, str]) -> str:
    """The sensitivity level the request's bearer token may read."""
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthError("missing bearer token: send `Authorization: Bearer <token>` (tokens: MEMSTREAM_API_TOKENS)")
    level = tokens.get(token.strip())
    if level is None:
        raise AuthError("unknown bearer token")
    return level


def mask_node(node: Mapping[str, Any], allowed: str) -> dict[str, Any]:
    """A node as the caller may see it: content above `allowed` is "[REDACTED]"; a node with an
    unknown or missing sensitivity is treated as above every level (fail closed)."""
    out = dict(node)
    out.pop("embedding", None)
    sensitivity = node.get("sensitivity")
    visible = sensitivity in SENSITIVITY_LEVELS and sensitivity_rank(sensitivity) <= sensitivity_rank(allowed)
    if not visible:
        out["content"] = REDACTED_CONTENT
        out["redacted"] = True
    return out


def json_body(data: Any) -> bytes:
    return orjson.dumps(data)


class ApiView(View):
    """A Faust view answering JSON, with the token table of its worker."""

    tokens: Mapping[str, str] = {}

    def reply(self, data: Any, status: int = 200) -> Response:
        return self.bytes(json_body(data), content_type="application/json", status=status)

    def error(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
        return self.bytes(json_body({"error": message}), content_type="application/json", status=status,
                          headers=dict(headers) if headers else None)

    def unavailable(self, message: str) -> Response:
        """503 with `Retry-After`: the answer exists, just not here and now (clients retry)."""
        return self.error(503, message, {"Retry-After": str(RETRY_AFTER_S)})

    async def dispatch(self, request: Any) -> Any:
        """Faust's dispatch, with any unexpected exception of a view logged and answered with an
        empty 500 (aiohttp's default page would name the server's internals)."""
        try:
            return await super().dispatch(request)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the one place a view's bug becomes a 500
            log.exception("%s %s failed", request.method, request.path)
            return self.bytes(b"", status=500)

    def settling(self) -> Response | None:
        """503 while this worker's partitions are moving or being recovered: its local state may
        be incomplete, and the partition may not even be its own any more. Clients retry."""
        app = self.app
        if getattr(app, "rebalancing", False) or app.tables.recovery.in_recovery \
                or not app.tables.recovery.completed.is_set():
            return self.unavailable("this worker is rebalancing or recovering its partitions; retry shortly")
        return None

    async def json_body(self, request: Request) -> dict:
        try:
            data = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return data

    async def route(self, request: Request, table: Any, key: str,
                    local: Callable[[], Awaitable[Response]]) -> Response:
        """Answer locally when this worker owns `key`'s partition of `table` (503 while it is
        still recovering it), else forward the whole request (method, headers and body — Faust's
        own table_route drops the body) to the owner and relay its answer. Never a 500 for a
        missing owner: 503 + Retry-After (see the module docstring)."""
        try:
            dest = self.app.router.key_store(table.name, key)
        except KeyError:
            return self.unavailable("the owner of this key's partition is not known yet (starting or rebalancing); retry")
        here = self.app.conf.canonical_url
        if (dest.host, dest.port) == (here.host, here.port):
            return self.settling() or await local()
        if request.headers.get(FORWARDED_HEADER):
            return self.unavailable("the partition owner is moving (the forwarding worker and this one disagree); retry")
        url = request.url.with_scheme(dest.scheme or "http").with_host(dest.host).with_port(int(dest.port))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers[FORWARDED_HEADER] = "1"
        try:
            async with self.app.http_client.request(
                    method=request.method, url=url, headers=headers, data=await request.read(),
                    timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as resp:
                body = await resp.read()
                relayed = {k: resp.headers[k] for k in ("Retry-After",) if k in resp.headers}
                return self.bytes(body, content_type=resp.content_type, status=resp.status, headers=relayed or None)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("forwarding %s %s to %s failed: %r", request.method, request.path, dest, exc)
            return self.unavailable(f"the partition owner {dest} did not answer; retry")

    def allowed_level(self, request: Request) -> str:
        """The sensitivity the caller may read; raises AuthError (answer with `self.error(401, …)`)."""
        return authorize(request.headers, self.tokens)


def authenticated(fun: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """View-method decorator: 401 without a valid bearer token, else the method is called with
    `allowed=` the sensitivity level the token may read. A request is refused where it arrives
    (before `ApiView.route` forwards it); a forwarded one is checked again."""

    @wraps(fun)
    async def checked(self: ApiView, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            allowed = self.allowed_level(request)
        except AuthError as exc:
            return self.error(401, str(exc))
        return await fun(self, request, *args, allowed=allowed, **kwargs)

    return checked


def api_view(tokens: Mapping[str, str]) -> type[ApiView]:
    """An ApiView base bound to one worker's tokens."""
    return type("BoundApiView", (ApiView,), {"tokens": dict(tokens)})
