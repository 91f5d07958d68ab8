//! What a request (a tool call, a prompt, a completion) carries besides its name and
//! arguments: where its progress and log messages go, its task, the client's answers to an
//! earlier input request (SEP-2322) and the client's declared capabilities.

use rmcp::model::{ClientCapabilities, InputResponses};
use serde_json::Value;

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
