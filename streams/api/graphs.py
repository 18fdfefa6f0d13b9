"""The graphs HTTP API (`blueprint`, area "graphs"): a graph's execution state, from the
`graph-state` table the graph-state agent keeps (streams/agents/graphs.py). Answered by the
worker that owns the graph's partition (`ApiView.row_at_owner`)."""

from __future__ import annotations

from faust.web import Blueprint, Request, Response

from streams.agents.graphs import TABLE
from streams.api.http import ApiView, authenticated
from streams.graphs import state as graph_state

blueprint = Blueprint("graphs")


@blueprint.route("/v1/graphs/{graph_id}")
class GraphView(ApiView):
    @authenticated
    async def get(self, request: Request, graph_id: str, allowed: str) -> Response:
        return await self.row_at_owner(request, TABLE, graph_id, "graph", graph_state.to_record)
