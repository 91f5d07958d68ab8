//! The agent's notice path, against the release `herald memo --http` and `herald agent`, with
//! a fake OpenAI-compatible model in this process that answers at once:
//!
//! 1. A `memo_set` to the notice's user message reaching the model (`--debounce-ms 0`), for N
//!    changes one after another (HERALD_BENCH_N, default 1,000): p50 / p99.
//! 2. 1,000 changes while the model holds one answer (a slow run): how many runs follow once
//!    it answers (the target is exactly one, seeing every change), and the agent's RSS.
//!
//! `cargo bench --bench agent`

#[path = "common.rs"]
mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Notify;

use common::{BIN, ms, pct, rss_kib};

const WAIT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Model {
    /// Each request: when it came, the last message's text.
    seen: Mutex<Vec<(Instant, String, usize)>>,
    asked: Notify,
    /// While set, answers wait for `release`.
    hold: Mutex<bool>,
    release: Notify,
}

fn sse(delta: Value, finish: &str) -> String {
    let v = json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\ndata: [DONE]\n\n")
}

async fn answer(State(m): State<Arc<Model>>, body: String) -> impl IntoResponse {
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    let msgs = v["messages"].as_array().cloned().unwrap_or_default();
    let last = msgs
        .last()
        .and_then(|l| l["content"].as_str())
        .unwrap_or("")
        .to_owned();
    // The distinct burst keys the thread's notices name.
    let mut keys = std::collections::BTreeSet::new();
    for m in &msgs {
        let Some(c) = m["content"]
            .as_str()
            .filter(|c| c.starts_with("<watch-event"))
        else {
            continue;
        };
        for w in c.split(|ch: char| !ch.is_ascii_alphanumeric()) {
            if w.starts_with("burst") {
                keys.insert(w.to_owned());
            }
        }
    }
    let notices = keys.len();
    let n = {
        let mut s = m.seen.lock().unwrap();
        s.push((Instant::now(), last, notices));
        s.len()
    };
    m.asked.notify_waiters();
    let held = *m.hold.lock().unwrap();
    if held {
        m.release.notified().await;
    }
    let body = match n {
        1 => sse(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {
                "name": "run_code",
                "arguments": json!({"code": "watch_start(name=\"notes\", uri=\"memo://notes\")"}).to_string()}}]}),
            "tool_calls",
        ),
        2 => sse(json!({"content": "watching"}), "stop"),
        _ => sse(json!({"content": "NO_REPLY"}), "stop"),
    };
    ([("content-type", "text/event-stream")], body)
}

impl Model {
    async fn until(&self, f: impl Fn(&[(Instant, String, usize)]) -> bool) {
        tokio::time::timeout(WAIT, async {
            loop {
                let n = self.asked.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if f(&self.seen.lock().unwrap()) {
                    return;
                }
                n.await;
            }
        })
        .await
        .expect("the model was asked in time");
    }
}

async fn memo_set(http: &reqwest::Client, url: &str, key: &str) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"}},
        "name": "memo_set", "arguments": {"key": key, "value": 1}}});
    let r = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "memo_set")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let _ = r.bytes().await;
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "agent bench, load {}",
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    let (_memo, v) = common::serve(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let memo_url = v["http_url"].as_str().unwrap().to_owned();
    let model = Arc::new(Model::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(model.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let model_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut agent = tokio::process::Command::new(BIN)
        .args([
            "--store",
            ":memory:",
            "agent",
            "--mcp-http",
            &memo_url,
            "--model-url",
            &model_url,
            "--debounce-ms",
            "0",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = agent.stdin.take().unwrap();
    let mut out = BufReader::new(agent.stdout.take().unwrap()).lines();
    stdin.write_all(b"watch my notes\n").await.unwrap();
    stdin.flush().await.unwrap();
    let reply = tokio::time::timeout(WAIT, out.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.as_deref(), Some("watching"));
    let http = herald::transport::web::http_client(|b| b).unwrap();

    // 1. memo_set -> the notice's message at the model.
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("k{i}");
        let needle = format!("ADDED {key}\n");
        let t0 = Instant::now();
        memo_set(&http, &memo_url, &key).await;
        model
            .until(|s| s.iter().any(|(_, last, _)| last.contains(&needle)))
            .await;
        let at = model
            .seen
            .lock()
            .unwrap()
            .iter()
            .find(|(_, last, _)| last.contains(&needle))
            .unwrap()
            .0;
        lat.push(at - t0);
    }
    lat.sort();
    println!(
        "1. memo_set -> the notice's user message at the model, {n} changes: p50 {} p99 {} max {}",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );

    // 2. 1,000 changes during one slow run.
    *model.hold.lock().unwrap() = true;
    let before = model.seen.lock().unwrap().len();
    memo_set(&http, &memo_url, "slow").await;
    model.until(|s| s.len() > before).await;
    let runs_before = model.seen.lock().unwrap().len();
    for i in 0..1000 {
        memo_set(&http, &memo_url, &format!("burst{i}")).await;
    }
    // Let the last notices reach the agent while its run still waits.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_kib(agent.id().unwrap());
    *model.hold.lock().unwrap() = false;
    model.release.notify_waiters();
    model.until(|s| s.len() > runs_before).await;
    // Anything more would come right after; give it a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = model.seen.lock().unwrap().clone();
    let follow = &seen[runs_before..];
    let keys = follow.first().map_or(0, |f| f.2);
    println!(
        "2. 1,000 changes during one slow run: {} follow-up run(s) (target: exactly 1: {}), its notices naming {keys} of the 1,000 keys; agent RSS {:.1} MiB with them pending",
        follow.len(),
        if follow.len() == 1 { "met" } else { "MISSED" },
        rss as f64 / 1024.0
    );
    let _ = agent.start_kill();
}
