//! The source trait: what a change source implements, and nothing more.
//!
//! A source lists its resources and templates, reads a URI in one of the two read shapes
//! (state or event-log), admits listens (which URIs a caller may watch, and what keeps them
//! watched), optionally offers tools, and publishes changed URIs on its [`ChangeFeed`]. Every
//! method whose answer may depend on who asks takes the request's [`Caller`]. The plumbing in [`crate::mcp::server`] turns that into
//! `server/discover`, `resources/*`, `tools/*`, `subscriptions/listen` and its notifications,
//! limits and errors, the same way for every source.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResponse, CompleteRequestParams, CompleteResult, GetPromptResponse,
    InputRequiredResult, JsonObject, Prompt, Resource, ResourceTemplate, Tool,
};
use serde_json::Value;

/// The `resources/read` `_meta` key by which a reader of an event log says the highest `seq`
/// it has: herald's watch client sends it, and every event-log read on herald's servers then
/// returns one page of the events after it (with the one before as an anchor), not the whole
/// ring, saying when more waits ([`crate::mcp::ring::more_waiting`]). Other servers ignore it
/// and answer the whole log, which reads the same.
pub const READ_AFTER_META: &str = "io.herald/after";

/// The hint in a request's `_meta`.
pub fn read_after_of(meta: Option<&rmcp::model::RequestMetaObject>) -> Option<u64> {
    meta?.0.0.get(READ_AFTER_META)?.as_u64()
}

pub use crate::mcp::admission::{Admission, ListenFilter, WatchGuard};
pub use crate::mcp::call::{Call, Input, Log, Progress};
pub use crate::mcp::caller::Caller;
pub use crate::mcp::error::SourceError;
use crate::mcp::hub::ChangeFeed;
pub use crate::mcp::lists::{PROMPTS_CHANGED, TOOLS_CHANGED};
use crate::mcp::ring::{EVENT_LOG_MIME, EventRing};

/// One `resources/read` as a source gets it: the URI, and the reader's hint (`after`, from
/// [`READ_AFTER_META`]) that it has an event log's events up to that `seq`. The hint travels
/// with the request, from the handler to [`Source::read`] and on to [`Contents::event_log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read<'a> {
    pub uri: &'a str,
    pub after: Option<u64>,
}

impl<'a> Read<'a> {
    /// A read of `uri` with no hint: an event log answers whole.
    pub fn new(uri: &'a str) -> Read<'a> {
        Read { uri, after: None }
    }

    /// A read of `uri` by a reader that has the events up to `after`.
    pub fn after(uri: &'a str, after: Option<u64>) -> Read<'a> {
        Read { uri, after }
    }
}

/// One read of a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Contents {
    pub mime_type: String,
    pub body: Body,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Text(String),
    Blob(Vec<u8>),
}

impl Contents {
    /// A state read holding JSON.
    pub fn json(value: &Value) -> Contents {
        Contents {
            mime_type: "application/json".into(),
            body: Body::Text(value.to_string()),
        }
    }

    /// An event-log read of `ring`: the whole ring, or with the reader's hint `after`
    /// ([`Read::after`]) only what it lacks ([`EventRing::read_json_after`]).
    pub fn event_log(ring: &EventRing, after: Option<u64>) -> Contents {
        Contents {
            mime_type: EVENT_LOG_MIME.into(),
            body: Body::Text(match after {
                Some(n) => ring.read_json_after(n),
                None => ring.read_json(),
            }),
        }
    }

    pub fn text(mime_type: impl Into<String>, text: impl Into<String>) -> Contents {
        Contents {
            mime_type: mime_type.into(),
            body: Body::Text(text.into()),
        }
    }

    pub fn blob(mime_type: impl Into<String>, bytes: Vec<u8>) -> Contents {
        Contents {
            mime_type: mime_type.into(),
            body: Body::Blob(bytes),
        }
    }
}

/// Identity of a source as the server announces it.
#[derive(Debug, Clone, Default)]
pub struct SourceInfo {
    /// Short role name, e.g. `memo`; the server calls itself `herald-<name>`.
    pub name: String,
    pub instructions: Option<String>,
    /// Whether it answers `completion/complete` (the `completions` capability).
    pub completions: bool,
    /// Whether its tool and prompt lists change while it runs (`listChanged` on `tools` and
    /// `prompts`; it then publishes [`TOOLS_CHANGED`] / [`PROMPTS_CHANGED`] on its feed).
    pub list_changed: bool,
}

/// What a source makes of a caller's credentials ([`Source::authenticates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authentication {
    /// A caller this source serves (what it may use is decided per request).
    Known,
    /// No token, where one is required.
    TokenRequired,
    /// No caller over the network can be let in: no tokens are configured.
    NoTokens,
    /// A token that matches none this source knows.
    UnknownToken,
    /// A known caller whose `?servers=` names none it may use (or none that exists: it is
    /// not told which).
    NothingSelected,
}

impl Authentication {
    /// What a refused caller is told, the same words on every transport (HTTP answers them
    /// with `401`, a byte stream as the request's `-32024` error); `None` for a known caller.
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            Authentication::Known => None,
            Authentication::TokenRequired => Some(
                "this server requires a token: send it as `Authorization: Bearer TOKEN` (herald's clients send HERALD_TOKEN); the server's operator adds it as a [[token]] with sha256 = the output of `printf %s TOKEN | sha256sum`",
            ),
            Authentication::NoTokens => Some(
                "this server has no tokens configured, so it serves no caller over the network: add [[token]] entries to its config (or reach it on loopback when it is bound to loopback alone)",
            ),
            Authentication::UnknownToken => Some(
                "the token is not one this server knows: check it (HERALD_TOKEN for herald's clients), or have the server's operator add a [[token]] with sha256 = the output of `printf %s TOKEN | sha256sum`",
            ),
            Authentication::NothingSelected => Some(
                "?servers= names no server this caller may use (or none that exists): check the names; without ?servers= the listings show every server it may use",
            ),
        }
    }

    /// `data.reason` of a refusal on a byte stream, for a client to match on.
    pub fn reason(self) -> &'static str {
        match self {
            Authentication::Known => "known",
            Authentication::TokenRequired => "token_required",
            Authentication::NoTokens => "no_tokens",
            Authentication::UnknownToken => "unknown_token",
            Authentication::NothingSelected => "nothing_selected",
        }
    }
}

/// Whether `tool` says it only reads (`readOnlyHint` and not `destructiveHint`): what a
/// caller entitled to read alone may call.
pub fn is_read_only(tool: &Tool) -> bool {
    let a = tool.annotations.as_ref();
    a.and_then(|a| a.read_only_hint) == Some(true)
        && a.and_then(|a| a.destructive_hint) != Some(true)
}

/// A server as an OAuth 2.1 protected resource: its identifier (the `aud` its access tokens
/// carry) and the authorization servers that issue them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectedResource {
    pub resource: String,
    pub authorization_servers: Vec<String>,
}

/// `data.kind` of a request refused because its caller is not known (a missing or unknown
/// token over QUIC): a client says it as HTTP's `401` is said.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// A change source. See the module docs.
#[async_trait]
pub trait Source: Send + Sync + 'static {
    fn info(&self) -> SourceInfo;

    /// Fixed resources (`resources/list`) this caller may see.
    fn resources(&self, caller: &Caller) -> Vec<Resource>;

    /// RFC 6570 templates (`resources/templates/list`) this caller may use.
    fn templates(&self, caller: &Caller) -> Vec<ResourceTemplate> {
        let _ = caller;
        Vec::new()
    }

    /// Whether `caller`'s credentials are ones this source knows: `Refused` turns a request
    /// away before it is read (HTTP `401`). Sources that serve everyone know every caller;
    /// the gateway knows its configured tokens, and no token only where one is not needed.
    async fn authenticates(&self, caller: &Caller) -> Authentication {
        let _ = caller;
        Authentication::Known
    }

    /// Who `caller` (let in) is across its credentials, when this source tells (a gateway's
    /// access token: `oauth:` and its issuer's and subject's hash); owners of tasks and
    /// subscriptions. `None`: known by its token ([`Caller::principal`]).
    fn known_as(&self, caller: &Caller) -> Option<String> {
        let _ = caller;
        None
    }

    /// How long `caller`'s credentials have left, when they end (an access token's `exp`,
    /// with the clock skew allowed; nothing left once it no longer verifies): its listen and
    /// events streams end then, and the client opens them again with a fresh token. `None`
    /// for credentials that do not expire.
    fn expires_in(&self, caller: &Caller) -> Option<std::time::Duration> {
        let _ = caller;
        None
    }

    /// What this source says of itself as an OAuth 2.1 protected resource (RFC 9728), when
    /// it takes identity providers' access tokens (a gateway with `[[issuer]]`s).
    fn protected_resource(&self) -> Option<ProtectedResource> {
        None
    }

    /// Who `caller` is, when this source knows callers by their tokens (the gateway): a key
    /// that tells tokens apart (never the token itself) and the name to say (the
    /// `[[token]]`'s); listen streams are then budgeted per caller rather than per client
    /// address. `None` for a caller it does not tell apart.
    fn identity(&self, caller: &Caller) -> Option<(String, String)> {
        let _ = caller;
        None
    }

    /// Reads `read.uri` (an event log with the reader's hint, `read.after`). Unknown URIs are
    /// [`SourceError::NotFound`], never empty contents.
    async fn read(&self, caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError>;

    /// Admits a listen: which of the URIs `filter` names this caller may watch (each with the
    /// key its changes are published under), and the guards that keep them watched for as
    /// long as the listen runs. Called once per listen, before its acknowledgment, which names
    /// exactly what is accepted here; a URI left out is simply not in the ack (with its
    /// reason in [`Admission::refuse`], for the log). See [`crate::mcp::admission`].
    async fn admit(&self, caller: &Caller, filter: &ListenFilter) -> Admission;

    /// The feed this source publishes changed URIs (feed keys) on.
    fn changes(&self) -> ChangeFeed;

    /// The tools this caller may see: borrowed from the source where the listing is the same
    /// for every caller (built once, not per call: every `tools/call` looks its tool up).
    fn tools(&self, caller: &Caller) -> Cow<'_, [Tool]> {
        let _ = caller;
        Cow::Borrowed(&[])
    }

    /// Tool `name` as this caller sees it (its `Mcp-Param-*` headers are checked against
    /// it). A source whose listing is costly to build answers it directly.
    fn tool(&self, caller: &Caller, name: &str) -> Option<Tool> {
        self.tools(caller).iter().find(|t| t.name == name).cloned()
    }

    /// Calls tool `name`. `call.progress` is set when the caller asked for progress
    /// (`_meta.progressToken`): a source that reports progress (the gateway relays its
    /// upstreams') sends it there. `call.task` is set when the call runs as a task (only for
    /// a tool whose listing says it may, see [`crate::mcp::tasks::optional`]).
    ///
    /// It may answer `InputRequired` (SEP-2322) to ask the client for input first: the client
    /// sends the call again with its answers in `call.input`.
    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, SourceError> {
        let _ = (caller, args, call);
        Err(SourceError::UnknownTool(name.to_owned()))
    }

    /// Before a call of tool `name` runs as a task: input the source needs from the client
    /// first (SEP-2322 rounds before the task is made), or `None` to make the task. The
    /// task's call then sees the answers in `call.input`.
    async fn before_task(
        &self,
        caller: &Caller,
        name: &str,
        args: &JsonObject,
        call: &Call,
    ) -> Result<Option<InputRequiredResult>, SourceError> {
        let _ = (caller, name, args, call);
        Ok(None)
    }

    /// The prompts this caller may see.
    fn prompts(&self, caller: &Caller) -> Vec<Prompt> {
        let _ = caller;
        Vec::new()
    }

    /// `prompts/get`: prompt `name` with `args`; may answer `InputRequired` as a tool call
    /// may.
    async fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<GetPromptResponse, SourceError> {
        let _ = (caller, args, call);
        Err(SourceError::UnknownPrompt(name.to_owned()))
    }

    /// `completion/complete` (asked only when [`SourceInfo::completions`] is set): values
    /// for one argument of a prompt or a resource template.
    async fn complete(
        &self,
        caller: &Caller,
        request: CompleteRequestParams,
    ) -> Result<CompleteResult, SourceError> {
        let _ = (caller, request);
        Ok(CompleteResult::default())
    }

    /// Whether tool `name` may run as a task for this caller: what its listing says (marked
    /// with [`crate::mcp::tasks::optional`] or [`crate::mcp::tasks::required`]). A source
    /// whose listing is costly to build answers it directly.
    fn task_support(&self, caller: &Caller, name: &str) -> crate::mcp::tasks::TaskSupport {
        self.tools(caller)
            .iter()
            .find(|t| t.name == name)
            .map_or(crate::mcp::tasks::TaskSupport::Forbidden, |t| {
                crate::mcp::tasks::task_support(t)
            })
    }

    /// Tasks this source hands on to servers that run them (the gateway): when set, the
    /// server answers task-augmented calls, `tasks/*` and listen `taskIds` through it instead
    /// of running tasks itself.
    fn task_relay(&self) -> Option<Arc<dyn crate::mcp::tasks::relaying::TaskRelay>> {
        None
    }

    /// Webhooks this source receives (the gateway's, from webhook-only slugs), served at
    /// `/events/hooks/{id}` on its HTTP address.
    fn webhook_receiver(&self) -> Option<Arc<dyn crate::mcp::server::webhooks::Receiver>> {
        None
    }

    /// Whether this source serves MCP Events (`io.modelcontextprotocol/events`) to the caller;
    /// advertised in the handshake when true.
    async fn events_advertised(&self, caller: &Caller) -> bool {
        let _ = caller;
        false
    }

    /// `events/list`: the event types, one page.
    async fn events_list(&self, caller: &Caller) -> Result<Vec<Value>, SourceError> {
        let _ = caller;
        Ok(Vec::new())
    }

    /// `events/poll` with its params (`name`, `arguments`, `cursor`, `maxEvents`, `maxAgeMs`):
    /// the whole result object.
    async fn events_poll(&self, caller: &Caller, params: JsonObject) -> Result<Value, SourceError> {
        let _ = caller;
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        Err(SourceError::EventNotFound(format!(
            "no event type {name:?}; events/list names the event types this server serves"
        )))
    }
}

pub type DynSource = Arc<dyn Source>;

/// A tool's input schema from a `json!` object.
pub fn schema(v: Value) -> JsonObject {
    v.as_object().cloned().unwrap_or_default()
}

/// Refuses arguments a tool does not take (never ignores them).
pub fn check_args(args: &JsonObject, allowed: &[&str]) -> Result<(), SourceError> {
    if let Some(k) = args.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(SourceError::InvalidParams(format!(
            "unknown argument {k}; this tool takes {}",
            allowed.join(", ")
        )));
    }
    Ok(())
}
