//! `events/stream`: push delivery of an event type (MCP Events, SEP-3415), one long request
//! per subscription, on every transport.
//!
//! One core, [`SourceServer::event_stream`], whatever carries the request: it answers from the
//! source's own `events/poll` (a ring of its own, or the gateway's relay to a slug), asked as
//! long polls back to back, so an event is pushed as soon as the source has it and no timer
//! looks for work. The stream writes, each tagged with
//! `_meta["io.modelcontextprotocol/subscriptionId"]` = the request's id:
//!
//! - `notifications/events/active` first, with the cursor it starts from and `truncated`
//!   (events between that cursor and the first one sent were dropped, or were older than
//!   `maxAgeMs`);
//! - `notifications/events/event` per event: the event occurrence as a poll returns it, plus
//!   its `cursor` (resume from it to get what follows it; an upstream that gives only a batch
//!   cursor gives it on the batch's last event alone), and `truncated: true` on the first
//!   event after a gap the stream itself fell into;
//! - `notifications/events/heartbeat` with the cursor when nothing was written for
//!   [`HEARTBEAT`] (under the draft's 30 s; a client takes twice that of silence as a dead
//!   stream);
//! - `notifications/events/error` when the source fails for a while (a slug's upstream went
//!   away): the stream goes on and tries again with backoff;
//! - `notifications/events/terminated` when it cannot go on (the event type is gone, the
//!   caller's entitlement was revoked), then the result.
//!
//! The result (`{"resultType":"complete","cursor":…}`) comes only when the server ends the
//! stream (terminated, or a shutdown); a client that cancels it or goes away gets nothing more.
//! A refusal before `active` (bad params, an unknown event type, no entitlement, the
//! connection's cap reached) is the request's JSON-RPC error. A stream counts against
//! `--max-event-streams` alone, never against the listen streams or the requests in flight
//! (`transport::lines` keeps it out of the in-flight limit). A reader that takes no message
//! within the stall timeout (`--listen-stall-ms`) has its stream ended, as a listen's is.

use std::time::Duration;

use rmcp::model::{CustomNotification, ErrorCode, ErrorData as McpError, JsonObject};
use rmcp::service::{Peer, RequestContext, RoleServer};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{SourceServer, to_mcp_error};
use crate::mcp::admission::ConnStreams;
use crate::mcp::caller::Caller;
use crate::mcp::events::{EVENT_CURSOR_META, PollAnswer as Batch};
use crate::mcp::listen::{SUBSCRIPTION_ID, Undelivered};
use crate::runtime::backoff::Backoff;

/// The longest a stream stays silent: a heartbeat goes out when nothing else did for this
/// long (the draft asks for one at least every 30 s).
pub const HEARTBEAT: Duration = Duration::from_secs(25);
/// Events asked for per poll.
const BATCH: u64 = crate::mcp::events::MAX_EVENTS as u64;
/// A source that answers a long poll early and empty is asked again no sooner than this (the
/// draft's floor for `nextPollMs`), so one that cannot wait is not asked in a loop.
const EARLY_FLOOR: Duration = Duration::from_secs(1);
/// Retries after a failed poll: from 1 s, doubling, at most 20 s apart (each failure is an
/// `error` message, so the stream is never silent for a heartbeat's time).
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(20));

const STREAM_PARAMS: [&str; 5] = ["name", "arguments", "cursor", "maxAgeMs", "_meta"];

/// A validated `events/stream` request.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRequest {
    pub name: String,
    pub arguments: JsonObject,
    /// Opaque: the source's own (herald's are decimal seqs, a slug's its upstream's).
    pub cursor: Option<String>,
    pub max_age_ms: Option<u64>,
}

fn invalid(m: String) -> McpError {
    McpError::invalid_params(m, None)
}

impl StreamRequest {
    /// `name` (required), `arguments` (object), `cursor` (string or null: from now),
    /// `maxAgeMs`, `_meta`; any other key is refused by name.
    pub fn parse(params: &JsonObject) -> Result<StreamRequest, McpError> {
        if let Some(k) = params.keys().find(|k| !STREAM_PARAMS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown parameter {k}; events/stream takes name, arguments, cursor and maxAgeMs"
            )));
        }
        let (name, arguments) = crate::mcp::events::name_and_arguments(params, "events/stream")
            .map_err(to_mcp_error)?;
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(invalid(format!(
                    "cursor must be a string from an earlier event, or null to start from now; got {other}"
                )));
            }
        };
        let max_age_ms = match params.get("maxAgeMs") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                invalid(format!(
                    "maxAgeMs must be a non-negative integer (milliseconds), got {v}"
                ))
            })?),
        };
        Ok(StreamRequest {
            name,
            arguments,
            cursor,
            max_age_ms,
        })
    }

    /// The `events/poll` params that read on from `cursor`, waiting up to `wait`.
    fn poll(&self, cursor: Option<&str>, wait: Duration, first: bool) -> JsonObject {
        let mut p = JsonObject::new();
        p.insert("name".into(), self.name.clone().into());
        p.insert("arguments".into(), Value::Object(self.arguments.clone()));
        p.insert("cursor".into(), cursor.map_or(Value::Null, Into::into));
        p.insert("maxEvents".into(), BATCH.into());
        if first && let Some(age) = self.max_age_ms {
            p.insert("maxAgeMs".into(), age.into());
        }
        if !wait.is_zero() {
            p.insert("timeoutMs".into(), (wait.as_millis() as u64).into());
        }
        p
    }
}

/// Where a stream's notifications go: the request's peer on an rmcp session (a byte stream,
/// or rmcp's SSE answer to one HTTP request).
pub trait EventsOut: Send {
    /// Writes `notifications/events/<kind>` with `params` (the subscription id is added).
    fn send(
        &mut self,
        kind: &'static str,
        params: Value,
    ) -> impl Future<Output = Result<(), Undelivered>> + Send;
    /// Resolves when the client cancelled the stream or went away.
    fn closed(&self) -> impl Future<Output = ()> + Send + 'static;
    /// Whether a write may take as long as it takes (a webhook's retries): no stall timeout.
    fn patient(&self) -> bool {
        false
    }
}

/// An `events/stream` answered on an rmcp session's peer.
pub struct PeerEvents {
    peer: Peer<RoleServer>,
    id: Value,
    ct: CancellationToken,
}

impl PeerEvents {
    pub fn new(context: &RequestContext<RoleServer>) -> PeerEvents {
        PeerEvents {
            peer: context.peer.clone(),
            id: serde_json::to_value(&context.id).unwrap_or(Value::Null),
            ct: context.ct.clone(),
        }
    }
}

impl EventsOut for PeerEvents {
    async fn send(&mut self, kind: &'static str, mut params: Value) -> Result<(), Undelivered> {
        if self.ct.is_cancelled() {
            return Err(Undelivered::Closed);
        }
        if let Some(o) = params.as_object_mut() {
            let meta = o.entry("_meta").or_insert_with(|| json!({}));
            if !meta.is_object() {
                *meta = json!({});
            }
            meta[SUBSCRIPTION_ID] = self.id.clone();
        }
        let n = CustomNotification::new(format!("notifications/events/{kind}"), Some(params));
        self.peer
            .send_notification(rmcp::model::ServerNotification::CustomNotification(n))
            .await
            .map_err(|e| Undelivered::Failed(e.to_string()))
    }

    fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        self.ct.clone().cancelled_owned()
    }
}

/// Whether a poll's failure ends the stream (`terminated`) rather than being tried again
/// (`error`): the event type is unknown, the params are wrong, the caller may not have it
/// (a webhook subscription's follower asks the same of a refusal before `active`).
pub fn is_final(code: i32) -> bool {
    matches!(
        code,
        -32602 | -32601 | -32023 | -32024 | -32026 | -32011 | -32012 | -32014
    )
}

fn error_json(e: &McpError) -> Value {
    let mut v = json!({"code": e.code.0, "message": e.message});
    if let Some(d) = &e.data {
        v["data"] = d.clone();
    }
    v
}

/// How a stream ended, for its request's answer.
enum Ended {
    /// The server ended it (terminated, shutdown): the result, with the cursor to resume from.
    Closed(Option<String>),
    /// The client cancelled or went away, or the transport failed: nothing more is written.
    Gone(McpError),
}

impl SourceServer {
    /// Serves one `events/stream` request from `caller` on the connection whose budget is
    /// `budget`, writing to `out`; see the module docs. Returns the result the server ends
    /// the stream with, or the error that refused it before `active`.
    pub async fn event_stream(
        &self,
        caller: &Caller,
        params: JsonObject,
        budget: &ConnStreams,
        out: &mut impl EventsOut,
    ) -> Result<Value, McpError> {
        let req = StreamRequest::parse(&params)?;
        let max = self.shared.limits.max_event_streams_per_connection;
        let _slot = budget.try_acquire_events(max).ok_or_else(|| {
            McpError::new(
                ErrorCode(-32025),
                format!(
                    "this connection already has {max} open events/stream streams, the most allowed (--max-event-streams); cancel one first or open another connection"
                ),
                Some(json!({"limit": "eventStreams", "max": max})),
            )
        })?;
        // A stream whose caller's access token expires ends then (`terminated`): the client
        // opens it again, from its cursor, with a fresh token.
        // (stdio needs no token: a stale one it carries ends nothing. An absurd `exp` is
        // no deadline.)
        let ends = (!caller.local)
            .then(|| self.shared.source.expires_in(caller))
            .flatten()
            .and_then(|left| Instant::now().checked_add(left));
        self.follow_until(caller, &req, out, ends).await
    }

    /// Follows `req` for `caller` into `out` (a stream's, a webhook subscription's): `active`,
    /// then the events as they come. Returns the result the server ends it with, or the error
    /// that refused it before `active`.
    pub async fn follow(
        &self,
        caller: &Caller,
        req: &StreamRequest,
        out: &mut impl EventsOut,
    ) -> Result<Value, McpError> {
        self.follow_until(caller, req, out, None).await
    }

    /// [`follow`](Self::follow), ended with `terminated` at `ends` (the caller's access
    /// token's expiry).
    async fn follow_until(
        &self,
        caller: &Caller,
        req: &StreamRequest,
        out: &mut impl EventsOut,
        ends: Option<Instant>,
    ) -> Result<Value, McpError> {
        let source = &self.shared.source;
        let first = source
            .events_poll(
                caller,
                req.poll(req.cursor.as_deref(), Duration::ZERO, true),
            )
            .await
            .map_err(to_mcp_error)?;
        let first = Batch::parse(first).map_err(|e| McpError::internal_error(e, None))?;
        let Some(head) = first.cursor.clone() else {
            return Err(McpError::new(
                ErrorCode(-32026),
                format!(
                    "event type {} gives no cursor, so it cannot be streamed; poll it instead",
                    req.name
                ),
                Some(json!({"feature": "deliveryMode", "value": "push"})),
            ));
        };
        let start = req.cursor.clone().unwrap_or(head);
        let active = json!({"cursor": start, "truncated": first.truncated});
        let ended = match self.send(out, "active", active).await {
            Err(e) => Ended::Gone(e),
            Ok(()) => self.stream_on(caller, req, first, out, ends).await,
        };
        match ended {
            Ended::Gone(e) => Err(e),
            Ended::Closed(cursor) => {
                let mut result = json!({"resultType": "complete", "cursor": cursor});
                self.stamp_json(&mut result);
                Ok(result)
            }
        }
    }

    /// Ends a stream whose caller's access token expired: `terminated` with the error a
    /// poll with that token would now get, then the result with the cursor to resume from.
    async fn expired(&self, out: &mut impl EventsOut, cursor: Option<String>) -> Ended {
        let e = McpError::new(
            ErrorCode(-32024),
            "the access token this stream was opened with expired; open it again from its cursor with a fresh token",
            Some(json!({"reason": "expired"})),
        );
        let _ = self
            .send(out, "terminated", json!({"error": error_json(&e)}))
            .await;
        Ended::Closed(cursor)
    }

    /// Writes one message, within the stall timeout.
    async fn send(
        &self,
        out: &mut impl EventsOut,
        kind: &'static str,
        params: Value,
    ) -> Result<(), McpError> {
        let stall = self.shared.limits.stall_timeout;
        let sent = if out.patient() {
            Ok(out.send(kind, params).await)
        } else {
            tokio::time::timeout(stall, out.send(kind, params)).await
        };
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(Undelivered::Closed)) => Err(McpError::invalid_request(
                "the events/stream was cancelled",
                None,
            )),
            Ok(Err(Undelivered::Failed(e) | Undelivered::NotAccepted(e))) => Err(
                McpError::internal_error(format!("events/stream: {e}"), None),
            ),
            Err(_) => {
                tracing::warn!(
                    stall_ms = stall.as_millis() as u64,
                    "an events/stream reader took no message within the stall timeout; ending its stream"
                );
                Err(McpError::internal_error(
                    "the reader took no message within the stall timeout (--listen-stall-ms); open the stream again from the last cursor",
                    None,
                ))
            }
        }
    }

    /// The stream after `active`: `batch`'s events, then long polls back to back.
    async fn stream_on(
        &self,
        caller: &Caller,
        req: &StreamRequest,
        mut batch: Batch,
        out: &mut impl EventsOut,
        ends: Option<Instant>,
    ) -> Ended {
        let shutdown = self.shared.shutdown.clone();
        let closed = out.closed();
        tokio::pin!(closed);
        let expiry = async move {
            match ends {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        let mut cursor = batch.cursor.clone();
        // The first batch's gap was told by `active`.
        let mut gap = false;
        let mut last_sent = Instant::now();
        let mut retry = RETRY;
        loop {
            let n = batch.events.len();
            for (i, mut event) in batch.events.drain(..).enumerate() {
                let own = event
                    .get_mut("_meta")
                    .and_then(Value::as_object_mut)
                    .and_then(|m| m.remove(EVENT_CURSOR_META));
                let at = match own {
                    Some(Value::String(c)) => Some(c),
                    Some(Value::Number(c)) => Some(c.to_string()),
                    _ if i + 1 == n => batch.cursor.clone(),
                    _ => None,
                };
                if let Some(o) = event.as_object_mut() {
                    if let Some(c) = &at {
                        o.insert("cursor".into(), c.clone().into());
                    }
                    if gap {
                        o.insert("truncated".into(), true.into());
                        gap = false;
                    }
                    if o.get("_meta")
                        .is_some_and(|m| m.as_object().is_some_and(|m| m.is_empty()))
                    {
                        o.remove("_meta");
                    }
                }
                if let Err(e) = self.send(out, "event", event).await {
                    return Ended::Gone(e);
                }
                last_sent = Instant::now();
            }
            if batch.cursor.is_some() {
                cursor = batch.cursor.clone();
            }
            // Ask again at once while more is waiting; else wait for the next event, at most
            // until a heartbeat is due.
            let due = last_sent + HEARTBEAT;
            let wait = if batch.has_more {
                Duration::ZERO
            } else {
                due.saturating_duration_since(Instant::now())
            };
            let asked = Instant::now();
            let polled = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ended::Closed(cursor),
                _ = &mut expiry => return self.expired(out, cursor).await,
                _ = &mut closed => return Ended::Gone(McpError::invalid_request("the events/stream was cancelled", None)),
                r = self.shared.source.events_poll(caller, req.poll(cursor.as_deref(), wait, false)) => r.map_err(to_mcp_error),
                // A source that holds a poll past its timeoutMs does not hold up the heartbeat.
                _ = tokio::time::sleep_until(due + EARLY_FLOOR) => Ok(json!({"events": [], "cursor": cursor})),
            };
            match polled {
                Ok(v) => {
                    retry.reset();
                    batch = match Batch::parse(v) {
                        Ok(b) => b,
                        // A malformed answer is a failed poll (said, and asked again).
                        Err(e) => {
                            let e = McpError::internal_error(e, None);
                            if let Err(gone) = self
                                .send(out, "error", json!({"error": error_json(&e)}))
                                .await
                            {
                                return Ended::Gone(gone);
                            }
                            last_sent = Instant::now();
                            Batch::parse(json!({"events": [], "cursor": cursor}))
                                .expect("well formed")
                        }
                    };
                    // "More" with nothing in it is not asked again at once (no spin).
                    if batch.events.is_empty() {
                        batch.has_more = false;
                    }
                    if batch.truncated {
                        gap = true;
                    }
                    if !batch.events.is_empty() {
                        continue;
                    }
                    if Instant::now() + EARLY_FLOOR / 2 >= due {
                        let beat = json!({"cursor": batch.cursor.clone().or_else(|| cursor.clone()), "truncated": std::mem::take(&mut gap)});
                        if let Err(e) = self.send(out, "heartbeat", beat).await {
                            return Ended::Gone(e);
                        }
                        last_sent = Instant::now();
                    } else if asked.elapsed() + EARLY_FLOOR / 2 < wait {
                        // Answered early and empty: a source that cannot wait is asked again
                        // after its nextPollMs (at least the floor), never sooner.
                        let pause = batch.next_poll.max(EARLY_FLOOR);
                        let until = (Instant::now() + pause).min(due);
                        tokio::select! {
                                    _ = shutdown.cancelled() => return Ended::Closed(cursor),
                        _ = &mut expiry => return self.expired(out, cursor).await,
                                    _ = &mut closed => return Ended::Gone(McpError::invalid_request("the events/stream was cancelled", None)),
                                    _ = tokio::time::sleep_until(until) => {}
                                }
                    }
                }
                Err(e) if is_final(e.code.0) => {
                    let _ = self
                        .send(out, "terminated", json!({"error": error_json(&e)}))
                        .await;
                    return Ended::Closed(cursor);
                }
                Err(e) => {
                    tracing::debug!(error = %e.message, event = %req.name, "an events/stream poll failed; trying again");
                    if let Err(e) = self
                        .send(out, "error", json!({"error": error_json(&e)}))
                        .await
                    {
                        return Ended::Gone(e);
                    }
                    last_sent = Instant::now();
                    batch = Batch {
                        events: Vec::new(),
                        cursor: None,
                        truncated: false,
                        has_more: false,
                        next_poll: Duration::ZERO,
                    };
                    let pause = retry.next_delay();
                    tokio::select! {
                            _ = shutdown.cancelled() => return Ended::Closed(cursor),
                    _ = &mut expiry => return self.expired(out, cursor).await,
                            _ = &mut closed => return Ended::Gone(McpError::invalid_request("the events/stream was cancelled", None)),
                            _ = tokio::time::sleep(pause) => {}
                        }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
