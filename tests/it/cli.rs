//! What a person meets at the command line, off the happy path: a closed stdout ends herald
//! quietly, a store another process holds is named with its holder's pid, roles that need no
//! store run beside one that holds it, logs in a pipe carry no colour, `--log-format json` is
//! JSON on every stderr line, and `herald ls` and a server's error read as text.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::kube_fake::FakeApi;
use crate::support::*;

/// Runs `herald ARGS` (with `env`) with its stdout a pipe whose read end is closed before
/// herald writes anything, as in `herald … | true`, bounded by [`WAIT`].
async fn with_stdout_closed(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let run = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output();
    tokio::time::timeout(WAIT, run)
        .await
        .expect("herald finishes in time")
        .expect("herald runs")
}

/// The regression: `herald ls … | true` panicked ("failed printing to stdout: Broken pipe",
/// status 101). Every command that prints ends with status 0 and says nothing.
#[tokio::test]
async fn a_closed_stdout_ends_herald_quietly_with_status_0() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = memo.http_url();
    for args in [
        vec!["ls", "--mcp-http", &url],
        vec!["ls", "--json", "--mcp-http", &url],
        vec!["read", "memo://notes", "--mcp-http", &url],
        vec!["call", "memo_set", "key=a", "value=1", "--mcp-http", &url],
        vec!["completions", "bash"],
        vec!["man"],
    ] {
        let out = with_stdout_closed(&args, &[]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "herald {args:?}: {stderr}");
        assert!(stderr.is_empty(), "herald {args:?} said: {stderr}");
    }
    memo.terminate().await;
}

/// `herald watch`'s notices (the stdout sink's own thread): the first notice that finds stdout
/// closed ends the watch with status 0, not a watch left running with nowhere to print.
#[tokio::test]
async fn a_watch_whose_stdout_closed_ends_with_status_0() {
    let memo = Memo::start(Via::Http).await;
    let url = memo.server.as_ref().unwrap().http_url();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut watch = Command::new(bin())
        .args(["-v", "--store", ":memory:", "watch", "--mcp-http", &url])
        .args(["--watch", "n=memo://notes", "--debounce-ms", "10"])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    let subscribed = tokio::time::timeout(WAIT, async {
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push_str(&l);
            seen.push('\n');
            if l.contains("\"event\":\"watch.subscribed\"") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(subscribed, Ok(true), "never subscribed:\n{seen}");
    let conn = memo.client().await;
    call(&conn, "memo_set", json!({"key": "a", "value": 1})).await;
    let rest = tokio::spawn(async move {
        let mut rest = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            rest.push_str(&l);
            rest.push('\n');
        }
        rest
    });
    let status = tokio::time::timeout(WAIT, watch.wait())
        .await
        .expect("herald watch ends once its stdout is gone")
        .unwrap();
    let rest = rest.await.unwrap();
    assert_eq!(status.code(), Some(0), "{seen}{rest}");
    assert!(!rest.contains("panicked"), "{rest}");
}

/// A second herald on a store another one holds says who holds it and what to pass instead.
#[tokio::test]
async fn a_held_store_names_its_holders_pid_and_the_flags() {
    let dir = TempDir::new("held");
    let store = dir.path().join("herald.redb");
    let store = store.to_str().unwrap();
    let holder = Server::spawn(&["--store", store, "memo", "--http", "127.0.0.1:0"]).await;
    let out = herald(["--store", store, "memo", "--http", "127.0.0.1:0"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(store), "{err}");
    assert!(
        err.contains(&format!("held by herald process {}", holder.pid())),
        "{err}"
    );
    assert!(
        err.contains("--store PATH") && err.contains("--store :memory:"),
        "{err}"
    );
    holder.terminate().await;
}

/// `herald k8s` and `herald gateway` keep nothing in a store on HTTP: both start and serve
/// while another herald (as `herald up` would) holds the default store.
#[tokio::test]
async fn k8s_and_gateway_serve_beside_a_held_default_store() {
    let dir = TempDir::new("held-default");
    let state = dir.path().join("state");
    let env = [("STATE_DIRECTORY", state.to_str().unwrap())];
    let holder = Server::spawn_env(&["memo", "--http", "127.0.0.1:0"], &env).await;
    // The default store is held indeed: another role that needs it is refused.
    let refused = Command::new(bin())
        .args(["memo", "--http", "127.0.0.1:0"])
        .envs(env)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("is held by herald process"), "{err}");

    let api = FakeApi::start().await;
    let kc = api.kubeconfig(dir.path());
    let k8s = Server::spawn_env(
        &[
            "k8s",
            "--http",
            "127.0.0.1:0",
            "--kubeconfig",
            kc.to_str().unwrap(),
        ],
        &env,
    )
    .await;
    let out = herald(["read", "k8s-api://resources", "--mcp-http", &k8s.http_url()]).await;
    let read = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(read.contains("configmaps"), "{read}");

    let token = "beside-a-held-store";
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nhttp = \"{}\"\n[[token]]\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            holder.http_url(),
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()))
        ),
    )
    .unwrap();
    let gw = Server::spawn_env(
        &[
            "gateway",
            "--config",
            cfg.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
        &env,
    )
    .await;
    let out = Command::new(bin())
        .args(["ls", "--mcp-http", &gw.http_url()])
        .env("HERALD_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(listed.contains("memo__memo_set"), "{listed}");
    gw.terminate().await;
    k8s.terminate().await;
    holder.terminate().await;
}

/// Text logs into a pipe (or a file, or the journal) carry no ANSI colour codes.
#[tokio::test]
async fn logs_in_a_pipe_carry_no_colour() {
    let dir = TempDir::new("no-colour");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"memo\"\nstdio = \"{} --store :memory: memo\"\n",
            bin()
        ),
    )
    .unwrap();
    let mut child = Command::new(bin())
        .args(["--store", ":memory:", "gateway", "--config"])
        .arg(&cfg)
        .args(["--http", "127.0.0.1:0"])
        // The rule under test is the terminal's, not NO_COLOR's.
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    let listening = tokio::time::timeout(WAIT, async {
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push_str(&l);
            seen.push('\n');
            if l.contains("listening on") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(listening, Ok(true), "{seen}");
    // The gateway's note about its missing [[token]] is a tracing line (a level, colourable).
    assert!(
        seen.contains("INFO") && seen.contains("no [[token]]"),
        "{seen}"
    );
    assert!(!seen.contains('\u{1b}'), "ANSI escapes in a pipe: {seen:?}");
    let _ = child.kill().await;
}

/// With `--log-format json` every line on stderr is a log object with a timestamp and a level:
/// the admin and `listening` lines too (still read by their `event`), and a failure.
#[tokio::test]
async fn json_logs_are_json_on_every_line() {
    let memo = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    let text = memo.stderr();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    for v in &lines {
        assert!(v["timestamp"].is_string(), "{v}");
        assert!(v["level"].is_string(), "{v}");
    }
    assert!(lines.iter().any(|v| v["event"] == "admin"), "{text}");
    let listening = &memo.listening;
    assert_eq!(listening["level"], "INFO", "{listening}");
    assert_eq!(listening["role"], "memo");
    assert_eq!(listening["stdio"], false);
    assert!(listening["http"].is_string(), "{listening}");
    assert!(listening["admin"].is_string(), "{listening}");
    memo.terminate().await;

    let out = herald([
        "--log-format",
        "json",
        "ls",
        "--mcp-http",
        "http://127.0.0.1:1/mcp",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let last: Value = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .next_back()
        .unwrap_or_else(|| panic!("no failure line: {err}"));
    assert_eq!(last["level"], "ERROR", "{last}");
    assert_eq!(last["code"], 1, "{last}");
    assert!(last["timestamp"].is_string(), "{last}");
}

/// `herald ls` shows every kind the server has, and says `(none)` for one it has none of
/// (memo serves no templates), instead of an empty header.
#[tokio::test]
async fn ls_says_none_for_an_empty_section() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let out = herald(["ls", "--mcp-http", &memo.http_url()]).await;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(listed.starts_with("tools:\n  memo_"), "{listed}");
    assert!(listed.contains("\nresources:\n  memo://"), "{listed}");
    assert!(listed.ends_with("\ntemplates: (none)\n"), "{listed}");
    memo.terminate().await;
}

/// A server's error reads as its message, then its code and data, set apart: rmcp's own text
/// ran the data into the message (`…this server serves({"uri":…})`).
#[tokio::test]
async fn a_servers_error_keeps_its_data_apart() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let out = herald(["read", "memo://nope", "--mcp-http", &memo.http_url()]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("unknown resource memo://nope"), "{err}");
    assert!(
        err.contains(" (code -32602; data {\"uri\":\"memo://nope\"})"),
        "{err}"
    );
    assert!(!err.contains("serves("), "{err}");
    memo.terminate().await;
}

/// What `--help` shows a person: defaults, the global flags apart, and `herald call` naming
/// the flags that pick its server.
#[tokio::test]
async fn help_shows_defaults_and_global_options() {
    let out = herald(["watch", "--help"]).await;
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for shown in [
        "Global options:",
        "--debounce-ms <MS>",
        "[default: 3000]",
        "--filter-memory-bytes <BYTES>",
        "[default: 268435456 (256 MiB)]",
    ] {
        assert!(help.contains(shown), "{shown} in {help}");
    }
    let out = herald(["--help"]).await;
    let help = String::from_utf8_lossy(&out.stdout);
    let call = help
        .lines()
        .find(|l| l.trim_start().starts_with("call"))
        .unwrap();
    assert!(call.contains("--mcp-http"), "{call}");
}

#[tokio::test]
async fn herald_up_keeps_serving_when_its_stdout_closes() {
    init();
    let tmp = TempDir::new("up-closed-stdout");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let demo = tmp.path().join("demo");
    let mut up = Command::new(bin())
        .args(["--log-format", "json", "--store", ":memory:", "up"])
        .args([
            "--http",
            "127.0.0.1:0",
            "--quic",
            "127.0.0.1:0",
            "--admin",
            "",
        ])
        .args(["--demo-dir", demo.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(up.stderr.take().unwrap()).lines();
    let url = tokio::time::timeout(WAIT, async {
        loop {
            let l = lines.next_line().await.unwrap().expect("herald up runs");
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["event"] == "listening"
            {
                return v["http_url"].as_str().unwrap().to_owned();
            }
        }
    })
    .await
    .expect("herald up says where it listens");
    // A change makes a notice (after the demo's 3 s debounce); printing it finds stdout
    // closed.
    let set = herald([
        "call",
        "memo__memo_set",
        "key=k",
        "value=1",
        "--mcp-http",
        &url,
    ])
    .await;
    assert!(set.status.success(), "{set:?}");
    let mut said = String::new();
    let closed = tokio::time::timeout(WAIT, async {
        while let Ok(Some(l)) = lines.next_line().await {
            said.push_str(&l);
            said.push('\n');
            if l.contains("stdout is closed") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(closed, Ok(true), "never found stdout closed:\n{said}");
    // It still serves.
    let ls = herald(["ls", "--mcp-http", &url]).await;
    assert!(ls.status.success(), "{ls:?}");
    assert!(String::from_utf8_lossy(&ls.stdout).contains("memo__memo_set"));
    assert!(up.try_wait().unwrap().is_none(), "herald up ended");
}

#[tokio::test]
async fn watch_state_with_nothing_saved_says_there_is_nothing_to_watch() {
    let memo = Memo::start(Via::Http).await;
    let url = memo.server.as_ref().unwrap().http_url();
    let tmp = TempDir::new("watch-state-empty");
    let store = tmp.path().join("w.redb");
    let out = herald([
        "--store",
        store.to_str().unwrap(),
        "watch",
        "--mcp-http",
        &url,
        "--watch-state",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing to watch: the store holds no saved watch (--watch-state)"),
        "{err}"
    );
}

/// A server role started bare at a terminal says on stderr what it is doing and how to serve
/// over the network; started by a client (stdin a pipe) it says nothing.
#[tokio::test]
async fn a_bare_server_role_at_a_terminal_says_it_speaks_mcp_on_stdio() {
    init();
    let (_master, slave) = crate::watch::pty();
    let mut child = tokio::process::Command::new(bin())
        .args(["--store", ":memory:", "memo"])
        .stdin(std::process::Stdio::from(slave))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, async {
        while let Some(l) = err.next_line().await.unwrap() {
            if l.contains("stdin/stdout") {
                return l;
            }
        }
        panic!("herald memo ended without saying it speaks MCP on stdio");
    })
    .await
    .expect("the line in time");
    assert!(line.contains("--http 127.0.0.1:8750"), "{line}");
    child.kill().await.unwrap();

    // Piped (a client started it): nothing on stderr about it.
    let out = tokio::process::Command::new(bin())
        .args(["--store", ":memory:", "memo"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("stdin/stdout"), "{err}");
}

/// A server given malformed (an http:// URL to --mcp-quic, a pin that is not a fingerprint)
/// is bad usage: exit 64 and what to write instead, before any connect, in every client.
#[tokio::test]
async fn a_malformed_server_or_pin_is_bad_usage() {
    init();
    let pin = "ab".repeat(32);
    for args in [
        vec!["ls", "--mcp-quic", "http://127.0.0.1:1/mcp"],
        vec!["ls", "--mcp-quic", "127.0.0.1:1", "--tls-pin", "zz"],
        vec!["call", "memo_set", "--mcp-http", "127.0.0.1:1"],
        vec![
            "watch",
            "--mcp-quic",
            "http://x/mcp",
            "--watch",
            "n=memo://notes",
        ],
        vec![
            "watch",
            "--mcp-quic",
            "127.0.0.1:1",
            "--tls-pin",
            "nope",
            "--watch",
            "n=memo://notes",
        ],
        vec![
            "poll",
            "x",
            "--mcp-quic",
            "127.0.0.1:1",
            "--tls-pin",
            &pin[..10],
        ],
    ] {
        let out = Command::new(bin()).args(&args).output().await.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains("--mcp-quic") || err.contains("--tls-pin") || err.contains("--mcp-http"),
            "{args:?}: {err}"
        );
    }
}
