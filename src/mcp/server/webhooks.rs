//! The seam between a server and its webhook subscriptions (`events/subscribe`,
//! `events/unsubscribe`): the server answers the requests through a [`Webhooks`] it was given
//! ([`SourceServer::serve_webhooks`](crate::mcp::server::SourceServer::serve_webhooks)); what
//! keeps, verifies and delivers them lives above `mcp` (`crate::hooks`), since it needs an
//! HTTP client.

use async_trait::async_trait;
use rmcp::model::{ErrorData as McpError, JsonObject};
use serde_json::Value;

use super::SourceServer;
use crate::mcp::caller::Caller;

/// A server's webhook subscriptions.
#[async_trait]
pub trait Webhooks: Send + Sync + 'static {
    /// `events/subscribe` from `caller` on `server`: the result, or the refusal.
    async fn subscribe(
        &self,
        server: &SourceServer,
        caller: &Caller,
        params: JsonObject,
    ) -> Result<Value, McpError>;

    /// `events/unsubscribe` from `caller`.
    async fn unsubscribe(&self, caller: &Caller, params: JsonObject) -> Result<Value, McpError>;
}

/// Webhooks a server receives: the gateway's, from slugs that deliver their events only by
/// webhook (`POST /events/hooks/{id}` on its HTTP address).
pub trait Receiver: Send + Sync + 'static {
    /// One POST to the subscription `id`: the status and JSON body to answer. `header` reads
    /// a request header by name.
    fn receive(
        &self,
        id: &str,
        header: &dyn Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> (u16, Value);

    /// The server serves HTTP at `addr` (where webhooks come unless configured otherwise).
    fn serving_http(&self, addr: std::net::SocketAddr);
}
