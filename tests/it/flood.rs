//! A client flooding one stdio connection: `memo_set` requests written as fast as the pipe takes
//! them, without waiting for answers. herald runs a bounded number of a connection's requests at
//! once and stops reading while its answers are not taken, so the flood waits in the pipe, not
//! in herald's memory (before the bound, 100,000 such calls took its RSS from 12 MB to 1.40 GB,
//! and the flood is what this writes). Measured from `/proc/<pid>/status` of the real
//! binary.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::*;

/// The flood the writer would write if herald read it all.
const CALLS: usize = 100_000;
/// Requests per write to herald's stdin.
const BATCH: usize = 50;
/// The most requests of this size herald may take before their answers are read: at most 192
/// run at once (`--max-listen-streams` + 128) and 32 more are held, 256 answers wait for the
/// writer and about 650 more fit its 64 KiB buffer and the stdout pipe; with the stdin pipe,
/// herald's 64 KiB read buffer (about 550 requests) and one batch, about 1,700. Before the
/// in-flight bound, herald read about 7,000 before its answers' queue filled and it stopped (on
/// a 2-core machine in a debug build), and with its answers read, the whole flood.
const HELD_MAX: usize = 4_000;
/// Answers read, with the writer going on, before it stops: what, with [`HELD_MAX`], sets the
/// test's run time (herald runs every request written; a debug build runs a few hundred a
/// second).
const THEN: usize = 500;
/// Distinct keys: the notes stay small, far under `--max-notes-bytes`.
const KEYS: usize = 100;
/// The generous bound on herald's peak RSS over the whole test.
const RSS_BOUND_KB: u64 = 300 * 1024;
/// No progress for this long while nobody reads herald's answers: herald stopped reading.
/// (Mistaken on a stalled machine, the test only measures earlier.)
const STALL: Duration = Duration::from_secs(2);

/// `field` (`VmRSS`, `VmHWM`) of process `pid`, in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

fn memo_set(id: usize) -> String {
    let mut line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "_meta": meta(), "name": "memo_set",
        "arguments": {"key": format!("key-{}", id % KEYS), "value": format!("value number {id}")}}})
    .to_string();
    line.push('\n');
    line
}

#[tokio::test]
async fn a_flood_on_one_stdio_connection_keeps_rss_bounded_and_is_answered() {
    init();
    let mut child = tokio::process::Command::new(bin())
        .args(["--store", ":memory:", "memo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // One call answered first: herald is up and serving before anything is measured.
    stdin.write_all(memo_set(CALLS).as_bytes()).await.unwrap();
    let first = tokio::time::timeout(WAIT, lines.next_line()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    let start_kb = status_kb(pid, "VmRSS");

    // The writer writes requests 0.. in batches, up to `limit`, and says how far it got.
    let limit = Arc::new(AtomicUsize::new(CALLS));
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0usize);
    let writer = tokio::spawn({
        let limit = limit.clone();
        async move {
            let mut next = 0;
            let mut buf = String::new();
            while next < limit.load(Ordering::Acquire) {
                buf.clear();
                for id in next..next + BATCH {
                    buf.push_str(&memo_set(id));
                }
                stdin.write_all(buf.as_bytes()).await.unwrap();
                next += BATCH;
                progress_tx.send_replace(next);
            }
            stdin
        }
    });

    // Nobody reads herald's answers: once its output is full it must stop reading, and the
    // writer stalls long before the end of the flood.
    while let Ok(Ok(())) = tokio::time::timeout(STALL, progress.changed()).await {}
    let stalled_at = *progress.borrow();
    let stalled_kb = status_kb(pid, "VmRSS");
    assert!(
        stalled_at <= HELD_MAX,
        "herald took {stalled_at} requests while nobody read its answers: no back-pressure"
    );

    // Now its answers are read as they come while the writer goes on: herald still reads no
    // faster than it answers, and once the writer stops, every request written is answered,
    // once, successfully.
    let (answered, most_unanswered) = tokio::time::timeout(WAIT * 2, async {
        let mut seen = vec![false; CALLS];
        let (mut n, mut most, mut written) = (0, 0, false);
        while !(written && n == *progress.borrow()) {
            tokio::select! {
                line = lines.next_line() => {
                    let line = line.unwrap().expect("herald still running");
                    let v: Value = serde_json::from_str(&line).unwrap();
                    let id = v["id"].as_u64().expect("an answer with an id") as usize;
                    assert_eq!(
                        v["result"]["structuredContent"]["changed"], true,
                        "{line:.300}"
                    );
                    assert!(!std::mem::replace(&mut seen[id], true), "{id} answered twice");
                    n += 1;
                    let unanswered = *progress.borrow() - n;
                    most = most.max(unanswered);
                    assert!(
                        unanswered <= HELD_MAX,
                        "{unanswered} requests written and not answered while herald's answers \
                         are read: it reads ahead of what it runs"
                    );
                    if n == stalled_at + THEN {
                        limit.store(0, Ordering::Release);
                    }
                }
                // The writer is done when its end of the channel goes.
                end = progress.changed(), if !written => written = end.is_err(),
            }
        }
        (n, most)
    })
    .await
    .expect("the flood is answered in time");
    let mut stdin = writer.await.unwrap();
    assert_eq!(answered, *progress.borrow());
    let peak_kb = status_kb(pid, "VmHWM");
    let after_kb = status_kb(pid, "VmRSS");
    eprintln!(
        "flood on stdio: RSS {start_kb} kB at start; {stalled_kb} kB with {stalled_at} requests \
         unanswered and the writer stalled; at most {most_unanswered} unanswered while answers \
         were read; {after_kb} kB after {answered} answered; peak {peak_kb} kB"
    );
    assert!(
        peak_kb < RSS_BOUND_KB,
        "herald's RSS peaked at {peak_kb} kB (from {start_kb} kB), over {RSS_BOUND_KB} kB"
    );

    // A normal call on the same connection still succeeds.
    let read = json!({"jsonrpc": "2.0", "id": "after", "method": "resources/read",
        "params": {"_meta": meta(), "uri": "memo://notes"}});
    stdin
        .write_all(format!("{read}\n").as_bytes())
        .await
        .unwrap();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("an answer in time")
        .unwrap()
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["id"], "after", "{line:.300}");
    let notes: Value =
        serde_json::from_str(v["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        notes.as_object().map(|o| o.len()),
        Some(KEYS),
        "{line:.300}"
    );
}
