//! The Slack feed on NATS JetStream (`herald slack --backend nats://…`): several `herald slack`
//! processes on one Slack app, exactly one of them holding the Socket Mode connection, every
//! one serving the whole feed.
//!
//! - **The stream.** Each workspace (`team_id`, from `auth.test`) has a stream
//!   `<prefix>_<team_id>` with the one subject `herald.slack.<team_id>`: max-age = the
//!   retention, max-msgs = `--max-events` (20,000), oldest discarded first. A message is one
//!   event, sealed with `SLACK_EVENTS_ENCRYPTION_KEY` (AES-256-GCM bound to its id); its
//!   `Nats-Msg-Id` is `slack:<channel>:<ts>`, so the server drops a redelivery or a backfill of
//!   something it has (within its 2-minute window; past it, every process's buffer dedupes on
//!   the same key).
//! - **The cursor** stays the buffer's clock sequence (`max(last + 1, now in µs)`), sealed
//!   with the event (so nobody who can merely publish to NATS can move it): every process
//!   applies an event under the seq its publisher gave it, so a cursor from one process is good
//!   on every other. An event this process ingests is invisible here too until the stream
//!   delivers it back, so no process hands out a cursor past what the stream holds, and a new
//!   holder, which applies the whole stream before it publishes, numbers above every cursor.
//! - **One writer.** Only the lease holder publishes, and each publish names the stream
//!   sequence it expects last (`Nats-Expected-Last-Sequence`). A new holder first publishes a
//!   fence (a marker message, skipped by followers) expecting the last sequence it applied:
//!   from then on a publish of a previous holder that does not know it lost the lease is
//!   refused, and that process steps down (as it does on a duplicate acknowledged past its
//!   own last publish).
//! - **The lease** is the key `<team_id>.lease` of a key-value bucket (`--nats-bucket`,
//!   `herald_slack`), changed only by compare-and-set: the holder renews it every heartbeat
//!   (30 s), and once right after catching up. A standby watches it; when it has not changed
//!   for the stale time (90 s) by the standby's own clock, the standby takes it with a
//!   compare-and-set on the revision it saw (clocks of different hosts are never compared). A
//!   process that finds its own host's previous holder dead (same host name, boot and pid
//!   namespace; pid gone) takes it at once. A holder whose last renewal is two thirds of the
//!   stale time old (each renewal's wait is cut at that deadline), whose publishes have failed
//!   that long, or whose write is refused, closes its socket and forgets what it could not
//!   publish; whoever holds next reads it back from Slack's history (`live_through` is never
//!   written past an unpublished event). A holder that stops cleanly closes its socket,
//!   publishes what is left, and deletes the key, so the next takes over at once. The stale
//!   time is at least three heartbeats.
//! - **Backfill.** The state row's shared part (where the feed began, `live_through`) is the
//!   key `<team_id>.state`, written by the holder; a new holder's first pass reads Slack's
//!   history from `live_through` minus two minutes, and its settle pass ~75 s after hello
//!   catches what Slack gave an old socket during a deploy overlap.
//! - **Local state:** none. Every process applies the stream into its memory buffer (polls and
//!   listens are served from it, as with the store) and holds no message text on disk.
//!
//! This file holds the limits, the configuration, the message and lease formats, the
//! workspace's [`Feed`] and [`run`], which opens it; `shared/follow.rs` applies the stream
//! (read with [`crate::nats::ordered::Follow`]), `shared/publish.rs` publishes to it,
//! `shared/machine.rs` decides how the lease is taken, held and given up (no I/O, no clock),
//! `shared/lease.rs` runs that machine against NATS and the socket, and `nats::holder` says
//! who a holder is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use serde::{Deserialize, Serialize};

use super::buffer::SharedState;
use super::core::{Core, LeaseReport, SocketState};
use super::message::Posted;
use crate::mcp::ring::now_ms;
use crate::nats::NatsConfig;
use crate::runtime::backoff::Backoff;
use crate::runtime::metrics::{Counter, Gauge, Metrics};

/// The Slack socket lease's counters, registered by the Slack role in its context's
/// metrics (the role runner registers them up front, so every process names them).
#[derive(Debug, Clone)]
pub struct LeaseMetrics {
    /// Times this process took the lease.
    pub acquired: Counter,
    /// Times this process lost it (taken over, a write refused, NATS out of reach too long).
    pub lost: Counter,
    /// 1 while this process holds it.
    pub held: Gauge,
}

impl LeaseMetrics {
    /// Registers (or finds) the lease's counters in `metrics`.
    pub fn register(metrics: &Metrics) -> LeaseMetrics {
        LeaseMetrics {
            acquired: metrics.counter(
                "herald_slack_lease_acquired_total",
                "times this process took the Slack socket lease",
            ),
            lost: metrics.counter(
                "herald_slack_lease_lost_total",
                "times this process lost the Slack socket lease",
            ),
            held: metrics.gauge(
                "herald_slack_lease_held",
                "1 while this process holds the Slack socket lease (herald slack --backend nats://…)",
            ),
        }
    }
}
use crate::nats::ordered::Follow;

mod follow;
mod lease;
mod machine;
mod publish;

use crate::nats::holder::identity;
use follow::{Follower, follow_state};
use lease::lease;
use publish::publisher;

const BUCKET_DESCRIPTION: &str = "herald slack socket leases and shared state";
/// The key-value bucket holding the leases and shared state when none is named.
pub const DEFAULT_BUCKET: &str = "herald_slack";
/// Streams are named `<this>_<team_id>`.
pub const STREAM_PREFIX: &str = "herald_slack";
/// How often the holder rewrites the lease.
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// A lease unchanged this long is taken over.
pub const STALE: Duration = Duration::from_secs(90);
/// The header marking a holder's fence message (no event: skipped by followers).
const MARKER_HEADER: &str = "Herald-Lease";
/// How long a publish may wait for its acknowledgement.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Each step of a clean release (publish: twice this), so it fits the process's drain time.
const RELEASE_STEP: Duration = Duration::from_millis(1000);
/// How long catching up with the stream may take when starting or taking the lease.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Retry pacing for Slack's `auth.test` and NATS calls that failed.
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// How the feed is shared.
#[derive(Debug, Clone)]
pub struct SharedConfig {
    /// The servers; `bucket` is the lease bucket.
    pub nats: NatsConfig,
    pub heartbeat: Duration,
    pub stale: Duration,
}

/// The lease key's value.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaseValue {
    holder: String,
    since_ms: u64,
    beat: u64,
}

/// What a sealed stream message holds: the event and its cursor seq, both under the AEAD
/// (a seq in a header could be forged by anyone who may publish to the stream).
#[derive(Serialize, Deserialize)]
struct Sealed {
    seq: u64,
    /// The seq of the event its publisher last knew was in the stream before it (0: none):
    /// a follower that never saw that one lost it with a stream NATS lost ([`follow`]).
    #[serde(default)]
    prev: u64,
    data: Posted,
}

/// The connection to NATS, made at start (a bad address fails the start).
pub struct Shared {
    cfg: SharedConfig,
    conn: crate::nats::Connection,
}

impl Shared {
    /// Connects (counted in `metrics`); the rest ([`run`]) happens once the workspace is
    /// known.
    pub async fn connect(cfg: SharedConfig, metrics: &Metrics) -> Result<Shared, String> {
        let servers = cfg.nats.redacted();
        let conn = tokio::time::timeout(Duration::from_secs(20), cfg.nats.connect(metrics))
            .await
            .map_err(|_| format!("no NATS server answered at {servers} within 20 s"))??;
        Ok(Shared { cfg, conn })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.conn.client
    }
}

/// The workspace's stream and keys, once known.
struct Feed {
    js: jetstream::Context,
    kv: kv::Store,
    /// The bucket's name, and the stream's settings: both are made again if NATS loses them.
    bucket: String,
    stream_config: stream::Config,
    stream: String,
    subject: String,
    lease_key: String,
    state_key: String,
    me: String,
    /// The stream sequence this process has applied through.
    applied: tokio::sync::watch::Receiver<u64>,
    /// `Some(last stream sequence)` while this process may publish (it holds the lease and
    /// has applied the stream through that sequence).
    writer: tokio::sync::Mutex<Option<u64>>,
    /// Counts publishes refused because another process wrote (the holder steps down).
    superseded: tokio::sync::watch::Sender<u64>,
    /// Ids this process sent without an acknowledgement (a timeout, a lost connection): a
    /// duplicate of one of them is its own earlier publish landing, not another writer.
    unacked: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The newest event seq this process knows is in the stream (its follower applied it,
    /// or the stream acknowledged its publish): the next publish's `prev`.
    through: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Since when publishing has failed (NATS up enough to renew the lease, not to take
    /// events): the holder steps down after two thirds of the stale time of it.
    failing_since: tokio::sync::watch::Sender<Option<Instant>>,
    servers: String,
    /// NATS's counters, registered once with the feed (publishing counts into them).
    counts: crate::nats::NatsMetrics,
}

impl Feed {
    /// Makes the stream again when NATS lost it (a warning, and
    /// `herald_nats_streams_remade_total`): `true` when it was gone and is there again.
    async fn remake_stream(&self) -> bool {
        if !crate::nats::stream_gone(&self.js, &self.stream).await {
            return false;
        }
        match self
            .js
            .get_or_create_stream(self.stream_config.clone())
            .await
        {
            Ok(_) => {
                self.counts.remade.inc();
                tracing::warn!(stream = %self.stream, "the slack stream was gone (NATS lost its data); made it again: the holder fences it anew and backfills from Slack's history");
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot make the slack stream again yet");
                false
            }
        }
    }

    /// Makes the lease bucket again when NATS lost it: `true` when it was gone and is there
    /// again (the key handles name it, so they work again).
    async fn remake_bucket(&self) -> bool {
        if !crate::nats::stream_gone(&self.js, &format!("KV_{}", self.bucket)).await {
            return false;
        }
        match crate::nats::bucket(&self.js, &self.bucket, BUCKET_DESCRIPTION, 1, &self.servers)
            .await
        {
            Ok(_) => {
                self.counts.remade.inc();
                tracing::warn!(bucket = %self.bucket, "the slack lease bucket was gone (NATS lost its data); made it again");
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot make the slack lease bucket again yet");
                false
            }
        }
    }

    /// The lease key's value for this process at heartbeat `beat`.
    fn lease_value(&self, beat: u64) -> Vec<u8> {
        serde_json::to_vec(&LeaseValue {
            holder: self.me.clone(),
            since_ms: now_ms(),
            beat,
        })
        .expect("a lease serializes")
    }
}

fn lease_status(core: &Core, f: impl FnOnce(&mut LeaseReport)) {
    let mut s = core.status();
    f(s.lease.get_or_insert_with(LeaseReport::default));
}

/// Runs the shared feed until shutdown: learns the workspace, opens its stream and keys,
/// applies the stream, publishes what this process ingests, and holds or waits for the lease
/// (running the socket and the backfill while it holds it).
pub async fn run(core: Arc<Core>, shared: Shared) {
    let shutdown = core.ctx.shutdown().clone();
    lease_status(&core, |_| {});
    core.status().state = SocketState::Standby;
    let mut backoff = RETRY;
    let feed = loop {
        let r = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = open(&core, &shared) => r,
        };
        match r {
            Ok(f) => break Arc::new(f),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the shared slack feed yet; retrying");
                core.status().last_socket_error = Some(e);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    };
    core.ctx.spawn_until_shutdown(
        "slack nats state",
        follow_state(core.clone(), feed.clone(), shared.conn.clone()),
    );
    // Not dropped mid-publish at shutdown: it stops between publishes (the holding spell
    // publishes what is left).
    core.ctx
        .spawn("slack nats publish", publisher(core.clone(), feed.clone()));
    lease(core, feed, shared.cfg).await;
}

/// Identifies the workspace, makes (or opens) its stream and the bucket, starts applying the
/// stream and returns once it has applied what the stream held at the start.
async fn open(core: &Arc<Core>, shared: &Shared) -> Result<Feed, String> {
    let servers = shared.cfg.nats.redacted();
    let team = core
        .identify()
        .await
        .map_err(|e| format!("auth.test (the workspace names the stream): {e}"))?
        .team_id;
    if team.is_empty()
        || !team
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "Slack's auth.test gave the team id {team:?}, which cannot name a stream"
        ));
    }
    let js = jetstream::new(shared.conn.client.clone());
    let name = format!("{STREAM_PREFIX}_{team}");
    let subject = format!("herald.slack.{team}");
    let config = stream::Config {
        name: name.clone(),
        description: Some("herald slack message_posted events, sealed".into()),
        subjects: vec![subject.clone()],
        max_age: core.buffer.retention(),
        max_messages: core.buffer.cap() as i64,
        discard: stream::DiscardPolicy::Old,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    let mut stream = match js.get_stream(&name).await {
        Ok(s) => s,
        Err(_) => js.get_or_create_stream(config.clone()).await.map_err(|e| {
            format!("cannot open or make the stream {name} at {servers} ({e}); JetStream must be on (nats-server -js)")
        })?,
    };
    {
        // Settings changed since the stream was made (retention, cap) apply now.
        let have = &stream.cached_info().config;
        if have.max_age != config.max_age || have.max_messages != config.max_messages {
            let mut want = have.clone();
            want.max_age = config.max_age;
            want.max_messages = config.max_messages;
            if let Err(e) = js.update_stream(want).await {
                tracing::warn!(stream = %name, error = %e, "cannot update the stream's retention and cap");
            }
        }
    }
    let bucket = &shared.cfg.nats.bucket;
    let kv = crate::nats::bucket(&js, bucket, BUCKET_DESCRIPTION, 1, &servers).await?;
    let state_key = format!("{team}.state");
    if let Ok(Some(v)) = kv.get(&state_key).await
        && let Ok(s) = serde_json::from_slice::<SharedState>(&v)
    {
        core.buffer.merge_shared(s);
    }
    let info = stream
        .info()
        .await
        .map_err(|e| format!("cannot read the stream {name} at {servers}: {e}"))?
        .state
        .clone();
    // A stream with no messages now has nothing to apply: it is applied through its end.
    let start = if info.messages == 0 {
        info.last_sequence
    } else {
        0
    };
    let (applied_tx, applied) = tokio::sync::watch::channel(start);
    if info.messages == 0 && info.last_sequence > 0 {
        // Everything it ever held has aged out: nothing from before now can be served.
        core.buffer.evicted_through(core.buffer.head());
    }
    let counts = crate::nats::NatsMetrics::register(core.ctx.metrics());
    let follow = Follow::start(
        &shared.conn,
        stream.clone(),
        subject.clone(),
        0,
        core.ctx.shutdown().clone(),
    )
    .await
    .map_err(|e| format!("cannot follow the stream {name} at {servers}: {e}"))?
    .remaking(js.clone(), config.clone(), counts.remade.clone());
    let through = std::sync::Arc::<std::sync::atomic::AtomicU64>::default();
    let follower = Follower {
        core: core.clone(),
        applied: applied_tx,
        first: true,
        started_late: None,
        seen: core.buffer.head(),
        through: through.clone(),
    };
    let following = core
        .ctx
        .spawn_until_shutdown("slack nats follow", follower.run(follow));
    let mut rx = applied.clone();
    let until = info.last_sequence;
    if info.messages > 0 {
        let loaded = tokio::time::timeout(CATCH_UP_TIMEOUT, rx.wait_for(|&a| a >= until))
            .await
            .map_err(|_| {
                format!(
                    "the stream {name} did not load within {} s",
                    CATCH_UP_TIMEOUT.as_secs()
                )
            })
            .and_then(|r| {
                r.map(|_| ())
                    .map_err(|_| "the stream's follower stopped".to_owned())
            });
        if let Err(e) = loaded {
            // The next try starts its own follower.
            following.abort();
            return Err(e);
        }
    }
    core.set_loaded();
    tracing::info!(stream = %name, events = info.messages, "slack feed shared on NATS");
    lease_status(core, |l| l.stream = Some(name.clone()));
    Ok(Feed {
        js,
        kv,
        bucket: bucket.clone(),
        stream_config: config,
        stream: name,
        subject,
        lease_key: format!("{team}.lease"),
        state_key,
        me: identity(),
        applied,
        writer: tokio::sync::Mutex::new(None),
        superseded: tokio::sync::watch::channel(0).0,
        failing_since: tokio::sync::watch::channel(None).0,
        unacked: std::sync::Mutex::new(std::collections::HashSet::new()),
        through,
        servers,
        counts,
    })
}
