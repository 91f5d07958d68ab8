//! Kept watches: the ones a config names (`herald up`'s `[[watch]]`, `herald agent`'s and
//! `herald code`'s `--watch`). Nothing configured is lost: one that cannot start yet (its
//! server not up, a slug not connected, an API server down) is listed as `starting` with its
//! last error, holds `/ready`, and is tried again with the shared backoff (doubling from
//! `resubscribe_base`, at most [`KEEP_TRYING_MAX`] apart) until it runs, when it says so in
//! the log. Only what can never start (a bad name or filter) is refused at once. Once running,
//! its task resubscribes the same way for as long as it is not stopped (`task.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Entry, Keeper, WatchManager};
use crate::runtime::backoff::Backoff;
use crate::sync::Recover;
use crate::watch::handle::Stats;
use crate::watch::spec::{KEEP_TRYING_MAX, WatchError, WatchSpec};

impl WatchManager {
    /// Starts `spec` and keeps it: see the module docs. `Err` only for what can never start
    /// ([`WatchError::Invalid`]: a name in use, no room, a filter refused).
    pub async fn watch_keep(&self, spec: WatchSpec) -> Result<(), WatchError> {
        let token = self.inner.shutdown.child_token();
        match self.start_kept(&spec, &token, None).await {
            Ok(_) => Ok(()),
            Err(e @ WatchError::Invalid(_)) => Err(e),
            Err(e) => {
                self.keep_trying(spec, token, e);
                Ok(())
            }
        }
    }

    /// One try to start `spec` (saved) as a kept watch ending with `token`, replacing its
    /// `placeholder` entry if it has one.
    async fn start_kept(
        &self,
        spec: &WatchSpec,
        token: &CancellationToken,
        placeholder: Option<&Arc<Stats>>,
    ) -> Result<(), WatchError> {
        let on_event = spec.on_event.as_deref();
        let keeper = Keeper { token, placeholder };
        self.start(&spec.name, &spec.uri, on_event, true, Some(&keeper))
            .await
            .map(|_| ())
    }

    /// Lists `spec` as starting (with `first`, why it did not) and tries again in the
    /// background until it runs, can never run, or `token` is cancelled (stopped, shutdown).
    fn keep_trying(&self, spec: WatchSpec, token: CancellationToken, first: WatchError) {
        let inner = &self.inner;
        let stats = Arc::new(Stats::default());
        stats.starting.store(true, Ordering::Relaxed);
        stats.set_reason(first.to_string());
        tracing::warn!(watch = %spec.name, uri = %spec.uri, error = %first,
            "watch cannot start yet; trying again (at most {} s apart) until it runs", KEEP_TRYING_MAX.as_secs());
        inner.handle.log.emit(
            "watch.starting",
            json!({"watch": spec.name, "uri": spec.uri, "error": first.to_string()}),
        );
        {
            let mut watches = inner.watches.locked();
            if token.is_cancelled() {
                return;
            }
            // Another start took the name meanwhile: that one stands, this one is not kept.
            if let Some(e) = watches.get(&spec.name)
                && e.taken(None)
            {
                tracing::warn!(watch = %spec.name, "a watch of that name started meanwhile; the configured one is not kept");
                return;
            }
            watches.insert(
                spec.name.clone(),
                Entry {
                    spec: spec.clone(),
                    shape: None,
                    server: String::new(),
                    stats: stats.clone(),
                    cancel: token.clone(),
                    restore_failed: false,
                },
            );
        }
        inner.handle.changed();
        let manager = self.clone();
        inner.tracker.spawn(async move {
            let cfg = &manager.inner.handle.cfg;
            let mut backoff = Backoff::new(cfg.resubscribe_base, KEEP_TRYING_MAX);
            for tries in 2u64.. {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
                match manager.start_kept(&spec, &token, Some(&stats)).await {
                    Ok(_) => {
                        tracing::info!(watch = %spec.name, uri = %spec.uri, tries, "watch started");
                        manager.inner.handle.changed();
                        return;
                    }
                    Err(_) if token.is_cancelled() => return,
                    Err(e @ WatchError::Invalid(_)) => {
                        tracing::error!(watch = %spec.name, uri = %spec.uri, error = %e, "watch cannot start");
                        stats.set_reason(e.to_string());
                        stats.failed.store(true, Ordering::Relaxed);
                        stats.starting.store(false, Ordering::Relaxed);
                        manager.inner.handle.changed();
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(watch = %spec.name, error = %e, tries, "watch still cannot start");
                        stats.set_reason(e.to_string());
                    }
                }
            }
        });
    }
}
