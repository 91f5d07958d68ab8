//! `resources/subscribe` and `resources/unsubscribe` for clients of the `initialize` era
//! (protocol 2025-11-25 and older), which have no `subscriptions/listen`.
//!
//! Such a client trusts the `resources.subscribe` capability the handshake advertises, so it
//! is served: each subscribed URI is admitted exactly as a one-URI listen would be
//! ([`SourceServer::admit`](crate::mcp::server::SourceServer::admit): what the caller may
//! watch, the source's watch started or joined, the hub registration made before the answer)
//! and delivered by the same loop ([`crate::mcp::listen::run`]) as
//! `notifications/resources/updated` on the session, with no `subscriptionId` (stdio: the
//! connection; HTTP: the session's GET stream). A session keeps its subscriptions in one
//! [`LegacySubscriptions`], made per session ([`SourceServer::for_session`]), and dropping
//! it (the session ended) ends them all.
//!
//! [`SourceServer::for_session`]: crate::mcp::server::SourceServer::for_session

use std::collections::HashMap;
use std::sync::Mutex;

use rmcp::model::{DetailedTask, ResourceUpdatedNotificationParam};
use rmcp::service::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::mcp::admission::ConnStreams;
use crate::mcp::listen::{ListenOut, Undelivered};

/// One session's legacy subscriptions: URI → the cancel of its delivery (claimed before the
/// URI is admitted, so a subscribe and an unsubscribe racing on one URI end as the last one
/// said).
#[derive(Default)]
pub struct LegacySubscriptions {
    subs: Mutex<HashMap<String, CancellationToken>>,
    /// The listen-stream budget of the session's connection (byte streams), which its
    /// subscriptions share with its listens.
    pub(crate) conn: ConnStreams,
}

impl LegacySubscriptions {
    pub(crate) fn on(conn: ConnStreams) -> LegacySubscriptions {
        LegacySubscriptions {
            subs: Mutex::default(),
            conn,
        }
    }

    /// Claims `uri` for a new subscription: its cancel, or `None` when `uri` is subscribed
    /// (or being subscribed) already.
    pub(crate) fn claim(&self, uri: &str) -> Option<CancellationToken> {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|_, c| !c.is_cancelled());
        if subs.contains_key(uri) {
            return None;
        }
        let cancel = CancellationToken::new();
        subs.insert(uri.to_owned(), cancel.clone());
        Some(cancel)
    }

    /// Gives up a claim whose admission failed.
    pub(crate) fn release(&self, cancel: &CancellationToken) {
        cancel.cancel();
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|_, c| !c.is_cancelled());
    }

    /// Ends `uri`'s subscription (or the one being made); whether there was one.
    pub(crate) fn remove(&self, uri: &str) -> bool {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        match subs.remove(uri) {
            Some(c) => {
                c.cancel();
                true
            }
            None => false,
        }
    }
}

impl Drop for LegacySubscriptions {
    fn drop(&mut self) {
        let subs = self.subs.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, c) in subs.drain() {
            c.cancel();
        }
    }
}

/// A legacy subscription's delivery: `notifications/resources/updated` to the session's peer.
pub(crate) struct LegacyOut {
    pub(crate) peer: Peer<RoleServer>,
    pub(crate) cancel: CancellationToken,
}

impl ListenOut for LegacyOut {
    async fn updated(&mut self, uri: &str) -> Result<(), Undelivered> {
        self.peer
            .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri.to_owned()))
            .await
            .map_err(|e| {
                if self.peer.is_transport_closed() {
                    Undelivered::Closed
                } else {
                    Undelivered::Failed(e.to_string())
                }
            })
    }

    /// A legacy subscription names no tasks; nothing to write.
    async fn task(&mut self, _task: DetailedTask) -> Result<(), Undelivered> {
        Ok(())
    }

    fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.cancel.clone().cancelled_owned()
    }

    fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }
}
