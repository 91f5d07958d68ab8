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

use crate::agent::model::{
    Message, Model, NOTICE_INSTRUCTION, Progress, Reply, Role, ToolCall, ToolSpec, notice_message,
};
use crate::agent::session::SessionLog;

/// The longest run: model rounds (each may call tools) before the run gives up.
pub const MAX_STEPS: usize = 16;

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
    /// The model's request failed and is tried again; `what` says so in a line. A terminal
    /// shows it beside its spinner; elsewhere it is logged.
    fn retrying(&self, what: &str) {
        tracing::info!("{what}");
    }
    /// A tool call and the first line of its result, for the transcript.
    fn tool_used(&self, _call: &str, _result: &str) {}
    /// A reply was suppressed (`NO_REPLY`).
    fn suppressed(&self) {}
    /// A person's question got no answer (the model failed; what happened was published).
    fn unanswered(&self) {}
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

/// Whether a reply publishes nothing: empty, or a line that is only `NO_REPLY` (also in
/// markdown emphasis or code, or with a full stop).
pub fn is_no_reply(text: &str) -> bool {
    text.trim().is_empty()
        || text.lines().any(|l| {
            l.trim()
                .trim_matches(|c: char| matches!(c, '*' | '_' | '`' | '.' | '"' | '\''))
                == "NO_REPLY"
        })
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
        // Arrived while a run was active: they join the thread (and the session log) when
        // it ends, so the thread and the log never put a message between a tool call and its
        // result.
        let mut pending: Vec<Arrived> = Vec::new();
        let mut unclaimed: Vec<ReplyTo> = Vec::new();
        let mut last_addressed: Option<ReplyTo> = None;
        // The run in progress, aborted if the loop is dropped (a shutdown) before it ends.
        let mut active: Option<(AbortOnDrop, ReplyTo)> = None;
        let mut open = true;
        let system = thread.first().cloned();
        loop {
            if active.is_none() && !pending.is_empty() {
                // Whatever is already queued joins this run too (one run, not two).
                while let Ok(ev) = events.try_recv() {
                    take(
                        ev,
                        &mut pending,
                        &mut unclaimed,
                        &mut last_addressed,
                        &mut input_closed,
                    );
                }
                let claimed = !unclaimed.is_empty();
                for a in coalesce(std::mem::take(&mut pending)) {
                    log.record(a.kind, a.record);
                    thread.push(a.message);
                }
                trim(&mut thread, MAX_THREAD_CHARS);
                // The run claims every unclaimed input; it answers the most recent one. A run
                // of notices alone answers where the bot was last addressed (not in that
                // message's thread), else the default channel.
                let to = match unclaimed.drain(..).next_back() {
                    Some(to) => to,
                    None => match last_addressed.clone() {
                        Some(ReplyTo::Slack { channel, .. }) => ReplyTo::Slack {
                            channel,
                            thread_ts: None,
                        },
                        Some(other) => other,
                        None => default_reply.clone(),
                    },
                };
                log.record("run.started", json!({"messages": thread.len()}));
                let parts = RunParts {
                    model: model.clone(),
                    code: code.clone(),
                    channel: channel.clone(),
                    log: log.clone(),
                    tools: tools.clone(),
                };
                let run = one_run(parts, std::mem::take(&mut thread), to.clone(), claimed);
                active = Some((AbortOnDrop(tokio::spawn(run)), to));
            }
            if active.is_none()
                && (!open || (input_closed && done_when.as_ref().is_some_and(|f| f())))
            {
                return;
            }
            tokio::select! {
                ev = events.recv(), if open => match ev {
                    None => open = false,
                    Some(ev) => take(ev, &mut pending, &mut unclaimed, &mut last_addressed, &mut input_closed),
                },
                done = async { (&mut active.as_mut().expect("guarded").0.0).await }, if active.is_some() => {
                    let (_, to) = active.take().expect("guarded");
                    match done {
                        Ok(d) => thread = d.thread,
                        Err(e) => {
                            // A run that panicked: its thread is lost with it; the next
                            // starts again from the system prompt.
                            tracing::error!(error = %e, "an agent run failed");
                            thread = system.iter().cloned().collect();
                            channel.publish(&to, "herald agent: that run failed (see the log); ask again").await;
                        }
                    }
                    log.record("run.ended", json!({}));
                }
            }
        }
    }
}

/// A run's task, aborted when dropped (a finished one is unaffected).
struct AbortOnDrop(tokio::task::JoinHandle<RunDone>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The thread's budget, in characters: past it the oldest turns are dropped.
pub const MAX_THREAD_CHARS: usize = 200_000;
/// The most notices one run sees one by one; older ones of the same run are counted.
pub const MAX_NOTICES_PER_RUN: usize = 50;

/// Something that arrived, waiting for a run: its message and its session record.
struct Arrived {
    message: Message,
    kind: &'static str,
    record: Value,
    notice: bool,
}

/// Takes one event in.
fn take(
    ev: Event,
    pending: &mut Vec<Arrived>,
    unclaimed: &mut Vec<ReplyTo>,
    last_addressed: &mut Option<ReplyTo>,
    input_closed: &mut bool,
) {
    match ev {
        Event::InputClosed => *input_closed = true,
        Event::Input { text, reply_to } => {
            pending.push(Arrived {
                record: json!({"text": text}),
                message: Message::user(text),
                kind: "user",
                notice: false,
            });
            *last_addressed = Some(reply_to.clone());
            unclaimed.push(reply_to);
        }
        Event::Notice { watch, uri, block } => pending.push(Arrived {
            message: Message::user(notice_message(&block)),
            // A monitor event, never a user record.
            kind: "monitor",
            record: json!({
                "task_id": format!("watch-{watch}"),
                "description": format!("watch {watch} {uri}"),
                "text": block,
                "note": NOTICE_INSTRUCTION,
            }),
            notice: true,
        }),
    }
}

/// At most [`MAX_NOTICES_PER_RUN`] notices, the newest; the older ones become one line saying
/// how many there were.
fn coalesce(mut arrived: Vec<Arrived>) -> Vec<Arrived> {
    let notices = arrived.iter().filter(|a| a.notice).count();
    if notices <= MAX_NOTICES_PER_RUN {
        return arrived;
    }
    let mut drop = notices - MAX_NOTICES_PER_RUN;
    let dropped = drop;
    arrived.retain(|a| {
        if a.notice && drop > 0 {
            drop -= 1;
            false
        } else {
            true
        }
    });
    let text = format!(
        "({dropped} earlier watch notices arrived while you were busy and are left out; read the resources again if they matter)"
    );
    arrived.insert(
        0,
        Arrived {
            message: Message::user(text.clone()),
            kind: "monitor",
            record: json!({"task_id": "watch-notices", "description": "notices left out", "text": text}),
            notice: true,
        },
    );
    arrived
}

fn chars(m: &Message) -> usize {
    m.content.as_deref().map_or(0, str::len)
        + m.tool_calls
            .iter()
            .map(|c| c.function.arguments.len() + c.function.name.len())
            .sum::<usize>()
}

/// Drops the oldest whole turns (a user message and everything up to the next one) until the
/// thread fits `budget`, keeping the system prompt and the last turn; a tool call never loses
/// its result.
pub fn trim(thread: &mut Vec<Message>, budget: usize) {
    let start = usize::from(thread.first().is_some_and(|m| m.role == Role::System));
    loop {
        let total: usize = thread.iter().map(chars).sum();
        if total <= budget {
            return;
        }
        // The end of the first turn: the next user message after `start`.
        let Some(next) = thread
            .iter()
            .enumerate()
            .skip(start + 1)
            .find(|(_, m)| m.role == Role::User)
            .map(|(i, _)| i)
        else {
            return;
        };
        thread.drain(start..next);
    }
}

/// One run: model rounds and tool calls until a text answer, then its publication.
/// What a run works with.
struct RunParts {
    model: Arc<dyn Model>,
    code: Arc<dyn CodeRunner>,
    channel: Arc<dyn Channel>,
    log: SessionLog,
    tools: Vec<ToolSpec>,
}

async fn one_run(parts: RunParts, mut thread: Vec<Message>, to: ReplyTo, claimed: bool) -> RunDone {
    let RunParts {
        model,
        code,
        channel,
        log,
        tools,
    } = parts;
    for _ in 0..MAX_STEPS {
        channel.thinking(true);
        let mut progress = |p: Progress<'_>| match p {
            Progress::Text(t) => channel.streamed(t),
            Progress::Retrying {
                error,
                attempt,
                of,
                after,
            } => {
                tracing::debug!(error = %error, retry_in_ms = after.as_millis() as u64, "model request failed; retrying");
                channel.retrying(&format!(
                    "the model failed ({}); trying again, attempt {} of {of}",
                    error.brief(),
                    attempt + 1
                ))
            }
        };
        let reply = model.complete(&thread, &tools, &mut progress).await;
        channel.thinking(false);
        let Reply {
            content,
            tool_calls,
            finish_reason,
            ..
        } = match reply {
            Ok(r) => r,
            Err(e) => {
                log.record("model.error", json!({"error": e.to_string()}));
                // Someone asked: they hear why. A run of notices alone only logs it (a model
                // that is down must not post every notice's failure to a channel).
                if claimed {
                    channel.publish(&to, &format!("herald agent: {e}")).await;
                    channel.unanswered();
                } else {
                    tracing::warn!(error = %e, "the model failed on a notice; it stays in the thread for the next run");
                }
                return RunDone { thread };
            }
        };
        if content.trim().is_empty()
            && tool_calls.is_empty()
            && finish_reason.as_deref() == Some("length")
        {
            // Not a NO_REPLY: the answer was cut before it began.
            log.record("reply.cut", json!({"finish_reason": "length"}));
            if claimed {
                channel
                    .publish(
                        &to,
                        "herald agent: the model's answer was cut at --max-tokens before it said anything; raise --max-tokens or ask for less",
                    )
                    .await;
            }
            return RunDone { thread };
        }
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

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
