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
//! Writes go through one writer task fed by a bounded channel, so concurrent senders never
//! interleave bytes, and a peer that stops reading makes senders wait (which the listen plumbing
//! turns into a stall timeout) rather than growing a buffer.
//!
//! On the server side the transport also keeps the ids of the peer's requests not answered yet
//! ([`with_in_flight_limit`](LineTransport::with_in_flight_limit)): a request reusing an id still
//! in flight is refused with `-32600` naming the id (rmcp would run both and drop the first
//! answer), at most the limit of requests run at once (past it, the transport stops reading
//! until one is answered: back-pressure, nothing dropped), and a response too big for the
//! message limit goes out as an error saying so instead.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use rmcp::model::{JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};

use crate::mcp::admission::{ListenAcks, TASK_IDS_META_KEY};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Frames queued for the writer task.
const WRITE_QUEUE: usize = 256;

/// JSON-RPC transport over a line-framed byte stream. See the module docs.
pub struct LineTransport<Role: ServiceRole, R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    discarding: bool,
    max_line: usize,
    reply_errors: bool,
    tx: Option<mpsc::Sender<Vec<u8>>>,
    pending_error: Option<Vec<u8>>,
    writer_done: Option<tokio::task::JoinHandle<()>>,
    /// Added to every outgoing request's `_meta` (a client's token on QUIC).
    meta_token: Option<(String, String)>,
    /// Server side: a listen's `taskIds` are moved into its `_meta` on the way in (rmcp
    /// drops the field), and echoed into its acknowledgment on the way out.
    acks: Option<ListenAcks>,
    /// Server side: the peer's requests not answered yet, and how many may run at once.
    in_flight: Option<(Arc<InFlight>, InFlightLimit)>,
    /// Server side: requests read past the limit, oldest first (see [`PARKED_MAX`]).
    parked: std::collections::VecDeque<Parked<RxJsonRpcMessage<Role>>>,
    parked_bytes: usize,
    _role: PhantomData<fn() -> Role>,
}

/// Requests read but not run yet, because the in-flight limit was reached: at most this many
/// (and at most one message limit of bytes) before the transport stops reading. Reading on
/// past the limit a little lets a `notifications/cancelled` through, which may be what frees
/// a place (a `memo_wait` can run for an hour).
const PARKED_MAX: usize = 32;

/// The ids of a peer's requests that have not been answered yet, with their sizes (server
/// side).
#[derive(Default)]
struct InFlight {
    state: Mutex<Running>,
    /// Woken when a request leaves.
    answered: tokio::sync::Notify,
}

#[derive(Default)]
struct Running {
    ids: std::collections::HashMap<RequestId, usize>,
    bytes: usize,
    /// The connection reached its limit since it last had nothing in flight: a burst, whose
    /// memory is given back to the system when it ends ([`give_back_memory`]).
    burst: bool,
}

/// How much of the peer's requests one connection runs at once.
#[derive(Clone, Copy)]
struct InFlightLimit {
    requests: usize,
    bytes: usize,
}

impl InFlight {
    fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has_room(&self, limit: InFlightLimit) -> bool {
        let r = self.running();
        r.ids.len() < limit.requests && r.bytes < limit.bytes
    }

    fn contains(&self, id: &RequestId) -> bool {
        self.running().ids.contains_key(id)
    }

    fn insert(&self, id: RequestId, size: usize) {
        let mut r = self.running();
        if let Some(old) = r.ids.insert(id, size) {
            r.bytes -= old;
        }
        r.bytes += size;
    }

    fn remove(&self, id: &RequestId) {
        let mut r = self.running();
        if let Some(size) = r.ids.remove(id) {
            r.bytes -= size;
            let burst_ended = r.burst && r.ids.is_empty();
            if burst_ended {
                r.burst = false;
            }
            drop(r);
            self.answered.notify_waiters();
            if burst_ended {
                give_back_memory();
            }
        }
    }

    /// A request found no room: the connection is in a burst.
    fn at_limit(&self) {
        self.running().burst = true;
    }

    /// Resolves once there is room under `limit`.
    async fn room(&self, limit: InFlightLimit) {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if self.has_room(limit) {
                return;
            }
            answered.await;
        }
    }
}

/// A connection that goes away in a burst ends it too.
impl Drop for InFlight {
    fn drop(&mut self) {
        let r = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if r.burst {
            give_back_memory();
        }
    }
}

/// Gives the memory the allocator holds free back to the system, once a burst on a connection
/// has ended. glibc's malloc keeps what a burst freed in its arenas and returns only the top of
/// each heap on its own; `malloc_trim` also hands back the free pages inside them (after a
/// 100,000-call flood without the in-flight bound, 1.09 GB went down to 33 MB; with the bound,
/// the release binary's heap after 100,000 small calls is about 4 MB instead of 9, after 2,000
/// of 256 KiB about 24 MB instead of 28-46: the README's Benchmarks). Settings at start were
/// no better: `M_ARENA_MAX=2` gave back little, and a fixed `M_MMAP_THRESHOLD` (or
/// `M_TRIM_THRESHOLD`, which fixes it too) gave back more after big messages but made a flood
/// of them half again slower. Run on the blocking pool, since it walks every arena; one at a
/// time, since a second would find nothing more to return. A burst's end is rare (a flood of
/// 100,000 calls trims a few times), so this costs no request anything.
fn give_back_memory() {
    static TRIMMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    use std::sync::atomic::Ordering;
    #[cfg(test)]
    BURSTS_ENDED.fetch_add(1, Ordering::Relaxed);
    if TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    let trim = || {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim takes each arena's lock itself and only hands free pages back
        // (madvise); it is safe to call from any thread at any time.
        unsafe {
            libc::malloc_trim(0);
        }
        TRIMMING.store(false, Ordering::Release);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(trim)),
        Err(_) => trim(),
    }
}

/// How many times [`give_back_memory`] was called, for the tests.
#[cfg(test)]
static BURSTS_ENDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A request read while the connection was at its limit, waiting for a place.
struct Parked<M> {
    msg: M,
    id: RequestId,
    size: usize,
}

impl<Role, R> LineTransport<Role, R>
where
    Role: ServiceRole,
    R: AsyncRead + Send + Unpin + 'static,
{
    /// `max_line` bounds one incoming message in bytes. `reply_errors` is true on the server
    /// side, where bad input is answered with a JSON-RPC error.
    pub fn new<W>(read: R, write: W, max_line: usize, reply_errors: bool) -> Self
    where
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let writer_done = tokio::spawn(write_loop(write, rx));
        LineTransport {
            reader: BufReader::with_capacity(64 * 1024, read),
            line: Vec::new(),
            discarding: false,
            max_line,
            reply_errors,
            tx: Some(tx),
            pending_error: None,
            writer_done: Some(writer_done),
            meta_token: None,
            acks: None,
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

    /// Carries listens' `taskIds` past rmcp (server side): see the field.
    pub fn with_listen_acks(mut self, acks: ListenAcks) -> Self {
        self.acks = Some(acks);
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

/// Whether a message may be a listen naming `taskIds` (a byte scan spares other messages a
/// second parse; `\u` catches an escaped key).
fn may_name_task_ids(text: &[u8]) -> bool {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    has(b"taskIds") || has(b"\\u")
}

/// Copies a listen's `params.notifications.taskIds` into `params._meta` (as is, whatever its
/// shape: the server gates and checks it), where rmcp keeps it. The field stays where it was
/// too (rmcp ignores it), so a listen rmcp cannot parse for another reason still shows it to
/// the `-32021` gate of the misshapen-request path.
fn carry_task_ids(v: &mut Value) {
    if v.get("method").and_then(Value::as_str) != Some("subscriptions/listen") {
        return;
    }
    let Some(params) = v.get_mut("params").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(ids) = params
        .get("notifications")
        .and_then(Value::as_object)
        .and_then(|n| n.get("taskIds"))
        .cloned()
    else {
        return;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(m) = meta.as_object_mut() {
        m.insert(TASK_IDS_META_KEY.into(), ids);
    }
}

/// Adds `taskIds` to an outgoing listen acknowledgment that has them waiting in `acks`.
fn echo_task_ids(v: &mut Value, acks: &ListenAcks) {
    if v.get("method").and_then(Value::as_str) != Some("notifications/subscriptions/acknowledged") {
        return;
    }
    let Some(sub) = v
        .pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
        .cloned()
    else {
        return;
    };
    if let Some(ids) = acks.take(&sub)
        && let Some(n) = v
            .pointer_mut("/params/notifications")
            .and_then(Value::as_object_mut)
    {
        n.insert("taskIds".into(), ids.into());
    }
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

async fn write_loop<W: AsyncWrite + Unpin>(write: W, mut rx: mpsc::Receiver<Vec<u8>>) {
    let mut w = tokio::io::BufWriter::with_capacity(64 * 1024, write);
    while let Some(frame) = rx.recv().await {
        if w.write_all(&frame).await.is_err() {
            return;
        }
        // Batch whatever else is already queued into the same flush.
        while let Ok(more) = rx.try_recv() {
            if w.write_all(&more).await.is_err() {
                return;
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

impl<Role, R> Transport<Role> for LineTransport<Role, R>
where
    Role: ServiceRole,
    R: AsyncRead + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<Role>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let tx = self.tx.clone();
        let meta = self.meta_token.clone();
        let acks = self.acks.clone().filter(|a| !a.is_empty());
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
        let max = self.max_line;
        async move {
            let mut bytes = match meta {
                None if acks.is_some() => {
                    let mut v = serde_json::to_value(&item).map_err(std::io::Error::other)?;
                    if let Some(acks) = acks {
                        echo_task_ids(&mut v, &acks);
                    }
                    serde_json::to_vec(&v).map_err(std::io::Error::other)?
                }
                None => serde_json::to_vec(&item).map_err(std::io::Error::other)?,
                Some((key, value)) => {
                    let mut v = serde_json::to_value(&item).map_err(std::io::Error::other)?;
                    if v.get("method").is_some() && v.get("id").is_some() {
                        if !v.get("params").is_some_and(|p| p.is_object()) {
                            v["params"] = serde_json::json!({});
                        }
                        if !v["params"].get("_meta").is_some_and(|m| m.is_object()) {
                            v["params"]["_meta"] = serde_json::json!({});
                        }
                        v["params"]["_meta"][key] = value.into();
                    }
                    serde_json::to_vec(&v).map_err(std::io::Error::other)?
                }
            };
            if let Some(id) = answered
                && bytes.len() > max
            {
                tracing::warn!(
                    size = bytes.len(),
                    limit = max,
                    "refused to send a response over the message limit"
                );
                bytes = too_large(&id, bytes.len(), max);
            }
            bytes.push(b'\n');
            match tx {
                Some(tx) => tx.send(bytes).await.map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        "the peer closed the stream",
                    )
                }),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "transport is closed",
                )),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<Role>> {
        loop {
            if self.pending_error.is_some() {
                let tx = self.tx.clone()?;
                // `reserve` is cancel-safe: if this future is dropped the error stays pending.
                let permit = tx.reserve().await.ok()?;
                if let Some(frame) = self.pending_error.take() {
                    permit.send(frame);
                }
            }
            // Backpressure: while the peer is not taking our output, stop taking its input,
            // so responses to a pipelined flood of requests cannot pile up in memory.
            if let Some(tx) = &self.tx
                && tx.capacity() == 0
            {
                let tx = tx.clone();
                drop(tx.reserve().await.ok()?);
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
            let parsed = match &self.acks {
                Some(_) if may_name_task_ids(text) => match serde_json::from_slice::<Value>(text) {
                    Ok(mut v) => {
                        carry_task_ids(&mut v);
                        serde_json::from_value::<RxJsonRpcMessage<Role>>(v)
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
        self.tx = None;
        if let Some(done) = self.writer_done.take() {
            let _ = done.await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::RoleServer;
    use tokio::io::AsyncReadExt;

    async fn run(input: &[u8], max: usize) -> (Vec<String>, String) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (sr, sw) = tokio::io::split(server);
        let (mut cr, mut cw) = tokio::io::split(client);
        let mut t = LineTransport::<RoleServer, _>::new(sr, sw, max, true);
        cw.write_all(input).await.unwrap();
        cw.shutdown().await.unwrap();
        let mut methods = Vec::new();
        while let Some(m) = t.receive().await {
            let v = serde_json::to_value(&m).unwrap();
            methods.push(v["method"].as_str().unwrap_or("?").to_owned());
        }
        t.close().await.unwrap();
        let mut out = String::new();
        cr.read_to_string(&mut out).await.unwrap();
        (methods, out)
    }

    const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;

    #[tokio::test]
    async fn malformed_line_gets_parse_error_and_serving_continues() {
        let input = format!("{{not json\n{PING}\n");
        let (methods, out) = run(input.as_bytes(), 1024).await;
        assert_eq!(methods, ["tools/list"]);
        let err: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(err["error"]["code"], -32700);
        assert_eq!(err["id"], Value::Null);
    }

    #[tokio::test]
    async fn oversized_line_is_refused_and_the_next_one_served() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"x\",\"params\":{{\"p\":\"{}\"}}}}\n",
            "a".repeat(5000)
        );
        let input = format!("{big}{PING}\n");
        let (methods, out) = run(input.as_bytes(), 1024).await;
        assert_eq!(methods, ["tools/list"]);
        let err: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(err["error"]["code"], -32600);
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("1024-byte limit")
        );
    }

    #[tokio::test]
    async fn wrong_shape_gets_invalid_request_with_its_id() {
        let input =
            format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":5,\"method\":3}}\n[1,2]\n{PING}\n");
        let (methods, out) = run(input.as_bytes(), 1024).await;
        assert_eq!(methods, ["tools/list"]);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0]["id"], 7);
        assert_eq!(lines[0]["error"]["code"], -32600);
    }

    #[tokio::test]
    async fn line_split_across_reads_and_crlf() {
        let input = format!("\r\n{PING}\r\n\n{PING}");
        let (methods, _) = run(input.as_bytes(), 1024).await;
        // The last line has no newline before EOF and is incomplete: dropped.
        assert_eq!(methods, ["tools/list"]);
    }

    fn request(id: u64, method: &str) -> String {
        format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{}}}}\n")
    }

    fn answer(id: u64, result: Value) -> TxJsonRpcMessage<RoleServer> {
        serde_json::from_value(serde_json::json!({"jsonrpc":"2.0","id":id,"result":result}))
            .unwrap()
    }

    /// A server transport with an in-flight limit, and the client's ends.
    fn server_with_limit(
        max_line: usize,
        in_flight: usize,
    ) -> (
        LineTransport<RoleServer, tokio::io::ReadHalf<tokio::io::DuplexStream>>,
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    ) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (sr, sw) = tokio::io::split(server);
        let (cr, cw) = tokio::io::split(client);
        let t = LineTransport::<RoleServer, _>::new(sr, sw, max_line, true)
            .with_in_flight_limit(in_flight, 1 << 30);
        (t, cr, cw)
    }

    async fn next_frame(r: &mut BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>) -> Value {
        let mut line = String::new();
        tokio::time::timeout(std::time::Duration::from_secs(10), r.read_line(&mut line))
            .await
            .expect("a frame")
            .unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn requests_past_the_in_flight_limit_wait_until_one_is_answered() {
        let (mut t, _cr, mut cw) = server_with_limit(1024, 2);
        for id in 1..=3 {
            cw.write_all(request(id, "tools/list").as_bytes())
                .await
                .unwrap();
        }
        for _ in 0..2 {
            assert!(t.receive().await.is_some());
        }
        // Two in flight: the third is not read (the paused clock runs the timeout out at once).
        let third = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive()).await;
        assert!(third.is_err(), "a third request was read past the limit");
        t.send(answer(1, serde_json::json!({}))).await.unwrap();
        let third = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive())
            .await
            .expect("answering one frees a place")
            .unwrap();
        assert_eq!(serde_json::to_value(&third).unwrap()["id"], 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_read_past_the_limit_frees_a_place() {
        let (mut t, _cr, mut cw) = server_with_limit(1024, 1);
        cw.write_all(request(1, "memo_wait").as_bytes())
            .await
            .unwrap();
        cw.write_all(request(2, "tools/list").as_bytes())
            .await
            .unwrap();
        cw.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}\n").await.unwrap();
        let one = serde_json::to_value(t.receive().await.unwrap()).unwrap();
        assert_eq!(one["id"], 1);
        // Request 2 waits for a place; the cancel behind it is read and passed on, and frees
        // request 1's place (rmcp sends no answer to a cancelled request).
        let cancel = serde_json::to_value(t.receive().await.unwrap()).unwrap();
        assert_eq!(cancel["method"], "notifications/cancelled");
        let two = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive())
            .await
            .expect("the cancel freed a place")
            .unwrap();
        assert_eq!(serde_json::to_value(&two).unwrap()["id"], 2);
    }

    #[tokio::test(start_paused = true)]
    async fn reading_stops_once_the_parked_requests_fill_their_allowance() {
        let (mut t, _cr, mut cw) = server_with_limit(1 << 16, 1);
        for id in 0..(PARKED_MAX as u64 + 10) {
            cw.write_all(request(id, "tools/list").as_bytes())
                .await
                .unwrap();
        }
        assert!(t.receive().await.is_some());
        let blocked = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive()).await;
        assert!(blocked.is_err());
        assert_eq!(t.parked.len(), PARKED_MAX, "parked past the allowance");
        // Answers let them through in order.
        for id in 0..5u64 {
            t.send(answer(id, serde_json::json!({}))).await.unwrap();
            let next = serde_json::to_value(t.receive().await.unwrap()).unwrap();
            assert_eq!(next["id"], id + 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_given_back_when_a_burst_ends() {
        use std::sync::atomic::Ordering;
        let (mut t, _cr, mut cw) = server_with_limit(1024, 2);
        let burst =
            |t: &LineTransport<RoleServer, _>| t.in_flight.as_ref().unwrap().0.running().burst;
        for id in 1..=2 {
            cw.write_all(request(id, "tools/list").as_bytes())
                .await
                .unwrap();
            assert!(t.receive().await.is_some());
        }
        t.send(answer(1, serde_json::json!({}))).await.unwrap();
        t.send(answer(2, serde_json::json!({}))).await.unwrap();
        assert!(!burst(&t), "within the limit is no burst");
        for id in 3..=5 {
            cw.write_all(request(id, "tools/list").as_bytes())
                .await
                .unwrap();
        }
        assert!(t.receive().await.is_some());
        assert!(t.receive().await.is_some());
        // The fifth finds no room: parked, and the connection is in a burst (the paused clock
        // runs the timeout out at once).
        let fifth = tokio::time::timeout(std::time::Duration::from_secs(60), t.receive()).await;
        assert!(fifth.is_err());
        assert!(burst(&t));
        let before = BURSTS_ENDED.load(Ordering::Relaxed);
        t.send(answer(3, serde_json::json!({}))).await.unwrap();
        assert!(t.receive().await.is_some(), "the fifth gets the place");
        t.send(answer(4, serde_json::json!({}))).await.unwrap();
        assert!(burst(&t), "one still in flight: the burst goes on");
        t.send(answer(5, serde_json::json!({}))).await.unwrap();
        assert!(!burst(&t), "nothing in flight: the burst is over");
        assert!(BURSTS_ENDED.load(Ordering::Relaxed) > before);
    }

    #[tokio::test]
    async fn a_request_reusing_an_id_in_flight_is_refused_by_id() {
        let (mut t, cr, mut cw) = server_with_limit(1024, 8);
        let mut cr = BufReader::new(cr);
        cw.write_all(request(7, "events/poll").as_bytes())
            .await
            .unwrap();
        cw.write_all(request(7, "tools/list").as_bytes())
            .await
            .unwrap();
        cw.write_all(request(8, "tools/list").as_bytes())
            .await
            .unwrap();
        let first = serde_json::to_value(t.receive().await.unwrap()).unwrap();
        assert_eq!(first["method"], "events/poll");
        // The duplicate is answered by the transport, and the next request comes through.
        let next = serde_json::to_value(t.receive().await.unwrap()).unwrap();
        assert_eq!(next["id"], 8);
        let refused = next_frame(&mut cr).await;
        assert_eq!(refused["id"], 7);
        assert_eq!(refused["error"]["code"], -32600);
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("request id 7 is already in flight"),
            "{refused}"
        );
        // Once 7 is answered its id may be used again.
        t.send(answer(7, serde_json::json!({"events": []})))
            .await
            .unwrap();
        assert_eq!(
            next_frame(&mut cr).await["result"]["events"],
            serde_json::json!([])
        );
        cw.write_all(request(7, "tools/list").as_bytes())
            .await
            .unwrap();
        let again = serde_json::to_value(t.receive().await.unwrap()).unwrap();
        assert_eq!(
            (again["id"].clone(), again["method"].clone()),
            (7.into(), "tools/list".into())
        );
    }

    #[tokio::test]
    async fn a_response_over_the_message_limit_goes_out_as_an_error() {
        let (mut t, cr, mut cw) = server_with_limit(256, 8);
        let mut cr = BufReader::new(cr);
        cw.write_all(request(3, "resources/read").as_bytes())
            .await
            .unwrap();
        assert!(t.receive().await.is_some());
        t.send(answer(3, serde_json::json!({"text": "x".repeat(1000)})))
            .await
            .unwrap();
        let frame = next_frame(&mut cr).await;
        assert_eq!(frame["id"], 3);
        assert_eq!(frame["error"]["code"], -32603);
        assert_eq!(frame["error"]["data"]["reason"], "too_large");
        assert_eq!(frame["error"]["data"]["limit"], 256);
        assert!(
            frame["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--max-message-bytes")
        );
        // A small answer goes out as it is.
        cw.write_all(request(4, "tools/list").as_bytes())
            .await
            .unwrap();
        assert!(t.receive().await.is_some());
        t.send(answer(4, serde_json::json!({"tools": []})))
            .await
            .unwrap();
        assert_eq!(
            next_frame(&mut cr).await["result"]["tools"],
            serde_json::json!([])
        );
    }
}

#[cfg(test)]
#[path = "lines_fuzz.rs"]
mod fuzz;
