//! The k8s source's throughput and memory, against the fake API server the tests use.
//!
//! 1. Events per second from the fake API server to a consumer: raw `kubectl get -w` piped to
//!    a counter, then the same stream through `herald k8s` (watching over the API, then with
//!    `--watch-via kubectl`: parse, dedupe, ring, listen notification) to an in-process watch
//!    client (read, event-log diff), in the same run. The ratio herald / kubectl is the
//!    figure; target at least 1.5 with every event delivered.
//! 2. 1,000 objects and 100 watched URIs: the RSS of herald and of everything it started,
//!    the time until all 100 watches are open, and the TCP connections the API server
//!    accepted, over HTTPS (h2 by ALPN, as a real API server), over plain HTTP (HTTP/1.1),
//!    and with `--watch-via kubectl` (100 kubectl processes). Targets: 60 MiB, 1 s, one
//!    connection per cluster with h2.
//!
//! 3. 10,000 objects of about 2 KiB each, one watch of all of them: herald's RSS once the
//!    watch is seeded and the time to seed it (list, decode, keep), whole objects against
//!    `?metadata=true` (PartialObjectMetadata), each in a fresh `herald k8s`, in the same run.
//!
//! `cargo bench --bench k8s` (HERALD_BENCH_N overrides the 20,000 events;
//! HERALD_BENCH_ONLY=events runs part 1 alone, HERALD_BENCH_ONLY=metadata part 3 alone;
//! HERALD_BENCH_RING the `--ring-capacity` of part 1, 16,384 by default: room for the watch
//! client to fall a few thousand events behind on two busy cores; HERALD_BENCH_LOG=1 prints
//! the watch client's log).

#[allow(dead_code)]
#[path = "../it/kube_fake.rs"]
mod kube_fake;

use std::process::Stdio;
use std::time::{Duration, Instant};

use herald::transport::client::{client_config, connect};

use herald::transport::target::Target;
use herald::watch::log::WatchLog;
use herald::watch::{WatchConfig, WatchManager};
use kube_fake::FakeApi;
use rmcp::model::SubscriptionFilter;
use serde_json::json;
use tokio::io::AsyncReadExt;

#[path = "common.rs"]
mod common;

use common::{children, rss_kib};

/// `herald k8s` on HTTP watching `via` (api or kubectl); its URL and process.
async fn herald_k8s(kubeconfig: &str, ring: usize, via: &str) -> (String, tokio::process::Child) {
    let ring = ring.to_string();
    let (child, v) = common::serve(&[
        "--store",
        ":memory:",
        "k8s",
        "--http",
        "127.0.0.1:0",
        "--kubeconfig",
        kubeconfig,
        "--ring-capacity",
        &ring,
        "--watch-via",
        via,
    ])
    .await;
    (v["http_url"].as_str().unwrap().to_owned(), child)
}

fn put_all(api: &FakeApi, n: usize, round: usize) {
    for i in 0..n {
        api.put(
            "",
            "default",
            &format!("cm-{:04}", i % 1000),
            json!({"round": round, "i": i}),
        );
    }
}

async fn raw_kubectl(api: &FakeApi, kubeconfig: &str, n: usize) -> f64 {
    let mut child = tokio::process::Command::new("kubectl")
        .args([
            &format!("--kubeconfig={kubeconfig}"),
            "get",
            "configmaps",
            "--all-namespaces",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
            "--request-timeout=0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl on PATH");
    let mut out = child.stdout.take().unwrap();
    // The seeded objects are printed first, as ADDED; count from after them. (The reader
    // starts at once: kubectl blocks on a full pipe before it even opens its watch.)
    let seeded = 1000;
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 16];
        let mut lines = 0usize;
        let mut tx = Some(tx);
        loop {
            let k = out.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            lines += buf[..k].iter().filter(|&&b| b == b'\n').count();
            if lines >= seeded + n
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(Instant::now());
            }
        }
    });
    api.wait("kubectl's watch", |a| a.watches() == 1).await;
    let t0 = Instant::now();
    put_all(api, n, 1);
    let done = tokio::time::timeout(Duration::from_secs(600), rx)
        .await
        .expect("kubectl printed every event")
        .unwrap();
    let _ = child.kill().await;
    api.wait("kubectl gone", |a| a.watches() == 0).await;
    n as f64 / (done - t0).as_secs_f64()
}

async fn through_herald(
    api: &FakeApi,
    kubeconfig: &str,
    n: usize,
    via: &str,
    round: usize,
) -> (f64, u64) {
    let ring = std::env::var("HERALD_BENCH_RING")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(16384);
    let (url, _child) = herald_k8s(kubeconfig, ring, via).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let mut cfg = WatchConfig::default();
    cfg.debounce.quiet = Duration::ZERO;
    cfg.max_events_per_update = usize::MAX;
    cfg.debounce.max_lines = usize::MAX;
    let mgr = WatchManager::new(
        cfg,
        vec![herald::watch::upstream(
            Target::Http(url),
            Default::default(),
            64 << 20,
        )],
        tx,
        if std::env::var_os("HERALD_BENCH_LOG").is_some() {
            WatchLog::stderr(false)
        } else {
            WatchLog::silent()
        },
        None,
    );
    mgr.watch_start("cm", "k8s-events://watch/configmaps?namespace=*", None)
        .await
        .unwrap();
    api.wait("herald's watch", |a| a.watches() == 1).await;
    let t0 = Instant::now();
    put_all(api, n, round);
    api.put("", "default", "zz-final", json!({"round": round}));
    let done = tokio::time::timeout(Duration::from_secs(600), async {
        while let Some(notice) = rx.recv().await {
            for l in notice
                .lines
                .iter()
                .filter(|l| l.starts_with("GAP") || l.contains("missed"))
            {
                eprintln!("  {via}: {l}");
            }
            if notice.lines.iter().any(|l| l.contains("zz-final")) {
                return Instant::now();
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the last event arrived");
    let events = mgr.watch_list()[0].events;
    mgr.shutdown().await;
    api.wait("herald's watch closed", |a| a.watches() == 0)
        .await;
    (events as f64 / (done - t0).as_secs_f64(), events)
}

/// (herald's RSS KiB, its children's RSS KiB, seconds until 100 watches are open,
/// connections the API server accepted).
async fn memory(api: &FakeApi, kubeconfig: &str, via: &str) -> (u64, u64, f64, u64) {
    for i in 0..1000 {
        api.put(
            "",
            &format!("ns-{:03}", i % 100),
            &format!("obj-{i:04}"),
            json!({"i": i}),
        );
    }
    let (url, child) = herald_k8s(kubeconfig, 256, via).await;
    let pid = child.id().unwrap();
    let conn = connect(
        &Target::Http(url),
        &Default::default(),
        client_config(),
        4 << 20,
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let mut filter = SubscriptionFilter::builder();
    for i in 0..100 {
        filter = filter
            .resource_subscription(format!("k8s-events://watch/configmaps?namespace=ns-{i:03}"));
    }
    let _sub = conn.listen(filter.build()).await.unwrap();
    api.wait("100 watches", |a| a.watches() == 100).await;
    let took = t0.elapsed().as_secs_f64();
    let kubectl: u64 = children(pid).into_iter().map(rss_kib).sum();
    (rss_kib(pid), kubectl, took, api.connections())
}

/// One watch of every configmap, whole or `metadata` alone, in a fresh `herald k8s`: its RSS
/// (KiB) once seeded, and the seconds the first read (which waits for the seed) took.
async fn seeded(kubeconfig: &str, metadata: bool) -> (u64, f64) {
    let (url, child) = herald_k8s(kubeconfig, 256, "api").await;
    let conn = connect(
        &Target::Http(url),
        &Default::default(),
        client_config(),
        64 << 20,
    )
    .await
    .unwrap();
    let uri = if metadata {
        "k8s-events://watch/configmaps?namespace=*&metadata=true"
    } else {
        "k8s-events://watch/configmaps?namespace=*"
    };
    let t0 = Instant::now();
    conn.read_resource(rmcp::model::ReadResourceRequestParams::new(uri.to_owned()))
        .await
        .expect("the seeded watch is read");
    let took = t0.elapsed().as_secs_f64();
    let rss = rss_kib(child.id().unwrap());
    drop(conn);
    drop(child);
    (rss, took)
}

/// Part 3: whole objects against metadata alone, for 10,000 objects.
async fn metadata_against_whole(dir: &std::path::Path) {
    let api = FakeApi::start().await;
    let kc = api.kubeconfig(dir);
    let kc = kc.to_str().unwrap();
    let filler = "x".repeat(2000);
    for i in 0..10_000 {
        api.put_labeled(
            "",
            &format!("ns-{:02}", i % 50),
            &format!("obj-{i:05}"),
            json!({"i": i, "payload": filler}),
            json!({"app": format!("app-{}", i % 7)}),
        );
    }
    // Alternating, twice each, the better of each pair kept.
    let mut whole = (u64::MAX, f64::MAX);
    let mut meta = (u64::MAX, f64::MAX);
    for _ in 0..2 {
        for (m, best) in [(false, &mut whole), (true, &mut meta)] {
            let (rss, took) = seeded(kc, m).await;
            *best = (best.0.min(rss), best.1.min(took));
        }
    }
    println!(
        "10,000 objects of ~2 KiB, one watch: whole objects {:.1} MiB, seeded in {:.2} s; \
         metadata=true {:.1} MiB, seeded in {:.2} s; metadata / whole: memory {:.2}x, time {:.2}x",
        whole.0 as f64 / 1024.0,
        whole.1,
        meta.0 as f64 / 1024.0,
        meta.1,
        meta.0 as f64 / whole.0 as f64,
        meta.1 / whole.1
    );
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
    let dir = std::env::temp_dir().join(format!("herald-k8s-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if std::env::var("HERALD_BENCH_ONLY").is_ok_and(|v| v == "metadata") {
        metadata_against_whole(&dir).await;
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let api = FakeApi::start().await;
    let kc = api.kubeconfig(&dir);
    let kc = kc.to_str().unwrap();
    // 1,000 objects exist before any consumer starts; every event is then a MODIFIED.
    put_all(&api, 1000, 0);
    let raw = raw_kubectl(&api, kc, n).await;
    let (herald, events) = through_herald(&api, kc, n, "api", 2).await;
    let (via_kubectl, via_events) = through_herald(&api, kc, n, "kubectl", 3).await;
    let all = n as u64 + 1;
    println!(
        "k8s events, {n} MODIFIED over 1,000 configmaps: raw kubectl get -w {raw:.0} events/s; \
         herald k8s to the watch client {herald:.0} events/s ({events} of {all} delivered); \
         ratio {:.2}x (target >= 1.5x, every event) -> {}",
        herald / raw,
        if herald / raw >= 1.5 && events == all {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  the same with --watch-via kubectl: {via_kubectl:.0} events/s ({via_events} of {all}); \
         ratio {:.2}x; API / kubectl watcher {:.2}x",
        via_kubectl / raw,
        herald / via_kubectl
    );
    if std::env::var("HERALD_BENCH_ONLY").is_ok_and(|v| v == "events") {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    for (label, via, tls) in [
        ("HTTPS (h2)", "api", true),
        ("plain HTTP (HTTP/1.1)", "api", false),
        ("--watch-via kubectl, plain HTTP", "kubectl", false),
    ] {
        let (api, kc) = if tls {
            let (api, pki) = FakeApi::start_tls().await;
            let kc = api.kubeconfig_tls(&dir, &pki);
            (api, kc)
        } else {
            let api = FakeApi::start().await;
            let kc = api.kubeconfig(&dir);
            (api, kc)
        };
        let (herald_rss, children_rss, took, conns) = memory(&api, kc.to_str().unwrap(), via).await;
        let total = (herald_rss + children_rss) as f64 / 1024.0;
        println!(
            "1,000 objects, 100 watched URIs, {label}: herald {:.1} MiB + what it started {:.1} MiB = {total:.1} MiB \
             (target <= 60 MiB -> {}); all 100 watches up in {took:.2} s (target <= 1 s -> {}); \
             {conns} connection(s) to the API server",
            herald_rss as f64 / 1024.0,
            children_rss as f64 / 1024.0,
            if total <= 60.0 { "met" } else { "MISSED" },
            if took <= 1.0 { "met" } else { "MISSED" },
        );
    }
    metadata_against_whole(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
}
