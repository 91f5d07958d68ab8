//! Helpers every benchmark shares (each bench is its own crate and includes this file with
//! `#[path = "common.rs"] mod common;`).
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

pub const BIN: &str = env!("CARGO_BIN_EXE_herald");

/// The `p` quantile of sorted durations.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(after) = stat.rsplit_once(") ").map(|x| x.1) else {
            continue;
        };
        if after.split(' ').nth(1) == Some(&pid.to_string())
            && let Some(p) = e.file_name().to_str().and_then(|s| s.parse().ok())
        {
            out.push(p);
        }
    }
    out
}

/// Resident memory of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Awaits herald's JSON `listening` line on `child`'s stderr, then keeps draining stderr.
pub async fn listening(child: &mut Child) -> Value {
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let v = loop {
        let l = lines
            .next_line()
            .await
            .unwrap()
            .expect("herald printed its addresses");
        if let Ok(v) = serde_json::from_str::<Value>(&l)
            && v["event"] == "listening"
        {
            break v;
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    v
}

/// Runs `herald --log-format json ARGS` (a server role) and returns it with its `listening`
/// line.
pub async fn serve(args: &[&str]) -> (Child, Value) {
    let mut child = tokio::process::Command::new(BIN)
        .arg("--log-format")
        .arg("json")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald");
    let v = listening(&mut child).await;
    (child, v)
}
