//! Newline-delimited JSON-RPC over any byte stream: stdio, a child process's pipes, a QUIC
//! bidirectional stream.
//!
//! rmcp ships such a transport, but it silently drops unparsable and oversized lines. herald's
//! contract is that bad input gets a clear error and loses nothing else, so this one answers a
//! malformed line with a JSON-RPC parse error (`-32700`), a line over the size limit with
//! `-32600` naming the limit, and a well-formed message of the wrong shape with `-32600` carrying
//! its id, and then keeps serving. Only the server side answers; a client logs and skips.
//!
//! Writes go through one writer task fed by a bounded channel, so concurrent senders never
//! interleave bytes, and a peer that stops reading makes senders wait (which the listen plumbing
//! turns into a stall timeout) rather than growing a buffer.

use std::marker::PhantomData;

use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};

use crate::mcp::admission::{ListenAcks, TASK_IDS_META_KEY};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Frames queued for the writer task.
const WRITE_QUEUE: usize = 256;

/// JSON-RPC transport over a line-framed byte stream. See the module docs.
pub struct LineTransport<Role, R> {
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
    _role: PhantomData<fn() -> Role>,
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
            _role: PhantomData,
        }
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
            match self.read_line().await {
                Ok(LineRead::Line) => {}
                Ok(LineRead::Oversized(size)) => {
                    tracing::warn!(size, limit = self.max_line, "refused an oversized message");
                    let served = self.queue_error(
                        Value::Null,
                        -32600,
                        format!(
                            "message of at least {size} bytes exceeds the {}-byte limit; send smaller messages",
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
                            let id = v.get("id").cloned().unwrap_or(Value::Null);
                            self.queue_error(id, -32600, format!("invalid request: {e}"));
                        }
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
}
