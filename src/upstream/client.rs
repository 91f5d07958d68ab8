//! What a role asks of an upstream: [`Upstream::call_tool`], [`Upstream::get_prompt`],
//! [`Upstream::complete`], [`Upstream::request`] (any request relayed for a caller),
//! [`Upstream::read`], [`Upstream::listen`], and beside them `follow_log` (in `log.rs`),
//! `custom` and `tasks_request` (in `mod.rs`). Each picks the way itself: a server in this
//! process directly (its handler, no serialization), an HTTP upstream that is up by a direct
//! post, anything else over its rmcp connection, connecting first if need be. Every one is
//! bounded by [`REQUEST_TIMEOUT`] and fails with an [`UpstreamError`] by cause; a broken
//! connection (not one slow or refused request) is forgotten, so the next use reconnects.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientRequest, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, JsonObject, ReadResourceRequestParams, ServerResult,
    SubscriptionFilter,
};
use rmcp::service::PeerRequestOptions;

use super::{
    CancelOnDrop, ContentsError, Listening, REQUEST_TIMEOUT, UPWARD_CAPACITY, Upstream,
    UpstreamError, Upward,
};
use crate::mcp::source::{Call, Caller, Contents};

impl Upstream {
    /// Calls `tool` for a caller's `call`: its progress, capabilities, log level and SEP-2322
    /// answers go upstream, what the upstream sends for the call comes back to it, and an
    /// `InputRequiredResult` comes back as it is.
    pub async fn call_tool(
        self: &Arc<Self>,
        tool: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, UpstreamError> {
        if let Some(local) = self.in_process() {
            // A role in this process: its handler, directly (the caller's progress too).
            let me = Caller::local();
            let call = local.call_in_process(&me, tool, args, call);
            return match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
                Ok(r) => r.map_err(UpstreamError::in_process),
                Err(_) => Err(self.timed_out()),
            };
        }
        if let Some(direct) = self.http_calls(tool)
            && let Some(live) = self.cached()
        {
            // An HTTP upstream that is up: posted on the pooled client, no rmcp hop in
            // between. A failure forgets the connection, so the next call reconnects through
            // `live` (one connect at a time, paced by the backoff, the catalog fetched again).
            return match tokio::time::timeout(REQUEST_TIMEOUT, direct.call(tool, &args, &call))
                .await
            {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => {
                    let e = UpstreamError::direct(&self.name, e);
                    if e.is_broken() {
                        tracing::warn!(slug = %self.name, error = %e, "a call to the upstream failed");
                        self.reset(&live);
                    }
                    Err(e)
                }
                Err(_) => Err(self.timed_out()),
            };
        }
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        params.input_responses = call.input.responses.clone();
        params.request_state = call.input.request_state.clone();
        let request = ClientRequest::CallToolRequest(rmcp::model::Request::new(params));
        // Boxed: rmcp's path would make every call's future (the direct one's too) more than
        // twice as large, and a call's future is moved whole when it starts.
        match Box::pin(self.request(request, &call)).await? {
            ServerResult::CallToolResult(r) => Ok(r.into()),
            ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
            _ => Err(self.unusable("answered a plain call with a task, which it may not")),
        }
    }

    /// A request relayed for a caller over the rmcp connection, with the caller's `_meta`
    /// ([`Call::upstream_meta`]) and rmcp's timeout, which also tells the upstream to cancel.
    /// The upstream's progress goes to the caller under its own token, and its log messages
    /// to the caller that asked for them; a caller that gives up drops this future and the
    /// upstream is told to stop.
    pub async fn request(
        self: &Arc<Self>,
        request: ClientRequest,
        call: &Call,
    ) -> Result<ServerResult, UpstreamError> {
        let live = self.live().await?;
        let failed = |e: rmcp::ServiceError| self.failure(&live, REQUEST_TIMEOUT, e);
        let mut options = PeerRequestOptions::with_timeout(REQUEST_TIMEOUT);
        options.meta = call.upstream_meta();
        // The upstream's progress (under the token rmcp gave this request) and its log
        // messages come to this call's channel, handed over in wire order by the connection's
        // tap before the answer behind them is delivered ([`super::Relay`]). The log route is
        // there before the request leaves (a log message names no request, so none is kept
        // for later); progress that comes before its token is known waits for it.
        let (tx, mut upward) = tokio::sync::mpsc::channel(UPWARD_CAPACITY);
        // Log messages name no request: only a 2026-07-28 server sends them just for the
        // request that asked (an older one logs for its whole session, any caller's calls).
        let _logging = (call.log.as_ref())
            .filter(|_| live.conn.is_modern())
            .map(|_| self.relay.route_log(tx.clone()));
        let handle = live
            .conn
            .send_cancellable_request(request, options)
            .await
            .map_err(failed)?;
        let _relaying = call.progress.as_ref().map(|_| {
            self.relay
                .register(handle.progress_token.clone(), tx.clone())
        });
        drop(tx);
        let mut cancel = CancelOnDrop::new(
            self,
            handle.peer.clone(),
            handle.id.clone(),
            "the caller cancelled the request",
        );
        let answer = handle.await_response();
        tokio::pin!(answer);
        let answer = loop {
            tokio::select! {
                biased;
                Some(up) = upward.recv() => forward(call, up).await,
                answer = &mut answer => break answer,
            }
        };
        cancel.disarm();
        // Everything the upstream sent before its answer is in the channel now: it leaves
        // before the answer does, within the request's bound (a caller that does not read
        // loses it, not its answer).
        drop(_relaying);
        drop(_logging);
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, async {
            while let Ok(up) = upward.try_recv() {
                forward(call, up).await;
            }
        })
        .await;
        let answer = answer.map_err(failed)?;
        Ok(answer)
    }

    /// `prompts/get` of `prompt` for a caller's `call` (its answers, progress and log level,
    /// as a tool call's); an `InputRequiredResult` comes back as it is.
    pub async fn get_prompt(
        self: &Arc<Self>,
        prompt: String,
        args: JsonObject,
        call: Call,
    ) -> Result<GetPromptResponse, UpstreamError> {
        if let Some(local) = self.in_process() {
            let me = Caller::local();
            let get = local.prompt_in_process(&me, &prompt, args, call);
            return match tokio::time::timeout(REQUEST_TIMEOUT, get).await {
                Ok(r) => r.map_err(UpstreamError::in_process),
                Err(_) => Err(self.timed_out()),
            };
        }
        let mut params = GetPromptRequestParams::new(prompt);
        params.arguments = Some(args);
        params.input_responses = call.input.responses.clone();
        params.request_state = call.input.request_state.clone();
        let request = ClientRequest::GetPromptRequest(rmcp::model::Request::new(params));
        match self.request(request, &call).await? {
            ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            _ => Err(self.unusable("answered prompts/get with something other than a prompt")),
        }
    }

    /// `completion/complete`. A server that offers no completions (its catalog says so, or
    /// it does not know the method) answers no values.
    pub async fn complete(
        self: &Arc<Self>,
        request: CompleteRequestParams,
    ) -> Result<CompleteResult, UpstreamError> {
        let r = if let Some(local) = self.in_process() {
            match tokio::time::timeout(
                REQUEST_TIMEOUT,
                local.complete_in_process(&Caller::local(), request),
            )
            .await
            {
                Ok(r) => r.map_err(UpstreamError::in_process),
                Err(_) => Err(self.timed_out()),
            }
        } else {
            if self.catalog().is_some_and(|c| !c.completions) {
                return Ok(CompleteResult::default());
            }
            let request = ClientRequest::CompleteRequest(rmcp::model::Request::new(request));
            match self.request(request, &Call::default()).await? {
                ServerResult::CompleteResult(r) => Ok(r),
                _ => Err(self.unusable(
                    "answered completion/complete with something other than completions",
                )),
            }
        };
        match r {
            Err(UpstreamError::NotFound { code, .. })
                if code == rmcp::model::ErrorCode::METHOD_NOT_FOUND.0 =>
            {
                Ok(CompleteResult::default())
            }
            r => r,
        }
    }

    /// Reads `uri`, saying the highest `seq` of an event log the reader has (`after`), so a
    /// herald server answers only what is newer
    /// ([`READ_AFTER_META`](crate::mcp::source::READ_AFTER_META)).
    pub async fn read(
        self: &Arc<Self>,
        uri: &str,
        after: Option<u64>,
    ) -> Result<Contents, UpstreamError> {
        if let Some(local) = self.in_process() {
            let me = Caller::local();
            let read = local.read_in_process(&me, crate::mcp::source::Read::after(uri, after));
            return match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
                Ok(r) => r.map_err(UpstreamError::in_process),
                Err(_) => Err(self.timed_out()),
            };
        }
        let live = self.live().await?;
        let mut params = ReadResourceRequestParams::new(uri.to_owned());
        if let Some(n) = after {
            let mut meta = rmcp::model::RequestMetaObject::new();
            meta.0
                .0
                .insert(crate::mcp::source::READ_AFTER_META.into(), n.into());
            params.meta = Some(meta);
        }
        let r = match tokio::time::timeout(REQUEST_TIMEOUT, live.conn.read_resource(params)).await {
            Ok(r) => r.map_err(|e| self.failure(&live, REQUEST_TIMEOUT, e))?,
            Err(_) => return Err(self.timed_out()),
        };
        super::contents(r).map_err(|e| match e {
            ContentsError::Empty => self.unusable("returned no contents"),
            ContentsError::Unsupported => {
                self.unusable("returned contents of a kind herald does not handle")
            }
        })
    }

    /// Opens a `subscriptions/listen` for `filter` on the connection (made if need be), and
    /// returns it once acknowledged. A server that speaks no 2026-07-28
    /// cannot listen: that is its verdict ([`UpstreamError::Unusable`]).
    pub async fn listen(
        self: &Arc<Self>,
        filter: SubscriptionFilter,
    ) -> Result<Listening, UpstreamError> {
        let live = self.live().await?;
        if !live.conn.is_modern() {
            self.reset(&live);
            return Err(self.unusable(&format!(
                "speaks MCP {}; watching needs protocol version 2026-07-28 (subscriptions/listen)",
                live.conn
                    .protocol_version()
                    .unwrap_or_else(|| "of an unknown version".into())
            )));
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, live.conn.listen(filter)).await {
            Err(_) => Err(self.timed_out()),
            Ok(Ok(sub)) => Ok(Listening {
                carries: self.relay.contents && live.catalog.contents,
                live,
                sub,
            }),
            Ok(Err(e)) => Err(self.failure(&live, REQUEST_TIMEOUT, e)),
        }
    }

    pub(super) fn timed_out(&self) -> UpstreamError {
        UpstreamError::TimedOut {
            server: self.name.clone(),
            after: REQUEST_TIMEOUT,
        }
    }

    pub(super) fn unusable(&self, why: &str) -> UpstreamError {
        UpstreamError::Unusable {
            server: self.name.clone(),
            why: why.to_owned(),
        }
    }
}

/// Sends what the upstream sent for a call on to its caller: progress under the caller's own
/// token, a log message through the caller's level filter.
#[allow(deprecated)] // logging is deprecated by SEP-2577, still in 2026-07-28
async fn forward(call: &Call, up: Upward) {
    match up {
        Upward::Progress(mut p) => {
            if let Some(to) = &call.progress {
                p.progress_token = to.token.clone();
                let _ = to.peer.notify_progress(p).await;
            }
        }
        Upward::Log(l) => {
            if let Some(to) = &call.log {
                to.send(l.level, l.logger.as_deref().unwrap_or(""), l.data)
                    .await;
            }
        }
    }
}
