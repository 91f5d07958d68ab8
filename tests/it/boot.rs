//! An edge host boots in any order: what `herald up` is configured with and cannot start yet
//! keeps trying, shows in `/ready`, `/status` and `herald status`, and runs once it can; and
//! `herald check` refuses what `herald up` would refuse at start.

use serde_json::Value;

use crate::support::*;
use crate::up::up;

/// GETs `path` of the admin address: `(status, body)`.
pub(crate) async fn admin(addr: &str, path: &str) -> (u16, Value) {
    let client = herald::transport::web::http_client(|b| b).unwrap();
    let r = client
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The boot-order case of issue 30: `herald up` with a `[[slug]]` whose server starts later
/// used to log one `watch did not start` and never watch it, while `/ready` said 200.
#[tokio::test]
async fn a_watch_on_a_slug_that_starts_later_runs_once_it_is_up_and_ready_waits_for_it() {
    let dir = TempDir::new("boot-later");
    // Nothing listens there yet: the memo takes it later.
    let port = closed_port();
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n\
             [[slug]]\nname = \"m\"\nhttp = \"http://127.0.0.1:{port}/mcp\"\n\n\
             [[watch]]\nname = \"notes\"\nuri = \"memo://notes\"\n"
        ),
    )
    .unwrap();
    let mut up = up(&cfg, &["--connect-timeout-ms", "1000"]).await;

    // Listed as starting (with why), and /ready names it until it runs.
    let (code, ready) = admin(&up.admin, "/ready").await;
    assert_eq!(code, 503, "{ready}");
    assert_eq!(ready["watches_starting"][0]["name"], "notes", "{ready}");
    let (_, status) = admin(&up.admin, "/status").await;
    assert_eq!(status["watches"][0]["state"], "starting", "{status}");
    assert!(status["watches"][0]["error"].is_string(), "{status}");
    let table = herald(["status", "--admin", &up.admin]).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("notes") && l.contains("starting")),
        "{text}"
    );
    let (_, metrics) = metrics(&up.admin).await;
    assert!(
        metrics.contains("herald_watches{state=\"starting\"} 1"),
        "{metrics}"
    );

    // The memo comes up on that port; the watch starts by itself and a change is noticed.
    let port = port.to_string();
    let addr = format!("127.0.0.1:{port}");
    let _memo = Server::spawn(&["--store", ":memory:", "memo", "--http", &addr]).await;
    let c = crate::watch::memo_client(&up.url).await;
    let mut noticed = false;
    for i in 0..20 {
        // Until the gateway has reconnected to m the call is refused ("reconnecting"); each
        // round then waits for a notice a while, which paces the tries.
        let set = rmcp::model::CallToolRequestParams::new("m__memo_set")
            .with_arguments(args(serde_json::json!({"key": "k", "value": i})));
        let _ = c.call_tool(set).await;
        if let Ok(n) = tokio::time::timeout(std::time::Duration::from_secs(2), up.notice()).await {
            assert_eq!(n["watch"], "notes", "{n}");
            noticed = true;
            break;
        }
    }
    assert!(noticed, "the watch started once its slug was up");
    let (code, ready) = admin(&up.admin, "/ready").await;
    assert_eq!(code, 200, "{ready}");
    let (_, status) = admin(&up.admin, "/status").await;
    assert_eq!(status["watches"][0]["state"], "running", "{status}");
}

/// GETs `/metrics` as text.
async fn metrics(addr: &str) -> (u16, String) {
    let client = herald::transport::web::http_client(|b| b).unwrap();
    let r = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// `herald check` used to pass filters `herald up` then refused (and misread a `herald watch`
/// config as an appliance's): now it dry-runs each as the start does, and `herald up` refuses
/// the same before it starts anything.
#[tokio::test]
async fn check_dry_runs_every_filter_as_the_start_would() {
    let dir = TempDir::new("check-filters");
    let up_cfg = |on_event: &str| {
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n[memo]\n\n\
             [[watch]]\nname = \"w\"\nuri = \"memo://notes\"\non_event = {on_event:?}\n"
        )
    };
    let cfg = dir.path().join("up.toml");
    for (code, says) in [
        ("undefined_name + 1", "NameError"),
        ("x = (", "SyntaxError"),
        (
            "if event['type'] == 'ADDED':\n    'new'",
            "an `if` statement (line 1)",
        ),
    ] {
        std::fs::write(&cfg, up_cfg(code)).unwrap();
        let out = herald(["check", cfg.to_str().unwrap()]).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{code}: {err}");
        assert!(
            err.contains("[[watch]] w") && err.contains(says),
            "{code}: {err}"
        );
        let started = herald([
            "--store",
            ":memory:",
            "up",
            "--admin",
            "",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .await;
        assert_eq!(
            started.status.code(),
            Some(64),
            "up refuses it too: {started:?}"
        );
    }
    // A NameError's line and column.
    std::fs::write(&cfg, up_cfg("x = 1\nundefined_name")).unwrap();
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2, column 1"), "{err}");
    // A call to a name only a server's tool could have: a warning, not a refusal.
    std::fs::write(&cfg, up_cfg("memo__memo_get(key='k')")).unwrap();
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("fine if a server offers a tool"),
        "{out:?}"
    );
    // A fine filter passes.
    std::fs::write(&cfg, up_cfg("event['key']")).unwrap();
    let out = herald(["check", cfg.to_str().unwrap()]).await;
    assert!(out.status.success(), "{out:?}");

    // A `herald watch --config` file is recognised as one, and its filters dry-run too.
    let watch = dir.path().join("watch.toml");
    std::fs::write(
        &watch,
        "[[server]]\nhttp = \"http://127.0.0.1:8750/mcp\"\n\n\
         [[watch]]\nname = \"n\"\nuri = \"memo://notes\"\non_event = \"undefined_name\"\n",
    )
    .unwrap();
    let out = herald(["check", watch.to_str().unwrap()]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("NameError"), "{err}");
    std::fs::write(
        &watch,
        "[[server]]\nhttp = \"http://127.0.0.1:8750/mcp\"\n\n\
         [[watch]]\nname = \"n\"\nuri = \"memo://notes\"\n",
    )
    .unwrap();
    let out = herald(["check", watch.to_str().unwrap()]).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok (herald watch: 1 server, 1 watch)"),
        "{out:?}"
    );
    // --kind names it: read as a gateway's, the same file is refused ([[server]] is not a key).
    let out = herald(["check", "--kind", "gateway", watch.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

/// `herald up` with `[memo]` on a NATS server that is not up yet used to exit; now memo is a
/// slug that starts once NATS answers (until then `/ready` names it), and its watch follows.
#[tokio::test]
async fn memo_on_a_nats_server_that_starts_later_starts_once_it_answers() {
    let mut nats = crate::nats::NatsServer::start().await;
    nats.kill().await;
    let dir = TempDir::new("boot-nats");
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n\
             [memo]\nbackend = \"{}\"\nnats_bucket = \"later\"\n\n\
             [[watch]]\nname = \"notes\"\nuri = \"memo://notes\"\n",
            nats.url()
        ),
    )
    .unwrap();
    let mut up = up(&cfg, &[]).await;
    let (code, ready) = admin(&up.admin, "/ready").await;
    assert_eq!(code, 503, "{ready}");
    let waiting = ready["upstreams_never_connected"].to_string();
    assert!(
        waiting.contains("memo") && waiting.contains("cannot start yet"),
        "{ready}"
    );

    nats.start_again().await;
    let other = crate::nats::memo_on(&nats, "later").await;
    let c = crate::watch::memo_client(&other.http_url()).await;
    let mut noticed = false;
    for i in 0..20 {
        // Each round waits for a notice a while, which paces the writes until memo and its
        // watch have started.
        call(&c, "memo_set", serde_json::json!({"key": "k", "value": i})).await;
        if let Ok(n) = tokio::time::timeout(std::time::Duration::from_secs(2), up.notice()).await {
            assert_eq!(n["watch"], "notes", "{n}");
            noticed = true;
            break;
        }
    }
    assert!(
        noticed,
        "memo started once NATS answered, and its watch with it"
    );
    let (code, ready) = admin(&up.admin, "/ready").await;
    assert_eq!(code, 200, "{ready}");
}

/// A role publishing its event logs (`--publish-events`) to a NATS server that is not up yet
/// used to exit: now it serves, `/ready` names the publisher until NATS answers, and what it
/// wrote meanwhile reaches a gateway elsewhere once it does.
#[tokio::test]
async fn a_publisher_whose_nats_starts_later_serves_and_publishes_once_it_answers() {
    let mut nats = crate::nats::NatsServer::start().await;
    nats.kill().await;
    let url = nats.url();
    let mut memo = Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "memo",
            "--http",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--publish-events",
            &url,
            "--publish-as",
            "late",
        ],
        &[("HERALD_EVENTS_KEY", crate::nats::EVENTS_KEY)],
    )
    .await;
    let admin = memo.admin_url();
    let admin = admin.trim_start_matches("http://");
    let (code, ready) = crate::boot::admin(admin, "/ready").await;
    assert_eq!(code, 503, "{ready}");
    assert_eq!(ready["backends_disconnected"][0], "events nats", "{ready}");
    let cm = crate::watch::memo_client(&memo.http_url()).await;
    call(
        &cm,
        "memo_set",
        serde_json::json!({"key": "early", "value": 1}),
    )
    .await;

    nats.start_again().await;
    // The publisher reaches NATS on its own backoff and says so once its catalog is there.
    memo.line_where("the catalog written", |v| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("catalog written"))
    })
    .await;
    let dir = TempDir::new("boot-publish");
    let (_gw, c) = crate::nats::gateway_on_nats(dir.path(), &url, "edge", "late").await;
    // What was written while NATS was down reaches the gateway's mirror (cursor 0: from the
    // start of what the stream holds).
    let r = crate::events::request(
        &c,
        "events/poll",
        serde_json::json!({"name": "edge__memo.changed", "cursor": "0", "timeoutMs": 10_000}),
    )
    .await
    .unwrap();
    assert_eq!(r["events"][0]["data"]["key"], "early", "{r}");
    let (code, ready) = crate::boot::admin(admin, "/ready").await;
    assert_eq!(code, 200, "{ready}");
}
