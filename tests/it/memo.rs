//! The memo source end to end over stdio, HTTP and QUIC, through herald's own client connector.

use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::SubscriptionEnd;
use serde_json::json;

use crate::support::*;

/// Waits for the next `notifications/resources/updated` on `sub` and returns its URI.
pub(crate) async fn next_updated(sub: &mut rmcp::service::Subscription) -> String {
    let n = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a notification in time")
        .expect("subscription healthy")
        .expect("subscription still open");
    match n {
        ServerNotification::ResourceUpdatedNotification(u) => u.params.uri,
        other => panic!("unexpected notification {other:?}"),
    }
}

async fn listen_set_notify_read(via: Via) {
    let memo = Memo::start(via).await;
    let conn = memo.client().await;
    assert!(conn.is_modern(), "herald speaks 2026-07-28");
    let mut sub = conn
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://notes")
                .resource_subscription("memo://log")
                .build(),
        )
        .await
        .expect("listen");
    assert_eq!(
        sub.acknowledged().resource_subscriptions.as_deref(),
        Some(&["memo://notes".to_string(), "memo://log".to_string()][..])
    );

    call(
        &conn,
        "memo_set",
        json!({"key": "bid-1", "value": {"phase": "Deciding"}}),
    )
    .await;
    // rmcp's Subscription checks that each notification carries this listen's subscriptionId.
    let mut got = vec![next_updated(&mut sub).await, next_updated(&mut sub).await];
    got.sort();
    assert_eq!(got, ["memo://log", "memo://notes"]);
    let (notes, mime) = read_json(&conn, "memo://notes").await;
    assert_eq!(mime, "application/json");
    assert_eq!(notes, json!({"bid-1": {"phase": "Deciding"}}));

    call(
        &conn,
        "memo_set",
        json!({"key": "bid-1", "value": {"phase": "Published"}}),
    )
    .await;
    let mut got = vec![next_updated(&mut sub).await, next_updated(&mut sub).await];
    got.sort();
    assert_eq!(got, ["memo://log", "memo://notes"]);
    let (log, mime) = read_json(&conn, "memo://log").await;
    assert_eq!(mime, "application/vnd.asyncai.events+json");
    let events = log["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[1]["type"], "MODIFIED");
    assert_eq!(events[1]["old"], json!({"phase": "Deciding"}));
    assert_eq!(events[1]["object"], json!({"phase": "Published"}));
    assert!(events[0]["seq"].as_u64().unwrap() < events[1]["seq"].as_u64().unwrap());
    sub.cancel().await.unwrap();
    conn.close().await;
}

#[tokio::test]
async fn listen_set_notify_read_over_stdio() {
    listen_set_notify_read(Via::Stdio).await;
}

#[tokio::test]
async fn listen_set_notify_read_over_http() {
    listen_set_notify_read(Via::Http).await;
}

#[tokio::test]
async fn listen_set_notify_read_over_quic() {
    listen_set_notify_read(Via::Quic).await;
}

async fn two_clients_each_get_their_own(via: Via) {
    let memo = Memo::start(via).await;
    let a = memo.client().await;
    let b = memo.client().await;
    let filter = SubscriptionFilter::builder()
        .resource_subscription("memo://notes")
        .build();
    let mut sa = a.listen(filter.clone()).await.unwrap();
    let mut sb = b.listen(filter).await.unwrap();
    call(&a, "memo_set", json!({"key": "k", "value": 1})).await;
    assert_eq!(next_updated(&mut sa).await, "memo://notes");
    assert_eq!(next_updated(&mut sb).await, "memo://notes");
    call(&b, "memo_delete", json!({"key": "k"})).await;
    assert_eq!(next_updated(&mut sa).await, "memo://notes");
    assert_eq!(next_updated(&mut sb).await, "memo://notes");
}

#[tokio::test]
async fn two_clients_each_get_their_own_over_http() {
    two_clients_each_get_their_own(Via::Http).await;
}

#[tokio::test]
async fn two_clients_each_get_their_own_over_quic() {
    two_clients_each_get_their_own(Via::Quic).await;
}

#[tokio::test]
async fn notes_survive_a_restart_and_a_second_process_is_refused() {
    let dir = TempDir::new("restart");
    let store = dir.path().join("herald.redb");
    let store = store.to_str().unwrap();
    let first = Server::spawn(&["--store", store, "memo", "--http", "127.0.0.1:0"]).await;
    let memo = Memo {
        target: herald::transport::target::Target::Http(first.http_url()),
        trust: Default::default(),
        server: None,
    };
    let conn = memo.client().await;
    call(&conn, "memo_set", json!({"key": "owner", "value": "ana"})).await;
    conn.close().await;

    // A second herald on the same store fails with an error naming the file and its holder.
    let out = herald(["--store", store, "memo", "--http", "127.0.0.1:0"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let holder = format!("held by herald process {}", first.pid());
    assert!(err.contains(store) && err.contains(&holder), "{err}");

    assert!(first.stderr().contains("\"event\":\"listening\""));
    assert!(first.terminate().await.success());
    let second = Server::spawn(&["--store", store, "memo", "--http", "127.0.0.1:0"]).await;
    let memo = Memo {
        target: herald::transport::target::Target::Http(second.http_url()),
        trust: Default::default(),
        server: None,
    };
    let conn = memo.client().await;
    assert_eq!(
        read_json(&conn, "memo://notes").await.0,
        json!({"owner": "ana"})
    );
}

#[tokio::test]
async fn shutdown_ends_listens_gracefully() {
    let memo = Memo::start(Via::Quic).await;
    let conn = memo.client().await;
    let mut sub = conn
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://log")
                .build(),
        )
        .await
        .unwrap();
    let server = memo.server.unwrap();
    let pid = server.pid();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let end = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("stream ends in time");
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert!(
        matches!(sub.end(), Some(SubscriptionEnd::Graceful(_))),
        "a shutdown sends the complete result: {:?}",
        sub.end()
    );
}

#[tokio::test]
async fn unknown_uri_is_invalid_params_with_the_uri() {
    for via in [Via::Stdio, Via::Http] {
        let memo = Memo::start(via).await;
        let conn = memo.client().await;
        let err = conn
            .read_resource(rmcp::model::ReadResourceRequestParams::new("memo://nope"))
            .await
            .unwrap_err();
        let rmcp::ServiceError::McpError(e) = err else {
            panic!("expected a JSON-RPC error, got {err:?}")
        };
        assert_eq!(e.code.0, -32602, "{via:?}");
        assert_eq!(e.data.unwrap()["uri"], "memo://nope");
    }
}

#[tokio::test]
async fn quic_client_with_the_wrong_pin_is_refused() {
    let memo = Memo::start(Via::Quic).await;
    let trust = herald::transport::tls::ClientTrust {
        ca: None,
        pin: Some("00".repeat(32)),
        token: None,
        oauth: None,
    };
    let res = herald::transport::client::connect(
        &memo.target,
        &trust,
        herald::transport::client::client_config(),
        1 << 20,
    )
    .await;
    let err = res.err().expect("a wrong pin must not connect").to_string();
    assert!(
        err.contains("tls-pin") || err.contains("certificate"),
        "{err}"
    );
    // The right pin still works.
    let conn = memo.client().await;
    read_json(&conn, "memo://notes").await;
}

#[tokio::test]
async fn listen_limits_are_refused_before_acknowledgment() {
    for via in [Via::Stdio, Via::Http, Via::Quic] {
        let memo = Memo::start_with(
            via,
            &["--max-listen-streams", "2", "--max-listen-uris", "3"],
        )
        .await;
        let conn = memo.client().await;
        let many = SubscriptionFilter::builder()
            .resource_subscriptions((0..4).map(|i| format!("memo://x{i}")))
            .build();
        let err = conn.listen(many).await.expect_err("4 URIs > 3");
        assert!(err.to_string().contains("at most 3"), "{via:?}: {err}");
        let one = SubscriptionFilter::builder()
            .resource_subscription("memo://notes")
            .build();
        let _a = conn.listen(one.clone()).await.unwrap();
        let _b = conn.listen(one.clone()).await.unwrap();
        let err = conn
            .listen(one.clone())
            .await
            .map(|_| ())
            .expect_err(&format!("{via:?}: third stream"));
        assert!(
            err.to_string().contains("2 open listen streams"),
            "{via:?}: {err}"
        );
        drop(_a);
        // The slot is released when the stream ends; the server sees the cancel shortly.
        let mut reopened = None;
        for _ in 0..200 {
            match conn.listen(one.clone()).await {
                Ok(s) => {
                    reopened = Some(s);
                    break;
                }
                Err(_) => tokio::task::yield_now().await,
            }
        }
        assert!(
            reopened.is_some(),
            "{via:?}: a cancelled stream frees its slot"
        );
    }
}

#[tokio::test]
async fn herald_up_serves_the_demo_with_no_config() {
    let demo = TempDir::new("up-demo");
    let up = Server::spawn(&[
        "--store",
        ":memory:",
        "up",
        "--http",
        "127.0.0.1:0",
        "--quic",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--demo-dir",
        demo.path().join("herald-demo").to_str().unwrap(),
    ])
    .await;
    for (target, trust) in [
        (
            herald::transport::target::Target::Http(up.http_url()),
            Default::default(),
        ),
        (
            herald::transport::target::Target::Quic(up.quic_addr()),
            herald::transport::tls::ClientTrust {
                ca: None,
                pin: Some(up.fingerprint()),
                token: None,
                oauth: None,
            },
        ),
    ] {
        let memo = Memo {
            target,
            trust,
            server: None,
        };
        let conn = memo.client().await;
        call(
            &conn,
            "memo__memo_set",
            json!({"key": "todo", "value": "buy milk"}),
        )
        .await;
        assert_eq!(read_json(&conn, "memo://notes").await.0["todo"], "buy milk");
    }
    let log = up.stderr.clone();
    let status = up.terminate().await;
    assert!(
        status.success(),
        "{status}; stderr:\n{}",
        log.lock().unwrap()
    );
}

/// `--max-notes-bytes` over stdio (raw lines) and HTTP (herald's client): a `memo_set` that
/// would take the notes past it is refused with an error naming the limit, the notes' total
/// and the flag, and nothing changes; one whose value does not fit in a message is refused by
/// the transport, naming that limit; serving goes on.
#[tokio::test]
async fn a_set_past_max_notes_bytes_is_refused_and_loses_nothing() {
    let mut raw =
        crate::wire::Raw::spawn(&["--max-notes-bytes", "300", "--max-message-bytes", "2000"]);
    // Key "a" and the value's 202 bytes of JSON: 203 of the 300.
    raw.memo_set(1, "a", json!("x".repeat(200))).await;
    let ok = raw.recv().await;
    assert_eq!(ok["result"]["structuredContent"]["changed"], true, "{ok}");
    raw.memo_set(2, "b", json!("y".repeat(100))).await;
    let e = raw.recv().await;
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(2), json!(-32602)),
        "{e}"
    );
    let message = e["error"]["message"].as_str().unwrap();
    for needle in [
        "would take 306 bytes",
        "300-byte limit",
        "--max-notes-bytes",
        "they take 203 bytes now",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    raw.memo_set(3, "c", json!("z".repeat(3000))).await;
    let e = raw.recv().await;
    assert_eq!(e["error"]["code"], -32600, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("2000-byte limit") && message.contains("--max-message-bytes"),
        "{message}"
    );
    raw.send(json!({"jsonrpc":"2.0","id":4,"method":"resources/read",
        "params":{"_meta":meta(),"uri":"memo://notes"}}))
        .await;
    let read = raw.recv().await;
    let text = read["result"]["contents"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(text).unwrap(),
        json!({"a": "x".repeat(200)}),
        "the refused sets left the notes as they were"
    );
    // Within the limit, a set is taken.
    raw.memo_set(5, "b", json!("y".repeat(90))).await;
    assert_eq!(
        raw.recv().await["result"]["structuredContent"]["changed"],
        true
    );

    let memo = Memo::start_with(Via::Http, &["--max-notes-bytes", "300"]).await;
    let conn = memo.client().await;
    call(
        &conn,
        "memo_set",
        json!({"key": "a", "value": "x".repeat(200)}),
    )
    .await;
    let err = conn
        .call_tool(
            rmcp::model::CallToolRequestParams::new("memo_set")
                .with_arguments(args(json!({"key": "b", "value": "y".repeat(100)}))),
        )
        .await
        .unwrap_err();
    let rmcp::ServiceError::McpError(e) = err else {
        panic!("expected a JSON-RPC error, got {err:?}")
    };
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("--max-notes-bytes"), "{}", e.message);
    assert_eq!(
        read_json(&conn, "memo://notes").await.0,
        json!({"a": "x".repeat(200)})
    );
}
