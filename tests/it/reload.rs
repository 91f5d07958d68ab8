//! Reload without a restart (issue 30, item 4): `herald reload` (the admin address's
//! `POST /reload`), SIGHUP, and systemd's `Type=notify-reload` messages; listen streams on
//! unchanged slugs held across reloads that add and remove others; a broken config refused
//! with the running one kept; a revoked token's streams ended; `herald up`'s roles and
//! watches changed one by one, unchanged ones untouched.

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::*;

/// Raw `subscriptions/listen` streams on one QUIC connection (one bidirectional stream, one
/// JSON-RPC message a line), as a client with many listens sends them.
struct QuicListens {
    _endpoint: quinn::Endpoint,
    _conn: quinn::Connection,
    send: quinn::SendStream,
    lines: mpsc::Receiver<Value>,
}

impl QuicListens {
    async fn connect(addr: &str, pin: &str) -> QuicListens {
        let trust = herald::transport::tls::ClientTrust {
            pin: Some(pin.to_owned()),
            ..Default::default()
        };
        let (endpoint, conn, send, mut recv) = herald::transport::quic::connect(
            addr,
            &trust,
            herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
        )
        .await
        .expect("QUIC connect");
        let (tx, lines) = mpsc::channel(1 << 14);
        tokio::spawn(async move {
            let mut buf: Vec<u8> = Vec::new();
            let mut chunk = vec![0u8; 1 << 16];
            while let Ok(Some(n)) = recv.read(&mut chunk).await {
                buf.extend_from_slice(&chunk[..n]);
                while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&line)
                        && tx.send(v).await.is_err()
                    {
                        return;
                    }
                }
            }
        });
        QuicListens {
            _endpoint: endpoint,
            _conn: conn,
            send,
            lines,
        }
    }

    /// Sends listens with ids `ids` on `uri`, presenting `token` when given.
    async fn listen(&mut self, ids: std::ops::Range<u64>, uri: &str, token: Option<&str>) {
        let mut meta = meta();
        if let Some(t) = token {
            meta["io.herald/token"] = t.into();
        }
        let mut batch = Vec::new();
        for id in ids {
            let rq = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
                "params": {"_meta": meta, "notifications": {"resourceSubscriptions": [uri]}}});
            batch.extend_from_slice(rq.to_string().as_bytes());
            batch.push(b'\n');
        }
        self.send.write_all(&batch).await.expect("QUIC write");
    }

    /// Sends an `events/stream` of `name` with id `id`, presenting `token`.
    async fn stream(&mut self, id: u64, name: &str, token: &str) {
        let mut meta = meta();
        meta["io.herald/token"] = token.into();
        let rq = json!({"jsonrpc": "2.0", "id": id, "method": "events/stream",
            "params": {"_meta": meta, "name": name}});
        let mut line = rq.to_string().into_bytes();
        line.push(b'\n');
        self.send.write_all(&line).await.expect("QUIC write");
    }

    /// The next message, within [`WAIT`].
    async fn next(&mut self) -> Value {
        tokio::time::timeout(WAIT, self.lines.recv())
            .await
            .expect("a message in time")
            .expect("the QUIC stream is open")
    }

    /// Waits until `n` messages of `method` have come (of distinct subscriptions); any error
    /// on the way fails the test.
    async fn count(&mut self, method: &str, n: usize) -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < n {
            let m = self.next().await;
            assert!(m.get("error").is_none(), "a stream failed: {m}");
            if m["method"] == method {
                let sub = &m["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"];
                seen.insert(sub.to_string());
            }
        }
        seen
    }
}

/// `herald gateway --config CFG` on QUIC and an admin address, with room for `streams`.
async fn gateway(cfg: &std::path::Path, streams: usize) -> Server {
    let streams = streams.to_string();
    Server::spawn(&[
        "--store",
        ":memory:",
        "gateway",
        "--config",
        cfg.to_str().unwrap(),
        "--quic",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--max-listen-streams",
        &streams,
    ])
    .await
}

/// `herald reload --admin ADDR`: (exit code, stdout, stderr).
async fn reload(admin: &str) -> (i32, String, String) {
    let out = herald(["reload", "--admin", admin]).await;
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The measure: 1,000 listen streams on a slug that does not change, held across 10
/// reloads that add and remove other slugs and tokens; none dropped, and a change afterwards
/// reaches every one. A reload with a broken config in the middle is refused, names its line,
/// and keeps serving.
#[tokio::test]
async fn a_thousand_streams_on_an_unchanged_slug_survive_ten_reloads_and_a_broken_one() {
    init();
    const STREAMS: usize = 1000;
    let memo = Memo::start(Via::Http).await;
    let herald::transport::target::Target::Http(memo_url) = &memo.target else {
        unreachable!()
    };
    let dir = TempDir::new("reload-streams");
    let cfg = dir.path().join("gateway.toml");
    let slugs: Vec<u16> = (0..=10).map(|_| closed_port()).collect();
    let write = |round: usize| {
        let mut text = format!(
            "[[slug]]\nname = \"m\"\nhttp = \"{memo_url}\"\n\n\
             [[token]]\nname = \"keep\"\nsha256 = \"{}\"\nslugs = [\"m\"]\n",
            sha("keep-token")
        );
        // Another slug and another token each round, the last round's gone.
        text.push_str(&format!(
            "\n[[slug]]\nname = \"x{round}\"\nhttp = \"http://127.0.0.1:{}/mcp\"\n\n\
             [[token]]\nname = \"t{round}\"\nsha256 = \"{}\"\nslugs = [\"m\", \"x{round}\"]\n",
            slugs[round],
            sha(&format!("token-{round}"))
        ));
        std::fs::write(&cfg, text).unwrap();
    };
    write(0);
    let gw = gateway(&cfg, STREAMS + 10).await;
    let admin = gw.listening["admin"].as_str().unwrap().to_owned();
    let mut quic = QuicListens::connect(&gw.quic_addr(), &gw.fingerprint()).await;
    quic.listen(1..STREAMS as u64 + 1, "memo://notes", Some("keep-token"))
        .await;
    quic.count("notifications/subscriptions/acknowledged", STREAMS)
        .await;

    for round in 1..=10 {
        write(round);
        let (code, out, err) = reload(&admin).await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&format!("slug x{round} added")), "{out}");
        assert!(
            out.contains(&format!("slug x{} removed", round - 1)),
            "{out}"
        );
        assert!(out.contains(&format!("token t{round} added")), "{out}");
        assert!(
            out.contains(&format!("token t{} revoked", round - 1)),
            "{out}"
        );
        assert!(
            !out.contains("ended"),
            "no stream of keep lost access: {out}"
        );
        if round == 5 {
            // A broken config: refused, with its line, and the running one kept.
            std::fs::write(&cfg, "[[slug]]\nname = \"m\"\nhtp = 1\n").unwrap();
            let (code, out, err) = reload(&admin).await;
            assert_eq!(code, 1, "{out}{err}");
            assert!(
                err.contains("reload refused, the running config is kept"),
                "{err}"
            );
            assert!(err.contains("line 3"), "{err}");
            write(round);
            let (code, out, err) = reload(&admin).await;
            assert_eq!(code, 0, "{out}{err}");
            assert!(out.contains("nothing changed"), "{out}");
        }
    }
    let conn = memo.client().await;
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
    let updated = quic.count("notifications/resources/updated", STREAMS).await;
    assert_eq!(updated.len(), STREAMS);

    let status = reqwest::get(format!("http://{admin}/status"))
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(status["reloads"]["applied"], 11, "{status}");
    assert_eq!(status["reloads"]["refused"], 1, "{status}");
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("herald_reload_total{result=\"applied\"} 11")
            && metrics.contains("herald_reload_total{result=\"refused\"} 1"),
        "{metrics}"
    );
}

/// A reload that revokes a token ends that token's streams at once (an error naming the
/// reason, so the client knows to listen again with another), and only those.
#[tokio::test]
async fn a_reload_that_revokes_a_token_ends_its_streams_and_only_those() {
    init();
    let memo = Memo::start(Via::Http).await;
    let herald::transport::target::Target::Http(memo_url) = &memo.target else {
        unreachable!()
    };
    let dir = TempDir::new("reload-revoke");
    let cfg = dir.path().join("gateway.toml");
    let token = |name: &str| {
        format!(
            "\n[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nslugs = [\"m\"]\n",
            sha(name)
        )
    };
    let slug = format!("[[slug]]\nname = \"m\"\nhttp = \"{memo_url}\"\n");
    std::fs::write(&cfg, format!("{slug}{}{}", token("alice"), token("bob"))).unwrap();
    let gw = gateway(&cfg, 64).await;
    let admin = gw.listening["admin"].as_str().unwrap().to_owned();
    let mut alice = QuicListens::connect(&gw.quic_addr(), &gw.fingerprint()).await;
    let mut bob = QuicListens::connect(&gw.quic_addr(), &gw.fingerprint()).await;
    alice.listen(1..2, "memo://notes", Some("alice")).await;
    bob.listen(1..2, "memo://notes", Some("bob")).await;
    alice
        .count("notifications/subscriptions/acknowledged", 1)
        .await;
    bob.count("notifications/subscriptions/acknowledged", 1)
        .await;

    std::fs::write(&cfg, format!("{slug}{}", token("alice"))).unwrap();
    let (code, out, err) = reload(&admin).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("token bob revoked"), "{out}");
    assert!(out.contains("1 listen stream ended"), "{out}");
    let ended = bob.next().await;
    assert_eq!(ended["id"], 1, "{ended}");
    assert_eq!(ended["error"]["code"], -32024, "{ended}");
    assert_eq!(ended["error"]["data"]["reason"], "revoked", "{ended}");
    // And bob's token no longer opens one (the URI is left out of the acknowledgment).
    bob.listen(2..3, "memo://notes", Some("bob")).await;
    let refused = bob.next().await;
    assert!(
        refused["params"]["notifications"]["resourceSubscriptions"].is_null(),
        "{refused}"
    );

    let conn = memo.client().await;
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
    alice.count("notifications/resources/updated", 1).await;
}

/// `--quic` given, `http` from the config: a reload may change the config's `quic` (the flag
/// wins and nothing moves), but a change of its `http` or `[events]` is refused, named, and
/// the running gateway kept.
#[tokio::test]
async fn a_reload_refuses_the_configs_own_address_when_only_the_other_was_a_flag() {
    init();
    let dir = TempDir::new("reload-addrs");
    let cfg = dir.path().join("gateway.toml");
    let slug = format!(
        "[[slug]]\nname = \"m\"\nhttp = \"http://127.0.0.1:{}/mcp\"\n",
        closed_port()
    );
    // `http = ""`: off, as in herald up's [listen].
    std::fs::write(&cfg, format!("http = \"\"\nquic = \"127.0.0.1:1\"\n{slug}")).unwrap();
    let gw = gateway(&cfg, 8).await;
    assert!(gw.listening["http"].is_null(), "{}", gw.listening);
    let admin = gw.listening["admin"].as_str().unwrap().to_owned();

    std::fs::write(&cfg, format!("http = \"\"\nquic = \"127.0.0.1:2\"\n{slug}")).unwrap();
    let (code, out, err) = reload(&admin).await;
    assert_eq!(
        code, 0,
        "the config's quic is not the one served: {out}{err}"
    );

    std::fs::write(&cfg, format!("http = \"127.0.0.1:0\"\n{slug}")).unwrap();
    let (code, out, err) = reload(&admin).await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("http changed (off to 127.0.0.1:0)"), "{err}");

    std::fs::write(&cfg, format!("[events]\nprofile = \"chatgpt\"\n{slug}")).unwrap();
    let (code, out, err) = reload(&admin).await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("[events] changed"), "{err}");
}

/// Event streams through the gateway are checked at every delivery: after a reload revokes
/// bob's token, the next event reaches alice's stream and ends bob's with `terminated`
/// (-32024), though both waited on the same upstream poll.
#[tokio::test]
async fn a_revoked_token_gets_no_more_events_and_its_stream_is_terminated() {
    init();
    let memo = Memo::start(Via::Http).await;
    let herald::transport::target::Target::Http(memo_url) = &memo.target else {
        unreachable!()
    };
    let dir = TempDir::new("reload-revoke-events");
    let cfg = dir.path().join("gateway.toml");
    let token = |name: &str| {
        format!(
            "\n[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nslugs = [\"m\"]\n",
            sha(name)
        )
    };
    let slug = format!("[[slug]]\nname = \"m\"\nhttp = \"{memo_url}\"\n");
    std::fs::write(&cfg, format!("{slug}{}{}", token("alice"), token("bob"))).unwrap();
    let gw = gateway(&cfg, 64).await;
    let admin = gw.listening["admin"].as_str().unwrap().to_owned();
    let mut alice = QuicListens::connect(&gw.quic_addr(), &gw.fingerprint()).await;
    let mut bob = QuicListens::connect(&gw.quic_addr(), &gw.fingerprint()).await;
    alice.stream(1, "m__memo.changed", "alice").await;
    bob.stream(1, "m__memo.changed", "bob").await;
    alice.count("notifications/events/active", 1).await;
    bob.count("notifications/events/active", 1).await;
    std::fs::write(&cfg, format!("{slug}{}", token("alice"))).unwrap();
    let (code, out, err) = reload(&admin).await;
    assert_eq!(code, 0, "{out}{err}");
    let conn = memo.client().await;
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
    let e = loop {
        let m = alice.next().await;
        if m["method"] == "notifications/events/event" {
            break m;
        }
    };
    assert_eq!(e["params"]["data"]["key"], "k");
    let ended = loop {
        let m = bob.next().await;
        assert_ne!(
            m["method"], "notifications/events/event",
            "bob got an event: {m}"
        );
        if m["method"] == "notifications/events/terminated" {
            break m;
        }
    };
    assert_eq!(ended["params"]["error"]["code"], -32024, "{ended}");
    let result = bob.next().await;
    assert_eq!(
        result["id"], 1,
        "the server ends the stream with its result: {result}"
    );
    assert_eq!(result["result"]["resultType"], "complete");
}

/// `herald up` reloads: a role added (file), a watch added and a watch removed,
/// the unchanged memo role and its watch untouched (its next change is still noticed); a
/// change to `[listen]` is refused as needing a restart.
#[tokio::test]
async fn herald_up_reloads_roles_and_watches_one_by_one() {
    init();
    let dir = TempDir::new("reload-up");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let cfg = dir.path().join("up.toml");
    // An outside server too, unchanged by the reload: its watch must not notice the reload.
    let ext = Memo::start(Via::Http).await;
    let herald::transport::target::Target::Http(ext_url) = &ext.target else {
        unreachable!()
    };
    let head = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n[memo]\n\n\
         [[slug]]\nname = \"ext\"\nhttp = \"{ext_url}\"\n\n\
         [[watch]]\nname = \"notes\"\nuri = \"memo+memo://notes\"\n\n\
         [[watch]]\nname = \"ext-notes\"\nuri = \"ext+memo://notes\"\n"
    );
    std::fs::write(
        &cfg,
        format!("{head}\n[[watch]]\nname = \"log\"\nuri = \"memo+memo://log\"\n"),
    )
    .unwrap();
    let mut up = crate::up::up(&cfg, &[]).await;
    let file_uri = format!("file://{}/hello.txt", data.display());
    std::fs::write(data.join("hello.txt"), "one").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "{head}\n[file]\nroots = [{:?}]\n\n[[watch]]\nname = \"hello\"\nuri = {file_uri:?}\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    let (code, out, err) = reload(&up.admin).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("role file added"), "{out}");
    assert!(out.contains("watch log removed"), "{out}");
    assert!(out.contains("watch hello added"), "{out}");
    assert!(
        !out.contains("memo") && !out.contains("notes") && !out.contains("ext"),
        "memo, the outside server and their watches are unchanged: {out}"
    );
    assert!(!out.contains("ended"), "no stream lost access: {out}");

    // The new watch notices its file; the old one still notices memo.
    std::fs::write(data.join("hello.txt"), "two").unwrap();
    let n = up.notice().await;
    assert_eq!(n["watch"], "hello", "{n}");
    let c = crate::watch::memo_client(&up.url).await;
    let set = rmcp::model::CallToolRequestParams::new("memo__memo_set")
        .with_arguments(args(json!({"key": "k", "value": 1})));
    c.call_tool(set).await.unwrap();
    let n = up.notice().await;
    assert_eq!(n["watch"], "notes", "{n}");
    // The outside server's watch runs on as it was.
    call(
        &ext.client().await,
        "memo_set",
        json!({"key": "e", "value": 1}),
    )
    .await;
    let n = up.notice().await;
    assert_eq!(n["watch"], "ext-notes", "{n}");

    // A role whose table changes is started anew on the same store: its notes are still
    // there, and its watch, ended with it, resubscribes and notices the next change.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("[memo]\n", "[memo]\nring_capacity = 512\n"),
    )
    .unwrap();
    let (code, out, err) = reload(&up.admin).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("role memo changed"), "{out}");
    assert!(
        !out.contains("ext"),
        "the outside server is unchanged: {out}"
    );
    let c = crate::watch::memo_client(&up.url).await;
    let (notes, _) = read_json(&c, "memo+memo://notes").await;
    assert_eq!(
        notes["k"], 1,
        "the notes outlive the role's restart: {notes}"
    );
    let set = rmcp::model::CallToolRequestParams::new("memo__memo_set")
        .with_arguments(args(json!({"key": "k2", "value": 2})));
    c.call_tool(set).await.unwrap();
    let n = up.notice().await;
    assert_eq!(n["watch"], "notes", "{n}");
    assert!(n["text"].as_str().unwrap().contains("k2"), "{n}");

    // [listen] cannot move live.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("127.0.0.1:0", "127.0.0.1:1")).unwrap();
    let (code, _, err) = reload(&up.admin).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("[listen] http changed") && err.contains("restart"),
        "{err}"
    );
}

/// A server role has no config to reload: SIGHUP (whose default action would end it) is
/// answered in the log, and the role serves on.
#[tokio::test]
async fn sighup_to_a_role_without_a_config_is_answered_and_ends_nothing() {
    init();
    let mut memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &memo.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    memo.line_where("that it has nothing to reload", |v| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("no config to reload"))
    })
    .await;
    let conn = herald::transport::client::connect(
        &herald::transport::target::Target::Http(memo.http_url()),
        &Default::default(),
        herald::transport::client::client_config(),
        1 << 20,
    )
    .await
    .expect("memo still serves");
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
}
