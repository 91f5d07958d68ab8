//! [`EventFollow`]: one event type of an upstream followed as a client (the watch client's
//! `events:` watches, the gateway's feeds).
//!
//! It asks `events/stream` (push: one long request, its messages routed to it by subscription
//! id through the connection's [`Relay`](super::Relay)) and falls back to `events/poll` long
//! polls, back to back, where the upstream answers that it has no such method. Either way it
//! keeps the cursor of the last event it handed out, so a follow that breaks (a lost
//! connection, a stream silent past [`DEAD_AFTER`], a reader that fell behind its channel, a
//! server that ended the stream) starts again from there and loses nothing the upstream still
//! holds; what it no longer holds comes back as `truncated`. Dropping the follow cancels its
//! stream upstream.
//!
//! Its user asks [`EventFollow::next`] and paces the retries: a failure is returned, and the
//! next call opens the follow again.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ClientRequest, CustomRequest, JsonObject, ServerResult};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::relay::{StreamMessage, StreamRoute};
use super::{CancelOnDrop, Live, REQUEST_TIMEOUT, Upstream, UpstreamError};
use crate::mcp::events::{EVENT_CURSOR_META, MAX_TIMEOUT, PollAnswer};

/// A stream silent this long is taken as dead (the draft: twice the 30 s heartbeat).
pub const DEAD_AFTER: Duration = Duration::from_secs(60);
/// Events asked for per poll in poll mode.
const POLL_BATCH: u64 = crate::mcp::events::MAX_EVENTS as u64;
/// How much longer than its `timeoutMs` a poll may take before it counts as lost.
pub const POLL_SLACK: Duration = Duration::from_secs(30);

/// What [`EventFollow::next`] got.
#[derive(Debug, Clone, PartialEq)]
pub enum Fed {
    /// The follow (re)started. `truncated`: events after the cursor it resumed from were
    /// dropped upstream before it could take them.
    Started { truncated: bool, push: bool },
    /// Events in order (each as the upstream sent it: `eventId`, `name`, `timestamp`, `data`,
    /// its own cursor if it has one); `truncated`: events were dropped just before the first;
    /// `cursor`: the batch's, to resume after its last event (`None`: the upstream gave none).
    Events {
        events: Vec<Value>,
        truncated: bool,
        cursor: Option<String>,
    },
    /// The upstream said its stream is in trouble (`notifications/events/error`); it goes on.
    Trouble(String),
}

/// How it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Stream,
    Poll,
}

/// An open `events/stream`; dropped before its answer came, it is cancelled upstream (which
/// frees its place on the connection).
struct Open {
    _route: StreamRoute,
    rx: mpsc::Receiver<StreamMessage>,
    answer: oneshot::Receiver<Result<ServerResult, rmcp::ServiceError>>,
    cancel: CancelOnDrop,
    live: Arc<Live>,
}

/// One event type of one upstream, followed: see the module docs.
pub struct EventFollow {
    up: Arc<Upstream>,
    name: String,
    arguments: JsonObject,
    cursor: Option<String>,
    mode: Mode,
    open: Option<Open>,
    /// A message read past the end of the last batch, handled first next time.
    pending: Option<StreamMessage>,
    /// In poll mode, whether the first poll (the start) was made: a server that answers with
    /// no cursor must not be started again and again.
    polled: bool,
}

impl EventFollow {
    /// Follows `name` with `arguments` on `up` from now (nothing is asked until
    /// [`EventFollow::next`]).
    pub fn new(up: Arc<Upstream>, name: String, arguments: JsonObject) -> EventFollow {
        EventFollow {
            up,
            name,
            arguments,
            cursor: None,
            mode: Mode::Stream,
            open: None,
            pending: None,
            polled: false,
        }
    }

    /// The cursor after the last event handed out (or the start), `None` before the start.
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// Whether it follows by `events/stream` (else by polls).
    pub fn pushed(&self) -> bool {
        self.mode == Mode::Stream
    }

    /// What came next; opens the follow first when it is not open (the first call, or the
    /// one after a failure). An error the upstream answered (an unknown event type, bad
    /// arguments, no entitlement, a stream `terminated`) is its verdict
    /// ([`UpstreamError::is_verdict`] / `is_answered`); anything else may pass.
    pub async fn next(&mut self) -> Result<Fed, UpstreamError> {
        match self.mode {
            Mode::Poll => self.poll().await,
            Mode::Stream if self.open.is_none() => match self.open().await {
                Err(UpstreamError::NotFound { code: -32601, .. }) => {
                    tracing::info!(server = %self.up.name, event = %self.name,
                        "the server has no events/stream; following by events/poll");
                    self.mode = Mode::Poll;
                    self.poll().await
                }
                other => other,
            },
            Mode::Stream => self.heard().await,
        }
    }

    fn params(&self) -> JsonObject {
        let mut p = JsonObject::new();
        p.insert("name".into(), self.name.clone().into());
        p.insert("arguments".into(), Value::Object(self.arguments.clone()));
        p.insert(
            "cursor".into(),
            self.cursor.clone().map_or(Value::Null, Value::String),
        );
        p
    }

    /// Sends `events/stream` and waits for its `active` (or its refusal).
    async fn open(&mut self) -> Result<Fed, UpstreamError> {
        self.pending = None;
        let up = &self.up;
        let live = up.live().await?;
        let req = ClientRequest::CustomRequest(CustomRequest::new(
            "events/stream",
            Some(Value::Object(self.params())),
        ));
        let handle = live
            .conn
            .send_cancellable_request(req, rmcp::service::PeerRequestOptions::no_options())
            .await
            .map_err(|e| self.up.failure(&live, REQUEST_TIMEOUT, e))?;
        let (route, rx) = up.relay.route_stream(&handle.id);
        let mut open = Open {
            _route: route,
            rx,
            answer: handle.rx,
            cancel: CancelOnDrop::new(up, handle.peer, handle.id, "the follower stopped"),
            live,
        };
        let first = tokio::select! {
            biased;
            m = open.rx.recv() => m,
            a = &mut open.answer => {
                open.cancel.disarm();
                return Err(self.ended(false, &open.live, a));
            }
            _ = tokio::time::sleep(REQUEST_TIMEOUT) => {
                return Err(UpstreamError::TimedOut { server: up.name.clone(), after: REQUEST_TIMEOUT });
            }
        };
        match first {
            Some(m) if m.kind == "active" => {
                if let Some(c) = m.params.get("cursor").and_then(Value::as_str) {
                    self.cursor = Some(c.to_owned());
                }
                let truncated = m.params.get("truncated").and_then(Value::as_bool) == Some(true);
                self.open = Some(open);
                Ok(Fed::Started {
                    truncated,
                    push: true,
                })
            }
            // Something before `active` (its messages were lost before the route took them):
            // start again from the cursor.
            _ => Err(UpstreamError::Unavailable {
                server: up.name.clone(),
                why: "its event stream began with something other than active".into(),
            }),
        }
    }

    /// The open stream's next news.
    async fn heard(&mut self) -> Result<Fed, UpstreamError> {
        let server = self.up.name.clone();
        loop {
            // Cancel-safe: nothing changes before a message is in hand.
            let m = match self.pending.take() {
                Some(m) => m,
                None => {
                    let open = self.open.as_mut().expect("guarded");
                    // Messages before the answer: what came ahead of it is taken first.
                    let m = tokio::select! {
                        biased;
                        m = open.rx.recv() => m,
                        a = &mut open.answer => {
                            open.cancel.disarm();
                            let live = open.live.clone();
                            self.open = None;
                            return Err(self.ended(true, &live, a));
                        }
                        _ = tokio::time::sleep(DEAD_AFTER) => {
                            // Dropped: cancelled upstream.
                            self.open = None;
                            return Err(UpstreamError::Unavailable { server,
                                why: format!("its event stream was silent for {} s", DEAD_AFTER.as_secs()) });
                        }
                    };
                    // None: the route was closed because this follow fell behind its channel.
                    match m {
                        Some(m) => m,
                        None => {
                            self.open = None;
                            return Err(UpstreamError::Unavailable {
                                server,
                                why: "events came faster than they were taken; resuming from the cursor"
                                    .into(),
                            });
                        }
                    }
                }
            };
            let open = self.open.as_mut().expect("guarded");
            match m.kind.as_str() {
                "event" => {
                    let mut first = m.params;
                    let truncated = take_truncated(&mut first);
                    let mut events = vec![first];
                    // What is already here goes in the same batch, up to a gap.
                    while let Ok(mut more) = open.rx.try_recv() {
                        if more.kind != "event" || take_truncated(&mut more.params) {
                            if more.kind == "event" {
                                more.params["truncated"] = true.into();
                            }
                            self.pending = Some(more);
                            break;
                        }
                        events.push(more.params);
                    }
                    let cursor = event_cursor(&events);
                    if let Some(c) = &cursor {
                        self.cursor = Some(c.clone());
                    }
                    return Ok(Fed::Events {
                        events,
                        truncated,
                        cursor,
                    });
                }
                "heartbeat" => {
                    if let Some(c) = m.params.get("cursor").and_then(Value::as_str) {
                        self.cursor = Some(c.to_owned());
                    }
                }
                "error" => {
                    let why = m
                        .params
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given");
                    return Ok(Fed::Trouble(why.to_owned()));
                }
                "terminated" => {
                    let e = &m.params["error"];
                    let code = e.get("code").and_then(Value::as_i64).unwrap_or(-32603) as i32;
                    let message = e
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("the server ended the event stream")
                        .to_owned();
                    self.open = None;
                    return Err(UpstreamError::answered(
                        code,
                        message,
                        e.get("data").cloned(),
                    ));
                }
                _ => {}
            }
        }
    }

    /// The stream's request ended: its answer, or how it failed.
    fn ended(
        &self,
        started: bool,
        live: &Arc<Live>,
        a: Result<Result<ServerResult, rmcp::ServiceError>, oneshot::error::RecvError>,
    ) -> UpstreamError {
        match a {
            Ok(Ok(_)) => UpstreamError::Unavailable {
                server: self.up.name.clone(),
                why: "the server ended the event stream".into(),
            },
            // After `active`, only `terminated` is the server's verdict: an error answer
            // (its connection going away, a stall) ends this stream, not the follow.
            Ok(Err(e)) if started => match self.up.failure(live, REQUEST_TIMEOUT, e) {
                e if e.is_answered() => UpstreamError::Unavailable {
                    server: self.up.name.clone(),
                    why: format!("the server ended the event stream: {e}"),
                },
                e => e,
            },
            Ok(Err(e)) => self.up.failure(live, REQUEST_TIMEOUT, e),
            Err(_) => {
                self.up.reset(live);
                UpstreamError::Unavailable {
                    server: self.up.name.clone(),
                    why: "the connection closed".into(),
                }
            }
        }
    }

    /// One long poll (the first asks from the cursor it has, or from now: it answers where
    /// the log is).
    async fn poll(&mut self) -> Result<Fed, UpstreamError> {
        let first = !self.polled;
        let mut params = self.params();
        if !first {
            params.insert("maxEvents".into(), POLL_BATCH.into());
            params.insert("timeoutMs".into(), (MAX_TIMEOUT.as_millis() as u64).into());
        }
        loop {
            let v = self
                .up
                .custom_within(
                    "events/poll",
                    Value::Object(params.clone()),
                    MAX_TIMEOUT + POLL_SLACK,
                )
                .await?;
            let a = PollAnswer::parse(v).map_err(|why| UpstreamError::Unusable {
                server: self.up.name.clone(),
                why: format!("answered events/poll with something unusable: {why}"),
            })?;
            // The answer's cursor, else the last event's own: where the next poll goes on.
            let batch = a.cursor.clone().or_else(|| event_cursor(&a.events));
            if batch.is_some() {
                self.cursor = batch.clone();
            }
            if first {
                self.polled = true;
                return Ok(Fed::Started {
                    truncated: a.truncated,
                    push: false,
                });
            }
            if !a.events.is_empty() || a.truncated {
                return Ok(Fed::Events {
                    events: a.events,
                    truncated: a.truncated,
                    cursor: batch,
                });
            }
            if !a.has_more {
                // An upstream that cannot hold a poll is not asked in a loop.
                tokio::time::sleep(a.next_poll.max(Duration::from_secs(1)).min(MAX_TIMEOUT)).await;
            }
            params.insert(
                "cursor".into(),
                self.cursor.clone().map_or(Value::Null, Value::String),
            );
        }
    }
}

/// The cursor of the last event in `events` that carries one.
fn event_cursor(events: &[Value]) -> Option<String> {
    events.iter().rev().find_map(cursor_of)
}

/// The cursor an event occurrence carries: a stream's `cursor`, or a herald poll's in
/// `_meta["io.herald/cursor"]`.
pub fn cursor_of(event: &Value) -> Option<String> {
    event
        .get("cursor")
        .or_else(|| {
            event
                .pointer("/_meta")
                .and_then(|m| m.get(EVENT_CURSOR_META))
        })
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Whether the event says a gap came just before it (`truncated: true`); the flag is taken
/// off.
fn take_truncated(event: &mut Value) -> bool {
    event
        .as_object_mut()
        .and_then(|o| o.remove("truncated"))
        .is_some_and(|t| t == Value::Bool(true))
}
