//! `on_event` filters end to end: `herald watch --on-event` against `herald memo`, filters run
//! in `herald filter-worker` processes.

use std::process::Stdio;

use serde_json::{Value, json};

use crate::support::*;

/// A memo server, a watch of `uri` filtered by `code`, and a client to change notes.
struct Setup {
    _memo: Server,
    _dir: TempDir,
    w: crate::watch::Watch,
    c: herald::transport::client::Connection,
}

async fn setup(uri: &str, code: &str) -> Setup {
    setup_with(uri, code, &[]).await
}

async fn setup_with(uri: &str, code: &str, extra: &[&str]) -> Setup {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("filter");
    let file = dir.path().join("f.py");
    std::fs::write(&file, code).unwrap();
    let watch = format!("f={uri}");
    let url = memo.http_url();
    let mut args = vec![
        "--mcp-http",
        &url,
        "--watch",
        &watch,
        "--on-event",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut w = crate::watch::Watch::spawn(":memory:", &args);
    w.event("watch.subscribed", "f").await;
    let c = crate::watch::memo_client(&memo.http_url()).await;
    Setup {
        _memo: memo,
        _dir: dir,
        w,
        c,
    }
}

async fn set(s: &Setup, key: &str, value: Value) {
    call(&s.c, "memo_set", json!({"key": key, "value": value})).await;
}

async fn lines(s: &mut Setup) -> Value {
    s.w.notice().await["lines"].clone()
}

#[tokio::test]
async fn a_filter_transforms_and_drops_and_keeps_its_variables() {
    let code = r#"
try:
    seen += 1
except NameError:
    seen = 1
f'{event["type"].lower()} {event["key"]} #{seen}' if event["type"] in ("ADDED", "DELETED") else None
"#;
    let mut s = setup("memo://log", code).await;
    set(&s, "a", json!(1)).await;
    assert_eq!(lines(&mut s).await, json!(["added a #1"]));
    set(&s, "a", json!(2)).await; // MODIFIED: dropped by the filter
    call(&s.c, "memo_delete", json!({"key": "a"})).await;
    assert_eq!(
        lines(&mut s).await,
        json!(["deleted a #3"]),
        "the dropped event still counted"
    );
    let dropped =
        s.w.log_line(|l| l.contains("\"kept\":false") && l.contains("\"reason\":\"filter\""))
            .await;
    assert!(dropped.contains("MODIFIED"), "{dropped}");
    s.w.terminate().await;
}

#[tokio::test]
async fn the_catalog_is_read_only_and_bounded() {
    let code = r#"
k = event["key"]
if k == "read":
    r = await read_resource(uri="memo://notes")
    out = f"notes has {len(r)} keys; resources: {len(list_resources())}"
elif k == "write":
    out = memo_set(key="x", value=1)
elif k == "watch":
    out = watch_start(name="w", uri="memo://notes")
elif k == "many":
    for i in range(11):
        read_resource(uri="memo://notes")
    out = "unreachable"
else:
    out = None
out
"#;
    let mut s = setup("memo://log", code).await;
    set(&s, "read", json!(1)).await;
    assert_eq!(
        lines(&mut s).await,
        json!(["notes has 1 keys; resources: 2"])
    );
    set(&s, "write", json!(1)).await;
    let l = lines(&mut s).await;
    assert!(
        l[0].as_str()
            .unwrap()
            .starts_with("on_event raised PermissionError: memo_set is a mutating tool"),
        "{l}"
    );
    set(&s, "watch", json!(1)).await;
    let l = lines(&mut s).await;
    assert!(
        l[0].as_str()
            .unwrap()
            .contains("cannot start or stop watches"),
        "{l}"
    );
    set(&s, "many", json!(1)).await;
    let l = lines(&mut s).await;
    assert!(
        l[0].as_str().unwrap().contains("more than 10 tool calls"),
        "{l}"
    );
    s.w.terminate().await;
}

#[tokio::test]
async fn the_sandbox_has_no_files_sockets_or_processes() {
    let code = r#"
k = event["key"]
if k == "file":
    open("/etc/hostname").read()
elif k == "socket":
    import socket
    socket.socket()
elif k == "process":
    import subprocess
    subprocess.run(["true"])
elif k == "env":
    import os
    os.getenv("HOME")
None
"#;
    let mut s = setup("memo://log", code).await;
    for k in ["file", "socket", "process", "env"] {
        set(&s, k, json!(1)).await;
        let l = lines(&mut s).await;
        assert!(
            l[0].as_str().unwrap().starts_with("on_event raised"),
            "{k}: {l}"
        );
    }
    s.w.terminate().await;
}

#[tokio::test]
async fn runaway_filters_fail_only_their_event() {
    let code = r#"
k = event["key"]
if k == "loop":
    while True:
        pass
elif k == "memory":
    x = "a" * (10 ** 10)
elif k == "recursion":
    def f(n):
        return f(n + 1)
    f(0)
f"ok {k}"
"#;
    let mut s = setup("memo://log", code).await;
    set(&s, "loop", json!(1)).await;
    let l = lines(&mut s).await;
    assert!(l[0].as_str().unwrap().contains("TimeoutError"), "{l}");
    set(&s, "after-loop", json!(1)).await;
    assert_eq!(lines(&mut s).await, json!(["ok after-loop"]));
    set(&s, "memory", json!(1)).await;
    let l = lines(&mut s).await;
    let text = l[0].as_str().unwrap();
    assert!(
        text.contains("MemoryError") || text.contains("worker died"),
        "{l}"
    );
    set(&s, "after-memory", json!(1)).await;
    let l = lines(&mut s).await;
    assert!(l[0].as_str().unwrap().starts_with("ok after-memory"), "{l}");
    set(&s, "recursion", json!(1)).await;
    let l = lines(&mut s).await;
    assert!(l[0].as_str().unwrap().contains("RecursionError"), "{l}");
    set(&s, "after-recursion", json!(1)).await;
    assert_eq!(lines(&mut s).await, json!(["ok after-recursion"]));
    s.w.terminate().await;
}

async fn start_fails(code: &str) -> String {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("filter-bad");
    let file = dir.path().join("bad.py");
    std::fs::write(&file, code).unwrap();
    let out = herald([
        "-v",
        "--store",
        ":memory:",
        "watch",
        "--mcp-http",
        &memo.http_url(),
        "--watch",
        "x=memo://log",
        "--on-event",
        file.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !err.contains("\"event\":\"watch.subscribed\""),
        "a failing start subscribes nothing: {err}"
    );
    err
}

#[tokio::test]
async fn bad_filters_fail_the_start_with_no_subscription() {
    let err = start_fails("x = 1\nx +\n").await;
    assert!(
        err.contains("SyntaxError: Expected an expression (line 2, column 4: x +)"),
        "{err}"
    );
    let err = start_fails("undefined_helper(event)\n").await;
    assert!(
        err.contains("NameError") && err.contains("undefined_helper"),
        "{err}"
    );
    let err = start_fails("<function fmt at 0x7f3a2c1d5e50>").await;
    assert!(err.contains("not a function object"), "{err}");
    // Written as a statement, it would pass the dry run and then drop every event.
    let err = start_fails(
        "if event[\"type\"] == \"ADDED\":\n    f\"added {event['key']}\"\nelse:\n    None\n",
    )
    .await;
    assert!(
        err.contains("on_event gives no notice for any event: the filter's value is its last expression, and it ends with an `if` statement (line 1), which has no value; write the choice as one expression, `x if cond else None`"),
        "{err}"
    );
}

#[tokio::test]
async fn a_filter_error_names_its_line() {
    let code = r#"
k = event["key"]
seen = {}
seen[k] if k == "missing" else f"ok {k}"
"#;
    let mut s = setup("memo://log", code).await;
    set(&s, "missing", json!(1)).await;
    assert_eq!(
        lines(&mut s).await,
        json!([
            "on_event raised KeyError: missing (line 4, column 1: seen[k] if k == \"missing\" else f\"ok {k}\")"
        ])
    );
    s.w.terminate().await;
}

#[tokio::test]
async fn code_mode_starts_a_filtered_watch() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let program = r#"
tools = [r["uri"] for r in list_resources()]
r = await watch_start(name="cm", uri="memo://log", on_event='''
f'{event["type"].lower()} {event["key"]}' if event["type"] in ("ADDED", "DELETED") else None
''')
print(sorted(tools))
r
"#;
    let mut child = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "code",
            "--mcp-http",
            &memo.http_url(),
            "--debounce-ms",
            "200",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(program.as_bytes()).await.unwrap();
    drop(stdin);
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(WAIT, out.next_line())
            .await
            .expect("output in time")
            .unwrap()
            .expect("running")
    };
    assert_eq!(next().await, "['memo://log', 'memo://notes']");
    let started: Value = serde_json::from_str(&next().await).unwrap();
    assert_eq!(
        started,
        json!({"name": "cm", "uri": "memo://log", "shape": "event-log"})
    );
    let c = crate::watch::memo_client(&memo.http_url()).await;
    call(&c, "memo_set", json!({"key": "k", "value": 1})).await;
    call(&c, "memo_set", json!({"key": "k", "value": 2})).await;
    let notice: Value = serde_json::from_str(&next().await).unwrap();
    assert_eq!(notice["watch"], "cm");
    assert_eq!(
        notice["lines"],
        json!(["added k"]),
        "MODIFIED was filtered out"
    );
    let pid = child.id().unwrap().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(
        tokio::time::timeout(WAIT, child.wait())
            .await
            .unwrap()
            .unwrap()
            .success()
    );
}

#[tokio::test]
async fn code_mode_reports_python_errors_and_may_call_mutating_tools() {
    let memo = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("code");
    let ok = dir.path().join("ok.py");
    std::fs::write(
        &ok,
        "memo_set(key='from-code', value=[1, 2])\n\
         watch_start(name='w', uri='memo://notes')\n\
         assert [w['name'] for w in watch_list()] == ['w']\n\
         assert watch_stop(name='w') is True\n\
         assert watch_stop(name='w') is False and watch_list() == []\n\
         read_resource(uri='memo://notes')\n",
    )
    .unwrap();
    let out = herald([
        "--store",
        ":memory:",
        "code",
        "--mcp-http",
        &memo.http_url(),
        ok.to_str().unwrap(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v, json!({"from-code": [1, 2]}));
    let bad = dir.path().join("bad.py");
    std::fs::write(&bad, "watch_start(name='x', uri='memo://nope')\n").unwrap();
    let out = herald([
        "--store",
        ":memory:",
        "code",
        "--mcp-http",
        &memo.http_url(),
        bad.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ValueError") && err.contains("unknown resource memo://nope"),
        "{err}"
    );
}

#[tokio::test]
async fn intake_goes_on_while_the_filter_runs() {
    // The first event keeps the filter busy until its time limit (5 s here, a wide margin on a
    // loaded machine); the next change is read and diffed meanwhile (the watch log says a run
    // was in progress) and filtered right after.
    let code = r#"
k = event["key"]
if k == "busy":
    while True:
        pass
f"ok {k}"
"#;
    let mut s = setup_with("memo://log", code, &["--filter-time-ms", "5000"]).await;
    set(&s, "busy", json!(1)).await;
    let first = s.w.event("watch.update", "f").await;
    assert_eq!(first["filtering"], json!(false), "{first}");
    set(&s, "next", json!(1)).await;
    let second = s.w.event("watch.update", "f").await;
    assert_eq!(second["filtering"], json!(true), "{second}");
    assert_eq!(second["queued"], json!(1), "{second}");
    let l = lines(&mut s).await;
    assert!(l[0].as_str().unwrap().contains("TimeoutError"), "{l}");
    let l = if l.as_array().unwrap().len() == 1 {
        lines(&mut s).await
    } else {
        json!([l[1].clone()])
    };
    assert_eq!(l, json!(["ok next"]));
    s.w.terminate().await;
}

// === the examples of docs/watch.md, run as written ===

/// The documented filter for a file source, and its memo one: these files are the code
/// blocks of docs/watch.md.
fn readme_filter(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/filters/");
    std::fs::read_to_string(format!("{path}{name}")).unwrap()
}

#[tokio::test]
async fn the_readme_memo_filter_says_what_happened_to_each_todo() {
    let mut s = setup("memo://notes", &readme_filter("todo.py")).await;
    set(&s, "todo-milk", json!("buy milk")).await;
    assert_eq!(lines(&mut s).await, json!(["new todo-milk: buy milk"]));
    // Not a todo: dropped, so the next notice is only the todo's change.
    set(&s, "shopping", json!("Saturday")).await;
    set(&s, "todo-milk", json!("buy oat milk")).await;
    assert_eq!(
        lines(&mut s).await,
        json!(["changed todo-milk: buy oat milk"])
    );
    call(&s.c, "memo_delete", json!({"key": "todo-milk"})).await;
    assert_eq!(lines(&mut s).await, json!(["done todo-milk: buy oat milk"]));
    s.w.terminate().await;
}

#[tokio::test]
async fn the_readme_file_filter_says_how_much_each_log_grew() {
    let dir = TempDir::new("filter-logs");
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("logs");
    std::fs::create_dir(&root).unwrap();
    let server = Server::spawn(&[
        "--store",
        ":memory:",
        "file",
        "--root",
        base.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let filter = base.join("logs.py");
    std::fs::write(&filter, readme_filter("logs.py")).unwrap();
    let watch = format!(
        "f={}?glob=*.log",
        herald::source::file::events_uri(&root, false)
    );
    let mut w = crate::watch::Watch::spawn(
        ":memory:",
        &[
            "--mcp-http",
            &server.http_url(),
            "--watch",
            &watch,
            "--on-event",
            filter.to_str().unwrap(),
        ],
    );
    w.event("watch.subscribed", "f").await;
    let mut next = async || w.notice().await["lines"].clone();
    // Whole writes: written beside the watched directory, renamed into it.
    let put = |name: &str, content: &str| {
        let tmp = base.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, root.join(name)).unwrap();
    };
    put("app.log", "started\n");
    assert_eq!(next().await, json!(["created app.log"]));
    put("app.log", "started\nready\n");
    assert_eq!(next().await, json!(["app.log +6 bytes"]));
    std::fs::rename(root.join("app.log"), root.join("app.1.log")).unwrap();
    assert_eq!(next().await, json!(["moved app.1.log"]));
    std::fs::remove_file(root.join("app.1.log")).unwrap();
    assert_eq!(next().await, json!(["deleted app.1.log"]));
    // The watched directory goes: its own DELETED, then an ERROR, which is not about one
    // file and is said as it comes.
    std::fs::remove_dir(&root).unwrap();
    let gone = format!(
        "ERROR: {} is gone (deleted or moved away); reads of it fail until it exists again, and events resume then",
        root.display()
    );
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(next().await.as_array().unwrap().iter().cloned());
    }
    assert_eq!(got, [json!("deleted logs"), json!(gone)]);
    w.terminate().await;
}
