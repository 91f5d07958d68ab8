//! What the gateway relays beside tools and resources: prompts (`slug__prompt`, or bare for
//! the `prefix = false` slug), `completion/complete` (routed by the prompt's name or the
//! template's URI), and what every relayed request carries upstream for its caller: the
//! caller's declared capabilities and log level, and its SEP-2322 answers. An upstream that
//! asks for input gets it from the caller, through the gateway: its `InputRequiredResult`
//! goes back as it is, and the caller's next try carries the answers and `requestState` back.

use std::sync::Arc;

use rmcp::model::{
    CallToolResponse, CompleteRequestParams, CompleteResult, GetPromptResponse,
    InputRequiredResult, JsonObject, Prompt, Reference,
};

use super::access::Access;
use super::names::Names;
use super::source::Gateway;
use crate::mcp::source::{Call, Caller, Input, SourceError};
use crate::upstream::Upstream;

/// The `requestState` an upstream hands a caller goes out sealed to that caller and that slug
/// (the upstream serves the gateway, one client for all its callers, so it cannot tell them
/// apart): a state sent back by another caller, for another slug, or changed does not open,
/// and the caller is told to start over. A gateway that restarted has a new key: the same.
impl Access {
    /// Opens the state in `input` (if any) back into the upstream's own.
    pub(crate) fn open_state(
        &self,
        caller: &Caller,
        slug: &str,
        input: &mut Input,
    ) -> Result<(), SourceError> {
        let Some(sealed) = input.request_state.take() else {
            return Ok(());
        };
        let principal = caller.principal();
        match self.states.open(&[&principal, slug], &sealed) {
            Some(state) => {
                input.request_state = Some(state);
                Ok(())
            }
            None => Err(SourceError::InvalidParams(
                "requestState was not issued to this caller for this request (or this gateway \
                 restarted since): send the request again without inputResponses and requestState"
                    .into(),
            )),
        }
    }

    /// `result` with its `requestState`, if any, sealed to `caller` and `slug`.
    pub(crate) fn seal_state(
        &self,
        caller: &Caller,
        slug: &str,
        mut result: InputRequiredResult,
    ) -> InputRequiredResult {
        if let Some(state) = result.request_state.take() {
            let principal = caller.principal();
            result.request_state = Some(self.states.seal(&[&principal, slug], &state));
        }
        result
    }

    /// A relayed call's answer with its state sealed.
    pub(crate) fn sealed_call(
        &self,
        caller: &Caller,
        slug: &str,
        r: CallToolResponse,
    ) -> CallToolResponse {
        match r {
            CallToolResponse::InputRequired(r) => {
                CallToolResponse::InputRequired(self.seal_state(caller, slug, r))
            }
            r => r,
        }
    }
}

impl Gateway {
    /// Every prompt this caller may use, under its shown name.
    pub(super) fn prompt_list(&self, caller: &Caller) -> Vec<Prompt> {
        let mut out = Vec::new();
        // One snapshot for the whole list (a reload swaps it whole).
        let now = self.access().now();
        for u in now.selected(caller) {
            let Some(c) = u.catalog() else { continue };
            for p in &c.prompts {
                let mut p = p.clone();
                p.name = now.shown(&u.name, &p.name);
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
        mut call: Call,
    ) -> Result<GetPromptResponse, SourceError> {
        let Some(route) = self.access().route_name(caller, name, Names::Prompts) else {
            return Err(SourceError::UnknownPrompt(format!(
                "{name} (gateway prompts are named server__prompt)"
            )));
        };
        let (up, prompt) = route?;
        self.access()
            .open_state(caller, &up.name, &mut call.input)?;
        Ok(match up.get_prompt(prompt, args, call).await? {
            GetPromptResponse::InputRequired(r) => {
                GetPromptResponse::InputRequired(self.access().seal_state(caller, &up.name, r))
            }
            r => r,
        })
    }

    /// The slug whose template (or resource) `uri` is, written as listed: `slug+…` names it,
    /// else the first of this caller's slugs that lists it exactly. A template is a pattern,
    /// never routed by what it would match.
    fn template_slug(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<(Arc<Upstream>, String), SourceError> {
        if let Some((slug, rest)) = uri.split_once('+')
            && crate::gateway::config::valid_slug(slug)
            && rest.contains("://")
        {
            return Ok((self.access().slug(caller, slug)?, rest.to_owned()));
        }
        self.selected(caller)
            .into_iter()
            .find(|u| {
                u.catalog().is_some_and(|c| {
                    c.lists(uri) || c.template_entries.iter().any(|t| t.uri_template == uri)
                })
            })
            .map(|u| (u, uri.to_owned()))
            .ok_or_else(|| SourceError::NotFound { uri: uri.into() })
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
                let (up, uri) = self.template_slug(caller, &r.uri)?;
                r.uri = uri;
                up
            }
            _ => {
                return Err(SourceError::InvalidParams(
                    "completion/complete: ref must be ref/prompt or ref/resource".into(),
                ));
            }
        };
        Ok(up.complete(request).await?)
    }
}
