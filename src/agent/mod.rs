//! The agent (`herald agent`): watch notices and a person's messages as turns of an LLM,
//! which acts through one tool, `run_code`, backed by herald's code mode. Reference 000,
//! "Delivery to the agent".
//!
//! - `model.rs`: the chat messages (a notice's among them), `ToolSpec`, `Reply`, `ModelError`
//!   and the `Model` trait.
//! - `openai.rs`: `ChatClient`, a `Model` over any OpenAI-compatible chat completions API.
//! - `runtime.rs`: the orchestrator (input and notice streams, coalesced runs, `NO_REPLY`,
//!   reply routing) and the `Channel` / `CodeRunner` traits it drives.
//! - `code.rs`: `run_code`'s backend (code mode) and the system prompt.
//! - `session.rs`: the JSONL session log, read back by `--resume`.
//! - `terminal.rs`: the interactive channel.
//! - `slack.rs`: Slack through herald's Slack source: the inbox followed by push, replies with
//!   its `slack_post_message`.

pub mod code;
pub mod model;
pub mod openai;
pub mod runtime;
pub mod session;
pub mod slack;
pub mod terminal;
