//! The watch client: routing, subscribe, diff, dedupe, debounce, persistence.
//!
//! Bottom-up: [`events`] (state diff and event-log delivery) over [`raw`] (byte ranges of JSON
//! items), [`notice`] (default lines, dedupe, debounce), [`log`] (the NDJSON event log),
//! [`spec`] (config, specs, errors, notices), `handle` (what a running watch shares with the
//! manager), `task` (one running watch) and `follow` (a watch on a task), `filter_catalog`
//! (what Python sees), [`manager`] (start, stop, list, restore), [`sink`]
//! (where `herald watch` sends notices), and [`run`], which wires them for `herald watch`,
//! `herald up` and `herald code`. Servers are reached through the shared [`Upstream`].
//! Independent of any sink, so the agent can reuse it.

pub mod check;
pub mod events;
mod filter_catalog;
mod follow;
mod handle;
pub mod log;
pub mod manager;
pub mod notice;
pub mod raw;
pub mod sink;
pub mod spec;
pub(crate) mod task;

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use filter_catalog::{BUILTINS, Builtin, CODE_PRELUDE};
pub use manager::WatchManager;
pub use spec::{Notice, Restart, Shape, WatchConfig, WatchError, WatchInfo, WatchSpec};

use crate::filter::pool::{FilterPool, PoolConfig};
use crate::store::Store;
use crate::transport::target::Target;
use crate::transport::tls::ClientTrust;
use crate::upstream::{UNPACED, Upstream, UpstreamConfig};
use crate::watch::log::WatchLog;
use crate::watch::manager::{Failed, Settled};
use crate::watch::sink::Sink;

/// Notices waiting for the sink; when full, watch tasks wait (a slow sink slows the watches,
/// it never grows a queue).
const NOTICE_QUEUE: usize = 64;

/// How the watch client reaches a server: named by its target, and connecting whenever asked
/// (no connect backoff of its own), since each watch paces its own resubscribes
/// ([`WatchConfig::resubscribe_backoff`]) and a start or a filter's read should find a server
/// that is back at once.
pub fn upstream_config(
    target: Target,
    trust: ClientTrust,
    max_message_bytes: usize,
) -> UpstreamConfig {
    UpstreamConfig {
        backoff: UNPACED,
        contents: true,
        ..UpstreamConfig::new(target, trust, max_message_bytes)
    }
}

/// A server of the watch client, as [`upstream_config`] describes.
pub fn upstream(target: Target, trust: ClientTrust, max_message_bytes: usize) -> Arc<Upstream> {
    Arc::new(Upstream::new(upstream_config(
        target,
        trust,
        max_message_bytes,
    )))
}

/// What a watch client runs with.
pub struct WatchOptions {
    pub config: WatchConfig,
    /// The servers, in routing order.
    pub servers: Vec<Arc<Upstream>>,
    pub sink: Sink,
    pub log: WatchLog,
    /// `--watch-state`: specs are saved here on every start and stop and restored at start.
    pub store: Option<Store>,
    /// Worker processes for `on_event` filters; `None` runs no Python.
    pub filters: Option<PoolConfig>,
    /// Watches to start (after the restore). One restored with the same name and URI is
    /// kept, unless this one brings a filter, which replaces it.
    pub watches: Vec<WatchSpec>,
    /// What a watch in `watches` that cannot start does.
    pub configured: Configured,
    /// Whether the run ends once no watch runs (`herald watch`, where nothing can start
    /// another): with `Ok` when each has ended (task watches end by themselves), with
    /// [`RunError::AllFailed`] when those left failed for good. Otherwise it runs until
    /// `shutdown` (code mode and the agent can start a watch again).
    pub end_when_all_ended: bool,
    /// The store key prefix of the saved watches (see [`manager::AGENT_STATE`]).
    pub state_prefix: &'static str,
}

/// What a watch of [`WatchOptions::watches`] that cannot start does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Configured {
    /// It ends the run with [`StartFailed`] (`herald watch`: its exit says so at once).
    Required,
    /// It is kept: listed as starting and tried again until it runs (`herald up`, `agent`,
    /// `code`; see `manager/kept.rs`). Only one that can never start is logged and left out.
    Kept,
}

/// A watch of [`WatchOptions::watches`] could not start.
#[derive(Debug, thiserror::Error)]
#[error("watch {name} ({uri}) cannot start: {error}")]
pub struct StartFailed {
    pub name: String,
    pub uri: String,
    pub error: WatchError,
}

/// Why a watch client's run ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] StartFailed),
    /// With [`WatchOptions::end_when_all_ended`]: no watch runs, and those left failed.
    #[error("{}", every_watch_failed(.0))]
    AllFailed(Vec<Failed>),
    /// With [`WatchOptions::end_when_all_ended`]: the start left nothing to watch (only
    /// `--watch-state`, and the store held no saved watch), and nothing can start one later.
    #[error(
        "nothing to watch: the store holds no saved watch (--watch-state); pass --watch NAME=URI or a --config with [[watch]]"
    )]
    NothingToWatch,
}

fn every_watch_failed(failed: &[Failed]) -> String {
    let each: Vec<String> = failed
        .iter()
        .map(|f| format!("{} ({}): {}", f.name, f.uri, f.reason))
        .collect();
    format!("no watch is left running: {}", each.join("; "))
}

/// `1 resource`, `2 resources`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Runs a watch client: its sink, its manager (with the filter pool and the store), a first
/// connect to every server, the restore, the watches to start (then one line, `watching N
/// resources on M servers`, in the log); then `session` (code mode's snippets; `herald watch`
/// installs its signal handlers there), and, if `session` says to keep going, waits for
/// `shutdown` (or, with `end_when_all_ended`, for no watch to run). Then it stops every watch
/// (flushing what each holds) and lets the sink deliver the last notices before it returns.
pub async fn run<S>(
    opts: WatchOptions,
    shutdown: CancellationToken,
    session: S,
) -> Result<(), RunError>
where
    S: AsyncFnOnce(&WatchManager) -> bool,
{
    let (tx, rx) = mpsc::channel(NOTICE_QUEUE);
    let sink_task = tokio::spawn(sink::run(opts.sink, rx));
    let manager = WatchManager::with_prefix(
        opts.config,
        opts.servers,
        tx,
        opts.log,
        opts.store,
        opts.state_prefix,
    );
    if let Some(pool) = opts.filters {
        manager.set_filters(FilterPool::new(pool));
    }
    // A shutdown during the start (a signal while a server is slow to answer) ends it there.
    let start = async {
        // The upstream itself warned of a connect that failed, and a watch that cannot start
        // says why: once each is enough.
        for (target, e) in manager.connect_all().await {
            tracing::debug!(server = %target, error = %e, "server not reachable yet; retried when a watch needs it");
        }
        manager.restore().await;
        start_all(&manager, opts.watches, opts.configured).await
    };
    let mut failure = tokio::select! {
        f = start => f.map(RunError::Start),
        _ = shutdown.cancelled() => None,
    };
    if failure.is_none()
        && opts.end_when_all_ended
        && !shutdown.is_cancelled()
        && !manager.ever_listed()
    {
        failure = Some(RunError::NothingToWatch);
    }
    if failure.is_none() {
        let (n, servers) = manager.running_on();
        if n > 0 {
            tracing::info!(
                "watching {} on {} ({})",
                count(n, "resource"),
                count(servers.len(), "server"),
                servers.join(", ")
            );
        }
    }
    if failure.is_none() && !shutdown.is_cancelled() && session(&manager).await {
        if opts.end_when_all_ended {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                settled = manager.none_running() => match settled {
                    Settled::Ended => tracing::info!("every watch has ended"),
                    Settled::Failed(f) => failure = Some(RunError::AllFailed(f)),
                },
            }
        } else {
            shutdown.cancelled().await;
        }
    }
    manager.shutdown().await;
    drop(manager);
    let _ = sink_task.await;
    failure.map_or(Ok(()), Err)
}

/// Starts `watches` in order; the first failure ends it when they are required.
async fn start_all(
    manager: &WatchManager,
    watches: Vec<WatchSpec>,
    configured: Configured,
) -> Option<StartFailed> {
    let restored: Vec<(String, String)> = manager
        .watch_list()
        .into_iter()
        .filter(|w| !w.restore_failed && !w.failed)
        .map(|w| (w.name, w.uri))
        .collect();
    for w in watches {
        if restored.iter().any(|(n, u)| *n == w.name && *u == w.uri) {
            if w.on_event.is_none() {
                continue; // restored from --watch-state already
            }
            // Restored, but this start brings its filter: run that one.
            manager.watch_stop(&w.name).await;
        }
        if configured == Configured::Kept {
            let (name, uri) = (w.name.clone(), w.uri.clone());
            if let Err(error) = manager.watch_keep(w).await {
                tracing::error!(watch = %name, %uri, %error, "watch cannot start");
            }
            continue;
        }
        if let Err(error) = manager
            .watch_start(&w.name, &w.uri, w.on_event.as_deref())
            .await
        {
            return Some(StartFailed {
                name: w.name,
                uri: w.uri,
                error,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::MemoServer;

    fn spec(name: &str, uri: &str) -> WatchSpec {
        WatchSpec {
            name: name.into(),
            uri: uri.into(),
            on_event: None,
        }
    }

    async fn manager(memo: &MemoServer) -> WatchManager {
        let up = memo.upstream_with(upstream_config(
            Target::Stdio("in-process memo".into()),
            Default::default(),
            1 << 20,
        ));
        let (tx, _rx) = mpsc::channel(16);
        WatchManager::new(
            WatchConfig::default(),
            vec![up],
            tx,
            WatchLog::silent(),
            None,
        )
    }

    #[tokio::test]
    async fn a_required_watch_that_cannot_start_ends_the_starts() {
        let memo = MemoServer::start().await;
        let m = manager(&memo).await;
        let watches = vec![
            spec("a", "memo://notes"),
            spec("x", "memo://nope"),
            spec("b", "memo://log"),
        ];
        let failed = start_all(&m, watches, Configured::Required)
            .await
            .expect("x fails");
        let text = failed.to_string();
        assert!(
            text.starts_with("watch x (memo://nope) cannot start: "),
            "{text}"
        );
        let names: Vec<String> = m.watch_list().into_iter().map(|w| w.name).collect();
        assert_eq!(names, ["a"], "nothing after the failure starts");
        m.shutdown().await;
    }

    #[tokio::test]
    async fn a_kept_watch_that_cannot_start_is_listed_starting_and_the_rest_run() {
        let memo = MemoServer::start().await;
        let m = manager(&memo).await;
        let watches = vec![
            spec("x", "memo://nope"),
            spec("", "memo://notes"),
            spec("b", "memo://log"),
        ];
        assert!(start_all(&m, watches, Configured::Kept).await.is_none());
        let list: Vec<(String, bool)> = m
            .watch_list()
            .into_iter()
            .map(|w| (w.name, w.starting))
            .collect();
        // The nameless one can never start: left out.
        assert_eq!(list, [("b".into(), false), ("x".into(), true)]);
        m.shutdown().await;
    }

    /// What `herald watch` (`end_when_all_ended`) or code mode runs with, notices to `tx`.
    fn options(memo: &MemoServer, tx: mpsc::Sender<Notice>, restart: Restart) -> WatchOptions {
        let mut config = WatchConfig::default();
        config.debounce.quiet = std::time::Duration::ZERO;
        config.resubscribe_base = std::time::Duration::from_millis(10);
        config.resubscribe_attempts = 2;
        config.restart = restart;
        let herald_watch = restart == Restart::HeraldWatch;
        WatchOptions {
            config,
            servers: vec![memo.upstream_with(upstream_config(
                Target::Stdio("in-process memo".into()),
                Default::default(),
                1 << 20,
            ))],
            sink: Sink::Channel(tx),
            log: WatchLog::silent(),
            store: None,
            filters: None,
            watches: if herald_watch {
                vec![spec("notes", "memo://notes")]
            } else {
                Vec::new()
            },
            configured: if herald_watch {
                Configured::Required
            } else {
                Configured::Kept
            },
            end_when_all_ended: herald_watch,
            state_prefix: "",
        }
    }

    /// `herald watch` used to keep running with no watch left, so systemd never restarted it.
    #[tokio::test]
    async fn herald_watch_ends_with_the_reason_once_its_last_watch_failed() {
        let memo = MemoServer::start().await;
        let (tx, mut rx) = mpsc::channel(16);
        let opts = options(&memo, tx, Restart::HeraldWatch);
        let run = run(opts, CancellationToken::new(), async |_| {
            memo.set_down(true);
            true
        });
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), run)
            .await
            .expect("the run ends by itself");
        let Err(RunError::AllFailed(failed)) = ended else {
            panic!("every watch failed, not {ended:?}")
        };
        let text = RunError::AllFailed(failed.clone()).to_string();
        assert!(
            text.starts_with("no watch is left running: notes (memo://notes): the subscription ended and 2 resubscribe attempts failed"),
            "{text}"
        );
        let notice = rx.recv().await.expect("the failure was noticed first");
        assert!(
            notice.lines[0].ends_with("run herald watch again (it exits once no watch runs)"),
            "{notice:?}"
        );
    }

    #[tokio::test]
    async fn code_mode_keeps_running_once_its_last_watch_failed() {
        let memo = MemoServer::start().await;
        let (tx, mut rx) = mpsc::channel(16);
        let opts = options(&memo, tx, Restart::WatchStart);
        let shutdown = CancellationToken::new();
        let run = run(opts, shutdown.clone(), async |m| {
            m.watch_start("n", "memo://notes", None).await.unwrap();
            memo.set_down(true);
            let notice = rx.recv().await.unwrap();
            assert!(
                notice.lines[0]
                    .ends_with(r#"start it again with watch_start(name="n", uri="memo://notes")"#),
                "{notice:?}"
            );
            assert!(matches!(m.none_running().await, Settled::Failed(_)));
            // Nothing ended the run: the code can start it again.
            memo.set_down(false);
            m.watch_start("n", "memo://notes", None).await.unwrap();
            shutdown.cancel();
            true
        });
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), run).await;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    }

    #[tokio::test]
    async fn a_watch_already_running_is_kept_not_started_twice() {
        let memo = MemoServer::start().await;
        let m = manager(&memo).await;
        m.watch_start("a", "memo://notes", None).await.unwrap();
        // The same name and URI (as a restore leaves it): kept. The same name elsewhere: refused.
        assert!(
            start_all(&m, vec![spec("a", "memo://notes")], Configured::Required)
                .await
                .is_none()
        );
        let moved = start_all(&m, vec![spec("a", "memo://log")], Configured::Required).await;
        assert!(moved.is_some_and(|f| f.error.to_string().contains("already exists")));
        m.shutdown().await;
    }
}
