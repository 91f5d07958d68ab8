//! Webhook subscriptions shared by a gateway's replicas (`herald gateway --backend nats://…`):
//! kept in a NATS key-value bucket instead of the store, sealed as there. Any replica takes
//! `events/subscribe` and `events/unsubscribe`; one replica at a time, the one holding the
//! claim, follows and delivers them all.
//!
//! - **Rows.** `sub.<id>` holds the sealed subscription. A subscribe makes or refreshes its
//!   row by compare-and-set, writing the subscriber's fields (secret, TTL, token); the
//!   deliverer writes its progress (cursor, pending message, last delivery) the same way.
//!   Each side keeps the other's fields as the row holds them. An unsubscribe, or the
//!   deliverer ending a subscription, deletes the row.
//! - **The view.** Every replica watches the bucket, so it knows every subscription (for the
//!   limits). The deliverer starts, refreshes and stops its followers from what it sees.
//! - **The claim.** The key `deliver` names the deliverer ([`holder::identity`]), renewed every
//!   [`HEARTBEAT`] by compare-and-set. A replica that stops deletes it, and another takes it at
//!   once. A deliverer of this host that is gone is taken over after one missed beat; any other
//!   once the claim's revision stood still for [`STALE`] by the taker's clock. A deliverer that
//!   cannot renew for [`STEP_DOWN`] stops delivering before anyone may take over.
//! - **At a takeover** the new deliverer resumes each subscription from its kept cursor and
//!   pending message: nothing is lost. A message in flight may be sent twice, under the same
//!   `webhook-id`, which receivers drop repeats by.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use rmcp::model::ErrorData as McpError;
use tokio::time::Instant;

use super::{Hooks, Sub, now_ms};
use crate::mcp::server::SourceServer;
use crate::nats::holder;
use crate::runtime::backoff::Backoff;
use crate::sync::Recover;

/// How often the deliverer renews its claim.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// A claim whose revision stood still this long is taken over.
pub const STALE: Duration = Duration::from_secs(20);
/// A deliverer that could not renew its claim for this long stops delivering.
pub const STEP_DOWN: Duration = Duration::from_secs(10);
/// How long one read or write of the bucket may take.
const OP_TIMEOUT: Duration = Duration::from_secs(3);
/// Tries of one compare-and-set write that meets other writers.
const WRITE_TRIES: usize = 16;
const CLAIM: &str = "deliver";

fn key(id: &str) -> String {
    format!("sub.{id}")
}

/// A replica's share of the subscriptions kept on NATS.
pub(super) struct Shared {
    kv: kv::Store,
    /// Every subscription as last seen: id → (revision, subscription).
    view: Mutex<HashMap<String, (u64, Sub)>>,
}

impl Shared {
    pub(super) fn new(kv: kv::Store) -> Shared {
        Shared {
            kv,
            view: Mutex::default(),
        }
    }

    /// How many subscriptions are kept, and how many of them `principal`'s.
    pub(super) fn counts(&self, principal: &str) -> (usize, usize) {
        let view = self.view.locked();
        let mine = view
            .values()
            .filter(|(_, s)| s.principal == principal)
            .count();
        (view.len(), mine)
    }
}

fn unavailable(e: impl std::fmt::Display) -> McpError {
    McpError::internal_error(
        format!(
            "webhook subscriptions are kept on NATS, which did not answer ({e}); try again in a moment"
        ),
        None,
    )
}

impl Hooks {
    fn shared(&self) -> &Shared {
        self.inner
            .shared
            .as_ref()
            .expect("called with a NATS backend only")
    }

    /// The subscription in row `id`: its revision (a delete marker's too) and what it holds.
    async fn read_row(&self, id: &str) -> Result<(Option<u64>, Option<Sub>), McpError> {
        let entry = tokio::time::timeout(OP_TIMEOUT, self.shared().kv.entry(key(id)))
            .await
            .map_err(|_| unavailable("no answer in time"))?
            .map_err(unavailable)?;
        let Some(e) = entry else {
            return Ok((None, None));
        };
        if e.operation != kv::Operation::Put {
            return Ok((Some(e.revision), None));
        }
        match self.open(id, &e.value) {
            Some(sub) => Ok((Some(e.revision), Some(sub))),
            None => Err(McpError::internal_error(
                "a webhook subscription on NATS does not open with this HERALD_EVENTS_KEY; every gateway replica needs the same key",
                None,
            )),
        }
    }

    /// Writes row `id` as `change` makes it from what it holds (`None`: deleted), by
    /// compare-and-set, reading again when another writer came first. Returns what it holds
    /// now.
    pub(super) async fn write_row(
        &self,
        id: &str,
        mut change: impl FnMut(Option<Sub>) -> Result<Option<Sub>, McpError>,
    ) -> Result<Option<Sub>, McpError> {
        let kv = &self.shared().kv;
        for _ in 0..WRITE_TRIES {
            let (revision, now) = self.read_row(id).await?;
            let had = now.is_some();
            let next = change(now)?;
            let written = tokio::time::timeout(OP_TIMEOUT, async {
                match (&next, revision, had) {
                    (Some(sub), None, _) => kv
                        .create(key(id), self.seal(sub).into())
                        .await
                        .map(|_| ())
                        .map_err(|e| {
                            (
                                e.kind() == kv::CreateErrorKind::AlreadyExists,
                                e.to_string(),
                            )
                        }),
                    (Some(sub), Some(rev), _) => kv
                        .update(key(id), self.seal(sub).into(), rev)
                        .await
                        .map(|_| ())
                        .map_err(|e| {
                            (
                                e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                                e.to_string(),
                            )
                        }),
                    (None, Some(rev), true) => kv
                        .delete_expect_revision(key(id), Some(rev))
                        .await
                        .map_err(|e| {
                            (
                                e.kind() == kv::DeleteErrorKind::WrongLastRevision,
                                e.to_string(),
                            )
                        }),
                    (None, _, _) => Ok(()),
                }
            })
            .await
            .map_err(|_| unavailable("no answer in time"))?;
            match written {
                Ok(()) => return Ok(next),
                Err((true, _)) => continue,
                Err((false, e)) => return Err(unavailable(e)),
            }
        }
        Err(unavailable("too many writers at once"))
    }

    fn seal(&self, sub: &Sub) -> Vec<u8> {
        let plain = serde_json::to_vec(sub).expect("a subscription serializes");
        self.inner.sealer.seal(&self.row(&sub.id), &plain)
    }

    fn open(&self, id: &str, bytes: &[u8]) -> Option<Sub> {
        let plain = self.inner.sealer.open(&self.row(id), bytes).ok()?;
        serde_json::from_slice::<Sub>(&plain)
            .ok()
            .filter(|s| s.id == id)
    }

    /// One change of a row, seen by the watch: the view follows it, and the deliverer
    /// starts, refreshes or stops the subscription's follower.
    async fn apply(&self, server: &SourceServer, leading: bool, entry: kv::Entry) {
        let Some(id) = entry.key.strip_prefix("sub.") else {
            return;
        };
        let shared = self.shared();
        if entry.operation != kv::Operation::Put {
            shared.view.locked().remove(id);
            self.set_count();
            if leading {
                self.stop_local(id);
            }
            return;
        }
        let Some(sub) = self.open(id, &entry.value) else {
            tracing::warn!(subscription = %id, "a webhook subscription on NATS does not open with this HERALD_EVENTS_KEY; every gateway replica needs the same key");
            return;
        };
        {
            let mut view = shared.view.locked();
            if view.get(id).is_some_and(|(rev, _)| *rev >= entry.revision) {
                return;
            }
            view.insert(id.to_owned(), (entry.revision, sub.clone()));
        }
        self.set_count();
        if !leading {
            return;
        }
        let running = self.inner.subs.locked().get(id).map(|r| r.sub.clone());
        match running {
            // A refresh (or this deliverer's own progress coming back): the subscriber's
            // fields as the row holds them.
            Some(r) => r.locked().take_subscriber(&sub),
            None => self.start_current(server, id).await,
        }
    }

    /// Starts following subscription `id` as its row holds it now (not as a watch saw it
    /// earlier: a row this deliverer just ended is not brought back).
    async fn start_current(&self, server: &SourceServer, id: &str) {
        match self.read_row(id).await {
            Ok((_, Some(sub))) if sub.expires_ms > now_ms() => {
                tracing::info!(subscription = %sub.id, event = %sub.name, "delivering a webhook subscription");
                let _ = self.run(server, sub, false);
            }
            Ok((_, Some(_))) => {
                let _ = self.write_row(id, |_| Ok(None)).await;
            }
            Ok((_, None)) => {}
            Err(e) => {
                tracing::warn!(subscription = %id, error = %e.message, "cannot read a webhook subscription from NATS; it is started at the next change of it or of the deliverer");
            }
        }
    }

    /// This replica begins delivering: every subscription of the view.
    async fn lead(&self, server: &SourceServer) {
        tracing::info!("this gateway replica delivers the webhook subscriptions now");
        self.inner.metrics.deliverer.set(1);
        let ids: Vec<String> = self.shared().view.locked().keys().cloned().collect();
        for id in ids {
            if !self.inner.subs.locked().contains_key(&id) {
                self.start_current(server, &id).await;
            }
        }
    }

    /// This replica stops delivering (the rows stay, for the next deliverer).
    fn stand_down(&self) {
        self.inner.metrics.deliverer.set(0);
        let ids: Vec<String> = self.inner.subs.locked().keys().cloned().collect();
        for id in ids {
            self.stop_local(&id);
        }
    }

    fn set_count(&self) {
        let n = self.shared().view.locked().len();
        self.inner.metrics.subscriptions.set(n as u64);
    }

    /// Follows the bucket and holds (or waits for) the claim until shutdown; see the module
    /// docs.
    pub(super) async fn share(self, server: SourceServer) {
        let shutdown = self.inner.ctx.shutdown().clone();
        let mut claim = Claim::new(self.shared().kv.clone());
        let mut watch: Option<kv::Watch> = None;
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let mut reopen_at = Instant::now();
        loop {
            if watch.is_none() && Instant::now() >= reopen_at {
                match tokio::time::timeout(OP_TIMEOUT, self.shared().kv.watch_with_history(">"))
                    .await
                {
                    Ok(Ok(w)) => {
                        backoff.reset();
                        watch = Some(w);
                    }
                    r => {
                        let e = r.map_or_else(
                            |_| "no answer in time".to_owned(),
                            |r| r.err().map(|e| e.to_string()).unwrap_or_default(),
                        );
                        tracing::warn!(error = %e, "cannot watch the webhook subscriptions on NATS; trying again");
                        reopen_at = Instant::now() + backoff.next_delay();
                    }
                }
            }
            let was = claim.leading();
            let wake = if watch.is_none() {
                claim.next.min(reopen_at)
            } else {
                claim.next
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                e = next_entry(&mut watch) => match e {
                    Some(entry) if entry.key == CLAIM => claim.seen(&entry),
                    Some(entry) => self.apply(&server, was, entry).await,
                    None => {
                        watch = None;
                        reopen_at = Instant::now() + backoff.next_delay();
                    }
                },
                _ = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= claim.next {
                        claim.step().await;
                    }
                }
            }
            match (was, claim.leading()) {
                (false, true) => self.lead(&server).await,
                (true, false) => {
                    tracing::warn!(
                        "this gateway replica no longer delivers the webhook subscriptions (another took over, or NATS did not answer)"
                    );
                    self.stand_down();
                }
                _ => {}
            }
        }
        self.stand_down();
        claim.release().await;
    }
}

/// The watch's next entry; `None` when it ended or failed (pending forever without one).
async fn next_entry(watch: &mut Option<kv::Watch>) -> Option<kv::Entry> {
    match watch {
        Some(w) => match w.next().await {
            Some(Ok(e)) => Some(e),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the watch of the webhook subscriptions on NATS failed; opening it again");
                None
            }
            None => None,
        },
        None => std::future::pending().await,
    }
}

/// The deliverer's claim, as this replica holds or sees it.
struct Claim {
    kv: kv::Store,
    me: String,
    /// Held: its revision and when it was last written.
    held: Option<(u64, Instant)>,
    /// Held by another: its revision, holder and when this replica saw that revision first.
    seen: Option<(u64, String, Instant)>,
    /// When to step next (renew, or look whether it can be taken).
    next: Instant,
}

fn holder_of(value: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(value)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl Claim {
    fn new(kv: kv::Store) -> Claim {
        Claim {
            kv,
            me: holder::identity(),
            held: None,
            seen: None,
            next: Instant::now(),
        }
    }

    fn leading(&self) -> bool {
        self.held.is_some()
    }

    fn value(&self) -> bytes::Bytes {
        serde_json::to_vec(&serde_json::json!({"id": self.me, "at_ms": now_ms()}))
            .unwrap_or_default()
            .into()
    }

    /// When a waiting replica next looks at a claim it saw at `at`: after a missed beat (its
    /// holder may be gone from this host), then at the stale time.
    fn look_at(at: Instant) -> Instant {
        let missed = at + HEARTBEAT + HEARTBEAT / 2;
        if Instant::now() < missed {
            missed
        } else {
            at + STALE
        }
    }

    fn saw(&mut self, revision: u64, holder: String) {
        if self.seen.as_ref().is_none_or(|(r, _, _)| *r != revision) {
            self.seen = Some((revision, holder, Instant::now()));
        }
        if let Some((_, _, at)) = &self.seen {
            self.next = Self::look_at(*at);
        }
    }

    /// A change of the claim's key, seen by the watch.
    fn seen(&mut self, entry: &kv::Entry) {
        let mine = self.held.is_some_and(|(rev, _)| entry.revision <= rev);
        if mine {
            return;
        }
        if entry.operation != kv::Operation::Put {
            // Released (or lost with the bucket): take it now.
            self.held = None;
            self.seen = None;
            self.next = Instant::now();
            return;
        }
        let holder = holder_of(&entry.value);
        if holder == self.me
            && let Some((rev, _)) = &mut self.held
        {
            // A renewal whose answer was lost.
            *rev = entry.revision;
            return;
        }
        self.held = None;
        self.saw(entry.revision, holder);
    }

    /// Renews the claim, or takes it if it is free or its holder is gone.
    async fn step(&mut self) {
        let now = Instant::now();
        if let Some((rev, ok)) = self.held {
            let r =
                tokio::time::timeout(OP_TIMEOUT, self.kv.update(CLAIM, self.value(), rev)).await;
            match r {
                Ok(Ok(r)) => {
                    self.held = Some((r, now));
                    self.next = now + HEARTBEAT;
                }
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    self.held = None;
                    self.look().await;
                }
                _ => {
                    if now.duration_since(ok) >= STEP_DOWN {
                        self.held = None;
                        self.seen = Some((rev, self.me.clone(), ok));
                    }
                    self.next = now + Duration::from_secs(1);
                }
            }
            return;
        }
        let take = match &self.seen {
            None => Some(None),
            Some((rev, holder, at)) => (holder == &self.me
                || holder.is_empty()
                || holder::dead_here(holder)
                || holder::earlier_life(holder, &self.me)
                || now.duration_since(*at) >= STALE)
                .then_some(Some(*rev)),
        };
        let taken = match take {
            None => {
                self.next = self
                    .seen
                    .as_ref()
                    .map_or(now, |(_, _, at)| Self::look_at(*at));
                return;
            }
            Some(None) => tokio::time::timeout(OP_TIMEOUT, self.kv.create(CLAIM, self.value()))
                .await
                .map(|r| r.map_err(|e| e.to_string())),
            Some(Some(rev)) => {
                tokio::time::timeout(OP_TIMEOUT, self.kv.update(CLAIM, self.value(), rev))
                    .await
                    .map(|r| r.map_err(|e| e.to_string()))
            }
        };
        match taken {
            Ok(Ok(r)) => {
                self.held = Some((r, Instant::now()));
                self.seen = None;
                self.next = Instant::now() + HEARTBEAT;
            }
            _ => self.look().await,
        }
    }

    /// Reads who holds the claim now.
    async fn look(&mut self) {
        let now = Instant::now();
        match tokio::time::timeout(OP_TIMEOUT, self.kv.entry(CLAIM)).await {
            Ok(Ok(Some(e))) if e.operation == kv::Operation::Put => {
                let holder = holder_of(&e.value);
                if holder == self.me {
                    self.held = Some((e.revision, now));
                    self.next = now + HEARTBEAT;
                } else {
                    self.saw(e.revision, holder);
                }
            }
            // Free, but taking it just failed: try again in a moment.
            Ok(Ok(_)) => {
                self.seen = None;
                self.next = now + Duration::from_secs(1);
            }
            _ => self.next = now + Duration::from_secs(1),
        }
    }

    /// Deletes the claim if this replica holds it, so another takes it at once.
    async fn release(&self) {
        if let Some((rev, _)) = self.held {
            let _ =
                tokio::time::timeout(OP_TIMEOUT, self.kv.delete_expect_revision(CLAIM, Some(rev)))
                    .await;
        }
    }
}
