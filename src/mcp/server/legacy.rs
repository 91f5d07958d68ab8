//! `resources/subscribe` for an `initialize`-era session (see [`crate::mcp::legacy`]): the
//! URI admitted as a one-URI listen and delivered to the session's peer by the same loop as a
//! listen, with no stall deadline.

use std::time::Duration;

use rmcp::model::ErrorData as McpError;
use rmcp::service::{RequestContext, RoleServer};
use serde_json::json;
use tracing::{Instrument as _, info};

use super::listens::deliver_on;
use super::{SourceServer, to_mcp_error};
use crate::mcp::admission::{ConnStreams, ListenFilter};
use crate::mcp::caller::Caller;
use crate::mcp::error::SourceError;
use crate::mcp::legacy::{Claimed, LegacyOut};

impl SourceServer {
    /// `resources/subscribe` from a legacy session (see [`crate::mcp::legacy`]): `uri` is
    /// admitted as a one-URI listen against the session's subscription count, and its
    /// changes go to the session's peer until it is unsubscribed, the session ends, the peer
    /// stalls or the server shuts down. Subscribing again to a subscribed URI changes nothing.
    pub(super) async fn legacy_subscribe(
        &self,
        uri: String,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // Claimed before admission, under the lock: a second subscribe to the URI answers at
        // once, and an unsubscribe meanwhile cancels this one (checked after admission).
        // `done` is declared first so it goes last: whatever the subscription held (its
        // admission, its stream slot) is gone when an unsubscribe waiting on it returns.
        let Some(Claimed { cancel, done }) = self.legacy.claim(&uri) else {
            return Ok(());
        };
        let caller = Caller::of(&context);
        let filter = ListenFilter {
            resources: Some(vec![uri.clone()]),
            ..ListenFilter::default()
        };
        // A subscription costs what a listen stream costs, from the same budget: the
        // connection's (stdio, QUIC), or on HTTP the peer address's (a proxy's own: legacy
        // subscriptions and events/stream are not budgeted per caller).
        let conn = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<ConnStreams>())
            .unwrap_or(&self.legacy.conn)
            .clone();
        let admitted = tokio::select! {
            _ = context.ct.cancelled() => Err(McpError::invalid_request(
                "the subscribe was cancelled before its answer",
                None,
            )),
            _ = cancel.cancelled() => {
                // Unsubscribed while admitting: what the client asked last stands.
                return Ok(());
            }
            a = self.admit(&caller, &filter, &conn) => a,
        };
        let listen = match admitted {
            Ok(l) => l,
            Err(e) => {
                cancel.cancel();
                return Err(e);
            }
        };
        if listen.uris().is_empty() {
            cancel.cancel();
            // What a listen's ack would leave out, answered as the source's error for the
            // URI (an unknown resource as a read of it would answer), naming the URI.
            let why = listen
                .admission()
                .refused
                .first()
                .map(|(_, why)| why.clone())
                .unwrap_or(SourceError::NotFound { uri: uri.clone() });
            let mut e = to_mcp_error(why);
            if e.data.is_none() {
                e.data = Some(json!({"uri": uri}));
            }
            return Err(e);
        }
        let shared = self.shared.clone();
        let mut out = LegacyOut {
            peer: context.peer.clone(),
            cancel: cancel.clone(),
        };
        let span = tracing::info_span!("legacy_subscription", %uri);
        tokio::spawn(
            async move {
                let _done = done;
                // No stall deadline: a legacy client cannot learn that a subscription ended
                // (a listen's client gets an error and listens again), and one URI's pending
                // change is all a slow reader can hold up.
                if let Err(e) = deliver_on(&shared, listen, &mut out, LEGACY_STALL).await {
                    info!(error = %e.message, "resources/subscribe: subscription ended; the client must subscribe again");
                }
                cancel.cancel();
            }
            .instrument(span),
        );
        Ok(())
    }
}

/// A legacy subscription's stall deadline: in effect none (see
/// [`SourceServer::legacy_subscribe`]).
const LEGACY_STALL: Duration = Duration::from_secs(365 * 24 * 3600);
