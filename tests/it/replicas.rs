//! Gateways as replicas (issue 35): who started each task is kept where every replica reads
//! it (a NATS key-value bucket with `--backend`, the store otherwise), so a task started
//! through one gateway is read, updated, cancelled and followed through another, and through
//! the same one after a restart; and replicas behind a real HAProxy serve calls, tasks and
//! listens through any of them, a killed one's clients carrying on through the rest.

use serde_json::{Value, json};

use crate::nats::NatsServer;
use crate::support::*;
use crate::tasks::{answer_as, code, tmeta};

const TOKEN: &str = "tok-replicas-3f1c";
const OTHER: &str = "tok-replicas-9a2e";

/// A gateway config with slug `a` on `upstream` and two tokens for it.
fn config(dir: &TempDir, upstream: &str) -> std::path::PathBuf {
    use sha2::Digest;
    let sha = |t: &str| hex::encode(sha2::Sha256::digest(t.as_bytes()));
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"a\"\nhttp = \"{upstream}\"\n\
             [[token]]\nname = \"one\"\nsha256 = \"{}\"\nslugs = [\"a\"]\n\
             [[token]]\nname = \"two\"\nsha256 = \"{}\"\nslugs = [\"a\"]\n",
            sha(TOKEN),
            sha(OTHER),
        ),
    )
    .unwrap();
    cfg
}

async fn ask(url: &str, token: &str, method: &str, id: u64, params: Value) -> Value {
    answer_as(url, Some(token), method, id, params).await
}

/// Starts `memo_wait` on `k` as a task through `url`; its gateway id.
async fn start_task(url: &str, id: u64) -> String {
    let t = ask(
        url,
        TOKEN,
        "tools/call",
        id,
        json!({"_meta": tmeta(), "name": "a__memo_wait", "arguments": {"key": "k"}}),
    )
    .await;
    assert_eq!(t["result"]["resultType"], "task", "{t}");
    t["result"]["taskId"].as_str().unwrap().to_owned()
}

async fn status(url: &str, token: &str, task: &str, id: u64) -> Value {
    ask(
        url,
        token,
        "tasks/get",
        id,
        json!({"_meta": tmeta(), "taskId": task}),
    )
    .await
}

/// `memo_set` of `key` (to the number `id`) straight on the memo at `url`.
async fn memo_set(url: &str, id: u64, key: &str) {
    let r = answer_as(
        url,
        None,
        "tools/call",
        id,
        json!({"_meta": meta(), "name": "memo_set", "arguments": {"key": key, "value": id}}),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
}

/// A gateway replica on `backend` that takes webhook subscriptions to loopback callbacks.
async fn hooks_gateway(cfg: &std::path::Path, backend: &str, admin: bool) -> Server {
    hooks_gateway_env(
        cfg,
        backend,
        admin,
        &[("HERALD_EVENTS_KEY", crate::webhooks::KEY)],
    )
    .await
}

/// [`hooks_gateway`] with `env` (which names the events key).
async fn hooks_gateway_env(
    cfg: &std::path::Path,
    backend: &str,
    admin: bool,
    env: &[(&str, &str)],
) -> Server {
    let mut extra = vec![
        "--backend",
        backend,
        "--callback-allow",
        "http://127.0.0.1:",
    ];
    if admin {
        extra.extend(["--admin", "127.0.0.1:0"]);
    }
    gateway_server_env(cfg, ":memory:", &extra, env).await
}

#[tokio::test]
async fn a_task_started_through_one_replica_is_read_and_cancelled_through_another() {
    let nats = NatsServer::start().await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-tasks");
    let cfg = config(&dir, &memo.http_url());
    let backend = format!("nats://127.0.0.1:{}", nats.port);
    let one = gateway_server(&cfg, ":memory:", &["--backend", &backend]).await;
    let two = gateway_server(&cfg, ":memory:", &["--backend", &backend]).await;
    let (url1, url2) = (one.http_url(), two.http_url());

    let task = start_task(&url1, 1).await;
    let got = status(&url2, TOKEN, &task, 2).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(got["result"]["taskId"], task.as_str());
    // Another caller of the same slug: as unknown there as here.
    let theirs = status(&url2, OTHER, &task, 3).await;
    assert_eq!(code(&theirs), -32602, "{theirs}");
    let nowhere = status(&url2, OTHER, "a__no-such-task", 4).await;
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .map(|m| m.replace(&task, "ID")),
        nowhere["error"]["message"]
            .as_str()
            .map(|m| m.replace("a__no-such-task", "ID"))
    );
    // Followed through the other replica: its listen is acknowledged with the task and
    // hears it end.
    let (mut listen, mut buf, ack, _) =
        crate::tasks::listen_tasks(&url2, Some(TOKEN), 40, json!([task])).await;
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([task]),
        "{ack}"
    );
    // Cancelled through the other replica; the first sees it.
    let c = ask(
        &url2,
        TOKEN,
        "tasks/cancel",
        5,
        json!({"_meta": tmeta(), "taskId": task}),
    )
    .await;
    assert!(c.get("error").is_none(), "{c}");
    let got = status(&url1, TOKEN, &task, 6).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
    let pushes = crate::tasks::messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "cancelled"
    })
    .await;
    assert_eq!(pushes.last().unwrap()["params"]["taskId"], task.as_str());
    // Nothing in NATS names the task or the caller.
    let held = nats.files_holding(&[&task, TOKEN, "a__"]);
    assert!(held.is_empty(), "{held:?}");
}

#[tokio::test]
async fn a_task_outlives_its_gateways_restart_with_the_store() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-restart");
    let cfg = config(&dir, &memo.http_url());
    let store = dir.path().join("gateway.redb");
    let store = store.to_str().unwrap();
    let gw = gateway_server(&cfg, store, &[]).await;
    let task = start_task(&gw.http_url(), 1).await;
    gw.terminate().await;
    let gw = gateway_server(&cfg, store, &[]).await;
    let got = status(&gw.http_url(), TOKEN, &task, 2).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    let theirs = status(&gw.http_url(), OTHER, &task, 3).await;
    assert_eq!(code(&theirs), -32602, "{theirs}");
}

/// HAProxy (Debian's package; `.ci/run` installs it) on a listening socket this test made,
/// balancing over `servers` by `balance` (`roundrobin`; `first`: the first one up) with a
/// health check on `/live`.
struct Haproxy {
    _child: tokio::process::Child,
    url: String,
    _dir: TempDir,
}

impl Haproxy {
    fn start(balance: &str, servers: &[&str]) -> Haproxy {
        use std::os::fd::AsRawFd;
        let dir = TempDir::new("haproxy");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let backends: String = servers
            .iter()
            .enumerate()
            .map(|(i, s)| format!("    server g{i} {s} check\n"))
            .collect();
        let rest = format!(
            "    option forwardfor\n    retries 3\n    option redispatch\n\
             frontend mcp\n    bind fd@3\n    default_backend gateways\n\
             backend gateways\n    balance {balance}\n    option httpchk GET /live\n    \
             default-server inter 100ms fall 1 rise 1\n{backends}"
        );
        let child = crate::fd3::start_haproxy(dir.path(), 512, &rest, listener.as_raw_fd())
            .unwrap_or_else(|e| panic!("{e}"));
        drop(listener);
        Haproxy {
            _child: child,
            url,
            _dir: dir,
        }
    }
}

/// Open listen streams of a gateway, from its admin address's `/metrics`.
async fn listens(server: &Server) -> u64 {
    let url = format!("{}/metrics", server.admin_url());
    metric(&url, "herald_listen_streams{role=\"gateway\"}")
        .await
        .unwrap_or(0)
}

#[tokio::test]
async fn replicas_behind_haproxy_serve_any_client_and_a_killed_ones_carry_on() {
    let nats = NatsServer::start().await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-haproxy");
    let cfg = config(&dir, &memo.http_url());
    let backend = format!("nats://127.0.0.1:{}", nats.port);
    let extra = ["--backend", backend.as_str(), "--admin", "127.0.0.1:0"];
    let g = [
        gateway_server(&cfg, ":memory:", &extra).await,
        gateway_server(&cfg, ":memory:", &extra).await,
    ];
    let addrs: Vec<String> = g
        .iter()
        .map(|s| s.listening["http"].as_str().unwrap().to_owned())
        .collect();
    let lb = Haproxy::start("roundrobin", &[&addrs[0], &addrs[1]]);
    let set = |id: u64, key: &'static str, value: u64| {
        let url = lb.url.clone();
        async move {
            let r = ask(
                &url,
                TOKEN,
                "tools/call",
                id,
                json!({"_meta": meta(), "name": "a__memo_set", "arguments": {"key": key, "value": value}}),
            )
            .await;
            assert!(r.get("result").is_some(), "{r}");
        }
    };
    // Calls, round robin over both.
    set(1, "first", 1).await;
    set(2, "second", 2).await;
    // A task started through one replica, read through whichever the balancer picks.
    let task = start_task(&lb.url, 3).await;
    for id in 4..8 {
        let got = status(&lb.url, TOKEN, &task, id).await;
        assert_eq!(got["result"]["status"], "working", "{got}");
    }

    // Events: a poll's cursor from whichever replica answered is good on the other.
    let poll = |id: u64, cursor: Value| {
        let url = lb.url.clone();
        async move {
            let p = ask(
                &url,
                TOKEN,
                "events/poll",
                id,
                json!({"_meta": meta(), "name": "a__memo.changed", "arguments": {}, "cursor": cursor}),
            )
            .await;
            assert!(p.get("result").is_some(), "{p}");
            p["result"].clone()
        }
    };
    let cursor = poll(20, Value::Null).await["cursor"].clone();
    set(21, "polled", 5).await;
    for id in [22, 23] {
        let got = poll(id, cursor.clone()).await;
        let keys: Vec<&str> = got["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["data"]["key"].as_str())
            .collect();
        assert_eq!(keys, ["polled"], "{got}");
    }

    // A watch through the balancer; the replica holding its stream is killed.
    let mut w = crate::watch::Watch::spawn_env(
        ":memory:",
        &[
            "--mcp-http",
            &lb.url,
            "--watch",
            "notes=a+memo://notes",
            "--resubscribe-base-ms",
            "100",
            "--resubscribe-attempts",
            "20",
        ],
        &[("HERALD_TOKEN", TOKEN)],
    );
    w.event("watch.subscribed", "notes").await;
    let holding = if listens(&g[0]).await > 0 { 0 } else { 1 };
    assert!(
        listens(&g[holding]).await > 0,
        "one replica holds the stream"
    );
    let pid = g[holding].pid() as libc::pid_t;
    // SAFETY: kill(2) on a pid this test spawned and still owns; no memory is involved.
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(killed, 0);
    w.event("watch.resubscribing", "notes").await;
    // A write while the watch has no stream: not lost.
    set(10, "during", 3).await;
    w.event("watch.subscribed", "notes").await;
    set(11, "after", 4).await;
    let mut lines = Vec::new();
    while lines.len() < 2 {
        let n = w.notice().await;
        for l in n["lines"].as_array().unwrap() {
            lines.push(l.as_str().unwrap().to_owned());
        }
    }
    lines.sort();
    // Exactly these: nothing spurious from the new replica's first state.
    assert_eq!(lines, ["ADDED after = 4", "ADDED during = 3"]);
    assert!(
        listens(&g[1 - holding]).await > 0,
        "the other replica holds it now"
    );
    w.terminate().await;
}

/// Webhook subscriptions shared by replicas (`--backend`): taken through one replica and
/// delivered by exactly one; carried on from the kept cursor by another when the deliverer is
/// killed -9, a write made meanwhile not lost; refreshed and unsubscribed through a replica
/// that never delivered them; nothing of them in the clear in NATS's files.
#[tokio::test]
async fn webhook_subscriptions_are_shared_by_replicas_and_outlive_their_deliverer() {
    use crate::webhooks::{Receiver, SECRET, SECRET2, subscribe_params};
    let nats = NatsServer::start().await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-hooks");
    let cfg = config(&dir, &memo.http_url());
    let backend = format!("nats://127.0.0.1:{}", nats.port);
    let delivering = |s: &Server| {
        let url = format!("{}/metrics", s.admin_url());
        async move { metric(&url, "herald_webhook_deliverer").await.unwrap_or(0) }
    };
    let memo_url = memo.http_url();
    let set = |id: u64, key: &'static str| memo_set(&memo_url, id, key);
    let subscribe = |url: String, token: &'static str, id: u64, callback: String, secret| async move {
        let mut p = subscribe_params(&callback, secret, json!({}));
        p["name"] = "a__memo.changed".into();
        p["_meta"] = meta();
        ask(&url, token, "events/subscribe", id, p).await
    };
    let mut g = vec![
        hooks_gateway(&cfg, &backend, true).await,
        hooks_gateway(&cfg, &backend, true).await,
    ];
    let mut rx = Receiver::start(&[SECRET, SECRET2]).await;
    let hook = rx.url("gw");

    let sub = subscribe(g[0].http_url(), TOKEN, 1, hook.clone(), SECRET).await;
    let sub_id = sub["result"]["id"].as_str().expect("subscribed").to_owned();
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    set(2, "one").await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["data"]["key"], "one", "{d}");
    let first_id = d["id"].clone();
    let on = [delivering(&g[0]).await, delivering(&g[1]).await];
    assert_eq!(
        on.iter().sum::<u64>(),
        1,
        "exactly one replica delivers: {on:?}"
    );
    let deliverer = g.remove(if on[0] == 1 { 0 } else { 1 });

    // The deliverer dies; a write while no one delivers is not lost.
    // SAFETY: kill(2) on a pid this test spawned and still owns; no memory is involved.
    let killed = unsafe { libc::kill(deliverer.pid() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0);
    deliverer.terminate().await;
    set(3, "two").await;
    loop {
        let d = rx.delivered().await;
        match d["body"]["data"]["key"].as_str() {
            // Sent again by the new deliverer, under the same webhook-id.
            Some("one") => assert_eq!(d["id"], first_id, "{d}"),
            Some("two") => break,
            _ => panic!("only the events written: {d}"),
        }
    }
    assert_eq!(delivering(&g[0]).await, 1, "the survivor delivers now");

    // A replica that never delivered refreshes it with a new secret, and unsubscribes it.
    g.push(hooks_gateway(&cfg, &backend, true).await);
    let again = subscribe(g[1].http_url(), TOKEN, 4, hook.clone(), SECRET2).await;
    assert_eq!(again["result"]["id"], sub_id.as_str(), "{again}");
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    set(5, "three").await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["data"]["key"], "three", "{d}");
    assert_eq!(
        d["secrets"],
        json!([0, 1]),
        "signed with the old and the new: {d}"
    );
    let mut un = json!({"_meta": meta(), "name": "a__memo.changed", "arguments": {},
                        "delivery": {"url": hook}});
    let theirs = ask(&g[1].http_url(), OTHER, "events/unsubscribe", 6, un.clone()).await;
    assert_eq!(
        code(&theirs),
        -32023,
        "another caller's is no subscription: {theirs}"
    );
    let gone = ask(&g[1].http_url(), TOKEN, "events/unsubscribe", 7, un.clone()).await;
    assert!(gone.get("result").is_some(), "{gone}");
    un["_meta"] = meta();
    let twice = ask(&g[0].http_url(), TOKEN, "events/unsubscribe", 8, un).await;
    assert_eq!(code(&twice), -32023, "gone on every replica: {twice}");

    // Another subscription now: only it gets the next write.
    let other = rx.url("second");
    let s2 = subscribe(g[1].http_url(), TOKEN, 9, other.clone(), SECRET).await;
    assert!(s2.get("result").is_some(), "{s2}");
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    set(10, "four").await;
    let d = rx.delivered().await;
    assert_eq!(
        (d["path"].as_str(), d["body"]["data"]["key"].as_str()),
        (Some("/second"), Some("four")),
        "the unsubscribed one delivers nothing more: {d}"
    );

    // The first subscribed anew through the replica it was unsubscribed on: a new row of the
    // same id, followed from its own start (nothing of the old one's cursor repeated).
    let anew = subscribe(g[1].http_url(), TOKEN, 11, hook.clone(), SECRET).await;
    assert_eq!(anew["result"]["id"], sub_id.as_str(), "{anew}");
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    set(12, "five").await;
    let mut got = vec![];
    for _ in 0..2 {
        let d = rx.delivered().await;
        got.push((
            d["path"].as_str().unwrap_or_default().to_owned(),
            d["body"]["data"]["key"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("/gw".into(), "five".into()),
            ("/second".into(), "five".into())
        ],
        "each gets the next write once: {got:?}"
    );
    let held = nats.files_holding(&[SECRET, SECRET2, TOKEN, &hook, &other, "memo.changed"]);
    assert!(held.is_empty(), "{held:?}");
}

/// Behind replicas, a subscription whose time ran out while no replica delivered: the next
/// deliverer ends it, and its receiver hears `terminated` (-32023).
#[tokio::test]
async fn a_subscription_that_expired_while_none_delivered_is_told_by_the_next_deliverer() {
    use crate::webhooks::{Receiver, SECRET, subscribe_params, two_hours_on};
    let nats = NatsServer::start().await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-expired");
    let cfg = config(&dir, &memo.http_url());
    let backend = format!("nats://127.0.0.1:{}", nats.port);
    let mut rx = Receiver::start(&[SECRET]).await;
    let g = hooks_gateway(&cfg, &backend, false).await;
    let mut p = subscribe_params(&rx.url("gw"), SECRET, json!({}));
    p["name"] = "a__memo.changed".into();
    p["ttlMs"] = 3_600_000.into();
    p["_meta"] = meta();
    let sub = ask(&g.http_url(), TOKEN, "events/subscribe", 1, p).await;
    let id = sub["result"]["id"].as_str().expect("subscribed").to_owned();
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    // The only replica stops (giving up the claim); the next starts two hours on, past the
    // subscription's hour, as does its receiver, on the same port.
    g.terminate().await;
    let mut rx = rx.two_hours_on().await;
    let _g = hooks_gateway_env(&cfg, &backend, false, &two_hours_on()).await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["type"], "terminated", "{d}");
    assert_eq!(d["sub"], id.as_str());
    assert_eq!(d["body"]["error"]["code"], -32023, "{d}");
}

/// `events/stream` through the balancer: a watch of an event type whose replica is killed -9
/// resubscribes through another from its cursor, and gets exactly the event written while it
/// had no stream and the one after (none again, none lost).
#[tokio::test]
async fn an_events_stream_through_haproxy_resumes_on_another_replica() {
    let nats = NatsServer::start().await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-events");
    let cfg = config(&dir, &memo.http_url());
    let backend = format!("nats://127.0.0.1:{}", nats.port);
    let extra = ["--backend", backend.as_str()];
    let g = [
        gateway_server(&cfg, ":memory:", &extra).await,
        gateway_server(&cfg, ":memory:", &extra).await,
    ];
    let addrs: Vec<&str> = g
        .iter()
        .map(|s| s.listening["http"].as_str().unwrap())
        .collect();
    // Every connection to the first replica while it is up: the stream is there.
    let lb = Haproxy::start("first", &addrs);
    let memo_url = memo.http_url();
    let set = |id: u64, key: &'static str| memo_set(&memo_url, id, key);
    let mut w = crate::watch::Watch::spawn_env(
        ":memory:",
        &[
            "--mcp-http",
            &lb.url,
            "--watch",
            "e=events:a__memo.changed",
            "--resubscribe-base-ms",
            "100",
            "--resubscribe-attempts",
            "20",
        ],
        &[("HERALD_TOKEN", TOKEN)],
    );
    let s = w.event("watch.subscribed", "e").await;
    assert_eq!(s["push"], true, "followed by events/stream: {s}");
    set(1, "before").await;
    assert_eq!(w.notice().await["lines"], json!(["ADDED before = 1"]));
    // SAFETY: kill(2) on a pid this test spawned and still owns; no memory is involved.
    let killed = unsafe { libc::kill(g[0].pid() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0);
    w.event("watch.resubscribing", "e").await;
    set(2, "during").await;
    w.event("watch.subscribed", "e").await;
    set(3, "after").await;
    let mut lines = Vec::new();
    while lines.len() < 2 {
        let n = w.notice().await;
        for l in n["lines"].as_array().unwrap() {
            lines.push(l.as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        lines,
        ["ADDED during = 2", "ADDED after = 3"],
        "in order, once each"
    );
    w.terminate().await;
}

/// A deliverer cut off from NATS stops delivering before another replica takes over: an
/// event written after it stood down is delivered once, by the other.
#[tokio::test]
async fn a_deliverer_cut_off_from_nats_stands_down_before_another_takes_over() {
    use crate::webhooks::{Receiver, SECRET, subscribe_params};
    let nats = NatsServer::start().await;
    let gate = crate::nats::Gate::start(nats.port).await;
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("replicas-cutoff");
    let cfg = config(&dir, &memo.http_url());
    let says = |what: &'static str| {
        move |v: &Value| v["message"].as_str().is_some_and(|m| m.contains(what))
    };
    // The first replica, through the gate, delivers; the second waits.
    let mut first = hooks_gateway(&cfg, &gate.url(), false).await;
    // (It may have said so before it was listening: that line is in its stderr already.)
    if !first
        .stderr()
        .contains("delivers the webhook subscriptions now")
    {
        first
            .line_where(
                "it delivers",
                says("delivers the webhook subscriptions now"),
            )
            .await;
    }
    let backend = format!("nats://127.0.0.1:{}", nats.port);
    let mut second = hooks_gateway(&cfg, &backend, false).await;
    let mut rx = Receiver::start(&[SECRET]).await;
    let mut p = subscribe_params(&rx.url("gw"), SECRET, json!({}));
    p["name"] = "a__memo.changed".into();
    p["_meta"] = meta();
    let sub = ask(&second.http_url(), TOKEN, "events/subscribe", 1, p).await;
    assert!(sub.get("result").is_some(), "{sub}");
    assert_eq!(rx.delivered().await["body"]["type"], "verification");
    let memo_url = memo.http_url();
    let set = |id: u64, key: &'static str| memo_set(&memo_url, id, key);
    set(2, "one").await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["data"]["key"], "one", "{d}");

    // The first hears nothing from NATS any more: it stops, then the second takes over.
    gate.hold();
    first
        .line_where("it stood down", says("no longer delivers"))
        .await;
    set(3, "two").await;
    second
        .line_where(
            "it delivers",
            says("delivers the webhook subscriptions now"),
        )
        .await;
    let mut got = Vec::new();
    while !got.contains(&"two".to_owned()) {
        let d = rx.delivered().await;
        got.push(
            d["body"]["data"]["key"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    // "one" may come again (its progress may not have reached NATS); "two" only once, and
    // nothing after it is pending from the first.
    assert!(got.iter().all(|k| k == "one" || k == "two"), "{got:?}");
    set(4, "three").await;
    let d = rx.delivered().await;
    assert_eq!(d["body"]["data"]["key"], "three", "two came once: {d}");
}
