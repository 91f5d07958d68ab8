//! A scripted OpenAI-compatible chat completions server: each request is recorded and
//! answered with the next step of a script, streamed as server-sent events the way llama.cpp
//! and OpenAI stream (text in pieces, a tool call's name and arguments across chunks, then
//! `[DONE]`), or with an HTTP error status.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

#[derive(Debug, Clone)]
pub enum Step {
    /// Answer with this text.
    Text(String),
    /// Call run_code with this Python.
    Code(String),
    /// Answer with this HTTP status.
    Status(u16),
    /// Never answer.
    Hang,
}

#[derive(Default)]
struct Inner {
    script: Mutex<VecDeque<Step>>,
    seen: Mutex<Vec<(HeaderMap, Value)>>,
    asked: Notify,
}

pub struct FakeModel {
    inner: Arc<Inner>,
    pub url: String,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeModel {
    pub async fn start(script: Vec<Step>) -> FakeModel {
        let inner = Arc::new(Inner {
            script: Mutex::new(script.into()),
            ..Inner::default()
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeModel {
            inner,
            url: format!("http://{addr}/v1"),
            _server: server,
        }
    }

    /// The request bodies so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.inner
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }

    pub fn headers(&self, i: usize) -> HeaderMap {
        self.inner.seen.lock().unwrap()[i].0.clone()
    }

    /// Waits until `n` requests have come.
    pub async fn until_asked(&self, n: usize) {
        tokio::time::timeout(crate::support::WAIT, async {
            loop {
                let asked = self.inner.asked.notified();
                tokio::pin!(asked);
                asked.as_mut().enable();
                if self.inner.seen.lock().unwrap().len() >= n {
                    return;
                }
                asked.await;
            }
        })
        .await
        .expect("the model was asked in time");
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let v = json!({"id": "x", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\n")
}

async fn answer(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let step = inner.script.lock().unwrap().pop_front();
    inner.seen.lock().unwrap().push((headers, body));
    inner.asked.notify_waiters();
    let sse = match step {
        None => vec![chunk(json!({"content": "(script ended)"}), Some("stop"))],
        Some(Step::Hang) => std::future::pending().await,
        Some(Step::Status(s)) => {
            return (StatusCode::from_u16(s).unwrap(), "scripted failure").into_response();
        }
        Some(Step::Text(t)) => {
            let mid = t
                .char_indices()
                .nth(t.chars().count() / 2)
                .map_or(0, |(i, _)| i);
            vec![
                chunk(json!({"role": "assistant", "content": &t[..mid]}), None),
                chunk(json!({"content": &t[mid..]}), None),
                chunk(json!({}), Some("stop")),
            ]
        }
        Some(Step::Code(code)) => {
            let args = json!({"code": code}).to_string();
            let mid = args.len() / 2;
            vec![
                chunk(
                    json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1",
                        "type": "function", "function": {"name": "run_code", "arguments": &args[..mid]}}]}),
                    None,
                ),
                chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": &args[mid..]}}]}),
                    None,
                ),
                chunk(json!({}), Some("tool_calls")),
            ]
        }
    };
    let mut out = sse.concat();
    out.push_str("data: [DONE]\n\n");
    ([("content-type", "text/event-stream")], out).into_response()
}
