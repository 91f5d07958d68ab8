//! Applying the shared stream: the [`Follower`] (reading it with [`Follow`], which makes its
//! consumer again after what was applied when it fails or ends) applies each event into this
//! process's buffer under the seq sealed with it and skips holders' fence markers;
//! [`follow_state`] takes in the shared state row the holder writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_nats::jetstream;

use super::{Feed, MARKER_HEADER, Sealed, lease_status};
use crate::nats::ordered::Follow;
use crate::source::slack::buffer::SharedState;
use crate::source::slack::core::Core;
use crate::source::slack::message::Posted;

/// Applies the stream to this process's buffer, in order.
pub(super) struct Follower {
    pub(super) core: Arc<Core>,
    pub(super) applied: tokio::sync::watch::Sender<u64>,
    /// The next event is the first this process sees.
    pub(super) first: bool,
    /// Whether the very first message (of any kind) was past sequence 1: the stream dropped
    /// what came before.
    pub(super) started_late: Option<bool>,
    /// The newest event seq read from the stream (or held at start).
    pub(super) seen: u64,
    /// The newest event seq known in the stream, shared with the publisher (its `prev`).
    pub(super) through: Arc<AtomicU64>,
}

impl Follower {
    /// Applies what `follow` delivers until shutdown.
    pub(super) async fn run(mut self, mut follow: Follow) {
        while let Some(d) = follow.next().await {
            self.apply(d.message, d.sequence);
        }
    }

    fn apply(&mut self, m: jetstream::Message, sequence: u64) {
        let late = *self.started_late.get_or_insert(sequence > 1);
        // The stream's own order (a lower sequence is a stream made again after NATS lost
        // it: applied from its start).
        if is_marker(&m) {
            self.applied.send_replace(sequence);
            return;
        }
        match decode(&self.core, &m) {
            Some((seq, prev, posted)) => {
                let first = std::mem::replace(&mut self.first, false);
                if first && late {
                    // What came before it was dropped by the stream's limits.
                    self.core.buffer.evicted_through(seq.saturating_sub(1));
                } else if prev > self.seen && self.core.buffer.get(prev).is_none() {
                    // Its publisher knew of an event this process never read: lost with a
                    // stream NATS lost. Readers from before it are told `truncated`.
                    tracing::warn!(
                        after = self.seen,
                        through = prev,
                        "slack events published before NATS lost its data never reached this process; its readers from before them see truncated"
                    );
                    self.core.buffer.evicted_through(prev);
                }
                self.seen = self.seen.max(seq);
                self.through.fetch_max(seq, Ordering::Relaxed);
                self.core.apply(seq, posted);
            }
            None => tracing::warn!(
                sequence,
                "a message in the slack stream does not open with this SLACK_EVENTS_ENCRYPTION_KEY (was the key changed?); skipping it"
            ),
        }
        self.applied.send_replace(sequence);
        lease_status(&self.core, |l| l.applied_sequence = sequence);
    }
}

/// An event from a stream message: its seq, its publisher's `prev` and its payload.
fn decode(core: &Core, m: &async_nats::Message) -> Option<(u64, u64, Posted)> {
    let headers = m.headers.as_ref()?;
    let id = headers.get(async_nats::header::NATS_MESSAGE_ID)?.as_str();
    let plain = core.buffer.sealer().open(id, &m.payload).ok()?;
    let sealed: Sealed = serde_json::from_slice(&plain).ok()?;
    Some((sealed.seq, sealed.prev, sealed.data))
}

/// A holder's fence message (see [`hold`]).
fn is_marker(m: &async_nats::Message) -> bool {
    m.headers
        .as_ref()
        .is_some_and(|h| h.get(MARKER_HEADER).is_some())
}

/// Takes in the shared state the holder writes (a standby's status, and its backfill floor
/// when it takes over), looked at again when NATS says ([`crate::nats::lookout::follow_key`]).
pub(super) async fn follow_state(core: Arc<Core>, feed: Arc<Feed>, conn: crate::nats::Connection) {
    crate::nats::lookout::follow_key(&conn, &feed.kv, &feed.state_key, |value| {
        if let Ok(s) = serde_json::from_slice::<SharedState>(value) {
            core.buffer.merge_shared(s);
        }
    })
    .await
}
