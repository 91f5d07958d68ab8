//! The start of every listen: [`SourceServer::open`] (admission and its acknowledgment) and
//! [`SourceServer::deliver`] (the stream until it ends), and the reads a listen's updates carry
//! when it asked for them ([`CONTENTS`](crate::mcp::admission::CONTENTS)): the same read a
//! `resources/read` runs for its caller.

use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::ErrorData as McpError;
use serde_json::json;
use tracing::debug;

use super::{ActiveListen, Shared, SourceServer, TaskBackend};
use crate::mcp::admission::{
    AdmittedListen, CarriedRead, ConnStreams, ListenFilter, ReadForUpdate,
};
use crate::mcp::caller::Caller;
use crate::mcp::listen::{Ack, ListenOut};
use crate::mcp::ring::{
    EVENT_LOG_MIME, MAX_EVENT_BYTES, PAGE_BYTES, RING_BYTES, more_waiting, newest_seq,
    newest_within,
};
use crate::mcp::source::{Body, Read};
use crate::mcp::tasks::TaskFeed;

/// The largest state read an update carries (past it, the URI's updates go plain and its
/// client reads): a quarter of [`RING_BYTES`], so the update fits a message at the default
/// limit (4 MiB) even when every character is escaped as `\u00XX`.
const CARRY_MAX: usize = RING_BYTES / 4;

/// The largest event-log read an update carries: a page of a herald ring (its anchor and first
/// new event, each at most [`MAX_EVENT_BYTES`], and [`PAGE_BYTES`] more) fits; a bigger one
/// comes from a server that does not page its reads.
const CARRY_LOG_MAX: usize = 2 * MAX_EVENT_BYTES + PAGE_BYTES + 64;

fn body_len(body: &Body) -> usize {
    match body {
        Body::Text(t) => t.len(),
        Body::Blob(b) => b.len() * 4 / 3,
    }
}

impl SourceServer {
    /// Delivers an admitted listen to `out` until it ends (see [`crate::mcp::listen::run`]),
    /// counted among this server's running listens. `Ok`: the listen's graceful result goes
    /// out next.
    pub async fn deliver(
        &self,
        listen: AdmittedListen,
        out: &mut impl ListenOut,
    ) -> Result<(), McpError> {
        deliver_on(&self.shared, listen, out, self.shared.limits.stall_timeout).await
    }

    /// Opens a listen from `caller` asking for `filter` on the connection whose stream budget
    /// is `budget`: admits it ([`admit`](Self::admit)) and builds its acknowledgment, once.
    /// The one way a listen starts: every transport calls it and writes the [`Ack`] before
    /// anything else of the stream, then hands the listen to [`deliver`](Self::deliver).
    pub async fn open(
        &self,
        caller: &Caller,
        filter: &ListenFilter,
        budget: &ConnStreams,
    ) -> Result<(Ack, AdmittedListen), McpError> {
        let listen = self.admit(caller, filter, budget).await?;
        Ok((Ack::of(filter, &listen), listen))
    }

    /// Admits a listen from `caller` asking for `filter` on `conn`: checks the limits,
    /// reserves a stream slot, asks the source what it accepts (which starts the watches) and
    /// registers the accepted feed keys with the hub, all before the ack. Called by
    /// [`open`](Self::open) for a listen, and by a legacy `resources/subscribe`.
    pub(super) async fn admit(
        &self,
        caller: &Caller,
        filter: &ListenFilter,
        conn: &ConnStreams,
    ) -> Result<AdmittedListen, McpError> {
        let s = &self.shared;
        let slot = s
            .budgets
            .check(&s.limits, filter, conn, self.identity(caller))?;
        let mut admission = self.shared.source.admit(caller, filter).await;
        // A caller whose credentials expire (an access token) has its stream ended then, as
        // a revoked one's is: it listens again with a fresh token.
        if let Some(left) = (!caller.local)
            .then(|| self.shared.source.expires_in(caller))
            .flatten()
        {
            let end = admission
                .revoked
                .get_or_insert_with(Default::default)
                .clone();
            admission.guards.push(crate::mcp::source::WatchGuard::new(
                end.clone().drop_guard(),
            ));
            tokio::spawn(async move {
                tokio::select! {
                    _ = end.cancelled() => {}
                    _ = tokio::time::sleep(left) => end.cancel(),
                }
            });
        }
        for (uri, why) in &admission.refused {
            debug!(%uri, reason = %why, "listen: URI left out of the acknowledgment");
        }
        // The lists it asked for that this server announces ride the same feed and queue.
        let lists = filter.lists.accepted(&self.shared.config.capabilities);
        let keys: Vec<String> = (admission.accepted.iter().map(|a| a.key.clone()))
            .chain(lists.keys().map(str::to_owned))
            .collect();
        let registration = self.shared.feed.register(&keys);
        let mut listen = AdmittedListen::new(slot, registration, admission);
        listen.lists = lists;
        if filter.contents {
            listen.reads = Some(self.reads_for(caller));
        }
        if let Some(ids) = &filter.task_ids {
            // Only the ids this caller could tasks/get now; unknown and foreign ones are left
            // out without a word, so a listen tells nothing a poll would not.
            let tasks = match self.shared.tasks.as_ref() {
                None => None,
                Some(TaskBackend::Local(t)) => {
                    Some(TaskFeed::Local(t.listen(&caller.principal(), ids)))
                }
                Some(TaskBackend::Relayed(r)) => {
                    Some(TaskFeed::Relayed(r.listen(caller, ids).await))
                }
            };
            listen.task_echo = Some(tasks.as_ref().map(|t| t.ids().to_vec()).unwrap_or_default());
            listen.tasks = tasks;
        }
        Ok(listen)
    }

    /// What reads a listen's updates for `caller`: [`read_cut`](Self::read_cut), each answer
    /// as the update's `_meta` value, with an event log's newest `seq` and whether more of it
    /// waits.
    fn reads_for(&self, caller: &Caller) -> ReadForUpdate {
        let (server, caller) = (self.clone(), caller.clone());
        std::sync::Arc::new(move |uri: String, after: Option<u64>| {
            let (server, caller) = (server.clone(), caller.clone());
            Box::pin(async move {
                match server.read_cut(&caller, Read::after(&uri, after)).await {
                    Ok(mut c) => {
                        let log = c.mime_type == EVENT_LOG_MIME;
                        // A log's first read (whole) that is too big: its newest page, which
                        // is all a baseline needs (the next read starts past its newest).
                        if let (true, None, Body::Text(t)) = (log, after, &c.body)
                            && t.len() > CARRY_LOG_MAX
                            && let Some(cut) = newest_within(t, PAGE_BYTES)
                        {
                            c.body = Body::Text(cut);
                        }
                        if body_len(&c.body) > if log { CARRY_LOG_MAX } else { CARRY_MAX } {
                            return None;
                        }
                        // A first read of a log with no events (or none numbered): the next
                        // starts at 0, from the oldest, a page at a time. (A later empty one
                        // leaves where the stream got to as it was.)
                        let (newest, more) = match &c.body {
                            Body::Text(t) if log => (
                                newest_seq(t).or(after.is_none().then_some(0)),
                                more_waiting(t),
                            ),
                            _ => (None, false),
                        };
                        let value = match c.body {
                            Body::Text(text) => json!({"mimeType": c.mime_type, "text": text}),
                            Body::Blob(b) => json!({"mimeType": c.mime_type,
                                "blob": base64::engine::general_purpose::STANDARD.encode(b)}),
                        };
                        Some(CarriedRead {
                            value,
                            newest,
                            more,
                        })
                    }
                    Err(e) => Some(CarriedRead {
                        value: json!({"error": {"code": e.code.0, "message": e.message}}),
                        newest: None,
                        more: false,
                    }),
                }
            }) as futures::future::BoxFuture<'static, Option<CarriedRead>>
        })
    }
}

/// Delivers `listen` to `out` on `shared`'s server, counted among its running listens.
pub(super) async fn deliver_on(
    shared: &Shared,
    listen: AdmittedListen,
    out: &mut impl ListenOut,
    stall: Duration,
) -> Result<(), McpError> {
    let _active = ActiveListen::new(shared);
    let stream = shared.streams_total.fetch_add(1, Ordering::Relaxed);
    crate::mcp::listen::run(listen, out, &shared.shutdown, stall, stream).await
}
