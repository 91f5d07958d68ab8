//! A `tools/call` relayed to the slug that has the tool, by the shortest path it has: a role
//! in this process directly, an HTTP upstream that is up by a direct post, anything else over
//! its rmcp connection. Each carries the caller's progress, capabilities, log level and
//! SEP-2322 answers, and relays back what the upstream sends for the call.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientRequest, JsonObject, ServerResult,
};

use rmcp::service::PeerRequestOptions;

use super::source::Gateway;
use crate::mcp::source::{Call, Caller, SourceError};
use crate::upstream::{self, REQUEST_TIMEOUT, Upstream, upstream_error};

impl Gateway {
    /// Relays the call of `tool` (its upstream name) to `up`.
    pub(super) async fn relay_call(
        &self,
        up: &Arc<Upstream>,
        tool: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, SourceError> {
        let slug = up.name.as_str();
        if let Some(local) = up.in_process() {
            // A role in this process: its handler, directly (the caller's progress too),
            // bounded as a call over a connection is.
            let me = Caller::local();
            let call = local.call_in_process(&me, tool, args, call);
            return tokio::time::timeout(REQUEST_TIMEOUT, call)
                .await
                .unwrap_or_else(|_| {
                    Err(SourceError::Unavailable(format!(
                        "server {slug} did not answer within {} s; try again shortly",
                        REQUEST_TIMEOUT.as_secs()
                    )))
                });
        }
        if let Some(direct) = up.http_calls(tool)
            && let Some(live) = up.cached()
        {
            // An HTTP upstream that is up: posted on the pooled client, no rmcp hop in
            // between. A failure forgets the connection, so the next call reconnects through
            // `live` (one connect at a time, paced by the backoff, the catalog fetched again).
            let unavailable = || {
                SourceError::Unavailable(format!(
                    "server {slug} is unavailable right now (or did not answer within {} s); try again shortly",
                    REQUEST_TIMEOUT.as_secs()
                ))
            };
            return match tokio::time::timeout(REQUEST_TIMEOUT, direct.call(tool, &args, &call))
                .await
            {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(upstream::http::CallError::Answered(e))) => Err(e),
                Ok(Err(upstream::http::CallError::Transport(why))) => {
                    tracing::warn!(%slug, error = %why, "a call to the upstream failed");
                    up.reset(&live);
                    Err(unavailable())
                }
                Err(_) => Err(unavailable()),
            };
        }
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        params.input_responses = call.input.responses.clone();
        params.request_state = call.input.request_state.clone();
        let request = ClientRequest::CallToolRequest(rmcp::model::Request::new(params));
        let answer = relay(up, request, &call).await?;
        match answer {
            ServerResult::CallToolResult(r) => Ok(r.into()),
            ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
            _ => Err(SourceError::Unavailable(format!(
                "server {slug} answered a plain call with a task, which it may not"
            ))),
        }
    }
}

/// A request relayed for a caller over `up`'s rmcp connection (connecting first if need be),
/// with the caller's `_meta` ([`Call::upstream_meta`]) and rmcp's timeout, which also tells the
/// upstream to cancel. The upstream's progress goes to the caller under its own token; a
/// caller that gives up drops this future and the upstream is told to stop; an error the
/// upstream answered comes back as it is, and a broken connection (not one slow request) is
/// forgotten.
pub(super) async fn relay(
    up: &Arc<Upstream>,
    request: ClientRequest,
    call: &Call,
) -> Result<ServerResult, SourceError> {
    let live = up.live().await?;
    let broken = |e: rmcp::ServiceError| {
        let timed_out = matches!(e, rmcp::ServiceError::Timeout { .. });
        upstream_error(e).unwrap_or_else(|| {
            if !timed_out {
                up.reset(&live);
            }
            SourceError::Unavailable(format!(
                "server {} is unavailable right now (or did not answer within {} s); try again shortly",
                up.name,
                REQUEST_TIMEOUT.as_secs()
            ))
        })
    };
    let mut options = PeerRequestOptions::with_timeout(REQUEST_TIMEOUT);
    options.meta = call.upstream_meta();
    let handle = live
        .conn
        .send_cancellable_request(request, options)
        .await
        .map_err(broken)?;
    // The upstream's progress (under the token rmcp gave this request) goes to this caller,
    // under the caller's own token.
    let relaying = call
        .progress
        .clone()
        .map(|p| up.relay.register(handle.progress_token.clone(), p));
    let logging = call.log.clone().map(|l| up.relay.route_log(l));
    let mut cancel = upstream::CancelOnDrop::new(
        up,
        handle.peer.clone(),
        handle.id.clone(),
        "the caller cancelled the request",
    );
    let answer = handle.await_response().await;
    cancel.disarm();
    let answer = answer.map_err(broken)?;
    // The upstream sent its progress and log messages before its answer, but rmcp handles
    // notifications in tasks of their own: let those just started forward theirs before the
    // answer leaves.
    if relaying.is_some() || logging.is_some() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
    Ok(answer)
}
