//! Flags shared by every server role (where to listen, TLS, limits, the admin address) and the
//! life of a single-role server under systemd or not: [`serve_until_stopped`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::app::systemd::Notify;
use crate::app::{self, Bound, ServeOptions};
use crate::cli::{ANNOUNCE, Exit, Globals, LogFormat};
use crate::mcp::limits::{
    DEFAULT_LISTEN_STALL_MS, DEFAULT_MAX_CALLER_LISTEN_STREAMS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_EVENT_STREAMS, DEFAULT_MAX_LISTEN_STREAMS, DEFAULT_MAX_LISTEN_URIS,
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_TOTAL_LISTEN_STREAMS, Limits,
};
use crate::runtime::context::RoleContext;
use crate::store::Store;
use crate::transport::http::{
    DEFAULT_BODY_TIMEOUT_MS, DEFAULT_HEADER_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, HttpOptions,
    Timeouts,
};
use crate::transport::listen_addr;

/// Publishing a role's event logs to NATS for gateways on other hosts.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Publishing event logs")]
pub struct PublishArgs {
    /// Publish every event log this role keeps (memo://log, each watch's events) to NATS
    /// JetStream, so a gateway on another host serves them for a [[slug]] with nats = URL,
    /// with no connection to this process: nats://HOST:PORT (comma-separated for a cluster)
    /// [default: off].
    #[arg(long, value_name = "URL")]
    pub publish_events: Option<String>,
    /// The name they are published under (the gateway's [[slug]] nats_source)
    /// [default: the role's name].
    #[arg(long, value_name = "NAME")]
    pub publish_as: Option<String>,
    /// A NATS credentials file (.creds) for --publish-events [default: none].
    #[arg(long, value_name = "FILE")]
    pub publish_creds: Option<std::path::PathBuf>,
    /// A CA certificate (PEM) to verify the NATS servers of --publish-events with; TLS is
    /// then required [default: none].
    #[arg(long, value_name = "FILE")]
    pub publish_tls_ca: Option<std::path::PathBuf>,
    /// Publish in the clear: without it, --publish-events seals every event with the
    /// deployment's HERALD_EVENTS_KEY (or $CREDENTIALS_DIRECTORY/HERALD_EVENTS_KEY), which
    /// every gateway mirroring them holds too, and will not start without that key
    /// [default: off].
    #[arg(long)]
    pub publish_plaintext: bool,
}

impl PublishArgs {
    /// Starts publishing (before the role makes its rings), when asked.
    pub async fn start(
        &self,
        role: &str,
        ctx: &RoleContext,
    ) -> Result<Option<crate::nats::events::PublisherHandle>, Exit> {
        let Some(urls) = self.publish_events.clone() else {
            if self.publish_as.is_some()
                || self.publish_creds.is_some()
                || self.publish_tls_ca.is_some()
                || self.publish_plaintext
            {
                return Err(crate::cli::usage(anyhow::anyhow!(
                    "--publish-as, --publish-creds, --publish-tls-ca and --publish-plaintext go with --publish-events nats://HOST:PORT"
                )));
            }
            return Ok(None);
        };
        let cfg = crate::nats::NatsConfig {
            urls,
            creds: self.publish_creds.clone(),
            nkey: None,
            tls_ca: self.publish_tls_ca.clone(),
            bucket: crate::nats::events::BUCKET.into(),
        };
        let bad = |e: String| {
            crate::cli::usage(anyhow::anyhow!(
                "{}",
                e.replace("--backend", "--publish-events")
                    .replace("--nats-creds", "--publish-creds")
                    .replace("--nats-tls-ca", "--publish-tls-ca")
            ))
        };
        cfg.check().map_err(bad)?;
        let seal = match (self.publish_plaintext, crate::hooks::events_key()) {
            (true, _) => None,
            (false, Ok(Some(key))) => Some(crate::nats::events::Seal::new(&key)),
            (false, Ok(None)) => {
                return Err(crate::cli::usage(anyhow::anyhow!(
                    "--publish-events seals what it publishes with the deployment's HERALD_EVENTS_KEY (32 bytes, base64: make one with `openssl rand -base64 32`), which every gateway mirroring it holds too: set it (or $CREDENTIALS_DIRECTORY/HERALD_EVENTS_KEY), or publish in the clear with --publish-plaintext"
                )));
            }
            (false, Err(e)) => return Err(crate::cli::usage(anyhow::anyhow!("{e}"))),
        };
        let name = self.publish_as.clone().unwrap_or_else(|| role.to_owned());
        crate::nats::events::Publisher::start(&cfg, &name, seal, ctx)
            .await
            .map(Some)
            .map_err(bad)
    }
}

/// Who may use a role served on its own (`herald memo`, `file`, `k8s`, `slack`); a gateway
/// and `herald up` take theirs from their config's `[[token]]` and `[[issuer]]`.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Access")]
pub struct AccessArgs {
    /// A TOML file of [[token]] and [[issuer]] entries, as in a gateway's config, naming the
    /// callers this role's HTTP and QUIC endpoints let in: a token whose slugs name the role
    /// (or "*"), an access token with scope herald:ROLE, herald:* or (for reading alone)
    /// herald:ROLE:read. stdio needs none. Read at start [default: none: whoever reaches the
    /// endpoints may use the role].
    #[arg(long, value_name = "FILE")]
    pub access: Option<PathBuf>,
}

impl AccessArgs {
    /// The access `--access` gives `role`, read and checked (a usage error names what to
    /// change). Without it, a role listening beyond loopback is warned about.
    pub fn load(
        &self,
        role: &str,
        opts: &ServeOptions,
    ) -> Result<Option<crate::auth::guard::RoleAccess>, Exit> {
        let Some(path) = &self.access else {
            let open = [opts.http.as_deref(), opts.quic.as_deref()]
                .into_iter()
                .flatten()
                .filter(|a| !crate::transport::is_loopback(a))
                .collect::<Vec<_>>();
            if !open.is_empty() {
                tracing::warn!(
                    "herald {role} listens on {} with no --access: whoever reaches it may use it; give --access FILE with a [[token]] (or an [[issuer]]), or listen on 127.0.0.1",
                    open.join(" and ")
                );
            }
            return Ok(None);
        };
        crate::auth::guard::RoleAccess::load(path, role)
            .map(Some)
            .map_err(|e| crate::cli::usage(anyhow::anyhow!("{e}")))
    }
}

/// `source` behind `access` when there is one (its issuers' keys then fetched and kept
/// fresh on the runtime, and shown on `ctx`'s status board).
pub fn guarded(
    access: Option<crate::auth::guard::RoleAccess>,
    source: crate::mcp::source::DynSource,
    ctx: &RoleContext,
) -> crate::mcp::source::DynSource {
    match access {
        None => source,
        Some(a) => {
            a.start();
            if let Some(i) = a.issuers() {
                ctx.status().add_issuers(i);
            }
            std::sync::Arc::new(crate::auth::guard::Guarded::new(a, source))
        }
    }
}

/// A role runner's context, with every part's metrics registered up front (the gateway's,
/// the transport's, NATS's, the Slack lease's, in the order `/metrics` has always named
/// them), so every process renders the same series whichever roles it runs. Each part
/// registers its own names; registering again later finds the same counters.
pub fn role_context(role: &str) -> RoleContext {
    let ctx = RoleContext::new(role);
    let metrics = ctx.metrics();
    crate::gateway::source::events_list_failed(metrics);
    crate::gateway::polls::PollMetrics::register(metrics);
    crate::gateway::feeds::FeedMetrics::register(metrics);
    crate::transport::ConnMetrics::register(metrics);
    crate::nats::NatsMetrics::register(metrics);
    crate::source::slack::shared::LeaseMetrics::register(metrics);
    crate::hooks::HookMetrics::register(metrics);
    ctx
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Serve Streamable HTTP on ADDR (e.g. 127.0.0.1:8750; port 0 picks one; "" turns it off).
    /// The endpoint is /mcp [default: off; herald gateway: its config's `http`].
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// Serve MCP over QUIC on ADDR (ALPN `mcp`, one bidirectional stream per connection; ""
    /// turns it off) [default: off; herald gateway: its config's `quic`].
    #[arg(long, value_name = "ADDR")]
    pub quic: Option<String>,
    /// Also serve stdin/stdout (the default when neither --http nor --quic is given) [default:
    /// off].
    #[arg(long)]
    pub stdio: bool,
    /// Serve /live, /ready, /metrics and /status on ADDR, apart from the MCP endpoints (e.g.
    /// 127.0.0.1:8759; port 0 picks one; "" turns it off). No authentication: keep it on loopback
    /// [default: off].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// PEM certificate chain for QUIC. Without it a self-signed identity is made on first start,
    /// kept in the store, and its fingerprint printed [default: none].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert [default: none].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Accept this Host header on HTTP besides loopback names and the bound address (repeatable).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Accept this browser Origin on HTTP besides loopback origins (repeatable), e.g. https://app.example.com:443.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Most open subscriptions/listen streams per connection (stdio, QUIC); on HTTP, per client
    /// address of callers without a token (behind a --trusted-proxy, the client's own).
    #[arg(long, default_value_t = DEFAULT_MAX_LISTEN_STREAMS, value_name = "N")]
    pub max_listen_streams: usize,
    /// Most open listen streams per caller known by its token (a gateway's [[token]]), across
    /// its connections, addresses and transports.
    #[arg(long, default_value_t = DEFAULT_MAX_CALLER_LISTEN_STREAMS, value_name = "N")]
    pub max_caller_listen_streams: usize,
    /// Most open listen streams of the whole server.
    #[arg(long, default_value_t = DEFAULT_MAX_TOTAL_LISTEN_STREAMS, value_name = "N")]
    pub max_total_listen_streams: usize,
    /// A reverse proxy whose X-Forwarded-For names the client's address on HTTP, as
    /// ADDR/BITS or one address (repeatable; `none` trusts no proxy); from any other peer the
    /// header is ignored [default: 127.0.0.0/8 and ::1, a proxy on this host].
    #[arg(long = "trusted-proxy", value_name = "CIDR",
        value_parser = crate::transport::http::budget::trusted_proxy)]
    pub trusted_proxies: Vec<Option<crate::transport::http::budget::Cidr>>,
    /// Most open events/stream streams per connection (on HTTP: per client IP address); they
    /// count against neither --max-listen-streams nor the requests in flight.
    #[arg(long, default_value_t = DEFAULT_MAX_EVENT_STREAMS, value_name = "N")]
    pub max_event_streams: usize,
    /// Let webhook callbacks whose URL starts with PREFIX reach a private address or plain
    /// http (repeatable), e.g. http://127.0.0.1: or https://hooks.internal:8443/. Webhook
    /// subscriptions are on when HERALD_EVENTS_KEY is set.
    #[arg(long = "callback-allow", value_name = "PREFIX")]
    pub callback_allow: Vec<String>,
    /// The error codes of the Events extension: the draft's (-32023…-32027) or the earlier
    /// ones ChatGPT uses (-32011…-32015); over a config's [events] profile [default: draft].
    #[arg(long, value_enum, value_name = "CODES")]
    pub events_profile: Option<crate::hooks::Profile>,
    /// Most resource URIs one listen stream may ask for.
    #[arg(long, default_value_t = DEFAULT_MAX_LISTEN_URIS, value_name = "N")]
    pub max_listen_uris: usize,
    /// Largest incoming message, in bytes (stdio/QUIC line, HTTP body) [default: 4194304 (4
    /// MiB)].
    #[arg(long, default_value_t = DEFAULT_MAX_MESSAGE_BYTES, hide_default_value = true,
        value_name = "BYTES")]
    pub max_message_bytes: usize,
    /// A listen stream whose reader takes no notification for this long is ended (and logged),
    /// so the client resubscribes instead of holding a stalled stream.
    #[arg(long, default_value_t = DEFAULT_LISTEN_STALL_MS, value_name = "MS")]
    pub listen_stall_ms: u64,
    /// Most open connections per server: accepted TCP connections on HTTP, connections on
    /// QUIC. At the cap new connections wait to be accepted until one closes (logged once); on
    /// HTTP fewer when the open-file limit has no room for them.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, value_name = "N",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// An HTTP connection with no request in flight (before its first, or between
    /// keep-alive requests) is closed after this long. A listen stream is a request in flight.
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT_MS, value_name = "MS",
        value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,
    /// An HTTP request's head must arrive whole within this from its first byte, or the
    /// connection is closed.
    #[arg(long, default_value_t = DEFAULT_HEADER_TIMEOUT_MS, value_name = "MS",
        value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_ms: u64,
    /// An HTTP request's body must arrive whole within this from the end of its head, or it is
    /// answered 408 and the connection closed.
    #[arg(long, default_value_t = DEFAULT_BODY_TIMEOUT_MS, value_name = "MS",
        value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_timeout_ms: u64,
    /// A legacy (2025-11-25) HTTP session is closed, and its watches with it, this long after
    /// its client's last request or its last response stream closing. An open GET stream
    /// keeps it; the server's own notifications do not.
    #[arg(long, default_value_t = crate::transport::http::sessions::DEFAULT_SESSION_IDLE_MS,
        value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub session_idle_timeout_ms: u64,
}

impl ServeArgs {
    pub fn options(&self) -> ServeOptions {
        ServeOptions {
            http: listen_addr(&self.http).map(str::to_owned),
            http_socket: None,
            quic: listen_addr(&self.quic).map(str::to_owned),
            stdio: self.stdio,
            no_stdio_fallback: false,
            http_options: HttpOptions {
                allowed_hosts: self.allowed_hosts.clone(),
                allowed_origins: self.allowed_origins.clone(),
                timeouts: Timeouts {
                    idle: Duration::from_millis(self.http_idle_timeout_ms),
                    header: Duration::from_millis(self.http_header_timeout_ms),
                    body: Duration::from_millis(self.http_body_timeout_ms),
                },
                trusted_proxies: crate::transport::http::budget::trusted_proxies(
                    &self.trusted_proxies,
                ),
                session_idle: Some(Duration::from_millis(self.session_idle_timeout_ms)),
            },
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            events: crate::hooks::EventsOptions {
                callback_allow: self.callback_allow.clone(),
                receiver_url: None,
                profile: self.events_profile.unwrap_or_default(),
            },
            hooks_bucket: None,
            limits: Limits {
                max_streams_per_connection: self.max_listen_streams,
                max_listen_streams_per_caller: self.max_caller_listen_streams,
                max_listen_streams_total: self.max_total_listen_streams,
                max_event_streams_per_connection: self.max_event_streams,
                max_uris_per_stream: self.max_listen_uris,
                max_message_bytes: self.max_message_bytes,
                stall_timeout: Duration::from_millis(self.listen_stall_ms),
                max_connections: self.max_connections,
            },
        }
    }
}

/// The store of a role that keeps nothing of its own there but a self-signed QUIC identity
/// (`herald file`, `k8s`, `gateway`): the file when `--store` names one or serving QUIC
/// without `--tls-cert` needs that identity kept; else one in memory (its tasks last as long
/// as the process), so the role runs beside another herald that holds the default store
/// (`herald up`).
pub async fn role_store(opts: &ServeOptions, globals: &Globals) -> Result<Store, Exit> {
    if globals.store.is_some() || (opts.quic.is_some() && opts.tls_cert.is_none()) {
        globals.open_store().await
    } else {
        Ok(Store::memory())
    }
}

/// Prints what a role bound, on stderr: with `--log-format json` one log line (a tracing JSON
/// object like every other: `timestamp`, `level`, `"event":"listening"`, `role`, `http`,
/// `http_url`, `quic`, `quic_fingerprint`, `stdio`, `admin`), else one human line per
/// listener. Scripts and tests read this instead of guessing ports.
/// What a server role serving only stdio says when a person started it at a terminal.
fn stdio_at_a_terminal(role: &str) -> String {
    format!(
        "herald {role}: speaking MCP on stdin/stdout, for a client that starts it (as herald's --mcp-stdio does); to serve over the network add --http 127.0.0.1:8750 (or --quic ADDR). Ctrl-D ends it"
    )
}

pub fn announce(bound: &Bound, format: LogFormat) {
    // (Not `display`: tracing's macros bring their own into scope.)
    let addr = tracing::field::display::<SocketAddr>;
    match format {
        LogFormat::Json => tracing::info!(
            target: ANNOUNCE,
            event = "listening",
            role = %bound.role,
            http = bound.http.map(addr),
            http_url = bound.http_url(),
            quic = bound.quic.map(addr),
            quic_fingerprint = bound.quic_fingerprint.as_deref(),
            stdio = bound.stdio,
            admin = bound.admin.map(addr),
            "listening"
        ),
        LogFormat::Text => {
            if let Some(url) = bound.http_url() {
                eprintln!("herald {}: listening on {url}", bound.role);
            }
            if let (Some(q), Some(fp)) = (bound.quic, &bound.quic_fingerprint) {
                eprintln!(
                    "herald {}: listening on quic://{q} (certificate sha256 {fp})",
                    bound.role
                );
            }
            if bound.stdio && bound.http.is_none() && bound.quic.is_none() {
                // stdout carries the protocol; say nothing there. A person at a terminal is
                // told on stderr what this is and how to serve over the network instead.
                tracing::debug!(role = %bound.role, "serving stdio");
                if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                    eprintln!("{}", stdio_at_a_terminal(&bound.role));
                }
            }
        }
    }
}

/// The start of a server role's life, before its source is built: SIGINT and SIGTERM shut
/// `ctx` down from here on, systemd hears `STATUS=starting ROLE`, and the admin address
/// (`--admin`, or the `admin` socket systemd passed) is served and announced at once, so
/// `/live` answers and `/ready` says what it waits for during the whole start (a gateway's
/// warm-up included); its `POST /backup` copies `store`. Hand what it returns to
/// [`serve_until_stopped`].
pub async fn begin(
    args: &ServeArgs,
    ctx: &RoleContext,
    globals: &Globals,
    store: &Store,
) -> Result<Option<SocketAddr>, Exit> {
    app::cancel_on_signals(ctx.shutdown().clone());
    let systemd = &globals.systemd;
    systemd
        .notify(&[Notify::Status(&format!("starting {}", ctx.role()))])
        .await;
    let admin = app::admin::serve_admin(listen_addr(&args.admin), systemd, ctx, Some(store))
        .await
        .map_err(|e| crate::cli::usage(e.into()))?;
    if let Some(a) = admin {
        match globals.log_format {
            LogFormat::Json => tracing::info!(
                target: ANNOUNCE,
                event = "admin",
                role = ctx.role(),
                admin = %a,
                "admin address"
            ),
            LogFormat::Text => eprintln!(
                "herald {}: admin on http://{a} (/live, /ready, /metrics, /status, POST /backup)",
                ctx.role()
            ),
        }
    }
    Ok(admin)
}

/// Serves `source` as `opts` says until SIGINT, SIGTERM or `ctx` shuts down, then drains
/// `ctx` (the listeners and the source's helper tasks alike): the rest of a server role's
/// life after [`begin`] and its source built on `ctx`. A listening socket systemd passed for
/// `http` is served instead of binding `--http`. systemd hears `READY=1` once everything is
/// bound (before the bound addresses are printed, so a reader of that line finds `/ready`
/// answering 200 unless an upstream is still missing), and `STOPPING=1` when the drain begins.
pub async fn serve_until_stopped(
    source: crate::mcp::source::DynSource,
    opts: &ServeOptions,
    admin: Option<SocketAddr>,
    store: &Store,
    ctx: RoleContext,
    globals: &Globals,
    reload: Option<Box<dyn crate::app::reload::Reload>>,
) -> Result<(), Exit> {
    let systemd = &globals.systemd;
    let mut opts = opts.clone();
    if opts.http_socket.is_none() {
        opts.http_socket = systemd.socket("http");
    }
    let mut bound = match app::serve_source(source, &opts, store, &ctx).await {
        Ok(b) => b,
        Err(e) => {
            app::drain(&ctx).await;
            return Err(crate::cli::usage(e.into()));
        }
    };
    bound.admin = admin;
    // SIGHUP is taken before systemd hears READY=1 (it may send one right after).
    match reload {
        Some(reload) => {
            let status = app::serving_status(std::slice::from_ref(&bound));
            app::reload::serve(&ctx, systemd, status, reload);
        }
        None => app::reload::hangup_says_nothing_to_reload(&ctx),
    }
    app::ready(&ctx, systemd, std::slice::from_ref(&bound)).await;
    announce(&bound, globals.log_format);
    ctx.shutdown().cancelled().await;
    app::stop(&ctx, systemd).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Every role runner's `/metrics` names the same series in the same order, with the same
    /// help texts, as before each part registered its own (the fixture is that output, idle).
    #[test]
    fn a_role_context_renders_every_parts_metrics_in_the_old_order() {
        for role in ["memo", "gateway", "up"] {
            assert_eq!(
                super::role_context(role).metrics().render(),
                include_str!("../../tests/fixtures/metrics/idle.txt"),
                "{role}"
            );
        }
    }
}
