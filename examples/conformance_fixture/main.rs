//! The official MCP conformance suite's fixtures, served by herald's own plumbing.
//!
//! The suite's scenarios call tools, prompts and resources they expect a server to have
//! (`test_simple_text`, `test_prompt_with_arguments`, `test://static-text`, the SEP-2322
//! `test_input_required_result_*` tools, the tasks extension's `greet`, `slow_compute`, …). No
//! herald role has them, so this example is a source with exactly those, served over
//! Streamable HTTP by the same `SourceServer`, tasks registry and transport every role uses
//! (`suite.rs`: the 2026-07-28 scenarios' fixtures; `mrtr.rs`: the SEP-2322 ones; this file:
//! the tasks extension's). `.ci/conformance.sh` runs the whole suite against it, directly and
//! through herald's gateway (the gateway starts it on stdio with `--stdio`):
//!
//! ```text
//! cargo run --example conformance_fixture -- 127.0.0.1:0
//! cargo run --example conformance_fixture -- --stdio
//! ```
//!
//! On HTTP it prints `{"event":"listening","http_url":"http://…/mcp"}` on stderr once it
//! listens; it runs until SIGTERM or Ctrl-C (on stdio, until its input ends).

mod mrtr;
mod suite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald::app::{self, ServeOptions};
use herald::mcp::hub::ChangeFeed;
use herald::mcp::source::{
    Admission, Call, Caller, Contents, ListenFilter, PROMPTS_CHANGED, Read, Source, SourceError,
    SourceInfo, TOOLS_CHANGED, check_args, schema,
};
use herald::mcp::tasks;
use herald::runtime::context::RoleContext;
use herald::store::Store;
use rmcp::model::{
    CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    ContentBlock as Content, GetPromptResponse, InputRequest, InputRequiredResult, JsonObject,
    Prompt, Resource, ResourceTemplate, Tool,
};
use serde_json::{Value, json};

struct Fixture {
    feed: ChangeFeed,
    states: mrtr::States,
}

fn tool(name: &str, description: &str, props: Value) -> Tool {
    Tool::new(
        name.to_owned(),
        description.to_owned(),
        Arc::new(schema(json!({"type": "object", "properties": props}))),
    )
}

pub(crate) fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![Content::text(s.into())])
}

fn elicitation(message: &str, field: &str) -> Result<InputRequest, SourceError> {
    serde_json::from_value(mrtr::elicit(message, field, "string"))
        .map_err(|e| SourceError::Unavailable(format!("cannot build the input request: {e}")))
}

#[async_trait]
impl Source for Fixture {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "conformance-fixture".into(),
            instructions: Some("The conformance suite's fixtures.".into()),
            completions: true,
            list_changed: true,
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        suite::resources()
    }

    fn templates(&self, _caller: &Caller) -> Vec<ResourceTemplate> {
        suite::templates()
    }

    async fn read(&self, _caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        suite::read(read.uri)
    }

    fn prompts(&self, _caller: &Caller) -> Vec<Prompt> {
        suite::prompts()
    }

    async fn get_prompt(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<GetPromptResponse, SourceError> {
        suite::prompt(name, &args, &call)
    }

    /// Any argument of any prompt or template: no values (the suite asks only that it
    /// answers).
    async fn complete(
        &self,
        _caller: &Caller,
        _request: CompleteRequestParams,
    ) -> Result<CompleteResult, SourceError> {
        Ok(CompleteResult::default())
    }

    async fn before_task(
        &self,
        _caller: &Caller,
        name: &str,
        _args: &JsonObject,
        call: &Call,
    ) -> Result<Option<InputRequiredResult>, SourceError> {
        if name != "test_tool_with_task"
            || mrtr::elicited(&call.input, "user_name", "name").is_some()
        {
            return Ok(None);
        }
        mrtr::input_required(json!({"inputRequests": {
            "user_name": mrtr::elicit("What is your name?", "name", "string")
        }}))
        .map(Some)
    }

    async fn admit(&self, _caller: &Caller, filter: &ListenFilter) -> Admission {
        let mut admission = Admission::default();
        for uri in filter.uris() {
            admission.refuse(&uri, SourceError::NotFound { uri: uri.clone() });
        }
        admission
    }

    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }

    fn tools(&self, _caller: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        let mut out = suite::tools();
        out.extend([
            tool(
                "greet",
                "Says hello (never a task).",
                json!({"name": {"type": "string"}}),
            ),
            tasks::optional(tool(
                "slow_compute",
                "Sleeps `seconds`, then answers; cancelled when its task is.",
                json!({"seconds": {"type": "number"}, "label": {"type": "string"}}),
            )),
            tasks::required(tool(
                "failing_job",
                "Reports a tool error after about a second.",
                json!({}),
            )),
            tasks::optional(tool(
                "protocol_error_job",
                "Fails with a protocol error.",
                json!({}),
            )),
            tasks::required(tool(
                "confirm_delete",
                "Asks whether to delete `filename`.",
                json!({"filename": {"type": "string"}}),
            )),
            tasks::required(tool(
                "multi_input",
                "Asks two questions at once.",
                json!({}),
            )),
            tasks::required(tool(
                "test_tool_with_task",
                "Asks for `user_name` first (SEP-2322), then greets as a task.",
                json!({}),
            )),
        ]);
        out.into()
    }

    async fn call_tool(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, SourceError> {
        if mrtr::TOOLS.contains(&name) {
            return self.states.call(name, &call);
        }
        match name {
            "test_trigger_tool_change" | "test_trigger_prompt_change" => {
                let key = if name == "test_trigger_tool_change" {
                    TOOLS_CHANGED
                } else {
                    PROMPTS_CHANGED
                };
                self.feed.publish(key);
                return Ok(text("Mutation triggered").into());
            }
            "test_tool_with_task" => {
                let who = mrtr::elicited(&call.input, "user_name", "name")
                    .and_then(Value::as_str)
                    .unwrap_or("stranger");
                return Ok(text(format!("Hello, {who}, from a task!")).into());
            }
            _ => {}
        }
        if let Some(r) = suite::call(name, &args, &call).await {
            return r;
        }
        self.tasks_tool(name, args, call).await.map(Into::into)
    }
}

impl Fixture {
    /// The tasks extension's tools.
    async fn tasks_tool(
        &self,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResult, SourceError> {
        match name {
            "greet" => {
                check_args(&args, &["name"])?;
                let who = args.get("name").and_then(Value::as_str).unwrap_or("World");
                Ok(text(format!("Hello, {who}!")))
            }
            "slow_compute" => {
                check_args(&args, &["seconds", "label"])?;
                let secs = args.get("seconds").and_then(Value::as_f64).unwrap_or(1.0);
                let secs = secs.clamp(0.0, 3600.0);
                let label = args.get("label").and_then(Value::as_str).unwrap_or("");
                if let Some(t) = &call.task {
                    t.message(format!("computing {label}"));
                }
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                Ok(text(format!("computed {label} in {secs} s")))
            }
            "failing_job" => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(CallToolResult::error(vec![Content::text(
                    "failing_job failed, as it always does",
                )]))
            }
            "protocol_error_job" => Err(SourceError::Unavailable(
                "protocol_error_job fails with a protocol error, as it always does".into(),
            )),
            "confirm_delete" | "multi_input" => {
                let Some(task) = call.task else {
                    return Err(SourceError::InvalidParams(format!(
                        "{name} runs only as a task"
                    )));
                };
                let asks = if name == "confirm_delete" {
                    let file = args
                        .get("filename")
                        .and_then(Value::as_str)
                        .unwrap_or("the file");
                    vec![(
                        "confirm".to_owned(),
                        elicitation(&format!("Delete {file}?"), "confirm")?,
                    )]
                } else {
                    vec![
                        ("name".to_owned(), elicitation("Your name?", "name")?),
                        ("color".to_owned(), elicitation("Your color?", "color")?),
                    ]
                };
                let answers = task.ask(asks.into_iter().collect()).await?;
                Ok(text(format!(
                    "answers: {}",
                    serde_json::to_string(&answers).unwrap_or_default()
                )))
            }
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let stdio = arg == "--stdio";
    let ctx = RoleContext::new("conformance-fixture");
    app::cancel_on_signals(ctx.shutdown().clone());
    let source = Arc::new(Fixture {
        feed: ChangeFeed::new(),
        states: mrtr::States::new(),
    });
    let opts = ServeOptions {
        http: (!stdio).then_some(arg),
        stdio,
        no_stdio_fallback: !stdio,
        ..ServeOptions::default()
    };
    let bound = app::serve_source(source, &opts, &Store::memory(), &ctx).await?;
    if let Some(http) = bound.http {
        eprintln!(
            "{}",
            json!({"event": "listening", "http_url": format!("http://{http}/mcp")})
        );
    }
    ctx.shutdown().cancelled().await;
    app::drain(&ctx).await;
    Ok(())
}
