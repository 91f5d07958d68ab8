//! `herald code` as a person meets it: piped stdin printed as a REPL would, `help()`, what it
//! says when its input ends with watches running, and at a terminal (a pseudo-terminal here)
//! the banner, Ctrl-C on a half-typed snippet and on a running one, and Ctrl-D.

use std::io::Write as _;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

use crate::support::*;

/// Everything a stream of the child wrote so far, and a wake-up for each write.
#[derive(Clone, Default)]
struct Collected(Arc<(Mutex<String>, Notify)>);

impl Collected {
    fn follow(mut from: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Collected {
        let c = Collected::default();
        let to = c.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = from.read(&mut buf).await {
                to.0.0
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
                to.0.1.notify_waiters();
            }
        });
        c
    }

    fn text(&self) -> String {
        self.0.0.lock().unwrap().clone()
    }

    /// Waits until what was written satisfies `done`; returns it.
    async fn until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let wait = async {
            loop {
                let woken = self.0.1.notified();
                let text = self.text();
                if done(&text) {
                    return text;
                }
                woken.await;
            }
        };
        match tokio::time::timeout(WAIT, wait).await {
            Ok(t) => t,
            Err(_) => panic!("never saw {what}; got:\n{}", self.text()),
        }
    }
}

fn code_command(url: &str) -> tokio::process::Command {
    init();
    let mut c = tokio::process::Command::new(bin());
    c.args([
        "--store",
        ":memory:",
        "code",
        "--mcp-http",
        url,
        "--debounce-ms",
        "200",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    c
}

/// Runs `program` through `herald code`'s stdin, piped, to its end.
async fn piped(url: &str, program: &str) -> std::process::Output {
    let mut child = code_command(url).stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, program.as_bytes())
        .await
        .unwrap();
    drop(stdin);
    tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("herald code finishes")
        .unwrap()
}

#[tokio::test]
async fn piped_stdin_prints_every_expression_statements_value() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let program = "x = 1\nx\nx + 1\nif x:\n    y = 'yes'\ny\nprint('hi')\n[w['name'] for w in watch_list()]\nNone\nundefined_name\nx\n";
    let out = piped(&memo.http_url(), program).await;
    assert_eq!(out.status.code(), Some(1), "the error fails the run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n2\n\"yes\"\nhi\n[]\n",
        "each value once, None shows nothing, and nothing after the error runs"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "NameError: name 'undefined_name' is not defined (line 10, column 1: undefined_name)"
        ),
        "the error names its line in the whole input: {err}"
    );
    // What does not parse runs whole, to say where.
    let out = piped(&memo.http_url(), "x = 1\nx +\n").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SyntaxError: Expected an expression (line 2, column 4: x +)"),
        "{err}"
    );
}

#[tokio::test]
async fn help_lists_the_builtins_and_the_tools() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let out = piped(&memo.http_url(), "help()\nhelp('memo_set')\n").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for b in herald::watch::BUILTINS {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(b.call) && l.ends_with(b.doc)),
            "{} is in help():\n{text}",
            b.name
        );
    }
    assert!(
        text.contains(&format!("Tools of {}:\n", memo.http_url())),
        "{text}"
    );
    assert!(text.contains("\n  memo_set(key=..., value=...) "), "{text}");
    assert!(
        text.contains(&format!(
            "memo_set(key=..., value=...) (a tool of {})\n",
            memo.http_url()
        )),
        "help(name) gives one in full: {text}"
    );
}

#[tokio::test]
async fn the_end_of_input_says_which_watches_keep_it_running() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let mut child = code_command(&memo.http_url())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"watch_start(name='n', uri='memo://notes')\n")
        .await
        .unwrap();
    drop(stdin);
    let err = Collected::follow(child.stderr.take().unwrap());
    let _out = Collected::follow(child.stdout.take().unwrap());
    err.until("the watches it waits for", |t| {
        t.contains("herald code: stdin ended with 1 watch still running (n: memo://notes); printing their notices until Ctrl-C or SIGTERM, or until none runs")
    })
    .await;
    signal(child.id().unwrap(), libc::SIGTERM);
    let st = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "{st}");
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill on a child of ours that has not been reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// A pseudo-terminal: the child's stdin is its terminal end; the test types on the other.
fn pty() -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors we then own; the other arguments may be null.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both are open descriptors no one else owns.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            OwnedFd::from_raw_fd(slave),
        )
    }
}

#[tokio::test]
async fn at_a_terminal_ctrl_c_cancels_the_line_or_the_running_statement_and_ctrl_d_says_what_runs()
{
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let (mut term, tty) = pty();
    let mut child = code_command(&memo.http_url())
        .stdin(Stdio::from(tty))
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let err = Collected::follow(child.stderr.take().unwrap());
    let out = Collected::follow(child.stdout.take().unwrap());
    let mut typed = |line: &str| term.write_all(line.as_bytes()).unwrap();
    let banner = err
        .until("the banner and a prompt", |t| t.ends_with(">>> "))
        .await;
    assert!(
        banner.contains("herald code: Python (sandboxed) in one scope")
            && banner.contains("help() lists them. Ctrl-C cancels the line or the running statement; Ctrl-D ends the input"),
        "{banner}"
    );
    // Ctrl-C on a half-typed snippet drops it; the prompt is back and the process lives.
    typed("x = (\n");
    err.until("the continuation prompt", |t| t.ends_with("... "))
        .await;
    signal(pid, libc::SIGINT);
    err.until("the interrupt", |t| {
        t.ends_with("\nKeyboardInterrupt\n>>> ")
    })
    .await;
    typed("x = 5\nx\n");
    out.until("x's value", |t| t == "5\n").await;
    // Ctrl-C on a running statement: the tool call it waits in raises, the scope stays.
    typed("watch_start(name='n', uri='memo://notes')\n");
    out.until("the watch started", |t| t.contains("\"name\":\"n\""))
        .await;
    typed("memo_set(key='started', value=1); memo_wait(key='k', timeout_ms=60000)\n");
    // The watch's notice says the statement got past memo_set.
    out.until("the statement running", |t| t.contains("\"watch\":\"n\""))
        .await;
    signal(pid, libc::SIGINT);
    let e = err
        .until("the statement interrupted", |t| {
            // (Its whole line: it may come in more than one write.)
            t.split_once("KeyboardInterrupt: memo_wait")
                .is_some_and(|(_, rest)| rest.contains('\n'))
        })
        .await;
    assert!(
        e.contains("KeyboardInterrupt: memo_wait was interrupted (Ctrl-C) (line 1, column 35: memo_set(key='started', value=1); memo_wait(key='k', timeout_ms=60000))"),
        "{e}"
    );
    let before = out.text().len();
    typed("[x, read_resource(uri='memo://notes')['started']]\n");
    out.until("the scope and its tools, still there", |t| {
        t[before..].contains("[5,1]\n")
    })
    .await;
    // Ctrl-D: what it waits for, and how to stop it.
    typed("\u{4}");
    err.until("the watches it waits for", |t| {
        t.contains("herald code: stdin ended with 1 watch still running (n: memo://notes); printing their notices until Ctrl-C or SIGTERM, or until none runs")
    })
    .await;
    signal(pid, libc::SIGINT);
    let st = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "{st}");
}

#[tokio::test]
async fn a_ctrl_c_at_the_terminal_leaves_a_stdio_server_running() {
    init();
    let (mut term, tty) = pty();
    // The terminal's Ctrl-C reaches its whole foreground process group: herald code and,
    // unless it has a group of its own, the stdio server herald code started.
    let server = format!("{} --store :memory: memo", bin());
    let mut child = tokio::process::Command::new(bin())
        .args(["--store", ":memory:", "code", "--mcp-stdio", &server])
        .stdin(Stdio::from(tty))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let group = child.id().unwrap();
    let err = Collected::follow(child.stderr.take().unwrap());
    let out = Collected::follow(child.stdout.take().unwrap());
    let mut typed = |line: &str| term.write_all(line.as_bytes()).unwrap();
    err.until("a prompt", |t| t.ends_with(">>> ")).await;
    typed("memo_set(key='a', value=1)\n");
    out.until("the first call", |t| t.contains("\"key\":\"a\""))
        .await;
    // SAFETY: a signal to the process group of a child of ours that has not been reaped.
    assert_eq!(unsafe { libc::kill(-(group as i32), libc::SIGINT) }, 0);
    err.until("the interrupt", |t| {
        t.ends_with("\nKeyboardInterrupt\n>>> ")
    })
    .await;
    let before = out.text().len();
    typed("memo_set(key='b', value=2)\n");
    out.until("a call to the same server after Ctrl-C", |t| {
        t[before..].contains("\"key\":\"b\"")
    })
    .await;
    // The server (its stderr is herald code's) never heard the Ctrl-C: it would have logged
    // its shutdown.
    let e = err.text();
    assert!(
        !e.contains("shutting down") && !e.contains("closed its output"),
        "the server got the Ctrl-C: {e}"
    );
}

/// With its input ended, herald code runs while a watch it started runs, and no longer: a
/// task watch that ends (the task cancelled from outside) lets it exit 0.
#[tokio::test]
async fn the_end_of_input_waits_only_while_a_watch_runs() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let mut child = code_command(&memo.http_url())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut stdin,
        b"id = call_tool_as_task('memo_ask', {'key': 'k', 'message': 'who?'})\nid\nwatch_start(name='t', uri='task://' + id)\n",
    )
    .await
    .unwrap();
    drop(stdin);
    let err = Collected::follow(child.stderr.take().unwrap());
    let out = Collected::follow(child.stdout.take().unwrap());
    err.until("the watch it waits for", |t| {
        t.contains("or until none runs")
    })
    .await;
    let text = out.text();
    let id = text
        .lines()
        .find_map(|l| serde_json::from_str::<String>(l).ok())
        .unwrap_or_else(|| panic!("the task's id printed: {text}"));
    let cancel = tokio::process::Command::new(bin())
        .args(["task", "cancel", &id, "--mcp-http", &memo.http_url()])
        .output()
        .await
        .unwrap();
    assert!(cancel.status.success(), "{cancel:?}");
    let st = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("herald code exits once its watch has ended")
        .unwrap();
    assert!(st.success(), "{st}: {}", err.text());
}
