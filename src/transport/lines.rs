//! Newline-delimited JSON-RPC over any byte stream: stdio, a child process's pipes, a QUIC
//! bidirectional stream.
//!
//! rmcp ships such a transport, but it silently drops unparsable and oversized lines. herald's
//! contract is that bad input gets a clear error and loses nothing else, so this one answers a
//! malformed line with a JSON-RPC parse error (`-32700`), a line over the size limit with
//! `-32600` naming the limit, and a well-formed message of the wrong shape with `-32600` carrying
//! its id, and then keeps serving. Only the server side answers: a client logs and closes the
//! connection (a response it skipped would leave its request waiting forever), skipping only
//! notifications it does not know.
//!
//! A message is written in the sender's own task when the stream takes it at once, and
//! otherwise queued for one writer task through a bounded channel (`lines/out.rs`), so
//! concurrent senders never interleave bytes, and a peer that stops reading makes senders wait
//! (which the listen plumbing turns into a stall timeout) rather than growing a buffer. A
//! server then stops reading too. A client reads on (a client and a server each waiting for
//! room would wait on each other for good), up to [`OWED_MAX`] answers to the server's own
//! requests waiting for room, past which it closes the connection; it stops reading once its
//! writer task has stopped. Closing gives up on what is queued after [`CLOSE_WAIT`] without
//! progress.
//!
//! On the server side the transport also keeps the ids of the peer's requests not answered yet
//! ([`with_in_flight_limit`](LineTransport::with_in_flight_limit)): a request reusing an id still
//! in flight is refused with `-32600` naming the id (rmcp would run both and drop the first
//! answer), at most the limit of requests run at once (past it, the transport stops reading
//! until one is answered: back-pressure, nothing dropped), and a response too big for the
//! message limit goes out as an error saying so instead.
//!
//! [`serve`] runs one connection's server ([`ConnServer`]) on such a stream
//! ([`LineTransport::server`]): stdio, each QUIC stream, the in-process pipes.
//!
//! The in-flight bookkeeping (and giving memory back when a burst ends) is `lines/in_flight.rs`;
//! the tests are `lines_tests.rs`, the properties `lines_fuzz.rs`.

use std::marker::PhantomData;
use std::sync::Arc;

use rmcp::model::{JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};

use crate::mcp::admission::ListenTaskIds;
use crate::mcp::conn::ConnServer;
use crate::mcp::limits::Limits;
use rmcp::service::RoleServer;
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};

mod in_flight;
mod out;

use in_flight::{InFlight, InFlightLimit};
use out::{Out, Sent};

/// The byte streams a [`LineTransport`] reads and writes, boxed: the transport and the
/// service loop rmcp runs on it are compiled once for every kind of stream (stdio, QUIC,
/// pipes), not once per stream type.
pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// JSON-RPC transport over a line-framed byte stream. See the module docs.
pub struct LineTransport<Role: ServiceRole> {
    reader: BufReader<Reader>,
    line: Vec<u8>,
    discarding: bool,
    max_line: usize,
    reply_errors: bool,
    /// The way out (`lines/out.rs`); `None` once closed.
    out: Option<Out>,
    pending_error: Option<Vec<u8>>,
    writer_done: Option<tokio::task::JoinHandle<()>>,
    /// Added to every outgoing request's `_meta` (a client's token on QUIC).
    meta_token: Option<(String, String)>,
    /// Server side: a listen's `taskIds` go beside the parsed request ([`ListenTaskIds`]; rmcp
    /// drops the field, the server's acknowledgment echoes them).
    carry_task_ids: bool,
    /// Server side: the peer's requests not answered yet, and how many may run at once.
    in_flight: Option<(Arc<InFlight>, InFlightLimit)>,
    /// Server side: requests read past the limit, oldest first (see [`PARKED_MAX`]).
    parked: std::collections::VecDeque<Parked<RxJsonRpcMessage<Role>>>,
    parked_bytes: usize,
    _role: PhantomData<fn() -> Role>,
}

/// How long closing waits for the writer task to get on with what is queued before it gives
/// up on a peer that no longer reads (any progress starts the wait again).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Client side: answers to the server's own requests (`ping`, `roots/list`, ...) waiting for
/// room in the write queue, past which the server is taken to be flooding requests without
/// reading their answers, and the connection is closed.
const OWED_MAX: usize = out::WRITE_QUEUE;

/// Requests read but not run yet, because the in-flight limit was reached: at most this many
/// (and at most one message limit of bytes) before the transport stops reading. Reading on
/// past the limit a little lets a `notifications/cancelled` through, which may be what frees
/// a place (a `memo_wait` can run for an hour).
const PARKED_MAX: usize = 32;

/// A request read while the connection was at its limit, waiting for a place.
struct Parked<M> {
    msg: M,
    id: RequestId,
    size: usize,
}

impl<Role: ServiceRole> LineTransport<Role> {
    /// `max_line` bounds one incoming message in bytes. `reply_errors` is true on the server
    /// side, where bad input is answered with a JSON-RPC error.
    pub fn new<R, W>(read: R, write: W, max_line: usize, reply_errors: bool) -> Self
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (out, writer_done) = Out::new(Box::new(write));
        LineTransport {
            reader: BufReader::with_capacity(64 * 1024, Box::new(read) as Reader),
            line: Vec::new(),
            discarding: false,
            max_line,
            reply_errors,
            out: Some(out),
            pending_error: None,
            writer_done: Some(writer_done),
            meta_token: None,
            carry_task_ids: false,
            in_flight: None,
            parked: Default::default(),
            parked_bytes: 0,
            _role: PhantomData,
        }
    }

    /// Server side: runs at most `requests` of the peer's requests, holding at most `bytes`
    /// of them, at once (past that the transport stops reading until one is answered, after
    /// [`PARKED_MAX`] more), refuses a request whose id is still in flight, and answers with
    /// an error a response over the message limit. See the module docs.
    pub fn with_in_flight_limit(mut self, requests: usize, bytes: usize) -> Self {
        let limit = InFlightLimit {
            requests: requests.max(1),
            bytes: bytes.max(1),
        };
        self.in_flight = Some((Arc::default(), limit));
        self
    }

    /// Whether requests read past the limit fill their allowance.
    fn parked_full(&self) -> bool {
        self.parked.len() >= PARKED_MAX || self.parked_bytes >= self.max_line
    }

    /// Carries listens' `taskIds` past rmcp's parser (server side): see the field.
    pub fn with_task_ids_carried(mut self) -> Self {
        self.carry_task_ids = true;
        self
    }

    /// Adds `_meta[key] = value` to every request this side sends (how a client presents its
    /// token on a byte-stream transport).
    pub fn with_request_meta(mut self, key: &str, value: String) -> Self {
        self.meta_token = Some((key.to_owned(), value));
        self
    }

    /// Reads one line into `self.line`, never letting it grow past the limit.
    /// Cancel-safe: a partial line stays in `self.line` for the next call.
    async fn read_line(&mut self) -> std::io::Result<LineRead> {
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                return Ok(LineRead::Eof);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let outcome = if self.discarding {
                if newline.is_some() {
                    self.discarding = false;
                }
                None
            } else if self.line.len() + take > self.max_line + 1 {
                // +1: the newline itself does not count against the limit.
                let size = self.line.len() + take;
                self.line.clear();
                self.discarding = newline.is_none();
                Some(LineRead::Oversized(size))
            } else {
                self.line.extend_from_slice(&available[..take]);
                newline.map(|_| LineRead::Line)
            };
            self.reader.consume(take);
            if let Some(o) = outcome {
                return Ok(o);
            }
        }
    }

    /// `item` as one line: with the client's token in a request's `_meta` when it presents
    /// one, and, for the answer to `answered`, an error in its place when it is over the
    /// message limit.
    fn frame(
        &self,
        item: &TxJsonRpcMessage<Role>,
        answered: Option<&RequestId>,
    ) -> std::io::Result<Vec<u8>> {
        let mut bytes = match &self.meta_token {
            None => serde_json::to_vec(item).map_err(std::io::Error::other)?,
            Some((key, value)) => {
                let mut v = serde_json::to_value(item).map_err(std::io::Error::other)?;
                if v.get("method").is_some() && v.get("id").is_some() {
                    if !v.get("params").is_some_and(|p| p.is_object()) {
                        v["params"] = serde_json::json!({});
                    }
                    if !v["params"].get("_meta").is_some_and(|m| m.is_object()) {
                        v["params"]["_meta"] = serde_json::json!({});
                    }
                    v["params"]["_meta"][key.as_str()] = value.clone().into();
                }
                serde_json::to_vec(&v).map_err(std::io::Error::other)?
            }
        };
        if let Some(id) = answered
            && bytes.len() > self.max_line
        {
            tracing::warn!(
                size = bytes.len(),
                limit = self.max_line,
                "refused to send a response over the message limit"
            );
            bytes = too_large(id, bytes.len(), self.max_line);
        }
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// Answers bad input with `code` (server side). Returns false on the client side, where
    /// a bad frame from the server is fatal: a skipped response would leave its request
    /// waiting forever, so the connection is closed instead.
    fn queue_error(&mut self, id: Value, code: i64, message: String) -> bool {
        if !self.reply_errors {
            tracing::warn!(
                code,
                "the server sent a message herald cannot use; closing the connection"
            );
            return false;
        }
        let frame = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": code, "message": message},
        });
        let mut bytes = frame.to_string().into_bytes();
        bytes.push(b'\n');
        self.pending_error = Some(bytes);
        true
    }
}

impl LineTransport<RoleServer> {
    /// The server side of a line-framed connection for a server with `limits`: its message
    /// limit, its listens' `taskIds` carried past rmcp's parser, and at most
    /// [`max_in_flight`](Limits::max_in_flight) of the peer's requests (and
    /// [`max_in_flight_bytes`](Limits::max_in_flight_bytes) of them) run at once.
    pub fn server<R, W>(read: R, write: W, limits: &Limits) -> Self
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        LineTransport::new(read, write, limits.max_message_bytes, true)
            .with_task_ids_carried()
            .with_in_flight_limit(limits.max_in_flight(), limits.max_in_flight_bytes())
    }
}

/// Serves one connection's server (`service`: stdio's, a QUIC stream's, an in-process pipe's)
/// on a line-framed byte stream until the session ends or `ct` is cancelled.
/// Must be called within the runtime (the transport's writer task starts here).
pub fn serve<R, W>(
    service: ConnServer,
    read: R,
    write: W,
    ct: tokio_util::sync::CancellationToken,
) -> impl Future<Output = Result<(), rmcp::service::ServerInitializeError>> + Send + 'static
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let transport = LineTransport::server(read, write, service.limits());
    serve_transport(service, transport, ct)
}

/// [`serve`] on its transport (not generic in the stream: see [`Reader`]).
async fn serve_transport(
    service: ConnServer,
    transport: LineTransport<RoleServer>,
    ct: tokio_util::sync::CancellationToken,
) -> Result<(), rmcp::service::ServerInitializeError> {
    let running = rmcp::ServiceExt::serve_with_ct(service, transport, ct).await?;
    let _ = running.waiting().await;
    Ok(())
}

/// Whether a message may be a listen naming `taskIds` (a byte scan spares other messages a
/// second parse; `\u` catches an escaped key).
fn may_name_task_ids(text: &[u8]) -> bool {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    has(b"taskIds") || has(b"\\u")
}

/// Whether a request is an `events/stream`: a long-lived stream with a budget of its own
/// (the server's), which takes no place among the requests in flight. A byte scan first
/// spares every other request the parse.
fn is_event_stream(text: &[u8]) -> bool {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    (has(b"events/stream") || has(b"\\u"))
        && serde_json::from_slice::<super::jsonrpc::MethodProbe>(text)
            .is_ok_and(|p| p.method.as_deref() == Some("events/stream"))
}

/// A listen's `params.notifications.taskIds`, as sent (the server gates and checks it).
fn listen_task_ids(v: &Value) -> Option<Value> {
    if v.get("method").and_then(Value::as_str) != Some("subscriptions/listen") {
        return None;
    }
    v.get("params")?
        .get("notifications")?
        .get("taskIds")
        .cloned()
}

/// The request a `notifications/cancelled` names (a byte scan spares other notifications the
/// parse).
fn cancelled_request(text: &[u8]) -> Option<RequestId> {
    let needle = b"notifications/cancelled";
    if !text.windows(needle.len()).any(|w| w == needle) {
        return None;
    }
    let v: Value = serde_json::from_slice(text).ok()?;
    if v.get("method")?.as_str()? != "notifications/cancelled" {
        return None;
    }
    serde_json::from_value(v.pointer("/params/requestId")?.clone()).ok()
}

/// The error frame sent in place of a response of `size` bytes over the `max`-byte limit.
fn too_large(id: &RequestId, size: usize, max: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32603,
            "message": format!(
                "the result is {size} bytes, over this server's {max}-byte message limit (--max-message-bytes): ask for less at once, or raise the limit"
            ),
            "data": {"reason": "too_large", "bytes": size, "limit": max},
        },
    }))
    .unwrap_or_default()
}

enum LineRead {
    Line,
    Oversized(usize),
    Eof,
}

impl<Role: ServiceRole> Transport<Role> for LineTransport<Role> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<Role>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // An answer frees its request's place (before it is written: the write queue is
        // bounded on its own).
        let answered = match (&self.in_flight, &item) {
            (Some((flight, _)), JsonRpcMessage::Response(r)) => {
                flight.remove(&r.id);
                Some(r.id.clone())
            }
            (Some((flight, _)), JsonRpcMessage::Error(e)) => {
                if let Some(id) = &e.id {
                    flight.remove(id);
                }
                None
            }
            _ => None,
        };
        // Framed and written here, in the caller's task (rmcp's service loop), when the
        // stream takes it at once: the future rmcp spawns is then already done (`out.rs`).
        let sent = match self.frame(&item, answered.as_ref()) {
            Err(e) => Sent::Failed(e),
            Ok(frame) => match &self.out {
                Some(out) => out.send(frame),
                None => Sent::Failed(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "transport is closed",
                )),
            },
        };
        // A client's answer to a request of the server's is counted while it waits for room.
        let owed = match (&sent, &self.out) {
            (Sent::Waiting(_), Some(out))
                if !self.reply_errors
                    && matches!(item, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_)) =>
            {
                Some(out.owe())
            }
            _ => None,
        };
        async move {
            let _owed = owed;
            match sent {
                Sent::Done => Ok(()),
                Sent::Waiting(waiting) => waiting.sent().await,
                Sent::Failed(e) => Err(e),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<Role>> {
        loop {
            if self.pending_error.is_some() {
                let out = self.out.clone()?;
                // `reserve` is cancel-safe: if this future is dropped the error stays pending.
                let permit = out.reserve().await?;
                if let Some(frame) = self.pending_error.take() {
                    permit.send(frame);
                }
            }
            // Backpressure (server side): while the peer is not taking our output, stop
            // taking its input, so answers to a pipelined flood of requests cannot pile up in
            // memory. A client reads on: a client waiting for room while its server waits for
            // room too (each queue full of what the other has not read) would stall both for
            // good. What a client owes for the server's own requests is bounded below.
            if self.reply_errors
                && let Some(out) = &self.out
            {
                out.room().await?;
            }
            if !self.reply_errors
                && let Some(out) = &self.out
                && out.owed() > OWED_MAX
            {
                tracing::warn!(
                    owed = OWED_MAX,
                    "the server sends requests without reading their answers; closing the connection"
                );
                return None;
            }
            let read = match self.in_flight.clone() {
                Some((flight, limit)) if !self.parked.is_empty() => {
                    if flight.has_room(limit) {
                        let p = self.parked.pop_front()?;
                        self.parked_bytes -= p.size;
                        flight.insert(p.id, p.size);
                        return Some(p.msg);
                    }
                    if self.parked_full() {
                        flight.room(limit).await;
                        continue;
                    }
                    // `read_line` is cancel-safe: a partial line stays for the next call.
                    tokio::select! {
                        _ = flight.room(limit) => continue,
                        read = self.read_line() => read,
                    }
                }
                // A client stops when its writer task has (nothing it sends gets out).
                _ if !self.reply_errors => {
                    let out = self.out.clone()?;
                    tokio::select! {
                        biased;
                        read = self.read_line() => read,
                        () = out.closed() => return None,
                    }
                }
                _ => self.read_line().await,
            };
            match read {
                Ok(LineRead::Line) => {}
                Ok(LineRead::Oversized(size)) => {
                    tracing::warn!(size, limit = self.max_line, "refused an oversized message");
                    let served = self.queue_error(
                        Value::Null,
                        -32600,
                        format!(
                            "message of at least {size} bytes exceeds the {}-byte limit (--max-message-bytes); send smaller messages",
                            self.max_line
                        ),
                    );
                    if !served {
                        return None;
                    }
                    continue;
                }
                Ok(LineRead::Eof) => return None,
                Err(e) => {
                    tracing::debug!(error = %e, "read failed; closing the connection");
                    return None;
                }
            }
            let mut text: &[u8] = &self.line;
            while let [rest @ .., b'\n' | b'\r'] = text {
                text = rest;
            }
            let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                self.line.clear();
                continue;
            }
            let parsed = match self.carry_task_ids {
                true if may_name_task_ids(text) => match serde_json::from_slice::<Value>(text) {
                    Ok(v) => {
                        let ids = listen_task_ids(&v);
                        serde_json::from_value::<RxJsonRpcMessage<Role>>(v).map(|mut m| {
                            if let (Some(ids), JsonRpcMessage::Request(r)) = (ids, &mut m) {
                                rmcp::model::GetExtensions::extensions_mut(&mut r.request)
                                    .insert(ListenTaskIds(ids));
                            }
                            m
                        })
                    }
                    Err(e) => Err(e),
                },
                _ => serde_json::from_slice::<RxJsonRpcMessage<Role>>(text),
            };
            match parsed {
                Ok(msg) => {
                    if let Some((flight, limit)) = self.in_flight.clone() {
                        match &msg {
                            JsonRpcMessage::Request(r)
                                if flight.contains(&r.id)
                                    || self.parked.iter().any(|p| p.id == r.id) =>
                            {
                                let id = serde_json::to_value(&r.id).unwrap_or(Value::Null);
                                self.line.clear();
                                self.queue_error(
                                    id,
                                    -32600,
                                    format!(
                                        "request id {} is already in flight on this connection; give every request its own id",
                                        r.id
                                    ),
                                );
                                continue;
                            }
                            JsonRpcMessage::Request(r) if is_event_stream(text) => {
                                flight.insert_stream(r.id.clone());
                                self.line.clear();
                                return Some(msg);
                            }
                            JsonRpcMessage::Request(r) => {
                                let (id, size) = (r.id.clone(), self.line.len());
                                self.line.clear();
                                if self.parked.is_empty() && flight.has_room(limit) {
                                    flight.insert(id, size);
                                    return Some(msg);
                                }
                                flight.at_limit();
                                self.parked_bytes += size;
                                self.parked.push_back(Parked { msg, id, size });
                                continue;
                            }
                            JsonRpcMessage::Notification(_) => {
                                // A cancelled request gets no answer: its place is free.
                                if let Some(id) = cancelled_request(text) {
                                    flight.remove(&id);
                                }
                            }
                            _ => {}
                        }
                    }
                    self.line.clear();
                    return Some(msg);
                }
                Err(e) => {
                    let value = serde_json::from_slice::<Value>(text);
                    self.line.clear();
                    match value {
                        Err(syntax) => {
                            tracing::debug!(error = %syntax, "unparsable message");
                            self.queue_error(
                                Value::Null,
                                -32700,
                                format!(
                                    "parse error: {syntax}; send one JSON-RPC message per line"
                                ),
                            );
                        }
                        Ok(v) => {
                            // Notifications other than the ones rmcp knows are harmless; skip them.
                            let is_notification =
                                v.get("id").is_none() && v.get("method").is_some();
                            if is_notification {
                                tracing::debug!(error = %e, "ignoring an unknown notification");
                                continue;
                            }
                            match crate::transport::jsonrpc::misshapen(&v) {
                                Some(wrong) => {
                                    self.queue_error(wrong.id, wrong.code, wrong.message);
                                }
                                None => {
                                    // A response's id is ours: never echoed back.
                                    let id = match v.get("method") {
                                        Some(_) => v.get("id").cloned().unwrap_or(Value::Null),
                                        None => Value::Null,
                                    };
                                    self.queue_error(id, -32600, format!("invalid request: {e}"));
                                }
                            }
                        }
                    }
                    // A client closes on a bad frame (`queue_error` said so); a server has
                    // queued its answer.
                    if !self.reply_errors {
                        return None;
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let progress = self.out.take().map(|o| o.progress());
        // The writer task writes what is queued, then ends; a peer that has stopped reading
        // would keep it (and this close) waiting forever, so it is given [`CLOSE_WAIT`] from
        // its last progress. Aborted, it may leave half a line, which the peer's end of
        // stream follows.
        if let (Some(mut done), Some(progress)) = (self.writer_done.take(), progress) {
            let mut seen = progress();
            while tokio::time::timeout(CLOSE_WAIT, &mut done).await.is_err() {
                if progress() == seen {
                    tracing::warn!(
                        "the peer has taken no output for 10 s; closing without the rest"
                    );
                    done.abort();
                    break;
                }
                seen = progress();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "lines_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "lines_fuzz.rs"]
mod fuzz;
