//! `events/stream` (MCP Events push delivery) end to end: against a real `herald memo` over
//! stdio, HTTP and QUIC, and through `herald up`'s gateway, by herald's own client with a tap
//! that sees the stream's notifications in wire order.

use std::sync::Arc;
use std::time::Duration;

use herald::transport::client::{Connection, Tap, client_config, connect_tapped};
use rmcp::model::{ClientRequest, CustomRequest, ServerJsonRpcMessage};
use rmcp::service::{RequestHandle, RoleClient, RxJsonRpcMessage};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::*;

/// Every `notifications/events/*` a server sends, as JSON, in wire order.
struct EventsTap(mpsc::UnboundedSender<Value>);

impl Tap for EventsTap {
    fn seen(&self, message: &RxJsonRpcMessage<RoleClient>) {
        if let ServerJsonRpcMessage::Notification(_) = message {
            let v = serde_json::to_value(message).unwrap();
            if v["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("notifications/events/"))
            {
                let _ = self.0.send(v);
            }
        }
    }
}

/// A connection whose stream notifications come out of the receiver.
async fn tapped(memo: &Memo) -> (Connection, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let conn = tokio::time::timeout(
        WAIT,
        connect_tapped(
            &memo.target,
            &memo.trust,
            client_config(),
            4 << 20,
            WAIT,
            Some(Arc::new(EventsTap(tx))),
        ),
    )
    .await
    .unwrap()
    .expect("connect");
    (conn, rx)
}

async fn open(conn: &Connection, params: Value) -> RequestHandle<RoleClient> {
    tokio::time::timeout(
        WAIT,
        conn.send_cancellable_request(
            ClientRequest::CustomRequest(CustomRequest::new("events/stream", Some(params))),
            Default::default(),
        ),
    )
    .await
    .expect("the request is sent in time")
    .expect("the request is sent")
}

async fn cancel(stream: RequestHandle<RoleClient>) {
    tokio::time::timeout(WAIT, stream.cancel(None))
        .await
        .expect("the cancel is sent in time")
        .unwrap();
}

/// The next message of subscription `id` (heartbeats skipped unless asked for; other
/// subscriptions' messages dropped).
async fn next(rx: &mut mpsc::UnboundedReceiver<Value>, id: &Value, beats: bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("a stream message in time")
            .expect("the connection is open");
        if &v["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] != id {
            continue;
        }
        if !beats && v["method"] == "notifications/events/heartbeat" {
            continue;
        }
        return v;
    }
}

fn id_of(handle: &RequestHandle<RoleClient>) -> Value {
    serde_json::to_value(&handle.id).unwrap()
}

async fn streams_over(via: Via) {
    let memo = Memo::start(via).await;
    let (conn, mut rx) = tapped(&memo).await;
    let list = crate::events::request(&conn, "events/list", json!({}))
        .await
        .unwrap();
    assert_eq!(list["events"][0]["delivery"], json!(["poll", "push"]));

    let stream = open(&conn, json!({"name": "memo.changed"})).await;
    let id = id_of(&stream);
    let active = next(&mut rx, &id, false).await;
    assert_eq!(active["method"], "notifications/events/active", "{active}");
    assert_eq!(active["params"]["truncated"], false);
    for key in ["a", "b", "c"] {
        call(&conn, "memo_set", json!({"key": key, "value": "v"})).await;
    }
    let mut cursors = Vec::new();
    for key in ["a", "b", "c"] {
        let e = next(&mut rx, &id, false).await;
        assert_eq!(e["method"], "notifications/events/event", "{e}");
        assert_eq!(e["params"]["name"], "memo.changed");
        assert_eq!(e["params"]["data"]["key"], key);
        assert!(
            e["params"]["eventId"]
                .as_str()
                .unwrap()
                .starts_with("memo://log#")
        );
        cursors.push(e["params"]["cursor"].as_str().unwrap().to_owned());
    }

    // A second stream from the first event's cursor replays the two after it.
    let replay = open(&conn, json!({"name": "memo.changed", "cursor": cursors[0]})).await;
    let rid = id_of(&replay);
    assert_ne!(rid, id);
    let active = next(&mut rx, &rid, false).await;
    assert_eq!(active["params"]["cursor"], cursors[0].as_str());
    for key in ["b", "c"] {
        let e = next(&mut rx, &rid, false).await;
        assert_eq!(e["params"]["data"]["key"], key, "{e}");
    }
    // Both streams are open beside a call (neither holds the connection).
    call(&conn, "memo_set", json!({"key": "d", "value": "v"})).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        let e = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        if e["method"] == "notifications/events/event" {
            assert_eq!(e["params"]["data"]["key"], "d", "{e}");
            got.push(e["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"].clone());
        }
    }
    got.sort_by_key(Value::to_string);
    let mut both = vec![id.clone(), rid.clone()];
    both.sort_by_key(Value::to_string);
    assert_eq!(got, both, "each stream got the change once");
    cancel(replay).await;
    cancel(stream).await;
    // Cancelled streams write nothing more: a fresh one sees the next change alone.
    let third = open(&conn, json!({"name": "memo.changed"})).await;
    let tid = id_of(&third);
    next(&mut rx, &tid, false).await;
    call(&conn, "memo_set", json!({"key": "e", "value": "v"})).await;
    let e = next(&mut rx, &tid, false).await;
    assert_eq!(e["params"]["data"]["key"], "e");
    while let Ok(v) = rx.try_recv() {
        let sub = &v["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"];
        assert!(sub != &id && sub != &rid, "a cancelled stream wrote {v}");
    }
}

#[tokio::test]
async fn events_stream_over_stdio() {
    streams_over(Via::Stdio).await;
}

#[tokio::test]
async fn events_stream_over_http() {
    streams_over(Via::Http).await;
}

#[tokio::test]
async fn events_stream_over_quic() {
    streams_over(Via::Quic).await;
}

/// Streams have a budget of their own: past `--max-event-streams` one is refused with
/// -32025, and while 150 are open (more than the 129 requests a connection with one listen
/// stream may have in flight) calls and a listen still go through.
#[tokio::test]
async fn streams_take_no_place_among_requests_and_have_their_own_cap() {
    let memo = Memo::start_with(
        Via::Quic,
        &["--max-event-streams", "150", "--max-listen-streams", "1"],
    )
    .await;
    let (conn, mut rx) = tapped(&memo).await;
    let mut open_streams = Vec::new();
    for _ in 0..150 {
        let s = open(&conn, json!({"name": "memo.changed"})).await;
        let id = id_of(&s);
        let active = next(&mut rx, &id, false).await;
        assert_eq!(active["method"], "notifications/events/active");
        open_streams.push(s);
    }
    call(&conn, "memo_set", json!({"key": "a", "value": "v"})).await;
    let refused = open(&conn, json!({"name": "memo.changed"})).await;
    match tokio::time::timeout(WAIT, refused.await_response())
        .await
        .unwrap()
    {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code.0, -32025, "{e:?}");
            assert!(e.message.contains("--max-event-streams"), "{e:?}");
        }
        other => panic!("the 151st stream should be refused, got {other:?}"),
    }
    let last = open_streams.pop().unwrap();
    cancel(last).await;
    // Its place is free again (the server hears the cancel after it was sent).
    let mut again = None;
    for _ in 0..500 {
        let s = open(&conn, json!({"name": "memo.changed"})).await;
        let id = id_of(&s);
        tokio::select! {
            r = s.rx => {
                assert!(matches!(r, Ok(Err(_))), "refused while the cancel is on its way");
                tokio::task::yield_now().await;
            }
            v = next(&mut rx, &id, false) => {
                assert_eq!(v["method"], "notifications/events/active");
                again = Some(());
                break;
            }
        }
    }
    assert!(again.is_some(), "a cancelled stream frees its place");
}

/// Through `herald up`'s gateway: the slug-prefixed event type streams from the memo role.
#[tokio::test]
async fn events_stream_through_the_gateway() {
    let demo = TempDir::new("stream-up");
    let (up, memo) = up_demo_http(&demo, &[], &[]).await;
    let (conn, mut rx) = tapped(&memo).await;
    let stream = open(&conn, json!({"name": "memo__memo.changed"})).await;
    let id = id_of(&stream);
    let active = next(&mut rx, &id, false).await;
    assert_eq!(active["method"], "notifications/events/active");
    call(&conn, "memo__memo_set", json!({"key": "k", "value": "v"})).await;
    let e = next(&mut rx, &id, false).await;
    assert_eq!(e["params"]["name"], "memo__memo.changed");
    assert_eq!(e["params"]["data"]["key"], "k");
    assert!(e["params"]["cursor"].is_string(), "{e}");
    let unknown = open(&conn, json!({"name": "nosuch__x"})).await;
    match tokio::time::timeout(WAIT, unknown.await_response())
        .await
        .unwrap()
    {
        // A caller entitled to every slug (herald up on loopback) is told there is none so
        // named, and which there are.
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code.0, -32602, "{e:?}");
            assert!(
                e.message.contains("no server named nosuch; servers: "),
                "{e:?}"
            );
        }
        other => panic!("an unknown slug is refused, got {other:?}"),
    }
    cancel(stream).await;
    let _ = Duration::ZERO;
    assert!(up.terminate().await.success());
}

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{metrics}"))
}

/// Waits until the gateway at `metrics_url` counts `n` joined polls.
async fn joined(metrics_url: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = reqwest::get(metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if counter(&m, "herald_gateway_event_polls_joined_total") >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} polls joined in time:\n{m}"
        );
        tokio::task::yield_now().await;
    }
}

/// Twenty streams of one event type through the gateway share one upstream subscription:
/// an event reaches every stream, and the slug is followed once for all of them (one feed,
/// no upstream poll).
#[tokio::test]
async fn streams_through_the_gateway_share_one_upstream_subscription() {
    let demo = TempDir::new("stream-share");
    let (up, memo) = up_demo_http(&demo, &[], &[]).await;
    let metrics_url = up.http_url().replace("/mcp", "/metrics");
    let metrics = || async {
        reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let before = metrics().await;
    let (conn, mut rx) = tapped(&memo).await;
    let mut streams = Vec::new();
    for _ in 0..20 {
        let s = open(&conn, json!({"name": "memo__memo.changed"})).await;
        let id = id_of(&s);
        next(&mut rx, &id, false).await;
        streams.push((s, id));
    }
    for (n, key) in ["k", "k2"].into_iter().enumerate() {
        call(&conn, "memo__memo_set", json!({"key": key, "value": "v"})).await;
        let mut got = std::collections::HashSet::new();
        while got.len() < streams.len() {
            let v = tokio::time::timeout(WAIT, rx.recv())
                .await
                .unwrap()
                .unwrap();
            if v["method"] == "notifications/events/event" {
                assert_eq!(v["params"]["data"]["key"], key, "event {n}: {v}");
                assert!(v["params"]["cursor"].is_string(), "{v}");
                got.insert(
                    v["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"].to_string(),
                );
            }
        }
    }
    let after = metrics().await;
    assert_eq!(counter(&after, "herald_gateway_event_feeds"), 1, "{after}");
    assert_eq!(
        counter(&after, "herald_gateway_event_polls_upstream_total"),
        counter(&before, "herald_gateway_event_polls_upstream_total"),
        "no upstream poll: the feed answers every stream"
    );
}

/// Long polls the gateway's feed cannot answer (a replay bounded by `maxAgeMs`) share one
/// upstream long poll per cursor: five at once make one upstream call, four join it.
#[tokio::test]
async fn long_polls_the_feed_cannot_answer_share_one_upstream_poll() {
    let demo = TempDir::new("poll-share");
    let (up, memo) = up_demo_http(&demo, &[], &[]).await;
    let metrics_url = up.http_url().replace("/mcp", "/metrics");
    let conn = memo.client().await;
    let start = crate::events::request(&conn, "events/poll", json!({"name": "memo__memo.changed"}))
        .await
        .unwrap();
    let before = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let polls: Vec<_> = (0..5)
        .map(|_| {
            let conn = &conn;
            let cursor = start["cursor"].clone();
            async move {
                crate::events::request(
                    conn,
                    "events/poll",
                    json!({"name": "memo__memo.changed", "cursor": cursor,
                           "maxAgeMs": 60000, "timeoutMs": 20000}),
                )
                .await
                .unwrap()
            }
        })
        .collect();
    let all = futures::future::join_all(polls);
    let set = async {
        joined(
            &metrics_url,
            counter(&before, "herald_gateway_event_polls_joined_total") + 4,
        )
        .await;
        call(&conn, "memo__memo_set", json!({"key": "m", "value": 1})).await;
    };
    let (answers, ()) = tokio::join!(all, set);
    for a in &answers {
        assert_eq!(a["events"][0]["data"]["key"], "m", "{a}");
    }
    let after = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        counter(&after, "herald_gateway_event_polls_upstream_total")
            - counter(&before, "herald_gateway_event_polls_upstream_total"),
        1
    );
}

/// rmcp's decode trap (rust-sdk #1197): an extension result is read into one of rmcp's own
/// shapes when it fits one. What the gateway receives from a slug as a client and passes on
/// keeps every field: a poll result through `herald up` has the slug's cursor, truncated,
/// hasMore, nextPollMs and each event whole (its `_meta` too).
#[tokio::test]
async fn an_events_result_through_the_gateway_keeps_every_field() {
    let demo = TempDir::new("stream-trap");
    let (_up, memo) = up_demo_http(&demo, &[], &[]).await;
    let conn = memo.client().await;
    let start = crate::events::request(&conn, "events/poll", json!({"name": "memo__memo.changed"}))
        .await
        .unwrap();
    call(&conn, "memo__memo_set", json!({"key": "t", "value": 1})).await;
    let r = crate::events::request(
        &conn,
        "events/poll",
        json!({"name": "memo__memo.changed", "cursor": start["cursor"], "timeoutMs": 20000}),
    )
    .await
    .unwrap();
    for key in [
        "cursor",
        "truncated",
        "hasMore",
        "nextPollMs",
        "resultType",
        "_meta",
    ] {
        assert!(r.get(key).is_some(), "{key} kept: {r}");
    }
    let e = &r["events"][0];
    for key in ["eventId", "name", "timestamp", "data", "_meta"] {
        assert!(e.get(key).is_some(), "the event's {key} kept: {e}");
    }
    assert_eq!(e["_meta"]["io.herald/cursor"], r["cursor"]);
    assert_eq!(e["data"]["key"], "t");
}
