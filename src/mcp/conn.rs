//! [`ConnServer`]: a [`SourceServer`] on one byte-stream connection (stdio, a QUIC stream, an
//! in-process pipe), served by `transport::lines::serve`.
//!
//! rmcp hands a byte-stream server every request whole, so this wrapper does, before rmcp's
//! own dispatch, what HTTP does in its transport layer: it works out the request's
//! [`Caller`] (the stdio parent is local; QUIC callers present `_meta["io.herald/token"]`) and
//! puts it in the request context, and it answers a `subscriptions/listen` itself: opened by
//! [`SourceServer::open`] against this connection's stream count, its acknowledgment (with
//! `taskIds`, which rmcp's has no room for) and notifications written to the peer
//! ([`SourceServer::listen_on_peer`]). rmcp's handler never sees a listen on a byte stream.

use std::borrow::Cow;

use rmcp::model::{
    ClientRequest, ErrorData as McpError, ProtocolVersion, ServerConfig, ServerResult,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, Service};

use crate::mcp::admission::{CONTENTS, ConnStreams, ListenFilter, ListenTaskIds};
use crate::mcp::caller::Caller;
use crate::mcp::server::SourceServer;

/// A server's byte-stream connections (here, beside [`ConnServer`], so the server's own
/// file needs nothing of this one).
impl SourceServer {
    /// This server for stdio, with its own listen-stream count. The peer is the process that
    /// started this one, so it is a local caller (no token needed).
    pub fn for_connection(&self) -> ConnServer {
        let conn = ConnStreams::default();
        ConnServer::new(self.for_session_on(conn.clone()), conn, true, true)
    }

    /// This server for a byte-stream connection that shares its listen-stream budget with
    /// others (the streams of one QUIC connection). Its callers present a token in `_meta`;
    /// `loopback` says the peer is on a loopback address.
    pub fn for_connection_sharing(&self, conn: ConnStreams, loopback: bool) -> ConnServer {
        ConnServer::new(self.for_session_on(conn.clone()), conn, false, loopback)
    }
}

/// [`SourceServer`] on one byte-stream connection; see the module docs.
#[derive(Clone)]
pub struct ConnServer {
    server: SourceServer,
    conn: ConnStreams,
    local: bool,
    loopback: bool,
}

impl ConnServer {
    /// `server` on a connection counted by `conn`; `local` for the stdio parent (or an
    /// in-process client), `loopback` for a peer on a loopback address.
    pub fn new(server: SourceServer, conn: ConnStreams, local: bool, loopback: bool) -> ConnServer {
        ConnServer {
            server,
            conn,
            local,
            loopback,
        }
    }

    /// This connection's server's limits (its transport takes its message and in-flight
    /// limits from them).
    pub fn limits(&self) -> &crate::mcp::limits::Limits {
        self.server.limits()
    }
}

impl Service<RoleServer> for ConnServer {
    async fn handle_request(
        &self,
        request: ClientRequest,
        mut context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        let mut caller = Caller::from_meta(&context.meta, self.local, self.loopback);
        // A caller the source does not know (a missing or unknown token over QUIC) is refused
        // every request, the handshake first, as HTTP refuses it with 401: never served as a
        // caller entitled to nothing.
        let auth = self.server.authenticates(&mut caller).await;
        if let Some(message) = auth.refusal() {
            return Err(McpError::new(
                rmcp::model::ErrorCode(-32024),
                message,
                Some(serde_json::json!({
                    "kind": crate::mcp::source::UNAUTHENTICATED,
                    "reason": auth.reason(),
                })),
            ));
        }
        // A legacy session's listen is refused by rmcp (-32601): admit nothing for it.
        let legacy = context
            .protocol_version()
            .is_some_and(|v| v.as_str() < ProtocolVersion::V_2026_07_28.as_str());
        if let ClientRequest::SubscriptionsListenRequest(r) = &request
            && !legacy
        {
            let declared = context
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks());
            let ids = context.extensions.get::<ListenTaskIds>();
            let contents = context.meta.get(CONTENTS) == Some(&serde_json::Value::Bool(true));
            let filter = ListenFilter::from_conn(&r.params.notifications, ids, declared, contents)?;
            // rmcp runs each request in a task of its own and only cancels `ct` when the
            // client cancels it or goes away: stop admitting then (the gateway may be waiting
            // on upstream acks), which drops whatever admission had taken.
            let (ack, listen) = tokio::select! {
                _ = context.ct.cancelled() => {
                    return Err(McpError::invalid_request("the listen was cancelled before its acknowledgment", None));
                }
                opened = self.server.open(&caller, &filter, &self.conn) => opened?,
            };
            return self.server.listen_on_peer(ack, listen, &context).await;
        }
        context.extensions.insert(caller);
        // (An `events/stream` counts against this connection's budget.)
        context.extensions.insert(self.conn.clone());
        self.server.handle_request(request, context).await
    }

    async fn handle_notification(
        &self,
        notification: rmcp::model::ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.server.handle_notification(notification, context).await
    }

    fn get_info(&self) -> ServerConfig {
        self.server.config().clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }
}
