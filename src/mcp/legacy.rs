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

use rmcp::model::{DetailedTask, ErrorData as McpError, ResourceUpdatedNotificationParam};
use rmcp::service::{Peer, RoleServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::mcp::admission::ConnStreams;
use crate::mcp::listen::{ListenOut, Undelivered};

/// One session's legacy subscriptions: URI → the cancel of its delivery task.
#[derive(Default)]
pub struct LegacySubscriptions {
    subs: Mutex<HashMap<String, Subscription>>,
    /// The session's subscriptions, counted against `--max-listen-uris` (one legacy session
    /// may watch as many URIs as one listen stream).
    pub(crate) count: ConnStreams,
}

struct Subscription {
    cancel: CancellationToken,
}

impl LegacySubscriptions {
    /// Whether `uri` is subscribed and its delivery still running.
    pub(crate) fn is_live(&self, uri: &str) -> bool {
        let subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.get(uri).is_some_and(|s| !s.cancel.is_cancelled())
    }

    /// Records `uri`'s subscription, ending one it replaces.
    pub(crate) fn insert(&self, uri: String, cancel: CancellationToken) {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|_, s| !s.cancel.is_cancelled());
        if let Some(old) = subs.insert(uri, Subscription { cancel }) {
            old.cancel.cancel();
        }
    }

    /// Ends `uri`'s subscription; whether there was one.
    pub(crate) fn remove(&self, uri: &str) -> bool {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        match subs.remove(uri) {
            Some(s) => {
                s.cancel.cancel();
                true
            }
            None => false,
        }
    }
}

impl Drop for LegacySubscriptions {
    fn drop(&mut self) {
        let subs = self.subs.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, s) in subs.drain() {
            s.cancel.cancel();
        }
    }
}

/// The subscription limit's error, worded for `resources/subscribe`.
pub(crate) fn too_many(limit: usize) -> McpError {
    McpError::invalid_request(
        format!(
            "this session already has {limit} resource subscriptions, the most allowed (--max-listen-uris); unsubscribe one first"
        ),
        Some(json!({"limit": limit})),
    )
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
