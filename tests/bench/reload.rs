//! Reload: `herald up` with 100 `[[slug]]`s (each its own connection to one `herald memo` over
//! HTTP) and 1,000 watches through its gateway, plus 1,000 listen streams of outside clients
//! on those slugs (16 QUIC connections), reloaded 20 times; each reload adds a slug and 10
//! watches on it and removes the previous round's. Timed from `POST /reload` to its answer
//! (and the time the reload itself reports), against the alternative without reload: a
//! restart of the same appliance, from spawn to every watch running again (the outside
//! streams would all have to be opened again too, and are not counted).
//!
//! Streams kept: after the reloads one change reaches every one of the 1,000 outside streams,
//! and none ended (a stream ending is an error on it, which fails the bench).
//!
//! Target: a reload under 100 ms (p99 of the 20) with every stream kept.
//!
//! `cargo bench --bench reload` (HERALD_BENCH_N overrides the 20 reloads).

#[path = "common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use common::{BIN, ms, pct};

const WAIT: Duration = Duration::from_secs(120);
const SLUGS: usize = 100;
const WATCHES: usize = 1000;
const STREAMS: usize = 1000;
/// Listen streams per QUIC connection (the gateway's per-connection cap is 64).
const PER_CONNECTION: usize = 63;
const TARGET: Duration = Duration::from_millis(100);

/// The config: the slugs, the watches, and `round`'s extra slug with its 10 watches.
fn config(dir: &Path, memo_url: &str, round: Option<usize>) -> PathBuf {
    let mut t = String::from(
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n",
    );
    for s in 0..SLUGS {
        t.push_str(&format!(
            "\n[[slug]]\nname = \"s{s}\"\nhttp = {memo_url:?}\n"
        ));
    }
    for w in 0..WATCHES {
        let uri = ["notes", "log"][w % 2];
        t.push_str(&format!(
            "\n[[watch]]\nname = \"w{w}\"\nuri = \"s{}+memo://{uri}\"\n",
            w % SLUGS
        ));
    }
    if let Some(r) = round {
        t.push_str(&format!(
            "\n[[slug]]\nname = \"extra{r}\"\nhttp = {memo_url:?}\n"
        ));
        for j in 0..10 {
            t.push_str(&format!(
                "\n[[watch]]\nname = \"e{r}-{j}\"\nuri = \"extra{r}+memo://notes\"\n"
            ));
        }
    }
    let path = dir.join("up.toml");
    std::fs::write(&path, t).unwrap();
    path
}

struct Up {
    child: Child,
    admin: String,
    quic: String,
    pin: String,
    /// spawn → every watch running.
    watching: Duration,
}

/// Starts `herald up --config CFG` and waits until `/status` lists `watches` watches, all
/// running.
async fn start(cfg: &Path, watches: usize) -> Up {
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(BIN)
        .args([
            "--log-format",
            "json",
            "--store",
            ":memory:",
            "up",
            "--config",
        ])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald up");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = tokio::time::timeout(WAIT, async {
        loop {
            let l = lines.next_line().await.unwrap().expect("herald up runs");
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["event"] == "listening"
            {
                return v;
            }
        }
    })
    .await
    .expect("the listening line");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let admin = listening["admin"].as_str().unwrap().to_owned();
    let client = herald::transport::web::http_client(|b| b).unwrap();
    let url = format!("http://{admin}/status");
    // The bench's clock: ask every 5 ms.
    let watching = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(r) = client.get(&url).send().await
                && let Ok(v) = r.json::<Value>().await
                && let Some(w) = v["watches"].as_array()
                && w.len() == watches
                && w.iter().all(|w| w["state"] == "running")
            {
                return t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every watch running in time");
    Up {
        child,
        admin,
        quic: listening["quic"].as_str().unwrap().to_owned(),
        pin: listening["quic_fingerprint"].as_str().unwrap().to_owned(),
        watching,
    }
}

/// Outside clients' listen streams: `n` on one QUIC connection, on slug `slug`'s notes.
async fn streams(
    up: &Up,
    first_id: usize,
    n: usize,
    slug: usize,
    tx: mpsc::Sender<(usize, Value)>,
) -> (quinn::Endpoint, quinn::Connection, quinn::SendStream) {
    let trust = herald::transport::tls::ClientTrust {
        pin: Some(up.pin.clone()),
        ..Default::default()
    };
    let (endpoint, conn, mut send, mut recv) = herald::transport::quic::connect(
        &up.quic,
        &trust,
        herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
    )
    .await
    .expect("QUIC connect");
    tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        while let Ok(Some(k)) = recv.read(&mut chunk).await {
            buf.extend_from_slice(&chunk[..k]);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if let Ok(v) = serde_json::from_slice::<Value>(&line)
                    && tx.send((first_id, v)).await.is_err()
                {
                    return;
                }
            }
        }
    });
    let mut batch = Vec::new();
    for i in 0..n {
        batch.extend_from_slice(
            common::listen_request((first_id + i) as u64, &format!("s{slug}+memo://notes"))
                .as_bytes(),
        );
        batch.push(b'\n');
    }
    send.write_all(&batch).await.expect("QUIC write");
    (endpoint, conn, send)
}

/// Waits for `n` messages of `method`; any error ends the bench.
async fn expect(rx: &mut mpsc::Receiver<(usize, Value)>, method: &str, n: usize) {
    let mut seen = 0;
    while seen < n {
        let (_, m) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("the streams answer in time")
            .expect("the streams are open");
        assert!(m.get("error").is_none(), "a stream ended: {m}");
        if m["method"] == method {
            seen += 1;
        }
    }
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("herald-bench-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (_memo, memo) = common::memo_with(BIN, &["--max-listen-streams", "4096"]).await;
    let memo_url = memo["http_url"].as_str().unwrap().to_owned();

    // The alternative: a restart, spawn to every watch running (3 times).
    let cfg = config(&dir, &memo_url, None);
    let mut restarts = Vec::new();
    for _ in 0..3 {
        let up = start(&cfg, WATCHES).await;
        restarts.push(up.watching);
        drop(up.child);
    }
    restarts.sort();

    let mut up = start(&cfg, WATCHES).await;
    let (tx, mut rx) = mpsc::channel(1 << 14);
    let mut conns = Vec::new();
    let mut opened = 0;
    while opened < STREAMS {
        let n = PER_CONNECTION.min(STREAMS - opened);
        conns.push(streams(&up, opened + 1, n, opened / PER_CONNECTION, tx.clone()).await);
        opened += n;
    }
    expect(&mut rx, "notifications/subscriptions/acknowledged", STREAMS).await;

    let client = herald::transport::web::http_client(|b| b).unwrap();
    let reload_url = format!("http://{}/reload", up.admin);
    let (mut took, mut said) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        config(&dir, &memo_url, Some(r));
        let t0 = Instant::now();
        let answer: Value = client
            .post(&reload_url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        took.push(t0.elapsed());
        assert_eq!(answer["applied"], true, "{answer}");
        let changes = answer["changes"].to_string();
        assert!(
            changes.contains(&format!("slug extra{r} added")),
            "{answer}"
        );
        said.push(Duration::from_millis(answer["millis"].as_u64().unwrap()));
    }
    // Every outside stream is still there: one change reaches all of them.
    let set = tokio::process::Command::new(BIN)
        .args([
            "call",
            "memo_set",
            "key=k",
            "value=1",
            "--mcp-http",
            &memo_url,
        ])
        .output()
        .await
        .unwrap();
    assert!(set.status.success(), "{set:?}");
    expect(&mut rx, "notifications/resources/updated", STREAMS).await;

    took.sort();
    said.sort();
    let (p50, p99) = (pct(&took, 0.5), pct(&took, 0.99));
    println!(
        "reload with {SLUGS} slugs, {WATCHES} watches and {STREAMS} outside streams ({rounds} reloads, each adding a slug and 10 watches and removing the last): p50 {}, p99 {} (herald's own count: p50 {}, p99 {})",
        ms(p50),
        ms(p99),
        ms(pct(&said, 0.5)),
        ms(pct(&said, 0.99)),
    );
    println!(
        "restart of the same appliance to every watch running: p50 {} (of 3); reload / restart: {:.3}x",
        ms(pct(&restarts, 0.5)),
        p50.as_secs_f64() / pct(&restarts, 0.5).as_secs_f64()
    );
    println!("every one of the {STREAMS} outside streams kept across the reloads: yes");
    println!(
        "target: reload p99 under {} ms: {}",
        TARGET.as_millis(),
        if p99 < TARGET { "met" } else { "NOT MET" }
    );
    let _ = up.child.start_kill();
    let _ = up.child.wait().await;
    drop(conns);
    let _ = std::fs::remove_dir_all(&dir);
}
