//! A foreign upstream's events through the gateway: a server built on the official Python SDK
//! (`mcp`) with the PyPI package `mcp-webhook-events`, which delivers events only by webhook
//! (no poll, no stream), as servers built for ChatGPT do. The gateway subscribes to it with
//! itself as the receiver (answering the package's signed challenge, checking every signature
//! it sends), and serves the events downstream by `events/stream`: `herald watch` on
//! `events:tickets__ticket.updated?ticket_id=T-1` gets each one pushed.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::*;
use crate::watch::Watch;

fn python() -> String {
    std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The Python SDK server, on a port of its own.
async fn sdk_server(dir: &TempDir) -> (Child, u16) {
    sdk_server_with(dir, &[]).await
}

/// [`sdk_server`], with `extra` arguments (`poll`: it answers `events/poll` too).
async fn sdk_server_with(dir: &TempDir, extra: &[&str]) -> (Child, u16) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/py/sdk_events_server.py"
    );
    let store = dir.path().join("events.sqlite3");
    let mut child = Command::new(python())
        .arg(script)
        .arg("0")
        .arg(&store)
        .args(extra)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs the SDK server");
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, out.next_line())
        .await
        .expect("the SDK server starts (are mcp and mcp-webhook-events installed? .ci/run installs them)")
        .unwrap()
        .expect("the SDK server says its port");
    let port = line
        .strip_prefix("listening ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("a port, got {line:?}"));
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    (child, port)
}

#[tokio::test]
async fn a_webhook_only_upstream_is_followed_through_the_gateway_as_its_receiver() {
    let dir = TempDir::new("foreign-events");
    let (_sdk, port) = sdk_server(&dir).await;
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!("[[slug]]\nname = \"tickets\"\nhttp = \"http://127.0.0.1:{port}/mcp\"\n"),
    )
    .unwrap();
    let gw = http_gateway_server(&cfg).await;
    let c = crate::watch::memo_client(&gw.http_url()).await;
    // The gateway offers the slug's webhook-only event type by poll and push.
    let list = crate::events::request(&c, "events/list", json!({}))
        .await
        .unwrap();
    let e = &list["events"][0];
    assert_eq!(e["name"], "tickets__ticket.updated", "{list}");
    assert_eq!(e["delivery"], json!(["poll", "push"]), "{list}");

    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--debounce-ms",
            "0",
            "--mcp-http",
            &gw.http_url(),
            "--watch",
            "t=events:tickets__ticket.updated?ticket_id=T-1",
        ],
    );
    w.event("watch.subscribed", "t").await;
    // The gateway subscribed upstream, its callback verified by the package's challenge.
    let subs = call_json(&c, "tickets__subscriptions", json!({})).await;
    let subs = subs["subscriptions"].as_array().unwrap().clone();
    assert_eq!(subs.len(), 1, "{subs:?}");
    let hook = subs[0]["url"].as_str().unwrap().to_owned();
    assert!(
        hook.starts_with(&format!(
            "{}/events/hooks/",
            gw.http_url().trim_end_matches("/mcp")
        )),
        "{hook}"
    );

    let published = call_json(
        &c,
        "tickets__publish",
        json!({"ticket_id": "T-1", "summary": "Customer replied"}),
    )
    .await;
    assert_eq!(published["delivered"], 1, "{published}");
    // Another ticket's event is not this subscription's.
    call_json(
        &c,
        "tickets__publish",
        json!({"ticket_id": "T-2", "summary": "not watched"}),
    )
    .await;
    call_json(
        &c,
        "tickets__publish",
        json!({"ticket_id": "T-1", "summary": "Closed"}),
    )
    .await;
    let mut lines = Vec::new();
    while lines.len() < 2 {
        let n = w.notice().await;
        lines.extend(n["lines"].as_array().unwrap().clone());
    }
    assert_eq!(
        lines,
        [
            json!(r#"tickets__ticket.updated {"summary":"Customer replied","ticket_id":"T-1"}"#),
            json!(r#"tickets__ticket.updated {"summary":"Closed","ticket_id":"T-1"}"#),
        ]
    );

    // What the receiver refuses: a forged signature, an unknown subscription (410, so the
    // sender drops it), a missing header.
    let http = reqwest::Client::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let post = |url: String, sig: &'static str| {
        http.post(url)
            .header("webhook-id", "msg_forged")
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", sig)
            .body(r#"{"eventId":"evt_forged","name":"ticket.updated","data":{"ticket_id":"T-1","summary":"forged"}}"#)
            .send()
    };
    let forged = post(
        hook.clone(),
        "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    )
    .await
    .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
    let unknown = post(format!("{hook}x"), "v1,AAAA").await.unwrap();
    assert_eq!(unknown.status().as_u16(), 410);
    let bare = http.post(&hook).body("{}").send().await.unwrap();
    assert_eq!(bare.status().as_u16(), 401);
    let metrics = http
        .get(gw.http_url().replace("/mcp", "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("herald_gateway_webhooks_refused_total 3"),
        "{metrics}"
    );
    // Nothing forged reached the watch: the next notice is the next real event.
    call_json(
        &c,
        "tickets__publish",
        json!({"ticket_id": "T-1", "summary": "Reopened"}),
    )
    .await;
    assert_eq!(
        w.notice().await["lines"],
        json!([r#"tickets__ticket.updated {"summary":"Reopened","ticket_id":"T-1"}"#])
    );
    w.terminate().await;
}

/// A tool's structured result (or its text parsed as JSON).
async fn call_json(c: &herald::transport::client::Connection, tool: &str, a: Value) -> Value {
    let r = c
        .call_tool(rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args(a)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert_ne!(r.is_error, Some(true), "{tool}: {r:?}");
    if let Some(v) = r.structured_content {
        return v;
    }
    let text = r.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// A foreign server with `events/poll` but no `events/stream`: `herald watch` on its event type
/// falls back to long polls, and each published event becomes a notice.
#[tokio::test]
async fn a_watch_on_a_server_without_streams_follows_it_by_polls() {
    let dir = TempDir::new("foreign-poll");
    let (_sdk, port) = sdk_server_with(&dir, &["poll"]).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--debounce-ms",
            "0",
            "--mcp-http",
            &url,
            "--watch",
            "t=events:ticket.updated?ticket_id=T-1",
        ],
    );
    let s = w.event("watch.subscribed", "t").await;
    assert_eq!(s["push"], false, "followed by polls: {s}");
    let c = crate::watch::memo_client(&url).await;
    call_json(
        &c,
        "publish",
        json!({"ticket_id": "T-2", "summary": "not watched"}),
    )
    .await;
    call_json(
        &c,
        "publish",
        json!({"ticket_id": "T-1", "summary": "Replied"}),
    )
    .await;
    assert_eq!(
        w.notice().await["lines"],
        json!([r#"ticket.updated {"summary":"Replied","ticket_id":"T-1"}"#])
    );
    w.terminate().await;
}
