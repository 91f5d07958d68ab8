//! The source trait: what a change source implements, and nothing more.
//!
//! A source lists its resources and templates, reads a URI in one of the two read shapes
//! (state or event-log), admits listens (which URIs a caller may watch, and what keeps them
//! watched), optionally offers tools, and publishes changed URIs on its [`ChangeFeed`]. Every
//! method whose answer may depend on who asks takes the request's [`Caller`]. The plumbing in [`crate::mcp::server`] turns that into
//! `server/discover`, `resources/*`, `tools/*`, `subscriptions/listen` and its notifications,
//! limits and errors, the same way for every source.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResponse, ClientCapabilities, CompleteRequestParams, CompleteResult, GetPromptResponse,
    InputRequiredResult, InputResponses, JsonObject, Prompt, Resource, ResourceTemplate, Tool,
};
use serde_json::Value;

/// The `resources/read` `_meta` key by which a reader of an event log says the highest `seq`
/// it has: herald's watch client sends it, and every event-log read on herald's servers then
/// returns only the events after it (with the one before as an anchor), not the whole ring.
/// Other servers ignore it and answer the whole log, which reads the same.
pub const READ_AFTER_META: &str = "io.herald/after";

/// The hint in a request's `_meta`.
pub fn read_after_of(meta: Option<&rmcp::model::RequestMetaObject>) -> Option<u64> {
    meta?.0.0.get(READ_AFTER_META)?.as_u64()
}

pub use crate::mcp::admission::{Admission, ListenFilter};
pub use crate::mcp::caller::Caller;
use crate::mcp::hub::ChangeFeed;
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

/// Errors a source reports. The plumbing maps them to JSON-RPC errors.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum SourceError {
    /// No such resource: `-32602` with `data.uri`.
    #[error(
        "unknown resource {uri}; resources/list and resources/templates/list name what this server serves"
    )]
    NotFound { uri: String },
    /// Bad arguments or a malformed URI: `-32602`.
    #[error("{0}")]
    InvalidParams(String),
    /// No such tool: `-32602`.
    #[error("unknown tool {0}; tools/list names the tools this server offers")]
    UnknownTool(String),
    /// No such prompt: `-32602`.
    #[error("unknown prompt {0}; prompts/list names the prompts this server offers")]
    UnknownPrompt(String),
    /// The request needs a client capability the client did not declare (the JSON of the
    /// capabilities it needs): `-32021` with `data.requiredCapabilities`, HTTP `400`.
    #[error("this request needs the client capabilities {0}; declare them in _meta")]
    MissingCapability(Value),
    /// The source cannot serve this right now (its upstream failed): `-32603` with the reason.
    #[error("{0}")]
    Unavailable(String),
    /// The caller may not use this: `-32024`. The message is the same whatever was refused,
    /// so a refusal never tells whether the thing exists.
    #[error(
        "forbidden: this token is not entitled to that server (or it was not selected with ?servers=)"
    )]
    Forbidden,
    /// No such event type: `-32023` with `data.kind = "event"`.
    #[error("{0}")]
    EventNotFound(String),
    /// An upstream's own JSON-RPC error, passed on unchanged.
    #[error("{message}")]
    Upstream {
        code: i32,
        message: String,
        data: Option<Value>,
    },
}

/// Where a tool call's progress goes: the caller's progress token, on its connection.
#[derive(Clone)]
pub struct Progress {
    pub token: rmcp::model::ProgressToken,
    pub peer: rmcp::Peer<rmcp::RoleServer>,
}

#[allow(deprecated)] // logging is deprecated by SEP-2577, still in 2026-07-28
mod log_types {
    pub use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
}
#[allow(deprecated)]
use log_types::{LoggingLevel, LoggingMessageNotificationParam};

/// Where a request's log messages go: the caller's peer, from the level the caller asked for
/// (`_meta["io.modelcontextprotocol/logLevel"]`) up. A request without that key gets none.
#[derive(Clone)]
#[allow(deprecated)]
pub struct Log {
    pub level: LoggingLevel,
    pub peer: rmcp::Peer<rmcp::RoleServer>,
}

#[allow(deprecated)]
impl Log {
    /// Sends `data` at `level` when the caller asked for that level or a lower one; a peer
    /// that is gone loses it (a log line is never worth failing a request for).
    pub async fn send(&self, level: LoggingLevel, logger: &str, data: Value) {
        if rank(level) < rank(self.level) {
            return;
        }
        let param =
            LoggingMessageNotificationParam::new(level, data).with_logger(logger.to_owned());
        #[allow(deprecated)]
        let _ = self.peer.notify_logging_message(param).await;
    }
}

/// Severity order of a log level (rmcp's type has none): `debug` lowest.
#[allow(deprecated)]
fn rank(level: LoggingLevel) -> u8 {
    level as u8
}

/// A multi-round-trip request's answers (SEP-2322): what the client sends back with a
/// request after an `InputRequiredResult`. Both are untrusted client input: a source that lets
/// `request_state` decide anything seals it ([`rmcp::model::RequestStateCodec`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Input {
    pub responses: Option<InputResponses>,
    pub request_state: Option<String>,
}

impl Input {
    /// The answer the client gave under `key`, if any.
    pub fn response(&self, key: &str) -> Option<&Value> {
        self.responses.as_ref()?.get(key)
    }

    pub fn is_empty(&self) -> bool {
        self.responses.is_none() && self.request_state.is_none()
    }
}

/// What a request (a tool call, a prompt) carries besides its name and arguments.
#[derive(Default)]
pub struct Call {
    /// Set when the caller asked for progress (`_meta.progressToken`) on a plain call.
    pub progress: Option<Progress>,
    /// Set when the call runs as a task (the tasks extension): the tool may set a status
    /// message, ask the client for input, and see `tasks/cancel`.
    pub task: Option<crate::mcp::tasks::TaskHandle>,
    /// The answers to an earlier `InputRequiredResult` of this request (SEP-2322).
    pub input: Input,
    /// What the client declared it can do (`_meta["io.modelcontextprotocol/clientCapabilities"]`;
    /// the handshake's on a byte stream). A source asks for input (elicitation, sampling,
    /// roots) only of a client that declared it.
    pub capabilities: Option<ClientCapabilities>,
    /// Set when the caller asked for log messages (`_meta` `logLevel`).
    pub log: Option<Log>,
}

impl Call {
    /// The `_meta` a request relayed for this caller carries upstream (the gateway): the
    /// caller's declared capabilities (an upstream asks only for input the caller can give)
    /// and its log level, set over what the relaying connection would send. `None` when the
    /// caller declared neither.
    pub fn upstream_meta(&self) -> Option<rmcp::model::RequestMetaObject> {
        if self.capabilities.is_none() && self.log.is_none() {
            return None;
        }
        let mut meta = rmcp::model::RequestMetaObject::default();
        if let Some(c) = &self.capabilities {
            // Not the tasks extension: a relayed plain request must not be answered with a
            // task the relay would have to refuse (task calls declare it themselves).
            let mut c = c.clone();
            if let Some(e) = c.extensions.as_mut() {
                e.remove(crate::mcp::tasks::TASKS_EXTENSION);
            }
            meta.set_client_capabilities(c);
        }
        if let Some(log) = &self.log {
            meta.set_log_level(log.level);
        }
        Some(meta)
    }
}

/// Held while a listen stream (or a read, or a poll) watches a URI; dropping it tells the
/// source one watcher left.
/// Sources that start work per URI (a kubectl process, an inotify watch) refcount with it.
pub struct WatchGuard(#[allow(dead_code)] Option<Box<dyn Send + Sync>>);

impl WatchGuard {
    pub fn none() -> WatchGuard {
        WatchGuard(None)
    }

    pub fn new(inner: impl Send + Sync + 'static) -> WatchGuard {
        WatchGuard(Some(Box::new(inner)))
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

/// The feed key a source publishes when its tool list changed: listens that asked for
/// `toolsListChanged` get `notifications/tools/list_changed`.
pub const TOOLS_CHANGED: &str = "herald:list/tools";
/// The feed key for a changed prompt list (`promptsListChanged`).
pub const PROMPTS_CHANGED: &str = "herald:list/prompts";

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
}

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
    fn authenticates(&self, caller: &Caller) -> Authentication {
        let _ = caller;
        Authentication::Known
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

    /// The tools this caller may see.
    fn tools(&self, caller: &Caller) -> Vec<Tool> {
        let _ = caller;
        Vec::new()
    }

    /// Tool `name` as this caller sees it (its `Mcp-Param-*` headers are checked against
    /// it). A source whose listing is costly to build answers it directly.
    fn tool(&self, caller: &Caller, name: &str) -> Option<Tool> {
        self.tools(caller).into_iter().find(|t| t.name == name)
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
    fn task_relay(&self) -> Option<Arc<dyn crate::mcp::tasks::relay::TaskRelay>> {
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
