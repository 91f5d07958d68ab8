//! A server in this process, reached like any upstream: each connect is a fresh in-memory
//! pipe with the [`SourceServer`] on one end and an MCP client on the other. `herald up` puts
//! its roles behind its gateway this way (no socket, no port), and its watch client reaches
//! the gateway the same way. Connections opened here are local callers (as the stdio parent
//! is): the gateway in front has already decided what its own caller may use.

use std::sync::Arc;

use super::{Dialer, Upstream, UpstreamConfig};
use crate::mcp::server::SourceServer;
use crate::runtime::context::RoleContext;
use crate::transport::client::{Tap, connect_stream_tapped};
use crate::transport::target::Target;

/// Bytes buffered in each direction of a pipe.
const PIPE: usize = 1 << 16;

/// Connects to `server` over in-memory pipes; the served side runs on `ctx` and ends at its
/// shutdown. `name` names it in messages.
pub fn dialer(
    server: SourceServer,
    name: &str,
    ctx: &RoleContext,
    max_message_bytes: usize,
) -> Dialer {
    let name = name.to_owned();
    let ctx = ctx.clone();
    Arc::new(move |relay| {
        let server = server.clone();
        let ctx = ctx.clone();
        let name = name.clone();
        Box::pin(async move {
            let (client, served) = tokio::io::duplex(PIPE);
            let (sr, sw) = tokio::io::split(served);
            let service = server.for_connection();
            let ct = ctx.shutdown().child_token();
            ctx.spawn("in-process connection", async move {
                let _ = crate::transport::lines::serve(service, sr, sw, ct).await;
            });
            let (cr, cw) = tokio::io::split(client);
            {
                let tap: Arc<dyn Tap> = Arc::new(relay.clone());
                connect_stream_tapped(
                    Target::Stdio(name),
                    cr,
                    cw,
                    relay,
                    max_message_bytes,
                    Some(tap),
                )
                .await
            }
        })
    })
}

/// An upstream for `server`, in this process: its connections are [`dialer`]'s pipes, and
/// its plain calls and reads go to the server directly ([`Upstream::in_process`]).
pub fn upstream(cfg: UpstreamConfig, server: SourceServer, ctx: &RoleContext) -> Upstream {
    let max = cfg.max_message_bytes;
    let name = cfg.name.clone();
    Upstream {
        in_process: Some(server.clone()),
        ..Upstream::dialing(cfg, dialer(server, &name, ctx, max))
    }
}
