//! [`TaskRelay`]: what a source implements to serve tasks another server runs as its own
//! (the gateway), and what a task-augmented call through it answers. The relayed state itself
//! is [`super::relay`].

use async_trait::async_trait;
use rmcp::model::{
    CallToolResult, DetailedTask, ErrorData as McpError, InputRequiredResult, InputResponses, Task,
};

use crate::mcp::call::Call;
use crate::mcp::caller::Caller;
use crate::mcp::tasks::relay::RelayedListen;

/// What a task-augmented call through a relay answered: a task, or (when the server that runs
/// the tool answered in place) the tool's result.
pub enum Started {
    Task(Task),
    Done(CallToolResult),
    /// The server asked for input before it makes the task (SEP-2322 rounds first).
    InputRequired(InputRequiredResult),
}

/// Serves `tasks/*`, task-augmented calls and listen `taskIds` for tasks run elsewhere.
#[async_trait]
pub trait TaskRelay: Send + Sync {
    /// A task-augmented `tools/call` of `name`, declared by `caller`.
    async fn call(
        &self,
        caller: &Caller,
        name: &str,
        args: rmcp::model::JsonObject,
        call: Call,
    ) -> Result<Started, McpError>;
    async fn get(&self, caller: &Caller, id: &str) -> Result<DetailedTask, McpError>;
    async fn update(
        &self,
        caller: &Caller,
        id: &str,
        responses: InputResponses,
    ) -> Result<(), McpError>;
    async fn cancel(&self, caller: &Caller, id: &str) -> Result<(), McpError>;
    /// Registers a listen stream of `caller` for `ids` (the ones it may see now; the others
    /// left out without a word) and starts relaying their pushes.
    async fn listen(&self, caller: &Caller, ids: &[String]) -> RelayedListen;
}
