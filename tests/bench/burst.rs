//! Every event of a burst delivered: a memo burst and a file storm, each followed by an
//! in-process watch client on the source's event log, beside the pace of the writers that made
//! them and (for files) `inotifywait` on the same directory, in one run. The k8s burst is part 1
//! of `cargo bench --bench k8s`.
//!
//! 1. Memo burst: 64 HTTP clients call `memo_set` at once, N calls in all over 1,000 keys (each
//!    a new value, so each makes one `memo://log` event), then one last key, timed to the last
//!    call's answer and to the watch's notice naming the last key.
//! 2. File storm: one writer creates N files (open, write, close) in a watched directory as
//!    fast as it can, then one last file. `inotifywait -m -e close_write` on the same directory
//!    counts its lines to the last file, in the same run, for the kernel's own pace; the watch
//!    follows `file-events://watch/DIR` through `herald file` with `--debounce-ms 0` (the
//!    default 50 ms settle would add its 50 ms to the last file's event by design, as in
//!    `cargo bench --bench file`).
//!
//! Target for each: every event reaches the watch (each memo event the log holds; each file's
//! CREATED: the MODIFIED of its close that changes nothing the watch drops by design), no GAP,
//! and the watch keeps the writers' pace: their time to the last write over the watch's time
//! to that last event's notice at least 0.9. The sources run with a ring of
//! 16,384 events (`--ring-capacity`), as the k8s bench's, and the bench takes each notice as
//! it comes (a sink that keeps up: one that stops for seconds lets a burst pass the ring).
//!
//! `cargo bench --bench burst` (HERALD_BENCH_N overrides the 20,000 events; HERALD_BENCH_ONLY=memo
//! or file runs one part; HERALD_BENCH_LOG=1 prints the watch client's log).

use std::time::{Duration, Instant};

use herald::transport::client::{client_config, connect};
use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use herald::watch::log::WatchLog;
use herald::watch::{Notice, WatchConfig, WatchManager};
use rmcp::model::ReadResourceRequestParams;
use serde_json::json;
use tokio::sync::mpsc;

#[path = "common.rs"]
mod common;

use common::{RawHttp, verdict};

const RING: &str = "16384";
const CLIENTS: usize = 64;
const TARGET_PACE: f64 = 0.9;

/// A watch client in this process following `uri` on the server at `url`.
async fn watch(url: &str, uri: &str) -> (WatchManager, mpsc::Receiver<Notice>) {
    let (tx, rx) = mpsc::channel(1024);
    let mut cfg = WatchConfig::default();
    cfg.debounce.quiet = Duration::ZERO;
    cfg.max_events_per_update = usize::MAX;
    cfg.debounce.max_lines = usize::MAX;
    let log = if std::env::var_os("HERALD_BENCH_LOG").is_some() {
        WatchLog::stderr(true)
    } else {
        WatchLog::silent()
    };
    let mgr = WatchManager::new(
        cfg,
        vec![herald::watch::upstream(
            Target::Http(url.to_owned()),
            Default::default(),
            64 << 20,
        )],
        tx,
        log,
        None,
    );
    mgr.watch_start("burst", uri, None).await.expect("watch");
    (mgr, rx)
}

/// Takes the watch's notices as they come (a sink that keeps up) until the one naming `last`:
/// the moment it came and the GAP lines seen before.
fn collect(
    mut rx: mpsc::Receiver<Notice>,
    last: &'static str,
) -> tokio::task::JoinHandle<(Instant, Vec<String>, u64)> {
    tokio::spawn(async move { until(&mut rx, last).await })
}

/// Waits for the notice naming `last`; the moment it came and the GAP lines seen before.
async fn until(rx: &mut mpsc::Receiver<Notice>, last: &str) -> (Instant, Vec<String>, u64) {
    let mut gaps = Vec::new();
    let mut created = 0;
    let done = tokio::time::timeout(Duration::from_secs(600), async {
        while let Some(notice) = rx.recv().await {
            gaps.extend(
                (notice.lines.iter())
                    .filter(|l| l.starts_with("GAP") || l.contains("missed"))
                    .cloned(),
            );
            created += notice
                .lines
                .iter()
                .filter(|l| l.starts_with("CREATED "))
                .count() as u64;
            if notice.lines.iter().any(|l| l.contains(last)) {
                return Instant::now();
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the last event reached the watch");
    (done, gaps, created)
}

/// The newest `seq` of the event log `uri`, read straight from the source.
async fn newest_seq(url: &str, uri: &str) -> u64 {
    let conn = connect(
        &Target::Http(url.to_owned()),
        &ClientTrust::default(),
        client_config(),
        64 << 20,
    )
    .await
    .expect("connect");
    let read = conn
        .read_resource(ReadResourceRequestParams::new(uri.to_owned()))
        .await
        .expect("read the log");
    conn.close().await;
    let text = match &read.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("not text: {other:?}"),
    };
    let v: serde_json::Value = serde_json::from_str(&text).expect("the log is JSON");
    (v["events"].as_array().expect("events"))
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap_or(0)
}

struct Outcome {
    write_rate: f64,
    watch_rate: f64,
    /// The writers' time over the watch's (to the last event's notice).
    pace: f64,
    delivered: u64,
    logged: u64,
    /// What `logged` counts.
    what: &'static str,
    gaps: Vec<String>,
}

impl Outcome {
    fn print(&self, name: &str, n: usize, beside: &str) {
        let pace = self.pace;
        let whole = self.delivered == self.logged && self.gaps.is_empty();
        println!(
            "{name}, {n} events: writers {:.0} events/s{beside}; the watch {:.0} events/s \
             ({} of {} {} delivered, {} GAP lines); pace {pace:.2}x (target >= \
             {TARGET_PACE}x, every event) -> {}",
            self.write_rate,
            self.watch_rate,
            self.delivered,
            self.logged,
            self.what,
            self.gaps.len(),
            verdict(whole && pace >= TARGET_PACE),
        );
        for g in self.gaps.iter().take(5) {
            println!("  {g}");
        }
    }
}

async fn memo_burst(n: usize) -> Outcome {
    let (_child, v) = common::serve(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--ring-capacity",
        RING,
    ])
    .await;
    let url = v["http_url"].as_str().unwrap().to_owned();
    let (mgr, mut rx) = watch(&url, "memo://log").await;
    // The watch is up once a first change reaches it.
    let mut c = RawHttp::connect(&url, None).await.expect("connect");
    c.call_tool(1, "memo_set", &json!({"key": "warm", "value": "0"}))
        .await
        .unwrap();
    until(&mut rx, "warm").await;
    let base = newest_seq(&url, "memo://log").await;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(RawHttp::connect(&url, None).await.expect("connect"));
    }
    let before = mgr.watch_list()[0].events;
    let notices = collect(rx, "zz-final");
    let t0 = Instant::now();
    let writers: Vec<_> = (clients.into_iter().enumerate())
        .map(|(w, mut c)| {
            tokio::spawn(async move {
                for i in (w..n).step_by(CLIENTS) {
                    let args = json!({"key": format!("k{}", i % 1000), "value": i.to_string()});
                    c.call_tool(i as u64, "memo_set", &args).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    c.call_tool(2, "memo_set", &json!({"key": "zz-final", "value": "1"}))
        .await
        .unwrap();
    let written = t0.elapsed();
    let (done, gaps, _) = notices.await.unwrap();
    let delivered = mgr.watch_list()[0].events - before;
    let logged = newest_seq(&url, "memo://log").await - base;
    mgr.shutdown().await;
    Outcome {
        write_rate: (n + 1) as f64 / written.as_secs_f64(),
        watch_rate: delivered as f64 / (done - t0).as_secs_f64(),
        pace: written.as_secs_f64() / (done - t0).as_secs_f64(),
        delivered,
        logged,
        what: "logged events",
        gaps,
    }
}

/// The file storm; also inotifywait's events/s on the same writes.
async fn file_storm(n: usize) -> (Outcome, f64) {
    let dir = std::env::temp_dir().join(format!("herald-bench-storm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir = std::fs::canonicalize(&dir).unwrap();
    let d = dir.to_str().unwrap().to_owned();
    let (_child, v) = common::serve(&[
        "--store",
        ":memory:",
        "file",
        "--root",
        &d,
        "--http",
        "127.0.0.1:0",
        "--ring-capacity",
        RING,
        "--debounce-ms",
        "0",
    ])
    .await;
    let url = v["http_url"].as_str().unwrap().to_owned();
    let uri = format!("file-events://watch{d}");
    let (mgr, mut rx) = watch(&url, &uri).await;
    std::fs::write(dir.join("warm"), "0").unwrap();
    until(&mut rx, "warm").await;

    let (mut iw, mut lines, _) =
        common::inotifywait(&["-m", "-e", "close_write", "--format", "%f", &d]).await;
    let counted = tokio::spawn(async move {
        let mut seen = 0u64;
        while let Ok(Some(l)) = lines.next_line().await {
            seen += 1;
            if l == "zz-final" {
                return (Instant::now(), seen);
            }
        }
        panic!("inotifywait ended");
    });

    let before = mgr.watch_list()[0].events;
    let notices = collect(rx, "zz-final");
    let t0 = Instant::now();
    let writer = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            for i in 0..n {
                std::fs::write(dir.join(format!("f{i:06}")), i.to_string()).unwrap();
            }
            std::fs::write(dir.join("zz-final"), "1").unwrap();
            Instant::now()
        })
    };
    let written = writer.await.unwrap() - t0;
    let (iw_done, iw_seen) = counted.await.unwrap();
    let (done, gaps, created) = notices.await.unwrap();
    let events = mgr.watch_list()[0].events - before;
    mgr.shutdown().await;
    let _ = iw.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    let outcome = Outcome {
        write_rate: (n + 1) as f64 / written.as_secs_f64(),
        watch_rate: events as f64 / (done - t0).as_secs_f64(),
        pace: written.as_secs_f64() / (done - t0).as_secs_f64(),
        delivered: created,
        logged: n as u64 + 1,
        what: "files' CREATED",
        gaps,
    };
    (outcome, iw_seen as f64 / (iw_done - t0).as_secs_f64())
}

#[tokio::main]
async fn main() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .ok();
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    if std::env::var_os("HERALD_BENCH_LOG").is_some() {
        // The watch client's own warnings (a resubscribe's reason) beside its log.
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::DEBUG)
            .init();
    }
    let only = std::env::var("HERALD_BENCH_ONLY").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    println!("machine load: {}", common::load());
    if wanted("memo") {
        memo_burst(n).await.print(
            &format!("memo burst ({CLIENTS} HTTP clients, memo://log)"),
            n,
            "",
        );
    }
    if wanted("file") {
        let (storm, iw) = file_storm(n).await;
        storm.print(
            "file storm (one writer, file-events://)",
            n,
            &format!(", inotifywait {iw:.0} events/s"),
        );
    }
}
