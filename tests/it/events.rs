//! MCP Events (`events/list`, `events/poll`) end to end against real `herald memo`, `herald
//! file` and `herald k8s`, through herald's own client sending the custom requests.

use herald::transport::client::Connection;
use rmcp::model::{ClientRequest, CustomRequest, ErrorData, ServerResult};
use rmcp::service::ServiceError;
use serde_json::{Value, json};

use crate::kube_fake::FakeApi;
use crate::support::*;

const EVENTS_EXTENSION: &str = "io.modelcontextprotocol/events";

/// Sends a custom request and returns its result, or the JSON-RPC error.
pub(crate) async fn request(
    conn: &Connection,
    method: &str,
    params: Value,
) -> Result<Value, ErrorData> {
    let sent = tokio::time::timeout(
        WAIT,
        conn.send_request(ClientRequest::CustomRequest(CustomRequest::new(
            method.to_owned(),
            Some(params),
        ))),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} answered in time"));
    match sent {
        Ok(ServerResult::CustomResult(r)) => Ok(r.0),
        // rmcp decodes a result of only `resultType` and `_meta` (an unsubscribe's) as a task
        // acknowledgment; its fields are all there.
        Ok(other @ ServerResult::TaskAckResult(_)) => Ok(serde_json::to_value(other).unwrap()),
        Ok(other) => panic!("{method}: unexpected result {other:?}"),
        Err(ServiceError::McpError(e)) => Err(e),
        Err(e) => panic!("{method}: {e}"),
    }
}

async fn poll(conn: &Connection, params: Value) -> Value {
    request(conn, "events/poll", params.clone())
        .await
        .unwrap_or_else(|e| panic!("events/poll {params}: {e:?}"))
}

async fn poll_err(conn: &Connection, params: Value) -> ErrorData {
    match request(conn, "events/poll", params.clone()).await {
        Ok(v) => panic!("events/poll {params} should fail, got {v}"),
        Err(e) => e,
    }
}

fn advertises_events(conn: &Connection) -> bool {
    let info = conn.peer_info().expect("handshake done");
    let caps = serde_json::to_value(&info.capabilities).unwrap();
    caps["extensions"][EVENTS_EXTENSION].is_object()
}

fn seqs(result: &Value) -> Vec<u64> {
    result["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"]["seq"].as_u64().unwrap())
        .collect()
}

async fn memo_events(via: Via) {
    let memo = Memo::start(via).await;
    let conn = memo.client().await;
    assert!(advertises_events(&conn), "the handshake advertises events");

    let list = request(&conn, "events/list", json!({})).await.unwrap();
    assert_eq!(list["resultType"], "complete");
    let types = list["events"].as_array().unwrap();
    assert_eq!(types.len(), 1);
    assert_eq!(types[0]["name"], "memo.changed");
    assert_eq!(types[0]["delivery"], json!(["poll", "push"]));
    assert_eq!(types[0]["inputSchema"]["type"], "object");
    assert_eq!(types[0]["inputSchema"]["additionalProperties"], false);
    assert!(
        types[0]["description"]
            .as_str()
            .unwrap()
            .contains("memo://log")
    );

    // A null cursor starts from now: nothing, and a cursor.
    call(&conn, "memo_set", json!({"key": "before", "value": 0})).await;
    let start = poll(&conn, json!({"name": "memo.changed", "cursor": null})).await;
    assert_eq!(start["resultType"], "complete");
    assert_eq!(start["events"], json!([]));
    assert_eq!(start["hasMore"], false);
    assert_eq!(start["truncated"], false);
    let cursor = start["cursor"]
        .as_str()
        .expect("a cursor string")
        .to_owned();

    call(&conn, "memo_set", json!({"key": "a", "value": 1})).await;
    call(&conn, "memo_set", json!({"key": "a", "value": 2})).await;
    let both = poll(&conn, json!({"name": "memo.changed", "cursor": cursor})).await;
    let events = both["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{both}");
    assert_eq!(events[0]["name"], "memo.changed");
    assert_eq!(events[0]["data"]["type"], "ADDED");
    assert_eq!(events[1]["data"]["type"], "MODIFIED");
    assert_eq!(events[1]["data"]["old"], 1);
    assert_ne!(events[0]["eventId"], events[1]["eventId"]);
    assert!(events[0]["timestamp"].as_str().unwrap().ends_with('Z'));
    let s = seqs(&both);
    assert!(s[0] < s[1], "in order");
    assert_eq!(both["hasMore"], false);
    assert_eq!(both["truncated"], false);
    assert_eq!(both["cursor"], s[1].to_string());
    assert_eq!(
        poll(
            &conn,
            json!({"name": "memo.changed", "cursor": both["cursor"]})
        )
        .await["events"],
        json!([]),
        "nothing new after the returned cursor"
    );

    // maxEvents 1: the first with hasMore, then the second.
    let one = poll(
        &conn,
        json!({"name": "memo.changed", "cursor": cursor, "maxEvents": 1}),
    )
    .await;
    assert_eq!(seqs(&one), [s[0]]);
    assert_eq!(one["hasMore"], true);
    assert_eq!(one["nextPollMs"], 0);
    let two = poll(
        &conn,
        json!({"name": "memo.changed", "cursor": one["cursor"], "maxEvents": 1}),
    )
    .await;
    assert_eq!(seqs(&two), [s[1]]);
    assert_eq!(two["hasMore"], false);

    // A long poll answers when the change comes (both on one connection: over stdio a
    // second client would be a second server).
    let long = json!({"name": "memo.changed", "cursor": two["cursor"], "timeoutMs": 20_000});
    let (deleted, ()) = tokio::join!(
        poll(&conn, long),
        call(&conn, "memo_delete", json!({"key": "a"}))
    );
    assert_eq!(deleted["events"][0]["data"]["type"], "DELETED", "{deleted}");

    // Refusals.
    let e = poll_err(
        &conn,
        json!({"name": "memo.changed", "arguments": {"key": "a"}}),
    )
    .await;
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("unknown argument key"), "{}", e.message);
    let e = poll_err(&conn, json!({"name": "memo.changed", "since": "1"})).await;
    assert_eq!(e.code.0, -32602);
    assert!(
        e.message.contains("unknown parameter since"),
        "{}",
        e.message
    );
    let e = poll_err(&conn, json!({"name": "memo.changed", "cursor": "c-17"})).await;
    assert_eq!(e.code.0, -32602);
    assert!(e.message.contains("foreign cursor"), "{}", e.message);
    let e = poll_err(&conn, json!({"name": "memo.changed", "maxEvents": 0})).await;
    assert_eq!(e.code.0, -32602);
    let e = poll_err(&conn, json!({"name": "email.received"})).await;
    assert_eq!(e.code.0, -32023);
    assert_eq!(e.data, Some(json!({"kind": "event"})));
    assert!(e.message.contains("events/list"), "{}", e.message);
    conn.close().await;
}

#[tokio::test]
async fn memo_events_are_polled_over_http() {
    memo_events(Via::Http).await;
}

#[tokio::test]
async fn memo_events_are_polled_over_stdio() {
    memo_events(Via::Stdio).await;
}

#[tokio::test]
async fn a_file_change_is_polled() {
    let dir = TempDir::new("events-file");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let server = Server::spawn(&[
        "--store",
        ":memory:",
        "file",
        "--root",
        root.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let memo = Memo {
        target: herald::transport::target::Target::Http(server.http_url()),
        trust: Default::default(),
        server: None,
    };
    let conn = memo.client().await;
    assert!(advertises_events(&conn));
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    assert_eq!(list["events"][0]["name"], "file.changed");
    assert_eq!(
        list["events"][0]["inputSchema"]["required"],
        json!(["path"])
    );

    let args = json!({"path": root.to_str().unwrap(), "glob": "*.txt"});
    // The first poll starts the watch and holds it, so the next poll sees what came after.
    let start = poll(
        &conn,
        json!({"name": "file.changed", "arguments": args, "cursor": null}),
    )
    .await;
    assert_eq!(start["events"], json!([]));
    std::fs::write(root.join("skip.json"), "{}").unwrap();
    std::fs::write(root.join("a.txt"), "hello").unwrap();
    let got = poll(
        &conn,
        json!({"name": "file.changed", "arguments": args, "cursor": start["cursor"],
               "timeoutMs": 20_000}),
    )
    .await;
    let events = got["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{got}");
    assert_eq!(events[0]["data"]["type"], "CREATED");
    assert_eq!(
        events[0]["data"]["path"],
        root.join("a.txt").to_str().unwrap()
    );
    assert!(
        events[0]["eventId"]
            .as_str()
            .unwrap()
            .starts_with("file-events://watch/")
    );

    let e = poll_err(
        &conn,
        json!({"name": "file.changed", "arguments": {"path": "/", "depth": 1}}),
    )
    .await;
    assert_eq!(e.code.0, -32602);
    assert!(
        e.message.contains("unknown argument depth"),
        "{}",
        e.message
    );
    let e = poll_err(
        &conn,
        json!({"name": "file.changed", "arguments": {"path": "/etc"}}),
    )
    .await;
    assert_eq!(e.code.0, -32602, "outside the roots: {}", e.message);
    conn.close().await;
}

#[tokio::test]
async fn a_kcp_change_is_polled() {
    let api = FakeApi::start().await;
    let dir = TempDir::new("events-k8s");
    let kc = api.kubeconfig(dir.path());
    let server = Server::spawn(&[
        "--store",
        ":memory:",
        "k8s",
        "--http",
        "127.0.0.1:0",
        "--kubeconfig",
        kc.to_str().unwrap(),
    ])
    .await;
    let memo = Memo {
        target: herald::transport::target::Target::Http(server.http_url()),
        trust: Default::default(),
        server: None,
    };
    let conn = memo.client().await;
    assert!(advertises_events(&conn));
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    let names: Vec<&str> = list["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["k8s.changed", "kcp.changed"]);

    api.put("root:app", "default", "seeded", json!({"a": "1"}));
    let args = json!({"workspace": "root:app", "resource": "configmaps", "namespace": "*"});
    let start = poll(
        &conn,
        json!({"name": "kcp.changed", "arguments": args, "cursor": null}),
    )
    .await;
    assert_eq!(start["events"], json!([]), "the seed is not an event");
    api.wait("a watch", |a| a.watches() == 1).await;
    api.put("root:app", "default", "cm1", json!({"a": "1"}));
    let got = poll(
        &conn,
        json!({"name": "kcp.changed", "arguments": args, "cursor": start["cursor"],
               "timeoutMs": 20_000}),
    )
    .await;
    let events = got["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{got}");
    assert_eq!(events[0]["data"]["type"], "ADDED");
    assert_eq!(events[0]["data"]["object"]["metadata"]["name"], "cm1");

    let e = poll_err(
        &conn,
        json!({"name": "kcp.changed", "arguments": {"workspace": "root:app", "resource": "configmaps", "context": "x"}}),
    )
    .await;
    assert_eq!(e.code.0, -32602);
    assert!(
        e.message.contains("unknown argument context"),
        "{}",
        e.message
    );
    conn.close().await;
}
