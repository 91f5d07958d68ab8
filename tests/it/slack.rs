//! `herald slack` end to end: the real binary against the fake Slack (`slack_fake`), which
//! speaks the Web API over HTTP and Socket Mode over a real WebSocket.

use std::collections::BTreeSet;

use herald::transport::client::{Connection, client_config, connect};

use herald::transport::target::Target;
use herald::transport::tls::{ClientTrust, Secret};
use rmcp::model::{CallToolRequestParams, ServerNotification, SubscriptionFilter};
use serde_json::{Value, json};
use sha2::Digest;

use crate::events::request;
use crate::slack_fake::{APP_TOKEN, BOT_TOKEN, FakeSlack, Kind, Sub, TEAM_URL};
use crate::support::*;

const KEY: &str = "8f2c6e1d4b7a9035c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4";
const EVENTS: &str = "slack-events://message_posted";

pub(crate) fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("SLACK_APP_TOKEN", APP_TOKEN),
        ("SLACK_BOT_TOKEN", BOT_TOKEN),
        ("SLACK_EVENTS_ENCRYPTION_KEY", KEY),
    ]
}

pub(crate) async fn fake() -> FakeSlack {
    let fake = FakeSlack::start().await;
    fake.add_channel("C1", "general", Kind::Public);
    fake.add_channel("C2", "ops", Kind::Public);
    fake.add_channel("G1", "secret", Kind::Private);
    fake.add_channel("D1", "", Kind::Im("U1".into()));
    fake.add_channel("M1", "", Kind::Mpim(vec!["U1".into(), "U2".into()]));
    fake
}

/// `herald slack` on HTTP against `fake`, with `store` and `extra` flags, configured.
pub(crate) async fn start(fake: &FakeSlack, store: &str, extra: &[&str]) -> Server {
    let url = fake.api_url();
    let mut args = vec!["--store", store, "slack", "--http", "127.0.0.1:0"];
    args.extend(["--slack-api-url", url.as_str()]);
    args.extend(extra);
    Server::spawn_env(&args, &env()).await
}

pub(crate) async fn client(server: &Server) -> Connection {
    tokio::time::timeout(
        WAIT,
        connect(
            &Target::Http(server.http_url()),
            &ClientTrust::default(),
            client_config(),
            4 << 20,
        ),
    )
    .await
    .expect("connect in time")
    .expect("connect")
}

pub(crate) async fn connected(fake: &FakeSlack) {
    fake.wait_until("herald's socket open", |s| s.sockets_open() == 1)
        .await;
}

pub(crate) async fn poll(conn: &Connection, params: Value) -> Value {
    request(conn, "events/poll", params.clone())
        .await
        .unwrap_or_else(|e| panic!("events/poll {params}: {e:?}"))
}

/// The cursor meaning "from now".
pub(crate) async fn now_cursor(conn: &Connection) -> String {
    let r = poll(conn, json!({"name": "message_posted", "cursor": null})).await;
    r["cursor"].as_str().unwrap().to_owned()
}

/// Long-polls from `cursor` with `arguments` until `n` events are in; returns them (their
/// `data`) and the cursor after them.
pub(crate) async fn collect(
    conn: &Connection,
    arguments: Value,
    cursor: &str,
    n: usize,
) -> (Vec<Value>, String) {
    let mut cursor = cursor.to_owned();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while out.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} events came: {out:?}",
            out.len()
        );
        let r = poll(
            conn,
            json!({"name": "message_posted", "arguments": arguments, "cursor": cursor, "timeoutMs": 10_000}),
        )
        .await;
        for e in r["events"].as_array().unwrap() {
            assert_eq!(
                e["eventId"],
                format!(
                    "slack:{}:{}",
                    e["data"]["channel_id"].as_str().unwrap(),
                    e["data"]["ts"].as_str().unwrap()
                )
            );
            out.push(e["data"].clone());
        }
        cursor = r["cursor"].as_str().unwrap().to_owned();
    }
    (out, cursor)
}

/// What a poll from `cursor` returns at once (no waiting).
pub(crate) async fn poll_now(conn: &Connection, arguments: Value, cursor: &str) -> Value {
    poll(
        conn,
        json!({"name": "message_posted", "arguments": arguments, "cursor": cursor}),
    )
    .await
}

pub(crate) async fn status(conn: &Connection) -> Value {
    let r = tokio::time::timeout(
        WAIT,
        conn.call_tool(CallToolRequestParams::new("slack_events_status".to_owned())),
    )
    .await
    .expect("status in time")
    .expect("status");
    r.structured_content.expect("structured status")
}

async fn next_updated(sub: &mut rmcp::service::Subscription) -> String {
    let n = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a notification in time")
        .expect("subscription healthy")
        .expect("subscription open");
    match n {
        ServerNotification::ResourceUpdatedNotification(u) => u.params.uri,
        other => panic!("unexpected notification {other:?}"),
    }
}

pub(crate) fn texts(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["text"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_post_arrives_by_poll_and_by_push_with_every_field() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    assert_eq!(list["events"][0]["name"], "message_posted");
    let cursor = now_cursor(&conn).await;
    let mut sub = conn
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription(EVENTS)
                .build(),
        )
        .await
        .expect("listen");
    assert_eq!(
        sub.acknowledged().resource_subscriptions.as_deref(),
        Some(&[EVENTS.to_owned()][..])
    );
    connected(&fake).await;

    let ts = fake.post("C1", "U1", "hello <@UBOT>, look");
    assert_eq!(next_updated(&mut sub).await, EVENTS, "pushed");
    let (log, mime) = read_json(&conn, EVENTS).await;
    assert_eq!(mime, "application/vnd.asyncai.events+json");
    let read = &log["events"][0];
    assert_eq!(read["type"], "message_posted");
    assert_eq!(read["id"], format!("slack:C1:{ts}"));
    assert_eq!(read["text"], "hello <@UBOT>, look");

    let (got, cursor) = collect(&conn, json!({}), &cursor, 1).await;
    let p = format!("p{}", ts.replace('.', ""));
    assert_eq!(
        got[0],
        json!({
            "channel_id": "C1", "channel_type": "channel", "ts": ts, "user_id": "U1",
            "is_dm": false, "mentions_bot": true,
            "permalink": format!("{TEAM_URL}archives/C1/{p}"),
            "text": "hello <@UBOT>, look"
        })
    );

    let reply = fake.post_reply("C1", &ts, "U2", "a reply");
    let dm = fake.post("D1", "U1", "just to you");
    let by_bot = fake.post_bot("G1", "B9", "ci", "build green");
    let (got, _) = collect(&conn, json!({}), &cursor, 3).await;
    assert_eq!(got[0]["thread_ts"], ts.as_str());
    assert_eq!(got[0]["ts"], reply.as_str());
    assert_eq!(
        got[0]["permalink"],
        format!(
            "{TEAM_URL}archives/C1/p{}?thread_ts={ts}&cid=C1",
            reply.replace('.', "")
        )
    );
    assert_eq!(
        (&got[1]["ts"], &got[1]["is_dm"], &got[1]["channel_type"]),
        (&json!(dm), &json!(true), &json!("im"))
    );
    assert_eq!(got[2]["ts"], by_bot.as_str());
    assert_eq!(got[2]["channel_type"], "group");
    assert_eq!(
        (&got[2]["bot_id"], &got[2]["username"]),
        (&json!("B9"), &json!("ci"))
    );
    assert!(
        got[2].get("user_id").is_none(),
        "a bot post has no user_id: {}",
        got[2]
    );
    fake.wait_until("every envelope acked", |s| s.acks().len() == 4)
        .await;
    assert_eq!(fake.envelopes().len(), 4);
}

#[tokio::test]
async fn each_argument_narrows_and_unknown_ones_are_refused() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    let mut ops = conn
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription(format!("{EVENTS}?channel_ids=C2&include_bot_authors=false"))
                .build(),
        )
        .await
        .expect("listen");
    connected(&fake).await;
    let top = fake.post("C1", "U1", "top");
    fake.post_reply("C1", &top, "U2", "reply");
    fake.post("D1", "U1", "dm");
    fake.post("C2", "U1", "mention <@UBOT>");
    fake.post_bot("C2", "B9", "ci", "bot");
    let (all, _) = collect(&conn, json!({}), &cursor, 5).await;
    assert_eq!(
        texts(&all),
        ["top", "reply", "dm", "mention <@UBOT>", "bot"]
    );
    assert_eq!(
        next_updated(&mut ops).await,
        format!("{EVENTS}?channel_ids=C2&include_bot_authors=false"),
        "the push URI's filter passed the C2 mention"
    );
    for (args, want) in [
        (
            json!({"addressed_to_bot": true}),
            vec!["dm", "mention <@UBOT>"],
        ),
        (
            json!({"channel_ids": ["C2"]}),
            vec!["mention <@UBOT>", "bot"],
        ),
        (json!({"channel_ids": "C1,D1"}), vec!["top", "reply", "dm"]),
        (
            json!({"include_dms": false}),
            vec!["top", "reply", "mention <@UBOT>", "bot"],
        ),
        (json!({"thread_ts": top}), vec!["top", "reply"]),
        (
            json!({"top_level_only": true}),
            vec!["top", "dm", "mention <@UBOT>", "bot"],
        ),
        (
            json!({"include_bot_authors": false}),
            vec!["top", "reply", "dm", "mention <@UBOT>"],
        ),
    ] {
        let r = poll_now(&conn, args.clone(), &cursor).await;
        let got: Vec<Value> = r["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["data"].clone())
            .collect();
        assert_eq!(texts(&got), want, "{args}");
    }
    let e = request(
        &conn,
        "events/poll",
        json!({"name": "message_posted", "arguments": {"channel": "C1"}, "cursor": cursor}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code.0, -32602);
    assert!(
        e.message.contains("unknown argument channel"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn what_is_never_an_event() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    connected(&fake).await;
    let first = fake.post("C1", "U1", "first");
    fake.post_as_bot_itself("C1", "the bot's own reply");
    fake.post_subtype(
        "C1",
        Sub::Changed {
            ts: &first,
            text: "edited",
        },
    );
    fake.post_subtype("C1", Sub::Deleted { ts: &first });
    fake.post_subtype("C1", Sub::Join { user: "U3" });
    fake.post_subtype(
        "C1",
        Sub::Topic {
            user: "U3",
            topic: "new topic",
        },
    );
    fake.post("M1", "U1", "a group DM");
    fake.post("C1", "U1", "marker");
    let (got, cursor) = collect(&conn, json!({}), &cursor, 2).await;
    assert_eq!(texts(&got), ["first", "marker"]);
    fake.wait_until("every envelope acked", |s| s.acks().len() == 8)
        .await;
    let r = poll_now(&conn, json!({}), &cursor).await;
    assert_eq!(r["events"], json!([]));
}

#[tokio::test]
async fn a_redelivered_envelope_is_one_event() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    connected(&fake).await;
    fake.post("C1", "U1", "once");
    let (_, after) = collect(&conn, json!({}), &cursor, 1).await;
    fake.redeliver_last().expect("an envelope to redeliver");
    fake.wait_until("the redelivery acked", |s| s.acks().len() == 2)
        .await;
    fake.post("C1", "U1", "marker");
    let (got, _) = collect(&conn, json!({}), &after, 1).await;
    assert_eq!(texts(&got), ["marker"]);
    let s = status(&conn).await;
    assert_eq!(s["redeliveries"], 1);
}

#[tokio::test]
async fn a_refresh_loses_nothing_posted_during_the_swap() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    connected(&fake).await;
    fake.post("C1", "U1", "before");
    fake.disconnect("refresh_requested");
    // Still on the old socket: Slack keeps it open until the client closes it.
    fake.post("C1", "U1", "during");
    fake.wait_until("a second socket", |s| s.sockets_opened() == 2)
        .await;
    fake.post("C1", "U1", "on the new socket");
    fake.wait_until("the old socket closed", |s| s.sockets_open() == 1)
        .await;
    fake.post("C1", "U1", "after");
    let (got, cursor) = collect(&conn, json!({}), &cursor, 4).await;
    // Each exactly once. Across two sockets Slack promises no order (nor does the fake: each
    // socket has its own task), so only "before" is known to come first.
    let got = texts(&got);
    assert_eq!(got[0], "before");
    let set: BTreeSet<&str> = got.iter().copied().collect();
    assert_eq!(set.len(), 4, "{got:?}");
    assert_eq!(
        set,
        ["after", "before", "during", "on the new socket"].into()
    );
    // "during" came over the old socket (acked there), not from a backfill.
    let during = fake
        .envelopes()
        .into_iter()
        .find(|e| e["payload"]["event"]["text"] == "during")
        .expect("an envelope for it");
    let id = during["envelope_id"].as_str().unwrap().to_owned();
    assert!(fake.acks().contains(&id), "acked on the old socket");
    assert_eq!(
        poll_now(&conn, json!({}), &cursor).await["events"],
        json!([])
    );
    assert_eq!(fake.calls("apps.connections.open"), 2);
}

#[tokio::test]
async fn a_silent_socket_is_pinged_then_replaced() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &["--socket-idle-ms", "300"]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    connected(&fake).await;
    // A dead NAT entry: the TCP connection stays, nothing flows, no pong comes back.
    fake.freeze_sockets();
    fake.wait_until("a second socket", |s| s.sockets_opened() == 2)
        .await;
    fake.wait_until("it is live", |s| s.sockets_open() == 2)
        .await;
    fake.post("C1", "U1", "after the dead socket");
    let (got, _) = collect(&conn, json!({}), &cursor, 1).await;
    assert_eq!(texts(&got), ["after the dead socket"]);
    let s = status(&conn).await;
    assert!(
        s["last_socket_error"]
            .as_str()
            .unwrap()
            .contains("not even a pong"),
        "{s}"
    );
}

#[tokio::test]
async fn link_disabled_stops_reconnecting() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    connected(&fake).await;
    fake.disconnect("link_disabled");
    fake.wait_until("the socket closed", |s| s.sockets_open() == 0)
        .await;
    // Each status call is a round trip to herald; it reports the state once it has it.
    let deadline = tokio::time::Instant::now() + WAIT;
    let s = loop {
        let s = status(&conn).await;
        if s["state"] == "link_disabled" {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never link_disabled: {s}"
        );
        tokio::task::yield_now().await;
    };
    assert!(
        s["last_socket_error"]
            .as_str()
            .unwrap()
            .contains("link_disabled"),
        "{s}"
    );
    assert_eq!(fake.calls("apps.connections.open"), 1, "no reconnect");
    // Polls still serve the buffer.
    let cursor = now_cursor(&conn).await;
    assert_eq!(
        poll_now(&conn, json!({}), &cursor).await["events"],
        json!([])
    );
    assert_eq!(fake.calls("apps.connections.open"), 1);
}

#[tokio::test]
async fn a_post_while_down_is_backfilled_on_reconnect_with_old_thread_replies() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &[]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    connected(&fake).await;
    // A parent from half an hour ago, before herald ever ran: only in history.
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let old_parent = format!("{}.000100", now_s - 1800);
    fake.post_at("C2", &old_parent, "U1", "an old parent");
    fake.post("C1", "U1", "live");
    let (_, cursor_live) = collect(&conn, json!({}), &cursor, 1).await;

    fake.set_down(true);
    fake.wait_until("herald's socket gone", |s| s.sockets_open() == 0)
        .await;
    fake.post("C1", "U1", "while down");
    fake.post_reply("C2", &old_parent, "U2", "a reply to the old parent");
    fake.post("D1", "U1", "a dm while down");
    // The first history call of the backfill is rate limited: herald waits and retries.
    fake.rate_limit("conversations.history", 1, 1);
    fake.set_down(false);
    let (got, _) = collect(&conn, json!({}), &cursor_live, 3).await;
    let got: BTreeSet<&str> = texts(&got).into_iter().collect();
    assert_eq!(
        got,
        ["a dm while down", "a reply to the old parent", "while down"].into()
    );
    assert!(fake.calls("conversations.replies") >= 1);
    // The rate-limited call is made again for the same conversation, and not before its
    // Retry-After (1 s) has passed: on a loaded machine every message may have arrived
    // another way by then, so the retry is awaited, not assumed.
    fake.wait_until("the rate-limited conversation asked again", |s| {
        s.retried_after_429("conversations.history")
    })
    .await;
    let times = fake.call_times("conversations.history");
    let params = fake.requests("conversations.history");
    let limited = times
        .iter()
        .position(|(_, limited)| *limited)
        .expect("a 429 was answered");
    let channel = &params[limited]["channel"];
    let retry = (limited + 1..params.len())
        .find(|&i| &params[i]["channel"] == channel)
        .expect("the conversation was asked again");
    assert!(
        times[retry].0 - times[limited].0 >= std::time::Duration::from_secs(1),
        "retried after Retry-After"
    );
    let s = status(&conn).await;
    assert_eq!(s["state"], "connected");
    assert!(
        s["last_backfill"]["recovered"].as_u64().unwrap() >= 3,
        "{s}"
    );
    assert_eq!(s["backfill_owed"], false);
}

#[tokio::test]
async fn a_restart_keeps_the_sealed_buffer_and_old_cursors() {
    let fake = fake().await;
    let dir = TempDir::new("slack-restart");
    let store = dir.path().join("herald.redb");
    let store = store.to_str().unwrap();
    let server = start(&fake, store, &[]).await;
    let conn = client(&server).await;
    let before = now_cursor(&conn).await;
    connected(&fake).await;
    fake.post("C1", "U1", "XYZZY plugh, the words of power");
    let (_, after) = collect(&conn, json!({}), &before, 1).await;
    drop(conn);
    assert!(server.terminate().await.success());
    let bytes = std::fs::read(dir.path().join("herald.redb")).unwrap();
    assert!(
        !bytes.windows(5).any(|w| w == b"XYZZY"),
        "the store holds no message text"
    );
    assert!(!bytes.windows(5).any(|w| w == b"plugh"));

    let server = start(&fake, store, &[]).await;
    let conn = client(&server).await;
    let r = poll_now(&conn, json!({}), &before).await;
    assert_eq!(
        texts(&[r["events"][0]["data"].clone()]),
        ["XYZZY plugh, the words of power"]
    );
    fake.wait_until("a socket again", |s| s.sockets_open() == 1)
        .await;
    fake.post("C1", "U1", "after the restart");
    let (got, _) = collect(&conn, json!({}), &after, 1).await;
    assert_eq!(
        texts(&got),
        ["after the restart"],
        "the old cursor still works"
    );
}

#[tokio::test]
async fn the_cap_evicts_and_says_truncated() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &["--max-events", "3"]).await;
    let conn = client(&server).await;
    let cursor = now_cursor(&conn).await;
    connected(&fake).await;
    for i in 0..5 {
        fake.post("C1", "U1", &format!("m{i}"));
    }
    fake.wait_until("five acks", |s| s.acks().len() == 5).await;
    // The fifth is in once a poll returns it (the ack goes out just before the insert).
    let deadline = tokio::time::Instant::now() + WAIT;
    let r = loop {
        let r = poll(
            &conn,
            json!({"name": "message_posted", "cursor": cursor, "timeoutMs": 5_000}),
        )
        .await;
        if r["events"]
            .as_array()
            .unwrap()
            .last()
            .is_some_and(|e| e["data"]["text"] == "m4")
        {
            break r;
        }
        assert!(tokio::time::Instant::now() < deadline, "m4 never came: {r}");
    };
    assert_eq!(
        r["truncated"], true,
        "m0 and m1 were evicted after the cursor"
    );
    let got: Vec<Value> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"].clone())
        .collect();
    assert_eq!(texts(&got), ["m2", "m3", "m4"]);
}

#[tokio::test]
async fn unconfigured_it_is_inert_and_names_what_is_missing() {
    let fake = fake().await;
    let url = fake.api_url();
    let server = Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "slack",
            "--http",
            "127.0.0.1:0",
            "--slack-api-url",
            &url,
        ],
        &[("SLACK_BOT_TOKEN", BOT_TOKEN)],
    )
    .await;
    let conn = client(&server).await;
    let info = conn.peer_info().unwrap();
    let caps = serde_json::to_value(&info.capabilities).unwrap();
    assert!(
        caps["extensions"]["io.modelcontextprotocol/events"].is_null(),
        "{caps}"
    );
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    assert_eq!(list["events"], json!([]));
    let e = request(
        &conn,
        "events/poll",
        json!({"name": "message_posted", "cursor": null}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code.0, -32023);
    assert!(e.message.contains("SLACK_APP_TOKEN"), "{}", e.message);
    assert!(
        e.message.contains("SLACK_EVENTS_ENCRYPTION_KEY"),
        "{}",
        e.message
    );
    assert!(
        !e.message.contains("SLACK_BOT_TOKEN"),
        "the bot token is set: {}",
        e.message
    );
    let resources = conn.list_resources(None).await.unwrap();
    assert!(resources.resources.is_empty());
    let s = status(&conn).await;
    assert_eq!(s["state"], "not_configured");
    assert_eq!(
        s["missing"],
        json!(["SLACK_APP_TOKEN", "SLACK_EVENTS_ENCRYPTION_KEY"])
    );
    assert!(!s.to_string().contains(BOT_TOKEN));
    // The tools that need only the bot token work.
    let r = conn
        .call_tool(
            CallToolRequestParams::new("slack_post_message".to_owned())
                .with_arguments(args(json!({"channel": "C1", "text": "hi from herald"}))),
        )
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(fake.calls("chat.postMessage"), 1);
    assert_eq!(fake.calls("apps.connections.open"), 0, "no socket");
    assert_eq!(fake.calls("auth.test"), 0, "no Slack call for events");
    assert_eq!(fake.calls("conversations.history"), 0);
    assert!(!server.stderr().contains(BOT_TOKEN));
}

#[tokio::test]
async fn status_and_logs_never_show_a_secret() {
    let fake = fake().await;
    let server = start(&fake, ":memory:", &["-v"]).await;
    let conn = client(&server).await;
    connected(&fake).await;
    fake.post("C1", "U1", "x");
    let cursor = now_cursor(&conn).await;
    let _ = poll_now(&conn, json!({}), &cursor).await;
    let s = status(&conn).await.to_string();
    for secret in [APP_TOKEN, BOT_TOKEN, KEY] {
        assert!(!s.contains(secret), "status shows a secret: {s}");
        assert!(!server.stderr().contains(secret), "the log shows a secret");
    }
    assert!(s.contains("\"state\":\"connected\""), "{s}");
    let help = herald(["slack", "--help"]).await;
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--credentials") && help.contains("--slack-api-url"),
        "{help}"
    );
}

#[tokio::test]
async fn through_the_gateway_the_event_is_slug_prefixed() {
    let fake = fake().await;
    let dir = TempDir::new("slack-gateway");
    let cfg = dir.path().join("gateway.toml");
    let token = "tok-slack-1";
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"slack\"\nstdio = \"{} --store :memory: slack --slack-api-url {}\"\n\
             [[token]]\nsha256 = \"{}\"\nslugs = [\"slack\"]\n",
            bin(),
            fake.api_url(),
            hex::encode(sha2::Sha256::digest(token.as_bytes()))
        ),
    )
    .unwrap();
    let gw = Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "gateway",
            "--config",
            cfg.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
        &env(),
    )
    .await;
    let conn = connect(
        &Target::Http(gw.http_url()),
        &ClientTrust {
            token: Some(Secret(token.into())),
            ..ClientTrust::default()
        },
        client_config(),
        4 << 20,
    )
    .await
    .unwrap();
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    assert_eq!(list["events"][0]["name"], "slack__message_posted", "{list}");
    let r = request(
        &conn,
        "events/poll",
        json!({"name": "slack__message_posted", "cursor": null}),
    )
    .await
    .unwrap();
    let cursor = r["cursor"].as_str().unwrap().to_owned();
    connected(&fake).await;
    fake.post("C1", "U1", "through the gateway");
    let r = request(
        &conn,
        "events/poll",
        json!({"name": "slack__message_posted", "cursor": cursor, "timeoutMs": 20_000}),
    )
    .await
    .unwrap();
    assert_eq!(r["events"][0]["name"], "slack__message_posted", "{r}");
    assert_eq!(r["events"][0]["data"]["text"], "through the gateway");
}
