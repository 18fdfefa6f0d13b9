"""The sessions HTTP API (`blueprint`, area "sessions"): a session's compaction ledger, from the
`session-ledger` table the session-ledger agent keeps (streams/agents/sessions.py). Answered by
the worker that owns the session's partition (`ApiView.row_at_owner`)."""

from __future__ import annotations

from faust.web import Blueprint, Request, Response

from streams.agents.sessions import TABLE
from streams.api.http import ApiView, authenticated
from streams.sessions import lifecycle

blueprint = Blueprint("sessions")


@blueprint.route("/v1/sessions/{session_id}/compactions")
class SessionCompactions(ApiView):
    @authenticated
    async def get(self, request: Request, session_id: str, allowed: str) -> Response:
        return await self.row_at_owner(request, TABLE, session_id, "session", lifecycle.to_record)
