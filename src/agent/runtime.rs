//! The orchestrator (reference 000, "Delivery to the agent"): one loop takes the input stream
//! (what a person or a channel says) and the notice stream (the watch client's notices) and
//! turns them into runs of the model. Notices enter the thread the way input does, as user
//! messages, never a side channel.
//!
//! - Idle, an input or a notice starts a run at once. While a run is active, what arrives is
//!   kept aside and a follow-up run is due: when the run ends, everything kept aside joins the
//!   thread and one run sees all of it. N notices during a run make one follow-up run, not N.
//! - A run claims every input no run has claimed yet; its reply goes to the most recent
//!   claimed input's channel. A run of notices alone replies where the last addressed input
//!   came from, else the default channel.
//! - A run: ask the model; run each tool call it makes (`run_code`) and give it the results;
//!   until it answers with text, or after [`MAX_STEPS`] rounds. A reply that is empty or has a
//!   line that is only `NO_REPLY` publishes nothing (`reply.suppressed`); so does a run whose
//!   model ran `NO_REPLY` as code.
//! - A model that fails (down, 5xx after retries, a timeout) ends the run with the error told
//!   to the channel; the loop serves on.
//!
//! The loop is idle when no input is unclaimed and no run is active. It ends when its event
//! stream closes and the run in progress (if any) is over.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agent::model::{Message, Model, Reply, Role, ToolCall, ToolSpec};
use crate::agent::session::SessionLog;

/// The longest run: model rounds (each may call tools) before the run gives up.
pub const MAX_STEPS: usize = 16;

/// The line a notice's message ends with.
pub const NOTICE_INSTRUCTION: &str = "This is a watch notification, not a user message. Tell the channel only if the change matters to what was asked; otherwise reply exactly NO_REPLY.";

/// Where a reply goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyTo {
    /// The terminal (stdout).
    Terminal,
    /// A Slack channel, in a thread when `thread_ts` is set.
    Slack {
        channel: String,
        thread_ts: Option<String>,
    },
}

/// What the loop takes in.
#[derive(Debug, Clone)]
pub enum Event {
    /// Someone said something, to be answered at `reply_to`.
    Input { text: String, reply_to: ReplyTo },
    /// A watch notice: its `<watch-event>` block, and the watch it came from.
    Notice {
        watch: String,
        uri: String,
        block: String,
    },
    /// The input (stdin) has ended: once idle, the loop ends if [`Agent::done_when`] says so.
    InputClosed,
}

/// Where replies and progress go: the terminal, or Slack.
#[async_trait]
pub trait Channel: Send + Sync {
    /// Publishes a reply.
    async fn publish(&self, to: &ReplyTo, text: &str);
    /// The model is working on a run (a spinner, on a terminal).
    fn thinking(&self, _on: bool) {}
    /// Streamed text of the model's answer, as it comes.
    fn streamed(&self, _text: &str) {}
    /// A tool call and the first line of its result, for the transcript.
    fn tool_used(&self, _call: &str, _result: &str) {}
    /// A reply was suppressed (`NO_REPLY`).
    fn suppressed(&self) {}
}

/// Runs the model's code: `run_code`'s backend (herald's code mode).
#[async_trait]
pub trait CodeRunner: Send + Sync {
    /// Runs `code` in the agent's persistent scope; the text the model reads back (what it
    /// printed, its value, or the exception).
    async fn run(&self, code: &str) -> String;
}

/// The `run_code` tool as the model sees it.
pub fn run_code_spec() -> ToolSpec {
    ToolSpec {
        name: "run_code".into(),
        description: "Run Python in your persistent sandboxed scope. It has every connected server's tools as functions (keyword arguments), plus list_resources(), read_resource(uri=...), watch_start(name=..., uri=..., on_event=None), watch_stop(name=...), watch_list() and call_tool_as_task(name, args). The value of the last expression and anything printed come back. Run exactly NO_REPLY to end your turn without replying.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source"}},
            "required": ["code"]
        }),
    }
}

/// A notice as the model reads it: its block, then the instruction.
pub fn notice_message(block: &str) -> String {
    let block = block.trim_end_matches('\n');
    format!("{block}\n{NOTICE_INSTRUCTION}")
}

/// Whether a reply publishes nothing: empty, or a line that is only `NO_REPLY`.
pub fn is_no_reply(text: &str) -> bool {
    text.trim().is_empty() || text.lines().any(|l| l.trim() == "NO_REPLY")
}

/// The agent's pieces.
pub struct Agent {
    pub model: Arc<dyn Model>,
    pub code: Arc<dyn CodeRunner>,
    pub channel: Arc<dyn Channel>,
    pub log: SessionLog,
    /// Where notices reply when no input was addressed yet.
    pub default_reply: ReplyTo,
    /// The thread so far (the system prompt first; a resumed session's messages after it).
    pub thread: Vec<Message>,
    /// Asked when the input has closed and the loop is idle: whether to end (nothing left to
    /// wait for, e.g. no watch runs).
    pub done_when: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

/// How a run ended.
struct RunDone {
    thread: Vec<Message>,
}

impl Agent {
    /// Runs the loop until `events` closes and the last run is over.
    pub async fn run(self, mut events: mpsc::Receiver<Event>) {
        let Agent {
            model,
            code,
            channel,
            log,
            default_reply,
            mut thread,
            done_when,
        } = self;
        let mut input_closed = false;
        let tools = vec![run_code_spec()];
        // Arrived while a run was active: they join the thread when it ends.
        let mut pending: Vec<Message> = Vec::new();
        let mut unclaimed: Vec<ReplyTo> = Vec::new();
        let mut last_addressed: Option<ReplyTo> = None;
        let mut active: Option<tokio::task::JoinHandle<RunDone>> = None;
        let mut open = true;
        loop {
            if active.is_none() && !pending.is_empty() {
                thread.append(&mut pending);
                // The run claims every unclaimed input; it answers the most recent one.
                let to = unclaimed
                    .drain(..)
                    .next_back()
                    .or_else(|| last_addressed.clone())
                    .unwrap_or_else(|| default_reply.clone());
                log.record("run.started", json!({"messages": thread.len()}));
                let run = one_run(
                    model.clone(),
                    code.clone(),
                    channel.clone(),
                    log.clone(),
                    tools.clone(),
                    std::mem::take(&mut thread),
                    to,
                );
                active = Some(tokio::spawn(run));
            }
            if active.is_none()
                && (!open || (input_closed && done_when.as_ref().is_some_and(|f| f())))
            {
                return;
            }
            tokio::select! {
                ev = events.recv(), if open => match ev {
                    None => open = false,
                    Some(Event::InputClosed) => input_closed = true,
                    Some(Event::Input { text, reply_to }) => {
                        log.record("user", json!({"text": text}));
                        pending.push(Message::user(text));
                        last_addressed = Some(reply_to.clone());
                        unclaimed.push(reply_to);
                    }
                    Some(Event::Notice { watch, uri, block }) => {
                        // A monitor event, never a user record.
                        log.record(
                            "monitor",
                            json!({
                                "task_id": format!("watch-{watch}"),
                                "description": format!("watch {watch} {uri}"),
                                "text": block,
                                "note": NOTICE_INSTRUCTION,
                            }),
                        );
                        pending.push(Message::user(notice_message(&block)));
                    }
                },
                done = async { active.as_mut().expect("guarded").await }, if active.is_some() => {
                    active = None;
                    match done {
                        Ok(d) => thread = d.thread,
                        Err(e) => {
                            // A run that panicked: the thread as it was before it is lost
                            // with it; start again from the system prompt.
                            tracing::error!(error = %e, "an agent run failed");
                            channel.publish(&default_reply, "herald agent: a run failed; see the log").await;
                        }
                    }
                    log.record("run.ended", json!({}));
                }
            }
        }
    }
}

/// One run: model rounds and tool calls until a text answer, then its publication.
async fn one_run(
    model: Arc<dyn Model>,
    code: Arc<dyn CodeRunner>,
    channel: Arc<dyn Channel>,
    log: SessionLog,
    tools: Vec<ToolSpec>,
    mut thread: Vec<Message>,
    to: ReplyTo,
) -> RunDone {
    for _ in 0..MAX_STEPS {
        channel.thinking(true);
        let mut stream = |t: &str| channel.streamed(t);
        let reply = model.complete(&thread, &tools, &mut stream).await;
        channel.thinking(false);
        let Reply {
            content,
            tool_calls,
            ..
        } = match reply {
            Ok(r) => r,
            Err(e) => {
                log.record("model.error", json!({"error": e.to_string()}));
                channel.publish(&to, &format!("herald agent: {e}")).await;
                return RunDone { thread };
            }
        };
        log.record(
            "assistant",
            json!({"text": content, "tool_calls": tool_calls}),
        );
        thread.push(Message::assistant(content.clone(), tool_calls.clone()));
        if tool_calls.is_empty() {
            publish(&channel, &log, &to, &content).await;
            return RunDone { thread };
        }
        let mut ends_turn = false;
        for call in &tool_calls {
            let (result, no_reply) = run_tool(&code, call).await;
            log.record(
                "tool_result",
                json!({"id": call.id, "name": call.function.name, "text": result}),
            );
            channel.tool_used(&summary(call), &result);
            thread.push(Message::tool(call.id.clone(), result));
            ends_turn |= no_reply;
        }
        if ends_turn {
            log.record("reply.suppressed", json!({"why": "the model ran NO_REPLY"}));
            channel.suppressed();
            return RunDone { thread };
        }
    }
    let text =
        format!("herald agent: stopped after {MAX_STEPS} rounds of tool calls without an answer");
    log.record("run.gave_up", json!({"steps": MAX_STEPS}));
    channel.publish(&to, &text).await;
    RunDone { thread }
}

async fn publish(channel: &Arc<dyn Channel>, log: &SessionLog, to: &ReplyTo, text: &str) {
    if is_no_reply(text) {
        log.record("reply.suppressed", json!({"text": text}));
        tracing::info!(
            event = "reply.suppressed",
            "the model replied NO_REPLY (or nothing): nothing published"
        );
        channel.suppressed();
        return;
    }
    log.record("reply", json!({"text": text, "to": format!("{to:?}")}));
    channel.publish(to, text).await;
}

/// Runs one tool call. Returns what the model reads back, and whether it was `NO_REPLY`.
async fn run_tool(code: &Arc<dyn CodeRunner>, call: &ToolCall) -> (String, bool) {
    if call.function.name != "run_code" {
        return (
            format!(
                "error: there is no tool {:?}; the only tool is run_code, called with {{\"code\": \"<python>\"}}",
                call.function.name
            ),
            false,
        );
    }
    let args: Value = match serde_json::from_str(&call.function.arguments) {
        Ok(v) => v,
        Err(e) => {
            return (
                format!(
                    "error: run_code's arguments are not JSON ({e}); call it with {{\"code\": \"<python>\"}}"
                ),
                false,
            );
        }
    };
    let Some(src) = args.get("code").and_then(Value::as_str) else {
        return (
            "error: run_code needs a \"code\" string argument: {\"code\": \"<python>\"}".into(),
            false,
        );
    };
    if src.trim() == "NO_REPLY" {
        return ("ok: your turn ends without a reply".into(), true);
    }
    (code.run(src).await, false)
}

/// One line for the transcript: the tool and the first line of its code.
fn summary(call: &ToolCall) -> String {
    let code = serde_json::from_str::<Value>(&call.function.arguments)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| call.function.arguments.clone());
    let first = code.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let more = if code.trim().lines().count() > 1 {
        " …"
    } else {
        ""
    };
    format!("{}: {first}{more}", call.function.name)
}

/// The thread's messages after the system prompt (what `--resume` restores).
pub fn without_system(thread: &[Message]) -> &[Message] {
    match thread.first() {
        Some(m) if m.role == Role::System => &thread[1..],
        _ => thread,
    }
}

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
