//! The client connector every client role uses: `--mcp-stdio "CMD ARGS"` (a spawned child),
//! `--mcp-http URL`, `--mcp-quic HOST:PORT`.
//!
//! Connections open with `server/discover` (2026-07-28) and fall back to `initialize` for older
//! servers, which then still serve tools and reads; [`Connection::is_modern`] tells a caller
//! whether `subscriptions/listen` is available.
//!
//! A network server has a bounded time from the first packet to the end of the handshake
//! ([`connect_within`], [`DEFAULT_CONNECT_TIMEOUT`]); a command is not bounded here. A stdio
//! server runs in a process group of its own (a terminal's Ctrl-C is herald's), without
//! herald's secrets in its environment, and is killed when its connection is dropped; its
//! stderr is said in herald's log, a line at a time, naming it (`child_log`).
//! [`Connection::call_tool`] follows a server's `input_required` rounds to the final result.
//! [`http_client`](super::web::http_client) builds every reqwest client herald uses (resolving in Rust, and trusting no
//! CA rather than failing where the system has none); MCP upstreams share one pooled HTTP/1.1
//! client per process.

use std::ops::Deref;
use std::process::Stdio;
use std::time::Duration;

use rmcp::ClientHandler;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, Peer, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::mcp::server::{EVENTS_EXTENSION, TOKEN_META_KEY};

use crate::transport::explain;
use crate::transport::lines::LineTransport;
use crate::transport::quic;
use crate::transport::target::Target;
use crate::transport::tls::ClientTrust;
use crate::transport::web::http_client;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot start `{command}`: {message}")]
    Spawn { command: String, message: String },
    /// The target cannot be connected to as written (an HTTP URL without its scheme).
    #[error("{0}")]
    Target(String),
    /// The server could not be reached. `message` is the whole sentence
    /// ([`explain`](super::explain)): what happened, naming the target, and what to try.
    #[error("{message}")]
    Transport { target: String, message: String },
    /// The server was reached but the MCP handshake failed; `message` as for `Transport`.
    #[error("{message}")]
    Handshake { target: String, message: String },
}

/// How long a connect to an HTTP or QUIC server waits for it by default: the QUIC handshake,
/// then the MCP handshake (`server/discover`, or `initialize`), all within this
/// (`--connect-timeout-ms`). A server that is down answers a QUIC client nothing at all, so
/// without it a connect would wait for QUIC's 60 s idle timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client identity herald presents, usable as an rmcp client handler.
pub fn client_config() -> ClientConfig {
    let mut caps = ClientCapabilities::default();
    // herald's clients poll events (herald poll, the gateway's upstream side).
    caps.extensions
        .get_or_insert_with(Default::default)
        .insert(EVENTS_EXTENSION.into(), Default::default());
    ClientConfig::new(
        caps,
        Implementation::new("herald", env!("CARGO_PKG_VERSION")),
    )
}

/// [`client_config`] with the tasks extension declared.
pub fn tasks_config() -> ClientConfig {
    let mut c = client_config();
    let tasks = ClientCapabilities::builder().enable_tasks().build();
    c.capabilities
        .extensions
        .get_or_insert_with(Default::default)
        .extend(tasks.extensions.unwrap_or_default());
    c
}

/// A request's `_meta` declaring the tasks extension (over the connection's own
/// declaration): for a task-augmented call, `tasks/*` and a listen naming `taskIds`. With a
/// relayed caller's `capabilities`, those with the extension added.
pub fn tasks_meta(capabilities: Option<&ClientCapabilities>) -> rmcp::model::RequestMetaObject {
    let mut caps = match capabilities {
        Some(c) => c.clone(),
        None => client_config().capabilities,
    };
    caps.extensions.get_or_insert_with(Default::default).extend(
        ClientCapabilities::builder()
            .enable_tasks()
            .build()
            .extensions
            .unwrap_or_default(),
    );
    let mut m = rmcp::model::RequestMetaObject::new();
    m.set_client_capabilities(caps);
    m
}

/// An open client connection. Derefs to the rmcp [`Peer`]. Dropping it closes the connection
/// (and stops a spawned child).
pub struct Connection<H: ClientHandler = ClientConfig> {
    service: RunningService<RoleClient, H>,
    target: Target,
    _child: Option<tokio::process::Child>,
    _quic: Option<(quinn::Endpoint, quinn::Connection)>,
}

impl<H: ClientHandler> Deref for Connection<H> {
    type Target = Peer<RoleClient>;
    fn deref(&self) -> &Peer<RoleClient> {
        self.service.peer()
    }
}

impl<H: ClientHandler> Connection<H> {
    /// Whether the server speaks 2026-07-28 (and so `subscriptions/listen`).
    pub fn is_modern(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|i| i.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
    }

    pub fn protocol_version(&self) -> Option<String> {
        self.service
            .peer_info()
            .map(|i| i.protocol_version.as_str().to_owned())
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// A `tools/call` that follows the server's `input_required` rounds (SEP-2322) to the
    /// final result: each round's input requests go to this connection's client handler
    /// (rmcp's default declines an elicitation, as a client with no one to ask does), and
    /// the call is sent again as a new request (a new id) with the answers and the round's
    /// `requestState` exactly as the server sent it, or none when it sent none; a result
    /// without `resultType` is complete. The round state lives in this call only, so calls
    /// beside it never carry it. (The [`Peer`]'s own `call_tool`, which this hides, fails on
    /// an input request.)
    pub async fn call_tool(
        &self,
        params: rmcp::model::CallToolRequestParams,
    ) -> Result<rmcp::model::CallToolResult, rmcp::ServiceError> {
        self.service.call_tool(params).await
    }

    /// Closes the connection and waits for the transport to finish.
    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }

    /// Takes the spawned child (stdio targets) out of the connection, for a caller that
    /// supervises it: it is then no longer killed when the connection is dropped, but still
    /// when the taken `Child` is.
    pub fn take_child(&mut self) -> Option<tokio::process::Child> {
        self._child.take()
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        // rmcp's own flag misses a transport that hit end of stream; ask the peer too.
        self.service.is_closed() || self.service.peer().is_transport_closed()
    }
}

fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Connects to `target`, waiting at most [`DEFAULT_CONNECT_TIMEOUT`] for a network server.
pub async fn connect<H: ClientHandler>(
    target: &Target,
    trust: &ClientTrust,
    handler: H,
    max_message_bytes: usize,
) -> Result<Connection<H>, ConnectError> {
    connect_within(
        target,
        trust,
        handler,
        max_message_bytes,
        DEFAULT_CONNECT_TIMEOUT,
    )
    .await
}

/// Connects to `target`. An HTTP or QUIC server has `within` to answer, from the first packet
/// to the end of the MCP handshake. A command (stdio) is not bounded here: a child may take its
/// time to start (`npx` fetching its package), and the caller bounds it as it sees fit.
/// Failures are sentences ([`explain`]): what happened and what to try.
pub async fn connect_within<H: ClientHandler>(
    target: &Target,
    trust: &ClientTrust,
    handler: H,
    max_message_bytes: usize,
    within: Duration,
) -> Result<Connection<H>, ConnectError> {
    connect_tapped(target, trust, handler, max_message_bytes, within, None).await
}

/// What sees every message a server sends on a connection, in wire order, before rmcp
/// handles it (rmcp handles each notification in a task of its own, so its handler sees them
/// in no certain order, and maybe after the response that followed them on the wire). It
/// runs in the connection's receive loop: it must not block.
pub trait Tap: Send + Sync + 'static {
    fn seen(&self, message: &rmcp::service::RxJsonRpcMessage<RoleClient>);
    /// Sees each message the client sends, before it is written, and may add to its `_meta`.
    fn outgoing(&self, _message: &mut rmcp::service::TxJsonRpcMessage<RoleClient>) {}
}

/// Every client connection's transport, whatever it runs on: line-framed (a child's pipes,
/// a QUIC stream, an in-process pipe) or streamable HTTP, with a [`Tap`] seeing each message.
/// One type, so rmcp's client loop is compiled once per handler rather than once per kind
/// of stream.
struct ClientTransport {
    wire: Wire,
    tap: Option<std::sync::Arc<dyn Tap>>,
}

enum Wire {
    Lines(LineTransport<RoleClient>),
    Http(StreamableHttpClientTransport<crate::transport::oauth::wire::McpHttp>),
}

impl rmcp::transport::Transport<RoleClient> for ClientTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        mut item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        use futures::TryFutureExt;
        use futures::future::Either;
        if let Some(tap) = &self.tap {
            tap.outgoing(&mut item);
        }
        match &mut self.wire {
            Wire::Lines(t) => Either::Left(t.send(item)),
            Wire::Http(t) => Either::Right(t.send(item).map_err(std::io::Error::other)),
        }
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleClient>> {
        let message = match &mut self.wire {
            Wire::Lines(t) => t.receive().await,
            Wire::Http(t) => t.receive().await,
        }?;
        if let Some(tap) = &self.tap {
            tap.seen(&message);
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        match &mut self.wire {
            Wire::Lines(t) => t.close().await,
            Wire::Http(t) => t.close().await.map_err(std::io::Error::other),
        }
    }
}

/// [`connect_within`], with `tap` seeing every message the server sends, in wire order.
pub async fn connect_tapped<H: ClientHandler>(
    target: &Target,
    trust: &ClientTrust,
    handler: H,
    max_message_bytes: usize,
    within: Duration,
    tap: Option<std::sync::Arc<dyn Tap>>,
) -> Result<Connection<H>, ConnectError> {
    // reqwest (rmcp's HTTP client) uses the process-wide rustls provider; make sure it is ring
    // even when herald is used as a library. A second install is a harmless no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let handshake = |e: rmcp::service::ClientInitializeError| ConnectError::Handshake {
        target: target.to_string(),
        message: explain::handshake(target, trust.token.is_some(), &e),
    };
    let unreachable = |message: String| ConnectError::Transport {
        target: target.to_string(),
        message,
    };
    match target {
        Target::Stdio(command) => {
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg(format!("exec {command}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                // A group of its own: a terminal's Ctrl-C (sent to the whole foreground group)
                // is herald's to handle (code mode cancels a line with it), not a signal that
                // stops the server under it. It still ends with herald: dropped, it is killed,
                // and its stdin closes if herald dies.
                .process_group(0);
            // The client's own credential and this process's secrets are not the server's
            // business.
            let mut child = crate::runtime::secrets::scrub(&mut cmd)
                .spawn()
                .map_err(|e| ConnectError::Spawn {
                    command: command.clone(),
                    message: e.to_string(),
                })?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = child.stdout.take().expect("piped");
            let stderr = child.stderr.take().expect("piped");
            crate::transport::child_log::relay(stderr, target.redacted());
            let mut conn = connect_stream_tapped(
                target.clone(),
                stdout,
                stdin,
                handler,
                max_message_bytes,
                tap,
            )
            .await?;
            conn._child = Some(child);
            Ok(conn)
        }
        Target::Http(url) => {
            explain::check_http_url(url).map_err(ConnectError::Target)?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(t) = &trust.token {
                config = config.auth_header(t.0.clone());
            }
            let client = crate::transport::oauth::wire::McpHttp {
                client: mcp_http_client().map_err(|e| unreachable(e.to_string()))?,
                oauth: trust.oauth.clone(),
            };
            let transport = ClientTransport {
                wire: Wire::Http(StreamableHttpClientTransport::with_client(client, config)),
                tap,
            };
            let service =
                tokio::time::timeout(within, handler.serve_with_lifecycle(transport, lifecycle()))
                    .await
                    .map_err(|_| unreachable(explain::timed_out(target, within)))?
                    .map_err(handshake)?;
            Ok(Connection {
                service,
                target: target.clone(),
                _child: None,
                _quic: None,
            })
        }
        Target::Quic(addr) => {
            let deadline = tokio::time::Instant::now() + within;
            let (endpoint, conn, send, recv) = quic::connect(addr, trust, within)
                .await
                .map_err(unreachable)?;
            let mut transport =
                LineTransport::<RoleClient>::new(recv, send, max_message_bytes, false);
            if let Some(t) = &trust.token {
                transport = transport.with_request_meta(TOKEN_META_KEY, t.0.clone());
            }
            let transport = ClientTransport {
                wire: Wire::Lines(transport),
                tap,
            };
            let service = tokio::time::timeout_at(
                deadline,
                handler.serve_with_lifecycle(transport, lifecycle()),
            )
            .await
            .map_err(|_| ConnectError::Handshake {
                target: target.to_string(),
                message: explain::no_handshake(target, within),
            })?
            .map_err(handshake)?;
            Ok(Connection {
                service,
                target: target.clone(),
                _child: None,
                _quic: Some((endpoint, conn)),
            })
        }
    }
}

/// Connects over an already-open byte stream in the stdio framing (newline-delimited
/// JSON-RPC): a child's pipes, or an in-memory pipe to an in-process server. `target` only
/// names the connection.
pub fn connect_stream<H, R, W>(
    target: Target,
    read: R,
    write: W,
    handler: H,
    max_message_bytes: usize,
) -> impl std::future::Future<Output = Result<Connection<H>, ConnectError>>
where
    H: ClientHandler,
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    connect_stream_tapped(target, read, write, handler, max_message_bytes, None)
}

/// [`connect_stream`], with `tap` seeing every message the server sends, in wire order.
pub fn connect_stream_tapped<H, R, W>(
    target: Target,
    read: R,
    write: W,
    handler: H,
    max_message_bytes: usize,
    tap: Option<std::sync::Arc<dyn Tap>>,
) -> impl std::future::Future<Output = Result<Connection<H>, ConnectError>>
where
    H: ClientHandler,
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let transport = ClientTransport {
        wire: Wire::Lines(LineTransport::new(read, write, max_message_bytes, false)),
        tap,
    };
    handshake_stream(target, transport, handler)
}

/// The handshake on a byte stream (not generic in the stream: see [`ClientTransport`]).
async fn handshake_stream<H: ClientHandler>(
    target: Target,
    transport: ClientTransport,
    handler: H,
) -> Result<Connection<H>, ConnectError> {
    let service = handler
        .serve_with_lifecycle(transport, lifecycle())
        .await
        .map_err(|e| ConnectError::Handshake {
            message: explain::handshake(&target, false, &e),
            target: target.to_string(),
        })?;
    Ok(Connection {
        service,
        target,
        _child: None,
        _quic: None,
    })
}

/// The client for a Streamable HTTP upstream, built by [`http_client`] rather than by rmcp,
/// whose default client panics without a CA store. Unlike rmcp's default it keeps connections:
/// a pool of keep-alive connections per upstream (as many as the calls in flight, idle ones
/// closed after [`POOL_IDLE`]), HTTP/1.1 only (over HTTP/2 every listen, a long-lived POST,
/// would share one connection with the calls, and past the peer's stream limit the calls
/// would queue behind them), `TCP_NODELAY` (a
/// request is one small write that Nagle would hold back behind the previous one's delayed
/// ACK; rmcp turns pooling off for exactly that stall). Only same-origin 307/308 redirects are
/// followed, as rmcp does.
///
/// One client serves the whole process (it is a handle to one pool, kept per host), so rmcp's
/// requests share connections (the gateway's direct calls have their own, `upstream/wire.rs`),
/// and its TLS is [`mcp_tls_config`]: the CA store is read once.
pub(crate) fn mcp_http_client() -> Result<reqwest::Client, reqwest::Error> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let c = http_client(|b| {
        b.tls_backend_preconfigured((*mcp_tls_config()).clone())
            .http1_only()
            .tcp_nodelay(true)
            .tcp_keepalive(TCP_KEEPALIVE)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .redirect(same_origin_redirects())
    })?;
    Ok(CLIENT.get_or_init(|| c).clone())
}

/// The TLS of connections to HTTPS upstreams, one config for both clients: the gateway's own
/// connections (`upstream/wire.rs`) and [`mcp_http_client`]'s reqwest client, which is given
/// it as built. Built the way reqwest builds its own: the process's crypto provider (ring,
/// unless a program embedding herald installed another), TLS 1.2 and 1.3, the system's CA
/// store through the platform verifier, which reads `SSL_CERT_FILE` too (with no store on the
/// system, no CA: each connection then fails with an unknown issuer, which names the
/// problem), HTTP/1.1 alone by ALPN. One session cache serves both.
pub(crate) fn mcp_tls_config() -> std::sync::Arc<rustls::ClientConfig> {
    use std::sync::Arc;
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = rustls::crypto::CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
            let builder = || {
                rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(rustls::ALL_VERSIONS)
                    .expect("ring does TLS 1.2 and 1.3")
            };
            let mut cfg = match rustls_platform_verifier::Verifier::new(provider.clone()) {
                Ok(v) => builder()
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(v))
                    .with_no_client_auth(),
                Err(e) => {
                    tracing::debug!(error = %e, "no usable CA store: HTTPS upstreams will trust no server");
                    builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth()
                }
            };
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Arc::new(cfg)
        })
        .clone()
}

/// How long a pooled upstream connection may sit idle before it is closed: under the idle
/// limit of common servers (Node's 5 s), so a call never picks a connection the server is
/// closing at that moment.
pub(crate) const POOL_IDLE: Duration = Duration::from_secs(4);

/// TCP keep-alive probes on upstream connections, so a peer that vanished (a host crash, a
/// dropped NAT entry) is noticed instead of costing a call its whole timeout.
pub(crate) const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// Longest a new upstream connection may take to open.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections kept per upstream host (more may be open while calls are in flight).
pub(crate) const POOL_MAX_IDLE: usize = 256;

/// Most redirects one request follows.
const MAX_REDIRECTS: usize = 10;

/// rmcp 3.11's redirect rule for its default client (private there, hence this copy): follow
/// only 307 and 308, which keep the method and body, and only to the same origin, which keeps
/// the session id and the bearer token from going to another host; stop after
/// [`MAX_REDIRECTS`]. Any other redirect comes back to rmcp as the response.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use axum::routing::post;

    #[test]
    fn a_redacted_target_keeps_no_key() {
        for (t, want) in [
            (
                Target::Http("https://u:pw@h.example:8/mcp?key=s3cret#x".into()),
                "https://h.example:8/mcp",
            ),
            (Target::Http("http://h/mcp".into()), "http://h/mcp"),
            (
                Target::Stdio("npx server --api-key s3cret".into()),
                "stdio:npx …",
            ),
            (Target::Stdio("herald".into()), "stdio:herald"),
            // herald up's own roles: shown whole, no "…".
            (Target::Stdio("in-process memo".into()), "in-process memo"),
            (Target::Quic("h:1".into()), "quic://h:1"),
        ] {
            assert_eq!(t.redacted(), want);
        }
    }

    /// A server on the stdio framing that answers `tools/call` with an input request (with
    /// `requestState` when `state` is set) until the call comes back with answers; it returns
    /// the calls it received.
    async fn input_round_server(
        io: tokio::io::DuplexStream,
        state: Option<&'static str>,
    ) -> Vec<serde_json::Value> {
        use serde_json::json;
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        let (r, mut w) = tokio::io::split(io);
        let mut lines = tokio::io::BufReader::new(r).lines();
        let mut calls = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            let m: serde_json::Value = serde_json::from_str(&line).unwrap();
            let result = match m["method"].as_str() {
                Some("server/discover") => json!({"resultType": "complete",
                    "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
                    "ttlMs": 0, "cacheScope": "private",
                    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "t", "version": "1"}}}),
                Some("tools/call") if m["params"]["inputResponses"].is_null() => {
                    calls.push(m.clone());
                    let mut r = json!({"resultType": "input_required", "inputRequests": {
                        "confirm": {"method": "elicitation/create", "params": {
                            "message": "sure?", "requestedSchema": {"type": "object",
                            "properties": {"ok": {"type": "boolean"}}}}}}});
                    if let Some(s) = state {
                        r["requestState"] = s.into();
                    }
                    r
                }
                Some("tools/call") => {
                    calls.push(m.clone());
                    // No resultType: complete.
                    json!({"content": [{"type": "text", "text": "done"}]})
                }
                _ => continue,
            };
            let answer = json!({"jsonrpc": "2.0", "id": m["id"], "result": result});
            w.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
        }
        calls
    }

    #[tokio::test]
    async fn a_call_follows_input_rounds_echoing_the_request_state_exactly() {
        // Bytes a re-serialization would change (spacing, key order, escapes).
        let state = r#"{"b":1, "a":"\u00e9"}"#;
        for sent in [Some(state), None] {
            let (client, server) = tokio::io::duplex(1 << 16);
            let served = tokio::spawn(input_round_server(server, sent));
            let (r, w) = tokio::io::split(client);
            let target = Target::Stdio("input rounds".into());
            let conn = connect_stream(target, r, w, client_config(), 1 << 20)
                .await
                .unwrap();
            let result = conn
                .call_tool(rmcp::model::CallToolRequestParams::new("t"))
                .await
                .unwrap();
            assert_eq!(result.content[0].as_text().unwrap().text, "done");
            conn.close().await;
            let calls = served.await.unwrap();
            assert_eq!(calls.len(), 2, "{calls:?}");
            assert_ne!(calls[0]["id"], calls[1]["id"], "the retry is a new request");
            let retry = &calls[1]["params"];
            assert_eq!(retry["inputResponses"]["confirm"]["action"], "decline");
            match sent {
                Some(s) => assert_eq!(retry["requestState"], s),
                None => assert!(retry.get("requestState").is_none(), "{retry}"),
            }
        }
    }

    fn redirect(status: StatusCode, to: &'static str) -> impl IntoResponse {
        (status, [(header::LOCATION, to)])
    }

    #[tokio::test]
    async fn upstream_redirects_follow_only_307_and_308_within_the_origin() {
        let app = Router::new()
            .route("/mcp", post(|body: String| async move { body }))
            .route(
                "/temporary",
                post(|| async { redirect(StatusCode::TEMPORARY_REDIRECT, "/mcp") }),
            )
            .route(
                "/found",
                post(|| async { redirect(StatusCode::FOUND, "/mcp") }),
            )
            .route(
                "/elsewhere",
                post(|| async {
                    redirect(StatusCode::PERMANENT_REDIRECT, "http://127.0.0.2:9/mcp")
                }),
            )
            .route(
                "/loop",
                post(|| async { redirect(StatusCode::TEMPORARY_REDIRECT, "/loop") }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = mcp_http_client().unwrap();
        let post = |path: &str| client.post(format!("{base}{path}")).body("ping").send();

        let r = post("/temporary").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.text().await.unwrap(), "ping", "the body went along");
        assert_eq!(post("/found").await.unwrap().status(), StatusCode::FOUND);
        assert_eq!(
            post("/elsewhere").await.unwrap().status(),
            StatusCode::PERMANENT_REDIRECT
        );
        assert!(post("/loop").await.unwrap_err().is_redirect());
    }
}
