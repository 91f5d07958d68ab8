//! One upstream server ("slug") of the gateway: its connection, kept and re-made with backoff,
//! and its catalog (tools, resources, templates, whether it serves Events), refreshed on every
//! connect. A stdio upstream is a child process the gateway supervises: when it exits, it is
//! restarted with backoff.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use futures::FutureExt;

use rmcp::ClientHandler;
use rmcp::model::{
    ClientConfig, ClientRequest, CustomRequest, ErrorData, NumberOrString,
    ProgressNotificationParam, ProgressToken, Resource, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, RoleClient};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::gateway::config::Slug;
use crate::mcp::server::EVENTS_EXTENSION;
use crate::mcp::source::{Progress, SourceError};
use crate::transport::client::{Connection, Target, client_config, connect};

use crate::watch::template::Template;

/// Longest one connect (handshake plus catalog) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one forwarded request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const BASE_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The gateway's client side of its upstreams: relays an upstream's progress notifications
/// to the downstream caller waiting on that call.
#[derive(Clone, Default)]
pub struct Relay {
    waiting: Arc<Mutex<HashMap<String, Progress>>>,
    /// Progress that arrived before its call was registered (the request is on the wire before
    /// rmcp hands back its token); at most [`MAX_EARLY`], oldest dropped.
    early: Arc<Mutex<std::collections::VecDeque<ProgressNotificationParam>>>,
}

const MAX_EARLY: usize = 64;

/// A registered progress relay; dropping it ends the relay.
pub struct Relaying {
    key: String,
    waiting: Arc<Mutex<HashMap<String, Progress>>>,
}

impl Drop for Relaying {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

fn token_key(t: &ProgressToken) -> String {
    match &t.0 {
        NumberOrString::Number(n) => format!("n:{n}"),
        NumberOrString::String(s) => format!("s:{s}"),
    }
}

impl Relay {
    /// Sends the upstream's progress for `token` to `to` until the returned guard drops.
    pub fn register(&self, token: ProgressToken, to: Progress) -> Relaying {
        let key = token_key(&token);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), to.clone());
        let early: Vec<ProgressNotificationParam> = {
            let mut q = self.early.lock().unwrap_or_else(|e| e.into_inner());
            let (mine, rest): (Vec<_>, Vec<_>) = q
                .drain(..)
                .partition(|p| token_key(&p.progress_token) == key);
            q.extend(rest);
            mine
        };
        if !early.is_empty() {
            tokio::spawn(async move {
                for mut p in early {
                    p.progress_token = to.token.clone();
                    let _ = to.peer.notify_progress(p).await;
                }
            });
        }
        Relaying {
            key,
            waiting: self.waiting.clone(),
        }
    }
}

impl ClientHandler for Relay {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let to = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&token_key(&params.progress_token))
            .cloned();
        match to {
            Some(to) => {
                params.progress_token = to.token.clone();
                let _ = to.peer.notify_progress(params).await;
            }
            None => {
                let mut q = self.early.lock().unwrap_or_else(|e| e.into_inner());
                if q.len() == MAX_EARLY {
                    q.pop_front();
                }
                q.push_back(params);
            }
        }
    }
}

/// A connected upstream and what it offered when it connected.
pub struct Live {
    pub conn: Connection<Relay>,
    pub tools: Vec<Tool>,
    pub resources: Vec<Resource>,
    pub templates: Vec<(String, Template)>,
    pub events: bool,
    pub subscribe: bool,
    pub modern: bool,
    /// Which connect this is (a supervisor clears only its own).
    generation: u64,
}

struct Backoff {
    failures: u32,
    next: Option<Instant>,
    last_error: String,
    /// When the current connection came up.
    up_since: Option<Instant>,
}

/// A connect in progress, shared by everyone waiting for it.
type Attempt = futures::future::Shared<futures::future::BoxFuture<'static, Result<Arc<Live>, ()>>>;

/// A connection that lived this long resets the backoff.
const HEALTHY: Duration = Duration::from_secs(10);

pub struct Upstream {
    pub slug: String,
    target: Target,
    trust: crate::transport::tls::ClientTrust,
    max_message_bytes: usize,
    live: Mutex<Option<Arc<Live>>>,
    /// The last connection, kept for its catalog.
    last: Mutex<Option<Arc<Live>>>,
    attempt: Mutex<Option<Attempt>>,
    backoff: Mutex<Backoff>,
    shutdown: CancellationToken,
    generation: std::sync::atomic::AtomicU64,
    pub relay: Relay,
}

fn unavailable(slug: &str) -> SourceError {
    // Entitled callers learn the slug is down, not why (the details, which may name command
    // lines or hosts, are in the gateway's log).
    SourceError::Unavailable(format!(
        "server {slug} is unavailable right now; the gateway is reconnecting to it, try again shortly"
    ))
}

/// An upstream's JSON-RPC error, passed on unchanged; a transport failure is `None`.
pub fn upstream_error(e: rmcp::ServiceError) -> Option<SourceError> {
    match e {
        rmcp::ServiceError::McpError(ErrorData {
            code,
            message,
            data,
        }) => Some(SourceError::Upstream {
            code: code.0,
            message: message.into_owned(),
            data,
        }),
        _ => None,
    }
}

impl Upstream {
    pub fn new(slug: &Slug, max_message_bytes: usize, shutdown: CancellationToken) -> Upstream {
        Upstream {
            slug: slug.name.clone(),
            target: slug.target.clone(),
            trust: slug.trust.clone(),
            max_message_bytes,
            live: Mutex::new(None),
            last: Mutex::new(None),
            attempt: Mutex::new(None),
            backoff: Mutex::new(Backoff {
                failures: 0,
                next: None,
                last_error: String::new(),
                up_since: None,
            }),
            shutdown,
            generation: std::sync::atomic::AtomicU64::new(0),
            relay: Relay::default(),
        }
    }

    /// When the next connect may be tried.
    fn retry_in(&self) -> Duration {
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next
            .map_or(BASE_BACKOFF, |n| {
                n.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(10))
            })
    }

    /// Forgets connection `generation` (its process exited).
    fn forget(&self, generation: u64) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            *live = None;
        }
    }

    /// The current connection, if any (catalog reads: never waits).
    pub fn cached(&self) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .filter(|l| !l.conn.is_closed())
    }

    /// A live connection: the current one, or a new one (at most one connect at a time, and
    /// not before the backoff after a failure has passed).
    ///
    /// Boxed: a supervisor started by a connect calls this again, and the future's type must
    /// not contain itself.
    pub fn live(
        self: &Arc<Self>,
    ) -> futures::future::BoxFuture<'_, Result<Arc<Live>, SourceError>> {
        Box::pin(async move {
            if let Some(l) = self.cached() {
                return Ok(l);
            }
            // One connect at a time, run in a task of its own: a caller that gives up (a 3 s
            // events probe, a client that went away) never cancels it half-way.
            let attempt = {
                let mut g = self.attempt.lock().unwrap_or_else(|e| e.into_inner());
                match g.as_ref() {
                    Some(a) => a.clone(),
                    None => {
                        let me = self.clone();
                        let a =
                            async move { tokio::spawn(me.connect_once()).await.unwrap_or(Err(())) }
                                .boxed()
                                .shared();
                        *g = Some(a.clone());
                        a
                    }
                }
            };
            attempt.await.map_err(|()| unavailable(&self.slug))
        })
    }

    async fn connect_once(self: Arc<Self>) -> Result<Arc<Live>, ()> {
        let r = async {
            if let Some(l) = self.cached() {
                return Ok(l);
            }
            if let Some(next) = self.backoff.lock().unwrap_or_else(|e| e.into_inner()).next
                && Instant::now() < next
            {
                return Err(());
            }
            match tokio::time::timeout(CONNECT_TIMEOUT, self.open()).await {
                Ok(Ok(live)) => {
                    let live = Arc::new(live);
                    *self.live.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
                    let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                    b.next = None;
                    b.up_since = Some(Instant::now());
                    tracing::info!(slug = %self.slug, tools = live.tools.len(), resources = live.resources.len(),
                                   templates = live.templates.len(), events = live.events, "upstream connected");
                    Ok(live)
                }
                Ok(Err(e)) => {
                    self.failed(e);
                    Err(())
                }
                Err(_) => {
                    self.failed(format!(
                        "no handshake within {} s",
                        CONNECT_TIMEOUT.as_secs()
                    ));
                    Err(())
                }
            }
        }
        .await;
        *self.attempt.lock().unwrap_or_else(|e| e.into_inner()) = None;
        r
    }

    /// The catalog of the last connection, even while reconnecting (routing and listings
    /// keep a slug's URIs and tools through a restart).
    pub fn catalog(&self) -> Option<Arc<Live>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn failed(&self, error: String) -> SourceError {
        let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        // A connection that stayed up a while resets the backoff; one that failed soon after
        // its handshake (a crash loop) keeps it growing.
        if b.up_since.take().is_some_and(|t| t.elapsed() >= HEALTHY) {
            b.failures = 0;
        }
        let delay = BASE_BACKOFF
            .saturating_mul(2u32.saturating_pow(b.failures.min(16)))
            .min(MAX_BACKOFF);
        b.failures += 1;
        b.next = Some(Instant::now() + delay);
        if b.last_error != error || b.failures == 1 {
            tracing::warn!(slug = %self.slug, %error, retry_ms = delay.as_millis() as u64, "upstream unavailable");
        }
        b.last_error = error;
        unavailable(&self.slug)
    }

    /// Forgets `failed` (a connection that broke) so the next use reconnects.
    pub fn reset(&self, failed: &Arc<Live>) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.as_ref().is_some_and(|l| Arc::ptr_eq(l, failed)) {
            *live = None;
        }
    }

    async fn open(self: &Arc<Self>) -> Result<Live, String> {
        let mut conn = connect(
            &self.target,
            &self.trust,
            self.relay.clone(),
            self.max_message_bytes,
        )
        .await
        .map_err(|e| e.to_string())?;
        let info = conn.peer_info();
        let caps = info.as_ref().map(|i| i.capabilities.clone());
        let tools = if caps.as_ref().is_some_and(|c| c.tools.is_some()) {
            conn.list_all_tools().await.unwrap_or_default()
        } else {
            Vec::new()
        };
        let (resources, templates) = if caps.as_ref().is_some_and(|c| c.resources.is_some()) {
            (
                conn.list_all_resources().await.unwrap_or_default(),
                conn.list_all_resource_templates()
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| t.uri_template.clone())
                    .filter_map(|t| Template::parse(&t).ok().map(|p| (t, p)))
                    .collect(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let events = caps.as_ref().is_some_and(|c| {
            c.extensions
                .as_ref()
                .is_some_and(|e| e.contains_key(EVENTS_EXTENSION))
        });
        let subscribe = caps
            .as_ref()
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.subscribe)
            .unwrap_or(false);
        let modern = conn.is_modern();
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A supervised child: when it exits, it is started again, with backoff, whether or
        // not anyone is using it (a new connect supervises the new child).
        if let Some(mut child) = conn.take_child() {
            let shutdown = self.shutdown.clone();
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    status = child.wait() => {
                        if let Some(up) = weak.upgrade() {
                            up.forget(generation);
                            up.failed(format!("the process exited ({status:?}); restarting it"));
                        }
                    }
                }
                loop {
                    let Some(up) = weak.upgrade() else { return };
                    let delay = up.retry_in();
                    drop(up);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    let Some(up) = weak.upgrade() else { return };
                    if up.live().await.is_ok() {
                        return;
                    }
                }
            });
        }
        Ok(Live {
            conn,
            tools,
            resources,
            templates,
            events,
            subscribe,
            modern,
            generation,
        })
    }

    /// Sends a custom request (`events/list`, `events/poll`) and returns its result object.
    pub async fn custom(
        self: &Arc<Self>,
        method: &str,
        params: Value,
    ) -> Result<Value, SourceError> {
        self.custom_within(method, params, REQUEST_TIMEOUT).await
    }

    /// [`Upstream::custom`] with its own time bound.
    pub async fn custom_within(
        self: &Arc<Self>,
        method: &str,
        params: Value,
        bound: Duration,
    ) -> Result<Value, SourceError> {
        let live = self.live().await?;
        let req = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
        match tokio::time::timeout(bound, live.conn.send_request(req)).await {
            Err(_) => Err(SourceError::Unavailable(format!(
                "server {} did not answer {method} within {} s",
                self.slug,
                bound.as_secs()
            ))),
            Ok(Ok(ServerResult::CustomResult(r))) => Ok(r.0),
            Ok(Ok(other)) => Ok(serde_json::to_value(other).unwrap_or(Value::Null)),
            Ok(Err(e)) => match upstream_error(e) {
                Some(e) => Err(e),
                None => {
                    self.reset(&live);
                    Err(unavailable(&self.slug))
                }
            },
        }
    }
}
