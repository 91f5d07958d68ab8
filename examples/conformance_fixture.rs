//! The official MCP conformance suite's tasks fixture, served by herald's own plumbing.
//!
//! The suite's `tasks-*` scenarios call tools they expect a server to have (`greet`,
//! `slow_compute`, `failing_job`, `protocol_error_job`, `confirm_delete`, `multi_input`). No
//! herald role has them, so this example is a source with exactly those tools, served over
//! Streamable HTTP by the same `SourceServer`, tasks registry and transport every role uses.
//! `.ci/conformance.sh` runs the tasks scenarios against it:
//!
//! ```text
//! cargo run --example conformance_fixture -- 127.0.0.1:0
//! ```
//!
//! It prints `{"event":"listening","http_url":"http://…/mcp"}` on stderr once it listens and
//! runs until SIGTERM or Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald::app::{self, ServeOptions};
use herald::mcp::context::RoleContext;
use herald::mcp::hub::ChangeFeed;
use herald::mcp::source::{
    Admission, Call, Caller, Contents, ListenFilter, Source, SourceError, SourceInfo, check_args,
    schema,
};
use herald::mcp::tasks;
use herald::store::Store;
use rmcp::model::{
    CallToolResult, ContentBlock as Content, InputRequest, JsonObject, Resource, Tool,
};
use serde_json::{Value, json};

struct Fixture {
    feed: ChangeFeed,
}

fn tool(name: &str, description: &str, props: Value) -> Tool {
    Tool::new(
        name.to_owned(),
        description.to_owned(),
        Arc::new(schema(json!({"type": "object", "properties": props}))),
    )
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![Content::text(s.into())])
}

fn elicitation(message: &str, field: &str) -> Result<InputRequest, SourceError> {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field]
            }
        }
    }))
    .map_err(|e| SourceError::Unavailable(format!("cannot build the input request: {e}")))
}

#[async_trait]
impl Source for Fixture {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "conformance-fixture".into(),
            instructions: Some("The conformance suite's tasks fixture.".into()),
            ..SourceInfo::default()
        }
    }

    fn resources(&self, _caller: &Caller) -> Vec<Resource> {
        Vec::new()
    }

    async fn read(&self, _caller: &Caller, uri: &str) -> Result<Contents, SourceError> {
        Err(SourceError::NotFound { uri: uri.into() })
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

    fn tools(&self, _caller: &Caller) -> Vec<Tool> {
        vec![
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
        ]
    }

    async fn call_tool(
        &self,
        _caller: &Caller,
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
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let ctx = RoleContext::new("conformance-fixture");
    app::cancel_on_signals(ctx.shutdown().clone());
    let source = Arc::new(Fixture {
        feed: ChangeFeed::new(),
    });
    let opts = ServeOptions {
        http: Some(addr),
        no_stdio_fallback: true,
        ..ServeOptions::default()
    };
    let bound = app::serve_source(source, &opts, &Store::memory(), &ctx).await?;
    let http = bound.http.expect("an HTTP address");
    eprintln!(
        "{}",
        json!({"event": "listening", "http_url": format!("http://{http}/mcp")})
    );
    ctx.shutdown().cancelled().await;
    app::drain(&ctx).await;
    Ok(())
}
