//! [`WatchHandle`]: what a running watch takes from the manager that started it, and nothing
//! more: the config, the event log, the one bounded notice channel, the filter pool and the
//! catalog filters see, and a way to wake whoever waits on the watch list. The manager builds
//! one and hands it to each `WatchTask` (`task.rs`) and task follower (`follow.rs`), so neither
//! knows the manager; what only the manager can do (a task watch leaving the list when its task
//! ended) it does when the follower returns. Also here: [`Stats`], a watch's counters, kept by
//! the watch and read by the manager's list.

use crate::sync::Recover;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::sync::{Notify, mpsc};

use crate::filter::pool::{Catalog as FilterHost, FilterPool};
use crate::watch::log::WatchLog;
use crate::watch::spec::{Notice, WatchConfig};

/// What every running watch of one manager shares with it.
pub(super) struct WatchHandle {
    pub(super) cfg: WatchConfig,
    pub(super) log: WatchLog,
    notices: mpsc::Sender<Notice>,
    filters: Mutex<Option<FilterPool>>,
    /// The read-only catalog filters see.
    catalog: Arc<dyn FilterHost>,
    /// Woken whenever a watch leaves (stopped, or a task watch whose task ended) or fails.
    pub(super) left: Notify,
}

impl WatchHandle {
    /// Notices go to `notices`; filters see `catalog`. No filter pool until
    /// [`WatchHandle::set_filters`].
    pub(super) fn new(
        cfg: WatchConfig,
        log: WatchLog,
        notices: mpsc::Sender<Notice>,
        catalog: Arc<dyn FilterHost>,
    ) -> WatchHandle {
        WatchHandle {
            cfg,
            log,
            notices,
            filters: Mutex::new(None),
            catalog,
            left: Notify::new(),
        }
    }

    pub(super) fn set_filters(&self, pool: FilterPool) {
        *self.filters.locked() = Some(pool);
    }

    /// The pool `on_event` filters run in, if this watch client runs any.
    pub(super) fn filters(&self) -> Option<FilterPool> {
        self.filters.locked().clone()
    }

    /// The read-only catalog filters see.
    pub(super) fn filter_catalog(&self) -> Arc<dyn FilterHost> {
        self.catalog.clone()
    }

    /// Logs `notice` and puts it on the notice channel.
    pub(super) async fn deliver(&self, notice: Notice) {
        self.log.emit(
            "watch.notice",
            json!({"watch": notice.watch, "uri": notice.uri, "lines": notice.lines}),
        );
        // Bounded: a slow sink makes watch tasks wait here, never grows a queue.
        let _ = self.notices.send(notice).await;
    }

    /// Wakes whoever waits on the watch list: a watch left or failed.
    pub(super) fn changed(&self) {
        self.left.notify_waiters();
    }
}

/// A watch's counters, shared with its `watch_list` row.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) events: AtomicU64,
    pub(super) notices: AtomicU64,
    pub(super) failed: AtomicBool,
    /// A kept watch that does not run yet, or lost its source: it keeps trying.
    pub(super) starting: AtomicBool,
    /// Why the watch does not run (it failed, or its restore did, or with `starting` the
    /// last try's error).
    pub(super) reason: Mutex<Option<String>>,
}

impl Stats {
    pub(super) fn set_reason(&self, reason: String) {
        *self.reason.locked() = Some(reason);
    }

    pub(super) fn reason(&self) -> Option<String> {
        self.reason.locked().clone()
    }
}
