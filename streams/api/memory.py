"""The memory HTTP API (`blueprint`, area "memory"): a user's nodes, one node, the relay
threshold, erasure, negotiator tools.

Reads are answered by the worker that owns the user's partition (`ApiView.answer_at_owner`
forwards); writes are Kafka records any worker can accept (`PUT .../threshold` through the
relay-policy topic, erasure and negotiator requests through their input topics). The views read
and send through the worker's memory agent (`MemoryAgent`: its store, relay-policy topic and
negotiator calls), which the composition root hands to the app with `attach`.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from faust.web import Blueprint, Request, Response

from streams.agents import relay_policy
from streams.agents.memory_store import UserContained
from streams.api.http import (
    SCOPE_ADMIN,
    SCOPE_NEGOTIATOR,
    ApiView,
    BadRequest,
    Token,
    attached,
    authenticated,
    mask_node,
    parse_ms,
    visible,
)
from streams.contracts import catalog
from streams.core.erasure import erase_request
from streams.core.ingest import REDACTED_CONTENT
from streams.core.limits import LimitExceeded, check_id
from streams.core.negotiator import forget_result_of
from streams.core.redaction import threshold_for
from streams.core.state import MissingHistory
from streams.core.vocabulary import SENSITIVITY_LEVELS
from streams.runtime.topology import Producer

if TYPE_CHECKING:
    from streams.agents.memory import MemoryAgent

log = logging.getLogger("memstream.memory")

NEGOTIATOR_SENSITIVITY = "secret"  #: the level negotiator memories are shown at (they carry none)
PRODUCER = Producer(
    "memory HTTP API", __name__,
    "Writes are records any worker accepts: erasure and negotiator requests (streams/agents/negotiator_calls.py), "
    "relay-threshold changes.",
    sinks=(catalog.ERASE_REQUESTS, catalog.NEGOTIATOR_REQUESTS),
    internal_sinks=(relay_policy.TOPIC,),
)


blueprint = Blueprint("memory")


def attach(app: Any, agent: MemoryAgent) -> None:
    """Give `app`'s memory views the worker's memory agent to read and send through."""
    app.memstream_memory_agent = agent


class MemoryView(ApiView):
    """A view of the memory area."""

    @property
    def agent(self) -> MemoryAgent:
        """The worker's memory agent (`attach`)."""
        return attached(self.app, "memstream_memory_agent", "the memory agent (streams.api.memory.attach)")


@blueprint.route("/v1/memory/{motebit_id}/nodes")
class UserNodes(MemoryView):
    @authenticated
    async def get(self, request: Request, motebit_id: str, allowed: str) -> Response:
        return await self.answer_at_owner(request, self.agent.store.state, motebit_id,
                                          lambda: self._local(request, motebit_id, allowed))

    async def _local(self, request: Request, motebit_id: str, allowed: str) -> Response:
        try:
            um = self.agent.store.user(motebit_id)
        except UserContained as exc:
            return self.unavailable(str(exc))
        try:
            as_of = parse_ms(request.query, "as_of")
        except BadRequest as exc:
            return self.problem(400, str(exc))
        include = set(filter(None, request.query.get("include", "").split(",")))
        try:
            if as_of is not None:
                nodes = um.as_of(as_of)
            elif "superseded" in include:
                nodes = list(um.nodes())
            else:
                nodes = list(um.live_nodes())
        except MissingHistory:  # the user is contained now (StoredHistory.lost): as for unreadable rows
            return self.unavailable(str(self.agent.store.containment(motebit_id)))
        shown = sorted((mask_node(n, allowed) for n in nodes), key=lambda n: (n["valid_from"], n["node_id"]))
        return self.reply({"motebit_id": motebit_id, "as_of": as_of, "nodes": shown})


@blueprint.route("/v1/memory/{motebit_id}/nodes/{node_id}")
class OneNode(MemoryView):
    @authenticated
    async def get(self, request: Request, motebit_id: str, node_id: str, allowed: str) -> Response:
        return await self.answer_at_owner(request, self.agent.store.state, motebit_id,
                                          lambda: self._local(motebit_id, node_id, allowed))

    async def _local(self, motebit_id: str, node_id: str, allowed: str) -> Response:
        try:
            node = self.agent.store.user(motebit_id).node(node_id)
        except UserContained as exc:
            return self.unavailable(str(exc))
        except MissingHistory:  # contained now, as above
            return self.unavailable(str(self.agent.store.containment(motebit_id)))
        if node is None:
            return self.problem(404, f"no node {node_id} for {motebit_id}")
        return self.reply(mask_node(node, allowed))


@blueprint.route("/v1/relay/{motebit_id}/threshold")
class RelayThreshold(MemoryView):
    @authenticated(scope=SCOPE_ADMIN)
    async def put(self, request: Request, motebit_id: str, allowed: str, token: Token) -> Response:
        try:
            level = (await self.json_body(request)).get("threshold")
        except BadRequest as exc:
            return self.problem(400, str(exc))
        if level not in SENSITIVITY_LEVELS:
            return self.problem(400, f"threshold must be one of {', '.join(SENSITIVITY_LEVELS)}")
        change = {"threshold": level, "token": token.name, "requested_at": int(time.time() * 1000),
                  "worker": self.runtime.worker_name}
        await self.agent.policy_topic.send(key=motebit_id.encode(), value=orjson.dumps(change))
        return self.reply({"motebit_id": motebit_id, "threshold": level, "status": "accepted"}, 202)

    @authenticated
    async def get(self, request: Request, motebit_id: str, allowed: str) -> Response:
        return await self.answer_at_owner(request, self.agent.store.relay_policy, motebit_id,
                                          lambda: self._local(motebit_id))

    async def _local(self, motebit_id: str) -> Response:
        level = threshold_for(motebit_id, self.agent.store.relay_policy, self.runtime.settings.relay_threshold)
        return self.reply({"motebit_id": motebit_id, "threshold": level})


@blueprint.route("/v1/memory/{motebit_id}/erase")
class Erase(MemoryView):
    @authenticated(scope=SCOPE_ADMIN)
    async def post(self, request: Request, motebit_id: str, allowed: str, token: Token) -> Response:
        """Queue the erasure of a user (streams/core/erasure.py): 202 with the request id;
        the owner of the user's partition applies it and writes the receipt to
        memory.erase-receipts.v1. Any worker can accept it (it is a Kafka record)."""
        rt = self.runtime
        try:
            body = await self.json_body(request)
            request_id = body.get("requestId")
            if request_id is not None and not isinstance(request_id, str):
                raise BadRequest(f"requestId must be a string, not {type(request_id).__name__}")
            record = erase_request(motebit_id, request_id or str(uuid.uuid4()),
                                   int(time.time() * 1000), token.name, rt.settings.limits())
        except BadRequest as exc:
            return self.problem(400, str(exc))
        except LimitExceeded as exc:
            return self.problem(400, str(exc))
        value = rt.codecs.codec(catalog.topic(catalog.ERASE_REQUESTS).value_schema).encode(record)
        await (await rt.inputs[catalog.ERASE_REQUESTS].send(key=motebit_id.encode(), value=value))
        log.warning("security audit: erasure %s of %s requested by token %s",
                    record["request_id"], motebit_id, token.name)
        return self.reply({"motebit_id": motebit_id, "request_id": record["request_id"], "status": "accepted",
                           "receipt_topic": catalog.ERASE_RECEIPTS}, 202)


def mask_forget(result: dict, allowed: str) -> dict:
    """A forget result as the caller may see it. Negotiator memories carry no sensitivity:
    their content (walk-away prices, disclosure rules) is treated as `secret` (fail closed),
    so a token below `secret` gets ids and kinds with "[REDACTED]" content — an `ambiguous`
    reply is no read oracle for stored rules."""
    if visible(NEGOTIATOR_SENSITIVITY, allowed):
        return result
    def masked(view: dict) -> dict:
        return {**view, "content": REDACTED_CONTENT}
    if result.get("memory"):
        result = {**result, "memory": masked(result["memory"])}
    if result.get("candidates"):
        result = {**result, "candidates": [masked(v) for v in result["candidates"]]}
    return result


class NegotiatorView(MemoryView):
    """`POST /v1/negotiator/{user_id}/<op>`: one negotiator tool call, answered by the agent."""

    op = ""

    @authenticated(scope=SCOPE_NEGOTIATOR)
    async def post(self, request: Request, user_id: str, allowed: str) -> Response:
        limits = self.runtime.settings.limits()
        try:
            body = await self.json_body(request)
            check_id("user_id", user_id, limits)
            if body.get("requestId") is not None:
                check_id("requestId", str(body.get("requestId")), limits)
        except BadRequest as exc:
            return self.problem(400, str(exc))
        except LimitExceeded as exc:
            return self.problem(400, str(exc))
        return await self.answer_at_owner(request, self.agent.store.negotiator, user_id,
                                          lambda: self._local(user_id, body, allowed))

    async def _local(self, user_id: str, body: dict, allowed: str) -> Response:
        try:
            reply = await self.agent.calls.call(user_id, body, self.op)
        except TimeoutError:
            return self.unavailable("no answer within 30s (rebalancing?); retry with the same requestId")
        if reply.get("error"):
            return self.problem(400, reply["error"])
        if self.op == "remember":
            return self.reply(reply["remembered"])  # the stored view, or null: write flag off
        return self.reply(mask_forget(forget_result_of(reply["forget"]), allowed))


@blueprint.route("/v1/negotiator/{user_id}/remember")
class Remember(NegotiatorView):
    op = "remember"


@blueprint.route("/v1/negotiator/{user_id}/forget")
class Forget(NegotiatorView):
    op = "forget"
