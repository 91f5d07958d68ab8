//! `resources/subscribe` and `resources/unsubscribe` for clients of the `initialize` era
//! (protocol 2025-11-25 and older), which have no `subscriptions/listen`.
//!
//! Such a client trusts the `resources.subscribe` capability the handshake advertises, so it
//! is served: each subscribed URI is admitted exactly as a one-URI listen would be
//! (the admission [`SourceServer::open`](crate::mcp::server::SourceServer::open) runs: what the caller may
//! watch, the source's watch started or joined, the hub registration made before the answer)
//! and delivered by the same loop ([`crate::mcp::listen::run`]) as
//! `notifications/resources/updated` on the session, with no `subscriptionId` (stdio: the
//! connection; HTTP: the session's GET stream). A session keeps its subscriptions in one
//! [`LegacySubscriptions`], made per session ([`SourceServer::for_session`]), and dropping
//! it (the session ended) ends them all.
//!
//! [`SourceServer::for_session`]: crate::mcp::server::SourceServer::for_session

use crate::sync::Recover;
use std::collections::HashMap;
use std::sync::Mutex;

use rmcp::model::{DetailedTask, ResourceUpdatedNotificationParam};
use rmcp::service::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::mcp::admission::ConnStreams;
use crate::mcp::listen::{ListenOut, Undelivered};

/// One session's legacy subscriptions, by URI (claimed before the URI is admitted, so a
/// subscribe and an unsubscribe racing on one URI end as the last one said).
#[derive(Default)]
pub struct LegacySubscriptions {
    subs: Mutex<HashMap<String, Claim>>,
    /// The listen-stream budget of the session's connection (byte streams), which its
    /// subscriptions share with its listens.
    pub(crate) conn: ConnStreams,
}

/// One URI's subscription, being made or delivering.
struct Claim {
    /// Ends it.
    cancel: CancellationToken,
    /// Cancelled once it has ended and given back its stream slot (its holder dropped the
    /// [`Claimed::done`] guard).
    done: CancellationToken,
}

/// What [`LegacySubscriptions::claim`] hands the subscribe: the cancel to watch, and the
/// guard to drop once everything the subscription held is gone.
pub(crate) struct Claimed {
    pub(crate) cancel: CancellationToken,
    pub(crate) done: tokio_util::sync::DropGuard,
}

/// How long an unsubscribe waits for its delivery to end (it ends at once unless a write to
/// the session is stuck).
const UNSUBSCRIBE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl LegacySubscriptions {
    pub(crate) fn on(conn: ConnStreams) -> LegacySubscriptions {
        LegacySubscriptions {
            subs: Mutex::default(),
            conn,
        }
    }

    /// Claims `uri` for a new subscription, or `None` when `uri` is subscribed (or being
    /// subscribed) already.
    pub(crate) fn claim(&self, uri: &str) -> Option<Claimed> {
        let mut subs = self.subs.locked();
        subs.retain(|_, c| !c.cancel.is_cancelled());
        if subs.contains_key(uri) {
            return None;
        }
        let (cancel, done) = (CancellationToken::new(), CancellationToken::new());
        subs.insert(
            uri.to_owned(),
            Claim {
                cancel: cancel.clone(),
                done: done.clone(),
            },
        );
        Some(Claimed {
            cancel,
            done: done.drop_guard(),
        })
    }

    /// Ends `uri`'s subscription (or the one being made) and waits until it has ended, so
    /// nothing is delivered for it after the unsubscribe's answer and its stream slot is
    /// free again.
    pub(crate) async fn remove(&self, uri: &str) {
        let claim = self.subs.locked().remove(uri);
        if let Some(claim) = claim {
            claim.cancel.cancel();
            let _ = tokio::time::timeout(UNSUBSCRIBE_WAIT, claim.done.cancelled()).await;
        }
    }
}

impl Drop for LegacySubscriptions {
    fn drop(&mut self) {
        let subs = self.subs.locked_mut();
        for (_, c) in subs.drain() {
            c.cancel.cancel();
        }
    }
}

/// A legacy subscription's delivery: `notifications/resources/updated` to the session's peer.
pub(crate) struct LegacyOut {
    pub(crate) peer: Peer<RoleServer>,
    pub(crate) cancel: CancellationToken,
}

impl ListenOut for LegacyOut {
    async fn updated(
        &mut self,
        uri: &str,
        _carried: Option<serde_json::Value>,
    ) -> Result<(), Undelivered> {
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

    /// A legacy subscription is one URI's: it accepts no list.
    async fn list_changed(&mut self, list: crate::mcp::lists::List) -> Result<(), Undelivered> {
        Err(Undelivered::NotAccepted(list.method().into()))
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
