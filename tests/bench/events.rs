//! Events push and webhook delivery: the time from a `memo_set` to each subscription's
//! `notifications/events/event` (`events/stream` over QUIC) and to each webhook POST at a
//! receiver on loopback, with 1, 100 and 1,000 streams (1 and 100 webhook subscriptions: one
//! subscriber keeps at most 100), straight from `herald memo` and through `herald gateway` in
//! front of it, side by side in one run. Through the gateway every stream of the event type
//! shares one upstream subscription (`herald_gateway_event_feeds`). Beside them, with a Python
//! that has `mcp` and `mcp-webhook-events` (`HERALD_TEST_PYTHON`, as the tests use): the same
//! receiver fed by a server on the official Python SDK with that package (its `publish` tool
//! publishes and delivers at once), straight and through the gateway (which takes it as a
//! webhook receiver and delivers by its own webhooks).
//!
//! `cargo bench --bench events` (HERALD_BENCH_N overrides the 20 changes per case).

#[path = "common.rs"]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use common::{BIN, RawHttp, ms, pct, serve_with};

const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const WAIT: Duration = Duration::from_secs(60);

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {}})
}

/// One QUIC connection of raw lines, its lines on a channel.
struct Lines {
    _endpoint: quinn::Endpoint,
    _conn: quinn::Connection,
    send: quinn::SendStream,
    rx: mpsc::Receiver<(Instant, Value)>,
}

async fn lines(addr: &str, pin: &str) -> Lines {
    let trust = herald::transport::tls::ClientTrust {
        pin: Some(pin.to_owned()),
        ..Default::default()
    };
    let (endpoint, conn, send, mut recv) =
        herald::transport::quic::connect(addr, &trust, Duration::from_secs(10))
            .await
            .expect("QUIC connect");
    let (tx, rx) = mpsc::channel(1 << 16);
    tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        while let Ok(Some(n)) = recv.read(&mut chunk).await {
            let at = Instant::now();
            buf.extend_from_slice(&chunk[..n]);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if let Ok(v) = serde_json::from_slice::<Value>(&line)
                    && tx.send((at, v)).await.is_err()
                {
                    return;
                }
            }
        }
    });
    Lines {
        _endpoint: endpoint,
        _conn: conn,
        send,
        rx,
    }
}

async fn next(rx: &mut mpsc::Receiver<(Instant, Value)>, method: &str) -> Instant {
    loop {
        let (at, v) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("a message in time")
            .expect("open");
        assert!(v.get("error").is_none(), "{v}");
        if v["method"] == method {
            return at;
        }
    }
}

/// What makes an event: a tool on a server (a keep-alive connection) and its arguments.
struct Source<'a> {
    conn: &'a mut RawHttp,
    tool: &'static str,
    args: fn(usize) -> Value,
    /// Whether an event's `data` is the one change `i` made.
    marks: fn(&Value, usize) -> bool,
}

/// One change through `memo`'s `memo_set`.
fn memo_source(conn: &mut RawHttp) -> Source<'_> {
    Source {
        conn,
        tool: "memo_set",
        args: |i| json!({"key": "k", "value": i}),
        marks: |d, i| d["object"] == json!(i),
    }
}

/// One change, timed from just before it is sent.
async fn change(src: &mut Source<'_>, i: usize) -> Instant {
    let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
        "params": {"name": src.tool, "arguments": (src.args)(i), "_meta": meta()}})
    .to_string();
    let t0 = Instant::now();
    let (_, v) = src
        .conn
        .rpc(&body, "tools/call", Some(src.tool))
        .await
        .expect("the change");
    assert!(v.get("error").is_none(), "{}: {v}", src.tool);
    t0
}

fn report(what: &str, mut lat: Vec<Duration>) {
    lat.sort();
    println!(
        "{what:<44} p50 {:>10}  p99 {:>10}  ({} deliveries)",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        lat.len()
    );
}

async fn streams(
    label: &str,
    quic: &str,
    pin: &str,
    name: &str,
    n: usize,
    memo: &mut RawHttp,
    rounds: usize,
) {
    let mut memo = memo_source(memo);
    let mut l = lines(quic, pin).await;
    let mut batch = Vec::new();
    for id in 0..n {
        let rq = json!({"jsonrpc": "2.0", "id": id, "method": "events/stream",
            "params": {"_meta": meta(), "name": name}});
        batch.extend_from_slice(rq.to_string().as_bytes());
        batch.push(b'\n');
    }
    l.send.write_all(&batch).await.unwrap();
    for _ in 0..n {
        next(&mut l.rx, "notifications/events/active").await;
    }
    let mut lat = Vec::with_capacity(n * rounds);
    for r in 0..rounds {
        let t0 = change(&mut memo, r).await;
        for _ in 0..n {
            lat.push(next(&mut l.rx, "notifications/events/event").await - t0);
        }
    }
    report(&format!("stream {label}, {n} streams"), lat);
}

/// A receiver: every POST's arrival, by path; the challenge echoed.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<HashMap<String, Arrivals>>>);

/// Where one path's POSTs go: when each came, and its body.
type Arrivals = mpsc::UnboundedSender<(Instant, Value)>;

async fn receiver() -> (u16, Received) {
    let got = Received::default();
    let g = got.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |uri: axum::http::Uri, body: axum::body::Bytes| {
            let g = g.clone();
            async move {
                let at = Instant::now();
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                if v["type"] == "verification" {
                    return axum::Json(json!({"challenge": v["challenge"]}));
                }
                if let Some(tx) = g.0.lock().unwrap().get(uri.path()) {
                    let _ = tx.send((at, v));
                }
                axum::Json(json!({}))
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, got)
}

#[allow(clippy::too_many_arguments)]
async fn webhooks(
    label: &str,
    http: &str,
    name: &str,
    arguments: Value,
    n: usize,
    src: &mut Source<'_>,
    rounds: usize,
    port: u16,
    got: &Received,
) {
    let mut c = RawHttp::connect(http, None).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut urls = Vec::new();
    for i in 0..n {
        let path = format!("/h/{}/{n}/{i}", label.replace(' ', "-"));
        got.0.lock().unwrap().insert(path.clone(), tx.clone());
        let url = format!("http://127.0.0.1:{port}{path}");
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "events/subscribe",
            "params": {"_meta": meta(), "name": name, "arguments": arguments,
                       "delivery": {"mode": "webhook", "url": url, "secret": SECRET}}})
        .to_string();
        let (_, v) = c.rpc(&body, "events/subscribe", None).await.unwrap();
        assert!(v.get("error").is_none(), "subscribe: {v}");
        urls.push(url);
    }
    let mut lat = Vec::with_capacity(n * rounds);
    let mut strays = 0;
    for r in 0..rounds {
        let t0 = change(src, 1000 + r).await;
        for _ in 0..n {
            // The POST of this round's event (a stray one, a retry or a gap, is counted
            // apart, not taken for it).
            loop {
                let (at, v) = tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .unwrap()
                    .unwrap();
                if (src.marks)(&v["data"], 1000 + r) {
                    lat.push(at - t0);
                    break;
                }
                strays += 1;
            }
        }
    }
    report(&format!("webhook {label}, {n} subscriptions"), lat);
    if strays > 0 {
        println!("  ({strays} other POSTs: retries or gaps)");
    }
    for (i, url) in urls.iter().enumerate() {
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "events/unsubscribe",
            "params": {"_meta": meta(), "name": name, "arguments": arguments,
                       "delivery": {"mode": "webhook", "url": url}}})
        .to_string();
        c.rpc(&body, "events/unsubscribe", None).await.unwrap();
    }
}

/// The Python SDK server of the tests (`tests/it/py/sdk_events_server.py`) on a port of its
/// own, with its MCP URL; `None` when `HERALD_TEST_PYTHON` (else `python3`) cannot run it.
async fn python_server(dir: &std::path::Path) -> Option<(tokio::process::Child, String)> {
    use tokio::io::AsyncBufReadExt as _;
    let python = std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/py/sdk_events_server.py"
    );
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .arg("0")
        .arg(dir.join("events.sqlite3"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let mut out = tokio::io::BufReader::new(child.stdout.take()?).lines();
    let line = tokio::time::timeout(WAIT, out.next_line())
        .await
        .ok()?
        .ok()??;
    let port: u16 = line.strip_prefix("listening ")?.trim().parse().ok()?;
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    Some((child, format!("http://127.0.0.1:{port}/mcp")))
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rounds: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("herald-bench-events-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: set before any thread of this process reads the environment (the children
    // inherit it).
    unsafe { std::env::set_var("HERALD_EVENTS_KEY", KEY) };
    let common = [
        "--max-event-streams",
        "1100",
        "--callback-allow",
        "http://127.0.0.1:",
    ];
    let mut args = vec![
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(&common);
    let (_memo, m) = serve_with(BIN, &args).await;
    let memo_http = m["http_url"].as_str().unwrap().to_owned();
    // The tool a user would pick instead for webhooks: a server on the official Python SDK
    // with mcp-webhook-events, when that Python is there.
    let foreign = python_server(&dir).await;
    let cfg = dir.join("gateway.toml");
    let mut slugs = format!("[[slug]]\nname = \"m\"\nhttp = \"{memo_http}\"\n");
    if let Some((_, url)) = &foreign {
        slugs.push_str(&format!("[[slug]]\nname = \"t\"\nhttp = \"{url}\"\n"));
    }
    std::fs::write(&cfg, slugs).unwrap();
    let mut args = vec![
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(&common);
    let (_gw, g) = serve_with(BIN, &args).await;
    let mut writer = RawHttp::connect(&memo_http, None).await.unwrap();
    let (port, got) = receiver().await;
    println!("events: {rounds} changes per case; latency from the memo_set to each delivery");
    for n in [1, 100, 1000] {
        for (label, v, name) in [
            ("direct", &m, "memo.changed"),
            ("through the gateway", &g, "m__memo.changed"),
        ] {
            let (quic, pin) = (
                v["quic"].as_str().unwrap(),
                v["quic_fingerprint"].as_str().unwrap(),
            );
            streams(label, quic, pin, name, n, &mut writer, rounds).await;
        }
    }
    if foreign.is_none() {
        println!(
            "(no Python with mcp and mcp-webhook-events: HERALD_TEST_PYTHON names one; the Python SDK rows are left out)"
        );
    }
    for n in [1, 100] {
        for (label, v, name) in [
            ("direct", &m, "memo.changed"),
            ("through the gateway", &g, "m__memo.changed"),
        ] {
            let http = v["http_url"].as_str().unwrap();
            let mut src = memo_source(&mut writer);
            webhooks(
                label,
                http,
                name,
                json!({}),
                n,
                &mut src,
                rounds,
                port,
                &got,
            )
            .await;
        }
        if let Some((_, url)) = &foreign {
            let ticket = json!({"ticket_id": "T"});
            let gw = g["http_url"].as_str().unwrap();
            for (label, http, name) in [
                (
                    "Python SDK + mcp-webhook-events",
                    url.as_str(),
                    "ticket.updated",
                ),
                ("Python SDK through the gateway", gw, "t__ticket.updated"),
            ] {
                // A connection per case: uvicorn closes one idle for 5 s.
                let mut conn = RawHttp::connect(url, None).await.unwrap();
                let mut src = Source {
                    conn: &mut conn,
                    tool: "publish",
                    args: |i| json!({"ticket_id": "T", "summary": format!("s{i}")}),
                    marks: |d, i| d["summary"] == json!(format!("s{i}")),
                };
                webhooks(
                    label,
                    http,
                    name,
                    ticket.clone(),
                    n,
                    &mut src,
                    rounds,
                    port,
                    &got,
                )
                .await;
            }
        }
    }
    let metrics = reqwest::get(g["http_url"].as_str().unwrap().replace("/mcp", "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for l in metrics.lines().filter(|l| {
        l.starts_with("herald_gateway_event_") || l.starts_with("herald_gateway_webhooks")
    }) {
        println!("gateway {l}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
