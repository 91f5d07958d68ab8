//! What a process says about itself on its admin address: which roles have started, which
//! upstreams have connected, how many listen streams are open, the watches, the store's size.
//! One [`StatusBoard`] per process, on the [`RoleContext`](crate::runtime::context::RoleContext)
//! every role of the process shares: `app::serve_source` enters each role it serves (and its
//! listen count), the gateway its upstreams, a watch client its watches; `app::ready` marks the
//! start as done. `app`'s admin server answers `/ready` and `/status` from it.
//!
//! [`StatusReport`] and [`Readiness`] are the one definition of those two JSON bodies: the
//! admin server writes them and `herald status` reads them back.
//!
//! The board holds what it reports weakly (an upstream, a server's listen count, a watch
//! manager): it lives as long as the context, which the reported parts themselves hold.

use crate::sync::Recover;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// An upstream as the board sees it: something that says how its connection is doing.
/// `mcp`'s upstream handle implements it, so the board (below `mcp`) names no client type.
pub trait UpstreamStatus: Send + Sync {
    fn report(&self) -> UpstreamReport;
}

/// Identity providers whose access tokens a role takes (`auth`'s `[[issuer]]`s): how their
/// signing keys are doing.
pub trait IssuerStatus: Send + Sync {
    fn report(&self) -> Vec<IssuerReport>;
}

/// One `[[issuer]]` in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuerReport {
    /// The issuer identifier.
    pub url: String,
    /// The signing keys held now (its tokens are refused while there are none).
    pub keys: usize,
    /// Where they come from: `metadata` (fetched) or `file` (`jwks_file`).
    pub source: String,
    /// Seconds since they were last fetched (or read); `None` before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_secs_ago: Option<u64>,
    /// Why the last fetch failed, when it did (cleared by the next that works).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A role's open listen streams, asked when a report is made.
pub type ListenCount = Arc<dyn Fn() -> usize + Send + Sync>;

/// The watches, asked when a report is made (`None` once the watch client is gone).
pub type WatchList = Box<dyn Fn() -> Option<Vec<WatchReport>> + Send + Sync>;

/// Where a role is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleState {
    /// Entered, its listeners not bound yet.
    Starting,
    /// Its listeners are bound and its tasks run.
    Serving,
    /// The process is shutting down.
    Draining,
}

/// One role in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleReport {
    pub name: String,
    pub state: RoleState,
    /// Where it serves (`http://…/mcp`, `quic://…`, `stdio`); empty for an in-process role.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Its open `subscriptions/listen` streams.
    #[serde(default)]
    pub listens: usize,
}

/// One upstream server in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamReport {
    pub name: String,
    /// Where it is (a URL, `quic://…`, `stdio:COMMAND`).
    pub target: String,
    /// Connected now.
    pub connected: bool,
    /// Connected at least once since the process started.
    pub ever_connected: bool,
    /// The last failed connect's reason (kept after a later success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One watch of the process's watch client in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchReport {
    pub name: String,
    pub uri: String,
    /// Events seen.
    pub events: u64,
    /// Notices delivered.
    pub notices: u64,
    /// Absent from an older herald's report: running, or `failed` says otherwise.
    #[serde(default)]
    pub state: WatchState,
    /// It does not run and nothing is trying to start it (`state` is `failed`): kept for
    /// scripts written before `state`.
    #[serde(default)]
    pub failed: bool,
    /// Why it does not run (with `starting`: the last try's error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a watch is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchState {
    #[default]
    Running,
    /// A configured watch that does not run yet (or lost its source): it keeps trying, and
    /// `/ready` waits for it.
    Starting,
    /// It gave up (or could not be restored): a `watch_start` may try again.
    Failed,
}

impl WatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchState::Running => "running",
            WatchState::Starting => "starting",
            WatchState::Failed => "failed",
        }
    }
}

/// A role's NATS backend in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendReport {
    /// `memo nats`, `slack nats`.
    pub name: String,
    /// The servers, without credentials.
    pub target: String,
    pub connected: bool,
}

/// Whether a backend is connected now.
pub type Connected = Arc<dyn Fn() -> bool + Send + Sync>;

/// The store file in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StoreReport {
    /// `None`: `--store :memory:`, or no store entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The file's size now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// The body of the admin address's `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// herald's version.
    pub version: String,
    pub pid: u32,
    /// Seconds since the board was made (the process start, near enough).
    pub uptime_secs: u64,
    /// What `/ready` answers.
    pub ready: bool,
    pub draining: bool,
    pub roles: Vec<RoleReport>,
    pub upstreams: Vec<UpstreamReport>,
    /// The roles' NATS backends.
    #[serde(default)]
    pub backends: Vec<BackendReport>,
    /// The identity providers whose access tokens are taken, and their keys.
    #[serde(default)]
    pub issuers: Vec<IssuerReport>,
    /// Open `subscriptions/listen` streams, all roles together.
    pub listens: usize,
    pub watches: Vec<WatchReport>,
    pub store: StoreReport,
    /// The config reloads since the start (absent from an older herald's report).
    #[serde(default)]
    pub reloads: ReloadReport,
}

/// The config reloads of a process: how many were applied and refused, and the last one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadReport {
    pub applied: u64,
    pub refused: u64,
    /// The last reload's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<crate::runtime::reload::ReloadOutcome>,
    /// When it ended, in seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_at: Option<u64>,
}

/// An upstream `/ready` waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamWaiting {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The body of `/ready`: ready, or what it is waiting for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    /// The runner has not said that every role started yet.
    pub starting: bool,
    /// The process is shutting down.
    pub draining: bool,
    /// Roles whose listeners are not bound yet.
    pub roles_starting: Vec<String>,
    /// Configured upstreams that have never connected.
    pub upstreams_never_connected: Vec<UpstreamWaiting>,
    /// NATS backends not connected now (a role on NATS serves nothing new without it).
    #[serde(default)]
    pub backends_disconnected: Vec<String>,
    /// Configured watches that do not run yet, each with its last error.
    #[serde(default)]
    pub watches_starting: Vec<UpstreamWaiting>,
}

struct Role {
    name: String,
    serving: bool,
    endpoints: Vec<String>,
    listens: Option<ListenCount>,
}

#[derive(Default)]
struct Board {
    started: bool,
    roles: Vec<Role>,
    upstreams: Vec<Weak<dyn UpstreamStatus>>,
    issuers: Vec<Weak<dyn IssuerStatus>>,
    backends: Vec<(String, String, Connected, CancellationToken)>,
    watches: Option<WatchList>,
    store: Option<PathBuf>,
    reloads: ReloadReport,
}

/// The process's status board. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct StatusBoard {
    shutdown: CancellationToken,
    since: Instant,
    board: Arc<Mutex<Board>>,
    /// Marked on every change the board records itself (roles, upstreams and backends
    /// entered, watches, reloads, the start done), so a follower of `/status/stream` says it
    /// at once rather than at its next interval.
    changes: Arc<tokio::sync::watch::Sender<()>>,
}

impl std::fmt::Debug for StatusBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBoard").finish_non_exhaustive()
    }
}

impl StatusBoard {
    /// A board for a process that shuts down with `shutdown` (then it reports draining).
    pub fn new(shutdown: CancellationToken) -> StatusBoard {
        StatusBoard {
            shutdown,
            since: Instant::now(),
            board: Arc::default(),
            changes: Arc::new(tokio::sync::watch::Sender::new(())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.locked()
    }

    /// Says that the board changed to whoever follows [`StatusBoard::changes`].
    fn touch(&self) {
        self.changes.send_replace(());
    }

    /// A receiver that sees each change the board records from now on (changes between two
    /// looks count once; none is lost).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changes.subscribe()
    }

    /// Cancelled when the process starts shutting down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Enters `role` as starting (again, if it was there).
    pub fn role_starting(&self, role: &str) {
        let mut b = self.lock();
        b.roles.retain(|r| r.name != role);
        b.roles.push(Role {
            name: role.into(),
            serving: false,
            endpoints: Vec::new(),
            listens: None,
        });
        self.touch();
    }

    /// Marks `role` as serving on `endpoints`, its open listens counted by `listens`.
    pub fn role_serving(&self, role: &str, endpoints: Vec<String>, listens: Option<ListenCount>) {
        let mut b = self.lock();
        let entry = Role {
            name: role.into(),
            serving: true,
            endpoints,
            listens,
        };
        match b.roles.iter_mut().find(|r| r.name == role) {
            Some(r) => *r = entry,
            None => b.roles.push(entry),
        }
        self.touch();
    }

    /// Counts a reload and keeps its outcome as the last one.
    pub fn reloaded(&self, outcome: &crate::runtime::reload::ReloadOutcome) {
        let mut b = self.lock();
        if outcome.applied {
            b.reloads.applied += 1;
        } else {
            b.reloads.refused += 1;
        }
        b.reloads.last = Some(outcome.clone());
        b.reloads.last_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
        self.touch();
    }

    /// Enters a configured upstream: `/ready` waits until it has connected once.
    pub fn add_upstream<U: UpstreamStatus + 'static>(&self, upstream: &Arc<U>) {
        let weak: Weak<dyn UpstreamStatus> = Arc::downgrade(upstream) as Weak<U>;
        self.lock().upstreams.push(weak);
        self.touch();
    }

    /// Enters a role's NATS backend: `/ready` waits while it is not connected. Its row goes
    /// (and with it what `connected` holds) once `until` is cancelled: the role that owns it
    /// stopped (a reload removed it) or the process is shutting down.
    pub fn add_backend(
        &self,
        name: String,
        target: String,
        connected: Connected,
        until: CancellationToken,
    ) {
        let mut b = self.lock();
        b.backends.retain(|r| !r.3.is_cancelled());
        b.backends.push((name, target, connected, until));
        self.touch();
    }

    fn backends(&self) -> Vec<BackendReport> {
        let rows: Vec<(String, String, Connected, CancellationToken)> = {
            let mut b = self.lock();
            b.backends.retain(|r| !r.3.is_cancelled());
            b.backends.clone()
        };
        rows.into_iter()
            .map(|(name, target, f, _)| BackendReport {
                name,
                target,
                connected: f(),
            })
            .collect()
    }

    /// The watches now (asked under the board's lock, as [`StatusBoard::report`] does: the
    /// watch client never takes the board's lock under its own).
    fn watches(&self) -> Vec<WatchReport> {
        let b = self.lock();
        b.watches.as_ref().and_then(|f| f()).unwrap_or_default()
    }

    /// Where the watches come from (a watch client's manager).
    pub fn set_watches(&self, watches: WatchList) {
        self.lock().watches = Some(watches);
        self.touch();
    }

    /// The store file (`None` for a store in memory).
    pub fn set_store(&self, path: Option<PathBuf>) {
        self.lock().store = path;
    }

    /// The runner has started every role: from now on `/ready` depends only on the roles and
    /// upstreams.
    pub fn set_started(&self) {
        self.lock().started = true;
        self.touch();
    }

    /// Enters a role's issuers; their rows go when they are dropped (a reload that changed
    /// them, the role stopped).
    pub fn add_issuers<I: IssuerStatus + 'static>(&self, issuers: &Arc<I>) {
        let weak: Weak<dyn IssuerStatus> = Arc::downgrade(issuers) as Weak<dyn IssuerStatus>;
        let mut b = self.lock();
        b.issuers.retain(|w| w.strong_count() > 0);
        b.issuers.push(weak);
        drop(b);
        self.touch();
    }

    fn issuers(&self) -> Vec<IssuerReport> {
        let live: Vec<Arc<dyn IssuerStatus>> = self
            .lock()
            .issuers
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        live.iter().flat_map(|i| i.report()).collect()
    }

    fn upstreams(&self) -> Vec<Arc<dyn UpstreamStatus>> {
        self.lock()
            .upstreams
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// What `/ready` answers now.
    pub fn readiness(&self) -> Readiness {
        let (started, roles_starting) = {
            let b = self.lock();
            let starting = b
                .roles
                .iter()
                .filter(|r| !r.serving)
                .map(|r| r.name.clone())
                .collect::<Vec<_>>();
            (b.started, starting)
        };
        let upstreams_never_connected: Vec<UpstreamWaiting> = self
            .upstreams()
            .iter()
            .map(|u| u.report())
            .filter(|u| !u.ever_connected)
            .map(|u| UpstreamWaiting {
                name: u.name,
                last_error: u.last_error,
            })
            .collect();
        let backends_disconnected: Vec<String> = self
            .backends()
            .into_iter()
            .filter(|b| !b.connected)
            .map(|b| b.name)
            .collect();
        let watches_starting: Vec<UpstreamWaiting> = self
            .watches()
            .into_iter()
            .filter(|w| w.state == WatchState::Starting)
            .map(|w| UpstreamWaiting {
                name: w.name,
                last_error: w.error,
            })
            .collect();
        let draining = self.shutdown.is_cancelled();
        Readiness {
            ready: started
                && !draining
                && roles_starting.is_empty()
                && upstreams_never_connected.is_empty()
                && backends_disconnected.is_empty()
                && watches_starting.is_empty(),
            starting: !started,
            draining,
            roles_starting,
            upstreams_never_connected,
            backends_disconnected,
            watches_starting,
        }
    }

    /// What `/status` answers now. Reads the store file's size (off the runtime's workers).
    pub async fn report(&self) -> StatusReport {
        let ready = self.readiness().ready;
        let draining = self.shutdown.is_cancelled();
        let (roles, watches, store, reloads) = {
            let b = self.lock();
            let roles: Vec<RoleReport> = b
                .roles
                .iter()
                .map(|r| RoleReport {
                    name: r.name.clone(),
                    state: match (draining, r.serving) {
                        (true, _) => RoleState::Draining,
                        (false, true) => RoleState::Serving,
                        (false, false) => RoleState::Starting,
                    },
                    endpoints: r.endpoints.clone(),
                    listens: r.listens.as_ref().map_or(0, |f| f()),
                })
                .collect();
            let watches = b.watches.as_ref().and_then(|f| f()).unwrap_or_default();
            (roles, watches, b.store.clone(), b.reloads.clone())
        };
        let bytes = match &store {
            Some(p) => tokio::fs::metadata(p).await.ok().map(|m| m.len()),
            None => None,
        };
        StatusReport {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_secs: self.since.elapsed().as_secs(),
            ready,
            draining,
            listens: roles.iter().map(|r| r.listens).sum(),
            roles,
            upstreams: self.upstreams().iter().map(|u| u.report()).collect(),
            backends: self.backends(),
            issuers: self.issuers(),
            watches,
            store: StoreReport { path: store, bytes },
            reloads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::MemoServer;
    use crate::transport::target::Target;
    use crate::upstream::UpstreamConfig;

    #[tokio::test]
    async fn ready_once_started_with_every_role_serving_and_every_upstream_connected() {
        let shutdown = CancellationToken::new();
        let board = StatusBoard::new(shutdown.clone());
        let r = board.readiness();
        assert!(!r.ready && r.starting, "{r:?}");

        board.role_starting("memo");
        board.set_started();
        let r = board.readiness();
        assert!(!r.ready && !r.starting, "{r:?}");
        assert_eq!(r.roles_starting, vec!["memo".to_owned()]);

        let count: ListenCount = Arc::new(|| 3);
        board.role_serving("memo", vec!["stdio".into()], Some(count));
        assert!(board.readiness().ready);

        let memo = MemoServer::start().await;
        let up = memo.upstream_with(UpstreamConfig::new(
            Target::Stdio("in-process memo".into()),
            Default::default(),
            1 << 20,
        ));
        board.add_upstream(&up);
        let r = board.readiness();
        assert!(!r.ready, "{r:?}");
        assert_eq!(r.upstreams_never_connected[0].name, up.name);
        up.connect().await.expect("connects");
        assert!(board.readiness().ready);

        // A NATS backend: not ready while it is disconnected, whatever else is.
        let nats_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = nats_up.clone();
        board.add_backend(
            "memo nats".into(),
            "nats://h:4222".into(),
            Arc::new(move || flag.load(std::sync::atomic::Ordering::Relaxed)),
            CancellationToken::new(),
        );
        let r = board.readiness();
        assert!(!r.ready, "{r:?}");
        assert_eq!(r.backends_disconnected, vec!["memo nats".to_owned()]);
        nats_up.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(board.readiness().ready);

        // A configured watch still starting holds /ready, naming it and its last error; a
        // failed one (nothing will start it by itself) does not.
        let state = Arc::new(Mutex::new(WatchState::Starting));
        let now = state.clone();
        board.set_watches(Box::new(move || {
            let state = *now.locked();
            Some(vec![WatchReport {
                name: "notes".into(),
                uri: "memo://notes".into(),
                events: 0,
                notices: 0,
                state,
                failed: state == WatchState::Failed,
                error: (state != WatchState::Running).then(|| "memo: not reachable".into()),
            }])
        }));
        let r = board.readiness();
        assert!(!r.ready, "{r:?}");
        assert_eq!(
            r.watches_starting,
            vec![UpstreamWaiting {
                name: "notes".into(),
                last_error: Some("memo: not reachable".into())
            }]
        );
        *state.locked() = WatchState::Failed;
        assert!(board.readiness().ready);
        *state.locked() = WatchState::Running;
        assert!(board.readiness().ready);

        let report = board.report().await;
        assert_eq!(report.backends.len(), 1);
        assert!(report.backends[0].connected);
        assert_eq!(report.listens, 3);
        assert_eq!(report.roles[0].state, RoleState::Serving);
        assert!(report.upstreams[0].connected && report.upstreams[0].ever_connected);
        assert_eq!(report.store, StoreReport::default());

        // An upstream that is gone is no longer waited for; shutdown is never ready.
        drop(up);
        shutdown.cancel();
        let r = board.readiness();
        assert!(!r.ready && r.draining, "{r:?}");
        assert!(r.upstreams_never_connected.is_empty());
        assert_eq!(board.report().await.roles[0].state, RoleState::Draining);
    }

    #[test]
    fn reports_read_back_with_the_same_definition() {
        let report = StatusReport {
            version: "0.1.0".into(),
            pid: 7,
            uptime_secs: 3,
            ready: true,
            draining: false,
            roles: vec![RoleReport {
                name: "memo".into(),
                state: RoleState::Serving,
                endpoints: vec!["http://127.0.0.1:1/mcp".into()],
                listens: 1,
            }],
            backends: vec![BackendReport {
                name: "slack nats".into(),
                target: "nats://a:4222".into(),
                connected: false,
            }],
            issuers: vec![],
            upstreams: vec![UpstreamReport {
                name: "a".into(),
                target: "stdio:x".into(),
                connected: false,
                ever_connected: false,
                last_error: Some("refused".into()),
            }],
            listens: 1,
            watches: vec![],
            store: StoreReport {
                path: Some("/tmp/x.redb".into()),
                bytes: Some(4096),
            },
            reloads: Default::default(),
        };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<StatusReport>(&text).unwrap(), report);
    }
}
