//! The request kinds herald answers itself, whatever carried them: a plain `tools/call` or
//! `resources/read` ([`Plain`]) taken to a JSON-RPC answer by [`SourceServer::answer`], and a
//! `subscriptions/listen` opened by [`SourceServer::open`]. A transport parses the request
//! (deciding from its own framing whether it is one herald answers), then only writes what
//! comes back: the HTTP gate, the first listen read ahead of hyper, the byte streams'
//! [`ConnServer`](crate::mcp::conn::ConnServer) for listens. Everything else is rmcp's.

use rmcp::model::{ErrorCode, RequestId, ServerJsonRpcMessage, ServerResult};

use super::{SourceServer, read_result, to_mcp_error};
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
    /// Runs plain request `id` for `caller` and answers it as rmcp answers a 2026-07-28 peer:
    /// the result stamped with this server's info and (for a read) cache hints filled in, or
    /// the error, logged as rmcp logs it (an unknown resource is `-32602`). One difference, on
    /// purpose: at shutdown the request gets the grace every plain call is promised
    /// ([`call_in_process`](Self::call_in_process)) where rmcp would cut it.
    pub async fn answer(
        &self,
        caller: &Caller,
        id: RequestId,
        request: Plain,
    ) -> ServerJsonRpcMessage {
        let (result, what) = match request {
            Plain::Call { name, args, call } => {
                let r = self.call_in_process(caller, &name, args, *call).await;
                (r.map(ServerResult::from), name)
            }
            Plain::Read { uri, after } => {
                let r = self
                    .read_in_process(caller, crate::mcp::source::Read::after(&uri, after))
                    .await;
                let r = r.map(|c| {
                    let result = read_result(uri.clone(), c);
                    ServerResult::from(rmcp::model::ReadResourceResponse::from(result))
                });
                (r, uri)
            }
        };
        match result {
            Ok(mut r) => {
                self.stamp_result(&mut r);
                // A read is cacheable, private and for no time unless the source said
                // otherwise.
                r.fill_missing_cache_hints();
                ServerJsonRpcMessage::response(r, id)
            }
            Err(e) => {
                let mut e = to_mcp_error(e);
                if e.code == ErrorCode::RESOURCE_NOT_FOUND {
                    e.code = ErrorCode::INVALID_PARAMS;
                }
                tracing::warn!(request = %what, code = e.code.0, "response error: {}", e.message);
                ServerJsonRpcMessage::error(e, Some(id))
            }
        }
    }
}
