//! `herald slack --backend nats://…` (issue 20): two processes on one Slack app and one real
//! `nats-server -js`. Exactly one holds the socket; either serves the whole feed with the
//! same cursors; a `kill -9` of the holder, a deploy overlap and a NATS restart lose nothing;
//! neither process's store, nor NATS's own files, hold a message's text.

use serde_json::{Value, json};

use crate::nats::NatsServer;
use crate::slack::{client, collect, connected, fake, now_cursor, start, status, texts};
use crate::slack_fake::FakeSlack;
use crate::support::*;

/// A lease renewed every 200 ms and taken over after 1.5 s of silence (90 s in production).
const LEASE: [&str; 4] = ["--lease-heartbeat-ms", "200", "--lease-stale-ms", "1500"];

async fn slack_on(fake: &FakeSlack, nats: &NatsServer, store: &str) -> Server {
    let url = nats.url();
    let mut extra = vec!["--backend", url.as_str()];
    extra.extend(LEASE);
    start(fake, store, &extra).await
}

fn holds(v: &Value) -> bool {
    v["message"]
        .as_str()
        .is_some_and(|m| m.contains("holds the slack socket lease"))
}

/// The first JSON line of `s` that `matches`, whether logged before its `listening` line
/// (which [`Server::spawn`] reads past: a lease can be taken or watched before it) or after.
async fn said(s: &mut Server, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
    let early = s
        .stderr()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| matches(v));
    match early {
        Some(v) => v,
        None => s.line_where(what, matches).await,
    }
}

fn stands_by(v: &Value) -> bool {
    v["message"]
        .as_str()
        .is_some_and(|m| m.contains("standing by"))
}

fn sorted(events: &[Value]) -> Vec<String> {
    let mut t: Vec<String> = texts(events).into_iter().map(str::to_owned).collect();
    t.sort();
    t
}

/// Every file under `dir`, read whole.
fn files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                out.push((p, b));
            }
        }
    }
    out
}

fn holds_text(bytes: &[u8], text: &str) -> bool {
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

#[tokio::test]
async fn one_socket_between_two_processes_and_a_kill_9_of_the_holder_loses_nothing() {
    let nats = NatsServer::start().await;
    let fake = fake().await;
    let mut a = slack_on(&fake, &nats, ":memory:").await;
    said(&mut a, "A holds the lease", holds).await;
    connected(&fake).await;
    let mut b = slack_on(&fake, &nats, ":memory:").await;
    said(&mut b, "B stands by", stands_by).await;
    let (ca, cb) = (client(&a).await, client(&b).await);
    let sb = status(&cb).await;
    assert_eq!(sb["state"], "standby", "{sb}");
    assert_eq!(sb["lease"]["held"], false, "{sb}");
    let sa = status(&ca).await;
    assert_eq!(sa["lease"]["held"], true, "{sa}");
    assert_eq!(
        sb["lease"]["holder"], sa["lease"]["holder"],
        "B knows who holds it"
    );

    // A's socket hears it; B serves it too, from A's cursor: cursors are the feed's.
    let from_a = now_cursor(&ca).await;
    fake.post("C1", "U1", "one");
    let (got, cursor) = collect(&cb, json!({}), &from_a, 1).await;
    assert_eq!(texts(&got), ["one"]);
    let (got_a, cursor_a) = collect(&ca, json!({}), &from_a, 1).await;
    assert_eq!(got_a, got, "the same event");
    assert_eq!(cursor_a, cursor, "the same cursor after it");

    // SAFETY: kill(2) with a pid this test spawned and still owns; no memory is involved.
    let r = unsafe { libc::kill(a.pid() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(r, 0);
    let _ = a.child.wait().await;
    fake.wait_until("A's socket gone", |s| s.sockets_open() == 0)
        .await;
    // Nobody's socket hears this one: it is only in Slack's history.
    fake.post("C2", "U2", "while nobody listened");
    b.line_where("B takes the lease over", holds).await;
    fake.wait_until("B's socket open", |s| {
        s.sockets_open() == 1 && s.sockets_opened() == 2
    })
    .await;
    fake.post("C1", "U1", "after");
    let (got, _) = collect(&cb, json!({}), &cursor, 2).await;
    assert_eq!(sorted(&got), ["after", "while nobody listened"]);
    assert_eq!(fake.most_sockets_open(), 1, "never two sockets at once");
    let sb = status(&cb).await;
    assert_eq!(sb["state"], "connected", "{sb}");
    assert_eq!(sb["lease"]["held"], true, "{sb}");
}

#[tokio::test]
async fn a_deploy_overlap_loses_nothing_and_no_store_holds_message_text() {
    let nats = NatsServer::start().await;
    let fake = fake().await;
    let dir = TempDir::new("slack-nats");
    let (store_a, store_b) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
    let mut a = slack_on(&fake, &nats, store_a.to_str().unwrap()).await;
    said(&mut a, "A holds the lease", holds).await;
    connected(&fake).await;
    let ca = client(&a).await;
    let from = now_cursor(&ca).await;
    fake.post("C1", "U1", "secret before the deploy");
    collect(&ca, json!({}), &from, 1).await;

    // The new process starts while the old one holds the lease: it waits.
    let mut b = slack_on(&fake, &nats, store_b.to_str().unwrap()).await;
    said(&mut b, "B stands by", stands_by).await;
    let cb = client(&b).await;
    assert_eq!(status(&cb).await["state"], "standby");
    assert_eq!(fake.sockets_opened(), 1, "B opened no socket");
    fake.post("C1", "U1", "secret during the overlap");
    collect(&ca, json!({}), &from, 2).await;
    // The old one stops: it closes its socket, publishes what it has, and gives the lease
    // back, so the new one takes it at once (not after the stale time).
    drop(ca);
    let status_a = a.terminate().await;
    assert!(status_a.success(), "{status_a}");
    fake.post("C2", "U2", "secret in the swap");
    b.line_where("B takes the lease", holds).await;
    fake.wait_until("B's socket open", |s| {
        s.sockets_opened() == 2 && s.sockets_open() == 1
    })
    .await;
    fake.post("C2", "U2", "secret after");
    let (got, _) = collect(&cb, json!({}), &from, 4).await;
    assert_eq!(
        sorted(&got),
        [
            "secret after",
            "secret before the deploy",
            "secret during the overlap",
            "secret in the swap"
        ]
    );
    assert_eq!(fake.most_sockets_open(), 1, "never two sockets at once");
    drop(cb);
    assert!(b.terminate().await.success());
    // Nothing of a message is kept locally, and NATS holds only sealed payloads (its stream
    // files are there: the ids, in the clear, are).
    assert!(
        files(nats.dir())
            .iter()
            .any(|(_, b)| holds_text(b, "slack:C1:")),
        "the stream's files were read"
    );
    for (path, bytes) in files(dir.path()).into_iter().chain(files(nats.dir())) {
        assert!(
            !holds_text(&bytes, "secret"),
            "{} holds a message's text",
            path.display()
        );
    }
    assert!(store_a.exists() && store_b.exists(), "the stores were made");
}

#[tokio::test]
async fn a_nats_restart_loses_nothing_acknowledged() {
    let mut nats = NatsServer::start().await;
    let fake = fake().await;
    let mut a = slack_on(&fake, &nats, ":memory:").await;
    said(&mut a, "A holds the lease", holds).await;
    connected(&fake).await;
    let ca = client(&a).await;
    let from = now_cursor(&ca).await;
    fake.post("C1", "U1", "before the restart");
    collect(&ca, json!({}), &from, 1).await;
    nats.restart().await;
    fake.post("C1", "U1", "after the restart");
    // A serves it at once from memory, and publishes it once NATS is back.
    collect(&ca, json!({}), &from, 2).await;
    a.line_where("A reconnected to NATS", |v| {
        v["message"].as_str() == Some("NATS connected")
    })
    .await;
    // A process that starts now learns both from the stream alone.
    let b = slack_on(&fake, &nats, ":memory:").await;
    let cb = client(&b).await;
    // (Its first poll waits until it has applied the stream: a cursor never skips ahead.)
    let (got, _) = collect(&cb, json!({}), &from, 2).await;
    assert_eq!(texts(&got), ["before the restart", "after the restart"]);
    let m = reqwest_metrics(&a).await;
    assert!(m.contains("herald_nats_disconnects_total 1"), "{m}");
    assert!(m.contains("herald_slack_lease_held 1"), "{m}");
}

async fn reqwest_metrics(s: &Server) -> String {
    let url = s.http_url().replace("/mcp", "/metrics");
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn a_holder_frozen_past_the_stale_time_steps_down_when_it_wakes() {
    let nats = NatsServer::start().await;
    let fake = fake().await;
    let mut a = slack_on(&fake, &nats, ":memory:").await;
    said(&mut a, "A holds the lease", holds).await;
    connected(&fake).await;
    let mut b = slack_on(&fake, &nats, ":memory:").await;
    said(&mut b, "B stands by", stands_by).await;
    let cb = client(&b).await;
    let from = now_cursor(&cb).await;
    // A stops renewing (as a host that hangs, or a long GC pause would): B takes over. A's
    // socket is still open in the kernel, but Slack sends to the newest one.
    let pid = a.pid() as libc::pid_t;
    // SAFETY: kill(2) with a pid this test spawned and still owns; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    b.line_where("B takes the lease over", holds).await;
    fake.wait_until("B's socket open", |s| s.sockets_opened() == 2)
        .await;
    fake.post("C1", "U1", "while A slept");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    // A wakes past its renewal deadline: it closes its socket and publishes nothing more.
    a.line_where("A steps down", |v| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("lost the slack socket lease"))
    })
    .await;
    fake.wait_until("only B's socket left", |s| s.sockets_open() == 1)
        .await;
    fake.post("C1", "U1", "after A woke");
    let (got, _) = collect(&cb, json!({}), &from, 2).await;
    assert_eq!(texts(&got), ["while A slept", "after A woke"]);
    let sb = status(&cb).await;
    assert_eq!(sb["lease"]["held"], true, "{sb}");
    // A serves the same feed from the stream, as a standby now.
    let ca = client(&a).await;
    let (got_a, _) = collect(&ca, json!({}), &from, 2).await;
    assert_eq!(got_a, got);
    assert_eq!(status(&ca).await["state"], "standby");
}

/// NATS loses its data (stopped, its storage wiped, started again) under a running holder and
/// a standby: the stream and the lease bucket are made again by the running processes (no
/// restart), the holder fences the new stream, and a message posted after the loss reaches
/// the standby's readers.
#[tokio::test]
async fn a_stream_and_bucket_nats_lost_are_made_again_by_the_running_processes() {
    let mut nats = NatsServer::start().await;
    let fake = fake().await;
    let mut a = slack_on(&fake, &nats, ":memory:").await;
    said(&mut a, "A holds the lease", holds).await;
    connected(&fake).await;
    let mut b = slack_on(&fake, &nats, ":memory:").await;
    said(&mut b, "B stands by", stands_by).await;
    let cb = client(&b).await;
    let from = now_cursor(&cb).await;
    fake.post("C1", "U1", "before the loss");
    let (got, cursor) = collect(&cb, json!({}), &from, 1).await;
    assert_eq!(texts(&got), ["before the loss"]);

    nats.kill().await;
    std::fs::remove_dir_all(nats.dir().join("jetstream")).unwrap();
    nats.start_again().await;
    fake.post("C1", "U1", "after the loss");
    let (got, _) = collect(&cb, json!({}), &cursor, 1).await;
    assert_eq!(texts(&got), ["after the loss"]);
    let said = format!("{}{}", a.stderr(), b.stderr());
    assert!(said.contains("made it again"), "{said}");
    assert!(fake.most_sockets_open() <= 1, "never two sockets at once");
}

/// Events lost with the stream (published, then NATS lost its data before a standby cut off
/// from it read them) are told to that standby's readers as `truncated`; a process that read
/// them all tells its readers nothing of the kind.
#[tokio::test]
async fn events_lost_with_the_stream_are_told_as_truncated_to_readers_who_missed_them() {
    let mut nats = NatsServer::start().await;
    let fake = fake().await;
    let mut a = slack_on(&fake, &nats, ":memory:").await;
    said(&mut a, "A holds the lease", holds).await;
    connected(&fake).await;
    let gate = crate::nats::Gate::start(nats.port).await;
    let mut extra = vec!["--backend".to_owned(), gate.url()];
    extra.extend(LEASE.iter().map(|s| s.to_string()));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut b = start(&fake, ":memory:", &extra).await;
    said(&mut b, "B stands by", stands_by).await;
    let mut c = slack_on(&fake, &nats, ":memory:").await;
    said(&mut c, "C stands by", stands_by).await;
    let (cb, cc) = (client(&b).await, client(&c).await);
    let from = now_cursor(&cb).await;
    fake.post("C1", "U1", "before the loss");
    let (_, cursor) = collect(&cb, json!({}), &from, 1).await;
    let (_, at_c) = collect(&cc, json!({}), &from, 1).await;
    assert_eq!(at_c, cursor, "one numbering");

    // B hears nothing from NATS; the next event is in the stream (C read it) when NATS
    // loses everything.
    gate.hold();
    fake.post("C1", "U1", "lost with the stream");
    let (got, _) = collect(&cc, json!({}), &cursor, 1).await;
    assert_eq!(texts(&got), ["lost with the stream"]);
    nats.kill().await;
    std::fs::remove_dir_all(nats.dir().join("jetstream")).unwrap();
    gate.cut();
    nats.start_again().await;
    fake.post("C1", "U1", "after the loss");

    let read = |conn, cursor: String| async move {
        let mut truncated = false;
        let mut texts = Vec::new();
        let mut at = cursor;
        while !texts.iter().any(|t| t == "after the loss") {
            let r = crate::slack::poll(
                conn,
                json!({"name": "message_posted", "cursor": at, "timeoutMs": 10_000}),
            )
            .await;
            truncated |= r["truncated"] == true;
            for e in r["events"].as_array().unwrap() {
                texts.push(e["data"]["text"].as_str().unwrap().to_owned());
            }
            at = r["cursor"].as_str().unwrap().to_owned();
        }
        (truncated, texts)
    };
    let (truncated, _) = tokio::time::timeout(WAIT, read(&cb, cursor.clone()))
        .await
        .expect("B serves the event after the loss");
    assert!(
        truncated,
        "B never read an event that is gone: its readers are told"
    );
    let (truncated, texts) = tokio::time::timeout(WAIT, read(&cc, cursor))
        .await
        .expect("C serves the event after the loss");
    assert!(!truncated, "C read every event: {texts:?}");
    assert_eq!(texts, ["lost with the stream", "after the loss"]);
}
