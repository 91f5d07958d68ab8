//! Running roles: bind every listener first, report the bound addresses, then serve until
//! shutdown, then drain. The one owner of long-lived tasks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::mcp::context::RoleContext;
use crate::mcp::server::{Limits, SourceServer};
use crate::mcp::source::DynSource;
use crate::store::Store;
use crate::transport::{self, http, quic, tls};

/// How long shutdown waits for open connections to finish.
pub const GRACE: Duration = Duration::from_secs(5);

/// How long sessions stay open after the last listen returned at shutdown, so its final
/// result reaches the wire.
const FLUSH: Duration = Duration::from_millis(250);

/// Where and how a source is served.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `--http ADDR`.
    pub http: Option<String>,
    /// `--quic ADDR`.
    pub quic: Option<String>,
    /// Serve stdin/stdout too (the default when no listener is given).
    pub stdio: bool,
    pub http_options: http::HttpOptions,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub limits: Limits,
}

/// What a role actually bound.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Bound {
    pub role: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quic: Option<SocketAddr>,
    /// SHA-256 of the QUIC certificate, for clients' `--tls-pin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quic_fingerprint: Option<String>,
    pub stdio: bool,
}

impl Bound {
    /// The HTTP endpoint URL, if serving HTTP.
    pub fn http_url(&self) -> Option<String> {
        self.http.map(|a| format!("http://{a}{}", http::MCP_PATH))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Binds the listeners `opts` asks for and spawns the serving tasks on `ctx`'s tracker (the
/// one its source's helper tasks are on). Stdio, when served, shuts `ctx` down when stdin
/// closes (the client went away).
pub async fn serve_source(
    source: DynSource,
    opts: &ServeOptions,
    store: &Store,
    ctx: &RoleContext,
) -> Result<Bound, AppError> {
    let shutdown = ctx.shutdown();
    let role = source.info().name;
    let server = SourceServer::new(source, opts.limits.clone(), shutdown.clone());
    // Sessions outlive `shutdown` a little: listens answer the shutdown with their final
    // result, and the sessions carrying them close only once those results are out.
    let sessions = CancellationToken::new();
    {
        let (server, shutdown, sessions) = (server.clone(), shutdown.clone(), sessions.clone());
        ctx.spawn("sessions", async move {
            shutdown.cancelled().await;
            let _ = tokio::time::timeout(GRACE, server.listens_drained()).await;
            // The final results pass through rmcp's send loop and the writer task; give them
            // a moment on the wire before the sessions close.
            tokio::time::sleep(FLUSH).await;
            sessions.cancel();
        });
    }
    let mut bound = Bound {
        role: role.clone(),
        ..Bound::default()
    };
    if let Some(addr) = &opts.http {
        let listener = http::bind(addr).await.map_err(|e| AppError::Bind {
            addr: addr.clone(),
            message: e.to_string(),
        })?;
        let local = listener.local_addr().map_err(|e| AppError::Bind {
            addr: addr.clone(),
            message: e.to_string(),
        })?;
        bound.http = Some(local);
        let router = http::router(server.clone(), local, &opts.http_options, sessions.clone());
        ctx.spawn(
            "http",
            http::serve(listener, router, shutdown.clone(), GRACE)
                .instrument(tracing::info_span!("http", role = %role, addr = %local)),
        );
    }
    if let Some(addr) = &opts.quic {
        let sock: SocketAddr = resolve_bind(addr).await?;
        let identity =
            tls::load_identity(store, opts.tls_cert.as_deref(), opts.tls_key.as_deref()).await?;
        bound.quic_fingerprint = Some(identity.fingerprint());
        let endpoint = quic::bind(sock, identity)?;
        let local = endpoint.local_addr().map_err(|e| AppError::Bind {
            addr: addr.clone(),
            message: e.to_string(),
        })?;
        bound.quic = Some(local);
        ctx.spawn(
            "quic",
            quic::serve(endpoint, server.clone(), shutdown.clone(), sessions.clone())
                .instrument(tracing::info_span!("quic", role = %role, addr = %local)),
        );
    }
    if opts.stdio || (opts.http.is_none() && opts.quic.is_none()) {
        bound.stdio = true;
        let shutdown = shutdown.clone();
        let sessions = sessions.clone();
        ctx.spawn("stdio", async move {
            transport::serve_stdio(server, sessions).await;
            // The client closed stdin: nothing is left to serve on stdio.
            shutdown.cancel();
        });
    }
    Ok(bound)
}

async fn resolve_bind(addr: &str) -> Result<SocketAddr, AppError> {
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| AppError::Bind {
            addr: addr.into(),
            message: e.to_string(),
        })?
        .next()
        .ok_or_else(|| AppError::Bind {
            addr: addr.into(),
            message: "resolves to no address".into(),
        })
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
pub fn cancel_on_signals(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = shutdown.cancelled() => return,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutting down");
        shutdown.cancel();
    });
}

/// Shuts `ctx` down and waits for its tasks (listeners and every source's helpers), at most
/// [`GRACE`] plus a second; what is still running then is logged by name.
pub async fn drain(ctx: &RoleContext) {
    let _ = ctx.drain(GRACE + Duration::from_secs(1)).await;
}
