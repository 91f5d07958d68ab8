//! Task expiry: one loop per server's tasks, sleeping until the soonest ttl (woken early when
//! a sooner one is set). A task still running at its ttl is cancelled and fails (pushed); every
//! expired task is then forgotten, in memory and in the store.

use std::sync::Weak;

use rmcp::model::{DetailedTask, ErrorData as McpError, TaskPayload};
use tokio::time::Instant;

use super::{Inner, Tasks, error_object};
use crate::store::Table;

/// Ends tasks whose ttl has passed: a running one is cancelled and fails (pushed), then every
/// expired task is forgotten (a `tasks/get` on it is `-32602`). It holds the tasks only while
/// it works, and ends at shutdown or once they are gone.
pub(super) async fn expire_loop(inner: Weak<Inner>) {
    loop {
        let Some(i) = inner.upgrade() else {
            return;
        };
        let tasks = Tasks { inner: i };
        let now = Instant::now();
        let due: Vec<String> = {
            let s = tasks.lock();
            s.tasks
                .iter()
                .filter(|(_, r)| r.expires <= now)
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in due {
            tasks.expire(&id).await;
        }
        let next = {
            let mut s = tasks.lock();
            let next = s.tasks.values().map(|r| r.expires).min();
            s.next_wake = next;
            next
        };
        // `notify_one` keeps a permit when nobody waits, so a sooner expiry set between the
        // scan and here still wakes this. Only the notify is held while waiting: the tasks
        // may go away meanwhile (the loop then ends at its next turn).
        let wake = tasks.inner.expiry.clone();
        drop(tasks);
        let notified = wake.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = notified => {}
                }
            }
            None => notified.await,
        }
    }
}

impl Tasks {
    async fn expire(&self, id: &str) {
        let ttl_ms = self.inner.ttl.as_millis();
        let failed = self.transition(id, |r| {
            r.cancel.cancel();
            r.waiting = None;
            r.task = DetailedTask::new(
                r.task.task.clone(),
                TaskPayload::Failed {
                    error: error_object(&McpError::internal_error(
                        format!("the task did not finish within its ttl of {ttl_ms} ms"),
                        None,
                    )),
                },
            );
            true
        });
        if failed.is_some() {
            tracing::info!(task = %id, "task expired before it finished");
        }
        self.lock().tasks.remove(id);
        if let Some(store) = &self.inner.store {
            let _ = store
                .delete(Table::Tasks, &format!("{}{id}", self.inner.prefix))
                .await;
        }
    }
}
