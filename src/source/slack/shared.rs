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

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, kv, stream};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::buffer::{SharedState, now_us};
use super::core::{Core, LeaseReport, SocketState, at};
use super::message::Posted;
use crate::mcp::backoff::Backoff;
use crate::mcp::metrics;
use crate::mcp::ring::now_ms;
use crate::nats::NatsConfig;
use crate::nats::hostname;

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
    data: Posted,
}

/// Who this process is: `host:boot:pidns:pid:random`. The boot id and pid namespace say
/// whether `pid` can be looked up here (containers may share a host name).
fn identity() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 4];
    let _ = SystemRandom::new().fill(&mut b);
    format!(
        "{}:{}:{}:{}:{:08x}",
        hostname(),
        boot_id(),
        pid_ns(),
        std::process::id(),
        u32::from_le_bytes(b)
    )
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().get(..8).unwrap_or("").to_owned())
        .unwrap_or_default()
}

fn pid_ns() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("pid:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// Whether `holder` names a process of this host, this boot and this pid namespace that is
/// gone (its lease can be taken at once: it can no longer hold a socket).
fn dead_here(holder: &str) -> bool {
    let parts: Vec<&str> = holder.split(':').collect();
    let [host, boot, ns, pid, _] = parts[..] else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    !boot.is_empty()
        && !ns.is_empty()
        && host == hostname()
        && boot == boot_id()
        && ns == pid_ns()
        && pid != std::process::id()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The connection to NATS, made at start (a bad address fails the start).
pub struct Shared {
    cfg: SharedConfig,
    client: async_nats::Client,
}

impl Shared {
    /// Connects; the rest ([`run`]) happens once the workspace is known.
    pub async fn connect(cfg: SharedConfig) -> Result<Shared, String> {
        let servers = cfg.nats.redacted();
        let client = tokio::time::timeout(Duration::from_secs(20), cfg.nats.connect())
            .await
            .map_err(|_| format!("no NATS server answered at {servers} within 20 s"))??;
        Ok(Shared { cfg, client })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

/// The workspace's stream and keys, once known.
struct Feed {
    js: jetstream::Context,
    kv: kv::Store,
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
    /// Since when publishing has failed (NATS up enough to renew the lease, not to take
    /// events): the holder steps down after two thirds of the stale time of it.
    failing_since: std::sync::Mutex<Option<Instant>>,
    servers: String,
}

impl Feed {
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
    core.ctx
        .spawn_until_shutdown("slack nats state", follow_state(core.clone(), feed.clone()));
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
    let js = jetstream::new(shared.client.clone());
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
    let kv = crate::nats::bucket(
        &js,
        bucket,
        "herald slack socket leases and shared state",
        1,
        &servers,
    )
    .await?;
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
    let consumer = stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: shared.client.new_inbox(),
            filter_subject: subject.clone(),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot follow the stream {name} at {servers}: {e}"))?;
    let messages = consumer
        .messages()
        .await
        .map_err(|e| format!("cannot follow the stream {name} at {servers}: {e}"))?;
    let follower = Follower {
        core: core.clone(),
        client: shared.client.clone(),
        stream: stream.clone(),
        subject: subject.clone(),
        applied: applied_tx,
        first: true,
        started_late: None,
    };
    let following = core
        .ctx
        .spawn_until_shutdown("slack nats follow", follower.run(messages));
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
        stream: name,
        subject,
        lease_key: format!("{team}.lease"),
        state_key,
        me: identity(),
        applied,
        writer: tokio::sync::Mutex::new(None),
        superseded: tokio::sync::watch::channel(0).0,
        failing_since: std::sync::Mutex::new(None),
        unacked: std::sync::Mutex::new(std::collections::HashSet::new()),
        servers,
    })
}

/// Applies the stream to this process's buffer, in order.
struct Follower {
    core: Arc<Core>,
    client: async_nats::Client,
    stream: stream::Stream,
    subject: String,
    applied: tokio::sync::watch::Sender<u64>,
    /// The next event is the first this process sees.
    first: bool,
    /// Whether the very first message (of any kind) was past sequence 1: the stream dropped
    /// what came before.
    started_late: Option<bool>,
}

impl Follower {
    async fn run(mut self, mut messages: consumer::push::Ordered) {
        loop {
            match messages.next().await {
                Some(Ok(m)) => self.apply(m),
                Some(Err(e)) => tracing::warn!(error = %e, "following the slack stream"),
                None => {
                    // Open it again after what was applied.
                    let from = *self.applied.borrow() + 1;
                    let again = async {
                        self.stream
                            .create_consumer(consumer::push::OrderedConfig {
                                deliver_subject: self.client.new_inbox(),
                                filter_subject: self.subject.clone(),
                                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                                    start_sequence: from,
                                },
                                ..Default::default()
                            })
                            .await
                            .map_err(|e| e.to_string())?
                            .messages()
                            .await
                            .map_err(|e| e.to_string())
                    };
                    match again.await {
                        Ok(m) => messages = m,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot follow the slack stream again; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        }
    }

    fn apply(&mut self, m: jetstream::Message) {
        let Ok(info) = m.info() else { return };
        let sequence = info.stream_sequence;
        let late = *self.started_late.get_or_insert(sequence > 1);
        if is_marker(&m) {
            self.applied.send_modify(|a| *a = (*a).max(sequence));
            return;
        }
        match decode(&self.core, &m) {
            Some((seq, posted)) => {
                let first = std::mem::replace(&mut self.first, false);
                if first && late {
                    // What came before it was dropped by the stream's limits.
                    self.core.buffer.evicted_through(seq.saturating_sub(1));
                }
                self.core.apply(seq, posted);
            }
            None => tracing::warn!(
                sequence,
                "a message in the slack stream does not open with this SLACK_EVENTS_ENCRYPTION_KEY (was the key changed?); skipping it"
            ),
        }
        self.applied.send_modify(|a| *a = (*a).max(sequence));
        lease_status(&self.core, |l| l.applied_sequence = sequence);
    }
}

/// An event from a stream message: its seq and payload.
fn decode(core: &Core, m: &async_nats::Message) -> Option<(u64, Posted)> {
    let headers = m.headers.as_ref()?;
    let id = headers.get(async_nats::header::NATS_MESSAGE_ID)?.as_str();
    let plain = core.buffer.sealer().open(id, &m.payload).ok()?;
    let sealed: Sealed = serde_json::from_slice(&plain).ok()?;
    Some((sealed.seq, sealed.data))
}

/// A holder's fence message (see [`hold`]).
fn is_marker(m: &async_nats::Message) -> bool {
    m.headers
        .as_ref()
        .is_some_and(|h| h.get(MARKER_HEADER).is_some())
}

/// Takes in the shared state the holder writes (a standby's status, and its backfill floor
/// when it takes over).
async fn follow_state(core: Arc<Core>, feed: Arc<Feed>) {
    loop {
        match feed.kv.watch_with_history(&feed.state_key).await {
            Ok(mut w) => {
                while let Some(e) = w.next().await {
                    if let Ok(e) = e
                        && let Ok(s) = serde_json::from_slice::<SharedState>(&e.value)
                    {
                        core.buffer.merge_shared(s);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot watch the slack state key; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Publishes what this process ingests, at once, while it may write.
async fn publisher(core: Arc<Core>, feed: Arc<Feed>) {
    let shutdown = core.ctx.shutdown().clone();
    let mut backoff = RETRY;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = core.unwritten.notified() => {}
        }
        loop {
            match publish_pending(&core, &feed).await {
                Ok(()) => {
                    backoff = RETRY;
                    break;
                }
                Err(Refused::Superseded) => {
                    feed.superseded.send_modify(|n| *n += 1);
                    break;
                }
                Err(Refused::Failed) => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

fn failing(feed: &Feed, now_failing: bool) {
    let mut f = feed.failing_since.lock().unwrap_or_else(|e| e.into_inner());
    match (now_failing, f.is_some()) {
        (true, false) => *f = Some(Instant::now()),
        (false, true) => *f = None,
        _ => {}
    }
}

/// The stream's last sequence, when its last message is one this process sent without an
/// acknowledgement.
async fn own_last(feed: &Feed) -> Option<u64> {
    if feed
        .unacked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_empty()
    {
        return None;
    }
    let stream = feed.js.get_stream(&feed.stream).await.ok()?;
    let last = tokio::time::timeout(
        PUBLISH_TIMEOUT,
        stream.get_last_raw_message_by_subject(&feed.subject),
    )
    .await
    .ok()?
    .ok()?;
    let id = last
        .headers
        .get(async_nats::header::NATS_MESSAGE_ID)?
        .as_str()
        .to_owned();
    feed.unacked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id)
        .then_some(last.sequence)
}

/// Why a publish did not go through.
enum Refused {
    /// Another process wrote to the stream: this one is no longer the only writer.
    Superseded,
    /// NATS did not answer (in time): the rows stay unwritten, for the next try.
    Failed,
}

/// Publishes every unwritten row, in seq order, each expecting the last one before it.
async fn publish_pending(core: &Core, feed: &Feed) -> Result<(), Refused> {
    let mut writer = feed.writer.lock().await;
    let Some(mut expected) = *writer else {
        // Not the holder (any more): nothing is written; the rows wait for a lease or are
        // forgotten when it is lost.
        return Ok(());
    };
    let rows = core.buffer.take_unwritten();
    for (i, h) in rows.iter().enumerate() {
        let id = h.posted.event_id();
        let plain = serde_json::to_vec(&Sealed {
            seq: h.seq,
            data: (*h.posted).clone(),
        })
        .expect("a payload serializes");
        let sealed = core.buffer.sealer().seal(&id, &plain);
        let msg = jetstream::message::PublishMessage::build()
            .payload(sealed.into())
            .message_id(&id)
            .expected_last_sequence(expected);
        let clock = Instant::now();
        let r = tokio::time::timeout(PUBLISH_TIMEOUT, async {
            feed.js.send_publish(feed.subject.clone(), msg).await?.await
        })
        .await;
        match r {
            Ok(Ok(ack))
                if ack.duplicate
                    && ack.sequence > expected
                    && feed
                        .unacked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id) =>
            {
                // This process's own earlier publish of it, landed after all.
                expected = ack.sequence;
                *writer = Some(expected);
            }
            Ok(Ok(ack)) if ack.duplicate && ack.sequence > expected => {
                // The stream took this event from another writer after this one's last
                // publish: this process is not the only writer any more.
                tracing::warn!(stream = %feed.stream, "another process wrote to the slack stream: this one is no longer its writer");
                core.buffer.restore_unwritten(&rows[i + 1..]);
                *writer = None;
                return Err(Refused::Superseded);
            }
            Ok(Ok(ack)) => {
                metrics::NATS_PUBLISHES.fetch_add(1, Ordering::Relaxed);
                metrics::NATS_PUBLISH_MICROS
                    .fetch_add(clock.elapsed().as_micros() as u64, Ordering::Relaxed);
                failing(feed, false);
                feed.unacked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                if !ack.duplicate {
                    expected = ack.sequence;
                    *writer = Some(expected);
                }
            }
            Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                metrics::NATS_PUBLISH_FAILURES.fetch_add(1, Ordering::Relaxed);
                // The last message may be this process's own, sent earlier without an
                // acknowledgement (and applied meanwhile): then take its place and go on.
                if let Some(own) = own_last(feed).await {
                    expected = own;
                    *writer = Some(expected);
                    core.buffer.restore_unwritten(&rows[i..]);
                    return Err(Refused::Failed);
                }
                tracing::warn!(stream = %feed.stream, "another process wrote to the slack stream: this one is no longer its writer");
                core.buffer.restore_unwritten(&rows[i..]);
                *writer = None;
                return Err(Refused::Superseded);
            }
            Ok(Err(e)) => {
                metrics::NATS_PUBLISH_FAILURES.fetch_add(1, Ordering::Relaxed);
                failing(feed, true);
                feed.unacked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.clone());
                tracing::warn!(error = %e, "cannot publish to the slack stream; retrying");
                core.buffer.restore_unwritten(&rows[i..]);
                return Err(Refused::Failed);
            }
            Err(_) => {
                metrics::NATS_PUBLISH_FAILURES.fetch_add(1, Ordering::Relaxed);
                failing(feed, true);
                feed.unacked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.clone());
                tracing::warn!(servers = %feed.servers, "no acknowledgement from NATS in time; retrying");
                core.buffer.restore_unwritten(&rows[i..]);
                return Err(Refused::Failed);
            }
        }
    }
    Ok(())
}

/// How a holding spell ended.
enum Ended {
    Shutdown,
    Lost(String),
}

/// Waits for the lease, holds it (socket and backfill running) until lost, and again, until
/// shutdown.
async fn lease(core: Arc<Core>, feed: Arc<Feed>, cfg: SharedConfig) {
    let shutdown = core.ctx.shutdown().clone();
    let mut backoff = RETRY;
    loop {
        core.status().state = SocketState::Standby;
        let Some(taken) = acquire(&core, &feed, &cfg, &shutdown).await else {
            return;
        };
        if let Some(seen) = taken.previous_seen_ms
            && core.buffer.live_through().is_none()
        {
            // The previous holder's state never reached the bucket: it was live (and
            // publishing) until it was last seen renewing, so the backfill reads from there.
            // (No start is known: the retention is the only floor.)
            core.buffer.merge_shared(SharedState {
                first_seq: 0,
                born_ms: Some(0),
                live_through_ms: Some(seen),
            });
        }
        let began = Instant::now();
        let ended = hold(&core, &feed, &cfg, taken.revision, &shutdown).await;
        if let Ended::Shutdown = ended {
            return;
        }
        core.status().state = SocketState::Standby;
        // A spell that ended at once (the stream gone, no permission) is not tried again in
        // a tight loop.
        if began.elapsed() > cfg.stale {
            backoff = RETRY;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// What taking the lease found.
struct Taken {
    revision: u64,
    /// When (this host's clock) another holder was last seen renewing it.
    previous_seen_ms: Option<u64>,
}

/// Waits until this process holds the lease, or `None` at shutdown.
async fn acquire(
    core: &Core,
    feed: &Feed,
    cfg: &SharedConfig,
    shutdown: &CancellationToken,
) -> Option<Taken> {
    let value = |beat| feed.lease_value(beat);
    let mut backoff = RETRY;
    let mut previous_seen_ms = None;
    'fresh: loop {
        // What the key holds now, and from when (by this process's clock) it is unchanged.
        let current = tokio::select! {
            _ = shutdown.cancelled() => return None,
            e = feed.kv.entry(&feed.lease_key) => e,
        };
        let current = match current {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the slack lease; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff.next_delay()) => continue 'fresh,
                }
            }
        };
        let free = current
            .as_ref()
            .is_none_or(|e| e.operation != kv::Operation::Put);
        let holder = current
            .as_ref()
            .filter(|_| !free)
            .and_then(|e| serde_json::from_slice::<LeaseValue>(&e.value).ok())
            .map(|v| v.holder);
        let changed_hands = core
            .status()
            .lease
            .as_ref()
            .is_none_or(|l| l.holder != holder);
        lease_status(core, |l| l.holder = holder.clone());
        if let Some(h) = &holder {
            previous_seen_ms = Some(now_ms());
            if changed_hands && h != &feed.me {
                tracing::info!(holder = %h, "another process holds the slack socket lease: standing by");
            }
        }
        let revision = current.as_ref().map_or(0, |e| e.revision);
        let mine = holder.as_deref() == Some(feed.me.as_str());
        let taken = if free {
            match current {
                None => feed.kv.create(&feed.lease_key, value(0).into()).await,
                Some(_) => feed
                    .kv
                    .update(&feed.lease_key, value(0).into(), revision)
                    .await
                    .map_err(Into::into),
            }
        } else if mine || holder.as_deref().is_some_and(dead_here) {
            tracing::info!(holder = ?holder, "the slack lease's holder was a process of this host that is gone: taking it");
            feed.kv
                .update(&feed.lease_key, value(0).into(), revision)
                .await
                .map_err(Into::into)
        } else {
            // Held: wait for a change, or for the stale time with none.
            let mut watch = match feed.kv.watch(&feed.lease_key).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch the slack lease; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(backoff.next_delay()) => continue 'fresh,
                    }
                }
            };
            let stale_at = tokio::time::Instant::now() + cfg.stale;
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                // Changed (a heartbeat, a release): read it again.
                _ = watch.next() => continue 'fresh,
                _ = tokio::time::sleep_until(stale_at) => {}
            }
            tracing::warn!(holder = ?holder, stale_s = cfg.stale.as_secs_f64(), "the slack lease's holder is silent: taking the socket over");
            feed.kv
                .update(&feed.lease_key, value(0).into(), revision)
                .await
                .map_err(Into::into)
        };
        match taken {
            Ok(revision) => {
                return Some(Taken {
                    revision,
                    previous_seen_ms,
                });
            }
            Err::<u64, kv::CreateError>(e) => {
                // Someone else was quicker (or NATS is away, or refuses): look again, paced.
                tracing::debug!(error = %e, "the slack lease was not taken");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// Holds the lease from `revision`: catches up with the stream, fences it, runs the socket
/// and the backfill, renews; ends at shutdown (releasing it) or when it is lost.
///
/// The socket runs only while the last renewal is younger than two thirds of the stale time
/// (each renewal's wait is cut at that deadline), so a standby that takes over after the
/// stale time never overlaps it.
async fn hold(
    core: &Arc<Core>,
    feed: &Feed,
    cfg: &SharedConfig,
    mut revision: u64,
    shutdown: &CancellationToken,
) -> Ended {
    tracing::info!(holder = %feed.me, "this process holds the slack socket lease");
    metrics::SLACK_LEASE_HELD.store(1, Ordering::Relaxed);
    metrics::SLACK_LEASE_ACQUIRED.fetch_add(1, Ordering::Relaxed);
    lease_status(core, |l| {
        l.held = true;
        l.holder = Some(feed.me.clone());
        l.acquired_at = Some(at(now_ms()));
        l.takeovers += 1;
    });
    let stop = shutdown.child_token();
    let mut running: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut beat = 0u64;
    let lease_value = |beat| feed.lease_value(beat);
    // Ids left unacknowledged by an earlier spell mean nothing in this one.
    feed.unacked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    let keep_for = cfg.stale * 2 / 3;
    // Anything ingested outside a spell (a reader that outlived its socket's close) is not
    // published under stale seqs: the backfill reads it again.
    let stranded = core.buffer.take_unwritten();
    core.buffer.forget(&stranded);
    let mut superseded = feed.superseded.subscribe();
    let ended = 'held: {
        // Everything published before this moment is applied first: new seqs stay above it.
        let caught_up = tokio::time::timeout(CATCH_UP_TIMEOUT, async {
            let mut s = feed
                .js
                .get_stream(&feed.stream)
                .await
                .map_err(|e| e.to_string())?;
            let st = s.info().await.map_err(|e| e.to_string())?.state.clone();
            if st.messages > 0 {
                let mut rx = feed.applied.clone();
                let last = st.last_sequence;
                rx.wait_for(|&a| a >= last)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<u64, String>(st.last_sequence)
        })
        .await;
        let last = match caught_up {
            Ok(Ok(last)) => last,
            Ok(Err(e)) => break 'held Ended::Lost(format!("cannot catch up with the stream: {e}")),
            Err(_) => break 'held Ended::Lost("cannot catch up with the stream in time".into()),
        };
        // The fence: a message that says the stream's last sequence is `last`. It fails if
        // another process wrote since; once it is in, a publish of a previous holder (which
        // expects an older sequence) is refused.
        let marker = jetstream::message::PublishMessage::build()
            .header(MARKER_HEADER, feed.me.as_str())
            .expected_last_sequence(last);
        let fenced = tokio::time::timeout(PUBLISH_TIMEOUT, async {
            feed.js
                .send_publish(feed.subject.clone(), marker)
                .await?
                .await
        })
        .await;
        let expected = match fenced {
            Ok(Ok(ack)) => ack.sequence,
            Ok(Err(e)) => break 'held Ended::Lost(format!("cannot fence the stream: {e}")),
            Err(_) => break 'held Ended::Lost("cannot fence the stream in time".into()),
        };
        // Renewed now: the catch-up may have taken a while of the stale time.
        match tokio::time::timeout(
            keep_for,
            feed.kv
                .update(&feed.lease_key, lease_value(0).into(), revision),
        )
        .await
        {
            Ok(Ok(r)) => revision = r,
            _ => {
                break 'held Ended::Lost("the lease could not be renewed after catching up".into());
            }
        }
        let mut last_ok = Instant::now();
        *feed.writer.lock().await = Some(expected);
        failing(feed, false);
        let (mut shared, _) = core.buffer.take_shared();
        match feed.kv.get(&feed.state_key).await {
            Ok(Some(v)) => {
                if let Ok(s) = serde_json::from_slice::<SharedState>(&v) {
                    core.buffer.merge_shared(s);
                }
                shared = core.buffer.take_shared().0;
                write_state(feed, shared).await;
            }
            Ok(None) => {
                // A new feed begins now: a cursor from before it learns `truncated`. Made
                // only if absent (and taken in only once made), so a feed's start never moves.
                shared.first_seq = core.buffer.head().max(now_us());
                let bytes = serde_json::to_vec(&shared).expect("the state serializes");
                match feed.kv.create(&feed.state_key, bytes.into()).await {
                    Ok(_) => core.buffer.merge_shared(shared),
                    Err(_) => {
                        if let Ok(Some(v)) = feed.kv.get(&feed.state_key).await
                            && let Ok(s) = serde_json::from_slice::<SharedState>(&v)
                        {
                            core.buffer.merge_shared(s);
                        }
                    }
                }
            }
            Err(e) => {
                break 'held Ended::Lost(format!("cannot read the feed's shared state: {e}"));
            }
        }
        running.push(core.ctx.spawn(
            "slack socket mode",
            super::socket::run(core.clone(), stop.clone()),
        ));
        running.push(core.ctx.spawn(
            "slack backfill",
            super::backfill::run(core.clone(), stop.clone()),
        ));
        let mut tick = tokio::time::interval(cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut state_tick = tokio::time::interval(super::FLUSH_EVERY.min(cfg.heartbeat));
        state_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let deadline = tokio::time::Instant::from_std(last_ok + keep_for);
            tokio::select! {
                _ = shutdown.cancelled() => break 'held Ended::Shutdown,
                _ = superseded.changed() => break 'held Ended::Lost("another process wrote to the stream".into()),
                _ = tokio::time::sleep_until(deadline) => {
                    break 'held Ended::Lost("the lease could not be renewed for 2/3 of the stale time".into());
                }
                _ = state_tick.tick() => {
                    // Where the backfill may start from, for whoever holds next.
                    let (shared, changed) = core.buffer.take_shared();
                    if changed {
                        write_state(feed, shared).await;
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            let stuck = feed
                .failing_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|t| t.elapsed() >= keep_for);
            if stuck {
                break 'held Ended::Lost(
                    "publishing to the stream failed for 2/3 of the stale time".into(),
                );
            }
            beat += 1;
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(
                remaining.min(cfg.heartbeat),
                feed.kv
                    .update(&feed.lease_key, lease_value(beat).into(), revision),
            )
            .await
            {
                Ok(Ok(r)) => {
                    revision = r;
                    last_ok = Instant::now();
                }
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    break 'held Ended::Lost("another process took the lease".into());
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the slack lease"),
                Err(_) => tracing::warn!("cannot renew the slack lease: no answer in time"),
            }
        }
    };
    // The socket closes (and its reader ends) before anything else happens.
    stop.cancel();
    let stopped = tokio::time::timeout(RELEASE_STEP * 3, async {
        for r in &mut running {
            let _ = r.await;
        }
    })
    .await
    .is_ok();
    if !stopped {
        for r in &running {
            r.abort();
        }
    }
    metrics::SLACK_LEASE_HELD.store(0, Ordering::Relaxed);
    match ended {
        Ended::Shutdown => {
            // What the socket brought in last is published, then the lease is given back
            // (only once the socket is known closed), then the state written: all within the
            // process's drain time. A row cut off mid-publish stays counted as in flight, so
            // the state written does not pass it.
            let _ = tokio::time::timeout(RELEASE_STEP, publish_pending(core, feed)).await;
            if let Ok(mut w) = tokio::time::timeout(RELEASE_STEP / 2, feed.writer.lock()).await {
                *w = None;
            }
            let released = stopped
                && matches!(
                    tokio::time::timeout(
                        RELEASE_STEP,
                        feed.kv
                            .delete_expect_revision(&feed.lease_key, Some(revision)),
                    )
                    .await,
                    Ok(Ok(()))
                );
            if released {
                tracing::info!("slack socket lease released");
            } else {
                tracing::warn!(
                    "could not release the slack socket lease; another process takes it once it is stale"
                );
            }
            let shared = core.buffer.take_shared().0;
            let _ = tokio::time::timeout(RELEASE_STEP / 2, write_state(feed, shared)).await;
            lease_status(core, |l| l.held = false);
            Ended::Shutdown
        }
        Ended::Lost(why) => {
            metrics::SLACK_LEASE_LOST.fetch_add(1, Ordering::Relaxed);
            // Writing stops before the lease is given up.
            *feed.writer.lock().await = None;
            let unpublished = core.buffer.take_unwritten();
            core.buffer.forget(&unpublished);
            // Given back if it is still this process's (a catch-up that failed, NATS back)
            // and its socket is known closed: anyone may take it at once. Refused when
            // another process has it already.
            if stopped {
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    feed.kv
                        .delete_expect_revision(&feed.lease_key, Some(revision)),
                )
                .await;
            }
            tracing::warn!(reason = %why, "lost the slack socket lease: socket closed; what was not published is left to the next holder's backfill");
            lease_status(core, |l| {
                l.held = false;
                l.lost += 1;
            });
            core.status().last_socket_error = Some(format!("lease lost: {why}"));
            Ended::Lost(why)
        }
    }
}

/// Writes the shared state (the holder's), best effort: a lost write only widens the next
/// holder's backfill.
async fn write_state(feed: &Feed, s: SharedState) {
    let bytes = serde_json::to_vec(&s).expect("the state serializes");
    if let Err(e) = feed.kv.put(&feed.state_key, bytes.into()).await {
        tracing::debug!(error = %e, "cannot write the slack shared state");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_of_this_host_whose_pid_is_gone_is_dead() {
        let me = identity();
        assert!(!dead_here(&me), "this process is alive");
        let (host, boot, ns) = (hostname(), boot_id(), pid_ns());
        assert!(!boot.is_empty() && !ns.is_empty(), "{me}");
        assert!(
            dead_here(&format!("{host}:{boot}:{ns}:4294967295:abc")),
            "no such pid"
        );
        assert!(
            !dead_here(&format!("{host}:{boot}:4026000000:4294967295:abc")),
            "another pid namespace (a container with the same host name) is never judged"
        );
        assert!(
            !dead_here(&format!("{host}:00000000:{ns}:4294967295:abc")),
            "another boot, or another machine with the same name, is never judged"
        );
        assert!(!dead_here("elsewhere.example:1:2:4294967295:abc"));
        assert!(!dead_here("garbage"));
        assert!(
            !dead_here(&format!("{host}:{boot}:{ns}:1:abc")),
            "pid 1 is alive"
        );
    }
}
