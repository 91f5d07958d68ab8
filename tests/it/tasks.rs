//! The tasks extension on the wire (stdio, raw JSON-RPC lines): a `tools/call` as a task only
//! when the request declares the extension, `tasks/get|update|cancel` with their codes, and
//! `subscriptions/listen` `taskIds`: the `-32021` gate before anything else, the
//! acknowledgment's echo, and a complete state pushed on every change. Then a restart.

use std::process::Stdio;

use serde_json::{Value, json};

use crate::support::*;
use crate::wire::{Raw, sub_id};

/// `_meta` declaring the tasks extension.
pub(crate) fn tmeta() -> Value {
    let mut m = meta();
    m["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    m
}

impl Raw {
    /// Sends request `id` and returns its answer; what came before it is read again later.
    async fn ask(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let mut before = Vec::new();
        loop {
            let v = self.recv().await;
            if v["id"] == id && v.get("method").is_none() {
                for b in before.into_iter().rev() {
                    self.stash.push_front(b);
                }
                return v;
            }
            before.push(v);
        }
    }

    async fn call(&mut self, id: Value, meta: Value, tool: &str, args: Value) -> Value {
        self.ask(
            id,
            "tools/call",
            json!({"_meta": meta, "name": tool, "arguments": args}),
        )
        .await
    }

    /// The next `notifications/tasks` on listen `sub`.
    async fn task_push(&mut self, sub: &str) -> Value {
        let seen = self
            .recv_until(|v| v["method"] == "notifications/tasks" && sub_id(v) == Some(sub))
            .await;
        seen.last().unwrap()["params"].clone()
    }

    /// Pushes on `sub` until one has `status`.
    async fn task_push_until(&mut self, sub: &str, status: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let p = self.task_push(sub).await;
            let done = p["status"] == status;
            seen.push(p);
            if done {
                return seen;
            }
        }
    }
}

pub(crate) fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("an error: {v}"))
}

#[tokio::test]
async fn a_tool_runs_as_a_task_only_when_the_request_declares_the_extension() {
    let mut raw = Raw::spawn(&[]);
    let d = raw
        .ask(json!(1), "server/discover", json!({"_meta": meta()}))
        .await;
    assert!(
        d.pointer("/result/capabilities/extensions/io.modelcontextprotocol~1tasks")
            .is_some(),
        "{d}"
    );
    let tools = raw
        .ask(json!(2), "tools/list", json!({"_meta": meta()}))
        .await;
    let wait = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "memo_wait")
        .unwrap()
        .clone();
    assert_eq!(
        wait["_meta"]["io.modelcontextprotocol/tasks"]["taskSupport"],
        "optional"
    );

    // Without the extension: a plain answer, and memo_ask (tasks only) is -32021.
    let plain = raw
        .call(
            json!(3),
            meta(),
            "memo_wait",
            json!({"key": "k", "timeout_ms": 1}),
        )
        .await;
    assert_eq!(
        plain["result"]["structuredContent"]["changed"], false,
        "{plain}"
    );
    let ask = raw
        .call(json!(4), meta(), "memo_ask", json!({"key": "k"}))
        .await;
    assert_eq!(code(&ask), -32021, "{ask}");

    // With it: a task, which tasks/get finds at once.
    let t = raw
        .call(json!(5), tmeta(), "memo_wait", json!({"key": "k"}))
        .await;
    let r = &t["result"];
    assert_eq!(
        (r["resultType"].clone(), r["status"].clone()),
        (json!("task"), json!("working")),
        "{t}"
    );
    assert_eq!(r["ttlMs"], 3_600_000);
    assert!(r["pollIntervalMs"].as_u64().is_some() && r["createdAt"].is_string());
    let id = r["taskId"].as_str().unwrap().to_owned();
    let got = raw
        .ask(
            json!(6),
            "tasks/get",
            json!({"_meta": tmeta(), "taskId": id}),
        )
        .await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(got["result"]["resultType"], "complete");

    // tasks/* from a client that did not declare the extension: -32021; unknown ids: -32602.
    for method in ["tasks/get", "tasks/cancel"] {
        let e = raw
            .ask(
                json!(method),
                method,
                json!({"_meta": meta(), "taskId": id}),
            )
            .await;
        assert_eq!(code(&e), -32021, "{method}: {e}");
        let e = raw
            .ask(
                json!(format!("{method}-x")),
                method,
                json!({"_meta": tmeta(), "taskId": "nope"}),
            )
            .await;
        assert_eq!(code(&e), -32602, "{method}: {e}");
    }
    for method in ["tasks/list", "tasks/result"] {
        let e = raw
            .ask(
                json!(method),
                method,
                json!({"_meta": tmeta(), "taskId": id}),
            )
            .await;
        assert_eq!(code(&e), -32601, "{method}: {e}");
    }

    // The key changes: the task completes with memo_wait's answer.
    let mut l = raw.ask_listen("W", json!({"taskIds": [id]}), tmeta()).await;
    assert_eq!(l["params"]["notifications"]["taskIds"], json!([id]));
    l = raw.task_push("W").await;
    assert_eq!(l["status"], "working");
    raw.memo_set(7, "k", json!("v")).await;
    let done = raw.task_push_until("W", "completed").await.pop().unwrap();
    assert_eq!(done["taskId"], id);
    assert_eq!(done["result"]["structuredContent"]["value"], "v", "{done}");
}

impl Raw {
    /// Sends a listen `id` with `notifications` and returns its acknowledgment.
    async fn ask_listen(&mut self, id: &str, notifications: Value, meta: Value) -> Value {
        self.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
            "params": {"_meta": meta, "notifications": notifications}}),
        )
        .await;
        let seen = self
            .recv_until(|v| sub_id(v) == Some(id) || v["id"] == id)
            .await;
        let ack = seen.last().unwrap().clone();
        assert_eq!(
            ack["method"], "notifications/subscriptions/acknowledged",
            "{ack}"
        );
        ack
    }
}

#[tokio::test]
async fn task_ids_are_gated_before_anything_else_and_the_ack_echoes_only_ones_own() {
    let mut raw = Raw::spawn(&[]);
    // Not declared: -32021 for any taskIds, even empty, malformed or oversized, and no stream.
    let many: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
    for (i, ids) in [json!([]), json!("x"), json!(many)].into_iter().enumerate() {
        let e = raw
            .ask(
                json!(format!("L{i}")),
                "subscriptions/listen",
                json!({"_meta": meta(), "notifications": {"taskIds": ids}}),
            )
            .await;
        assert_eq!(code(&e), -32021, "{e}");
    }
    // Also when rmcp cannot parse the rest of the listen: the gate comes first.
    let e = raw
        .ask(
            json!("L-bad"),
            "subscriptions/listen",
            json!({"_meta": meta(), "notifications": {"taskIds": [], "resourceSubscriptions": "memo://notes"}}),
        )
        .await;
    assert_eq!(code(&e), -32021, "{e}");
    // Declared: the shape and the cap are checked.
    for (i, ids) in [json!("x"), json!([1]), json!(many)]
        .into_iter()
        .enumerate()
    {
        let e = raw
            .ask(
                json!(format!("M{i}")),
                "subscriptions/listen",
                json!({"_meta": tmeta(), "notifications": {"taskIds": ids}}),
            )
            .await;
        assert_eq!(code(&e), -32602, "{e}");
    }
    // The ack names only the ids this caller can get.
    let t = raw
        .call(json!(1), tmeta(), "memo_wait", json!({"key": "k"}))
        .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    let ack = raw
        .ask_listen(
            "L",
            json!({"taskIds": ["nope", id, id], "resourceSubscriptions": ["memo://notes"]}),
            tmeta(),
        )
        .await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"taskIds": [id], "resourceSubscriptions": ["memo://notes"]})
    );
    // An unsubscribed task sends nothing on this stream: a second task ends, then the
    // watched one does, and the first push after the initial state is the watched one's.
    let other = raw
        .call(json!(2), tmeta(), "memo_wait", json!({"key": "other"}))
        .await;
    let other = other["result"]["taskId"].as_str().unwrap().to_owned();
    assert_eq!(raw.task_push("L").await["taskId"], id);
    raw.memo_set(3, "other", json!(1)).await;
    raw.memo_set(4, "k", json!(1)).await;
    let p = raw.task_push("L").await;
    assert_eq!(
        (p["taskId"].clone(), p["status"].clone()),
        (json!(id), json!("completed"))
    );
    assert_ne!(p["taskId"], other);
}

#[tokio::test]
async fn input_required_update_completed_and_cancelled_are_pushed_whole() {
    let mut raw = Raw::spawn(&[]);
    let t = raw
        .call(
            json!(1),
            tmeta(),
            "memo_ask",
            json!({"key": "owner", "message": "Who owns this?"}),
        )
        .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    raw.ask_listen("S", json!({"taskIds": [id]}), tmeta()).await;
    let parked = raw
        .task_push_until("S", "input_required")
        .await
        .pop()
        .unwrap();
    let req = &parked["inputRequests"]["value-of-owner"];
    assert_eq!(req["method"], "elicitation/create", "{parked}");
    assert_eq!(req["params"]["message"], "Who owns this?");
    // The push is what tasks/get says at that moment.
    let got = raw
        .ask(
            json!(2),
            "tasks/get",
            json!({"_meta": tmeta(), "taskId": id}),
        )
        .await;
    let mut got = got["result"].clone();
    got.as_object_mut().unwrap().remove("resultType");
    let mut pushed = parked.clone();
    pushed.as_object_mut().unwrap().remove("_meta");
    assert_eq!(got, pushed);

    let ack = raw
        .ask(
            json!(3),
            "tasks/update",
            json!({"_meta": tmeta(), "taskId": id, "inputResponses": {
                "value-of-owner": {"action": "accept", "content": {"value": "ana"}}}}),
        )
        .await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let rest = raw.task_push_until("S", "completed").await;
    assert_eq!(rest[0]["status"], "working", "{rest:?}");
    let done = rest.last().unwrap();
    assert_eq!(
        done["result"]["structuredContent"]["value"], "ana",
        "{done}"
    );
    let notes = raw
        .ask(
            json!(4),
            "resources/read",
            json!({"_meta": meta(), "uri": "memo://notes"}),
        )
        .await;
    assert!(notes.to_string().contains("ana"), "{notes}");

    // Cancel: the work stops and the push says cancelled.
    let t = raw
        .call(json!(5), tmeta(), "memo_wait", json!({"key": "never"}))
        .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    raw.ask_listen("C", json!({"taskIds": [id]}), tmeta()).await;
    let ack = raw
        .ask(
            json!(6),
            "tasks/cancel",
            json!({"_meta": tmeta(), "taskId": id}),
        )
        .await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let end = raw.task_push_until("C", "cancelled").await.pop().unwrap();
    assert_eq!(end["taskId"], id);
}

#[tokio::test]
async fn an_unfinished_task_reads_failed_after_a_restart() {
    let dir = TempDir::new("tasks-restart");
    let store = dir.path().join("memo.redb");
    let store = store.to_str().unwrap();
    let mut raw = Raw::spawn_args(&["--store", store, "memo"], Stdio::null());
    let t = raw
        .call(json!(1), tmeta(), "memo_wait", json!({"key": "k"}))
        .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    let mut child = raw.child;
    child.kill().await.unwrap();
    child.wait().await.unwrap();

    let mut raw = Raw::spawn_args(&["--store", store, "memo"], Stdio::null());
    let got = raw
        .ask(
            json!(2),
            "tasks/get",
            json!({"_meta": tmeta(), "taskId": id}),
        )
        .await;
    let r = &got["result"];
    assert_eq!(r["status"], "failed", "{got}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("restarted"),
        "{got}"
    );
}

/// One JSON-RPC request over HTTP; the response (SSE or JSON) as it streams.
async fn post(url: &str, method: &str, body: Value) -> reqwest::Response {
    post_as(url, None, method, body).await
}

/// [`post`] with a bearer token.
pub(crate) async fn post_as(
    url: &str,
    token: Option<&str>,
    method: &str,
    body: Value,
) -> reqwest::Response {
    let mut req = reqwest::Client::new().post(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let mut req = req
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(id) = body.pointer("/params/taskId").and_then(Value::as_str) {
        req = req.header("mcp-name", id);
    }
    if let Some(name) = body.pointer("/params/name").and_then(Value::as_str) {
        req = req.header("mcp-name", name);
    }
    tokio::time::timeout(WAIT, req.body(body.to_string()).send())
        .await
        .expect("an answer in time")
        .unwrap()
}

/// A `subscriptions/listen` of `task_ids` over HTTP as `token` (request `id`), read up to its
/// first task push: the response to read on, its buffer, the acknowledgment and that push.
pub(crate) async fn listen_tasks(
    url: &str,
    token: Option<&str>,
    id: u64,
    task_ids: Value,
) -> (reqwest::Response, String, Value, Value) {
    let mut listen = post_as(
        url,
        token,
        "subscriptions/listen",
        json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
            "params": {"_meta": tmeta(), "notifications": {"taskIds": task_ids}}}),
    )
    .await;
    let mut buf = String::new();
    let seen = messages_until(&mut listen, &mut buf, |v| {
        v["method"] == "notifications/tasks"
    })
    .await;
    let ack = seen
        .iter()
        .find(|v| v["method"] == "notifications/subscriptions/acknowledged")
        .expect("an acknowledgment first")
        .clone();
    let first = seen.last().unwrap().clone();
    (listen, buf, ack, first)
}

/// The JSON-RPC messages of an SSE or JSON body, read until `until` holds for one.
pub(crate) async fn messages_until(
    resp: &mut reqwest::Response,
    buf: &mut String,
    until: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..=end).collect();
            let data = line
                .trim()
                .strip_prefix("data:")
                .unwrap_or(line.trim())
                .trim();
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                let done = until(&v);
                seen.push(v);
                if done {
                    return seen;
                }
            }
        }
        let chunk = tokio::time::timeout(WAIT, resp.chunk())
            .await
            .expect("more of the body in time")
            .unwrap();
        match chunk {
            Some(c) => buf.push_str(&String::from_utf8_lossy(&c)),
            None => {
                buf.push('\n');
                if !buf.trim().is_empty() {
                    continue;
                }
                panic!("the body ended: {seen:?}");
            }
        }
    }
}

async fn answer(url: &str, method: &str, id: u64, params: Value) -> Value {
    answer_as(url, None, method, id, params).await
}

pub(crate) async fn answer_as(
    url: &str,
    token: Option<&str>,
    method: &str,
    id: u64,
    params: Value,
) -> Value {
    let mut resp = post_as(
        url,
        token,
        method,
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    )
    .await;
    let mut buf = String::new();
    messages_until(&mut resp, &mut buf, |v| v["id"] == id)
        .await
        .pop()
        .unwrap()
}

#[tokio::test]
async fn over_http_the_gate_the_echo_and_the_pushes_hold_too() {
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = s.http_url();
    // Not declared: -32021 and no stream.
    let e = answer(
        &url,
        "subscriptions/listen",
        1,
        json!({"_meta": meta(), "notifications": {"taskIds": []}}),
    )
    .await;
    assert_eq!(code(&e), -32021, "{e}");
    let t = answer(
        &url,
        "tools/call",
        2,
        json!({"_meta": tmeta(), "name": "memo_wait", "arguments": {"key": "k"}}),
    )
    .await;
    assert_eq!(t["result"]["resultType"], "task", "{t}");
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    let got = answer(
        &url,
        "tasks/get",
        3,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert_eq!(got["result"]["status"], "working", "{got}");

    let (mut listen, mut buf, ack, first) = listen_tasks(&url, None, 4, json!(["nope", id])).await;
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    assert_eq!(first["params"]["status"], "working");
    assert_eq!(
        first["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        4
    );

    let set = answer(
        &url,
        "tools/call",
        5,
        json!({"_meta": meta(), "name": "memo_set", "arguments": {"key": "k", "value": 2}}),
    )
    .await;
    assert!(set.get("result").is_some(), "{set}");
    let pushes = messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "completed"
    })
    .await;
    let done = pushes.last().unwrap();
    assert_eq!(
        done["params"]["result"]["structuredContent"]["value"], 2,
        "{done}"
    );
}

#[tokio::test]
async fn over_quic_input_required_and_its_answer_are_pushed_with_the_echo() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let s = Server::spawn(&["--store", ":memory:", "memo", "--quic", "127.0.0.1:0"]).await;
    let trust = herald::transport::tls::ClientTrust {
        pin: Some(s.fingerprint()),
        ..Default::default()
    };
    let (_endpoint, _conn, mut send, recv) = herald::transport::quic::connect(
        &s.quic_addr(),
        &trust,
        herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
    )
    .await
    .unwrap();
    let mut lines = BufReader::new(recv).lines();
    let mut stash: Vec<Value> = Vec::new();
    let mut write = async |v: Value| {
        send.write_all(format!("{v}\n").as_bytes()).await.unwrap();
    };
    // Reads until a message matching `until`, keeping the others in `stash` for later.
    async fn read_until(
        lines: &mut tokio::io::Lines<BufReader<quinn::RecvStream>>,
        stash: &mut Vec<Value>,
        until: impl Fn(&Value) -> bool,
    ) -> Value {
        if let Some(i) = stash.iter().position(&until) {
            return stash.remove(i);
        }
        loop {
            let l = tokio::time::timeout(WAIT, lines.next_line())
                .await
                .expect("a line in time")
                .unwrap()
                .expect("the stream is open");
            let v: Value = serde_json::from_str(&l).unwrap();
            if until(&v) {
                return v;
            }
            stash.push(v);
        }
    }
    write(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"_meta": tmeta(), "name": "memo_ask", "arguments": {"key": "q"}}}))
    .await;
    let t = read_until(&mut lines, &mut stash, |v| v["id"] == 1).await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    write(
        json!({"jsonrpc": "2.0", "id": "L", "method": "subscriptions/listen",
        "params": {"_meta": tmeta(), "notifications": {"taskIds": [id, "nope"]}}}),
    )
    .await;
    let ack = read_until(&mut lines, &mut stash, |v| {
        v["method"] == "notifications/subscriptions/acknowledged"
    })
    .await;
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let parked = read_until(&mut lines, &mut stash, |v| {
        v["method"] == "notifications/tasks" && v["params"]["status"] == "input_required"
    })
    .await;
    assert_eq!(sub_id(&parked), Some("L"));
    write(json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/update",
        "params": {"_meta": tmeta(), "taskId": id, "inputResponses": {
            "value-of-q": {"action": "accept", "content": {"value": "quic"}}}}}))
    .await;
    let done = read_until(&mut lines, &mut stash, |v| {
        v["method"] == "notifications/tasks" && v["params"]["status"] == "completed"
    })
    .await;
    assert_eq!(
        done["params"]["result"]["structuredContent"]["value"],
        "quic"
    );
}

#[tokio::test]
async fn file_checksum_answers_in_place_or_as_a_task_and_stays_under_its_root() {
    use sha2::{Digest as _, Sha256};
    let dir = TempDir::new("tasks-checksum");
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::write(root.join("a.txt"), "one").unwrap();
    std::fs::write(root.join("a/x"), "two").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    let root = std::fs::canonicalize(&root).unwrap();
    let hex = |b: &[u8]| hex::encode(Sha256::digest(b));
    // What `(cd root && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs sha256sum) |
    // sha256sum` prints: "a.txt" sorts before "a/x".
    let listing = format!("{}  a.txt\n{}  a/x\n", hex(b"one"), hex(b"two"));
    let tree = hex(listing.as_bytes());

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
    let plain = raw
        .call(json!(1), meta(), "file_checksum", json!({"path": root}))
        .await;
    let r = &plain["result"]["structuredContent"];
    assert_eq!(r["sha256"], tree, "{plain}");
    assert_eq!(
        (r["files"].clone(), r["skipped"].clone()),
        (json!(2), json!(1))
    );
    let one = raw
        .call(
            json!(2),
            meta(),
            "file_checksum",
            json!({"path": root.join("a.txt")}),
        )
        .await;
    assert_eq!(one["result"]["structuredContent"]["sha256"], hex(b"one"));
    let outside = raw
        .call(json!(3), meta(), "file_checksum", json!({"path": "/etc"}))
        .await;
    assert_eq!(code(&outside), -32602, "{outside}");

    let t = raw
        .call(json!(4), tmeta(), "file_checksum", json!({"path": root}))
        .await;
    let id = t["result"]["taskId"].as_str().expect("a task").to_owned();
    raw.ask_listen("F", json!({"taskIds": [id]}), tmeta()).await;
    let done = raw.task_push_until("F", "completed").await.pop().unwrap();
    assert_eq!(
        done["result"]["structuredContent"]["sha256"], tree,
        "{done}"
    );
}

#[tokio::test]
async fn kubectl_wait_as_a_task_ends_when_the_condition_holds_and_cancel_kills_kubectl() {
    let setup = crate::k8s::setup(&[]).await;
    let (api, s) = (&setup.api, &setup.k8s);
    let url = s.http_url();
    api.put("", "w", "flag", json!({"ready": "no"}));
    let wait = |name: &str, cond: &str| {
        json!({"_meta": tmeta(), "name": "kubectl_wait", "arguments": {
            "resource": "configmaps", "name": name, "namespace": "w", "for": cond, "timeout_s": 120}})
    };
    let t = answer(
        &url,
        "tools/call",
        1,
        wait("flag", "jsonpath={.data.ready}=yes"),
    )
    .await;
    let id = t["result"]["taskId"].as_str().expect("a task").to_owned();
    let mut listen = post(
        &url,
        "subscriptions/listen",
        json!({"jsonrpc": "2.0", "id": 2, "method": "subscriptions/listen",
            "params": {"_meta": tmeta(), "notifications": {"taskIds": [id]}}}),
    )
    .await;
    let mut buf = String::new();
    messages_until(&mut listen, &mut buf, |v| {
        v["method"] == "notifications/tasks"
    })
    .await;
    api.wait("kubectl wait's watch", |a| a.watches() >= 1).await;
    api.put("", "w", "flag", json!({"ready": "yes"}));
    let done = messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "completed"
    })
    .await
    .pop()
    .unwrap();
    assert_eq!(
        done["params"]["result"]["structuredContent"]["done"], true,
        "{done}"
    );
    api.wait("kubectl wait gone", |a| a.watches() == 0).await;

    // Cancelled: kubectl is killed (its watch goes away) and the task reads cancelled.
    let t = answer(&url, "tools/call", 3, wait("flag", "delete")).await;
    let id = t["result"]["taskId"].as_str().expect("a task").to_owned();
    api.wait("the second kubectl wait's watch", |a| a.watches() >= 1)
        .await;
    let c = answer(
        &url,
        "tasks/cancel",
        4,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert_eq!(c["result"]["resultType"], "complete", "{c}");
    api.wait("kubectl killed", |a| a.watches() == 0).await;
    let got = answer(
        &url,
        "tasks/get",
        5,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");

    // rollout status of something that has no rollout: kubectl's own answer, as a tool error.
    let r = answer(
        &url,
        "tools/call",
        6,
        json!({"_meta": meta(), "name": "rollout_status",
        "arguments": {"resource": "configmaps", "name": "flag", "namespace": "w", "timeout_s": 5}}),
    )
    .await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(r["result"]["structuredContent"]["done"], false, "{r}");
}

#[tokio::test]
async fn herald_call_task_follows_a_task_and_herald_task_gets_and_cancels() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = s.http_url();
    let mut child = tokio::process::Command::new(bin())
        .args([
            "call",
            "--task",
            "--json",
            "memo_wait",
            "key=k",
            "--mcp-http",
            &url,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, out.next_line())
        .await
        .unwrap()
        .unwrap()
        .expect("the task, first");
    let created: Value = serde_json::from_str(&line).unwrap();
    let id = created["taskId"].as_str().unwrap().to_owned();
    // Its state at registration, then the end once the note changes.
    let line = tokio::time::timeout(WAIT, out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&line).unwrap()["status"],
        "working"
    );
    let c = crate::watch::memo_client(&url).await;
    call(&c, "memo_set", json!({"key": "k", "value": "v"})).await;
    let mut last = Value::Null;
    while let Ok(Some(l)) = tokio::time::timeout(WAIT, out.next_line()).await.unwrap() {
        last = serde_json::from_str(&l).unwrap();
    }
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(last["result"]["structuredContent"]["value"], "v");
    assert!(child.wait().await.unwrap().success());

    let got = herald(["task", "get", &id, "--json", "--mcp-http", &url]).await;
    assert!(got.status.success(), "{got:?}");
    let got: Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(got["status"], "completed");

    // Cancel another one from the command line.
    let t = answer(
        &url,
        "tools/call",
        1,
        json!({"_meta": tmeta(), "name": "memo_wait", "arguments": {"key": "never"}}),
    )
    .await;
    let other = t["result"]["taskId"].as_str().unwrap().to_owned();
    let out = herald(["task", "cancel", &other, "--mcp-http", &url]).await;
    assert!(out.status.success(), "{out:?}");
    // Cancel is acknowledged first and takes effect right after: ask until it shows.
    let mut got = Value::Null;
    for _ in 0..20 {
        let out = herald(["task", "get", &other, "--json", "--mcp-http", &url]).await;
        got = serde_json::from_slice(&out.stdout).unwrap();
        if got["status"] == "cancelled" {
            break;
        }
    }
    assert_eq!(got["status"], "cancelled", "{got}");
    // An unknown id: a clear error, exit non-zero.
    let out = herald(["task", "get", "nope", "--mcp-http", &url]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown, expired or not yours"),
        "{out:?}"
    );
}

/// The gateway relays tasks: a task-augmented `slug__tool` call makes the task on that slug,
/// shown as `slug__<id>`; tasks/get, tasks/update and tasks/cancel reach it for the caller
/// that started it (another slug's caller gets -32024, another caller of the same slug
/// -32602), and a listen's taskIds are relayed: the ack echoes only this caller's ids, and
/// every push comes through under the gateway's id and the stream's subscription id.
#[tokio::test]
async fn the_gateway_relays_tasks_namespaced_per_slug_and_entitled() {
    use sha2::Digest;
    let sha = |t: &str| hex::encode(sha2::Sha256::digest(t.as_bytes()));
    let (all, only_c, also_a) = ("tok-all-5b1e", "tok-c-77d0", "tok-a-e2c4");
    let a = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let dir = TempDir::new("gateway-tasks");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"a\"\nhttp = \"{}\"\n\
             [[slug]]\nname = \"c\"\nstdio = \"{} --store :memory: memo\"\n\
             [[token]]\nname = \"all\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n\
             [[token]]\nname = \"only-c\"\nsha256 = \"{}\"\nslugs = [\"c\"]\n\
             [[token]]\nname = \"also-a\"\nsha256 = \"{}\"\nslugs = [\"a\"]\n",
            a.http_url(),
            bin(),
            sha(all),
            sha(only_c),
            sha(also_a),
        ),
    )
    .unwrap();
    let gw = http_gateway_server(&cfg).await;
    let url = gw.http_url();
    let ask = |token: &'static str, method: &'static str, id: u64, params: Value| {
        let url = url.clone();
        async move { answer_as(&url, Some(token), method, id, params).await }
    };

    // The listing keeps each tool's task support.
    let tools = ask(all, "tools/list", 1, json!({"_meta": tmeta()})).await;
    let support = |name: &str| {
        tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["_meta"]["io.modelcontextprotocol/tasks"]["taskSupport"].clone())
    };
    assert_eq!(support("a__memo_wait"), Some(json!("optional")), "{tools}");
    assert_eq!(support("c__memo_ask"), Some(json!("required")), "{tools}");

    // Without the extension: a plain call, answered in place.
    let plain = ask(
        all,
        "tools/call",
        2,
        json!({"_meta": meta(), "name": "a__memo_wait", "arguments": {"key": "k", "timeout_ms": 1}}),
    )
    .await;
    assert_eq!(
        plain["result"]["structuredContent"]["changed"], false,
        "{plain}"
    );
    // With it: a task on slug a, under the gateway's id.
    let t = ask(
        all,
        "tools/call",
        3,
        json!({"_meta": tmeta(), "name": "a__memo_wait", "arguments": {"key": "k"}}),
    )
    .await;
    assert_eq!(t["result"]["resultType"], "task", "{t}");
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("a__"), "{id}");
    let got = ask(all, "tasks/get", 4, json!({"_meta": tmeta(), "taskId": id})).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(got["result"]["taskId"], id.as_str());

    // A caller not entitled to slug a: -32024, the same as for a slug that does not exist.
    let foreign = ask(
        only_c,
        "tasks/get",
        5,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    let nowhere = ask(
        only_c,
        "tasks/get",
        6,
        json!({"_meta": tmeta(), "taskId": "zz__0123"}),
    )
    .await;
    assert_eq!(code(&foreign), -32024, "{foreign}");
    assert_eq!(foreign["error"]["message"], nowhere["error"]["message"]);
    // A task-only tool on a slug the caller may not use: the one refusal, not the -32021
    // that would tell the tool exists.
    let hidden = ask(
        only_c,
        "tools/call",
        50,
        json!({"_meta": meta(), "name": "a__memo_ask", "arguments": {"key": "x"}}),
    )
    .await;
    assert_eq!(code(&hidden), -32024, "{hidden}");
    // Another caller of slug a: as if the task did not exist.
    let other = ask(
        also_a,
        "tasks/get",
        7,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert_eq!(code(&other), -32602, "{other}");
    let cancel = ask(
        also_a,
        "tasks/cancel",
        8,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert_eq!(code(&cancel), -32602, "{cancel}");

    // A listen: the ack echoes only this caller's ids; the state comes first, then the end.
    let (mut listen, mut buf, ack, first) =
        listen_tasks(&url, Some(all), 9, json!([id, "a__nope", "c__x"])).await;
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let first = &first["params"];
    assert_eq!(first["status"], "working", "{first}");
    assert_eq!(first["taskId"], id.as_str());
    assert_eq!(first["_meta"]["io.modelcontextprotocol/subscriptionId"], 9);
    // Set the note once the wait has taken its value (its status says so).
    if first["statusMessage"] != "waiting for k to change" {
        messages_until(&mut listen, &mut buf, |v| {
            v["params"]["statusMessage"] == "waiting for k to change"
        })
        .await;
    }
    let set = ask(
        all,
        "tools/call",
        10,
        json!({"_meta": meta(), "name": "a__memo_set", "arguments": {"key": "k", "value": 7}}),
    )
    .await;
    assert!(set.get("result").is_some(), "{set}");
    let pushes = messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "completed"
    })
    .await;
    let done = &pushes.last().unwrap()["params"];
    assert_eq!(done["taskId"], id.as_str(), "{done}");
    assert_eq!(done["result"]["structuredContent"]["value"], 7, "{done}");
    assert_eq!(done["_meta"]["io.modelcontextprotocol/subscriptionId"], 9);

    // input_required on the stdio slug, answered through the gateway.
    let t = ask(
        all,
        "tools/call",
        11,
        json!({"_meta": tmeta(), "name": "c__memo_ask", "arguments": {"key": "owner"}}),
    )
    .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("c__"), "{t}");
    let mut listen = post_as(
        &url,
        Some(all),
        "subscriptions/listen",
        json!({"jsonrpc": "2.0", "id": 12, "method": "subscriptions/listen",
            "params": {"_meta": tmeta(), "notifications": {"taskIds": [id]}}}),
    )
    .await;
    let mut buf = String::new();
    let parked = messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "input_required"
    })
    .await;
    let parked = &parked.last().unwrap()["params"];
    assert!(
        parked["inputRequests"]["value-of-owner"].is_object(),
        "{parked}"
    );
    let upd = ask(
        all,
        "tasks/update",
        13,
        json!({"_meta": tmeta(), "taskId": id, "inputResponses": {
            "value-of-owner": {"action": "accept", "content": {"value": "ana"}}}}),
    )
    .await;
    assert!(upd.get("result").is_some(), "{upd}");
    let pushes = messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "completed"
    })
    .await;
    let done = &pushes.last().unwrap()["params"];
    assert_eq!(
        done["result"]["structuredContent"]["value"], "ana",
        "{done}"
    );

    // Cancel through the gateway reaches the slug's work.
    let t = ask(
        all,
        "tools/call",
        14,
        json!({"_meta": tmeta(), "name": "a__memo_wait", "arguments": {"key": "never"}}),
    )
    .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    let mut listen = post_as(
        &url,
        Some(all),
        "subscriptions/listen",
        json!({"jsonrpc": "2.0", "id": 15, "method": "subscriptions/listen",
            "params": {"_meta": tmeta(), "notifications": {"taskIds": [id]}}}),
    )
    .await;
    let mut buf = String::new();
    messages_until(&mut listen, &mut buf, |v| {
        v["method"] == "notifications/tasks"
    })
    .await;
    let c = ask(
        all,
        "tasks/cancel",
        16,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert!(c.get("result").is_some(), "{c}");
    let end = messages_until(&mut listen, &mut buf, |v| {
        v["params"]["status"] == "cancelled"
    })
    .await;
    assert_eq!(end.last().unwrap()["params"]["taskId"], id.as_str());
    let got = ask(
        all,
        "tasks/get",
        17,
        json!({"_meta": tmeta(), "taskId": id}),
    )
    .await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
}

/// A task followed through the gateway holds one upstream listen only while someone watches
/// it: 80 listens opened and cancelled one after another on the same task (past the 64 an
/// upstream connection allows) all get its state, and a URI listen still gets in after them.
#[tokio::test]
async fn a_followed_task_frees_its_upstream_listen_when_nobody_watches_it() {
    // A stdio slug: one connection, which allows 64 listen streams.
    let dir = TempDir::new("gateway-task-listens");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"a\"\nstdio = \"{} --store :memory: memo\"\n",
            bin()
        ),
    )
    .unwrap();
    let mut raw = Raw::spawn_args(
        &[
            "--store",
            ":memory:",
            "gateway",
            "--config",
            cfg.to_str().unwrap(),
        ],
        Stdio::null(),
    );
    let t = raw
        .call(
            json!(1),
            tmeta(),
            "a__memo_wait",
            json!({"key": "k", "timeout_ms": 3_600_000}),
        )
        .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    for round in 0..80 {
        let sub = format!("L{round}");
        let ack = raw
            .ask_listen(&sub, json!({"taskIds": [id]}), tmeta())
            .await;
        assert_eq!(
            ack["params"]["notifications"]["taskIds"],
            json!([id]),
            "{ack}"
        );
        let state = raw.task_push(&sub).await;
        assert_eq!(state["status"], "working", "round {round}: {state}");
        raw.send(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": sub}}),
        )
        .await;
    }
    let ack = raw.listen("U", &["memo://notes"]).await;
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!(["memo://notes"]),
        "{ack}"
    );
}

/// `herald watch --watch t=task:ID`: a notice per status change, the result in the last, and
/// then herald exits by itself (its only watch has ended).
#[tokio::test]
async fn herald_watch_on_a_task_prints_each_status_and_ends() {
    let s = Server::spawn(&["--store", ":memory:", "memo", "--http", "127.0.0.1:0"]).await;
    let url = s.http_url();
    let t = answer(
        &url,
        "tools/call",
        1,
        json!({"_meta": tmeta(), "name": "memo_wait", "arguments": {"key": "k"}}),
    )
    .await;
    let id = t["result"]["taskId"].as_str().unwrap().to_owned();
    let mut w = crate::watch::Watch::spawn(
        ":memory:",
        &["--mcp-http", &url, "--watch", &format!("t=task:{id}")],
    );
    // Its state at the start, then the wait's status once it waits.
    loop {
        let n = w.notice().await.to_string();
        assert!(n.contains(&format!("task {id} working")), "{n}");
        if n.contains("waiting for k to change") {
            break;
        }
    }
    let set = answer(
        &url,
        "tools/call",
        2,
        json!({"_meta": meta(), "name": "memo_set", "arguments": {"key": "k", "value": 5}}),
    )
    .await;
    assert!(set.get("result").is_some(), "{set}");
    let end = w.notice().await.to_string();
    assert!(end.contains(&format!("task {id} completed")), "{end}");
    assert!(end.contains(r#"\"value\":5"#), "{end}");
    let status = w.exited().await;
    assert!(status.success(), "{status}");

    // A task no server knows: herald watch says so and exits 1.
    let out = tokio::process::Command::new(bin())
        .args([
            "--store",
            ":memory:",
            "watch",
            "--mcp-http",
            &url,
            "--watch",
            "t=task:nope",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no server knows task nope"), "{err}");
}
