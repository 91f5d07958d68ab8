//! Transports: stdio, Streamable HTTP and QUIC, server and client side. The only module that
//! touches sockets, pipes and framing.

mod cap;
pub use cap::{ConnMetrics, Conns};
mod child_log;
pub mod client;
pub mod dns;
pub mod explain;
pub mod http;
pub mod jsonrpc;
pub mod lines;
pub mod oauth;
pub mod origin;
pub mod quic;
pub mod stdio;
pub mod target;
pub mod tls;
pub mod web;

#[cfg(test)]
#[path = "lists_tests.rs"]
mod lists_tests;

use tokio_util::sync::CancellationToken;

use crate::mcp::server::SourceServer;

/// Serves `server` on this process's stdin/stdout until stdin closes or `shutdown`.
/// Returns when the session ends.
pub async fn serve_stdio(server: SourceServer, shutdown: CancellationToken) {
    let service = server.for_connection();
    let served = lines::serve(service, stdio::stdin(), stdio::stdout(), shutdown);
    if let Err(e) = served.await {
        tracing::warn!(error = %e, "stdio session did not start");
    }
}

/// A listen address as configured, `None` when it is off: absent, or "" (or blanks), which
/// every role's flags and config files take as off.
pub fn listen_addr(addr: &Option<String>) -> Option<&str> {
    addr.as_deref().filter(|a| !a.trim().is_empty())
}

/// Whether `addr` (`HOST:PORT`) is a loopback address; a host name only when it is
/// `localhost`.
pub fn is_loopback(addr: &str) -> bool {
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return a.ip().to_canonical().is_loopback();
    }
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}
