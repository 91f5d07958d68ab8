//! A listen stream's delivery loop, the same whatever carries the stream: the rmcp session's
//! peer (byte streams: stdio, QUIC, the in-process pipes) or herald's own SSE response on HTTP:
//! written straight to the socket when the listen came first on its connection
//! (`transport::http::first`), else a hyper response body fed by a small task and a channel
//! (`transport::http`), either way instead of a whole rmcp service per request.
//!
//! The loop waits on the stream's pending set ([`StreamQueue`](crate::mcp::hub::StreamQueue)),
//! its task pushes, the client going away and the server's shutdown; it writes each pending
//! URI, each accepted list's change (`notifications/tools/list_changed`, see
//! [`crate::mcp::lists`]) and each newer task state to a [`ListenOut`] under one stall
//! deadline per batch (`--listen-stall-ms`).
//!
//! A stream whose batch cannot be written within the stall deadline ends with a JSON-RPC error
//! (`data.reason: "stalled"`), not the graceful result: notifications were lost, so the client
//! must listen again and read again. One slow reader never holds up a source or another
//! connection. At shutdown the loop returns `Ok` and the listen's final result follows. An
//! out's write may be cut off by the stall deadline or by shutdown, so every [`ListenOut`]
//! leaves its transport's framing whole when a write is dropped.
//!
//! A listen's acknowledgment is built here too, once, at admission ([`Ack`], from
//! [`SourceServer::open`](crate::mcp::server::SourceServer::open)): every transport writes
//! the message [`Ack::message`] returns (an SSE event on HTTP, a line on byte streams), so
//! `taskIds` and the narrowed filter are named the same way everywhere.

use std::future::Future;
use std::time::Duration;

use std::collections::{HashMap, HashSet};

use rmcp::model::{DetailedTask, ErrorData as McpError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::mcp::admission::{AdmittedListen, CarriedRead, ListenFilter, ReadForUpdate};
use crate::mcp::lists::{List, Lists};

/// The subscription-id key of a listen stream's notifications' `_meta`.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The method of a listen's acknowledgment.
pub const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";

/// What a listen's acknowledgment names, decided once at admission: the accepted URIs when
/// the request named some and some were accepted, the accepted lists, and the admitted task
/// ids (`None` when the listen named no `taskIds`).
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    /// `resourceSubscriptions`.
    pub uris: Option<Vec<String>>,
    /// `taskIds`.
    pub task_ids: Option<Vec<String>>,
    /// `toolsListChanged`, `promptsListChanged`.
    pub lists: Lists,
}

impl Ack {
    /// The acknowledgment of `listen`, admitted for `filter`.
    pub fn of(filter: &ListenFilter, listen: &AdmittedListen) -> Ack {
        let accepted = listen.uris();
        let uris = (filter.resources.is_some() && !accepted.is_empty()).then_some(accepted);
        Ack {
            uris,
            task_ids: listen.task_ids(),
            lists: listen.lists(),
        }
    }

    /// The acknowledgment's `params`, for subscription `id` (the listen request's id).
    pub fn params(&self, id: &rmcp::model::RequestId) -> serde_json::Value {
        let mut notifications = serde_json::Map::new();
        self.lists.echo(&mut notifications);
        if let Some(uris) = &self.uris {
            notifications.insert("resourceSubscriptions".into(), json!(uris));
        }
        if let Some(ids) = &self.task_ids {
            notifications.insert("taskIds".into(), json!(ids));
        }
        json!({"_meta": {SUBSCRIPTION_ID: id}, "notifications": notifications})
    }

    /// The acknowledgment as the notification a transport writes (rmcp's typed one has no
    /// `taskIds`, so it is a custom notification with the standard method).
    pub fn notification(&self, id: &rmcp::model::RequestId) -> rmcp::model::ServerNotification {
        rmcp::model::ServerNotification::CustomNotification(rmcp::model::CustomNotification::new(
            ACKNOWLEDGED,
            Some(self.params(id)),
        ))
    }

    /// The acknowledgment as a whole JSON-RPC message.
    pub fn message(&self, id: &rmcp::model::RequestId) -> rmcp::model::ServerJsonRpcMessage {
        rmcp::model::ServerJsonRpcMessage::notification(self.notification(id))
    }
}

/// Why a notification did not reach the stream.
#[derive(Debug)]
pub enum Undelivered {
    /// The client is gone (or ended the subscription): end quietly.
    Closed,
    /// The notification is not one the stream accepts: skip it.
    NotAccepted(String),
    /// The transport failed: end the stream with an error.
    Failed(String),
}

/// Where a listen's notifications go.
pub trait ListenOut: Send {
    /// Writes `notifications/resources/updated` for `uri`, with `carried` as its
    /// `_meta["io.herald/contents"]` when the listen asked for contents
    /// ([`CONTENTS`](crate::mcp::admission::CONTENTS));
    /// resolves once the transport took it (a reader that takes nothing keeps it pending: the
    /// stall deadline ends the stream).
    fn updated(
        &mut self,
        uri: &str,
        carried: Option<Value>,
    ) -> impl Future<Output = Result<(), Undelivered>> + Send;
    /// Writes `notifications/tools/list_changed` or `notifications/prompts/list_changed`
    /// (only for a list the stream accepted), the same way.
    fn list_changed(&mut self, list: List) -> impl Future<Output = Result<(), Undelivered>> + Send;
    /// Writes `notifications/tasks` with `task`'s state.
    fn task(&mut self, task: DetailedTask) -> impl Future<Output = Result<(), Undelivered>> + Send;
    /// Resolves when the client has gone away or cancelled the listen (owned, so it can be
    /// awaited beside a write).
    fn closed(&self) -> impl Future<Output = ()> + Send + 'static;
    /// Whether the client has already gone away.
    fn is_closed(&self) -> bool;
}

/// Delivers `listen` to `out` until the client goes, the server shuts down (`Ok`: the
/// listen's graceful result follows) or a notification cannot be written within `stall`
/// (`Err` with `data.reason: "stalled"`: the client must listen again and re-read).
pub async fn run(
    mut listen: AdmittedListen,
    out: &mut impl ListenOut,
    shutdown: &CancellationToken,
    stall: Duration,
    stream: u64,
) -> Result<(), McpError> {
    debug!(stream, uris = listen.spelled.len(), "listen stream opened");
    let mut tasks = listen.tasks.take();
    let revoked = listen.revoked();
    let closed = out.closed();
    tokio::pin!(closed);
    // The tasks' states at registration come first, right after the acknowledgment, under
    // one deadline.
    let first = tasks.as_mut().map(|t| t.initial()).unwrap_or_default();
    if revoked.is_cancelled() {
        return Err(revoked_error(stream));
    }
    if !first.is_empty() {
        let deadline = tokio::time::Instant::now() + stall;
        for task in first {
            if !send(
                out,
                Note::Task(task),
                &mut closed,
                shutdown,
                deadline,
                stall,
                stream,
            )
            .await?
            {
                return Ok(());
            }
        }
    }
    // A listen that carries contents: each URI's read first, the baseline its client diffs
    // against; every read of the stream then comes from this loop, one after another, so
    // the client never sees an older state after a newer one.
    let reads = listen.reads.take();
    let mut carry = Carry {
        reads,
        after: HashMap::new(),
        plain: HashSet::new(),
    };
    let ends = Ends {
        shutdown,
        revoked: &revoked,
        stall,
        stream,
    };
    if carry.reads.is_some() {
        let mut uris: Vec<&String> = listen.spelled.values().flatten().collect();
        uris.sort();
        uris.dedup();
        for uri in uris {
            // A first read is whole (never paged): one update each.
            let mut deadline = tokio::time::Instant::now() + stall;
            if update(out, uri, &mut carry, &mut deadline, &mut closed, &ends).await? == Sent::Ended
            {
                return Ok(());
            }
        }
    }
    loop {
        if out.is_closed() || shutdown.is_cancelled() {
            debug!(stream, "listen stream ended (cancelled, or shutdown)");
            return Ok(());
        }
        // Checked before every batch and note too: nothing more goes out once revoked.
        if revoked.is_cancelled() {
            return Err(revoked_error(stream));
        }
        // Not biased: neither resource updates nor task states can starve the other.
        tokio::select! {
            _ = &mut closed => {
                debug!(stream, "listen stream cancelled by the client");
                return Ok(());
            }
            _ = shutdown.cancelled() => {
                debug!(stream, "listen stream closed for shutdown");
                return Ok(());
            }
            _ = revoked.cancelled() => return Err(revoked_error(stream)),
            Some(task) = async {
                match tasks.as_mut() {
                    Some(t) => t.next().await,
                    None => std::future::pending().await,
                }
            } => {
                if revoked.is_cancelled() {
                    return Err(revoked_error(stream));
                }
                let deadline = tokio::time::Instant::now() + stall;
                if !send(out, Note::Task(task), &mut closed, shutdown, deadline, stall, stream).await? {
                    return Ok(());
                }
            }
            batch = listen.registration.queue().next_batch() => {
                // One deadline for the whole batch: a reader that takes nothing for
                // `stall` ends the stream. (A read an update carries comes first, and
                // its update gets a deadline of its own.)
                let mut deadline = tokio::time::Instant::now() + stall;
                for key in batch {
                    // A list's key, when this stream accepted that list; then the URIs this
                    // stream wrote for the key.
                    let list = List::ALL
                        .into_iter()
                        .find(|l| l.key() == key && listen.lists.has(*l));
                    let uris: Vec<&String> = listen.spelled.get(&key).into_iter().flatten().collect();
                    if let Some(list) = list {
                        // A cancel that came with the batch wins: nothing goes out after it.
                        if out.is_closed() {
                            return Ok(());
                        }
                        if revoked.is_cancelled() {
                            return Err(revoked_error(stream));
                        }
                        if !send(out, Note::List(list), &mut closed, shutdown, deadline, stall, stream).await? {
                            return Ok(());
                        }
                    }
                    for uri in uris {
                        match update(out, uri, &mut carry, &mut deadline, &mut closed, &ends).await? {
                            Sent::Ended => return Ok(()),
                            // Its turn is over: the rest after what else is pending.
                            Sent::MoreWaiting => listen.registration.queue().push(&key),
                            Sent::Done => {}
                        }
                    }
                }
            }
        }
    }
}

/// What ends a stream besides its client leaving, and how it is named in the log.
struct Ends<'a> {
    shutdown: &'a CancellationToken,
    revoked: &'a CancellationToken,
    stall: Duration,
    stream: u64,
}

/// The most pages of one event log a stream sends in a turn (1 MiB): then the URI waits
/// behind what else is pending, so a log that never stops growing cannot starve the others.
const PAGES_PER_TURN: usize = 4;

/// How far [`update`] got.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    /// The stream ends gracefully.
    Ended,
    Done,
    /// An event log's turn ended with more of it waiting.
    MoreWaiting,
}

/// Sends `uri`'s update: plain by `deadline` (the batch's), or when the stream carries reads,
/// with its read by a deadline of its own grown by its size, and for an event log one update
/// per page while more of it waits (up to [`PAGES_PER_TURN`]), so a reader that fell behind
/// in a burst gets every event pushed.
async fn update(
    out: &mut impl ListenOut,
    uri: &str,
    carry: &mut Carry,
    deadline: &mut tokio::time::Instant,
    closed: &mut (impl Future<Output = ()> + Unpin),
    ends: &Ends<'_>,
) -> Result<Sent, McpError> {
    let (shutdown, revoked, stall, stream) = (ends.shutdown, ends.revoked, ends.stall, ends.stream);
    for _ in 0..PAGES_PER_TURN {
        // A cancel that came with the batch wins: nothing goes out after it.
        if out.is_closed() {
            return Ok(Sent::Ended);
        }
        if revoked.is_cancelled() {
            return Err(revoked_error(stream));
        }
        let mut more = false;
        let carried = match carry.reads.is_some() {
            false => None,
            true => {
                let Some(c) = carry.read(uri, shutdown, revoked, closed).await else {
                    return ended(revoked, stream).map(|()| Sent::Ended);
                };
                more = c.as_ref().is_some_and(|c| c.more);
                let value = c.map(|c| c.value);
                *deadline = tokio::time::Instant::now() + stall + sending(value.as_ref());
                value
            }
        };
        // Checked again after the read: nothing more goes out once revoked.
        if revoked.is_cancelled() {
            return Err(revoked_error(stream));
        }
        let note = Note::Updated(uri, carried);
        if !send(out, note, closed, shutdown, *deadline, stall, stream).await? {
            return Ok(Sent::Ended);
        }
        if !more {
            return Ok(Sent::Done);
        }
    }
    Ok(Sent::MoreWaiting)
}

/// The slowest reader a stream keeps while it takes a carried read, in bytes a second: the
/// stall deadline of an update that carries one grows by its size at this rate, so a live
/// reader on a slow link is not taken for a stalled one.
const SLOWEST_READER: usize = 32 << 10;

/// The time a carried read adds to its update's deadline ([`SLOWEST_READER`]).
fn sending(carried: Option<&Value>) -> Duration {
    let bytes = carried
        .and_then(|c| c.get("text").or_else(|| c.get("blob")))
        .and_then(Value::as_str)
        .map_or(0, str::len);
    Duration::from_millis((bytes * 1000 / SLOWEST_READER) as u64)
}

/// How long the read an update carries may take; past it the update carries an error (the
/// client reads again itself).
const CARRY_READ_LIMIT: Duration = Duration::from_secs(30);

/// The reads a stream's updates carry, and where each event log's last one got to.
struct Carry {
    reads: Option<ReadForUpdate>,
    /// Each event log's newest `seq` carried so far: the next read's `after`.
    after: HashMap<String, u64>,
    /// URIs once too big to carry: their updates go plain (their client reads), with no read
    /// here that would be thrown away.
    plain: HashSet<String>,
}

impl Carry {
    /// `uri`'s read to carry (`Some(None)`: its update goes plain); `None` at shutdown, or when
    /// the client went away or its access was taken (the loop then ends the stream as it
    /// would).
    async fn read(
        &mut self,
        uri: &str,
        shutdown: &CancellationToken,
        revoked: &CancellationToken,
        closed: &mut (impl Future<Output = ()> + Unpin),
    ) -> Option<Option<CarriedRead>> {
        let reads = self.reads.as_ref()?;
        if self.plain.contains(uri) {
            return Some(None);
        }
        let read = reads(uri.to_owned(), self.after.get(uri).copied());
        let carried = tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = revoked.cancelled() => return None,
            _ = closed => return None,
            r = tokio::time::timeout(CARRY_READ_LIMIT, read) => r.unwrap_or_else(|_| {
                Some(CarriedRead {
                    value: json!({"error": {"code": -32603, "message": format!(
                        "the read took longer than {} s; read it again", CARRY_READ_LIMIT.as_secs())}}),
                    newest: None,
                    more: false,
                })
            }),
        };
        let Some(mut carried) = carried else {
            self.plain.insert(uri.to_owned());
            return Some(None);
        };
        // A next page only after one that moved (never a loop on a page read again); a page of
        // a log that restarted below the last one moves back.
        let moved = (carried.newest).is_some_and(|n| self.after.get(uri).is_none_or(|&a| n != a));
        carried.more &= moved;
        if let Some(n) = carried.newest {
            self.after.insert(uri.to_owned(), n);
        }
        Some(Some(carried))
    }
}

/// Writes `note` by `deadline`. `Ok(false)`: the client went away or the server is shutting
/// down (end gracefully); an error when the transport failed or the reader took nothing by
/// the deadline (`data.reason: "stalled"`: notifications were lost, so the client must listen
/// again and re-read).
async fn send(
    out: &mut impl ListenOut,
    note: Note<'_>,
    closed: &mut (impl Future<Output = ()> + Unpin),
    shutdown: &CancellationToken,
    deadline: tokio::time::Instant,
    stall: Duration,
    stream: u64,
) -> Result<bool, McpError> {
    let then = note.then();
    let sent = tokio::select! {
        _ = shutdown.cancelled() => return Ok(false),
        _ = closed => return Ok(false),
        r = tokio::time::timeout_at(deadline, note.write(out)) => r,
    };
    match sent {
        Ok(Ok(())) => Ok(true),
        Ok(Err(Undelivered::Closed)) => Ok(false),
        Ok(Err(Undelivered::NotAccepted(e))) => {
            debug!(stream, error = %e, "notification not accepted");
            Ok(true)
        }
        Ok(Err(Undelivered::Failed(e))) => {
            info!(stream, error = %e, "listen stream could not deliver; ending it");
            Err(McpError::internal_error(
                format!("listen stream failed to deliver a notification ({e}); listen again"),
                None,
            ))
        }
        Err(_) => {
            info!(
                stream,
                stall_ms = stall.as_millis() as u64,
                "listen stream stalled: its reader took no notification; ending it so the client resubscribes"
            );
            Err(McpError::internal_error(
                format!(
                    "listen stream stalled: no notification could be delivered for {} ms; listen again and {then}",
                    stall.as_millis()
                ),
                Some(json!({"reason": "stalled"})),
            ))
        }
    }
}

/// How a stream ends when a read it carries gave way: with the revocation's error when that
/// was why, else gracefully (the client left, or the server is shutting down).
fn ended(revoked: &CancellationToken, stream: u64) -> Result<(), McpError> {
    match revoked.is_cancelled() {
        true => Err(revoked_error(stream)),
        false => Ok(()),
    }
}

/// The error a stream ends with when the source took its caller's access away (a reload
/// revoked or narrowed its token, or removed or replaced a server it watches; its access
/// token expired).
fn revoked_error(stream: u64) -> McpError {
    info!(
        stream,
        "listen stream ended: its caller's access to what it watches ended (a reload, or an access token's expiry)"
    );
    McpError::new(
        rmcp::model::ErrorCode(-32024),
        "this listen's access changed (its token expired, was revoked or narrowed, or a server it watches was removed or changed by a reload); listen again, with a fresh token if it expired",
        Some(json!({"reason": "revoked"})),
    )
}

/// One notification: an update (with the read it carries), a list's change, a task's state.
enum Note<'a> {
    Updated(&'a str, Option<Value>),
    List(List),
    Task(DetailedTask),
}

impl Note<'_> {
    async fn write(self, out: &mut impl ListenOut) -> Result<(), Undelivered> {
        match self {
            Note::Updated(uri, carried) => out.updated(uri, carried).await,
            Note::List(list) => out.list_changed(list).await,
            Note::Task(task) => out.task(task).await,
        }
    }

    /// What a client whose stream stalled on this note does after listening again.
    fn then(&self) -> &'static str {
        match self {
            Note::Task(_) => "tasks/get",
            _ => "re-read",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_read_gives_its_update_time_to_be_sent() {
        assert_eq!(sending(None), Duration::ZERO);
        let read = json!({"mimeType": "text/plain", "text": "x".repeat(64 << 10)});
        assert_eq!(sending(Some(&read)), Duration::from_secs(2));
        let blob = json!({"mimeType": "image/png", "blob": "A".repeat(16 << 10)});
        assert_eq!(sending(Some(&blob)), Duration::from_millis(500));
        // An error carried is small: no time added.
        let failed = json!({"error": {"code": -32603, "message": "boom"}});
        assert_eq!(sending(Some(&failed)), Duration::ZERO);
    }
}
