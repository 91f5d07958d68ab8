//! Watch client benchmarks.
//!
//! 1. End to end, debounce 0: time from a `memo_set` call (issued by this bench over HTTP,
//!    through herald's own upstream client as the gateway and `herald code` call: a plain call
//!    posted directly) to the notice line on `herald watch`'s stdout, with the watch talking to
//!    the memo server over stdio, HTTP and QUIC, its notes in memory (`--store :memory:`);
//!    then over stdio with the notes in a store file ("file": each write durable, fsync
//!    included, before the call is answered). When the call answered is printed too.
//! 2. The state diff of a 100,000-item JSON list with 1% of items changed: time, and extra
//!    memory (peak heap above the two documents, from a counting allocator) against the
//!    list's JSON size. Targets: under 50 ms and under 2x the JSON size.
//!
//! `cargo bench --bench watch` (HERALD_BENCH_N overrides the 10,000 changes per transport).
//! With `HERALD_BENCH_BASELINE=/path/to/an/older/herald`, each transport runs with that binary
//! (the watch and its memo server) and this build's in turn (A-B-B-A, half the changes each),
//! in the same run, and prints `NAME: this build / baseline: p50 X.XXx, p99 Y.YYx`. Both must
//! be built with one profile: `cargo bench` builds this one with the bench profile (thin LTO,
//! 16 codegen units), which measured 15-20 % slower here than the release profile's fat LTO,
//! so a release-built baseline would measure the profiles, not the change. (Or put a release
//! build of this tree at `target/release/herald` and run the bench binary directly.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;

use herald::mcp::call::Call;
use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use herald::upstream::{Upstream, UpstreamConfig};
use herald::watch::events::{StateBase, diff_reads};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on unchanged to the system allocator, which upholds
// GlobalAlloc's contract; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires it.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: p was allocated by System.alloc with this layout (alloc above).
        unsafe { System.dealloc(p, l) };
        CURRENT.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[path = "common.rs"]
mod common;

use common::{Build, compare, listening, ms, pct, print_baseline, print_ratio};

fn diff_bench(kubernetes: bool) {
    // Kubernetes-like items carry metadata.uid + resourceVersion (compared by version);
    // generic items have only an id, so every unchanged item is compared in full.
    let item = move |i: usize, phase: &str, rv: usize| {
        if kubernetes {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"uid": format!("uid-{i}"), "name": format!("pod-{i}"), "namespace": "default",
                                "resourceVersion": rv.to_string(), "labels": {"app": "bench"}},
                   "spec": {"containers": [{"name": "c", "image": "img:1"}], "nodeName": "n1"},
                   "status": {"phase": phase}})
        } else {
            json!({"id": format!("item-{i}"), "name": format!("pod-{i}"), "labels": {"app": "bench"},
                   "spec": {"containers": [{"name": "c", "image": "img:1"}], "nodeName": "n1"},
                   "status": {"phase": phase, "version": rv}})
        }
    };
    let kind = if kubernetes {
        "kubernetes-like"
    } else {
        "generic"
    };
    let n = 100_000;
    let old: Vec<Value> = (0..n).map(|i| item(i, "Running", 1)).collect();
    let new: Vec<Value> = (0..n)
        .map(|i| {
            if i % 100 == 0 {
                item(i, "Pending", 2)
            } else {
                item(i, "Running", 1)
            }
        })
        .collect();
    let old_text = serde_json::to_string(&old).unwrap();
    let new_text = serde_json::to_string(&new).unwrap();
    drop((old, new));
    let json_size = new_text.len();
    // What a watch does per update: index the new read, diff it against the kept baseline.
    let base = StateBase::new(old_text);
    let _ = diff_reads(&base, &StateBase::new(new_text.clone()));
    let mut times = Vec::new();
    let mut extra = 0;
    for _ in 0..10 {
        let text = new_text.clone();
        let base_mem = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base_mem, Ordering::Relaxed);
        let t = Instant::now();
        let read = StateBase::new(text);
        let events = diff_reads(&base, &read);
        times.push(t.elapsed());
        extra = extra.max(PEAK.load(Ordering::Relaxed) - base_mem);
        assert_eq!(events.len(), n / 100);
        drop((events, read));
    }
    times.sort();
    let p50 = pct(&times, 0.5);
    let ratio = extra as f64 / json_size as f64;
    println!(
        "state diff, 100,000 {kind} items, 1% changed: {} (p50 of 10, index the read + diff), extra memory {:.1} MB = {ratio:.2}x the list's JSON ({:.1} MB)",
        ms(p50),
        extra as f64 / 1e6,
        json_size as f64 / 1e6
    );
    println!(
        "target diff ({kind}): {} vs 50 ms -> {}; memory {ratio:.2}x vs 2x -> {}",
        ms(p50),
        if p50 < Duration::from_millis(50) {
            "met"
        } else {
            "MISSED"
        },
        if ratio < 2.0 { "met" } else { "MISSED" }
    );
}

struct Proc {
    _child: Child,
    out: Lines<BufReader<ChildStdout>>,
}

async fn watch_proc(bin: &str, server: &[&str]) -> (Proc, Child, Value) {
    // For stdio the watch's child is the memo server and its listening line comes through
    // the watch's stderr (its store in memory, or with "file" in a file of its own, each
    // write made durable before the call is answered); otherwise a separate memo server.
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let store = if server == ["file"] {
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "herald-bench-watch-{}-{n}.redb",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        path.display().to_string()
    } else {
        ":memory:".to_owned()
    };
    let (memo, info, args): (Option<Child>, Option<Value>, Vec<String>) =
        if server.is_empty() || server == ["file"] {
            (None, None, vec![])
        } else {
            let mut memo = tokio::process::Command::new(bin)
                .args([
                    "--log-format",
                    "json",
                    "--store",
                    ":memory:",
                    "memo",
                    "--http",
                    "127.0.0.1:0",
                    "--quic",
                    "127.0.0.1:0",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let info = listening(&mut memo).await;
            let args = match server[0] {
                "http" => vec![
                    "--mcp-http".into(),
                    info["http_url"].as_str().unwrap().into(),
                ],
                _ => vec![
                    "--mcp-quic".into(),
                    info["quic"].as_str().unwrap().into(),
                    "--tls-pin".into(),
                    info["quic_fingerprint"].as_str().unwrap().into(),
                ],
            };
            (Some(memo), Some(info), args)
        };
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--log-format",
        "json",
        "--store",
        ":memory:",
        "watch",
        "--debounce-ms",
        "0",
        "--watch",
        "n=memo://notes",
    ]);
    if args.is_empty() {
        cmd.args([
            "--mcp-stdio",
            &format!("{bin} --log-format json --store {store} memo --stdio --http 127.0.0.1:0"),
        ]);
    } else {
        cmd.args(&args);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let info = match info {
        Some(i) => {
            let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
            tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
            i
        }
        None => listening(&mut child).await,
    };
    let out = BufReader::new(child.stdout.take().unwrap()).lines();
    (
        Proc { _child: child, out },
        memo.unwrap_or_else(|| tokio::process::Command::new("true").spawn().unwrap()),
        info,
    )
}

async fn latency(bin: &str, name: &str, server: &[&str], n: usize) -> Vec<Duration> {
    let (mut w, _memo, info) = watch_proc(bin, server).await;
    let url = info["http_url"].as_str().unwrap().to_owned();
    let up = Arc::new(Upstream::new(UpstreamConfig::new(
        Target::Http(url),
        ClientTrust::default(),
        4 << 20,
    )));
    up.connect().await.unwrap();
    let call = async |i: i64| {
        let args = json!({"key": "k", "value": i});
        up.call_tool(
            "memo_set",
            args.as_object().unwrap().clone(),
            Call::default(),
        )
        .await
        .unwrap();
    };
    // The watch subscribes shortly after start; wait for the first notice to know it is live.
    let mut i = -1_000_000i64;
    loop {
        call(i).await;
        i += 1;
        match tokio::time::timeout(Duration::from_millis(200), w.out.next_line()).await {
            Ok(Ok(Some(_))) => break,
            _ => continue,
        }
    }
    let mut lat = Vec::with_capacity(n);
    // When the call's answer came, for where the time goes (the notice is not waited for
    // until then, so a notice before it counts as at the answer).
    let mut answered = Vec::with_capacity(n);
    for i in 0..n as i64 {
        let t = Instant::now();
        call(i).await;
        answered.push(t.elapsed());
        w.out.next_line().await.unwrap().expect("a notice");
        lat.push(t.elapsed());
    }
    lat.sort();
    answered.sort();
    println!(
        "{name:>6}: memo_set -> notice on stdout, n={n}: p50={} p99={} max={} (the call answered: p50={})",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap()),
        ms(pct(&answered, 0.5)),
    );
    lat
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    diff_bench(true);
    diff_bench(false);
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let baseline = common::baseline();
    print_baseline(baseline);
    for (name, server) in [
        ("stdio", &[][..]),
        ("http", &["http"][..]),
        ("quic", &["quic"][..]),
        ("file", &["file"][..]),
    ] {
        let sides = compare(baseline, async |b: Build| {
            latency(b.bin, &b.label(name), server, b.part(n)).await
        })
        .await;
        if baseline.is_some() {
            let (before, after) = sides.latencies();
            print_ratio(&format!("{name:>6}"), &before, &after);
        }
    }
    // The "file" runs' stores (and the pid files beside them).
    let mine = format!("herald-bench-watch-{}-", std::process::id());
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(&mine) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
