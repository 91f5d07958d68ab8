//! Notification latency: time from a `memo_set` call's response to the matching
//! `notifications/resources/updated`, over stdio, HTTP and QUIC, against the real `herald memo`
//! binary; plus the idle RSS of `herald memo`.
//!
//! `cargo bench --bench notify` (HERALD_BENCH_N overrides the 10,000 calls per transport).
//! With `HERALD_BENCH_BASELINE=/path/to/an/older/herald`, each transport runs with that binary
//! (the memo server) and this build's in turn (A-B-B-A, half the calls each), in the same run,
//! and prints `NAME: this build / baseline: p50 X.XXx, p99 Y.YYx`; the targets are checked on
//! this build's runs, the idle RSS on this build alone. Build the baseline with the bench
//! profile, as `cargo bench` builds this one (docs/benchmarks.md).
//! Targets on a 2-core machine: p99 < 2 ms on stdio and QUIC, < 5 ms on HTTP; idle RSS < 15 MB.

use std::time::{Duration, Instant};

use herald::transport::client::{client_config, connect};

use herald::transport::target::Target;
use herald::transport::tls::ClientTrust;
use rmcp::model::{CallToolRequestParams, ServerNotification, SubscriptionFilter};
use serde_json::{Value, json};

#[path = "common.rs"]
mod common;

use common::{BIN, Build, compare, ms, pct, print_baseline, print_ratio, rss_kib};

struct Spawned {
    child: tokio::process::Child,
    listening: Value,
}

async fn run(name: &str, target: Target, trust: ClientTrust, n: usize) -> Vec<Duration> {
    let conn = connect(&target, &trust, client_config(), 4 << 20)
        .await
        .expect("connect");
    let mut sub = conn
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("memo://notes")
                .build(),
        )
        .await
        .expect("listen");
    let mut lat = Vec::with_capacity(n);
    // Warm up connection pools and caches.
    for i in 0..(n / 20).max(10) {
        call_and_wait(&conn, &mut sub, i as i64 - 1_000_000).await;
    }
    for i in 0..n {
        lat.push(call_and_wait(&conn, &mut sub, i as i64).await);
    }
    lat.sort();
    println!(
        "{name:>6}: n={n} p50={} p99={} max={}",
        ms(pct(&lat, 0.50)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    lat
}

async fn call_and_wait(
    conn: &herald::transport::client::Connection,
    sub: &mut rmcp::service::Subscription,
    i: i64,
) -> Duration {
    let args = json!({"key": "bench", "value": i});
    conn.call_tool(
        CallToolRequestParams::new("memo_set").with_arguments(args.as_object().unwrap().clone()),
    )
    .await
    .expect("memo_set");
    let responded = Instant::now();
    match sub.next().await.expect("healthy").expect("open") {
        ServerNotification::ResourceUpdatedNotification(_) => responded.elapsed(),
        other => panic!("unexpected {other:?}"),
    }
}

/// A `herald memo` serving HTTP and QUIC, from the herald at `bin`.
async fn memo_server(bin: &str) -> Spawned {
    let (child, listening) = common::memo_with(bin, &[]).await;
    Spawned { child, listening }
}

/// One transport's latencies (this build's); with a baseline, A-B-B-A and the ratio line.
/// `servers` holds this build's memo server, then the baseline's, which the HTTP and QUIC runs
/// share (as one server served both before there was a baseline).
async fn transport(
    name: &str,
    n: usize,
    baseline: Option<&'static str>,
    servers: &[Spawned],
) -> Vec<Duration> {
    let server = |b: Build| &servers[usize::from(b.baseline)].listening;
    let sides = compare(baseline, async |b: Build| {
        let (target, trust) = match name {
            "stdio" => (
                Target::Stdio(format!("{} --store :memory: memo", b.bin)),
                ClientTrust::default(),
            ),
            "http" => (
                Target::Http(server(b)["http_url"].as_str().unwrap().to_owned()),
                ClientTrust::default(),
            ),
            _ => (
                Target::Quic(server(b)["quic"].as_str().unwrap().to_owned()),
                ClientTrust {
                    ca: None,
                    pin: Some(server(b)["quic_fingerprint"].as_str().unwrap().to_owned()),
                    token: None,
                    oauth: None,
                },
            ),
        };
        run(&b.label(name), target, trust, b.part(n)).await
    })
    .await;
    let (before, after) = sides.latencies();
    if baseline.is_some() {
        print_ratio(&format!("{name:>6}"), &before, &after);
    }
    after
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let baseline = common::baseline();
    println!("notify latency: memo_set response -> notifications/resources/updated ({BIN})");
    print_baseline(baseline);

    let stdio = transport("stdio", n, baseline, &[]).await;

    let mut servers = vec![memo_server(BIN).await];
    if let Some(b) = baseline {
        servers.push(memo_server(b).await);
    }
    let http = transport("http", n, baseline, &servers).await;
    let quic = transport("quic", n, baseline, &servers).await;
    drop(servers);

    // Idle RSS: a fresh `herald memo` serving HTTP and QUIC, after one client came and went.
    let idle = memo_server(BIN).await;
    let url = idle.listening["http_url"].as_str().unwrap().to_owned();
    let conn = connect(
        &Target::Http(url),
        &ClientTrust::default(),
        client_config(),
        4 << 20,
    )
    .await
    .unwrap();
    conn.list_all_tools().await.unwrap();
    conn.close().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = idle.child.id().unwrap();
    let rss = rss_kib(pid);
    println!(
        "idle RSS of herald memo (HTTP + QUIC): {:.1} MB",
        rss as f64 / 1024.0
    );

    let verdict = |name: &str, lat: &[Duration], target_ms: f64| {
        let p99 = pct(lat, 0.99).as_secs_f64() * 1e3;
        println!(
            "target {name}: p99 {p99:.3} ms vs {target_ms} ms -> {}",
            if p99 < target_ms { "met" } else { "MISSED" }
        );
    };
    verdict("stdio", &stdio, 2.0);
    verdict("quic", &quic, 2.0);
    verdict("http", &http, 5.0);
    println!(
        "target idle RSS: {:.1} MB vs 15 MB -> {}",
        rss as f64 / 1024.0,
        if rss < 15 * 1024 { "met" } else { "MISSED" }
    );
}
