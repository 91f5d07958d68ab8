//! A server in this process, reached like any upstream: each connect is a fresh in-memory
//! pipe with the [`SourceServer`] on one end and an MCP client on the other. `herald up` puts
//! its roles behind its gateway this way (no socket, no port), and its watch client reaches
//! the gateway the same way. Connections opened here are local callers (as the stdio parent
//! is): the gateway in front has already decided what its own caller may use.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::relay::Relay;
use super::{Dialer, Upstream, UpstreamConfig};
use crate::mcp::server::SourceServer;
use crate::runtime::backoff::Backoff;
use crate::runtime::context::RoleContext;
use crate::transport::client::{ConnectError, Connection, Tap, connect_stream_tapped};
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
        Box::pin(pipe(
            server.clone(),
            name.clone(),
            ctx.clone(),
            max_message_bytes,
            relay,
        ))
    })
}

/// One connection to `server` over a fresh in-memory pipe.
async fn pipe(
    server: SourceServer,
    name: String,
    ctx: RoleContext,
    max_message_bytes: usize,
    relay: Relay,
) -> Result<Connection<Relay>, ConnectError> {
    let (client, served) = tokio::io::duplex(PIPE);
    let (sr, sw) = tokio::io::split(served);
    let service = server.for_connection();
    let ct = ctx.shutdown().child_token();
    ctx.spawn("in-process connection", async move {
        let _ = crate::transport::lines::serve(service, sr, sw, ct).await;
    });
    let (cr, cw) = tokio::io::split(client);
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

/// An upstream for `server`, in this process: its connections are [`dialer`]'s pipes, and
/// its plain calls and reads go to the server directly ([`Upstream::in_process`]).
pub fn upstream(cfg: UpstreamConfig, server: SourceServer, ctx: &RoleContext) -> Upstream {
    let max = cfg.max_message_bytes;
    let name = cfg.name.clone();
    let up = Upstream::dialing(cfg, dialer(server.clone(), &name, ctx, max));
    let _ = up.in_process.set(server);
    up
}

/// Builds a role's server when it can; `Err` says why it cannot yet (its backend is not
/// reachable).
pub type Build = Arc<dyn Fn() -> BoxFuture<'static, Result<SourceServer, String>> + Send + Sync>;

/// The longest wait between two tries to start a deferred role.
const START_MAX: Duration = Duration::from_secs(30);

/// An upstream for a role in this process that could not start yet: each connect tries
/// `build` again until it gives the server, which from then on is served as
/// [`upstream`]'s. A task on `ctx` connects with backoff (at most [`START_MAX`] apart) until
/// the first connect succeeds, so the role starts without anyone asking; until then it is an
/// upstream never connected, which `/ready` waits for and `/status` lists with why.
pub fn deferred(cfg: UpstreamConfig, build: Build, ctx: &RoleContext) -> Arc<Upstream> {
    let max = cfg.max_message_bytes;
    let name = cfg.name.clone();
    let cell: Arc<std::sync::OnceLock<SourceServer>> = Arc::default();
    let dial: Dialer = {
        let (cell, ctx) = (cell.clone(), ctx.clone());
        Arc::new(move |relay| {
            let (cell, build, ctx, name) = (cell.clone(), build.clone(), ctx.clone(), name.clone());
            Box::pin(async move {
                let server = match cell.get() {
                    Some(s) => s.clone(),
                    // Connects are one at a time (shared by whoever waits), so one build runs.
                    None => {
                        let s = build().await.map_err(|e| ConnectError::Transport {
                            target: name.clone(),
                            message: format!("role {name} cannot start yet: {e}"),
                        })?;
                        tracing::info!(role = %name, "role started");
                        cell.get_or_init(|| s).clone()
                    }
                };
                pipe(server, name, ctx, max, relay).await
            })
        })
    };
    let up = Arc::new(Upstream {
        in_process: cell,
        ..Upstream::dialing(cfg, dial)
    });
    let starter = up.clone();
    let stop = ctx.shutdown().clone();
    ctx.spawn("role start", async move {
        let mut backoff = Backoff::new(Duration::from_secs(1), START_MAX);
        // The first failure was said at start (and each connect's own failure is logged by
        // the upstream): only the tries themselves go to the debug log.
        loop {
            match starter.connect().await {
                Ok(()) => return,
                Err(e) => tracing::debug!(role = %starter.name, error = %e, "role cannot start yet; trying again"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    });
    up
}
