//! What a role runner hands the parts it builds: one task tracker, one shutdown token and the
//! role's name. Every helper task a source spawns (k8s watchers, file and poll leases, the
//! gateway's relays and connects) goes through [`RoleContext::spawn`] or one of its siblings,
//! so it is tracked (the runner's drain waits for it), named (a span `task{role, name}`, and a
//! count of what is still running when the drain gives up) and ends at shutdown. The context
//! also carries the process's [`StatusBoard`], where the parts it builds report themselves
//! for the admin address, the [`Metrics`] registry each part registers its counters in, and
//! the ring tap when the roles publish their event logs ([`crate::runtime::tap`]).

use crate::sync::Recover;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::runtime::metrics::Metrics;
use crate::runtime::reload::Reloads;
use crate::runtime::status::StatusBoard;
use crate::runtime::tap::Tap;

/// A role's task context. Cheap to clone; clones share the tracker, the token and the counts.
#[derive(Clone)]
pub struct RoleContext {
    role: Arc<str>,
    /// The process's token, or a child of it for a role a reload may stop alone.
    shutdown: CancellationToken,
    /// Made by [`RoleContext::for_stoppable_role`]: [`RoleContext::stop_alone`] may cancel it.
    stoppable: bool,
    shared: Arc<Shared>,
}

struct Shared {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// Tasks running now, by (role, name).
    running: Mutex<BTreeMap<(Arc<str>, &'static str), usize>>,
    /// Woken whenever a task ends ([`RoleContext::wait_stopped`]).
    ended: tokio::sync::Notify,
    status: StatusBoard,
    /// The metrics registry its roles register their counters in.
    metrics: Metrics,
    /// Where the rings its roles make send their events, when they publish them.
    tap: OnceLock<Tap>,
    /// Where reload requests go, when the runner can reload its config.
    reloads: OnceLock<Reloads>,
}

impl std::fmt::Debug for RoleContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleContext")
            .field("role", &self.role)
            .field("shutting_down", &self.shutdown.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// Counts one running task; uncounts it when the task ends or is dropped.
struct Running {
    shared: Arc<Shared>,
    key: (Arc<str>, &'static str),
}

impl Running {
    fn new(shared: Arc<Shared>, key: (Arc<str>, &'static str)) -> Running {
        *shared.running.locked().entry(key.clone()).or_default() += 1;
        Running { shared, key }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        {
            let mut running = self.shared.running.locked();
            if let Some(n) = running.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    running.remove(&self.key);
                }
            }
        }
        self.shared.ended.notify_waiters();
    }
}

impl RoleContext {
    /// A context with its own shutdown token.
    pub fn new(role: &str) -> RoleContext {
        RoleContext::with_shutdown(role, CancellationToken::new())
    }

    /// A context that shuts down with `shutdown`.
    pub fn with_shutdown(role: &str, shutdown: CancellationToken) -> RoleContext {
        RoleContext {
            role: role.into(),
            shutdown: shutdown.clone(),
            stoppable: false,
            shared: Arc::new(Shared {
                tracker: TaskTracker::new(),
                status: StatusBoard::new(shutdown.clone()),
                shutdown,
                running: Mutex::default(),
                ended: tokio::sync::Notify::new(),
                metrics: Metrics::default(),
                tap: OnceLock::new(),
                reloads: OnceLock::new(),
            }),
        }
    }

    /// The same tracker and token under another role's name (`herald up` runs several roles
    /// in one process and drains them together).
    pub fn for_role(&self, role: &str) -> RoleContext {
        RoleContext {
            role: role.into(),
            shutdown: self.shutdown.clone(),
            stoppable: self.stoppable,
            shared: self.shared.clone(),
        }
    }

    /// The same tracker under another role's name, with a shutdown token of its own that the
    /// process's cancels too: a role `herald up` may stop alone when a reload removes or
    /// changes it. Its tasks end with its token; the process's drain still waits for them.
    pub fn for_stoppable_role(&self, role: &str) -> RoleContext {
        RoleContext {
            role: role.into(),
            shutdown: self.shutdown.child_token(),
            stoppable: true,
            shared: self.shared.clone(),
        }
    }

    /// Stops this context's tasks alone, when it is one a reload may stop
    /// ([`for_stoppable_role`](Self::for_stoppable_role)); `false` (and nothing done) for the
    /// process's own.
    pub fn stop_alone(&self) -> bool {
        if self.stoppable {
            self.shutdown.cancel();
        }
        self.stoppable
    }

    pub fn role(&self) -> &str {
        &self.role
    }

    /// Cancelled when the role shuts down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The process's status board (shared by every role of the context, like the tracker).
    pub fn status(&self) -> &StatusBoard {
        &self.shared.status
    }

    /// The metrics registry (shared by every role of the context, like the tracker): each
    /// part registers its own counters here, and `/metrics` renders them.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Makes every event-log ring its roles make from now on send its events to `tap` (the
    /// publisher's queue, `--publish-events`). Once per context, shared by every role of
    /// it; `false` if a tap was installed already.
    pub fn install_tap(&self, tap: Tap) -> bool {
        self.shared.tap.set(tap).is_ok()
    }

    /// The tap a source hands [`EventRing::tapped`](crate::mcp::ring::EventRing::tapped)
    /// when it makes a ring, if its role publishes its event logs.
    pub fn tap(&self) -> Option<&Tap> {
        self.shared.tap.get()
    }

    /// Says where reload requests go (`herald up`, `herald gateway --config`); once per
    /// context, `false` if set already.
    pub fn install_reloads(&self, reloads: Reloads) -> bool {
        self.shared.reloads.set(reloads).is_ok()
    }

    /// Where reload requests go, if this process can reload.
    pub fn reloads(&self) -> Option<&Reloads> {
        self.shared.reloads.get()
    }

    /// The tracker the runner's listeners are spawned on too.
    pub fn tracker(&self) -> &TaskTracker {
        &self.shared.tracker
    }

    fn wrap<F>(&self, name: &'static str, fut: F) -> impl Future<Output = F::Output> + use<F>
    where
        F: Future,
    {
        let running = Running::new(self.shared.clone(), (self.role.clone(), name));
        // No parent: a task started from one request's span (a shared watcher, a relay) must
        // not log under, and keep alive, that request's connection span.
        let span = tracing::debug_span!(parent: None, "task", role = %self.role, name);
        async move {
            let out = fut.await;
            drop(running);
            out
        }
        .instrument(span)
    }

    /// Spawns a named helper task that ends on its own by shutdown (it watches a token that is
    /// a child of [`shutdown`](Self::shutdown), or its work is short). The drain waits for it.
    pub fn spawn<F>(&self, name: &'static str, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.shared.tracker.spawn(self.wrap(name, fut))
    }

    /// Spawns a named helper task that is dropped at shutdown: one that sleeps on a timer or
    /// waits on a peer. `None` when shutdown came first.
    pub fn spawn_until_shutdown<F>(
        &self,
        name: &'static str,
        fut: F,
    ) -> JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let shutdown = self.shutdown.clone();
        self.spawn(name, async move {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => None,
                out = fut => Some(out),
            }
        })
    }

    /// [`spawn_until_shutdown`](Self::spawn_until_shutdown) from a `Drop` impl, which may
    /// run outside a runtime: then nothing is spawned and `false` returned.
    pub fn spawn_in_drop<F>(&self, name: &'static str, fut: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let shutdown = self.shutdown.clone();
        let fut = self.wrap(name, async move {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {}
                () = fut => {}
            }
        });
        self.shared.tracker.spawn_on(fut, &rt);
        true
    }

    /// From a `Drop` impl: runs `fut` for at most `limit`, shutdown or not (a message that
    /// must still go out, such as an upstream's cancel when shutdown dropped its caller).
    /// Outside a runtime nothing is spawned and `false` returned.
    pub fn spawn_in_drop_bounded<F>(&self, name: &'static str, limit: Duration, fut: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let fut = self.wrap(name, async move {
            let _ = tokio::time::timeout(limit, fut).await;
        });
        self.shared.tracker.spawn_on(fut, &rt);
        true
    }

    /// Waits (at most `bound`) until no task of this context's role name runs: a role a
    /// reload stopped ([`stop_alone`](Self::stop_alone)) has let go of the store and its
    /// sockets before its new self starts. `false` when some still ran at the bound.
    pub async fn wait_stopped(&self, bound: Duration) -> bool {
        let role = self.role.clone();
        let idle = async {
            loop {
                let ended = self.shared.ended.notified();
                tokio::pin!(ended);
                // Registered before looking, so an end between the look and the wait wakes it.
                ended.as_mut().enable();
                if !self.shared.running.locked().keys().any(|(r, _)| *r == role) {
                    return;
                }
                ended.await;
            }
        };
        tokio::time::timeout(bound, idle).await.is_ok()
    }

    /// The tasks running now, as `role/name` with a count, sorted.
    pub fn running(&self) -> Vec<(String, usize)> {
        self.shared
            .running
            .locked()
            .iter()
            .map(|((role, name), n)| (format!("{role}/{name}"), *n))
            .collect()
    }

    /// Shuts down (if that has not happened yet), stops taking new work into the count of
    /// what the drain waits for, and waits at most `grace` for every tracked task. On time
    /// out, names what is still running (and logs it).
    pub async fn drain(&self, grace: Duration) -> Result<(), Vec<(String, usize)>> {
        self.shared.shutdown.cancel();
        self.shutdown.cancel();
        self.shared.tracker.close();
        if tokio::time::timeout(grace, self.shared.tracker.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
        let left = self.running();
        tracing::warn!(
            still_running = ?left,
            "some tasks did not finish within the shutdown deadline"
        );
        Err(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tasks_are_counted_by_name_and_drained() {
        let ctx = RoleContext::new("file");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let h = ctx.spawn("reader", async move {
            let _ = rx.await;
            7
        });
        let sleeper =
            ctx.spawn_until_shutdown("lease", tokio::time::sleep(Duration::from_secs(300)));
        tokio::task::yield_now().await;
        assert_eq!(
            ctx.running(),
            vec![("file/lease".into(), 1), ("file/reader".into(), 1)]
        );
        tx.send(()).unwrap();
        assert_eq!(h.await.unwrap(), 7);
        // The lease sleeps five minutes; the drain ends it at once.
        assert_eq!(ctx.drain(Duration::from_secs(1)).await, Ok(()));
        assert_eq!(sleeper.await.unwrap(), None);
        assert!(ctx.running().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_shutdown_is_named_by_the_drain() {
        let ctx = RoleContext::new("k8s");
        let other = ctx.for_role("gateway");
        other.spawn("stuck", std::future::pending::<()>());
        tokio::task::yield_now().await;
        let left = ctx.drain(Duration::from_secs(2)).await.unwrap_err();
        assert_eq!(left, vec![("gateway/stuck".into(), 1)]);
        assert!(other.shutdown().is_cancelled(), "for_role shares the token");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_drop_task_runs_even_after_shutdown() {
        let ctx = RoleContext::new("gateway");
        ctx.shutdown().cancel();
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert!(
            ctx.spawn_in_drop_bounded("cancel", Duration::from_secs(1), async move {
                let _ = tx.send(());
            })
        );
        assert!(ctx.spawn_in_drop_bounded("stuck", Duration::from_secs(1), std::future::pending()));
        assert_eq!(
            ctx.drain(Duration::from_secs(5)).await,
            Ok(()),
            "the bound ends the stuck one"
        );
        assert_eq!(rx.await, Ok(()), "the message went out after shutdown");
    }

    #[tokio::test]
    async fn spawn_in_drop_needs_a_runtime_and_ends_at_shutdown() {
        let ctx = RoleContext::new("k8s");
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert!(ctx.spawn_in_drop("ran", async move {
            let _ = tx.send(());
        }));
        assert_eq!(rx.await, Ok(()), "a drop task runs while not shutting down");
        assert!(ctx.spawn_in_drop("linger", std::future::pending()));
        let c2 = ctx.clone();
        let outside = std::thread::spawn(move || c2.spawn_in_drop("linger", async {}))
            .join()
            .unwrap();
        assert!(!outside, "no runtime on that thread: nothing spawned");
        assert_eq!(ctx.drain(Duration::from_secs(5)).await, Ok(()));
    }
}
