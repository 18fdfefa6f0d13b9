"""HTTP API plumbing shared by every view: bearer-token auth, sensitivity masking, JSON replies,
and forwarding a request to the worker that owns its key.

Tokens come from MEMSTREAM_API_TOKENS (`parse_tokens`): each token reads content up to a
sensitivity level (anything above it, and every value derived from it, is "[REDACTED]" or
null: `mask_node`), carries write scopes (`admin`: relay thresholds, `negotiator`: remember /
forget, `ops`: the cluster assignment) and may be bound to users. A request without a valid
token gets 401; one whose token lacks the scope or may not act for the route's user gets 403
(`authenticated`, `permit`). Views subclass `ApiView`; each API area is one Faust blueprint in
streams/api/ (memory, sessions, graphs, analytics, dashboard, health), registered on the worker's
app by the composition root (`streams.composition.register_all`). A blueprint's views are created once
per app and reach that worker's `Runtime` through it (`runtime_of`, `ApiView.runtime`): its
tables, its settings and its token table.

Routing (one path for every view, `ApiView.answer_at_owner`): the worker that owns a key's
partition is found by the runtime's router (streams/runtime/web.py `PartitionRouter`). When no owner is known (before the first assignment, during a rebalance) or the owner cannot
be reached, the answer is 503 with `Retry-After: RETRY_AFTER_S`; a forwarded request that
arrives at a worker which does not own the key either (ownership moved in between) is not
forwarded again: 503 + Retry-After. An unexpected exception in a view is logged and answered
with an empty 500.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import aiohttp.web
import orjson
from faust.web import Request, Response, View

from streams.core.ingest import REDACTED_CONTENT
from streams.core.vocabulary import SENSITIVITY_LEVELS, sensitivity_rank

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

log = logging.getLogger("memstream.http")

RETRY_AFTER_S = 1  #: seconds a 503 asks the client to wait (`Retry-After`)
FORWARD_TIMEOUT_S = 40.0  #: a forwarded request's limit (the negotiator view waits up to 30 s)
FORWARDED_HEADER = "X-Memstream-Forwarded"  #: set on a forwarded request: never forwarded twice
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class AuthError(Exception):
    """No or unknown bearer token."""


class BadRequest(Exception):
    """The request's body or parameters are wrong (400)."""


class BodyTimeout(Exception):
    """The request body did not arrive within the read timeout (408)."""


class BodyTooLarge(Exception):
    """The request body is over MEMSTREAM_HTTP_MAX_BODY_BYTES (413)."""


#: Write scopes a token may carry (reading is governed by its sensitivity level alone).
SCOPE_ADMIN = "admin"  #: change a user's relay threshold (releases content to sync peers)
SCOPE_NEGOTIATOR = "negotiator"  #: negotiator remember / forget
SCOPE_OPS = "ops"  #: read the cluster's partition assignment (worker URLs)
SCOPES: tuple[str, ...] = (SCOPE_ADMIN, SCOPE_NEGOTIATOR, SCOPE_OPS)


class Forbidden(Exception):
    """A valid token that may not do this (missing scope, another tenant's user): 403."""


@dataclass(frozen=True)
class Token:
    """What one bearer token may do. `name` identifies it in logs and the security audit (never
    the secret); `users` None = every user, else patterns: an exact user id or a prefix ending
    in `*`."""

    name: str
    level: str
    scopes: frozenset[str] = frozenset()
    users: tuple[str, ...] | None = None

    @property
    def bound(self) -> bool:
        return self.users is not None

    def may_access(self, user_id: str) -> bool:
        if self.users is None:
            return True
        return any(user_id.startswith(p[:-1]) if p.endswith("*") else user_id == p for p in self.users)


def _settings_error(message: str) -> Exception:
    from streams.settings import SettingsError

    return SettingsError(message)


def _token(secret: str, level: Any, scopes: Any, users: Any, name: Any, where: str) -> tuple[str, Token]:
    if not isinstance(secret, str) or not secret or any(c.isspace() for c in secret):
        raise _settings_error(f"MEMSTREAM_API_TOKENS {where}: the token must be a non-empty string without spaces")
    if level not in SENSITIVITY_LEVELS:
        raise _settings_error(f"MEMSTREAM_API_TOKENS {where}: level {level!r} is not one of {', '.join(SENSITIVITY_LEVELS)}")
    scopes = frozenset(scopes or ())
    if unknown := scopes - set(SCOPES):
        raise _settings_error(f"MEMSTREAM_API_TOKENS {where}: unknown scope(s) {', '.join(sorted(unknown))} "
                              f"(scopes: {', '.join(SCOPES)})")
    if users is not None:
        users = tuple(users)
        if not users or not all(isinstance(u, str) and (u == "*" or (u.rstrip("*") and "*" not in u[:-1])) for u in users):
            raise _settings_error(f"MEMSTREAM_API_TOKENS {where}: users must be user ids or prefixes ending in * "
                                  "(`users=*` or no users field = every user)")
        if "*" in users:
            users = None
    if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._@-]{1,64}", name)):
        raise _settings_error(f"MEMSTREAM_API_TOKENS {where}: name must be 1-64 of [A-Za-z0-9._@-]")
    return secret, Token(name=name or where.replace(" ", ""), level=level, scopes=scopes, users=users)


def parse_tokens(spec: str) -> dict[str, Token]:
    """MEMSTREAM_API_TOKENS → {secret: Token}; a bad entry is a settings error.

    Compact form, entries separated by `,`::

        secret:level[:scope+scope][:name=<name>][:users=<id>|<prefix>*|...]

    (`users=` last: user ids may contain `:`). The earlier `secret:level` keeps working and means
    what it meant for reading: no write scope, every user. JSON form (for secrets with `,` or
    `:`): a list of `{"token", "level", "scopes"?, "users"?, "name"?}`. A token without a name
    is called `token#<n>` (its position) in logs and audit records."""
    spec = spec.strip()
    tokens: dict[str, Token] = {}
    if spec.startswith("["):
        try:
            entries = orjson.loads(spec)
        except orjson.JSONDecodeError as exc:
            raise _settings_error(f"MEMSTREAM_API_TOKENS is not valid JSON: {exc}") from None
        for i, e in enumerate(entries, 1):
            if not isinstance(e, dict) or set(e) - {"token", "level", "scopes", "users", "name"}:
                raise _settings_error(f"MEMSTREAM_API_TOKENS token#{i}: an object with token, level, "
                                      "scopes?, users?, name?")
            secret, tok = _token(e.get("token"), e.get("level"), e.get("scopes"), e.get("users"), e.get("name"),  # type: ignore[arg-type]
                                 f"token#{i}")
            tokens[secret] = tok
        return _unique_names(tokens)
    for i, entry in enumerate(filter(None, (e.strip() for e in spec.split(","))), 1):
        users = None
        if ":users=" in entry:
            entry, _, users_spec = entry.partition(":users=")
            users = users_spec.split("|")
        fields_ = entry.split(":")
        scopes: set[str] = set()
        name = None
        while len(fields_) > 2:
            last = fields_[-1]
            if last.startswith("name="):
                name = last[len("name="):]
            elif last and all(p in SCOPES for p in last.split("+")):
                scopes |= set(last.split("+"))
            else:
                break
            fields_.pop()
        if len(fields_) < 2:
            raise _settings_error(f"MEMSTREAM_API_TOKENS entry token#{i} must be "
                                  "token:level[:scope+scope][:name=n][:users=a|prefix*]")
        secret, tok = _token(":".join(fields_[:-1]), fields_[-1], scopes, users, name, f"token#{i}")
        tokens[secret] = tok
    return _unique_names(tokens)


def _unique_names(tokens: dict[str, Token]) -> dict[str, Token]:
    names = [t.name for t in tokens.values()]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise _settings_error(f"MEMSTREAM_API_TOKENS: token names must be unique ({', '.join(dup)})")
    return tokens


def authorize(headers: Mapping[str, str], tokens: Mapping[str, Token]) -> Token:
    """The token the request's bearer token is; raises AuthError."""
    auth = headers.get("Authorization", "")
    scheme, _, secret = auth.partition(" ")
    if scheme.lower() != "bearer" or not secret:
        raise AuthError("missing bearer token: send `Authorization: Bearer <token>` (tokens: MEMSTREAM_API_TOKENS)")
    token = tokens.get(secret.strip())
    if token is None:
        raise AuthError("unknown bearer token")
    return token


def permit(token: Token, *, scope: str | None, user: str | None) -> None:
    """Raise Forbidden unless `token` carries `scope` (when one is needed) and may act for `user`
    (a route keyed by a user); a route with no user (sessions, graphs, fleet-wide views) needs a
    token bound to no users: its answer is not one tenant's."""
    if scope is not None and scope not in token.scopes:
        raise Forbidden(f"this token lacks the `{scope}` scope")
    if user is None:
        if token.bound:
            raise Forbidden("this token is bound to users; this route is not one user's")
    elif not token.may_access(user):
        raise Forbidden("this token may not act for this user")


def visible(sensitivity: Any, allowed: str) -> bool:
    """Whether content of `sensitivity` may be shown to a caller allowed `allowed`; an unknown or
    missing sensitivity is above every level (fail closed)."""
    return sensitivity in SENSITIVITY_LEVELS and sensitivity_rank(sensitivity) <= sensitivity_rank(allowed)


def mask_node(node: Mapping[str, Any], allowed: str) -> dict[str, Any]:
    """A node as the caller may see it: content above `allowed` is "[REDACTED]", and so is every
    value derived from it (the content fingerprint: an unsalted hash of a short fact is guessed
    offline); the embedding is never returned."""
    out = dict(node)
    out.pop("embedding", None)
    if not visible(node.get("sensitivity"), allowed):
        out["content"] = REDACTED_CONTENT
        out["redacted"] = True
        out["content_fingerprint"] = None
    return out


def parse_ms(query: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """A Unix-milliseconds query parameter: an integer in [0, 2^63); else BadRequest (400)."""
    raw = query.get(name)
    if raw is None:
        return default
    if len(raw) > 20 or not raw.isascii() or not raw.isdigit():
        raise BadRequest(f"{name} must be Unix milliseconds (0 <= {name} < 2^63)")
    value = int(raw)
    if value >= 2**63:
        raise BadRequest(f"{name} must be Unix milliseconds (0 <= {name} < 2^63)")
    return value


_BODY_KEY = aiohttp.web.RequestKey("memstream.body", bytes)  #: where `ApiView.read_body` keeps the body it read


def _too_large(what: str, cap: int) -> str:
    return f"{what} is over the {cap}-byte limit of a request body (MEMSTREAM_HTTP_MAX_BODY_BYTES)"


def json_body(data: Any) -> bytes:
    return orjson.dumps(data)


_TOKENS: weakref.WeakKeyDictionary[Runtime, dict[str, Token]] = weakref.WeakKeyDictionary()


def tokens_of(rt: Runtime) -> dict[str, Token]:
    """The bearer tokens of `rt`'s settings (MEMSTREAM_API_TOKENS), parsed once per Runtime: the
    composition root calls it at start-up, so a bad token spec stops the worker there."""
    tokens = _TOKENS.get(rt)
    if tokens is None:
        tokens = _TOKENS[rt] = parse_tokens(rt.settings.api_tokens)
    return tokens


def attached(app: Any, name: str, what: str) -> Any:
    """What the worker set on its app as `name` for its views (the Runtime, an agent's state);
    LookupError naming `what` and the function that attaches it when nothing is there."""
    value = getattr(app, name, None)
    if value is None:
        raise LookupError(f"{what} is not attached to {app!r} (app.{name})")
    return value


def runtime_of(app: Any) -> Runtime:
    """The `Runtime` of the worker whose app serves a view (it sets itself on its app)."""
    return attached(app, "memstream_runtime", "no memstream Runtime (not a worker's app)")


class ApiView(View):
    """A Faust view answering JSON, checking bearer tokens against its worker's token table.

    Its names do not reuse Faust's: `View.route` (add a route to the web server) and
    `View.error` (a JSON error answer) keep their meaning; ours are `answer_at_owner` and
    `problem`. The one Faust method it overrides, `dispatch`, keeps its meaning (it calls
    Faust's and turns an unexpected exception into an empty 500): tests/api/test_views.py."""

    @property
    def runtime(self) -> Runtime:
        """This worker's Runtime (tables, settings, tokens)."""
        return runtime_of(self.app)

    @property
    def tokens(self) -> Mapping[str, Token]:
        """This worker's bearer tokens (MEMSTREAM_API_TOKENS, parsed once per Runtime)."""
        return tokens_of(self.runtime)

    @property
    def read_timeout_s(self) -> float:
        return self.runtime.settings.http_read_timeout_s

    @property
    def max_body_bytes(self) -> int:
        return self.runtime.settings.http_max_body_bytes

    def reply(self, data: Any, status: int = 200) -> Response:
        return self.bytes(json_body(data), content_type="application/json", status=status)

    def problem(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
        """A JSON `{"error": message}` answer with a 4xx/5xx `status`."""
        return self.bytes(json_body({"error": message}), content_type="application/json", status=status,
                          headers=dict(headers) if headers else None)

    def unavailable(self, message: str) -> Response:
        """503 with `Retry-After`: the answer exists, just not here and now (clients retry)."""
        return self.problem(503, message, {"Retry-After": str(RETRY_AFTER_S)})

    async def dispatch(self, request: Any) -> Any:
        """Faust's dispatch, with any unexpected exception of a view logged and answered with an
        empty 500 (aiohttp's default page would name the server's internals)."""
        try:
            return await super().dispatch(request)
        except asyncio.CancelledError:
            raise
        except BodyTimeout as exc:
            return self.problem(408, str(exc))
        except BodyTooLarge as exc:  # the client's mistake, not the worker's: no traceback, no warning
            log.info("%s %s: %s", request.method, request.path, exc)
            return self.problem(413, str(exc), {"Connection": "close"})
        except Exception:  # noqa: BLE001 - the one place a view's bug becomes a 500
            log.exception("%s %s failed", request.method, request.path)
            return self.bytes(b"", status=500)

    def settling(self) -> Response | None:
        """503 while this worker's partitions are moving or being recovered: its local state may
        be incomplete, and the partition may not even be its own any more. Clients retry."""
        app = self.app
        recovery = app.tables.recovery  # type: ignore[attr-defined]  # Faust's TableManager has it, TableManagerT not
        if getattr(app, "rebalancing", False) or recovery.in_recovery or not recovery.completed.is_set():
            return self.unavailable("this worker is rebalancing or recovering its partitions; retry shortly")
        return None

    async def read_body(self, request: Request) -> bytes:
        """The request body, within the read timeout (BodyTimeout: answer 408) and the size limit
        (BodyTooLarge: answer 413). A declared Content-Length over the limit is refused before a
        byte is read; a body without one is read until it passes the limit."""
        cap = self.max_body_bytes
        raw = cast("aiohttp.web.BaseRequest", request)  # Faust's aiohttp driver hands over aiohttp's request
        if (read := raw.get(_BODY_KEY)) is not None:  # read before (forwarding reads it, then the view)
            return read
        declared = raw.content_length
        if declared is not None and declared > cap:
            raise BodyTooLarge(_too_large(f"Content-Length {declared}", cap))

        async def capped() -> bytes:
            chunks, size = [], 0
            async for chunk in raw.content.iter_any():
                size += len(chunk)
                if size > cap:
                    raise BodyTooLarge(_too_large("the body", cap))
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            body = await asyncio.wait_for(capped(), self.read_timeout_s)
        except TimeoutError:
            raise BodyTimeout(f"the request body did not arrive within {self.read_timeout_s:g} s") from None
        raw[_BODY_KEY] = body  # the stream is consumed: a second read gets these bytes
        return body

    async def json_body(self, request: Request) -> dict:
        try:
            data = orjson.loads(await self.read_body(request) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return data

    async def answer_at_owner(self, request: Request, table: Any, key: str,
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
        url = request.url.with_scheme(dest.scheme or "http").with_host(dest.host).with_port(int(dest.port))  # type: ignore[arg-type]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers[FORWARDED_HEADER] = "1"
        try:
            async with self.app.http_client.request(
                    method=request.method, url=url, headers=headers, data=await self.read_body(request),
                    timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as resp:
                body = await resp.read()
                relayed = {k: resp.headers[k] for k in ("Retry-After",) if k in resp.headers}
                return self.bytes(body, content_type=resp.content_type, status=resp.status, headers=relayed or None)
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("forwarding %s %s to %s failed: %r", request.method, request.path, dest, exc)  # type: ignore[attr-defined]
            return self.unavailable(f"the partition owner {dest} did not answer; retry")

    async def row_at_owner(self, request: Request, table_name: str, key: str, what: str,
                           shape: Callable[[Any], Any]) -> Response:
        """The row `key` of this worker's table `table_name`, as `shape` makes it, answered by
        the key's owner (`answer_at_owner`); 404 `no <what> <key>` when there is none."""
        table = self.runtime.tables[table_name]

        async def local() -> Response:
            row = table.get(key)
            if row is None:
                return self.problem(404, f"no {what} {key}")
            return self.reply(shape(row))

        return await self.answer_at_owner(request, table, key, local)

    def caller(self, request: Request) -> Token:
        """The request's token; raises AuthError (answer with `self.problem(401, …)`)."""
        return authorize(request.headers, self.tokens)


#: The path parameters that name the user a route acts for (checked against a token's users).
USER_PARAMS = ("motebit_id", "user_id")


def authenticated(fun: Callable[..., Awaitable[Response]] | None = None, *,
                  scope: str | None = None) -> Any:
    """View-method decorator: 401 without a valid bearer token; 403 when the token lacks `scope`
    or may not act for the route's user (`motebit_id` / `user_id` path parameter; a route with
    neither needs a token bound to no users: `permit`); else the method is called with
    `allowed=` the sensitivity level the token may read (and `token=` when it takes one). A
    request is refused where it arrives (before `ApiView.answer_at_owner` forwards it); a
    forwarded one is checked again. Use as `@authenticated` or `@authenticated(scope=SCOPE_ADMIN)`."""

    def decorate(fun: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        wants_token = "token" in inspect.signature(fun).parameters

        @wraps(fun)
        async def checked(self: ApiView, request: Request, *args: Any, **kwargs: Any) -> Response:
            try:
                token = self.caller(request)
            except AuthError as exc:
                return self.problem(401, str(exc))
            user = next((kwargs[p] for p in USER_PARAMS if p in kwargs), None)
            try:
                permit(token, scope=scope, user=user)
            except Forbidden as exc:
                log.info("%s %s refused to token %s: %s", request.method, request.path, token.name, exc)  # type: ignore[attr-defined]
                return self.problem(403, str(exc))
            if wants_token:
                kwargs["token"] = token
            return await fun(self, request, *args, allowed=token.level, **kwargs)

        checked.memstream_auth = {"scope": scope}  # type: ignore[attr-defined]
        return checked

    return decorate(fun) if fun is not None else decorate
