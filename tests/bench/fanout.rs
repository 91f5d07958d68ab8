//! Fan-out: many `subscriptions/listen` streams on one URI (`memo://notes`), and how long one
//! change takes to reach the last of them.
//!
//! Paths: straight to `herald memo` over HTTP (one TCP connection per stream, HTTP/1.1 SSE);
//! through `herald gateway` over HTTP (its slug is that memo server over HTTP, so every
//! stream shares one upstream subscription); and straight to `herald memo` over QUIC (every
//! listen on one MCP connection, one bidirectional stream).
//!
//! Per size and path: open the streams (100 at a time until acknowledged), then 10 rounds (after
//! one to warm up) of one `memo_set` on the memo server, through a separate keep-alive HTTP
//! connection, timed from just before it is sent to each stream's `resources/updated` (stamped
//! by the task reading that stream as the bytes arrive). Each round's figure is the time to the
//! last stream (and to the median one); p50 and p99 (the max of 10) over the rounds. RSS of the
//! servers before the streams and with them all open.
//!
//! This build runs with no flag for the HTTP paths: each stream comes as a client of its own
//! behind a proxy on this host (`X-Forwarded-For`), within the default listen budgets (issue
//! 33); a baseline from before them gets the flags it needs. The QUIC path holds every listen
//! on one connection, whose budget is raised for both.
//!
//! Targets: 10,000 streams under 200 MB RSS for the gateway and for the source, one change to
//! all of them within 200 ms (p99 of the 10 rounds); 1,000 streams within 20 ms.
//!
//! `cargo bench --bench fanout` (HERALD_FANOUT_SIZES overrides the sizes, e.g. "1000,10000").
//! With `HERALD_BENCH_BASELINE=/path/to/an/older/herald`, each path at each size runs with that
//! binary (the memo server, and the gateway) and this build's in turn (A-B-B-A, 5 of the 10
//! rounds each, the streams opened anew for each run), in the same run, and prints
//! `N streams, PATH, time to last stream: this build / baseline: p50 X.XXx, p99 Y.YYx`; the
//! targets are checked on this build's runs together (RSS: the larger of its two). Build the
//! baseline with the bench profile, as `cargo bench` builds this one (docs/benchmarks.md).

#[path = "common.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::transport::tls::ClientTrust;
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::process::Child;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use common::{
    BIN, Build, RawHttp, compare, ms, pct, print_baseline, print_ratio, rss_kib, verdict,
};

const URI: &str = "memo://notes";
const ROUNDS: usize = 10;
/// Streams being opened at once (connected but not yet acknowledged): under herald's listen
/// backlog (128), whose overflow drops SYNs and costs a 1 s retransmit.
const OPENING: usize = 100;
/// How long one round, or opening the streams, may go without progress.
const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "herald-bench-fanout-token";
/// Connections each server may hold: every stream of the 10,000 has its own.
const MAX_CONNECTIONS: &str = "12000";
const MAX_STREAMS: &str = "20000";
const TARGET_RSS_MB: f64 = 200.0;

/// What the stream readers report.
enum Ev {
    Ack(usize),
    Update(usize, Instant),
    Fail(usize, String),
}

type Tx = mpsc::UnboundedSender<Ev>;

/// One HTTP listen stream: connect, listen, hold the opening permit until acknowledged, then
/// report every `resources/updated` with the time its bytes were read.
async fn http_stream(
    i: usize,
    url: Arc<str>,
    token: Option<&'static str>,
    tx: Tx,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<(), String> {
    let mut c = RawHttp::connect(&url, token)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // Each stream a client of its own behind a proxy on this host (10.0.0.0/8 addresses).
    c.forwarded_for = Some(format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255));
    c.send_rpc(
        &common::listen_request(i as u64 + 1, URI),
        "subscriptions/listen",
        None,
    )
    .await
    .map_err(|e| format!("send: {e}"))?;
    let mut head = c.read_head().await.map_err(|e| format!("head: {e}"))?;
    if head.status != 200 || !head.content_type.starts_with("text/event-stream") {
        let mut body = Vec::new();
        while let Ok(false) = c.read_body_some(&mut head.decoder, &mut body).await {}
        return Err(format!(
            "HTTP {} {}: {}",
            head.status,
            head.content_type,
            String::from_utf8_lossy(&body)
        ));
    }
    let mut permit = Some(permit);
    let mut sse = common::Sse::default();
    let mut body = Vec::with_capacity(512);
    let mut error = None;
    loop {
        body.clear();
        let ended = c
            .read_body_some(&mut head.decoder, &mut body)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let now = Instant::now();
        sse.feed(&body, |data| {
            if common::contains(data, b"notifications/resources/updated") {
                let _ = tx.send(Ev::Update(i, now));
            } else if common::contains(data, b"notifications/subscriptions/acknowledged") {
                let _ = tx.send(Ev::Ack(i));
                permit.take();
            } else if common::contains(data, b"\"error\"") {
                error = Some(String::from_utf8_lossy(data).into_owned());
            }
        });
        if let Some(e) = error {
            return Err(e);
        }
        if ended {
            return Err("the server ended the stream".into());
        }
    }
}

fn open_http(url: &str, token: Option<&'static str>, n: usize, tx: &Tx) -> Vec<JoinHandle<()>> {
    let url: Arc<str> = url.into();
    let opening = Arc::new(Semaphore::new(OPENING));
    (0..n)
        .map(|i| {
            let (url, tx, opening) = (url.clone(), tx.clone(), opening.clone());
            tokio::spawn(async move {
                let permit = opening.acquire_owned().await.unwrap();
                if let Err(e) = http_stream(i, url, token, tx.clone(), permit).await {
                    let _ = tx.send(Ev::Fail(i, e));
                }
            })
        })
        .collect()
}

/// The number after `"KEY":` in a JSON line (a fast scan: the reader must keep up).
fn number_after(line: &[u8], key: &[u8]) -> Option<u64> {
    let at = line.windows(key.len()).position(|w| w == key)? + key.len();
    let digits = &line[at..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// Every listen on one QUIC MCP connection (one bidirectional stream), ids 1..=n; one task
/// reads them all. Returns the reader and what keeps the connection open.
async fn open_quic(
    addr: &str,
    pin: &str,
    n: usize,
    tx: &Tx,
) -> (
    JoinHandle<()>,
    (quinn::Endpoint, quinn::Connection, quinn::SendStream),
) {
    let trust = ClientTrust {
        pin: Some(pin.to_owned()),
        ..Default::default()
    };
    let (endpoint, conn, mut send, mut recv) = herald::transport::quic::connect(
        addr,
        &trust,
        herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
    )
    .await
    .expect("QUIC connect");
    let tx = tx.clone();
    let reader = tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            let got = match recv.read(&mut chunk).await {
                Ok(Some(k)) => k,
                Ok(None) => {
                    let _ = tx.send(Ev::Fail(0, "the QUIC stream ended".into()));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Ev::Fail(0, format!("QUIC read: {e}")));
                    return;
                }
            };
            let now = Instant::now();
            buf.extend_from_slice(&chunk[..got]);
            let mut start = 0;
            while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
                let line = &buf[start..start + nl];
                start += nl + 1;
                let sub = number_after(line, b"\"io.modelcontextprotocol/subscriptionId\":");
                if common::contains(line, b"notifications/resources/updated") {
                    if let Some(id) = sub {
                        let _ = tx.send(Ev::Update(id as usize - 1, now));
                    }
                } else if common::contains(line, b"notifications/subscriptions/acknowledged") {
                    if let Some(id) = sub {
                        let _ = tx.send(Ev::Ack(id as usize - 1));
                    }
                } else if common::contains(line, b"\"error\"") {
                    let id = number_after(line, b"\"id\":").unwrap_or(1);
                    let _ = tx.send(Ev::Fail(
                        id as usize - 1,
                        String::from_utf8_lossy(line).into_owned(),
                    ));
                }
            }
            buf.drain(..start);
        }
    });
    let mut batch = Vec::with_capacity(1 << 16);
    for i in 0..n {
        batch.extend_from_slice(common::listen_request(i as u64 + 1, URI).as_bytes());
        batch.push(b'\n');
        if batch.len() > 60_000 || i + 1 == n {
            send.write_all(&batch).await.expect("QUIC write");
            batch.clear();
        }
    }
    (reader, (endpoint, conn, send))
}

/// Waits for `n` streams to be acknowledged (or to fail): how many are live, and how long it
/// took.
async fn opened(rx: &mut mpsc::UnboundedReceiver<Ev>, n: usize, t0: Instant) -> (usize, Duration) {
    let mut acked = vec![false; n];
    let (mut acks, mut fails) = (0, 0);
    let mut first_fail = None;
    while acks + fails < n {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(Ev::Ack(i))) if i < n && !acked[i] => {
                acked[i] = true;
                acks += 1;
            }
            Ok(Some(Ev::Fail(i, e))) => {
                fails += 1;
                first_fail.get_or_insert(format!("stream {i}: {e}"));
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let took = t0.elapsed();
    if acks < n {
        println!(
            "    only {acks} of {n} streams acknowledged ({fails} failed{})",
            first_fail
                .map(|e| format!("; first: {}", e.chars().take(300).collect::<String>()))
                .unwrap_or_default()
        );
    }
    (acks, took)
}

/// A round's figures: time to the last stream, to the median one.
struct Round {
    last: Duration,
    median: Duration,
}

/// One `memo_set` on the memo server, and every live stream's `resources/updated`.
async fn round(
    setter: &mut RawHttp,
    rx: &mut mpsc::UnboundedReceiver<Ev>,
    n: usize,
    live: usize,
    value: u64,
) -> Result<Round, String> {
    let mut seen = vec![false; n];
    let mut arrivals = Vec::with_capacity(live);
    let t0 = Instant::now();
    setter
        .call_tool(value, "memo_set", &json!({"key": "fanout", "value": value}))
        .await?;
    let mut fails = 0;
    while arrivals.len() < live {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(Ev::Update(i, at))) if i < n && !seen[i] => {
                seen[i] = true;
                arrivals.push(at - t0);
            }
            Ok(Some(Ev::Fail(_, _))) => fails += 1,
            Ok(Some(_)) => {}
            _ => {
                return Err(format!(
                    "{} of {live} streams saw the change ({fails} failed) within {}",
                    arrivals.len(),
                    ms(WAIT)
                ));
            }
        }
    }
    arrivals.sort();
    Ok(Round {
        last: *arrivals.last().unwrap(),
        median: pct(&arrivals, 0.5),
    })
}

struct Outcome {
    label: &'static str,
    n: usize,
    /// Sorted times to the last stream, and to the median stream.
    last: Vec<Duration>,
    median: Vec<Duration>,
    /// (process, RSS KiB before the streams, with them) — the first is the one the RSS target
    /// is about.
    rss: Vec<(&'static str, u64, u64)>,
}

enum Streams {
    Http {
        url: String,
        token: Option<&'static str>,
    },
    Quic {
        addr: String,
        pin: String,
    },
}

/// Opens `n` streams, runs the rounds (this run's part of [`ROUNDS`]), closes the streams.
async fn run(
    label: &'static str,
    b: Build,
    n: usize,
    streams: Streams,
    memo_url: &str,
    procs: &[(&'static str, u32)],
) -> Option<Outcome> {
    let mut setter = RawHttp::connect(memo_url, None).await.unwrap();
    setter
        .call_tool(0, "memo_set", &json!({"key": "warm", "value": 0}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before: Vec<u64> = procs.iter().map(|(_, pid)| rss_kib(*pid)).collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let mut quic = None;
    match &streams {
        Streams::Http { url, token } => tasks = open_http(url, *token, n, &tx),
        Streams::Quic { addr, pin } => {
            let (reader, keep) = open_quic(addr, pin, n, &tx).await;
            tasks.push(reader);
            quic = Some(keep);
        }
    }
    drop(tx);
    let (live, took) = opened(&mut rx, n, t0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with: Vec<u64> = procs.iter().map(|(_, pid)| rss_kib(*pid)).collect();
    let mut last = Vec::new();
    let mut median = Vec::new();
    let mut failed = None;
    let me = std::process::id();
    let mut cpu = vec![Duration::ZERO; procs.len() + 1];
    if live > 0 {
        // Round 0 warms up.
        for r in 0..=b.part(ROUNDS) {
            if r == 1 {
                cpu[0] = common::cpu_time(me);
                for (c, (_, pid)) in cpu[1..].iter_mut().zip(procs) {
                    *c = common::cpu_time(*pid);
                }
            }
            match round(&mut setter, &mut rx, n, live, (n * 100 + r + 1) as u64).await {
                Ok(x) if r > 0 => {
                    last.push(x.last);
                    median.push(x.median);
                }
                Ok(_) => {}
                Err(e) => {
                    failed = Some(format!("round {r}: {e}"));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let rounds = last.len().max(1) as u32;
    let mut cpu_text = vec![format!(
        "bench client {}",
        ms((common::cpu_time(me) - cpu[0]) / rounds)
    )];
    for (c, (name, pid)) in cpu[1..].iter().zip(procs) {
        cpu_text.push(format!(
            "{name} {}",
            ms((common::cpu_time(*pid) - *c) / rounds)
        ));
    }
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    drop(quic);
    last.sort();
    median.sort();
    let rss: Vec<(&'static str, u64, u64)> = procs
        .iter()
        .zip(before.iter().zip(&with))
        .map(|((name, _), (b, w))| (*name, *b, *w))
        .collect();
    let shown = b.label(label);
    let rss_text: Vec<String> = rss
        .iter()
        .map(|(name, b, w)| {
            format!(
                "{name} {:.1} -> {:.1} MB ({:.1} KB/stream)",
                *b as f64 / 1024.0,
                *w as f64 / 1024.0,
                (*w as f64 - *b as f64) / live.max(1) as f64
            )
        })
        .collect();
    if let Some(e) = &failed {
        println!("  {shown:<13} n={n}: FAILED {e}");
    }
    if last.is_empty() {
        println!(
            "  {shown:<13} n={n}: no figures; RSS {}",
            rss_text.join(", ")
        );
        return None;
    }
    println!(
        "  {shown:<13} n={n}: {live} streams open in {:.2} s | time to last stream p50 {} p99 {} | to the median stream p50 {}\n  {:<13} RSS {} | CPU per round (1 change, 10 ms ticks): {}",
        took.as_secs_f64(),
        ms(pct(&last, 0.5)),
        ms(*last.last().unwrap()),
        ms(pct(&median, 0.5)),
        "",
        rss_text.join(", "),
        cpu_text.join(", ")
    );
    Some(Outcome {
        label,
        n,
        last,
        median,
        rss,
    })
}

/// The flags a baseline from before the listen budgets (issue 33) needs for 10,000 streams
/// from one address; this build takes them with none (its clients come from their own
/// forwarded addresses, and 20,000 connections are its default).
fn older_flags(b: &Build) -> &'static [&'static str] {
    if b.baseline {
        &[
            "--max-listen-streams",
            MAX_STREAMS,
            "--max-connections",
            MAX_CONNECTIONS,
        ]
    } else {
        &[]
    }
}

async fn memo(b: &Build) -> (Child, Value) {
    common::memo_with(b.bin, older_flags(b)).await
}

impl Outcome {
    /// One side's runs together: the rounds' figures merged; the RSS of the run whose first
    /// process was largest with the streams open. None if a run had no figures.
    fn merge(runs: Vec<Option<Outcome>>) -> Option<Outcome> {
        let mut runs: Vec<Outcome> = runs.into_iter().collect::<Option<_>>()?;
        if runs.len() == 1 {
            return runs.pop();
        }
        let last = common::merged(runs.iter().map(|o| o.last.as_slice()));
        let median = common::merged(runs.iter().map(|o| o.median.as_slice()));
        let big = runs
            .iter()
            .max_by_key(|o| o.rss.first().map_or(0, |r| r.2))?;
        Some(Outcome {
            label: big.label,
            n: big.n,
            last,
            median,
            rss: big.rss.clone(),
        })
    }
}

/// One measured case at one size: without a baseline, one run; with one, A-B-B-A (half the
/// rounds each) and the ratio line of the time to the last stream. This build's outcome.
async fn case(
    label: &str,
    n: usize,
    baseline: Option<&'static str>,
    run: impl AsyncFnMut(Build) -> Option<Outcome>,
) -> Option<Outcome> {
    let sides = compare(baseline, run).await;
    let this = Outcome::merge(sides.this);
    if baseline.is_some() {
        let name = format!("{n} streams, {label}, time to last stream");
        match (Outcome::merge(sides.baseline), &this) {
            (Some(before), Some(after)) => print_ratio(&name, &before.last, &after.last),
            _ => println!("{name}: no ratio (a run had no figures)"),
        }
    }
    this
}

async fn stop(mut child: Child) {
    let _ = child.start_kill();
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nofile = common::raise_nofile();
    let sizes: Vec<usize> = std::env::var("HERALD_FANOUT_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000]);
    let baseline = common::baseline();
    println!(
        "fan-out bench: subscriptions/listen on {URI}, one memo_set, {ROUNDS} rounds per size; open files {nofile}; load {} ({BIN})",
        common::load()
    );
    print_baseline(baseline);
    let scratch = std::env::temp_dir().join(format!("herald-bench-fanout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for &n in &sizes {
        println!("\n{n} streams:");
        // Straight to herald memo over HTTP.
        let direct = case("direct HTTP", n, baseline, async |b: Build| {
            let (m, v) = memo(&b).await;
            let url = v["http_url"].as_str().unwrap().to_owned();
            let pid = m.id().unwrap();
            let o = run(
                "direct HTTP",
                b,
                n,
                Streams::Http {
                    url: url.clone(),
                    token: None,
                },
                &url,
                &[("memo", pid)],
            )
            .await;
            stop(m).await;
            o
        })
        .await;
        outcomes.extend(direct);

        // Through herald gateway, whose slug is a memo server over HTTP.
        let gateway = case("gateway HTTP", n, baseline, async |b: Build| {
            let (m, v) = memo(&b).await;
            let memo_url = v["http_url"].as_str().unwrap().to_owned();
            let memo_pid = m.id().unwrap();
            let cfg = scratch.join("gateway.toml");
            std::fs::write(
                &cfg,
                format!(
                    "[[slug]]\nname = \"m\"\nhttp = \"{memo_url}\"\n\n[[token]]\nname = \"bench\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
                    hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()))
                ),
            )
            .unwrap();
            let mut args = vec![
                "--store",
                ":memory:",
                "gateway",
                "--config",
                cfg.to_str().unwrap(),
                "--http",
                "127.0.0.1:0",
            ];
            args.extend_from_slice(older_flags(&b));
            let (gw, gv) = common::serve_with(b.bin, &args).await;
            let o = run(
                "gateway HTTP",
                b,
                n,
                Streams::Http {
                    url: gv["http_url"].as_str().unwrap().to_owned(),
                    token: Some(TOKEN),
                },
                &memo_url,
                &[("gateway", gw.id().unwrap()), ("memo", memo_pid)],
            )
            .await;
            stop(gw).await;
            stop(m).await;
            o
        })
        .await;
        outcomes.extend(gateway);

        // Straight to herald memo over QUIC.
        let quic = case("direct QUIC", n, baseline, async |b: Build| {
            // Every listen on one connection: its budget raised, whichever build.
            let (m, v) = common::memo_with(
                b.bin,
                &[
                    "--max-listen-streams",
                    MAX_STREAMS,
                    "--max-connections",
                    MAX_CONNECTIONS,
                ],
            )
            .await;
            let url = v["http_url"].as_str().unwrap().to_owned();
            let pid = m.id().unwrap();
            let o = run(
                "direct QUIC",
                b,
                n,
                Streams::Quic {
                    addr: v["quic"].as_str().unwrap().to_owned(),
                    pin: v["quic_fingerprint"].as_str().unwrap().to_owned(),
                },
                &url,
                &[("memo", pid)],
            )
            .await;
            stop(m).await;
            o
        })
        .await;
        outcomes.extend(quic);
    }

    println!();
    for &n in &sizes {
        let find = |label: &str| outcomes.iter().find(|o| o.n == n && o.label == label);
        if let (Some(d), Some(g)) = (find("direct HTTP"), find("gateway HTTP")) {
            println!(
                "{n} streams: gateway vs direct time to last stream: p50 {:.2}x, p99 {:.2}x; to the median stream p50 {:.2}x",
                pct(&g.last, 0.5).as_secs_f64() / pct(&d.last, 0.5).as_secs_f64(),
                g.last.last().unwrap().as_secs_f64() / d.last.last().unwrap().as_secs_f64(),
                pct(&g.median, 0.5).as_secs_f64() / pct(&d.median, 0.5).as_secs_f64(),
            );
        }
    }
    for o in &outcomes {
        let bound = match o.n {
            10_000 => Duration::from_millis(200),
            1_000 => Duration::from_millis(20),
            _ => continue,
        };
        let p99 = *o.last.last().unwrap();
        println!(
            "target {} streams, {}: one change reaches all, p99 {} vs <= {} -> {}",
            o.n,
            o.label,
            ms(p99),
            ms(bound),
            verdict(p99 <= bound)
        );
        if o.n == 10_000 {
            let (name, _, with) = o.rss[0];
            let mb = with as f64 / 1024.0;
            println!(
                "target {} streams, {}: {name} RSS {mb:.1} MB vs <= {TARGET_RSS_MB} MB -> {}",
                o.n,
                o.label,
                verdict(mb <= TARGET_RSS_MB)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
