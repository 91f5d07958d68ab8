//! Tests of `first.rs`: listens answered ahead of hyper, on real sockets.
use super::*;
use crate::testing::MemoServer;
use crate::transport::origin::Allowlist;
use std::sync::Arc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const WAIT: Duration = Duration::from_secs(10);

/// The default deadlines: no test here is near them.
const T: Timeouts = Timeouts {
    idle: Duration::from_secs(60),
    header: Duration::from_secs(30),
    body: Duration::from_secs(30),
};

/// A gate on a memo server, and a connected (client, server side, peer) triple.
async fn setup() -> (MemoServer, Gate, TcpStream, TcpStream, std::net::SocketAddr) {
    let memo = MemoServer::start().await;
    let gate = Gate {
        server: memo.server(),
        allow: Arc::new(Allowlist::new(&["127.0.0.1".into()], &[])),
        budgets: Arc::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server_side, peer) = listener.accept().await.unwrap();
    (memo, gate, client, server_side, peer)
}

fn request(method: &str, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: {method}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn meta() -> Value {
    serde_json::json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}})
}

async fn read_until(client: &mut TcpStream, seen: &mut Vec<u8>, needle: &str) {
    while !String::from_utf8_lossy(seen).contains(needle) {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, client.read(&mut buf))
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
}

/// A plain listen arriving first is answered on the socket: a chunked SSE response, the
/// acknowledgment, a change's notification; the client leaving ends it.
#[tokio::test]
async fn a_plain_listen_first_on_a_connection_is_answered_on_the_socket() {
    let (memo, gate, mut client, server_side, peer) = setup().await;
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(async move {
        let first = serve_first(&server_side, &gate, peer, T, &shutdown).await;
        matches!(first, First::Done)
    });
    let listen = serde_json::json!({"jsonrpc": "2.0", "id": "L", "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": ["memo://notes"]}}});
    client
        .write_all(&request("subscriptions/listen", &listen))
        .await
        .unwrap();
    let mut seen = Vec::new();
    read_until(&mut client, &mut seen, "acknowledged").await;
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    memo.set("k", serde_json::json!(1)).await;
    read_until(&mut client, &mut seen, "notifications/resources/updated").await;
    assert!(String::from_utf8_lossy(&seen).contains(r#""uri":"memo://notes""#));
    drop(client);
    let done = tokio::time::timeout(WAIT, served).await.unwrap().unwrap();
    assert!(done, "the stream ends when its client leaves");
}

/// A request the client pipelined behind its listen (sent in the same write) survives
/// the stream: when the listen ends (its server shutting down, this endpoint not), the
/// final result and the body's end go out and the request is handed on to hyper.
#[tokio::test]
async fn what_a_client_pipelines_behind_its_listen_goes_to_hyper_after_it() {
    let (memo, _, mut client, server_side, peer) = setup().await;
    let stops = CancellationToken::new();
    let gate = Gate {
        server: crate::mcp::server::SourceServer::with_tasks(
            memo.memo.clone(),
            crate::mcp::limits::Limits::default(),
            stops.clone(),
            None,
        ),
        allow: Arc::new(Allowlist::new(&["127.0.0.1".into()], &[])),
        budgets: Arc::default(),
    };
    let served = tokio::spawn(async move {
        serve_first(&server_side, &gate, peer, T, &CancellationToken::new()).await
    });
    let listen = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": ["memo://notes"]}}});
    let next = b"GET /live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
    let mut sent = request("subscriptions/listen", &listen);
    sent.extend_from_slice(next);
    client.write_all(&sent).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut client, &mut seen, "acknowledged").await;
    stops.cancel();
    read_until(&mut client, &mut seen, "\r\n0\r\n\r\n").await;
    assert!(String::from_utf8_lossy(&seen).contains(r#""resultType":"complete""#));
    let First::Answered(rest) = tokio::time::timeout(WAIT, served).await.unwrap().unwrap() else {
        panic!("the connection goes on")
    };
    assert_eq!(rest, next);
}

/// Any other first request goes to hyper with every byte read so far, and no more than
/// its head when the head already says it is not a listen.
#[tokio::test]
async fn any_other_first_request_goes_to_hyper_with_the_bytes_read() {
    for (method, sent) in [
        (
            "tools/call",
            request(
                "tools/call",
                &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"_meta": meta(), "name": "memo_get", "arguments": {"key": "k"}}}),
            ),
        ),
        (
            "GET",
            b"GET /live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".to_vec(),
        ),
        // A listen in a shape rmcp must see (no `_meta`): its admission is the gate's.
        (
            "subscriptions/listen",
            request(
                "subscriptions/listen",
                &serde_json::json!({"jsonrpc": "2.0", "id": 1,
                    "method": "subscriptions/listen", "params": {}}),
            ),
        ),
    ] {
        let (_memo, gate, mut client, server_side, peer) = setup().await;
        client.write_all(&sent).await.unwrap();
        let first = tokio::time::timeout(
            WAIT,
            serve_first(&server_side, &gate, peer, T, &CancellationToken::new()),
        )
        .await
        .unwrap();
        let First::Hyper(bytes) = first else {
            panic!("{method}: not hyper's")
        };
        assert!(!bytes.is_empty() && sent.starts_with(&bytes), "{method}");
        assert_eq!(
            bytes.len(),
            sent.len(),
            "{method}: what one write sent was read"
        );
    }
}

/// The first request's deadlines hold ahead of hyper: nothing sent closes the connection
/// after the idle timeout, a head begun and not finished after the header timeout, and a
/// listen whose body stops short is answered `408` after the body timeout.
#[tokio::test]
async fn the_first_request_is_read_by_its_deadlines() {
    let short = Timeouts {
        idle: Duration::from_millis(200),
        header: Duration::from_millis(200),
        body: Duration::from_millis(200),
    };
    let listen = request(
        "subscriptions/listen",
        &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
            "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": []}}}),
    );
    let cut = listen.len() - 5;
    for (what, sent) in [
        ("nothing", &listen[..0]),
        ("half a head", &listen[..40]),
        ("all but the body's end", &listen[..cut]),
    ] {
        let (_memo, gate, mut client, server_side, peer) = setup().await;
        client.write_all(sent).await.unwrap();
        let shutdown = CancellationToken::new();
        let first = serve_first(&server_side, &gate, peer, short, &shutdown);
        let first = tokio::time::timeout(WAIT, first).await.expect(what);
        let late = what == "all but the body's end";
        assert!(
            matches!((&first, late), (First::Gone, false) | (First::Done, true)),
            "{what}"
        );
        drop(server_side);
        let mut answer = Vec::new();
        tokio::time::timeout(WAIT, client.read_to_end(&mut answer))
            .await
            .expect(what)
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        if late {
            assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
            assert!(answer.contains("--http-body-timeout-ms"), "{answer}");
        } else {
            assert_eq!(answer, "", "{what}: closed with no answer");
        }
    }
}

fn parse(req: &str) -> Parsed {
    parse_head(req.as_bytes(), 1000)
}

#[test]
fn only_a_complete_plain_listen_head_is_read_ahead() {
    let listen = "POST /mcp HTTP/1.1\r\nhost: x\r\nmcp-method: subscriptions/listen\r\n\
        content-length: 10\r\n\r\n";
    let Parsed::Listen(head) = parse(listen) else {
        panic!("a listen head")
    };
    assert_eq!(head.body, listen.len()..listen.len() + 10);
    assert_eq!(head.headers["host"], "x");
    assert!(matches!(parse(&listen[..30]), Parsed::Partial));
    for other in [
        listen.replace("subscriptions/listen", "tools/call"),
        listen.replace("POST /mcp ", "POST /other "),
        listen.replace("POST /mcp ", "POST /mcpx "),
        listen.replace("HTTP/1.1", "HTTP/1.0"),
        listen.replace("content-length: 10", "content-length: 10000"),
        listen.replace("content-length: 10", "transfer-encoding: chunked"),
        listen.replace("host: x", "connection: close"),
        listen.replace("host: x", "expect: 100-continue"),
        listen.replace("host: x", "content-length: 10"),
    ] {
        assert!(matches!(parse(&other), Parsed::Other), "{other}");
    }
    assert!(matches!(
        parse(&listen.replace("POST /mcp ", "POST /mcp?servers=a ")),
        Parsed::Listen(_)
    ));
}

/// A plain listen refused at admission (more URIs than a stream takes) is opened once and
/// answered here with the gate's error (`-32602`, `200`), and what the client sent after it
/// goes on to hyper: the gate never admits it a second time.
#[tokio::test]
async fn a_refused_first_listen_is_answered_here_and_the_connection_goes_on() {
    let (_memo, gate, mut client, server_side, peer) = setup().await;
    let max = gate.server.limits().max_uris_per_stream;
    let uris: Vec<String> = (0..=max).map(|i| format!("memo://n{i}")).collect();
    let listen = serde_json::json!({"jsonrpc": "2.0", "id": "X", "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": {"resourceSubscriptions": uris}}});
    let mut sent = request("subscriptions/listen", &listen);
    sent.extend_from_slice(b"GET /live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    client.write_all(&sent).await.unwrap();
    let shutdown = CancellationToken::new();
    let first = serve_first(&server_side, &gate, peer, T, &shutdown).await;
    let First::Answered(rest) = first else {
        panic!("the refusal is answered here");
    };
    assert!(rest.starts_with(b"GET /live"), "the rest is hyper's");
    let conn = gate
        .budgets
        .get(crate::mcp::admission::Budget::Address(peer.ip()));
    assert_eq!(conn.open(), 0, "nothing held for a refused listen");
    let mut seen = Vec::new();
    read_until(&mut client, &mut seen, "\r\n\r\n").await;
    let head = String::from_utf8_lossy(&seen)
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    while seen.len() < head.len() + 4 + length {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, client.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the whole body");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.contains("content-type: application/json\r\n"),
        "{text}"
    );
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["id"], "X");
    assert_eq!(v["error"]["code"], -32602);
}
