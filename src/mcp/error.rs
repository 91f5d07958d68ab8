//! [`SourceError`]: what a source (or the plumbing on its behalf) reports when a request
//! fails; [`crate::mcp::server::to_mcp_error`] maps it to the JSON-RPC error a client gets.

use serde_json::Value;

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
    /// The caller may use the server, but not this way: its access token grants `scope`'s
    /// reads alone (`herald:SLUG:read`) and the tool changes things: `-32024` with
    /// `data.reason = "insufficient_scope"` and the scope that would do, HTTP `403` with
    /// `WWW-Authenticate: Bearer error="insufficient_scope"` (step-up).
    #[error(
        "insufficient scope: this access token may only read {slug}, and {tool} is not a read-only tool; ask the identity provider for a token with scope {scope}"
    )]
    InsufficientScope {
        slug: String,
        tool: String,
        scope: String,
    },
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
