//! The sealed buffer: every `message_posted` event the role has seen, kept for the retention
//! time and at most [`MAX_EVENTS`], in memory for polls and in the store, sealed, for restarts.
//!
//! - **Sequence.** Each new event gets `seq = max(last + 1, now in µs)`, so seqs grow with the
//!   clock: a cursor handed out before a restart, or before the buffer was lost, still works
//!   (nothing older than it comes back, nothing newer is skipped). A backfilled event gets a
//!   fresh seq above every cursor already handed out, however old the message.
//! - **Dedupe** on `channel:ts`: a redelivery or a backfill of something held is dropped.
//! - **Eviction** by posting time (retention) and by count (oldest seq first). The highest
//!   evicted seq is kept, so a poll whose cursor is below it learns `truncated: true`.
//! - **Writes** are batched: [`Buffer::insert`] only marks rows dirty (and says so on
//!   [`Buffer::changes`]), and [`Buffer::flush`] (by the flusher, `flush.rs`, ~2 s after the
//!   first change it has not written, and at shutdown) seals them and writes them in one store
//!   transaction. The state row (`last_seq`, `evicted_through`, `live_through`) is sealed too.
//!   [`Buffer::next_expiry_ms`] says when the oldest event passes the retention, so expiry
//!   is a deadline, not a sweep.
//! - **On NATS** ([`Buffer::memory`], `herald slack --backend nats://…`) the buffer is only
//!   memory and the store is not touched: what is inserted here is taken by
//!   [`Buffer::take_unwritten`] and published to the workspace's stream (`shared`), and what the
//!   stream delivers is applied with its own seq by [`Buffer::insert_at`].

use crate::sync::Recover;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::filter::MessageFilter;
use super::message::Posted;
use super::seal::Sealer;
use super::settings::Key;
use crate::store::{Store, StoreError, Table};

/// Most events kept.
pub const MAX_EVENTS: usize = 20_000;
const STATE_ROW: &str = "state";

fn row_key(channel: &str, ts: &str) -> String {
    format!("m:{channel}:{ts}")
}

fn now_ms() -> u64 {
    crate::mcp::ring::now_ms()
}

pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[derive(Serialize, Deserialize)]
struct Row {
    seq: u64,
    data: Posted,
}

/// What processes sharing a feed on NATS share of the state row (in the lease bucket): the
/// backfill's floor and where the feed began. Never message text.
#[derive(Debug, Serialize, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
pub struct SharedState {
    #[serde(default)]
    pub first_seq: u64,
    #[serde(default)]
    pub born_ms: Option<u64>,
    #[serde(default)]
    pub live_through_ms: Option<u64>,
}

#[derive(Serialize, Deserialize, Default, Clone, Copy)]
struct State {
    last_seq: u64,
    evicted_through: u64,
    #[serde(default)]
    live_through_ms: Option<u64>,
    /// The first moment any socket was live: no backfill reads before it.
    #[serde(default)]
    born_ms: Option<u64>,
    /// The head when this buffer was made: a cursor below it comes from a buffer that was
    /// lost (or from before this one began), and learns `truncated: true`.
    #[serde(default)]
    first_seq: u64,
}

/// A row to write: its seq and payload (`None` in its place: delete the row).
type HeldRow = (u64, Arc<Posted>);

/// One held event: the payload, and its JSON written once.
#[derive(Debug, Clone)]
pub struct Held {
    pub seq: u64,
    pub posted: Arc<Posted>,
    pub json: Arc<str>,
}

/// A page of events after a cursor.
#[derive(Debug, Clone)]
pub struct Page {
    pub events: Vec<Held>,
    pub cursor: u64,
    pub truncated: bool,
    pub has_more: bool,
}

/// What the status tool shows of the buffer.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BufferStats {
    pub events: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_posted_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest_posted_ms: Option<u64>,
    pub evicted_through: u64,
    pub unwritten_rows: usize,
}

/// What a flush wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    pub rows: usize,
    pub deleted: usize,
}

/// What opening found in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    pub events: usize,
    /// Rows that did not open with this key (another key sealed them, or they were moved).
    pub unopenable: usize,
}

#[derive(Default)]
struct Inner {
    by_seq: BTreeMap<u64, Held>,
    by_key: HashMap<String, u64>,
    /// (posted ms, seq): the retention order.
    by_age: BTreeSet<(u64, u64)>,
    state: State,
    /// Row key → the seq to write (`None`: delete the row).
    dirty: HashMap<String, Option<u64>>,
    state_dirty: bool,
    /// Set by the final flush: nothing is taken after it (a later event is in Slack's history,
    /// and the next start's backfill reads it, since `live_through` did not pass it).
    closed: bool,
    /// On NATS: this process's own inserts, not published yet (seq → payload), and their
    /// `channel:ts` keys (until published and applied, or forgotten). Invisible to polls and
    /// reads: an event is visible once the stream delivers it, so no cursor passes the stream.
    pending: BTreeMap<u64, Arc<Posted>>,
    /// Taken to publish and not yet applied, restored or forgotten (seq → posted ms): counted
    /// by [`Buffer::take_shared`] as pending.
    inflight: BTreeMap<u64, u64>,
    pending_keys: HashMap<String, u64>,
    /// Highest seq handed to a pending row.
    pending_last: u64,
}

/// The buffer. See the module docs.
pub struct Buffer {
    inner: Mutex<Inner>,
    sealer: Sealer,
    /// `None` on NATS: nothing is kept locally.
    store: Option<Store>,
    retention: Duration,
    cap: usize,
    /// Marked whenever something is left to write (rows, the state row) or, on NATS, to
    /// publish or share (pending rows, the shared state): the flusher and the lease holder's
    /// state writer wait on it instead of looking on a tick.
    changes: tokio::sync::watch::Sender<()>,
}

impl Buffer {
    /// Opens the buffer kept in `store`, sealed under `key`.
    pub async fn open(
        store: Store,
        key: &Key,
        retention: Duration,
        cap: usize,
    ) -> Result<(Buffer, Loaded), StoreError> {
        let sealer = Sealer::new(&key.0);
        let rows = store.scan(Table::SlackBuffer).await?;
        let mut loaded = Loaded::default();
        let mut rows_max = 0;
        let mut found_state = false;
        let mut inner = Inner::default();
        for (k, sealed) in rows {
            let Ok(plain) = sealer.open(&k, &sealed) else {
                loaded.unopenable += 1;
                continue;
            };
            if k == STATE_ROW {
                if let Ok(s) = serde_json::from_slice::<State>(&plain) {
                    inner.state = s;
                    found_state = true;
                }
                continue;
            }
            let Ok(row) = serde_json::from_slice::<Row>(&plain) else {
                loaded.unopenable += 1;
                continue;
            };
            rows_max = rows_max.max(row.seq);
            inner.add(row.seq, Arc::new(row.data));
        }
        inner.state.last_seq = inner.state.last_seq.max(rows_max);
        if !found_state {
            // A new buffer (or one whose state row is gone): it starts at the clock, so a
            // cursor "from now" is this moment and any older one is from before it.
            inner.state.last_seq = inner.state.last_seq.max(now_us());
            inner.state.first_seq = inner.state.last_seq;
            inner.state_dirty = true;
        }
        // A lower cap than the buffer was kept with applies at once.
        while inner.by_seq.len() > cap.max(1) {
            let Some((&oldest, _)) = inner.by_seq.first_key_value() else {
                break;
            };
            inner.evict(oldest);
        }
        if loaded.unopenable > 0 {
            tracing::warn!(
                rows = loaded.unopenable,
                "buffer rows that do not open with this SLACK_EVENTS_ENCRYPTION_KEY are skipped (was the key changed?)"
            );
        }
        loaded.events = inner.by_seq.len();
        let buffer = Buffer {
            inner: Mutex::new(inner),
            sealer,
            store: Some(store),
            retention,
            cap: cap.max(1),
            changes: tokio::sync::watch::channel(()).0,
        };
        buffer.expire(now_ms());
        Ok((buffer, loaded))
    }

    /// A buffer kept only in memory, for a feed shared on NATS: it starts empty, and learns
    /// the rest from the stream and the shared state.
    pub fn memory(key: &Key, retention: Duration, cap: usize) -> Buffer {
        Buffer {
            // Nothing is known until the stream is applied: the head is the newest seq applied
            // (never this host's clock, which may run ahead of the holder's and would let a
            // cursor skip what is still to be applied).
            inner: Mutex::new(Inner::default()),
            sealer: Sealer::new(&key.0),
            store: None,
            retention,
            cap: cap.max(1),
            changes: tokio::sync::watch::channel(()).0,
        }
    }

    /// On NATS (kept in memory, published to a stream).
    pub fn is_shared(&self) -> bool {
        self.store.is_none()
    }

    /// What seals rows (and, on NATS, the stream's payloads).
    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// Adds `p` under `seq` as the shared stream delivered it (a process's own inserts come
    /// back this way too, and are held already); never marked for writing. `false` if it was
    /// held or is past the retention.
    pub fn insert_at(&self, seq: u64, p: Posted) -> bool {
        let mut inner = self.lock();
        let key = format!("{}:{}", p.channel_id, p.ts);
        // This process's own, published: no longer pending, whatever happens below.
        if let Some(s) = inner.pending_keys.remove(&key) {
            inner.pending.remove(&s);
            inner.inflight.remove(&s);
        }
        if p.posted_ms() + (self.retention.as_millis() as u64) < now_ms() {
            return false;
        }
        if inner.by_key.contains_key(&key) || inner.by_seq.contains_key(&seq) {
            return false;
        }
        inner.state.last_seq = inner.state.last_seq.max(seq);
        inner.add(seq, Arc::new(p));
        let mut evicted = false;
        while inner.by_seq.len() > self.cap {
            let Some((&oldest, _)) = inner.by_seq.first_key_value() else {
                break;
            };
            inner.evict(oldest);
            evicted = true;
        }
        // Evictions mark rows to delete: nothing is deleted on NATS (the stream evicts alone).
        inner.dirty.retain(|_, seq| seq.is_some());
        drop(inner);
        if evicted {
            self.changed();
        }
        true
    }

    /// Says on [`changes`](Self::changes) that something is left to write or share.
    fn changed(&self) {
        self.changes.send_replace(());
    }

    /// Marked each time something is left to write (stored rows, the state row) or, on NATS,
    /// to publish or share: wait on it with `changed()`, and `borrow_and_update()` just before
    /// taking what is to write.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changes.subscribe()
    }

    /// When (ms since the epoch) the oldest event held passes the retention, if any is held:
    /// [`expire`](Self::expire) has something to do from then on.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        let retention = self.retention.as_millis() as u64;
        self.lock()
            .by_age
            .first()
            .map(|&(posted, _)| posted.saturating_add(retention).saturating_add(1))
    }

    /// Takes the rows inserted here and not published yet, oldest seq first (NATS). They stay
    /// known (a backfill of them is still a duplicate) until applied from the stream,
    /// [`restore_unwritten`](Self::restore_unwritten) or [`forget`](Self::forget).
    pub fn take_unwritten(&self) -> Vec<Held> {
        let mut inner = self.lock();
        let pending = std::mem::take(&mut inner.pending);
        for (seq, posted) in &pending {
            inner.inflight.insert(*seq, posted.posted_ms());
        }
        pending
            .into_iter()
            .map(|(seq, posted)| {
                let json: Arc<str> = serde_json::to_string(&*posted)
                    .expect("a payload serializes")
                    .into();
                Held { seq, posted, json }
            })
            .collect()
    }

    /// Puts `rows` back to publish (a publish failed; the next try takes them), unless the
    /// stream delivered them meanwhile.
    pub fn restore_unwritten(&self, rows: &[Held]) {
        let mut inner = self.lock();
        for h in rows {
            let key = format!("{}:{}", h.posted.channel_id, h.posted.ts);
            if inner.pending_keys.get(&key) == Some(&h.seq) {
                inner.pending.insert(h.seq, h.posted.clone());
            }
            inner.inflight.remove(&h.seq);
        }
    }

    /// Forgets `rows` as if never seen: a process that lost its lease drops what it could not
    /// publish (the new holder's backfill reads it from Slack's history).
    pub fn forget(&self, rows: &[Held]) {
        let mut inner = self.lock();
        for h in rows {
            let key = format!("{}:{}", h.posted.channel_id, h.posted.ts);
            if inner.pending_keys.get(&key) == Some(&h.seq) {
                inner.pending_keys.remove(&key);
            }
            inner.pending.remove(&h.seq);
            inner.inflight.remove(&h.seq);
        }
    }

    /// Whether anything waits to be written (stored, or on NATS published).
    pub fn unwritten(&self) -> bool {
        let inner = self.lock();
        !inner.dirty.is_empty() || !inner.pending.is_empty() || !inner.inflight.is_empty()
    }

    /// Whether a [`flush`](Self::flush) has something to write to the store now (never on
    /// NATS).
    pub fn dirty(&self) -> bool {
        let inner = self.lock();
        self.store.is_some() && (!inner.dirty.is_empty() || inner.state_dirty)
    }

    /// Nothing before `seq` is held any more (the shared stream dropped it): a cursor below
    /// learns `truncated: true`.
    pub fn evicted_through(&self, seq: u64) {
        let mut inner = self.lock();
        inner.state.evicted_through = inner.state.evicted_through.max(seq);
    }

    /// The state processes share on NATS, and whether it changed since the last call.
    /// `live_through` is never said past an event not yet in the stream: if that event is
    /// never published, the next holder's backfill still reads it.
    pub fn take_shared(&self) -> (SharedState, bool) {
        let mut inner = self.lock();
        let changed = std::mem::replace(&mut inner.state_dirty, false);
        let oldest_pending = inner
            .pending
            .values()
            .map(|p| p.posted_ms())
            .chain(inner.inflight.values().copied())
            .min();
        let live_through_ms = match (inner.state.live_through_ms, oldest_pending) {
            (Some(l), Some(p)) => Some(l.min(p)),
            (l, _) => l,
        };
        (
            SharedState {
                first_seq: inner.state.first_seq,
                born_ms: inner.state.born_ms,
                live_through_ms,
            },
            changed || oldest_pending.is_some(),
        )
    }

    /// Takes in what another process wrote of the shared state: its start is the feed's
    /// (cursors from before it are truncated), and `live_through` only moves forward.
    pub fn merge_shared(&self, s: SharedState) {
        let mut inner = self.lock();
        if s.first_seq > 0 {
            inner.state.first_seq = s.first_seq;
            inner.state.last_seq = inner.state.last_seq.max(s.first_seq);
        }
        if inner.state.born_ms.is_none() {
            inner.state.born_ms = s.born_ms;
        }
        if let Some(l) = s.live_through_ms
            && inner.state.live_through_ms.is_none_or(|t| t < l)
        {
            inner.state.live_through_ms = Some(l);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Adds `p` unless its `channel:ts` is held or it is older than the retention; returns
    /// its seq.
    pub fn insert(&self, p: Posted) -> Option<u64> {
        let posted = p.posted_ms();
        if posted + (self.retention.as_millis() as u64) < now_ms() {
            return None;
        }
        let mut inner = self.lock();
        let key = format!("{}:{}", p.channel_id, p.ts);
        if inner.closed || inner.by_key.contains_key(&key) || inner.pending_keys.contains_key(&key)
        {
            return None;
        }
        if self.store.is_none() {
            // On NATS: pending until the stream delivers it (see `pending`).
            let seq = (inner.state.last_seq + 1)
                .max(inner.pending_last + 1)
                .max(now_us());
            inner.pending_last = seq;
            inner.pending_keys.insert(key, seq);
            inner.pending.insert(seq, Arc::new(p));
            drop(inner);
            self.changed();
            return Some(seq);
        }
        let seq = (inner.state.last_seq + 1).max(now_us());
        inner.state.last_seq = seq;
        inner.state_dirty = true;
        let row = row_key(&p.channel_id, &p.ts);
        inner.add(seq, Arc::new(p));
        inner.dirty.insert(row, Some(seq));
        while inner.by_seq.len() > self.cap {
            let Some((&oldest, _)) = inner.by_seq.first_key_value() else {
                break;
            };
            inner.evict(oldest);
        }
        drop(inner);
        self.changed();
        Some(seq)
    }

    /// Evicts what is past the retention at `now_ms`.
    pub fn expire(&self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(self.retention.as_millis() as u64);
        let mut inner = self.lock();
        let mut evicted = false;
        while let Some(&(posted, seq)) = inner.by_age.first() {
            if posted >= horizon {
                break;
            }
            inner.evict(seq);
            evicted = true;
        }
        drop(inner);
        if evicted {
            self.changed();
        }
    }

    /// How long a message is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Most events kept.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The event with `seq`, if held.
    pub fn get(&self, seq: u64) -> Option<Held> {
        self.lock().by_seq.get(&seq).cloned()
    }

    /// The newest seq handed out: the cursor meaning "from now".
    pub fn head(&self) -> u64 {
        self.lock().state.last_seq
    }

    /// Events after `cursor` that `filter` passes and that were posted at or after
    /// `not_before_ms`, at most `max`.
    pub fn since(
        &self,
        cursor: u64,
        filter: &MessageFilter,
        max: usize,
        not_before_ms: u64,
    ) -> Page {
        let max = max.max(1);
        let inner = self.lock();
        let mut truncated = inner.state.evicted_through > cursor || cursor < inner.state.first_seq;
        let mut events = Vec::new();
        let mut has_more = false;
        for held in inner
            .by_seq
            .range(cursor.saturating_add(1)..)
            .map(|(_, h)| h)
        {
            if !filter.matches(&held.posted) {
                continue;
            }
            if held.posted.posted_ms() < not_before_ms {
                truncated = true;
                continue;
            }
            if events.len() == max {
                has_more = true;
                break;
            }
            events.push(held.clone());
        }
        // A cursor above the head (from before the buffer was lost) stays where it is: the
        // seqs still to come are above it.
        let cursor = match (has_more, events.last()) {
            (true, Some(last)) => last.seq,
            _ => inner.state.last_seq.max(cursor),
        };
        Page {
            events,
            cursor,
            truncated,
            has_more,
        }
    }

    /// The newest `max` events `filter` passes, oldest first (a resource read).
    pub fn recent(&self, filter: &MessageFilter, max: usize) -> Vec<Held> {
        let inner = self.lock();
        let mut out: Vec<Held> = inner
            .by_seq
            .values()
            .rev()
            .filter(|h| filter.matches(&h.posted))
            .take(max)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Thread roots in `channel` the buffer has seen a reply under posted at or after
    /// `since_ms`, the most recently active first, at most `max`.
    pub fn threads(&self, channel: &str, since_ms: u64, max: usize) -> Vec<String> {
        let inner = self.lock();
        let mut latest: HashMap<&str, u64> = HashMap::new();
        for h in inner.by_seq.values() {
            let p = &h.posted;
            if p.channel_id != channel {
                continue;
            }
            if let Some(t) = &p.thread_ts
                && p.posted_ms() >= since_ms
            {
                let e = latest.entry(t.as_str()).or_default();
                *e = (*e).max(p.posted_ms());
            }
        }
        let mut by_activity: Vec<(u64, &str)> = latest.into_iter().map(|(t, ms)| (ms, t)).collect();
        by_activity.sort_unstable_by(|a, b| b.cmp(a));
        by_activity
            .into_iter()
            .take(max)
            .map(|(_, t)| t.to_owned())
            .collect()
    }

    /// The last moment the buffer is known to hold everything before (minus the backfill's
    /// margin); `None` before the first live socket.
    pub fn live_through(&self) -> Option<u64> {
        self.lock().state.live_through_ms
    }

    /// The first moment any socket was live (a first-ever boot backfills nothing before it).
    pub fn born(&self) -> Option<u64> {
        self.lock().state.born_ms
    }

    /// Moves `live_through` forward (never back); the first call also sets [`born`](Self::born).
    pub fn set_live_through(&self, ms: u64) {
        let mut inner = self.lock();
        if inner.state.born_ms.is_none() {
            inner.state.born_ms = Some(ms);
        }
        if inner.state.live_through_ms.is_none_or(|t| t < ms) {
            inner.state.live_through_ms = Some(ms);
            inner.state_dirty = true;
            drop(inner);
            self.changed();
        }
    }

    pub fn stats(&self) -> BufferStats {
        let inner = self.lock();
        BufferStats {
            events: inner.by_seq.len(),
            oldest_posted_ms: inner.by_age.first().map(|(ms, _)| *ms),
            newest_posted_ms: inner.by_age.last().map(|(ms, _)| *ms),
            evicted_through: inner.state.evicted_through,
            unwritten_rows: inner.dirty.len() + usize::from(inner.state_dirty),
        }
    }

    /// Takes nothing more, then flushes: the last write at shutdown.
    pub async fn close(&self) -> Result<Written, StoreError> {
        self.lock().closed = true;
        self.flush().await
    }

    /// Seals what changed since the last flush and writes it in one transaction. On failure
    /// the rows stay marked, for the next flush.
    pub async fn flush(&self) -> Result<Written, StoreError> {
        // Under the lock only what to write; serializing and sealing happen after, so a
        // large flush never holds up the socket reader or a poll.
        if self.store.is_none() {
            // On NATS the rows are published by `shared`, and the state goes to the bucket.
            return Ok(Written::default());
        }
        let (rows, state, dirty, state_dirty) = {
            let mut inner = self.lock();
            if inner.dirty.is_empty() && !inner.state_dirty {
                return Ok(Written::default());
            }
            let dirty = std::mem::take(&mut inner.dirty);
            let state_dirty = std::mem::replace(&mut inner.state_dirty, false);
            let rows: Vec<(String, Option<HeldRow>)> = dirty
                .iter()
                .map(|(row, seq)| {
                    let held = seq
                        .and_then(|s| inner.by_seq.get(&s))
                        .map(|h| (h.seq, h.posted.clone()));
                    (row.clone(), held)
                })
                .collect();
            (rows, state_dirty.then_some(inner.state), dirty, state_dirty)
        };
        let mut puts = Vec::with_capacity(rows.len() + 1);
        let mut deletes = Vec::new();
        for (row, held) in rows {
            match held {
                Some((seq, posted)) => {
                    let plain = serde_json::to_vec(&Row {
                        seq,
                        data: (*posted).clone(),
                    })
                    .expect("a row serializes");
                    let sealed = self.sealer.seal(&row, &plain);
                    puts.push((row, sealed));
                }
                None => deletes.push(row),
            }
        }
        if let Some(state) = state {
            let plain = serde_json::to_vec(&state).expect("the state serializes");
            puts.push((STATE_ROW.to_owned(), self.sealer.seal(STATE_ROW, &plain)));
        }
        let written = Written {
            rows: puts.len(),
            deleted: deletes.len(),
        };
        let Some(store) = &self.store else {
            return Ok(Written::default());
        };
        match store.write_batch(Table::SlackBuffer, puts, deletes).await {
            Ok(()) => Ok(written),
            Err(e) => {
                let mut inner = self.lock();
                for (row, seq) in dirty {
                    inner.dirty.entry(row).or_insert(seq);
                }
                inner.state_dirty |= state_dirty;
                Err(e)
            }
        }
    }
}

impl Inner {
    fn add(&mut self, seq: u64, posted: Arc<Posted>) {
        let json: Arc<str> = serde_json::to_string(&*posted)
            .expect("a payload serializes")
            .into();
        self.by_key
            .insert(format!("{}:{}", posted.channel_id, posted.ts), seq);
        self.by_age.insert((posted.posted_ms(), seq));
        self.by_seq.insert(seq, Held { seq, posted, json });
    }

    fn evict(&mut self, seq: u64) {
        let Some(h) = self.by_seq.remove(&seq) else {
            return;
        };
        let p = &h.posted;
        self.by_key.remove(&format!("{}:{}", p.channel_id, p.ts));
        self.by_age.remove(&(p.posted_ms(), seq));
        self.dirty.insert(row_key(&p.channel_id, &p.ts), None);
        self.state.evicted_through = self.state.evicted_through.max(seq);
        self.state_dirty = true;
    }
}

#[cfg(test)]
#[path = "buffer_tests.rs"]
pub(super) mod tests;
