//! The ring tap: where a process's event-log rings send their events when it publishes them
//! (`--publish-events`). The publisher makes a [`Tap`] and puts it in the role's context
//! ([`crate::runtime::context::RoleContext::install_tap`]); a source that makes a ring takes the
//! context's tap, if any ([`crate::mcp::ring::EventRing::tapped`]). Nothing global: a ring
//! made without its context's tap is never published.

use std::sync::Arc;

use tokio::sync::mpsc::Sender;

use crate::runtime::metrics::Counter;

/// One event of a published ring, as it was pushed (`--publish-events`).
#[derive(Debug, Clone)]
pub struct Tapped {
    pub uri: Arc<str>,
    pub seq: u64,
    pub ts_ms: u64,
    /// The event as the ring holds it (`{"seq":…,"type":…,…}`).
    pub text: String,
}

/// The sending end of the publisher's bounded queue, and the count of events it had no room
/// for. Cheap to clone: every tapped ring keeps one.
#[derive(Debug, Clone)]
pub struct Tap {
    tx: Sender<Tapped>,
    dropped: Counter,
}

impl Tap {
    /// A tap sending to `tx`, counting what it drops in `dropped`.
    pub fn new(tx: Sender<Tapped>, dropped: Counter) -> Tap {
        Tap { tx, dropped }
    }

    /// Sends `event` without waiting: a full (or closed) queue drops it, counted.
    pub fn send(&self, event: Tapped) {
        if self.tx.try_send(event).is_err() {
            self.dropped.inc();
        }
    }

    /// Counts an event that was taken but could not be published.
    pub fn dropped(&self) {
        self.dropped.inc();
    }
}
