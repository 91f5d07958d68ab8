//! One webhook subscription's follower: the events of its type, from the source's own polls
//! ([`SourceServer::follow`], as `events/stream` follows them), each POSTed to the callback in
//! order and kept as delivered (its cursor in the store) only once the receiver took it.
//!
//! A failed POST is tried again after [`RETRIES`] (the same `webhook-id`, a fresh timestamp
//! and signature); 410 drops the subscription; 413 skips that event; an event too big for one
//! POST is skipped with a `gap` message; retries spent drop the subscription. Control messages
//! (`{"type": "gap" | "terminated", …}`) tell the receiver what it did not get and when the
//! subscription ends (its event type or the subscriber's entitlement gone, or its TTL out).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::deliver::{MAX_BODY, Posted};
use super::shared::Expiry;
use super::{Hooks, Sub, now_ms};
use crate::mcp::listen::Undelivered;
use crate::mcp::server::SourceServer;
use crate::mcp::server::stream::{EventsOut, StreamRequest};
use crate::runtime::backoff::Backoff;
use crate::sync::Recover;

/// The pauses before each new try of one message: about a day in all, then it is given up.
pub const RETRIES: [Duration; 11] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
    Duration::from_secs(1800),
    Duration::from_secs(3600),
    Duration::from_secs(7200),
    Duration::from_secs(14_400),
    Duration::from_secs(28_800),
    Duration::from_secs(28_800),
];

pub(super) struct Follower {
    pub(super) hooks: Hooks,
    pub(super) sub: Arc<Mutex<Sub>>,
    pub(super) stop: CancellationToken,
}

/// How delivering one message came out.
enum Sent {
    Taken,
    /// Not sent, and never will be (413, too big): go on with the next.
    Skipped,
    /// The subscription is over (410, retries spent, or it was dropped meanwhile).
    Over,
}

impl Follower {
    fn id(&self) -> String {
        self.sub.locked().id.clone()
    }

    /// Follows until the subscription is dropped or expires, or the server shuts down.
    pub(super) async fn run(self, server: SourceServer) {
        // A message left pending by the last run (a restart while it was being retried)
        // goes first, under its own id.
        let pending = self.sub.locked().pending.clone();
        if let Some((msg_id, body, cursor)) = pending {
            // (Its subscription may run out meanwhile, unless refreshed elsewhere.)
            let sent = loop {
                tokio::select! {
                    s = self.deliver(&msg_id, body.as_bytes(), cursor.as_deref()) => break s,
                    _ = self.expired() => {
                        if self.expired_ended().await {
                            return;
                        }
                    }
                }
            };
            match sent {
                Sent::Over => return,
                Sent::Taken | Sent::Skipped => self.advance(cursor.as_deref()).await,
            }
        }
        let mut retry = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            let (caller, req) = {
                let s = self.sub.locked();
                (
                    s.caller(),
                    StreamRequest {
                        name: s.name.clone(),
                        arguments: s.arguments.clone(),
                        cursor: s.cursor.clone(),
                        max_age_ms: s.max_age_ms,
                    },
                )
            };
            let expired = self.expired();
            let mut out = HookOut {
                f: &self,
                token: caller.token.clone(),
            };
            let ended = tokio::select! {
                r = server.follow(&caller, &req, &mut out) => Some(r),
                _ = expired => None,
            };
            if self.stop.is_cancelled() {
                return;
            }
            match ended {
                None if self.expired_ended().await => return,
                // Refreshed through another replica (its watch not here yet): go on.
                None => continue,
                // Ended for its token (expired, revoked) when a renewal has brought another
                // (before the stream began, or after: `HookOut` then did not end it): follow
                // again with that one.
                Some(_) if self.sub.locked().token != caller.token => continue,
                // The server ended it: shutting down (the subscription is kept), or it was
                // terminated (and dropped by `HookOut`).
                Some(Ok(_)) => return,
                Some(Err(e)) if crate::mcp::server::stream::is_final(e.code.0) => {
                    let id = self.id();
                    tracing::warn!(subscription = %id, error = %e.message, "a webhook subscription cannot go on; it is dropped");
                    self.end(json!({"code": e.code.0, "message": e.message}))
                        .await;
                    return;
                }
                Some(Err(e)) => {
                    // Not started (the source is not there yet): try again.
                    self.sub.locked().last_error = Some(e.message.to_string());
                    let pause = retry.next_delay();
                    tokio::select! {
                        _ = self.stop.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    /// The subscription's TTL is out here: whether it ended (its receiver told, unless a
    /// newer one of the id runs), or goes on (refreshed through another replica; `false`).
    async fn expired_ended(&self) -> bool {
        // Only while this process delivers (a row deleted by another would be told to no
        // one): a deliverer whose claim lapsed waits for it, or to be stopped, and a
        // stopped follower leaves the row for the next deliverer.
        if self.hooks.deliver_until().is_none() {
            tokio::select! {
                _ = self.hooks.deliverable() => {}
                () = self.stop.cancelled() => {}
            }
        }
        if self.stop.is_cancelled() {
            return true;
        }
        let e = json!({"code": -32023, "message": "the subscription expired; subscribe again to go on"});
        let id = self.id();
        match self.hooks.expired_on_row(&self.sub).await {
            Expiry::Refreshed => false,
            // Unsubscribed elsewhere meanwhile: nothing to tell.
            Expiry::Gone => {
                self.hooks.stop_local(&id, Some(&self.sub));
                true
            }
            Expiry::Out if self.hooks.inner.shared.is_none() => {
                tracing::info!(subscription = %id, "a webhook subscription expired");
                self.end(e).await;
                true
            }
            // Its row is deleted already (a second delete could take a subscription made
            // anew since): this follower stops, and tells, unless a newer one of the id runs.
            Expiry::Out => {
                tracing::info!(subscription = %id, "a webhook subscription expired");
                if self.hooks.stop_local(&id, Some(&self.sub)) {
                    self.tell_ended(&id, e).await;
                }
                true
            }
        }
    }

    /// Ends the subscription (if it is still this follower's: a newer one of the same id is
    /// left alone), then tells the receiver once with a `terminated` message.
    async fn end(&self, error: Value) {
        let id = self.id();
        if self.hooks.forget_if(&id, &self.sub).await {
            self.tell_ended(&id, error).await;
        }
    }

    /// Tells the receiver, once, that subscription `id` ended with `error`.
    async fn tell_ended(&self, id: &str, error: Value) {
        let body = json!({"type": "terminated", "subscriptionId": id, "error": error});
        let (url, secrets, born) = {
            let s = self.sub.locked();
            let secrets: Vec<_> = s.secrets(now_ms()).into_iter().cloned().collect();
            (s.url.clone(), secrets, s.born)
        };
        if self.hooks.deliver_until().is_none() {
            // Not the deliverer now: the receiver hears it from none.
            return;
        }
        let refs: Vec<&_> = secrets.iter().collect();
        // Under the same bound as every POST (a start may end many at once).
        let Ok(_permit) = self.hooks.inner.posts.acquire().await else {
            return;
        };
        let _posting = super::Held::of(&self.hooks.inner.metrics.posting);
        let posted = self
            .hooks
            .inner
            .poster
            .post(
                &url,
                id,
                // One per incarnation: a receiver dropping repeats by id hears each end.
                &if born == 0 {
                    format!("term_{id}")
                } else {
                    format!("term_{id}_{born:x}")
                },
                &refs,
                body.to_string().as_bytes(),
            )
            .await;
        if let Posted::Failed(why) = posted {
            tracing::debug!(subscription = %id, error = %why, "the receiver did not take the terminated message");
        }
    }

    /// Resolves when the subscription's TTL is out (following refreshes).
    async fn expired(&self) {
        loop {
            let at = self.sub.locked().expires_ms;
            let now = now_ms();
            if at <= now {
                return;
            }
            tokio::time::sleep(Duration::from_millis(at - now)).await;
        }
    }

    /// POSTs one message as `msg_id`, trying again on failure (kept as pending meanwhile,
    /// with the cursor it moves to); see the module docs.
    async fn deliver(&self, msg_id: &str, body: &[u8], cursor: Option<&str>) -> Sent {
        let hooks = &self.hooks.inner;
        if body.len() > MAX_BODY {
            hooks.metrics.dropped.inc();
            return Sent::Skipped;
        }
        let mut attempt = 0;
        // Counted as retrying from its first failure until it is done with, however.
        let mut retrying: Option<super::Held> = None;
        loop {
            let (url, id, secrets) = {
                let s = self.sub.locked();
                let secrets: Vec<_> = s.secrets(now_ms()).into_iter().cloned().collect();
                (s.url.clone(), s.id.clone(), secrets)
            };
            let posted = {
                let _permit = tokio::select! {
                    p = hooks.posts.acquire() => match p {
                        Ok(p) => p,
                        Err(_) => return Sent::Over,
                    },
                    _ = self.stop.cancelled() => return Sent::Over,
                };
                // Only the deliverer, its claim renewed lately, sends (shared by replicas),
                // and no POST outlives its claim.
                let until = tokio::select! {
                    u = self.hooks.deliverable() => u,
                    _ = self.stop.cancelled() => return Sent::Over,
                };
                let refs: Vec<&_> = secrets.iter().collect();
                let _posting = super::Held::of(&hooks.metrics.posting);
                tokio::select! {
                    p = hooks.poster.post(&url, &id, msg_id, &refs, body) => p,
                    _ = self.stop.cancelled() => return Sent::Over,
                    _ = async {
                        match until {
                            Some(u) => tokio::time::sleep_until(u).await,
                            None => std::future::pending().await,
                        }
                    } => Posted::Failed("this replica stopped delivering mid-POST".into()),
                }
            };
            match posted {
                Posted::Delivered(_) => {
                    hooks.metrics.delivered.inc();
                    let was_pending = {
                        let mut s = self.sub.locked();
                        s.last_delivery_ms = Some(now_ms());
                        s.last_error = None;
                        s.pending.take().is_some()
                    };
                    if was_pending && !self.stop.is_cancelled() {
                        self.hooks.keep(&self.sub).await;
                    }
                    return Sent::Taken;
                }
                Posted::TooLarge => {
                    hooks.metrics.dropped.inc();
                    let was_pending = self.sub.locked().pending.take().is_some();
                    if was_pending && !self.stop.is_cancelled() {
                        self.hooks.keep(&self.sub).await;
                    }
                    tracing::warn!(subscription = %id, message = %msg_id, "the receiver refused a message as too large (413); it is skipped");
                    return Sent::Skipped;
                }
                Posted::Gone => {
                    tracing::info!(subscription = %id, "the receiver answered 410 Gone; the subscription is dropped");
                    self.hooks.forget_if(&id, &self.sub).await;
                    return Sent::Over;
                }
                Posted::Failed(why) => {
                    hooks.metrics.failed.inc();
                    let first = attempt == 0;
                    if retrying.is_none() {
                        retrying = Some(super::Held::of(&hooks.metrics.retrying));
                    }
                    {
                        let mut s = self.sub.locked();
                        s.last_error = Some(why.clone());
                        if first {
                            s.pending = Some((
                                msg_id.to_owned(),
                                String::from_utf8_lossy(body).into_owned(),
                                cursor.map(str::to_owned),
                            ));
                        }
                    }
                    if first && !self.stop.is_cancelled() {
                        self.hooks.keep(&self.sub).await;
                    }
                    let Some(pause) = RETRIES.get(attempt) else {
                        hooks.metrics.dropped.inc();
                        tracing::error!(subscription = %id, error = %why, "a webhook message was not taken after a day of retries; the subscription is dropped");
                        self.hooks.forget_if(&id, &self.sub).await;
                        return Sent::Over;
                    };
                    tracing::debug!(subscription = %id, error = %why, retry_ms = pause.as_millis() as u64, "a webhook POST failed; trying again");
                    attempt += 1;
                    tokio::select! {
                        _ = self.stop.cancelled() => return Sent::Over,
                        _ = tokio::time::sleep(*pause) => {}
                    }
                }
            }
        }
    }

    /// A control message (`{"type": kind, "subscriptionId": …, …fields}`).
    async fn control(&self, kind: &str, fields: Value, msg_id: &str) -> Sent {
        let mut body = json!({"type": kind, "subscriptionId": self.id()});
        if let (Some(b), Value::Object(f)) = (body.as_object_mut(), fields) {
            b.extend(f);
        }
        let cursor = self.sub.locked().cursor.clone();
        self.deliver(msg_id, body.to_string().as_bytes(), cursor.as_deref())
            .await
    }

    /// Moves the kept cursor to `cursor` (and keeps it in the store when it moved).
    async fn advance(&self, cursor: Option<&str>) {
        let Some(cursor) = cursor else { return };
        {
            let mut s = self.sub.locked();
            if s.cursor.as_deref() == Some(cursor) {
                return;
            }
            s.cursor = Some(cursor.to_owned());
            s.max_age_ms = None;
        }
        if !self.stop.is_cancelled() {
            self.hooks.keep(&self.sub).await;
        }
    }
}

/// The follower's side of [`SourceServer::follow`].
struct HookOut<'a> {
    f: &'a Follower,
    /// The token the stream was followed with: a stream ended for it (expired, revoked)
    /// after a renewal brought another does not end the subscription.
    token: Option<String>,
}

impl EventsOut for HookOut<'_> {
    async fn send(&mut self, kind: &'static str, mut params: Value) -> Result<(), Undelivered> {
        let f = self.f;
        let over = || Err(Undelivered::Closed);
        match kind {
            "active" => {
                if params["truncated"] == true {
                    let at = params["cursor"].as_str().unwrap_or_default().to_owned();
                    let id = format!("gap_{}_{at}", f.id());
                    if let Sent::Over = f.control("gap", json!({"cursor": at}), &id).await {
                        return over();
                    }
                }
                Ok(())
            }
            "event" => {
                let cursor = params["cursor"].as_str().map(str::to_owned);
                if params.get("truncated").is_some_and(|t| t == true) {
                    let id = format!("gap_{}_{}", f.id(), cursor.clone().unwrap_or_default());
                    if let Sent::Over = f
                        .control("gap", json!({"before": params["eventId"]}), &id)
                        .await
                    {
                        return over();
                    }
                }
                if let Some(o) = params.as_object_mut() {
                    o.remove("_meta");
                    o.remove("truncated");
                }
                let event_id = params["eventId"].as_str().unwrap_or_default().to_owned();
                let body = params.to_string();
                if body.len() > MAX_BODY {
                    tracing::warn!(subscription = %f.id(), event = %event_id, bytes = body.len(), "an event is too big for one webhook POST (256 KiB); a gap is sent in its place");
                    let gap =
                        json!({"skipped": event_id, "reason": "the event is larger than 256 KiB"});
                    if let Sent::Over = f.control("gap", gap, &format!("gap_{event_id}")).await {
                        return over();
                    }
                } else if let Sent::Over = f
                    .deliver(&event_id, body.as_bytes(), cursor.as_deref())
                    .await
                {
                    return over();
                }
                f.advance(cursor.as_deref()).await;
                Ok(())
            }
            "heartbeat" => {
                if params["truncated"] == true {
                    let at = params["cursor"].as_str().unwrap_or_default().to_owned();
                    let id = format!("gap_{}_{at}", f.id());
                    if let Sent::Over = f.control("gap", json!({"cursor": at}), &id).await {
                        return over();
                    }
                }
                f.advance(params["cursor"].as_str()).await;
                Ok(())
            }
            "error" => {
                let why = params["error"]["message"]
                    .as_str()
                    .unwrap_or("the source failed");
                f.sub.locked().last_error = Some(why.to_owned());
                Ok(())
            }
            "terminated" => {
                if f.sub.locked().token == self.token {
                    f.end(params["error"].clone()).await;
                }
                over()
            }
            _ => Ok(()),
        }
    }

    fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        self.f.stop.clone().cancelled_owned()
    }

    fn patient(&self) -> bool {
        true
    }
}
