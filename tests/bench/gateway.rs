//! The gateway's cost per tool call: `tools/call` of `memo_set` over Streamable HTTP, straight
//! to `herald memo` and through `herald gateway` with the memo server behind slug `m` on each
//! kind of upstream (stdio, HTTP, QUIC), and through `herald up`'s gateway to its in-process
//! memo role.
//!
//! The client is this bench's own: raw HTTP/1.1 on one keep-alive TCP connection per simulated
//! client (`TCP_NODELAY`), so the figures are the servers' and not a client library's.
//!
//! 1. One client, sequential: p50 / p99 per call over N calls (after 200 to warm up).
//! 2. 64 clients at once, 10,000 calls in all: calls/s, p50, p99.
//! 3. Upstream connections: `herald_http_connections_accepted_total` of the memo server behind
//!    the HTTP slug, before and after the 64-client run (a gateway that pools its upstream
//!    connections opens at most 64).
//! 4. The gateway's RSS after its runs.
//!
//! For reference, the same calls through HAProxy in HTTP mode in front of the same memo (the
//! reverse proxy a user would put there instead, with no tokens or slugs to check): the cost
//! of a second HTTP exchange in the same setting, the floor of the HTTP slug's hop. Skipped,
//! saying so, when HAProxy is not installed (`apt-get install haproxy`; `HERALD_HAPROXY`
//! names another binary).
//!
//! Targets: p50 at one client within 1.8x of direct through the HTTP slug, 1.05x through
//! `herald up`, 1.3x through the QUIC slug; at 64 clients at least 0.5x direct's calls/s
//! through the HTTP slug, 0.8x and 10,000 calls/s through the others; the stdio slug adds at
//! most a pipe round trip and 0.05 ms to direct.
//!
//! `cargo bench --bench gateway` (HERALD_BENCH_N overrides the 2,000 sequential calls;
//! HERALD_BENCH_ONLY=stdio, http, quic, up or haproxy runs direct and that case alone).
//! With `HERALD_BENCH_BASELINE=/path/to/an/older/herald`, each case (direct, each slug kind,
//! `herald up`) runs with that binary (the memo server, the gateway and its stdio child, or
//! `herald up`) and this build's in turn (A-B-B-A, half the calls of both loads each), in the
//! same run, and prints `NAME, 1 client: this build / baseline: p50 X.XXx, p99 Y.YYx` and
//! `NAME, 64 clients: this build / baseline: calls/s Z.ZZx`; the ratios to direct and the
//! targets are this build's runs together. Build the baseline with the bench profile, as
//! `cargo bench` builds this one (docs/benchmarks.md).

#[path = "common.rs"]
mod common;
#[path = "../shared/fd3.rs"]
mod fd3;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::Digest as _;
use tokio::process::Child;

use common::{
    BIN, Build, RawHttp, compare, ms, pct, print_baseline, print_rate_ratio, print_ratio, rss_kib,
    verdict,
};

const WAIT: Duration = Duration::from_secs(60);
/// The bearer token the bench's gateway config entitles to every slug.
const TOKEN: &str = "herald-bench-gateway-token";
const WARMUP: usize = 200;
const CLIENTS: usize = 64;
const TOTAL: usize = 10_000;
const TARGET_P50_RATIO: f64 = 1.3;
const TARGET_RATE_RATIO: f64 = 0.8;
const TARGET_RATE: f64 = 10_000.0;

/// A case's targets: p50 at one client (ratio to direct), calls/s at 64 clients (ratio to
/// direct, and an absolute floor, 0 for none). The HTTP slug's and `herald up`'s are issue
/// 33's (the hop is a second HTTP exchange and a second process on the same two cores); the
/// QUIC slug's the older ones.
fn targets(label: &str) -> (f64, f64, f64) {
    if label.contains("HTTP") {
        (1.8, 0.5, 0.0)
    } else if label.contains("herald up") {
        (1.05, TARGET_RATE_RATIO, 0.0)
    } else {
        (TARGET_P50_RATIO, TARGET_RATE_RATIO, TARGET_RATE)
    }
}

/// Where to call and what.
#[derive(Clone)]
struct Endpoint {
    url: String,
    token: Option<&'static str>,
    tool: &'static str,
}

impl Endpoint {
    async fn connect(&self) -> RawHttp {
        RawHttp::connect(&self.url, self.token)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}

struct Figures {
    /// One client, sorted.
    seq: Vec<Duration>,
    /// 64 clients, sorted.
    conc: Vec<Duration>,
    /// How long the 64-client calls took.
    elapsed: Duration,
    rate: f64,
    errors: usize,
    first_error: Option<String>,
}

impl Figures {
    /// One side's runs together: latencies merged, calls/s over all their calls and time.
    fn merge(mut runs: Vec<Figures>) -> Figures {
        if runs.len() == 1 {
            return runs.pop().unwrap();
        }
        let seq = common::merged(runs.iter().map(|f| f.seq.as_slice()));
        let conc = common::merged(runs.iter().map(|f| f.conc.as_slice()));
        let elapsed = runs.iter().map(|f| f.elapsed).sum::<Duration>();
        Figures {
            rate: conc.len() as f64 / elapsed.as_secs_f64(),
            seq,
            conc,
            elapsed,
            errors: runs.iter().map(|f| f.errors).sum(),
            first_error: runs.into_iter().find_map(|f| f.first_error),
        }
    }
}

/// Waits until a call succeeds (a gateway may still be connecting its upstream).
async fn ready(ep: &Endpoint) {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < WAIT {
        if let Ok(mut c) = RawHttp::connect(&ep.url, ep.token).await {
            match c
                .call_tool(0, ep.tool, &json!({"key": "ready", "value": 0}))
                .await
            {
                Ok(()) => return,
                Err(e) => last = e,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never answered {}: {last}", ep.url, ep.tool);
}

async fn sequential(ep: &Endpoint, n: usize) -> Vec<Duration> {
    let mut c = ep.connect().await;
    for i in 0..WARMUP {
        c.call_tool(i as u64, ep.tool, &json!({"key": "k0", "value": i}))
            .await
            .unwrap();
    }
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let args = json!({"key": "k0", "value": i});
        let t = Instant::now();
        c.call_tool((WARMUP + i) as u64, ep.tool, &args)
            .await
            .unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    lat
}

/// `clients` connections, each warmed up with a few calls.
async fn warm_clients(ep: &Endpoint, clients: usize) -> Vec<RawHttp> {
    let mut tasks = Vec::new();
    for k in 0..clients {
        let ep = ep.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = ep.connect().await;
            for i in 0..5 {
                c.call_tool(i, ep.tool, &json!({"key": format!("k{k}"), "value": i}))
                    .await
                    .unwrap();
            }
            c
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// `total` calls spread over `conns`, all at once: (latencies sorted, elapsed, errors, the
/// first error).
async fn concurrent(
    ep: &Endpoint,
    conns: Vec<RawHttp>,
    total: usize,
) -> (Vec<Duration>, Duration, usize, Option<String>) {
    let clients = conns.len();
    let start = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for (k, mut c) in conns.into_iter().enumerate() {
        let calls = total / clients + usize::from(k < total % clients);
        let start = start.clone();
        let ep = ep.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(calls);
            let mut errors = 0;
            let mut first = None;
            let key = format!("k{k}");
            start.wait().await;
            for i in 0..calls {
                let args = json!({"key": key, "value": i});
                let t = Instant::now();
                match c.call_tool(1_000 + i as u64, ep.tool, &args).await {
                    Ok(()) => lat.push(t.elapsed()),
                    Err(e) => {
                        errors += 1;
                        first.get_or_insert(e);
                        // The connection may be broken: start a new one.
                        match RawHttp::connect(&ep.url, ep.token).await {
                            Ok(fresh) => c = fresh,
                            Err(_) => break,
                        }
                    }
                }
            }
            (lat, errors, first)
        }));
    }
    start.wait().await;
    let t0 = Instant::now();
    let mut lat = Vec::with_capacity(total);
    let mut errors = 0;
    let mut first = None;
    for t in tasks {
        let (l, e, f) = t.await.unwrap();
        lat.extend(l);
        errors += e;
        if first.is_none() {
            first = f;
        }
    }
    let elapsed = t0.elapsed();
    lat.sort();
    (lat, elapsed, errors, first)
}

/// What the upstream's accepted-connection count is now: the metric if the server has it,
/// else the sockets at its port in /proc/net/tcp.
enum Probe {
    Metric(u64),
    Sockets(std::collections::HashSet<u16>),
}

const CONN_METRIC: &str = "herald_http_connections_accepted_total";

async fn probe(upstream_url: &str) -> Probe {
    match common::metric(upstream_url, CONN_METRIC).await {
        Some(v) => Probe::Metric(v),
        None => Probe::Sockets(common::tcp_peers(common::split_url(upstream_url).0.port())),
    }
}

/// Runs both loads against `ep` (`n` sequential calls, `total` at 64 clients); with
/// `upstream`, counts the connections that server accepted during the 64-client run.
async fn measure(
    label: &str,
    ep: &Endpoint,
    n: usize,
    total: usize,
    upstream: Option<&str>,
    procs: &[(&str, u32)],
) -> Figures {
    ready(ep).await;
    let seq = sequential(ep, n).await;
    let conns = warm_clients(ep, CLIENTS).await;
    let before = match upstream {
        Some(u) => Some(probe(u).await),
        None => None,
    };
    let me = std::process::id();
    let cpu0: Vec<Duration> = procs.iter().map(|p| common::cpu_time(p.1)).collect();
    let own0 = common::cpu_time(me);
    let (conc, elapsed, errors, first_error) = concurrent(ep, conns, total).await;
    let own = common::cpu_time(me) - own0;
    let cores = |d: Duration| d.as_secs_f64() / elapsed.as_secs_f64();
    let mut cpu = vec![format!("bench client {:.2}", cores(own))];
    for ((name, pid), c0) in procs.iter().zip(cpu0) {
        cpu.push(format!("{name} {:.2}", cores(common::cpu_time(*pid) - c0)));
    }
    let rate = conc.len() as f64 / elapsed.as_secs_f64();
    println!(
        "{label:<22} 1 client: p50 {} p99 {} | {CLIENTS} clients: {rate:>7.0} calls/s p50 {} p99 {}{}",
        ms(pct(&seq, 0.5)),
        ms(pct(&seq, 0.99)),
        ms(pct(&conc, 0.5)),
        ms(pct(&conc, 0.99)),
        if errors > 0 {
            format!(" ({errors} calls failed)")
        } else {
            String::new()
        }
    );
    println!(
        "{:<22} CPU during the {CLIENTS}-client run, in cores: {}",
        "",
        cpu.join(", ")
    );
    if let (Some(u), Some(before)) = (upstream, before) {
        // Let closed connections settle into TIME_WAIT before reading the socket table.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = probe(u).await;
        let (opened, how) = match (before, after) {
            // The after read's own connection is counted in the after value.
            (Probe::Metric(b), Probe::Metric(a)) => (a.saturating_sub(b + 1), CONN_METRIC.to_owned()),
            (Probe::Sockets(b), Probe::Sockets(a)) => (
                a.difference(&b).count() as u64,
                "sockets at the upstream's port in /proc/net/tcp (the metric is missing; approximate: a port reused within the run counts once)".to_owned(),
            ),
            _ => (0, "the metric came and went: no figure".to_owned()),
        };
        println!(
            "{:<22} upstream connections opened: {opened} for {total} calls at concurrency {CLIENTS} -> {} (<= {CLIENTS}) [{how}; after a warm-up of {CLIENTS}x5 calls]",
            "",
            verdict(opened <= CLIENTS as u64)
        );
    }
    Figures {
        seq,
        conc,
        elapsed,
        rate,
        errors,
        first_error,
    }
}

fn gateway_config(dir: &Path, name: &str, slug: &str) -> std::path::PathBuf {
    let sha = hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()));
    let text = format!(
        "[[slug]]\nname = \"m\"\n{slug}\n\n[[token]]\nname = \"bench\"\nsha256 = \"{sha}\"\nslugs = [\"*\"]\n"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

async fn stop(mut child: Child) {
    let _ = child.start_kill();
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}

/// The floor a stdio slug adds: a line to a child process over a pipe and back (`cat`, the
/// cheapest child there is), p50 of `n`.
async fn pipe_round_trip(n: usize) -> Duration {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let mut cat = tokio::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cat runs");
    let mut to = cat.stdin.take().unwrap();
    let mut from = tokio::io::BufReader::new(cat.stdout.take().unwrap()).lines();
    let line = format!("{}\n", "x".repeat(200));
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        to.write_all(line.as_bytes()).await.unwrap();
        from.next_line().await.unwrap().expect("cat echoes");
        times.push(t.elapsed());
    }
    times.sort();
    pct(&times, 0.5)
}

/// HAProxy in HTTP mode in front of `upstream` (an `http://host:port/path` URL): the child
/// and the same path through it. `None` when HAProxy cannot run.
fn haproxy(dir: &Path, upstream: &str) -> Option<(Child, String)> {
    use std::os::fd::AsRawFd;
    let rest = upstream.strip_prefix("http://")?;
    let (server, path) = rest.split_at(rest.find('/')?);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    let url = format!("http://{}{path}", listener.local_addr().ok()?);
    let rest = format!(
        "frontend mcp\n    bind fd@3\n    default_backend memo\n\
         backend memo\n    server memo {server}\n"
    );
    let child = fd3::start_haproxy(dir, 1024, &rest, listener.as_raw_fd())
        .map_err(|e| println!("{e}; HAProxy's reference case is skipped"))
        .ok()?;
    Some((child, url))
}

/// A `herald memo` serving HTTP and QUIC: the direct endpoint and every networked slug's
/// upstream.
struct Memo {
    child: Child,
    url: String,
    quic: String,
    pin: String,
}

async fn memo_server(bin: &str) -> Memo {
    let (child, v) = common::memo_with(bin, &[]).await;
    Memo {
        child,
        url: v["http_url"].as_str().unwrap().to_owned(),
        quic: v["quic"].as_str().unwrap().to_owned(),
        pin: v["quic_fingerprint"].as_str().unwrap().to_owned(),
    }
}

/// One measured case: `run` gives a run's figures and its gateway's RSS after it. Without a
/// baseline, one run; with one, A-B-B-A and two ratio lines (1 client p50/p99, 64 clients
/// calls/s). This build's figures, merged, and the RSS after its last run.
async fn case(
    label: &str,
    baseline: Option<&'static str>,
    run: impl AsyncFnMut(Build) -> (Figures, u64),
) -> (Figures, u64) {
    let sides = compare(baseline, run).await;
    let rss = sides.this.last().map_or(0, |r| r.1);
    let this = Figures::merge(sides.this.into_iter().map(|r| r.0).collect());
    if baseline.is_some() {
        let before = Figures::merge(sides.baseline.into_iter().map(|r| r.0).collect());
        print_ratio(&format!("{label}, 1 client"), &before.seq, &this.seq);
        print_rate_ratio(
            &format!("{label}, {CLIENTS} clients"),
            before.rate,
            this.rate,
        );
    }
    (this, rss)
}

#[tokio::main]
async fn main() {
    common::raise_nofile();
    let n: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let baseline = common::baseline();
    println!(
        "gateway bench: tools/call memo_set over Streamable HTTP (raw HTTP/1.1 keep-alive client), {n} sequential calls, {TOTAL} calls at {CLIENTS} clients; load {} ({BIN})",
        common::load()
    );
    print_baseline(baseline);
    let scratch = std::env::temp_dir().join(format!("herald-bench-gateway-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();

    // This build's memo server, then the baseline's: each side's runs use its own.
    let mut memos = vec![memo_server(BIN).await];
    if let Some(b) = baseline {
        memos.push(memo_server(b).await);
    }
    let memo_of = |b: Build| &memos[usize::from(b.baseline)];

    let (direct, _) = case("direct", baseline, async |b: Build| {
        let m = memo_of(b);
        let ep = Endpoint {
            url: m.url.clone(),
            token: None,
            tool: "memo_set",
        };
        let procs = [("memo", m.child.id().unwrap())];
        let f = measure(
            &b.label("direct"),
            &ep,
            b.part(n),
            b.part(TOTAL),
            None,
            &procs,
        )
        .await;
        (f, 0)
    })
    .await;

    // HERALD_BENCH_ONLY=http (stdio, quic, up): direct and that case alone, to profile it.
    let only = std::env::var("HERALD_BENCH_ONLY").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let slugs = [
        ("gateway, stdio slug", "stdio"),
        ("gateway, HTTP slug", "http"),
        ("gateway, QUIC slug", "quic"),
    ];
    let slugs = slugs.into_iter().filter(|(_, name)| wanted(name));
    let mut results: Vec<(&str, Figures, u64)> = Vec::new();
    for (label, name) in slugs {
        let (f, rss) = case(label, baseline, async |b: Build| {
            let m = memo_of(b);
            let slug = match name {
                "stdio" => format!("stdio = \"{} --store :memory: memo\"", b.bin),
                "http" => format!("http = \"{}\"", m.url),
                _ => format!("quic = \"{}\"\ntls_pin = \"{}\"", m.quic, m.pin),
            };
            let file = if b.baseline {
                format!("{name}-baseline")
            } else {
                name.to_owned()
            };
            let cfg = gateway_config(&scratch, &file, &slug);
            let (gw, v) = common::serve_with(
                b.bin,
                &[
                    "--store",
                    ":memory:",
                    "gateway",
                    "--config",
                    cfg.to_str().unwrap(),
                    "--http",
                    "127.0.0.1:0",
                ],
            )
            .await;
            let ep = Endpoint {
                url: v["http_url"].as_str().unwrap().to_owned(),
                token: Some(TOKEN),
                tool: "m__memo_set",
            };
            let upstream = (name == "http").then_some(m.url.as_str());
            let mut procs = vec![("gateway", gw.id().unwrap())];
            procs.extend(
                common::children(gw.id().unwrap())
                    .into_iter()
                    .map(|p| ("its memo child", p)),
            );
            if name != "stdio" {
                procs.push(("memo", m.child.id().unwrap()));
            }
            let f = measure(
                &b.label(label),
                &ep,
                b.part(n),
                b.part(TOTAL),
                upstream,
                &procs,
            )
            .await;
            let rss = rss_kib(gw.id().unwrap());
            stop(gw).await;
            (f, rss)
        })
        .await;
        results.push((label, f, rss));
    }

    // For reference: HAProxy in front of this build's memo, once (not herald: no baseline).
    let mut reference: Option<(Figures, u64)> = None;
    if wanted("haproxy") {
        match haproxy(&scratch, &memos[0].url) {
            Some((child, url)) => {
                let ep = Endpoint {
                    url,
                    token: None,
                    tool: "memo_set",
                };
                ready(&ep).await;
                let procs = [
                    ("haproxy", child.id().unwrap()),
                    ("memo", memos[0].child.id().unwrap()),
                ];
                let f = measure("HAProxy", &ep, n, TOTAL, None, &procs).await;
                let rss = rss_kib(child.id().unwrap());
                stop(child).await;
                reference = Some((f, rss));
            }
            None => println!("HAProxy: not installed, its reference case is skipped"),
        }
    }

    // herald up: the memo role in the gateway's own process (slug `memo`).
    let up_cfg = scratch.join("up.toml");
    std::fs::write(
        &up_cfg,
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\nadmin = \"\"\n\n[memo]\n",
    )
    .unwrap();
    let label = "herald up, in-process";
    if wanted("up") {
        let (f, rss) = case(label, baseline, async |b: Build| {
            let (up, v) = common::serve_with(
                b.bin,
                &[
                    "--store",
                    ":memory:",
                    "up",
                    "--config",
                    up_cfg.to_str().unwrap(),
                ],
            )
            .await;
            let ep = Endpoint {
                url: v["http_url"].as_str().unwrap().to_owned(),
                token: None,
                tool: "memo__memo_set",
            };
            let procs = [("herald up", up.id().unwrap())];
            let f = measure(&b.label(label), &ep, b.part(n), b.part(TOTAL), None, &procs).await;
            let rss = rss_kib(up.id().unwrap());
            stop(up).await;
            (f, rss)
        })
        .await;
        results.push((label, f, rss));
    }
    let memo_rss = rss_kib(memos[0].child.id().unwrap());
    for m in memos {
        stop(m.child).await;
    }

    println!(
        "\nagainst direct (1 client p50 {}, {CLIENTS} clients {:.0} calls/s):",
        ms(pct(&direct.seq, 0.5)),
        direct.rate
    );
    for (label, f, rss) in &results {
        let p50_ratio = pct(&f.seq, 0.5).as_secs_f64() / pct(&direct.seq, 0.5).as_secs_f64();
        let rate_ratio = f.rate / direct.rate;
        let conc_ratio = pct(&f.conc, 0.5).as_secs_f64() / pct(&direct.conc, 0.5).as_secs_f64();
        println!(
            "{label:<22} p50 ratio at 1 client {p50_ratio:.2}x | calls/s ratio at {CLIENTS} clients {rate_ratio:.2}x (p50 {conc_ratio:.2}x) | gateway RSS after the runs {:.1} MB",
            *rss as f64 / 1024.0
        );
    }
    if let Some((f, rss)) = &reference {
        let p50_ratio = pct(&f.seq, 0.5).as_secs_f64() / pct(&direct.seq, 0.5).as_secs_f64();
        let conc_ratio = pct(&f.conc, 0.5).as_secs_f64() / pct(&direct.conc, 0.5).as_secs_f64();
        println!(
            "{:<22} p50 ratio at 1 client {p50_ratio:.2}x | calls/s ratio at {CLIENTS} clients {:.2}x (p50 {conc_ratio:.2}x) | HAProxy RSS after the run {:.1} MB",
            "HAProxy (reference)",
            f.rate / direct.rate,
            *rss as f64 / 1024.0
        );
        let hop = |f: &Figures| pct(&f.seq, 0.5).saturating_sub(pct(&direct.seq, 0.5));
        if let Some((_, http, _)) = results.iter().find(|r| r.0.contains("HTTP")) {
            println!(
                "the hop over direct at 1 client (p50): HTTP slug {} | HAProxy {} -> herald's hop {:.2}x HAProxy's; at {CLIENTS} clients herald's gateway {:.2}x HAProxy's calls/s",
                ms(hop(http)),
                ms(hop(f)),
                hop(http).as_secs_f64() / hop(f).as_secs_f64().max(1e-9),
                http.rate / f.rate
            );
        }
    }
    println!(
        "memo server (direct, and behind the HTTP and QUIC slugs) RSS: {:.1} MB",
        memo_rss as f64 / 1024.0
    );
    for f in results
        .iter()
        .map(|r| &r.1)
        .chain(reference.iter().map(|r| &r.0))
        .chain([&direct])
    {
        if let Some(e) = &f.first_error {
            println!("first failed call ({} in all): {e}", f.errors);
        }
    }
    let pipe = pipe_round_trip(n).await;
    println!(
        "pipe round trip to a child and back (cat, 200-byte line): p50 {}",
        ms(pipe)
    );
    println!();
    for (label, f, _) in &results {
        let p50_ratio = pct(&f.seq, 0.5).as_secs_f64() / pct(&direct.seq, 0.5).as_secs_f64();
        if label.contains("stdio") {
            let added = pct(&f.seq, 0.5).saturating_sub(pct(&direct.seq, 0.5));
            let floor = pipe + Duration::from_micros(50);
            println!(
                "target {label}: p50 at 1 client adds {} to direct vs <= the pipe round trip + 0.050 ms = {} -> {}",
                ms(added),
                ms(floor),
                verdict(added <= floor)
            );
        }
        let (p50_target, rate_target, min_rate) = targets(label);
        if !label.contains("stdio") {
            println!(
                "target {label}: p50 at 1 client {p50_ratio:.2}x direct vs <= {p50_target}x -> {}",
                verdict(p50_ratio <= p50_target)
            );
        }
        let rate_ratio = f.rate / direct.rate;
        println!(
            "target {label}: {:.0} calls/s at {CLIENTS} clients = {rate_ratio:.2}x direct vs >= {rate_target}x{} -> {}",
            f.rate,
            if min_rate > 0.0 {
                format!(" and >= {min_rate:.0} calls/s")
            } else {
                String::new()
            },
            verdict(rate_ratio >= rate_target && f.rate >= min_rate && f.errors == 0)
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
