//! Webhook subscriptions to event types (MCP Events, `events/subscribe` /
//! `events/unsubscribe`), as the Events draft and OpenAI's "MCP Events" guide ask.
//!
//! A subscription is keyed by (caller, callback URL, event type, arguments); its `id` is
//! derived from that key (argument key order ignored), so subscribing again is idempotent: it
//! refreshes the TTL and replaces the secret (the old one still signs beside the new for
//! [`ROTATION`]). Before anything is made, the event type and arguments are checked by the
//! source itself (a poll), the callback URL against the policy ([`deliver::CallbackPolicy`]),
//! and the callback answers a signed, single-use challenge (`{"type":"verification",
//! "challenge":…}`, echoed back in a 2xx answer). Each subscription is followed by the same
//! core that serves `events/stream` ([`SourceServer::follow`]), entitlements checked at every
//! poll, and delivered one event per POST, in order ([`follow`]).
//!
//! Subscriptions, their secrets, subscriber, callback and delivery cursor are kept in the
//! store, sealed under `HERALD_EVENTS_KEY` (without a key the server takes no webhook
//! subscriptions): a restart, even `kill -9`, resumes each from the last event its receiver
//! took, so nothing is lost and an event sent again keeps its `webhook-id` (its event id).
//! TTL: `ttlMs` asks, [`DEFAULT_TTL`] when it does not (null too: never forever), at least
//! [`MIN_TTL`], at most [`MAX_TTL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{ErrorCode, ErrorData as McpError, JsonObject};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::mcp::caller::Caller;
use crate::mcp::server::SourceServer;
use crate::mcp::server::webhooks::Webhooks;
use crate::runtime::context::RoleContext;
use crate::runtime::metrics::{Counter, Gauge, Metrics};
use crate::store::seal::Sealer;
use crate::store::{Store, Table};
use crate::sync::Recover;

pub mod deliver;
mod follow;
mod settings;
mod shared;

pub use settings::{EventsOptions, HookSettings, KEY_VAR, Profile, events_key};

use deliver::{Posted, Poster, Secret};

/// A subscription's life when `ttlMs` does not say.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest life granted.
pub const MIN_TTL: Duration = Duration::from_secs(3600);
/// The longest life granted.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a replaced secret still signs beside the new one.
pub const ROTATION: Duration = Duration::from_secs(24 * 3600);
/// Most subscriptions one server keeps.
pub const MAX_SUBSCRIPTIONS: usize = 1000;
/// Most subscriptions one subscriber keeps.
pub const MAX_PER_SUBSCRIBER: usize = 100;
/// POSTs in flight at once, over all subscriptions (each subscription sends one at a time).
pub const MAX_POSTS: usize = 64;

const SUBSCRIBE_PARAMS: [&str; 7] = [
    "name",
    "arguments",
    "delivery",
    "cursor",
    "maxAgeMs",
    "ttlMs",
    "_meta",
];

/// A subscription as it is kept (sealed). Its `Debug` shows only its id and event type.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Sub {
    id: String,
    principal: String,
    token: Option<String>,
    servers: Option<Vec<String>>,
    local: bool,
    loopback: bool,
    url: String,
    name: String,
    arguments: JsonObject,
    secret: Secret,
    /// The secret it replaced, and until when (ms since the epoch) it still signs.
    old_secret: Option<(Secret, u64)>,
    /// The last event's cursor the receiver took (or where the subscription started).
    cursor: Option<String>,
    expires_ms: u64,
    last_delivery_ms: Option<u64>,
    last_error: Option<String>,
    /// `maxAgeMs` of the subscribe, for the replay from its cursor (then none).
    #[serde(default)]
    max_age_ms: Option<u64>,
    /// A message whose POST failed and is being tried again: `(webhook-id, body, the cursor
    /// it moves to)`, kept so a restart sends it first, under the same id.
    #[serde(default)]
    pending: Option<(String, String, Option<String>)>,
    /// This incarnation of the id: drawn when a subscribe makes the row (not when one
    /// refreshes it), so a row made anew after an unsubscribe or expiry is told from the one
    /// a follower holds (0: a row from before the field).
    #[serde(default)]
    born: u64,
}

impl std::fmt::Debug for Sub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sub")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Sub {
    fn caller(&self) -> Caller {
        Caller {
            token: self.token.clone(),
            servers: self.servers.clone(),
            local: self.local,
            loopback: self.loopback,
            // The principal it was made by: what owns it, whichever token that caller holds.
            known_as: Some(self.principal.clone()),
            token_digest: Default::default(),
        }
    }

    /// The same key subscribed again (`new`): its TTL and secret (the old one still signs
    /// for [`ROTATION`]), and the caller's token, perhaps a fresh access token of the same
    /// principal, which the follower's next stream presents.
    fn refresh(&mut self, new: &Sub, now: u64) {
        if self.secret != new.secret {
            self.old_secret = Some((self.secret.clone(), now + ROTATION.as_millis() as u64));
            self.secret = new.secret.clone();
        }
        self.expires_ms = new.expires_ms;
        self.token = new.token.clone();
        self.servers = new.servers.clone();
    }

    /// The subscriber's fields of `row` (what a subscribe writes).
    fn take_subscriber(&mut self, row: &Sub) {
        self.secret = row.secret.clone();
        self.old_secret = row.old_secret.clone();
        self.expires_ms = row.expires_ms;
        self.token = row.token.clone();
        self.servers = row.servers.clone();
    }

    /// The deliverer's fields of `from` (what delivering writes).
    fn take_progress(&mut self, from: &Sub) {
        self.cursor = from.cursor.clone();
        self.max_age_ms = from.max_age_ms;
        self.pending = from.pending.clone();
        self.last_delivery_ms = from.last_delivery_ms;
        self.last_error = from.last_error.clone();
    }

    /// Whether this is incarnation `born` of its id ([`Sub::born`]); a row without one (from
    /// before the field, or rewritten by an older replica) is taken as any.
    fn of_incarnation(&self, born: u64) -> bool {
        self.born == born || self.born == 0 || born == 0
    }

    fn secrets(&self, now: u64) -> Vec<&Secret> {
        let mut s = vec![&self.secret];
        if let Some((old, until)) = &self.old_secret
            && *until > now
        {
            s.push(old);
        }
        s
    }
}

/// A running subscription: its kept state and what stops its follower.
struct Running {
    sub: Arc<Mutex<Sub>>,
    stop: CancellationToken,
}

struct Inner {
    settings: HookSettings,
    store: Store,
    sealer: Sealer,
    poster: Poster,
    subs: Mutex<HashMap<String, Running>>,
    /// One writer at a time per subscription id (its row): each write takes the latest state,
    /// and a forget's delete is ordered with them.
    writes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    posts: tokio::sync::Semaphore,
    ctx: RoleContext,
    metrics: HookMetrics,
    /// Kept on NATS and shared by replicas (a gateway's `--backend`), instead of the store.
    shared: Option<shared::Shared>,
}

/// The webhook counters, registered up front in every role's metrics.
#[derive(Clone)]
pub struct HookMetrics {
    delivered: Counter,
    failed: Counter,
    dropped: Counter,
    subscriptions: Gauge,
    deliverer: Gauge,
    posting: Gauge,
    retrying: Gauge,
}

/// One unit of a gauge, given back when dropped.
pub(crate) struct Held(Gauge);

impl Held {
    pub(crate) fn of(g: &Gauge) -> Held {
        g.add(1);
        Held(g.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.sub(1);
    }
}

impl HookMetrics {
    pub fn register(m: &Metrics) -> HookMetrics {
        HookMetrics {
            delivered: m.counter(
                "herald_webhook_delivered_total",
                "webhook POSTs a receiver took (2xx), events and control messages",
            ),
            failed: m.counter(
                "herald_webhook_failed_total",
                "webhook POSTs that failed and will be tried again (no connection, timeout, 5xx, 4xx but 410 and 413)",
            ),
            dropped: m.counter(
                "herald_webhook_dropped_total",
                "webhook messages given up: 413, too big to send, or retries spent",
            ),
            subscriptions: m.gauge(
                "herald_webhook_subscriptions",
                "webhook subscriptions kept now",
            ),
            deliverer: m.gauge(
                "herald_webhook_deliverer",
                "1 while this process delivers the webhook subscriptions (of gateway replicas sharing them on NATS, one does)",
            ),
            posting: m.gauge(
                "herald_webhook_posts_in_flight",
                "webhook POSTs under way now (at most 64)",
            ),
            retrying: m.gauge(
                "herald_webhook_retrying",
                "webhook messages waiting to be tried again now (each holds its subscription's delivery)",
            ),
        }
    }
}

/// A server's webhook subscriptions; see the module docs.
#[derive(Clone)]
pub struct Hooks {
    inner: Arc<Inner>,
}

fn now_ms() -> u64 {
    crate::mcp::ring::now_ms()
}

/// A fresh incarnation marker ([`Sub::born`]): random (the clock, should randomness fail),
/// never 0.
fn incarnation() -> u64 {
    use ring::rand::SecureRandom as _;
    let mut raw = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut raw);
    (u64::from_le_bytes(raw) ^ now_ms()).max(1)
}

fn invalid(m: impl Into<String>) -> McpError {
    McpError::invalid_params(m.into(), None)
}

/// The subscription id of a key: `sub_` and 32 hex digits of its SHA-256.
fn derive_id(principal: &str, url: &str, name: &str, arguments: &JsonObject) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for part in [
        principal,
        url,
        name,
        &crate::mcp::events::sorted_keys(&Value::Object(arguments.clone())).to_string(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("sub_{}", &hex::encode(h.finalize())[..32])
}

impl Hooks {
    /// Webhook subscriptions for `server`'s role, restoring those kept in `store` (each
    /// followed again from its cursor); with `bucket`, kept there instead and shared with
    /// the other processes on it ([`shared`]).
    pub async fn start(
        server: &SourceServer,
        settings: HookSettings,
        store: Store,
        bucket: Option<async_nats::jetstream::kv::Store>,
        ctx: RoleContext,
    ) -> Result<Hooks, String> {
        let poster = Poster::new(settings.policy.clone())?;
        let metrics = HookMetrics::register(ctx.metrics());
        let hooks = Hooks {
            inner: Arc::new(Inner {
                sealer: Sealer::new(&settings.key),
                settings,
                store,
                poster,
                subs: Mutex::default(),
                writes: Mutex::default(),
                posts: tokio::sync::Semaphore::new(MAX_POSTS),
                ctx,
                metrics,
                shared: bucket.map(shared::Shared::new),
            }),
        };
        if hooks.inner.shared.is_some() {
            let (h, server) = (hooks.clone(), server.clone());
            hooks
                .inner
                .ctx
                .spawn("webhooks on nats", async move { h.share(server).await });
        } else {
            hooks.restore(server).await;
        }
        Ok(hooks)
    }

    fn row(&self, id: &str) -> String {
        format!("{}/{id}", self.inner.settings.role)
    }

    async fn restore(&self, server: &SourceServer) {
        let rows = match self.inner.store.scan(Table::Webhooks).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the webhook subscriptions from the store; none resumed");
                return;
            }
        };
        let prefix = format!("{}/", self.inner.settings.role);
        for (key, bytes) in rows {
            if !key.starts_with(&prefix) {
                continue;
            }
            let sub = self
                .inner
                .sealer
                .open(&key, &bytes)
                .ok()
                .and_then(|plain| serde_json::from_slice::<Sub>(&plain).ok());
            let Some(sub) = sub else {
                tracing::warn!(row = %key, "a webhook subscription does not open with this HERALD_EVENTS_KEY; it is left out (and kept)");
                continue;
            };
            // One that expired while herald was down is resumed too: its follower ends it at
            // once, as any expiry, and its receiver hears `terminated`.
            tracing::info!(subscription = %sub.id, event = %sub.name, "resuming a webhook subscription");
            let _ = self.run(server, sub, false);
        }
    }

    fn write_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.inner
            .writes
            .locked()
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// Keeps `sub` (sealed) in the store, as it is when its turn to write comes, while it is
    /// the running subscription of its id: a forget (or a replacement) is never undone, and
    /// an older state never lands after a newer one.
    async fn keep(&self, sub: &Arc<Mutex<Sub>>) {
        let id = sub.locked().id.clone();
        let lock = self.write_lock(&id);
        let _turn = lock.lock().await;
        if !self.is_current(&id, sub) {
            return;
        }
        let snapshot = sub.locked().clone();
        if self.inner.shared.is_some() {
            return self.keep_shared(&id, sub, snapshot).await;
        }
        let row = self.row(&id);
        let plain = serde_json::to_vec(&snapshot).expect("a subscription serializes");
        let sealed = self.inner.sealer.seal(&row, &plain);
        if let Err(e) = self.inner.store.put(Table::Webhooks, &row, sealed).await {
            tracing::error!(subscription = %id, error = %e, "cannot keep a webhook subscription in the store");
        }
    }

    fn is_current(&self, id: &str, sub: &Arc<Mutex<Sub>>) -> bool {
        self.inner
            .subs
            .locked()
            .get(id)
            .is_some_and(|r| Arc::ptr_eq(&r.sub, sub))
    }

    /// Forgets subscription `id`: stops its follower, deletes its row.
    async fn forget(&self, id: &str) -> bool {
        self.forget_where(id, |_| true).await
    }

    /// Forgets `sub` if it is still the running subscription of `id` (a follower ending its
    /// own subscription never ends a newer one of the same id).
    async fn forget_if(&self, id: &str, sub: &Arc<Mutex<Sub>>) -> bool {
        self.forget_where(id, |r| Arc::ptr_eq(&r.sub, sub)).await
    }

    async fn forget_where(&self, id: &str, which: impl FnOnce(&Running) -> bool) -> bool {
        if self.inner.shared.is_some() {
            let running = self
                .inner
                .subs
                .locked()
                .get(id)
                .filter(|r| which(r))
                .map(|r| r.sub.clone());
            return match running {
                Some(sub) => self.forget_shared(id, &sub).await,
                None => false,
            };
        }
        let gone = {
            let mut subs = self.inner.subs.locked();
            match subs.get(id) {
                Some(r) if which(r) => subs.remove(id),
                _ => None,
            }
        };
        let Some(gone) = gone else { return false };
        gone.stop.cancel();
        self.inner
            .metrics
            .subscriptions
            .set(self.inner.subs.locked().len() as u64);
        let lock = self.write_lock(id);
        let _turn = lock.lock().await;
        // A subscription made again meanwhile under this id owns the row now.
        if !self.inner.subs.locked().contains_key(id) {
            let _ = self
                .inner
                .store
                .delete(Table::Webhooks, &self.row(id))
                .await;
            let mut writes = self.inner.writes.locked();
            if writes.get(id).is_some_and(|l| Arc::strong_count(l) <= 2) {
                writes.remove(id);
            }
        }
        true
    }

    /// Stops the follower of `id` here (`which` one, if named), leaving its row (this
    /// replica no longer delivers it). Whether no other follower of `id` runs here now (taken
    /// under the same lock as the stop: none ran, or it was the one stopped).
    fn stop_local(&self, id: &str, which: Option<&Arc<Mutex<Sub>>>) -> bool {
        let (gone, alone) = {
            let mut subs = self.inner.subs.locked();
            match subs.get(id) {
                Some(r) if which.is_none_or(|w| Arc::ptr_eq(&r.sub, w)) => (subs.remove(id), true),
                Some(_) => (None, false),
                None => (None, true),
            }
        };
        if let Some(gone) = gone {
            gone.stop.cancel();
        }
        let mut writes = self.inner.writes.locked();
        if writes.get(id).is_some_and(|l| Arc::strong_count(l) == 1) {
            writes.remove(id);
        }
        alone
    }

    /// Starts following `sub` (its follower runs until the subscription is dropped, expires
    /// or the server shuts down).
    /// With `capped`, refused (by the limit it would pass and its max) when the server or
    /// the subscriber already keeps the most allowed: checked and taken under one lock.
    fn run(
        &self,
        server: &SourceServer,
        sub: Sub,
        capped: bool,
    ) -> Result<Arc<Mutex<Sub>>, (&'static str, usize)> {
        let id = sub.id.clone();
        let principal = sub.principal.clone();
        let stop = CancellationToken::new();
        let sub = Arc::new(Mutex::new(sub));
        let replaced = {
            let mut subs = self.inner.subs.locked();
            if capped && !subs.contains_key(&id) {
                let mine = subs
                    .values()
                    .filter(|r| r.sub.locked().principal == principal)
                    .count();
                if mine >= MAX_PER_SUBSCRIBER {
                    return Err(("subscriptionsPerSubscriber", MAX_PER_SUBSCRIBER));
                }
                if subs.len() >= MAX_SUBSCRIPTIONS {
                    return Err(("subscriptions", MAX_SUBSCRIPTIONS));
                }
            }
            subs.insert(
                id.clone(),
                Running {
                    sub: sub.clone(),
                    stop: stop.clone(),
                },
            )
        };
        if let Some(old) = replaced {
            old.stop.cancel();
        }
        // (Shared: the gauge counts the rows every replica sees.)
        if self.inner.shared.is_none() {
            self.inner
                .metrics
                .subscriptions
                .set(self.inner.subs.locked().len() as u64);
        }
        let follower = follow::Follower {
            hooks: self.clone(),
            sub: sub.clone(),
            stop,
        };
        let server = server.clone();
        self.inner
            .ctx
            .spawn_until_shutdown("webhook", async move { follower.run(server).await });
        Ok(sub)
    }

    /// Sends the signed challenge to `url` and checks the answer echoes it.
    async fn verify(&self, url: &str, id: &str, secret: &Secret) -> Result<(), String> {
        use ring::rand::SecureRandom as _;
        let mut raw = [0u8; 24];
        ring::rand::SystemRandom::new()
            .fill(&mut raw)
            .map_err(|_| "no randomness for the challenge".to_owned())?;
        let challenge = hex::encode(raw);
        let body = json!({"type": "verification", "challenge": challenge, "subscriptionId": id})
            .to_string();
        let msg = format!("verify_{challenge}");
        let answer = match self
            .inner
            .poster
            .post(url, id, &msg, &[secret], body.as_bytes())
            .await
        {
            Posted::Delivered(answer) => answer,
            Posted::Gone => return Err("the callback answered 410 Gone to the challenge".into()),
            Posted::TooLarge => return Err("the callback answered 413 to the challenge".into()),
            Posted::Failed(e) => return Err(format!("the challenge was not taken: {e}")),
        };
        let echoed = serde_json::from_slice::<Value>(&answer)
            .ok()
            .and_then(|v| v["challenge"].as_str().map(str::to_owned))
            .or_else(|| String::from_utf8(answer).ok().map(|s| s.trim().to_owned()));
        if echoed.as_deref() == Some(challenge.as_str()) {
            Ok(())
        } else {
            Err("the callback answered the challenge without echoing it (answer {\"challenge\": …} with the value sent)".into())
        }
    }

    fn code(&self, draft: i32) -> ErrorCode {
        self.inner.settings.profile.code(draft)
    }

    /// A source's refusal of the event type or its arguments, in the configured profile.
    fn profiled(&self, mut e: McpError) -> McpError {
        if matches!(e.code.0, -32027..=-32023) {
            e.code = self.code(e.code.0);
        }
        e
    }
}

/// The `delivery` object of a request: its URL and (for subscribe) its secret.
fn delivery(params: &JsonObject, secret: bool) -> Result<(String, Option<Secret>), McpError> {
    let Some(Value::Object(d)) = params.get("delivery") else {
        return Err(invalid(
            "missing parameter delivery; it is {\"mode\":\"webhook\",\"url\":…,\"secret\":\"whsec_…\"}",
        ));
    };
    if let Some(mode) = d.get("mode")
        && mode != "webhook"
    {
        return Err(invalid(format!(
            "delivery.mode {mode} is not offered here; webhook is (events/stream is push)"
        )));
    }
    let url = d
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("missing delivery.url, the callback's https URL"))?
        .to_owned();
    let secret = if secret {
        let s = d.get("secret").and_then(Value::as_str).ok_or_else(|| {
            invalid("missing delivery.secret (whsec_ and the base64 of 24 to 64 random bytes)")
        })?;
        Some(Secret::parse(s).map_err(invalid)?)
    } else {
        None
    };
    Ok((url, secret))
}

fn name_and_arguments(params: &JsonObject) -> Result<(String, JsonObject), McpError> {
    crate::mcp::events::name_and_arguments(params, "events/subscribe")
        .map_err(crate::mcp::server::to_mcp_error)
}

#[async_trait]
impl Webhooks for Hooks {
    async fn subscribe(
        &self,
        server: &SourceServer,
        caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, McpError> {
        if let Some(k) = params
            .keys()
            .find(|k| !SUBSCRIBE_PARAMS.contains(&k.as_str()))
        {
            return Err(invalid(format!(
                "unknown parameter {k}; events/subscribe takes name, arguments, delivery, cursor, maxAgeMs and ttlMs"
            )));
        }
        let (name, arguments) = name_and_arguments(&params)?;
        let (url, secret) = delivery(&params, true)?;
        let secret = secret.expect("asked for");
        let callback = self.code(-32027);
        self.inner.poster.policy().check(&url).map_err(|why| {
            McpError::new(callback, why, Some(json!({"reason": "callbackRefused"})))
        })?;
        let ttl = match params.get("ttlMs") {
            None | Some(Value::Null) => DEFAULT_TTL,
            Some(v) => Duration::from_millis(v.as_u64().ok_or_else(|| {
                invalid(format!("ttlMs must be a non-negative integer, got {v}"))
            })?),
        }
        .clamp(MIN_TTL, MAX_TTL);
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(invalid(format!(
                    "cursor must be a string or null, got {other}"
                )));
            }
        };
        // The source checks the event type, its arguments and the caller's entitlement, and
        // says where "now" is (or whether the cursor's replay has a gap).
        let mut probe = JsonObject::new();
        probe.insert("name".into(), name.clone().into());
        probe.insert("arguments".into(), Value::Object(arguments.clone()));
        probe.insert(
            "cursor".into(),
            cursor.clone().map_or(Value::Null, Into::into),
        );
        probe.insert("maxEvents".into(), 1.into());
        if let Some(age) = params.get("maxAgeMs") {
            probe.insert("maxAgeMs".into(), age.clone());
        }
        let polled = server
            .poll_in_process(caller, probe)
            .await
            .map_err(|e| self.profiled(e))?;
        let truncated = polled["truncated"].as_bool().unwrap_or(false);
        let start = cursor.or_else(|| polled["cursor"].as_str().map(str::to_owned));
        let principal = caller.principal();
        let id = derive_id(&principal, &url, &name, &arguments);
        self.verify(&url, &id, &secret).await.map_err(|why| {
            McpError::new(callback, why, Some(json!({"reason": "verificationFailed"})))
        })?;
        let now = now_ms();
        let expires_ms = now + ttl.as_millis() as u64;
        let fresh = Sub {
            id: id.clone(),
            principal,
            token: caller.token.clone(),
            servers: caller.servers.clone(),
            local: caller.local,
            loopback: caller.loopback,
            url,
            name,
            arguments,
            secret,
            old_secret: None,
            cursor: start,
            expires_ms,
            last_delivery_ms: None,
            last_error: None,
            max_age_ms: params.get("maxAgeMs").and_then(Value::as_u64),
            pending: None,
            born: incarnation(),
        };
        let limited = |limit: &str, max: usize| {
            McpError::new(
                self.code(-32025),
                format!(
                    "this server keeps at most {max} webhook subscriptions ({limit}); unsubscribe one first"
                ),
                Some(json!({"limit": limit, "max": max})),
            )
        };
        let kept = if let Some(shared) = &self.inner.shared {
            // On NATS: the row, made or refreshed; the deliverer follows it from there.
            self.write_row(&id, |row| match row {
                Some(mut s) => {
                    s.refresh(&fresh, now);
                    Ok(Some(s))
                }
                None => {
                    let (all, mine) = shared.counts(&fresh.principal);
                    if mine >= MAX_PER_SUBSCRIBER {
                        return Err(limited("subscriptionsPerSubscriber", MAX_PER_SUBSCRIBER));
                    }
                    if all >= MAX_SUBSCRIPTIONS {
                        return Err(limited("subscriptions", MAX_SUBSCRIPTIONS));
                    }
                    Ok(Some(fresh.clone()))
                }
            })
            .await?
            .unwrap_or(fresh)
        } else {
            let existing = self.inner.subs.locked().get(&id).map(|r| r.sub.clone());
            match existing {
                Some(sub) => {
                    // The same key again: a new TTL and secret; the follower goes on.
                    let snapshot = {
                        let mut s = sub.locked();
                        s.refresh(&fresh, now);
                        s.clone()
                    };
                    self.keep(&sub).await;
                    snapshot
                }
                None => {
                    let running = self
                        .run(server, fresh.clone(), true)
                        .map_err(|(limit, max)| limited(limit, max))?;
                    self.keep(&running).await;
                    fresh
                }
            }
        };
        Ok(json!({
            "resultType": "complete",
            "id": kept.id,
            "refreshBefore": crate::mcp::events::rfc3339(kept.expires_ms as i64 * 1_000_000),
            "cursor": kept.cursor,
            "truncated": truncated,
            "deliveryStatus": {
                "active": true,
                "lastDeliveryAt": kept.last_delivery_ms.map(|ms| crate::mcp::events::rfc3339(ms as i64 * 1_000_000)),
                "lastError": kept.last_error,
            },
        }))
    }

    async fn unsubscribe(&self, caller: &Caller, params: JsonObject) -> Result<Value, McpError> {
        if let Some(k) = params
            .keys()
            .find(|k| !["name", "arguments", "delivery", "_meta"].contains(&k.as_str()))
        {
            return Err(invalid(format!(
                "unknown parameter {k}; events/unsubscribe takes name, arguments and delivery (its url)"
            )));
        }
        let (name, arguments) = name_and_arguments(&params)?;
        let (url, _) = delivery(&params, false)?;
        let id = derive_id(&caller.principal(), &url, &name, &arguments);
        let found = if self.inner.shared.is_some() {
            let mut had = None;
            self.write_row(&id, |row| {
                had = row.map(|r| r.born);
                Ok(None)
            })
            .await?;
            // The watch brings the delete after the view learnt it: a follower of it here
            // stops now.
            if let Some(born) = had {
                self.stop_incarnation(&id, born);
            }
            had.is_some()
        } else {
            self.forget(&id).await
        };
        if !found {
            return Err(McpError::new(
                self.code(-32023),
                "no such subscription: none of this caller's has that name, arguments and delivery url",
                Some(json!({"kind": "subscription"})),
            ));
        }
        Ok(json!({"resultType": "complete"}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_derived_from_the_key_with_argument_order_ignored() {
        let a: JsonObject = serde_json::from_str(r#"{"x":1,"y":{"b":2,"a":1}}"#).unwrap();
        let b: JsonObject = serde_json::from_str(r#"{"y":{"a":1,"b":2},"x":1}"#).unwrap();
        let id = derive_id("token:ab", "https://h/x", "memo.changed", &a);
        assert_eq!(id, derive_id("token:ab", "https://h/x", "memo.changed", &b));
        assert!(id.starts_with("sub_") && id.len() == 36, "{id}");
        assert_ne!(id, derive_id("token:cd", "https://h/x", "memo.changed", &a));
        assert_ne!(id, derive_id("token:ab", "https://h/y", "memo.changed", &a));
        assert_ne!(id, derive_id("token:ab", "https://h/x", "other", &a));
    }
}
