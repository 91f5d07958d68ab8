//! Raw wire tests: JSON-RPC lines on stdio and plain HTTP requests, without an MCP client in
//! the way, for what a well-behaved client would never send or would hide.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::support::*;

pub(crate) struct Raw {
    pub(crate) child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Lines read but put back, read again first.
    pub(crate) stash: std::collections::VecDeque<Value>,
}

impl Raw {
    pub(crate) fn spawn(extra: &[&str]) -> Raw {
        Raw::spawn_with_stderr(extra, Stdio::null())
    }

    pub(crate) fn spawn_with_stderr(extra: &[&str], stderr: Stdio) -> Raw {
        let args: Vec<&str> = ["--store", ":memory:", "memo"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        Raw::spawn_args(&args, stderr)
    }

    /// `herald ARGS` on stdio.
    pub(crate) fn spawn_args(args: &[&str], stderr: Stdio) -> Raw {
        init();
        let mut child = tokio::process::Command::new(bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Raw {
            child,
            stdin,
            lines,
            stash: Default::default(),
        }
    }

    pub(crate) async fn send_line(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    pub(crate) async fn send(&mut self, v: Value) {
        self.send_line(&v.to_string()).await;
    }

    pub(crate) async fn recv(&mut self) -> Value {
        if let Some(v) = self.stash.pop_front() {
            return v;
        }
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("server still running");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line}: {e}"))
    }

    /// Reads until `pred` holds, returning everything read (including the match).
    pub(crate) async fn recv_until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let v = self.recv().await;
            let done = pred(&v);
            seen.push(v);
            if done {
                return seen;
            }
        }
    }

    /// Listens for `uris` and returns the acknowledgment.
    pub(crate) async fn listen(&mut self, id: &str, uris: &[&str]) -> Value {
        self.send(
            json!({"jsonrpc":"2.0","id":id,"method":"subscriptions/listen",
            "params":{"_meta":meta(),"notifications":{"resourceSubscriptions":uris}}}),
        )
        .await;
        let seen = self.recv_until(|v| sub_id(v) == Some(id)).await;
        let ack = seen.last().unwrap();
        assert_eq!(
            ack["method"], "notifications/subscriptions/acknowledged",
            "{ack}"
        );
        ack.clone()
    }

    pub(crate) async fn memo_set(&mut self, id: u64, key: &str, value: Value) {
        self.send(json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"_meta":meta(),"name":"memo_set","arguments":{"key":key,"value":value}}}))
            .await;
    }
}

pub(crate) fn sub_id(v: &Value) -> Option<&str> {
    v.pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
        .and_then(Value::as_str)
}

#[tokio::test]
async fn cancelled_listen_gets_nothing_and_unsubscribed_uris_send_nothing() {
    let mut raw = Raw::spawn(&[]);
    raw.listen("L1", &["memo://notes"]).await;
    raw.listen("L2", &["memo://log"]).await;
    raw.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"L1","reason":"test"}}))
        .await;
    raw.listen("L3", &["memo://notes"]).await;
    let mut seen = Vec::new();
    for (i, key) in ["a", "b"].iter().enumerate() {
        raw.memo_set(100 + i as u64, key, json!(i)).await;
        let mut got_response = false;
        let mut got_l2 = false;
        let mut got_l3 = false;
        while !(got_response && got_l2 && got_l3) {
            let v = raw.recv().await;
            got_response |= v["id"] == 100 + i as u64;
            got_l2 |= sub_id(&v) == Some("L2");
            got_l3 |= sub_id(&v) == Some("L3");
            seen.push(v);
        }
    }
    for v in &seen {
        assert_ne!(sub_id(v), Some("L1"), "a cancelled listen got {v}");
        if sub_id(v) == Some("L2") {
            assert_eq!(
                v["params"]["uri"], "memo://log",
                "L2 only asked for the log: {v}"
            );
        }
        if sub_id(v) == Some("L3") {
            assert_eq!(v["params"]["uri"], "memo://notes");
        }
    }
}

#[tokio::test]
async fn malformed_and_oversized_lines_are_refused_and_serving_continues() {
    // Over the longest answer here (tools/list, about 2 KB), under the padded line below.
    let mut raw = Raw::spawn(&["--max-message-bytes", "3000"]);
    raw.send_line("{oops").await;
    let e = raw.recv().await;
    assert_eq!(e["error"]["code"], -32700, "{e}");
    raw.send_line(&format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(5000)
    ))
    .await;
    let e = raw.recv().await;
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("3000-byte limit"),
        "{e}"
    );
    raw.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":meta()}}))
        .await;
    let ok = raw.recv().await;
    assert_eq!(ok["id"], 2);
    let names: Vec<&str> = ok["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["memo_set", "memo_delete", "memo_wait", "memo_ask"]);
    // A request without _meta is refused with -32602, and serving continues.
    raw.send(json!({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}))
        .await;
    let e = raw.recv().await;
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(3), json!(-32602)),
        "{e}"
    );
    raw.send(json!({"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":meta()}}))
        .await;
    assert_eq!(raw.recv().await["id"], 4);
}

async fn post(url: &str, origin: Option<&str>, body: Value) -> (u16, String) {
    let client = reqwest::Client::new();
    let method = body["method"].as_str().unwrap_or("").to_owned();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .body(body.to_string());
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let resp = tokio::time::timeout(WAIT, req.send())
        .await
        .unwrap()
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

#[tokio::test]
async fn http_refuses_missing_meta_and_bad_origin() {
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = s.http_url();
    let (status, body) = post(
        &url,
        None,
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("-32602"), "{body}");
    let ok = json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":meta()}});
    let (status, body) = post(&url, Some("http://evil.example.com"), ok.clone()).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = post(&url, Some("http://localhost:3000"), ok.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("memo_set"), "{body}");
    let (status, _) = post(&url, None, ok).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_reader_that_stalls_has_its_listen_ended_and_logged() {
    let mut raw = Raw::spawn_with_stderr(&["--listen-stall-ms", "300", "-v"], Stdio::piped());
    let mut stderr = BufReader::new(raw.child.stderr.take().unwrap()).lines();
    raw.listen("L1", &["memo://notes"]).await;
    // Stop reading stdout and keep writing: responses and notifications fill the pipe, the
    // listen stream's writes stop completing, and the server must end that stream.
    let mut stdin = raw.stdin;
    let writer = tokio::spawn(async move {
        for i in 0..20_000u64 {
            let req = json!({"jsonrpc":"2.0","id":1000 + i,"method":"tools/call",
                "params":{"_meta":meta(),"name":"memo_set","arguments":{"key":"k","value":i}}});
            if stdin
                .write_all(format!("{req}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = stdin.flush().await;
    });
    let logged = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = stderr.next_line().await {
            if line.contains("listen stream stalled") {
                return true;
            }
        }
        false
    })
    .await
    .expect("the stall is logged in time");
    assert!(logged);
    // Reading again, the stream's end arrives: an error for L1 (not the graceful result), so
    // the client knows to listen again and re-read.
    let mut ended = false;
    while !ended {
        let v = tokio::time::timeout(WAIT, raw.lines.next_line())
            .await
            .expect("output in time")
            .unwrap()
            .expect("server running");
        let v: Value = serde_json::from_str(&v).unwrap();
        ended = v["id"] == "L1" && v["error"]["data"]["reason"] == "stalled";
        assert!(
            v["id"] != "L1" || ended,
            "L1 must end with the stall error: {v}"
        );
    }
    writer.abort();
}

/// Regression: a stdio server blocked reading stdin ignored SIGTERM until stdin closed,
/// because the runtime waited for the blocking read on drop.
#[tokio::test]
async fn sigterm_stops_a_stdio_server_whose_stdin_stays_open() {
    let mut raw = Raw::spawn(&[]);
    raw.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":meta()}}))
        .await;
    assert_eq!(raw.recv().await["id"], 1);
    let pid = raw.child.id().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(WAIT, raw.child.wait())
        .await
        .expect("herald exits after SIGTERM although stdin is still open")
        .unwrap();
    assert!(status.success(), "{status}");
}

/// Regression: a listen whose `resourceSubscriptions` was not a list was acknowledged with
/// nothing on HTTP, and called an unknown method on stdio.
#[tokio::test]
async fn a_listen_filter_that_is_not_a_list_is_invalid_params() {
    let bad = json!({"jsonrpc":"2.0","id":"L","method":"subscriptions/listen",
        "params":{"_meta":meta(),"notifications":{"resourceSubscriptions":"memo://notes"}}});
    let mut raw = Raw::spawn(&[]);
    raw.send(bad.clone()).await;
    let e = raw.recv().await;
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!("L"), json!(-32602)),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resourceSubscriptions"),
        "the error names the field: {e}"
    );
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let (status, body) = post(&s.http_url(), None, bad).await;
    assert_eq!(
        status, 200,
        "a JSON-RPC error, as rmcp answers other bad params: {body}"
    );
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], -32602, "{body}");
    assert!(body.contains("resourceSubscriptions"), "{body}");
}

/// Regression: `herald file` acknowledged a listen on a URI outside its roots (only a log
/// line said it was not watched); admission now leaves it out, as memo does.
#[tokio::test]
async fn a_file_listen_outside_the_roots_is_left_out_of_the_ack() {
    let dir = TempDir::new("wire-file-ack");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let inside = herald::source::file::state_uri(&root);
    let events = herald::source::file::events_uri(&root, false);
    let outside = "file:///etc/hostname";
    let mut raw = Raw::spawn_args(
        &[
            "--store",
            ":memory:",
            "file",
            "--root",
            root.to_str().unwrap(),
        ],
        Stdio::null(),
    );
    let ack = raw.listen("L1", &[&inside, outside, &events]).await;
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!([inside, events]),
        "{ack}"
    );
}

/// Regression (review): a listen whose method name was written with JSON escapes skipped the
/// HTTP admission gate; rmcp then acknowledged it unadmitted. The gate reads the method with
/// serde, so the listen limits apply to it like to any other.
#[tokio::test]
async fn an_escaped_listen_method_is_still_admitted_on_http() {
    let s = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--max-listen-uris",
        "1",
    ])
    .await;
    for method in [r"subscriptions\/listen", r"subscriptions/\u006cisten"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{{"_meta":{},"notifications":{{"resourceSubscriptions":["memo://notes","memo://log"]}}}}}}"#,
            meta()
        );
        let client = reqwest::Client::new();
        let resp = tokio::time::timeout(
            WAIT,
            client
                .post(s.http_url())
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "subscriptions/listen")
                .body(body)
                .send(),
        )
        .await
        .unwrap()
        .unwrap();
        let text = tokio::time::timeout(WAIT, resp.text())
            .await
            .unwrap()
            .unwrap();
        assert!(
            text.contains("one stream takes at most 1"),
            "{method}: the gate's limit, not an unadmitted ack: {text}"
        );
    }
}

/// An HTTP listen whose reader takes nothing (a small receive window, never read) is ended by
/// the stall limit as on stdio: what it holds is bounded by the socket's buffers, the
/// response's short queue and its pending set, and the server goes on serving.
#[tokio::test]
async fn an_http_listen_whose_reader_stalls_is_ended() {
    let mut s = Server::spawn(&[
        "-v",
        "--store",
        ":memory:",
        "memo",
        "--listen-stall-ms",
        "300",
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let url = s.http_url();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    // A long request id (each notification carries it as its subscription id) fills the
    // socket's buffers in a few hundred notifications.
    let id = "L".repeat(16 << 10);
    let request = raw_listen(&addr.to_string(), json!(id));
    stalled.write_all(request.as_bytes()).await.unwrap();
    // Read up to the acknowledgment, then never again.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("acknowledged") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut stalled, &mut buf))
            .await
            .expect("the acknowledgment in time")
            .unwrap();
        assert!(n > 0, "closed before the acknowledgment");
        seen.extend_from_slice(&buf[..n]);
    }
    // Changes, each a notification for the stalled stream, until it is ended.
    let c = std::sync::Arc::new(
        herald::transport::client::connect(
            &herald::transport::target::Target::Http(url.clone()),
            &herald::transport::tls::ClientTrust::default(),
            herald::transport::client::client_config(),
            4 << 20,
        )
        .await
        .unwrap(),
    );
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let c = c.clone();
        writers.spawn(async move {
            for i in 0..100_000 {
                call(&c, "memo_set", json!({"key": format!("k{w}"), "value": i})).await;
            }
        });
    }

    s.line_where("the stall logged", |v| {
        v.to_string().contains("listen stream stalled")
    })
    .await;
    writers.abort_all();
    // Everyone else is still served.
    let (notes, _) = read_json(&c, "memo://notes").await;
    assert!(notes.get("k0").is_some(), "{notes}");
}

/// A plain HTTP/1.1 listen on `memo://notes` with request id `id`, as every 2026-07-28
/// client sends it, addressed to `addr`.
fn raw_listen(addr: &str, id: Value) -> String {
    let body = json!({"jsonrpc":"2.0","id":id,"method":"subscriptions/listen",
        "params":{"_meta":meta(),"notifications":{"resourceSubscriptions":["memo://notes"]}}})
    .to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: subscriptions/listen\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A plain `tools/call` or `resources/read` is answered by herald itself, with no rmcp service per request; the
/// answer must be exactly rmcp's. A quoted `Accept` parameter sends the same call to rmcp.
#[tokio::test]
async fn a_plain_http_call_is_answered_as_rmcp_answers_it() {
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let client = reqwest::Client::new();
    let post = |accept: &'static str, name: &str, arguments: Value| {
        // A read when `arguments` is null: `name` is its URI.
        let (method, body) = if arguments.is_null() {
            (
                "resources/read",
                json!({"jsonrpc":"2.0","id":"r1","method":"resources/read",
                "params":{"_meta":meta(),"uri":name}}),
            )
        } else {
            (
                "tools/call",
                json!({"jsonrpc":"2.0","id":"c1","method":"tools/call",
                "params":{"_meta":meta(),"name":name,"arguments":arguments}}),
            )
        };
        client
            .post(s.http_url())
            .header("content-type", "application/json")
            .header("accept", accept)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .header("mcp-name", name)
            .body(body.to_string())
            .send()
    };
    // Set first, so both paths answer the same call with the same "unchanged".
    let first = post(
        "application/json, text/event-stream",
        "memo_set",
        json!({"key": "k", "value": 1}),
    )
    .await
    .unwrap();
    assert_eq!(first.status(), 200);
    for (name, arguments) in [
        ("memo_set", json!({"key": "k", "value": 1})),
        ("memo_set", json!({})),
        ("memo_delete", json!({"key": "nope"})),
        ("no_such_tool", json!({})),
        // Only as a task, and the call declares no tasks: -32021, which rmcp answers with 400.
        ("memo_ask", json!({"key": "k"})),
        ("memo://notes", Value::Null),
        ("memo://nope", Value::Null),
    ] {
        let mut answers = Vec::new();
        for accept in [
            "application/json, text/event-stream",
            "application/json, text/event-stream;x=\"rmcp\"",
        ] {
            let r = tokio::time::timeout(WAIT, post(accept, name, arguments.clone()))
                .await
                .unwrap()
                .unwrap();
            let status = r.status().as_u16();
            let kind = r.headers()["content-type"].to_str().unwrap().to_owned();
            let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            answers.push((status, kind, body));
        }
        assert_eq!(answers[0], answers[1], "{name} {arguments}");
        if name == "memo_ask" {
            assert_eq!(answers[0].0, 400, "{:?}", answers[0]);
            assert_eq!(answers[0].2["error"]["code"], -32021, "{:?}", answers[0]);
        }
        // Both paths name the server on a result, as 2026-07-28 says results SHOULD.
        if let Some(result) = answers[0].2.get("result") {
            assert_eq!(
                result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "herald-memo",
                "{name}: {result}"
            );
        }
    }
}

/// Every result names the server that answered (`_meta["io.modelcontextprotocol/serverInfo"]`),
/// on byte streams as on HTTP.
#[tokio::test]
async fn results_carry_the_server_info() {
    for via in [Via::Stdio, Via::Quic] {
        let memo = Memo::start(via).await;
        let conn = memo.client().await;
        let info = |meta: Option<rmcp::model::MetaObject>| {
            meta.and_then(|m| m.0.get("io.modelcontextprotocol/serverInfo").cloned())
                .unwrap_or_default()
        };
        let tools = conn.list_tools(None).await.unwrap();
        assert_eq!(info(tools.meta)["name"], "herald-memo");
        let call = conn
            .call_tool(
                rmcp::model::CallToolRequestParams::new("memo_set")
                    .with_arguments(args(json!({"key": "k", "value": 1}))),
            )
            .await
            .unwrap();
        assert_eq!(info(call.meta)["name"], "herald-memo");
        assert_eq!(
            info(call_meta_version(&conn).await)["version"],
            env!("CARGO_PKG_VERSION")
        );
    }
}

/// The `_meta` of a read of `memo://notes`.
async fn call_meta_version(
    conn: &herald::transport::client::Connection,
) -> Option<rmcp::model::MetaObject> {
    conn.read_resource(rmcp::model::ReadResourceRequestParams::new("memo://notes"))
        .await
        .unwrap()
        .meta
}

/// A listen that comes first on its connection (answered on the socket, ahead of hyper) ends
/// at shutdown as every listen does: its graceful result, then the chunked body's end.
#[tokio::test]
async fn a_listen_first_on_its_connection_ends_with_its_result_at_shutdown() {
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let addr = s
        .http_url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = raw_listen(&addr, json!("L"));
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut read_until = async |seen: &mut Vec<u8>, needle: &str| {
        while !String::from_utf8_lossy(seen).contains(needle) {
            let mut buf = [0u8; 4096];
            let n =
                tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut socket, &mut buf))
                    .await
                    .unwrap_or_else(|_| panic!("{needle} in time"))
                    .unwrap();
            assert!(
                n > 0,
                "closed before {needle}: {}",
                String::from_utf8_lossy(seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    };
    read_until(&mut seen, "acknowledged").await;
    assert!(s.terminate().await.success());
    read_until(&mut seen, "\r\n0\r\n\r\n").await;
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains(r#""resultType":"complete""#), "{text}");
}

/// A body that is not one JSON-RPC message gets a JSON-RPC error with `400` on HTTP (rmcp
/// alone answers `415` and a line of text), and the server goes on serving.
#[tokio::test]
async fn malformed_http_bodies_get_json_rpc_errors() {
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let client = reqwest::Client::new();
    let m = meta();
    let text = |v: Value| v.to_string().into_bytes();
    let cases: Vec<(&str, Vec<u8>, i64)> = vec![
        (
            "truncated",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#.to_vec(),
            -32700,
        ),
        ("empty", Vec::new(), -32700),
        (
            "invalid UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}".to_vec(),
            -32700,
        ),
        ("deeply nested", "[".repeat(10_000).into_bytes(), -32700),
        ("not JSON", b"hello".to_vec(), -32700),
        (
            "a batch",
            br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.to_vec(),
            -32600,
        ),
        ("a string", text(json!("tools/list")), -32600),
        (
            "a null id",
            text(json!({"jsonrpc":"2.0","id":null,"method":"tools/list","params":{"_meta":m}})),
            -32600,
        ),
        (
            "a number as method",
            text(json!({"jsonrpc":"2.0","id":1,"method":5})),
            -32600,
        ),
        (
            "a string as params",
            text(json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":"x"})),
            -32600,
        ),
        (
            "a string as _meta",
            text(json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":"x"}})),
            -32602,
        ),
    ];
    for (what, body, code) in cases {
        let r = tokio::time::timeout(
            WAIT,
            client
                .post(s.http_url())
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/list")
                .body(body)
                .send(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(r.status(), 400, "{what}");
        assert_eq!(r.headers()["content-type"], "application/json", "{what}");
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
    }
    // Nothing was lost: the server answers a good call as before.
    let c = herald::transport::client::connect(
        &herald::transport::target::Target::Http(s.http_url()),
        &herald::transport::tls::ClientTrust::default(),
        herald::transport::client::client_config(),
        4 << 20,
    )
    .await
    .unwrap();
    c.call_tool(
        rmcp::model::CallToolRequestParams::new("memo_set").with_arguments(
            json!({"key": "after", "value": 1})
                .as_object()
                .unwrap()
                .clone(),
        ),
    )
    .await
    .unwrap();
}

/// A POST of the JSON-RPC `body` to `/mcp` at `addr` as a 2026-07-28 client sends it, with
/// `accept` and `version` (the `MCP-Protocol-Version` header) as given.
fn raw_post(addr: &str, accept: &str, version: &str, body: &Value) -> Vec<u8> {
    let method = body["method"].as_str().unwrap_or_default();
    let body = body.to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: {accept}\r\nmcp-protocol-version: {version}\r\nmcp-method: {method}\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The next response on `socket` (what was read past it stays in `buf`): its status and its
/// body as JSON (a body that is not JSON as a string). Only a whole answer is taken: a
/// response streamed without a `content-length` (a listen's SSE stream, its acknowledgment)
/// fails the test.
async fn read_answer(socket: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> (u16, Value) {
    let more = async |socket: &mut tokio::net::TcpStream, buf: &mut Vec<u8>| {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(socket, &mut chunk))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        more(socket, buf).await;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .unwrap_or_else(|| {
            panic!(
                "a whole answer, not a stream: {}",
                String::from_utf8_lossy(buf)
            )
        })
        .trim()
        .parse()
        .unwrap();
    while buf.len() < head_end + length {
        more(socket, buf).await;
    }
    let body: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, body)
}

/// Regression (issue 28): a listen naming `taskIds` from a client that did not declare the
/// tasks extension was answered `-32021` with HTTP 200 where rmcp answers `-32021` with 400.
/// A listen refused before its acknowledgment gets rmcp's status for its error on every path
/// herald answers it by: first on its connection (read ahead of hyper, then handed to the
/// gate), later on the same connection (hyper, the gate), and in a shape the gate hands on to
/// rmcp once admitted (a quoted `Accept` parameter), first and later. A listen whose `_meta`
/// rmcp refuses is rmcp's to answer, with its error and status, before herald looks at its
/// filter.
#[tokio::test]
async fn a_listen_refused_before_its_ack_gets_rmcps_status_on_every_http_path() {
    let s = Server::spawn(&[
        "--store",
        ":memory:",
        "memo",
        "--http",
        "127.0.0.1:0",
        "--max-listen-uris",
        "1",
    ])
    .await;
    let addr = s
        .http_url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let listen = |meta: Value, notifications: Value| {
        let mut params = json!({"notifications": notifications});
        if !meta.is_null() {
            params["_meta"] = meta;
        }
        json!({"jsonrpc": "2.0", "id": "L", "method": "subscriptions/listen", "params": params})
    };
    let tasks = json!({"taskIds": ["t1"]});
    let mut no_caps = meta();
    no_caps
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let mut old = meta();
    old["io.modelcontextprotocol/protocolVersion"] = json!("1900-01-01");
    let cases = [
        (
            "taskIds, tasks not declared",
            "2026-07-28",
            listen(meta(), tasks.clone()),
            -32021,
            400,
        ),
        (
            "resourceSubscriptions not a list",
            "2026-07-28",
            listen(meta(), json!({"resourceSubscriptions": "memo://notes"})),
            -32602,
            200,
        ),
        (
            "more URIs than --max-listen-uris (refused by admission)",
            "2026-07-28",
            listen(
                meta(),
                json!({"resourceSubscriptions": ["memo://notes", "memo://log"]}),
            ),
            -32602,
            200,
        ),
        // rmcp refuses these for their `_meta` before any listen is looked at.
        (
            "taskIds, and a _meta without clientCapabilities",
            "2026-07-28",
            listen(no_caps, tasks.clone()),
            -32602,
            400,
        ),
        (
            "taskIds, and no _meta",
            "2026-07-28",
            listen(Value::Null, tasks.clone()),
            -32602,
            400,
        ),
        (
            "taskIds, and an unsupported version",
            "1900-01-01",
            listen(old, tasks.clone()),
            -32022,
            400,
        ),
        // A request of the `initialize` era outside a session: rmcp's plain-text 400 (code 0
        // here: no JSON-RPC error), never an acknowledgment of a listen nobody admitted.
        (
            "taskIds, no _meta, and a 2025-11-25 header",
            "2025-11-25",
            listen(Value::Null, tasks.clone()),
            0,
            400,
        ),
    ];
    for accept in [
        "application/json, text/event-stream",
        "application/json, text/event-stream;x=\"rmcp\"",
    ] {
        for (what, version, body, code, status) in &cases {
            let request = raw_post(&addr, accept, version, body);
            let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let mut buf = Vec::new();
            for turn in ["first on its connection", "later on the same connection"] {
                socket.write_all(&request).await.unwrap();
                let (got, answer) = read_answer(&mut socket, &mut buf).await;
                let say = format!("{what}, {turn}, accept {accept}: {answer}");
                assert_eq!(got, *status, "{say}");
                if *code == 0 {
                    assert!(answer.is_string(), "{say}");
                    continue;
                }
                assert_eq!(answer["error"]["code"], *code, "{say}");
                assert_eq!(answer["id"], "L", "{say}");
            }
        }
    }
    // Nothing refused was held: a listen is acknowledged on a fresh connection.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(raw_listen(&addr, json!("ok")).as_bytes())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("acknowledged") {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut socket, &mut chunk))
            .await
            .expect("the acknowledgment in time")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(
        String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200 "),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}
