//! The tasks extension's push path.
//!
//! 1. Transition → push on one listen stream, in process: a task changes its status message
//!    10,000 times (each a transition: stamped, queued, dispatched, offered to the stream's
//!    channel) and the stream's `next()` returns it. p50 / p99. Target p99 < 1 ms.
//! 2. The same over the wire, against the release `herald memo` on stdio and on QUIC: 256
//!    `memo_wait` tasks per round on one listen stream (`taskIds`), each completed by a
//!    `memo_set` of its key; the time from sending the `memo_set` to reading the task's
//!    `completed` push, beside the time from sending it to reading its own answer (the
//!    floor: the call's round trip), for 10,000 tasks.
//!    And on stdio through `herald gateway` in front of a stdio `herald memo` (the task
//!    relayed: `m__memo_wait`, its pushes over the gateway's upstream listen), beside
//!    the direct figure of the same run.
//! 3. Fan-out, in process: 1,000 streams each watching 10 of 100 tasks, 100 transitions a
//!    second for 5 s: delivery p99 across all streams, and the process's RSS.
//!
//! `cargo bench --bench tasks` (HERALD_BENCH_N overrides the 10,000).

#[path = "common.rs"]
mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::mcp::tasks::{TaskListen, Tasks};
use herald::runtime::context::RoleContext;
use rmcp::model::{CallToolResult, ContentBlock, ErrorData as McpError};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, Notify, mpsc};

use common::{BIN, ms, pct, rss_kib};

const TARGET_P99: Duration = Duration::from_millis(1);
const WAIT: Duration = Duration::from_secs(60);

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"}
    })
}

/// A task whose work sets its status message each time it is told to, until told to stop.
async fn stepping(tasks: &Tasks) -> (String, mpsc::UnboundedSender<Option<String>>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<String>>();
    let t = tasks
        .start("bench", move |h| async move {
            while let Some(Some(m)) = rx.recv().await {
                h.message(m);
            }
            Ok::<_, McpError>(CallToolResult::success(vec![ContentBlock::text("done")]))
        })
        .await
        .unwrap();
    (t.task_id, tx)
}

async fn in_process(n: usize) {
    let ctx = RoleContext::new("bench");
    let tasks = Tasks::open(&ctx, None, "bench").await;
    let (id, tx) = stepping(&tasks).await;
    let mut l = tasks.listen("bench", std::slice::from_ref(&id));
    l.initial();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t0 = Instant::now();
        tx.send(Some(format!("step {i}"))).unwrap();
        let got = tokio::time::timeout(WAIT, l.next()).await.unwrap().unwrap();
        lat.push(t0.elapsed());
        assert_eq!(
            got.task.status_message.as_deref(),
            Some(format!("step {i}").as_str())
        );
    }
    let _ = tx.send(None);
    lat.sort();
    println!(
        "1. transition -> push, in process, {n} transitions: p50 {} p99 {} max {} (target p99 < {}: {})",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap()),
        ms(TARGET_P99),
        if pct(&lat, 0.99) < TARGET_P99 {
            "met"
        } else {
            "MISSED"
        }
    );
    ctx.shutdown().cancel();
}

/// A line-framed JSON-RPC connection: a writer, and a reader task routing answers by id and
/// task pushes by task id.
struct Wire {
    write: Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
    answers: Arc<Mutex<HashMap<u64, Instant>>>,
    pushes: Arc<Mutex<HashMap<String, Instant>>>,
    got: Arc<Notify>,
}

impl Wire {
    fn new(
        read: impl tokio::io::AsyncRead + Unpin + Send + 'static,
        write: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    ) -> Wire {
        let answers: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
        let pushes: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let got = Arc::new(Notify::new());
        let (a, p, g) = (answers.clone(), pushes.clone(), got.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let now = Instant::now();
                let Ok(v) = serde_json::from_str::<Value>(&l) else {
                    continue;
                };
                if v["method"] == "notifications/tasks" && v["params"]["status"] == "completed" {
                    p.lock()
                        .await
                        .insert(v["params"]["taskId"].as_str().unwrap_or("").to_owned(), now);
                } else if let Some(id) = v["id"].as_u64() {
                    a.lock().await.insert(id, now);
                    // Keep the answer's body for a task's id.
                    if let Some(t) = v["result"]["taskId"].as_str() {
                        p.lock().await.insert(format!("created:{id}:{t}"), now);
                    }
                }
                g.notify_waiters();
                g.notify_one();
            }
        });
        Wire {
            write: Box::new(write),
            answers,
            pushes,
            got,
        }
    }

    async fn send(&mut self, v: Value) {
        let mut b = v.to_string().into_bytes();
        b.push(b'\n');
        self.write.write_all(&b).await.unwrap();
        self.write.flush().await.unwrap();
    }

    /// Waits until `check` holds on what was read.
    async fn until<F>(&self, check: F)
    where
        F: Fn(&HashMap<u64, Instant>, &HashMap<String, Instant>) -> bool,
    {
        tokio::time::timeout(WAIT, async {
            loop {
                let notified = self.got.notified();
                {
                    let a = self.answers.lock().await;
                    let p = self.pushes.lock().await;
                    if check(&a, &p) {
                        return;
                    }
                }
                notified.await;
            }
        })
        .await
        .expect("the server answered in time");
    }
}

async fn over_wire(label: &str, mut w: Wire, n: usize, prefix: &str) {
    let mut next_id = 1u64;
    let mut to_push = Vec::new();
    let mut to_answer = Vec::new();
    let rounds = n.div_ceil(256);
    for round in 0..rounds {
        let batch = 256.min(n - round * 256);
        // The tasks of this round.
        let first = next_id;
        for i in 0..batch {
            w.send(
                json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call",
                "params": {"_meta": meta(), "name": format!("{prefix}memo_wait"),
                    "arguments": {"key": format!("k{round}-{i}"), "timeout_ms": 600000}}}),
            )
            .await;
            next_id += 1;
        }
        let last = next_id - 1;
        w.until(|a, _| (first..=last).all(|i| a.contains_key(&i)))
            .await;
        let ids: Vec<String> = {
            let p = w.pushes.lock().await;
            (first..=last)
                .map(|i| {
                    p.keys()
                        .find_map(|k| k.strip_prefix(&format!("created:{i}:")).map(str::to_owned))
                        .expect("a task id")
                })
                .collect()
        };
        let listen = next_id;
        next_id += 1;
        w.send(
            json!({"jsonrpc": "2.0", "id": listen, "method": "subscriptions/listen",
            "params": {"_meta": meta(), "notifications": {"taskIds": ids}}}),
        )
        .await;
        // Each completion: memo_set, then its answer and the task's push.
        for (i, task) in ids.iter().enumerate() {
            let set = next_id;
            next_id += 1;
            let t0 = Instant::now();
            w.send(json!({"jsonrpc": "2.0", "id": set, "method": "tools/call",
                "params": {"_meta": meta(), "name": format!("{prefix}memo_set"),
                    "arguments": {"key": format!("k{round}-{i}"), "value": 1}}}))
                .await;
            w.until(|a, p| a.contains_key(&set) && p.contains_key(task.as_str()))
                .await;
            let a = w.answers.lock().await[&set];
            let p = w.pushes.lock().await[task.as_str()];
            to_answer.push(a - t0);
            to_push.push(p - t0);
        }
        // End this round's listen.
        w.send(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": listen}}),
        )
        .await;
    }
    to_push.sort();
    to_answer.sort();
    println!(
        "2. {label}: memo_set -> completed push p50 {} p99 {}; memo_set -> its answer p50 {} p99 {} ({} tasks)",
        ms(pct(&to_push, 0.5)),
        ms(pct(&to_push, 0.99)),
        ms(pct(&to_answer, 0.5)),
        ms(pct(&to_answer, 0.99)),
        to_push.len()
    );
}

async fn stdio(n: usize) {
    let mut child = tokio::process::Command::new(BIN)
        .args(["--store", ":memory:", "memo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let w = Wire::new(child.stdout.take().unwrap(), child.stdin.take().unwrap());
    over_wire("stdio", w, n, "").await;
}

async fn gateway_stdio(n: usize) {
    let dir = std::env::temp_dir().join(format!("herald-bench-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!("[[slug]]\nname = \"m\"\nstdio = \"{BIN} --store :memory: memo\"\n"),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(["--store", ":memory:", "gateway", "--config"])
        .arg(&cfg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let w = Wire::new(child.stdout.take().unwrap(), child.stdin.take().unwrap());
    over_wire("stdio through herald gateway", w, n, "m__").await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn quic(n: usize) {
    let (_child, v) =
        common::serve(&["--store", ":memory:", "memo", "--quic", "127.0.0.1:0"]).await;
    let trust = herald::transport::tls::ClientTrust {
        pin: Some(v["quic_fingerprint"].as_str().unwrap().to_owned()),
        ..Default::default()
    };
    let (_e, _c, send, recv) = herald::transport::quic::connect(
        v["quic"].as_str().unwrap(),
        &trust,
        herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
    )
    .await
    .unwrap();
    let w = Wire::new(recv, send);
    over_wire("QUIC", w, n, "").await;
}

async fn fan_out() {
    let ctx = RoleContext::new("bench");
    let tasks = Tasks::open(&ctx, None, "bench").await;
    let mut ids = Vec::new();
    let mut steps = Vec::new();
    for _ in 0..100 {
        let (id, tx) = stepping(&tasks).await;
        ids.push(id);
        steps.push(tx);
    }
    let before = rss_kib(std::process::id());
    let (lat_tx, mut lat_rx) = mpsc::unbounded_channel::<Duration>();
    let sent_at: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut streams = Vec::new();
    for s in 0..1000usize {
        let mine: Vec<String> = (0..10).map(|k| ids[(s + k * 10) % 100].clone()).collect();
        let mut l: TaskListen = tasks.listen("bench", &mine);
        l.initial();
        let (lat_tx, sent_at) = (lat_tx.clone(), sent_at.clone());
        streams.push(tokio::spawn(async move {
            while let Some(t) = l.next().await {
                if let Some(m) = &t.task.status_message
                    && let Some(at) = sent_at.lock().unwrap().get(m)
                {
                    let _ = lat_tx.send(at.elapsed());
                }
            }
        }));
    }
    drop(lat_tx);
    let with_streams = rss_kib(std::process::id());
    // 100 transitions a second for 5 s, spread over the tasks.
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for i in 0..500usize {
        tick.tick().await;
        let m = format!("m{i}");
        sent_at.lock().unwrap().insert(m.clone(), Instant::now());
        steps[i % 100].send(Some(m)).unwrap();
    }
    // Each transition reaches the 100 streams watching its task.
    let mut lat = Vec::new();
    let want = 500 * 100;
    let deadline = tokio::time::Instant::now() + WAIT;
    while lat.len() < want {
        match tokio::time::timeout_at(deadline, lat_rx.recv()).await {
            Ok(Some(d)) => lat.push(d),
            _ => break,
        }
    }
    let after = rss_kib(std::process::id());
    lat.sort();
    println!(
        "3. fan-out: 1,000 streams x 10 tasks (100 tasks), 100 transitions/s for 5 s: {} of {want} pushes delivered, {} shed; delivery p50 {} p99 {} max {}; RSS {:.1} MiB before the streams, {:.1} MiB with them, {:.1} MiB after",
        lat.len(),
        tasks.shed(),
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap()),
        before as f64 / 1024.0,
        with_streams as f64 / 1024.0,
        after as f64 / 1024.0,
    );
    for s in steps {
        let _ = s.send(None);
    }
    ctx.shutdown().cancel();
    for s in streams {
        s.abort();
    }
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "tasks bench, load {}",
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    in_process(n).await;
    stdio(n).await;
    gateway_stdio(n).await;
    quic(n).await;
    fan_out().await;
}
