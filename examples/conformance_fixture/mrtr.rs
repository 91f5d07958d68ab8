//! The suite's SEP-2322 fixtures: tools (and one prompt) that answer `InputRequiredResult`
//! until the client sends what they asked for. Request state that decides anything is sealed
//! (herald's `Sealer`, bound to the tool's name), so a tampered state is refused.

use herald::mcp::sealed::Sealer;
use herald::mcp::source::{Call, Input, SourceError};
use rmcp::model::{CallToolResponse, InputRequiredResult};
use serde_json::{Value, json};

use crate::text;

/// The tools, by name.
pub const TOOLS: [&str; 9] = [
    "test_input_required_result_elicitation",
    "test_input_required_result_sampling",
    "test_input_required_result_list_roots",
    "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs",
    "test_input_required_result_multi_round",
    "test_input_required_result_tampered_state",
    "test_input_required_result_capabilities",
    "test_streaming_elicitation",
];

/// An `InputRequiredResult` from its JSON (`inputRequests`, `requestState`).
pub fn input_required(v: Value) -> Result<InputRequiredResult, SourceError> {
    let mut v = v;
    v["resultType"] = "input_required".into();
    serde_json::from_value(v)
        .map_err(|e| SourceError::Unavailable(format!("cannot build the input request: {e}")))
}

/// An `elicitation/create` input request for one string (or boolean) field.
pub fn elicit(message: &str, field: &str, kind: &str) -> Value {
    json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {field: {"type": kind}},
                "required": [field]
            }
        }
    })
}

fn sample(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
            "maxTokens": max_tokens
        }
    })
}

fn roots() -> Value {
    json!({"method": "roots/list", "params": {}})
}

/// The accepted elicitation answer's `field`, when the client sent one of the right shape
/// (anything else is asked again, never taken).
pub fn elicited<'a>(input: &'a Input, key: &str, field: &str) -> Option<&'a Value> {
    let answer = input.response(key)?.as_object()?;
    if answer.get("action").and_then(Value::as_str) != Some("accept") {
        return None;
    }
    answer.get("content")?.get(field)
}

fn elicited_text(input: &Input, key: &str, field: &str) -> Option<String> {
    elicited(input, key, field)?.as_str().map(str::to_owned)
}

/// A sampling answer's text.
fn sampled(input: &Input, key: &str) -> Option<String> {
    let content = input.response(key)?.get("content")?;
    Some(content.get("text")?.as_str()?.to_owned())
}

/// How many roots a `roots/list` answer names.
fn root_count(input: &Input, key: &str) -> Option<usize> {
    Some(input.response(key)?.get("roots")?.as_array()?.len())
}

/// The sealing of request state: a key made at start, each state bound to its tool.
pub struct States {
    sealer: Sealer,
}

impl States {
    pub fn new() -> States {
        States {
            sealer: Sealer::new(),
        }
    }

    fn seal(&self, tool: &str, state: Value) -> String {
        self.sealer.seal(&[tool], &state.to_string())
    }

    /// The state sent back with a call of `tool`: `None` when there is none, an error when
    /// it was not sealed here for that tool.
    fn open(&self, tool: &str, input: &Input) -> Result<Option<Value>, SourceError> {
        let Some(sealed) = &input.request_state else {
            return Ok(None);
        };
        let opened = self.sealer.open(&[tool], sealed).ok_or_else(|| {
            SourceError::InvalidParams(
                "requestState integrity check failed: send back the requestState exactly as \
                 received"
                    .into(),
            )
        })?;
        serde_json::from_str(&opened)
            .map(Some)
            .map_err(|_| SourceError::InvalidParams("requestState is not this server's".into()))
    }

    fn nonce() -> String {
        let mut n = [0u8; 8];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut n)
            .expect("the system's random source");
        n.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Answers one of [`TOOLS`].
    pub fn call(&self, name: &str, call: &Call) -> Result<CallToolResponse, SourceError> {
        let input = &call.input;
        let asked =
            |requests: Value, state: Option<Value>| -> Result<CallToolResponse, SourceError> {
                let mut v = json!({"inputRequests": requests});
                if let Some(s) = state {
                    v["requestState"] = self.seal(name, s).into();
                }
                Ok(CallToolResponse::InputRequired(input_required(v)?))
            };
        let done = |s: String| Ok(CallToolResponse::Complete(text(s)));
        match name {
            "test_input_required_result_elicitation" => {
                match elicited_text(input, "user_name", "name") {
                    Some(n) => done(format!("Hello, {n}!")),
                    None => asked(
                        json!({"user_name": elicit("What is your name?", "name", "string")}),
                        None,
                    ),
                }
            }
            "test_input_required_result_sampling" => match sampled(input, "sample_request") {
                Some(t) => done(format!("Sampling result: {t}")),
                None => asked(
                    json!({"sample_request": sample("What is the capital of France?", 100)}),
                    None,
                ),
            },
            "test_input_required_result_list_roots" => match root_count(input, "roots_request") {
                Some(n) => done(format!("Found {n} root(s)")),
                None => asked(json!({"roots_request": roots()}), None),
            },
            "test_input_required_result_request_state" => {
                let state = self.open(name, input)?;
                let ok = elicited(input, "confirm", "ok").and_then(Value::as_bool) == Some(true);
                if state.is_some_and(|s| s["kind"] == "request-state") && ok {
                    return done("state-ok: requestState validated".into());
                }
                asked(
                    json!({"confirm": elicit("Please confirm", "ok", "boolean")}),
                    Some(json!({"kind": "request-state", "nonce": Self::nonce()})),
                )
            }
            "test_input_required_result_multiple_inputs" => {
                let state = self.open(name, input)?;
                let answers = (
                    elicited_text(input, "user_name", "name"),
                    sampled(input, "greeting"),
                    root_count(input, "client_roots"),
                );
                if state.is_some_and(|s| s["kind"] == "multiple-inputs")
                    && let (Some(n), Some(g), Some(r)) = answers
                {
                    return done(format!("Name: {n}; Greeting: {g}; Roots: {r}"));
                }
                asked(
                    json!({
                        "user_name": elicit("What is your name?", "name", "string"),
                        "greeting": sample("Generate a greeting", 50),
                        "client_roots": roots(),
                    }),
                    Some(json!({"kind": "multiple-inputs", "nonce": Self::nonce()})),
                )
            }
            "test_input_required_result_multi_round" => {
                let state = self.open(name, input)?.unwrap_or(Value::Null);
                if state["round"] == 1
                    && let Some(n) = elicited_text(input, "step1", "name")
                {
                    return asked(
                        json!({"step2": elicit("Step 2: What is your favorite color?", "color", "string")}),
                        Some(json!({"round": 2, "name": n, "nonce": Self::nonce()})),
                    );
                }
                if state["round"] == 2
                    && let Some(c) = elicited_text(input, "step2", "color")
                {
                    let n = state["name"].as_str().unwrap_or("friend");
                    return done(format!("Multi-round complete for {n} who likes {c}"));
                }
                asked(
                    json!({"step1": elicit("Step 1: What is your name?", "name", "string")}),
                    Some(json!({"round": 1, "nonce": Self::nonce()})),
                )
            }
            "test_input_required_result_tampered_state" => {
                let state = self.open(name, input)?;
                if state.is_some_and(|s| s["kind"] == "tamper-test")
                    && input.response("confirm").is_some()
                {
                    return done("integrity-ok: state verified".into());
                }
                asked(
                    json!({"confirm": elicit("Please confirm", "ok", "boolean")}),
                    Some(json!({"kind": "tamper-test", "nonce": Self::nonce()})),
                )
            }
            "test_input_required_result_capabilities" => {
                if input.responses.as_ref().is_some_and(|r| !r.is_empty()) {
                    let keys: Vec<&str> = input
                        .responses
                        .iter()
                        .flat_map(|r| r.keys())
                        .map(String::as_str)
                        .collect();
                    return done(format!("capabilities-ok: received {}", keys.join(",")));
                }
                let caps = call.capabilities.clone().unwrap_or_default();
                let mut requests = serde_json::Map::new();
                if caps.elicitation.is_some() {
                    requests.insert(
                        "elicit_input".into(),
                        elicit("Elicitation input", "value", "string"),
                    );
                }
                if caps.sampling.is_some() {
                    requests.insert("sample_input".into(), sample("Sample request", 50));
                }
                if requests.is_empty() {
                    return done("No supported capabilities declared".into());
                }
                asked(
                    Value::Object(requests),
                    Some(json!({"kind": "capabilities-test", "nonce": Self::nonce()})),
                )
            }
            // Its answer is one result on the request's own stream: never a request of the
            // server's own beside it.
            "test_streaming_elicitation" => done("Streaming complete".into()),
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }
}
