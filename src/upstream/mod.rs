//! The client of upstream MCP servers, shared by every role that talks to servers: the watch
//! client, the gateway, the agent. It sits above [`crate::mcp`] and [`crate::transport`] and
//! imports both. One [`Upstream`] per server keeps one connection (shared by everything that
//! uses the server), re-made on demand after it breaks, at most one connect at a time and not
//! before its [`Backoff`] allows; a stdio upstream can be a supervised child, started again
//! when it exits. Each connect refreshes the server's [`Catalog`]; [`route`] is the one rule
//! that picks the server for a URI, and [`contents`] the one mapping of a read's result into
//! herald's [`Contents`](crate::mcp::source::Contents).
//!
//! What a role asks of a server are the operations in `client.rs` (`call_tool`, `get_prompt`,
//! `complete`, `request`, `read`, `listen`), `log.rs` (`follow_log`: an event log followed by
//! cursor, with `GAP`) and here (`custom`, `tasks_request`, [`follow_tasks`]); each picks
//! in-process, direct HTTP or rmcp itself. They fail with an [`UpstreamError`] by cause
//! (`error.rs`), and what each role does with a failure stays the role's: a served caller
//! learns that a server is down (`From<UpstreamError> for SourceError`), `herald watch`'s
//! user learns why.

mod catalog;
mod client;
mod error;
pub mod events;
pub mod http;
mod listen;
pub mod lists;
pub mod local;
pub mod log;
mod relay;
mod wire;

use crate::sync::Recover;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use rmcp::model::{ClientRequest, CustomRequest, ServerResult};
use serde_json::Value;

pub use catalog::{Catalog, ContentsError, contents, is_read_only, route};
pub use error::UpstreamError;
pub use listen::{FilterFor, Heard, HeardOn, KeptListen, Listening, carried};
pub use lists::{ListEvents, ListSignal};
pub use log::{LogCursor, LogFollow};
pub use relay::{Relay, Relaying, UPWARD_CAPACITY, Upward};

use crate::mcp::source::SourceError;
use crate::runtime::backoff::Backoff;
use crate::runtime::context::RoleContext;
use crate::runtime::status::UpstreamReport;
use crate::transport::client::{ConnectError, Connection, DEFAULT_CONNECT_TIMEOUT, connect_tapped};
use crate::transport::explain;
use crate::transport::target::Target;
use crate::transport::tls::ClientTrust;

/// Longest one request to an upstream may take (a read, a listen's acknowledgment, a tool
/// call, a custom request), and the watch client's connect bound.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Reconnect pacing unless configured otherwise: 250 ms doubling to 30 s, reset by a
/// connection that stayed up 10 s (one that fails soon after its handshake, a crash loop,
/// keeps it growing).
pub const RECONNECT: Backoff =
    Backoff::new(Duration::from_millis(250), Duration::from_secs(30)).reset_after(HEALTHY);

/// No pacing: connect whenever asked. For a caller that paces its own retries (each of the
/// watch client's watches resubscribes with its own backoff).
pub const UNPACED: Backoff = Backoff::new(Duration::ZERO, Duration::ZERO);

/// A connection (or subscription) that lived this long counts as healthy.
pub const HEALTHY: Duration = Duration::from_secs(10);

/// How to reach one upstream and how to keep it.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// What logs and messages call it; its listing entries' `server`.
    pub name: String,
    pub target: Target,
    pub trust: ClientTrust,
    /// Largest message accepted from it.
    pub max_message_bytes: usize,
    /// Longest one connect (handshake plus catalog) may take.
    pub connect_timeout: Duration,
    /// How long an HTTP or QUIC server has to answer a connect, through the MCP handshake
    /// (`--connect-timeout-ms`; [`DEFAULT_CONNECT_TIMEOUT`] unless configured otherwise).
    pub handshake_timeout: Duration,
    /// Pacing of connects after a failed one.
    pub backoff: Backoff,
    /// The role's task context: connects, the child's supervisor and progress flushes run
    /// on it, and end at its shutdown. `None` (a client role, whose tasks end with its
    /// runtime): plain tokio tasks.
    pub context: Option<RoleContext>,
    /// For a stdio target with a `context`: keep the child running, starting it again (paced
    /// by `backoff`) whenever it exits, until the context shuts down. Otherwise a child lives
    /// as long as its connection.
    pub supervise: bool,
    /// Listen streams a role may hold on this upstream's one connection (the gateway's shared
    /// subscriptions): [`DEFAULT_MAX_LISTENS`], under the 64 a herald server allows per
    /// connection; more for a server in this process, which allows more.
    pub max_listens: usize,
    /// Every listen asks that its updates carry their reads (`io.herald/contents`, where the
    /// server offers it): the watch client, which would read after each update anyway.
    pub contents: bool,
}

/// Default for [`UpstreamConfig::max_listens`].
pub const DEFAULT_MAX_LISTENS: usize = 48;

impl UpstreamConfig {
    /// Named after its target as logs may show it (`Target::redacted`: no userinfo, query or
    /// command arguments, where secrets go), connects bounded by [`REQUEST_TIMEOUT`], paced
    /// by [`RECONNECT`], no supervision.
    pub fn new(target: Target, trust: ClientTrust, max_message_bytes: usize) -> UpstreamConfig {
        UpstreamConfig {
            name: target.redacted(),
            target,
            trust,
            max_message_bytes,
            connect_timeout: REQUEST_TIMEOUT,
            handshake_timeout: DEFAULT_CONNECT_TIMEOUT,
            backoff: RECONNECT,
            context: None,
            supervise: false,
            max_listens: DEFAULT_MAX_LISTENS,
            contents: false,
        }
    }
}

/// No connection to an upstream now: a connect failed, or the next one is not due yet.
/// `detail` is the last connect's failure; it may name command lines and hosts, so a role
/// that serves untrusted callers logs it rather than passing it on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Unavailable {
    pub name: String,
    pub detail: String,
}

impl From<Unavailable> for SourceError {
    /// What a served caller (the gateway's) learns: that the server is down, not why.
    fn from(e: Unavailable) -> SourceError {
        UpstreamError::from(e).into()
    }
}

/// A connected upstream and what it offered when it connected. Derefs to its [`Catalog`].
pub struct Live {
    pub conn: Connection<Relay>,
    pub catalog: Arc<Catalog>,
    /// Which connect this is (a supervisor clears only its own).
    generation: u64,
}

impl std::ops::Deref for Live {
    type Target = Catalog;
    fn deref(&self) -> &Catalog {
        &self.catalog
    }
}

/// Opens a connection some other way than [`connect_tapped`] (tests: an in-process server
/// over an in-memory pipe).
pub type Dialer = Arc<
    dyn Fn(Relay) -> Pin<Box<dyn Future<Output = Result<Connection<Relay>, ConnectError>> + Send>>
        + Send
        + Sync,
>;

/// A connect in progress, shared by everyone waiting for it.
type Attempt = Shared<BoxFuture<'static, Result<Arc<Live>, Unavailable>>>;

struct Pacing {
    backoff: Backoff,
    /// No connect before this (set by a failure).
    next: Option<Instant>,
    last_error: String,
    /// When the current connection came up.
    up_since: Option<Instant>,
}

/// One upstream server: its connection, its last catalog, its reconnect pacing.
pub struct Upstream {
    pub name: String,
    pub target: Target,
    /// See [`UpstreamConfig::max_listens`].
    pub max_listens: usize,
    trust: ClientTrust,
    max_message_bytes: usize,
    connect_timeout: Duration,
    handshake_timeout: Duration,
    ctx: Option<RoleContext>,
    supervise: bool,
    /// Removed by a reload ([`Upstream::stop`]): a supervised child that exits is not started
    /// again.
    stopped: std::sync::atomic::AtomicBool,
    dialer: Option<Dialer>,
    /// The server itself, when it runs in this process ([`local::upstream`]; set once built,
    /// for [`local::deferred`]): plain calls and reads go to it directly.
    in_process: Arc<std::sync::OnceLock<crate::mcp::server::SourceServer>>,
    /// For an HTTP target: plain tool calls posted directly ([`http::HttpCalls`]).
    http_calls: Option<http::HttpCalls>,
    live: Mutex<Option<Arc<Live>>>,
    /// The last connection's catalog, kept while reconnecting.
    catalog: Mutex<Option<Arc<Catalog>>>,
    attempt: Mutex<Option<Attempt>>,
    pacing: Mutex<Pacing>,
    generation: AtomicU64,
    /// The connections' client handler: register a call's progress relay here.
    pub relay: Relay,
}

impl crate::runtime::status::UpstreamStatus for Upstream {
    fn report(&self) -> UpstreamReport {
        Upstream::report(self)
    }
}

/// Picks among `upstreams` by [`route`], over their last-known catalogs (one that has never
/// connected has none and is skipped).
pub fn pick<'a>(upstreams: &'a [Arc<Upstream>], uri: &str) -> Option<&'a Arc<Upstream>> {
    let known: Vec<(&Arc<Upstream>, Arc<Catalog>)> = upstreams
        .iter()
        .filter_map(|u| u.catalog().map(|c| (u, c)))
        .collect();
    let catalogs: Vec<&Catalog> = known.iter().map(|(_, c)| &**c).collect();
    route(&catalogs, uri).map(|i| known[i].0)
}

impl Upstream {
    pub fn new(cfg: UpstreamConfig) -> Upstream {
        let http_calls = match &cfg.target {
            Target::Http(url) => http::HttpCalls::new(
                url,
                cfg.trust.token.as_ref().map(|t| t.0.as_str()),
                cfg.max_message_bytes,
                cfg.trust.oauth.clone(),
            ),
            _ => None,
        };
        Upstream {
            name: cfg.name,
            target: cfg.target,
            max_listens: cfg.max_listens,
            trust: cfg.trust,
            max_message_bytes: cfg.max_message_bytes,
            connect_timeout: cfg.connect_timeout,
            handshake_timeout: cfg.handshake_timeout,
            supervise: {
                debug_assert!(
                    !cfg.supervise || cfg.context.is_some(),
                    "supervise needs a context to end with"
                );
                cfg.supervise && cfg.context.is_some()
            },
            relay: Relay::new(cfg.contents),
            stopped: Default::default(),
            ctx: cfg.context,
            dialer: None,
            in_process: Arc::default(),
            http_calls,
            live: Mutex::new(None),
            catalog: Mutex::new(None),
            attempt: Mutex::new(None),
            pacing: Mutex::new(Pacing {
                backoff: cfg.backoff,
                next: None,
                last_error: String::new(),
                up_since: None,
            }),
            generation: AtomicU64::new(0),
        }
    }

    /// An upstream that connects through `dialer` instead of its target (which still names
    /// it in messages).
    pub fn dialing(cfg: UpstreamConfig, dialer: Dialer) -> Upstream {
        Upstream {
            dialer: Some(dialer),
            ..Upstream::new(cfg)
        }
    }

    /// The server, when it runs in this process: a plain tool call or a read may go to it
    /// directly ([`SourceServer::call_in_process`](crate::mcp::server::SourceServer::call_in_process)),
    /// with no serialization; listens and tasks still go over the connection.
    fn in_process(&self) -> Option<&crate::mcp::server::SourceServer> {
        self.in_process.get()
    }

    /// Direct calls to this upstream's HTTP endpoint, when it is one (and not dialled
    /// otherwise) and its last catalog allows them for `tool` ([`Catalog::direct_call`]).
    /// Roles call through [`Upstream::call_tool`], which picks this way itself; it is public
    /// for the conformance client (`examples/conformance_client.rs`), which tries both ways.
    pub fn http_calls(&self, tool: &str) -> Option<&http::HttpCalls> {
        if self.dialer.is_some() {
            return None;
        }
        let calls = self.http_calls.as_ref()?;
        (http::plain_header_value(tool) && self.catalog().is_some_and(|c| c.direct_call(tool)))
            .then_some(calls)
    }

    /// The current connection, if any (never waits, never connects). Roles ask
    /// [`Upstream::is_connected`]; the handle is for this module and the conformance client.
    pub fn cached(&self) -> Option<Arc<Live>> {
        self.live.locked().clone().filter(|l| !l.conn.is_closed())
    }

    /// The catalog of the last connection, even while reconnecting.
    pub fn catalog(&self) -> Option<Arc<Catalog>> {
        self.catalog.locked().clone()
    }

    /// How it is doing, for the admin address's `/status` and `/ready`: connected now, ever
    /// connected (it has a catalog), and the last failed connect's reason.
    pub fn report(&self) -> UpstreamReport {
        let connected = self.cached().is_some();
        // What failed last, while it is not connected: a connected upstream has no error to
        // show.
        let last_error = {
            let p = self.pacing.locked();
            Some(p.last_error.clone()).filter(|e| !e.is_empty() && !connected)
        };
        UpstreamReport {
            name: self.name.clone(),
            target: self.target.redacted(),
            connected,
            ever_connected: self.catalog().is_some(),
            last_error,
        }
    }

    /// Whether a connect is under way.
    pub fn connecting(&self) -> bool {
        self.attempt.locked().is_some()
    }

    /// Whether it is connected now (never waits, never connects).
    pub fn is_connected(&self) -> bool {
        self.cached().is_some()
    }

    /// Connects now if it is not connected (a warm-up, a first routing), paced as every
    /// connect is. The operations connect by themselves; this only starts sooner.
    pub async fn connect(self: &Arc<Self>) -> Result<(), UpstreamError> {
        self.live().await?;
        Ok(())
    }

    /// Whether it serves the Events extension, connecting if need be, waiting at most
    /// `within` (a connect that outlasts it goes on for the next caller).
    pub async fn offers_events(self: &Arc<Self>, within: Duration) -> Result<bool, UpstreamError> {
        match tokio::time::timeout(within, self.live()).await {
            Ok(live) => Ok(live?.events),
            Err(_) => Err(UpstreamError::TimedOut {
                server: self.name.clone(),
                after: within,
            }),
        }
    }

    /// A live connection: the current one, or a new one (at most one connect at a time, and
    /// not before the backoff after a failure has passed). The operations' way in; roles
    /// never hold a connection (the conformance client does, to try the connection's ways).
    ///
    /// Boxed: a supervisor started by a connect calls this again, and the future's type must
    /// not contain itself.
    pub fn live(self: &Arc<Self>) -> BoxFuture<'_, Result<Arc<Live>, Unavailable>> {
        Box::pin(async move {
            if let Some(l) = self.cached() {
                return Ok(l);
            }
            // One connect at a time, run in a task of its own: a caller that gives up (a 3 s
            // events probe, a client that went away) never cancels it half-way.
            let attempt = {
                let mut g = self.attempt.locked();
                match g.as_ref() {
                    Some(a) => a.clone(),
                    None => {
                        let task = self.spawn("upstream connect", self.clone().connect_once());
                        let name = self.name.clone();
                        let a = async move {
                            task.await.unwrap_or_else(|e| {
                                Err(Unavailable {
                                    name,
                                    detail: format!("the connect task failed: {e}"),
                                })
                            })
                        }
                        .boxed()
                        .shared();
                        *g = Some(a.clone());
                        a
                    }
                }
            };
            attempt.await
        })
    }

    fn unavailable(&self, detail: String) -> Unavailable {
        Unavailable {
            name: self.name.clone(),
            detail,
        }
    }

    async fn connect_once(self: Arc<Self>) -> Result<Arc<Live>, Unavailable> {
        let r = async {
            if let Some(l) = self.cached() {
                return Ok(l);
            }
            {
                let p = self.pacing.locked();
                if p.next.is_some_and(|next| Instant::now() < next) {
                    return Err(self.unavailable(p.last_error.clone()));
                }
            }
            // Never shorter than the handshake's own bound, which says better what is wrong.
            let bound = self.connect_timeout.max(self.handshake_timeout);
            let opening = tokio::time::timeout(bound, self.open());
            // A role shutting down stops waiting at once: its drain must not wait out a
            // connect to an upstream that does not answer.
            let opened = match &self.ctx {
                Some(ctx) => tokio::select! {
                    _ = ctx.shutdown().cancelled() => {
                        return Err(self.unavailable(format!(
                            "server {} is stopping (herald is shutting down, or a reload removed or changed it)",
                            self.name
                        )));
                    }
                    r = opening => r,
                },
                None => opening.await,
            };
            match opened {
                Ok(Ok(live)) => {
                    let live = Arc::new(live);
                    // Before it is published: nothing sent on the new connection is cleared.
                    self.relay.connected();
                    *self.live.locked() = Some(live.clone());
                    *self.catalog.locked() =
                        Some(live.catalog.clone());
                    self.relay.lists.count(|e| e.connects += 1);
                    let mut p = self.pacing.locked();
                    p.next = None;
                    p.up_since = Some(Instant::now());
                    tracing::info!(upstream = %self.name, tools = live.tools.len(), resources = live.resources.len(),
                                   templates = live.templates.len(), events = live.events, "upstream connected");
                    Ok(live)
                }
                Ok(Err(e)) => Err(self.failed(e)),
                // The handshake has a bound of its own (HTTP, QUIC) and says so when it fires:
                // this one is the lists after it, or a stdio server's start.
                Err(_) => Err(self.failed(explain::connect_timed_out(&self.target, bound))),
            }
        }
        .await;
        *self.attempt.locked() = None;
        r
    }

    /// Records a failed connect (or an exited child): the next connect waits for the backoff.
    fn failed(&self, error: String) -> Unavailable {
        let mut p = self.pacing.locked();
        if let Some(t) = p.up_since.take() {
            p.backoff.ran_for(t.elapsed());
        }
        let delay = p.backoff.next_delay();
        p.next = Some(Instant::now() + delay);
        if p.last_error != error || p.backoff.failures() == 1 {
            tracing::warn!(upstream = %self.name, %error, retry_ms = delay.as_millis() as u64, "upstream unavailable");
        }
        p.last_error = error.clone();
        self.unavailable(error)
    }

    /// When the next connect may be tried.
    fn retry_in(&self) -> Duration {
        let p = self.pacing.locked();
        p.next.map_or(p.backoff.delay(0), |n| {
            n.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10))
        })
    }

    /// Stops what runs for it alone, for a slug a reload removed: a supervised child is not
    /// started again once it exits (it does when its connection closes, after the calls
    /// still on it: nothing is cut off); anything else on a context of its own (a NATS
    /// mirror) ends now (`RoleContext::stop_alone`).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        if let Some(ctx) = self.ctx.as_ref().filter(|_| !self.supervise) {
            ctx.stop_alone();
        }
    }

    /// Forgets the current connection and, when nothing else holds it, closes it gracefully
    /// (before a runtime that is about to go: rmcp logs a cut-off transport task). A connection
    /// something still holds (a listen) closes when its last holder lets go; a connect already
    /// under way may still set a new one.
    pub async fn close(&self) {
        let live = self.live.locked().take();
        if let Some(live) = live.and_then(|l| Arc::try_unwrap(l).ok()) {
            live.conn.close().await;
        }
    }

    /// Forgets `failed` (a connection that broke) so the next use reconnects.
    pub(crate) fn reset(&self, failed: &Arc<Live>) {
        let mut live = self.live.locked();
        if live.as_ref().is_some_and(|l| Arc::ptr_eq(l, failed)) {
            *live = None;
        }
    }

    /// Forgets connection `generation` (its process exited).
    fn forget(&self, generation: u64) {
        let mut live = self.live.locked();
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            *live = None;
        }
    }

    async fn open(self: &Arc<Self>) -> Result<Live, String> {
        let relay = self.relay.clone();
        let conn = match &self.dialer {
            Some(dial) => dial(relay).await,
            None => {
                // The relay is the connection's tap too: it sees progress and log messages in
                // wire order, ahead of the answers behind them.
                let tap: Arc<dyn crate::transport::client::Tap> = Arc::new(relay.clone());
                connect_tapped(
                    &self.target,
                    &self.trust,
                    relay,
                    self.max_message_bytes,
                    self.handshake_timeout,
                    Some(tap),
                )
                .await
            }
        };
        let mut conn = conn.map_err(|e| e.to_string())?;
        let catalog = Arc::new(Catalog::fetch(&conn, &self.name).await);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        if let Some(ctx) = self.ctx.as_ref().filter(|_| self.supervise)
            && let Some(child) = conn.take_child()
        {
            self.supervise(child, generation, ctx);
        }
        Ok(Live {
            conn,
            catalog,
            generation,
        })
    }

    /// A supervised child: when it exits, it is started again, with backoff, whether or not
    /// anyone is using it (a new connect supervises the new child).
    fn supervise(
        self: &Arc<Self>,
        mut child: tokio::process::Child,
        generation: u64,
        ctx: &RoleContext,
    ) {
        let weak = Arc::downgrade(self);
        let shutdown = ctx.shutdown().clone();
        ctx.spawn("upstream supervisor", async move {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                status = child.wait() => {
                    if let Some(up) = weak.upgrade() {
                        up.forget(generation);
                        if up.stopped.load(Ordering::Acquire) {
                            return;
                        }
                        up.failed(match status {
                            Ok(st) => format!("the process exited ({st}); restarting it"),
                            Err(e) => format!("waiting for the process failed ({e}); restarting it"),
                        });
                    }
                }
            }
            loop {
                let Some(up) = weak
                    .upgrade()
                    .filter(|u| !u.stopped.load(Ordering::Acquire))
                else {
                    return;
                };
                let delay = up.retry_in();
                drop(up);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                let Some(up) = weak.upgrade() else { return };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = up.live() => if r.is_ok() {
                        return;
                    },
                }
            }
        });
    }

    /// Spawns a helper task on the role's context, or as a plain task without one.
    fn spawn<F>(&self, name: &'static str, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.ctx {
            Some(ctx) => ctx.spawn(name, fut),
            None => tokio::spawn(fut),
        }
    }

    /// Sends `req` declaring the tasks extension (a task-augmented call, `tasks/*`), bounded
    /// by `bound` (rmcp's timeout, which tells the upstream to cancel), for a caller whose
    /// declared `capabilities` it carries (a relayed call; else this client's own). An
    /// upstream's own error comes back unchanged; a broken connection is forgotten.
    pub async fn tasks_request(
        self: &Arc<Self>,
        req: ClientRequest,
        bound: Duration,
        capabilities: Option<&rmcp::model::ClientCapabilities>,
    ) -> Result<ServerResult, UpstreamError> {
        let live = self.live().await?;
        let mut options = rmcp::service::PeerRequestOptions::with_timeout(bound);
        options.meta = Some(crate::transport::client::tasks_meta(capabilities));
        let failed = |e: rmcp::ServiceError| self.failure(&live, bound, e);
        let handle = live
            .conn
            .send_cancellable_request(req, options)
            .await
            .map_err(failed)?;
        handle.await_response().await.map_err(failed)
    }

    /// The one reading of a failed rmcp request on `live`: by cause, and a broken connection
    /// (not one slow or refused request) forgotten, so the next use reconnects.
    fn failure(&self, live: &Arc<Live>, bound: Duration, e: rmcp::ServiceError) -> UpstreamError {
        let e = UpstreamError::service(&self.name, &self.target, bound, e);
        if e.is_broken() {
            self.reset(live);
        }
        e
    }

    /// Sends a custom request (`events/list`, `events/poll`) and returns its result object.
    pub async fn custom(
        self: &Arc<Self>,
        method: &str,
        params: Value,
    ) -> Result<Value, UpstreamError> {
        self.custom_within(method, params, REQUEST_TIMEOUT).await
    }

    /// [`Upstream::custom`] with its own time bound.
    pub async fn custom_within(
        self: &Arc<Self>,
        method: &str,
        params: Value,
        bound: Duration,
    ) -> Result<Value, UpstreamError> {
        let live = self.live().await?;
        let req = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
        match tokio::time::timeout(bound, live.conn.send_request(req)).await {
            Err(_) => Err(UpstreamError::TimedOut {
                server: self.name.clone(),
                after: bound,
            }),
            Ok(Ok(ServerResult::CustomResult(r))) => Ok(r.0),
            Ok(Ok(other)) => Ok(serde_json::to_value(other).unwrap_or(Value::Null)),
            Ok(Err(e)) => Err(self.failure(&live, bound, e)),
        }
    }
}

/// One task [`follow_tasks`] follows: the upstream's id for it, the id its states are shown
/// under (the gateway's, or the same), and where they go.
pub type Followed = (String, String, Arc<crate::mcp::tasks::relay::Relayed>);

/// Keeps one upstream listen naming the tasks of `tasks` that have not ended (`taskIds`), their
/// pushes going to each one's `Relayed`, until stopped or every one has ended; listens again
/// with backoff when the listen ends early. After each listen is sent, a `tasks/get` of each
/// seeds its state (a push that raced it is ordered by its stamp), so a state is known even
/// when the upstream pushes none. A listen given up (stopped, every task ended, this future
/// dropped) is cancelled upstream, so it frees its slot on the connection.
pub async fn follow_tasks(
    up: Arc<Upstream>,
    tasks: Vec<Followed>,
    stop: tokio_util::sync::CancellationToken,
) {
    let _routes: Vec<_> = tasks
        .iter()
        .map(|(upstream_id, shown, relayed)| up.relay.route_task(upstream_id, shown, relayed))
        .collect();
    let mut backoff = RECONNECT;
    loop {
        let open: Vec<&Followed> = tasks
            .iter()
            .filter(|(_, _, r)| !r.ended().is_cancelled())
            .collect();
        if open.is_empty() {
            return;
        }
        let ids: Vec<&str> = open.iter().map(|(u, _, _)| u.as_str()).collect();
        let all_ended =
            futures::future::join_all(open.iter().map(|(_, _, r)| r.ended().cancelled()));
        let since = std::time::Instant::now();
        let attempt = async {
            let live = up.live().await.map_err(|e| e.to_string())?;
            let mut options = rmcp::service::PeerRequestOptions::no_options();
            options.meta = Some(crate::transport::client::tasks_meta(None));
            let handle = live
                .conn
                .send_cancellable_request(
                    ClientRequest::CustomRequest(CustomRequest::new(
                        "subscriptions/listen",
                        Some(serde_json::json!({"notifications": {"taskIds": ids}})),
                    )),
                    options,
                )
                .await
                .map_err(|e| e.to_string())?;
            let mut guard = CancelOnDrop::new(
                &up,
                handle.peer.clone(),
                handle.id.clone(),
                "nobody follows this task here any more",
            );
            // At most 16 at a time: a reconnect must not send a storm of them.
            use futures::StreamExt as _;
            let gets: Vec<_> = ids
                .iter()
                .map(|id| {
                    let (up, id) = (up.clone(), (*id).to_owned());
                    async move {
                        let get = ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(
                            rmcp::model::GetTaskParams::new(id.clone()),
                        ));
                        let got = up.tasks_request(get, REQUEST_TIMEOUT, None).await;
                        (id, got)
                    }
                    .boxed()
                })
                .collect();
            let seeds = futures::stream::iter(gets).buffer_unordered(16);
            tokio::pin!(seeds);
            while let Some((id, got)) = seeds.next().await {
                match got {
                    Ok(ServerResult::GetTaskResult(r)) => up.relay.offer_task(r.task),
                    // The server does not know it (any more): it will never push it, so it
                    // ends here, saying why.
                    Err(UpstreamError::Rejected { data, .. })
                        if data
                            .as_ref()
                            .and_then(|d| d.get("taskId"))
                            .is_some_and(|t| *t == *id) =>
                    {
                        up.relay
                            .offer_task(crate::mcp::tasks::relay::unknown_upstream(&id));
                    }
                    _ => {}
                }
            }
            // The listen's answer comes when it ends; its pushes meanwhile go through the
            // connection's handler to each task's state.
            let ended = tokio::select! {
                r = handle.await_response() => Some(r),
                _ = all_ended => None,
            };
            if ended.is_some() {
                guard.disarm();
            }
            Ok::<_, String>(ended)
        };
        let got = tokio::select! {
            _ = stop.cancelled() => return,
            r = attempt => r,
        };
        match got {
            Ok(None) => return,
            Ok(Some(r)) => {
                tracing::debug!(server = %up.name, tasks = ids.len(), answer = ?r.err(), "upstream task listen ended; listening again");
            }
            Err(e) => {
                tracing::info!(server = %up.name, tasks = ids.len(), error = %e, "upstream task listen failed; listening again");
            }
        }
        backoff.ran_for(since.elapsed());
        let delay = backoff.next_delay();
        let all_ended =
            futures::future::join_all(open.iter().map(|(_, _, r)| r.ended().cancelled()));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = all_ended => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Sends the upstream `notifications/cancelled` for a request when dropped while armed: its
/// caller gave up on it (a call whose caller went away, a task listen nobody follows).
/// Bounded and not cut by shutdown, which is what drops most callers: the upstream must still
/// hear that nobody waits for the answer.
pub struct CancelOnDrop {
    armed: Option<(rmcp::Peer<rmcp::RoleClient>, rmcp::model::RequestId)>,
    ctx: Option<RoleContext>,
    reason: &'static str,
}

impl CancelOnDrop {
    /// Armed for request `id` on `peer`, its cancel spawned on `up`'s context.
    pub fn new(
        up: &Upstream,
        peer: rmcp::Peer<rmcp::RoleClient>,
        id: rmcp::model::RequestId,
        reason: &'static str,
    ) -> CancelOnDrop {
        CancelOnDrop {
            armed: Some((peer, id)),
            ctx: up.ctx.clone(),
            reason,
        }
    }

    /// The request was answered: nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some((peer, id)) = self.armed.take() else {
            return;
        };
        let reason = self.reason;
        let cancel = async move {
            let _ = peer
                .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
                    Some(id),
                    Some(reason.into()),
                ))
                .await;
        };
        match &self.ctx {
            Some(ctx) => {
                ctx.spawn_in_drop_bounded(
                    "cancel upstream request",
                    Duration::from_secs(1),
                    cancel,
                );
            }
            None => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(1), cancel).await;
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
