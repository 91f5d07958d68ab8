//! Running roles: bind every listener first, report the bound addresses, then serve until
//! shutdown, then drain. The one owner of long-lived tasks.
//!
//! A runner's life, under systemd or not (`cli/serve.rs` for one role; `herald up` for many):
//!
//! ```text
//! admin::serve_admin(addr, &systemd, &ctx, Some(&store))
//!                                            // optional; /live answers, /ready says "starting"
//! serve_source(source, &opts, &store, &ctx)  // per role: bind, report, serve (opts.http_socket:
//!                                            //   systemd.socket("http") for socket activation)
//! ready(&ctx, &systemd, &[bound, ...])       // READY=1, STATUS=serving ..., the watchdog, /ready
//! ctx.shutdown().cancelled().await
//! stop(&ctx, &systemd)                       // STOPPING=1, STATUS=draining, EXTEND_TIMEOUT_USEC, drain
//! ```
//!
//! Shutdown keeps two tokens apart. `shutdown` (SIGINT, SIGTERM, or stdin closing when stdio is
//! served: the client that started the process has gone) stops the accept loops and ends every
//! listen, which answers with its final result. `sessions` is cancelled later, once no listen runs
//! (at most [`GRACE`]) and `FLUSH` (250 ms) more has let those results reach the wire; it ends the
//! MCP sessions themselves (stdio, HTTP connections, QUIC streams). [`drain`] then waits for the
//! role's tracker at most [`DRAIN`] and names whatever still runs; [`stop`] is the same, told to
//! systemd (`STOPPING=1`, then each second a `STATUS=` and `EXTEND_TIMEOUT_USEC`).
//!
//! [`systemd`] is the notify socket and socket activation; [`admin`] the admin address;
//! [`console`] what the process prints outside the protocol (stdout, and colour on stderr).

pub mod admin;
pub mod console;
pub mod reload;
mod status_stream;
pub mod systemd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::app::systemd::{Inherited, Notify, Systemd};
use crate::mcp::limits::Limits;
use crate::mcp::server::SourceServer;
use crate::mcp::source::DynSource;
use crate::runtime::context::RoleContext;
use crate::store::Store;
use crate::transport::{self, http, quic, tls};

/// How long shutdown waits for open connections to finish.
pub const GRACE: Duration = Duration::from_secs(5);

/// The longest [`drain`] and [`stop`] wait for a role's tasks.
pub const DRAIN: Duration = Duration::from_secs(6);

/// Slack given to systemd beyond what the drain has left: the runtime's own shutdown
/// (at most a second) and the exit.
const EXTEND_MARGIN: Duration = Duration::from_secs(3);

/// How long sessions stay open after the last listen returned at shutdown, so its final
/// result reaches the wire.
const FLUSH: Duration = Duration::from_millis(250);

/// Where and how a source is served.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `--http ADDR`.
    pub http: Option<String>,
    /// A listening socket systemd passed for HTTP (socket activation): served instead of
    /// binding `http`, which it implies.
    pub http_socket: Option<Inherited>,
    /// `--quic ADDR`.
    pub quic: Option<String>,
    /// Serve stdin/stdout too (the default when no listener is given).
    pub stdio: bool,
    /// Never fall back to stdin/stdout when no listener is given (`herald up`, whose stdout
    /// carries notices and whose stdin under systemd is `/dev/null`).
    pub no_stdio_fallback: bool,
    pub http_options: http::HttpOptions,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub limits: Limits,
    /// Webhook subscriptions (`events/subscribe`): on when `HERALD_EVENTS_KEY` is set.
    pub events: crate::hooks::EventsOptions,
    /// Keep the webhook subscriptions in this NATS bucket, shared by the processes on it (a
    /// gateway's `--backend`), instead of the store.
    pub hooks_bucket: Option<async_nats::jetstream::kv::Store>,
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
    /// The process's admin address, when the runner serves one (reported with its role).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<SocketAddr>,
}

impl Bound {
    /// The HTTP endpoint URL, if serving HTTP.
    pub fn http_url(&self) -> Option<String> {
        self.http.map(|a| format!("http://{a}{}", http::MCP_PATH))
    }

    /// Where the role serves: `http://…/mcp`, `quic://…`, `stdio`.
    pub fn endpoints(&self) -> Vec<String> {
        let mut out: Vec<String> = self.http_url().into_iter().collect();
        out.extend(self.quic.map(|q| format!("quic://{q}")));
        if self.stdio {
            out.push("stdio".into());
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("{0}")]
    Config(String),
}

/// Why a bind failed, with what to do about a busy port.
fn bind_message(e: &std::io::Error, flag: &str) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "the port is in use (another herald, or another program); pick another with {flag} ADDR"
        ),
        std::io::ErrorKind::PermissionDenied => {
            format!(
                "permission denied (ports below 1024 need privileges); pick another with {flag} ADDR"
            )
        }
        _ => format!("{e} ({flag})"),
    }
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
    let status = ctx.status();
    status.role_starting(&role);
    status.set_store(match store.location() {
        crate::store::Location::File(p) => Some(p.clone()),
        crate::store::Location::Memory => None,
    });
    // The tasks extension on every role: its tasks are kept in the role's store under its name
    // (a gateway relays the tasks its upstreams run, and keeps none).
    let tasks = match source.task_relay() {
        Some(_) => None,
        None => Some(crate::mcp::tasks::Tasks::open(ctx, Some(store.clone()), &role).await),
    };
    let server = SourceServer::with_tasks(source, opts.limits.clone(), shutdown.clone(), tasks);
    if let Some(settings) = opts.events.settings(&role).map_err(AppError::Config)? {
        let hooks = crate::hooks::Hooks::start(
            &server,
            settings,
            store.clone(),
            opts.hooks_bucket.clone(),
            ctx.clone(),
        )
        .await
        .map_err(AppError::Config)?;
        server.serve_webhooks(std::sync::Arc::new(hooks));
    }
    let listens = server.listen_count();
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
    let http_listener = match (&opts.http_socket, &opts.http) {
        (Some(inherited), addr) => {
            let std = inherited.take_tcp().map_err(|message| AppError::Bind {
                addr: inherited.to_string(),
                message,
            })?;
            if let Some(addr) = addr {
                tracing::info!(role = %role, %addr, socket = ?inherited,
                    "serving HTTP on the socket systemd passed instead of binding --http");
            }
            let listener = http::from_std(std).map_err(|e| AppError::Bind {
                addr: inherited.to_string(),
                message: e.to_string(),
            })?;
            Some((inherited.to_string(), listener))
        }
        (None, Some(addr)) => {
            let listener = http::bind(addr).await.map_err(|e| AppError::Bind {
                addr: addr.clone(),
                message: bind_message(&e, "--http"),
            })?;
            Some((addr.clone(), listener))
        }
        (None, None) => None,
    };
    if let Some((addr, listener)) = http_listener {
        let local = listener.local_addr().map_err(|e| AppError::Bind {
            addr: addr.clone(),
            message: e.to_string(),
        })?;
        bound.http = Some(local);
        let router = http::router(
            server.clone(),
            local,
            &opts.http_options,
            sessions.clone(),
            ctx.metrics(),
        );
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
        let endpoint =
            quic::bind(sock, quic::server_config(identity)?).map_err(|e| AppError::Bind {
                addr: addr.clone(),
                message: bind_message(&e, "--quic"),
            })?;
        let local = endpoint.local_addr().map_err(|e| AppError::Bind {
            addr: addr.clone(),
            message: e.to_string(),
        })?;
        bound.quic = Some(local);
        ctx.spawn(
            "quic",
            quic::serve(
                endpoint,
                server.clone(),
                shutdown.clone(),
                sessions.clone(),
                ctx.metrics().clone(),
            )
            .instrument(tracing::info_span!("quic", role = %role, addr = %local)),
        );
    }
    if opts.stdio || (bound.http.is_none() && opts.quic.is_none() && !opts.no_stdio_fallback) {
        bound.stdio = true;
        let shutdown = shutdown.clone();
        let sessions = sessions.clone();
        ctx.spawn("stdio", async move {
            transport::serve_stdio(server, sessions).await;
            // The client closed stdin: nothing is left to serve on stdio.
            shutdown.cancel();
        });
    }
    status.role_serving(&role, bound.endpoints(), Some(listens));
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

/// Cancels `shutdown` on SIGINT or SIGTERM. The handlers are in place when this returns (a
/// signal right after it is never the default action that kills the process).
pub fn cancel_on_signals(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!("cannot take SIGTERM and SIGINT: they end herald without a drain");
            return;
        };
        tokio::spawn(async move {
            let signalled = tokio::select! {
                _ = int.recv() => true,
                _ = term.recv() => true,
                _ = shutdown.cancelled() => false,
            };
            if signalled {
                tracing::info!("shutting down (a second Ctrl-C or SIGTERM ends herald at once)");
                shutdown.cancel();
            }
            // Draining; the first signal asked for it (or, when the shutdown came from
            // elsewhere, the next one does nothing more). One more signal: the person means it.
            for _ in 0..(if signalled { 1 } else { 2 }) {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            tracing::warn!("second signal: exiting without finishing the drain");
            std::process::exit(130);
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = shutdown.cancelled() => return,
        }
        tracing::info!("shutting down");
        shutdown.cancel();
    });
}

/// Shuts `ctx` down and waits for its tasks (listeners and every source's helpers), at most
/// [`GRACE`] plus a second; what is still running then is logged by name. Tells systemd
/// nothing: a runner that said [`ready`] ends with [`stop`].
pub async fn drain(ctx: &RoleContext) {
    let _ = ctx.drain(DRAIN).await;
}

/// The runner has started every role: `bound` is what each one bound (every listener is
/// bound and its serving tasks run). Sends systemd `READY=1` with a `STATUS=` line naming
/// the roles and their endpoints, starts the watchdog pings when systemd asked for them, and
/// lets the admin address's `/ready` answer 200 (once every configured upstream has connected
/// once). Call it once, after the last [`serve_source`] (and anything else that must run before
/// the service counts as started).
pub async fn ready(ctx: &RoleContext, systemd: &Systemd, bound: &[Bound]) {
    ctx.status().set_started();
    let status = serving_status(bound);
    systemd
        .notify(&[Notify::Ready, Notify::Status(&status)])
        .await;
    if let Some(interval) = systemd.watchdog() {
        watchdog(ctx, systemd.clone(), interval);
    }
}

/// `serving memo on http://…/mcp, quic://…; file on …; admin on http://…`.
pub fn serving_status(bound: &[Bound]) -> String {
    let mut parts: Vec<String> = bound
        .iter()
        .map(|b| match b.endpoints() {
            e if e.is_empty() => b.role.clone(),
            e => format!("{} on {}", b.role, e.join(", ")),
        })
        .collect();
    if let Some(a) = bound.iter().find_map(|b| b.admin) {
        parts.push(format!("admin on http://{a}"));
    }
    format!("serving {}", parts.join("; "))
}

/// Pings systemd's watchdog every half of `interval` (`WatchdogSec=`), from a task on `ctx`
/// that ends at shutdown. The ping proves what systemd cannot see from outside: that the
/// runtime's timer fires and a worker still runs tasks. A runtime whose workers are all
/// blocked or spinning stops pinging, and systemd restarts the service.
fn watchdog(ctx: &RoleContext, systemd: Systemd, interval: Duration) {
    let shutdown = ctx.shutdown().clone();
    ctx.spawn("watchdog", async move {
        let mut tick = tokio::time::interval(interval / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => systemd.notify(&[Notify::Watchdog]).await,
            }
        }
    });
}

/// [`drain`], told to systemd: `STOPPING=1` and `STATUS=draining` at once, then every second
/// while the drain lasts a `STATUS=` naming what it still waits for and an
/// `EXTEND_TIMEOUT_USEC` covering what is left of the drain's deadline (so a unit with a short
/// `TimeoutStopSec=` does not kill a drain that is still finishing; systemd only ever extends
/// its timeout with it).
pub async fn stop(ctx: &RoleContext, systemd: &Systemd) {
    let start = tokio::time::Instant::now();
    let left = |now: tokio::time::Instant| DRAIN.saturating_sub(now - start) + EXTEND_MARGIN;
    systemd
        .notify(&[
            Notify::Stopping,
            Notify::Status("draining"),
            Notify::ExtendTimeout(left(start)),
        ])
        .await;
    let drain = ctx.drain(DRAIN);
    tokio::pin!(drain);
    let mut tick = tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut drain => return,
            now = tick.tick() => {
                let waiting: Vec<String> = ctx.running().into_iter().map(|(n, _)| n).collect();
                let status = format!("draining: waiting for {}", waiting.join(", "));
                systemd
                    .notify(&[Notify::Status(&status), Notify::ExtendTimeout(left(now))])
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::net::UnixDatagram;

    use crate::app::systemd::tests::recv;

    #[tokio::test]
    async fn ready_starts_a_tracked_watchdog_that_stop_ends() {
        let dir = std::env::temp_dir().join(format!("herald-app-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        let systemd =
            Systemd::notifying(Some(path.as_os_str())).with_watchdog(Duration::from_millis(100));
        let ctx = RoleContext::new("memo");
        let bound = Bound {
            role: "memo".into(),
            http: Some("127.0.0.1:8750".parse().unwrap()),
            stdio: true,
            admin: Some("127.0.0.1:8759".parse().unwrap()),
            ..Bound::default()
        };
        ready(
            &ctx,
            &systemd,
            &[
                bound,
                Bound {
                    role: "watch".into(),
                    ..Bound::default()
                },
            ],
        )
        .await;
        assert_eq!(
            recv(&sock).await,
            "READY=1\nSTATUS=serving memo on http://127.0.0.1:8750/mcp, stdio; watch; \
             admin on http://127.0.0.1:8759\n"
        );
        assert_eq!(recv(&sock).await, "WATCHDOG=1\n");
        assert_eq!(recv(&sock).await, "WATCHDOG=1\n");
        assert_eq!(ctx.running(), vec![("memo/watchdog".to_owned(), 1)]);
        assert!(
            ctx.status().readiness().ready,
            "ready() marks the start done"
        );

        stop(&ctx, &systemd).await;
        let mut last = recv(&sock).await;
        while last == "WATCHDOG=1\n" {
            last = recv(&sock).await; // a ping already on its way
        }
        assert_eq!(
            last,
            "STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC=9000000\n"
        );
        assert!(
            ctx.running().is_empty(),
            "the watchdog ended with the drain"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
