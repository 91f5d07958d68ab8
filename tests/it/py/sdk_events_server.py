"""A foreign MCP server for herald's tests: the official Python SDK (`mcp`) with the PyPI
package `mcp-webhook-events` giving it MCP Events by webhook (no poll, no stream), as servers
built for ChatGPT have them. Its tool `publish` publishes one `ticket.updated` event and
delivers what is due at once.

Usage: python sdk_events_server.py PORT STORE_FILE (PORT 0: any; prints "listening PORT" once
bound).
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


@mcp.tool()
async def publish(ticket_id: str, summary: str) -> dict:
    """Publishes ticket.updated for ticket_id and delivers it now."""
    def go():
        queued = events.publish("ticket.updated", {"ticket_id": ticket_id, "summary": summary})
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
