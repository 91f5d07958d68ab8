//! MCP over QUIC: quinn + rustls, ALPN `mcp`, one bidirectional stream per MCP connection
//! carrying the stdio framing ([`LineTransport`]).
//!
//! A QUIC connection may carry many MCP connections (one per stream); each gets its own
//! [`ConnServer`](crate::mcp::conn::ConnServer), and all of a connection's streams share one
//! listen-stream budget (at most 16 streams per connection). Keep-alives
//! run on both sides so that a quiet listen stream is not taken for an idle connection.
//! At most `--max-connections` connections are open per endpoint ([`ConnCap`]): at the cap
//! the endpoint stops accepting, and new connections wait in quinn's incoming queue.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span};

use crate::mcp::server::SourceServer;
use crate::runtime::metrics::Metrics;
use crate::transport::cap::{ConnCap, ConnMetrics};
use crate::transport::dns;
use crate::transport::explain;
use crate::transport::target::Target;
use crate::transport::tls::{self, ClientTrust, Identity, TlsError};

/// How often an idle QUIC connection sends a keep-alive.
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// MCP connections (bidirectional streams) one QUIC connection may have open.
const MAX_STREAMS: u32 = 16;
/// How long a connection may go without hearing from the peer.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(KEEP_ALIVE));
    // Each bidirectional stream is a whole MCP connection; a handful is plenty per peer.
    t.max_concurrent_bidi_streams(MAX_STREAMS.into());
    t.max_concurrent_uni_streams(0u32.into());
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("60 s is a valid idle timeout"),
    ));
    Arc::new(t)
}

/// A QUIC server configuration with `identity`.
pub fn server_config(identity: Identity) -> Result<quinn::ServerConfig, TlsError> {
    let tls = tls::server_config(identity)?;
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Config(e.to_string()))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(transport_config());
    Ok(cfg)
}

/// Binds a QUIC server endpoint on `addr` with `cfg` (a busy port is an I/O error).
pub fn bind(addr: SocketAddr, cfg: quinn::ServerConfig) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::server(cfg, addr)
}

/// Serves MCP on every bidirectional stream of every connection until `shutdown`.
/// `shutdown` stops accepting; `sessions` ends the MCP sessions (later, once listens have
/// sent their final results). Connections are counted in `metrics`.
pub async fn serve(
    endpoint: quinn::Endpoint,
    server: SourceServer,
    shutdown: CancellationToken,
    sessions: CancellationToken,
    metrics: Metrics,
) {
    let conns = ConnMetrics::register(&metrics).quic;
    let tracker = TaskTracker::new();
    let cap = ConnCap::new(
        server.limits().max_connections,
        "QUIC",
        conns.limit_reached.clone(),
        conns.open.clone(),
    );
    loop {
        // At the cap, wait here: quinn keeps new connections queued meanwhile (and refuses
        // them past its own bound on the queue).
        let Some(place) = cap.admit(&shutdown).await else {
            break;
        };
        let incoming = tokio::select! {
            _ = shutdown.cancelled() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let server = server.clone();
        let shutdown = shutdown.clone();
        let sessions = sessions.clone();
        let remote = incoming.remote_address();
        let accepted = conns.accepted.clone();
        let streams = tracker.clone();
        tracker.spawn(
            async move {
                // The connection's place under the cap, given back when it closes.
                let _place = place.opened();
                let conn = match incoming.await {
                    Ok(c) => {
                        accepted.inc();
                        c
                    }
                    Err(e) => {
                        debug!(error = %e, "quic handshake failed");
                        return;
                    }
                };
                // One listen-stream budget per QUIC connection, however many streams it opens.
                let budget = crate::mcp::admission::ConnStreams::default();
                loop {
                    let (send, recv) = tokio::select! {
                        _ = shutdown.cancelled() => break,
                        s = conn.accept_bi() => match s {
                            Ok(s) => s,
                            Err(e) => {
                                debug!(reason = %e, "quic connection closed");
                                break;
                            }
                        },
                    };
                    let loopback = remote.ip().to_canonical().is_loopback();
                    let service = server.for_connection_sharing(budget.clone(), loopback);
                    let ct = sessions.child_token();
                    streams.spawn(
                        async move {
                            if let Err(e) = super::lines::serve(service, recv, send, ct).await {
                                debug!(error = %e, "mcp session over quic did not start");
                            }
                        }
                        .instrument(info_span!("quic_stream")),
                    );
                }
            }
            .instrument(info_span!("quic_conn", %remote)),
        );
    }
    tracker.close();
    // Sessions end when `sessions` is cancelled (after listens sent their final results);
    // each finishes its stream on the way out. Then close the endpoint.
    sessions.cancelled().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
    endpoint.close(0u32.into(), b"shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
}

/// Opens an MCP connection (one bidirectional stream) to `host:port`, waiting at most
/// `within` for the server's answer to the QUIC handshake (a server that is down answers
/// nothing, and quinn alone would wait for its 60 s idle timeout). Failures are sentences
/// ([`explain`]).
pub async fn connect(
    target: &str,
    trust: &ClientTrust,
    within: Duration,
) -> Result<
    (
        quinn::Endpoint,
        quinn::Connection,
        quinn::SendStream,
        quinn::RecvStream,
    ),
    String,
> {
    let named = Target::Quic(target.trim_start_matches("quic://").to_owned());
    let (host, addr) = resolve(target).await?;
    let tls = tls::client_config(trust).map_err(|e| e.to_string())?;
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(transport_config());
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0".parse().expect("valid")
    } else {
        "0.0.0.0:0".parse().expect("valid")
    };
    let mut endpoint =
        quinn::Endpoint::client(bind).map_err(|e| format!("cannot open a UDP socket: {e}"))?;
    endpoint.set_default_client_config(cfg);
    let connecting = endpoint
        .connect(addr, &host)
        .map_err(|e| format!("cannot connect to {target}: {e}"))?;
    let conn = match tokio::time::timeout(within, connecting).await {
        Err(_) => return Err(explain::timed_out(&named, within)),
        Ok(Err(quinn::ConnectionError::TimedOut)) => {
            return Err(explain::timed_out(&named, IDLE_TIMEOUT.min(within)));
        }
        Ok(Err(e)) => return Err(explain::quic(&named, &e)),
        Ok(Ok(c)) => c,
    };
    let (send, recv) = conn
        .open_bi()
        .await
        .map_err(|e| explain::quic(&named, &e))?;
    Ok((endpoint, conn, send, recv))
}

/// The target's host (the TLS server name) and its first address, resolved in Rust
/// ([`dns`]), never through glibc's NSS.
async fn resolve(target: &str) -> Result<(String, SocketAddr), String> {
    let target = target.trim_start_matches("quic://");
    let (host, addrs) = dns::lookup(target).await.map_err(|e| e.to_string())?;
    // The one address quinn dials: IPv4 first, as the resolver orders them.
    Ok((host, addrs[0]))
}
