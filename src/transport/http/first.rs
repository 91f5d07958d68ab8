//! A connection's first request, read ahead of hyper: when it is a plain listen
//! ([`plain_listen`](super::plain_listen)), herald answers it on the socket itself and only
//! hands the connection to hyper once the stream is over.
//!
//! Why: an idle listen stream held by hyper costs its connection hyper's 8 KiB read buffer and
//! 8 KiB write buffer, a response body task and a channel, about 25 KiB in all; 10,000 of them
//! were 267 MB. Here a stream is one task holding the socket, the delivery loop and a small
//! read buffer for noticing the client leave. Listens mostly come first on their own
//! connection (an HTTP/1.1 response that never ends occupies the connection), so this is where
//! nearly all of them land; a listen arriving later on a kept-alive connection, or in any shape
//! other than the plain one, goes through hyper and [`listen_gate`](super::listen_gate) as
//! before, to the same delivery loop.
//!
//! The bytes read here are never lost: anything that is not a plain listen goes to hyper with
//! them in front of the socket ([`Prefixed`]). A plain listen is opened here, once
//! ([`SourceServer::open`](crate::mcp::server::SourceServer::open)); one whose filter or
//! admission fails gets the gate's error answer ([`super::listen_refusal`], with the status
//! rmcp gives it), written here, and the connection goes on to hyper. Besides that, this path
//! writes no error of its own but the `408` of a body that came too late.
//!
//! The connection's deadlines hold here as they do under hyper ([`Timeouts`]): the idle
//! timeout until the first byte, the header timeout from it to the end of the head, the
//! body timeout from there to the end of a listen's body (then `408` and the connection
//! closes). A stream answered here has none: it is a response in flight.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::conn::{Activity, Timeouts, body_timeout_bytes};
use super::{Gate, MCP_PATH};
use crate::mcp::admission::ListenFilter;
use crate::mcp::caller::{Caller, PeerAddr};
use crate::mcp::listen::Undelivered;

/// A first request head longer than this goes to hyper as it is (hyper has its own limit).
const MAX_HEAD: usize = 16 * 1024;

/// Bytes a client may send on a connection while its listen stream runs (HTTP/1.1
/// pipelining, which no client does beside a response that never ends); they are served by
/// hyper once the stream ends. More ends the stream.
const MAX_PIPELINED: usize = 4 * 1024;

/// What reading the first request found.
pub(super) enum First {
    /// The client went away (or never sent a byte before the timeout).
    Gone,
    /// Not herald's to answer: serve the connection with hyper, these bytes first.
    Hyper(Vec<u8>),
    /// The stream was answered; the connection goes on to hyper with these bytes first.
    Answered(Vec<u8>),
    /// The stream was answered and the connection is done.
    Done,
}

/// Reads the connection's first request and, when it is a plain listen that is admitted,
/// answers it: see the module documentation.
pub(super) async fn serve_first(
    stream: &TcpStream,
    gate: &Gate,
    peer: std::net::SocketAddr,
    timeouts: Timeouts,
    shutdown: &CancellationToken,
) -> First {
    let limits = gate.server.limits();
    let mut buf = Vec::with_capacity(1024);
    let read = tokio::select! {
        _ = shutdown.cancelled() => None,
        read = read_listen(stream, &mut buf, limits.max_message_bytes, timeouts) => Some(read),
    };
    let head = match read {
        // A request begun before the shutdown is hyper's to finish (its drain answers it).
        None if buf.is_empty() => return First::Gone,
        None => return First::Hyper(buf),
        Some(Read::Gone) => return First::Gone,
        Some(Read::Late) => {
            debug!(
                timeout_ms = timeouts.body.as_millis(),
                "a request body came too late"
            );
            let writer = Writer::new(stream);
            let answer = writer.write(Some(body_timeout_bytes(timeouts.body).into()));
            let _ = tokio::time::timeout(limits.stall_timeout, answer).await;
            return First::Done;
        }
        Some(Read::Other) => return First::Hyper(buf),
        Some(Read::Listen(head)) => head,
    };
    let end = head.body.end;
    if buf.len() - end > MAX_PIPELINED {
        // More sent behind the listen than a stream keeps: hyper's to serve, in order.
        return First::Hyper(buf);
    }
    let admitted = match admit(gate, peer, &buf, head).await {
        None => return First::Hyper(buf),
        Some(Ok(admitted)) => admitted,
        Some(Err(refused)) => {
            let rest = buf[end..].to_vec();
            return refuse(stream, refused, rest, limits.stall_timeout).await;
        }
    };
    // What the client sent after the listen (pipelined) is hyper's once the stream ends; the
    // rest of the buffer goes now, before the stream's long wait.
    let pipelined = buf[end..].to_vec();
    drop(buf);
    answer(stream, gate, admitted, pipelined, shutdown).await
}

/// The parsed head of a request that may be a plain listen.
struct Head {
    path: String,
    headers: HeaderMap,
    /// Where the body starts in the buffer, and its length.
    body: std::ops::Range<usize>,
}

enum Read {
    /// The client left, sent nothing within the idle timeout, or did not finish its head
    /// within the header timeout.
    Gone,
    /// The head of a plain listen came, its body not within the body timeout.
    Late,
    Other,
    Listen(Head),
}

/// Reads into `buf` until the first request is known not to be a plain listen (its head says
/// so), or is read whole, each part by its deadline in `timeouts`.
async fn read_listen(
    stream: &TcpStream,
    buf: &mut Vec<u8>,
    max_body: usize,
    timeouts: Timeouts,
) -> Read {
    let mut deadline = tokio::time::Instant::now() + timeouts.idle;
    let head = loop {
        let begun = !buf.is_empty();
        match tokio::time::timeout_at(deadline, read_some(stream, buf)).await {
            Err(_) => return Read::Gone,
            Ok(Ok(0) | Err(_)) if buf.is_empty() => return Read::Gone,
            Ok(Ok(0) | Err(_)) => return Read::Other,
            Ok(Ok(_)) => {}
        }
        if !begun {
            deadline = tokio::time::Instant::now() + timeouts.header;
        }
        if !b"POST ".starts_with(&buf[..buf.len().min(5)]) {
            return Read::Other;
        }
        match parse_head(buf, max_body) {
            Parsed::Partial if buf.len() < MAX_HEAD => continue,
            Parsed::Partial | Parsed::Other => return Read::Other,
            Parsed::Listen(head) => break head,
        }
    };
    let deadline = tokio::time::Instant::now() + timeouts.body;
    while buf.len() < head.body.end {
        match tokio::time::timeout_at(deadline, read_some(stream, buf)).await {
            Err(_) => return Read::Late,
            Ok(Ok(0) | Err(_)) => return Read::Other,
            Ok(Ok(_)) => {}
        }
    }
    Read::Listen(head)
}

/// One read into `buf`'s spare room (grown when full).
async fn read_some(stream: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 512 {
        buf.reserve(buf.capacity().max(1024));
    }
    loop {
        stream.readable().await?;
        match stream.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

enum Parsed {
    Partial,
    Other,
    Listen(Head),
}

/// The head in `buf`, when it may be a plain listen: `POST /mcp` over HTTP/1.1, a
/// `Content-Length` body of at most `max_body` bytes, `Mcp-Method: subscriptions/listen`, no
/// `Transfer-Encoding`, `Expect`, `Upgrade` or `Connection` header (those stay hyper's).
fn parse_head(buf: &[u8], max_body: usize) -> Parsed {
    let mut slots = [httparse::EMPTY_HEADER; 48];
    let mut req = httparse::Request::new(&mut slots);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    let path = req.path.unwrap_or_default();
    let ours = req.method == Some("POST")
        && req.version == Some(1)
        && (path == MCP_PATH
            || path
                .strip_prefix(MCP_PATH)
                .is_some_and(|q| q.starts_with('?')));
    // The method first: every other request's head goes to hyper with no more work here.
    let listen = req
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("mcp-method") && h.value == b"subscriptions/listen");
    if !ours || !listen {
        return Parsed::Other;
    }
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    let mut length = None;
    for h in req.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            return Parsed::Other;
        };
        let Ok(value) = HeaderValue::from_bytes(h.value) else {
            return Parsed::Other;
        };
        match name.as_str() {
            "transfer-encoding" | "expect" | "upgrade" | "connection" => return Parsed::Other,
            "content-length" => {
                // Digits only, as hyper reads it (no sign, no spaces).
                let v = value.as_bytes();
                let digits = !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit);
                let n = digits
                    .then(|| std::str::from_utf8(v).ok()?.parse::<usize>().ok())
                    .flatten();
                if length.is_some() || n.is_none() {
                    return Parsed::Other;
                }
                length = n;
            }
            _ => {}
        }
        headers.append(name, value);
    }
    match length {
        Some(n) if n <= max_body => Parsed::Listen(Head {
            path: path.to_owned(),
            headers,
            body: head_len..head_len + n,
        }),
        _ => Parsed::Other,
    }
}

/// An admitted plain listen, ready to answer.
struct Admitted {
    listen: crate::mcp::admission::AdmittedListen,
    id: rmcp::model::RequestId,
    ack: crate::mcp::listen::Ack,
}

/// A plain listen refused before its acknowledgment (its filter, its admission): the request
/// id and the error, answered as the gate answers it ([`super::listen_refused`]).
struct Refused {
    id: Value,
    error: rmcp::model::ErrorData,
    /// The request asked for the connection to close after its answer.
    close: bool,
}

/// The gate's checks and the opening ([`SourceServer::open`](crate::mcp::server::SourceServer::open))
/// of a plain listen; `None` for anything the gate must see (refused Host or Origin, not a
/// plain listen, a caller without known credentials).
async fn admit(
    gate: &Gate,
    peer: std::net::SocketAddr,
    buf: &[u8],
    head: Head,
) -> Option<Result<Admitted, Refused>> {
    let body = &buf[head.body.clone()];
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(head.path)
        .body(())
        .ok()?;
    *request.headers_mut() = head.headers;
    request.extensions_mut().insert(PeerAddr(peer));
    let (parts, ()) = request.into_parts();
    if !super::json_content(&parts.headers) || !gate.allow.admits(&parts.uri, &parts.headers) {
        return None;
    }
    let id = super::plain_listen(&parts.headers, body, &gate.server)?;
    let mut caller = Caller::from_parts(&parts);
    if gate.server.authenticates(&mut caller).await != crate::mcp::source::Authentication::Known {
        return None; // the gate answers it: 401
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    let refused = |error| {
        let close = parts
            .headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("close"));
        let id = serde_json::to_value(&id).unwrap_or(Value::Null);
        Some(Err(Refused { id, error, close }))
    };
    let filter = match ListenFilter::from_params(v.get("params")) {
        Ok(f) => f,
        Err(e) => return refused(e),
    };
    let conn = gate
        .budgets
        .for_listen(&gate.server, &caller, &parts.headers, peer.ip());
    match gate.server.open(&caller, &filter, &conn).await {
        Ok((ack, listen)) => Some(Ok(Admitted { listen, id, ack })),
        Err(e) => refused(e),
    }
}

/// Answers a refused plain listen with the gate's JSON-RPC error (as hyper would write it),
/// then hands the connection to hyper with what the client sent after it.
async fn refuse(stream: &TcpStream, refused: Refused, rest: Vec<u8>, stall: Duration) -> First {
    let (status, body) = super::listen_refusal(refused.id, refused.error);
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}date: {}\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        if refused.close { "connection: close\r\n" } else { "" },
        httpdate::fmt_http_date(std::time::SystemTime::now())
    )
    .into_bytes();
    answer.extend_from_slice(body.as_bytes());
    let writer = Writer::new(stream);
    let sent = tokio::time::timeout(stall, writer.write(Some(answer.into()))).await;
    if !matches!(sent, Ok(Ok(()))) || refused.close {
        return First::Done;
    }
    First::Answered(rest)
}

/// The response head of a listen's SSE stream, chunked (the `date` header follows).
const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
cache-control: no-cache\r\nx-accel-buffering: no\r\ntransfer-encoding: chunked\r\n";

/// A keep-alive comment as a chunk.
const KEEP_ALIVE_CHUNK: &[u8] = b"3\r\n:\n\n\r\n";

/// `data` as one HTTP/1.1 chunk.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.reserve(data.len() + 2);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The socket's write side, shared by the notifications and the keep-alive comments: one
/// write at a time, and a write cut off midway (a stall deadline, a shutdown) finished by
/// the next one before anything else, so chunks are never torn.
struct Writer<'a> {
    stream: &'a TcpStream,
    state: tokio::sync::Mutex<Unwritten>,
}

#[derive(Default)]
struct Unwritten {
    /// The chunk being written and how much of it is out.
    rest: Option<(Bytes, usize)>,
    /// When the last write finished (a keep-alive comment only follows 15 s of quiet).
    last: Option<tokio::time::Instant>,
}

impl<'a> Writer<'a> {
    fn new(stream: &'a TcpStream) -> Writer<'a> {
        Writer {
            stream,
            state: tokio::sync::Mutex::new(Unwritten::default()),
        }
    }

    /// Writes what an earlier write left, then `next`. Cancel-safe: dropped midway, what is
    /// left is kept for the next call.
    async fn write(&self, next: Option<Bytes>) -> io::Result<()> {
        let mut state = self.state.lock().await;
        let mut next = next;
        loop {
            let Some((bytes, done)) = state.rest.as_mut() else {
                match next.take() {
                    Some(b) => {
                        state.rest = Some((b, 0));
                        continue;
                    }
                    None => {
                        state.last = Some(tokio::time::Instant::now());
                        return Ok(());
                    }
                }
            };
            if *done == bytes.len() {
                state.rest = None;
                continue;
            }
            self.stream.writable().await?;
            match self.stream.try_write(&bytes[*done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => *done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// When the last write finished.
    async fn last_write(&self) -> Option<tokio::time::Instant> {
        self.state.lock().await.last
    }
}

/// A listen's notifications as chunks written straight to the socket.
struct RawOut<'w, 'a> {
    writer: &'w Writer<'a>,
    gone: CancellationToken,
    /// Its events, each URI's notification kept as a chunk.
    events: super::events::StreamEvents,
}

impl RawOut<'_, '_> {
    async fn send(&self, chunk: Bytes) -> Result<(), Undelivered> {
        self.writer.write(Some(chunk)).await.map_err(|_| {
            self.gone.cancel();
            Undelivered::Closed
        })
    }
}

impl crate::mcp::listen::ListenOut for RawOut<'_, '_> {
    async fn updated(
        &mut self,
        uri: &str,
        carried: Option<serde_json::Value>,
    ) -> Result<(), Undelivered> {
        let event = self.events.updated(uri, carried, |e| chunk(&e).into());
        self.send(event).await
    }

    async fn list_changed(&mut self, list: crate::mcp::lists::List) -> Result<(), Undelivered> {
        self.send(chunk(&self.events.list_changed(list)).into())
            .await
    }

    async fn task(&mut self, task: rmcp::model::DetailedTask) -> Result<(), Undelivered> {
        self.send(chunk(&self.events.task(task)).into()).await
    }

    fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.gone.clone().cancelled_owned()
    }

    fn is_closed(&self) -> bool {
        self.gone.is_cancelled()
    }
}

/// Answers an admitted listen on `stream`: the head and acknowledgment, the delivery loop
/// beside a reader that notices the client leave (and keeps what it pipelines, after
/// `pipelined`) and a keep-alive comment after 15 s of quiet, then the final result or error
/// and the last chunk.
async fn answer(
    stream: &TcpStream,
    gate: &Gate,
    admitted: Admitted,
    mut pipelined: Vec<u8>,
    shutdown: &CancellationToken,
) -> First {
    let Admitted { listen, id, ack } = admitted;
    let stall = gate.server.limits().stall_timeout;
    let id_json = serde_json::to_value(&id).expect("an id serializes");
    let mut start = format!(
        "{SSE_HEAD}date: {}\r\n\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
    )
    .into_bytes();
    start.extend_from_slice(&chunk(&super::events::ack_event(&id, &ack)));
    let writer = Writer::new(stream);
    if !matches!(
        tokio::time::timeout(stall, writer.write(Some(start.into()))).await,
        Ok(Ok(()))
    ) {
        return First::Done;
    }
    let gone = CancellationToken::new();
    let mut out = RawOut {
        writer: &writer,
        gone: gone.clone(),
        events: super::events::StreamEvents::new(id_json),
    };
    let watch = watch_client(&writer, &mut pipelined, stall);
    let ended = tokio::select! {
        ended = gate.server.deliver(listen, &mut out) => ended,
        () = watch => {
            gone.cancel();
            return First::Done;
        }
    };
    if gone.is_cancelled() {
        return First::Done;
    }
    drop(out);
    // What a cut-off write left goes first (the writer finishes it), then the end.
    let mut last = chunk(&super::events::final_event(&gate.server, id, ended));
    last.extend_from_slice(b"0\r\n\r\n");
    if !matches!(
        tokio::time::timeout(stall, writer.write(Some(last.into()))).await,
        Ok(Ok(()))
    ) || shutdown.is_cancelled()
    {
        return First::Done;
    }
    First::Answered(pipelined)
}

/// Resolves when the client has gone (end of stream, a read error, more than
/// [`MAX_PIPELINED`] bytes sent meanwhile, or a keep-alive comment it took nothing of within
/// `stall`); keeps what the client sends meanwhile in `pipelined` and writes a keep-alive
/// comment after 15 s with no write.
async fn watch_client(writer: &Writer<'_>, pipelined: &mut Vec<u8>, stall: Duration) {
    let stream = writer.stream;
    let every = super::sse::SSE_KEEP_ALIVE;
    let mut due = tokio::time::Instant::now() + every;
    loop {
        tokio::select! {
            readable = stream.readable() => {
                if readable.is_err() {
                    return;
                }
                let mut scratch = [0u8; 256];
                match stream.try_read(&mut scratch) {
                    Ok(0) => return,
                    Ok(n) => {
                        pipelined.extend_from_slice(&scratch[..n]);
                        if pipelined.len() > MAX_PIPELINED {
                            debug!("client sent too much beside its listen stream; closing");
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
            () = tokio::time::sleep_until(due) => {
                if let Some(last) = writer.last_write().await
                    && last + every > tokio::time::Instant::now()
                {
                    due = last + every;
                    continue;
                }
                let sent = tokio::time::timeout(
                    stall,
                    writer.write(Some(Bytes::from_static(KEEP_ALIVE_CHUNK))),
                )
                .await;
                if !matches!(sent, Ok(Ok(()))) {
                    return;
                }
                due = tokio::time::Instant::now() + every;
            }
        }
    }
}

/// A socket with bytes already read from it in front: what hyper is handed after
/// [`serve_first`] read ahead. Every read that brings bytes is told to the connection's
/// [`Activity`] (the next request has begun).
pub(super) struct Prefixed {
    prefix: Bytes,
    stream: TcpStream,
    activity: std::sync::Arc<Activity>,
}

impl Prefixed {
    pub(super) fn new(
        prefix: Vec<u8>,
        stream: TcpStream,
        activity: std::sync::Arc<Activity>,
    ) -> Prefixed {
        Prefixed {
            prefix: Bytes::from(prefix),
            stream,
            activity,
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        read
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "first_tests.rs"]
mod tests;
