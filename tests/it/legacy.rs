//! Clients of the `initialize` era (protocol 2025-11-25 and older; the official TypeScript SDK
//! 1.x): the handshake advertises `resources.subscribe`, so `resources/subscribe` and
//! `resources/unsubscribe` are served, with `notifications/resources/updated` on the session:
//! stdio (the connection), HTTP (the session's GET stream), and through the gateway. Driven
//! with raw JSON-RPC, as such a client writes it.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::support::*;

const VERSION: &str = "2025-11-25";

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": VERSION,
        "capabilities": {},
        "clientInfo": {"name": "legacy-test", "version": "1"}
    }})
}

fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn memo_set(id: u64, tool: &str, key: &str, value: &str) -> Value {
    request(
        id,
        "tools/call",
        json!({"name": tool, "arguments": {"key": key, "value": value}}),
    )
}

/// One legacy session over a child's stdin and stdout.
struct Lines {
    _child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Lines {
    fn spawn(args: &[&str]) -> Lines {
        init();
        let mut child = Command::new(bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn herald");
        Lines {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            _child: child,
        }
    }

    async fn send(&mut self, v: &Value) {
        let mut line = v.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("a message in time")
            .unwrap()
            .expect("the server is still there");
        serde_json::from_str(&line).unwrap()
    }

    /// Sends `v` and returns its answer, with the notifications that came before it.
    async fn call(&mut self, v: Value) -> (Value, Vec<Value>) {
        self.send(&v).await;
        let mut before = Vec::new();
        loop {
            let m = self.next().await;
            if m.get("id") == v.get("id") && m.get("method").is_none() {
                return (m, before);
            }
            before.push(m);
        }
    }

    /// `resources/subscribe` (or `resources/unsubscribe`) for `uri`; returns the answer.
    async fn subscription(&mut self, id: u64, method: &str, uri: &str) -> Value {
        self.call(request(id, method, json!({"uri": uri}))).await.0
    }

    /// Reads on until `seen` holds an update for `uri`.
    async fn until_updated(&mut self, seen: &mut Vec<Value>, uri: &str) {
        while !seen.iter().any(|m| is_updated(m, uri)) {
            seen.push(self.next().await);
        }
    }

    /// The initialize handshake; returns the result.
    async fn handshake(&mut self) -> Value {
        let (init, _) = self.call(initialize()).await;
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        init["result"].clone()
    }
}

fn is_updated(m: &Value, uri: &str) -> bool {
    m["method"] == "notifications/resources/updated" && m["params"]["uri"] == uri
}

/// Subscribes to `memo://notes` on a legacy stdio session, sees an update for a set, then
/// unsubscribes and sees none for the next set.
async fn subscribe_over_lines(mut s: Lines, tool: &str) {
    let init = s.handshake().await;
    assert_eq!(init["protocolVersion"], VERSION, "{init}");
    assert_eq!(
        init["capabilities"]["resources"]["subscribe"], true,
        "{init}"
    );

    let sub = s
        .subscription(1, "resources/subscribe", "memo://notes")
        .await;
    assert_eq!(sub["result"], json!({}), "{sub}");
    // Subscribing twice changes nothing (one update per change, below).
    let again = s
        .subscription(2, "resources/subscribe", "memo://notes")
        .await;
    assert_eq!(again["result"], json!({}), "{again}");

    let (set, mut seen) = s.call(memo_set(3, tool, "k", "v1")).await;
    assert!(set.get("result").is_some(), "{set}");
    // The update may come before or after the call's answer.
    s.until_updated(&mut seen, "memo://notes").await;
    assert_eq!(
        seen.iter()
            .filter(|m| is_updated(m, "memo://notes"))
            .count(),
        1,
        "one update for one change: {seen:?}"
    );

    // An unknown resource is refused, naming it.
    let bad = s
        .subscription(4, "resources/subscribe", "memo://nope")
        .await;
    assert_eq!(bad["error"]["data"]["uri"], "memo://nope", "{bad}");

    let unsub = s
        .subscription(5, "resources/unsubscribe", "memo://notes")
        .await;
    assert_eq!(unsub["result"], json!({}), "{unsub}");
    let (set, mut seen) = s.call(memo_set(6, tool, "k", "v2")).await;
    assert!(set.get("result").is_some(), "{set}");
    // Anything the set announced would be written before the answer to a later request.
    let (list, after) = s.call(request(7, "tools/list", json!({}))).await;
    assert!(list.get("result").is_some(), "{list}");
    seen.extend(after);
    assert!(
        !seen.iter().any(|m| is_updated(m, "memo://notes")),
        "no update after unsubscribing: {seen:?}"
    );

    // Subscribing again after the unsubscribe works.
    let sub = s
        .subscription(8, "resources/subscribe", "memo://notes")
        .await;
    assert_eq!(sub["result"], json!({}), "{sub}");
    let (_, mut seen) = s.call(memo_set(9, tool, "k", "v3")).await;
    s.until_updated(&mut seen, "memo://notes").await;
}

#[tokio::test]
async fn a_legacy_stdio_client_subscribes_and_is_notified() {
    let s = Lines::spawn(&["--store", ":memory:", "memo"]);
    subscribe_over_lines(s, "memo_set").await;
}

#[tokio::test]
async fn a_legacy_client_subscribes_through_the_gateway() {
    let dir = TempDir::new("legacy-gw");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"notes\"\nstdio = \"{} --store :memory: memo\"\n",
            bin()
        ),
    )
    .unwrap();
    let s = Lines::spawn(&[
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    subscribe_over_lines(s, "notes__memo_set").await;
}

/// A legacy Streamable HTTP session: `initialize` makes a session, its GET stream carries
/// the updates of what the session subscribed to.
#[tokio::test]
async fn a_legacy_http_session_gets_updates_on_its_get_stream() {
    let server = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = server.http_url();
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<String>| {
        let mut r = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", VERSION);
        }
        r.send()
    };
    let init = tokio::time::timeout(WAIT, post(initialize(), None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(init.status(), 200);
    let session = init
        .headers()
        .get("mcp-session-id")
        .expect("a legacy initialize opens a session")
        .to_str()
        .unwrap()
        .to_owned();
    let body = init.text().await.unwrap();
    let result = sse_or_json(&body, 0);
    assert_eq!(
        result["result"]["capabilities"]["resources"]["subscribe"], true,
        "{body}"
    );
    let r = post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(session.clone()),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 202);

    let mut stream = http
        .get(&url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", VERSION)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);

    let r = post(
        request(1, "resources/subscribe", json!({"uri": "memo://notes"})),
        Some(session.clone()),
    )
    .await
    .unwrap();
    let body = r.text().await.unwrap();
    assert_eq!(sse_or_json(&body, 1)["result"], json!({}), "{body}");

    let r = post(
        memo_set(2, "memo_set", "k", "over http"),
        Some(session.clone()),
    )
    .await
    .unwrap();
    let body = r.text().await.unwrap();
    assert!(sse_or_json(&body, 2).get("result").is_some(), "{body}");

    let mut seen = String::new();
    tokio::time::timeout(WAIT, async {
        while !seen.contains("notifications/resources/updated") {
            let chunk = stream
                .chunk()
                .await
                .unwrap()
                .expect("the GET stream stays open");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no update on the GET stream; it carried: {seen}"));
    assert!(seen.contains("memo://notes"), "{seen}");
}

/// The JSON-RPC message with `id` in a response body: one JSON object, or SSE `data:` lines.
fn sse_or_json(body: &str, id: u64) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return v;
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {body}"))
}

/// A subscription costs a listen stream from the connection's budget, shared with its
/// listens: past `--max-listen-streams` the next is refused, naming the limit, and an
/// unsubscribe's answer means the room is there again.
#[tokio::test]
async fn legacy_subscriptions_share_the_connections_stream_budget() {
    let mut s = Lines::spawn(&["--store", ":memory:", "memo", "--max-listen-streams", "1"]);
    s.handshake().await;
    let one = s
        .subscription(1, "resources/subscribe", "memo://notes")
        .await;
    assert_eq!(one["result"], json!({}), "{one}");
    let two = s.subscription(2, "resources/subscribe", "memo://log").await;
    assert_eq!(two["error"]["code"], -32600, "{two}");
    assert_eq!(two["error"]["data"]["limit"], 1, "{two}");
    // The unsubscribe answers once the subscription has ended: its slot is free at once.
    let unsub = s
        .subscription(3, "resources/unsubscribe", "memo://notes")
        .await;
    assert_eq!(unsub["result"], json!({}), "{unsub}");
    let log = s.subscription(4, "resources/subscribe", "memo://log").await;
    assert_eq!(log["result"], json!({}), "{log}");
    let (_, mut seen) = s.call(memo_set(5, "memo_set", "k", "v")).await;
    s.until_updated(&mut seen, "memo://log").await;
}

/// A legacy session is its opener's: another token, or none, naming it gets rmcp's own answer
/// for an unknown session. And a client that vanished loses its session after
/// `--session-idle-timeout-ms` though what it subscribed to keeps changing (the server's
/// notifications are not the client's traffic), while a client that keeps talking keeps its.
#[tokio::test]
async fn a_legacy_session_is_its_openers_and_ends_when_its_client_is_gone() {
    let server = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--session-idle-timeout-ms",
        "400",
    ])
    .await;
    let url = server.http_url();
    let metrics_url = url.replace("/mcp", "/metrics");
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<&str>, token: Option<&str>| {
        let mut r = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", VERSION);
        }
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let open = |token: &'static str| {
        let post = &post;
        async move {
            let init = post(initialize(), None, Some(token)).await.unwrap();
            assert_eq!(init.status(), 200);
            let session = init.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_owned();
            let r = post(
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                Some(&session),
                Some(token),
            )
            .await
            .unwrap();
            assert_eq!(r.status(), 202);
            session
        }
    };
    let sessions = || async {
        metric(&metrics_url, "herald_http_sessions")
            .await
            .expect("the sessions gauge")
    };
    let alice = open("alice-token").await;
    let subscribe = request(1, "resources/subscribe", json!({"uri": "memo://notes"}));
    // Answered exactly as a session that does not exist: status, headers, body.
    let seen = |r: reqwest::Response| async move {
        let status = r.status();
        let kind = r.headers().get("content-type").cloned();
        (status, kind, r.text().await.unwrap())
    };
    for token in [Some("mallory-token"), None] {
        let theirs = seen(post(subscribe.clone(), Some(&alice), token).await.unwrap()).await;
        let nobodys = seen(
            post(subscribe.clone(), Some("no-such-session"), token)
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(theirs.0, 404, "{token:?}");
        assert_eq!(theirs, nobodys, "{token:?}");
        let delete = |session: &str| {
            http.delete(&url)
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", VERSION)
                .bearer_auth(token.unwrap_or("none"))
                .send()
        };
        let theirs = seen(delete(&alice).await.unwrap()).await;
        let nobodys = seen(delete("no-such-session").await.unwrap()).await;
        assert_eq!(theirs, nobodys, "{token:?}");
    }
    let r = post(subscribe.clone(), Some(&alice), Some("alice-token"))
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    assert_eq!(sse_or_json(&body, 1)["result"], json!({}), "{body}");

    // Alice goes away. Bob keeps writing what she subscribed to, in his own session.
    let bob = open("bob-token").await;
    assert_eq!(sessions().await, 2);
    let mut n = 0;
    tokio::time::timeout(WAIT, async {
        loop {
            n += 1;
            let r = post(
                memo_set(10 + n, "memo_set", "k", &format!("v{n}")),
                Some(&bob),
                Some("bob-token"),
            )
            .await
            .unwrap();
            assert_eq!(r.status(), 200, "bob's session stays: he talks");
            if sessions().await == 1 {
                return;
            }
        }
    })
    .await
    .expect("alice's session closes once she has been gone the idle time");
    let r = post(subscribe, Some(&alice), Some("alice-token"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "closed");
}
