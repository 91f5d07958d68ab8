//! The client connector every client role uses: `--mcp-stdio "CMD ARGS"` (a spawned child),
//! `--mcp-http URL`, `--mcp-quic HOST:PORT`.
//!
//! Connections open with `server/discover` (2026-07-28) and fall back to `initialize` for older
//! servers, which then still serve tools and reads; [`Connection::is_modern`] tells a caller
//! whether `subscriptions/listen` is available.

use std::ops::Deref;
use std::process::Stdio;

use rmcp::ClientHandler;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, Peer, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::mcp::server::{EVENTS_EXTENSION, TOKEN_META_KEY};

use crate::transport::lines::LineTransport;
use crate::transport::quic;
use crate::transport::tls::ClientTrust;

/// Where a server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A command line, run with `sh -c`, speaking stdio.
    Stdio(String),
    /// A Streamable HTTP endpoint URL.
    Http(String),
    /// `HOST:PORT` of a QUIC endpoint.
    Quic(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Stdio(c) => write!(f, "stdio:{c}"),
            Target::Http(u) => write!(f, "{u}"),
            Target::Quic(a) => write!(f, "quic://{a}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot start `{command}`: {message}")]
    Spawn { command: String, message: String },
    #[error("{target}: {message}")]
    Transport { target: String, message: String },
    #[error("{target}: MCP handshake failed: {message}")]
    Handshake { target: String, message: String },
}

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

/// Connects to `target`.
pub async fn connect<H: ClientHandler>(
    target: &Target,
    trust: &ClientTrust,
    handler: H,
    max_message_bytes: usize,
) -> Result<Connection<H>, ConnectError> {
    // reqwest (rmcp's HTTP client) uses the process-wide rustls provider; make sure it is ring
    // even when herald is used as a library. A second install is a harmless no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let handshake = |e: rmcp::service::ClientInitializeError| ConnectError::Handshake {
        target: target.to_string(),
        message: e.to_string(),
    };
    match target {
        Target::Stdio(command) => {
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(format!("exec {command}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                // The client's own credential is not the server's business.
                .env_remove("HERALD_TOKEN")
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| ConnectError::Spawn {
                    command: command.clone(),
                    message: e.to_string(),
                })?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = child.stdout.take().expect("piped");
            let mut conn =
                connect_stream(target.clone(), stdout, stdin, handler, max_message_bytes).await?;
            conn._child = Some(child);
            Ok(conn)
        }
        Target::Http(url) => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(t) = &trust.token {
                config = config.auth_header(t.0.clone());
            }
            let transport = StreamableHttpClientTransport::from_config(config);
            let service = handler
                .serve_with_lifecycle(transport, lifecycle())
                .await
                .map_err(handshake)?;
            Ok(Connection {
                service,
                target: target.clone(),
                _child: None,
                _quic: None,
            })
        }
        Target::Quic(addr) => {
            let (endpoint, conn, send, recv) =
                quic::connect(addr, trust)
                    .await
                    .map_err(|message| ConnectError::Transport {
                        target: target.to_string(),
                        message,
                    })?;
            let mut transport =
                LineTransport::<RoleClient, _>::new(recv, send, max_message_bytes, false);
            if let Some(t) = &trust.token {
                transport = transport.with_request_meta(TOKEN_META_KEY, t.0.clone());
            }
            let service = handler
                .serve_with_lifecycle(transport, lifecycle())
                .await
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
pub async fn connect_stream<H, R, W>(
    target: Target,
    read: R,
    write: W,
    handler: H,
    max_message_bytes: usize,
) -> Result<Connection<H>, ConnectError>
where
    H: ClientHandler,
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let transport = LineTransport::<RoleClient, _>::new(read, write, max_message_bytes, false);
    let service = handler
        .serve_with_lifecycle(transport, lifecycle())
        .await
        .map_err(|e| ConnectError::Handshake {
            target: target.to_string(),
            message: e.to_string(),
        })?;
    Ok(Connection {
        service,
        target,
        _child: None,
        _quic: None,
    })
}
