//! [`ChatClient`]: a [`Model`] over any OpenAI-compatible chat completions endpoint
//! (llama.cpp's server, vLLM, Ollama, OpenAI, …). Streams (`stream: true`, server-sent events),
//! assembles tool calls from their deltas, always sends `max_tokens` (an uncapped local model
//! once decoded 71,486 tokens), bounds each request by a timeout, and retries a 429 or 5xx
//! with backoff (honouring `Retry-After`). Errors name the URL and say what to do; the key is
//! sent as a bearer token and appears in no message or log.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::agent::model::{Message, Model, ModelError, Progress, Reply, ToolCall, ToolSpec};
use crate::runtime::backoff::Backoff;
use crate::transport::tls::Secret;

/// How to reach the model.
#[derive(Debug, Clone)]
pub struct ChatConfig {
    /// The API's base URL (`http://127.0.0.1:8080/v1`), or the full
    /// `…/chat/completions` URL.
    pub url: String,
    pub model: String,
    pub key: Option<Secret>,
    pub max_tokens: u32,
    /// Longest one request may take, from sending it to the end of its stream.
    pub timeout: Duration,
    /// Retries of a 429 or 5xx (or a dropped connection) before the error stands.
    pub retries: u32,
}

impl ChatConfig {
    pub const DEFAULT_MAX_TOKENS: u32 = 8192;
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
    pub const DEFAULT_RETRIES: u32 = 4;
}

/// Retry pacing: 0.5 s doubling to 8 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(8));
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

pub struct ChatClient {
    cfg: ChatConfig,
    endpoint: String,
    http: reqwest::Client,
}

impl ChatClient {
    pub fn new(cfg: ChatConfig) -> Result<ChatClient, ModelError> {
        let base = cfg.url.trim_end_matches('/');
        let endpoint = if base.ends_with("/chat/completions") {
            base.to_owned()
        } else {
            format!("{base}/chat/completions")
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ModelError::NotChat {
                url: endpoint,
                what: "not an http:// or https:// URL".into(),
            });
        }
        let http = crate::transport::web::http_client(|b| {
            b.tcp_nodelay(true).connect_timeout(Duration::from_secs(10))
        })
        .map_err(|e| ModelError::Unreachable {
            url: endpoint.clone(),
            reason: e.to_string(),
        })?;
        Ok(ChatClient {
            cfg,
            endpoint,
            http,
        })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Whether something answers HTTP at the endpoint (any status: a GET of a chat
    /// endpoint is often refused), within a few seconds: a model that is not there is said at
    /// start, not at the first question.
    pub async fn probe(&self) -> Result<(), ModelError> {
        match self
            .http
            .get(&self.endpoint)
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let reason = if e.is_timeout() {
                    "no answer within 5 s".to_owned()
                } else {
                    // The innermost cause says it best (`Connection refused`, a DNS failure).
                    let mut cause: &dyn std::error::Error = &e;
                    while let Some(next) = cause.source() {
                        cause = next;
                    }
                    cause.to_string()
                };
                Err(ModelError::Unreachable {
                    url: self.endpoint.clone(),
                    reason,
                })
            }
        }
    }

    fn body(&self, messages: &[Message], tools: &[ToolSpec]) -> Value {
        let mut b = json!({
            "model": self.cfg.model,
            "messages": messages,
            "stream": true,
            "max_tokens": self.cfg.max_tokens,
        });
        if !tools.is_empty() {
            b["tools"] = Value::Array(tools.iter().map(ToolSpec::to_wire).collect());
        }
        b
    }

    /// One attempt. `Err((error, retry_after))`: whether (and when) it may be tried again.
    async fn attempt(
        &self,
        body: &Value,
        on_text: &mut (dyn for<'s> FnMut(&'s str) + Send + '_),
    ) -> Result<Reply, (ModelError, Option<Option<Duration>>)> {
        let url = &self.endpoint;
        let mut req = self
            .http
            .post(url)
            .header("accept", "text/event-stream")
            .json(body);
        if let Some(k) = &self.cfg.key {
            req = req.bearer_auth(&k.0);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let reason = if e.is_connect() {
                    "connection refused or unreachable".to_owned()
                } else {
                    // reqwest's text names the URL, never the headers.
                    e.to_string()
                };
                return Err((
                    ModelError::Unreachable {
                        url: url.clone(),
                        reason,
                    },
                    Some(None),
                ));
            }
        };
        let status = resp.status();
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
            let body = resp.text().await.unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            let again = (status.as_u16() == 429 || status.is_server_error()).then_some(retry_after);
            return Err((
                ModelError::Status {
                    url: url.clone(),
                    status: status.as_u16(),
                    body: body.trim().to_owned(),
                },
                again,
            ));
        }
        let ctype = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if ctype.starts_with("application/json") {
            // A server that ignores `stream`: one JSON completion.
            let v: Value = resp.json().await.map_err(|e| {
                (
                    ModelError::NotChat {
                        url: url.clone(),
                        what: format!("its JSON did not parse: {e}"),
                    },
                    None,
                )
            })?;
            let reply = whole(&v).ok_or_else(|| {
                (
                    ModelError::NotChat {
                        url: url.clone(),
                        what: "its JSON has no choices[0].message".into(),
                    },
                    None,
                )
            })?;
            on_text(&reply.content);
            return Ok(reply);
        }
        if !ctype.starts_with("text/event-stream") {
            return Err((
                ModelError::NotChat {
                    url: url.clone(),
                    what: format!(
                        "it answered {}",
                        if ctype.is_empty() {
                            "with no content type"
                        } else {
                            &ctype
                        }
                    ),
                },
                None,
            ));
        }
        let mut acc = Assembly::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut resp = resp;
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    return Err((
                        ModelError::Unreachable {
                            url: url.clone(),
                            reason: format!("the stream broke off: {e}"),
                        },
                        Some(None),
                    ));
                }
            };
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim();
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    return acc.finish(url);
                }
                let v: Value = serde_json::from_str(data).map_err(|e| {
                    (
                        ModelError::NotChat {
                            url: url.clone(),
                            what: format!("a streamed event is not JSON ({e})"),
                        },
                        None,
                    )
                })?;
                if let Some(err) = v.get("error") {
                    return Err((
                        ModelError::Status {
                            url: url.clone(),
                            status: 200,
                            body: err.to_string(),
                        },
                        None,
                    ));
                }
                if let Some(t) = acc.take(&v) {
                    on_text(&t);
                }
            }
        }
        // The stream ended without [DONE]: a last line without its newline, then the answer
        // only if it says it finished.
        if let Ok(v) = serde_json::from_slice::<Value>(
            String::from_utf8_lossy(&buf)
                .trim()
                .trim_start_matches("data:")
                .trim()
                .as_bytes(),
        ) && let Some(t) = acc.take(&v)
        {
            on_text(&t);
        }
        if acc.finish.is_none() {
            return Err((
                ModelError::Unreachable {
                    url: url.clone(),
                    reason: "the stream ended before the answer did".into(),
                },
                Some(None),
            ));
        }
        acc.finish(url)
    }
}

/// A non-streamed completion's reply.
fn whole(v: &Value) -> Option<Reply> {
    let choice = v.get("choices")?.get(0)?;
    let m = choice.get("message")?;
    let tool_calls: Vec<ToolCall> =
        serde_json::from_value(m.get("tool_calls").cloned().unwrap_or(Value::Null))
            .unwrap_or_default();
    Some(Reply {
        content: m
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        tool_calls,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        prompt_tokens: v.pointer("/usage/prompt_tokens").and_then(Value::as_u64),
        completion_tokens: v
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64),
    })
}

/// A streamed reply being put together from its deltas.
#[derive(Default)]
struct Assembly {
    content: String,
    /// Tool calls by their `index`: id, name, arguments so far.
    calls: Vec<(String, String, String)>,
    finish: Option<String>,
    usage: (Option<u64>, Option<u64>),
    saw_choice: bool,
}

impl Assembly {
    /// Takes one event; returns its new text.
    fn take(&mut self, v: &Value) -> Option<String> {
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = (
                u.get("prompt_tokens").and_then(Value::as_u64),
                u.get("completion_tokens").and_then(Value::as_u64),
            );
        }
        let choice = v.get("choices")?.get(0)?;
        self.saw_choice = true;
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
        let d = choice.get("delta")?;
        for c in d
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // Without `index` (some servers), a new id starts a new call.
            let i = match c.get("index").and_then(Value::as_u64) {
                Some(i) => i as usize,
                None => match (c.get("id").and_then(Value::as_str), self.calls.last()) {
                    (Some(id), Some(last)) if !last.0.is_empty() && last.0 != id => {
                        self.calls.len()
                    }
                    _ => self.calls.len().saturating_sub(1),
                },
            };
            if i >= 128 {
                continue;
            }
            while self.calls.len() <= i {
                self.calls.push(Default::default());
            }
            let slot = &mut self.calls[i];
            if let Some(id) = c.get("id").and_then(Value::as_str) {
                slot.0 = id.to_owned();
            }
            if let Some(f) = c.get("function") {
                // Some servers repeat the name in every chunk: it is set once.
                if let Some(n) = f.get("name").and_then(Value::as_str)
                    && slot.1.is_empty()
                {
                    slot.1.push_str(n);
                }
                if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                    slot.2.push_str(a);
                }
            }
        }
        let t = d.get("content").and_then(Value::as_str)?;
        self.content.push_str(t);
        Some(t.to_owned())
    }

    fn finish(self, url: &str) -> Result<Reply, (ModelError, Option<Option<Duration>>)> {
        if !self.saw_choice {
            return Err((
                ModelError::NotChat {
                    url: url.to_owned(),
                    what: "its stream carried no choices".into(),
                },
                None,
            ));
        }
        let tool_calls = self
            .calls
            .into_iter()
            .enumerate()
            .filter(|(_, (_, name, _))| !name.is_empty())
            .map(|(i, (id, name, args))| {
                let id = if id.is_empty() {
                    format!("call_{i}")
                } else {
                    id
                };
                ToolCall::new(id, name, args)
            })
            .collect();
        Ok(Reply {
            content: self.content,
            tool_calls,
            finish_reason: self.finish,
            prompt_tokens: self.usage.0,
            completion_tokens: self.usage.1,
        })
    }
}

#[async_trait]
impl Model for ChatClient {
    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        progress: &mut (dyn for<'s> FnMut(Progress<'s>) + Send),
    ) -> Result<Reply, ModelError> {
        let body = self.body(messages, tools);
        let mut backoff = RETRY;
        let mut tries = 0;
        // Once text has been shown, a retry would show it twice: the error stands then.
        let shown = std::sync::atomic::AtomicBool::new(false);
        loop {
            tries += 1;
            let outcome = {
                let mut watched = |t: &str| {
                    if !t.is_empty() {
                        shown.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    progress(Progress::Text(t));
                };
                tokio::time::timeout(self.cfg.timeout, self.attempt(&body, &mut watched)).await
            };
            let err = match outcome {
                Ok(Ok(r)) => return Ok(r),
                Err(_) => {
                    return Err(ModelError::Timeout {
                        url: self.endpoint.clone(),
                        secs: self.cfg.timeout.as_secs(),
                    });
                }
                Ok(Err((e, None))) => return Err(e),
                Ok(Err((e, Some(after)))) => (e, after),
            };
            if tries > self.cfg.retries || shown.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(err.0);
            }
            let delay = err.1.unwrap_or_else(|| backoff.next_delay());
            progress(Progress::Retrying {
                error: &err.0,
                attempt: tries,
                of: self.cfg.retries + 1,
                after: delay,
            });
            tokio::time::sleep(delay).await;
        }
    }
}
