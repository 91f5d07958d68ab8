//! The source trait: what a change source implements, and nothing more.
//!
//! A source lists its resources and templates, reads a URI in one of the two read shapes
//! (state or event-log), says which URIs can be watched, optionally offers tools, and publishes
//! changed URIs on its [`ChangeFeed`]. The plumbing in [`crate::mcp::server`] turns that into
//! `server/discover`, `resources/*`, `tools/*`, `subscriptions/listen` and its notifications,
//! limits and errors, the same way for every source.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolResult, JsonObject, Resource, ResourceTemplate, Tool};
use serde_json::Value;

use crate::mcp::hub::ChangeFeed;
use crate::mcp::ring::{EVENT_LOG_MIME, EventRing};

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

    /// An event-log read of `ring`.
    pub fn event_log(ring: &EventRing) -> Contents {
        Contents {
            mime_type: EVENT_LOG_MIME.into(),
            body: Body::Text(ring.read_json()),
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

/// Who is asking, as far as the transport knows: the credentials the request carried. Sources
/// that serve everyone ignore it; the gateway turns it into the set of servers the request
/// may use. Set for the duration of each request (see [`caller`]).
#[derive(Clone, Default)]
pub struct Caller {
    /// The bearer token: HTTP `Authorization: Bearer`, or `_meta["io.herald/token"]` of the
    /// requests on a QUIC connection.
    pub token: Option<String>,
    /// `?servers=a,b` on the HTTP endpoint URL: narrows what the token may use.
    pub servers: Option<Vec<String>>,
    /// The request came over stdio from the process that started this one, which needs no
    /// token.
    pub local: bool,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("Caller")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("servers", &self.servers)
            .field("local", &self.local)
            .finish()
    }
}

/// Where a tool call's progress goes: the caller's progress token, on its connection.
#[derive(Clone)]
pub struct Progress {
    pub token: rmcp::model::ProgressToken,
    pub peer: rmcp::Peer<rmcp::RoleServer>,
}

tokio::task_local! {
    static CALLER: Caller;
}

impl Caller {
    /// Runs `f` with `self` as the caller.
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        CALLER.scope(self, f).await
    }
}

/// The caller of the request being served (the default, anonymous caller outside one).
pub fn caller() -> Caller {
    CALLER.try_with(Clone::clone).unwrap_or_default()
}

/// Held while a listen stream watches a URI; dropping it tells the source one watcher left.
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
#[derive(Debug, Clone)]
pub struct SourceInfo {
    /// Short role name, e.g. `memo`; the server calls itself `herald-<name>`.
    pub name: String,
    pub instructions: Option<String>,
}

/// A change source. See the module docs.
#[async_trait]
pub trait Source: Send + Sync + 'static {
    fn info(&self) -> SourceInfo;

    /// Fixed resources (`resources/list`).
    fn resources(&self) -> Vec<Resource>;

    /// RFC 6570 templates (`resources/templates/list`).
    fn templates(&self) -> Vec<ResourceTemplate> {
        Vec::new()
    }

    /// Reads `uri`. Unknown URIs are [`SourceError::NotFound`], never empty contents.
    async fn read(&self, uri: &str) -> Result<Contents, SourceError>;

    /// Whether a listen stream may subscribe to `uri`.
    fn watchable(&self, uri: &str) -> bool;

    /// Before a listen is acknowledged: which of `uris` this caller's listen may name, and
    /// holds that keep their watches up meanwhile. The default is [`Source::watchable`]; the
    /// gateway subscribes upstream and answers with what the upstreams accepted.
    async fn prepare_watch(&self, uris: &[String]) -> (Vec<String>, Vec<WatchGuard>) {
        (
            uris.iter().filter(|u| self.watchable(u)).cloned().collect(),
            Vec::new(),
        )
    }

    /// The key `uri`'s changes are published under on the change feed, as this caller sees
    /// it. Most sources publish the URI itself; the gateway publishes `slug+URI`, because the
    /// same URI may name different servers for different callers.
    fn feed_key(&self, uri: &str) -> String {
        uri.to_owned()
    }

    /// A listen stream starts watching `uri`; the guard is dropped when it stops.
    async fn watch(&self, uri: &str) -> Result<WatchGuard, SourceError> {
        let _ = uri;
        Ok(WatchGuard::none())
    }

    /// The feed this source publishes changed URIs on.
    fn changes(&self) -> ChangeFeed;

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    async fn call_tool(&self, name: &str, args: JsonObject) -> Result<CallToolResult, SourceError> {
        let _ = args;
        Err(SourceError::UnknownTool(name.to_owned()))
    }

    /// [`Source::call_tool`] for a caller that asked for progress (`_meta.progressToken`):
    /// a source that reports progress (the gateway relays its upstreams') sends it there.
    async fn call_tool_with_progress(
        &self,
        name: &str,
        args: JsonObject,
        progress: Option<Progress>,
    ) -> Result<CallToolResult, SourceError> {
        let _ = progress;
        self.call_tool(name, args).await
    }

    /// Whether this source serves MCP Events (`io.modelcontextprotocol/events`) to the caller;
    /// advertised in the handshake when true.
    async fn events_advertised(&self) -> bool {
        false
    }

    /// `events/list`: the event types, one page.
    async fn events_list(&self) -> Result<Vec<Value>, SourceError> {
        Ok(Vec::new())
    }

    /// `events/poll` with its params (`name`, `arguments`, `cursor`, `maxEvents`, `maxAgeMs`):
    /// the whole result object.
    async fn events_poll(&self, params: JsonObject) -> Result<Value, SourceError> {
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
