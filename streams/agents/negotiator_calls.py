"""Negotiator calls over HTTP: a request goes through `negotiator.requests.v1` (the same path as
Kafka clients) and the HTTP handler waits for this worker's memory agent to answer it.

The waiting requests are in-process futures keyed by request id; the agent resolves one when it
has sent the reply (`answered`). A request the agent never answers here (the partition moved)
times out after `TIMEOUT_S`: the client retries with the same requestId (idempotent).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from streams.contracts import catalog

if TYPE_CHECKING:
    from streams.runtime.app import Runtime

TIMEOUT_S = 30.0


class NegotiatorCalls:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.pending: dict[str, asyncio.Future] = {}

    async def call(self, user_id: str, body: dict, op: str) -> dict:
        """Send the request and wait for its reply (asyncio.TimeoutError after TIMEOUT_S)."""
        rt = self.rt
        request_id = str(body.get("requestId") or uuid.uuid4())
        record = {"request_id": request_id, "user_id": user_id, "op": op, "kind": body.get("kind"),
                  "content": body.get("content"), "sessionId": body.get("sessionId"),
                  "memoryId": body.get("memoryId"), "description": body.get("description"),
                  "timestamp": int(time.time() * 1000)}
        waiter = self.pending[request_id] = asyncio.get_running_loop().create_future()
        value = rt.codecs.codec("negotiator_request").encode(record)
        await rt.inputs[catalog.NEGOTIATOR_REQUESTS].send(key=user_id.encode(), value=value)
        try:
            return await asyncio.wait_for(waiter, timeout=TIMEOUT_S)
        finally:
            self.pending.pop(request_id, None)

    def answered(self, request_id: str, reply: Any) -> None:
        """The memory agent sent `reply` for `request_id`: wake its caller, if it waits here."""
        waiter = self.pending.pop(request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)
