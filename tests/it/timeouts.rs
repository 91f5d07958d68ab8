//! Connections that never finish are not held forever: HTTP's idle, header and body deadlines
//! (`--http-idle-timeout-ms`, `--http-header-timeout-ms`, `--http-body-timeout-ms`), which
//! never cut a listen stream, and the cap on open connections (`--max-connections`) on HTTP
//! and QUIC.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Memo, Server, Via, WAIT, meta};

/// How long a test waits for a short deadline (a few hundred milliseconds) to close a
/// connection: generous for a loaded machine, yet well under the defaults (30 s and more),
/// so a deadline that is not applied fails the test.
const CLOSED_IN: Duration = Duration::from_secs(10);

/// `herald memo --http 127.0.0.1:0 EXTRA…` and its `HOST:PORT`.
async fn memo(extra: &[&str]) -> (Server, String) {
    let mut args = vec!["--store", ":memory:", "memo", "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let s = Server::spawn(&args).await;
    let addr = host_port(&s.http_url());
    (s, addr)
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

async fn connect(addr: &str) -> TcpStream {
    tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// Reads until the server closes the connection (within [`CLOSED_IN`]); what it sent.
async fn closed(socket: &mut TcpStream, what: &str) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(CLOSED_IN, async {
        loop {
            let mut buf = [0u8; 4096];
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(
        read.is_ok(),
        "{what}: still open after {CLOSED_IN:?}; sent {text}"
    );
    text
}

/// Reads until `needle` has been sent (within [`WAIT`]), failing if the connection closes.
async fn read_until(socket: &mut TcpStream, seen: &mut Vec<u8>, needle: &str) {
    while !String::from_utf8_lossy(seen).contains(needle) {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, socket.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{needle} in time: {}", String::from_utf8_lossy(seen)))
            .unwrap();
        assert!(
            n > 0,
            "closed before {needle}: {}",
            String::from_utf8_lossy(seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

/// `GET /live` as one request on a kept-alive connection.
fn live(addr: &str) -> String {
    format!("GET /live HTTP/1.1\r\nhost: {addr}\r\n\r\n")
}

/// A POST to `/mcp` in the plain shape of a 2026-07-28 client: `method` in `Mcp-Method`,
/// `name` in `Mcp-Name` when there is one; its head and its whole body.
fn post(addr: &str, method: &str, name: Option<&str>, body: &Value) -> (String, String) {
    let body = body.to_string();
    let name = name
        .map(|n| format!("mcp-name: {n}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: {method}\r\n{name}content-length: {}\r\n\r\n",
        body.len()
    );
    (head, body)
}

/// A listen on `memo://notes` with id `id`.
fn listen(addr: &str, id: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": ["memo://notes"]}}});
    let (head, body) = post(addr, "subscriptions/listen", None, &body);
    head + &body
}

/// A `memo_set` call, answered on its own connection.
async fn memo_set(addr: &str, key: &str) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"_meta": meta(), "name": "memo_set", "arguments": {"key": key, "value": 1}}});
    let (head, body) = post(addr, "tools/call", Some("memo_set"), &body);
    let mut socket = connect(addr).await;
    let request = head.replace("\r\n\r\n", "\r\nconnection: close\r\n\r\n") + &body;
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut socket, &mut seen, "\"result\"").await;
    assert!(
        String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200 "),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

/// A connection that never sends a byte, and one idle after a keep-alive request, are both
/// closed after the idle timeout (the default is a minute; `CLOSED_IN` is far less).
#[tokio::test]
async fn an_idle_http_connection_is_closed_after_the_idle_timeout() {
    let (_s, addr) = memo(&["--http-idle-timeout-ms", "300"]).await;
    let mut silent = connect(&addr).await;
    let mut kept = connect(&addr).await;
    kept.write_all(live(&addr).as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut kept, &mut seen, "ok\n").await;
    assert_eq!(closed(&mut silent, "a silent connection").await, "");
    let after = closed(&mut kept, "a kept-alive connection").await;
    assert_eq!(after, "", "closed with nothing more sent");
}

/// A head begun and never finished is closed after the header timeout, even with a long idle
/// timeout: a listen's head (read ahead of hyper) and any other (read by hyper).
#[tokio::test]
async fn a_partial_head_is_closed_after_the_header_timeout() {
    let (_s, addr) = memo(&[
        "--http-idle-timeout-ms",
        "600000",
        "--http-header-timeout-ms",
        "300",
    ])
    .await;
    let request = listen(&addr, "L");
    let mut partial_listen = connect(&addr).await;
    partial_listen
        .write_all(&request.as_bytes()[..40])
        .await
        .unwrap();
    let mut partial_get = connect(&addr).await;
    partial_get
        .write_all(b"GET /live HTTP/1.1\r\nhost: 127")
        .await
        .unwrap();
    // And one after a request on the same connection, under hyper from the start.
    let mut second = connect(&addr).await;
    second.write_all(live(&addr).as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut second, &mut seen, "ok\n").await;
    second.write_all(b"GET /live HTTP/1.1\r\n").await.unwrap();
    closed(&mut partial_listen, "half a listen's head").await;
    closed(&mut partial_get, "half a GET's head").await;
    let after = closed(&mut second, "half a second head").await;
    assert_eq!(after, "");
}

/// A request whose body stops short is answered `408` with a JSON-RPC error after the body
/// timeout, and its connection closed: a listen (read ahead of hyper), a call (read by the
/// gate), and a call after a kept-alive request.
#[tokio::test]
async fn a_body_that_never_completes_is_answered_408_after_the_body_timeout() {
    let (s, addr) = memo(&["--http-body-timeout-ms", "300"]).await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"_meta": meta(), "name": "memo_set", "arguments": {"key": "k", "value": 1}}});
    let (call_head, call_body) = post(&addr, "tools/call", Some("memo_set"), &call);
    let listen = listen(&addr, "L");
    let short_call = format!("{call_head}{}", &call_body[..10]);
    for (what, before, sent) in [
        (
            "a listen",
            String::new(),
            listen[..listen.len() - 5].to_owned(),
        ),
        ("a call", String::new(), short_call.clone()),
        ("a call after a request", live(&addr), short_call),
    ] {
        let mut socket = connect(&addr).await;
        if !before.is_empty() {
            socket.write_all(before.as_bytes()).await.unwrap();
            let mut seen = Vec::new();
            read_until(&mut socket, &mut seen, "ok\n").await;
        }
        socket.write_all(sent.as_bytes()).await.unwrap();
        let answer = closed(&mut socket, what).await;
        assert!(answer.starts_with("HTTP/1.1 408 "), "{what}: {answer}");
        let body = &answer[answer.find("\r\n\r\n").expect("a head") + 4..];
        let error: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(error["error"]["code"], -32600, "{what}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("--http-body-timeout-ms"),
            "{what}: {message}"
        );
    }
    // The server goes on serving.
    memo_set(&addr, "after").await;
    drop(s);
}

/// A listen stream is a request in flight, never an idle connection: one answered ahead of
/// hyper (first on its connection) and one through hyper (after a kept-alive request) are
/// both still open, and notified, after the idle timeout has passed twice over.
#[tokio::test]
async fn a_listen_stream_outlives_the_idle_timeout() {
    let (_s, addr) = memo(&["--http-idle-timeout-ms", "300"]).await;
    let mut first = connect(&addr).await;
    first
        .write_all(listen(&addr, "A").as_bytes())
        .await
        .unwrap();
    let mut first_seen = Vec::new();
    read_until(&mut first, &mut first_seen, "acknowledged").await;
    let mut later = connect(&addr).await;
    later.write_all(live(&addr).as_bytes()).await.unwrap();
    let mut later_seen = Vec::new();
    read_until(&mut later, &mut later_seen, "ok\n").await;
    later
        .write_all(listen(&addr, "B").as_bytes())
        .await
        .unwrap();
    read_until(&mut later, &mut later_seen, "acknowledged").await;
    // Two idle connections opened one after the other, each closed by the idle timeout: by
    // the second's close the streams have been open longer than the timeout twice over.
    for n in 0..2 {
        let mut idle = connect(&addr).await;
        assert_eq!(closed(&mut idle, &format!("idle connection {n}")).await, "");
    }
    memo_set(&addr, "k").await;
    read_until(
        &mut first,
        &mut first_seen,
        "notifications/resources/updated",
    )
    .await;
    read_until(
        &mut later,
        &mut later_seen,
        "notifications/resources/updated",
    )
    .await;
}

/// With `--max-connections 2` a third connection waits (in the kernel's backlog) until one of
/// the first two closes, and is then served; reaching the cap is logged once, with the flag,
/// and leaving it too.
#[tokio::test]
async fn at_max_connections_a_new_http_connection_waits_until_one_closes() {
    let (mut s, addr) = memo(&["--max-connections", "2"]).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut socket = connect(&addr).await;
        socket.write_all(live(&addr).as_bytes()).await.unwrap();
        let mut seen = Vec::new();
        read_until(&mut socket, &mut seen, "ok\n").await;
        open.push(socket);
    }
    let warned = s
        .line_where("the cap reached", |v| {
            v["level"] == "WARN"
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("limit of 2 (--max-connections)"))
        })
        .await;
    assert!(
        warned["message"].as_str().unwrap().starts_with("HTTP "),
        "{warned}"
    );
    // The connect itself succeeds (the kernel queues it); its request is not answered.
    let mut third = connect(&addr).await;
    third.write_all(live(&addr).as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
    assert!(early.is_err(), "a third connection was served: {early:?}");
    // Both served ones are still served meanwhile.
    open[0].write_all(live(&addr).as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut open[0], &mut seen, "ok\n").await;
    drop(open.remove(1));
    let mut seen = Vec::new();
    read_until(&mut third, &mut seen, "ok\n").await;
    s.line_where("the cap left", |v| {
        v["level"] == "INFO"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("below the limit of 2"))
    })
    .await;
    // `/metrics`, on a connection already served: the episodes, and the connections open
    // (the two served ones; not the place the accept loop holds for the next).
    open[0]
        .write_all(format!("GET /metrics HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut seen = Vec::new();
    read_until(&mut open[0], &mut seen, "herald_quic_connections_open 0\n").await;
    let metrics = String::from_utf8_lossy(&seen).into_owned();
    let value = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {metrics}"));
        line[name.len() + 1..].parse().unwrap()
    };
    assert!(
        value("herald_http_connection_limit_reached_total") >= 1,
        "{metrics}"
    );
    assert_eq!(value("herald_http_connections_open"), 2, "{metrics}");
    let warnings = s.stderr().matches("reached the limit of 2").count();
    assert!(
        (1..=2).contains(&warnings),
        "one warning per episode (the third's place began the second): {}",
        s.stderr()
    );
}

/// The same cap on QUIC: with `--max-connections 1` a second connection's handshake waits
/// (in quinn's queue) until the first closes.
#[tokio::test]
async fn at_max_connections_a_new_quic_connection_waits_until_one_closes() {
    let memo = Memo::start_with(Via::Quic, &["--max-connections", "1"]).await;
    let first = memo.client().await;
    let (target, trust) = (memo.target.clone(), memo.trust.clone());
    let mut server = memo.server.expect("a server");
    server
        .line_where("the cap reached", |v| {
            v["level"] == "WARN"
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("QUIC connections reached the limit of 1"))
        })
        .await;
    let mut second = tokio::spawn(async move {
        herald::transport::client::connect(
            &target,
            &trust,
            herald::transport::client::client_config(),
            4 << 20,
        )
        .await
        .map(|c| c.is_modern())
    });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut second).await;
    assert!(early.is_err(), "a second connection was served: {early:?}");
    first.close().await;
    let second = tokio::time::timeout(WAIT, second)
        .await
        .expect("the second connection is served once the first closed")
        .unwrap();
    assert!(second.expect("connected"), "{}", server.stderr());
}
