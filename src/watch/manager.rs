//! The watch manager: connects to servers, routes URIs, and runs one task per watch that
//! subscribes, reads, extracts events, dedupes, debounces and emits notices.
//!
//! It knows nothing about where notices go: they leave on a bounded channel, and the
//! `herald watch` command (or, later, the agent) decides. Nothing runs while a subscription
//! is healthy: a watch task waits on its subscription, its debounce deadline, or cancellation.
//! When a subscription ends the task resubscribes with backoff (1, 2, 4, 8, 16 s by default);
//! after the last failed attempt the watch fails and a notice says so.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    ReadResourceRequestParams, ResourceContents, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{Subscription, SubscriptionEnd};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::filter::engine::{HostError, Outcome as FilterOutcome, PyExc};
use crate::filter::pool::{Catalog as FilterHost, FilterError, FilterPool};
use crate::mcp::ring::EVENT_LOG_MIME;
use crate::store::{Store, Table};
use crate::transport::client::{Connection, Target, client_config, connect};
use crate::transport::tls::ClientTrust;
use crate::watch::events::{Event, LogCursor, StateBase, diff_reads, extract_log};
use crate::watch::log::WatchLog;
use crate::watch::notice::{
    Debounce, DebounceConfig, Dedupe, default_line, notice_text, object_key, sanitize_line,
};
use crate::watch::template::Template;

/// Watch client limits and timings. Every field has a default and a flag.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub debounce: DebounceConfig,
    /// Watches at once.
    pub max_watches: usize,
    /// Events processed per update; the rest are counted in one line.
    pub max_events_per_update: usize,
    /// First resubscribe delay; doubles each attempt.
    pub resubscribe_base: Duration,
    /// Resubscribe attempts before the watch fails.
    pub resubscribe_attempts: u32,
    /// Largest message accepted from a server.
    pub max_message_bytes: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            debounce: DebounceConfig::default(),
            max_watches: 5,
            max_events_per_update: 100,
            resubscribe_base: Duration::from_secs(1),
            resubscribe_attempts: 5,
            max_message_bytes: 4 * 1024 * 1024,
        }
    }
}

/// A notice: the lines of one debounced batch for one watch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Notice {
    pub watch: String,
    pub uri: String,
    pub lines: Vec<String>,
    /// The `<watch-event ...>` block.
    pub text: String,
}

impl Notice {
    fn new(watch: &str, uri: &str, lines: Vec<String>) -> Notice {
        Notice {
            text: notice_text(watch, uri, &lines),
            watch: watch.to_owned(),
            uri: uri.to_owned(),
            lines,
        }
    }
}

/// What a watch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    State,
    EventLog,
}

/// A saved watch spec (`--watch-state`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WatchSpec {
    pub name: String,
    pub uri: String,
    /// Python source run once per event (`None`: default notice lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_event: Option<String>,
}

/// One row of `watch_list`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WatchInfo {
    pub name: String,
    pub uri: String,
    pub shape: Option<Shape>,
    pub events: u64,
    pub notices: u64,
    pub restore_failed: bool,
    pub failed: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WatchError {
    /// Bad input that will never work: never retried, dropped from saved state.
    #[error("{0}")]
    Invalid(String),
    /// The server refused the URI (its own error).
    #[error("{server} refused {uri}: {message}")]
    Rejected {
        server: String,
        uri: String,
        message: String,
    },
    /// Could not reach a server now; may work later.
    #[error("{0}")]
    Unavailable(String),
}

impl WatchError {
    /// Whether a saved spec failing this way should be kept for a later start.
    pub fn is_transient(&self) -> bool {
        matches!(self, WatchError::Unavailable(_))
    }
}

/// A server the manager can reach, with what it lists.
pub struct Server {
    pub target: Target,
    trust: ClientTrust,
    max_message_bytes: usize,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    catalog: Mutex<Catalog>,
}

#[derive(Default, Clone)]
struct Catalog {
    /// `(name, read-only)` for each tool.
    tools: Vec<(String, bool)>,
    /// Full resource and template entries, for `list_resources()` in Python.
    listing: Vec<Value>,
    resources: Vec<String>,
    templates: Vec<Template>,
    subscribe: bool,
}

impl Server {
    pub fn new(target: Target, trust: ClientTrust, max_message_bytes: usize) -> Arc<Server> {
        Arc::new(Server {
            target,
            trust,
            max_message_bytes,
            conn: tokio::sync::Mutex::new(None),
            catalog: Mutex::new(Catalog::default()),
        })
    }

    /// The open connection, connecting (and refreshing the catalog) when there is none.
    pub async fn connection(&self) -> Result<Arc<Connection>, WatchError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        *slot = None;
        let conn = tokio::time::timeout(
            REQUEST_TIMEOUT,
            connect(
                &self.target,
                &self.trust,
                client_config(),
                self.max_message_bytes,
            ),
        )
        .await
        .map_err(|_| {
            WatchError::Unavailable(format!(
                "{}: no answer to the handshake within {} s",
                self.target,
                REQUEST_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| WatchError::Unavailable(e.to_string()))?;
        let conn = Arc::new(conn);
        let mut catalog = Catalog {
            subscribe: conn
                .peer_info()
                .and_then(|i| i.capabilities.resources.as_ref().and_then(|r| r.subscribe))
                .unwrap_or(false),
            ..Catalog::default()
        };
        let server_name = self.target.to_string();
        let example = |d: Option<&str>| -> Value {
            d.and_then(|d| {
                d.lines()
                    .rev()
                    .find_map(|l| l.trim().strip_prefix("Example:"))
            })
            .map(|e| Value::from(e.trim()))
            .unwrap_or(Value::Null)
        };
        if let Ok(list) = tokio::time::timeout(REQUEST_TIMEOUT, conn.list_all_tools())
            .await
            .unwrap_or(Err(rmcp::ServiceError::Timeout {
                timeout: REQUEST_TIMEOUT,
            }))
        {
            catalog.tools = list
                .iter()
                .map(|t| {
                    let a = t.annotations.as_ref();
                    let read_only = a.and_then(|a| a.read_only_hint) == Some(true)
                        && a.and_then(|a| a.destructive_hint) != Some(true);
                    (t.name.to_string(), read_only)
                })
                .collect();
        }
        if let Ok(list) = tokio::time::timeout(REQUEST_TIMEOUT, conn.list_all_resources())
            .await
            .unwrap_or(Err(rmcp::ServiceError::Timeout {
                timeout: REQUEST_TIMEOUT,
            }))
        {
            for r in &list {
                catalog.listing.push(json!({"uri": r.uri, "template": false, "name": r.name,
                    "description": r.description, "example": example(r.description.as_deref()),
                    "mime_type": r.mime_type, "server": server_name, "subscribable": catalog.subscribe}));
            }
            catalog.resources = list.into_iter().map(|r| r.uri).collect();
        }
        if let Ok(list) = tokio::time::timeout(REQUEST_TIMEOUT, conn.list_all_resource_templates())
            .await
            .unwrap_or(Err(rmcp::ServiceError::Timeout {
                timeout: REQUEST_TIMEOUT,
            }))
        {
            for t in &list {
                catalog.listing.push(json!({"uri": t.uri_template, "template": true, "name": t.name,
                    "description": t.description, "example": example(t.description.as_deref()),
                    "mime_type": t.mime_type, "server": server_name, "subscribable": catalog.subscribe}));
            }
            catalog.templates = list
                .iter()
                .filter_map(|t| Template::parse(&t.uri_template).ok())
                .collect();
        }
        *self.catalog.lock().unwrap_or_else(|e| e.into_inner()) = catalog;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets `failed` so the next [`Server::connection`] reconnects.
    pub async fn reset(&self, failed: &Arc<Connection>) {
        let mut slot = self.conn.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, failed)) {
            *slot = None;
        }
    }

    fn lists(&self, uri: &str) -> bool {
        let c = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        c.resources.iter().any(|r| r == uri)
    }

    fn template_matches(&self, uri: &str) -> bool {
        let c = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        c.templates.iter().any(|t| t.matches(uri))
    }

    fn subscribable(&self) -> bool {
        self.catalog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribe
    }
}

/// Picks the server for `uri`: the one listing it exactly, else the one whose template
/// matches, else the first that advertises `resources.subscribe`.
pub fn route<'a>(servers: &'a [Arc<Server>], uri: &str) -> Option<&'a Arc<Server>> {
    servers
        .iter()
        .find(|s| s.lists(uri))
        .or_else(|| servers.iter().find(|s| s.template_matches(uri)))
        .or_else(|| servers.iter().find(|s| s.subscribable()))
}

struct Entry {
    spec: WatchSpec,
    shape: Option<Shape>,
    stats: Arc<Stats>,
    cancel: CancellationToken,
    restore_failed: bool,
}

impl Entry {
    /// A watch that holds a slot: not a kept-but-failed restore, not a failed watch.
    fn is_running(&self) -> bool {
        !self.restore_failed && !self.stats.failed.load(Ordering::Relaxed)
    }
}

/// Running watches other than `name`.
fn running(watches: &HashMap<String, Entry>, name: &str) -> usize {
    watches
        .values()
        .filter(|e| e.is_running() && e.spec.name != name)
        .count()
}

fn over_limit(max: usize) -> WatchError {
    WatchError::Invalid(format!(
        "at most {max} watches may run at once; stop one first (watch_list shows them)"
    ))
}

#[derive(Default)]
struct Stats {
    events: AtomicU64,
    notices: AtomicU64,
    failed: std::sync::atomic::AtomicBool,
}

struct Inner {
    cfg: WatchConfig,
    servers: Vec<Arc<Server>>,
    watches: Mutex<HashMap<String, Entry>>,
    notices: mpsc::Sender<Notice>,
    log: WatchLog,
    store: Option<Store>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    filters: Mutex<Option<FilterPool>>,
    validations: AtomicU64,
}

/// The watch manager. Cheap to clone.
#[derive(Clone)]
pub struct WatchManager {
    inner: Arc<Inner>,
}

impl WatchManager {
    /// A manager over `servers`. Notices go to `notices`; with `store`, watch specs are saved
    /// on every start and stop (`--watch-state`).
    pub fn new(
        cfg: WatchConfig,
        servers: Vec<Arc<Server>>,
        notices: mpsc::Sender<Notice>,
        log: WatchLog,
        store: Option<Store>,
    ) -> WatchManager {
        WatchManager {
            inner: Arc::new(Inner {
                cfg,
                servers,
                watches: Mutex::new(HashMap::new()),
                notices,
                log,
                store,
                tracker: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                filters: Mutex::new(None),
                validations: AtomicU64::new(0),
            }),
        }
    }

    /// Connects to every server once, so routing knows what they list. Failures are
    /// returned per server; they are retried when a watch needs that server.
    pub async fn connect_all(&self) -> Vec<(String, WatchError)> {
        let mut failed = Vec::new();
        for s in &self.inner.servers {
            if let Err(e) = s.connection().await {
                failed.push((s.target.to_string(), e));
            }
        }
        failed
    }

    /// Lets watches run `on_event` filters in this pool's workers.
    pub fn set_filters(&self, pool: FilterPool) {
        *self.inner.filters.lock().unwrap_or_else(|e| e.into_inner()) = Some(pool);
    }

    fn filters(&self) -> Option<FilterPool> {
        self.inner
            .filters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The read-only catalog filters see.
    fn filter_catalog(&self) -> Arc<dyn FilterHost> {
        Arc::new(FilterCatalog {
            servers: self.inner.servers.clone(),
            code: None,
        })
    }

    /// The catalog code mode sees: the filters' catalog plus mutating tools and the watch
    /// built-ins (`watch_start`, `watch_stop`, `watch_list`).
    pub fn code_catalog(&self) -> Arc<dyn FilterHost> {
        Arc::new(FilterCatalog {
            servers: self.inner.servers.clone(),
            code: Some(self.clone()),
        })
    }

    /// Checks `on_event` before any subscription is made: it must be source text, it must
    /// compile, and a dry run on a sample event must not hit a NameError (missing keys in the
    /// sample are fine).
    async fn validate_filter(&self, name: &str, uri: &str, code: &str) -> Result<(), WatchError> {
        let trimmed = code.trim();
        if trimmed.is_empty() {
            return Err(WatchError::Invalid(
                "on_event is empty; pass Python source text or no on_event".into(),
            ));
        }
        if trimmed.starts_with("<function")
            || trimmed.starts_with("<bound method")
            || trimmed.starts_with("<lambda")
        {
            return Err(WatchError::Invalid(format!(
                "on_event must be Python source text, not a function object ({}); pass the code itself as a string",
                trimmed.lines().next().unwrap_or_default()
            )));
        }
        let Some(pool) = self.filters() else {
            return Err(WatchError::Invalid(
                "this watch client runs no Python filters".into(),
            ));
        };
        let n = self.inner.validations.fetch_add(1, Ordering::Relaxed);
        let scope = format!("\u{0}validate:{name}:{n}");
        let sample = json!({"watch": name, "uri": uri, "type": "ADDED", "seq": 1, "key": "sample",
            "object": {"metadata": {"name": "sample", "namespace": "default", "uid": "sample"}},
            "new": {}, "item": {}, "old": null, "changed": []});
        let r = pool.run(&scope, code, sample, self.filter_catalog()).await;
        pool.drop_scope(&scope).await;
        match r {
            Err(FilterError::Python(e))
                if e.exc_type == "SyntaxError" || e.exc_type == "NameError" =>
            {
                Err(WatchError::Invalid(format!(
                    "on_event failed its dry run on a sample event: {e}"
                )))
            }
            Err(FilterError::Worker(e)) => Err(WatchError::Unavailable(format!(
                "on_event could not be dry-run: {e}"
            ))),
            _ => Ok(()),
        }
    }

    pub fn servers(&self) -> &[Arc<Server>] {
        &self.inner.servers
    }

    /// Starts watching `uri` as `name`: subscribes, takes the baseline read (so a server that
    /// rejects the URI fails this call), then runs the watch in the background.
    pub async fn watch_start(
        &self,
        name: &str,
        uri: &str,
        on_event: Option<&str>,
    ) -> Result<WatchInfo, WatchError> {
        self.start(name, uri, on_event, true).await
    }

    async fn start(
        &self,
        name: &str,
        uri: &str,
        on_event: Option<&str>,
        save: bool,
    ) -> Result<WatchInfo, WatchError> {
        let inner = &self.inner;
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(WatchError::Invalid(
                "a watch name must be 1 to 128 printable characters".into(),
            ));
        }
        if uri.is_empty() {
            return Err(WatchError::Invalid("the URI must not be empty".into()));
        }
        {
            let watches = inner.watches.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = watches.get(name)
                && e.is_running()
            {
                return Err(WatchError::Invalid(format!(
                    "a watch named {name} already exists (on {}); stop it first or pick another name",
                    e.spec.uri
                )));
            }
            if running(&watches, name) >= inner.cfg.max_watches {
                return Err(over_limit(inner.cfg.max_watches));
            }
        }
        // Make sure every server has been asked what it lists before routing.
        for s in &inner.servers {
            let known = s
                .catalog
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .subscribe
                // Held means a connect is under way elsewhere: do not queue behind it here.
                || s.conn.try_lock().map(|c| c.is_some()).unwrap_or(true);
            if !known {
                let _ = s.connection().await;
            }
        }
        let server = route(&inner.servers, uri).cloned().ok_or_else(|| {
            WatchError::Unavailable(format!(
                "no connected server lists {uri}, has a matching template, or supports subscriptions"
            ))
        })?;
        if let Some(code) = on_event {
            self.validate_filter(name, uri, code).await?;
        }
        let (conn, sub, read) = subscribe_and_read(&server, uri).await?;
        let shape = if read.mime == EVENT_LOG_MIME {
            Shape::EventLog
        } else {
            Shape::State
        };
        let baseline = match shape {
            Shape::State => Baseline::State(StateBase::new(read.text)),
            Shape::EventLog => {
                let body: Value =
                    serde_json::from_str(&read.text).map_err(|e| WatchError::Rejected {
                        server: server.target.to_string(),
                        uri: uri.into(),
                        message: format!("its event log is not JSON: {e}"),
                    })?;
                let (_, cursor) =
                    extract_log(LogCursor::default(), &body).map_err(|m| WatchError::Rejected {
                        server: server.target.to_string(),
                        uri: uri.into(),
                        message: m,
                    })?;
                Baseline::Log(cursor)
            }
        };
        let spec = WatchSpec {
            name: name.into(),
            uri: uri.into(),
            on_event: on_event.map(str::to_owned),
        };
        let stats = Arc::new(Stats::default());
        let cancel = inner.shutdown.child_token();
        {
            let mut watches = inner.watches.lock().unwrap_or_else(|e| e.into_inner());
            // Re-check under the lock: another start may have raced us while we subscribed.
            if watches.get(name).is_some_and(Entry::is_running) {
                return Err(WatchError::Invalid(format!(
                    "a watch named {name} already exists; stop it first or pick another name"
                )));
            }
            if running(&watches, name) >= inner.cfg.max_watches {
                return Err(over_limit(inner.cfg.max_watches));
            }
            watches.insert(
                name.into(),
                Entry {
                    spec: spec.clone(),
                    shape: Some(shape),
                    stats: stats.clone(),
                    cancel: cancel.clone(),
                    restore_failed: false,
                },
            );
        }
        if save {
            self.save(&spec).await;
        }
        inner.log.emit(
            "watch.started",
            json!({"watch": name, "uri": uri, "shape": shape}),
        );
        inner.log.emit(
            "watch.subscribed",
            json!({"watch": name, "uri": uri, "server": server.target.to_string()}),
        );
        let task = WatchTask {
            mgr: self.clone(),
            server,
            spec: spec.clone(),
            stats: stats.clone(),
            cancel,
            debounce: Debounce::new(inner.cfg.debounce),
            dedupe: Dedupe::new(4096),
            scope_reset: false,
            filter_runs: 0,
            backlog: VecDeque::new(),
            backlog_dropped: 0,
            scope: format!(
                "{name}#{}",
                inner.validations.fetch_add(1, Ordering::Relaxed)
            ),
        };
        inner.tracker.spawn(task.run(conn, sub, baseline));
        Ok(WatchInfo {
            name: spec.name,
            uri: spec.uri,
            shape: Some(shape),
            events: 0,
            notices: 0,
            restore_failed: false,
            failed: false,
        })
    }

    /// Stops `name`. Returns whether it existed.
    pub async fn watch_stop(&self, name: &str) -> bool {
        let removed = self
            .inner
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        let Some(entry) = removed else {
            return false;
        };
        entry.cancel.cancel();
        if let Some(store) = &self.inner.store
            && let Err(e) = store.delete(Table::Watches, name).await
        {
            tracing::warn!(watch = name, error = %e, "could not remove the saved watch spec");
        }
        self.inner.log.emit(
            "watch.stopped",
            json!({"watch": name, "uri": entry.spec.uri}),
        );
        true
    }

    /// Every watch, by name.
    pub fn watch_list(&self) -> Vec<WatchInfo> {
        let watches = self.inner.watches.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<WatchInfo> = watches
            .values()
            .map(|e| WatchInfo {
                name: e.spec.name.clone(),
                uri: e.spec.uri.clone(),
                shape: e.shape,
                events: e.stats.events.load(Ordering::Relaxed),
                notices: e.stats.notices.load(Ordering::Relaxed),
                restore_failed: e.restore_failed,
                failed: e.stats.failed.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    async fn save(&self, spec: &WatchSpec) {
        if let Some(store) = &self.inner.store {
            let bytes = serde_json::to_vec(spec).unwrap_or_default();
            if let Err(e) = store.put(Table::Watches, &spec.name, bytes).await {
                tracing::warn!(watch = %spec.name, error = %e, "could not save the watch spec");
            }
        }
    }

    /// Restarts the watch specs saved in the store. Specs that can never start are dropped
    /// from the store; transient failures stay saved and listed with `restore_failed`.
    /// Emits one restore notice when anything was saved.
    pub async fn restore(&self) -> Vec<(WatchSpec, Result<(), WatchError>)> {
        let Some(store) = self.inner.store.clone() else {
            return Vec::new();
        };
        let saved = match store.scan(Table::Watches).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "could not read saved watch specs");
                return Vec::new();
            }
        };
        let mut results = Vec::new();
        let mut lines = Vec::new();
        for (key, bytes) in saved {
            let spec: WatchSpec = match serde_json::from_slice(&bytes) {
                Ok(s) => s,
                Err(e) => {
                    let _ = store.delete(Table::Watches, &key).await;
                    lines.push(format!("dropped {key}: unreadable saved spec ({e})"));
                    continue;
                }
            };
            let r = self
                .start(&spec.name, &spec.uri, spec.on_event.as_deref(), false)
                .await
                .map(|_| ());
            match &r {
                Ok(()) => lines.push(format!("restored {} ({})", spec.name, spec.uri)),
                Err(e) if e.is_transient() => {
                    lines.push(format!(
                        "restore failed, kept: {} ({}): {e}",
                        spec.name, spec.uri
                    ));
                    self.inner
                        .watches
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(spec.name.clone())
                        .or_insert_with(|| Entry {
                            spec: spec.clone(),
                            shape: None,
                            stats: Arc::new(Stats::default()),
                            cancel: CancellationToken::new(),
                            restore_failed: true,
                        });
                }
                Err(e) => {
                    let _ = store.delete(Table::Watches, &spec.name).await;
                    lines.push(format!("dropped {} ({}): {e}", spec.name, spec.uri));
                }
            }
            results.push((spec, r));
        }
        if !lines.is_empty() {
            self.inner.log.emit(
                "watch.restored",
                json!({
                    "restored": results.iter().filter(|(_, r)| r.is_ok()).count(),
                    "saved": results.len(),
                }),
            );
            lines.push(
                "changes made while herald was down may be missing: baselines are fresh".into(),
            );
            self.deliver(Notice::new("herald", "watch-state", lines))
                .await;
        }
        results
    }

    async fn deliver(&self, notice: Notice) {
        self.inner.log.emit(
            "watch.notice",
            json!({"watch": notice.watch, "uri": notice.uri, "lines": notice.lines}),
        );
        // Bounded: a slow sink makes watch tasks wait here, never grows a queue.
        let _ = self.inner.notices.send(notice).await;
    }

    /// Stops every watch, flushing what each has pending, and waits for their tasks.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(Duration::from_secs(5), self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some watches did not stop within 5 s");
        }
    }
}

enum Baseline {
    State(StateBase),
    Log(LogCursor),
}

struct Read {
    mime: String,
    text: String,
}

/// Bound on one request to a server (connect, listen, read, tool call).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

async fn read(conn: &Connection, server: &Server, uri: &str) -> Result<Read, WatchError> {
    let result = tokio::time::timeout(
        REQUEST_TIMEOUT,
        conn.read_resource(ReadResourceRequestParams::new(uri.to_owned())),
    )
    .await
    .map_err(|_| {
        WatchError::Unavailable(format!(
            "reading {uri} from {} took over {} s",
            server.target,
            REQUEST_TIMEOUT.as_secs()
        ))
    })?
    .map_err(|e| match e {
        // Bad params / not found are the server's verdict on the URI; anything else (an
        // internal error, a source still starting) may pass.
        rmcp::ServiceError::McpError(err) if matches!(err.code.0, -32602 | -32002 | -32601) => {
            WatchError::Rejected {
                server: server.target.to_string(),
                uri: uri.into(),
                message: err.message.to_string(),
            }
        }
        other => WatchError::Unavailable(format!("reading {uri} from {}: {other}", server.target)),
    })?;
    match result.contents.into_iter().next() {
        Some(ResourceContents::TextResourceContents {
            text, mime_type, ..
        }) => Ok(Read {
            mime: mime_type.unwrap_or_default(),
            text,
        }),
        Some(ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        }) => Ok(Read {
            mime: mime_type.unwrap_or_default(),
            text: blob,
        }),
        #[allow(unreachable_patterns)]
        Some(_) | None => Err(WatchError::Rejected {
            server: server.target.to_string(),
            uri: uri.into(),
            message: "the read returned no contents".into(),
        }),
    }
}

/// Listens first, then reads: a change between the two is then announced, never missed.
async fn subscribe_and_read(
    server: &Arc<Server>,
    uri: &str,
) -> Result<(Arc<Connection>, Subscription, Read), WatchError> {
    let conn = server.connection().await?;
    if !conn.is_modern() {
        server.reset(&conn).await;
        return Err(WatchError::Invalid(format!(
            "{} speaks MCP {}; watching needs protocol version 2026-07-28 (subscriptions/listen)",
            server.target,
            conn.protocol_version()
                .unwrap_or_else(|| "of an unknown version".into())
        )));
    }
    let listen = tokio::time::timeout(
        REQUEST_TIMEOUT,
        conn.listen(
            SubscriptionFilter::builder()
                .resource_subscription(uri)
                .build(),
        ),
    )
    .await
    .map_err(|_| {
        WatchError::Unavailable(format!(
            "{} did not acknowledge a subscription to {uri} within {} s",
            server.target,
            REQUEST_TIMEOUT.as_secs()
        ))
    })?;
    let sub = match listen {
        Ok(s) => s,
        Err(rmcp::ServiceError::McpError(e)) => {
            return Err(WatchError::Rejected {
                server: server.target.to_string(),
                uri: uri.into(),
                message: e.message.to_string(),
            });
        }
        Err(e) => {
            server.reset(&conn).await;
            return Err(WatchError::Unavailable(format!(
                "subscribing to {uri} on {}: {e}",
                server.target
            )));
        }
    };
    let accepted = sub
        .acknowledged()
        .resource_subscriptions
        .as_ref()
        .is_some_and(|u| u.iter().any(|a| a == uri));
    let r = read(&conn, server, uri).await;
    if let Err(WatchError::Unavailable(_)) = &r {
        server.reset(&conn).await;
    }
    let r = r?;
    if !accepted {
        return Err(WatchError::Rejected {
            server: server.target.to_string(),
            uri: uri.into(),
            message: "the server does not accept subscriptions to this URI".into(),
        });
    }
    Ok((conn, sub, r))
}

struct WatchTask {
    mgr: WatchManager,
    server: Arc<Server>,
    spec: WatchSpec,
    stats: Arc<Stats>,
    cancel: CancellationToken,
    debounce: Debounce,
    dedupe: Dedupe,
    /// The filter's scope was lost (its worker died); the next notice says so.
    scope_reset: bool,
    /// Filter runs so far; a fresh scope after the first means variables were lost.
    filter_runs: u64,
    /// This watch's scope in the filter workers: unique per start, dropped when it ends.
    scope: String,
    /// Events diffed but not yet filtered, with the time they arrived. Intake goes on while
    /// the filter runs; past [`FILTER_BACKLOG`] events the oldest are dropped and counted.
    backlog: VecDeque<(Event, std::time::Instant)>,
    /// Events dropped from a full backlog since the last notice said so.
    backlog_dropped: usize,
}

/// Events a watch holds for its filter while a run is in progress (ten full updates).
const FILTER_BACKLOG: usize = 1000;

/// One filter exchange in flight: its events and, when it ends, one result per event.
type FilterRun = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    Vec<(Event, std::time::Instant)>,
                    Vec<Result<FilterOutcome, FilterError>>,
                ),
            > + Send,
    >,
>;

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl WatchTask {
    async fn run(self, conn: Arc<Connection>, sub: Subscription, base: Baseline) {
        let mgr = self.mgr.clone();
        let scope = self.scope.clone();
        let filtered = self.spec.on_event.is_some();
        self.watch(conn, sub, base).await;
        // The watch is over: its filter's variables go with it.
        if filtered && let Some(pool) = mgr.filters() {
            pool.drop_scope(&scope).await;
        }
    }

    async fn watch(mut self, mut conn: Arc<Connection>, mut sub: Subscription, mut base: Baseline) {
        // The filter runs beside intake: notifications are read and diffed while a batch is
        // in the worker, and queue in `backlog` for the next one.
        let mut running: Option<FilterRun> = None;
        loop {
            if running.is_none() {
                running = self.next_filter_run();
            }
            let due = self.debounce.due();
            tokio::select! {
                _ = self.cancel.cancelled() => {
                    self.flush_all().await;
                    return;
                }
                (evs, results) = async { running.as_mut().expect("guarded").await }, if running.is_some() => {
                    running = None;
                    self.filtered(evs, results);
                }
                _ = sleep_until(due), if due.is_some() => {
                    if let Some(lines) = self.debounce.take_due(now()) {
                        self.emit(lines).await;
                    }
                }
                n = sub.next() => match n {
                    Ok(Some(ServerNotification::ResourceUpdatedNotification(u))) if u.params.uri == self.spec.uri => {
                        // Notifications are idempotent: one read covers every one already
                        // queued, so a slow moment never turns into a backlog of reads.
                        let mut ended = false;
                        while let Some(more) = futures::FutureExt::now_or_never(sub.next()) {
                            if !matches!(more, Ok(Some(_))) {
                                ended = true;
                                break;
                            }
                        }
                        match read(&conn, &self.server, &self.spec.uri).await {
                            Ok(r) => self.update(&mut base, r, running.is_some()),
                            Err(e) => {
                                // Treat it as a lost subscription: the resubscribe path re-reads
                                // and diffs, so the change is not lost.
                                tracing::warn!(watch = %self.spec.name, error = %e, "read after an update failed; resubscribing");
                                ended = true;
                            }
                        }
                        if ended {
                            drop(sub);
                            self.flush_all().await;
                            match self.resubscribe(&conn, "a read after an update failed or the stream ended").await {
                                Some((c, s, r)) => {
                                    conn = c;
                                    sub = s;
                                    self.update(&mut base, r, running.is_some());
                                }
                                None => return,
                            }
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        let why = match (&n, sub.end()) {
                            (Err(e), _) => format!("the subscription failed: {e}"),
                            (_, Some(SubscriptionEnd::Graceful(_))) => "the server ended the subscription".to_owned(),
                            (_, Some(SubscriptionEnd::Lagged { .. })) => "notifications were not read in time".to_owned(),
                            (_, Some(SubscriptionEnd::Cancelled)) => "the subscription was cancelled".to_owned(),
                            _ => "the connection to the server was lost".to_owned(),
                        };
                        drop(sub);
                        self.flush_all().await;
                        match self.resubscribe(&conn, &why).await {
                            Some((c, s, r)) => {
                                conn = c;
                                sub = s;
                                // The re-read is diffed against the last state (or cursor), so
                                // changes made while unsubscribed are reported now.
                                self.update(&mut base, r, running.is_some());
                            }
                            None => return,
                        }
                    }
                },
            }
        }
    }

    async fn resubscribe(
        &mut self,
        failed: &Arc<Connection>,
        why: &str,
    ) -> Option<(Arc<Connection>, Subscription, Read)> {
        let cfg = &self.mgr.inner.cfg;
        let log = &self.mgr.inner.log;
        // Other watches may share this connection: drop it only when it is really gone. A
        // subscription that ended on a live connection (server-side end, lag) is re-listened
        // at once on the same connection.
        let live = !failed.is_closed();
        if !live {
            self.server.reset(failed).await;
        }
        let mut last_error = String::from(why);
        for attempt in 0..cfg.resubscribe_attempts {
            let delay = if live && attempt == 0 {
                Duration::ZERO
            } else {
                cfg.resubscribe_base * 2u32.saturating_pow(attempt)
            };
            log.emit(
                "watch.resubscribing",
                json!({"watch": self.spec.name, "uri": self.spec.uri, "attempt": attempt + 1,
                       "delay_ms": delay.as_millis() as u64, "reason": last_error}),
            );
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            match subscribe_and_read(&self.server, &self.spec.uri).await {
                Ok(ok) => {
                    log.emit(
                        "watch.subscribed",
                        json!({"watch": self.spec.name, "uri": self.spec.uri,
                               "server": self.server.target.to_string(), "attempt": attempt + 1}),
                    );
                    return Some(ok);
                }
                Err(e) => last_error = e.to_string(),
            }
        }
        self.stats.failed.store(true, Ordering::Relaxed);
        log.emit(
            "watch.failed",
            json!({"watch": self.spec.name, "uri": self.spec.uri,
                   "attempts": cfg.resubscribe_attempts, "error": last_error}),
        );
        let line = format!(
            "watch failed: the subscription ended and {} resubscribe attempts failed (last error: {last_error}); start it again with watch_start",
            cfg.resubscribe_attempts
        );
        self.stats.notices.fetch_add(1, Ordering::Relaxed);
        self.mgr
            .deliver(Notice::new(&self.spec.name, &self.spec.uri, vec![line]))
            .await;
        None
    }

    /// Diffs one read against the baseline; `filtering` says a filter run is in progress.
    fn update(&mut self, base: &mut Baseline, r: Read, filtering: bool) {
        let events: Vec<Event> = match base {
            Baseline::State(old) => {
                let new = StateBase::new(r.text);
                let evs = diff_reads(old, &new);
                *old = new;
                evs
            }
            Baseline::Log(cursor) => match serde_json::from_str::<Value>(&r.text)
                .map_err(|e| e.to_string())
                .and_then(|body| extract_log(*cursor, &body))
            {
                Ok((evs, c)) => {
                    *cursor = c;
                    evs
                }
                Err(e) => {
                    tracing::warn!(watch = %self.spec.name, error = %e, "unreadable event log");
                    Vec::new()
                }
            },
        };
        let max = self.mgr.inner.cfg.max_events_per_update;
        let total = events.len();
        let t = now();
        let mut evs: Vec<Event> = events.into_iter().take(max).collect();
        for ev in &mut evs {
            self.stats.events.fetch_add(1, Ordering::Relaxed);
            ev.insert("watch".into(), self.spec.name.clone().into());
            ev.insert("uri".into(), self.spec.uri.clone().into());
        }
        if total > max {
            self.debounce.push(
                format!(
                    "+{} more events in this update were not processed (limit {max})",
                    total - max
                ),
                t,
            );
        }
        if self.spec.on_event.is_some() && self.mgr.filters().is_some() {
            // Filtered events wait for the filter stage (see `watch`); intake goes on.
            self.mgr.inner.log.emit(
                "watch.update",
                json!({"watch": self.spec.name, "events": evs.len(), "filtering": filtering,
                       "queued": self.backlog.len() + evs.len()}),
            );
            for ev in evs {
                if self.backlog.len() == FILTER_BACKLOG {
                    self.backlog.pop_front();
                    self.backlog_dropped += 1;
                }
                self.backlog.push_back((ev, t));
            }
            return;
        }
        for ev in evs {
            let line = default_line(&ev);
            self.admit(&ev, Some(line), t);
        }
    }

    /// Starts the filter on the backlog, when there is one: the whole backlog (up to one
    /// update's worth) goes to the worker in one exchange, and each event keeps its own limits.
    fn next_filter_run(&mut self) -> Option<FilterRun> {
        if self.backlog.is_empty() {
            return None;
        }
        let (Some(code), Some(pool)) = (self.spec.on_event.clone(), self.mgr.filters()) else {
            return None;
        };
        let n = self
            .backlog
            .len()
            .min(self.mgr.inner.cfg.max_events_per_update.max(1));
        let evs: Vec<(Event, std::time::Instant)> = self.backlog.drain(..n).collect();
        let scope = self.scope.clone();
        let catalog = self.mgr.filter_catalog();
        Some(Box::pin(async move {
            let batch: Vec<Value> = evs.iter().map(|(e, _)| Value::Object(e.clone())).collect();
            let results = match pool.run_batch(&scope, &code, batch, catalog).await {
                Ok(results) => results,
                Err(e) => vec![Err(e); evs.len()],
            };
            (evs, results)
        }))
    }

    /// Turns one filter exchange's results into notice lines.
    fn filtered(
        &mut self,
        evs: Vec<(Event, std::time::Instant)>,
        results: Vec<Result<FilterOutcome, FilterError>>,
    ) {
        let mut results = results.into_iter();
        for (ev, t) in evs {
            self.filter_runs += 1;
            let line = match results.next() {
                Some(Ok(o)) => {
                    if o.fresh_scope && self.filter_runs > 1 {
                        self.scope_reset = true;
                    }
                    let mut parts = Vec::new();
                    let printed = o.printed.trim_end();
                    if !printed.is_empty() {
                        parts.push(printed.to_owned());
                    }
                    match &o.value {
                        Value::Null => {}
                        Value::String(s) => parts.push(s.clone()),
                        other => parts.push(other.to_string()),
                    }
                    (!parts.is_empty()).then(|| parts.join(" "))
                }
                Some(Err(FilterError::Python(e))) => Some(format!("on_event raised {e}")),
                Some(Err(FilterError::Worker(e))) => {
                    self.scope_reset = true;
                    Some(format!("on_event failed: {e}"))
                }
                None => {
                    Some("on_event failed: the filter worker gave no result for this event".into())
                }
            };
            self.admit(&ev, line, t);
        }
        if self.backlog_dropped > 0 {
            let n = std::mem::take(&mut self.backlog_dropped);
            self.debounce.push(
                format!(
                    "+{n} events were dropped while the filter was busy (at most {FILTER_BACKLOG} wait for it)"
                ),
                now(),
            );
        }
    }

    /// Dedupes and debounces one event's notice line; `None` means the filter dropped it.
    fn admit(&mut self, ev: &Event, line: Option<String>, t: std::time::Instant) {
        let log = &self.mgr.inner.log;
        let Some(line) = line else {
            log.emit(
                "watch.event",
                json!({"watch": self.spec.name, "type": ev.get("type"), "kept": false, "reason": "filter"}),
            );
            return;
        };
        let mut line = sanitize_line(&line);
        if !line.starts_with("on_event failed") && std::mem::take(&mut self.scope_reset) {
            line = format!("{line} (the filter's variables were reset before this event)");
        }
        let fresh = self.dedupe.admit(&object_key(ev), &line);
        log.emit(
            "watch.event",
            json!({"watch": self.spec.name, "type": ev.get("type"), "kept": fresh,
                   "reason": if fresh { Value::Null } else { "duplicate".into() }}),
        );
        if fresh {
            self.debounce.push(line, t);
        }
    }

    async fn emit(&mut self, lines: Vec<String>) {
        if lines.is_empty() {
            return;
        }
        self.stats.notices.fetch_add(1, Ordering::Relaxed);
        self.mgr
            .deliver(Notice::new(&self.spec.name, &self.spec.uri, lines))
            .await;
    }

    async fn flush_all(&mut self) {
        let lines = self.debounce.take();
        self.emit(lines).await;
    }
}

async fn sleep_until(due: Option<std::time::Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

/// What filters may call: `read_resource`, `list_resources`, and the read-only tools of the
/// connected servers. Mutating tools and the watch built-ins are named too, so that calling
/// one raises a clear `PermissionError` instead of a `NameError`.
struct FilterCatalog {
    servers: Vec<Arc<Server>>,
    /// Set in code mode: mutating tools and the watch built-ins are allowed.
    code: Option<WatchManager>,
}

const WATCH_BUILTINS: [&str; 3] = ["watch_start", "watch_stop", "watch_list"];

fn py_err(kind: PyExc, message: String) -> HostError {
    HostError::new(kind, message)
}

#[async_trait::async_trait]
impl FilterHost for FilterCatalog {
    fn functions(&self) -> Vec<String> {
        let mut names: Vec<String> = vec!["read_resource".into(), "list_resources".into()];
        names.extend(WATCH_BUILTINS.iter().map(|s| s.to_string()));
        for s in &self.servers {
            let c = s.catalog.lock().unwrap_or_else(|e| e.into_inner());
            names.extend(c.tools.iter().map(|(n, _)| n.clone()));
        }
        names.sort();
        names.dedup();
        names
    }

    async fn call(
        &self,
        name: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Value, HostError> {
        if let Some(mgr) = &self.code
            && WATCH_BUILTINS.contains(&name)
        {
            let arg = |k: &str, i: usize| kwargs.get(k).or_else(|| args.get(i)).cloned();
            return match name {
                "watch_start" => {
                    let (Some(Value::String(n)), Some(Value::String(u))) =
                        (arg("name", 0), arg("uri", 1))
                    else {
                        return Err(py_err(
                            PyExc::ValueError,
                            "watch_start needs name=\"...\" and uri=\"...\"".into(),
                        ));
                    };
                    let on_event = match arg("on_event", 2) {
                        None | Some(Value::Null) => None,
                        Some(Value::String(code)) => Some(code),
                        Some(other) => {
                            return Err(py_err(
                                PyExc::TypeError,
                                format!(
                                    "on_event must be Python source text (a str), not {other}; pass the code as a string"
                                ),
                            ));
                        }
                    };
                    let info = mgr
                        .watch_start(&n, &u, on_event.as_deref())
                        .await
                        .map_err(|e| py_err(PyExc::ValueError, e.to_string()))?;
                    Ok(json!({"name": info.name, "uri": info.uri, "shape": info.shape}))
                }
                "watch_stop" => {
                    let Some(Value::String(n)) = arg("name", 0) else {
                        return Err(py_err(
                            PyExc::ValueError,
                            "watch_stop needs name=\"...\"".into(),
                        ));
                    };
                    Ok(Value::Bool(mgr.watch_stop(&n).await))
                }
                _ => Ok(serde_json::to_value(mgr.watch_list()).unwrap_or_default()),
            };
        }
        if WATCH_BUILTINS.contains(&name) {
            return Err(py_err(
                PyExc::PermissionError,
                format!(
                    "{name} is not available in filters: a filter cannot start or stop watches"
                ),
            ));
        }
        match name {
            "read_resource" => {
                let uri = kwargs
                    .get("uri")
                    .or_else(|| args.first())
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        py_err(PyExc::ValueError, "read_resource needs uri=\"...\"".into())
                    })?;
                let server = route(&self.servers, uri).cloned().ok_or_else(|| {
                    py_err(
                        PyExc::ValueError,
                        format!("no connected server serves {uri}"),
                    )
                })?;
                let conn = server
                    .connection()
                    .await
                    .map_err(|e| py_err(PyExc::RuntimeError, e.to_string()))?;
                let r = read(&conn, &server, uri)
                    .await
                    .map_err(|e| py_err(PyExc::RuntimeError, e.to_string()))?;
                Ok(serde_json::from_str(&r.text).unwrap_or(Value::String(r.text)))
            }
            "list_resources" => {
                let mut all = Vec::new();
                for s in &self.servers {
                    let c = s.catalog.lock().unwrap_or_else(|e| e.into_inner());
                    all.extend(c.listing.iter().cloned());
                }
                Ok(Value::Array(all))
            }
            tool => {
                let owner = self.servers.iter().find_map(|s| {
                    let c = s.catalog.lock().unwrap_or_else(|e| e.into_inner());
                    c.tools
                        .iter()
                        .find(|(n, _)| n == tool)
                        .map(|(_, ro)| (s.clone(), *ro))
                });
                let Some((server, read_only)) = owner else {
                    return Err(py_err(
                        PyExc::ValueError,
                        format!("no connected server has a tool named {tool}"),
                    ));
                };
                if !read_only && self.code.is_none() {
                    return Err(py_err(
                        PyExc::PermissionError,
                        format!(
                            "{tool} is a mutating tool (not annotated readOnlyHint): filters are read-only"
                        ),
                    ));
                }
                if !args.is_empty() {
                    return Err(py_err(
                        PyExc::ValueError,
                        format!("call {tool} with keyword arguments, e.g. {tool}(name=...)"),
                    ));
                }
                let conn = server
                    .connection()
                    .await
                    .map_err(|e| py_err(PyExc::RuntimeError, e.to_string()))?;
                let params =
                    rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(kwargs);
                let r = tokio::time::timeout(REQUEST_TIMEOUT, conn.call_tool(params))
                    .await
                    .map_err(|_| py_err(PyExc::TimeoutError, format!("{tool} took too long")))?
                    .map_err(|e| py_err(PyExc::RuntimeError, e.to_string()))?;
                let text: Vec<String> = r
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                    .collect();
                if r.is_error == Some(true) {
                    return Err(py_err(
                        PyExc::RuntimeError,
                        format!("{tool} failed: {}", text.join(" ")),
                    ));
                }
                if let Some(v) = r.structured_content {
                    return Ok(v);
                }
                let text = text.join("\n");
                Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
            }
        }
    }
}
