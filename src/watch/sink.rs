//! Where `herald watch` sends notices: stdout (NDJSON, or the `<watch-event>` block for a
//! person at a terminal), a command (`--exec`), or a webhook (`--webhook`). Failures are logged
//! and retried with backoff; a notice that still cannot be delivered is logged in full, never
//! silently dropped.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::runtime::backoff::Backoff;
use crate::watch::spec::Notice;

/// Delivery attempts for --exec and --webhook before a notice is given up (and logged).
const ATTEMPTS: u32 = 4;
/// Retry delays: 500 ms, doubling.
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::MAX);
/// Notices queued per watch for --exec before the watch waits.
const PER_WATCH_QUEUE: usize = 16;
/// Longest one --exec run may take before it is killed and counted as a failure.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub enum Sink {
    /// NDJSON, a notice per line: `{"event":"watch.notice","watch","uri","lines","text"}`.
    Stdout,
    /// Each notice's `<watch-event>` block, for a person at a terminal.
    StdoutText,
    Exec(String),
    Webhook(String),
    /// Handed on to a channel (the agent's notice stream).
    Channel(mpsc::Sender<Notice>),
}

impl Sink {
    /// Stdout as `herald watch` and `herald up` print it: the blocks when stdout is a terminal,
    /// NDJSON when it is not or when `json` (`--json`) asks.
    pub fn stdout(json: bool) -> Sink {
        use std::io::IsTerminal as _;
        if json || !std::io::stdout().is_terminal() {
            Sink::Stdout
        } else {
            Sink::StdoutText
        }
    }
}

/// A notice as stdout prints it: NDJSON, or (`text`) its block; one newline at the end.
pub fn render(n: &Notice, text: bool) -> String {
    let mut out = if text {
        n.text.clone()
    } else {
        json!({"event": "watch.notice", "watch": n.watch, "uri": n.uri, "lines": n.lines,
            "text": n.text})
        .to_string()
    };
    out.push('\n');
    out
}

/// Drains `rx` into `sink` until the channel closes.
pub async fn run(sink: Sink, mut rx: mpsc::Receiver<Notice>) {
    let text = matches!(sink, Sink::StdoutText);
    match sink {
        Sink::Channel(tx) => {
            while let Some(n) = rx.recv().await {
                if tx.send(n).await.is_err() {
                    return;
                }
            }
        }
        Sink::Stdout | Sink::StdoutText => {
            // One thread of its own writing stdout as notices come: tokio's stdout hands every
            // write to the blocking pool and waits for it (two thread hops per notice); a
            // writer parked on the channel is one wake-up. A plain thread, not the runtime's
            // blocking pool, so a runtime shutting down never waits on it.
            let (done, finished) = tokio::sync::oneshot::channel::<()>();
            let spawned = std::thread::Builder::new()
                .name("herald-stdout".into())
                .spawn(move || {
                    let _done = done;
                    while let Some(n) = rx.blocking_recv() {
                        let line = render(&n, text);
                        // One whole notice per write; a closed stdout ends herald quietly.
                        if crate::app::console::print(&line).is_err() {
                            tracing::error!("stdout is closed; notices can no longer be printed");
                            return;
                        }
                    }
                });
            match spawned {
                Ok(_) => {
                    let _ = finished.await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "no thread for stdout; notices cannot be printed")
                }
            }
        }
        Sink::Exec(cmd) => {
            // One run at a time per watch: a queue and a runner per watch name.
            let tracker = TaskTracker::new();
            let mut queues: HashMap<String, mpsc::Sender<Notice>> = HashMap::new();
            while let Some(n) = rx.recv().await {
                let q = queues.entry(n.watch.clone()).or_insert_with(|| {
                    let (tx, mut qrx) = mpsc::channel::<Notice>(PER_WATCH_QUEUE);
                    let cmd = cmd.clone();
                    tracker.spawn(async move {
                        while let Some(n) = qrx.recv().await {
                            deliver_with_retry(&n, || exec_once(&cmd, &n)).await;
                        }
                    });
                    tx
                });
                let _ = q.send(n).await;
            }
            queues.clear();
            tracker.close();
            tracker.wait().await;
        }
        Sink::Webhook(url) => {
            let client = match crate::transport::web::http_client(|b| {
                b.timeout(Duration::from_secs(10))
            }) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "cannot make an HTTP client: webhook notices are dropped");
                    return;
                }
            };
            while let Some(n) = rx.recv().await {
                deliver_with_retry(&n, || post_once(&client, &url, &n)).await;
            }
        }
    }
}

async fn deliver_with_retry<F, Fut>(n: &Notice, mut once: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut backoff = RETRY;
    for attempt in 1..=ATTEMPTS {
        match once().await {
            Ok(()) => return,
            Err(e) if attempt < ATTEMPTS => {
                tracing::warn!(watch = %n.watch, attempt, error = %e, "notice delivery failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                tracing::error!(watch = %n.watch, error = %e, notice = %n.text,
                    "notice delivery failed {ATTEMPTS} times; giving it up (it is this log line)");
            }
        }
    }
}

async fn exec_once(cmd: &str, n: &Notice) -> Result<(), String> {
    let mut child = crate::runtime::secrets::scrub(&mut tokio::process::Command::new("sh"))
        .arg("-c")
        .arg(cmd)
        .env("HERALD_WATCH", &n.watch)
        .env("HERALD_URI", &n.uri)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            let mut text = n.text.clone();
            text.push('\n');
            // A command that does not read its stdin is fine.
            let _ = stdin.write_all(text.as_bytes()).await;
        }
        child.wait().await
    };
    // A command that hangs (or never reads a large notice) is killed, not waited on forever:
    // the watch's next notice must not queue behind it.
    let status = match tokio::time::timeout(EXEC_TIMEOUT, run).await {
        Ok(r) => r.map_err(|e| e.to_string())?,
        Err(_) => {
            let _ = child.kill().await;
            return Err(format!(
                "{cmd} took over {} s and was killed",
                EXEC_TIMEOUT.as_secs()
            ));
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} exited with {status}"))
    }
}

async fn post_once(client: &reqwest::Client, url: &str, n: &Notice) -> Result<(), String> {
    let resp = client
        .post(url)
        .json(&json!({"watch": n.watch, "uri": n.uri, "lines": n.lines, "text": n.text}))
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("POST {url}: HTTP {}", resp.status()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_prints_as_its_block_for_a_person_and_as_one_json_line_otherwise() {
        let n = Notice::new(
            "notes",
            "memo://notes",
            vec![r#"ADDED todo = "buy milk""#.into()],
        );
        assert_eq!(
            render(&n, true),
            "<watch-event name=\"notes\" uri=\"memo://notes\">\nADDED todo = \"buy milk\"\n</watch-event>\n"
        );
        let line = render(&n, false);
        assert_eq!(line.matches('\n').count(), 1, "one line: {line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "watch.notice");
        assert_eq!(v["watch"], "notes");
        assert_eq!(v["uri"], "memo://notes");
        assert_eq!(v["lines"], json!([r#"ADDED todo = "buy milk""#]));
        assert_eq!(v["text"], n.text);
    }
}
