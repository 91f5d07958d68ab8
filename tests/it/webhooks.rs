//! Webhook subscriptions (`events/subscribe`) against a real `herald memo`, delivered to a
//! receiver that plays ChatGPT and checks every POST with the official Standard Webhooks
//! verifier (PyPI `standardwebhooks`, `tests/it/py/webhook_receiver.py`): the challenge, the
//! signatures, the order, retries, 410 and 413, the callback policy, and a `kill -9` with a
//! retry pending.

use std::process::Stdio;

use herald::transport::client::Connection;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::events::request;
use crate::support::*;

pub(crate) const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub(crate) const SECRET2: &str = "whsec_c2Vjb25kIHNlY3JldCBmb3IgdGhlIHJvdGF0aW9u";

/// The Python that has `standardwebhooks` (`.ci/run` makes a venv and names it).
fn python() -> String {
    std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

pub(crate) struct Receiver {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<Value>,
    port: u16,
    secrets: Vec<String>,
}

impl Receiver {
    pub(crate) async fn start(secrets: &[&str]) -> Receiver {
        Receiver::start_env(secrets.iter().copied(), &[]).await
    }

    /// A receiver with `env` in its environment (`RECEIVER_PORT`, libfaketime's variables).
    async fn start_env<'a>(
        secrets: impl IntoIterator<Item = &'a str>,
        env: &[(&str, &str)],
    ) -> Receiver {
        let secrets: Vec<String> = secrets.into_iter().map(str::to_owned).collect();
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/py/webhook_receiver.py"
        );
        let mut child = Command::new(python())
            .arg(script)
            .args(&secrets)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python runs the receiver");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, mut lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(l)) = out.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        let first = tokio::time::timeout(WAIT, lines.recv())
            .await
            .expect("the receiver starts (is standardwebhooks installed? .ci/run installs it)")
            .expect("the receiver says its port");
        let port = first["port"].as_u64().expect("a port") as u16;
        Receiver {
            child,
            stdin,
            lines,
            port,
            secrets,
        }
    }

    /// This receiver stopped (waited for, its port free) and another started on its port,
    /// two hours on ([`two_hours_on`]: the verifier refuses a timestamp five minutes off its
    /// own clock).
    pub(crate) async fn two_hours_on(mut self) -> Receiver {
        let _ = self.child.kill().await;
        let port = self.port.to_string();
        let mut env = vec![("RECEIVER_PORT", port.as_str())];
        env.extend(two_hours_on());
        Receiver::start_env(self.secrets.iter().map(String::as_str), &env).await
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// The next `n` POSTs get `status`.
    async fn answer(&mut self, status: u16, times: u32) {
        self.order(json!({"status": status, "times": times})).await;
    }

    async fn order(&mut self, order: Value) {
        self.stdin
            .write_all(format!("{order}\n").as_bytes())
            .await
            .unwrap();
        let ack = self.next().await;
        assert_eq!(ack["event"], "scripted");
    }

    pub(crate) async fn next(&mut self) -> Value {
        tokio::time::timeout(WAIT, self.lines.recv())
            .await
            .expect("the receiver hears something in time")
            .expect("the receiver runs")
    }

    /// The next delivered message (verified by the receiver), skipping nothing else: a
    /// refused signature fails the test.
    pub(crate) async fn delivered(&mut self) -> Value {
        let v = self.next().await;
        assert_eq!(v["event"], "delivered", "{v}");
        v
    }
}

async fn memo(extra: &[&str]) -> (Server, Connection) {
    let mut args = vec!["--store", ":memory:", "memo", "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let s = Server::spawn_env(&args, &[("HERALD_EVENTS_KEY", KEY)]).await;
    let conn = http_client(&s).await;
    (s, conn)
}

/// A client of `s`'s HTTP endpoint.
async fn http_client(s: &Server) -> Connection {
    Memo {
        target: herald::transport::target::Target::Http(s.http_url()),
        trust: Default::default(),
        server: None,
    }
    .client()
    .await
}

pub(crate) fn subscribe_params(url: &str, secret: &str, arguments: Value) -> Value {
    json!({"name": "memo.changed", "arguments": arguments,
           "delivery": {"mode": "webhook", "url": url, "secret": secret}})
}

#[tokio::test]
async fn a_subscription_is_verified_signed_and_delivered_in_order() {
    let mut rx = Receiver::start(&[SECRET, SECRET2]).await;
    let (_s, conn) = memo(&["--callback-allow", "http://127.0.0.1:"]).await;
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    assert_eq!(
        list["events"][0]["delivery"],
        json!(["poll", "push", "webhook"])
    );
    let url = rx.url("hooks/a");
    let sub = request(
        &conn,
        "events/subscribe",
        subscribe_params(&url, SECRET, json!({})),
    )
    .await
    .unwrap();
    let id = sub["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sub_"), "{sub}");
    assert!(sub["refreshBefore"].as_str().unwrap().ends_with('Z'));
    assert_eq!(sub["truncated"], false);
    assert_eq!(sub["deliveryStatus"]["active"], true);
    let challenge = rx.delivered().await;
    assert_eq!(challenge["body"]["type"], "verification");
    assert_eq!(challenge["sub"], id.as_str());
    assert_eq!(challenge["path"], "/hooks/a");

    for key in ["a", "b"] {
        call(&conn, "memo_set", json!({"key": key, "value": "v"})).await;
    }
    for key in ["a", "b"] {
        let d = rx.delivered().await;
        assert_eq!(d["sub"], id.as_str());
        assert_eq!(d["body"]["name"], "memo.changed");
        assert_eq!(d["body"]["data"]["key"], key, "{d}");
        assert_eq!(d["id"], d["body"]["eventId"], "webhook-id is the event id");
        assert_eq!(d["secrets"], json!([0]));
    }

    // The same key again (arguments in another order would be the same too) with a new
    // secret: the same id, and both secrets sign while the old one is replaced.
    let again = request(
        &conn,
        "events/subscribe",
        subscribe_params(&url, SECRET2, json!({})),
    )
    .await
    .unwrap();
    assert_eq!(again["id"], id.as_str(), "idempotent");
    let challenge = rx.delivered().await;
    assert_eq!(
        challenge["secrets"],
        json!([1]),
        "the challenge proves the new secret"
    );
    call(&conn, "memo_set", json!({"key": "c", "value": "v"})).await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["data"]["key"], "c");
    assert_eq!(d["signatures"], 2, "dual signing during rotation: {d}");
    assert_eq!(d["secrets"], json!([0, 1]));

    let params = json!({"name": "memo.changed", "arguments": {}, "delivery": {"url": url}});
    request(&conn, "events/unsubscribe", params.clone())
        .await
        .unwrap();
    let e = request(&conn, "events/unsubscribe", params)
        .await
        .unwrap_err();
    assert_eq!(e.code.0, -32023, "{e:?}");
    assert_eq!(e.data.unwrap()["kind"], "subscription");
}

#[tokio::test]
async fn callbacks_outside_the_policy_are_refused() {
    let mut rx = Receiver::start(&[SECRET]).await;
    let (_s, conn) = memo(&[]).await;
    let e = request(
        &conn,
        "events/subscribe",
        subscribe_params(&rx.url("x"), SECRET, json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code.0, -32027, "{e:?}");
    assert!(e.message.contains("must be https"), "{e:?}");
    let e = request(
        &conn,
        "events/subscribe",
        subscribe_params("https://10.0.0.7/hook", SECRET, json!({})),
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("private address"), "{e:?}");
    let e = request(
        &conn,
        "events/subscribe",
        subscribe_params("https://hooks.example.com/", "whsec_short", json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code.0, -32602, "{e:?}");
    let e = request(
        &conn,
        "events/subscribe",
        subscribe_params("https://hooks.example.com/", SECRET, json!({"nosuch": 1})),
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("unknown argument nosuch"), "{e:?}");

    // Allowed, but the receiver redirects the challenge: not followed, refused.
    let (_s2, conn) = memo(&[
        "--callback-allow",
        "http://127.0.0.1:",
        "--events-profile",
        "chatgpt",
    ])
    .await;
    rx.answer(307, 1).await;
    let e = request(
        &conn,
        "events/subscribe",
        subscribe_params(&rx.url("x"), SECRET, json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code.0, -32015, "the ChatGPT profile's code: {e:?}");
    assert_eq!(e.data.as_ref().unwrap()["reason"], "verificationFailed");
    assert!(e.message.contains("redirects are not followed"), "{e:?}");
    let answered = rx.next().await;
    assert_eq!(answered["status"], 307);
}

#[tokio::test]
async fn failures_are_retried_413_is_skipped_and_410_ends_it() {
    let mut rx = Receiver::start(&[SECRET]).await;
    let (s, conn) = memo(&["--callback-allow", "http://127.0.0.1:"]).await;
    let url = rx.url("f");
    let sub = request(
        &conn,
        "events/subscribe",
        subscribe_params(&url, SECRET, json!({})),
    )
    .await
    .unwrap();
    rx.delivered().await;
    let id = sub["id"].clone();

    // Down, then back: the same message again.
    rx.answer(503, 1).await;
    call(&conn, "memo_set", json!({"key": "a", "value": "v"})).await;
    let failed = rx.next().await;
    assert_eq!(failed["status"], 503);
    let d = rx.delivered().await;
    assert_eq!(d["id"], failed["id"], "a retry keeps its webhook-id");
    assert_eq!(d["body"]["data"]["key"], "a");
    let metrics = reqwest::get(s.http_url().replace("/mcp", "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    // (Counted before the retry that the receiver just took was sent.)
    assert_eq!(value("herald_webhook_failed_total"), 1);
    assert!(
        value("herald_webhook_delivered_total") >= 1,
        "the challenge at least"
    );
    assert_eq!(value("herald_webhook_subscriptions"), 1);

    // 413: that event is skipped, never sent again; the next one comes.
    rx.answer(413, 1).await;
    call(&conn, "memo_set", json!({"key": "b", "value": "v"})).await;
    let refused = rx.next().await;
    assert_eq!(
        (refused["status"].as_u64(), &refused["body"]["data"]["key"]),
        (Some(413), &json!("b"))
    );
    call(&conn, "memo_set", json!({"key": "c", "value": "v"})).await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["data"]["key"], "c", "b was not sent again: {d}");

    // 410: the subscription is dropped.
    rx.answer(410, 1).await;
    call(&conn, "memo_set", json!({"key": "d", "value": "v"})).await;
    let gone = rx.next().await;
    assert_eq!((gone["status"].as_u64(), &gone["sub"]), (Some(410), &id));
    let params = json!({"name": "memo.changed", "delivery": {"url": url}});
    let mut dropped = false;
    for round in 0..1000 {
        if request(&conn, "events/unsubscribe", params.clone())
            .await
            .is_err()
        {
            dropped = true;
            break;
        }
        // Unsubscribed before the 410 was heard: subscribe again, wait for its answer.
        request(
            &conn,
            "events/subscribe",
            subscribe_params(&url, SECRET, json!({})),
        )
        .await
        .unwrap();
        rx.delivered().await;
        rx.answer(410, 1).await;
        // (A new value each time: setting the same one is no change, and no event.)
        call(&conn, "memo_set", json!({"key": "d", "value": round})).await;
        assert_eq!(rx.next().await["status"], 410);
    }
    assert!(dropped, "a 410 drops the subscription");
}

/// `herald memo` on the store file `store`, taking loopback callbacks.
fn stored_memo(store: &str) -> [&str; 7] {
    [
        "--store",
        store,
        "memo",
        "--http",
        "127.0.0.1:0",
        "--callback-allow",
        "http://127.0.0.1:",
    ]
}

/// `kill -9` while a message is being retried: after the restart (same store, same key) it
/// is delivered under the same webhook-id, and the events after it follow.
#[tokio::test]
async fn a_retry_pending_at_kill_9_is_delivered_after_the_restart() {
    let dir = TempDir::new("hooks-kill");
    let store = dir.path().join("h.redb");
    let store = store.to_str().unwrap();
    let mut rx = Receiver::start(&[SECRET]).await;
    let args = stored_memo(store);
    let s = Server::spawn_env(&args, &[("HERALD_EVENTS_KEY", KEY)]).await;
    let conn = http_client(&s).await;
    request(
        &conn,
        "events/subscribe",
        subscribe_params(&rx.url("k"), SECRET, json!({})),
    )
    .await
    .unwrap();
    rx.delivered().await;
    rx.answer(503, 1000).await;
    call(&conn, "memo_set", json!({"key": "a", "value": "v"})).await;
    let first = rx.next().await;
    assert_eq!(first["status"], 503);
    // The second try comes after the first failure was kept in the store.
    let second = rx.next().await;
    assert_eq!(second["id"], first["id"]);
    let _ = std::process::Command::new("kill")
        .args(["-9", &s.pid().to_string()])
        .status();
    drop(conn);
    // Reaped before the restart: a killed process not yet waited for still holds its pid,
    // and the store's lock names it.
    let mut s = s;
    let _ = s.child.wait().await;
    drop(s);
    rx.order(json!({"clear": true})).await;
    let s = Server::spawn_env(&args, &[("HERALD_EVENTS_KEY", KEY)]).await;
    let d = rx.delivered().await;
    assert_eq!(
        d["id"], first["id"],
        "the same webhook-id after the restart"
    );
    assert_eq!(d["body"]["data"]["key"], "a");
    let conn = http_client(&s).await;
    call(&conn, "memo_set", json!({"key": "b", "value": "v"})).await;
    loop {
        let d = rx.delivered().await;
        if d["body"]["type"] == "gap" {
            continue;
        }
        assert_eq!(d["body"]["data"]["key"], "b", "{d}");
        break;
    }
}

/// libfaketime's variables that put a process two hours ahead (past the shortest TTL, one
/// hour) on the wall clock alone, with the events key: herald's environment for a start
/// "later". `.ci/run` installs Debian's faketime.
pub(crate) fn two_hours_on() -> [(&'static str, &'static str); 4] {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libfaketime is installed (apt-get install faketime; .ci/run does)");
    [
        ("LD_PRELOAD", lib),
        ("FAKETIME", "+2h"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("HERALD_EVENTS_KEY", KEY),
    ]
}

/// A subscription whose time ran out while herald was down: at the restart its receiver
/// hears that it ended (`terminated`, -32023), as when it expires while herald runs.
#[tokio::test]
async fn a_subscription_that_expired_while_herald_was_down_is_told_at_the_restart() {
    let dir = TempDir::new("hooks-expired");
    let store = dir.path().join("h.redb");
    let store = store.to_str().unwrap();
    let mut rx = Receiver::start(&[SECRET]).await;
    let args = stored_memo(store);
    let s = Server::spawn_env(&args, &[("HERALD_EVENTS_KEY", KEY)]).await;
    let conn = http_client(&s).await;
    let params = json!({"name": "memo.changed", "arguments": {}, "ttlMs": 3_600_000,
        "delivery": {"mode": "webhook", "url": rx.url("k"), "secret": SECRET}});
    let sub = request(&conn, "events/subscribe", params).await.unwrap();
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    drop(conn);
    s.terminate().await;
    // Two hours on, for herald and for the receiver.
    let mut rx = rx.two_hours_on().await;
    let _s = Server::spawn_env(&args, &two_hours_on()).await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["type"], "terminated", "{d}");
    assert_eq!(d["sub"], sub["id"]);
    assert_eq!(d["body"]["error"]["code"], -32023, "{d}");
}

/// Through `herald up`'s gateway: a subscription to `memo__memo.changed` is checked, verified
/// and delivered as one to the memo role itself.
#[tokio::test]
async fn a_subscription_through_the_gateway_is_delivered() {
    let demo = TempDir::new("hooks-up");
    let mut rx = Receiver::start(&[SECRET]).await;
    let (_up, memo) = up_demo_http(
        &demo,
        &["--callback-allow", "http://127.0.0.1:"],
        &[("HERALD_EVENTS_KEY", KEY)],
    )
    .await;
    let conn = memo.client().await;
    let list = request(&conn, "events/list", json!({})).await.unwrap();
    let memo = list["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "memo__memo.changed")
        .cloned()
        .unwrap();
    assert_eq!(memo["delivery"], json!(["poll", "push", "webhook"]));
    let mut params = subscribe_params(&rx.url("gw"), SECRET, json!({}));
    params["name"] = "memo__memo.changed".into();
    let sub = request(&conn, "events/subscribe", params).await.unwrap();
    assert!(sub["id"].as_str().unwrap().starts_with("sub_"));
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    call(&conn, "memo__memo_set", json!({"key": "g", "value": "v"})).await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["name"], "memo__memo.changed");
    assert_eq!(d["body"]["data"]["key"], "g");
    let mut params = subscribe_params(&rx.url("gw"), SECRET, json!({}));
    params["name"] = "nosuch__x".into();
    let e = request(&conn, "events/subscribe", params)
        .await
        .unwrap_err();
    // This caller (herald up on loopback) may use every slug: it is told none is named so.
    assert_eq!(e.code.0, -32602, "{e:?}");
    assert!(e.message.contains("no server named nosuch"), "{e:?}");
}
