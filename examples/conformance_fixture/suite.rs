//! The suite's fixtures for the 2026-07-28 scenarios: content tools, progress and logging,
//! the diagnostic tools of `server-stateless`, resources and a template, prompts, the JSON
//! Schema 2020-12 tool and a tool with a custom `Mcp-Param-*` header. Content is written as
//! the suite expects it, in its own JSON.

use std::sync::Arc;
use std::time::Duration;

use herald::mcp::source::{Call, Contents, SourceError, check_args, schema};
use rmcp::model::{
    CallToolResponse, CallToolResult, GetPromptResponse, GetPromptResult, JsonObject, Prompt,
    PromptArgument, Resource, ResourceTemplate, Tool,
};
use serde_json::{Value, json};

use crate::{mrtr, text};

/// A 1x1 red PNG.
pub const IMAGE: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV file.
const AUDIO: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

fn tool(name: &str, description: &str, input: Value) -> Tool {
    Tool::new(
        name.to_owned(),
        description.to_owned(),
        Arc::new(schema(input)),
    )
}

fn no_args(name: &str, description: &str) -> Tool {
    tool(
        name,
        description,
        json!({"type": "object", "properties": {}}),
    )
}

/// The tools, in the order the suite finds them (the header checks call the first one with
/// no arguments).
pub fn tools() -> Vec<Tool> {
    let mut out = vec![
        no_args("test_simple_text", "Answers one text."),
        no_args("test_image_content", "Answers one PNG image."),
        no_args("test_audio_content", "Answers one WAV clip."),
        no_args(
            "test_embedded_resource",
            "Answers an embedded text resource.",
        ),
        no_args(
            "test_multiple_content_types",
            "Answers text, an image and an embedded resource.",
        ),
        no_args(
            "test_tool_with_progress",
            "Reports progress 0, 50 and 100 of 100 when asked for progress.",
        ),
        no_args(
            "test_tool_with_logging",
            "Logs three messages while it runs.",
        ),
        no_args("test_error_handling", "Answers a tool error."),
        no_args(
            "test_missing_capability",
            "Needs the client's sampling capability (-32021 without it).",
        ),
        no_args(
            "test_logging_tool",
            "Logs one message, only when the request asked for a log level.",
        ),
        no_args(
            "test_trigger_tool_change",
            "Tells listens that asked for it that the tool list changed.",
        ),
        no_args(
            "test_trigger_prompt_change",
            "Tells listens that asked for it that the prompt list changed.",
        ),
        tool(
            "json_schema_2020_12_tool",
            "Takes a JSON Schema 2020-12 input (SEP-1613), kept as written.",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "$anchor": "addressDef",
                        "type": "object",
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"}}
                    }
                },
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"},
                    "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                    "phone": {"type": "string"},
                    "email": {"type": "string"}
                },
                "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
                "if": {
                    "properties": {"contactMethod": {"const": "phone"}},
                    "required": ["contactMethod"]
                },
                "then": {"required": ["phone"]},
                "else": {"required": ["email"]},
                "additionalProperties": false
            }),
        ),
        tool(
            "test_custom_header",
            "Echoes `value`, which travels in the Mcp-Param-Value header too (SEP-2243).",
            json!({
                "type": "object",
                "properties": {"value": {"type": "string", "x-mcp-header": "Value"}},
                "required": ["value"]
            }),
        ),
    ];
    out.extend(
        mrtr::TOOLS
            .iter()
            .map(|n| no_args(n, "A SEP-2322 fixture.")),
    );
    out
}

/// A tool result from its JSON.
fn result(v: Value) -> Result<CallToolResult, SourceError> {
    serde_json::from_value(v)
        .map_err(|e| SourceError::Unavailable(format!("cannot build the result: {e}")))
}

/// Answers one of [`tools`] (but the SEP-2322 ones); `None` for a name that is not one.
pub async fn call(
    name: &str,
    args: &JsonObject,
    call: &Call,
) -> Option<Result<CallToolResponse, SourceError>> {
    let r = match name {
        "test_simple_text" => Ok(text("This is a simple text response for testing.")),
        "test_image_content" => result(json!({
            "content": [{"type": "image", "data": IMAGE, "mimeType": "image/png"}]
        })),
        "test_audio_content" => result(json!({
            "content": [{"type": "audio", "data": AUDIO, "mimeType": "audio/wav"}]
        })),
        "test_embedded_resource" => result(json!({
            "content": [{"type": "resource", "resource": {
                "uri": "test://embedded-resource",
                "mimeType": "text/plain",
                "text": "This is an embedded resource content."
            }}]
        })),
        "test_multiple_content_types" => result(json!({
            "content": [
                {"type": "text", "text": "Multiple content types test:"},
                {"type": "image", "data": IMAGE, "mimeType": "image/png"},
                {"type": "resource", "resource": {
                    "uri": "test://mixed-content-resource",
                    "mimeType": "application/json",
                    "text": json!({"test": "data", "value": 123}).to_string()
                }}
            ]
        })),
        "test_tool_with_progress" => {
            let mut token = Value::from(0);
            if let Some(p) = &call.progress {
                token = serde_json::to_value(&p.token).unwrap_or_default();
                for step in [0.0, 50.0, 100.0] {
                    let param = rmcp::model::ProgressNotificationParam::new(p.token.clone(), step)
                        .with_total(100.0)
                        .with_message(format!("Completed step {step} of 100"));
                    let _ = p.peer.notify_progress(param).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Ok(text(match token {
                Value::String(s) => s,
                other => other.to_string(),
            }))
        }
        "test_tool_with_logging" | "test_logging_tool" => {
            if let Some(log) = &call.log {
                let lines: &[&str] = if name == "test_logging_tool" {
                    &["Diagnostic trace logging activated"]
                } else {
                    &[
                        "Tool execution started",
                        "Tool processing data",
                        "Tool execution completed",
                    ]
                };
                for line in lines {
                    #[allow(deprecated)]
                    log.send(rmcp::model::LoggingLevel::Info, name, json!(line))
                        .await;
                }
            }
            Ok(text(if name == "test_logging_tool" {
                "Logging evaluated"
            } else {
                "Tool with logging executed successfully"
            }))
        }
        "test_error_handling" => Ok(CallToolResult::error(vec![
            rmcp::model::ContentBlock::text("This tool intentionally returns an error for testing"),
        ])),
        "test_missing_capability" => {
            if call
                .capabilities
                .as_ref()
                .is_none_or(|c| c.sampling.is_none())
            {
                return Some(Err(SourceError::MissingCapability(json!({"sampling": {}}))));
            }
            Ok(text("Success"))
        }
        "json_schema_2020_12_tool" => Ok(text(format!(
            "JSON Schema 2020-12 tool called with: {}",
            Value::Object(args.clone())
        ))),
        "test_custom_header" => {
            if let Err(e) = check_args(args, &["value"]) {
                return Some(Err(e));
            }
            let value = args.get("value").and_then(Value::as_str).unwrap_or("");
            Ok(text(format!("value: {value}")))
        }
        _ => return None,
    };
    Some(r.map(CallToolResponse::Complete))
}

/// The fixed resources.
pub fn resources() -> Vec<Resource> {
    serde_json::from_value(json!([
        {"uri": "test://static-text", "name": "static-text",
         "description": "A static text resource.", "mimeType": "text/plain"},
        {"uri": "test://static-binary", "name": "static-binary",
         "description": "A static binary resource (a PNG).", "mimeType": "image/png"}
    ]))
    .unwrap_or_default()
}

pub fn templates() -> Vec<ResourceTemplate> {
    serde_json::from_value(json!([
        {"uriTemplate": "test://template/{id}/data", "name": "template",
         "description": "A resource template with parameter substitution.",
         "mimeType": "application/json"}
    ]))
    .unwrap_or_default()
}

pub fn read(uri: &str) -> Result<Contents, SourceError> {
    use base64::Engine as _;
    match uri {
        "test://static-text" => Ok(Contents::text(
            "text/plain",
            "This is the content of the static text resource.",
        )),
        "test://static-binary" => {
            let png = base64::engine::general_purpose::STANDARD
                .decode(IMAGE)
                .map_err(|e| SourceError::Unavailable(e.to_string()))?;
            Ok(Contents::blob("image/png", png))
        }
        _ => {
            let id = uri
                .strip_prefix("test://template/")
                .and_then(|r| r.strip_suffix("/data"))
                .filter(|id| !id.is_empty() && !id.contains('/'));
            match id {
                Some(id) => Ok(Contents::json(&json!({
                    "id": id,
                    "templateTest": true,
                    "data": format!("Data for ID: {id}")
                }))),
                None => Err(SourceError::NotFound { uri: uri.into() }),
            }
        }
    }
}

pub fn prompts() -> Vec<Prompt> {
    let arg = |name: &str, description: &str| {
        let mut a = PromptArgument::new(name);
        a.description = Some(description.into());
        a.required = Some(true);
        a
    };
    vec![
        Prompt::new(
            "test_simple_prompt",
            Some("A simple prompt without arguments"),
            None,
        ),
        Prompt::new(
            "test_prompt_with_arguments",
            Some("A prompt with required arguments"),
            Some(vec![
                arg("arg1", "First test argument"),
                arg("arg2", "Second test argument"),
            ]),
        ),
        Prompt::new(
            "test_prompt_with_embedded_resource",
            Some("A prompt that includes an embedded resource"),
            Some(vec![arg("resourceUri", "URI of the resource to embed")]),
        ),
        Prompt::new(
            "test_prompt_with_image",
            Some("A prompt that includes image content"),
            None,
        ),
        Prompt::new(
            "test_input_required_result_prompt",
            Some("A prompt that asks the client for context first (SEP-2322)"),
            None,
        ),
    ]
}

fn messages(v: Value) -> Result<GetPromptResponse, SourceError> {
    serde_json::from_value::<GetPromptResult>(json!({ "messages": v }))
        .map(GetPromptResponse::Complete)
        .map_err(|e| SourceError::Unavailable(format!("cannot build the prompt: {e}")))
}

fn user(content: Value) -> Value {
    json!({"role": "user", "content": content})
}

fn arg<'a>(args: &'a JsonObject, name: &str) -> Result<&'a str, SourceError> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| {
        SourceError::InvalidParams(format!("missing argument {name}; this prompt needs it"))
    })
}

pub fn prompt(
    name: &str,
    args: &JsonObject,
    call: &Call,
) -> Result<GetPromptResponse, SourceError> {
    match name {
        "test_simple_prompt" => messages(json!([user(
            json!({"type": "text", "text": "This is a simple prompt for testing."})
        )])),
        "test_prompt_with_arguments" => {
            let (a1, a2) = (arg(args, "arg1")?, arg(args, "arg2")?);
            messages(json!([user(json!({
                "type": "text",
                "text": format!("Prompt with arguments: arg1='{a1}', arg2='{a2}'")
            }))]))
        }
        "test_prompt_with_embedded_resource" => {
            let uri = arg(args, "resourceUri")?;
            messages(json!([
                user(json!({"type": "resource", "resource": {
                    "uri": uri, "mimeType": "text/plain",
                    "text": "Embedded resource content for testing."
                }})),
                user(
                    json!({"type": "text", "text": "Please process the embedded resource above."})
                )
            ]))
        }
        "test_prompt_with_image" => messages(json!([
            user(json!({"type": "image", "data": IMAGE, "mimeType": "image/png"})),
            user(json!({"type": "text", "text": "Please analyze the image above."}))
        ])),
        "test_input_required_result_prompt" => {
            match mrtr::elicited(&call.input, "user_context", "context").and_then(Value::as_str) {
                Some(c) => messages(json!([user(
                    json!({"type": "text", "text": format!("Prompt with context: {c}")})
                )])),
                None => Ok(GetPromptResponse::InputRequired(mrtr::input_required(
                    json!({"inputRequests": {"user_context": mrtr::elicit(
                        "What context should the prompt use?", "context", "string"
                    )}}),
                )?)),
            }
        }
        other => Err(SourceError::UnknownPrompt(other.to_owned())),
    }
}
