//! The watch manager's saved state (`--watch-state`): each running watch's [`WatchSpec`] sits
//! in the store's watch table under the manager's prefix and the watch's name, put on every
//! start and removed on every stop or end. [`WatchManager::restore`] starts them again at
//! start-up with one restore notice: a spec that can never start is dropped, a transient
//! failure (or a saved filter the start check now refuses) is kept and listed with
//! `restore_failed`.

use crate::sync::Recover;
use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Entry, WatchManager};
use crate::filter::shape;
use crate::store::Table;
use crate::watch::handle::Stats;
use crate::watch::spec::{Notice, WatchError, WatchSpec};

impl WatchManager {
    /// The store key of watch `name`.
    pub(super) fn key(&self, name: &str) -> String {
        format!("{}{name}", self.inner.prefix)
    }

    pub(super) async fn save(&self, spec: &WatchSpec) {
        if let Some(store) = &self.inner.store {
            let bytes = serde_json::to_vec(spec).unwrap_or_default();
            if let Err(e) = store
                .put(Table::Watches, &self.key(&spec.name), bytes)
                .await
            {
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
        // Only this manager's: the agent's under its prefix, herald watch's without one.
        let saved = saved
            .into_iter()
            .filter(|(k, _)| match self.inner.prefix.as_str() {
                "" => !k.contains('\u{1f}'),
                p => k.starts_with(p),
            });
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
                .start(&spec.name, &spec.uri, spec.on_event.as_deref(), false, None)
                .await
                .map(|_| ());
            // A filter saved before the start check refused what can never give a notice
            // (it worked then, as `on_event failed` lines) is kept, not deleted on upgrade:
            // the person fixes it and starts it again.
            let refused_shape = spec
                .on_event
                .as_deref()
                .is_some_and(|c| shape::never_notices(c).is_some());
            match &r {
                Ok(()) => lines.push(format!("restored {} ({})", spec.name, spec.uri)),
                Err(e) if e.is_transient() || refused_shape => {
                    lines.push(format!(
                        "restore failed, kept: {} ({}): {e}",
                        spec.name, spec.uri
                    ));
                    let stats = Stats::default();
                    stats.set_reason(format!("its restore failed: {e}"));
                    self.inner
                        .watches
                        .locked()
                        .entry(spec.name.clone())
                        .or_insert_with(|| Entry {
                            spec: spec.clone(),
                            shape: None,
                            server: String::new(),
                            stats: Arc::new(stats),
                            cancel: CancellationToken::new(),
                            restore_failed: true,
                        });
                }
                Err(e) => {
                    let _ = store.delete(Table::Watches, &key).await;
                    lines.push(format!("dropped {} ({}): {e}", spec.name, spec.uri));
                }
            }
            results.push((spec, r));
        }
        if !lines.is_empty() {
            self.inner.handle.log.emit(
                "watch.restored",
                json!({
                    "restored": results.iter().filter(|(_, r)| r.is_ok()).count(),
                    "saved": results.len(),
                }),
            );
            lines.push(
                "changes made while herald was down may be missing: baselines are fresh".into(),
            );
            self.inner
                .handle
                .deliver(Notice::new("herald", "watch-state", lines))
                .await;
        }
        results
    }
}
