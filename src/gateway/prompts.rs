//! What the gateway relays beside tools and resources: prompts (`slug__prompt`, or bare for
//! the `prefix = false` slug), `completion/complete` (routed by the prompt's name or the
//! template's URI), and what every relayed request carries upstream for its caller: the
//! caller's declared capabilities and log level, and its SEP-2322 answers. An upstream that
//! asks for input gets it from the caller, through the gateway: its `InputRequiredResult`
//! goes back as it is, and the caller's next try carries the answers and `requestState` back.

use std::sync::Arc;

use rmcp::model::{
    ClientRequest, CompleteRequestParams, CompleteResult, GetPromptRequestParams,
    GetPromptResponse, JsonObject, Prompt, Reference, ServerResult,
};
use rmcp::service::PeerRequestOptions;

use super::source::{Gateway, Names};
use crate::mcp::source::{Call, Caller, SourceError};
use crate::mcp::upstream::{REQUEST_TIMEOUT, Upstream, upstream_error};

/// The request options of a relayed request: the gateway's timeout and the caller's `_meta`
/// ([`Call::upstream_meta`]).
pub(crate) fn options(call: &Call) -> PeerRequestOptions {
    let mut options = PeerRequestOptions::with_timeout(REQUEST_TIMEOUT);
    options.meta = call.upstream_meta();
    options
}

fn unavailable(slug: &str) -> SourceError {
    SourceError::Unavailable(format!(
        "server {slug} is unavailable right now (or did not answer within {} s); try again shortly",
        REQUEST_TIMEOUT.as_secs()
    ))
}

/// Sends `request` on `up`'s connection (connecting first if need be) with `call`'s
/// options; an error the upstream answered comes back as it is, a broken connection resets
/// it.
async fn send(
    up: &Arc<Upstream>,
    request: ClientRequest,
    call: &Call,
) -> Result<ServerResult, SourceError> {
    let live = up.live().await?;
    let answer = live
        .conn
        .send_request_with_option(request, options(call))
        .await
        .map_err(|e| upstream_error(e).unwrap_or_else(|| unavailable(&up.name)))?;
    answer.await_response().await.map_err(|e| {
        let timed_out = matches!(e, rmcp::ServiceError::Timeout { .. });
        upstream_error(e).unwrap_or_else(|| {
            if !timed_out {
                up.reset(&live);
            }
            unavailable(&up.name)
        })
    })
}

impl Gateway {
    /// Every prompt this caller may use, under its shown name.
    pub(super) fn prompt_list(&self, caller: &Caller) -> Vec<Prompt> {
        let mut out = Vec::new();
        for u in self.selected(caller) {
            let Some(c) = u.catalog() else { continue };
            for p in &c.prompts {
                let mut p = p.clone();
                p.name = self.access().shown(&u.name, &p.name);
                out.push(p);
            }
        }
        out
    }

    /// `prompts/get` of a shown prompt name, relayed.
    pub(super) async fn prompt_get(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<GetPromptResponse, SourceError> {
        let Some(route) = self.access().route_name(caller, name, Names::Prompts) else {
            return Err(SourceError::UnknownPrompt(format!(
                "{name} (gateway prompts are named server__prompt)"
            )));
        };
        let (up, prompt) = route?;
        if let Some(local) = up.in_process() {
            let me = Caller::local();
            let get = local.prompt_in_process(&me, &prompt, args, call);
            return tokio::time::timeout(REQUEST_TIMEOUT, get)
                .await
                .unwrap_or_else(|_| Err(unavailable(&up.name)));
        }
        let mut params = GetPromptRequestParams::new(prompt);
        params.arguments = Some(args);
        params.input_responses = call.input.responses.clone();
        params.request_state = call.input.request_state.clone();
        let request = ClientRequest::GetPromptRequest(rmcp::model::Request::new(params));
        match send(&up, request, &call).await? {
            ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            _ => Err(SourceError::Unavailable(format!(
                "server {} answered prompts/get with something other than a prompt",
                up.name
            ))),
        }
    }

    /// `completion/complete`, relayed to the slug of the prompt or template it is about
    /// (with the name or URI that slug knows it by). A slug without completions answers no
    /// values.
    pub(super) async fn completion(
        &self,
        caller: &Caller,
        mut request: CompleteRequestParams,
    ) -> Result<CompleteResult, SourceError> {
        let up = match &mut request.r#ref {
            Reference::Prompt(p) => {
                let Some(route) = self.access().route_name(caller, &p.name, Names::Prompts) else {
                    return Err(SourceError::UnknownPrompt(p.name.clone()));
                };
                let (up, name) = route?;
                p.name = name;
                up
            }
            Reference::Resource(r) => {
                let (up, uri) = self.route(caller, &r.uri)?;
                r.uri = uri;
                up
            }
            _ => {
                return Err(SourceError::InvalidParams(
                    "completion/complete: ref must be ref/prompt or ref/resource".into(),
                ));
            }
        };
        if let Some(local) = up.in_process() {
            return local
                .complete_in_process(&Caller::local(), request)
                .await
                .or_else(|e| match e {
                    SourceError::Upstream { code, .. }
                        if code == rmcp::model::ErrorCode::METHOD_NOT_FOUND.0 =>
                    {
                        Ok(CompleteResult::default())
                    }
                    e => Err(e),
                });
        }
        if up.catalog().is_some_and(|c| !c.completions) {
            return Ok(CompleteResult::default());
        }
        let request = ClientRequest::CompleteRequest(rmcp::model::Request::new(request));
        match send(&up, request, &Call::default()).await? {
            ServerResult::CompleteResult(r) => Ok(r),
            _ => Err(SourceError::Unavailable(format!(
                "server {} answered completion/complete with something other than completions",
                up.name
            ))),
        }
    }
}
