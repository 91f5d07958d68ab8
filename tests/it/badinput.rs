//! The bad-input catalogue (issue 17): one table of inputs a careless or hostile client sends,
//! run over stdio, QUIC and HTTP (and a gateway's token gate on HTTP), each answered with the
//! exact JSON-RPC error code (and on HTTP the exact status); after the table, on the same
//! server (and on stdio and QUIC the same connection), a listen held through it all is still
//! notified and ordinary calls still succeed.
//!
//! Every server runs with `--max-message-bytes 4096 --max-listen-uris 3
//! --max-listen-streams 1` and holds one listen on `memo://notes` before the table, so the
//! limits are reachable with small inputs.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::support::*;

/// One bad input and the answer it must get.
struct Case {
    name: &'static str,
    body: Vec<u8>,
    /// The JSON-RPC error code.
    code: i64,
    /// The HTTP status; `0`: not sent over HTTP (see the case's comment for why).
    status: u16,
    /// Sent over the line transports (stdio and QUIC) too.
    lines: bool,
    /// HTTP headers replacing the defaults [`http_headers`] derives from the body; `None`
    /// leaves the header out.
    headers: &'static [(&'static str, Option<&'static str>)],
    /// A JSON pointer into the error object and the value it must hold.
    data: Option<(&'static str, Value)>,
}

const MAX_MESSAGE: usize = 4096;
const LIMITS: [&str; 6] = [
    "--max-message-bytes",
    "4096",
    "--max-listen-uris",
    "3",
    "--max-listen-streams",
    "1",
];

fn c(name: &'static str, body: Vec<u8>, code: i64, status: u16, lines: bool) -> Case {
    Case {
        name,
        body,
        code,
        status,
        lines,
        headers: &[],
        data: None,
    }
}

/// A JSON-RPC request with `id`, `method` and `params` as given.
fn rq(id: u64, method: &str, params: Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        .to_string()
        .into_bytes()
}

/// `params` with the request `_meta` added.
fn p(mut params: Value) -> Value {
    params["_meta"] = meta();
    params
}

fn raw(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn listen(id: u64, notifications: Value) -> Vec<u8> {
    rq(
        id,
        "subscriptions/listen",
        p(json!({"notifications": notifications})),
    )
}

fn memo_set(id: u64, arguments: Value) -> Vec<u8> {
    rq(
        id,
        "tools/call",
        p(json!({"name": "memo_set", "arguments": arguments})),
    )
}

/// The catalogue.
fn catalogue() -> Vec<Case> {
    let m = meta();
    let deep_arrays = "[".repeat(200) + &"]".repeat(200);
    let deep_objects = r#"{"a":"#.repeat(200) + "1" + &"}".repeat(200);
    let oversized = rq(
        90,
        "tools/list",
        p(json!({"pad": "x".repeat(MAX_MESSAGE + 100)})),
    );
    vec![
        // Not JSON at all: -32700 (parse error).
        c("not JSON", raw("{oops"), -32700, 400, true),
        c("plain words", raw("hello"), -32700, 400, true),
        c(
            "truncated",
            raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#),
            -32700,
            400,
            true,
        ),
        c(
            "an unterminated string",
            raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/li"#),
            -32700,
            400,
            true,
        ),
        c(
            "a trailing comma",
            raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list",}"#),
            -32700,
            400,
            true,
        ),
        c(
            "two messages in one",
            raw(concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#
            )),
            -32700,
            400,
            true,
        ),
        c(
            "arrays nested 200 deep",
            deep_arrays.into_bytes(),
            -32700,
            400,
            true,
        ),
        c(
            "objects nested 200 deep",
            deep_objects.into_bytes(),
            -32700,
            400,
            true,
        ),
        c(
            "invalid UTF-8 in a string",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}".to_vec(),
            -32700,
            400,
            true,
        ),
        c(
            "invalid UTF-8 alone",
            b"\xff\xfe\xfd".to_vec(),
            -32700,
            400,
            true,
        ),
        // An empty line on a line transport is skipped (nothing to answer); on HTTP an empty
        // body is a request with nothing in it.
        c("an empty body", Vec::new(), -32700, 400, false),
        c("a body of blanks", raw(" \t "), -32700, 400, false),
        // JSON, but not one JSON-RPC request: -32600 (invalid request).
        c("an empty object", raw("{}"), -32600, 400, true),
        c(
            "a batch",
            format!(
                "[{}]",
                String::from_utf8(rq(2, "tools/list", p(json!({})))).unwrap()
            )
            .into_bytes(),
            -32600,
            400,
            true,
        ),
        c("an empty batch", raw("[]"), -32600, 400, true),
        c("a string", raw(r#""tools/list""#), -32600, 400, true),
        c("a number", raw("42"), -32600, 400, true),
        c("null", raw("null"), -32600, 400, true),
        c("a boolean", raw("true"), -32600, 400, true),
        c(
            "id null",
            json_bytes(
                json!({"jsonrpc":"2.0","id":null,"method":"tools/list","params":{"_meta":m}}),
            ),
            -32600,
            400,
            true,
        ),
        c(
            "id an object",
            json_bytes(
                json!({"jsonrpc":"2.0","id":{"a":1},"method":"tools/list","params":{"_meta":m}}),
            ),
            -32600,
            400,
            true,
        ),
        c(
            "id an array",
            json_bytes(
                json!({"jsonrpc":"2.0","id":[3],"method":"tools/list","params":{"_meta":m}}),
            ),
            -32600,
            400,
            true,
        ),
        c(
            "id a boolean",
            json_bytes(
                json!({"jsonrpc":"2.0","id":true,"method":"tools/list","params":{"_meta":m}}),
            ),
            -32600,
            400,
            true,
        ),
        c(
            "id a fraction",
            json_bytes(
                json!({"jsonrpc":"2.0","id":1.5,"method":"tools/list","params":{"_meta":m}}),
            ),
            -32600,
            400,
            true,
        ),
        c(
            "method a number",
            json_bytes(json!({"jsonrpc":"2.0","id":4,"method":5})),
            -32600,
            400,
            true,
        ),
        c(
            "method null",
            json_bytes(json!({"jsonrpc":"2.0","id":5,"method":null,"params":{"_meta":m}})),
            -32600,
            400,
            true,
        ),
        c(
            "method an object",
            json_bytes(json!({"jsonrpc":"2.0","id":6,"method":{"name":"tools/list"}})),
            -32600,
            400,
            true,
        ),
        c(
            "no jsonrpc",
            json_bytes(json!({"id":7,"method":"tools/list","params":{"_meta":m}})),
            -32600,
            400,
            true,
        ),
        c(
            "jsonrpc 1.0",
            json_bytes(json!({"jsonrpc":"1.0","id":8,"method":"tools/list","params":{"_meta":m}})),
            -32600,
            400,
            true,
        ),
        c(
            "jsonrpc a number",
            json_bytes(json!({"jsonrpc":2.0,"id":9,"method":"tools/list","params":{"_meta":m}})),
            -32600,
            400,
            true,
        ),
        c(
            "both method and result",
            raw(r#"{"jsonrpc":"2.0","id":10,"result":5,"method":3}"#),
            -32600,
            400,
            true,
        ),
        c(
            "neither method nor result",
            raw(r#"{"jsonrpc":"2.0","id":11}"#),
            -32600,
            400,
            true,
        ),
        // JSON-RPC's params is a structured value, MCP's an object: anything else is not a
        // request at all (-32600), on every transport.
        c(
            "params a string",
            rq(12, "tools/list", json!("x")),
            -32600,
            400,
            true,
        ),
        c(
            "params an array",
            rq(13, "tools/list", json!([m])),
            -32600,
            400,
            true,
        ),
        c(
            "params a number",
            rq(14, "tools/list", json!(5)),
            -32600,
            400,
            true,
        ),
        c("over --max-message-bytes", oversized, -32600, 413, true),
        // A second listen while one is held (--max-listen-streams 1).
        Case {
            data: Some(("/data/limit", json!(1))),
            ..c(
                "a listen over the stream limit",
                listen(15, json!({"resourceSubscriptions": ["memo://log"]})),
                -32600,
                200,
                true,
            )
        },
        // Unknown methods: -32601 (404 on HTTP).
        c(
            "an unknown method",
            rq(16, "nope/nope", p(json!({}))),
            -32601,
            404,
            true,
        ),
        c(
            "a method in capitals",
            rq(17, "TOOLS/LIST", p(json!({}))),
            -32601,
            404,
            true,
        ),
        // Bad params of a known method: -32602.
        c(
            "no params",
            raw(r#"{"jsonrpc":"2.0","id":18,"method":"tools/list"}"#),
            -32602,
            400,
            true,
        ),
        c(
            "no _meta",
            rq(19, "tools/list", json!({})),
            -32602,
            400,
            true,
        ),
        c(
            "an empty _meta",
            rq(20, "tools/list", json!({"_meta": {}})),
            -32602,
            400,
            true,
        ),
        c(
            "_meta without clientCapabilities",
            rq(
                21,
                "tools/list",
                json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
            ),
            -32602,
            400,
            true,
        ),
        c(
            "_meta a string",
            rq(22, "tools/list", json!({"_meta": "x"})),
            -32602,
            400,
            true,
        ),
        c(
            "_meta an array",
            rq(23, "tools/list", json!({"_meta": [m]})),
            -32602,
            400,
            true,
        ),
        c(
            "tools/call arguments a string",
            rq(
                24,
                "tools/call",
                p(json!({"name": "memo_set", "arguments": "x"})),
            ),
            -32602,
            200,
            true,
        ),
        c(
            "tools/call arguments an array",
            rq(
                25,
                "tools/call",
                p(json!({"name": "memo_set", "arguments": ["k", 1]})),
            ),
            -32602,
            200,
            true,
        ),
        c(
            "tools/call with no name",
            rq(26, "tools/call", p(json!({"arguments": {}}))),
            -32602,
            200,
            true,
        ),
        c(
            "tools/call name a number",
            rq(27, "tools/call", p(json!({"name": 5, "arguments": {}}))),
            -32602,
            200,
            true,
        ),
        c(
            "an unknown tool",
            rq(
                28,
                "tools/call",
                p(json!({"name": "no_such_tool", "arguments": {}})),
            ),
            -32602,
            200,
            true,
        ),
        c(
            "memo_set with no key",
            memo_set(29, json!({"value": 1})),
            -32602,
            200,
            true,
        ),
        c(
            "memo_set key a number",
            memo_set(30, json!({"key": 5, "value": 1})),
            -32602,
            200,
            true,
        ),
        c(
            "memo_set an empty key",
            memo_set(31, json!({"key": "", "value": 1})),
            -32602,
            200,
            true,
        ),
        c(
            "memo_set with no value",
            memo_set(32, json!({"key": "k"})),
            -32602,
            200,
            true,
        ),
        c(
            "memo_set an unknown argument",
            memo_set(33, json!({"key": "k", "value": 1, "extra": 2})),
            -32602,
            200,
            true,
        ),
        c(
            "resources/read with no uri",
            rq(34, "resources/read", p(json!({}))),
            -32602,
            200,
            true,
        ),
        c(
            "resources/read uri a number",
            rq(35, "resources/read", p(json!({"uri": 5}))),
            -32602,
            200,
            true,
        ),
        Case {
            data: Some(("/data/uri", json!("memo://nope"))),
            ..c(
                "an unknown memo URI",
                rq(36, "resources/read", p(json!({"uri": "memo://nope"}))),
                -32602,
                200,
                true,
            )
        },
        Case {
            data: Some(("/data/uri", json!("file:///etc/passwd"))),
            ..c(
                "a URI of another scheme",
                rq(
                    37,
                    "resources/read",
                    p(json!({"uri": "file:///etc/passwd"})),
                ),
                -32602,
                200,
                true,
            )
        },
        c(
            "a listen with no notifications",
            rq(38, "subscriptions/listen", p(json!({}))),
            -32602,
            200,
            true,
        ),
        c(
            "a listen with notifications 5",
            listen(39, json!(5)),
            -32602,
            200,
            true,
        ),
        c(
            "a listen whose resourceSubscriptions is a string",
            listen(40, json!({"resourceSubscriptions": "memo://notes"})),
            -32602,
            200,
            true,
        ),
        c(
            "a listen whose resourceSubscriptions are numbers",
            listen(41, json!({"resourceSubscriptions": [1, 2]})),
            -32602,
            200,
            true,
        ),
        Case {
            data: Some(("/data/requested", json!(4))),
            ..c(
                "a listen over the URI limit",
                listen(
                    42,
                    json!({"resourceSubscriptions":
                        ["memo://notes", "memo://log", "memo://a", "memo://b"]}),
                ),
                -32602,
                200,
                true,
            )
        },
        c(
            "events/poll with a foreign cursor",
            rq(
                43,
                "events/poll",
                p(json!({"name": "memo.changed", "arguments": {}, "cursor": "zzz"})),
            ),
            -32602,
            200,
            true,
        ),
        c(
            "events/poll with no name",
            rq(44, "events/poll", p(json!({"cursor": null}))),
            -32602,
            200,
            true,
        ),
        c(
            "events/poll name a number",
            rq(45, "events/poll", p(json!({"name": 5, "cursor": null}))),
            -32602,
            200,
            true,
        ),
        c(
            "events/poll an unknown argument",
            rq(
                46,
                "events/poll",
                p(json!({"name": "memo.changed", "arguments": {"x": 1}, "cursor": null})),
            ),
            -32602,
            200,
            true,
        ),
        // The protocol's own errors.
        c(
            "events/poll an unknown event",
            rq(
                47,
                "events/poll",
                p(json!({"name": "nope", "arguments": {}, "cursor": null})),
            ),
            -32023,
            200,
            true,
        ),
        // 400 as rmcp answers -32021 (issue 28: the HTTP listen gate said 200).
        c(
            "a listen naming taskIds without the tasks extension",
            listen(48, json!({"taskIds": ["t1"]})),
            -32021,
            400,
            true,
        ),
        c(
            "tasks/get without the tasks extension",
            rq(49, "tasks/get", p(json!({"taskId": "t1"}))),
            -32021,
            400,
            true,
        ),
        Case {
            headers: &[("mcp-protocol-version", Some("1999-01-01"))],
            ..c(
                "an unsupported protocol version",
                rq(
                    50,
                    "tools/list",
                    json!({"_meta": {
                        "io.modelcontextprotocol/protocolVersion": "1999-01-01",
                        "io.modelcontextprotocol/clientCapabilities": {}}}),
                ),
                -32022,
                400,
                true,
            )
        },
        // HTTP's headers must agree with the body: -32020 with 400.
        Case {
            headers: &[("mcp-method", Some("resources/list"))],
            ..c(
                "Mcp-Method naming another method",
                rq(51, "tools/list", p(json!({}))),
                -32020,
                400,
                false,
            )
        },
        Case {
            headers: &[("mcp-method", None)],
            ..c(
                "no Mcp-Method",
                rq(52, "tools/list", p(json!({}))),
                -32020,
                400,
                false,
            )
        },
        Case {
            headers: &[("mcp-name", None)],
            ..c(
                "no Mcp-Name on tools/call",
                memo_set(53, json!({"key": "k", "value": 1})),
                -32020,
                400,
                false,
            )
        },
        Case {
            headers: &[("mcp-name", Some("memo_delete"))],
            ..c(
                "Mcp-Name naming another tool",
                memo_set(54, json!({"key": "k", "value": 1})),
                -32020,
                400,
                false,
            )
        },
        Case {
            headers: &[("mcp-name", None)],
            ..c(
                "no Mcp-Name on resources/read",
                rq(55, "resources/read", p(json!({"uri": "memo://notes"}))),
                -32020,
                400,
                false,
            )
        },
        Case {
            headers: &[("mcp-protocol-version", Some("2025-11-25"))],
            ..c(
                "MCP-Protocol-Version disagreeing with _meta",
                rq(56, "tools/list", p(json!({}))),
                -32020,
                400,
                false,
            )
        },
    ]
}

/// A gateway's token gate (HTTP): a missing or unknown token is refused with `401`, a
/// `WWW-Authenticate: Bearer` challenge and `-32024` before anything of the request is read.
fn gateway_catalogue() -> Vec<Case> {
    let list = rq(60, "tools/list", p(json!({})));
    let set = rq(
        61,
        "tools/call",
        p(json!({"name": "m__memo_set", "arguments": {"key": "x", "value": 1}})),
    );
    vec![
        c("no token", list.clone(), -32024, 401, false),
        Case {
            headers: &[("authorization", Some("Bearer not-a-token"))],
            ..c("an unknown token", list.clone(), -32024, 401, false)
        },
        Case {
            headers: &[("authorization", Some("Bearer not-a-token"))],
            ..c(
                "an unknown token on tools/call",
                set.clone(),
                -32024,
                401,
                false,
            )
        },
        Case {
            headers: &[("authorization", Some("Bearer"))],
            ..c("an empty Bearer", list.clone(), -32024, 401, false)
        },
        Case {
            headers: &[("authorization", Some("Basic Z29vZDp0b2tlbg=="))],
            ..c("Basic credentials", list.clone(), -32024, 401, false)
        },
        c("no token on tools/call", set, -32024, 401, false),
        c(
            "no token and a malformed body",
            raw("{oops"),
            -32024,
            401,
            false,
        ),
        Case {
            headers: &[("content-type", Some("text/plain"))],
            ..c("no token and a text body", list, -32024, 401, false)
        },
    ]
}

fn json_bytes(v: Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// A listen on `memo://notes` with id `held`, held open through the table.
fn held_listen() -> Vec<u8> {
    json_bytes(
        json!({"jsonrpc": "2.0", "id": "held", "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": ["memo://notes"]}}}),
    )
}

fn sub_id(v: &Value) -> Option<&str> {
    v.pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
        .and_then(Value::as_str)
}

/// Checks one answer (the error object's code and data) against its case.
fn check_error(via: &str, case: &Case, sent: &[u8], answer: &Value) {
    let what = format!("{via}: {}", case.name);
    assert_eq!(
        answer["error"]["code"], case.code,
        "{what}: the code\n{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: a message\n{answer}"
    );
    assert!(answer.get("result").is_none(), "{what}: {answer}");
    // The answer is to this request (or to an unknown one): never another request's.
    if let Ok(v) = serde_json::from_slice::<Value>(sent)
        && let Some(id) = v.get("id").filter(|i| i.is_string() || i.is_u64())
    {
        assert!(
            answer["id"].is_null() || answer["id"] == *id,
            "{what}: answered as another request\n{answer}"
        );
    }
    if let Some((pointer, want)) = &case.data {
        assert_eq!(
            answer["error"].pointer(pointer),
            Some(want),
            "{what}: {pointer}\n{answer}"
        );
    }
}

/// One JSON-RPC connection over a line-framed byte stream (stdio or a QUIC stream).
struct LineConn {
    write: Box<dyn AsyncWrite + Unpin + Send>,
    lines: tokio::io::Lines<BufReader<Box<dyn AsyncRead + Unpin + Send>>>,
    /// What keeps the connection up (the child process, the QUIC endpoint).
    _keep: Box<dyn Send>,
}

impl LineConn {
    async fn send(&mut self, bytes: &[u8]) {
        let mut frame = bytes.to_vec();
        frame.push(b'\n');
        tokio::time::timeout(WAIT, async {
            self.write.write_all(&frame).await.unwrap();
            self.write.flush().await.unwrap();
        })
        .await
        .expect("written in time");
    }

    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("an answer in time")
            .expect("a readable line")
            .expect("the server still serving");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"))
    }

    /// Sends `body` and reads until the answer to `id`, returning everything read.
    async fn request(&mut self, body: Value) -> (Value, Vec<Value>) {
        let id = body["id"].clone();
        self.send(body.to_string().as_bytes()).await;
        let mut others = Vec::new();
        loop {
            let v = self.recv().await;
            if v["id"] == id && v.get("method").is_none() {
                return (v, others);
            }
            others.push(v);
        }
    }
}

/// Runs the catalogue's line cases on `conn`, then the ordinary calls. Returns how many
/// cases ran.
async fn run_lines(via: &str, mut conn: LineConn) -> usize {
    // The held listen: acknowledged, then quiet until a note changes.
    conn.send(&held_listen()).await;
    let ack = conn.recv().await;
    assert_eq!(
        (ack["method"].as_str(), sub_id(&ack)),
        (
            Some("notifications/subscriptions/acknowledged"),
            Some("held")
        ),
        "{via}: {ack}"
    );
    let cases: Vec<Case> = catalogue().into_iter().filter(|c| c.lines).collect();
    for case in &cases {
        conn.send(&case.body).await;
        let answer = conn.recv().await;
        check_error(via, case, &case.body, &answer);
    }
    // The same connection still serves: a set (and the held listen hears of it), the read.
    let (set, others) = conn
        .request(
            json!({"jsonrpc": "2.0", "id": "after-set", "method": "tools/call",
            "params": {"_meta": meta(), "name": "memo_set",
                "arguments": {"key": "after", "value": via}}}),
        )
        .await;
    assert!(set.get("result").is_some(), "{via}: {set}");
    assert_ne!(set["result"]["isError"], true, "{via}: {set}");
    let mut heard = others
        .iter()
        .any(|v| sub_id(v) == Some("held") && v["params"]["uri"] == "memo://notes");
    while !heard {
        let v = conn.recv().await;
        heard = sub_id(&v) == Some("held") && v["params"]["uri"] == "memo://notes";
    }
    let (read, _) = conn
        .request(
            json!({"jsonrpc": "2.0", "id": "after-read", "method": "resources/read",
            "params": {"_meta": meta(), "uri": "memo://notes"}}),
        )
        .await;
    let text = read["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{via}: {read}"));
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"after": via}),
        "{via}"
    );
    let (discover, _) = conn
        .request(
            json!({"jsonrpc": "2.0", "id": "after-discover", "method": "server/discover",
            "params": {"_meta": meta()}}),
        )
        .await;
    assert!(
        discover["result"]["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&json!("2026-07-28"))),
        "{via}: {discover}"
    );
    cases.len()
}

async fn stdio_conn() -> LineConn {
    init();
    let mut child = tokio::process::Command::new(bin())
        .args(["--store", ":memory:", "memo"])
        .args(LIMITS)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn herald memo");
    let write = Box::new(child.stdin.take().unwrap());
    let read: Box<dyn AsyncRead + Unpin + Send> = Box::new(child.stdout.take().unwrap());
    LineConn {
        write,
        lines: BufReader::new(read).lines(),
        _keep: Box::new(child),
    }
}

async fn quic_conn(server: &Server) -> LineConn {
    let trust = herald::transport::tls::ClientTrust {
        ca: None,
        pin: Some(server.fingerprint()),
        token: None,
        oauth: None,
    };
    let (endpoint, conn, send, recv) = tokio::time::timeout(
        WAIT,
        herald::transport::quic::connect(
            &server.quic_addr(),
            &trust,
            herald::transport::client::DEFAULT_CONNECT_TIMEOUT,
        ),
    )
    .await
    .expect("a QUIC connection in time")
    .expect("a QUIC connection");
    let read: Box<dyn AsyncRead + Unpin + Send> = Box::new(recv);
    LineConn {
        write: Box::new(send),
        lines: BufReader::new(read).lines(),
        _keep: Box::new((endpoint, conn)),
    }
}

/// The headers a well-behaved client sends with `body`: the method and the name it carries
/// (`Mcp-Name`: a call's tool, a read's URI, a task's id).
fn http_headers(body: &[u8]) -> Vec<(&'static str, String)> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let method = v["method"].as_str().unwrap_or("tools/list").to_owned();
    let name = match method.as_str() {
        "tools/call" => v["params"]["name"].as_str(),
        "resources/read" => v["params"]["uri"].as_str(),
        m if m.starts_with("tasks/") => v["params"]["taskId"].as_str(),
        _ => None,
    };
    let mut h = vec![
        ("content-type", "application/json".to_owned()),
        ("accept", "application/json, text/event-stream".to_owned()),
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", method),
    ];
    if let Some(n) = name {
        h.push(("mcp-name", n.to_owned()));
    }
    h
}

/// Posts `case` to `url` and checks the status, the challenge of a `401` and the error.
async fn post_case(via: &str, http: &reqwest::Client, url: &str, case: &Case) {
    let mut headers = http_headers(&case.body);
    for (name, value) in case.headers {
        headers.retain(|(n, _)| n != name);
        if let Some(v) = value {
            headers.push((name, (*v).to_owned()));
        }
    }
    let mut req = http.post(url).body(case.body.clone());
    for (n, v) in headers {
        req = req.header(n, v);
    }
    let what = format!("{via}: {}", case.name);
    let r = tokio::time::timeout(WAIT, req.send())
        .await
        .unwrap_or_else(|_| panic!("{what}: an answer in time"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = r.status().as_u16();
    let kind = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = tokio::time::timeout(WAIT, r.text())
        .await
        .unwrap_or_else(|_| panic!("{what}: the body in time"))
        .unwrap();
    assert_eq!(status, case.status, "{what}: the status\n{text}");
    assert!(
        kind.starts_with("application/json"),
        "{what}: a JSON answer, not {kind:?}\n{text}"
    );
    if status == 401 {
        assert!(
            challenge
                .as_deref()
                .is_some_and(|c| c.starts_with("Bearer")),
            "{what}: a Bearer challenge, not {challenge:?}"
        );
    }
    let answer: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON: {text}: {e}"));
    check_error(via, case, &case.body, &answer);
}

/// Reads the SSE response `r` until its text contains `needle`.
async fn read_until(via: &str, r: &mut reqwest::Response, seen: &mut String, needle: &str) {
    while !seen.contains(needle) {
        let chunk = tokio::time::timeout(WAIT, r.chunk())
            .await
            .unwrap_or_else(|_| panic!("{via}: {needle} in time; got {seen}"))
            .unwrap_or_else(|e| panic!("{via}: {e}"))
            .unwrap_or_else(|| panic!("{via}: the stream ended before {needle}: {seen}"));
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// Runs the catalogue's HTTP cases on one `herald memo --http`, with a listen held open,
/// then the ordinary calls on the same server. Returns how many cases ran.
async fn run_http() -> usize {
    let via = "http";
    let mut args = vec!["--store", ":memory:", "memo", "--http", "127.0.0.1:0"];
    args.extend_from_slice(&LIMITS);
    let server = Server::spawn(&args).await;
    let url = server.http_url();
    // The held listen, on a client of its own (its connection stays busy with the stream).
    let body = held_listen();
    let mut req = reqwest::Client::new().post(&url).body(body.clone());
    for (n, v) in http_headers(&body) {
        req = req.header(n, v);
    }
    let mut held = tokio::time::timeout(WAIT, req.send())
        .await
        .expect("the listen answered in time")
        .unwrap();
    assert_eq!(held.status(), 200);
    let mut seen = String::new();
    read_until(via, &mut held, &mut seen, "acknowledged").await;

    let http = reqwest::Client::new();
    let cases: Vec<Case> = catalogue().into_iter().filter(|c| c.status != 0).collect();
    for case in &cases {
        post_case(via, &http, &url, case).await;
    }
    // The same server still serves: a set, the held listen hears of it, the read.
    let conn = Memo {
        server: None,
        target: herald::transport::target::Target::Http(url.clone()),
        trust: Default::default(),
    }
    .client()
    .await;
    call(&conn, "memo_set", json!({"key": "after", "value": via})).await;
    read_until(via, &mut held, &mut seen, "notifications/resources/updated").await;
    assert_eq!(
        read_json(&conn, "memo://notes").await.0,
        json!({"after": via})
    );
    drop(held);
    assert!(server.terminate().await.success());
    cases.len()
}

/// Runs the gateway's token cases on one `herald gateway --http` requiring tokens, then an
/// ordinary call with the right token on the same gateway. Returns how many cases ran.
async fn run_gateway() -> usize {
    let via = "gateway http";
    let token = "badinput-token-5e1d";
    let dir = TempDir::new("badinput-gateway");
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slug]]\nname = \"m\"\nstdio = \"{} --store :memory: memo\"\n\
             [[token]]\nname = \"all\"\nsha256 = \"{}\"\nslugs = [\"*\"]\n",
            bin(),
            sha(token)
        ),
    )
    .unwrap();
    let gw = http_gateway_server(&cfg).await;
    let http = reqwest::Client::new();
    let cases = gateway_catalogue();
    for case in &cases {
        post_case(via, &http, &gw.http_url(), case).await;
    }
    let conn = Memo {
        server: None,
        target: herald::transport::target::Target::Http(gw.http_url()),
        trust: herald::transport::tls::ClientTrust {
            token: Some(herald::transport::tls::Secret(token.to_owned())),
            ..Default::default()
        },
    }
    .client()
    .await;
    call(&conn, "m__memo_set", json!({"key": "after", "value": via})).await;
    assert_eq!(
        read_json(&conn, "memo://notes").await.0,
        json!({"after": via})
    );
    assert!(gw.terminate().await.success());
    cases.len()
}

async fn run_stdio() -> usize {
    run_lines("stdio", stdio_conn().await).await
}

async fn run_quic() -> usize {
    let mut args = vec!["--store", ":memory:", "memo", "--quic", "127.0.0.1:0"];
    args.extend_from_slice(&LIMITS);
    let server = Server::spawn(&args).await;
    let n = run_lines("quic", quic_conn(&server).await).await;
    assert!(server.terminate().await.success());
    n
}

#[tokio::test]
async fn bad_input_catalogue() {
    let (stdio, quic, http, gateway) =
        tokio::join!(run_stdio(), run_quic(), run_http(), run_gateway());
    eprintln!("bad-input cases: stdio {stdio}, QUIC {quic}, HTTP {http}, gateway HTTP {gateway}");
    assert!(
        stdio + quic + http + gateway >= 60,
        "the catalogue has {} cases",
        stdio + quic + http + gateway
    );
}
