//! `herald watch` on an event type (`events:NAME?arg=value`): the events are pushed by
//! `events/stream` over HTTP and QUIC from `herald memo`, and through `herald up`'s gateway
//! with an `on_event` filter.

use serde_json::json;

use crate::support::*;
use crate::watch::{Watch, memo_client};

#[tokio::test]
async fn an_events_watch_gets_each_event_over_http_and_quic() {
    let memo = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
    ])
    .await;
    let mut http = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &memo.http_url(),
            "--watch",
            "e=events:memo.changed",
        ],
    );
    let mut quic = Watch::spawn(
        ":memory:",
        &[
            "--mcp-quic",
            &memo.quic_addr(),
            "--tls-pin",
            &memo.fingerprint(),
            "--watch",
            "e=events:memo.changed",
        ],
    );
    for w in [&mut http, &mut quic] {
        let s = w.event("watch.subscribed", "e").await;
        assert_eq!(s["push"], true, "followed by events/stream: {s}");
    }
    let c = memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "owner", "value": "ana"})).await;
    for w in [&mut http, &mut quic] {
        let n = w.notice().await;
        assert_eq!(n["uri"], "events:memo.changed");
        assert_eq!(n["lines"], json!([r#"ADDED owner = "ana""#]));
    }
    call(&c, "memo_delete", json!({"key": "owner"})).await;
    for w in [&mut http, &mut quic] {
        let lines = w.notice().await["lines"].clone();
        assert!(
            lines[0].as_str().unwrap().starts_with("DELETED owner"),
            "{lines}"
        );
    }
    http.terminate().await;
    quic.terminate().await;
}

#[tokio::test]
async fn an_events_watch_through_the_gateway_runs_its_filter() {
    let demo = TempDir::new("watch-events-up");
    let (up, memo) = up_demo_http(&demo, &[], &[]).await;
    let file = demo.path().join("f.py");
    std::fs::write(
        &file,
        "f\"{event['event']}: {event['key']}\" if event['type'] == 'ADDED' else None\n",
    )
    .unwrap();
    let url = up.http_url();
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &url,
            "--watch",
            "e=events:memo__memo.changed",
            "--on-event",
            file.to_str().unwrap(),
        ],
    );
    w.event("watch.subscribed", "e").await;
    let c = memo.client().await;
    call(&c, "memo__memo_set", json!({"key": "k1", "value": 1})).await;
    call(&c, "memo__memo_set", json!({"key": "k1", "value": 2})).await;
    call(&c, "memo__memo_set", json!({"key": "k2", "value": 3})).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        let n = w.notice().await;
        got.extend(n["lines"].as_array().unwrap().clone());
    }
    assert_eq!(
        got,
        [
            json!("memo__memo.changed: k1"),
            json!("memo__memo.changed: k2")
        ]
    );
    // An event type no server offers: the start fails, naming what is offered.
    let bad = Watch::spawn(
        ":memory:",
        &["--mcp-http", &url, "--watch", "x=events:nosuch"],
    );
    let out = bad.exited().await;
    assert_eq!(out.code(), Some(1), "{out}");
    w.terminate().await;
    assert!(up.terminate().await.success());
}
