//! One upstream subscription per (slug, event type, arguments), its events fanned out to every
//! downstream follower: the gateway's `events/stream` streams, its webhook subscriptions and
//! plain long polls of `slug__event` all read the same [`Feed`].
//!
//! A feed takes the slug's events by the best mode the slug has: `events/stream` (push), else
//! `events/poll` long polls (both by [`EventFollow`], which resumes from its cursor when it
//! breaks), else, for a slug that delivers only by webhook (servers built for ChatGPT), an
//! upstream `events/subscribe` with the gateway itself as the receiver: the slug POSTs each
//! event to `{receiver}/{feed id}`, where the gateway checks its Standard Webhooks signature
//! (the secret is the feed's own, made for that subscription; a timestamp more than five
//! minutes off is refused) and answers the challenge.
//!
//! A feed keeps the last [`FEED_EVENTS`] events, each with a cursor: the slug's own, the
//! batch's for a batch's last, else one of the gateway's (`gw<feed id>.<n>`, unique to the
//! feed: a webhook carries none). A long poll whose cursor the feed holds is answered from it,
//! and waits on it for what comes next. Any other (an older cursor to replay from, `maxAgeMs`,
//! a feed not started yet, more than [`MAX_FEEDS`] feeds) goes to the slug as before
//! ([`crate::gateway::polls`]), except where the slug cannot replay it (a webhook feed, a
//! cursor of the gateway's own): that is answered from the oldest event held, `truncated`.
//! An event already taken (by its `eventId`) is not taken again. A feed nobody asked for
//! [`IDLE`] ends (its webhook subscription is ended upstream too).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rmcp::model::JsonObject;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::hooks::deliver::Secret;
use crate::mcp::error::SourceError;
use crate::mcp::events::EVENT_CURSOR_META;
use crate::runtime::backoff::Backoff;
use crate::runtime::context::RoleContext;
use crate::runtime::metrics::{Counter, Gauge, Metrics};
use crate::sync::Recover;
use crate::upstream::events::{EventFollow, Fed};
use crate::upstream::{Upstream, UpstreamError};

/// Events a feed keeps for its followers.
pub const FEED_EVENTS: usize = 1000;
/// Feeds at once; past it a long poll goes to its slug on its own.
pub const MAX_FEEDS: usize = 256;
/// A feed nobody asked for this long ends.
pub const IDLE: Duration = Duration::from_secs(300);
/// How long a first poll waits for its feed to start before it goes to the slug itself.
const START_WAIT: Duration = Duration::from_secs(5);
/// A webhook is refused when its timestamp is further than this from now (Standard Webhooks).
const TOLERANCE_SECS: u64 = 300;
/// How often a webhook feed renews its upstream subscription (under the one-hour floor any
/// server grants).
const RENEW: Duration = Duration::from_secs(30 * 60);
/// Event ids remembered per feed, to drop an event sent again (a stream's replay, a webhook
/// retried).
const SEEN: usize = 4096;
/// Retries of a feed whose slug failed.
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// The path webhooks come to, below the receiver's base (`{base}/{feed id}`).
pub const RECEIVER_PATH: &str = "/events/hooks";

mod receive;

/// How a feed takes its slug's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Follow,
    Webhook,
}

struct Entry {
    /// Its own cursor, the batch's for a batch's last, else one of the gateway's: every
    /// entry can be resumed after.
    cursor: String,
    event: Value,
    /// Events were lost just before this one.
    gap_before: bool,
}

#[derive(Default)]
struct State {
    ring: VecDeque<Entry>,
    /// The cursor just before the oldest entry: a poll from it gets every entry.
    base: Option<String>,
    started: bool,
    /// The slug refused the subscription (its verdict): polls go to the slug, which says why.
    refused: bool,
    /// The feed's task ended (nobody asked for it, or refused): a poll waiting on it asks
    /// again, of a new feed or the slug.
    ended: bool,
    webhook: bool,
    /// The next event comes after a gap.
    gap_next: bool,
    next_local: u64,
    /// Event ids taken (at most [`SEEN`], oldest forgotten first): one sent again is dropped.
    seen: std::collections::HashSet<String>,
    seen_order: VecDeque<String>,
}

/// One upstream subscription and what it brought; see the module docs.
pub struct Feed {
    id: String,
    secret: Secret,
    /// Woken when a webhook feed must subscribe again at once (the slug ended it).
    resubscribe: tokio::sync::Notify,
    state: Mutex<State>,
    version: watch::Sender<u64>,
    used: Mutex<Instant>,
}

/// What a poll read from a feed.
enum Read {
    /// Events after the cursor (maybe none yet), the cursor to go on from, a gap before them.
    Known {
        events: Vec<Value>,
        cursor: Option<String>,
        truncated: bool,
    },
    /// The feed does not hold the cursor.
    Unknown,
}

impl Feed {
    fn touch(&self) {
        *self.used.locked() = Instant::now();
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Events after `cursor`, at most `max`.
    fn read(&self, cursor: Option<&str>, max: usize) -> Read {
        let s = self.state.locked();
        let Some(cursor) = cursor else {
            // From now: the newest cursor.
            let head = s
                .ring
                .back()
                .map(|e| e.cursor.clone())
                .or_else(|| s.base.clone());
            return Read::Known {
                events: Vec::new(),
                cursor: head,
                truncated: false,
            };
        };
        let from = if s.base.as_deref() == Some(cursor) {
            Some(0)
        } else {
            s.ring
                .iter()
                .rposition(|e| e.cursor == cursor)
                .map(|i| i + 1)
        };
        let (from, lost) = match from {
            Some(i) => (i, false),
            // A webhook feed has no slug to replay from, and a cursor of the gateway's own
            // (from an older feed) means nothing to the slug: the oldest event held, with the
            // gap said.
            None if s.webhook || cursor.starts_with(LOCAL_CURSOR) => (0, true),
            None => return Read::Unknown,
        };
        let mut events = Vec::new();
        let mut truncated = lost;
        // A lost cursor is never handed back: the base (where the oldest event follows) is.
        let mut last = match lost {
            true => s.base.clone().unwrap_or_else(|| cursor.to_owned()),
            false => cursor.to_owned(),
        };
        for e in s.ring.iter().skip(from) {
            if events.len() >= max {
                break;
            }
            if e.gap_before {
                // A gap is said on the first event after it: a batch stops before one.
                if !events.is_empty() {
                    break;
                }
                truncated = true;
            }
            events.push(e.event.clone());
            last = e.cursor.clone();
        }
        Read::Known {
            events,
            cursor: Some(last),
            truncated,
        }
    }

    /// Takes in events (the slug's occurrences), the first after a gap when `truncated`;
    /// `batch_cursor` is where the batch ends.
    fn take(&self, events: Vec<Value>, truncated: bool, batch_cursor: Option<&str>) {
        let n = events.len();
        {
            let mut s = self.state.locked();
            let mut gap = truncated || std::mem::take(&mut s.gap_next);
            for (i, mut event) in events.into_iter().enumerate() {
                // An event taken already (a stream that replayed it, a webhook sent again)
                // is not taken twice.
                if let Some(id) = event.get("eventId").and_then(Value::as_str) {
                    if !s.seen.insert(id.to_owned()) {
                        continue;
                    }
                    s.seen_order.push_back(id.to_owned());
                    if s.seen_order.len() > SEEN
                        && let Some(old) = s.seen_order.pop_front()
                    {
                        s.seen.remove(&old);
                    }
                }
                let own = own_cursor(&mut event).or_else(|| {
                    (i + 1 == n)
                        .then(|| batch_cursor.map(str::to_owned))
                        .flatten()
                });
                let cursor = match own {
                    Some(c) => c,
                    None => {
                        s.next_local += 1;
                        local_cursor(&self.id, s.next_local)
                    }
                };
                as_polled(&mut event, Some(&cursor));
                s.ring.push_back(Entry {
                    cursor,
                    event,
                    gap_before: std::mem::take(&mut gap),
                });
            }
            // An empty batch that says a gap: the next event says it.
            s.gap_next |= gap;
            while s.ring.len() > FEED_EVENTS {
                if let Some(old) = s.ring.pop_front() {
                    s.base = Some(old.cursor);
                }
            }
        }
        if n > 0 {
            self.bump();
        }
    }

    /// The slug refused the subscription: polls go to it (and hear why), and the feed ends.
    fn refuse(&self) {
        self.state.locked().refused = true;
        self.bump();
    }

    fn started(&self, cursor: Option<&str>, truncated: bool) {
        {
            let mut s = self.state.locked();
            if !s.started {
                s.started = true;
                s.base = cursor.map(str::to_owned);
            } else if truncated {
                s.gap_next = true;
            }
        }
        self.bump();
    }
}

/// An occurrence as a poll answers it: the stream's own fields (`truncated`, the upstream's
/// subscription id) off, and its cursor in `_meta` as herald's polls give it, so a stream
/// downstream gives every event its own.
fn as_polled(event: &mut Value, cursor: Option<&str>) {
    let Some(o) = event.as_object_mut() else {
        return;
    };
    o.remove("truncated");
    let meta = o.entry("_meta").or_insert_with(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.remove(crate::mcp::listen::SUBSCRIPTION_ID);
        if let Some(c) = cursor {
            m.insert(EVENT_CURSOR_META.into(), c.into());
        }
        if m.is_empty() {
            o.remove("_meta");
        }
    }
}

/// One of the gateway's own cursors, for an event that came with none (a webhook's, or a
/// stream's that gives cursors per batch): unique to its feed, so a cursor from an older feed
/// of the same event type is not taken for one of this.
fn local_cursor(feed: &str, n: u64) -> String {
    format!("{LOCAL_CURSOR}{}.{n}", &feed[..feed.len().min(12)])
}

/// How the gateway's own cursors begin.
const LOCAL_CURSOR: &str = "gw";

/// The cursor an occurrence carries (`cursor`, or a herald poll's `_meta` one), taken off it
/// (a poll's answer gives its own).
fn own_cursor(event: &mut Value) -> Option<String> {
    let cursor = crate::upstream::events::cursor_of(event);
    event.as_object_mut()?.remove("cursor");
    cursor
}

/// The feeds' counters.
#[derive(Clone)]
pub struct FeedMetrics {
    pub open: Gauge,
    pub received: Counter,
    pub refused: Counter,
}

impl FeedMetrics {
    pub fn register(m: &Metrics) -> FeedMetrics {
        FeedMetrics {
            open: m.gauge(
                "herald_gateway_event_feeds",
                "upstream event subscriptions the gateway holds (one per slug, event type and arguments), each shared by every downstream follower",
            ),
            received: m.counter(
                "herald_gateway_webhooks_received_total",
                "webhook messages from slugs the gateway took (events, gaps, challenges)",
            ),
            refused: m.counter(
                "herald_gateway_webhooks_refused_total",
                "webhook messages the gateway refused: an unknown feed, a bad or stale signature, a body it cannot read",
            ),
        }
    }
}

/// The gateway's feeds, by key.
pub struct Feeds {
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    /// Where slugs POST webhooks: `[events] receiver_url`, else the gateway's own HTTP address.
    receiver: Mutex<Option<String>>,
    ctx: RoleContext,
    metrics: FeedMetrics,
}

fn key(slug: &str, up: &Arc<Upstream>, name: &str, arguments: &Value) -> String {
    json!([
        slug,
        Arc::as_ptr(up) as usize,
        name,
        crate::mcp::events::sorted_keys(arguments)
    ])
    .to_string()
}

fn random(n: usize) -> Vec<u8> {
    use ring::rand::SecureRandom as _;
    let mut raw = vec![0u8; n];
    // The system's randomness never fails on Linux once booted.
    let _ = ring::rand::SystemRandom::new().fill(&mut raw);
    raw
}

impl Feeds {
    pub fn new(ctx: &RoleContext) -> Feeds {
        Feeds {
            feeds: Mutex::default(),
            receiver: Mutex::default(),
            ctx: ctx.clone(),
            metrics: FeedMetrics::register(ctx.metrics()),
        }
    }

    /// Webhooks come to `base` (`[events] receiver_url`), not to the gateway's own HTTP
    /// address.
    pub fn set_receiver(&self, base: Option<String>) {
        if let Some(b) = base {
            *self.receiver.locked() = Some(b.trim_end_matches('/').to_owned());
        }
    }

    /// A long poll of `slug`'s event `params["name"]` (the slug's own name) answered from its
    /// feed, waiting at most `wait`; `None` when the feed cannot answer it (see the module
    /// docs), and the caller asks the slug.
    pub async fn poll(
        self: &Arc<Self>,
        slug: &str,
        up: &Arc<Upstream>,
        params: &JsonObject,
        wait: Duration,
    ) -> Option<Result<Value, SourceError>> {
        if params.contains_key("maxAgeMs") {
            return None;
        }
        let name = params.get("name")?.as_str()?.to_owned();
        let args = match params.get("arguments") {
            Some(Value::Object(a)) => a.clone(),
            None | Some(Value::Null) => JsonObject::new(),
            Some(_) => return None,
        };
        let cursor = match params.get("cursor") {
            Some(Value::String(c)) => Some(c.clone()),
            Some(Value::Null) | None => None,
            Some(_) => return None,
        };
        let max = params
            .get("maxEvents")
            .and_then(Value::as_u64)
            .map_or(crate::mcp::events::DEFAULT_MAX_EVENTS, |m| m as usize)
            .clamp(1, crate::mcp::events::MAX_EVENTS);
        let feed = self.feed(slug, up, &name, args)?;
        feed.touch();
        let deadline = tokio::time::Instant::now() + wait;
        let mut changed = feed.version.subscribe();
        // A new feed starts first (or the slug is asked after all).
        let ready = |s: &State| s.started || s.refused;
        if !ready(&feed.state.locked()) {
            let waited = tokio::time::timeout(
                START_WAIT,
                changed.wait_for(|_| ready(&feed.state.locked())),
            )
            .await;
            if !matches!(waited, Ok(Ok(_))) {
                return None;
            }
        }
        loop {
            {
                let s = feed.state.locked();
                if s.refused || s.ended {
                    return None;
                }
            }
            changed.borrow_and_update();
            match feed.read(cursor.as_deref(), max) {
                Read::Unknown => return None,
                Read::Known {
                    events,
                    cursor: next,
                    truncated,
                } if !events.is_empty() || truncated || cursor.is_none() => {
                    return Some(Ok(answer(events, next, truncated)));
                }
                Read::Known { .. } => {}
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => continue,
                // Its own timeout, or the feed ended: no events, its cursor as it was.
                _ => return Some(Ok(answer(Vec::new(), cursor, false))),
            }
        }
    }

    /// The feed of (`slug` on `up`, `name`, `arguments`), started if need be; `None` past
    /// [`MAX_FEEDS`].
    fn feed(
        self: &Arc<Self>,
        slug: &str,
        up: &Arc<Upstream>,
        name: &str,
        arguments: JsonObject,
    ) -> Option<Arc<Feed>> {
        let k = key(slug, up, name, &Value::Object(arguments.clone()));
        let mut feeds = self.feeds.locked();
        if let Some(f) = feeds.get(&k) {
            return Some(f.clone());
        }
        if feeds.len() >= MAX_FEEDS {
            return None;
        }
        let secret = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(random(32))
        );
        let feed = Arc::new(Feed {
            id: hex::encode(random(16)),
            secret: Secret::parse(&secret).expect("32 random bytes make a secret"),
            resubscribe: tokio::sync::Notify::new(),
            state: Mutex::default(),
            version: watch::channel(0).0,
            used: Mutex::new(Instant::now()),
        });
        feeds.insert(k.clone(), feed.clone());
        self.metrics.open.add(1);
        let run = Run {
            feeds: Arc::downgrade(self),
            feed: feed.clone(),
            up: up.clone(),
            slug: slug.to_owned(),
            name: name.to_owned(),
            arguments,
            key: k,
        };
        self.ctx
            .spawn_until_shutdown("gateway event feed", run.run());
        Some(feed)
    }
}

fn answer(events: Vec<Value>, cursor: Option<String>, truncated: bool) -> Value {
    json!({
        "events": events,
        "cursor": cursor,
        "truncated": truncated,
        "hasMore": false,
        "nextPollMs": crate::mcp::events::NEXT_POLL_MS,
    })
}

/// A feed's task: it follows the slug until nobody asked for [`IDLE`], then leaves the map.
struct Run {
    feeds: Weak<Feeds>,
    feed: Arc<Feed>,
    up: Arc<Upstream>,
    slug: String,
    name: String,
    arguments: JsonObject,
    key: String,
}

/// Whether `e` is the slug's refusal, not a failure that may pass: asking again gets the same.
fn refusal(e: &UpstreamError) -> bool {
    e.is_verdict() || matches!(e, UpstreamError::Forbidden { .. })
}

/// What woke a feed's task.
enum Wake {
    /// Nobody asked for it in a while (maybe).
    Idle,
    /// A webhook feed's subscription is due for renewal.
    Renew,
    /// The slug ended it: subscribe again (after the retry pause).
    Resubscribe,
    Got(Result<Fed, UpstreamError>),
}

impl Run {
    async fn run(self) {
        let mut follow =
            EventFollow::new(self.up.clone(), self.name.clone(), self.arguments.clone());
        let mut mode = Mode::Follow;
        let mut retry = RETRY;
        let mut renew_at = tokio::time::Instant::now() + RENEW;
        loop {
            let idle_at = *self.feed.used.locked() + IDLE;
            // `next` is cancel-safe on an open stream: the idle timer may cut it short.
            let wake = match mode {
                Mode::Follow => tokio::select! {
                    _ = tokio::time::sleep_until(idle_at.into()) => Wake::Idle,
                    got = follow.next() => Wake::Got(got),
                },
                Mode::Webhook => tokio::select! {
                    _ = tokio::time::sleep_until(idle_at.into()) => Wake::Idle,
                    _ = tokio::time::sleep_until(renew_at) => Wake::Renew,
                    _ = self.feed.resubscribe.notified() => Wake::Resubscribe,
                },
            };
            match wake {
                Wake::Idle if self.feed.used.locked().elapsed() >= IDLE => break,
                Wake::Idle => {}
                Wake::Renew | Wake::Resubscribe => {
                    if matches!(wake, Wake::Resubscribe) {
                        // A slug that ends the subscription again and again is not asked in
                        // a loop.
                        self.pause(&mut retry).await;
                    }
                    renew_at = tokio::time::Instant::now() + RENEW;
                    match self.subscribe().await {
                        Ok(()) => retry = RETRY,
                        Err(e) if refusal(&e) => {
                            self.give_up(&e);
                            break;
                        }
                        // The subscription made before still holds (its TTL is far longer
                        // than a renewal's period): try again soon, nothing lost yet.
                        Err(e) => {
                            tracing::warn!(slug = %self.slug, event = %self.name, error = %e,
                                "could not renew the gateway's webhook subscription; trying again in a minute");
                            renew_at = tokio::time::Instant::now() + Duration::from_secs(60);
                        }
                    }
                }
                Wake::Got(Ok(Fed::Started { truncated, .. })) => {
                    retry = RETRY;
                    // A slug with nothing yet may start at no cursor: the gateway's own then.
                    let at = follow
                        .cursor()
                        .map_or_else(|| local_cursor(&self.feed.id, 0), str::to_owned);
                    self.feed.started(Some(&at), truncated);
                }
                Wake::Got(Ok(Fed::Events {
                    events,
                    truncated,
                    cursor,
                })) => {
                    self.feed.take(events, truncated, cursor.as_deref());
                }
                Wake::Got(Ok(Fed::Trouble(_))) => {}
                // Neither stream nor poll (the follow fell back to polls, and the slug has
                // none either): by webhook, to the gateway.
                Wake::Got(Err(UpstreamError::NotFound { code: -32601, .. }))
                    if !follow.pushed() =>
                {
                    self.feed.state.locked().webhook = true;
                    match self.subscribe().await {
                        Ok(()) => {
                            mode = Mode::Webhook;
                            renew_at = tokio::time::Instant::now() + RENEW;
                            self.feed
                                .started(Some(&local_cursor(&self.feed.id, 0)), false);
                        }
                        Err(e) if refusal(&e) => {
                            self.give_up(&e);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(slug = %self.slug, event = %self.name, error = %e,
                                "the slug delivers this event type only by webhook, and the gateway could not subscribe");
                            self.pause(&mut retry).await;
                        }
                    }
                }
                // The slug's verdict (an unknown event type, bad arguments, no entitlement):
                // the feed ends, and polls hear it from the slug.
                Wake::Got(Err(e)) if refusal(&e) => {
                    self.give_up(&e);
                    break;
                }
                Wake::Got(Err(e)) => {
                    tracing::debug!(slug = %self.slug, event = %self.name, error = %e,
                        "the gateway's event feed failed; trying again");
                    self.pause(&mut retry).await;
                }
            }
        }
        self.end(mode).await;
    }

    /// The slug refused the feed (its verdict): polls go to it and hear why.
    fn give_up(&self, e: &UpstreamError) {
        tracing::info!(slug = %self.slug, event = %self.name, error = %e,
            "the slug refused the gateway's subscription to this event type");
        self.feed.refuse();
    }

    async fn pause(&self, retry: &mut Backoff) {
        tokio::time::sleep(retry.next_delay()).await;
    }

    /// The feed's upstream webhook subscription, made or renewed.
    async fn subscribe(&self) -> Result<(), UpstreamError> {
        let unavailable = |why: &str| UpstreamError::Unavailable {
            server: self.slug.clone(),
            why: why.to_owned(),
        };
        let Some(feeds) = self.feeds.upgrade() else {
            return Err(unavailable("the gateway is stopping"));
        };
        let base = feeds.receiver.locked().clone();
        let Some(base) = base else {
            return Err(unavailable(
                "the gateway serves no HTTP to receive webhooks at; set [events] receiver_url or --http",
            ));
        };
        let url = format!("{base}/{}", self.feed.id);
        let params = json!({
            "name": self.name,
            "arguments": self.arguments,
            "delivery": {"mode": "webhook", "url": url, "secret": self.feed.secret.expose()},
        });
        self.up.custom("events/subscribe", params).await.map(|_| ())
    }

    /// Leaves the map (only this feed under its key) and ends a webhook subscription.
    async fn end(self, mode: Mode) {
        if let Some(feeds) = self.feeds.upgrade() {
            {
                let mut map = feeds.feeds.locked();
                if map
                    .get(&self.key)
                    .is_some_and(|f| Arc::ptr_eq(f, &self.feed))
                {
                    map.remove(&self.key);
                    feeds.metrics.open.sub(1);
                }
            }
            let base = feeds.receiver.locked().clone();
            if mode == Mode::Webhook
                && let Some(base) = base
            {
                let params = json!({
                    "name": self.name,
                    "arguments": self.arguments,
                    "delivery": {"mode": "webhook", "url": format!("{base}/{}", self.feed.id)},
                });
                let _ = self.up.custom("events/unsubscribe", params).await;
            }
        }
        self.feed.state.locked().ended = true;
        self.feed.bump();
    }
}

#[cfg(test)]
mod tests;
