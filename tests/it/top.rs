//! `herald top` as an operator sees it: run in a real terminal multiplexer (tmux) against
//! `herald up`, the screen read back through tmux (each redraw awaited through tmux's control
//! mode, which reports every byte the pane writes): the roles, a watch whose events count up
//! when a note changes, an upstream's error under RECENT ERRORS, `q` quits with exit 0. Piped,
//! it prints one JSON report per line and exits 1 when herald goes away; with nothing at the
//! address it says so and exits 1.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::support::*;

/// A tmux server of its own running one command in a pane of 120×40, followed in control
/// mode; killed when dropped.
struct Tmux {
    socket: String,
    output: mpsc::UnboundedReceiver<String>,
    _client: tokio::process::Child,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("herald-top-{}-{n}", std::process::id());
        let mut client = tokio::process::Command::new("tmux")
            .args(["-L", &socket, "-f", "/dev/null", "-C", "new-session"])
            .args(["-x", "120", "-y", "40", command])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("tmux runs (.ci/run installs it)");
        let (tx, output) = mpsc::unbounded_channel();
        let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                if l.starts_with("%output") && tx.send(l).is_err() {
                    return;
                }
            }
        });
        Tmux {
            socket,
            output,
            _client: client,
        }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's screen now.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p"])
    }

    /// The screen once `seen` holds for it, looked at again after each write to the pane.
    async fn until(&mut self, what: &str, seen: impl Fn(&str) -> bool) -> String {
        let wait = tokio::time::timeout(WAIT, async {
            loop {
                let screen = self.screen();
                if seen(&screen) {
                    return screen;
                }
                if self.output.recv().await.is_none() {
                    panic!("tmux ended before {what}; the screen:\n{screen}");
                }
            }
        });
        match wait.await {
            Ok(screen) => screen,
            Err(_) => panic!("no {what} in time; the screen:\n{}", self.screen()),
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.tmux(&["kill-server"]);
    }
}

/// The pids of the processes whose command line contains `needle`.
fn pids_running(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd)
            .replace('\0', " ")
            .contains(needle)
        {
            out.push(name);
        }
    }
    out
}

/// The cells of the screen's line that starts with `name` and a space.
fn row<'a>(screen: &'a str, name: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .map(|l| l.split_whitespace().collect())
}

fn config(dir: &TempDir) -> std::path::PathBuf {
    // An upstream that never answers: its error is what RECENT ERRORS should show.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\n[memo]\n\n\
             [[slug]]\nname = \"gone\"\nhttp = \"http://{gone}/mcp\"\n\n\
             [[watch]]\nname = \"notes\"\nuri = \"memo://notes\"\n"
        ),
    )
    .unwrap();
    cfg
}

#[tokio::test]
async fn on_a_terminal_top_shows_the_roles_counts_events_lists_errors_and_quits_on_q() {
    init();
    let dir = TempDir::new("top");
    let up = crate::up::up(&config(&dir), &[]).await;
    let mut tmux = Tmux::start(&format!(
        "{} top --admin {} --interval-ms 200; echo \"top exited $?\"; stty -a; read x",
        bin(),
        up.admin
    ));

    let screen = tmux
        .until("the roles, the watch and the upstream's error", |s| {
            s.starts_with(&format!("herald top · http://{}", up.admin))
                && row(s, "gateway").is_some_and(|r| r[1] == "serving")
                && row(s, "notes").is_some()
                && s.contains("RECENT ERRORS")
                && s.contains("upstream gone: ")
        })
        .await;
    assert_eq!(row(&screen, "notes").unwrap()[2], "0", "{screen}");
    assert!(
        screen
            .lines()
            .any(|l| l.starts_with("WATCH") && l.contains("EVENTS/S")),
        "{screen}"
    );
    assert!(
        screen.lines().last().unwrap().starts_with("q quits"),
        "{screen}"
    );

    // A note changes: the watch's events count up, pushed (no key pressed, no poll asked).
    let memo = crate::watch::memo_client(&up.url).await;
    call(
        &memo,
        "memo__memo_set",
        json!({"key": "todo", "value": "milk"}),
    )
    .await;
    tmux.until("the watch's event counted", |s| {
        row(s, "notes").is_some_and(|r| r[2] == "1")
    })
    .await;

    // Ctrl-Z gives the terminal back before top stops; continued, it takes it again.
    tmux.tmux(&["send-keys", "C-z"]);
    tmux.until("the screen given back", |s| !s.contains("herald top ·"))
        .await;
    // herald top, and the pane's shell whose command names it: both continued.
    let pids = pids_running(&format!("top --admin {}", up.admin));
    assert!(!pids.is_empty(), "herald top's pid");
    let cont = std::process::Command::new("kill")
        .arg("-CONT")
        .args(&pids)
        .status()
        .unwrap();
    assert!(cont.success());
    tmux.until("the view again", |s| s.contains("herald top ·"))
        .await;

    tmux.tmux(&["send-keys", "q"]);
    let screen = tmux
        .until("top's exit", |s| s.contains("top exited "))
        .await;
    assert!(screen.contains("top exited 0"), "{screen}");
    // The terminal is as it was: line editing and echo back on.
    let settings = tmux
        .until("the terminal's settings", |s| s.contains("icanon"))
        .await;
    for mode in ["icanon", "echo"] {
        assert!(
            settings.split_whitespace().any(|w| w == mode),
            "{mode} is back on: {settings}"
        );
    }
    assert!(
        !screen.contains("herald top ·"),
        "the screen it drew is gone (the alternate screen left): {screen}"
    );
}

#[tokio::test]
async fn piped_top_prints_a_report_per_line_and_exits_1_when_herald_goes() {
    init();
    let dir = TempDir::new("top-piped");
    let mut up = crate::up::up(&config(&dir), &[]).await;
    let mut top = tokio::process::Command::new(bin())
        .args(["top", "--admin", &up.admin, "--interval-ms", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(top.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(
        &tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("a report in time")
            .unwrap()
            .expect("a line"),
    )
    .expect("a JSON report");
    assert!(
        first["roles"].is_array() && first["pid"].is_u64(),
        "{first}"
    );

    up.child.start_kill().unwrap();
    let _ = up.child.wait().await;
    while let Ok(Some(line)) = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("the stream ends in time")
    {
        serde_json::from_str::<Value>(&line).expect("every line is a report");
    }
    let out = tokio::time::timeout(WAIT, top.wait_with_output())
        .await
        .expect("top ends in time")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Killed, herald leaves the stream cut short; stopped, it ends it: either is said.
    assert!(
        err.contains("status stream") && err.contains("herald stopped?"),
        "{err}"
    );
}

#[tokio::test]
async fn top_with_nothing_at_the_address_says_so() {
    init();
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = herald(["top", "--admin", &gone.to_string()]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no herald answered at"), "{err}");
}
