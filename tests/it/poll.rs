//! `herald poll`: one poll and `--follow` against `herald memo`, NDJSON out, a closed pipe
//! and Ctrl-C ending it quietly.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

use crate::support::*;

/// The NDJSON lines of `herald poll ARGS` run to completion.
async fn poll_once(args: &[&str]) -> (std::process::Output, Vec<Value>) {
    let mut all = vec!["poll"];
    all.extend_from_slice(args);
    let out = herald(all).await;
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    (out, lines)
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> Value {
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("herald poll still running");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

fn follow(url: &str) -> tokio::process::Child {
    Command::new(bin())
        .args(["poll", "memo.changed", "--follow", "--mcp-http", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald poll")
}

async fn exit_of(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("herald poll ends in time")
        .unwrap()
}

#[tokio::test]
async fn one_poll_prints_events_then_the_cursor() {
    let memo = Memo::start(Via::Http).await;
    let url = memo.server.as_ref().unwrap().http_url();
    // From now: no events, just where to poll from.
    let (out, lines) = poll_once(&["memo.changed", "--mcp-http", &url]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    let start = lines[0]["cursor"]
        .as_str()
        .expect("a cursor line")
        .to_owned();

    let conn = memo.client().await;
    call(&conn, "memo_set", json!({"key": "a", "value": 1})).await;
    call(&conn, "memo_set", json!({"key": "a", "value": 2})).await;
    let (out, lines) = poll_once(&["memo.changed", "--cursor", &start, "--mcp-http", &url]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    let types: Vec<&str> = lines[..2]
        .iter()
        .map(|e| e["data"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["ADDED", "MODIFIED"]);
    assert!(
        lines[0]["eventId"]
            .as_str()
            .unwrap()
            .starts_with("memo://log#")
    );
    assert_eq!(lines[0]["name"], "memo.changed");
    let last_seq = lines[1]["data"]["seq"].as_u64().unwrap();
    assert_eq!(lines[2], json!({"cursor": last_seq.to_string()}));

    // --max-events: the cursor line says more are waiting.
    let (_, lines) = poll_once(&[
        "memo.changed",
        "--cursor",
        &start,
        "--max-events",
        "1",
        "--mcp-http",
        &url,
    ])
    .await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["hasMore"], true, "{lines:?}");

    // Over stdio too: a fresh server, so from now is empty.
    let cmd = format!("{} --store :memory: memo", bin());
    let (out, lines) = poll_once(&["memo.changed", "--mcp-stdio", &cmd]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lines[0]["cursor"].is_string(), "{lines:?}");
    conn.close().await;
}

#[tokio::test]
async fn a_refused_poll_says_why_and_fails() {
    let memo = Memo::start(Via::Http).await;
    let url = memo.server.as_ref().unwrap().http_url();
    let (out, lines) = poll_once(&["memo.changed", "--arg", "color=1", "--mcp-http", &url]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(lines.is_empty());
    assert!(
        stderr.contains("polling memo.changed") && stderr.contains("color"),
        "{stderr}"
    );
    let (out, _) = poll_once(&["nope.changed", "--mcp-http", &url]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("-32023"), "{stderr}");
    let (out, _) = poll_once(&["memo.changed", "--arg", "novalue", "--mcp-http", &url]).await;
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test]
async fn follow_resumes_from_each_cursor_until_ctrl_c() {
    let memo = Memo::start(Via::Http).await;
    let url = memo.server.as_ref().unwrap().http_url();
    let conn = memo.client().await;
    let mut child = follow(&url);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = next_line(&mut lines).await;
    assert!(first["cursor"].is_string(), "{first}");

    for (i, value) in [1, 2].into_iter().enumerate() {
        call(&conn, "memo_set", json!({"key": "k", "value": value})).await;
        let event = next_line(&mut lines).await;
        assert_eq!(
            event["data"]["type"],
            if i == 0 { "ADDED" } else { "MODIFIED" },
            "{event}"
        );
        assert_eq!(event["data"]["object"], value);
        let cursor = next_line(&mut lines).await;
        assert_eq!(
            cursor,
            json!({"cursor": event["data"]["seq"].as_u64().unwrap().to_string()})
        );
    }
    let _ = std::process::Command::new("kill")
        .arg("-INT")
        .arg(child.id().unwrap().to_string())
        .status();
    let status = exit_of(&mut child).await;
    assert!(status.success(), "Ctrl-C ends a follow with 0: {status:?}");
    conn.close().await;
}

#[tokio::test]
async fn follow_ends_quietly_when_its_reader_goes_away() {
    let memo = Memo::start(Via::Http).await;
    let url = memo.server.as_ref().unwrap().http_url();
    let conn = memo.client().await;
    let mut child = follow(&url);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    next_line(&mut lines).await;
    // `| head -1`: the reader closes the pipe; the next event's line finds it closed.
    drop(lines);
    call(&conn, "memo_set", json!({"key": "k", "value": 1})).await;
    let status = exit_of(&mut child).await;
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    conn.close().await;
}
