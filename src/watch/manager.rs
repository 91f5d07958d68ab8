//! [`WatchManager`]: the watch client's front door. It starts, stops and lists watches (at
//! most `max_watches` at once, names unique), routes each URI to a server by the shared rule
//! ([`crate::upstream::route`]), dry-runs a watch's filter before subscribing, saves and
//! restores specs (`--watch-state`), and hands every notice to one bounded channel. Each
//! running watch is a `WatchTask` (`task.rs`), or for a task a follower (`follow.rs`), given
//! only a `WatchHandle` (`handle.rs`): none of them knows the manager. Code mode's watch
//! built-ins reach it as the catalog's `Watches`. Saving and restoring specs is
//! `manager/saved.rs`; the tests are `manager_tests.rs`.
//!
//! It knows nothing about where notices go: the channel's receiver (a sink, later the agent)
//! decides.

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{ClientRequest, DetailedTask, GetTaskParams, ServerResult};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::filter::pool::{Catalog as FilterHost, FilterPool};
use crate::mcp::ring::EVENT_LOG_MIME;
use crate::mcp::tasks::relay::Relayed;
use crate::runtime::status::{StatusBoard, WatchReport, WatchState};
use crate::store::{Store, Table};
use crate::upstream::log::{LogCursor, extract_log};
use crate::upstream::{REQUEST_TIMEOUT, Upstream, pick};
use crate::watch::events::StateBase;
use crate::watch::filter_catalog::{FilterCatalog, Watches};
use crate::watch::follow::{self, task_id};
use crate::watch::handle::{Stats, WatchHandle};
use crate::watch::log::WatchLog;
use crate::watch::spec::{Notice, Shape, WatchConfig, WatchError, WatchInfo, WatchSpec};
use crate::watch::task::{Baseline, WatchTask, events_uri, subscribe_and_read};

mod events;
mod kept;
mod saved;

struct Entry {
    spec: WatchSpec,
    shape: Option<Shape>,
    /// The server it runs on (`""` for a restore that failed).
    server: String,
    stats: Arc<Stats>,
    cancel: CancellationToken,
    restore_failed: bool,
}

impl Entry {
    /// A watch that holds a slot: not a kept-but-failed restore, not a failed watch, not a
    /// kept watch still trying to start.
    fn is_running(&self) -> bool {
        !self.restore_failed
            && !self.stats.failed.load(Ordering::Relaxed)
            && !self.stats.starting.load(Ordering::Relaxed)
    }

    /// Whether a start of `name` must leave this entry be: it runs, or it is a kept watch
    /// still trying (other than `keeper`'s own placeholder, which its start replaces).
    fn taken(&self, keeper: Option<&Keeper>) -> bool {
        self.state() != WatchState::Failed && !keeper.is_some_and(|k| k.owns(self))
    }

    fn state(&self) -> WatchState {
        if self.stats.starting.load(Ordering::Relaxed) {
            WatchState::Starting
        } else if self.is_running() {
            WatchState::Running
        } else {
            WatchState::Failed
        }
    }
}

/// A kept watch's start (`kept.rs`): the token it ends with, and the counters of its
/// placeholder entry (listed as starting), which its start replaces.
pub(super) struct Keeper<'a> {
    pub(super) token: &'a CancellationToken,
    pub(super) placeholder: Option<&'a Arc<Stats>>,
}

impl Keeper<'_> {
    /// Whether `e` is this kept watch's own placeholder.
    fn owns(&self, e: &Entry) -> bool {
        self.placeholder.is_some_and(|p| Arc::ptr_eq(p, &e.stats))
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

pub(super) struct Inner {
    /// What the running watches share with the manager: config, log, notice channel, filter
    /// pool and catalog, and the wake-up of whoever waits on the watch list.
    pub(super) handle: Arc<WatchHandle>,
    servers: Vec<Arc<Upstream>>,
    watches: Mutex<HashMap<String, Entry>>,
    store: Option<Store>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    validations: AtomicU64,
    /// Set once any watch has started: [`WatchManager::all_ended`] waits for that first.
    started: std::sync::atomic::AtomicBool,
    /// Where this manager's specs sit in the store's watch table: `""` for `herald watch`,
    /// [`AGENT_STATE`] for the agent's (so neither restores nor clears the other's).
    prefix: String,
}

/// How a watch client's watches came to run no more ([`WatchManager::none_running`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// None is left: each was stopped, or ended with its task.
    Ended,
    /// Those left do not run.
    Failed(Vec<Failed>),
}

/// A listed watch that does not run, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    pub name: String,
    pub uri: String,
    pub reason: String,
}

/// The store key prefix of the agent's saved watches (a control character no watch name has).
pub const AGENT_STATE: &str = "agent\u{1f}";

/// The watch manager. Cheap to clone.
#[derive(Clone)]
pub struct WatchManager {
    pub(super) inner: Arc<Inner>,
}

impl WatchManager {
    /// A manager over `servers`. Notices go to `notices`; with `store`, watch specs are saved
    /// on every start and stop (`--watch-state`).
    pub fn new(
        cfg: WatchConfig,
        servers: Vec<Arc<Upstream>>,
        notices: mpsc::Sender<Notice>,
        log: WatchLog,
        store: Option<Store>,
    ) -> WatchManager {
        WatchManager::with_prefix(cfg, servers, notices, log, store, "")
    }

    /// [`WatchManager::new`] keeping its specs under `prefix` in the store.
    pub fn with_prefix(
        cfg: WatchConfig,
        servers: Vec<Arc<Upstream>>,
        notices: mpsc::Sender<Notice>,
        log: WatchLog,
        store: Option<Store>,
        prefix: &str,
    ) -> WatchManager {
        let catalog = Arc::new(FilterCatalog {
            servers: servers.clone(),
            code: None,
        });
        WatchManager {
            inner: Arc::new(Inner {
                handle: Arc::new(WatchHandle::new(cfg, log, notices, catalog)),
                servers,
                watches: Mutex::new(HashMap::new()),
                store,
                tracker: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                validations: AtomicU64::new(0),
                started: std::sync::atomic::AtomicBool::new(false),
                prefix: prefix.to_owned(),
            }),
        }
    }

    /// Connects to every server once, so routing knows what they list. Failures are
    /// returned per server; they are retried when a watch needs that server.
    pub async fn connect_all(&self) -> Vec<(String, WatchError)> {
        let mut failed = Vec::new();
        for s in &self.inner.servers {
            if let Err(e) = s.connect().await {
                failed.push((s.name.clone(), WatchError::connect_failed(e)));
            }
        }
        failed
    }

    /// Lets watches run `on_event` filters in this pool's workers.
    pub fn set_filters(&self, pool: FilterPool) {
        self.inner.handle.set_filters(pool);
    }

    /// Whether watches may run `on_event` filters (a pool is set).
    pub fn has_filters(&self) -> bool {
        self.inner.handle.filters().is_some()
    }

    /// The catalog code mode sees: the filters' catalog plus mutating tools and the watch
    /// built-ins (`watch_start`, `watch_stop`, `watch_list`).
    pub fn code_catalog(&self) -> Arc<dyn FilterHost> {
        Arc::new(FilterCatalog {
            servers: self.inner.servers.clone(),
            code: Some(Arc::new(self.clone())),
        })
    }

    /// Checks `on_event` before any subscription is made ([`crate::watch::check::dry_run`]).
    async fn validate_filter(&self, name: &str, uri: &str, code: &str) -> Result<(), WatchError> {
        crate::watch::check::text(code)?;
        let Some(pool) = self.inner.handle.filters() else {
            return Err(WatchError::Invalid(
                "this watch client runs no Python filters".into(),
            ));
        };
        let n = self.inner.validations.fetch_add(1, Ordering::Relaxed);
        let scope = format!("\u{0}validate:{name}:{n}");
        let catalog = self.inner.handle.filter_catalog();
        crate::watch::check::dry_run(&pool, catalog, &scope, name, uri, code).await
    }

    pub fn servers(&self) -> &[Arc<Upstream>] {
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
        self.start(name, uri, on_event, true, None).await
    }

    /// Starts a watch: saved with `save`; `kept` (a kept watch's, see `kept.rs`) makes it
    /// resubscribe for as long as it is not stopped, and ends it with that token.
    async fn start(
        &self,
        name: &str,
        uri: &str,
        on_event: Option<&str>,
        save: bool,
        kept: Option<&Keeper<'_>>,
    ) -> Result<WatchInfo, WatchError> {
        let inner = &self.inner;
        self.room_for(name, uri, kept)?;
        if let Some(id) = task_id(uri) {
            return self.start_task(name, uri, id, on_event, save).await;
        }
        if let Some(parsed) = events_uri(uri) {
            let (event, arguments) = parsed?;
            return self
                .start_events(name, uri, event, arguments, on_event, save, kept)
                .await;
        }
        // Make sure every server has been asked what it lists before routing.
        for s in &inner.servers {
            let known = s.catalog().is_some_and(|c| c.subscribe)
                || s.is_connected()
                // A connect under way elsewhere: do not queue behind it here.
                || s.connecting();
            if !known {
                let _ = s.connect().await;
            }
        }
        let server = pick(&inner.servers, uri)
            .cloned()
            .ok_or_else(|| no_server_for(&inner.servers, uri))?;
        if let Some(code) = on_event {
            self.validate_filter(name, uri, code).await?;
        }
        let (listening, read) = subscribe_and_read(&server, uri).await?;
        let shape = if read.mime == EVENT_LOG_MIME {
            Shape::EventLog
        } else {
            Shape::State
        };
        let baseline = match shape {
            Shape::State | Shape::Task | Shape::Events => {
                Baseline::State(StateBase::new(read.text))
            }
            Shape::EventLog => {
                let body: Value =
                    serde_json::from_str(&read.text).map_err(|e| WatchError::Rejected {
                        server: server.name.clone(),
                        uri: uri.into(),
                        message: format!("its event log is not JSON: {e}"),
                    })?;
                let (_, cursor) =
                    extract_log(LogCursor::default(), &body).map_err(|m| WatchError::Rejected {
                        server: server.name.clone(),
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
        let (stats, cancel) = self.enter(&spec, shape, &server.name, kept)?;
        if save {
            self.save(&spec).await;
        }
        inner.handle.log.emit(
            "watch.started",
            json!({"watch": name, "uri": uri, "shape": shape}),
        );
        inner.handle.log.emit(
            "watch.subscribed",
            json!({"watch": name, "uri": uri, "server": server.name}),
        );
        let scope = format!(
            "{name}#{}",
            inner.validations.fetch_add(1, Ordering::Relaxed)
        );
        let task = WatchTask::new(
            inner.handle.clone(),
            server,
            spec.clone(),
            stats.clone(),
            cancel,
            scope,
            kept.is_some(),
        );
        inner.tracker.spawn(task.run(listening, baseline));
        Ok(WatchInfo {
            name: spec.name,
            uri: spec.uri,
            shape: Some(shape),
            events: 0,
            notices: 0,
            restore_failed: false,
            failed: false,
            starting: false,
        })
    }

    /// Whether a watch `name` on `uri` may start: a valid name not in use, and room.
    fn room_for(&self, name: &str, uri: &str, kept: Option<&Keeper>) -> Result<(), WatchError> {
        let inner = &self.inner;
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(WatchError::Invalid(
                "a watch name must be 1 to 128 printable characters".into(),
            ));
        }
        if uri.is_empty() {
            return Err(WatchError::Invalid("the URI must not be empty".into()));
        }
        let watches = inner.watches.locked();
        if let Some(e) = watches.get(name)
            && e.taken(kept)
        {
            return Err(WatchError::Invalid(format!(
                "a watch named {name} already exists (on {}{}); stop it first or pick another name",
                e.spec.uri,
                if e.state() == WatchState::Starting {
                    ", trying to start"
                } else {
                    ""
                }
            )));
        }
        if running(&watches, name) >= inner.handle.cfg.max_watches {
            return Err(over_limit(inner.handle.cfg.max_watches));
        }
        Ok(())
    }

    /// Enters a started watch in the list, its counters and its cancel token (`kept`'s, for
    /// a kept watch): the name and the limit are checked again under the lock (another start
    /// may have raced this one while it subscribed, or a stop the kept watch's start).
    fn enter(
        &self,
        spec: &WatchSpec,
        shape: Shape,
        server: &str,
        kept: Option<&Keeper<'_>>,
    ) -> Result<(Arc<Stats>, CancellationToken), WatchError> {
        let inner = &self.inner;
        let name = spec.name.as_str();
        let stats = Arc::new(Stats::default());
        let cancel = kept
            .map(|k| k.token.clone())
            .unwrap_or_else(|| inner.shutdown.child_token());
        {
            let mut watches = inner.watches.locked();
            // `watch_stop` cancels under this lock: a stopped kept watch stays stopped.
            if cancel.is_cancelled() {
                return Err(WatchError::Invalid(format!("watch {name} was stopped")));
            }
            if watches.get(name).is_some_and(|e| e.taken(kept)) {
                return Err(WatchError::Invalid(format!(
                    "a watch named {name} already exists; stop it first or pick another name"
                )));
            }
            if running(&watches, name) >= inner.handle.cfg.max_watches {
                return Err(over_limit(inner.handle.cfg.max_watches));
            }
            // What it replaces (a failed watch, a restore kept after failing) ends for good;
            // a kept watch's own placeholder shares its token, which lives on.
            if let Some(old) = watches.get(name)
                && !kept.is_some_and(|k| k.owns(old))
            {
                old.cancel.cancel();
            }
            watches.insert(
                name.into(),
                Entry {
                    spec: spec.clone(),
                    shape: Some(shape),
                    server: server.to_owned(),
                    stats: stats.clone(),
                    cancel: cancel.clone(),
                    restore_failed: false,
                },
            );
        }
        inner.started.store(true, Ordering::Release);
        Ok((stats, cancel))
    }

    /// Starts watching task `id` (`uri` is `task://ID`) as `name`: finds the server that
    /// knows it (a `tasks/get` on each, in order), then follows its pushes in the background.
    async fn start_task(
        &self,
        name: &str,
        uri: &str,
        id: &str,
        on_event: Option<&str>,
        save: bool,
    ) -> Result<WatchInfo, WatchError> {
        let inner = &self.inner;
        if id.is_empty() {
            return Err(WatchError::Invalid(
                "task://ID needs the task's id (herald call --task prints it)".into(),
            ));
        }
        if on_event.is_some() {
            return Err(WatchError::Invalid(
                "a task watch takes no on_event filter: it notices each status change of the task"
                    .into(),
            ));
        }
        let (server, first) = self.find_task(id).await?;
        let relayed = Relayed::new();
        relayed.offer(first);
        let spec = WatchSpec {
            name: name.into(),
            uri: uri.into(),
            on_event: None,
        };
        let (stats, cancel) = self.enter(&spec, Shape::Task, &server.name, None)?;
        if save {
            self.save(&spec).await;
        }
        inner.handle.log.emit(
            "watch.started",
            json!({"watch": name, "uri": uri, "shape": Shape::Task, "server": server.name}),
        );
        let follower = follow::run(
            inner.handle.clone(),
            server,
            spec.clone(),
            id.to_owned(),
            stats.clone(),
            cancel,
            relayed,
        );
        let manager = self.clone();
        let name = spec.name.clone();
        inner.tracker.spawn(async move {
            if follower.await {
                manager.ended(&name, &stats).await;
            }
        });
        Ok(WatchInfo {
            name: spec.name,
            uri: spec.uri,
            shape: Some(Shape::Task),
            events: 0,
            notices: 0,
            restore_failed: false,
            failed: false,
            starting: false,
        })
    }

    /// The server that knows task `id`, and the task's state there.
    async fn find_task(&self, id: &str) -> Result<(Arc<Upstream>, DetailedTask), WatchError> {
        let mut down = None;
        for s in &self.inner.servers {
            let get = ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(
                GetTaskParams::new(id.to_owned()),
            ));
            match s.tasks_request(get, REQUEST_TIMEOUT, None).await {
                Ok(ServerResult::GetTaskResult(r)) => return Ok((s.clone(), r.task)),
                Ok(_) => {}
                // Unknown there, or a server without tasks: ask the next.
                Err(e) if e.is_answered() => {}
                Err(e) => down = Some(e.to_string()),
            }
        }
        Err(match down {
            Some(m) => WatchError::Unavailable(m),
            None => WatchError::Invalid(format!(
                "no server knows task {id}: it is unknown, expired, or not yours"
            )),
        })
    }

    /// A watch that ended by itself (its task ended): it leaves the list and the saved state.
    async fn ended(&self, name: &str, stats: &Arc<Stats>) {
        let removed = {
            let mut watches = self.inner.watches.locked();
            // Only this watch: another may have taken the name since.
            match watches.get(name) {
                Some(e) if Arc::ptr_eq(&e.stats, stats) => watches.remove(name),
                _ => None,
            }
        };
        let Some(entry) = removed else { return };
        if let Some(store) = &self.inner.store
            && let Err(e) = store.delete(Table::Watches, &self.key(name)).await
        {
            tracing::warn!(watch = name, error = %e, "could not remove the saved watch spec");
        }
        self.inner
            .handle
            .log
            .emit("watch.ended", json!({"watch": name, "uri": entry.spec.uri}));
        self.inner.handle.changed();
    }

    /// Waits until a watch has run and none is left (each stopped, or ended by itself).
    pub async fn all_ended(&self) {
        self.wait_until(|watches, started| (started && watches.is_empty()).then_some(()))
            .await
    }

    /// Whether any watch was ever listed (started, or kept from a failed restore): before
    /// that, [`WatchManager::none_running`] waits.
    pub fn ever_listed(&self) -> bool {
        self.inner.started.load(Ordering::Acquire) || !self.inner.watches.locked().is_empty()
    }

    /// Waits until no watch runs, once one has been listed: [`Settled::Ended`] when none is
    /// left (each stopped, or ended with its task), else [`Settled::Failed`] with why each one
    /// left does not run (it failed for good, or its restore did).
    pub async fn none_running(&self) -> Settled {
        self.wait_until(|watches, started| {
            // A kept watch still trying to start is not settled.
            if watches.values().any(|e| e.state() != WatchState::Failed) {
                return None;
            }
            if watches.is_empty() {
                return started.then_some(Settled::Ended);
            }
            let mut failed: Vec<Failed> = watches
                .values()
                .map(|e| Failed {
                    name: e.spec.name.clone(),
                    uri: e.spec.uri.clone(),
                    reason: e.stats.reason().unwrap_or_else(|| "it failed".into()),
                })
                .collect();
            failed.sort_by(|a, b| a.name.cmp(&b.name));
            Some(Settled::Failed(failed))
        })
        .await
    }

    /// Waits until `done` says the watch list (and whether a watch ever started) is done.
    async fn wait_until<T>(&self, done: impl Fn(&HashMap<String, Entry>, bool) -> Option<T>) -> T {
        loop {
            let left = self.inner.handle.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            let now = {
                let watches = self.inner.watches.locked();
                done(&watches, self.inner.started.load(Ordering::Acquire))
            };
            if let Some(t) = now {
                return t;
            }
            left.await;
        }
    }

    /// How many watches run, and the servers they run on (each named once, sorted).
    pub fn running_on(&self) -> (usize, Vec<String>) {
        let watches = self.inner.watches.locked();
        let mut servers: Vec<String> = Vec::new();
        let mut n = 0;
        for e in watches.values().filter(|e| e.is_running()) {
            n += 1;
            if !servers.contains(&e.server) {
                servers.push(e.server.clone());
            }
        }
        servers.sort();
        (n, servers)
    }

    /// Stops `name`. Returns whether it existed.
    pub async fn watch_stop(&self, name: &str) -> bool {
        let removed = {
            let mut watches = self.inner.watches.locked();
            let removed = watches.remove(name);
            // Under the lock: a kept watch's start that enters after this sees it.
            if let Some(e) = &removed {
                e.cancel.cancel();
            }
            removed
        };
        let Some(entry) = removed else {
            return false;
        };
        if let Some(store) = &self.inner.store
            && let Err(e) = store.delete(Table::Watches, &self.key(name)).await
        {
            tracing::warn!(watch = name, error = %e, "could not remove the saved watch spec");
        }
        self.inner.handle.log.emit(
            "watch.stopped",
            json!({"watch": name, "uri": entry.spec.uri}),
        );
        self.inner.handle.changed();
        true
    }

    /// Every watch, by name.
    pub fn watch_list(&self) -> Vec<WatchInfo> {
        let watches = self.inner.watches.locked();
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
                starting: e.stats.starting.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Reports this manager's watches on `board` (the admin address's `/status`) for as long
    /// as the manager lives. `herald up` calls it from `watch::run`'s session.
    pub fn report_to(&self, board: &StatusBoard) {
        let weak = Arc::downgrade(&self.inner);
        board.set_watches(Box::new(move || {
            let inner = weak.upgrade()?;
            let watches = inner.watches.locked();
            let mut list: Vec<WatchReport> = watches
                .values()
                .map(|e| {
                    let state = e.state();
                    WatchReport {
                        name: e.spec.name.clone(),
                        uri: e.spec.uri.clone(),
                        events: e.stats.events.load(Ordering::Relaxed),
                        notices: e.stats.notices.load(Ordering::Relaxed),
                        state,
                        failed: state == WatchState::Failed,
                        error: (state != WatchState::Running)
                            .then(|| e.stats.reason())
                            .flatten(),
                    }
                })
                .collect();
            list.sort_by(|a, b| a.name.cmp(&b.name));
            Some(list)
        }));
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

/// Code mode's watch built-ins (`filter_catalog.rs`) are the manager's own front door.
#[async_trait]
impl Watches for WatchManager {
    async fn watch_start(
        &self,
        name: &str,
        uri: &str,
        on_event: Option<&str>,
    ) -> Result<WatchInfo, WatchError> {
        WatchManager::watch_start(self, name, uri, on_event).await
    }

    async fn watch_stop(&self, name: &str) -> bool {
        WatchManager::watch_stop(self, name).await
    }

    fn watch_list(&self) -> Vec<WatchInfo> {
        WatchManager::watch_list(self)
    }
}

/// Why no server takes `uri`: none could be reached (each one's last connect failure, which
/// names the server), or some could and none of them lists it.
fn no_server_for(servers: &[Arc<Upstream>], uri: &str) -> WatchError {
    let down: Vec<String> = servers
        .iter()
        .filter(|s| s.catalog().is_none())
        .map(|s| {
            s.report()
                .last_error
                .unwrap_or_else(|| format!("{} has not answered yet", s.name))
        })
        .collect();
    if down.len() == servers.len() {
        return WatchError::Unavailable(format!("no server is connected: {}", down.join("; ")));
    }
    let mut why = format!(
        "no connected server lists {uri}, has a matching template, or supports subscriptions"
    );
    if !down.is_empty() {
        why.push_str(&format!(" (not connected: {})", down.join("; ")));
    }
    WatchError::Unavailable(why)
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
