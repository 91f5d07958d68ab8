//! Transports: stdio, Streamable HTTP and QUIC, server and client side. The only module that
//! touches sockets, pipes and framing.

mod cap;
pub mod client;
pub mod dns;
pub mod explain;
pub mod http;
pub mod jsonrpc;
pub mod lines;
pub mod origin;
pub mod quic;
pub mod tls;

use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::mcp::server::SourceServer;

/// Serves `server` on this process's stdin/stdout until stdin closes or `shutdown`.
/// Returns when the session ends.
pub async fn serve_stdio(server: SourceServer, shutdown: CancellationToken) {
    let service = server.for_connection();
    let transport = service.line_transport(tokio::io::stdin(), tokio::io::stdout());
    match service.serve_with_ct(transport, shutdown).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(e) => tracing::warn!(error = %e, "stdio session did not start"),
    }
}
