//! `herald up` as an appliance: memo + file + k8s (against the fake API server the tests use)
//! + watches through the gateway, in one release process.
//!
//! 1. Start to ready: from `spawn` to systemd's `READY=1` on a notify socket the bench owns
//!    (every listener bound, every role started), and on to the moment `/status` lists every
//!    watch started (each has read its resource and subscribed through the gateway). A first
//!    start on a new store (which makes the QUIC identity) and restarts on that store.
//!    Target: ready under 300 ms.
//! 2. Idle RSS with 3 watches (memo, a file tree, a k8s namespace), herald alone and its
//!    children (one `kubectl get -w` per k8s URI). Target: under 40 MB.
//! 3. RSS with 100 watches (96 file directories, memo, 3 k8s namespaces), and the cost per
//!    watch against (2).
//! 4. Binary size: the shipped static binary (`cargo static`, or `packaging/build`) when it
//!    has been built, and this bench's own (release, not stripped). Target: under 25 MB.
//!
//! `cargo bench --bench up` (HERALD_BENCH_N overrides the 10 restarts).

#[allow(dead_code)]
#[path = "../it/kube_fake.rs"]
mod kube_fake;

#[path = "common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube_fake::FakeApi;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixDatagram;
use tokio::process::Child;

use common::{BIN, ms, pct, rss_kib};

/// The bound on any one wait: a stuck bench fails instead of hanging.
const WAIT: Duration = Duration::from_secs(60);
const TARGET_READY: Duration = Duration::from_millis(300);
const TARGET_IDLE_MIB: f64 = 40.0;
const TARGET_BINARY_MIB: f64 = 25.0;
/// The shipped binary, when `cargo static` has built it.
const STATIC_BIN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/x86_64-unknown-linux-gnu/release/herald"
);

struct Up {
    child: Child,
    /// spawn → READY=1.
    ready: Duration,
    /// spawn → `/status` lists every watch.
    watching: Duration,
    admin: String,
}

impl Up {
    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let st = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("herald up drains in time")
            .unwrap();
        assert!(st.success(), "herald up ended with {st}");
    }
}

/// Starts `herald up --config CFG` on `store` and waits for READY=1 and then for every one of
/// `watches` to be listed as started.
async fn start(cfg: &Path, store: &Path, watches: usize, scratch: &Path) -> Up {
    let sock_path = scratch.join(format!("notify-{}", rand_suffix()));
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(BIN)
        .args(["--log-format", "json", "--store"])
        .arg(store)
        .args(["up", "--config"])
        .arg(cfg)
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald up");
    let mut buf = vec![0u8; 4096];
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            let n = sock.recv(&mut buf).await.unwrap();
            if String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "READY=1")
            {
                return t0.elapsed();
            }
        }
    })
    .await
    .expect("READY=1 in time");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let admin = tokio::time::timeout(WAIT, async {
        loop {
            let l = lines
                .next_line()
                .await
                .unwrap()
                .expect("herald up is running");
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["event"] == "listening"
            {
                return v["admin"].as_str().expect("an admin address").to_owned();
            }
        }
    })
    .await
    .expect("the listening line");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let client = herald::transport::web::http_client(|b| b).unwrap();
    let url = format!("http://{admin}/status");
    // Measuring when the last watch is up: ask every 2 ms (this is the bench's clock, not a
    // test's wait).
    let watching = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(r) = client.get(&url).send().await
                && let Ok(v) = r.json::<Value>().await
                && v["watches"].as_array().is_some_and(|w| w.len() == watches)
            {
                let failed: Vec<&Value> = v["watches"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|w| w["failed"] == true)
                    .collect();
                assert!(failed.is_empty(), "watches failed: {failed:?}");
                return t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("every watch started in time");
    let _ = std::fs::remove_file(&sock_path);
    Up {
        child,
        ready,
        watching,
        admin,
    }
}

fn rand_suffix() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The process's children and their RSS together, KiB (kubectl, filter workers).
fn children_rss(pid: u32) -> (usize, u64) {
    let kids = common::children(pid);
    (kids.len(), kids.into_iter().map(rss_kib).sum())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A config with memo, a file root, k8s on the fake API server, and these watches.
fn config(dir: &Path, root: &Path, kubeconfig: &Path, watches: &[(String, String)]) -> PathBuf {
    let mut t = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n\
         [memo]\n\n[file]\nroots = [{root:?}]\n\n[k8s]\nkubeconfigs = {{ fake = {kc:?} }}\n",
        root = root.display().to_string(),
        kc = kubeconfig.display().to_string(),
    );
    for (name, uri) in watches {
        t.push_str(&format!("\n[[watch]]\nname = {name:?}\nuri = {uri:?}\n"));
    }
    let path = dir.join(format!("up-{}.toml", watches.len()));
    std::fs::write(&path, t).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "herald check: {out:?}");
    path
}

fn file_size(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

#[tokio::main]
async fn main() {
    let restarts: usize = std::env::var("HERALD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let scratch = std::env::temp_dir().join(format!("herald-bench-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let root = scratch.join("root");
    for i in 0..96 {
        std::fs::create_dir_all(root.join(format!("d{i:02}"))).unwrap();
        std::fs::write(root.join(format!("d{i:02}/a.txt")), "x").unwrap();
    }
    let api = FakeApi::start().await;
    for i in 0..300 {
        api.put(
            "",
            &format!("ns-{}", i % 3),
            &format!("cm-{i:03}"),
            json!({"i": i}),
        );
    }
    let kubeconfig = api.kubeconfig(&scratch);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "herald up bench: memo + file + k8s (fake API server, kubectl {}) + watches; load {}",
        kubectl_version(),
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );

    // 1 and 2: three watches.
    let three = vec![
        ("notes".to_owned(), "memo://notes".to_owned()),
        (
            "files".to_owned(),
            herald::source::file::events_uri(&root, true),
        ),
        (
            "cm".to_owned(),
            "k8s-events://watch/configmaps?namespace=ns-0".to_owned(),
        ),
    ];
    let cfg3 = config(&scratch, &root, &kubeconfig, &three);
    let store = scratch.join("herald.redb");
    let first = start(&cfg3, &store, three.len(), &scratch).await;
    println!(
        "\n1. start to ready, 3 watches\n   first start (new store, makes the QUIC identity): READY=1 {}, every watch up {}",
        ms(first.ready),
        ms(first.watching)
    );
    let first_ready = first.ready;
    first.stop().await;
    let mut ready = Vec::new();
    let mut watching = Vec::new();
    let mut idle = None;
    for i in 0..restarts {
        let up = start(&cfg3, &store, three.len(), &scratch).await;
        ready.push(up.ready);
        watching.push(up.watching);
        if i + 1 == restarts {
            idle = Some(up);
        } else {
            up.stop().await;
        }
    }
    ready.sort();
    watching.sort();
    println!(
        "   {restarts} restarts: READY=1 median {} p90 {} max {}; every watch up median {} max {}",
        ms(pct(&ready, 0.5)),
        ms(pct(&ready, 0.9)),
        ms(*ready.last().unwrap()),
        ms(pct(&watching, 0.5)),
        ms(*watching.last().unwrap()),
    );
    println!(
        "   target: ready under {} — {}",
        ms(TARGET_READY),
        verdict(*ready.last().unwrap() < TARGET_READY && first_ready < TARGET_READY)
    );

    let idle = idle.unwrap();
    // Settle: one more /status round trip so every start-up allocation has happened.
    let _ = herald::transport::web::http_client(|b| b)
        .unwrap()
        .get(format!("http://{}/status", idle.admin))
        .send()
        .await;
    let idle_kib = rss_kib(idle.pid());
    let (kids, kids_kib) = children_rss(idle.pid());
    println!(
        "\n2. idle RSS, 3 watches: herald {:.1} MiB; its {kids} children (kubectl) {:.1} MiB\n   target: under {TARGET_IDLE_MIB} MiB — {}",
        mib(idle_kib),
        mib(kids_kib),
        verdict(mib(idle_kib) < TARGET_IDLE_MIB)
    );
    idle.stop().await;

    // 3: a hundred watches.
    let mut hundred = vec![("notes".to_owned(), "memo://notes".to_owned())];
    for i in 0..96 {
        hundred.push((
            format!("d{i:02}"),
            herald::source::file::events_uri(&root.join(format!("d{i:02}")), false),
        ));
    }
    for ns in 0..3 {
        hundred.push((
            format!("cm{ns}"),
            format!("k8s-events://watch/configmaps?namespace=ns-{ns}"),
        ));
    }
    let cfg100 = config(&scratch, &root, &kubeconfig, &hundred);
    let up = start(&cfg100, &store, hundred.len(), &scratch).await;
    let _ = herald::transport::web::http_client(|b| b)
        .unwrap()
        .get(format!("http://{}/status", up.admin))
        .send()
        .await;
    let kib = rss_kib(up.pid());
    let (kids, kids_kib) = children_rss(up.pid());
    println!(
        "\n3. RSS with {} watches: herald {:.1} MiB ({:.0} KiB per watch over the 3-watch figure); {kids} children {:.1} MiB; READY=1 {}, every watch up {}",
        hundred.len(),
        mib(kib),
        (kib as f64 - idle_kib as f64) / (hundred.len() - three.len()) as f64,
        mib(kids_kib),
        ms(up.ready),
        ms(up.watching),
    );
    up.stop().await;

    // 4: sizes.
    println!("\n4. binary size");
    match file_size(STATIC_BIN) {
        Some(b) => println!(
            "   shipped static binary ({STATIC_BIN}): {:.1} MiB — target under {TARGET_BINARY_MIB} MiB — {}",
            b as f64 / (1 << 20) as f64,
            verdict((b as f64 / (1 << 20) as f64) < TARGET_BINARY_MIB)
        ),
        None => println!("   shipped static binary: not built (run `cargo static --locked`)"),
    }
    if let Some(b) = file_size(BIN) {
        println!(
            "   this bench's binary (release profile, thin LTO, not stripped): {:.1} MiB",
            b as f64 / (1 << 20) as f64
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

fn kubectl_version() -> String {
    std::process::Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .and_then(|v| v["clientVersion"]["gitVersion"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
