//! Memo notes in a NATS JetStream key-value bucket (`--backend nats://HOST:PORT[,…]`), so
//! several hosts read and write one set of notes and each host's listeners hear every host's
//! changes.
//!
//! - **One path for every change.** A write is a KV put or delete; the bucket's watch (from
//!   every host) is what applies it to memory, the size total, `memo://log` and the
//!   notification, in the bucket's order. A write returns once this host's watch has applied
//!   its revision, so a read after `memo_set` sees it, as with the store.
//! - **Start.** The watch begins at the bucket's oldest revision it still keeps (16 per key),
//!   so the notes are rebuilt by applying the history in order, and `memo://log` holds that
//!   history (the newest `--ring-capacity` changes; a key whose older revisions the bucket
//!   dropped first shows as ADDED). [`Notes::open`] returns when it is through: the entry at
//!   the bucket's last revision (taken before the watch) has come, or the pending count is
//!   zero.
//! - **Connection.** async-nats reconnects by itself; the watch is an ordered consumer that
//!   resumes where it was. A watch that ends is opened again from the last revision applied.
//!   Nothing of the notes is kept locally.
//! - **A bucket NATS lost** (its storage wiped) is made again by the first write that finds it
//!   gone, which puts this host's notes back into it (each only if no host put it first), with
//!   a warning and `herald_nats_streams_remade_total`; every host's watch, on finding the
//!   bucket made anew, follows it from its start (what it already holds changes nothing).
//!   A watch looks when NATS tells it to ([`crate::nats::lookout`]: a reconnect, the bucket
//!   made), never on a clock.

use crate::sync::RecoverRw;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde_json::Value;

use crate::mcp::source::SourceError;
use crate::runtime::context::RoleContext;
use crate::source::memo::{State, stored_len};

/// A note's key in the bucket: base64url of the key, since NATS keys take only
/// `[-/_=.a-zA-Z0-9]` and memo keys are any string.
fn encode(key: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

/// A note's key from the bucket's; `None` for one herald did not write.
fn decode(key: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(key)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// The bucket when none is named.
pub const DEFAULT_BUCKET: &str = "herald_memo";
/// How long a write waits for the bucket's answer, and then for the watch to apply it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the first connect and the baseline may take.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Revisions kept per key (KV history).
const HISTORY: i64 = 16;

pub use crate::nats::NatsConfig;

/// The bucket, and how far this host's watch has applied it.
pub struct Notes {
    kv: kv::Store,
    js: async_nats::jetstream::Context,
    bucket: String,
    /// The bucket's stream (`KV_<bucket>`).
    stream: String,
    state: Arc<State>,
    remade: crate::runtime::metrics::Counter,
    applied: tokio::sync::watch::Receiver<u64>,
    /// Tells this host's watch that this host made the bucket anew; `heard` counts the times
    /// the watch took such news in.
    anew: Arc<tokio::sync::Notify>,
    heard: tokio::sync::watch::Receiver<u64>,
    servers: String,
    /// This host's writes, one at a time through put and apply: the size check of the next
    /// sees the total with the last one in it.
    pub(super) serial: tokio::sync::Mutex<()>,
}

impl Notes {
    /// Connects, opens (or makes) the bucket, loads it and follows it on `ctx`.
    pub async fn open(
        cfg: &NatsConfig,
        state: Arc<State>,
        ctx: &RoleContext,
    ) -> Result<Notes, String> {
        let servers = cfg.redacted();
        let conn = tokio::time::timeout(START_TIMEOUT, cfg.connect(ctx.metrics()))
            .await
            .map_err(|_| {
                format!(
                    "no NATS server answered at {servers} within {} s",
                    START_TIMEOUT.as_secs()
                )
            })??;
        let client = conn.client.clone();
        let js = async_nats::jetstream::new(client.clone());
        let stream = format!("KV_{}", cfg.bucket);
        // Watching for the bucket made anew from before it is opened.
        let mut lookout = crate::nats::lookout::Lookout::new(&conn, &stream);
        lookout.looking().await;
        let kv =
            crate::nats::bucket(&js, &cfg.bucket, "herald memo notes", HISTORY, &servers).await?;
        // The first pass ends with the entry at the bucket's last revision now (each key's
        // last entry comes, and the newest is some key's last); a bucket with no messages
        // (new, or compacted) has none to wait for.
        let opened = js
            .get_stream(&stream)
            .await
            .map_err(|e| format!("cannot read the bucket {} at {servers}: {e}", cfg.bucket))?
            .cached_info()
            .clone();
        let info = opened.state.clone();
        let last = info.last_sequence;
        let empty = info.messages == 0;
        tracing::debug!(bucket = %cfg.bucket, last, "NATS bucket opened");
        // Every revision kept, oldest first: the notes and memo://log from the history.
        let watch = kv
            .watch_all_from_revision(1)
            .await
            .map_err(|e| format!("cannot watch the bucket {} at {servers}: {e}", cfg.bucket))?;
        let (applied_tx, applied) = tokio::sync::watch::channel(0u64);
        let anew = Arc::new(tokio::sync::Notify::new());
        let (heard_tx, heard) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let follower = Follower {
            kv: kv.clone(),
            js: js.clone(),
            stream: stream.clone(),
            created: opened.created.unix_timestamp_nanos(),
            state: state.clone(),
            applied: applied_tx,
            anew: anew.clone(),
            heard: heard_tx,
            lookout,
            ready: Some(ready_tx),
            baseline: !empty,
            baseline_until: last,
        };
        // Ended if the open fails from here on (or is dropped: `herald up` tries again later).
        let stop = tokio_util::sync::CancellationToken::new();
        let opened = stop.clone().drop_guard();
        ctx.spawn_until_shutdown("memo nats watch", async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = follower.run(watch) => {}
            }
        });
        if !empty {
            tokio::time::timeout(START_TIMEOUT, ready_rx)
                .await
                .map_err(|_| {
                    format!(
                        "the bucket {} at {servers} did not load within {} s",
                        cfg.bucket,
                        START_TIMEOUT.as_secs()
                    )
                })?
                .map_err(|_| {
                    format!("the watch of the bucket {} ended while loading", cfg.bucket)
                })?;
        }
        opened.disarm();
        // On the status board only once open: a try that failed leaves nothing behind.
        crate::nats::enter(ctx, "memo", cfg, client);
        Ok(Notes {
            kv,
            js,
            anew,
            heard,
            bucket: cfg.bucket.clone(),
            stream,
            state,
            remade: crate::nats::NatsMetrics::register(ctx.metrics()).remade,
            applied,
            servers,
            serial: tokio::sync::Mutex::new(()),
        })
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> SourceError {
        SourceError::Unavailable(format!(
            "the NATS bucket at {} did not confirm the {what} ({e}); it may or may not have been written: read the notes, then try again",
            self.servers
        ))
    }

    /// Makes the bucket again when NATS lost it, and puts this host's notes back into it
    /// (each only if no host put it first): `true` when it was gone and is there again.
    async fn remake(&self) -> bool {
        if !crate::nats::stream_gone(&self.js, &self.stream).await {
            return false;
        }
        let Ok(kv) = crate::nats::bucket(
            &self.js,
            &self.bucket,
            "herald memo notes",
            HISTORY,
            &self.servers,
        )
        .await
        else {
            return false;
        };
        self.remade.inc();
        // This host's watch follows the new bucket from its start: a write's revision is
        // waited for there, not taken as applied by the old count.
        let mut heard = self.heard.clone();
        let before = *heard.borrow_and_update();
        self.anew.notify_one();
        let _ = tokio::time::timeout(WRITE_TIMEOUT, heard.wait_for(|&h| h > before)).await;
        let notes: Vec<(String, Value)> = self
            .state
            .notes
            .read_locked()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        tracing::warn!(bucket = %self.bucket, notes = notes.len(), "the memo bucket was gone (NATS lost its data); made it again and put this host's notes back");
        // Each only where the key has no entry at all (a delete marker of another host's
        // included: `update` at revision 0), within one write's time.
        let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
            for (k, v) in notes {
                let bytes = serde_json::to_vec(&v).expect("a note serializes");
                let _ = kv.update(encode(&k), bytes.into(), 0).await;
            }
        })
        .await;
        true
    }

    /// A write answered with `revision` at or below what this host had applied before it
    /// was sent went to a bucket made anew by another host: this host's watch is told, and
    /// follows the new one before the write is waited for.
    async fn check_revision(&self, before: u64, revision: u64) {
        if revision <= before && before > 0 {
            let mut heard = self.heard.clone();
            let seen = *heard.borrow_and_update();
            self.anew.notify_one();
            let _ = tokio::time::timeout(WRITE_TIMEOUT, heard.wait_for(|&h| h > seen)).await;
        }
    }

    /// Puts `key`; its revision.
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<u64, SourceError> {
        let before = *self.applied.borrow();
        let r = self.put_once(key, bytes).await?;
        self.check_revision(before, r).await;
        Ok(r)
    }

    async fn put_once(&self, key: &str, bytes: Vec<u8>) -> Result<u64, SourceError> {
        let put = || {
            tokio::time::timeout(
                WRITE_TIMEOUT,
                self.kv.put(encode(key), bytes.clone().into()),
            )
        };
        match put().await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) if self.remake().await => {
                tracing::debug!(error = %e, "writing again into the bucket made anew");
                put()
                    .await
                    .map_err(|_| self.failed("write", "no answer in time"))?
                    .map_err(|e| self.failed("write", e))
            }
            Ok(Err(e)) => Err(self.failed("write", e)),
            Err(_) => Err(self.failed("write", "no answer in time")),
        }
    }

    /// Deletes `key`; a revision at or past its delete marker.
    pub async fn delete(&self, key: &str) -> Result<u64, SourceError> {
        let before = *self.applied.borrow();
        let r = self.delete_once(key).await?;
        self.check_revision(before, r).await;
        Ok(r)
    }

    async fn delete_once(&self, key: &str) -> Result<u64, SourceError> {
        let delete = || tokio::time::timeout(WRITE_TIMEOUT, self.kv.delete(encode(key)));
        match delete().await {
            Ok(Ok(())) => {}
            Ok(Err(_)) if self.remake().await => delete()
                .await
                .map_err(|_| self.failed("delete", "no answer in time"))?
                .map_err(|e| self.failed("delete", e))?,
            Ok(Err(e)) => return Err(self.failed("delete", e)),
            Err(_) => return Err(self.failed("delete", "no answer in time")),
        }
        // The delete marker is at or below the stream's last sequence now (asked of the
        // server: the kv handle's own status is what it was at open).
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| self.failed("delete", e))?;
        Ok(stream.cached_info().state.last_sequence)
    }

    /// Waits until the watch has applied `revision` (so a read sees the write).
    pub async fn applied(&self, revision: u64) -> Result<(), SourceError> {
        let mut rx = self.applied.clone();
        tokio::time::timeout(WRITE_TIMEOUT, rx.wait_for(|&r| r >= revision))
            .await
            .map_err(|_| {
                SourceError::Unavailable(format!(
                    "the write reached NATS at {} (revision {revision}) but its change did not come back within {} s; it will be applied when it does",
                    self.servers,
                    WRITE_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|_| SourceError::Unavailable("the NATS watch stopped".into()))?;
        Ok(())
    }
}

/// The task applying the bucket's changes.
struct Follower {
    kv: kv::Store,
    js: async_nats::jetstream::Context,
    stream: String,
    /// When the bucket's stream followed was made (another time: made anew).
    created: i128,
    state: Arc<State>,
    applied: tokio::sync::watch::Sender<u64>,
    /// This host made the bucket anew (`heard` counts the times that was taken in).
    anew: Arc<tokio::sync::Notify>,
    heard: tokio::sync::watch::Sender<u64>,
    /// When to check whether the bucket was made anew (a reconnect, the bucket's stream
    /// made, a check that did not find it): an ordered watch would go on past what a new
    /// bucket holds.
    lookout: crate::nats::lookout::Lookout,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
    /// Still replaying the history kept at the start.
    baseline: bool,
    /// The revision that ends the first pass.
    baseline_until: u64,
}

impl Follower {
    async fn run(mut self, mut watch: kv::Watch) {
        loop {
            let next = tokio::select! {
                next = watch.next() => next,
                _ = self.anew.notified() => {
                    if self.made_anew().await {
                        self.rewatch(&mut watch).await;
                    }
                    self.heard.send_modify(|h| *h += 1);
                    continue;
                }
                () = self.lookout.due() => {
                    if self.made_anew().await {
                        self.rewatch(&mut watch).await;
                    }
                    continue;
                }
            };
            match next {
                Some(Ok(entry)) => self.apply(entry).await,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "NATS bucket watch");
                    if self.made_anew().await {
                        self.rewatch(&mut watch).await;
                    }
                }
                None => {
                    // Open it again from the next revision (from its start if made anew).
                    self.made_anew().await;
                    let from = *self.applied.borrow() + 1;
                    match self.kv.watch_all_from_revision(from).await {
                        Ok(w) => watch = w,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot watch the NATS bucket again; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        }
    }

    async fn apply(&mut self, entry: kv::Entry) {
        let skip = |why: &str| tracing::warn!(key = %entry.key, "{why}; skipping it");
        let value: Option<Value> = match entry.operation {
            kv::Operation::Put => match serde_json::from_slice(&entry.value) {
                Ok(v) => Some(v),
                Err(_) => {
                    skip("a note in the bucket is not JSON");
                    self.done(&entry);
                    return;
                }
            },
            kv::Operation::Delete | kv::Operation::Purge => None,
        };
        let Some(key) = decode(&entry.key) else {
            skip("a key in the bucket is not one herald wrote");
            self.done(&entry);
            return;
        };
        {
            let mut total = self.state.writes.lock().await;
            let old = self.state.notes.read_locked().get(&key).cloned();
            let old_size = old.as_ref().map_or(0, |o| key.len() + stored_len(o));
            let new_size = value.as_ref().map_or(0, |v| key.len() + stored_len(v));
            *total = *total - old_size + new_size;
            if old != value {
                self.state.applied(&key, value, old);
            }
        }
        self.done(&entry);
    }

    /// Follows the bucket made anew from its start.
    async fn rewatch(&mut self, watch: &mut kv::Watch) {
        match self.kv.watch_all_from_revision(1).await {
            Ok(w) => *watch = w,
            Err(e) => tracing::warn!(error = %e, "cannot watch the bucket made anew yet"),
        }
    }

    /// Whether the bucket is another than the one followed (NATS lost it and it was made
    /// again): then it is followed from its start (`applied` back to 0). A look that did not
    /// find the bucket (NATS away, or the bucket gone, which the next write makes again) is
    /// made again after a pause, and when the lookout says.
    async fn made_anew(&mut self) -> bool {
        self.lookout.looking().await;
        let s = match self.js.get_stream(&self.stream).await {
            Ok(s) => s,
            Err(_) => {
                self.lookout.found(false);
                return false;
            }
        };
        self.lookout.found(true);
        let created = s.cached_info().created.unix_timestamp_nanos();
        if created == self.created {
            return false;
        }
        self.created = created;
        tracing::warn!(stream = %self.stream, "the memo bucket was made anew (NATS lost its data); following it from its start");
        self.applied.send_replace(0);
        true
    }

    /// Marks `entry` applied (and the baseline done when it ends the first pass).
    fn done(&mut self, entry: &kv::Entry) {
        self.applied.send_modify(|r| *r = (*r).max(entry.revision));
        if self.baseline && (entry.delta == 0 || entry.revision >= self.baseline_until) {
            self.baseline = false;
            if let Some(r) = self.ready.take() {
                let _ = r.send(());
            }
        }
    }
}
