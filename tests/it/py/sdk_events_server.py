"""A foreign MCP server for herald's tests: the official Python SDK (`mcp`) with the PyPI
package `mcp-webhook-events` giving it MCP Events by webhook (no poll, no stream), as servers
built for ChatGPT have them. Its tool `publish` publishes one `ticket.updated` event and
delivers what is due at once.

Usage: python sdk_events_server.py PORT STORE_FILE [poll] (PORT 0: any; prints "listening PORT"
once bound).
Callbacks to http://127.0.0.1 are allowed (`allow_insecure_for_tests`): the test's gateway
receives on loopback."""

import socket
import sys

import anyio
import uvicorn
from mcp.server import MCPServer
from mcp_webhook_events import EventDefinition, McpEvents
from mcp_webhook_events import SafeHttp

port, store = int(sys.argv[1]), sys.argv[2]
mcp = MCPServer("tickets")
events = McpEvents(
    mcp,
    store=store,
    http=SafeHttp(allow_insecure_for_tests=True),
    definitions=[
        EventDefinition(
            name="ticket.updated",
            description="A support ticket you are watching was updated.",
            input_schema={"type": "object", "properties": {"ticket_id": {"type": "string"}},
                          "required": ["ticket_id"], "additionalProperties": False},
            payload_schema={"type": "object",
                            "properties": {"ticket_id": {"type": "string"},
                                           "summary": {"type": "string"}},
                            "required": ["ticket_id", "summary"],
                            "additionalProperties": False},
        )
    ],
)
events.install()

# With a third argument `poll`, it also answers `events/poll` from an in-memory log of what
# `publish` published (no long poll: it answers at once), the way a server with poll delivery
# but no push does.
LOG: list[dict] = []
if len(sys.argv) > 3 and sys.argv[3] == "poll":
    from mcp_types import RequestParams
    from pydantic import ConfigDict

    class AnyParams(RequestParams):
        model_config = ConfigDict(extra="allow")

    async def poll(ctx, params):
        raw = params.model_dump(by_alias=True, exclude_none=False) if params is not None else {}
        wanted = (raw.get("arguments") or {}).get("ticket_id")
        cursor = raw.get("cursor")
        start = int(cursor) if cursor else len(LOG)
        mine = [e for e in LOG[start:] if wanted in (None, e["data"]["ticket_id"])]
        return {"events": mine, "cursor": str(len(LOG)), "truncated": False,
                "hasMore": False, "nextPollMs": 200}

    low = getattr(mcp, "_lowlevel_server", None) or getattr(mcp, "_mcp_server", mcp)
    low.add_request_handler("events/poll", AnyParams, poll)


@mcp.tool()
async def publish(ticket_id: str, summary: str) -> dict:
    """Publishes ticket.updated for ticket_id and delivers it now."""
    def go():
        data = {"ticket_id": ticket_id, "summary": summary}
        LOG.append({"eventId": f"evt_log_{len(LOG)}", "name": "ticket.updated",
                    "timestamp": "2026-12-05T00:00:00Z", "data": data})
        queued = events.publish("ticket.updated", data)
        return {"queued": queued, **events.deliver_pending()}
    return await anyio.to_thread.run_sync(go)


@mcp.tool()
def subscriptions() -> dict:
    """The live webhook subscriptions, callback URLs and secrets included (for the test)."""
    return {"subscriptions": events.active_subscriptions()}


app = mcp.streamable_http_app(stateless_http=True, json_response=True)
# Bound before anything is printed: a client that reads the port finds it listening.
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sock.listen(64)
print(f"listening {sock.getsockname()[1]}", flush=True)
uvicorn.run(app, fd=sock.fileno(), log_level="warning")
