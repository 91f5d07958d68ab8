//! HTTP/1.1 connections to one upstream (plain, or TLS for `https://`), each driven in the
//! task of the call that holds it: the wire of the gateway's direct calls ([`HttpCalls`]).
//!
//! hyper's client connection is a future that does the connection's I/O. reqwest, and
//! hyper-util's pool under it, run it on a task of its own, so a call's request and its answer
//! each pass between two tasks. Measured in `cargo bench --bench upstream` (a loopback
//! `memo_set`): reqwest's client added 0.14-0.15 ms to a raw exchange, hyper with its
//! connection on a task of its own 0.06-0.07 ms, hyper driven in the caller's task 0.02 ms.
//!
//! So here a call takes a connection out of the pool (or opens one), drives it while it sends
//! and reads, and puts it back once its answer is read to the end. An idle connection has no
//! task at all: one the server closed meanwhile shows it at once when taken (its end of
//! stream is already there, and one poll reads it), and the call takes another; a request
//! that still finds it closed before a byte of it was written goes on a new connection. A
//! call dropped midway drops its connection, closing it, which the upstream takes as a
//! cancel.
//!
//! An `https://` upstream's connections are TLS over the same TCP (tokio-rustls), trusting
//! what reqwest's client trusts ([`mcp_tls_config`]: the system's CA store through the
//! platform verifier, none when the system has no store) and offering HTTP/1.1 alone by ALPN.
//!
//! [`mcp_tls_config`]: crate::transport::client::mcp_tls_config
//!
//! [`HttpCalls`]: super::http::HttpCalls

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::sync::Recover;
use crate::transport::client::{CONNECT_TIMEOUT, POOL_IDLE, POOL_MAX_IDLE, TCP_KEEPALIVE};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

type Conn = http1::Connection<TokioIo<Stream>, Full<Bytes>>;

/// A connection's bytes: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// TLS for an `https://` upstream: the client config and the name the certificate must
/// carry.
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
}

/// Why a request got no answer.
#[derive(Debug)]
pub enum WireError {
    Connect(std::io::Error),
    Http(hyper::Error),
    /// The connection ended with the answer unread.
    Closed,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Connect(e) => write!(f, "cannot connect: {e}"),
            WireError::Http(e) => e.fmt(f),
            WireError::Closed => f.write_str("the connection closed before the answer"),
        }
    }
}

impl std::error::Error for WireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WireError::Connect(e) => Some(e),
            WireError::Http(e) => Some(e),
            WireError::Closed => None,
        }
    }
}

/// One connection: its request half and the future that does its I/O (`None` once that
/// future ended: a future is not polled again after its end).
struct Line {
    send: http1::SendRequest<Full<Bytes>>,
    conn: Option<Pin<Box<Conn>>>,
}

impl Line {
    /// Whether the connection is closed (read once, without waiting: the end of stream of a
    /// server that closed it while idle is already there).
    fn closed(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        if let Some(conn) = &mut self.conn
            && conn.as_mut().poll(&mut cx).is_ready()
        {
            self.conn = None;
        }
        // (Not ready: still writing a request the server answered early, or closing.)
        self.conn.is_none() || self.send.is_closed() || !self.send.is_ready()
    }
}

/// Runs `f` while driving `conn`. `None` when the connection ended and left `f` unfinished.
///
/// A future of its own, not an `async fn`: an `async fn` keeps its argument in its state and
/// the pinned copy beside it, so `f` would be held twice (as `runtime::in_place` once did).
fn drive<F: Future>(conn: &mut Option<Pin<Box<Conn>>>, f: F) -> Drive<'_, F> {
    Drive { conn, f }
}

pin_project_lite::pin_project! {
    /// The future [`drive`] returns.
    #[must_use = "futures do nothing unless polled"]
    struct Drive<'c, F> {
        conn: &'c mut Option<Pin<Box<Conn>>>,
        #[pin]
        f: F,
    }
}

impl<F: Future> Future for Drive<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut f = this.f;
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        let Some(c) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if c.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        **this.conn = None;
        // What the connection did last may have finished `f` (or failed it).
        Poll::Ready(match f.poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    }
}

/// The idle connections to one upstream, oldest first, each with when it went idle.
type Idle = std::sync::Mutex<Vec<(Line, Instant)>>;

/// The idle connections to one upstream.
pub struct Wire {
    host: String,
    port: u16,
    /// For `https://`.
    tls: Option<Tls>,
    idle: Arc<Idle>,
    /// Whether a sweep runs: it closes connections idle past [`POOL_IDLE`], every
    /// [`POOL_IDLE`], until none is left.
    sweeping: Arc<AtomicBool>,
}

/// Closes the connections idle past [`POOL_IDLE`] (the oldest are first), every
/// [`POOL_IDLE`], until none is left or the wire is gone.
async fn sweep(idle: std::sync::Weak<Idle>, sweeping: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(POOL_IDLE).await;
        let Some(idle) = idle.upgrade() else { return };
        drop(stale(&idle));
        if idle.locked().is_empty() {
            sweeping.store(false, Ordering::Release);
            // A connection put back meanwhile started no sweep of its own: this one goes on.
            if idle.locked().is_empty() || sweeping.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }
}

/// Takes the connections idle past [`POOL_IDLE`] out of `idle` (to be closed outside its lock).
fn stale(idle: &Idle) -> Vec<(Line, Instant)> {
    let mut idle = idle.locked();
    let n = idle.partition_point(|(_, since)| since.elapsed() >= POOL_IDLE);
    idle.drain(..n).collect()
}

/// An answer's body, read on its connection; the connection goes back to the pool when the
/// body was read to its end.
pub struct Body<'a> {
    wire: &'a Wire,
    line: Option<Line>,
    body: Incoming,
    ended: bool,
}

impl Body<'_> {
    /// The next piece of the body; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, WireError> {
        let Body { line, body, .. } = self;
        let Some(Line { conn, .. }) = line.as_mut() else {
            return Err(WireError::Closed);
        };
        loop {
            match drive(conn, body.frame()).await {
                None => return Err(WireError::Closed),
                Some(None) => {
                    self.ended = true;
                    return Ok(None);
                }
                Some(Some(Err(e))) => return Err(WireError::Http(e)),
                Some(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}

impl Drop for Body<'_> {
    fn drop(&mut self) {
        if let Some(line) = self.line.take()
            && self.ended
        {
            self.wire.put_back(line);
        }
    }
}

impl Wire {
    /// The wire to `url`, when it is `http://` or `https://` with no user name or password in
    /// it (reqwest sends those as Basic credentials) and no proxy for its scheme is set in the
    /// environment (reqwest goes through it).
    pub fn new(url: &reqwest::Url) -> Option<Wire> {
        let proxy_vars: [&str; 4] = if url.scheme() == "https" {
            ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]
        } else {
            ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        };
        let proxied = proxy_vars
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        if proxied {
            return None;
        }
        Wire::trusting(url, crate::transport::client::mcp_tls_config)
    }

    /// [`Wire::new`] but for the environment's proxies, an `https://` upstream's TLS from
    /// `tls`.
    fn trusting(
        url: &reqwest::Url,
        tls: impl FnOnce() -> Arc<rustls::ClientConfig>,
    ) -> Option<Wire> {
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        let plain = url.username().is_empty() && url.password().is_none();
        plain.then_some(())?;
        let host = url.host_str()?.trim_matches(['[', ']']).to_owned();
        let tls = match https {
            false => None,
            true => Some(Tls {
                name: rustls::pki_types::ServerName::try_from(host.clone()).ok()?,
                connector: tokio_rustls::TlsConnector::from(tls()),
            }),
        };
        Some(Wire {
            port: url.port_or_known_default()?,
            host,
            tls,
            idle: Arc::default(),
            sweeping: Arc::default(),
        })
    }

    /// Sends the request `request` makes, on an idle connection or a new one: the answer's
    /// head, and its body to read.
    pub async fn send(
        &self,
        request: impl Fn() -> hyper::Request<Full<Bytes>>,
    ) -> Result<(http::response::Parts, Body<'_>), WireError> {
        let mut pooled = self.take();
        loop {
            let reused = pooled.is_some();
            let mut line = match pooled.take() {
                Some(line) => line,
                None => self.connect().await?,
            };
            let Line { send, conn } = &mut line;
            let answer = drive(conn, async {
                // (An error here or a request handed back: not a byte of it was written.)
                send.ready().await.map_err(|e| (e, true))?;
                send.try_send_request(request()).await.map_err(|mut e| {
                    let unsent = e.take_message().is_some();
                    (e.into_error(), unsent)
                })
            })
            .await;
            match answer {
                Some(Ok(response)) => {
                    let (head, body) = response.into_parts();
                    let body = Body {
                        wire: self,
                        line: Some(line),
                        body,
                        ended: false,
                    };
                    return Ok((head, body));
                }
                // A pooled connection the server closed before the request went: a new one.
                Some(Err((_, true))) if reused => continue,
                Some(Err((e, _))) => return Err(WireError::Http(e)),
                None => return Err(WireError::Closed),
            }
        }
    }

    /// The newest idle connection still open. (Each is looked at, and a closed one dropped,
    /// outside the lock.)
    fn take(&self) -> Option<Line> {
        loop {
            let (mut line, since) = self.idle.locked().pop()?;
            if since.elapsed() < POOL_IDLE && !line.closed() {
                return Some(line);
            }
        }
    }

    fn put_back(&self, mut line: Line) {
        if line.closed() {
            return;
        }
        {
            let mut idle = self.idle.locked();
            if idle.len() >= POOL_MAX_IDLE {
                return;
            }
            idle.push((line, Instant::now()));
        }
        // (Outside a runtime, a body dropped at its end: no sweep, and the flag stays down.)
        if let Ok(rt) = tokio::runtime::Handle::try_current()
            && !self.sweeping.swap(true, Ordering::AcqRel)
        {
            rt.spawn(sweep(Arc::downgrade(&self.idle), self.sweeping.clone()));
        }
    }

    async fn connect(&self) -> Result<Line, WireError> {
        let open = async {
            let tcp = crate::transport::dns::connect_tcp(&self.host, self.port).await?;
            let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
            socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive)?;
            Ok::<_, std::io::Error>(match &self.tls {
                None => Stream::Plain(tcp),
                // (A TLS failure is an io error around rustls' own, which names it.)
                Some(t) => Stream::Tls(Box::new(t.connector.connect(t.name.clone(), tcp).await?)),
            })
        };
        // (The handshake counts in the connect's time, as in reqwest's.)
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, open)
            .await
            .map_err(|_| {
                WireError::Connect(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
                ))
            })?
            .map_err(WireError::Connect)?;
        let (send, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(WireError::Http)?;
        tracing::debug!(upstream = %format_args!("{}:{}", self.host, self.port), tls = self.tls.is_some(), "upstream connection opened");
        Ok(Line {
            send,
            conn: Some(Box::pin(conn)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
    const WAIT: Duration = Duration::from_secs(10);

    /// How the fake upstream treats a connection after its first request.
    #[derive(Clone, Copy, PartialEq)]
    enum After {
        /// Keeps it open for more.
        KeepAlive,
        /// Answers, then closes it (a server's idle timeout, at once).
        Close,
        /// Answers the first connection's request never.
        Silent,
    }

    #[test]
    fn the_driven_future_is_held_once() {
        // A call's task holds what it awaits: the driver must not hold it twice.
        let big = async {
            let buf = [7u8; 4096];
            tokio::task::yield_now().await;
            buf.iter().map(|b| *b as usize).sum::<usize>()
        };
        let inner = std::mem::size_of_val(&big);
        let mut conn = None;
        let driven = std::mem::size_of_val(&drive(&mut conn, big));
        assert!(inner >= 4096, "{inner}");
        assert!(driven <= inner + 16, "{driven} bytes to drive {inner}");
    }

    use crate::transport::client::mcp_tls_config;

    /// The wire to `url`, whatever proxies the tests' environment names.
    fn wire(url: &reqwest::Url) -> Wire {
        Wire::trusting(url, mcp_tls_config).unwrap()
    }

    trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
    impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

    /// A plain HTTP/1.1 server: the connections it accepted, and a signal per connection it
    /// closed.
    async fn upstream(
        after: After,
    ) -> (
        reqwest::Url,
        Arc<AtomicUsize>,
        tokio::sync::mpsc::Receiver<()>,
    ) {
        upstream_on(after, None).await
    }

    /// [`upstream`], on TLS with `tls` (at `https://HOST:PORT/mcp`, HOST its name) when given.
    async fn upstream_on(
        after: After,
        tls: Option<(tokio_rustls::TlsAcceptor, &str)>,
    ) -> (
        reqwest::Url,
        Arc<AtomicUsize>,
        tokio::sync::mpsc::Receiver<()>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (url, tls) = match tls {
            None => (format!("http://127.0.0.1:{port}/mcp"), None),
            Some((t, host)) => (format!("https://{host}:{port}/mcp"), Some(t)),
        };
        let url = reqwest::Url::parse(&url).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (closed, closes) = tokio::sync::mpsc::channel(16);
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let n = count.fetch_add(1, Ordering::SeqCst);
                let closed = closed.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let mut s: Box<dyn Io> = match tls {
                        None => Box::new(tcp),
                        Some(t) => match t.accept(tcp).await {
                            Ok(s) => Box::new(s),
                            // (A client that refused the certificate.)
                            Err(_) => return,
                        },
                    };
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        // A request: its head and (the tests' bodies are small) its body.
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while buf.len() < head_end + len {
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                            }
                        }
                        buf.drain(..head_end + len);
                        if after == After::Silent && n == 0 {
                            // Holds the connection until the client closes it.
                            let _ = s.read(&mut chunk).await;
                            let _ = closed.send(()).await;
                            return;
                        }
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
                            ANSWER.len()
                        );
                        s.write_all(answer.as_bytes()).await.unwrap();
                        // (TLS may hold the last records until flushed.)
                        s.flush().await.unwrap();
                        if after == After::Close {
                            // (TLS: its close_notify.)
                            let _ = s.shutdown().await;
                            drop(s);
                            let _ = closed.send(()).await;
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted, closes)
    }

    /// One call on `wire`: the answer's body.
    async fn call(wire: &Wire) -> Result<Vec<u8>, WireError> {
        let request = || {
            hyper::Request::post("/mcp")
                .header("host", "test")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(
                    b"{\"jsonrpc\":\"2.0\",\"id\":1}",
                )))
                .unwrap()
        };
        let (head, mut body) = wire.send(request).await?;
        assert_eq!(head.status, 200);
        let mut out = Vec::new();
        while let Some(c) = body.chunk().await? {
            out.extend_from_slice(&c);
        }
        Ok(out)
    }

    /// Sequential calls share one connection, put back after each answer.
    #[tokio::test]
    async fn calls_reuse_a_kept_alive_connection() {
        let (url, accepted, _) = upstream(After::KeepAlive).await;
        let wire = wire(&url);
        for _ in 0..3 {
            assert_eq!(call(&wire).await.unwrap(), ANSWER.as_bytes());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(wire.idle.locked().len(), 1);
    }

    /// A pooled connection the upstream closed while it was idle is not used: the next call
    /// goes on a new one and is answered. Plain, and TLS (closed with its close_notify).
    #[tokio::test]
    async fn a_connection_closed_while_idle_is_passed_over() {
        for tls in [false, true] {
            let (acceptor, client) = tls_pair("localhost");
            let (url, accepted, mut closes) =
                upstream_on(After::Close, tls.then_some((acceptor, "localhost"))).await;
            let wire = Wire::trusting(&url, || client).unwrap();
            assert_eq!(call(&wire).await.unwrap(), ANSWER.as_bytes());
            tokio::time::timeout(WAIT, closes.recv())
                .await
                .unwrap()
                .unwrap();
            // (Until the close reaches this end, as it would have long before a pooled
            // connection's next call: a server closes idle connections after seconds.)
            tokio::time::timeout(WAIT, async {
                while !wire.idle.locked().iter_mut().all(|(l, _)| l.closed()) {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .unwrap();
            assert_eq!(call(&wire).await.unwrap(), ANSWER.as_bytes());
            assert_eq!(accepted.load(Ordering::SeqCst), 2, "tls: {tls}");
        }
    }

    /// A call dropped before its answer drops its connection (the upstream sees it close: its
    /// cancel), and the next call gets a new one.
    #[tokio::test]
    async fn a_dropped_call_closes_its_connection() {
        let (url, accepted, mut closes) = upstream(After::Silent).await;
        let wire = wire(&url);
        let first = tokio::time::timeout(Duration::from_millis(100), call(&wire)).await;
        assert!(first.is_err(), "the silent upstream does not answer");
        tokio::time::timeout(WAIT, closes.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(wire.idle.locked().is_empty());
        assert_eq!(call(&wire).await.unwrap(), ANSWER.as_bytes());
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// Connections idle past the limit are taken out, the oldest first, the rest kept; and
    /// after a call a sweep runs.
    #[tokio::test]
    async fn connections_idle_too_long_are_swept() {
        let (url, accepted, _) = upstream(After::KeepAlive).await;
        let wire = wire(&url);
        let (a, b) = tokio::join!(call(&wire), call(&wire));
        assert_eq!((a.unwrap(), b.unwrap()), (ANSWER.into(), ANSWER.into()));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert!(wire.sweeping.load(Ordering::Acquire), "a sweep runs");
        let long_ago = Instant::now() - POOL_IDLE * 2;
        wire.idle.locked()[0].1 = long_ago;
        let swept = stale(&wire.idle);
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].1, long_ago, "the oldest");
        assert_eq!(wire.idle.locked().len(), 1, "the other is kept");
    }

    /// `http://` and `https://` URLs get a wire, not with credentials in them; the ports
    /// default to 80 and 443.
    #[test]
    fn http_and_https_urls_get_a_wire() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        let w = wire(&url("http://[::1]/mcp"));
        assert_eq!(
            (w.host.as_str(), w.port, w.tls.is_some()),
            ("::1", 80, false)
        );
        let w = wire(&url("https://example.com/mcp"));
        assert_eq!(
            (w.host.as_str(), w.port, w.tls.is_some()),
            ("example.com", 443, true)
        );
        assert!(Wire::trusting(&url("https://u:p@example.com/mcp"), mcp_tls_config).is_none());
        assert!(Wire::trusting(&url("ftp://example.com/mcp"), mcp_tls_config).is_none());
    }

    /// A certificate for `name`, and a client config trusting it alone.
    fn tls_pair(name: &str) -> (tokio_rustls::TlsAcceptor, Arc<rustls::ClientConfig>) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec![name.into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        (
            tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            Arc::new(client),
        )
    }

    /// An `https://` upstream, named or by its IP address (its certificate naming that
    /// address): calls go over TLS, and share one connection as plain ones do.
    #[tokio::test]
    async fn an_https_upstream_is_called_over_one_kept_tls_connection() {
        for name in ["localhost", "127.0.0.1"] {
            let (acceptor, client) = tls_pair(name);
            let (url, accepted, _) = upstream_on(After::KeepAlive, Some((acceptor, name))).await;
            let wire = Wire::trusting(&url, || client).unwrap();
            for _ in 0..3 {
                assert_eq!(call(&wire).await.unwrap(), ANSWER.as_bytes(), "{name}");
            }
            assert_eq!(accepted.load(Ordering::SeqCst), 1, "{name}");
            assert_eq!(wire.idle.locked().len(), 1, "{name}");
        }
    }

    /// A certificate the client does not trust fails the connect, and the failure says so in
    /// herald's words (the system's CA store here, which does not hold this one).
    #[tokio::test]
    async fn an_untrusted_certificate_fails_the_connect_and_is_named() {
        let (acceptor, _) = tls_pair("localhost");
        let (url, _, _) = upstream_on(After::KeepAlive, Some((acceptor, "localhost"))).await;
        let wire = wire(&url);
        let e = call(&wire).await.expect_err("an unknown issuer");
        assert!(matches!(e, WireError::Connect(_)), "{e}");
        let said = crate::transport::explain::failure(
            &crate::transport::target::Target::Http(url.to_string()),
            false,
            &e,
        );
        assert!(
            said.contains("not signed by a CA this system trusts"),
            "{said}"
        );
        assert!(wire.idle.locked().is_empty());
    }
}
