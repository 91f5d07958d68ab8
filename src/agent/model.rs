//! What the agent says to a model and hears back: the chat messages of an OpenAI-compatible
//! chat completions API, a watch notice as the model reads it ([`notice_message`]: its block,
//! then [`NOTICE_INSTRUCTION`]), the one tool the agent offers, and the [`Model`] trait the
//! orchestrator drives (the HTTP client in `openai.rs`; scripted models in tests).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message of the thread, in the chat completions shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// Text (`null` on an assistant message that only calls tools).
    #[serde(default)]
    pub content: Option<String>,
    /// The tools an assistant message calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn system(text: impl Into<String>) -> Message {
        Message::text(Role::System, text)
    }

    pub fn user(text: impl Into<String>) -> Message {
        Message::text(Role::User, text)
    }

    pub fn assistant(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        let text = text.into();
        Message {
            role: Role::Assistant,
            content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
            tool_calls,
            tool_call_id: None,
        }
    }

    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Message {
        Message {
            role: Role::Tool,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
        }
    }

    fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// The line a notice's message ends with.
pub const NOTICE_INSTRUCTION: &str = "This is a watch notification, not a user message. Tell the channel only if the change matters to what was asked; otherwise reply exactly NO_REPLY.";

/// A notice as the model reads it: its block, then the instruction.
pub fn notice_message(block: &str) -> String {
    let block = block.trim_end_matches('\n');
    format!("{block}\n{NOTICE_INSTRUCTION}")
}

/// A tool call as the chat completions API carries it: `arguments` is the JSON text the model
/// wrote, parsed only by the tool (a malformed one is answered with an error the model reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

impl ToolCall {
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: function(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

/// A tool offered to the model: `{"type": "function", "function": {name, description,
/// parameters}}` on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

impl ToolSpec {
    pub fn to_wire(&self) -> Value {
        serde_json::json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

/// What the model answered to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// Its text (possibly empty).
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `tool_calls`, `length`, … as the endpoint said.
    pub finish_reason: Option<String>,
    /// Tokens, when the endpoint reported them.
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// Why a request to the model failed. Every message names the endpoint's URL and says what to
/// do; none carries the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Nothing answered (connection refused, DNS, TLS).
    #[error("no model answered at {url}: {reason}; check --model-url and that the server runs")]
    Unreachable { url: String, reason: String },
    /// An HTTP error status, after the retries a 429 or 5xx gets.
    #[error("the model at {url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    /// It answered, but not with chat completions.
    #[error(
        "the endpoint at {url} does not answer like an OpenAI-compatible chat completions API ({what}); --model-url takes the API's base URL, e.g. http://127.0.0.1:8080/v1"
    )]
    NotChat { url: String, what: String },
    /// No complete answer within the per-request timeout.
    #[error(
        "the model at {url} did not finish within {secs} s; raise --model-timeout or use a faster model"
    )]
    Timeout { url: String, secs: u64 },
}

/// What a model call says while it works.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Text of the reply, as it streams.
    Text(&'a str),
    /// Attempt `attempt` of `of` failed with `error`; the next starts `after` from now.
    Retrying {
        error: &'a ModelError,
        attempt: u32,
        of: u32,
        after: std::time::Duration,
    },
}

impl ModelError {
    /// What went wrong, without the URL or what to do: for a line that says a retry.
    pub fn brief(&self) -> String {
        match self {
            ModelError::Unreachable { reason, .. } => format!("no answer ({reason})"),
            ModelError::Status { status, .. } => format!("HTTP {status}"),
            ModelError::NotChat { what, .. } => what.clone(),
            ModelError::Timeout { secs, .. } => format!("no answer within {secs} s"),
        }
    }
}

/// A chat model. `progress` hears the reply's text as it streams, and each retry.
#[async_trait]
pub trait Model: Send + Sync {
    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        progress: &mut (dyn for<'s> FnMut(Progress<'s>) + Send),
    ) -> Result<Reply, ModelError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_the_chat_completions_shape() {
        let m = Message::assistant(
            "",
            vec![ToolCall::new("c1", "run_code", "{\"code\":\"1\"}")],
        );
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run_code", "arguments": "{\"code\":\"1\"}"}}]})
        );
        let t = Message::tool("c1", "2");
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::json!({"role": "tool", "content": "2", "tool_call_id": "c1"})
        );
        let back: Message = serde_json::from_value(serde_json::to_value(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
