"""HTTP API plumbing shared by every view: bearer-token auth, sensitivity masking, JSON replies.

Tokens come from MEMSTREAM_API_TOKENS (`token:level,...`): each token may read content up to a
sensitivity level; anything above it is returned as "[REDACTED]" (never the content, never the
embedding). A request without a valid token gets 401. Views subclass `ApiView`.
"""

from __future__ import annotations

from functools import wraps
from typing import Any, Awaitable, Callable, Mapping

import orjson
from faust.web import Request, Response, View

from .core.ingest import REDACTED_CONTENT
from .core.vocabulary import SENSITIVITY_LEVELS, sensitivity_rank



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

    def error(self, status: int, message: str) -> Response:
        return self.reply({"error": message}, status)

    def unavailable(self, message: str, retry_after_s: int = 30) -> Response:
        """503 with a Retry-After header: the answer exists, just not here or not yet."""
        response = self.error(503, message)
        response.headers["Retry-After"] = str(retry_after_s)
        return response

    def settling(self) -> Response | None:
        """503 while this worker's partitions are moving or being recovered: its local state may
        be incomplete, and the partition may not even be its own any more. Clients retry."""
        app = self.app
        if getattr(app, "rebalancing", False) or app.tables.recovery.in_recovery \
                or not app.tables.recovery.completed.is_set():
            return self.error(503, "this worker is rebalancing or recovering its partitions; retry shortly")
        return None

    async def json_body(self, request: Request) -> dict:
        try:
            data = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return data

    async def route(self, request: Request, table: Any, key: str, local: Any) -> Response:
        """Answer locally when this worker owns `key`'s partition of `table`, else forward the
        whole request (method, headers and body — Faust's own table_route drops the body) to
        the owner and relay its answer."""
        try:
            dest = self.app.router.key_store(table.name, key)
        except KeyError:
            return self.error(503, "partition owner unknown (rebalancing); retry")
        here = self.app.conf.canonical_url
        if (dest.host, dest.port) == (here.host, here.port):
            return await local()
        url = request.url.with_host(dest.host).with_port(int(dest.port))
        async with self.app.http_client.request(method=request.method, url=url, headers=request.headers,
                                                data=await request.read()) as resp:
            return self.bytes(await resp.read(), content_type=resp.content_type, status=resp.status)

    def allowed_level(self, request: Request) -> str:
        """The sensitivity the caller may read; raises AuthError (answer with `self.error(401, …)`)."""
        return authorize(request.headers, self.tokens)


def authenticated(fun: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """View-method decorator: 401 without a valid bearer token, else the method is called with
    `allowed=` the sensitivity level the token may read. Put it outermost (above
    `table_route`): a request is refused where it arrives; a forwarded one is checked again."""

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
