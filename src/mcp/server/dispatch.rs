//! The request kinds herald answers itself, whatever carried them: a plain `tools/call` or
//! `resources/read` ([`Plain`]) taken to a JSON-RPC answer by [`SourceServer::answer`], and a
//! `subscriptions/listen` opened by [`SourceServer::open`]. A transport parses the request
//! (deciding from its own framing whether it is one herald answers), then only writes what
//! comes back: the HTTP gate, the first listen read ahead of hyper, the byte streams'
//! [`ConnServer`](crate::mcp::conn::ConnServer) for listens. Everything else is rmcp's
//! dispatch, whose handlers run the same cores: a read is [`SourceServer::read_plain`] and a
//! call in place `call_plain`'s `run_in_place` on every transport, so a request kind has one
//! way to run and only its framing differs.

use rmcp::model::{
    ErrorCode, ErrorData as McpError, ReadResourceResponse, ReadResourceResult, RequestId,
    ServerJsonRpcMessage, ServerResult,
};

use super::{SourceServer, read_result};
use crate::mcp::caller::Caller;

/// A plain request herald answers itself: see [`SourceServer::answer`].
pub enum Plain {
    /// `tools/call`, run in place.
    Call {
        name: String,
        args: rmcp::model::JsonObject,
        call: Box<crate::mcp::source::Call>,
    },
    /// `resources/read`.
    Read {
        uri: String,
        /// The reader's `io.herald/after` hint.
        after: Option<u64>,
    },
}

impl SourceServer {
    /// `resources/read` for `caller`, whatever carried it (the HTTP gate's plain read, rmcp's
    /// handler): the one read ([`read_in_process`](Self::read_in_process)'s), its result
    /// stamped with this server's info.
    pub(super) async fn read_plain(
        &self,
        caller: &Caller,
        uri: String,
        after: Option<u64>,
    ) -> Result<ReadResourceResult, McpError> {
        let c = self
            .read_cut(caller, crate::mcp::source::Read::after(&uri, after))
            .await?;
        let mut r = read_result(uri, c);
        self.stamp(&mut r.meta);
        Ok(r)
    }

    /// Runs plain request `id` for `caller` and answers it in the shape of a 2026-07-28
    /// answer (every plain request is one): the same calls and reads rmcp's handler runs,
    /// with the finish rmcp's dispatch gives such a peer (its cache hints filled in by rmcp's
    /// own function; an unknown resource is `-32602`). One difference, on purpose: at
    /// shutdown the request gets the grace every plain call is promised where rmcp would cut
    /// it.
    pub async fn answer(
        &self,
        caller: &Caller,
        id: RequestId,
        request: Plain,
    ) -> ServerJsonRpcMessage {
        let (result, what) = match request {
            Plain::Call { name, args, call } => {
                let r = self.call_plain(caller, &name, args, *call).await;
                (r.map(ServerResult::from), name)
            }
            Plain::Read { uri, after } => {
                let r = self.read_plain(caller, uri.clone(), after).await;
                let r = r.map(|r| ServerResult::from(ReadResourceResponse::from(r)));
                (r, uri)
            }
        };
        match result {
            Ok(mut r) => {
                r.fill_missing_cache_hints();
                ServerJsonRpcMessage::response(r, id)
            }
            Err(mut e) => {
                if e.code == ErrorCode::RESOURCE_NOT_FOUND {
                    e.code = ErrorCode::INVALID_PARAMS;
                }
                tracing::warn!(request = %what, code = e.code.0, "response error: {}", e.message);
                ServerJsonRpcMessage::error(e, Some(id))
            }
        }
    }
}
