//! Webhook subscriptions shared by a gateway's replicas (`herald gateway --backend nats://…`):
//! kept in a NATS key-value bucket instead of the store, sealed as there. Any replica takes
//! `events/subscribe` and `events/unsubscribe`; one replica at a time, the one holding the
//! claim, follows and delivers them all.
//!
//! - **Rows.** `sub.<id>` holds the sealed subscription. A subscribe makes or refreshes its
//!   row by compare-and-set, writing the subscriber's fields (secret, TTL, token); the
//!   deliverer writes its progress (cursor, pending message, last delivery) the same way.
//!   Each side keeps the other's fields as the row holds them. An unsubscribe, or the
//!   deliverer ending a subscription, deletes the row. A row made anew carries a new
//!   incarnation (`born`): a follower is replaced only for another incarnation, and deletes
//!   only its own (never a row subscribed anew meanwhile).
//! - **The view.** Every replica watches the bucket and keeps every row it saw, by revision
//!   (a row this replica deleted is remembered as deleted until the watch says so), so it
//!   knows every subscription (for the limits), and the deliverer starts, refreshes and stops
//!   its followers from it without reading NATS in its loop.
//! - **The claim.** The key `deliver` names the deliverer ([`holder::identity`]), renewed every
//!   [`HEARTBEAT`] by compare-and-set; only a write of its own makes a replica the deliverer.
//!   A replica that stops deletes it, and another takes it at once. A deliverer of this host
//!   that is gone is taken over after one missed beat; any other once the claim's revision
//!   stood still for [`STALE`] by the taker's clock. A deliverer stops delivering (no POST
//!   leaves) once [`STEP_DOWN`] passed since its last renewal was sent, and stands down when
//!   its watch of the bucket is down that long: before anyone may take over.
//! - **At a takeover** the new deliverer resumes each subscription from its kept cursor and
//!   pending message: nothing is lost. A message in flight may be sent twice, under the same
//!   `webhook-id`, which receivers drop repeats by.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
/// A deliverer whose last renewal was sent this long ago sends nothing more.
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
    /// Every row as last seen: id → (revision, the subscription; `None`: deleted here, the
    /// watch not yet past it).
    view: Mutex<HashMap<String, (u64, Option<Sub>)>>,
    /// Until when this replica may deliver (`None`: it is not the deliverer).
    until: tokio::sync::watch::Sender<Option<Instant>>,
}

impl Shared {
    pub(super) fn new(kv: kv::Store) -> Shared {
        Shared {
            kv,
            view: Mutex::default(),
            until: tokio::sync::watch::Sender::new(None),
        }
    }

    /// How many live subscriptions are kept, and how many of them `principal`'s.
    pub(super) fn counts(&self, principal: &str) -> (usize, usize) {
        let now = now_ms();
        let view = self.view.locked();
        let live = || {
            view.values()
                .filter_map(|(_, s)| s.as_ref())
                .filter(|s| s.expires_ms > now)
        };
        (
            live().count(),
            live().filter(|s| s.principal == principal).count(),
        )
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

/// What a row holds, as [`Hooks::write_row`] read it.
struct Row {
    /// Its revision (a delete marker's too); `None`: never written.
    revision: Option<u64>,
    sub: Option<Sub>,
}

/// What [`Hooks::expired_on_row`] found of a subscription whose TTL is out here.
pub(super) enum Expiry {
    /// Refreshed through another replica, or NATS could not say now: it goes on (asked
    /// again at the next expiry check).
    Refreshed,
    /// Out on its row too, which is deleted now (not shared: out).
    Out,
    /// Its row was gone already (unsubscribed elsewhere), or is another incarnation's (made
    /// anew since), which its own follower runs.
    Gone,
}

impl Hooks {
    fn shared(&self) -> &Shared {
        self.inner
            .shared
            .as_ref()
            .expect("called with a NATS backend only")
    }

    /// Until when this process may POST: `Some(None)` (no end) unless it shares the
    /// subscriptions; `None` when it does not hold the claim, renewed lately, now.
    pub(super) fn deliver_until(&self) -> Option<Option<Instant>> {
        let Some(shared) = &self.inner.shared else {
            return Some(None);
        };
        let until = (*shared.until.borrow())?;
        (Instant::now() < until).then_some(Some(until))
    }

    /// Resolves when this process may POST, with until when (`None`: no end): at once
    /// unless it shares the subscriptions; then while it holds the claim, renewed lately.
    pub(super) async fn deliverable(&self) -> Option<Instant> {
        let shared = self.inner.shared.as_ref()?;
        let mut until = shared.until.subscribe();
        loop {
            let now = Instant::now();
            let at = *until.borrow_and_update();
            match at {
                Some(u) if now < u => return Some(u),
                _ => {
                    if until.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    async fn read_row(&self, id: &str) -> Result<Row, McpError> {
        let entry = tokio::time::timeout(OP_TIMEOUT, self.shared().kv.entry(key(id)))
            .await
            .map_err(|_| unavailable("no answer in time"))?
            .map_err(unavailable)?;
        let Some(e) = entry else {
            return Ok(Row {
                revision: None,
                sub: None,
            });
        };
        if e.operation != kv::Operation::Put {
            return Ok(Row {
                revision: Some(e.revision),
                sub: None,
            });
        }
        match self.open(id, &e.value) {
            Some(sub) => Ok(Row {
                revision: Some(e.revision),
                sub: Some(sub),
            }),
            None => Err(McpError::internal_error(
                "a webhook subscription on NATS does not open with this HERALD_EVENTS_KEY; every gateway replica needs the same key",
                None,
            )),
        }
    }

    /// Writes row `id` as `change` makes it from what it holds (`None`: deleted), by
    /// compare-and-set, reading again when another writer came first; a row `change` leaves
    /// as it was is not written. Returns what it holds now; the view learns it at once.
    pub(super) async fn write_row(
        &self,
        id: &str,
        mut change: impl FnMut(Option<Sub>) -> Result<Option<Sub>, McpError>,
    ) -> Result<Option<Sub>, McpError> {
        let kv = &self.shared().kv;
        for _ in 0..WRITE_TRIES {
            let Row { revision, sub } = self.read_row(id).await?;
            let had = sub
                .as_ref()
                .map(|s| serde_json::to_vec(s).unwrap_or_default());
            let next = change(sub)?;
            if let (Some(was), Some(next)) = (&had, &next)
                && serde_json::to_vec(next).is_ok_and(|n| n == *was)
            {
                return Ok(Some(next.clone()));
            }
            let had = had.is_some();
            let written = tokio::time::timeout(OP_TIMEOUT, async {
                let conflict =
                    |conflict: bool, e: &dyn std::fmt::Display| (conflict, e.to_string());
                match (&next, revision) {
                    (Some(sub), None) => kv
                        .create(key(id), self.seal(sub).into())
                        .await
                        .map(Some)
                        .map_err(|e| conflict(e.kind() == kv::CreateErrorKind::AlreadyExists, &e)),
                    (Some(sub), Some(rev)) => kv
                        .update(key(id), self.seal(sub).into(), rev)
                        .await
                        .map(Some)
                        .map_err(|e| {
                            conflict(e.kind() == kv::UpdateErrorKind::WrongLastRevision, &e)
                        }),
                    (None, Some(rev)) if had => kv
                        .delete_expect_revision(key(id), Some(rev))
                        .await
                        .map(|()| Some(rev))
                        .map_err(|e| {
                            conflict(e.kind() == kv::DeleteErrorKind::WrongLastRevision, &e)
                        }),
                    (None, _) => Ok(None),
                }
            })
            .await
            .map_err(|_| unavailable("no answer in time"))?;
            match written {
                Ok(at) => {
                    if let (Some(at), None) = (at, &next) {
                        // Deleted at `at`, ahead of the watch: a change of the row it brings
                        // later that is no newer does not start it again.
                        let mut view = self.shared().view.locked();
                        if view.get(id).is_none_or(|(r, _)| *r <= at) {
                            view.insert(id.to_owned(), (at, None));
                        }
                    }
                    return Ok(next);
                }
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

    /// The deliverer's progress on the row as it is now (a refresh elsewhere keeps its
    /// fields); a row gone meanwhile (unsubscribed elsewhere) stops the follower.
    pub(super) async fn keep_shared(&self, id: &str, sub: &Arc<Mutex<Sub>>, snapshot: Sub) {
        if self.deliver_until().is_none() {
            // Not the deliverer now: the next one keeps its own progress.
            return;
        }
        // Only onto its own incarnation: one made anew meanwhile starts from its own cursor.
        let born = snapshot.born;
        let mut other = false;
        let written = self
            .write_row(id, |row| {
                other = row.as_ref().is_some_and(|r| !r.of_incarnation(born));
                Ok(row.map(|mut r| {
                    if !other {
                        r.take_progress(&snapshot);
                    }
                    r
                }))
            })
            .await;
        match written {
            Ok(Some(_)) if !other => {}
            Ok(_) => {
                self.stop_local(id, Some(sub));
            }
            Err(e) => {
                tracing::error!(subscription = %id, error = %e.message, "cannot keep a webhook subscription's progress");
            }
        }
    }

    /// Ends `sub` (the deliverer's follower of `id`): its row deleted if it is still the
    /// incarnation the follower holds (one made anew meanwhile is left to its own follower),
    /// then the follower. Whether it ended here: its row deleted now, and no newer follower
    /// of `id` runs (then the receiver is told).
    pub(super) async fn forget_shared(&self, id: &str, sub: &Arc<Mutex<Sub>>) -> bool {
        let born = sub.locked().born;
        let mut ours = false;
        let deleted = self
            .write_row(id, |row| {
                ours = row.as_ref().is_some_and(|r| r.of_incarnation(born));
                Ok(row.filter(|r| !r.of_incarnation(born)))
            })
            .await;
        let alone = self.stop_local(id, Some(sub));
        match deleted {
            Ok(_) => alone && ours,
            Err(e) => {
                // Perhaps deleted all the same (its answer lost): told now; a next deliverer
                // ending it again tells under the same webhook-id, which receivers drop.
                tracing::error!(subscription = %id, error = %e.message, "cannot delete an ended webhook subscription on NATS; the next deliverer starts it again");
                alone
            }
        }
    }

    /// Stops the follower of `id` here if it follows incarnation `born` (a newer one is left).
    pub(super) fn stop_incarnation(&self, id: &str, born: u64) {
        let running = self
            .inner
            .subs
            .locked()
            .get(id)
            .filter(|r| r.sub.locked().of_incarnation(born))
            .map(|r| r.sub.clone());
        if let Some(sub) = running {
            self.stop_local(id, Some(&sub));
        }
    }

    /// Whether `sub`'s TTL is out on its row too, and if so the row is deleted in the same
    /// compare-and-set: a refresh through another replica, even one landing between the read
    /// and the delete, is taken in instead ([`Expiry::Refreshed`]), never deleted.
    pub(super) async fn expired_on_row(&self, sub: &Arc<Mutex<Sub>>) -> Expiry {
        if self.inner.shared.is_none() {
            return Expiry::Out;
        }
        let (id, born) = {
            let s = sub.locked();
            (s.id.clone(), s.born)
        };
        let mut found = false;
        let mut other = false;
        let still = self
            .write_row(&id, |row| {
                found = row.is_some();
                other = row.as_ref().is_some_and(|r| !r.of_incarnation(born));
                Ok(row.filter(|r| other || r.expires_ms > now_ms()))
            })
            .await;
        match still {
            // Made anew (after an unsubscribe): its own follower runs it.
            Ok(Some(_)) if other => Expiry::Gone,
            Ok(Some(row)) => {
                sub.locked().take_subscriber(&row);
                Expiry::Refreshed
            }
            Ok(None) if found => Expiry::Out,
            Ok(None) => Expiry::Gone,
            Err(_) => {
                // NATS cannot say now: asked again in a moment (never ended on a guess).
                tokio::time::sleep(Duration::from_secs(1)).await;
                Expiry::Refreshed
            }
        }
    }

    /// One change of a row, seen by the watch: the view follows it, and the deliverer
    /// starts, refreshes or stops the subscription's follower.
    fn apply(&self, server: &SourceServer, leading: bool, entry: kv::Entry) {
        let Some(id) = entry.key.strip_prefix("sub.") else {
            return;
        };
        let sub = match entry.operation {
            kv::Operation::Put => match self.open(id, &entry.value) {
                Some(sub) => Some(sub),
                None => {
                    tracing::warn!(subscription = %id, "a webhook subscription on NATS does not open with this HERALD_EVENTS_KEY; every gateway replica needs the same key");
                    return;
                }
            },
            _ => None,
        };
        let stands;
        {
            let mut view = self.shared().view.locked();
            if view.get(id).is_some_and(|(rev, _)| *rev >= entry.revision) {
                return;
            }
            // Whether the set of rows stands (a refresh or the deliverer's progress of a row
            // known, a delete of one not known): then the count and the rest of the view do.
            stands = match &sub {
                Some(s) => view
                    .insert(id.to_owned(), (entry.revision, Some(s.clone())))
                    .is_some_and(|(_, s)| s.is_some()),
                // The delete itself: nothing older can come after it.
                None => view.remove(id).is_none(),
            };
            if !stands {
                // Rows the bucket's max_age dropped without a word (at the earliest a day
                // after their time ran out): a row whose time ran out lately stays, for the
                // next deliverer to end and tell its receiver.
                let now = now_ms();
                let kept = super::ROTATION.as_millis() as u64;
                view.retain(|_, (_, s)| s.as_ref().is_none_or(|s| s.expires_ms + kept > now));
                drop(view);
                self.set_count();
            }
        }
        if !leading {
            return;
        }
        let Some(sub) = sub else {
            self.stop_local(id, None);
            return;
        };
        let running = self.inner.subs.locked().get(id).map(|r| r.sub.clone());
        let same = running
            .as_ref()
            .is_some_and(|r| r.locked().of_incarnation(sub.born));
        match running {
            // A refresh (or this deliverer's own progress coming back): the subscriber's
            // fields as the row holds them.
            Some(r) if same => r.locked().take_subscriber(&sub),
            // A row made anew (after its expiry or an unsubscribe, the old follower not
            // stopped yet), or the first: a follower of its own, which replaces the old one.
            _ => self.deliver_from(server, sub),
        }
    }

    /// Follows `sub`: one whose time is out too (no deliverer ran when it expired), which its
    /// follower ends at once, as any expiry, telling its receiver.
    fn deliver_from(&self, server: &SourceServer, sub: Sub) {
        tracing::info!(subscription = %sub.id, event = %sub.name, "delivering a webhook subscription");
        let _ = self.run(server, sub, false);
    }

    /// This replica begins delivering: every subscription of the view.
    fn lead(&self, server: &SourceServer) {
        tracing::info!("this gateway replica delivers the webhook subscriptions now");
        self.inner.metrics.deliverer.set(1);
        let subs: Vec<Sub> = self
            .shared()
            .view
            .locked()
            .values()
            .filter_map(|(_, s)| s.clone())
            .collect();
        for sub in subs {
            if !self.inner.subs.locked().contains_key(&sub.id) {
                self.deliver_from(server, sub);
            }
        }
    }

    /// This replica stops delivering (the rows stay, for the next deliverer).
    fn stand_down(&self) {
        self.shared().until.send_replace(None);
        self.inner.metrics.deliverer.set(0);
        let ids: Vec<String> = self.inner.subs.locked().keys().cloned().collect();
        for id in ids {
            self.stop_local(&id, None);
        }
    }

    fn set_count(&self) {
        let n = self.shared().counts("").0;
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
        // Since when the watch is down (a deliverer blind to unsubscribes stands down).
        let mut blind: Option<Instant> = Some(Instant::now());
        // Whether the watch has replayed the bucket as it was when opened: only then may this
        // replica take the claim (and lead from a whole view).
        let mut current = false;
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            if watch.is_none() && Instant::now() >= reopen_at {
                let opened =
                    tokio::time::timeout(OP_TIMEOUT, self.shared().kv.watch_with_history(">"))
                        .await;
                match opened {
                    Ok(Ok(w)) => {
                        watch = Some(w);
                        blind = None;
                        // An empty bucket has nothing to replay.
                        current = tokio::time::timeout(OP_TIMEOUT, self.shared().kv.status())
                            .await
                            .is_ok_and(|s| s.is_ok_and(|s| s.values() == 0));
                    }
                    r => {
                        let e = match r {
                            Ok(Err(e)) => e.to_string(),
                            _ => "no answer in time".to_owned(),
                        };
                        tracing::warn!(error = %e, "cannot watch the webhook subscriptions on NATS; trying again");
                        reopen_at = Instant::now() + backoff.next_delay();
                    }
                }
            }
            let was = claim.leading();
            // Renewals come first, however busy the watch is.
            if Instant::now() >= claim.next {
                claim.step(blind.is_none() && current).await;
            } else {
                let wake = if watch.is_none() {
                    claim.next.min(reopen_at)
                } else {
                    claim.next
                };
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    e = next_entry(&mut watch) => match e {
                        Some(entry) => {
                            backoff.reset();
                            current |= entry.delta == 0;
                            if entry.key == CLAIM {
                                claim.seen(&entry);
                            } else {
                                self.apply(&server, was, entry);
                            }
                        }
                        None => {
                            watch = None;
                            current = false;
                            blind.get_or_insert_with(Instant::now);
                            reopen_at = Instant::now() + backoff.next_delay();
                        }
                    },
                    _ = tokio::time::sleep_until(wake) => {}
                }
            }
            // A watch that failed, or one that stopped bringing this replica's own renewals
            // (async-nats keeps a consumer it cannot re-create pending): blind.
            if claim.leading()
                && (blind.is_some_and(|b| b.elapsed() >= STEP_DOWN)
                    || claim.echoed.elapsed() >= STEP_DOWN + HEARTBEAT)
            {
                tracing::warn!(
                    "the watch of the webhook subscriptions on NATS is down; this replica stops delivering them and lets another"
                );
                // Stopped before the claim is let go: another takes it at once.
                self.stand_down();
                claim.release().await;
                watch = None;
                current = false;
                blind.get_or_insert_with(Instant::now);
            }
            let until = claim.until();
            self.shared().until.send_if_modified(|u| {
                let changed = *u != until;
                *u = until;
                changed
            });
            match (was, claim.leading()) {
                (false, true) => self.lead(&server),
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
    /// Held: its revision and when the write that made it was sent.
    held: Option<(u64, Instant)>,
    /// Held by another (or by this process in a spell it lost): its revision, holder and
    /// when this replica saw that revision first.
    seen: Option<(u64, String, Instant)>,
    /// When to step next (renew, or look whether it can be taken).
    next: Instant,
    /// When the watch last brought this replica's own claim (or it took it).
    echoed: Instant,
    /// The revision of its own claim this replica last tried to take back at once.
    retook: Option<u64>,
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
            echoed: Instant::now(),
            retook: None,
        }
    }

    fn leading(&self) -> bool {
        self.held.is_some()
    }

    /// Until when this replica may deliver.
    fn until(&self) -> Option<Instant> {
        self.held.map(|(_, sent)| sent + STEP_DOWN)
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
        if self.held.is_some_and(|(rev, _)| entry.revision <= rev) {
            self.echoed = Instant::now();
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
        if holder == self.me && self.held.is_some() {
            // A renewal whose answer was lost: the next one meets its revision, reads it
            // and renews at it.
            self.echoed = Instant::now();
            return;
        }
        self.held = None;
        self.saw(entry.revision, holder);
    }

    /// Renews the claim, or takes it (with `may_take`) if it is free or its holder is gone.
    async fn step(&mut self, may_take: bool) {
        let now = Instant::now();
        if let Some((rev, sent)) = self.held {
            if now.duration_since(sent) >= STEP_DOWN {
                // Too late to renew: no longer the deliverer (it may take the claim back).
                self.held = None;
                self.seen = Some((rev, self.me.clone(), sent));
                self.next = now + Duration::from_secs(1);
                return;
            }
            let r =
                tokio::time::timeout(OP_TIMEOUT, self.kv.update(CLAIM, self.value(), rev)).await;
            match r {
                Ok(Ok(r)) => {
                    self.held = Some((r, now));
                    self.next = now + HEARTBEAT;
                }
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    match tokio::time::timeout(OP_TIMEOUT, self.kv.entry(CLAIM)).await {
                        // A renewal of its own whose answer was lost: renewed at it, the
                        // deliverer all along (since the last renewal known sent).
                        Ok(Ok(Some(e)))
                            if e.operation == kv::Operation::Put
                                && holder_of(&e.value) == self.me =>
                        {
                            self.held = Some((e.revision, sent));
                            self.next = now;
                        }
                        _ => {
                            self.held = None;
                            self.look().await;
                        }
                    }
                }
                _ => self.next = now + Duration::from_secs(1),
            }
            return;
        }
        let take = match &self.seen {
            _ if !may_take => None,
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
                    .map_or(now + Duration::from_secs(1), |(_, _, at)| {
                        Self::look_at(*at).max(now + Duration::from_millis(100))
                    });
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
                self.held = Some((r, now));
                self.seen = None;
                self.next = now + HEARTBEAT;
                self.echoed = now;
            }
            _ => self.look().await,
        }
    }

    /// Reads who holds the claim now (never taking it: only a write of this process's own
    /// does).
    async fn look(&mut self) {
        let now = Instant::now();
        match tokio::time::timeout(OP_TIMEOUT, self.kv.entry(CLAIM)).await {
            Ok(Ok(Some(e))) if e.operation == kv::Operation::Put => {
                let holder = holder_of(&e.value);
                // This process's own (a renewal whose answer was lost): taken back at once,
                // once per revision (a write that keeps failing is tried each second).
                let again = holder == self.me && self.retook != Some(e.revision);
                if again {
                    self.retook = Some(e.revision);
                }
                self.saw(e.revision, holder);
                self.next = if again {
                    now
                } else {
                    self.next.max(now + Duration::from_millis(100))
                };
            }
            // Free, but taking it just failed: try again in a moment.
            Ok(Ok(_)) => {
                self.seen = None;
                self.next = now + Duration::from_secs(1);
            }
            _ => self.next = now + Duration::from_secs(1),
        }
    }

    /// Deletes the claim if this replica holds it (at the revision read, should a renewal's
    /// answer have been lost), so another takes it at once.
    async fn release(&mut self) {
        let Some((rev, _)) = self.held.take() else {
            return;
        };
        let kv = &self.kv;
        let gone = tokio::time::timeout(OP_TIMEOUT, kv.delete_expect_revision(CLAIM, Some(rev)))
            .await
            .is_ok_and(|r| r.is_ok());
        if !gone
            && let Ok(Ok(Some(e))) = tokio::time::timeout(OP_TIMEOUT, kv.entry(CLAIM)).await
            && e.operation == kv::Operation::Put
            && holder_of(&e.value) == self.me
        {
            let _ = tokio::time::timeout(
                OP_TIMEOUT,
                kv.delete_expect_revision(CLAIM, Some(e.revision)),
            )
            .await;
        }
    }
}
