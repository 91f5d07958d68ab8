//! The memo's tools: their listing (`memo_set`, `memo_delete`, `memo_wait`, `memo_ask`, each with
//! its schema, annotations and tasks marker) and their calls. `memo_set` and `memo_delete` go
//! to [`Memo::set`] and [`Memo::delete`]; `memo_wait` waits for a note's next change (as a
//! task, its status says when the wait has begun); `memo_ask` runs only as a task and asks the
//! client for the note's value (`input_required`) before setting it.

use rmcp::model::{CallToolResult, ContentBlock as Content, JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::Memo;
use crate::mcp::source::{Call, Caller, SourceError, check_args, schema};
use crate::mcp::tasks;

/// `memo_wait`'s default and longest wait.
const WAIT_DEFAULT_MS: u64 = 60_000;
const WAIT_MAX_MS: u64 = 3_600_000;

/// The memo's tools as listed: `memo_set`, `memo_delete`, `memo_wait` (may run as a task) and
/// `memo_ask` (only as a task). Built once.
pub(super) fn list() -> &'static [Tool] {
    static LIST: std::sync::LazyLock<Vec<Tool>> = std::sync::LazyLock::new(build);
    &LIST
}

fn build() -> Vec<Tool> {
    vec![
        Tool::new(
            "memo_set",
            "Set note `key` to `value` (any JSON value). Watchers of memo://notes and memo://log are notified.",
            schema(json!({
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": "note name"},
                    "value": {"description": "any JSON value"}
                },
                "required": ["key", "value"],
                "additionalProperties": false
            })),
        )
        .with_annotations(
            ToolAnnotations::with_title("Set a note")
                .read_only(false)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
        ),
        Tool::new(
            "memo_delete",
            "Delete note `key`. Watchers of memo://notes and memo://log are notified.",
            schema(json!({
                "type": "object",
                "properties": {"key": {"type": "string", "description": "note name"}},
                "required": ["key"],
                "additionalProperties": false
            })),
        )
        .with_annotations(
            ToolAnnotations::with_title("Delete a note")
                .read_only(false)
                .destructive(true)
                .idempotent(true)
                .open_world(false),
        ),
        tasks::optional(
            Tool::new(
                "memo_wait",
                "Wait until note `key` next changes (set to another value or deleted), at most `timeout_ms` (default 60000). May run as a task.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "description": "note name"},
                        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": WAIT_MAX_MS, "description": "longest wait, ms"}
                    },
                    "required": ["key"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(
                ToolAnnotations::with_title("Wait for a note to change")
                    .read_only(true)
                    .open_world(false),
            ),
        ),
        tasks::required(
            Tool::new(
                "memo_ask",
                "Ask the client for a value of note `key` (an elicitation with `message`, answered with tasks/update), then set the note. Runs only as a task.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "description": "note name"},
                        "message": {"type": "string", "description": "what to ask"}
                    },
                    "required": ["key"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(
                ToolAnnotations::with_title("Ask for a note's value")
                    .read_only(false)
                    .destructive(false)
                    .open_world(false),
            ),
        ),
    ]
}

fn key_arg(args: &JsonObject) -> Result<String, SourceError> {
    match args.get("key") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(SourceError::InvalidParams(format!(
            "key must be a string, got {other}"
        ))),
        None => Err(SourceError::InvalidParams(
            "missing argument key; call with key=\"name\"".into(),
        )),
    }
}

impl Memo {
    pub(super) async fn run_call(
        &self,
        _caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<rmcp::model::CallToolResult, SourceError> {
        match name {
            "memo_set" => {
                check_args(&args, &["key", "value"])?;
                let key = key_arg(&args)?;
                let value = args.get("value").cloned().ok_or_else(|| {
                    SourceError::InvalidParams(
                        "missing argument value; call with value=<any JSON>".into(),
                    )
                })?;
                let changed = self.set(&key, value).await?;
                let text = if changed {
                    format!("set {key}")
                } else {
                    format!("{key} unchanged")
                };
                let mut r = CallToolResult::success(vec![Content::text(text)]);
                r.structured_content = Some(json!({"key": key, "changed": changed}));
                Ok(r)
            }
            "memo_delete" => {
                check_args(&args, &["key"])?;
                let key = key_arg(&args)?;
                let existed = self.delete(&key).await?;
                let text = if existed {
                    format!("deleted {key}")
                } else {
                    format!("{key} did not exist")
                };
                let mut r = CallToolResult::success(vec![Content::text(text)]);
                r.structured_content = Some(json!({"key": key, "deleted": existed}));
                Ok(r)
            }
            "memo_wait" => self.memo_wait(&args, call.task.as_ref()).await,
            "memo_ask" => self.memo_ask(&args, call).await,
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }

    async fn memo_wait(
        &self,
        args: &JsonObject,
        task: Option<&crate::mcp::tasks::TaskHandle>,
    ) -> Result<CallToolResult, SourceError> {
        check_args(args, &["key", "timeout_ms"])?;
        let key = key_arg(args)?;
        Self::check_key(&key)?;
        let ms = match args.get("timeout_ms") {
            None => WAIT_DEFAULT_MS,
            Some(v) => v
                .as_u64()
                .filter(|&m| m > 0 && m <= WAIT_MAX_MS)
                .ok_or_else(|| {
                    SourceError::InvalidParams(format!(
                        "timeout_ms must be a whole number of milliseconds from 1 to {WAIT_MAX_MS}"
                    ))
                })?,
        };
        // As a task, its status says when a change will be seen (a caller that sets the note
        // after this push knows the wait sees it).
        let waiting = || {
            if let Some(t) = task {
                t.message(format!("waiting for {key} to change"));
            }
        };
        Ok(
            match self
                .wait_then(&key, std::time::Duration::from_millis(ms), waiting)
                .await
            {
                Some(value) => {
                    let text = match &value {
                        Some(v) => format!("{key} changed to {v}"),
                        None => format!("{key} was deleted"),
                    };
                    let mut r = CallToolResult::success(vec![Content::text(text)]);
                    r.structured_content =
                        Some(json!({"key": key, "changed": true, "value": value}));
                    r
                }
                None => {
                    let mut r = CallToolResult::success(vec![Content::text(format!(
                        "{key} did not change within {ms} ms"
                    ))]);
                    r.structured_content = Some(json!({"key": key, "changed": false}));
                    r
                }
            },
        )
    }

    /// `memo_ask`: asks the client for a value (an elicitation, through the task's
    /// `input_required`), then sets the note to it.
    async fn memo_ask(&self, args: &JsonObject, call: Call) -> Result<CallToolResult, SourceError> {
        check_args(args, &["key", "message"])?;
        let key = key_arg(args)?;
        Self::check_key(&key)?;
        let message = match args.get("message") {
            None => format!("A value for note {key}"),
            Some(Value::String(m)) => m.clone(),
            Some(_) => {
                return Err(SourceError::InvalidParams(
                    "message must be a string".into(),
                ));
            }
        };
        let Some(task) = call.task else {
            return Err(SourceError::InvalidParams(
                "memo_ask asks the client for input, so it runs only as a task: call it with the tasks extension declared (io.modelcontextprotocol/tasks)".into(),
            ));
        };
        let request: rmcp::model::InputRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"value": {"type": "string", "description": format!("the new value of {key}")}},
                    "required": ["value"]
                }
            }
        }))
        .map_err(|e| SourceError::Unavailable(format!("cannot build the input request: {e}")))?;
        let input_key = format!("value-of-{key}");
        let answers = task
            .ask([(input_key.clone(), request)].into_iter().collect())
            .await?;
        let answer = answers.get(&input_key).cloned().unwrap_or_default();
        match answer.get("action").and_then(Value::as_str) {
            Some("accept") => {}
            other => {
                let mut r = CallToolResult::success(vec![Content::text(format!(
                    "{key} left as it was: the input was {}",
                    other.unwrap_or("not given")
                ))]);
                r.structured_content = Some(json!({"key": key, "changed": false}));
                return Ok(r);
            }
        }
        let value = answer
            .get("content")
            .and_then(|c| c.get("value"))
            .cloned()
            .ok_or_else(|| {
                SourceError::InvalidParams("the accepted input has no content.value".into())
            })?;
        let changed = self.set(&key, value.clone()).await?;
        let mut r = CallToolResult::success(vec![Content::text(format!("set {key} to {value}"))]);
        r.structured_content = Some(json!({"key": key, "changed": changed, "value": value}));
        Ok(r)
    }
}
