//! `herald watch` end to end against `herald memo` over stdio, HTTP and QUIC: notices on
//! stdout, the NDJSON log on stderr, resubscribe, failure, limits and --watch-state.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::support::*;

/// A running `herald watch`, its stdout notices and stderr lines as channels.
pub struct Watch {
    child: Child,
    notices: mpsc::UnboundedReceiver<Value>,
    log: mpsc::UnboundedReceiver<String>,
}

impl Watch {
    pub fn spawn(store: &str, args: &[&str]) -> Watch {
        Watch::spawn_env(store, args, &[])
    }

    /// [`Watch::spawn`] with `env` set (`HERALD_TOKEN`, say).
    pub fn spawn_env(store: &str, args: &[&str], env: &[(&str, &str)]) -> Watch {
        init();
        let mut cmd = tokio::process::Command::new(bin());
        cmd.envs(env.iter().copied());
        cmd.args(["-v", "--store", store, "watch"]);
        if !args.contains(&"--debounce-ms") {
            cmd.args(["--debounce-ms", "200"]);
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (ntx, notices) = mpsc::unbounded_channel();
        let (ltx, log) = mpsc::unbounded_channel();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(l)) = out.next_line().await {
                let _ = ntx.send(serde_json::from_str(&l).unwrap_or(Value::String(l)));
            }
        });
        let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(l)) = err.next_line().await {
                let _ = ltx.send(l);
            }
        });
        Watch {
            child,
            notices,
            log,
        }
    }

    pub async fn notice(&mut self) -> Value {
        tokio::time::timeout(WAIT, self.notices.recv())
            .await
            .expect("a notice in time")
            .expect("herald watch still running")
    }

    /// Waits for a stderr line satisfying `pred`; returns it.
    pub async fn log_line(&mut self, pred: impl Fn(&str) -> bool) -> String {
        tokio::time::timeout(WAIT, async {
            while let Some(l) = self.log.recv().await {
                if pred(&l) {
                    return l;
                }
            }
            panic!("herald watch ended before the expected log line");
        })
        .await
        .expect("the log line in time")
    }

    pub async fn event(&mut self, event: &str, watch: &str) -> Value {
        let needle = format!("\"event\":\"{event}\"");
        let w = format!("\"watch\":\"{watch}\"");
        let l = self
            .log_line(|l| l.contains(&needle) && l.contains(&w))
            .await;
        serde_json::from_str(&l).unwrap()
    }

    /// Waits for herald watch to exit by itself; returns its status.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("exits by itself")
            .unwrap()
    }

    pub async fn terminate(mut self) {
        let pid = self.child.id().unwrap().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let st = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("exits")
            .unwrap();
        assert!(st.success(), "{st}");
    }
}

pub async fn memo_client(url: &str) -> herald::transport::client::Connection {
    Memo {
        target: herald::transport::target::Target::Http(url.to_owned()),
        trust: Default::default(),
        server: None,
    }
    .client()
    .await
}

#[tokio::test]
async fn notices_over_http() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &memo.http_url(),
            "--watch",
            "notes=memo://notes",
            "--watch",
            "log=memo://log",
        ],
    );
    w.event("watch.subscribed", "notes").await;
    w.event("watch.subscribed", "log").await;
    let c = memo_client(&memo.http_url()).await;
    call(
        &c,
        "memo_set",
        json!({"key": "bid-1", "value": {"status": {"phase": "Deciding"}}}),
    )
    .await;
    let mut got = [w.notice().await, w.notice().await];
    got.sort_by_key(|n| n["watch"].as_str().unwrap().to_owned());
    assert_eq!(got[0]["watch"], "log");
    let added = r#"ADDED bid-1 = {"status":{"phase":"Deciding"}}"#;
    assert_eq!(got[0]["lines"], json!([added]));
    assert_eq!(got[1]["lines"], json!([added]));
    assert!(
        got[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("<watch-event name=\"notes\" uri=\"memo://notes\">")
    );
    call(
        &c,
        "memo_set",
        json!({"key": "bid-1", "value": {"status": {"phase": "Published"}}}),
    )
    .await;
    let mut got = [w.notice().await, w.notice().await];
    got.sort_by_key(|n| n["watch"].as_str().unwrap().to_owned());
    for n in &got {
        assert_eq!(
            n["lines"],
            json!([r#"MODIFIED bid-1 (status.phase: "Deciding" → "Published")"#]),
            "{n}"
        );
    }
    w.terminate().await;
}

#[tokio::test]
async fn notices_over_quic() {
    let memo = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--quic",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-quic",
            &memo.quic_addr(),
            "--tls-pin",
            &memo.fingerprint(),
            "--watch",
            "notes=memo://notes",
        ],
    );
    w.event("watch.subscribed", "notes").await;
    let c = memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "owner", "value": "ana"})).await;
    assert_eq!(w.notice().await["lines"], json!([r#"ADDED owner = "ana""#]));
    w.terminate().await;
}

#[tokio::test]
async fn notices_over_stdio() {
    // The watch runs the memo server as its child over stdio; the child also serves HTTP, so
    // the test can change notes, and its stderr (with the bound address) is in the watch's log.
    let cmd = format!(
        "{} --log-format json --store :memory: memo --stdio --http 127.0.0.1:0",
        bin()
    );
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--log-format",
            "json",
            "--mcp-stdio",
            &cmd,
            "--watch",
            "notes=memo://notes",
        ],
    );
    // The child's lines are said in the watch's own log, each naming the command it ran.
    let relayed = w
        .log_line(|l| l.contains("upstream.stderr") && l.contains("listening"))
        .await;
    let relayed: Value = serde_json::from_str(&relayed).unwrap();
    // The program, not its arguments (where secrets go).
    assert_eq!(
        relayed["upstream"],
        json!(format!("stdio:{} …", bin())),
        "{relayed}"
    );
    let listening: Value = serde_json::from_str(relayed["message"].as_str().unwrap()).unwrap();
    let url = listening["http_url"].as_str().unwrap().to_owned();
    w.event("watch.subscribed", "notes").await;
    let c = memo_client(&url).await;
    call(&c, "memo_set", json!({"key": "todo", "value": "milk"})).await;
    assert_eq!(w.notice().await["lines"], json!([r#"ADDED todo = "milk""#]));
    call(&c, "memo_set", json!({"key": "todo", "value": "eggs"})).await;
    assert_eq!(
        w.notice().await["lines"],
        json!([r#"MODIFIED todo: "milk" → "eggs""#])
    );
    w.terminate().await;
}

#[tokio::test]
async fn two_writes_in_one_debounce_window_make_one_notice() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &memo.http_url(),
            "--watch",
            "log=memo://log",
            "--debounce-ms",
            "1500",
        ],
    );
    w.event("watch.subscribed", "log").await;
    let c = memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "owner", "value": "ana"})).await;
    call(&c, "memo_set", json!({"key": "todo", "value": "milk"})).await;
    let n = w.notice().await;
    assert_eq!(
        n["lines"],
        json!([r#"ADDED owner = "ana""#, r#"ADDED todo = "milk""#]),
        "{n}"
    );
    w.terminate().await;
}

#[tokio::test]
async fn a_restarted_server_is_resubscribed_and_notices_continue() {
    let dir = TempDir::new("watch-restart");
    let store = dir.path().join("memo.redb");
    let store = store.to_str().unwrap();
    let memo = Server::spawn(&["--store", store, "memo", "--http", "127.0.0.1:0"]).await;
    let addr = memo.listening["http"].as_str().unwrap().to_owned();
    let url = memo.http_url();
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &url,
            "--watch",
            "notes=memo://notes",
            "--resubscribe-base-ms",
            "100",
            "--resubscribe-attempts",
            "8",
        ],
    );
    w.event("watch.subscribed", "notes").await;
    assert!(memo.terminate().await.success());
    w.event("watch.resubscribing", "notes").await;
    let _memo = Server::spawn(&["--store", store, "memo", "--http", &addr]).await;
    // Subscribed again (the second watch.subscribed carries the attempt).
    let again = w.event("watch.subscribed", "notes").await;
    assert!(again["attempt"].as_u64().is_some(), "{again}");
    let c = memo_client(&url).await;
    call(&c, "memo_set", json!({"key": "after", "value": 1})).await;
    assert_eq!(w.notice().await["lines"], json!(["ADDED after = 1"]));
    w.terminate().await;
}

/// `herald watch` used to keep running with no watch left, so systemd's `Restart=on-failure`
/// never fired: now the last watch failing for good ends it, with status 1 and the reason.
#[tokio::test]
async fn a_server_that_never_returns_fails_the_watch_and_herald_watch_exits_1() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &memo.http_url(),
            "--watch",
            "notes=memo://notes",
            "--resubscribe-base-ms",
            "20",
            "--resubscribe-attempts",
            "3",
        ],
    );
    w.event("watch.subscribed", "notes").await;
    assert!(memo.terminate().await.success());
    let failed = w.event("watch.failed", "notes").await;
    assert_eq!(failed["attempts"], 3);
    let n = w.notice().await;
    assert_eq!(n["watch"], "notes");
    let line = n["lines"][0].as_str().unwrap();
    assert!(line.starts_with("watch failed"), "{n}");
    assert!(
        line.ends_with("run herald watch again (it exits once no watch runs)"),
        "{n}"
    );
    let said = w.log_line(|l| l.starts_with("herald: ")).await;
    assert!(
        said.starts_with("herald: no watch is left running: notes (memo://notes): the subscription ended and 3 resubscribe attempts failed (last error: "),
        "{said}"
    );
    assert_eq!(w.exited().await.code(), Some(1));
}

#[tokio::test]
async fn the_sixth_watch_is_refused_with_a_clear_error() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = memo.http_url();
    let mut args = vec![
        "--store".to_string(),
        ":memory:".into(),
        "watch".into(),
        "--mcp-http".into(),
        url,
    ];
    for i in 0..6 {
        args.push("--watch".into());
        args.push(format!("w{i}=memo://notes"));
    }
    let out = herald(&args).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("watch w5 (memo://notes) cannot start: at most 5 watches"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unknown_uri_fails_the_start_with_the_servers_error() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let out = herald([
        "--store",
        ":memory:",
        "watch",
        "--mcp-http",
        &memo.http_url(),
        "--watch",
        "x=memo://nope",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown resource memo://nope"), "{err}");
}

#[tokio::test]
async fn watch_state_restores_the_watches_after_a_restart() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = memo.http_url();
    let dir = TempDir::new("watch-state");
    let store = dir.path().join("watch.redb");
    let store = store.to_str().unwrap();
    let mut w = Watch::spawn(
        store,
        &[
            "--mcp-http",
            &url,
            "--watch-state",
            "--watch",
            "notes=memo://notes",
        ],
    );
    w.event("watch.subscribed", "notes").await;
    w.terminate().await;

    // Regression: the same --watch again beside the restored one used to fail as a duplicate.
    let mut w = Watch::spawn(
        store,
        &[
            "--mcp-http",
            &url,
            "--watch-state",
            "--watch",
            "notes=memo://notes",
        ],
    );
    let restore = w.notice().await;
    assert_eq!(restore["watch"], "herald");
    assert_eq!(restore["lines"][0], "restored notes (memo://notes)");
    let c = memo_client(&url).await;
    call(&c, "memo_set", json!({"key": "k", "value": 1})).await;
    let n = w.notice().await;
    assert_eq!(
        (n["watch"].clone(), n["lines"].clone()),
        (json!("notes"), json!(["ADDED k = 1"]))
    );
    w.terminate().await;
}

#[tokio::test]
async fn exec_runs_a_command_per_notice_and_retries_a_failure() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("watch-exec");
    // Fails on its first run, then prints the watch, the URI and the notice it was given.
    let cmd = format!(
        "test -e {d}/once || {{ touch {d}/once; exit 3; }}; printf 'exec %s %s\\n' \"$HERALD_WATCH\" \"$HERALD_URI\"; cat",
        d = dir.path().display()
    );
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &memo.http_url(),
            "--watch",
            "notes=memo://notes",
            "--exec",
            &cmd,
        ],
    );
    w.event("watch.subscribed", "notes").await;
    let c = memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "owner", "value": "ana"})).await;
    assert_eq!(w.notice().await, json!("exec notes memo://notes"));
    assert_eq!(
        w.notice().await,
        json!("<watch-event name=\"notes\" uri=\"memo://notes\">")
    );
    assert_eq!(w.notice().await, json!(r#"ADDED owner = "ana""#));
    w.log_line(|l| l.contains("notice delivery failed; retrying"))
        .await;
    w.terminate().await;
}

#[tokio::test]
async fn webhook_posts_each_notice_and_retries_a_failure() {
    use axum::extract::State;
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(
                |State((tx, calls)): State<(
                    mpsc::UnboundedSender<Value>,
                    std::sync::Arc<std::sync::atomic::AtomicUsize>,
                )>,
                 axum::Json(body): axum::Json<Value>| async move {
                    if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                        return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    let _ = tx.send(body);
                    axum::http::StatusCode::OK
                },
            ),
        )
        .with_state((tx, calls.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let mut w = Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &memo.http_url(),
            "--watch",
            "log=memo://log",
            "--webhook",
            &hook,
        ],
    );
    w.event("watch.subscribed", "log").await;
    let c = memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "k", "value": 1})).await;
    let body = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("the webhook in time")
        .unwrap();
    assert_eq!(body["watch"], "log");
    assert_eq!(body["lines"], json!(["ADDED k = 1"]));
    assert!(
        body["text"]
            .as_str()
            .unwrap()
            .contains("<watch-event name=\"log\"")
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one failure, one retry"
    );
    w.terminate().await;
}

#[tokio::test]
async fn a_legacy_server_serves_tools_but_cannot_be_watched() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/legacy_server.py"
    );
    let cmd = format!("python3 {fixture}");
    let ls = herald(["ls", "--mcp-stdio", &cmd]).await;
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    assert!(String::from_utf8_lossy(&ls.stdout).contains("echo"));
    let out = herald([
        "--store",
        ":memory:",
        "watch",
        "--mcp-stdio",
        &cmd,
        "--watch",
        "t=legacy://thing",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("watching needs protocol version 2026-07-28"),
        "{err}"
    );
}

/// The demo used to print four lines per change: it watched both memo://notes and memo://log,
/// and each notice was logged again as `watch.notice` on stderr.
#[tokio::test]
async fn herald_up_prints_one_notice_per_change_in_the_demo() {
    init();
    let demo = TempDir::new("up-watch-demo");
    let mut child = tokio::process::Command::new(bin())
        .args([
            "--log-format",
            "json",
            "--store",
            ":memory:",
            "up",
            "--http",
            "127.0.0.1:0",
            "--quic",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--demo-dir",
            demo.path().to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut early = Vec::new();
    let url = tokio::time::timeout(WAIT, async {
        loop {
            let l = err
                .next_line()
                .await
                .unwrap()
                .expect("herald up is running");
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["event"] == "listening"
            {
                return v["http_url"].as_str().unwrap().to_owned();
            }
            early.push(l);
        }
    })
    .await
    .expect("herald up says where it listens");
    // Slack inert is what the demo is: said, not warned about.
    let slack: Vec<&String> = early
        .iter()
        .filter(|l| l.contains("slack events are not configured"))
        .collect();
    assert!(
        slack.len() == 1 && slack[0].contains("\"level\":\"INFO\""),
        "{early:?}"
    );
    let stderr = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Ok(Some(l)) = err.next_line().await {
            rest.push(l);
        }
        rest
    });
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    // Piped, stdout is NDJSON: every line a notice.
    let mut next = async || -> Value {
        let l = tokio::time::timeout(WAIT, out.next_line())
            .await
            .expect("a notice in time")
            .unwrap()
            .expect("herald up still runs");
        serde_json::from_str(&l).unwrap()
    };
    let c = memo_client(&url).await;
    // The demo's watches start right after the listening line; keep writing until the first
    // notice shows they are live (each write is a distinct change).
    let mut i = 0;
    loop {
        call(&c, "memo__memo_set", json!({"key": "demo", "value": i})).await;
        i += 1;
        if tokio::time::timeout(std::time::Duration::from_secs(5), next())
            .await
            .is_ok()
        {
            break;
        }
        assert!(i < 20, "no notices from herald up");
    }
    // One change, one notice: the notice after m1's is m2's, not m1's again from another
    // watch. (A late notice of the warm-up may come first, or share m1's.)
    call(&c, "memo__memo_set", json!({"key": "m1", "value": 1})).await;
    let m1 = loop {
        let n = next().await;
        let lines = n["lines"].as_array().unwrap();
        if lines.contains(&json!("ADDED m1 = 1")) {
            break n;
        }
        assert!(
            lines.iter().all(|l| l.as_str().unwrap().contains(" demo")),
            "only the warm-up comes before m1: {n}"
        );
    };
    assert_eq!(m1["watch"], "notes", "{m1}");
    assert!(
        m1["lines"]
            .as_array()
            .unwrap()
            .contains(&json!("ADDED m1 = 1")),
        "{m1}"
    );
    call(&c, "memo__memo_set", json!({"key": "m2", "value": "two"})).await;
    let m2 = next().await;
    assert_eq!(
        (m2["watch"].clone(), m2["lines"].clone()),
        (json!("notes"), json!([r#"ADDED m2 = "two""#])),
        "{m2}"
    );
    let _ = child.start_kill();
    let _ = child.wait().await;
    let stderr = stderr.await.unwrap();
    assert!(
        !stderr.iter().any(|l| l.contains("watch.notice")),
        "notices are not logged again without -v: {stderr:?}"
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("watching 2 resources on 1 server (gateway)")),
        "{stderr:?}"
    );
}

/// A pseudo-terminal: `(master, slave)`. What a child writes to the slave is read from the
/// master (with `\r\n` for each newline).
pub(crate) fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors it opened into the two ints; each is then owned
    // by one File.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are open and owned by nothing else.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    }
}

/// On a terminal a notice prints as its `<watch-event>` block, for a person; `--json` keeps
/// NDJSON there too (and piped stdout is NDJSON, as every other test here reads it).
#[tokio::test]
async fn on_a_terminal_notices_print_as_blocks_unless_json_is_asked() {
    init();
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let c = memo_client(&memo.http_url()).await;
    for (i, json) in [false, true].into_iter().enumerate() {
        let (master, slave) = pty();
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(["-v", "--store", ":memory:", "watch", "--debounce-ms", "0"])
            .args([
                "--mcp-http",
                &memo.http_url(),
                "--watch",
                "notes=memo://notes",
            ]);
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(slave))
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // The terminal is read on a thread of its own (a blocking read), a line at a time.
        let (tx, mut screen) = mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for l in std::io::BufReader::new(master).lines() {
                let Ok(l) = l else { return };
                if tx.send(l.trim_end_matches('\r').to_owned()).is_err() {
                    return;
                }
            }
        });
        let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(l) = err.next_line().await.unwrap() {
                if l.contains("\"event\":\"watch.subscribed\"") {
                    return;
                }
            }
            panic!("herald watch ended before subscribing");
        })
        .await
        .expect("subscribed in time");
        tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
        let key = format!("k{i}");
        call(&c, "memo_set", json!({"key": key, "value": 1})).await;
        let mut seen = Vec::new();
        let done = |seen: &[String]| {
            seen.last().is_some_and(|l| {
                if json {
                    l.starts_with('{')
                } else {
                    l == "</watch-event>"
                }
            })
        };
        while !done(&seen) {
            let l = tokio::time::timeout(WAIT, screen.recv())
                .await
                .expect("the notice on the terminal in time")
                .expect("the terminal is open");
            seen.push(l);
        }
        if json {
            let v: Value = serde_json::from_str(seen.last().unwrap()).unwrap();
            assert_eq!(v["lines"], json!([format!("ADDED {key} = 1")]), "{seen:?}");
        } else {
            assert_eq!(
                seen[seen.len() - 3..],
                [
                    "<watch-event name=\"notes\" uri=\"memo://notes\">".to_owned(),
                    format!("ADDED {key} = 1"),
                    "</watch-event>".to_owned()
                ],
                "{seen:?}"
            );
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}
